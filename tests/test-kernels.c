/* Kernels (kernels.h), block formats (quant.h) and the pool (pool.h):
 * every variant this CPU runs against a double-precision reference, the
 * batch invariance the scheduler relies on (a row's result does not
 * depend on the other rows or the output range), F16 = F32 of the same
 * values, and the bit-exact RoPE. */
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

static const char *const variants[] = {"generic", "avx2", "avx2-vnni", "avx512-vnni", "amx"};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static uint64_t rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static void select_or_fail(const char *name) {
  struct sk_error err = {0};
  if (sk_kernels_select(name, &err) < 0) fail_msg("select %s: %s", name, err.message);
  if (strcmp(name, "auto") != 0) assert_string_equal(sk_kernels_name(), name);
}

/* A random matrix in `type`, its floats (dequantized), owned buffers. */
struct mat {
  struct sk_wmat w;
  void *data, *packed;
  float *f; /* (rows, cols) the values the type holds */
};

static void mat_make(struct mat *m, uint32_t type, uint32_t rows, uint32_t cols) {
  memset(m, 0, sizeof *m);
  size_t rb = sk_quant_row_bytes(type, cols);
  assert_true(rb > 0);
  m->data = malloc(rb * rows);
  m->f = malloc((size_t)rows * cols * sizeof *m->f);
  float *row = malloc(cols * sizeof *row);
  assert_non_null(m->data);
  assert_non_null(m->f);
  assert_non_null(row);
  for (uint32_t r = 0; r < rows; r++) {
    for (uint32_t c = 0; c < cols; c++) row[c] = frand();
    uint8_t *dst = (uint8_t *)m->data + r * rb;
    switch (type) {
    case SK_GGML_F32: memcpy(dst, row, rb); break;
    case SK_GGML_F16:
      for (uint32_t c = 0; c < cols; c++) {
        uint16_t h = sk_f32_to_f16(row[c]);
        memcpy(dst + 2 * c, &h, 2);
      }
      break;
    case SK_GGML_Q8_0: sk_quantize_row_q8_0(row, cols, (void *)dst); break;
    case SK_GGML_Q4_0: sk_quantize_row_q4_0(row, cols, (void *)dst); break;
    default: fail();
    }
    assert_int_equal(sk_dequantize_row(type, dst, cols, m->f + (size_t)r * cols), 0);
  }
  free(row);
  m->w = (struct sk_wmat){.type = type, .rows = rows, .cols = cols, .row_bytes = rb,
                          .data = m->data};
}

static void mat_pack(struct mat *m) {
  struct sk_error err = {0};
  free(m->packed);
  m->w.packed = NULL;
  assert_int_equal(sk_kernels_pack(&m->w, &m->packed, &err), 0);
}

static void mat_free(struct mat *m) {
  free(m->data);
  free(m->packed);
  free(m->f);
}

/* Activations of n rows, with their q8 blocks when cols allows. */
struct acts {
  struct sk_act a;
  float *x;
  int8_t *q;
  float *d;
  int32_t *s;
};

static void acts_make(struct acts *t, uint32_t n, uint32_t cols, size_t ld) {
  t->x = malloc(n * ld * sizeof *t->x);
  t->q = malloc((size_t)n * cols + 1);
  t->d = malloc(((size_t)n * cols / SK_QK + 1) * sizeof *t->d);
  t->s = malloc(((size_t)n * cols / SK_QK + 1) * sizeof *t->s);
  assert_non_null(t->x);
  for (size_t i = 0; i < n * ld; i++) t->x[i] = frand();
  if (cols % SK_QK == 0) sk_kernels_quantize_rows(t->x, ld, n, cols, t->q, t->d, t->s);
  t->a = (struct sk_act){.n = n, .cols = cols, .f = t->x, .ldf = ld, .q = t->q, .d = t->d,
                         .s = t->s};
}

static void acts_free(struct acts *t) {
  free(t->x);
  free(t->q);
  free(t->d);
  free(t->s);
}

static float **row_ptrs(float *y, uint32_t n, uint32_t ld) {
  float **r = malloc(n * sizeof *r);
  assert_non_null(r);
  for (uint32_t i = 0; i < n; i++) r[i] = y + (size_t)i * ld;
  return r;
}

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


/* ---- every weight type ----------------------------------------------- */

