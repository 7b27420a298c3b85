/* A session's speculative decoding state (see spec.h). */
#include "session/spec.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(SK_SPEC_MAX_TOKENS + 1u <= SK_KV_SPARE_SLOTS,
               "a verified chunk (the drawn token and the proposals) fits in the spare slots");
_Static_assert(SK_SPEC_DEFAULT_TOKENS <= SK_SPEC_MAX_TOKENS, "the default is allowed");

#define SK__N_GRAMS (SK_SPEC_NGRAM_MAX - SK_SPEC_NGRAM_MIN + 1u)

struct sk_spec {
  const struct sk_spec_config *cfg;
  struct sk_kv_params params;
  atomic_uint allowed;    /* SK_SPEC_NEEDS_* charged to the session */

  /* History: the tokens with stream indices [start, end), the last
   * `cap` of them at ring[index % cap]. */
  int32_t *ring;          /* (cap) */
  uint32_t cap;
  uint64_t start, end;
  bool has_history;       /* start/end mean something */
  /* For each n-gram length n (SK_SPEC_NGRAM_MIN + g): the low 32 bits of
   * the stream index that followed the latest occurrence of an n-gram
   * of that hash, UINT32_MAX when none. An entry is a hint: the look-up
   * checks the tokens. */
  uint32_t *table[SK__N_GRAMS]; /* (mask + 1) each */
  uint32_t mask;

  /* The draft cache, its saved bookkeeping and how far it is synced. */
  struct sk_kv *dkv;
  void *dsave;
  uint64_t dsynced, dsaved;

  uint32_t k;             /* adaptive proposal count, 0: not started */
  struct sk_spec_counters counters;
};

const char *sk_spec_mode_name(uint32_t mode) {
  switch (mode) {
#define SK__SPEC_NAME(NAME, value, wire) \
  case value: return wire;
    SK_SPEC_LIST(SK__SPEC_NAME)
#undef SK__SPEC_NAME
  }
  return NULL;
}

int sk_spec_mode_parse(const char *name, size_t len) {
#define SK__SPEC_PARSE(NAME, value, wire) \
  if (strlen(wire) == len && memcmp(wire, name, len) == 0) return value;
  SK_SPEC_LIST(SK__SPEC_PARSE)
#undef SK__SPEC_PARSE
  return -1;
}

/* Slots of each look-up table: the power of two at or above the history
 * (one n-gram per token at most). */
static uint32_t sk__table_slots(uint32_t history) {
  uint32_t t = 64;
  while (t < history && t < (1u << 30)) t *= 2;
  return t;
}

unsigned sk_spec_needs(const struct sk_spec_config *cfg, uint32_t mode) {
  if (mode == SK_SPEC_DEFAULT) mode = cfg->default_mode;
  unsigned needs = 0;
  if ((mode == SK_SPEC_LOOKUP || (mode == SK_SPEC_DRAFT && cfg->draft)) && cfg->history)
    needs |= SK_SPEC_NEEDS_HISTORY;
  if (mode == SK_SPEC_DRAFT && cfg->draft) needs |= SK_SPEC_NEEDS_DRAFT;
  return needs;
}

size_t sk_spec_bytes(const struct sk_spec_config *cfg, const struct sk_kv_params *p,
                     unsigned needs) {
  size_t bytes = 0;
  if ((needs & SK_SPEC_NEEDS_HISTORY) && cfg->history)
    bytes += (size_t)cfg->history * sizeof(int32_t) +
             (size_t)SK__N_GRAMS * sk__table_slots(cfg->history) * sizeof(uint32_t);
  if ((needs & SK_SPEC_NEEDS_DRAFT) && cfg->draft) {
    struct sk_kv_shape shape = sk_model_kv_shape(cfg->draft);
    shape.kv_type = cfg->kv_type;
    size_t meta, data;
    if (sk_kv_part_sizes(shape, sk_kv_params_capacity(p), &meta, &data))
      bytes += 2 * meta + data; /* the cache and its saved bookkeeping */
  }
  return bytes;
}

int sk_spec_new(const struct sk_spec_config *cfg, const struct sk_kv_params *p,
                struct sk_spec **ret, struct sk_error *err) {
  struct sk_spec *sp = calloc(1, sizeof *sp);
  if (!sp) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for a session");
  sp->cfg = cfg;
  sp->params = *p;
  sp->dsynced = UINT64_MAX;
  atomic_init(&sp->allowed, 0);
  *ret = sp;
  return 0;
}

