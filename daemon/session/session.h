/* Sessions and the work queued on them.
 *
 * A session owns its policy parameters and its shared-memory object
 * (store.h): the KV cache, counters, the logits after its last resident
 * token and its sampler state, committed step by step so that they
 * survive a daemon crash. Sessions outlive connections and daemons; they
 * belong to the uid that opened them.
 *
 * Threads: the loop thread creates, looks up and frees sessions and owns
 * the job queues. While a job runs (session->running != NULL) only the
 * compute thread touches the object (kv, logits, begin/commit); the loop
 * reads counters through sk_session_counters_get, which the compute thread
 * publishes after every step. An idle session's object may be read by the
 * loop thread (fork, export).
 */
#ifndef SK_SESSION_H
#define SK_SESSION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "session/conv.h"
#include "session/kvcache.h"
#include "session/spec.h"
#include "sk_limits.h"
#include "model/model.h"
#include "model/sampler.h"
#include "session/store.h"
#include "model/tokenizer.h"
#include "base/utf8.h"
#include "sinkd/protocol.h"

struct sk_conn;

/* APPEND and GENERATE run on the compute thread; FORK, EXPORT and STATS
 * (stats with the resident tokens) wait in the session's queue for earlier
 * jobs and then run on the loop thread: they only read the committed
 * state, which nothing changes while the session is idle. */
enum sk_job_kind {
  SK_JOB_APPEND,
  SK_JOB_GENERATE,
  SK_JOB_FORK,
  SK_JOB_EXPORT,
  SK_JOB_STATS,
};


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
  int bos;                   /* -1 default (BOS iff session empty and the
                                vocabulary adds BOS), 0, 1 */
  bool parse_special;        /* control-token text in text is the token */
  int32_t *tokens;           /* (n_tokens) */
  size_t n_tokens;

  /* generate */
  uint32_t max_tokens;
  struct sk_sampler_params sampling;
  bool has_seed;             /* false: continue the session's PRNG */
  bool ignore_eos;
  uint32_t n_top;
  bool token_logprobs;       /* token events carry the token's logprob */
  uint32_t top_logprobs;     /* and those of the most likely tokens */
  char *stop[SK_LIMIT_STOP_COUNT]; /* owned, NUL-terminated */
  uint32_t n_stop;

  /* generate: speculation (spec.h), from the request (0: the session's
   * own, then the daemon's default): enum sk_spec_mode, the most tokens
   * a step proposes, and whether that number is fixed */
  uint32_t spec_mode;
  uint32_t spec_tokens;
  bool spec_fixed;
  bool has_spec_fixed;       /* spec_fixed was given */

  /* append */
  bool want_logprobs;        /* reply with per-token log-probabilities */
  bool is_pin;               /* the pinned prefix of an `open`: the reply
                                is the open reply */

  /* chat (a generate whose input is messages, sk_session_chat_begin) */
  bool chat;
  struct sk_conv_msg *chat_msgs; /* (n_chat) owned */
  size_t n_chat;
  int32_t eot;               /* the template's end-of-turn token, or -1 */
  char *reply;               /* (reply_cap) the reply so far, owned */
  size_t reply_len, reply_cap;
  bool prompt_done;          /* the delta is in the cache */
  uint32_t pin_prefix;       /* the delta's first tokens to pin as the
                                session's sinks (its system prompt), set in
                                the header with its first chunk; 0: none */

  /* Control, written by the loop thread, read by the compute thread. */
  atomic_bool cancel;
  atomic_bool paused;        /* the client's output buffer is full */
  atomic_uint events_queued; /* token events posted to the loop thread and
                                not yet taken by it (the scheduler's) */
  atomic_bool session_closing; /* generate: the final reply ends the text
                                  (held bytes as U+FFFD) */

  /* Progress, compute thread only. */
  bool started;
  size_t n_done;             /* input tokens appended so far */
  uint32_t n_generated;
  struct sk_sampler sampler;
  bool sampler_ready;
  struct sk_utf8_stream utf8;
  char tail[2 * SK_LIMIT_STOP_LEN]; /* end of the generated text, for stops */
  size_t tail_len;
  /* Speculation (scheduler.c), compute thread: the mode and counts the
   * job runs with once started (OFF, DRAFT or LOOKUP); a token the
   * rejection rule drew for the next step (-1: none); this step's chunk
   * (the drawn token, then spec_n proposals), its rows of logits and,
   * drafting while sampling, the draft's distributions; the per-row
   * attention scores of a cache that keeps them; the events of the
   * step's tokens after the first; and what the reply reports. */
  uint32_t run_spec;
  uint32_t run_spec_tokens;
  int32_t spec_pending;
  uint32_t spec_n;
  uint32_t spec_src;         /* where this step's proposals come from:
                                SK_SPEC_DRAFT or SK_SPEC_LOOKUP */
  uint32_t spec_ngram;       /* the look-up's match length this step */
  int32_t spec_chunk[1 + SK_SPEC_TOKENS_MAX];
  float *spec_logits;        /* ((1 + run_spec_tokens) * n_vocab) */
  float *spec_q;             /* (run_spec_tokens * n_vocab), or NULL */
  float *spec_p;             /* (n_vocab) */
  float *row_scores;         /* ((1 + run_spec_tokens) * n_slots), or NULL */
  struct sk_event *spec_ev[SK_SPEC_TOKENS_MAX];
  uint32_t spec_n_ev;
  const char *spec_stop;     /* the step ended the job ("stop", "eos", ...) */
  bool spec_saved;           /* the draft cache was saved this step */
  uint32_t spec_fed;         /* proposals fed to the draft cache this step */
  int32_t *dfeed;            /* (capacity + 1) tokens the draft cache takes
                                before it drafts (DRAFT only) */
  uint32_t dfeed_n, dfeed_done;
  uint64_t drafted, accepted;

  /* Result, compute thread, read by the loop after the DONE event. */
  struct sk_error err;       /* code 0 = success */
  const char *stop_reason;   /* generate: "length", "eos", ... (static) */
  int32_t stop_token;        /* generate stopped by "eos": the
                                end-of-generation token drawn */
  struct sk_evict_log evicted;
  float *logprobs;           /* (n_tokens) if want_logprobs: ln p(token i |
                                everything before it); NaN when the session
                                had no logits yet (its first token) */
  char final_text[8];        /* held bytes flushed at the end (U+FFFD) */
  size_t final_text_len;

  struct sk_job *next;       /* session queue / compute lists */
};