static const uint32_t all_types[] = {
    SK_GGML_F32,  SK_GGML_F16,  SK_GGML_BF16, SK_GGML_Q8_0, SK_GGML_Q4_0,
    SK_GGML_Q4_1, SK_GGML_Q5_0, SK_GGML_Q5_1, SK_GGML_IQ4_NL, SK_GGML_Q2_K,
    SK_GGML_Q3_K, SK_GGML_Q4_K, SK_GGML_Q5_K, SK_GGML_Q6_K, SK_GGML_IQ4_XS,
};
#define N_ALL_TYPES (sizeof all_types / sizeof all_types[0])

static bool is_k_type(uint32_t t) {
  return t == SK_GGML_Q2_K || t == SK_GGML_Q3_K || t == SK_GGML_Q4_K || t == SK_GGML_Q5_K ||
         t == SK_GGML_Q6_K || t == SK_GGML_IQ4_XS;
}

/* A matrix of random valid blocks (sk_quant_random_row) and its values. */
static void mat_make_random(struct mat *m, uint32_t type, uint32_t rows, uint32_t cols,
                            uint64_t seed) {
  memset(m, 0, sizeof *m);
  size_t rb = sk_quant_row_bytes(type, cols);
  assert_true(rb > 0);
  m->data = malloc(rb * rows);
  m->f = malloc((size_t)rows * cols * sizeof *m->f);
  assert_non_null(m->data);
  assert_non_null(m->f);
  for (uint32_t r = 0; r < rows; r++) {
    uint8_t *dst = (uint8_t *)m->data + r * rb;
    assert_int_equal(sk_quant_random_row(type, cols, 1.0f, &seed, dst), 0);
    assert_int_equal(sk_dequantize_row(type, dst, cols, m->f + (size_t)r * cols), 0);
    for (uint32_t c = 0; c < cols; c++) assert_true(isfinite(m->f[(size_t)r * cols + c]));
  }
  m->w = (struct sk_wmat){.type = type, .rows = rows, .cols = cols, .row_bytes = rb,
                          .data = m->data};
}

/* Activations with both quantized forms (cols a multiple of 256). */
struct kacts {
  struct acts l;
  int8_t *kq;
  float *kd;
  int16_t *ks;
};

static void kacts_make(struct kacts *t, uint32_t n, uint32_t cols) {
  acts_make(&t->l, n, cols, cols);
  t->kq = malloc((size_t)n * cols);
  t->kd = malloc((size_t)n * cols / SK_QKK * sizeof *t->kd);
  t->ks = malloc((size_t)n * cols / 16 * sizeof *t->ks);
  assert_non_null(t->kq);
  sk_kernels_quantize_rows_k(t->l.x, cols, n, cols, t->kq, t->kd, t->ks);
  t->l.a.kq = t->kq;
  t->l.a.kd = t->kd;
  t->l.a.ks = t->ks;
}

static void kacts_free(struct kacts *t) {
  acts_free(&t->l);
  free(t->kq);
  free(t->kd);
  free(t->ks);
}

static void check_quantize_rows_k(void);

/* The Q8_K quantizer: ggml's rule (kernels.h), exactly, on every
 * variant this CPU runs (ties of the rounding and a largest magnitude
 * that occurs with both signs included). */
static void test_quantize_rows_k(void **state) {
  (void)state;
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    check_quantize_rows_k();
  }
  select_or_fail("auto");
}

