/* The wire schema of replies and events (see wire.h and
 * sinkd-protocol(7)). */
#include "proto/wire.h"
#include "proto/wire_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Starts a reply frame in *b: its map with "id" and "ok" written. */
static int sk__wire_reply_begin(struct sk_msgbuf *b, struct sk_wire_map *m, uint64_t id) {
  if (sk_msgbuf_init(b) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_begin(m, &b->pk);
  sk_wire_map_u64(m, "id", id);
  sk_wire_map_bool(m, "ok", true);
  return 0;
}

/* [[first, last], ...] */
static void sk__wire_ranges(struct sk_wire_map *m, const char *key, const struct sk_range *r,
                            size_t n) {
  msgpack_packer *pk = sk_wire_map_key(m, key);
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) {
    msgpack_pack_array(pk, 2);
    msgpack_pack_uint64(pk, r[i].first);
    msgpack_pack_uint64(pk, r[i].last);
  }
}

/* ---- reading ---------------------------------------------------------- */

/* An unsigned field: absent leaves *ret as is; a wrong type is an error. */
static int sk__wire_u64(const msgpack_object *map, const char *key, uint64_t *ret,
                        struct sk_error *err) {
  struct sk_error perr;
  int rc = sk_msg_get_u64(map, key, UINT64_MAX, ret, &perr);
  return rc < 0 ? sk__wire_bad(err, perr.message) : 0;
}

static int sk__wire_bool(const msgpack_object *map, const char *key, bool *ret,
                         struct sk_error *err) {
  struct sk_error perr;
  int rc = sk_msg_get_bool(map, key, ret, &perr);
  return rc < 0 ? sk__wire_bad(err, perr.message) : 0;
}

/* A number (float or integer). */
static int sk__wire_f64(const msgpack_object *map, const char *key, double *ret,
                        struct sk_error *err) {
  struct sk_error perr;
  int rc = sk_msg_get_f64(map, key, ret, &perr);
  return rc < 0 ? sk__wire_bad(err, perr.message) : 0;
}

/* A string copied into dst[size] (truncated, NUL-terminated). */
static int sk__wire_name(const msgpack_object *map, const char *key, char *dst, size_t size,
                         struct sk_error *err) {
  struct sk_error perr;
  const char *s;
  size_t len;
  int rc = sk_msg_get_str(map, key, &s, &len, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 1) {
    if (len >= size) len = size - 1;
    memcpy(dst, s, len);
    dst[len] = 0;
  }
  return 0;
}

/* A map field: *ret NULL if absent; an error if not a map. */
static int sk__wire_map(const msgpack_object *map, const char *key, const msgpack_object **ret,
                        struct sk_error *err) {
  const msgpack_object *o = sk_msg_get(map, key);
  if (o && o->type != MSGPACK_OBJECT_MAP)
    return sk_error_set(err, SK_ERR_PROTOCOL, "field '%s' must be a map", key);
  *ret = o;
  return 0;
}

/* The required "session". */
static int sk__wire_session(const msgpack_object *map, uint64_t *ret, struct sk_error *err) {
  struct sk_error perr;
  return sk_msg_need_u64(map, "session", UINT64_MAX, ret, &perr) < 0
             ? sk__wire_bad(err, perr.message)
             : 0;
}

/* An integer object that fits an int32 (token ids). */
static bool sk__wire_obj_i32(const msgpack_object *o, int32_t *ret) {
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT32_MAX) {
    *ret = (int32_t)o->via.u64;
    return true;
  }
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN) {
    *ret = (int32_t)o->via.i64;
    return true;
  }
  return false;
}

static bool sk__wire_obj_u64(const msgpack_object *o, uint64_t *ret) {
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return false;
  *ret = o->via.u64;
  return true;
}

/* evicted_ranges: the first SK_WIRE_MAX_RANGES [first, last] pairs (extra
 * ones, which the protocol does not allow, are ignored). */
static int sk__wire_ranges_get(const msgpack_object *map, struct sk_range *ranges, size_t *ret_n,
                               struct sk_error *err) {
  struct sk_error perr;
  const msgpack_object_array *a;
  *ret_n = 0;
  int rc = sk_msg_get_array(map, "evicted_ranges", &a, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 0) return 0;
  size_t n = a->size < SK_WIRE_MAX_RANGES ? a->size : SK_WIRE_MAX_RANGES;
  for (size_t i = 0; i < n; i++) {
    const msgpack_object *o = &a->ptr[i];
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 ||
        !sk__wire_obj_u64(&o->via.array.ptr[0], &ranges[i].first) ||
        !sk__wire_obj_u64(&o->via.array.ptr[1], &ranges[i].last))
      return sk__wire_bad(err, "field 'evicted_ranges' must hold [first, last] pairs");
  }
  *ret_n = n;
  return 0;
}

/* ---- replies ---------------------------------------------------------- */

/* "compute" of hello and stats. */
static void sk__wire_compute(struct sk_wire_map *parent, const struct sk_compute_info *compute) {
  struct sk_wire_map m;
  sk__wire_nested(parent, &m, "compute");
  sk_wire_map_str(&m, "kernel", compute->kernel);
  sk_wire_map_u64(&m, "threads", compute->threads);
  sk_wire_map_u64(&m, "max_batch", compute->max_batch);
  sk_wire_map_str(&m, "kv_type", compute->kv_type);
  sk__wire_nested_end(parent, &m);
}

/* A number field that must fit 32 bits. */
static int sk__wire_u32(const msgpack_object *map, const char *key, uint32_t *ret,
                        struct sk_error *err) {
  struct sk_error perr;
  uint64_t v;
  int rc = sk_msg_get_u64(map, key, UINT32_MAX, &v, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 1) *ret = (uint32_t)v;
  return 0;
}

/* "speculation" of hello and both stats. */
static void sk__wire_spec(struct sk_wire_map *parent, const struct sk_spec_info *sp) {
  struct sk_wire_map m;
  sk__wire_nested(parent, &m, "speculation");
  sk_wire_map_str(&m, "mode", sp->mode);
  sk_wire_map_u64(&m, "draft_tokens", sp->draft_tokens);
  sk_wire_map_bool(&m, "draft_fixed", sp->draft_fixed);
  sk_wire_map_str(&m, "draft_model", sp->draft_model);
  sk_wire_map_u64(&m, "lookup_history", sp->lookup_history);
  sk_wire_map_u64(&m, "drafted", sp->drafted);
  sk_wire_map_u64(&m, "accepted", sp->accepted);
  sk_wire_map_u64(&m, "rejected", sp->rejected);
  sk_wire_map_f64(&m, "acceptance", sp->acceptance);
  sk__wire_nested_end(parent, &m);
}

