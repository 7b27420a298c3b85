/* Sampler: greedy, determinism per seed, top-k / top-p cuts, empirical
 * distributions against the softmax, parameter checks. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/sampler.h"

#define NV 512

static void init_ok(struct sk_sampler *s, float temp, uint32_t top_k,
                    float top_p, uint64_t seed, uint32_t n_vocab) {
  struct sk_sampler_params p = {.temperature = temp, .top_k = top_k,
                                .top_p = top_p, .seed = seed};
  struct sk_error err = {0};
  if (sk_sampler_init(s, &p, n_vocab, &err) < 0)
    fail_msg("sk_sampler_init: %s", err.message);
}

/* Model-like logits: a fixed pseudo-random vector in [-8, 12). */
static void make_logits(float *l, uint32_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (uint32_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    l[i] = (float)(x >> 8) / (float)(1u << 24) * 20.0f - 8.0f;
  }
}

static int32_t argmax(const float *l, uint32_t n) {
  uint32_t b = 0;
  for (uint32_t i = 1; i < n; i++)
    if (l[i] > l[b]) b = i;
  return (int32_t)b;
}

static void test_greedy(void **state) {
  (void)state;
  struct sk_sampler s;
  init_ok(&s, 0.0f, 0, 1.0f, 1, 4);
  const float ties[4] = {1.0f, 5.0f, 5.0f, 3.0f};
  assert_int_equal(sk_sampler_sample(&s, ties), 1);
  const float flat[4] = {-2.0f, -2.0f, -2.0f, -2.0f};
  assert_int_equal(sk_sampler_sample(&s, flat), 0);
  const float last[4] = {-9.0f, -3.0f, -7.0f, -1.0f};
  assert_int_equal(sk_sampler_sample(&s, last), 3);
  const float inf[4] = {0.0f, -INFINITY, INFINITY, 1.0f};
  assert_int_equal(sk_sampler_sample(&s, inf), 2);
  /* NaN (a broken model) never wins, wherever it is; all NaN gives 0 */
  const float nan0[4] = {NAN, 2.0f, NAN, 1.0f};
  assert_int_equal(sk_sampler_sample(&s, nan0), 1);
  const float allnan[4] = {NAN, NAN, NAN, NAN};
  assert_int_equal(sk_sampler_sample(&s, allnan), 0);
  const float neginf[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  assert_int_equal(sk_sampler_sample(&s, neginf), 0);
  sk_sampler_free(&s);
  /* the same over whole blocks of 8 and a tail (19 logits) */
  {
    float v[19];
    init_ok(&s, 0.0f, 0, 1.0f, 1, 19);
    for (int i = 0; i < 19; i++) v[i] = NAN;
    v[17] = -1.0f; /* the only number, in the tail */
    assert_int_equal(sk_sampler_sample(&s, v), 17);
    v[17] = NAN;
    assert_int_equal(sk_sampler_sample(&s, v), 0); /* all NaN */
    for (int i = 0; i < 19; i++) v[i] = -INFINITY;
    assert_int_equal(sk_sampler_sample(&s, v), 0);
    v[11] = NAN;
    v[12] = -INFINITY;
    v[13] = 2.0f; /* NaN beside the maximum; the same maximum in the tail */
    v[18] = 2.0f;
    v[0] = NAN;
    assert_int_equal(sk_sampler_sample(&s, v), 13);
    sk_sampler_free(&s);
  }
  /* lengths around the 8 lanes: the maximum in the tail, ties across lanes */
  for (uint32_t n = 1; n <= 19; n++) {
    float v[19];
    init_ok(&s, 0.0f, 0, 1.0f, 1, n);
    for (uint32_t at = 0; at < n; at++) {
      for (uint32_t i = 0; i < n; i++) v[i] = -(float)i;
      v[at] = 3.0f;
      if (at + 9 < n) v[at + 9] = 3.0f; /* a tie 9 ids later: the lower id wins */
      if (at + 3 < n) v[at + 3] = 3.0f; /* and 3 later, often in the same block of 8 */
      assert_int_equal(sk_sampler_sample(&s, v), (int32_t)at);
    }
    sk_sampler_free(&s);
  }

  float l[NV];
  init_ok(&s, 0.0f, 40, 0.9f, 7, NV); /* top-k/p do not matter at T=0 */
  for (uint32_t k = 0; k < 50; k++) {
    make_logits(l, NV, k);
    assert_int_equal(sk_sampler_sample(&s, l), argmax(l, NV));
  }
  sk_sampler_free(&s);
}

static void draw(uint64_t seed, float temp, uint32_t top_k, float top_p,
                 int32_t *out, int n) {
  struct sk_sampler s;
  init_ok(&s, temp, top_k, top_p, seed, NV);
  float l[NV];
  for (int i = 0; i < n; i++) {
    make_logits(l, NV, (uint32_t)i % 7);
    for (uint32_t j = 0; j < NV; j++) l[j] *= 0.3f; /* flatter */
    out[i] = sk_sampler_sample(&s, l);
    assert_true(out[i] >= 0 && out[i] < NV);
  }
  sk_sampler_free(&s);
}

static void test_seed_determinism(void **state) {
  (void)state;
  int32_t a[300], b[300], c[300];
  draw(42, 0.8f, 0, 1.0f, a, 300);
  draw(42, 0.8f, 0, 1.0f, b, 300);
  draw(43, 0.8f, 0, 1.0f, c, 300);
  assert_memory_equal(a, b, sizeof a);
  int differ = 0, distinct = 0;
  for (int i = 0; i < 300; i++) {
    differ += a[i] != c[i];
    bool seen = false;
    for (int j = 0; j < i; j++) seen |= a[j] == a[i];
    distinct += !seen;
  }
  assert_true(differ > 150); /* the flattened logits leave many choices */
  assert_true(distinct > 20);
  /* and with top-k / top-p on */
  draw(9, 1.3f, 50, 0.95f, a, 300);
  draw(9, 1.3f, 50, 0.95f, b, 300);
  assert_memory_equal(a, b, sizeof a);
}

/* The state is plain data: a copy continues the same sequence. */
static void test_state_copy(void **state) {
  (void)state;
  struct sk_sampler s1, s2;
  init_ok(&s1, 1.0f, 0, 1.0f, 1234, NV);
  init_ok(&s2, 0.0f, 0, 1.0f, 0, NV);
  float l[NV];
  make_logits(l, NV, 3);
  for (uint32_t j = 0; j < NV; j++) l[j] *= 0.2f;
  for (int i = 0; i < 17; i++) sk_sampler_sample(&s1, l);
  s2.st = s1.st;
  for (int i = 0; i < 100; i++)
    assert_int_equal(sk_sampler_sample(&s1, l), sk_sampler_sample(&s2, l));
  sk_sampler_free(&s1);
  sk_sampler_free(&s2);
}

static void test_top_k1_and_tiny_top_p_are_greedy(void **state) {
  (void)state;
  struct sk_sampler k1, p0;
  init_ok(&k1, 1.5f, 1, 1.0f, 5, NV);
  init_ok(&p0, 1.5f, 0, 1e-6f, 5, NV);
  float l[NV];
  for (uint32_t k = 0; k < 200; k++) {
    make_logits(l, NV, k);
    for (uint32_t j = 0; j < NV; j++) l[j] *= 0.1f; /* nearly flat */
    if (k % 10 == 0) l[17] = l[3] = 100.0f;         /* a tie: lowest id */
    int32_t want = argmax(l, NV);
    assert_int_equal(sk_sampler_sample(&k1, l), want);
    assert_int_equal(sk_sampler_sample(&p0, l), want);
  }
  sk_sampler_free(&k1);
  sk_sampler_free(&p0);
}

/* Counts of `draws` samples must fall within 4.5 binomial standard
 * deviations of draws * p (the counts are fixed by the seed, so this is
 * exact; the band is what a correct sampler with another seed meets). */
static void check_counts(const int *count, const double *p, int n, int draws) {
  for (int i = 0; i < n; i++) {
    double mean = draws * p[i], sd = sqrt(draws * p[i] * (1.0 - p[i]));
    if (p[i] == 0.0) {
      if (count[i] != 0) fail_msg("token %d drawn %d times, p = 0", i,
                                  count[i]);
      continue;
    }
    if (fabs(count[i] - mean) > 4.5 * sd)
      fail_msg("token %d: %d draws, expected %.1f +- %.1f", i, count[i], mean,
               4.5 * sd);
  }
}

static void softmax(const float *l, double t, double *p, int n) {
  double max = -INFINITY, sum = 0.0;
  for (int i = 0; i < n; i++) max = fmax(max, l[i] / t);
  for (int i = 0; i < n; i++) sum += p[i] = exp(l[i] / t - max);
  for (int i = 0; i < n; i++) p[i] /= sum;
}

static void run_dist(float temp, uint32_t top_k, float top_p,
                     const double *p) {
  const float l[4] = {1.0f, 2.0f, 0.5f, -1.0f};
  struct sk_sampler s;
  init_ok(&s, temp, top_k, top_p, 2024, 4);
  int count[4] = {0};
  const int draws = 20000;
  for (int i = 0; i < draws; i++) count[sk_sampler_sample(&s, l)]++;
  printf("T=%.1f top_k=%u top_p=%.2f: %d %d %d %d\n", (double)temp, top_k,
         (double)top_p, count[0], count[1], count[2], count[3]);
  check_counts(count, p, 4, draws);
  sk_sampler_free(&s);
}

static void test_distribution(void **state) {
  (void)state;
  const float l[4] = {1.0f, 2.0f, 0.5f, -1.0f};
  double p[4];
  /* plain softmax at T = 1 and T = 2 */
  softmax(l, 1.0, p, 4);
  run_dist(1.0f, 0, 1.0f, p);
  softmax(l, 2.0, p, 4);
  run_dist(2.0f, 0, 1.0f, p);
  /* top-k 2: tokens 1 and 0 only, renormalised */
  const float l2[2] = {1.0f, 2.0f};
  double p2[2];
  softmax(l2, 1.0, p2, 2);
  double pk[4] = {p2[0], p2[1], 0.0, 0.0};
  run_dist(1.0f, 2, 1.0f, pk);
  /* top-p: at T=1 the sorted probabilities are 0.609, 0.224, 0.136,
   * 0.030; top_p 0.8 keeps the first two (0.833 >= 0.8), top_p 0.85 the
   * first three (0.969) */
  softmax(l, 1.0, p, 4);
  assert_true(p[1] + p[0] >= 0.8 && p[1] < 0.8);
  run_dist(1.0f, 0, 0.8f, pk);
  const float l3[3] = {1.0f, 2.0f, 0.5f};
  double p3[3];
  softmax(l3, 1.0, p3, 3);
  double pp[4] = {p3[0], p3[1], p3[2], 0.0};
  run_dist(1.0f, 0, 0.85f, pp);
  /* top-p is computed before the temperature: at T = 3 the same cut */
  softmax(l3, 3.0, p3, 3);
  double pt[4] = {p3[0], p3[1], p3[2], 0.0};
  run_dist(3.0f, 0, 0.85f, pt);
}

/* sk_sampler_probs is the distribution sk_sampler_sample draws from:
 * softmax of the kept logits (top-k, top-p, temperature), 0 elsewhere;
 * greedy puts 1 at the argmax. */
static void test_probs(void **state) {
  (void)state;
  const float l[4] = {1.0f, 2.0f, 0.5f, -1.0f};
  struct sk_sampler s;
  float q[4];
  double p[4];
  init_ok(&s, 2.0f, 0, 1.0f, 1, 4);
  sk_sampler_probs(&s, l, q);
  softmax(l, 2.0, p, 4);
  for (int i = 0; i < 4; i++) assert_true(fabs(q[i] - p[i]) < 1e-6);
  sk_sampler_free(&s);
  init_ok(&s, 1.0f, 2, 1.0f, 1, 4); /* top-k 2: tokens 1 and 0 */
  sk_sampler_probs(&s, l, q);
  const float l2[2] = {1.0f, 2.0f};
  double p2[2];
  softmax(l2, 1.0, p2, 2);
  assert_true(fabs(q[0] - p2[0]) < 1e-6 && fabs(q[1] - p2[1]) < 1e-6);
  assert_true(q[2] == 0.0f && q[3] == 0.0f);
  sk_sampler_free(&s);
  init_ok(&s, 0.0f, 0, 1.0f, 1, 4);
  sk_sampler_probs(&s, l, q);
  assert_true(q[1] == 1.0f && q[0] == 0.0f && q[2] == 0.0f && q[3] == 0.0f);
  sk_sampler_free(&s);
}

/* Chi-square statistic of counts against n * p over k tokens. */
static double chi2(const int *count, const double *p, int k, int n) {
  double x = 0;
  for (int i = 0; i < k; i++) {
    const double e = n * p[i];
    x += (count[i] - e) * (count[i] - e) / e;
  }
  return x;
}

/* Speculative sampling (Leviathan et al. 2023, Algorithm 1): a token x
 * drawn from q, kept with probability min(1, p(x)/q(x)), else replaced
 * by a draw from norm(max(0, p - q)), is distributed as p; and so is a
 * deterministic proposal (q = NULL: one-hot at x) kept with probability
 * p(x), else replaced by a draw from p without x. 200000 seeded draws
 * each against the chi-square quantile at 1 - 1e-4 for 5 degrees of
 * freedom (25.7); the rule broken the usual way (a refused token replaced
 * by a draw from p) lands far above it, so the test tells them apart. */
#define N_SPEC_DRAWS 200000
static void test_speculative_rule(void **state) {
  (void)state;
  const float pf[6] = {0.30f, 0.25f, 0.20f, 0.15f, 0.07f, 0.03f};
  const float qf[6] = {0.05f, 0.10f, 0.50f, 0.05f, 0.25f, 0.05f};
  double p[6];
  for (int i = 0; i < 6; i++) p[i] = pf[i];
  const double limit = 25.7;
  struct sk_sampler s;
  /* a draft's proposal */
  init_ok(&s, 1.0f, 0, 1.0f, 77, 6);
  int count[6] = {0}, broken[6] = {0}, kept = 0;
  for (int i = 0; i < N_SPEC_DRAWS; i++) {
    const int32_t x = sk_sampler_draw(&s, qf);
    const int32_t y = sk_sampler_verify(&s, pf, qf, x);
    count[y < 0 ? x : y]++;
    kept += y < 0;
    /* the broken rule: the same test, a refused token redrawn from p */
    const int32_t z = sk_sampler_draw(&s, qf);
    broken[sk_sampler_verify(&s, pf, qf, z) < 0 ? z : sk_sampler_draw(&s, pf)]++;
  }
  double x_ok = chi2(count, p, 6, N_SPEC_DRAWS);
  const double x_bad = chi2(broken, p, 6, N_SPEC_DRAWS);
  printf("speculative rule, draft proposals: chi-square %.1f (limit %.1f; %d of %d kept); a "
         "refusal redrawn from p instead: %.1f\n",
         x_ok, limit, kept, N_SPEC_DRAWS, x_bad);
  assert_true(x_ok < limit);
  assert_true(x_bad > 10 * limit);
  /* sum min(p, q) = 0.05 + 0.10 + 0.20 + 0.05 + 0.07 + 0.03 = 0.50 */
  assert_true(fabs((double)kept / N_SPEC_DRAWS - 0.50) < 0.01);
  sk_sampler_free(&s);
  /* a deterministic proposal (look-up): always token 2 */
  init_ok(&s, 1.0f, 0, 1.0f, 78, 6);
  memset(count, 0, sizeof count);
  kept = 0;
  for (int i = 0; i < N_SPEC_DRAWS; i++) {
    const int32_t y = sk_sampler_verify(&s, pf, NULL, 2);
    count[y < 0 ? 2 : y]++;
    kept += y < 0;
    assert_true(y != 2); /* a refused x is never the replacement */
  }
  x_ok = chi2(count, p, 6, N_SPEC_DRAWS);
  printf("speculative rule, a fixed proposal: chi-square %.1f (limit %.1f; %d of %d kept)\n", x_ok,
         limit, kept, N_SPEC_DRAWS);
  assert_true(x_ok < limit);
  assert_true(fabs((double)kept / N_SPEC_DRAWS - 0.20) < 0.01);
  sk_sampler_free(&s);
}

static void expect_bad(struct sk_sampler_params p, const char *needle) {
  struct sk_error err = {0};
  assert_int_equal(sk_sampler_params_check(&p, &err), -SK_ERR_BAD_REQUEST);
  assert_int_equal(err.code, SK_ERR_BAD_REQUEST);
  if (!strstr(err.message, needle))
    fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
  struct sk_sampler s;
  assert_int_equal(sk_sampler_init(&s, &p, NV, &err), -SK_ERR_BAD_REQUEST);
  sk_sampler_free(&s); /* safe after a failed init */
}

static void test_bad_params(void **state) {
  (void)state;
  struct sk_sampler_params ok = {.temperature = 0.7f, .top_k = 40,
                                 .top_p = 0.9f, .seed = 1};
  struct sk_error err = {0};
  assert_int_equal(sk_sampler_params_check(&ok, &err), 0);
  struct sk_sampler_params p = ok;
  p.temperature = -1.0f;
  expect_bad(p, "temperature -1");
  p.temperature = NAN;
  expect_bad(p, "temperature nan");
  p.temperature = INFINITY;
  expect_bad(p, "temperature inf");
  p.temperature = 1000.0f;
  expect_bad(p, "temperature 1000");
  p = ok;
  p.top_p = 0.0f;
  expect_bad(p, "top_p 0");
  p.top_p = 1.5f;
  expect_bad(p, "top_p 1.5");
  p.top_p = -0.5f;
  expect_bad(p, "top_p -0.5");
  p.top_p = NAN;
  expect_bad(p, "top_p nan");
  p = ok;
  p.top_p = 1.0f;
  p.temperature = 0.0f;
  assert_int_equal(sk_sampler_params_check(&p, &err), 0);
  struct sk_sampler s;
  assert_int_equal(sk_sampler_init(&s, &ok, 0, &err), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "n_vocab 0"));
  sk_sampler_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_greedy),
      cmocka_unit_test(test_seed_determinism),
      cmocka_unit_test(test_state_copy),
      cmocka_unit_test(test_top_k1_and_tiny_top_p_are_greedy),
      cmocka_unit_test(test_distribution),
      cmocka_unit_test(test_probs),
      cmocka_unit_test(test_speculative_rule),
      cmocka_unit_test(test_bad_params),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
