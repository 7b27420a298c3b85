/* Sessions survive the daemon: the real sinkd, killed with SIGKILL and
 * restarted on the same state directory (tmpfs), driven through libsinkd
 * and sinkctl.
 *
 *   - greedy 200 tokens = 100, kill -9, restart, resume, 100 more, exactly,
 *     for streaming (evicting before and after the kill) and dense; and a
 *     kill in the middle of a generate (dense, greedy and sampled): the
 *     committed tokens plus a continuation equal the uninterrupted run;
 *   - kill -9 at 50 random moments during appends and generates on 8
 *     sessions: every session adopted, its resident tokens and counters
 *     those of a committed step, nothing acknowledged lost;
 *   - corrupted objects (flipped header byte, truncated, other model) set
 *     aside with a log line while the others are adopted;
 *   - fork of a 300-token session without prefill (time and token counts
 *     printed), both continuing independently;
 *   - export -> import gives the same continuation; a flipped byte and a
 *     truncation are refused; sinkctl save/load/fork/resume;
 *   - limits (max sessions, max memory: busy naming the limit), idle TTL,
 *     exact memory accounting.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/model.h"
#include "sinkd/client.h"
#include "session/store.h"
#include "testutil.h"
#include "model/tokenizer.h"

static char g_dir[64];
static char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char g_log[300];
static char g_state[300];
static pid_t g_pid;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void dump_log(void) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  if (log) {
    fprintf(stderr, "---- sinkd log (last 3000 bytes) ----\n%s\n-----------\n",
            n > 3000 ? log + n - 3000 : log);
    free(log);
  }
}

/* Starts sinkd on g_state with extra arguments (NULL-terminated), its
 * stderr appended to g_log; returns once it accepts connections. */
static void start_daemon_args(const char *const *extra) {
  const char *sinkd = getenv("SK_SINKD");
  if (!sinkd) sinkd = "./daemon/sinkd";
  const char *argv[32];
  int n = 0;
  argv[n++] = sinkd;
  /* an installed /etc/sinkd/sinkd.conf must not change what runs */
  argv[n++] = "--config";
  argv[n++] = "/dev/null";
  argv[n++] = "--model";
  argv[n++] = sk_test_model_path();
  argv[n++] = "--socket";
  argv[n++] = g_socket;
  argv[n++] = "--state-dir";
  argv[n++] = g_state;
  argv[n++] = "--threads";
  argv[n++] = "1";
  /* llama.cpp's reference values were taken with an f32 cache (its f16
   * default moves logits by ~0.016); extra may name another type (the
   * last one given counts) */
  argv[n++] = "--kv-type";
  argv[n++] = "f32";
  for (int i = 0; extra && extra[i] && n < 30; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  fflush(NULL); /* the child must not flush our buffers a second time */
  g_pid = fork();
  if (g_pid == 0) {
    sk_test_child_setup();
    FILE *f = freopen(g_log, "a", stderr);
    (void)f;
    execv(sinkd, (char *const *)argv);
    _exit(127);
  }
  for (int i = 0; i < 500; i++) {
    struct sk_client *c = NULL;
    if (sk_client_connect(g_socket, &c, NULL) == 0) {
      sk_client_free(c);
      return;
    }
    usleep(10000);
  }
  dump_log();
  fail_msg("sinkd did not start");
}

static void start_daemon(void) { start_daemon_args(NULL); }

static void kill9(void) {
  if (g_pid > 0) {
    kill(g_pid, SIGKILL);
    waitpid(g_pid, NULL, 0);
    g_pid = 0;
  }
}

static void stop_term(void) {
  if (g_pid > 0) {
    kill(g_pid, SIGTERM);
    int st = 0;
    waitpid(g_pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    g_pid = 0;
  }
}

static struct sk_client *conn(void) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(g_socket, &c, &e) < 0) {
    dump_log();
    fail_msg("connect: %s", e.message);
  }
  sk_client_set_timeout(c, 120000, NULL);
  return c;
}

static int setup(void **state) {
  (void)state;
  /* tmpfs when there is one, like /run */
  snprintf(g_dir, sizeof g_dir, "/dev/shm/sinkd-persist.XXXXXX");
  if (!mkdtemp(g_dir)) {
    char *d = sk_test_tmpdir();
    if (strlen(d) >= sizeof g_dir) return -1;
    memcpy(g_dir, d, strlen(d) + 1);
    free(d);
  }
  snprintf(g_socket, sizeof g_socket, "%s/s.sock", g_dir);
  snprintf(g_log, sizeof g_log, "%s/sinkd.log", g_dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  kill9();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Each test gets its own, empty state directory. */
static void fresh_state(const char *name) {
  snprintf(g_state, sizeof g_state, "%s/%s", g_dir, name);
  snprintf(g_log, sizeof g_log, "%s/%s.log", g_dir, name);
}

static uint64_t open_session(struct sk_client *c, const char *policy, uint32_t n_sink,
                             uint32_t window, uint32_t capacity) {
  struct sk_open_params op = {.policy = policy, .n_sink = n_sink, .window = window,
                              .capacity = capacity};
  struct sk_open_result o;
  struct sk_error e = {0};
  if (sk_client_open(c, &op, &o, &e) < 0) fail_msg("open: %s", e.message);
  return o.session;
}

/* ---- token collection ---- */

struct ids {
  int32_t v[4096];
  size_t n;
  int kill_after; /* > 0: SIGKILL the daemon when this many arrived */
};

static int ids_cb(void *user, const struct sk_token_event *ev) {
  struct ids *x = user;
  if (x->n < sizeof x->v / sizeof x->v[0]) x->v[x->n++] = ev->token;
  if (x->kill_after > 0 && x->n == (size_t)x->kill_after) kill9();
  return 0;
}

static void gen(struct sk_client *c, uint64_t s, uint32_t n, double temperature, bool seeded,
                uint64_t seed, struct ids *out, struct sk_generate_result *ret) {
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = n;
  gp.temperature = temperature;
  gp.ignore_eos = true;
  gp.has_seed = seeded;
  gp.seed = seed;
  struct sk_generate_result gr;
  struct sk_error e = {0};
  if (sk_client_generate(c, s, &gp, ids_cb, out, &gr, &e) < 0)
    fail_msg("generate: %s", e.message);
  if (ret) *ret = gr;
}

static void append_text(struct sk_client *c, uint64_t s, const char *text) {
  struct sk_error e = {0};
  if (sk_client_append_text(c, s, text, strlen(text), SK_BOS_DEFAULT, NULL, &e) < 0)
    fail_msg("append: %s", e.message);
}

static int32_t *tokens_of(struct sk_client *c, uint64_t s, size_t *n) {
  int32_t *t = NULL;
  struct sk_error e = {0};
  if (sk_client_session_tokens(c, s, &t, n, &e) < 0) fail_msg("tokens: %s", e.message);
  return t;
}

static struct sk_session_stats sstats(struct sk_client *c, uint64_t s) {
  struct sk_session_stats st;
  struct sk_error e = {0};
  if (sk_client_session_stats(c, s, &st, &e) < 0) fail_msg("stats: %s", e.message);
  return st;
}

static int log_count(const char *needle) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  int k = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p++) k++;
  free(log);
  return k;
}

static bool log_has(const char *needle) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  bool has = log && strstr(log, needle);
  free(log);
  return has;
}

/* ---- greedy 200 = 100 + kill + 100 ---- */

