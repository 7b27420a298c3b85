/* Kernels (see kernels.h): the portable variant (kernels-generic.inc),
 * the x86 variants from kernels-x86.inc, kernels-avx512.inc and
 * kernels-amx.inc, and the run-time dispatch. */
#include "model/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

#if defined(__x86_64__) || defined(__i386__)
#define SK__X86 1
#include <cpuid.h>
#include <immintrin.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#else
#define SK__X86 0
#endif

typedef void (*sk__mm_fn)(const struct sk_wmat *w, const struct sk_act *x, float *const *y,
                          uint32_t o0, uint32_t o1);

struct sk__kernels {
  const char *name;
  sk__mm_fn mm_f32, mm_f16, mm_q8_0, mm_q4_0;
  /* the other types' products; NULL: the generic variant's */
  sk__mm_fn mm_bf16, mm_q4_1, mm_q5_0, mm_q5_1, mm_iq4_nl, mm_q2_k, mm_q3_k, mm_q4_k, mm_q5_k,
      mm_q6_k, mm_iq4_xs;
  void (*quantize_rows)(const float *x, size_t ldf, uint32_t n, uint32_t cols, int8_t *q,
                        float *d, int32_t *s);
  /* sk_kernels_quantize_rows_k, the same bits; NULL: the portable one */
  void (*quantize_rows_k)(const float *x, size_t ldf, uint32_t n, uint32_t cols, int8_t *q,
                          float *d, int16_t *bs);
  /* reads quantized weights packed in groups of this many rows
   * (sk_kernels_pack), or 0: the GGUF layout */
  uint32_t pack_rows;
  /* reads F32 weights packed in groups of SK__PF_ROWS rows (sk__pack_f32) */
  bool pack_f32;
  /* reads Q4_K and Q6_K weights in their 16-row lane layouts (sk__k4p,
   * SK__Q6P_ROWS; kernels-avx512.inc) */
  bool pack_k;
  float (*dot)(const float *a, const float *b, uint32_t n);
  void (*axpy)(float *y, float a, const float *x, uint32_t n);
  void (*scores)(const float *q, const float *const *rows, uint32_t n, uint32_t hd, float *out);
  void (*wsum)(float *out, const float *w, const float *const *rows, uint32_t n, uint32_t hd,
               bool add);
  void (*scores_f16)(const float *q, const uint16_t *const *rows, uint32_t n, uint32_t hd,
                     float *out);
  void (*wsum_f16)(float *out, const float *w, const uint16_t *const *rows, uint32_t n,
                   uint32_t hd, bool add);
  void (*to_f16)(uint16_t *y, const float *x, size_t n);
  void (*from_f16)(float *y, const uint16_t *x, size_t n);
  void (*rope)(float *y, const float *x, const float *cos2, const float *sin2, uint32_t rope_dim);
  void (*rope_rows)(float *y, const float *const *x, const float *cos2, const float *sin2,
                    uint32_t n, uint32_t rope_dim, uint32_t head_dim);
  void (*softmax)(float *row, uint32_t n, float scale, double *ret_entropy);
  void (*swiglu)(float *g, const float *u, size_t n);
};

/* Packed Q6_K layout of avx512-vnni and amx (sk_kernels_pack; described
 * in kernels-avx512.inc, above sk__v512_q6p_tile): groups of
 * SK__Q6P_ROWS rows across the vector lanes, each super-block of a group
 * in SK__Q6P_BYTES bytes. Marked by w->pack_rows == SK__Q6P_ROWS on a
 * Q6_K matrix; other variants read the GGUF data. */
#define SK__Q6P_ROWS 16u
#define SK__Q6P_BYTES 3392u /* 53 cache lines: 16 x 210 bytes, padded */
#define SK__Q6P_D 3072u     /* offset of the fp16 scales d */
#define SK__Q6P_SC 3104u    /* offset of the int8 sub-block scale pairs */

/* Q4_K lane layout (sk_kernels_pack; avx512-vnni and amx; read by
 * kernels-avx512.inc, which describes it): groups of SK__K4_ROWS rows,
 * super-block b of group g at (g nb + b) SK__K4_BS bytes. Other variants
 * read the GGUF data of such a matrix. */
#define SK__K4_ROWS 16u
#define SK__K4_BS (SK__K4_ROWS * 144u)

/* Whether w holds Q4_K weights in the lane layout. */
static inline bool sk__k4p(const struct sk_wmat *w) {
  return w->packed && w->pack_rows == SK__K4_ROWS && w->type == SK_GGML_Q4_K;
}

