/* KV cache block layout, views and eviction policies (see kvcache.h). */
#include "session/kvcache.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sk_limits.h"

_Static_assert(SK_LIMIT_MAX_CAPACITY == SK_KV_MAX_CAPACITY,
               "the configuration's capacity ceiling is the cache's");

/* Every section of a block starts on a cache line, so that the K/V rows
 * (and anything vectorised over them) are aligned wherever the block is
 * mapped, as long as the block itself is 64-byte aligned. */
#define SK__KV_ALIGN 64u

/* ---- policies ------------------------------------------------------- */

/* What each policy is (kvcache.h, sk_policy_parts_of ...): the one table.
 * Name, value and parts come from sinkd/protocol.h's SK_POLICY_LIST; the
 * rest, per policy: rotated keys, attention scores, evict_chunk. A policy
 * added to the list without its SK__RULES_ line does not compile. */
#define SK__RULES_DENSE true, false, 0u
#define SK__RULES_STREAMING true, false, SK_KV_SPARE_SLOTS
#define SK__RULES_WINDOW true, false, SK_KV_SPARE_SLOTS
#define SK__RULES_H2O false, true, 1u
#define SK__RULES_SINK_H2O false, true, 1u
static const struct sk__policy {
  const char *name;
  unsigned parts;
  bool rotated, scores;
  uint32_t evict_chunk;
} sk__policies[] = {
#define SK__POLICY_ROW(NAME, value, wire, parts) [SK_POLICY_##NAME] = {wire, parts, SK__RULES_##NAME},
    SK_POLICY_LIST(SK__POLICY_ROW)
#undef SK__POLICY_ROW
};
#define SK__N_POLICIES (sizeof sk__policies / sizeof sk__policies[0])

static const struct sk__policy *sk__policy(uint32_t policy) {
  static const struct sk__policy none = {0};
  return policy < SK__N_POLICIES && sk__policies[policy].name ? &sk__policies[policy] : &none;
}

unsigned sk_policy_parts_of(uint32_t policy) { return sk__policy(policy)->parts; }
bool sk_policy_rotated(uint32_t policy) { return sk__policy(policy)->rotated; }
bool sk_policy_scores(uint32_t policy) { return sk__policy(policy)->scores; }
uint32_t sk_policy_evict_chunk(uint32_t policy) { return sk__policy(policy)->evict_chunk; }

static const char *const sk__kv_type_names[] = {[SK_KV_F32] = "f32", [SK_KV_F16] = "f16"};
#define SK__N_KV_TYPES (sizeof sk__kv_type_names / sizeof sk__kv_type_names[0])

const char *sk_kv_type_name(uint32_t kv_type) {
  return kv_type < SK__N_KV_TYPES ? sk__kv_type_names[kv_type] : NULL;
}

int sk_kv_type_parse(const char *name, size_t len, uint32_t *ret, struct sk_error *err) {
  for (uint32_t i = 0; i < SK__N_KV_TYPES; i++) {
    const char *s = sk__kv_type_names[i];
    if (strlen(s) == len && memcmp(s, name, len) == 0) {
      *ret = i;
      return 0;
    }
  }
  return sk_error_set(err, SK_ERR_BAD_REQUEST, "unknown KV type \"%.*s\"%s (expected f32 or f16)",
                      (int)(len > 32 ? 32 : len), name, len > 32 ? "..." : "");
}

const char *sk_policy_name(uint32_t policy) {
  return sk__policy(policy)->name;
}

int sk_policy_parse(const char *name, size_t len, uint32_t *ret,
                    struct sk_error *err) {
  for (uint32_t i = 0; i < SK__N_POLICIES; i++) {
    const char *s = sk__policies[i].name;
    if (s && strlen(s) == len && memcmp(s, name, len) == 0) {
      *ret = i;
      return 0;
    }
  }
  /* Only a short prefix of an unknown (client-supplied) name is echoed. */
  return sk_error_set(err, SK_ERR_BAD_REQUEST,
                      "unknown policy \"%.*s\"%s (expected streaming, window, h2o, "
                      "sink_h2o or dense)",
                      (int)(len > 32 ? 32 : len), name, len > 32 ? "..." : "");
}

/* ---- eviction log --------------------------------------------------- */

void sk_evict_log_reset(struct sk_evict_log *log) {
  memset(log, 0, sizeof *log);
}

void sk_evict_log_add(struct sk_evict_log *log, uint64_t index) {
  log->n_evicted++;
  if (log->n_ranges > 0 && log->last[log->n_ranges - 1] + 1 == index) {
    log->last[log->n_ranges - 1] = index;
    return;
  }
  if (log->n_ranges == SK_EVICT_LOG_MAX_RANGES) {
    log->truncated = true;
    return;
  }
  log->first[log->n_ranges] = index;
  log->last[log->n_ranges] = index;
  log->n_ranges++;
}

