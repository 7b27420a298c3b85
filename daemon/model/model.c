/* Forward pass of the llama, qwen2 and qwen3 architectures (see model.h):
 * one pass, and one table (sk__archs) of what each architecture adds.
 *
 * Numerics follow llama.cpp's CPU backend (ggml) where the order of
 * floating-point operations is visible in the result: RMSNorm (of the
 * residual stream, and of each query and key head for qwen3) sums squares
 * in double and scales by a float 1/sqrtf(mean + eps) before the weight;
 * RoPE builds its angles in float as theta = pos * theta_scale^i by
 * repeated multiplication; attention scores are scaled after the dot
 * product and the softmax subtracts the max and sums in double; SiLU is
 * x / (1 + expf(-x)). Matrix products and attention dot products go
 * through kernels.c; their summation order differs from ggml's, which
 * moves F32 logits by ~1e-6.
 *
 * Batching: one call runs any number of sequences (sessions) together.
 * Their rows are stacked, so each weight matrix is read once per call for
 * all of them; attention is per sequence and per KV head. Every row's
 * result depends only on its own sequence (see kernels.h, Determinism).
 */
#include "model/model.h"

#include <math.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kernels.h"
#include "model/quant.h"
#include "model/sparse.h"

/* Hard limits on hyper-parameters, each with its reason. They reject
 * headers that would make the size arithmetic below overflow or ask for
 * absurd allocations; real llama models sit far below every one. */
#define SK__MAX_DIM 65536u          /* Llama 3 405B uses 16384 */
#define SK__MAX_HIDDEN (1u << 20)   /* FFN width; 405B uses 53248 */
#define SK__MAX_LAYER 1024u         /* 405B has 126 */
#define SK__MAX_HEAD 1024u          /* 405B has 128 */
#define SK__MAX_VOCAB (1u << 22)    /* largest vocabularies are ~256K */
#define SK__MAX_CTX_TRAIN (1u << 24)
/* Smallest rope.scaling.factor (other than 0, none) and rope_freqs.weight
 * value: RoPE angles are position x scale / factor in float, and a
 * session's scale may reach context_length (2^24) times the model's, so
 * with divisors down to 2^-32 the angle of every position below the
 * trained context stays under 2^24 * 2^24 * 2^32 * 2^32 = 2^112, finite
 * (a subnormal divisor gave infinite angles, hence NaN logits). Real
 * models use 1 and more (Llama 3.1: 1..8). */
#define SK__MIN_ROPE_DIVISOR 0x1p-32f
/* Positions and batches a scratch can be sized for. */
#define SK__MAX_SCRATCH_CTX SK_KV_MAX_CAPACITY
/* Output rows per matrix-product task: a multiple of the packed kernels'
 * groups (8 or 16 rows), and large enough that a task outweighs handing
 * it out. */
#define SK__MM_ALIGN 16u

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
  struct sk_sparse_mlp *sparse; /* (n_layer) sparse MLP weights, or NULL
                                   (sk_model_sparse_prepare) */
  uint64_t sparse_bytes;    /* bytes of the copies made for them */
};

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

/* ---- architectures --------------------------------------------------- */

/* Whether a tensor kind is in an architecture's files (llama.cpp's
 * llama-model.cpp, the tensors each architecture creates). */
enum sk__presence { SK__ABSENT, SK__OPTIONAL, SK__REQUIRED };

/* One architecture: everything the forward pass does differently for it.
 * The hyper-parameter keys are general.architecture + "." + the llama
 * suffixes (llama.cpp's LLM_KV names, the same for all three). */
struct sk__arch {
  const char *name;             /* general.architecture */
  enum sk_rope_style rope;      /* llama.cpp's llama_model_rope_type */
  enum sk__presence qkv_bias;   /* blk.N.attn_{q,k,v}.bias */
  enum sk__presence qk_norm;    /* blk.N.attn_{q,k}_norm.weight */
  enum sk__presence rope_freqs; /* rope_freqs.weight (Llama 3.1 scaling) */
};

/* output.weight is optional for all of them: without it the output head
 * is token_embd (Llama 3.2 1B/3B, Qwen2.5 0.5B-3B, Qwen3 0.6B-4B). */
static const struct sk__arch sk__archs[] = {
    {"llama", SK_ROPE_NORM, SK__OPTIONAL, SK__ABSENT, SK__OPTIONAL},
    {"qwen2", SK_ROPE_NEOX, SK__REQUIRED, SK__ABSENT, SK__ABSENT},
    {"qwen3", SK_ROPE_NEOX, SK__ABSENT, SK__REQUIRED, SK__ABSENT},
};

/* ---- loading -------------------------------------------------------- */

/* "ARCH.suffix" into buf. */
static const char *sk__arch_key(const struct sk_model_config *c, char *buf, size_t n,
                                const char *suffix) {
  snprintf(buf, n, "%s.%s", c->arch, suffix);
  return buf;
}

/* Reads ARCH.<suffix> as u32: required (error if absent) or defaulted. */
static int sk__hp_u32(const struct sk_gguf *g, const struct sk_model_config *c,
                      const char *suffix, bool required, uint32_t def, uint32_t *ret,
                      struct sk_error *err) {
  char key[96];
  int rc = sk_gguf_get_u32(g, sk__arch_key(c, key, sizeof key, suffix), ret, err);
  if (rc < 0) return rc;
  if (rc == 0) {
    if (required)
      return sk_error_set(err, SK_ERR_BAD_MODEL, "model has no %s", key);
    *ret = def;
  }
  return 0;
}

/* Reads ARCH.<suffix> as f32, or def if absent. */
static int sk__hp_f32(const struct sk_gguf *g, const struct sk_model_config *c,
                      const char *suffix, float def, float *ret, struct sk_error *err) {
  char key[96];
  int rc = sk_gguf_get_f32(g, sk__arch_key(c, key, sizeof key, suffix), ret, err);
  if (rc < 0) return rc;
  if (rc == 0) *ret = def;
  return 0;
}

/* Checks 1 <= v <= max for ARCH.<suffix>. */
static int sk__check_range(const struct sk_model_config *c, const char *suffix, uint32_t v,
                           uint32_t max, struct sk_error *err) {
  if (v == 0 || v > max)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "%s.%s is %u, expected 1..%u", c->arch,
                        suffix, v, max);
  return 0;
}

static bool sk__str_eq(struct sk_gguf_str s, const char *lit) {
  return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

/* The table entry of general.architecture, or a refusal naming it and the
 * architectures sinkd runs. */
static int sk__find_arch(const struct sk_gguf *g, const struct sk__arch **ret,
                         struct sk_error *err) {
  struct sk_gguf_str s;
  int rc = sk_gguf_get_str(g, "general.architecture", &s, err);
  if (rc < 0) return rc;
  if (rc == 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "model has no general.architecture; sinkd runs " SK_MODEL_ARCHS);
  for (size_t i = 0; i < sizeof sk__archs / sizeof sk__archs[0]; i++)
    if (sk__str_eq(s, sk__archs[i].name)) {
      *ret = &sk__archs[i];
      return 0;
    }
  /* (the name as printable bytes only: it comes from the file) */
  char name[33];
  size_t n = s.len < sizeof name - 1 ? (size_t)s.len : sizeof name - 1;
  for (size_t i = 0; i < n; i++)
    name[i] = s.ptr[i] >= 0x20 && s.ptr[i] < 0x7f ? s.ptr[i] : '?';
  name[n] = 0;
  return sk_error_set(err, SK_ERR_BAD_MODEL,
                      "general.architecture is \"%s\"%s, which sinkd does not run; "
                      "it runs " SK_MODEL_ARCHS,
                      name, s.len > n ? "..." : "");
}

/* general.name into dst (size bytes, NUL-terminated) as the text it is
 * meant to be: the name goes into logs, the systemd status line (where a
 * newline would start a forged assignment) and hello replies (whose
 * strings are UTF-8). Whole valid UTF-8 characters (RFC 3629) are kept
 * while they fit; control characters (C0, DEL, C1) and bytes of no valid
 * character become '?'. */
static void sk__copy_name(char *dst, size_t size, const char *src, size_t len) {
  const unsigned char *p = (const unsigned char *)src;
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    unsigned char c = p[i];
    size_t n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = n > 0 && i + n <= len;
    for (size_t k = 1; ok && k < n; k++) ok = (p[i + k] & 0xc0) == 0x80;
    if (ok && n > 1) { /* overlong, surrogate, beyond U+10FFFF, C1 */
      unsigned char d = p[i + 1];
      ok = !(c == 0xe0 && d < 0xa0) && !(c == 0xed && d > 0x9f) && !(c == 0xf0 && d < 0x90) &&
           !(c == 0xf4 && d > 0x8f) && !(c == 0xc2 && d < 0xa0);
    }
    if (ok && n == 1) ok = c >= 0x20 && c != 0x7f;
    if (!ok) n = 1;
    if (o + (ok ? n : 1) >= size) break;
    if (ok) {
      memcpy(dst + o, p + i, n);
      o += n;
    } else {
      dst[o++] = '?';
    }
    i += n;
  }
  dst[o] = 0;
}

