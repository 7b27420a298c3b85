#include "compute.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct sk_compute {
  uv_loop_t *loop;
  const struct sk_model *model;
  const struct sk_tokenizer *tok;
  struct sk_session_table *table;
  uint32_t max_batch;
  uint32_t n_vocab;
  struct sk_scratch *scratch;
  float *batch_logits;      /* (max_batch, n_vocab): appends with logprobs */
  sk_compute_event_cb cb;
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
};

/* ---- events (compute thread -> loop thread) ---- */

static void post_event(struct sk_compute *c, struct sk_event *ev) {
  ev->next = NULL;
  pthread_mutex_lock(&c->ev_lock);
  if (c->ev_tail)
    c->ev_tail->next = ev;
  else
    c->ev_head = ev;
  c->ev_tail = ev;
  pthread_mutex_unlock(&c->ev_lock);
  uv_async_send(&c->async);
}

static void drain_events(struct sk_compute *c) {
  pthread_mutex_lock(&c->ev_lock);
  struct sk_event *ev = c->ev_head;
  c->ev_head = c->ev_tail = NULL;
  pthread_mutex_unlock(&c->ev_lock);
  while (ev) {
    struct sk_event *next = ev->next;
    c->cb(c->user, ev);
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

static void finish(struct sk_compute *c, struct sk_job *job) {
  if (job->kind == SK_JOB_GENERATE)
    job->final_text_len = sk_utf8_stream_flush(&job->utf8, job->final_text);
  sk_session_counters_publish(c->table, job->sess);
  struct sk_event *ev = event_new(SK_EVENT_DONE, job, 0);
  if (!ev) {
    /* Cannot even report: keep trying is pointless; the loop would hang
     * waiting for this job, so spin on allocation briefly. */
    while (!(ev = event_new(SK_EVENT_DONE, job, 0))) {
    }
  }
  post_event(c, ev);
}

/* Every change to a session's cache and state happens inside a step of
 * its shared-memory object (store.h): sk_store_begin, then make_room (at
 * most one eviction: the spare slot's budget) and the forward pass, then
 * sk_store_commit. Events and replies that report a step are posted only
 * after its commit, so whatever a client was told survives a crash. A
 * failed step is aborted: the session stays at its last commit. */

/* Tokenizes / validates the job's input and checks that it can be taken
 * whole. Returns 0, or -code with job->err set. */
static int job_start(struct sk_compute *c, struct sk_job *job) {
  struct sk_session *s = job->sess;
  struct sk_kv *kv = s->kv;
  job->started = true;
  if (job->text) {
    bool bos = job->bos < 0 ? kv->hdr->n_seen == 0 : job->bos == 1;
    int32_t *toks = NULL;
    size_t n = 0;
    int rc = sk_tokenizer_encode(c->tok, job->text, job->text_len, bos, &toks,
                                 &n, &job->err);
    if (rc < 0) return rc;
    free(job->tokens);
    job->tokens = toks;
    job->n_tokens = n;
    free(job->text);
    job->text = NULL;
  }
  for (size_t i = 0; i < job->n_tokens; i++) {
    if (job->tokens[i] < 0 || (uint32_t)job->tokens[i] >= c->n_vocab)
      return sk_error_set(&job->err, SK_ERR_BAD_REQUEST,
                          "tokens[%zu] = %d is outside the vocabulary [0, %u)",
                          i, job->tokens[i], c->n_vocab);
  }
  if (job->want_logprobs) {
    job->logprobs = malloc((job->n_tokens ? job->n_tokens : 1) * sizeof *job->logprobs);
    if (!job->logprobs)
      return sk_error_set(&job->err, SK_ERR_NO_MEMORY,
                          "out of memory for %zu log-probabilities", job->n_tokens);
  }
  if (kv->hdr->policy == SK_POLICY_DENSE) {
    uint32_t free_slots = sk_kv_free_slots(kv);
    if (job->n_tokens > free_slots)
      return sk_error_set(&job->err, SK_ERR_CONTEXT_FULL,
                          "append of %zu tokens does not fit: %u of %u slots "
                          "free in this dense session (%u resident); nothing "
                          "was appended",
                          job->n_tokens, free_slots, kv->hdr->capacity,
                          kv->hdr->n_resident);
  }
  if (job->kind == SK_JOB_GENERATE) {
    if (job->n_tokens == 0 && !sk_session_has_logits(s))
      return sk_error_set(&job->err, SK_ERR_BAD_REQUEST,
                          "session %llu holds no tokens: append a prompt "
                          "first or give 'prompt'",
                          (unsigned long long)s->id);
    int rc = sk_sampler_init(&job->sampler, &job->sampling, c->n_vocab, &job->err);
    if (rc < 0) return rc;
    job->sampler_ready = true;
    if (!job->has_seed) {
      /* No seed given: go on with the session's own PRNG stream (seeded
       * at open, kept in its object), so a generate continued after a
       * restart draws exactly what an uninterrupted one would. */
      struct sk_sampler_state st;
      sk_store_sampler_get(s->obj, &st);
      memcpy(job->sampler.st.rng, st.rng, sizeof st.rng);
      job->sampler.st.params.seed = st.params.seed;
    }
    sk_utf8_stream_init(&job->utf8);
  }
  return 0;
}

/* ln softmax(logits)[token], as llama.cpp's perplexity: max-subtracted,
 * the sum of exponentials in double. */
static float log_prob(const float *logits, uint32_t n_vocab, int32_t token) {
  float max = logits[0];
  for (uint32_t j = 1; j < n_vocab; j++)
    if (logits[j] > max) max = logits[j];
  double sum = 0.0;
  for (uint32_t j = 0; j < n_vocab; j++) sum += exp((double)logits[j] - max);
  return (float)((double)logits[token] - max - log(sum));
}

/* One prefill chunk, one committed step. Returns 0 or -code with
 * job->err set (nothing committed). */
static int step_prefill(struct sk_compute *c, struct sk_job *job) {
  struct sk_session *s = job->sess;
  struct sk_kv *kv = s->kv;
  size_t remaining = job->n_tokens - job->n_done;
  struct sk_evict_log step_log;
  sk_evict_log_reset(&step_log);
  sk_store_begin(s->obj);
  uint32_t n = sk_kv_free_slots(kv);
  if (n == 0) {
    /* Full: one eviction per token, as StreamingLLM streams (and what the
     * spare slot makes crash-safe). */
    int rc = sk_kv_make_room(kv, 1, &step_log, &job->err);
    if (rc < 0) {
      sk_store_abort(s->obj);
      return rc;
    }
    n = 1;
  }
  if (n > remaining) n = (uint32_t)remaining;
  if (n > c->max_batch) n = c->max_batch;
  const int32_t *toks = job->tokens + job->n_done;
  int rc;
  if (job->want_logprobs) {
    /* The first token is scored by the logits the session already holds
     * (from its previous tokens), the others by this chunk's rows. The
     * working copy of the logits equals the committed one here. */
    float *lp = job->logprobs + job->n_done;
    lp[0] = (s->obj->meta->flags & SK_STORE_HAS_LOGITS)
                ? log_prob(s->obj->logits, c->n_vocab, toks[0])
                : NAN;
    rc = sk_model_forward(c->model, c->scratch, kv, toks, n, c->batch_logits,
                          true, &job->err);
    if (rc == 0) {
      for (uint32_t i = 1; i < n; i++)
        lp[i] = log_prob(c->batch_logits + (size_t)(i - 1) * c->n_vocab,
                         c->n_vocab, toks[i]);
      memcpy(s->obj->logits, c->batch_logits + (size_t)(n - 1) * c->n_vocab,
             c->n_vocab * sizeof *s->obj->logits);
    }
  } else {
    rc = sk_model_forward(c->model, c->scratch, kv, toks, n, s->obj->logits,
                          false, &job->err);
  }
  if (rc < 0) {
    sk_store_abort(s->obj);
    return rc;
  }
  s->obj->meta->flags |= SK_STORE_HAS_LOGITS;
  sk_store_commit(s->obj);
  sk_session_attn_record(c->table, s, c->scratch);
  for (uint32_t i = 0; i < step_log.n_ranges; i++)
    for (uint64_t x = step_log.first[i]; x <= step_log.last[i]; x++)
      sk_evict_log_add(&job->evicted, x);
  job->n_done += n;
  atomic_fetch_add(&c->tokens_prefilled, n);
  sk_session_counters_publish(c->table, s);
  return 0;
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
  /* Keep the last SK_STOP_MAX_LEN + len bytes at most. */
  if (len > SK_STOP_MAX_LEN) {
    text += len - SK_STOP_MAX_LEN;
    len = SK_STOP_MAX_LEN;
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

/* One decode step, one committed step: the draw (the PRNG state), the
 * eviction, the token's K/V and the new logits commit together. Returns 1
 * when the job is done, 0 to continue, or -code with job->err set
 * (nothing committed). */
static int step_decode(struct sk_compute *c, struct sk_job *job) {
  struct sk_session *s = job->sess;
  struct sk_kv *kv = s->kv;
  if (job->n_generated >= job->max_tokens) {
    job->stop_reason = "length";
    return 1;
  }
  if (kv->hdr->policy == SK_POLICY_DENSE && sk_kv_free_slots(kv) == 0) {
    job->stop_reason = "context_full";
    return 1;
  }
  struct sk_event tmp;
  tmp.n_top = job->n_top;
  sk_store_begin(s->obj);
  if (job->n_top)
    top_logits(s->obj->logits, c->n_vocab, job->n_top, tmp.top_id, tmp.top_logit);
  int32_t token = sk_sampler_sample(&job->sampler, s->obj->logits);
  sk_store_sampler_set(s->obj, &job->sampler.st);
  if (token == sk_tokenizer_eos(c->tok) && !job->ignore_eos) {
    sk_store_commit(s->obj); /* the draw moved the PRNG */
    job->stop_reason = "eos";
    return 1;
  }
  struct sk_evict_log step_log;
  sk_evict_log_reset(&step_log);
  if (sk_kv_free_slots(kv) == 0) {
    int rc = sk_kv_make_room(kv, 1, &step_log, &job->err);
    if (rc < 0) {
      sk_store_abort(s->obj);
      return rc;
    }
  }
  int rc = sk_model_forward(c->model, c->scratch, kv, &token, 1, s->obj->logits,
                            false, &job->err);
  if (rc < 0) {
    sk_store_abort(s->obj);
    return rc;
  }
  sk_store_commit(s->obj);
  sk_session_attn_record(c->table, s, c->scratch);
  for (uint32_t i = 0; i < step_log.n_ranges; i++)
    for (uint64_t x = step_log.first[i]; x <= step_log.last[i]; x++)
      sk_evict_log_add(&job->evicted, x);
  job->n_generated++;
  atomic_fetch_add(&c->tokens_generated, 1);
  sk_session_counters_publish(c->table, s);

  const char *piece = "";
  size_t piece_len = 0;
  rc = sk_tokenizer_piece(c->tok, token, &piece, &piece_len, &job->err);
  if (rc < 0) return rc;
  struct sk_event *ev = event_new(SK_EVENT_TOKEN, job, 3 * (piece_len + 4));
  if (!ev)
    return sk_error_set(&job->err, SK_ERR_NO_MEMORY, "out of memory for a token event");
  ev->token = token;
  ev->n_top = tmp.n_top;
  memcpy(ev->top_id, tmp.top_id, sizeof ev->top_id[0] * tmp.n_top);
  memcpy(ev->top_logit, tmp.top_logit, sizeof ev->top_logit[0] * tmp.n_top);
  ev->text_len = sk_utf8_stream_push(&job->utf8, piece, piece_len, ev->text);
  bool stopped = job->n_stop && tail_has_stop(job, ev->text, ev->text_len);
  post_event(c, ev);
  if (stopped) {
    job->stop_reason = "stop";
    return 1;
  }
  if (job->n_generated >= job->max_tokens) {
    job->stop_reason = "length";
    return 1;
  }
  return 0;
}

/* Runs one step of job; returns true when the job is finished (DONE
 * posted). */
static bool step(struct sk_compute *c, struct sk_job *job) {
  int rc = 0;
  if (atomic_load(&job->cancel)) {
    if (job->kind == SK_JOB_GENERATE && job->started && job->n_done == job->n_tokens) {
      job->stop_reason = "cancelled";
    } else {
      sk_error_set(&job->err, SK_ERR_CANCELLED,
                   "cancelled after %zu of %zu tokens were appended",
                   job->n_done, job->n_tokens);
    }
    finish(c, job);
    return true;
  }
  if (!job->started) {
    rc = job_start(c, job);
    if (rc < 0) goto failed;
  }
  if (job->n_done < job->n_tokens) {
    rc = step_prefill(c, job);
    if (rc < 0) goto failed;
    if (job->kind == SK_JOB_APPEND && job->n_done == job->n_tokens) {
      finish(c, job);
      return true;
    }
    return false;
  }
  if (job->kind == SK_JOB_APPEND) { /* empty append */
    finish(c, job);
    return true;
  }
  rc = step_decode(c, job);
  if (rc < 0) goto failed;
  if (rc == 1) {
    finish(c, job);
    return true;
  }
  return false;
failed:
  if (job->err.code == 0) sk_error_set(&job->err, -rc, "%s", sk_strerror(-rc));
  finish(c, job);
  return true;
}

static void *thread_main(void *arg) {
  struct sk_compute *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->lock);
    for (;;) {
      /* Take new jobs, keeping arrival order. */
      struct sk_job *rev = NULL;
      while (c->submitted) {
        struct sk_job *j = c->submitted;
        c->submitted = j->next;
        j->next = rev;
        rev = j;
      }
      if (rev) {
        struct sk_job **tail = &c->active;
        while (*tail) tail = &(*tail)->next;
        *tail = rev;
      }
      if (c->stopping)
        for (struct sk_job *j = c->active; j; j = j->next)
          atomic_store(&j->cancel, true);
      bool runnable = false;
      for (struct sk_job *j = c->active; j; j = j->next)
        if (!atomic_load(&j->paused) || atomic_load(&j->cancel)) runnable = true;
      if (runnable) break;
      if (c->stopping && !c->active) {
        pthread_mutex_unlock(&c->lock);
        return NULL;
      }
      c->woken = false;
      while (!c->woken) pthread_cond_wait(&c->cond, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);

    /* One step of every runnable job, round-robin. */
    struct sk_job **pp = &c->active;
    while (*pp) {
      struct sk_job *j = *pp;
      if (atomic_load(&j->paused) && !atomic_load(&j->cancel)) {
        pp = &j->next;
        continue;
      }
      struct sk_job *next = j->next;
      if (step(c, j))
        *pp = next; /* finished: j belongs to the loop now */
      else
        pp = &j->next;
    }
  }
}

int sk_compute_start(uv_loop_t *loop, const struct sk_model *m,
                     const struct sk_tokenizer *tok,
                     struct sk_session_table *table, uint32_t max_batch,
                     uint32_t max_ctx, sk_compute_event_cb cb, void *user,
                     struct sk_compute **ret, struct sk_error *err) {
  struct sk_compute *c = calloc(1, sizeof *c);
  if (!c) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  c->loop = loop;
  c->model = m;
  c->tok = tok;
  c->table = table;
  c->max_batch = max_batch;
  c->n_vocab = sk_model_config(m)->n_vocab;
  c->cb = cb;
  c->user = user;
  int rc = sk_scratch_new(m, max_batch, max_ctx, &c->scratch, err);
  if (rc < 0) {
    free(c);
    return rc;
  }
  c->batch_logits = malloc((size_t)max_batch * c->n_vocab * sizeof *c->batch_logits);
  if (!c->batch_logits) {
    sk_scratch_free(c->scratch);
    free(c);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  pthread_mutex_init(&c->ev_lock, NULL);
  uv_async_init(loop, &c->async, on_async);
  c->async.data = c;
  if (pthread_create(&c->thread, NULL, thread_main, c) != 0) {
    sk_scratch_free(c->scratch);
    free(c->batch_logits);
    c->batch_logits = NULL;
    uv_close((uv_handle_t *)&c->async, NULL);
    /* c is freed once the handle is closed; leak-free only after the loop
     * runs, which the caller does on its error path. */
    return sk_error_set(err, SK_ERR_INTERNAL, "cannot start the compute thread");
  }
  *ret = c;
  return 0;
}

void sk_compute_submit(struct sk_compute *c, struct sk_job *job) {
  pthread_mutex_lock(&c->lock);
  job->next = c->submitted;
  c->submitted = job;
  c->woken = true;
  pthread_cond_signal(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

void sk_compute_wake(struct sk_compute *c) {
  pthread_mutex_lock(&c->lock);
  c->woken = true;
  pthread_cond_signal(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

static void on_async_closed(uv_handle_t *h) {
  struct sk_compute *c = h->data;
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  pthread_mutex_destroy(&c->ev_lock);
  free(c);
}

void sk_compute_stop(struct sk_compute *c) {
  pthread_mutex_lock(&c->lock);
  c->stopping = true; /* the thread cancels its jobs when it sees this */
  c->woken = true;
  pthread_cond_signal(&c->cond);
  pthread_mutex_unlock(&c->lock);
  pthread_join(c->thread, NULL);
  drain_events(c);
  sk_scratch_free(c->scratch);
  c->scratch = NULL;
  free(c->batch_logits);
  c->batch_logits = NULL;
  uv_close((uv_handle_t *)&c->async, on_async_closed);
}

uint64_t sk_compute_tokens_prefilled(const struct sk_compute *c) {
  return atomic_load(&((struct sk_compute *)c)->tokens_prefilled);
}

uint64_t sk_compute_tokens_generated(const struct sk_compute *c) {
  return atomic_load(&((struct sk_compute *)c)->tokens_generated);
}
