/* Isolation between users, for real: the test (root) creates system users
 * and a group, starts sinkd, gives the group access to the socket (as
 * systemd's SocketGroup= does), and runs clients as those users: forked
 * children that drop to the user's uid/gid with setresuid, and sinkctl
 * run through setpriv. The daemon sees their uids via SO_PEERCRED.
 *
 *   sinkd-test-a, sinkd-test-b   in group sinkd-test: may connect
 *   sinkd-test-c                 not in the group: the socket refuses it
 *
 * Checked: another uid gets `no_such_session` for every op naming a
 * session it does not own (stats, append, generate, cancel, resume,
 * fork, export, close), as for an id that does not exist, and its
 * attempts change nothing; it does not see the
 * session in `list`; root sees and may use every session; per-uid limits
 * on sessions and KV memory; one uid holding every connection it can
 * leaves others and root answered, and its silent connections end at
 * the frame deadline.
 *
 * Needs root (to create users and switch to them); skipped otherwise.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"

#define GROUP "sinkd-test"
#define MAX_USER_SESSIONS 4
#define MAX_USER_MEMORY (1u << 20)

struct user {
  const char *name;
  bool in_group;
  uid_t uid;
  gid_t gid;
};

static struct user g_a = {"sinkd-test-a", true, 0, 0};
static struct user g_b = {"sinkd-test-b", true, 0, 0};
static struct user g_c = {"sinkd-test-c", false, 0, 0};
static gid_t g_group;
static struct sk_test_daemon g_d;
static char g_bin[1024]; /* sinkctl and libsinkd copied where every user may run them */

/* ---- users -------------------------------------------------------------- */

static int run(const char *cmd) {
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void ensure_group(void) {
  struct group *gr = getgrnam(GROUP);
  if (!gr) {
    if (run("groupadd --system " GROUP) != 0) fail_msg("groupadd " GROUP " failed");
    gr = getgrnam(GROUP);
  }
  assert_non_null(gr);
  g_group = gr->gr_gid;
}

static void ensure_user(struct user *u) {
  struct passwd *pw = getpwnam(u->name);
  if (!pw) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "useradd --system --user-group --no-create-home --home-dir /nonexistent "
             "--shell /usr/sbin/nologin %s%s %s",
             u->in_group ? "--groups " : "", u->in_group ? GROUP : "", u->name);
    if (run(cmd) != 0) fail_msg("'%s' failed", cmd);
    pw = getpwnam(u->name);
  } else if (u->in_group) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "usermod --append --groups " GROUP " %s", u->name);
    if (run(cmd) != 0) fail_msg("'%s' failed", cmd);
  }
  assert_non_null(pw);
  u->uid = pw->pw_uid;
  u->gid = pw->pw_gid;
  assert_true(u->uid != 0);
}

/* Drops this (child) process to the user: groups, gid, then uid. */
static void become(const struct user *u) {
  gid_t groups[2] = {u->gid, g_group};
  if (setgroups(u->in_group ? 2 : 1, groups) != 0 || setresgid(u->gid, u->gid, u->gid) != 0 ||
      setresuid(u->uid, u->uid, u->uid) != 0 || geteuid() != u->uid) {
    fprintf(stderr, "cannot become %s: %s\n", u->name, strerror(errno));
    _exit(99);
  }
}

/* ---- clients as another user -------------------------------------------- */

/* Runs fn in a child process that has become u; fn writes lines to out.
 * Returns what it wrote (malloc'd); fails the test if it did not exit 0. */
static char *as_user(const struct user *u, void (*fn)(FILE *out, void *arg), void *arg) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    become(u);
    FILE *out = fdopen(p[1], "w");
    if (!out) _exit(98);
    fn(out, arg);
    fclose(out);
    _exit(0);
  }
  close(p[1]);
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  ssize_t r;
  while ((r = read(p[0], buf + len, cap - len - 1)) > 0) {
    len += (size_t)r;
    if (len + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[len] = 0;
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("client as %s failed (status %d): %s", u->name, st, buf);
  return buf;
}

static struct sk_client *child_connect(FILE *out) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(g_d.socket, &c, &e) < 0) {
    fprintf(out, "connect %s: %s\n", sk_error_name(e.code), e.message);
    return NULL;
  }
  sk_client_set_timeout(c, 60000, NULL);
  return c;
}

