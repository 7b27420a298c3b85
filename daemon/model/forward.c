/* The forward pass of the llama, qwen2 and qwen3 architectures (see
 * model.h): embedding lookup, per layer the attention block and the FFN
 * block, the final norm and the logits.
 *
 * Numerics follow llama.cpp's CPU backend (ggml) where the order of
 * floating-point operations is visible in the result: RMSNorm (of the
 * residual stream, and of each query and key head for qwen3) sums squares
 * in double and scales by a float 1/sqrtf(mean + eps) before the weight;
 * RoPE builds its angles in float as theta = pos * theta_scale^i by
 * repeated multiplication; attention scores are scaled after the dot
 * product and the softmax subtracts the max and sums in double; SiLU is
 * x / (1 + expf(-x)). Matrix products and attention dot products go
 * through kernels.c; their summation order differs from ggml's, which
 * moves F32 logits by ~1e-6.
 *
 * Batching: one call runs any number of sequences (sessions) together.
 * Their rows are stacked, so each weight matrix is read once per call for
 * all of them; attention is per sequence and per KV head. Every row's
 * result depends only on its own sequence (see kernels.h, Determinism).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "model/model_int.h"
#include "model/quant.h"

/* Output rows per matrix-product task: a multiple of the packed kernels'
 * groups (8 or 16 rows), and large enough that a task outweighs handing
 * it out. */
#define SK__MM_ALIGN 16u

/* ---- RMSNorm --------------------------------------------------------- */

/* y = (x * 1/sqrtf(mean(x^2) + eps)) * w, as ggml_rms_norm then ggml_mul. */
static void sk__rmsnorm(float *y, const float *x, const float *w, uint32_t n,
                        float eps) {
  double sum = 0.0;
  for (uint32_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
  const float mean = (float)(sum / n);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (uint32_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

/* sk__rmsnorm of rows rows of x (stride ld) into y (stride ld): the sums
 * of 8 rows side by side, each in its own order, as 8 chains of double
 * additions instead of one (a row's sum alone is bound by the latency of
 * its additions). */
static void sk__rmsnorm_rows(float *y, const float *x, size_t ld, const float *w, uint32_t rows,
                             uint32_t n, float eps) {
  uint32_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    double sum[8] = {0};
    for (uint32_t j = 0; j < n; j++)
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
        const float v = x[(i + (uint32_t)r) * ld + j];
        sum[r] += (double)(v * v);
      }
    for (int r = 0; r < 8; r++) {
      const float mean = (float)(sum[r] / n);
      const float scale = 1.0f / sqrtf(mean + eps);
      const float *xr = x + (i + (uint32_t)r) * ld;
      float *yr = y + (i + (uint32_t)r) * ld;
      for (uint32_t j = 0; j < n; j++) yr[j] = (xr[j] * scale) * w[j];
    }
  }
  for (; i < rows; i++) sk__rmsnorm(y + i * ld, x + i * ld, w, n, eps);
}

/* ---- matrix products on the pool ------------------------------------ */

/* Up to three products sharing one input: y_j = x W_j^T. */
struct sk__mm {
  const struct sk_act *x;
  uint32_t n_w;
  const struct sk_wmat *w[3];
  float *const *y[3];    /* (x->n) row pointers each */
  uint32_t chunk;        /* output rows per task */
  uint32_t first[4];     /* first task of each product; first[n_w] = total */
};

static void sk__mm_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__mm *mm = ctx;
  uint32_t j = 0;
  while (task >= mm->first[j + 1]) j++;
  uint32_t o0 = (task - mm->first[j]) * mm->chunk;
  uint32_t o1 = o0 + mm->chunk < mm->w[j]->rows ? o0 + mm->chunk : mm->w[j]->rows;
  sk_kernels_matmul(mm->w[j], mm->x, mm->y[j], o0, o1);
}

/* Runs the products of mm (x, w, y, n_w set) on the pool: the outputs are
 * cut into chunks of SK__MM_ALIGN-multiple rows, about four per thread. */
static void sk__matmuls(struct sk_scratch *s, struct sk__mm *mm) {
  uint64_t total = 0;
  for (uint32_t j = 0; j < mm->n_w; j++) total += mm->w[j]->rows;
  uint64_t per = s->n_threads == 1 ? total : total / (4u * s->n_threads) + 1;
  per = (per + SK__MM_ALIGN - 1) / SK__MM_ALIGN * SK__MM_ALIGN;
  mm->chunk = (uint32_t)(per < UINT32_MAX ? per : UINT32_MAX - SK__MM_ALIGN);
  mm->first[0] = 0;
  for (uint32_t j = 0; j < mm->n_w; j++)
    mm->first[j + 1] = mm->first[j] + (mm->w[j]->rows + mm->chunk - 1) / mm->chunk;
  sk_pool_run(s->pool, sk__mm_task, mm, mm->first[mm->n_w]);
}

