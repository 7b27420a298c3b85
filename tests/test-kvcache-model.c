/* The KV cache with the real model: evictions keep each resident token's
 * keys (RoPE at its stream index), a long streaming session stays at its
 * budget, far streams and H2O give the tokens of the reference. */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "session/kvcache.h"
#include "model/model.h"
#include "testutil.h"
#include "testkv.h"

struct model_fx {
  struct sk_gguf *g;
  struct sk_model *m;
};

static void load_model(struct model_fx *f) {
  struct sk_error err = {0};
  if (sk_gguf_open(sk_test_model_path(), &f->g, &err) < 0)
    fail_msg("open model: %s", err.message);
  if (sk_model_load(f->g, &f->m, &err) < 0)
    fail_msg("load model: %s", err.message);
}

static const float *tensor_f32(const struct sk_gguf *g, const char *name) {
  const struct sk_gguf_tensor *t = sk_gguf_find_tensor(g, name);
  assert_non_null(t);
  assert_int_equal(t->type, SK_GGML_F32);
  return t->data;
}

/* Layer-0 key of a token from scratch, in double: keys are stored before
 * RoPE, so it is W_k * rmsnorm(embedding(token)), whatever came before. */
static void layer0_key(const struct model_fx *f, int32_t tok, double *key) {
  const struct sk_model_config *c = sk_model_config(f->m);
  const float *emb = tensor_f32(f->g, "token_embd.weight") +
                     (size_t)tok * c->dim;
  const float *norm = tensor_f32(f->g, "blk.0.attn_norm.weight");
  const float *wk = tensor_f32(f->g, "blk.0.attn_k.weight");
  double ss = 0.0, x[256];
  assert_true(c->dim <= 256);
  for (uint32_t i = 0; i < c->dim; i++) ss += (double)emb[i] * emb[i];
  double sc = 1.0 / sqrt(ss / c->dim + c->rms_eps);
  for (uint32_t i = 0; i < c->dim; i++) x[i] = emb[i] * sc * norm[i];
  for (uint32_t o = 0; o < c->kv_dim; o++) {
    double a = 0.0;
    for (uint32_t i = 0; i < c->dim; i++)
      a += (double)wk[(size_t)o * c->dim + i] * x[i];
    key[o] = a;
  }
}

/* RoPE NORM at position p (may be negative: rotates back), in double. */
static void rope_double(const struct sk_model_config *c, double *k,
                        double p) {
  for (uint32_t h = 0; h < c->n_kv_head; h++)
    for (uint32_t i = 0; i < c->rope_dim / 2; i++) {
      double th = p * pow(c->rope_base, -2.0 * i / c->rope_dim);
      double *x = k + h * c->head_dim + 2 * i, x0 = x[0], x1 = x[1];
      x[0] = x0 * cos(th) - x1 * sin(th);
      x[1] = x0 * sin(th) + x1 * cos(th);
    }
}

static int32_t argmax(const float *l, uint32_t n) {
  uint32_t b = 0;
  for (uint32_t i = 1; i < n; i++)
    if (l[i] > l[b]) b = i;
  return (int32_t)b;
}

static void forward_ok(const struct model_fx *f, struct sk_scratch *s,
                       struct sk_kv *kv, const int32_t *tok, uint32_t n,
                       float *logits, struct sk_evict_log *log) {
  struct sk_error err = {0};
  if (sk_kv_make_room(kv, n, log, &err) < 0)
    fail_msg("make_room: %s", err.message);
  if (sk_model_forward(f->m, s, kv, tok, n, logits, false, &err) < 0)
    fail_msg("forward: %s", err.message);
}

