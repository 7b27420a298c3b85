/* A session's KV cache: one contiguous block with a fixed, documented
 * layout (so that it can live in malloc'd memory now and in a shared
 * memory object later without the model code changing), plus the eviction
 * policies that keep it at a fixed size.
 *
 * Policies (chosen per session; each has a fixed budget C):
 *   dense     {capacity}: no eviction; appending past capacity fails with
 *             -SK_ERR_CONTEXT_FULL (never silent truncation).
 *   streaming {n_sink, window}: StreamingLLM (Xiao et al. 2023, "Efficient
 *             Streaming Language Models with Attention Sinks", sec. 3.2):
 *             the first n_sink tokens (attention sinks) stay forever; of
 *             the rest the most recent `window` stay; once full, each new
 *             token evicts the oldest window token. C = n_sink + window.
 *   window    {window}: the same without sinks (the baseline that the
 *             paper shows failing once the first tokens leave). C = window.
 *   h2o       {heavy, recent}: Heavy-Hitter Oracle (Zhang et al. 2023,
 *             "H2O: Heavy-Hitter Oracle for Efficient Generative Inference
 *             of Large Language Models", sec. 3-4, the greedy eviction of
 *             Algorithm 1): the newest `recent` tokens always stay; when
 *             room is needed, the older token with the smallest
 *             accumulated attention score is evicted. C = heavy + recent.
 *   sink_h2o  {n_sink, heavy, recent}: the first n_sink tokens never
 *             leave; H2O on the rest. C = n_sink + heavy + recent.
 *
 * Accumulated attention score (h2o, sink_h2o): score[slot] is the sum of
 * the softmax probability the token received, over every query (prefill
 * rows and decoded tokens) since it entered the cache, every layer and
 * every query head. With grouped-query attention a KV head serves
 * n_head / n_kv_head query heads; the rule is: per KV head, sum the
 * probabilities of all query heads of its group, then sum over KV heads
 * and layers. A token has one score because it has one slot for all
 * layers and heads (H2O's paper evicts per head; a shared slot cannot).
 * The forward pass (attention.c) accumulates it; a slot's score is reset to 0
 * when a new token is written into it.
 *
 * Tie-break (h2o, sink_h2o): among equal scores the older token (smaller
 * stream index, i.e. smaller cache position) is evicted first, so the same
 * input always gives the same resident set.
 *
 * Pinned prefix: a session may pin its first n_pin tokens (a system
 * prompt). For streaming and sink_h2o they are the sink region
 * (n_sink == n_pin); for dense they are simply never evicted (nothing is).
 * Window and h2o have no sink region and take no pin.
 *
 * Positions are cache positions: the token at cache position p (0-based,
 * in stream order among resident tokens) is rotated by RoPE at p, whatever
 * its index in the stream. How keys are stored depends on the policy:
 *   dense, streaming, window: rotated by RoPE at their stream index t
 *     (index[] below). RoPE scores depend only on the distance between
 *     query and key, and within each of these caches' runs of positions
 *     (the sinks; the window, or all of a dense cache) t - p is one
 *     number, so the forward pass rotates a query once per run and never
 *     touches a cached key again (attention.c): O(1) rotations a
 *     token, whatever the window.
 *   h2o, sink_h2o: before RoPE. An eviction in the middle moves every
 *     later token one position down, so t - p differs from token to
 *     token; the keys are rotated at their current position at every
 *     step, O(resident) rotations a token.
 * Slots are storage places; `order` maps positions to slots, so an
 * eviction moves O(capacity) integers, never keys or values.
 *
 * Spare slots and the FIFO free list (what makes a step crash-consistent
 * when the block lives in shared memory, see store.h): a cache of capacity
 * C has S = C + SK_KV_SPARE_SLOTS physical slots. The free slots are kept
 * in order[n_resident..S) as a FIFO queue: the next tokens are written to
 * the slots at its head, and a slot freed by an eviction joins its tail.
 * So a step that evicts at most SK_KV_SPARE_SLOTS tokens writes keys and
 * values only into slots that were already free before the step: the
 * K/V of every token resident before the step stay untouched until the
 * step's bookkeeping (the meta part) is committed. Policies must keep this
 * rule: an evicted slot goes to the tail of the free list, never its head.
 *
 * Block layout (byte offsets in the header; every section 64-byte
 * aligned; `C` = capacity, `S` = n_slots = C + SK_KV_SPARE_SLOTS,
 * `L` = n_layer, `D` = kv_dim). The block is two parts: the *meta part*
 * [0, off_k) holds the header and every per-slot array; the *data part*
 * [off_k, size) holds keys and values. The two may live at different
 * addresses (sk_kv_init_split / sk_kv_attach_split): the shared-memory
 * store keeps two copies of the meta part and one data part. New per-slot
 * state belongs in the meta part, before off_k.
 *
 *   meta part
 *   struct sk_kv_header                  see below
 *   int32_t  token[S]                    token id held by each slot
 *   uint64_t index[S]                    stream index of that token (how
 *                                        many tokens the session had seen
 *                                        before it)
 *   uint32_t order[S]                    a permutation of 0..S-1:
 *                                        order[p] for p < n_resident is
 *                                        the slot at cache position p;
 *                                        order[n_resident..S) are the free
 *                                        slots, next to be filled first
 *   float    score[S]                    accumulated attention score of
 *                                        each slot (h2o, sink_h2o; 0 for
 *                                        the other policies)
 *   data part (offsets still from the block start); E = the element
 *   type, kv_type: float (f32) or IEEE binary16 (f16, as llama.cpp's
 *   default F16 cache: half the memory and half the bytes attention
 *   reads, keys and values rounded to 11 significant bits)
 *   E        k[L][S][D]                  keys: rotated at their stream
 *                                        index, or before RoPE (h2o,
 *                                        sink_h2o), see above
 *   E        v[L][S][D]                  values
 *
 * Memory per session is exactly sk_kv_size(): it depends on the policy's
 * budget, never on how many tokens have streamed through.
 */