/* The int8 activations products with some of ws[0..n_w) need: SK__Q8
 * (32-element blocks, legacy types) and/or SK__Q8K (Q8_K, K-quants and
 * IQ4_XS: a file mixes them), or 0. */
#define SK__Q8 1u
#define SK__Q8K 2u
static unsigned sk__any_q8(const struct sk_wmat *const *ws, uint32_t n_w) {
  unsigned q = 0;
  for (uint32_t j = 0; j < n_w; j++)
    q |= (sk_wmat_needs_q8(ws[j]) ? SK__Q8 : 0u) | (sk_wmat_needs_q8k(ws[j]) ? SK__Q8K : 0u);
  return q;
}

/* Rows per task of the row-wise work done on the pool (sk__prep, silu):
 * the rows spread over the threads, at most 8 (the rows sk__rmsnorm_rows
 * sums side by side; fewer give the same bits, sk__rmsnorm's). */
static uint32_t sk__prep_rows(const struct sk_scratch *s, uint32_t n) {
  const uint32_t per = (n + s->n_threads - 1) / s->n_threads; /* >= 1: n >= 1 */
  return per > 8 ? 8 : per;
}

/* Quantizes rows r0..r1 of in (row i at in + i * ld, cols wide) into the
 * scratch's int8 activations s->aq/ad/as at the same rows: the int8
 * products' input (kernels.h, sk_kernels_quantize_rows). */
static void sk__quantize_scratch(const struct sk_scratch *s, const float *in, size_t ld,
                                 uint32_t r0, uint32_t r1, uint32_t cols, unsigned q) {
  const size_t nb = cols / SK_QK;
  if (q & SK__Q8)
    sk_kernels_quantize_rows(in + (size_t)r0 * ld, ld, r1 - r0, cols, s->aq + (size_t)r0 * cols,
                             s->ad + r0 * nb, s->as + r0 * nb);
  if (q & SK__Q8K)
    sk_kernels_quantize_rows_k(in + (size_t)r0 * ld, ld, r1 - r0, cols,
                               s->aqk + (size_t)r0 * cols, s->adk + r0 * (cols / SK_QKK),
                               s->ask + r0 * (cols / 16));
}

/* The activations of n rows (f, stride ld, cols wide) with the scratch's
 * quantized copies. */
static struct sk_act sk__act(const struct sk_scratch *s, uint32_t n, uint32_t cols,
                             const float *f, size_t ld) {
  return (struct sk_act){.n = n, .cols = cols, .f = f, .ldf = ld, .q = s->aq, .d = s->ad,
                         .s = s->as, .kq = s->aqk, .kd = s->adk, .ks = s->ask};
}

/* The row-wise work before a product, on the pool: for each of the n
 * rows (independent of one another; each row gets exactly the operations
 * of the one-thread code, in its order), x += add (the residual, when add
 * is set), y = rmsnorm(x) * w (when w is set), then the product's input
 * (y, or x without w) quantized into s->aq/ad/as (when q). x, add and y
 * are (n, ld); the rows are cols wide. */
struct sk__prep {
  struct sk_scratch *s;
  float *x;
  const float *add;
  const float *w;
  float *y;
  size_t ld;
  uint32_t n, cols;
  unsigned q;     /* SK__Q8 | SK__Q8K */
  uint32_t chunk; /* rows per task */
};

static void sk__prep_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__prep *p = ctx;
  const struct sk_scratch *s = p->s;
  const uint32_t r0 = task * p->chunk;
  const uint32_t r1 = r0 + p->chunk < p->n ? r0 + p->chunk : p->n;
  float *x = p->x + (size_t)r0 * p->ld;
  if (p->add) {
    const float *add = p->add + (size_t)r0 * p->ld;
    for (size_t j = 0; j < (size_t)(r1 - r0) * p->ld; j++) x[j] += add[j];
  }
  if (p->w)
    sk__rmsnorm_rows(p->y + (size_t)r0 * p->ld, x, p->ld, p->w, r1 - r0, p->cols,
                     s->m->cfg.rms_eps);
  if (p->q) sk__quantize_scratch(s, p->w ? p->y : p->x, p->ld, r0, r1, p->cols, p->q);
}

