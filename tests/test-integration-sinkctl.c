/* sinkctl against the real daemon (testinteg.h): its commands and
 * sinkctl eval's perplexities against llama.cpp. */
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
/* A generate that another client cancels: sinkctl exits 1 and says why. */
static void sinkctl_cancelled_by_another(const char *sinkctl) {
  char cmd[1024];
  int status = -1;
  char *out;
  /* a generation another client cancels (by closing its session): exit 1,
   * and stderr says why */
  snprintf(cmd, sizeof cmd, "%s --socket %s open", sinkctl, g_socket);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  const uint64_t long_id = strtoull(out, NULL, 10);
  free(out);
  snprintf(cmd, sizeof cmd,
           "%s --socket %s generate --session %" PRIu64 " -n 1000000 Once 2>&1 >/dev/null",
           sinkctl, g_socket, long_id);
  FILE *gen = popen(cmd, "r");
  assert_non_null(gen);
  struct sk_client *cc = connect_or_fail();
  struct sk_error ce;
  uint64_t seen = 0;
  for (int i = 0; i < 500 && seen < 16; i++) { /* at most 10 s: until it generates */
    struct sk_session_info *l = NULL;
    size_t n = 0;
    assert_int_equal(sk_client_list(cc, &l, &n, &ce), 0);
    for (size_t k = 0; k < n; k++)
      if (l[k].session == long_id) seen = l[k].seen;
    free(l);
    if (seen < 16) usleep(20000);
  }
  assert_true(seen >= 16);
  assert_int_equal(sk_client_close_session(cc, long_id, &ce), 0);
  sk_client_free(cc);
  char msg[512];
  size_t got = fread(msg, 1, sizeof msg - 1, gen);
  msg[got] = 0;
  status = pclose(gen);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 1);
  assert_string_equal(msg, "sinkctl: the daemon cancelled the generation (it is stopping, or "
                           "another client closed the session or cancelled it)\n");
}

/* What sinkctl refuses: an eval output it cannot write, a folder to load,
 * session shapes open does not take. */
static void sinkctl_refusals(const char *sinkctl) {
  char cmd[1024];
  int status = -1;
  char *out;
  /* an eval output that cannot be written: refused before the run */
  snprintf(cmd, sizeof cmd, "%s --socket %s eval --csv %s/no/such/dir/x.csv %s 2>&1", sinkctl,
           g_socket, g_dir, getenv("SK_MODEL"));
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 1); /* a file that cannot be written, as save's */
  assert_non_null(strstr(out, "--csv: cannot write "));
  free(out);
  /* a folder to load */
  snprintf(cmd, sizeof cmd, "%s --socket %s load %s 2>&1", sinkctl, g_socket, g_dir);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 1);
  assert_non_null(strstr(out, " is a folder, not an exported session file"));
  free(out);
  /* session shapes: a known policy, its own parts, none with --session */
  const char *shapes[] = {"open --policy bogus", "open --policy streaming --heavy 10",
                          "open --policy dense --window 10",
                          "generate --session 1 --policy dense x",
                          "open --policy window --pin x"};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    snprintf(cmd, sizeof cmd, "%s --socket %s %s 2>/dev/null", sinkctl, g_socket, shapes[i]);
    free(sk_test_run_capture(cmd, &status));
    if (status != 2) fail_msg("'%s': exit %d, expected 2", shapes[i], status);
  }
}

