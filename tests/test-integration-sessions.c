/* Sessions through the real daemon (testinteg.h): log-probabilities and
 * perplexity against llama.cpp, UTF-8 across generates, a pin across
 * 10,000 evictions, H2O and the policies open accepts. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "testmsg.h"
#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"
#include "base/utf8.h"
#include "testinteg.h"
static int32_t *ref_ids(json_t *ref, size_t text, size_t *ret_n) {
  return sk_test_json_ids(
      json_object_get(json_array_get(json_object_get(ref, "texts"), text), "token_ids"), ret_n);
}

/* Dense per-token log-probabilities through the daemon (append with
 * logprobs, 4 requests of 512) equal llama.cpp's for both texts. */
static void test_logprobs_through_daemon(void **state) {
  (void)state;
  skip_under_valgrind();
  struct sk_client *c = connect_or_fail();
  json_t *ref = sk_test_load_reference("logprobs.json");
  double maxd = 0.0;
  for (size_t ti = 0; ti < 2; ti++) {
    size_t n;
    int32_t *ids = ref_ids(ref, ti, &n);
    assert_int_equal(n, 2048);
    const json_t *tx = json_array_get(json_object_get(ref, "texts"), ti);
    const json_t *want = json_object_get(tx, "logprobs");
    struct sk_open_params op = {.policy = "dense", .capacity = 2048};
    struct sk_open_result o;
    struct sk_error e = {0};
    assert_int_equal(sk_client_open(c, &op, &o, &e), 0);
    double lp[2048];
    for (size_t b = 0; b < 4; b++) {
      struct sk_append_result ar;
      assert_int_equal(sk_client_append_logprobs(c, o.session, ids + b * 512, 512, SK_BOS_DEFAULT,
                                                 lp + b * 512, &ar, &e),
                       0);
      assert_int_equal(ar.n_tokens, 512);
      assert_int_equal(ar.evicted, 0);
    }
    assert_true(isnan(lp[0])); /* BOS: nothing before it */
    for (size_t k = 1; k < 2048; k++) {
      double w = json_real_value(json_array_get(want, k - 1));
      double d = fabs(lp[k] - w);
      if (d > maxd) maxd = d;
      if (!(d < 1e-4)) fail_msg("text %zu token %zu: logprob %.9g, want %.9g", ti, k, lp[k], w);
    }
    static const struct {
      const char *key;
      size_t last;
    } ppl[] = {{"perplexity_1_511", 511}, {"perplexity_1_1023", 1023}, {"perplexity_1_2047", 2047}};
    for (size_t i = 0; i < 3; i++) {
      double sum = 0;
      for (size_t k = 1; k <= ppl[i].last; k++) sum += lp[k];
      double got = exp(-sum / (double)ppl[i].last);
      double w = json_real_value(json_object_get(tx, ppl[i].key));
      if (!(fabs(got / w - 1) < 1e-3)) fail_msg("text %zu %s: %.9g, want %.9g", ti, ppl[i].key, got, w);
    }
    /* Full: a dense append that does not fit is refused whole, counts in
     * the message, never truncated. */
    int32_t more[2] = {300, 301};
    assert_int_equal(sk_client_append_logprobs(c, o.session, more, 2, SK_BOS_DEFAULT, lp, NULL, &e),
                     -SK_ERR_CONTEXT_FULL);
    assert_non_null(strstr(e.message, "0 of 2048"));
    assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
    free(ids);
  }
  print_message("logprobs through the daemon: max abs diff vs llama.cpp %.3g\n", maxd);
  json_decref(ref);
  sk_client_free(c);
}

/* What a generate's token events carry with logprobs: the token, its
 * log-probability and bytes, the top 5. */
struct lp_rec {
  int32_t tokens[32];
  double lp[32];
  int32_t top_id[32][5];
  double top_lp[32][5];
  size_t n_top[32];
  char bytes[32][16];
  size_t bytes_len[32];
  size_t n;
  char text[1024]; /* the events' texts */
  size_t text_len;
};