/* Row o of a matrix in the GGUF layout (which the K-quant products of
 * every variant read, but the lane layouts'). */
static inline const uint8_t *sk__row(const struct sk_wmat *w, uint32_t o) {
  return (const uint8_t *)w->data + (size_t)o * w->row_bytes;
}

#include "kernels-generic.inc"

/* ---- x86 ------------------------------------------------------------- */

/* Packed layout (kernels-x86.inc): bytes per group of gr rows per block
 * (gr fp16 scales, then the weights). */
#define SK__PQ_BYTES(q4, gr) (2u * (gr) + (gr) * ((q4) ? SK_QK / 2 : SK_QK))
#define SK__PQ8_BYTES SK__PQ_BYTES(false, 8u)
#define SK__PQ4_BYTES SK__PQ_BYTES(true, 8u)
/* Rows per group of the packed F32 layout (kernels-x86.inc, tile_pf). */
#define SK__PF_ROWS 8u


#if SK__X86
#define SK__TGT "avx2,fma,f16c"
/* Attention kernels prefetch the key and value rows this many rows ahead
 * (cache rows are kv_dim elements apart, a stride the hardware
 * prefetcher does not follow): 8 f32 rows, 16 f16 ones (about the same
 * bytes), the distances that read fastest (doc/performance.md). */
#ifndef SK__ATT_PF
#define SK__ATT_PF 8u
#endif
#ifndef SK__ATT_PF16
#define SK__ATT_PF16 16u
#endif
#define SK__NAME(x) sk__avx2_##x
#define SK__VNNI 0
#include "kernels-x86.inc"
#undef SK__TGT
#undef SK__NAME
#undef SK__VNNI

#define SK__TGT "avx2,fma,f16c,avxvnni"
#define SK__NAME(x) sk__vnni_##x
#define SK__VNNI 1
#include "kernels-x86.inc"
#undef SK__TGT
#undef SK__NAME
#undef SK__VNNI

static const struct sk__kernels sk__avx2 = {
    .name = "avx2",
    .mm_f32 = sk__avx2_mm_f32,
    .mm_f16 = sk__avx2_mm_f16,
    .mm_q8_0 = sk__avx2_mm_q8_0,
    .mm_q4_0 = sk__avx2_mm_q4_0,
    .mm_bf16 = sk__avx2_mm_bf16,
    .mm_q4_1 = sk__avx2_mm_q4_1,
    .mm_q5_0 = sk__avx2_mm_q5_0,
    .mm_q5_1 = sk__avx2_mm_q5_1,
    .mm_iq4_nl = sk__avx2_mm_iq4_nl,
    .mm_q4_k = sk__avx2_mm_q4_k,
    .mm_q5_k = sk__avx2_mm_q5_k,
    .mm_q6_k = sk__avx2_mm_q6_k,
    .mm_q2_k = sk__avx2_mm_q2_k,
    .mm_q3_k = sk__avx2_mm_q3_k,
    .mm_iq4_xs = sk__avx2_mm_iq4_xs,
    .quantize_rows = sk__avx2_quantize_rows,
    .dot = sk__avx2_dot,
    .axpy = sk__avx2_axpy,
    .scores = sk__avx2_scores,
    .wsum = sk__avx2_wsum,
    .scores_f16 = sk__avx2_scores_f16,
    .wsum_f16 = sk__avx2_wsum_f16,
    .to_f16 = sk__avx2_to_f16,
    .from_f16 = sk__avx2_from_f16,
    .rope = sk__avx2_rope,
    .rope_rows = sk__avx2_rope_rows,
    .softmax = sk__avx2_softmax,
    .swiglu = sk__avx2_swiglu,
    .pack_f32 = true,
};

static const struct sk__kernels sk__avx2_vnni = {
    .name = "avx2-vnni",
    .mm_f32 = sk__vnni_mm_f32,
    .mm_f16 = sk__vnni_mm_f16,
    .mm_q8_0 = sk__vnni_mm_q8_0,
    .mm_q4_0 = sk__vnni_mm_q4_0,
    .mm_bf16 = sk__vnni_mm_bf16,
    .mm_q4_1 = sk__vnni_mm_q4_1,
    .mm_q5_0 = sk__vnni_mm_q5_0,
    .mm_q5_1 = sk__vnni_mm_q5_1,
    .mm_iq4_nl = sk__vnni_mm_iq4_nl,
    .mm_q4_k = sk__vnni_mm_q4_k,
    .mm_q5_k = sk__vnni_mm_q5_k,
    .mm_q6_k = sk__vnni_mm_q6_k,
    .mm_q2_k = sk__vnni_mm_q2_k,
    .mm_q3_k = sk__vnni_mm_q3_k,
    .mm_iq4_xs = sk__vnni_mm_iq4_xs,
    .quantize_rows = sk__vnni_quantize_rows,
    .dot = sk__vnni_dot,
    .axpy = sk__vnni_axpy,
    .scores = sk__vnni_scores,
    .wsum = sk__vnni_wsum,
    .scores_f16 = sk__vnni_scores_f16,
    .wsum_f16 = sk__vnni_wsum_f16,
    .to_f16 = sk__vnni_to_f16,
    .from_f16 = sk__vnni_from_f16,
    .rope = sk__vnni_rope,
    .rope_rows = sk__vnni_rope_rows,
    .softmax = sk__vnni_softmax,
    .swiglu = sk__vnni_swiglu,
    .pack_rows = 8,
    .pack_f32 = true,
};

