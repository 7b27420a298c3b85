/* HTTP connections on the loop thread: accepting (Unix and TCP), reading
 * requests with httpreq.c, deadlines, responses and event streams, and
 * each connection's msgpack connection into the server (httpd.h). */
#include "http/httpd.h"

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "http/httpreq.h"
#include "base/log.h"
#include "base/utf8.h"
#include "proto/wire.h"
#include "sinkd/protocol.h"


struct hconn {
  union {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_pipe_t pipe;
    uv_tcp_t tcp;
  } h;
  struct sk_httpd *httpd;
  bool is_tcp;
  uint32_t uid;
  struct sk_http_reader rd;
  char *pending;              /* (pending_len) bytes read after the request
                                 being served; owned */
  size_t pending_len, pending_cap;
  bool busy;                  /* a request is being served */
  bool streaming;             /* its response is an event stream */
  bool keep_alive;            /* the connection stays open after it */
  bool close_after_write;     /* close once the output is written */
  bool reading;
  bool in_process;            /* conn_process is running (no recursion) */
  uint32_t depth;             /* route code running on the stack */
  bool close_pending;         /* close once it returned */
  bool closing;
  bool admitted;              /* holds a slot of the server's (sk_server_admit) */
  bool out_full;              /* over SK_LIMIT_HTTP_OUT: not reading, pipelined
                                 requests wait until the output drains */
  bool peer_eof;              /* the client shut down its sending side */
  bool lingering;             /* the client left; the route finishes its work
                                 on the msgpack connection (sk_httpd_release) */
  struct sk_httpd_req req;
  /* The route's binding of the request being served (sk_httpd_bind). */
  sk_httpd_frame_fn *on_frame;
  sk_httpd_gone_fn *on_gone;
  void *state;
  uv_timer_t timer;           /* request deadline, idle timeout, or the end
                                 of a linger */
  size_t out_bytes;           /* queued in uv_write, not yet written */
  uint32_t refs;              /* handles open + callbacks running */
  /* The msgpack connection into the server. */
  uv_pipe_t back;
  bool back_open;             /* back was opened (and must be closed) */
  bool back_reading;
  bool back_gone;             /* the server closed it */
  struct sk_frame_reader back_rd;
  uint64_t next_id;
  struct hconn *prev, *next;
};

struct sk_httpd {
  uv_loop_t *loop;
  struct sk_server *srv;
  struct sk_httpd_config cfg; /* strings owned (copies) */
  sk_httpd_route_fn *route;
  void *user;
  uv_pipe_t unix_l;
  bool unix_on, owns_file;
  uv_tcp_t tcp_l;
  bool tcp_on;
  bool stopping;
  struct hconn *conns;
  struct hconn *lingering;    /* clients gone, routes finishing (list) */
  struct sk_httpd_stats stats;
  char readbuf[SK_LIMIT_HTTP_READ_BUF];
};

struct out_req {
  uv_write_t req;
  struct hconn *c;
  char *data;
  size_t len;  /* HTTP output bytes (0 for the msgpack connection's) */
  bool back;   /* written to the msgpack connection */
};

static struct hconn *conn_of(struct sk_httpd_req *req) {
  return (struct hconn *)(void *)((char *)req - offsetof(struct hconn, req));
}

const struct sk_httpd_stats *sk_httpd_stats(const struct sk_httpd *h) { return &h->stats; }
bool sk_httpd_stopping(const struct sk_httpd *h) { return h->stopping; }

void sk_httpd_bind(struct sk_httpd_req *req, sk_httpd_frame_fn *on_frame,
                   sk_httpd_gone_fn *on_gone, void *state) {
  struct hconn *c = conn_of(req);
  c->on_frame = on_frame;
  c->on_gone = on_gone;
  c->state = state;
}

static void unbind(struct hconn *c) {
  c->on_frame = NULL;
  c->on_gone = NULL;
  c->state = NULL;
}

void sk_httpd_unbind(struct sk_httpd_req *req, const void *state) {
  struct hconn *c = conn_of(req);
  if (c->state == state) unbind(c);
}

/* ---- lifetime ---- */

static void conn_unref(struct hconn *c) {
  if (--c->refs) return;
  sk_http_reader_free(&c->rd);
  sk_frame_reader_free(&c->back_rd);
  free(c->pending);
  free(c);
}

static void on_handle_closed(uv_handle_t *h) { conn_unref(h->data); }

