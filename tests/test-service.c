/* sinkd as a system service, without systemd as PID 1: the real daemon
 * with a NOTIFY_SOCKET listener written here (READY=1 only once serving,
 * STATUS=, RELOADING=1 on SIGHUP, STOPPING=1, WATCHDOG=1), socket
 * activation through systemd-socket-activate and LISTEN_FDS/LISTEN_PID,
 * stale and live socket files, the configuration file and SIGHUP, and
 * --check-config. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

#include "sinkd/client.h"
#include "testutil.h"

static char *g_dir;
static char g_notify_path[108];
static int g_notify = -1;

static char *path_in_dir(const char *leaf) {
  char *p = malloc(512);
  assert_non_null(p);
  snprintf(p, 512, "%s/%s", g_dir, leaf);
  return p;
}

static int setup(void **state) {
  (void)state;
  g_dir = sk_test_tmpdir();
  snprintf(g_notify_path, sizeof g_notify_path, "%s/notify", g_dir);
  g_notify = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", g_notify_path);
  if (g_notify < 0 || bind(g_notify, (struct sockaddr *)&a, sizeof a) < 0) return -1;
  /* A generous bound on every wait: a daemon that never says what the
   * test waits for fails the test instead of hanging it. */
  struct timeval tv = {.tv_sec = 60};
  setsockopt(g_notify, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return 0;
}

/* Every child started, so that a failed test leaves none running. */
static pid_t g_children[64];
static size_t g_n_children;

/* A reaped child's pid may be reused: it leaves the list. */
static void forget_child(pid_t pid) {
  for (size_t i = 0; i < g_n_children; i++)
    if (g_children[i] == pid) g_children[i] = g_children[--g_n_children];
}

static int teardown(void **state) {
  (void)state;
  for (size_t i = 0; i < g_n_children; i++)
    if (kill(g_children[i], SIGKILL) == 0) waitpid(g_children[i], NULL, 0);
  close(g_notify);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) return -1;
  free(g_dir);
  return 0;
}

/* ---- the daemon as a child ---------------------------------------------- */

struct child {
  pid_t pid;
  char log[512];
};

/* Starts argv[0] with stderr to a log file and the given environment
 * additions ("NAME=value"; "WATCHDOG_PID=self" names the child itself;
 * "FD3=path" opens path as fd 3). */
static void spawn(struct child *ch, const char *log_leaf, const char *const *env,
                  const char *const *argv_in) {
  snprintf(ch->log, sizeof ch->log, "%s/%s", g_dir, log_leaf);
  /* Every sinkd gets a session store of its own next to its log (never
   * the default /run/sinkd/state): inserted after the sinkd argument. */
  char state[sizeof ch->log + 8];
  snprintf(state, sizeof state, "%s.state", ch->log);
  const char *argv[40];
  size_t n = 0;
  for (size_t i = 0; argv_in[i] && n + 3 < sizeof argv / sizeof argv[0]; i++) {
    argv[n++] = argv_in[i];
    if (strcmp(argv_in[i], getenv("SK_SINKD")) == 0) {
      argv[n++] = "--state-dir";
      argv[n++] = state;
    }
  }
  argv[n] = NULL;
  fflush(NULL);
  ch->pid = fork();
  assert_true(ch->pid >= 0);
  if (ch->pid == 0) {
    if (!freopen(ch->log, "w", stderr) || !freopen("/dev/null", "w", stdout)) _exit(126);
    /* The log file stands for the journal's stream, as systemd gives it
     * (the lines then carry priorities); "JOURNAL_STREAM=none" in env:
     * not the journal. */
    struct stat lst;
    if (fstat(STDERR_FILENO, &lst) == 0) {
      char js[64];
      snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)lst.st_dev,
               (unsigned long long)lst.st_ino);
      setenv("JOURNAL_STREAM", js, 1);
    }
    for (const char *const *e = env; e && *e; e++) {
      char name[64];
      const char *eq = strchr(*e, '=');
      snprintf(name, sizeof name, "%.*s", (int)(eq - *e), *e);
      if (strcmp(name, "WATCHDOG_PID") == 0 && strcmp(eq + 1, "self") == 0) {
        char pid[32];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        setenv(name, pid, 1);
      } else if (strcmp(name, "LISTEN_PID") == 0 && strcmp(eq + 1, "self") == 0) {
        char pid[32];
        snprintf(pid, sizeof pid, "%d", (int)getpid());
        setenv(name, pid, 1);
      } else if (strcmp(name, "JOURNAL_STREAM") == 0 && strcmp(eq + 1, "none") == 0) {
        unsetenv(name);
      } else if (strcmp(name, "FD3") == 0) {
        int fd = open(eq + 1, O_RDONLY);
        if (fd < 0 || dup2(fd, 3) < 0) _exit(126);
      } else {
        setenv(name, eq + 1, 1);
      }
    }
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  if (g_n_children < sizeof g_children / sizeof g_children[0]) g_children[g_n_children++] = ch->pid;
}