/* ---- parameters and sizes ------------------------------------------- */

/* The budget: the sum of the parts the policy keeps (capacity for an
 * unknown policy, as for dense). */
static uint64_t sk__capacity(const struct sk_kv_params *p) {
  const unsigned parts = sk_policy_parts_of(p->policy);
  if (!parts || (parts & SK_PART_CAPACITY)) return p->capacity;
  uint64_t c = 0;
  if (parts & SK_PART_SINKS) c += p->n_sink;
  if (parts & SK_PART_WINDOW) c += p->window;
  if (parts & SK_PART_HEAVY) c += (uint64_t)p->heavy + p->recent;
  return c;
}

uint32_t sk_kv_params_capacity(const struct sk_kv_params *p) {
  uint64_t c = sk__capacity(p);
  return c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
}

/* The budget spelled out for messages, from the parts the policy keeps:
 * "n_sink + window = 4 + 60 = 64", "window 60", "capacity 64". */
static void sk__budget_text(const struct sk_kv_params *p, char *buf,
                            size_t size) {
  const unsigned parts = sk_policy_parts_of(p->policy);
  const char *names[4];
  uint32_t values[4];
  unsigned n = 0;
  if (parts & SK_PART_SINKS) names[n] = "n_sink", values[n++] = p->n_sink;
  if (parts & SK_PART_WINDOW) names[n] = "window", values[n++] = p->window;
  if (parts & SK_PART_HEAVY) {
    names[n] = "heavy", values[n++] = p->heavy;
    names[n] = "recent", values[n++] = p->recent;
  }
  if (n == 0) names[n] = "capacity", values[n++] = p->capacity;
  if (n == 1) {
    snprintf(buf, size, "%s %u", names[0], values[0]);
    return;
  }
  size_t at = 0;
  for (unsigned i = 0; i < n && at < size; i++)
    at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? " + " : "", names[i]);
  for (unsigned i = 0; i < n && at < size; i++)
    at += (size_t)snprintf(buf + at, size - at, "%s%u", i ? " + " : " = ", values[i]);
  if (at < size) snprintf(buf + at, size - at, " = %llu", (unsigned long long)sk__capacity(p));
}

int sk_kv_params_check(const struct sk_kv_params *p, uint32_t max_capacity,
                       struct sk_error *err) {
  if (max_capacity > SK_KV_MAX_CAPACITY) max_capacity = SK_KV_MAX_CAPACITY;
  if (!sk_policy_name(p->policy))
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "policy %u is unknown",
                        p->policy);
  if (!isfinite(p->rope_scale) || !(p->rope_scale > 0.0f) ||
      p->rope_scale > SK_KV_MAX_ROPE_SCALE)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "rope_scale %g must be finite, > 0 and <= %g",
                        (double)p->rope_scale, (double)SK_KV_MAX_ROPE_SCALE);
  const char *name = sk_policy_name(p->policy);
  const unsigned parts = sk_policy_parts_of(p->policy);
  if ((parts & SK_PART_WINDOW) && p->window < 1)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "window %u must be >= 1 (%s keeps at least the "
                        "newest token)",
                        p->window, name);
  if ((parts & SK_PART_HEAVY) && p->recent < 1)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "recent %u must be >= 1 (the newest token is "
                        "always kept)",
                        p->recent);
  if ((parts & SK_PART_HEAVY) && p->heavy < 1)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "heavy %u must be >= 1 (with no heavy hitters use "
                        "policy %s)",
                        p->heavy, parts & SK_PART_SINKS ? "streaming" : "window");
  if ((parts & SK_PART_CAPACITY) && p->capacity < 1)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "capacity %u must be >= 1", p->capacity);
  if (sk__capacity(p) > max_capacity) {
    char what[128];
    sk__budget_text(p, what, sizeof what);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%s exceeds the maximum capacity %u", what,
                        max_capacity);
  }
  if (p->n_pin > 0) {
    /* The pin is the sink region, or a dense cache's start. */
    if (!(parts & SK_PART_PIN))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "policy %s has no sink region: a pin needs "
                          "streaming, sink_h2o or dense",
                          name);
    if ((parts & SK_PART_SINKS) && p->n_sink != p->n_pin)
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "n_sink %u differs from the %u pinned tokens "
                          "(the pin is the sink region)",
                          p->n_sink, p->n_pin);
    if ((parts & SK_PART_CAPACITY) && p->n_pin >= p->capacity)
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "pin of %u tokens leaves no room in capacity %u "
                          "(it must be smaller)",
                          p->n_pin, p->capacity);
  }
  return 0;
}