#ifndef SK_KVCACHE_H
#define SK_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/kvstep.h"
#include "sinkd/protocol.h"

#define SK_KV_MAGIC 0x564b4b53u /* "SKKV" little-endian */
#define SK_KV_LAYOUT_VERSION 4u /* 4: keys rotated (dense/streaming/window) */
/* Physical slots beyond the capacity: the most tokens one crash-consistent
 * step may evict, so a full streaming cache takes chunks of up to this
 * many tokens per forward pass (scheduler.c; other policies evict one per
 * step). 16 slots cost 16 / capacity of a cache's memory (1.6% at 1024)
 * and let an append into a full window run 16 tokens per pass, not 1. */
#define SK_KV_SPARE_SLOTS 16u
/* SK_KV_MAX_CAPACITY, enum sk_kv_type and struct sk_kv_shape are in
 * kvstep.h, the part of the cache the model uses. */
/* Largest rope_scale (position interpolation factor) a session may ask
 * for: Chen et al. 2023 stretch contexts by 2-32x; past 64 neighbouring
 * positions differ by less than float precision in the slow dimensions. */
#define SK_KV_MAX_ROPE_SCALE ((float)SK_MAX_ROPE_SCALE)

/* The values sinkd/protocol.h's SK_POLICY_LIST gives (stored in headers). */
enum sk_policy {
#define SK__POLICY_ENUM(NAME, value, wire, parts) SK_POLICY_##NAME = value,
  SK_POLICY_LIST(SK__POLICY_ENUM)
#undef SK__POLICY_ENUM
};

/* "f32", "f16"; NULL for unknown values. */
const char *sk_kv_type_name(uint32_t kv_type);
/* Parses a type name of len bytes. Returns 0 or -SK_ERR_BAD_REQUEST. */
int sk_kv_type_parse(const char *name, size_t len, uint32_t *ret, struct sk_error *err);
/* Bytes of one element: 4 (f32) or 2 (f16). */
static inline uint32_t sk_kv_type_size(uint32_t kv_type) { return kv_type == SK_KV_F16 ? 2u : 4u; }

/* "dense", "streaming", "window", "h2o", "sink_h2o"; NULL for unknown
 * values. */
const char *sk_policy_name(uint32_t policy);
/* Parses a policy name of len bytes. Returns 0 or -SK_ERR_BAD_REQUEST. */
int sk_policy_parse(const char *name, size_t len, uint32_t *ret,
                    struct sk_error *err);

/* Parameters of a cache. Fields a policy does not use are ignored (and
 * stored as 0 in the header). */
