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

  /* The draft cache, how far it is synced, and its bookkeeping saved
   * before each proposal of a step (dsave[t], allocated when first used)
   * with how far it was synced then. */
  struct sk_kv *dkv;
  uint64_t dsynced;
  void *dsave[SK_SPEC_MAX_TOKENS];
  uint64_t dsaved[SK_SPEC_MAX_TOKENS];

  /* Decayed sums of kept proposals and of refusals: the draft's, then
   * the look-up's per n-gram length. */
  double acc[1 + SK__N_GRAMS][2];
  uint32_t idle;          /* steps it paid to propose nothing */
  uint32_t steps;         /* steps that could propose */
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
      bytes += (1 + SK_SPEC_MAX_TOKENS) * meta + data; /* the cache, its saves */
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
  for (uint32_t t = 0; t < SK_SPEC_MAX_TOKENS; t++) free(sp->dsave[t]);
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

uint32_t sk_spec_lookup(const struct sk_spec *sp, int32_t next, uint32_t max, int32_t *out,
                        uint32_t *ret_ngram) {
  *ret_ngram = 0;
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
    *ret_ngram = n;
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
  sp->dsynced = UINT64_MAX;
  return sp->dkv;
}

uint64_t sk_spec_draft_synced(const struct sk_spec *sp) { return sp->dkv ? sp->dsynced : UINT64_MAX; }

void sk_spec_draft_set_synced(struct sk_spec *sp, uint64_t synced) {
  sp->dsynced = synced;
  if (synced == UINT64_MAX && sp->dkv) sk_kv_clear(sp->dkv);
}

void sk_spec_draft_save(struct sk_spec *sp, uint32_t t) {
  if (!sp->dsave[t] && !(sp->dsave[t] = malloc(sk_kv_meta_bytes(sp->dkv)))) {
    sp->dsaved[t] = UINT64_MAX; /* no memory: going back there rebuilds */
    return;
  }
  sk_kv_meta_save(sp->dkv, sp->dsave[t]);
  sp->dsaved[t] = sp->dsynced;
}

void sk_spec_draft_keep(struct sk_spec *sp, uint32_t c, uint32_t fed) {
  if (c > fed) return;
  if (sp->dsaved[c] == UINT64_MAX) {
    sk_spec_draft_set_synced(sp, UINT64_MAX);
    return;
  }
  sk_kv_meta_restore(sp->dkv, sp->dsave[c]);
  sp->dsynced = sp->dsaved[c];
}

/* ---- how many ---- */

/* Decay of the acceptance averages per step: about the last 30 steps. */
#define SK__DECAY 0.97
/* A measured cost is a floor that drifts up slowly: a pass takes at
 * least its work, and a busy machine adds delays of any length to
 * some, which an average would follow; the floor follows the work
 * (2% of a slower sample a step). */
#define SK__COST_DRIFT 0.02
/* A draft pass's cost relative to a one-row pass before any measure. */
#define SK__DRAFT_PRIOR 0.15

/* The decaying floor of *est with a new sample. */
static void sk__floor(double *est, double seconds) {
  if (!(seconds > 0)) return;
  if (!(*est > 0) || seconds < *est) *est = seconds;
  else *est += SK__COST_DRIFT * (seconds - *est);
}

void sk_spec_costs_pass(struct sk_spec_costs *c, uint32_t n, double seconds) {
  if (n < 1 || n > SK_SPEC_MAX_TOKENS + 1 || !(seconds > 0)) return;
  sk__floor(&c->pass[n], seconds);
  if (c->samples[n] < UINT32_MAX) c->samples[n]++;
}

void sk_spec_costs_draft(struct sk_spec_costs *c, double seconds) {
  sk__floor(&c->draft, seconds);
}

/* The cost of a pass of n rows: its measure once it has enough, else a
 * one-row pass's (measured, or judged from the best measured count) with
 * SK_SPEC_ROW_COST a row; 1 + ... when nothing is measured. */