/* Writes "name code message" for one call's result. */
static void report(FILE *out, const char *what, int rc, const struct sk_error *e) {
  fprintf(out, "%s %s %s\n", what, rc == 0 ? "ok" : sk_error_name(rc), rc == 0 ? "" : e->message);
}

struct open_arg {
  const char *policy;
  uint32_t window, capacity;
};

static void child_open(FILE *out, void *arg) {
  const struct open_arg *a = arg;
  struct sk_client *c = child_connect(out);
  if (!c) return;
  bool streaming = !strcmp(a->policy, "streaming");
  struct sk_open_params op = {.policy = a->policy, .n_sink = streaming ? 4 : 0,
                              .window = a->window, .capacity = a->capacity};
  struct sk_open_result o;
  struct sk_error e = {0};
  int rc = sk_client_open(c, &op, &o, &e);
  if (rc == 0) fprintf(out, "open ok %llu %llu\n", (unsigned long long)o.session,
                       (unsigned long long)o.object_bytes);
  else report(out, "open", rc, &e);
  sk_client_free(c);
}

/* Every op that names a session, against `session`; and list. */
static void child_every_op(FILE *out, void *arg) {
  uint64_t s = *(const uint64_t *)arg;
  struct sk_client *c = child_connect(out);
  if (!c) return;
  struct sk_error e = {0};
  struct sk_session_stats st;
  report(out, "stats", sk_client_session_stats(c, s, &st, &e), &e);
  memset(&e, 0, sizeof e);
  report(out, "append", sk_client_append_text(c, s, "hello", 5, SK_BOS_DEFAULT, NULL, &e), &e);
  int32_t toks[2] = {1, 403};
  memset(&e, 0, sizeof e);
  report(out, "append_tokens",
         sk_client_append_tokens(c, s, toks, 2, SK_BOS_DEFAULT, NULL, &e), &e);
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = 4;
  struct sk_generate_result gr;
  memset(&e, 0, sizeof e);
  report(out, "generate", sk_client_generate(c, s, &gp, NULL, NULL, &gr, &e), &e);
  gp.prompt = "Once";
  memset(&e, 0, sizeof e);
  report(out, "generate_prompt", sk_client_generate(c, s, &gp, NULL, NULL, &gr, &e), &e);
  bool any;
  memset(&e, 0, sizeof e);
  report(out, "cancel", sk_client_cancel(c, s, &any, &e), &e);
  struct sk_session_summary sum;
  memset(&e, 0, sizeof e);
  report(out, "resume", sk_client_resume(c, s, &sum, &e), &e);
  memset(&e, 0, sizeof e);
  report(out, "fork", sk_client_fork(c, s, &sum, &e), &e);
  void *image = NULL;
  size_t image_len = 0;
  memset(&e, 0, sizeof e);
  int rc_export = sk_client_export(c, s, &image, &image_len, &e);
  report(out, "export", rc_export, &e);
  free(image);
  memset(&e, 0, sizeof e);
  report(out, "close", sk_client_close_session(c, s, &e), &e);
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  memset(&e, 0, sizeof e);
  int rc = sk_client_list(c, &rows, &n, &e);
  if (rc < 0) {
    report(out, "list", rc, &e);
  } else {
    fprintf(out, "list");
    for (size_t i = 0; i < n; i++) fprintf(out, " %llu", (unsigned long long)rows[i].session);
    fprintf(out, "\n");
  }
  free(rows);
  sk_client_free(c);
}

static void child_list(FILE *out, void *arg) {
  (void)arg;
  struct sk_client *c = child_connect(out);
  if (!c) return;
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  struct sk_error e = {0};
  int rc = sk_client_list(c, &rows, &n, &e);
  if (rc < 0) {
    report(out, "list", rc, &e);
  } else {
    fprintf(out, "list");
    for (size_t i = 0; i < n; i++) fprintf(out, " %llu", (unsigned long long)rows[i].session);
    fprintf(out, "\n");
  }
  free(rows);
  sk_client_free(c);
}

static void child_close(FILE *out, void *arg) {
  uint64_t s = *(const uint64_t *)arg;
  struct sk_client *c = child_connect(out);
  if (!c) return;
  struct sk_error e = {0};
  report(out, "close", sk_client_close_session(c, s, &e), &e);
  sk_client_free(c);
}

