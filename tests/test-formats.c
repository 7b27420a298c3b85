/* Every weight block format against llama.cpp, on the d256 fixtures
 * (../shared/models/fixtures, references in ../shared/reference/fixtures;
 * see that folder's README): the 14 llama-d256 types and the llama3,
 * qwen2 and qwen3 files with llama-quantize's mixes:
 *
 *   - exact formats: each file dequantized by sinkd's own decoders
 *     (sk_model_load_options.dequantize) and run through the F32 forward
 *     pass gives llama.cpp's logits for the F32 twin of the file
 *     (dequantized/<name>.json; the main reference for the F32 file)
 *     within 1e-4: all logits at the last prompt position and the top-10
 *     of every step, fed llama.cpp's tokens;
 *   - quantized products: the file's weights as they are (f32 KV cache),
 *     fed llama.cpp's tokens step by step, on every kernel variant this
 *     CPU runs: the argmax equals llama.cpp's wherever llama.cpp's own
 *     top-2 gap is >= 0.25, and the top-10 logits are within 0.5 of the
 *     main reference (F32, F16, BF16: within 1e-3 of the F32-math
 *     reference, dequantized/ for F16 and BF16).
 */
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
#include "model/quant.h"
#include "testutil.h"

static const char *const fixtures[] = {
    "llama-d256-F32",    "llama-d256-F16",    "llama-d256-BF16",   "llama-d256-Q8_0",
    "llama-d256-Q6_K",   "llama-d256-Q5_K_M", "llama-d256-Q5_1",   "llama-d256-Q5_0",
    "llama-d256-Q4_K_M", "llama-d256-Q4_K_S", "llama-d256-Q4_1",   "llama-d256-Q4_0",
    "llama-d256-IQ4_NL", "llama-d256-Q2_K",
    /* the architectures, with llama.cpp's mixes (tied Q6_K embeddings) */
    "llama3-d256-F32",   "llama3-d256-Q4_K_M", "qwen2-d256-F32",    "qwen2-d256-Q8_0",
    "qwen2-d256-Q4_K_M", "qwen3-d256-F32",     "qwen3-d256-Q4_K_M",
};
#define N_FIXTURES (sizeof fixtures / sizeof fixtures[0])

static const char *const variants[] = {"generic", "avx2", "avx2-vnni", "avx512-vnni", "amx"};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

static bool is_float_type(const char *name) {
  return strstr(name, "-F32") || strstr(name, "-F16") || strstr(name, "-BF16");
}

static json_t *load_json(const char *rel) {
  char *path = sk_test_shared_path(rel);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) fail_msg("%s: %s", path, je.text);
  free(path);
  return j;
}

/* The reference of a fixture: dequantized/ or the main one. */
static json_t *load_ref(const char *name, bool dequantized) {
  char rel[256];
  snprintf(rel, sizeof rel, "reference/fixtures/%s%s.json", dequantized ? "dequantized/" : "",
           name);
  return load_json(rel);
}

struct run {
  struct sk_gguf *g;
  struct sk_model *m;
  struct sk_scratch *s;
  uint32_t V;
};

static void run_open(struct run *r, const char *name, bool dequantize) {
  char rel[256];
  snprintf(rel, sizeof rel, "models/fixtures/%s.gguf", name);
  char *path = sk_test_shared_path(rel);
  struct sk_error err = {0};
  if (sk_gguf_open(path, &r->g, &err) < 0) fail_msg("open %s: %s", path, err.message);
  free(path);
  struct sk_model_load_options o = {.dequantize = dequantize};
  if (sk_model_load_opts(r->g, &o, &r->m, &err) < 0) fail_msg("load %s: %s", name, err.message);
  if (sk_scratch_new(r->m, 64, 512, &r->s, &err) < 0) fail_msg("scratch: %s", err.message);
  r->V = sk_model_config(r->m)->n_vocab;
}

static void run_close(struct run *r) {
  sk_scratch_free(r->s);
  sk_model_free(r->m);
  sk_gguf_close(r->g);
}

/* Feeds tok[0..n) to kv and returns the last position's logits. */
static void feed(struct run *r, struct sk_kv *kv, const int32_t *tok, uint32_t n, float *logits) {
  struct sk_error err = {0};
  if (sk_kv_make_room(kv, n, NULL, &err) < 0) fail_msg("make_room: %s", err.message);
  if (sk_model_forward(r->m, r->s, kv, tok, n, logits, false, &err) < 0)
    fail_msg("forward: %s", err.message);
}

struct diff {
  double last;   /* largest |d| over the last prompt position's logits */
  double top10;  /* largest |d| over the top-10 of every step */
  uint32_t argmax_checked, argmax_wrong;
};

/* Runs every prompt of ref, teacher-forced with its generated ids, and
 * measures the differences (argmax checked where the gap >= min_gap). */
