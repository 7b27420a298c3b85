#include "server.h"

#include <errno.h>
#include <math.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "admit.h"
#include "chat.h"
#include "clock.h"
#include "compute.h"
#include "conn.h"
#include "conv.h"
#include "kernels.h"
#include "listen.h"
#include "sk_limits.h"
#include "log.h"
#include "msg.h"
#include "session.h"
#include "sk_config.h"
#include "sparse.h"
#include "wire.h"


/* An export being streamed to a client: the image is a snapshot, sent in
 * data events as the connection's output drains. */
struct export_stream {
  uint64_t req_id;
  uint64_t session;
  char *buf;          /* (len) owned */
  size_t len, off;
  uint32_t resident;
  uint64_t seen;
  struct export_stream *next;
};

/* What the server keeps with each connection (sk_conn_data). */
struct peer {
  struct export_stream *exports; /* FIFO, streamed one after the other */
  char *import_buf;   /* an import in progress: received bytes (owned) */
  size_t import_len, import_cap;
  uint64_t import_total; /* declared size of the file */
};

static struct peer *peer(struct sk_conn *c) { return sk_conn_data(c); }

struct sk_server {
  uv_loop_t *loop;
  struct sk_server_config cfg;
  const struct sk_model *model;
  const struct sk_tokenizer *tok;
  struct sk_listen listen;   /* the socket clients connect to */
  uint32_t start_max_sessions; /* sizes fixed at start */
  uint32_t start_max_capacity;
  struct sk_compute *compute;
  struct sk_session_table sessions;
  struct sk_conns conns;    /* the clients */
  uint64_t started_ms;
  bool shutting_down;
  struct open_work *opens;   /* opens whose object is being made */
  struct copy_work *copies;  /* forks, exports and imports being copied */
  uint32_t n_adopted;        /* sessions adopted at start */
  uint32_t n_set_aside;      /* objects set aside at start */
  uint32_t n_temp_closed;    /* temporary sessions found at start, closed */
  uint64_t import_bytes;     /* buffered by imports in progress */
  char chat_error[SK_ERROR_MESSAGE_MAX]; /* cfg.chat_error, copied */
  uv_timer_t ttl_timer;
  bool ttl_running;
};

/* Tells the owner that the number of sessions or clients changed. */
static void counts_changed(struct sk_server *srv) {
  if (srv->cfg.on_change) srv->cfg.on_change(srv->cfg.user, srv->sessions.count, srv->conns.count);
}

/* ---- connections and output ---- */

static void import_drop(struct sk_server *srv, struct sk_conn *c) {
  struct peer *p = peer(c);
  srv->import_bytes -= p->import_cap;
  free(p->import_buf);
  p->import_buf = NULL;
  p->import_len = p->import_cap = 0;
  p->import_total = 0;
}

static void export_pump(struct sk_conn *c);
static void session_close(struct sk_server *srv, struct sk_session *s);

/* conn.h hooks */

/* A slow reader's generation pauses with its reading. */
static void on_conn_pause(void *user, struct sk_conn *c, bool paused) {
  struct sk_server *srv = user;
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    struct sk_session *s = srv->sessions.items[i];
    if (s && s->running && s->running->conn == c) atomic_store(&s->running->paused, paused);
  }
  if (!paused && srv->compute) sk_compute_wake(srv->compute);
}

static void on_conn_drain(void *user, struct sk_conn *c) {
  (void)user;
  if (peer(c)->exports) export_pump(c);
}

static void on_conn_close(void *user, struct sk_conn *c) {
  struct sk_server *srv = user;
  /* Work of a client that left: generations stop, appends complete (the
   * session keeps what was sent). No job keeps a pointer to c. */
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    struct sk_session *s = srv->sessions.items[i];
    if (!s) continue;
    if (s->running && s->running->conn == c) {
      s->running->conn = NULL;
      if (s->running->kind == SK_JOB_GENERATE) atomic_store(&s->running->cancel, true);
      atomic_store(&s->running->paused, false);
    }
    for (struct sk_job *j = s->queue_head; j; j = j->next)
      if (j->conn == c) {
        j->conn = NULL;
        if (j->kind == SK_JOB_GENERATE) atomic_store(&j->cancel, true);
      }
    /* Sessions opened "temporary" on this connection end with it, at
     * shutdown too (a restart would adopt them with nobody to close them). */
    if (s->temp_conn == c->id && !s->closing) session_close(srv, s);
  }
  if (srv->compute) sk_compute_wake(srv->compute);
  if (peer(c)->import_buf) import_drop(srv, c);
}

static void on_conn_release(void *user, struct sk_conn *c) {
  (void)user;
  struct peer *p = peer(c);
  while (p->exports) {
    struct export_stream *x = p->exports;
    p->exports = x->next;
    free(x->buf);
    free(x);
  }
}

static void on_conn_count(void *user, uint32_t n_conns) {
  (void)n_conns;
  counts_changed(user);
}

static void handle_frame(void *user, struct sk_conn *c, const uint8_t *body, size_t len);

/* ---- session work ---- */

static void submit_next(struct sk_server *srv, struct sk_session *s);
static bool copy_start(struct sk_server *srv, struct sk_session *s, struct sk_job *job);
static void send_session_stats(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                               struct sk_session *s, bool tokens);

static bool job_is_inline(const struct sk_job *j) {
  return j->kind == SK_JOB_FORK || j->kind == SK_JOB_EXPORT || j->kind == SK_JOB_STATS;
}

static void session_dispatch(struct sk_server *srv, struct sk_session *s, struct sk_job *job) {
  if (job_is_inline(job)) {
    /* The session is idle: its committed state may be read here (stats),
     * or in a worker while the session is held (fork, export). */
    if (job->conn) {
      if (job->kind == SK_JOB_STATS)
        send_session_stats(srv, job->conn, job->req_id, s, true);
      else if (copy_start(srv, s, job))
        return; /* the job is the copy's until it is done */
    }
    sk_job_free(job);
    return;
  }
  if (srv->shutting_down) {
    /* The compute thread is gone: answer instead of running. */
    if (job->conn)
      sk_conn_send_errorf(job->conn, job->req_id, SK_ERR_CANCELLED, "the daemon is shutting down");
    sk_job_free(job);
    return;
  }
  if (job->conn && job->conn->out_paused) atomic_store(&job->paused, true);
  s->running = job;
  sk_compute_submit(srv->compute, job);
}

/* Takes the next queued job, skipping generations whose client left. */
static void submit_next(struct sk_server *srv, struct sk_session *s) {
  while (!s->running && s->queue_head) {
    struct sk_job *j = s->queue_head;
    s->queue_head = j->next;
    if (!s->queue_head) s->queue_tail = NULL;
    s->n_queued--;
    j->next = NULL;
    if (!j->conn && (j->kind == SK_JOB_GENERATE || job_is_inline(j))) {
      sk_job_free(j);
      continue;
    }
    session_dispatch(srv, s, j);
  }
  if (!s->running && s->closing) {
    sk_session_free(&srv->sessions, s);
    counts_changed(srv);
  }
}

static int session_enqueue(struct sk_server *srv, struct sk_session *s, struct sk_job *job,
                           struct sk_error *err) {
  if (!s->running) {
    session_dispatch(srv, s, job);
    return 0;
  }
  if (s->n_queued >= SK_LIMIT_SESSION_QUEUE)
    return sk_error_set(err, SK_ERR_BUSY,
                        "session %llu has %u requests queued (limit %u)",
                        (unsigned long long)s->id, s->n_queued, SK_LIMIT_SESSION_QUEUE);
  job->next = NULL;
  if (s->queue_tail) s->queue_tail->next = job; else s->queue_head = job;
  s->queue_tail = job;
  s->n_queued++;
  return 0;
}

/* The open reply of session s. */
static void send_open_reply(struct sk_conn *c, uint64_t req_id, const struct sk_session *s) {
  /* The parameters as the session keeps them: the cache header's pointer
   * moves between the object's two copies while a step runs. */
  const struct sk_kv_params *h = &s->params;
  struct sk_open_result o = {.session = s->id,
                             .capacity = s->capacity,
                             .kv_bytes = s->tensor_bytes, .object_bytes = s->kv_bytes,
                             .n_sink = h->n_sink,
                             .window = h->window,
                             .heavy = h->heavy,
                             .recent = h->recent,
                             .rope_scale = h->rope_scale,
                             .pinned = h->n_pin};
  snprintf(o.policy, sizeof o.policy, "%s", sk_policy_name(h->policy));
  snprintf(o.kv_type, sizeof o.kv_type, "%s", sk_kv_type_name(s->kv_type));
  struct sk_msgbuf b;
  if (sk_wire_pack_open(&b, req_id, &o) == 0) sk_conn_send_msg(c, &b);
}

/* An evict log as a reply's ranges. */
static void evicted_ranges(const struct sk_evict_log *log, struct sk_range *ranges,
                           size_t *ret_n) {
  for (uint32_t i = 0; i < log->n_ranges; i++)
    ranges[i] = (struct sk_range){log->first[i], log->last[i]};
  *ret_n = log->n_ranges;
}

static void on_event(void *user, struct sk_event *ev) {
  struct sk_server *srv = user;
  struct sk_job *job = ev->job;
  struct sk_conn *c = job->conn;
  if (ev->kind == SK_EVENT_TOKEN) {
    if (c) {
      struct sk_top_pair top[SK_WIRE_MAX_TOP];
      for (uint32_t i = 0; i < ev->n_top; i++) top[i] = (struct sk_top_pair){ev->top_id[i], ev->top_logit[i]};
      struct sk_token_event te = {.token = ev->token, .text = ev->text, .text_len = ev->text_len,
                                  .top = top, .n_top = ev->n_top};
      struct sk_msgbuf b;
      if (sk_wire_pack_token_event(&b, job->req_id, &te) == 0) sk_conn_send_msg(c, &b);
    }
    free(ev);
    return;
  }

  /* DONE */
  struct sk_session *s = job->sess;
  if (job->is_pin) {
    /* The pinned prefix of an open: the open's reply; a session whose pin
     * did not go in is closed (never half-pinned). */
    if (job->err.code != 0) {
      if (c) sk_conn_send_error(c, job->req_id, &job->err);
      s->closing = true;
    } else if (c) {
      send_open_reply(c, job->req_id, s);
    } else { /* the client left before it learned the id: nothing to keep */
      s->closing = true;
    }
  } else if (c) {
    if (job->err.code != 0) {
      sk_conn_send_error(c, job->req_id, &job->err);
    } else {
      struct sk_session_counters cnt;
      sk_session_counters_get(&srv->sessions, s, &cnt);
      struct sk_msgbuf b;
      bool gen = job->kind == SK_JOB_GENERATE;
      bool lp = !gen && job->want_logprobs && job->logprobs;
      /* A stop at an end-of-generation token says which. */
      const char *eog_text = NULL;
      size_t eog_len = 0;
      bool eog = gen && job->stop_reason && strcmp(job->stop_reason, "eos") == 0 &&
                 sk_tokenizer_text(srv->tok, job->stop_token, &eog_text, &eog_len) == 0;
      if (eog && !sk_utf8_valid(eog_text, eog_len)) eog_len = 0; /* frames are UTF-8 */
      if (gen) {
        struct sk_generate_result g = {.stop_token = eog ? job->stop_token : -1,
                                       .n_tokens = job->n_generated,
                                       .prompt_tokens = job->n_done,
                                       .completion_tokens = job->n_generated,
                                       .evicted = job->evicted.n_evicted,
                                       .resident = cnt.resident,
                                       .seen = cnt.seen};
        snprintf(g.stop, sizeof g.stop, "%s", job->stop_reason ? job->stop_reason : "length");
        evicted_ranges(&job->evicted, g.ranges, &g.n_ranges);
        if (sk_wire_pack_generate(&b, job->req_id, &g, eog_text, eog_len, job->final_text,
                                  job->final_text_len) == 0)
          sk_conn_send_msg(c, &b);
      } else {
        struct sk_append_result a = {.n_tokens = job->n_done,
                                     .evicted = job->evicted.n_evicted,
                                     .resident = cnt.resident,
                                     .seen = cnt.seen};
        evicted_ranges(&job->evicted, a.ranges, &a.n_ranges);
        if (sk_wire_pack_append(&b, job->req_id, &a, lp ? job->logprobs : NULL) == 0)
          sk_conn_send_msg(c, &b);
      }
    }
  }
  free(ev);
  s->running = NULL;
  s->last_used_ms = sk_clock_ms();
  sk_job_free(job);
  submit_next(srv, s);
}

