/* The HTTP transport, on the daemon's libuv loop: listeners (a Unix
 * socket beside the msgpack one and, when configured, a TCP address
 * guarded by an API key), connections, requests read with httpreq.h,
 * responses and server-sent event streams. It knows no route: each
 * complete request goes to the route handler given to sk_httpd_start,
 * with the handler's user pointer.
 *
 * Each HTTP connection whose route calls the daemon gets its own msgpack
 * connection into the server (sk_server_attach on a socketpair), made
 * with the HTTP peer's uid: HTTP requests run through exactly the ops,
 * checks, limits, ownership and cancellation of the msgpack protocol,
 * and a client that disconnects ends its msgpack connection, which
 * cancels its generation as any departed msgpack client's.
 *
 * Bounds: request headers and body (httpreq.h, max_body), one request
 * at a time per connection (pipelined requests wait), a deadline for a
 * request to arrive (slow clients), an idle keep-alive timeout, and
 * bytes waiting to be written (a slow reader stops reading its msgpack
 * connection, which pauses its own generation only).
 *
 * Everything here runs on the loop thread.
 */
#ifndef SK_HTTPD_H
#define SK_HTTPD_H

#include <jansson.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "proto/msg.h"
#include "server/server.h"
#include "sk_limits.h"


struct sk_httpd_config {
  const char *socket_path; /* Unix socket to bind (mode 0660), or NULL */
  int listen_fd;           /* > 0: a listening Unix socket passed by the
                              service manager, used instead of binding */
  const char *tcp_listen;  /* "ADDRESS:PORT" or NULL */
  const char *api_key;     /* required when tcp_listen is set */
  uint32_t tcp_uid;        /* uid that TCP requests act as */
  uint32_t max_body;       /* request body limit (bytes) */
};

struct sk_httpd;

enum sk_httpd_method { SK_HTTPD_GET, SK_HTTPD_POST, SK_HTTPD_OTHER };

/* The request being served, as the route handler gets it (read only).
 * Valid until it is finished (sk_httpd_respond, sk_httpd_error or
 * sk_httpd_stream_end) or its connection closes: a route that answers
 * later binds its state (sk_httpd_bind) to hear of both. */
struct sk_httpd_req {
  struct sk_httpd *httpd;
  enum sk_httpd_method method;
  const char *path;           /* without the query, NUL-terminated */
  const char *body;           /* NUL-terminated; body_len bytes */
  size_t body_len;
  uint32_t uid;               /* whom the request acts as */
};

/* A route handler: serves req, at once or later. user is the pointer
 * given to sk_httpd_start. */
typedef void sk_httpd_route_fn(struct sk_httpd_req *req, void *user);
/* A frame of the request's msgpack connection (a reply or event of a
 * call, id its "id" read with sk_wire_unpack_id; 0 for a frame without
 * one), or map NULL once if the server closed that connection. state is
 * what sk_httpd_bind was given. */
typedef void sk_httpd_frame_fn(struct sk_httpd_req *req, void *state, uint64_t id,
                               const msgpack_object *map);
/* The client left before the request was finished. Returns false: req
 * must not be used again (state is the route's to free). Returns true:
 * the route still has work on the request's msgpack connection (closing
 * a session the client never learned of), which stays open: its frames
 * still come to on_frame, sk_httpd_call still sends, nothing reaches the
 * client; the route ends it with sk_httpd_release. If the server closes
 * that connection first, or SK_LIMIT_HTTP_LINGER_MS pass, or the
 * transport shuts down, on_frame gets map NULL instead (the route frees
 * its state then, without sk_httpd_release). */
typedef bool sk_httpd_gone_fn(struct sk_httpd_req *req, void *state);

/* Binds the configured sockets and starts accepting; every complete
 * request goes to route(req, user). srv and user must outlive the
 * transport. Errors: -SK_ERR_IO (bind, listen, a TCP address without an
 * API key: the message has the address and reason), -SK_ERR_NO_MEMORY. */
int sk_httpd_start(uv_loop_t *loop, struct sk_server *srv, const struct sk_httpd_config *cfg,
                   sk_httpd_route_fn *route, void *user, struct sk_httpd **ret,
                   struct sk_error *err);
