/* The architectures of model.h (llama 3.x, qwen2, qwen3).
 *
 * Against llama.cpp's outputs for the fixtures (../shared/models/
 * fixtures/{llama3,qwen2,qwen3}-d256-F32.gguf and qwen2 Q8_0, references
 * in ../shared/reference/fixtures, README there): each prompt's last
 * position logits and the top 10 of every step fed llama.cpp's tokens,
 * on dense, h2o (keys stored unrotated) and streaming caches. Then what
 * the reordering of NEOX heads means for the cache (model.h): stored
 * layer-0 keys against a double-precision recomputation, and a streaming
 * cache that evicted against a dense one holding the same rows; qwen3
 * through the daemon; an independent double-precision pass (checked
 * against llama.cpp) against sinkd on every architecture sinkd-mkmodel
 * writes, heads that do not split the embedding included; batched
 * sessions against each alone; the model description the fingerprint
 * mixes in; and the refusals of other architectures and of one
 * architecture's tensors in another's file. */
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
#include "sinkd/client.h"
#include "session/store.h"
#include "testdaemon.h"
#include "testutil.h"

/* Tolerance against llama.cpp's F32 logits: the largest differences
 * measured are 8.6e-6 (qwen3, AVX2 and portable kernels; printed by each
 * run), from the kernels' other summation order; twice that holds. */
#define LOGIT_TOL 2e-5

enum { V = 512, N_ARCH = 3 };
static const char *const k_arch[N_ARCH] = {"llama3", "qwen2", "qwen3"};

struct fx {
  struct sk_gguf *g;
  struct sk_model *m;
  const struct sk_model_config *c;
  json_t *ref;
};

static char *fixture_path_t(const char *arch, const char *type) {
  char rel[128];
  snprintf(rel, sizeof rel, "models/fixtures/%s-d256-%s.gguf", arch, type);
  return sk_test_shared_path(rel);
}

static char *fixture_path(const char *arch) { return fixture_path_t(arch, "F32"); }

static void load_t(const char *arch, const char *type, struct fx *f) {
  memset(f, 0, sizeof *f);
  char *path = fixture_path_t(arch, type);
  struct sk_error err = {0};
  if (sk_gguf_open(path, &f->g, &err) < 0) fail_msg("open %s: %s", path, err.message);
  if (sk_model_load(f->g, &f->m, &err) < 0) fail_msg("load %s: %s", path, err.message);
  free(path);
  f->c = sk_model_config(f->m);
  char rel[128];
  snprintf(rel, sizeof rel, "reference/fixtures/%s-d256-%s.json", arch, type);
  char *rp = sk_test_shared_path(rel);
  json_error_t je;
  f->ref = json_load_file(rp, 0, &je);
  if (!f->ref) fail_msg("cannot load %s: %s", rp, je.text);
  free(rp);
}

static void load(const char *arch, struct fx *f) { load_t(arch, "F32", f); }

static void unload(struct fx *f) {
  json_decref(f->ref);
  sk_model_free(f->m);
  sk_gguf_close(f->g);
}

static struct sk_kv *new_kv(const struct sk_model *m, const struct sk_kv_params *p) {
  struct sk_kv *kv = NULL;
  struct sk_error err = {0};
  struct sk_kv_shape shape = sk_model_kv_shape(m);
  shape.kv_type = SK_KV_F32;
  if (sk_kv_new(shape, p, &kv, &err) < 0) fail_msg("sk_kv_new: %s", err.message);
  return kv;
}

/* Evictions make_room made that a forward call must be told of
 * (sk_seq.n_evicted: streaming and window caches only). */
static uint32_t told_evicted(const struct sk_kv *kv, uint64_t before) {
  const uint32_t p = kv->hdr->policy;
  return p == SK_POLICY_STREAMING || p == SK_POLICY_WINDOW
             ? (uint32_t)(kv->hdr->n_evicted - before)
             : 0;
}

/* make_room(n), then the n tokens (with the evictions it made). */
static void step(const struct sk_model *m, struct sk_scratch *s, struct sk_kv *kv,
                 const int32_t *tok, uint32_t n, float *logits, bool all) {
  struct sk_error err = {0};
  uint64_t before = kv->hdr->n_evicted;
  if (sk_kv_make_room(kv, n, NULL, &err) < 0) fail_msg("make_room: %s", err.message);
  struct sk_seq q = {.kv = kv, .tokens = tok, .n = n, .n_evicted = told_evicted(kv, before),
                     .logits = logits, .all_logits = all};
  if (sk_model_forward_batch(m, s, &q, 1, &err) < 0) fail_msg("forward: %s", err.message);
}

static double num(const json_t *v) {
  assert_true(json_is_number(v));
  return json_number_value(v);
}

/* logits against one step's top10: each listed id within tol of its
 * logit, and no other id above the tenth logit + tol (ids closer than
 * tol may swap ranks). Returns the largest difference. */
static double check_top10(const float *logits, const json_t *top10, double tol,
                          const char *what) {
  assert_int_equal(json_array_size(top10), 10);
  double maxd = 0.0;
  bool listed[V] = {false};
  double tenth = 0.0;
  for (size_t r = 0; r < 10; r++) {
    const json_t *pair = json_array_get(top10, r);
    int32_t id = (int32_t)json_integer_value(json_array_get(pair, 0));
    assert_true(id >= 0 && id < V);
    double want = num(json_array_get(pair, 1)), d = fabs(logits[id] - want);
    if (d > maxd) maxd = d;
    if (!(d <= tol))
      fail_msg("%s rank %zu id %d: logit %.9g, want %.9g (diff %.3g)", what, r, id,
               (double)logits[id], want, d);
    listed[id] = true;
    tenth = want;
  }
  for (int32_t j = 0; j < V; j++)
    if (!listed[j] && logits[j] > tenth + tol)
      fail_msg("%s: id %d (logit %.9g) is above llama.cpp's top 10 (tenth %.9g)", what, j,
               (double)logits[j], tenth);
  return maxd;
}

/* ---- llama.cpp's outputs ---------------------------------------------- */

/* Every prompt through a cache of params p: the last prompt position's
 * 512 logits, then each of the 32 steps' top 10, fed llama.cpp's tokens
 * (the prompt in one chunk, then one token at a time). */