static int on_lp_token(void *user, const struct sk_token_event *ev) {
  struct lp_rec *r = user;
  if (r->n == 32) return 1;
  r->tokens[r->n] = ev->token;
  r->lp[r->n] = ev->logprob;
  r->n_top[r->n] = ev->n_top_logprobs;
  for (size_t k = 0; k < ev->n_top_logprobs && k < 5; k++) {
    r->top_id[r->n][k] = ev->top_logprobs[k].token;
    r->top_lp[r->n][k] = ev->top_logprobs[k].logprob;
  }
  r->bytes_len[r->n] = ev->bytes_len < 16 ? ev->bytes_len : 16;
  if (ev->bytes) memcpy(r->bytes[r->n], ev->bytes, r->bytes_len[r->n]);
  if (r->text_len + ev->text_len <= sizeof r->text) {
    memcpy(r->text + r->text_len, ev->text, ev->text_len);
    r->text_len += ev->text_len;
  }
  r->n++;
  return 0;
}

/* A generate's log-probabilities (logprobs, top_logprobs) are the model's
 * own: each generated token's equals the one `append` with logprobs gives
 * it when the same tokens are fed to a new session (teacher-forced), for
 * sampled tokens too (temperature does not change them); the top 5 are
 * the 5 most likely in order, the greedy choice first; the tokens' bytes
 * make the text. */
static void test_generate_logprobs(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  for (int sampled = 0; sampled < 2; sampled++) {
    struct sk_open_params op = {.policy = "dense", .capacity = 64, .temporary = true};
    struct sk_open_result o;
    struct sk_error e = {0};
    assert_int_equal(sk_client_open(c, &op, &o, &e), 0);
    struct sk_generate_params gp;
    sk_generate_params_init(&gp);
    gp.prompt = "Once upon a time";
    gp.max_tokens = 24;
    gp.temperature = sampled ? 1.5 : 0;
    gp.has_seed = true;
    gp.seed = 11;
    gp.ignore_eos = true;
    gp.top_logprobs = 5;
    struct lp_rec r = {0};
    struct sk_generate_result gr;
    assert_int_equal(sk_client_generate(c, o.session, &gp, on_lp_token, &r, &gr, &e), 0);
    assert_int_equal(r.n, 24);
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    assert_int_equal(sk_client_tokenize(c, gp.prompt, strlen(gp.prompt), SK_BOS_DEFAULT, &prompt,
                                        &n_prompt, &e),
                     0);
    int32_t all[64];
    memcpy(all, prompt, n_prompt * sizeof *all);
    memcpy(all + n_prompt, r.tokens, r.n * sizeof *all);
    struct sk_open_result o2;
    assert_int_equal(sk_client_open(c, &op, &o2, &e), 0);
    double lp[64];
    assert_int_equal(sk_client_append_logprobs(c, o2.session, all, n_prompt + r.n,
                                               SK_BOS_FALSE, lp, NULL, &e),
                     0);
    for (size_t i = 0; i < r.n; i++) {
      if (!(fabs(r.lp[i] - lp[n_prompt + i]) <= 1e-5))
        fail_msg("token %zu: generate's logprob %.9g, append's %.9g", i, r.lp[i],
                 lp[n_prompt + i]);
      assert_int_equal(r.n_top[i], 5);
      for (size_t k = 1; k < 5; k++) assert_true(r.top_lp[i][k] <= r.top_lp[i][k - 1]);
      assert_true(r.top_lp[i][0] >= r.lp[i]);
      if (!sampled) {
        assert_int_equal(r.top_id[i][0], r.tokens[i]);
        assert_true(r.top_lp[i][0] == r.lp[i]);
      }
    }
    char joined[1024];
    size_t joined_len = 0;
    for (size_t i = 0; i < r.n; i++) {
      memcpy(joined + joined_len, r.bytes[i], r.bytes_len[i]);
      joined_len += r.bytes_len[i];
    }
    assert_int_equal(joined_len, r.text_len);
    assert_memory_equal(joined, r.text, joined_len);
    free(prompt);
    assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
    assert_int_equal(sk_client_close_session(c, o2.session, &e), 0);
  }
  sk_client_free(c);
}