/* Stops accepting (removing the socket file it bound) and closes every
 * connection (a request in progress gets its gone callback); call before
 * sk_server_shutdown. sk_httpd_free after the loop ended. */
void sk_httpd_shutdown(struct sk_httpd *h);
void sk_httpd_free(struct sk_httpd *h);

/* Counters of the transport (for /metrics). */
struct sk_httpd_stats {
  uint64_t responses_4xx, responses_5xx;
  uint64_t disconnects;       /* clients gone before their response ended */
};
const struct sk_httpd_stats *sk_httpd_stats(const struct sk_httpd *h);
/* Whether the transport is shutting down (for /health). */
bool sk_httpd_stopping(const struct sk_httpd *h);

/* ---- answering a request ---- */

/* Binds state to the request: frames of its msgpack connection go to
 * on_frame, the client's departure to on_gone. The binding ends when the
 * request is finished (or with sk_httpd_unbind). */
void sk_httpd_bind(struct sk_httpd_req *req, sk_httpd_frame_fn *on_frame,
                   sk_httpd_gone_fn *on_gone, void *state);
/* Ends the work of a request whose client left (gone returned true):
 * its msgpack connection closes and req goes. */
void sk_httpd_release(struct sk_httpd_req *req);
/* Ends the binding if state is still the one bound (finishing the
 * request may already have started the connection's next, pipelined
 * request on the same req, with a binding of its own). */
void sk_httpd_unbind(struct sk_httpd_req *req, const void *state);

/* Sends a whole response: status, Content-Type and body (copied). The
 * request is finished. */
void sk_httpd_respond(struct sk_httpd_req *req, int status, const char *content_type,
                      const char *body, size_t len);
/* The "type" of an OpenAI error object for an HTTP status: server_error
 * for 5xx, authentication_error 401, permission_error 403,
 * not_found_error 404, else invalid_request_error (sinkd-http(7)).
 * Static storage. */
const char *sk_httpd_error_type(int status);
/* The OpenAI error object {"error": {"message", "type", "param": null,
 * "code"}} for status (type as sk_httpd_error_type; code NULL means the
 * type); bytes of message that are not UTF-8 become U+FFFD. New
 * reference, NULL when out of memory. */
json_t *sk_httpd_error_json(int status, const char *code, const char *message);
/* A JSON error response (sk_httpd_error_json) with status; a message
 * longer than 511 bytes is cut (between characters). The transport
 * answers its own errors (401, 408, malformed requests) with it. */
void sk_httpd_error(struct sk_httpd_req *req, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Starts a server-sent event stream (status 200, chunked). */
void sk_httpd_stream_begin(struct sk_httpd_req *req);
/* Sends "data: " + data + "\n\n" as one chunk. */
void sk_httpd_stream_event(struct sk_httpd_req *req, const char *data, size_t len);
/* Ends the stream; the request is finished. */
void sk_httpd_stream_end(struct sk_httpd_req *req);

/* ---- the request's msgpack connection ---- */

/* The id for the next call on the request's msgpack connection. */
uint64_t sk_httpd_next_id(struct sk_httpd_req *req);
/* Sends the request in b (a whole frame as an sk_wire_pack_*_req of
 * proto/wire.h writes it, with an id from sk_httpd_next_id) on the
 * request's msgpack connection, made on first use with req->uid. Its
 * replies and events come to the bound on_frame; if the server closes
 * the connection first, on_frame gets map NULL once. Takes b in every
 * case. Errors: -SK_ERR_IO, -SK_ERR_NO_MEMORY, -SK_ERR_TOO_LARGE (err
 * says why). */
int sk_httpd_call(struct sk_httpd_req *req, struct sk_msgbuf *b, struct sk_error *err);

/* The address of an "ADDRESS:PORT" listen spec (IPv4, [IPv6] or
 * localhost) into *ret. Errors: -SK_ERR_IO naming the spec. */
int sk_httpd_parse_address(const char *spec, struct sockaddr_storage *ret,
                           struct sk_error *err);

#endif
