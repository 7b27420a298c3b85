#include "session.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

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

/* Unmaps the object (the file stays) and frees s. */
static void session_destroy(struct sk_session *s) {
  if (!s) return;
  sk_store_obj_free(s->obj);
  free(s->attn.sink_mass);
  free(s->attn.entropy);
  free(s);
}

void sk_session_table_done(struct sk_session_table *t) {
  if (!t->items) return;
  for (uint32_t i = 0; i < t->cap; i++) session_destroy(t->items[i]);
  free(t->items);
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
  const uint64_t count = (uint64_t)t->count + t->n_reserved;
  const uint64_t used = t->bytes + t->reserved_bytes;
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
  s->attn.sink_mass = calloc((size_t)SK_ATTN_STEPS * h->n_layer, sizeof(float));
  s->attn.entropy = calloc((size_t)SK_ATTN_STEPS * h->n_layer, sizeof(float));
  if (!s->attn.sink_mass || !s->attn.entropy) {
    free(s->attn.sink_mass);
    free(s->attn.entropy);
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
  s->capacity = h->capacity;
  s->kv_bytes = obj->size;
  s->kv_type = obj->hdr->kv_type;
  t->items[slot] = s;
  t->count++;
  t->bytes += s->kv_bytes;
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

int sk_session_reserve(struct sk_session_table *t, const struct sk_kv_params *params,
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
  if ((rc = check_limits(t, bytes, err)) < 0) return rc;
  int fd = sk_store_create_file(t->store, t->next_id, err);
  if (fd < 0) return fd;
  res->fd = fd;
  res->id = t->next_id++;
  res->owner_uid = owner_uid;
  res->store_flags = store_flags;
  res->bytes = bytes;
  res->params = *params;
  /* The protocol's generate defaults, and a PRNG seeded per session. */
  struct sk_sampler_params sp = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f,
                                 .seed = seed};
  sk_sampler_state_seed(&res->sampler, &sp);
  t->n_reserved++;
  t->reserved_bytes += bytes;
  return 0;
}

int sk_session_reservation_create(struct sk_store *store, struct sk_session_reservation *res,
                                  struct sk_error *err) {
  return sk_store_create_in(store, res->fd, res->id, res->owner_uid, res->store_flags,
                            &res->params, &res->sampler,
                            &res->obj, err);
}

static void reservation_end(struct sk_session_table *t, struct sk_session_reservation *res) {
  sk_store_create_end(t->store, res->fd, res->id);
  res->fd = -1;
  t->n_reserved--;
  t->reserved_bytes -= res->bytes;
  res->obj = NULL;
}

int sk_session_commit(struct sk_session_table *t, struct sk_session_reservation *res,
                      struct sk_session **ret, struct sk_error *err) {
  struct sk_store_obj *obj = res->obj;
  reservation_end(t, res);
  return session_take(t, obj, ret, err);
}

void sk_session_unreserve(struct sk_session_table *t, struct sk_session_reservation *res) {
  sk_store_obj_remove(res->obj);
  reservation_end(t, res);
}

int sk_session_hold(struct sk_session_table *t, size_t bytes, uint64_t *ret_id,
                    struct sk_error *err) {
  int rc = check_limits(t, bytes, err);
  if (rc < 0) return rc;
  *ret_id = t->next_id++;
  t->n_reserved++;
  t->reserved_bytes += bytes;
  return 0;
}

void sk_session_unhold(struct sk_session_table *t, size_t bytes) {
  t->n_reserved--;
  t->reserved_bytes -= bytes;
}

int sk_session_take_held(struct sk_session_table *t, size_t bytes, struct sk_store_obj *obj,
                         struct sk_session **ret, struct sk_error *err) {
  sk_session_unhold(t, bytes);
  int rc = bytes ? 0 : check_limits(t, obj->size, err);
  if (rc < 0) {
    sk_store_obj_remove(obj);
    return rc;
  }
  return session_take(t, obj, ret, err);
}

int sk_session_adopt(struct sk_session_table *t, struct sk_store_obj *obj,
                     struct sk_session **ret) {
  uint32_t slot = table_slot(t);
  struct sk_session *s = slot == UINT32_MAX ? NULL : session_insert(t, slot, obj);
  if (!s) {
    sk_store_obj_free(obj);
    return -SK_ERR_NO_MEMORY;
  }
  s->adopted = true;
  *ret = s;
  return 0;
}

struct sk_session *sk_session_find(struct sk_session_table *t, uint64_t id) {
  for (uint32_t i = 0; i < t->cap; i++)
    if (t->items[i] && t->items[i]->id == id) return t->items[i];
  return NULL;
}

void sk_session_free(struct sk_session_table *t, struct sk_session *s) {
  for (uint32_t i = 0; i < t->cap; i++) {
    if (t->items[i] == s) {
      t->items[i] = NULL;
      t->count--;
      t->bytes -= s->kv_bytes;
      break;
    }
  }
  sk_store_obj_unlink(s->obj);
  if (t->release_obj)
    t->release_obj(t->release_user, s->obj);
  else
    sk_store_obj_free(s->obj);
  s->obj = NULL;
  free(s->attn.sink_mass);
  free(s->attn.entropy);
  free(s);
}

bool sk_session_has_logits(const struct sk_session *s) {
  return (s->obj->meta->flags & SK_STORE_HAS_LOGITS) != 0;
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
  a->next = (a->next + 1) % SK_ATTN_STEPS;
  if (a->n_steps < SK_ATTN_STEPS) a->n_steps++;
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
  free(j->logprobs);
  free(j->text);
  free(j->tokens);
  for (uint32_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
  if (j->sampler_ready) sk_sampler_free(&j->sampler);
  free(j);
}
