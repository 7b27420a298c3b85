/* Speculative decoding through the real sinkd (spec.h, scheduler.c):
 *
 *   - greedy output token for token equal to plain decoding under every
 *     policy, with a draft model (pycode-29M with pycode-5M) and with
 *     look-up in the session's history, while the caches evict;
 *   - a SIGKILL during a speculating generate: the session continues
 *     exactly as an uninterrupted plain one;
 *   - sampling keeps the model's distribution: tokens after the first of
 *     many seeded generates of stories260K, with a perturbed copy of it as
 *     the draft, against plain sampling (a chi-square test);
 *   - a draft model whose vocabulary differs is refused at start, the
 *     log naming the first difference.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "sinkd/client.h"
#include "testpersist.h"
#include "testutil.h"

static char *g_target, *g_draft; /* pycode-29M and pycode-5M */
static char *g_prompt;           /* the start of python-stdlib.txt */

/* Starts sinkd on model with a draft model (NULL: none). */
static int start_with_draft(const char *model, const char *draft) {
  const char *const extra[] = {"--draft-model", draft, NULL};
  return start_daemon_model(model, draft ? extra : NULL);
}

/* Each test its own state directory and log. */
static void fresh_test(const char *name) {
  kill9(); /* a failed test's daemon */
  fresh_state(name);
}

static int spec_setup(void **state) {
  if (setup(state) < 0) return -1;
  g_target = sk_test_shared_path("models/pycode-29M-f16.gguf");
  g_draft = sk_test_shared_path("models/pycode-5M-f16.gguf");
  char *text = sk_test_shared_path("data/python-stdlib.txt");
  size_t n = 0;
  char *all = sk_test_read_file(text, &n);
  free(text);
  if (!all || n < 700) return -1;
  all[600] = 0; /* 240 tokens of the models' vocabulary */
  g_prompt = all;
  return 0;
}

static int spec_teardown(void **state) {
  free(g_target);
  free(g_draft);
  free(g_prompt);
  return teardown(state);
}

/* ---- sessions and tokens ---- */

static uint64_t open_params(struct sk_client *c, const struct sk_open_params *op) {
  struct sk_open_result o;
  struct sk_error e = {0};
  if (sk_client_open(c, op, &o, &e) < 0) fail_msg("open: %s", e.message);
  return o.session;
}

/* n greedy tokens (ignoring EOS) with speculation mode (NULL: the
 * session's) into out. */
static void gen_greedy(struct sk_client *c, uint64_t s, uint32_t n, const char *mode,
                       struct ids *out, struct sk_generate_result *ret) {
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = n;
  gp.temperature = 0;
  gp.ignore_eos = true;
  gp.speculation = mode;
  gp.logprobs = true;
  struct sk_generate_result gr;
  struct sk_error e = {0};
  if (sk_client_generate(c, s, &gp, ids_cb, out, &gr, &e) < 0) {
    dump_log();
    fail_msg("generate: %s", e.message);
  }
  if (ret) *ret = gr;
}

/* ---- greedy identity under every policy ---- */

/* Budgets below the 240-token prompt (streaming, window: every step
 * evicts, chunks of proposals evict inside themselves), above it (h2o,
 * sink_h2o: proposals while the cache fills, then one token a step with
 * an eviction each), and a dense cache that fills up (its generate ends
 * context_full where plain decoding's does). */
static const struct {
  const char *name;
  struct sk_open_params op;
  bool evicts_while_drafting;
} k_policies[] = {
    {"dense 300", {.policy = "dense", .capacity = 300}, false},
    {"streaming 4 + 60", {.policy = "streaming", .n_sink = 4, .window = 60}, true},
    {"window 64", {.policy = "window", .window = 64}, true},
    {"h2o 140 + 140", {.policy = "h2o", .heavy = 140, .recent = 140}, false},
    {"sink_h2o 4 + 138 + 138", {.policy = "sink_h2o", .n_sink = 4, .heavy = 138, .recent = 138},
     false},
};

#define N_GREEDY 96u

