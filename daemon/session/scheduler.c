#include "session/scheduler.h"
#include "base/clock.h"
#include "model/sparse.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct sk_scheduler {
  uv_loop_t *loop;
  const struct sk_model *model;
  const struct sk_tokenizer *tok;
  struct sk_session_table *table;
  uint32_t max_batch;       /* rows of one forward pass */
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

/* ---- events (compute thread -> loop thread) ---- */

static void post_event(struct sk_scheduler *sched, struct sk_event *ev) {
  ev->next = NULL;
  pthread_mutex_lock(&sched->ev_lock);
  if (sched->ev_tail)
    sched->ev_tail->next = ev;
  else
    sched->ev_head = ev;
  sched->ev_tail = ev;
  pthread_mutex_unlock(&sched->ev_lock);
  uv_async_send(&sched->async);
}

static void drain_events(struct sk_scheduler *sched) {
  pthread_mutex_lock(&sched->ev_lock);
  struct sk_event *ev = sched->ev_head;
  sched->ev_head = sched->ev_tail = NULL;
  pthread_mutex_unlock(&sched->ev_lock);
  while (ev) {
    struct sk_event *next = ev->next;
    sched->cb(sched->user, ev);
    ev = next;
  }
}

static void on_async(uv_async_t *h) { drain_events(h->data); }

/* Allocation failure of an event is not recoverable for that token; the
 * job ends with an internal error instead (set by the caller). */
static struct sk_event *event_new(enum sk_event_kind kind, struct sk_job *job,
                                  size_t text_len) {
  struct sk_event *ev = calloc(1, sizeof *ev + text_len + 1);
  if (!ev) return NULL;
  ev->kind = kind;
  ev->job = job;
  ev->text_len = text_len;
  return ev;
}

/* ---- job steps (compute thread) ---- */

/* Removes job from the active list (no-op if it is not there). */
static void unlink_job(struct sk_scheduler *sched, struct sk_job *job) {
  for (struct sk_job **pp = &sched->active; *pp; pp = &(*pp)->next) {
    if (*pp == job) {
      *pp = job->next;
      return;
    }
  }
}

/* Posts the job's DONE event. The job leaves the active list first: once
 * the event is posted the loop thread may free it at any moment. */
static void finish(struct sk_scheduler *sched, struct sk_job *job) {
  unlink_job(sched, job);
  /* Held bytes stay with the session for its next generate (plan_decode
   * stored them); only a session that is closing has no next one. */
  if (job->kind == SK_JOB_GENERATE && atomic_load(&job->session_closing))
    job->final_text_len = sk_utf8_stream_flush(&job->utf8, job->final_text);
  if (job->chat) {
    sk_job_reply_add(job, job->final_text, job->final_text_len);
    sk_session_chat_end(job->sess, job);
  }
  sk_session_counters_publish(sched->table, job->sess);
  struct sk_event *ev = event_new(SK_EVENT_DONE, job, 0);
  if (!ev) {
    /* Cannot even report: keep trying is pointless; the loop would hang
     * waiting for this job, so spin on allocation briefly. */
    while (!(ev = event_new(SK_EVENT_DONE, job, 0))) {
    }
  }
  post_event(sched, ev);
}

/* Every change to a session's cache and state happens inside a step of
 * its shared-memory object (store.h), through the session's step API
 * (session.h): sk_session_step_begin (a decoding job's
 * sk_session_step_begin_decode, in its draw), then make_room (at
 * most SK_KV_SPARE_SLOTS evictions: the spare slots' budget) and the
 * forward pass, then sk_session_step_commit. A forward pass serves many
 * sessions: each of them begins its own step before and commits it after.
 * Events and replies that report a step are posted only after its commit,
 * so whatever a client was told survives a crash. A failed step is
 * aborted: the session stays at its last commit. */

/* A generate's speculation, once it starts: the mode and the most
 * tokens a step proposes, from the request, else the session's, else
 * the daemon's (a draft mode without a draft model, as an adopted
 * session may ask, runs without speculation), and the buffers. A cache
 * that keeps attention scores gets its per-row scores apart on every
 * decode step, speculating or not (sk_seq.row_scores), so that both add
 * them alike. Returns 0 or -SK_ERR_NO_MEMORY with job->err set. */
static int spec_start(struct sk_scheduler *sched, struct sk_job *job) {
  const struct sk_kv_params *sp = sk_session_params(job->sess);
  uint32_t mode = job->spec_mode     ? job->spec_mode
                  : sp->spec_mode ? sp->spec_mode
                                  : atomic_load(&sched->spec_mode);
  if (mode == SK_SPEC_DEFAULT || (mode == SK_SPEC_DRAFT && !sched->draft)) mode = SK_SPEC_OFF;
  uint32_t k = job->spec_tokens     ? job->spec_tokens
               : sp->spec_tokens ? sp->spec_tokens
                                 : atomic_load(&sched->spec_tokens);
  if (k < 1) k = 1;
  if (k > SK_SPEC_MAX_TOKENS) k = SK_SPEC_MAX_TOKENS;
  if (!job->has_spec_fixed) job->spec_fixed = sp->spec_fixed;
  job->run_spec = mode;
  job->run_spec_tokens = mode == SK_SPEC_OFF ? 0 : k;
  job->spec_pending = -1;
  const size_t V = sched->n_vocab;
  const struct sk_kv *kv = sk_session_kv(job->sess);
  const uint32_t rows = 1 + job->run_spec_tokens;
  bool ok = true;
  if (mode != SK_SPEC_OFF) {
    ok = (job->spec_logits = malloc(rows * V * sizeof(float))) &&
         (job->spec_p = malloc(V * sizeof(float)));
    if (ok && mode == SK_SPEC_DRAFT && job->sampling.temperature > 0.0f)
      ok = (job->spec_q = malloc(k * V * sizeof(float))) != NULL;
  }
  if (ok && mode == SK_SPEC_DRAFT)
    ok = (job->dfeed = malloc(((size_t)sk_kv_capacity(kv) + 1) * sizeof(int32_t))) != NULL;
  if (ok && sk_policy_scores(sk_kv_policy(kv)))
    ok = (job->row_scores = malloc(rows * (size_t)kv->hdr->n_slots * sizeof(float))) != NULL;
  if (!ok)
    return sk_error_set(&job->err, SK_ERR_NO_MEMORY, "out of memory for speculation buffers");
  return 0;
}

/* Tokenizes / validates the job's input and checks that it can be taken
 * whole. Returns 0, or -code with job->err set. */
