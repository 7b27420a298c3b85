#include "session/session.h"

#include "base/clock.h"
#include "base/log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Attention diagnostics of a session's recent steps: a ring of the last
 * SK_LIMIT_ATTN_STEPS forward calls' per-layer values (sk_scratch_attn).
 * Written by the compute thread and read by the loop thread, both under
 * the table's counters lock. */
struct sk_attn_stats {
  uint32_t n_layer;
  uint32_t probe;      /* sink positions counted by the newest entry */
  uint32_t n_steps;    /* entries filled, <= SK_LIMIT_ATTN_STEPS */
  uint32_t next;       /* ring position of the next entry */
  float *sink_mass;    /* (SK_LIMIT_ATTN_STEPS, n_layer) */
  float *entropy;      /* (SK_LIMIT_ATTN_STEPS, n_layer) nats */
};

struct sk_session {
  uint64_t id;
  uint32_t owner_uid;
  struct sk_kv_params params; /* as opened, or as its first chat's system
                                 prompt pinned (n_pin: pinned tokens) */
  uint32_t capacity;
  size_t object_bytes;       /* bytes of its shared-memory object */
  size_t spec_bytes;         /* bytes its speculation may take (spec.h);
                                with object_bytes, what counts toward
                                max_memory */
  unsigned spec_needs;       /* the SK_SPEC_NEEDS_* spec_bytes pays for */
  struct sk_spec *spec;      /* owned */
  uint64_t kv_bytes;         /* bytes of its keys and values, of those */
  uint32_t kv_type;          /* enum sk_kv_type of its cache (its own, kept
                                from creation; may differ from the
                                daemon's kv_type after adoption) */
  struct sk_store_obj *obj;  /* owned */
  struct sk_kv *kv;          /* &obj->kv */
  bool adopted;              /* found in the state directory at start */
  bool dropped_step;         /* adopted with its step in progress dropped */
  uint64_t last_used_ms;     /* loop thread: last request or job end */

  /* Loop thread. */
  struct sk_job *running;    /* submitted to the compute thread */
  struct sk_job *queue_head; /* waiting, in request order */
  struct sk_job *queue_tail;
  uint32_t n_queued;
  bool closing;              /* close requested: free when idle */
  uint64_t temp_conn;        /* id of the connection whose end closes the
                                session (open's "temporary"), 0: none */

  /* The conversation of the chat op (conv.h): the loop thread's while
   * the session is idle, the compute thread's while a chat job runs. */
  struct sk_conv conv;

  /* Published by the compute thread (under the table's lock). */
  struct sk_session_counters pub;
  struct sk_attn_stats attn;
  /* Sparse MLP (params.sparsity > 0), under the same lock: neurons kept
   * per layer summed over the tokens that ran sparse, and those tokens. */
  uint64_t *sp_kept;         /* (n_layer) */
  uint64_t sp_tokens;
};

int sk_session_table_init(struct sk_session_table *t, struct sk_store *store,
                          uint32_t max_sessions, uint64_t max_bytes) {
  memset(t, 0, sizeof *t);
  t->items = calloc(max_sessions ? max_sessions : 1, sizeof *t->items);
  if (!t->items) return -SK_ERR_NO_MEMORY;
  t->cap = max_sessions ? max_sessions : 1;
  t->max_sessions = max_sessions;
  t->max_bytes = max_bytes;
  t->store = store;
  t->next_id = 1;
  pthread_mutex_init(&t->counters_lock, NULL);
  return 0;
}

void sk_session_table_set_limits(struct sk_session_table *t, uint32_t max_sessions,
                                 uint64_t max_bytes) {
  t->max_sessions = max_sessions;
  t->max_bytes = max_bytes;
}

void sk_session_table_set_user_limits(struct sk_session_table *t, uint32_t max_sessions,
                                      uint64_t max_bytes) {
  t->max_user_sessions = max_sessions;
  t->max_user_bytes = max_bytes;
}

void sk_session_table_set_release(struct sk_session_table *t,
                                  void (*release_obj)(void *user, struct sk_store_obj *obj),
                                  void *user) {
  t->release_obj = release_obj;
  t->release_user = user;
}

void sk_session_table_seen_id(struct sk_session_table *t, uint64_t id) {
  if (id > SK_SESSION_ID_MAX) id = SK_SESSION_ID_MAX; /* the store caps it */
  if (id >= t->next_id) t->next_id = id + 1;
}

/* Unmaps the object (the file stays) and frees s. */
static void session_destroy(struct sk_session *s) {
  if (!s) return;
  sk_conv_free(&s->conv);
  sk_store_obj_free(s->obj);
  sk_spec_free(s->spec);
  free(s->attn.sink_mass);
  free(s->attn.entropy);
  free(s->sp_kept);
  free(s);
}

void sk_session_table_free(struct sk_session_table *t) {
  if (!t->items) return;
  for (uint32_t i = 0; i < t->cap; i++) session_destroy(t->items[i]);
  free(t->items);
  free(t->pending);
  pthread_mutex_destroy(&t->counters_lock);
  memset(t, 0, sizeof *t);
}

/* A free slot in the table, growing it if every slot is taken (adoption
 * may exceed max_sessions). Returns the index or UINT32_MAX. */
static uint32_t table_slot(struct sk_session_table *t) {
  for (uint32_t i = 0; i < t->cap; i++)
    if (!t->items[i]) return i;
  if (t->cap > UINT32_MAX / 2) return UINT32_MAX;
  struct sk_session **n = realloc(t->items, 2 * (size_t)t->cap * sizeof *n);
  if (!n) return UINT32_MAX;
  memset(n + t->cap, 0, t->cap * sizeof *n);
  t->items = n;
  t->cap *= 2;
  return t->cap / 2;
}