static void test_greedy_identity(void **state) {
  (void)state;
  fresh_test("identity");
  assert_int_equal(start_with_draft(g_target, g_draft), 0);
  struct sk_client *c = conn();
  static const char *const modes[] = {"off", "draft", "lookup"};
  uint64_t drafted[3] = {0}, accepted[3] = {0};
  for (size_t p = 0; p < sizeof k_policies / sizeof k_policies[0]; p++) {
    struct ids *out[3];
    struct sk_generate_result gr[3];
    for (int m = 0; m < 3; m++) {
      /* a fixed count: how many an adaptive count proposes depends on
       * measured times, and the test wants proposals for sure */
      struct sk_open_params op = k_policies[p].op;
      op.speculation = modes[m];
      op.draft_tokens = 6;
      op.draft_fixed = true;
      uint64_t s = open_params(c, &op);
      append_text(c, s, g_prompt);
      out[m] = calloc(1, sizeof *out[m]);
      gen_greedy(c, s, N_GREEDY, NULL, out[m], &gr[m]);
      struct sk_session_stats st = sstats(c, s);
      assert_string_equal(st.speculation.mode, modes[m]);
      /* the session's counts are its generate's */
      assert_int_equal(st.speculation.drafted, gr[m].drafted_tokens);
      assert_int_equal(st.speculation.accepted, gr[m].accepted_tokens);
      assert_int_equal(st.speculation.rejected, gr[m].drafted_tokens - gr[m].accepted_tokens);
      drafted[m] += gr[m].drafted_tokens;
      accepted[m] += gr[m].accepted_tokens;
      if (m > 0 && k_policies[p].evicts_while_drafting) {
        assert_true(gr[m].evicted >= gr[m].n_tokens); /* every step evicted */
        assert_true(gr[m].drafted_tokens > 0);
      }
    }
    for (int m = 1; m < 3; m++) {
      assert_string_equal(gr[m].stop, gr[0].stop);
      assert_int_equal(out[m]->n, out[0]->n);
      for (size_t i = 0; i < out[0]->n; i++) {
        if (out[m]->v[i] != out[0]->v[i])
          fail_msg("%s, speculation %s: token %zu is %d, plain decoding's %d", k_policies[p].name,
                   modes[m], i, out[m]->v[i], out[0]->v[i]);
        /* the same logits, bit for bit: the same log-probabilities */
        if (memcmp(&out[m]->lp[i], &out[0]->lp[i], sizeof(double)) != 0)
          fail_msg("%s, speculation %s: token %zu has log-probability %.9g, plain decoding's "
                   "%.9g",
                   k_policies[p].name, modes[m], i, out[m]->lp[i], out[0]->lp[i]);
      }
      assert_int_equal(gr[m].evicted, gr[0].evicted);
      assert_int_equal(gr[m].resident, gr[0].resident);
      assert_int_equal(gr[m].seen, gr[0].seen);
      assert_int_equal(gr[m].n_ranges, gr[0].n_ranges);
      for (size_t r = 0; r < gr[0].n_ranges; r++) {
        assert_int_equal(gr[m].ranges[r].first, gr[0].ranges[r].first);
        assert_int_equal(gr[m].ranges[r].last, gr[0].ranges[r].last);
      }
    }
    printf("%s: %zu greedy tokens (%s) equal with a draft model (%llu drafted, %llu accepted) "
           "and with look-up (%llu drafted, %llu accepted)\n",
           k_policies[p].name, out[0]->n, gr[0].stop, (unsigned long long)gr[1].drafted_tokens,
           (unsigned long long)gr[1].accepted_tokens, (unsigned long long)gr[2].drafted_tokens,
           (unsigned long long)gr[2].accepted_tokens);
    for (int m = 0; m < 3; m++) free(out[m]);
  }
  /* off proposes nothing; both others had tokens kept and refused */
  assert_int_equal(drafted[0], 0);
  for (int m = 1; m < 3; m++) {
    assert_true(accepted[m] > 0);
    assert_true(accepted[m] < drafted[m]);
  }
  /* the daemon's totals are the sum */
  struct sk_daemon_stats ds;
  struct sk_error e = {0};
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.speculation.drafted, drafted[1] + drafted[2]);
  assert_int_equal(ds.speculation.accepted, accepted[1] + accepted[2]);
  assert_string_equal(ds.speculation.mode, "draft");
  assert_string_equal(ds.speculation.draft_model, "pycode-5M");
  sk_client_free(c);
  stop_term();
}

