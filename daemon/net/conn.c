#include "net/conn.h"

#include <stdarg.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>

#include "base/clock.h"
#include "base/log.h"
#include "proto/wire.h"

struct sk__write {
  uv_write_t req;
  struct sk_conn *conn;
  char *data;
  size_t len;
};

static void sk__on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void sk__alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  struct sk_conn *c = h->data;
  buf->base = c->set->readbuf;
  buf->len = sizeof c->set->readbuf;
}

void sk_conn_ref(struct sk_conn *c) { c->refs++; }

void sk_conn_unref(struct sk_conn *c) {
  if (--c->refs == 0) {
    struct sk_conns *set = c->set;
    if (set->hooks.release) set->hooks.release(set->user, c);
    sk_frame_reader_free(&c->rd);
    free(c);
  }
}

static void sk__pause(struct sk_conn *c, bool paused) {
  struct sk_conns *set = c->set;
  if (set->hooks.pause) set->hooks.pause(set->user, c, paused);
}

static void sk__on_write(uv_write_t *req, int status) {
  struct sk__write *w = (struct sk__write *)req;
  struct sk_conn *c = w->conn;
  struct sk_conns *set = c->set;
  c->out_bytes -= w->len;
  free(w->data);
  free(w);
  if (status < 0 && status != UV_ECANCELED)
    sk_log(SK_LOG_DEBUG, "client %llu: write failed: %s", (unsigned long long)c->id,
           uv_strerror(status));
  if (c->out_paused && !c->closing && c->out_bytes < SK_LIMIT_CONN_OUT / 2) {
    c->out_paused = false;
    uv_read_start((uv_stream_t *)&c->pipe, sk__alloc, sk__on_read);
    sk__pause(c, false);
  }
  if (!c->closing && set->hooks.drain) set->hooks.drain(set->user, c);
  sk_conn_unref(c);
}

void sk_conn_send(struct sk_conn *c, char *data, size_t len) {
  if (c->closing) {
    free(data);
    return;
  }
  struct sk__write *w = malloc(sizeof *w);
  if (!w) {
    free(data);
    return;
  }
  w->conn = c;
  w->data = data;
  w->len = len;
  uv_buf_t b = uv_buf_init(data, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, sk__on_write);
  if (rc < 0) {
    free(data);
    free(w);
    return;
  }
  c->refs++;
  c->out_bytes += len;
  if (!c->out_paused && c->out_bytes > SK_LIMIT_CONN_OUT) {
    /* Slow reader: stop taking its requests and pause its generation. */
    c->out_paused = true;
    uv_read_stop((uv_stream_t *)&c->pipe);
    sk__pause(c, true);
  }
}

void sk_conn_send_msg(struct sk_conn *c, struct sk_msgbuf *b) {
  if (sk_msgbuf_finish(b) < 0) {
    sk_msgbuf_free(b);
    return;
  }
  size_t len = 0;
  char *data = sk_msgbuf_release(b, &len);
  if (data) sk_conn_send(c, data, len);
}

void sk_conn_send_error(struct sk_conn *c, uint64_t id, const struct sk_error *e) {
  struct sk_msgbuf b;
  if (sk_msgbuf_init(&b) < 0) return;
  if (sk_wire_pack_error(&b, id, e) < 0) {
    sk_msgbuf_free(&b);
    return;
  }
  sk_log(SK_LOG_DEBUG, "client %llu: request %llu: %s: %s", (unsigned long long)c->id,
         (unsigned long long)id, sk_error_name(e->code), e->message);
  sk_conn_send_msg(c, &b);
}

void sk_conn_send_errorf(struct sk_conn *c, uint64_t id, int code, const char *fmt, ...) {
  struct sk_error e;
  va_list ap;
  va_start(ap, fmt);
  sk_error_setv(&e, code, fmt, ap);
  va_end(ap);
  sk_conn_send_error(c, id, &e);
}

/* glibc keeps the memory freed by a burst of clients (their frames,
 * replies, jobs, sessions) in its arenas, one per thread that allocated,
 * and gives back only the top of each heap. Once clients have stopped
 * leaving for a moment, return all of it, so the daemon's footprint
 * follows its load down as well as up. */
