/* Contextual sparsity of the MLP (sparse.h) on stories260K: threshold 0
 * gives the dense logits, a sparse sequence computes the same bits alone,
 * batched with dense ones and on any pool; calibration thresholds reach
 * their levels and the calibration file is bound to the fingerprint. */
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
#include "session/kvcache.h"
#include "model/model.h"
#include "model/pool.h"
#include "model/sparse.h"
#include "session/store.h"
#include "testutil.h"
#include "model/tokenizer.h"

#define N_PROMPT 40u  /* prefill tokens (three fit in one CTX batch) */
#define N_DECODE 24u  /* decode steps after them */
#define CTX 128u

static struct {
  struct sk_gguf *g;
  struct sk_model *m;
  const struct sk_model_config *c;
  int32_t *tok;  /* the start of stories-sampled.txt */
  size_t n_tok;
  struct sk_sparse_calib calib; /* levels 0.1 ... 0.7 over the text */
  uint8_t fp[16];
} fx;

static void probe(void *user, uint32_t layer, const float *gate, uint32_t n, uint32_t hidden) {
  (void)hidden;
  sk_sparse_collect_add(user, layer, gate, n);
}

static struct sk_kv *new_kv(void) {
  struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = CTX, .rope_scale = 1.0f};
  struct sk_kv *kv = NULL;
  struct sk_error err = {0};
  if (sk_kv_new(sk_model_kv_shape(fx.m), &p, &kv, &err) < 0) fail_msg("%s", err.message);
  return kv;
}

static int setup(void **state) {
  (void)state;
  struct sk_error err = {0};
  struct sk_tokenizer *t = NULL;
  if (sk_gguf_open(sk_test_model_path(), &fx.g, &err) < 0 ||
      sk_model_load(fx.g, &fx.m, &err) < 0 || sk_tokenizer_load(fx.g, &t, &err) < 0 ||
      sk_model_sparse_prepare(fx.m, &err) < 0) {
    fprintf(stderr, "%s\n", err.message);
    return -1;
  }
  fx.c = sk_model_config(fx.m);
  char *path = sk_test_shared_path("data/stories-sampled.txt");
  size_t len = 0;
  char *text = sk_test_read_file(path, &len);
  free(path);
  if (!text) return -1;
  if (len > 8000) len = 8000;
  int rc = sk_tokenizer_encode(t, text, len, true, &fx.tok, &fx.n_tok, &err);
  free(text);
  sk_tokenizer_free(t);
  if (rc < 0 || fx.n_tok < 4 * CTX) return -1;
  sk_store_fingerprint(fx.g, fx.fp);

  /* Calibration: dense passes over windows of CTX tokens, the probe
   * collecting every gate value. */
  struct sk_sparse_collect *col = NULL;
  const uint32_t n_win = (uint32_t)(fx.n_tok / CTX);
  if (sk_sparse_collect_new(fx.c->n_layer, fx.c->hidden_dim, (uint64_t)n_win * CTX, 1u << 20,
                            &col, &err) < 0)
    return -1;
  struct sk_scratch *s = NULL;
  if (sk_scratch_new(fx.m, CTX, CTX, &s, &err) < 0) return -1;
  sk_scratch_set_gate_probe(s, probe, col);
  for (uint32_t w = 0; w < n_win; w++) {
    struct sk_kv *kv = new_kv();
    if (sk_model_forward(fx.m, s, kv, fx.tok + (size_t)w * CTX, CTX, NULL, false, &err) < 0)
      return -1;
    sk_kv_free(kv);
  }
  sk_scratch_free(s);
  const float levels[] = SK_SPARSE_DEFAULT_LEVELS;
  rc = sk_sparse_collect_thresholds(col, levels, sizeof levels / sizeof levels[0], &fx.calib,
                                    &err);
  sk_sparse_collect_free(col);
  memcpy(fx.calib.model_fp, fx.fp, 16);
  return rc;
}

static int teardown(void **state) {
  (void)state;
  sk_sparse_calib_free(&fx.calib);
  free(fx.tok);
  sk_model_free(fx.m);
  sk_gguf_close(fx.g);
  return 0;
}

/* Runs N_PROMPT tokens then N_DECODE single tokens of the text, writing
 * every row's logits to out ((N_PROMPT + N_DECODE), n_vocab). */