/* A generation of 3000 tokens; the result's stop reason and count. */
static void child_long_generate(FILE *out, void *arg) {
  uint64_t s = *(const uint64_t *)arg;
  struct sk_client *c = child_connect(out);
  if (!c) return;
  struct sk_generate_params gp;
  sk_generate_params_init(&gp);
  gp.max_tokens = 1000000; /* outlasts B's probes on a loaded machine; root cancels it */
  gp.prompt = "Once upon a time";
  gp.temperature = 0;
  gp.ignore_eos = true;
  struct sk_generate_result gr;
  struct sk_error e = {0};
  int rc = sk_client_generate(c, s, &gp, NULL, NULL, &gr, &e);
  if (rc == 0) fprintf(out, "generate ok %s %llu\n", gr.stop, (unsigned long long)gr.n_tokens);
  else report(out, "generate", rc, &e);
  sk_client_free(c);
}

static uint64_t open_as(const struct user *u, const char *policy, uint32_t window,
                        uint32_t capacity, uint64_t *ret_object_bytes) {
  struct open_arg a = {policy, window, capacity};
  char *out = as_user(u, child_open, &a);
  unsigned long long id = 0, kv = 0;
  if (sscanf(out, "open ok %llu %llu", &id, &kv) != 2) fail_msg("open as %s: %s", u->name, out);
  free(out);
  if (ret_object_bytes) *ret_object_bytes = kv;
  return id;
}

/* ---- sinkctl through setpriv ------------------------------------------- */

static char *sinkctl_as(const struct user *u, const char *args, int *ret_status) {
  char cmd[16384];
  snprintf(cmd, sizeof cmd,
           "setpriv --reuid=%u --regid=%u --init-groups env LD_LIBRARY_PATH=%s %s/sinkctl "
           "--socket %s %s 2>&1",
           (unsigned)u->uid, (unsigned)u->gid, g_bin, g_bin, g_d.socket, args);
  return sk_test_run_capture(cmd, ret_status);
}

/* Session ids in `sinkctl list --json` output. */
static bool json_list_has(const char *out, uint64_t session) {
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  if (!j) fail_msg("sinkctl list --json printed no JSON: %s", out);
  json_t *arr = json_is_array(j) ? j : json_object_get(j, "sessions");
  assert_true(json_is_array(arr));
  bool found = false;
  size_t i;
  json_t *row;
  json_array_foreach(arr, i, row) {
    if ((uint64_t)json_integer_value(json_object_get(row, "session")) == session) found = true;
  }
  json_decref(j);
  return found;
}

static void copy_file(const char *from, const char *to) {
  size_t n = 0;
  void *data = sk_test_read_file(from, &n);
  if (!data) fail_msg("cannot read %s", from);
  FILE *f = fopen(to, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
  free(data);
  assert_int_equal(chmod(to, 0755), 0);
}

/* ---- tests -------------------------------------------------------------- */

static const char *line(const char *out, const char *op) {
  static char buf[512];
  size_t n = strlen(op);
  for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (!strncmp(p, op, n) && p[n] == ' ') {
      const char *end = strchr(p, '\n');
      size_t len = end ? (size_t)(end - p) : strlen(p);
      snprintf(buf, sizeof buf, "%.*s", (int)len, p);
      return buf;
    }
  }
  fail_msg("no '%s' line in: %s", op, out);
  return NULL;
}

