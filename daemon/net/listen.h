/* The daemon's listening socket: a Unix stream socket bound at a path
 * (replacing a stale socket file, refusing one a running daemon answers
 * on; mode 0660) or passed by the service manager (socket activation,
 * used as it is); every accepted client becomes a connection of a
 * connection set (conn.h) with the uid its peer credentials give.
 * Loop thread only.
 */
#ifndef SK_LISTEN_H
#define SK_LISTEN_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "net/conn.h"
#include "sinkd/protocol.h"

struct sk_listen {
  uv_pipe_t pipe;
  struct sk_conns *conns;   /* accepted connections join it (not owned) */
  char *path;               /* owned; NULL for a passed socket */
  bool open;                /* listening: sk_listen_close closes the pipe */
  bool owns_file;           /* bound here: sk_listen_close unlinks it */
};

/* Checks that a daemon could listen on path, before anything is loaded:
 * not longer than a Unix socket path may be, not an existing file that
 * is not a socket, not a socket a running daemon answers on (a stale one
 * is fine: sk_listen_init replaces it). Changes nothing.
 * Errors: -SK_ERR_IO (too long, not a socket), -SK_ERR_BUSY (in use);
 * err's message names the path. */
int sk_listen_check_socket(const char *path, struct sk_error *err);

/* Starts listening: on fd when fd > 0 (a listening socket from the
 * service manager, never bound nor unlinked here), else on a socket
 * bound at path (checked as sk_listen_check_socket first). Accepted
 * clients go to conns. On error the pipe may be closing: run the loop
 * once before l's memory goes. Errors: -SK_ERR_IO (bind/listen, the
 * message has the path or fd and the reason), -SK_ERR_BUSY (in use),
 * -SK_ERR_NO_MEMORY. */
int sk_listen_init(struct sk_listen *l, uv_loop_t *loop, const char *path, int fd,
                   struct sk_conns *conns, struct sk_error *err);
/* Stops accepting and removes the socket file if it was bound here (a
 * passed socket stays: the service manager keeps queueing connections
 * on it and starts sinkd again on the next one). Idempotent. */
void sk_listen_close(struct sk_listen *l);
/* Frees what init allocated (after sk_listen_close, or a failed init). */
void sk_listen_free(struct sk_listen *l);

/* A client over fd, a connected stream socket (one end of a socketpair),
 * joins conns as an accepted connection whose uid is given instead of
 * read with SO_PEERCRED; held: it counts under a connection of uid
 * admitted with sk_conns_admit (sk_conn_begin). Takes fd in every case
 * (closed on error). Errors: -SK_ERR_NO_MEMORY, -SK_ERR_IO. */
int sk_listen_attach(struct sk_conns *conns, int fd, uint32_t uid, bool held,
                     struct sk_error *err);

#endif