struct sk_session_counters {
  uint32_t resident;
  uint64_t seen;
  uint64_t evicted;
  uint64_t commit;           /* commit counter of the object's live copy */
  struct sk_spec_counters spec; /* speculation (spec.h) */
};

/* A session (opaque; its functions below). */
struct sk_session;

/* All sessions of the daemon. Loop thread, except counters. */
struct sk_session_table {
  struct sk_session **items; /* (cap) slots; NULL = free */
  uint32_t cap;
  uint32_t count;
  uint32_t max_sessions;     /* opens beyond this fail with busy */
  uint64_t bytes;            /* sum of the sessions' kv_bytes */
  uint64_t max_bytes;        /* opens beyond this fail with busy */
  uint64_t next_id;
  uint32_t n_reserved;       /* opens between reserve and commit */
  uint64_t reserved_bytes;   /* their objects' bytes */
  struct sk_session_reservation *reservations; /* those, newest first */
  uint32_t max_user_sessions; /* per uid (sk_session_check_user); 0 none */
  uint64_t max_user_bytes;
  /* Bytes held for sessions still on their way in (imports being
   * received), per uid: counted in the uid's share and in all. */
  struct sk_session_pending *pending; /* (n_pending) owned, in no order */
  uint32_t n_pending, pending_cap;
  uint64_t pending_bytes;    /* their sum */
  struct sk_store *store;    /* not owned */
  struct sk_spec_config spec_cfg; /* what sessions speculate with */
  pthread_mutex_t counters_lock;
  /* Frees (unmaps) the object of a closed session, whose file is already
   * deleted; NULL: sk_store_obj_free on the spot. The daemon hands it to
   * a worker thread so the event loop does not wait for the pages. */
  void (*release_obj)(void *user, struct sk_store_obj *obj);
  void *release_user;
};

/* Bytes one uid holds for imports in progress (sk_session_pending_*). */
struct sk_session_pending {
  uint32_t uid;
  uint64_t bytes;
};

/* A session on its way: its id and its share of the limits are held
 * while its object is made off the event loop (an open's empty cache: a
 * file of the cache's size that the file system allocates and zeroes,
 * in time proportional to its size; a fork's or an import's copy). Every
 * reservation ends in sk_session_commit or sk_session_cancel. */