static void greedy_kill_case(const char *policy, uint32_t n_sink, uint32_t window,
                             uint32_t capacity, uint64_t want_evicted_100,
                             uint64_t want_evicted_200) {
  struct sk_client *c = conn();
  const char *prompt = "Once upon a time";
  /* the uninterrupted run */
  uint64_t r = open_session(c, policy, n_sink, window, capacity);
  append_text(c, r, prompt);
  struct ids *ref = calloc(1, sizeof *ref);
  struct sk_generate_result gr;
  gen(c, r, 200, 0, false, 0, ref, &gr);
  assert_int_equal(ref->n, 200);
  assert_int_equal(gr.seen, 205);
  /* the interrupted one */
  uint64_t a = open_session(c, policy, n_sink, window, capacity);
  append_text(c, a, prompt);
  struct ids *got = calloc(1, sizeof *got);
  gen(c, a, 100, 0, false, 0, got, &gr);
  assert_int_equal(gr.seen, 105);
  struct sk_session_stats st = sstats(c, a);
  assert_int_equal(st.evicted, want_evicted_100);
  sk_client_free(c);
  kill9();
  start_daemon();
  c = conn();
  struct sk_session_summary sum;
  struct sk_error e = {0};
  assert_int_equal(sk_client_resume(c, a, &sum, &e), 0);
  assert_true(sum.adopted);
  assert_int_equal(sum.seen, 105);
  assert_int_equal(sum.evicted, want_evicted_100);
  gen(c, a, 100, 0, false, 0, got, &gr);
  assert_int_equal(got->n, 200);
  for (size_t i = 0; i < 200; i++)
    if (got->v[i] != ref->v[i])
      fail_msg("%s: token %zu is %d after the restart, %d uninterrupted", policy, i,
               got->v[i], ref->v[i]);
  assert_int_equal(gr.seen, 205);
  st = sstats(c, a);
  assert_int_equal(st.evicted, want_evicted_200);
  assert_int_equal(sstats(c, r).evicted, want_evicted_200);
  /* the same cache as the uninterrupted session, token for token */
  size_t na = 0, nr = 0;
  int32_t *ta = tokens_of(c, a, &na), *tr = tokens_of(c, r, &nr);
  assert_int_equal(na, nr);
  assert_memory_equal(ta, tr, na * sizeof *ta);
  printf("%s: 200 greedy tokens across a SIGKILL after 100 equal the uninterrupted run "
         "(evicted %llu before the kill, %llu at the end)\n",
         policy, (unsigned long long)want_evicted_100, (unsigned long long)want_evicted_200);
  free(ta);
  free(tr);
  free(ref);
  free(got);
  sk_client_free(c);
}

static void test_greedy_kill_resume(void **state) {
  (void)state;
  fresh_state("greedy");
  start_daemon();
  /* streaming 4 + 60: 105 tokens evict 41 before the kill, 141 by 205 */
  greedy_kill_case("streaming", 4, 60, 0, 41, 141);
  kill9();
  start_daemon();
  greedy_kill_case("dense", 0, 0, 256, 0, 0);
  kill9();
}

/* A kill while a generate runs: what was committed stays (the tokens the
 * client saw and maybe a few more), and continuing gives the rest of the
 * uninterrupted run, for greedy and for sampling (the PRNG state is
 * committed with each token). */
static void kill_mid_generate_case(double temperature) {
  struct sk_client *c = conn();
  const char *prompt = "One day, a little";
  uint64_t r = open_session(c, "dense", 0, 0, 512);
  append_text(c, r, prompt);
  struct ids *ref = calloc(1, sizeof *ref);
  gen(c, r, 300, temperature, true, 42, ref, NULL);
  assert_int_equal(ref->n, 300);
  struct sk_session_stats rst = sstats(c, r);
  uint64_t n_prompt = rst.seen - 300;

  uint64_t a = open_session(c, "dense", 0, 0, 512);
  append_text(c, a, prompt);
  struct ids *got = calloc(1, sizeof *got);
  got->kill_after = 60;
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = 300;
  gp.temperature = temperature;
  gp.ignore_eos = true;
  gp.has_seed = true;
  gp.seed = 42;
  struct sk_error e = {0};
  int rc = sk_client_generate(c, a, &gp, ids_cb, got, NULL, &e);
  /* the daemon died under the generate (or had just finished it) */
  assert_true(rc == 0 || rc == -SK_ERR_DISCONNECTED || rc == -SK_ERR_IO);
  sk_client_free(c);
  kill9();
  start_daemon();
  c = conn();
  struct sk_session_summary sum;
  assert_int_equal(sk_client_resume(c, a, &sum, &e), 0);
  assert_true(sum.adopted);
  uint64_t k = sum.seen - n_prompt; /* tokens generated and committed */
  assert_true(k >= 60 && k <= 300);
  size_t n = 0;
  int32_t *t = tokens_of(c, a, &n);
  assert_int_equal(n, sum.seen);
  for (uint64_t i = 0; i < k; i++)
    if (t[n_prompt + i] != ref->v[i])
      fail_msg("committed token %llu is %d, uninterrupted %d", (unsigned long long)i,
               t[n_prompt + i], ref->v[i]);
  /* continue without a seed: the session's own PRNG goes on */
  struct ids *rest = calloc(1, sizeof *rest);
  if (k < 300) gen(c, a, (uint32_t)(300 - k), temperature, false, 0, rest, NULL);
  for (uint64_t i = 0; i < 300 - k; i++)
    if (rest->v[i] != ref->v[k + i])
      fail_msg("continued token %llu is %d, uninterrupted %d", (unsigned long long)(k + i),
               rest->v[i], ref->v[k + i]);
  printf("kill during a %s generate: the client had seen 60 tokens, %llu were committed; "
         "%llu more continue the uninterrupted 300 exactly\n",
         temperature > 0 ? "sampled (seed 42)" : "greedy", (unsigned long long)k,
         (unsigned long long)(300 - k));
  free(t);
  free(ref);
  free(got);
  free(rest);
  sk_client_free(c);
}

static void test_kill_mid_generate(void **state) {
  (void)state;
  fresh_state("midgen");
  start_daemon();
  kill_mid_generate_case(0);
  kill_mid_generate_case(0.9);
  kill9();
}

/* ---- 50 random kills across 8 sessions ---- */

#define N_SESS 8
#define N_KILLS 50
#define STREAM_MAX 8192

/* What a client thread knows of its session's token stream. */
struct worker {
  uint64_t session;
  bool dense;
  uint32_t n_sink, window, capacity;
  unsigned seed;
  pthread_t th;
  /* stream[i] for i < n_known: the token at stream index i; -1 where a
   * generated token was committed but never seen and is evicted since */
  int32_t stream[STREAM_MAX];
  uint64_t n_known;     /* stream entries the client knows for sure */
  uint64_t acked_seen;  /* seen of the last ok reply */
  /* the request in flight when the daemon died */
  bool inflight;
  bool inflight_gen;
  int32_t inflight_tokens[64];
  uint32_t inflight_n;  /* append: tokens sent; generate: max_tokens */
  bool full;            /* dense session refused with context_full */
  uint64_t n_requests;
};

