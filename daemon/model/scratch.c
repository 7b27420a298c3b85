/* The scratch of a forward call (model.h): every buffer a pass of up to
 * max_batch rows over caches of up to max_ctx positions writes, made
 * once per calling thread, and what the last pass left for the caller
 * (attention diagnostics, sparse MLP counts). */
#include <stdlib.h>

#include "model/model_int.h"

/* Positions and batches a scratch can be sized for. */
#define SK__MAX_SCRATCH_CTX SK_KV_MAX_CAPACITY

void sk_scratch_free(struct sk_scratch *s) {
  if (!s) return;
  float **bufs[] = {&s->x,   &s->xb,      &s->xb2, &s->q,   &s->k,
                    &s->v,   &s->att_out, &s->hb,  &s->hb2, &s->ad,
                    &s->rope_cos, &s->rope_sin, &s->row_cos, &s->row_sin,
                    &s->sink_cos, &s->sink_sin, &s->head_tmp};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(*bufs[i]);
  free(s->aq);
  free(s->k16);
  free(s->v16);
  free(s->as);
  free(s->aqk);
  free(s->adk);
  free(s->ask);
  free(s->rows);
  free(s->seqs);
  free(s->task_seq);
  free(s->task_kvh);
  free(s->mass_part);
  free(s->ent_part);
  free(s->sink_mass);
  free(s->entropy);
  free(s->probe);
  free(s->sp_kept);
  free(s->sp_rows);
  sk_sparse_work_free(&s->sp);
  if (s->ts) {
    for (uint32_t t = 0; t < s->n_threads; t++) {
      free(s->ts[t].kr);
      free(s->ts[t].kq);
      free(s->ts[t].qw);
      free(s->ts[t].qs);
      free(s->ts[t].att);
      free(s->ts[t].vp);
      free(s->ts[t].kp);
      free(s->ts[t].sp);
      free(s->ts[t].cs);
      free(s->ts[t].sn);
    }
    free(s->ts);
  }
  free(s);
}

int sk_scratch_new(const struct sk_model *m, uint32_t max_batch,
                   uint32_t max_ctx, struct sk_scratch **ret,
                   struct sk_error *err) {
  return sk_scratch_new_pool(m, max_batch, max_ctx, NULL, ret, err);
}

