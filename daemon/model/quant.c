/* Block formats and conversions (see quant.h). */
#include "model/quant.h"

#include <math.h>
#include <string.h>

#include "model/gguf.h"

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

const int8_t sk_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

void sk_quant_scales_q3_k(const uint8_t packed[12], int8_t out[16]) {
  for (uint32_t g = 0; g < 16; g++) {
    const uint32_t t = g / 4, k = g % 4;
    const uint8_t lo = t < 2 ? packed[4 * t + k] & 15 : packed[4 * (t - 2) + k] >> 4;
    const uint8_t hi = (packed[8 + k] >> (2 * t)) & 3;
    out[g] = (int8_t)((lo | hi << 4) - 32);
  }
}

/* The supported types, in the order error messages list them. */
static const uint32_t sk__supported[] = {
    SK_GGML_F32,  SK_GGML_F16,  SK_GGML_BF16, SK_GGML_Q4_0, SK_GGML_Q4_1,
    SK_GGML_Q5_0, SK_GGML_Q5_1, SK_GGML_Q8_0, SK_GGML_Q2_K, SK_GGML_Q3_K,
    SK_GGML_Q4_K, SK_GGML_Q5_K, SK_GGML_Q6_K, SK_GGML_IQ4_NL, SK_GGML_IQ4_XS,
};
#define SK__N_SUPPORTED (sizeof sk__supported / sizeof sk__supported[0])

bool sk_quant_supported(uint32_t type) {
  for (size_t i = 0; i < SK__N_SUPPORTED; i++)
    if (sk__supported[i] == type) return true;
  return false;
}

const char *sk_quant_supported_names(void) {
  return "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, "
         "iq4_nl, iq4_xs";
}

uint32_t sk_quant_block(uint32_t type) {
  uint32_t blck, size;
  if (!sk_quant_supported(type) || !sk_ggml_type_layout(type, &blck, &size)) return 0;
  return blck;
}

