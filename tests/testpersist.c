/* The daemon of the persistence tests (testpersist.h): started, killed
 * and restarted on one state directory, and the client calls every part
 * of those tests makes. */
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
#include "testpersist.h"
char g_dir[64];
char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
char g_log[300];
char g_state[300];
pid_t g_pid;

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dump_log(void) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  if (log) {
    fprintf(stderr, "---- sinkd log (last 3000 bytes) ----\n%s\n-----------\n",
            n > 3000 ? log + n - 3000 : log);
    free(log);
  }
}

int start_daemon_model(const char *model, const char *const *extra) {
  const char *sinkd = getenv("SK_SINKD");
  if (!sinkd) sinkd = "./daemon/sinkd";
  const char *argv[32];
  int n = 0;
  argv[n++] = sinkd;
  /* an installed /etc/sinkd/sinkd.conf must not change what runs */
  argv[n++] = "--config";
  argv[n++] = "/dev/null";
  argv[n++] = "--model";
  argv[n++] = model;
  argv[n++] = "--socket";
  argv[n++] = g_socket;
  argv[n++] = "--state-dir";
  argv[n++] = g_state;
  argv[n++] = "--threads";
  argv[n++] = "1";
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
  for (int i = 0; i < 3000; i++) {
    int st;
    if (waitpid(g_pid, &st, WNOHANG) == g_pid) {
      g_pid = 0;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    }
    struct sk_client *c = NULL;
    if (sk_client_connect(g_socket, &c, NULL) == 0) {
      sk_client_free(c);
      return 0;
    }
    usleep(10000);
  }
  dump_log();
  fail_msg("sinkd did not start");
  return -1;
}

void start_daemon_args(const char *const *extra) {
  /* llama.cpp's reference values were taken with an f32 cache (its f16
   * default moves logits by ~0.016); extra may name another type (the
   * last one given counts) */
  const char *argv[32] = {"--kv-type", "f32"};
  int n = 2;
  for (int i = 0; extra && extra[i] && n < 31; i++) argv[n++] = extra[i];
  argv[n] = NULL;
  int st = start_daemon_model(sk_test_model_path(), argv);
  if (st != 0) {
    dump_log();
    fail_msg("sinkd exited with status %d as it started", st);
  }
}

void start_daemon(void) { start_daemon_args(NULL); }

void kill9(void) {
  if (g_pid > 0) {
    kill(g_pid, SIGKILL);
    waitpid(g_pid, NULL, 0);
    g_pid = 0;
  }
}

void stop_term(void) {
  if (g_pid > 0) {
    kill(g_pid, SIGTERM);
    int st = 0;
    waitpid(g_pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    g_pid = 0;
  }
}

struct sk_client *conn(void) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(g_socket, &c, &e) < 0) {
    dump_log();
    fail_msg("connect: %s", e.message);
  }
  sk_client_set_timeout(c, 120000, NULL);
  return c;
}

int setup(void **state) {
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

int teardown(void **state) {
  (void)state;
  kill9();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Each test gets its own, empty state directory. */
void fresh_state(const char *name) {
  snprintf(g_state, sizeof g_state, "%s/%s", g_dir, name);
  snprintf(g_log, sizeof g_log, "%s/%s.log", g_dir, name);
}

uint64_t open_session(struct sk_client *c, const char *policy, uint32_t n_sink,
                      uint32_t window, uint32_t capacity) {
  struct sk_open_params op = {.policy = policy, .n_sink = n_sink, .window = window,
                              .capacity = capacity};
  struct sk_open_result o;
  struct sk_error e = {0};
  if (sk_client_open(c, &op, &o, &e) < 0) fail_msg("open: %s", e.message);
  return o.session;
}

/* ---- token collection ---- */

int ids_cb(void *user, const struct sk_token_event *ev) {
  struct ids *x = user;
  if (x->n < sizeof x->v / sizeof x->v[0]) {
    x->lp[x->n] = ev->logprob;
    x->v[x->n++] = ev->token;
  }
  if (x->kill_after > 0 && x->n == (size_t)x->kill_after) kill9();
  return 0;
}

void gen(struct sk_client *c, uint64_t s, uint32_t n, double temperature, bool seeded,
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

void append_text(struct sk_client *c, uint64_t s, const char *text) {
  struct sk_error e = {0};
  if (sk_client_append_text(c, s, text, strlen(text), SK_BOS_DEFAULT, NULL, &e) < 0)
    fail_msg("append: %s", e.message);
}

int32_t *tokens_of(struct sk_client *c, uint64_t s, size_t *n) {
  int32_t *t = NULL;
  struct sk_error e = {0};
  if (sk_client_session_tokens(c, s, &t, n, &e) < 0) fail_msg("tokens: %s", e.message);
  return t;
}

struct sk_session_stats sstats(struct sk_client *c, uint64_t s) {
  struct sk_session_stats st;
  struct sk_error e = {0};
  if (sk_client_session_stats(c, s, &st, &e) < 0) fail_msg("stats: %s", e.message);
  return st;
}

int log_count(const char *needle) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  int k = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p++) k++;
  free(log);
  return k;
}

bool log_has(const char *needle) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  bool has = log && strstr(log, needle);
  free(log);
  return has;
}

/* ---- greedy 200 = 100 + kill + 100 ---- */

/* ---- limits, TTL, memory accounting ---- */

uint64_t state_dir_bytes(void) {
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


/* Whatever happened in a test, its daemon does not outlive it. */
int test_teardown(void **state) {
  (void)state;
  kill9();
  return 0;
}