static void check_quantize_rows_k(void) {
  const uint32_t n = 2, cols = 512;
  float x[2 * 512];
  for (size_t i = 0; i < 2 * 512; i++) x[i] = frand() * 5.0f;
  for (size_t i = 256; i < 512; i++) x[i] = 0.0f; /* an all-zero block */
  x[700] = -9.0f; /* the largest magnitude, negative */
  x[100] = -127.0f / 2; /* the largest magnitude, first negative: scale 2 */
  x[101] = 1.25f;       /* ties: 2.5 and 3.5 round to even */
  x[102] = 1.75f;
  x[130] = 127.0f / 2;
  x[3 * 256 + 5] = NAN; /* not a number: quantized to 0, left out of the maximum */
  int8_t q[2 * 512];
  float d[4];
  int16_t bs[64];
  sk_kernels_quantize_rows_k(x, cols, n, cols, q, d, bs);
  for (uint32_t b = 0; b < 4; b++) {
    const float *xb = x + 256 * b;
    float amax = 0.0f, max = 0.0f;
    for (uint32_t j = 0; j < 256; j++)
      if (fabsf(xb[j]) > amax) amax = fabsf(xb[j]), max = xb[j];
    if (amax == 0.0f) {
      assert_true(d[b] == 0.0f);
      for (uint32_t j = 0; j < 256; j++) assert_int_equal(q[256 * b + j], 0);
    } else {
      const float is = -127.0f / max;
      assert_true(d[b] == 1.0f / is);
      for (uint32_t j = 0; j < 256; j++) {
        float v = nearbyintf(is * xb[j]);
        assert_int_equal(q[256 * b + j], v != v ? 0 : v > 127.0f ? 127 : (int)v);
      }
    }
    for (uint32_t g = 0; g < 16; g++) {
      int sum = 0;
      for (uint32_t l = 0; l < 16; l++) sum += q[256 * b + 16 * g + l];
      assert_int_equal(bs[16 * b + g], sum);
    }
  }
  assert_true(d[2] == 1.0f / (-127.0f / -9.0f)); /* the negative maximum gives d > 0 */
  assert_true(d[0] == 0.5f); /* the first of -max and +max */
  assert_int_equal(q[101], 2);
  assert_int_equal(q[102], 4);
  assert_int_equal(q[130], 127);
  assert_int_equal(q[3 * 256 + 5], 0);
}

/* Every type on every variant this CPU runs: against a double reference
 * over the weights' values (sinkd's dequantizer) and the quantized
 * activations the type reads; the K-quants and IQ4_XS also within
 * float rounding of the portable code; avx2-vnni bit-identical to avx2
 * where they share a structure, avx512-vnni and amx for the K-quants and
 * IQ4_XS; every batch row identical to that row alone, over
 * uneven output ranges. */