size_t sk_quant_row_bytes(uint32_t type, uint64_t cols) {
  uint32_t blck, size;
  if (cols == 0 || cols > ((uint64_t)1 << 32)) return 0;
  if (!sk_quant_supported(type) || !sk_ggml_type_layout(type, &blck, &size)) return 0;
  if (cols % blck) return 0;
  return (size_t)(cols / blck) * size;
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

/* xorshift64*: the random bits of sk_quant_random_row. */
static uint64_t sk__rand(uint64_t *s) {
  uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

/* A random finite half in [-lim, lim] (or [0, lim] if !sign). */
static uint16_t sk__rand_half(uint64_t *seed, float lim, bool sign) {
  float u = (float)((double)(sk__rand(seed) >> 11) * 0x1.0p-53);
  float v = sign ? (2.0f * u - 1.0f) * lim : u * lim;
  return sk_f32_to_f16(v);
}

int sk_quant_random_row(uint32_t type, uint32_t cols, float scale, uint64_t *seed, void *out) {
  const size_t rb = sk_quant_row_bytes(type, cols);
  if (rb == 0) return -1;
  uint8_t *o = out;
  if (type == SK_GGML_F32 || type == SK_GGML_F16 || type == SK_GGML_BF16) {
    for (uint32_t i = 0; i < cols; i++) {
      float v = (float)(((double)(sk__rand(seed) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale);
      if (type == SK_GGML_F32) {
        memcpy(o + 4 * (size_t)i, &v, 4);
      } else {
        uint16_t h;
        if (type == SK_GGML_F16) {
          h = sk_f32_to_f16(v);
        } else {
          uint32_t b;
          memcpy(&b, &v, 4);
          h = (uint16_t)(b >> 16); /* truncation: a valid bfloat16 */
        }
        memcpy(o + 2 * (size_t)i, &h, 2);
      }
    }
    return 0;
  }
  for (size_t i = 0; i < rb; i++) o[i] = (uint8_t)(sk__rand(seed) >> 56);
  /* Now every fp16 field: a finite value, chosen so that the largest
   * quant times the largest sub-scale gives about `scale`. */
  const uint32_t blck = sk_quant_block(type);
  const size_t bs = rb / (cols / blck);
  for (uint8_t *b = o; b < o + rb; b += bs) {
    uint16_t h[2];
    switch (type) {
    case SK_GGML_Q8_0:
      h[0] = sk__rand_half(seed, scale / 128.0f, true);
      memcpy(b, h, 2);
      break;
    case SK_GGML_Q4_0:
    case SK_GGML_Q5_0:
      h[0] = sk__rand_half(seed, scale / 16.0f, true);
      memcpy(b, h, 2);
      break;
    case SK_GGML_IQ4_NL:
      h[0] = sk__rand_half(seed, scale / 128.0f, true);
      memcpy(b, h, 2);
      break;
    case SK_GGML_Q4_1:
    case SK_GGML_Q5_1:
      h[0] = sk__rand_half(seed, scale / (type == SK_GGML_Q4_1 ? 16.0f : 32.0f), false);
      h[1] = sk__rand_half(seed, scale / 2.0f, true);
      memcpy(b, h, 4);
      break;
    case SK_GGML_Q2_K:
      h[0] = sk__rand_half(seed, scale / 45.0f, false);
      h[1] = sk__rand_half(seed, scale / 30.0f, false);
      memcpy(b + offsetof(struct sk_block_q2_k, d), h, 4);
      break;
    case SK_GGML_Q3_K:
      h[0] = sk__rand_half(seed, scale / 128.0f, true);
      memcpy(b + offsetof(struct sk_block_q3_k, d), h, 2);
      break;
    case SK_GGML_Q4_K:
    case SK_GGML_Q5_K:
      h[0] = sk__rand_half(seed, scale / (type == SK_GGML_Q4_K ? 945.0f : 1953.0f), false);
      h[1] = sk__rand_half(seed, scale / 126.0f, false);
      memcpy(b, h, 4);
      break;
    case SK_GGML_Q6_K:
      h[0] = sk__rand_half(seed, scale / 4096.0f, true);
      memcpy(b + offsetof(struct sk_block_q6_k, d), h, 2);
      break;
    case SK_GGML_IQ4_XS:
      h[0] = sk__rand_half(seed, scale / 4064.0f, true);
      memcpy(b, h, 2);
      break;
    default: return -1;
    }
  }
  return 0;
}

static inline float sk__half(const void *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return sk_f16_to_f32(h);
}

/* The 5th bit of element e < 32 of a Q5_0 / Q5_1 block. */
static inline int sk__q5_hbit(const uint8_t qh[4], uint32_t e) {
  uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
               (uint32_t)qh[3] << 24;
  return (int)((h >> e) & 1) << 4;
}

static void sk__deq_legacy(uint32_t type, const uint8_t *src, uint32_t cols, float *out) {
  uint32_t blck, size;
  sk_ggml_type_layout(type, &blck, &size);
  for (uint32_t i = 0; i < cols / SK_QK; i++, src += size, out += SK_QK) {
    const float d = sk__half(src);
    switch (type) {
    case SK_GGML_Q8_0:
      for (uint32_t j = 0; j < SK_QK; j++) out[j] = d * (float)(int8_t)src[2 + j];
      break;
    case SK_GGML_Q4_0:
      for (uint32_t j = 0; j < 16; j++) {
        out[j] = (float)((src[2 + j] & 15) - 8) * d;
        out[j + 16] = (float)((src[2 + j] >> 4) - 8) * d;
      }
      break;
    case SK_GGML_IQ4_NL:
      for (uint32_t j = 0; j < 16; j++) {
        out[j] = d * (float)sk_iq4nl_values[src[2 + j] & 15];
        out[j + 16] = d * (float)sk_iq4nl_values[src[2 + j] >> 4];
      }
      break;
    case SK_GGML_Q4_1: {
      const float m = sk__half(src + 2);
      for (uint32_t j = 0; j < 16; j++) {
        out[j] = (float)(src[4 + j] & 15) * d + m;
        out[j + 16] = (float)(src[4 + j] >> 4) * d + m;
      }
      break;
    }
    case SK_GGML_Q5_0: {
      const uint8_t *qh = src + 2, *qs = src + 6;
      for (uint32_t j = 0; j < 16; j++) {
        out[j] = (float)(((qs[j] & 15) | sk__q5_hbit(qh, j)) - 16) * d;
        out[j + 16] = (float)(((qs[j] >> 4) | sk__q5_hbit(qh, j + 16)) - 16) * d;
      }
      break;
    }
    case SK_GGML_Q5_1: {
      const float m = sk__half(src + 2);
      const uint8_t *qh = src + 4, *qs = src + 8;
      for (uint32_t j = 0; j < 16; j++) {
        out[j] = (float)((qs[j] & 15) | sk__q5_hbit(qh, j)) * d + m;
        out[j + 16] = (float)((qs[j] >> 4) | sk__q5_hbit(qh, j + 16)) * d + m;
      }
      break;
    }
    default: break;
    }
  }
}

static void sk__deq_k(uint32_t type, const uint8_t *src, uint32_t cols, float *y) {
  for (uint32_t i = 0; i < cols / SK_QKK; i++) {
    switch (type) {
    case SK_GGML_Q2_K:
    case SK_GGML_Q3_K: {
      const bool q3 = type == SK_GGML_Q3_K;
      struct sk_block_q2_k b2;
      struct sk_block_q3_k b3;
      int8_t sc3[16];
      float d, dmin = 0.0f;
      const uint8_t *qs;
      if (q3) {
        memcpy(&b3, src, sizeof b3);
        src += sizeof b3;
        d = sk_f16_to_f32(b3.d);
        sk_quant_scales_q3_k(b3.scales, sc3);
        qs = b3.qs;
      } else {
        memcpy(&b2, src, sizeof b2);
        src += sizeof b2;
        d = sk_f16_to_f32(b2.d);
        dmin = sk_f16_to_f32(b2.dmin);
        qs = b2.qs;
      }
      for (uint32_t n = 0; n < 2; n++)
        for (uint32_t j = 0; j < 4; j++)
          for (uint32_t h = 0; h < 2; h++) {
            const uint32_t g = 8 * n + 2 * j + h;
            for (uint32_t l = 0; l < 16; l++) {
              int q = (qs[32 * n + 16 * h + l] >> (2 * j)) & 3;
              if (q3) {
                if (!(b3.hmask[16 * h + l] & (1u << (4 * n + j)))) q -= 4;
                *y++ = (d * (float)sc3[g]) * (float)q;
              } else {
                const float dl = d * (float)(b2.scales[g] & 15), ml = dmin * (float)(b2.scales[g] >> 4);
                *y++ = dl * (float)q - ml;
              }
            }
          }
      break;
    }
    case SK_GGML_Q4_K:
    case SK_GGML_Q5_K: {
      const bool q5 = type == SK_GGML_Q5_K;
      struct sk_block_q4_k b4;
      struct sk_block_q5_k b5;
      const uint8_t *sc, *qs, *qh = NULL;
      float d, dmin;
      if (q5) {
        memcpy(&b5, src, sizeof b5);
        src += sizeof b5;
        d = sk_f16_to_f32(b5.d), dmin = sk_f16_to_f32(b5.dmin);
        sc = b5.scales, qs = b5.qs, qh = b5.qh;
      } else {
        memcpy(&b4, src, sizeof b4);
        src += sizeof b4;
        d = sk_f16_to_f32(b4.d), dmin = sk_f16_to_f32(b4.dmin);
        sc = b4.scales, qs = b4.qs;
      }
      for (uint32_t g = 0; g < 8; g++) {
        uint8_t s, m;
        sk_quant_scale_min_k4(g, sc, &s, &m);
        const float dl = d * (float)s, ml = dmin * (float)m;
        for (uint32_t l = 0; l < 32; l++) {
          uint8_t byte = qs[32 * (g / 2) + l];
          int q = g % 2 ? byte >> 4 : byte & 15;
          if (q5 && (qh[l] >> g & 1)) q += 16;
          *y++ = dl * (float)q - ml;
        }
      }
      break;
    }
    case SK_GGML_Q6_K: {
      struct sk_block_q6_k b;
      memcpy(&b, src, sizeof b);
      src += sizeof b;
      const float d = sk_f16_to_f32(b.d);
      for (uint32_t n = 0; n < 2; n++) {
        const uint8_t *ql = b.ql + 64 * n, *qh = b.qh + 32 * n;
        const int8_t *sc = b.scales + 8 * n;
        for (uint32_t l = 0; l < 32; l++) {
          const int q1 = ((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4) - 32;
          const int q2 = ((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32;
          const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
          const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
          const uint32_t is = l / 16;
          y[l] = d * (float)sc[is] * (float)q1;
          y[l + 32] = d * (float)sc[is + 2] * (float)q2;
          y[l + 64] = d * (float)sc[is + 4] * (float)q3;
          y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
      }
      break;
    }
    case SK_GGML_IQ4_XS: {
      struct sk_block_iq4_xs b;
      memcpy(&b, src, sizeof b);
      src += sizeof b;
      const float d = sk_f16_to_f32(b.d);
      for (uint32_t g = 0; g < 8; g++) {
        const int ls = ((b.scales_l[g / 2] >> (4 * (g % 2))) & 15) | ((b.scales_h >> (2 * g)) & 3) << 4;
        const float dl = d * (float)(ls - 32);
        for (uint32_t j = 0; j < 16; j++) {
          y[j] = dl * (float)sk_iq4nl_values[b.qs[16 * g + j] & 15];
          y[j + 16] = dl * (float)sk_iq4nl_values[b.qs[16 * g + j] >> 4];
        }
        y += 32;
      }
      break;
    }
    default: break;
    }
  }
}

int sk_dequantize_row(uint32_t type, const void *src, uint32_t cols, float *out) {
  if (sk_quant_row_bytes(type, cols) == 0) return -1;
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
  case SK_GGML_Q8_0:
  case SK_GGML_Q4_0:
  case SK_GGML_Q4_1:
  case SK_GGML_Q5_0:
  case SK_GGML_Q5_1:
  case SK_GGML_IQ4_NL: sk__deq_legacy(type, src, cols, out); return 0;
  default: sk__deq_k(type, src, cols, out); return 0;
  }
}