static void reference_run(const struct fx *f, const struct sk_kv_params *p, const char *what,
                          double tol, double *ret_prompt, double *ret_steps) {
  const json_t *prompts = json_object_get(f->ref, "prompts");
  assert_int_equal(json_array_size(prompts), 3);
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  if (sk_scratch_new(f->m, 64, 64, &s, &err) < 0) fail_msg("scratch: %s", err.message);
  float logits[V];
  for (size_t pi = 0; pi < 3; pi++) {
    const json_t *pr = json_array_get(prompts, pi);
    size_t np, ng;
    int32_t *ids = sk_test_json_ids(json_object_get(pr, "prompt_ids"), &np);
    int32_t *gen = sk_test_json_ids(json_object_get(pr, "generated_ids"), &ng);
    assert_int_equal(ng, 32);
    struct sk_kv *kv = new_kv(f->m, p);
    step(f->m, s, kv, ids, (uint32_t)np, logits, false);
    const json_t *last = json_object_get(pr, "last_position_logits");
    assert_int_equal(json_array_size(last), V);
    for (size_t j = 0; j < V; j++) {
      double d = fabs(logits[j] - num(json_array_get(last, j)));
      if (d > *ret_prompt) *ret_prompt = d;
      if (!(d <= tol))
        fail_msg("%s prompt %zu logit %zu: %.9g, want %.9g", what, pi, j, (double)logits[j],
                 num(json_array_get(last, j)));
    }
    const json_t *steps = json_object_get(pr, "steps");
    for (size_t t = 0; t < 32; t++) {
      char w[96];
      snprintf(w, sizeof w, "%s prompt %zu step %zu", what, pi, t);
      double d = check_top10(logits, json_object_get(json_array_get(steps, t), "top10"),
                             tol, w);
      if (d > *ret_steps) *ret_steps = d;
      step(f->m, s, kv, &gen[t], 1, logits, false);
    }
    assert_int_equal(kv->hdr->n_evicted, 0);
    sk_kv_free(kv);
    free(ids);
    free(gen);
  }
  sk_scratch_free(s);
}

static void reference_arch(const char *arch) {
  struct fx f;
  load(arch, &f);
  /* dense; h2o with room for everything (keys stored unrotated, rotated
   * at attention time); streaming with room for everything */
  const struct sk_kv_params ps[] = {
      {.policy = SK_POLICY_DENSE, .capacity = 64, .rope_scale = 1.0f},
      {.policy = SK_POLICY_H2O, .heavy = 32, .recent = 32, .rope_scale = 1.0f},
      {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 60, .rope_scale = 1.0f},
  };
  static const char *const names[] = {"dense", "h2o", "streaming"};
  for (size_t i = 0; i < 3; i++) {
    double dp = 0.0, ds = 0.0;
    char what[64];
    snprintf(what, sizeof what, "%s %s", arch, names[i]);
    reference_run(&f, &ps[i], what, LOGIT_TOL, &dp, &ds);
    printf("%s vs llama.cpp: max abs diff, last prompt logits %.3g, top-10 of 32 steps %.3g\n",
           what, dp, ds);
  }
  unload(&f);
}

static void test_llama3_reference(void **state) {
  (void)state;
  reference_arch("llama3");
}

static void test_qwen2_reference(void **state) {
  (void)state;
  reference_arch("qwen2");
}

static void test_qwen3_reference(void **state) {
  (void)state;
  reference_arch("qwen3");
}

/* qwen2 with Q8_0 weights (F32 biases): sinkd quantizes the activations
 * to Q8_0 as ggml does, so it is held to llama.cpp's main reference
 * within 0.5, the spread of llama.cpp's own kernel variants on quantized
 * files (the fixtures' README); the largest difference is printed. */
static void test_qwen2_q8_0_reference(void **state) {
  (void)state;
  struct fx f;
  load_t("qwen2", "Q8_0", &f);
  const struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = 64, .rope_scale = 1.0f};
  double dp = 0.0, ds = 0.0;
  reference_run(&f, &p, "qwen2 Q8_0 dense", 0.5, &dp, &ds);
  printf("qwen2 Q8_0 dense vs llama.cpp: max abs diff, last prompt logits %.3g, top-10 of 32 "
         "steps %.3g\n",
         dp, ds);
  unload(&f);
}

/* ---- what the configuration says --------------------------------------- */

static void test_config_and_description(void **state) {
  (void)state;
  static const struct {
    const char *arch, *desc;
    float base, eps;
  } want[N_ARCH] = {
      {"llama", "llama rope=norm rope_freqs tied_output", 500000.0f, 1e-5f},
      {"qwen2", "qwen2 rope=neox keys=pairs-interleaved qkv_bias", 1e6f, 1e-6f},
      {"qwen3", "qwen3 rope=neox keys=pairs-interleaved qk_norm", 1e6f, 1e-6f},
  };
  for (size_t i = 0; i < N_ARCH; i++) {
    struct fx f;
    load(k_arch[i], &f);
    assert_string_equal(f.c->arch, want[i].arch);
    assert_int_equal(f.c->dim, 256);
    assert_int_equal(f.c->n_head, 4);
    assert_int_equal(f.c->n_kv_head, 2);
    assert_int_equal(f.c->head_dim, 64);
    assert_int_equal(f.c->q_dim, 256);
    assert_int_equal(f.c->kv_dim, 128);
    assert_int_equal(f.c->n_vocab, 512);
    assert_true(f.c->rope_base == want[i].base);
    assert_true(fabsf(f.c->rms_eps - want[i].eps) < 1e-12f);
    char buf[128];
    assert_string_equal(sk_model_describe(f.m, buf, sizeof buf), want[i].desc);
    /* the daemon's fingerprint mixes the line in: another reading of the
     * same file (here: the other RoPE style) gives another fingerprint */
    uint8_t fp[SK_STORE_FP_SIZE], again[SK_STORE_FP_SIZE], file[SK_STORE_FP_SIZE],
        other[SK_STORE_FP_SIZE];
    sk_store_fingerprint_runs(f.g, buf, fp);
    sk_store_fingerprint_runs(f.g, buf, again);
    sk_store_fingerprint(f.g, file);
    char *neox = strstr(buf, "rope=");
    assert_non_null(neox);
    memcpy(neox, strncmp(neox, "rope=norm", 9) == 0 ? "rope=neox" : "rope=norm", 9);
    sk_store_fingerprint_runs(f.g, buf, other);
    assert_memory_equal(fp, again, sizeof fp);
    assert_memory_not_equal(fp, file, sizeof fp);
    assert_memory_not_equal(fp, other, sizeof fp);
    unload(&f);
  }
}

/* ---- the keys a NEOX model stores ---------------------------------------- */

static const float *tensor_f32(const struct sk_gguf *g, const char *name) {
  const struct sk_gguf_tensor *t = sk_gguf_find_tensor(g, name);
  if (!t) fail_msg("no tensor %s", name);
  assert_int_equal(t->type, SK_GGML_F32);
  return t->data;
}

/* Layer-0 key of token tok at position pos, in double, as llama.cpp
 * defines it: k = Wk rmsnorm(embedding) (+ bk), per-head RMSNorm (qwen3),
 * then NEOX RoPE, pairs (x[i], x[i + 32]); written in the cache's order
 * (model.h: pair i at 2i, 2i+1). */
