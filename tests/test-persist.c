/* Sessions survive the daemon: the real sinkd, killed with SIGKILL and
 * restarted on the same state directory (tmpfs), driven through libsinkd
 * (testpersist.h).
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
 *   - a step that ends in EOS committed whole.
 *
 * test-persist-images.c has the KV types, fork, export/import, limits.
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
#include "testpersist.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_greedy_kill_resume, test_teardown),
      cmocka_unit_test_teardown(test_kill_closes_temporary, test_teardown),
      cmocka_unit_test_teardown(test_kill_mid_generate, test_teardown),
      cmocka_unit_test_teardown(test_kill_50, test_teardown),
      cmocka_unit_test_teardown(test_corrupted_set_aside, test_teardown),
      cmocka_unit_test_teardown(test_eos_step_committed, test_teardown),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