/* ---- a SIGKILL during a speculating generate ---- */

/* The uninterrupted plain run, then the same with speculation, killed
 * once the client has seen 40 tokens: what was committed is the plain
 * run's, and generating the rest after the restart gives the rest of it,
 * leaving the same cache. */
static void kill_case(struct sk_open_params op, const char *mode) {
  struct sk_client *c = conn();
  op.speculation = "off";
  uint64_t r = open_params(c, &op);
  append_text(c, r, g_prompt);
  const uint64_t n_prompt = sstats(c, r).seen;
  struct ids *ref = calloc(1, sizeof *ref);
  gen_greedy(c, r, 160, NULL, ref, NULL);
  assert_int_equal(ref->n, 160);
  op.speculation = mode;
  uint64_t a = open_params(c, &op);
  append_text(c, a, g_prompt);
  struct ids *got = calloc(1, sizeof *got);
  got->kill_after = 40;
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = 160;
  gp.temperature = 0;
  gp.ignore_eos = true;
  struct sk_error e = {0};
  int rc = sk_client_generate(c, a, &gp, ids_cb, got, NULL, &e);
  assert_true(rc == 0 || rc == -SK_ERR_DISCONNECTED || rc == -SK_ERR_IO);
  sk_client_free(c);
  kill9();
  assert_int_equal(start_with_draft(g_target, g_draft), 0);
  c = conn();
  struct sk_session_summary sum;
  assert_int_equal(sk_client_resume(c, a, &sum, &e), 0);
  assert_true(sum.adopted);
  const uint64_t k = sum.seen - n_prompt; /* generated and committed */
  assert_true(k >= 40 && k <= 160);
  for (size_t i = 0; i < got->n; i++) assert_int_equal(got->v[i], ref->v[i]);
  if (!strcmp(op.policy, "dense")) { /* all of it resident: the committed tokens */
    size_t n = 0;
    int32_t *t = tokens_of(c, a, &n);
    assert_int_equal(n, sum.seen);
    for (uint64_t i = 0; i < k; i++) assert_int_equal(t[n_prompt + i], ref->v[i]);
    free(t);
  }
  struct ids *rest = calloc(1, sizeof *rest);
  struct sk_generate_result gr;
  if (k < 160) gen_greedy(c, a, (uint32_t)(160 - k), mode, rest, &gr);
  for (uint64_t i = 0; i < 160 - k; i++)
    if (rest->v[i] != ref->v[k + i])
      fail_msg("%s, %s: token %llu after the restart is %d, uninterrupted %d", op.policy, mode,
               (unsigned long long)(k + i), rest->v[i], ref->v[k + i]);
  size_t na = 0, nr = 0;
  int32_t *ta = tokens_of(c, a, &na), *tr = tokens_of(c, r, &nr);
  assert_int_equal(na, nr);
  assert_memory_equal(ta, tr, na * sizeof *ta);
  assert_int_equal(sstats(c, a).evicted, sstats(c, r).evicted);
  printf("%s, speculation %s: killed after the client saw 40 tokens, %llu committed; the other "
         "%llu and the cache equal the uninterrupted plain run\n",
         op.policy, mode, (unsigned long long)k, (unsigned long long)(160 - k));
  free(ta);
  free(tr);
  free(ref);
  free(got);
  free(rest);
  sk_client_free(c);
}

static void test_kill_during_speculation(void **state) {
  (void)state;
  fresh_test("kill");
  assert_int_equal(start_with_draft(g_target, g_draft), 0);
  kill_case((struct sk_open_params){.policy = "dense", .capacity = 512}, "draft");
  kill9();
  assert_int_equal(start_with_draft(g_target, g_draft), 0);
  kill_case((struct sk_open_params){.policy = "streaming", .n_sink = 4, .window = 60}, "lookup");
  kill9();
  assert_int_equal(start_with_draft(g_target, g_draft), 0);
  kill_case((struct sk_open_params){.policy = "streaming", .n_sink = 4, .window = 60}, "draft");
  kill9();
}