static void layer0_key(const struct fx *f, int32_t tok, uint32_t pos, double *out) {
  const struct sk_model_config *c = f->c;
  const float *emb = tensor_f32(f->g, "token_embd.weight") + (size_t)tok * c->dim;
  const float *nw = tensor_f32(f->g, "blk.0.attn_norm.weight");
  const float *wk = tensor_f32(f->g, "blk.0.attn_k.weight");
  double x[256], k[128];
  double ss = 0.0;
  for (uint32_t j = 0; j < c->dim; j++) ss += (double)emb[j] * emb[j];
  double sc = 1.0 / sqrt(ss / c->dim + c->rms_eps);
  for (uint32_t j = 0; j < c->dim; j++) x[j] = emb[j] * sc * nw[j];
  for (uint32_t r = 0; r < c->kv_dim; r++) {
    double a = 0.0;
    for (uint32_t j = 0; j < c->dim; j++) a += (double)wk[(size_t)r * c->dim + j] * x[j];
    k[r] = a;
  }
  if (c->qkv_bias) {
    const float *bk = tensor_f32(f->g, "blk.0.attn_k.bias");
    for (uint32_t r = 0; r < c->kv_dim; r++) k[r] += bk[r];
  }
  const uint32_t hd = c->head_dim, h = hd / 2;
  for (uint32_t kh = 0; kh < c->n_kv_head; kh++) {
    double *y = k + kh * hd;
    if (c->qk_norm) {
      const float *kn = tensor_f32(f->g, "blk.0.attn_k_norm.weight");
      double s2 = 0.0;
      for (uint32_t j = 0; j < hd; j++) s2 += y[j] * y[j];
      double s = 1.0 / sqrt(s2 / hd + c->rms_eps);
      for (uint32_t j = 0; j < hd; j++) y[j] = y[j] * s * kn[j];
    }
    for (uint32_t i = 0; i < h; i++) {
      double a = pos * pow((double)c->rope_base, -2.0 * i / hd);
      double x0 = y[i], x1 = y[i + h];
      out[kh * hd + 2 * i] = x0 * cos(a) - x1 * sin(a);
      out[kh * hd + 2 * i + 1] = x0 * sin(a) + x1 * cos(a);
    }
  }
}

/* Rotates every head of x (kv_dim) by angle delta * freq_i per adjacent
 * pair: the cache's order for both styles. */
static void rerotate(const struct sk_model_config *c, double *x, double delta) {
  for (uint32_t kh = 0; kh < c->n_kv_head; kh++)
    for (uint32_t i = 0; i < c->rope_dim / 2; i++) {
      double a = delta * pow((double)c->rope_base, -2.0 * i / c->rope_dim);
      double *y = x + kh * c->head_dim + 2 * i, x0 = y[0], x1 = y[1];
      y[0] = x0 * cos(a) - x1 * sin(a);
      y[1] = x0 * sin(a) + x1 * cos(a);
    }
}

/* A token stream of the fixtures' vocabulary. */
static void stream_ids(int32_t *ids, int32_t n) {
  ids[0] = 1;
  for (int32_t i = 1; i < n; i++) ids[i] = 3 + (i * 7919) % 500;
}

/* The stored keys of a NEOX model: each layer-0 key of a dense cache is
 * the recomputed one; then a streaming cache (4 sinks + 12) after 100
 * tokens in chunks: its keys, rotated at their stream index, are the
 * recomputed ones there, and its next step gives the logits of a dense
 * cache holding the same rows at the same positions (keys turned from
 * their stream index to their position), which never saw the evicted
 * tokens. ret_next gets those logits. */
static void neox_cache(const char *arch, float *ret_next) {
  struct fx f;
  load(arch, &f);
  const struct sk_model_config *c = f.c;
  assert_int_equal(c->rope_style, SK_ROPE_NEOX);
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(f.m, 32, 32, &s, &err), 0);
  int32_t ids[101];
  stream_ids(ids, 101);
  float logits[V];

  double maxk = 0.0, want[128];
  struct sk_kv_params dp = {.policy = SK_POLICY_DENSE, .capacity = 32, .rope_scale = 1.0f};
  struct sk_kv *dense = new_kv(f.m, &dp);
  step(f.m, s, dense, ids, 20, logits, false);
  for (uint32_t p = 0; p < 20; p++) {
    layer0_key(&f, ids[p], p, want);
    const float *k = sk_kv_k(dense, 0, sk_kv_slot(dense, p));
    for (uint32_t d = 0; d < c->kv_dim; d++) maxk = fmax(maxk, fabs(k[d] - want[d]));
  }
  sk_kv_free(dense);

  struct sk_kv_params sp = {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 12,
                            .rope_scale = 1.0f};
  struct sk_kv *kv = new_kv(f.m, &sp);
  static const uint32_t sizes[] = {5, 1, 12, 3, 7, 1, 1, 9, 12, 2};
  uint32_t done = 0;
  for (size_t i = 0; done < 100; i++) {
    uint32_t n = sizes[i % 10];
    if (n > 100 - done) n = 100 - done;
    step(f.m, s, kv, ids + done, n, logits, false);
    done += n;
  }
  assert_int_equal(kv->hdr->n_resident, 16);
  assert_int_equal(kv->hdr->n_evicted, 84);
  for (uint32_t p = 0; p < 16; p++) {
    uint32_t slot = sk_kv_slot(kv, p);
    uint64_t index = kv->index[slot];
    assert_int_equal(index, p < 4 ? p : 84 + p);
    layer0_key(&f, kv->token[slot], (uint32_t)index, want);
    const float *k = sk_kv_k(kv, 0, slot);
    for (uint32_t d = 0; d < c->kv_dim; d++) maxk = fmax(maxk, fabs(k[d] - want[d]));
  }
  printf("%s layer-0 keys (dense, and streaming after 84 evictions) vs double NEOX "
         "recomputation: max abs diff %.3g\n",
         arch, maxk);
  assert_true(maxk < 1e-4);

  /* the dense cache of the same rows; the next step evicts one more */
  assert_int_equal(sk_kv_make_room(kv, 1, NULL, &err), 0);
  assert_int_equal(kv->hdr->n_resident, 15);
  dp.capacity = 16;
  dense = new_kv(f.m, &dp);
  for (uint32_t p = 0; p < 15; p++) {
    uint32_t from = sk_kv_slot(kv, p), to = sk_kv_slot(dense, p);
    for (uint32_t l = 0; l < c->n_layer; l++) {
      double key[128];
      const float *k = sk_kv_k(kv, l, from);
      for (uint32_t d = 0; d < c->kv_dim; d++) key[d] = k[d];
      rerotate(c, key, (double)p - (double)kv->index[from]);
      for (uint32_t d = 0; d < c->kv_dim; d++) sk_kv_k(dense, l, to)[d] = (float)key[d];
      memcpy(sk_kv_v(dense, l, to), sk_kv_v(kv, l, from), c->kv_dim * sizeof(float));
    }
    sk_kv_commit(dense, &kv->token[from], 1);
  }
  float l_stream[V];
  struct sk_seq q = {.kv = kv, .tokens = &ids[100], .n = 1, .n_evicted = 1,
                     .logits = l_stream};
  assert_int_equal(sk_model_forward_batch(f.m, s, &q, 1, &err), 0);
  assert_int_equal(sk_model_forward(f.m, s, dense, &ids[100], 1, ret_next, false, &err), 0);
  double maxl = 0.0;
  for (uint32_t i = 0; i < V; i++) maxl = fmax(maxl, fabs((double)l_stream[i] - ret_next[i]));
  printf("%s next step, streaming cache vs dense cache holding its rows: max abs logit "
         "diff %.3g\n",
         arch, maxl);
  assert_true(maxl < 1e-4);
  sk_kv_free(dense);
  sk_kv_free(kv);
  sk_scratch_free(s);
  unload(&f);
}

static void test_neox_cache(void **state) {
  (void)state;
  float next[V];
  neox_cache("qwen2", next);
  neox_cache("qwen3", next);
}

/* ---- through the daemon ----------------------------------------------- */

