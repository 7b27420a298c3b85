/* Thread pool (see pool.h).
 *
 * A run publishes fn and ctx, then one 64-bit claim word that holds the
 * run's generation tag, its task count and the next task to hand out
 * (SK__CLAIM). Tasks are claimed by compare-and-swap on that word, so a
 * claim succeeds only if, at that instant, the run it was read for is
 * still the current one and still has the task: the count comes from the
 * same word, never from a field a later run may already have rewritten.
 * (With the count in a field of its own, a worker that read the next
 * run's larger count while the claim still carried the old tag claimed a
 * task past the end of the old run, ran it with a stale context and
 * counted it as finished in the next run: the batched forward pass then
 * went on while that task still wrote into it.)
 *
 * The caller claims tasks too and then waits only until every task is
 * finished, never for a worker that has not claimed anything: a
 * descheduled worker (a busy machine, more threads than cores) costs the
 * run nothing. */
#include "model/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SK__PAUSE() _mm_pause()
#else
#define SK__PAUSE() ((void)0)
#endif

/* The claim word: a 24-bit generation tag, a 20-bit task count and the
 * 20-bit index of the next task. Runs of more tasks are run by the
 * caller alone (no forward pass comes near: its runs have at most a few
 * hundred tasks). A tag repeats after 2^24 runs, far longer than any
 * worker stays between reading a claim and trying it. */
#define SK__IDX_BITS 20u
#define SK__IDX_MAX ((1u << SK__IDX_BITS) - 1u)
#define SK__TAG_MASK 0xffffffu
#define SK__CLAIM(tag, n, next)                                                      \
  (((uint64_t)((tag) & SK__TAG_MASK) << (2 * SK__IDX_BITS)) | ((uint64_t)(n) << SK__IDX_BITS) | \
   (uint64_t)(next))
#define SK__CLAIM_TAG(c) ((uint32_t)((c) >> (2 * SK__IDX_BITS)) & SK__TAG_MASK)
#define SK__CLAIM_N(c) ((uint32_t)((c) >> SK__IDX_BITS) & SK__IDX_MAX)
#define SK__CLAIM_NEXT(c) ((uint32_t)(c) & SK__IDX_MAX)

/* How long an idle worker spins before it sleeps: longer than the gap
 * between two runs of a forward pass (a few microseconds of norms and
 * bookkeeping) and between two decode steps (sampling, events), short
 * enough that an idle daemon stops burning a core at once. */
#define SK__SPIN_NS 200000ull

struct sk__worker {
  struct sk_pool *pool;
  uint32_t index;
  pthread_t thread;
};

struct sk_pool {
  uint32_t n_threads;
  struct sk__worker *workers; /* (n_threads - 1) */

  /* The current run; written by the caller before gen is bumped. */
  _Atomic(sk_pool_fn) fn;
  _Atomic(void *) ctx;
  atomic_uint_fast64_t claim; /* SK__CLAIM(tag, n_tasks, next task) */
  atomic_uint n_finished;     /* tasks of the current run done */
  atomic_uint gen;            /* bumped to start a run */
  atomic_bool stop;

  pthread_mutex_t lock;
  pthread_cond_t cond;
  uint32_t n_sleeping; /* under lock */
};

static uint64_t sk__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Claims and runs tasks of generation g until none is left. fn and ctx
 * are read after a claim word tagged g was acquired, so they are g's or
 * a later run's; a later run starts only once every task of g was
 * claimed and finished, and then no claim tagged g can succeed, so a
 * task that is claimed runs with g's fn and ctx. */
static void sk__run_tasks(struct sk_pool *p, uint32_t g, uint32_t thread) {
  const uint32_t tag = g & SK__TAG_MASK;
  uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
  if (SK__CLAIM_TAG(c) != tag) return;
  sk_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
  void *ctx = atomic_load_explicit(&p->ctx, memory_order_relaxed);
  for (;;) {
    if (SK__CLAIM_TAG(c) != tag || SK__CLAIM_NEXT(c) >= SK__CLAIM_N(c)) return;
    if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel,
                                               memory_order_acquire))
      continue; /* c now holds the current value */
    fn(ctx, SK__CLAIM_NEXT(c), thread);
    atomic_fetch_add_explicit(&p->n_finished, 1, memory_order_release);
    c = atomic_load_explicit(&p->claim, memory_order_acquire);
  }
}

