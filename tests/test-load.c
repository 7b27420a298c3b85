/* Bounded load test: 256 concurrent clients on the Unix socket for a fixed
 * time (SK_LOAD_SECONDS, default 20), mixing opens, appends, generates,
 * cancels and closes, with misbehaving clients among them:
 *
 *   kind       clients  what it does, over and over until the time is up
 *   normal     3/8      libsinkd: open, append, generate 1..32 tokens,
 *                       stats, close
 *   canceller  1/8      generate 10^5 tokens, cancel from the callback
 *                       after a few; or a cancel request from a second
 *                       connection while it runs
 *   vanisher   1/8      raw: generate 10^5 tokens, read a little, vanish
 *                       (half with an RST); its session closed afterwards
 *                       from another connection
 *   nonreader  1/8      raw: generate 10^5 tokens and 200 pings, never
 *                       read, hold the connection 1..3 s, close
 *   trickler   1/8      raw: generate 64 tokens, read the replies one byte
 *                       per read() and check every frame
 *   pipeliner  1/8      raw: 16 mixed requests in one write, then all 16
 *                       replies, by id; then 50..150 ms of quiet
 *
 * The clients arrive over the first second. Meanwhile a monitor pings on its own connection every 10 ms and samples
 * the daemon's RSS and open descriptors. Each client pauses 0..20 ms
 * between rounds. Asserted: the daemon stays up
 * (no signal, SIGPIPE included, ends it) and exits 0 on SIGTERM at the
 * end; every ping is answered (its latency is printed against PING_BOUND_MS,
 * not asserted: see the end of test_load); no reply carries an
 * unexpected error (internal, protocol); after the clients leave, the
 * open descriptors return exactly to the baseline and the RSS to within
 * a few MiB of it (ASan/valgrind: their allocators keep freed memory, so
 * only printed).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"

#define N_CLIENTS 256
#define BURST 16 /* requests a pipeliner writes at once */
#define PING_BOUND_MS 100.0
#define RSS_SLACK_KIB (8 * 1024)

static struct sk_test_daemon g_d;
static double g_start, g_deadline;

enum kind { K_NORMAL, K_CANCELLER, K_VANISHER, K_NONREADER, K_TRICKLER, K_PIPELINER, K__N };
static const char *const k_kind_names[K__N] = {"normal", "canceller", "vanisher",
                                               "nonreader", "trickler", "pipeliner"};

static enum kind kind_of(int i) {
  switch (i % 8) {
  case 0: case 1: case 2: return K_NORMAL;
  case 3: return K_CANCELLER;
  case 4: return K_VANISHER;
  case 5: return K_NONREADER;
  case 6: return K_TRICKLER;
  default: return K_PIPELINER;
  }
}

/* Tallies, shared by the client threads. */
static atomic_ulong g_rounds[K__N];
static atomic_ulong g_requests, g_tokens_seen, g_busy, g_cancelled_gen;
static atomic_ulong g_failures;
static pthread_mutex_t g_fail_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_first_failure[512];

static void failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failure(const char *fmt, ...) {
  pthread_mutex_lock(&g_fail_lock);
  if (atomic_fetch_add(&g_failures, 1) == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_first_failure, sizeof g_first_failure, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&g_fail_lock);
}

static bool time_left(void) { return sk_test_now() < g_deadline; }

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* A daemon error a well-behaved client may see under load. */
static bool expected_error(int rc) {
  return rc == -SK_ERR_BUSY || rc == -SK_ERR_CANCELLED || rc == -SK_ERR_CONTEXT_FULL;
}

static void check_rc(int rc, const struct sk_error *e, const char *what) {
  atomic_fetch_add(&g_requests, 1);
  if (rc == 0) return;
  if (rc == -SK_ERR_BUSY) atomic_fetch_add(&g_busy, 1);
  if (!expected_error(rc)) failure("%s: %s: %s", what, sk_error_name(rc), e->message);
}

static struct sk_client *client_connect(void) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(g_d.socket, &c, &e) < 0) {
    failure("connect: %s", e.message);
    return NULL;
  }
  sk_client_set_timeout(c, 30000, NULL);
  return c;
}

static uint64_t open_session(struct sk_client *c) {
  struct sk_open_params op = {.policy = "streaming", .n_sink = 4, .window = 60};
  struct sk_open_result o;
  struct sk_error e = {0};
  int rc = sk_client_open(c, &op, &o, &e);
  check_rc(rc, &e, "open");
  return rc == 0 ? o.session : 0;
}