struct collect {
  int32_t tok[32];
  float top[32][10][2];
  size_t n;
};

static int collect_cb(void *user, const struct sk_token_event *ev) {
  struct collect *c = user;
  if (c->n < 32) {
    c->tok[c->n] = ev->token;
    for (size_t r = 0; r < ev->n_top && r < 10; r++) {
      c->top[c->n][r][0] = (float)ev->top[r].token;
      c->top[c->n][r][1] = (float)ev->top[r].logit;
    }
    c->n++;
  }
  return 0;
}

/* The top 10 of a token event against logits (ids and values). */
static double event_vs(const struct collect *col, size_t i, const float *logits,
                       const char *what) {
  double maxd = 0.0;
  for (size_t r = 0; r < 10; r++) {
    int32_t id = (int32_t)col->top[i][r][0];
    assert_true(id >= 0 && id < V);
    double d = fabs(col->top[i][r][1] - logits[id]);
    maxd = fmax(maxd, d);
    if (!(d <= LOGIT_TOL)) fail_msg("%s rank %zu id %d: diff %.3g", what, r, id, d);
  }
  return maxd;
}

/* sinkd on the qwen3 fixture (f32 cache): each prompt's 32 greedy steps
 * against llama.cpp's (tokens and top 10); then a streaming session of 4
 * sinks + 12 fed the stream of neox_cache in its chunks: the
 * log-probabilities the daemon returns are those of the same run in this
 * process, and its next token's top 10 are the logits of the dense
 * cache holding the same rows. */
static void test_daemon_qwen3(void **state) {
  (void)state;
  char *path = fixture_path("qwen3");
  setenv("SK_MODEL", path, 1);
  struct sk_test_daemon d;
  const char *extra[] = {"--config", "/dev/null", "--kv-type", "f32", NULL};
  sk_test_daemon_start(&d, extra);
  struct sk_client *cl = sk_test_connect(d.socket);
  struct sk_error e = {0};

  struct fx f;
  load("qwen3", &f);
  const json_t *prompts = json_object_get(f.ref, "prompts");
  double maxd = 0.0;
  for (size_t pi = 0; pi < 3; pi++) {
    const json_t *pr = json_array_get(prompts, pi);
    size_t np, ng;
    int32_t *ids = sk_test_json_ids(json_object_get(pr, "prompt_ids"), &np);
    int32_t *gen = sk_test_json_ids(json_object_get(pr, "generated_ids"), &ng);
    struct sk_open_params op = {.policy = "dense", .capacity = 64};
    struct sk_open_result o;
    assert_int_equal(sk_client_open(cl, &op, &o, &e), 0);
    assert_int_equal(sk_client_append_tokens(cl, o.session, ids, np, SK_BOS_FALSE, NULL, &e), 0);
    struct sk_generate_params gp;
    sk_test_greedy_params(&gp, 32);
    gp.n_top = 10;
    struct collect col = {0};
    struct sk_generate_result gr;
    assert_int_equal(sk_client_generate(cl, o.session, &gp, collect_cb, &col, &gr, &e), 0);
    assert_int_equal(col.n, 32);
    const json_t *steps = json_object_get(pr, "steps");
    for (size_t t = 0; t < 32; t++) {
      if (col.tok[t] != gen[t])
        fail_msg("daemon prompt %zu step %zu: token %d, llama.cpp %d", pi, t, col.tok[t], gen[t]);
      const json_t *top10 = json_object_get(json_array_get(steps, t), "top10");
      for (size_t r = 0; r < 10; r++) {
        const json_t *pair = json_array_get(top10, r);
        double dd = fabs(col.top[t][r][1] - num(json_array_get(pair, 1)));
        maxd = fmax(maxd, dd);
        if (!(dd <= LOGIT_TOL) ||
            (int32_t)col.top[t][r][0] != (int32_t)json_integer_value(json_array_get(pair, 0)))
          fail_msg("daemon prompt %zu step %zu rank %zu: [%d, %.9g], llama.cpp [%d, %.9g]", pi,
                   t, r, (int32_t)col.top[t][r][0], (double)col.top[t][r][1],
                   (int32_t)json_integer_value(json_array_get(pair, 0)),
                   num(json_array_get(pair, 1)));
      }
    }
    assert_int_equal(sk_client_close_session(cl, o.session, &e), 0);
    free(ids);
    free(gen);
  }
  printf("qwen3 through the daemon, 3 x 32 greedy steps: max abs top-10 diff vs llama.cpp "
         "%.3g\n",
         maxd);

  /* streaming with evictions */
  int32_t ids[101];
  stream_ids(ids, 101);
  struct sk_open_params op = {.policy = "streaming", .n_sink = 4, .has_n_sink = true,
                              .window = 12};
  struct sk_open_result o;
  assert_int_equal(sk_client_open(cl, &op, &o, &e), 0);
  assert_int_equal(o.capacity, 16);
  double lp[100];
  static const uint32_t sizes[] = {5, 1, 12, 3, 7, 1, 1, 9, 12, 2};
  uint32_t done = 0;
  uint64_t evicted = 0;
  for (size_t i = 0; done < 100; i++) {
    uint32_t n = sizes[i % 10];
    if (n > 100 - done) n = 100 - done;
    struct sk_append_result ar;
    assert_int_equal(sk_client_append_logprobs(cl, o.session, ids + done, n, SK_BOS_FALSE,
                                               lp + done, &ar, &e),
                     0);
    evicted += ar.evicted;
    done += n;
  }
  assert_int_equal(evicted, 84);
  /* the same chunks in this process */
  struct sk_kv_params sp = {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 12,
                            .rope_scale = 1.0f};
  struct sk_kv *kv = new_kv(f.m, &sp);
  struct sk_scratch *s = NULL;
  assert_int_equal(sk_scratch_new(f.m, 16, 32, &s, &e), 0);
  float *all = malloc((size_t)12 * V * sizeof *all);
  assert_non_null(all);
  float prev[V];
  double maxlp = 0.0;
  done = 0;
  for (size_t i = 0; done < 100; i++) {
    uint32_t n = sizes[i % 10];
    if (n > 100 - done) n = 100 - done;
    /* the daemon scores a chunk's first token with the logits before it
     * (computed before this chunk's make_room) */
    step(f.m, s, kv, ids + done, n, all, true);
    for (uint32_t j = 0; j < n; j++) {
      uint32_t k = done + j;
      if (k == 0) {
        assert_true(isnan(lp[0]));
        continue;
      }
      const float *lg = j ? all + (size_t)(j - 1) * V : prev;
      double mx = -INFINITY, sum = 0.0;
      for (uint32_t v = 0; v < V; v++) mx = fmax(mx, lg[v]);
      for (uint32_t v = 0; v < V; v++) sum += exp((double)lg[v] - mx);
      double want = (double)lg[ids[k]] - mx - log(sum);
      maxlp = fmax(maxlp, fabs(lp[k] - want));
    }
    memcpy(prev, all + (size_t)(n - 1) * V, sizeof prev);
    done += n;
  }
  printf("qwen3 streaming 4+12 through the daemon, 100 tokens, 84 evicted: max abs "
         "log-probability diff vs this process %.3g\n",
         maxlp);
  assert_true(maxlp < 1e-5);
  /* the next token: the daemon's top 10 against a dense cache holding the
   * rows (neox_cache runs the same stream) */
  float next[V];
  neox_cache("qwen3", next);
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(cl, o.session, &ids[100], 1, SK_BOS_FALSE, &ar, &e),
                   0);
  assert_int_equal(ar.evicted, 1);
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, 1);
  gp.n_top = 10;
  struct collect col = {0};
  assert_int_equal(sk_client_generate(cl, o.session, &gp, collect_cb, &col, NULL, &e), 0);
  assert_int_equal(col.n, 1);
  double maxn = event_vs(&col, 0, next, "daemon streaming next step");
  printf("qwen3 streaming through the daemon, next step vs a dense cache holding the same "
         "rows: max abs top-10 diff %.3g\n",
         maxn);
  free(all);
  sk_scratch_free(s);
  sk_kv_free(kv);
  unload(&f);
  sk_client_free(cl);
  int st = sk_test_daemon_stop(&d, 10000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  free(path);
}