/* Limits for one more session of `bytes`, counting reserved opens. */
static int check_limits(const struct sk_session_table *t, size_t bytes,
                        struct sk_error *err) {
  if (t->next_id > SK_SESSION_ID_MAX)
    return sk_error_set(err, SK_ERR_BUSY,
                        "no session id left: this state directory has used every id up to %"
                        PRIu64, (uint64_t)SK_SESSION_ID_MAX);
  const uint64_t count = (uint64_t)t->count + t->n_reserved;
  const uint64_t used = t->bytes + t->reserved_bytes + t->pending_bytes;
  if (count >= t->max_sessions)
    return sk_error_set(err, SK_ERR_BUSY,
                        "session limit reached: %" PRIu64 " sessions open (max_sessions %u): "
                        "`sinkctl list` shows them, `sinkctl close --idle 1h` closes those "
                        "idle for an hour",
                        count, t->max_sessions);
  if (bytes == 0 && used >= t->max_bytes) /* an import, its size not known yet */
    return sk_error_set(err, SK_ERR_BUSY,
                        "memory limit reached: %" PRIu64 " bytes of sessions, max_memory %" PRIu64
                        " bytes",
                        used, t->max_bytes);
  if (bytes > t->max_bytes || used > t->max_bytes - bytes)
    return sk_error_set(err, SK_ERR_BUSY,
                        "memory limit reached: %" PRIu64 " bytes of sessions + %zu for this "
                        "one exceed max_memory %" PRIu64 " bytes",
                        used, bytes, t->max_bytes);
  return 0;
}

/* Wraps obj into a session in the table (slot reserved by the caller). */
static struct sk_session *session_insert(struct sk_session_table *t, uint32_t slot,
                                         struct sk_store_obj *obj) {
  struct sk_session *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  const struct sk_kv_header *h = obj->kv.hdr;
  s->attn.n_layer = h->n_layer;
  s->attn.sink_mass = calloc((size_t)SK_LIMIT_ATTN_STEPS * h->n_layer, sizeof(float));
  s->attn.entropy = calloc((size_t)SK_LIMIT_ATTN_STEPS * h->n_layer, sizeof(float));
  s->sp_kept = calloc(h->n_layer, sizeof *s->sp_kept);
  struct sk_kv_params kp = {.policy = h->policy, .n_sink = h->n_sink, .window = h->window,
                            .heavy = h->heavy, .recent = h->recent, .n_pin = h->n_pin,
                            .capacity = h->capacity, .rope_scale = h->rope_scale};
  struct sk_error e;
  if (!s->attn.sink_mass || !s->attn.entropy || !s->sp_kept ||
      sk_spec_new(&t->spec_cfg, &kp, &s->spec, &e) < 0) {
    free(s->attn.sink_mass);
    free(s->attn.entropy);
    free(s->sp_kept);
    free(s);
    return NULL;
  }
  s->id = obj->id;
  s->owner_uid = obj->owner_uid;
  s->obj = obj;
  s->kv = &obj->kv;
  s->params.policy = h->policy;
  s->params.n_sink = h->n_sink;
  s->params.window = h->window;
  s->params.heavy = h->heavy;
  s->params.recent = h->recent;
  s->params.n_pin = h->n_pin;
  s->params.capacity = h->capacity;
  s->params.rope_scale = h->rope_scale;
  s->params.sparsity = obj->meta->sparsity;
  s->params.spec_mode = obj->meta->spec_mode;
  s->params.spec_tokens = obj->meta->spec_tokens;
  s->params.spec_fixed = obj->meta->spec_fixed != 0;
  s->capacity = h->capacity;
  s->object_bytes = obj->size, s->kv_bytes = sk_kv_tensor_bytes(&obj->kv);
  s->spec_needs = sk_spec_needs(&t->spec_cfg, s->params.spec_mode);
  s->spec_bytes = sk_spec_bytes(&t->spec_cfg, &kp, s->spec_needs);
  sk_spec_allow(s->spec, s->spec_needs);
  s->kv_type = obj->hdr->kv_type;
  t->items[slot] = s;
  t->count++;
  t->bytes += s->object_bytes + s->spec_bytes;
  if (s->id >= t->next_id) t->next_id = s->id + 1;
  sk_session_counters_publish(t, s);
  return s;
}

/* Common tail of open/fork/import: obj was created for its id. */
static int session_take(struct sk_session_table *t, struct sk_store_obj *obj,
                        struct sk_session **ret, struct sk_error *err) {
  uint32_t slot = table_slot(t);
  struct sk_session *s = slot == UINT32_MAX ? NULL : session_insert(t, slot, obj);
  if (!s) {
    sk_store_obj_remove(obj);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for a session");
  }
  *ret = s;
  return 0;
}

int sk_session_reserve(struct sk_session_table *t, size_t bytes, uint32_t owner_uid,
                       struct sk_session_reservation *res, struct sk_error *err) {
  memset(res, 0, sizeof *res);
  res->fd = -1;
  int rc = check_limits(t, bytes, err);
  if (rc < 0) return rc;
  res->id = t->next_id++;
  res->owner_uid = owner_uid;
  res->bytes = bytes;
  t->n_reserved++;
  t->reserved_bytes += bytes;
  res->next = t->reservations;
  if (t->reservations) t->reservations->prev = res;
  t->reservations = res;
  return 0;
}

int sk_session_reserve_open(struct sk_session_table *t, const struct sk_kv_params *params,
                            uint32_t max_capacity, uint32_t owner_uid, uint32_t store_flags,
                            uint64_t seed, struct sk_session_reservation *res,
                            struct sk_error *err) {
  memset(res, 0, sizeof *res);
  res->fd = -1;
  int rc = sk_kv_params_check(params, max_capacity, err);
  if (rc < 0) return rc;
  size_t bytes = sk_store_object_size(t->store, sk_kv_params_capacity(params));
  if (bytes == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "capacity %u is too large for this machine",
                        sk_kv_params_capacity(params));
  bytes += sk_spec_bytes(&t->spec_cfg, params, sk_spec_needs(&t->spec_cfg, params->spec_mode));
  if ((rc = check_limits(t, bytes, err)) < 0) return rc;
  int fd = sk_store_create_file(t->store, t->next_id, err);
  if (fd < 0) return fd;
  if ((rc = sk_session_reserve(t, bytes, owner_uid, res, err)) < 0) { /* checked above */
    sk_store_create_end(t->store, fd, t->next_id);
    return rc;
  }
  res->fd = fd;
  res->store_flags = store_flags;
  res->params = *params;
  /* The protocol's generate defaults, and a PRNG seeded per session. */
  struct sk_sampler_params sp = {.temperature = (float)SK_GENERATE_DEFAULT_TEMPERATURE,
                                 .top_k = SK_GENERATE_DEFAULT_TOP_K,
                                 .top_p = (float)SK_GENERATE_DEFAULT_TOP_P,
                                 .seed = seed};
  sk_sampler_state_seed(&res->sampler, &sp);
  return 0;
}

