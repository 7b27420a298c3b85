/* What the files of the scheduler share: the scheduler's state, which
 * scheduler.c (the compute thread, a step, the API) and specstep.c (a
 * step's speculation) both work on. Not for other modules: they use
 * scheduler.h. */
#ifndef SK_SCHEDULER_INT_H
#define SK_SCHEDULER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "model/sparse.h"
#include "session/scheduler.h"
#include "session/spec.h"

struct sk_scheduler {
  uv_loop_t *loop;
  const struct sk_model *model;
  const struct sk_tokenizer *tok;
  struct sk_session_table *table;
  uint32_t max_batch;       /* rows of one forward pass */
  uint32_t step_tokens;     /* token budget of a pass while a session generates */
  double att_cost;          /* budget tokens of a prompt token's attention per
                               position it reads (prefill_rows) */
  uint32_t max_ctx;
  uint32_t n_vocab;
  /* Speculation (spec.h): the draft model (NULL: none), its scratch on
   * the same pool, one pass's draft sequences, their jobs and logits;
   * what a generate speculates with when neither it nor its session
   * says. */
  const struct sk_model *draft;
  struct sk_scratch *dscratch;
  struct sk_seq *dseqs;     /* (max_batch) */
  struct sk_job **djob;     /* (max_batch) */
  float *dlogits;           /* (max_batch, n_vocab) */
  struct sk_job **dlist;    /* (max_batch) the jobs drafting this step */
  atomic_uint spec_mode, spec_tokens; /* set by the loop thread (a reload) */
  struct sk_spec_costs costs; /* what passes cost, measured (spec.h) */
  struct sk_pool *pool;     /* owned */
  struct sk_scratch *scratch;
  const struct sk_sparse_calib *sparse; /* thresholds of the sparsity levels */
  /* One step's plan, compute thread only. */
  struct sk_seq *seqs;      /* (max_batch) */
  struct sk_job **seq_job;  /* (max_batch) the job of each sequence */
  struct sk_event **seq_ev; /* (max_batch) decode: the token's event */
  int32_t *seq_token;       /* (max_batch) decode: the sampled token */
  struct sk_evict_log *seq_log; /* (max_batch) evictions of the step */
  float *batch_logits;      /* (max_batch, n_vocab): appends with logprobs */
  struct sk_job **dec;      /* (max_batch) jobs decoding this step */
  struct sk__draw *draw;    /* (max_batch) their draws (as dec), on the pool */
  struct sk_job **pre;      /* (max_batch) jobs prefilling this step */
  uint64_t turn;            /* steps taken; rotates who goes first */
  sk_scheduler_event_cb cb;
  void *user;

  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  struct sk_job *submitted; /* under lock, LIFO; reversed when taken */
  bool stopping;            /* under lock */
  bool woken;               /* under lock: something changed */

  struct sk_job *active;    /* compute thread only, in arrival order */

  pthread_mutex_t ev_lock;
  struct sk_event *ev_head, *ev_tail; /* under ev_lock */
  uv_async_t async;

  atomic_uint_fast64_t tokens_prefilled;
  atomic_uint_fast64_t tokens_generated;
  atomic_uint_fast64_t steps;
  atomic_uint_fast64_t drafted, accepted;
};

/* The draw of a decoding job, taken before its step (draw_task): the
 * token sampled from the live logits and the job's n_top top logits, the
 * step begun; or why the job stops instead. */
struct sk__draw {
  const char *stop; /* non-NULL: no draw, the job stops (decode_stop) */
  bool not_numbers; /* the drawn token's logit is NaN: every logit is (NaN
                       never wins a draw), the weights are damaged */
  int32_t token;
  int32_t top_id[SK_WIRE_MAX_TOP];
  float top_logit[SK_WIRE_MAX_TOP];
  float logprob;    /* the token's ln p (job->logprobs / top_logprobs) */
  float top_logprob[SK_WIRE_MAX_TOP]; /* ln p of top_id[0..top_logprobs) */
};

#endif