/* ---- an independent forward pass ---------------------------------------- */

/* The whole model in double, written from llama.cpp's graph (llm_build_
 * llama / qwen2 / qwen3) without any of model.c's machinery: per token,
 * per layer, RMSNorm, the projections (+ biases), the per-head q/k norms,
 * RoPE on the pairs of the architecture's style in its own order, causal
 * attention, SwiGLU. F32 files only. Returns the (n_vocab) logits of the
 * last of tokens[0..n), malloc'd. */
static double *naive_forward(const struct sk_gguf *g, const struct sk_model_config *c,
                             const int32_t *tokens, uint32_t n) {
  const uint32_t D = c->dim, Q = c->q_dim, KV = c->kv_dim, H = c->hidden_dim, hd = c->head_dim;
  const uint32_t group = c->n_head / c->n_kv_head;
  double *x = calloc(D, sizeof *x), *xn = calloc(D, sizeof *xn), *q = calloc(Q, sizeof *q);
  double *att = calloc(Q, sizeof *att), *hg = calloc(H, sizeof *hg), *hu = calloc(H, sizeof *hu);
  double *kc = calloc((size_t)c->n_layer * n * KV, sizeof *kc);
  double *vc = calloc((size_t)c->n_layer * n * KV, sizeof *vc);
  double *sc = calloc(n, sizeof *sc), *logits = calloc(c->n_vocab, sizeof *logits);
  assert_true(x && xn && q && att && hg && hu && kc && vc && sc && logits);
  const float *freqs = c->rope_freqs ? tensor_f32(g, "rope_freqs.weight") : NULL;
  char nm[96];
#define W(FMT, L) (snprintf(nm, sizeof nm, FMT, L), tensor_f32(g, nm))
  for (uint32_t pos = 0; pos < n; pos++) {
    const float *emb = tensor_f32(g, "token_embd.weight") + (size_t)tokens[pos] * D;
    for (uint32_t j = 0; j < D; j++) x[j] = emb[j];
    for (uint32_t l = 0; l < c->n_layer; l++) {
      double *k = kc + ((size_t)l * n + pos) * KV, *v = vc + ((size_t)l * n + pos) * KV;
      const float *an = W("blk.%u.attn_norm.weight", l);
      double ss = 0.0;
      for (uint32_t j = 0; j < D; j++) ss += x[j] * x[j];
      for (uint32_t j = 0; j < D; j++) xn[j] = x[j] / sqrt(ss / D + c->rms_eps) * an[j];
      struct {
        const char *w, *b;
        double *y;
        uint32_t rows;
      } pr[3] = {{"blk.%u.attn_q.weight", "blk.%u.attn_q.bias", q, Q},
                 {"blk.%u.attn_k.weight", "blk.%u.attn_k.bias", k, KV},
                 {"blk.%u.attn_v.weight", "blk.%u.attn_v.bias", v, KV}};
      for (int i = 0; i < 3; i++) {
        const float *w = W(pr[i].w, l);
        const float *b = c->qkv_bias ? W(pr[i].b, l) : NULL;
        for (uint32_t r = 0; r < pr[i].rows; r++) {
          double a = b ? b[r] : 0.0;
          for (uint32_t j = 0; j < D; j++) a += (double)w[(size_t)r * D + j] * xn[j];
          pr[i].y[r] = a;
        }
      }
      for (int which = 0; which < 2; which++) {
        double *y = which ? k : q;
        const uint32_t nh = which ? c->n_kv_head : c->n_head;
        const float *nw = c->qk_norm ? W(which ? "blk.%u.attn_k_norm.weight"
                                               : "blk.%u.attn_q_norm.weight", l)
                                     : NULL;
        for (uint32_t h = 0; h < nh; h++) {
          double *z = y + (size_t)h * hd;
          if (nw) {
            double s2 = 0.0;
            for (uint32_t j = 0; j < hd; j++) s2 += z[j] * z[j];
            double f = 1.0 / sqrt(s2 / hd + c->rms_eps);
            for (uint32_t j = 0; j < hd; j++) z[j] = z[j] * f * nw[j];
          }
          for (uint32_t i = 0; i < c->rope_dim / 2; i++) {
            double a = pos * pow((double)c->rope_base, -2.0 * i / c->rope_dim) * c->rope_scale /
                       (freqs ? freqs[i] : 1.0);
            uint32_t i0 = c->rope_style == SK_ROPE_NEOX ? i : 2 * i;
            uint32_t i1 = c->rope_style == SK_ROPE_NEOX ? i + c->rope_dim / 2 : 2 * i + 1;
            double x0 = z[i0], x1 = z[i1];
            z[i0] = x0 * cos(a) - x1 * sin(a);
            z[i1] = x0 * sin(a) + x1 * cos(a);
          }
        }
      }
      for (uint32_t h = 0; h < c->n_head; h++) {
        const uint32_t kvh = h / group;
        double mx = -INFINITY, sum = 0.0;
        for (uint32_t p = 0; p <= pos; p++) {
          const double *kp = kc + ((size_t)l * n + p) * KV + (size_t)kvh * hd;
          double a = 0.0;
          for (uint32_t j = 0; j < hd; j++) a += q[(size_t)h * hd + j] * kp[j];
          sc[p] = a / sqrt((double)hd);
          mx = fmax(mx, sc[p]);
        }
        for (uint32_t p = 0; p <= pos; p++) sum += (sc[p] = exp(sc[p] - mx));
        for (uint32_t j = 0; j < hd; j++) {
          double a = 0.0;
          for (uint32_t p = 0; p <= pos; p++)
            a += sc[p] / sum * vc[((size_t)l * n + p) * KV + (size_t)kvh * hd + j];
          att[(size_t)h * hd + j] = a;
        }
      }
      const float *wo = W("blk.%u.attn_output.weight", l);
      for (uint32_t r = 0; r < D; r++) {
        double a = 0.0;
        for (uint32_t j = 0; j < Q; j++) a += (double)wo[(size_t)r * Q + j] * att[j];
        x[r] += a;
      }
      const float *fn = W("blk.%u.ffn_norm.weight", l);
      ss = 0.0;
      for (uint32_t j = 0; j < D; j++) ss += x[j] * x[j];
      for (uint32_t j = 0; j < D; j++) xn[j] = x[j] / sqrt(ss / D + c->rms_eps) * fn[j];
      const float *wg = W("blk.%u.ffn_gate.weight", l), *wu = W("blk.%u.ffn_up.weight", l);
      for (uint32_t r = 0; r < H; r++) {
        double a = 0.0, b = 0.0;
        for (uint32_t j = 0; j < D; j++) {
          a += (double)wg[(size_t)r * D + j] * xn[j];
          b += (double)wu[(size_t)r * D + j] * xn[j];
        }
        hg[r] = a / (1.0 + exp(-a)) * b;
      }
      const float *wd = W("blk.%u.ffn_down.weight", l);
      for (uint32_t r = 0; r < D; r++) {
        double a = 0.0;
        for (uint32_t j = 0; j < H; j++) a += (double)wd[(size_t)r * H + j] * hg[j];
        x[r] += a;
      }
    }
  }
#undef W
  const float *on = tensor_f32(g, "output_norm.weight");
  double ss = 0.0;
  for (uint32_t j = 0; j < D; j++) ss += x[j] * x[j];
  for (uint32_t j = 0; j < D; j++) xn[j] = x[j] / sqrt(ss / D + c->rms_eps) * on[j];
  const float *wout = tensor_f32(g, c->tied_output ? "token_embd.weight" : "output.weight");
  for (uint32_t r = 0; r < c->n_vocab; r++) {
    double a = 0.0;
    for (uint32_t j = 0; j < D; j++) a += (double)wout[(size_t)r * D + j] * xn[j];
    logits[r] = a;
  }
  free(x);
  free(xn);
  free(q);
  free(att);
  free(hg);
  free(hu);
  free(kc);
  free(vc);
  free(sc);
  return logits;
}