int sk_kv_params_pin(const struct sk_kv_params *p, uint32_t n_pin, const char *raise,
                     struct sk_kv_params *ret, struct sk_error *err) {
  const unsigned parts = sk_policy_parts_of(p->policy);
  if (!(parts & SK_PART_PIN))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "policy %s has no sink region: a pinned prefix needs "
                        "streaming, sink_h2o or dense",
                        sk_policy_name(p->policy) ? sk_policy_name(p->policy) : "?");
  const uint32_t c = sk_kv_params_capacity(p);
  const uint32_t left = n_pin < c ? c - n_pin : 0;
  const uint32_t need = (c + SK_KV_PIN_MIN_WINDOW_SHARE - 1) / SK_KV_PIN_MIN_WINDOW_SHARE;
  if (left < need || left == 0 || ((parts & SK_PART_HEAVY) && left < 2))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "the system prompt is %u tokens: pinned as the session's sinks it "
                        "leaves %u of the session's budget of %u tokens to the %s, less than "
                        "a quarter (%u)%s%s",
                        n_pin, left, c, parts & SK_PART_CAPACITY ? "conversation" : "window",
                        need, raise ? ": " : "", raise ? raise : "");
  struct sk_kv_params q = *p;
  q.n_pin = n_pin;
  if (parts & SK_PART_SINKS) q.n_sink = n_pin;
  if (parts & SK_PART_WINDOW) q.window = left;
  if (parts & SK_PART_HEAVY) {
    /* the proportion of recent tokens kept, rounded; each part >= 1 */
    const uint64_t hr = (uint64_t)p->heavy + p->recent;
    uint64_t r = hr ? ((uint64_t)p->recent * left + hr / 2) / hr : left / 2;
    if (r < 1) r = 1;
    if (r > left - 1) r = left - 1;
    q.recent = (uint32_t)r;
    q.heavy = left - q.recent;
  }
  *ret = q;
  return 0;
}

int sk_kv_pin_prefix(struct sk_kv *kv, uint32_t n_pin, const char *raise, struct sk_error *err) {
  struct sk_kv_header *h = kv->hdr;
  if (h->n_seen != 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "a pinned prefix goes first: the session has seen %llu tokens",
                        (unsigned long long)h->n_seen);
  const struct sk_kv_params p = {.policy = h->policy, .n_sink = h->n_sink, .window = h->window,
                                 .heavy = h->heavy, .recent = h->recent,
                                 .capacity = h->capacity, .n_pin = h->n_pin,
                                 .rope_scale = h->rope_scale};
  struct sk_kv_params q;
  int rc = sk_kv_params_pin(&p, n_pin, raise, &q, err);
  if (rc < 0) return rc;
  h->n_sink = q.n_sink;
  h->window = q.window;
  h->heavy = q.heavy;
  h->recent = q.recent;
  h->n_pin = q.n_pin;
  return 0;
}

int sk_kv_params_check_context(const struct sk_kv_params *p,
                               uint32_t n_ctx_train, struct sk_error *err) {
  double limit = floor((double)n_ctx_train * (double)p->rope_scale);
  uint32_t c = sk_kv_params_capacity(p);
  if ((double)c > limit) {
    char what[128];
    sk__budget_text(p, what, sizeof what);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%s exceeds the model's context: n_ctx_train %u x "
                        "rope_scale %g = %.0f positions",
                        what, n_ctx_train, (double)p->rope_scale, limit);
  }
  return 0;
}

static uint64_t sk__align_up(uint64_t x) {
  return (x + SK__KV_ALIGN - 1) / SK__KV_ALIGN * SK__KV_ALIGN;
}

/* Section offsets of a block; false on overflow. Sizes are computed in
 * 64 bits from 32-bit factors, each product checked against SIZE_MAX. */
struct sk__kv_layout {
  uint64_t off_token, off_index, off_order, off_score, off_k, off_v, size;
};

static bool sk__kv_layout(uint32_t n_layer, uint32_t kv_dim, uint32_t kv_type,
                          uint32_t capacity, struct sk__kv_layout *ret) {
  if (n_layer == 0 || kv_dim == 0 || capacity == 0 ||
      capacity > SK_KV_MAX_CAPACITY || !sk_kv_type_name(kv_type))
    return false;
  const uint64_t es = sk_kv_type_size(kv_type);
  uint64_t slots = (uint64_t)capacity + SK_KV_SPARE_SLOTS;
  /* rows = L * S < 2^53; elements = rows * D: check before multiplying. */
  uint64_t rows = (uint64_t)n_layer * slots;
  if (rows > UINT64_MAX / kv_dim / es) return false;
  uint64_t kv_bytes = rows * kv_dim * es;
  struct sk__kv_layout l;
  l.off_token = sk__align_up(sizeof(struct sk_kv_header));
  l.off_index = sk__align_up(l.off_token + slots * sizeof(int32_t));
  l.off_order = sk__align_up(l.off_index + slots * sizeof(uint64_t));
  l.off_score = sk__align_up(l.off_order + slots * sizeof(uint32_t));
  l.off_k = sk__align_up(l.off_score + slots * sizeof(float));
  if (kv_bytes > (UINT64_MAX - l.off_k - 2 * SK__KV_ALIGN) / 2) return false;
  l.off_v = sk__align_up(l.off_k + kv_bytes);
  l.size = sk__align_up(l.off_v + kv_bytes);
  if (l.size > SIZE_MAX) return false;
  *ret = l;
  return true;
}

