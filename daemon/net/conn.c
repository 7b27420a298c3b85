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
  struct sk_conn *conn = h->data;
  buf->base = conn->set->readbuf;
  buf->len = sizeof conn->set->readbuf;
}

void sk_conn_ref(struct sk_conn *conn) { conn->refs++; }

void sk_conn_unref(struct sk_conn *conn) {
  if (--conn->refs == 0) {
    struct sk_conns *set = conn->set;
    if (set->hooks.release) set->hooks.release(set->user, conn);
    sk_frame_reader_free(&conn->rd);
    free(conn);
  }
}

static void sk__pause(struct sk_conn *conn, bool paused) {
  struct sk_conns *set = conn->set;
  if (set->hooks.pause) set->hooks.pause(set->user, conn, paused);
}

static void sk__on_write(uv_write_t *req, int status) {
  struct sk__write *w = (struct sk__write *)req;
  struct sk_conn *conn = w->conn;
  struct sk_conns *set = conn->set;
  conn->out_bytes -= w->len;
  free(w->data);
  free(w);
  if (status < 0 && status != UV_ECANCELED)
    sk_log(SK_LOG_DEBUG, "client %llu: write failed: %s", (unsigned long long)conn->id,
           uv_strerror(status));
  if (conn->out_paused && !conn->closing && conn->out_bytes < SK_LIMIT_CONN_OUT / 2) {
    conn->out_paused = false;
    uv_read_start((uv_stream_t *)&conn->pipe, sk__alloc, sk__on_read);
    sk__pause(conn, false);
  }
  if (!conn->closing && set->hooks.drain) set->hooks.drain(set->user, conn);
  sk_conn_unref(conn);
}

void sk_conn_send(struct sk_conn *conn, char *data, size_t len) {
  if (conn->closing) {
    free(data);
    return;
  }
  struct sk__write *w = malloc(sizeof *w);
  if (!w) {
    free(data);
    return;
  }
  w->conn = conn;
  w->data = data;
  w->len = len;
  uv_buf_t b = uv_buf_init(data, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&conn->pipe, &b, 1, sk__on_write);
  if (rc < 0) {
    free(data);
    free(w);
    return;
  }
  conn->refs++;
  conn->out_bytes += len;
  if (!conn->out_paused && conn->out_bytes > SK_LIMIT_CONN_OUT) {
    /* Slow reader: stop taking its requests and pause its generation. */
    conn->out_paused = true;
    uv_read_stop((uv_stream_t *)&conn->pipe);
    sk__pause(conn, true);
  }
}

void sk_conn_send_msg(struct sk_conn *conn, struct sk_msgbuf *b) {
  if (sk_msgbuf_finish(b) < 0) {
    sk_msgbuf_free(b);
    return;
  }
  size_t len = 0;
  char *data = sk_msgbuf_release(b, &len);
  if (data) sk_conn_send(conn, data, len);
}

void sk_conn_send_error(struct sk_conn *conn, uint64_t id, const struct sk_error *e) {
  struct sk_msgbuf b;
  if (sk_msgbuf_init(&b) < 0) return;
  if (sk_wire_pack_error(&b, id, e) < 0) {
    sk_msgbuf_free(&b);
    return;
  }
  sk_log(SK_LOG_DEBUG, "client %llu: request %llu: %s: %s", (unsigned long long)conn->id,
         (unsigned long long)id, sk_error_name(e->code), e->message);
  sk_conn_send_msg(conn, &b);
}

