/* The replies built from the daemon's state (see replies.h). */
#include "server/replies.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "model/chat.h"
#include "model/kernels.h"
#include "model/sparse.h"
#include "proto/wire.h"
#include "server/state.h"
#include "sk_config.h"
#include "sk_limits.h"

/* "compute" of hello and stats. */
static void compute_info(struct sk_server *srv, struct sk_compute_info *ret) {
  snprintf(ret->kernel, sizeof ret->kernel, "%s", sk_kernels_name());
  ret->threads = sk_scheduler_threads(srv->scheduler);
  ret->max_batch = srv->cfg.max_batch;
  snprintf(ret->kv_type, sizeof ret->kv_type, "%s", sk_kv_type_name(srv->cfg.kv_type));
}

/* The counts of "speculation": drafted, accepted, rejected, acceptance. */
static void spec_counts(struct sk_spec_info *ret, uint64_t drafted, uint64_t accepted) {
  ret->drafted = drafted;
  ret->accepted = accepted;
  ret->rejected = drafted - accepted;
  ret->acceptance = drafted ? (double)accepted / (double)drafted : 0.0;
}

/* "speculation" of hello and the daemon's stats: the defaults of
 * generates, the draft model and the totals since start. */
static void spec_info(struct sk_server *srv, struct sk_spec_info *ret) {
  snprintf(ret->mode, sizeof ret->mode, "%s", sk_spec_mode_name(srv->cfg.speculation));
  ret->draft_tokens = srv->cfg.draft_tokens;
  if (srv->cfg.draft)
    snprintf(ret->draft_model, sizeof ret->draft_model, "%s",
             sk_model_config(srv->cfg.draft)->name);
  ret->lookup_history = srv->cfg.lookup_history;
  uint64_t drafted, accepted;
  sk_scheduler_spec_totals(srv->scheduler, &drafted, &accepted);
  spec_counts(ret, drafted, accepted);
}

void sk_replies_hello(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id) {
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
  spec_info(srv, &h.speculation);
  struct sk_wire_hello_extra x = {
      .model_file = srv->cfg.model_path,
      /* the transposed down projections of the sparse MLP (0 without) */
      .sparse_weight_bytes = sk_model_sparse_bytes(srv->model),
      .sparsity_levels = srv->cfg.sparse ? srv->cfg.sparse->level : NULL,
      .n_sparsity_levels = srv->cfg.sparse ? srv->cfg.sparse->n_levels : 0,
  };
  struct sk_msgbuf b;
  if (sk_wire_pack_hello(&b, req_id, &h, &x) == 0) sk_conn_send_msg(conn, &b);
}

void sk_replies_daemon_stats(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id) {
  struct sk_msgbuf b;
  uint32_t user_n;
  uint64_t user_bytes;
  sk_session_user_usage(&srv->sessions, sk_conn_uid(conn), NULL, &user_n, &user_bytes);
  struct sk_daemon_stats st = {
      .steps = sk_scheduler_steps(srv->scheduler),
      .sessions = sk_session_table_count(&srv->sessions),
      .has_user = true,
      .user_sessions = user_n,
      .user_memory_bytes = user_bytes,
      .max_user_sessions = srv->cfg.max_user_sessions,
      .max_user_memory = srv->cfg.max_user_kv_bytes,
      .clients = sk_conns_count(&srv->conns),
      .uptime_s = (sk_clock_ms() - srv->started_ms) / 1000u,
      .tokens_prefilled = sk_scheduler_tokens_prefilled(srv->scheduler),
      .tokens_generated = sk_scheduler_tokens_generated(srv->scheduler),
      .max_sessions = sk_session_table_max_sessions(&srv->sessions),
      .memory_bytes = sk_session_table_bytes(&srv->sessions),
      .max_memory = sk_session_table_max_bytes(&srv->sessions),
      .adopted = srv->n_adopted,
      .set_aside = srv->n_set_aside,
      .idle_ttl_s = srv->cfg.idle_ttl_s,
      .weights_mapped_bytes = sk_model_mapped_bytes(srv->model),
      .weights_repacked_bytes = sk_model_repacked_bytes(srv->model),
  };
  compute_info(srv, &st.compute);
  spec_info(srv, &st.speculation);
  struct sk_wire_daemon_extra x = {
      .chat_template = sk_chat_name(srv->cfg.chat_template),
      .chat_template_error = srv->chat_error,
      .state_dir = sk_store_dir(srv->cfg.store),
  };
  if (sk_wire_pack_daemon_stats(&b, req_id, &st, &x) == 0) sk_conn_send_msg(conn, &b);
}

