/* Integration test: starts the real sinkd on a temporary socket with the
 * test model and drives it through libsinkd, raw frames and sinkctl. */
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

static char *g_dir;
static char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char g_log[256];
static char g_state[256];
static pid_t g_pid;

static void dump_log(void) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  if (log) {
    fprintf(stderr, "---- sinkd log ----\n%s-------------------\n", log);
    free(log);
  }
}

static struct sk_client *connect_or_fail(void) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(g_socket, &c, &e) < 0) {
    dump_log();
    fail_msg("connect: %s", e.message);
  }
  sk_client_set_timeout(c, 120000, NULL);
  return c;
}

/* Memcheck runs the daemon some 50x slower. The longest streams (a
 * 200,000-token prefill, 10,000 evictions under a pin, 5,000 tokens, 16 x
 * 200 batched tokens, 2 x 2048 scored tokens, the evaluator with its
 * gnuplot child) would take it most of an hour; they run in the normal and ASan+UBSan builds, and memcheck covers
 * the same code paths through the shorter cases. */
static void skip_under_valgrind(void) {
  const char *t = getenv("SK_TEST_TOOL");
  if (t && strcmp(t, "valgrind") == 0) {
    print_message("skipped under valgrind (too long for memcheck; runs in the other builds)\n");
    skip();
  }
}

/* Compute threads of the daemon under test: 2 (the machine's cores), or
 * SK_TEST_THREADS. */
static const char *test_threads(void) {
  const char *t = getenv("SK_TEST_THREADS");
  return t && *t ? t : "2";
}

static int start_daemon(void **state) {
  (void)state;
  g_dir = sk_test_tmpdir();
  snprintf(g_socket, sizeof g_socket, "%s/sinkd.sock", g_dir);
  snprintf(g_log, sizeof g_log, "%s/sinkd.log", g_dir);
  snprintf(g_state, sizeof g_state, "%s/state", g_dir);
  const char *sinkd = getenv("SK_SINKD");
  if (!sinkd) sinkd = "./daemon/sinkd";
  g_pid = fork();
  if (g_pid == 0) {
    sk_test_child_setup();
    FILE *f = freopen(g_log, "w", stderr);
    (void)f;
    /* --config /dev/null: an installed /etc/sinkd/sinkd.conf must not
     * change what the test runs. */
    /* --kv-type f32: llama.cpp's reference values were taken with an f32
     * cache (its f16 default moves logits by ~0.016). */
    execl(sinkd, sinkd, "--config", "/dev/null", "--model", sk_test_model_path(), "--socket", g_socket, "--threads", test_threads(),
          "--state-dir", g_state, "--kv-type", "f32", "--verbose", (char *)NULL);
    _exit(127);
  }
  /* Ready when the socket accepts (valgrind takes seconds to start). */
  for (int i = 0; i < (sk_test_under_tool() ? 6000 : 500); i++) {
    struct sk_client *c = NULL;
    if (sk_client_connect(g_socket, &c, NULL) == 0) {
      sk_client_free(c);
      return 0;
    }
    usleep(20000);
  }
  dump_log();
  return -1;
}

static int stop_daemon(void **state) {
  (void)state;
  if (g_pid > 0) {
    kill(g_pid, SIGKILL);
    waitpid(g_pid, NULL, 0);
  }
  return 0;
}

/* ---- hello, ping, tokenizer through the daemon ---- */

static void test_hello_ping(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  struct sk_hello h;
  struct sk_error e = {0};
  assert_int_equal(sk_client_hello(c, &h, &e), 0);
  assert_int_equal(h.protocol, SK_PROTOCOL_VERSION);
  assert_string_equal(h.server, "sinkd");
  assert_int_equal(h.model.n_vocab, 512);
  assert_int_equal(h.model.n_layer, 5);
  assert_int_equal(h.model.dim, 64);
  assert_int_equal(h.model.n_head, 8);
  assert_int_equal(h.model.n_kv_head, 4);
  assert_int_equal(h.model.n_ctx_train, 2048);
  assert_string_equal(h.model.weight_type, "f32");
  assert_true(h.model.weight_bytes > 0);
  assert_true(strcmp(h.compute.kernel, "generic") == 0 || strcmp(h.compute.kernel, "avx2") == 0 ||
              strcmp(h.compute.kernel, "avx2-vnni") == 0 ||
              strcmp(h.compute.kernel, "avx512-vnni") == 0 ||
              strcmp(h.compute.kernel, "amx") == 0);
  assert_int_equal(h.compute.threads, atoi(test_threads())); /* --threads */
  assert_int_equal(h.compute.max_batch, 64);
  assert_string_equal(h.defaults.policy, "streaming");
  assert_int_equal(h.defaults.n_sink, 4);
  struct sk_daemon_stats ds;
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_string_equal(ds.compute.kernel, h.compute.kernel);
  assert_int_equal(ds.compute.threads, atoi(test_threads()));
  assert_int_equal(sk_client_ping(c, &e), 0);
  sk_client_free(c);
}