struct sk_session_reservation {
  uint64_t id;                     /* the id the object must get */
  uint32_t owner_uid;
  size_t bytes;                    /* the object's size, held in the limits;
                                      0: not known yet (an import) */
  /* An open's (sk_session_reserve_open); fd -1 otherwise. */
  uint32_t store_flags;            /* the object header's */
  struct sk_kv_params params;
  struct sk_sampler_state sampler; /* seeded */
  int fd;                          /* the object's file, opened by reserve */
  struct sk_store_obj *obj;        /* the object made for id (any thread) */
  /* In the table's list until it ends: the reservation must stay where
   * it was reserved. */
  struct sk_session_reservation *prev, *next;
};

/* Initialises an empty table whose sessions live in store, for at most
 * max_sessions sessions and max_bytes bytes of objects (limits for new
 * sessions; adopted ones are all taken). Errors: -SK_ERR_NO_MEMORY. */
int sk_session_table_init(struct sk_session_table *t, struct sk_store *store,
                          uint32_t max_sessions, uint64_t max_bytes);
/* New limits for new sessions (a reload); open ones stay, even above
 * them. */
void sk_session_table_set_limits(struct sk_session_table *t, uint32_t max_sessions,
                                 uint64_t max_bytes);
/* The per-uid limits sk_session_check_user applies: sessions one uid may
 * own, and their bytes (0: none). */
void sk_session_table_set_user_limits(struct sk_session_table *t, uint32_t max_sessions,
                                      uint64_t max_bytes);
/* Who unmaps the object of a removed session (release_obj, user). */
void sk_session_table_set_release(struct sk_session_table *t,
                                  void (*release_obj)(void *user, struct sk_store_obj *obj),
                                  void *user);
/* What sessions speculate with (spec.h; copied; the draft model must
 * outlive the table): their speculation state's memory counts toward the
 * limits from then on. Set before any session is made. */
void sk_session_table_set_spec(struct sk_session_table *t, const struct sk_spec_config *cfg);
/* Bytes the speculation of the session of object obj takes when it is
 * made (the mode it keeps, or the default: sk_spec_needs, sk_spec_bytes). */
size_t sk_session_spec_bytes(const struct sk_session_table *t, const struct sk_store_obj *obj);
/* The mode of sessions that do not choose (a reload): what they are
 * charged for when they next generate. */
void sk_session_table_set_spec_default(struct sk_session_table *t, uint32_t mode);
/* Before a generate of s in mode (enum sk_spec_mode; SK_SPEC_DEFAULT: the
 * session's own, else the table's default): charges s for the parts of
 * its speculation state the mode needs and it has not paid for yet, and
 * allows them (loop thread). Errors: -SK_ERR_BUSY (max_memory or the
 * uid's limit; the message names it), nothing charged. */
int sk_session_spec_charge(struct sk_session_table *t, struct sk_session *s, uint32_t mode,
                           struct sk_error *err);
/* Ids of new sessions continue after id (the largest found in the state
 * directory). */
void sk_session_table_seen_id(struct sk_session_table *t, uint64_t id);
/* Frees every session (their jobs must be finished) and the table. The
 * sessions' objects stay in the state directory. */
void sk_session_table_free(struct sk_session_table *t);

/* Holds the limits for one more session of `bytes` (0: not known yet,
 * checked by sk_session_commit) of owner_uid, counting reservations not
 * yet ended, and an id in *res (loop thread). Ids start at 1 and are
 * never reused (also across restarts: they continue after the largest
 * id found in the state directory). The caller makes res->obj for that
 * id (sk_store_fork, sk_store_import; any thread). Errors: -SK_ERR_BUSY
 * (max_sessions or max_memory reached, the message names the limit). */
int sk_session_reserve(struct sk_session_table *t, size_t bytes, uint32_t owner_uid,
                       struct sk_session_reservation *res, struct sk_error *err);
/* sk_session_reserve for an open: checks params (against max_capacity),
 * reserves the object's bytes and creates its (empty) file; store_flags
 * go into its header (SK_STORE_TEMPORARY or 0); the session's PRNG is
 * seeded with seed. sk_session_reservation_create then makes the object.
 * Errors: -SK_ERR_BAD_REQUEST (params, the message names the limit),
 * -SK_ERR_BUSY (limits, or the file system is full), -SK_ERR_IO,
 * -SK_ERR_NO_MEMORY. */