/* The child's log so far ("" if it has not opened it yet). */
static char *read_log(const struct child *ch) {
  size_t n = 0;
  char *log = sk_test_read_file(ch->log, &n);
  if (!log) log = strdup("");
  assert_non_null(log);
  return log;
}

static void dump_log(const struct child *ch) {
  char *log = read_log(ch);
  fprintf(stderr, "---- %s ----\n%s--------\n", ch->log, log);
  free(log);
}

static bool log_has(const struct child *ch, const char *needle) {
  char *log = read_log(ch);
  bool has = strstr(log, needle) != NULL;
  free(log);
  return has;
}

static int wait_exit(struct child *ch) {
  int status = 0;
  assert_int_equal(waitpid(ch->pid, &status, 0), ch->pid);
  forget_child(ch->pid);
  ch->pid = 0;
  if (!WIFEXITED(status)) {
    dump_log(ch);
    fail_msg("the daemon did not exit normally (status 0x%x)", status);
  }
  return WEXITSTATUS(status);
}

/* Everything received on the notify socket so far, one message per line. */
static char g_heard[1 << 16];
static size_t g_heard_len;

/* Receives messages until one contains needle; copies it to ret (may be
 * NULL). The receive timeout of setup() bounds the wait. */
static void wait_message(const struct child *ch, const char *needle, char *ret, size_t size) {
  char buf[1024];
  for (;;) {
    ssize_t n = recv(g_notify, buf, sizeof buf - 1, 0);
    if (n < 0) {
      dump_log(ch);
      fail_msg("no notify message with '%s' (heard:\n%.*s)", needle, (int)g_heard_len, g_heard);
    }
    buf[n] = 0;
    if (g_heard_len + (size_t)n + 2 < sizeof g_heard) {
      memcpy(g_heard + g_heard_len, buf, (size_t)n);
      g_heard_len += (size_t)n;
      g_heard[g_heard_len++] = '\n';
      g_heard[g_heard_len] = 0;
    }
    if (strstr(buf, needle)) {
      if (ret) snprintf(ret, size, "%s", buf);
      return;
    }
  }
}