static int worker_cb(void *user, const struct sk_token_event *ev) {
  struct worker *w = user;
  /* an event is sent after its step's commit: the token is acknowledged */
  if (w->n_known < STREAM_MAX) w->stream[w->n_known] = ev->token;
  w->n_known++;
  return 0;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct sk_client *c = NULL;
  if (sk_client_connect(g_socket, &c, NULL) < 0) return NULL;
  sk_client_set_timeout(c, 60000, NULL);
  /* bounded: the daemon is killed long before */
  for (int iter = 0; iter < 100000 && !w->full; iter++) {
    w->seed = w->seed * 1103515245u + 12345u;
    unsigned r = w->seed >> 8;
    bool do_gen = (r & 3) == 0 && w->n_known > 0;
    uint32_t n = 1 + (r >> 2) % (w->dense ? 8 : 40);
    if (w->n_known + 64 >= STREAM_MAX || (w->dense && w->n_known + 64 >= w->capacity)) break;
    struct sk_error e = {0};
    w->inflight = true;
    w->inflight_gen = do_gen;
    w->inflight_n = n;
    w->n_requests++;
    int rc;
    if (do_gen) {
      struct sk_generate_params gp;
      sk_generate_params_init(&gp);
      gp.max_tokens = n;
      gp.temperature = 0;
      gp.ignore_eos = true;
      struct sk_generate_result gr;
      rc = sk_client_generate(c, w->session, &gp, worker_cb, w, &gr, &e);
      if (rc == 0) w->acked_seen = gr.seen;
    } else {
      for (uint32_t i = 0; i < n; i++)
        w->inflight_tokens[i] = (int32_t)(3 + (w->seed >> 4) % 500 + i) % 512;
      struct sk_append_result ar;
      rc = sk_client_append_tokens(c, w->session, w->inflight_tokens, n, SK_BOS_FALSE, &ar, &e);
      if (rc == 0) {
        for (uint32_t i = 0; i < n; i++) w->stream[w->n_known + i] = w->inflight_tokens[i];
        w->n_known += n;
        w->acked_seen = ar.seen;
      }
    }
    if (rc == -SK_ERR_CONTEXT_FULL) {
      w->inflight = false;
      w->full = true;
      break;
    }
    if (rc < 0) break; /* the daemon died: inflight stays set */
    w->inflight = false;
    if (w->acked_seen != w->n_known) {
      fprintf(stderr, "session %llu: reply says seen %llu, client knows %llu\n",
              (unsigned long long)w->session, (unsigned long long)w->acked_seen,
              (unsigned long long)w->n_known);
      abort();
    }
    if (w->dense) usleep(3000); /* dense sessions fill slowly */
  }
  sk_client_free(c);
  return NULL;
}

/* Checks an adopted session against what its client knew, and brings the
 * client's knowledge up to the committed state. Returns 1 if the daemon
 * had committed more than it had acknowledged. */
static int check_worker(struct sk_client *c, struct worker *w, uint64_t *ret_partial) {
  struct sk_session_summary sum;
  struct sk_error e = {0};
  if (sk_client_resume(c, w->session, &sum, &e) < 0)
    fail_msg("session %llu not adopted: %s", (unsigned long long)w->session, e.message);
  assert_true(sum.adopted);
  size_t nr = 0;
  int32_t *res = tokens_of(c, w->session, &nr);
  uint64_t seen = sum.seen;
  /* nothing acknowledged is lost: replies and token events */
  if (seen < w->n_known)
    fail_msg("session %llu: seen %llu < %llu acknowledged", (unsigned long long)w->session,
             (unsigned long long)seen, (unsigned long long)w->n_known);
  uint64_t extra = seen - w->n_known;
  if (extra > 0) {
    if (!w->inflight || extra > w->inflight_n)
      fail_msg("session %llu: %llu tokens beyond the acknowledged %llu, in flight %u",
               (unsigned long long)w->session, (unsigned long long)extra,
               (unsigned long long)w->n_known, w->inflight ? w->inflight_n : 0);
    if (!w->inflight_gen && extra < w->inflight_n) (*ret_partial)++;
  }
  /* counters of a committed state */
  assert_int_equal(sum.resident, nr);
  uint64_t want_resident =
      w->dense ? seen : (seen < w->capacity ? seen : w->capacity);
  assert_int_equal(nr, want_resident);
  assert_int_equal(sum.evicted, seen - nr);
  /* where stream index i sits in the cache (-1: evicted): sinks first,
   * then the newest window (streaming), or everything (dense) */
  const uint64_t S = w->n_sink, first_tail = seen > nr ? seen - (nr - S) : S;
#define POS_OF(i) (w->dense || seen <= nr || (i) < S ? (int64_t)(i) \
                   : (i) >= first_tail ? (int64_t)(S + ((i) - first_tail)) : (int64_t)-1)
  /* the stream after the commit: known tokens, then the in-flight append's
   * committed prefix, or the generated tokens read from the cache */
  for (uint64_t i = w->n_known; i < seen; i++) {
    if (w->inflight_gen) {
      int64_t pos = POS_OF(i);
      w->stream[i] = pos >= 0 ? res[pos] : -1; /* -1: never seen, evicted */
    } else {
      w->stream[i] = w->inflight_tokens[i - w->n_known];
    }
  }
  /* every cache position holds the token of its stream index */
  for (uint64_t i = 0; i < seen; i++) {
    int64_t pos = POS_OF(i);
    if (pos < 0) continue;
    if ((uint64_t)pos >= nr || w->stream[i] != res[pos])
      fail_msg("session %llu: stream index %llu (token %d) should be at cache position "
               "%lld, which holds %d",
               (unsigned long long)w->session, (unsigned long long)i, w->stream[i],
               (long long)pos, (uint64_t)pos < nr ? res[pos] : -2);
  }
#undef POS_OF
  free(res);
  w->n_known = seen;
  w->acked_seen = seen;
  w->inflight = false;
  return extra > 0;
}

static void test_kill_50(void **state) {
  (void)state;
  fresh_state("kill50");
  start_daemon();
  struct worker *w = calloc(N_SESS, sizeof *w);
  assert_non_null(w);
  struct sk_client *c = conn();
  for (int i = 0; i < N_SESS; i++) {
    w[i].dense = i >= 6;
    w[i].n_sink = w[i].dense ? 0 : 4;
    w[i].window = w[i].dense ? 0 : 12 + 8 * (uint32_t)i;
    w[i].capacity = w[i].dense ? 2048 : w[i].n_sink + w[i].window;
    w[i].seed = 1000u + (unsigned)i;
    w[i].session = w[i].dense ? open_session(c, "dense", 0, 0, 2048)
                              : open_session(c, "streaming", 4, w[i].window, 0);
  }
  sk_client_free(c);
  unsigned rnd = 4242;
  uint64_t n_ahead = 0, n_partial = 0, n_inflight = 0;
  double t0 = now_s();
  for (int k = 0; k < N_KILLS; k++) {
    for (int i = 0; i < N_SESS; i++) pthread_create(&w[i].th, NULL, worker_main, &w[i]);
    rnd = rnd * 1103515245u + 12345u;
    usleep(5000 + (rnd >> 8) % 60000); /* a random moment */
    kill9();
    for (int i = 0; i < N_SESS; i++) pthread_join(w[i].th, NULL);
    start_daemon();
    c = conn();
    struct sk_daemon_stats ds;
    struct sk_error e = {0};
    assert_int_equal(sk_client_stats(c, &ds, &e), 0);
    assert_int_equal(ds.adopted, N_SESS);
    assert_int_equal(ds.set_aside, 0);
    for (int i = 0; i < N_SESS; i++) {
      n_inflight += w[i].inflight;
      n_ahead += (uint64_t)check_worker(c, &w[i], &n_partial);
    }
    sk_client_free(c);
  }
  uint64_t total = 0, reqs = 0;
  for (int i = 0; i < N_SESS; i++) {
    total += w[i].n_known;
    reqs += w[i].n_requests;
  }
  int dropped = log_count("a step in progress when the daemon stopped was dropped");
  /* a forward pass serves every session with work (batching), each in its
   * own step: a kill drops at most one step per session */
  assert_true(dropped <= N_KILLS * N_SESS);
  printf("kill -9 at %d random moments, %d sessions (6 streaming, 2 dense): %llu requests, "
         "%llu tokens; every session adopted after every restart (%d adoptions); %llu "
         "requests in flight at a kill, %llu times a session had committed steps not yet "
         "acknowledged (%llu appends partly committed), %d times the kill fell inside a step "
         "(dropped, the previous commit adopted); no torn step, nothing acknowledged lost "
         "(%.1f s)\n",
         N_KILLS, N_SESS, (unsigned long long)reqs, (unsigned long long)total,
         log_count("adopted: uid"), (unsigned long long)n_inflight, (unsigned long long)n_ahead,
         (unsigned long long)n_partial, dropped, now_s() - t0);
  assert_true(n_inflight > 0);
  assert_false(log_has("set aside as"));
  free(w);
  kill9();
}