#define SK__TGT "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define SK__NAME(x) sk__x512_##x
#define SK__VNNI 2
#include "kernels-x86.inc"
#undef SK__TGT
#undef SK__NAME
#undef SK__VNNI

#include "kernels-avx512.inc"

/* The fields avx512-vnni and amx take from avx2: everything but the name,
 * the quantized and F32 products, the packed layouts, written once so
 * that the two tables cannot drift apart; their K-quant and IQ4_XS
 * products are avx2's with AVX-512 VNNI's vpdpwssd (sk__x512_*, the same
 * bits), but their Q4_K and Q6_K products, which are kernels-avx512.inc's
 * (on weights in the lane layouts). */
#define SK__AVX2_REST                                                                    \
  .mm_f16 = sk__avx2_mm_f16, .mm_bf16 = sk__avx2_mm_bf16, .mm_q4_1 = sk__avx2_mm_q4_1,   \
  .mm_q5_0 = sk__avx2_mm_q5_0, .mm_q5_1 = sk__avx2_mm_q5_1,                              \
  .mm_iq4_nl = sk__avx2_mm_iq4_nl, .mm_q4_k = sk__v512_mm_q4_k,                          \
  .mm_q5_k = sk__x512_mm_q5_k, .mm_q6_k = sk__v512_mm_q6_k, .mm_q2_k = sk__x512_mm_q2_k,  \
  .mm_q3_k = sk__x512_mm_q3_k, .mm_iq4_xs = sk__x512_mm_iq4_xs,                          \
  .quantize_rows = sk__avx2_quantize_rows, .dot = sk__avx2_dot, .axpy = sk__avx2_axpy,   \
  .scores = sk__avx2_scores, .wsum = sk__avx2_wsum, .scores_f16 = sk__avx2_scores_f16,   \
  .wsum_f16 = sk__avx2_wsum_f16, .to_f16 = sk__avx2_to_f16, .from_f16 = sk__avx2_from_f16, \
  .rope = sk__avx2_rope,                                                                 \
  .rope_rows = sk__avx2_rope_rows, .softmax = sk__avx2_softmax, .swiglu = sk__avx2_swiglu

/* avx2 with the quantized and packed F32 products of kernels-avx512.inc
 * (the same bits as avx2's, but Q4_K and Q6_K in the lane layouts: within
 * float rounding) and its Q8_K quantizer; everything else is avx2's (which avx2-vnni
 * shares bit for bit). */
static const struct sk__kernels sk__avx512_vnni = {
    .name = "avx512-vnni",
    .mm_q8_0 = sk__v512_mm_q8_0,
    .mm_q4_0 = sk__v512_mm_q4_0,
    .mm_f32 = sk__v512_mm_f32,
    SK__AVX2_REST,
    .pack_rows = SK__V512_ROWS,
    .pack_f32 = true,
    .pack_k = true,
    .quantize_rows_k = sk__v512_quantize_rows_k,
};

#if defined(__x86_64__)
#define SK__AMX 1
#include "kernels-amx.inc"

/* avx512-vnni with the batched Q8_0 products of kernels-amx.inc. */
static const struct sk__kernels sk__amx = {
    .name = "amx",
    .mm_q8_0 = sk__amx_mm_q8_0,
    .mm_q4_0 = sk__amx_mm_q4_0,
    .mm_f32 = sk__v512_mm_f32,
    SK__AVX2_REST,
    .pack_rows = SK__V512_ROWS,
    .pack_f32 = true,
    .pack_k = true,
    .quantize_rows_k = sk__v512_quantize_rows_k,
};
#else
#define SK__AMX 0
#endif