static void run(struct sk_scratch *s, const float *thr, float *out, uint64_t *kept_sum) {
  struct sk_kv *kv = new_kv();
  struct sk_error err = {0};
  const uint32_t V = fx.c->n_vocab;
  struct sk_seq q = {.kv = kv, .tokens = fx.tok, .n = N_PROMPT, .logits = out,
                     .all_logits = true, .sparse_thr = thr};
  assert_int_equal(sk_model_forward_batch(fx.m, s, &q, 1, &err), 0);
  for (uint32_t i = 0; i < N_DECODE; i++) {
    q = (struct sk_seq){.kv = kv, .tokens = fx.tok + N_PROMPT + i, .n = 1,
                        .logits = out + (size_t)(N_PROMPT + i) * V, .sparse_thr = thr};
    assert_int_equal(sk_model_forward_batch(fx.m, s, &q, 1, &err), 0);
    const uint64_t *kept;
    uint32_t rows;
    assert_true(sk_scratch_sparse(s, 0, &kept, &rows));
    assert_int_equal(rows, thr ? 1 : 0);
    for (uint32_t l = 0; kept_sum && l < fx.c->n_layer; l++) kept_sum[l] += kept[l];
  }
  sk_kv_free(kv);
}

static void test_threshold_zero_is_dense(void **state) {
  (void)state;
  const size_t nl = (size_t)(N_PROMPT + N_DECODE) * fx.c->n_vocab;
  float *dense = malloc(nl * sizeof *dense), *sparse = malloc(nl * sizeof *sparse);
  float *zero = calloc(fx.c->n_layer, sizeof *zero);
  uint64_t *kept = calloc(fx.c->n_layer, sizeof *kept);
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(fx.m, CTX, CTX, &s, &err), 0);
  run(s, NULL, dense, NULL);
  run(s, zero, sparse, kept);
  double worst = 0.0;
  for (size_t i = 0; i < nl; i++) worst = fmax(worst, fabs((double)dense[i] - sparse[i]));
  printf("threshold 0: max |sparse - dense| logit %.3g over %zu logits\n", worst, nl);
  assert_true(worst <= 1e-5);
  /* every neuron kept (no gate is exactly 0), so the step reads what the
   * dense step reads: F32 down_t rows are as long as down's columns */
  double mean[64];
  for (uint32_t l = 0; l < fx.c->n_layer; l++) {
    assert_int_equal(kept[l], (uint64_t)N_DECODE * fx.c->hidden_dim);
    mean[l] = (double)kept[l] / N_DECODE;
  }
  assert_true(sk_model_sparse_step_bytes(fx.m, mean) == (double)sk_model_weight_bytes(fx.m));
  /* the copy: one F32 row of dim per neuron per layer */
  assert_int_equal(sk_model_sparse_bytes(fx.m),
                   (uint64_t)fx.c->n_layer * fx.c->hidden_dim * fx.c->dim * sizeof(float));
  sk_scratch_free(s);
  free(dense);
  free(sparse);
  free(zero);
  free(kept);
}

/* A sparse sequence alone, then in the middle of two dense ones, one
 * forward call per step: its logits have the same bits, and so do the
 * dense ones' against a dense run alone; also on a pool of 3 threads. */