static void test_sinkctl(void **state) {
  (void)state;
  const char *sinkctl = getenv("SK_SINKCTL");
  if (!sinkctl) sinkctl = "./client/sinkctl";
  json_t *ref = sk_test_load_reference("greedy.json");
  json_t *p = json_array_get(json_object_get(ref, "prompts"), 0);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "%s --socket %s generate --temperature 0 --max-tokens 64 'Once upon a time'", sinkctl,
           g_socket);
  int status = -1;
  char *out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  char want[4096];
  snprintf(want, sizeof want, "Once upon a time%s\n",
           json_string_value(json_object_get(p, "generated_text")));
  assert_string_equal(out, want);
  free(out);

  snprintf(cmd, sizeof cmd, "%s --socket %s tokenize 'Once upon a time'", sinkctl, g_socket);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  assert_string_equal(out, "1 403 407 261 378\n");
  free(out);

  snprintf(cmd, sizeof cmd, "%s --socket %s detokenize 403 407 261 378", sinkctl, g_socket);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  assert_string_equal(out, "Once upon a time"); /* exact bytes, no newline added */
  free(out);

  /* Exit codes scripts rely on: daemon error 1, usage 2, no daemon 3. */
  snprintf(cmd, sizeof cmd, "%s --socket %s close 999999 2>/dev/null", sinkctl, g_socket);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 1);
  snprintf(cmd, sizeof cmd, "%s --socket %s generate --top-p 1.5 x 2>/dev/null", sinkctl, g_socket);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 2);
  /* the daemon's limits, checked by sinkctl: usage errors */
  snprintf(cmd, sizeof cmd, "%s --socket %s generate -t 150 x 2>/dev/null", sinkctl, g_socket);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 2);
  snprintf(cmd, sizeof cmd, "%s --socket %s generate --rope-scale 65 x 2>/dev/null", sinkctl,
           g_socket);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 2);
  /* a zero of a part the policy has not is none of it: taken, as the
   * daemon takes it; a nonzero one is a usage error */
  snprintf(cmd, sizeof cmd, "%s --socket %s open --policy window --sinks 0", sinkctl, g_socket);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  snprintf(cmd, sizeof cmd, "%s --socket %s close %llu", sinkctl, g_socket,
           strtoull(out, NULL, 10));
  free(out);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 0);
  snprintf(cmd, sizeof cmd, "%s --socket %s open --policy window --sinks 1 2>/dev/null", sinkctl,
           g_socket);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 2);
  /* a dense session that fills: generate says why it stopped (stderr) */
  snprintf(cmd, sizeof cmd, "%s --socket %s open --policy dense --capacity 8", sinkctl, g_socket);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  unsigned long long full_id = strtoull(out, NULL, 10);
  free(out);
  snprintf(cmd, sizeof cmd, "%s --socket %s generate --session %llu -n 50 Once 2>&1 >/dev/null",
           sinkctl, g_socket, full_id);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  assert_string_equal(out, "sinkctl: the dense session is full (8 tokens): open one with "
                           "--policy streaming to keep going\n");
  free(out);
  /* ... and an append that no longer fits says it in the same words */
  snprintf(cmd, sizeof cmd, "%s --socket %s generate --session %llu -n 5 Once 2>&1 >/dev/null",
           sinkctl, g_socket, full_id);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 1);
  assert_string_equal(out, "sinkctl: context_full: the dense session is full: 1 tokens to "
                           "append, 0 of 8 slots free (8 resident); nothing was appended (open "
                           "one with --policy streaming to keep going)\n");
  free(out);
  snprintf(cmd, sizeof cmd, "%s --socket %s close %llu", sinkctl, g_socket, full_id);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 0);
  /* an empty prompt: the model starts from BOS alone, as through libsinkd
   * with the one token BOS */
  snprintf(cmd, sizeof cmd, "%s --socket %s generate -n 24 -t 0 '' 2>&1", sinkctl, g_socket);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  {
    struct sk_client *bc = connect_or_fail();
    struct sk_error be;
    struct sk_open_result bo;
    assert_int_equal(sk_client_open(bc, NULL, &bo, &be), 0);
    const int32_t bos = 1;
    assert_int_equal(sk_client_append_tokens(bc, bo.session, &bos, 1, SK_BOS_FALSE, NULL, &be), 0);
    struct sk_generate_params gp;
    sk_generate_params_init(&gp);
    gp.max_tokens = 24;
    gp.temperature = 0;
    struct collect *col = calloc(1, sizeof *col);
    struct sk_generate_result gr;
    assert_int_equal(sk_client_generate(bc, bo.session, &gp, collect_cb, col, &gr, &be), 0);
    assert_int_equal(col->n, 24);
    assert_true(strlen(out) == col->text_len + 1 && out[col->text_len] == '\n');
    assert_memory_equal(out, col->text, col->text_len);
    assert_int_equal(sk_client_close_session(bc, bo.session, &be), 0);
    free(col->text);
    free(col);
    sk_client_free(bc);
  }
  free(out);
  sinkctl_cancelled_by_another(sinkctl);
  sinkctl_refusals(sinkctl);
  /* a top_k beyond the vocabulary (512) keeps every token, as 0 does */
  snprintf(cmd, sizeof cmd, "%s --socket %s generate --top-k 100000 --seed 7 -n 12 Once",
           sinkctl, g_socket);
  char *wide = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  snprintf(cmd, sizeof cmd, "%s --socket %s generate --top-k 0 --seed 7 -n 12 Once", sinkctl,
           g_socket);
  out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  assert_string_equal(wide, out);
  assert_true(strlen(out) > strlen("Once\n"));
  free(wide);
  free(out);
  snprintf(cmd, sizeof cmd, "%s --socket %s/nope.sock ping 2>/dev/null", sinkctl, g_dir);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 3);
  json_decref(ref);
}