struct sk_kv_params {
  uint32_t policy;   /* enum sk_policy */
  uint32_t n_sink;   /* streaming, sink_h2o: attention sinks (may be 0) */
  uint32_t window;   /* streaming, window: recent tokens kept (>= 1) */
  uint32_t heavy;    /* h2o, sink_h2o: heavy hitters kept (>= 1) */
  uint32_t recent;   /* h2o, sink_h2o: newest tokens always kept (>= 1) */
  uint32_t capacity; /* dense: maximum tokens (>= 1) */
  uint32_t n_pin;    /* pinned prefix: streaming/sink_h2o need n_sink ==
                        n_pin; dense needs n_pin < capacity; 0 otherwise */
  float rope_scale;  /* positions are divided by this (1 = none; > 0) */
  float sparsity;    /* not the cache's: the session's MLP sparsity level
                        (sparse.h), 0 = dense; kept in the store's meta */
  /* Not the cache's either: what the session speculates with (spec.h),
   * kept in the store's meta: enum sk_spec_mode (0: the daemon's
   * default), the most tokens a step proposes (0: the default), and
   * whether that number is fixed rather than adaptive. */
  uint8_t spec_mode;
  uint8_t spec_tokens;
  bool spec_fixed;
};

/* What each policy is, from the one table in kvcache.c; every other
 * place asks these rather than naming policies. policy must be a known
 * value (sk_policy_name != NULL); unknown values give 0 / false.
 *   parts: the SK_PART_* bits of its cache (sinkd/protocol.h): which of
 *     n_sink, window, heavy + recent, capacity and a pin it keeps.
 *   rotated: keys are stored rotated by RoPE at their stream index
 *     (dense, streaming, window), else before RoPE (h2o, sink_h2o; see
 *     "Positions" above).
 *   scores: the cache evicts by accumulated attention score, which the
 *     forward pass must add up (h2o, sink_h2o).
 *   evict_chunk: most tokens one forward step may evict: 0 never evicts
 *     (dense: an append that does not fit is refused, context_full);
 *     SK_KV_SPARE_SLOTS for caches that evict their oldest window tokens
 *     and take a chunk of that many new ones per pass once full
 *     (streaming, window); 1 for caches whose each eviction depends on the
 *     scores of the step before (h2o, sink_h2o). */
unsigned sk_policy_parts_of(uint32_t policy);
bool sk_policy_rotated(uint32_t policy);
bool sk_policy_scores(uint32_t policy);
uint32_t sk_policy_evict_chunk(uint32_t policy);

struct sk_kv_header {
  uint32_t magic;          /* SK_KV_MAGIC */
  uint32_t layout_version; /* SK_KV_LAYOUT_VERSION */
  uint32_t n_layer;
  uint32_t kv_dim;
  uint32_t capacity;       /* C: most resident tokens */
  uint32_t n_slots;        /* S: physical slots, C + SK_KV_SPARE_SLOTS */
  uint32_t policy;
  uint32_t n_sink;         /* 0 unless streaming / sink_h2o */
  uint32_t window;         /* 0 unless streaming / window */
  uint32_t heavy;          /* 0 unless h2o / sink_h2o */
  uint32_t recent;         /* 0 unless h2o / sink_h2o */
  uint32_t n_pin;          /* pinned prefix (never evicted) */
  float rope_scale;
  uint32_t n_resident;     /* tokens in the cache, <= C */
  uint32_t kv_type;        /* enum sk_kv_type of k and v */
  uint64_t n_seen;         /* tokens appended over the session's life */
  uint64_t n_evicted;      /* tokens evicted over the session's life */
  uint64_t off_token;      /* byte offsets from the block start */
  uint64_t off_index;
  uint64_t off_order;
  uint64_t off_score;
  uint64_t off_k;          /* end of the meta part */
  uint64_t off_v;
  uint64_t size;           /* whole block */
};

/* A view of a block; the block itself is owned by whoever allocated it. */
struct sk_kv {
  struct sk_kv_header *hdr;
  int32_t *token;  /* (S) */
  uint64_t *index; /* (S) */
  uint32_t *order; /* (S) */
  float *score;    /* (S) */
  void *k;         /* (L, S, D) elements of kv_type */
  void *v;         /* (L, S, D) */
};

/* Evicted stream indices, merged into ranges of consecutive indices.
 * Keeps the first SK_EVICT_LOG_MAX_RANGES ranges; n_evicted counts all. */