static void test_batch_mixed_same_bits(void **state) {
  (void)state;
  const float *thr = sk_sparse_calib_find(&fx.calib, 0.5f);
  assert_non_null(thr);
  const uint32_t V = fx.c->n_vocab, steps = N_PROMPT + N_DECODE;
  const size_t nl = (size_t)steps * V;
  float *alone = malloc(nl * sizeof(float)), *dense_alone = malloc(nl * sizeof(float));
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(fx.m, CTX, CTX, &s, &err), 0);
  run(s, thr, alone, NULL);
  run(s, NULL, dense_alone, NULL);

  struct sk_pool *pool = NULL;
  assert_int_equal(sk_pool_new(3, &pool, &err), 0);
  struct sk_scratch *sp = NULL;
  assert_int_equal(sk_scratch_new_pool(fx.m, 3 * CTX, CTX, pool, &sp, &err), 0);
  struct sk_scratch *both[2] = {s, sp};
  for (int k = 0; k < 2; k++) {
    struct sk_kv *kv[3] = {new_kv(), new_kv(), new_kv()};
    float *out[3];
    for (int j = 0; j < 3; j++) out[j] = malloc(nl * sizeof(float));
    /* the dense ones read other text, the sparse one its own */
    const int32_t *src[3] = {fx.tok + 2 * CTX, fx.tok, fx.tok};
    for (uint32_t i = 0; i < steps;) {
      const uint32_t n = i == 0 ? N_PROMPT : 1;
      struct sk_seq q[3];
      for (int j = 0; j < 3; j++)
        q[j] = (struct sk_seq){.kv = kv[j], .tokens = src[j] + i, .n = n,
                               .logits = out[j] + (size_t)i * V, .all_logits = n > 1,
                               .sparse_thr = j == 1 ? thr : NULL};
      if (sk_model_forward_batch(fx.m, both[k], q, 3, &err) < 0) fail_msg("%s", err.message);
      const uint64_t *kept;
      uint32_t rows;
      assert_true(sk_scratch_sparse(both[k], 1, &kept, &rows));
      assert_int_equal(rows, n);
      assert_true(sk_scratch_sparse(both[k], 0, &kept, &rows));
      assert_int_equal(rows, 0);
      i += n;
    }
    for (size_t x = 0; x < nl; x++)
      if (memcmp(&out[1][x], &alone[x], sizeof(float))) {
        printf("pass %d: first difference at logit %zu (row %zu): %.9g vs %.9g\n", k, x, x / V,
               (double)out[1][x], (double)alone[x]);
        break;
      }
    assert_memory_equal(out[1], alone, nl * sizeof(float));
    assert_memory_equal(out[2], dense_alone, nl * sizeof(float));
    /* and sparsity changes something: the sparse logits are not the dense ones */
    assert_true(memcmp(out[1], dense_alone, nl * sizeof(float)) != 0);
    for (int j = 0; j < 3; j++) {
      free(out[j]);
      sk_kv_free(kv[j]);
    }
  }
  sk_scratch_free(sp);
  sk_pool_free(pool);
  sk_scratch_free(s);
  free(alone);
  free(dense_alone);
}

/* The thresholds split the collected values at their levels, a sparse run
 * at a level skips about that fraction, and thresholds grow with the level. */
static void test_calibration_levels(void **state) {
  (void)state;
  const uint32_t L = fx.c->n_layer, H = fx.c->hidden_dim;
  for (uint32_t i = 0; i < fx.calib.n_levels; i++)
    for (uint32_t l = 0; l < L; l++) {
      const float m = fx.calib.measured[(size_t)i * L + l];
      assert_true(m >= fx.calib.level[i] && m < fx.calib.level[i] + 0.01f);
      if (i) assert_true(fx.calib.thr[(size_t)i * L + l] > fx.calib.thr[(size_t)(i - 1) * L + l]);
    }
  struct sk_scratch *s = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_scratch_new(fx.m, CTX, CTX, &s, &err), 0);
  float *out = malloc((size_t)(N_PROMPT + N_DECODE) * fx.c->n_vocab * sizeof(float));
  for (uint32_t i = 0; i < fx.calib.n_levels; i++) {
    uint64_t kept[64] = {0};
    run(s, fx.calib.thr + (size_t)i * L, out, kept);
    for (uint32_t l = 0; l < L; l++) {
      const double skipped = 1.0 - (double)kept[l] / ((double)N_DECODE * H);
      printf("level %.1f layer %u: skipped %.3f\n", (double)fx.calib.level[i], l, skipped);
      assert_true(fabs(skipped - fx.calib.level[i]) < 0.15);
    }
  }
  free(out);
  sk_scratch_free(s);
}

/* Written, read back with the same floats; refused for another model's
 * fingerprint, another layer count, or a broken file. */