static void conn_close(struct hconn *c);

/* Around calls into route code: a close requested meanwhile happens
 * after it. */
static void enter(struct hconn *c) {
  c->refs++;
  c->depth++;
}
static void leave(struct hconn *c) {
  if (--c->depth == 0 && c->close_pending) conn_close(c);
  conn_unref(c);
}

/* Whether the connection is closed or about to be. */
static bool dead(const struct hconn *c) { return c->closing || c->close_pending; }

static void list_remove(struct hconn **head, struct hconn *c) {
  if (c->prev) c->prev->next = c->next;
  else *head = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

static void list_push(struct hconn **head, struct hconn *c) {
  c->prev = NULL;
  c->next = *head;
  if (*head) (*head)->prev = c;
  *head = c;
}

static void on_linger_timer(uv_timer_t *t);

/* The end of a linger: the msgpack connection closes (cancelling what
 * still runs on it), and the connection's memory goes with its handles. */
static void linger_end(struct hconn *c) {
  if (!c->lingering) return;
  c->lingering = false;
  unbind(c);
  list_remove(&c->httpd->lingering, c);
  if (!uv_is_closing((uv_handle_t *)&c->back)) uv_close((uv_handle_t *)&c->back, on_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

void sk_httpd_release(struct sk_httpd_req *req) { linger_end(conn_of(req)); }

static void conn_close(struct hconn *c) {
  if (c->closing) return;
  if (c->depth) {
    /* A route is on the stack (a write failed under it): its request
     * must stay valid until it returns. */
    c->close_pending = true;
    return;
  }
  c->closing = true;
  bool linger = false;
  if (c->busy) {
    /* The client left before its response ended. */
    c->busy = false;
    c->httpd->stats.disconnects++;
    if (c->on_gone) linger = c->on_gone(&c->req, c->state);
    if (linger && (!c->back_open || c->back_gone || c->httpd->stopping)) {
      /* No linger possible: the route hears so at once. */
      if (c->on_frame) c->on_frame(&c->req, c->state, 0, NULL);
      linger = false;
    }
  }
  if (c->admitted) sk_server_unadmit(c->httpd->srv, c->uid);
  c->admitted = false;
  list_remove(&c->httpd->conns, c);
  uv_close(&c->h.handle, on_handle_closed);
  if (linger) {
    /* The route still has work on the msgpack connection (closing a
     * session the client never learned of): it stays open, within a
     * deadline. */
    c->lingering = true;
    list_push(&c->httpd->lingering, c);
    uv_timer_start(&c->timer, on_linger_timer, SK_LIMIT_HTTP_LINGER_MS, 0);
    return;
  }
  /* Closing the msgpack connection is what a departed msgpack client
   * does: its generation is cancelled at the next step and its
   * temporary sessions close. */
  if (c->back_open) uv_close((uv_handle_t *)&c->back, on_handle_closed);
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* ---- output ---- */

static void back_resume(struct hconn *c);
static void conn_resume(struct hconn *c);

static void on_written(uv_write_t *w, int status) {
  struct out_req *o = (struct out_req *)w;
  struct hconn *c = o->c;
  c->out_bytes -= o->len;
  free(o->data);
  bool back = o->back;
  free(o);
  if (status < 0 && !back) conn_close(c);
  else if (!c->closing && !back) {
    if (c->out_bytes <= SK_LIMIT_HTTP_OUT / 2) {
      back_resume(c);
      if (c->out_full) {
        c->out_full = false;
        enter(c);
        conn_resume(c);
        leave(c);
      }
    }
    if (!c->closing && c->close_after_write && c->out_bytes == 0) conn_close(c);
  }
  conn_unref(c);
}

/* Queues data[0..len) (taken: freed after the write) on the client's
 * stream, or with back on the msgpack connection (not counted as HTTP
 * output). Returns 0, or -SK_ERR_NO_MEMORY / -SK_ERR_IO with data freed
 * and nothing queued. */
static int out_write(struct hconn *c, bool back, char *data, size_t len) {
  struct out_req *o = malloc(sizeof *o);
  if (!o) {
    free(data);
    return -SK_ERR_NO_MEMORY;
  }
  o->c = c;
  o->data = data;
  o->len = back ? 0 : len;
  o->back = back;
  uv_buf_t buf = uv_buf_init(data, (unsigned)len);
  c->refs++;
  c->out_bytes += o->len;
  if (uv_write(&o->req, back ? (uv_stream_t *)&c->back : &c->h.stream, &buf, 1, on_written) < 0) {
    c->out_bytes -= o->len;
    free(data);
    free(o);
    conn_unref(c);
    return -SK_ERR_IO;
  }
  return 0;
}

/* Queues data (taken: freed after the write) for the client; a failure
 * closes the connection. */
static void conn_write(struct hconn *c, char *data, size_t len) {
  if (dead(c) || len == 0) {
    free(data);
    return;
  }
  if (out_write(c, false, data, len) < 0) {
    conn_close(c);
    return;
  }
  /* A slow reader: stop taking its tokens, which pauses its generation
   * in the server (its msgpack connection backs up), and stop reading
   * its requests (pipelined ones wait), as the protocol's connections
   * do: a client that never reads costs at most this much output. */
  if (c->out_bytes > SK_LIMIT_HTTP_OUT) {
    if (c->back_reading) {
      uv_read_stop((uv_stream_t *)&c->back);
      c->back_reading = false;
    }
    c->out_full = true;
    if (c->reading) {
      uv_read_stop(&c->h.stream);
      c->reading = false;
    }
  }
}

static void conn_writef(struct hconn *c, const char *body, size_t body_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Writes the formatted head, then body_len bytes of body, as one buffer. */
static void conn_writef(struct hconn *c, const char *body, size_t body_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  char *buf = malloc((size_t)n + body_len + 1);
  if (!buf) {
    conn_close(c);
    return;
  }
  va_start(ap, fmt);
  vsnprintf(buf, (size_t)n + 1, fmt, ap);
  va_end(ap);
  if (body_len) memcpy(buf + n, body, body_len);
  conn_write(c, buf, (size_t)n + body_len);
}

static const char *reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 200: return "OK";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 413: return "Content Too Large";
  case 414: return "URI Too Long";
  case 415: return "Unsupported Media Type";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 503: return "Service Unavailable";
  case 507: return "Insufficient Storage";
  default: return "Status";
  }
}

static void request_done(struct hconn *c);

void sk_httpd_respond(struct sk_httpd_req *req, int status, const char *content_type,
                      const char *body, size_t len) {
  struct hconn *c = conn_of(req);
  if (!c->busy || dead(c)) return;
  if (status >= 500) c->httpd->stats.responses_5xx++;
  else if (status >= 400) c->httpd->stats.responses_4xx++;
  conn_writef(c, body, len,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
              "Connection: %s\r\n\r\n",
              status, reason(status), content_type, len, c->keep_alive ? "keep-alive" : "close");
  request_done(c);
}

const char *sk_httpd_error_type(int status) {
  return status >= 500   ? "server_error"
         : status == 401 ? "authentication_error"
         : status == 403 ? "permission_error"
         : status == 404 ? "not_found_error"
                         : "invalid_request_error";
}

json_t *sk_httpd_error_json(int status, const char *code, const char *message) {
  /* JSON strings are UTF-8: bytes that are not (from a request's target,
   * say) become U+FFFD. */
  size_t n = strlen(message);
  char *text = malloc(3 * (n + 4) + 3 + 1);
  if (!text) return NULL;
  struct sk_utf8_stream u;
  sk_utf8_stream_init(&u);
  size_t w = sk_utf8_stream_push(&u, message, n, text);
  w += sk_utf8_stream_flush(&u, text + w);
  const char *type = sk_httpd_error_type(status);
  json_t *o = json_pack("{s:{s:s%, s:s, s:n, s:s}}", "error", "message", text, w, "type", type,
                        "param", "code", code ? code : type);
  free(text);
  return o;
}

/* The JSON text of an OpenAI error object (malloc'd). */
static char *error_json(int status, const char *code, const char *message, size_t *ret_len) {
  json_t *o = sk_httpd_error_json(status, code, message);
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  *ret_len = s ? strlen(s) : 0;
  return s;
}

void sk_httpd_error(struct sk_httpd_req *req, int status, const char *code, const char *fmt,
                    ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* Cut to fit: not in the middle of a character. */
  if (n >= (int)sizeof msg) msg[sk_utf8_trim_cut(msg, sizeof msg - 1)] = 0;
  size_t len = 0;
  char *body = error_json(status, code, msg, &len);
  sk_httpd_respond(req, status, "application/json", body ? body : "{}", body ? len : 2);
  free(body);
}

void sk_httpd_stream_begin(struct sk_httpd_req *req) {
  struct hconn *c = conn_of(req);
  if (!c->busy || dead(c) || c->streaming) return;
  c->streaming = true;
  conn_writef(c, NULL, 0,
              "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
              "Transfer-Encoding: chunked\r\nConnection: %s\r\n\r\n",
              c->keep_alive ? "keep-alive" : "close");
}

void sk_httpd_stream_event(struct sk_httpd_req *req, const char *data, size_t len) {
  struct hconn *c = conn_of(req);
  if (!c->busy || dead(c) || !c->streaming) return;
  /* One chunk: "data: " data "\n\n". */
  conn_writef(c, "\n\n\r\n", 4, "%zx\r\ndata: %.*s", len + 8, (int)len, data);
}

void sk_httpd_stream_end(struct sk_httpd_req *req) {
  struct hconn *c = conn_of(req);
  if (!c->busy || dead(c) || !c->streaming) return;
  conn_writef(c, NULL, 0, "0\r\n\r\n");
  request_done(c);
}

/* ---- the msgpack connection ---- */

/* Both of a connection's streams (the client's and the msgpack one) read
 * into the server's one read buffer: each read is handled before the
 * next starts. */
static void conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  struct hconn *c = h->data;
  buf->base = c->httpd->readbuf;
  buf->len = sizeof c->httpd->readbuf;
}

static void back_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  struct hconn *c = s->data;
  if (nread == 0) return;
  enter(c);
  if (nread < 0 || sk_frame_reader_feed(&c->back_rd, buf->base, (size_t)nread) < 0) {
    uv_read_stop(s);
    c->back_reading = false;
    c->back_gone = true;
    if ((c->busy || c->lingering) && c->on_frame) c->on_frame(&c->req, c->state, 0, NULL);
    linger_end(c); /* the route took the NULL frame as its end */
    leave(c);
    return;
  }
  for (;;) {
    if (dead(c) && !c->lingering) break;
    const uint8_t *body;
    size_t len;
    int rc = sk_frame_reader_next(&c->back_rd, &body, &len);
    if (rc == 0) break;
    if (rc < 0) continue; /* the server's frames are within the ceiling */
    struct sk_msg msg;
    struct sk_error e;
    if (sk_msg_parse(body, len, &msg, &e) < 0) continue;
    uint64_t id = 0;
    if (sk_wire_unpack_id(&msg.root, &id, &e) < 0) id = 0;
    if ((c->busy || c->lingering) && c->on_frame) c->on_frame(&c->req, c->state, id, &msg.root);
    sk_msg_free(&msg);
  }
  leave(c);
}

static void back_resume(struct hconn *c) {
  if (c->back_open && !c->back_reading && !c->back_gone && (!c->closing || c->lingering)) {
    uv_read_start((uv_stream_t *)&c->back, conn_alloc, back_read);
    c->back_reading = true;
  }
}

uint64_t sk_httpd_next_id(struct sk_httpd_req *req) { return ++conn_of(req)->next_id; }

int sk_httpd_call(struct sk_httpd_req *req, struct sk_msgbuf *b, struct sk_error *err) {
  struct hconn *c = conn_of(req);
  int rc = 0;
  if (c->back_gone) {
    rc = sk_error_set(err, SK_ERR_IO, "the daemon closed this client's connection");
    goto out;
  }
  if (!c->back_open) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0) {
      rc = sk_error_set(err, SK_ERR_IO, "socketpair: %s", strerror(errno));
      goto out;
    }
    uv_pipe_init(c->httpd->loop, &c->back, 0);
    c->back.data = c;
    if (uv_pipe_open(&c->back, fds[1]) < 0) {
      close(fds[0]);
      close(fds[1]);
      uv_close((uv_handle_t *)&c->back, NULL);
      rc = sk_error_set(err, SK_ERR_IO, "cannot open the daemon connection");
      goto out;
    }
    c->back_open = true;
    c->refs++;
    sk_frame_reader_init(&c->back_rd, SK_FRAME_MAX_CEILING);
    rc = sk_server_attach(c->httpd->srv, fds[0], c->uid, err);
    if (rc < 0) {
      c->back_gone = true;
      goto out;
    }
    back_resume(c);
  }
  int64_t n = sk_msgbuf_finish(b);
  if (n < 0) {
    rc = sk_error_set(err, SK_ERR_TOO_LARGE, "request too large");
    goto out;
  }
  size_t size = 0;
  char *data = sk_msgbuf_release(b, &size);
  rc = data ? out_write(c, true, data, size) : -SK_ERR_NO_MEMORY;
  if (rc == -SK_ERR_NO_MEMORY) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  if (rc < 0) return sk_error_set(err, SK_ERR_IO, "the daemon closed this client's connection");
  return 0;
