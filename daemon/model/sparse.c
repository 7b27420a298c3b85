/* Contextual sparsity of the SwiGLU MLP (CATS rule, see sparse.h): the
 * weights in the sparse kernels' layouts, and the kernels that run one
 * token's MLP. The calibration is sparse_calib.c. */
#include "model/sparse.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "model/gguf.h"
#include "model/quant.h"

/* ---- the weights in the sparse kernels' layouts ------------------------ */

/* Outputs per interleaved chunk of a Q8 tile row. */
#define SK__CH 64u

/* Kept rows ahead of the ones computed whose bytes are prefetched, into
 * L2 (PREFETCHT1): the rows are scattered, so the hardware prefetchers
 * find no stream to follow, and prefetches into L1 are bounded by its few
 * outstanding misses. About 32 KiB ahead of up, 16 KiB per thread of
 * down: where a single core read randomly placed 2 KiB rows about as
 * fast as a sequential stream, on the machine measured. */
#ifndef SK__UP_AHEAD
#define SK__UP_AHEAD 16u
#endif
/* Parts the tiles' sum is split in (sk__down_tiles_task). */
#define SK__PARTS 4u
#ifndef SK__DOWN_AHEAD
#define SK__DOWN_AHEAD 16u
#endif

/* Where output o sits in a Q8 tile row. vpdpbusd's interleave of four
 * rows a, b, c, d (per 128-bit lane: unpack bytes a|b and c|d, then the
 * 16-bit pairs) gives int32 lane e of result t (t < 4) the four bytes at
 * (e / 4) * 16 + 4t + e % 4 of the chunk: that byte holds output 16t + e,
 * so that the results come out in output order. */
static inline uint32_t sk__tile_pos(uint32_t o) {
  const uint32_t c = o & ~(SK__CH - 1), r = o & (SK__CH - 1), t = r / 16, e = r % 16;
  return c + (e / 4) * 16 + 4 * t + e % 4;
}

static size_t sk__align64(size_t n) { return (n + 63) & ~(size_t)63; }

static bool sk__use_v512(void);

/* A buffer of n bytes for weights read at scattered rows: 2 MiB aligned
 * and, on Linux, advised to be backed by transparent huge pages, so that
 * the rows do not each cost a TLB miss (a 1B layer's matrices span ~12
 * MB, more than the second-level TLB maps with 4 KiB pages). Freed with
 * free(). */
static void *sk__alloc_huge(size_t n) {
  const size_t huge = (size_t)2 << 20;
  if (n < huge) return aligned_alloc(64, sk__align64(n));
  void *p = aligned_alloc(huge, (n + huge - 1) / huge * huge);
#ifdef MADV_HUGEPAGE
  if (p) (void)madvise(p, (n + huge - 1) / huge * huge, MADV_HUGEPAGE);
#endif
  return p;
}

/* Whether a down projection of this type becomes Q4 tiles (types of at
 * most 4.5 bits per weight) rather than Q8 tiles. */
static bool sk__q4_tiles(uint32_t t) {
  switch (t) {
  case SK_GGML_Q4_0:
  case SK_GGML_Q4_1:
  case SK_GGML_Q4_K:
  case SK_GGML_IQ4_NL:
  case SK_GGML_IQ4_XS:
  case SK_GGML_Q3_K:
  case SK_GGML_Q2_K: return true;
  default: return false;
  }
}

/* 32 values as ggml's quantize_row_q4_1_ref: m = min, d = (max - min) /
 * 15, q = min(15, (int)((x - m) / d + 0.5)); d and m as fp16. */
static void sk__quantize_q4_1(const float *x, uint8_t *q, uint16_t *d, uint16_t *m) {
  float mn = x[0], mx = x[0];
  for (uint32_t e = 1; e < SK_QK; e++) {
    mn = x[e] < mn ? x[e] : mn;
    mx = x[e] > mx ? x[e] : mx;
  }
  const float dv = (mx - mn) / 15.0f, id = dv ? 1.0f / dv : 0.0f;
  *d = sk_f32_to_f16(dv);
  *m = sk_f32_to_f16(mn);
  for (uint32_t e = 0; e < SK_QK; e++) {
    const int v = (int)((x[e] - mn) * id + 0.5f);
    q[e] = (uint8_t)(v > 15 ? 15 : v < 0 ? 0 : v);
  }
}