/* ---- sampling keeps the distribution ---- */

/* A copy of the stories260K model at path whose output head is scaled and
 * shifted (a different distribution over the same vocabulary): a draft
 * that proposes often but not always what the model would. */
static void write_perturbed(const char *path) {
  size_t n = 0;
  uint8_t *bytes = sk_test_read_file(sk_test_model_path(), &n);
  assert_non_null(bytes);
  struct sk_gguf *g = NULL;
  struct sk_error e;
  assert_int_equal(sk_gguf_open(sk_test_model_path(), &g, &e), 0);
  size_t size = 0;
  const uint8_t *base = sk_gguf_bytes(g, &size);
  assert_int_equal(size, n);
  bool found = false;
  for (uint64_t i = 0; i < sk_gguf_n_tensors(g); i++) {
    const struct sk_gguf_tensor *t = sk_gguf_tensor(g, i);
    if (t->name.len != 13 || memcmp(t->name.ptr, "output.weight", 13) != 0) continue;
    assert_int_equal(t->type, SK_GGML_F32);
    float *w = (float *)(void *)(bytes + ((const uint8_t *)t->data - base));
    for (uint64_t j = 0; j < t->n_bytes / 4; j++) w[j] = w[j] * 2.5f;
    found = true;
  }
  assert_true(found);
  sk_gguf_close(g);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(bytes);
}

#define N_RUNS 2500u
#define N_GEN 5u

/* Token counts at positions 1..N_GEN-1 of N_RUNS generates, seeds 1.., of
 * the session's speculation mode. */
static void sample_counts(struct sk_client *c, const char *mode, uint32_t *counts,
                          uint32_t n_vocab, uint64_t *ret_drafted, uint64_t *ret_accepted) {
  /* a fixed count: the draft is the model's size, so an adaptive count
   * would rightly propose little */
  struct sk_open_params op = {.policy = "dense", .capacity = 64, .speculation = mode,
                              .draft_tokens = 3, .draft_fixed = true};
  uint64_t s = open_params(c, &op);
  append_text(c, s, "Once upon a time, there was a little");
  *ret_drafted = *ret_accepted = 0;
  for (uint32_t run = 0; run < N_RUNS; run++) {
    struct sk_client *cc = c;
    struct sk_error e = {0};
    struct sk_session_summary fs;
    assert_int_equal(sk_client_fork(cc, s, &fs, &e), 0); /* the same start every run */
    struct sk_generate_params gp;
    sk_generate_params_init(&gp);
    gp.max_tokens = N_GEN;
    gp.temperature = 1.5;
    gp.top_k = 0;
    gp.top_p = 1.0;
    gp.ignore_eos = true;
    gp.has_seed = true;
    gp.seed = run + 1;
    struct ids out = {.n = 0};
    struct sk_generate_result gr;
    if (sk_client_generate(cc, fs.session, &gp, ids_cb, &out, &gr, &e) < 0)
      fail_msg("generate: %s", e.message);
    assert_int_equal(out.n, N_GEN);
    for (uint32_t i = 1; i < N_GEN; i++) counts[(size_t)(i - 1) * n_vocab + (uint32_t)out.v[i]]++;
    *ret_drafted += gr.drafted_tokens;
    *ret_accepted += gr.accepted_tokens;
    assert_int_equal(sk_client_close_session(cc, fs.session, &e), 0);
  }
}

/* Two-sample chi-square statistic of counts a and b (n values each, the
 * same totals), bins with fewer than 10 in both pooled into one; *ret_df
 * its degrees of freedom. */