/* ---- request handlers ---- */

struct request;
static struct sk_job *job_new(enum sk_job_kind kind, const struct request *r, struct sk_session *s);

struct request {
  struct sk_conn *conn;
  uint64_t id;
  const msgpack_object *map;
};

static bool may_use(const struct sk_conn *c, const struct sk_session *s) {
  return c->uid == 0 || c->uid == s->owner_uid;
}

/* Looks up the request's "session" field. Sends the error and returns NULL
 * if it is missing, unknown or not the caller's. */
static struct sk_session *req_session(struct sk_server *srv, const struct request *r) {
  struct sk_error e;
  uint64_t sid = 0;
  if (sk_msg_need_u64(r->map, "session", UINT64_MAX, &sid, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return NULL;
  }
  struct sk_session *s = sk_session_find(&srv->sessions, sid);
  if (!s || s->closing) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_SUCH_SESSION, "no session %llu", (unsigned long long)sid);
    return NULL;
  }
  if (!may_use(r->conn, s)) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_FORBIDDEN, "session %llu belongs to another user",
                (unsigned long long)sid);
    return NULL;
  }
  s->last_used_ms = sk_clock_ms();
  return s;
}

static void op_ping(struct sk_server *srv, const struct request *r) {
  (void)srv;
  struct sk_msgbuf b;
  if (sk_wire_pack_ok(&b, r->id) == 0) sk_conn_send_msg(r->conn, &b);
}

/* Reads "sparsity" of an open: absent or 0 = dense, else one of the
 * calibrated levels (stored as the calibration's value). */
static int read_sparsity(struct sk_server *srv, const struct request *r, float *ret,
                         struct sk_error *e) {
  double d = 0.0;
  int rc = sk_msg_get_f64(r->map, "sparsity", &d, e);
  if (rc <= 0 || d == 0.0) return rc < 0 ? rc : 0;
  const struct sk_sparse_calib *cal = srv->cfg.sparse;
  if (!cal)
    return sk_error_set(e, SK_ERR_BAD_REQUEST,
                        "sparsity %g: this daemon has no sparsity calibration (sinkd "
                        "--calibrate TEXT writes one for the model; sinkd.conf sparsity_file "
                        "loads it)",
                        d);
  for (uint32_t i = 0; i < cal->n_levels; i++)
    if (fabs(d - cal->level[i]) < SK_SPARSE_LEVEL_EPS) {
      *ret = cal->level[i];
      return 0;
    }
  char lv[128];
  return sk_error_set(e, SK_ERR_BAD_REQUEST,
                      "sparsity %g is not a calibrated level: 0 (off) or %s", d,
                      sk_sparse_calib_levels(cal, lv, sizeof lv));
}

/* "compute" of hello and stats. */
static void compute_info(struct sk_server *srv, struct sk_compute_info *ret) {
  snprintf(ret->kernel, sizeof ret->kernel, "%s", sk_kernels_name());
  ret->threads = sk_compute_threads(srv->compute);
  ret->max_batch = srv->cfg.max_batch;
  snprintf(ret->kv_type, sizeof ret->kv_type, "%s", sk_kv_type_name(srv->cfg.kv_type));
}

static void op_hello(struct sk_server *srv, const struct request *r) {
  const struct sk_model_config *mc = sk_model_config(srv->model);
  struct sk_hello h;
  memset(&h, 0, sizeof h);
  h.protocol = SK_PROTOCOL_VERSION;
  snprintf(h.chat_template, sizeof h.chat_template, "%s", sk_chat_name(srv->cfg.chat_template));
  snprintf(h.chat_template_error, sizeof h.chat_template_error, "%s", srv->chat_error);
  snprintf(h.server, sizeof h.server, "sinkd");
  snprintf(h.version, sizeof h.version, "%s", SK_VERSION);
  compute_info(srv, &h.compute);
  struct sk_model_info *m = &h.model;
  snprintf(m->name, sizeof m->name, "%s", mc->name);
  m->n_vocab = mc->n_vocab;
  m->n_ctx_train = mc->n_ctx_train;
  m->n_layer = mc->n_layer;
  m->dim = mc->dim;
  m->n_head = mc->n_head;
  m->n_kv_head = mc->n_kv_head;
  /* As a session's rope_scale: positions are divided by it (the GGUF's
   * linear scaling factor; the config holds its inverse). */
  m->rope_scale = 1.0 / mc->rope_scale;
  m->max_capacity = srv->cfg.max_capacity;
  snprintf(m->weight_type, sizeof m->weight_type, "%s", sk_model_weight_type(srv->model));
  m->weight_bytes = sk_model_weight_bytes(srv->model);
  struct sk_session_defaults *d = &h.defaults;
  snprintf(d->policy, sizeof d->policy, "%s", sk_policy_name(srv->cfg.defaults.policy));
  d->n_sink = srv->cfg.defaults.n_sink;
  d->window = srv->cfg.defaults.window;
  d->heavy = srv->cfg.defaults.heavy;
  d->recent = srv->cfg.defaults.recent;
  d->capacity = srv->cfg.defaults.capacity;
  d->rope_scale = srv->cfg.defaults.rope_scale;
  struct sk_wire_hello_extra x = {
      .model_file = srv->cfg.model_path,
      /* the transposed down projections of the sparse MLP (0 without) */
      .sparse_weight_bytes = sk_model_sparse_bytes(srv->model),
      .sparsity_levels = srv->cfg.sparse ? srv->cfg.sparse->level : NULL,
      .n_sparsity_levels = srv->cfg.sparse ? srv->cfg.sparse->n_levels : 0,
  };
  struct sk_msgbuf b;
  if (sk_wire_pack_hello(&b, r->id, &h, &x) == 0) sk_conn_send_msg(r->conn, &b);
}

/* Reads "pin" (text, tokenized here with BOS first) or "pin_tokens" into
 * a malloc'd array (*ret NULL and *ret_n 0 when absent). */
static int read_pin(struct sk_server *srv, const struct request *r, int32_t **ret,
                    size_t *ret_n, struct sk_error *e) {
  const char *text = NULL;
  size_t len = 0;
  const msgpack_object_array *arr = NULL;
  int has_text = sk_msg_get_str(r->map, "pin", &text, &len, e);
  if (has_text < 0) return has_text;
  int has_tokens = sk_msg_get_array(r->map, "pin_tokens", &arr, e);
  if (has_tokens < 0) return has_tokens;
  *ret = NULL;
  *ret_n = 0;
  if (has_text && has_tokens)
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "give either 'pin' or 'pin_tokens', not both");
  if (has_text) {
    if (len > SK_LIMIT_PIN_TEXT)
      return sk_error_set(e, SK_ERR_BAD_REQUEST, "field 'pin': %zu bytes, at most %u", len,
                          SK_LIMIT_PIN_TEXT);
    return sk_tokenizer_encode(srv->tok, text, len,
                               sk_tokenizer_add_bos(srv->tok) ? SK_TOKENIZE_BOS : 0, ret, ret_n,
                               e);
  }
  if (!has_tokens) return 0;
  if (arr->size > srv->cfg.max_capacity)
    return sk_error_set(e, SK_ERR_BAD_REQUEST,
                        "field 'pin_tokens': %u tokens exceed the maximum capacity %u", arr->size,
                        srv->cfg.max_capacity);
  const uint32_t n_vocab = sk_model_config(srv->model)->n_vocab;
  int32_t *t = malloc((arr->size ? arr->size : 1) * sizeof *t);
  if (!t) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
  for (uint32_t i = 0; i < arr->size; i++) {
    const msgpack_object *o = &arr->ptr[i];
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= n_vocab) {
      free(t);
      return sk_error_set(e, SK_ERR_BAD_REQUEST,
                          "field 'pin_tokens': element %u must be a token id in [0, %u)", i,
                          n_vocab);
    }
    t[i] = (int32_t)o->via.u64;
  }
  *ret = t;
  *ret_n = arr->size;
  return 0;
}

/* Reads open's "chat_template" (a family name or a template text to
 * recognise) into conv->tmpl and "system" (the system prompt: rendered
 * with the template and tokenized, BOS first, as the pin; not with 'pin'
 * or 'pin_tokens', has_pin). */
static int read_chat(struct sk_server *srv, const struct request *r, struct sk_conv *conv,
                     bool has_pin, int32_t **ret_pin, size_t *ret_n, struct sk_error *e) {
  const char *ct = NULL, *sys = NULL;
  size_t ct_len = 0, sys_len = 0;
  int rc = sk_msg_get_str(r->map, "chat_template", &ct, &ct_len, e);
  if (rc < 0) return rc;
  if (rc == 1 && (rc = sk_chat_resolve(ct, ct_len, "field 'chat_template'", &conv->tmpl, e)) < 0)
    return rc;
  if ((rc = sk_msg_get_str(r->map, "system", &sys, &sys_len, e)) <= 0) return rc;
  if (has_pin)
    return sk_error_set(e, SK_ERR_BAD_REQUEST,
                        "give either 'system' or 'pin'/'pin_tokens', not both");
  if (conv->tmpl == SK_CHAT_NONE)
    return sk_error_set(e, SK_ERR_BAD_REQUEST,
                        "field 'system': the session has no chat template (give chat_template)");
  if (sys_len > SK_LIMIT_PIN_TEXT)
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "field 'system': %zu bytes, at most %u", sys_len,
                        SK_LIMIT_PIN_TEXT);
  struct sk_chat_text t;
  sk_chat_text_init(&t);
  if ((rc = sk_conv_set_system(conv, sys, sys_len, e)) == 0 &&
      (rc = sk_conv_system_text(conv, &t, e)) == 0 &&
      (rc = sk_session_chat_tokenize(srv->tok, &t, sk_tokenizer_add_bos(srv->tok), ret_pin,
                                    ret_n, e)) == 0) {
    conv->text = t.text; /* C: the pinned text */
    conv->text_len = t.len;
    t.text = NULL;
    conv->system_sent = true;
    conv->n_seen = *ret_n;
  }
  sk_chat_text_free(&t);
  return rc;
}

/* Per-uid limits (every uid, root included): a user cannot take all the
 * sessions or all the memory of a daemon shared by everyone. Sessions
 * still being closed count: their memory is not free yet. */
/* The object of a closed session is unmapped on libuv's thread pool: its
 * file is already deleted, and returning its pages (~0.2 ms per MB on
 * tmpfs) would hold the event loop. */
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

static void release_obj(void *user, struct sk_store_obj *obj) {
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
 * of a cache-sized file on tmpfs zeroes its pages, ~0.3 ms per MB, and a
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
  struct open_work *prev, *next; /* srv->opens */
};

/* fork, export and import copy up to a whole cache (tens of MB; a 73 MiB
 * fork held every client ~60 ms on the event loop): the copy runs in
 * libuv's thread pool. fork and export hold their source session
 * meanwhile (its `running` is the job: later requests queue behind it,
 * the compute thread never sees it, close and the idle TTL wait); fork
 * and import hold their new session's id and limits (sk_session_hold);
 * import owns the bytes it received. */