static void test_model_keys_after_evictions(void **state) {
  (void)state;
  struct model_fx f;
  load_model(&f);
  const struct sk_model_config *c = sk_model_config(f.m);
  json_t *ref = sk_test_load_reference("logprobs.json");
  size_t n_ids;
  int32_t *ids = sk_test_json_ids(
      json_object_get(json_array_get(json_object_get(ref, "texts"), 1),
                      "token_ids"),
      &n_ids);
  struct sk_kv *kv =
      new_kv(sk_model_kv_shape(f.m), SK_POLICY_STREAMING, 4, 12, 0);
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(f.m, 12, 16, &s, &err), 0);
  float logits[512];
  /* 100 tokens in steps of 1..12 */
  uint32_t done = 0, step = 0;
  static const uint32_t sizes[] = {5, 1, 12, 3, 7, 1, 1, 9, 12, 2};
  while (done < 100) {
    uint32_t n = sizes[step++ % 10];
    if (n > 100 - done) n = 100 - done;
    forward_ok(&f, s, kv, ids + done, n, logits, NULL);
    done += n;
  }
  assert_int_equal(kv->hdr->n_resident, 16);
  assert_int_equal(kv->hdr->n_evicted, 84);
  double maxd = 0.0;
  for (uint32_t p = 0; p < 16; p++) {
    uint32_t slot = sk_kv_slot(kv, p);
    uint64_t index = kv->index[slot];
    assert_int_equal(index, p < 4 ? p : 84 + p);
    assert_int_equal(kv->token[slot], ids[index]);
    /* stored rotated at its stream index (kvcache.h) */
    double want[256];
    layer0_key(&f, kv->token[slot], want);
    rope_double(c, want, (double)index);
    const float *k = sk_kv_k(kv, 0, slot);
    for (uint32_t d = 0; d < c->kv_dim; d++)
      if (fabs(k[d] - want[d]) > maxd) maxd = fabs(k[d] - want[d]);
  }
  printf("layer-0 keys after evictions: max abs diff %.3g\n", maxd);
  assert_true(maxd < 1e-4);

  /* The next step depends only on what the cache holds and where: a dense
   * cache holding the same rows in the same positions (keys rotated from
   * their stream index to their position there, which is also their
   * stream index in the dense cache) gives the same logits, although it
   * never saw the 85 evicted tokens. */
  assert_int_equal(sk_kv_make_room(kv, 1, NULL, &err), 0); /* evicts one */
  assert_int_equal(kv->hdr->n_resident, 15);
  struct sk_kv *dense = new_kv(sk_model_kv_shape(f.m), SK_POLICY_DENSE, 0, 0,
                               16);
  for (uint32_t p = 0; p < 15; p++) {
    uint32_t from = sk_kv_slot(kv, p), to = sk_kv_slot(dense, p);
    for (uint32_t l = 0; l < c->n_layer; l++) {
      double key[256];
      const float *k = sk_kv_k(kv, l, from);
      for (uint32_t d = 0; d < c->kv_dim; d++) key[d] = k[d];
      rope_double(c, key, (double)p - (double)kv->index[from]);
      for (uint32_t d = 0; d < c->kv_dim; d++) sk_kv_k(dense, l, to)[d] = (float)key[d];
      memcpy(sk_kv_v(dense, l, to), sk_kv_v(kv, l, from),
             c->kv_dim * sizeof(float));
    }
    sk_kv_commit(dense, &kv->token[from], 1);
  }
  float l_stream[512], l_dense[512];
  int32_t next = ids[100];
  forward_ok(&f, s, kv, &next, 1, l_stream, NULL);
  forward_ok(&f, s, dense, &next, 1, l_dense, NULL);
  double maxl = 0.0;
  for (uint32_t i = 0; i < 512; i++) maxl = fmax(maxl, fabs((double)l_stream[i] - l_dense[i]));
  printf("next step, streaming cache vs dense cache holding its rows: max abs "
         "logit diff %.3g\n", maxl);
  assert_true(maxl < 1e-4);
  assert_int_equal(argmax(l_stream, 512), argmax(l_dense, 512));

  sk_kv_free(dense);
  sk_scratch_free(s);
  sk_kv_free(kv);
  free(ids);
  json_decref(ref);
  sk_model_free(f.m);
  sk_gguf_close(f.g);
}

/* Keys are stored rotated at their stream index (kvcache.h), so a
 * session far into its stream must compute what a fresh one computes:
 * the same tokens through the same policy give the same logits whether
 * the stream starts at index 0 or at 10^7 or 2^40 (n_seen set before the
 * first token, as after a long life). With angles in float (ggml's
 * formula) the window's keys would drift by ~1e-7 * index radians. */
