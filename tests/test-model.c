/* Forward pass against llama.cpp's outputs for stories260K (reference/
 * stories260K: prefill_logits.json, greedy.json, logprobs.json), input
 * validation, and the F16 / quantized loading paths (with GGUF files
 * written by a small writer below). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf.h"
#include "kvcache.h"
#include "model.h"
#include "testutil.h"

/* llama.cpp reference tolerance (brief: within 1e-4). */
#define LOGIT_TOL 1e-4

struct fixture {
  struct sk_gguf *g;
  struct sk_model *m;
  const struct sk_model_config *c;
};

static struct fixture fx;
/* Largest |ours - llama.cpp| seen per reference file, printed at the end. */
static double max_diff_prefill, max_diff_greedy, max_diff_logprob;

static int setup(void **state) {
  (void)state;
  struct sk_error err = {0};
  if (sk_gguf_open(sk_test_model_path(), &fx.g, &err) < 0) {
    fprintf(stderr, "open %s: %s\n", sk_test_model_path(), err.message);
    return -1;
  }
  if (sk_model_load(fx.g, &fx.m, &err) < 0) {
    fprintf(stderr, "load: %s\n", err.message);
    return -1;
  }
  fx.c = sk_model_config(fx.m);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  sk_model_free(fx.m);
  sk_gguf_close(fx.g);
  printf("max abs logit diff vs llama.cpp: prefill %.3g, greedy top10 %.3g; "
         "max abs logprob diff %.3g\n",
         max_diff_prefill, max_diff_greedy, max_diff_logprob);
  return 0;
}

static struct sk_kv *new_cache(const struct sk_model *m, uint32_t policy,
                               uint32_t n_sink, uint32_t window,
                               uint32_t capacity) {
  struct sk_kv_params p = {.policy = policy, .n_sink = n_sink,
                           .window = window, .capacity = capacity,
                           .rope_scale = 1.0f};
  struct sk_kv *kv = NULL;
  struct sk_error err = {0};
  int rc = sk_kv_new(sk_model_kv_shape(m), &p, &kv, &err);
  if (rc < 0) fail_msg("sk_kv_new: %s", err.message);
  return kv;
}

static struct sk_scratch *new_scratch(const struct sk_model *m, uint32_t b,
                                      uint32_t t) {
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  if (sk_scratch_new(m, b, t, &s, &err) < 0)
    fail_msg("sk_scratch_new: %s", err.message);
  return s;
}

static void forward_ok(const struct sk_model *m, struct sk_scratch *s,
                       struct sk_kv *kv, const int32_t *tok, uint32_t n,
                       float *logits, bool all) {
  struct sk_error err = {0};
  int rc = sk_model_forward(m, s, kv, tok, n, logits, all, &err);
  if (rc < 0) fail_msg("sk_model_forward: %s", err.message);
}

static int32_t argmax(const float *l, uint32_t n) {
  uint32_t b = 0;
  for (uint32_t i = 1; i < n; i++)
    if (l[i] > l[b]) b = i;
  return (int32_t)b;
}

static double json_num(const json_t *v) {
  assert_true(json_is_number(v));
  return json_number_value(v);
}

static void check_close(double got, double want, double tol, double *maxd,
                        const char *what, size_t i, size_t j) {
  double d = fabs(got - want);
  if (d > *maxd) *maxd = d;
  if (!(d <= tol))
    fail_msg("%s [%zu][%zu]: got %.9g, want %.9g (diff %.3g > %.3g)", what, i,
             j, got, want, d, tol);
}

/* ---- (1) prefill, one batch, all logits ----------------------------- */

static void test_prefill_logits(void **state) {
  (void)state;
  json_t *ref = sk_test_load_reference("prefill_logits.json");
  size_t n;
  int32_t *ids = sk_test_json_ids(json_object_get(ref, "prompt_ids"), &n);
  uint32_t V = fx.c->n_vocab;
  assert_int_equal(V, 512);
  assert_int_equal(json_integer_value(json_object_get(ref, "n_vocab")), V);
  assert_int_equal(n, 16);

  struct sk_kv *kv = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 512);
  struct sk_scratch *s = new_scratch(fx.m, 512, 512);
  float *logits = malloc(n * V * sizeof *logits);
  assert_non_null(logits);
  forward_ok(fx.m, s, kv, ids, (uint32_t)n, logits, true);
  assert_int_equal(kv->hdr->n_resident, n);

  const json_t *all = json_object_get(ref, "all_positions_logits");
  assert_int_equal(json_array_size(all), n);
  for (size_t i = 0; i < n; i++) {
    const json_t *row = json_array_get(all, i);
    assert_int_equal(json_array_size(row), V);
    for (size_t j = 0; j < V; j++)
      check_close(logits[i * V + j], json_num(json_array_get(row, j)),
                  LOGIT_TOL, &max_diff_prefill, "all_positions_logits", i, j);
  }
  const json_t *last = json_object_get(ref, "last_position_logits");
  assert_int_equal(json_array_size(last), V);
  for (size_t j = 0; j < V; j++)
    check_close(logits[(n - 1) * V + j], json_num(json_array_get(last, j)),
                LOGIT_TOL, &max_diff_prefill, "last_position_logits", n - 1,
                j);

  /* Only the last row asked for: the same values. */
  struct sk_kv *kv2 = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 512);
  float *last_only = malloc(V * sizeof *last_only);
  assert_non_null(last_only);
  forward_ok(fx.m, s, kv2, ids, (uint32_t)n, last_only, false);
  for (size_t j = 0; j < V; j++)
    check_close(last_only[j], json_num(json_array_get(last, j)), LOGIT_TOL,
                &max_diff_prefill, "last only", n - 1, j);

  free(last_only);
  sk_kv_delete(kv2);
  free(logits);
  sk_scratch_free(s);
  sk_kv_delete(kv);
  free(ids);
  json_decref(ref);
}

