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

#include "model/gguf.h"
#include "model/kernels.h"
#include "session/kvcache.h"
#include "model/model.h"
#include "model/pool.h"
#include "model/quant.h"
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
  /* SK_KERNEL runs the suite on one kernel variant (meson runs it once
   * per variant); before the model loads, which packs for it. */
  const char *kernel = getenv("SK_KERNEL");
  if (kernel && sk_kernels_select(kernel, &err) < 0) {
    fprintf(stderr, "%s\n", err.message);
    return -1;
  }
  printf("kernels: %s\n", sk_kernels_name());
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

static struct sk_kv *new_cache_t(const struct sk_model *m, uint32_t policy, uint32_t n_sink,
                                 uint32_t window, uint32_t capacity, uint32_t kv_type) {
  struct sk_kv_params p = {.policy = policy, .n_sink = n_sink,
                           .window = window, .capacity = capacity,
                           .rope_scale = 1.0f};
  struct sk_kv *kv = NULL;
  struct sk_error err = {0};
  struct sk_kv_shape shape = sk_model_kv_shape(m);
  shape.kv_type = kv_type;
  int rc = sk_kv_new(shape, &p, &kv, &err);
  if (rc < 0) fail_msg("sk_kv_new: %s", err.message);
  return kv;
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
  sk_kv_free(kv2);
  free(logits);
  sk_scratch_free(s);
  sk_kv_free(kv);
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
    sk_kv_free(kv);
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

/* ---- (3) log-probabilities over 2048 tokens, 4 batches of 512 -------- */

static void test_logprobs(void **state) {
  (void)state;
  json_t *ref = sk_test_load_reference("logprobs.json");
  const json_t *texts = json_object_get(ref, "texts");
  assert_int_equal(json_array_size(texts), 2);
  const uint32_t V = fx.c->n_vocab, N = 2048, B = 512;
  struct sk_scratch *s = new_scratch(fx.m, B, N);
  float *logits = malloc((size_t)N * V * sizeof *logits);
  double *lp = malloc((N - 1) * sizeof *lp);
  assert_non_null(logits);
  assert_non_null(lp);
  for (size_t ti = 0; ti < 2; ti++) {
    const json_t *tx = json_array_get(texts, ti);
    size_t n;
    int32_t *ids = sk_test_json_ids(json_object_get(tx, "token_ids"), &n);
    assert_int_equal(n, N);
    const json_t *want = json_object_get(tx, "logprobs");
    assert_int_equal(json_array_size(want), N - 1);
    struct sk_kv *kv = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, N);
    for (uint32_t b = 0; b < N / B; b++)
      forward_ok(fx.m, s, kv, ids + b * B, B, logits + (size_t)b * B * V,
                 true);
    assert_int_equal(kv->hdr->n_resident, N);
    for (uint32_t k = 0; k + 1 < N; k++) {
      const float *row = logits + (size_t)k * V;
      double max = row[0], sum = 0.0;
      for (uint32_t j = 1; j < V; j++)
        if (row[j] > max) max = row[j];
      for (uint32_t j = 0; j < V; j++) sum += exp((double)row[j] - max);
      lp[k] = (double)row[ids[k + 1]] - max - log(sum);
      check_close(lp[k], json_num(json_array_get(want, k)), LOGIT_TOL,
                  &max_diff_logprob, "logprobs", ti, k);
    }
    static const struct {
      const char *key;
      uint32_t last;
    } ppl[] = {{"perplexity_1_511", 511},
               {"perplexity_1_1023", 1023},
               {"perplexity_1_2047", 2047}};
    for (size_t i = 0; i < 3; i++) {
      double sum = 0.0;
      for (uint32_t k = 0; k < ppl[i].last; k++) sum += lp[k];
      double got = exp(-sum / ppl[i].last);
      double exp_ppl = json_num(json_object_get(tx, ppl[i].key));
      if (!(fabs(got / exp_ppl - 1.0) < 1e-3))
        fail_msg("text %zu %s: %.9g, want %.9g", ti, ppl[i].key, got,
                 exp_ppl);
    }
    sk_kv_free(kv);
    free(ids);
  }
  free(lp);
  free(logits);
  sk_scratch_free(s);
  json_decref(ref);
}

/* ---- (4) input validation: nothing committed on error ---------------- */

static void expect_forward_error(struct sk_scratch *s, struct sk_kv *kv,
                                 const int32_t *tok, uint32_t n, int code,
                                 const char *needle) {
  size_t size = (size_t)kv->hdr->size;
  void *before = malloc(size);
  assert_non_null(before);
  memcpy(before, kv->hdr, size);
  float logits[512];
  struct sk_error err = {0};
  int rc = sk_model_forward(fx.m, s, kv, tok, n, logits, false, &err);
  assert_int_equal(rc, -code);
  assert_int_equal(err.code, code);
  if (!strstr(err.message, needle))
    fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
  /* the whole block, K/V included, is untouched */
  assert_memory_equal(before, kv->hdr, size);
  free(before);
}