static void sk__on_trim(uv_timer_t *t) {
  (void)t;
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

static void sk__on_closed(uv_handle_t *h) { sk_conn_unref(h->data); }

void sk_conn_close(struct sk_conn *c) {
  if (c->closing) return;
  struct sk_conns *set = c->set;
  c->closing = true;
  if (set->hooks.close) set->hooks.close(set->user, c);
  if (c->admitted) sk_admit_conn_remove(&set->admit, c->uid, c->input_bytes);
  c->admitted = false;
  c->input_bytes = 0;
  if (c->prev) c->prev->next = c->next; else set->head = c->next;
  if (c->next) c->next->prev = c->prev;
  set->count--;
  sk_log(SK_LOG_DEBUG, "client %llu disconnected", (unsigned long long)c->id);
  if (set->timers && !set->stopping)
    uv_timer_start(&set->trim_timer, sk__on_trim, SK_LIMIT_TRIM_DELAY_MS, 0);
  uv_close((uv_handle_t *)&c->pipe, sk__on_closed);
  if (!set->stopping && set->hooks.count) set->hooks.count(set->user, set->count);
}

/* Bytes of an unfinished frame the reader holds. */
static uint64_t sk__partial_bytes(const struct sk_conn *c) { return c->rd.len - c->rd.pos; }

static void sk__on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  struct sk_conn *c = stream->data;
  struct sk_conns *set = c->set;
  if (nread < 0) {
    sk_conn_close(c);
    return;
  }
  if (nread == 0) return;
  if (!c->frame_since_ms) c->frame_since_ms = sk_clock_ms();
  /* Bytes buffered for unfinished frames are bounded per uid and in all:
   * count the most this read can leave before taking it. */
  struct sk_error e;
  uint64_t most = sk__partial_bytes(c) + (uint64_t)nread;
  if (sk_admit_input(&set->admit, &set->lim.admit, c->uid, c->input_bytes, most, &e) < 0) {
    sk_log(SK_LOG_WARNING, "client %llu of uid %u closed: %s", (unsigned long long)c->id,
           c->uid, e.message);
    sk_conn_send_error(c, 0, &e);
    sk_conn_close(c);
    return;
  }
  c->input_bytes = most;
  if (sk_frame_reader_feed(&c->rd, buf->base, (size_t)nread) < 0) {
    sk_conn_send_errorf(c, 0, SK_ERR_NO_MEMORY, "out of memory reading the request");
    sk_conn_close(c);
    return;
  }
  for (;;) {
    if (c->closing) return;
    const uint8_t *body = NULL;
    size_t len = 0;
    int rc = sk_frame_reader_next(&c->rd, &body, &len);
    if (rc == 0) break;
    if (rc == -SK_ERR_TOO_LARGE) {
      sk_conn_send_errorf(c, 0, SK_ERR_TOO_LARGE,
                          "frame of %zu bytes exceeds the limit of %u bytes (the daemon's "
                          "max_frame, up to %u)",
                          len, c->rd.max_frame, (unsigned)SK_FRAME_MAX_CEILING);
      continue;
    }
    if (rc < 0) {
      sk_conn_send_errorf(c, 0, -rc, "frame reader: %s", sk_strerror(-rc));
      sk_conn_close(c);
      return;
    }
    /* A complete frame: the deadline starts again with the next bytes. */
    c->frame_since_ms = 0;
    if (set->hooks.frame) set->hooks.frame(set->user, c, body, len);
  }
  if (sk__partial_bytes(c) > 0 || c->rd.skip > 0) {
    if (!c->frame_since_ms) c->frame_since_ms = sk_clock_ms();
  }
  /* Only the bytes of an unfinished frame are counted: the buffer a
   * large frame needed must not stay with an idle connection. (Out of
   * memory keeps it; the next read tries again.) */
  (void)sk_frame_reader_trim(&c->rd);
  uint64_t left = sk__partial_bytes(c);
  if (!c->closing &&
      sk_admit_input(&set->admit, &set->lim.admit, c->uid, c->input_bytes, left, &e) == 0)
    c->input_bytes = left;
}

/* Closes every connection that has waited longer than frame_timeout_s
 * for a complete frame: one that never sent a whole request, or sits on
 * half of one. Such connections hold a slot and memory while doing
 * nothing; a working client sends its requests whole in far less. */