static void test_model_far_stream(void **state) {
  (void)state;
  struct model_fx f;
  load_model(&f);
  const uint32_t V = sk_model_config(f.m)->n_vocab;
  json_t *ref = sk_test_load_reference("logprobs.json");
  size_t n_ids;
  int32_t *ids = sk_test_json_ids(
      json_object_get(json_array_get(json_object_get(ref, "texts"), 0),
                      "token_ids"),
      &n_ids);
  assert_true(n_ids >= 80);
  static const struct sk_kv_params ps[] = {
      {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 12, .rope_scale = 1.0f},
      {.policy = SK_POLICY_WINDOW, .window = 16, .rope_scale = 1.0f},
      {.policy = SK_POLICY_DENSE, .capacity = 80, .rope_scale = 1.0f},
      {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 28, .rope_scale = 2.0f},
  };
  static const uint64_t starts[] = {10000000u, (uint64_t)1 << 40};
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(f.m, 12, 80, &s, &err), 0);
  static const uint32_t sizes[] = {5, 1, 12, 3, 7, 1, 1, 9, 12, 2};
  double maxd = 0.0;
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
    float *want = malloc((size_t)80 * V * sizeof *want);
    assert_non_null(want);
    for (size_t si = 0; si <= sizeof starts / sizeof starts[0]; si++) {
      struct sk_kv *kv = NULL;
      assert_int_equal(sk_kv_new(sk_model_kv_shape(f.m), &ps[pi], &kv, &err), 0);
      if (si) kv->hdr->n_seen = starts[si - 1];
      uint32_t done = 0, step = 0;
      float logits[512];
      while (done < 80) {
        uint32_t n = sizes[step++ % 10];
        if (n > 80 - done) n = 80 - done;
        if (n > sk_kv_max_room(kv)) n = sk_kv_max_room(kv);
        forward_ok(&f, s, kv, ids + done, n, logits, NULL);
        done += n;
        if (si == 0) {
          memcpy(want + (size_t)done * V - V, logits, V * sizeof *logits);
          continue;
        }
        for (uint32_t j = 0; j < V; j++)
          maxd = fmax(maxd, fabs((double)logits[j] - want[(size_t)(done - 1) * V + j]));
        assert_int_equal(argmax(logits, V), argmax(want + (size_t)(done - 1) * V, V));
      }
      if (ps[pi].policy != SK_POLICY_DENSE) assert_true(kv->hdr->n_evicted > 40);
      assert_int_equal(kv->hdr->n_seen, (si ? starts[si - 1] : 0) + 80);
      sk_kv_free(kv);
    }
    free(want);
  }
  printf("same tokens at stream index 0 vs 10^7 vs 2^40 (streaming, window, "
         "dense, scaled): max abs logit diff %.3g\n", maxd);
  assert_true(maxd < 1e-3);
  sk_scratch_free(s);
  free(ids);
  json_decref(ref);
  sk_model_free(f.m);
  sk_gguf_close(f.g);
}

