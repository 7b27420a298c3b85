/* sinkctl as a person uses it, against the real daemon: chat keeps the
 * conversation in one session (same text as the same turns through
 * libsinkd), Ctrl-C stops a reply and not the program, the chunked prefill
 * behind the progress bar gives the same text as one request, and the
 * bash completion offers commands, options and values. */
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
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "sinkd/client.h"
#include "testutil.h"

static char *g_dir;
static char g_socket[108];
static char g_log[512];
static pid_t g_daemon;

static int start_daemon(void **state) {
  (void)state;
  g_dir = sk_test_tmpdir();
  snprintf(g_socket, sizeof g_socket, "%s/s.sock", g_dir);
  snprintf(g_log, sizeof g_log, "%s/sinkd.log", g_dir);
  fflush(NULL);
  g_daemon = fork();
  if (g_daemon == 0) {
    sk_test_child_setup();
    if (!freopen(g_log, "w", stderr)) _exit(126);
    char state_dir[300];
    snprintf(state_dir, sizeof state_dir, "%s/state", g_dir);
    execl(getenv("SK_SINKD"), "sinkd", "--config", "/dev/null", "--model", sk_test_model_path(),
          "--socket", g_socket, "--state-dir", state_dir, "--threads", "1", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 1000; i++) {
    struct sk_client *c = NULL;
    if (sk_client_connect(g_socket, &c, NULL) == 0) {
      sk_client_free(c);
      return 0;
    }
    usleep(20000);
  }
  return -1;
}

static int stop_daemon(void **state) {
  (void)state;
  if (g_daemon > 0) {
    kill(g_daemon, SIGTERM);
    waitpid(g_daemon, NULL, 0);
  }
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  int rc = system(cmd);
  free(g_dir);
  return rc == 0 ? 0 : -1;
}

/* Runs sinkctl with stdin from `input`; stdout and stderr into malloc'd
 * strings. Returns the exit status (128+N for a signal). */
static int run(const char *input, char **out, char **err, const char *const *args) {
  char in_path[600], out_path[600], err_path[600];
  snprintf(in_path, sizeof in_path, "%s/in", g_dir);
  snprintf(out_path, sizeof out_path, "%s/out", g_dir);
  snprintf(err_path, sizeof err_path, "%s/err", g_dir);
  FILE *f = fopen(in_path, "w");
  assert_non_null(f);
  fputs(input ? input : "", f);
  fclose(f);
  const char *argv[40] = {getenv("SK_SINKCTL"), "--socket", g_socket};
  size_t n = 3;
  for (size_t i = 0; args[i]; i++) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(in_path, "r", stdin) || !freopen(out_path, "w", stdout) ||
        !freopen(err_path, "w", stderr))
      _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  size_t len;
  *out = sk_test_read_file(out_path, &len);
  *err = sk_test_read_file(err_path, &len);
  assert_non_null(*out);
  assert_non_null(*err);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Occurrences of needle in hay. */
static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *s = strstr(hay, needle); s; s = strstr(s + 1, needle)) n++;
  return n;
}

/* ---- chat ------------------------------------------------------------------ */

struct text {
  char buf[8192];
  size_t len;
};

static int collect(void *user, const struct sk_token_event *ev) {
  struct text *t = user;
  assert_true(t->len + ev->text_len < sizeof t->buf);
  memcpy(t->buf + t->len, ev->text, ev->text_len);
  t->len += ev->text_len;
  t->buf[t->len] = 0;
  return 0;
}

/* One chat turn through libsinkd: the line and a newline as the prompt,
 * greedy, n tokens. */
static void library_turn(struct sk_client *c, uint64_t session, const char *line, uint32_t n,
                         struct text *t) {
  char prompt[256];
  snprintf(prompt, sizeof prompt, "%s\n", line);
  struct sk_generate_params p;
  sk_generate_params_init(&p);
  p.temperature = 0;
  p.max_tokens = n;
  p.prompt = prompt;
  struct sk_generate_result r;
  struct sk_error e = {0};
  t->len = 0;
  t->buf[0] = 0;
  assert_int_equal(sk_client_generate(c, session, &p, collect, t, &r, &e), 0);
}