void sk_spec_allow(struct sk_spec *sp, unsigned needs) { atomic_fetch_or(&sp->allowed, needs); }

unsigned sk_spec_allowed(const struct sk_spec *sp) {
  return atomic_load(&((struct sk_spec *)sp)->allowed);
}

void sk_spec_free(struct sk_spec *sp) {
  if (!sp) return;
  free(sp->ring);
  for (uint32_t g = 0; g < SK__N_GRAMS; g++) free(sp->table[g]);
  sk_kv_free(sp->dkv);
  free(sp->dsave);
  free(sp);
}

/* ---- history ---- */

/* The token at stream index i (start <= i < end). */
static int32_t sk__at(const struct sk_spec *sp, uint64_t i) { return sp->ring[i % sp->cap]; }

/* Hash of the n tokens at stream indices [i, i + n), then `last` when
 * with_last (an n-gram whose last token is not in the history yet). */
static uint32_t sk__hash(const struct sk_spec *sp, uint64_t i, uint32_t n, bool with_last,
                         int32_t last) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  const uint32_t from_ring = with_last ? n - 1 : n;
  for (uint32_t j = 0; j < from_ring; j++)
    h = (h ^ (uint32_t)sk__at(sp, i + j)) * 0x100000001b3ull;
  if (with_last) h = (h ^ (uint32_t)last) * 0x100000001b3ull;
  h ^= h >> 29;
  return (uint32_t)h & sp->mask;
}

static bool sk__history_alloc(struct sk_spec *sp) {
  if (sp->ring) return true;
  const uint32_t cap = sp->cfg->history, slots = sk__table_slots(cap);
  sp->ring = malloc((size_t)cap * sizeof *sp->ring);
  bool ok = sp->ring != NULL;
  for (uint32_t g = 0; g < SK__N_GRAMS && ok; g++)
    ok = (sp->table[g] = malloc((size_t)slots * sizeof(uint32_t))) != NULL;
  if (!ok) {
    free(sp->ring);
    sp->ring = NULL;
    for (uint32_t g = 0; g < SK__N_GRAMS; g++) {
      free(sp->table[g]);
      sp->table[g] = NULL;
    }
    return false;
  }
  sp->cap = cap;
  sp->mask = slots - 1;
  return true;
}

static void sk__history_reset(struct sk_spec *sp, uint64_t start) {
  for (uint32_t g = 0; g < SK__N_GRAMS; g++)
    memset(sp->table[g], 0xff, ((size_t)sp->mask + 1) * sizeof(uint32_t));
  sp->start = sp->end = start;
  sp->has_history = true;
}

/* Appends one token; the n-grams that end just before it now have a
 * continuation (it) and go into the tables. */
static void sk__push(struct sk_spec *sp, int32_t token) {
  const uint64_t pos = sp->end;
  sp->ring[pos % sp->cap] = token;
  sp->end = pos + 1;
  if (sp->end - sp->start > sp->cap) sp->start = sp->end - sp->cap;
  for (uint32_t g = 0; g < SK__N_GRAMS; g++) {
    const uint32_t n = SK_SPEC_NGRAM_MIN + g;
    if (pos < sp->start + n) break;
    sp->table[g][sk__hash(sp, pos - n, n, false, 0)] = (uint32_t)pos;
  }
}

bool sk_spec_observe(struct sk_spec *sp, const int32_t *tokens, uint32_t n, uint64_t first) {
  if (!sp->cfg->history || !(sk_spec_allowed(sp) & SK_SPEC_NEEDS_HISTORY)) return true;
  if (!sp->has_history || sp->end != first) return false;
  for (uint32_t i = 0; i < n; i++) sk__push(sp, tokens[i]);
  return true;
}

void sk_spec_history_restart(struct sk_spec *sp, const int32_t *resident, uint32_t n,
                             uint64_t end) {
  if (!sp->cfg->history || !(sk_spec_allowed(sp) & SK_SPEC_NEEDS_HISTORY) ||
      !sk__history_alloc(sp))
    return;
  sk__history_reset(sp, end - n);
  for (uint32_t i = 0; i < n; i++) sk__push(sp, resident[i]);
}