enum copy_kind { COPY_FORK, COPY_EXPORT, COPY_IMPORT };

struct copy_work {
  uv_work_t req;
  struct sk_server *srv;
  enum copy_kind kind;
  struct sk_session *src;   /* fork, export: held */
  struct sk_job *job;       /* fork, export: src->running (conn, req_id) */
  struct sk_conn *conn;     /* import: referenced until done */
  uint64_t req_id;          /* import */
  uint32_t uid;             /* the new session's owner */
  uint64_t id;              /* fork, import: the new session's id */
  size_t bytes;             /* fork: held in the limits; import: 0 */
  uint32_t max_capacity;    /* import */
  char *buf;                /* export: the image (len bytes, made in the
                               worker); import: the bytes received */
  size_t len, cap;          /* import: cap counts in srv->import_bytes */
  struct sk_store_obj *obj; /* fork, import: made */
  int rc;
  struct sk_error err;
  struct copy_work *prev, *next; /* srv->copies */
};

static void user_usage(const struct sk_server *srv, uint32_t uid, const struct sk_session *except,
                       uint32_t *ret_n, uint64_t *ret_bytes) {
  uint32_t n = 0;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    const struct sk_session *s = srv->sessions.items[i];
    if (!s || s == except || s->owner_uid != uid) continue;
    n++;
    bytes += s->kv_bytes;
  }
  for (const struct open_work *w = srv->opens; w; w = w->next)
    if (w->res.owner_uid == uid) {
      n++;
      bytes += w->res.bytes;
    }
  for (const struct copy_work *w = srv->copies; w; w = w->next)
    if (w->kind != COPY_EXPORT && w->uid == uid) {
      n++;
      bytes += w->bytes;
    }
  *ret_n = n;
  *ret_bytes = bytes;
}

/* Whether uid may own one more session of `bytes` (besides `except`, a
 * session of its already in the table, or NULL). A temporary session
 * (one that ends with its connection: `sinkctl generate` without
 * --session) may go SK_LIMIT_TEMP_SESSIONS past max_user_sessions, so
 * that persistent sessions left behind do not stop one-off requests. */
static int check_user_limits(struct sk_server *srv, uint32_t uid, size_t bytes,
                             const struct sk_session *except, bool temporary,
                             struct sk_error *e) {
  uint32_t n;
  uint64_t used;
  user_usage(srv, uid, except, &n, &used);
  /* A per-user limit at or above the daemon's is implied by it: the
   * daemon's check (sk_session_reserve) then names the limit that binds. */
  uint32_t max_n = srv->cfg.max_user_sessions;
  uint32_t allowed = max_n + (temporary ? SK_LIMIT_TEMP_SESSIONS : 0);
  if (max_n && max_n < srv->sessions.max_sessions && n >= allowed)
    return sk_error_set(e, SK_ERR_BUSY,
                        "uid %u already has %u sessions (max_user_sessions %u): `sinkctl list` "
                        "shows them, `sinkctl close --idle 1h` closes those idle for an hour",
                        uid, n, max_n);
  uint64_t max = srv->cfg.max_user_kv_bytes;
  if (max && max < srv->sessions.max_bytes && (bytes > max || used > max - bytes))
    return sk_error_set(e, SK_ERR_BUSY,
                        "a session of %zu bytes would bring uid %u to %llu bytes "
                        "(max_user_memory %llu): `sinkctl list` shows them, `sinkctl close ID` "
                        "closes one",
                        bytes, uid, (unsigned long long)(used + bytes), (unsigned long long)max);
  return 0;
}

static void open_work_run(uv_work_t *req) {
  struct open_work *w = req->data;
  w->rc = sk_session_reservation_create(w->srv->sessions.store, &w->res, &w->err);
}

/* The session of a finished open: logged, and answered, or its pinned
 * prefix goes through the model first (the reply is sent once it is in
 * the cache, on_event). Takes pin. */
static void open_finish(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                        struct sk_session *s, int32_t *pin, size_t n_pin, struct sk_conv *conv) {
  s->last_used_ms = sk_clock_ms();
  /* The conversation (template, pinned system prompt) is the session's. */
  sk_conv_free(&s->conv);
  s->conv = *conv;
  sk_conv_init(conv, SK_CHAT_NONE);
  if (s->conv.tmpl != SK_CHAT_NONE) {
    struct sk_error ce;
    if (sk_conv_save(&s->conv, sk_store_dir(srv->cfg.store), s->id, &ce) < 0)
      sk_log(SK_LOG_WARNING, "session %llu: conversation not saved: %s", (unsigned long long)s->id,
             ce.message);
  }
  counts_changed(srv);
  sk_log(SK_LOG_INFO, "session %llu opened by uid %u: %s, capacity %u, %u pinned, %zu bytes (%s)",
         (unsigned long long)s->id, s->owner_uid, sk_policy_name(s->params.policy), s->capacity,
         s->params.n_pin, s->kv_bytes, sk_kv_type_name(s->kv_type));
  if (n_pin) {
    const struct request r = {.conn = c, .id = req_id, .map = NULL};
    struct sk_job *job = job_new(SK_JOB_APPEND, &r, s);
    if (!job) {
      free(pin);
      sk_session_free(&srv->sessions, s);
      counts_changed(srv);
      sk_conn_send_errorf(c, req_id, SK_ERR_NO_MEMORY, "out of memory");
      return;
    }
    job->is_pin = true;
    job->bos = 0;
    job->tokens = pin;
    job->n_tokens = n_pin;
    session_dispatch(srv, s, job);
    return;
  }
  free(pin);
  send_open_reply(c, req_id, s);
}

static void open_work_done(uv_work_t *req, int status) {
  struct open_work *w = req->data;
  struct sk_server *srv = w->srv;
  struct sk_conn *c = w->conn;
  if (w->prev)
    w->prev->next = w->next;
  else
    srv->opens = w->next;
  if (w->next) w->next->prev = w->prev;
  if (status < 0 && w->rc == 0)
    w->rc = sk_error_set(&w->err, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(status));
  if (w->rc < 0 || c->closing || srv->shutting_down) {
    /* A client that left never learns the id: nothing to keep. */
    sk_session_unreserve(&srv->sessions, &w->res);
    if (w->rc < 0 && !c->closing) sk_conn_send_error(c, w->id, &w->err);
    free(w->pin);
    sk_conv_free(&w->conv);
  } else {
    struct sk_session *s = NULL;
    struct sk_error e;
    if (sk_session_commit(&srv->sessions, &w->res, &s, &e) < 0) {
      free(w->pin);
      sk_conv_free(&w->conv);
      sk_conn_send_error(c, w->id, &e);
    } else {
      if (w->temporary) s->temp_conn = c->id;
      open_finish(srv, c, w->id, s, w->pin, w->n_pin, &w->conv);
    }
  }
  free(w);
  sk_conn_unref(c);
}

static void op_open(struct sk_server *srv, const struct request *r) {
  struct sk_error e;
  struct sk_kv_params p = srv->cfg.defaults;
  const char *pol = NULL;
  size_t pol_len = 0;
  uint64_t v;
  double d;
  int32_t *pin = NULL;
  size_t n_pin = 0;
  bool has_sink = false, temporary = false;
  struct sk_conv conv;
  sk_conv_init(&conv, srv->cfg.chat_template);
  int rc = sk_msg_get_str(r->map, "policy", &pol, &pol_len, &e);
  if (rc < 0) goto bad;
  if (rc == 1 && (rc = sk_policy_parse(pol, pol_len, &p.policy, &e)) < 0) goto bad;
  if ((rc = sk_msg_get_u64(r->map, "n_sink", UINT32_MAX, &v, &e)) < 0) goto bad;
  if (rc == 1) p.n_sink = (uint32_t)v, has_sink = true;
  /* parameters given with a non-zero value, which the policy must have */
  const char *foreign = NULL;
  const char *name = sk_policy_name(p.policy);
  const unsigned parts = sk_policy_parts(name, strlen(name));
  const bool window_ok = parts & SK_PART_WINDOW, h2o_ok = parts & SK_PART_HEAVY;
  if ((rc = sk_msg_get_u64(r->map, "window", UINT32_MAX, &v, &e)) < 0) goto bad;
  if (rc == 1) p.window = (uint32_t)v;
  if (rc == 1 && v && !window_ok) foreign = "window";
  if ((rc = sk_msg_get_u64(r->map, "heavy", UINT32_MAX, &v, &e)) < 0) goto bad;
  if (rc == 1) p.heavy = (uint32_t)v;
  if (rc == 1 && v && !h2o_ok) foreign = "heavy";
  if ((rc = sk_msg_get_u64(r->map, "recent", UINT32_MAX, &v, &e)) < 0) goto bad;
  if (rc == 1) p.recent = (uint32_t)v;
  if (rc == 1 && v && !h2o_ok) foreign = "recent";
  if ((rc = sk_msg_get_u64(r->map, "capacity", UINT32_MAX, &v, &e)) < 0) goto bad;
  if (rc == 1) p.capacity = (uint32_t)v;
  if (rc == 1 && v && !(parts & SK_PART_CAPACITY)) foreign = "capacity";
  if (foreign) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "%s: policy %s%s has no such part", foreign, name,
                      pol ? "" : " (the daemon's default)");
    goto bad;
  }
  if ((rc = sk_msg_get_f64(r->map, "rope_scale", &d, &e)) < 0) goto bad;
  if (rc == 1) {
    /* kept as a float: a value that rounds to 0 (1e-50) is refused as 0 */
    if (!(d > 0.0 && d <= SK_KV_MAX_ROPE_SCALE) || !((float)d > 0.0f)) {
      rc = sk_error_set(&e, SK_ERR_BAD_REQUEST,
                        "rope_scale %.10g must be finite, > 0 (also as a 32-bit float) and <= %g",
                        d, (double)SK_KV_MAX_ROPE_SCALE);
      goto bad;
    }
    p.rope_scale = (float)d;
  }
  if ((rc = read_sparsity(srv, r, &p.sparsity, &e)) < 0) goto bad;
  if ((rc = sk_msg_get_bool(r->map, "temporary", &temporary, &e)) < 0) goto bad;
  if ((rc = read_pin(srv, r, &pin, &n_pin, &e)) < 0) goto bad;
  if ((rc = read_chat(srv, r, &conv, pin != NULL, &pin, &n_pin, &e)) < 0) goto bad;
  if (n_pin > UINT32_MAX) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "pin of %zu tokens is too long", n_pin);
    goto bad;
  }
  p.n_pin = (uint32_t)n_pin;
  /* The pin is the sink region of the policies that have one. */
  if (n_pin && !has_sink && (parts & SK_PART_SINKS)) p.n_sink = (uint32_t)n_pin;
  if (!(parts & SK_PART_SINKS) && has_sink && p.n_sink) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "n_sink %u: policy %s has no sinks", p.n_sink, name);
    goto bad;
  }

  /* The budget against the daemon's limit, then against the positions the
   * model can handle (sk_session_reserve repeats the first check). */
  if ((rc = sk_kv_params_check(&p, srv->cfg.max_capacity, &e)) < 0 ||
      (rc = sk_kv_params_check_context(&p, sk_model_config(srv->model)->n_ctx_train, &e)) < 0)
    goto bad;
  size_t bytes = sk_store_object_size(srv->sessions.store, sk_kv_params_capacity(&p));
  if (bytes && (rc = check_user_limits(srv, r->conn->uid, bytes, NULL, temporary, &e)) < 0)
    goto bad;
  struct open_work *w = calloc(1, sizeof *w);
  if (!w) {
    rc = sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
    goto bad;
  }
  uint64_t seed;
  if (getrandom(&seed, sizeof seed, 0) != sizeof seed) seed = sk_clock_ms() ^ r->conn->id;
  rc = sk_session_reserve(&srv->sessions, &p, srv->cfg.max_capacity, r->conn->uid,
                          temporary ? SK_STORE_TEMPORARY : 0, seed, &w->res, &e);
  if (rc < 0) {
    free(w);
    goto bad;
  }
  w->srv = srv;
  w->conn = r->conn;
  w->id = r->id;
  w->pin = pin;
  w->n_pin = n_pin;
  w->temporary = temporary;
  w->conv = conv;
  sk_conv_init(&conv, SK_CHAT_NONE);
  pin = NULL;
  w->req.data = w;
  if ((rc = uv_queue_work(srv->loop, &w->req, open_work_run, open_work_done)) < 0) {
    sk_session_unreserve(&srv->sessions, &w->res);
    pin = w->pin;
    conv = w->conv;
    free(w);
    rc = sk_error_set(&e, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(rc));
    goto bad;
  }
  w->next = srv->opens;
  if (srv->opens) srv->opens->prev = w;
  srv->opens = w;
  sk_conn_ref(r->conn);
  return;