/* ---- (2) greedy decode, dense and non-evicting streaming ------------- */

static void run_greedy(uint32_t policy) {
  json_t *ref = sk_test_load_reference("greedy.json");
  const json_t *prompts = json_object_get(ref, "prompts");
  assert_int_equal(json_array_size(prompts), 5);
  uint32_t V = fx.c->n_vocab;
  struct sk_scratch *s = new_scratch(fx.m, 512, 512);
  float *logits = malloc(V * sizeof *logits);
  assert_non_null(logits);
  for (size_t pi = 0; pi < json_array_size(prompts); pi++) {
    const json_t *pr = json_array_get(prompts, pi);
    size_t n_prompt, n_gen;
    int32_t *prompt = sk_test_json_ids(json_object_get(pr, "prompt_ids"),
                                       &n_prompt);
    int32_t *want = sk_test_json_ids(json_object_get(pr, "generated_ids"),
                                     &n_gen);
    assert_int_equal(n_gen, 64);
    const json_t *steps = json_object_get(pr, "steps");
    assert_int_equal(json_array_size(steps), 8);
    struct sk_kv *kv = policy == SK_POLICY_DENSE
                           ? new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 512)
                           : new_cache(fx.m, SK_POLICY_STREAMING, 4, 508, 0);
    forward_ok(fx.m, s, kv, prompt, (uint32_t)n_prompt, logits, false);
    for (size_t t = 0; t < n_gen; t++) {
      if (t < 8) {
        const json_t *top10 =
            json_object_get(json_array_get(steps, t), "top10");
        assert_int_equal(json_array_size(top10), 10);
        /* our top-10 by (logit desc, id asc) */
        int32_t mine[10];
        for (int r = 0; r < 10; r++) {
          int32_t b = -1;
          for (uint32_t j = 0; j < V; j++) {
            bool used = false;
            for (int q = 0; q < r; q++) used |= mine[q] == (int32_t)j;
            if (!used && (b < 0 || logits[j] > logits[b])) b = (int32_t)j;
          }
          mine[r] = b;
          const json_t *pair = json_array_get(top10, (size_t)r);
          int32_t id = (int32_t)json_integer_value(json_array_get(pair, 0));
          if (mine[r] != id)
            fail_msg("prompt %zu step %zu rank %d: id %d, want %d", pi, t, r,
                     mine[r], id);
          check_close(logits[id], json_num(json_array_get(pair, 1)),
                      LOGIT_TOL, &max_diff_greedy, "top10", t, (size_t)r);
        }
      }
      int32_t next = argmax(logits, V);
      if (next != want[t])
        fail_msg("prompt %zu (%s) step %zu: generated %d, want %d", pi,
                 policy == SK_POLICY_DENSE ? "dense" : "streaming", t, next,
                 want[t]);
      struct sk_error err = {0};
      assert_int_equal(sk_kv_make_room(kv, 1, NULL, &err), 0);
      forward_ok(fx.m, s, kv, &next, 1, logits, false);
    }
    assert_int_equal(kv->hdr->n_resident, n_prompt + n_gen);
    assert_int_equal(kv->hdr->n_evicted, 0);
    sk_kv_delete(kv);
    free(prompt);
    free(want);
  }
  free(logits);
  sk_scratch_free(s);
  json_decref(ref);
}

static void test_greedy_dense(void **state) {
  (void)state;
  run_greedy(SK_POLICY_DENSE);
}

static void test_greedy_streaming(void **state) {
  (void)state;
  run_greedy(SK_POLICY_STREAMING);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefill_logits),
      cmocka_unit_test(test_greedy_dense),
      cmocka_unit_test(test_greedy_streaming),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