static void test_tokenize(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  json_t *ref = sk_test_load_reference("tokenize.json");
  json_t *cases = json_object_get(ref, "cases");
  size_t i;
  json_t *cs;
  json_array_foreach(cases, i, cs) {
    size_t len = 0;
    char *text = sk_test_hex_decode(json_string_value(json_object_get(cs, "text_utf8_hex")), &len);
    const char *variants[2] = {"with_bos", "without_bos"};
    for (int v = 0; v < 2; v++) {
      json_t *var = json_object_get(cs, variants[v]);
      size_t n_ref = 0;
      int32_t *ref_ids = sk_test_json_ids(json_object_get(var, "ids"), &n_ref);
      int32_t *ids = NULL;
      size_t n = 0;
      struct sk_error e = {0};
      assert_int_equal(sk_client_tokenize(c, text, len, v == 0 ? SK_BOS_TRUE : SK_BOS_FALSE, &ids, &n, &e), 0);
      assert_int_equal(n, n_ref);
      for (size_t k = 0; k < n; k++) assert_int_equal(ids[k], ref_ids[k]);
      char *out = NULL;
      size_t out_len = 0;
      assert_int_equal(sk_client_detokenize(c, ref_ids, n_ref, &out, &out_len, &e), 0);
      size_t want_len = 0;
      char *want = sk_test_hex_decode(json_string_value(json_object_get(var, "detokenized_hex")), &want_len);
      assert_int_equal(out_len, want_len);
      assert_memory_equal(out, want, want_len);
      free(want);
      free(out);
      free(ids);
      free(ref_ids);
    }
    free(text);
  }
  /* Ids outside the vocabulary are refused, not read out of bounds. */
  int32_t bad[3] = {1, 512, 2};
  char *out = NULL;
  size_t out_len = 0;
  struct sk_error e = {0};
  assert_int_equal(sk_client_detokenize(c, bad, 3, &out, &out_len, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "512"));
  int32_t neg[1] = {-1};
  assert_int_equal(sk_client_detokenize(c, neg, 1, &out, &out_len, &e), -SK_ERR_BAD_REQUEST);
  json_decref(ref);
  sk_client_free(c);
}

/* ---- greedy generation equals llama.cpp ---- */

struct collect {
  int32_t ids[8192];
  size_t n;
  double top_logit[8][10];
  int32_t top_id[8][10];
  size_t n_top_steps;
  bool text_valid;
  char *text;
  size_t text_len, text_cap;
  int cancel_after; /* > 0: return nonzero after this many tokens */
};

static int collect_cb(void *user, const struct sk_token_event *ev) {
  struct collect *col = user;
  if (col->n < sizeof col->ids / sizeof col->ids[0]) col->ids[col->n] = ev->token;
  if (col->n < 8 && ev->n_top == 10) {
    for (int k = 0; k < 10; k++) {
      col->top_id[col->n][k] = ev->top[k].token;
      col->top_logit[col->n][k] = ev->top[k].logit;
    }
    col->n_top_steps = col->n + 1;
  }
  if (!sk_utf8_valid(ev->text, ev->text_len)) col->text_valid = false;
  if (col->text_len + ev->text_len + 1 > col->text_cap) {
    col->text_cap = (col->text_len + ev->text_len + 1) * 2;
    col->text = realloc(col->text, col->text_cap);
  }
  memcpy(col->text + col->text_len, ev->text, ev->text_len);
  col->text_len += ev->text_len;
  col->text[col->text_len] = 0;
  col->n++;
  return col->cancel_after > 0 && col->n >= (size_t)col->cancel_after;
}

static void greedy_case(struct sk_client *c, json_t *p, const struct sk_open_params *op) {
  struct sk_error e = {0};
  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, op, &o, &e), 0);
  size_t n_prompt = 0;
  int32_t *prompt = sk_test_json_ids(json_object_get(p, "prompt_ids"), &n_prompt);
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(c, o.session, prompt, n_prompt, SK_BOS_DEFAULT, &ar, &e), 0);
  assert_int_equal(ar.n_tokens, n_prompt);
  assert_int_equal(ar.evicted, 0);
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, 64);
  gp.n_top = 10;
  struct collect *col = calloc(1, sizeof *col);
  col->text_valid = true;
  struct sk_generate_result gr;
  assert_int_equal(sk_client_generate(c, o.session, &gp, collect_cb, col, &gr, &e), 0);
  assert_string_equal(gr.stop, "length");
  assert_int_equal(gr.n_tokens, 64);
  assert_int_equal(gr.evicted, 0);
  size_t n_ref = 0;
  int32_t *ref = sk_test_json_ids(json_object_get(p, "generated_ids"), &n_ref);
  assert_int_equal(col->n, n_ref);
  for (size_t i = 0; i < n_ref; i++) assert_int_equal(col->ids[i], ref[i]);
  /* Top-10 logits of the first decode steps. */
  json_t *steps = json_object_get(p, "steps");
  assert_int_equal(col->n_top_steps, 8);
  for (size_t s = 0; s < json_array_size(steps); s++) {
    json_t *top10 = json_object_get(json_array_get(steps, s), "top10");
    for (size_t k = 0; k < 10; k++) {
      json_t *pair = json_array_get(top10, k);
      assert_int_equal(col->top_id[s][k], json_integer_value(json_array_get(pair, 0)));
      double want = json_number_value(json_array_get(pair, 1));
      if (fabs(col->top_logit[s][k] - want) > 1e-4)
        fail_msg("step %zu top %zu: logit %.7f, llama.cpp %.7f", s, k, col->top_logit[s][k], want);
    }
  }
  /* The streamed text equals llama.cpp's pieces joined. */
  assert_true(col->text_valid);
  const char *want_text = json_string_value(json_object_get(p, "generated_text"));
  assert_string_equal(col->text, want_text);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  free(col->text);
  free(col);
  free(ref);
  free(prompt);
}

