/* The server's work on libuv's thread pool (see copy.h). */
#include "server/copy.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "proto/wire.h"
#include "server/jobs.h"
#include "server/replies.h"
#include "server/state.h"
#include "sk_limits.h"

/* An export being streamed to a client: the image is a snapshot, sent in
 * data events as the connection's output drains. */
struct sk__export {
  uint64_t req_id;
  uint64_t session;
  char *buf;          /* (len) owned */
  size_t len, off;
  uint32_t resident;
  uint64_t seen;
  struct sk__export *next;
};

static struct sk_copy_peer *peer(struct sk_conn *conn) { return sk_conn_data(conn); }

void sk_copy_peer_free(struct sk_copy_peer *p) {
  while (p->exports) {
    struct sk__export *x = p->exports;
    p->exports = x->next;
    free(x->buf);
    free(x);
  }
}

void sk_copy_import_drop(struct sk_server *srv, struct sk_conn *conn) {
  struct sk_copy_peer *p = peer(conn);
  sk_session_pending_release(&srv->sessions, sk_conn_uid(conn), p->import_cap);
  free(p->import_buf);
  p->import_buf = NULL;
  p->import_len = p->import_cap = 0;
  p->import_total = 0;
}

/* The object of a closed session is unmapped on libuv's thread pool: its
 * file is already deleted, and returning its pages takes time in
 * proportion to its size, which would hold the event loop. */
struct release_work {
  uv_work_t req;
  struct sk_store_obj *obj;
};

static void release_work_run(uv_work_t *req) {
  struct release_work *w = req->data;
  sk_store_obj_free(w->obj);
  w->obj = NULL;
}

static void release_work_done(uv_work_t *req, int status) {
  (void)status;
  struct release_work *w = req->data;
  sk_store_obj_free(w->obj); /* not run (cancelled): here */
  free(w);
}

void sk_copy_release_obj(void *user, struct sk_store_obj *obj) {
  struct sk_server *srv = user;
  struct release_work *w = malloc(sizeof *w);
  if (w) {
    w->obj = obj;
    w->req.data = w;
    if (uv_queue_work(srv->loop, &w->req, release_work_run, release_work_done) == 0) return;
    free(w);
  }
  sk_store_obj_free(obj);
}

/* An open whose object is made on libuv's thread pool: posix_fallocate
 * of a cache-sized file on tmpfs zeroes all its pages, and a
 * burst of opens on the event loop would hold every other client's
 * request (a ping) behind it. The reservation holds the limits meanwhile;
 * the session exists once open_work_done commits it. */
struct open_work {
  uv_work_t req;
  struct sk_server *srv;
  struct sk_conn *conn;     /* referenced until done */
  uint64_t id;              /* request id */
  struct sk_session_reservation res;
  int32_t *pin;             /* owned */
  size_t n_pin;
  bool temporary;           /* closed when conn ends */
  struct sk_conv conv;      /* the session's conversation (template, system) */
  int rc;
  struct sk_error err;
};

/* fork, export and import copy up to a whole cache (tens of MB, long enough
 * to delay every client's request on the event loop): the copy runs in
 * libuv's thread pool. fork and export hold their source session
 * meanwhile (its `running` is the job: later requests queue behind it,
 * the compute thread never sees it, close and the idle TTL wait); fork
 * and import hold their new session's id and limits (a reservation);
 * import owns the bytes it received. */
enum copy_kind { COPY_FORK, COPY_EXPORT, COPY_IMPORT };

struct copy_work {
  uv_work_t req;
  struct sk_server *srv;
  enum copy_kind kind;
  struct sk_session *src;   /* fork, export: held */
  struct sk_job *job;       /* fork, export: src's running job (conn, req_id) */
  struct sk_conn *conn;     /* import: referenced until done */
  uint64_t req_id;          /* import */
  struct sk_session_reservation res; /* fork, import: the new session (its
                               owner, id, bytes: an import's 0; the object
                               made in the worker) */
  uint32_t max_capacity;    /* import */
  char *buf;                /* export: the image (len bytes, made in the
                               worker); import: the bytes received */
  size_t len, cap;          /* import: cap counts in the table's pending bytes
                               of res.owner_uid */
  int rc;
  struct sk_error err;
};

