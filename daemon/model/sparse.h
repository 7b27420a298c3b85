/* Contextual sparsity of the SwiGLU MLP in decode: per token, only the
 * neurons whose gate activation matters are computed, so the up and down
 * projections of the others are bytes never read.
 *
 * Deja Vu (Liu et al., ICML 2023, "Deja Vu: Contextual Sparsity for
 * Efficient LLMs at Inference Time", sec. 3-4) showed that for a given
 * input most MLP neurons contribute almost nothing and that skipping
 * them is what makes a memory-bound decoder faster. CATS (Lee et al.
 * 2024, "CATS: Contextually-Aware Thresholding for Sparsity in Large
 * Language Models", sec. 3) made it training-free for SwiGLU MLPs: the
 * MLP is down(silu(gate x) * up x); neuron j is kept when
 * |silu(gate_j x)| exceeds a per-layer threshold t, set as the quantile
 * of |silu(gate x)| at the target sparsity over a calibration text (sec.
 * 3.2), and only the kept rows of up and the kept columns of down are
 * computed (sec. 3.3, their custom kernel). sinkd implements CATS's rule:
 *
 *   g = gate x                       (dense: the decision needs every g_j)
 *   K = { j : |silu(g_j)| > t }      (ascending j)
 *   u_j = up_j . x                   for j in K, from up's rows
 *   h_j = silu(g_j) * u_j            for j in K (sk_kernels_swiglu)
 *   y = sum over j in K, in order, of h_j * down^T_j
 *
 * down^T is the down projection read neuron by neuron: a copy the model
 * owns (sk_model_sparse_bytes), exact for F32 and F16 weights, Q8_0 or
 * Q4_1 along the GGUF rows otherwise (struct sk_sparse_mlp below). The up
 * rows of Q8_0 weights are a copy too; other types are read in the GGUF
 * layout (the file's mapping), whatever layout the dense products use.
 *
 * With t = 0 every neuron with silu(g_j) != 0 is kept and y is the dense
 * MLP's output up to the order of the sums of up (and of down for F32
 * and F16 weights, and of the blocks of down otherwise) and, for down
 * types other than Q8_0, the requantization of down to Q8_0 or Q4_1:
 * F32 gives the dense logits to ~1e-6.
 *
 * Determinism: each output element is summed over K in ascending order,
 * whatever the threads, so a row's result depends only on that row.
 *
 * Calibration file (text, SK_SPARSE_CALIB_VERSION):
 *   sinkd-sparsity 1
 *   fingerprint <32 hex digits: the daemon's model fingerprint, store.h>
 *   layers <L>
 *   tokens <tokens of the calibration text>
 *   level <s> <t_0> ... <t_{L-1}>    one line per level, s ascending
 *   measured <s> <m_0> ... <m_{L-1}> sparsity each layer reached on the
 *                                     calibration text (optional)
 * Numbers are printed with %.9g, so they read back to the same floats.
 */
#ifndef SK_SPARSE_H
#define SK_SPARSE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/kernels.h"
#include "model/pool.h"
#include "sinkd/protocol.h"

#define SK_SPARSE_CALIB_VERSION 1u
/* Levels one calibration file may hold. */
#define SK_SPARSE_MAX_LEVELS 16u
/* The levels `sinkd --calibrate` writes: 0.1 to 0.7 in steps of 0.1, the
 * curve of perplexity against sparsity (CATS reports 50% and 70%). */
#define SK_SPARSE_DEFAULT_LEVELS {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f}
/* Two levels closer than this are the same level (a session's sparsity
 * is matched against the file's with it). */
#define SK_SPARSE_LEVEL_EPS 1e-4f

/* Per-layer thresholds for target sparsity levels, bound to one model. */
struct sk_sparse_calib {
  uint8_t model_fp[16];
  uint32_t n_layer;
  uint32_t n_levels;
  uint64_t n_tokens;                   /* calibration tokens */
  float level[SK_SPARSE_MAX_LEVELS];   /* ascending, in (0, 1) */
  float *thr;                          /* (n_levels, n_layer), owned */
  float *measured;                     /* (n_levels, n_layer), owned; NaN
                                          where the file has none */
};

/* Reads a calibration file and checks it against the model: fingerprint
 * (fp) and layer count. On success *c owns its arrays (free with
 * sk_sparse_calib_free). Errors: -SK_ERR_IO (cannot read, or not a
 * regular file of at most SK_LIMIT_SPARSITY_FILE_BYTES: checked before
 * it is read),
 * -SK_ERR_BAD_REQUEST (syntax, values, or made for another model: the
 * message names the file's and the model's fingerprints). */
int sk_sparse_calib_load(const char *path, const uint8_t fp[16], uint32_t n_layer,
                         struct sk_sparse_calib *c, struct sk_error *err);
