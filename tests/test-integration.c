/* Integration test: starts the real sinkd on a temporary socket with the
 * test model (testinteg.h) and drives it through libsinkd and raw frames:
 * hello, the tokenizer, greedy generation against llama.cpp, streams,
 * cancel, bad frames, batching, temporary sessions and copies, SIGTERM.
 * test-integration-sessions.c and test-integration-sinkctl.c are the
 * rest. */
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
      cmocka_unit_test(test_temporary_sessions),
      cmocka_unit_test(test_copies_hold_their_session),
      cmocka_unit_test(test_sigterm),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