bool sk_spec_history_at(const struct sk_spec *sp, uint64_t end) {
  return sp->has_history && sp->end == end;
}

uint32_t sk_spec_lookup(const struct sk_spec *sp, int32_t next, uint32_t max, int32_t *out) {
  if (!sp->has_history || !sp->ring || max == 0) return 0;
  for (uint32_t g = SK__N_GRAMS; g-- > 0;) {
    const uint32_t n = SK_SPEC_NGRAM_MIN + g;
    if (sp->end - sp->start < n) continue; /* the n-gram's n - 1 tokens, and room for one */
    const uint32_t hit = sp->table[g][sk__hash(sp, sp->end - (n - 1), n, true, next)];
    if (hit == UINT32_MAX) continue;
    /* the full stream index: the latest one with these low bits */
    const uint64_t p = sp->end - (uint32_t)((uint32_t)sp->end - hit);
    if (p >= sp->end || p < sp->start + n) continue;
    bool same = sk__at(sp, p - 1) == next;
    for (uint32_t j = 1; j < n && same; j++)
      same = sk__at(sp, p - 1 - j) == sk__at(sp, sp->end - j);
    if (!same) continue;
    uint32_t k = 0;
    for (uint64_t i = p; i < sp->end && k < max; i++) out[k++] = sk__at(sp, i);
    return k;
  }
  return 0;
}

bool sk_spec_history_copy(const struct sk_spec *sp, uint64_t from, uint64_t end, int32_t *out) {
  if (!sp->has_history || from < sp->start || end > sp->end || from > end) return false;
  for (uint64_t i = from; i < end; i++) out[i - from] = sk__at(sp, i);
  return true;
}

/* ---- the draft cache ---- */

struct sk_kv *sk_spec_draft_kv(struct sk_spec *sp) {
  if (sp->dkv || !sp->cfg->draft || !(sk_spec_allowed(sp) & SK_SPEC_NEEDS_DRAFT)) return sp->dkv;
  struct sk_kv_shape shape = sk_model_kv_shape(sp->cfg->draft);
  shape.kv_type = sp->cfg->kv_type;
  struct sk_error err;
  if (sk_kv_new(shape, &sp->params, &sp->dkv, &err) < 0) return NULL;
  sp->dsave = malloc(sk_kv_meta_bytes(sp->dkv));
  if (!sp->dsave) {
    sk_kv_free(sp->dkv);
    sp->dkv = NULL;
  }
  sp->dsynced = UINT64_MAX;
  return sp->dkv;
}

uint64_t sk_spec_draft_synced(const struct sk_spec *sp) { return sp->dkv ? sp->dsynced : UINT64_MAX; }

void sk_spec_draft_set_synced(struct sk_spec *sp, uint64_t synced) {
  sp->dsynced = synced;
  if (synced == UINT64_MAX && sp->dkv) sk_kv_clear(sp->dkv);
}

void sk_spec_draft_save(struct sk_spec *sp) {
  sk_kv_meta_save(sp->dkv, sp->dsave);
  sp->dsaved = sp->dsynced;
}

void sk_spec_draft_restore(struct sk_spec *sp) {
  sk_kv_meta_restore(sp->dkv, sp->dsave);
  sp->dsynced = sp->dsaved;
}

/* ---- how many ---- */

uint32_t sk_spec_k(const struct sk_spec *sp, uint32_t max, bool fixed) {
  if (max > SK_SPEC_MAX_TOKENS) max = SK_SPEC_MAX_TOKENS;
  if (fixed || sp->k == 0 || sp->k > max) return max;
  return sp->k;
}

void sk_spec_result(struct sk_spec *sp, uint32_t max, uint32_t proposed, uint32_t accepted) {
  if (max > SK_SPEC_MAX_TOKENS) max = SK_SPEC_MAX_TOKENS;
  if (proposed == 0) return;
  uint32_t k = sp->k ? sp->k : max;
  if (accepted == proposed) {
    if (proposed >= k) k = k + 2 < max ? k + 2 : max;
  } else {
    k = accepted + 1;
  }
  sp->k = k;
  sp->counters.drafted += proposed;
  sp->counters.accepted += accepted;
  sp->counters.rejected += proposed - accepted;
}

void sk_spec_counters(const struct sk_spec *sp, struct sk_spec_counters *ret) {
  *ret = sp->counters;
}