size_t sk_kv_size(struct sk_kv_shape shape, uint32_t capacity) {
  struct sk__kv_layout l;
  if (!sk__kv_layout(shape.n_layer, shape.kv_dim, shape.kv_type, capacity, &l)) return 0;
  return (size_t)l.size;
}

bool sk_kv_part_sizes(struct sk_kv_shape shape, uint32_t capacity,
                      size_t *ret_meta, size_t *ret_data) {
  struct sk__kv_layout l;
  if (!sk__kv_layout(shape.n_layer, shape.kv_dim, shape.kv_type, capacity, &l)) return false;
  *ret_meta = (size_t)l.off_k;
  *ret_data = (size_t)(l.size - l.off_k);
  return true;
}

/* ---- blocks and views ----------------------------------------------- */

/* Meta pointers into a meta part, data pointers into a data part that
 * starts at block offset off_k. */
static void sk__kv_view(struct sk_kv *kv, void *meta, void *data) {
  struct sk_kv_header *h = meta;
  char *base = meta;
  char *dbase = (char *)data - h->off_k;
  kv->hdr = h;
  kv->token = (int32_t *)(void *)(base + h->off_token);
  kv->index = (uint64_t *)(void *)(base + h->off_index);
  kv->order = (uint32_t *)(void *)(base + h->off_order);
  kv->score = (float *)(void *)(base + h->off_score);
  kv->k = dbase + h->off_k;
  kv->v = dbase + h->off_v;
}

void sk_kv_rebind_meta(struct sk_kv *kv, void *meta) {
  struct sk_kv_header *h = meta;
  char *base = meta;
  kv->hdr = h;
  kv->token = (int32_t *)(void *)(base + h->off_token);
  kv->index = (uint64_t *)(void *)(base + h->off_index);
  kv->order = (uint32_t *)(void *)(base + h->off_order);
  kv->score = (float *)(void *)(base + h->off_score);
}

int sk_kv_init(struct sk_kv *kv, void *mem, size_t size,
               struct sk_kv_shape shape, const struct sk_kv_params *p,
               struct sk_error *err) {
  size_t meta_size, data_size;
  if (!sk_kv_part_sizes(shape, sk_kv_params_capacity(p), &meta_size,
                        &data_size) ||
      size < meta_size)
    return sk_kv_init_split(kv, mem, size, NULL, 0, shape, p, err);
  return sk_kv_init_split(kv, mem, meta_size, (char *)mem + meta_size,
                          size - meta_size, shape, p, err);
}

int sk_kv_init_split(struct sk_kv *kv, void *meta, size_t meta_size,
                     void *data, size_t data_size, struct sk_kv_shape shape,
                     const struct sk_kv_params *p, struct sk_error *err) {
  int rc = sk_kv_params_check(p, SK_KV_MAX_CAPACITY, err);
  if (rc < 0) return rc;
  uint32_t capacity = sk_kv_params_capacity(p);
  struct sk__kv_layout l;
  if (!sk__kv_layout(shape.n_layer, shape.kv_dim, shape.kv_type, capacity, &l))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache shape n_layer %u x kv_dim %u x capacity %u (kv_type %u) is "
                        "empty, too large or of an unknown type",
                        shape.n_layer, shape.kv_dim, capacity, shape.kv_type);
  if (meta_size < l.off_k || data_size < l.size - l.off_k)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache block of %zu bytes is smaller than the %llu "
                        "bytes needed",
                        meta_size + data_size, (unsigned long long)l.size);
  if ((uintptr_t)meta % SK__KV_ALIGN != 0 ||
      (uintptr_t)data % SK__KV_ALIGN != 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache block is not %u-byte aligned", SK__KV_ALIGN);

  /* The meta part (header, bookkeeping, scores) is cleared; K/V rows are
   * written before they
   * are ever read (a slot becomes resident only after the forward pass
   * filled it), so they are left as they are. */
  memset(meta, 0, (size_t)l.off_k);
  struct sk_kv_header *h = meta;
  h->magic = SK_KV_MAGIC;
  h->layout_version = SK_KV_LAYOUT_VERSION;
  h->n_layer = shape.n_layer;
  h->kv_dim = shape.kv_dim;
  h->kv_type = shape.kv_type;
  h->capacity = capacity;
  h->n_slots = capacity + SK_KV_SPARE_SLOTS;
  h->policy = p->policy;
  const unsigned parts = sk_policy_parts_of(p->policy);
  h->n_sink = parts & SK_PART_SINKS ? p->n_sink : 0;
  h->window = parts & SK_PART_WINDOW ? p->window : 0;
  h->heavy = parts & SK_PART_HEAVY ? p->heavy : 0;
  h->recent = parts & SK_PART_HEAVY ? p->recent : 0;
  h->n_pin = p->n_pin;
  h->rope_scale = p->rope_scale;
  h->n_resident = 0;
  h->n_seen = 0;
  h->n_evicted = 0;
  h->off_token = l.off_token;
  h->off_index = l.off_index;
  h->off_order = l.off_order;
  h->off_score = l.off_score;
  h->off_k = l.off_k;
  h->off_v = l.off_v;
  h->size = l.size;
  sk__kv_view(kv, meta, data);
  for (uint32_t i = 0; i < h->n_slots; i++) kv->order[i] = i;
  return 0;
}

