/* sinkctl against a fake daemon (testfake.h): its output and exit codes
 * for every command, on a pipe and on a terminal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/msg.h"
#include "testmsg.h"
#include "proto/wire.h"
#include "sinkd/client.h"
#include "sinkd/protocol.h"
#include "testutil.h"
#include "testfake.h"

/* Runs $SK_SINKCTL with args (NULL-ended) and stdin from `input`; its
 * stdout and stderr land in out/err (NUL-terminated, *out_len bytes of
 * stdout). Returns the exit status. */
static int run_sinkctl(const char *const *args, const char *input, char *out,
                       size_t out_size, size_t *out_len, char *err,
                       size_t err_size) {
  const char *exe = getenv("SK_SINKCTL");
  char *dir = sk_test_tmpdir();
  char o_path[512], e_path[512], i_path[512];
  snprintf(o_path, sizeof o_path, "%s/out", dir);
  snprintf(e_path, sizeof e_path, "%s/err", dir);
  snprintf(i_path, sizeof i_path, "%s/in", dir);
  FILE *in = fopen(i_path, "w");
  assert_non_null(in);
  fputs(input ? input : "", in);
  fclose(in);
  const char *argv[32] = {"sinkctl"};
  size_t n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(i_path, "r", stdin) || !freopen(o_path, "w", stdout) ||
        !freopen(e_path, "w", stderr))
      _exit(127);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  size_t len = 0;
  char *o = sk_test_read_file(o_path, &len);
  assert_non_null(o);
  assert_true(len < out_size);
  memcpy(out, o, len + 1);
  *out_len = len;
  free(o);
  char *e = sk_test_read_file(e_path, &len);
  assert_non_null(e);
  snprintf(err, err_size, "%s", e);
  free(e);
  unlink(o_path);
  unlink(e_path);
  unlink(i_path);
  rmdir(dir);
  free(dir);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* Runs sinkctl with its stdout and stderr on a pseudo-terminal (a user's
 * terminal); what it wrote in *out (the terminal's bytes: "\n" comes as
 * "\r\n"). Returns the exit status. */