void sk_conn_send_errorf(struct sk_conn *conn, uint64_t id, int code, const char *fmt, ...) {
  struct sk_error e;
  va_list ap;
  va_start(ap, fmt);
  sk_error_setv(&e, code, fmt, ap);
  va_end(ap);
  sk_conn_send_error(conn, id, &e);
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

void sk_conn_close(struct sk_conn *conn) {
  if (conn->closing) return;
  struct sk_conns *set = conn->set;
  conn->closing = true;
  if (set->hooks.close) set->hooks.close(set->user, conn);
  if (conn->admitted) sk_admit_conn_remove(&set->admit, conn->uid, conn->input_bytes, conn->held);
  conn->admitted = false;
  conn->input_bytes = 0;
  if (conn->prev) conn->prev->next = conn->next; else set->head = conn->next;
  if (conn->next) conn->next->prev = conn->prev;
  set->count--;
  sk_log(SK_LOG_DEBUG, "client %llu disconnected", (unsigned long long)conn->id);
  if (set->timers && !set->stopping)
    uv_timer_start(&set->trim_timer, sk__on_trim, SK_LIMIT_TRIM_DELAY_MS, 0);
  uv_close((uv_handle_t *)&conn->pipe, sk__on_closed);
  if (!set->stopping && set->hooks.count) set->hooks.count(set->user, set->count);
}

/* Bytes of an unfinished frame the reader holds. */
static uint64_t sk__partial_bytes(const struct sk_conn *conn) {
  return conn->rd.len - conn->rd.pos;
}

static void sk__on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  struct sk_conn *conn = stream->data;
  struct sk_conns *set = conn->set;
  if (nread < 0) {
    sk_conn_close(conn);
    return;
  }
  if (nread == 0) return;
  if (!conn->frame_since_ms) conn->frame_since_ms = sk_clock_ms();
  /* Bytes buffered for unfinished frames are bounded per uid and in all:
   * count the most this read can leave before taking it. */
  struct sk_error e;
  uint64_t most = sk__partial_bytes(conn) + (uint64_t)nread;
  if (sk_admit_input(&set->admit, &set->lim.admit, conn->uid, conn->input_bytes, most, &e) < 0) {
    sk_log(SK_LOG_WARNING, "client %llu of uid %u closed: %s", (unsigned long long)conn->id,
           conn->uid, e.message);
    sk_conn_send_error(conn, 0, &e);
    sk_conn_close(conn);
    return;
  }
  conn->input_bytes = most;
  if (sk_frame_reader_feed(&conn->rd, buf->base, (size_t)nread) < 0) {
    sk_conn_send_errorf(conn, 0, SK_ERR_NO_MEMORY, "out of memory reading the request");
    sk_conn_close(conn);
    return;
  }
  for (;;) {
    if (conn->closing) return;
    const uint8_t *body = NULL;
    size_t len = 0;
    int rc = sk_frame_reader_next(&conn->rd, &body, &len);
    if (rc == 0) break;
    if (rc == -SK_ERR_TOO_LARGE) {
      sk_conn_send_errorf(conn, 0, SK_ERR_TOO_LARGE,
                          "frame of %zu bytes exceeds the limit of %u bytes (the daemon's "
                          "max_frame, up to %u)",
                          len, conn->rd.max_frame, (unsigned)SK_FRAME_MAX_CEILING);
      continue;
    }
    if (rc < 0) {
      sk_conn_send_errorf(conn, 0, -rc, "frame reader: %s", sk_strerror(-rc));
      sk_conn_close(conn);
      return;
    }
    /* A complete frame: the deadline starts again with the next bytes. */
    conn->frame_since_ms = 0;
    if (set->hooks.frame) set->hooks.frame(set->user, conn, body, len);
  }
  if (sk__partial_bytes(conn) > 0 || conn->rd.skip > 0) {
    if (!conn->frame_since_ms) conn->frame_since_ms = sk_clock_ms();
  }
  /* Only the bytes of an unfinished frame are counted: the buffer a
   * large frame needed must not stay with an idle connection. (Out of
   * memory keeps it; the next read tries again.) */
  (void)sk_frame_reader_trim(&conn->rd);
  uint64_t left = sk__partial_bytes(conn);
  if (!conn->closing &&
      sk_admit_input(&set->admit, &set->lim.admit, conn->uid, conn->input_bytes, left, &e) == 0)
    conn->input_bytes = left;
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
  for (struct sk_conn *conn = set->head; conn; conn = next) {
    next = conn->next;
    if (conn->closing || !conn->frame_since_ms ||
        now - conn->frame_since_ms < (uint64_t)timeout * 1000u)
      continue;
    sk_log(SK_LOG_NOTICE, "client %llu of uid %u closed: no complete request within %u s "
           "(frame_timeout)", (unsigned long long)conn->id, conn->uid, timeout);
    sk_conn_send_errorf(conn, 0, SK_ERR_BAD_REQUEST,
                        "no complete request within %u s (frame_timeout)", timeout);
    sk_conn_close(conn);
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
  struct sk_conn *conn = calloc(1, sizeof *conn + set->data_size);
  if (!conn) return NULL;
  conn->set = set;
  conn->refs = 1;
  uv_pipe_init(set->loop, &conn->pipe, 0);
  conn->pipe.data = conn;
  return conn;
}

void sk_conn_discard(struct sk_conn *conn) { uv_close((uv_handle_t *)&conn->pipe, sk__on_closed); }

/* A refused connection of uid: logged, once per uid a minute. */
static void sk__log_refusal(struct sk_conns *set, uint32_t uid, const struct sk_error *e) {
  uint32_t unreported = 0;
  if (!sk_admit_refusal_log(&set->admit, uid, sk_clock_ms(), &unreported)) return;
  if (unreported)
    sk_log(SK_LOG_WARNING, "refused a connection of uid %u: %s (and %u more since the last "
           "report)", uid, e->message, unreported);
  else
    sk_log(SK_LOG_WARNING, "refused a connection of uid %u: %s", uid, e->message);
}

int sk_conns_admit(struct sk_conns *set, uint32_t uid, struct sk_error *err) {
  if (set->stopping) return sk_error_set(err, SK_ERR_BUSY, "the daemon is shutting down");
  int rc = sk_admit_conn_add(&set->admit, &set->lim.admit, uid, err);
  if (rc < 0) sk__log_refusal(set, uid, err);
  return rc;
}

void sk_conns_unadmit(struct sk_conns *set, uint32_t uid) {
  sk_admit_conn_remove(&set->admit, uid, 0, false);
}

void sk_conn_begin(struct sk_conn *conn, uint32_t uid, bool held) {
  struct sk_conns *set = conn->set;
  conn->uid = uid;
  conn->id = ++set->next_id;
  sk_frame_reader_init(&conn->rd, set->lim.max_frame);
  conn->next = set->head;
  if (set->head) set->head->prev = conn;
  set->head = conn;
  set->count++;
  conn->frame_since_ms = sk_clock_ms();
  if (set->stopping) {
    sk_conn_send_errorf(conn, 0, SK_ERR_BUSY, "the daemon is shutting down");
    sk_conn_close(conn);
    return;
  }
  struct sk_error e;
  if (held ? sk_admit_hold(&set->admit, conn->uid, &e) < 0
           : sk_admit_conn_add(&set->admit, &set->lim.admit, conn->uid, &e) < 0) {
    sk__log_refusal(set, conn->uid, &e);
    sk_conn_send_error(conn, 0, &e);
    sk_conn_close(conn);
    return;
  }
  conn->admitted = true;
  conn->held = held;
  sk_log(SK_LOG_DEBUG, "client %llu connected (uid %u)", (unsigned long long)conn->id, conn->uid);
  uv_read_start((uv_stream_t *)&conn->pipe, sk__alloc, sk__on_read);
  if (set->hooks.count) set->hooks.count(set->user, set->count);
}