int sk_session_reservation_create(struct sk_store *store, struct sk_session_reservation *res,
                                  struct sk_error *err) {
  return sk_store_create_in(store, res->fd, res->id, res->owner_uid, res->store_flags,
                            &res->params, &res->sampler,
                            &res->obj, err);
}

/* Ends res: its file descriptor (an open's) closed, the limits released. */
static void reservation_end(struct sk_session_table *t, struct sk_session_reservation *res) {
  if (res->fd >= 0) sk_store_create_end(t->store, res->fd, res->id);
  res->fd = -1;
  t->n_reserved--;
  t->reserved_bytes -= res->bytes;
  if (res->prev)
    res->prev->next = res->next;
  else
    t->reservations = res->next;
  if (res->next) res->next->prev = res->prev;
  res->prev = res->next = NULL;
  res->obj = NULL;
}

int sk_session_commit(struct sk_session_table *t, struct sk_session_reservation *res,
                      struct sk_session **ret, struct sk_error *err) {
  struct sk_store_obj *obj = res->obj;
  const bool sized = res->bytes != 0;
  reservation_end(t, res);
  int rc = sized ? 0 : check_limits(t, obj->size + sk_session_spec_bytes(t, obj), err);
  if (rc < 0) {
    sk_store_obj_remove(obj);
    return rc;
  }
  return session_take(t, obj, ret, err);
}

void sk_session_cancel(struct sk_session_table *t, struct sk_session_reservation *res) {
  sk_store_obj_remove(res->obj);
  reservation_end(t, res);
}

int sk_session_adopt(struct sk_session_table *t, struct sk_store_obj *obj,
                     struct sk_session **ret) {
  *ret = NULL;
  if (obj->flags & SK_STORE_TEMPORARY) {
    /* Its connection ended with the daemon that made it (which died:
     * a shutdown closes temporary sessions), so nobody can use it. */
    sk_log(SK_LOG_NOTICE, "session %llu of uid %u closed: temporary, and its connection ended "
           "with the previous daemon",
           (unsigned long long)obj->id, obj->owner_uid);
    sk_store_obj_remove(obj);
    return 0;
  }
  uint32_t slot = table_slot(t);
  struct sk_session *s = slot == UINT32_MAX ? NULL : session_insert(t, slot, obj);
  if (!s) {
    sk_store_obj_free(obj);
    return -SK_ERR_NO_MEMORY;
  }
  s->adopted = true;
  s->dropped_step = obj->dropped_step;
  *ret = s;
  return 0;
}

void sk_session_user_usage(const struct sk_session_table *t, uint32_t uid,
                           const struct sk_session *except, uint32_t *ret_n,
                           uint64_t *ret_bytes) {
  uint32_t n = 0;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < t->cap; i++) {
    const struct sk_session *s = t->items[i];
    if (!s || s == except || s->owner_uid != uid) continue;
    n++;
    bytes += s->object_bytes + s->spec_bytes;
  }
  for (const struct sk_session_reservation *r = t->reservations; r; r = r->next)
    if (r->owner_uid == uid) {
      n++;
      bytes += r->bytes;
    }
  for (uint32_t i = 0; i < t->n_pending; i++)
    if (t->pending[i].uid == uid) bytes += t->pending[i].bytes;
  *ret_n = n;
  *ret_bytes = bytes;
}

int sk_session_pending_grow(struct sk_session_table *t, uint32_t uid, uint64_t add,
                            struct sk_error *err) {
  uint32_t n;
  uint64_t mine;
  sk_session_user_usage(t, uid, NULL, &n, &mine);
  const uint64_t max = t->max_user_bytes;
  if (max && max < t->max_bytes && (add > max || mine > max - add))
    return sk_error_set(err, SK_ERR_BUSY,
                        "memory limit: uid %u's imports in progress would bring it to %" PRIu64
                        " bytes with its sessions (max_user_memory %" PRIu64 ")",
                        uid, mine + add, max);
  const uint64_t used = t->bytes + t->reserved_bytes + t->pending_bytes;
  if (add > t->max_bytes || used > t->max_bytes - add)
    return sk_error_set(err, SK_ERR_BUSY,
                        "memory limit: imports in progress would bring the daemon to %" PRIu64
                        " bytes with its sessions (max_memory %" PRIu64 "); uid %u's refused",
                        used + add, t->max_bytes, uid);
  struct sk_session_pending *p = NULL;
  for (uint32_t i = 0; i < t->n_pending && !p; i++)
    if (t->pending[i].uid == uid) p = &t->pending[i];
  if (!p) {
    if (t->n_pending == t->pending_cap) {
      uint32_t cap = t->pending_cap ? 2 * t->pending_cap : 8;
      struct sk_session_pending *np = realloc(t->pending, cap * sizeof *np);
      if (!np) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
      t->pending = np;
      t->pending_cap = cap;
    }
    p = &t->pending[t->n_pending++];
    *p = (struct sk_session_pending){.uid = uid};
  }
  p->bytes += add;
  t->pending_bytes += add;
  return 0;
}

void sk_session_pending_release(struct sk_session_table *t, uint32_t uid, uint64_t bytes) {
  for (uint32_t i = 0; i < t->n_pending; i++) {
    struct sk_session_pending *p = &t->pending[i];
    if (p->uid != uid) continue;
    if (bytes > p->bytes) bytes = p->bytes;
    p->bytes -= bytes;
    t->pending_bytes -= bytes;
    if (p->bytes == 0) *p = t->pending[--t->n_pending];
    return;
  }
}

int sk_session_check_user(const struct sk_session_table *t, uint32_t uid, size_t bytes,
                          const struct sk_session *except, bool temporary,
                          struct sk_error *err) {
  uint32_t n;
  uint64_t used;
  sk_session_user_usage(t, uid, except, &n, &used);
  const uint32_t max_n = t->max_user_sessions;
  const uint32_t allowed = max_n + (temporary ? SK_LIMIT_TEMP_SESSIONS : 0);
  if (max_n && max_n < t->max_sessions && n >= allowed)
    return sk_error_set(err, SK_ERR_BUSY,
                        "uid %u already has %u sessions (max_user_sessions %u, %u more for "
                        "temporary sessions): `sinkctl list` shows them, `sinkctl close --idle "
                        "1h` closes those idle for an hour",
                        uid, n, max_n, SK_LIMIT_TEMP_SESSIONS);
  const uint64_t max = t->max_user_bytes;
  if (max && max < t->max_bytes && (bytes > max || used > max - bytes))
    return sk_error_set(err, SK_ERR_BUSY,
                        "a session of %zu bytes would bring uid %u to %llu bytes "
                        "(max_user_memory %llu): `sinkctl list` shows them, `sinkctl close ID` "
                        "closes one",
                        bytes, uid, (unsigned long long)(used + bytes), (unsigned long long)max);
  return 0;
}

