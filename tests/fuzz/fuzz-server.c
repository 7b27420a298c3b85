/* Fuzz target: the whole request path of the daemon, in process. Each
 * input is the byte stream one client sends: a fresh sk_server (the real
 * server.c, compute thread and model) listens on a socket, the input is
 * written to it, the client stops writing and reads until the daemon
 * closes the connection; then the server shuts down cleanly.
 *
 * Checked: every frame the daemon sends back is a well-formed reply or
 * event (a map with an id, and ok/error or an event); the daemon closes
 * the connection after the client's end of stream within a bound; the
 * loop ends with no handle left open; and, by ASan/UBSan/LSan, no memory
 * error, undefined behaviour or leak anywhere on the way.
 *
 * Limits are small (frame 64 KiB, sessions 4, capacity 256) so that the
 * fuzzer reaches them.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "fuzz.h"
#include "model/gguf.h"
#include "base/log.h"
#include "model/model.h"
#include "proto/msg.h"
#include "server/server.h"
#include "session/store.h"
#include "model/tokenizer.h"

static struct sk_gguf *g_gguf;
static struct sk_model *g_model;
static struct sk_tokenizer *g_tok;
static char g_dir[80];
static char g_sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char g_state[128];
static struct sk_store_config g_stc;

static void remove_state(void) {
  char path[160];
  snprintf(path, sizeof path, "%s/lock", g_state);
  unlink(path);
  rmdir(g_state);
  rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  signal(SIGPIPE, SIG_IGN);
  sk_log_set_level(SK_LOG_ERR);
  const char *path = getenv("SK_MODEL");
  if (!path) path = "../shared/models/stories260K.gguf";
  struct sk_error err = {0};
  if (sk_gguf_open(path, &g_gguf, &err) < 0 || sk_model_load(g_gguf, &g_model, &err) < 0 ||
      sk_tokenizer_load(g_gguf, &g_tok, &err) < 0)
    sk_fuzz_fail("cannot load the model %s (set SK_MODEL): %s", path, err.message);
  const char *tmp = getenv("TMPDIR");
  /* A short folder: the socket path must fit sun_path. */
  if (!tmp || !*tmp || strlen(tmp) > 60) tmp = "/tmp";
  snprintf(g_dir, sizeof g_dir, "%s/sinkd-fuzz.XXXXXX", tmp);
  if (!mkdtemp(g_dir)) sk_fuzz_fail("mkdtemp: %s", strerror(errno));
  snprintf(g_sock, sizeof g_sock, "%s/s.sock", g_dir);
  /* Session objects go to tmpfs when there is one (as in production). */
  snprintf(g_state, sizeof g_state, "%s/sinkd-fuzz-state.%d",
           access("/dev/shm", W_OK) == 0 ? "/dev/shm" : g_dir, (int)getpid());
  g_stc.dir = g_state;
  g_stc.shape = sk_model_kv_shape(g_model);
  g_stc.n_vocab = sk_model_config(g_model)->n_vocab;
  sk_store_fingerprint(g_gguf, g_stc.model_fp);
  atexit(remove_state);
  return 0;
}

/* Empties a folder (one level of subfolders: invalid/), so that every
 * input starts from an empty store: a daemon keeps its sessions across a
 * stop, and ids would otherwise differ from run to run. */
static void empty_dir(const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0 && depth > 0) {
      empty_dir(path, depth - 1);
      rmdir(path);
    }
  }
  closedir(d);
}

struct run {
  uv_loop_t loop;
  uv_async_t stop;
  struct sk_server *srv;
};

static void on_stop(uv_async_t *h) {
  struct run *r = h->data;
  sk_server_shutdown(r->srv);
  uv_close((uv_handle_t *)h, NULL);
}