/* Runs p (s, x, add, w, y, ld, n, cols set; q from ws, chunk here) on the pool and
 * returns the activations of the products with ws[0..n_w): the normed
 * rows y (x without w), quantized if any of ws wants int8. */
static struct sk_act sk__prep(struct sk__prep *p, const struct sk_wmat *const *ws,
                              uint32_t n_w) {
  struct sk_scratch *s = p->s;
  p->q = sk__any_q8(ws, n_w);
  p->chunk = sk__prep_rows(s, p->n);
  if (p->add || p->w || p->q) /* (F32 weights after attention: nothing to do) */
    sk_pool_run(s->pool, sk__prep_task, p, (p->n + p->chunk - 1) / p->chunk);
  return sk__act(s, p->n, p->cols, p->w ? p->y : p->x, p->ld);
}

/* Row pointers base + i * ld for i < n, in s->rows + off. */
static float *const *sk__rows(struct sk_scratch *s, uint32_t off, float *base, size_t ld,
                              uint32_t n) {
  for (uint32_t i = 0; i < n; i++) s->rows[off + i] = base + (size_t)i * ld;
  return s->rows + off;
}

/* ---- silu ------------------------------------------------------------ */

/* hb = silu(hb) * hb2 for chunk rows per task, then those rows
 * quantized for the down product (when q). */
struct sk__silu {
  struct sk_scratch *s;
  uint32_t n;     /* rows */
  uint32_t chunk; /* rows per task (sk__prep_rows) */
  unsigned q;     /* SK__Q8 | SK__Q8K */
};

static void sk__silu_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__silu *a = ctx;
  const struct sk_scratch *s = a->s;
  const uint32_t H = s->m->cfg.hidden_dim;
  const uint32_t i0 = task * a->chunk;
  const uint32_t i1 = i0 + a->chunk < a->n ? i0 + a->chunk : a->n;
  sk_kernels_swiglu(s->hb + (size_t)i0 * H, s->hb2 + (size_t)i0 * H, (size_t)(i1 - i0) * H);
  if (a->q) sk__quantize_scratch(s, s->hb, H, i0, i1, H, a->q);
}

/* ---- what the architecture adds before RoPE ------------------------- */

/* Reorders each head of x (n_heads heads of head_dim) from NEOX's pairs
 * (x[i], x[i + h]), h = rope_dim / 2, to adjacent ones (x[2i], x[2i+1]);
 * elements from rope_dim on stay. tmp holds head_dim floats. */
static void sk__neox_interleave(float *x, uint32_t n_heads, const struct sk_model_config *c,
                                float *tmp) {
  const uint32_t h = c->rope_dim / 2;
  for (uint32_t k = 0; k < n_heads; k++) {
    float *xh = x + (size_t)k * c->head_dim;
    for (uint32_t i = 0; i < h; i++) {
      tmp[2 * i] = xh[i];
      tmp[2 * i + 1] = xh[i + h];
    }
    memcpy(xh, tmp, (size_t)c->rope_dim * sizeof *xh);
  }
}

/* The n rows of s->q, s->k, s->v as the architecture wants them before
 * RoPE, in llama.cpp's order: + the biases (qwen2: ggml_add after the
 * product), then RMSNorm of each query and key head with the head's
 * weight (qwen3: ggml_rms_norm over head_dim, eps rms_eps, ggml_mul),
 * then a NEOX model's reordering (model.h). Nothing for a llama model
 * without biases. */
static void sk__qkv_arch(struct sk_scratch *s, const struct sk__layer *L, uint32_t n) {
  const struct sk_model_config *c = &s->m->cfg;
  if (!c->qkv_bias && !c->qk_norm && c->rope_style == SK_ROPE_NORM) return;
  const uint32_t hd = c->head_dim;
  for (uint32_t r = 0; r < n; r++) {
    float *q = s->q + (size_t)r * c->q_dim, *k = s->k + (size_t)r * c->kv_dim;
    float *v = s->v + (size_t)r * c->kv_dim;
    if (c->qkv_bias) {
      for (uint32_t j = 0; j < c->q_dim; j++) q[j] += L->bq[j];
      for (uint32_t j = 0; j < c->kv_dim; j++) k[j] += L->bk[j];
      for (uint32_t j = 0; j < c->kv_dim; j++) v[j] += L->bv[j];
    }
    if (c->qk_norm) {
      for (uint32_t h = 0; h < c->n_head; h++)
        sk__rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, c->rms_eps);
      for (uint32_t h = 0; h < c->n_kv_head; h++)
        sk__rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, c->rms_eps);
    }
    if (c->rope_style == SK_ROPE_NEOX) {
      sk__neox_interleave(q, c->n_head, c, s->head_tmp);
      sk__neox_interleave(k, c->n_kv_head, c, s->head_tmp);
    }
  }
}

