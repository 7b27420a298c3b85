/* Block formats and conversions (see quant.h). */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "gguf.h"

float sk_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    /* zero or subnormal: mant * 2^-24, exact in float */
    float f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  if (exp == 31)
    bits = sign | 0x7f800000u | (mant << 13); /* inf / nan */
  else
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t sk_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  uint32_t sign = (x >> 16) & 0x8000, e8 = (x >> 23) & 0xff, mant = x & 0x7fffff;
  if (e8 == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  int32_t e = (int32_t)e8 - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) { /* subnormal half (or zero), round to nearest even */
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000;
    uint32_t shift = (uint32_t)(14 - e), h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  /* A carry out of the mantissa correctly bumps the exponent (up to inf). */
  uint32_t h = sign | (uint32_t)e << 10 | mant >> 13, rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}

float sk_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

size_t sk_quant_row_bytes(uint32_t type, uint64_t cols) {
  if (cols == 0 || cols > ((uint64_t)1 << 32)) return 0;
  switch (type) {
  case SK_GGML_F32: return (size_t)cols * 4;
  case SK_GGML_F16:
  case SK_GGML_BF16: return (size_t)cols * 2;
  case SK_GGML_Q8_0:
    return cols % SK_QK ? 0 : (size_t)(cols / SK_QK) * sizeof(struct sk_block_q8_0);
  case SK_GGML_Q4_0:
    return cols % SK_QK ? 0 : (size_t)(cols / SK_QK) * sizeof(struct sk_block_q4_0);
  default: return 0;
  }
}

void sk_quantize_row_q8_0(const float *x, uint32_t cols, struct sk_block_q8_0 *out) {
  for (uint32_t b = 0; b < cols / SK_QK; b++) {
    const float *xb = x + (size_t)b * SK_QK;
    float amax = 0.0f;
    for (uint32_t j = 0; j < SK_QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = sk_f32_to_f16(d);
    for (uint32_t j = 0; j < SK_QK; j++) out[b].qs[j] = (int8_t)roundf(xb[j] * id);
  }
}

void sk_quantize_row_q4_0(const float *x, uint32_t cols, struct sk_block_q4_0 *out) {
  for (uint32_t b = 0; b < cols / SK_QK; b++) {
    const float *xb = x + (size_t)b * SK_QK;
    float amax = 0.0f, max = 0.0f;
    for (uint32_t j = 0; j < SK_QK; j++) {
      if (amax < fabsf(xb[j])) {
        amax = fabsf(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = sk_f32_to_f16(d);
    for (uint32_t j = 0; j < SK_QK / 2; j++) {
      int q0 = (int)(xb[j] * id + 8.5f), q1 = (int)(xb[j + SK_QK / 2] * id + 8.5f);
      if (q0 > 15) q0 = 15;
      if (q1 > 15) q1 = 15;
      out[b].qs[j] = (uint8_t)(q0 | q1 << 4);
    }
  }
}

int sk_dequantize_row(uint32_t type, const void *src, uint32_t cols, float *out) {
  switch (type) {
  case SK_GGML_F32:
    memcpy(out, src, (size_t)cols * sizeof(float));
    return 0;
  case SK_GGML_F16:
  case SK_GGML_BF16: {
    const uint8_t *p = src;
    for (uint32_t i = 0; i < cols; i++) {
      uint16_t h;
      memcpy(&h, p + 2 * (size_t)i, 2);
      out[i] = type == SK_GGML_F16 ? sk_f16_to_f32(h) : sk_bf16_to_f32(h);
    }
    return 0;
  }
  case SK_GGML_Q8_0: {
    const struct sk_block_q8_0 *b = src;
    for (uint32_t i = 0; i < cols / SK_QK; i++) {
      float d = sk_f16_to_f32(b[i].d);
      for (uint32_t j = 0; j < SK_QK; j++) out[i * SK_QK + j] = d * (float)b[i].qs[j];
    }
    return 0;
  }
  case SK_GGML_Q4_0: {
    const struct sk_block_q4_0 *b = src;
    for (uint32_t i = 0; i < cols / SK_QK; i++) {
      float d = sk_f16_to_f32(b[i].d);
      for (uint32_t j = 0; j < SK_QK / 2; j++) {
        out[i * SK_QK + j] = d * (float)((b[i].qs[j] & 15) - 8);
        out[i * SK_QK + j + SK_QK / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
      }
    }
    return 0;
  }
  default: return -1;
  }
}