static void test_greedy_dense_and_streaming(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  json_t *ref = sk_test_load_reference("greedy.json");
  json_t *prompts = json_object_get(ref, "prompts");
  struct sk_open_params dense = {.policy = "dense", .capacity = 512};
  struct sk_open_params streaming = {.policy = "streaming", .n_sink = 4, .window = 508};
  for (size_t i = 0; i < json_array_size(prompts); i++) {
    greedy_case(c, json_array_get(prompts, i), &dense);
    greedy_case(c, json_array_get(prompts, i), &streaming);
  }
  json_decref(ref);
  sk_client_free(c);
}

/* The prompt given as text (BOS added because the session is empty). */
static void test_generate_with_text_prompt(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  json_t *ref = sk_test_load_reference("greedy.json");
  json_t *p = json_array_get(json_object_get(ref, "prompts"), 0);
  struct sk_error e = {0};
  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, NULL, &o, &e), 0);
  assert_string_equal(o.policy, "streaming");
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = 64;
  gp.temperature = 0;
  gp.prompt = json_string_value(json_object_get(p, "prompt"));
  struct collect *col = calloc(1, sizeof *col);
  struct sk_generate_result gr;
  assert_int_equal(sk_client_generate(c, o.session, &gp, collect_cb, col, &gr, &e), 0);
  size_t n_ref = 0;
  int32_t *want = sk_test_json_ids(json_object_get(p, "generated_ids"), &n_ref);
  assert_int_equal(gr.prompt_tokens, json_integer_value(json_object_get(p, "n_prompt_tokens")));
  assert_int_equal(col->n, n_ref);
  for (size_t i = 0; i < n_ref; i++) assert_int_equal(col->ids[i], want[i]);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  /* A closed session is gone. */
  assert_int_equal(sk_client_close_session(c, o.session, &e), -SK_ERR_NO_SUCH_SESSION);
  free(want);
  free(col->text);
  free(col);
  json_decref(ref);
  sk_client_free(c);
}

/* ---- dense context_full, streaming at constant memory, ping latency ---- */

static void test_dense_context_full(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  struct sk_open_params dense = {.policy = "dense", .capacity = 16};
  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, &dense, &o, &e), 0);
  assert_int_equal(o.capacity, 16);
  int32_t toks[20];
  for (int i = 0; i < 20; i++) toks[i] = 300 + i;
  /* Too long: refused whole, with the counts. */
  assert_int_equal(sk_client_append_tokens(c, o.session, toks, 20, SK_BOS_DEFAULT, NULL, &e),
                   -SK_ERR_CONTEXT_FULL);
  assert_non_null(strstr(e.message, "20 tokens"));
  assert_non_null(strstr(e.message, "16 of 16"));
  struct sk_session_stats st;
  assert_int_equal(sk_client_session_stats(c, o.session, &st, &e), 0);
  assert_int_equal(st.resident, 0);
  assert_int_equal(st.seen, 0);
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(c, o.session, toks, 10, SK_BOS_DEFAULT, &ar, &e), 0);
  assert_int_equal(ar.resident, 10);
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, 20);
  struct sk_generate_result gr;
  assert_int_equal(sk_client_generate(c, o.session, &gp, NULL, NULL, &gr, &e), 0);
  assert_string_equal(gr.stop, "context_full");
  assert_int_equal(gr.n_tokens, 6);
  assert_int_equal(gr.resident, 16);
  assert_int_equal(gr.evicted, 0);
  /* Token ids outside the vocabulary. */
  int32_t bad[2] = {5, 512};
  assert_int_equal(sk_client_append_tokens(c, o.session, bad, 2, SK_BOS_DEFAULT, NULL, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "512"));
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  sk_client_free(c);
}

struct long_run {
  uint64_t session;
  uint32_t n;
  int rc;
  struct sk_generate_result gr;
  struct sk_error e;
  atomic_int done;
};

static void *long_generate(void *arg) {
  struct long_run *lr = arg;
  struct sk_client *c = NULL;
  if (sk_client_connect(g_socket, &c, &lr->e) < 0) {
    lr->rc = -1;
    lr->done = 1;
    return NULL;
  }
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = lr->n;
  gp.temperature = 1.0;
  gp.seed = 42;
  gp.has_seed = true;
  gp.ignore_eos = true;
  lr->rc = sk_client_generate(c, lr->session, &gp, NULL, NULL, &lr->gr, &lr->e);
  sk_client_free(c);
  lr->done = 1;
  return NULL;
}