/* The session of a finished open: logged, and answered, or its pinned
 * prefix goes through the model first (the reply is sent once it is in
 * the cache, jobs.c). Takes pin and the conversation. */
static void open_finish(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                        struct sk_session *s, int32_t *pin, size_t n_pin, struct sk_conv *conv) {
  sk_session_touch(s);
  /* The conversation (template, pinned system prompt) is the session's. */
  sk_session_set_conv(s, conv);
  struct sk_session_desc d;
  sk_session_describe(s, &d);
  struct sk_error ce;
  if (sk_session_conv_save(s, sk_store_dirfd(srv->cfg.store), d.id, &ce) < 0)
    sk_log(SK_LOG_WARNING, "session %llu: conversation not saved: %s", (unsigned long long)d.id,
           ce.message);
  sk_jobs_counts_changed(srv);
  sk_log(SK_LOG_INFO, "session %llu opened by uid %u: %s, capacity %u, %u pinned, %zu bytes (%s)",
         (unsigned long long)d.id, d.owner_uid, sk_policy_name(d.params.policy), d.capacity,
         d.params.n_pin, d.object_bytes, sk_kv_type_name(d.kv_type));
  if (n_pin) {
    struct sk_job *job = sk_jobs_new(SK_JOB_APPEND, conn, req_id, s);
    if (!job) { /* answered */
      free(pin);
      sk_session_remove(&srv->sessions, s);
      sk_jobs_counts_changed(srv);
      return;
    }
    job->is_pin = true;
    job->bos = 0;
    job->tokens = pin;
    job->n_tokens = n_pin;
    sk_jobs_dispatch(srv, s, job);
    return;
  }
  free(pin);
  sk_replies_open(conn, req_id, s);
}

static void open_work_run(uv_work_t *req) {
  struct open_work *w = req->data;
  w->rc = sk_session_reservation_create(w->srv->cfg.store, &w->res, &w->err);
}

static void open_work_done(uv_work_t *req, int status) {
  struct open_work *w = req->data;
  struct sk_server *srv = w->srv;
  struct sk_conn *conn = w->conn;
  if (status < 0 && w->rc == 0)
    w->rc = sk_error_set(&w->err, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(status));
  if (w->rc < 0 || sk_conn_closing(conn) || srv->shutting_down) {
    /* A client that left never learns the id: nothing to keep. */
    sk_session_cancel(&srv->sessions, &w->res);
    if (w->rc < 0 && !sk_conn_closing(conn)) sk_conn_send_error(conn, w->id, &w->err);
    free(w->pin);
    sk_conv_free(&w->conv);
  } else {
    struct sk_session *s = NULL;
    struct sk_error e;
    if (sk_session_commit(&srv->sessions, &w->res, &s, &e) < 0) {
      free(w->pin);
      sk_conv_free(&w->conv);
      sk_conn_send_error(conn, w->id, &e);
    } else {
      if (w->temporary) sk_session_set_temporary(s, sk_conn_id(conn));
      open_finish(srv, conn, w->id, s, w->pin, w->n_pin, &w->conv);
    }
  }
  free(w);
  sk_conn_unref(conn);
}

/* Sends the next data events of the connection's exports while its output
 * has room; the final reply of each follows its last event. */
void sk_copy_export_pump(struct sk_conn *conn) {
  while (peer(conn)->exports && sk_conn_has_room(conn)) {
    struct sk__export *x = peer(conn)->exports;
    struct sk_msgbuf b;
    if (x->off < x->len) {
      size_t n = x->len - x->off < SK_LIMIT_EXPORT_CHUNK ? x->len - x->off : SK_LIMIT_EXPORT_CHUNK;
      if (sk_wire_pack_data_event(&b, x->req_id, x->off, x->buf + x->off, n) < 0) return;
      x->off += n;
      sk_conn_send_msg(conn, &b);
      continue;
    }
    if (sk_wire_pack_export(&b, x->req_id, x->session, x->len, x->resident, x->seen) == 0)
      sk_conn_send_msg(conn, &b);
    peer(conn)->exports = x->next;
    free(x->buf);
    free(x);
  }
}

/* The copy of a fork, export or import, in a worker thread: reads only
 * the held source session's object or the import's bytes, and makes a new
 * object under the held id (store.c: file creation is per id). */