/* AVX2 + FMA + F16C with the OS saving ymm state (libgcc's cpu model
 * checks XGETBV for AVX2); F16C is read from CPUID leaf 1 (ECX bit 29),
 * which __builtin_cpu_supports does not know in every GCC. */
static bool sk__cpu_avx2(void) {
  __builtin_cpu_init();
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && (c >> 29 & 1);
}

/* AVX-VNNI: CPUID leaf 7 subleaf 1, EAX bit 4. */
static bool sk__cpu_avxvnni(void) {
  unsigned a, b, c, d;
  if (!sk__cpu_avx2() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return a >> 4 & 1;
}

/* AVX-512 F, BW, VL and VNNI (libgcc's cpu model checks XGETBV for the
 * zmm and mask state). */
static bool sk__cpu_avx512vnni(void) {
  return sk__cpu_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}

#if SK__AMX
/* avx512-vnni, AMX-TILE and AMX-INT8 (CPUID leaf 7 EDX bits 24 and 25),
 * the OS enabling the tile state in XCR0 (bits 17 XTILECFG and 18
 * XTILEDATA), and on Linux the process's permission to use the tile data
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, which the
 * kernel requires before the first tile instruction; idempotent).
 * Checked once. */
static bool sk__cpu_amx_check(void) {
  unsigned a, b, c, d;
  if (!sk__cpu_avx512vnni() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d >> 24 & 1) || !(d >> 25 & 1)) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return false; /* OSXSAVE */
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  if ((lo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__)
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
  return false;
#endif
}

static bool sk__cpu_amx(void) {
  static _Atomic int state; /* 0 unknown, 1 yes, 2 no */
  int s = atomic_load(&state);
  if (!s) {
    s = sk__cpu_amx_check() ? 1 : 2;
    atomic_store(&state, s);
  }
  return s == 1;
}
#endif
#endif

/* Best first. */
static const struct sk__kernels *sk__all[] = {
#if SK__X86
#if SK__AMX
    &sk__amx,
#endif
    &sk__avx512_vnni,
    &sk__avx2_vnni,
    &sk__avx2,
#endif
    &sk__generic,
};
#define SK__N_ALL (sizeof sk__all / sizeof sk__all[0])

static bool sk__runs(const struct sk__kernels *k) {
#if SK__X86
#if SK__AMX
  if (k == &sk__amx) return sk__cpu_amx();
#endif
  if (k == &sk__avx512_vnni) return sk__cpu_avx512vnni();
  if (k == &sk__avx2_vnni) return sk__cpu_avxvnni();
  if (k == &sk__avx2) return sk__cpu_avx2();
#endif
  return k == &sk__generic;
}

/* The selected variant; NULL until the first use or selection, which
 * picks the best this CPU runs. */
static _Atomic(const struct sk__kernels *) sk__cur_v;

static const struct sk__kernels *sk__best(void) {
  for (size_t i = 0; i < SK__N_ALL; i++)
    if (sk__runs(sk__all[i])) return sk__all[i];
  return &sk__generic;
}

static inline const struct sk__kernels *sk__cur(void) {
  const struct sk__kernels *k = atomic_load_explicit(&sk__cur_v, memory_order_relaxed);
  if (!k) {
    k = sk__best();
    atomic_store_explicit(&sk__cur_v, k, memory_order_relaxed);
  }
  return k;
}

bool sk_kernels_supported(const char *name) {
  for (size_t i = 0; i < SK__N_ALL; i++)
    if (strcmp(sk__all[i]->name, name) == 0) return sk__runs(sk__all[i]);
  return false;
}

bool sk_kernels_known(const char *name) {
  for (size_t i = 0; i < SK__N_ALL; i++)
    if (strcmp(sk__all[i]->name, name) == 0) return true;
  return false;
}

static char sk__avail[64];

static void sk__avail_init(void) {
  size_t len = 0;
  for (size_t i = 0; i < SK__N_ALL; i++)
    if (sk__runs(sk__all[i]))
      len += (size_t)snprintf(sk__avail + len, sizeof sk__avail - len, "%s%s", len ? " " : "",
                              sk__all[i]->name);
}

const char *sk_kernels_available(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, sk__avail_init);
  return sk__avail;
}

int sk_kernels_select(const char *name, struct sk_error *err) {
  bool any = !name || strcmp(name, "auto") == 0;
  for (size_t i = 0; i < SK__N_ALL; i++) {
    if (!any && strcmp(sk__all[i]->name, name) != 0) continue;
    if (!sk__runs(sk__all[i])) {
      if (any) continue;
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "kernel %s does not run on this CPU (available: %s)", name,
                          sk_kernels_available());
    }
    atomic_store(&sk__cur_v, sk__all[i]);
    return 0;
  }
  return sk_error_set(err, SK_ERR_BAD_REQUEST,
                      "unknown kernel '%.32s' (auto, or one of: %s)", name,
                      sk_kernels_available());
}