static int sk__read_config(const struct sk_gguf *g, const struct sk__arch *arch,
                           struct sk_model_config *c, struct sk_error *err) {
  struct sk_gguf_str s;
  int rc;
  memset(c, 0, sizeof *c);
  snprintf(c->arch, sizeof c->arch, "%s", arch->name);
  c->rope_style = arch->rope;
  if ((rc = sk__hp_u32(g, c, "embedding_length", true, 0, &c->dim, err)) < 0 ||
      (rc = sk__hp_u32(g, c, "feed_forward_length", true, 0, &c->hidden_dim, err)) < 0 ||
      (rc = sk__hp_u32(g, c, "block_count", true, 0, &c->n_layer, err)) < 0 ||
      (rc = sk__hp_u32(g, c, "attention.head_count", true, 0, &c->n_head, err)) < 0 ||
      (rc = sk__hp_u32(g, c, "context_length", true, 0, &c->n_ctx_train, err)) < 0)
    return rc;
  if ((rc = sk__check_range(c, "embedding_length", c->dim, SK__MAX_DIM, err)) < 0 ||
      (rc = sk__check_range(c, "feed_forward_length", c->hidden_dim, SK__MAX_HIDDEN, err)) <
          0 ||
      (rc = sk__check_range(c, "block_count", c->n_layer, SK__MAX_LAYER, err)) < 0 ||
      (rc = sk__check_range(c, "attention.head_count", c->n_head, SK__MAX_HEAD, err)) < 0 ||
      (rc = sk__check_range(c, "context_length", c->n_ctx_train, SK__MAX_CTX_TRAIN, err)) < 0)
    return rc;
  if ((rc = sk__hp_u32(g, c, "attention.head_count_kv", false, c->n_head, &c->n_kv_head,
                       err)) < 0)
    return rc;
  if ((rc = sk__check_range(c, "attention.head_count_kv", c->n_kv_head, c->n_head, err)) < 0)
    return rc;
  if (c->n_head % c->n_kv_head != 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "%s.attention.head_count %u is not a multiple of "
                        "%s.attention.head_count_kv %u",
                        c->arch, c->n_head, c->arch, c->n_kv_head);
  /* The head size: key_length (Qwen3 sets it; its heads need not split
   * the embedding), else the embedding split over the heads, as
   * llama.cpp's n_embd_head_k. The cache keeps keys and values of one
   * size, so value_length must agree. */
  char key[96];
  rc = sk_gguf_get_u32(g, sk__arch_key(c, key, sizeof key, "attention.key_length"),
                       &c->head_dim, err);
  if (rc < 0) return rc;
  if (rc == 0) {
    if (c->dim % c->n_head != 0)
      return sk_error_set(err, SK_ERR_BAD_MODEL,
                          "%s.embedding_length %u is not a multiple of "
                          "%s.attention.head_count %u (and there is no "
                          "%s.attention.key_length)",
                          c->arch, c->dim, c->arch, c->n_head, c->arch);
    c->head_dim = c->dim / c->n_head;
  }
  if ((rc = sk__check_range(c, "attention.key_length", c->head_dim, SK__MAX_DIM, err)) < 0)
    return rc;
  uint32_t v_len = 0;
  if ((rc = sk__hp_u32(g, c, "attention.value_length", false, c->head_dim, &v_len, err)) < 0)
    return rc;
  if (v_len != c->head_dim)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "%s.attention.value_length %u differs from the key length %u "
                        "(sinkd's cache holds keys and values of one size)",
                        c->arch, v_len, c->head_dim);
  if ((uint64_t)c->n_head * c->head_dim > SK__MAX_DIM)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "%u heads of %u are wider than %u", c->n_head, c->head_dim,
                        SK__MAX_DIM);
  c->q_dim = c->n_head * c->head_dim;
  c->kv_dim = c->n_kv_head * c->head_dim;

  if ((rc = sk__hp_u32(g, c, "rope.dimension_count", false, c->head_dim, &c->rope_dim,
                       err)) < 0)
    return rc;
  if (c->rope_dim == 0 || c->rope_dim % 2 != 0 || c->rope_dim > c->head_dim)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "%s.rope.dimension_count is %u, expected an even "
                        "number in 2..%u (the head size)",
                        c->arch, c->rope_dim, c->head_dim);

  if ((rc = sk__hp_f32(g, c, "rope.freq_base", 10000.0f, &c->rope_base, err)) < 0)
    return rc;
  if (!isfinite(c->rope_base) || !(c->rope_base > 1.0f))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "%s.rope.freq_base is %g, expected a finite "
                        "value > 1",
                        c->arch, (double)c->rope_base);
  if ((rc = sk__hp_f32(g, c, "attention.layer_norm_rms_epsilon", 1e-5f, &c->rms_eps, err)) <
      0)
    return rc;
  if (!isfinite(c->rms_eps) || !(c->rms_eps > 0.0f) || c->rms_eps > 1.0f)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "%s.attention.layer_norm_rms_epsilon is %g, "
                        "expected a value in (0, 1]",
                        c->arch, (double)c->rms_eps);

  /* Position interpolation, as llama.cpp reads it: the factor (or the old
   * rope.scale_linear key) applies whatever the type says, and the type
   * defaults to linear; YaRN and friends change the angles themselves and
   * are not implemented. */
  rc = sk_gguf_get_str(g, sk__arch_key(c, key, sizeof key, "rope.scaling.type"), &s, err);
  if (rc < 0) return rc;
  if (rc > 0 && !sk__str_eq(s, "linear") && !sk__str_eq(s, "none")) {
    char q[36];
    return sk_error_set(err, SK_ERR_BAD_MODEL, "%s \"%s\" is not supported (only linear)", key,
                        sk_gguf_quote(q, sizeof q, s.ptr, s.len));
  }
  float factor = 0.0f;
  rc = sk_gguf_get_f32(g, sk__arch_key(c, key, sizeof key, "rope.scaling.factor"), &factor,
                       err);
  if (rc == 0)
    rc = sk_gguf_get_f32(g, sk__arch_key(c, key, sizeof key, "rope.scale_linear"), &factor,
                         err);
  if (rc < 0) return rc;
  if (!isfinite(factor) || factor < 0.0f || (factor > 0.0f && factor < SK__MIN_ROPE_DIVISOR))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "%s.rope.scaling.factor is %g, expected 0 (none) or a finite "
                        "value >= 2^-32",
                        c->arch, (double)factor);
  c->rope_scale = factor == 0.0f ? 1.0f : 1.0f / factor;

  rc = sk_gguf_get_str(g, "general.name", &s, err);
  if (rc < 0) return rc;
  if (rc > 0) sk__copy_name(c->name, sizeof c->name, s.ptr, (size_t)s.len);
  return 0;
}

/* ---- tensors -------------------------------------------------------- */

/* Takes ownership of p (freed with the model); frees it on failure. */
static int sk__own(struct sk_model *m, void *p, const char *name, struct sk_error *err) {
  if (m->n_owned == m->cap_owned) {
    size_t cap = m->cap_owned ? 2 * m->cap_owned : 16;
    void **o = realloc(m->owned, cap * sizeof *o);
    if (!o) {
      free(p);
      return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot keep tensor %s", name);
    }
    m->owned = o;
    m->cap_owned = cap;
  }
  m->owned[m->n_owned++] = p;
  return 0;
}

/* Finds tensor `name` and checks that its shape is exactly [ne0]
 * (ne1 == 0) or [ne0, ne1]. */
static int sk__find_shaped(const struct sk_gguf *g, const char *name, uint64_t ne0,
                           uint64_t ne1, const struct sk_gguf_tensor **ret,
                           struct sk_error *err) {
  const struct sk_gguf_tensor *t = sk_gguf_find_tensor(g, name);
  if (!t)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tensor %s is missing", name);
  uint64_t want[SK_GGUF_MAX_DIMS] = {ne0, ne1 ? ne1 : 1, 1, 1};
  if (memcmp(t->ne, want, sizeof want) != 0) {
    if (ne1)
      return sk_error_set(
          err, SK_ERR_BAD_MODEL,
          "tensor %s has shape [%llu, %llu, %llu, %llu], expected [%llu, %llu]",
          name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
          (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
          (unsigned long long)ne0, (unsigned long long)ne1);
    return sk_error_set(
        err, SK_ERR_BAD_MODEL,
        "tensor %s has shape [%llu, %llu, %llu, %llu], expected [%llu]", name,
        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
        (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
        (unsigned long long)ne0);
  }
  *ret = t;
  return 0;
}

/* Converts an F16/BF16 tensor of n elements to an owned F32 copy. */
static int sk__to_f32(struct sk_model *m, const struct sk_gguf_tensor *t, const char *name,
                      uint64_t n, const float **ret, struct sk_error *err) {
  if (t->n_bytes != n * sizeof(uint16_t))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tensor %s: %llu bytes of %s data for %llu elements",
                        name, (unsigned long long)t->n_bytes,
                        sk_ggml_type_name(t->type), (unsigned long long)n);
  float *f = malloc((size_t)n * sizeof *f);
  if (!f)
    return sk_error_set(err, SK_ERR_NO_MEMORY,
                        "cannot allocate %llu floats for tensor %s",
                        (unsigned long long)n, name);
  const unsigned char *src = t->data; /* may be only 2-byte aligned */
  bool bf = t->type == SK_GGML_BF16;
  for (uint64_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, src + 2 * i, sizeof h);
    f[i] = bf ? sk_bf16_to_f32(h) : sk_f16_to_f32(h);
  }
  int rc = sk__own(m, f, name, err);
  if (rc < 0) return rc;
  *ret = f;
  return 0;
}

/* A vector (norm weights, rope factors) of ne0 floats: F32 in place,
 * F16/BF16 converted. */
static int sk__vector(struct sk_model *m, const struct sk_gguf *g, const char *name,
                      uint64_t ne0, const float **ret, struct sk_error *err) {
  const struct sk_gguf_tensor *t = NULL;
  int rc = sk__find_shaped(g, name, ne0, 0, &t, err);
  if (rc < 0) return rc;
  if (t->type == SK_GGML_F32) {
    if (t->n_bytes != ne0 * sizeof(float) || (uintptr_t)t->data % alignof(float) != 0)
      return sk_error_set(err, SK_ERR_BAD_MODEL,
                          "tensor %s: %llu bytes of f32 data for %llu "
                          "elements, or misaligned",
                          name, (unsigned long long)t->n_bytes, (unsigned long long)ne0);
    *ret = t->data;
    return 0;
  }
  if (t->type != SK_GGML_F16 && t->type != SK_GGML_BF16)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tensor %s has type %s, expected f32, f16 or bf16",
                        name, sk_ggml_type_name(t->type));
  return sk__to_f32(m, t, name, ne0, ret, err);
}

/* Dequantizes the n_rows x ne0 matrix of t to an owned F32 copy. */
static int sk__dequantize(struct sk_model *m, const struct sk_gguf_tensor *t, const char *name,
                          uint64_t ne0, uint64_t ne1, size_t row_bytes, const float **ret,
                          struct sk_error *err) {
  if (ne1 > SIZE_MAX / sizeof(float) / ne0)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "tensor %s is too large to dequantize", name);
  float *f = malloc((size_t)(ne0 * ne1) * sizeof *f);
  if (!f)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %llu floats for tensor %s",
                        (unsigned long long)(ne0 * ne1), name);
  for (uint64_t r = 0; r < ne1; r++)
    sk_dequantize_row(t->type, (const uint8_t *)t->data + r * row_bytes, (uint32_t)ne0,
                      f + r * ne0);
  int rc = sk__own(m, f, name, err);
  if (rc < 0) return rc;
  *ret = f;
  return 0;
}

/* A matrix of ne1 rows of ne0 (GGUF's order: ne0 is the row), of any
 * type sinkd runs, used in place (the mapping must outlive the model);
 * with m->dequantize an F32 copy instead. With `product`, the matrix is
 * repacked for the kernels if they want it (sk_kernels_pack). */
static int sk__matrix(struct sk_model *m, const struct sk_gguf *g, const char *name,
                      uint64_t ne0, uint64_t ne1, bool product, struct sk_wmat *ret,
                      struct sk_error *err) {
  const struct sk_gguf_tensor *t = NULL;
  int rc = sk__find_shaped(g, name, ne0, ne1, &t, err);
  if (rc < 0) return rc;
  struct sk_wmat w = {.type = t->type, .rows = (uint32_t)ne1, .cols = (uint32_t)ne0,
                      .data = t->data};
  if (!sk_quant_supported(t->type))
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tensor %s has type %s; sinkd runs %s", name,
                        sk_ggml_type_name(t->type), sk_quant_supported_names());
  if (t->type == SK_GGML_F32 && (uintptr_t)t->data % alignof(float) != 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tensor %s: f32 data is misaligned", name);
  w.row_bytes = sk_quant_row_bytes(w.type, ne0);
  if (w.row_bytes == 0 || t->n_bytes != w.row_bytes * ne1)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tensor %s: %llu bytes of %s data for %llu x %llu elements", name,
                        (unsigned long long)t->n_bytes, sk_ggml_type_name(t->type),
                        (unsigned long long)ne1, (unsigned long long)ne0);
  if (m->dequantize && t->type != SK_GGML_F32) {
    const float *f = NULL;
    if ((rc = sk__dequantize(m, t, name, ne0, ne1, w.row_bytes, &f, err)) < 0) return rc;
    w.type = SK_GGML_F32;
    w.data = f;
    w.row_bytes = (size_t)ne0 * sizeof(float);
    m->repacked_bytes += (uint64_t)w.row_bytes * w.rows;
  } else if (product) {
    void *mem = NULL;
    if ((rc = sk_kernels_pack(&w, &mem, err)) < 0) return rc;
    if (mem && (rc = sk__own(m, mem, name, err)) < 0) return rc;
    /* products read the packed copy: the file's pages need not stay */
    if (mem) {
      sk_gguf_release(g, t->data, t->n_bytes);
      m->repacked_bytes += t->n_bytes;
    } else {
      m->mapped_bytes += t->n_bytes;
    }
  } else {
    m->mapped_bytes += t->n_bytes;
  }
  if (product) m->weight_bytes += (uint64_t)w.row_bytes * w.rows;
  *ret = w;
  return 0;
}