/* ---- corrupted objects ---- */

static void flip_byte(const char *path, off_t off) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char b;
  assert_int_equal(pread(fd, &b, 1, off), 1);
  b ^= 0x40;
  assert_int_equal(pwrite(fd, &b, 1, off), 1);
  close(fd);
}

static void test_corrupted_set_aside(void **state) {
  (void)state;
  fresh_state("corrupt");
  start_daemon();
  struct sk_client *c = conn();
  uint64_t ids[4];
  for (int i = 0; i < 4; i++) {
    ids[i] = open_session(c, "streaming", 4, 28, 0);
    append_text(c, ids[i], "Once upon a time, there was a little girl");
  }
  struct ids *before = calloc(1, sizeof *before);
  sk_client_free(c);
  kill9();
  char path[400];
  /* ids[0]: a flipped header byte; ids[1]: truncated; and another
   * model's object; ids[2] and ids[3] intact */
  snprintf(path, sizeof path, "%s/session-%llu.skv", g_state, (unsigned long long)ids[0]);
  flip_byte(path, 20);
  snprintf(path, sizeof path, "%s/session-%llu.skv", g_state, (unsigned long long)ids[1]);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(truncate(path, sb.st_size / 2), 0);
  {
    /* a valid object written by a daemon with another model (same shape,
     * other fingerprint): made with the store API on the same directory */
    struct sk_gguf *g = NULL;
    struct sk_model *m = NULL;
    struct sk_error e = {0};
    assert_int_equal(sk_gguf_open(sk_test_model_path(), &g, &e), 0);
    assert_int_equal(sk_model_load(g, &m, &e), 0);
    struct sk_store_config cfg = {.dir = g_state, .shape = sk_model_kv_shape(m),
                                  .n_vocab = sk_model_config(m)->n_vocab};
    sk_store_fingerprint(g, cfg.model_fp);
    cfg.model_fp[7] ^= 0xff;
    struct sk_store *st = NULL;
    assert_int_equal(sk_store_open(&cfg, &st, NULL, &e), 0);
    struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = 64, .rope_scale = 1.0f};
    struct sk_sampler_state ss = {0};
    ss.params.top_p = 1.0f;
    struct sk_store_obj *o = NULL;
    assert_int_equal(sk_store_create(st, 100, 0, 0, &p, &ss, &o, &e), 0);
    sk_store_obj_free(o);
    sk_store_close(st);
    sk_model_free(m);
    sk_gguf_close(g);
  }
  start_daemon();
  c = conn();
  struct sk_daemon_stats ds;
  struct sk_error e = {0};
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  if (ds.adopted != 2 || ds.set_aside != 3) dump_log();
  assert_int_equal(ds.adopted, 2);
  assert_int_equal(ds.set_aside, 3);
  struct sk_session_info *list = NULL;
  size_t n = 0;
  assert_int_equal(sk_client_list(c, &list, &n, &e), 0);
  assert_int_equal(n, 2);
  assert_int_equal(list[0].session + list[1].session, ids[2] + ids[3]);
  assert_true(list[0].adopted && list[1].adopted);
  free(list);
  /* one log line each, naming the reason */
  char want[600];
  snprintf(want, sizeof want, "session-%llu.skv set aside as %s/invalid/session-%llu.skv: "
           "header checksum mismatch",
           (unsigned long long)ids[0], g_state, (unsigned long long)ids[0]);
  if (!log_has(want)) {
    dump_log();
    fail_msg("no log line \"%s\"", want);
  }
  snprintf(want, sizeof want, "session-%llu.skv set aside as %s/invalid/session-%llu.skv: "
           "truncated",
           (unsigned long long)ids[1], g_state, (unsigned long long)ids[1]);
  assert_true(log_has(want));
  assert_true(log_has("session-100.skv set aside as"));
  assert_true(log_has("(other model)"));
  /* the good one goes on; new ids do not reuse the set-aside ones */
  gen(c, ids[3], 10, 0, false, 0, before, NULL);
  assert_int_equal(before->n, 10);
  uint64_t nid = open_session(c, "dense", 0, 0, 64);
  assert_int_equal(nid, 101);
  printf("corrupted objects: flipped header byte, truncated file and another model's "
         "object set aside with a log line each; the two intact sessions adopted\n");
  free(before);
  sk_client_free(c);
  kill9();
}

/* ---- kv_type f16 ---- */

/* A daemon with --kv-type f16: every session's object is the store's
 * exact f16 size (half the keys and values), greedy decoding of
 * llama.cpp's reference prompts gives llama.cpp's tokens (its reference
 * cache is f32: the rounding does not change a greedy token of this
 * model), and sessions survive a SIGKILL as f32 ones do. A daemon started
 * with the other type adopts them as they are (f16), continues them
 * exactly as the f16 daemon would, forks and imports them as f16, and
 * gives its new sessions its own type. */
/* A copy of the test model at path whose end-of-sequence token is eos
 * (tokenizer.ggml.eos_token_id patched in place: key, type u32, value). */
static void write_model_with_eos(const char *path, uint32_t eos) {
  size_t len = 0;
  char *buf = sk_test_read_file(sk_test_model_path(), &len);
  assert_non_null(buf);
  static const char key[] = "tokenizer.ggml.eos_token_id";
  char *at = memmem(buf, len, key, sizeof key - 1);
  assert_non_null(at);
  at += sizeof key - 1;
  uint32_t type;
  memcpy(&type, at, 4);
  assert_int_equal(type, 4); /* GGUF_TYPE_UINT32 */
  memcpy(at + 4, &eos, 4);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
  free(buf);
}

/* The first token event's top-10 (ids, logits) and token. */
struct top10 {
  int32_t token, id[10];
  double logit[10];
  size_t n;
};

static int top10_cb(void *user, const struct sk_token_event *ev) {
  struct top10 *t = user;
  if (t->n++ == 0 && ev->n_top == 10) {
    t->token = ev->token;
    for (int k = 0; k < 10; k++) {
      t->id[k] = ev->top[k].token;
      t->logit[k] = ev->top[k].logit;
    }
  }
  return 0;
}

