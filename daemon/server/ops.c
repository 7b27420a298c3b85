/* The op handlers (see ops.h). */
#include "server/ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "model/chat.h"
#include "model/kernels.h"
#include "model/sparse.h"
#include "proto/wire.h"
#include "server/copy.h"
#include "server/jobs.h"
#include "server/replies.h"
#include "server/state.h"
#include "session/conv.h"
#include "sk_limits.h"

/* One request being handled: its connection, id and msgpack map. */
struct request {
  struct sk_conn *conn;
  uint64_t id;
  const msgpack_object *map;
};

static bool may_use(const struct sk_conn *conn, const struct sk_session *s) {
  return sk_conn_uid(conn) == 0 || sk_conn_uid(conn) == sk_session_owner(s);
}

/* The session sid of request r. Sends the error and returns NULL if it is
 * unknown or not the caller's: the same error for both (no_such_session,
 * "no session N"), so that another user's ids cannot be told from ids
 * that do not exist (sinkd-protocol(7), USERS). */
static struct sk_session *session_of(struct sk_server *srv, const struct request *r,
                                     uint64_t sid) {
  struct sk_session *s = sk_session_find(&srv->sessions, sid);
  if (!s || sk_session_closing(s) || !may_use(r->conn, s)) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_SUCH_SESSION, "no session %llu",
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

static void op_ping(struct sk_server *srv, const struct request *r) {
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

/* The speculation fields of open, generate and chat: a mode this daemon
 * runs (draft needs its draft model, lookup its history), a number of
 * tokens (the wire checked 1..SK_SPEC_TOKENS_MAX) and fixed; absent ones
 * stay 0 (the session's, then the daemon's default). */
static int read_spec(struct sk_server *srv, const struct sk_wire_spec *w, uint32_t *ret_mode,
                     uint32_t *ret_tokens, bool *ret_fixed, struct sk_error *e) {
  if (w->mode) {
    int m = sk_spec_mode_parse(w->mode, w->mode_len);
    if (m <= SK_SPEC_DEFAULT)
      return sk_error_set(e, SK_ERR_BAD_REQUEST,
                          "speculation \"%.*s\"%s is not off, draft or lookup",
                          (int)(w->mode_len > 32 ? 32 : w->mode_len), w->mode,
                          w->mode_len > 32 ? "..." : "");
    if (m == SK_SPEC_DRAFT && !srv->cfg.draft)
      return sk_error_set(e, SK_ERR_BAD_REQUEST,
                          "speculation draft: this daemon has no draft model (sinkd.conf "
                          "draft_model, or --draft-model)");
    if (m == SK_SPEC_LOOKUP && !srv->cfg.lookup_history)
      return sk_error_set(e, SK_ERR_BAD_REQUEST,
                          "speculation lookup: this daemon keeps no history (sinkd.conf "
                          "lookup_history is 0)");
    *ret_mode = (uint32_t)m;
  }
  if (w->has_tokens) *ret_tokens = w->tokens;
  if (w->has_fixed) *ret_fixed = w->fixed;
  return 0;
}

static void op_hello(struct sk_server *srv, const struct request *r) {
  sk_replies_hello(srv, r->conn, r->id);
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
 * recognise) into conv->tmpl and "system" (the system prompt; not with
 * 'pin' or 'pin_tokens', has_pin). With pin_it (the policy has a sink
 * region) it is rendered with the template and tokenized, BOS first, as
 * the pin (*ret_pin, *ret_n); else the first chat renders it as text. */
static int read_chat(struct sk_server *srv, const struct sk_wire_open_req *o,
                     struct sk_conv *conv, bool has_pin, bool pin_it, int32_t **ret_pin,
                     size_t *ret_n, struct sk_error *e) {
  const char *sys = o->system;
  const size_t sys_len = o->system_len;
  int tmpl = srv->cfg.chat_template, rc;
  if (o->chat_template && (rc = sk_chat_resolve(o->chat_template, o->chat_template_len,
                                                "field 'chat_template'", &tmpl, e)) < 0)
    return rc;
  sk_conv_init(conv, tmpl); /* still empty */
  if (!sys) return 0;
  if (has_pin)
    return sk_error_set(e, SK_ERR_BAD_REQUEST,
                        "give either 'system' or 'pin'/'pin_tokens', not both");
  if (tmpl == SK_CHAT_NONE)
    return sk_error_set(e, SK_ERR_BAD_REQUEST,
                        "field 'system': the session has no chat template (give chat_template)");
  if (sys_len > SK_LIMIT_PIN_TEXT)
    return sk_error_set(e, SK_ERR_BAD_REQUEST, "field 'system': %zu bytes, at most %u", sys_len,
                        SK_LIMIT_PIN_TEXT);
  if ((rc = sk_conv_set_system(conv, sys, sys_len, e)) < 0 || !pin_it) return rc;
  struct sk_chat_text t;
  sk_chat_text_init(&t);
  if ((rc = sk_conv_system_text(conv, &t, e)) == 0 &&
      (rc = sk_session_chat_tokenize(srv->tok, &t, sk_tokenizer_add_bos(srv->tok), ret_pin,
                                    ret_n, e)) == 0)
    sk_conv_system_pinned(conv, &t, *ret_n);
  sk_chat_text_free(&t);
  return rc;
}

static void op_open(struct sk_server *srv, const struct request *r) {
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
  uint32_t spec_mode = 0, spec_tokens = 0;
  bool spec_fixed = false;
  if ((rc = read_spec(srv, &o.spec, &spec_mode, &spec_tokens, &spec_fixed, &e)) < 0) goto bad;
  p.spec_mode = (uint8_t)spec_mode;
  p.spec_tokens = (uint8_t)spec_tokens;
  p.spec_fixed = spec_fixed;
  const bool temporary = o.temporary;
  if ((rc = read_pin(srv, &o, &pin, &n_pin, &e)) < 0) goto bad;
  if ((rc = read_chat(srv, &o, &conv, pin != NULL, (parts & SK_PART_PIN) != 0, &pin, &n_pin,
                      &e)) < 0)
    goto bad;
  if (n_pin > UINT32_MAX) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "pin of %zu tokens is too long", n_pin);
    goto bad;
  }
  if (!(parts & SK_PART_SINKS) && o.has_n_sink && p.n_sink) {
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST, "n_sink %u: policy %s has no sinks", p.n_sink, name);
    goto bad;
  }
  if (o.system && n_pin) {
    /* A system prompt is pinned in full as the sinks, whatever n_sink
     * was, within the budget asked for (sk_kv_params_pin). */
    if ((rc = sk_kv_params_check(&p, srv->cfg.max_capacity, &e)) < 0 ||
        (rc = sk_kv_params_pin(&p, (uint32_t)n_pin, sk_session_pin_raise(p.policy), &p, &e)) < 0)
      goto bad;
  } else {
    p.n_pin = (uint32_t)n_pin;
    /* A pin is the sink region of the policies that have one; the window
     * is the one asked for. */
    if (n_pin && !o.has_n_sink && (parts & SK_PART_SINKS)) p.n_sink = (uint32_t)n_pin;
  }

  /* The budget against the daemon's limit, then against the positions the
   * model can handle (sk_session_reserve repeats the first check). */
  if ((rc = sk_kv_params_check(&p, srv->cfg.max_capacity, &e)) < 0 ||
      (rc = sk_kv_params_check_context(&p, sk_model_config(srv->model)->n_ctx_train, &e)) < 0)
    goto bad;
  size_t bytes = sk_store_object_size(srv->cfg.store, sk_kv_params_capacity(&p));
  if (bytes)
    bytes += sk_spec_bytes(&srv->sessions.spec_cfg, &p,
                           sk_spec_needs(&srv->sessions.spec_cfg, p.spec_mode));
  if (bytes && (rc = sk_session_check_user(&srv->sessions, sk_conn_uid(r->conn), bytes, NULL,
                                           temporary, &e)) < 0)
    goto bad;
  uint64_t seed;
  if (getrandom(&seed, sizeof seed, 0) != sizeof seed) seed = sk_clock_ms() ^ sk_conn_id(r->conn);
  if ((rc = sk_copy_open(srv, r->conn, r->id, &p, seed, temporary, pin, n_pin, &conv, &e)) < 0)
    goto bad;
  return;