/* `list` tells what each session is (owner, memory, age, idle time), and
 * `close --idle` / `--all` clear what was left behind. */
static void test_list_and_close_idle(void **state) {
  (void)state;
  char *out, *err;
  uint64_t ids[2];
  for (int i = 0; i < 2; i++) {
    assert_int_equal(run(NULL, &out, &err, (const char *const[]){"open", NULL}), 0);
    ids[i] = strtoull(out, NULL, 10);
    assert_true(ids[i] > 0);
    free(out);
    free(err);
  }
  /* Their sizes (stats counts as use: before the idle time starts). */
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(g_socket, &c, &e), 0);
  uint64_t kv_bytes[2];
  for (int i = 0; i < 2; i++) {
    struct sk_session_stats st;
    assert_int_equal(sk_client_session_stats(c, ids[i], &st, &e), 0);
    kv_bytes[i] = st.kv_bytes;
  }
  sk_client_free(c);
  sleep(2);
  /* The second is used again; the first stays idle. */
  char id1[32];
  snprintf(id1, sizeof id1, "%llu", (unsigned long long)ids[1]);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"resume", id1, NULL}), 0);
  free(out);
  free(err);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"--json", "list", NULL}), 0);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  if (!j) fail_msg("list --json: %s", out);
  json_t *rows = json_object_get(j, "sessions");
  assert_int_equal(json_array_size(rows), 2);
  for (size_t i = 0; i < 2; i++) {
    json_t *r = json_array_get(rows, i);
    assert_int_equal(json_integer_value(json_object_get(r, "session")), ids[i]);
    assert_int_equal(json_integer_value(json_object_get(r, "owner_uid")), getuid());
    assert_int_equal(json_integer_value(json_object_get(r, "kv_bytes")), kv_bytes[i]);
    json_int_t age = json_integer_value(json_object_get(r, "age_s"));
    json_int_t idle = json_integer_value(json_object_get(r, "idle_s"));
    assert_true(age >= 2 && age < 60);
    if (i == 0) assert_true(idle >= 2 && idle < 60);
    else assert_true(idle <= 1);
    assert_true(json_is_false(json_object_get(r, "busy")));
    assert_true(json_is_false(json_object_get(r, "temporary")));
  }
  json_decref(j);
  free(out);
  free(err);
  /* Text: the owner and the memory in their columns. */
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"list", NULL}), 0);
  char owner[64];
  snprintf(owner, sizeof owner, "\n%-10llu %-6u streaming", (unsigned long long)ids[0],
           (unsigned)getuid());
  assert_non_null(strstr(out, owner));
  free(out);
  free(err);

  /* Idle for 2 s: only the first goes. */
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"close", "--idle", "2s", NULL}), 0);
  char want[64];
  snprintf(want, sizeof want, "%llu\n", (unsigned long long)ids[0]);
  assert_string_equal(out, want);
  free(out);
  free(err);
  /* save names what is missing. */
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"save", id1, NULL}), 2);
  assert_non_null(strstr(err, "sinkctl: save: missing FILE after the session ID\n"));
  free(out);
  free(err);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"save", NULL}), 2);
  assert_non_null(strstr(err, "sinkctl: save: missing session ID and FILE\n"));
  free(out);
  free(err);
  /* A bad duration, and two ways at once, are usage errors. */
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"close", "--idle", "2w", NULL}), 2);
  assert_non_null(strstr(err, "--idle: '2w' is not a duration"));
  free(out);
  free(err);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"close", "--all", id1, NULL}), 2);
  free(out);
  free(err);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"--json", "close", "--all", NULL}),
                   0);
  snprintf(want, sizeof want, "{\"closed\": [%llu]}\n", (unsigned long long)ids[1]);
  assert_string_equal(out, want);
  free(out);
  free(err);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"--json", "list", NULL}), 0);
  assert_string_equal(out, "{\"sessions\": []}\n");
  free(out);
  free(err);
}