static void test_model_long_stream(void **state) {
  (void)state;
  struct model_fx f;
  load_model(&f);
  const uint32_t V = sk_model_config(f.m)->n_vocab;
  struct sk_kv *kv =
      new_kv(sk_model_kv_shape(f.m), SK_POLICY_STREAMING, 4, 60, 0);
  size_t size = (size_t)kv->hdr->size;
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(f.m, 60, 64, &s, &err), 0);
  const int32_t prompt[5] = {1, 403, 407, 261, 378}; /* Once upon a time */
  float logits[512];
  struct sk_evict_log log;
  sk_evict_log_reset(&log);
  forward_ok(&f, s, kv, prompt, 5, logits, &log);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 5000; i++) {
    int32_t next = argmax(logits, V);
    forward_ok(&f, s, kv, &next, 1, logits, &log);
    for (uint32_t j = 0; j < V; j++) assert_true(isfinite(logits[j]));
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 +
               (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3 / 5000;
  printf("streaming decode: %.1f us/token at 64 resident\n", us);
  assert_int_equal(kv->hdr->n_resident, 64);
  assert_int_equal(kv->hdr->n_seen, 5005);
  assert_int_equal(kv->hdr->n_evicted, 5005 - 64);
  assert_int_equal(log.n_evicted, 5005 - 64);
  assert_int_equal(log.n_ranges, 1);
  assert_int_equal(log.first[0], 4);
  assert_int_equal(log.last[0], 5005 - 61);
  assert_int_equal(kv->hdr->size, size);
  for (uint32_t p = 0; p < 64; p++)
    assert_int_equal(kv->index[sk_kv_slot(kv, p)], p < 4 ? p : 5005 - 64 + p);
  assert_permutation(kv);
  sk_scratch_free(s);
  sk_kv_free(kv);
  sk_model_free(f.m);
  sk_gguf_close(f.g);
}

/* Layer-0 keys of every resident token equal a from-scratch computation
 * after evictions, for every evicting policy: rotated at its stream index
 * (window), or unrotated and then rotated at its cache position (h2o
 * evicts from the middle: later tokens move down and are rotated at their
 * new place). */
static void test_model_keys_all_policies(void **state) {
  (void)state;
  struct model_fx f;
  load_model(&f);
  const struct sk_model_config *c = sk_model_config(f.m);
  json_t *ref = sk_test_load_reference("logprobs.json");
  size_t n_ids;
  int32_t *ids = sk_test_json_ids(
      json_object_get(json_array_get(json_object_get(ref, "texts"), 0),
                      "token_ids"),
      &n_ids);
  static const struct sk_kv_params ps[] = {
      {.policy = SK_POLICY_WINDOW, .window = 16},
      {.policy = SK_POLICY_H2O, .heavy = 8, .recent = 8},
      {.policy = SK_POLICY_SINK_H2O, .n_sink = 4, .heavy = 6, .recent = 6},
  };
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(f.m, 12, 16, &s, &err), 0);
  float logits[512];
  double maxd = 0.0;
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
    struct sk_kv *kv = new_kv_p(sk_model_kv_shape(f.m), ps[pi]);
    uint32_t room = sk_kv_max_room(kv);
    uint32_t done = 0, step = 0;
    static const uint32_t sizes[] = {5, 1, 12, 3, 7, 1, 1, 9, 12, 2};
    while (done < 150) {
      uint32_t n = sizes[step++ % 10];
      if (n > room) n = room;
      if (n > 150 - done) n = 150 - done;
      forward_ok(&f, s, kv, ids + done, n, logits, NULL);
      done += n;
    }
    assert_int_equal(kv->hdr->n_resident, 16);
    assert_int_equal(kv->hdr->n_evicted, 150 - 16);
    for (uint32_t p = 0; p < 16; p++) {
      uint32_t slot = sk_kv_slot(kv, p);
      assert_int_equal(kv->token[slot], ids[kv->index[slot]]);
      if (p > 0) assert_true(sk_kv_index_at(kv, p) > sk_kv_index_at(kv, p - 1));
      double want[256], got[256];
      layer0_key(&f, kv->token[slot], want);
      const float *k = sk_kv_k(kv, 0, slot);
      for (uint32_t d = 0; d < c->kv_dim; d++) got[d] = k[d];
      if (sk_policy_scores(ps[pi].policy)) { /* stored before RoPE */
        rope_double(c, want, p);
        rope_double(c, got, p);
      } else { /* stored rotated at its stream index */
        rope_double(c, want, (double)kv->index[slot]);
      }
      for (uint32_t d = 0; d < c->kv_dim; d++)
        if (fabs(got[d] - want[d]) > maxd) maxd = fabs(got[d] - want[d]);
    }
    if (ps[pi].policy == SK_POLICY_SINK_H2O)
      for (uint32_t p = 0; p < 4; p++)
        assert_int_equal(sk_kv_index_at(kv, p), p);
    sk_kv_free(kv);
  }
  printf("layer-0 keys after window/h2o/sink_h2o evictions: max abs diff "
         "%.3g\n", maxd);
  assert_true(maxd < 1e-4);
  sk_scratch_free(s);
  free(ids);
  json_decref(ref);
  sk_model_free(f.m);
  sk_gguf_close(f.g);
}