/* Tokens and text of one generate or of several in a row. */
struct stream_rec {
  int32_t tokens[64];
  size_t n;
  char text[64 * 16];
  size_t len;
};

static int on_stream_token(void *user, const struct sk_token_event *ev) {
  struct stream_rec *r = user;
  assert_true(r->n < 64 && r->len + ev->text_len < sizeof r->text);
  r->tokens[r->n++] = ev->token;
  memcpy(r->text + r->len, ev->text, ev->text_len);
  r->len += ev->text_len;
  return 0;
}

static void random_generate(struct sk_client *c, uint64_t s, uint32_t n, bool seeded, uint64_t seed,
                            struct stream_rec *rec) {
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = n;
  gp.temperature = 100.0; /* nearly uniform: half the vocabulary is byte tokens */
  gp.top_k = 0;
  gp.top_p = 1.0;
  gp.ignore_eos = true;
  gp.has_seed = seeded;
  gp.seed = seed;
  struct sk_generate_result gr;
  struct sk_error e = {0};
  if (sk_client_generate(c, s, &gp, on_stream_token, rec, &gr, &e) != 0)
    fail_msg("generate: %s", e.message);
  assert_int_equal(gr.n_tokens, n);
}

/* Whether text has a character of 2 to 4 bytes other than U+FFFD. */
static bool has_multibyte(const char *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)t[i];
    if (b >= 0xc2 && !(n - i >= 3 && memcmp(t + i, "\xef\xbf\xbd", 3) == 0)) return true;
  }
  return false;
}

/* A character split between two generates is not lost: on 30 random
 * token streams (seeded), 48 one-token generates give the same tokens
 * and the same text as one 48-token generate from the same state, while
 * the one-token side goes through a fork or an export and import every
 * few tokens (the held bytes travel with the session). */
static void test_utf8_across_generates(void **state) {
  (void)state;
  skip_under_valgrind();
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  enum { RUNS = 30, N = 48 };
  int with_multibyte = 0;
  for (int run = 0; run < RUNS; run++) {
    struct sk_open_result oa;
    assert_int_equal(sk_client_open(c, NULL, &oa, &e), 0);
    assert_int_equal(sk_client_append_text(c, oa.session, "Once", 4, SK_BOS_DEFAULT, NULL, &e), 0);
    /* Seed the session's own stream; the fork carries it (and any held
     * bytes of this first token). */
    struct stream_rec first = {0};
    random_generate(c, oa.session, 1, true, 100 + (uint64_t)run, &first);
    struct sk_session_summary sum;
    assert_int_equal(sk_client_fork(c, oa.session, &sum, &e), 0);
    uint64_t b = sum.session;
    struct stream_rec whole = {0}, steps = {0};
    random_generate(c, oa.session, N, false, 0, &whole);
    for (int i = 0; i < N; i++) {
      random_generate(c, b, 1, false, 0, &steps);
      if (i % 4 == 1) {
        assert_int_equal(sk_client_fork(c, b, &sum, &e), 0);
        assert_int_equal(sk_client_close_session(c, b, &e), 0);
        b = sum.session;
      } else if (i % 4 == 3) {
        void *img = NULL;
        size_t img_len = 0;
        assert_int_equal(sk_client_export(c, b, &img, &img_len, &e), 0);
        assert_int_equal(sk_client_import(c, img, img_len, &sum, &e), 0);
        free(img);
        assert_int_equal(sk_client_close_session(c, b, &e), 0);
        b = sum.session;
      }
    }
    assert_int_equal(steps.n, N);
    assert_memory_equal(steps.tokens, whole.tokens, N * sizeof whole.tokens[0]);
    if (steps.len != whole.len || memcmp(steps.text, whole.text, whole.len) != 0)
      fail_msg("run %d: %zu bytes in one generate, %zu in %d one-token generates", run,
               whole.len, steps.len, N);
    with_multibyte += has_multibyte(whole.text, whole.len);
    assert_int_equal(sk_client_close_session(c, oa.session, &e), 0);
    assert_int_equal(sk_client_close_session(c, b, &e), 0);
  }
  /* The streams do hold characters that byte tokens build. */
  assert_true(with_multibyte > 0);
  print_message("utf8 across generates: %d runs of %d tokens, %d with multi-byte characters, "
                "all equal\n", RUNS, N, with_multibyte);
  sk_client_free(c);
}

