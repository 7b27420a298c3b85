/* The server's work on libuv's thread pool, off the event loop: making
 * an opened session's object (a file of the cache's size the file system
 * zeroes), the copies of fork, export and import (up to a whole cache),
 * and unmapping a closed session's object. While one runs, the limits it
 * will use stay reserved (sk_session_reserve) and a source session stays
 * busy (its running job is the copy's), so the loop answers other
 * clients meanwhile. Exports are then streamed as the client's output
 * drains; imports are put together from their chunks first.
 * Loop thread, except the work itself.
 */
#ifndef SK_COPY_H
#define SK_COPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/conn.h"
#include "session/conv.h"
#include "session/kvcache.h"
#include "session/session.h"
#include "session/store.h"

struct sk_server;
struct sk__open_work;
struct sk__copy_work;
struct sk__export;

/* The work in flight of a server (zeroed: none). */
struct sk_copies {
  struct sk__open_work *opens;  /* opens whose object is being made */
  struct sk__copy_work *copies; /* forks, exports and imports being copied */
  uint64_t import_bytes;        /* buffered by imports in progress, of all
                                   connections (bounded by max_memory) */
};

/* What copy.c keeps with each connection (the connection's data bytes,
 * zeroed at connect). */
struct sk_copy_peer {
  struct sk__export *exports; /* FIFO, streamed one after the other */
  char *import_buf;           /* an import in progress: received bytes */
  size_t import_len, import_cap;
  uint64_t import_total;      /* declared size of the file */
};

/* Frees a connection's exports not yet sent (its last reference went). */
void sk_copy_peer_free(struct sk_copy_peer *p);
/* Drops c's import in progress (c closes, or a new import starts). */
void sk_copy_import_drop(struct sk_server *srv, struct sk_conn *c);
/* Sends the next data events of c's exports while its output has room;
 * the final reply of each follows its last event. */
void sk_copy_export_pump(struct sk_conn *c);
/* Usage of uid by opens and copies in flight: sessions and bytes. */
void sk_copy_usage(const struct sk_copies *cp, uint32_t uid, uint32_t *ret_n,
                   uint64_t *ret_bytes);

/* The session table's release_obj: unmaps obj (its file already
 * deleted) in a worker; returning the pages of a large object
 * would hold the event loop. user is the server. */
void sk_copy_release_obj(void *user, struct sk_store_obj *obj);

/* open: reserves a session of params p for c's uid (store flags from
 * temporary; PRNG seeded with seed) and makes its object in a worker;
 * then the session is committed and sk__open_finish answers request
 * req_id. Takes pin (n_pin tokens, malloc'd) and conv (left
 * SK_CHAT_NONE) on success only. Errors: those of sk_session_reserve,
 * -SK_ERR_NO_MEMORY, -SK_ERR_INTERNAL (thread pool). */
int sk_copy_open(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                 const struct sk_kv_params *p, uint64_t seed, bool temporary, int32_t *pin,
                 size_t n_pin, struct sk_conv *conv, struct sk_error *err);
/* Starts job (a fork or export of the idle session s) in a worker; s is
 * busy until it is done. true if started; else the error is answered
 * and the caller frees job. */
bool sk_copy_start(struct sk_server *srv, struct sk_session *s, struct sk_job *job);
/* import: one chunk {total, offset, data (len bytes)} of request req_id
 * on c; one import per connection at a time, offset 0 starts it. The
 * buffer grows with the bytes received (a declared total never
 * allocates by itself) and all imports together stay under max_memory.
 * The last chunk starts the copy into a new session; every chunk is
 * answered (received, the session, or an error). */
void sk_copy_import(struct sk_server *srv, struct sk_conn *c, uint64_t req_id, uint64_t total,
                    uint64_t offset, const char *data, size_t len);

#endif