#define SK_EVICT_LOG_MAX_RANGES SK_WIRE_MAX_RANGES
struct sk_evict_log {
  uint64_t n_evicted;
  uint32_t n_ranges;
  bool truncated; /* more ranges than kept */
  uint64_t first[SK_EVICT_LOG_MAX_RANGES];
  uint64_t last[SK_EVICT_LOG_MAX_RANGES]; /* inclusive */
};
void sk_evict_log_reset(struct sk_evict_log *log);
void sk_evict_log_add(struct sk_evict_log *log, uint64_t index);

/* Capacity (budget, tokens) the params ask for: capacity (dense),
 * n_sink + window (streaming), window (window), heavy + recent (h2o),
 * n_sink + heavy + recent (sink_h2o); UINT32_MAX if the sum overflows. */
uint32_t sk_kv_params_capacity(const struct sk_kv_params *p);
/* Checks params against each other (window >= 1, heavy >= 1, recent >= 1,
 * capacity >= 1, a pin that fits the sink region or the budget,
 * 0 < rope_scale <= SK_KV_MAX_ROPE_SCALE) and against max_capacity (the
 * daemon's memory limit, capped at SK_KV_MAX_CAPACITY). Returns 0 or
 * -SK_ERR_BAD_REQUEST naming the parameter, its value and the limit. */
int sk_kv_params_check(const struct sk_kv_params *p, uint32_t max_capacity,
                       struct sk_error *err);
/* The share of a session's budget C the window keeps at least when a
 * system prompt is pinned as its sinks (sk_kv_params_pin): a quarter. A
 * prompt that would leave less is refused, since the conversation would
 * then forget its turns almost as soon as they are said. */
#define SK_KV_PIN_MIN_WINDOW_SHARE 4u
/* The parameters of p's session with its first n_pin tokens (a system
 * prompt: BOS, the template's framing, the system text) pinned, within
 * the same budget C = sk_kv_params_capacity(p), into *ret:
 *   streaming  n_sink = n_pin, window = C - n_pin;
 *   sink_h2o   n_sink = n_pin, heavy and recent share C - n_pin in the
 *              proportion they had (each at least 1);
 *   dense      capacity C, n_pin pinned at its start.
 * Whatever n_sink was: the pin is the sink region. Errors:
 * -SK_ERR_BAD_REQUEST when the policy has no sink region (window, h2o),
 * or when the part left, C - n_pin, is less than C /
 * SK_KV_PIN_MIN_WINDOW_SHARE: the message names the prompt's tokens, the
 * tokens left and C, and `raise` (text naming the option that raises the
 * budget, may be NULL). */
int sk_kv_params_pin(const struct sk_kv_params *p, uint32_t n_pin, const char *raise,
                     struct sk_kv_params *ret, struct sk_error *err);
/* Pins the first n_pin tokens of kv's session, an empty cache (n_seen 0),
 * with the parameters sk_kv_params_pin gives: writes its header. Inside a
 * step of the session's object (store.h), so that the change is committed
 * with the step's tokens or not at all. Errors: those of
 * sk_kv_params_pin; -SK_ERR_BAD_REQUEST when tokens were seen already. */
int sk_kv_pin_prefix(struct sk_kv *kv, uint32_t n_pin, const char *raise, struct sk_error *err);
/* Checks that the cache never places a token at a position the model
 * cannot handle: capacity <= n_ctx_train * rope_scale (the trained context
 * stretched by position interpolation). Returns 0 or -SK_ERR_BAD_REQUEST
 * naming both numbers. */
int sk_kv_params_check_context(const struct sk_kv_params *p,
                               uint32_t n_ctx_train, struct sk_error *err);
/* Bytes of a block for this shape and capacity; 0 on overflow. */
size_t sk_kv_size(struct sk_kv_shape shape, uint32_t capacity);
/* Bytes of the meta part ([0, off_k): header and per-slot arrays) and of
 * the data part ([off_k, size): K and V) of such a block; both 64-byte
 * multiples. Returns false on overflow or an empty shape. */
bool sk_kv_part_sizes(struct sk_kv_shape shape, uint32_t capacity,
                      size_t *ret_meta, size_t *ret_data);

/* Formats mem[0..size) (size >= sk_kv_size, mem 64-byte aligned) as an
 * empty cache and fills *kv with a view of it. Errors: -SK_ERR_BAD_REQUEST
 * (bad params, size too small). */
int sk_kv_init(struct sk_kv *kv, void *mem, size_t size,
               struct sk_kv_shape shape, const struct sk_kv_params *p,
               struct sk_error *err);
