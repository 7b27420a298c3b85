#include "session/specstep.h"
#include "base/clock.h"
#include "session/emit.h"
#include "session/scheduler_int.h"

#include <stdlib.h>
#include <string.h>

/* A generate's speculation, once it starts: the mode and the most
 * tokens a step proposes, from the request, else the session's, else
 * the daemon's (a draft mode without a draft model, as an adopted
 * session may ask, runs without speculation), and the buffers. A cache
 * that keeps attention scores gets its per-row scores apart on every
 * decode step, speculating or not (sk_seq.row_scores), so that both add
 * them alike. Returns 0 or -SK_ERR_NO_MEMORY with job->err set. */
int sk_specstep_start(struct sk_scheduler *sched, struct sk_job *job) {
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

/* ---- speculation (spec.h) ----
 *
 * A decoding job that speculates proposes K tokens after the one drawn
 * for its step (sk_specstep_plan: from its history, or from the draft model,
 * spec_draft), and the step's pass runs them all as one chunk of its
 * session (decode_room) with logits for every row. sk_specstep_verify then
 * keeps the proposals the model agrees with, as one-token steps would
 * have produced them: greedy, while each is the argmax of the row before
 * it (the tokens are exactly plain decoding's); sampling, by the
 * rejection rule of sk_sampler_verify (the distribution is the model's).
 * The cache keeps only the kept tokens (sk_kv_commit_prefix), whose
 * logits after the last become the session's, and the step commits as
 * any: refused tokens leave no trace in the cache, its object or a
 * restart. */

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
void sk_specstep_observe(struct sk_session *s, const int32_t *tokens, uint32_t n,
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

/* A job that drafted and does not reach sk_specstep_verify (its room or the
 * pass failed, so its drawn token is not kept either): its draft cache
 * is rebuilt next time. */
void sk_specstep_abandon(struct sk_job *j) {
  if (!j->spec_saved) return;
  sk_spec_draft_set_synced(sk_session_spec(j->sess), UINT64_MAX);
  j->spec_saved = false;
}

/* The draft's next proposal after the logits of its last row: its argmax
 * (greedy), or drawn from its distribution, kept in spec_q for
 * sk_specstep_verify, with the job's random stream. */
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
 * then saved: sk_specstep_verify restores it), then one pass per proposal, each
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
void sk_specstep_plan(struct sk_scheduler *sched, uint32_t n_dec, uint32_t cap) {
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
        sk_specstep_observe(j->sess, NULL, 0, sk_kv_seen(kv));
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
  struct sk_event *ev = sk_emit_event_new(SK_EVENT_TOKEN, job, 3 * (len + 4));
  if (!ev) return NULL;
  ev->token = token;
  ev->n_top = job->n_top;
  const uint32_t n_top = job->n_top > job->top_logprobs ? job->n_top : job->top_logprobs;
  if (n_top) sk_emit_top_logits(row, sched->n_vocab, n_top, ev->top_id, ev->top_logit);
  if (job->token_logprobs || job->top_logprobs) { /* as draw_task gives them */
    float max;
    double log_sum;
    sk_emit_log_normalizer(row, sched->n_vocab, &max, &log_sum);
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
void sk_specstep_verify(struct sk_scheduler *sched, uint32_t i) {
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
  if (job->n_stop && sk_emit_tail_has_stop(job, ev0->text, ev0->text_len)) stop = "stop";
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
    if (job->n_stop && sk_emit_tail_has_stop(job, ev->text, ev->text_len)) stop = "stop";
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
  sk_specstep_observe(s, job->spec_chunk, c, first);
}