static int sk__load_tensors(struct sk_model *m, const struct sk_gguf *g,
                            const struct sk__arch *arch, struct sk_error *err) {
  const struct sk_model_config *c = &m->cfg;
  const struct sk_gguf_tensor *te = sk_gguf_find_tensor(g, "token_embd.weight");
  if (!te)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tensor token_embd.weight is missing");
  if (te->ne[1] == 0 || te->ne[1] > SK__MAX_VOCAB)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "token_embd.weight has %llu rows (the vocabulary), "
                        "expected 1..%u",
                        (unsigned long long)te->ne[1], SK__MAX_VOCAB);
  m->cfg.n_vocab = (uint32_t)te->ne[1];
  int rc;
  if ((rc = sk__matrix(m, g, "token_embd.weight", c->dim, c->n_vocab, false, &m->tok_embd,
                       err)) < 0 ||
      (rc = sk__vector(m, g, "output_norm.weight", c->dim, &m->out_norm, err)) < 0)
    return rc;
  m->cfg.tied_output = sk_gguf_find_tensor(g, "output.weight") == NULL;
  if (!m->cfg.tied_output) {
    if ((rc = sk__matrix(m, g, "output.weight", c->dim, c->n_vocab, true, &m->output, err)) < 0)
      return rc;
  } else { /* tied embeddings: the same data, packed for products if need be */
    m->output = m->tok_embd;
    void *mem = NULL;
    /* (not embeddings converted from BF16: token lookups read that copy) */
    if (m->tok_embd.data == te->data && (rc = sk_kernels_pack(&m->output, &mem, err)) < 0)
      return rc;
    if (mem && (rc = sk__own(m, mem, "output", err)) < 0) return rc;
    /* token lookups fault back in only the rows they read */
    if (mem) {
      sk_gguf_release(g, te->data, te->n_bytes);
      m->repacked_bytes += te->n_bytes;
    }
    m->weight_bytes += (uint64_t)m->output.row_bytes * m->output.rows;
  }
  if (sk_gguf_find_tensor(g, "rope_freqs.weight")) {
    if (arch->rope_freqs == SK__ABSENT)
      return sk_error_set(err, SK_ERR_BAD_MODEL,
                          "tensor rope_freqs.weight is not used by architecture %s "
                          "(llama.cpp refuses it too)",
                          c->arch);
    m->cfg.rope_freqs = true;
    if ((rc = sk__vector(m, g, "rope_freqs.weight", c->rope_dim / 2, &m->rope_freqs, err)) < 0)
      return rc;
    for (uint32_t i = 0; i < c->rope_dim / 2; i++)
      if (!isfinite(m->rope_freqs[i]) || !(m->rope_freqs[i] >= SK__MIN_ROPE_DIVISOR))
        return sk_error_set(err, SK_ERR_BAD_MODEL,
                            "rope_freqs.weight[%u] is %g, expected a finite "
                            "value >= 2^-32",
                            i, (double)m->rope_freqs[i]);
  }

  /* Optional kinds: layer 0 decides, every other layer must agree. */
  m->cfg.qkv_bias = arch->qkv_bias == SK__REQUIRED ||
                    (arch->qkv_bias == SK__OPTIONAL &&
                     sk_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL);
  m->cfg.qk_norm = arch->qk_norm == SK__REQUIRED ||
                   (arch->qk_norm == SK__OPTIONAL &&
                    sk_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") != NULL);
  for (uint32_t l = 0; l < c->n_layer; l++) {
    struct sk__layer *L = &m->layers[l];
    char name[SK_GGUF_MAX_NAME + 16];
    snprintf(name, sizeof name, "blk.%u.attn_norm.weight", l);
    if ((rc = sk__vector(m, g, name, c->dim, &L->attn_norm, err)) < 0) return rc;
    snprintf(name, sizeof name, "blk.%u.ffn_norm.weight", l);
    if ((rc = sk__vector(m, g, name, c->dim, &L->ffn_norm, err)) < 0) return rc;
    struct {
      const char *suffix;
      uint32_t ne0, ne1;
      struct sk_wmat *dst;
    } spec[] = {
        {"attn_q", c->dim, c->q_dim, &L->wq},
        {"attn_k", c->dim, c->kv_dim, &L->wk},
        {"attn_v", c->dim, c->kv_dim, &L->wv},
        {"attn_output", c->q_dim, c->dim, &L->wo},
        {"ffn_gate", c->dim, c->hidden_dim, &L->w_gate},
        {"ffn_up", c->dim, c->hidden_dim, &L->w_up},
        {"ffn_down", c->hidden_dim, c->dim, &L->w_down},
    };
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
      snprintf(name, sizeof name, "blk.%u.%s.weight", l, spec[i].suffix);
      if ((rc = sk__matrix(m, g, name, spec[i].ne0, spec[i].ne1, true, spec[i].dst, err)) < 0)
        return rc;
    }
    /* The vectors the architecture adds (m->cfg.qkv_bias / qk_norm, set
     * above: every layer has them or none). */
    struct {
      const char *name;
      bool want;
      uint32_t ne0;
      const float **dst;
    } vec[] = {
        {"attn_q.bias", c->qkv_bias, c->q_dim, &L->bq},
        {"attn_k.bias", c->qkv_bias, c->kv_dim, &L->bk},
        {"attn_v.bias", c->qkv_bias, c->kv_dim, &L->bv},
        {"attn_q_norm.weight", c->qk_norm, c->head_dim, &L->q_norm},
        {"attn_k_norm.weight", c->qk_norm, c->head_dim, &L->k_norm},
    };
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
      snprintf(name, sizeof name, "blk.%u.%s", l, vec[i].name);
      if (vec[i].want) {
        if ((rc = sk__vector(m, g, name, vec[i].ne0, vec[i].dst, err)) < 0) return rc;
      } else if (sk_gguf_find_tensor(g, name)) {
        return sk_error_set(err, SK_ERR_BAD_MODEL,
                            "tensor %s is not used by architecture %s%s", name, c->arch,
                            i < 3 && arch->qkv_bias == SK__OPTIONAL
                                ? " without blk.0.attn_q.bias"
                                : " (llama.cpp refuses it too)");
      }
    }
  }
  return 0;
}

int sk_model_load(const struct sk_gguf *g, struct sk_model **ret,
                  struct sk_error *err) {
  return sk_model_load_opts(g, NULL, ret, err);
}

int sk_model_load_opts(const struct sk_gguf *g, const struct sk_model_load_options *opts,
                       struct sk_model **ret, struct sk_error *err) {
  struct sk_model *m = calloc(1, sizeof *m);
  if (!m) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate model");
  m->dequantize = opts && opts->dequantize;
  const struct sk__arch *arch = NULL;
  int rc = sk__find_arch(g, &arch, err);
  if (rc < 0) goto fail;
  rc = sk__read_config(g, arch, &m->cfg, err);
  if (rc < 0) goto fail;
  m->layers = calloc(m->cfg.n_layer, sizeof *m->layers);
  if (!m->layers) {
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %u layers",
                      m->cfg.n_layer);
    goto fail;
  }
  rc = sk__load_tensors(m, g, arch, err);
  if (rc < 0) goto fail;
  *ret = m;
  return 0;
fail:
  sk_model_free(m);
  return rc;
}

void sk_model_free(struct sk_model *m) {
  if (!m) return;
  free(m->sparse);
  for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
  free(m->owned);
  free(m->layers);
  free(m);
}

const struct sk_model_config *sk_model_config(const struct sk_model *m) {
  return &m->cfg;
}

struct sk_kv_shape sk_model_kv_shape(const struct sk_model *m) {
  return (struct sk_kv_shape){.n_layer = m->cfg.n_layer,
                              .kv_dim = m->cfg.kv_dim};
}

const char *sk_model_weight_type(const struct sk_model *m) {
  return sk_ggml_type_name(m->layers[0].wq.type);
}

uint64_t sk_model_weight_bytes(const struct sk_model *m) { return m->weight_bytes; }

int sk_model_sparse_prepare(struct sk_model *m, struct sk_error *err) {
  if (m->sparse) return 0;
  const struct sk_model_config *c = &m->cfg;
  struct sk_sparse_mlp *sp = calloc(c->n_layer, sizeof *sp);
  if (!sp) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate the sparse MLP");
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < c->n_layer; l++) {
    const struct sk__layer *L = &m->layers[l];
    void *mem = NULL;
    size_t n = 0;
    int rc = sk_sparse_prepare(&sp[l], &L->w_up, &L->w_down, &mem, &n, err);
    if (rc == 0) rc = sk__own(m, mem, "ffn_up, ffn_down (sparse MLP)", err);
    if (rc < 0) {
      free(sp);
      return rc;
    }
    bytes += n;
  }
  m->sparse = sp;
  m->sparse_bytes = bytes;
  return 0;
}

uint64_t sk_model_sparse_bytes(const struct sk_model *m) { return m->sparse_bytes; }

double sk_model_sparse_step_bytes(const struct sk_model *m, const double *kept) {
  double b = (double)m->weight_bytes;
  if (!m->sparse) return b;
  for (uint32_t l = 0; l < m->cfg.n_layer; l++) {
    const struct sk__layer *L = &m->layers[l];
    b -= (double)L->w_up.row_bytes * L->w_up.rows + (double)L->w_down.row_bytes * L->w_down.rows;
    b += sk_sparse_step_bytes(&m->sparse[l], kept[l]);
  }
  return b;
}

void sk_scratch_set_gate_probe(struct sk_scratch *s, sk_scratch_gate_fn fn, void *user) {
  s->gate_fn = fn;
  s->gate_user = user;
}

bool sk_scratch_sparse(const struct sk_scratch *s, uint32_t seq, const uint64_t **ret_kept,
                       uint32_t *ret_rows) {
  if (seq >= s->attn_n_seqs) return false;
  *ret_kept = s->sp_kept + (size_t)seq * s->m->cfg.n_layer;
  *ret_rows = s->sp_rows[seq];
  return true;
}

const char *sk_model_describe(const struct sk_model *m, char *buf, size_t n) {
  const struct sk_model_config *c = &m->cfg;
  snprintf(buf, n, "%s rope=%s%s%s%s%s", c->arch,
           c->rope_style == SK_ROPE_NEOX ? "neox keys=pairs-interleaved" : "norm",
           c->qkv_bias ? " qkv_bias" : "", c->qk_norm ? " qk_norm" : "",
           c->rope_freqs ? " rope_freqs" : "", c->tied_output ? " tied_output" : "");
  return buf;
}

uint64_t sk_model_mapped_bytes(const struct sk_model *m) { return m->mapped_bytes; }

uint64_t sk_model_repacked_bytes(const struct sk_model *m) { return m->repacked_bytes; }

/* ---- scratch -------------------------------------------------------- */

void sk_scratch_free(struct sk_scratch *s) {
  if (!s) return;
  float **bufs[] = {&s->x,   &s->xb,      &s->xb2, &s->q,   &s->k,
                    &s->v,   &s->att_out, &s->hb,  &s->hb2, &s->ad,
                    &s->rope_cos, &s->rope_sin, &s->row_cos, &s->row_sin,
                    &s->sink_cos, &s->sink_sin, &s->head_tmp};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(*bufs[i]);
  free(s->aq);
  free(s->k16);
  free(s->v16);
  free(s->as);
  free(s->aqk);
  free(s->adk);
  free(s->ask);
  free(s->rows);
  free(s->seqs);
  free(s->task_seq);
  free(s->task_kvh);
  free(s->mass_part);
  free(s->ent_part);
  free(s->sink_mass);
  free(s->entropy);
  free(s->probe);
  free(s->sp_kept);
  free(s->sp_rows);
  sk_sparse_work_free(&s->sp);
  if (s->ts) {
    for (uint32_t t = 0; t < s->n_threads; t++) {
      free(s->ts[t].kr);
      free(s->ts[t].kq);
      free(s->ts[t].qw);
      free(s->ts[t].qs);
      free(s->ts[t].att);
      free(s->ts[t].vp);
      free(s->ts[t].kp);
      free(s->ts[t].sp);
      free(s->ts[t].cs);
      free(s->ts[t].sn);
    }
    free(s->ts);
  }
  free(s);
}

int sk_scratch_new(const struct sk_model *m, uint32_t max_batch,
                   uint32_t max_ctx, struct sk_scratch **ret,
                   struct sk_error *err) {
  return sk_scratch_new_pool(m, max_batch, max_ctx, NULL, ret, err);
}