bad:
  free(pin);
  sk_conv_free(&conv);
  sk_conn_send_error(r->conn, r->id, &e);
}

/* Closes s: queued requests are answered `cancelled`, a running one is
 * cancelled and s is freed when it ends (else now). */
static void session_close(struct sk_server *srv, struct sk_session *s) {
  while (s->queue_head) {
    struct sk_job *j = s->queue_head;
    s->queue_head = j->next;
    if (j->conn)
      sk_conn_send_errorf(j->conn, j->req_id, SK_ERR_CANCELLED, "session %llu was closed",
                  (unsigned long long)s->id);
    sk_job_free(j);
  }
  s->queue_tail = NULL;
  s->n_queued = 0;
  sk_log(SK_LOG_INFO, "session %llu closed", (unsigned long long)s->id);
  if (s->running) {
    s->closing = true;
    atomic_store(&s->running->session_closing, true);
    atomic_store(&s->running->cancel, true);
    if (srv->compute) sk_compute_wake(srv->compute); /* NULL once stopping */
  } else {
    sk_session_free(&srv->sessions, s);
    if (!srv->shutting_down) counts_changed(srv);
  }
}

static void op_close(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  session_close(srv, s);
  struct sk_msgbuf b;
  if (sk_wire_pack_ok(&b, r->id) == 0) sk_conn_send_msg(r->conn, &b);
}

static int session_id_cmp(const void *a, const void *b) {
  const struct sk_session *x = *(const struct sk_session *const *)a;
  const struct sk_session *y = *(const struct sk_session *const *)b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* The caller's sessions, in ascending id order. */
static void op_list(struct sk_server *srv, const struct request *r) {
  struct sk_session **list = malloc((srv->sessions.cap ? srv->sessions.cap : 1) * sizeof *list);
  if (!list) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory listing the sessions");
    return;
  }
  uint32_t n = 0;
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    struct sk_session *s = srv->sessions.items[i];
    if (s && !s->closing && may_use(r->conn, s)) list[n++] = s;
  }
  qsort(list, n, sizeof *list, session_id_cmp);
  const uint64_t now = sk_clock_ms(), now_unix = (uint64_t)time(NULL);
  struct sk_session_info *rows = calloc(n ? n : 1, sizeof *rows);
  if (!rows) {
    free(list);
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory listing the sessions");
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    const struct sk_session *s = list[i];
    struct sk_session_info *row = &rows[i];
    struct sk_session_counters cnt;
    sk_session_counters_get(&srv->sessions, s, &cnt);
    row->session = s->id;
    row->owner_uid = s->owner_uid;
    snprintf(row->policy, sizeof row->policy, "%s", sk_policy_name(s->params.policy));
    row->capacity = s->capacity;
    snprintf(row->kv_type, sizeof row->kv_type, "%s", sk_kv_type_name(s->kv_type));
    row->resident = cnt.resident;
    row->seen = cnt.seen;
    row->busy = s->running != NULL;
    row->adopted = s->adopted;
    /* What `sinkctl list` needs to tell what can go: its memory, how old
     * it is, how long since it was last used (0 while busy). */
    row->kv_bytes = s->tensor_bytes, row->object_bytes = s->kv_bytes;
    uint64_t created = s->obj->hdr->created_unix;
    row->age_s = now_unix > created ? now_unix - created : 0;
    row->idle_s = s->running || s->queue_head ? 0 : (now - s->last_used_ms) / 1000u;
    row->temporary = s->temp_conn != 0;
  }
  free(list);
  struct sk_msgbuf b;
  if (sk_wire_pack_list(&b, r->id, rows, n) == 0) sk_conn_send_msg(r->conn, &b);
  free(rows);
}

/* The stats reply of one session; with tokens, its resident token ids in
 * cache-position order (read from the committed state: the session must be
 * idle, which a queued SK_JOB_STATS guarantees). The resident ranges are
 * sent whenever the session is idle. */
static void send_session_stats(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                               struct sk_session *s, bool tokens) {
  struct sk_session_counters cnt;
  sk_session_counters_get(&srv->sessions, s, &cnt);
  /* Parameters from the session, never from the cache header, whose
   * pointer the compute thread moves between the object's two copies
   * while a step runs. */
  const struct sk_kv_params *h = &s->params;
  uint32_t n_layer = s->attn.n_layer, probe = 0;
  float *mass = calloc(2 * (size_t)n_layer, sizeof *mass);
  if (!mass) {
    sk_conn_send_errorf(c, req_id, SK_ERR_NO_MEMORY, "out of memory");
    return;
  }
  float *ent = mass + n_layer;
  uint32_t steps = sk_session_attn_get(&srv->sessions, s, mass, ent, &probe);
  /* The resident set itself is read only while no job runs on the
   * session (the compute thread owns the cache meanwhile). */
  bool idle = tokens || s->running == NULL;
  struct sk_session_stats *st = calloc(1, sizeof *st); /* ~3 KiB */
  struct sk_range *ranges = NULL;
  int32_t *ids = NULL;
  const struct sk_kv *kv = s->kv;
  uint32_t nr = idle ? kv->hdr->n_resident : 0, shown = 0;
  if (idle) {
    /* Stream indices of the resident tokens in cache-position order, as
     * ranges of consecutive indices (at most SK_LIMIT_STATS_RANGES). */
    uint32_t n_ranges = 0;
    for (uint32_t p = 0; p < nr; p++)
      if (p == 0 || sk_kv_index_at(kv, p) != sk_kv_index_at(kv, p - 1) + 1) n_ranges++;
    shown = n_ranges < SK_LIMIT_STATS_RANGES ? n_ranges : SK_LIMIT_STATS_RANGES;
    ranges = calloc(shown ? shown : 1, sizeof *ranges);
    for (uint32_t p = 0, k = 0; ranges && p < nr && k < shown; k++) {
      uint32_t q = p;
      while (q + 1 < nr && sk_kv_index_at(kv, q + 1) == sk_kv_index_at(kv, q) + 1) q++;
      ranges[k] = (struct sk_range){sk_kv_index_at(kv, p), sk_kv_index_at(kv, q)};
      p = q + 1;
    }
  }
  if (tokens) {
    ids = calloc(kv->hdr->n_resident ? kv->hdr->n_resident : 1, sizeof *ids);
    for (uint32_t p = 0; ids && p < kv->hdr->n_resident; p++) ids[p] = kv->token[sk_kv_slot(kv, p)];
  }
  /* MLP sparsity: the tokens that ran sparse and, per layer, the neurons
   * they kept */
  uint64_t *kept = calloc(n_layer ? n_layer : 1, sizeof *kept);
  double *measured = calloc(n_layer ? n_layer : 1, sizeof *measured);
  const uint64_t sp_tokens = kept ? sk_session_sparse_get(&srv->sessions, s, kept) : 0;
  if (!st || (idle && !ranges) || (tokens && !ids) || !kept || !measured) {
    sk_conn_send_errorf(c, req_id, SK_ERR_NO_MEMORY, "out of memory");
  } else {
    const struct sk_model_config *smc = sk_model_config(srv->model);
    for (uint32_t l = 0; sp_tokens && l < n_layer; l++)
      measured[l] = 1.0 - (double)kept[l] / ((double)sp_tokens * smc->hidden_dim);
    st->sparsity = s->params.sparsity;
    st->sparse_tokens = sp_tokens;
    /* bytes of weights one of its tokens reads, on average (the model's
     * weight_bytes for a dense session) */
    st->weight_bytes_per_token = (double)sk_model_weight_bytes(srv->model);
    if (sp_tokens) {
      double *mean = malloc(n_layer * sizeof *mean);
      if (mean) {
        for (uint32_t l = 0; l < n_layer; l++) mean[l] = (double)kept[l] / (double)sp_tokens;
        st->weight_bytes_per_token = sk_model_sparse_step_bytes(srv->model, mean);
        free(mean);
      }
    }
    st->session = s->id;
    snprintf(st->chat_template, sizeof st->chat_template, "%s", sk_chat_name(s->conv.tmpl));
    snprintf(st->policy, sizeof st->policy, "%s", sk_policy_name(h->policy));
    st->n_sink = h->n_sink;
    st->window = h->window;
    st->heavy = h->heavy;
    st->recent = h->recent;
    st->pinned = h->n_pin;
    st->rope_scale = h->rope_scale;
    st->model_rope_scale = 1.0 / sk_model_config(srv->model)->rope_scale;
    st->capacity = s->capacity;
    st->resident = cnt.resident;
    st->seen = cnt.seen;
    st->evicted = cnt.evicted;
    st->kv_bytes = s->tensor_bytes, st->object_bytes = s->kv_bytes;
    snprintf(st->kv_type, sizeof st->kv_type, "%s", sk_kv_type_name(s->kv_type));
    st->has_positions = cnt.resident > 0;
    st->position_first = 0;
    st->position_last = cnt.resident ? cnt.resident - 1 : 0;
    st->attn_steps = steps;
    st->sink_tokens = probe;
    st->busy = s->running != NULL;
    st->commit = cnt.commit;
    st->adopted = s->adopted;
    st->idle_s = (sk_clock_ms() - s->last_used_ms) / 1000u;
    struct sk_wire_session_extra x = {.owner_uid = s->owner_uid,
                                      .has_resident_ranges = idle,
                                      .ranges = ranges,
                                      .n_ranges = shown,
                                      .sink_mass = mass,
                                      .entropy = ent,
                                      .n_layers = n_layer,
                                      .sparsity_measured = measured,
                                      .n_sparse_layers = sp_tokens ? n_layer : 0,
                                      .has_tokens = tokens,
                                      .tokens = ids,
                                      .n_tokens = tokens ? kv->hdr->n_resident : 0};
    struct sk_msgbuf b;
    if (sk_wire_pack_session_stats(&b, req_id, st, &x) == 0) sk_conn_send_msg(c, &b);
  }
  free(measured);
  free(kept);
  free(ids);
  free(ranges);
  free(st);
  free(mass);
}

static struct sk_job *job_new(enum sk_job_kind kind, const struct request *r, struct sk_session *s);
static void enqueue_plain(struct sk_server *srv, const struct request *r, struct sk_session *s,
                          enum sk_job_kind kind);

