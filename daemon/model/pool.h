/* A fixed pool of compute threads for the forward pass.
 *
 * The thread that calls sk_pool_run is one of the pool's n threads: it
 * runs tasks too, so a pool of 1 starts no thread at all. Tasks are
 * handed out one at a time from a shared counter (a thread that got a
 * slow core simply takes fewer). Between runs the workers spin for a
 * short while (a forward pass starts a run every few microseconds) and
 * then sleep on a condition variable, so an idle daemon uses no CPU.
 *
 * Every matrix product and the attention of a forward pass run on this
 * pool; sinkd links no BLAS library that could start threads of its own.
 *
 * Not reentrant: one sk_pool_run at a time, from one thread.
 */
#ifndef SK_POOL_H
#define SK_POOL_H

#include <stdint.h>

#include "sinkd/protocol.h"

/* Most threads a pool may have (far above any sensible setting; bounds
 * the per-thread scratch). */
#define SK_POOL_MAX_THREADS 256u

struct sk_pool;

/* Runs task `task` (0 <= task < n_tasks) on pool thread `thread`
 * (0 <= thread < n_threads; 0 is the caller). */
typedef void (*sk_pool_fn)(void *ctx, uint32_t task, uint32_t thread);

/* Starts n_threads - 1 workers (1 <= n_threads <= SK_POOL_MAX_THREADS).
 * Errors: -SK_ERR_BAD_REQUEST (n_threads out of range), -SK_ERR_NO_MEMORY,
 * -SK_ERR_INTERNAL (thread creation; message has the reason). */
int sk_pool_new(uint32_t n_threads, struct sk_pool **ret, struct sk_error *err);
/* Stops and joins the workers; NULL is fine. */
void sk_pool_free(struct sk_pool *p);
/* Threads of the pool (1 for NULL). */
uint32_t sk_pool_threads(const struct sk_pool *p);
/* Runs fn for every task in [0, n_tasks) and returns once all are done.
 * p may be NULL: the caller runs every task as thread 0. */
void sk_pool_run(struct sk_pool *p, sk_pool_fn fn, void *ctx, uint32_t n_tasks);

#endif
