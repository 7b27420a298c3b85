/* Llama-architecture forward pass (Llama 1/2/3, TinyLlama, Mistral-style
 * GQA): token embedding, per layer RMSNorm -> Q/K/V projections -> RoPE ->
 * grouped-query attention over the KV cache -> output projection ->
 * residual, RMSNorm -> SwiGLU FFN -> residual; final RMSNorm and output
 * head. Weights are F32, F16, BF16 (converted to F32 on load), Q8_0 or
 * Q4_0; matrix products run on the kernels of kernels.h, on a pool of
 * threads (pool.h). One call can run several sequences (sessions) at
 * once, each weight matrix then read once for all of them.
 *
 * RoPE is llama.cpp's LLAMA_ROPE_TYPE_NORM: adjacent pairs (x[2i],
 * x[2i+1]) rotated by pos * base^(-2i/rope_dim) (Su et al. 2021, RoFormer
 * eq. 34). Positions are cache positions (StreamingLLM, Xiao et al. 2023
 * sec. 3.2). Dense, streaming and window caches store keys rotated at
 * their stream index and rotate each query once per run of positions
 * (kvcache.h); h2o caches store keys unrotated and rotate them at
 * attention time by their current position in the cache.
 */
#ifndef SK_MODEL_H
#define SK_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "kvcache.h"
#include "pool.h"
#include "sinkd/protocol.h"

struct sk_model_config {
  uint32_t n_vocab;     /* rows of token_embd */
  uint32_t dim;         /* llama.embedding_length */
  uint32_t hidden_dim;  /* llama.feed_forward_length */
  uint32_t n_layer;     /* llama.block_count */
  uint32_t n_head;      /* llama.attention.head_count */
  uint32_t n_kv_head;   /* llama.attention.head_count_kv (GQA), default n_head */
  uint32_t head_dim;    /* dim / n_head */
  uint32_t kv_dim;      /* n_kv_head * head_dim */
  uint32_t rope_dim;    /* llama.rope.dimension_count, default head_dim */
  uint32_t n_ctx_train; /* llama.context_length */
  float rope_base;      /* llama.rope.freq_base, default 10000 */
  float rope_scale;     /* 1 / llama.rope.scaling.factor for type linear; 1 */
  float rms_eps;        /* llama.attention.layer_norm_rms_epsilon */
  char name[64];        /* general.name, truncated */
};

struct sk_model;

/* Builds the model from g: reads and checks the hyper-parameters and every
 * tensor's name, type and shape. Matrices in F32, F16, Q8_0 and Q4_0 are
 * used in place (g must outlive the model), or repacked into copies the
 * model owns when the selected kernels want their own layout
 * (sk_kernels_pack: select the kernels first); BF16 matrices and F16/BF16
 * vectors are converted to F32 copies. Other types are refused with
 * -SK_ERR_BAD_MODEL naming tensor and type. Errors: -SK_ERR_BAD_MODEL,
 * -SK_ERR_NO_MEMORY. */
int sk_model_load(const struct sk_gguf *g, struct sk_model **ret,
                  struct sk_error *err);
void sk_model_free(struct sk_model *m);
const struct sk_model_config *sk_model_config(const struct sk_model *m);
/* The KV cache shape this model needs. */
struct sk_kv_shape sk_model_kv_shape(const struct sk_model *m);
/* ggml type name of the layer matrices ("f32", "q8_0", ...). Static. */
const char *sk_model_weight_type(const struct sk_model *m);
/* Bytes of the matrices one forward pass reads (layers and output head;
 * the embedding table is only looked up). */
uint64_t sk_model_weight_bytes(const struct sk_model *m);

/* Activations for one forward call: sized for batches of up to max_batch
 * tokens (all sequences together) over caches of up to max_ctx tokens.
 * One per calling thread. sk_scratch_new runs everything on the caller's
 * thread; sk_scratch_new_pool on the threads of pool (not owned; it must
 * outlive the scratch, and the caller must be the only user of the pool).
 * Errors: -SK_ERR_BAD_REQUEST (sizes outside 1..SK_KV_MAX_CAPACITY),
 * -SK_ERR_NO_MEMORY. */