/* ---- forward -------------------------------------------------------- */

/* Formats the error of sequence i (prefixed with its index when the batch
 * has several). */
static int sk__seq_error(struct sk_error *err, uint32_t n_seqs, uint32_t i, int code,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int sk__seq_error(struct sk_error *err, uint32_t n_seqs, uint32_t i, int code,
                         const char *fmt, ...) {
  char msg[sizeof err->message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n_seqs > 1) return sk_error_set(err, code, "sequence %u: %s", i, msg);
  return sk_error_set(err, code, "%s", msg);
}

static int sk__check_seq(const struct sk_model *m, const struct sk_scratch *s,
                         const struct sk_seq *q, uint32_t n_seqs, uint32_t i,
                         struct sk_error *err) {
  const struct sk_model_config *c = &m->cfg;
  struct sk_kv_step kv;
  sk_kv_step_view(q->kv, &kv);
  if (kv.n_layer != c->n_layer || kv.kv_dim != c->kv_dim)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "cache shape n_layer %u x kv_dim %u does not match "
                         "the model's %u x %u",
                         kv.n_layer, kv.kv_dim, c->n_layer, c->kv_dim);
  if (q->n == 0)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST, "no tokens to process");
  if (q->n > s->max_batch)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "batch of %u tokens exceeds the maximum batch %u", q->n, s->max_batch);
  for (uint32_t j = 0; j < q->n; j++)
    if (q->tokens[j] < 0 || (uint32_t)q->tokens[j] >= c->n_vocab)
      return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                           "token %u of the batch is id %d, outside the "
                           "vocabulary 0..%u",
                           j, q->tokens[j], c->n_vocab - 1);
  const uint32_t nr = kv.n_resident;
  if (q->n > kv.capacity - nr)
    return sk__seq_error(err, n_seqs, i, SK_ERR_CONTEXT_FULL, "context full: needs %u, %u of %u free",
                         q->n, kv.capacity - nr, kv.capacity);
  if ((uint64_t)nr + q->n > s->max_ctx)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "%u resident + %u new tokens exceed the scratch "
                         "context %u",
                         nr, q->n, s->max_ctx);
  if (q->sparse_thr && (!m->sparse || !s->sp.idx))
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "sparse MLP asked for, but the model was not prepared for it "
                         "(sk_model_sparse_prepare before the scratch)");
  if (q->n_evicted &&
      (!kv.chunk_evicts || q->n_evicted > q->n || nr + q->n != kv.capacity || nr < kv.n_sink))
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "n_evicted %u does not describe a streaming or window make_room "
                         "for %u tokens",
                         q->n_evicted, q->n);
  return 0;
}

/* The thresholds a sequence's MLP runs with: its sparse_thr for a decode
 * step (one token) and for scoring (every row's logits), NULL (dense) for
 * a prefill of more than one token. Prefill is batched and compute-bound:
 * skipping neurons one row at a time there costs more than it saves, and
 * the prompt's cache entries are then the dense model's. */
static const float *sk__sparse_thr(const struct sk_seq *q) {
  return q->n > 1 && !q->all_logits ? NULL : q->sparse_thr;
}

/* Checks a batch as sk_model_forward_batch promises, before any cache is
 * touched; *ret_rows = its rows (the sum of the sequences' n). */
static int sk__check_batch(const struct sk_model *m, const struct sk_scratch *s,
                           const struct sk_seq *seqs, uint32_t n_seqs, uint32_t *ret_rows,
                           struct sk_error *err) {
  if (s->m != m)
    return sk_error_set(err, SK_ERR_INTERNAL, "scratch was made for another model");
  if (n_seqs == 0) return sk_error_set(err, SK_ERR_BAD_REQUEST, "no sequences to process");
  uint64_t rows = 0;
  for (uint32_t i = 0; i < n_seqs; i++) {
    int rc = sk__check_seq(m, s, &seqs[i], n_seqs, i, err);
    if (rc < 0) return rc;
    rows += seqs[i].n;
  }
  if (rows > s->max_batch)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "batch of %llu tokens exceeds the maximum batch %u",
                        (unsigned long long)rows, s->max_batch);
  *ret_rows = (uint32_t)rows;
  return 0;
}