static int job_start(struct sk_scheduler *sched, struct sk_job *job) {
  struct sk_session *s = job->sess;
  struct sk_kv *kv = sk_session_kv(s);
  job->started = true;
  if (job->chat) {
    int rc = sk_session_chat_begin(s, sched->tok, job);
    if (rc < 0) return rc;
    if (job->n_tokens == 0) sk_session_chat_prompt_done(s, job);
  }
  if (job->text) {
    bool bos = job->bos < 0 ? sk_kv_seen(kv) == 0 && sk_tokenizer_add_bos(sched->tok)
                            : job->bos == 1;
    unsigned flags = (bos ? SK_TOKENIZE_BOS : 0) |
                     (job->parse_special ? SK_TOKENIZE_SPECIAL : 0);
    int32_t *toks = NULL;
    size_t n = 0;
    int rc = sk_tokenizer_encode(sched->tok, job->text, job->text_len, flags, &toks,
                                 &n, &job->err);
    if (rc < 0) return rc;
    free(job->tokens);
    job->tokens = toks;
    job->n_tokens = n;
    free(job->text);
    job->text = NULL;
  }
  for (size_t i = 0; i < job->n_tokens; i++) {
    if (job->tokens[i] < 0 || (uint32_t)job->tokens[i] >= sched->n_vocab)
      return sk_error_set(&job->err, SK_ERR_BAD_REQUEST,
                          "tokens[%zu] = %d is outside the vocabulary [0, %u)",
                          i, job->tokens[i], sched->n_vocab);
  }
  if (job->want_logprobs) {
    job->logprobs = malloc((job->n_tokens ? job->n_tokens : 1) * sizeof *job->logprobs);
    if (!job->logprobs)
      return sk_error_set(&job->err, SK_ERR_NO_MEMORY,
                          "out of memory for %zu log-probabilities", job->n_tokens);
  }
  if (sk_policy_evict_chunk(sk_kv_policy(kv)) == 0) {
    uint32_t free_slots = sk_kv_free_slots(kv);
    if (job->n_tokens > free_slots)
      return sk_error_set(&job->err, SK_ERR_CONTEXT_FULL,
                          "the dense session is full: %zu tokens to append, "
                          "%u of %u slots free (%u resident); nothing was "
                          "appended",
                          job->n_tokens, free_slots, sk_kv_capacity(kv),
                          sk_kv_resident(kv));
  }
  if (job->kind == SK_JOB_GENERATE) {
    if (job->n_tokens == 0 && !sk_session_has_logits(s))
      return sk_error_set(&job->err, SK_ERR_BAD_REQUEST,
                          "session %llu holds no tokens: append a prompt "
                          "first or give 'prompt'",
                          (unsigned long long)sk_session_id(s));
    int rc = sk_sampler_init(&job->sampler, &job->sampling, sched->n_vocab, &job->err);
    if (rc < 0) return rc;
    job->sampler_ready = true;
    if (!job->has_seed) {
      /* No seed given: go on with the session's own PRNG stream (seeded
       * at open, kept in its object), so a generate continued after a
       * restart draws exactly what an uninterrupted one would. */
      struct sk_sampler_state st;
      sk_session_sampler_get(s, &st);
      memcpy(job->sampler.st.rng, st.rng, sizeof st.rng);
      job->sampler.st.params.seed = st.params.seed;
    }
    int src = spec_start(sched, job);
    if (src < 0) return src;
    /* A character the session's last generate ended inside goes on
     * here, unless input comes between (the prompt; plan_prefill drops
     * the held bytes then). */
    if (job->n_tokens == 0)
      sk_session_utf8_get(s, &job->utf8);
    else
      sk_utf8_stream_init(&job->utf8);
  }
  return 0;
}

/* ln softmax(logits)[token], as llama.cpp's perplexity: max-subtracted,
 * the sum of exponentials in double. */
/* What turns the logits into log-probabilities: their max and the log of
 * sum(exp(logit - max)), in double. ln p(t) = logits[t] - max - log_sum. */
static void log_normalizer(const float *logits, uint32_t n_vocab, float *ret_max,
                           double *ret_log_sum) {
  float max = logits[0];
  for (uint32_t j = 1; j < n_vocab; j++)
    if (logits[j] > max) max = logits[j];
  double sum = 0.0;
  for (uint32_t j = 0; j < n_vocab; j++) sum += exp((double)logits[j] - max);
  *ret_max = max;
  *ret_log_sum = log(sum);
}

static float log_prob(const float *logits, uint32_t n_vocab, int32_t token) {
  float max;
  double log_sum;
  log_normalizer(logits, n_vocab, &max, &log_sum);
  return (float)((double)logits[token] - max - log_sum);
}