static void test_bad_input(void **state) {
  (void)state;
  struct sk_kv *kv = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 8);
  struct sk_scratch *s = new_scratch(fx.m, 4, 8);
  const int32_t ok[4] = {1, 403, 407, 261};
  forward_ok(fx.m, s, kv, ok, 2, NULL, false);

  const int32_t neg[3] = {1, -1, 5};
  expect_forward_error(s, kv, neg, 3, SK_ERR_BAD_REQUEST, "-1");
  const int32_t big[2] = {511, 512};
  expect_forward_error(s, kv, big, 2, SK_ERR_BAD_REQUEST, "512");
  expect_forward_error(s, kv, ok, 0, SK_ERR_BAD_REQUEST, "no tokens");
  const int32_t five[5] = {1, 2, 3, 4, 5};
  expect_forward_error(s, kv, five, 5, SK_ERR_BAD_REQUEST, "maximum batch 4");

  forward_ok(fx.m, s, kv, ok, 4, NULL, false); /* 6 of 8 */
  expect_forward_error(s, kv, five, 3, SK_ERR_CONTEXT_FULL, "needs 3, 2 of 8");
  assert_int_equal(kv->hdr->n_resident, 6);
  assert_int_equal(kv->hdr->n_seen, 6);

  /* a cache larger than the scratch's context */
  struct sk_kv *big_kv = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 16);
  forward_ok(fx.m, s, big_kv, ok, 4, NULL, false);
  forward_ok(fx.m, s, big_kv, ok, 4, NULL, false);
  expect_forward_error(s, big_kv, ok, 1, SK_ERR_BAD_REQUEST,
                       "scratch context 8");

  /* a cache of another shape */
  struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = 8,
                           .rope_scale = 1.0f};
  struct sk_kv_shape shape = {.n_layer = fx.c->n_layer + 1,
                              .kv_dim = fx.c->kv_dim};
  struct sk_kv *other = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_kv_new(shape, &p, &other, &err), 0);
  expect_forward_error(s, other, ok, 1, SK_ERR_BAD_REQUEST, "does not match");

  sk_kv_free(other);
  sk_kv_free(big_kv);
  sk_scratch_free(s);
  sk_kv_free(kv);
}

/* ---- GGUF writer for the F16 / BF16 / bad-model tests ---------------- */

struct buf {
  unsigned char *p;
  size_t len, cap;
};

