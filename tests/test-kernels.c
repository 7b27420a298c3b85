/* Kernels (kernels.h), block formats (quant.h) and the pool (pool.h):
 * every variant this CPU runs against a double-precision reference, the
 * batch invariance the scheduler relies on (a row's result does not
 * depend on the other rows or the output range), F16 = F32 of the same
 * values, and the bit-exact RoPE. Every weight type: test-kernels-types.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/kernels.h"
#include "model/pool.h"
#include "model/quant.h"
#include "testkernels.h"

/* The quantizer: per block d = max|x| / 127, q = round-half-even(x / d),
 * s = sum q; the same bits in every variant. */
static void test_quantize_rows(void **state) {
  (void)state;
  const uint32_t n = 3, cols = 96;
  float x[3 * 96];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = frand() * 3.0f;
  for (size_t j = 0; j < 32; j++) x[32 + j] = 0.0f; /* an all-zero block */
  x[5] = 127.0f / 2 * (1.0f / 64); /* exact ties are rare; the rule is fixed */
  int8_t q0[3 * 96];
  float d0[9];
  int32_t s0[9];
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    int8_t q[3 * 96];
    float d[9];
    int32_t s[9];
    sk_kernels_quantize_rows(x, cols, n, cols, q, d, s);
    for (uint32_t b = 0; b < n * cols / SK_QK; b++) {
      float amax = 0.0f;
      int32_t sum = 0;
      for (uint32_t j = 0; j < SK_QK; j++) amax = fmaxf(amax, fabsf(x[b * SK_QK + j]));
      assert_true(d[b] == amax / 127.0f);
      for (uint32_t j = 0; j < SK_QK; j++) {
        float want = d[b] != 0.0f ? nearbyintf(x[b * SK_QK + j] * (1.0f / d[b])) : 0.0f;
        assert_int_equal(q[b * SK_QK + j], (int)want);
        sum += q[b * SK_QK + j];
      }
      assert_int_equal(s[b], sum);
    }
    if (v == 0) {
      memcpy(q0, q, sizeof q);
      memcpy(d0, d, sizeof d);
      memcpy(s0, s, sizeof s);
    } else {
      assert_memory_equal(q, q0, sizeof q);
      assert_memory_equal(d, d0, sizeof d);
      assert_memory_equal(s, s0, sizeof s);
    }
  }
  select_or_fail("auto");
}

/* Every variant and type against a double reference over the values the
 * type holds (and, for quantized weights, the quantized activations). */
static void test_matmul_reference(void **state) {
  (void)state;
  const uint32_t types[] = {SK_GGML_F32, SK_GGML_F16, SK_GGML_Q8_0, SK_GGML_Q4_0};
  const uint32_t shapes[][2] = {{37, 64}, {70, 172}, {129, 288}, {16, 96}};
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) {
      printf("kernel %s: not supported by this CPU, skipped\n", variants[v]);
      continue;
    }
    select_or_fail(variants[v]);
    for (size_t ti = 0; ti < 4; ti++) {
      for (size_t si = 0; si < 4; si++) {
        uint32_t rows = shapes[si][0], cols = shapes[si][1];
        bool quant = types[ti] == SK_GGML_Q8_0 || types[ti] == SK_GGML_Q4_0;
        if (quant && cols % SK_QK) continue;
        struct mat m;
        mat_make(&m, types[ti], rows, cols);
        mat_pack(&m);
        for (uint32_t n = 1; n <= 7; n += 3) {
          struct acts t;
          acts_make(&t, n, cols, cols + 3);
          float *y = malloc((size_t)n * rows * sizeof *y);
          float **yr = row_ptrs(y, n, rows);
          sk_kernels_matmul(&m.w, &t.a, yr, 0, rows);
          double maxd = 0.0;
          for (uint32_t i = 0; i < n; i++) {
            for (uint32_t o = 0; o < rows; o++) {
              double ref = 0.0, mag = 0.0;
              for (uint32_t k = 0; k < cols; k++) {
                double xv = quant ? (double)t.d[i * cols / SK_QK + k / SK_QK] * t.q[i * cols + k]
                                  : (double)t.x[i * (cols + 3) + k];
                ref += (double)m.f[(size_t)o * cols + k] * xv;
                mag += fabs((double)m.f[(size_t)o * cols + k] * xv);
              }
              double d = fabs(y[i * rows + o] - ref);
              /* float accumulation over cols terms; scales rounded to f16
               * in the reference and float in the kernel */
              if (!(d <= 1e-5 * mag + 1e-6))
                fail_msg("%s %s %ux%u n=%u [%u][%u]: %.9g vs %.9g", variants[v],
                         sk_ggml_type_name(types[ti]), rows, cols, n, i, o, y[i * rows + o], ref);
              if (d > maxd) maxd = d;
            }
          }
          free(yr);
          free(y);
          acts_free(&t);
        }
        mat_free(&m);
      }
    }
  }
  select_or_fail("auto");
}