out:
  sk_msgbuf_free(b);
  return rc;
}

/* ---- requests ---- */

static void conn_process(struct hconn *c, const char *data, size_t len);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void on_timer(uv_timer_t *t) {
  struct hconn *c = t->data;
  if (c->busy || c->closing) return;
  if (c->rd.started) {
    /* Slow client (slowloris): a request that does not arrive in time. */
    c->busy = true;
    c->keep_alive = false;
    sk_httpd_error(&c->req, 408, "request_timeout", "the request did not arrive within %u s",
                  SK_LIMIT_HTTP_REQUEST_MS / 1000);
    c->close_after_write = true;
  } else {
    conn_close(c);
  }
}

/* The route did not finish its work in time: the msgpack connection
 * closes, the route hears of it as the server's close (on_frame NULL). */
static void on_linger_timer(uv_timer_t *t) {
  struct hconn *c = t->data;
  if (!c->lingering) return;
  sk_log(SK_LOG_WARNING, "HTTP: the work of a departed client of uid %u did not end within "
         "%u ms; its daemon connection is closed", c->uid, SK_LIMIT_HTTP_LINGER_MS);
  if (c->on_frame) c->on_frame(&c->req, c->state, 0, NULL);
  linger_end(c);
}

/* Once the output has room: the next pipelined request if nothing is
 * being served, and reading again (during a response too, up to one
 * more request, so that a client's departure is seen); a client that
 * shut down its side is answered, then closed. */