static void buf_put(struct buf *b, const void *d, size_t n) {
  if (n == 0) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    b->p = realloc(b->p, cap);
    assert_non_null(b->p);
    b->cap = cap;
  }
  memcpy(b->p + b->len, d, n);
  b->len += n;
}
static void buf_u32(struct buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(struct buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void buf_str(struct buf *b, const char *s) {
  buf_u64(b, strlen(s));
  buf_put(b, s, strlen(s));
}
static void buf_pad(struct buf *b, size_t align) {
  static const unsigned char zero[64];
  buf_put(b, zero, (align - b->len % align) % align);
}

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, e8 = (x >> 23) & 0xff,
           mant = x & 0x7fffff;
  if (e8 == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  int32_t e = (int32_t)e8 - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) { /* subnormal half, round to nearest even */
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000;
    uint32_t shift = (uint32_t)(14 - e), h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = sign | (uint32_t)e << 10 | mant >> 13, rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* Independent reference decoders (not the model's) for the rounding. */
static float f16_to_f32_ref(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : ldexp(m + 1024, e - 25);
  return (float)((h & 0x8000) ? -v : v);
}
static float bf16_to_f32_ref(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* How to derive a model file from the real one. */
struct variant {
  uint32_t mat_type;     /* type written for 2-D tensors: F32, F16, BF16,
                            Q8_0, Q4_0 (rows not a multiple of 32: F16, as
                            llama.cpp's quantizer falls back) */
  uint32_t round_type;   /* F32 file whose values went through this type */
  const char *drop;      /* tensor left out */
  const char *quant;     /* tensor written as mxfp4 (zero blocks), a type
                            sinkd does not run */
  const char *transpose; /* tensor written with ne0 and ne1 swapped */
  const char *arch;      /* general.architecture (default llama) */
  uint32_t head_count;   /* override of llama.attention.head_count */
  float rope_factor;     /* llama.rope.scaling.factor, if nonzero */
  const char *rope_type; /* llama.rope.scaling.type, if set */
};

static void put_kv_u32(struct buf *b, const char *key, uint32_t v) {
  buf_str(b, key);
  buf_u32(b, SK_GGUF_UINT32);
  buf_u32(b, v);
}

static unsigned char *write_variant(const struct variant *vr, size_t *ret_len) {
  const struct sk_gguf *g = fx.g;
  const struct sk_model_config *c = fx.c;
  struct buf kvs = {0}, infos = {0}, data = {0};
  uint64_t n_kv = 0, n_t = 0;

  buf_str(&kvs, "general.architecture");
  buf_u32(&kvs, SK_GGUF_STRING);
  buf_str(&kvs, vr->arch ? vr->arch : "llama");
  buf_str(&kvs, "general.name");
  buf_u32(&kvs, SK_GGUF_STRING);
  buf_str(&kvs, "stories260K variant");
  n_kv += 2;
  put_kv_u32(&kvs, "llama.context_length", c->n_ctx_train);
  put_kv_u32(&kvs, "llama.embedding_length", c->dim);
  put_kv_u32(&kvs, "llama.feed_forward_length", c->hidden_dim);
  put_kv_u32(&kvs, "llama.attention.head_count",
             vr->head_count ? vr->head_count : c->n_head);
  put_kv_u32(&kvs, "llama.attention.head_count_kv", c->n_kv_head);
  put_kv_u32(&kvs, "llama.block_count", c->n_layer);
  put_kv_u32(&kvs, "llama.rope.dimension_count", c->rope_dim);
  n_kv += 7;
  buf_str(&kvs, "llama.attention.layer_norm_rms_epsilon");
  buf_u32(&kvs, SK_GGUF_FLOAT32);
  buf_put(&kvs, &c->rms_eps, 4);
  n_kv++;
  if (vr->rope_factor != 0.0f) {
    buf_str(&kvs, "llama.rope.scaling.factor");
    buf_u32(&kvs, SK_GGUF_FLOAT32);
    buf_put(&kvs, &vr->rope_factor, 4);
    n_kv++;
  }
  if (vr->rope_type) {
    buf_str(&kvs, "llama.rope.scaling.type");
    buf_u32(&kvs, SK_GGUF_STRING);
    buf_str(&kvs, vr->rope_type);
    n_kv++;
  }

  for (uint64_t i = 0; i < sk_gguf_n_tensors(g); i++) {
    const struct sk_gguf_tensor *t = sk_gguf_tensor(g, i);
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
    if (vr->drop && strcmp(name, vr->drop) == 0) continue;
    assert_int_equal(t->type, SK_GGML_F32);
    const float *src = t->data;
    uint64_t ne[2] = {t->ne[0], t->ne[1]};
    uint32_t type = t->n_dims == 2 ? vr->mat_type : SK_GGML_F32;
    if ((type == SK_GGML_Q8_0 || type == SK_GGML_Q4_0) && t->ne[0] % 32 != 0)
      type = SK_GGML_F16;
    if (vr->quant && strcmp(name, vr->quant) == 0) type = SK_GGML_MXFP4;
    if (vr->transpose && strcmp(name, vr->transpose) == 0) {
      ne[0] = t->ne[1];
      ne[1] = t->ne[0];
    }
    buf_pad(&data, 32);
    buf_str(&infos, name);
    buf_u32(&infos, t->n_dims);
    for (uint32_t d = 0; d < t->n_dims; d++) buf_u64(&infos, ne[d]);
    buf_u32(&infos, type);
    buf_u64(&infos, data.len);
    n_t++;
    if (type == SK_GGML_Q8_0 || type == SK_GGML_Q4_0) { /* real blocks */
      size_t rb = sk_quant_row_bytes(type, t->ne[0]);
      unsigned char *blk = malloc(rb);
      assert_non_null(blk);
      for (uint64_t r = 0; r < t->ne[1]; r++) {
        if (type == SK_GGML_Q8_0)
          sk_quantize_row_q8_0(src + r * t->ne[0], (uint32_t)t->ne[0], (void *)blk);
        else
          sk_quantize_row_q4_0(src + r * t->ne[0], (uint32_t)t->ne[0], (void *)blk);
        buf_put(&data, blk, rb);
      }
      free(blk);
      continue;
    }
    for (uint64_t j = 0; j < t->n_elements; j++) {
      float f = src[j];
      if (type == SK_GGML_MXFP4) { /* 17-byte blocks of 32: zeros will do */
        if (j % 32 == 0) {
          unsigned char blk[17] = {0};
          buf_put(&data, blk, sizeof blk);
        }
      } else if (type == SK_GGML_F16) {
        uint16_t h = f32_to_f16(f);
        buf_put(&data, &h, 2);
      } else if (type == SK_GGML_BF16) {
        uint16_t h = f32_to_bf16(f);
        buf_put(&data, &h, 2);
      } else {
        if (t->n_dims == 2 && vr->round_type == SK_GGML_F16)
          f = f16_to_f32_ref(f32_to_f16(f));
        else if (t->n_dims == 2 && vr->round_type == SK_GGML_BF16)
          f = bf16_to_f32_ref(f32_to_bf16(f));
        buf_put(&data, &f, 4);
      }
    }
  }

  struct buf out = {0};
  buf_u32(&out, 0x46554747u); /* "GGUF" */
  buf_u32(&out, 3);
  buf_u64(&out, n_t);
  buf_u64(&out, n_kv);
  buf_put(&out, kvs.p, kvs.len);
  buf_put(&out, infos.p, infos.len);
  buf_pad(&out, 32);
  buf_put(&out, data.p, data.len);
  free(kvs.p);
  free(infos.p);
  free(data.p);
  *ret_len = out.len;
  return out.p;
}

/* Writes the variant to a file in a fresh temp dir and loads it. Returns
 * the load result; on success *ret_g / *ret_m hold the model. */
static int load_variant(const struct variant *vr, struct sk_gguf **ret_g,
                        struct sk_model **ret_m, struct sk_error *err) {
  size_t len;
  unsigned char *bytes = write_variant(vr, &len);
  char *dir = sk_test_tmpdir();
  char path[4096];
  snprintf(path, sizeof path, "%s/model.gguf", dir);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
  free(bytes);
  struct sk_gguf *g = NULL;
  int rc = sk_gguf_open(path, &g, err);
  unlink(path);
  rmdir(dir);
  free(dir);
  if (rc < 0) fail_msg("sk_gguf_open of a written variant: %s", err->message);
  struct sk_model *m = NULL;
  rc = sk_model_load(g, &m, err);
  if (rc < 0) {
    sk_gguf_close(g);
    return rc;
  }
  *ret_g = g;
  *ret_m = m;
  return 0;
}

static float *prefill_scaled(const struct sk_model *m, const int32_t *ids,
                             size_t n, float rope_scale) {
  uint32_t V = sk_model_config(m)->n_vocab;
  struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = 64,
                           .rope_scale = rope_scale};
  struct sk_kv *kv = NULL;
  struct sk_error err = {0};
  if (sk_kv_new(sk_model_kv_shape(m), &p, &kv, &err) < 0)
    fail_msg("sk_kv_new: %s", err.message);
  struct sk_scratch *s = new_scratch(m, 64, 64);
  float *logits = malloc(n * V * sizeof *logits);
  assert_non_null(logits);
  forward_ok(m, s, kv, ids, (uint32_t)n, logits, true);
  sk_scratch_free(s);
  sk_kv_free(kv);
  return logits;
}

static float *prefill(const struct sk_model *m, const int32_t *ids, size_t n) {
  return prefill_scaled(m, ids, n, 1.0f);
}

/* Position interpolation: a model declaring linear scaling by 2 with a
 * plain cache computes exactly what the plain model computes over a cache
 * with rope_scale 2 (positions halved), and differs from no scaling. */
static void test_rope_scaling(void **state) {
  (void)state;
  const int32_t ids[12] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376,
                           326, 411};
  struct sk_error err = {0};
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct variant v = {.mat_type = SK_GGML_F32, .rope_factor = 2.0f,
                      .rope_type = "linear"};
  if (load_variant(&v, &g, &m, &err) < 0)
    fail_msg("scaled model: %s", err.message);
  assert_true(sk_model_config(m)->rope_scale == 0.5f);
  assert_true(fx.c->rope_scale == 1.0f);
  float *a = prefill(m, ids, 12);
  float *b = prefill_scaled(fx.m, ids, 12, 2.0f);
  float *plain = prefill(fx.m, ids, 12);
  assert_memory_equal(a, b, 12 * 512 * sizeof *a);
  /* position 0 is unrotated either way; later positions move */
  assert_memory_equal(a, plain, 512 * sizeof *a);
  double maxd = 0.0;
  for (size_t j = 512; j < 12 * 512; j++)
    maxd = fmax(maxd, fabs((double)a[j] - plain[j]));
  assert_true(maxd > 1e-2);
  free(a);
  free(b);
  free(plain);
  sk_model_free(m);
  sk_gguf_close(g);

  struct variant yarn = {.mat_type = SK_GGML_F32, .rope_factor = 4.0f,
                         .rope_type = "yarn"};
  struct sk_error err2 = {0};
  assert_int_equal(load_variant(&yarn, &g, &m, &err2), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err2.message, "\"yarn\" is not supported"));
}

/* F16 and BF16 weights: multiplied as exactly the floats an F32 file
 * with the same rounded values holds, so the logits are bit-identical;
 * and close to the F32 model's. */
static void test_half_weights(void **state) {
  (void)state;
  json_t *ref = sk_test_load_reference("prefill_logits.json");
  size_t n;
  int32_t *ids = sk_test_json_ids(json_object_get(ref, "prompt_ids"), &n);
  uint32_t V = fx.c->n_vocab;
  float *base = prefill(fx.m, ids, n);
  static const uint32_t types[] = {SK_GGML_F16, SK_GGML_BF16};
  for (size_t ti = 0; ti < 2; ti++) {
    struct sk_error err = {0};
    struct sk_gguf *gh = NULL, *gr = NULL;
    struct sk_model *mh = NULL, *mr = NULL;
    struct variant half = {.mat_type = types[ti]};
    struct variant rounded = {.mat_type = SK_GGML_F32,
                              .round_type = types[ti]};
    if (load_variant(&half, &gh, &mh, &err) < 0)
      fail_msg("load %s model: %s", sk_ggml_type_name(types[ti]),
               err.message);
    if (load_variant(&rounded, &gr, &mr, &err) < 0)
      fail_msg("load rounded model: %s", err.message);
    assert_memory_equal(sk_model_config(mh), sk_model_config(mr),
                        sizeof(struct sk_model_config));
    assert_int_equal(sk_model_config(mh)->n_vocab, V);
    float *lh = prefill(mh, ids, n), *lr = prefill(mr, ids, n);
    assert_memory_equal(lh, lr, n * V * sizeof *lh);
    double maxd = 0.0;
    for (size_t j = 0; j < n * V; j++) {
      double d = fabs((double)lh[j] - base[j]);
      if (d > maxd) maxd = d;
    }
    /* weight rounding moves logits, but only a little */
    double tol = types[ti] == SK_GGML_F16 ? 0.05 : 0.5;
    printf("%s weights: max abs logit diff vs f32 %.3g\n",
           sk_ggml_type_name(types[ti]), maxd);
    assert_true(maxd > 0.0 && maxd < tol);
    free(lh);
    free(lr);
    sk_model_free(mh);
    sk_model_free(mr);
    sk_gguf_close(gh);
    sk_gguf_close(gr);
  }
  free(base);
  free(ids);
  json_decref(ref);
}

static void expect_bad_model(const struct variant *vr, const char *needle1,
                             const char *needle2) {
  struct sk_error err = {0};
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  int rc = load_variant(vr, &g, &m, &err);
  if (rc == 0) fail_msg("model variant loaded; expected \"%s\"", needle1);
  assert_int_equal(rc, -SK_ERR_BAD_MODEL);
  assert_int_equal(err.code, SK_ERR_BAD_MODEL);
  if (!strstr(err.message, needle1) ||
      (needle2 && !strstr(err.message, needle2)))
    fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", err.message, needle1,
             needle2 ? needle2 : "");
}

static void test_bad_models(void **state) {
  (void)state;
  expect_bad_model(&(struct variant){.mat_type = SK_GGML_F32,
                                     .quant = "blk.0.attn_q.weight"},
                   "tensor blk.0.attn_q.weight has type mxfp4; sinkd runs f32, f16, bf16, "
                   "q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs",
                   NULL);
  expect_bad_model(&(struct variant){.mat_type = SK_GGML_F32,
                                     .drop = "blk.2.ffn_up.weight"},
                   "tensor blk.2.ffn_up.weight is missing", NULL);
  expect_bad_model(&(struct variant){.mat_type = SK_GGML_F32,
                                     .transpose = "blk.1.attn_k.weight"},
                   "blk.1.attn_k.weight has shape [32, 64", "expected [64, 32]");
  expect_bad_model(&(struct variant){.mat_type = SK_GGML_F32, .arch = "gpt2"},
                   "general.architecture", "gpt2");
  expect_bad_model(&(struct variant){.mat_type = SK_GGML_F32,
                                     .head_count = 7},
                   "not a multiple", NULL);
  expect_bad_model(&(struct variant){.mat_type = SK_GGML_F32,
                                     .head_count = 2},
                   "llama.attention.head_count_kv is 4", "1..2");

  /* No output.weight: the head is tied to token_embd and still runs. */
  struct sk_error err = {0};
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct variant tied = {.mat_type = SK_GGML_F32, .drop = "output.weight"};
  if (load_variant(&tied, &g, &m, &err) < 0)
    fail_msg("tied model: %s", err.message);
  const int32_t ids[3] = {1, 403, 407};
  float *l = prefill(m, ids, 3);
  for (size_t j = 0; j < 3 * 512; j++) assert_true(isfinite(l[j]));
  free(l);
  sk_model_free(m);
  sk_gguf_close(g);
}

/* ---- batching ---------------------------------------------------------- */

/* Greedy decode of 16 sessions, each alone (one forward call per token)
 * and all together (one batched call per step, on a pool of 2 threads,
 * prompts of different lengths so that prefill chunks and decode rows
 * share passes; half the caches f16, half f32, as a daemon holds after
 * adopting sessions of the other kv_type): the same logits, bit for bit,
 * hence the same tokens. */
static void batch_invariance(const struct sk_model *m) {
  enum { NS = 16, STEPS = 40 };
  const uint32_t V = fx.c->n_vocab;
  struct sk_error err = {0};
  struct sk_pool *pool = NULL;
  assert_int_equal(sk_pool_new(2, &pool, &err), 0);
  struct sk_scratch *alone = new_scratch(m, 64, 256);
  struct sk_scratch *batch = NULL;
  assert_int_equal(sk_scratch_new_pool(m, 64, 256, pool, &batch, &err), 0);
  struct sk_kv *ka[NS], *kb[NS];
  int32_t prompt[NS][24], ta[NS][STEPS], tb[NS][STEPS];
  uint32_t plen[NS];
  float *la = malloc((size_t)NS * V * sizeof *la), *lb = malloc((size_t)NS * V * sizeof *lb);
  assert_non_null(la);
  assert_non_null(lb);
  for (int i = 0; i < NS; i++) {
    /* half streaming with a window that fills and evicts during the run */
    const uint32_t type = i % 4 < 2 ? SK_KV_F32 : SK_KV_F16;
    ka[i] = i % 2 ? new_cache_t(m, SK_POLICY_STREAMING, 4, 24, 0, type)
                  : new_cache_t(m, SK_POLICY_DENSE, 0, 0, 128, type);
    kb[i] = i % 2 ? new_cache_t(m, SK_POLICY_STREAMING, 4, 24, 0, type)
                  : new_cache_t(m, SK_POLICY_DENSE, 0, 0, 128, type);
    assert_int_equal(kb[i]->hdr->kv_type, type);
    plen[i] = 1 + (uint32_t)(i * 5) % 23;
    prompt[i][0] = 1;
    for (uint32_t j = 1; j < plen[i]; j++) prompt[i][j] = (int32_t)(3 + (i * 37 + j * 11) % 500);
  }
  /* alone */
  for (int i = 0; i < NS; i++) {
    float *l = la + (size_t)i * V;
    forward_ok(m, alone, ka[i], prompt[i], plen[i], l, false);
    for (int t = 0; t < STEPS; t++) {
      ta[i][t] = argmax(l, V);
      assert_int_equal(sk_kv_make_room(ka[i], 1, NULL, &err), 0);
      forward_ok(m, alone, ka[i], &ta[i][t], 1, l, false);
    }
  }
  /* together: step k runs every session's next piece of work */
  uint32_t done[NS] = {0}; /* prompt tokens in */
  int gen[NS] = {0};
  for (int step = 0;; step++) {
    struct sk_seq seqs[NS];
    int32_t tok[NS];
    uint32_t n = 0, rows = 0;
    for (int i = 0; i < NS; i++) {
      if (done[i] < plen[i]) { /* prefill chunks of up to 3 */
        uint32_t c = plen[i] - done[i] < 3 ? plen[i] - done[i] : 3;
        seqs[n++] = (struct sk_seq){.kv = kb[i], .tokens = prompt[i] + done[i], .n = c,
                                    .logits = lb + (size_t)i * V};
        rows += c;
      } else if (gen[i] < STEPS) {
        tok[i] = tb[i][gen[i]] = argmax(lb + (size_t)i * V, V);
        assert_int_equal(sk_kv_make_room(kb[i], 1, NULL, &err), 0);
        seqs[n++] = (struct sk_seq){.kv = kb[i], .tokens = &tok[i], .n = 1,
                                    .logits = lb + (size_t)i * V};
        rows++;
      }
    }
    if (n == 0) break;
    assert_true(rows <= 64);
    if (sk_model_forward_batch(m, batch, seqs, n, &err) < 0)
      fail_msg("batch step %d: %s", step, err.message);
    for (int i = 0; i < NS; i++) {
      if (done[i] < plen[i]) done[i] += plen[i] - done[i] < 3 ? plen[i] - done[i] : 3;
      else if (gen[i] < STEPS) gen[i]++;
    }
  }
  for (int i = 0; i < NS; i++) {
    assert_memory_equal(ta[i], tb[i], sizeof ta[i]);
    assert_memory_equal(la + (size_t)i * V, lb + (size_t)i * V, V * sizeof *la);
    assert_int_equal(ka[i]->hdr->n_seen, kb[i]->hdr->n_seen);
    sk_kv_free(ka[i]);
    sk_kv_free(kb[i]);
  }
  free(la);
  free(lb);
  sk_scratch_free(alone);
  sk_scratch_free(batch);
  sk_pool_free(pool);
}

static void test_batch_invariance(void **state) {
  (void)state;
  batch_invariance(fx.m);
}

/* The same with Q8_0 weights: batched rows take the int8 products of 16
 * rows at a time (amx, avx512-vnni) and quantize their activations on
 * the pool, one row alone takes the one-row products. */
static void test_batch_invariance_q8_0(void **state) {
  (void)state;
  struct sk_error err = {0};
  struct sk_gguf *gq = NULL;
  struct sk_model *mq = NULL;
  struct variant vq = {.mat_type = SK_GGML_Q8_0};
  if (load_variant(&vq, &gq, &mq, &err) < 0) fail_msg("load q8_0 model: %s", err.message);
  assert_string_equal(sk_model_weight_type(mq), "q8_0");
  batch_invariance(mq);
  sk_model_free(mq);
  sk_gguf_close(gq);
}

/* A batch with an error anywhere commits nothing anywhere. */
static void test_batch_errors(void **state) {
  (void)state;
  struct sk_kv *a = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 8);
  struct sk_kv *b = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 8);
  struct sk_scratch *s = new_scratch(fx.m, 8, 8);
  const int32_t ok[3] = {1, 403, 407}, bad[2] = {1, 9999};
  struct sk_seq seqs[2] = {{.kv = a, .tokens = ok, .n = 3}, {.kv = b, .tokens = bad, .n = 2}};
  struct sk_error err = {0};
  assert_int_equal(sk_model_forward_batch(fx.m, s, seqs, 2, &err), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "sequence 1: token 1 of the batch is id 9999"));
  assert_int_equal(a->hdr->n_resident, 0);
  seqs[1].tokens = ok;
  seqs[1].n = 3;
  struct sk_seq three[3] = {seqs[0], seqs[1], {.kv = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 8),
                                               .tokens = ok, .n = 3}};
  assert_int_equal(sk_model_forward_batch(fx.m, s, three, 3, &err), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "batch of 9 tokens exceeds the maximum batch 8"));
  assert_int_equal(b->hdr->n_resident, 0);
  assert_int_equal(sk_model_forward_batch(fx.m, s, seqs, 2, &err), 0);
  assert_int_equal(a->hdr->n_resident, 3);
  assert_int_equal(b->hdr->n_resident, 3);
  /* n_evicted is only for a streaming chunk that made room */
  seqs[0].n_evicted = 1;
  assert_int_equal(sk_model_forward_batch(fx.m, s, seqs, 1, &err), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "n_evicted 1"));
  sk_kv_free(three[2].kv);
  sk_kv_free(a);
  sk_kv_free(b);
  sk_scratch_free(s);
}