struct sk_session *sk_session_find(struct sk_session_table *t, uint64_t id) {
  for (uint32_t i = 0; i < t->cap; i++)
    if (t->items[i] && t->items[i]->id == id) return t->items[i];
  return NULL;
}

void sk_session_remove(struct sk_session_table *t, struct sk_session *s) {
  for (uint32_t i = 0; i < t->cap; i++) {
    if (t->items[i] == s) {
      t->items[i] = NULL;
      t->count--;
      t->bytes -= s->object_bytes + s->spec_bytes;
      break;
    }
  }
  sk_conv_remove(sk_store_dirfd(t->store), s->id);
  sk_conv_free(&s->conv);
  sk_store_obj_unlink(s->obj);
  if (t->release_obj)
    t->release_obj(t->release_user, s->obj);
  else
    sk_store_obj_free(s->obj);
  s->obj = NULL;
  sk_spec_free(s->spec);
  free(s->attn.sink_mass);
  free(s->attn.entropy);
  free(s->sp_kept);
  free(s);
}

bool sk_session_has_logits(const struct sk_session *s) {
  return sk_store_has_logits(s->obj);
}

void sk_session_counters_get(struct sk_session_table *t,
                             const struct sk_session *s,
                             struct sk_session_counters *ret) {
  pthread_mutex_lock(&t->counters_lock);
  *ret = s->pub;
  pthread_mutex_unlock(&t->counters_lock);
}

void sk_session_counters_publish(struct sk_session_table *t,
                                 struct sk_session *s) {
  pthread_mutex_lock(&t->counters_lock);
  s->pub.resident = s->kv->hdr->n_resident;
  s->pub.seen = s->kv->hdr->n_seen;
  s->pub.evicted = s->kv->hdr->n_evicted;
  s->pub.commit = sk_store_commit_count(s->obj);
  sk_spec_counters(s->spec, &s->pub.spec);
  pthread_mutex_unlock(&t->counters_lock);
}

void sk_session_attn_record(struct sk_session_table *t, struct sk_session *s,
                            const struct sk_scratch *scratch, uint32_t seq) {
  const float *mass, *ent;
  uint32_t probe;
  if (!sk_scratch_attn(scratch, seq, &mass, &ent, &probe)) return;
  struct sk_attn_stats *a = &s->attn;
  pthread_mutex_lock(&t->counters_lock);
  memcpy(a->sink_mass + (size_t)a->next * a->n_layer, mass,
         a->n_layer * sizeof(float));
  memcpy(a->entropy + (size_t)a->next * a->n_layer, ent,
         a->n_layer * sizeof(float));
  a->next = (a->next + 1) % SK_LIMIT_ATTN_STEPS;
  if (a->n_steps < SK_LIMIT_ATTN_STEPS) a->n_steps++;
  a->probe = probe;
  pthread_mutex_unlock(&t->counters_lock);
}

uint32_t sk_session_attn_get(struct sk_session_table *t,
                             const struct sk_session *s, float *ret_sink_mass,
                             float *ret_entropy, uint32_t *ret_probe) {
  const struct sk_attn_stats *a = &s->attn;
  pthread_mutex_lock(&t->counters_lock);
  uint32_t n = a->n_steps;
  for (uint32_t l = 0; l < a->n_layer && n > 0; l++) {
    double m = 0.0, e = 0.0;
    for (uint32_t i = 0; i < n; i++) {
      m += a->sink_mass[(size_t)i * a->n_layer + l];
      e += a->entropy[(size_t)i * a->n_layer + l];
    }
    ret_sink_mass[l] = (float)(m / n);
    ret_entropy[l] = (float)(e / n);
  }
  *ret_probe = a->probe;
  pthread_mutex_unlock(&t->counters_lock);
  return n;
}