static void drain_messages(void) {
  char buf[1024];
  while (recv(g_notify, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
  g_heard_len = 0;
  g_heard[0] = 0;
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static struct sk_client *connect_now(const char *sock) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(sock, &c, &e) < 0) fail_msg("connect %s: %s", sock, e.message);
  sk_client_set_timeout(c, 60000, NULL);
  return c;
}

static bool file_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* ---- readiness, status, watchdog, reload, stopping ------------------------ */

static void test_notify_lifecycle(void **state) {
  (void)state;
  char *sock = path_in_dir("s.sock");
  char *conf = path_in_dir("sinkd.conf");
  char notify_env[160];
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", g_notify_path);
  write_text(conf, "[daemon]\nlog_level = info\n");
  drain_messages();
  struct child d;
  spawn(&d, "lifecycle.log",
        (const char *const[]){notify_env, "WATCHDOG_USEC=200000", "WATCHDOG_PID=self", NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", conf, "--model",
                              sk_test_model_path(), "--socket", sock, "--threads", "1", NULL});

  /* READY=1 comes once the model is loaded and the socket accepts: the
   * very first connection attempt after it succeeds, no retry. */
  wait_message(&d, "READY=1", NULL, 0);
  assert_non_null(strstr(g_heard, "STATUS=loading "));
  assert_true(strstr(g_heard, "STATUS=loading ") < strstr(g_heard, "READY=1"));
  assert_true(log_has(&d, "model loaded in "));
  struct sk_client *c = connect_now(sock);
  struct sk_hello h;
  struct sk_error e = {0};
  assert_int_equal(sk_client_hello(c, &h, &e), 0);

  /* STATUS= follows the sessions and clients. */
  char msg[1024], want[512];
  struct sk_open_result opened;
  assert_int_equal(sk_client_open(c, NULL, &opened, &e), 0);
  snprintf(want, sizeof want, "STATUS=serving %s: 1 session, 1 client", h.model.name);
  wait_message(&d, want, NULL, 0);

  /* Watchdog pings from the event loop, every 100 ms. */
  for (int i = 0; i < 3; i++) wait_message(&d, "WATCHDOG=1", msg, sizeof msg);
  assert_string_equal(msg, "WATCHDOG=1");
  assert_true(log_has(&d, "watchdog: pinging the service manager every 100 ms"));

  /* SIGHUP: RELOADING=1, the new limits apply, READY=1 again. batch is
   * fixed at start: kept, with a warning. */
  write_text(conf, "[daemon]\nlog_level = info\nbatch = 32\n[limits]\nmax_sessions = 1\n");
  kill(d.pid, SIGHUP);
  wait_message(&d, "RELOADING=1", NULL, 0);
  wait_message(&d, "READY=1", NULL, 0);
  struct sk_open_result second;
  assert_int_equal(sk_client_open(c, NULL, &second, &e), -SK_ERR_BUSY);
  assert_string_equal(e.message, "session limit reached: 1 sessions open (max_sessions 1): "
                                 "`sinkctl list` shows them, `sinkctl close --idle 1h` closes "
                                 "those idle for an hour");
  snprintf(want, sizeof want, "reloaded %s: max_sessions 64 -> 1", conf);
  assert_true(log_has(&d, want));
  assert_true(log_has(&d, "<4>reload: batch changed; restart sinkd to apply"));

  /* A broken file changes nothing. */
  write_text(conf, "[limits]\nmax_sessions = 0\n");
  kill(d.pid, SIGHUP);
  wait_message(&d, "RELOADING=1", NULL, 0);
  wait_message(&d, "READY=1", NULL, 0);
  snprintf(want, sizeof want, "<3>%s:2: [limits] max_sessions: '0' is not a number", conf);
  assert_true(log_has(&d, want));
  assert_true(log_has(&d, "has errors; keeping the running configuration"));
  assert_int_equal(sk_client_open(c, NULL, &second, &e), -SK_ERR_BUSY);

  /* Back to more sessions; the log level goes to debug. */
  write_text(conf, "[daemon]\nlog_level = debug\n[limits]\nmax_sessions = 2\n");
  kill(d.pid, SIGHUP);
  wait_message(&d, "RELOADING=1", NULL, 0);
  wait_message(&d, "READY=1", NULL, 0);
  assert_int_equal(sk_client_open(c, NULL, &second, &e), 0);
  assert_int_equal(sk_client_close_session(c, 999, &e), -SK_ERR_NO_SUCH_SESSION);
  sk_client_free(c);
  assert_true(log_has(&d, "<7>client "));

  /* Only a restart-only key changed: the reload says so, and that nothing
   * else did. */
  write_text(conf, "[daemon]\nlog_level = debug\nkv_type = f32\n[limits]\nmax_sessions = 2\n");
  kill(d.pid, SIGHUP);
  wait_message(&d, "RELOADING=1", NULL, 0);
  wait_message(&d, "READY=1", NULL, 0);
  assert_true(log_has(&d, "<4>reload: kv_type changed; restart sinkd to apply"));
  snprintf(want, sizeof want, "reloaded %s: nothing that applies without a restart changed", conf);
  assert_true(log_has(&d, want));

  /* SIGTERM: STOPPING=1, exit 0, the socket file removed. */
  kill(d.pid, SIGTERM);
  wait_message(&d, "STOPPING=1", NULL, 0);
  assert_int_equal(wait_exit(&d), 0);
  assert_false(file_exists(sock));
  free(sock);
  free(conf);
}

/* ---- limits from the file, changed by SIGHUP ------------------------------- */

static void test_memory_and_session_limits(void **state) {
  (void)state;
  char *sock = path_in_dir("limits.sock");
  char *conf = path_in_dir("limits.conf");
  char notify_env[160];
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", g_notify_path);
  /* A streaming session of the test model (4 + 1020 tokens), with the
   * default f16 cache, holds 737280 bytes (its shared-memory object), of
   * them 2 x 5 layers x 1040 slots x 32 x 2 = 665600 of keys and values:
   * two do not fit in 1M. */
  write_text(conf, "[limits]\nmax_memory = 1M\nmax_sessions = 2\n");
  drain_messages();
  struct child d;
  spawn(&d, "limits.log", (const char *const[]){notify_env, NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", conf, "--model",
                              sk_test_model_path(), "--socket", sock, "--threads", "1", NULL});
  wait_message(&d, "READY=1", NULL, 0);
  struct sk_client *c = connect_now(sock);
  struct sk_error e = {0};
  struct sk_hello h;
  assert_int_equal(sk_client_hello(c, &h, &e), 0);
  assert_string_equal(h.compute.kv_type, "f16"); /* the default */
  struct sk_open_result a, b;
  assert_int_equal(sk_client_open(c, NULL, &a, &e), 0);
  assert_int_equal(a.object_bytes, 737280);
  assert_int_equal(a.kv_bytes, 665600);
  assert_int_equal(sk_client_open(c, NULL, &b, &e), -SK_ERR_BUSY);
  assert_string_equal(e.message, "memory limit reached: 737280 bytes of sessions + 737280 "
                                 "for this one exceed max_memory 1048576 bytes");
  /* A smaller session still fits. */
  struct sk_open_params small = {.policy = "dense", .capacity = 64};
  assert_int_equal(sk_client_open(c, &small, &b, &e), 0);
  assert_int_equal(sk_client_close_session(c, b.session, &e), 0);

  /* More memory by SIGHUP; max_sessions cannot grow past its value at
   * start (the table is sized then): capped, and said so. */
  write_text(conf, "[limits]\nmax_memory = 3M\nmax_sessions = 10\n");
  kill(d.pid, SIGHUP);
  wait_message(&d, "RELOADING=1", NULL, 0);
  wait_message(&d, "READY=1", NULL, 0);
  assert_int_equal(sk_client_open(c, NULL, &b, &e), 0);
  struct sk_open_result third;
  assert_int_equal(sk_client_open(c, &small, &third, &e), -SK_ERR_BUSY);
  assert_string_equal(e.message, "session limit reached: 2 sessions open (max_sessions 2): "
                                 "`sinkctl list` shows them, `sinkctl close --idle 1h` closes "
                                 "those idle for an hour");
  assert_true(log_has(&d, "<4>reload: max_sessions 10 above 2: raising a size fixed at start "
                          "needs a restart; capped"));
  assert_true(log_has(&d, "max_memory 1M -> 3M"));
  sk_client_free(c);
  kill(d.pid, SIGTERM);
  assert_int_equal(wait_exit(&d), 0);
  free(sock);
  free(conf);
}

/* ---- socket activation ----------------------------------------------------- */

static void test_socket_activation(void **state) {
  (void)state;
  char *sock = path_in_dir("activated.sock");
  char *unused = path_in_dir("unused.sock");
  char notify_env[160];
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", g_notify_path);
  drain_messages();
  /* systemd-socket-activate listens, then on the first connection execs
   * sinkd in its own place with LISTEN_FDS=1 and LISTEN_PID set. */
  const char *activate = getenv("SK_SOCKET_ACTIVATE");
  if (!activate || !*activate)
    fail_msg("systemd-socket-activate not found (Debian package systemd; scripts/deps.sh --tests)");
  struct child d;
  spawn(&d, "activated.log", NULL,
        (const char *const[]){activate, "--listen", sock, "-E", notify_env,
                              getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", unused, "--threads", "1", NULL});
  for (int i = 0; i < 3000 && !file_exists(sock); i++) usleep(10000);
  if (!file_exists(sock)) {
    dump_log(&d);
    fail_msg("systemd-socket-activate did not create %s", sock);
  }
  /* The connection is queued by the passed socket while sinkd loads.
   * (systemd-socket-activate binds, then listens: until it listens, the
   * file exists and refuses connections.) */
  struct sk_client *c = NULL;
  struct sk_error ce = {0};
  for (int i = 0; i < 500 && sk_client_connect(sock, &c, &ce) < 0; i++) usleep(10000);
  if (!c) fail_msg("connect %s: %s", sock, ce.message);
  sk_client_set_timeout(c, 60000, NULL);
  struct sk_error e = {0};
  assert_int_equal(sk_client_ping(c, &e), 0);
  wait_message(&d, "READY=1", NULL, 0);
  sk_client_free(c);
  char want[300];
  snprintf(want, sizeof want, "using the socket passed by the service manager: %s (fd 3)", sock);
  assert_true(log_has(&d, want));
  assert_false(file_exists(unused));

  /* The socket belongs to the service manager: it stays after sinkd stops. */
  kill(d.pid, SIGTERM);
  assert_int_equal(wait_exit(&d), 0);
  assert_true(file_exists(sock));
  unlink(sock);

  /* LISTEN_FDS meant for another process (LISTEN_PID) is ignored: sinkd
   * binds its own socket. */
  spawn(&d, "not-for-us.log", (const char *const[]){"LISTEN_FDS=1", "LISTEN_PID=1", NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", unused, "--threads", "1", NULL});
  for (int i = 0; i < 3000 && !log_has(&d, "listening on"); i++) usleep(10000);
  c = connect_now(unused);
  assert_int_equal(sk_client_ping(c, &e), 0);
  sk_client_free(c);
  assert_false(log_has(&d, "passed by the service manager"));
  kill(d.pid, SIGTERM);
  assert_int_equal(wait_exit(&d), 0);

  /* A passed fd that is not a listening Unix socket: refused, exit 1. */
  spawn(&d, "bad-fd.log",
        (const char *const[]){"FD3=/dev/null", "LISTEN_FDS=1", "LISTEN_PID=self", NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", unused, "--threads", "1", NULL});
  assert_int_equal(wait_exit(&d), 1);
  assert_true(log_has(&d, "<3>the socket passed as fd 3 is not a listening Unix stream socket"));
  free(sock);
  free(unused);
}

/* ---- no model yet: waiting for one ------------------------------------------ */

/* Under a service manager, a configuration without a model (or naming a
 * file not there yet) is no failure: READY=1 with a status saying what to
 * do, watchdog pings, and each SIGHUP re-reads the file until the model
 * is there; then it loads and serves. Outside one it stays an error. */
static void test_wait_for_model(void **state) {
  (void)state;
  char *sock = path_in_dir("wait.sock");
  char *conf = path_in_dir("wait.conf");
  char *absent = path_in_dir("not-yet.gguf");
  char notify_env[160], want[1200], text[1024];
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", g_notify_path);
  write_text(conf, "[daemon]\nlog_level = info\n");
  drain_messages();
  struct child d;
  spawn(&d, "wait.log",
        (const char *const[]){notify_env, "WATCHDOG_USEC=200000", "WATCHDOG_PID=self", NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", conf, "--socket", sock,
                              "--threads", "1", NULL});
  char msg[1024];
  wait_message(&d, "READY=1", msg, sizeof msg);
  snprintf(want, sizeof want,
           "READY=1\nSTATUS=no model: set model = in [daemon] of %s, then systemctl reload "
           "sinkd", conf);
  assert_string_equal(msg, want);
  snprintf(want, sizeof want,
           "<4>no model: set model = in [daemon] of %s, then systemctl reload sinkd\n", conf);
  assert_true(log_has(&d, want));
  /* Alive while it waits: watchdog pings, no socket yet, nothing loaded. */
  for (int i = 0; i < 3; i++) wait_message(&d, "WATCHDOG=1", NULL, 0);
  assert_false(file_exists(sock));
  assert_false(log_has(&d, "model loaded"));

  /* A model path whose file is not there yet: still waiting, and saying so. */
  snprintf(text, sizeof text, "[daemon]\nmodel = %s\n", absent);
  write_text(conf, text);
  kill(d.pid, SIGHUP);
  wait_message(&d, "RELOADING=1", NULL, 0);
  wait_message(&d, "READY=1", msg, sizeof msg);
  snprintf(want, sizeof want,
           "READY=1\nSTATUS=no model: %s does not exist; put the GGUF file there or set "
           "model = in %s, then systemctl reload sinkd", absent, conf);
  assert_string_equal(msg, want);

  /* A file with errors: logged, still waiting. */
  write_text(conf, "[daemon]\nmodle = /m.gguf\n");
  kill(d.pid, SIGHUP);
  wait_message(&d, "RELOADING=1", NULL, 0);
  wait_message(&d, "READY=1", msg, sizeof msg);
  snprintf(want, sizeof want,
           "READY=1\nSTATUS=no model: %s has errors (see the log); fix them, then systemctl "
           "reload sinkd", conf);
  assert_string_equal(msg, want);
  snprintf(want, sizeof want, "<3>%s:2: [daemon] modle: unknown key", conf);
  assert_true(log_has(&d, want));

  /* The model is there: RELOADING=1, loading (the start timeout, and so
   * the watchdog, extended by 10 minutes), then READY=1 once serving. */
  snprintf(text, sizeof text, "[daemon]\nmodel = %s\n", sk_test_model_path());
  write_text(conf, text);
  drain_messages();
  kill(d.pid, SIGHUP);
  wait_message(&d, "EXTEND_TIMEOUT_USEC=", msg, sizeof msg);
  snprintf(want, sizeof want, "STATUS=loading %s\nEXTEND_TIMEOUT_USEC=600000000",
           sk_test_model_path());
  assert_string_equal(msg, want);
  assert_non_null(strstr(g_heard, "RELOADING=1\n"));
  wait_message(&d, "READY=1", NULL, 0);
  assert_true(log_has(&d, "model loaded in "));
  struct sk_client *c = connect_now(sock);
  struct sk_error e = {0};
  struct sk_hello h;
  assert_int_equal(sk_client_hello(c, &h, &e), 0);
  assert_int_equal(h.model.n_vocab, 512);
  sk_client_free(c);
  wait_message(&d, "WATCHDOG=1", NULL, 0);
  kill(d.pid, SIGTERM);
  wait_message(&d, "STOPPING=1", NULL, 0);
  assert_int_equal(wait_exit(&d), 0);

  /* Stopped while waiting: STOPPING=1, exit 0. */
  drain_messages();
  write_text(conf, "[daemon]\n");
  spawn(&d, "wait-stop.log", (const char *const[]){notify_env, NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", conf, "--socket", sock,
                              "--threads", "1", NULL});
  wait_message(&d, "READY=1\nSTATUS=no model", NULL, 0);
  kill(d.pid, SIGTERM);
  wait_message(&d, "STOPPING=1", NULL, 0);
  assert_int_equal(wait_exit(&d), 0);
  assert_true(log_has(&d, "stopped while waiting for a model"));

  /* Without a service manager: an error at once, as ever (exit 2 without
   * a model, 1 for a file that is not there). */
  spawn(&d, "wait-none.log", NULL,
        (const char *const[]){getenv("SK_SINKD"), "--config", conf, "--socket", sock,
                              "--threads", "1", NULL});
  assert_int_equal(wait_exit(&d), 2);
  snprintf(want, sizeof want, "<3>no model: set 'model' in [daemon] of %s or pass --model FILE",
           conf);
  assert_true(log_has(&d, want));
  spawn(&d, "wait-absent.log", NULL,
        (const char *const[]){getenv("SK_SINKD"), "--config", conf, "--model", absent,
                              "--socket", sock, "--threads", "1", NULL});
  assert_int_equal(wait_exit(&d), 1);
  snprintf(want, sizeof want, "<3>cannot load model %s: ", absent);
  assert_true(log_has(&d, want));
  free(absent);
  free(conf);
  free(sock);
}

/* Socket activation while waiting: the client that started sinkd waits in
 * the passed socket's queue and is answered once the model is loaded. */
static void test_wait_activated(void **state) {
  (void)state;
  char *sock = path_in_dir("wait-activated.sock");
  char *conf = path_in_dir("wait-activated.conf");
  char notify_env[160], text[1024];
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", g_notify_path);
  const char *activate = getenv("SK_SOCKET_ACTIVATE");
  if (!activate || !*activate)
    fail_msg("systemd-socket-activate not found (Debian package systemd; scripts/deps.sh --tests)");
  write_text(conf, "[daemon]\n");
  drain_messages();
  struct child d;
  spawn(&d, "wait-activated.log", NULL,
        (const char *const[]){activate, "--listen", sock, "-E", notify_env, getenv("SK_SINKD"),
                              "--config", conf, "--threads", "1", NULL});
  for (int i = 0; i < 3000 && !file_exists(sock); i++) usleep(10000);
  if (!file_exists(sock)) {
    dump_log(&d);
    fail_msg("systemd-socket-activate did not create %s", sock);
  }
  struct sk_client *c = connect_now(sock);
  wait_message(&d, "READY=1\nSTATUS=no model", NULL, 0);
  snprintf(text, sizeof text, "[daemon]\nmodel = %s\n", sk_test_model_path());
  write_text(conf, text);
  kill(d.pid, SIGHUP);
  wait_message(&d, "STATUS=loading", NULL, 0);
  struct sk_error e = {0};
  struct sk_hello h;
  assert_int_equal(sk_client_hello(c, &h, &e), 0);
  assert_int_equal(h.model.n_vocab, 512);
  wait_message(&d, "READY=1", NULL, 0);
  sk_client_free(c);
  kill(d.pid, SIGTERM);
  assert_int_equal(wait_exit(&d), 0);
  unlink(sock);
  free(conf);
  free(sock);
}

/* ---- socket files left behind ------------------------------------------------ */

/* Outside the journal (a terminal, a file, or a stream other than the
 * one JOURNAL_STREAM names) lines are plain: "sinkd: ", "error: " where
 * it applies, no "<N>" priority; --log-level chooses which appear. */
static void test_log_format(void **state) {
  (void)state;
  char sock[300];
  snprintf(sock, sizeof sock, "%s/plain.sock", g_dir);
  char notify_env[160];
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", g_notify_path);
  drain_messages();
  struct child d;
  spawn(&d, "plain.log", (const char *const[]){notify_env, "JOURNAL_STREAM=none", NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", sock, "--threads", "1",
                              "--log-level", "debug", NULL});
  wait_message(&d, "READY=1", NULL, 0);
  struct sk_client *c = connect_now(sock);
  struct sk_error e = {0};
  assert_int_equal(sk_client_ping(c, &e), 0);
  sk_client_free(c);
  kill(d.pid, SIGTERM);
  assert_int_equal(wait_exit(&d), 0);
  char *log = read_log(&d);
  assert_true(strncmp(log, "sinkd: sinkd ", 13) == 0);
  assert_non_null(strstr(log, "\nsinkd: client "));   /* debug */
  assert_null(strchr(log, '<'));
  free(log);

  /* Another stream than the one named; warnings and errors only. */
  char plain[300];
  snprintf(plain, sizeof plain, "%s/plain-file", g_dir);
  FILE *f = fopen(plain, "w");
  assert_non_null(f);
  fclose(f);
  struct child d2;
  spawn(&d2, "plain2.log", (const char *const[]){"JOURNAL_STREAM=1:2", NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", plain, "--threads", "1",
                              "--log-level", "warning", NULL});
  assert_int_equal(wait_exit(&d2), 1);
  log = read_log(&d2);
  char want[400];
  snprintf(want, sizeof want, "sinkd: error: %s exists and is not a socket; not replacing it\n",
           plain);
  assert_string_equal(log, want);
  free(log);
  unlink(plain);
}

static void test_stale_and_live_socket(void **state) {
  (void)state;
  char *sock = path_in_dir("stale.sock");
  /* A crash leaves the file with nobody listening: replaced. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  close(fd);
  assert_true(file_exists(sock));
  char notify_env[160];
  snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", g_notify_path);
  drain_messages();
  struct child d;
  spawn(&d, "stale.log", (const char *const[]){notify_env, NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", sock, "--threads", "1", NULL});
  wait_message(&d, "READY=1", NULL, 0);
  char want[300];
  snprintf(want, sizeof want, "<5>removed stale socket %s", sock);
  assert_true(log_has(&d, want));

  /* A live one is not stolen: a second daemon refuses it and exits 1,
   * before it loads the model (as for a file that is not a socket). */
  struct child d2;
  spawn(&d2, "live.log", NULL,
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", sock, "--threads", "1", NULL});
  assert_int_equal(wait_exit(&d2), 1);
  snprintf(want, sizeof want, "<3>%s is in use by a running daemon", sock);
  assert_true(log_has(&d2, want));
  assert_true(log_has(&d2, "starting (configuration: "));
  assert_false(log_has(&d2, "model loaded"));
  struct sk_client *c = connect_now(sock);
  struct sk_error e = {0};
  assert_int_equal(sk_client_ping(c, &e), 0);
  sk_client_free(c);

  /* Another socket but the first daemon's state directory: refused, and
   * also before the model is loaded. */
  char *other = path_in_dir("other.sock");
  char held[600];
  snprintf(held, sizeof held, "%s.state", d.log);
  spawn(&d2, "held.log", NULL,
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", other, "--threads", "1",
                              "--state-dir", held, NULL});
  assert_int_equal(wait_exit(&d2), 1);
  char want_held[700];
  snprintf(want_held, sizeof want_held, "<3>state directory %s is in use by another sinkd", held);
  assert_true(log_has(&d2, want_held));
  assert_false(log_has(&d2, "model loaded"));
  assert_false(file_exists(other));
  free(other);

  /* Not a socket: never replaced. */
  char *plain = path_in_dir("plain-file");
  write_text(plain, "data\n");
  spawn(&d2, "plain.log", NULL,
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", plain, "--threads", "1", NULL});
  assert_int_equal(wait_exit(&d2), 1);
  snprintf(want, sizeof want, "<3>%s exists and is not a socket; not replacing it", plain);
  assert_true(log_has(&d2, want));
  assert_false(log_has(&d2, "model loaded"));

  /* In a folder whose parent does not exist either (sinkd makes one
   * level): said so (libuv calls it EACCES). */
  char *nodir = path_in_dir("no-such-folder/sub/s.sock");
  spawn(&d2, "nodir.log", NULL,
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", nodir, "--threads", "1", NULL});
  assert_int_equal(wait_exit(&d2), 1);
  char want_dir[1200];
  snprintf(want_dir, sizeof want_dir, "<3>cannot listen on %s: directory %.*s does not exist",
           nodir, (int)(strlen(nodir) - strlen("/s.sock")), nodir);
  assert_true(log_has(&d2, want_dir));
  free(nodir);

  /* A socket in folders that the state directory's creation makes
   * (several levels: more than sinkd makes for a socket alone). */
  char *deep_state = path_in_dir("deep/er/state");
  char *deep_sock = path_in_dir("deep/er/s.sock");
  drain_messages();
  spawn(&d2, "deep.log", (const char *const[]){notify_env, NULL},
        (const char *const[]){getenv("SK_SINKD"), "--config", "/dev/null", "--model",
                              sk_test_model_path(), "--socket", deep_sock, "--state-dir",
                              deep_state, "--threads", "1", NULL});
  wait_message(&d2, "READY=1", NULL, 0);
  struct sk_client *dc = connect_now(deep_sock);
  assert_int_equal(sk_client_ping(dc, &e), 0);
  sk_client_free(dc);
  kill(d2.pid, SIGTERM);
  assert_int_equal(wait_exit(&d2), 0);
  free(deep_sock);
  free(deep_state);

  kill(d.pid, SIGTERM);
  assert_int_equal(wait_exit(&d), 0);
  free(plain);
  free(sock);
}

/* ---- --check-config ----------------------------------------------------------- */

/* Runs sinkd with args; stdout to out, stderr to err. Returns the status. */
static int run_sinkd(char *out, size_t out_size, char *err, size_t err_size,
                     const char *const *args) {
  const char *argv[32] = {getenv("SK_SINKD")};
  size_t n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  char *o_path = path_in_dir("out"), *e_path = path_in_dir("err");
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(o_path, "w", stdout) || !freopen(e_path, "w", stderr)) _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  if (g_n_children < sizeof g_children / sizeof g_children[0]) g_children[g_n_children++] = pid;
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  forget_child(pid);
  size_t len;
  char *o = sk_test_read_file(o_path, &len);
  char *e = sk_test_read_file(e_path, &len);
  assert_non_null(o);
  assert_non_null(e);
  snprintf(out, out_size, "%s", o);
  snprintf(err, err_size, "%s", e);
  free(o);
  free(e);
  free(o_path);
  free(e_path);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

static void test_check_config(void **state) {
  (void)state;
  char out[8192], err[4096], want[1024];
  char *conf = path_in_dir("check.conf");
  char text[1024];
  snprintf(text, sizeof text,
           "[daemon]\nmodel = %s\nsocket = /tmp/x.sock\n[session]\nsinks = 2\n"
           "[limits]\nmax_sessions = 5\n",
           sk_test_model_path());
  write_text(conf, text);
  /* Valid: exit 0, every key printed with where it came from; the command
   * line wins over the file. */
  assert_int_equal(run_sinkd(out, sizeof out, err, sizeof err,
                             (const char *const[]){"--config", conf, "--check-config",
                                                   "--max-sessions", "9", NULL}),
                   0);
  assert_string_equal(err, "");
  snprintf(want, sizeof want, "model = %s ; %s:2\n", sk_test_model_path(), conf);
  assert_non_null(strstr(out, want));
  assert_non_null(strstr(out, "\nsinks = 2 ; "));
  assert_non_null(strstr(out, "\nwindow = 1022 ; default (auto)\n"));
  assert_non_null(strstr(out, "\ncapacity = 2048 ; default (auto)\n"));
  assert_non_null(strstr(out, "\nmax_sessions = 9 ; command line --max-sessions\n"));
  assert_non_null(strstr(out, "\nmax_capacity = 8192 ; default (auto)\n"));

  /* The printed configuration is itself valid and means the same. */
  char *printed = path_in_dir("printed.conf");
  write_text(printed, out);
  char out2[8192];
  assert_int_equal(run_sinkd(out2, sizeof out2, err, sizeof err,
                             (const char *const[]){"--config", printed, "--check-config", NULL}),
                   0);
  assert_non_null(strstr(out2, "\nmax_sessions = 9 ; "));
  assert_non_null(strstr(out2, "\nsinks = 2 ; "));

  /* Bad values and unknown keys: exit 2, each named by file, line, key. */
  write_text(conf, "[daemon]\nmodel = /m.gguf\n[limits]\nmax_sessions = lots\nmax_sesions = 3\n");
  assert_int_equal(run_sinkd(out, sizeof out, err, sizeof err,
                             (const char *const[]){"--config", conf, "--check-config", NULL}),
                   2);
  snprintf(want, sizeof want,
           "sinkd: %s:4: [limits] max_sessions: 'lots' is not a number in [1, 65536]\n"
           "sinkd: %s:5: [limits] max_sesions: unknown key (did you mean max_sessions?)\n",
           conf, conf);
  assert_string_equal(err, want);
  assert_string_equal(out, "");

  /* A model that does not load: exit 1, naming the key's line. */
  write_text(conf, "[daemon]\nmodel = /nonexistent.gguf\n");
  assert_int_equal(run_sinkd(out, sizeof out, err, sizeof err,
                             (const char *const[]){"--config", conf, "--check-config", NULL}),
                   1);
  snprintf(want, sizeof want, "sinkd: %s:2: [daemon] model: cannot load model /nonexistent.gguf: ",
           conf);
  assert_memory_equal(err, want, strlen(want));

  /* No model at all; a named file that does not exist; a bad option value. */
  write_text(conf, "[limits]\nmax_sessions = 3\n");
  assert_int_equal(run_sinkd(out, sizeof out, err, sizeof err,
                             (const char *const[]){"--config", conf, "--check-config", NULL}),
                   2);
  snprintf(want, sizeof want,
           "sinkd: no model: set 'model' in [daemon] of %s or pass --model FILE\n", conf);
  assert_string_equal(err, want);
  assert_int_equal(run_sinkd(out, sizeof out, err, sizeof err,
                             (const char *const[]){"--config", "/nonexistent/sinkd.conf",
                                                   "--check-config", NULL}),
                   2);
  assert_string_equal(err, "sinkd: /nonexistent/sinkd.conf: cannot read the configuration: No "
                           "such file or directory\n");
  assert_int_equal(run_sinkd(out, sizeof out, err, sizeof err,
                             (const char *const[]){"--max-frame", "32", NULL}),
                   2);
  assert_string_equal(err, "sinkd: --max-frame: '32' is not a size (bytes, or with K, M, G, T) "
                           "in [64, 16M]\n");
  free(printed);
  free(conf);
}

int main(void) {
  if (!getenv("SK_SINKD")) {
    fprintf(stderr, "SK_SINKD is not set\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_notify_lifecycle),
      cmocka_unit_test(test_memory_and_session_limits),
      cmocka_unit_test(test_socket_activation),
      cmocka_unit_test(test_stale_and_live_socket),
      cmocka_unit_test(test_log_format),
      cmocka_unit_test(test_check_config),
      cmocka_unit_test(test_wait_for_model),
      cmocka_unit_test(test_wait_activated),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
