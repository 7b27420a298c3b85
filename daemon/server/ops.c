/* The op handlers: each reads its request's fields (sinkd-protocol(7)),
 * checks them and answers, queues a job on the session or hands work to
 * the thread pool (copy.c). Loop thread only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "model/chat.h"
#include "base/clock.h"
#include "session/conv.h"
#include "model/kernels.h"
#include "base/log.h"
#include "server/server_int.h"
#include "sk_config.h"
#include "sk_limits.h"
#include "model/sparse.h"
#include "proto/wire.h"

/* The open reply of session s. */
void sk__send_open_reply(struct sk_conn *c, uint64_t req_id, const struct sk_session *s) {
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

static struct sk_job *job_new(enum sk_job_kind kind, const struct request *r, struct sk_session *s);

static bool may_use(const struct sk_conn *c, const struct sk_session *s) {
  return c->uid == 0 || c->uid == s->owner_uid;
}

/* The session sid of request r. Sends the error and returns NULL if it is
 * unknown or not the caller's. */
static struct sk_session *session_of(struct sk_server *srv, const struct request *r,
                                     uint64_t sid) {
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
  sk_session_touch(s);
  return s;
}

/* Looks up the request's "session" field, read before any other (so a
 * request on a session that is not there is answered so). Sends the error
 * and returns NULL if it is missing, unknown or not the caller's. */
static struct sk_session *req_session(struct sk_server *srv, const struct request *r) {
  struct sk_error e;
  uint64_t sid = 0;
  if (sk_wire_unpack_session_req(r->map, &sid, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return NULL;
  }
  return session_of(srv, r, sid);
}

void sk__op_ping(struct sk_server *srv, const struct request *r) {
  (void)srv;
  struct sk_msgbuf b;
  if (sk_wire_pack_ok(&b, r->id) == 0) sk_conn_send_msg(r->conn, &b);
}

/* open's "sparsity": absent or 0 = dense, else one of the calibrated
 * levels (stored as the calibration's value). */
static int read_sparsity(struct sk_server *srv, const struct sk_wire_open_req *o, float *ret,
                         struct sk_error *e) {
  const double d = o->sparsity;
  if (!o->has_sparsity || d == 0.0) return 0;
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
  ret->threads = sk_scheduler_threads(srv->scheduler);
  ret->max_batch = srv->cfg.max_batch;
  snprintf(ret->kv_type, sizeof ret->kv_type, "%s", sk_kv_type_name(srv->cfg.kv_type));
}

void sk__op_hello(struct sk_server *srv, const struct request *r) {
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

/* open's "pin" (text, tokenized here with BOS first) or "pin_tokens" into
 * a malloc'd array (*ret NULL and *ret_n 0 when absent). */
static int read_pin(struct sk_server *srv, const struct sk_wire_open_req *o, int32_t **ret,
                    size_t *ret_n, struct sk_error *e) {
  *ret = NULL;
  *ret_n = 0;
  if (o->pin) {
    if (o->pin_len > SK_LIMIT_PIN_TEXT)
      return sk_error_set(e, SK_ERR_BAD_REQUEST, "field 'pin': %zu bytes, at most %u",
                          o->pin_len, SK_LIMIT_PIN_TEXT);
    return sk_tokenizer_encode(srv->tok, o->pin, o->pin_len,
                               sk_tokenizer_add_bos(srv->tok) ? SK_TOKENIZE_BOS : 0, ret, ret_n,
                               e);
  }
  const struct sk_wire_ids *ids = &o->pin_tokens;
  if (!ids->has) return 0;
  if (ids->n > srv->cfg.max_capacity)
    return sk_error_set(e, SK_ERR_BAD_REQUEST,
                        "field 'pin_tokens': %zu tokens exceed the maximum capacity %u", ids->n,
                        srv->cfg.max_capacity);
  const uint32_t n_vocab = sk_model_config(srv->model)->n_vocab;
  int32_t *t = malloc((ids->n ? ids->n : 1) * sizeof *t);
  if (!t) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
  for (size_t i = 0; i < ids->n; i++) {
    int64_t v;
    if (!sk_wire_ids_at(ids, i, &v) || v < 0 || v >= n_vocab) {
      free(t);
      return sk_error_set(e, SK_ERR_BAD_REQUEST,
                          "field 'pin_tokens': element %zu must be a token id in [0, %u)", i,
                          n_vocab);
    }
    t[i] = (int32_t)v;
  }
  *ret = t;
  *ret_n = ids->n;
  return 0;
}

/* Reads open's "chat_template" (a family name or a template text to
 * recognise) into conv->tmpl and "system" (the system prompt: rendered
 * with the template and tokenized, BOS first, as the pin; not with 'pin'
 * or 'pin_tokens', has_pin). */
static int read_chat(struct sk_server *srv, const struct sk_wire_open_req *o,
                     struct sk_conv *conv, bool has_pin, int32_t **ret_pin, size_t *ret_n,
                     struct sk_error *e) {
  const char *sys = o->system;
  const size_t sys_len = o->system_len;
  int rc;
  if (o->chat_template && (rc = sk_chat_resolve(o->chat_template, o->chat_template_len,
                                                "field 'chat_template'", &conv->tmpl, e)) < 0)
    return rc;
  if (!sys) return 0;
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

/* The session of a finished open: logged, and answered, or its pinned
 * prefix goes through the model first (the reply is sent once it is in
 * the cache, on_event). Takes pin. */
void sk__open_finish(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                        struct sk_session *s, int32_t *pin, size_t n_pin, struct sk_conv *conv) {
  sk_session_touch(s);
  /* The conversation (template, pinned system prompt) is the session's. */
  sk_session_set_conv(s, conv);
  if (s->conv.tmpl != SK_CHAT_NONE) {
    struct sk_error ce;
    if (sk_conv_save(&s->conv, sk_store_dir(srv->cfg.store), s->id, &ce) < 0)
      sk_log(SK_LOG_WARNING, "session %llu: conversation not saved: %s", (unsigned long long)s->id,
             ce.message);
  }
  sk__counts_changed(srv);
  sk_log(SK_LOG_INFO, "session %llu opened by uid %u: %s, capacity %u, %u pinned, %zu bytes (%s)",
         (unsigned long long)s->id, s->owner_uid, sk_policy_name(s->params.policy), s->capacity,
         s->params.n_pin, s->kv_bytes, sk_kv_type_name(s->kv_type));
  if (n_pin) {
    const struct request r = {.conn = c, .id = req_id, .map = NULL};
    struct sk_job *job = job_new(SK_JOB_APPEND, &r, s);
    if (!job) { /* answered */
      free(pin);
      sk_session_remove(&srv->sessions, s);
      sk__counts_changed(srv);
      return;
    }
    job->is_pin = true;
    job->bos = 0;
    job->tokens = pin;
    job->n_tokens = n_pin;
    sk__session_dispatch(srv, s, job);
    return;
  }
  free(pin);
  sk__send_open_reply(c, req_id, s);
}

void sk__op_open(struct sk_server *srv, const struct request *r) {
  struct sk_error e;
  struct sk_kv_params p = srv->cfg.defaults;
  struct sk_wire_open_req o;
  int32_t *pin = NULL;
  size_t n_pin = 0;
  struct sk_conv conv;
  sk_conv_init(&conv, srv->cfg.chat_template);
  int rc = sk_wire_unpack_open_req(r->map, &o, &e);
  if (rc < 0) goto bad;
  if (o.policy && (rc = sk_policy_parse(o.policy, o.policy_len, &p.policy, &e)) < 0) goto bad;
  if (o.has_n_sink) p.n_sink = o.n_sink;
  /* parameters given with a non-zero value, which the policy must have */
  const char *foreign = NULL;
  const char *name = sk_policy_name(p.policy);
  const unsigned parts = sk_policy_parts(name, strlen(name));
  const bool window_ok = parts & SK_PART_WINDOW, h2o_ok = parts & SK_PART_HEAVY;
  if (o.has_window) p.window = o.window;
  if (o.window && !window_ok) foreign = "window";
  if (o.has_heavy) p.heavy = o.heavy;
  if (o.heavy && !h2o_ok) foreign = "heavy";
  if (o.has_recent) p.recent = o.recent;
  if (o.recent && !h2o_ok) foreign = "recent";
  if (o.has_capacity) p.capacity = o.capacity;
  if (o.capacity && !(parts & SK_PART_CAPACITY)) foreign = "capacity";
  if (foreign) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "%s: policy %s%s has no such part", foreign, name,
                      o.policy ? "" : " (the daemon's default)");
    goto bad;
  }
  if (o.has_rope_scale) {
    const double d = o.rope_scale;
    /* kept as a float: a value that rounds to 0 (1e-50) is refused as 0 */
    if (!(d > 0.0 && d <= SK_KV_MAX_ROPE_SCALE) || !((float)d > 0.0f)) {
      rc = sk_error_set(&e, SK_ERR_BAD_REQUEST,
                        "rope_scale %.10g must be finite, > 0 (also as a 32-bit float) and <= %g",
                        d, (double)SK_KV_MAX_ROPE_SCALE);
      goto bad;
    }
    p.rope_scale = (float)d;
  }
  if ((rc = read_sparsity(srv, &o, &p.sparsity, &e)) < 0) goto bad;
  const bool temporary = o.temporary;
  if ((rc = read_pin(srv, &o, &pin, &n_pin, &e)) < 0) goto bad;
  if ((rc = read_chat(srv, &o, &conv, pin != NULL, &pin, &n_pin, &e)) < 0) goto bad;
  if (n_pin > UINT32_MAX) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "pin of %zu tokens is too long", n_pin);
    goto bad;
  }
  p.n_pin = (uint32_t)n_pin;
  /* The pin is the sink region of the policies that have one. */
  if (n_pin && !o.has_n_sink && (parts & SK_PART_SINKS)) p.n_sink = (uint32_t)n_pin;
  if (!(parts & SK_PART_SINKS) && o.has_n_sink && p.n_sink) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "n_sink %u: policy %s has no sinks", p.n_sink, name);
    goto bad;
  }

  /* The budget against the daemon's limit, then against the positions the
   * model can handle (sk_session_reserve repeats the first check). */
  if ((rc = sk_kv_params_check(&p, srv->cfg.max_capacity, &e)) < 0 ||
      (rc = sk_kv_params_check_context(&p, sk_model_config(srv->model)->n_ctx_train, &e)) < 0)
    goto bad;
  size_t bytes = sk_store_object_size(srv->sessions.store, sk_kv_params_capacity(&p));
  if (bytes && (rc = sk__check_user_limits(srv, r->conn->uid, bytes, NULL, temporary, &e)) < 0)
    goto bad;
  uint64_t seed;
  if (getrandom(&seed, sizeof seed, 0) != sizeof seed) seed = sk_clock_ms() ^ r->conn->id;
  if ((rc = sk_copy_open(srv, r->conn, r->id, &p, seed, temporary, pin, n_pin, &conv, &e)) < 0)
    goto bad;
  return;