static void compare(struct run *r, const json_t *ref, double min_gap, struct diff *d) {
  memset(d, 0, sizeof *d);
  const json_t *prompts = json_object_get(ref, "prompts");
  assert_true(json_array_size(prompts) == 3);
  float *logits = malloc(r->V * sizeof *logits);
  assert_non_null(logits);
  for (size_t p = 0; p < json_array_size(prompts); p++) {
    const json_t *pr = json_array_get(prompts, p);
    size_t n_ids, n_gen;
    int32_t *ids = sk_test_json_ids(json_object_get(pr, "prompt_ids"), &n_ids);
    int32_t *gen = sk_test_json_ids(json_object_get(pr, "generated_ids"), &n_gen);
    const json_t *last = json_object_get(pr, "last_position_logits");
    const json_t *steps = json_object_get(pr, "steps");
    assert_int_equal(json_array_size(last), r->V);
    assert_int_equal(json_array_size(steps), n_gen);
    struct sk_kv_params kp = {.policy = SK_POLICY_DENSE, .capacity = 512, .rope_scale = 1.0f};
    struct sk_kv_shape shape = sk_model_kv_shape(r->m);
    shape.kv_type = SK_KV_F32;
    struct sk_kv *kv = NULL;
    struct sk_error err = {0};
    if (sk_kv_new(shape, &kp, &kv, &err) < 0) fail_msg("kv: %s", err.message);
    feed(r, kv, ids, (uint32_t)n_ids, logits);
    for (uint32_t v = 0; v < r->V; v++) {
      double dd = fabs((double)logits[v] - json_number_value(json_array_get(last, v)));
      if (dd > d->last) d->last = dd;
    }
    for (size_t st = 0; st < n_gen; st++) {
      if (st > 0) feed(r, kv, &gen[st - 1], 1, logits);
      const json_t *e = json_array_get(steps, st);
      const json_t *top = json_object_get(e, "top10");
      for (size_t k = 0; k < json_array_size(top); k++) {
        const json_t *pair = json_array_get(top, k);
        int id = (int)json_integer_value(json_array_get(pair, 0));
        double dd = fabs((double)logits[id] - json_number_value(json_array_get(pair, 1)));
        if (dd > d->top10) d->top10 = dd;
      }
      if (json_number_value(json_object_get(e, "top1_gap")) >= min_gap) {
        uint32_t b = 0;
        for (uint32_t v = 1; v < r->V; v++)
          if (logits[v] > logits[b]) b = v;
        d->argmax_checked++;
        if ((int32_t)b != gen[st]) d->argmax_wrong++;
      }
    }
    sk_kv_free(kv);
    free(ids);
    free(gen);
  }
  free(logits);
}

/* Dequantized by sinkd, F32 math: llama.cpp's F32 twin within 1e-4. */
static void test_dequantized_exact(void **state) {
  (void)state;
  for (size_t f = 0; f < N_FIXTURES; f++) {
    const bool f32 = strstr(fixtures[f], "-F32") != NULL;
    json_t *ref = load_ref(fixtures[f], !f32);
    struct run r;
    run_open(&r, fixtures[f], true);
    assert_string_equal(sk_model_weight_type(r.m), "f32");
    struct diff d;
    compare(&r, ref, INFINITY, &d);
    printf("%-20s dequantized: last position %.3g, top-10 %.3g\n", fixtures[f], d.last, d.top10);
    if (!(d.last <= 1e-4 && d.top10 <= 1e-4))
      fail_msg("%s dequantized: logits differ by %.3g / %.3g from llama.cpp's F32 twin",
               fixtures[f], d.last, d.top10);
    run_close(&r);
    json_decref(ref);
  }
}

/* The weights as they are, on every variant this CPU runs. */
static void test_quantized_products(void **state) {
  (void)state;
  for (size_t v = 0; v < N_VARIANTS; v++) {
    if (!sk_kernels_supported(variants[v])) {
      printf("kernel %s: not supported by this CPU, skipped\n", variants[v]);
      continue;
    }
    struct sk_error err = {0};
    assert_int_equal(sk_kernels_select(variants[v], &err), 0);
    for (size_t f = 0; f < N_FIXTURES; f++) {
      const bool fl = is_float_type(fixtures[f]);
      const bool f32 = strstr(fixtures[f], "-F32") != NULL;
      json_t *ref = load_ref(fixtures[f], false);
      json_t *ref_f = fl && !f32 ? load_ref(fixtures[f], true) : NULL;
      struct run r;
      run_open(&r, fixtures[f], false);
      struct diff d, df;
      compare(&r, ref, 0.25, &d);
      const double tol = fl ? 1e-3 : 0.5;
      if (ref_f) compare(&r, ref_f, 0.25, &df);
      else df = d;
      printf("%-11s %-20s %-6s vs llama.cpp: last position %.3g, top-10 %.3g, argmax %u/%u%s\n",
             variants[v], fixtures[f], sk_model_weight_type(r.m), df.last, df.top10,
             d.argmax_checked - d.argmax_wrong, d.argmax_checked,
             ref_f ? " (F32-math reference)" : "");
      if (d.argmax_wrong)
        fail_msg("%s %s: %u of %u clear argmaxes differ from llama.cpp's", variants[v],
                 fixtures[f], d.argmax_wrong, d.argmax_checked);
      if (!(df.top10 <= tol) || (fl && !(df.last <= tol)))
        fail_msg("%s %s: logits differ by %.3g (last) / %.3g (top-10), tolerance %g",
                 variants[v], fixtures[f], df.last, df.top10, tol);
      run_close(&r);
      json_decref(ref);
      if (ref_f) json_decref(ref_f);
    }
  }
  struct sk_error err = {0};
  assert_int_equal(sk_kernels_select("auto", &err), 0);
}