static void op_stats(struct sk_server *srv, const struct request *r) {
  struct sk_msgbuf b;
  if (!sk_msg_get(r->map, "session")) {
    uint32_t user_n;
    uint64_t user_bytes;
    user_usage(srv, r->conn->uid, NULL, &user_n, &user_bytes);
    struct sk_daemon_stats st = {
        .steps = sk_compute_steps(srv->compute),
        .sessions = srv->sessions.count,
        .has_user = true,
        .user_sessions = user_n,
        .user_memory_bytes = user_bytes,
        .max_user_sessions = srv->cfg.max_user_sessions,
        .max_user_memory = srv->cfg.max_user_kv_bytes,
        .clients = srv->conns.count,
        .uptime_s = (sk_clock_ms() - srv->started_ms) / 1000u,
        .tokens_prefilled = sk_compute_tokens_prefilled(srv->compute),
        .tokens_generated = sk_compute_tokens_generated(srv->compute),
        .max_sessions = srv->sessions.max_sessions,
        .memory_bytes = srv->sessions.bytes,
        .max_memory = srv->sessions.max_bytes,
        .adopted = srv->n_adopted,
        .set_aside = srv->n_set_aside,
        .idle_ttl_s = srv->cfg.idle_ttl_s,
    };
    compute_info(srv, &st.compute);
    struct sk_wire_daemon_extra x = {
        .chat_template = sk_chat_name(srv->cfg.chat_template),
        .chat_template_error = srv->chat_error,
        .weights_mapped_bytes = sk_model_mapped_bytes(srv->model),
        .weights_repacked_bytes = sk_model_repacked_bytes(srv->model),
        .state_dir = sk_store_dir(srv->cfg.store),
    };
    if (sk_wire_pack_daemon_stats(&b, r->id, &st, &x) < 0) return;
    sk_conn_send_msg(r->conn, &b);
    return;
  }
  struct sk_error e;
  bool tokens = false;
  if (sk_msg_get_bool(r->map, "tokens", &tokens, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  if (!tokens) {
    send_session_stats(srv, r->conn, r->id, s, false);
    return;
  }
  enqueue_plain(srv, r, s, SK_JOB_STATS);
}

/* Reads "text" or "tokens" (exactly one) and "bos" into job. */
static int read_input(const struct request *r, struct sk_job *job, bool required,
                      struct sk_error *e) {
  const char *text = NULL;
  size_t len = 0;
  const char *text_key = job->kind == SK_JOB_GENERATE ? "prompt" : "text";
  int has_text = sk_msg_get_str(r->map, text_key, &text, &len, e);
  if (has_text < 0) return has_text;
  const msgpack_object_array *arr = NULL;
  int has_tokens = sk_msg_get_array(r->map, "tokens", &arr, e);
  if (has_tokens < 0) return has_tokens;
  if (has_text && has_tokens)
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "give either '%s' or 'tokens', not both", text_key);
  if (!has_text && !has_tokens && required)
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "missing field '%s' or 'tokens'", text_key);
  bool bos = false;
  int has_bos = sk_msg_get_bool(r->map, "bos", &bos, e);
  if (has_bos < 0) return has_bos;
  job->bos = has_bos ? bos : -1;
  bool special = false;
  int has_special = sk_msg_get_bool(r->map, "parse_special", &special, e);
  if (has_special < 0) return has_special;
  job->parse_special = special;
  if (has_text) {
    job->text = malloc(len + 1);
    if (!job->text) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
    memcpy(job->text, text, len);
    job->text[len] = 0;
    job->text_len = len;
  }
  if (has_tokens) {
    job->tokens = malloc((arr->size ? arr->size : 1) * sizeof *job->tokens);
    if (!job->tokens) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
    for (uint32_t i = 0; i < arr->size; i++) {
      const msgpack_object *o = &arr->ptr[i];
      int64_t v;
      if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX)
        v = (int64_t)o->via.u64;
      else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        v = -1;
      else
        return sk_error_set(e, SK_ERR_BAD_REQUEST,
                            "field 'tokens': element %u must be a token id (non-negative integer)", i);
      if (v < 0)
        return sk_error_set(e, SK_ERR_BAD_REQUEST,
                            "field 'tokens': element %u is negative", i);
      job->tokens[i] = (int32_t)v;
    }
    job->n_tokens = arr->size;
  }
  return 0;
}

static struct sk_job *job_new(enum sk_job_kind kind, const struct request *r, struct sk_session *s) {
  struct sk_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->kind = kind;
  j->req_id = r->id;
  j->conn = r->conn;
  j->sess = s;
  j->bos = -1;
  atomic_init(&j->cancel, false);
  atomic_init(&j->paused, false);
  return j;
}

/* Queues a job of `kind` that needs nothing from the request but the
 * session; answers the error itself. */
static void enqueue_plain(struct sk_server *srv, const struct request *r, struct sk_session *s,
                          enum sk_job_kind kind) {
  struct sk_error e;
  struct sk_job *job = job_new(kind, r, s);
  if (!job) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory");
    return;
  }
  if (session_enqueue(srv, s, job, &e) < 0) {
    sk_job_free(job);
    sk_conn_send_error(r->conn, r->id, &e);
  }
}

static void op_append(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  struct sk_error e;
  struct sk_job *job = job_new(SK_JOB_APPEND, r, s);
  if (!job) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory");
    return;
  }
  bool lp = false;
  if (read_input(r, job, true, &e) < 0 || sk_msg_get_bool(r->map, "logprobs", &lp, &e) < 0 ||
      (job->want_logprobs = lp, session_enqueue(srv, s, job, &e)) < 0) {
    sk_job_free(job);
    sk_conn_send_error(r->conn, r->id, &e);
  }
}

/* chat's "messages": [{role, content}] copied into job (roles checked). */
static int read_messages(const struct request *r, struct sk_job *job, struct sk_error *e) {
  const msgpack_object_array *arr = NULL;
  int rc = sk_msg_get_array(r->map, "messages", &arr, e);
  if (rc < 0) return rc;
  if (rc == 0) return sk_error_set(e, SK_ERR_BAD_REQUEST, "missing field 'messages'");
  if (sk_msg_get(r->map, "prompt") || sk_msg_get(r->map, "tokens"))
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "chat takes 'messages', not 'prompt' or 'tokens'");
  struct sk_chat_msg m[SK_LIMIT_CONV_MSGS];
  if (arr->size > SK_LIMIT_CONV_MSGS)
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "field 'messages': %u messages, at most %u",
                        arr->size, SK_LIMIT_CONV_MSGS);
  for (uint32_t i = 0; i < arr->size; i++) {
    const msgpack_object *o = &arr->ptr[i];
    const char *role = NULL, *content = NULL;
    size_t rl = 0, cl = 0;
    if (o->type != MSGPACK_OBJECT_MAP ||
        sk_msg_get_str(o, "role", &role, &rl, e) != 1 ||
        sk_msg_get_str(o, "content", &content, &cl, e) != 1)
      return sk_error_set(e, SK_ERR_BAD_REQUEST,
                          "messages[%u] must be a map with strings 'role' and 'content'", i);
    m[i] = (struct sk_chat_msg){role, rl, content, cl};
  }
  if ((rc = sk_conv_check(m, arr->size, e)) < 0) return rc;
  job->chat_msgs = calloc(arr->size ? arr->size : 1, sizeof *job->chat_msgs);
  if (!job->chat_msgs) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
  for (uint32_t i = 0; i < arr->size; i++) {
    struct sk_conv_msg *d = &job->chat_msgs[i];
    d->role = strndup(m[i].role, m[i].role_len);
    d->content = malloc(m[i].content_len + 1);
    job->n_chat++;
    if (!d->role || !d->content) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
    d->role_len = m[i].role_len;
    if (m[i].content_len) memcpy(d->content, m[i].content, m[i].content_len);
    d->content[m[i].content_len] = 0;
    d->content_len = m[i].content_len;
  }
  job->chat = true;
  job->eot = -1;
  return 0;
}

static void generate_request(struct sk_server *srv, const struct request *r, bool chat);

static void op_generate(struct sk_server *srv, const struct request *r) {
  generate_request(srv, r, false);
}

/* chat: a generate whose input is messages formatted with the session's
 * chat template (sk_session_chat_begin), ending at its end of turn. */
static void op_chat(struct sk_server *srv, const struct request *r) {
  generate_request(srv, r, true);
}

static void generate_request(struct sk_server *srv, const struct request *r, bool chat) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  struct sk_error e;
  struct sk_job *job = job_new(SK_JOB_GENERATE, r, s);
  if (!job) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory");
    return;
  }
  uint64_t u;
  double d;
  bool bv;
  int rc;
  const uint32_t n_vocab = sk_model_config(srv->model)->n_vocab;
  job->max_tokens = SK_GENERATE_DEFAULT_MAX_TOKENS;
  job->sampling.temperature = (float)SK_GENERATE_DEFAULT_TEMPERATURE;
  job->sampling.top_k = SK_GENERATE_DEFAULT_TOP_K;
  job->sampling.top_p = (float)SK_GENERATE_DEFAULT_TOP_P;
  if ((rc = chat ? read_messages(r, job, &e) : read_input(r, job, false, &e)) < 0) goto bad;
  if (chat && s->conv.tmpl == SK_CHAT_NONE) {
    rc = srv->chat_error[0]
             ? sk_error_set(&e, SK_ERR_BAD_REQUEST, "%s", srv->chat_error)
             : sk_error_set(&e, SK_ERR_BAD_REQUEST,
                            "session %llu has no chat template (the model has none): open it "
                            "with chat_template, or start sinkd with --chat-template",
                            (unsigned long long)s->id);
    goto bad;
  }
  if ((rc = sk_msg_get_u64(r->map, "max_tokens", SK_WIRE_MAX_TOKENS, &u, &e)) < 0) goto bad;
  if (rc == 1) job->max_tokens = (uint32_t)u;
  if ((rc = sk_msg_get_f64(r->map, "temperature", &d, &e)) < 0) goto bad;
  if (rc == 1) job->sampling.temperature = (float)d;
  if ((rc = sk_msg_get_u64(r->map, "top_k", UINT32_MAX, &u, &e)) < 0) goto bad;
  if (rc == 1) job->sampling.top_k = u < n_vocab ? (uint32_t)u : 0; /* all: off */
  if ((rc = sk_msg_get_f64(r->map, "top_p", &d, &e)) < 0) goto bad;
  if (rc == 1) job->sampling.top_p = (float)d;
  if ((rc = sk_msg_get_u64(r->map, "seed", UINT64_MAX, &u, &e)) < 0) goto bad;
  if (rc == 1) {
    job->sampling.seed = u;
    job->has_seed = true;
  } /* else: the session's PRNG stream goes on (compute.c) */
  if ((rc = sk_msg_get_bool(r->map, "ignore_eos", &bv, &e)) < 0) goto bad;
  if (rc == 1) job->ignore_eos = bv;
  if ((rc = sk_msg_get_u64(r->map, "n_top", SK_WIRE_MAX_TOP, &u, &e)) < 0) goto bad;
  if (rc == 1) job->n_top = (uint32_t)u;
  if ((rc = sk_sampler_params_check(&job->sampling, &e)) < 0) goto bad;
  const msgpack_object_array *stops = NULL;
  if ((rc = sk_msg_get_array(r->map, "stop", &stops, &e)) < 0) goto bad;
  if (rc == 1) {
    if (stops->size > SK_LIMIT_STOP_COUNT) {
      rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "field 'stop': %u strings given, at most %u",
                        stops->size, SK_LIMIT_STOP_COUNT);
      goto bad;
    }
    for (uint32_t i = 0; i < stops->size; i++) {
      const msgpack_object *o = &stops->ptr[i];
      if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 ||
          o->via.str.size > SK_LIMIT_STOP_LEN || memchr(o->via.str.ptr, 0, o->via.str.size)) {
        rc = sk_error_set(&e, SK_ERR_BAD_REQUEST,
                          "field 'stop': element %u must be a non-empty string of at most %u bytes",
                          i, SK_LIMIT_STOP_LEN);
        goto bad;
      }
      job->stop[i] = strndup(o->via.str.ptr, o->via.str.size);
      if (!job->stop[i]) {
        rc = sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
        goto bad;
      }
      job->n_stop++;
    }
  }
  if ((rc = session_enqueue(srv, s, job, &e)) < 0) goto bad;
  return;