static void close_session(struct sk_client *c, uint64_t s) {
  struct sk_error e = {0};
  int rc = sk_client_close_session(c, s, &e);
  check_rc(rc, &e, "close");
}

static int count_tokens(void *user, const struct sk_token_event *ev) {
  (void)ev;
  int *n = user;
  atomic_fetch_add(&g_tokens_seen, 1);
  return n && ++*n >= 5; /* a canceller cancels after five */
}

/* ---- kinds -------------------------------------------------------------- */

static const char *const k_prompts[] = {"Once upon a time", "The little dog", "One day, Lily",
                                        "Tom and Sue went to the park."};

static void run_normal(uint64_t *rng) {
  struct sk_client *c = client_connect();
  if (!c) return;
  uint64_t s = open_session(c);
  if (s) {
    struct sk_error e = {0};
    const char *p = k_prompts[rng_next(rng) % 4];
    int rc = sk_client_append_text(c, s, p, strlen(p), SK_BOS_DEFAULT, NULL, &e);
    check_rc(rc, &e, "append");
    struct sk_generate_params gp;
    sk_generate_params_init(&gp);
    gp.max_tokens = 1 + (uint32_t)(rng_next(rng) % 32);
    gp.temperature = (double)(rng_next(rng) % 10) / 10.0;
    gp.ignore_eos = true;
    struct sk_generate_result gr;
    memset(&e, 0, sizeof e);
    rc = sk_client_generate(c, s, &gp, count_tokens, NULL, &gr, &e);
    check_rc(rc, &e, "generate");
    if (rc == 0 && gr.n_tokens != gp.max_tokens)
      failure("generate: %llu tokens of %u (%s)", (unsigned long long)gr.n_tokens, gp.max_tokens,
              gr.stop);
    struct sk_session_stats st;
    memset(&e, 0, sizeof e);
    check_rc(sk_client_session_stats(c, s, &st, &e), &e, "stats");
    close_session(c, s);
  }
  sk_client_free(c);
}

struct cancel_arg {
  uint64_t session;
  atomic_bool done; /* the generate returned */
};

/* Cancels a's generate from a second connection. The generate may not
 * have reached the daemon yet (a loaded machine), and a cancel that
 * finds nothing running cancels nothing: try every 20 ms until one
 * finds it or the generate returned, at most 10 s. */
static void *cancel_later(void *arg) {
  struct cancel_arg *a = arg;
  struct sk_client *c = client_connect();
  if (!c) return NULL;
  for (int i = 0; i < 500 && !atomic_load(&a->done); i++) {
    usleep(20000);
    bool any = false;
    struct sk_error e = {0};
    int rc = sk_client_cancel(c, a->session, &any, &e);
    check_rc(rc, &e, "cancel");
    if (rc != 0 || any) break;
  }
  sk_client_free(c);
  return NULL;
}

static void run_canceller(uint64_t *rng) {
  struct sk_client *c = client_connect();
  if (!c) return;
  uint64_t s = open_session(c);
  if (s) {
    struct sk_generate_params gp;
    sk_generate_params_init(&gp);
    gp.max_tokens = 100000;
    gp.ignore_eos = true;
    gp.prompt = "Once upon a time";
    struct sk_generate_result gr;
    struct sk_error e = {0};
    bool from_other = rng_next(rng) & 1;
    int n = 0;
    struct cancel_arg ca = {.session = s};
    atomic_init(&ca.done, false);
    pthread_t th;
    if (from_other) pthread_create(&th, NULL, cancel_later, &ca);
    int rc = sk_client_generate(c, s, &gp, count_tokens, from_other ? NULL : &n, &gr, &e);
    atomic_store(&ca.done, true);
    if (from_other) pthread_join(th, NULL);
    check_rc(rc, &e, "generate");
    if (rc == 0 && strcmp(gr.stop, "cancelled") != 0)
      failure("cancelled generate ended with '%s' after %llu tokens", gr.stop,
              (unsigned long long)gr.n_tokens);
    if (rc == 0) atomic_fetch_add(&g_cancelled_gen, 1);
    close_session(c, s);
  }
  sk_client_free(c);
}