bad:
  free(pin);
  sk_conv_free(&conv);
  sk_conn_send_error(r->conn, r->id, &e);
}

void sk__op_close(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  sk__session_close(srv, s);
  struct sk_msgbuf b;
  if (sk_wire_pack_ok(&b, r->id) == 0) sk_conn_send_msg(r->conn, &b);
}

static int session_id_cmp(const void *a, const void *b) {
  const struct sk_session *x = *(const struct sk_session *const *)a;
  const struct sk_session *y = *(const struct sk_session *const *)b;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* The caller's sessions, in ascending id order. */
void sk__op_list(struct sk_server *srv, const struct request *r) {
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
void sk__send_session_stats(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
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

static void enqueue_plain(struct sk_server *srv, const struct request *r, struct sk_session *s,
                          enum sk_job_kind kind);

void sk__op_stats(struct sk_server *srv, const struct request *r) {
  struct sk_msgbuf b;
  struct sk_error e;
  struct sk_wire_stats_req req;
  if (sk_wire_unpack_stats_req(r->map, &req, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  if (!req.has_session) {
    uint32_t user_n;
    uint64_t user_bytes;
    sk__user_usage(srv, r->conn->uid, NULL, &user_n, &user_bytes);
    struct sk_daemon_stats st = {
        .steps = sk_scheduler_steps(srv->scheduler),
        .sessions = srv->sessions.count,
        .has_user = true,
        .user_sessions = user_n,
        .user_memory_bytes = user_bytes,
        .max_user_sessions = srv->cfg.max_user_sessions,
        .max_user_memory = srv->cfg.max_user_kv_bytes,
        .clients = srv->conns.count,
        .uptime_s = (sk_clock_ms() - srv->started_ms) / 1000u,
        .tokens_prefilled = sk_scheduler_tokens_prefilled(srv->scheduler),
        .tokens_generated = sk_scheduler_tokens_generated(srv->scheduler),
        .max_sessions = srv->sessions.max_sessions,
        .memory_bytes = srv->sessions.bytes,
        .max_memory = srv->sessions.max_bytes,
        .adopted = srv->n_adopted,
        .set_aside = srv->n_set_aside,
        .idle_ttl_s = srv->cfg.idle_ttl_s,
        .weights_mapped_bytes = sk_model_mapped_bytes(srv->model),
        .weights_repacked_bytes = sk_model_repacked_bytes(srv->model),
    };
    compute_info(srv, &st.compute);
    struct sk_wire_daemon_extra x = {
        .chat_template = sk_chat_name(srv->cfg.chat_template),
        .chat_template_error = srv->chat_error,
        .state_dir = sk_store_dir(srv->cfg.store),
    };
    if (sk_wire_pack_daemon_stats(&b, r->id, &st, &x) < 0) return;
    sk_conn_send_msg(r->conn, &b);
    return;
  }
  struct sk_session *s = session_of(srv, r, req.session);
  if (!s) return;
  if (!req.tokens) {
    sk__send_session_stats(srv, r->conn, r->id, s, false);
    return;
  }
  enqueue_plain(srv, r, s, SK_JOB_STATS);
}

/* The input of an append or generate (its text or token ids, and "bos"
 * and "parse_special") copied into job. */
static int read_input(const struct sk_wire_input *in, struct sk_job *job, struct sk_error *e) {
  job->bos = in->bos;
  job->parse_special = in->parse_special;
  if (in->text) {
    job->text = malloc(in->text_len + 1);
    if (!job->text) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
    memcpy(job->text, in->text, in->text_len);
    job->text[in->text_len] = 0;
    job->text_len = in->text_len;
  }
  const struct sk_wire_ids *ids = &in->tokens;
  if (ids->has) {
    job->tokens = malloc((ids->n ? ids->n : 1) * sizeof *job->tokens);
    if (!job->tokens) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
    for (size_t i = 0; i < ids->n; i++) {
      int64_t v;
      if (!sk_wire_ids_at(ids, i, &v) || v > INT32_MAX)
        return sk_error_set(e, SK_ERR_BAD_REQUEST,
                            "field 'tokens': element %zu must be a token id (non-negative integer)", i);
      if (v < 0)
        return sk_error_set(e, SK_ERR_BAD_REQUEST,
                            "field 'tokens': element %zu is negative", i);
      job->tokens[i] = (int32_t)v;
    }
    job->n_tokens = ids->n;
  }
  return 0;
}

/* A job of `kind` for request r on session s, or NULL after answering
 * "out of memory" to r. */
static struct sk_job *job_new(enum sk_job_kind kind, const struct request *r, struct sk_session *s) {
  struct sk_job *j = calloc(1, sizeof *j);
  if (!j) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory");
    return NULL;
  }
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
  if (!job) return;
  if (sk__session_enqueue(srv, s, job, &e) < 0) {
    sk_job_free(job);
    sk_conn_send_error(r->conn, r->id, &e);
  }
}

void sk__op_append(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  struct sk_error e;
  struct sk_wire_append_req a;
  if (sk_wire_unpack_append_req(r->map, &a, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  struct sk_job *job = job_new(SK_JOB_APPEND, r, s);
  if (!job) return;
  job->want_logprobs = a.logprobs;
  if (read_input(&a.input, job, &e) < 0 || sk__session_enqueue(srv, s, job, &e) < 0) {
    sk_job_free(job);
    sk_conn_send_error(r->conn, r->id, &e);
  }
}

/* chat's messages copied into job (roles checked). */
static int read_messages(const struct sk_wire_msgs *msgs, struct sk_job *job, struct sk_error *e) {
  int rc;
  struct sk_chat_msg m[SK_LIMIT_CONV_MSGS];
  const size_t n = msgs->n;
  if (n > SK_LIMIT_CONV_MSGS)
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "field 'messages': %zu messages, at most %u", n,
                        SK_LIMIT_CONV_MSGS);
  for (size_t i = 0; i < n; i++) {
    const char *role = NULL, *content = NULL;
    size_t rl = 0, cl = 0;
    if (!sk_wire_msgs_at(msgs, i, &role, &rl, &content, &cl))
      return sk_error_set(e, SK_ERR_BAD_REQUEST,
                          "messages[%zu] must be a map with strings 'role' and 'content'", i);
    m[i] = (struct sk_chat_msg){role, rl, content, cl};
  }
  if ((rc = sk_conv_check(m, n, e)) < 0) return rc;
  job->chat_msgs = calloc(n ? n : 1, sizeof *job->chat_msgs);
  if (!job->chat_msgs) return sk_error_set(e, SK_ERR_NO_MEMORY, "out of memory");
  for (size_t i = 0; i < n; i++) {
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

void sk__op_generate(struct sk_server *srv, const struct request *r) {
  generate_request(srv, r, false);
}

/* chat: a generate whose input is messages formatted with the session's
 * chat template (sk_session_chat_begin), ending at its end of turn. */
void sk__op_chat(struct sk_server *srv, const struct request *r) {
  generate_request(srv, r, true);
}

static void generate_request(struct sk_server *srv, const struct request *r, bool chat) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  struct sk_error e;
  struct sk_wire_generate_req g;
  if (sk_wire_unpack_generate_req(r->map, chat, &g, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  struct sk_job *job = job_new(SK_JOB_GENERATE, r, s);
  if (!job) return;
  int rc;
  const uint32_t n_vocab = sk_model_config(srv->model)->n_vocab;
  if ((rc = chat ? read_messages(&g.messages, job, &e) : read_input(&g.input, job, &e)) < 0)
    goto bad;
  if (chat && s->conv.tmpl == SK_CHAT_NONE) {
    rc = srv->chat_error[0]
             ? sk_error_set(&e, SK_ERR_BAD_REQUEST, "%s", srv->chat_error)
             : sk_error_set(&e, SK_ERR_BAD_REQUEST,
                            "the model has no chat template: start sinkd with --chat-template "
                            "(or open the session with chat_template)");
    goto bad;
  }
  job->max_tokens = g.max_tokens;
  job->sampling.temperature = (float)g.temperature;
  job->sampling.top_k = g.top_k;
  if (g.has_top_k && g.top_k >= n_vocab) job->sampling.top_k = 0; /* all: off */
  job->sampling.top_p = (float)g.top_p;
  job->sampling.seed = g.seed;
  job->has_seed = g.has_seed; /* else the session's PRNG stream goes on (scheduler.c) */
  job->ignore_eos = g.ignore_eos;
  job->n_top = g.n_top;
  if ((rc = sk_sampler_params_check(&job->sampling, &e)) < 0) goto bad;
  if (g.stop.n > SK_LIMIT_STOP_COUNT) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "field 'stop': %zu strings given, at most %u",
                      g.stop.n, SK_LIMIT_STOP_COUNT);
    goto bad;
  }
  for (size_t i = 0; i < g.stop.n; i++) {
    const char *stop;
    size_t len;
    if (!sk_wire_strs_at(&g.stop, i, &stop, &len) || len == 0 || len > SK_LIMIT_STOP_LEN ||
        memchr(stop, 0, len)) {
      rc = sk_error_set(&e, SK_ERR_BAD_REQUEST,
                        "field 'stop': element %zu must be a non-empty string of at most %u bytes",
                        i, SK_LIMIT_STOP_LEN);
      goto bad;
    }
    job->stop[i] = strndup(stop, len);
    if (!job->stop[i]) {
      rc = sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
      goto bad;
    }
    job->n_stop++;
  }
  if ((rc = sk__session_enqueue(srv, s, job, &e)) < 0) goto bad;
  return;
bad:
  sk_job_free(job);
  sk_conn_send_error(r->conn, r->id, &e);
}

/* Ten fields describing a session: id, policy, capacity, kv_bytes,
 * kv_type, resident, seen, evicted, commit, adopted. */
/* The reply of resume, fork (from: the source) and import (received: the
 * image's bytes) about session s. */
void sk__send_session_summary(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
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
void sk__op_resume(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  sk__send_session_summary(srv, r->conn, r->id, s, 0, 0);
}

/* fork and export wait for the jobs queued before them, then run here. */
static void op_queued_inline(struct sk_server *srv, const struct request *r,
                             enum sk_job_kind kind) {
  struct sk_session *s = req_session(srv, r);
  if (s) enqueue_plain(srv, r, s, kind);
}

/* import: the file comes in chunks {total, offset, data} (copy.c puts
 * them together). */
void sk__op_import(struct sk_server *srv, const struct request *r) {
  struct sk_error e;
  struct sk_wire_import_req chunk;
  if (sk_wire_unpack_import_req(r->map, &chunk, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  sk_copy_import(srv, r->conn, r->id, chunk.total, chunk.offset, chunk.data, chunk.len);
}

void sk__op_cancel(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  bool any = sk_session_cancel_generate(s);
  if (any) sk_scheduler_wake(srv->scheduler);
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

static void tokenize_request(struct sk_server *srv, const struct request *r, bool detok) {
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
    struct sk_wire_ids ids;
    if (sk_wire_unpack_detokenize_req(r->map, &ids, &e) < 0) goto bad;
    w->tokens = malloc((ids.n ? ids.n : 1) * sizeof *w->tokens);
    if (!w->tokens) {
      sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
      goto bad;
    }
    for (size_t i = 0; i < ids.n; i++) {
      int64_t v;
      if (!sk_wire_ids_at(&ids, i, &v)) {
        sk_error_set(&e, SK_ERR_BAD_REQUEST,
                     "field 'tokens': element %zu must be an integer token id", i);
        goto bad;
      }
      if (v < INT32_MIN || v > INT32_MAX) {
        sk_error_set(&e, SK_ERR_BAD_REQUEST,
                     "field 'tokens': element %zu is not a token id of this model (0..%u)", i,
                     sk_model_config(srv->model)->n_vocab - 1u);
        goto bad;
      }
      w->tokens[i] = (int32_t)v; /* a negative one: the tokenizer names it */
    }
    w->n_tokens = ids.n;
  } else {
    struct sk_wire_input in;
    if (sk_wire_unpack_tokenize_req(r->map, &in, &e) < 0) goto bad;
    /* Without "bos", the vocabulary's add_bos. Its add_eos is not
     * applied: tokens tokenized here are appended as prompts, and an EOS
     * at the end of a prompt would end it. */
    if (in.bos < 0)
      w->flags = sk_tokenizer_add_bos(srv->tok) ? SK_TOKENIZE_BOS : 0;
    else
      w->flags = in.bos ? SK_TOKENIZE_BOS : 0;
    if (in.parse_special) w->flags |= SK_TOKENIZE_SPECIAL;
    w->text = malloc(in.text_len + 1);
    if (!w->text) {
      sk_error_set(&e, SK_ERR_NO_MEMORY, "out of memory");
      goto bad;
    }
    memcpy(w->text, in.text, in.text_len);
    w->text[in.text_len] = 0;
    w->text_len = in.text_len;
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

void sk__op_fork(struct sk_server *srv, const struct request *r) {
  op_queued_inline(srv, r, SK_JOB_FORK);
}
void sk__op_export(struct sk_server *srv, const struct request *r) {
  op_queued_inline(srv, r, SK_JOB_EXPORT);
}
void sk__op_tokenize(struct sk_server *srv, const struct request *r) {
  tokenize_request(srv, r, false);
}
void sk__op_detokenize(struct sk_server *srv, const struct request *r) {
  tokenize_request(srv, r, true);
}