/* A streaming chunk that evicts inside itself (sk_seq.n_evicted) computes
 * exactly what token-by-token streaming computes: same logits for every
 * token, same cache afterwards. 300 tokens through 4 sinks + 40. The
 * chunks run on a pool of `threads` threads (2: attention tasks of one KV
 * head each, whose chunk rows walk the cache together). */
static void streaming_chunks_exact(uint32_t policy, uint32_t kv_type, uint32_t threads) {
  enum { N = 300 };
  const uint32_t V = fx.c->n_vocab;
  int32_t ids[N];
  ids[0] = 1;
  for (int i = 1; i < N; i++) ids[i] = (int32_t)(3 + (i * 7919) % 500);
  const uint32_t n_sink = policy == SK_POLICY_STREAMING ? 4 : 0;
  struct sk_kv *one = new_cache_t(fx.m, policy, n_sink, 44 - n_sink, 0, kv_type);
  struct sk_kv *chk = new_cache_t(fx.m, policy, n_sink, 44 - n_sink, 0, kv_type);
  struct sk_scratch *s = new_scratch(fx.m, 64, 64), *sc = s;
  float *l1 = malloc((size_t)N * V * sizeof *l1), *l2 = malloc((size_t)N * V * sizeof *l2);
  assert_non_null(l1);
  assert_non_null(l2);
  struct sk_error err = {0};
  struct sk_pool *pool = NULL;
  if (threads > 1) {
    assert_int_equal(sk_pool_new(threads, &pool, &err), 0);
    assert_int_equal(sk_scratch_new_pool(fx.m, 64, 64, pool, &sc, &err), 0);
  }
  struct sk_evict_log log1, log2;
  sk_evict_log_reset(&log1);
  sk_evict_log_reset(&log2);
  for (int i = 0; i < N; i++) {
    assert_int_equal(sk_kv_make_room(one, 1, &log1, &err), 0);
    forward_ok(fx.m, s, one, &ids[i], 1, l1 + (size_t)i * V, false);
  }
  static const uint32_t chunks[] = {3, 37, 1, 40, 13, 29, 40, 2, 38, 40, 40, 17};
  uint32_t at = 0;
  for (size_t c = 0; at < N; c++) {
    uint32_t n = chunks[c % (sizeof chunks / sizeof chunks[0])];
    if (n > N - at) n = N - at;
    uint64_t before = chk->hdr->n_evicted;
    assert_int_equal(sk_kv_make_room(chk, n, &log2, &err), 0);
    struct sk_seq q = {.kv = chk, .tokens = ids + at, .n = n,
                       .n_evicted = (uint32_t)(chk->hdr->n_evicted - before),
                       .logits = l2 + (size_t)at * V, .all_logits = true};
    if (sk_model_forward_batch(fx.m, sc, &q, 1, &err) < 0)
      fail_msg("chunk at %u: %s", at, err.message);
    at += n;
  }
  for (int i = 0; i < N; i++)
    if (memcmp(l1 + (size_t)i * V, l2 + (size_t)i * V, V * sizeof *l1) != 0)
      fail_msg("token %d: chunked logits differ from token-by-token", i);
  assert_int_equal(one->hdr->n_resident, chk->hdr->n_resident);
  assert_int_equal(one->hdr->n_evicted, chk->hdr->n_evicted);
  assert_int_equal(log1.n_evicted, log2.n_evicted);
  const size_t row = sk_kv_row_bytes(one);
  for (uint32_t l = 0; l < fx.c->n_layer; l++)
    for (uint32_t p = 0; p < one->hdr->n_resident; p++) {
      assert_int_equal(one->token[sk_kv_slot(one, p)], chk->token[sk_kv_slot(chk, p)]);
      assert_memory_equal(sk_kv_krow(one, l, sk_kv_slot(one, p)),
                          sk_kv_krow(chk, l, sk_kv_slot(chk, p)), row);
      assert_memory_equal(sk_kv_vrow(one, l, sk_kv_slot(one, p)),
                          sk_kv_vrow(chk, l, sk_kv_slot(chk, p)), row);
    }
  free(l1);
  free(l2);
  if (sc != s) sk_scratch_free(sc);
  sk_scratch_free(s);
  sk_pool_free(pool);
  sk_kv_free(one);
  sk_kv_free(chk);
}