/* A pinned 300-token system prompt is still resident, token for token,
 * after the stream has evicted 10,000 tokens. */
static void test_pin_survives_10000_evictions(void **state) {
  (void)state;
  skip_under_valgrind();
  struct sk_client *c = connect_or_fail();
  json_t *ref = sk_test_load_reference("logprobs.json");
  size_t n;
  int32_t *ids = ref_ids(ref, 1, &n); /* the fortunes: the pin */
  int32_t *story = ref_ids(ref, 0, &n);
  struct sk_open_params op = {.policy = "streaming", .window = 32, .pin_tokens = ids,
                              .n_pin_tokens = 300};
  struct sk_open_result o;
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(c, &op, &o, &e), 0);
  assert_string_equal(o.policy, "streaming");
  assert_int_equal(o.pinned, 300);
  assert_int_equal(o.n_sink, 300);
  assert_int_equal(o.window, 32);
  assert_int_equal(o.capacity, 332);
  /* 10,032 tokens: the first 32 fill the window, every later one evicts */
  enum { N = 10032 };
  int32_t *stream = malloc(N * sizeof *stream);
  assert_non_null(stream);
  for (size_t i = 0; i < N; i++) stream[i] = story[1 + i % 2047];
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(c, o.session, stream, N, SK_BOS_DEFAULT, &ar, &e), 0);
  assert_int_equal(ar.evicted, 10000);
  assert_int_equal(ar.resident, 332);
  assert_int_equal(ar.seen, 300 + N);
  assert_int_equal(ar.n_ranges, 1);
  assert_int_equal(ar.ranges[0].first, 300);
  assert_int_equal(ar.ranges[0].last, 300 + 10000 - 1);
  int32_t *res = NULL;
  size_t nres = 0;
  assert_int_equal(sk_client_session_tokens(c, o.session, &res, &nres, &e), 0);
  assert_int_equal(nres, 332);
  assert_memory_equal(res, ids, 300 * sizeof *res);
  assert_memory_equal(res + 300, stream + N - 32, 32 * sizeof *res);
  free(res);
  struct sk_session_stats st;
  assert_int_equal(sk_client_session_stats(c, o.session, &st, &e), 0);
  assert_int_equal(st.pinned, 300);
  assert_int_equal(st.evicted, 10000);
  assert_int_equal(st.n_resident_ranges, 2);
  assert_int_equal(st.resident_ranges[0].first, 0);
  assert_int_equal(st.resident_ranges[0].last, 299);
  assert_int_equal(st.resident_ranges[1].first, 300 + N - 32);
  assert_int_equal(st.resident_ranges[1].last, 300 + N - 1);
  assert_int_equal(st.sink_tokens, 300);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);

  /* A pin as text is tokenized with BOS; pins are refused where the
   * policy has no sink region, and when they do not fit. */
  struct sk_open_params tp = {.policy = "sink_h2o", .heavy = 8, .recent = 8,
                              .pin = "You are a storyteller."};
  assert_int_equal(sk_client_open(c, &tp, &o, &e), 0);
  assert_true(o.pinned > 3);
  assert_int_equal(o.n_sink, o.pinned);
  assert_int_equal(o.capacity, o.pinned + 16);
  assert_int_equal(sk_client_session_tokens(c, o.session, &res, &nres, &e), 0);
  assert_int_equal(nres, o.pinned);
  assert_int_equal(res[0], 1);
  free(res);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  struct sk_open_params wp = {.policy = "window", .window = 8, .pin = "Hello"};
  assert_int_equal(sk_client_open(c, &wp, &o, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "no sink region"));
  struct sk_open_params dp = {.policy = "dense", .capacity = 100, .pin_tokens = ids,
                              .n_pin_tokens = 100};
  assert_int_equal(sk_client_open(c, &dp, &o, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "pin of 100 tokens"));
  free(stream);
  free(story);
  free(ids);
  json_decref(ref);
  sk_client_free(c);
}

