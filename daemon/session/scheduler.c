#include "session/scheduler.h"
#include "session/emit.h"
#include "session/scheduler_int.h"
#include "session/specstep.h"
#include "base/clock.h"
#include "model/sparse.h"
#include "sk_limits.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Weight bytes from which a draft model runs on the compute pool rather
 * than on the compute thread alone: about 2 ms of reading a pass. */
#define SK__DRAFT_POOL_BYTES (32u << 20)

/* ---- events (compute thread -> loop thread) ---- */

static void post_event(struct sk_scheduler *sched, struct sk_event *ev) {
  ev->next = NULL;
  if (ev->kind == SK_EVENT_TOKEN) atomic_fetch_add(&ev->job->events_queued, 1);
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
  bool resume = false;
  while (ev) {
    struct sk_event *next = ev->next;
    /* A DONE event may free its job; token events come before it. */
    if (ev->kind == SK_EVENT_TOKEN &&
        atomic_fetch_sub(&ev->job->events_queued, 1) == SK_LIMIT_JOB_EVENTS)
      resume = true;
    sched->cb(sched->user, ev);
    ev = next;
  }
  if (resume) sk_scheduler_wake(sched);
}

static void on_async(uv_async_t *h) { drain_events(h->data); }

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
  struct sk_event *ev = sk_emit_event_new(SK_EVENT_DONE, job, 0);
  if (!ev) {
    /* Cannot even report: keep trying is pointless; the loop would hang
     * waiting for this job, so spin on allocation briefly. */
    while (!(ev = sk_emit_event_new(SK_EVENT_DONE, job, 0))) {
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
    int src = sk_specstep_start(sched, job);
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

/* ---- one step (compute thread) ----
 *
 * Every turn takes every runnable job and runs ONE forward pass for all of
 * them: one token for each generating job, a chunk of input for each
 * appending one, at most max_batch rows in all. Decoding jobs come first,
 * one row each, but leave a quarter of the rows to prefill while any job
 * has input left, so that a long prompt keeps moving while many sessions
 * generate. While a job generates, the prefill chunks fill only what its
 * tokens leave of step_tokens (at least a quarter of it), each prompt
 * token counting for its weights and for the attention over the
 * positions it reads (prefill_rows), so that a pass beside a long prompt
 * takes a few times a lone token's; with no job generating they take all
 * the rows. The prefill rows are shared evenly among the jobs that have
 * input. Who goes first rotates every turn, so when there are more jobs
 * than rows each waits its turn. */

/* An attention multiply-add over a cache costs about this many
 * multiply-adds of the batched weight products (f16 caches and int8
 * products, 16 sessions of the 110M model on a Zen 5: doc/performance.md). */
#define SK__ATT_MAC_COST 16.0

/* Budget tokens one prompt token's attention costs per position it
 * reads: its multiply-adds (scores and weighted sums of every layer and
 * query head) at SK__ATT_MAC_COST each, over those of a token's weight
 * products. */
static double att_cost(const struct sk_model_config *c) {
  const double per_layer = (double)c->dim * (c->q_dim + 2.0 * c->kv_dim) +
                           (double)c->q_dim * c->dim + 3.0 * c->dim * c->hidden_dim;
  const double w = c->n_layer * per_layer + (double)c->dim * c->n_vocab;
  return (double)c->n_layer * c->n_head * 2.0 * c->head_dim * SK__ATT_MAC_COST / w;
}

/* Prompt tokens of job's next chunk that `budget` budget tokens pay
 * for: each costs 1 + att_cost x the positions it reads (the session's
 * resident tokens and the chunk's earlier ones), at least 1. */
static uint32_t prefill_rows(const struct sk_scheduler *sched, const struct sk_job *job,
                             double budget) {
  const double ctx = sk_kv_resident(sk_session_kv(job->sess));
  double n = budget / (1.0 + sched->att_cost * ctx);
  if (n > 1.0) n = budget / (1.0 + sched->att_cost * (ctx + n / 2.0));
  return n < 1.0 ? 1u : n > (double)UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

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
  if (n_top) sk_emit_top_logits(logits, sched->n_vocab, n_top, d->top_id, d->top_logit);
  /* a token the last step's rejection rule drew (sk_specstep_verify) comes
   * first: it was drawn for these logits */
  d->token = job->spec_pending >= 0 ? job->spec_pending : sk_sampler_sample(&job->sampler, logits);
  job->spec_pending = -1;
  d->not_numbers = isnan(logits[d->token]);
  if (d->not_numbers) return; /* no step: the job fails (plan_decode) */
  if (job->token_logprobs || job->top_logprobs) {
    /* the model's own distribution, as append's logprobs score a token */
    float max;
    double log_sum;
    sk_emit_log_normalizer(logits, sched->n_vocab, &max, &log_sum);
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
  struct sk_event *ev = sk_emit_event_new(SK_EVENT_TOKEN, job, 3 * (piece_len + 4));
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
 * (sk_specstep_plan), and the sequence. One token: an eviction when the cache
 * is full, as the policy says. A chunk: sk_kv_make_room for all of it,
 * without logging (sk_specstep_verify keeps and logs the evictions of the
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
        sk_session_has_logits(s) ? sk_emit_log_prob(sk_session_logits(s), sched->n_vocab, seq->tokens[0])
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
  bool stopped = job->n_stop && sk_emit_tail_has_stop(job, ev->text, ev->text_len);
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

/* After the pass and sk_specstep_verify, for a chunk: the kept tokens' events
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

/* A job waits while its client's output is full or while the loop
 * thread has SK_LIMIT_JOB_EVENTS of its token events still to take. */
static bool runnable(const struct sk_job *j) {
  return (!atomic_load(&j->paused) && atomic_load(&j->events_queued) < SK_LIMIT_JOB_EVENTS) ||
         atomic_load(&j->cancel);
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
    sk_specstep_verify(sched, i);
    return;
  }
  const uint64_t first = sk_kv_seen(sk_session_kv(j->sess)) - q->n;
  if (q->row_scores) sk_kv_add_scores(sk_session_kv(j->sess), q->row_scores, q->n);
  const float *last = NULL; /* NULL: the pass wrote the session's logits */
  if (q->all_logits) { /* an append with logprobs */
    float *lp = j->logprobs + j->n_done;
    for (uint32_t r = 1; r < q->n; r++)
      lp[r] = sk_emit_log_prob(q->logits + (size_t)(r - 1) * sched->n_vocab, sched->n_vocab, q->tokens[r]);
    last = q->logits + (size_t)(q->n - 1) * sched->n_vocab;
  }
  sk_session_step_set_logits(j->sess, last);
  sk_session_step_commit(j->sess);
  sk_specstep_observe(j->sess, q->tokens, q->n, first);
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
  sk_specstep_plan(sched, n_seqs, dec_cap);
  const uint32_t n_dec_seqs = n_seqs;
  n_seqs = rows = 0;
  for (uint32_t i = 0; i < n_dec_seqs; i++) {
    struct sk_job *j = sched->seq_job[i];
    int rc = decode_room(sched, j, i);
    if (rc < 0) {
      sk_specstep_abandon(j);
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
  /* Prefill: the rest of the rows; beside generating jobs, the rest of
   * the token budget (at least a quarter of it) */
  const bool beside = rows > 0;
  double tokens = sched->step_tokens > rows ? (double)(sched->step_tokens - rows) : 0.0;
  if (tokens < sched->step_tokens / 4.0) tokens = sched->step_tokens / 4.0;
  for (uint32_t t = 0; t < n_pre && rows < sched->max_batch; t++) {
    uint32_t left = n_pre - t, budget = sched->max_batch - rows;
    uint32_t share = (budget + left - 1) / left; /* even split of what is left */
    struct sk_job *j = sched->pre[t];
    if (beside) {
      const uint32_t n = prefill_rows(sched, j, tokens / left);
      if (n < share) share = n;
    }
    int rc = plan_prefill(sched, j, share, rows, &sched->seqs[n_seqs], &sched->seq_log[n_seqs]);
    if (rc < 0) {
      fail_job(sched, j, rc);
      continue;
    }
    sched->seq_ev[n_seqs] = NULL;
    sched->seq_job[n_seqs++] = j;
    rows += sched->seqs[n_seqs - 1].n;
    if (beside) { /* what this chunk cost, as prefill_rows counts it */
      const double ctx = sk_kv_resident(sk_session_kv(j->sess));
      tokens -= sched->seqs[n_seqs - 1].n * (1.0 + sched->att_cost * ctx);
      if (tokens < 0.0) tokens = 0.0;
    }
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
      sk_specstep_abandon(j);
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
                     uint32_t step_tokens, uint32_t max_ctx, uint32_t n_threads,
                     sk_scheduler_event_cb cb, void *user, struct sk_scheduler **ret,
                     struct sk_error *err) {
  struct sk_scheduler *sched = calloc(1, sizeof *sched);
  if (!sched) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  sched->loop = loop;
  sched->model = m;
  sched->tok = tok;
  sched->table = table;
  sched->max_batch = max_batch;
  sched->step_tokens = step_tokens;
  sched->att_cost = att_cost(sk_model_config(m));
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
