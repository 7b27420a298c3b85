/* What the files of the model module share (model.c loads the model,
 * scratch.c makes the buffers of a forward call, rope.c computes RoPE's
 * angles, forward.c runs the pass, attention.c its attention over the
 * KV cache). Not for other modules: they use model.h. */
#ifndef SK_MODEL_INT_H
#define SK_MODEL_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "model/kernels.h"
#include "model/model.h"
#include "model/sparse.h"

/* ---- the model (model.c writes it at load, the rest read it) ------- */

/* One layer's weights. */
struct sk__layer {
  const float *attn_norm; /* (dim) */
  struct sk_wmat wq;      /* (q_dim, dim)      rows = outputs */
  struct sk_wmat wk;      /* (kv_dim, dim) */
  struct sk_wmat wv;      /* (kv_dim, dim) */
  const float *bq;        /* (q_dim) bias added to the queries, or NULL */
  const float *bk;        /* (kv_dim), or NULL */
  const float *bv;        /* (kv_dim), or NULL */
  const float *q_norm;    /* (head_dim) per-head RMSNorm weight, or NULL */
  const float *k_norm;    /* (head_dim), or NULL */
  struct sk_wmat wo;      /* (dim, q_dim) */
  const float *ffn_norm;  /* (dim) */
  struct sk_wmat w_gate;  /* (hidden_dim, dim) */
  struct sk_wmat w_up;    /* (hidden_dim, dim) */
  struct sk_wmat w_down;  /* (dim, hidden_dim) */
};

/* The loaded model (model.h). */
struct sk_model {
  struct sk_model_config cfg;
  struct sk_wmat tok_embd;  /* (n_vocab, dim); rows read one at a time */
  const float *out_norm;    /* (dim) */
  struct sk_wmat output;    /* (n_vocab, dim); tok_embd's data when tied */
  const float *rope_freqs;  /* (rope_dim / 2) divisors, or NULL (Llama 3.1) */
  struct sk__layer *layers; /* (n_layer) */
  void **owned;             /* converted or packed tensors, freed with us */
  size_t n_owned;
  size_t cap_owned;
  uint64_t weight_bytes;    /* bytes of weights a decode step reads */
  uint64_t mapped_bytes;    /* matrices read in place from the mapping */
  uint64_t repacked_bytes;  /* matrices the model holds in its own copies
                               (packed for the kernels, or dequantized) */
  bool dequantize;          /* sk_model_load_options.dequantize */
  bool inspect;             /* sk_model_load_options.inspect: nothing
                               copied, the model cannot run */
  struct sk_sparse_mlp *sparse; /* (n_layer) sparse MLP weights, or NULL
                                   (sk_model_sparse_prepare) */
  uint64_t sparse_bytes;    /* bytes of the copies made for them */
};

/* ---- the scratch (scratch.c makes it; forward.c and attention.c
 * write its buffers during a pass) ---------------------------------- */

/* One sequence of a batch, as the forward pass sees it. */
struct sk__seq {
  const struct sk_seq *in;
  uint32_t row0;     /* first row of the batch */
  uint32_t nr;       /* resident tokens after make_room */
  uint32_t n_sink;   /* S: positions that never move (the sinks of a
                        cache with rotated keys; 0 otherwise) */
  float freq_scale;  /* RoPE position scale of this cache */
  uint32_t probe;    /* positions counted as sinks by the diagnostics */
  bool rotated;      /* keys stored rotated at their stream index (every
                        policy but h2o / sink_h2o, see kvcache.h) */
  bool f16;          /* the cache stores halves (kv_type f16) */
  struct sk_kv_step kv; /* the cache, as taken before the pass (kvstep.h) */
};

/* Attention buffers of one pool thread. */
struct sk__tscratch {
  float *kr;        /* (T, head_dim) keys of one KV head, rotated (h2o) */
  const float **kq; /* (T) kq[p] = kr + p * head_dim */
  float *qw;        /* (att_heads, head_dim) queries rotated for the
                       window's keys */
  float *qs;        /* (att_heads, head_dim) the same for the sinks' keys */
  float *att;       /* (att_heads, T) scores, then probabilities */
  const void **kp;  /* (T) key row of each position, at the head
                       (sk__att_task) or whole (sk__att_rot_task): floats,
                       or halves for an f16 cache */
  const void **vp;  /* (T) value row of each position, the same */
  uint32_t *sp;     /* (T) cache slot of each position (H2O scores) */
  float *cs;        /* (rope_dim) angles computed off the tables */
  float *sn;        /* (rope_dim) */
};

/* The buffers of one forward call (model.h), shapes with B = max_batch,
 * T = max_ctx. */