/* sinkd's logits of the last of n tokens (dense cache) against
 * naive_forward's; returns the largest difference. */
static double vs_naive(const struct sk_gguf *g, const struct sk_model *m, const int32_t *ids,
                       uint32_t n) {
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(m, n, n, &s, &err), 0);
  struct sk_kv_params dp = {.policy = SK_POLICY_DENSE, .capacity = n, .rope_scale = 1.0f};
  struct sk_kv *kv = new_kv(m, &dp);
  const struct sk_model_config *c = sk_model_config(m);
  float *logits = malloc(c->n_vocab * sizeof *logits);
  assert_non_null(logits);
  step(m, s, kv, ids, n, logits, false);
  double *want = naive_forward(g, c, ids, n), maxd = 0.0;
  for (uint32_t i = 0; i < c->n_vocab; i++) maxd = fmax(maxd, fabs(logits[i] - want[i]));
  free(want);
  free(logits);
  sk_kv_free(kv);
  sk_scratch_free(s);
  return maxd;
}

/* The independent pass against llama.cpp on the fixtures (so that it can
 * vouch for what the fixtures do not cover), then against sinkd on the
 * files sinkd-mkmodel writes for every architecture, among them a qwen3
 * whose heads do not split the embedding (64 wide, 4 heads of 32: q_dim
 * 128, as Qwen3-0.6B's 1024 and 16 x 128). */
static void test_naive_and_mkmodel(void **state) {
  (void)state;
  for (size_t i = 0; i < N_ARCH; i++) {
    struct fx f;
    load(k_arch[i], &f);
    const json_t *pr = json_array_get(json_object_get(f.ref, "prompts"), 2);
    size_t np;
    int32_t *ids = sk_test_json_ids(json_object_get(pr, "prompt_ids"), &np);
    double *want = naive_forward(f.g, f.c, ids, (uint32_t)np), maxd = 0.0;
    const json_t *last = json_object_get(pr, "last_position_logits");
    for (size_t j = 0; j < V; j++) maxd = fmax(maxd, fabs(want[j] - num(json_array_get(last, j))));
    printf("%s: double-precision pass vs llama.cpp, last prompt logits: max abs diff %.3g\n",
           k_arch[i], maxd);
    assert_true(maxd < LOGIT_TOL);
    free(want);
    free(ids);
    unload(&f);
  }

  const char *mk = getenv("SK_MKMODEL");
  if (!mk) fail_msg("SK_MKMODEL is not set (meson sets it)");
  char *dir = sk_test_tmpdir();
  static const struct {
    const char *args, *desc;
    uint32_t q_dim;
  } cases[] = {
      {"--arch llama", "llama rope=norm", 64},
      {"--arch llama3", "llama rope=norm rope_freqs tied_output", 64},
      {"--arch qwen2", "qwen2 rope=neox keys=pairs-interleaved qkv_bias", 64},
      {"--arch qwen3", "qwen3 rope=neox keys=pairs-interleaved qk_norm", 64},
      {"--arch qwen3 --heads 4 --kv-heads 2 --head-dim 32",
       "qwen3 rope=neox keys=pairs-interleaved qk_norm", 128},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[512], cmd[1024];
    snprintf(path, sizeof path, "%s/m%zu.gguf", dir, i);
    snprintf(cmd, sizeof cmd, "'%s' --shape 260K --layers 2 --seed %zu %s -o '%s' 2>/dev/null",
             mk, i + 7, cases[i].args, path);
    assert_int_equal(system(cmd), 0);
    struct sk_gguf *g = NULL;
    struct sk_model *m = NULL;
    struct sk_error err = {0};
    if (sk_gguf_open(path, &g, &err) < 0 || sk_model_load(g, &m, &err) < 0)
      fail_msg("%s: %s", cases[i].args, err.message);
    char buf[128];
    assert_string_equal(sk_model_describe(m, buf, sizeof buf), cases[i].desc);
    assert_int_equal(sk_model_config(m)->q_dim, cases[i].q_dim);
    int32_t ids[24];
    stream_ids(ids, 24);
    double d = vs_naive(g, m, ids, 24);
    printf("sinkd-mkmodel %s: sinkd vs the double-precision pass, 24 tokens: max abs logit "
           "diff %.3g\n",
           cases[i].args, d);
    assert_true(d < LOGIT_TOL);
    sk_model_free(m);
    sk_gguf_close(g);
    unlink(path);
  }
  rmdir(dir);
  free(dir);
}

/* ---- batching ------------------------------------------------------------ */

/* 8 sessions of every policy (dense, streaming 4 + 20, h2o 12 + 12,
 * window 24; those that evict do so during the run; f32 and f16 caches)
 * each alone on the caller's thread, then all together in batched calls
 * on a pool of 2 threads, prompts in chunks of up to 3 beside the others'
 * decode rows: the same logits bit for bit (model.h), hence the same
 * greedy tokens. */
