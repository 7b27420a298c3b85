/* Sessions and the work queued on them.
 *
 * A session owns its policy parameters, its KV cache (struct sk_kv, a
 * block allocated here so that a later layer can place it in shared
 * memory), the logits after its last resident token, and counters.
 * Sessions outlive connections; they belong to the uid that opened them.
 *
 * Threads: the loop thread creates, looks up and frees sessions and owns
 * the job queues. While a job runs (session->running != NULL) only the
 * compute thread touches kv and logits; the loop reads counters through
 * sk_session_counters_get, which the compute thread publishes after every
 * step.
 */
#ifndef SK_SESSION_H
#define SK_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvcache.h"
#include "model.h"
#include "sampler.h"
#include "utf8.h"
#include "sinkd/protocol.h"

struct sk_conn;

enum sk_job_kind { SK_JOB_APPEND, SK_JOB_GENERATE };

/* Longest stop string accepted, and how many: bounded so the tail kept for
 * matching stays small. */
#define SK_STOP_MAX_LEN 256u
#define SK_STOP_MAX_COUNT 16u
/* Most top logits a token event may carry. */
#define SK_TOP_MAX 20u

/* One append or generate request. Created by the loop thread, run by the
 * compute thread, finished (reply sent, freed) by the loop thread. */
struct sk_job {
  enum sk_job_kind kind;
  uint64_t req_id;
  struct sk_conn *conn;      /* loop-only; NULL once the client is gone */
  struct sk_session *sess;

  /* Input: text to tokenize (owned, may be NULL) or tokens (owned). */
  char *text;
  size_t text_len;
  int bos;                   /* -1 default (BOS iff session empty), 0, 1 */
  int32_t *tokens;           /* (n_tokens) */
  size_t n_tokens;

  /* generate */
  uint32_t max_tokens;
  struct sk_sampler_params sampling;
  bool ignore_eos;
  uint32_t n_top;
  char *stop[SK_STOP_MAX_COUNT]; /* owned, NUL-terminated */
  uint32_t n_stop;

  /* Control, written by the loop thread, read by the compute thread. */
  atomic_bool cancel;
  atomic_bool paused;        /* the client's output buffer is full */

  /* Progress, compute thread only. */
  bool started;
  size_t n_done;             /* input tokens appended so far */
  uint32_t n_generated;
  struct sk_sampler sampler;
  bool sampler_ready;
  struct sk_utf8_stream utf8;
  char tail[2 * SK_STOP_MAX_LEN]; /* end of the generated text, for stops */
  size_t tail_len;

  /* Result, compute thread, read by the loop after the DONE event. */
  struct sk_error err;       /* code 0 = success */
  const char *stop_reason;   /* generate: "length", "eos", ... (static) */
  struct sk_evict_log evicted;
  char final_text[8];        /* held bytes flushed at the end (U+FFFD) */
  size_t final_text_len;

  struct sk_job *next;       /* session queue / compute lists */
};

struct sk_session_counters {
  uint32_t resident;
  uint64_t seen;
  uint64_t evicted;
};

struct sk_session {
  uint64_t id;
  uint32_t owner_uid;
  struct sk_kv_params params;
  uint32_t capacity;
  size_t kv_bytes;           /* size of the KV block */
  struct sk_kv *kv;          /* owned */
  float *logits;             /* (n_vocab) after the last resident token */
  bool has_logits;

  /* Loop thread. */
  struct sk_job *running;    /* submitted to the compute thread */
  struct sk_job *queue_head; /* waiting, in request order */
  struct sk_job *queue_tail;
  uint32_t n_queued;
  bool closing;              /* close requested: free when idle */

  /* Published by the compute thread (under the table's lock). */
  struct sk_session_counters pub;
};

/* All sessions of the daemon. Loop thread, except counters. */
struct sk_session_table {
  struct sk_session **items; /* (cap) slots; NULL = free */
  uint32_t cap;
  uint32_t count;
  uint64_t next_id;
  pthread_mutex_t counters_lock;
};

/* Initialises an empty table for at most max_sessions sessions.
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_session_table_init(struct sk_session_table *t, uint32_t max_sessions);
/* Frees every session (their jobs must be finished) and the table. */
void sk_session_table_done(struct sk_session_table *t);

/* Creates a session with params (checked against max_capacity) for a
 * model; ids start at 1 and are never reused within a daemon's life.
 * Errors: -SK_ERR_BAD_REQUEST (params, message names the limit),
 * -SK_ERR_BUSY (table full), -SK_ERR_NO_MEMORY. */
int sk_session_open(struct sk_session_table *t, const struct sk_model *m,
                    const struct sk_kv_params *params, uint32_t max_capacity,
                    uint32_t owner_uid, struct sk_session **ret,
                    struct sk_error *err);
/* Session by id, or NULL. */
struct sk_session *sk_session_find(struct sk_session_table *t, uint64_t id);
/* Removes and frees an idle session (no running or queued job). */
void sk_session_free(struct sk_session_table *t, struct sk_session *s);

/* Copies the published counters (thread-safe). */
void sk_session_counters_get(struct sk_session_table *t,
                             const struct sk_session *s,
                             struct sk_session_counters *ret);
/* Publishes kv's counters (compute thread, or loop when idle). */
void sk_session_counters_publish(struct sk_session_table *t,
                                 struct sk_session *s);

/* Frees a job and what it owns (loop thread). NULL is fine. */
void sk_job_free(struct sk_job *j);

#endif