static void test_all_types(void **state) {
  (void)state;
  const uint32_t rows = 37, cols_list[] = {256, 768};
  const uint32_t N = 6;
  for (size_t ti = 0; ti < N_ALL_TYPES; ti++) {
    const uint32_t type = all_types[ti];
    for (size_t ci = 0; ci < 2; ci++) {
      const uint32_t cols = cols_list[ci];
      struct mat m;
      mat_make_random(&m, type, rows, cols, 1000 + ti * 7 + ci);
      struct kacts t;
      kacts_make(&t, N, cols);
      float *gen = NULL, *portable = NULL;
      for (size_t v = 0; v < N_VARIANTS; v++) {
        if (!sk_kernels_supported(variants[v])) continue;
        select_or_fail(variants[v]);
        mat_pack(&m);
        float *y = calloc((size_t)N * rows, sizeof *y);
        float **yr = row_ptrs(y, N, rows);
        const uint32_t cuts[] = {0, 3, 8, 9, 24, rows};
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
          sk_kernels_matmul(&m.w, &t.l.a, yr, cuts[c], cuts[c + 1]);
        for (uint32_t i = 0; i < N; i++) {
          for (uint32_t o = 0; o < rows; o++) {
            double ref = 0.0, mag = 0.0;
            for (uint32_t k = 0; k < cols; k++) {
              double xv;
              if (is_k_type(type))
                xv = (double)t.kd[(i * cols + k) / SK_QKK] * t.kq[i * cols + k];
              else if (type == SK_GGML_F32 || type == SK_GGML_F16 || type == SK_GGML_BF16)
                xv = t.l.x[i * cols + k];
              else
                xv = (double)t.l.d[(i * cols + k) / SK_QK] * t.l.q[i * cols + k];
              ref += (double)m.f[(size_t)o * cols + k] * xv;
              mag += fabs((double)m.f[(size_t)o * cols + k] * xv);
            }
            double d = fabs(y[i * rows + o] - ref);
            if (!(d <= 2e-5 * mag + 1e-6))
              fail_msg("%s %s %ux%u [%u][%u]: %.9g vs %.9g (magnitude %.3g)", variants[v],
                       sk_ggml_type_name(type), rows, cols, i, o, y[i * rows + o], ref, mag);
          }
          /* the row alone */
          struct sk_act one = t.l.a;
          one.n = 1;
          one.f = t.l.x + (size_t)i * cols;
          one.q = t.l.q + (size_t)i * cols;
          one.d = t.l.d + (size_t)i * cols / SK_QK;
          one.s = t.l.s + (size_t)i * cols / SK_QK;
          one.kq = t.kq + (size_t)i * cols;
          one.kd = t.kd + (size_t)i * cols / SK_QKK;
          one.ks = t.ks + (size_t)i * cols / 16;
          float *alone = malloc(rows * sizeof *alone);
          sk_kernels_matmul(&m.w, &one, &alone, 0, rows);
          if (memcmp(alone, y + (size_t)i * rows, rows * sizeof *alone) != 0)
            fail_msg("%s %s %ux%u: batch row %u differs from the row alone", variants[v],
                     sk_ggml_type_name(type), rows, cols, i);
          free(alone);
        }
        /* avx2 and avx2-vnni: the same lanes and float steps for the
         * types they share a structure for (all but Q8_0/Q4_0, whose
         * avx2-vnni products read the packed layout) */
        const bool same = type != SK_GGML_Q8_0 && type != SK_GGML_Q4_0;
        /* K-quants and IQ4_XS: avx512-vnni and amx fuse avx2's integer
         * steps (vpdpwssd), with the same lanes and float steps; but
         * Q4_K and Q6_K, whose 16-row lane layouts sum each output in one
         * lane (within float rounding of the portable code, checked below) */
        const bool same512 = is_k_type(type) && type != SK_GGML_Q4_K && type != SK_GGML_Q6_K &&
                             (!strcmp(variants[v], "avx512-vnni") || !strcmp(variants[v], "amx"));
        /* every variant within float rounding of the portable code: the
         * same exact integer sums per super-block or block, summed in
         * float in another grouping */
        for (uint32_t e = 0; portable && e < N * rows; e++) {
          const uint32_t i = e / rows, o = e % rows;
          double mag = 0.0;
          for (uint32_t k = 0; k < cols; k++) {
            double xv = is_k_type(type) ? (double)t.kd[(i * cols + k) / SK_QKK] * t.kq[i * cols + k]
                                        : (double)t.l.x[i * cols + k];
            mag += fabs((double)m.f[(size_t)o * cols + k] * xv);
          }
          if (is_k_type(type) && !(fabs((double)y[e] - portable[e]) <= 1e-5 * mag))
            fail_msg("%s %s %ux%u [%u][%u]: %.9g, the portable code %.9g (magnitude %.3g)",
                     variants[v], sk_ggml_type_name(type), rows, cols, i, o, y[e],
                     portable[e], mag);
        }
        if (!strcmp(variants[v], "generic")) {
          portable = y;
        } else if (!strcmp(variants[v], "avx2")) {
          gen = y;
        } else {
          if (same && gen && !strcmp(variants[v], "avx2-vnni") &&
              memcmp(y, gen, (size_t)N * rows * sizeof *y) != 0)
            fail_msg("avx2-vnni %s %ux%u: differs from avx2", sk_ggml_type_name(type), rows, cols);
          if (same512 && gen && memcmp(y, gen, (size_t)N * rows * sizeof *y) != 0)
            fail_msg("%s %s %ux%u: differs from avx2", variants[v], sk_ggml_type_name(type),
                     rows, cols);
          free(y);
        }
        free(yr);
      }
      printf("%-7s %ux%u: every variant within the reference\n", sk_ggml_type_name(type), rows,
             cols);
      free(gen);
      free(portable);
      kacts_free(&t);
      mat_free(&m);
    }
  }
  select_or_fail("auto");
}

/* Whether y (n rows of `rows` outputs) is within float rounding of ref:
 * |y - ref| <= 1e-5 sum_k |w x| (m's weights, t's Q8_K activations). */
static bool k_within(const struct mat *m, const struct kacts *t, const float *y,
                     const float *ref, uint32_t n, uint32_t rows, uint32_t cols) {
  for (uint32_t i = 0; i < n; i++)
    for (uint32_t o = 0; o < rows; o++) {
      double mag = 0.0;
      for (uint32_t k = 0; k < cols; k++)
        mag += fabs((double)m->f[(size_t)o * cols + k] *
                    ((double)t->kd[(i * cols + k) / SK_QKK] * t->kq[i * cols + k]));
      if (!(fabs((double)y[i * rows + o] - ref[i * rows + o]) <= 1e-5 * mag)) return false;
    }
  return true;
}