/* A type sinkd cannot run is refused by its ggml name, naming the tensor
 * and the types sinkd runs: the F32 fixture with one tensor's type field
 * changed to iq2_xxs (ggml type 16, blocks of 256 whose 66 bytes fit in
 * the F32 data). */
static void test_unsupported_type_named(void **state) {
  (void)state;
  char *path = sk_test_shared_path("models/fixtures/llama-d256-F32.gguf");
  size_t len = 0;
  uint8_t *buf = sk_test_read_file(path, &len);
  assert_non_null(buf);
  free(path);
  /* the tensor info of blk.0.attn_q.weight: name, n_dims, ne[n_dims], type */
  const char *name = "blk.0.attn_q.weight";
  uint8_t *p = NULL;
  for (size_t i = 8; i + strlen(name) < len; i++)
    if (memcmp(buf + i, name, strlen(name)) == 0 && buf[i - 8] == strlen(name)) {
      p = buf + i + strlen(name);
      break;
    }
  assert_non_null(p);
  uint32_t nd;
  memcpy(&nd, p, 4);
  assert_int_equal(nd, 2);
  uint8_t *type = p + 4 + 8 * nd;
  uint32_t t = SK_GGML_IQ2_XXS;
  memcpy(type, &t, 4);
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open_buffer(buf, len, &g, &err), 0);
  assert_int_equal(sk_model_load(g, &m, &err), -SK_ERR_BAD_MODEL);
  assert_string_equal(err.message,
                      "tensor blk.0.attn_q.weight has type iq2_xxs; sinkd runs f32, f16, bf16, "
                      "q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs");
  assert_null(m);
  sk_gguf_close(g);
  free(buf);
}

/* The weights' memory as stats reports it: a quantized file's matrices
 * stay in the mapping unless the selected kernels repack their type for
 * products (avx512-vnni and amx: Q4_K and Q6_K), the token embeddings
 * always (tied: repacked as the output too); a dequantized load holds 4
 * bytes per weight of its own. */
static void test_weight_memory(void **state) {
  (void)state;
  /* whether the selected kernels repack K-quants: a one-block probe */
  uint8_t blk[144] = {0};
  struct sk_wmat probe = {.type = SK_GGML_Q4_K, .rows = 1, .cols = 256, .row_bytes = 144,
                          .data = blk};
  void *mem = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_kernels_pack(&probe, &mem, &err), 0);
  const bool packs_k = mem != NULL;
  free(mem);
  for (int dq = 0; dq < 2; dq++) {
    struct run r;
    run_open(&r, "llama-d256-Q4_K_M", dq);
    const bool tied = sk_gguf_find_tensor(r.g, "output.weight") == NULL;
    uint64_t mapped = 0, repacked = 0, elems = 0;
    for (uint64_t i = 0; i < sk_gguf_n_tensors(r.g); i++) {
      const struct sk_gguf_tensor *t = sk_gguf_tensor(r.g, i);
      if (t->n_dims != 2) continue;
      const bool embd = t->name.len == strlen("token_embd.weight") &&
                        memcmp(t->name.ptr, "token_embd.weight", t->name.len) == 0;
      const bool packed = packs_k && (t->type == SK_GGML_Q4_K || t->type == SK_GGML_Q6_K) &&
                          (!embd || tied);
      if (embd || !packed) mapped += t->n_bytes;
      if (packed) repacked += t->n_bytes;
      elems += t->n_elements;
    }
    printf("%s: mapped %llu, repacked %llu bytes\n", dq ? "dequantized" : "as stored",
           (unsigned long long)sk_model_mapped_bytes(r.m),
           (unsigned long long)sk_model_repacked_bytes(r.m));
    assert_int_equal(sk_model_mapped_bytes(r.m), dq ? 0 : mapped);
    assert_int_equal(sk_model_repacked_bytes(r.m), dq ? 4 * elems : repacked);
    run_close(&r);
  }
}