static int sk__wire_spec_get(const msgpack_object *map, struct sk_spec_info *ret,
                             struct sk_error *err) {
  const msgpack_object *m = NULL;
  int rc = sk__wire_map(map, "speculation", &m, err);
  if (rc < 0 || !m) return rc;
  if ((rc = sk__wire_name(m, "mode", ret->mode, sizeof ret->mode, err)) < 0 ||
      (rc = sk__wire_u32(m, "draft_tokens", &ret->draft_tokens, err)) < 0 ||
      (rc = sk__wire_bool(m, "draft_fixed", &ret->draft_fixed, err)) < 0 ||
      (rc = sk__wire_name(m, "draft_model", ret->draft_model, sizeof ret->draft_model, err)) < 0 ||
      (rc = sk__wire_u32(m, "lookup_history", &ret->lookup_history, err)) < 0 ||
      (rc = sk__wire_u64(m, "drafted", &ret->drafted, err)) < 0 ||
      (rc = sk__wire_u64(m, "accepted", &ret->accepted, err)) < 0 ||
      (rc = sk__wire_u64(m, "rejected", &ret->rejected, err)) < 0 ||
      (rc = sk__wire_f64(m, "acceptance", &ret->acceptance, err)) < 0)
    return rc;
  return 0;
}

static int sk__wire_compute_get(const msgpack_object *map, struct sk_compute_info *ret,
                                struct sk_error *err) {
  const msgpack_object *m = NULL;
  int rc = sk__wire_map(map, "compute", &m, err);
  if (rc < 0 || !m) return rc;
  if ((rc = sk__wire_name(m, "kernel", ret->kernel, sizeof ret->kernel, err)) < 0 ||
      (rc = sk__wire_u32(m, "threads", &ret->threads, err)) < 0 ||
      (rc = sk__wire_u32(m, "max_batch", &ret->max_batch, err)) < 0 ||
      (rc = sk__wire_name(m, "kv_type", ret->kv_type, sizeof ret->kv_type, err)) < 0)
    return rc;
  return 0;
}

int sk_wire_pack_hello(struct sk_msgbuf *b, uint64_t id, const struct sk_hello *h,
                       const struct sk_wire_hello_extra *x) {
  const struct sk_wire_hello_extra none = {0};
  if (!x) x = &none;
  struct sk_wire_map m, sub;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "protocol", h->protocol);
  sk__wire_nested(&m, &sub, "chat_template");
  sk_wire_map_str(&sub, "name", h->chat_template);
  if (h->chat_template_error[0]) sk_wire_map_str(&sub, "error", h->chat_template_error);
  sk__wire_nested_end(&m, &sub);
  sk_wire_map_str(&m, "server", h->server);
  sk_wire_map_str(&m, "version", h->version);
  sk__wire_compute(&m, &h->compute);
  const struct sk_model_info *mi = &h->model;
  sk__wire_nested(&m, &sub, "model");
  sk_wire_map_str(&sub, "name", mi->name);
  sk_wire_map_str(&sub, "file", x->model_file ? x->model_file : "");
  sk_wire_map_u64(&sub, "n_vocab", mi->n_vocab);
  sk_wire_map_u64(&sub, "n_ctx_train", mi->n_ctx_train);
  sk_wire_map_u64(&sub, "n_layer", mi->n_layer);
  sk_wire_map_u64(&sub, "dim", mi->dim);
  sk_wire_map_u64(&sub, "n_head", mi->n_head);
  sk_wire_map_u64(&sub, "n_kv_head", mi->n_kv_head);
  sk_wire_map_f64(&sub, "rope_scale", mi->rope_scale);
  sk_wire_map_u64(&sub, "max_capacity", mi->max_capacity);
  sk_wire_map_str(&sub, "weight_type", mi->weight_type);
  sk_wire_map_u64(&sub, "weight_bytes", mi->weight_bytes);
  sk_wire_map_u64(&sub, "sparse_weight_bytes", x->sparse_weight_bytes);
  msgpack_packer *pk = sk_wire_map_key(&sub, "sparsity_levels");
  msgpack_pack_array(pk, x->n_sparsity_levels);
  for (size_t i = 0; i < x->n_sparsity_levels; i++) msgpack_pack_float(pk, x->sparsity_levels[i]);
  sk__wire_nested_end(&m, &sub);
  const struct sk_session_defaults *d = &h->defaults;
  sk__wire_nested(&m, &sub, "defaults");
  sk_wire_map_str(&sub, "policy", d->policy);
  sk_wire_map_u64(&sub, "n_sink", d->n_sink);
  sk_wire_map_u64(&sub, "window", d->window);
  sk_wire_map_u64(&sub, "heavy", d->heavy);
  sk_wire_map_u64(&sub, "recent", d->recent);
  sk_wire_map_u64(&sub, "capacity", d->capacity);
  sk_wire_map_f64(&sub, "rope_scale", d->rope_scale);
  sk__wire_nested_end(&m, &sub);
  sk__wire_spec(&m, &h->speculation);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_hello(const msgpack_object *map, struct sk_hello *ret, struct sk_error *err) {
  struct sk_hello h;
  memset(&h, 0, sizeof h);
  const msgpack_object *model = NULL, *defs = NULL, *chat = NULL;
  int rc;
  if ((rc = sk__wire_u32(map, "protocol", &h.protocol, err)) < 0 ||
      (rc = sk__wire_name(map, "server", h.server, sizeof h.server, err)) < 0 ||
      (rc = sk__wire_name(map, "version", h.version, sizeof h.version, err)) < 0 ||
      (rc = sk__wire_map(map, "model", &model, err)) < 0 ||
      (rc = sk__wire_map(map, "defaults", &defs, err)) < 0)
    return rc;
  if (model) {
    struct sk_model_info *m = &h.model;
    if ((rc = sk__wire_name(model, "name", m->name, sizeof m->name, err)) < 0 ||
        (rc = sk__wire_u32(model, "n_vocab", &m->n_vocab, err)) < 0 ||
        (rc = sk__wire_u32(model, "n_ctx_train", &m->n_ctx_train, err)) < 0 ||
        (rc = sk__wire_u32(model, "n_layer", &m->n_layer, err)) < 0 ||
        (rc = sk__wire_u32(model, "dim", &m->dim, err)) < 0 ||
        (rc = sk__wire_u32(model, "n_head", &m->n_head, err)) < 0 ||
        (rc = sk__wire_u32(model, "n_kv_head", &m->n_kv_head, err)) < 0 ||
        (rc = sk__wire_f64(model, "rope_scale", &m->rope_scale, err)) < 0 ||
        (rc = sk__wire_u32(model, "max_capacity", &m->max_capacity, err)) < 0 ||
        (rc = sk__wire_name(model, "weight_type", m->weight_type, sizeof m->weight_type, err)) <
            0 ||
        (rc = sk__wire_u64(model, "weight_bytes", &m->weight_bytes, err)) < 0)
      return rc;
  }
  if ((rc = sk__wire_compute_get(map, &h.compute, err)) < 0 ||
      (rc = sk__wire_spec_get(map, &h.speculation, err)) < 0)
    return rc;
  if ((rc = sk__wire_map(map, "chat_template", &chat, err)) < 0) return rc;
  if (chat &&
      ((rc = sk__wire_name(chat, "name", h.chat_template, sizeof h.chat_template, err)) < 0 ||
       (rc = sk__wire_name(chat, "error", h.chat_template_error, sizeof h.chat_template_error,
                           err)) < 0))
    return rc;
  if (defs) {
    struct sk_session_defaults *d = &h.defaults;
    if ((rc = sk__wire_name(defs, "policy", d->policy, sizeof d->policy, err)) < 0 ||
        (rc = sk__wire_u32(defs, "n_sink", &d->n_sink, err)) < 0 ||
        (rc = sk__wire_u32(defs, "window", &d->window, err)) < 0 ||
        (rc = sk__wire_u32(defs, "heavy", &d->heavy, err)) < 0 ||
        (rc = sk__wire_u32(defs, "recent", &d->recent, err)) < 0 ||
        (rc = sk__wire_u32(defs, "capacity", &d->capacity, err)) < 0 ||
        (rc = sk__wire_f64(defs, "rope_scale", &d->rope_scale, err)) < 0)
      return rc;
  }
  *ret = h;
  return 0;
}