/* H2O with the real model: heavy 16 + recent 16, a 24-token prompt, then
 * 64 greedy tokens one at a time. The newest token always survives its
 * step, the last 16 are always resident, the heavy part changes over
 * time, and a second run gives the same resident sets. Also the
 * aggregation rule: every query row's probabilities sum to 1 per head and
 * layer, so before any eviction the scores sum to n_layer * n_head * rows. */
static void h2o_run(const struct model_fx *f, const int32_t *prompt,
                    uint64_t sets[64][32]) {
  const struct sk_model_config *c = sk_model_config(f->m);
  struct sk_kv *kv = new_kv_p(sk_model_kv_shape(f->m),
                              (struct sk_kv_params){.policy = SK_POLICY_H2O,
                                                    .heavy = 16, .recent = 16});
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(f->m, 24, 32, &s, &err), 0);
  float logits[512];
  forward_ok(f, s, kv, prompt, 24, logits, NULL);
  double sum = 0.0;
  for (uint32_t p = 0; p < 24; p++) sum += kv->score[sk_kv_slot(kv, p)];
  assert_true(fabs(sum - (double)c->n_layer * c->n_head * 24) < 1e-3);
  /* the first token is seen by every row: the largest score */
  for (uint32_t p = 1; p < 24; p++)
    assert_true(kv->score[sk_kv_slot(kv, 0)] > kv->score[sk_kv_slot(kv, p)]);
  for (int i = 0; i < 64; i++) {
    int32_t next = argmax(logits, c->n_vocab);
    forward_ok(f, s, kv, &next, 1, logits, NULL);
    uint64_t newest = kv->hdr->n_seen - 1;
    uint32_t nr = kv->hdr->n_resident;
    assert_int_equal(nr, 24 + i + 1 < 32 ? 24 + i + 1 : 32);
    assert_int_equal(sk_kv_index_at(kv, nr - 1), newest);
    assert_int_equal(kv->token[sk_kv_slot(kv, nr - 1)], next);
    uint32_t n_recent = nr < 16 ? nr : 16;
    for (uint32_t q = 0; q < n_recent; q++)
      assert_int_equal(sk_kv_index_at(kv, nr - 1 - q), newest - q);
    for (uint32_t p = 0; p < 32; p++)
      sets[i][p] = p < nr ? sk_kv_index_at(kv, p) : UINT64_MAX;
    assert_permutation(kv);
  }
  assert_int_equal(kv->hdr->n_evicted, 24 + 64 - 32);
  sk_scratch_free(s);
  sk_kv_free(kv);
}

static void test_model_h2o(void **state) {
  (void)state;
  struct model_fx f;
  load_model(&f);
  /* the prompt: the first 24 tokens of the stories text (BOS first) */
  json_t *ref = sk_test_load_reference("logprobs.json");
  size_t n_ids;
  int32_t *ids = sk_test_json_ids(
      json_object_get(json_array_get(json_object_get(ref, "texts"), 0),
                      "token_ids"),
      &n_ids);
  static uint64_t a[64][32], b[64][32];
  h2o_run(&f, ids, a);
  h2o_run(&f, ids, b);
  free(ids);
  json_decref(ref);
  assert_memory_equal(a, b, sizeof a);
  /* the older (heavy) part: positions 0..15 of the full cache */
  bool changed = false;
  for (int i = 9; i < 63; i++)
    if (memcmp(a[i], a[i + 1], 16 * sizeof a[0][0]) != 0) changed = true;
  assert_true(changed);
  /* the heavy part is not just the oldest tokens (that would be a
   * window): some token older than the recent 16 left while an even older
   * one stayed */
  bool gap = false;
  for (uint32_t p = 0; p + 1 < 16; p++)
    if (a[63][p + 1] != a[63][p] + 1) gap = true;
  assert_true(gap);
  printf("h2o heavy set after 64 steps:");
  for (uint32_t p = 0; p < 16; p++) printf(" %llu", (unsigned long long)a[63][p]);
  printf("\n");
  sk_model_free(f.m);
  sk_gguf_close(f.g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_model_keys_after_evictions),
      cmocka_unit_test(test_model_far_stream),
      cmocka_unit_test(test_model_long_stream),
      cmocka_unit_test(test_model_keys_all_policies),
      cmocka_unit_test(test_model_h2o),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