/* Row i of a product of n rows, and any output range, give the same bits
 * as row i alone over all outputs: what batching sessions relies on. */
static void test_matmul_batch_invariance(void **state) {
  (void)state;
  const uint32_t types[] = {SK_GGML_F32, SK_GGML_F16, SK_GGML_Q8_0, SK_GGML_Q4_0};
  /* 192: whole 16-float steps; 172 and 40 end with an 8-float step, 172
   * with a tail of 4 too (the one-row float pairs walk 16 at a time) */
  const uint32_t rows = 77, cols_list[] = {192, 172, 40};
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    for (size_t ti = 0; ti < 4 * 3; ti++) {
      const uint32_t cols = cols_list[ti / 4];
      if (types[ti % 4] != SK_GGML_F32 && types[ti % 4] != SK_GGML_F16 && cols % SK_QK) continue;
      struct mat m;
      mat_make(&m, types[ti % 4], rows, cols);
      mat_pack(&m);
      const uint32_t N = 11;
      struct acts t;
      acts_make(&t, N, cols, cols);
      float *alone = malloc((size_t)N * rows * sizeof *alone);
      for (uint32_t i = 0; i < N; i++) {
        struct sk_act one = t.a;
        one.n = 1;
        one.f = t.x + (size_t)i * cols;
        one.q = t.q + (size_t)i * cols;
        one.d = t.d + (size_t)i * cols / SK_QK;
        one.s = t.s + (size_t)i * cols / SK_QK;
        float *yi = alone + (size_t)i * rows;
        sk_kernels_matmul(&m.w, &one, &yi, 0, rows);
      }
      for (uint32_t n = 1; n <= N; n++) {
        float *y = calloc((size_t)n * rows, sizeof *y);
        float **yr = row_ptrs(y, n, rows);
        struct sk_act part = t.a;
        part.n = n;
        /* uneven output ranges, as threads may take them */
        uint32_t cuts[] = {0, 5, 16, 17, 40, 64, rows};
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
          sk_kernels_matmul(&m.w, &part, yr, cuts[c], cuts[c + 1]);
        if (memcmp(y, alone, (size_t)n * rows * sizeof *y) != 0)
          fail_msg("%s %s %ux%u: a batch of %u rows differs from the rows alone", variants[v],
                   sk_ggml_type_name(types[ti % 4]), rows, cols, n);
        free(yr);
        free(y);
      }
      free(alone);
      acts_free(&t);
      mat_free(&m);
    }
  }
  select_or_fail("auto");
}

/* avx512-vnni (16-row packed groups, 512-bit vpdpbusd) and amx (the
 * same groups, AMX tiles of 16 activation rows) give the same bits as
 * avx2-vnni (8-row groups) for quantized weights: integer block sums are
 * exact, and every output goes through the same float steps. Row counts
 * that leave partial groups, 1..64 activation rows (every tile height and
 * remainder, several AMX tiles), and uneven output ranges. And weights
 * packed for one variant, multiplied by another: the GGUF data is used
 * unless the layouts agree (avx512-vnni and amx share theirs). */