/* One checked batch, as the steps of sk_model_forward_batch share it. */
struct sk__pass {
  const struct sk_model *m;
  struct sk_scratch *s;
  const struct sk_seq *seqs; /* (n_seqs) the caller's sequences */
  uint32_t n_seqs;
  uint32_t n;       /* rows of the batch */
  uint32_t nd;      /* rows of the sequences whose MLP runs dense: the
                       first ones, [0, nd); those of sparse ones follow */
  uint32_t kvh_per; /* KV heads per attention task of a cache with
                       rotated keys */
  uint32_t n_tasks; /* attention tasks of each layer */
};

/* Lays the sequences out in the batch (s->seqs): the rows of dense
 * sequences come first, [0, nd), those with a sparse MLP after them, so
 * that the dense MLP products run on one block of rows; the RoPE angles
 * of each row of a cache with rotated keys (see attention.c), and the
 * tables for the common scale. */
static void sk__layout_seqs(struct sk__pass *p) {
  const struct sk_model *m = p->m;
  const struct sk_model_config *c = &m->cfg;
  struct sk_scratch *s = p->s;
  const struct sk_seq *seqs = p->seqs;
  uint32_t nd = 0;
  for (uint32_t i = 0; i < p->n_seqs; i++)
    if (!sk__sparse_thr(&seqs[i])) nd += seqs[i].n;
  p->nd = nd;
  uint32_t max_pos = 0, row_d = 0, row_s = nd;
  for (uint32_t i = 0; i < p->n_seqs; i++) sk_kv_step_view(seqs[i].kv, &s->seqs[i].kv);
  const float common_scale = c->rope_scale / s->seqs[0].kv.rope_scale;
  for (uint32_t i = 0; i < p->n_seqs; i++) {
    struct sk__seq *sq = &s->seqs[i];
    const struct sk_kv_step *h = &sq->kv;
    const uint32_t row = sk__sparse_thr(&seqs[i]) ? row_s : row_d;
    sq->in = &seqs[i];
    sq->row0 = row;
    sq->nr = h->n_resident;
    sq->n_sink = h->rotated ? h->n_sink : 0;
    sq->freq_scale = c->rope_scale / h->rope_scale;
    sq->probe = h->n_sink ? h->n_sink : SK_ATTN_PROBE_DEFAULT;
    sq->rotated = h->rotated;
    sq->f16 = h->f16;
    if (sq->rotated) { /* the angles of each row (see attention.c) */
      const uint32_t nb = sq->nr + seqs[i].n_evicted, cap = h->capacity - 1;
      const uint64_t t0 = h->first_index;
      for (uint32_t j = 0; j < seqs[i].n; j++) {
        const size_t r = (size_t)(row + j) * c->rope_dim;
        sk__rope_angles_at(m, h->n_seen + j, sq->freq_scale, s->row_cos + r, s->row_sin + r);
        if (sq->n_sink && sq->nr) {
          const uint32_t P = nb + j > cap ? cap : nb + j;
          sk__rope_angles_at(m, P + t0, sq->freq_scale, s->sink_cos + r, s->sink_sin + r);
        }
      }
    }
    if (sk__sparse_thr(&seqs[i])) row_s += seqs[i].n;
    else row_d += seqs[i].n;
    if (sq->freq_scale == common_scale && sq->nr + seqs[i].n > max_pos)
      max_pos = sq->nr + seqs[i].n;
  }
  if (s->rope_freq_scale != common_scale || max_pos > s->rope_valid)
    sk__rope_tables(s, max_pos, common_scale);
}

/* The attention tasks of every layer (s->task_seq, s->task_kvh): one per
 * sequence and kvh_per KV heads, or one per sequence whose cache
 * accumulates H2O scores. The new tokens' slots start with no score. */