int sk_scratch_new_pool(const struct sk_model *m, uint32_t max_batch, uint32_t max_ctx,
                        struct sk_pool *pool, struct sk_scratch **ret, struct sk_error *err) {
  const struct sk_model_config *c = &m->cfg;
  if (max_batch == 0 || max_batch > SK__MAX_SCRATCH_CTX)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "max_batch %u is outside 1..%u", max_batch,
                        SK__MAX_SCRATCH_CTX);
  if (max_ctx == 0 || max_ctx > SK__MAX_SCRATCH_CTX)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "max_ctx %u is outside 1..%u", max_ctx,
                        SK__MAX_SCRATCH_CTX);
  struct sk_scratch *s = calloc(1, sizeof *s);
  if (!s) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate scratch");
  s->m = m;
  s->pool = pool;
  s->n_threads = sk_pool_threads(pool);
  s->max_batch = max_batch;
  s->max_ctx = max_ctx;
  /* Every product below is < 2^20 * 2^22 floats: fits size_t on 64-bit;
   * on 32-bit hosts malloc simply fails. */
  size_t B = max_batch, T = max_ctx;
  size_t wide = c->hidden_dim > c->dim ? c->hidden_dim : c->dim;
  if (c->q_dim > wide) wide = c->q_dim;
  size_t half = c->rope_dim / 2;
  struct {
    void **dst;
    size_t n, size;
  } want[] = {
      {(void **)&s->x, B * c->dim, 4},       {(void **)&s->xb, B * c->dim, 4},
      {(void **)&s->xb2, B * c->dim, 4},     {(void **)&s->q, B * c->q_dim, 4},
      {(void **)&s->k, B * c->kv_dim, 4},    {(void **)&s->v, B * c->kv_dim, 4},
      {(void **)&s->att_out, B * c->q_dim, 4}, {(void **)&s->hb, B * c->hidden_dim, 4},
      {(void **)&s->head_tmp, c->head_dim, 4},
      {(void **)&s->hb2, B * c->hidden_dim, 4},
      {(void **)&s->k16, B * c->kv_dim, 2},  {(void **)&s->v16, B * c->kv_dim, 2},
      {(void **)&s->aq, B * wide, 1},        {(void **)&s->ad, B * (wide / SK_QK + 1), 4},
      {(void **)&s->as, B * (wide / SK_QK + 1), 4},
      {(void **)&s->aqk, B * wide, 1},       {(void **)&s->adk, B * (wide / SK_QKK + 1), 4},
      {(void **)&s->ask, B * (wide / 16 + 1), 2},
      {(void **)&s->rows, 3 * B, sizeof(float *)},
      {(void **)&s->seqs, B, sizeof(struct sk__seq)},
      {(void **)&s->rope_cos, T * 2 * half, 4}, {(void **)&s->rope_sin, T * 2 * half, 4},
      {(void **)&s->row_cos, B * 2 * half, 4},  {(void **)&s->row_sin, B * 2 * half, 4},
      {(void **)&s->sink_cos, B * 2 * half, 4}, {(void **)&s->sink_sin, B * 2 * half, 4},
      {(void **)&s->ts, s->n_threads, sizeof(struct sk__tscratch)},
      {(void **)&s->task_seq, B * c->n_kv_head, sizeof(uint32_t)},
      {(void **)&s->task_kvh, B * c->n_kv_head, sizeof(uint32_t)},
      {(void **)&s->mass_part, B * c->n_kv_head, sizeof(double)},
      {(void **)&s->ent_part, B * c->n_kv_head, sizeof(double)},
      {(void **)&s->sink_mass, B * c->n_layer, sizeof(float)},
      {(void **)&s->entropy, B * c->n_layer, sizeof(float)},
      {(void **)&s->probe, B, sizeof(uint32_t)},
      {(void **)&s->sp_kept, B * c->n_layer, sizeof(uint64_t)},
      {(void **)&s->sp_rows, B, sizeof(uint32_t)},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (want[i].n > SIZE_MAX / want[i].size ||
        !(*want[i].dst = calloc(want[i].n, want[i].size)))
      goto nomem;
  }
  /* all the query heads' scores at once, unless that takes over 4 MB a
   * thread (long contexts): then as many KV heads' as fit, at least one */
  const uint32_t group = c->n_head / c->n_kv_head;
  s->att_heads = c->n_head;
  if ((size_t)c->n_head * T * sizeof(float) > ((size_t)4 << 20)) {
    size_t fit = ((size_t)4 << 20) / (T * sizeof(float)) / group * group;
    s->att_heads = fit > group ? (uint32_t)fit : group;
  }
  for (uint32_t t = 0; t < s->n_threads; t++) {
    struct sk__tscratch *ts = &s->ts[t];
    if (!(ts->kr = malloc(T * c->head_dim * sizeof(float))) ||
        !(ts->kq = malloc(T * sizeof *ts->kq)) || !(ts->qw = malloc((size_t)s->att_heads * c->head_dim * sizeof(float))) ||
        !(ts->qs = malloc((size_t)s->att_heads * c->head_dim * sizeof(float))) ||
        !(ts->att = malloc(T * s->att_heads * sizeof(float))) ||
        !(ts->vp = malloc(T * sizeof *ts->vp)) ||
        !(ts->kp = malloc(T * sizeof *ts->kp)) || !(ts->sp = malloc(T * sizeof *ts->sp)) ||
        !(ts->cs = malloc(2 * half * sizeof(float))) ||
        !(ts->sn = malloc(2 * half * sizeof(float))))
      goto nomem;
    for (size_t p = 0; p < T; p++) ts->kq[p] = ts->kr + p * c->head_dim;
  }
  if (m->sparse) {
    int rc = sk_sparse_work_init(&s->sp, c->hidden_dim, c->dim, s->n_threads, err);
    if (rc < 0) {
      sk_scratch_free(s);
      return rc;
    }
  }
  s->rope_valid = 0;
  s->rope_freq_scale = 0.0f;
  *ret = s;
  return 0;
nomem:
  sk_scratch_free(s);
  return sk_error_set(err, SK_ERR_NO_MEMORY,
                      "cannot allocate scratch for batch %u, context %u",
                      max_batch, max_ctx);
}

/* ---- small kernels -------------------------------------------------- */

/* y = (x * 1/sqrtf(mean(x^2) + eps)) * w, as ggml_rms_norm then ggml_mul. */
static void sk__rmsnorm(float *y, const float *x, const float *w, uint32_t n,
                        float eps) {
  double sum = 0.0;
  for (uint32_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
  const float mean = (float)(sum / n);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (uint32_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

/* sk__rmsnorm of rows rows of x (stride ld) into y (stride ld): the sums
 * of 8 rows side by side, each in its own order, as 8 chains of double
 * additions instead of one (a row's sum alone is bound by the latency of
 * its additions). */
static void sk__rmsnorm_rows(float *y, const float *x, size_t ld, const float *w, uint32_t rows,
                             uint32_t n, float eps) {
  uint32_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    double sum[8] = {0};
    for (uint32_t j = 0; j < n; j++)
#pragma GCC unroll 8
      for (int r = 0; r < 8; r++) {
        const float v = x[(i + (uint32_t)r) * ld + j];
        sum[r] += (double)(v * v);
      }
    for (int r = 0; r < 8; r++) {
      const float mean = (float)(sum[r] / n);
      const float scale = 1.0f / sqrtf(mean + eps);
      const float *xr = x + (i + (uint32_t)r) * ld;
      float *yr = y + (i + (uint32_t)r) * ld;
      for (uint32_t j = 0; j < n; j++) yr[j] = (xr[j] * scale) * w[j];
    }
  }
  for (; i < rows; i++) sk__rmsnorm(y + i * ld, x + i * ld, w, n, eps);
}

/* cos/sin of position p for freq_scale, as ggml_rope_cache_init:
 * theta = pos; theta *= theta_scale per pair, all in float; divided by
 * the frequency factor, times freq_scale. Laid out for sk_kernels_rope:
 * cs[2i] = cs[2i+1] = cos, sn[2i] = -sin, sn[2i+1] = sin. */
static void sk__rope_angles(const struct sk_model *m, uint32_t p, float freq_scale, float *cs,
                            float *sn) {
  const uint32_t half = m->cfg.rope_dim / 2;
  const float theta_scale = powf(m->cfg.rope_base, -2.0f / (float)m->cfg.rope_dim);
  float theta = (float)p;
  for (uint32_t i = 0; i < half; i++) {
    float ff = m->rope_freqs ? m->rope_freqs[i] : 1.0f;
    float t = freq_scale * (theta / ff);
    cs[2 * i] = cs[2 * i + 1] = cosf(t);
    sn[2 * i + 1] = sinf(t);
    sn[2 * i] = -sn[2 * i + 1];
    theta *= theta_scale;
  }
}

/* cos/sin of stream index t for freq_scale (layout of sk__rope_angles),
 * for keys stored rotated (kvcache.h). Below the trained context these
 * are sk__rope_angles' (ggml's float angles, so that a dense cache gives
 * llama.cpp's bits); from there on each angle is t * freq_i in double,
 * reduced by cos/sin in double: ggml's float products drift by ~1e-7 * t
 * radians, a whole turn by t ~ 10^7, and an endless stream's keys must
 * keep their angles exact relative to every later query. */
static void sk__rope_angles_at(const struct sk_model *m, uint64_t t, float freq_scale, float *cs,
                               float *sn) {
  if (t < m->cfg.n_ctx_train) {
    sk__rope_angles(m, (uint32_t)t, freq_scale, cs, sn);
    return;
  }
  const uint32_t half = m->cfg.rope_dim / 2;
  for (uint32_t i = 0; i < half; i++) {
    double ff = m->rope_freqs ? (double)m->rope_freqs[i] : 1.0;
    double freq = pow((double)m->cfg.rope_base, -2.0 * i / (double)m->cfg.rope_dim);
    double a = (double)t * (freq / ff * (double)freq_scale);
    cs[2 * i] = cs[2 * i + 1] = (float)cos(a);
    sn[2 * i + 1] = (float)sin(a);
    sn[2 * i] = -sn[2 * i + 1];
  }
}

/* Extends the cos/sin tables to positions < n for freq_scale. */
static void sk__rope_tables(struct sk_scratch *s, uint32_t n, float freq_scale) {
  const uint32_t half = s->m->cfg.rope_dim / 2;
  if (s->rope_freq_scale != freq_scale) {
    s->rope_valid = 0;
    s->rope_freq_scale = freq_scale;
  }
  for (uint32_t p = s->rope_valid; p < n; p++)
    sk__rope_angles(s->m, p, freq_scale, s->rope_cos + (size_t)p * 2 * half,
                    s->rope_sin + (size_t)p * 2 * half);
  if (n > s->rope_valid) s->rope_valid = n;
}

/* Rotates one head x (head_dim floats) by the angles cs/sn (layout of
 * sk__rope_angles), writing y (may equal x). */
static void sk__rope(float *y, const float *x, const struct sk_model_config *c, const float *cs,
                     const float *sn) {
  sk_kernels_rope(y, x, cs, sn, c->rope_dim);
  if (y != x) memcpy(y + c->rope_dim, x + c->rope_dim, (c->head_dim - c->rope_dim) * sizeof *y);
}

/* ---- matrix products on the pool ------------------------------------ */

/* Up to three products sharing one input: y_j = x W_j^T. */
struct sk__mm {
  const struct sk_act *x;
  uint32_t n_w;
  const struct sk_wmat *w[3];
  float *const *y[3];    /* (x->n) row pointers each */
  uint32_t chunk;        /* output rows per task */
  uint32_t first[4];     /* first task of each product; first[n_w] = total */
};

static void sk__mm_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__mm *mm = ctx;
  uint32_t j = 0;
  while (task >= mm->first[j + 1]) j++;
  uint32_t o0 = (task - mm->first[j]) * mm->chunk;
  uint32_t o1 = o0 + mm->chunk < mm->w[j]->rows ? o0 + mm->chunk : mm->w[j]->rows;
  sk_kernels_matmul(mm->w[j], mm->x, mm->y[j], o0, o1);
}

/* Runs the products of mm (x, w, y, n_w set) on the pool: the outputs are
 * cut into chunks of SK__MM_ALIGN-multiple rows, about four per thread. */
static void sk__matmuls(struct sk_scratch *s, struct sk__mm *mm) {
  uint64_t total = 0;
  for (uint32_t j = 0; j < mm->n_w; j++) total += mm->w[j]->rows;
  uint64_t per = s->n_threads == 1 ? total : total / (4u * s->n_threads) + 1;
  per = (per + SK__MM_ALIGN - 1) / SK__MM_ALIGN * SK__MM_ALIGN;
  mm->chunk = (uint32_t)(per < UINT32_MAX ? per : UINT32_MAX - SK__MM_ALIGN);
  mm->first[0] = 0;
  for (uint32_t j = 0; j < mm->n_w; j++)
    mm->first[j + 1] = mm->first[j] + (mm->w[j]->rows + mm->chunk - 1) / mm->chunk;
  sk_pool_run(s->pool, sk__mm_task, mm, mm->first[mm->n_w]);
}

/* The int8 activations products with some of ws[0..n_w) need: SK__Q8
 * (32-element blocks, legacy types) and/or SK__Q8K (Q8_K, K-quants and
 * IQ4_XS: a file mixes them), or 0. */
#define SK__Q8 1u
#define SK__Q8K 2u
static unsigned sk__any_q8(const struct sk_wmat *const *ws, uint32_t n_w) {
  unsigned q = 0;
  for (uint32_t j = 0; j < n_w; j++)
    q |= (sk_wmat_needs_q8(ws[j]) ? SK__Q8 : 0u) | (sk_wmat_needs_q8k(ws[j]) ? SK__Q8K : 0u);
  return q;
}

/* Rows per task of the row-wise work done on the pool (sk__prep, silu):
 * the rows spread over the threads, at most 8 (the rows sk__rmsnorm_rows
 * sums side by side; fewer give the same bits, sk__rmsnorm's). */
static uint32_t sk__prep_rows(const struct sk_scratch *s, uint32_t n) {
  const uint32_t per = (n + s->n_threads - 1) / s->n_threads; /* >= 1: n >= 1 */
  return per > 8 ? 8 : per;
}

/* Quantizes rows r0..r1 of in (row i at in + i * ld, cols wide) into the
 * scratch's int8 activations s->aq/ad/as at the same rows: the int8
 * products' input (kernels.h, sk_kernels_quantize_rows). */
static void sk__quantize_scratch(const struct sk_scratch *s, const float *in, size_t ld,
                                 uint32_t r0, uint32_t r1, uint32_t cols, unsigned q) {
  const size_t nb = cols / SK_QK;
  if (q & SK__Q8)
    sk_kernels_quantize_rows(in + (size_t)r0 * ld, ld, r1 - r0, cols, s->aq + (size_t)r0 * cols,
                             s->ad + r0 * nb, s->as + r0 * nb);
  if (q & SK__Q8K)
    sk_kernels_quantize_rows_k(in + (size_t)r0 * ld, ld, r1 - r0, cols,
                               s->aqk + (size_t)r0 * cols, s->adk + r0 * (cols / SK_QKK),
                               s->ask + r0 * (cols / 16));
}

/* The activations of n rows (f, stride ld, cols wide) with the scratch's
 * quantized copies. */
static struct sk_act sk__act(const struct sk_scratch *s, uint32_t n, uint32_t cols,
                             const float *f, size_t ld) {
  return (struct sk_act){.n = n, .cols = cols, .f = f, .ldf = ld, .q = s->aq, .d = s->ad,
                         .s = s->as, .kq = s->aqk, .kd = s->adk, .ks = s->ask};
}

/* The row-wise work before a product, on the pool: for each of the n
 * rows (independent of one another; each row gets exactly the operations
 * of the one-thread code, in its order), x += add (the residual, when add
 * is set), y = rmsnorm(x) * w (when w is set), then the product's input
 * (y, or x without w) quantized into s->aq/ad/as (when q). x, add and y
 * are (n, ld); the rows are cols wide. */
struct sk__prep {
  struct sk_scratch *s;
  float *x;
  const float *add;
  const float *w;
  float *y;
  size_t ld;
  uint32_t n, cols;
  unsigned q;     /* SK__Q8 | SK__Q8K */
  uint32_t chunk; /* rows per task */
};

static void sk__prep_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__prep *p = ctx;
  const struct sk_scratch *s = p->s;
  const uint32_t r0 = task * p->chunk;
  const uint32_t r1 = r0 + p->chunk < p->n ? r0 + p->chunk : p->n;
  float *x = p->x + (size_t)r0 * p->ld;
  if (p->add) {
    const float *add = p->add + (size_t)r0 * p->ld;
    for (size_t j = 0; j < (size_t)(r1 - r0) * p->ld; j++) x[j] += add[j];
  }
  if (p->w)
    sk__rmsnorm_rows(p->y + (size_t)r0 * p->ld, x, p->ld, p->w, r1 - r0, p->cols,
                     s->m->cfg.rms_eps);
  if (p->q) sk__quantize_scratch(s, p->w ? p->y : p->x, p->ld, r0, r1, p->cols, p->q);
}