void sk_job_free(struct sk_job *j) {
  if (!j) return;
  for (size_t i = 0; i < j->n_chat; i++) {
    free(j->chat_msgs[i].role);
    free(j->chat_msgs[i].content);
  }
  free(j->chat_msgs);
  free(j->reply);
  free(j->logprobs);
  free(j->text);
  free(j->tokens);
  for (uint32_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
  if (j->sampler_ready) sk_sampler_free(&j->sampler);
  free(j->spec_logits);
  free(j->spec_q);
  free(j->spec_p);
  free(j->row_scores);
  free(j->dfeed);
  for (uint32_t i = 0; i < j->spec_n_ev; i++) free(j->spec_ev[i]);
  free(j);
}

/* ---- chat ---- */

void sk_job_reply_add(struct sk_job *j, const char *text, size_t len) {
  if (!len || j->reply_cap == SIZE_MAX) return;
  if (j->reply_len + len + 1 > j->reply_cap) {
    size_t cap = j->reply_cap ? 2 * j->reply_cap : 256;
    while (cap < j->reply_len + len + 1) cap *= 2;
    char *p = realloc(j->reply, cap);
    if (!p) { /* the reply is lost to the conversation, not the client */
      j->reply_cap = SIZE_MAX;
      return;
    }
    j->reply = p;
    j->reply_cap = cap;
  }
  memcpy(j->reply + j->reply_len, text, len);
  j->reply_len += len;
  j->reply[j->reply_len] = 0;
}

/* The text of the session's resident tokens appended after stream index
 * `from`, as their pieces joined (malloc'd, *ret NULL when none). */
static int text_after(const struct sk_session *s, const struct sk_tokenizer *tok, uint64_t from,
                      char **ret, size_t *ret_len, struct sk_error *err) {
  const struct sk_kv *kv = s->kv;
  struct sk_job tmp = {0};
  for (uint32_t p = 0; p < kv->hdr->n_resident; p++) {
    if (sk_kv_index_at(kv, p) < from) continue;
    const char *piece = NULL;
    size_t n = 0;
    if (sk_tokenizer_piece(tok, kv->token[sk_kv_slot(kv, p)], &piece, &n, err) < 0) continue;
    sk_job_reply_add(&tmp, piece, n);
  }
  if (tmp.reply_cap == SIZE_MAX) {
    free(tmp.reply);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  *ret = tmp.reply;
  *ret_len = tmp.reply_len;
  return 0;
}

/* A growing array of token ids. */
struct ids {
  int32_t *v;
  size_t n, cap;
};

static int ids_push(struct ids *a, const int32_t *v, size_t n) {
  if (a->n + n > a->cap) {
    size_t cap = a->cap ? a->cap : 64;
    while (cap < a->n + n) cap *= 2;
    int32_t *p = realloc(a->v, cap * sizeof *p);
    if (!p) return -SK_ERR_NO_MEMORY;
    a->v = p;
    a->cap = cap;
  }
  memcpy(a->v + a->n, v, n * sizeof *v);
  a->n += n;
  return 0;
}

/* Plain text (no special tokens recognised, no BOS) onto a. */
static int encode_text(const struct sk_tokenizer *tok, const char *text, size_t len, struct ids *a,
                       struct sk_error *err) {
  if (len == 0) return 0;
  int32_t *t = NULL;
  size_t n = 0;
  int rc = sk_tokenizer_encode(tok, text, len, 0, &t, &n, err);
  if (rc == 0 && ids_push(a, t, n) < 0) rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  free(t);
  return rc;
}

/* The control token whose text starts template text s[0..n) (longest
 * first), or -1 with *ret_len 0. Control tokens are those whose piece is
 * empty although their text is not ("<|im_start|>", "<s>"). */
static int32_t control_at(const struct sk_tokenizer *tok, const char *s, size_t n,
                          size_t *ret_len) {
  /* the longest special-token text of the templates is some 30 bytes */
  for (size_t len = n < 64 ? n : 64; len >= 2; len--) {
    int32_t id = sk_tokenizer_find(tok, s, len);
    const char *piece;
    size_t piece_len = 1;
    if (id >= 0 && sk_tokenizer_piece(tok, id, &piece, &piece_len, NULL) == 0 && piece_len == 0) {
      *ret_len = len;
      return id;
    }
  }
  *ret_len = 0;
  return -1;
}

/* Tokens of a rendering as llama.cpp tokenizes a whole prompt with
 * parse_special on (tokenizer_st_partition: special tokens cut out, the
 * text between them tokenized piece by piece), except that special
 * tokens are recognised only in the template's own text: the text between
 * two special tokens (template text and content together) is one piece,
 * tokenized as plain text. */
int sk_session_chat_tokenize(const struct sk_tokenizer *tok, const struct sk_chat_text *t,
                             bool bos, int32_t **ret, size_t *ret_n, struct sk_error *err) {
  struct ids a = {0};
  int rc = 0;
  const int32_t bos_id = sk_tokenizer_bos(tok);
  if (bos && bos_id >= 0) rc = ids_push(&a, &bos_id, 1);
  size_t raw = 0; /* start of the text not tokenized yet */
  for (size_t k = 0; rc == 0 && k < t->n_segs; k++) {
    const struct sk_chat_seg *g = &t->segs[k];
    if (g->content) continue; /* joins the text around it */
    for (size_t i = g->off; rc == 0 && i < g->off + g->len;) {
      size_t len = 0;
      int32_t id = control_at(tok, t->text + i, g->off + g->len - i, &len);
      if (id < 0) {
        i++;
        continue;
      }
      rc = encode_text(tok, t->text + raw, i - raw, &a, err);
      if (rc == 0 && ids_push(&a, &id, 1) < 0) rc = -SK_ERR_NO_MEMORY;
      i += len;
      raw = i;
    }
  }
  if (rc == 0) rc = encode_text(tok, t->text + raw, t->len - raw, &a, err);
  if (rc == -SK_ERR_NO_MEMORY) sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  if (rc < 0) {
    free(a.v);
    return rc;
  }
  *ret = a.v;
  *ret_n = a.n;
  return 0;
}

bool sk_session_is_system_role(const char *role, size_t len) {
  return (len == 6 && memcmp(role, "system", 6) == 0) ||
         (len == 9 && memcmp(role, "developer", 9) == 0);
}

const char *sk_session_pin_raise(uint32_t policy) {
  const unsigned parts = sk_policy_parts_of(policy);
  if (parts & SK_PART_CAPACITY)
    return "open the session with a larger 'capacity' (the daemon's default: sinkd "
           "--capacity)";
  if (parts & SK_PART_HEAVY) return "open the session with larger 'heavy' and 'recent'";
  return "open the session with a larger 'window' (the daemon's default: sinkd --window)";
}

int sk_session_chat_begin(struct sk_session *s, const struct sk_tokenizer *tok,
                          struct sk_job *job) {
  struct sk_conv *cv = &s->conv;
  struct sk_error *err = &job->err;
  const struct sk_kv *kv = s->kv;
  if (cv->tmpl == SK_CHAT_NONE)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "session %llu has no chat template: open it with chat_template, or "
                        "start the daemon with --chat-template",
                        (unsigned long long)s->id);
  struct sk_chat_msg *m = calloc(job->n_chat ? job->n_chat : 1, sizeof *m);
  if (!m) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  for (size_t i = 0; i < job->n_chat; i++)
    m[i] = (struct sk_chat_msg){job->chat_msgs[i].role, job->chat_msgs[i].role_len,
                                job->chat_msgs[i].content, job->chat_msgs[i].content_len};
  /* An empty session holds no conversation: what a chat that never got
   * its first tokens in left behind (a failure, a cancel) is dropped. */
  if (kv->hdr->n_seen == 0 && (cv->has_system || cv->n_msgs || cv->text_len)) {
    const int tmpl = cv->tmpl;
    sk_conv_free(cv);
    sk_conv_init(cv, tmpl);
  }
  size_t first = 0;
  int rc = 0;
  int32_t *pin = NULL; /* the pinned prefix's tokens (n_pin), BOS first */
  size_t n_pin = 0;
  char *extra = NULL;
  size_t extra_len = 0;
  struct sk_chat_text delta;
  sk_chat_text_init(&delta);
  for (size_t i = 0; i < job->n_chat; i++) {
    if (!sk_session_is_system_role(m[i].role, m[i].role_len)) continue;
    const bool empty = !cv->has_system && !cv->n_msgs && !kv->hdr->n_seen;
    if (i > 0 && empty) {
      rc = sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "messages[%zu]: a system message goes first: put it before the others",
                        i);
      goto out;
    }
    if (!empty) {
      rc = sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "messages[%zu]: a system prompt goes first, into an empty session (at "
                        "open, 'system', or as the first message of its first chat); this "
                        "session %s: open a new one for a new system prompt",
                        i,
                        cv->has_system ? "has one already" : "holds a conversation already");
      goto out;
    }
  }
  if (job->n_chat && sk_session_is_system_role(m[0].role, m[0].role_len)) {
    /* The first chat's system prompt. Where the policy has a sink region
     * (streaming, sink_h2o; a dense cache's start) it is pinned in full as
     * the session's sinks, the window keeping the rest of the budget
     * (sk_kv_params_pin), tokenized apart from what follows, as open's
     * 'system' is; policies without one (window, h2o) take it as text
     * like the rest. */
    if ((rc = sk_conv_set_system(cv, m[0].content, m[0].content_len, err)) < 0) goto out;
    first = 1;
    const uint32_t policy = kv->hdr->policy;
    if (sk_policy_parts_of(policy) & SK_PART_PIN) {
      struct sk_chat_text st;
      sk_chat_text_init(&st);
      rc = sk_conv_system_text(cv, &st, err);
      if (rc == 0)
        rc = sk_session_chat_tokenize(tok, &st, sk_tokenizer_add_bos(tok), &pin, &n_pin, err);
      const struct sk_kv_params cur = {.policy = policy, .n_sink = kv->hdr->n_sink,
                                       .window = kv->hdr->window, .heavy = kv->hdr->heavy,
                                       .recent = kv->hdr->recent,
                                       .capacity = kv->hdr->capacity,
                                       .rope_scale = kv->hdr->rope_scale};
      struct sk_kv_params pinned;
      if (rc == 0)
        rc = sk_kv_params_pin(&cur, n_pin > UINT32_MAX ? UINT32_MAX : (uint32_t)n_pin,
                              sk_session_pin_raise(policy), &pinned, err);
      if (rc == 0) {
        /* the conversation's text so far is the prefix's (n_seen stays
         * the cache's: nothing is in it yet) */
        sk_conv_system_pinned(cv, &st, 0);
        job->pin_prefix = (uint32_t)n_pin; /* set with the first chunk (scheduler.c) */
      }
      sk_chat_text_free(&st);
      if (rc < 0) goto out;
    }
  }
  /* Tokens that arrived after the state's text (other ops, or a reply a
   * crash cut short) are read back as text. */
  if (kv->hdr->n_seen > cv->n_seen &&
      (rc = text_after(s, tok, cv->n_seen, &extra, &extra_len, err)) < 0)
    goto out;
  if ((rc = sk_conv_delta(cv, m + first, job->n_chat - first, extra, extra_len, &delta, err)) < 0)
    goto out;
  if (extra_len && cv->n_msgs) {
    /* the reply now includes them */
    struct sk_conv_msg *r = &cv->msgs[cv->n_msgs - 1];
    if (r->role_len == 9 && memcmp(r->role, "assistant", 9) == 0) {
      char *c2 = realloc(r->content, r->content_len + extra_len + 1);
      if (c2) {
        memcpy(c2 + r->content_len, extra, extra_len);
        r->content = c2;
        r->content_len += extra_len;
        c2[r->content_len] = 0;
      }
    }
  }
  int32_t *toks = NULL;
  size_t n = 0;
  if ((rc = sk_session_chat_tokenize(tok, &delta,
                                      kv->hdr->n_seen == 0 && !pin && sk_tokenizer_add_bos(tok),
                                      &toks, &n, err)) < 0)
    goto out;
  if (pin) {
    /* the pinned prefix, then the rest of the delta */
    int32_t *all = realloc(pin, (n_pin + n + 1) * sizeof *all);
    if (!all) {
      free(toks);
      rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
      goto out;
    }
    pin = NULL;
    if (n) memcpy(all + n_pin, toks, n * sizeof *toks);
    free(toks);
    toks = all;
    n += n_pin;
  }
  free(job->tokens);
  job->tokens = toks;
  job->n_tokens = n;
  /* The end of turn: the control token the template closes a reply with
   * ("<|im_end|>"), when the vocabulary has it; the model's end of
   * generation tokens stop a reply anyway. */
  job->eot = -1;
  const char *eot = NULL;
  size_t eot_len = 0;
  struct sk_chat_text scratch;
  sk_chat_text_init(&scratch);
  if (sk_chat_end_of_turn(cv->tmpl, &scratch, &eot, &eot_len, err) == 0 && eot_len) {
    size_t len = 0;
    int32_t id = control_at(tok, eot, eot_len, &len);
    if (id >= 0 && len == eot_len) job->eot = id;
  }
  sk_chat_text_free(&scratch);
  /* the messages as the conversation keeps them (system set aside) */
  if (first) {
    free(job->chat_msgs[0].role);
    free(job->chat_msgs[0].content);
    memmove(job->chat_msgs, job->chat_msgs + 1, (job->n_chat - 1) * sizeof *job->chat_msgs);
    job->n_chat--;
  }