static int sk__bad_field(struct sk_error *err, const char *field,
                         unsigned long long value, unsigned long long want) {
  return sk_error_set(err, SK_ERR_BAD_REQUEST,
                      "cache header: %s is %llu, expected %llu", field, value,
                      want);
}

int sk_kv_attach(struct sk_kv *kv, void *mem, size_t size,
                 struct sk_error *err) {
  /* Split at the header's own off_k once it is known to be sane; the
   * split check below names any inconsistency. */
  size_t meta_size = size;
  if (size >= sizeof(struct sk_kv_header)) {
    const struct sk_kv_header *h = mem;
    if (h->off_k <= size) meta_size = (size_t)h->off_k;
  }
  return sk_kv_attach_split(kv, mem, meta_size, (char *)mem + meta_size,
                            size - meta_size, err);
}

int sk_kv_attach_split(struct sk_kv *kv, void *meta, size_t meta_size,
                       void *data, size_t data_size, struct sk_error *err) {
  if (meta_size < sizeof(struct sk_kv_header))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache block of %zu bytes is smaller than its header "
                        "(%zu bytes)",
                        meta_size + data_size, sizeof(struct sk_kv_header));
  if ((uintptr_t)meta % SK__KV_ALIGN != 0 ||
      (uintptr_t)data % SK__KV_ALIGN != 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache block is not %u-byte aligned", SK__KV_ALIGN);
  const struct sk_kv_header *h = meta;
  if (h->magic != SK_KV_MAGIC)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: magic is 0x%08x, expected 0x%08x",
                        h->magic, SK_KV_MAGIC);
  if (h->layout_version != SK_KV_LAYOUT_VERSION)
    return sk__bad_field(err, "layout_version", h->layout_version,
                         SK_KV_LAYOUT_VERSION);
  if (h->n_layer == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "cache header: n_layer is 0");
  if (h->kv_dim == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "cache header: kv_dim is 0");
  if (h->capacity == 0 || h->capacity > SK_KV_MAX_CAPACITY)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: capacity %u is outside 1..%u",
                        h->capacity, SK_KV_MAX_CAPACITY);
  if (!sk_policy_name(h->policy))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: policy %u is unknown", h->policy);
  /* The policy's parameters must be valid and add up to the capacity. */
  struct sk_kv_params hp = {.policy = h->policy, .n_sink = h->n_sink,
                            .window = h->window, .heavy = h->heavy,
                            .recent = h->recent, .capacity = h->capacity,
                            .n_pin = h->n_pin, .rope_scale = h->rope_scale};
  struct sk_error perr;
  if (sk_kv_params_check(&hp, SK_KV_MAX_CAPACITY, &perr) < 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "cache header: %s",
                        perr.message);
  const unsigned parts = sk_policy_parts_of(h->policy);
  if ((!(parts & SK_PART_SINKS) && h->n_sink) || (!(parts & SK_PART_WINDOW) && h->window) ||
      (!(parts & SK_PART_HEAVY) && (h->heavy || h->recent)))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: a parameter that policy %s does not "
                        "use is set (n_sink %u, window %u, heavy %u, "
                        "recent %u)",
                        sk_policy_name(h->policy), h->n_sink, h->window,
                        h->heavy, h->recent);
  if (sk_kv_params_capacity(&hp) != h->capacity)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: %s parameters n_sink %u, window %u, "
                        "heavy %u, recent %u do not add up to capacity %u",
                        sk_policy_name(h->policy), h->n_sink, h->window,
                        h->heavy, h->recent, h->capacity);
  if (h->n_slots != h->capacity + SK_KV_SPARE_SLOTS)
    return sk__bad_field(err, "n_slots", h->n_slots,
                         (unsigned long long)h->capacity + SK_KV_SPARE_SLOTS);
  if (!sk_kv_type_name(h->kv_type))
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "cache header: kv_type %u is unknown",
                        h->kv_type);
  struct sk__kv_layout l;
  if (!sk__kv_layout(h->n_layer, h->kv_dim, h->kv_type, h->capacity, &l))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: shape n_layer %u x kv_dim %u x "
                        "capacity %u is too large",
                        h->n_layer, h->kv_dim, h->capacity);
  /* Layout version 1 fixes every offset; anything else is corruption. */
  if (h->off_token != l.off_token)
    return sk__bad_field(err, "off_token", h->off_token, l.off_token);
  if (h->off_index != l.off_index)
    return sk__bad_field(err, "off_index", h->off_index, l.off_index);
  if (h->off_order != l.off_order)
    return sk__bad_field(err, "off_order", h->off_order, l.off_order);
  if (h->off_score != l.off_score)
    return sk__bad_field(err, "off_score", h->off_score, l.off_score);
  if (h->off_k != l.off_k)
    return sk__bad_field(err, "off_k", h->off_k, l.off_k);
  if (h->off_v != l.off_v)
    return sk__bad_field(err, "off_v", h->off_v, l.off_v);
  if (h->size != l.size)
    return sk__bad_field(err, "size", h->size, l.size);
  if (h->off_k > meta_size || h->size - h->off_k > data_size)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: size %llu exceeds the %zu bytes of "
                        "the block",
                        (unsigned long long)h->size, meta_size + data_size);
  if (h->n_resident > h->capacity)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: n_resident %u exceeds capacity %u",
                        h->n_resident, h->capacity);
  /* Tokens ever appended are resident, evicted, or dropped by a clear. */
  if (h->n_evicted > h->n_seen || h->n_resident > h->n_seen - h->n_evicted)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache header: n_resident %u + n_evicted %llu exceed "
                        "n_seen %llu",
                        h->n_resident, (unsigned long long)h->n_evicted,
                        (unsigned long long)h->n_seen);

  const uint32_t *order =
      (const uint32_t *)(const void *)((const char *)meta + h->off_order);
  uint32_t cap = h->n_slots;
  uint64_t *seen = calloc((cap + 63) / 64, sizeof *seen); /* (C bits) */
  if (!seen)
    return sk_error_set(err, SK_ERR_NO_MEMORY,
                        "cannot check the order of a %u-slot cache", cap);
  for (uint32_t p = 0; p < cap; p++) {
    uint32_t s = order[p];
    if (s >= cap || (seen[s / 64] >> (s % 64) & 1)) {
      free(seen);
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "cache header: order[%u] = %u is %s", p, s,
                          s >= cap ? "out of range" : "repeated");
    }
    seen[s / 64] |= (uint64_t)1 << (s % 64);
  }
  free(seen);
  /* Eviction order compares scores: a NaN would make it depend on the
   * scan, so only finite scores are accepted. */
  const float *score =
      (const float *)(const void *)((const char *)meta + h->off_score);
  for (uint32_t p = 0; p < cap; p++)
    if (!isfinite(score[p]))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "cache header: score[%u] is not finite", p);
  sk__kv_view(kv, meta, data);
  return 0;
}