/* Q4_K and Q6_K products of 1..20 activation rows (every tile height of
 * the batched products and partial tiles) on 37 output rows (a partial
 * packed group), in output ranges that cut packed groups: each variant's
 * batch gives the bits of its rows one by one; avx512-vnni and amx give
 * the same bits as each other and, on their 16-row lane layouts (other
 * float sums), results within float rounding of the portable code. */
static void test_k_batch_equals_rows(void **state) {
  (void)state;
  const uint32_t types[] = {SK_GGML_Q4_K, SK_GGML_Q6_K};
  const uint32_t rows = 37, cols = 768, N = 20;
  for (size_t ti = 0; ti < 2; ti++) {
    struct mat m;
    mat_make_random(&m, types[ti], rows, cols, 77 + (uint32_t)ti);
    struct kacts t;
    kacts_make(&t, N, cols);
    float *alone = malloc((size_t)N * rows * sizeof *alone);
    float *gen = malloc((size_t)N * rows * sizeof *gen);
    float *y = malloc((size_t)N * rows * sizeof *y);
    assert_non_null(alone);
    assert_non_null(gen);
    assert_non_null(y);
    select_or_fail("avx2");
    struct sk_wmat plain = m.w;
    plain.packed = NULL;
    float **yg = row_ptrs(gen, N, rows);
    sk_kernels_matmul(&plain, &t.l.a, yg, 0, rows);
    free(yg);
    /* the portable code */
    float *port = malloc((size_t)N * rows * sizeof *port), *v512 = NULL;
    assert_non_null(port);
    select_or_fail("generic");
    float **yp = row_ptrs(port, N, rows);
    sk_kernels_matmul(&plain, &t.l.a, yp, 0, rows);
    free(yp);
    for (size_t v = 0; v < N_VARIANTS; v++) {
      if (!sk_kernels_supported(variants[v])) continue;
      select_or_fail(variants[v]);
      mat_pack(&m);
      for (uint32_t i = 0; i < N; i++) {
        struct sk_act one = t.l.a;
        one.n = 1;
        one.kq = t.kq + (size_t)i * cols;
        one.kd = t.kd + (size_t)i * cols / SK_QKK;
        one.ks = t.ks + (size_t)i * cols / 16;
        float *yi = alone + (size_t)i * rows;
        sk_kernels_matmul(&m.w, &one, &yi, 0, rows);
      }
      for (uint32_t n = 1; n <= N; n++) {
        memset(y, 0, (size_t)N * rows * sizeof *y);
        float **yr = row_ptrs(y, n, rows);
        struct sk_act part = t.l.a;
        part.n = n;
        const uint32_t cuts[] = {0, 5, 8, 16, 17, 30, rows};
        for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
          sk_kernels_matmul(&m.w, &part, yr, cuts[c], cuts[c + 1]);
        free(yr);
        if (memcmp(y, alone, (size_t)n * rows * sizeof *y) != 0)
          fail_msg("%s %s n=%u: the batch differs from its rows one by one", variants[v],
                   sk_ggml_type_name(types[ti]), n);
        const bool lanes = !strcmp(variants[v], "avx512-vnni") || !strcmp(variants[v], "amx");
        if (strcmp(variants[v], "generic") && !lanes &&
            memcmp(y, gen, (size_t)n * rows * sizeof *y) != 0)
          fail_msg("%s %s n=%u: differs from avx2 on the GGUF layout", variants[v],
                   sk_ggml_type_name(types[ti]), n);
        if (lanes && !k_within(&m, &t, y, port, n, rows, cols))
          fail_msg("%s %s n=%u: not within rounding of the portable code", variants[v],
                   sk_ggml_type_name(types[ti]), n);
      }
      if (!strcmp(variants[v], "avx512-vnni")) {
        v512 = malloc((size_t)N * rows * sizeof *v512);
        assert_non_null(v512);
        memcpy(v512, alone, (size_t)N * rows * sizeof *v512);
      } else if (!strcmp(variants[v], "amx") && v512 &&
                 memcmp(alone, v512, (size_t)N * rows * sizeof *v512) != 0) {
        fail_msg("amx %s: differs from avx512-vnni", sk_ggml_type_name(types[ti]));
      }
    }
    free(v512);
    free(port);
    printf("%-5s %ux%u, 1..%u rows: batches equal their rows\n", sk_ggml_type_name(types[ti]),
           rows, cols, N);
    free(y);
    free(gen);
    free(alone);
    kacts_free(&t);
    mat_free(&m);
  }
  select_or_fail("auto");
}

