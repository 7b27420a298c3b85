/* The HTTP front end: OpenAI-compatible routes (openai.h) served on the
 * daemon's libuv loop, on a Unix socket beside the msgpack one and, when
 * configured, on a TCP address guarded by an API key. See sinkd-http(7).
 *
 * Each HTTP connection that needs the model gets its own msgpack
 * connection into the server (sk_server_attach on a socketpair), made
 * with the HTTP peer's uid: HTTP requests run through exactly the ops,
 * checks, limits, ownership and cancellation of the msgpack protocol,
 * and a client that disconnects ends its msgpack connection, which
 * cancels its generation as any departed msgpack client's.
 *
 * Bounds: request headers and body (httpreq.h, max_frame), one request
 * at a time per connection (pipelined requests wait), a deadline for a
 * request to arrive (slow clients), an idle keep-alive timeout, and
 * bytes waiting to be written (a slow reader stops reading its msgpack
 * connection, which pauses its own generation only).
 */
#ifndef SK_HTTP_H
#define SK_HTTP_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "proto/msg.h"
#include "server/server.h"
#include "sk_limits.h"


struct sk_http_config {
  const char *socket_path; /* Unix socket to bind (mode 0660), or NULL */
  int listen_fd;           /* > 0: a listening Unix socket passed by the
                              service manager, used instead of binding */
  const char *tcp_listen;  /* "ADDRESS:PORT" or NULL */
  const char *api_key;     /* required when tcp_listen is set */
  uint32_t tcp_uid;        /* uid that TCP requests act as */
  const char *model_name;  /* the id /v1/models lists */
  uint32_t max_body;       /* request body limit (bytes) */
};

struct sk_http;
struct sk_http_req;
struct sk_oaiconv;

/* Binds the configured sockets and starts accepting. srv must outlive
 * the front end. Errors: -SK_ERR_IO (bind, listen: the message has the
 * address and reason), -SK_ERR_NO_MEMORY. */
int sk_http_start(uv_loop_t *loop, struct sk_server *srv, const struct sk_http_config *cfg,
                  struct sk_http **ret, struct sk_error *err);
/* Stops accepting (removing the socket file it bound) and closes every
 * connection; call before sk_server_shutdown. sk_http_free after the
 * loop ended. */
void sk_http_shutdown(struct sk_http *h);
void sk_http_free(struct sk_http *h);

/* ---- for the routes (openai.c) ---- */

/* Counters of the front end, for /metrics (loop thread only). */
struct sk_http_stats {
  uint64_t requests[8];       /* by route, enum sk_openai_route */
  uint64_t responses_4xx, responses_5xx;
  uint64_t disconnects;       /* clients gone before their response ended */
  uint64_t prompt_tokens, completion_tokens;
  uint64_t evicted;           /* tokens evicted during HTTP requests */
  uint64_t token_gap_us[12];  /* histogram of the time between two streamed
                                 tokens: bucket i counts gaps <= 2^i ms,
                                 the last one all others */
  uint64_t token_gap_sum_us, token_gap_count;
};

/* The request being served, valid until it is finished (respond or
 * stream_end) or its connection closes (then the route's on_gone is
 * called instead and the request must not be used again). */
struct sk_http_req {
  struct sk_http *http;
  enum http_method_id { SK_HTTP_GET, SK_HTTP_POST, SK_HTTP_OTHER } method;
  const char *path;           /* without the query, NUL-terminated */
  const char *body;           /* NUL-terminated; body_len bytes */
  size_t body_len;
  uint32_t uid;               /* whom the request acts as */
  /* Set by the route: frames of the msgpack connection with the id of a
   * call it made (sk_http_call) come to on_frame; on_gone tells that the
   * client left. state is the route's. */
  void (*on_frame)(struct sk_http_req *req, uint64_t id, const msgpack_object *map);
  void (*on_gone)(struct sk_http_req *req);
  void *state;
};

struct sk_http_stats *sk_http_stats(struct sk_http *h);
/* The routes' memory of conversations (oaiconv.h), owned by h. */
struct sk_oaiconv *sk_http_convs(struct sk_http *h);
const struct sk_http_config *sk_http_config(const struct sk_http *h);
/* Whether the daemon is shutting down (for /health). */
bool sk_http_stopping(const struct sk_http *h);

/* Sends a whole response: status, Content-Type and body (copied). The
 * request is finished. */
void sk_http_respond(struct sk_http_req *req, int status, const char *content_type,
                     const char *body, size_t len);
/* An OpenAI error object {"error": {"message", "type", "param", "code"}}
 * with status; type is "invalid_request_error" for 4xx unless given. */
void sk_http_error(struct sk_http_req *req, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Starts a server-sent event stream (status 200, chunked). */
void sk_http_stream_begin(struct sk_http_req *req);
/* Sends "data: " + data + "\n\n" as one chunk. */
void sk_http_stream_event(struct sk_http_req *req, const char *data, size_t len);
/* Ends the stream; the request is finished. */
void sk_http_stream_end(struct sk_http_req *req);

/* The id for the next call on the request's msgpack connection. */
uint64_t sk_http_next_id(struct sk_http_req *req);
/* Sends the frame in b (a request's map entries, "id" from
 * sk_http_next_id among them, packed one after another without the map
 * header, which this counts and writes: sk_msgbuf_finish_map) on the
 * request's msgpack connection, made on first use with req->uid. Its
 * replies and events come to req->on_frame; if the server closes the
 * connection first, on_frame gets map NULL once. Takes b in every case.
 * Errors: -SK_ERR_IO, -SK_ERR_NO_MEMORY (err says why). */
int sk_http_call(struct sk_http_req *req, struct sk_msgbuf *b, struct sk_error *err);

#endif