const char *sk_kernels_name(void) { return sk__cur()->name; }

bool sk_wmat_needs_q8(const struct sk_wmat *w) {
  switch (w->type) {
  case SK_GGML_Q8_0:
  case SK_GGML_Q4_0:
  case SK_GGML_Q4_1:
  case SK_GGML_Q5_0:
  case SK_GGML_Q5_1:
  case SK_GGML_IQ4_NL: return true;
  default: return false;
  }
}

bool sk_wmat_needs_q8k(const struct sk_wmat *w) {
  switch (w->type) {
  case SK_GGML_Q2_K:
  case SK_GGML_Q3_K:
  case SK_GGML_Q4_K:
  case SK_GGML_Q5_K:
  case SK_GGML_Q6_K:
  case SK_GGML_IQ4_XS: return true;
  default: return false;
  }
}

static void sk__gen_quantize_rows_k(const float *x, size_t ldf, uint32_t n, uint32_t cols,
                                    int8_t *q, float *d, int16_t *bs) {
  const uint32_t nb = cols / SK_QKK;
  for (uint32_t i = 0; i < n; i++) {
    for (uint32_t b = 0; b < nb; b++) {
      const float *xb = x + (size_t)i * ldf + (size_t)b * SK_QKK;
      int8_t *qb = q + (size_t)i * cols + (size_t)b * SK_QKK;
      int16_t *sb = bs + ((size_t)i * cols + (size_t)b * SK_QKK) / 16;
      float amax = 0.0f, max = 0.0f;
      for (uint32_t j = 0; j < SK_QKK; j++)
        if (fabsf(xb[j]) > amax) {
          amax = fabsf(xb[j]);
          max = xb[j];
        }
      if (amax == 0.0f) {
        d[(size_t)i * nb + b] = 0.0f;
        memset(qb, 0, SK_QKK);
        memset(sb, 0, SK_QKK / 16 * sizeof *sb);
        continue;
      }
      const float iscale = -127.0f / max;
      for (uint32_t j = 0; j < SK_QKK; j++) {
        const float v = nearbyintf(iscale * xb[j]);
        qb[j] = (int8_t)(v != v ? 0 : v > 127.0f ? 127 : (int)v); /* NaN: 0 */
      }
      for (uint32_t g = 0; g < SK_QKK / 16; g++) {
        int sum = 0;
        for (uint32_t l = 0; l < 16; l++) sum += qb[16 * g + l];
        sb[g] = (int16_t)sum;
      }
      d[(size_t)i * nb + b] = 1.0f / iscale;
    }
  }
}

void sk_kernels_quantize_rows_k(const float *x, size_t ldf, uint32_t n, uint32_t cols, int8_t *q,
                                float *d, int16_t *bs) {
  if (sk__cur()->quantize_rows_k) sk__cur()->quantize_rows_k(x, ldf, n, cols, q, d, bs);
  else sk__gen_quantize_rows_k(x, ldf, n, cols, q, d, bs);
}

void sk_kernels_quantize_rows(const float *x, size_t ldf, uint32_t n, uint32_t cols, int8_t *q,
                              float *d, int32_t *s) {
  sk__cur()->quantize_rows(x, ldf, n, cols, q, d, s);
}

#if SK__X86
/* F32 weights into the packed F32 layout (kernels-x86.inc, above
 * tile_pf): groups of SK__PF_ROWS rows, blocks of 8 columns, zero
 * padding. */
static int sk__pack_f32(struct sk_wmat *w, void **ret_mem, struct sk_error *err) {
  const size_t nb8 = ((size_t)w->cols + 7) / 8;
  const size_t groups = ((size_t)w->rows + SK__PF_ROWS - 1) / SK__PF_ROWS;
  if (groups && nb8 > SIZE_MAX / sizeof(float) / (SK__PF_ROWS * 8) / groups)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "matrix of %u x %u is too large to pack", w->rows,
                        w->cols);
  const size_t gf = nb8 * SK__PF_ROWS * 8; /* floats per group */
  float *mem = aligned_alloc(64, groups * gf * sizeof(float));
  if (!mem)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %zu bytes to pack a matrix",
                        groups * gf * sizeof(float));
  memset(mem, 0, groups * gf * sizeof(float));
  for (size_t r = 0; r < w->rows; r++) {
    const float *src = (const float *)(const void *)((const uint8_t *)w->data + r * w->row_bytes);
    float *dst = mem + (r / SK__PF_ROWS) * gf + (r % SK__PF_ROWS) * 8;
    for (size_t b = 0; b < nb8; b++) {
      const size_t k = b * 8, len = w->cols - k < 8 ? w->cols - k : 8;
      memcpy(dst + b * SK__PF_ROWS * 8, src + k, len * sizeof(float));
    }
  }
  w->packed = mem;
  w->pack_rows = SK__PF_ROWS;
  *ret_mem = mem;
  return 0;
}
#endif