int sk_kv_new(struct sk_kv_shape shape, const struct sk_kv_params *p,
              struct sk_kv **ret, struct sk_error *err) {
  int rc = sk_kv_params_check(p, SK_KV_MAX_CAPACITY, err);
  if (rc < 0) return rc;
  size_t size = sk_kv_size(shape, sk_kv_params_capacity(p));
  if (size == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache shape n_layer %u x kv_dim %u x capacity %u is "
                        "empty or too large",
                        shape.n_layer, shape.kv_dim, sk_kv_params_capacity(p));
  struct sk_kv *kv = malloc(sizeof *kv);
  void *mem = aligned_alloc(SK__KV_ALIGN, size); /* size is a multiple */
  if (!kv || !mem) {
    free(kv);
    free(mem);
    return sk_error_set(err, SK_ERR_NO_MEMORY,
                        "cannot allocate a %zu-byte KV cache", size);
  }
  rc = sk_kv_init(kv, mem, size, shape, p, err);
  if (rc < 0) {
    free(kv);
    free(mem);
    return rc;
  }
  *ret = kv;
  return 0;
}

void sk_kv_free(struct sk_kv *kv) {
  if (!kv) return;
  free(kv->hdr);
  free(kv);
}

/* ---- policy operations ---------------------------------------------- */

uint32_t sk_kv_max_room(const struct sk_kv *kv) {
  return kv->hdr->capacity - kv->hdr->n_sink;
}