int sk_sparse_prepare(struct sk_sparse_mlp *w, const struct sk_wmat *up,
                      const struct sk_wmat *down, void **ret_mem, size_t *ret_bytes,
                      struct sk_error *err) {
  const uint32_t dim = down->rows, hidden = down->cols;
  memset(w, 0, sizeof *w);
  const bool fdown = down->type == SK_GGML_F32 || down->type == SK_GGML_F16;
  if (up->rows != hidden || up->cols != dim || (!fdown && hidden % SK_QK))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "the sparse MLP needs up (%u x %u) and down (%u x %u) to match",
                        up->rows, up->cols, dim, hidden);
  w->hidden = hidden;
  w->dim = dim;
  w->up = *up;
  w->up.packed = NULL; /* rows read one by one: the GGUF layout */
  w->up.pack_rows = 0;
  const bool uq8 = up->type == SK_GGML_Q8_0 && sk__use_v512(); /* (its only reader) */
  const uint32_t nbx = dim / SK_QK, nbh = hidden / SK_QK;
  const bool q4 = !fdown && sk__q4_tiles(down->type);
  w->down_type = fdown ? down->type : q4 ? SK_GGML_Q4_1 : SK_GGML_Q8_0;
  w->ld = fdown ? 0 : (dim + SK__CH - 1) / SK__CH * SK__CH;
  w->down_row_bytes = fdown ? sk_quant_row_bytes(down->type, dim) : q4 ? w->ld / 2 : w->ld;
  /* one buffer: [uq][ud][down][down_d], each 64-byte aligned */
  const size_t n_uq = uq8 ? sk__align64((size_t)hidden * dim) : 0;
  const size_t n_ud = uq8 ? sk__align64((size_t)hidden * nbx * 2) : 0;
  const size_t n_dn = sk__align64((size_t)hidden * w->down_row_bytes);
  const size_t n_dd = fdown ? 0 : sk__align64((size_t)nbh * w->ld * 2) * (q4 ? 2 : 1);
  const size_t total = n_uq + n_ud + n_dn + n_dd;
  uint8_t *mem = sk__alloc_huge(total);
  float *row = malloc((size_t)(dim > hidden ? dim : hidden) * sizeof *row);
  float *full = fdown ? malloc((size_t)dim * hidden * sizeof *full) : NULL;
  struct sk_block_q8_0 *blk = malloc((size_t)nbh * sizeof *blk);
  int rc = 0;
  if (!mem || !row || !blk || (fdown && !full)) {
    rc = sk_error_set(err, SK_ERR_NO_MEMORY,
                      "cannot allocate the sparse MLP's weights (%u x %u)", hidden, dim);
    goto out;
  }
  if (uq8) {
    uint8_t *uq = mem;
    uint16_t *ud = (uint16_t *)(void *)(mem + n_uq);
    for (uint32_t j = 0; j < hidden; j++) {
      const struct sk_block_q8_0 *b =
          (const void *)((const uint8_t *)up->data + (size_t)j * up->row_bytes);
      for (uint32_t i = 0; i < nbx; i++) {
        ud[(size_t)j * nbx + i] = b[i].d;
        for (uint32_t e = 0; e < SK_QK; e++)
          uq[(size_t)j * dim + (size_t)i * SK_QK + e] = (uint8_t)(b[i].qs[e] + 128);
      }
    }
    w->uq = uq;
    w->ud = ud;
  }
  uint8_t *dn = mem + n_uq + n_ud;
  if (fdown) { /* transposed, exact */
    for (uint32_t o = 0; o < dim; o++)
      if (sk_dequantize_row(down->type,
                            (const uint8_t *)down->data + (size_t)o * down->row_bytes, hidden,
                            full + (size_t)o * hidden) < 0)
        goto bad_type;
    for (uint32_t j = 0; j < hidden; j++) {
      uint8_t *dst = dn + (size_t)j * w->down_row_bytes;
      for (uint32_t o = 0; o < dim; o++) {
        const float v = full[(size_t)o * hidden + j];
        if (down->type == SK_GGML_F32) {
          memcpy(dst + 4 * (size_t)o, &v, 4);
        } else {
          uint16_t h = sk_f32_to_f16(v);
          memcpy(dst + 2 * (size_t)o, &h, 2);
        }
      }
    }
  } else if (q4) { /* Q4 tiles: Q4_1 blocks of each output, spread over neurons */
    uint16_t *dd = (uint16_t *)(void *)(dn + n_dn);
    uint16_t *dm = dd + n_dd / 4;
    memset(dn, 0, n_dn);
    memset(dd, 0, n_dd);
    for (uint32_t o = 0; o < dim; o++) {
      if (sk_dequantize_row(down->type,
                            (const uint8_t *)down->data + (size_t)o * down->row_bytes, hidden,
                            row) < 0)
        goto bad_type;
      const uint32_t pos = sk__tile_pos(o), c = pos & ~(SK__CH - 1), i = pos & (SK__CH - 1);
      const size_t at = c / 2 + (i & 31);
      const unsigned shift = i < 32 ? 0 : 4;
      for (uint32_t g = 0; g < nbh; g++) {
        uint8_t q[SK_QK];
        sk__quantize_q4_1(row + (size_t)g * SK_QK, q, &dd[(size_t)g * w->ld + o],
                          &dm[(size_t)g * w->ld + o]);
        for (uint32_t e = 0; e < SK_QK; e++)
          dn[(size_t)(g * SK_QK + e) * w->down_row_bytes + at] |= (uint8_t)(q[e] << shift);
      }
    }
    w->down_d = dd;
    w->down_m = dm;
  } else { /* Q8 tiles: the Q8_0 blocks of each output, spread over neurons */
    uint16_t *dd = (uint16_t *)(void *)(dn + n_dn);
    memset(dn, 128, n_dn);
    memset(dd, 0, n_dd);
    for (uint32_t o = 0; o < dim; o++) {
      const uint8_t *src = (const uint8_t *)down->data + (size_t)o * down->row_bytes;
      const struct sk_block_q8_0 *b = (const void *)src;
      if (down->type != SK_GGML_Q8_0) {
        if (sk_dequantize_row(down->type, src, hidden, row) < 0) goto bad_type;
        sk_quantize_row_q8_0(row, hidden, blk);
        b = blk;
      }
      const uint32_t pos = sk__tile_pos(o);
      for (uint32_t g = 0; g < nbh; g++) {
        dd[(size_t)g * w->ld + o] = b[g].d;
        for (uint32_t e = 0; e < SK_QK; e++)
          dn[(size_t)(g * SK_QK + e) * w->ld + pos] = (uint8_t)(b[g].qs[e] + 128);
      }
    }
    w->down_d = dd;
  }
  w->down = dn;
  *ret_mem = mem;
  *ret_bytes = total;
  mem = NULL;
  goto out;
bad_type:
  rc = sk_error_set(err, SK_ERR_BAD_MODEL, "cannot read %s weights for the sparse MLP",
                    sk_ggml_type_name(down->type));