/* A zeroed buffer on cache lines for groups x nb blocks of bs bytes (bs
 * a multiple of 64) to pack w into, or NULL with err set. */
static uint8_t *sk__pack_buf(const struct sk_wmat *w, size_t groups, size_t nb, size_t bs,
                             struct sk_error *err) {
  if (groups && nb > SIZE_MAX / bs / groups) {
    sk_error_set(err, SK_ERR_NO_MEMORY, "matrix of %u x %u is too large to pack", w->rows,
                 w->cols);
    return NULL;
  }
  const size_t n = groups * nb * bs;
  uint8_t *mem = aligned_alloc(64, n ? n : 64);
  if (!mem) {
    sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %zu bytes to pack a matrix", n);
    return NULL;
  }
  memset(mem, 0, n);
  return mem;
}

/* Q4_K weights into the lane layout (sk__k4p, kernels-avx512.inc): per
 * group of SK__K4_ROWS rows (padding rows: all zero bytes, d = dmin = 0)
 * and super-block, the rows' d, their dmin, word k of their 12 scale
 * bytes for k = 0, 1, 2, then their quants in chunks of 4 bytes. */
static int sk__pack_k4(struct sk_wmat *w, void **ret_mem, struct sk_error *err) {
  const size_t groups = ((size_t)w->rows + SK__K4_ROWS - 1) / SK__K4_ROWS;
  const size_t nb = w->cols / SK_QKK;
  uint8_t *mem = sk__pack_buf(w, groups, nb, SK__K4_BS, err); /* 36 cache lines per block */
  if (!mem) return -SK_ERR_NO_MEMORY;
  for (size_t r = 0; r < w->rows; r++) {
    const size_t i = r % SK__K4_ROWS;
    for (size_t b = 0; b < nb; b++) {
      const uint8_t *src = (const uint8_t *)w->data + r * w->row_bytes + b * 144;
      uint8_t *dst = mem + (r / SK__K4_ROWS * nb + b) * SK__K4_BS;
      memcpy(dst + 2 * i, src, 2);                        /* d */
      memcpy(dst + 2 * SK__K4_ROWS + 2 * i, src + 2, 2);  /* dmin */
      for (size_t k = 0; k < 3; k++)                      /* scales */
        memcpy(dst + 4 * SK__K4_ROWS + 4 * (SK__K4_ROWS * k + i), src + 4 + 4 * k, 4);
      for (size_t c = 0; c < 32; c++)                     /* quants */
        memcpy(dst + 16 * SK__K4_ROWS + 4 * (SK__K4_ROWS * c + i), src + 16 + 4 * c, 4);
    }
  }
  w->packed = mem;
  w->pack_rows = SK__K4_ROWS;
  *ret_mem = mem;
  return 0;
}

/* Q6_K weights into the packed Q6_K layout (SK__Q6P_ROWS rows across the
 * vector lanes; kernels-avx512.inc, above sk__v512_q6p_tile). */