static void batch_check(const struct sk_model *m, const char *what) {
  enum { NS = 8, STEPS = 30 };
  struct sk_error err = {0};
  struct sk_pool *pool = NULL;
  assert_int_equal(sk_pool_new(2, &pool, &err), 0);
  struct sk_scratch *alone = NULL, *batch = NULL;
  assert_int_equal(sk_scratch_new(m, 32, 64, &alone, &err), 0);
  assert_int_equal(sk_scratch_new_pool(m, 32, 64, pool, &batch, &err), 0);
  static const struct sk_kv_params ps[4] = {
      {.policy = SK_POLICY_DENSE, .capacity = 64, .rope_scale = 1.0f},
      {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 20, .rope_scale = 1.0f},
      {.policy = SK_POLICY_H2O, .heavy = 12, .recent = 12, .rope_scale = 1.0f},
      {.policy = SK_POLICY_WINDOW, .window = 24, .rope_scale = 1.0f},
  };
  struct sk_kv *ka[NS], *kb[NS];
  int32_t prompt[NS][24], ta[NS][STEPS], tb[NS][STEPS];
  uint32_t plen[NS];
  float *la = malloc((size_t)NS * V * sizeof *la), *lb = malloc((size_t)NS * V * sizeof *lb);
  assert_true(la && lb);
  for (int i = 0; i < NS; i++) {
    struct sk_kv_shape shape = sk_model_kv_shape(m);
    shape.kv_type = i < 4 ? SK_KV_F32 : SK_KV_F16;
    assert_int_equal(sk_kv_new(shape, &ps[i % 4], &ka[i], &err), 0);
    assert_int_equal(sk_kv_new(shape, &ps[i % 4], &kb[i], &err), 0);
    plen[i] = 2 + (uint32_t)(i * 5) % 22;
    prompt[i][0] = 1;
    for (uint32_t j = 1; j < plen[i]; j++) prompt[i][j] = (int32_t)(3 + (i * 37 + j * 11) % 500);
  }
  for (int i = 0; i < NS; i++) {
    float *l = la + (size_t)i * V;
    step(m, alone, ka[i], prompt[i], plen[i], l, false);
    for (int t = 0; t < STEPS; t++) {
      ta[i][t] = 0;
      for (int32_t j = 1; j < V; j++)
        if (l[j] > l[ta[i][t]]) ta[i][t] = j;
      step(m, alone, ka[i], &ta[i][t], 1, l, false);
    }
  }
  uint32_t done[NS] = {0};
  int gen[NS] = {0};
  for (;;) {
    struct sk_seq seqs[NS];
    int32_t tok[NS];
    uint32_t n = 0;
    for (int i = 0; i < NS; i++) {
      const float *l = lb + (size_t)i * V;
      uint32_t c = 0;
      const int32_t *t = NULL;
      if (done[i] < plen[i]) {
        c = plen[i] - done[i] < 3 ? plen[i] - done[i] : 3;
        t = prompt[i] + done[i];
        done[i] += c;
      } else if (gen[i] < STEPS) {
        tok[i] = 0;
        for (int32_t j = 1; j < V; j++)
          if (l[j] > l[tok[i]]) tok[i] = j;
        tb[i][gen[i]++] = tok[i];
        c = 1;
        t = &tok[i];
      }
      if (!c) continue;
      uint64_t before = kb[i]->hdr->n_evicted;
      assert_int_equal(sk_kv_make_room(kb[i], c, NULL, &err), 0);
      seqs[n++] = (struct sk_seq){.kv = kb[i], .tokens = t, .n = c,
                                  .n_evicted = told_evicted(kb[i], before),
                                  .logits = lb + (size_t)i * V};
    }
    if (n == 0) break;
    if (sk_model_forward_batch(m, batch, seqs, n, &err) < 0) fail_msg("%s: %s", what, err.message);
  }
  for (int i = 0; i < NS; i++) {
    if (i % 4) assert_true(ka[i]->hdr->n_evicted > 0);
    assert_memory_equal(ta[i], tb[i], sizeof ta[i]);
    assert_memory_equal(la + (size_t)i * V, lb + (size_t)i * V, V * sizeof *la);
    sk_kv_free(ka[i]);
    sk_kv_free(kb[i]);
  }
  printf("%s: 8 sessions batched on 2 threads = each alone, bit for bit\n", what);
  free(la);
  free(lb);
  sk_scratch_free(alone);
  sk_scratch_free(batch);
  sk_pool_free(pool);
}

static void test_batching(void **state) {
  (void)state;
  for (size_t i = 0; i < N_ARCH; i++) {
    struct fx f;
    load(k_arch[i], &f);
    batch_check(f.m, k_arch[i]);
    unload(&f);
  }
  /* heads that do not split the embedding */
  const char *mk = getenv("SK_MKMODEL");
  if (!mk) fail_msg("SK_MKMODEL is not set (meson sets it)");
  char *dir = sk_test_tmpdir();
  char path[512], cmd[1024];
  snprintf(path, sizeof path, "%s/q.gguf", dir);
  snprintf(cmd, sizeof cmd,
           "'%s' --arch qwen3 --shape 260K --layers 2 --heads 4 --kv-heads 2 --head-dim 32 "
           "-o '%s' 2>/dev/null",
           mk, path);
  assert_int_equal(system(cmd), 0);
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct sk_error err = {0};
  if (sk_gguf_open(path, &g, &err) < 0 || sk_model_load(g, &m, &err) < 0)
    fail_msg("%s", err.message);
  batch_check(m, "qwen3 with q_dim 128 on a width of 64");
  sk_model_free(m);
  sk_gguf_close(g);
  unlink(path);
  rmdir(dir);
  free(dir);
}

/* ---- refusals ----------------------------------------------------------- */

/* The qwen2 fixture with general.architecture's value overwritten (same
 * length): refused, naming it and the architectures sinkd runs. */
static void test_refused_architecture(void **state) {
  (void)state;
  char *path = fixture_path("qwen2");
  size_t len = 0;
  unsigned char *buf = sk_test_read_file(path, &len);
  assert_non_null(buf);
  static const char key[] = "general.architecture";
  unsigned char *p = memmem(buf, len, key, sizeof key - 1);
  assert_non_null(p);
  p += sizeof key - 1;
  uint32_t type;
  uint64_t slen;
  memcpy(&type, p, 4);
  memcpy(&slen, p + 4, 8);
  assert_int_equal(type, SK_GGUF_STRING);
  assert_int_equal(slen, 5);
  assert_memory_equal(p + 12, "qwen2", 5);
  static const char *const others[] = {"gemma", "phi3x", "qwen4"};
  for (size_t i = 0; i < 3; i++) {
    memcpy(p + 12, others[i], 5);
    struct sk_gguf *g = NULL;
    struct sk_model *m = NULL;
    struct sk_error err = {0};
    assert_int_equal(sk_gguf_open_buffer(buf, len, &g, &err), 0);
    assert_int_equal(sk_model_load(g, &m, &err), -SK_ERR_BAD_MODEL);
    char want[96];
    snprintf(want, sizeof want, "general.architecture is \"%s\"", others[i]);
    if (!strstr(err.message, want) || !strstr(err.message, "llama, qwen2, qwen3"))
      fail_msg("message \"%s\" lacks \"%s\" or the list", err.message, want);
    sk_gguf_close(g);
  }
  free(buf);
  free(path);
}

/* general.name goes into logs, the systemd status line and hello
 * replies: control characters (C0, DEL, C1) and bytes of no UTF-8
 * character show as '?', whole characters stay. */