struct sk_scratch {
  const struct sk_model *m;
  struct sk_pool *pool;   /* not owned; NULL = the caller's thread only */
  uint32_t n_threads;
  uint32_t max_batch;     /* B: rows of one forward call */
  uint32_t max_ctx;       /* T */
  uint32_t att_heads;     /* query heads whose scores a thread holds at
                             once: n_head, or fewer for long contexts (a
                             multiple of n_head / n_kv_head) */
  float *x;               /* (B, dim) residual stream */
  float *xb;              /* (B, dim) normed input of a block */
  float *xb2;             /* (B, dim) output of a projection */
  float *q;               /* (B, q_dim) queries */
  float *k;               /* (B, kv_dim) new keys (rotated for caches that
                             store them so, see attention) */
  float *v;               /* (B, kv_dim) new values */
  uint16_t *k16;          /* (B, kv_dim) the new keys of f16 caches as stored */
  uint16_t *v16;          /* (B, kv_dim) */
  float *att_out;         /* (B, q_dim) attention output, heads side by side */
  float *head_tmp;        /* (head_dim) one head being reordered (NEOX) */
  float *hb;              /* (B, hidden_dim) gate, then silu(gate) * up */
  float *hb2;             /* (B, hidden_dim) up */
  int8_t *aq;             /* (B, max(dim, q_dim, hidden_dim)) quantized input */
  float *ad;              /* (B, max(dim, q_dim, hidden_dim) / 32) its scales */
  int32_t *as;            /* (B, max(dim, q_dim, hidden_dim) / 32) its block sums */
  int8_t *aqk;            /* (B, max(dim, q_dim, hidden_dim)) the same input as
                             Q8_K (K-quant weights) */
  float *adk;             /* (B, max(dim, q_dim, hidden_dim) / 256) its scales */
  int16_t *ask;           /* (B, max(dim, q_dim, hidden_dim) / 16) its sums of 16 */
  float **rows;           /* (3, B) row pointers handed to the kernels */
  struct sk__seq *seqs;   /* (B) */
  float *rope_cos;        /* (T, rope_dim) for rope_freq_scale: each pair's
                             cos twice */
  float *rope_sin;        /* (T, rope_dim): -sin, +sin per pair */
  uint32_t rope_valid;    /* rows of the rope tables computed */
  float rope_freq_scale;  /* the scale they were computed for */
  float *row_cos;         /* (B, rope_dim) angles of each row's stream index
                             (caches with rotated keys) */
  float *row_sin;         /* (B, rope_dim) */
  float *sink_cos;        /* (B, rope_dim) angles at which each row's query
                             meets the sinks (streaming) */
  float *sink_sin;        /* (B, rope_dim) */
  struct sk__tscratch *ts; /* (n_threads) */
  uint32_t *task_seq;     /* (B * n_kv_head) attention task -> sequence */
  uint32_t *task_kvh;     /* (B * n_kv_head) attention task -> first KV head */
  double *mass_part;      /* (B, n_kv_head) one layer's sink mass, summed
                             over a KV head's query heads */
  double *ent_part;       /* (B, n_kv_head) the same for entropy */
  float *sink_mass;       /* (B, n_layer) last call, last token of each
                             sequence, averaged over query heads */
  float *entropy;         /* (B, n_layer) the same, nats */
  uint32_t *probe;        /* (B) positions counted as sinks */
  uint32_t attn_n_seqs;   /* sequences of the last successful call */
  struct sk_sparse_work sp; /* sparse MLP buffers (after sparse_prepare) */
  uint64_t *sp_kept;      /* (B, n_layer) kept neurons of the last call,
                             summed over each sequence's sparse rows */
  uint32_t *sp_rows;      /* (B) rows of each sequence that ran sparse */
  sk_scratch_gate_fn gate_fn; /* calibration probe, or NULL */
  void *gate_user;
};

/* ---- RoPE (rope.c) --------------------------------------------------- */

/* cos/sin of position p (and of stream index t, for keys stored
 * rotated) for freq_scale into cs, sn (rope_dim floats each, the layout
 * of sk_kernels_rope); rope.c says how they are computed. */
void sk__rope_angles(const struct sk_model *m, uint32_t p, float freq_scale, float *cs,
                     float *sn);
void sk__rope_angles_at(const struct sk_model *m, uint64_t t, float freq_scale, float *cs,
                        float *sn);
/* Extends s's cos/sin tables to positions < n for freq_scale (a new
 * scale starts them again). */
void sk__rope_tables(struct sk_scratch *s, uint32_t n, float freq_scale);

/* Rotates one head x (head_dim floats) by the angles cs/sn (layout of
 * sk__rope_angles), writing y (may equal x). */
static inline void sk__rope(float *y, const float *x, const struct sk_model_config *c,
                            const float *cs, const float *sn) {
  sk_kernels_rope(y, x, cs, sn, c->rope_dim);
  if (y != x) memcpy(y + c->rope_dim, x + c->rope_dim, (c->head_dim - c->rope_dim) * sizeof *y);
}

/* ---- attention (attention.c) ----------------------------------------- */

/* One layer's attention tasks (s->task_seq, s->task_kvh: one per
 * sequence and group of KV heads, or per sequence whose cache
 * accumulates H2O scores), run by sk_pool_run. */
struct sk__att {
  struct sk_scratch *s;
  uint32_t layer;
  uint32_t kvh_per; /* KV heads per task of a cache with rotated keys */
};

/* Attention task `task` of a (struct sk__att *ctx) on pool thread
 * `thread`: the attention of its sequence's queries over its cache and
 * the step's own keys, into s->att_out, with the diagnostics into
 * s->mass_part / s->ent_part and the H2O scores into the cache; then
 * writes its part of the new keys and values into the cache slots. */
void sk__att_any_task(void *ctx, uint32_t task, uint32_t thread);

#endif
