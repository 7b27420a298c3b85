/* The daemon's HTTP front end (sinkd-http(7)): the OpenAI-compatible
 * gateway (openai.h) served by the HTTP transport (httpd.h) on a Unix
 * socket beside the msgpack one and, when configured, on a TCP address
 * guarded by an API key. This is what the daemon starts and stops; the
 * routes are openai.h's, the connections and their limits httpd.h's.
 */
#ifndef SK_HTTP_H
#define SK_HTTP_H

#include <stdint.h>
#include <uv.h>

#include "server/server.h"
#include "sinkd/protocol.h"

struct sk_http_config {
  const char *socket_path; /* Unix socket to bind (mode 0660), or NULL */
  int listen_fd;           /* > 0: a listening Unix socket passed by the
                              service manager, used instead of binding */
  const char *tcp_listen;  /* "ADDRESS:PORT" or NULL */
  const char *api_key;     /* required when tcp_listen is set */
  uint32_t tcp_uid;        /* uid that TCP requests act as */
  const char *model_name;  /* the id /v1/models lists (NULL: "sinkd") */
  uint32_t max_body;       /* request body limit (bytes) */
};

struct sk_http;

/* Binds the configured sockets and starts serving the OpenAI routes. srv
 * must outlive the front end; cfg's strings are copied. Errors:
 * -SK_ERR_IO (bind, listen: the message has the address and reason),
 * -SK_ERR_NO_MEMORY. */
int sk_http_start(uv_loop_t *loop, struct sk_server *srv, const struct sk_http_config *cfg,
                  struct sk_http **ret, struct sk_error *err);
/* What sk_http_start would find in the way, checked before the daemon
 * loads its model: the Unix socket path too long, not a socket or in use
 * by a running daemon, the TCP address not an address or in use (bound
 * for a moment and let go). Errors: -SK_ERR_IO, -SK_ERR_BUSY (in use),
 * the message naming the socket. */
int sk_http_check(const struct sk_http_config *cfg, struct sk_error *err);

/* Stops accepting (removing the socket file it bound) and closes every
 * connection; call before sk_server_shutdown. sk_http_free after the
 * loop ended. h may be NULL. */
void sk_http_shutdown(struct sk_http *h);
void sk_http_free(struct sk_http *h);

#endif