bad:
  sk_job_free(job);
  sk_conn_send_error(r->conn, r->id, &e);
}

/* ---- persistence: resume, fork, export, import ---- */

/* Ten fields describing a session: id, policy, capacity, kv_bytes,
 * kv_type, resident, seen, evicted, commit, adopted. */
/* The reply of resume, fork (from: the source) and import (received: the
 * image's bytes) about session s. */
static void send_session_summary(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                                 const struct sk_session *s, uint64_t from, uint64_t received) {
  struct sk_session_counters cnt;
  sk_session_counters_get(&srv->sessions, s, &cnt);
  struct sk_session_summary v = {.session = s->id,
                                 .capacity = s->capacity,
                                 .kv_bytes = s->tensor_bytes, .object_bytes = s->kv_bytes,
                                 .resident = cnt.resident,
                                 .seen = cnt.seen,
                                 .evicted = cnt.evicted,
                                 .commit = cnt.commit,
                                 .adopted = s->adopted,
                                 .from = from};
  snprintf(v.policy, sizeof v.policy, "%s", sk_policy_name(s->params.policy));
  snprintf(v.kv_type, sizeof v.kv_type, "%s", sk_kv_type_name(s->kv_type));
  struct sk_msgbuf b;
  if (sk_wire_pack_summary(&b, req_id, &v, received) == 0) sk_conn_send_msg(c, &b);
}

/* resume: the client picks a session up again by id (typically after the
 * daemon restarted and adopted it); the reply says where it stands. */
static void op_resume(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  send_session_summary(srv, r->conn, r->id, s, 0, 0);
}

/* fork and export wait for the jobs queued before them, then run here. */
static void op_queued_inline(struct sk_server *srv, const struct request *r,
                             enum sk_job_kind kind) {
  struct sk_session *s = req_session(srv, r);
  if (s) enqueue_plain(srv, r, s, kind);
}

/* Sends the next data events of the connection's exports while its output
 * has room; the final reply of each follows its last event. */
static void export_pump(struct sk_conn *c) {
  while (peer(c)->exports && sk_conn_has_room(c)) {
    struct export_stream *x = peer(c)->exports;
    struct sk_msgbuf b;
    if (x->off < x->len) {
      size_t n = x->len - x->off < SK_LIMIT_EXPORT_CHUNK ? x->len - x->off : SK_LIMIT_EXPORT_CHUNK;
      if (sk_wire_pack_data_event(&b, x->req_id, x->off, x->buf + x->off, n) < 0) return;
      x->off += n;
      sk_conn_send_msg(c, &b);
      continue;
    }
    if (sk_wire_pack_export(&b, x->req_id, x->session, x->len, x->resident, x->seen) == 0)
      sk_conn_send_msg(c, &b);
    peer(c)->exports = x->next;
    free(x->buf);
    free(x);
  }
}

/* The copy of a fork, export or import, in a worker thread: reads only
 * the held source session's object or the import's bytes, and makes a new
 * object under the held id (store.c: file creation is per id). */
static void copy_work_run(uv_work_t *req) {
  struct copy_work *w = req->data;
  struct sk_store *st = w->srv->sessions.store;
  switch (w->kind) {
  case COPY_FORK:
    w->rc = sk_store_fork(st, w->src->obj, w->id, w->uid, &w->obj, &w->err);
    break;
  case COPY_EXPORT:
    w->buf = malloc(w->len);
    if (!w->buf)
      w->rc = sk_error_set(&w->err, SK_ERR_NO_MEMORY, "out of memory for a %zu-byte export",
                           w->len);
    else
      sk_store_export(w->src->obj, w->buf, w->len);
    break;
  case COPY_IMPORT: {
    struct sk_store_image_info info;
    w->rc = sk_store_image_check(st, w->buf, w->len, &info, &w->err);
    if (w->rc == 0 && info.capacity > w->max_capacity)
      w->rc = sk_error_set(&w->err, SK_ERR_BAD_REQUEST,
                           "the exported session's capacity %u exceeds the maximum capacity %u",
                           info.capacity, w->max_capacity);
    if (w->rc == 0)
      w->rc = sk_store_import(st, w->buf, w->len, w->id, w->uid, &w->obj, &w->err);
    break;
  }
  }
}

/* The new session of a fork or import (w->obj) into the table, with the
 * reply; or the error. */
static void copy_finish_new(struct sk_server *srv, struct copy_work *w, struct sk_conn *c,
                            uint64_t req_id) {
  struct sk_error e;
  struct sk_session *ns = NULL;
  if (w->rc < 0) {
    sk_session_unhold(&srv->sessions, w->bytes);
    if (c) sk_conn_send_error(c, req_id, &w->err);
    return;
  }
  if (!c) { /* the client left: it never learns the id */
    sk_session_unhold(&srv->sessions, w->bytes);
    sk_store_obj_remove(w->obj);
    return;
  }
  if (sk_session_take_held(&srv->sessions, w->bytes, w->obj, &ns, &e) < 0) {
    sk_conn_send_error(c, req_id, &e);
    return;
  }
  /* An import's size is known once it is in: over the user's limits, it
   * goes (a fork's was checked before the copy). */
  if (w->kind == COPY_IMPORT && check_user_limits(srv, c->uid, ns->kv_bytes, ns, false, &e) < 0) {
    sk_session_free(&srv->sessions, ns);
    sk_conn_send_error(c, req_id, &e);
    return;
  }
  ns->last_used_ms = sk_clock_ms();
  counts_changed(srv);
  if (w->kind == COPY_FORK) {
    /* the conversation goes with the cache */
    struct sk_error ce;
    const char *dir = sk_store_dir(srv->cfg.store);
    if (w->src->conv.tmpl != SK_CHAT_NONE &&
        (sk_conv_save(&w->src->conv, dir, ns->id, &ce) < 0 ||
         sk_conv_load(&ns->conv, dir, ns->id, &ce) < 0))
      sk_log(SK_LOG_WARNING, "session %llu: conversation not copied: %s",
             (unsigned long long)ns->id, ce.message);
    sk_log(SK_LOG_INFO, "session %llu forked from session %llu by uid %u: %u resident tokens "
           "copied, %zu bytes",
           (unsigned long long)ns->id, (unsigned long long)w->src->id, c->uid,
           ns->kv->hdr->n_resident, ns->kv_bytes);
    send_session_summary(srv, c, req_id, ns, w->src->id, 0);
  } else {
    ns->conv.tmpl = srv->cfg.chat_template;
    sk_log(SK_LOG_INFO, "session %llu imported by uid %u: %zu bytes, %u resident tokens",
           (unsigned long long)ns->id, c->uid, w->len, ns->kv->hdr->n_resident);
    send_session_summary(srv, c, req_id, ns, 0, w->len);
  }
}

static void copy_work_done(uv_work_t *req, int status) {
  struct copy_work *w = req->data;
  struct sk_server *srv = w->srv;
  if (w->prev) w->prev->next = w->next; else srv->copies = w->next;
  if (w->next) w->next->prev = w->prev;
  if (status < 0 && w->rc == 0) {
    w->rc = sk_error_set(&w->err, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(status));
    if (w->obj) sk_store_obj_remove(w->obj);
  }
  /* The client, unless it left (or the daemon is stopping: nothing new). */
  struct sk_conn *c = w->kind == COPY_IMPORT ? w->conn : w->job->conn;
  if (c && (c->closing || srv->shutting_down)) c = NULL;
  uint64_t req_id = w->kind == COPY_IMPORT ? w->req_id : w->job->req_id;
  if (w->kind == COPY_EXPORT) {
    struct export_stream *x = NULL;
    if (w->rc < 0) {
      if (c) sk_conn_send_error(c, req_id, &w->err);
    } else if (c && (x = calloc(1, sizeof *x)) != NULL) {
      /* streamed as the output drains */
      x->req_id = req_id;
      x->session = w->src->id;
      x->buf = w->buf;
      x->len = w->len;
      x->resident = w->src->kv->hdr->n_resident;
      x->seen = w->src->kv->hdr->n_seen;
      w->buf = NULL;
      struct export_stream **tail = &peer(c)->exports;
      while (*tail) tail = &(*tail)->next;
      *tail = x;
      sk_log(SK_LOG_DEBUG, "session %llu exported: %zu bytes", (unsigned long long)x->session,
             x->len);
      export_pump(c);
    } else if (c) {
      sk_conn_send_errorf(c, req_id, SK_ERR_NO_MEMORY, "out of memory");
    }
    free(w->buf);
  } else {
    copy_finish_new(srv, w, c, req_id);
  }
  if (w->kind == COPY_IMPORT) {
    srv->import_bytes -= w->cap;
    free(w->buf);
    sk_conn_unref(w->conn);
  } else { /* the source session goes on with its queue (or closes) */
    w->src->running = NULL;
    w->src->last_used_ms = sk_clock_ms();
    sk_job_free(w->job);
    submit_next(srv, w->src);
  }
  free(w);
}

/* Queues w's copy. Errors: -SK_ERR_INTERNAL (thread pool). */
static int copy_queue(struct sk_server *srv, struct copy_work *w, struct sk_error *e) {
  w->srv = srv;
  w->req.data = w;
  int rc = uv_queue_work(srv->loop, &w->req, copy_work_run, copy_work_done);
  if (rc < 0) return sk_error_set(e, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(rc));
  w->next = srv->copies;
  if (srv->copies) srv->copies->prev = w;
  srv->copies = w;
  return 0;
}

/* Starts job (fork or export of the idle session s) in a worker, holding
 * s; true if started. Else the error is answered and the caller frees
 * job. */
static bool copy_start(struct sk_server *srv, struct sk_session *s, struct sk_job *job) {
  struct sk_conn *c = job->conn;
  struct sk_error e;
  struct copy_work *w = calloc(1, sizeof *w);
  if (!w) {
    sk_conn_send_errorf(c, job->req_id, SK_ERR_NO_MEMORY, "out of memory");
    return false;
  }
  w->kind = job->kind == SK_JOB_FORK ? COPY_FORK : COPY_EXPORT;
  w->src = s;
  w->job = job;
  w->uid = c->uid;
  if (w->kind == COPY_FORK) {
    w->bytes = s->kv_bytes;
    if (check_user_limits(srv, c->uid, s->kv_bytes, NULL, false, &e) < 0 ||
        sk_session_hold(&srv->sessions, w->bytes, &w->id, &e) < 0) {
      free(w);
      sk_conn_send_error(c, job->req_id, &e);
      return false;
    }
  } else {
    w->len = sk_store_export_size(s->obj);
  }
  if (copy_queue(srv, w, &e) < 0) {
    if (w->kind == COPY_FORK) sk_session_unhold(&srv->sessions, w->bytes);
    free(w);
    sk_conn_send_error(c, job->req_id, &e);
    return false;
  }
  s->running = job;
  return true;
}

/* import: the file comes in chunks {total, offset, data}; one import per
 * connection at a time, offset 0 starts it. The buffer grows with the
 * bytes received (a declared total never allocates by itself) and all
 * imports together stay under max_memory. */