static void sk__plan_attention(struct sk__pass *p) {
  const struct sk_model_config *c = &p->m->cfg;
  struct sk_scratch *s = p->s;
  /* Rotated-keys tasks take kvh_per KV heads each: as many as keep about
   * eight tasks per thread, so that rows are read whole yet the threads
   * stay busy; with one thread there is nobody to keep busy, so all the
   * heads (faster for one session far into a stream; doc/performance.md). */
  uint32_t kvh_per =
      s->n_threads == 1 ? c->n_kv_head : p->n_seqs * c->n_kv_head / (8 * s->n_threads);
  if (kvh_per > s->att_heads / (c->n_head / c->n_kv_head))
    kvh_per = s->att_heads / (c->n_head / c->n_kv_head);
  if (kvh_per < 1) kvh_per = 1;
  if (kvh_per > c->n_kv_head) kvh_per = c->n_kv_head;
  uint32_t n_tasks = 0;
  for (uint32_t i = 0; i < p->n_seqs; i++) {
    const struct sk_kv_step *kv = &s->seqs[i].kv;
    if (kv->scores) {
      for (uint32_t j = 0; j < p->seqs[i].n; j++) kv->score[kv->order[s->seqs[i].nr + j]] = 0.0f;
      if (p->seqs[i].row_scores)
        memset(p->seqs[i].row_scores, 0, (size_t)p->seqs[i].n * kv->n_slots * sizeof(float));
      s->task_seq[n_tasks] = i;
      s->task_kvh[n_tasks++] = 0;
    } else {
      for (uint32_t h = 0; h < c->n_kv_head; h += kvh_per) {
        s->task_seq[n_tasks] = i;
        s->task_kvh[n_tasks++] = h;
      }
    }
  }
  p->kvh_per = kvh_per;
  p->n_tasks = n_tasks;
}

/* The residual stream s->x of every row: its token's embedding row. */
static void sk__embed(const struct sk__pass *p) {
  const struct sk_model *m = p->m;
  const uint32_t dim = m->cfg.dim;
  for (uint32_t i = 0; i < p->n_seqs; i++)
    for (uint32_t j = 0; j < p->seqs[i].n; j++)
      sk_dequantize_row(m->tok_embd.type,
                        (const uint8_t *)m->tok_embd.data +
                            (size_t)p->seqs[i].tokens[j] * m->tok_embd.row_bytes,
                        dim, p->s->x + (size_t)(p->s->seqs[i].row0 + j) * dim);
}

/* Layer l's queries, keys and values of every row (s->q, s->k, s->v):
 * the previous layer's residual (its down product) added to s->x, this
 * layer's attention norm, the three products, what the architecture
 * adds; then the new keys and values as the caches will hold them:
 * rotated at their stream index (caches with rotated keys), and halves
 * for an f16 cache (s->k16, s->v16), which attention reads. */
static void sk__qkv(const struct sk__pass *p, uint32_t l) {
  const struct sk_model_config *c = &p->m->cfg;
  const struct sk__layer *L = &p->m->layers[l];
  struct sk_scratch *s = p->s;
  const uint32_t n = p->n, dim = c->dim, D = c->kv_dim;
  const struct sk_wmat *qkv[3] = {&L->wq, &L->wk, &L->wv};
  struct sk__prep pr = {.s = s, .x = s->x, .add = l ? s->xb2 : NULL, .w = L->attn_norm,
                        .y = s->xb, .ld = dim, .n = n, .cols = dim};
  struct sk_act a = sk__prep(&pr, qkv, 3);
  struct sk__mm mm = {.x = &a, .n_w = 3, .w = {&L->wq, &L->wk, &L->wv},
                      .y = {sk__rows(s, 0, s->q, c->q_dim, n), sk__rows(s, n, s->k, D, n),
                            sk__rows(s, 2 * n, s->v, D, n)}};
  sk__matmuls(s, &mm);
  sk__qkv_arch(s, L, n);
  for (uint32_t i = 0; i < p->n_seqs; i++) {
    const struct sk__seq *sq = &s->seqs[i];
    for (uint32_t j = 0; j < p->seqs[i].n && sq->rotated; j++) { /* at their stream index */
      const size_t r = sq->row0 + j;
      for (uint32_t h = 0; h < c->n_kv_head; h++) {
        float *kh = s->k + r * D + (size_t)h * c->head_dim;
        sk__rope(kh, kh, c, s->row_cos + r * c->rope_dim, s->row_sin + r * c->rope_dim);
      }
    }
    if (sq->f16) { /* as an f16 cache will hold them; attention reads these */
      const size_t r0 = (size_t)sq->row0 * D, len = (size_t)p->seqs[i].n * D;
      sk_kernels_to_f16(s->k16 + r0, s->k + r0, len);
      sk_kernels_to_f16(s->v16 + r0, s->v + r0, len);
    }
  }
}

/* Layer l's attention (attention.c) into s->att_out, each task writing
 * its part of the new keys and values into the cache; then the layer's
 * diagnostics of each sequence, summed over the KV heads in order. */
