/* Weight block formats of ggml and the scalar conversions around them.
 *
 * Source: ggml/src/ggml-common.h (the block_* structs, kvalues_iq4nl)
 * and ggml/src/ggml-quants.c (dequantize_row_*, quantize_row_q8_0_ref,
 * quantize_row_q4_0_ref, quantize_row_q8_K_ref). A row of `cols`
 * weights (cols a multiple of the type's block size) is cols / block
 * blocks laid out back to back, exactly as in a GGUF file. "fp16" is an
 * IEEE half; all multi-byte fields are little-endian.
 *
 * Blocks of 32 (the legacy types), element j < 16 from the low nibble of
 * qs[j], element j + 16 from its high nibble:
 *   Q8_0    34 bytes: fp16 d, int8 qs[32];          x = d * q
 *   Q4_0    18 bytes: fp16 d, qs[16];               x = d * (nib - 8)
 *   Q4_1    20 bytes: fp16 d, fp16 m, qs[16];       x = d * nib + m
 *   Q5_0    22 bytes: fp16 d, qh[4], qs[16];        x = d * ((nib | h << 4) - 16)
 *   Q5_1    24 bytes: fp16 d, fp16 m, qh[4], qs[16]; x = d * (nib | h << 4) + m
 *           (h of element e: bit e of the little-endian uint32 qh)
 *   IQ4_NL  18 bytes: fp16 d, qs[16];               x = d * kvalues[nib]
 *
 * Super-blocks of 256 (the K-quants and IQ4_XS):
 *   Q2_K    84 bytes: scales[16], qs[64], fp16 d, fp16 dmin; 16 groups of
 *           16; group g = 8n + 2j + h (n < 2, j < 4, h < 2), element l of
 *           it = (qs[32n + 16h + l] >> 2j) & 3; scale byte s = scales[g]:
 *           x = d * (s & 15) * q - dmin * (s >> 4)
 *   Q3_K   110 bytes: hmask[32], qs[64], scales[12], fp16 d; groups as
 *           Q2_K, q = low 2 bits as Q2_K, minus 4 where bit 4n + j of
 *           hmask[16h + l] is clear; 16 six-bit scales, for g = 4t + k
 *           (t, k < 4): low 4 bits the low nibble of scales[k] (t = 0),
 *           of scales[4 + k] (t = 1), the high nibble of scales[k] (t =
 *           2), of scales[4 + k] (t = 3); high 2 bits (scales[8 + k] >>
 *           2t) & 3: x = d * (sc - 32) * q
 *   Q4_K   144 bytes: fp16 d, fp16 dmin, scales[12], qs[128]; 8 groups of
 *           32, group 2c low nibbles and 2c + 1 high nibbles of qs[32c ..
 *           32c + 32); 6-bit scale sc and min m per group (get_scale_min
 *           below): x = d * sc * q - dmin * m
 *   Q5_K   176 bytes: fp16 d, fp16 dmin, scales[12], qh[32], qs[128]; as
 *           Q4_K, plus bit g of qh[l] as the 5th bit of element l of group g
 *   Q6_K   210 bytes: ql[128], qh[64], int8 scales[16], fp16 d; per half
 *           n (128 elements; ql + 64n, qh + 32n), l < 32: elements l, l +
 *           32, l + 64, l + 96 = low nibble ql[l], low ql[l + 32], high
 *           ql[l], high ql[l + 32], each with 2 bits of qh[l] (bits 0-1,
 *           2-3, 4-5, 6-7) on top, minus 32; element e's scale is
 *           scales[e / 16]: x = d * sc * q
 *   IQ4_XS 136 bytes: fp16 d, uint16 scales_h, scales_l[4], qs[128]; 8
 *           groups of 32 as IQ4_NL blocks (qs + 16 g); 6-bit scale
 *           ls = nibble g of scales_l | 2 bits g of scales_h << 4:
 *           x = d * (ls - 32) * kvalues[nib]
 *
 * Every float expression above is evaluated as written, left to right,
 * each operation rounded to float (no fused multiply-add), as ggml's
 * dequantize_row_* do: the results are bit-identical to ggml's.
 *
 * These routines are the portable reference; the hot loops are in
 * kernels.c. Pure functions, no state.
 */
#ifndef SK_QUANT_H
#define SK_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SK_QK 32u  /* elements per legacy block (ggml QK8_0, QK4_0, ...) */
#define SK_QKK 256u /* elements per super-block (ggml QK_K) */

struct sk_block_q8_0 {
  uint16_t d;       /* scale, IEEE half */
  int8_t qs[SK_QK]; /* quants */
};

struct sk_block_q4_0 {
  uint16_t d;           /* scale, IEEE half */
  uint8_t qs[SK_QK / 2]; /* nibbles: low = element j, high = element j+16 */
};

struct sk_block_q4_1 {
  uint16_t d, m;
  uint8_t qs[SK_QK / 2];
};

struct sk_block_q5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[SK_QK / 2];
};