/* Runs p (s, x, add, w, y, ld, n, cols set; q from ws, chunk here) on the pool and
 * returns the activations of the products with ws[0..n_w): the normed
 * rows y (x without w), quantized if any of ws wants int8. */
static struct sk_act sk__prep(struct sk__prep *p, const struct sk_wmat *const *ws,
                              uint32_t n_w) {
  struct sk_scratch *s = p->s;
  p->q = sk__any_q8(ws, n_w);
  p->chunk = sk__prep_rows(s, p->n);
  if (p->add || p->w || p->q) /* (F32 weights after attention: nothing to do) */
    sk_pool_run(s->pool, sk__prep_task, p, (p->n + p->chunk - 1) / p->chunk);
  return sk__act(s, p->n, p->cols, p->w ? p->y : p->x, p->ld);
}

/* Row pointers base + i * ld for i < n, in s->rows + off. */
static float *const *sk__rows(struct sk_scratch *s, uint32_t off, float *base, size_t ld,
                              uint32_t n) {
  for (uint32_t i = 0; i < n; i++) s->rows[off + i] = base + (size_t)i * ld;
  return s->rows + off;
}

/* ---- attention ------------------------------------------------------ */

/* Per sequence, per KV head. The positions each query sees are those of
 * one-token-at-a-time processing (StreamingLLM cache positions). Number
 * the tokens in stream order: the nb = nr + n_evicted that were resident
 * before this chunk's make_room (the sinks at order[0 .. min(S, nr)),
 * the evicted ones at the tail of the free list, order[n_slots -
 * n_evicted .. n_slots), the rest of the window at order[S .. nr)), then
 * the chunk's n tokens. Query i (index
 * A = nb + i) then sees, with cap = capacity - 1 and
 * shift = max(0, A - cap) window tokens already gone for it:
 *
 *   the sinks, indices 0 .. S-1, at positions 0 .. S-1;
 *   indices S + shift .. A (A is itself), at positions index - shift.
 *
 * Without evictions shift is 0 and every token sits at its index.
 *
 * Rotated keys (every policy but h2o / sink_h2o; kvcache.h): a key is
 * stored rotated at its stream index t. RoPE scores depend only on the
 * distance, <R(a) q, R(b) k> = <q, R(b - a) k>, so query P meets a key at
 * position p when it is rotated at P + (t - p). Within the window (and
 * the whole of a dense cache) t - p is the query's own T - P, so the
 * query is rotated once at its stream index T; the sinks, whose t - p is
 * t0 (the stream index of position 0), get a second rotation at P + t0.
 * No cached key is touched: a step costs O(1) rotations, not
 * O(context).
 *
 * Unrotated keys (h2o, sink_h2o: an eviction in the middle moves later
 * tokens down, so t - p differs from token to token): keys are rotated
 * at their position into kr, and rotated again only when the shift
 * changes. */
struct sk__att {
  struct sk_scratch *s;
  uint32_t layer;
  uint32_t kvh_per; /* KV heads per task of a cache with rotated keys */
};

/* Rotates the keys ts->kp[p] for positions p0 <= p < p1 into ts->kr. */
static void sk__rope_keys(const struct sk_scratch *s, const struct sk__seq *sq,
                          struct sk__tscratch *ts, uint32_t p0, uint32_t p1) {
  const struct sk_model_config *c = &s->m->cfg;
  const uint32_t hd = c->head_dim, rd = c->rope_dim;
  const float *const *src = (const float *const *)ts->kp;
  if (sq->f16) { /* halves to floats in kr, then rotated in place */
    for (uint32_t p = p0; p < p1; p++) {
      const uint16_t *h = ts->kp[p];
      for (uint32_t j = 0; j < hd; j++) ts->kr[(size_t)p * hd + j] = sk_f16_to_f32(h[j]);
    }
    src = ts->kq;
  }
  if (sq->freq_scale == s->rope_freq_scale) {
    sk_kernels_rope_rows(ts->kr + (size_t)p0 * hd, src + p0, s->rope_cos + (size_t)p0 * rd,
                         s->rope_sin + (size_t)p0 * rd, p1 - p0, rd, hd);
    return;
  }
  for (uint32_t p = p0; p < p1; p++) { /* a cache with its own scale */
    sk__rope_angles(s->m, p, sq->freq_scale, ts->cs, ts->sn);
    sk_kernels_rope_rows(ts->kr + (size_t)p * hd, src + p, ts->cs, ts->sn, 1, rd, hd);
  }
}

/* Writes bytes [b0, b1) of each of sequence sq's new key and value rows
 * (this layer's, as attention read them: floats or halves) into the
 * cache slots they take. Called by the attention task that read those
 * bytes, after its last query: with evictions inside a chunk, the slots
 * held old keys the queries still read. */
static void sk__kv_write(const struct sk_scratch *s, const struct sk__seq *sq, uint32_t layer,
                         size_t b0, size_t b1) {
  const struct sk_kv_step *kv = &sq->kv;
  char *kl = sk_kv_layer_k(sq->in->kv, layer), *vl = sk_kv_layer_v(sq->in->kv, layer);
  const size_t esz = sq->f16 ? sizeof(uint16_t) : sizeof(float);
  const char *k = sq->f16 ? (const char *)s->k16 : (const char *)s->k;
  const char *v = sq->f16 ? (const char *)s->v16 : (const char *)s->v;
  for (uint32_t j = 0; j < sq->in->n; j++) {
    const size_t slot = kv->order[sq->nr + j]; /* a free slot until commit */
    const size_t r = (size_t)(sq->row0 + j) * s->m->cfg.kv_dim * esz;
    memcpy(kl + slot * kv->row_bytes + b0, k + r + b0, b1 - b0);
    memcpy(vl + slot * kv->row_bytes + b0, v + r + b0, b1 - b0);
  }
}

/* The attention of a cache that accumulates H2O scores (unrotated keys):
 * one task per sequence, all KV heads in order. */
