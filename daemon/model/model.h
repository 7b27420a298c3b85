/* Forward pass of the Llama family of decoder-only transformers, for the
 * architectures of SK_MODEL_ARCHS: token embedding, per layer RMSNorm ->
 * Q/K/V projections (+ biases) -> (per-head RMSNorm of Q and K) -> RoPE
 * -> grouped-query attention over the KV cache -> output projection ->
 * residual, RMSNorm -> SwiGLU FFN -> residual; final RMSNorm and output
 * head (token_embd when the file has no output.weight: tied embeddings).
 * What differs between architectures is data, one table in model.c
 * (which tensors exist, RoPE style), not another pass. Weights are F32,
 * F16, BF16 (converted to F32 on load), Q8_0 or Q4_0; matrix products run
 * on the kernels of kernels.h, on a pool of threads (pool.h). One call
 * can run several sequences (sessions) at once, each weight matrix then
 * read once for all of them.
 *
 * RoPE (Su et al. 2021, RoFormer eq. 34), as llama.cpp applies it: pair i
 * (i < rope_dim / 2) of each head is rotated by pos * base^(-2i/rope_dim)
 * / freq_factor[i] (rope_freqs.weight, Llama 3.1; 1 without). The pair is
 * (x[2i], x[2i+1]) for llama (LLAMA_ROPE_TYPE_NORM) and (x[i], x[i +
 * rope_dim/2]) for qwen2/qwen3 (LLAMA_ROPE_TYPE_NEOX). A NEOX model's
 * queries and keys are reordered after their projection (and bias and
 * norm) so that pair i sits at (2i, 2i+1): the same rotation, by the same
 * float operations, then done by the NORM code, and attention scores are
 * dot products, unchanged by reordering both sides alike. So the KV cache
 * of a NEOX model holds each key head's rotary part in that order
 * (x[0], x[h], x[1], x[h+1], ..., h = rope_dim / 2; the rest after it),
 * and everything below that works on keys (policies, re-rotation,
 * persistence) is the same for every architecture.
 *
 * Positions are cache positions (StreamingLLM, Xiao et al. 2023 sec.
 * 3.2). Dense, streaming and window caches store keys rotated at their
 * stream index and rotate each query once per run of positions
 * (kvstep.h, kvcache.h); h2o caches store keys unrotated and rotate them at
 * attention time by their current position in the cache.
 */
#ifndef SK_MODEL_H
#define SK_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/kvstep.h"
#include "model/pool.h"
#include "sinkd/protocol.h"

/* The architectures sinkd runs, as general.architecture names them. */
#define SK_MODEL_ARCHS "llama, qwen2, qwen3"

/* How the two members of a RoPE pair sit in a head (see above). */
enum sk_rope_style {
  SK_ROPE_NORM = 0, /* adjacent pairs (llama) */
  SK_ROPE_NEOX = 1, /* the two halves of the rotary part (qwen2, qwen3) */
};

/* Hyper-parameters; ARCH below is general.architecture ("llama.", ...). */
struct sk_model_config {
  char arch[16];        /* general.architecture: one of SK_MODEL_ARCHS */
  uint32_t n_vocab;     /* rows of token_embd */
  uint32_t dim;         /* ARCH.embedding_length */
  uint32_t hidden_dim;  /* ARCH.feed_forward_length */
  uint32_t n_layer;     /* ARCH.block_count */
  uint32_t n_head;      /* ARCH.attention.head_count */
  uint32_t n_kv_head;   /* ARCH.attention.head_count_kv (GQA), default n_head */
  uint32_t head_dim;    /* ARCH.attention.key_length (= value_length),
                           default dim / n_head */
  uint32_t q_dim;       /* n_head * head_dim: rows of attn_q, columns of
                           attn_output (dim, except e.g. Qwen3-0.6B) */
  uint32_t kv_dim;      /* n_kv_head * head_dim */
  uint32_t rope_dim;    /* ARCH.rope.dimension_count, default head_dim */
  uint32_t n_ctx_train; /* ARCH.context_length */
  float rope_base;      /* ARCH.rope.freq_base, default 10000 */
  float rope_scale;     /* 1 / ARCH.rope.scaling.factor for type linear; 1 */
  float rms_eps;        /* ARCH.attention.layer_norm_rms_epsilon */
  enum sk_rope_style rope_style;
  bool qkv_bias;        /* blk.N.attn_{q,k,v}.bias are added (qwen2) */
  bool qk_norm;         /* blk.N.attn_{q,k}_norm.weight: per-head RMSNorm
                           of queries and keys before RoPE (qwen3) */
  bool rope_freqs;      /* rope_freqs.weight divides the pair frequencies */
  bool tied_output;     /* no output.weight: token_embd is the output head */
  char name[64];        /* general.name, truncated */
};