/* Writes c in the format above to f. Returns 0 or -SK_ERR_IO. */
int sk_sparse_calib_write(FILE *f, const struct sk_sparse_calib *c, struct sk_error *err);
void sk_sparse_calib_free(struct sk_sparse_calib *c);
/* The thresholds (n_layer floats) of level s, or NULL if c (may be NULL)
 * has no such level. */
const float *sk_sparse_calib_find(const struct sk_sparse_calib *c, float s);
/* The levels of c as text ("0.1, 0.2, ..., 0.7") into buf; "none" for NULL. */
const char *sk_sparse_calib_levels(const struct sk_sparse_calib *c, char *buf, size_t n);

/* Collects |silu(gate)| values of a calibration run, per layer, and turns
 * them into thresholds. To bound memory a run keeps every k-th value of
 * the stream (k chosen from the announced total), at most max_per_layer
 * per layer. */
struct sk_sparse_collect;
/* For n_layer layers of hidden neurons and a text of n_tokens tokens.
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_sparse_collect_new(uint32_t n_layer, uint32_t hidden, uint64_t n_tokens,
                          uint32_t max_per_layer, struct sk_sparse_collect **ret,
                          struct sk_error *err);
void sk_sparse_collect_free(struct sk_sparse_collect *c);
/* Adds n rows of gate values (row r at gate + r * hidden) of layer l. */
void sk_sparse_collect_add(struct sk_sparse_collect *c, uint32_t l, const float *gate,
                           uint32_t n);
/* Thresholds for levels[0..n_levels) (ascending, in (0, 1)): for each
 * layer the value below which a fraction `level` of the collected
 * |silu(g)| lie (the sorted samples' element floor(level * count)), so
 * that keeping |silu(g)| > t skips that fraction. Fills out (fp and
 * n_tokens left to the caller; measured: the fraction of samples <= t).
 * Errors: -SK_ERR_BAD_REQUEST (no samples, bad levels), -SK_ERR_NO_MEMORY. */
int sk_sparse_collect_thresholds(struct sk_sparse_collect *c, const float *levels,
                                 uint32_t n_levels, struct sk_sparse_calib *out,
                                 struct sk_error *err);

/* The weights of one layer's sparse MLP, in the layouts its kernels
 * read (sk_sparse_prepare). Read only after preparation.
 *
 * up: Q8_0 up projections get a copy (uq, ud) when the selected kernels
 * are avx512-vnni or amx: row j = neuron j's dim
 * quants plus 128 as bytes (vpdpbusd multiplies unsigned by signed bytes;
 * the offset is taken back exactly with the activation block sums), its
 * dim / 32 fp16 scales apart; the same bytes per row as the GGUF rows.
 * Other types: the GGUF rows (up).
 *
 * down: F32 and F16 down projections are transposed (down_type F32/F16):
 * row j = neuron j's dim outputs, exact. Quantized types of more than
 * 4.5 bits per weight become "Q8 tiles" (down_type Q8_0): the down projection quantized as Q8_0
 * along its rows (the GGUF orientation: one scale per output and block
 * of 32 neurons; a Q8_0 file's own quants and scales, bit for bit; other
 * types dequantized and requantized), stored neuron-major: row j = the
 * quants of neuron j for every output, plus 128, ld bytes (dim rounded
 * up to 64, each 64 permuted so that vpdpbusd's interleave of four rows
 * comes out in output order, sparse.c), and the scales apart, down_d
 * (hidden / 32, ld) fp16. The kept neurons' h is quantized as the dense
 * down product's activations are (sk_kernels_quantize_rows, the skipped
 * neurons 0), so every output is, as in the dense kernels, a sum over
 * the blocks of 32 neurons, in order, of fmaf(exact int32 block sum,
 * fp16 scale * activation scale, sum), except that the blocks with kept
 * neurons are split in 4 parts (by count, whatever the threads) summed
 * apart, then added in order: with every neuron kept, the dense Q8_0
 * product up to that order of its float sums. Down types of at most 4.5
 * bits per weight (Q4_0, Q4_1, Q4_K, IQ4_NL, IQ4_XS, Q3_K, Q2_K) become
 * "Q4 tiles" instead (down_type Q4_1): requantized as Q4_1 (ggml's
 * quantize_row_q4_1_ref: w = d q + m, q in 0..15) along the GGUF rows,
 * the same layout with two outputs per byte (tile bytes 0..31 of each 64
 * in the low nibbles of 32 bytes, 32..63 in the high ones, ld / 2 bytes
 * a neuron) and the minimums apart too (down_m); each block of 32
 * neurons adds fmaf(exact int32 sum of hq q, d * activation scale,
 * fmaf(sum of the block's hq, m * activation scale, sum)). */