static void conn_resume(struct hconn *c) {
  if (dead(c) || c->out_full) return;
  if (c->busy) {
    if (!c->reading && !c->peer_eof &&
        c->pending_len <= SK_LIMIT_HTTP_HEADER_BYTES + (size_t)c->httpd->cfg.max_body) {
      uv_read_start(&c->h.stream, conn_alloc, on_read);
      c->reading = true;
    }
    return;
  }
  if (c->pending_len && !c->in_process) {
    /* Pipelined requests: served one after the other. */
    char *p = c->pending;
    size_t n = c->pending_len;
    c->pending = NULL;
    c->pending_len = c->pending_cap = 0;
    conn_process(c, p, n);
    free(p);
  }
  if (c->busy || dead(c) || c->out_full || c->in_process) return;
  if (c->peer_eof) {
    /* Nothing more can come: what was asked is answered. */
    c->close_after_write = true;
    if (c->out_bytes == 0) conn_close(c);
    return;
  }
  if (!c->reading) {
    uv_read_start(&c->h.stream, conn_alloc, on_read);
    c->reading = true;
  }
}

static void request_done(struct hconn *c) {
  c->busy = false;
  c->streaming = false;
  unbind(c);
  sk_http_reader_next(&c->rd);
  if (!c->keep_alive) {
    c->close_after_write = true;
    if (c->out_bytes == 0) conn_close(c);
    return;
  }
  uv_timer_start(&c->timer, on_timer, SK_LIMIT_HTTP_IDLE_MS, 0);
  conn_resume(c);
}

