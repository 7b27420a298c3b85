/* Random matrices and activations for the kernel tests
 * (test-kernels*.c); every helper fails the test on error. */
#ifndef SK_TESTKERNELS_H
#define SK_TESTKERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "model/kernels.h"

/* The kernel variants, each run where the CPU has it. */
extern const char *const variants[5];
#define N_VARIANTS (sizeof variants / sizeof variants[0])

/* The generator's state: a test that wants its own sequence sets it. */
extern uint64_t rng;
/* Uniform in [-1, 1). */
float frand(void);
/* sk_kernels_select(name); a name other than "auto" must be the one
 * selected. */
void select_or_fail(const char *name);
/* A random matrix in `type`, its floats (dequantized), owned buffers. */
struct mat {
  struct sk_wmat w;
  void *data, *packed;
  float *f; /* (rows, cols) the values the type holds */
};
/* A rows x cols matrix of random values in type (f32, f16, q8_0, q4_0). */
void mat_make(struct mat *m, uint32_t type, uint32_t rows, uint32_t cols);
/* (Re)packs m's weights for the selected variant. */
void mat_pack(struct mat *m);
void mat_free(struct mat *m);
/* Activations of n rows, with their q8 blocks when cols allows. */
struct acts {
  struct sk_act a;
  float *x;
  int8_t *q;
  float *d;
  int32_t *s;
};
/* n random rows of cols values, ld floats apart. */
void acts_make(struct acts *t, uint32_t n, uint32_t cols, size_t ld);
void acts_free(struct acts *t);
/* n pointers to rows ld floats apart in y (malloc'd). */
float **row_ptrs(float *y, uint32_t n, uint32_t ld);

#endif
