/* sinkctl eval on pycode-5M, the model whose attention sink is its first
 * token (../shared/models/README.md), through a live daemon whose frame
 * limit (64 KiB) is far below the text (python-stdlib.txt, 632 KB):
 *   - the attention-sink effect: over 3,000 tokens at a cache budget of
 *     128, a plain window's perplexity is at least 1.25 times that of 4
 *     sinks + window, and 1 sink (BOS) is within 3% of 4;
 *   - the whole file is tokenized in pieces to the tokens of one call,
 *     and the dense run over its first 1,023 tokens gives the perplexity
 *     a PyTorch implementation measured (10.536);
 *   - the recompute runs score each token from a fresh session of BOS +
 *     the W - 1 tokens before it (bos=0: the W tokens), the values a
 *     client gets by opening those sessions itself. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"

static struct sk_test_daemon g_d;
static char *g_text; /* path of python-stdlib.txt */

static int setup(void **state) {
  (void)state;
  /* --kv-type f32: the reference perplexity was taken in float */
  sk_test_daemon_start(&g_d, (const char *const[]){"--max-frame", "64K", "--kv-type", "f32",
                                                    NULL});
  g_text = sk_test_shared_path("data/python-stdlib.txt");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  sk_test_daemon_stop(&g_d, 10000);
  free(g_text);
  return 0;
}

/* Runs `sinkctl eval ARGS python-stdlib.txt` against the daemon, writing
 * its CSV to csv; returns its standard output (malloc'd). Fails the test
 * unless it exits 0. */
static char *run_eval(const char *args, const char *csv) {
  const char *sinkctl = getenv("SK_SINKCTL");
  if (!sinkctl) sinkctl = "./client/sinkctl";
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s --socket %s eval --no-progress %s%s%s %s", sinkctl, g_d.socket,
           args, csv ? " --csv " : "", csv ? csv : "", g_text);
  int status = -1;
  char *out = sk_test_run_capture(cmd, &status);
  if (status != 0) {
    sk_test_daemon_dump_log(&g_d);
    fail_msg("%s: exit %d\n%s", cmd, status, out);
  }
  return out;
}

/* The CSV's rows as numbers: (*ret_rows) rows of n_cols values after
 * first,last (empty cells NAN); the header must be `header`. */
static double *read_csv(const char *path, const char *header, size_t n_cols, size_t *ret_rows) {
  size_t len = 0;
  char *data = sk_test_read_file(path, &len);
  assert_non_null(data);
  char *save = NULL;
  char *line = strtok_r(data, "\n", &save);
  assert_non_null(line);
  assert_string_equal(line, header);
  double *v = NULL;
  size_t rows = 0;
  while ((line = strtok_r(NULL, "\n", &save))) {
    v = realloc(v, (rows + 1) * n_cols * sizeof *v);
    assert_non_null(v);
    char *p = line;
    for (size_t k = 0; k < n_cols + 2; k++) {
      char *end = p;
      double x = *p == ',' || !*p ? NAN : strtod(p, &end);
      if (k >= 2) v[rows * n_cols + k - 2] = x;
      p = strchr(end, ',');
      if (k + 1 < n_cols + 2) {
        assert_non_null(p);
        p++;
      }
    }
    rows++;
  }
  free(data);
  *ret_rows = rows;
  return v;
}

static void test_sink_effect(void **state) {
  (void)state;
  char csv[4200];
  snprintf(csv, sizeof csv, "%s/sinks.csv", g_d.dir);
  free(run_eval("--tokens 3000 --budget 128 --span 3000 --run window --run streaming:sinks=1 "
                "--run streaming:sinks=4",
                csv));
  size_t rows = 0;
  double *v = read_csv(csv, "first,last,window,streaming:sinks=1,streaming:sinks=4", 3, &rows);
  assert_int_equal(rows, 1);
  double window = v[0], s1 = v[1], s4 = v[2];
  print_message("figures: eval: pycode-5M, 3,000 tokens, budget 128: window %.3f, 1 sink %.3f, "
                "4 sinks %.3f (window / 4 sinks %.2f)\n",
                window, s1, s4, window / s4);
  assert_true(isfinite(window) && isfinite(s1) && isfinite(s4));
  if (!(window >= 1.25 * s4)) fail_msg("window %.3f is not 1.25 x 4 sinks %.3f", window, s4);
  if (!(fabs(s1 / s4 - 1) <= 0.03)) fail_msg("1 sink %.3f is not within 3%% of 4: %.3f", s1, s4);
  free(v);
}

/* The number of tokens of python-stdlib.txt in one call with BOS, by the
 * daemon's tokenizer in process. */