static void check_equals_avx2_vnni(const char *variant) {
  if (!sk_kernels_supported(variant) || !sk_kernels_supported("avx2-vnni")) {
    printf("%s or avx2-vnni: not supported by this CPU, skipped\n", variant);
    return;
  }
  const uint32_t types[] = {SK_GGML_Q8_0, SK_GGML_Q4_0};
  const uint32_t shapes[][2] = {{37, 64}, {77, 192}, {129, 288}, {16, 96}, {200, 32}, {45, 2080}};
  for (size_t ti = 0; ti < 2; ti++) {
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      const uint32_t rows = shapes[si][0], cols = shapes[si][1], N = 64;
      struct mat m8, m16;
      mat_make(&m8, types[ti], rows, cols);
      m16 = m8;
      m16.data = NULL; /* shares m8's weights */
      m16.f = NULL;
      m16.packed = NULL;
      select_or_fail("avx2-vnni");
      mat_pack(&m8);
      select_or_fail(variant);
      mat_pack(&m16);
      assert_non_null(m16.w.packed);
      struct acts t;
      acts_make(&t, N, cols, cols);
      for (uint32_t n = 1; n <= N; n++) {
        float *ya = calloc((size_t)n * rows, sizeof *ya), *yb = calloc((size_t)n * rows, sizeof *yb);
        float **ra = row_ptrs(ya, n, rows), **rb = row_ptrs(yb, n, rows);
        struct sk_act part = t.a;
        part.n = n;
        select_or_fail("avx2-vnni");
        sk_kernels_matmul(&m8.w, &part, ra, 0, rows);
        select_or_fail(variant);
        uint32_t cuts[] = {0, 3, 16, 17, 33, 64, 70, rows};
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) {
          uint32_t a = cuts[c] < rows ? cuts[c] : rows, b = cuts[c + 1] < rows ? cuts[c + 1] : rows;
          sk_kernels_matmul(&m16.w, &part, rb, a, b);
        }
        if (memcmp(ya, yb, (size_t)n * rows * sizeof *ya) != 0)
          fail_msg("%s %ux%u n=%u: %s differs from avx2-vnni", sk_ggml_type_name(types[ti]),
                   rows, cols, n, variant);
        /* weights packed for the other variant: each reads the GGUF data
         * then, as it does unpacked weights */
        struct sk_wmat plain = m8.w;
        plain.packed = NULL;
        for (int k = 0; k < 2; k++) {
          select_or_fail(k ? variant : "avx2-vnni");
          sk_kernels_matmul(&plain, &part, ra, 0, rows);
          sk_kernels_matmul(k ? &m8.w : &m16.w, &part, rb, 0, rows);
          if (memcmp(ya, yb, (size_t)n * rows * sizeof *ya) != 0)
            fail_msg("%s %ux%u n=%u: %s on weights packed for the other variant",
                     sk_ggml_type_name(types[ti]), rows, cols, n, k ? variant : "avx2-vnni");
        }
        free(ra);
        free(rb);
        free(ya);
        free(yb);
      }
      acts_free(&t);
      free(m16.packed);
      mat_free(&m8);
    }
  }
  select_or_fail("auto");
}

static void test_avx512_equals_avx2_vnni(void **state) {
  (void)state;
  check_equals_avx2_vnni("avx512-vnni");
}

static void test_amx_equals_avx2_vnni(void **state) {
  (void)state;
  check_equals_avx2_vnni("amx");
}

/* amx on weights packed by avx512-vnni (the same layout) and the other
 * way round, and on pool threads (each loads the tile configuration on
 * its first AMX product; threads that never use AMX are unaffected). */
struct amx_job {
  const struct sk_wmat *w;
  const struct sk_act *a;
  float *const *y;
  uint32_t rows;
};

static void amx_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct amx_job *j = ctx;
  uint32_t o0 = task * 40, o1 = o0 + 40 < j->rows ? o0 + 40 : j->rows;
  sk_kernels_matmul(j->w, j->a, j->y, o0, o1);
}

static void test_amx_shared_layout_and_threads(void **state) {
  (void)state;
  if (!sk_kernels_supported("amx")) {
    printf("amx: not supported by this CPU (or not granted by the OS), skipped\n");
    return;
  }
  const uint32_t rows = 300, cols = 768, n = 37;
  struct mat m;
  mat_make(&m, SK_GGML_Q8_0, rows, cols);
  select_or_fail("avx512-vnni");
  mat_pack(&m);
  struct acts t;
  acts_make(&t, n, cols, cols);
  float *ya = calloc((size_t)n * rows, sizeof *ya), *yb = calloc((size_t)n * rows, sizeof *yb);
  float **ra = row_ptrs(ya, n, rows), **rb = row_ptrs(yb, n, rows);
  sk_kernels_matmul(&m.w, &t.a, ra, 0, rows);
  select_or_fail("amx");
  struct sk_pool *p = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_pool_new(3, &p, &err), 0);
  struct amx_job j = {&m.w, &t.a, rb, rows};
  for (int run = 0; run < 3; run++) {
    memset(yb, 0, (size_t)n * rows * sizeof *yb);
    sk_pool_run(p, amx_task, &j, (rows + 39) / 40);
    assert_memory_equal(ya, yb, (size_t)n * rows * sizeof *ya);
  }
  sk_pool_free(p);
  free(ra);
  free(rb);
  free(ya);
  free(yb);
  acts_free(&t);
  mat_free(&m);
  select_or_fail("auto");
}