static void *sk__worker_main(void *arg) {
  struct sk__worker *w = arg;
  struct sk_pool *p = w->pool;
  /* The generation the pool was created with, not the current one: a run
   * may already have started before this thread got to run. */
  uint32_t seen = 0;
  for (;;) {
    /* Wait for the next run: spin, then sleep. */
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (g == seen) {
      uint64_t start = sk__now_ns();
      for (uint32_t i = 1;; i++) {
        SK__PAUSE();
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
        /* Let the loop thread (replies, token events) have the core now
         * and then: a yield returns at once when nothing else waits, and
         * the caller never waits for a worker that has not started. */
        if (i % 64 == 0) sched_yield();
        if (i % 256 == 0 && sk__now_ns() - start > SK__SPIN_NS) {
          pthread_mutex_lock(&p->lock);
          p->n_sleeping++;
          while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
                 !atomic_load_explicit(&p->stop, memory_order_relaxed))
            pthread_cond_wait(&p->cond, &p->lock);
          p->n_sleeping--;
          pthread_mutex_unlock(&p->lock);
          break;
        }
      }
    }
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
    seen = g;
    sk__run_tasks(p, g, w->index);
  }
}

int sk_pool_new(uint32_t n_threads, struct sk_pool **ret, struct sk_error *err) {
  if (n_threads < 1 || n_threads > SK_POOL_MAX_THREADS)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "threads %u is outside 1..%u", n_threads,
                        SK_POOL_MAX_THREADS);
  struct sk_pool *p = calloc(1, sizeof *p);
  if (!p) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate a thread pool");
  p->n_threads = 1;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  atomic_init(&p->fn, NULL);
  atomic_init(&p->ctx, NULL);
  atomic_init(&p->claim, 0);
  atomic_init(&p->n_finished, 0);
  atomic_init(&p->gen, 0);
  atomic_init(&p->stop, false);
  if (n_threads > 1) {
    p->workers = calloc(n_threads - 1, sizeof *p->workers);
    if (!p->workers) {
      sk_pool_free(p);
      return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %u workers", n_threads - 1);
    }
  }
  for (uint32_t i = 1; i < n_threads; i++) {
    struct sk__worker *w = &p->workers[i - 1];
    w->pool = p;
    w->index = i;
    int rc = pthread_create(&w->thread, NULL, sk__worker_main, w);
    if (rc != 0) {
      sk_pool_free(p);
      return sk_error_set(err, SK_ERR_INTERNAL, "cannot start compute thread %u: %s", i,
                          strerror(rc));
    }
    p->n_threads++;
  }
  *ret = p;
  return 0;
}

void sk_pool_free(struct sk_pool *p) {
  if (!p) return;
  atomic_store(&p->stop, true);
  pthread_mutex_lock(&p->lock);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  for (uint32_t i = 1; i < p->n_threads; i++) pthread_join(p->workers[i - 1].thread, NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->cond);
  free(p->workers);
  free(p);
}

uint32_t sk_pool_threads(const struct sk_pool *p) { return p ? p->n_threads : 1; }

void sk_pool_run(struct sk_pool *p, sk_pool_fn fn, void *ctx, uint32_t n_tasks) {
  if (n_tasks == 0) return;
  if (!p || p->n_threads == 1 || n_tasks == 1 || n_tasks > SK__IDX_MAX) {
    for (uint32_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
    return;
  }
  /* The previous run is over (all its tasks finished): nobody can claim
   * anything until the new tag is published. */
  const uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
  atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
  atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&p->n_finished, 0, memory_order_relaxed);
  atomic_store_explicit(&p->claim, SK__CLAIM(g, n_tasks, 0), memory_order_release);
  atomic_store_explicit(&p->gen, g, memory_order_release);
  pthread_mutex_lock(&p->lock);
  if (p->n_sleeping) pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  sk__run_tasks(p, g, 0);
  for (uint32_t i = 1; atomic_load_explicit(&p->n_finished, memory_order_acquire) < n_tasks; i++) {
    SK__PAUSE();
    if (i % 1024 == 0) sched_yield(); /* a worker holding a task was descheduled */
  }
}
