/* libsinkd against a fake daemon (testfake.h): every call's request and
 * reply, persistence, streamed generation, failures and connecting. */
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
static struct sk_client *connect_or_fail(const char *path) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(path, &c, &e) != 0) fail_msg("connect: %s", e.message);
  return c;
}

static void test_client_ops(void **state) {
  (void)state;
  struct fake *f = fake_start(FAKE_NORMAL);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};

  assert_int_equal(sk_client_ping(c, &e), 0);

  struct sk_hello h;
  assert_int_equal(sk_client_hello(c, &h, &e), 0);
  assert_int_equal(h.protocol, 1);
  assert_string_equal(h.server, "sinkd");
  assert_string_equal(h.model.name, "stories260K");
  assert_int_equal(h.model.n_kv_head, 4);
  assert_string_equal(h.model.weight_type, "q8_0");
  assert_true(h.model.weight_bytes == 5000000000u);
  assert_string_equal(h.compute.kernel, "avx2");
  assert_int_equal(h.compute.threads, 2);
  assert_int_equal(h.compute.max_batch, 64);
  assert_string_equal(h.defaults.policy, "streaming");
  assert_int_equal(h.defaults.window, 252);

  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, NULL, &o, &e), 0);
  assert_int_equal(o.session, 7);
  assert_int_equal(o.kv_bytes, 1234);
  assert_int_equal(o.object_bytes, 4096);
  struct sk_open_params op = {.policy = "dense", .capacity = 64, .temporary = true};
  assert_int_equal(sk_client_open(c, &op, NULL, &e), 0);

  struct sk_session_info *rows = NULL;
  size_t n = 0;
  assert_int_equal(sk_client_list(c, &rows, &n, &e), 0);
  assert_int_equal(n, 2);
  assert_string_equal(rows[1].policy, "dense");
  assert_int_equal(rows[1].resident, 101);
  assert_true(rows[0].seen == 5000000000u);
  free(rows);

  struct sk_daemon_stats ds;
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.tokens_generated, 456);
  assert_string_equal(ds.compute.kernel, ""); /* an older daemon: left out */
  assert_int_equal(ds.steps, 0);
  struct sk_session_stats ss;
  assert_int_equal(sk_client_session_stats(c, 7, &ss, &e), 0);
  assert_true(ss.has_positions);
  assert_int_equal(ss.position_last, 259);
  assert_int_equal(ss.evicted, 740);
  assert_int_equal(sk_client_session_stats(c, 8, &ss, &e), 0);
  assert_false(ss.has_positions);

  struct sk_append_result ar;
  assert_int_equal(sk_client_append_text(c, 7, "hello", 5, SK_BOS_DEFAULT,
                                         &ar, &e),
                   0);
  assert_int_equal(ar.n_tokens, 5);
  assert_int_equal(ar.n_ranges, 2);
  assert_int_equal(ar.ranges[0].first, 4);
  assert_int_equal(ar.ranges[1].last, 9);
  const int32_t toks[] = {1, 2, 3};
  assert_int_equal(sk_client_append_tokens(c, 7, toks, 3, SK_BOS_FALSE, NULL,
                                           &e),
                   0);

  int32_t *ids = NULL;
  assert_int_equal(sk_client_tokenize(c, "hi", 2, SK_BOS_TRUE, &ids, &n, &e), 0);
  assert_int_equal(n, 3);
  assert_int_equal(ids[1], 365);
  assert_int_equal(ids[2], 2147483647);
  free(ids);
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(sk_client_detokenize(c, toks, 3, &text, &len, &e), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(text, "he\0llo", 7); /* NUL-terminated too */
  free(text);

  bool cancelled = true;
  assert_int_equal(sk_client_cancel(c, 7, &cancelled, &e), 0);
  assert_false(cancelled);
  assert_int_equal(sk_client_close_session(c, 7, &e), 0);

  /* A daemon error: code mapped, message kept, connection still usable. */
  assert_int_equal(sk_client_close_session(c, 99, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(e.code, SK_ERR_NO_SUCH_SESSION);
  assert_string_equal(e.message, "no session 99");
  assert_true(sk_client_connected(c));
  assert_int_equal(sk_client_ping(c, &e), 0);

  sk_client_free(c);
  fake_join(f);

  /* What the fake received: ids count up from 1; fields left at "daemon
   * default" are omitted. */
  static const char *const ops[] = {
      "ping", "hello", "open", "open", "list", "stats", "stats", "stats",
      "append", "append", "tokenize", "detokenize", "cancel", "close",
      "close", "ping"};
  assert_int_equal(f->n_req, sizeof ops / sizeof ops[0]);
  struct sk_msg m;
  for (size_t i = 0; i < f->n_req; i++) {
    fake_request(f, i, &m);
    assert_op(&m, ops[i], i + 1);
    sk_msg_free(&m);
  }
  fake_request(f, 2, &m); /* open, all defaults */
  assert_int_equal(m.root.via.map.size, 2);
  sk_msg_free(&m);
  fake_request(f, 3, &m); /* open dense, capacity 64, temporary */
  assert_int_equal(m.root.via.map.size, 5);
  assert_null(sk_msg_get(&m.root, "n_sink"));
  uint64_t u;
  assert_int_equal(sk_msg_get_u64(&m.root, "capacity", UINT64_MAX, &u, NULL), 1);
  assert_int_equal(u, 64);
  bool temporary = false;
  assert_int_equal(sk_msg_get_bool(&m.root, "temporary", &temporary, NULL), 1);
  assert_true(temporary);
  sk_msg_free(&m);
  fake_request(f, 8, &m); /* append text, bos default: no bos field */
  assert_null(sk_msg_get(&m.root, "bos"));
  const char *str;
  size_t slen;
  assert_int_equal(sk_msg_need_str(&m.root, "text", &str, &slen, NULL), 0);
  assert_int_equal(slen, 5);
  sk_msg_free(&m);
  fake_request(f, 9, &m); /* append tokens, bos false */
  bool bos = true;
  assert_int_equal(sk_msg_get_bool(&m.root, "bos", &bos, NULL), 1);
  assert_false(bos);
  const msgpack_object_array *a;
  assert_int_equal(sk_msg_get_array(&m.root, "tokens", &a, NULL), 1);
  assert_int_equal(a->size, 3);
  assert_int_equal(a->ptr[2].via.u64, 3);
  sk_msg_free(&m);
  fake_request(f, 10, &m); /* tokenize, bos true */
  assert_int_equal(sk_msg_get_bool(&m.root, "bos", &bos, NULL), 1);
  assert_true(bos);
  sk_msg_free(&m);
  fake_free(f);
}

/* Collects what the token callback sees. */
struct tok_log {
  int n;
  int32_t tokens[8];
  char text[64];
  size_t n_top[8];
  double top_logit[8];
  int stop_after; /* return nonzero from the callback after this many */
};

static int tok_cb(void *user, const struct sk_token_event *ev) {
  struct tok_log *t = user;
  if (t->n < 8) {
    t->tokens[t->n] = ev->token;
    t->n_top[t->n] = ev->n_top;
    t->top_logit[t->n] = ev->n_top ? ev->top[1].logit : 0;
    strncat(t->text, ev->text, ev->text_len);
  }
  t->n++;
  return t->stop_after && t->n >= t->stop_after;
}

/* resume, fork, export (data events in order, size checked) and import
 * (chunked; a too_large refusal halves the chunk and resends it). */
static void test_client_persistence(void **state) {
  (void)state;
  struct fake *f = fake_start(FAKE_NORMAL);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};
  struct sk_session_summary s;
  assert_int_equal(sk_client_resume(c, 7, &s, &e), 0);
  assert_int_equal(s.session, 7);
  assert_string_equal(s.policy, "streaming");
  assert_int_equal(s.kv_bytes, 57344);
  assert_int_equal(s.object_bytes, 73728);
  assert_int_equal(s.evicted, 740);
  assert_int_equal(s.commit, 77);
  assert_true(s.adopted);
  assert_int_equal(s.from, 0);
  assert_int_equal(sk_client_resume(c, 99, &s, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(sk_client_fork(c, 7, &s, &e), 0);
  assert_int_equal(s.session, 8);
  assert_int_equal(s.from, 7);

  void *data = NULL;
  size_t len = 0;
  assert_int_equal(sk_client_export(c, 7, &data, &len, &e), 0);
  assert_int_equal(len, 5);
  assert_memory_equal(data, "abcde", 5);
  free(data);

  /* 300000 bytes: 256 KiB refused, 128 KiB refused, then 64 KiB chunks */
  size_t big = 300000;
  char *img = malloc(big);
  assert_non_null(img);
  for (size_t i = 0; i < big; i++) img[i] = (char)(i * 7);
  size_t n_before = f->n_req;
  assert_int_equal(sk_client_import(c, img, big, &s, &e), 0);
  assert_int_equal(s.session, 12);
  assert_string_equal(s.policy, "dense");
  /* 2 refused + ceil(300000 / 65536) = 5 chunks */
  assert_int_equal(f->n_req - n_before, 7);
  uint64_t want_off = 0;
  for (size_t i = n_before + 2; i < f->n_req; i++) {
    struct sk_msg m;
    fake_request(f, i, &m);
    uint64_t off = 0, total = 0;
    const char *d;
    size_t dl;
    assert_int_equal(sk_msg_need_u64(&m.root, "offset", UINT64_MAX, &off, NULL), 0);
    assert_int_equal(sk_msg_need_u64(&m.root, "total", UINT64_MAX, &total, NULL), 0);
    assert_int_equal(sk_msg_need_str(&m.root, "data", &d, &dl, NULL), 0);
    assert_int_equal(off, want_off);
    assert_int_equal(total, big);
    assert_memory_equal(d, img + off, dl);
    want_off += dl;
    sk_msg_free(&m);
  }
  assert_int_equal(want_off, big);
  free(img);

  /* the daemon breaking the export stream is a protocol error */
  assert_int_equal(sk_client_export(c, 8, &data, &len, &e), -SK_ERR_PROTOCOL);
  assert_non_null(strstr(e.message, "out of order"));
  sk_client_free(c);
  c = connect_or_fail(f->path);
  assert_int_equal(sk_client_export(c, 9, &data, &len, &e), -SK_ERR_PROTOCOL);
  assert_non_null(strstr(e.message, "size"));
  sk_client_free(c);
  fake_join(f);
  fake_free(f);
}

static void test_client_generate(void **state) {
  (void)state;
  struct fake *f = fake_start(FAKE_NORMAL);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};

  struct sk_generate_params p;
  sk_generate_params_init(&p);
  assert_int_equal(p.max_tokens, 128);
  assert_true(p.temperature == 0.8);
  assert_int_equal(p.top_k, 40);
  assert_true(p.top_p == 0.95);
  p.max_tokens = 3;
  p.n_top = 2;
  const char *stops[] = {"\n\n", "The end"};
  p.stop = stops;
  p.n_stop = 2;
  p.seed = 42;
  p.has_seed = true;
  p.prompt = "Once";
  struct tok_log t = {0};
  struct sk_generate_result r;
  assert_int_equal(sk_client_generate(c, 7, &p, tok_cb, &t, &r, &e), 0);
  assert_int_equal(t.n, 3);
  assert_int_equal(t.tokens[0], 10);
  assert_int_equal(t.tokens[2], 12);
  assert_string_equal(t.text, "a\xc3\xbc");
  assert_int_equal(t.n_top[0], 2);
  assert_true(t.top_logit[0] == -2.25);
  assert_string_equal(r.stop, "stop"); /* the fake stops on a stop string if given any */
  assert_int_equal(r.n_tokens, 3);
  assert_int_equal(r.prompt_tokens, 4);
  assert_int_equal(r.completion_tokens, 3);
  assert_int_equal(r.seen, 23);
  assert_int_equal(r.n_ranges, 2);

  /* Without a callback. */
  p.n_top = 0;
  assert_int_equal(sk_client_generate(c, 7, &p, NULL, NULL, NULL, &e), 0);

  /* A callback that stops: a cancel goes out, later events are not given
   * to the callback, and the final reply says "cancelled". Both orders of
   * the final reply and the cancel's reply. */
  for (int order = 0; order < 2; order++) {
    f->final_before_cancel_reply = order == 1;
    sk_generate_params_init(&p);
    struct tok_log t2 = {.stop_after = 1};
    assert_int_equal(sk_client_generate(c, 7, &p, tok_cb, &t2, &r, &e), 0);
    assert_int_equal(t2.n, 1);
    assert_string_equal(r.stop, "cancelled");
    /* The stream is in step: the next request works. */
    assert_int_equal(sk_client_ping(c, &e), 0);
  }

  /* An error before generation. */
  assert_int_equal(sk_client_generate(c, 99, NULL, tok_cb, &t, &r, &e),
                   -SK_ERR_NO_SUCH_SESSION);
  assert_string_equal(e.message, "no session 99");

  sk_client_free(c);
  fake_join(f);

  /* Requests: generate(1), generate(2), generate(3), cancel(4), ping(5),
   * generate(6), cancel(7), ping(8), generate(9). */
  static const char *const ops[] = {"generate", "generate", "generate",
                                    "cancel",   "ping",     "generate",
                                    "cancel",   "ping",     "generate"};
  assert_int_equal(f->n_req, sizeof ops / sizeof ops[0]);
  struct sk_msg m;
  for (size_t i = 0; i < f->n_req; i++) {
    fake_request(f, i, &m);
    assert_op(&m, ops[i], i + 1);
    sk_msg_free(&m);
  }
  fake_request(f, 0, &m);
  uint64_t u;
  double d;
  const msgpack_object_array *a;
  const char *str;
  size_t slen;
  assert_int_equal(sk_msg_get_u64(&m.root, "seed", UINT64_MAX, &u, NULL), 1);
  assert_int_equal(u, 42);
  assert_int_equal(sk_msg_get_f64(&m.root, "top_p", &d, NULL), 1);
  assert_true(d == 0.95);
  assert_int_equal(sk_msg_get_array(&m.root, "stop", &a, NULL), 1);
  assert_int_equal(a->size, 2);
  assert_int_equal(sk_msg_need_str(&m.root, "prompt", &str, &slen, NULL), 0);
  assert_int_equal(slen, 4);
  assert_int_equal(sk_msg_get_u64(&m.root, "n_top", UINT64_MAX, &u, NULL), 1);
  sk_msg_free(&m);
  fake_request(f, 3, &m); /* the cancel names the session */
  assert_int_equal(sk_msg_need_u64(&m.root, "session", UINT64_MAX, &u, NULL), 0);
  assert_int_equal(u, 7);
  sk_msg_free(&m);
  fake_request(f, 2, &m); /* defaults: no seed, stop, prompt or n_top */
  assert_null(sk_msg_get(&m.root, "seed"));
  assert_null(sk_msg_get(&m.root, "stop"));
  assert_null(sk_msg_get(&m.root, "n_top"));
  sk_msg_free(&m);
  fake_free(f);
}

/* Transport failures: each closes the connection, and later calls say
 * so. */
static void test_client_failures(void **state) {
  (void)state;
  static const struct {
    enum fake_mode mode;
    int code;
    const char *message;
  } cases[] = {
      {FAKE_WRONG_ID, SK_ERR_PROTOCOL, "reply with id 6 while waiting for 1"},
      {FAKE_HANGUP, SK_ERR_DISCONNECTED, "the daemon closed the connection"},
      {FAKE_HUGE_FRAME, SK_ERR_PROTOCOL,
       "the daemon sent a frame of 4294967295 bytes (limit 16777216)"},
      {FAKE_NOT_MAP, SK_ERR_PROTOCOL,
       "invalid reply from the daemon: request must be a map, got array"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct fake *f = fake_start(cases[i].mode);
    struct sk_client *c = connect_or_fail(f->path);
    struct sk_error e = {0};
    assert_int_equal(sk_client_ping(c, &e), -cases[i].code);
    assert_string_equal(e.message, cases[i].message);
    assert_false(sk_client_connected(c));
    assert_int_equal(sk_client_ping(c, &e), -SK_ERR_DISCONNECTED);
    sk_client_free(c);
    fake_join(f);
    fake_free(f);
  }

  /* A timeout closes the connection too (the reply may still come). */
  {
    struct fake *fs = fake_start(FAKE_SILENT);
    struct sk_client *cs = connect_or_fail(fs->path);
    struct sk_error es = {0};
    assert_int_equal(sk_client_set_timeout(cs, 100, &es), 0);
    assert_int_equal(sk_client_ping(cs, &es), -SK_ERR_IO);
    assert_string_equal(es.message, "timed out waiting for the daemon (100 ms)");
    assert_false(sk_client_connected(cs));
    sk_client_free(cs);
    fake_join(fs);
    fake_free(fs);
  }

  /* An id-0 error (a frame the daemon could not read) answers the request
   * and leaves the connection usable. */
  struct fake *f = fake_start(FAKE_ID0);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};
  assert_int_equal(sk_client_append_text(c, 7, "x", 1, SK_BOS_DEFAULT, NULL,
                                         &e),
                   -SK_ERR_TOO_LARGE);
  assert_string_equal(e.message, "frame of 2000000 bytes (limit 1048576)");
  assert_true(sk_client_connected(c));
  assert_int_equal(sk_client_ping(c, &e), 0);
  sk_client_free(c);
  fake_join(f);
  fake_free(f);
}

/* Connects to path as another user (root only: setuid to nobody in a
 * child) or, for an ordinary user, after taking the owner's write bit away;
 * returns the error message. */
static void connect_denied(const char *path, char *msg, size_t size) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    if (getuid() == 0 && (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0))
      _exit(1);
    struct sk_client *c = NULL;
    struct sk_error e = {0};
    int rc = sk_client_connect(path, &c, &e);
    dprintf(p[1], "%d %s", rc, e.message);
    _exit(0);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while ((r = read(p[0], msg + n, size - 1 - n)) > 0) n += (size_t)r;
  msg[n] = 0;
  close(p[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* EACCES: the message says which permission is missing and what to do. */
static void check_permission_denied(const char *dir) {
  char msg[1024], want[1024];
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  char *path = addr.sun_path;
  assert_true(strlen(dir) + 13 < sizeof addr.sun_path);
  snprintf(path, sizeof addr.sun_path, "%s/denied.sock", dir);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(fd, 4), 0);
  if (getuid() == 0) {
    /* A folder nobody may search (mkdtemp made it 0700). */
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%d cannot connect to %s: permission denied on a folder of the path "
             "(Permission denied)", -SK_ERR_IO, path);
    assert_string_equal(msg, want);
    assert_int_equal(chmod(dir, 0755), 0);
    /* The socket's group, named. */
    assert_int_equal(chmod(path, 0660), 0);
    assert_int_equal(chown(path, 0, 0), 0);
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%d cannot connect to %s: permission denied (mode 0660, group 'root'): only "
             "its owner and group may connect; ask them for another group, or run your own "
             "sinkd with --socket",
             -SK_ERR_IO, path);
    assert_string_equal(msg, want);
    /* Another group: join it (daemon, gid 1, as the sinkd group would be). */
    struct group *ng = getgrgid(1);
    if (ng) {
      char gname[64];
      snprintf(gname, sizeof gname, "%s", ng->gr_name);
      assert_int_equal(chown(path, 0, 1), 0);
      connect_denied(path, msg, sizeof msg);
      snprintf(want, sizeof want,
               "%d cannot connect to %s: permission denied (mode 0660, group '%s'): join "
               "the group with `sudo usermod -aG %s $USER`, then log in again",
               -SK_ERR_IO, path, gname, gname);
      assert_string_equal(msg, want);
      assert_int_equal(chown(path, 0, 0), 0);
    }
    /* No group access at all. */
    assert_int_equal(chmod(path, 0600), 0);
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%d cannot connect to %s: permission denied (mode 0600: only its owner may "
             "connect)", -SK_ERR_IO, path);
    assert_string_equal(msg, want);
    assert_int_equal(chmod(dir, 0700), 0);
  } else {
    /* The owner without write permission on the socket. */
    assert_int_equal(chmod(path, 0060), 0);
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want, "%d cannot connect to %s: permission denied (mode 0060, group '",
             -SK_ERR_IO, path);
    assert_memory_equal(msg, want, strlen(want));
  }
  close(fd);
  unlink(path);
}