/* Q6_K on a matrix of 5000 x 256 (the batched avx512-vnni/amx product
 * goes over it in several output blocks), 3 activation rows, the outputs
 * cut inside 16-row groups: each variant's batch gives the bits of its
 * rows one by one and lies within float rounding of the portable code. */
static void test_q6_k_blocks(void **state) {
  (void)state;
  const uint32_t rows = 5000, cols = 256, N = 3;
  struct mat m;
  mat_make_random(&m, SK_GGML_Q6_K, rows, cols, 4242);
  struct kacts t;
  kacts_make(&t, N, cols);
  float *portable = malloc((size_t)N * rows * sizeof *portable);
  float *alone = malloc((size_t)N * rows * sizeof *alone);
  float *y = malloc((size_t)N * rows * sizeof *y);
  assert_non_null(portable);
  assert_non_null(alone);
  assert_non_null(y);
  select_or_fail("generic");
  float **yr = row_ptrs(portable, N, rows);
  sk_kernels_matmul(&m.w, &t.l.a, yr, 0, rows);
  free(yr);
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    select_or_fail(variants[v]);
    mat_pack(&m);
    memset(y, 0, (size_t)N * rows * sizeof *y);
    yr = row_ptrs(y, N, rows);
    const uint32_t cuts[] = {0, 7, 1609, 1650, 3333, rows};
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++)
      sk_kernels_matmul(&m.w, &t.l.a, yr, cuts[c], cuts[c + 1]);
    free(yr);
    for (uint32_t i = 0; i < N; i++) {
      struct sk_act one = t.l.a;
      one.n = 1;
      one.kq = t.kq + (size_t)i * cols;
      one.kd = t.kd + (size_t)i * cols / SK_QKK;
      one.ks = t.ks + (size_t)i * cols / 16;
      float *yi = alone + (size_t)i * rows;
      sk_kernels_matmul(&m.w, &one, &yi, 0, rows);
    }
    if (memcmp(y, alone, (size_t)N * rows * sizeof *y) != 0)
      fail_msg("%s q6_K %ux%u: the batch differs from its rows one by one", variants[v], rows,
               cols);
    if (!k_within(&m, &t, y, portable, N, rows, cols))
      fail_msg("%s q6_K %ux%u: not within rounding of the portable code", variants[v], rows,
               cols);
  }
  printf("q6_K  %ux%u, %u rows: every variant within the portable code\n", rows, cols, N);
  free(y);
  free(alone);
  free(portable);
  kacts_free(&t);
  mat_free(&m);
  select_or_fail("auto");
}