static void op_import(struct sk_server *srv, const struct request *r) {
  struct sk_conn *c = r->conn;
  struct sk_error e;
  uint64_t total = 0, offset = 0;
  const char *data = NULL;
  size_t len = 0;
  if (sk_msg_need_u64(r->map, "total", SIZE_MAX, &total, &e) < 0 ||
      sk_msg_need_u64(r->map, "offset", SIZE_MAX, &offset, &e) < 0 ||
      sk_msg_need_str(r->map, "data", &data, &len, &e) < 0)
    goto bad;
  if (offset == 0) {
    if (peer(c)->import_buf || peer(c)->import_total) import_drop(srv, c);
    if (total > srv->sessions.max_bytes) {
      sk_error_set(&e, SK_ERR_BUSY,
                   "memory limit: a %llu-byte import exceeds max_memory %llu bytes",
                   (unsigned long long)total, (unsigned long long)srv->sessions.max_bytes);
      goto bad;
    }
    peer(c)->import_total = total;
  } else if (peer(c)->import_total == 0) {
    sk_error_set(&e, SK_ERR_BAD_REQUEST,
                 "no import in progress on this connection: the first chunk has offset 0");
    goto bad_drop;
  } else if (offset != peer(c)->import_len || total != peer(c)->import_total) {
    sk_error_set(&e, SK_ERR_BAD_REQUEST,
                 "import chunk at offset %llu of %llu bytes, expected offset %zu of %llu",
                 (unsigned long long)offset, (unsigned long long)total, peer(c)->import_len,
                 (unsigned long long)peer(c)->import_total);
    goto bad_drop;
  }
  if (len > total - offset) {
    sk_error_set(&e, SK_ERR_BAD_REQUEST,
                 "import chunk of %zu bytes at offset %llu goes past the total %llu", len,
                 (unsigned long long)offset, (unsigned long long)total);
    goto bad_drop;
  }
  size_t need = peer(c)->import_len + len;
  if (need > peer(c)->import_cap) {
    size_t ncap = peer(c)->import_cap * 2 > need ? peer(c)->import_cap * 2 : need;
    if (ncap > total) ncap = (size_t)total;
    if (srv->import_bytes + (ncap - peer(c)->import_cap) > srv->sessions.max_bytes) {
      sk_error_set(&e, SK_ERR_BUSY,
                   "memory limit: imports in progress would hold more than max_memory %llu "
                   "bytes",
                   (unsigned long long)srv->sessions.max_bytes);
      goto bad_drop;
    }
    char *nb = realloc(peer(c)->import_buf, ncap ? ncap : 1);
    if (!nb) {
      sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory for a %zu-byte import", ncap);
      goto bad_drop;
    }
    srv->import_bytes += ncap - peer(c)->import_cap;
    peer(c)->import_buf = nb;
    peer(c)->import_cap = ncap;
  }
  if (len) memcpy(peer(c)->import_buf + peer(c)->import_len, data, len);
  peer(c)->import_len += len;
  struct sk_msgbuf b;
  if (peer(c)->import_len < peer(c)->import_total) {
    if (sk_wire_pack_received(&b, r->id, peer(c)->import_len) == 0) sk_conn_send_msg(c, &b);
    return;
  }
  /* All in: checked and copied into a new session in a worker, which
   * takes the bytes over (still counted in import_bytes until done). */
  struct copy_work *w = calloc(1, sizeof *w);
  if (!w) {
    sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
    goto bad_drop;
  }
  if (sk_session_hold(&srv->sessions, 0, &w->id, &e) < 0) {
    free(w);
    goto bad_drop;
  }
  w->kind = COPY_IMPORT;
  w->conn = c;
  w->req_id = r->id;
  w->uid = c->uid;
  w->max_capacity = srv->cfg.max_capacity;
  w->buf = peer(c)->import_buf;
  w->len = peer(c)->import_len;
  w->cap = peer(c)->import_cap;
  if (copy_queue(srv, w, &e) < 0) {
    sk_session_unhold(&srv->sessions, 0);
    free(w);
    goto bad_drop;
  }
  sk_conn_ref(c);
  peer(c)->import_buf = NULL; /* w's now */
  peer(c)->import_len = peer(c)->import_cap = 0;
  peer(c)->import_total = 0;
  return;
bad_drop:
  import_drop(srv, c);
bad:
  sk_conn_send_error(c, r->id, &e);
}

/* ---- idle TTL ---- */

static void on_ttl(uv_timer_t *t);

/* (Re)starts the idle-TTL timer for cfg.idle_ttl_s, or stops it (0). */
static void ttl_timer_set(struct sk_server *srv) {
  uv_timer_stop(&srv->ttl_timer);
  if (srv->cfg.idle_ttl_s == 0) return;
  uint64_t tick = (uint64_t)srv->cfg.idle_ttl_s * 1000u / 4;
  if (tick < SK_LIMIT_TTL_TICK_MIN_MS) tick = SK_LIMIT_TTL_TICK_MIN_MS;
  if (tick > SK_LIMIT_TTL_TICK_MAX_MS) tick = SK_LIMIT_TTL_TICK_MAX_MS;
  uv_timer_start(&srv->ttl_timer, on_ttl, tick, tick);
}

static void on_ttl(uv_timer_t *t) {
  struct sk_server *srv = t->data;
  uint64_t now = sk_clock_ms(), ttl = (uint64_t)srv->cfg.idle_ttl_s * 1000u;
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    struct sk_session *s = srv->sessions.items[i];
    /* A temporary session ends with its connection instead. */
    if (!s || s->temp_conn || s->running || s->queue_head || s->closing ||
        now - s->last_used_ms < ttl)
      continue;
    sk_log(SK_LOG_INFO, "session %llu closed: idle for %llu s (idle_ttl %u s)",
           (unsigned long long)s->id, (unsigned long long)((now - s->last_used_ms) / 1000u),
           srv->cfg.idle_ttl_s);
    sk_session_free(&srv->sessions, s);
    counts_changed(srv);
  }
}

static void op_cancel(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  bool any = false;
  if (s->running && s->running->kind == SK_JOB_GENERATE) {
    atomic_store(&s->running->cancel, true);
    any = true;
  }
  for (struct sk_job *j = s->queue_head; j; j = j->next)
    if (j->kind == SK_JOB_GENERATE) {
      atomic_store(&j->cancel, true);
      any = true;
    }
  if (any) sk_compute_wake(srv->compute);
  struct sk_msgbuf b;
  if (sk_wire_pack_cancel(&b, r->id, any) == 0) sk_conn_send_msg(r->conn, &b);
}

/* tokenize/detokenize run on libuv's thread pool: the tokenizer is
 * read-only, and a megabyte of text must not stall the loop. */
struct tok_work {
  uv_work_t req;
  struct sk_server *srv;
  struct sk_conn *conn;
  uint64_t id;
  bool detok;
  char *text;
  size_t text_len;
  unsigned flags; /* SK_TOKENIZE_* */
  int32_t *tokens;
  size_t n_tokens;
  struct sk_error err;
  int rc;
};

static void tok_work_run(uv_work_t *req) {
  struct tok_work *w = req->data;
  if (w->detok) {
    char *out = NULL;
    size_t len = 0;
    w->rc = sk_tokenizer_decode(w->srv->tok, w->tokens, w->n_tokens, &out, &len, &w->err);
    if (w->rc == 0) {
      free(w->text);
      w->text = out;
      w->text_len = len;
    }
  } else {
    int32_t *toks = NULL;
    size_t n = 0;
    w->rc = sk_tokenizer_encode(w->srv->tok, w->text, w->text_len, w->flags, &toks, &n, &w->err);
    if (w->rc == 0) {
      free(w->tokens);
      w->tokens = toks;
      w->n_tokens = n;
    }
  }
}

static void tok_work_done(uv_work_t *req, int status) {
  struct tok_work *w = req->data;
  struct sk_conn *c = w->conn;
  if (status < 0) {
    w->rc = -SK_ERR_INTERNAL;
    sk_error_set(&w->err, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(status));
  }
  if (!c->closing) {
    if (w->rc < 0) {
      sk_conn_send_error(c, w->id, &w->err);
    } else {
      struct sk_msgbuf b;
      if ((w->detok ? sk_wire_pack_text(&b, w->id, w->text, w->text_len)
                    : sk_wire_pack_tokens(&b, w->id, w->tokens, w->n_tokens)) == 0)
        sk_conn_send_msg(c, &b);
    }
  }
  free(w->text);
  free(w->tokens);
  free(w);
  sk_conn_unref(c);
}

static void op_tokenize(struct sk_server *srv, const struct request *r, bool detok) {
  struct sk_error e;
  struct tok_work *w = calloc(1, sizeof *w);
  if (!w) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory");
    return;
  }
  w->srv = srv;
  w->conn = r->conn;
  w->id = r->id;
  w->detok = detok;
  int rc;
  if (detok) {
    const msgpack_object_array *arr = NULL;
    if ((rc = sk_msg_get_array(r->map, "tokens", &arr, &e)) <= 0) {
      if (rc == 0) sk_error_set(&e, SK_ERR_BAD_REQUEST, "missing field 'tokens'");
      goto bad;
    }
    w->tokens = malloc((arr->size ? arr->size : 1) * sizeof *w->tokens);
    if (!w->tokens) {
      sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
      goto bad;
    }
    for (uint32_t i = 0; i < arr->size; i++) {
      const msgpack_object *o = &arr->ptr[i];
      if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX) {
        w->tokens[i] = (int32_t)o->via.u64;
      } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN) {
        w->tokens[i] = (int32_t)o->via.i64; /* the tokenizer names it */
      } else {
        sk_error_set(&e, SK_ERR_BAD_REQUEST, "field 'tokens': element %u must be an integer token id", i);
        goto bad;
      }
    }
    w->n_tokens = arr->size;
  } else {
    const char *text = NULL;
    size_t len = 0;
    if (sk_msg_need_str(r->map, "text", &text, &len, &e) < 0) goto bad;
    bool bos = false, special = false;
    int has_bos = sk_msg_get_bool(r->map, "bos", &bos, &e);
    if (has_bos < 0) goto bad;
    /* Without "bos", the vocabulary's add_bos. Its add_eos is not
     * applied: tokens tokenized here are appended as prompts, and an EOS
     * at the end of a prompt would end it. */
    if (has_bos == 0)
      w->flags = sk_tokenizer_add_bos(srv->tok) ? SK_TOKENIZE_BOS : 0;
    else
      w->flags = bos ? SK_TOKENIZE_BOS : 0;
    if (sk_msg_get_bool(r->map, "parse_special", &special, &e) < 0) goto bad;
    if (special) w->flags |= SK_TOKENIZE_SPECIAL;
    w->text = malloc(len + 1);
    if (!w->text) {
      sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
      goto bad;
    }
    memcpy(w->text, text, len);
    w->text[len] = 0;
    w->text_len = len;
  }
  w->req.data = w;
  if ((rc = uv_queue_work(srv->loop, &w->req, tok_work_run, tok_work_done)) < 0) {
    sk_error_set(&e, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(rc));
    goto bad;
  }
  sk_conn_ref(r->conn);
  return;
bad:
  free(w->text);
  free(w->tokens);
  free(w);
  sk_conn_send_error(r->conn, r->id, &e);
}

static void op_fork(struct sk_server *srv, const struct request *r) {
  op_queued_inline(srv, r, SK_JOB_FORK);
}
static void op_export(struct sk_server *srv, const struct request *r) {
  op_queued_inline(srv, r, SK_JOB_EXPORT);
}
static void op_tokenize_text(struct sk_server *srv, const struct request *r) {
  op_tokenize(srv, r, false);
}
static void op_detokenize(struct sk_server *srv, const struct request *r) {
  op_tokenize(srv, r, true);
}

/* The op table: one row per op of sinkd/protocol.h's SK_OP_LIST, in its
 * order. Every op may come at any point of a connection (the protocol has
 * no handshake: hello is informative), so a row holds the handler only. */
struct op_entry {
  void (*handler)(struct sk_server *srv, const struct request *r);
};
static const struct op_entry op_table[SK_OP__COUNT] = {
    [SK_OP_PING] = {op_ping},           [SK_OP_HELLO] = {op_hello},
    [SK_OP_OPEN] = {op_open},           [SK_OP_CLOSE] = {op_close},
    [SK_OP_LIST] = {op_list},           [SK_OP_STATS] = {op_stats},
    [SK_OP_APPEND] = {op_append},       [SK_OP_GENERATE] = {op_generate},
    [SK_OP_CHAT] = {op_chat},           [SK_OP_CANCEL] = {op_cancel},
    [SK_OP_RESUME] = {op_resume},       [SK_OP_FORK] = {op_fork},
    [SK_OP_EXPORT] = {op_export},       [SK_OP_IMPORT] = {op_import},
    [SK_OP_TOKENIZE] = {op_tokenize_text}, [SK_OP_DETOKENIZE] = {op_detokenize},
};