static void test_other_users_sessions_are_unknown(void **state) {
  (void)state;
  uint64_t sa = open_as(&g_a, "streaming", 60, 0, NULL);
  uint64_t sb = open_as(&g_b, "streaming", 60, 0, NULL);

  /* A's session, as it stands. */
  struct sk_client *root = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(g_d.socket, &root, &e), 0);
  struct sk_session_stats st0;
  assert_int_equal(sk_client_session_stats(root, sa, &st0, &e), 0);

  /* B against A's session: every op fails as on an id that does not
   * exist (the same code and message: B cannot tell which ids are
   * taken), none has an effect; B's list shows only B's session. */
  char *out = as_user(&g_b, child_every_op, &sa);
  uint64_t none = sa + 1000000;
  char *out_none = as_user(&g_b, child_every_op, &none);
  const char *ops[] = {"stats", "append", "append_tokens", "generate", "generate_prompt",
                       "cancel", "resume", "fork", "export", "close"};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    char want[128], want_none[128];
    snprintf(want, sizeof want, "%s no_such_session no session %llu", ops[i],
             (unsigned long long)sa);
    snprintf(want_none, sizeof want_none, "%s no_such_session no session %llu", ops[i],
             (unsigned long long)none);
    const char *l = line(out, ops[i]);
    if (strcmp(l, want) != 0) fail_msg("as B: '%s', want '%s'", l, want);
    l = line(out_none, ops[i]);
    if (strcmp(l, want_none) != 0) fail_msg("as B: '%s', want '%s'", l, want_none);
  }
  free(out_none);
  char want_list[64];
  snprintf(want_list, sizeof want_list, "list %llu", (unsigned long long)sb);
  assert_string_equal(line(out, "list"), want_list);
  free(out);
  struct sk_session_stats st1;
  assert_int_equal(sk_client_session_stats(root, sa, &st1, &e), 0);
  assert_int_equal(st1.seen, st0.seen);
  assert_int_equal(st1.resident, st0.resident);

  /* A sees only its own; root sees both, with their owners. */
  out = as_user(&g_a, child_list, NULL);
  snprintf(want_list, sizeof want_list, "list %llu", (unsigned long long)sa);
  assert_string_equal(line(out, "list"), want_list);
  free(out);
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  assert_int_equal(sk_client_list(root, &rows, &n, &e), 0);
  bool seen_a = false, seen_b = false;
  for (size_t i = 0; i < n; i++) {
    seen_a |= rows[i].session == sa;
    seen_b |= rows[i].session == sb;
  }
  free(rows);
  assert_true(seen_a && seen_b);

  /* B's cancel does not stop A's generation: B tries while it runs. */
  int p_gen[2];
  assert_int_equal(pipe(p_gen), 0);
  fflush(NULL);
  pid_t gen = fork();
  if (gen == 0) {
    close(p_gen[0]);
    become(&g_a);
    FILE *f = fdopen(p_gen[1], "w");
    child_long_generate(f, &sa);
    fclose(f);
    _exit(0);
  }
  close(p_gen[1]);
  struct sk_session_stats st2 = st1;
  for (int i = 0; i < 2000 && st2.seen == st1.seen; i++) { /* until it runs */
    usleep(1000);
    assert_int_equal(sk_client_session_stats(root, sa, &st2, &e), 0);
  }
  assert_true(st2.seen > st1.seen);
  int cancels_while_running = 0;
  for (int i = 0; i < 3; i++) {
    out = as_user(&g_b, child_every_op, &sa);
    snprintf(want_list, sizeof want_list, "cancel no_such_session no session %llu",
             (unsigned long long)sa);
    assert_string_equal(line(out, "cancel"), want_list);
    free(out);
    if (waitpid(gen, NULL, WNOHANG) == 0) cancels_while_running++;
  }
  assert_true(cancels_while_running >= 1);
  /* Root may cancel it (B could not): it stops short of its length. */
  bool cancelled = false;
  assert_int_equal(sk_client_cancel(root, sa, &cancelled, &e), 0);
  assert_true(cancelled);
  char gen_out[256] = {0};
  ssize_t got = read(p_gen[0], gen_out, sizeof gen_out - 1);
  close(p_gen[0]);
  waitpid(gen, NULL, 0);
  assert_true(got > 0);
  unsigned long long n_gen = 0;
  if (sscanf(gen_out, "generate ok cancelled %llu", &n_gen) != 1)
    fail_msg("A's generation: '%s', want 'generate ok cancelled N'", gen_out);
  assert_true(n_gen > 0 && n_gen < 1000000);

  /* Root may use every session: stats, append, close B's. */
  assert_int_equal(sk_client_append_text(root, sa, " The end.", 9, SK_BOS_DEFAULT, NULL, &e), 0);
  assert_int_equal(sk_client_close_session(root, sb, &e), 0);
  out = as_user(&g_b, child_close, &sb);
  char want[128];
  snprintf(want, sizeof want, "close no_such_session no session %llu", (unsigned long long)sb);
  assert_string_equal(line(out, "close"), want);
  free(out);
  /* A closes its own. */
  out = as_user(&g_a, child_close, &sa);
  assert_string_equal(line(out, "close"), "close ok ");
  free(out);
  sk_client_free(root);
}