out:
  free(m);
  free(extra);
  free(pin);
  sk_chat_text_free(&delta);
  return rc;
}

static void chat_save(struct sk_session *s) {
  struct sk_error e;
  if (sk_conv_save(&s->conv, sk_store_dirfd(s->obj->store), s->id, &e) < 0)
    sk_log(SK_LOG_WARNING, "session %llu: conversation not saved: %s", (unsigned long long)s->id,
           e.message);
}

void sk_session_chat_prompt_done(struct sk_session *s, struct sk_job *job) {
  if (job->prompt_done) return;
  job->prompt_done = true;
  struct sk_chat_msg m[SK_LIMIT_CONV_MSGS];
  size_t n = job->n_chat < SK_LIMIT_CONV_MSGS ? job->n_chat : SK_LIMIT_CONV_MSGS;
  for (size_t i = 0; i < n; i++)
    m[i] = (struct sk_chat_msg){job->chat_msgs[i].role, job->chat_msgs[i].role_len,
                                job->chat_msgs[i].content, job->chat_msgs[i].content_len};
  struct sk_error e;
  if (sk_conv_commit_prompt(&s->conv, m, n, s->kv->hdr->n_seen, &e) < 0) return;
  chat_save(s);
}

void sk_session_chat_end(struct sk_session *s, struct sk_job *job) {
  if (!job->prompt_done) return;
  struct sk_error e;
  if (sk_conv_commit_reply(&s->conv, job->reply ? job->reply : "", job->reply_len,
                           s->kv->hdr->n_seen, &e) < 0)
    return;
  chat_save(s);
}