/* A generate that stops at the end-of-sequence token runs no forward
 * pass for it, yet commits its step (the sampler moved): that commit
 * keeps the logits the token was drawn from. With a model whose
 * end-of-sequence token is the 6th greedy token of the first reference
 * prompt, greedy generation stops after 5 tokens, and after a SIGKILL
 * the resumed session's next top-10 is llama.cpp's at that step. */
static void test_eos_step_committed(void **state) {
  (void)state;
  fresh_state("eos");
  json_t *ref = sk_test_load_reference("greedy.json");
  json_t *p = json_array_get(json_object_get(ref, "prompts"), 0);
  size_t n_prompt = 0, n_gen = 0;
  int32_t *prompt = sk_test_json_ids(json_object_get(p, "prompt_ids"), &n_prompt);
  int32_t *want = sk_test_json_ids(json_object_get(p, "generated_ids"), &n_gen);
  enum { K = 5 };
  assert_true(n_gen > K);
  for (int i = 0; i < K; i++) assert_int_not_equal(want[i], want[K]);
  char model[400];
  snprintf(model, sizeof model, "%s/eos.gguf", g_dir);
  write_model_with_eos(model, (uint32_t)want[K]);
  start_daemon_args((const char *const[]){"--model", model, NULL});
  struct sk_client *c = conn();
  struct sk_error e = {0};
  uint64_t s = open_session(c, "streaming", 4, 252, 0);
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(c, s, prompt, n_prompt, SK_BOS_DEFAULT, &ar, &e), 0);
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = 64;
  gp.temperature = 0;
  struct ids *got = calloc(1, sizeof *got);
  assert_non_null(got);
  struct sk_generate_result gr;
  assert_int_equal(sk_client_generate(c, s, &gp, ids_cb, got, &gr, &e), 0);
  assert_string_equal(gr.stop, "eos");
  /* The reply names the end-of-generation token: the one the model
   * file calls EOS, with its vocabulary text. */
  assert_int_equal(gr.stop_token, want[K]);
  {
    struct sk_gguf *vg = NULL;
    struct sk_tokenizer *vt = NULL;
    assert_int_equal(sk_gguf_open(model, &vg, &e), 0);
    assert_int_equal(sk_tokenizer_load(vg, &vt, &e), 0);
    const char *txt;
    size_t txt_len;
    assert_int_equal(sk_tokenizer_text(vt, want[K], &txt, &txt_len), 0);
    assert_true(txt_len > 0);
    assert_string_equal(gr.stop_text, txt);
    sk_tokenizer_free(vt);
    sk_gguf_close(vg);
  }
  assert_int_equal(gr.n_tokens, K);
  assert_int_equal(got->n, K);
  for (int i = 0; i < K; i++) assert_int_equal(got->v[i], want[i]);
  sk_client_free(c);
  kill9();
  start_daemon_args((const char *const[]){"--model", model, NULL});
  c = conn();
  struct sk_session_summary sum;
  assert_int_equal(sk_client_resume(c, s, &sum, &e), 0);
  assert_true(sum.adopted);
  assert_int_equal(sum.seen, n_prompt + K);
  /* one more token past the end of sequence, with its top-10 */
  struct top10 top = {0};
  gp.max_tokens = 1;
  gp.ignore_eos = true;
  gp.n_top = 10;
  assert_int_equal(sk_client_generate(c, s, &gp, top10_cb, &top, &gr, &e), 0);
  assert_int_equal(top.n, 1);
  assert_int_equal(top.token, want[K]);
  json_t *top10 = json_object_get(json_array_get(json_object_get(p, "steps"), K), "top10");
  assert_int_equal(json_array_size(top10), 10);
  for (size_t k = 0; k < 10; k++) {
    json_t *pair = json_array_get(top10, k);
    assert_int_equal(top.id[k], json_integer_value(json_array_get(pair, 0)));
    double w = json_number_value(json_array_get(pair, 1));
    if (fabs(top.logit[k] - w) > 1e-4)
      fail_msg("top %zu: logit %.7f, llama.cpp %.7f", k, top.logit[k], w);
  }
  free(got);
  free(want);
  free(prompt);
  json_decref(ref);
  sk_client_free(c);
}