/* Dequantizers: hand-made blocks with known values. */
static void test_blocks_all(void **state) {
  (void)state;
  float y[256];
  /* Q4_1: d = 0.5, m = -1: x = 0.5 nib - 1 */
  uint8_t b41[20] = {0};
  uint16_t h = sk_f32_to_f16(0.5f);
  memcpy(b41, &h, 2);
  h = sk_f32_to_f16(-1.0f);
  memcpy(b41 + 2, &h, 2);
  b41[4] = 0x3f; /* element 0: 15, element 16: 3 */
  assert_int_equal(sk_dequantize_row(SK_GGML_Q4_1, b41, 32, y), 0);
  assert_true(y[0] == 6.5f && y[16] == 0.5f && y[1] == -1.0f);
  /* Q5_0: d = 1; element 0 nib 0 + bit -> 16 - 16 = 0; element 17 bit set, nib 0 */
  uint8_t b50[22] = {0};
  h = sk_f32_to_f16(1.0f);
  memcpy(b50, &h, 2);
  b50[2] = 0x01;       /* bit 0: element 0 */
  b50[4] = 0x02;       /* bit 17: element 17 */
  assert_int_equal(sk_dequantize_row(SK_GGML_Q5_0, b50, 32, y), 0);
  assert_true(y[0] == 0.0f && y[17] == 0.0f && y[1] == -16.0f && y[16] == -16.0f);
  /* IQ4_NL: d = 1, nibbles 0 and 15 */
  uint8_t bnl[18] = {0};
  memcpy(bnl, &h, 2);
  bnl[2] = 0xf0;
  assert_int_equal(sk_dequantize_row(SK_GGML_IQ4_NL, bnl, 32, y), 0);
  assert_true(y[0] == -127.0f && y[16] == 113.0f);
  /* Q6_K: d = 1, scales all 2: element 0 = 2 * (0 - 32); element 64 from
   * the high nibble of ql[0] and qh bits 4-5 */
  struct sk_block_q6_k b6;
  memset(&b6, 0, sizeof b6);
  b6.d = h;
  memset(b6.scales, 2, sizeof b6.scales);
  b6.ql[0] = 0x5f; /* element 0: 15, element 64: 5 */
  b6.qh[0] = 0x30; /* element 64: + 3 << 4 */
  assert_int_equal(sk_dequantize_row(SK_GGML_Q6_K, &b6, 256, y), 0);
  assert_true(y[0] == 2.0f * (15 - 32) && y[64] == 2.0f * (5 + 48 - 32) && y[1] == -64.0f);
  /* Q4_K: d = 1, dmin = 1, group 0 scale 3 min 1, group 1 (high
   * nibbles) scale 2 min 0 */
  struct sk_block_q4_k b4;
  memset(&b4, 0, sizeof b4);
  b4.d = b4.dmin = h;
  b4.scales[0] = 3;
  b4.scales[1] = 2;
  b4.scales[4] = 1;
  b4.qs[0] = 0x74; /* element 0: 4, element 32: 7 */
  assert_int_equal(sk_dequantize_row(SK_GGML_Q4_K, &b4, 256, y), 0);
  assert_true(y[0] == 3.0f * 4 - 1.0f && y[32] == 2.0f * 7 && y[1] == -1.0f);
  /* the row sizes of the table */
  const uint32_t sizes[][3] = {{SK_GGML_Q4_1, 32, 20},  {SK_GGML_Q5_0, 32, 22},
                               {SK_GGML_Q5_1, 32, 24},  {SK_GGML_IQ4_NL, 32, 18},
                               {SK_GGML_Q2_K, 256, 84}, {SK_GGML_Q3_K, 256, 110},
                               {SK_GGML_Q4_K, 256, 144}, {SK_GGML_Q5_K, 256, 176},
                               {SK_GGML_Q6_K, 256, 210}, {SK_GGML_IQ4_XS, 256, 136},
                               {SK_GGML_BF16, 1, 2}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    assert_int_equal(sk_quant_row_bytes(sizes[i][0], 2 * sizes[i][1]), 2 * sizes[i][2]);
    assert_int_equal(sk_quant_block(sizes[i][0]), sizes[i][1]);
  }
  assert_false(sk_quant_supported(SK_GGML_IQ2_XXS));
  assert_string_equal(sk_ggml_type_name(SK_GGML_IQ2_XXS), "iq2_xxs");
  assert_string_equal(sk_ggml_type_name(SK_GGML_Q4_K), "q4_K");
  assert_string_equal(sk_ggml_type_name(SK_GGML_IQ4_NL), "iq4_nl");
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
      cmocka_unit_test(test_quantize_rows_k),
      cmocka_unit_test(test_all_types),
      cmocka_unit_test(test_k_batch_equals_rows),
      cmocka_unit_test(test_q6_k_blocks),
      cmocka_unit_test(test_blocks_all),
      cmocka_unit_test(test_avx512_equals_avx2_vnni),
      cmocka_unit_test(test_amx_equals_avx2_vnni),
      cmocka_unit_test(test_amx_shared_layout_and_threads),
      cmocka_unit_test(test_f32_packed_equals_gguf),
      cmocka_unit_test(test_f16_equals_f32),
      cmocka_unit_test(test_attention_primitives),
      cmocka_unit_test(test_to_f16),
      cmocka_unit_test(test_rope_exact),
      cmocka_unit_test(test_softmax_swiglu),
      cmocka_unit_test(test_pool),
      cmocka_unit_test(test_pool_runs_never_overlap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
