/* The scheduler: the compute thread, which runs every append and
 * generate job off the loop thread. Each turn it takes every active job that is not
 * paused and runs ONE forward pass for all of them (sk_model_forward_batch):
 * one decoded token for each generate, a chunk of input for each append
 * (or generate prompt), at most max_batch rows in all. Decoding jobs get a
 * row each first, but a quarter of the rows stay for input while any job
 * has some, and the input rows are shared evenly, so a long prefill never
 * stops other sessions' tokens and never starves; while a job generates,
 * the input chunks fill only what its tokens leave of step_tokens, a
 * prompt token counting more the more positions its attention reads, so
 * that a long prefill slows the generating sessions' tokens only a few
 * times; who goes first rotates every turn. The forward pass runs on a
 * pool of n_threads threads (this thread and n_threads - 1 workers).
 * Results go back to the loop thread as events through a uv_async_t.
 *
 * Once a streaming or window session's cache is full, its prefill goes
 * SK_KV_SPARE_SLOTS tokens per pass (the store's crash-consistent budget),
 * h2o one token per pass with one eviction each; before that,
 * in chunks of the free slots. An append with want_logprobs also scores
 * every token by the logits that preceded it. After each pass every
 * session's attention diagnostics are recorded (sk_session_attn_record).
 *
 * It changes a session's cache and state only through the session's step
 * API (session.h), inside a step of its object (store.h); it writes no
 * field of a session and no metadata of its object.
 *
 * A job's session must have no other job submitted (the loop serializes
 * jobs per session).
 */
#ifndef SK_SCHEDULER_H
#define SK_SCHEDULER_H

#include <stdint.h>
#include <uv.h>

#include "model/model.h"
#include "session/session.h"
#include "model/tokenizer.h"

enum sk_event_kind {
  SK_EVENT_TOKEN, /* a generated token */
  SK_EVENT_DONE,  /* the job finished: result fields of the job are set */
};

struct sk_event {
  enum sk_event_kind kind;
  struct sk_job *job;
  int32_t token;
  uint32_t n_top;
  int32_t top_id[SK_WIRE_MAX_TOP];   /* highest logits first, ties lower id */
  float top_logit[SK_WIRE_MAX_TOP];
  bool has_logprob;             /* the job asked for log-probabilities */
  float logprob;                /* ln p(token | before) */
  uint32_t n_top_logprobs;      /* the first n of top_id, their ln p in */
  float top_logprob[SK_WIRE_MAX_TOP];
  struct sk_event *next;
  size_t text_len;
  char text[];                  /* (text_len) valid UTF-8 */
};

/* Called on the loop thread for each event, in order; the callee owns ev
 * (free() it). For SK_EVENT_DONE the job is no longer used by the compute
 * thread. */
typedef void (*sk_scheduler_event_cb)(void *user, struct sk_event *ev);

struct sk_scheduler;

/* Starts the thread. model, tokenizer and table must outlive it.
 * max_batch: rows (tokens) of one forward pass; step_tokens: the token
 * budget of a pass while a job generates (1..max_batch; larger acts as
 * max_batch); max_ctx: largest cache
 * capacity a session may have; n_threads: compute threads in all
 * (1..SK_POOL_MAX_THREADS). Errors: -SK_ERR_BAD_REQUEST (n_threads),
 * -SK_ERR_NO_MEMORY, -SK_ERR_INTERNAL (thread creation). */
int sk_scheduler_new(uv_loop_t *loop, const struct sk_model *m,
                     const struct sk_tokenizer *tok,
                     struct sk_session_table *table, uint32_t max_batch,
                     uint32_t step_tokens, uint32_t max_ctx, uint32_t n_threads,
                     sk_scheduler_event_cb cb, void *user, struct sk_scheduler **ret,
                     struct sk_error *err);
/* Hands a job to the thread (loop thread). */
/* The calibration whose thresholds sessions with a sparsity level use
 * (not owned; outlives sched; NULL: none). Call before submitting jobs; the
 * model must have been sk_model_sparse_prepare'd before sk_scheduler_new. */
struct sk_sparse_calib;
void sk_scheduler_set_sparse(struct sk_scheduler *sched, const struct sk_sparse_calib *calib);
/* Speculation (spec.h): the draft model (NULL: none; same vocabulary as
 * the model, not owned, outlives sched), for which a scratch is made on
 * the scheduler's pool; call once, before submitting jobs. Errors:
 * -SK_ERR_NO_MEMORY, those of sk_scratch_new_pool. */
int sk_scheduler_set_draft(struct sk_scheduler *sched, const struct sk_model *draft,
                           struct sk_error *err);
/* What a generate speculates with when neither it nor its session says
 * (mode: enum sk_spec_mode, DRAFT meaning OFF without a draft model;
 * tokens: the most a step proposes, 1..SK_SPEC_MAX_TOKENS). Any thread,
 * any time (a reload); jobs that start later see it. */
void sk_scheduler_set_spec_defaults(struct sk_scheduler *sched, uint32_t mode, uint32_t tokens);
void sk_scheduler_submit(struct sk_scheduler *sched, struct sk_job *job);
/* Wakes the thread after a job was unpaused or cancelled. */
void sk_scheduler_wake(struct sk_scheduler *sched);
/* Cancels every job, waits for the thread, delivers the remaining events
 * through the callback, closes the async handle and frees sched once it is
 * closed (run the loop afterwards to let the close complete). */
void sk_scheduler_free(struct sk_scheduler *sched);

/* Totals since start (thread-safe). */
uint64_t sk_scheduler_tokens_prefilled(const struct sk_scheduler *sched);
uint64_t sk_scheduler_tokens_generated(const struct sk_scheduler *sched);
/* Tokens proposed (and checked) by speculation since start, and those
 * the model kept (thread-safe); rejected = drafted - accepted. */
void sk_scheduler_spec_totals(const struct sk_scheduler *sched, uint64_t *ret_drafted,
                              uint64_t *ret_accepted);
/* Forward passes run since start (thread-safe). */
uint64_t sk_scheduler_steps(const struct sk_scheduler *sched);
/* Threads the forward pass runs on. */
uint32_t sk_scheduler_threads(const struct sk_scheduler *sched);

#endif