bad:
  free(pin);
  sk_conv_free(&conv);
  sk_conn_send_error(r->conn, r->id, &e);
}

static void op_close(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  sk_jobs_close(srv, s);
  struct sk_msgbuf b;
  if (sk_wire_pack_ok(&b, r->id) == 0) sk_conn_send_msg(r->conn, &b);
}

static int session_id_cmp(const void *a, const void *b) {
  const uint64_t x = sk_session_id(*(const struct sk_session *const *)a);
  const uint64_t y = sk_session_id(*(const struct sk_session *const *)b);
  return x < y ? -1 : x > y;
}

/* The caller's sessions, in ascending id order. */
static void op_list(struct sk_server *srv, const struct request *r) {
  const uint32_t count = sk_session_table_count(&srv->sessions);
  struct sk_session **list = malloc((count ? count : 1) * sizeof *list);
  if (!list) {
    sk_conn_send_errorf(r->conn, r->id, SK_ERR_NO_MEMORY, "out of memory listing the sessions");
    return;
  }
  uint32_t n = 0;
  struct sk_session *s;
  for (uint32_t pos = 0; (s = sk_session_table_next(&srv->sessions, &pos)) != NULL;)
    if (!sk_session_closing(s) && may_use(r->conn, s)) list[n++] = s;
  qsort(list, n, sizeof *list, session_id_cmp);
  sk_replies_list(srv, r->conn, r->id, list, n);
  free(list);
}