int sk_wire_pack_list(struct sk_msgbuf *b, uint64_t id, const struct sk_session_info *rows,
                      size_t n) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  msgpack_packer *pk = sk_wire_map_key(&m, "sessions");
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n && !m.failed; i++) {
    const struct sk_session_info *s = &rows[i];
    struct sk_wire_map row;
    sk_wire_map_begin(&row, pk);
    sk_wire_map_u64(&row, "session", s->session);
    sk_wire_map_u64(&row, "owner_uid", s->owner_uid);
    sk_wire_map_str(&row, "policy", s->policy);
    sk_wire_map_u64(&row, "capacity", s->capacity);
    sk_wire_map_str(&row, "kv_type", s->kv_type);
    sk_wire_map_u64(&row, "resident", s->resident);
    sk_wire_map_u64(&row, "seen", s->seen);
    sk_wire_map_bool(&row, "busy", s->busy);
    sk_wire_map_bool(&row, "adopted", s->adopted);
    sk_wire_map_u64(&row, "kv_bytes", s->kv_bytes);
    sk_wire_map_u64(&row, "object_bytes", s->object_bytes);
    sk_wire_map_u64(&row, "age_s", s->age_s);
    sk_wire_map_u64(&row, "idle_s", s->idle_s);
    sk_wire_map_bool(&row, "temporary", s->temporary);
    if (sk_wire_map_end(&row) < 0) m.failed = true;
  }
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_list(const msgpack_object *map, struct sk_session_info **ret_rows,
                        size_t *ret_n, struct sk_error *err) {
  struct sk_error perr;
  const msgpack_object_array *a = NULL;
  if (sk_msg_get_array(map, "sessions", &a, &perr) < 0) return sk__wire_bad(err, perr.message);
  size_t n = a ? a->size : 0;
  struct sk_session_info *rows = NULL;
  /* n <= the frame's length (checked by sk_msg_check), so bounded. */
  if (n > 0 && !(rows = calloc(n, sizeof *rows)))
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    const msgpack_object *o = &a->ptr[i];
    struct sk_session_info *s = &rows[i];
    if (o->type != MSGPACK_OBJECT_MAP) {
      rc = sk__wire_bad(err, "field 'sessions' must hold maps");
      break;
    }
    if ((rc = sk__wire_u64(o, "session", &s->session, err)) < 0 ||
        (rc = sk__wire_name(o, "policy", s->policy, sizeof s->policy, err)) < 0 ||
        (rc = sk__wire_u64(o, "capacity", &s->capacity, err)) < 0 ||
        (rc = sk__wire_u64(o, "resident", &s->resident, err)) < 0 ||
        (rc = sk__wire_u64(o, "seen", &s->seen, err)) < 0 ||
        (rc = sk__wire_bool(o, "adopted", &s->adopted, err)) < 0 ||
        (rc = sk__wire_name(o, "kv_type", s->kv_type, sizeof s->kv_type, err)) < 0 ||
        (rc = sk__wire_u64(o, "owner_uid", &s->owner_uid, err)) < 0 ||
        (rc = sk__wire_u64(o, "kv_bytes", &s->kv_bytes, err)) < 0 ||
        (rc = sk__wire_u64(o, "object_bytes", &s->object_bytes, err)) < 0 ||
        (rc = sk__wire_u64(o, "age_s", &s->age_s, err)) < 0 ||
        (rc = sk__wire_u64(o, "idle_s", &s->idle_s, err)) < 0 ||
        (rc = sk__wire_bool(o, "busy", &s->busy, err)) < 0 ||
        (rc = sk__wire_bool(o, "temporary", &s->temporary, err)) < 0)
      break;
  }
  if (rc < 0) {
    free(rows);
    return rc;
  }
  *ret_rows = rows;
  *ret_n = n;
  return 0;
}