/* Fills *kv with a view of an existing block after checking its header
 * (magic, version, offsets inside size, counters consistent).
 * Errors: -SK_ERR_BAD_REQUEST naming the bad field. */
int sk_kv_attach(struct sk_kv *kv, void *mem, size_t size,
                 struct sk_error *err);

/* The same two for a block whose meta part (meta_size bytes at meta) and
 * data part (data_size bytes at data) live apart; both 64-byte aligned,
 * each at least the size sk_kv_part_sizes gives. init formats the meta
 * part only (keys and values are written before they are ever read).
 * The view's k/v point into data, everything else into meta. */
int sk_kv_init_split(struct sk_kv *kv, void *meta, size_t meta_size,
                     void *data, size_t data_size, struct sk_kv_shape shape,
                     const struct sk_kv_params *p, struct sk_error *err);
int sk_kv_attach_split(struct sk_kv *kv, void *meta, size_t meta_size,
                       void *data, size_t data_size, struct sk_error *err);
/* Points the view's meta pointers (hdr and the per-slot arrays) at another
 * copy of the same meta part (a byte copy of the one kv shows, same
 * alignment); k/v are kept. No checks: the caller made the copy. */
void sk_kv_rebind_meta(struct sk_kv *kv, void *meta);

/* Convenience for malloc'd caches: allocates and formats; free with
 * sk_kv_free. */
int sk_kv_new(struct sk_kv_shape shape, const struct sk_kv_params *p,
              struct sk_kv **ret, struct sk_error *err);
void sk_kv_free(struct sk_kv *kv);

static inline uint32_t sk_kv_free_slots(const struct sk_kv *kv) {
  return kv->hdr->capacity - kv->hdr->n_resident;
}

/* Most tokens one make_room call can make room for: capacity - n_sink
 * (sinks never leave; for dense, window and h2o that is the capacity). */
uint32_t sk_kv_max_room(const struct sk_kv *kv);

/* Makes room for n more tokens by the policy, evicting e = n - free slots
 * tokens (none if they fit) and adding their stream indices to log (may
 * be NULL). Every eviction frees exactly one slot, which joins the tail of
 * the free list, so a call that succeeds always leaves room for n.
 *   streaming, window: the e oldest non-sink tokens (cache positions
 *     n_sink .. n_sink+e-1).
 *   h2o, sink_h2o: the newest max(recent - n, 0) resident tokens are
 *     protected (with the n new ones they make the `recent` newest), and
 *     sinks are protected; among the rest the e with the smallest score
 *     leave, ties to the older token. Later tokens move down.
 *   dense: evicts nothing.
 * Errors (nothing changed): -SK_ERR_CONTEXT_FULL (dense: "needs N, M of C
 * free"), -SK_ERR_BAD_REQUEST if n > sk_kv_max_room() and the n do not
 * fit in the free slots, -SK_ERR_NO_MEMORY
 * (h2o evicting more than one token at once sorts a temporary array). */
int sk_kv_make_room(struct sk_kv *kv, uint32_t n, struct sk_evict_log *log,
                    struct sk_error *err);

/* Speculative verification (Leviathan et al. 2023, "Fast Inference from
 * Transformers via Speculative Decoding", sec. 2): a step runs n tokens
 * as one chunk (the last token and n - 1 proposed ones) and keeps only
 * the first m the target model accepts, as if m one-token steps had run.
 * The chunk's room is made with sk_kv_make_room(kv, n, NULL, ...), which
 * evicted n_evicted tokens (streaming and window: the oldest window
 * tokens, oldest first at the tail of the free list; the other policies
 * take chunks that fit in the free slots, n_evicted 0), and the forward
 * pass wrote the n tokens' keys and values without committing them
 * (sk_seq.defer_commit). This keeps the evictions m tokens need (the
 * first max(0, m - free slots before the chunk) of the chunk's, FIFO),
 * puts the others back where they were (their slots were never written:
 * new rows go only to the head of the free list), adds their stream
 * indices to log (may be NULL), and commits tokens[0..m) as sk_kv_commit
 * does. The order array then equals what sk_kv_make_room(kv, m) and
 * sk_kv_commit(kv, tokens, m) would have made; the rejected rows' slots
 * stay free and nothing reads what was written into them. Requires
 * 1 <= m <= n, n_evicted 0 for policies that do not evict in chunks. */