/* F32 weights packed for a variant (8-row groups of 8-column blocks;
 * avx512-vnni and amx multiply two outputs per 512-bit register) give
 * the bits avx2 gives on the GGUF layout: row counts that leave a
 * partial group, columns that leave a tail block, 1..20 activation rows
 * (every tile height and remainder), output ranges cutting groups, and
 * ranges long enough for one row's 8 groups side by side (200 and 300
 * rows: the cut from 70 holds 2 and 3 such spans, then single groups). */
static void test_f32_packed_equals_gguf(void **state) {
  (void)state;
  if (!sk_kernels_supported("avx2")) {
    printf("avx2: not supported by this CPU, skipped\n");
    return;
  }
  const uint32_t shapes[][2] = {{37, 64},  {77, 192},  {129, 172},
                                {16, 96},  {200, 36},  {45, 2080}, {300, 200}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const uint32_t rows = shapes[si][0], cols = shapes[si][1], N = 20;
    struct mat m;
    mat_make(&m, SK_GGML_F32, rows, cols);
    struct acts t;
    acts_make(&t, N, cols, cols + 5);
    float *ya = calloc((size_t)N * rows, sizeof *ya), *yb = calloc((size_t)N * rows, sizeof *yb);
    float **ra = row_ptrs(ya, N, rows), **rb = row_ptrs(yb, N, rows);
    for (size_t v = 1; v < N_VARIANTS; v++) { /* the x86 ones */
      if (!sk_kernels_supported(variants[v])) continue;
      select_or_fail(variants[v]);
      mat_pack(&m);
      assert_non_null(m.w.packed);
      assert_int_equal(m.w.pack_rows, 8);
      for (uint32_t n = 1; n <= N; n++) {
        struct sk_act part = t.a;
        part.n = n;
        struct sk_wmat plain = m.w;
        plain.packed = NULL;
        plain.pack_rows = 0;
        select_or_fail("avx2");
        sk_kernels_matmul(&plain, &part, ra, 0, rows);
        select_or_fail(variants[v]);
        memset(yb, 0, (size_t)N * rows * sizeof *yb);
        const uint32_t cuts[] = {0, 3, 16, 21, 40, 64, 70, rows};
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) {
          uint32_t a = cuts[c] < rows ? cuts[c] : rows, b = cuts[c + 1] < rows ? cuts[c + 1] : rows;
          sk_kernels_matmul(&m.w, &part, rb, a, b);
        }
        if (memcmp(ya, yb, (size_t)n * rows * sizeof *ya) != 0)
          fail_msg("f32 %ux%u n=%u: %s on packed weights differs from avx2 on the GGUF layout",
                   rows, cols, n, variants[v]);
        /* generic selected later reads the GGUF data of a packed matrix */
        select_or_fail("generic");
        sk_kernels_matmul(&plain, &part, ra, 0, rows);
        sk_kernels_matmul(&m.w, &part, rb, 0, rows);
        if (memcmp(ya, yb, (size_t)n * rows * sizeof *ya) != 0)
          fail_msg("f32 %ux%u n=%u: generic on weights packed for %s", rows, cols, n,
                   variants[v]);
      }
    }
    free(ra);
    free(rb);
    free(ya);
    free(yb);
    acts_free(&t);
    mat_free(&m);
  }
  select_or_fail("auto");
}