static void test_chat_keeps_history(void **state) {
  (void)state;
  char *out, *err;
  /* Two turns, a command between them; the session is kept to look at. */
  assert_int_equal(run("Once upon a time\n/stats\n\nThe cat\n", &out, &err,
                       (const char *const[]){"chat", "-t", "0", "-n", "12", "--keep", NULL}),
                   0);
  unsigned long long kept = 0;
  const char *k = strstr(err, "session ");
  assert_non_null(k);
  assert_int_equal(sscanf(k, "session %llu kept; continue with: ", &kept), 1);

  /* The same turns through the library, in one session. */
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(g_socket, &c, &e), 0);
  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, NULL, &o, &e), 0);
  struct text t1, t2, alone;
  library_turn(c, o.session, "Once upon a time", 12, &t1);
  library_turn(c, o.session, "The cat", 12, &t2);
  struct sk_session_stats lib, chat;
  assert_int_equal(sk_client_session_stats(c, o.session, &lib, &e), 0);
  assert_int_equal(sk_client_session_stats(c, kept, &chat, &e), 0);
  /* The second turn depends on the first: alone it says something else. */
  struct sk_open_result o2;
  assert_int_equal(sk_client_open(c, NULL, &o2, &e), 0);
  library_turn(c, o2.session, "The cat", 12, &alone);
  assert_string_not_equal(t2.buf, alone.buf);

  /* stdout: reply 1, the /stats table, reply 2 (each ending a line). */
  char want[16384];
  size_t w = (size_t)snprintf(want, sizeof want, "%s%s", t1.buf,
                              t1.len && t1.buf[t1.len - 1] == '\n' ? "" : "\n");
  const char *stats = strstr(out, "session    ");
  assert_non_null(stats);
  assert_memory_equal(out, want, w);
  const char *after_stats = strstr(stats, "\npositions  ");
  assert_non_null(after_stats);
  after_stats = strchr(after_stats + 1, '\n') + 1;
  snprintf(want, sizeof want, "%s%s", t2.buf, t2.len && t2.buf[t2.len - 1] == '\n' ? "" : "\n");
  assert_string_equal(after_stats, want);
  /* Both sessions saw exactly the same tokens. */
  assert_int_equal(chat.seen, lib.seen);
  assert_int_equal(chat.resident, lib.resident);
  assert_true(chat.seen > 24);

  assert_int_equal(sk_client_close_session(c, kept, &e), 0);
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  assert_int_equal(sk_client_close_session(c, o2.session, &e), 0);
  sk_client_free(c);
  free(out);
  free(err);

  /* --json: one object per turn; without --keep the session is closed. */
  assert_int_equal(run("Once upon a time\nThe cat\n", &out, &err,
                       (const char *const[]){"--json", "chat", "-t", "0", "-n", "12", NULL}),
                   0);
  assert_non_null(strstr(out, "{\"turn\": 1, \"session\": "));
  const char *second = strstr(out, "\n{\"turn\": 2, \"session\": ");
  assert_non_null(second);
  assert_non_null(strstr(second, "\"stop\": \"length\", \"n_tokens\": 12"));
  assert_int_equal(count(out, "\n"), 2); /* one line per turn */
  free(out);
  free(err);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"list", NULL}), 0);
  assert_string_equal(out,
                      "SESSION    OWNER  POLICY         CAPACITY   RESIDENT           SEEN   "
                      "MEMORY AGE      IDLE     ADOPTED KV\n");
  free(out);
  free(err);

  /* Unknown commands and sessions. */
  assert_int_equal(run("/nope\n", &out, &err, (const char *const[]){"chat", NULL}), 0);
  /* the test model has no chat template: chat says so, and continues text */
  assert_string_equal(err, "sinkctl: no chat template: plain text continuation (sinkd "
                           "--chat-template NAME gives one)\n"
                           "sinkctl: unknown command '/nope' (/help lists them)\n");
  free(out);
  free(err);
  assert_int_equal(run("hi\n", &out, &err, (const char *const[]){"chat", "--session", "999", NULL}),
                   1);
  assert_string_equal(err, "sinkctl: no_such_session: no session 999 (sessions end when closed "
                           "or after the idle TTL; a restart keeps them unless sinkd set them "
                           "aside at start, e.g. for another model: see its log and invalid/ "
                           "in its state directory; `sinkctl list` shows yours)\n");
  free(out);
  free(err);
}

/* A running `sinkctl chat` with its three standard streams as pipes. */
struct chat_proc {
  pid_t pid;
  int in, out, err;
  uint64_t out_total; /* bytes read from stdout */
  char err_text[4096];
  size_t err_len;
};