/* The row of the op named by op[0..len), or NULL for an unknown name. */
static const struct op_entry *op_find(const char *op, size_t len) {
  int i = sk_op_from_name(op, len);
  return i >= 0 && op_table[i].handler ? &op_table[i] : NULL;
}

static void handle_frame(void *user, struct sk_conn *c, const uint8_t *body, size_t len) {
  struct sk_server *srv = user;
  struct sk_error e;
  if (len == 0) {
    sk_conn_send_errorf(c, 0, SK_ERR_BAD_REQUEST, "empty frame: a request is one msgpack map");
    return;
  }
  struct sk_msg msg;
  if (sk_msg_parse(body, len, &msg, &e) < 0) {
    sk_conn_send_error(c, 0, &e);
    return;
  }
  struct request r = {.conn = c, .id = 0, .map = &msg.root};
  if (sk_msg_need_u64(r.map, "id", UINT64_MAX, &r.id, &e) < 0) {
    sk_conn_send_error(c, 0, &e);
    goto out;
  }
  const char *op = NULL;
  size_t op_len = 0;
  if (sk_msg_need_str(r.map, "op", &op, &op_len, &e) < 0) {
    sk_conn_send_error(c, r.id, &e);
    goto out;
  }
  const struct op_entry *entry = op_find(op, op_len);
  if (entry) entry->handler(srv, &r);
  else {
    /* Show at most 32 bytes of the unknown name, escaped. */
    char shown[32 * 4 + 1];
    size_t w = 0;
    for (size_t i = 0; i < op_len && i < 32; i++) {
      unsigned char ch = (unsigned char)op[i];
      if (ch >= 0x20 && ch < 0x7f && ch != '\\') shown[w++] = (char)ch;
      else w += (size_t)snprintf(shown + w, 5, "\\x%02x", ch);
    }
    shown[w] = 0;
    sk_conn_send_errorf(c, r.id, SK_ERR_UNKNOWN_OP, "unknown op '%s%s'", shown, op_len > 32 ? "..." : "");
  }
out:
  sk_msg_free(&msg);
}

static struct sk_conn_limits conn_limits(const struct sk_server_config *cfg) {
  return (struct sk_conn_limits){
      .max_frame = cfg->max_frame,
      .admit = {.max_clients = cfg->max_clients,
                .max_user_clients = cfg->max_user_clients,
                .max_input = cfg->max_input_bytes,
                .max_user_input = cfg->max_user_input_bytes},
      .frame_timeout_s = cfg->frame_timeout_s};
}

int sk_server_attach(struct sk_server *srv, int fd, uint32_t uid, struct sk_error *err) {
  return sk_listen_attach(&srv->conns, fd, uid, err);
}

int sk_server_check_socket(const char *path, struct sk_error *err) {
  return sk_listen_check_socket(path, err);
}

static void on_adopt(void *user, struct sk_store_obj *obj) {
  struct sk_server *srv = user;
  struct sk_session *s = NULL;
  if (obj->flags & SK_STORE_TEMPORARY) {
    /* Its connection ended with the daemon that made it (which died:
     * a shutdown closes temporary sessions), so nobody can use it. */
    sk_log(SK_LOG_NOTICE, "session %llu of uid %u closed: temporary, and its connection ended "
           "with the previous daemon",
           (unsigned long long)obj->id, obj->owner_uid);
    srv->n_temp_closed++;
    sk_store_obj_remove(obj);
    return;
  }
  if (sk_session_adopt(&srv->sessions, obj, &s) < 0) {
    sk_log(SK_LOG_ERR, "out of memory adopting a session; its object stays for the next start");
    return;
  }
  s->last_used_ms = sk_clock_ms();
  srv->n_adopted++;
  /* Its conversation, if it held one; else the daemon's template. */
  struct sk_error ce;
  sk_conv_init(&s->conv, srv->cfg.chat_template);
  if (sk_conv_load(&s->conv, sk_store_dir(srv->cfg.store), s->id, &ce) < 0)
    sk_log(SK_LOG_WARNING, "session %llu: conversation not restored (it starts afresh): %s",
           (unsigned long long)s->id, ce.message);
  sk_log(SK_LOG_INFO, "session %llu adopted: uid %u, %s, %s, capacity %u, %u resident, "
         "%llu seen, commit %llu%s",
         (unsigned long long)s->id, s->owner_uid, sk_policy_name(s->params.policy),
         sk_kv_type_name(s->kv_type), s->capacity,
         s->kv->hdr->n_resident, (unsigned long long)s->kv->hdr->n_seen,
         (unsigned long long)sk_store_commit_count(s->obj),
         obj->dropped_step ? " (a step in progress when the daemon stopped was dropped)" : "");
}

static void on_skip(void *user, const char *name, enum sk_store_skip what, const char *dest,
                    const char *reason) {
  struct sk_server *srv = user;
  const char *dir = sk_store_dir(srv->cfg.store);
  switch (what) {
  case SK_STORE_SET_ASIDE:
    srv->n_set_aside++;
    sk_log(SK_LOG_WARNING, "state: %s/%s set aside as %s/%s: %s", dir, name, dir, dest, reason);
    break;
  case SK_STORE_REMOVED:
    sk_log(SK_LOG_NOTICE, "state: %s/%s removed: %s", dir, name, reason);
    break;
  case SK_STORE_KEPT:
    srv->n_set_aside++;
    sk_log(SK_LOG_WARNING, "state: %s/%s not adopted (and could not be moved aside): %s", dir,
           name, reason);
    break;
  }
}

int sk_server_start(uv_loop_t *loop, const struct sk_server_config *cfg,
                    const struct sk_model *m, const struct sk_tokenizer *tok,
                    struct sk_server **ret, struct sk_error *err) {
  struct sk_server *srv = calloc(1, sizeof *srv);
  if (!srv) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  srv->loop = loop;
  srv->cfg = *cfg;
  srv->model = m;
  srv->tok = tok;
  srv->started_ms = sk_clock_ms();
  if (cfg->chat_error) snprintf(srv->chat_error, sizeof srv->chat_error, "%s", cfg->chat_error);
  srv->cfg.chat_error = NULL;
  srv->start_max_sessions = cfg->max_sessions;
  srv->start_max_capacity = cfg->max_capacity;
  int rc = 0;
  if (sk_session_table_init(&srv->sessions, cfg->store, cfg->max_sessions,
                            cfg->max_memory ? cfg->max_memory : UINT64_MAX) < 0)
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  srv->sessions.release_obj = release_obj;
  srv->sessions.release_user = srv;
  if (rc == 0) {
    struct sk_store_scan_cb cb = {.adopt = on_adopt, .skip = on_skip, .user = srv};
    uint64_t max_id = 0;
    rc = sk_store_scan(cfg->store, &cb, &max_id, err);
    if (rc == 0 && max_id >= srv->sessions.next_id) srv->sessions.next_id = max_id + 1;
    if (rc == 0)
      sk_log(SK_LOG_NOTICE,
             "state directory %s: %u session%s adopted, %u set aside, %u temporary closed, %llu "
             "bytes",
             sk_store_dir(cfg->store), srv->n_adopted, srv->n_adopted == 1 ? "" : "s",
             srv->n_set_aside, srv->n_temp_closed, (unsigned long long)srv->sessions.bytes);
  }
  if (rc == 0)
    rc = sk_compute_start(loop, m, tok, &srv->sessions, cfg->max_batch, cfg->max_capacity,
                          cfg->threads ? cfg->threads : 1, on_event, srv, &srv->compute, err);
  if (rc == 0) sk_compute_set_sparse(srv->compute, cfg->sparse);
  if (rc == 0) {
    const struct sk_conn_hooks hooks = {.frame = handle_frame,
                                        .pause = on_conn_pause,
                                        .drain = on_conn_drain,
                                        .close = on_conn_close,
                                        .release = on_conn_release,
                                        .count = on_conn_count};
    const struct sk_conn_limits lim = conn_limits(cfg);
    sk_conns_init(&srv->conns, loop, &lim, &hooks, srv, sizeof(struct peer));
    rc = sk_listen_init(&srv->listen, loop, cfg->socket_path, cfg->listen_fd, &srv->conns, err);
    if (rc < 0) {
      sk_conns_stop(&srv->conns);
      sk_compute_stop(srv->compute);
      srv->compute = NULL;
    }
  }
  if (rc < 0) {
    /* A listener that failed is closing: let the loop finish that
     * (and the compute thread's handles) before srv goes away. */
    uv_run(loop, UV_RUN_NOWAIT);
    sk_conns_free(&srv->conns); /* zeroed if never initialised */
    sk_session_table_done(&srv->sessions);
    sk_listen_free(&srv->listen);
    free(srv);
    return rc;
  }
  uv_timer_init(loop, &srv->ttl_timer);
  srv->ttl_timer.data = srv;
  srv->ttl_running = true; /* the handle: closed at shutdown */
  ttl_timer_set(srv);

  *ret = srv;
  return 0;
}

void sk_server_reconfigure(struct sk_server *srv, const struct sk_server_config *cfg) {
  srv->cfg.max_frame = cfg->max_frame;
  srv->cfg.max_clients = cfg->max_clients;
  srv->cfg.max_sessions =
      cfg->max_sessions < srv->start_max_sessions ? cfg->max_sessions : srv->start_max_sessions;
  srv->cfg.max_capacity =
      cfg->max_capacity < srv->start_max_capacity ? cfg->max_capacity : srv->start_max_capacity;
  srv->cfg.max_memory = cfg->max_memory;
  srv->cfg.max_user_sessions = cfg->max_user_sessions;
  srv->cfg.max_user_kv_bytes = cfg->max_user_kv_bytes;
  srv->cfg.max_user_clients = cfg->max_user_clients;
  srv->cfg.max_input_bytes = cfg->max_input_bytes;
  srv->cfg.max_user_input_bytes = cfg->max_user_input_bytes;
  srv->cfg.frame_timeout_s = cfg->frame_timeout_s;
  const struct sk_conn_limits lim = conn_limits(&srv->cfg);
  sk_conns_set_limits(&srv->conns, &lim);
  srv->cfg.defaults = cfg->defaults;
  /* New limits apply to new sessions; open ones stay (even above them). */
  srv->sessions.max_sessions = srv->cfg.max_sessions;
  srv->sessions.max_bytes = cfg->max_memory ? cfg->max_memory : UINT64_MAX;
  if (cfg->idle_ttl_s != srv->cfg.idle_ttl_s) {
    srv->cfg.idle_ttl_s = cfg->idle_ttl_s;
    if (srv->ttl_running) ttl_timer_set(srv);
  }
}

void sk_server_shutdown(struct sk_server *srv) {
  if (srv->shutting_down) return;
  srv->shutting_down = true;
  if (srv->ttl_running) {
    uv_close((uv_handle_t *)&srv->ttl_timer, NULL);
    srv->ttl_running = false;
  }
  sk_listen_close(&srv->listen);
  /* Running jobs end cancelled; their final replies go out before the
   * connections close. */
  if (srv->compute) {
    sk_compute_stop(srv->compute);
    srv->compute = NULL;
  }
  sk_conns_stop(&srv->conns);
}

void sk_server_free(struct sk_server *srv) {
  if (!srv) return;
  sk_session_table_done(&srv->sessions);
  sk_conns_free(&srv->conns);
  sk_listen_free(&srv->listen);
  free(srv);
}