void sk_session_sparse_record(struct sk_session_table *t, struct sk_session *s,
                              const uint64_t *kept, uint32_t rows) {
  pthread_mutex_lock(&t->counters_lock);
  for (uint32_t l = 0; l < s->attn.n_layer; l++) s->sp_kept[l] += kept[l];
  s->sp_tokens += rows;
  pthread_mutex_unlock(&t->counters_lock);
}

uint64_t sk_session_sparse_get(struct sk_session_table *t, const struct sk_session *s,
                               uint64_t *ret_kept) {
  pthread_mutex_lock(&t->counters_lock);
  memcpy(ret_kept, s->sp_kept, s->attn.n_layer * sizeof *ret_kept);
  const uint64_t n = s->sp_tokens;
  pthread_mutex_unlock(&t->counters_lock);
  return n;
}

/* ---- a session's jobs ---- */

bool sk_job_is_inline(const struct sk_job *j) {
  return j->kind == SK_JOB_FORK || j->kind == SK_JOB_EXPORT || j->kind == SK_JOB_STATS;
}

int sk_session_enqueue(struct sk_session *s, struct sk_job *job, struct sk_error *err) {
  if (!s->running) return 1;
  if (s->n_queued >= SK_LIMIT_SESSION_QUEUE)
    return sk_error_set(err, SK_ERR_BUSY, "session %llu has %u requests queued (limit %u)",
                        (unsigned long long)s->id, s->n_queued, SK_LIMIT_SESSION_QUEUE);
  job->next = NULL;
  if (s->queue_tail) s->queue_tail->next = job; else s->queue_head = job;
  s->queue_tail = job;
  s->n_queued++;
  return 0;
}

struct sk_job *sk_session_next(struct sk_session *s) {
  while (!s->running && s->queue_head) {
    struct sk_job *j = s->queue_head;
    s->queue_head = j->next;
    if (!s->queue_head) s->queue_tail = NULL;
    s->n_queued--;
    j->next = NULL;
    if (!j->conn && (j->kind == SK_JOB_GENERATE || sk_job_is_inline(j))) {
      sk_job_free(j);
      continue;
    }
    return j;
  }
  return NULL;
}

void sk_session_run(struct sk_session *s, struct sk_job *job) { s->running = job; }

void sk_session_job_done(struct sk_session *s) {
  struct sk_job *j = s->running;
  s->running = NULL;
  if (j && j->pin_prefix) {
    /* a chat pinned its system prompt: the parameters are the header's */
    const struct sk_kv_header *h = s->kv->hdr;
    s->params.n_sink = h->n_sink;
    s->params.window = h->window;
    s->params.heavy = h->heavy;
    s->params.recent = h->recent;
    s->params.n_pin = h->n_pin;
  }
  s->last_used_ms = sk_clock_ms();
  sk_job_free(j);
}

bool sk_session_close(struct sk_session *s, struct sk_job **ret_queued) {
  *ret_queued = s->queue_head;
  s->queue_head = s->queue_tail = NULL;
  s->n_queued = 0;
  if (!s->running) return true;
  s->closing = true;
  atomic_store(&s->running->session_closing, true);
  atomic_store(&s->running->cancel, true);
  return false;
}

void sk_session_close_after(struct sk_session *s) { s->closing = true; }

bool sk_session_closed(const struct sk_session *s) { return s->closing && !s->running; }

bool sk_session_detach(struct sk_session *s, const struct sk_conn *conn, uint64_t conn_id) {
  if (s->running && s->running->conn == conn) {
    s->running->conn = NULL;
    if (s->running->kind == SK_JOB_GENERATE) atomic_store(&s->running->cancel, true);
    atomic_store(&s->running->paused, false);
  }
  for (struct sk_job *j = s->queue_head; j; j = j->next)
    if (j->conn == conn) {
      j->conn = NULL;
      if (j->kind == SK_JOB_GENERATE) atomic_store(&j->cancel, true);
    }
  return s->temp_conn == conn_id && !s->closing;
}

void sk_session_pause(struct sk_session *s, const struct sk_conn *conn, bool paused) {
  if (s->running && s->running->conn == conn) atomic_store(&s->running->paused, paused);
}

bool sk_session_cancel_generate(struct sk_session *s) {
  bool any = false;
  if (s->running && s->running->kind == SK_JOB_GENERATE) {
    atomic_store(&s->running->cancel, true);
    any = true;
  }
  for (struct sk_job *j = s->queue_head; j; j = j->next)
    if (j->kind == SK_JOB_GENERATE) {
      atomic_store(&j->cancel, true);
      any = true;
    }
  return any;
}

void sk_session_touch(struct sk_session *s) { s->last_used_ms = sk_clock_ms(); }

void sk_session_set_temporary(struct sk_session *s, uint64_t conn_id) { s->temp_conn = conn_id; }

void sk_session_set_conv(struct sk_session *s, struct sk_conv *conv) {
  sk_conv_free(&s->conv);
  s->conv = *conv;
  sk_conv_init(conv, SK_CHAT_NONE);
}

void sk_session_set_template(struct sk_session *s, int tmpl) {
  sk_conv_free(&s->conv);
  sk_conv_init(&s->conv, tmpl);
}

int sk_session_conv_load(struct sk_session *s, int dirfd, struct sk_error *err) {
  return sk_conv_load(&s->conv, dirfd, s->id, err);
}

/* ---- a step of the session's state ---- */

void sk_session_step_begin(struct sk_session *s) { sk_store_begin(s->obj); }
void sk_session_step_begin_decode(struct sk_session *s) { sk_store_begin_decode(s->obj); }
void sk_session_step_keep_logits(struct sk_session *s) { sk_store_keep_logits(s->obj); }
void sk_session_step_set_logits(struct sk_session *s, const float *logits) {
  sk_store_set_logits(s->obj, logits);
}
void sk_session_step_commit(struct sk_session *s) { sk_store_commit(s->obj); }
void sk_session_step_abort(struct sk_session *s) { sk_store_abort(s->obj); }
float *sk_session_logits(struct sk_session *s) { return s->obj->logits; }