static size_t one_call_tokens(void) {
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  if (sk_gguf_open(sk_test_model_path(), &g, &err) < 0) fail_msg("%s", err.message);
  struct sk_tokenizer *t = NULL;
  assert_int_equal(sk_tokenizer_load(g, &t, &err), 0);
  sk_gguf_close(g);
  size_t len = 0;
  char *text = sk_test_read_file(g_text, &len);
  assert_non_null(text);
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(sk_tokenizer_encode(t, text, len, SK_TOKENIZE_BOS, &ids, &n, &err), 0);
  free(ids);
  free(text);
  sk_tokenizer_free(t);
  return n;
}

static void test_whole_file_in_pieces(void **state) {
  (void)state;
  char *out = run_eval("--json --run dense", NULL);
  size_t n = one_call_tokens();
  assert_int_equal(n, 203285); /* BOS + 203,284 scored */
  char want[64];
  snprintf(want, sizeof want, "\"tokens\": %zu,", n);
  if (!strstr(out, want)) fail_msg("%s not in %s", want, out);
  const char *p = strstr(out, "\"perplexity\": ");
  assert_non_null(p);
  double ppl = strtod(p + strlen("\"perplexity\": "), NULL);
  print_message("dense, first 1,023 tokens: %.4f (PyTorch: 10.536)\n", ppl);
  assert_non_null(strstr(out, "\"scored\": 1023,"));
  if (!(fabs(ppl / 10.536 - 1) < 2e-3)) fail_msg("dense perplexity %.4f, want 10.536", ppl);
  free(out);
}

/* ln p(token ids[n - 1] | ids[0 .. n - 1)) from a fresh dense session. */
static double fresh_logprob(struct sk_client *c, const int32_t *ids, size_t n) {
  struct sk_error e = {0};
  struct sk_open_params op = {.policy = "dense", .capacity = 16, .temporary = true};
  struct sk_open_result o;
  if (sk_client_open(c, &op, &o, &e) < 0) fail_msg("open: %s", e.message);
  double lp[16];
  assert_true(n <= 16);
  if (sk_client_append_logprobs(c, o.session, ids, n, SK_BOS_DEFAULT, lp, NULL, &e) < 0)
    fail_msg("append: %s", e.message);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  return lp[n - 1];
}

static void test_recompute_windows(void **state) {
  (void)state;
  enum { W = 8, N = 40 };
  char csv[4200];
  snprintf(csv, sizeof csv, "%s/recompute.csv", g_d.dir);
  free(run_eval("--tokens 40 --span 1 --run recompute:window=8 --run recompute:window=8,bos=0",
                csv));
  size_t rows = 0;
  double *v =
      read_csv(csv, "first,last,recompute:window=8,recompute:window=8 bos=0", 2, &rows);
  assert_int_equal(rows, N);
  /* the text's first tokens, BOS first (its first line ends well past
   * them, and a cut after a newline keeps the tokens) */
  struct sk_client *c = sk_test_connect(g_d.socket);
  struct sk_error e = {0};
  size_t len = 0;
  char *text = sk_test_read_file(g_text, &len);
  char *nl = strchr(text + 300, '\n');
  assert_non_null(nl);
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(sk_client_tokenize(c, text, (size_t)(nl + 1 - text), SK_BOS_TRUE, &ids, &n, &e),
                   0);
  assert_true(n > N);
  assert_int_equal(ids[0], 1);
  size_t differ = 0;
  for (size_t t = 1; t <= N; t++) {
    int32_t win[W + 2];
    size_t m = 0;
    if (t > W - 1) win[m++] = ids[0]; /* BOS, then the W - 1 before t */
    size_t start = t > W - 1 ? t - (W - 1) : 0;
    memcpy(win + m, ids + start, (t - start + 1) * sizeof *win);
    m += t - start + 1;
    double bos = exp(-fresh_logprob(c, win, m));
    start = t > W ? t - W : 0; /* bos=0: the W before t */
    double nobos = exp(-fresh_logprob(c, ids + start, t - start + 1));
    double got_bos = v[(t - 1) * 2], got_nobos = v[(t - 1) * 2 + 1];
    if (!(fabs(got_bos / bos - 1) < 1e-4))
      fail_msg("token %zu: recompute %.6g, a fresh session of BOS + %d tokens %.6g", t, got_bos,
               W - 1, bos);
    if (!(fabs(got_nobos / nobos - 1) < 1e-4))
      fail_msg("token %zu: recompute bos=0 %.6g, a fresh session of %d tokens %.6g", t,
               got_nobos, W, nobos);
    if (t <= W - 1) assert_true(fabs(got_bos / got_nobos - 1) < 1e-4); /* both from BOS */
    if (t > W && fabs(got_bos / got_nobos - 1) > 1e-3) differ++;
  }
  assert_true(differ > N / 2); /* the variants differ once the window moves */
  free(ids);
  free(text);
  free(v);
  sk_client_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sink_effect),
      cmocka_unit_test(test_whole_file_in_pieces),
      cmocka_unit_test(test_recompute_windows),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