/* H2O through the daemon: heavy 16 + recent 16, a 24-token prompt and 64
 * greedy tokens; the last 16 are resident, the heavy ones are not just
 * the oldest, and a second session gives the same resident set. */
static void h2o_session(struct sk_client *c, int32_t **ret_tokens, struct sk_session_stats *ret_st) {
  struct sk_open_params op = {.policy = "h2o", .heavy = 16, .recent = 16};
  struct sk_open_result o;
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(c, &op, &o, &e), 0);
  assert_int_equal(o.capacity, 32);
  assert_int_equal(o.heavy, 16);
  assert_int_equal(o.recent, 16);
  json_t *ref = sk_test_load_reference("logprobs.json");
  size_t n;
  int32_t *ids = ref_ids(ref, 0, &n);
  assert_int_equal(sk_client_append_tokens(c, o.session, ids, 24, SK_BOS_DEFAULT, NULL, &e), 0);
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, 64);
  struct sk_generate_result gr;
  assert_int_equal(sk_client_generate(c, o.session, &gp, NULL, NULL, &gr, &e), 0);
  assert_int_equal(gr.n_tokens, 64);
  assert_int_equal(gr.evicted, 24 + 64 - 32);
  assert_int_equal(gr.resident, 32);
  assert_int_equal(sk_client_session_stats(c, o.session, ret_st, &e), 0);
  size_t nres = 0;
  assert_int_equal(sk_client_session_tokens(c, o.session, ret_tokens, &nres, &e), 0);
  assert_int_equal(nres, 32);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  free(ids);
  json_decref(ref);
}

static void test_h2o_through_daemon(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  int32_t *t1, *t2;
  struct sk_session_stats s1, s2;
  h2o_session(c, &t1, &s1);
  h2o_session(c, &t2, &s2);
  assert_memory_equal(t1, t2, 32 * sizeof *t1);
  assert_int_equal(s1.n_resident_ranges, s2.n_resident_ranges);
  assert_memory_equal(s1.resident_ranges, s2.resident_ranges,
                      s1.n_resident_ranges * sizeof s1.resident_ranges[0]);
  /* the newest 16 (indices 72..87) form the last range */
  const struct sk_range *last = &s1.resident_ranges[s1.n_resident_ranges - 1];
  assert_int_equal(last->last, 87);
  assert_true(last->first <= 72);
  assert_true(s1.n_resident_ranges >= 2); /* heavy hitters are not a window */
  assert_int_equal(s1.evicted, 56);
  assert_string_equal(s1.policy, "h2o");
  assert_int_equal(s1.heavy, 16);
  assert_int_equal(s1.recent, 16);
  /* attention diagnostics: 5 layers, shares in [0, 1], entropy within
   * [0, ln 32] */
  assert_int_equal(s1.n_layers, 5);
  assert_int_equal(s1.sink_tokens, 4);
  assert_true(s1.attn_steps == 64);
  for (size_t l = 0; l < 5; l++) {
    assert_true(s1.sink_mass[l] >= 0 && s1.sink_mass[l] <= 1.0 + 1e-6);
    assert_true(s1.entropy[l] >= 0 && s1.entropy[l] <= log(32.0) + 1e-4);
  }
  free(t1);
  free(t2);
  sk_client_free(c);
}

/* Every policy opens with its parameters; invalid combinations are
 * refused with bad_request naming the limit. A window session that
 * overflows one append evicts by its rule and says so. */
