#include "session.h"

#include <stdlib.h>
#include <string.h>

int sk_session_table_init(struct sk_session_table *t, uint32_t max_sessions) {
  memset(t, 0, sizeof *t);
  t->items = calloc(max_sessions ? max_sessions : 1, sizeof *t->items);
  if (!t->items) return -SK_ERR_NO_MEMORY;
  t->cap = max_sessions;
  t->next_id = 1;
  pthread_mutex_init(&t->counters_lock, NULL);
  return 0;
}

static void session_destroy(struct sk_session *s) {
  if (!s) return;
  sk_kv_delete(s->kv);
  free(s->logits);
  free(s);
}

void sk_session_table_done(struct sk_session_table *t) {
  if (!t->items) return;
  for (uint32_t i = 0; i < t->cap; i++) session_destroy(t->items[i]);
  free(t->items);
  pthread_mutex_destroy(&t->counters_lock);
  memset(t, 0, sizeof *t);
}

int sk_session_open(struct sk_session_table *t, const struct sk_model *m,
                    const struct sk_kv_params *params, uint32_t max_capacity,
                    uint32_t owner_uid, struct sk_session **ret,
                    struct sk_error *err) {
  int rc = sk_kv_params_check(params, max_capacity, err);
  if (rc < 0) return rc;
  if (t->count >= t->cap)
    return sk_error_set(err, SK_ERR_BUSY,
                        "session limit reached: %u sessions open (max_sessions %u)",
                        t->count, t->cap);
  uint32_t slot = 0;
  while (t->items[slot]) slot++;

  struct sk_session *s = calloc(1, sizeof *s);
  if (!s) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for a session");
  s->params = *params;
  s->capacity = sk_kv_params_capacity(params);
  s->owner_uid = owner_uid;
  s->kv_bytes = sk_kv_size(sk_model_kv_shape(m), s->capacity);
  s->logits = calloc(sk_model_config(m)->n_vocab, sizeof *s->logits);
  if (!s->logits) {
    free(s);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for a session");
  }
  rc = sk_kv_new(sk_model_kv_shape(m), params, &s->kv, err);
  if (rc < 0) {
    session_destroy(s);
    return rc;
  }
  s->id = t->next_id++;
  t->items[slot] = s;
  t->count++;
  sk_session_counters_publish(t, s);
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
      break;
    }
  }
  session_destroy(s);
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
  pthread_mutex_unlock(&t->counters_lock);
}

void sk_job_free(struct sk_job *j) {
  if (!j) return;
  free(j->text);
  free(j->tokens);
  for (uint32_t i = 0; i < j->n_stop; i++) free(j->stop[i]);
  if (j->sampler_ready) sk_sampler_free(&j->sampler);
  free(j);
}