static void chat_start(struct chat_proc *p, const char *const *args) {
  int in[2], out[2], err[2];
  assert_int_equal(pipe(in), 0);
  assert_int_equal(pipe(out), 0);
  assert_int_equal(pipe(err), 0);
  const char *argv[40] = {getenv("SK_SINKCTL"), "--socket", g_socket, "chat"};
  size_t n = 4;
  for (size_t i = 0; args[i]; i++) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(NULL);
  p->pid = fork();
  assert_true(p->pid >= 0);
  if (p->pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    for (int fd = 3; fd < 64; fd++) close(fd);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  p->in = in[1];
  p->out = out[0];
  p->err = err[0];
  p->out_total = 0;
  p->err_len = 0;
  p->err_text[0] = 0;
}

/* Reads both output pipes (so that sinkctl never blocks writing) until
 * stdout has given more than min_out bytes in total and stderr holds
 * `needle` at least `times` times. Every wait is bounded by poll(). */
static void chat_pump(struct chat_proc *p, uint64_t min_out, const char *needle, size_t times) {
  char buf[65536];
  while (p->out_total <= min_out || (needle && count(p->err_text, needle) < times)) {
    struct pollfd fds[2] = {{.fd = p->out, .events = POLLIN}, {.fd = p->err, .events = POLLIN}};
    int rc = poll(fds, 2, 60000);
    if (rc <= 0) fail_msg("sinkctl chat said nothing for 60 s; stderr: %s", p->err_text);
    if (fds[0].revents) {
      ssize_t n = read(p->out, buf, sizeof buf);
      if (n > 0) p->out_total += (uint64_t)n;
      if (n == 0) fail_msg("stdout closed early; stderr: %s", p->err_text);
    }
    if (fds[1].revents) {
      ssize_t n = read(p->err, p->err_text + p->err_len, sizeof p->err_text - 1 - p->err_len);
      if (n > 0) p->err_len += (size_t)n;
      p->err_text[p->err_len] = 0;
      if (n == 0) fail_msg("stderr closed early: %s", p->err_text);
    }
  }
}

static void test_chat_ctrl_c(void **state) {
  (void)state;
  struct chat_proc p;
  /* Replies that would run for a million tokens each. */
  chat_start(&p, (const char *const[]){"-t", "0", "--ignore-eos", "-n", "1000000", NULL});
  const char *l1 = "Once upon a time\n";
  assert_int_equal(write(p.in, l1, strlen(l1)), (ssize_t)strlen(l1));
  /* Once the reply streams, Ctrl-C stops it... */
  chat_pump(&p, 0, NULL, 0);
  assert_int_equal(kill(p.pid, SIGINT), 0);
  chat_pump(&p, 0, "sinkctl: reply stopped (", 1);
  /* ...and the program takes the next line, in the same session. */
  uint64_t before = p.out_total;
  const char *l2 = "The cat\n";
  assert_int_equal(write(p.in, l2, strlen(l2)), (ssize_t)strlen(l2));
  chat_pump(&p, before, NULL, 0);
  assert_int_equal(kill(p.pid, SIGINT), 0);
  chat_pump(&p, 0, "sinkctl: reply stopped (", 2);
  /* End of input: the chat ends normally, its session closed. */
  close(p.in);
  char buf[65536];
  while (read(p.out, buf, sizeof buf) > 0) {
  }
  while (read(p.err, buf, sizeof buf) > 0) {
  }
  close(p.out);
  close(p.err);
  int status;
  assert_int_equal(waitpid(p.pid, &status, 0), p.pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("chat ended with status 0x%x; stderr:\n%s", status, p.err_text);
  char *out, *err;
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"list", NULL}), 0);
  assert_string_equal(out,
                      "SESSION    OWNER  POLICY         CAPACITY   RESIDENT           SEEN   "
                      "MEMORY AGE      IDLE     ADOPTED KV\n");
  free(out);
  free(err);
}

/* ---- progress bar ---------------------------------------------------------------- */