int sk_scratch_new_pool(const struct sk_model *m, uint32_t max_batch, uint32_t max_ctx,
                        struct sk_pool *pool, struct sk_scratch **ret, struct sk_error *err) {
  const struct sk_model_config *c = &m->cfg;
  if (max_batch == 0 || max_batch > SK__MAX_SCRATCH_CTX)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "max_batch %u is outside 1..%u", max_batch,
                        SK__MAX_SCRATCH_CTX);
  if (max_ctx == 0 || max_ctx > SK__MAX_SCRATCH_CTX)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "max_ctx %u is outside 1..%u", max_ctx,
                        SK__MAX_SCRATCH_CTX);
  struct sk_scratch *s = calloc(1, sizeof *s);
  if (!s) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate scratch");
  s->m = m;
  s->pool = pool;
  s->n_threads = sk_pool_threads(pool);
  s->max_batch = max_batch;
  s->max_ctx = max_ctx;
  /* Every product below is < 2^20 * 2^22 floats: fits size_t on 64-bit;
   * on 32-bit hosts malloc simply fails. */
  size_t B = max_batch, T = max_ctx;
  size_t wide = c->hidden_dim > c->dim ? c->hidden_dim : c->dim;
  if (c->q_dim > wide) wide = c->q_dim;
  size_t half = c->rope_dim / 2;
  struct {
    void **dst;
    size_t n, size;
  } want[] = {
      {(void **)&s->x, B * c->dim, 4},       {(void **)&s->xb, B * c->dim, 4},
      {(void **)&s->xb2, B * c->dim, 4},     {(void **)&s->q, B * c->q_dim, 4},
      {(void **)&s->k, B * c->kv_dim, 4},    {(void **)&s->v, B * c->kv_dim, 4},
      {(void **)&s->att_out, B * c->q_dim, 4}, {(void **)&s->hb, B * c->hidden_dim, 4},
      {(void **)&s->head_tmp, c->head_dim, 4},
      {(void **)&s->hb2, B * c->hidden_dim, 4},
      {(void **)&s->k16, B * c->kv_dim, 2},  {(void **)&s->v16, B * c->kv_dim, 2},
      {(void **)&s->aq, B * wide, 1},        {(void **)&s->ad, B * (wide / SK_QK + 1), 4},
      {(void **)&s->as, B * (wide / SK_QK + 1), 4},
      {(void **)&s->aqk, B * wide, 1},       {(void **)&s->adk, B * (wide / SK_QKK + 1), 4},
      {(void **)&s->ask, B * (wide / 16 + 1), 2},
      {(void **)&s->rows, 3 * B, sizeof(float *)},
      {(void **)&s->seqs, B, sizeof(struct sk__seq)},
      {(void **)&s->rope_cos, T * 2 * half, 4}, {(void **)&s->rope_sin, T * 2 * half, 4},
      {(void **)&s->row_cos, B * 2 * half, 4},  {(void **)&s->row_sin, B * 2 * half, 4},
      {(void **)&s->sink_cos, B * 2 * half, 4}, {(void **)&s->sink_sin, B * 2 * half, 4},
      {(void **)&s->ts, s->n_threads, sizeof(struct sk__tscratch)},
      {(void **)&s->task_seq, B * c->n_kv_head, sizeof(uint32_t)},
      {(void **)&s->task_kvh, B * c->n_kv_head, sizeof(uint32_t)},
      {(void **)&s->mass_part, B * c->n_kv_head, sizeof(double)},
      {(void **)&s->ent_part, B * c->n_kv_head, sizeof(double)},
      {(void **)&s->sink_mass, B * c->n_layer, sizeof(float)},
      {(void **)&s->entropy, B * c->n_layer, sizeof(float)},
      {(void **)&s->probe, B, sizeof(uint32_t)},
      {(void **)&s->sp_kept, B * c->n_layer, sizeof(uint64_t)},
      {(void **)&s->sp_rows, B, sizeof(uint32_t)},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (want[i].n > SIZE_MAX / want[i].size ||
        !(*want[i].dst = calloc(want[i].n, want[i].size)))
      goto nomem;
  }
  /* all the query heads' scores at once, unless that takes over 4 MB a
   * thread (long contexts): then as many KV heads' as fit, at least one;
   * the scores of up to SK__ATT_ROWS rows in 8 MB, at least one row's */
  const uint32_t group = c->n_head / c->n_kv_head;
  s->att_heads = c->n_head;
  if ((size_t)c->n_head * T * sizeof(float) > ((size_t)4 << 20)) {
    size_t fit = ((size_t)4 << 20) / (T * sizeof(float)) / group * group;
    s->att_heads = fit > group ? (uint32_t)fit : group;
  }
  const size_t per_row = (size_t)s->att_heads * T * sizeof(float);
  s->att_rows = ((size_t)8 << 20) / per_row >= SK__ATT_ROWS ? SK__ATT_ROWS
                : ((size_t)8 << 20) / per_row >= 1      ? (uint32_t)(((size_t)8 << 20) / per_row)
                                                         : 1;
  const size_t AR = s->att_rows, TP = T + SK__ATT_ROWS;
  for (uint32_t t = 0; t < s->n_threads; t++) {
    struct sk__tscratch *ts = &s->ts[t];
    if (!(ts->kr = malloc(T * c->head_dim * sizeof(float))) ||
        !(ts->kq = malloc(T * sizeof *ts->kq)) ||
        !(ts->qw = malloc(AR * s->att_heads * c->head_dim * sizeof(float))) ||
        !(ts->qs = malloc(AR * s->att_heads * c->head_dim * sizeof(float))) ||
        !(ts->att = malloc(AR * T * s->att_heads * sizeof(float))) ||
        !(ts->vp = malloc(TP * sizeof *ts->vp)) ||
        !(ts->kp = malloc(TP * sizeof *ts->kp)) || !(ts->sp = malloc(T * sizeof *ts->sp)) ||
        !(ts->cs = malloc(2 * half * sizeof(float))) ||
        !(ts->sn = malloc(2 * half * sizeof(float))))
      goto nomem;
    for (size_t p = 0; p < T; p++) ts->kq[p] = ts->kr + p * c->head_dim;
  }
  if (m->sparse) {
    int rc = sk_sparse_work_init(&s->sp, c->hidden_dim, c->dim, s->n_threads, err);
    if (rc < 0) {
      sk_scratch_free(s);
      return rc;
    }
  }
  s->rope_valid = 0;
  s->rope_freq_scale = 0.0f;
  *ret = s;
  return 0;
nomem:
  sk_scratch_free(s);
  return sk_error_set(err, SK_ERR_NO_MEMORY,
                      "cannot allocate scratch for batch %u, context %u",
                      max_batch, max_ctx);
}
void sk_scratch_set_gate_probe(struct sk_scratch *s, sk_scratch_gate_fn fn, void *user) {
  s->gate_fn = fn;
  s->gate_user = user;
}

bool sk_scratch_sparse(const struct sk_scratch *s, uint32_t seq, const uint64_t **ret_kept,
                       uint32_t *ret_rows) {
  if (seq >= s->attn_n_seqs) return false;
  *ret_kept = s->sp_kept + (size_t)seq * s->m->cfg.n_layer;
  *ret_rows = s->sp_rows[seq];
  return true;
}

bool sk_scratch_attn(const struct sk_scratch *s, uint32_t seq, const float **ret_sink_mass,
                     const float **ret_entropy, uint32_t *ret_probe) {
  if (seq >= s->attn_n_seqs) return false;
  const uint32_t L = s->m->cfg.n_layer;
  *ret_sink_mass = s->sink_mass + (size_t)seq * L;
  *ret_entropy = s->entropy + (size_t)seq * L;
  *ret_probe = s->probe[seq];
  return true;
}