static void sk__reverse(uint32_t *a, uint32_t n) {
  for (uint32_t i = 0, j = n; i + 1 < j; i++, j--) {
    uint32_t t = a[i];
    a[i] = a[j - 1];
    a[j - 1] = t;
  }
}

/* Candidate (cache position) ordered by eviction preference: smaller
 * score first, then older (smaller position). */
struct sk__cand {
  float score;
  uint32_t pos;
};

static int sk__cand_cmp(const void *a, const void *b) {
  const struct sk__cand *x = a, *y = b;
  if (x->score < y->score) return -1;
  if (x->score > y->score) return 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int sk__u32_cmp(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* H2O eviction of e >= 1 tokens among cache positions [lo, hi)
 * (hi - lo >= e): the e smallest scores, ties to the older. Survivors keep
 * their order and move down; the victims' slots join the tail of the free
 * list. Returns 0 or -SK_ERR_NO_MEMORY (nothing changed). */
static int sk__h2o_evict(struct sk_kv *kv, uint32_t lo, uint32_t hi,
                         uint32_t e, struct sk_evict_log *log,
                         struct sk_error *err) {
  struct sk_kv_header *h = kv->hdr;
  const uint32_t nr = h->n_resident;
  uint32_t local[2];
  uint32_t *buf = local; /* (2e): victim positions ascending, their slots */
  if (e == 1) {
    /* The common case (one new token into a full cache): a scan; strict
     * < keeps the older of equal scores. */
    uint32_t best = lo;
    for (uint32_t p = lo + 1; p < hi; p++)
      if (kv->score[kv->order[p]] < kv->score[kv->order[best]]) best = p;
    buf[0] = best;
  } else {
    struct sk__cand *cand = malloc((size_t)(hi - lo) * sizeof *cand);
    buf = malloc(2 * (size_t)e * sizeof *buf);
    if (!cand || !buf) {
      free(cand);
      free(buf);
      return sk_error_set(err, SK_ERR_NO_MEMORY,
                          "cannot choose %u tokens to evict", e);
    }
    for (uint32_t p = lo; p < hi; p++)
      cand[p - lo] = (struct sk__cand){kv->score[kv->order[p]], p};
    qsort(cand, hi - lo, sizeof *cand, sk__cand_cmp);
    for (uint32_t i = 0; i < e; i++) buf[i] = cand[i].pos;
    free(cand);
    qsort(buf, e, sizeof *buf, sk__u32_cmp);
  }
  uint32_t *vpos = buf, *vslot = buf + e;
  for (uint32_t i = 0; i < e; i++) {
    vslot[i] = kv->order[vpos[i]];
    if (log) sk_evict_log_add(log, kv->index[vslot[i]]);
  }
  /* Survivors and the free list move down over the victims; the victims'
   * slots join the tail of the free list (FIFO, see kvcache.h). */
  const uint32_t ns = h->n_slots;
  uint32_t w = vpos[0], vi = 0;
  for (uint32_t p = vpos[0]; p < ns; p++) {
    if (vi < e && p == vpos[vi]) {
      vi++;
      continue;
    }
    kv->order[w++] = kv->order[p];
  }
  for (uint32_t i = 0; i < e; i++) kv->order[ns - e + i] = vslot[i];
  if (buf != local) free(buf);
  h->n_resident = nr - e;
  h->n_evicted += e;
  return 0;
}

int sk_kv_make_room(struct sk_kv *kv, uint32_t n, struct sk_evict_log *log,
                    struct sk_error *err) {
  struct sk_kv_header *h = kv->hdr;
  uint32_t free_slots = sk_kv_free_slots(kv);
  if (n <= free_slots) return 0;
  uint32_t max_room = sk_kv_max_room(kv);
  if (n > max_room)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "room for %u tokens asked at once; the %s policy "
                        "makes room for at most %u per step",
                        n, sk_policy_name(h->policy), max_room);
  if (sk_policy_evict_chunk(h->policy) == 0)
    return sk_error_set(err, SK_ERR_CONTEXT_FULL,
                        "context full: needs %u, %u of %u free", n,
                        free_slots, h->capacity);

  /* e >= 1 tokens leave. n <= C - n_sink gives e <= n_resident - n_sink:
   * there are always enough non-sink tokens. */
  uint32_t e = n - free_slots;
  uint32_t s0 = h->n_sink, nr = h->n_resident, ns = h->n_slots;
  if (sk_policy_scores(h->policy)) {
    /* Protected: sinks, and the newest (recent - n) residents. The
     * candidates number nr - s0 - protect >= e (see kvcache.h). */
    uint32_t protect = h->recent > n ? h->recent - n : 0;
    if (protect > nr - s0) protect = nr - s0;
    return sk__h2o_evict(kv, s0, nr - protect, e, log, err);
  }
  /* streaming, window: evict the e oldest window tokens, at positions
   * n_sink..n_sink+e-1. Later positions and the free list shift down; the
   * evicted slots join the tail of the free list (FIFO, see kvcache.h):
   * order stays a permutation. */
  if (log)
    for (uint32_t p = s0; p < s0 + e; p++)
      sk_evict_log_add(log, kv->index[kv->order[p]]);
  /* Rotate order[s0..S) left by e in place (three reversals). */
  sk__reverse(kv->order + s0, e);
  sk__reverse(kv->order + s0 + e, ns - s0 - e);
  sk__reverse(kv->order + s0, ns - s0);
  h->n_resident = nr - e;
  h->n_evicted += e;
  return 0;
}

void sk_kv_commit(struct sk_kv *kv, const int32_t *tokens, uint32_t n) {
  struct sk_kv_header *h = kv->hdr;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t slot = kv->order[h->n_resident + i];
    kv->token[slot] = tokens[i];
    kv->index[slot] = h->n_seen + i;
  }
  h->n_resident += n;
  h->n_seen += n;
}