out:
  free(mem);
  free(row);
  free(full);
  free(blk);
  return rc;
}

float sk_sparse_down_weight(const struct sk_sparse_mlp *w, uint32_t j, uint32_t o) {
  const uint8_t *r = (const uint8_t *)w->down + (size_t)j * w->down_row_bytes;
  if (w->down_type == SK_GGML_F32) {
    float v;
    memcpy(&v, r + 4 * (size_t)o, 4);
    return v;
  }
  if (w->down_type == SK_GGML_F16) {
    uint16_t h;
    memcpy(&h, r + 2 * (size_t)o, 2);
    return sk_f16_to_f32(h);
  }
  const size_t sc = (size_t)(j / SK_QK) * w->ld + o;
  const uint32_t pos = sk__tile_pos(o);
  if (w->down_type == SK_GGML_Q4_1) {
    const uint32_t c = pos & ~(SK__CH - 1), i = pos & (SK__CH - 1);
    const uint8_t b = r[c / 2 + (i & 31)];
    return sk_f16_to_f32(w->down_d[sc]) * (float)(i < 32 ? b & 15 : b >> 4) +
           sk_f16_to_f32(w->down_m[sc]);
  }
  return (float)((int32_t)r[pos] - 128) * sk_f16_to_f32(w->down_d[sc]);
}

double sk_sparse_step_bytes(const struct sk_sparse_mlp *w, double kept) {
  double b = kept * ((double)w->up.row_bytes + (double)w->down_row_bytes);
  if (w->down_d) b += (double)(w->hidden / SK_QK) * w->ld * 2;
  if (w->down_m) b += (double)(w->hidden / SK_QK) * w->ld * 2;
  return b;
}

/* ---- one token ---------------------------------------------------------- */

int sk_sparse_work_init(struct sk_sparse_work *w, uint32_t hidden, uint32_t dim,
                        uint32_t n_threads, struct sk_error *err) {
  memset(w, 0, sizeof *w);
  w->hidden = hidden;
  w->dim = dim;
  w->n_threads = n_threads;
  const size_t nbh = hidden / SK_QK + 1;
  w->idx = malloc((size_t)hidden * sizeof *w->idx);
  w->u = malloc((size_t)hidden * sizeof *w->u);
  w->g = malloc((size_t)hidden * sizeof *w->g);
  w->uk = malloc((size_t)hidden * sizeof *w->uk);
  w->hf = malloc((size_t)hidden * sizeof *w->hf);
  w->ones = malloc((size_t)hidden * sizeof *w->ones);
  w->hq = malloc((size_t)hidden + SK_QK);
  w->hqk = malloc((size_t)hidden + SK_QK);
  w->hd = malloc(nbh * sizeof *w->hd);
  w->hs = malloc(nbh * sizeof *w->hs);
  w->grp = malloc(nbh * 3 * sizeof *w->grp);
  w->corr = malloc(((size_t)dim / 4 + 16) * sizeof *w->corr);
  w->tmp = malloc((size_t)n_threads * 2 * (dim + SK__CH) * sizeof *w->tmp);
  w->part = malloc((size_t)SK__PARTS * (dim + SK__CH) * sizeof *w->part);
  if (!w->idx || !w->u || !w->g || !w->uk || !w->hf || !w->ones || !w->hq || !w->hqk || !w->hd || !w->hs ||
      !w->grp || !w->corr || !w->tmp || !w->part) {
    sk_sparse_work_free(w);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate the sparse MLP's buffers");
  }
  for (uint32_t j = 0; j < hidden; j++) w->ones[j] = 1.0f;
  return 0;
}

void sk_sparse_work_free(struct sk_sparse_work *w) {
  free(w->idx);
  free(w->u);
  free(w->g);
  free(w->uk);
  free(w->hf);
  free(w->ones);
  free(w->hq);
  free(w->hqk);
  free(w->hd);
  free(w->hs);
  free(w->grp);
  free(w->corr);
  free(w->tmp);
  free(w->part);
  memset(w, 0, sizeof *w);
}

struct sk__row {
  const struct sk_sparse_mlp *w;
  const struct sk_act *x;
  struct sk_sparse_work *wk;
  uint32_t nk;       /* |K| */
  uint32_t per;      /* kept neurons (up) or outputs (down) per task */
  uint32_t n_grp;    /* blocks of 32 neurons with kept ones (tiles) */
  float *y;
};

/* Up products of the kept neurons [task * per, +per): one kernel call per
 * run of consecutive neurons, each output written at its neuron. */
static void sk__up_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__row *r = ctx;
  const uint32_t *idx = r->wk->idx;
  uint32_t k = task * r->per, k1 = k + r->per < r->nk ? k + r->per : r->nk, kp = k;
  float *const urow[1] = {r->wk->u};
  const struct sk_wmat *up = &r->w->up;
  while (k < k1) {
    uint32_t a = idx[k], b = a + 1;
    for (k++; k < k1 && idx[k] == b; k++) b++;
    /* the rows up to SK__UP_AHEAD kept ones on, into L2 (see above) */
    for (; kp < k1 && kp < k + SK__UP_AHEAD; kp++) {
      const uint8_t *row = (const uint8_t *)up->data + (size_t)idx[kp] * up->row_bytes;
      for (size_t i = 0; i < up->row_bytes; i += 64) __builtin_prefetch(row + i, 0, 2);
    }
    sk_kernels_matmul(up, r->x, urow, a, b);
  }
}

/* One Q8_0 up row (quants + 128 at q, fp16 scales at d) times the
 * activation row: sum over blocks, in order, of fmaf(exact block sum,
 * scale * activation scale, sum). */