static void sk__on_frame_timer(uv_timer_t *t) {
  struct sk_conns *set = t->data;
  uint32_t timeout = set->lim.frame_timeout_s;
  if (!timeout) return;
  uint64_t now = sk_clock_ms();
  struct sk_conn *next;
  for (struct sk_conn *c = set->head; c; c = next) {
    next = c->next;
    if (c->closing || !c->frame_since_ms || now - c->frame_since_ms < (uint64_t)timeout * 1000u)
      continue;
    sk_log(SK_LOG_NOTICE, "client %llu of uid %u closed: no complete request within %u s "
           "(frame_timeout)", (unsigned long long)c->id, c->uid, timeout);
    sk_conn_send_errorf(c, 0, SK_ERR_BAD_REQUEST, "no complete request within %u s (frame_timeout)",
                        timeout);
    sk_conn_close(c);
  }
}

/* Checks the deadline a quarter of frame_timeout_s apart (within the
 * SK_LIMIT_FRAME_TICK bounds): a connection is closed at most that late. */
static void sk__frame_timer_set(struct sk_conns *set) {
  if (!set->timers) return;
  uv_timer_stop(&set->frame_timer);
  if (!set->lim.frame_timeout_s) return;
  uint64_t tick = (uint64_t)set->lim.frame_timeout_s * 1000u / 4u;
  if (tick < SK_LIMIT_FRAME_TICK_MIN_MS) tick = SK_LIMIT_FRAME_TICK_MIN_MS;
  if (tick > SK_LIMIT_FRAME_TICK_MAX_MS) tick = SK_LIMIT_FRAME_TICK_MAX_MS;
  uv_timer_start(&set->frame_timer, sk__on_frame_timer, tick, tick);
}

void sk_conns_init(struct sk_conns *set, uv_loop_t *loop, const struct sk_conn_limits *lim,
                   const struct sk_conn_hooks *hooks, void *user, size_t data_size) {
  set->loop = loop;
  set->lim = *lim;
  set->hooks = *hooks;
  set->user = user;
  set->data_size = data_size;
  set->head = NULL;
  set->count = 0;
  set->next_id = 0;
  set->stopping = false;
  sk_admit_init(&set->admit);
  uv_timer_init(loop, &set->trim_timer);
  uv_timer_init(loop, &set->frame_timer);
  set->frame_timer.data = set;
  set->timers = true;
  sk__frame_timer_set(set);
}

void sk_conns_set_limits(struct sk_conns *set, const struct sk_conn_limits *lim) {
  bool timeout_changed = lim->frame_timeout_s != set->lim.frame_timeout_s;
  set->lim = *lim;
  if (timeout_changed) sk__frame_timer_set(set);
}

void sk_conns_stop(struct sk_conns *set) {
  set->stopping = true;
  if (set->timers) {
    uv_close((uv_handle_t *)&set->trim_timer, NULL);
    uv_close((uv_handle_t *)&set->frame_timer, NULL);
    set->timers = false;
  }
  while (set->head) sk_conn_close(set->head);
}

void sk_conns_free(struct sk_conns *set) { sk_admit_free(&set->admit); }

struct sk_conn *sk_conn_new(struct sk_conns *set) {
  struct sk_conn *c = calloc(1, sizeof *c + set->data_size);
  if (!c) return NULL;
  c->set = set;
  c->refs = 1;
  uv_pipe_init(set->loop, &c->pipe, 0);
  c->pipe.data = c;
  return c;
}

void sk_conn_discard(struct sk_conn *c) { uv_close((uv_handle_t *)&c->pipe, sk__on_closed); }

void sk_conn_begin(struct sk_conn *c, uint32_t uid) {
  struct sk_conns *set = c->set;
  c->uid = uid;
  c->id = ++set->next_id;
  sk_frame_reader_init(&c->rd, set->lim.max_frame);
  c->next = set->head;
  if (set->head) set->head->prev = c;
  set->head = c;
  set->count++;
  c->frame_since_ms = sk_clock_ms();
  if (set->stopping) {
    sk_conn_send_errorf(c, 0, SK_ERR_BUSY, "the daemon is shutting down");
    sk_conn_close(c);
    return;
  }
  struct sk_error e;
  if (sk_admit_conn_add(&set->admit, &set->lim.admit, c->uid, &e) < 0) {
    sk_log(SK_LOG_WARNING, "refused a connection of uid %u: %s", c->uid, e.message);
    sk_conn_send_error(c, 0, &e);
    sk_conn_close(c);
    return;
  }
  c->admitted = true;
  sk_log(SK_LOG_DEBUG, "client %llu connected (uid %u)", (unsigned long long)c->id, c->uid);
  uv_read_start((uv_stream_t *)&c->pipe, sk__alloc, sk__on_read);
  if (set->hooks.count) set->hooks.count(set->user, set->count);
}