static double chi2_two(const uint32_t *a, const uint32_t *b, uint32_t n, uint32_t *ret_df) {
  double x = 0, pa = 0, pb = 0;
  uint32_t bins = 0;
  for (uint32_t t = 0; t < n; t++) {
    if (a[t] + b[t] < 10) {
      pa += a[t];
      pb += b[t];
      continue;
    }
    const double d = (double)a[t] - b[t];
    x += d * d / ((double)a[t] + b[t]);
    bins++;
  }
  if (pa + pb > 0) {
    x += (pa - pb) * (pa - pb) / (pa + pb);
    bins++;
  }
  *ret_df = bins ? bins - 1 : 0;
  return x;
}

/* The chi-square quantile at 1 - 1e-4 for df degrees of freedom
 * (Wilson-Hilferty): a correct rule fails this test once in 10^4 seeds
 * per position, and these seeds are fixed. */
static double chi2_limit(uint32_t df) {
  const double z = 3.719, k = df;
  const double t = 1.0 - 2.0 / (9.0 * k) + z * sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

static void test_sampling_distribution(void **state) {
  (void)state;
  fresh_test("sampling");
  char draft[300];
  snprintf(draft, sizeof draft, "%s/perturbed.gguf", g_dir);
  write_perturbed(draft);
  assert_int_equal(start_with_draft(sk_test_model_path(), draft), 0);
  struct sk_client *c = conn();
  struct sk_hello h;
  struct sk_error e = {0};
  assert_int_equal(sk_client_hello(c, &h, &e), 0);
  const uint32_t V = h.model.n_vocab;
  uint32_t *plain = calloc((size_t)(N_GEN - 1) * V, sizeof *plain);
  uint32_t *spec = calloc((size_t)(N_GEN - 1) * V, sizeof *spec);
  uint32_t *look = calloc((size_t)(N_GEN - 1) * V, sizeof *look);
  uint64_t d0, a0, d1, a1, d2, a2;
  sample_counts(c, "off", plain, V, &d0, &a0);
  sample_counts(c, "draft", spec, V, &d1, &a1);
  sample_counts(c, "lookup", look, V, &d2, &a2);
  assert_int_equal(d0, 0);
  /* the draft proposed on every step and was refused often enough for the
   * residual draws to matter */
  assert_true(d1 > N_RUNS && a1 > d1 / 4 && a1 < d1 * 9 / 10);
  for (uint32_t i = 0; i < N_GEN - 1; i++) {
    uint32_t df;
    double x = chi2_two(plain + (size_t)i * V, spec + (size_t)i * V, V, &df);
    printf("sampling, token %u of %u seeded runs: draft vs plain chi-square %.1f (%u degrees "
           "of freedom, limit %.1f)\n",
           i + 2, N_RUNS, x, df, chi2_limit(df));
    assert_true(df >= 20);
    assert_true(x < chi2_limit(df));
    if (d2) {
      x = chi2_two(plain + (size_t)i * V, look + (size_t)i * V, V, &df);
      assert_true(x < chi2_limit(df));
    }
  }
  printf("sampling: draft %llu drafted, %llu accepted; look-up %llu drafted, %llu accepted\n",
         (unsigned long long)d1, (unsigned long long)a1, (unsigned long long)d2,
         (unsigned long long)a2);
  free(plain);
  free(spec);
  free(look);
  sk_client_free(c);
  stop_term();
}

/* ---- a draft model of another vocabulary ---- */

/* The file at src with token `id`'s text changed in its last byte (the
 * same length: every offset stays), into dst; *ret_was / *ret_now the old
 * and new text. */
static void write_changed_token(const char *src, const char *dst, int32_t id, char *ret_was,
                                char *ret_now) {
  struct sk_gguf *g = NULL;
  struct sk_tokenizer *tok = NULL;
  struct sk_error e;
  assert_int_equal(sk_gguf_open(src, &g, &e), 0);
  assert_int_equal(sk_tokenizer_load(g, &tok, &e), 0);
  const char *text;
  size_t len;
  assert_int_equal(sk_tokenizer_text(tok, id, &text, &len), 0);
  assert_true(len >= 2 && len < 24);
  memcpy(ret_was, text, len);
  ret_was[len] = 0;
  size_t n = 0;
  char *bytes = sk_test_read_file(src, &n);
  /* the GGUF string: its 64-bit length, then its bytes */
  char pat[40];
  uint64_t l64 = len;
  memcpy(pat, &l64, 8);
  memcpy(pat + 8, text, len);
  char *at = memmem(bytes, n, pat, 8 + len);
  assert_non_null(at);
  at[8 + len - 1] = at[8 + len - 1] == 'z' ? 'y' : 'z';
  memcpy(ret_now, at + 8, len);
  ret_now[len] = 0;
  FILE *f = fopen(dst, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(bytes);
  sk_tokenizer_free(tok);
  sk_gguf_close(g);
}

/* The file at src with its EOS id (tokenizer.ggml.eos_token_id, a u32)
 * one more, into dst; returns the old id. */
static uint32_t write_changed_eos(const char *src, const char *dst) {
  size_t n = 0;
  char *bytes = sk_test_read_file(src, &n);
  assert_non_null(bytes);
  /* the key (its 64-bit length, its bytes), the value's type (4: u32),
   * the value */
  static const char key[] = "tokenizer.ggml.eos_token_id";
  char pat[8 + sizeof key];
  const uint64_t klen = sizeof key - 1;
  memcpy(pat, &klen, 8);
  memcpy(pat + 8, key, klen);
  char *at = memmem(bytes, n, pat, 8 + klen);
  assert_non_null(at);
  uint32_t type, id;
  memcpy(&type, at + 8 + klen, 4);
  assert_int_equal(type, 4);
  memcpy(&id, at + 12 + klen, 4);
  const uint32_t now = id + 1;
  memcpy(at + 12 + klen, &now, 4);
  FILE *f = fopen(dst, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(bytes, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(bytes);
  return id;
}

static void test_vocab_mismatch(void **state) {
  (void)state;
  fresh_test("vocab");
  char path[300], was[32], now[32], want[200];
  snprintf(path, sizeof path, "%s/changed.gguf", g_dir);
  write_changed_token(sk_test_model_path(), path, 300, was, now);
  assert_int_equal(start_with_draft(sk_test_model_path(), path), 1);
  snprintf(want, sizeof want,
           "its vocabulary is not the model's: token 300 is \"%s\", the model's is \"%s\"", now,
           was);
  if (!log_has(want)) {
    dump_log();
    fail_msg("the log does not say: %s", want);
  }
  /* the same tokens, another end-of-sequence id */
  snprintf(path, sizeof path, "%s/eos.gguf", g_dir);
  const uint32_t eos = write_changed_eos(sk_test_model_path(), path);
  assert_int_equal(start_with_draft(sk_test_model_path(), path), 1);
  snprintf(want, sizeof want, "its vocabulary is not the model's: EOS id %u, the model's %u",
           eos + 1, eos);
  if (!log_has(want)) {
    dump_log();
    fail_msg("the log does not say: %s", want);
  }
  /* another vocabulary altogether: its size */
  assert_int_equal(start_with_draft(sk_test_model_path(), g_draft), 1);
  assert_true(log_has("its vocabulary is not the model's: 4096 tokens, the model has 512"));
  /* the same vocabulary is taken; asking for a draft of a daemon without
   * one is a bad request */
  assert_int_equal(start_with_draft(sk_test_model_path(), NULL), 0);
  struct sk_client *c = conn();
  struct sk_open_params op = {.speculation = "draft"};
  struct sk_open_result o;
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(c, &op, &o, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "speculation draft: this daemon has no draft model (sinkd.conf "
                                 "draft_model, or --draft-model)");
  op.speculation = "fast";
  assert_int_equal(sk_client_open(c, &op, &o, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "speculation \"fast\" is not off, draft or lookup");
  sk_client_free(c);
  stop_term();
  printf("a draft model with token 300 \"%s\" for \"%s\" is refused, naming it\n", now, was);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vocab_mismatch),
      cmocka_unit_test(test_sampling_distribution),
      cmocka_unit_test(test_greedy_identity),
      cmocka_unit_test(test_kill_during_speculation),
  };
  return cmocka_run_group_tests(tests, spec_setup, spec_teardown);
}