int sk_session_reserve_open(struct sk_session_table *t, const struct sk_kv_params *params,
                            uint32_t max_capacity, uint32_t owner_uid, uint32_t store_flags,
                            uint64_t seed, struct sk_session_reservation *res,
                            struct sk_error *err);
/* Makes an open's reserved object in store, in its file (any thread;
 * touches nothing of the table and opens or closes no descriptor).
 * Errors: -SK_ERR_BUSY (file system full), -SK_ERR_IO, -SK_ERR_NO_MEMORY;
 * res->obj stays NULL then. */
int sk_session_reservation_create(struct sk_store *store, struct sk_session_reservation *res,
                                  struct sk_error *err);
/* Loop thread: ends the reservation; res->obj becomes a session (*ret),
 * after the limits are checked when its size was not known. Errors:
 * -SK_ERR_BUSY (limits), -SK_ERR_NO_MEMORY; the object is deleted then. */
int sk_session_commit(struct sk_session_table *t, struct sk_session_reservation *res,
                      struct sk_session **ret, struct sk_error *err);
/* Loop thread: ends a reservation without a session, deleting its
 * object if one was made. */
void sk_session_cancel(struct sk_session_table *t, struct sk_session_reservation *res);
/* Takes an object found by sk_store_scan as a session (ownership of obj
 * passes to the table). One made temporary is removed instead, with a
 * log line (its connection ended with the daemon that made it, so nobody
 * can use it): *ret is NULL then. Errors: -SK_ERR_NO_MEMORY (obj is
 * freed, its file kept). */
int sk_session_adopt(struct sk_session_table *t, struct sk_store_obj *obj,
                     struct sk_session **ret);
/* Sessions uid owns or is getting (reservations not yet ended: opens,
 * forks and imports being made), and their bytes, besides except (a
 * session of the table, or NULL). */
void sk_session_user_usage(const struct sk_session_table *t, uint32_t uid,
                           const struct sk_session *except, uint32_t *ret_n,
                           uint64_t *ret_bytes);
/* Memory a uid holds for a session not made yet (an import's bytes as
 * they arrive): `add` more bytes for uid, counted in its share
 * (max_user_memory, with its sessions) and in max_memory (with every
 * session and reservation) as a session's bytes are; an open, fork or
 * import of uid meanwhile sees them. Errors: -SK_ERR_BUSY (the message
 * names the limit and the bytes), -SK_ERR_NO_MEMORY; nothing is counted
 * then. sk_session_pending_release gives bytes back. */
int sk_session_pending_grow(struct sk_session_table *t, uint32_t uid, uint64_t add,
                            struct sk_error *err);
void sk_session_pending_release(struct sk_session_table *t, uint32_t uid, uint64_t bytes);

/* Whether uid may own one more session of `bytes` (besides except, one
 * of its sessions already in the table, or NULL) under the per-uid
 * limits. A temporary session (one that ends with its connection:
 * `sinkctl generate` without --session) may go SK_LIMIT_TEMP_SESSIONS
 * past max_user_sessions, so that persistent sessions left behind do
 * not stop one-off requests. A per-uid limit at or above the daemon's
 * is implied by it: the daemon's check (sk_session_reserve) then names
 * the limit that binds. Errors: -SK_ERR_BUSY (the message names the
 * limit and how to free some). */
int sk_session_check_user(const struct sk_session_table *t, uint32_t uid, size_t bytes,
                          const struct sk_session *except, bool temporary,
                          struct sk_error *err);
/* Session by id, or NULL. */
struct sk_session *sk_session_find(struct sk_session_table *t, uint64_t id);
/* Removes an idle session (no running or queued job) and deletes its
 * object: the session is closed for good. */
void sk_session_remove(struct sk_session_table *t, struct sk_session *s);
/* The next session of the table from *pos on (start at 0), or NULL after
 * the last; *pos moves past it. The loop may remove the session it got
 * before it asks for the next one. */
struct sk_session *sk_session_table_next(const struct sk_session_table *t, uint32_t *pos);
/* Sessions in the table and the bytes of their objects. */
uint32_t sk_session_table_count(const struct sk_session_table *t);
uint64_t sk_session_table_bytes(const struct sk_session_table *t);
/* The limits for new sessions (sk_session_table_set_limits). */
uint32_t sk_session_table_max_sessions(const struct sk_session_table *t);
uint64_t sk_session_table_max_bytes(const struct sk_session_table *t);