static void test_streaming_5000_tokens(void **state) {
  (void)state;
  skip_under_valgrind();
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  struct sk_open_params sp = {.policy = "streaming", .n_sink = 4, .window = 60};
  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, &sp, &o, &e), 0);
  assert_int_equal(o.capacity, 64);
  const char *prompt = "Once upon a time";
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_text(c, o.session, prompt, strlen(prompt), SK_BOS_DEFAULT, &ar, &e), 0);
  assert_int_equal(ar.n_tokens, 5);

  struct long_run first = {.session = o.session, .n = 100};
  long_generate(&first);
  assert_int_equal(first.rc, 0);
  assert_int_equal(first.gr.n_tokens, 100);
  long rss_100 = sk_test_proc_rss_kib(g_pid);

  /* The rest in a thread while this thread pings on another connection. */
  struct long_run rest = {.session = o.session, .n = 4900};
  pthread_t th;
  pthread_create(&th, NULL, long_generate, &rest);
  double worst = 0;
  int pings = 0;
  usleep(20000);
  while (!rest.done) {
    double t0 = sk_test_now();
    assert_int_equal(sk_client_ping(c, &e), 0);
    double dt = sk_test_now() - t0;
    if (dt > worst) worst = dt;
    pings++;
    usleep(5000);
  }
  pthread_join(th, NULL);
  assert_int_equal(rest.rc, 0);
  assert_int_equal(rest.gr.n_tokens, 4900);
  long rss_5000 = sk_test_proc_rss_kib(g_pid);
  print_message("pings during generation: %d, worst round trip %.2f ms\n", pings, worst * 1e3);
  print_message("daemon RSS after 100 tokens %ld KiB, after 5000 tokens %ld KiB\n", rss_100, rss_5000);
  assert_true(pings >= 5);
  /* Pings are answered while the model generates: the loop thread never
   * runs the model. The latency is a figure to report, printed above, not
   * asserted: a unit test is no place for a timing target. The memory
   * figure measures the allocator of a sanitizer or valgrind when one
   * runs (SK_TEST_TOOL). */
  if (!sk_test_under_tool()) assert_true(labs(rss_5000 - rss_100) <= 1024);

  struct sk_session_stats st;
  assert_int_equal(sk_client_session_stats(c, o.session, &st, &e), 0);
  assert_int_equal(st.resident, 64);
  assert_int_equal(st.seen, 5005);
  assert_int_equal(st.evicted, 5005 - 64);
  assert_int_equal(st.capacity, 64);
  assert_true(st.has_positions);
  assert_int_equal(st.position_first, 0);
  assert_int_equal(st.position_last, 63);
  /* The evictions of the last request: one range of consecutive indices
   * right after the sinks' survivors. */
  assert_int_equal(rest.gr.evicted, 4900);
  assert_int_equal(rest.gr.n_ranges, 1);
  assert_int_equal(rest.gr.ranges[0].first, 4 + (105 - 64));
  assert_int_equal(rest.gr.ranges[0].last, 4 + (105 - 64) + 4900 - 1);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  sk_client_free(c);
}

static void test_cancel(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, NULL, &o, &e), 0);
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = 100000;
  gp.ignore_eos = true;
  gp.prompt = "Once upon a time";
  struct collect *col = calloc(1, sizeof *col);
  col->cancel_after = 10;
  struct sk_generate_result gr;
  assert_int_equal(sk_client_generate(c, o.session, &gp, collect_cb, col, &gr, &e), 0);
  assert_string_equal(gr.stop, "cancelled");
  assert_true(gr.n_tokens >= 10 && gr.n_tokens < 100000);
  struct sk_session_stats st;
  assert_int_equal(sk_client_session_stats(c, o.session, &st, &e), 0);
  assert_int_equal(st.seen, 5 + gr.n_tokens);
  bool any = true;
  assert_int_equal(sk_client_cancel(c, o.session, &any, &e), 0);
  assert_false(any);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  free(col->text);
  free(col);
  sk_client_free(c);
}

/* ---- bad input on a raw connection ---- */

static void read_all(int fd, void *p, size_t n) {
  char *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r <= 0) fail_msg("read: connection closed or timed out");
    b += r;
    n -= (size_t)r;
  }
}

/* Reads one reply; returns its error code name ("" if ok) in code. */
static void read_reply(int fd, uint64_t *ret_id, char *code, size_t code_size) {
  uint8_t hdr[4];
  read_all(fd, hdr, 4);
  uint32_t n = sk_frame_header_get(hdr);
  assert_true(n > 0 && n < (1u << 20));
  uint8_t *body = malloc(n);
  read_all(fd, body, n);
  struct sk_msg m;
  struct sk_error e;
  assert_int_equal(sk_msg_parse(body, n, &m, &e), 0);
  uint64_t id = 0;
  assert_int_equal(sk_msg_need_u64(&m.root, "id", UINT64_MAX, &id, &e), 0);
  *ret_id = id;
  code[0] = 0;
  const msgpack_object *err = sk_msg_get(&m.root, "error");
  if (err) {
    const char *s = NULL;
    size_t len = 0;
    assert_int_equal(sk_msg_need_str(err, "code", &s, &len, &e), 0);
    snprintf(code, code_size, "%.*s", (int)len, s);
  }
  sk_msg_free(&m);
  free(body);
}

static void send_frame(int fd, const void *body, uint32_t n) {
  uint8_t hdr[4];
  sk_frame_header_put(hdr, n);
  sk_test_write_all(fd, hdr, 4);
  if (n) sk_test_write_all(fd, body, n);
}

static void expect(int fd, const void *body, uint32_t n, uint64_t want_id, const char *want_code) {
  send_frame(fd, body, n);
  uint64_t id;
  char code[64];
  read_reply(fd, &id, code, sizeof code);
  assert_int_equal(id, want_id);
  assert_string_equal(code, want_code);
}

