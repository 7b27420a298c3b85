/* Compute kernels of the forward pass: matrix products with weights in
 * any type sinkd runs (quant.h: F32, F16, BF16, the legacy 32-element
 * block types and the 256-element K-quants and IQ4_XS), the activation
 * quantizers, and the vector primitives of attention.
 *
 * Variants (chosen once at run time, sk_kernels_select):
 *   generic    portable C; the compiler's baseline ISA (SSE2 on x86-64)
 *   avx2       AVX2 + FMA + F16C (x86-64), compiled with target
 *              attributes, so the build needs no -march flag
 *   avx2-vnni  avx2 with the int8 dot products of AVX-VNNI (vpdpbusd)
 *   avx512-vnni  avx2, except for Q8_0/Q4_0 products: 512-bit vpdpbusd
 *              (AVX-512 F/BW/VL/VNNI) on weights packed 16 rows at a
 *              time, bit-identical to avx2-vnni, and Q4_K and Q6_K
 *              products: 16 output rows in the int32 lanes of 512-bit
 *              vpdpbusd on weights packed 16 rows at a time, within
 *              float rounding of avx2, and the Q8_K activation quantizer (the same
 *              bits) (kernels-avx512.inc)
 *   amx        avx512-vnni, except for Q8_0 products of 16 and more
 *              activation rows: tiles of 16 rows x 16 outputs x one
 *              32-byte block multiplied by AMX (TDPBSUD, AMX-TILE +
 *              AMX-INT8) in avx512-vnni's packed weights, then avx512-vnni's
 *              float steps per block; bit-identical to avx2-vnni
 *              (kernels-amx.inc; Q4_0 stays avx512-vnni's: on AMX it
 *              measured slower). Chosen only where CPUID reports AMX, XCR0
 *              enables the tile state and the OS grants it (Linux:
 *              arch_prctl ARCH_REQ_XCOMP_PERM); each thread loads the tile
 *              configuration on its first AMX product
 *
 * Which types each variant vectorizes: all of them in avx2 and avx2-vnni;
 * the avx512-vnni and amx variants use avx2's for all but F32, Q8_0,
 * Q4_0, Q4_K and Q6_K (their own; the K-quants' weights packed 16 rows
 * across the lanes of 512-bit vectors, vpdpbusd) and the other K-quants
 * and IQ4_XS (avx2's with the int16 dot products of AVX-512 VNNI,
 * vpdpwssd).
 *
 * Quantized weights are multiplied as ggml does (ggml_vec_dot_*_q8_0,
 * *_q8_1, *_q8_K): each activation row is first quantized, then every
 * block pair gives an exact integer dot product, scaled by the two block
 * scales and summed in float.
 *   - Legacy types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): 32-element int8
 *     blocks with one float scale per block (ggml's block_q8_0, except
 *     that the scale stays a float) and the block's sum of quants, which
 *     Q4_1/Q5_1 multiply by their block minimum (ggml's block_q8_1 s).
 *   - K-quants and IQ4_XS: ggml's block_q8_K, 256-element int8 blocks
 *     with d = max / -127 (max: the value of largest magnitude) and the
 *     sums of every 16 quants. Per super-block the kernels form exact
 *     integer sums of sub-scale x quant dot products (and of sub-min x
 *     activation sums), scaled by d_w d_x (and dmin_w d_x) and summed in
 *     float: generic per super-block, the x86 variants in 8 lanes
 *     (kernels-x86.inc), but packed Q4_K and Q6_K on avx512-vnni and amx:
 *     per super-block in each output row's own lane (kernels-avx512.inc).
 *
 * Determinism: within one variant, every output element is computed by
 * the same sequence of floating-point operations whatever the number of
 * rows in the product, the output range a thread takes, or the thread.
 * A session's results therefore do not depend on what else is batched
 * with it. Variants differ from each other in the last bits (F32, F16,
 * BF16, the K-quants and IQ4_XS: avx2, avx2-vnni, avx512-vnni and amx
 * are identical, but for packed Q4_K and Q6_K, where avx512-vnni and
 * amx are identical to each other; legacy quantized: avx2-vnni, avx512-vnni and amx are
 * identical to each other for Q8_0/Q4_0 and sum per block in a
 * different order than avx2).
 */
#ifndef SK_KERNELS_H
#define SK_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/quant.h"
#include "sinkd/protocol.h"

/* Selects the variant by name: "auto" or NULL = the best the CPU runs
 * (amx, avx512-vnni, avx2-vnni, avx2, generic), which is also what is used
 * without a selection. Process-wide: call before loading a model (the
 * loader packs weights for the selected variant) and never while a
 * kernel runs. Errors: -SK_ERR_BAD_REQUEST for an unknown name or a
 * variant this CPU cannot run (message lists the ones it can). */