static void sk__att_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__att *a = ctx;
  struct sk_scratch *s = a->s;
  const struct sk_model *m = s->m;
  const struct sk_model_config *c = &m->cfg;
  const uint32_t hd = c->head_dim, D = c->kv_dim, rd = c->rope_dim;
  const uint32_t group = c->n_head / c->n_kv_head;
  const float scale = 1.0f / sqrtf((float)hd);
  const uint32_t si = s->task_seq[task];
  const struct sk__seq *sq = &s->seqs[si];
  const struct sk_kv_step *kv = &sq->kv;
  const bool scores = kv->scores;
  const uint32_t e = sq->in->n_evicted, nr = sq->nr, nb = nr + e;
  const uint32_t sr = sq->n_sink < nr ? sq->n_sink : nr; /* resident sinks */
  const uint32_t cap = kv->capacity - 1;
  const char *kl = sk_kv_layer_k(sq->in->kv, a->layer), *vl = sk_kv_layer_v(sq->in->kv, a->layer);
  const size_t rb = kv->row_bytes;
  struct sk__tscratch *ts = &s->ts[thread];
  const bool tables = sq->freq_scale == s->rope_freq_scale;
  /* one KV head, or all of them for a cache that accumulates scores (one
   * thread adds to its score array, in head order) */
  const uint32_t kvh0 = s->task_kvh[task], kvh1 = scores ? c->n_kv_head : kvh0 + 1;
  for (uint32_t kvh = kvh0; kvh < kvh1; kvh++) {
  const size_t off = (size_t)kvh * hd * (sq->f16 ? 2 : 4); /* bytes into a row */
  double mass_sum = 0.0, ent_sum = 0.0;

/* cos/sin of position p into cs/sn */
#define SK__ANGLES(p)                                                       \
  const float *cs = s->rope_cos + (size_t)(p) * rd;                         \
  const float *sn = s->rope_sin + (size_t)(p) * rd;                         \
  if (!tables) {                                                            \
    sk__rope_angles(m, (p), sq->freq_scale, ts->cs, ts->sn);                \
    cs = ts->cs;                                                            \
    sn = ts->sn;                                                            \
  }
/* cache slot of the resident or evicted token with stream-order index
 * idx, sr <= idx < nb: make_room put the evicted slots, oldest first, at
 * the tail of the free list (kvcache.h) */
#define SK__SLOT(idx)                                                  \
  ((idx) - sr < e ? kv->order[kv->n_slots - e + ((idx) - sr)] \
                  : kv->order[(idx) - e])

  for (uint32_t p = 0; p < sr; p++) {
    const uint32_t slot = kv->order[p];
    ts->kp[p] = kl + slot * rb + off;
    ts->vp[p] = vl + slot * rb + off;
    ts->sp[p] = slot;
  }
  sk__rope_keys(s, sq, ts, 0, sr);
  uint32_t rot_shift = UINT32_MAX, rot_next = sr; /* positions < rot_next done */
  for (uint32_t i = 0; i < sq->in->n; i++) {
    const uint32_t row = sq->row0 + i;
    const uint32_t A = nb + i, shift = A > cap ? A - cap : 0, P = A - shift;
    if (shift != rot_shift) {
      rot_shift = shift;
      rot_next = sr;
    }
    for (uint32_t p = rot_next; p <= P; p++) {
      const uint32_t idx = p + shift;
      const void *k, *v;
      if (idx < nb) {
        const uint32_t slot = SK__SLOT(idx);
        k = kl + slot * rb;
        v = vl + slot * rb;
        ts->sp[p] = slot;
      } else { /* this chunk's rows, as the cache will hold them */
        const size_t r = (size_t)(sq->row0 + idx - nb) * D;
        k = sq->f16 ? (const void *)(s->k16 + r) : (const void *)(s->k + r);
        v = sq->f16 ? (const void *)(s->v16 + r) : (const void *)(s->v + r);
        ts->sp[p] = kv->order[nr + (idx - nb)]; /* the slot it is written to */
      }
      ts->kp[p] = (const char *)k + off;
      ts->vp[p] = (const char *)v + off;
    }
    sk__rope_keys(s, sq, ts, rot_next, P + 1);
    rot_next = P + 1;

    SK__ANGLES(P);
    for (uint32_t g = 0; g < group; g++) {
      const uint32_t h = kvh * group + g; /* ggml's broadcast: q head h -> kv h/g */
      float *qh = s->q + (size_t)row * c->q_dim + (size_t)h * hd;
      sk__rope(qh, qh, c, cs, sn);
      sk_kernels_scores(qh, ts->kq, P + 1, hd, ts->att);
      const bool last = i + 1 == sq->in->n;
      double ent = 0.0;
      sk_kernels_softmax(ts->att, P + 1, scale, last ? &ent : NULL);
      /* H2O (kvcache.h): every probability adds to its position's score,
       * summed over query heads and layers */
      if (scores)
        for (uint32_t p = 0; p <= P; p++) kv->score[ts->sp[p]] += ts->att[p];
      if (last) { /* diagnostics of the sequence's last token */
        const uint32_t probe = sq->probe < P + 1 ? sq->probe : P + 1;
        double mass = 0.0;
        for (uint32_t p = 0; p < probe; p++) mass += (double)ts->att[p];
        mass_sum += mass;
        ent_sum += ent;
      }
      float *out = s->att_out + (size_t)row * c->q_dim + (size_t)h * hd;
      if (sq->f16)
        sk_kernels_wsum_f16(out, ts->att, (const uint16_t *const *)ts->vp, P + 1, hd);
      else
        sk_kernels_wsum(out, ts->att, (const float *const *)ts->vp, P + 1, hd);
    }
  }
  s->mass_part[(size_t)si * c->n_kv_head + kvh] = mass_sum;
  s->ent_part[(size_t)si * c->n_kv_head + kvh] = ent_sum;
  } /* kv heads */
  sk__kv_write(s, sq, a->layer, 0, rb);
#undef SK__ANGLES
#undef SK__SLOT
}

/* Cache slots a rotated-keys task walks at a time, all its heads over
 * one block before the next (sk__att_rot_task). */
#define SK__ATT_BLOCK 32u

/* Pointers to one head's slice (off bytes into each row) of the rows
 * rows[p0..p1): rows + p0 itself when the rows already point at the
 * slice (one: a task of one KV head), else written into bp. */
static const void *const *sk__att_slices(const void **rows, uint32_t p0, uint32_t p1, bool one,
                                        size_t off, const void **bp) {
  if (one) return rows + p0;
  for (uint32_t p = p0; p < p1; p++) bp[p - p0] = (const char *)rows[p] + off;
  return bp;
}

/* The attention of a cache with rotated keys over KV heads [task_kvh,
 * + kvh_per) of one sequence: the scores of every query head, block by
 * block of slots, then the softmaxes, then the weighted sums block by
 * block, each going on from the last block's (sk_kernels_wsum_add). The
 * same bits as one head's walk over all slots: a score depends only on
 * its query and key, and each sum adds in slot order. The rows of a
 * block are read whole (heads side by side) while they are in cache;
 * one head at a time read 256 of every 3 KB row, 3 KB apart, from DRAM
 * (16 sessions of the 110M model: attention took ~14% less CPU time
 * with blocks of 32, measured; prefetching the next block did not
 * help). */
static void sk__att_rot_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__att *a = ctx;
  struct sk_scratch *s = a->s;
  const struct sk_model_config *c = &s->m->cfg;
  const uint32_t hd = c->head_dim, D = c->kv_dim, rd = c->rope_dim, T = s->max_ctx;
  const uint32_t group = c->n_head / c->n_kv_head;
  const float scale = 1.0f / sqrtf((float)hd);
  const uint32_t si = s->task_seq[task];
  const struct sk__seq *sq = &s->seqs[si];
  const struct sk_kv_step *kv = &sq->kv;
  const uint32_t e = sq->in->n_evicted, nr = sq->nr, nb = nr + e;
  const uint32_t sr = sq->n_sink < nr ? sq->n_sink : nr; /* resident sinks */
  const uint32_t cap = kv->capacity - 1;
  struct sk__tscratch *ts = &s->ts[thread];
  const uint32_t kvh0 = s->task_kvh[task];
  const uint32_t kvh1 = kvh0 + a->kvh_per < c->n_kv_head ? kvh0 + a->kvh_per : c->n_kv_head;
  const uint32_t h0 = kvh0 * group, nh = (kvh1 - kvh0) * group; /* query heads */
  const size_t esz = sq->f16 ? sizeof(uint16_t) : sizeof(float);
  const size_t b0 = (size_t)kvh0 * hd * esz, b1 = (size_t)kvh1 * hd * esz; /* of a row */
  const void *bp[SK__ATT_BLOCK]; /* one head's slice of a block's rows */
  /* A task of one KV head reads only its slice of each row, so there is
   * no block to share: its pointers point at the slice and it walks all
   * the slots in one go (small heads pay for every kernel call). */
  const bool one = kvh1 - kvh0 == 1;
  const size_t at = one ? b0 : 0; /* bytes into a row of ts->kp / ts->vp */
  /* the layer's rows, read once (kvstep.h) */
  const char *kl = (const char *)sk_kv_layer_k(sq->in->kv, a->layer) + at;
  const char *vl = (const char *)sk_kv_layer_v(sq->in->kv, a->layer) + at;
  const size_t rb = kv->row_bytes;
  const uint32_t *order = kv->order, n_slots = kv->n_slots;

  for (uint32_t kvh = kvh0; kvh < kvh1; kvh++) {
    s->mass_part[(size_t)si * c->n_kv_head + kvh] = 0.0;
    s->ent_part[(size_t)si * c->n_kv_head + kvh] = 0.0;
  }
  /* ts->kp / ts->vp: whole rows, as sk__att_task's at offset 0 */
  for (uint32_t p = 0; p < sr; p++) {
    ts->kp[p] = kl + order[p] * rb;
    ts->vp[p] = vl + order[p] * rb;
  }
  uint32_t rot_shift = UINT32_MAX, rot_next = sr; /* positions < rot_next done */
  for (uint32_t i = 0; i < sq->in->n; i++) {
    const uint32_t row = sq->row0 + i;
    const uint32_t A = nb + i, shift = A > cap ? A - cap : 0, P = A - shift, np = P + 1;
    if (shift != rot_shift) {
      rot_shift = shift;
      rot_next = sr;
    }
    for (uint32_t p = rot_next; p <= P; p++) {
      const uint32_t idx = p + shift;
      if (idx < nb) {
        const uint32_t slot = idx - sr < e ? order[n_slots - e + (idx - sr)] : order[idx - e];
        ts->kp[p] = kl + slot * rb;
        ts->vp[p] = vl + slot * rb;
      } else { /* this chunk's rows, as the cache will hold them */
        const size_t r = (size_t)(sq->row0 + idx - nb) * D;
        ts->kp[p] = (sq->f16 ? (const char *)(s->k16 + r) : (const char *)(s->k + r)) + at;
        ts->vp[p] = (sq->f16 ? (const char *)(s->v16 + r) : (const char *)(s->v + r)) + at;
      }
    }
    rot_next = P + 1;
    const uint32_t blk = one ? np : SK__ATT_BLOCK;

    for (uint32_t g = 0; g < nh; g++) {
      const float *qh = s->q + (size_t)row * c->q_dim + (size_t)(h0 + g) * hd;
      sk__rope(ts->qw + (size_t)g * hd, qh, c, s->row_cos + (size_t)row * rd,
               s->row_sin + (size_t)row * rd);
      if (sr)
        sk__rope(ts->qs + (size_t)g * hd, qh, c, s->sink_cos + (size_t)row * rd,
                 s->sink_sin + (size_t)row * rd);
    }
    for (uint32_t p0 = 0; p0 < np; p0 += blk) {
      const uint32_t p1 = np - p0 < blk ? np : p0 + blk;
      for (uint32_t g = 0; g < nh; g++) {
        const void *const *bk =
            sk__att_slices(ts->kp, p0, p1, one, (size_t)((h0 + g) / group) * hd * esz, bp);
        float *att = ts->att + (size_t)g * T;
        /* sinks (p < sr) meet the query rotated for them; each score
         * depends only on its query and key, not on its neighbours */
        const uint32_t ps = sr < p0 ? p0 : sr < p1 ? sr : p1;
        if (ps > p0) {
          if (sq->f16)
            sk_kernels_scores_f16(ts->qs + (size_t)g * hd, (const uint16_t *const *)bk, ps - p0,
                                  hd, att + p0);
          else
            sk_kernels_scores(ts->qs + (size_t)g * hd, (const float *const *)bk, ps - p0, hd,
                              att + p0);
        }
        if (p1 > ps) {
          if (sq->f16)
            sk_kernels_scores_f16(ts->qw + (size_t)g * hd,
                                  (const uint16_t *const *)bk + (ps - p0), p1 - ps, hd, att + ps);
          else
            sk_kernels_scores(ts->qw + (size_t)g * hd, (const float *const *)bk + (ps - p0),
                              p1 - ps, hd, att + ps);
        }
      }
    }
    const bool last = i + 1 == sq->in->n;
    for (uint32_t g = 0; g < nh; g++) {
      float *att = ts->att + (size_t)g * T;
      double ent = 0.0;
      sk_kernels_softmax(att, np, scale, last ? &ent : NULL);
      if (last) { /* diagnostics of the sequence's last token */
        const uint32_t probe = sq->probe < np ? sq->probe : np;
        double mass = 0.0;
        for (uint32_t p = 0; p < probe; p++) mass += (double)att[p];
        const size_t kh = (size_t)si * c->n_kv_head + (h0 + g) / group;
        s->mass_part[kh] += mass;
        s->ent_part[kh] += ent;
      }
    }
    for (uint32_t p0 = 0; p0 < np; p0 += blk) {
      const uint32_t p1 = np - p0 < blk ? np : p0 + blk;
      for (uint32_t g = 0; g < nh; g++) {
        const void *const *bv =
            sk__att_slices(ts->vp, p0, p1, one, (size_t)((h0 + g) / group) * hd * esz, bp);
        const float *att = ts->att + (size_t)g * T + p0;
        float *out = s->att_out + (size_t)row * c->q_dim + (size_t)(h0 + g) * hd;
        if (sq->f16) {
          if (p0) sk_kernels_wsum_add_f16(out, att, (const uint16_t *const *)bv, p1 - p0, hd);
          else sk_kernels_wsum_f16(out, att, (const uint16_t *const *)bv, p1 - p0, hd);
        } else {
          if (p0) sk_kernels_wsum_add(out, att, (const float *const *)bv, p1 - p0, hd);
          else sk_kernels_wsum(out, att, (const float *const *)bv, p1 - p0, hd);
        }
      }
    }
  }
  /* this task's heads of the new keys and values (no other task reads
   * those bytes) */
  sk__kv_write(s, sq, a->layer, b0, b1);
}