/* ---- what a session is ----
 * Its id, policy, budget and sparsity never change: any thread may read
 * them. The split of the budget changes once, when a first chat pins its
 * system prompt (the loop thread sees it when that job is done). The
 * rest is the loop thread's. */

uint64_t sk_session_id(const struct sk_session *s);
uint32_t sk_session_owner(const struct sk_session *s);
/* The parameters as opened, or as a first chat's system prompt pinned
 * them (n_pin: its pinned tokens; sparsity its MLP sparsity level, 0 =
 * dense). Owned by s. */
const struct sk_kv_params *sk_session_params(const struct sk_session *s);
/* Whether a close was requested (the session goes once idle). */
bool sk_session_closing(const struct sk_session *s);
/* The chat template (enum sk_chat_template) of its conversation. */
int sk_session_chat_template(const struct sk_session *s);

/* What a session is, as the replies describe it (loop thread). */
struct sk_session_desc {
  uint64_t id;
  uint32_t owner_uid;
  struct sk_kv_params params; /* as opened */
  uint32_t capacity;          /* tokens */
  uint32_t kv_type;           /* enum sk_kv_type of its cache (its own, kept
                                 from creation; may differ from the
                                 daemon's kv_type after adoption) */
  uint32_t n_layer;
  size_t object_bytes;        /* its shared-memory object */
  size_t spec_bytes;          /* its speculation state (draft cache,
                                 history; spec.h); with object_bytes,
                                 what counts toward max_memory */
  uint64_t kv_bytes;          /* its keys and values, of those */
  uint64_t created_unix;      /* made (open, fork, import), seconds */
  uint64_t last_used_ms;      /* its last request or job end (sk_clock_ms) */
  bool adopted;               /* found in the state directory at start */
  bool dropped_step;          /* adopted with a step in progress dropped */
  bool busy;                  /* a job runs */
  bool queued;                /* jobs wait behind it */
  bool temporary;             /* ends with the connection that opened it */
  int chat_template;          /* enum sk_chat_template of its conversation */
};

void sk_session_describe(const struct sk_session *s, struct sk_session_desc *ret);

/* The session's cache: the compute thread's while a job of s runs, the
 * loop thread's while s is idle. */
struct sk_kv *sk_session_kv(struct sk_session *s);
/* The session's speculation state (spec.h), the compute thread's while
 * a job of s runs. */
struct sk_spec *sk_session_spec(struct sk_session *s);
/* The session's object (store.h), for the copies of fork and export,
 * which read it in a worker while s is held (its running job is the
 * copy's). */
struct sk_store_obj *sk_session_object(const struct sk_session *s);

/* The committed resident set of the idle session s (loop thread), in
 * cache-position order: its token count; the stream indices of its
 * tokens as ranges of consecutive indices (the first max into first[]
 * and last[]; returns their number, all of them counted, so a return
 * above max says some were left out); its token ids (n_resident into
 * ids). */
uint32_t sk_session_resident(const struct sk_session *s);
uint32_t sk_session_resident_ranges(const struct sk_session *s, uint64_t *first, uint64_t *last,
                                    uint32_t max);
void sk_session_resident_tokens(const struct sk_session *s, int32_t *ids);

/* ---- a session's jobs (loop thread) ----
 *
 * A session runs one job at a time: the others wait in its queue, in
 * request order. The caller runs the job these functions hand it
 * (sk_session_run: on the scheduler, or in a worker for fork and export;
 * stats inline) and reports its end (sk_session_job_done). */

/* Whether j runs off the scheduler: fork, export (a worker) and stats
 * (the loop thread); they only read the committed state. */
bool sk_job_is_inline(const struct sk_job *j);
/* Takes job for s. Returns 1 when s is idle: the caller runs job now;
 * 0 when job is queued behind the running one. Errors: -SK_ERR_BUSY
 * (SK_LIMIT_SESSION_QUEUE jobs already queued; job stays the caller's). */
int sk_session_enqueue(struct sk_session *s, struct sk_job *job, struct sk_error *err);
/* The next queued job to run, or NULL while a job runs or none waits.
 * Queued jobs whose client left and that would only answer it (generate,
 * fork, export, stats) are freed on the way; an append whose client left
 * still runs (the session keeps what was sent). */