/* The same through sinkctl, run as the users by setpriv. */
static void test_sinkctl_as_other_users(void **state) {
  (void)state;
  uint64_t sa = open_as(&g_a, "streaming", 60, 0, NULL);
  int status;
  char args[128];

  char *out = sinkctl_as(&g_b, "--json list", &status);
  assert_int_equal(status, 0);
  assert_false(json_list_has(out, sa));
  free(out);
  out = sinkctl_as(&g_a, "--json list", &status);
  assert_int_equal(status, 0);
  assert_true(json_list_has(out, sa));
  free(out);

  const char *cmds[] = {"stats %llu", "close %llu", "generate --max-tokens 2 --session %llu x"};
  for (size_t i = 0; i < 3; i++) {
    snprintf(args, sizeof args, cmds[i], (unsigned long long)sa);
    out = sinkctl_as(&g_b, args, &status);
    char want[64];
    snprintf(want, sizeof want, "sinkctl: no_such_session: no session %llu (",
             (unsigned long long)sa);
    if (status != 1 || strncmp(out, want, strlen(want)) != 0)
      fail_msg("sinkctl %s as B: exit %d: %s", args, status, out);
    free(out);
  }
  /* Not in the socket's group: cannot connect at all (exit 3). */
  out = sinkctl_as(&g_c, "ping", &status);
  if (status != 3 || !strstr(out, "permission denied"))
    fail_msg("sinkctl ping as C: exit %d: %s", status, out);
  free(out);

  snprintf(args, sizeof args, "close %llu", (unsigned long long)sa);
  out = sinkctl_as(&g_a, args, &status);
  assert_int_equal(status, 0);
  free(out);
}

/* Per-uid limits: sessions, then KV memory; other users unaffected. */
static void test_user_limits(void **state) {
  (void)state;
  uint64_t ids[MAX_USER_SESSIONS];
  uint64_t kv_small = 0;
  for (int i = 0; i < MAX_USER_SESSIONS; i++) ids[i] = open_as(&g_a, "streaming", 60, 0, &kv_small);
  struct open_arg a = {"streaming", 60, 0};
  char *out = as_user(&g_a, child_open, &a);
  char want[320];
  snprintf(want, sizeof want,
           "open busy uid %u already has %d sessions (max_user_sessions %d, 4 more for "
           "temporary sessions): `sinkctl list` shows them, `sinkctl close --idle 1h` closes "
           "those idle for an hour",
           (unsigned)g_a.uid, MAX_USER_SESSIONS, MAX_USER_SESSIONS);
  assert_string_equal(line(out, "open"), want);
  free(out);
  /* A one-off generate (a temporary session) still works at the limit. */
  int gen_status = -1;
  out = sinkctl_as(&g_a, "generate --window 60 -n 5 --no-echo Once", &gen_status);
  if (gen_status != 0) fail_msg("sinkctl generate at max_user_sessions: %d: %s", gen_status, out);
  free(out);
  /* B is not limited by A's sessions. */
  uint64_t sb = open_as(&g_b, "streaming", 60, 0, NULL);
  /* One closed: A may open again. */
  out = as_user(&g_a, child_close, &ids[0]);
  free(out);
  ids[0] = open_as(&g_a, "streaming", 60, 0, NULL);
  for (int i = 0; i < MAX_USER_SESSIONS; i++) free(as_user(&g_a, child_close, &ids[i]));

  /* Memory: dense caches of 256 tokens; as many fit as the limit allows,
   * the next is refused with the sum, and B still gets one. */
  uint64_t kv = 0;
  uint64_t first = open_as(&g_a, "dense", 0, 256, &kv);
  assert_true(kv > 0 && kv < MAX_USER_MEMORY);
  uint64_t held[MAX_USER_SESSIONS] = {first};
  int n_held = 1;
  uint64_t fit = MAX_USER_MEMORY / kv; /* how many caches of kv bytes fit */
  assert_true(fit >= 2 && fit < MAX_USER_SESSIONS);
  while ((uint64_t)n_held < fit) held[n_held++] = open_as(&g_a, "dense", 0, 256, NULL);
  a = (struct open_arg){"dense", 0, 256};
  out = as_user(&g_a, child_open, &a);
  snprintf(want, sizeof want,
           "open busy a session of %llu bytes would bring uid %u to %llu bytes "
           "(max_user_memory %u): `sinkctl list` shows them, `sinkctl close ID` closes one",
           (unsigned long long)kv, (unsigned)g_a.uid, (unsigned long long)(kv * (fit + 1)),
           MAX_USER_MEMORY);
  assert_string_equal(line(out, "open"), want);
  free(out);
  /* A cache larger than the whole budget. */
  a = (struct open_arg){"dense", 0, 2048};
  out = as_user(&g_a, child_open, &a);
  assert_non_null(strstr(line(out, "open"), "open busy a session of"));
  free(out);
  uint64_t sb2 = open_as(&g_b, "dense", 0, 256, NULL);
  for (int i = 0; i < n_held; i++) free(as_user(&g_a, child_close, &held[i]));
  free(as_user(&g_b, child_close, &sb));
  free(as_user(&g_b, child_close, &sb2));
  print_message("figures: isolation: users %s (uid %u), %s (uid %u), %s (uid %u, no access); "
                "limits %d sessions and %u KV bytes per user, KV cache of 256 tokens %llu bytes\n",
                g_a.name, (unsigned)g_a.uid, g_b.name, (unsigned)g_b.uid, g_c.name,
                (unsigned)g_c.uid, MAX_USER_SESSIONS, MAX_USER_MEMORY, (unsigned long long)kv);
}