struct sk_scratch;
int sk_scratch_new(const struct sk_model *m, uint32_t max_batch,
                   uint32_t max_ctx, struct sk_scratch **ret,
                   struct sk_error *err);
int sk_scratch_new_pool(const struct sk_model *m, uint32_t max_batch, uint32_t max_ctx,
                        struct sk_pool *pool, struct sk_scratch **ret, struct sk_error *err);
void sk_scratch_free(struct sk_scratch *s);

/* One sequence of a batched forward call: n tokens appended to the cache
 * kv, as sk_model_forward does for one. */
struct sk_seq {
  struct sk_kv *kv;      /* at most one sequence per cache in a batch */
  const int32_t *tokens; /* (n) */
  uint32_t n;
  /* Streaming and window caches only: how many tokens the
   * sk_kv_make_room(kv, n) just before this call evicted (0 otherwise). Their keys stay readable
   * until the pass ends, so the chunk computes exactly what n calls of
   * one token, each after make_room(1), would: token i still sees the
   * evicted tokens that one-by-one processing would not yet have dropped. */
  uint32_t n_evicted;
  float *logits;         /* NULL, (n_vocab) for the last token, or
                            (n, n_vocab) with all_logits */
  bool all_logits;
};

/* Runs seqs[0..n_seqs) in one pass: their rows are stacked for the matrix
 * products; each sequence attends only to its own cache. Each sequence is
 * checked as sk_model_forward checks its input, the sum of their n must
 * be <= max_batch, and every check happens before any cache is touched:
 * on error nothing is committed anywhere (messages name the sequence
 * index when n_seqs > 1). A sequence's results are bit-identical whatever
 * else is in the batch and whatever the pool's size. Errors as
 * sk_model_forward. */
int sk_model_forward_batch(const struct sk_model *m, struct sk_scratch *s,
                           const struct sk_seq *seqs, uint32_t n_seqs, struct sk_error *err);

/* Cache positions counted as "sinks" by the attention diagnostics when
 * the policy has no sink region (dense, window, h2o): the first four, the
 * number StreamingLLM found sufficient (Xiao et al. 2023, sec. 4.2). */
#define SK_ATTN_PROBE_DEFAULT 4u

/* Runs tokens[0..n) through the model at cache positions
 * kv->n_resident .. n_resident+n-1, writes their K/V into the cache and
 * commits them (sk_kv_commit). For the h2o policies it also resets the
 * new slots' scores and adds every attention probability to the score of
 * the position it fell on (rule in kvcache.h; Zhang et al. 2023 sec. 4).
 * It records the attention diagnostics of the last token (see
 * sk_scratch_attn). The cache must already have room for n
 * (sk_kv_make_room); n <= max_batch; n_resident+n <= max_ctx.
 * logits: if all_logits, (n, n_vocab) row-major, else (n_vocab) for the
 * last token; may be NULL when no logits are wanted.
 * Errors (nothing committed): -SK_ERR_BAD_REQUEST (token id outside the
 * vocabulary, n == 0, n too large), -SK_ERR_CONTEXT_FULL (no room). */
int sk_model_forward(const struct sk_model *m, struct sk_scratch *s,
                     struct sk_kv *kv, const int32_t *tokens, uint32_t n,
                     float *logits, bool all_logits, struct sk_error *err);

/* Attention diagnostics of the last token of sequence seq of the last
 * successful forward call on s (sk_model_forward: seq 0), per layer,
 * averaged over the query heads: sink_mass[l] = probability that fell on
 * the first *ret_probe cache positions (the cache's n_sink, or
 * SK_ATTN_PROBE_DEFAULT without sinks; fewer if fewer were resident),
 * entropy[l] = -sum p log p in nats. The arrays hold n_layer floats and
 * stay valid until the next forward on s. Returns false (nothing
 * written) before the first forward or for a seq beyond its batch. */
bool sk_scratch_attn(const struct sk_scratch *s, uint32_t seq, const float **ret_sink_mass,
                     const float **ret_entropy, uint32_t *ret_probe);

#endif