int sk_wire_pack_daemon_stats(struct sk_msgbuf *b, uint64_t id, const struct sk_daemon_stats *s,
                              const struct sk_wire_daemon_extra *x) {
  struct sk_wire_map m, sub;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk__wire_compute(&m, &s->compute);
  sk__wire_nested(&m, &sub, "chat_template");
  sk_wire_map_str(&sub, "name", x->chat_template);
  if (x->chat_template_error && x->chat_template_error[0])
    sk_wire_map_str(&sub, "error", x->chat_template_error);
  sk__wire_nested_end(&m, &sub);
  sk_wire_map_u64(&m, "weights_mapped_bytes", s->weights_mapped_bytes);
  sk_wire_map_u64(&m, "weights_repacked_bytes", s->weights_repacked_bytes);
  sk_wire_map_u64(&m, "steps", s->steps);
  sk_wire_map_u64(&m, "sessions", s->sessions);
  if (s->has_user) {
    sk_wire_map_u64(&m, "user_sessions", s->user_sessions);
    sk_wire_map_u64(&m, "user_memory_bytes", s->user_memory_bytes);
    sk_wire_map_u64(&m, "max_user_sessions", s->max_user_sessions);
    sk_wire_map_u64(&m, "max_user_memory", s->max_user_memory);
  }
  sk_wire_map_u64(&m, "clients", s->clients);
  sk_wire_map_u64(&m, "uptime_s", s->uptime_s);
  sk_wire_map_u64(&m, "tokens_prefilled", s->tokens_prefilled);
  sk_wire_map_u64(&m, "tokens_generated", s->tokens_generated);
  sk_wire_map_u64(&m, "max_sessions", s->max_sessions);
  sk_wire_map_u64(&m, "memory_bytes", s->memory_bytes);
  sk_wire_map_u64(&m, "max_memory", s->max_memory);
  sk_wire_map_u64(&m, "adopted", s->adopted);
  sk_wire_map_u64(&m, "set_aside", s->set_aside);
  sk_wire_map_u64(&m, "idle_ttl_s", s->idle_ttl_s);
  sk_wire_map_str(&m, "state_dir", x->state_dir);
  sk__wire_spec(&m, &s->speculation);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_daemon_stats(const msgpack_object *map, struct sk_daemon_stats *ret,
                                struct sk_error *err) {
  struct sk_daemon_stats s;
  memset(&s, 0, sizeof s);
  int rc;
  if ((rc = sk__wire_u64(map, "sessions", &s.sessions, err)) < 0 ||
      (rc = sk__wire_u64(map, "clients", &s.clients, err)) < 0 ||
      (rc = sk__wire_u64(map, "uptime_s", &s.uptime_s, err)) < 0 ||
      (rc = sk__wire_u64(map, "tokens_prefilled", &s.tokens_prefilled, err)) < 0 ||
      (rc = sk__wire_u64(map, "tokens_generated", &s.tokens_generated, err)) < 0 ||
      (rc = sk__wire_u64(map, "max_sessions", &s.max_sessions, err)) < 0 ||
      (rc = sk__wire_u64(map, "memory_bytes", &s.memory_bytes, err)) < 0 ||
      (rc = sk__wire_u64(map, "max_memory", &s.max_memory, err)) < 0 ||
      (rc = sk__wire_u64(map, "adopted", &s.adopted, err)) < 0 ||
      (rc = sk__wire_u64(map, "set_aside", &s.set_aside, err)) < 0 ||
      (rc = sk__wire_u64(map, "idle_ttl_s", &s.idle_ttl_s, err)) < 0 ||
      (rc = sk__wire_u64(map, "steps", &s.steps, err)) < 0 ||
      (rc = sk__wire_compute_get(map, &s.compute, err)) < 0 ||
      (rc = sk__wire_u64(map, "weights_mapped_bytes", &s.weights_mapped_bytes, err)) < 0 ||
      (rc = sk__wire_u64(map, "weights_repacked_bytes", &s.weights_repacked_bytes, err)) < 0 ||
      (rc = sk__wire_u64(map, "user_sessions", &s.user_sessions, err)) < 0 ||
      (rc = sk__wire_u64(map, "user_memory_bytes", &s.user_memory_bytes, err)) < 0 ||
      (rc = sk__wire_u64(map, "max_user_sessions", &s.max_user_sessions, err)) < 0 ||
      (rc = sk__wire_u64(map, "max_user_memory", &s.max_user_memory, err)) < 0 ||
      (rc = sk__wire_spec_get(map, &s.speculation, err)) < 0)
    return rc;
  s.has_user = sk_msg_get(map, "user_sessions") != NULL;
  *ret = s;
  return 0;
}

/* n float32 values from floats (or, when NULL, from doubles). */
static void sk__wire_floats(struct sk_wire_map *m, const char *key, const float *floats,
                            const double *doubles, size_t n) {
  msgpack_packer *pk = sk_wire_map_key(m, key);
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) msgpack_pack_float(pk, floats ? floats[i] : (float)doubles[i]);
}

int sk_wire_pack_session_stats(struct sk_msgbuf *b, uint64_t id, const struct sk_session_stats *s,
                               const struct sk_wire_session_extra *x) {
  struct sk_wire_session_extra none = {.has_resident_ranges = !s->busy};
  if (!x) x = &none;
  struct sk_wire_map m, sub;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "session", s->session);
  sk_wire_map_str(&m, "chat_template", s->chat_template);
  sk_wire_map_str(&m, "policy", s->policy);
  sk_wire_map_u64(&m, "n_sink", s->n_sink);
  sk_wire_map_u64(&m, "window", s->window);
  sk_wire_map_u64(&m, "heavy", s->heavy);
  sk_wire_map_u64(&m, "recent", s->recent);
  sk_wire_map_u64(&m, "pinned", s->pinned);
  sk_wire_map_f64(&m, "rope_scale", s->rope_scale);
  sk_wire_map_f64(&m, "model_rope_scale", s->model_rope_scale);
  sk_wire_map_u64(&m, "capacity", s->capacity);
  sk_wire_map_u64(&m, "resident", s->resident);
  sk_wire_map_u64(&m, "seen", s->seen);
  sk_wire_map_u64(&m, "evicted", s->evicted);
  sk_wire_map_u64(&m, "kv_bytes", s->kv_bytes);
  sk_wire_map_u64(&m, "object_bytes", s->object_bytes);
  sk_wire_map_str(&m, "kv_type", s->kv_type);
  /* MLP sparsity: the level, the tokens that ran sparse, and per layer the
   * fraction of neurons they skipped */
  sk_wire_map_f64(&m, "sparsity", s->sparsity);
  sk_wire_map_u64(&m, "sparse_tokens", s->sparse_tokens);
  msgpack_packer *pk = sk_wire_map_key(&m, "sparsity_measured");
  const double *measured = x->sparsity_measured ? x->sparsity_measured : s->sparsity_measured;
  size_t n_measured =
      s->sparse_tokens ? (x->sparsity_measured ? x->n_sparse_layers : s->n_sparse_layers) : 0;
  msgpack_pack_array(pk, n_measured);
  for (size_t i = 0; i < n_measured; i++) msgpack_pack_double(pk, measured[i]);
  sk_wire_map_f64(&m, "weight_bytes_per_token", s->weight_bytes_per_token);
  pk = sk_wire_map_key(&m, "positions");
  if (s->has_positions) {
    msgpack_pack_array(pk, 2);
    msgpack_pack_uint64(pk, s->position_first);
    msgpack_pack_uint64(pk, s->position_last);
  } else {
    msgpack_pack_array(pk, 0);
  }
  sk__wire_nested(&m, &sub, "attention");
  sk_wire_map_u64(&sub, "steps", s->attn_steps);
  sk_wire_map_u64(&sub, "sink_tokens", s->sink_tokens);
  size_t n_layers = s->attn_steps ? (x->sink_mass ? x->n_layers : s->n_layers) : 0;
  sk__wire_floats(&sub, "sink_mass", x->sink_mass, s->sink_mass, n_layers);
  sk__wire_floats(&sub, "entropy", x->entropy, s->entropy, n_layers);
  sk__wire_nested_end(&m, &sub);
  sk_wire_map_bool(&m, "busy", s->busy);
  sk_wire_map_u64(&m, "commit", s->commit);
  sk_wire_map_bool(&m, "adopted", s->adopted);
  sk_wire_map_u64(&m, "idle_s", s->idle_s);
  sk_wire_map_u64(&m, "owner_uid", x->owner_uid);
  sk__wire_spec(&m, &s->speculation);
  if (x->has_resident_ranges) {
    if (x->ranges)
      sk__wire_ranges(&m, "resident_ranges", x->ranges, x->n_ranges);
    else
      sk__wire_ranges(&m, "resident_ranges", s->resident_ranges, s->n_resident_ranges);
  }
  if (x->has_tokens) {
    pk = sk_wire_map_key(&m, "tokens");
    msgpack_pack_array(pk, x->n_tokens);
    for (size_t i = 0; i < x->n_tokens; i++) msgpack_pack_int32(pk, x->tokens[i]);
  }
  return sk__wire_end(b, &m);
}