/* ---- lock-out by connections ------------------------------------------- */

/* Gives the group access to d's socket (see setup). */
static void share_socket(const struct sk_test_daemon *d) {
  if (chown(d->dir, 0, g_group) != 0 || chmod(d->dir, 0710) != 0 ||
      chown(d->socket, 0, g_group) != 0)
    fail_msg("cannot give %s to group " GROUP ": %s", d->socket, strerror(errno));
}

static int raw_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Whether fd was closed by the peer within ms (an error frame before the
 * end is read and dropped). */
static bool peer_closed_within(int fd, int ms) {
  double end = sk_test_now() + ms / 1000.0;
  char buf[4096];
  for (;;) {
    int left = (int)((end - sk_test_now()) * 1000.0);
    if (left < 0) left = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, left) <= 0) return false;
    ssize_t r = read(fd, buf, sizeof buf);
    if (r <= 0) return true;
  }
}

/* A process of user u holding silent connections to a socket. */
struct holder {
  pid_t pid;
  int cmd;   /* write end: any byte asks the child to check its connections */
  FILE *out; /* its report lines */
};

/* Forks a child that becomes u and opens `want` connections to path,
 * sending nothing. It reports "held H refused R" once it has seen which
 * the daemon refused (those get an error and are closed at once), then
 * waits for a byte on the command pipe and reports "closed N": how many
 * of its held connections the daemon closed within 10 s. */
static void holder_start(struct holder *h, const struct user *u, const char *path, int want) {
  int out[2], cmd[2];
  assert_int_equal(pipe(out), 0);
  assert_int_equal(pipe(cmd), 0);
  fflush(NULL);
  h->pid = fork();
  assert_true(h->pid >= 0);
  if (h->pid == 0) {
    close(out[0]);
    close(cmd[1]);
    become(u);
    int *fds = calloc((size_t)want, sizeof *fds);
    bool *held = calloc((size_t)want, sizeof *held);
    for (int i = 0; i < want; i++) fds[i] = raw_connect(path);
    /* A refusal comes at once: an error frame, then the end. */
    usleep(300 * 1000);
    int n_held = 0, n_refused = 0;
    for (int i = 0; i < want; i++) {
      struct pollfd p = {.fd = fds[i], .events = POLLIN};
      if (fds[i] < 0 || poll(&p, 1, 0) == 1) {
        n_refused++;
      } else {
        held[i] = true;
        n_held++;
      }
    }
    dprintf(out[1], "held %d refused %d\n", n_held, n_refused);
    char c;
    if (read(cmd[0], &c, 1) != 1) _exit(97);
    int n_closed = 0;
    for (int i = 0; i < want; i++)
      if (held[i] && peer_closed_within(fds[i], 10000)) n_closed++;
    dprintf(out[1], "closed %d\n", n_closed);
    _exit(0);
  }
  close(out[1]);
  close(cmd[0]);
  h->cmd = cmd[1];
  h->out = fdopen(out[0], "r");
  assert_non_null(h->out);
}

static void holder_line(struct holder *h, const char *fmt, int *a, int *b) {
  char buf[256];
  if (!fgets(buf, sizeof buf, h->out)) fail_msg("holder %d said nothing", (int)h->pid);
  int n = b ? sscanf(buf, fmt, a, b) : sscanf(buf, fmt, a);
  if (n != (b ? 2 : 1)) fail_msg("holder said '%s'", buf);
}