int sk_kernels_select(const char *name, struct sk_error *err);
/* Name of the selected variant. Static. */
const char *sk_kernels_name(void);
/* Whether this CPU can run the variant `name`. */
bool sk_kernels_supported(const char *name);
/* Whether `name` is a variant of this build, whether or not this CPU
 * runs it. */
bool sk_kernels_known(const char *name);
/* The variants this CPU can run, best first, space-separated. Static. */
const char *sk_kernels_available(void);

/* A weight matrix: rows x cols, row-major, one row = cols elements of
 * `type` (any type of sk_quant_supported) taking row_bytes bytes. y = W x maps cols
 * inputs to rows outputs. data is not owned. */
struct sk_wmat {
  uint32_t type;      /* enum sk_ggml_type */
  uint32_t rows;      /* output features */
  uint32_t cols;      /* input features; a multiple of the type's block */
  size_t row_bytes;   /* sk_quant_row_bytes(type, cols) */
  const void *data;   /* (rows, row_bytes), the GGUF layout */
  const void *packed; /* the same weights in the selected kernels' own
                         layout (sk_kernels_pack), or NULL */
  uint32_t pack_rows; /* rows per group of that layout (quantized: 8
                         avx2-vnni, 16 avx512-vnni and amx, which share
                         theirs, Q4_K and Q6_K too; F32: 8, every x86
                         variant); kernels that read another layout use
                         data instead */
};

/* Repacks a matrix into the layout the selected kernels read fastest, if
 * they have one: Q8_0 and Q4_0 weights for avx2-vnni (8 rows interleaved per
 * block, see kernels-x86.inc) and avx512-vnni and amx (16 rows,
 * kernels-avx512.inc); Q4_K and Q6_K weights for avx512-vnni and amx
 * (16 rows across the vector lanes, kernels-avx512.inc); F32 weights for
 * every x86 variant (8-row groups of 8-column blocks, kernels-x86.inc
 * above tile_pf, the same bits as the GGUF layout). A variant selected
 * later that reads another layout, or
 * none, uses the GGUF data: right results, not the packed speed. When it
 * packs, *ret_mem is a malloc'd buffer the caller frees after the
 * matrix's last use (free), w->packed points into it and w->pack_rows is
 * set; the packed copy has the same size as the data, plus the padding of
 * a partial last group (and, for F32, of a partial last block of 8
 * columns; for Q6_K, 32 bytes per 16 rows' super-block, which puts each
 * on cache lines). Otherwise *ret_mem is NULL and w is left alone. Call after
 * sk_kernels_select, before the first product. Errors: -SK_ERR_NO_MEMORY. */
int sk_kernels_pack(struct sk_wmat *w, void **ret_mem, struct sk_error *err);

/* Whether products with weights of this type need activations quantized
 * in 32-element blocks (sk_kernels_quantize_rows: the legacy types). */
bool sk_wmat_needs_q8(const struct sk_wmat *w);
/* Whether they need activations quantized in 256-element blocks
 * (sk_kernels_quantize_rows_k: the K-quants and IQ4_XS). */
bool sk_wmat_needs_q8k(const struct sk_wmat *w);

/* Activations: n rows of cols values, as floats and, for quantized
 * weights, as int8 blocks. Not owned. */
struct sk_act {
  uint32_t n;       /* rows */
  uint32_t cols;
  const float *f;   /* (n, ldf) floats; F32/F16/BF16 weights read these */
  size_t ldf;       /* stride of f, >= cols */
  const int8_t *q;  /* (n, cols) quants; legacy quantized weights read these */
  const float *d;   /* (n, cols / SK_QK) block scales */
  const int32_t *s; /* (n, cols / SK_QK) block sums of q */
  const int8_t *kq; /* (n, cols) Q8_K quants; K-quant and IQ4_XS weights */
  const float *kd;  /* (n, cols / SK_QKK) their scales */
  const int16_t *ks; /* (n, cols / 16) sums of every 16 of kq */
};

/* Quantizes n rows of cols floats (stride ldf; cols a multiple of SK_QK)
 * to q (n, cols), d and s (n, cols / SK_QK): per 32-block d = max|x| /
 * 127, q = x / d rounded to nearest even (0 when the block is all zero),
 * s = the sum of the block's q. Each row's result depends only on that
 * row, and is the same for every variant. */
void sk_kernels_quantize_rows(const float *x, size_t ldf, uint32_t n, uint32_t cols,
                              int8_t *q, float *d, int32_t *s);

/* Quantizes n rows of cols floats (stride ldf; cols a multiple of
 * SK_QKK) as ggml's quantize_row_q8_K_ref: per 256-block, max = the
 * value of largest |x| (the first such), q = min(127, x * (-127 / max)
 * rounded to nearest even) and d = 1 / (-127 / max) (all zero for an
 * all-zero block; a NaN element gives q = 0 and no maximum), bs = the
 * sums of every 16 q. q (n, cols), d (n, cols / SK_QKK), bs (n, cols /
 * 16). The same bits in every variant. */
