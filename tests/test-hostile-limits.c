/* Hostile clients against a live daemon (testhostile.h): clients that
 * vanish before their reply or half-close, bursts of opens past the
 * session limits, partial frames against the input memory ceiling, idle
 * connections' buffers returned, a model with NaN weights. */
#include <errno.h>
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "session/session.h"
#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"
#include "testhostile.h"

/* A client that sends a request and vanishes before the reply; one that
 * half-closes; SIGPIPE must not kill the daemon. */
static void test_vanishing_clients(void **state) {
  (void)state;
  for (int i = 0; i < 50; i++) {
    int fd = sk_test_raw_connect(g_d.socket, 5000);
    struct sk_test_req r;
    sk_test_req_init(&r);
    msgpack_pack_map(&r.pk, 3);
    sk_test_req_key(&r, "id");
    msgpack_pack_uint32(&r.pk, 1);
    sk_test_req_key(&r, "op");
    sk_test_req_key(&r, i % 2 ? "tokenize" : "hello");
    sk_test_req_key(&r, "text");
    sk_test_req_key(&r, "Once upon a time there was a little girl");
    size_t n;
    const uint8_t *f = sk_test_req_frame(&r, &n);
    /* Many requests, then gone without reading. */
    for (int k = 0; k < 20; k++) sk_test_try_write_all(fd, f, n);
    struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* RST, not FIN */
    if (i % 3 == 0) setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    sk_test_req_free(&r);
  }
  assert_true(sk_test_daemon_alive(&g_d));
  struct sk_client *c = NULL;
  assert_int_equal(sk_client_connect(g_d.socket, &c, NULL), 0);
  assert_int_equal(sk_client_ping(c, NULL), 0);
  sk_client_free(c);
}

/* Opens whose objects are made on the daemon's thread pool still respect
 * the limits when they arrive together: a burst of opens in one write is
 * answered with exactly as many sessions as max_memory (then
 * max_sessions) allows, the rest busy naming the limit. */
static void open_burst(int fd, uint32_t n, uint32_t capacity, uint64_t id0) {
  uint8_t *all = NULL;
  size_t len = 0;
  for (uint32_t i = 0; i < n; i++) {
    struct sk_test_req r;
    sk_test_req_init(&r);
    msgpack_pack_map(&r.pk, 4);
    sk_test_req_key(&r, "id");
    msgpack_pack_uint64(&r.pk, id0 + i);
    sk_test_req_key(&r, "op");
    sk_test_req_key(&r, "open");
    sk_test_req_key(&r, "policy");
    sk_test_req_key(&r, "dense");
    sk_test_req_key(&r, "capacity");
    msgpack_pack_uint32(&r.pk, capacity);
    size_t fl;
    const uint8_t *f = sk_test_req_frame(&r, &fl);
    all = realloc(all, len + fl);
    assert_non_null(all);
    memcpy(all + len, f, fl);
    len += fl;
    sk_test_req_free(&r);
  }
  sk_test_write_all(fd, all, len);
  free(all);
}

/* Reads n replies: counts the sessions opened (their ids in ids) and the
 * busy ones, whose message must contain needle. */
static uint32_t burst_replies(int fd, uint32_t n, const char *needle, uint64_t *ids,
                              uint64_t *ret_bytes) {
  uint32_t ok = 0, busy = 0;
  for (uint32_t i = 0; i < n; i++) {
    struct sk_test_reply rep;
    sk_test_read_reply(fd, &rep);
    assert_false(rep.closed || rep.timed_out);
    if (rep.ok) {
      ids[ok++] = sk_test_reply_u64(&rep, "session");
      uint64_t b = sk_test_reply_u64(&rep, "object_bytes");
      if (*ret_bytes) assert_int_equal(b, *ret_bytes);
      *ret_bytes = b;
    } else {
      assert_string_equal(rep.code, "busy");
      if (!strstr(rep.message, needle)) fail_msg("busy reply '%s' lacks '%s'", rep.message, needle);
      busy++;
    }
    sk_test_reply_free(&rep);
  }
  assert_int_equal(ok + busy, n);
  return ok;
}