/* Numbers of an array field into dst (the first max). */
static int sk__wire_floats_get(const msgpack_object *map, const char *key, double *dst,
                               size_t max, size_t *ret_n, struct sk_error *err) {
  struct sk_error perr;
  const msgpack_object_array *a;
  *ret_n = 0;
  int rc = sk_msg_get_array(map, key, &a, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 0) return 0;
  size_t n = a->size < max ? a->size : max;
  for (size_t i = 0; i < n; i++) {
    const msgpack_object *o = &a->ptr[i];
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
      dst[i] = o->via.f64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
      dst[i] = (double)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
      dst[i] = (double)o->via.i64;
    else
      return sk_error_set(err, SK_ERR_PROTOCOL, "field '%s' must hold numbers", key);
  }
  *ret_n = n;
  return 0;
}

int sk_wire_unpack_session_stats(const msgpack_object *map, struct sk_session_stats *ret,
                                 struct sk_error *err) {
  struct sk_session_stats *s = ret;
  memset(s, 0, sizeof *s);
  s->rope_scale = 1.0;
  s->model_rope_scale = 1.0;
  const msgpack_object *attn = NULL;
  struct sk_error perr;
  const msgpack_object_array *pos, *rr;
  int rc;
  if ((rc = sk__wire_u64(map, "session", &s->session, err)) < 0 ||
      (rc = sk__wire_name(map, "policy", s->policy, sizeof s->policy, err)) < 0 ||
      (rc = sk__wire_name(map, "chat_template", s->chat_template, sizeof s->chat_template,
                          err)) < 0 ||
      (rc = sk__wire_u64(map, "n_sink", &s->n_sink, err)) < 0 ||
      (rc = sk__wire_u64(map, "window", &s->window, err)) < 0 ||
      (rc = sk__wire_u64(map, "heavy", &s->heavy, err)) < 0 ||
      (rc = sk__wire_u64(map, "recent", &s->recent, err)) < 0 ||
      (rc = sk__wire_u64(map, "pinned", &s->pinned, err)) < 0 ||
      (rc = sk__wire_f64(map, "rope_scale", &s->rope_scale, err)) < 0 ||
      (rc = sk__wire_f64(map, "model_rope_scale", &s->model_rope_scale, err)) < 0 ||
      (rc = sk__wire_u64(map, "capacity", &s->capacity, err)) < 0 ||
      (rc = sk__wire_u64(map, "resident", &s->resident, err)) < 0 ||
      (rc = sk__wire_u64(map, "seen", &s->seen, err)) < 0 ||
      (rc = sk__wire_u64(map, "evicted", &s->evicted, err)) < 0 ||
      (rc = sk__wire_u64(map, "kv_bytes", &s->kv_bytes, err)) < 0 ||
      (rc = sk__wire_u64(map, "object_bytes", &s->object_bytes, err)) < 0 ||
      (rc = sk__wire_name(map, "kv_type", s->kv_type, sizeof s->kv_type, err)) < 0 ||
      (rc = sk__wire_u64(map, "commit", &s->commit, err)) < 0 ||
      (rc = sk__wire_bool(map, "adopted", &s->adopted, err)) < 0 ||
      (rc = sk__wire_u64(map, "idle_s", &s->idle_s, err)) < 0 ||
      (rc = sk__wire_map(map, "attention", &attn, err)) < 0 ||
      (rc = sk__wire_bool(map, "busy", &s->busy, err)) < 0 ||
      (rc = sk__wire_f64(map, "sparsity", &s->sparsity, err)) < 0 ||
      (rc = sk__wire_u64(map, "sparse_tokens", &s->sparse_tokens, err)) < 0 ||
      (rc = sk__wire_f64(map, "weight_bytes_per_token", &s->weight_bytes_per_token, err)) < 0 ||
      (rc = sk__wire_floats_get(map, "sparsity_measured", s->sparsity_measured,
                                SK_CLIENT_MAX_LAYERS, &s->n_sparse_layers, err)) < 0 ||
      (rc = sk__wire_spec_get(map, &s->speculation, err)) < 0)
    return rc;
  rc = sk_msg_get_array(map, "positions", &pos, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 1 && pos->size > 0) {
    if (pos->size != 2 || !sk__wire_obj_u64(&pos->ptr[0], &s->position_first) ||
        !sk__wire_obj_u64(&pos->ptr[1], &s->position_last))
      return sk__wire_bad(err, "field 'positions' must be [first, last] or empty");
    s->has_positions = true;
  }
  rc = sk_msg_get_array(map, "resident_ranges", &rr, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 1) {
    size_t n = rr->size < SK_CLIENT_MAX_RANGES ? rr->size : SK_CLIENT_MAX_RANGES;
    for (size_t i = 0; i < n; i++) {
      const msgpack_object *o = &rr->ptr[i];
      if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2 ||
          !sk__wire_obj_u64(&o->via.array.ptr[0], &s->resident_ranges[i].first) ||
          !sk__wire_obj_u64(&o->via.array.ptr[1], &s->resident_ranges[i].last))
        return sk__wire_bad(err, "field 'resident_ranges' must hold [first, last] pairs");
    }
    s->n_resident_ranges = n;
  }
  if (attn) {
    size_t nm = 0, ne = 0;
    if ((rc = sk__wire_u64(attn, "steps", &s->attn_steps, err)) < 0 ||
        (rc = sk__wire_u64(attn, "sink_tokens", &s->sink_tokens, err)) < 0 ||
        (rc = sk__wire_floats_get(attn, "sink_mass", s->sink_mass, SK_CLIENT_MAX_LAYERS, &nm,
                                  err)) < 0 ||
        (rc = sk__wire_floats_get(attn, "entropy", s->entropy, SK_CLIENT_MAX_LAYERS, &ne, err)) <
            0)
      return rc;
    s->n_layers = nm < ne ? nm : ne;
  }
  return 0;
}

int sk_wire_pack_ok(struct sk_msgbuf *b, uint64_t id) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  return sk__wire_end(b, &m);
}