void sk_session_sampler_get(const struct sk_session *s, struct sk_sampler_state *ret) {
  sk_store_sampler_get(s->obj, ret);
}
void sk_session_sampler_set(struct sk_session *s, const struct sk_sampler_state *st) {
  sk_store_sampler_set(s->obj, st);
}
void sk_session_utf8_get(const struct sk_session *s, struct sk_utf8_stream *ret) {
  sk_store_utf8_get(s->obj, ret);
}
void sk_session_utf8_set(struct sk_session *s, const struct sk_utf8_stream *u) {
  sk_store_utf8_set(s->obj, u);
}

/* ---- what a session is ---- */

struct sk_session *sk_session_table_next(const struct sk_session_table *t, uint32_t *pos) {
  for (; *pos < t->cap; (*pos)++)
    if (t->items[*pos]) return t->items[(*pos)++];
  return NULL;
}

uint32_t sk_session_table_count(const struct sk_session_table *t) { return t->count; }
uint64_t sk_session_table_bytes(const struct sk_session_table *t) { return t->bytes; }
uint32_t sk_session_table_max_sessions(const struct sk_session_table *t) {
  return t->max_sessions;
}
uint64_t sk_session_table_max_bytes(const struct sk_session_table *t) { return t->max_bytes; }

uint64_t sk_session_id(const struct sk_session *s) { return s->id; }
uint32_t sk_session_owner(const struct sk_session *s) { return s->owner_uid; }
const struct sk_kv_params *sk_session_params(const struct sk_session *s) { return &s->params; }
bool sk_session_closing(const struct sk_session *s) { return s->closing; }
int sk_session_chat_template(const struct sk_session *s) { return s->conv.tmpl; }

void sk_session_describe(const struct sk_session *s, struct sk_session_desc *ret) {
  *ret = (struct sk_session_desc){
      .id = s->id,
      .owner_uid = s->owner_uid,
      .params = s->params,
      .capacity = s->capacity,
      .kv_type = s->kv_type,
      .n_layer = s->attn.n_layer,
      .object_bytes = s->object_bytes,
      .spec_bytes = s->spec_bytes,
      .kv_bytes = s->kv_bytes,
      .created_unix = s->obj->hdr->created_unix,
      .last_used_ms = s->last_used_ms,
      .adopted = s->adopted,
      .dropped_step = s->dropped_step,
      .busy = s->running != NULL,
      .queued = s->queue_head != NULL,
      .temporary = s->temp_conn != 0,
      .chat_template = s->conv.tmpl,
  };
}

struct sk_kv *sk_session_kv(struct sk_session *s) { return s->kv; }
struct sk_spec *sk_session_spec(struct sk_session *s) { return s->spec; }

void sk_session_table_set_spec(struct sk_session_table *t, const struct sk_spec_config *cfg) {
  t->spec_cfg = *cfg;
}

size_t sk_session_spec_bytes(const struct sk_session_table *t, const struct sk_store_obj *obj) {
  const struct sk_kv_header *h = obj->kv.hdr;
  struct sk_kv_params kp = {.policy = h->policy, .n_sink = h->n_sink, .window = h->window,
                            .heavy = h->heavy, .recent = h->recent, .n_pin = h->n_pin,
                            .capacity = h->capacity, .rope_scale = h->rope_scale};
  return sk_spec_bytes(&t->spec_cfg, &kp, sk_spec_needs(&t->spec_cfg, obj->meta->spec_mode));
}

void sk_session_table_set_spec_default(struct sk_session_table *t, uint32_t mode) {
  t->spec_cfg.default_mode = mode;
}

int sk_session_spec_charge(struct sk_session_table *t, struct sk_session *s, uint32_t mode,
                           struct sk_error *err) {
  const unsigned needs =
      s->spec_needs | sk_spec_needs(&t->spec_cfg, mode ? mode : s->params.spec_mode);
  if (needs == s->spec_needs) return 0;
  const size_t bytes = sk_spec_bytes(&t->spec_cfg, &s->params, needs);
  const size_t delta = bytes - s->spec_bytes;
  const uint64_t used = t->bytes + t->reserved_bytes;
  if (delta > t->max_bytes || used > t->max_bytes - delta)
    return sk_error_set(err, SK_ERR_BUSY,
                        "memory limit reached: %" PRIu64 " bytes of sessions + %zu for session "
                        "%" PRIu64 "'s speculation exceed max_memory %" PRIu64 " bytes",
                        used, delta, s->id, t->max_bytes);
  int rc = sk_session_check_user(t, s->owner_uid, s->object_bytes + bytes, s, false, err);
  if (rc < 0) return rc;
  t->bytes += delta;
  s->spec_bytes = bytes;
  s->spec_needs = needs;
  sk_spec_allow(s->spec, needs);
  return 0;
}
struct sk_store_obj *sk_session_object(const struct sk_session *s) { return s->obj; }

uint32_t sk_session_resident(const struct sk_session *s) { return sk_kv_resident(s->kv); }

uint32_t sk_session_resident_ranges(const struct sk_session *s, uint64_t *first, uint64_t *last,
                                    uint32_t max) {
  const struct sk_kv *kv = s->kv;
  const uint32_t nr = sk_kv_resident(kv);
  uint32_t n = 0;
  for (uint32_t p = 0; p < nr;) {
    uint32_t q = p;
    while (q + 1 < nr && sk_kv_index_at(kv, q + 1) == sk_kv_index_at(kv, q) + 1) q++;
    if (n < max) {
      first[n] = sk_kv_index_at(kv, p);
      last[n] = sk_kv_index_at(kv, q);
    }
    n++;
    p = q + 1;
  }
  return n;
}

void sk_session_resident_tokens(const struct sk_session *s, int32_t *ids) {
  const struct sk_kv *kv = s->kv;
  for (uint32_t p = 0; p < sk_kv_resident(kv); p++) ids[p] = kv->token[sk_kv_slot(kv, p)];
}

int sk_session_conv_save(const struct sk_session *s, int dirfd, uint64_t id,
                         struct sk_error *err) {
  if (s->conv.tmpl == SK_CHAT_NONE) return 0;
  int rc = sk_conv_save(&s->conv, dirfd, id, err);
  return rc < 0 ? rc : 1;
}
