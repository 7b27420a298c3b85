#include "testdaemon.h"

#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "sinkd/client.h"
#include "testutil.h"

struct sk_client *sk_test_connect(const char *socket_path) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(socket_path, &c, &e) < 0) fail_msg("connect %s: %s", socket_path, e.message);
  sk_client_set_timeout(c, 120000, NULL);
  return c;
}

void sk_test_greedy_params(struct sk_generate_params *gp, uint32_t max_tokens) {
  sk_generate_params_init(gp);
  gp->max_tokens = max_tokens;
  gp->temperature = 0;
  gp->ignore_eos = true;
}

double sk_test_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool sk_test_under_tool(void) {
  const char *t = getenv("SK_TEST_TOOL");
  return t && *t;
}

/* ---- daemon ------------------------------------------------------------ */

void sk_test_daemon_dump_log(const struct sk_test_daemon *d) {
  size_t n = 0;
  char *log = sk_test_read_file(d->log, &n);
  if (log) {
    /* The tail is what explains a failure; a long log is cut. */
    const char *p = n > 16384 ? log + n - 16384 : log;
    fprintf(stderr, "---- sinkd log (%s) ----\n%s\n-------------------\n", d->log, p);
    free(log);
  }
}

/* Sends a ping on a fresh connection; true if it is answered. */
static bool ping_once(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, path, sizeof a.sun_path);
  bool ok = false;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static const uint8_t ping[] = {0, 0, 0, 13, 0x82, 0xa2, 'i', 'd', 0x01,
                                   0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g'};
    uint8_t *body = NULL;
    uint32_t len = 0;
    if (sk_test_try_write_all(fd, ping, sizeof ping) && sk_test_read_frame(fd, &body, &len) == 1)
      ok = true;
    free(body);
  }
  close(fd);
  return ok;
}

void sk_test_daemon_start(struct sk_test_daemon *d, const char *const *extra) {
  memset(d, 0, sizeof *d);
  d->dir = sk_test_tmpdir();
  snprintf(d->socket, sizeof d->socket, "%s/sinkd.sock", d->dir);
  snprintf(d->log, sizeof d->log, "%s/sinkd.log", d->dir);
  const char *sinkd = getenv("SK_SINKD");
  if (!sinkd) sinkd = "./daemon/sinkd";

  const char *argv[96];
  size_t n = 0;
  char *wrapper = getenv("SK_SINKD_WRAPPER") ? strdup(getenv("SK_SINKD_WRAPPER")) : NULL;
  if (wrapper) {
    for (char *tok = strtok(wrapper, " "); tok && n < 32; tok = strtok(NULL, " ")) argv[n++] = tok;
  }
  /* Its own session store, on tmpfs when there is one, as /run is on a
   * real system (a store on a disk file system puts file creation and
   * removal on the loop thread's path). */
  d->state_root[0] = 0;
  if (access("/dev/shm", W_OK) == 0) {
    snprintf(d->state_root, sizeof d->state_root, "/dev/shm/sinkd-test.XXXXXX");
    if (!mkdtemp(d->state_root)) d->state_root[0] = 0;
  }
  snprintf(d->state, sizeof d->state, "%s/state", d->state_root[0] ? d->state_root : d->dir);
  /* --config /dev/null: an installed /etc/sinkd/sinkd.conf must not
   * change what runs (extra may name another file: the last counts). */
  const char *base[] = {sinkd,       "--config", "/dev/null", "--model", sk_test_model_path(),
                        "--socket",  d->socket,  "--state-dir", d->state, "--threads", "1"};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) argv[n++] = base[i];
  for (size_t i = 0; extra && extra[i] && n < 94; i++) argv[n++] = extra[i];
  argv[n] = NULL;

  fflush(NULL);
  d->pid = fork();
  assert_true(d->pid >= 0);
  if (d->pid == 0) {
    sk_test_child_setup();
    if (!freopen(d->log, "w", stderr)) _exit(126);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  free(wrapper);
  /* Up when it answers (valgrind takes a few seconds to start). */
  double t0 = sk_test_now();
  while (sk_test_now() - t0 < 60) {
    if (ping_once(d->socket)) return;
    if (!sk_test_daemon_alive(d)) break;
    usleep(20000);
  }
  sk_test_daemon_dump_log(d);
  fail_msg("sinkd did not start (socket %s)", d->socket);
}

