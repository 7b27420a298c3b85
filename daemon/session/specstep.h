/* A step's speculative decoding (spec.h holds a session's speculation
 * state): the proposals of the decoders that speculate, from their
 * history or the draft model (one draft pass per proposal for all of
 * them), and after the step's pass the verification of each chunk, its
 * kept prefix committed. Runs on the compute thread (verification on
 * the pool, one task per sequence), inside sk_scheduler's step; part of
 * the scheduler (scheduler_int.h). */
#ifndef SK_SPECSTEP_H
#define SK_SPECSTEP_H

#include <stdint.h>

#include "session/scheduler.h"
#include "session/session.h"

struct sk_scheduler;

/* A generate's speculation, once it starts: the mode and the most
 * tokens a step proposes (request, else session, else daemon), and the
 * job's buffers, owned by the job. Returns 0 or -SK_ERR_NO_MEMORY with
 * job->err set. */
int sk_specstep_start(struct sk_scheduler *sched, struct sk_job *job);

/* Proposals for the step's decoding sequences 0..n_dec (their tokens
 * drawn), at most cap rows in all with theirs (job->spec_n each, and
 * job->spec_chunk[1..spec_n]). */
void sk_specstep_plan(struct sk_scheduler *sched, uint32_t n_dec, uint32_t cap);

/* After the pass: sequence i's chunk verified and its kept prefix
 * committed (Leviathan et al. 2023, Algorithm 1, when sampling). */
void sk_specstep_verify(struct sk_scheduler *sched, uint32_t i);

/* A job that proposed but does not reach verification: its draft cache
 * is rebuilt next time. */
void sk_specstep_abandon(struct sk_job *job);

/* The n tokens that went into session s at stream indices first..: into
 * its history (a gap starts it again from the resident tokens). */
void sk_specstep_observe(struct sk_session *s, const int32_t *tokens, uint32_t n,
                         uint64_t first);

#endif