static float sk__up_row_generic(const uint8_t *q, const uint16_t *d, const struct sk_act *x,
                                uint32_t nbx) {
  float acc = 0.0f;
  for (uint32_t b = 0; b < nbx; b++) {
    int32_t isum = 0;
    for (uint32_t e = 0; e < SK_QK; e++)
      isum += ((int32_t)q[b * SK_QK + e] - 128) * x->q[b * SK_QK + e];
    acc = fmaf((float)isum, sk_f16_to_f32(d[b]) * x->d[b], acc);
  }
  return acc;
}

/* Rows of down_t summed apart before they join the output (float rows). */
#define SK__GROUP 16u

/* acc[0..len) += h[k] * row k of down's outputs, for k < n, in order of
 * k, each row at rows[k] (already offset to the first output): F32 rows
 * by sk_kernels_axpy, F16 rows dequantized into tmp first. */
static void sk__add_rows_float(uint32_t type, const uint8_t *const *rows, const float *h,
                               uint32_t n, uint32_t len, float *acc, float *tmp) {
  for (uint32_t k = 0; k < n; k++) {
    if (type == SK_GGML_F32) {
      sk_kernels_axpy(acc, h[k], (const float *)(const void *)rows[k], len);
    } else {
      sk_dequantize_row(type, rows[k], len, tmp);
      sk_kernels_axpy(acc, h[k], tmp, len);
    }
  }
}

/* The tiles' blocks [t0, t1) of wk->grp, outputs [p0, p1) (multiples of
 * 64, or ld) into acc (p1 - p0 floats, added to): for each block of 32
 * neurons with kept ones, in order, the exact int32 sum over its kept
 * neurons of hq * (byte - 128) (Q8 tiles; Q4 tiles: hq * nibble), then
 * acc = fmaf(sum, fp16 scale * activation scale, acc) (Q4 tiles: after
 * acc = fmaf(the block's sum of hq, minimum * activation scale, acc)). */
static void sk__down_tiles_generic(const struct sk__row *r, uint32_t t0, uint32_t t1, uint32_t p0,
                                uint32_t p1, float *acc) {
  const struct sk_sparse_mlp *w = r->w;
  const struct sk_sparse_work *wk = r->wk;
  const uint8_t *base = w->down;
  for (uint32_t t = t0; t < t1; t++) {
    const uint32_t g = wk->grp[3 * t], kb = wk->grp[3 * t + 1], ke = wk->grp[3 * t + 2];
    const float dh = wk->hd[g];
    const uint16_t *dd = w->down_d + (size_t)g * w->ld;
    for (uint32_t o = p0; o < p1; o++) {
      const uint32_t pos = sk__tile_pos(o);
      int32_t isum = 0;
      if (w->down_m) {
        const uint32_t c = pos & ~(SK__CH - 1), i = pos & (SK__CH - 1);
        const size_t at = c / 2 + (i & 31);
        for (uint32_t k = kb; k < ke; k++) {
          const uint8_t b = base[(size_t)wk->idx[k] * w->down_row_bytes + at];
          isum += wk->hqk[k] * (int32_t)(i < 32 ? b & 15 : b >> 4);
        }
        const float mt = fmaf((float)wk->hs[g], sk_f16_to_f32(w->down_m[(size_t)g * w->ld + o]) * dh,
                              acc[o - p0]);
        acc[o - p0] = fmaf((float)isum, sk_f16_to_f32(dd[o]) * dh, mt);
        continue;
      }
      for (uint32_t k = kb; k < ke; k++)
        isum += wk->hqk[k] * ((int32_t)base[(size_t)wk->idx[k] * w->ld + pos] - 128);
      acc[o - p0] = fmaf((float)isum, sk_f16_to_f32(dd[o]) * dh, acc[o - p0]);
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SK__HAVE_X86 1
#define SK__V512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"

/* sk__up_row_generic on AVX-512 VNNI: two blocks per vpdpbusd (the
 * accumulator starts at -128 x each block's activation sum, so the lanes
 * of a block add up to its exact sum), each lane converted to float and
 * multiplied by its block's scale product, summed in lanes, then across:
 * the same value, to float rounding, in other bits. */
__attribute__((target(SK__V512))) static float sk__up_row_v512(const uint8_t *q,
                                                                const uint16_t *d,
                                                                const struct sk_act *x,
                                                                const int32_t *corr,
                                                                uint32_t nbx,
                                                                const uint8_t *pf) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  for (uint32_t b0 = 0; b0 < nbx; b0 += 16) {
    const uint32_t nbc = nbx - b0 < 16 ? nbx - b0 : 16;
    const __mmask16 m = (__mmask16)((1u << nbc) - 1u);
    const __m512 sv = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, d + b0)),
                                    _mm512_maskz_loadu_ps(m, x->d + b0));
    for (uint32_t p = 0; 2 * p < nbc; p++) {
      const uint32_t b = b0 + 2 * p;
      _mm_prefetch((const char *)pf + (size_t)b * SK_QK, _MM_HINT_T1);
      __m512i wv, xv;
      if (b + 1 < nbx) {
        wv = _mm512_loadu_si512(q + (size_t)b * SK_QK);
        xv = _mm512_loadu_si512(x->q + (size_t)b * SK_QK);
      } else {
        wv = _mm512_maskz_loadu_epi8(0xffffffffull, q + (size_t)b * SK_QK);
        xv = _mm512_maskz_loadu_epi8(0xffffffffull, x->q + (size_t)b * SK_QK);
      }
      const __m512i iv = _mm512_dpbusd_epi32(_mm512_loadu_si512(corr + 8 * (size_t)b), wv, xv);
      const __m512i ix = _mm512_add_epi32(pair, _mm512_set1_epi32((int)(2 * p)));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv), _mm512_permutexvar_ps(ix, sv), acc);
    }
  }
  return _mm512_reduce_add_ps(acc);
}