static double sk__pass(const struct sk_spec_costs *c, uint32_t n) {
  if (c->samples[n] >= SK_SPEC_COST_SAMPLES) return c->pass[n];
  double unit = 0;
  for (uint32_t m = 1; m <= SK_SPEC_MAX_TOKENS + 1; m++)
    if (c->samples[m] >= SK_SPEC_COST_SAMPLES) {
      const double u = c->pass[m] / (1.0 + SK_SPEC_ROW_COST * (m - 1));
      if (!(unit > 0) || u < unit) unit = u;
    }
  return (unit > 0 ? unit : 1.0) * (1.0 + SK_SPEC_ROW_COST * (n - 1));
}

/* The acceptance average of mode / ngram: (kept + 4) / (kept + refused +
 * 5) over the decayed sums, 0.8 before any step (a prior that a few
 * refusals do not overturn: a session that stops proposing learns
 * again only from its probes). */
static double *sk__acc(struct sk_spec *sp, uint32_t source, uint32_t ngram) {
  uint32_t i = 0;
  if (source == SK_SPEC_LOOKUP)
    i = 1 + (ngram < SK_SPEC_NGRAM_MIN ? 0 : ngram > SK_SPEC_NGRAM_MAX ? SK__N_GRAMS - 1
                                                                        : ngram - SK_SPEC_NGRAM_MIN);
  return sp->acc[i];
}

uint32_t sk_spec_best(const struct sk_spec *sp, uint32_t source, uint32_t ngram, uint32_t max,
                      const struct sk_spec_costs *c, double *ret_rate) {
  if (max > SK_SPEC_MAX_TOKENS) max = SK_SPEC_MAX_TOKENS;
  const double *acc = sk__acc((struct sk_spec *)sp, source, ngram);
  const double a = (acc[0] + 4.0) / (acc[0] + acc[1] + 5.0);
  const double t1 = sk__pass(c, 1);
  bool known = false; /* t1 is in seconds, as a measured draft pass is */
  for (uint32_t m = 1; m <= SK_SPEC_MAX_TOKENS + 1; m++)
    known |= c->samples[m] >= SK_SPEC_COST_SAMPLES;
  const double d = source != SK_SPEC_DRAFT      ? 0.0
                   : known && c->draft > 0 ? c->draft
                                           : SK__DRAFT_PRIOR * t1;
  double best = 1.0 / t1, tokens = 1.0, ak = 1.0;
  uint32_t k_best = 0;
  for (uint32_t k = 1; k <= max; k++) {
    ak *= a;
    tokens += ak;
    const double rate = tokens / (sk__pass(c, k + 1) + k * d);
    if (rate > best) {
      best = rate;
      k_best = k;
    }
  }
  *ret_rate = best;
  return k_best;
}

uint32_t sk_spec_step(struct sk_spec *sp, uint32_t k, uint32_t max,
                      const struct sk_spec_costs *c) {
  if (max > SK_SPEC_MAX_TOKENS) max = SK_SPEC_MAX_TOKENS;
  /* now and then the count whose cost is measured least */
  if (++sp->steps % SK_SPEC_EXPLORE_STEPS == 0) {
    uint32_t least = 0;
    for (uint32_t n = 0; n <= max; n++)
      if (c->samples[n + 1] < c->samples[least + 1]) least = n;
    if (c->samples[least + 1] < SK_SPEC_COST_SAMPLES) return least;
  }
  if (k == 0 && max > 0 && ++sp->idle % SK_SPEC_PROBE_STEPS == 0) return 1;
  return k;
}

void sk_spec_result(struct sk_spec *sp, uint32_t source, uint32_t ngram, uint32_t proposed,
                    uint32_t accepted) {
  if (proposed == 0) return;
  double *acc = sk__acc(sp, source, ngram);
  acc[0] = SK__DECAY * acc[0] + accepted;
  acc[1] = SK__DECAY * acc[1] + (accepted < proposed ? 1.0 : 0.0);
  sp->counters.drafted += proposed;
  sp->counters.accepted += accepted;
  sp->counters.rejected += proposed - accepted;
}

void sk_spec_counters(const struct sk_spec *sp, struct sk_spec_counters *ret) {
  *ret = sp->counters;
}
