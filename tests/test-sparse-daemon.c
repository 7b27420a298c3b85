/* MLP contextual sparsity through a live daemon (stories260K, a
 * calibration made by `sinkd --calibrate` in the test): a sparse
 * session's greedy tokens are the same when it generates alone and while
 * dense sessions generate at the same time (their decode steps batched
 * with its own), and its tokens did run sparse. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"

#define N_GEN 48u   /* tokens the sparse session generates */
#define LEVEL 0.5   /* its sparsity (a level the calibration writes) */
#define N_DENSE 2u  /* dense sessions generating beside it */

static const char *const PROMPT = "Once upon a time, there was a little girl named Lily. She";

static struct {
  char *dir;    /* sk_test_tmpdir */
  char *calib;  /* the calibration file in it */
} fx;

static int setup(void **state) {
  (void)state;
  fx.dir = sk_test_tmpdir();
  const size_t n = strlen(fx.dir) + 32;
  fx.calib = malloc(n);
  snprintf(fx.calib, n, "%s/calib.txt", fx.dir);
  char *text = sk_test_shared_path("data/stories-sampled.txt");
  const char *sinkd = getenv("SK_SINKD");
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "'%s' --config /dev/null --model '%s' --threads 1 --calibrate '%s' "
           "--sparsity-file '%s' 2>&1",
           sinkd ? sinkd : "sinkd", sk_test_model_path(), text, fx.calib);
  free(text);
  int status = -1;
  char *out = sk_test_run_capture(cmd, &status);
  if (status != 0) fprintf(stderr, "calibration failed (%d): %s\n%s\n", status, cmd, out);
  free(out);
  return status == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  unlink(fx.calib);
  rmdir(fx.dir);
  free(fx.calib);
  free(fx.dir);
  return 0;
}

struct tokens {
  int32_t id[N_GEN];
  size_t n;
};

static int on_token(void *user, const struct sk_token_event *ev) {
  struct tokens *t = user;
  if (t->n < N_GEN) t->id[t->n] = ev->token;
  t->n++;
  return 0;
}

/* Opens a streaming session at `sparsity` and generates N_GEN greedy
 * tokens after PROMPT; returns the session (left open). */
static uint64_t sparse_run(struct sk_client *c, struct tokens *out) {
  struct sk_error e = {0};
  struct sk_open_params op = {.policy = "streaming", .sparsity = LEVEL};
  struct sk_open_result o;
  if (sk_client_open(c, &op, &o, &e) < 0) fail_msg("open: %s", e.message);
  struct sk_generate_params gp;
  sk_test_greedy_params(&gp, N_GEN);
  gp.prompt = PROMPT;
  struct sk_generate_result r;
  memset(out, 0, sizeof *out);
  if (sk_client_generate(c, o.session, &gp, on_token, out, &r, &e) < 0)
    fail_msg("generate: %s", e.message);
  assert_string_equal(r.stop, "length");
  assert_int_equal(out->n, N_GEN);
  return o.session;
}

/* A dense session generating on its own connection until told to stop. */
struct dense {
  const struct sk_test_daemon *d;
  const char *prompt;
  atomic_uint n;       /* tokens so far */
  atomic_bool stop;    /* cancel at the next token */
  atomic_bool done;    /* its generate returned */
  char stop_reason[SK_CLIENT_NAME_MAX];
  int rc;
};

static int on_dense(void *user, const struct sk_token_event *ev) {
  (void)ev;
  struct dense *g = user;
  atomic_fetch_add(&g->n, 1);
  return atomic_load(&g->stop) ? 1 : 0;
}

static void *dense_main(void *arg) {
  struct dense *g = arg;
  struct sk_client *c = sk_test_connect(g->d->socket);
  struct sk_error e = {0};
  struct sk_open_params op = {.policy = "streaming"};
  struct sk_open_result o;
  g->rc = sk_client_open(c, &op, &o, &e);
  if (g->rc == 0) {
    struct sk_generate_params gp;
    sk_test_greedy_params(&gp, 1000000);
    gp.prompt = g->prompt;
    struct sk_generate_result r;
    g->rc = sk_client_generate(c, o.session, &gp, on_dense, g, &r, &e);
    snprintf(g->stop_reason, sizeof g->stop_reason, "%s", r.stop);
  }
  atomic_store(&g->done, true);
  sk_client_free(c);
  return NULL;
}

static void test_sparse_alone_and_batched(void **state) {
  (void)state;
  const char *extra[] = {"--sparsity-file", fx.calib, NULL};
  struct sk_test_daemon d;
  sk_test_daemon_start(&d, extra);
  struct sk_client *c = sk_test_connect(d.socket);
  struct sk_error e = {0};

  /* alone */
  struct tokens alone;
  const uint64_t s1 = sparse_run(c, &alone);
  struct sk_session_stats st;
  assert_int_equal(sk_client_session_stats(c, s1, &st, &e), 0);
  /* the prompt's prefill runs dense; the decode steps, one per generated
   * token (each is fed back into the cache), run sparse */
  assert_true(st.sparsity == LEVEL);
  assert_int_equal(st.sparse_tokens, N_GEN);
  assert_true(st.n_sparse_layers > 0);
  for (size_t l = 0; l < st.n_sparse_layers; l++)
    assert_true(st.sparsity_measured[l] > 0.2 && st.sparsity_measured[l] < 0.8);
  assert_int_equal(sk_client_close_session(c, s1, &e), 0);

  /* the same while dense sessions generate: wait until each has tokens,
   * run the sparse session, and check they were still generating */
  static const char *const prompts[N_DENSE] = {"The cat sat on the mat and",
                                               "One day, a boy went to the park"};
  struct dense g[N_DENSE];
  pthread_t th[N_DENSE];
  for (size_t i = 0; i < N_DENSE; i++) {
    memset(&g[i], 0, sizeof g[i]);
    g[i].d = &d;
    g[i].prompt = prompts[i];
    assert_int_equal(pthread_create(&th[i], NULL, dense_main, &g[i]), 0);
  }
  const double t0 = sk_test_now();
  for (size_t i = 0; i < N_DENSE; i++)
    while (atomic_load(&g[i].n) < 2 && !atomic_load(&g[i].done)) {
      if (sk_test_now() - t0 > 60) fail_msg("dense session %zu produced no tokens", i);
      usleep(1000);
    }
  unsigned before[N_DENSE];
  for (size_t i = 0; i < N_DENSE; i++) before[i] = atomic_load(&g[i].n);
  struct tokens batched;
  const uint64_t s2 = sparse_run(c, &batched);
  for (size_t i = 0; i < N_DENSE; i++) {
    assert_false(atomic_load(&g[i].done));
    /* it generated while the sparse session did */
    assert_true(atomic_load(&g[i].n) > before[i]);
    atomic_store(&g[i].stop, true);
  }
  for (size_t i = 0; i < N_DENSE; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(g[i].rc, 0);
    assert_string_equal(g[i].stop_reason, "cancelled");
  }
  assert_int_equal(sk_client_session_stats(c, s2, &st, &e), 0);
  assert_int_equal(st.sparse_tokens, N_GEN);
  for (size_t k = 0; k < N_GEN; k++)
    if (alone.id[k] != batched.id[k])
      fail_msg("token %zu: %d alone, %d batched with dense sessions", k, alone.id[k],
               batched.id[k]);
  assert_int_equal(sk_client_close_session(c, s2, &e), 0);
  sk_client_free(c);
  const int status = sk_test_daemon_stop(&d, 10000);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sparse_alone_and_batched),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