/* One attention task: sk__att_rot_task's for a cache with rotated keys,
 * sk__att_task's for one that accumulates scores. */
static void sk__att_any_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__att *a = ctx;
  if (a->s->seqs[a->s->task_seq[task]].rotated) sk__att_rot_task(ctx, task, thread);
  else sk__att_task(ctx, task, thread);
}

/* ---- silu ------------------------------------------------------------ */

/* hb = silu(hb) * hb2 for chunk rows per task, then those rows
 * quantized for the down product (when q). */
struct sk__silu {
  struct sk_scratch *s;
  uint32_t n;     /* rows */
  uint32_t chunk; /* rows per task (sk__prep_rows) */
  unsigned q;     /* SK__Q8 | SK__Q8K */
};

static void sk__silu_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__silu *a = ctx;
  const struct sk_scratch *s = a->s;
  const uint32_t H = s->m->cfg.hidden_dim;
  const uint32_t i0 = task * a->chunk;
  const uint32_t i1 = i0 + a->chunk < a->n ? i0 + a->chunk : a->n;
  sk_kernels_swiglu(s->hb + (size_t)i0 * H, s->hb2 + (size_t)i0 * H, (size_t)(i1 - i0) * H);
  if (a->q) sk__quantize_scratch(s, s->hb, H, i0, i1, H, a->q);
}

/* ---- what the architecture adds before RoPE ------------------------- */

/* Reorders each head of x (n_heads heads of head_dim) from NEOX's pairs
 * (x[i], x[i + h]), h = rope_dim / 2, to adjacent ones (x[2i], x[2i+1]);
 * elements from rope_dim on stay. tmp holds head_dim floats. */
static void sk__neox_interleave(float *x, uint32_t n_heads, const struct sk_model_config *c,
                                float *tmp) {
  const uint32_t h = c->rope_dim / 2;
  for (uint32_t k = 0; k < n_heads; k++) {
    float *xh = x + (size_t)k * c->head_dim;
    for (uint32_t i = 0; i < h; i++) {
      tmp[2 * i] = xh[i];
      tmp[2 * i + 1] = xh[i + h];
    }
    memcpy(xh, tmp, (size_t)c->rope_dim * sizeof *xh);
  }
}

/* The n rows of s->q, s->k, s->v as the architecture wants them before
 * RoPE, in llama.cpp's order: + the biases (qwen2: ggml_add after the
 * product), then RMSNorm of each query and key head with the head's
 * weight (qwen3: ggml_rms_norm over head_dim, eps rms_eps, ggml_mul),
 * then a NEOX model's reordering (model.h). Nothing for a llama model
 * without biases. */
static void sk__qkv_arch(struct sk_scratch *s, const struct sk__layer *L, uint32_t n) {
  const struct sk_model_config *c = &s->m->cfg;
  if (!c->qkv_bias && !c->qk_norm && c->rope_style == SK_ROPE_NORM) return;
  const uint32_t hd = c->head_dim;
  for (uint32_t r = 0; r < n; r++) {
    float *q = s->q + (size_t)r * c->q_dim, *k = s->k + (size_t)r * c->kv_dim;
    float *v = s->v + (size_t)r * c->kv_dim;
    if (c->qkv_bias) {
      for (uint32_t j = 0; j < c->q_dim; j++) q[j] += L->bq[j];
      for (uint32_t j = 0; j < c->kv_dim; j++) k[j] += L->bk[j];
      for (uint32_t j = 0; j < c->kv_dim; j++) v[j] += L->bv[j];
    }
    if (c->qk_norm) {
      for (uint32_t h = 0; h < c->n_head; h++)
        sk__rmsnorm(q + (size_t)h * hd, q + (size_t)h * hd, L->q_norm, hd, c->rms_eps);
      for (uint32_t h = 0; h < c->n_kv_head; h++)
        sk__rmsnorm(k + (size_t)h * hd, k + (size_t)h * hd, L->k_norm, hd, c->rms_eps);
    }
    if (c->rope_style == SK_ROPE_NEOX) {
      sk__neox_interleave(q, c->n_head, c, s->head_tmp);
      sk__neox_interleave(k, c->n_kv_head, c, s->head_tmp);
    }
  }
}

/* ---- forward -------------------------------------------------------- */

/* Formats the error of sequence i (prefixed with its index when the batch
 * has several). */
static int sk__seq_error(struct sk_error *err, uint32_t n_seqs, uint32_t i, int code,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int sk__seq_error(struct sk_error *err, uint32_t n_seqs, uint32_t i, int code,
                         const char *fmt, ...) {
  char msg[sizeof err->message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n_seqs > 1) return sk_error_set(err, code, "sequence %u: %s", i, msg);
  return sk_error_set(err, code, "%s", msg);
}

static int sk__check_seq(const struct sk_model *m, const struct sk_scratch *s,
                         const struct sk_seq *q, uint32_t n_seqs, uint32_t i,
                         struct sk_error *err) {
  const struct sk_model_config *c = &m->cfg;
  struct sk_kv_step kv;
  sk_kv_step_view(q->kv, &kv);
  if (kv.n_layer != c->n_layer || kv.kv_dim != c->kv_dim)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "cache shape n_layer %u x kv_dim %u does not match "
                         "the model's %u x %u",
                         kv.n_layer, kv.kv_dim, c->n_layer, c->kv_dim);
  if (q->n == 0)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST, "no tokens to process");
  if (q->n > s->max_batch)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "batch of %u tokens exceeds the maximum batch %u", q->n, s->max_batch);
  for (uint32_t j = 0; j < q->n; j++)
    if (q->tokens[j] < 0 || (uint32_t)q->tokens[j] >= c->n_vocab)
      return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                           "token %u of the batch is id %d, outside the "
                           "vocabulary 0..%u",
                           j, q->tokens[j], c->n_vocab - 1);
  const uint32_t nr = kv.n_resident;
  if (q->n > kv.capacity - nr)
    return sk__seq_error(err, n_seqs, i, SK_ERR_CONTEXT_FULL, "context full: needs %u, %u of %u free",
                         q->n, kv.capacity - nr, kv.capacity);
  if ((uint64_t)nr + q->n > s->max_ctx)
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "%u resident + %u new tokens exceed the scratch "
                         "context %u",
                         nr, q->n, s->max_ctx);
  if (q->sparse_thr && (!m->sparse || !s->sp.idx))
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "sparse MLP asked for, but the model was not prepared for it "
                         "(sk_model_sparse_prepare before the scratch)");
  if (q->n_evicted &&
      (!kv.chunk_evicts || q->n_evicted > q->n || nr + q->n != kv.capacity || nr < kv.n_sink))
    return sk__seq_error(err, n_seqs, i, SK_ERR_BAD_REQUEST,
                         "n_evicted %u does not describe a streaming or window make_room "
                         "for %u tokens",
                         q->n_evicted, q->n);
  return 0;
}

/* The thresholds a sequence's MLP runs with: its sparse_thr for a decode
 * step (one token) and for scoring (every row's logits), NULL (dense) for
 * a prefill of more than one token. Prefill is batched and compute-bound:
 * skipping neurons one row at a time there costs more than it saves, and
 * the prompt's cache entries are then the dense model's. */
static const float *sk__sparse_thr(const struct sk_seq *q) {
  return q->n > 1 && !q->all_logits ? NULL : q->sparse_thr;
}