static void test_kv_f16(void **state) {
  (void)state;
  fresh_state("kvf16");
  start_daemon_args((const char *const[]){"--kv-type", "f16", NULL});
  struct sk_client *c = conn();
  struct sk_error e = {0};
  struct sk_daemon_stats ds;
  /* exact object sizes from the store's own geometry */
  size_t want16, want32;
  {
    struct sk_gguf *g = NULL;
    struct sk_model *m = NULL;
    assert_int_equal(sk_gguf_open(sk_test_model_path(), &g, &e), 0);
    assert_int_equal(sk_model_load(g, &m, &e), 0);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/geom", g_dir);
    struct sk_store_config cfg = {.dir = dir, .shape = sk_model_kv_shape(m),
                                  .n_vocab = sk_model_config(m)->n_vocab};
    sk_store_fingerprint(g, cfg.model_fp);
    struct sk_store *st = NULL;
    assert_int_equal(sk_store_open(&cfg, &st, NULL, &e), 0);
    want32 = sk_store_object_size(st, 512);
    sk_store_close(st);
    cfg.shape.kv_type = SK_KV_F16;
    assert_int_equal(sk_store_open(&cfg, &st, NULL, &e), 0);
    want16 = sk_store_object_size(st, 512);
    sk_store_close(st);
    const struct sk_model_config *mc = sk_model_config(m);
    /* the data parts differ by half the keys and values, to the page */
    size_t half = (size_t)mc->n_layer * 2 * mc->kv_dim * (512 + SK_KV_SPARE_SLOTS) * 2;
    assert_true(want32 - want16 >= half - 4096 && want32 - want16 <= half + 4096);
    sk_model_free(m);
    sk_gguf_close(g);
  }
  json_t *ref = sk_test_load_reference("greedy.json");
  json_t *prompts = json_object_get(ref, "prompts");
  uint64_t ids[8];
  size_t n_prompts = json_array_size(prompts);
  assert_true(n_prompts >= 1 && n_prompts <= 8);
  for (size_t i = 0; i < n_prompts; i++) {
    json_t *p = json_array_get(prompts, i);
    ids[i] = open_session(c, "dense", 0, 0, 512);
    assert_int_equal(sstats(c, ids[i]).object_bytes, want16);
    size_t n_p = 0, n_ref = 0;
    int32_t *prompt = sk_test_json_ids(json_object_get(p, "prompt_ids"), &n_p);
    int32_t *want = sk_test_json_ids(json_object_get(p, "generated_ids"), &n_ref);
    if (sk_client_append_tokens(c, ids[i], prompt, n_p, SK_BOS_DEFAULT, NULL, &e) < 0)
      fail_msg("append: %s", e.message);
    struct ids *got = calloc(1, sizeof *got);
    gen(c, ids[i], (uint32_t)n_ref, 0, false, 0, got, NULL);
    assert_int_equal(got->n, n_ref);
    for (size_t j = 0; j < n_ref; j++)
      if (got->v[j] != want[j])
        fail_msg("prompt %zu, token %zu: f16 cache gives %d, llama.cpp (f32 cache) %d", i, j,
                 got->v[j], want[j]);
    free(got);
    free(prompt);
    free(want);
  }
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.memory_bytes, want16 * n_prompts);
  sk_client_free(c);
  /* SIGKILL: the f16 sessions come back and go on */
  kill9();
  start_daemon_args((const char *const[]){"--kv-type", "f16", NULL});
  c = conn();
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.adopted, n_prompts);
  assert_int_equal(ds.set_aside, 0);
  /* fork and export/import copy f16 rows: all three go on alike; a
   * second fork and the export wait for the f32 daemon */
  struct sk_session_summary fk, im, fk2;
  assert_int_equal(sk_client_fork(c, ids[0], &fk, &e), 0);
  assert_int_equal(sk_client_fork(c, ids[0], &fk2, &e), 0);
  void *img = NULL;
  size_t img_len = 0;
  assert_int_equal(sk_client_export(c, ids[0], &img, &img_len, &e), 0);
  assert_int_equal(sk_client_import(c, img, img_len, &im, &e), 0);
  uint64_t three[3] = {ids[0], fk.session, im.session};
  struct ids *more[3];
  for (int i = 0; i < 3; i++) {
    more[i] = calloc(1, sizeof *more[i]);
    gen(c, three[i], 20, 0, false, 0, more[i], NULL);
    assert_int_equal(more[i]->n, 20);
  }
  for (int i = 1; i < 3; i++) assert_memory_equal(more[i]->v, more[0]->v, 20 * sizeof(int32_t));
  sk_client_free(c);
  kill9();
  /* an f32 daemon on the same store adopts them all as f16 sessions */
  start_daemon_args((const char *const[]){"--kv-type", "f32", NULL});
  c = conn();
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.adopted, n_prompts + 3); /* and the forks and the import */
  assert_int_equal(ds.set_aside, 0);
  assert_int_equal(ds.memory_bytes, want16 * (n_prompts + 3));
  assert_int_equal(sstats(c, fk2.session).object_bytes, want16);
  assert_string_equal(sstats(c, fk2.session).kv_type, "f16");
  {
    struct sk_session_summary sum;
    assert_int_equal(sk_client_resume(c, ids[0], &sum, &e), 0);
    assert_string_equal(sum.kv_type, "f16");
    assert_true(sum.adopted);
  }
  /* the untouched fork gives the f16 daemon's 20 tokens */
  struct ids *again = calloc(1, sizeof *again);
  gen(c, fk2.session, 20, 0, false, 0, again, NULL);
  assert_int_equal(again->n, 20);
  assert_memory_equal(again->v, more[0]->v, 20 * sizeof(int32_t));
  /* a fork, and an import of the f16 daemon's export, stay f16 */
  struct sk_session_summary fk3, im2;
  assert_int_equal(sk_client_fork(c, ids[1], &fk3, &e), 0);
  assert_int_equal(sstats(c, fk3.session).object_bytes, want16);
  assert_string_equal(fk3.kv_type, "f16");
  assert_int_equal(sk_client_import(c, img, img_len, &im2, &e), 0);
  assert_int_equal(sstats(c, im2.session).object_bytes, want16);
  assert_string_equal(im2.kv_type, "f16");
  memset(again, 0, sizeof *again);
  gen(c, im2.session, 20, 0, false, 0, again, NULL);
  assert_memory_equal(again->v, more[0]->v, 20 * sizeof(int32_t));
  /* new sessions get the daemon's own type */
  uint64_t s32 = open_session(c, "dense", 0, 0, 512);
  assert_int_equal(sstats(c, s32).object_bytes, want32);
  assert_string_equal(sstats(c, s32).kv_type, "f32");
  {
    struct sk_session_info *rows = NULL;
    size_t n_rows = 0;
    assert_int_equal(sk_client_list(c, &rows, &n_rows, &e), 0);
    assert_int_equal(n_rows, n_prompts + 6);
    size_t n16 = 0;
    for (size_t i = 0; i < n_rows; i++) {
      const bool is32 = rows[i].session == s32;
      assert_string_equal(rows[i].kv_type, is32 ? "f32" : "f16");
      n16 += !is32;
    }
    assert_int_equal(n16, n_prompts + 5);
    free(rows);
  }
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.memory_bytes, want16 * (n_prompts + 5) + want32);
  printf("kv_type f16: %zu-byte objects for 512 tokens (f32: %zu); greedy tokens of the %zu "
         "reference prompts equal llama.cpp's; adopted after SIGKILL; fork and "
         "export/import continue alike; an f32 daemon adopts, continues, forks and imports "
         "them as f16 and opens f32 sessions\n",
         want16, want32, n_prompts);
  for (int i = 0; i < 3; i++) free(more[i]);
  free(again);
  free(img);
  sk_client_free(c);
  json_decref(ref);
  kill9();
}

/* ---- fork ---- */

static void test_fork_300(void **state) {
  (void)state;
  fresh_state("fork");
  start_daemon();
  struct sk_client *c = conn();
  /* 300 tokens of text */
  char *path = sk_test_shared_path("data/stories-sampled.txt");
  size_t len = 0;
  char *text = sk_test_read_file(path, &len);
  assert_non_null(text);
  int32_t *toks = NULL;
  size_t nt = 0;
  struct sk_error e = {0};
  assert_int_equal(sk_client_tokenize(c, text, 4000, SK_BOS_TRUE, &toks, &nt, &e), 0);
  assert_true(nt >= 300);
  uint64_t a = open_session(c, "dense", 0, 0, 1024);
  struct sk_daemon_stats d0, d1, d2;
  assert_int_equal(sk_client_stats(c, &d0, &e), 0);
  double t0 = now_s();
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(c, a, toks, 300, SK_BOS_FALSE, &ar, &e), 0);
  double t_prefill = now_s() - t0;
  assert_int_equal(ar.seen, 300);
  assert_int_equal(sk_client_stats(c, &d1, &e), 0);
  t0 = now_s();
  struct sk_session_summary f;
  assert_int_equal(sk_client_fork(c, a, &f, &e), 0);
  double t_fork = now_s() - t0;
  assert_int_equal(sk_client_stats(c, &d2, &e), 0);
  assert_int_equal(f.from, a);
  assert_true(f.session != a);
  assert_int_equal(f.resident, 300);
  assert_int_equal(f.seen, 300);
  assert_int_equal(d1.tokens_prefilled - d0.tokens_prefilled, 300);
  assert_int_equal(d2.tokens_prefilled - d1.tokens_prefilled, 0); /* no re-prefill */
  assert_int_equal(d2.memory_bytes - d1.memory_bytes, f.object_bytes);
  printf("fork of a 300-token session: prefill of the 300 tokens %.2f ms (tokens_prefilled "
         "+%llu); fork %.2f ms (tokens_prefilled +%llu; a new %llu-byte object, the 300 "
         "resident tokens' K/V rows copied); fork resident %llu, seen %llu\n",
         t_prefill * 1e3, (unsigned long long)(d1.tokens_prefilled - d0.tokens_prefilled),
         t_fork * 1e3, (unsigned long long)(d2.tokens_prefilled - d1.tokens_prefilled),
         (unsigned long long)f.object_bytes, (unsigned long long)f.resident,
         (unsigned long long)f.seen);
  /* both continue the same from the same cache ... */
  struct ids *ga = calloc(1, sizeof *ga), *gf = calloc(1, sizeof *gf);
  gen(c, a, 20, 0, false, 0, ga, NULL);
  gen(c, f.session, 20, 0, false, 0, gf, NULL);
  assert_int_equal(ga->n, 20);
  assert_memory_equal(ga->v, gf->v, 20 * sizeof(int32_t));
  /* ... and independently */
  append_text(c, f.session, " The dog barked at the moon.");
  struct sk_session_stats sa = sstats(c, a), sf = sstats(c, f.session);
  assert_int_equal(sa.seen, 320);
  assert_true(sf.seen > 320);
  size_t na = 0;
  int32_t *ta = tokens_of(c, a, &na);
  assert_int_equal(na, 320);
  assert_memory_equal(ta, toks, 300 * sizeof(int32_t));
  assert_memory_equal(ta + 300, ga->v, 20 * sizeof(int32_t));
  /* a fork of the fork */
  struct sk_session_summary f2;
  assert_int_equal(sk_client_fork(c, f.session, &f2, &e), 0);
  assert_int_equal(f2.seen, sf.seen);
  free(ta);
  free(ga);
  free(gf);
  free(toks);
  free(text);
  free(path);
  sk_client_free(c);
  kill9();
}

