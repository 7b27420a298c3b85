/* Every weight type through the kernels (testkernels.h): the K-quant
 * quantizers, each type's matmul in every variant against the
 * dequantized reference, batches equal to single rows, the block formats
 * of all types. */
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quantize_rows_k),
      cmocka_unit_test(test_all_types),
      cmocka_unit_test(test_k_batch_equals_rows),
      cmocka_unit_test(test_q6_k_blocks),
      cmocka_unit_test(test_blocks_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