static void test_name_sanitized(void **state) {
  (void)state;
  char *path = fixture_path("qwen2");
  size_t len = 0;
  unsigned char *buf = sk_test_read_file(path, &len);
  assert_non_null(buf);
  static const char key[] = "general.name";
  unsigned char *p = memmem(buf, len, key, sizeof key - 1);
  assert_non_null(p);
  p += sizeof key - 1;
  uint64_t slen;
  memcpy(&slen, p + 4, 8);
  assert_int_equal(slen, 31);
  static const char evil[31] = "x\nREADY=1\x1b[2J\xc2\x9b\xe2\x82\xac\xff\xed\xa0\x80" "abcdefghi";
  memcpy(p + 12, evil, sizeof evil);
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open_buffer(buf, len, &g, &err), 0);
  assert_int_equal(sk_model_load(g, &m, &err), 0);
  assert_string_equal(sk_model_config(m)->name,
                      "x?READY=1?[2J?" "?\xe2\x82\xac?" "?" "?" "?abcdefghi");
  sk_model_free(m);
  sk_gguf_close(g);
  free(buf);
  free(path);
}

/* Replaces every `from` in the header of buf (before the tensor data)
 * with `to` (same length). */
static void relabel(unsigned char *buf, size_t len, const char *from, const char *to) {
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open_buffer(buf, len, &g, &err), 0);
  size_t end = (size_t)sk_gguf_data_offset(g), n = strlen(from);
  sk_gguf_close(g);
  assert_int_equal(strlen(to), n);
  for (unsigned char *p = buf; (p = memmem(p, end - (size_t)(p - buf), from, n)); p += n)
    memcpy(p, to, n);
}

static void expect_refused(const unsigned char *buf, size_t len, const char *needle) {
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open_buffer(buf, len, &g, &err), 0);
  int rc = sk_model_load(g, &m, &err);
  if (rc == 0) fail_msg("loaded; expected \"%s\"", needle);
  assert_int_equal(rc, -SK_ERR_BAD_MODEL);
  if (!strstr(err.message, needle)) fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
  sk_gguf_close(g);
}

/* One architecture's tensors in a file of another (the fixtures with
 * their architecture and key prefix renamed), and a value length other
 * than the key length. */
static void test_refused_tensors(void **state) {
  (void)state;
  static const struct {
    const char *file, *from, *to, *needle;
  } cases[] = {
      {"qwen2", "qwen2", "qwen3", "tensor blk.0.attn_q.bias is not used by architecture qwen3"},
      {"qwen3", "qwen3", "qwen2", "tensor blk.0.attn_q.bias is missing"},
      {"llama3", "llama", "qwen2", "tensor rope_freqs.weight is not used by architecture qwen2"},
      {"qwen3", "qwen3", "llama",
       "tensor blk.0.attn_q_norm.weight is not used by architecture llama"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *path = fixture_path(cases[i].file);
    size_t len = 0;
    unsigned char *buf = sk_test_read_file(path, &len);
    assert_non_null(buf);
    relabel(buf, len, cases[i].from, cases[i].to);
    expect_refused(buf, len, cases[i].needle);
    free(buf);
    free(path);
  }
  char *path = fixture_path("qwen3");
  size_t len = 0;
  unsigned char *buf = sk_test_read_file(path, &len);
  static const char key[] = "qwen3.attention.value_length";
  unsigned char *p = memmem(buf, len, key, sizeof key - 1);
  assert_non_null(p);
  uint32_t type, v = 32;
  memcpy(&type, p + sizeof key - 1, 4);
  assert_int_equal(type, SK_GGUF_UINT32);
  memcpy(p + sizeof key - 1 + 4, &v, 4);
  expect_refused(buf, len, "qwen3.attention.value_length 32 differs from the key length 64");
  free(buf);
  free(path);
}

/* rope_freqs.weight divides every angle: NaN, 0 and divisors so small
 * that angles overflow (NaN logits) are refused, naming the element;
 * 2^-32, the smallest accepted, runs with finite logits. */
static void test_rope_freqs_values(void **state) {
  (void)state;
  char *path = fixture_path("llama3");
  size_t len = 0;
  unsigned char *buf = sk_test_read_file(path, &len);
  assert_non_null(buf);
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open_buffer(buf, len, &g, &err), 0);
  const struct sk_gguf_tensor *t = sk_gguf_find_tensor(g, "rope_freqs.weight");
  assert_non_null(t);
  assert_int_equal(t->type, SK_GGML_F32);
  size_t off = (size_t)((const unsigned char *)t->data - buf);
  assert_true(off + 12 <= len);
  sk_gguf_close(g);
  static const struct {
    float v;
    const char *needle;
  } bad[] = {
      {NAN, "rope_freqs.weight[2] is nan, expected a finite value >= 2^-32"},
      {0.0f, "rope_freqs.weight[2] is 0, expected"},
      {-1.0f, "rope_freqs.weight[2] is -1, expected"},
      {0x1p-33f, "rope_freqs.weight[2] is 1.16415e-10, expected"},
      {1e-44f, "rope_freqs.weight[2] is 9.80909e-45, expected"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(buf + off + 8, &bad[i].v, 4);
    expect_refused(buf, len, bad[i].needle);
  }
  float least = 0x1p-32f;
  memcpy(buf + off + 8, &least, 4);
  assert_int_equal(sk_gguf_open_buffer(buf, len, &g, &err), 0);
  struct sk_model *m = NULL;
  assert_int_equal(sk_model_load(g, &m, &err), 0);
  const struct sk_model_config *c = sk_model_config(m);
  struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = 8, .rope_scale = 1.0f};
  struct sk_kv *kv = NULL;
  struct sk_scratch *sc = NULL;
  float *logits = malloc(c->n_vocab * sizeof *logits);
  assert_non_null(logits);
  assert_int_equal(sk_kv_new(sk_model_kv_shape(m), &p, &kv, &err), 0);
  assert_int_equal(sk_scratch_new(m, 8, 8, &sc, &err), 0);
  const int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  assert_int_equal(sk_model_forward(m, sc, kv, toks, 8, logits, false, &err), 0);
  for (uint32_t i = 0; i < c->n_vocab; i++) assert_true(isfinite(logits[i]));
  free(logits);
  sk_scratch_free(sc);
  sk_kv_free(kv);
  sk_model_free(m);
  sk_gguf_close(g);
  free(buf);
  free(path);
}

int main(void) {
  /* SK_KERNEL runs the suite on one kernel variant (meson runs it on the
   * portable one too); before any model loads, which packs for it. */
  const char *kernel = getenv("SK_KERNEL");
  struct sk_error err = {0};
  if (kernel && sk_kernels_select(kernel, &err) < 0) {
    fprintf(stderr, "%s\n", err.message);
    return 1;
  }
  printf("kernels: %s\n", sk_kernels_name());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_and_description),
      cmocka_unit_test(test_llama3_reference),
      cmocka_unit_test(test_qwen2_reference),
      cmocka_unit_test(test_qwen3_reference),
      cmocka_unit_test(test_qwen2_q8_0_reference),
      cmocka_unit_test(test_neox_cache),
      cmocka_unit_test(test_naive_and_mkmodel),
      cmocka_unit_test(test_batching),
      cmocka_unit_test(test_daemon_qwen3),
      cmocka_unit_test(test_refused_architecture),
      cmocka_unit_test(test_refused_tensors),
      cmocka_unit_test(test_name_sanitized),
      cmocka_unit_test(test_rope_freqs_values),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