static void test_streaming_chunks_exact(void **state) {
  (void)state;
  streaming_chunks_exact(SK_POLICY_STREAMING, SK_KV_F32, 1);
  streaming_chunks_exact(SK_POLICY_STREAMING, SK_KV_F16, 1);
  streaming_chunks_exact(SK_POLICY_WINDOW, SK_KV_F32, 1);
  streaming_chunks_exact(SK_POLICY_STREAMING, SK_KV_F16, 2);
  streaming_chunks_exact(SK_POLICY_WINDOW, SK_KV_F32, 2);
}

/* An f16 KV cache (kv_type f16, llama.cpp's default cache type) against
 * the f32 one on the same model: layer-0 keys and values, which depend on
 * the tokens alone, are exactly the f32 ones rounded to binary16; then
 * 256 greedy steps fed the f32 cache's tokens (max |logit difference|,
 * top-1 agreement) and free-running greedy decoding, dense, and
 * streaming 4 + 60 and h2o 24 + 40 (evicting; h2o's keys are stored
 * unrotated). */
static void test_f16_cache_vs_f32(void **state) {
  (void)state;
  enum { STEPS = 256 };
  json_t *ref = sk_test_load_reference("greedy.json");
  size_t n_prompt;
  int32_t *prompt = sk_test_json_ids(
      json_object_get(json_array_get(json_object_get(ref, "prompts"), 0), "prompt_ids"), &n_prompt);
  const uint32_t V = fx.c->n_vocab, D = fx.c->kv_dim;
  struct sk_scratch *s = new_scratch(fx.m, 64, 512);
  float *lf = malloc(V * sizeof *lf), *lh = malloc(V * sizeof *lh);
  assert_non_null(lf);
  assert_non_null(lh);
  static const struct sk_kv_params ps[] = {
      {.policy = SK_POLICY_DENSE, .capacity = 512, .rope_scale = 1.0f},
      {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 60, .rope_scale = 1.0f},
      {.policy = SK_POLICY_H2O, .heavy = 24, .recent = 40, .rope_scale = 1.0f},
  };
  for (int pi = 0; pi < 3; pi++) {
    const bool streaming = pi > 0; /* evicting */
    struct sk_kv *kf = NULL, *kh = NULL;
    struct sk_error kerr = {0};
    struct sk_kv_shape shape = sk_model_kv_shape(fx.m);
    assert_int_equal(sk_kv_new(shape, &ps[pi], &kf, &kerr), 0);
    shape.kv_type = SK_KV_F16;
    assert_int_equal(sk_kv_new(shape, &ps[pi], &kh, &kerr), 0);
    assert_int_equal(kh->hdr->kv_type, SK_KV_F16);
    assert_int_equal(sk_kv_row_bytes(kh) * 2, sk_kv_row_bytes(kf));
    forward_ok(fx.m, s, kf, prompt, (uint32_t)n_prompt, lf, false);
    forward_ok(fx.m, s, kh, prompt, (uint32_t)n_prompt, lh, false);
    for (uint32_t p = 0; p < kf->hdr->n_resident; p++) {
      const float *k = sk_kv_krow(kf, 0, sk_kv_slot(kf, p)), *v = sk_kv_vrow(kf, 0, sk_kv_slot(kf, p));
      const uint16_t *k16 = sk_kv_krow(kh, 0, sk_kv_slot(kh, p));
      const uint16_t *v16 = sk_kv_vrow(kh, 0, sk_kv_slot(kh, p));
      for (uint32_t d = 0; d < D; d++) {
        assert_int_equal(k16[d], sk_f32_to_f16(k[d]));
        assert_int_equal(v16[d], sk_f32_to_f16(v[d]));
      }
    }
    double maxd = 0.0;
    int agree = 0;
    for (int t = 0; t < STEPS; t++) {
      for (uint32_t j = 0; j < V; j++) maxd = fmax(maxd, fabs((double)lf[j] - lh[j]));
      int32_t next = argmax(lf, V);
      agree += argmax(lh, V) == next;
      if (streaming) {
        struct sk_error err = {0};
        assert_int_equal(sk_kv_make_room(kf, 1, NULL, &err), 0);
        assert_int_equal(sk_kv_make_room(kh, 1, NULL, &err), 0);
      }
      forward_ok(fx.m, s, kf, &next, 1, lf, false);
      forward_ok(fx.m, s, kh, &next, 1, lh, false);
    }
    if (streaming) assert_int_equal(kh->hdr->n_evicted, kf->hdr->n_evicted);
    if (streaming) assert_true(kh->hdr->n_evicted > 100);
    sk_kv_clear(kf);
    sk_kv_clear(kh);
    forward_ok(fx.m, s, kf, prompt, (uint32_t)n_prompt, lf, false);
    forward_ok(fx.m, s, kh, prompt, (uint32_t)n_prompt, lh, false);
    int same = 0;
    for (int t = 0; t < STEPS && !streaming; t++) {
      int32_t a = argmax(lf, V), b = argmax(lh, V);
      if (a != b) break;
      same++;
      forward_ok(fx.m, s, kf, &a, 1, lf, false);
      forward_ok(fx.m, s, kh, &b, 1, lh, false);
    }
    printf("f16 KV cache vs f32 (%s) over %d greedy steps: max abs logit diff %.4f, top-1 "
           "agreement %d/%d (%.1f%%)",
           pi == 0 ? "dense" : pi == 1 ? "streaming 4+60" : "h2o 24+40", STEPS, maxd, agree, STEPS,
           100.0 * agree / STEPS);
    if (!streaming) printf(", free-running greedy identical for %d tokens", same);
    printf("\n");
    assert_true(maxd > 0.0 && maxd < 0.1);
    assert_true((double)agree / STEPS >= 0.97);
    sk_kv_free(kf);
    sk_kv_free(kh);
  }
  free(lf);
  free(lh);
  sk_scratch_free(s);
  free(prompt);
  json_decref(ref);
}