void sk_replies_list(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                     struct sk_session *const *sessions, size_t n) {
  const uint64_t now = sk_clock_ms(), now_unix = (uint64_t)time(NULL);
  struct sk_session_info *rows = calloc(n ? n : 1, sizeof *rows);
  if (!rows) {
    sk_conn_send_errorf(conn, req_id, SK_ERR_NO_MEMORY, "out of memory listing the sessions");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    struct sk_session_desc d;
    sk_session_describe(sessions[i], &d);
    struct sk_session_counters cnt;
    sk_session_counters_get(&srv->sessions, sessions[i], &cnt);
    struct sk_session_info *row = &rows[i];
    row->session = d.id;
    row->owner_uid = d.owner_uid;
    snprintf(row->policy, sizeof row->policy, "%s", sk_policy_name(d.params.policy));
    row->capacity = d.capacity;
    snprintf(row->kv_type, sizeof row->kv_type, "%s", sk_kv_type_name(d.kv_type));
    row->resident = cnt.resident;
    row->seen = cnt.seen;
    row->busy = d.busy;
    row->adopted = d.adopted;
    /* What `sinkctl list` needs to tell what can go: its memory, how old
     * it is, how long since it was last used (0 while busy). */
    row->kv_bytes = d.kv_bytes;
    row->object_bytes = d.object_bytes;
    row->age_s = now_unix > d.created_unix ? now_unix - d.created_unix : 0;
    row->idle_s = d.busy || d.queued ? 0 : (now - d.last_used_ms) / 1000u;
    row->temporary = d.temporary;
  }
  struct sk_msgbuf b;
  if (sk_wire_pack_list(&b, req_id, rows, n) == 0) sk_conn_send_msg(conn, &b);
  free(rows);
}

void sk_replies_open(struct sk_conn *conn, uint64_t req_id, const struct sk_session *s) {
  /* The parameters as the session keeps them: the cache header's pointer
   * moves between the object's two copies while a step runs. */
  struct sk_session_desc d;
  sk_session_describe(s, &d);
  const struct sk_kv_params *h = &d.params;
  struct sk_open_result o = {.session = d.id,
                             .capacity = d.capacity,
                             .kv_bytes = d.kv_bytes,
                             .object_bytes = d.object_bytes,
                             .n_sink = h->n_sink,
                             .window = h->window,
                             .heavy = h->heavy,
                             .recent = h->recent,
                             .rope_scale = h->rope_scale,
                             .pinned = h->n_pin};
  snprintf(o.policy, sizeof o.policy, "%s", sk_policy_name(h->policy));
  snprintf(o.kv_type, sizeof o.kv_type, "%s", sk_kv_type_name(d.kv_type));
  struct sk_msgbuf b;
  if (sk_wire_pack_open(&b, req_id, &o) == 0) sk_conn_send_msg(conn, &b);
}

void sk_replies_summary(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                        const struct sk_session *s, uint64_t from, uint64_t received) {
  struct sk_session_desc d;
  sk_session_describe(s, &d);
  struct sk_session_counters cnt;
  sk_session_counters_get(&srv->sessions, s, &cnt);
  struct sk_session_summary v = {.session = d.id,
                                 .capacity = d.capacity,
                                 .kv_bytes = d.kv_bytes,
                                 .object_bytes = d.object_bytes,
                                 .resident = cnt.resident,
                                 .seen = cnt.seen,
                                 .evicted = cnt.evicted,
                                 .commit = cnt.commit,
                                 .adopted = d.adopted,
                                 .from = from};
  snprintf(v.policy, sizeof v.policy, "%s", sk_policy_name(d.params.policy));
  snprintf(v.kv_type, sizeof v.kv_type, "%s", sk_kv_type_name(d.kv_type));
  struct sk_msgbuf b;
  if (sk_wire_pack_summary(&b, req_id, &v, received) == 0) sk_conn_send_msg(conn, &b);
}

/* The stream indices of the idle session s's resident tokens, in
 * cache-position order, as ranges (the first SK_LIMIT_STATS_RANGES): a
 * malloc'd array of *ret_n, or NULL when out of memory. */
static struct sk_range *resident_ranges(const struct sk_session *s, size_t *ret_n) {
  uint64_t first[SK_LIMIT_STATS_RANGES], last[SK_LIMIT_STATS_RANGES];
  uint32_t n = sk_session_resident_ranges(s, first, last, SK_LIMIT_STATS_RANGES);
  if (n > SK_LIMIT_STATS_RANGES) n = SK_LIMIT_STATS_RANGES;
  struct sk_range *r = calloc(n ? n : 1, sizeof *r);
  for (uint32_t k = 0; r && k < n; k++) r[k] = (struct sk_range){first[k], last[k]};
  *ret_n = n;
  return r;
}

