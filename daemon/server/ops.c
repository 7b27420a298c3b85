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
  sk_session_touch(s);
  return s;
}

void sk__op_ping(struct sk_server *srv, const struct request *r) {
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
  if (!sk_msg_get(r->map, "session")) {
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
  struct sk_error e;
  bool tokens = false;
  if (sk_msg_get_bool(r->map, "tokens", &tokens, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  if (!tokens) {
    sk__send_session_stats(srv, r->conn, r->id, s, false);
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
  struct sk_job *job = job_new(SK_JOB_APPEND, r, s);
  if (!job) return;
  bool lp = false;
  if (read_input(r, job, true, &e) < 0 || sk_msg_get_bool(r->map, "logprobs", &lp, &e) < 0 ||
      (job->want_logprobs = lp, sk__session_enqueue(srv, s, job, &e)) < 0) {
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
  struct sk_job *job = job_new(SK_JOB_GENERATE, r, s);
  if (!job) return;
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
                            "the model has no chat template: start sinkd with --chat-template "
                            "(or open the session with chat_template)");
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
  } /* else: the session's PRNG stream goes on (scheduler.c) */
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
  uint64_t total = 0, offset = 0;
  const char *data = NULL;
  size_t len = 0;
  if (sk_msg_need_u64(r->map, "total", SIZE_MAX, &total, &e) < 0 ||
      sk_msg_need_u64(r->map, "offset", SIZE_MAX, &offset, &e) < 0 ||
      sk_msg_need_str(r->map, "data", &data, &len, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  sk_copy_import(srv, r->conn, r->id, total, offset, data, len);
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
      } else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
                 o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        sk_error_set(&e, SK_ERR_BAD_REQUEST,
                     "field 'tokens': element %u is not a token id of this model (0..%u)", i,
                     sk_model_config(srv->model)->n_vocab - 1u);
        goto bad;
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