/* Constant-time comparison of the bearer token with the key. */
static bool key_matches(const struct sk_httpd *h, const char *auth, size_t auth_len) {
  static const char prefix[] = "Bearer ";
  size_t plen = sizeof prefix - 1;
  if (auth_len < plen || strncasecmp(auth, prefix, plen) != 0) return false;
  const char *tok = auth + plen;
  size_t tlen = auth_len - plen;
  size_t klen = strlen(h->cfg.api_key);
  unsigned char diff = (unsigned char)(tlen != klen);
  for (size_t i = 0; i < klen; i++) diff |= (unsigned char)(tok[i < tlen ? i : 0] ^ h->cfg.api_key[i]);
  return diff == 0;
}

static void dispatch(struct hconn *c) {
  struct sk_http_reader *r = &c->rd;
  struct sk_httpd_req *req = &c->req;
  memset(req, 0, sizeof *req);
  unbind(c);
  req->httpd = c->httpd;
  req->uid = c->uid;
  req->method = r->method == HTTP_GET    ? SK_HTTPD_GET
                : r->method == HTTP_POST ? SK_HTTPD_POST
                                         : SK_HTTPD_OTHER;
  char *q = strchr(r->url, '?');
  if (q) *q = 0;
  req->path = r->url;
  req->body = r->body ? r->body : "";
  req->body_len = r->body_len;
  c->keep_alive = r->keep_alive && !c->httpd->stopping;
  if (c->is_tcp && (r->auth_too_long || !key_matches(c->httpd, r->auth, r->auth_len))) {
    sk_httpd_error(req, 401, "invalid_api_key",
                  "missing or wrong API key: send 'Authorization: Bearer KEY'");
    return;
  }
  c->httpd->route(req, c->httpd->user);
}

