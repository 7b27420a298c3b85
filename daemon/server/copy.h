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
struct sk__export;

/* The work in flight of a server (zeroed: none). The sessions it is
 * making hold reservations in the session table, which counts them
 * against the limits. */
struct sk_copies {
  /* Imports in progress hold their bytes in the session table's pending
   * memory (sk_session_pending_*), in their uid's share. One whose client
   * sends no chunk for frame_timeout is dropped: this timer looks. */
  uv_timer_t import_timer;
  bool timer_open;              /* initialised (closed by sk_copy_shutdown) */
  bool timer_running;
};

/* What copy.c keeps with each connection (the connection's data bytes,
 * zeroed at connect). */
struct sk_copy_peer {
  struct sk__export *exports; /* FIFO, streamed one after the other */
  char *import_buf;           /* an import in progress: received bytes */
  size_t import_len, import_cap;
  uint64_t import_total;      /* declared size of the file */
  uint64_t import_req_id;     /* its last chunk's request id */
  uint64_t import_last_ms;    /* when its last chunk came */
};

/* Frees a connection's exports not yet sent (its last reference went). */
void sk_copy_peer_free(struct sk_copy_peer *p);
/* Drops conn's import in progress (conn closes, or a new import starts). */
void sk_copy_import_drop(struct sk_server *srv, struct sk_conn *conn);
/* Closes the stalled-import timer (server shutdown). */
void sk_copy_shutdown(struct sk_server *srv);
/* Sends the next data events of conn's exports while its output has room;
 * the final reply of each follows its last event. */
void sk_copy_export_pump(struct sk_conn *conn);
/* The session table's release_obj: unmaps obj (its file already
 * deleted) in a worker; returning the pages of a large object
 * would hold the event loop. user is the server. */
void sk_copy_release_obj(void *user, struct sk_store_obj *obj);

/* open: reserves a session of params p for conn's uid (store flags from
 * temporary; PRNG seeded with seed) and makes its object in a worker;
 * then the session is committed, takes conv as its conversation, and
 * request req_id is answered, or first its pin (n_pin tokens) goes
 * through the model (a job). Takes pin (malloc'd) and conv (left
 * SK_CHAT_NONE) on success only. Errors: those of sk_session_reserve,
 * -SK_ERR_NO_MEMORY, -SK_ERR_INTERNAL (thread pool). */
int sk_copy_open(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                 const struct sk_kv_params *p, uint64_t seed, bool temporary, int32_t *pin,
                 size_t n_pin, struct sk_conv *conv, struct sk_error *err);
/* Starts job (a fork or export of the idle session s) in a worker; s is
 * busy until it is done. true if started; else the error is answered
 * and the caller frees job. */
bool sk_copy_start(struct sk_server *srv, struct sk_session *s, struct sk_job *job);
/* import: one chunk {total, offset, data (len bytes)} of request req_id
 * on conn; one import per connection at a time, offset 0 starts it. The
 * buffer grows with the bytes received (a declared total never
 * allocates by itself) and all imports together stay under max_memory.
 * The last chunk starts the copy into a new session; every chunk is
 * answered (received, the session, or an error). */
void sk_copy_import(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id, uint64_t total,
                    uint64_t offset, const char *data, size_t len);

#endif