/* ---- export / import ---- */

static void test_export_import(void **state) {
  (void)state;
  fresh_state("export");
  start_daemon();
  struct sk_client *c = conn();
  uint64_t a = open_session(c, "streaming", 4, 28, 0);
  append_text(c, a, "Once upon a time, there was a little girl named Lily. She loved");
  struct ids *g0 = calloc(1, sizeof *g0);
  gen(c, a, 30, 0.8, true, 7, g0, NULL); /* evicts; moves the PRNG */
  char file[400], bad[400], cut[400];
  snprintf(file, sizeof file, "%s/a.sinkd", g_dir);
  snprintf(bad, sizeof bad, "%s/bad.sinkd", g_dir);
  snprintf(cut, sizeof cut, "%s/cut.sinkd", g_dir);
  size_t bytes = 0;
  struct sk_error e = {0};
  assert_int_equal(sk_client_save(c, a, file, &bytes, &e), 0);
  struct stat sb;
  assert_int_equal(stat(file, &sb), 0);
  assert_int_equal((size_t)sb.st_size, bytes);
  assert_int_equal(sb.st_mode & 0777, 0600);
  struct sk_session_summary b;
  assert_int_equal(sk_client_load(c, file, &b, &e), 0);
  struct sk_session_stats sa = sstats(c, a);
  assert_int_equal(b.seen, sa.seen);
  assert_int_equal(b.resident, sa.resident);
  assert_int_equal(b.evicted, sa.evicted);
  /* the same continuation, greedy and sampled (the PRNG came along) */
  struct ids *ca = calloc(1, sizeof *ca), *cb = calloc(1, sizeof *cb);
  gen(c, a, 40, 0.8, false, 0, ca, NULL);
  gen(c, b.session, 40, 0.8, false, 0, cb, NULL);
  assert_int_equal(ca->n, 40);
  assert_memory_equal(ca->v, cb->v, 40 * sizeof(int32_t));
  /* one flipped byte: refused; truncated: refused; nothing created */
  size_t len = 0;
  char *img = sk_test_read_file(file, &len);
  assert_non_null(img);
  img[len / 3] ^= 0x01;
  FILE *f = fopen(bad, "wb");
  fwrite(img, 1, len, f);
  fclose(f);
  img[len / 3] ^= 0x01;
  f = fopen(cut, "wb");
  fwrite(img, 1, len - 100, f);
  fclose(f);
  struct sk_daemon_stats d0, d1;
  assert_int_equal(sk_client_stats(c, &d0, &e), 0);
  assert_int_equal(sk_client_load(c, bad, NULL, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "corrupted"));
  printf("one flipped byte: \"%s\"\n", e.message);
  assert_int_equal(sk_client_load(c, cut, NULL, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "truncated"));
  printf("truncated by 100 bytes: \"%s\"\n", e.message);
  assert_int_equal(sk_client_stats(c, &d1, &e), 0);
  assert_int_equal(d1.sessions, d0.sessions);

  /* the same with sinkctl */
  const char *ctl = getenv("SK_SINKCTL");
  if (!ctl) ctl = "./client/sinkctl";
  char cmd[1200];
  int st = 0;
  snprintf(cmd, sizeof cmd, "%s --socket %s save %llu %s/ctl.sinkd", ctl, g_socket,
           (unsigned long long)a, g_dir);
  char *out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "saved to"));
  snprintf(cmd, sizeof cmd, "%s --socket %s load %s/ctl.sinkd", ctl, g_socket, g_dir);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  uint64_t loaded = strtoull(out, NULL, 10);
  assert_true(loaded > b.session);
  snprintf(cmd, sizeof cmd, "%s --socket %s --json resume %llu", ctl, g_socket,
           (unsigned long long)loaded);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "\"resident\": "));
  snprintf(cmd, sizeof cmd, "%s --socket %s fork %llu", ctl, g_socket, (unsigned long long)loaded);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  assert_true(strtoull(out, NULL, 10) > loaded);
  snprintf(cmd, sizeof cmd, "%s --socket %s load %s 2>&1", ctl, g_socket, bad);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 1);
  assert_non_null(strstr(out, "bad_request: export file corrupted"));
  snprintf(cmd, sizeof cmd, "%s --socket %s load %s/nonexistent 2>&1", ctl, g_socket, g_dir);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 1);
  assert_non_null(strstr(out, "cannot open"));
  snprintf(cmd, sizeof cmd, "%s --socket %s resume 99999 2>&1", ctl, g_socket);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 1);
  assert_non_null(strstr(out, "no_such_session"));
  free(out);
  /* a small frame limit: the client halves its chunks until they fit */
  sk_client_free(c);
  kill9();
  const char *small[] = {"--max-frame", "65536", NULL};
  start_daemon_args(small);
  c = conn();
  struct sk_session_summary b2;
  assert_int_equal(sk_client_load(c, file, &b2, &e), 0);
  assert_int_equal(b2.seen, sa.seen);
  free(img);
  free(g0);
  free(ca);
  free(cb);
  sk_client_free(c);
  kill9();
}

/* ---- limits, TTL, memory accounting ---- */

static uint64_t state_dir_bytes(void) {
  DIR *d = opendir(g_state);
  assert_non_null(d);
  uint64_t sum = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (strncmp(de->d_name, "session-", 8) != 0) continue;
    char p[600];
    snprintf(p, sizeof p, "%s/%s", g_state, de->d_name);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    sum += (uint64_t)sb.st_size;
  }
  closedir(d);
  return sum;
}