/* sinkd-mkmodel (env SK_MKMODEL) writes every type, and the presets with
 * llama-quantize's mix: each file loads, holds the types it should, and
 * runs to finite logits that agree with its own dequantized F32 run
 * (the activation rounding aside). */
static void test_mkmodel_types(void **state) {
  (void)state;
  const char *mk = getenv("SK_MKMODEL");
  if (!mk) fail_msg("SK_MKMODEL is not set (meson sets it)");
  char *dir = sk_test_tmpdir();
  const char *types[] = {"f32",  "f16",  "bf16", "q4_0", "q4_1",   "q5_0",   "q5_1",   "q8_0",
                         "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",   "iq4_nl", "iq4_xs", "q4_K_M",
                         "q5_K_M"};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    char path[512], cmd[1024];
    snprintf(path, sizeof path, "%s/m-%s.gguf", dir, types[i]);
    snprintf(cmd, sizeof cmd,
             "'%s' --shape 260K --dim 256 --hidden 768 --layers 2 --heads 4 --kv-heads 2 "
             "--type %s -o '%s' 2>/dev/null",
             mk, types[i], path);
    assert_int_equal(system(cmd), 0);
    struct sk_error err = {0};
    struct sk_gguf *g = NULL;
    if (sk_gguf_open(path, &g, &err) < 0) fail_msg("%s: %s", path, err.message);
    /* the types: the preset's mix, the output at q6_K below 6 bits */
    const bool preset = strstr(types[i], "_M") != NULL;
    const char *want = preset ? (types[i][1] == '4' ? "q4_K" : "q5_K") : types[i];
    const bool low = strcmp(want, "f32") && strcmp(want, "f16") && strcmp(want, "bf16") &&
                     strcmp(want, "q8_0") && strcmp(want, "q6_K");
    assert_string_equal(sk_ggml_type_name(sk_gguf_find_tensor(g, "blk.0.attn_v.weight")->type),
                        want);
    assert_string_equal(sk_ggml_type_name(sk_gguf_find_tensor(g, "blk.1.attn_v.weight")->type),
                        preset ? "q6_K" : want);
    assert_string_equal(sk_ggml_type_name(sk_gguf_find_tensor(g, "blk.1.ffn_down.weight")->type),
                        preset ? "q6_K" : want);
    assert_string_equal(sk_ggml_type_name(sk_gguf_find_tensor(g, "output.weight")->type),
                        low ? "q6_K" : want);
    const int32_t prompt[] = {1, 300, 301, 302, 303, 304};
    float *lq = NULL, *ld = NULL;
    uint32_t V = 0;
    for (int dq = 0; dq < 2; dq++) {
      struct sk_model *m = NULL;
      struct sk_model_load_options o = {.dequantize = dq};
      if (sk_model_load_opts(g, &o, &m, &err) < 0) fail_msg("load %s: %s", types[i], err.message);
      struct run r = {.g = g, .m = m, .V = sk_model_config(m)->n_vocab};
      if (sk_scratch_new(m, 64, 64, &r.s, &err) < 0) fail_msg("scratch: %s", err.message);
      V = r.V;
      struct sk_kv_params kp = {.policy = SK_POLICY_DENSE, .capacity = 64, .rope_scale = 1.0f};
      struct sk_kv_shape shape = sk_model_kv_shape(m);
      shape.kv_type = SK_KV_F32;
      struct sk_kv *kv = NULL;
      if (sk_kv_new(shape, &kp, &kv, &err) < 0) fail_msg("kv: %s", err.message);
      float *l = malloc(V * sizeof *l);
      feed(&r, kv, prompt, 6, l);
      if (dq) ld = l;
      else lq = l;
      sk_kv_free(kv);
      sk_scratch_free(r.s);
      sk_model_free(m);
    }
    double maxd = 0.0, lo = INFINITY, hi = -INFINITY;
    for (uint32_t v = 0; v < V; v++) {
      assert_true(isfinite(lq[v]) && isfinite(ld[v]));
      maxd = fmax(maxd, fabs((double)lq[v] - ld[v]));
      lo = fmin(lo, ld[v]);
      hi = fmax(hi, ld[v]);
    }
    printf("mkmodel %-7s logits spread %.3g, quantized vs dequantized %.3g\n", types[i], hi - lo,
           maxd);
    assert_true(hi - lo > 0.1);
    assert_true(maxd <= 0.05 * (hi - lo));
    free(lq);
    free(ld);
    sk_gguf_close(g);
    remove(path);
  }
  rmdir(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unsupported_type_named),
      cmocka_unit_test(test_weight_memory),
      cmocka_unit_test(test_mkmodel_types),
      cmocka_unit_test(test_dequantized_exact),
      cmocka_unit_test(test_quantized_products),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