static void copy_work_run(uv_work_t *req) {
  struct copy_work *w = req->data;
  struct sk_store *st = w->srv->cfg.store;
  switch (w->kind) {
  case COPY_FORK:
    w->rc = sk_store_fork(st, sk_session_object(w->src), w->res.id, w->res.owner_uid,
                          &w->res.obj, &w->err);
    break;
  case COPY_EXPORT:
    w->buf = malloc(w->len);
    if (!w->buf)
      w->rc = sk_error_set(&w->err, SK_ERR_NO_MEMORY, "out of memory for a %zu-byte export",
                           w->len);
    else
      sk_store_export(sk_session_object(w->src), w->buf, w->len);
    break;
  case COPY_IMPORT: {
    struct sk_store_image_info info;
    w->rc = sk_store_image_check(st, w->buf, w->len, &info, &w->err);
    if (w->rc == 0 && info.capacity > w->max_capacity)
      w->rc = sk_error_set(&w->err, SK_ERR_BAD_REQUEST,
                           "the exported session's capacity %u exceeds the maximum capacity %u",
                           info.capacity, w->max_capacity);
    if (w->rc == 0)
      w->rc = sk_store_import(st, w->buf, w->len, w->res.id, w->res.owner_uid, &w->res.obj,
                              &w->err);
    break;
  }
  }
}

/* The new session of a fork or import (w->res.obj) into the table, with the
 * reply; or the error. */
static void copy_finish_new(struct sk_server *srv, struct copy_work *w, struct sk_conn *conn,
                            uint64_t req_id) {
  struct sk_error e;
  struct sk_session *ns = NULL;
  if (w->rc < 0 || !conn) { /* a client that left never learns the id */
    sk_session_cancel(&srv->sessions, &w->res);
    if (w->rc < 0 && conn) sk_conn_send_error(conn, req_id, &w->err);
    return;
  }
  if (sk_session_commit(&srv->sessions, &w->res, &ns, &e) < 0) {
    sk_conn_send_error(conn, req_id, &e);
    return;
  }
  /* An import's size is known once it is in: over the user's limits, it
   * goes (a fork's was checked before the copy). */
  struct sk_session_desc d;
  sk_session_describe(ns, &d);
  if (w->kind == COPY_IMPORT && sk_session_check_user(&srv->sessions, sk_conn_uid(conn),
                                                     d.object_bytes, ns, false, &e) < 0) {
    sk_session_remove(&srv->sessions, ns);
    sk_conn_send_error(conn, req_id, &e);
    return;
  }
  sk_session_touch(ns);
  sk_jobs_counts_changed(srv);
  struct sk_session_counters cnt;
  sk_session_counters_get(&srv->sessions, ns, &cnt);
  if (w->kind == COPY_FORK) {
    /* the conversation goes with the cache */
    struct sk_error ce;
    const int dir = sk_store_dirfd(srv->cfg.store);
    const uint64_t from = sk_session_id(w->src);
    int rc = sk_session_conv_save(w->src, dir, d.id, &ce);
    if (rc < 0 || (rc == 1 && sk_session_conv_load(ns, dir, &ce) < 0))
      sk_log(SK_LOG_WARNING, "session %llu: conversation not copied: %s",
             (unsigned long long)d.id, ce.message);
    sk_log(SK_LOG_INFO, "session %llu forked from session %llu by uid %u: %u resident tokens "
           "copied, %zu bytes",
           (unsigned long long)d.id, (unsigned long long)from, sk_conn_uid(conn), cnt.resident,
           d.object_bytes);
    sk_replies_summary(srv, conn, req_id, ns, from, 0);
  } else {
    sk_session_set_template(ns, srv->cfg.chat_template);
    sk_log(SK_LOG_INFO, "session %llu imported by uid %u: %zu bytes, %u resident tokens",
           (unsigned long long)d.id, sk_conn_uid(conn), w->len, cnt.resident);
    sk_replies_summary(srv, conn, req_id, ns, 0, w->len);
  }
}