static void test_limits(void **state) {
  (void)state;
  fresh_state("limits");
  const char *args[] = {"--max-sessions", "3", "--max-memory", "1M", NULL};
  start_daemon_args(args);
  struct sk_client *c = conn();
  /* 204800 bytes each: three fit in 1 MiB, four would too */
  struct sk_open_params op = {.policy = "dense", .capacity = 128};
  struct sk_open_result o[4];
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(c, &op, &o[0], &e), 0);
  assert_int_equal(sk_client_open(c, &op, &o[1], &e), 0);
  assert_int_equal(sk_client_open(c, &op, &o[2], &e), 0);
  assert_int_equal(sk_client_open(c, &op, &o[3], &e), -SK_ERR_BUSY);
  assert_non_null(strstr(e.message, "max_sessions 3"));
  struct sk_daemon_stats ds;
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(o[0].object_bytes, 204800);
  assert_int_equal(ds.memory_bytes, o[0].object_bytes * 3);
  assert_int_equal(ds.memory_bytes, state_dir_bytes());
  assert_int_equal(ds.max_memory, 1u << 20);
  /* memory: a cache that does not fit */
  assert_int_equal(sk_client_close_session(c, o[2].session, &e), 0);
  struct sk_open_params big = {.policy = "dense", .capacity = 2048};
  assert_int_equal(sk_client_open(c, &big, &o[3], &e), -SK_ERR_BUSY);
  assert_non_null(strstr(e.message, "max_memory 1048576"));
  /* a fork counts too */
  assert_int_equal(sk_client_fork(c, o[0].session, NULL, &e), 0);
  assert_int_equal(sk_client_fork(c, o[0].session, NULL, &e), -SK_ERR_BUSY);
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.sessions, 3);
  assert_int_equal(ds.memory_bytes, state_dir_bytes());
  printf("limits: 4th open busy (\"max_sessions 3\"), a 2048-token cache busy (\"max_memory\"); "
         "memory_bytes %llu = the state directory's files\n",
         (unsigned long long)ds.memory_bytes);
  sk_client_free(c);
  kill9();

  /* idle TTL: a session nobody touches for 1 s is closed (and its object
   * deleted); one in use is not */
  fresh_state("ttl");
  const char *ttl[] = {"--idle-ttl", "1", NULL};
  start_daemon_args(ttl);
  c = conn();
  uint64_t s1 = open_session(c, "dense", 0, 0, 64);
  uint64_t s2 = open_session(c, "dense", 0, 0, 64);
  /* A temporary session ends with its connection, not by the TTL. */
  struct sk_open_params top = {.policy = "dense", .capacity = 64, .temporary = true};
  struct sk_open_result tmp;
  assert_int_equal(sk_client_open(c, &top, &tmp, &e), 0);
  assert_int_equal(sk_client_resume(c, s1, NULL, &e), 0);
  /* poll with list (which touches nothing), keeping s1 in use */
  bool gone = false;
  for (int i = 0; i < 100 && !gone; i++) { /* at most 10 s */
    usleep(100000);
    assert_int_equal(sk_client_resume(c, s1, NULL, &e), 0);
    struct sk_session_info *l = NULL;
    size_t n = 0;
    assert_int_equal(sk_client_list(c, &l, &n, &e), 0);
    gone = true;
    for (size_t k = 0; k < n; k++) gone &= l[k].session != s2;
    free(l);
  }
  assert_true(gone);
  assert_int_equal(sk_client_resume(c, s1, NULL, &e), 0);
  {
    struct sk_session_info *l = NULL;
    size_t n = 0;
    assert_int_equal(sk_client_list(c, &l, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(l[1].session, tmp.session);
    assert_true(l[1].temporary);
    assert_true(l[1].idle_s >= 1);
    free(l);
  }
  assert_int_equal(sk_client_close_session(c, tmp.session, &e), 0);
  assert_int_equal(state_dir_bytes(), sstats(c, s1).object_bytes);
  assert_true(log_has("closed: idle for"));
  sk_client_free(c);
  kill9();
}

/* A clean stop keeps the sessions too (an upgrade is a stop and a
 * start). */
static void test_sigterm_keeps(void **state) {
  (void)state;
  fresh_state("term");
  start_daemon();
  struct sk_client *c = conn();
  uint64_t a = open_session(c, "streaming", 4, 28, 0);
  append_text(c, a, "Once upon a time");
  struct sk_session_stats s0 = sstats(c, a);
  /* a temporary session whose connection is open when the daemon stops:
   * it ends with the connection, it is not kept for the restart */
  struct sk_client *tc = conn();
  struct sk_open_params tp = {.temporary = true};
  struct sk_open_result to;
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(tc, &tp, &to, &e), 0);
  append_text(tc, to.session, "One day");
  sk_client_free(c);
  stop_term();
  sk_client_free(tc);
  start_daemon();
  c = conn();
  struct sk_session_summary sum;
  assert_int_equal(sk_client_resume(c, to.session, NULL, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(sk_client_resume(c, a, &sum, &e), 0);
  assert_true(sum.adopted);
  assert_int_equal(sum.seen, s0.seen);
  assert_int_equal(sum.commit, s0.commit);
  /* close deletes it for good */
  assert_int_equal(sk_client_close_session(c, a, &e), 0);
  assert_int_equal(state_dir_bytes(), 0);
  sk_client_free(c);
  /* and its id is not given again, even after a restart */
  kill9();
  start_daemon();
  c = conn();
  assert_int_equal(sk_client_resume(c, a, NULL, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(open_session(c, "dense", 0, 0, 64), to.session + 1);
  sk_client_free(c);
  kill9();
}

/* A daemon killed outright cannot close a temporary session; the next
 * one does, since the connection that owned it is gone. */
static void test_kill_closes_temporary(void **state) {
  (void)state;
  fresh_state("killtemp");
  start_daemon();
  struct sk_client *c = conn();
  uint64_t keep = open_session(c, "streaming", 4, 28, 0);
  append_text(c, keep, "Once upon a time");
  struct sk_session_stats s0 = sstats(c, keep);
  struct sk_open_params tp = {.temporary = true};
  struct sk_open_result to;
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(c, &tp, &to, &e), 0);
  append_text(c, to.session, "One day");
  assert_int_equal(state_dir_bytes(), s0.object_bytes + sstats(c, to.session).object_bytes);
  kill9(); /* the connection is still open */
  sk_client_free(c);
  start_daemon();
  c = conn();
  assert_int_equal(sk_client_resume(c, to.session, NULL, &e), -SK_ERR_NO_SUCH_SESSION);
  struct sk_session_summary sum;
  assert_int_equal(sk_client_resume(c, keep, &sum, &e), 0);
  assert_true(sum.adopted);
  assert_int_equal(sum.seen, s0.seen);
  assert_int_equal(state_dir_bytes(), s0.object_bytes); /* its file is gone */
  char line[96];
  snprintf(line, sizeof line, "session %llu of uid %u closed: temporary",
           (unsigned long long)to.session, (unsigned)getuid());
  assert_true(log_has(line));
  assert_true(log_has("1 session adopted, 0 set aside, 1 temporary closed"));
  sk_client_free(c);
  kill9();
}

/* Whatever happened in a test, its daemon does not outlive it. */
static int test_teardown(void **state) {
  (void)state;
  kill9();
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_greedy_kill_resume, test_teardown),
      cmocka_unit_test_teardown(test_kill_closes_temporary, test_teardown),
      cmocka_unit_test_teardown(test_kill_mid_generate, test_teardown),
      cmocka_unit_test_teardown(test_kill_50, test_teardown),
      cmocka_unit_test_teardown(test_corrupted_set_aside, test_teardown),
      cmocka_unit_test_teardown(test_eos_step_committed, test_teardown),
      cmocka_unit_test_teardown(test_kv_f16, test_teardown),
      cmocka_unit_test_teardown(test_fork_300, test_teardown),
      cmocka_unit_test_teardown(test_export_import, test_teardown),
      cmocka_unit_test_teardown(test_limits, test_teardown),
      cmocka_unit_test_teardown(test_sigterm_keeps, test_teardown),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