/* sk__down_tiles_generic on AVX-512 VNNI, with its bits: four kept neurons
 * at a time, their rows' bytes interleaved per 64 outputs (the tile
 * layout makes the results come out in output order) and multiplied by
 * the four hq bytes broadcast, one vpdpbusd per 16 outputs, into int32
 * sums of the block's outputs (isum, in L1: each row is then read as one
 * stream); the sums start at -128 x the block's sum of hq, which takes
 * the +128 back exactly. A block's last quad is padded with hq 0 (its
 * first row again). */
__attribute__((target(SK__V512), always_inline)) static inline __m512i sk__tile_load(
    const uint8_t *row, uint32_t p, bool q4) {
  if (!q4) return _mm512_loadu_si512(row + p);
  /* 32 bytes: their low nibbles are tile bytes 0..31, high ones 32..63 */
  const __m256i x = _mm256_loadu_si256((const void *)(row + p / 2)), m = _mm256_set1_epi8(15);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, m)),
                            _mm256_and_si256(_mm256_srli_epi16(x, 4), m), 1);
}

/* Q8 tiles (q4 false) and Q4 tiles (q4 true: unsigned nibbles, no
 * offset; the min's term added per block as the generic code does). */
__attribute__((target(SK__V512), always_inline)) static inline void sk__down_tiles_v512(
    const struct sk__row *r, uint32_t t0, uint32_t t1, uint32_t p0, uint32_t p1, float *acc,
    int32_t *isum, bool q4) {
  const struct sk_sparse_mlp *w = r->w;
  const struct sk_sparse_work *wk = r->wk;
  const uint8_t *base = w->down;
  const size_t ld = w->ld, rb = w->down_row_bytes, off = q4 ? p0 / 2 : p0;
  const uint32_t len = p1 - p0;
  for (uint32_t t = t0; t < t1; t++) {
    const uint32_t g = wk->grp[3 * t], kb = wk->grp[3 * t + 1], ke = wk->grp[3 * t + 2];
    const __m512i bias = _mm512_set1_epi32(q4 ? 0 : -128 * wk->hs[g]);
    const uint32_t nq = (ke - kb + 3) / 4;
    /* the rows of quad i */
    const uint8_t *rows[SK_QK];
    int32_t h4[SK_QK / 4];
    for (uint32_t i = 0; i < nq; i++) {
      uint32_t hv = 0;
      for (uint32_t e = 0; e < 4; e++) {
        const uint32_t k = kb + 4 * i + e;
        rows[4 * i + e] = base + (size_t)wk->idx[k < ke ? k : kb] * rb + off;
        hv |= (uint32_t)(uint8_t)(k < ke ? wk->hqk[k] : 0) << (8 * e);
      }
      h4[i] = (int32_t)hv;
    }
    for (uint32_t i = 0; i < nq; i++) {
      const uint8_t *ra = rows[4 * i], *rb_ = rows[4 * i + 1], *rc = rows[4 * i + 2],
                    *rd = rows[4 * i + 3];
      /* the kept rows SK__DOWN_AHEAD on (in the order of K, across
       * blocks), fetched into L2 while these are computed */
      const uint8_t *nx[4];
      for (uint32_t e = 0; e < 4; e++) {
        const uint32_t k = kb + 4 * i + e + SK__DOWN_AHEAD;
        nx[e] = base + (size_t)wk->idx[k < r->nk ? k : r->nk - 1] * rb + off;
      }
      const __m512i hv = _mm512_set1_epi32(h4[i]);
      for (uint32_t p = 0; p < len; p += SK__CH) {
        for (uint32_t e = 0; e < 4; e++)
          _mm_prefetch((const char *)nx[e] + (q4 ? p / 2 : p), _MM_HINT_T1);
        const __m512i va = sk__tile_load(ra, p, q4), vb = sk__tile_load(rb_, p, q4);
        const __m512i vc = sk__tile_load(rc, p, q4), vd = sk__tile_load(rd, p, q4);
        const __m512i ab0 = _mm512_unpacklo_epi8(va, vb), ab1 = _mm512_unpackhi_epi8(va, vb);
        const __m512i cd0 = _mm512_unpacklo_epi8(vc, vd), cd1 = _mm512_unpackhi_epi8(vc, vd);
        int32_t *s = isum + p;
        __m512i a0 = i ? _mm512_loadu_si512(s) : bias, a1 = i ? _mm512_loadu_si512(s + 16) : bias;
        __m512i a2 = i ? _mm512_loadu_si512(s + 32) : bias, a3 = i ? _mm512_loadu_si512(s + 48) : bias;
        a0 = _mm512_dpbusd_epi32(a0, _mm512_unpacklo_epi16(ab0, cd0), hv);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_unpackhi_epi16(ab0, cd0), hv);
        a2 = _mm512_dpbusd_epi32(a2, _mm512_unpacklo_epi16(ab1, cd1), hv);
        a3 = _mm512_dpbusd_epi32(a3, _mm512_unpackhi_epi16(ab1, cd1), hv);
        _mm512_storeu_si512(s, a0);
        _mm512_storeu_si512(s + 16, a1);
        _mm512_storeu_si512(s + 32, a2);
        _mm512_storeu_si512(s + 48, a3);
      }
    }
    const __m512 dh = _mm512_set1_ps(wk->hd[g]), hs = _mm512_set1_ps((float)wk->hs[g]);
    const uint16_t *dd = w->down_d + (size_t)g * ld + p0;
    const uint16_t *dm = q4 ? w->down_m + (size_t)g * ld + p0 : NULL;
    for (uint32_t p = 0; p < len; p += 16) {
      __m512 a = _mm512_loadu_ps(acc + p);
      if (q4)
        a = _mm512_fmadd_ps(
            hs, _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const void *)(dm + p))), dh), a);
      _mm512_storeu_ps(acc + p, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(isum + p)),
                                                _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(
                                                                  (const void *)(dd + p))),
                                                              dh),
                                                a));
    }
  }
}