static void copy_work_done(uv_work_t *req, int status) {
  struct copy_work *w = req->data;
  struct sk_server *srv = w->srv;
  if (status < 0 && w->rc == 0) {
    w->rc = sk_error_set(&w->err, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(status));
  }
  /* The client, unless it left (or the daemon is stopping: nothing new). */
  struct sk_conn *conn = w->kind == COPY_IMPORT ? w->conn : w->job->conn;
  if (conn && (sk_conn_closing(conn) || srv->shutting_down)) conn = NULL;
  uint64_t req_id = w->kind == COPY_IMPORT ? w->req_id : w->job->req_id;
  if (w->kind == COPY_IMPORT) {
    /* The bytes received become the new object (counted as a session
     * from here on): no longer the uid's pending memory. */
    sk_session_pending_release(&srv->sessions, w->res.owner_uid, w->cap);
    w->cap = 0;
  }
  if (w->kind == COPY_EXPORT) {
    struct sk__export *x = NULL;
    if (w->rc < 0) {
      if (conn) sk_conn_send_error(conn, req_id, &w->err);
    } else if (conn && (x = calloc(1, sizeof *x)) != NULL) {
      /* streamed as the output drains */
      x->req_id = req_id;
      struct sk_session_counters cnt;
      sk_session_counters_get(&srv->sessions, w->src, &cnt);
      x->session = sk_session_id(w->src);
      x->buf = w->buf;
      x->len = w->len;
      x->resident = cnt.resident;
      x->seen = cnt.seen;
      w->buf = NULL;
      struct sk__export **tail = &peer(conn)->exports;
      while (*tail) tail = &(*tail)->next;
      *tail = x;
      sk_log(SK_LOG_DEBUG, "session %llu exported: %zu bytes", (unsigned long long)x->session,
             x->len);
      sk_copy_export_pump(conn);
    } else if (conn) {
      sk_conn_send_errorf(conn, req_id, SK_ERR_NO_MEMORY, "out of memory");
    }
    free(w->buf);
  } else {
    copy_finish_new(srv, w, conn, req_id);
  }
  if (w->kind == COPY_IMPORT) {
    free(w->buf);
    sk_conn_unref(w->conn);
  } else { /* the source session goes on with its queue (or closes) */
    sk_session_job_done(w->src); /* frees w->job */
    sk_jobs_step(srv, w->src);
  }
  free(w);
}

/* Queues w's copy. Errors: -SK_ERR_INTERNAL (thread pool). */
static int copy_queue(struct sk_server *srv, struct copy_work *w, struct sk_error *e) {
  w->srv = srv;
  w->req.data = w;
  int rc = uv_queue_work(srv->loop, &w->req, copy_work_run, copy_work_done);
  if (rc < 0) return sk_error_set(e, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(rc));
  return 0;
}

/* Starts job (fork or export of the idle session s) in a worker, holding
 * s; true if started. Else the error is answered and the caller frees
 * job. */
bool sk_copy_start(struct sk_server *srv, struct sk_session *s, struct sk_job *job) {
  struct sk_conn *conn = job->conn;
  struct sk_error e;
  struct copy_work *w = calloc(1, sizeof *w);
  if (!w) {
    sk_conn_send_errorf(conn, job->req_id, SK_ERR_NO_MEMORY, "out of memory");
    return false;
  }
  w->kind = job->kind == SK_JOB_FORK ? COPY_FORK : COPY_EXPORT;
  w->src = s;
  w->job = job;
  if (w->kind == COPY_FORK) {
    struct sk_session_desc d;
    sk_session_describe(s, &d);
    const uint32_t uid = sk_conn_uid(conn);
    const size_t bytes = d.object_bytes + sk_session_spec_bytes(&srv->sessions,
                                                                sk_session_object(s));
    if (sk_session_check_user(&srv->sessions, uid, bytes, NULL, false, &e) < 0 ||
        sk_session_reserve(&srv->sessions, bytes, uid, &w->res, &e) < 0) {
      free(w);
      sk_conn_send_error(conn, job->req_id, &e);
      return false;
    }
  } else {
    w->len = sk_store_export_size(sk_session_object(s));
  }
  if (copy_queue(srv, w, &e) < 0) {
    if (w->kind == COPY_FORK) sk_session_cancel(&srv->sessions, &w->res);
    free(w);
    sk_conn_send_error(conn, job->req_id, &e);
    return false;
  }
  sk_session_run(s, job);
  return true;
}