/* A raw request frame {"id", "op", "session"?, extra...}. */
static size_t raw_request(uint8_t *out, size_t cap, uint64_t id, const char *op, uint64_t session,
                          uint32_t max_tokens) {
  struct sk_test_req r;
  sk_test_req_init(&r);
  uint32_t n = 2 + (session != 0) + 2 * (max_tokens != 0);
  msgpack_pack_map(&r.pk, n);
  sk_test_req_key(&r, "id");
  msgpack_pack_uint64(&r.pk, id);
  sk_test_req_key(&r, "op");
  sk_test_req_key(&r, op);
  if (session) {
    sk_test_req_key(&r, "session");
    msgpack_pack_uint64(&r.pk, session);
  }
  if (max_tokens) {
    sk_test_req_key(&r, "max_tokens");
    msgpack_pack_uint32(&r.pk, max_tokens);
    sk_test_req_key(&r, "ignore_eos");
    msgpack_pack_true(&r.pk);
  }
  size_t len;
  const uint8_t *f = sk_test_req_frame(&r, &len);
  if (len > cap) len = 0;
  else memcpy(out, f, len);
  sk_test_req_free(&r);
  return len;
}

static int raw_connect(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memcpy(a.sun_path, g_d.socket, sizeof a.sun_path);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    failure("raw connect: %s", strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  struct timeval tv = {.tv_sec = 30};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/* A session opened (and later closed) on a libsinkd control connection,
 * used by a raw connection that misbehaves. */
static void run_vanisher(uint64_t *rng) {
  struct sk_client *ctl = client_connect();
  if (!ctl) return;
  uint64_t s = open_session(ctl);
  int fd = s ? raw_connect() : -1;
  if (fd >= 0) {
    uint8_t f[256];
    size_t n = raw_request(f, sizeof f, 1, "generate", s, 100000);
    /* generate needs input: give it a prompt first through append. */
    struct sk_error e = {0};
    check_rc(sk_client_append_text(ctl, s, "Once", 4, SK_BOS_DEFAULT, NULL, &e), &e, "append");
    sk_test_try_write_all(fd, f, n);
    atomic_fetch_add(&g_requests, 1);
    uint8_t buf[512];
    size_t want = 1 + rng_next(rng) % 2000, got = 0;
    while (got < want) {
      ssize_t r = read(fd, buf, sizeof buf);
      if (r <= 0) break;
      got += (size_t)r;
    }
    if (rng_next(rng) & 1) {
      struct linger lg = {.l_onoff = 1, .l_linger = 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
  }
  if (s) {
    /* The generation of a client that left ends; the session is still
     * usable, then closed (busy while the cancel lands is fine). */
    struct sk_session_stats st;
    struct sk_error e = {0};
    check_rc(sk_client_session_stats(ctl, s, &st, &e), &e, "stats");
    close_session(ctl, s);
  }
  sk_client_free(ctl);
}

static void run_nonreader(uint64_t *rng) {
  struct sk_client *ctl = client_connect();
  if (!ctl) return;
  uint64_t s = open_session(ctl);
  int fd = s ? raw_connect() : -1;
  if (fd >= 0) {
    struct sk_error e = {0};
    check_rc(sk_client_append_text(ctl, s, "Once", 4, SK_BOS_DEFAULT, NULL, &e), &e, "append");
    uint8_t f[256];
    size_t n = raw_request(f, sizeof f, 1, "generate", s, 100000);
    int flags = MSG_NOSIGNAL | MSG_DONTWAIT;
    send(fd, f, n, flags);
    for (int i = 0; i < 200; i++) {
      n = raw_request(f, sizeof f, 2 + (uint64_t)i, "ping", 0, 0);
      if (send(fd, f, n, flags) < 0) break; /* our buffer is full: fine */
    }
    atomic_fetch_add(&g_requests, 201);
    double hold = 1.0 + (double)(rng_next(rng) % 2000) / 1000.0;
    double t0 = sk_test_now();
    while (sk_test_now() - t0 < hold && time_left()) usleep(50000);
    close(fd);
  }
  if (s) close_session(ctl, s);
  sk_client_free(ctl);
}

/* Reads one frame a byte per read(); returns the body length, 0 if the
 * connection ended. */
static uint32_t read_frame_bytewise(int fd, uint8_t *body, size_t cap) {
  uint8_t hdr[4];
  for (int i = 0; i < 4; i++)
    if (read(fd, hdr + i, 1) != 1) return 0;
  uint32_t n = sk_frame_header_get(hdr);
  if (n == 0 || n > cap) {
    failure("trickler: frame of %u bytes", n);
    return 0;
  }
  for (uint32_t i = 0; i < n; i++)
    if (read(fd, body + i, 1) != 1) return 0;
  return n;
}

static void run_trickler(uint64_t *rng) {
  (void)rng;
  struct sk_client *ctl = client_connect();
  if (!ctl) return;
  uint64_t s = open_session(ctl);
  int fd = s ? raw_connect() : -1;
  if (fd >= 0) {
    struct sk_error e = {0};
    check_rc(sk_client_append_text(ctl, s, "Once", 4, SK_BOS_DEFAULT, NULL, &e), &e, "append");
    uint8_t f[256];
    size_t n = raw_request(f, sizeof f, 7, "generate", s, 64);
    sk_test_try_write_all(fd, f, n);
    uint8_t body[4096];
    int events = 0;
    for (;;) {
      uint32_t len = read_frame_bytewise(fd, body, sizeof body);
      if (len == 0) {
        failure("trickler: connection ended before the reply");
        break;
      }
      struct sk_msg m;
      if (sk_msg_parse(body, len, &m, &e) < 0) {
        failure("trickler: bad frame: %s", e.message);
        break;
      }
      bool final = sk_msg_get(&m.root, "event") == NULL;
      const msgpack_object *ok = sk_msg_get(&m.root, "ok");
      bool good = ok && ok->type == MSGPACK_OBJECT_BOOLEAN && ok->via.boolean;
      sk_msg_free(&m);
      if (!final) {
        events++;
        atomic_fetch_add(&g_tokens_seen, 1);
        continue;
      }
      atomic_fetch_add(&g_requests, 1);
      if (!good || events != 64) failure("trickler: final reply ok=%d after %d events", good, events);
      break;
    }
    close(fd);
  }
  if (s) close_session(ctl, s);
  sk_client_free(ctl);
}

static void run_pipeliner(uint64_t *rng) {
  int fd = raw_connect();
  if (fd < 0) return;
  static const char *const ops[] = {"ping", "hello", "list", "stats", "tokenize", "nope"};
  uint8_t burst[BURST * 128];
  size_t len = 0;
  uint64_t base = rng_next(rng) % 1000000;
  for (int i = 0; i < BURST; i++) {
    const char *op = ops[rng_next(rng) % 6];
    if (!strcmp(op, "tokenize")) {
      struct sk_test_req r;
      sk_test_req_init(&r);
      msgpack_pack_map(&r.pk, 3);
      sk_test_req_key(&r, "id");
      msgpack_pack_uint64(&r.pk, base + (uint64_t)i);
      sk_test_req_key(&r, "op");
      sk_test_req_key(&r, "tokenize");
      sk_test_req_key(&r, "text");
      sk_test_req_key(&r, "Once upon a time there was a little girl");
      size_t n;
      const uint8_t *f = sk_test_req_frame(&r, &n);
      memcpy(burst + len, f, n);
      len += n;
      sk_test_req_free(&r);
    } else {
      len += raw_request(burst + len, sizeof burst - len, base + (uint64_t)i, op, 0, 0);
    }
  }
  sk_test_write_all(fd, burst, len);
  bool seen[BURST] = {false};
  for (int i = 0; i < BURST; i++) {
    uint8_t *body = NULL;
    uint32_t n = 0;
    if (sk_test_read_frame(fd, &body, &n) != 1) {
      failure("pipeliner: reply %d missing", i);
      break;
    }
    struct sk_msg m;
    struct sk_error e;
    uint64_t id = 0;
    if (sk_msg_parse(body, n, &m, &e) < 0 || sk_msg_need_u64(&m.root, "id", UINT64_MAX, &id, &e) < 0 ||
        id < base || id >= base + BURST || seen[id - base])
      failure("pipeliner: bad reply %d", i);
    else
      seen[id - base] = true;
    const msgpack_object *err = sk_msg_get(&m.root, "error");
    if (err) {
      const char *code;
      size_t cl;
      if (sk_msg_need_str(err, "code", &code, &cl, &e) == 0 &&
          !(cl == 10 && !memcmp(code, "unknown_op", 10)))
        failure("pipeliner: error %.*s", (int)cl, code);
    }
    sk_msg_free(&m);
    free(body);
    atomic_fetch_add(&g_requests, 1);
  }
  close(fd);
  usleep((useconds_t)(50000 + rng_next(rng) % 100000));
}

static void *client_thread(void *arg) {
  int i = (int)(intptr_t)arg;
  enum kind k = kind_of(i);
  uint64_t rng = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(i + 1) * 0xbf58476d1ce4e5b9ULL;
  /* Ramp up: the clients arrive over the first second, not all in the
   * same millisecond. */
  double start = g_start + (double)i / N_CLIENTS;
  while (sk_test_now() < start) usleep(1000);
  while (time_left()) {
    switch (k) {
    case K_NORMAL: run_normal(&rng); break;
    case K_CANCELLER: run_canceller(&rng); break;
    case K_VANISHER: run_vanisher(&rng); break;
    case K_NONREADER: run_nonreader(&rng); break;
    case K_TRICKLER: run_trickler(&rng); break;
    case K_PIPELINER: run_pipeliner(&rng); break;
    default: break;
    }
    atomic_fetch_add(&g_rounds[k], 1);
    /* A moment between rounds (0..20 ms): 256 clients at once, not 256
     * loops as fast as the test machine can spin. */
    usleep((useconds_t)(rng_next(&rng) % 20000));
  }
  return NULL;
}

/* ---- monitor ------------------------------------------------------------- */

struct monitor {
  atomic_int stop;
  unsigned long pings;
  double worst_ms;
  double sum_ms;
  unsigned long over_bound;
  long peak_rss, peak_fds;
  bool died;
};

static void *monitor_thread(void *arg) {
  struct monitor *m = arg;
  /* The monitor measures the daemon, not its own wait for a CPU among
   * 256 client threads of this process: ahead of them when allowed
   * (root; the daemon keeps its ordinary priority). */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), -5);
  struct sk_client *c = client_connect();
  if (!c) return NULL;
  double last_sample = 0;
  while (!m->stop) {
    double t0 = sk_test_now();
    struct sk_error e = {0};
    int rc = sk_client_ping(c, &e);
    double dt = (sk_test_now() - t0) * 1e3;
    if (rc < 0) {
      failure("monitor ping: %s", e.message);
      m->died = !sk_test_daemon_alive(&g_d);
      break;
    }
    m->pings++;
    m->sum_ms += dt;
    if (dt > m->worst_ms) m->worst_ms = dt;
    if (dt > PING_BOUND_MS) m->over_bound++;
    if (dt > PING_BOUND_MS / 2)
      print_message("slow ping: %.1f ms at %.2f s into the run\n", dt, t0 - g_start);
    if (t0 - last_sample > 0.1) {
      last_sample = t0;
      long rss = sk_test_proc_rss_kib(g_d.pid), fds = sk_test_proc_fds(g_d.pid);
      if (rss > m->peak_rss) m->peak_rss = rss;
      if (fds > m->peak_fds) m->peak_fds = fds;
    }
    usleep(10000);
  }
  sk_client_free(c);
  return NULL;
}

/* ---- the test ------------------------------------------------------------ */

static void warm_up(void) {
  /* One of everything, so that lazily created things (thread pool,
   * arenas, scratch) exist before the baseline is taken. */
  uint64_t rng = 1;
  for (int k = 0; k < K__N; k++) {
    g_deadline = sk_test_now() + 1;
    switch (k) {
    case K_NORMAL: run_normal(&rng); break;
    case K_CANCELLER: run_canceller(&rng); break;
    case K_TRICKLER: run_trickler(&rng); break;
    case K_PIPELINER: run_pipeliner(&rng); break;
    default: break;
    }
  }
}

/* Closes whatever sessions are left (there should be none). */
static size_t close_leftovers(void) {
  struct sk_client *c = client_connect();
  if (!c) return 0;
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  struct sk_error e = {0};
  assert_int_equal(sk_client_list(c, &rows, &n, &e), 0);
  for (size_t i = 0; i < n; i++) sk_client_close_session(c, rows[i].session, NULL);
  free(rows);
  sk_client_free(c);
  return n;
}

static void test_load(void **state) {
  (void)state;
  const char *env = getenv("SK_LOAD_SECONDS");
  double seconds = env ? atof(env) : 20.0;
  if (seconds <= 0) seconds = 20.0;

  warm_up();
  usleep(500000);
  long base_rss = sk_test_proc_rss_kib(g_d.pid);
  long base_fds = sk_test_proc_fds(g_d.pid);
  sk_test_proc_reset_hwm(g_d.pid);

  struct monitor mon = {0};
  pthread_t mon_th, th[N_CLIENTS];
  pthread_create(&mon_th, NULL, monitor_thread, &mon);
  double t0 = sk_test_now();
  g_start = t0;
  g_deadline = t0 + seconds;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (int i = 0; i < N_CLIENTS; i++)
    assert_int_equal(pthread_create(&th[i], &attr, client_thread, (void *)(intptr_t)i), 0);
  for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
  double took = sk_test_now() - t0;
  mon.stop = 1;
  pthread_join(mon_th, NULL);
  assert_true(sk_test_daemon_alive(&g_d));
  long peak_hwm = sk_test_proc_hwm_kib(g_d.pid);

  /* The clients are gone: descriptors back to the baseline at once,
   * memory once the loop has closed everything. */
  size_t leftovers = close_leftovers();
  long rss = 0, fds = 0;
  double t1 = sk_test_now();
  do {
    usleep(100000);
    rss = sk_test_proc_rss_kib(g_d.pid);
    fds = sk_test_proc_fds(g_d.pid);
  } while ((fds != base_fds || rss > base_rss + RSS_SLACK_KIB) && sk_test_now() - t1 < 10);

  struct sk_client *c = client_connect();
  struct sk_daemon_stats ds;
  struct sk_error e = {0};
  assert_non_null(c);
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  sk_client_free(c);

  unsigned long rounds = 0;
  for (int k = 0; k < K__N; k++) rounds += g_rounds[k];
  print_message("figures: load: %d clients for %.1f s: %lu rounds (", N_CLIENTS, took, rounds);
  for (int k = 0; k < K__N; k++)
    print_message("%s %lu%s", k_kind_names[k], (unsigned long)g_rounds[k], k + 1 < K__N ? ", " : ")\n");
  print_message("figures: load: %lu requests, %lu busy replies, %lu generations cancelled, %llu "
                "tokens generated by the daemon, %lu token events read\n",
                (unsigned long)g_requests, (unsigned long)g_busy, (unsigned long)g_cancelled_gen,
                (unsigned long long)ds.tokens_generated, (unsigned long)g_tokens_seen);
  print_message("figures: load: %lu pings, worst %.2f ms, mean %.2f ms, %lu over %.0f ms\n",
                mon.pings, mon.worst_ms, mon.pings ? mon.sum_ms / (double)mon.pings : 0.0,
                mon.over_bound, PING_BOUND_MS);
  print_message("figures: load: daemon peak RSS %ld KiB (VmHWM); RSS baseline %ld KiB, after %ld "
                "KiB; fds baseline %ld, peak %ld, after %ld; %zu sessions left over\n",
                peak_hwm, base_rss, rss, base_fds, mon.peak_fds, fds, leftovers);
  print_message("figures: load: daemon crashes 0 (alive throughout, exit status checked at the end)\n");

  if (g_failures) fail_msg("%lu failures; first: %s", (unsigned long)g_failures, g_first_failure);
  assert_false(mon.died);
  assert_true(mon.pings > seconds * 20);
  /* The ping latency (bound PING_BOUND_MS) is a figure, printed above,
   * not an assertion: a timing target belongs in a benchmark, not in a
   * test that must not flake on a 2-core machine shared with other work
   * (worst pings seen: 15.6 ms in a full CI run; 78 ms with the machine
   * loaded 3x over). What is asserted: pings kept being answered all
   * along. */
  assert_int_equal(fds, base_fds);
  assert_int_equal(leftovers, 0);
  for (int k = 0; k < K__N; k++) assert_true(g_rounds[k] > 0);
  if (!sk_test_under_tool()) assert_true(rss <= base_rss + RSS_SLACK_KIB);
}

static int setup(void **state) {
  (void)state;
  const char *extra[] = {"--max-sessions", "1024", "--max-user-sessions", "1024",
                         "--max-clients", "2048", NULL};
  sk_test_daemon_start(&g_d, extra);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  int st = sk_test_daemon_stop(&g_d, 60000);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "sinkd ended with %s %d\n", WIFSIGNALED(st) ? "signal" : "status",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    return -1;
  }
  return 0;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_load)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