__attribute__((target(SK__V512))) static void sk__down_q8_v512(const struct sk__row *r,
                                                               uint32_t t0, uint32_t t1,
                                                               uint32_t p0, uint32_t p1,
                                                               float *acc, int32_t *isum) {
  sk__down_tiles_v512(r, t0, t1, p0, p1, acc, isum, false);
}

__attribute__((target(SK__V512))) static void sk__down_q4_v512(const struct sk__row *r,
                                                               uint32_t t0, uint32_t t1,
                                                               uint32_t p0, uint32_t p1,
                                                               float *acc, int32_t *isum) {
  sk__down_tiles_v512(r, t0, t1, p0, p1, acc, isum, true);
}

#define SK__AVX2 "avx2,fma,f16c"

/* Whether the selected kernels run AVX2 (every x86 variant but generic). */
static bool sk__use_avx2(void) { return strcmp(sk_kernels_name(), "generic") != 0; }

/* 16 tile bytes of quad q (< 4) of a 64-output chunk as signed 16-bit
 * weights: bytes - 128 (Q8 tiles) or nibbles (Q4 tiles: the chunk's 32
 * bytes at row, low nibbles for q 0 and 1, high ones for 2 and 3). */
__attribute__((target(SK__AVX2), always_inline)) static inline __m256i sk__tile_w16(
    const uint8_t *row, uint32_t p, uint32_t q, bool q4) {
  if (!q4)
    return _mm256_sub_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(row + p + 16 * q))),
        _mm256_set1_epi16(128));
  __m128i x = _mm_loadu_si128((const void *)(row + p / 2 + 16 * (q & 1)));
  if (q >= 2) x = _mm_srli_epi16(x, 4);
  return _mm256_cvtepu8_epi16(_mm_and_si128(x, _mm_set1_epi8(15)));
}

/* sk__down_tiles_generic on AVX2, with its bits: two kept neurons at a
 * time, their 16-bit weights interleaved and multiplied by the two hq
 * (vpmaddwd: exact int32 sums), into int32 sums of the block's outputs in
 * the order the interleave leaves them (isum, in L1), put back in output
 * order per 64 (128-bit lane moves) before the float steps. */
__attribute__((target(SK__AVX2), always_inline)) static inline void sk__down_tiles_avx2(
    const struct sk__row *r, uint32_t t0, uint32_t t1, uint32_t p0, uint32_t p1, float *acc,
    int32_t *isum, bool q4) {
  const struct sk_sparse_mlp *w = r->w;
  const struct sk_sparse_work *wk = r->wk;
  const uint8_t *base = w->down;
  const size_t ld = w->ld, rb = w->down_row_bytes, off = q4 ? p0 / 2 : p0;
  const uint32_t len = p1 - p0;
  for (uint32_t t = t0; t < t1; t++) {
    const uint32_t g = wk->grp[3 * t], kb = wk->grp[3 * t + 1], ke = wk->grp[3 * t + 2];
    memset(isum, 0, len * sizeof *isum);
    for (uint32_t k = kb; k < ke; k += 2) {
      const uint8_t *ra = base + (size_t)wk->idx[k] * rb + off;
      const uint8_t *rb2 = k + 1 < ke ? base + (size_t)wk->idx[k + 1] * rb + off : ra;
      const uint32_t hv = (uint32_t)(uint16_t)wk->hqk[k] |
                          (uint32_t)(uint16_t)(k + 1 < ke ? wk->hqk[k + 1] : 0) << 16;
      const __m256i h2 = _mm256_set1_epi32((int)hv);
      const uint32_t kn = k + SK__DOWN_AHEAD < r->nk ? k + SK__DOWN_AHEAD : r->nk - 1;
      const uint8_t *nx = base + (size_t)wk->idx[kn] * rb + off;
      for (uint32_t p = 0; p < len; p += SK__CH) {
        _mm_prefetch((const char *)nx + (q4 ? p / 2 : p), _MM_HINT_T1);
        for (uint32_t q = 0; q < 4; q++) {
          const __m256i wa = sk__tile_w16(ra, p, q, q4), wb = sk__tile_w16(rb2, p, q, q4);
          int32_t *s = isum + p + 16 * q;
          _mm256_storeu_si256((void *)s,
                              _mm256_add_epi32(_mm256_loadu_si256((const void *)s),
                                               _mm256_madd_epi16(_mm256_unpacklo_epi16(wa, wb), h2)));
          _mm256_storeu_si256((void *)(s + 8),
                              _mm256_add_epi32(_mm256_loadu_si256((const void *)(s + 8)),
                                               _mm256_madd_epi16(_mm256_unpackhi_epi16(wa, wb), h2)));
        }
      }
    }
    /* isum + p + 16q holds, 4 ints each, the sums of tile bytes 16q +
     * 4t .. + 4, i.e. of outputs 16t + 4q .. + 4, for t = 0, 2, 1, 3: the
     * 16 outputs of block t are one 128-bit half of each q's 16 ints */
    const float dh = wk->hd[g], hsf = (float)wk->hs[g];
    const __m256 dhv = _mm256_set1_ps(dh), hsv = _mm256_set1_ps(hsf);
    const uint16_t *dd = w->down_d + (size_t)g * ld + p0;
    const uint16_t *dm = q4 ? w->down_m + (size_t)g * ld + p0 : NULL;
    for (uint32_t p = 0; p < len; p += SK__CH) {
      const int32_t *s = isum + p;
      __m256i v[8];
      for (uint32_t tb = 0; tb < 4; tb++) {
        const uint32_t hi = tb & 1 ? 8 : 0, sel = tb & 2 ? 0x31 : 0x20;
        const __m256i q0 = _mm256_loadu_si256((const void *)(s + hi));
        const __m256i q1 = _mm256_loadu_si256((const void *)(s + 16 + hi));
        const __m256i q2 = _mm256_loadu_si256((const void *)(s + 32 + hi));
        const __m256i q3 = _mm256_loadu_si256((const void *)(s + 48 + hi));
        v[2 * tb] = sel == 0x20 ? _mm256_permute2x128_si256(q0, q1, 0x20)
                                : _mm256_permute2x128_si256(q0, q1, 0x31);
        v[2 * tb + 1] = sel == 0x20 ? _mm256_permute2x128_si256(q2, q3, 0x20)
                                    : _mm256_permute2x128_si256(q2, q3, 0x31);
      }
      /* v[2 tb + j]: outputs 16 tb + 8 j .. + 8 */
      for (uint32_t tb = 0; tb < 4; tb++)
        for (uint32_t j = 0; j < 2; j++) {
          const uint32_t o = p + 16 * tb + 8 * j;
          __m256 a = _mm256_loadu_ps(acc + o);
          if (q4)
            a = _mm256_fmadd_ps(
                hsv,
                _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(dm + o))), dhv), a);
          a = _mm256_fmadd_ps(
              _mm256_cvtepi32_ps(v[2 * tb + j]),
              _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(dd + o))), dhv), a);
          _mm256_storeu_ps(acc + o, a);
        }
    }
  }
}