static void conn_process_loop(struct hconn *c, const char *data, size_t len);

/* Serves what data holds. A response given at once (synchronously)
 * returns here, and the loop goes on with the next pipelined request
 * instead of recursing into request_done. */
static void conn_process(struct hconn *c, const char *data, size_t len) {
  bool was = c->in_process;
  c->in_process = true;
  conn_process_loop(c, data, len);
  c->in_process = was;
}

static void conn_process_loop(struct hconn *c, const char *data, size_t len) {
  while (!dead(c)) {
    if (c->busy || c->out_full) {
      /* Bytes after the request being served (pipelining), or while the
       * output waits for the client to read: kept up to the size of one
       * more request; past that the client waits. */
      if (len == 0) return;
      if (c->pending_len + len > c->pending_cap) {
        size_t cap = c->pending_len + len;
        char *p = realloc(c->pending, cap);
        if (!p) {
          conn_close(c);
          return;
        }
        c->pending = p;
        c->pending_cap = cap;
      }
      memcpy(c->pending + c->pending_len, data, len);
      c->pending_len += len;
      if (c->pending_len > SK_LIMIT_HTTP_HEADER_BYTES + (size_t)c->httpd->cfg.max_body && c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = false;
      }
      return;
    }
    if (len == 0) return;
    bool was_started = c->rd.started;
    size_t used = 0;
    int rc = sk_http_reader_feed(&c->rd, data, len, &used);
    data += used;
    len -= used;
    if (!was_started && c->rd.started)
      uv_timer_start(&c->timer, on_timer, SK_LIMIT_HTTP_REQUEST_MS, 0);
    switch (rc) {
    case SK_HTTP_READ_MORE:
      if (used == 0) return;
      break;
    case SK_HTTP_READ_CONTINUE:
      conn_writef(c, NULL, 0, "HTTP/1.1 100 Continue\r\n\r\n");
      break;
    case SK_HTTP_READ_REQUEST:
      uv_timer_stop(&c->timer);
      c->busy = true;
      dispatch(c);
      break;
    default:
      /* Out of sync with the client: answer and close. */
      uv_timer_stop(&c->timer);
      c->busy = true;
      c->keep_alive = false;
      memset(&c->req, 0, sizeof c->req);
      unbind(c);
      c->req.httpd = c->httpd;
      sk_httpd_error(&c->req, c->rd.status, "malformed_request", "%s", c->rd.message);
      if (c->reading) {
        uv_read_stop(&c->h.stream);
        c->reading = false;
      }
      return;
    }
  }
}

/* Whether the peer of a Unix socket closed it whole (not only shut
 * down its sending side): then the socket reports POLLHUP. A TCP peer's
 * close looks like a half-close until a write fails. */
static bool peer_closed(const struct hconn *c) {
  uv_os_fd_t fd;
  if (c->is_tcp || uv_fileno(&c->h.handle, &fd) != 0) return false;
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  struct hconn *c = s->data;
  if (nread == UV_EOF && !peer_closed(c)) {
    /* Half-close: the client sent all it will; what it asked whole is
     * still answered (then the connection closes). */
    uv_read_stop(s);
    c->reading = false;
    c->peer_eof = true;
    enter(c);
    conn_resume(c);
    leave(c);
    return;
  }
  if (nread < 0) {
    conn_close(c);
    return;
  }
  if (nread == 0) return;
  enter(c);
  conn_process(c, buf->base, (size_t)nread);
  leave(c);
}

/* A connection refused at its accept: an error response written at once
 * (if the socket takes it), then closed; nothing is read. */
