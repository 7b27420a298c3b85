#include "session/emit.h"
#include "sk_limits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Allocation failure of an event is not recoverable for that token; the
 * job ends with an internal error instead (set by the caller). */
struct sk_event *sk_emit_event_new(enum sk_event_kind kind, struct sk_job *job,
                                  size_t text_len) {
  struct sk_event *ev = calloc(1, sizeof *ev + text_len + 1);
  if (!ev) return NULL;
  ev->kind = kind;
  ev->job = job;
  ev->text_len = text_len;
  return ev;
}

/* What turns the logits into log-probabilities: their max and the log of
 * sum(exp(logit - max)), in double. ln p(t) = logits[t] - max - log_sum. */
void sk_emit_log_normalizer(const float *logits, uint32_t n_vocab, float *ret_max,
                           double *ret_log_sum) {
  float max = logits[0];
  for (uint32_t j = 1; j < n_vocab; j++)
    if (logits[j] > max) max = logits[j];
  double sum = 0.0;
  for (uint32_t j = 0; j < n_vocab; j++) sum += exp((double)logits[j] - max);
  *ret_max = max;
  *ret_log_sum = log(sum);
}

float sk_emit_log_prob(const float *logits, uint32_t n_vocab, int32_t token) {
  float max;
  double log_sum;
  sk_emit_log_normalizer(logits, n_vocab, &max, &log_sum);
  return (float)((double)logits[token] - max - log_sum);
}

/* Top n logits, highest first, ties by lower id. O(n_vocab * n). */
void sk_emit_top_logits(const float *logits, uint32_t n_vocab, uint32_t n,
                       int32_t *ids, float *vals) {
  uint32_t k = 0;
  for (uint32_t t = 0; t < n_vocab; t++) {
    float v = logits[t];
    if (k == n && !(v > vals[k - 1])) continue;
    uint32_t i = k < n ? k++ : n - 1;
    while (i > 0 && v > vals[i - 1]) {
      vals[i] = vals[i - 1];
      ids[i] = ids[i - 1];
      i--;
    }
    vals[i] = v;
    ids[i] = (int32_t)t;
  }
}

bool sk_emit_tail_has_stop(struct sk_job *job, const char *text, size_t len) {
  /* Keep the last SK_LIMIT_STOP_LEN + len bytes at most. */
  if (len > SK_LIMIT_STOP_LEN) {
    text += len - SK_LIMIT_STOP_LEN;
    len = SK_LIMIT_STOP_LEN;
  }
  if (job->tail_len + len > sizeof job->tail) {
    size_t drop = job->tail_len + len - sizeof job->tail;
    memmove(job->tail, job->tail + drop, job->tail_len - drop);
    job->tail_len -= drop;
  }
  memcpy(job->tail + job->tail_len, text, len);
  job->tail_len += len;
  for (uint32_t i = 0; i < job->n_stop; i++) {
    size_t sl = strlen(job->stop[i]);
    /* Only matches that end inside the new text are new. */
    for (size_t end = job->tail_len - len + 1; end <= job->tail_len; end++) {
      if (end >= sl && memcmp(job->tail + end - sl, job->stop[i], sl) == 0)
        return true;
    }
  }
  return false;
}