static int sk__pack_q6p(struct sk_wmat *w, void **ret_mem, struct sk_error *err) {
  const size_t groups = ((size_t)w->rows + SK__Q6P_ROWS - 1) / SK__Q6P_ROWS;
  const size_t nb = w->cols / SK_QKK;
  /* padding rows: d = 0, scales 0, quants 0 */
  uint8_t *mem = sk__pack_buf(w, groups, nb, SK__Q6P_BYTES, err);
  if (!mem) return -SK_ERR_NO_MEMORY;
  for (size_t r = 0; r < w->rows; r++)
    for (size_t b = 0; b < nb; b++) {
      const struct sk_block_q6_k *k =
          (const struct sk_block_q6_k *)(const void *)((const uint8_t *)w->data +
                                                       r * w->row_bytes + b * 210);
      uint8_t *dst = mem + (r / SK__Q6P_ROWS * nb + b) * SK__Q6P_BYTES;
      const size_t l = r % SK__Q6P_ROWS;
      memcpy(dst + SK__Q6P_D + 2 * l, &k->d, 2);
      for (size_t p = 0; p < 8; p++) memcpy(dst + SK__Q6P_SC + 32 * p + 2 * l, k->scales + 2 * p, 2);
      uint8_t q[SK_QKK]; /* the 6-bit quants, ggml's order */
      for (size_t n = 0; n < 2; n++)
        for (size_t e = 0; e < 32; e++) {
          const uint8_t lo = k->ql[64 * n + e], hi = k->ql[64 * n + 32 + e], h = k->qh[32 * n + e];
          q[128 * n + e] = (uint8_t)((lo & 15) | (h & 3) << 4);
          q[128 * n + 32 + e] = (uint8_t)((hi & 15) | (h >> 2 & 3) << 4);
          q[128 * n + 64 + e] = (uint8_t)(lo >> 4 | (h >> 4 & 3) << 4);
          q[128 * n + 96 + e] = (uint8_t)(hi >> 4 | (h >> 6 & 3) << 4);
        }
      /* chunks P, Q, R of (half n, column chunk c): elements 128n + 32j
       * + 4c + i (j = 0, 1, 2) in bits 0-5, bits 2j, 2j+1 of element
       * 128n + 96 + 4c + i in bits 6-7 */
      for (size_t n = 0; n < 2; n++)
        for (size_t c = 0; c < 8; c++)
          for (size_t j = 0; j < 3; j++)
            for (size_t i = 0; i < 4; i++) {
              const size_t e = 128 * n + 4 * c + i;
              dst[64 * (24 * n + 3 * c + j) + 4 * l + i] =
                  (uint8_t)(q[e + 32 * j] | (q[e + 96] >> (2 * j) & 3) << 6);
            }
    }
  w->packed = mem;
  w->pack_rows = SK__Q6P_ROWS;
  *ret_mem = mem;
  return 0;
}

int sk_kernels_pack(struct sk_wmat *w, void **ret_mem, struct sk_error *err) {
  *ret_mem = NULL;
  if (w->type == SK_GGML_Q4_K && sk__cur()->pack_k) return sk__pack_k4(w, ret_mem, err);
#if SK__X86
  if (w->type == SK_GGML_F32 && sk__cur()->pack_f32) return sk__pack_f32(w, ret_mem, err);
#endif
  if (w->type == SK_GGML_Q6_K && sk__cur()->pack_k) return sk__pack_q6p(w, ret_mem, err);
  const size_t gr = sk__cur()->pack_rows; /* rows per group */
  if (!gr || (w->type != SK_GGML_Q8_0 && w->type != SK_GGML_Q4_0)) return 0;
  const bool q4 = w->type == SK_GGML_Q4_0;
  const size_t nb = w->cols / SK_QK, groups = ((size_t)w->rows + gr - 1) / gr;
  const size_t bs = SK__PQ_BYTES(q4, gr);
  const size_t cb = q4 ? 4 : 8; /* chunks of 4 bytes per row per block */
  if (groups > SIZE_MAX / nb / bs)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "matrix of %u x %u is too large to pack", w->rows,
                        w->cols);
  uint8_t *mem = malloc(groups * nb * bs);
  if (!mem)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %zu bytes to pack a matrix",
                        groups * nb * bs);
  const uint8_t *src = w->data;
  for (size_t g = 0; g < groups; g++) {
    for (size_t b = 0; b < nb; b++) {
      uint8_t *dst = mem + (g * nb + b) * bs;
      for (size_t r = 0; r < gr; r++) {
        size_t row = g * gr + r;
        uint16_t d = 0;
        uint8_t qs[SK_QK];
        if (row < w->rows) {
          const uint8_t *blk = src + row * w->row_bytes + b * (q4 ? 18 : 34);
          memcpy(&d, blk, 2);
          if (q4) {
            memcpy(qs, blk + 2, SK_QK / 2);
          } else {
            for (size_t j = 0; j < SK_QK; j++) qs[j] = (uint8_t)(blk[2 + j] ^ 0x80u);
          }
        } else { /* padding row: zero scale, weights that decode to 0 */
          memset(qs, q4 ? 0x88 : 0x80, sizeof qs);
        }
        memcpy(dst + 2 * r, &d, 2);
        for (size_t c = 0; c < cb; c++) memcpy(dst + 2 * gr + 4 * gr * c + 4 * r, qs + 4 * c, 4);
      }
    }
  }
  w->packed = mem;
  w->pack_rows = (uint32_t)gr;
  *ret_mem = mem;
  return 0;
}