static void test_bad_frames(void **state) {
  (void)state;
  int fd = sk_test_raw_connect(g_socket, 10000);
  static const uint8_t ping[] = {0x82, 0xa2, 'i', 'd', 0x07, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g'};
  expect(fd, ping, sizeof ping, 7, "");
  /* Unknown op. */
  static const uint8_t nope[] = {0x82, 0xa2, 'i', 'd', 0x08, 0xa2, 'o', 'p', 0xa4, 'n', 'o', 'p', 'e'};
  expect(fd, nope, sizeof nope, 8, "unknown_op");
  /* Not msgpack / truncated / not a map / empty. */
  static const uint8_t junk[] = {0xc1, 0x00};
  expect(fd, junk, sizeof junk, 0, "bad_request");
  expect(fd, ping, sizeof ping - 3, 0, "bad_request");
  static const uint8_t arr[] = {0x91, 0x01};
  expect(fd, arr, sizeof arr, 0, "bad_request");
  expect(fd, NULL, 0, 0, "bad_request");
  /* array32 of 2^32-1 elements in 5 bytes. */
  static const uint8_t huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
  expect(fd, huge, sizeof huge, 0, "bad_request");
  /* Missing id, mistyped id, missing op. */
  static const uint8_t noid[] = {0x81, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g'};
  expect(fd, noid, sizeof noid, 0, "bad_request");
  static const uint8_t strid[] = {0x82, 0xa2, 'i', 'd', 0xa1, 'x', 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g'};
  expect(fd, strid, sizeof strid, 0, "bad_request");
  static const uint8_t noop[] = {0x81, 0xa2, 'i', 'd', 0x09};
  expect(fd, noop, sizeof noop, 9, "bad_request");
  /* open with a mistyped field; append to a session that does not exist. */
  static const uint8_t badopen[] = {0x83, 0xa2, 'i', 'd', 0x0a, 0xa2, 'o', 'p', 0xa4, 'o', 'p', 'e', 'n',
                                    0xa6, 'w', 'i', 'n', 'd', 'o', 'w', 0xa2, 'n', 'o'};
  expect(fd, badopen, sizeof badopen, 10, "bad_request");
  static const uint8_t nosess[] = {0x84, 0xa2, 'i', 'd', 0x0b, 0xa2, 'o', 'p', 0xa6, 'a', 'p', 'p', 'e', 'n', 'd',
                                   0xa7, 's', 'e', 's', 's', 'i', 'o', 'n', 0xcd, 0x27, 0x0f,
                                   0xa4, 't', 'e', 'x', 't', 0xa1, 'x'};
  expect(fd, nosess, sizeof nosess, 11, "no_such_session");
  /* An oversized frame: refused from its header, body skipped, stream in
   * sync. */
  uint32_t big = (1u << 20) + 1;
  uint8_t *body = calloc(1, big);
  expect(fd, body, big, 0, "too_large");
  free(body);
  /* A frame split into single bytes. */
  uint8_t hdr[4];
  sk_frame_header_put(hdr, sizeof ping);
  for (int i = 0; i < 4; i++) sk_test_write_all(fd, hdr + i, 1);
  for (size_t i = 0; i < sizeof ping; i++) {
    sk_test_write_all(fd, ping + i, 1);
    usleep(1000);
  }
  uint64_t id;
  char code[64];
  read_reply(fd, &id, code, sizeof code);
  assert_int_equal(id, 7);
  assert_string_equal(code, "");
  close(fd);
  /* The daemon still serves everyone. */
  struct sk_client *c = connect_or_fail();
  assert_int_equal(sk_client_ping(c, NULL), 0);
  sk_client_free(c);
}

/* Pipelining: two requests sent before reading; replies carry their ids. */
static void test_pipelining(void **state) {
  (void)state;
  int fd = sk_test_raw_connect(g_socket, 10000);
  static const uint8_t a[] = {0x82, 0xa2, 'i', 'd', 0x15, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g'};
  static const uint8_t b[] = {0x82, 0xa2, 'i', 'd', 0x16, 0xa2, 'o', 'p', 0xa5, 'h', 'e', 'l', 'l', 'o'};
  send_frame(fd, a, sizeof a);
  send_frame(fd, b, sizeof b);
  uint64_t id;
  char code[64];
  read_reply(fd, &id, code, sizeof code);
  assert_int_equal(id, 0x15);
  read_reply(fd, &id, code, sizeof code);
  assert_int_equal(id, 0x16);
  assert_string_equal(code, "");
  close(fd);
}

/* ---- batching across sessions ---- */

struct batch_run {
  uint64_t session;
  int32_t prompt[40];
  size_t n_prompt;
  int32_t ids[200];
  size_t n;
  pthread_barrier_t *start; /* NULL: run now */
  int rc;                   /* first error (cmocka asserts on the main thread only) */
  struct sk_error err;
};

static int batch_cb(void *user, const struct sk_token_event *ev) {
  struct batch_run *r = user;
  if (r->n < sizeof r->ids / sizeof r->ids[0]) r->ids[r->n++] = ev->token;
  return 0;
}

/* Appends the prompt, waits for the others, generates 200 greedy tokens. */
static void *batch_session(void *arg) {
  struct batch_run *r = arg;
  struct sk_client *c = NULL;
  r->rc = sk_client_connect(g_socket, &c, &r->err);
  if (r->rc < 0) {
    if (r->start) pthread_barrier_wait(r->start);
    return NULL;
  }
  sk_client_set_timeout(c, 120000, NULL);
  struct sk_append_result ar;
  r->rc = sk_client_append_tokens(c, r->session, r->prompt, r->n_prompt, SK_BOS_FALSE, &ar, &r->err);
  if (r->start) pthread_barrier_wait(r->start);
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, 200);
  struct sk_generate_result gr;
  r->n = 0;
  if (r->rc == 0) r->rc = sk_client_generate(c, r->session, &gp, batch_cb, r, &gr, &r->err);
  sk_client_free(c);
  return NULL;
}

/* Greedy outputs unchanged by batching: 16 sessions (dense, and streaming
 * windows small enough to evict while they generate) give the same 200
 * tokens when each runs alone as when all 16 run at once, which the
 * daemon serves with shared forward passes (far fewer steps than tokens). */
static void test_batching_unchanged(void **state) {
  (void)state;
  skip_under_valgrind();
  enum { NS = 16 };
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  static struct batch_run alone[NS], together[NS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, NS);
  for (int pass = 0; pass < 2; pass++) {
    struct batch_run *runs = pass ? together : alone;
    for (int i = 0; i < NS; i++) {
      struct sk_open_params op = {0};
      if (i % 3 == 0) {
        op.policy = "dense";
        op.capacity = 256;
      } else {
        op.policy = "streaming";
        op.n_sink = 4;
        op.window = 40 + 20 * (uint32_t)i; /* 60..340: some evict, some do not */
      }
      struct sk_open_result o;
      assert_int_equal(sk_client_open(c, &op, &o, &e), 0);
      runs[i].session = o.session;
      runs[i].n_prompt = 5 + (size_t)i * 2;
      runs[i].prompt[0] = 1;
      for (size_t j = 1; j < runs[i].n_prompt; j++) runs[i].prompt[j] = (int32_t)(3 + (i * 31 + j * 17) % 500);
      runs[i].start = pass ? &start : NULL;
    }
    struct sk_daemon_stats before, after;
    assert_int_equal(sk_client_stats(c, &before, &e), 0);
    if (pass == 0) {
      for (int i = 0; i < NS; i++) batch_session(&runs[i]);
    } else {
      pthread_t th[NS];
      for (int i = 0; i < NS; i++) assert_int_equal(pthread_create(&th[i], NULL, batch_session, &runs[i]), 0);
      for (int i = 0; i < NS; i++) pthread_join(th[i], NULL);
    }
    for (int i = 0; i < NS; i++)
      if (runs[i].rc < 0) fail_msg("session %d: %s", i, runs[i].err.message);
    assert_int_equal(sk_client_stats(c, &after, &e), 0);
    uint64_t steps = after.steps - before.steps;
    uint64_t tokens = after.tokens_generated - before.tokens_generated;
    assert_int_equal(tokens, NS * 200);
    printf("%s: %" PRIu64 " tokens in %" PRIu64 " forward passes\n",
           pass ? "16 sessions at once" : "16 sessions one after another", tokens, steps);
    if (pass) assert_true(steps * 4 < tokens); /* batched: > 4 tokens per pass on average */
    else assert_true(steps >= tokens);         /* alone: one token per pass at most */
    for (int i = 0; i < NS; i++) assert_int_equal(sk_client_close_session(c, runs[i].session, &e), 0);
  }
  for (int i = 0; i < NS; i++) {
    assert_int_equal(alone[i].n, 200);
    assert_int_equal(together[i].n, 200);
    if (memcmp(alone[i].ids, together[i].ids, sizeof alone[i].ids) != 0)
      fail_msg("session %d: tokens differ when batched with 15 others", i);
  }
  pthread_barrier_destroy(&start);
  sk_client_free(c);
}

struct long_append {
  uint64_t session;
  int32_t *tokens;
  size_t n;
  atomic_bool done;
  struct sk_append_result ar;
  int rc;
  struct sk_error err;
};

static void *long_append_main(void *arg) {
  struct long_append *la = arg;
  struct sk_client *c = NULL;
  la->rc = sk_client_connect(g_socket, &c, &la->err);
  if (la->rc == 0) {
    sk_client_set_timeout(c, 300000, NULL);
    la->rc = sk_client_append_tokens(c, la->session, la->tokens, la->n, SK_BOS_FALSE, &la->ar,
                                     &la->err);
    sk_client_free(c);
  }
  atomic_store(&la->done, true);
  return NULL;
}

/* A long prefill is chunked: a session that starts generating while
 * another appends 200000 tokens gets all its tokens long before that
 * append ends (it is served every step; the append needs thousands). */
static void test_long_prefill_does_not_block(void **state) {
  (void)state;
  skip_under_valgrind();
  if (sk_test_under_tool()) { /* 200,000 tokens under ASan+UBSan take minutes */
    print_message("skipped under %s (runs in the normal build)\n", getenv("SK_TEST_TOOL"));
    skip();
  }
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  struct sk_open_params sp = {.policy = "streaming", .n_sink = 4, .window = 60};
  struct sk_open_result oa, ob;
  assert_int_equal(sk_client_open(c, &sp, &oa, &e), 0);
  assert_int_equal(sk_client_open(c, &sp, &ob, &e), 0);
  static struct long_append la;
  la.session = oa.session;
  la.n = 200000;
  la.tokens = malloc(la.n * sizeof *la.tokens);
  for (size_t i = 0; i < la.n; i++) la.tokens[i] = (int32_t)(3 + i * 7 % 500);
  atomic_store(&la.done, false);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, long_append_main, &la), 0);
  /* wait until the append is running */
  for (int i = 0; i < 1000; i++) {
    struct sk_session_stats ss;
    assert_int_equal(sk_client_session_stats(c, oa.session, &ss, &e), 0);
    if (ss.seen > 0) break;
    usleep(1000);
  }
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, 32);
  gp.prompt = "Once upon a time";
  struct sk_generate_result gr;
  assert_int_equal(sk_client_generate(c, ob.session, &gp, NULL, NULL, &gr, &e), 0);
  assert_int_equal(gr.n_tokens, 32);
  bool append_done_first = atomic_load(&la.done);
  pthread_join(th, NULL);
  if (la.rc < 0) fail_msg("long append: %s", la.err.message);
  assert_false(append_done_first);
  assert_int_equal(la.ar.n_tokens, la.n);
  assert_int_equal(la.ar.evicted, la.n - 64); /* 4 sinks + 60 stay */
  assert_int_equal(sk_client_close_session(c, oa.session, &e), 0);
  assert_int_equal(sk_client_close_session(c, ob.session, &e), 0);
  free(la.tokens);
  sk_client_free(c);
}