/* ---- quantized weights --------------------------------------------------- */

/* Q8_0 and Q4_0 copies of the test model (ffn_down, whose rows of 172 are
 * not a multiple of 32, stays F16 as llama.cpp's quantizer leaves it)
 * against the F32 model: 256 greedy steps from a reference prompt with
 * every model fed the F32 model's tokens: max |logit difference| and how
 * often the top token agrees; and how long free-running greedy decoding
 * stays identical. */
static void quant_vs_f32(uint32_t type, double max_diff_bound, double agree_bound) {
  enum { STEPS = 256 };
  json_t *ref = sk_test_load_reference("greedy.json");
  size_t n_prompt;
  int32_t *prompt = sk_test_json_ids(
      json_object_get(json_array_get(json_object_get(ref, "prompts"), 0), "prompt_ids"), &n_prompt);
  struct sk_error err = {0};
  struct sk_gguf *gq = NULL;
  struct sk_model *mq = NULL;
  struct variant vq = {.mat_type = type};
  if (load_variant(&vq, &gq, &mq, &err) < 0)
    fail_msg("load %s model: %s", sk_ggml_type_name(type), err.message);
  assert_string_equal(sk_model_weight_type(mq), sk_ggml_type_name(type));
  const uint32_t V = fx.c->n_vocab;
  struct sk_scratch *sf = new_scratch(fx.m, 64, 512), *sq = new_scratch(mq, 64, 512);
  struct sk_kv *kf = new_cache(fx.m, SK_POLICY_DENSE, 0, 0, 512);
  struct sk_kv *kq = new_cache(mq, SK_POLICY_DENSE, 0, 0, 512);
  float *lf = malloc(V * sizeof *lf), *lq = malloc(V * sizeof *lq);
  assert_non_null(lf);
  assert_non_null(lq);
  forward_ok(fx.m, sf, kf, prompt, (uint32_t)n_prompt, lf, false);
  forward_ok(mq, sq, kq, prompt, (uint32_t)n_prompt, lq, false);
  double maxd = 0.0;
  int agree = 0;
  for (int t = 0; t < STEPS; t++) {
    for (uint32_t j = 0; j < V; j++) maxd = fmax(maxd, fabs((double)lf[j] - lq[j]));
    int32_t next = argmax(lf, V);
    agree += argmax(lq, V) == next;
    forward_ok(fx.m, sf, kf, &next, 1, lf, false);
    forward_ok(mq, sq, kq, &next, 1, lq, false);
  }
  /* free-running: both decode their own greedy tokens */
  sk_kv_clear(kf);
  sk_kv_clear(kq);
  forward_ok(fx.m, sf, kf, prompt, (uint32_t)n_prompt, lf, false);
  forward_ok(mq, sq, kq, prompt, (uint32_t)n_prompt, lq, false);
  int same = 0;
  for (int t = 0; t < STEPS; t++) {
    int32_t a = argmax(lf, V), b = argmax(lq, V);
    if (a != b) break;
    same++;
    forward_ok(fx.m, sf, kf, &a, 1, lf, false);
    forward_ok(mq, sq, kq, &b, 1, lq, false);
  }
  printf("%s weights (%s kernels) vs f32 over %d greedy steps: max abs logit diff %.4f, top-1 "
         "agreement %d/%d (%.1f%%), free-running greedy identical for %d tokens\n",
         sk_ggml_type_name(type), sk_kernels_name(), STEPS, maxd, agree, STEPS,
         100.0 * agree / STEPS, same);
  assert_true(maxd > 0.0 && maxd < max_diff_bound);
  assert_true((double)agree / STEPS >= agree_bound);
  free(lf);
  free(lq);
  sk_kv_free(kf);
  sk_kv_free(kq);
  sk_scratch_free(sf);
  sk_scratch_free(sq);
  sk_model_free(mq);
  sk_gguf_close(gq);
  free(prompt);
  json_decref(ref);
}