static void enqueue_plain(struct sk_server *srv, const struct request *r, struct sk_session *s,
                          enum sk_job_kind kind);

static void op_stats(struct sk_server *srv, const struct request *r) {
  struct sk_error e;
  struct sk_wire_stats_req req;
  if (sk_wire_unpack_stats_req(r->map, &req, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  if (!req.has_session) {
    sk_replies_daemon_stats(srv, r->conn, r->id);
    return;
  }
  struct sk_session *s = session_of(srv, r, req.session);
  if (!s) return;
  if (!req.tokens) {
    sk_replies_session_stats(srv, r->conn, r->id, s, false);
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

/* Queues a job of `kind` that needs nothing from the request but the
 * session; answers the error itself. */
static void enqueue_plain(struct sk_server *srv, const struct request *r, struct sk_session *s,
                          enum sk_job_kind kind) {
  struct sk_error e;
  struct sk_job *job = sk_jobs_new(kind, r->conn, r->id, s);
  if (!job) return;
  if (sk_jobs_enqueue(srv, s, job, &e) < 0) {
    sk_job_free(job);
    sk_conn_send_error(r->conn, r->id, &e);
  }
}

static void op_append(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  struct sk_error e;
  struct sk_wire_append_req a;
  if (sk_wire_unpack_append_req(r->map, &a, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  struct sk_job *job = sk_jobs_new(SK_JOB_APPEND, r->conn, r->id, s);
  if (!job) return;
  job->want_logprobs = a.logprobs;
  if (read_input(&a.input, job, &e) < 0 || sk_jobs_enqueue(srv, s, job, &e) < 0) {
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
  struct sk_wire_generate_req g;
  if (sk_wire_unpack_generate_req(r->map, chat, &g, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  struct sk_job *job = sk_jobs_new(SK_JOB_GENERATE, r->conn, r->id, s);
  if (!job) return;
  int rc;
  const uint32_t n_vocab = sk_model_config(srv->model)->n_vocab;
  if ((rc = chat ? read_messages(&g.messages, job, &e) : read_input(&g.input, job, &e)) < 0)
    goto bad;
  if (chat && sk_session_chat_template(s) == SK_CHAT_NONE) {
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
  if (g.top_p > 0 && !((float)g.top_p > 0)) {
    /* Positive, but 0 to the sampler: the message gives the value sent. */
    rc = sk_error_set(&e, SK_ERR_BAD_REQUEST,
                      "top_p %g must be in (0, 1] (as a 32-bit float, which it rounds to 0)",
                      g.top_p);
    goto bad;
  }
  job->sampling.top_p = (float)g.top_p;
  job->sampling.seed = g.seed;
  job->has_seed = g.has_seed; /* else the session's PRNG stream goes on (scheduler.c) */
  job->ignore_eos = g.ignore_eos;
  job->n_top = g.n_top;
  job->token_logprobs = g.logprobs;
  job->top_logprobs = g.top_logprobs;
  if ((rc = read_spec(srv, &g.spec, &job->spec_mode, &job->spec_tokens, &job->spec_fixed, &e)) <
      0)
    goto bad;
  job->has_spec_fixed = g.spec.has_fixed;
  if ((rc = sk_session_spec_charge(&srv->sessions, s, job->spec_mode, &e)) < 0) goto bad;
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
  if ((rc = sk_jobs_enqueue(srv, s, job, &e)) < 0) goto bad;
  return;
bad:
  sk_job_free(job);
  sk_conn_send_error(r->conn, r->id, &e);
}

/* resume: the client picks a session up again by id (typically after the
 * daemon restarted and adopted it); the reply says where it stands. */
static void op_resume(struct sk_server *srv, const struct request *r) {
  struct sk_session *s = req_session(srv, r);
  if (!s) return;
  sk_replies_summary(srv, r->conn, r->id, s, 0, 0);
}

/* fork and export wait for the jobs queued before them, then run here. */
static void op_queued_inline(struct sk_server *srv, const struct request *r,
                             enum sk_job_kind kind) {
  struct sk_session *s = req_session(srv, r);
  if (s) enqueue_plain(srv, r, s, kind);
}

/* import: the file comes in chunks {total, offset, data} (copy.c puts
 * them together). */
static void op_import(struct sk_server *srv, const struct request *r) {
  struct sk_error e;
  struct sk_wire_import_req chunk;
  if (sk_wire_unpack_import_req(r->map, &chunk, &e) < 0) {
    sk_conn_send_error(r->conn, r->id, &e);
    return;
  }
  sk_copy_import(srv, r->conn, r->id, chunk.total, chunk.offset, chunk.data, chunk.len);
}

static void op_cancel(struct sk_server *srv, const struct request *r) {
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
  struct sk_conn *conn = w->conn;
  if (status < 0) {
    w->rc = -SK_ERR_INTERNAL;
    sk_error_set(&w->err, SK_ERR_INTERNAL, "thread pool: %s", uv_strerror(status));
  }
  if (!sk_conn_closing(conn)) {
    if (w->rc < 0) {
      sk_conn_send_error(conn, w->id, &w->err);
    } else {
      struct sk_msgbuf b;
      if ((w->detok ? sk_wire_pack_text(&b, w->id, w->text, w->text_len)
                    : sk_wire_pack_tokens(&b, w->id, w->tokens, w->n_tokens)) == 0)
        sk_conn_send_msg(conn, &b);
    }
  }
  free(w->text);
  free(w->tokens);
  free(w);
  sk_conn_unref(conn);
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

static void op_fork(struct sk_server *srv, const struct request *r) {
  op_queued_inline(srv, r, SK_JOB_FORK);
}
static void op_export(struct sk_server *srv, const struct request *r) {
  op_queued_inline(srv, r, SK_JOB_EXPORT);
}
static void op_tokenize(struct sk_server *srv, const struct request *r) {
  tokenize_request(srv, r, false);
}
static void op_detokenize(struct sk_server *srv, const struct request *r) {
  tokenize_request(srv, r, true);
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
    [SK_OP_TOKENIZE] = {op_tokenize}, [SK_OP_DETOKENIZE] = {op_detokenize},
};

/* The row of the op named by op[0..len), or NULL for an unknown name. */
static const struct op_entry *op_find(const char *op, size_t len) {
  int i = sk_op_from_name(op, len);
  return i >= 0 && op_table[i].handler ? &op_table[i] : NULL;
}

void sk_ops_frame(void *user, struct sk_conn *conn, const uint8_t *body, size_t len) {
  struct sk_server *srv = user;
  struct sk_error e;
  if (len == 0) {
    sk_conn_send_errorf(conn, 0, SK_ERR_BAD_REQUEST, "empty frame: a request is one msgpack map");
    return;
  }
  struct sk_msg msg;
  if (sk_msg_parse(body, len, &msg, &e) < 0) {
    sk_conn_send_error(conn, 0, &e);
    return;
  }
  struct request r = {.conn = conn, .id = 0, .map = &msg.root};
  const char *op = NULL;
  size_t op_len = 0;
  if (sk_wire_unpack_head(r.map, &r.id, &op, &op_len, &e) < 0) {
    sk_conn_send_error(conn, r.id, &e); /* id 0 when the id itself is bad */
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
    sk_conn_send_errorf(conn, r.id, SK_ERR_UNKNOWN_OP, "unknown op '%s%s'", shown, op_len > 32 ? "..." : "");
  }
out:
  sk_msg_free(&msg);
}