struct sk_block_q5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[SK_QK / 2];
};

struct sk_block_q2_k {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};

struct sk_block_q3_k {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};

struct sk_block_q4_k {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};

struct sk_block_q5_k {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};

struct sk_block_q6_k {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

struct sk_block_iq4_xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};

_Static_assert(sizeof(struct sk_block_q8_0) == 34, "ggml block_q8_0 is 34 bytes");
_Static_assert(sizeof(struct sk_block_q4_0) == 18, "ggml block_q4_0 is 18 bytes");
_Static_assert(sizeof(struct sk_block_q4_1) == 20, "ggml block_q4_1 is 20 bytes");
_Static_assert(sizeof(struct sk_block_q5_0) == 22, "ggml block_q5_0 is 22 bytes");
_Static_assert(sizeof(struct sk_block_q5_1) == 24, "ggml block_q5_1 is 24 bytes");
_Static_assert(sizeof(struct sk_block_q2_k) == 84, "ggml block_q2_K is 84 bytes");
_Static_assert(sizeof(struct sk_block_q3_k) == 110, "ggml block_q3_K is 110 bytes");
_Static_assert(sizeof(struct sk_block_q4_k) == 144, "ggml block_q4_K is 144 bytes");
_Static_assert(sizeof(struct sk_block_q5_k) == 176, "ggml block_q5_K is 176 bytes");
_Static_assert(sizeof(struct sk_block_q6_k) == 210, "ggml block_q6_K is 210 bytes");
_Static_assert(sizeof(struct sk_block_iq4_xs) == 136, "ggml block_iq4_xs is 136 bytes");

/* The 16 values of IQ4_NL / IQ4_XS nibbles (ggml kvalues_iq4nl). */
extern const int8_t sk_iq4nl_values[16];

/* Q4_K / Q5_K: the 6-bit scale and min of group j < 8 from the 12 packed
 * bytes (ggml get_scale_min_k4): j < 4: sc = q[j] & 63, m = q[j + 4] &
 * 63; else sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4, m = (q[j + 4] >>
 * 4) | (q[j] >> 6) << 4. */
static inline void sk_quant_scale_min_k4(uint32_t j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 15) | (q[j - 4] >> 6) << 4);
    *m = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
  }
}

/* Q3_K: the 16 signed scales (sc - 32) from the 12 packed bytes. */
void sk_quant_scales_q3_k(const uint8_t packed[12], int8_t out[16]);

/* IEEE half -> float, exact (subnormals, inf, nan kept). */
float sk_f16_to_f32(uint16_t h);
/* float -> IEEE half, round to nearest even; overflow gives inf, nan
 * stays nan. */
uint16_t sk_f32_to_f16(float f);
/* bfloat16 -> float, exact. */
float sk_bf16_to_f32(uint16_t h);

/* Whether sinkd runs weights of this ggml type (the 15 types above and
 * F32, F16, BF16). */
bool sk_quant_supported(uint32_t type);
/* Their ggml names, comma-separated ("f32, f16, bf16, q4_0, ..."), for
 * error messages. Static. */
const char *sk_quant_supported_names(void);
/* Elements per block of a supported type (1 for F32/F16/BF16), 0 for
 * another. */
uint32_t sk_quant_block(uint32_t type);

/* Bytes of one row of `cols` elements of ggml type `type`; 0 if the type
 * is not supported (sk_quant_supported) or cols is not a multiple of its
 * block size. */
size_t sk_quant_row_bytes(uint32_t type, uint64_t cols);

/* Quantizes x[0..cols) into cols/SK_QK blocks at out, as ggml's
 * reference quantizers (cols a multiple of SK_QK):
 *   Q8_0: d = max|x| / 127, qs = roundf(x / d);
 *   Q4_0: m = the x of largest |x| (its sign kept), d = m / -8,
 *         q = min(15, (int)(x / d + 8.5)). */
void sk_quantize_row_q8_0(const float *x, uint32_t cols, struct sk_block_q8_0 *out);
void sk_quantize_row_q4_0(const float *x, uint32_t cols, struct sk_block_q4_0 *out);

/* Fills one row of `cols` elements of a supported type with random but
 * valid blocks: every scale and min a finite half, chosen so that the
 * values lie within about [-scale, scale], all quant bits random; from
 * the generator state *seed (advanced). For F32/F16/BF16 the values are
 * uniform in [-scale, scale). Models for tests and benchmarks
 * (sinkd-mkmodel) need no quantizer this way. Returns 0, or -1 for an
 * unsupported type or a cols that is not a multiple of its block. */
int sk_quant_random_row(uint32_t type, uint32_t cols, float scale, uint64_t *seed, void *out);

/* Converts one row of `cols` elements of type `type` (any supported
 * type) at src to floats in out[0..cols), bit-identical to ggml's
 * to_float. src needs no alignment. Returns 0, or -1 for an unsupported
 * type. */
int sk_dequantize_row(uint32_t type, const void *src, uint32_t cols, float *out);

#endif