__attribute__((target(SK__AVX2))) static void sk__down_q8_avx2(const struct sk__row *r,
                                                             uint32_t t0, uint32_t t1,
                                                             uint32_t p0, uint32_t p1,
                                                             float *acc, int32_t *isum) {
  sk__down_tiles_avx2(r, t0, t1, p0, p1, acc, isum, false);
}

__attribute__((target(SK__AVX2))) static void sk__down_q4_avx2(const struct sk__row *r,
                                                             uint32_t t0, uint32_t t1,
                                                             uint32_t p0, uint32_t p1,
                                                             float *acc, int32_t *isum) {
  sk__down_tiles_avx2(r, t0, t1, p0, p1, acc, isum, true);
}
#endif

/* Whether the selected kernels are the AVX-512 VNNI ones. */
static bool sk__use_v512(void) {
#ifdef SK__HAVE_X86
  const char *n = sk_kernels_name();
  return strcmp(n, "avx512-vnni") == 0 || strcmp(n, "amx") == 0;
#else
  return false;
#endif
}

/* Q8_0 up products of the kept neurons [task * per, +per), to uk. */
static void sk__up_q8_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__row *r = ctx;
  const struct sk_sparse_mlp *w = r->w;
  const uint32_t *idx = r->wk->idx, nbx = w->dim / SK_QK;
  const uint32_t k0 = task * r->per, k1 = k0 + r->per < r->nk ? k0 + r->per : r->nk;
  const bool v512 = sk__use_v512();
  (void)v512; /* (only x86 builds have the AVX-512 version) */
  for (uint32_t k = k0; k < k1; k++) {
    const uint8_t *q = w->uq + (size_t)idx[k] * w->dim;
    const uint16_t *d = w->ud + (size_t)idx[k] * nbx;
    /* the rows are scattered: no stream for the prefetcher to follow, so
     * the row SK__UP_AHEAD on is fetched while this one is computed */
    const uint32_t kn = k + SK__UP_AHEAD < k1 ? k + SK__UP_AHEAD : k1 - 1;
    const uint8_t *pf = w->uq + (size_t)idx[kn] * w->dim;
    for (uint32_t b = 0; b < nbx; b += 32) __builtin_prefetch(w->ud + (size_t)idx[kn] * nbx + b, 0, 2);
#ifdef SK__HAVE_X86
    if (v512) r->wk->uk[k] = sk__up_row_v512(q, d, r->x, r->wk->corr, nbx, pf);
    else
#endif
    {
      for (uint32_t b = 0; b < w->dim; b += 64) __builtin_prefetch(pf + b);
      r->wk->uk[k] = sk__up_row_generic(q, d, r->x, nbx);
    }
  }
}

/* Part `task` of the tiles' sum: the blocks of 32 neurons with kept ones
 * are split in SK__PARTS parts, whatever the threads, so that each part
 * reads whole rows (a split of the outputs would read each row in
 * pieces, which the memory system serves slower); every output of part
 * i goes to wk->part row i, and the parts are then added in order. */
static void sk__down_tiles_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__row *r = ctx;
  const struct sk_sparse_mlp *w = r->w;
  const uint32_t t0 = r->n_grp * task / SK__PARTS, t1 = r->n_grp * (task + 1) / SK__PARTS;
  float *acc = r->wk->part + (size_t)task * (r->wk->dim + SK__CH);
  memset(acc, 0, w->ld * sizeof *acc);
#ifdef SK__HAVE_X86
  int32_t *isum = (int32_t *)(void *)(r->wk->tmp + (size_t)thread * 2 * (r->wk->dim + SK__CH));
  const bool v512 = sk__use_v512(), avx2 = !v512 && sk__use_avx2();
  if (v512 && w->down_m) sk__down_q4_v512(r, t0, t1, 0, w->ld, acc, isum);
  else if (v512) sk__down_q8_v512(r, t0, t1, 0, w->ld, acc, isum);
  else if (avx2 && w->down_m) sk__down_q4_avx2(r, t0, t1, 0, w->ld, acc, isum);
  else if (avx2) sk__down_q8_avx2(r, t0, t1, 0, w->ld, acc, isum);
  else