/* The MLP sparsity of s: per layer (n_layer), the fraction of neurons
 * its sparse tokens skipped, into measured; its weight bytes per token
 * into *ret_bytes. Returns the tokens that ran sparse. */
static uint64_t sparsity_measured(struct sk_server *srv, const struct sk_session *s,
                                  uint32_t n_layer, uint64_t *kept, double *measured,
                                  double *ret_bytes) {
  const uint64_t sp_tokens = sk_session_sparse_get(&srv->sessions, s, kept);
  const struct sk_model_config *mc = sk_model_config(srv->model);
  for (uint32_t l = 0; sp_tokens && l < n_layer; l++)
    measured[l] = 1.0 - (double)kept[l] / ((double)sp_tokens * mc->hidden_dim);
  /* bytes of weights one of its tokens reads, on average (the model's
   * weight_bytes for a dense session) */
  *ret_bytes = (double)sk_model_weight_bytes(srv->model);
  if (sp_tokens) {
    double *mean = malloc(n_layer * sizeof *mean);
    if (mean) {
      for (uint32_t l = 0; l < n_layer; l++) mean[l] = (double)kept[l] / (double)sp_tokens;
      *ret_bytes = sk_model_sparse_step_bytes(srv->model, mean);
      free(mean);
    }
  }
  return sp_tokens;
}

/* The parts of a session's stats that are plain values. */
static void session_stats_fields(struct sk_server *srv, const struct sk_session_desc *d,
                                 const struct sk_session_counters *cnt,
                                 struct sk_session_stats *st) {
  /* Parameters from the session, never from the cache header, whose
   * pointer the compute thread moves between the object's two copies
   * while a step runs. */
  const struct sk_kv_params *h = &d->params;
  st->session = d->id;
  snprintf(st->chat_template, sizeof st->chat_template, "%s", sk_chat_name(d->chat_template));
  snprintf(st->policy, sizeof st->policy, "%s", sk_policy_name(h->policy));
  st->n_sink = h->n_sink;
  st->window = h->window;
  st->heavy = h->heavy;
  st->recent = h->recent;
  st->pinned = h->n_pin;
  st->rope_scale = h->rope_scale;
  st->model_rope_scale = 1.0 / sk_model_config(srv->model)->rope_scale;
  st->sparsity = h->sparsity;
  st->capacity = d->capacity;
  st->resident = cnt->resident;
  st->seen = cnt->seen;
  st->evicted = cnt->evicted;
  st->kv_bytes = d->kv_bytes;
  st->object_bytes = d->object_bytes;
  snprintf(st->kv_type, sizeof st->kv_type, "%s", sk_kv_type_name(d->kv_type));
  st->has_positions = cnt->resident > 0;
  st->position_first = 0;
  st->position_last = cnt->resident ? cnt->resident - 1 : 0;
  st->busy = d->busy;
  st->commit = cnt->commit;
  st->adopted = d->adopted;
  st->idle_s = (sk_clock_ms() - d->last_used_ms) / 1000u;
  snprintf(st->speculation.mode, sizeof st->speculation.mode, "%s",
           sk_spec_mode_name(h->spec_mode));
  st->speculation.draft_tokens = h->spec_tokens;
  st->speculation.draft_fixed = h->spec_fixed;
  spec_counts(&st->speculation, cnt->spec.drafted, cnt->spec.accepted);
}

