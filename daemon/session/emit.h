/* What a decoding step emits for a client: token events, the
 * log-probabilities and top logits of a row of logits, stop strings
 * found in the text of the tokens. Used by the scheduler's files
 * (scheduler.c, specstep.c); no state of its own. */
#ifndef SK_EMIT_H
#define SK_EMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "session/scheduler.h"
#include "session/session.h"

/* A zeroed event of kind for job with room for text_len bytes of text
 * (and a NUL); the caller owns it (freed by whoever takes it). NULL when
 * out of memory: the job then ends with an internal error, set by the
 * caller. */
struct sk_event *sk_emit_event_new(enum sk_event_kind kind, struct sk_job *job, size_t text_len);

/* What turns logits (n_vocab) into log-probabilities: their max and the
 * log of sum(exp(logit - max)), in double, as llama.cpp's perplexity:
 * ln p(t) = logits[t] - max - log_sum. */
void sk_emit_log_normalizer(const float *logits, uint32_t n_vocab, float *ret_max,
                            double *ret_log_sum);

/* ln softmax(logits)[token] (sk_emit_log_normalizer). */
float sk_emit_log_prob(const float *logits, uint32_t n_vocab, int32_t token);

/* The top n (>= 1) logits, highest first, ties by lower id, into ids[n]
 * and vals[n]. O(n_vocab * n). */
void sk_emit_top_logits(const float *logits, uint32_t n_vocab, uint32_t n, int32_t *ids,
                        float *vals);

/* Appends text (len bytes, a token's) to the job's tail of recent text
 * (the last SK_LIMIT_STOP_LEN bytes and this text at most) and returns
 * whether one of its stop strings ends inside the new text. */
bool sk_emit_tail_has_stop(struct sk_job *job, const char *text, size_t len);

#endif