/* sinkctl eval over the first 2047 tokens of the stories: its dense
 * column equals llama.cpp's perplexity per block of 256 positions; the
 * other runs are there and finite; the CSV is written. */
static void test_eval_short(void **state) {
  (void)state;
  skip_under_valgrind(); /* memcheck would trace gnuplot too */
  const char *sinkctl = getenv("SK_SINKCTL");
  if (!sinkctl) sinkctl = "./client/sinkctl";
  char *text = sk_test_shared_path("data/stories-sampled.txt");
  char csv[512], png[512], cmd[2048];
  snprintf(csv, sizeof csv, "%s/eval.csv", g_dir);
  snprintf(png, sizeof png, "%s/eval.png", g_dir);
  snprintf(cmd, sizeof cmd,
           "%s --socket %s eval --tokens 2047 --span 256 --budget 64 --no-progress --run dense "
           "--run window --run streaming:sinks=4 --run h2o --run sink_h2o --run recompute "
           "--recompute-stride 64 --csv %s --plot %s %s",
           sinkctl, g_socket, csv, png, text);
  int status = -1;
  char *out = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  assert_non_null(strstr(out, "1793-2047"));
  assert_non_null(strstr(out, "all scored"));
  free(out);
  size_t len = 0;
  /* the plot: gnuplot (scripts/deps.sh --tests installs gnuplot-nox) drew a PNG */
  char *img = sk_test_read_file(png, &len);
  assert_non_null(img);
  assert_true(len > 1000);
  assert_memory_equal(img, "\x89PNG\r\n\x1a\n", 8);
  free(img);
  char *data = sk_test_read_file(csv, &len);
  assert_non_null(data);
  json_t *ref = sk_test_load_reference("logprobs.json");
  const json_t *spans =
      json_object_get(json_array_get(json_object_get(ref, "texts"), 0), "span_perplexities");
  assert_int_equal(json_array_size(spans), 8);
  char *line = strtok(data, "\n");
  assert_string_equal(line, "first,last,dense,window,streaming:sinks=4,h2o,sink_h2o,recompute");
  for (size_t i = 0; i < 8; i++) {
    line = strtok(NULL, "\n");
    assert_non_null(line);
    unsigned long first, last;
    double v[6];
    assert_int_equal(sscanf(line, "%lu,%lu,%lf,%lf,%lf,%lf,%lf,%lf", &first, &last, &v[0], &v[1],
                            &v[2], &v[3], &v[4], &v[5]),
                     8);
    const json_t *sp = json_array_get(spans, i);
    assert_int_equal(first, json_integer_value(json_object_get(sp, "first")));
    assert_int_equal(last, json_integer_value(json_object_get(sp, "last")));
    double want = json_real_value(json_object_get(sp, "perplexity"));
    if (!(fabs(v[0] / want - 1) < 1e-3)) fail_msg("span %zu: dense %.6g, want %.6g", i, v[0], want);
    for (int k = 1; k < 6; k++) assert_true(isfinite(v[k]) && v[k] > 1);
  }
  assert_null(strtok(NULL, "\n"));
  free(data);

  /* usage errors: exit 2, nothing sent */
  snprintf(cmd, sizeof cmd, "%s --socket %s eval --run lru %s 2>/dev/null", sinkctl, g_socket, text);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 2);
  snprintf(cmd, sizeof cmd, "%s --socket %s eval --run streaming:sink=4 %s 2>/dev/null", sinkctl,
           g_socket, text);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 2);
  /* a text that cannot be read: exit 1, as load's */
  snprintf(cmd, sizeof cmd, "%s --socket %s eval %s/missing.txt 2>/dev/null", sinkctl, g_socket,
           g_dir);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 1);
  /* given parts that leave the budget nothing for a derived one */
  const struct {
    const char *args, *msg;
  } no_room[] = {
      {"--run streaming:sinks=64 --budget 64",
       "--run streaming:sinks=64: 64 of --budget 64 go to its other parts, which leaves none "
       "for its window (take less, or a larger --budget)"},
      {"--budget 32 --run h2o:heavy=40", "40 of --budget 32 go to its other parts, which leaves "
                                         "none for its recent"},
      {"--budget 10 --run h2o:recent=10", "10 of --budget 10 go to its other parts, which leaves "
                                          "none for its heavy"},
      {"--run sink_h2o:sinks=4,recent=60 --budget 64", "64 of --budget 64 go to its other "
                                                       "parts, which leaves none for its heavy"},
      {"--budget 10 --run sink_h2o:heavy=10", "14 of --budget 10 go to its other parts, which "
                                              "leaves none for its recent"},
      {"--budget 4 --run streaming", "4 of --budget 4 go to its other parts, which leaves none "
                                     "for its window"},
      {"--run recompute:window=2,capacity=2", "--run recompute:window=2,capacity=2: capacity 2 "
                                              "must exceed its window 2"},
      {"--run window:rope_scale=65", "--run window:rope_scale=65: rope_scale: '65' is above 64"},
      {"--run window:window=0", "--run window:window=0: window: '0' is not in [1, "},
  };
  for (size_t i = 0; i < sizeof no_room / sizeof no_room[0]; i++) {
    snprintf(cmd, sizeof cmd, "%s --socket %s eval %s %s 2>&1", sinkctl, g_socket,
             no_room[i].args, text);
    char *msg = sk_test_run_capture(cmd, &status);
    assert_int_equal(status, 2);
    assert_non_null(strstr(msg, no_room[i].msg));
    free(msg);
  }
  /* the default runs a small budget cannot hold are left out, saying so */
  snprintf(cmd, sizeof cmd,
           "%s --socket %s eval --budget 4 --tokens 20 --no-progress %s 2>&1 >/dev/null", sinkctl,
           g_socket, text);
  char *notes = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 0);
  assert_string_equal(notes,
                      "sinkctl: eval: run streaming:sinks=4 left out: 4 of --budget 4 go to its "
                      "other parts, which leaves none for its window (take less, or a larger "
                      "--budget)\n"
                      "sinkctl: eval: run streaming:sinks=8 left out: 8 of --budget 4 go to its "
                      "other parts, which leaves none for its window (take less, or a larger "
                      "--budget)\n"
                      "sinkctl: eval: run sink_h2o left out: 6 of --budget 4 go to its other "
                      "parts, which leaves none for its heavy (take less, or a larger --budget)\n");
  free(notes);
  snprintf(cmd, sizeof cmd, "%s --socket %s eval --run window:sinks=1 %s 2>&1", sinkctl, g_socket,
           text);
  char *msg = sk_test_run_capture(cmd, &status);
  assert_int_equal(status, 2);
  assert_non_null(strstr(msg, "window has no parameter 'sinks'"));
  free(msg);
  /* a run the daemon refuses: exit 1 */
  snprintf(cmd, sizeof cmd, "%s --socket %s eval --tokens 10 --run dense:capacity=99999 %s 2>/dev/null",
           sinkctl, g_socket, text);
  free(sk_test_run_capture(cmd, &status));
  assert_int_equal(status, 1);
  free(text);
  json_decref(ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sinkctl),
      cmocka_unit_test(test_eval_short),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