static void *loop_thread(void *arg) {
  struct run *r = arg;
  uv_run(&r->loop, UV_RUN_DEFAULT);
  return NULL;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Every frame from the daemon is a reply or an event. */
static void check_output(struct sk_frame_reader *rd) {
  for (;;) {
    const uint8_t *body = NULL;
    size_t len = 0;
    int rc = sk_frame_reader_next(rd, &body, &len);
    if (rc == 0) return;
    if (rc < 0) sk_fuzz_fail("daemon sent a frame of %zu bytes", len);
    struct sk_msg m;
    struct sk_error e;
    if (sk_msg_parse(body, len, &m, &e) < 0) sk_fuzz_fail("daemon sent bad msgpack: %s", e.message);
    uint64_t id;
    if (sk_msg_need_u64(&m.root, "id", UINT64_MAX, &id, &e) < 0)
      sk_fuzz_fail("daemon frame without id: %s", e.message);
    const msgpack_object *ok = sk_msg_get(&m.root, "ok");
    const msgpack_object *ev = sk_msg_get(&m.root, "event");
    if (!ev && (!ok || ok->type != MSGPACK_OBJECT_BOOLEAN))
      sk_fuzz_fail("daemon frame neither a reply nor an event");
    if (ok && !ok->via.boolean) {
      const msgpack_object *err = sk_msg_get(&m.root, "error");
      const char *code;
      size_t n;
      if (!err || sk_msg_need_str(err, "code", &code, &n, &e) < 0 ||
          sk_error_from_name(code, n) == SK_ERR_INTERNAL)
        sk_fuzz_fail("error reply without a known code");
    }
    sk_msg_free(&m);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static struct run r;
  memset(&r, 0, sizeof r);
  struct sk_store *store = NULL;
  struct sk_error err = {0};
  bool tmpfs;
  if (sk_store_open(&g_stc, &store, &tmpfs, &err) < 0) sk_fuzz_fail("store: %s", err.message);
  if (uv_loop_init(&r.loop) != 0) sk_fuzz_fail("uv_loop_init");
  struct sk_server_config cfg = {
      .socket_path = g_sock,
      .model_path = "fuzz",
      .max_frame = 64 * 1024,
      .max_sessions = 4,
      .max_clients = 8,
      .max_capacity = 256,
      .max_batch = 16,
      .max_user_sessions = 3,
      .max_user_kv_bytes = 1u << 20,
      .defaults = {.policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 28, .capacity = 64,
                   .rope_scale = 1.0f},
      .max_memory = 8u << 20,
      .store = store,
  };
  if (sk_server_new(&r.loop, &cfg, g_model, g_tok, &r.srv, &err) < 0)
    sk_fuzz_fail("server start: %s", err.message);
  uv_async_init(&r.loop, &r.stop, on_stop);
  r.stop.data = &r;
  pthread_t th;
  pthread_create(&th, NULL, loop_thread, &r);

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, g_sock, sizeof a.sun_path);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) sk_fuzz_fail("connect: %s", strerror(errno));

  /* Write the input while reading what comes back; then end the stream
   * and read until the daemon closes. */
  struct sk_frame_reader rd;
  sk_frame_reader_init(&rd, SK_FRAME_MAX_CEILING);
  size_t sent = 0;
  bool shut = false;
  double t0 = now();
  uint8_t buf[65536];
  for (;;) {
    if (sent == size && !shut) {
      shutdown(fd, SHUT_WR);
      shut = true;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT)};
    if (poll(&p, 1, 1000) < 0 && errno != EINTR) sk_fuzz_fail("poll: %s", strerror(errno));
    if (now() - t0 > 20) sk_fuzz_fail("the daemon did not close the connection within 20 s");
    if (!shut && (p.revents & POLLOUT)) {
      ssize_t w = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (w > 0) sent += (size_t)w;
      else if (w < 0 && errno != EAGAIN) shut = true; /* closed on us: fine */
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      if (n > 0) {
        if (sk_frame_reader_feed(&rd, buf, (size_t)n) < 0) sk_fuzz_fail("feed");
        check_output(&rd);
      }
    }
  }
  close(fd);
  sk_frame_reader_free(&rd);

  uv_async_send(&r.stop);
  pthread_join(th, NULL);
  sk_server_free(r.srv);
  if (uv_loop_close(&r.loop) != 0) sk_fuzz_fail("handles left open after shutdown");
  sk_store_close(store);
  empty_dir(g_state, 1);
  return 0;
}