static void test_client_connect(void **state) {
  (void)state;
  char *dir = sk_test_tmpdir();
  char path[512];
  snprintf(path, sizeof path, "%s/none.sock", dir);
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(path, &c, &e), -SK_ERR_IO);
  assert_null(c);
  char want[1400];
  /* a path of the caller's choosing: start a daemon there */
  snprintf(want, sizeof want,
           "cannot connect to %s: no such file (is sinkd running? start one "
           "there with `sinkd --model FILE --socket %s`)",
           path, path);
  assert_string_equal(e.message, want);
  /* a path that is there but no socket */
  assert_int_equal(sk_client_connect(dir, &c, &e), -SK_ERR_IO);
  snprintf(want, sizeof want, "cannot connect to %s: not a socket but a folder", dir);
  assert_string_equal(e.message, want);

  /* A socket file nobody listens on: refused, same hint. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, path);
  assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
  close(fd);
  assert_int_equal(sk_client_connect(path, &c, &e), -SK_ERR_IO);
  assert_non_null(strstr(e.message, "connection refused (is sinkd running?"));
  unlink(path);
  /* $XDG_RUNTIME_DIR/sinkd/sinkd.sock: the per-user daemon's hint; another
   * path under $XDG_RUNTIME_DIR: start one there */
  setenv("XDG_RUNTIME_DIR", dir, 1);
  assert_int_equal(sk_client_connect(path, &c, &e), -SK_ERR_IO);
  assert_non_null(strstr(e.message, "start one there with `sinkd --model FILE --socket "));
  char upath[600];
  snprintf(upath, sizeof upath, "%s/sinkd/sinkd.sock", dir);
  assert_int_equal(sk_client_connect(upath, &c, &e), -SK_ERR_IO);
  assert_non_null(strstr(e.message, "start it with `systemctl --user start sinkd.socket`"));
  unsetenv("XDG_RUNTIME_DIR");

  check_permission_denied(dir);

  char longpath[200];
  memset(longpath, 'x', sizeof longpath - 1);
  longpath[sizeof longpath - 1] = 0;
  assert_int_equal(sk_client_connect(longpath, &c, &e), -SK_ERR_IO);

  /* Default path: $SINKD_SOCKET, else $XDG_RUNTIME_DIR/sinkd/sinkd.sock if
   * it exists, else /run/sinkd/sinkd.sock. */
  setenv("SINKD_SOCKET", "/x/y.sock", 1);
  assert_string_equal(sk_client_default_socket(), "/x/y.sock");
  unsetenv("SINKD_SOCKET");
  setenv("XDG_RUNTIME_DIR", dir, 1);
  assert_string_equal(sk_client_default_socket(), "/run/sinkd/sinkd.sock");
  char sub[512];
  snprintf(sub, sizeof sub, "%s/sinkd", dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  snprintf(path, sizeof path, "%s/sinkd/sinkd.sock", dir);
  FILE *touch = fopen(path, "w");
  assert_non_null(touch);
  fclose(touch);
  assert_string_equal(sk_client_default_socket(), path);
  unlink(path);
  rmdir(sub);
  rmdir(dir);
  unsetenv("XDG_RUNTIME_DIR");
  free(dir);
}

/* ---- sinkctl, against the fake daemon ---------------------------------- */
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_client_ops),
      cmocka_unit_test(test_client_persistence),
      cmocka_unit_test(test_client_generate),
      cmocka_unit_test(test_client_failures),
      cmocka_unit_test(test_client_connect),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