/* ---- sinkctl ---- */

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

/* ---- policies, pins, eviction reports, logprobs, eval ---- */

/* Sessions the daemon lists for this uid. */
static size_t count_sessions(struct sk_client *c) {
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  struct sk_error e = {0};
  if (sk_client_list(c, &rows, &n, &e) < 0) fail_msg("list: %s", e.message);
  free(rows);
  return n;
}

/* Polls until the daemon lists `want` sessions (the close of a finished
 * connection happens on the daemon's side, a moment later); fails after
 * 20 s. */
static void wait_sessions(struct sk_client *c, size_t want) {
  double t0 = sk_test_now();
  size_t n;
  while ((n = count_sessions(c)) != want) {
    if (sk_test_now() - t0 > 20) fail_msg("%zu sessions listed, expected %zu", n, want);
    usleep(20000);
  }
}

/* A session opened temporary ends with the connection that opened it,
 * however the client ends; others outlive their connection. */
static void test_temporary_sessions(void **state) {
  (void)state;
  struct sk_error e = {0};
  struct sk_client *b = connect_or_fail();
  const size_t n0 = count_sessions(b);
  struct sk_client *a = connect_or_fail();
  struct sk_open_result tmp, keep;
  struct sk_open_params op = {.temporary = true};
  assert_int_equal(sk_client_open(a, &op, &tmp, &e), 0);
  assert_int_equal(sk_client_open(a, NULL, &keep, &e), 0);
  assert_int_equal(count_sessions(b), n0 + 2);
  sk_client_free(a);
  wait_sessions(b, n0 + 1);
  struct sk_session_stats st;
  assert_int_equal(sk_client_session_stats(b, tmp.session, &st, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(sk_client_session_stats(b, keep.session, &st, &e), 0);
  assert_int_equal(sk_client_close_session(b, keep.session, &e), 0);
  assert_int_equal(count_sessions(b), n0);

  /* sinkctl generate without --session, killed by SIGPIPE mid-stream:
   * its session goes too */
  const char *sinkctl = getenv("SK_SINKCTL");
  if (!sinkctl) sinkctl = "./client/sinkctl";
  char cmd[1400];
  snprintf(cmd, sizeof cmd,
           "%s --socket %s generate --ignore-eos -n 100000 Once 2>/dev/null | head -c 1",
           sinkctl, g_socket);
  int status;
  char *out = sk_test_run_capture(cmd, &status);
  assert_string_equal(out, "O");
  free(out);
  wait_sessions(b, n0);
  sk_client_free(b);
}

/* A request {id, op, session} as one frame on fd. */
static void send_session_op(int fd, uint64_t id, const char *op, uint64_t session) {
  struct sk_msgbuf b;
  assert_int_equal(sk_msgbuf_init(&b), 0);
  sk_test_pack_kv_u64(&b.pk, "id", id);
  sk_test_pack_kv_str(&b.pk, "op", op);
  sk_test_pack_kv_u64(&b.pk, "session", session);
  int64_t n = sk_test_msgbuf_finish_map(&b);
  assert_true(n > 0);
  sk_test_write_all(fd, b.sbuf.data, (size_t)n);
  sk_msgbuf_free(&b);
}

/* fork and export copy in a worker thread while their session is held: a
 * close sent behind a fork answers at once, the request queued between
 * them is cancelled or served, and the fork still comes out whole (the
 * source's tokens) while the source goes; a client that leaves during an
 * export leaves nothing behind and the daemon serves on. */
static void test_copies_hold_their_session(void **state) {
  (void)state;
  struct sk_client *c = connect_or_fail();
  struct sk_error e = {0};
  const size_t n0 = count_sessions(c);
  struct sk_open_result src;
  assert_int_equal(sk_client_open(c, NULL, &src, &e), 0);
  const char *text = "Once upon a time, there was a little dog named Spot.";
  assert_int_equal(sk_client_append_text(c, src.session, text, strlen(text), SK_BOS_TRUE, NULL, &e),
                   0);
  struct sk_session_stats st0;
  assert_int_equal(sk_client_session_stats(c, src.session, &st0, &e), 0);
  assert_true(st0.resident > 10);

  int fd = sk_test_raw_connect(g_socket, 10000);
  send_session_op(fd, 1, "fork", src.session);
  send_session_op(fd, 2, "stats", src.session);
  send_session_op(fd, 3, "close", src.session);
  bool seen[4] = {false};
  for (int i = 0; i < 3; i++) {
    uint64_t id;
    char code[64];
    read_reply(fd, &id, code, sizeof code);
    assert_true(id >= 1 && id <= 3 && !seen[id]);
    seen[id] = true;
    if (id == 2) {
      if (code[0] && strcmp(code, "cancelled") != 0) fail_msg("stats: %s", code);
    } else if (code[0]) {
      fail_msg("request %llu: %s", (unsigned long long)id, code);
    }
  }
  close(fd);
  wait_sessions(c, n0 + 1); /* the fork, not the source */
  assert_int_equal(sk_client_session_stats(c, src.session, &st0, &e), -SK_ERR_NO_SUCH_SESSION);
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  assert_int_equal(sk_client_list(c, &rows, &n, &e), 0);
  uint64_t fork_id = 0;
  for (size_t i = 0; i < n; i++)
    if (rows[i].session > src.session) fork_id = rows[i].session;
  free(rows);
  assert_true(fork_id > src.session);
  struct sk_session_stats st1;
  assert_int_equal(sk_client_session_stats(c, fork_id, &st1, &e), 0);
  assert_int_equal(st1.resident, st0.resident);
  assert_int_equal(st1.seen, st0.seen);

  /* list is in id order, also when a new session takes a closed one's
   * place in the daemon's table */
  struct sk_open_params lp = {.policy = "dense", .capacity = 16};
  struct sk_open_result la, lb, lc;
  assert_int_equal(sk_client_open(c, &lp, &la, &e), 0);
  assert_int_equal(sk_client_open(c, &lp, &lb, &e), 0);
  assert_int_equal(sk_client_close_session(c, la.session, &e), 0);
  assert_int_equal(sk_client_open(c, &lp, &lc, &e), 0);
  assert_int_equal(sk_client_list(c, &rows, &n, &e), 0);
  assert_true(n >= 2);
  for (size_t i = 1; i < n; i++) assert_true(rows[i].session > rows[i - 1].session);
  assert_int_equal(rows[n - 1].session, lc.session);
  free(rows);
  assert_int_equal(sk_client_close_session(c, lb.session, &e), 0);
  assert_int_equal(sk_client_close_session(c, lc.session, &e), 0);

  /* an open whose client leaves during its pin's prefill (~2000 tokens):
   * nobody learned the id, nothing is kept (not under valgrind: its
   * prefill takes a minute there) */
  const char *tool = getenv("SK_TEST_TOOL");
  if (!tool || strcmp(tool, "valgrind") != 0) {
    fd = sk_test_raw_connect(g_socket, 10000);
    static const char piece[] = "Once upon a time, there was a dog. ";
    size_t reps = 180;
    char *pin = malloc(reps * (sizeof piece - 1) + 1);
    for (size_t i = 0; i < reps; i++) memcpy(pin + i * (sizeof piece - 1), piece, sizeof piece - 1);
    struct sk_msgbuf b;
    assert_int_equal(sk_msgbuf_init(&b), 0);
    sk_test_pack_kv_u64(&b.pk, "id", 1);
    sk_test_pack_kv_str(&b.pk, "op", "open");
    sk_test_pack_kv_str(&b.pk, "policy", "dense");
    sk_test_pack_kv_u64(&b.pk, "capacity", 2048);
    sk_test_pack_kv_f64(&b.pk, "rope_scale", 1);
    sk_test_pack_kv_strn(&b.pk, "pin", pin, reps * (sizeof piece - 1));
    int64_t fn = sk_test_msgbuf_finish_map(&b);
    assert_true(fn > 0);
    sk_test_write_all(fd, b.sbuf.data, (size_t)fn);
    sk_msgbuf_free(&b);
    free(pin);
    wait_sessions(c, n0 + 2); /* the fork and the new one, whose pin goes in */
    close(fd);
    wait_sessions(c, n0 + 1); /* the fork only */
  }

  /* an export whose client leaves at once */
  fd = sk_test_raw_connect(g_socket, 10000);
  send_session_op(fd, 1, "export", fork_id);
  close(fd);
  assert_int_equal(sk_client_ping(c, &e), 0);
  assert_int_equal(sk_client_session_stats(c, fork_id, &st1, &e), 0);
  assert_int_equal(st1.resident, st0.resident);
  assert_int_equal(sk_client_close_session(c, fork_id, &e), 0);
  assert_int_equal(count_sessions(c), n0);
  sk_client_free(c);
}

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

/* Last: SIGTERM shuts down cleanly and removes the socket file. */
static void test_sigterm(void **state) {
  (void)state;
  struct stat st;
  assert_int_equal(stat(g_socket, &st), 0);
  kill(g_pid, SIGTERM);
  int status = 0;
  double t0 = sk_test_now();
  pid_t r;
  while ((r = waitpid(g_pid, &status, WNOHANG)) == 0 && sk_test_now() - t0 < (sk_test_under_tool() ? 300 : 10))
    usleep(10000);
  assert_int_equal(r, g_pid);
  g_pid = 0;
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(stat(g_socket, &st), -1);
  assert_int_equal(errno, ENOENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hello_ping),
      cmocka_unit_test(test_tokenize),
      cmocka_unit_test(test_greedy_dense_and_streaming),
      cmocka_unit_test(test_generate_with_text_prompt),
      cmocka_unit_test(test_dense_context_full),
      cmocka_unit_test(test_streaming_5000_tokens),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_bad_frames),
      cmocka_unit_test(test_pipelining),
      cmocka_unit_test(test_batching_unchanged),
      cmocka_unit_test(test_long_prefill_does_not_block),
      cmocka_unit_test(test_sinkctl),
      cmocka_unit_test(test_temporary_sessions),
      cmocka_unit_test(test_copies_hold_their_session),
      cmocka_unit_test(test_logprobs_through_daemon),
      cmocka_unit_test(test_generate_logprobs),
      cmocka_unit_test(test_utf8_across_generates),
      cmocka_unit_test(test_pin_survives_10000_evictions),
      cmocka_unit_test(test_h2o_through_daemon),
      cmocka_unit_test(test_open_policies),
      cmocka_unit_test(test_eval_short),
      cmocka_unit_test(test_sigterm),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