int sk_wire_pack_open(struct sk_msgbuf *b, uint64_t id, const struct sk_open_result *o) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "session", o->session);
  sk_wire_map_str(&m, "policy", o->policy);
  sk_wire_map_u64(&m, "capacity", o->capacity);
  sk_wire_map_u64(&m, "kv_bytes", o->kv_bytes);
  sk_wire_map_u64(&m, "object_bytes", o->object_bytes);
  sk_wire_map_str(&m, "kv_type", o->kv_type);
  sk_wire_map_u64(&m, "n_sink", o->n_sink);
  sk_wire_map_u64(&m, "window", o->window);
  sk_wire_map_u64(&m, "heavy", o->heavy);
  sk_wire_map_u64(&m, "recent", o->recent);
  sk_wire_map_f64(&m, "rope_scale", o->rope_scale);
  sk_wire_map_u64(&m, "pinned", o->pinned);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_open(const msgpack_object *map, struct sk_open_result *ret,
                        struct sk_error *err) {
  struct sk_open_result o;
  memset(&o, 0, sizeof o);
  o.rope_scale = 1.0;
  int rc;
  if ((rc = sk__wire_session(map, &o.session, err)) < 0 ||
      (rc = sk__wire_name(map, "policy", o.policy, sizeof o.policy, err)) < 0 ||
      (rc = sk__wire_u64(map, "capacity", &o.capacity, err)) < 0 ||
      (rc = sk__wire_u64(map, "kv_bytes", &o.kv_bytes, err)) < 0 ||
      (rc = sk__wire_u64(map, "object_bytes", &o.object_bytes, err)) < 0 ||
      (rc = sk__wire_name(map, "kv_type", o.kv_type, sizeof o.kv_type, err)) < 0 ||
      (rc = sk__wire_u64(map, "n_sink", &o.n_sink, err)) < 0 ||
      (rc = sk__wire_u64(map, "window", &o.window, err)) < 0 ||
      (rc = sk__wire_u64(map, "heavy", &o.heavy, err)) < 0 ||
      (rc = sk__wire_u64(map, "recent", &o.recent, err)) < 0 ||
      (rc = sk__wire_f64(map, "rope_scale", &o.rope_scale, err)) < 0 ||
      (rc = sk__wire_u64(map, "pinned", &o.pinned, err)) < 0)
    return rc;
  *ret = o;
  return 0;
}

int sk_wire_pack_summary(struct sk_msgbuf *b, uint64_t id, const struct sk_session_summary *s,
                         uint64_t received) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "session", s->session);
  sk_wire_map_str(&m, "policy", s->policy);
  sk_wire_map_u64(&m, "capacity", s->capacity);
  sk_wire_map_u64(&m, "kv_bytes", s->kv_bytes);
  sk_wire_map_u64(&m, "object_bytes", s->object_bytes);
  sk_wire_map_str(&m, "kv_type", s->kv_type);
  sk_wire_map_u64(&m, "resident", s->resident);
  sk_wire_map_u64(&m, "seen", s->seen);
  sk_wire_map_u64(&m, "evicted", s->evicted);
  sk_wire_map_u64(&m, "commit", s->commit);
  sk_wire_map_bool(&m, "adopted", s->adopted);
  if (s->from) sk_wire_map_u64(&m, "from", s->from);
  if (received) sk_wire_map_u64(&m, "received", received);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_summary(const msgpack_object *map, struct sk_session_summary *ret,
                           struct sk_error *err) {
  struct sk_session_summary s;
  memset(&s, 0, sizeof s);
  int rc;
  if ((rc = sk__wire_session(map, &s.session, err)) < 0 ||
      (rc = sk__wire_name(map, "policy", s.policy, sizeof s.policy, err)) < 0 ||
      (rc = sk__wire_u64(map, "capacity", &s.capacity, err)) < 0 ||
      (rc = sk__wire_u64(map, "kv_bytes", &s.kv_bytes, err)) < 0 ||
      (rc = sk__wire_u64(map, "object_bytes", &s.object_bytes, err)) < 0 ||
      (rc = sk__wire_name(map, "kv_type", s.kv_type, sizeof s.kv_type, err)) < 0 ||
      (rc = sk__wire_u64(map, "resident", &s.resident, err)) < 0 ||
      (rc = sk__wire_u64(map, "seen", &s.seen, err)) < 0 ||
      (rc = sk__wire_u64(map, "evicted", &s.evicted, err)) < 0 ||
      (rc = sk__wire_u64(map, "commit", &s.commit, err)) < 0 ||
      (rc = sk__wire_bool(map, "adopted", &s.adopted, err)) < 0 ||
      (rc = sk__wire_u64(map, "from", &s.from, err)) < 0)
    return rc;
  *ret = s;
  return 0;
}

int sk_wire_pack_append(struct sk_msgbuf *b, uint64_t id, const struct sk_append_result *a,
                        const float *logprobs) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "n_tokens", a->n_tokens);
  sk_wire_map_u64(&m, "evicted", a->evicted);
  sk__wire_ranges(&m, "evicted_ranges", a->ranges, a->n_ranges);
  sk_wire_map_u64(&m, "resident", a->resident);
  sk_wire_map_u64(&m, "seen", a->seen);
  if (logprobs) {
    /* One float32 per appended token; nil where there was nothing to
     * score it with (the session's very first token). */
    msgpack_packer *pk = sk_wire_map_key(&m, "logprobs");
    msgpack_pack_array(pk, (size_t)a->n_tokens);
    for (uint64_t i = 0; i < a->n_tokens; i++) {
      if (isnan(logprobs[i]))
        msgpack_pack_nil(pk);
      else
        msgpack_pack_float(pk, logprobs[i]);
    }
  }
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_append(const msgpack_object *map, struct sk_append_result *ret,
                          double *logprobs, size_t n, struct sk_error *err) {
  struct sk_append_result a;
  memset(&a, 0, sizeof a);
  int rc;
  if ((rc = sk__wire_u64(map, "n_tokens", &a.n_tokens, err)) < 0 ||
      (rc = sk__wire_u64(map, "resident", &a.resident, err)) < 0 ||
      (rc = sk__wire_u64(map, "seen", &a.seen, err)) < 0 ||
      (rc = sk__wire_u64(map, "evicted", &a.evicted, err)) < 0 ||
      (rc = sk__wire_ranges_get(map, a.ranges, &a.n_ranges, err)) < 0)
    return rc;
  if (logprobs) {
    struct sk_error perr;
    const msgpack_object_array *arr;
    rc = sk_msg_get_array(map, "logprobs", &arr, &perr);
    if (rc < 0) return sk__wire_bad(err, perr.message);
    if (rc == 0 || arr->size != n)
      return sk__wire_bad(err, "field 'logprobs' missing or of the wrong length");
    for (size_t i = 0; i < n; i++) {
      const msgpack_object *o = &arr->ptr[i];
      if (o->type == MSGPACK_OBJECT_NIL)
        logprobs[i] = NAN;
      else if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
        logprobs[i] = o->via.f64;
      else
        return sk__wire_bad(err, "field 'logprobs' must hold floats or nil");
    }
  }
  *ret = a;
  return 0;
}