struct sk_job *sk_session_next(struct sk_session *s);
/* job runs on s from now on (on the scheduler or in a worker): s is
 * busy until sk_session_job_done. */
void sk_session_run(struct sk_session *s, struct sk_job *job);
/* The running job ended: frees it; s was used now. */
void sk_session_job_done(struct sk_session *s);
/* Closes s: the queued jobs are handed back in *ret_queued (a list
 * through next, in request order, for the caller to answer and free), a
 * running job is cancelled and told that the session closes. Returns
 * true when s is idle (the caller removes it now, sk_session_remove);
 * else once the running job ends, sk_session_closed says so. */
bool sk_session_close(struct sk_session *s, struct sk_job **ret_queued);
/* Marks s to be removed once its running job ends (a pinned prefix that
 * failed, or whose client left before it learned the id). */
void sk_session_close_after(struct sk_session *s);
/* Whether s is closing and idle: the caller removes it. */
bool sk_session_closed(const struct sk_session *s);
/* The client of connection conn left: its jobs on s lose it (running
 * and queued generations are cancelled; appends complete). Returns
 * whether s was opened temporary on that connection (conn_id) and is
 * not closing yet: the caller closes it. */
bool sk_session_detach(struct sk_session *s, const struct sk_conn *conn, uint64_t conn_id);
/* Pauses (or resumes) s's running job if it is conn's (its client's
 * output is full). */
void sk_session_pause(struct sk_session *s, const struct sk_conn *conn, bool paused);
/* Cancels s's running and queued generations. Returns whether there
 * was any. */
bool sk_session_cancel_generate(struct sk_session *s);
/* s was used now (a request, a job's end): the idle TTL starts again. */
void sk_session_touch(struct sk_session *s);
/* s ends with the connection conn_id (open's "temporary"). */
void sk_session_set_temporary(struct sk_session *s, uint64_t conn_id);
/* s's conversation becomes *conv (taken: *conv is left empty). */
void sk_session_set_conv(struct sk_session *s, struct sk_conv *conv);
/* s's conversation starts afresh with chat template tmpl. */
void sk_session_set_template(struct sk_session *s, int tmpl);
/* Loads s's conversation from its file in the state directory dirfd
 * (sk_conv_load); on error s keeps the one it had. Errors: those of
 * sk_conv_load. */
int sk_session_conv_load(struct sk_session *s, int dirfd, struct sk_error *err);
/* Saves s's conversation in the state directory dirfd as session id's
 * (sk_conv_save: id is s's own, or a fork's that takes a copy). Returns
 * 1, or 0 when s has no chat template (nothing saved). Errors: those of
 * sk_conv_save. */
int sk_session_conv_save(const struct sk_session *s, int dirfd, uint64_t id,
                         struct sk_error *err);

/* Whether the session's last committed step left logits to sample from. */
bool sk_session_has_logits(const struct sk_session *s);

/* ---- a step of the session's state (compute thread, or the loop while
 * the session is idle) ----
 *
 * The scheduler changes a session's cache and state only inside a step
 * of its object (store.h's commit protocol): begin, then the forward
 * pass on s->kv and these setters, then commit (or abort: the session
 * stays at its last commit). */

/* Begins a step (sk_store_begin); _decode for a step whose forward pass
 * writes every logit (sk_store_begin_decode: read the live logits
 * first). */
void sk_session_step_begin(struct sk_session *s);
void sk_session_step_begin_decode(struct sk_session *s);
/* A decode step that commits without a pass keeps the logits it began
 * from (sk_store_keep_logits). */
void sk_session_step_keep_logits(struct sk_session *s);
/* The step's logits are those after its last token (sk_store_set_logits:
 * copied from logits, n_vocab floats, or written by the pass if NULL). */
void sk_session_step_set_logits(struct sk_session *s, const float *logits);
/* Commits the step begun (sk_store_commit), or drops it (sk_store_abort). */
void sk_session_step_commit(struct sk_session *s);
void sk_session_step_abort(struct sk_session *s);
/* The view's logits (n_vocab floats): the live ones between steps, the
 * working ones inside a step, which the forward pass writes. */
float *sk_session_logits(struct sk_session *s);
/* The sampler state and the held bytes of an unfinished character, kept
 * in the view's meta copy (set: in the step begun). */