void sk_replies_session_stats(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                              struct sk_session *s, bool tokens) {
  struct sk_session_desc d;
  sk_session_describe(s, &d);
  struct sk_session_counters cnt;
  sk_session_counters_get(&srv->sessions, s, &cnt);
  const uint32_t n_layer = d.n_layer;
  uint32_t probe = 0;
  float *mass = calloc(2 * (size_t)n_layer, sizeof *mass);
  if (!mass) {
    sk_conn_send_errorf(conn, req_id, SK_ERR_NO_MEMORY, "out of memory");
    return;
  }
  float *ent = mass + n_layer;
  const uint32_t steps = sk_session_attn_get(&srv->sessions, s, mass, ent, &probe);
  /* The resident set itself is read only while no job runs on the
   * session (the compute thread owns the cache meanwhile). */
  const bool idle = tokens || !d.busy;
  const uint32_t n_resident = idle ? sk_session_resident(s) : 0;
  struct sk_session_stats *st = calloc(1, sizeof *st); /* ~3 KiB */
  size_t n_ranges = 0;
  struct sk_range *ranges = idle ? resident_ranges(s, &n_ranges) : NULL;
  int32_t *ids = tokens ? calloc(n_resident ? n_resident : 1, sizeof *ids) : NULL;
  if (ids) sk_session_resident_tokens(s, ids);
  /* MLP sparsity: the tokens that ran sparse and, per layer, the neurons
   * they kept */
  uint64_t *kept = calloc(n_layer ? n_layer : 1, sizeof *kept);
  double *measured = calloc(n_layer ? n_layer : 1, sizeof *measured);
  if (!st || (idle && !ranges) || (tokens && !ids) || !kept || !measured) {
    sk_conn_send_errorf(conn, req_id, SK_ERR_NO_MEMORY, "out of memory");
  } else {
    st->sparse_tokens = sparsity_measured(srv, s, n_layer, kept, measured,
                                          &st->weight_bytes_per_token);
    session_stats_fields(srv, &d, &cnt, st);
    st->attn_steps = steps;
    st->sink_tokens = probe;
    struct sk_wire_session_extra x = {.owner_uid = d.owner_uid,
                                      .has_resident_ranges = idle,
                                      .ranges = ranges,
                                      .n_ranges = n_ranges,
                                      .sink_mass = mass,
                                      .entropy = ent,
                                      .n_layers = n_layer,
                                      .sparsity_measured = measured,
                                      .n_sparse_layers = st->sparse_tokens ? n_layer : 0,
                                      .has_tokens = tokens,
                                      .tokens = ids,
                                      .n_tokens = tokens ? n_resident : 0};
    struct sk_msgbuf b;
    if (sk_wire_pack_session_stats(&b, req_id, st, &x) == 0) sk_conn_send_msg(conn, &b);
  }
  free(measured);
  free(kept);
  free(ids);
  free(ranges);
  free(st);
  free(mass);
}

/* The bytes of token id's text ("" if it has none). */
static void token_bytes(const struct sk_tokenizer *tok, int32_t id, const char **ret,
                        size_t *ret_len) {
  struct sk_error e;
  if (sk_tokenizer_piece(tok, id, ret, ret_len, &e) < 0) {
    *ret = "";
    *ret_len = 0;
  }
}

void sk_replies_token(struct sk_conn *conn, const struct sk_tokenizer *tok, uint64_t req_id,
                      const struct sk_event *ev) {
  struct sk_top_pair top[SK_WIRE_MAX_TOP];
  for (uint32_t i = 0; i < ev->n_top; i++)
    top[i] = (struct sk_top_pair){ev->top_id[i], ev->top_logit[i]};
  struct sk_top_logprob toplp[SK_WIRE_MAX_TOP];
  for (uint32_t i = 0; i < ev->n_top_logprobs; i++) {
    toplp[i] = (struct sk_top_logprob){.token = ev->top_id[i], .logprob = ev->top_logprob[i]};
    token_bytes(tok, ev->top_id[i], &toplp[i].bytes, &toplp[i].bytes_len);
  }
  struct sk_token_event te = {.token = ev->token, .text = ev->text, .text_len = ev->text_len,
                              .top = top, .n_top = ev->n_top, .logprob = ev->logprob,
                              .top_logprobs = toplp, .n_top_logprobs = ev->n_top_logprobs};
  if (ev->has_logprob) token_bytes(tok, ev->token, &te.bytes, &te.bytes_len);
  struct sk_msgbuf b;
  if (sk_wire_pack_token_event(&b, req_id, &te) == 0) sk_conn_send_msg(conn, &b);
}

/* An evict log as a reply's ranges. */
static void evicted_ranges(const struct sk_evict_log *log, struct sk_range *ranges,
                           size_t *ret_n) {
  for (uint32_t i = 0; i < log->n_ranges; i++)
    ranges[i] = (struct sk_range){log->first[i], log->last[i]};
  *ret_n = log->n_ranges;
}

void sk_replies_job(struct sk_server *srv, const struct sk_job *job) {
  struct sk_session *s = job->sess;
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
                                   .drafted_tokens = job->drafted,
                                   .accepted_tokens = job->accepted,
                                   .evicted = job->evicted.n_evicted,
                                   .resident = cnt.resident,
                                   .seen = cnt.seen};
    snprintf(g.stop, sizeof g.stop, "%s", job->stop_reason ? job->stop_reason : "length");
    evicted_ranges(&job->evicted, g.ranges, &g.n_ranges);
    if (sk_wire_pack_generate(&b, job->req_id, &g, eog_text, eog_len, job->final_text,
                              job->final_text_len) == 0)
      sk_conn_send_msg(job->conn, &b);
  } else {
    struct sk_append_result a = {.n_tokens = job->n_done,
                                 .evicted = job->evicted.n_evicted,
                                 .resident = cnt.resident,
                                 .seen = cnt.seen};
    evicted_ranges(&job->evicted, a.ranges, &a.n_ranges);
    if (sk_wire_pack_append(&b, job->req_id, &a, lp ? job->logprobs : NULL) == 0)
      sk_conn_send_msg(job->conn, &b);
  }
}