static void holder_finish(struct holder *h) {
  close(h->cmd);
  fclose(h->out);
  int st = 0;
  waitpid(h->pid, &st, 0);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static const char *g_ping_socket;

/* Connects and pings, printing "ping ok MS" (connect to reply). */
static void child_timed_ping(FILE *out, void *arg) {
  (void)arg;
  double t0 = sk_test_now();
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  int rc = sk_client_connect(g_ping_socket, &c, &e);
  if (rc == 0) rc = sk_client_ping(c, &e);
  double ms = (sk_test_now() - t0) * 1000.0;
  if (rc == 0) fprintf(out, "ping ok %.3f\n", ms);
  else report(out, "ping", rc, &e);
  sk_client_free(c);
}

static double ping_ms(const struct user *u) {
  char *out = NULL;
  if (u) {
    out = as_user(u, child_timed_ping, NULL);
  } else {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    child_timed_ping(f, NULL);
    fclose(f);
    out = buf;
  }
  double ms = -1;
  if (sscanf(out, "ping ok %lf", &ms) != 1) fail_msg("ping as %s: %s", u ? u->name : "root", out);
  free(out);
  return ms;
}

/* Lines of the daemon's log that contain needle. */
static int log_count(const struct sk_test_daemon *d, const char *needle) {
  FILE *f = fopen(d->log, "r");
  assert_non_null(f);
  char buf[2048];
  int n = 0;
  while (fgets(buf, sizeof buf, f))
    if (strstr(buf, needle)) n++;
  fclose(f);
  return n;
}

#define LOCK_MAX_CLIENTS 32
#define LOCK_MAX_USER_CLIENTS 16
#define LOCK_FRAME_TIMEOUT_S 3

/* Uid A takes every connection it may; B and root still get their pings
 * answered at once; then B takes what is left to users other than root,
 * and root still gets in (its reserve of 8). After the frame deadline the
 * silent connections are gone. Refusals are logged once per uid, naming
 * it. */
static void test_connection_lockout(void **state) {
  (void)state;
  struct sk_test_daemon d;
  char max_clients[16], max_user[16], timeout[16];
  snprintf(max_clients, sizeof max_clients, "%d", LOCK_MAX_CLIENTS);
  snprintf(max_user, sizeof max_user, "%d", LOCK_MAX_USER_CLIENTS);
  snprintf(timeout, sizeof timeout, "%d", LOCK_FRAME_TIMEOUT_S);
  const char *extra[] = {"--max-clients", max_clients, "--max-user-clients", max_user,
                         "--frame-timeout", timeout, NULL};
  sk_test_daemon_start(&d, extra);
  share_socket(&d);
  g_ping_socket = d.socket;
  /* Pings are answered within 100 ms (a slower sanitizer or valgrind run
   * gets a second). */
  double limit_ms = sk_test_under_tool() ? 1000.0 : 100.0;

  double t_a = sk_test_now();
  struct holder a;
  holder_start(&a, &g_a, d.socket, LOCK_MAX_USER_CLIENTS + 4);
  int held_a = 0, refused_a = 0;
  holder_line(&a, "held %d refused %d", &held_a, &refused_a);
  assert_int_equal(held_a, LOCK_MAX_USER_CLIENTS);
  assert_int_equal(refused_a, 4);

  double b_ms = ping_ms(&g_b), root_ms = ping_ms(NULL);
  assert_true(b_ms < limit_ms);
  assert_true(root_ms < limit_ms);

  /* Users other than root may hold 32 - 8 = 24: B gets the last 8. */
  struct holder b;
  holder_start(&b, &g_b, d.socket, 12);
  int held_b = 0, refused_b = 0;
  holder_line(&b, "held %d refused %d", &held_b, &refused_b);
  assert_int_equal(held_b, LOCK_MAX_CLIENTS - 8 - LOCK_MAX_USER_CLIENTS);
  assert_int_equal(refused_b, 4);
  double root2_ms = ping_ms(NULL);
  assert_true(root2_ms < limit_ms);
  /* Every place taken by others: B's ping is refused with the reason
   * (the busy reply, or the close that follows it if the client's write
   * came after; the log has the reason either way). */
  char *out = as_user(&g_b, child_timed_ping, NULL);
  char want[256];
  snprintf(want, sizeof want,
           "too many clients: uid %u would be client %d of max_clients %d, whose last 8 are "
           "kept for root",
           (unsigned)g_b.uid, LOCK_MAX_CLIENTS - 8 + 1, LOCK_MAX_CLIENTS);
  if (!strstr(out, want) && strncmp(out, "ping disconnected ", 18) != 0)
    fail_msg("B's ping with every user place taken: %s", out);
  free(out);
  /* Refusals are logged once per uid (a minute apart at most), however
   * many: a client retrying in a loop does not flood the log. */
  char needle[64];
  snprintf(needle, sizeof needle, "refused a connection of uid %u: ", (unsigned)g_a.uid);
  assert_int_equal(log_count(&d, needle), 1);
  snprintf(needle, sizeof needle, "refused a connection of uid %u: ", (unsigned)g_b.uid);
  assert_int_equal(log_count(&d, needle), 1);

  /* After the deadline, the silent connections are gone. */
  assert_int_equal(write(a.cmd, "c", 1), 1);
  assert_int_equal(write(b.cmd, "c", 1), 1);
  int closed_a = 0, closed_b = 0;
  holder_line(&a, "closed %d", &closed_a, NULL);
  double gone_s = sk_test_now() - t_a;
  holder_line(&b, "closed %d", &closed_b, NULL);
  assert_int_equal(closed_a, LOCK_MAX_USER_CLIENTS);
  assert_int_equal(closed_b, held_b);
  assert_true(gone_s >= LOCK_FRAME_TIMEOUT_S);
  snprintf(needle, sizeof needle, "of uid %u closed: no complete request within %d s",
           (unsigned)g_a.uid, LOCK_FRAME_TIMEOUT_S);
  assert_int_equal(log_count(&d, needle), LOCK_MAX_USER_CLIENTS);
  holder_finish(&a);
  holder_finish(&b);
  /* And everyone gets in again. */
  assert_true(ping_ms(&g_a) < limit_ms);
  print_message("figures: lock-out: uid %u held %d connections (4 refused); pings while held: "
                "uid %u %.2f ms, root %.2f ms, root with all user slots taken %.2f ms; silent "
                "connections closed %.2f s after connecting (frame_timeout %d s)\n",
                (unsigned)g_a.uid, held_a, (unsigned)g_b.uid, b_ms, root_ms, root2_ms, gone_s,
                LOCK_FRAME_TIMEOUT_S);
  int st = sk_test_daemon_stop(&d, 60000);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static int setup(void **state) {
  (void)state;
  ensure_group();
  ensure_user(&g_a);
  ensure_user(&g_b);
  ensure_user(&g_c);
  char max_sess[16], max_mem[32];
  snprintf(max_sess, sizeof max_sess, "%d", MAX_USER_SESSIONS);
  snprintf(max_mem, sizeof max_mem, "%u", MAX_USER_MEMORY);
  /* f32 caches: the memory limit is sized for theirs */
  const char *extra[] = {"--max-user-sessions", max_sess, "--max-user-memory", max_mem,
                         "--kv-type",           "f32",    NULL};
  sk_test_daemon_start(&g_d, extra);
  /* What systemd's SocketGroup=/SocketMode=0660 and a 0710 runtime
   * directory give: members of the group may connect, nobody else. */
  if (chown(g_d.dir, 0, g_group) != 0 || chmod(g_d.dir, 0710) != 0 ||
      chown(g_d.socket, 0, g_group) != 0)
    fail_msg("cannot give %s to group " GROUP ": %s", g_d.socket, strerror(errno));
  struct stat st;
  assert_int_equal(stat(g_d.socket, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0660);
  /* sinkctl and libsinkd where every user can run them (the build folder
   * may be under a home only root can enter). */
  snprintf(g_bin, sizeof g_bin, "%s.bin", g_d.dir);
  assert_int_equal(mkdir(g_bin, 0755), 0);
  assert_int_equal(chmod(g_bin, 0755), 0);
  char path[4200];
  snprintf(path, sizeof path, "%s/sinkctl", g_bin);
  copy_file(getenv("SK_SINKCTL"), path);
  snprintf(path, sizeof path, "%s/libsinkd.so.0", g_bin);
  copy_file(getenv("SK_LIBSINKD"), path);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char path[4200];
  snprintf(path, sizeof path, "%s/sinkctl", g_bin);
  unlink(path);
  snprintf(path, sizeof path, "%s/libsinkd.so.0", g_bin);
  unlink(path);
  rmdir(g_bin);
  int st = sk_test_daemon_stop(&g_d, 60000);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int main(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "SKIP: the isolation test needs root (it creates users and runs clients "
                    "as them); CI runs it as root\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_other_users_sessions_are_unknown),
      cmocka_unit_test(test_sinkctl_as_other_users),
      cmocka_unit_test(test_user_limits),
      cmocka_unit_test(test_connection_lockout),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