void sk_session_sampler_get(const struct sk_session *s, struct sk_sampler_state *ret);
void sk_session_sampler_set(struct sk_session *s, const struct sk_sampler_state *st);
void sk_session_utf8_get(const struct sk_session *s, struct sk_utf8_stream *ret);
void sk_session_utf8_set(struct sk_session *s, const struct sk_utf8_stream *u);

/* Copies the published counters (thread-safe). */
void sk_session_counters_get(struct sk_session_table *t,
                             const struct sk_session *s,
                             struct sk_session_counters *ret);
/* Publishes kv's counters (compute thread, or loop when idle). */
void sk_session_counters_publish(struct sk_session_table *t,
                                 struct sk_session *s);

/* Adds the attention diagnostics of sequence seq of the last forward on
 * scratch (if any; the session's place in a batched call) to the
 * session's ring (compute thread, or loop when idle). */
void sk_session_attn_record(struct sk_session_table *t, struct sk_session *s,
                            const struct sk_scratch *scratch, uint32_t seq);
/* Adds one forward call's sparse MLP counts of s (sk_scratch_sparse:
 * kept neurons per layer over rows tokens); compute thread. */
void sk_session_sparse_record(struct sk_session_table *t, struct sk_session *s,
                              const uint64_t *kept, uint32_t rows);
/* Copies the counts (thread-safe): n_layer values into ret_kept; returns
 * the tokens they are summed over. */
uint64_t sk_session_sparse_get(struct sk_session_table *t, const struct sk_session *s,
                               uint64_t *ret_kept);
/* Averages over the recorded steps (thread-safe): ret_sink_mass and
 * ret_entropy receive n_layer floats each (caller's arrays of the
 * session's n_layer, sk_session_desc). Returns the number of steps
 * averaged (0: nothing written) and sets *ret_probe to the sink
 * positions counted. */
uint32_t sk_session_attn_get(struct sk_session_table *t,
                             const struct sk_session *s, float *ret_sink_mass,
                             float *ret_entropy, uint32_t *ret_probe);

/* Whether a chat message's role (len bytes) is a system prompt: "system",
 * or "developer" (OpenAI's newer name for it). */
bool sk_session_is_system_role(const char *role, size_t len);
/* The advice a refused system prompt's message ends with: the option of
 * the open (and of sinkd) that raises the budget of a session of policy
 * (enum sk_policy). Static text. */
const char *sk_session_pin_raise(uint32_t policy);

/* Compute thread, a chat job's start: the messages' delta (conv.h)
 * rendered with the session's template and tokenized into job->tokens
 * (BOS first on an empty session), template text with its special
 * tokens, content as plain text; job->eot set. A system message first in
 * the first chat becomes the conversation's system prompt (on an empty
 * session: a role sk_session_is_system_role names). Where the policy has a
 * sink region its tokens come first in job->tokens and job->pin_prefix
 * says how many: the scheduler pins them (sk_kv_pin_prefix) with the
 * first chunk. Errors: -SK_ERR_BAD_REQUEST (no template, misplaced
 * system message, a system prompt that leaves less than a quarter of the
 * budget, sk_kv_params_pin), -SK_ERR_NO_MEMORY. */
int sk_session_chat_begin(struct sk_session *s, const struct sk_tokenizer *tok,
                          struct sk_job *job);
/* Tokens of a chat rendering (any thread): BOS first if bos (and the
 * vocabulary has one); the control tokens named in template segments;
 * the text between them (template text and content together) as plain
 * text, so content never yields a control token.
 * *ret malloc'd (caller frees). Errors: those of sk_tokenizer_encode. */
int sk_session_chat_tokenize(const struct sk_tokenizer *tok, const struct sk_chat_text *t,
                             bool bos, int32_t **ret, size_t *ret_n, struct sk_error *err);
/* Compute thread: the delta is in the cache (state saved). */
void sk_session_chat_prompt_done(struct sk_session *s, struct sk_job *job);
/* Compute thread, as the job ends: the reply joins the conversation
 * (state saved). A job whose prompt did not go in changes nothing. */
void sk_session_chat_end(struct sk_session *s, struct sk_job *job);
/* Appends generated text to a chat job's reply (compute thread). */
void sk_job_reply_add(struct sk_job *j, const char *text, size_t len);

/* Frees a job and what it owns (loop thread). NULL is fine. */
void sk_job_free(struct sk_job *j);

#endif