void sk_kernels_quantize_rows_k(const float *x, size_t ldf, uint32_t n, uint32_t cols, int8_t *q,
                                float *d, int16_t *bs);

/* Computes y[i][o] = sum_k W[o][k] * x[i][k] for every row i < x->n and
 * output o in [o0, o1) (o1 <= w->rows), writing y[i][o] = y_rows[i][o].
 * Requires x->cols == w->cols, and q/d/s (legacy types) or kq/kd/ks
 * (K-quants, IQ4_XS) set for quantized weights. Threads
 * may run disjoint output ranges at once. */
void sk_kernels_matmul(const struct sk_wmat *w, const struct sk_act *x, float *const *y_rows,
                       uint32_t o0, uint32_t o1);

/* sum_i a[i] * b[i] over n floats. */
float sk_kernels_dot(const float *a, const float *b, uint32_t n);
/* y[i] += a * x[i] for i < n. */
void sk_kernels_axpy(float *y, float a, const float *x, uint32_t n);

/* Attention scores: out[p] = sum_j q[j] * rows[p][j] for p < n, j < hd
 * (rows: n key rows of hd floats each, anywhere in memory, e.g. in the
 * slots of a KV cache). Each score depends only on q and its row (not on
 * n or p). */
void sk_kernels_scores(const float *q, const float *const *rows, uint32_t n, uint32_t hd,
                       float *out);
/* Attention output: out[j] = sum over p < n, in order of p, of
 * w[p] * rows[p][j], for j < hd (out is overwritten). */
void sk_kernels_wsum(float *out, const float *w, const float *const *rows, uint32_t n,
                     uint32_t hd);
/* The same two over rows of IEEE binary16 (an f16 KV cache): each
 * element is converted exactly to float, then as above. */
void sk_kernels_scores_f16(const float *q, const uint16_t *const *rows, uint32_t n, uint32_t hd,
                           float *out);
void sk_kernels_wsum_f16(float *out, const float *w, const uint16_t *const *rows, uint32_t n,
                         uint32_t hd);
/* wsum and wsum_f16 going on from out instead of overwriting it: the
 * sums of each element continue in the same order, so wsum over rows
 * [0, n) gives the bits of wsum over [0, m) then wsum_add over [m, n)
 * (attention walks a cache in blocks of slots this way). */
void sk_kernels_wsum_add(float *out, const float *w, const float *const *rows, uint32_t n,
                         uint32_t hd);
void sk_kernels_wsum_add_f16(float *out, const float *w, const uint16_t *const *rows, uint32_t n,
                             uint32_t hd);
/* y[i] = x[i] rounded to IEEE binary16 (nearest even), i < n: the same
 * bits in every variant (sk_f32_to_f16). */
void sk_kernels_to_f16(uint16_t *y, const float *x, size_t n);
/* y[i] = x[i], an IEEE binary16, as a float, i < n: exact, the same bits
 * as sk_f16_to_f32 in every variant (a NaN stays a NaN). */
void sk_kernels_from_f16(float *y, const uint16_t *x, size_t n);
/* Softmax of row[0..n) scaled by scale, as ggml_soft_max_ext: row[j] =
 * exp(row[j] * scale - max) / sum, the sum accumulated in double. The
 * vector variants use ggml's vectorized expf (ggml_v_expf, within ~2 ulp
 * of expf), as llama.cpp does; generic uses expf. If ret_entropy is not
 * NULL it receives the distribution's entropy in nats, without a log per
 * entry: with e_j = exp(x_j - max), S = sum e_j,
 * H = log S - sum e_j (x_j - max) / S. */
void sk_kernels_softmax(float *row, uint32_t n, float scale, double *ret_entropy);
/* SwiGLU: g[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n (SiLU of the
 * gate times the up projection; ggml_v_silu's expf in vector variants). */
void sk_kernels_swiglu(float *g, const float *u, size_t n);
/* RoPE on one head (LLAMA_ROPE_TYPE_NORM, adjacent pairs): for each pair
 * i < rope_dim / 2, with c = cos2[2i] = cos2[2i+1] and s = sin2[2i+1] =
 * -sin2[2i]:
 *   y[2i] = x[2i] * c - x[2i+1] * s,  y[2i+1] = x[2i] * s + x[2i+1] * c,
 * each product rounded, then the sum (no fused multiply-add): the same
 * bits in every variant. y may equal x; elements from rope_dim on are
 * not touched. */
void sk_kernels_rope(float *y, const float *x, const float *cos2, const float *sin2,
                     uint32_t rope_dim);
/* sk_kernels_rope of n rows: row r from x[r] (head_dim floats) to
 * y + r * head_dim with angles cos2/sin2 + r * rope_dim; elements from
 * rope_dim to head_dim are copied (x[r] may be row r of y: in place). */
void sk_kernels_rope_rows(float *y, const float *const *x, const float *cos2, const float *sin2,
                          uint32_t n, uint32_t rope_dim, uint32_t head_dim);

#endif