/* F16 weights give exactly what F32 weights holding the same values give. */
static void test_f16_equals_f32(void **state) {
  (void)state;
  const uint32_t rows = 40, cols = 172, n = 5;
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    struct mat h;
    mat_make(&h, SK_GGML_F16, rows, cols);
    struct sk_wmat f = {.type = SK_GGML_F32, .rows = rows, .cols = cols,
                        .row_bytes = cols * sizeof(float), .data = h.f};
    struct acts t;
    acts_make(&t, n, cols, cols);
    float yh[5 * 40], yf[5 * 40];
    float **rh = row_ptrs(yh, n, rows), **rf = row_ptrs(yf, n, rows);
    sk_kernels_matmul(&h.w, &t.a, rh, 0, rows);
    sk_kernels_matmul(&f, &t.a, rf, 0, rows);
    assert_memory_equal(yh, yf, sizeof yh);
    free(rh);
    free(rf);
    acts_free(&t);
    mat_free(&h);
  }
  select_or_fail("auto");
}

/* Vector primitives of attention against plain C. */
static void test_attention_primitives(void **state) {
  (void)state;
  const uint32_t hds[] = {8, 48, 64, 100, 128, 136};
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++) {
      const uint32_t hd = hds[hi], n = 37;
      float q[136], k[37 * 136], sc[37], w[37], out[136];
      const float *rows[37];
      for (uint32_t i = 0; i < hd; i++) q[i] = frand();
      for (uint32_t i = 0; i < n * hd; i++) k[i] = frand();
      for (uint32_t p = 0; p < n; p++) {
        rows[p] = k + (size_t)p * hd;
        w[p] = frand();
      }
      sk_kernels_scores(q, rows, n, hd, sc);
      sk_kernels_wsum(out, w, rows, n, hd);
      for (uint32_t p = 0; p < n; p++) {
        double ref = 0.0;
        for (uint32_t i = 0; i < hd; i++) ref += (double)q[i] * k[p * hd + i];
        assert_true(fabs(sc[p] - ref) < 1e-5);
        float one;
        sk_kernels_scores(q, rows + p, 1, hd, &one);
        assert_true(sc[p] == one); /* a score does not depend on its neighbours */
      }
      for (uint32_t i = 0; i < hd; i++) {
        double ref = 0.0;
        for (uint32_t p = 0; p < n; p++) ref += (double)w[p] * k[p * hd + i];
        assert_true(fabs(out[i] - ref) < 1e-5);
      }
      /* in two pieces, the second going on from the first: the same bits */
      float part[136];
      sk_kernels_wsum(part, w, rows, 13, hd);
      sk_kernels_wsum_add(part, w + 13, rows + 13, n - 13, hd);
      assert_memory_equal(part, out, hd * sizeof *out);
      /* the same over f16 rows (an f16 KV cache): exact conversion, then
       * the same sums */
      uint16_t k16[37 * 136];
      const uint16_t *rows16[37];
      sk_kernels_to_f16(k16, k, (size_t)n * hd);
      for (uint32_t p = 0; p < n; p++) rows16[p] = k16 + (size_t)p * hd;
      sk_kernels_scores_f16(q, rows16, n, hd, sc);
      sk_kernels_wsum_f16(out, w, rows16, n, hd);
      for (uint32_t p = 0; p < n; p++) {
        double ref = 0.0;
        for (uint32_t i = 0; i < hd; i++) ref += (double)q[i] * sk_f16_to_f32(k16[p * hd + i]);
        assert_true(fabs(sc[p] - ref) < 1e-5);
        float one;
        sk_kernels_scores_f16(q, rows16 + p, 1, hd, &one);
        assert_true(sc[p] == one);
      }
      for (uint32_t i = 0; i < hd; i++) {
        double ref = 0.0;
        for (uint32_t p = 0; p < n; p++) ref += (double)w[p] * sk_f16_to_f32(k16[p * hd + i]);
        assert_true(fabs(out[i] - ref) < 1e-5);
      }
      sk_kernels_wsum_f16(part, w, rows16, 13, hd);
      sk_kernels_wsum_add_f16(part, w + 13, rows16 + 13, n - 13, hd);
      assert_memory_equal(part, out, hd * sizeof *out);
    }
  }
  select_or_fail("auto");
}

/* f16 to floats: every variant gives sk_f16_to_f32's bits for each of
 * the 65,536 halves (a NaN: a NaN of the same sign), in vector bodies and
 * scalar tails; sk_f16_to_f32 itself is exact on 1, 2^-24, 65504, inf. */