static void test_progress_prefill(void **state) {
  (void)state;
  /* A prompt of about 900 tokens. */
  char prompt[8192];
  size_t w = 0;
  for (int i = 0; i < 60; i++)
    w += (size_t)snprintf(prompt + w, sizeof prompt - w,
                          "Once upon a time, there was a little girl named Lily. ");
  char *out1, *err1, *out2, *err2;
  assert_int_equal(run(prompt, &out1, &err1,
                       (const char *const[]){"generate", "--progress", "-t", "0", "-n", "16",
                                             "--no-echo", NULL}),
                   0);
  assert_int_equal(run(prompt, &out2, &err2,
                       (const char *const[]){"generate", "--no-progress", "-t", "0", "-n", "16",
                                             "--no-echo", NULL}),
                   0);
  /* The same text either way. */
  assert_string_equal(out1, out2);
  assert_string_equal(err2, "");
  /* Not a terminal: one line per chunk of 256 tokens, the last at 100%. */
  const char *start = "prefill [..............................]   0% 0/";
  assert_memory_equal(err1, start, strlen(start));
  assert_non_null(strstr(err1, "prefill [########"));
  const char *last = strstr(err1, "prefill [##############################] 100% ");
  assert_non_null(last);
  unsigned a = 0, b = 0;
  assert_int_equal(sscanf(last, "prefill [##############################] 100%% %u/%u tokens", &a,
                          &b),
                   2);
  assert_int_equal(a, b);
  assert_true(a > 512);
  free(out1);
  free(err1);
  free(out2);
  free(err2);

  /* --json counts the prefilled tokens as the prompt's, as one request does. */
  assert_int_equal(run(prompt, &out1, &err1,
                       (const char *const[]){"--json", "generate", "--progress", "-t", "0", "-n",
                                             "4", NULL}),
                   0);
  assert_int_equal(run(prompt, &out2, &err2,
                       (const char *const[]){"--json", "generate", "-t", "0", "-n", "4", NULL}),
                   0);
  const char *u1 = strstr(out1, "\"usage\"");
  const char *u2 = strstr(out2, "\"usage\"");
  assert_non_null(u1);
  assert_non_null(u2);
  assert_memory_equal(u1, u2, (size_t)(strchr(u2, '}') - u2));
  free(out1);
  free(err1);
  free(out2);
  free(err2);
}

/* --timeout: a socket that accepts connections (the backlog) but never
 * answers makes sinkctl give up with exit status 4 after the timeout,
 * not hang; a zero or malformed timeout is a usage error. */
static void test_timeout(void **state) {
  (void)state;
  char path[sizeof ((struct sockaddr_un *)0)->sun_path];
  assert_true((size_t)snprintf(path, sizeof path, "%s/m.sock", g_dir) < sizeof path);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, path, sizeof path);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 4), 0);
  char *out, *err;
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"--socket", path, "--timeout", "1s",
                                                               "ping", NULL}),
                   4);
  assert_non_null(strstr(err, "timed out waiting for the daemon (1000 ms)"));
  assert_string_equal(out, "");
  free(out);
  free(err);
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"--timeout", "0", "ping", NULL}), 2);
  assert_non_null(strstr(err, "--timeout: '0' is not in 1s.."));
  free(out);
  free(err);
  assert_int_equal(
      run(NULL, &out, &err, (const char *const[]){"--timeout", "soon", "ping", NULL}), 2);
  assert_non_null(strstr(err, "is not a duration"));
  free(out);
  free(err);
  /* against the daemon, a timeout that is not reached changes nothing */
  assert_int_equal(run(NULL, &out, &err, (const char *const[]){"--timeout", "1m", "ping", NULL}), 0);
  free(out);
  free(err);
  close(fd);
  unlink(path);
}

int main(void) {
  const char *need[] = {"SK_SINKD", "SK_SINKCTL"};
  for (size_t i = 0; i < 2; i++)
    if (!getenv(need[i])) {
      fprintf(stderr, "%s is not set\n", need[i]);
      return 1;
    }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chat_keeps_history),
      cmocka_unit_test(test_chat_ctrl_c),
      cmocka_unit_test(test_progress_prefill),
      cmocka_unit_test(test_list_and_close_idle),
      cmocka_unit_test(test_timeout),
  };
  return cmocka_run_group_tests(tests, start_daemon, stop_daemon);
}