static void conn_refuse(struct hconn *c, const struct sk_error *e) {
  size_t len = 0;
  char *body = error_json(429, sk_error_name(e->code), e->message, &len);
  char head[160];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n", len);
  uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)n), uv_buf_init(body ? body : "", (unsigned)len)};
  (void)uv_try_write(&c->h.stream, bufs, 2);
  free(body);
  c->httpd->stats.responses_4xx++;
  uv_close(&c->h.handle, on_handle_closed);
}

static void conn_start(struct sk_httpd *h, struct hconn *c) {
  /* Counted from its accept, as a protocol connection: an HTTP client
   * holds a descriptor and memory before it asks for anything. */
  struct sk_error e;
  if (!h->stopping && sk_server_admit(h->srv, c->uid, &e) < 0) {
    conn_refuse(c, &e);
    return;
  }
  c->admitted = !h->stopping;
  c->refs++; /* the timer */
  uv_timer_init(h->loop, &c->timer);
  c->timer.data = c;
  sk_http_reader_init(&c->rd, h->cfg.max_body);
  list_push(&h->conns, c);
  if (h->stopping) {
    conn_close(c);
    return;
  }
  uv_timer_start(&c->timer, on_timer, SK_LIMIT_HTTP_REQUEST_MS, 0);
  uv_read_start(&c->h.stream, conn_alloc, on_read);
  c->reading = true;
}

/* A new connection's state (one reference, its own), or NULL when the
 * listener reported an error or memory ran out (the peer is not taken). */
static struct hconn *conn_new(struct sk_httpd *h, int status) {
  if (status < 0) return NULL;
  struct hconn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->httpd = h;
  c->refs = 1;
  return c;
}