static void test_from_f16(void **state) {
  (void)state;
  enum { N = 65536 + 5 };
  static uint16_t x[N];
  static float y[N];
  for (uint32_t i = 0; i < N; i++) x[i] = (uint16_t)(i * 40503u); /* every half, shuffled */
  assert_true(sk_f16_to_f32(0x3c00) == 1.0f && sk_f16_to_f32(0x0001) == 0x1p-24f &&
              sk_f16_to_f32(0x7bff) == 65504.0f && sk_f16_to_f32(0xfc00) == -INFINITY);
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    for (size_t n = N - 5; n <= N; n++) { /* tails of 0 to 5 halves */
      memset(y, 0, sizeof y);
      sk_kernels_from_f16(y, x, n);
      for (uint32_t i = 0; i < n; i++) {
        const float want = sk_f16_to_f32(x[i]);
        uint32_t a, b;
        memcpy(&a, &y[i], 4);
        memcpy(&b, &want, 4);
        if (isnan(want) ? !isnan(y[i]) || signbit(y[i]) != signbit(want) : a != b)
          fail_msg("%s: from_f16(0x%04x) = %a, expected %a", variants[v], x[i], (double)y[i],
                   (double)want);
      }
    }
  }
}

/* Floats to f16: every variant gives sk_f32_to_f16's bits (round to
 * nearest even), over normal, subnormal, overflowing and special values,
 * in vector bodies and scalar tails. */
static void test_to_f16(void **state) {
  (void)state;
  enum { N = 4099 };
  static float x[N];
  static uint16_t y[N];
  for (uint32_t i = 0; i < N; i++) {
    float m = frand();
    switch (i % 6) {
    case 0: x[i] = m; break;
    case 1: x[i] = m * 1e-5f; break;  /* f16 subnormals */
    case 2: x[i] = m * 7e4f; break;   /* past 65504: infinity */
    case 3: x[i] = m * 1e-9f; break;  /* to zero */
    case 4: x[i] = m * 2048.0f; break;
    default: x[i] = ldexpf(1.0f + (float)(i % 1024) / 1024.0f + 0x1p-11f, (int)(i % 30) - 15); break; /* ties */
    }
  }
  x[7] = INFINITY;
  x[13] = -INFINITY;
  x[19] = -0.0f;
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    sk_kernels_to_f16(y, x, N);
    for (uint32_t i = 0; i < N; i++)
      if (y[i] != sk_f32_to_f16(x[i]))
        fail_msg("%s: to_f16(%a) = 0x%04x, expected 0x%04x", variants[v], (double)x[i], y[i],
                 sk_f32_to_f16(x[i]));
  }
  select_or_fail("auto");
}

/* RoPE: the same bits as the scalar formula (products, then the sum) in
 * every variant. */
static void test_rope_exact(void **state) {
  (void)state;
  const uint32_t rd = 46; /* not a multiple of 8: the tail too */
  float x[46], c2[46], s2[46], want[46];
  for (uint32_t i = 0; i < rd; i += 2) {
    float a = frand() * 100.0f;
    c2[i] = c2[i + 1] = cosf(a);
    s2[i + 1] = sinf(a);
    s2[i] = -s2[i + 1];
    x[i] = frand();
    x[i + 1] = frand();
    float p0 = x[i] * c2[i], p1 = x[i + 1] * s2[i + 1], p2 = x[i] * s2[i + 1],
          p3 = x[i + 1] * c2[i];
    want[i] = p0 - p1;
    want[i + 1] = p2 + p3;
  }
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    float y[46];
    sk_kernels_rope(y, x, c2, s2, rd);
    assert_memory_equal(y, want, sizeof y);
    memcpy(y, x, sizeof y);
    sk_kernels_rope(y, y, c2, s2, rd); /* in place */
    assert_memory_equal(y, want, sizeof y);
  }
  select_or_fail("auto");
}

/* Softmax and SwiGLU of the vector variants (ggml's vectorized expf)
 * against expf, including inputs far outside exp's range. */