int sk_wire_pack_generate(struct sk_msgbuf *b, uint64_t id, const struct sk_generate_result *g,
                          const char *stop_text, size_t stop_text_len, const char *text,
                          size_t text_len) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_str(&m, "stop", g->stop[0] ? g->stop : "length");
  if (g->stop_token >= 0) {
    sk_wire_map_u64(&m, "stop_token", (uint64_t)g->stop_token);
    if (stop_text)
      sk_wire_map_strn(&m, "stop_text", stop_text, stop_text_len);
    else
      sk_wire_map_str(&m, "stop_text", g->stop_text);
  }
  sk_wire_map_u64(&m, "n_tokens", g->n_tokens);
  struct sk_wire_map usage;
  sk_wire_map_begin(&usage, sk_wire_map_key(&m, "usage"));
  sk_wire_map_u64(&usage, "prompt_tokens", g->prompt_tokens);
  sk_wire_map_u64(&usage, "completion_tokens", g->completion_tokens);
  sk_wire_map_u64(&usage, "drafted_tokens", g->drafted_tokens);
  sk_wire_map_u64(&usage, "accepted_tokens", g->accepted_tokens);
  if (sk_wire_map_end(&usage) < 0) m.failed = true;
  sk_wire_map_strn(&m, "text", text ? text : "", text ? text_len : 0);
  sk_wire_map_u64(&m, "evicted", g->evicted);
  sk__wire_ranges(&m, "evicted_ranges", g->ranges, g->n_ranges);
  sk_wire_map_u64(&m, "resident", g->resident);
  sk_wire_map_u64(&m, "seen", g->seen);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_generate(const msgpack_object *map, struct sk_generate_result *ret,
                            struct sk_error *err) {
  struct sk_generate_result g;
  memset(&g, 0, sizeof g);
  const msgpack_object *usage = NULL;
  uint64_t stop_token = UINT64_MAX;
  int rc;
  if ((rc = sk__wire_u64(map, "stop_token", &stop_token, err)) < 0 ||
      (rc = sk__wire_name(map, "stop_text", g.stop_text, sizeof g.stop_text, err)) < 0 ||
      (rc = sk__wire_name(map, "stop", g.stop, sizeof g.stop, err)) < 0 ||
      (rc = sk__wire_u64(map, "n_tokens", &g.n_tokens, err)) < 0 ||
      (rc = sk__wire_map(map, "usage", &usage, err)) < 0 ||
      (rc = sk__wire_u64(map, "evicted", &g.evicted, err)) < 0 ||
      (rc = sk__wire_u64(map, "resident", &g.resident, err)) < 0 ||
      (rc = sk__wire_u64(map, "seen", &g.seen, err)) < 0 ||
      (rc = sk__wire_ranges_get(map, g.ranges, &g.n_ranges, err)) < 0)
    return rc;
  g.stop_token = stop_token <= INT32_MAX ? (int32_t)stop_token : -1;
  if (usage &&
      ((rc = sk__wire_u64(usage, "prompt_tokens", &g.prompt_tokens, err)) < 0 ||
       (rc = sk__wire_u64(usage, "completion_tokens", &g.completion_tokens, err)) < 0 ||
       (rc = sk__wire_u64(usage, "drafted_tokens", &g.drafted_tokens, err)) < 0 ||
       (rc = sk__wire_u64(usage, "accepted_tokens", &g.accepted_tokens, err)) < 0))
    return rc;
  *ret = g;
  return 0;
}

int sk_wire_pack_cancel(struct sk_msgbuf *b, uint64_t id, bool cancelled) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_bool(&m, "cancelled", cancelled);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_cancel(const msgpack_object *map, bool *ret, struct sk_error *err) {
  bool v = false;
  int rc = sk__wire_bool(map, "cancelled", &v, err);
  if (rc == 0) *ret = v;
  return rc;
}

int sk_wire_pack_tokens(struct sk_msgbuf *b, uint64_t id, const int32_t *tokens, size_t n) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  msgpack_packer *pk = sk_wire_map_key(&m, "tokens");
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) msgpack_pack_int32(pk, tokens[i]);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_tokens(const msgpack_object *map, int32_t **ret_tokens, size_t *ret_n,
                          struct sk_error *err) {
  struct sk_error perr;
  const msgpack_object_array *a;
  int rc = sk_msg_get_array(map, "tokens", &a, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 0) return sk__wire_bad(err, "missing field 'tokens'");
  int32_t *ids = NULL;
  if (a->size > 0 && !(ids = malloc(a->size * sizeof *ids)))
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  for (uint32_t i = 0; i < a->size; i++)
    if (!sk__wire_obj_i32(&a->ptr[i], &ids[i])) {
      free(ids);
      return sk__wire_bad(err, "field 'tokens' must hold token ids");
    }
  *ret_tokens = ids;
  *ret_n = a->size;
  return 0;
}

int sk_wire_pack_text(struct sk_msgbuf *b, uint64_t id, const char *text, size_t len) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_strn(&m, "text", text, len);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_text(const msgpack_object *map, char **ret_text, size_t *ret_len,
                        struct sk_error *err) {
  struct sk_error perr;
  const char *text;
  size_t len;
  int rc = sk_msg_get_str(map, "text", &text, &len, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 0) return sk__wire_bad(err, "missing field 'text'");
  char *out = malloc(len + 1);
  if (!out) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  if (len > 0) memcpy(out, text, len);
  out[len] = 0;
  *ret_text = out;
  *ret_len = len;
  return 0;
}

int sk_wire_pack_received(struct sk_msgbuf *b, uint64_t id, uint64_t received) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "received", received);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_received(const msgpack_object *map, uint64_t *ret, struct sk_error *err) {
  uint64_t v = 0;
  int rc = sk__wire_u64(map, "received", &v, err);
  if (rc == 0) *ret = v;
  return rc;
}