static void on_unix_conn(uv_stream_t *l, int status) {
  struct sk_httpd *h = l->data;
  struct hconn *c = conn_new(h, status);
  if (!c) return;
  uv_pipe_init(h->loop, &c->h.pipe, 0);
  c->h.handle.data = c;
  if (uv_accept(l, &c->h.stream) < 0) {
    uv_close(&c->h.handle, on_handle_closed);
    return;
  }
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (uv_fileno(&c->h.handle, &fd) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
    c->uid = cred.uid;
  else
    c->uid = UINT32_MAX; /* unknown peer: owns nothing */
  conn_start(h, c);
}

static void on_tcp_conn(uv_stream_t *l, int status) {
  struct sk_httpd *h = l->data;
  struct hconn *c = conn_new(h, status);
  if (!c) return;
  c->is_tcp = true;
  c->uid = h->cfg.tcp_uid;
  uv_tcp_init(h->loop, &c->h.tcp);
  c->h.handle.data = c;
  if (uv_accept(l, &c->h.stream) < 0) {
    uv_close(&c->h.handle, on_handle_closed);
    return;
  }
  uv_tcp_nodelay(&c->h.tcp, 1);
  conn_start(h, c);
}

/* ---- listeners ---- */

static int listen_unix(struct sk_httpd *h, struct sk_error *err) {
  uv_pipe_init(h->loop, &h->unix_l, 0);
  h->unix_l.data = h;
  int rc;
  const char *what = h->cfg.socket_path;
  char fdname[32];
  if (h->cfg.listen_fd > 0) {
    snprintf(fdname, sizeof fdname, "fd %d", h->cfg.listen_fd);
    what = fdname;
    rc = uv_pipe_open(&h->unix_l, h->cfg.listen_fd);
  } else {
    rc = sk_server_check_socket(h->cfg.socket_path, err);
    if (rc < 0) {
      uv_close((uv_handle_t *)&h->unix_l, NULL);
      return rc;
    }
    unlink(h->cfg.socket_path); /* stale, by the check */
    rc = uv_pipe_bind(&h->unix_l, h->cfg.socket_path);
    h->owns_file = rc == 0;
  }
  if (rc == 0) rc = uv_listen((uv_stream_t *)&h->unix_l, 128, on_unix_conn);
  if (rc < 0) {
    uv_close((uv_handle_t *)&h->unix_l, NULL);
    if (h->owns_file) unlink(h->cfg.socket_path);
    h->owns_file = false;
    return sk_error_set(err, SK_ERR_IO, "cannot listen for HTTP on %s: %s", what, uv_strerror(rc));
  }
  /* The same access as the msgpack socket. */
  if (h->owns_file && chmod(h->cfg.socket_path, 0660) < 0)
    sk_log(SK_LOG_WARNING, "chmod 0660 %s: %s", h->cfg.socket_path, strerror(errno));
  h->unix_on = true;
  return 0;
}

int sk_httpd_parse_address(const char *spec, struct sockaddr_storage *ret,
                           struct sk_error *err) {
  const char *colon = strrchr(spec, ':');
  char host[64];
  size_t hl = colon ? (size_t)(colon - spec) : 0;
  if (!colon || hl >= sizeof host)
    return sk_error_set(err, SK_ERR_IO, "bad HTTP listen address '%s'", spec);
  memcpy(host, spec, hl);
  host[hl] = 0;
  int port = atoi(colon + 1);
  int rc;
  memset(ret, 0, sizeof *ret);
  if (strcmp(host, "localhost") == 0)
    rc = uv_ip4_addr("127.0.0.1", port, (struct sockaddr_in *)ret);
  else if (host[0] == '[') {
    host[hl - 1] = 0;
    rc = uv_ip6_addr(host + 1, port, (struct sockaddr_in6 *)ret);
  } else rc = uv_ip4_addr(host, port, (struct sockaddr_in *)ret);
  if (rc < 0) return sk_error_set(err, SK_ERR_IO, "bad HTTP listen address '%s'", spec);
  return 0;
}

static int listen_tcp(struct sk_httpd *h, struct sk_error *err) {
  const char *spec = h->cfg.tcp_listen;
  struct sockaddr_storage addr;
  int rc = sk_httpd_parse_address(spec, &addr, err);
  if (rc < 0) return rc;
  uv_tcp_init(h->loop, &h->tcp_l);
  h->tcp_l.data = h;
  rc = uv_tcp_bind(&h->tcp_l, (struct sockaddr *)&addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&h->tcp_l, 128, on_tcp_conn);
  if (rc < 0) {
    uv_close((uv_handle_t *)&h->tcp_l, NULL);
    return sk_error_set(err, SK_ERR_IO, "cannot listen for HTTP on %s: %s", spec, uv_strerror(rc));
  }
  h->tcp_on = true;
  return 0;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

void sk_httpd_free(struct sk_httpd *h) {
  if (!h) return;
  free((char *)h->cfg.socket_path);
  free((char *)h->cfg.tcp_listen);
  free((char *)h->cfg.api_key);
  free(h);
}

int sk_httpd_start(uv_loop_t *loop, struct sk_server *srv, const struct sk_httpd_config *cfg,
                   sk_httpd_route_fn *route, void *user, struct sk_httpd **ret,
                   struct sk_error *err) {
  struct sk_httpd *h = calloc(1, sizeof *h);
  if (!h) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  h->loop = loop;
  h->srv = srv;
  h->route = route;
  h->user = user;
  h->cfg = *cfg;
  h->cfg.socket_path = dup_or_null(cfg->socket_path);
  h->cfg.tcp_listen = dup_or_null(cfg->tcp_listen);
  h->cfg.api_key = dup_or_null(cfg->api_key);
  int rc = 0;
  if ((cfg->socket_path && !h->cfg.socket_path) || (cfg->tcp_listen && !h->cfg.tcp_listen) ||
      (cfg->api_key && !h->cfg.api_key))
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  if (rc == 0 && cfg->tcp_listen && (!cfg->api_key || !*cfg->api_key))
    rc = sk_error_set(err, SK_ERR_IO, "HTTP on %s needs an API key", cfg->tcp_listen);
  if (rc == 0 && (cfg->listen_fd > 0 || cfg->socket_path)) rc = listen_unix(h, err);
  if (rc == 0 && cfg->tcp_listen) rc = listen_tcp(h, err);
  if (rc < 0) {
    sk_httpd_shutdown(h);
    uv_run(loop, UV_RUN_NOWAIT);
    sk_httpd_free(h);
    return rc;
  }
  *ret = h;
  return 0;
}

void sk_httpd_shutdown(struct sk_httpd *h) {
  if (!h || h->stopping) return;
  h->stopping = true;
  if (h->unix_on) {
    uv_close((uv_handle_t *)&h->unix_l, NULL);
    h->unix_on = false;
    if (h->owns_file) unlink(h->cfg.socket_path);
  }
  if (h->tcp_on) {
    uv_close((uv_handle_t *)&h->tcp_l, NULL);
    h->tcp_on = false;
  }
  while (h->conns) conn_close(h->conns);
  while (h->lingering) {
    struct hconn *c = h->lingering;
    if (c->on_frame) c->on_frame(&c->req, c->state, 0, NULL);
    linger_end(c);
  }
}