void sk_kernels_matmul(const struct sk_wmat *w, const struct sk_act *x, float *const *y_rows,
                       uint32_t o0, uint32_t o1) {
  if (o0 >= o1 || x->n == 0) return;
  switch (w->type) {
  case SK_GGML_F32: sk__cur()->mm_f32(w, x, y_rows, o0, o1); break;
  case SK_GGML_F16: sk__cur()->mm_f16(w, x, y_rows, o0, o1); break;
  case SK_GGML_Q8_0: sk__cur()->mm_q8_0(w, x, y_rows, o0, o1); break;
  case SK_GGML_Q4_0: sk__cur()->mm_q4_0(w, x, y_rows, o0, o1); break;
  default: {
    const struct sk__kernels *k = sk__cur();
    sk__mm_fn f = NULL, g = NULL;
#define SK__PICK(T, field)                                                                 \
  case T:                                                                                  \
    f = k->field, g = sk__generic.field;                                                   \
    break;
    switch (w->type) {
      SK__PICK(SK_GGML_BF16, mm_bf16)
      SK__PICK(SK_GGML_Q4_1, mm_q4_1)
      SK__PICK(SK_GGML_Q5_0, mm_q5_0)
      SK__PICK(SK_GGML_Q5_1, mm_q5_1)
      SK__PICK(SK_GGML_IQ4_NL, mm_iq4_nl)
      SK__PICK(SK_GGML_Q2_K, mm_q2_k)
      SK__PICK(SK_GGML_Q3_K, mm_q3_k)
      SK__PICK(SK_GGML_Q4_K, mm_q4_k)
      SK__PICK(SK_GGML_Q5_K, mm_q5_k)
      SK__PICK(SK_GGML_Q6_K, mm_q6_k)
      SK__PICK(SK_GGML_IQ4_XS, mm_iq4_xs)
    default: break; /* the loader admits no other type */
    }
#undef SK__PICK
    if (f) f(w, x, y_rows, o0, o1);
    else if (g) g(w, x, y_rows, o0, o1);
    break;
  }
  }
}

float sk_kernels_dot(const float *a, const float *b, uint32_t n) { return sk__cur()->dot(a, b, n); }

void sk_kernels_axpy(float *y, float a, const float *x, uint32_t n) { sk__cur()->axpy(y, a, x, n); }

void sk_kernels_scores(const float *q, const float *const *rows, uint32_t n, uint32_t hd,
                       float *out) {
  sk__cur()->scores(q, rows, n, hd, out);
}

void sk_kernels_scores_f16(const float *q, const uint16_t *const *rows, uint32_t n, uint32_t hd,
                           float *out) {
  sk__cur()->scores_f16(q, rows, n, hd, out);
}

void sk_kernels_wsum_f16(float *out, const float *w, const uint16_t *const *rows, uint32_t n,
                         uint32_t hd) {
  sk__cur()->wsum_f16(out, w, rows, n, hd, false);
}

void sk_kernels_wsum_add_f16(float *out, const float *w, const uint16_t *const *rows, uint32_t n,
                             uint32_t hd) {
  sk__cur()->wsum_f16(out, w, rows, n, hd, true);
}

void sk_kernels_to_f16(uint16_t *y, const float *x, size_t n) { sk__cur()->to_f16(y, x, n); }

void sk_kernels_from_f16(float *y, const uint16_t *x, size_t n) { sk__cur()->from_f16(y, x, n); }

void sk_kernels_wsum(float *out, const float *w, const float *const *rows, uint32_t n,
                     uint32_t hd) {
  sk__cur()->wsum(out, w, rows, n, hd, false);
}

void sk_kernels_wsum_add(float *out, const float *w, const float *const *rows, uint32_t n,
                         uint32_t hd) {
  sk__cur()->wsum(out, w, rows, n, hd, true);
}

void sk_kernels_rope(float *y, const float *x, const float *cos2, const float *sin2,
                     uint32_t rope_dim) {
  sk__cur()->rope(y, x, cos2, sin2, rope_dim);
}

void sk_kernels_rope_rows(float *y, const float *const *x, const float *cos2, const float *sin2,
                          uint32_t n, uint32_t rope_dim, uint32_t head_dim) {
  sk__cur()->rope_rows(y, x, cos2, sin2, n, rope_dim, head_dim);
}

void sk_kernels_softmax(float *row, uint32_t n, float scale, double *ret_entropy) {
  sk__cur()->softmax(row, n, scale, ret_entropy);
}

void sk_kernels_swiglu(float *g, const float *u, size_t n) { sk__cur()->swiglu(g, u, n); }
