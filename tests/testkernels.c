/* Random matrices and activations for the kernel tests (testkernels.h). */
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
const char *const variants[] = {"generic", "avx2", "avx2-vnni", "avx512-vnni", "amx"};
uint64_t rng = 12345;
float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

void select_or_fail(const char *name) {
  struct sk_error err = {0};
  if (sk_kernels_select(name, &err) < 0) fail_msg("select %s: %s", name, err.message);
  if (strcmp(name, "auto") != 0) assert_string_equal(sk_kernels_name(), name);
}

void mat_make(struct mat *m, uint32_t type, uint32_t rows, uint32_t cols) {
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

void mat_pack(struct mat *m) {
  struct sk_error err = {0};
  free(m->packed);
  m->w.packed = NULL;
  assert_int_equal(sk_kernels_pack(&m->w, &m->packed, &err), 0);
}

void mat_free(struct mat *m) {
  free(m->data);
  free(m->packed);
  free(m->f);
}

/* Activations of n rows, with their q8 blocks when cols allows. */
void acts_make(struct acts *t, uint32_t n, uint32_t cols, size_t ld) {
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

void acts_free(struct acts *t) {
  free(t->x);
  free(t->q);
  free(t->d);
  free(t->s);
}

float **row_ptrs(float *y, uint32_t n, uint32_t ld) {
  float **r = malloc(n * sizeof *r);
  assert_non_null(r);
  for (uint32_t i = 0; i < n; i++) r[i] = y + (size_t)i * ld;
  return r;
}
