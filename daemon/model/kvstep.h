/* The KV cache as the forward pass sees it: what forward.c and
 * attention.c need of a session's cache, declared here and implemented
 * by the cache module (daemon/session/kvcache.c, whose kvcache.h
 * includes this header). The model reads a cache only through these
 * functions; the block's layout, its header and the policies stay the
 * cache module's.
 *
 * Terms (kvcache.h has the whole story): a cache of capacity C has
 * S = C + SK_KV_SPARE_SLOTS slots; a slot holds one token's key and value
 * rows in every layer; the token at cache position p (0-based, in stream
 * order among resident tokens) sits in slot order[p], and
 * order[n_resident..S) is the free list, the next slots to fill first and
 * the slots an eviction freed at its tail, oldest first. */
#ifndef SK_KVSTEP_H
#define SK_KVSTEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest capacity a session may ask for: positions and slots are 32-bit,
 * and one session's cache must stay far below a machine's memory. The
 * daemon's memory limit is the tighter bound in practice. */
#define SK_KV_MAX_CAPACITY (1u << 20)

/* Element type of the cached keys and values. */
enum sk_kv_type {
  SK_KV_F32 = 0,
  SK_KV_F16 = 1, /* IEEE binary16 */
};

/* Shape of the cached tensors: from the model (sk_model_kv_shape), and the
 * element type the daemon stores (sinkd.conf kv_type). */
struct sk_kv_shape {
  uint32_t n_layer;
  uint32_t kv_dim;  /* n_kv_head * head_dim */
  uint32_t kv_type; /* enum sk_kv_type (0: f32) */
};

/* A session's cache (kvcache.h); the model holds only pointers to it. */
struct sk_kv;

/* One cache as a forward step reads it: taken once per sequence and step
 * (sk_kv_step_view), valid until the cache changes (make_room, commit). */
struct sk_kv_step {
  uint32_t n_layer, kv_dim;
  bool f16;              /* elements are IEEE binary16, else float */
  size_t row_bytes;      /* one key or value row: kv_dim elements */
  uint32_t capacity;     /* C: most resident tokens */
  uint32_t n_slots;      /* S */
  uint32_t n_resident;   /* tokens in the cache now */
  uint64_t n_seen;       /* stream index of the next token */
  uint64_t first_index;  /* stream index of position 0 (n_seen if empty) */
  uint32_t n_sink;       /* attention sinks: positions 0..n_sink-1 never
                            leave (0 for policies without sinks) */
  float rope_scale;      /* the session's position divisor */
  /* Keys are stored rotated by RoPE at their stream index (else before
   * RoPE, rotated at their cache position at every step). */
  bool rotated;
  /* The cache evicts by attention score: the pass adds every probability
   * to the score of the slot it fell on (rule in kvcache.h) and new
   * tokens' slots start at 0. score is NULL when false. */
  bool scores;
  /* make_room may evict a whole chunk ahead of the pass (sk_seq.n_evicted
   * may be > 0): the evicted slots, oldest first, are the last n_evicted
   * of the free list, their rows still readable until the pass ends. */
  bool chunk_evicts;
  const uint32_t *order; /* (S) slot of each position, then the free list */
  float *score;          /* (S) accumulated attention score per slot */
};

/* Fills *ret from kv. */
void sk_kv_step_view(const struct sk_kv *kv, struct sk_kv_step *ret);
/* Key / value rows of layer (< n_layer): slot s's row is row_bytes bytes
 * at the returned address + s * row_bytes. Owned by the cache. */
void *sk_kv_layer_k(const struct sk_kv *kv, uint32_t layer);
void *sk_kv_layer_v(const struct sk_kv *kv, uint32_t layer);

/* Records tokens[0..n) in slots order[n_resident..n_resident+n) (whose K/V
 * the forward pass has written, and whose score it has reset and
 * accumulated), with stream indices n_seen.., and makes them resident.
 * Requires n <= capacity - n_resident. */
void sk_kv_commit(struct sk_kv *kv, const int32_t *tokens, uint32_t n);

#endif