int sk_copy_open(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                 const struct sk_kv_params *p, uint64_t seed, bool temporary, int32_t *pin,
                 size_t n_pin, struct sk_conv *conv, struct sk_error *err) {
  struct open_work *w = calloc(1, sizeof *w);
  if (!w) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  int rc = sk_session_reserve_open(&srv->sessions, p, srv->cfg.max_capacity, sk_conn_uid(conn),
                                   temporary ? SK_STORE_TEMPORARY : 0, seed, &w->res, err);
  if (rc < 0) {
    free(w);
    return rc;
  }
  w->srv = srv;
  w->conn = conn;
  w->id = req_id;
  w->req.data = w;
  if ((rc = uv_queue_work(srv->loop, &w->req, open_work_run, open_work_done)) < 0) {
    sk_session_cancel(&srv->sessions, &w->res);
    free(w);
    return sk_error_set(err, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(rc));
  }
  w->pin = pin;
  w->n_pin = n_pin;
  w->temporary = temporary;
  w->conv = *conv;
  sk_conv_init(conv, SK_CHAT_NONE);
  sk_conn_ref(conn);
  return 0;
}

/* Drops the imports whose client sent no chunk for frame_timeout: a
 * client that stops half way would otherwise hold its bytes (its uid's
 * share) for as long as it keeps the connection. */
static void on_import_timer(uv_timer_t *t) {
  struct sk_server *srv = t->data;
  uint32_t timeout = srv->cfg.frame_timeout_s;
  uint64_t now = sk_clock_ms();
  bool any = false;
  for (struct sk_conn *conn = srv->conns.head; conn; conn = conn->next) {
    struct sk_copy_peer *p = peer(conn);
    if (!p->import_total || sk_conn_closing(conn)) continue;
    if (!timeout || now - p->import_last_ms < (uint64_t)timeout * 1000u) {
      any = true;
      continue;
    }
    sk_log(SK_LOG_NOTICE, "client %llu of uid %u: import dropped after %u s without a chunk "
           "(frame_timeout), %zu of %llu bytes in", (unsigned long long)sk_conn_id(conn),
           sk_conn_uid(conn), timeout, p->import_len, (unsigned long long)p->import_total);
    sk_conn_send_errorf(conn, p->import_req_id, SK_ERR_CANCELLED,
                        "import stalled: no chunk for %u s (frame_timeout); its %zu bytes are "
                        "dropped: send it again from offset 0", timeout, p->import_len);
    sk_copy_import_drop(srv, conn);
  }
  if (!any) {
    uv_timer_stop(t);
    srv->copies.timer_running = false;
  }
}

/* Starts the stalled-import timer if it is not running. */
static void import_timer_start(struct sk_server *srv) {
  if (srv->copies.timer_running || srv->shutting_down) return;
  if (!srv->copies.timer_open) {
    uv_timer_init(srv->loop, &srv->copies.import_timer);
    srv->copies.import_timer.data = srv;
    srv->copies.timer_open = true;
  }
  uint64_t tick = (uint64_t)srv->cfg.frame_timeout_s * 1000u / 4u;
  if (tick < SK_LIMIT_FRAME_TICK_MIN_MS) tick = SK_LIMIT_FRAME_TICK_MIN_MS;
  if (tick > SK_LIMIT_FRAME_TICK_MAX_MS) tick = SK_LIMIT_FRAME_TICK_MAX_MS;
  uv_timer_start(&srv->copies.import_timer, on_import_timer, tick, tick);
  srv->copies.timer_running = true;
}

void sk_copy_shutdown(struct sk_server *srv) {
  if (!srv->copies.timer_open) return;
  uv_close((uv_handle_t *)&srv->copies.import_timer, NULL);
  srv->copies.timer_open = srv->copies.timer_running = false;
}

/* import: the file comes in chunks {total, offset, data}; one import per
 * connection at a time, offset 0 starts it. The buffer grows with the
 * bytes received (a declared total never allocates by itself); its bytes
 * count in the uid's share of memory (max_user_memory) and in
 * max_memory, with the sessions, while it is in progress; a client that
 * stops sending chunks for frame_timeout loses it. */