struct sk_sparse_mlp {
  uint32_t hidden, dim;
  struct sk_wmat up;       /* (hidden, dim) the GGUF layout (packed NULL) */
  const uint8_t *uq;       /* Q8_0 up: (hidden, dim) quants + 128, or NULL */
  const uint16_t *ud;      /* Q8_0 up: (hidden, dim / 32) fp16 scales */
  uint32_t down_type;      /* SK_GGML_F32, SK_GGML_F16, SK_GGML_Q8_0 (Q8
                              tiles) or SK_GGML_Q4_1 (Q4 tiles) */
  uint32_t ld;             /* tiles: dim rounded up to 64 */
  size_t down_row_bytes;   /* bytes of one neuron's row of down */
  const void *down;        /* (hidden, down_row_bytes) */
  const uint16_t *down_d;  /* tiles: (hidden / 32, ld) fp16 scales */
  const uint16_t *down_m;  /* Q4 tiles: (hidden / 32, ld) fp16 minimums */
};

/* Makes w from one layer's up (hidden rows of dim) and down (dim rows of
 * hidden) projections. *ret_mem is the one malloc'd copy both point into
 * (caller frees with free(), after the last use), *ret_bytes its size.
 * Errors: -SK_ERR_BAD_MODEL (a type sk_dequantize_row cannot read, or
 * mismatched shapes), -SK_ERR_NO_MEMORY. */
int sk_sparse_prepare(struct sk_sparse_mlp *w, const struct sk_wmat *up,
                      const struct sk_wmat *down, void **ret_mem, size_t *ret_bytes,
                      struct sk_error *err);

/* The weight of output o (< dim) for neuron j (< hidden) in w's down
 * copy, dequantized (for tests). */
float sk_sparse_down_weight(const struct sk_sparse_mlp *w, uint32_t j, uint32_t o);

/* Work buffers of sk_sparse_mlp_row, for hidden neurons, dim outputs and
 * n_threads threads. */
struct sk_sparse_work {
  uint32_t hidden, dim, n_threads;
  uint32_t *idx;  /* (hidden) kept neurons */
  float *u;       /* (hidden) up outputs at their neuron */
  float *g;       /* (hidden) kept gates, then h */
  float *uk;      /* (hidden) kept up outputs */
  float *hf;      /* (hidden) silu of the gates, then h at every neuron,
                     0 where skipped */
  float *ones;    /* (hidden) 1.0f */
  int8_t *hq;     /* (hidden) h quantized (tiles) */
  int8_t *hqk;    /* (hidden) hq of the kept neurons */
  float *hd;      /* (hidden / 32) their block scales */
  int32_t *hs;    /* (hidden / 32) their block sums */
  uint32_t *grp;  /* (hidden / 32 + 1, 3) blocks with kept neurons: block,
                     first and end of its kept neurons */
  int32_t *corr;  /* (dim / 4 + 16) -128 x the activation block sums */
  float *tmp;     /* (n_threads, 2 * (dim + 64)) dequantized rows and
                     partial sums (float rows), int32 sums (tiles) */
  float *part;    /* (4, dim + 64) the tiles' partial sums */
};
int sk_sparse_work_init(struct sk_sparse_work *w, uint32_t hidden, uint32_t dim,
                        uint32_t n_threads, struct sk_error *err);
void sk_sparse_work_free(struct sk_sparse_work *w);

/* One token's MLP by the rule above: gate = its hidden gate values, x =
 * its input as one activation row (float and, for quantized up weights,
 * int8 as the kernels want), y = the dim outputs (overwritten). thr is the
 * layer's threshold (>= 0), compared with silu as sk_kernels_swiglu
 * computes it (within ~2 ulp of the calibration's expf). Runs on pool
 * (may be NULL). Returns |K|.
 * Kernels: AVX-512 VNNI (vpdpbusd) for Q8_0 up (its copy is made only
 * then) and the tiles when the selected kernel variant is avx512-vnni or
 * amx; AVX2 (vpmaddwd) for the tiles with the other x86 variants; the
 * tiles' kernels all give the portable code's bits. sk_kernels_matmul
 * on the GGUF rows of other up types (and of Q8_0 up without AVX-512),
 * sk_kernels_axpy for float down rows. */
uint32_t sk_sparse_mlp_row(const struct sk_sparse_mlp *w, const float *gate, float thr,
                           const struct sk_act *x, float *y, struct sk_sparse_work *wk,
                           struct sk_pool *pool);

/* Bytes of weights the sparse MLP of one token reads beyond the gate
 * when it keeps `kept` neurons (a mean, hence a double): kept rows of up
 * and of down, plus, for Q8 tiles, every block's scales (a block
 * without a kept neuron is not read; counted anyway). */
double sk_sparse_step_bytes(const struct sk_sparse_mlp *w, double kept);

#endif