#else
  (void)thread;
#endif
    sk__down_tiles_generic(r, t0, t1, 0, w->ld, acc);
}

/* Outputs [task * per, +per) of y from float rows (F32, F16): the kept
 * rows in order of K, each added times h. */
static void sk__down_float_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__row *r = ctx;
  const struct sk_sparse_mlp *w = r->w;
  const uint32_t o0 = task * r->per;
  if (o0 >= w->dim) return;
  const uint32_t o1 = o0 + r->per < w->dim ? o0 + r->per : w->dim, len = o1 - o0;
  const size_t es = w->down_type == SK_GGML_F32 ? 4 : 2;
  float *y = r->y + o0, *tmp = r->wk->tmp + (size_t)thread * 2 * (r->wk->dim + SK__CH);
  float *acc = tmp + len;
  const float *h = r->wk->g;
  const uint32_t *idx = r->wk->idx;
  const uint8_t *base = (const uint8_t *)w->down + es * o0;
  memset(y, 0, len * sizeof *y);
  /* sums of SK__GROUP rows at a time in acc, each then added to y: a
   * two-level sum, whose rounding error grows with the group and the
   * number of groups rather than with |K| */
  for (uint32_t k0 = 0; k0 < r->nk; k0 += SK__GROUP) {
    const uint32_t n = r->nk - k0 < SK__GROUP ? r->nk - k0 : SK__GROUP;
    const uint8_t *rows[SK__GROUP];
    for (uint32_t k = 0; k < n; k++) rows[k] = base + (size_t)idx[k0 + k] * w->down_row_bytes;
    memset(acc, 0, len * sizeof *acc);
    sk__add_rows_float(w->down_type, rows, h + k0, n, len, acc, tmp);
    sk_kernels_axpy(y, 1.0f, acc, len);
  }
}

uint32_t sk_sparse_mlp_row(const struct sk_sparse_mlp *w, const float *gate, float thr,
                           const struct sk_act *x, float *y, struct sk_sparse_work *wk,
                           struct sk_pool *pool) {
  const uint32_t H = w->hidden, T = sk_pool_threads(pool);
  /* silu of every gate, by the vector kernel (times 1) */
  memcpy(wk->hf, gate, (size_t)H * sizeof *wk->hf);
  sk_kernels_swiglu(wk->hf, wk->ones, H);
  uint32_t nk = 0;
  for (uint32_t j = 0; j < H; j++)
    if (fabsf(wk->hf[j]) > thr) wk->idx[nk++] = j;
  struct sk__row r = {.w = w, .x = x, .wk = wk, .nk = nk, .y = y};
  if (nk) {
    const uint32_t n_tasks = T == 1 ? 1 : 4 * T;
    r.per = (nk + n_tasks - 1) / n_tasks;
    if (w->uq && sk__use_v512()) {
      /* per pair of blocks, 16 lanes: -128 x each block's activation sum
       * in the first lane of its 8 */
      const uint32_t nbx = w->dim / SK_QK;
      memset(wk->corr, 0, ((nbx + 1) / 2 * 16) * sizeof *wk->corr);
      for (uint32_t b = 0; b < nbx; b++) wk->corr[8 * b] = -128 * x->s[b];
      sk_pool_run(pool, sk__up_q8_task, &r, (nk + r.per - 1) / r.per);
      for (uint32_t k = 0; k < nk; k++) wk->g[k] = gate[wk->idx[k]];
    } else {
      sk_pool_run(pool, sk__up_task, &r, (nk + r.per - 1) / r.per);
      for (uint32_t k = 0; k < nk; k++) {
        wk->g[k] = gate[wk->idx[k]];
        wk->uk[k] = wk->u[wk->idx[k]];
      }
    }
    sk_kernels_swiglu(wk->g, wk->uk, nk);
  }
  if (w->down_type == SK_GGML_Q8_0 || w->down_type == SK_GGML_Q4_1) {
    /* h quantized as the dense product quantizes its activations */
    memset(wk->hf, 0, (size_t)H * sizeof *wk->hf);
    for (uint32_t k = 0; k < nk; k++) wk->hf[wk->idx[k]] = wk->g[k];
    sk_kernels_quantize_rows(wk->hf, H, 1, H, wk->hq, wk->hd, wk->hs);
    uint32_t ng = 0;
    for (uint32_t k = 0; k < nk;) {
      const uint32_t g = wk->idx[k] / SK_QK, kb = k;
      for (; k < nk && wk->idx[k] / SK_QK == g; k++) wk->hqk[k] = wk->hq[wk->idx[k]];
      wk->grp[3 * ng] = g;
      wk->grp[3 * ng + 1] = kb;
      wk->grp[3 * ng++ + 2] = k;
    }
    r.n_grp = ng;
    sk_pool_run(pool, sk__down_tiles_task, &r, SK__PARTS);
    memcpy(y, wk->part, w->dim * sizeof *y);
    for (uint32_t i = 1; i < SK__PARTS; i++)
      sk_kernels_axpy(y, 1.0f, wk->part + (size_t)i * (w->dim + SK__CH), w->dim);
    return nk;
  }
  /* float rows: outputs split in multiples of 16 */
  const uint32_t dim = w->dim;
  uint32_t per = (dim + T - 1) / T;
  per = (per + 15) / 16 * 16;
  if (per > dim) per = dim;
  r.per = per;
  sk_pool_run(pool, sk__down_float_task, &r, (dim + per - 1) / per);
  return nk;
}
