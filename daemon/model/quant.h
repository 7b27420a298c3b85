/* Weight block formats of ggml and the scalar conversions around them.
 *
 * Source: ggml/src/ggml-common.h (block_q8_0, block_q4_0) and
 * ggml/src/ggml-quants.c (quantize_row_q8_0_ref, quantize_row_q4_0_ref,
 * dequantize_row_*). A row of `cols` weights (cols a multiple of
 * SK_QK) is cols / SK_QK blocks laid out back to back, exactly as in a
 * GGUF file:
 *
 *   Q8_0  34 bytes: fp16 d, int8 qs[32];        x[j] = d * qs[j]
 *   Q4_0  18 bytes: fp16 d, uint8 qs[16];       x[j]      = d * ((qs[j] & 15) - 8)
 *                                               x[j + 16] = d * ((qs[j] >> 4) - 8)
 *
 * These routines are the portable reference; the hot loops are in
 * kernels.c. Pure functions, no state.
 */
#ifndef SK_QUANT_H
#define SK_QUANT_H

#include <stddef.h>
#include <stdint.h>

#define SK_QK 32u /* elements per Q8_0 / Q4_0 block (ggml QK8_0, QK4_0) */

struct sk_block_q8_0 {
  uint16_t d;       /* scale, IEEE half */
  int8_t qs[SK_QK]; /* quants */
};

struct sk_block_q4_0 {
  uint16_t d;           /* scale, IEEE half */
  uint8_t qs[SK_QK / 2]; /* nibbles: low = element j, high = element j+16 */
};

_Static_assert(sizeof(struct sk_block_q8_0) == 34, "ggml block_q8_0 is 34 bytes");
_Static_assert(sizeof(struct sk_block_q4_0) == 18, "ggml block_q4_0 is 18 bytes");

/* IEEE half -> float, exact (subnormals, inf, nan kept). */
float sk_f16_to_f32(uint16_t h);
/* float -> IEEE half, round to nearest even; overflow gives inf, nan
 * stays nan. */
uint16_t sk_f32_to_f16(float f);
/* bfloat16 -> float, exact. */
float sk_bf16_to_f32(uint16_t h);

/* Bytes of one row of `cols` elements of ggml type `type` (F32, F16,
 * BF16, Q8_0, Q4_0); 0 if the type is not one of these or cols is not a
 * multiple of its block size. */
size_t sk_quant_row_bytes(uint32_t type, uint64_t cols);

/* Quantizes x[0..cols) into cols/SK_QK blocks at out, as ggml's
 * reference quantizers (cols a multiple of SK_QK):
 *   Q8_0: d = max|x| / 127, qs = roundf(x / d);
 *   Q4_0: m = the x of largest |x| (its sign kept), d = m / -8,
 *         q = min(15, (int)(x / d + 8.5)). */
void sk_quantize_row_q8_0(const float *x, uint32_t cols, struct sk_block_q8_0 *out);
void sk_quantize_row_q4_0(const float *x, uint32_t cols, struct sk_block_q4_0 *out);

/* Converts one row of `cols` elements of type `type` (F32, F16, BF16,
 * Q8_0, Q4_0; see sk_quant_row_bytes) at src to floats in out[0..cols).
 * Returns 0, or -1 for an unsupported type. */
int sk_dequantize_row(uint32_t type, const void *src, uint32_t cols, float *out);

#endif