static void test_open_policies(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  struct sk_open_result o;
  static const struct {
    struct sk_open_params p;
    const char *needle;
  } bad[] = {
      {{.policy = "window", .window = 0, .has_n_sink = false}, NULL}, /* default window: fine */
      {{.policy = "h2o", .heavy = 5000, .recent = 5000}, "heavy + recent = 5000 + 5000 = 10000"},
      {{.policy = "streaming", .n_sink = 4, .window = 3000},
       "exceeds the model's context: n_ctx_train 2048 x rope_scale 1 = 2048"},
      {{.policy = "dense", .capacity = 4097, .rope_scale = 2}, "= 4096 positions"},
      {{.policy = "dense", .capacity = 64, .rope_scale = 100}, "rope_scale 100"},
      {{.policy = "dense", .capacity = 64, .rope_scale = 64.0000001},
       "rope_scale 64.0000001 must be"},
      {{.policy = "window", .rope_scale = 1e-50},
       "rope_scale 1e-50 must be finite, > 0 (also as a 32-bit float) and <= 64"},
      {{.policy = "window", .window = 8, .n_sink = 2}, "policy window has no sinks"},
      {{.policy = "streaming", .heavy = 10}, "heavy: policy streaming has no such part"},
      {{.policy = "dense", .window = 10}, "window: policy dense has no such part"},
      {{.policy = "h2o", .window = 10}, "window: policy h2o has no such part"},
      {{.policy = "window", .recent = 10}, "recent: policy window has no such part"},
      {{.policy = "sink_h2o", .capacity = 10}, "capacity: policy sink_h2o has no such part"},
      {{.policy = "lru"}, "unknown policy"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = sk_client_open(c, &bad[i].p, &o, &e);
    if (!bad[i].needle) {
      assert_int_equal(rc, 0);
      assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
      continue;
    }
    assert_int_equal(rc, -SK_ERR_BAD_REQUEST);
    if (!strstr(e.message, bad[i].needle)) fail_msg("'%s' lacks '%s'", e.message, bad[i].needle);
  }
  /* rope_scale is kept and shown */
  struct sk_open_params rp = {.policy = "dense", .capacity = 4096, .rope_scale = 2};
  assert_int_equal(sk_client_open(c, &rp, &o, &e), 0);
  assert_true(o.rope_scale == 2.0);
  struct sk_session_stats st;
  assert_int_equal(sk_client_session_stats(c, o.session, &st, &e), 0);
  assert_true(st.rope_scale == 2.0);
  assert_true(st.model_rope_scale == 1.0);
  assert_int_equal(st.attn_steps, 0);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);

  struct sk_open_params wp = {.policy = "window", .window = 12};
  assert_int_equal(sk_client_open(c, &wp, &o, &e), 0);
  assert_int_equal(o.capacity, 12);
  assert_int_equal(o.n_sink, 0);
  int32_t toks[40];
  for (int i = 0; i < 40; i++) toks[i] = 300 + i;
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(c, o.session, toks, 10, SK_BOS_DEFAULT, &ar, &e), 0);
  assert_int_equal(sk_client_append_tokens(c, o.session, toks + 10, 30, SK_BOS_DEFAULT, &ar, &e), 0);
  assert_int_equal(ar.n_tokens, 30);
  assert_int_equal(ar.evicted, 28);
  assert_int_equal(ar.n_ranges, 1);
  assert_int_equal(ar.ranges[0].first, 0);
  assert_int_equal(ar.ranges[0].last, 27);
  int32_t *res = NULL;
  size_t nres = 0;
  assert_int_equal(sk_client_session_tokens(c, o.session, &res, &nres, &e), 0);
  assert_int_equal(nres, 12);
  assert_memory_equal(res, toks + 28, 12 * sizeof *res);
  free(res);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  sk_client_free(c);
}

/* sinkctl eval over the first 2047 tokens of the stories: its dense
 * column equals llama.cpp's perplexity per block of 256 positions; the
 * other runs are there and finite; the CSV is written. */
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_logprobs_through_daemon),
      cmocka_unit_test(test_generate_logprobs),
      cmocka_unit_test(test_utf8_across_generates),
      cmocka_unit_test(test_pin_survives_10000_evictions),
      cmocka_unit_test(test_h2o_through_daemon),
      cmocka_unit_test(test_open_policies),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