bool sk_test_daemon_alive(struct sk_test_daemon *d) {
  if (d->pid <= 0) return false;
  int st;
  pid_t r = waitpid(d->pid, &st, WNOHANG);
  if (r == 0) return true;
  if (r == d->pid) {
    fprintf(stderr, "sinkd (pid %d) ended: %s %d\n", (int)d->pid,
            WIFSIGNALED(st) ? "signal" : "exit status",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    d->pid = 0;
  }
  return false;
}

int sk_test_daemon_stop(struct sk_test_daemon *d, int ms) {
  int st = -1;
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    double t0 = sk_test_now();
    pid_t r;
    while ((r = waitpid(d->pid, &st, WNOHANG)) == 0 && sk_test_now() - t0 < ms / 1000.0)
      usleep(10000);
    if (r != d->pid) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &st, 0);
      d->pid = 0;
      sk_test_daemon_dump_log(d);
      fail_msg("sinkd did not stop within %d ms of SIGTERM", ms);
    }
    d->pid = 0;
  }
  if (d->dir) {
    char path[4200];
    unlink(d->log);
    unlink(d->socket);
    /* The store: whatever objects are left, then the folder. */
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->state_root[0] ? d->state_root : d->state);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", d->state);
    snprintf(path, sizeof path, "%s", d->dir);
    rmdir(path);
    free(d->dir);
    d->dir = NULL;
  }
  return st;
}

/* ---- /proc ------------------------------------------------------------- */

static long status_field(pid_t pid, const char *field) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
      kib = strtol(line + fl + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return kib;
}

long sk_test_proc_rss_kib(pid_t pid) { return status_field(pid, "VmRSS"); }
long sk_test_proc_hwm_kib(pid_t pid) { return status_field(pid, "VmHWM"); }

bool sk_test_proc_reset_hwm(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)pid);
  FILE *f = fopen(path, "w");
  if (!f) return false;
  bool ok = fputs("5", f) >= 0;
  if (fclose(f) != 0) ok = false;
  return ok;
}

long sk_test_proc_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (!dir) return -1;
  long n = 0;
  struct dirent *e;
  while ((e = readdir(dir)))
    if (e->d_name[0] != '.') n++;
  closedir(dir);
  return n;
}

/* ---- raw connections --------------------------------------------------- */

int sk_test_raw_connect(const char *socket_path, int timeout_ms) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, socket_path, sizeof a.sun_path);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
    fail_msg("connect %s: %s", socket_path, strerror(errno));
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool sk_test_try_write_all(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= (size_t)w;
  }
  return true;
}

void sk_test_write_all(int fd, const void *p, size_t n) {
  if (!sk_test_try_write_all(fd, p, n)) fail_msg("write: %s", strerror(errno));
}

/* 1 all read, 0 closed, -1 timeout. */
static int read_full(int fd, void *p, size_t n) {
  char *b = p;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return -1;
    if (r <= 0) return 0; /* EOF or ECONNRESET */
    b += r;
    n -= (size_t)r;
  }
  return 1;
}

int sk_test_read_frame(int fd, uint8_t **ret_body, uint32_t *ret_len) {
  uint8_t hdr[4];
  int r = read_full(fd, hdr, 4);
  if (r <= 0) return r;
  uint32_t n = sk_frame_header_get(hdr);
  if (n == 0 || n > SK_FRAME_MAX_CEILING) fail_msg("daemon sent a frame of %u bytes", n);
  uint8_t *body = malloc(n);
  assert_non_null(body);
  r = read_full(fd, body, n);
  if (r <= 0) {
    free(body);
    return r;
  }
  *ret_body = body;
  *ret_len = n;
  return 1;
}

/* ---- requests ---------------------------------------------------------- */