void sk_kv_commit_prefix(struct sk_kv *kv, const int32_t *tokens, uint32_t n,
                         uint32_t n_evicted, uint32_t m, struct sk_evict_log *log);
/* Adds rows rows of per-slot attention-score contributions (each n_slots
 * floats, row r at row_scores + r * n_slots: sk_seq.row_scores of a pass,
 * one row per token in stream order) to the cache's accumulated scores
 * (h2o, sink_h2o): row by row, so that a chunk of tokens adds exactly
 * what as many one-token steps add, in the same float order. */
void sk_kv_add_scores(struct sk_kv *kv, const float *row_scores, uint32_t rows);

/* Bytes of the meta part (header and per-slot arrays; the keys and
 * values excluded), and a copy of it saved into buf / restored from buf
 * (meta_bytes each): a cache that drafts tokens and then drops them
 * (a draft model's cache, scheduler.c) restores what it was, provided
 * the drafting evicted at most SK_KV_SPARE_SLOTS tokens, so that no row
 * resident in the saved state was overwritten (the FIFO free list). */
size_t sk_kv_meta_bytes(const struct sk_kv *kv);
void sk_kv_meta_save(const struct sk_kv *kv, void *buf);
void sk_kv_meta_restore(struct sk_kv *kv, const void *buf);

/* Slot at cache position pos (pos < n_slots; positions >= n_resident
 * name the free slots that the next appends will fill, in order). */
/* The cache's counters: tokens resident now, seen and evicted in all, its
 * capacity and policy (enum sk_policy). */
static inline uint32_t sk_kv_resident(const struct sk_kv *kv) { return kv->hdr->n_resident; }
static inline uint64_t sk_kv_seen(const struct sk_kv *kv) { return kv->hdr->n_seen; }
static inline uint64_t sk_kv_evicted(const struct sk_kv *kv) { return kv->hdr->n_evicted; }
static inline uint32_t sk_kv_capacity(const struct sk_kv *kv) { return kv->hdr->capacity; }
static inline uint32_t sk_kv_policy(const struct sk_kv *kv) { return kv->hdr->policy; }

static inline uint32_t sk_kv_slot(const struct sk_kv *kv, uint32_t pos) {
  return kv->order[pos];
}
/* Bytes of one key or value row: D elements of kv_type. */
static inline size_t sk_kv_row_bytes(const struct sk_kv *kv) {
  return (size_t)kv->hdr->kv_dim * sk_kv_type_size(kv->hdr->kv_type);
}
/* Bytes of the keys and values the block holds: 2 x L x S x D x element
 * size (the wire's kv_bytes; the block's size adds the meta part). */
static inline uint64_t sk_kv_tensor_bytes(const struct sk_kv *kv) {
  return 2 * (uint64_t)kv->hdr->n_layer * kv->hdr->n_slots * sk_kv_row_bytes(kv);
}
/* Key / value row of (layer, slot), any kv_type: D elements. */
static inline void *sk_kv_krow(const struct sk_kv *kv, uint32_t layer, uint32_t slot) {
  return (char *)kv->k + ((size_t)layer * kv->hdr->n_slots + slot) * sk_kv_row_bytes(kv);
}
static inline void *sk_kv_vrow(const struct sk_kv *kv, uint32_t layer, uint32_t slot) {
  return (char *)kv->v + ((size_t)layer * kv->hdr->n_slots + slot) * sk_kv_row_bytes(kv);
}
/* The same as floats, for f32 caches only: D floats. */
static inline float *sk_kv_k(const struct sk_kv *kv, uint32_t layer,
                             uint32_t slot) {
  return (float *)sk_kv_krow(kv, layer, slot);
}
static inline float *sk_kv_v(const struct sk_kv *kv, uint32_t layer,
                             uint32_t slot) {
  return (float *)sk_kv_vrow(kv, layer, slot);
}

/* Stream index of the token at cache position pos (< n_resident). */
static inline uint64_t sk_kv_index_at(const struct sk_kv *kv, uint32_t pos) {
  return kv->index[kv->order[pos]];
}

/* sk_kv_commit, sk_kv_step_view, sk_kv_layer_k/v: kvstep.h. */

/* Drops every resident token (the session starts over); counters of
 * evictions are kept, n_seen is kept. */
void sk_kv_clear(struct sk_kv *kv);

#endif