static void test_softmax_swiglu(void **state) {
  (void)state;
  enum { N = 203 };
  float base[N];
  for (int i = 0; i < N; i++) base[i] = frand() * 30.0f;
  base[7] = -1e4f;  /* exp underflows to 0 */
  base[8] = 88.0f;  /* near the top of float's range after the max shift */
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    float row[N];
    memcpy(row, base, sizeof row);
    double ent = 0.0;
    sk_kernels_softmax(row, N, 0.7f, &ent);
    /* the kernel subtracts the max in float, as ggml does */
    float mx = -INFINITY;
    double sum = 0.0, total = 0.0;
    for (int i = 0; i < N; i++) mx = fmaxf(mx, base[i] * 0.7f);
    for (int i = 0; i < N; i++) sum += exp((double)(base[i] * 0.7f - mx));
    for (int i = 0; i < N; i++) {
      double want = exp((double)(base[i] * 0.7f - mx)) / sum;
      if (!(fabs(row[i] - want) <= 4e-7 * want + 1e-30))
        fail_msg("%s softmax[%d] = %.9g, want %.9g", variants[v], i, row[i], want);
      total += row[i];
    }
    assert_true(fabs(total - 1.0) < 1e-5);
    double h = 0.0;
    for (int i = 0; i < N; i++)
      if (row[i] > 0) h -= (double)row[i] * log((double)row[i]);
    assert_true(fabs(ent - h) < 1e-4);

    float g[N], u[N];
    for (int i = 0; i < N; i++) {
      g[i] = base[i];
      u[i] = frand();
    }
    g[9] = -200.0f; /* exp(200) overflows: silu -> -0 */
    g[10] = 200.0f;
    float g0[N];
    memcpy(g0, g, sizeof g);
    sk_kernels_swiglu(g, u, N);
    for (int i = 0; i < N; i++) {
      double want = (double)g0[i] / (1.0 + exp(-(double)g0[i])) * u[i];
      if (!(fabs(g[i] - want) <= 4e-7 * fabs(want) + 1e-30))
        fail_msg("%s swiglu[%d](%g) = %.9g, want %.9g", variants[v], i, g0[i], g[i], want);
    }
  }
  select_or_fail("auto");
}

/* Block formats: the reference quantizers round-trip within one step of
 * their grid, and f16 conversions are exact where they must be. */
static void test_blocks(void **state) {
  (void)state;
  float x[64], y[64];
  for (int i = 0; i < 64; i++) x[i] = frand() * 5.0f;
  struct sk_block_q8_0 b8[2];
  struct sk_block_q4_0 b4[2];
  sk_quantize_row_q8_0(x, 64, b8);
  assert_int_equal(sk_dequantize_row(SK_GGML_Q8_0, b8, 64, y), 0);
  for (int i = 0; i < 64; i++) assert_true(fabsf(x[i] - y[i]) <= sk_f16_to_f32(b8[i / 32].d) * 0.5f + 1e-3f);
  sk_quantize_row_q4_0(x, 64, b4);
  assert_int_equal(sk_dequantize_row(SK_GGML_Q4_0, b4, 64, y), 0);
  /* the grid is d * (-8..7) with d = max / -8: values of the other sign
   * than the largest reach only 7/8 of it, one step short */
  for (int i = 0; i < 64; i++)
    assert_true(fabsf(x[i] - y[i]) <= fabsf(sk_f16_to_f32(b4[i / 32].d)) + 1e-3f);
  assert_int_equal(sk_quant_row_bytes(SK_GGML_Q8_0, 64), 68);
  assert_int_equal(sk_quant_row_bytes(SK_GGML_Q4_0, 64), 36);
  assert_int_equal(sk_quant_row_bytes(SK_GGML_Q8_0, 48), 0);
  assert_int_equal(sk_quant_row_bytes(SK_GGML_Q4_1, 64), 40);
  assert_int_equal(sk_quant_row_bytes(SK_GGML_Q4_K, 256), 144);
  assert_int_equal(sk_quant_row_bytes(SK_GGML_Q4_K, 64), 0);
  assert_int_equal(sk_quant_row_bytes(SK_GGML_Q8_1, 64), 0); /* not a weight type */
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = sk_f16_to_f32((uint16_t)h);
    if (isnan(f)) continue;
    assert_int_equal(sk_f32_to_f16(f), h); /* every half round-trips */
  }
  assert_int_equal(sk_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
}