int sk_wire_pack_export(struct sk_msgbuf *b, uint64_t id, uint64_t session, uint64_t bytes,
                        uint64_t resident, uint64_t seen) {
  struct sk_wire_map m;
  if (sk__wire_reply_begin(b, &m, id) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "session", session);
  sk_wire_map_u64(&m, "bytes", bytes);
  sk_wire_map_u64(&m, "resident", resident);
  sk_wire_map_u64(&m, "seen", seen);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_export(const msgpack_object *map, uint64_t *ret_bytes, struct sk_error *err) {
  uint64_t v = 0;
  int rc = sk__wire_u64(map, "bytes", &v, err);
  if (rc == 0) *ret_bytes = v;
  return rc;
}

/* ---- events ----------------------------------------------------------- */

int sk_wire_pack_data_event(struct sk_msgbuf *b, uint64_t id, uint64_t offset, const void *data,
                            size_t n) {
  if (sk_msgbuf_init(b) < 0) return -SK_ERR_NO_MEMORY;
  struct sk_wire_map m;
  sk_wire_map_begin(&m, &b->pk);
  sk_wire_map_u64(&m, "id", id);
  sk_wire_map_str(&m, "event", "data");
  sk_wire_map_u64(&m, "offset", offset);
  msgpack_packer *pk = sk_wire_map_key(&m, "data");
  msgpack_pack_bin(pk, n);
  msgpack_pack_bin_body(pk, data, n);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_data_event(const msgpack_object *map, uint64_t *ret_offset,
                              const char **ret_data, size_t *ret_n, struct sk_error *err) {
  struct sk_error perr;
  uint64_t off;
  const char *data;
  size_t n;
  if (sk_msg_need_u64(map, "offset", UINT64_MAX, &off, &perr) < 0 ||
      sk_msg_need_str(map, "data", &data, &n, &perr) < 0)
    return sk__wire_bad(err, perr.message);
  *ret_offset = off;
  *ret_data = data;
  *ret_n = n;
  return 0;
}


int sk_wire_pack_token_event(struct sk_msgbuf *b, uint64_t id, const struct sk_token_event *ev) {
  if (sk_msgbuf_init(b) < 0) return -SK_ERR_NO_MEMORY;
  struct sk_wire_map m;
  sk_wire_map_begin(&m, &b->pk);
  sk_wire_map_u64(&m, "id", id);
  sk_wire_map_str(&m, "event", "token");
  sk_wire_map_i64(&m, "token", ev->token);
  sk_wire_map_strn(&m, "text", ev->text, ev->text_len);
  if (ev->n_top) {
    msgpack_packer *pk = sk_wire_map_key(&m, "top");
    msgpack_pack_array(pk, ev->n_top);
    for (size_t i = 0; i < ev->n_top; i++) {
      msgpack_pack_array(pk, 2);
      msgpack_pack_int32(pk, ev->top[i].token);
      msgpack_pack_float(pk, (float)ev->top[i].logit);
    }
  }
  if (ev->bytes) {
    msgpack_pack_float(sk_wire_map_key(&m, "logprob"), (float)ev->logprob);
    msgpack_packer *pk = sk_wire_map_key(&m, "bytes");
    msgpack_pack_bin(pk, ev->bytes_len);
    msgpack_pack_bin_body(pk, ev->bytes, ev->bytes_len);
  }
  if (ev->n_top_logprobs) {
    msgpack_packer *pk = sk_wire_map_key(&m, "top_logprobs");
    msgpack_pack_array(pk, ev->n_top_logprobs);
    for (size_t i = 0; i < ev->n_top_logprobs; i++) {
      const struct sk_top_logprob *t = &ev->top_logprobs[i];
      msgpack_pack_array(pk, 3);
      msgpack_pack_int32(pk, t->token);
      msgpack_pack_float(pk, (float)t->logprob);
      msgpack_pack_bin(pk, t->bytes_len);
      msgpack_pack_bin_body(pk, t->bytes, t->bytes_len);
    }
  }
  return sk__wire_end(b, &m);
}

/* A msgpack number as a double; false when o is not one. */
static bool sk__wire_obj_number(const msgpack_object *o, double *ret) {
  if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
    *ret = o->via.f64;
  else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
    *ret = (double)o->via.u64;
  else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
    *ret = (double)o->via.i64;
  else
    return false;
  return true;
}

int sk_wire_unpack_token_event(const msgpack_object *map, struct sk_token_event *ret,
                               struct sk_top_pair top[SK_WIRE_MAX_TOP],
                               struct sk_top_logprob toplp[SK_WIRE_MAX_TOP],
                               struct sk_error *err) {
  struct sk_token_event te;
  memset(&te, 0, sizeof te);
  te.logprob = NAN;
  const msgpack_object *tok = sk_msg_get(map, "token");
  if (!tok || !sk__wire_obj_i32(tok, &te.token))
    return sk__wire_bad(err, "token event without an integer 'token'");
  struct sk_error perr;
  int rc = sk_msg_get_str(map, "text", &te.text, &te.text_len, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 0) te.text = "";
  const msgpack_object_array *a;
  rc = sk_msg_get_array(map, "top", &a, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 1) {
    size_t n = a->size < SK_WIRE_MAX_TOP ? a->size : SK_WIRE_MAX_TOP;
    for (size_t i = 0; i < n; i++) {
      const msgpack_object *pair = &a->ptr[i];
      if (pair->type != MSGPACK_OBJECT_ARRAY || pair->via.array.size != 2 ||
          !sk__wire_obj_i32(&pair->via.array.ptr[0], &top[i].token))
        return sk__wire_bad(err, "field 'top' must hold [token, logit] pairs");
      if (!sk__wire_obj_number(&pair->via.array.ptr[1], &top[i].logit))
        return sk__wire_bad(err, "field 'top' must hold [token, logit] pairs");
    }
    te.top = top;
    te.n_top = n;
  }
  const msgpack_object *lp = sk_msg_get(map, "logprob");
  if (lp) {
    const msgpack_object *by = sk_msg_get(map, "bytes");
    if (!sk__wire_obj_number(lp, &te.logprob) || !by || by->type != MSGPACK_OBJECT_BIN)
      return sk__wire_bad(err, "token event: 'logprob' must be a number, with 'bytes' (bin)");
    te.bytes = by->via.bin.size ? by->via.bin.ptr : "";
    te.bytes_len = by->via.bin.size;
  }
  rc = sk_msg_get_array(map, "top_logprobs", &a, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 1) {
    size_t n = a->size < SK_WIRE_MAX_TOP ? a->size : SK_WIRE_MAX_TOP;
    for (size_t i = 0; i < n; i++) {
      const msgpack_object *t = &a->ptr[i];
      if (t->type != MSGPACK_OBJECT_ARRAY || t->via.array.size != 3 ||
          !sk__wire_obj_i32(&t->via.array.ptr[0], &toplp[i].token) ||
          !sk__wire_obj_number(&t->via.array.ptr[1], &toplp[i].logprob) ||
          t->via.array.ptr[2].type != MSGPACK_OBJECT_BIN)
        return sk__wire_bad(err, "field 'top_logprobs' must hold [token, logprob, bytes] "
                                 "triples");
      toplp[i].bytes = t->via.array.ptr[2].via.bin.size ? t->via.array.ptr[2].via.bin.ptr : "";
      toplp[i].bytes_len = t->via.array.ptr[2].via.bin.size;
    }
    te.top_logprobs = toplp;
    te.n_top_logprobs = n;
  }
  *ret = te;
  return 0;
}

int sk_wire_unpack_generate_text(const msgpack_object *map, const char **ret, size_t *ret_len,
                                 struct sk_error *err) {
  struct sk_error perr;
  const char *text = "";
  size_t len = 0;
  int rc = sk_msg_get_str(map, "text", &text, &len, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  *ret = rc == 1 && len ? text : "";
  *ret_len = rc == 1 ? len : 0;
  return 0;
}