struct sk_model;

/* Builds the model from g: reads and checks the hyper-parameters and every
 * tensor's name, type and shape. An architecture outside SK_MODEL_ARCHS
 * is refused naming it and the list; so is a tensor of another
 * architecture (q/k norms in a qwen2 file, rope_freqs.weight in a qwen
 * one), as llama.cpp refuses such files. Matrices of every type sinkd runs
 * (quant.h, sk_quant_supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, in any mix) are
 * used in place (g must outlive the model), or repacked into copies the
 * model owns when the selected kernels want their own layout
 * (sk_kernels_pack: select the kernels first); F16/BF16 vectors are
 * converted to F32 copies. Other types are refused with
 * -SK_ERR_BAD_MODEL naming the tensor, the type by its ggml name and the
 * types sinkd runs. Errors: -SK_ERR_BAD_MODEL, -SK_ERR_NO_MEMORY. */
int sk_model_load(const struct sk_gguf *g, struct sk_model **ret,
                  struct sk_error *err);

/* How sk_model_load_opts builds the model. Zero-initialised = the
 * defaults of sk_model_load. */
struct sk_model_load_options {
  /* Dequantize every matrix (and the embedding table) to an owned F32
   * copy with sinkd's own block decoders (sk_dequantize_row) and run
   * the F32 kernels on it: the exact float math on exactly the file's
   * weights, with no activation rounding. Tests use it to check every
   * block format against llama.cpp running an F32 twin of the file. The
   * copies take 4 bytes per weight. */
  bool dequantize;
  /* Check every tensor as a load does (names, types, shapes, sizes) but
   * copy, convert and pack nothing: the model can be described
   * (sk_model_config, sk_model_weight_type, the byte counts) and not
   * run. What --check-config reads of a model, in a fraction of a
   * load's time and memory. */
  bool inspect;
  /* Called after each layer's tensors (done of total layers), so that a
   * long load of a large model can say how far it is; NULL: none. */
  void (*progress)(void *user, uint32_t done, uint32_t total);
  void *progress_user;
};

/* sk_model_load with options (NULL: the defaults). */
int sk_model_load_opts(const struct sk_gguf *g, const struct sk_model_load_options *opts,
                       struct sk_model **ret, struct sk_error *err);
void sk_model_free(struct sk_model *m);
const struct sk_model_config *sk_model_config(const struct sk_model *m);
/* The KV cache shape this model needs. */
struct sk_kv_shape sk_model_kv_shape(const struct sk_model *m);
/* ggml type name of the layer matrices ("f32", "q8_0", ...). Static. */
const char *sk_model_weight_type(const struct sk_model *m);
/* How this sinkd runs the model, as one line of text: the architecture
 * and every choice that decides what the KV cache holds (RoPE style and
 * key order, biases, q/k norms, frequency factors, tied output), e.g.
 * "qwen3 rope=neox keys=pairs-interleaved qk_norm". Written into buf
 * (NUL-terminated, truncated to n); returns buf. Sessions are adopted
 * only by a daemon whose model fingerprint, which mixes this line in,
 * is the same (store.h). */