static void test_select(void **state) {
  (void)state;
  struct sk_error err = {0};
  assert_int_equal(sk_kernels_select("sse9", &err), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "unknown kernel 'sse9'"));
  assert_true(sk_kernels_supported("generic"));
  assert_non_null(strstr(sk_kernels_available(), "generic"));
  assert_int_equal(sk_kernels_select(NULL, &err), 0);
  printf("kernels on this CPU: %s; auto selects %s\n", sk_kernels_available(), sk_kernels_name());
}

/* ---- pool ---- */

struct count {
  atomic_uint hits[1000];
  atomic_uint threads_seen;
};

static void count_task(void *ctx, uint32_t task, uint32_t thread) {
  struct count *c = ctx;
  atomic_fetch_add(&c->hits[task], 1);
  atomic_fetch_or(&c->threads_seen, 1u << thread);
}

static void test_pool(void **state) {
  (void)state;
  for (uint32_t n = 1; n <= 4; n++) {
    struct sk_pool *p = NULL;
    struct sk_error err = {0};
    assert_int_equal(sk_pool_new(n, &p, &err), 0);
    assert_int_equal(sk_pool_threads(p), n);
    for (uint32_t run = 0; run < 200; run++) {
      static struct count c;
      memset(&c, 0, sizeof c);
      uint32_t tasks = 1 + run * 7 % 1000;
      sk_pool_run(p, count_task, &c, tasks);
      for (uint32_t t = 0; t < 1000; t++) assert_int_equal(c.hits[t], t < tasks ? 1 : 0);
      assert_true(atomic_load(&c.threads_seen) < (1u << n));
    }
    sk_pool_free(p);
  }
  struct count c;
  memset(&c, 0, sizeof c);
  sk_pool_run(NULL, count_task, &c, 5);
  assert_int_equal(c.hits[4], 1);
  struct sk_pool *p = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_pool_new(0, &p, &err), -SK_ERR_BAD_REQUEST);
  assert_int_equal(sk_pool_new(SK_POOL_MAX_THREADS + 1, &p, &err), -SK_ERR_BAD_REQUEST);
}

/* Runs back to back with task counts that alternate between small and
 * large: every task must belong to the run in progress (a task index
 * within that run's count, the run still live), and each run's tasks all
 * ran exactly once by the time sk_pool_run returns. A worker that took a
 * task count of the next run while the claim was still the previous
 * run's would run task indices past the end of the previous run. */
struct overlap_run {
  uint32_t n;
  atomic_uint done;
  atomic_bool live;
};

static atomic_uint g_stray; /* tasks that ran outside their run */

static void overlap_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  struct overlap_run *r = ctx;
  if (task >= r->n || !atomic_load(&r->live)) atomic_fetch_add(&g_stray, 1);
  atomic_fetch_add(&r->done, 1);
}

static void test_pool_runs_never_overlap(void **state) {
  (void)state;
  struct sk_pool *p = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_pool_new(2, &p, &err), 0);
  atomic_store(&g_stray, 0);
  uint32_t bad_counts = 0;
  for (uint32_t run = 0; run < 200000; run++) {
    struct overlap_run r = {.n = run % 2 ? 2 : 48};
    atomic_init(&r.done, 0);
    atomic_init(&r.live, true);
    sk_pool_run(p, overlap_task, &r, r.n);
    atomic_store(&r.live, false);
    if (atomic_load(&r.done) != r.n) bad_counts++;
  }
  sk_pool_free(p);
  assert_int_equal(atomic_load(&g_stray), 0);
  assert_int_equal(bad_counts, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_select),
      cmocka_unit_test(test_blocks),
      cmocka_unit_test(test_quantize_rows),
      cmocka_unit_test(test_matmul_reference),
      cmocka_unit_test(test_matmul_batch_invariance),
      cmocka_unit_test(test_avx512_equals_avx2_vnni),
      cmocka_unit_test(test_amx_equals_avx2_vnni),
      cmocka_unit_test(test_amx_shared_layout_and_threads),
      cmocka_unit_test(test_f32_packed_equals_gguf),
      cmocka_unit_test(test_f16_equals_f32),
      cmocka_unit_test(test_attention_primitives),
      cmocka_unit_test(test_to_f16),
      cmocka_unit_test(test_from_f16),
      cmocka_unit_test(test_rope_exact),
      cmocka_unit_test(test_softmax_swiglu),
      cmocka_unit_test(test_pool),
      cmocka_unit_test(test_pool_runs_never_overlap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