static void sk__attend(const struct sk__pass *p, uint32_t l) {
  const struct sk_model_config *c = &p->m->cfg;
  struct sk_scratch *s = p->s;
  struct sk__att at = {.s = s, .layer = l, .kvh_per = p->kvh_per};
  sk_pool_run(s->pool, sk__att_any_task, &at, p->n_tasks);
  for (uint32_t i = 0; i < p->n_seqs; i++) {
    double mass = 0.0, ent = 0.0;
    for (uint32_t h = 0; h < c->n_kv_head; h++) {
      mass += s->mass_part[(size_t)i * c->n_kv_head + h];
      ent += s->ent_part[(size_t)i * c->n_kv_head + h];
    }
    s->sink_mass[(size_t)i * c->n_layer + l] = (float)(mass / c->n_head);
    s->entropy[(size_t)i * c->n_layer + l] = (float)(ent / c->n_head);
  }
}

/* The attention block of layer l: s->xb2 = the output product of the
 * attention over the rows' queries, for the residual. */
static void sk__attention_block(const struct sk__pass *p, uint32_t l) {
  const struct sk_model_config *c = &p->m->cfg;
  const struct sk__layer *L = &p->m->layers[l];
  struct sk_scratch *s = p->s;
  sk__qkv(p, l);
  sk__attend(p, l);
  const struct sk_wmat *wo[1] = {&L->wo};
  struct sk__prep pr = {.s = s, .x = s->att_out, .ld = c->q_dim, .n = p->n, .cols = c->q_dim};
  struct sk_act a = sk__prep(&pr, wo, 1);
  struct sk__mm mm = {.x = &a, .n_w = 1, .w = {&L->wo},
                      .y = {sk__rows(s, 0, s->xb2, c->dim, p->n)}};
  sk__matmuls(s, &mm);
}

/* The MLP of the rows of sparse sequences (sparse.h) in layer l: their
 * gate is in s->hb, their normed input still in s->xb and the quantized
 * copies; each output goes to its row of s->xb2 as the dense product's
 * would. Counts the neurons kept. */
static void sk__sparse_rows(const struct sk__pass *p, uint32_t l) {
  const struct sk_model *m = p->m;
  const struct sk_model_config *c = &m->cfg;
  struct sk_scratch *s = p->s;
  const uint32_t dim = c->dim, H = c->hidden_dim;
  const size_t nb = dim / SK_QK;
  for (uint32_t i = 0; i < p->n_seqs; i++) {
    const float *thr = sk__sparse_thr(&p->seqs[i]);
    if (!thr) continue;
    for (uint32_t j = 0; j < p->seqs[i].n; j++) {
      const size_t r = s->seqs[i].row0 + j;
      struct sk_act x1 = sk__act(s, 1, dim, s->xb + r * dim, dim);
      x1.q += r * dim; /* row r of the quantized copies */
      x1.d += r * nb;
      x1.s += r * nb;
      x1.kq += r * dim;
      x1.kd += r * (dim / SK_QKK);
      x1.ks += r * (dim / 16);
      s->sp_kept[(size_t)i * c->n_layer + l] +=
          sk_sparse_mlp_row(&m->sparse[l], s->hb + r * H, thr[l], &x1, s->xb2 + r * dim,
                            &s->sp, s->pool);
    }
    if (l == 0) s->sp_rows[i] = p->seqs[i].n;
  }
}

/* The FFN block of layer l: the attention's residual added to s->x, the
 * FFN norm, then s->xb2 = down(silu(gate x) * up x) of every row (the
 * SwiGLU MLP; sparse rows through sk__sparse_rows). */