/* Top n logits, highest first, ties by lower id. O(n_vocab * n). */
static void top_logits(const float *logits, uint32_t n_vocab, uint32_t n,
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

static bool tail_has_stop(struct sk_job *job, const char *text, size_t len) {
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

/* ---- one step (compute thread) ----
 *
 * Every turn takes every runnable job and runs ONE forward pass for all of
 * them: one token for each generating job, a chunk of input for each
 * appending one, at most max_batch rows in all. Decoding jobs come first,
 * one row each, but leave a quarter of the rows to prefill while any job
 * has input left, so that a long prompt keeps moving while many sessions
 * generate; the prefill rows are shared evenly among the jobs that have
 * input. Who goes first rotates every turn, so when there are more jobs
 * than rows each waits its turn. */

/* Finishes job with its error (rc < 0, job->err maybe set). */
static void fail_job(struct sk_scheduler *sched, struct sk_job *job, int rc) {
  if (job->err.code == 0) sk_error_set(&job->err, -rc, "%s", sk_strerror(-rc));
  finish(sched, job);
}

/* Cancellation, start, empty appends. Returns true when the job is
 * finished (DONE posted). */
static bool step_prepare(struct sk_scheduler *sched, struct sk_job *job) {
  if (atomic_load(&job->cancel)) {
    if (job->kind == SK_JOB_GENERATE && job->started && job->n_done == job->n_tokens) {
      job->stop_reason = "cancelled";
    } else {
      sk_error_set(&job->err, SK_ERR_CANCELLED,
                   "cancelled after %zu of %zu tokens were appended",
                   job->n_done, job->n_tokens);
    }
    finish(sched, job);
    return true;
  }
  /* A session's sparsity level (kept with it) needs its thresholds from
   * this daemon's calibration (an adopted session may ask for a level the
   * file of this start does not hold). */
  const float sp = sk_session_params(job->sess)->sparsity;
  if (sp > 0.0f && !sk_sparse_calib_find(sched->sparse, sp) &&
      (job->kind == SK_JOB_APPEND || job->kind == SK_JOB_GENERATE)) {
    char lv[128];
    sk_error_set(&job->err, SK_ERR_BAD_REQUEST,
                 "the session runs at sparsity %g, which this daemon's calibration does not "
                 "have (levels: %s; sinkd.conf sparsity_file)",
                 (double)sp, sk_sparse_calib_levels(sched->sparse, lv, sizeof lv));
    fail_job(sched, job, -SK_ERR_BAD_REQUEST);
    return true;
  }
  if (!job->started) {
    int rc = job_start(sched, job);
    if (rc < 0) {
      fail_job(sched, job, rc);
      return true;
    }
  }
  if (job->kind == SK_JOB_APPEND && job->n_done == job->n_tokens) { /* empty append */
    finish(sched, job);
    return true;
  }
  return false;
}

/* Why a decoding job stops before its next draw, or NULL. */
static const char *decode_stop(const struct sk_job *job) {
  if (job->n_generated >= job->max_tokens) return "length";
  const struct sk_kv *kv = sk_session_kv(job->sess);
  if (sk_policy_evict_chunk(sk_kv_policy(kv)) == 0 && sk_kv_free_slots(kv) == 0)
    return "context_full";
  return NULL;
}

/* Draw i of a step (of sched->dec[i]), one task per decoding job on the
 * pool (each touches only its own job and session): the top logits and
 * the token from the live logits, then the step begun
 * (sk_session_step_begin_decode) with the sampler's new state. On the pool, a
 * step's draws take about a third of the time they took on the compute
 * thread alone (doc/performance.md). */
static void draw_task(void *ctx, uint32_t i, uint32_t thread) {
  (void)thread;
  struct sk_scheduler *sched = ctx;
  struct sk__draw *d = &sched->draw[i];
  struct sk_job *job = sched->dec[i];
  struct sk_session *s = job->sess;
  const float *logits = sk_session_logits(s);
  d->stop = decode_stop(job);
  if (d->stop) return;
  const uint32_t n_top = job->n_top > job->top_logprobs ? job->n_top : job->top_logprobs;
  if (n_top) top_logits(logits, sched->n_vocab, n_top, d->top_id, d->top_logit);
  /* a token the last step's rejection rule drew (spec_verify) comes
   * first: it was drawn for these logits */
  d->token = job->spec_pending >= 0 ? job->spec_pending : sk_sampler_sample(&job->sampler, logits);
  job->spec_pending = -1;
  d->not_numbers = isnan(logits[d->token]);
  if (d->not_numbers) return; /* no step: the job fails (plan_decode) */
  if (job->token_logprobs || job->top_logprobs) {
    /* the model's own distribution, as append's logprobs score a token */
    float max;
    double log_sum;
    log_normalizer(logits, sched->n_vocab, &max, &log_sum);
    d->logprob = (float)((double)logits[d->token] - max - log_sum);
    for (uint32_t k = 0; k < job->top_logprobs; k++)
      d->top_logprob[k] = (float)((double)d->top_logit[k] - max - log_sum);
  }
  sk_session_step_begin_decode(s); /* the pass writes every logit */
  sk_session_sampler_set(s, &job->sampler.st);
}

/* Before the pass, for a decoding job whose draw d was taken (draw_task):
 * stop checks, the token's event (its room: decode_room). Returns 1 when
 * the job is done (stop_reason set), 0 when it takes a row (the token is
 * in sched->seqs / its event in sched->seq_ev at index i), or -code with
 * job->err set. */
static int plan_decode(struct sk_scheduler *sched, struct sk_job *job, uint32_t i,
                       const struct sk__draw *d, int32_t *token) {
  struct sk_session *s = job->sess;
  if (d->stop) {
    job->stop_reason = d->stop;
    return 1;
  }
  if (d->not_numbers)
    return sk_error_set(&job->err, SK_ERR_BAD_MODEL,
                        "the model computed logits that are not numbers (NaN): its weights "
                        "hold NaN or overflow; check the model file");
  *token = d->token;
  const bool eot = job->chat && *token == job->eot;
  if ((sk_tokenizer_is_eog(sched->tok, *token) || eot) && !job->ignore_eos) {
    sk_session_step_keep_logits(s); /* no pass: the logits stay */
    sk_session_step_commit(s);      /* the draw moved the PRNG */
    /* any end-of-generation token; a chat's end of turn says so */
    job->stop_reason = eot ? "end_of_turn" : "eos";
    job->stop_token = *token;
    return 1;
  }
  const char *piece = "";
  size_t piece_len = 0;
  int rc = sk_tokenizer_piece(sched->tok, *token, &piece, &piece_len, &job->err);
  if (rc < 0) {
    sk_session_step_abort(s);
    return rc;
  }
  struct sk_event *ev = event_new(SK_EVENT_TOKEN, job, 3 * (piece_len + 4));
  if (!ev) {
    sk_session_step_abort(s);
    return sk_error_set(&job->err, SK_ERR_NO_MEMORY, "out of memory for a token event");
  }
  ev->token = *token;
  ev->n_top = job->n_top;
  memcpy(ev->top_id, d->top_id, sizeof ev->top_id[0] * SK_WIRE_MAX_TOP);
  memcpy(ev->top_logit, d->top_logit, sizeof ev->top_logit[0] * job->n_top);
  ev->has_logprob = job->token_logprobs || job->top_logprobs;
  ev->logprob = d->logprob;
  ev->n_top_logprobs = job->top_logprobs;
  memcpy(ev->top_logprob, d->top_logprob, sizeof ev->top_logprob[0] * job->top_logprobs);
  ev->text_len = sk_utf8_stream_push(&job->utf8, piece, piece_len, ev->text);
  sk_session_utf8_set(s, &job->utf8); /* committed with the token */
  sk_evict_log_reset(&sched->seq_log[i]);
  sched->seq_ev[i] = ev;
  job->spec_n = 0;
  job->spec_saved = false;
  return 0;
}

/* Before the pass, for decoding sequence i whose token was drawn
 * (plan_decode): room for it and the job->spec_n proposals after it
 * (spec_plan), and the sequence. One token: an eviction when the cache
 * is full, as the policy says. A chunk: sk_kv_make_room for all of it,
 * without logging (spec_verify keeps and logs the evictions of the
 * tokens kept); its rows' logits go to the job's buffer and its tokens
 * stay uncommitted. Returns 0 or -code with job->err set (the step
 * aborted, the event freed). */
static int decode_room(struct sk_scheduler *sched, struct sk_job *job, uint32_t i) {
  struct sk_session *s = job->sess;
  struct sk_kv *kv = sk_session_kv(s);
  const uint32_t n = 1 + job->spec_n;
  uint32_t evicted = 0;
  int rc = 0;
  if (n == 1) {
    if (sk_kv_free_slots(kv) == 0) rc = sk_kv_make_room(kv, 1, &sched->seq_log[i], &job->err);
  } else {
    const uint64_t before = sk_kv_evicted(kv);
    rc = sk_kv_make_room(kv, n, NULL, &job->err);
    evicted = (uint32_t)(sk_kv_evicted(kv) - before);
  }
  if (rc < 0) {
    free(sched->seq_ev[i]);
    sched->seq_ev[i] = NULL;
    sk_session_step_abort(s);
    return rc;
  }
  struct sk_seq *q = &sched->seqs[i];
  q->n = n;
  q->row_scores = job->row_scores;
  if (n > 1) {
    job->spec_chunk[0] = sched->seq_token[i];
    q->tokens = job->spec_chunk;
    q->n_evicted = sk_policy_evict_chunk(sk_kv_policy(kv)) > 1 ? evicted : 0;
    q->logits = job->spec_logits;
    q->all_logits = true;
    q->defer_commit = true;
  }
  return 0;
}

/* Before the pass, for a job with input left: begins the session's step,
 * makes room for a chunk of at most `want` tokens and fills seq.
 * Streaming and window caches evict inside the chunk exactly as
 * token-by-token streaming would (sk_seq.n_evicted), up to the store's
 * spare slots per step (a crash must leave the last commit's keys
 * intact), so a full cache advances SK_KV_SPARE_SLOTS tokens per pass;
 * h2o evicts one token per step once full (dense never: job_start checked that the
 * input fits). Returns 0 or -code with job->err set (step aborted). */
static int plan_prefill(struct sk_scheduler *sched, struct sk_job *job, uint32_t want,
                        uint32_t row, struct sk_seq *seq, struct sk_evict_log *log) {
  struct sk_session *s = job->sess;
  struct sk_kv *kv = sk_session_kv(s);
  uint32_t n = want;
  size_t remaining = job->n_tokens - job->n_done;
  if (n > remaining) n = (uint32_t)remaining;
  uint32_t evicted = 0;
  sk_evict_log_reset(log);
  sk_session_step_begin(s);
  if (job->pin_prefix && job->n_done == 0) {
    /* A chat's system prompt becomes the sink region in the step that
     * brings its first tokens: committed with them or not at all. */
    int rc = sk_kv_pin_prefix(kv, job->pin_prefix, sk_session_pin_raise(sk_kv_policy(kv)),
                              &job->err);
    if (rc < 0) {
      sk_session_step_abort(s);
      return rc;
    }
  }
  /* Input after a generate that ended inside a character: that
   * character can no longer complete, so its bytes are dropped. */
  struct sk_utf8_stream none;
  sk_utf8_stream_init(&none);
  sk_session_utf8_set(s, &none);
  if (sk_policy_evict_chunk(sk_kv_policy(kv)) > 1) {
    uint32_t room = sk_kv_free_slots(kv) + SK_KV_SPARE_SLOTS;
    if (n > room) n = room;
    if (n > sk_kv_max_room(kv)) n = sk_kv_max_room(kv);
    uint64_t before = sk_kv_evicted(kv);
    int rc = sk_kv_make_room(kv, n, log, &job->err);
    if (rc < 0) {
      sk_session_step_abort(s);
      return rc;
    }
    evicted = (uint32_t)(sk_kv_evicted(kv) - before);
  } else {
    uint32_t free_slots = sk_kv_free_slots(kv);
    if (free_slots == 0) {
      int rc = sk_kv_make_room(kv, 1, log, &job->err);
      if (rc < 0) {
        sk_session_step_abort(s);
        return rc;
      }
      free_slots = sk_kv_free_slots(kv);
    }
    if (n > free_slots) n = free_slots;
  }
  *seq = (struct sk_seq){.kv = kv, .tokens = job->tokens + job->n_done, .n = n,
                         .n_evicted = evicted, .logits = sk_session_logits(s),
                         /* a prompt runs dense however it is cut into
                          * chunks (a chunk of one token would otherwise
                          * look like a decode step); scoring runs sparse */
                         .sparse_thr = job->want_logprobs
                                           ? sk_sparse_calib_find(sched->sparse,
                                                                  sk_session_params(s)->sparsity)
                                           : NULL};
  if (job->want_logprobs) {
    /* The first token is scored by the logits the session already holds
     * (from its previous tokens), the others by this chunk's rows, which
     * go to the batch's rows of batch_logits. */
    job->logprobs[job->n_done] =
        sk_session_has_logits(s) ? log_prob(sk_session_logits(s), sched->n_vocab, seq->tokens[0])
                                 : NAN;
    seq->logits = sched->batch_logits + (size_t)row * sched->n_vocab;
    seq->all_logits = true;
  }
  return 0;
}

/* After the pass, for a decoded token. Returns true when the job is
 * finished (DONE posted). */
static bool after_decode(struct sk_scheduler *sched, struct sk_job *job, struct sk_event *ev) {
  job->n_generated++;
  atomic_fetch_add(&sched->tokens_generated, 1);
  if (job->chat) sk_job_reply_add(job, ev->text, ev->text_len);
  sk_session_counters_publish(sched->table, job->sess);
  bool stopped = job->n_stop && tail_has_stop(job, ev->text, ev->text_len);
  post_event(sched, ev);
  if (stopped) {
    job->stop_reason = "stop";
    finish(sched, job);
    return true;
  }
  if (job->n_generated >= job->max_tokens) {
    job->stop_reason = "length";
    finish(sched, job);
    return true;
  }
  return false;
}

/* ---- speculation (spec.h) ----
 *
 * A decoding job that speculates proposes K tokens after the one drawn
 * for its step (spec_plan: from its history, or from the draft model,
 * spec_draft), and the step's pass runs them all as one chunk of its
 * session (decode_room) with logits for every row. spec_verify then
 * keeps the proposals the model agrees with, as one-token steps would
 * have produced them: greedy, while each is the argmax of the row before
 * it (the tokens are exactly plain decoding's); sampling, by the
 * rejection rule of sk_sampler_verify (the distribution is the model's).
 * The cache keeps only the kept tokens (sk_kv_commit_prefix), whose
 * logits after the last become the session's, and the step commits as
 * any: refused tokens leave no trace in the cache, its object or a
 * restart. */

/* Weight bytes from which a draft model runs on the compute pool rather
 * than on the compute thread alone: about 2 ms of reading a pass. */
#define SK__DRAFT_POOL_BYTES (32u << 20)

/* Rows of a pass up to which decoders' proposals may add rows: a pass
 * of one or a few sessions reads every weight for a handful of rows and
 * is bound by memory, so more rows cost little; past about this many,
 * the products are bound by arithmetic and a proposed row costs what a
 * decoded one does (doc/performance.md). 16 decoders get no proposals. */
#define SK__SPEC_ROWS 16u

/* Most tokens one chunk (the drawn token and its proposals) may take in
 * kv this step: streaming and window caches evict inside a chunk of up
 * to the free slots and the spare ones; h2o caches, whose every
 * eviction waits for the scores of the step before, and dense caches,
 * which never evict, take what fits in the free slots (a full h2o
 * cache: one token a step, no proposals). */
static uint32_t spec_room(const struct sk_kv *kv) {
  if (sk_policy_evict_chunk(sk_kv_policy(kv)) > 1) {
    uint32_t r = sk_kv_free_slots(kv) + SK_KV_SPARE_SLOTS;
    return r < sk_kv_max_room(kv) ? r : sk_kv_max_room(kv);
  }
  return sk_kv_free_slots(kv);
}

/* The job's tokens went into its session at stream indices first..:
 * into the history (a gap starts it again from the resident tokens). */
static void history_observe(struct sk_session *s, const int32_t *tokens, uint32_t n,
                            uint64_t first) {
  struct sk_spec *sp = sk_session_spec(s);
  if (sk_spec_observe(sp, tokens, n, first)) return;
  const uint32_t nr = sk_session_resident(s);
  int32_t *ids = malloc((nr ? nr : 1) * sizeof *ids);
  if (!ids) return; /* no history this time: the look-up proposes nothing */
  sk_session_resident_tokens(s, ids);
  sk_spec_history_restart(sp, ids, nr, first + n);
  free(ids);
}

/* A job that drafted and does not reach spec_verify (its room or the
 * pass failed, so its drawn token is not kept either): its draft cache
 * is rebuilt next time. */
static void spec_abandon(struct sk_job *j) {
  if (!j->spec_saved) return;
  sk_spec_draft_set_synced(sk_session_spec(j->sess), UINT64_MAX);
  j->spec_saved = false;
}

/* The draft's next proposal after the logits of its last row: its argmax
 * (greedy), or drawn from its distribution, kept in spec_q for
 * spec_verify, with the job's random stream. */
static int32_t draft_pick(struct sk_scheduler *sched, struct sk_job *j, const float *logits,
                          uint32_t t) {
  if (!j->spec_q) return sk_sampler_sample(&j->sampler, logits);
  float *q = j->spec_q + (size_t)(t - 1) * sched->n_vocab;
  sk_sampler_probs(&j->sampler, logits, q);
  return sk_sampler_draw(&j->sampler, q);
}

/* The tokens the job's draft cache must take before it drafts: those of
 * the session since the cache last caught up, from the history, and the
 * token drawn for this step; or, when the history does not hold them
 * (or they outnumber the cache), the session's resident tokens and the
 * drawn one, into a cleared cache. Into j->dfeed (j->dfeed_n). Returns
 * false when there is no draft cache. */
static bool draft_feed(struct sk_job *j, int32_t next) {
  struct sk_spec *sp = sk_session_spec(j->sess);
  const struct sk_kv *kv = sk_session_kv(j->sess);
  if (!sk_spec_draft_kv(sp)) return false;
  const uint64_t seen = sk_kv_seen(kv), synced = sk_spec_draft_synced(sp);
  if (synced != UINT64_MAX && synced <= seen && seen - synced <= sk_kv_capacity(kv) &&
      sk_spec_history_copy(sp, synced, seen, j->dfeed)) {
    j->dfeed_n = (uint32_t)(seen - synced);
  } else {
    sk_spec_draft_set_synced(sp, UINT64_MAX);
    sk_session_resident_tokens(j->sess, j->dfeed);
    j->dfeed_n = sk_kv_resident(kv);
  }
  j->dfeed[j->dfeed_n++] = next;
  j->dfeed_done = 0;
  return true;
}

/* Most tokens of a feed the draft cache kv takes in one pass, and the
 * room made for them (its evictions, for a streaming or window cache
 * the sequence's n_evicted, into *ret_evicted). A draft cache only
 * proposes: an h2o one evicts several tokens at once here, by the
 * scores it has. Returns 0 when nothing fits (a full dense cache). */
static uint32_t draft_room(struct sk_kv *kv, uint32_t want, uint32_t *ret_evicted) {
  *ret_evicted = 0;
  uint32_t n = want;
  if (sk_policy_evict_chunk(sk_kv_policy(kv)) == 0) {
    if (n > sk_kv_free_slots(kv)) n = sk_kv_free_slots(kv);
    return n;
  }
  if (sk_policy_evict_chunk(sk_kv_policy(kv)) > 1 && n > sk_kv_free_slots(kv) + SK_KV_SPARE_SLOTS)
    n = sk_kv_free_slots(kv) + SK_KV_SPARE_SLOTS;
  if (n > sk_kv_max_room(kv)) n = sk_kv_max_room(kv);
  const uint64_t before = sk_kv_evicted(kv);
  if (n && sk_kv_make_room(kv, n, NULL, NULL) < 0) return 0;
  if (sk_policy_evict_chunk(sk_kv_policy(kv)) > 1)
    *ret_evicted = (uint32_t)(sk_kv_evicted(kv) - before);
  return n;
}

/* The draft model's proposals of the decoders that draft this step
 * (spec_n > 0): their draft caches catch up with their sessions and take
 * the drawn token, in passes of every such job together (each cache is
 * then saved: spec_verify restores it), then one pass per proposal, each
 * over every job still drafting. A job drafts its spec_n tokens, fewer
 * when one ends generation or a pass fails. */
static void spec_draft(struct sk_scheduler *sched, uint32_t n_dec) {
  const size_t V = sched->n_vocab;
  struct sk_error err;
  uint32_t n_list = 0;
  struct sk_job **list = sched->dlist;
  for (uint32_t i = 0; i < n_dec; i++) {
    struct sk_job *j = sched->seq_job[i];
    if (j->spec_src != SK_SPEC_DRAFT || !j->spec_n) continue;
    if (!draft_feed(j, sched->seq_token[i])) {
      j->spec_n = 0;
      continue;
    }
    list[n_list++] = j;
  }
  /* the feeds, in passes of up to max_batch rows */
  for (;;) {
    uint32_t n = 0, rows = 0;
    for (uint32_t t = 0; t < n_list && rows < sched->max_batch; t++) {
      struct sk_job *j = list[t];
      if (!j->spec_n || j->dfeed_done == j->dfeed_n) continue;
      struct sk_kv *dkv = sk_spec_draft_kv(sk_session_spec(j->sess));
      uint32_t want = j->dfeed_n - j->dfeed_done, ev;
      if (want > sched->max_batch - rows) want = sched->max_batch - rows;
      const uint32_t m = draft_room(dkv, want, &ev);
      if (m == 0) {
        j->spec_n = 0;
        sk_spec_draft_set_synced(sk_session_spec(j->sess), UINT64_MAX);
        continue;
      }
      const bool last = j->dfeed_done + m == j->dfeed_n;
      sched->dseqs[n] = (struct sk_seq){.kv = dkv, .tokens = j->dfeed + j->dfeed_done, .n = m,
                                        .n_evicted = ev, .logits = last ? sched->dlogits + n * V : NULL};
      sched->djob[n++] = j;
      rows += m;
    }
    if (n == 0) break;
    const int rc = sk_model_forward_batch(sched->draft, sched->dscratch, sched->dseqs, n, &err);
    for (uint32_t t = 0; t < n; t++) {
      struct sk_job *j = sched->djob[t];
      struct sk_spec *sp = sk_session_spec(j->sess);
      if (rc < 0) {
        j->spec_n = 0;
        sk_spec_draft_set_synced(sp, UINT64_MAX);
        continue;
      }
      j->dfeed_done += sched->dseqs[t].n;
      if (j->dfeed_done < j->dfeed_n) continue;
      /* caught up with the drawn token: the state the verification
       * goes back to if it keeps no proposal, then the first proposal */
      sk_spec_draft_set_synced(sp, sk_kv_seen(sk_session_kv(j->sess)) + 1);
      sk_spec_draft_save(sp, 1);
      j->spec_saved = true;
      j->spec_fed = 0;
      j->spec_chunk[1] = draft_pick(sched, j, sched->dlogits + t * V, 1);
      if (sk_tokenizer_is_eog(sched->tok, j->spec_chunk[1])) j->spec_n = 1;
    }
  }
  /* one pass per further proposal */
  for (uint32_t k = 2;; k++) {
    uint32_t n = 0;
    for (uint32_t t = 0; t < n_list; t++) {
      struct sk_job *j = list[t];
      if (j->spec_n < k || !j->spec_saved) continue;
      struct sk_spec *sp = sk_session_spec(j->sess);
      struct sk_kv *dkv = sk_spec_draft_kv(sp);
      if (k > 2) sk_spec_draft_save(sp, k - 1); /* before proposal k - 1 goes in */
      if (sk_kv_free_slots(dkv) == 0 && sk_kv_make_room(dkv, 1, NULL, NULL) < 0) {
        j->spec_n = k - 1;
        continue;
      }
      sched->dseqs[n] = (struct sk_seq){.kv = dkv, .tokens = &j->spec_chunk[k - 1], .n = 1,
                                        .logits = sched->dlogits + n * V};
      sched->djob[n++] = j;
    }
    if (n == 0) break;
    const double t0 = sk_clock_s();
    const int rc = sk_model_forward_batch(sched->draft, sched->dscratch, sched->dseqs, n, &err);
    if (n == 1) sk_spec_costs_draft(&sched->costs, sk_clock_s() - t0);
    for (uint32_t t = 0; t < n; t++) {
      struct sk_job *j = sched->djob[t];
      if (rc < 0) {
        j->spec_n = k - 1;
        continue;
      }
      /* proposal k - 1 is in: the cache holds the tokens up to it */
      j->spec_fed = k - 1;
      sk_spec_draft_set_synced(sk_session_spec(j->sess),
                               sk_kv_seen(sk_session_kv(j->sess)) + k);
      j->spec_chunk[k] = draft_pick(sched, j, sched->dlogits + t * V, k);
      if (sk_tokenizer_is_eog(sched->tok, j->spec_chunk[k])) j->spec_n = k;
    }
  }
  for (uint32_t t = 0; t < n_list; t++)
    if (!list[t]->spec_saved) list[t]->spec_n = 0;
}

/* Proposals for decoding sequences 0..n_dec (their tokens drawn): how
 * many each job may have this step (its adaptive count, what is left of
 * its max_tokens, its cache's room, and the rows left under
 * SK__SPEC_ROWS and cap, shared in the step's order, which rotates),
 * then the proposals, from the history or the draft model. */
static void spec_plan(struct sk_scheduler *sched, uint32_t n_dec, uint32_t cap) {
  uint32_t budget = n_dec < SK__SPEC_ROWS ? SK__SPEC_ROWS - n_dec : 0;
  if (cap < n_dec + budget) budget = cap > n_dec ? cap - n_dec : 0;
  bool drafting = false;
  for (uint32_t i = 0; i < n_dec && budget; i++) {
    struct sk_job *j = sched->seq_job[i];
    j->spec_n = 0;
    j->spec_saved = false;
    if (j->run_spec == SK_SPEC_OFF) continue;
    struct sk_spec *sp = sk_session_spec(j->sess);
    const struct sk_kv *kv = sk_session_kv(j->sess);
    const uint32_t left = j->max_tokens - j->n_generated - 1, room = spec_room(kv);
    uint32_t k = j->run_spec_tokens;
    if (k > left) k = left;
    if (k > budget) k = budget;
    if (k + 1 > room) k = room > 0 ? room - 1 : 0;
    if (k == 0) continue;
    /* the history's proposals, free; for a draft session the draft's
     * when they promise more tokens per second */
    uint32_t kl = 0, kd = 0;
    double rl = 0, rd = 0;
    j->spec_ngram = 0;
    if (sk_spec_allowed(sp) & SK_SPEC_NEEDS_HISTORY) {
      if (!sk_spec_history_at(sp, sk_kv_seen(kv)))
        history_observe(j->sess, NULL, 0, sk_kv_seen(kv));
      kl = sk_spec_lookup(sp, sched->seq_token[i], k, j->spec_chunk + 1, &j->spec_ngram);
      if (kl && !j->spec_fixed) kl = sk_spec_best(sp, SK_SPEC_LOOKUP, j->spec_ngram, kl,
                                                   &sched->costs, &rl);
    }
    if (j->run_spec == SK_SPEC_DRAFT)
      kd = j->spec_fixed ? k : sk_spec_best(sp, SK_SPEC_DRAFT, 0, k, &sched->costs, &rd);
    j->spec_src = j->run_spec == SK_SPEC_DRAFT && (kd && (!kl || rd > rl)) ? SK_SPEC_DRAFT
                                                                            : SK_SPEC_LOOKUP;
    const uint32_t best = j->spec_src == SK_SPEC_DRAFT ? kd : kl;
    k = j->spec_fixed ? best : sk_spec_step(sp, best, j->spec_src == SK_SPEC_DRAFT ? k : kl,
                                            &sched->costs);
    if (k == 0) continue;
    if (j->spec_src == SK_SPEC_DRAFT) drafting = true;
    j->spec_n = k;
    budget -= k;
  }
  if (drafting) spec_draft(sched, n_dec);
}

/* A token event for a kept proposal (with its top logits from row,
 * the logits it was checked against), its text through the job's UTF-8
 * stream. NULL when out of memory. */
static struct sk_event *spec_event(struct sk_scheduler *sched, struct sk_job *job, int32_t token,
                                   const float *row) {
  const char *piece = "";
  size_t len = 0;
  if (sk_tokenizer_piece(sched->tok, token, &piece, &len, NULL) < 0) return NULL;
  struct sk_event *ev = event_new(SK_EVENT_TOKEN, job, 3 * (len + 4));
  if (!ev) return NULL;
  ev->token = token;
  ev->n_top = job->n_top;
  const uint32_t n_top = job->n_top > job->top_logprobs ? job->n_top : job->top_logprobs;
  if (n_top) top_logits(row, sched->n_vocab, n_top, ev->top_id, ev->top_logit);
  if (job->token_logprobs || job->top_logprobs) { /* as draw_task gives them */
    float max;
    double log_sum;
    log_normalizer(row, sched->n_vocab, &max, &log_sum);
    ev->has_logprob = true;
    ev->logprob = (float)((double)row[token] - max - log_sum);
    ev->n_top_logprobs = job->top_logprobs;
    for (uint32_t k = 0; k < job->top_logprobs; k++)
      ev->top_logprob[k] = (float)((double)ev->top_logit[k] - max - log_sum);
  }
  ev->text_len = sk_utf8_stream_push(&job->utf8, piece, len, ev->text);
  return ev;
}

/* After the pass, for sequence i, a chunk of the drawn token and the
 * job's spec_n proposals (on the pool, as commit_task): the proposals
 * checked in order against the rows before them, up to the first the
 * model refuses, one that ends generation (the job stops before it, as
 * it would have after drawing it) or a stop string in the text; the
 * tokens kept (the drawn one and the proposals before the cut) are
 * committed with the logits after the last, the job's sampler and UTF-8
 * state; the draft cache goes back to before the proposals. A refused
 * token's replacement, drawn by the rejection rule when sampling, is
 * the job's next token (spec_pending; greedy: the next draw's argmax is
 * it). */
static void spec_verify(struct sk_scheduler *sched, uint32_t i) {
  struct sk_job *job = sched->seq_job[i];
  struct sk_session *s = job->sess;
  struct sk_kv *kv = sk_session_kv(s);
  struct sk_spec *sp = sk_session_spec(s);
  const struct sk_seq *q = &sched->seqs[i];
  const size_t V = sched->n_vocab;
  const uint32_t K = q->n - 1;
  const uint64_t first = sk_kv_seen(kv);
  const bool greedy = job->sampler.st.params.temperature == 0.0f;
  uint32_t c = 1, kept = 0;
  bool refused = false;
  const char *stop = NULL;
  const struct sk_event *ev0 = sched->seq_ev[i];
  if (job->n_stop && tail_has_stop(job, ev0->text, ev0->text_len)) stop = "stop";
  for (uint32_t t = 1; t <= K && !stop; t++) {
    const float *row = job->spec_logits + (size_t)(t - 1) * V;
    const int32_t d = job->spec_chunk[t];
    int32_t instead = -1;
    if (greedy) {
      if (sk_sampler_sample(&job->sampler, row) != d) instead = -2;
    } else {
      sk_sampler_probs(&job->sampler, row, job->spec_p);
      instead = sk_sampler_verify(&job->sampler, job->spec_p,
                                  job->spec_q ? job->spec_q + (size_t)(t - 1) * V : NULL, d);
    }
    if (instead != -1) {
      refused = true;
      if (instead >= 0) job->spec_pending = instead;
      break;
    }
    kept++;
    const bool eot = job->chat && d == job->eot;
    if ((sk_tokenizer_is_eog(sched->tok, d) || eot) && !job->ignore_eos) {
      stop = eot ? "end_of_turn" : "eos";
      job->stop_token = d;
      break;
    }
    struct sk_event *ev = spec_event(sched, job, d, row);
    if (!ev) break; /* out of memory: the tokens before it are kept */
    job->spec_ev[job->spec_n_ev++] = ev;
    c++;
    if (job->n_stop && tail_has_stop(job, ev->text, ev->text_len)) stop = "stop";
  }
  const uint32_t verified = kept + (refused ? 1u : 0u);
  sk_spec_result(sp, job->spec_src, job->spec_ngram, verified, kept);
  job->drafted += verified;
  job->accepted += kept;
  atomic_fetch_add(&sched->drafted, verified);
  atomic_fetch_add(&sched->accepted, kept);
  sk_kv_commit_prefix(kv, job->spec_chunk, q->n, q->n_evicted, c, &sched->seq_log[i]);
  if (q->row_scores) sk_kv_add_scores(kv, q->row_scores, c);
  sk_session_sampler_set(s, &job->sampler.st);
  sk_session_utf8_set(s, &job->utf8);
  sk_session_step_set_logits(s, job->spec_logits + (size_t)(c - 1) * V);
  sk_session_step_commit(s);
  job->spec_stop = stop;
  if (job->spec_saved) sk_spec_draft_keep(sp, c, job->spec_fed);
  job->spec_saved = false;
  history_observe(s, job->spec_chunk, c, first);
}

/* After the pass and spec_verify, for a chunk: the kept tokens' events
 * posted in order, the job finished if the chunk ended it (its stop, or
 * max_tokens). Returns true when the job is finished (DONE posted). */
static bool after_spec(struct sk_scheduler *sched, struct sk_job *job, struct sk_event *ev0) {
  const uint32_t n_ev = job->spec_n_ev;
  job->spec_n_ev = 0;
  for (uint32_t k = 0; k <= n_ev; k++) {
    struct sk_event *ev = k == 0 ? ev0 : job->spec_ev[k - 1];
    job->n_generated++;
    atomic_fetch_add(&sched->tokens_generated, 1);
    if (job->chat) sk_job_reply_add(job, ev->text, ev->text_len);
    post_event(sched, ev);
  }
  sk_session_counters_publish(sched->table, job->sess);
  if (job->spec_stop || job->n_generated >= job->max_tokens) {
    job->stop_reason = job->spec_stop ? job->spec_stop : "length";
    finish(sched, job);
    return true;
  }
  return false;
}

static bool runnable(const struct sk_job *j) {
  return !atomic_load(&j->paused) || atomic_load(&j->cancel);
}

/* After a pass, sequence i's commit, one task per sequence on the pool
 * (each touches only its own job and session's store object; the store
 * checksums every new cache row and the meta copy, about 0.2 MB a
 * session with the 110M model, which the compute thread alone did for
 * every session of the step): the log-probabilities of an append that
 * wants them, then the step's commit (sk_session_step_commit). */
static void commit_task(void *ctx, uint32_t i, uint32_t thread) {
  (void)thread;
  struct sk_scheduler *sched = ctx;
  struct sk_job *j = sched->seq_job[i];
  const struct sk_seq *q = &sched->seqs[i];
  if (q->defer_commit) { /* a chunk of proposals */
    spec_verify(sched, i);
    return;
  }
  const uint64_t first = sk_kv_seen(sk_session_kv(j->sess)) - q->n;
  if (q->row_scores) sk_kv_add_scores(sk_session_kv(j->sess), q->row_scores, q->n);
  const float *last = NULL; /* NULL: the pass wrote the session's logits */
  if (q->all_logits) { /* an append with logprobs */
    float *lp = j->logprobs + j->n_done;
    for (uint32_t r = 1; r < q->n; r++)
      lp[r] = log_prob(q->logits + (size_t)(r - 1) * sched->n_vocab, sched->n_vocab, q->tokens[r]);
    last = q->logits + (size_t)(q->n - 1) * sched->n_vocab;
  }
  sk_session_step_set_logits(j->sess, last);
  sk_session_step_commit(j->sess);
  history_observe(j->sess, q->tokens, q->n, first);
}

static void step(struct sk_scheduler *sched) {
  /* Prepare every runnable job; sort them into decoders and prefillers,
   * starting at a rotating place in the list. */
  uint32_t n_active = 0;
  for (struct sk_job *j = sched->active; j; j = j->next) n_active++;
  struct sk_job *order_buf[64];
  struct sk_job **order = n_active <= 64 ? order_buf : malloc(n_active * sizeof *order);
  if (!order) return; /* try again next turn */
  uint32_t k = 0;
  for (struct sk_job *j = sched->active; j; j = j->next) order[k++] = j;
  uint32_t n_dec = 0, n_pre = 0, n_dec_all = 0, n_pre_all = 0;
  const uint32_t first = n_active ? (uint32_t)(sched->turn % n_active) : 0;
  for (uint32_t t = 0; t < n_active; t++) {
    struct sk_job *j = order[(first + t) % n_active];
    if (!runnable(j)) continue;
    if (step_prepare(sched, j)) continue;
    if (j->n_done < j->n_tokens) {
      n_pre_all++;
      if (n_pre < sched->max_batch) sched->pre[n_pre++] = j;
    } else {
      n_dec_all++;
      if (n_dec < sched->max_batch) sched->dec[n_dec++] = j;
    }
  }
  if (order != order_buf) free(order);
  sched->turn++;
  if (n_dec == 0 && n_pre == 0) return;

  /* Rows: decoders first, a quarter kept for prefill. */
  uint32_t reserve = n_pre ? (sched->max_batch + 3) / 4 : 0;
  uint32_t dec_cap = sched->max_batch - reserve;
  if (dec_cap == 0 && n_dec && sched->turn % 2) dec_cap = sched->max_batch; /* --batch 1..3 */
  uint32_t n_seqs = 0, rows = 0;
  /* the draws of every job the loop below visits (each takes one row at
   * most; a job that stops leaves its row unused this step) */
  const uint32_t n_draw = n_dec < dec_cap ? n_dec : dec_cap;
  sk_pool_run(sched->pool, draw_task, sched, n_draw);
  for (uint32_t t = 0; t < n_draw && rows < dec_cap; t++) {
    struct sk_job *j = sched->dec[t];
    int32_t *token = &sched->seq_token[n_seqs];
    int rc = plan_decode(sched, j, n_seqs, &sched->draw[t], token);
    if (rc != 0) {
      if (rc < 0) fail_job(sched, j, rc);
      else finish(sched, j);
      continue;
    }
    sched->seqs[n_seqs] = (struct sk_seq){
        .kv = sk_session_kv(j->sess), .tokens = token, .n = 1, .logits = sk_session_logits(j->sess),
        .sparse_thr = sk_sparse_calib_find(sched->sparse, sk_session_params(j->sess)->sparsity)};
    sched->seq_job[n_seqs++] = j;
    rows++;
  }
  /* proposals for the decoders that speculate, then every decoder's
   * room; a decoder whose room fails leaves the list */
  spec_plan(sched, n_seqs, dec_cap);
  const uint32_t n_dec_seqs = n_seqs;
  n_seqs = rows = 0;
  for (uint32_t i = 0; i < n_dec_seqs; i++) {
    struct sk_job *j = sched->seq_job[i];
    int rc = decode_room(sched, j, i);
    if (rc < 0) {
      spec_abandon(j);
      fail_job(sched, j, rc);
      continue;
    }
    if (n_seqs != i) {
      sched->seqs[n_seqs] = sched->seqs[i];
      sched->seq_job[n_seqs] = j;
      sched->seq_ev[n_seqs] = sched->seq_ev[i];
      sched->seq_token[n_seqs] = sched->seq_token[i];
      sched->seq_log[n_seqs] = sched->seq_log[i];
      if (sched->seqs[n_seqs].n == 1) sched->seqs[n_seqs].tokens = &sched->seq_token[n_seqs];
    }
    rows += sched->seqs[n_seqs++].n;
  }
  for (uint32_t t = 0; t < n_pre && rows < sched->max_batch; t++) {
    uint32_t left = n_pre - t, budget = sched->max_batch - rows;
    uint32_t share = (budget + left - 1) / left; /* even split of what is left */
    struct sk_job *j = sched->pre[t];
    int rc = plan_prefill(sched, j, share, rows, &sched->seqs[n_seqs], &sched->seq_log[n_seqs]);
    if (rc < 0) {
      fail_job(sched, j, rc);
      continue;
    }
    sched->seq_ev[n_seqs] = NULL;
    sched->seq_job[n_seqs++] = j;
    rows += sched->seqs[n_seqs - 1].n;
  }
  if (n_seqs == 0) return;

  struct sk_error err = {0};
  const double t0 = sk_clock_s();
  int rc = sk_model_forward_batch(sched->model, sched->scratch, sched->seqs, n_seqs, &err);
  /* one decoding session alone: what a pass of its rows costs */
  if (rc == 0 && n_seqs == 1 && sched->seq_ev[0])
    sk_spec_costs_pass(&sched->costs, sched->seqs[0].n, sk_clock_s() - t0);
  atomic_fetch_add(&sched->steps, 1);
  if (rc == 0) sk_pool_run(sched->pool, commit_task, sched, n_seqs);
  for (uint32_t i = 0; i < n_seqs; i++) {
    struct sk_job *j = sched->seq_job[i];
    if (rc < 0) { /* checked before: a bug, but each job gets the error */
      sk_session_step_abort(j->sess);
      spec_abandon(j);
      free(sched->seq_ev[i]);
      j->err = err;
      finish(sched, j);
      continue;
    }
    sk_session_attn_record(sched->table, j->sess, sched->scratch, i);
    const uint64_t *kept;
    uint32_t sp_rows;
    if (sk_scratch_sparse(sched->scratch, i, &kept, &sp_rows) && sp_rows)
      sk_session_sparse_record(sched->table, j->sess, kept, sp_rows);
    const struct sk_evict_log *log = &sched->seq_log[i];
    for (uint32_t r = 0; r < log->n_ranges; r++)
      for (uint64_t x = log->first[r]; x <= log->last[r]; x++) sk_evict_log_add(&j->evicted, x);
    if (sched->seq_ev[i]) { /* finish() unlinks a finished job */
      if (sched->seqs[i].defer_commit) after_spec(sched, j, sched->seq_ev[i]);
      else after_decode(sched, j, sched->seq_ev[i]);
      continue;
    }
    j->n_done += sched->seqs[i].n;
    atomic_fetch_add(&sched->tokens_prefilled, sched->seqs[i].n);
    if (j->chat && j->n_done == j->n_tokens) sk_session_chat_prompt_done(j->sess, j);
    sk_session_counters_publish(sched->table, j->sess);
    if (j->kind == SK_JOB_APPEND && j->n_done == j->n_tokens) {
      finish(sched, j);
    }
  }
}

static void *thread_main(void *arg) {
  struct sk_scheduler *sched = arg;
  for (;;) {
    pthread_mutex_lock(&sched->lock);
    for (;;) {
      /* Take new jobs, keeping arrival order. */
      struct sk_job *rev = NULL;
      while (sched->submitted) {
        struct sk_job *j = sched->submitted;
        sched->submitted = j->next;
        j->next = rev;
        rev = j;
      }
      if (rev) {
        struct sk_job **tail = &sched->active;
        while (*tail) tail = &(*tail)->next;
        *tail = rev;
      }
      if (sched->stopping)
        for (struct sk_job *j = sched->active; j; j = j->next)
          atomic_store(&j->cancel, true);
      bool any = false;
      for (struct sk_job *j = sched->active; j; j = j->next)
        if (runnable(j)) any = true;
      if (any) break;
      if (sched->stopping && !sched->active) {
        pthread_mutex_unlock(&sched->lock);
        return NULL;
      }
      sched->woken = false;
      while (!sched->woken) pthread_cond_wait(&sched->cond, &sched->lock);
    }
    pthread_mutex_unlock(&sched->lock);
    step(sched);
  }
}

static void free_plan(struct sk_scheduler *sched) {
  free(sched->dseqs);
  free(sched->djob);
  free(sched->dlogits);
  free(sched->dlist);
  free(sched->seqs);
  free(sched->seq_job);
  free(sched->seq_ev);
  free(sched->seq_token);
  free(sched->seq_log);
  free(sched->batch_logits);
  free(sched->dec);
  free(sched->draw);
  free(sched->pre);
}

void sk_scheduler_set_sparse(struct sk_scheduler *sched, const struct sk_sparse_calib *calib) {
  sched->sparse = calib;
}

void sk_scheduler_set_spec_defaults(struct sk_scheduler *sched, uint32_t mode, uint32_t tokens) {
  atomic_store(&sched->spec_mode, mode);
  atomic_store(&sched->spec_tokens, tokens);
}

int sk_scheduler_set_draft(struct sk_scheduler *sched, const struct sk_model *draft,
                           struct sk_error *err) {
  if (!draft) return 0;
  /* A small draft model runs on the compute thread alone: its passes
   * are a few hundred microseconds, of which handing work to the pool and
   * waiting for it would take a good part, much more on a busy machine
   * (doc/performance.md); a larger one on the pool. */
  int rc = sk_model_weight_bytes(draft) < (uint64_t)SK__DRAFT_POOL_BYTES
               ? sk_scratch_new(draft, sched->max_batch, sched->max_ctx + SK_KV_SPARE_SLOTS,
                                &sched->dscratch, err)
               : sk_scratch_new_pool(draft, sched->max_batch, sched->max_ctx + SK_KV_SPARE_SLOTS,
                                     sched->pool, &sched->dscratch, err);
  if (rc < 0) return rc;
  if (!(sched->dseqs = calloc(sched->max_batch, sizeof *sched->dseqs)) ||
      !(sched->djob = calloc(sched->max_batch, sizeof *sched->djob)) ||
      !(sched->dlist = calloc(sched->max_batch, sizeof *sched->dlist)) ||
      !(sched->dlogits = malloc((size_t)sched->max_batch * sched->n_vocab * sizeof(float))))
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for the draft model's batch");
  sched->draft = draft;
  return 0;
}

int sk_scheduler_new(uv_loop_t *loop, const struct sk_model *m,
                     const struct sk_tokenizer *tok,
                     struct sk_session_table *table, uint32_t max_batch,
                     uint32_t max_ctx, uint32_t n_threads, sk_scheduler_event_cb cb, void *user,
                     struct sk_scheduler **ret, struct sk_error *err) {
  struct sk_scheduler *sched = calloc(1, sizeof *sched);
  if (!sched) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  sched->loop = loop;
  sched->model = m;
  sched->tok = tok;
  sched->table = table;
  sched->max_batch = max_batch;
  sched->max_ctx = max_ctx;
  sched->n_vocab = sk_model_config(m)->n_vocab;
  atomic_init(&sched->spec_mode, SK_SPEC_OFF);
  atomic_init(&sched->spec_tokens, SK_SPEC_DEFAULT_TOKENS);
  sched->cb = cb;
  sched->user = user;
  int rc = sk_pool_new(n_threads, &sched->pool, err);
  if (rc < 0) {
    free(sched);
    return rc;
  }
  rc = sk_scratch_new_pool(m, max_batch, max_ctx, sched->pool, &sched->scratch, err);
  if (rc == 0 && (!(sched->seqs = calloc(max_batch, sizeof *sched->seqs)) ||
                  !(sched->seq_job = calloc(max_batch, sizeof *sched->seq_job)) ||
                  !(sched->seq_ev = calloc(max_batch, sizeof *sched->seq_ev)) ||
                  !(sched->seq_token = calloc(max_batch, sizeof *sched->seq_token)) ||
                  !(sched->seq_log = calloc(max_batch, sizeof *sched->seq_log)) ||
                  !(sched->batch_logits = malloc((size_t)max_batch * sched->n_vocab *
                                             sizeof *sched->batch_logits)) ||
                  !(sched->dec = calloc(max_batch, sizeof *sched->dec)) ||
                  !(sched->draw = calloc(max_batch, sizeof *sched->draw)) ||
                  !(sched->pre = calloc(max_batch, sizeof *sched->pre))))
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for a batch of %u", max_batch);
  if (rc < 0) {
    free_plan(sched);
    sk_scratch_free(sched->scratch);
    sk_pool_free(sched->pool);
    free(sched);
    return rc;
  }
  pthread_mutex_init(&sched->lock, NULL);
  pthread_cond_init(&sched->cond, NULL);
  pthread_mutex_init(&sched->ev_lock, NULL);
  uv_async_init(loop, &sched->async, on_async);
  sched->async.data = sched;
  if (pthread_create(&sched->thread, NULL, thread_main, sched) != 0) {
    free_plan(sched);
    sk_scratch_free(sched->scratch);
    sk_pool_free(sched->pool);
    uv_close((uv_handle_t *)&sched->async, NULL);
    /* sched is freed once the handle is closed; leak-free only after the loop
     * runs, which the caller does on its error path. */
    return sk_error_set(err, SK_ERR_INTERNAL, "cannot start the compute thread");
  }
  *ret = sched;
  return 0;
}

void sk_scheduler_submit(struct sk_scheduler *sched, struct sk_job *job) {
  pthread_mutex_lock(&sched->lock);
  job->next = sched->submitted;
  sched->submitted = job;
  sched->woken = true;
  pthread_cond_signal(&sched->cond);
  pthread_mutex_unlock(&sched->lock);
}

void sk_scheduler_wake(struct sk_scheduler *sched) {
  pthread_mutex_lock(&sched->lock);
  sched->woken = true;
  pthread_cond_signal(&sched->cond);
  pthread_mutex_unlock(&sched->lock);
}

static void on_async_closed(uv_handle_t *h) {
  struct sk_scheduler *sched = h->data;
  pthread_mutex_destroy(&sched->lock);
  pthread_cond_destroy(&sched->cond);
  pthread_mutex_destroy(&sched->ev_lock);
  free(sched);
}

void sk_scheduler_free(struct sk_scheduler *sched) {
  pthread_mutex_lock(&sched->lock);
  sched->stopping = true; /* the thread cancels its jobs when it sees this */
  sched->woken = true;
  pthread_cond_signal(&sched->cond);
  pthread_mutex_unlock(&sched->lock);
  pthread_join(sched->thread, NULL);
  drain_events(sched);
  sk_scratch_free(sched->scratch);
  sched->scratch = NULL;
  sk_scratch_free(sched->dscratch);
  sched->dscratch = NULL;
  sk_pool_free(sched->pool);
  sched->pool = NULL;
  free_plan(sched);
  uv_close((uv_handle_t *)&sched->async, on_async_closed);
}

uint64_t sk_scheduler_tokens_prefilled(const struct sk_scheduler *sched) {
  return atomic_load(&((struct sk_scheduler *)sched)->tokens_prefilled);
}

uint64_t sk_scheduler_tokens_generated(const struct sk_scheduler *sched) {
  return atomic_load(&((struct sk_scheduler *)sched)->tokens_generated);
}

uint64_t sk_scheduler_steps(const struct sk_scheduler *sched) {
  return atomic_load(&((struct sk_scheduler *)sched)->steps);
}

void sk_scheduler_spec_totals(const struct sk_scheduler *sched, uint64_t *ret_drafted,
                              uint64_t *ret_accepted) {
  *ret_drafted = atomic_load(&((struct sk_scheduler *)sched)->drafted);
  *ret_accepted = atomic_load(&((struct sk_scheduler *)sched)->accepted);
}

uint32_t sk_scheduler_threads(const struct sk_scheduler *sched) {
  return sk_pool_threads(sched->pool);
}