static void test_q8_0_vs_f32(void **state) {
  (void)state;
  quant_vs_f32(SK_GGML_Q8_0, 0.5, 0.95);
}

static void test_q4_0_vs_f32(void **state) {
  (void)state;
  quant_vs_f32(SK_GGML_Q4_0, 15.0, 0.75);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_prefill_logits),
      cmocka_unit_test(test_greedy_dense),
      cmocka_unit_test(test_greedy_streaming),
      cmocka_unit_test(test_logprobs),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_half_weights),
      cmocka_unit_test(test_bad_models),
      cmocka_unit_test(test_rope_scaling),
      cmocka_unit_test(test_batch_invariance),
      cmocka_unit_test(test_batch_invariance_q8_0),
      cmocka_unit_test(test_batch_errors),
      cmocka_unit_test(test_streaming_chunks_exact),
      cmocka_unit_test(test_f16_cache_vs_f32),
      cmocka_unit_test(test_q8_0_vs_f32),
      cmocka_unit_test(test_q4_0_vs_f32),
  };
  /* A variant this CPU cannot run (meson runs the suite on avx512-vnni
   * wherever it is built) is a skip, not a failure; unknown names fail
   * in setup. */
  const char *kernel = getenv("SK_KERNEL");
  static const char *const known[] = {"generic", "avx2", "avx2-vnni", "avx512-vnni"};
  for (size_t i = 0; kernel && i < sizeof known / sizeof known[0]; i++)
    if (strcmp(kernel, known[i]) == 0 && !sk_kernels_supported(kernel)) {
      printf("kernel %s does not run on this CPU (it runs: %s): skipped\n", kernel,
             sk_kernels_available());
      return 77;
    }
  return cmocka_run_group_tests(tests, setup, teardown);
}
