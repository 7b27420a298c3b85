/* The server: a libuv loop on the main thread doing all socket I/O and
 * protocol work (framing, msgpack, request checks, replies), and the
 * compute thread (compute.h) doing all model work. See sinkd-protocol(7)
 * for the ops.
 *
 * Bounds (see limits in server.c): frame size, sessions, queued requests
 * per session, bytes waiting to be written per connection (a slow reader
 * pauses its own generation and reading, never the daemon).
 */
#ifndef SK_SERVER_H
#define SK_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "kvcache.h"
#include "model.h"
#include "tokenizer.h"

struct sk_server_config {
  const char *socket_path;
  const char *model_path;     /* for hello/logs */
  uint32_t max_frame;         /* request body limit, <= SK_FRAME_MAX_CEILING */
  uint32_t max_sessions;
  uint32_t max_clients;
  uint32_t max_capacity;      /* largest KV cache a session may have */
  uint32_t max_batch;         /* prefill chunk */
  struct sk_kv_params defaults; /* for `open` without parameters */
};

struct sk_server;

/* Binds the socket (replacing a stale socket file, refusing one a live
 * daemon answers on; mode 0660), starts the compute thread and begins
 * accepting. model and tok must outlive the server.
 * Errors: -SK_ERR_IO (bind/listen, message has path and reason),
 * -SK_ERR_BUSY (socket in use), -SK_ERR_NO_MEMORY, -SK_ERR_INTERNAL. */
int sk_server_start(uv_loop_t *loop, const struct sk_server_config *cfg,
                    const struct sk_model *m, const struct sk_tokenizer *tok,
                    struct sk_server **ret, struct sk_error *err);
/* Stops accepting, removes the socket file, cancels running work, closes
 * every connection. The loop ends once everything is closed; then call
 * sk_server_free. */
void sk_server_shutdown(struct sk_server *srv);
void sk_server_free(struct sk_server *srv);

#endif