static int run_sinkctl_tty(const char *const *args, char *out, size_t out_size, size_t *out_len) {
  const char *exe = getenv("SK_SINKCTL");
  const char *argv[32] = {"sinkctl"};
  size_t n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  fflush(NULL);
  int master = -1;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  assert_true(pid >= 0);
  if (pid == 0) {
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  size_t len = 0;
  for (;;) {
    struct pollfd p = {.fd = master, .events = POLLIN};
    if (poll(&p, 1, 10000) <= 0) break;
    ssize_t r = read(master, out + len, out_size - 1 - len);
    if (r <= 0) break; /* EIO once the child's side is closed */
    len += (size_t)r;
  }
  out[len] = 0;
  *out_len = len;
  close(master);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* Runs sinkctl with the arguments given into the caller's out, err and len. */
#define RUN(input, ...)                                                    \
  run_sinkctl((const char *const[]){__VA_ARGS__, NULL}, input, out,        \
              sizeof out, &len, err, sizeof err)

/* The daemon's errors and each command's output, on a pipe and as --json. */
static void sinkctl_replies(const char *P) {
  char out[4096], err[4096];
  size_t len;

  /* The daemon's error: exit 1, CODE: MESSAGE. */
  assert_int_equal(RUN(NULL, "--socket", P, "close", "99"), 1);
  assert_string_equal(err, "sinkctl: no_such_session: no session 99 (sessions end when closed "
                           "or after the idle TTL; a restart keeps them unless sinkd set them "
                           "aside at start, e.g. for another model: see its log and invalid/ "
                           "in its state directory; `sinkctl list` shows yours)\n");
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "--session", "99",
                       "hi"),
                   1);
  assert_string_equal(out, ""); /* the error alone: no echoed prompt */
  assert_true(strncmp(err, "sinkctl: no_such_session: no session 99 ", 40) == 0);

  assert_int_equal(RUN(NULL, "--socket", P, "tokenize", "hi"), 0);
  assert_string_equal(out, "1 365 2147483647\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "tokenize", "hi",
                       "--no-bos"),
                   0);
  assert_string_equal(out, "{\"tokens\": [1, 365, 2147483647]}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "detokenize", "1", "2"), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(out, "he\0llo", 6);
  assert_int_equal(RUN(NULL, "--socket", P, "-j", "detokenize", "1"), 0);
  assert_string_equal(out, "{\"text\": \"he\\u0000llo\"}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "open", "--policy", "dense",
                       "--capacity", "64"),
                   0);
  assert_string_equal(out, "7\n");
  assert_int_equal(RUN(NULL, "--socket", P, "list"), 0);
  assert_string_equal(out,
                      "SESSION    OWNER  POLICY         CAPACITY   RESIDENT           SEEN   "
                      "MEMORY AGE      IDLE     ADOPTED KV\n"
                      "7          1000   streaming           260        100     5000000000     "
                      "5.0M 1d1h     1h1m     yes     f32 (temporary)\n"
                      "8          0      dense               260        101     5000000000     "
                      "   0 0s       0s       no      -\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "list"), 0);
  assert_string_equal(out,
                      "{\"sessions\": [{\"session\": 7, \"owner_uid\": 1000, \"policy\": "
                      "\"streaming\", \"capacity\": 260, \"resident\": 100, \"seen\": "
                      "5000000000, \"kv_bytes\": 4194304, \"object_bytes\": 5242880, \"age_s\": 90061, \"idle_s\": 3700, "
                      "\"busy\": false, \"temporary\": true, \"adopted\": true, \"kv_type\": "
                      "\"f32\"}, {\"session\": 8, \"owner_uid\": 0, \"policy\": \"dense\", "
                      "\"capacity\": 260, \"resident\": 101, \"seen\": 5000000000, "
                      "\"kv_bytes\": 0, \"object_bytes\": 0, \"age_s\": 0, \"idle_s\": 0, \"busy\": false, "
                      "\"temporary\": false, \"adopted\": false}]}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "stats", "7"), 0);
  assert_string_equal(out,
                      "session    7\n"
                      "policy     streaming\n"
                      "sinks      4\n"
                      "window     256\n"
                      "capacity   260 tokens\n"
                      "resident   260 tokens\n"
                      "seen       1000 tokens\n"
                      "evicted    740 tokens\n"
                      "kv cache   1.2 KiB (1234 bytes)\n"
                      "object     4.0 KiB (4096 bytes)\n"
                      "commit     0\n"
                      "adopted    no\n"
                      "idle       0 s\n"
                      "positions  0-259\n");
  assert_int_equal(RUN(NULL, "--socket", P, "stats"), 0);
  assert_string_equal(out,
                      "sessions          2\n"
                      "clients           1\n"
                      "uptime            1m 0s\n"
                      "tokens prefilled  123\n"
                      "tokens generated  456\n"
                      "weights           3.0 MiB mapped from the file, 512.0 KiB repacked\n"
                      "session memory    8.0 KiB, no limit\n"
                      "max sessions      0\n"
                      "your sessions     1 of 16\n"
                      "your memory       4.0 KiB, no limit of your own\n"
                      "at start          1 adopted, 0 set aside\n"
                      "idle ttl          never\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "stats"), 0);
  assert_string_equal(out,
                      "{\"sessions\": 2, \"clients\": 1, \"uptime_s\": 60, "
                      "\"tokens_prefilled\": 123, \"tokens_generated\": "
                      "456, \"max_sessions\": 0, \"memory_bytes\": 8192, "
                      "\"max_memory\": 0, \"adopted\": 1, \"set_aside\": 0, "
                      "\"idle_ttl_s\": 0, \"user_sessions\": 1, \"user_memory_bytes\": 4096, "
                      "\"max_user_sessions\": 16, \"max_user_memory\": 0, "
                      "\"weights_mapped_bytes\": 3145728, \"weights_repacked_bytes\": 524288}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "ping"), 0);
  assert_memory_equal(out, "pong (", 6);
  assert_int_equal(RUN(NULL, "--socket", P, "hello"), 0);
  assert_non_null(strstr(out, "protocol: 1\nserver: sinkd\n"));
  assert_non_null(strstr(out, "model.weight_type: q8_0\nmodel.weight_bytes: 5000000000\n"
                              "compute.kernel: avx2\ncompute.threads: 2\n"
                              "compute.max_batch: 64\n"));
  assert_non_null(strstr(out, "speculation.mode: draft\nspeculation.draft_tokens: 8\n"
                              "speculation.draft_fixed: false\n"
                              "speculation.draft_model: pycode-5M\n"
                              "speculation.lookup_history: 16384\nspeculation.drafted: 40\n"
                              "speculation.accepted: 30\nspeculation.rejected: 10\n"
                              "speculation.acceptance: 0.7500\n"));
}

/* Exit statuses 2 (usage) and 3 (cannot connect). */
static void sinkctl_usage_and_connect(const char *P) {
  char out[4096], err[4096];
  size_t len;
  /* Usage errors (2) are found before connecting. */
  assert_int_equal(RUN(NULL, "--socket", "/nonexistent", "generate",
                       "--top-p", "1.5", "x"),
                   2);
  assert_memory_equal(err, "sinkctl: --top-p: '1.5' is not in (0, 1]\n", 41);
  assert_int_equal(RUN(NULL, "--socket", P, "close", "-3"), 2);
  assert_int_equal(RUN(NULL, "--socket", P, "list", "--stop", "x"), 2);
  assert_int_equal(RUN(NULL, "--socket", P, "--max-tokens=0", "generate", "x"),
                   2);
  assert_int_equal(RUN(NULL, "--socket", P, "detokenize", "2147483648"), 2);
  assert_int_equal(RUN(NULL, "--socket", P), 2);
  /* Cannot connect (3). */
  assert_int_equal(RUN(NULL, "--socket", "/nonexistent/s.sock", "ping"), 3);
  assert_non_null(strstr(err, "is sinkd running?"));
}

static void test_sinkctl(void **state) {
  (void)state;
  const char *exe = getenv("SK_SINKCTL");
  if (!exe || access(exe, X_OK) != 0) {
    print_message("SK_SINKCTL not set or not executable: skipped\n");
    skip();
  }
  struct fake *f = fake_start(FAKE_NORMAL);
  char out[4096], err[4096];
  size_t len;
  const char *P = f->path;

  /* A temporary session: open, generate (prompt echoed), close. */
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "--max-tokens", "3",
                       "Once", "upon"),
                   0);
  assert_string_equal(out, "Once upona\xc3\xbc\n");
  assert_string_equal(err, "");
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "-n", "3", "--no-echo",
                       "--seed", "42", "--stop", "x", "--stop", "y", "-v", "Once"),
                   0);
  assert_string_equal(out, "a\xc3\xbc\n");
  assert_non_null(strstr(err, ": stop string; 4 prompt + 3 generated tokens"));
  /* Prompt from stdin; options after the command; --verbose summary. */
  assert_int_equal(RUN("Once\n", "generate", "-", "--socket", P, "-n", "3",
                       "--verbose"),
                   0);
  assert_string_equal(out, "Oncea\xc3\xbc\n"); /* stdin's final newline dropped */
  assert_non_null(strstr(err, "stop length; 4 prompt + 3 generated tokens"));
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "generate", "-n", "3",
                       "--session", "7"),
                   0);
  assert_string_equal(out,
                      "{\"session\": 7, \"text\": \"a\xc3\xbc\", \"tokens\": "
                      "[10, 11, 12], \"stop\": \"length\", \"n_tokens\": 3, "
                      "\"usage\": {\"prompt_tokens\": 4, "
                      "\"completion_tokens\": 3}, \"evicted\": 3, "
                      "\"resident\": 20, \"seen\": 23}\n");

  /* On a terminal, detokenize ends with a newline (in a pipe, the
   * text's bytes alone, as above). */
  {
    char tty[256];
    size_t tty_len = 0;
    assert_int_equal(run_sinkctl_tty((const char *const[]){"--socket", P, "detokenize", "1", NULL},
                                     tty, sizeof tty, &tty_len),
                     0);
    assert_int_equal(tty_len, 11);
    assert_memory_equal(tty, "he\\x00llo\r\n", 11);
  }
  /* The model's text on a terminal: its control characters are shown,
   * not obeyed; with --raw, and into a pipe, the bytes as they came. */
  {
    char tty[512];
    size_t tty_len = 0;
    assert_int_equal(run_sinkctl_tty((const char *const[]){"--socket", P, "generate", "-n", "4",
                                                           "--no-echo", "x", NULL},
                                     tty, sizeof tty, &tty_len),
                     0);
    const char want[] = "\\x1b]0;owned\\x07\\x1b[2Jok\\x0d\r\n\xc3\xbc\\u009b31m\r\n";
    assert_int_equal(tty_len, sizeof want - 1);
    assert_memory_equal(tty, want, sizeof want - 1);
    assert_int_equal(run_sinkctl_tty((const char *const[]){"--socket", P, "--raw", "generate",
                                                           "-n", "4", "--no-echo", "x", NULL},
                                     tty, sizeof tty, &tty_len),
                     0);
    const char want_raw[] = "\x1b]0;owned\x07\x1b[2Jok\r\r\n\xc3\xbc\xc2\x9b" "31m\r\n";
    assert_int_equal(tty_len, sizeof want_raw - 1);
    assert_memory_equal(tty, want_raw, sizeof want_raw - 1);
  }
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "-n", "4", "--no-echo", "x"), 0);
  assert_string_equal(out, "\x1b]0;owned\x07\x1b[2Jok\r\n\xc3\xbc\xc2\x9b" "31m\n");
  /* resume: columns, as stats prints them. */
  assert_int_equal(RUN(NULL, "--socket", P, "resume", "7"), 0);
  assert_string_equal(out,
                      "session    7\n"
                      "policy     streaming\n"
                      "capacity   260\n"
                      "kv_bytes   57344\n"
                      "object_bytes 73728\n"
                      "resident   260\n"
                      "seen       1000\n"
                      "evicted    740\n"
                      "commit     77\n"
                      "adopted    yes\n");
  /* chat --json: /stats is a JSON object too. */
  assert_int_equal(RUN("/stats\n", "--socket", P, "--json", "chat"), 0);
  assert_memory_equal(out, "{\"session\": ", 12);
  assert_non_null(strstr(out, "\"policy\": \"streaming\""));
  assert_null(strstr(out, "policy     "));
  /* --json: errors are a JSON object on stdout, with the same status. */
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "close", "99"), 1);
  assert_string_equal(err, "");
  assert_string_equal(out, "{\"error\": {\"code\": \"no_such_session\", \"message\": \"no "
                           "session 99\", \"hint\": \"sessions end when closed or after the idle "
                           "TTL; a restart keeps them unless sinkd set them aside at start, e.g. "
                           "for another model: see its log and invalid/ in its state directory; "
                           "`sinkctl list` shows yours\", \"status\": 1}}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "close", "abc"), 2);
  assert_string_equal(err, "");
  assert_string_equal(out, "{\"error\": {\"code\": \"usage\", \"message\": \"close: 'abc' is "
                           "not a number\", \"status\": 2}}\n");
  assert_int_equal(RUN(NULL, "--json", "--socket", "/nonexistent/s.sock", "ping"), 3);
  assert_string_equal(err, "");
  {
    const char *want = "{\"error\": {\"code\": \"connect\", \"message\": ";
    assert_memory_equal(out, want, strlen(want));
    assert_non_null(strstr(out, "\"status\": 3}}\n"));
  }

  sinkctl_replies(P);

  sinkctl_usage_and_connect(P);
  /* Connection lost (4). */
  f->mode = FAKE_HANGUP;
  assert_int_equal(RUN(NULL, "--socket", P, "ping"), 4);
  assert_string_equal(err,
                      "sinkctl: disconnected: the daemon closed the "
                      "connection\n");
#undef RUN
  fake_join(f);
  /* The temporary session of the first generate was opened and closed. */
  struct sk_msg m;
  fake_request(f, 0, &m);
  assert_op(&m, "open", 1);
  sk_msg_free(&m);
  fake_request(f, 1, &m);
  assert_op(&m, "generate", 2);
  sk_msg_free(&m);
  fake_request(f, 2, &m);
  assert_op(&m, "close", 3);
  sk_msg_free(&m);
  fake_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sinkctl),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