void sk_test_req_init(struct sk_test_req *r) {
  msgpack_sbuffer_init(&r->sb);
  msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
  static const char hdr[4] = {0};
  msgpack_sbuffer_write(&r->sb, hdr, 4);
}

void sk_test_req_free(struct sk_test_req *r) { msgpack_sbuffer_destroy(&r->sb); }

const uint8_t *sk_test_req_frame(struct sk_test_req *r, size_t *ret_len) {
  sk_frame_header_put((uint8_t *)r->sb.data, (uint32_t)(r->sb.size - 4));
  *ret_len = r->sb.size;
  return (const uint8_t *)r->sb.data;
}

void sk_test_req_raw(struct sk_test_req *r, const void *p, size_t n) {
  msgpack_sbuffer_write(&r->sb, p, n);
}

void sk_test_req_key(struct sk_test_req *r, const char *key) {
  size_t n = strlen(key);
  msgpack_pack_str(&r->pk, n);
  msgpack_pack_str_body(&r->pk, key, n);
}

/* ---- replies ----------------------------------------------------------- */

static void copy_str(const msgpack_object *map, const char *key, char *out, size_t size) {
  const msgpack_object *o = sk_msg_get(map, key);
  out[0] = 0;
  if (o && o->type == MSGPACK_OBJECT_STR)
    snprintf(out, size, "%.*s", (int)o->via.str.size, o->via.str.ptr);
}

void sk_test_read_reply(int fd, struct sk_test_reply *ret) {
  memset(ret, 0, sizeof *ret);
  ret->root.type = MSGPACK_OBJECT_NIL;
  uint8_t *body = NULL;
  uint32_t len = 0;
  int r = sk_test_read_frame(fd, &body, &len);
  if (r == 0) {
    ret->closed = true;
    return;
  }
  if (r < 0) {
    ret->timed_out = true;
    return;
  }
  struct sk_error e;
  if (sk_msg_check(body, len, &e) < 0) fail_msg("daemon sent bad msgpack: %s", e.message);
  msgpack_zone_init(&ret->zone, 1024);
  size_t off = 0;
  if (msgpack_unpack((const char *)body, len, &off, &ret->zone, &ret->root) != MSGPACK_UNPACK_SUCCESS ||
      ret->root.type != MSGPACK_OBJECT_MAP)
    fail_msg("daemon sent a frame that is not a map");
  ret->body = body;
  ret->body_len = len;
  if (sk_msg_need_u64(&ret->root, "id", UINT64_MAX, &ret->id, &e) < 0)
    fail_msg("daemon reply without id: %s", e.message);
  ret->is_event = sk_msg_get(&ret->root, "event") != NULL;
  const msgpack_object *ok = sk_msg_get(&ret->root, "ok");
  ret->ok = ok && ok->type == MSGPACK_OBJECT_BOOLEAN && ok->via.boolean;
  const msgpack_object *err = sk_msg_get(&ret->root, "error");
  if (err) {
    copy_str(err, "code", ret->code, sizeof ret->code);
    copy_str(err, "message", ret->message, sizeof ret->message);
  }
  if (!ret->is_event && !ret->ok && !err) fail_msg("daemon reply neither ok nor error");
}

void sk_test_read_final(int fd, struct sk_test_reply *ret, size_t *ret_events) {
  size_t n = 0;
  for (;;) {
    sk_test_read_reply(fd, ret);
    if (!ret->is_event || ret->closed || ret->timed_out) break;
    n++;
    sk_test_reply_free(ret);
  }
  if (ret_events) *ret_events = n;
}

uint64_t sk_test_reply_u64(const struct sk_test_reply *r, const char *key) {
  uint64_t v = 0;
  struct sk_error e;
  if (sk_msg_need_u64(&r->root, key, UINT64_MAX, &v, &e) < 0) fail_msg("reply: %s", e.message);
  return v;
}

void sk_test_reply_free(struct sk_test_reply *r) {
  if (r->body) {
    msgpack_zone_destroy(&r->zone);
    free(r->body);
  }
  r->body = NULL;
  r->root.type = MSGPACK_OBJECT_NIL;
}