const char *sk_model_describe(const struct sk_model *m, char *buf, size_t n);
/* Bytes of the matrices one forward pass reads (layers and output head;
 * the embedding table is only looked up). */
uint64_t sk_model_weight_bytes(const struct sk_model *m);
/* Bytes of the weight matrices (embedding table included) read in place
 * from the GGUF mapping, and of those the model holds in its own copies
 * (repacked for the kernels, or dequantized with
 * sk_model_load_options.dequantize). Each matrix counts once. */
uint64_t sk_model_mapped_bytes(const struct sk_model *m);
uint64_t sk_model_repacked_bytes(const struct sk_model *m);

/* Makes the weights the sparse MLP reads (sparse.h): each layer's down
 * projection read neuron by neuron (and Q8_0 up rows in the sparse
 * kernels' layout), copies the model owns (sk_model_sparse_bytes).
 * Call once, before making the scratches that run sparse sequences; a
 * second call does nothing. Errors: -SK_ERR_NO_MEMORY, -SK_ERR_BAD_MODEL. */
int sk_model_sparse_prepare(struct sk_model *m, struct sk_error *err);
/* Bytes of the copies sk_model_sparse_prepare made (0 before). */
uint64_t sk_model_sparse_bytes(const struct sk_model *m);
/* Bytes of weights one token reads when layer l keeps kept[l] neurons
 * (n_layer values; means over tokens are fine): sk_model_weight_bytes
 * with each layer's up and down replaced by what the sparse MLP reads
 * (sk_sparse_step_bytes). sk_model_weight_bytes before sparse_prepare. */
double sk_model_sparse_step_bytes(const struct sk_model *m, const double *kept);

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
  /* Contextual sparsity of the MLP (sparse.h): NULL = dense, else the
   * per-layer thresholds (n_layer floats, not owned) the tokens of this
   * sequence use, one token at a time, when it is one token (decode) or
   * asks for all_logits (scoring); a prefill of more than one token
   * without all_logits runs dense. Needs sk_model_sparse_prepare before
   * the scratch was made. */
  const float *sparse_thr;
  /* Speculative verification (kvcache.h, sk_kv_commit_prefix): the pass
   * writes the n tokens' keys and values into the cache's free slots but
   * commits none of them; the caller commits the prefix it keeps. */
  bool defer_commit;
  /* Caches that accumulate attention scores (h2o, sink_h2o) only: NULL
   * adds every probability to the cache's scores as the pass goes;
   * else (n, n_slots) floats that receive each row's contributions
   * apart (row r at row_scores + r * n_slots, zeroed by the pass; the
   * probability a row's query heads give a slot, summed over layers and
   * heads in the pass's order), the cache's scores left as they were but
   * for the new slots' reset, for the caller to add the rows it keeps
   * (sk_kv_add_scores): a chunk then adds exactly what one-token steps
   * add. */
  float *row_scores;
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

/* Sparse MLP counts of sequence seq of the last successful forward call
 * on s: *ret_kept = n_layer sums, over the sequence's tokens, of the
 * neurons kept; *ret_rows = its tokens that ran sparse (0: dense). Valid
 * until the next forward on s. False for a seq beyond the batch. */
bool sk_scratch_sparse(const struct sk_scratch *s, uint32_t seq, const uint64_t **ret_kept,
                       uint32_t *ret_rows);

/* A probe of the gate projection (calibration, sparse.h): called in
 * every layer of every forward call with the n rows of gate values
 * (row r at gate + r * hidden; batch rows, dense sequences first) before
 * the activation. Runs on the calling thread. */
typedef void (*sk_scratch_gate_fn)(void *user, uint32_t layer, const float *gate, uint32_t n,
                                   uint32_t hidden);
/* Sets (fn NULL: clears) the probe of s. */
void sk_scratch_set_gate_probe(struct sk_scratch *s, sk_scratch_gate_fn fn, void *user);

#endif