void sk_kv_commit_prefix(struct sk_kv *kv, const int32_t *tokens, uint32_t n,
                         uint32_t n_evicted, uint32_t m, struct sk_evict_log *log) {
  struct sk_kv_header *h = kv->hdr;
  /* free slots before the chunk's make_room: those it found, less the
   * ones its evictions made */
  const uint32_t free_before = h->capacity - h->n_resident - n_evicted;
  const uint32_t keep = m > free_before ? m - free_before : 0; /* evictions m tokens need */
  const uint32_t back = n_evicted - (keep < n_evicted ? keep : n_evicted);
  (void)n;
  if (back) {
    /* The chunk's evicted slots sit at the tail of the free list, oldest
     * first; the newest `back` of them return in front of the window:
     * rotate order[n_sink..S) right by back (three reversals). */
    const uint32_t s0 = h->n_sink, ns = h->n_slots;
    sk__reverse(kv->order + s0, ns - s0 - back);
    sk__reverse(kv->order + ns - back, back);
    sk__reverse(kv->order + s0, ns - s0);
    h->n_resident += back;
    h->n_evicted -= back;
  }
  if (log)
    for (uint32_t i = h->n_slots - (n_evicted - back); i < h->n_slots; i++)
      sk_evict_log_add(log, kv->index[kv->order[i]]);
  sk_kv_commit(kv, tokens, m);
}

void sk_kv_add_scores(struct sk_kv *kv, const float *row_scores, uint32_t rows) {
  const uint32_t ns = kv->hdr->n_slots;
  for (uint32_t r = 0; r < rows; r++)
    for (uint32_t i = 0; i < ns; i++) kv->score[i] += row_scores[(size_t)r * ns + i];
}

size_t sk_kv_meta_bytes(const struct sk_kv *kv) { return (size_t)kv->hdr->off_k; }

void sk_kv_meta_save(const struct sk_kv *kv, void *buf) {
  memcpy(buf, kv->hdr, (size_t)kv->hdr->off_k);
}

void sk_kv_meta_restore(struct sk_kv *kv, const void *buf) {
  memcpy(kv->hdr, buf, (size_t)((const struct sk_kv_header *)buf)->off_k);
}

void sk_kv_clear(struct sk_kv *kv) { kv->hdr->n_resident = 0; }

/* ---- the forward pass's view (kvstep.h) ----------------------------- */

void sk_kv_step_view(const struct sk_kv *kv, struct sk_kv_step *ret) {
  const struct sk_kv_header *h = kv->hdr;
  const struct sk__policy *pol = sk__policy(h->policy);
  *ret = (struct sk_kv_step){
      .n_layer = h->n_layer,
      .kv_dim = h->kv_dim,
      .f16 = h->kv_type == SK_KV_F16,
      .row_bytes = sk_kv_row_bytes(kv),
      .capacity = h->capacity,
      .n_slots = h->n_slots,
      .n_resident = h->n_resident,
      .n_seen = h->n_seen,
      .first_index = h->n_resident ? sk_kv_index_at(kv, 0) : h->n_seen,
      .n_sink = h->n_sink,
      .rope_scale = h->rope_scale,
      .rotated = pol->rotated,
      .scores = pol->scores,
      .chunk_evicts = pol->evict_chunk > 1,
      .order = kv->order,
      .score = pol->scores ? kv->score : NULL,
  };
}

void *sk_kv_layer_k(const struct sk_kv *kv, uint32_t layer) { return sk_kv_krow(kv, layer, 0); }

void *sk_kv_layer_v(const struct sk_kv *kv, uint32_t layer) { return sk_kv_vrow(kv, layer, 0); }