static void test_calibration_file(void **state) {
  (void)state;
  char *dir = sk_test_tmpdir();
  char path[512];
  snprintf(path, sizeof path, "%s/calib", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  struct sk_error err = {0};
  fx.calib.n_tokens = fx.n_tok;
  assert_int_equal(sk_sparse_calib_write(f, &fx.calib, &err), 0);
  fclose(f);
  struct sk_sparse_calib c;
  assert_int_equal(sk_sparse_calib_load(path, fx.fp, fx.c->n_layer, &c, &err), 0);
  assert_int_equal(c.n_levels, 7);
  assert_memory_equal(c.level, fx.calib.level, 7 * sizeof(float));
  assert_memory_equal(c.thr, fx.calib.thr, 7 * fx.c->n_layer * sizeof(float));
  assert_memory_equal(c.measured, fx.calib.measured, 7 * fx.c->n_layer * sizeof(float));
  assert_ptr_equal(sk_sparse_calib_find(&c, 0.5f), c.thr + 4 * fx.c->n_layer);
  assert_null(sk_sparse_calib_find(&c, 0.45f));
  char lv[64];
  assert_string_equal(sk_sparse_calib_levels(&c, lv, sizeof lv),
                      "0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7");
  sk_sparse_calib_free(&c);

  uint8_t other[16];
  memcpy(other, fx.fp, 16);
  other[7] ^= 1;
  assert_int_equal(sk_sparse_calib_load(path, other, fx.c->n_layer, &c, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "another model"));
  assert_int_equal(sk_sparse_calib_load(path, fx.fp, fx.c->n_layer + 1, &c, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "layers"));
  /* a threshold that is not a number */
  f = fopen(path, "a");
  fprintf(f, "level 0.9");
  for (uint32_t l = 0; l < fx.c->n_layer; l++) fprintf(f, " %s", l == 2 ? "x" : "1");
  fprintf(f, "\n");
  fclose(f);
  assert_int_equal(sk_sparse_calib_load(path, fx.fp, fx.c->n_layer, &c, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "numbers"));
  unlink(path);
  assert_int_equal(sk_sparse_calib_load(path, fx.fp, fx.c->n_layer, &c, &err), -SK_ERR_IO);
  rmdir(dir);
  free(dir);
}

/* The Q8_0 kernels of the sparse MLP against the dense kernels on the
 * same weights: the down copy holds down's own quants and scales, and a
 * token's output is the dense MLP's with the skipped neurons' h set to 0
 * (to the float rounding of up's sums), in every kernel variant. DIM is
 * not a multiple of 64, so the padding of the tiles is crossed too. */
static void test_q8_kernels(void **state) {
  (void)state;
  enum { DIM = 96, HID = 160 };
  static float wu[HID][DIM], wd[DIM][HID];
  static struct sk_block_q8_0 qu[HID][DIM / 32], qd[DIM][HID / 32];
  for (int j = 0; j < HID; j++)
    for (int o = 0; o < DIM; o++) {
      wu[j][o] = sinf(0.37f * (float)(j * DIM + o)) * (1 + j % 3);
      wd[o][j] = cosf(0.11f * (float)(o * HID + j) + 0.5f) * (1 + o % 5);
    }
  for (int j = 0; j < HID; j++) sk_quantize_row_q8_0(wu[j], DIM, qu[j]);
  for (int o = 0; o < DIM; o++) sk_quantize_row_q8_0(wd[o], HID, qd[o]);
  const struct sk_wmat up = {.type = SK_GGML_Q8_0, .rows = HID, .cols = DIM,
                             .row_bytes = sk_quant_row_bytes(SK_GGML_Q8_0, DIM), .data = qu};
  const struct sk_wmat down = {.type = SK_GGML_Q8_0, .rows = DIM, .cols = HID,
                               .row_bytes = sk_quant_row_bytes(SK_GGML_Q8_0, HID), .data = qd};
  struct sk_sparse_mlp w;
  void *mem = NULL;
  size_t bytes = 0;
  struct sk_error err = {0};
  assert_int_equal(sk_sparse_prepare(&w, &up, &down, &mem, &bytes, &err), 0);
  assert_int_equal(w.down_type, SK_GGML_Q8_0);
  assert_int_equal(w.ld, 128);
  float deq[HID];
  for (int o = 0; o < DIM; o++) {
    sk_dequantize_row(SK_GGML_Q8_0, qd[o], HID, deq);
    for (int j = 0; j < HID; j++) assert_true(sk_sparse_down_weight(&w, j, o) == deq[j]);
  }
  /* kept rows of up and down plus the scales of the 5 blocks */
  assert_true(sk_sparse_step_bytes(&w, 10.0) == 10.0 * (102 + 128) + 5 * 128 * 2);

  static float x[DIM], gate[HID], u[HID], h[HID], yd[DIM], ys[DIM];
  static int8_t xq[DIM], hq[HID];
  static float xd[DIM / 32], hd[HID / 32];
  static int32_t xs[DIM / 32], hs[HID / 32];
  for (int o = 0; o < DIM; o++) x[o] = sinf(1.3f * (float)o) + 0.25f;
  for (int j = 0; j < HID; j++) gate[j] = 3.0f * sinf(0.7f * (float)j + 1.0f);
  sk_kernels_quantize_rows(x, DIM, 1, DIM, xq, xd, xs);
  const struct sk_act ax = {.n = 1, .cols = DIM, .f = x, .ldf = DIM, .q = xq, .d = xd, .s = xs};
  const char *variants[] = {"auto", "avx2", "generic"};
  const float thrs[] = {0.0f, 0.4f, 1.5f};
  struct sk_sparse_work wk;
  assert_int_equal(sk_sparse_work_init(&wk, HID, DIM, 1, &err), 0);
  for (size_t v = 0; v < 3; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    assert_int_equal(sk_kernels_select(variants[v], &err), 0);
    float *urow[1] = {u}, *yrow[1] = {yd};
    sk_kernels_matmul(&up, &ax, urow, 0, HID);
    for (size_t t = 0; t < 3; t++) {
      uint32_t kept = 0;
      for (int j = 0; j < HID; j++) {
        const float si = gate[j] / (1.0f + expf(-gate[j]));
        h[j] = fabsf(si) > thrs[t] ? si * u[j] : 0.0f;
        kept += fabsf(si) > thrs[t];
      }
      sk_kernels_quantize_rows(h, HID, 1, HID, hq, hd, hs);
      const struct sk_act ah = {.n = 1, .cols = HID, .f = h, .ldf = HID, .q = hq, .d = hd,
                                .s = hs};
      sk_kernels_matmul(&down, &ah, yrow, 0, DIM);
      assert_int_equal(sk_sparse_mlp_row(&w, gate, thrs[t], &ax, ys, &wk, NULL), kept);
      float mx = 0.0f;
      for (int o = 0; o < DIM; o++) mx = fmaxf(mx, fabsf(yd[o]));
      for (int o = 0; o < DIM; o++)
        if (fabsf(ys[o] - yd[o]) > 1e-5f * mx)
          fail_msg("%s, threshold %g: output %d is %.9g, dense %.9g", variants[v],
                   (double)thrs[t], o, (double)ys[o], (double)yd[o]);
    }
  }
  assert_int_equal(sk_kernels_select("auto", &err), 0);
  sk_sparse_work_free(&wk);
  free(mem);
}

/* A 4-bit down projection (Q4_0) becomes Q4 tiles: each weight within
 * half a step of its Q4_1 requantization (plus the fp16 rounding of d and
 * m), and a token's output is the sum over the blocks of 32 neurons of
 * the quantized h times those weights, in every kernel variant. */
static void test_q4_tiles(void **state) {
  (void)state;
  enum { DIM = 160, HID = 96 };
  static float wu[HID][DIM], wd[DIM][HID];
  static struct sk_block_q8_0 qu[HID][DIM / 32];
  static struct sk_block_q4_0 qd[DIM][HID / 32];
  for (int j = 0; j < HID; j++)
    for (int o = 0; o < DIM; o++) {
      wu[j][o] = sinf(0.29f * (float)(j * DIM + o)) * (1 + j % 4);
      wd[o][j] = cosf(0.13f * (float)(o * HID + j) + 0.2f) * (1 + o % 3);
    }
  for (int j = 0; j < HID; j++) sk_quantize_row_q8_0(wu[j], DIM, qu[j]);
  for (int o = 0; o < DIM; o++) sk_quantize_row_q4_0(wd[o], HID, qd[o]);
  const struct sk_wmat up = {.type = SK_GGML_Q8_0, .rows = HID, .cols = DIM,
                             .row_bytes = sk_quant_row_bytes(SK_GGML_Q8_0, DIM), .data = qu};
  const struct sk_wmat down = {.type = SK_GGML_Q4_0, .rows = DIM, .cols = HID,
                               .row_bytes = sk_quant_row_bytes(SK_GGML_Q4_0, HID), .data = qd};
  struct sk_sparse_mlp w;
  void *mem = NULL;
  size_t bytes = 0;
  struct sk_error err = {0};
  assert_int_equal(sk_sparse_prepare(&w, &up, &down, &mem, &bytes, &err), 0);
  assert_int_equal(w.down_type, SK_GGML_Q4_1);
  assert_int_equal(w.ld, 192);
  assert_int_equal(w.down_row_bytes, 96);
  /* kept rows of up and down, the scales and minimums of the 3 blocks */
  assert_true(sk_sparse_step_bytes(&w, 10.0) == 10.0 * (170 + 96) + 3 * 192 * 2 * 2);
  float deq[HID];
  for (int o = 0; o < DIM; o++) {
    sk_dequantize_row(SK_GGML_Q4_0, qd[o], HID, deq);
    for (int g = 0; g < HID / 32; g++) {
      float mn = deq[32 * g], mx = deq[32 * g];
      for (int e = 0; e < 32; e++) {
        mn = fminf(mn, deq[32 * g + e]);
        mx = fmaxf(mx, deq[32 * g + e]);
      }
      const float tol = 0.5f * (mx - mn) / 15.0f + (fabsf(mn) + fabsf(mx)) / 1024.0f;
      for (int e = 0; e < 32; e++)
        assert_true(fabsf(sk_sparse_down_weight(&w, 32 * g + e, o) - deq[32 * g + e]) <= tol);
    }
  }
  static float x[DIM], gate[HID], u[HID], h[HID], ys[DIM];
  static double yr[DIM];
  static int8_t xq[DIM], hq[HID];
  static float xd[DIM / 32], hd[HID / 32];
  static int32_t xs[DIM / 32], hs[HID / 32];
  for (int o = 0; o < DIM; o++) x[o] = cosf(0.9f * (float)o) - 0.1f;
  for (int j = 0; j < HID; j++) gate[j] = 3.0f * cosf(0.61f * (float)j);
  sk_kernels_quantize_rows(x, DIM, 1, DIM, xq, xd, xs);
  const struct sk_act ax = {.n = 1, .cols = DIM, .f = x, .ldf = DIM, .q = xq, .d = xd, .s = xs};
  const char *variants[] = {"auto", "avx2", "generic"};
  struct sk_sparse_work wk;
  assert_int_equal(sk_sparse_work_init(&wk, HID, DIM, 1, &err), 0);
  for (size_t v = 0; v < 3; v++) {
    if (!sk_kernels_supported(variants[v])) continue;
    assert_int_equal(sk_kernels_select(variants[v], &err), 0);
    float *urow[1] = {u};
    sk_kernels_matmul(&up, &ax, urow, 0, HID);
    for (int j = 0; j < HID; j++) {
      const float si = gate[j] / (1.0f + expf(-gate[j]));
      h[j] = fabsf(si) > 0.3f ? si * u[j] : 0.0f;
    }
    sk_kernels_quantize_rows(h, HID, 1, HID, hq, hd, hs);
    double mx = 0.0;
    for (int o = 0; o < DIM; o++) {
      yr[o] = 0.0;
      for (int j = 0; j < HID; j++)
        yr[o] += (double)hd[j / 32] * hq[j] * (double)sk_sparse_down_weight(&w, j, o);
      mx = fmax(mx, fabs(yr[o]));
    }
    sk_sparse_mlp_row(&w, gate, 0.3f, &ax, ys, &wk, NULL);
    for (int o = 0; o < DIM; o++)
      if (fabs(ys[o] - yr[o]) > 1e-5 * mx)
        fail_msg("%s: output %d is %.9g, expected %.9g", variants[v], o, (double)ys[o], yr[o]);
  }
  assert_int_equal(sk_kernels_select("auto", &err), 0);
  sk_sparse_work_free(&wk);
  free(mem);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threshold_zero_is_dense),
      cmocka_unit_test(test_batch_mixed_same_bits),
      cmocka_unit_test(test_calibration_levels),
      cmocka_unit_test(test_calibration_file),
      cmocka_unit_test(test_q8_kernels),
      cmocka_unit_test(test_q4_tiles),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