static void sk__ffn_block(const struct sk__pass *p, uint32_t l) {
  const struct sk_model_config *c = &p->m->cfg;
  const struct sk__layer *L = &p->m->layers[l];
  struct sk_scratch *s = p->s;
  const uint32_t n = p->n, nd = p->nd, dim = c->dim, H = c->hidden_dim;
  const struct sk_wmat *gu[2] = {&L->w_gate, &L->w_up};
  struct sk__prep pr = {.s = s, .x = s->x, .add = s->xb2, .w = L->ffn_norm, .y = s->xb,
                        .ld = dim, .n = n, .cols = dim};
  struct sk_act a = sk__prep(&pr, gu, 2);
  struct sk__mm mm;
  if (nd == n) {
    mm = (struct sk__mm){.x = &a, .n_w = 2, .w = {&L->w_gate, &L->w_up},
                         .y = {sk__rows(s, 0, s->hb, H, n), sk__rows(s, n, s->hb2, H, n)}};
    sk__matmuls(s, &mm);
  } else { /* the gate for every row, up for the dense ones */
    mm = (struct sk__mm){.x = &a, .n_w = 1, .w = {&L->w_gate}, .y = {sk__rows(s, 0, s->hb, H, n)}};
    sk__matmuls(s, &mm);
    if (nd) {
      struct sk_act ad = a;
      ad.n = nd;
      mm = (struct sk__mm){.x = &ad, .n_w = 1, .w = {&L->w_up}, .y = {sk__rows(s, n, s->hb2, H, nd)}};
      sk__matmuls(s, &mm);
    }
  }
  if (s->gate_fn) s->gate_fn(s->gate_user, l, s->hb, n, H);
  if (nd < n) sk__sparse_rows(p, l);
  if (nd) {
    const struct sk_wmat *wd[1] = {&L->w_down};
    struct sk__silu si = {.s = s, .n = nd, .chunk = sk__prep_rows(s, nd), .q = sk__any_q8(wd, 1)};
    sk_pool_run(s->pool, sk__silu_task, &si, (nd + si.chunk - 1) / si.chunk);
    a = sk__act(s, nd, H, s->hb, H);
    mm = (struct sk__mm){.x = &a, .n_w = 1, .w = {&L->w_down},
                         .y = {sk__rows(s, 0, s->xb2, dim, nd)}};
    sk__matmuls(s, &mm);
  }
}

/* The last layer's residual, then the logits of the rows that want them:
 * the final norm into consecutive rows of s->xb, and the output head's
 * product into the sequences' logits. */
static void sk__logits(const struct sk__pass *p) {
  const struct sk_model *m = p->m;
  const struct sk_model_config *c = &m->cfg;
  struct sk_scratch *s = p->s;
  const uint32_t dim = c->dim;
  struct sk__prep pr = {.s = s, .x = s->x, .add = s->xb2, .ld = dim, .n = p->n, .cols = dim};
  sk__prep(&pr, NULL, 0);
  uint32_t n_out = 0;
  for (uint32_t i = 0; i < p->n_seqs; i++) {
    const struct sk_seq *q = &p->seqs[i];
    if (!q->logits) continue;
    uint32_t first = q->all_logits ? 0 : q->n - 1;
    for (uint32_t j = first; j < q->n; j++) {
      sk__rmsnorm(s->xb + (size_t)n_out * dim, s->x + (size_t)(s->seqs[i].row0 + j) * dim,
                  m->out_norm, dim, c->rms_eps);
      s->rows[n_out++] = q->logits + (size_t)(j - first) * c->n_vocab;
    }
  }
  if (n_out) {
    const struct sk_wmat *wout[1] = {&m->output};
    pr = (struct sk__prep){.s = s, .x = s->xb, .ld = dim, .n = n_out, .cols = dim};
    struct sk_act a = sk__prep(&pr, wout, 1);
    struct sk__mm mm = {.x = &a, .n_w = 1, .w = {&m->output}, .y = {s->rows}};
    sk__matmuls(s, &mm);
  }
}

int sk_model_forward_batch(const struct sk_model *m, struct sk_scratch *s,
                           const struct sk_seq *seqs, uint32_t n_seqs, struct sk_error *err) {
  struct sk__pass p = {.m = m, .s = s, .seqs = seqs, .n_seqs = n_seqs};
  int rc = sk__check_batch(m, s, seqs, n_seqs, &p.n, err);
  if (rc < 0) return rc;
  sk__layout_seqs(&p);
  sk__plan_attention(&p);
  memset(s->sp_kept, 0, (size_t)n_seqs * m->cfg.n_layer * sizeof *s->sp_kept);
  memset(s->sp_rows, 0, (size_t)n_seqs * sizeof *s->sp_rows);
  sk__embed(&p);
  for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
    sk__attention_block(&p, l);
    sk__ffn_block(&p, l);
  }
  sk__logits(&p);
  for (uint32_t i = 0; i < n_seqs; i++) {
    if (!seqs[i].defer_commit) sk_kv_commit(seqs[i].kv, seqs[i].tokens, seqs[i].n);
    s->probe[i] = s->seqs[i].probe;
  }
  s->attn_n_seqs = n_seqs;
  return 0;
}

int sk_model_forward(const struct sk_model *m, struct sk_scratch *s,
                     struct sk_kv *kv, const int32_t *tokens, uint32_t n,
                     float *logits, bool all_logits, struct sk_error *err) {
  struct sk_seq q = {.kv = kv, .tokens = tokens, .n = n, .logits = logits,
                     .all_logits = all_logits};
  return sk_model_forward_batch(m, s, &q, 1, err);
}