int sk_model_forward_batch(const struct sk_model *m, struct sk_scratch *s,
                           const struct sk_seq *seqs, uint32_t n_seqs, struct sk_error *err) {
  const struct sk_model_config *c = &m->cfg;
  /* Every check happens before any cache is touched. */
  if (s->m != m)
    return sk_error_set(err, SK_ERR_INTERNAL, "scratch was made for another model");
  if (n_seqs == 0) return sk_error_set(err, SK_ERR_BAD_REQUEST, "no sequences to process");
  uint64_t rows = 0;
  for (uint32_t i = 0; i < n_seqs; i++) {
    int rc = sk__check_seq(m, s, &seqs[i], n_seqs, i, err);
    if (rc < 0) return rc;
    rows += seqs[i].n;
  }
  if (rows > s->max_batch)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "batch of %llu tokens exceeds the maximum batch %u",
                        (unsigned long long)rows, s->max_batch);
  const uint32_t n = (uint32_t)rows;
  const uint32_t dim = c->dim, D = c->kv_dim, H = c->hidden_dim;

  /* Sequence layout, and rope tables for the common scale. The rows of
   * dense sequences come first, [0, nd), those with a sparse MLP after
   * them: the dense MLP products then run on one block of rows. */
  uint32_t nd = 0;
  for (uint32_t i = 0; i < n_seqs; i++)
    if (!sk__sparse_thr(&seqs[i])) nd += seqs[i].n;
  uint32_t max_pos = 0, row_d = 0, row_s = nd;
  for (uint32_t i = 0; i < n_seqs; i++) sk_kv_step_view(seqs[i].kv, &s->seqs[i].kv);
  const float common_scale = c->rope_scale / s->seqs[0].kv.rope_scale;
  for (uint32_t i = 0; i < n_seqs; i++) {
    struct sk__seq *sq = &s->seqs[i];
    const struct sk_kv_step *h = &sq->kv;
    const uint32_t row = sk__sparse_thr(&seqs[i]) ? row_s : row_d;
    sq->in = &seqs[i];
    sq->row0 = row;
    sq->nr = h->n_resident;
    sq->n_sink = h->rotated ? h->n_sink : 0;
    sq->freq_scale = c->rope_scale / h->rope_scale;
    sq->probe = h->n_sink ? h->n_sink : SK_ATTN_PROBE_DEFAULT;
    sq->rotated = h->rotated;
    sq->f16 = h->f16;
    if (sq->rotated) { /* the angles of each row (see the attention above) */
      const uint32_t nb = sq->nr + seqs[i].n_evicted, cap = h->capacity - 1;
      const uint64_t t0 = h->first_index;
      for (uint32_t j = 0; j < seqs[i].n; j++) {
        const size_t r = (size_t)(row + j) * c->rope_dim;
        sk__rope_angles_at(m, h->n_seen + j, sq->freq_scale, s->row_cos + r, s->row_sin + r);
        if (sq->n_sink && sq->nr) {
          const uint32_t P = nb + j > cap ? cap : nb + j;
          sk__rope_angles_at(m, P + t0, sq->freq_scale, s->sink_cos + r, s->sink_sin + r);
        }
      }
    }
    if (sk__sparse_thr(&seqs[i])) row_s += seqs[i].n;
    else row_d += seqs[i].n;
    if (sq->freq_scale == common_scale && sq->nr + seqs[i].n > max_pos)
      max_pos = sq->nr + seqs[i].n;
  }
  if (s->rope_freq_scale != common_scale || max_pos > s->rope_valid)
    sk__rope_tables(s, max_pos, common_scale);
  /* Attention tasks: one per sequence and KV head, or one per sequence
   * whose cache accumulates H2O scores. The new tokens' slots start with
   * no score. */
  /* Rotated-keys tasks take kvh_per KV heads each: as many as keep about
   * eight tasks per thread, so that rows are read whole yet the threads
   * stay busy; with one thread there is nobody to keep busy, so all the
   * heads (faster for one session far into a stream; doc/performance.md). */
  uint32_t kvh_per =
      s->n_threads == 1 ? c->n_kv_head : n_seqs * c->n_kv_head / (8 * s->n_threads);
  if (kvh_per > s->att_heads / (c->n_head / c->n_kv_head))
    kvh_per = s->att_heads / (c->n_head / c->n_kv_head);
  if (kvh_per < 1) kvh_per = 1;
  if (kvh_per > c->n_kv_head) kvh_per = c->n_kv_head;
  uint32_t n_tasks = 0;
  for (uint32_t i = 0; i < n_seqs; i++) {
    const struct sk_kv_step *kv = &s->seqs[i].kv;
    if (kv->scores) {
      for (uint32_t j = 0; j < seqs[i].n; j++) kv->score[kv->order[s->seqs[i].nr + j]] = 0.0f;
      s->task_seq[n_tasks] = i;
      s->task_kvh[n_tasks++] = 0;
    } else {
      for (uint32_t h = 0; h < c->n_kv_head; h += kvh_per) {
        s->task_seq[n_tasks] = i;
        s->task_kvh[n_tasks++] = h;
      }
    }
  }

  memset(s->sp_kept, 0, (size_t)n_seqs * c->n_layer * sizeof *s->sp_kept);
  memset(s->sp_rows, 0, (size_t)n_seqs * sizeof *s->sp_rows);
  for (uint32_t i = 0; i < n_seqs; i++)
    for (uint32_t j = 0; j < seqs[i].n; j++)
      sk_dequantize_row(m->tok_embd.type,
                        (const uint8_t *)m->tok_embd.data +
                            (size_t)seqs[i].tokens[j] * m->tok_embd.row_bytes,
                        dim, s->x + (size_t)(s->seqs[i].row0 + j) * dim);

  for (uint32_t l = 0; l < c->n_layer; l++) {
    const struct sk__layer *L = &m->layers[l];
    const struct sk_wmat *qkv[3] = {&L->wq, &L->wk, &L->wv};
    /* the previous layer's residual (its down product), then this layer's norm */
    struct sk__prep pr = {.s = s, .x = s->x, .add = l ? s->xb2 : NULL, .w = L->attn_norm,
                          .y = s->xb, .ld = dim, .n = n, .cols = dim};
    struct sk_act a = sk__prep(&pr, qkv, 3);
    struct sk__mm mm = {.x = &a, .n_w = 3, .w = {&L->wq, &L->wk, &L->wv},
                        .y = {sk__rows(s, 0, s->q, c->q_dim, n), sk__rows(s, n, s->k, D, n),
                              sk__rows(s, 2 * n, s->v, D, n)}};
    sk__matmuls(s, &mm);
    sk__qkv_arch(s, L, n);
    for (uint32_t i = 0; i < n_seqs; i++) {
      const struct sk__seq *sq = &s->seqs[i];
      for (uint32_t j = 0; j < seqs[i].n && sq->rotated; j++) { /* at their stream index */
        const size_t r = sq->row0 + j;
        for (uint32_t h = 0; h < c->n_kv_head; h++) {
          float *kh = s->k + r * D + (size_t)h * c->head_dim;
          sk__rope(kh, kh, c, s->row_cos + r * c->rope_dim, s->row_sin + r * c->rope_dim);
        }
      }
      if (sq->f16) { /* as an f16 cache will hold them; attention reads these */
        const size_t r0 = (size_t)sq->row0 * D, len = (size_t)seqs[i].n * D;
        sk_kernels_to_f16(s->k16 + r0, s->k + r0, len);
        sk_kernels_to_f16(s->v16 + r0, s->v + r0, len);
      }
    }

    struct sk__att at = {.s = s, .layer = l, .kvh_per = kvh_per};
    sk_pool_run(s->pool, sk__att_any_task, &at, n_tasks);
    for (uint32_t i = 0; i < n_seqs; i++) { /* diagnostics: sum over heads, in order */
      double mass = 0.0, ent = 0.0;
      for (uint32_t h = 0; h < c->n_kv_head; h++) {
        mass += s->mass_part[(size_t)i * c->n_kv_head + h];
        ent += s->ent_part[(size_t)i * c->n_kv_head + h];
      }
      s->sink_mass[(size_t)i * c->n_layer + l] = (float)(mass / c->n_head);
      s->entropy[(size_t)i * c->n_layer + l] = (float)(ent / c->n_head);
    }
    /* (each attention task wrote its part of the new keys and values) */
    const struct sk_wmat *wo[1] = {&L->wo};
    pr = (struct sk__prep){.s = s, .x = s->att_out, .ld = c->q_dim, .n = n, .cols = c->q_dim};
    a = sk__prep(&pr, wo, 1);
    mm = (struct sk__mm){.x = &a, .n_w = 1, .w = {&L->wo}, .y = {sk__rows(s, 0, s->xb2, dim, n)}};
    sk__matmuls(s, &mm);

    const struct sk_wmat *gu[2] = {&L->w_gate, &L->w_up};
    pr = (struct sk__prep){.s = s, .x = s->x, .add = s->xb2, .w = L->ffn_norm, .y = s->xb,
                           .ld = dim, .n = n, .cols = dim};
    a = sk__prep(&pr, gu, 2);
    if (nd == n) {
      mm = (struct sk__mm){.x = &a, .n_w = 2, .w = {&L->w_gate, &L->w_up},
                           .y = {sk__rows(s, 0, s->hb, H, n), sk__rows(s, n, s->hb2, H, n)}};
      sk__matmuls(s, &mm);
    } else { /* the gate for every row, up for the dense ones */
      mm = (struct sk__mm){.x = &a, .n_w = 1, .w = {&L->w_gate}, .y = {sk__rows(s, 0, s->hb, H, n)}};
      sk__matmuls(s, &mm);
      if (nd) {
        struct sk_act ad = a;
        ad.n = nd;
        mm = (struct sk__mm){.x = &ad, .n_w = 1, .w = {&L->w_up}, .y = {sk__rows(s, n, s->hb2, H, nd)}};
        sk__matmuls(s, &mm);
      }
    }
    if (s->gate_fn) s->gate_fn(s->gate_user, l, s->hb, n, H);
    /* Sparse rows (sparse.h): their input is still in xb/aq, their
     * output goes to their row of xb2 as the dense product's would. */
    for (uint32_t i = 0; i < n_seqs && nd < n; i++) {
      const float *thr = sk__sparse_thr(&seqs[i]);
      if (!thr) continue;
      const size_t nb = dim / SK_QK;
      for (uint32_t j = 0; j < seqs[i].n; j++) {
        const size_t r = s->seqs[i].row0 + j;
        struct sk_act x1 = sk__act(s, 1, dim, s->xb + r * dim, dim);
        x1.q += r * dim; /* row r of the quantized copies */
        x1.d += r * nb;
        x1.s += r * nb;
        x1.kq += r * dim;
        x1.kd += r * (dim / SK_QKK);
        x1.ks += r * (dim / 16);
        s->sp_kept[(size_t)i * c->n_layer + l] +=
            sk_sparse_mlp_row(&m->sparse[l], s->hb + r * H, thr[l], &x1,
                              s->xb2 + r * dim, &s->sp, s->pool);
      }
      if (l == 0) s->sp_rows[i] = seqs[i].n;
    }
    if (nd) {
      const struct sk_wmat *wd[1] = {&L->w_down};
      struct sk__silu si = {.s = s, .n = nd, .chunk = sk__prep_rows(s, nd),
                            .q = sk__any_q8(wd, 1)};
      sk_pool_run(s->pool, sk__silu_task, &si, (nd + si.chunk - 1) / si.chunk);
      a = sk__act(s, nd, H, s->hb, H);
      mm = (struct sk__mm){.x = &a, .n_w = 1, .w = {&L->w_down},
                           .y = {sk__rows(s, 0, s->xb2, dim, nd)}};
      sk__matmuls(s, &mm);
    }
  }
  /* the last layer's residual */
  struct sk__prep pr = {.s = s, .x = s->x, .add = s->xb2, .ld = dim, .n = n, .cols = dim};
  sk__prep(&pr, NULL, 0);

  /* Logits of the rows that want them, normed into consecutive rows of xb. */
  uint32_t n_out = 0;
  for (uint32_t i = 0; i < n_seqs; i++) {
    const struct sk_seq *q = &seqs[i];
    if (!q->logits) continue;
    uint32_t first = q->all_logits ? 0 : q->n - 1;
    for (uint32_t j = first; j < q->n; j++) {
      sk__rmsnorm(s->xb + (size_t)n_out * dim, s->x + (size_t)(s->seqs[i].row0 + j) * dim,
                  m->out_norm, dim, c->rms_eps);
      s->rows[n_out++] = q->logits + (size_t)(j - first) * c->n_vocab;
    }
  }
  if (n_out) {
    const struct sk_wmat *wout[1] = {&m->output};
    pr = (struct sk__prep){.s = s, .x = s->xb, .ld = dim, .n = n_out, .cols = dim};
    struct sk_act a = sk__prep(&pr, wout, 1);
    struct sk__mm mm = {.x = &a, .n_w = 1, .w = {&m->output}, .y = {s->rows}};
    sk__matmuls(s, &mm);
  }
  for (uint32_t i = 0; i < n_seqs; i++) {
    sk_kv_commit(seqs[i].kv, seqs[i].tokens, seqs[i].n);
    s->probe[i] = s->seqs[i].probe;
  }
  s->attn_n_seqs = n_seqs;
  return 0;
}

bool sk_scratch_attn(const struct sk_scratch *s, uint32_t seq, const float **ret_sink_mass,
                     const float **ret_entropy, uint32_t *ret_probe) {
  if (seq >= s->attn_n_seqs) return false;
  const uint32_t L = s->m->cfg.n_layer;
  *ret_sink_mass = s->sink_mass + (size_t)seq * L;
  *ret_entropy = s->entropy + (size_t)seq * L;
  *ret_probe = s->probe[seq];
  return true;
}

int sk_model_forward(const struct sk_model *m, struct sk_scratch *s,
                     struct sk_kv *kv, const int32_t *tokens, uint32_t n,
                     float *logits, bool all_logits, struct sk_error *err) {
  struct sk_seq q = {.kv = kv, .tokens = tokens, .n = n, .logits = logits,
                     .all_logits = all_logits};
  return sk_model_forward_batch(m, s, &q, 1, err);
}