static void test_open_burst_limits(void **state) {
  (void)state;
  struct sk_test_daemon d;
  /* f32 caches: the sizes below are theirs */
  const char *args[] = {"--max-sessions", "8", "--max-memory", "1M", "--kv-type", "f32", NULL};
  sk_test_daemon_start(&d, args);
  int fd = sk_test_raw_connect(d.socket, 30000);
  uint64_t ids[16], bytes = 0;
  /* 204800 bytes per 128-token dense cache: five fit in 1 MiB. */
  open_burst(fd, 12, 128, 100);
  uint32_t ok = burst_replies(fd, 12, "max_memory 1048576", ids, &bytes);
  assert_int_equal(bytes, 204800);
  assert_int_equal(ok, 5);
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(d.socket, &c, &e), 0);
  struct sk_daemon_stats ds;
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.sessions, 5);
  assert_int_equal(ds.memory_bytes, 5 * bytes);
  for (uint32_t i = 0; i < ok; i++) assert_int_equal(sk_client_close_session(c, ids[i], &e), 0);
  /* Small caches: the session count binds. */
  uint64_t small = 0;
  open_burst(fd, 12, 16, 200);
  ok = burst_replies(fd, 12, "max_sessions 8", ids, &small);
  assert_int_equal(ok, 8);
  assert_true(8 * small <= (1u << 20));
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.sessions, 8);
  assert_int_equal(ds.memory_bytes, 8 * small);
  printf("figures: open bursts: 12 opens at once -> 5 sessions (max_memory), 12 small -> 8 "
         "(max_sessions), the rest busy\n");
  sk_client_free(c);
  close(fd);
  int st = sk_test_daemon_stop(&d, 60000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A connection holding `body - 1` bytes of a frame declaring `body`. */
static int partial_frame(const char *socket, uint32_t body) {
  int fd = sk_test_raw_connect(socket, 300);
  uint8_t *buf = calloc(1, 4 + body);
  assert_non_null(buf);
  buf[0] = (uint8_t)(body >> 24);
  buf[1] = (uint8_t)(body >> 16);
  buf[2] = (uint8_t)(body >> 8);
  buf[3] = (uint8_t)body;
  sk_test_write_all(fd, buf, 4 + body - 1);
  free(buf);
  return fd;
}

/* The connection is still open and silent (read times out). */
static void assert_silent(int fd) {
  struct sk_test_reply r;
  sk_test_read_reply(fd, &r);
  assert_true(r.timed_out);
  sk_test_reply_free(&r);
}

/* The daemon refused the connection: busy with `needle` and `needle2`
 * (may be NULL) in the message, then closed. */
static void assert_refused(int fd, const char *needle, const char *needle2) {
  struct sk_test_reply r;
  sk_test_read_reply(fd, &r);
  if (r.timed_out || r.closed) fail_msg("no busy reply (%s)", r.closed ? "closed" : "timed out");
  assert_string_equal(r.code, "busy");
  if (!strstr(r.message, needle)) fail_msg("busy message '%s' lacks '%s'", r.message, needle);
  if (needle2 && !strstr(r.message, needle2))
    fail_msg("busy message '%s' lacks '%s'", r.message, needle2);
  sk_test_reply_free(&r);
  sk_test_read_reply(fd, &r);
  assert_true(r.closed);
  sk_test_reply_free(&r);
}

/* Bytes of unfinished frames are bounded per uid and in all: the
 * connection that would cross a bound gets busy and is closed; the
 * others keep their bytes, pings are answered, and once some leave the
 * room is free again. */
static void test_input_memory_ceiling(void **state) {
  (void)state;
  enum { BODY = 60000, PER = BODY + 3 }; /* bytes held per connection */
  struct sk_test_daemon d;
  /* uid 0 (the test) may hold 256 KiB: four partial frames, not five. */
  const char *args[] = {"--max-frame", "64K", "--max-user-input-memory", "256K",
                        "--max-input-memory", "1M", NULL};
  sk_test_daemon_start(&d, args);
  int fds[5];
  for (int i = 0; i < 4; i++) fds[i] = partial_frame(d.socket, BODY);
  for (int i = 0; i < 4; i++) assert_silent(fds[i]);
  fds[4] = partial_frame(d.socket, BODY);
  char needle[96];
  snprintf(needle, sizeof needle, "(max_user_input_memory %u)", 256u << 10);
  assert_refused(fds[4], "input memory: uid 0's unfinished requests would hold ", needle);
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(d.socket, &c, &e), 0);
  assert_int_equal(sk_client_ping(c, &e), 0);
  close(fds[0]);
  close(fds[1]);
  usleep(300 * 1000); /* the daemon sees the two ends */
  fds[0] = partial_frame(d.socket, BODY);
  assert_silent(fds[0]);
  sk_client_free(c);
  for (int i = 0; i < 5; i++)
    if (i != 1) close(fds[i]);
  int st = sk_test_daemon_stop(&d, 60000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

  /* In all: 150 KiB, below one user's 256 KiB. */
  const char *args2[] = {"--max-frame", "64K", "--max-user-input-memory", "256K",
                         "--max-input-memory", "150K", NULL};
  sk_test_daemon_start(&d, args2);
  fds[0] = partial_frame(d.socket, BODY);
  fds[1] = partial_frame(d.socket, BODY);
  assert_silent(fds[0]);
  assert_silent(fds[1]);
  fds[2] = partial_frame(d.socket, BODY);
  assert_refused(fds[2], "(max_input_memory 153600); uid 0's request refused", NULL);
  for (int i = 0; i < 3; i++) close(fds[i]);
  printf("figures: input memory: 4 partial frames of %d bytes held under 256 KiB per uid, the "
         "5th refused; 2 under 150 KiB in all, the 3rd refused\n", PER);
  st = sk_test_daemon_stop(&d, 60000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The buffer a large request needed goes back once it is handled: idle
 * connections that each sent one ~1 MB request (max_frame) hold no
 * memory outside the partial-input counts. */
static void test_idle_buffers_returned(void **state) {
  (void)state;
  enum { CONNS = 40, PAD = (1 << 20) - 64 };
  struct sk_test_daemon d;
  sk_test_daemon_start(&d, NULL);
  struct sk_test_req q;
  sk_test_req_init(&q);
  msgpack_pack_map(&q.pk, 3);
  sk_test_req_key(&q, "id");
  msgpack_pack_uint64(&q.pk, 1);
  sk_test_req_key(&q, "op");
  sk_test_req_key(&q, "ping");
  sk_test_req_key(&q, "pad");
  msgpack_pack_str(&q.pk, PAD);
  char *pad = malloc(PAD);
  assert_non_null(pad);
  memset(pad, 'x', PAD);
  msgpack_pack_str_body(&q.pk, pad, PAD);
  free(pad);
  size_t n = 0;
  const uint8_t *frame = sk_test_req_frame(&q, &n);
  assert_true(n > (1u << 20) - 64 && n <= (1u << 20) + 4);
  long before = sk_test_proc_rss_kib(d.pid);
  int fds[CONNS];
  for (int i = 0; i < CONNS; i++) {
    fds[i] = sk_test_raw_connect(d.socket, 10000);
    sk_test_write_all(fds[i], frame, n);
    struct sk_test_reply r;
    sk_test_read_reply(fds[i], &r);
    assert_true(r.ok);
    sk_test_reply_free(&r);
  }
  long after = sk_test_proc_rss_kib(d.pid);
  printf("figures: idle buffers: %d connections after one request of %zu bytes each: daemon "
         "RSS %ld -> %ld KiB\n", CONNS, n, before, after);
  /* Kept, they would be 40 MiB. */
  if (!sk_test_under_tool() && after - before > 8 * 1024)
    fail_msg("RSS grew by %ld KiB", after - before);
  for (int i = 0; i < CONNS; i++) close(fds[i]);
  sk_test_req_free(&q);
  int st = sk_test_daemon_stop(&d, 60000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* A model file whose weights hold NaN (its last 4 KiB overwritten with
 * 0xff: NaN as F32, F16 and BF16) loads, since its structure is sound,
 * but a generate fails with bad_model instead of emitting token 0 over
 * and over; the daemon keeps answering. */
static void test_nan_weights(void **state) {
  (void)state;
  char *dir = sk_test_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/nan.gguf", dir);
  size_t len = 0;
  char *model = sk_test_read_file(sk_test_model_path(), &len);
  assert_non_null(model);
  assert_true(len > 8192);
  memset(model + len - 4096, 0xff, 4096);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(model, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
  free(model);
  struct sk_test_daemon d;
  const char *args[] = {"--model", path, NULL};
  sk_test_daemon_start(&d, args);
  struct sk_client *c = sk_test_connect(d.socket);
  struct sk_open_result o;
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(c, NULL, &o, &e), 0);
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, 4);
  gp.prompt = "Once upon a time";
  struct sk_generate_result r;
  assert_true(sk_client_generate(c, o.session, &gp, NULL, NULL, &r, &e) < 0);
  assert_int_equal(e.code, SK_ERR_BAD_MODEL);
  assert_non_null(strstr(e.message, "logits that are not numbers (NaN)"));
  assert_int_equal(sk_client_ping(c, &e), 0);
  sk_client_free(c);
  int st = sk_test_daemon_stop(&d, 60000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  unlink(path);
  rmdir(dir);
  free(dir);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vanishing_clients),
      cmocka_unit_test(test_open_burst_limits),
      cmocka_unit_test(test_input_memory_ceiling),
      cmocka_unit_test(test_idle_buffers_returned),
      cmocka_unit_test(test_nan_weights),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
