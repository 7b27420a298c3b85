/* Llama-architecture forward pass (Llama 1/2/3, TinyLlama, Mistral-style
 * GQA): token embedding, per layer RMSNorm -> Q/K/V projections -> RoPE ->
 * grouped-query attention over the KV cache -> output projection ->
 * residual, RMSNorm -> SwiGLU FFN -> residual; final RMSNorm and output
 * head. Matrix products go through OpenBLAS (sgemm for a batch of tokens,
 * sgemv for one).
 *
 * RoPE is llama.cpp's LLAMA_ROPE_TYPE_NORM: adjacent pairs (x[2i],
 * x[2i+1]) rotated by pos * base^(-2i/rope_dim) (Su et al. 2021, RoFormer
 * eq. 34). Positions are cache positions (StreamingLLM, Xiao et al. 2023
 * sec. 3.2): keys are stored unrotated and rotated at attention time by
 * their current position in the cache.
 */
#ifndef SK_MODEL_H
#define SK_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf.h"
#include "kvcache.h"
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
 * tensor's name, type and shape. F32 tensors are used in place (g must
 * outlive the model); F16 ones are converted to F32 copies owned by the
 * model. Quantized types are refused with -SK_ERR_BAD_MODEL naming tensor
 * and type. Errors: -SK_ERR_BAD_MODEL, -SK_ERR_NO_MEMORY. */
int sk_model_load(const struct sk_gguf *g, struct sk_model **ret,
                  struct sk_error *err);
void sk_model_free(struct sk_model *m);
const struct sk_model_config *sk_model_config(const struct sk_model *m);
/* The KV cache shape this model needs. */
struct sk_kv_shape sk_model_kv_shape(const struct sk_model *m);

/* Activations for one forward call: sized for batches of up to max_batch
 * tokens over caches of up to max_ctx tokens. One per compute thread. */
struct sk_scratch;
int sk_scratch_new(const struct sk_model *m, uint32_t max_batch,
                   uint32_t max_ctx, struct sk_scratch **ret,
                   struct sk_error *err);
void sk_scratch_free(struct sk_scratch *s);

/* Cache positions counted as "sinks" by the attention diagnostics when
 * the policy has no sink region (dense, window, h2o): the first four, the
 * number StreamingLLM found sufficient (Xiao et al. 2023, sec. 4.2). */
#define SK_ATTN_PROBE_DEFAULT 4u

/* Runs tokens[0..n) through the model at cache positions
 * kv->n_resident .. n_resident+n-1, writes their K/V into the cache and
 * commits them (sk_kv_commit). For the h2o policies it also resets the
 * new slots' scores and adds every attention probability to the score of
 * the position it fell on (rule in kvcache.h; Zhang et al. 2023 sec. 4).
 * It records the attention diagnostics of the batch's last token (see
 * sk_scratch_attn). The cache must already have room for n
 * (sk_kv_make_room); n <= max_batch; n_resident+n <= max_ctx.
 * logits: if all_logits, (n, n_vocab) row-major, else (n_vocab) for the
 * last token; may be NULL when no logits are wanted.
 * Errors (nothing committed): -SK_ERR_BAD_REQUEST (token id outside the
 * vocabulary, n == 0, n too large), -SK_ERR_CONTEXT_FULL (no room). */
int sk_model_forward(const struct sk_model *m, struct sk_scratch *s,
                     struct sk_kv *kv, const int32_t *tokens, uint32_t n,
                     float *logits, bool all_logits, struct sk_error *err);

/* Attention diagnostics of the last token of the last successful
 * sk_model_forward on s, per layer, averaged over the query heads:
 * sink_mass[l] = probability that fell on the first *ret_probe cache
 * positions (the cache's n_sink, or SK_ATTN_PROBE_DEFAULT without sinks;
 * fewer if fewer were resident), entropy[l] = -sum p log p in nats. The
 * arrays hold n_layer floats and stay valid until the next forward on s.
 * Returns false (nothing written) before the first forward. */
bool sk_scratch_attn(const struct sk_scratch *s, const float **ret_sink_mass,
                     const float **ret_entropy, uint32_t *ret_probe);

#endif