void sk_copy_import(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id, uint64_t total,
                    uint64_t offset, const char *data, size_t len) {
  struct sk_error e;
  if (offset == 0) {
    if (peer(conn)->import_buf || peer(conn)->import_total) sk_copy_import_drop(srv, conn);
    if (total > sk_session_table_max_bytes(&srv->sessions)) {
      sk_error_set(&e, SK_ERR_BUSY,
                   "memory limit: a %llu-byte import exceeds max_memory %llu bytes",
                   (unsigned long long)total,
                   (unsigned long long)sk_session_table_max_bytes(&srv->sessions));
      goto bad;
    }
    peer(conn)->import_total = total;
  } else if (peer(conn)->import_total == 0) {
    sk_error_set(&e, SK_ERR_BAD_REQUEST,
                 "no import in progress on this connection: the first chunk has offset 0");
    goto bad_drop;
  } else if (offset != peer(conn)->import_len || total != peer(conn)->import_total) {
    sk_error_set(&e, SK_ERR_BAD_REQUEST,
                 "import chunk at offset %llu of %llu bytes, expected offset %zu of %llu",
                 (unsigned long long)offset, (unsigned long long)total, peer(conn)->import_len,
                 (unsigned long long)peer(conn)->import_total);
    goto bad_drop;
  }
  if (len > total - offset) {
    sk_error_set(&e, SK_ERR_BAD_REQUEST,
                 "import chunk of %zu bytes at offset %llu goes past the total %llu", len,
                 (unsigned long long)offset, (unsigned long long)total);
    goto bad_drop;
  }
  peer(conn)->import_req_id = req_id;
  peer(conn)->import_last_ms = sk_clock_ms();
  import_timer_start(srv);
  size_t need = peer(conn)->import_len + len;
  if (need > peer(conn)->import_cap) {
    size_t ncap = peer(conn)->import_cap * 2 > need ? peer(conn)->import_cap * 2 : need;
    if (ncap > total) ncap = (size_t)total;
    if (sk_session_pending_grow(&srv->sessions, sk_conn_uid(conn), ncap - peer(conn)->import_cap,
                                &e) < 0)
      goto bad_drop;
    char *nb = realloc(peer(conn)->import_buf, ncap ? ncap : 1);
    if (!nb) {
      sk_session_pending_release(&srv->sessions, sk_conn_uid(conn),
                                 ncap - peer(conn)->import_cap);
      sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory for a %zu-byte import", ncap);
      goto bad_drop;
    }
    peer(conn)->import_buf = nb;
    peer(conn)->import_cap = ncap;
  }
  if (len) memcpy(peer(conn)->import_buf + peer(conn)->import_len, data, len);
  peer(conn)->import_len += len;
  struct sk_msgbuf b;
  if (peer(conn)->import_len < peer(conn)->import_total) {
    if (sk_wire_pack_received(&b, req_id, peer(conn)->import_len) == 0) sk_conn_send_msg(conn, &b);
    return;
  }
  /* All in: checked and copied into a new session in a worker, which
   * takes the bytes over (still counted as the uid's pending bytes until
   * done). */
  struct copy_work *w = calloc(1, sizeof *w);
  if (!w) {
    sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
    goto bad_drop;
  }
  if (sk_session_reserve(&srv->sessions, 0, sk_conn_uid(conn), &w->res, &e) < 0) {
    free(w);
    goto bad_drop;
  }
  w->kind = COPY_IMPORT;
  w->conn = conn;
  w->req_id = req_id;
  w->max_capacity = srv->cfg.max_capacity;
  w->buf = peer(conn)->import_buf;
  w->len = peer(conn)->import_len;
  w->cap = peer(conn)->import_cap;
  if (copy_queue(srv, w, &e) < 0) {
    sk_session_cancel(&srv->sessions, &w->res);
    free(w);
    goto bad_drop;
  }
  sk_conn_ref(conn);
  peer(conn)->import_buf = NULL; /* w's now */
  peer(conn)->import_len = peer(conn)->import_cap = 0;
  peer(conn)->import_total = 0;
  return;
bad_drop:
  sk_copy_import_drop(srv, conn);
bad:
  sk_conn_send_error(conn, req_id, &e);
}
