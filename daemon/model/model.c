/* Llama forward pass (see model.h).
 *
 * Numerics follow llama.cpp's CPU backend (ggml) where the order of
 * floating-point operations is visible in the result: RMSNorm sums squares
 * in double and scales by a float 1/sqrtf(mean + eps) before the weight;
 * RoPE builds its angles in float as theta = pos * theta_scale^i by
 * repeated multiplication; attention scores are scaled after the dot
 * product and the softmax subtracts the max and sums in double; SiLU is
 * x / (1 + expf(-x)). Matrix products go through OpenBLAS; their
 * summation order differs from ggml's, which moves logits by ~1e-6.
 */
#include "model.h"

#include <cblas.h>
#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Hard limits on hyper-parameters, each with its reason. They reject
 * headers that would make the size arithmetic below overflow or ask for
 * absurd allocations; real llama models sit far below every one. */
#define SK__MAX_DIM 65536u          /* Llama 3 405B uses 16384 */
#define SK__MAX_HIDDEN (1u << 20)   /* FFN width; 405B uses 53248 */
#define SK__MAX_LAYER 1024u         /* 405B has 126 */
#define SK__MAX_HEAD 1024u          /* 405B has 128 */
#define SK__MAX_VOCAB (1u << 22)    /* largest vocabularies are ~256K */
#define SK__MAX_CTX_TRAIN (1u << 24)
/* Positions and batches a scratch can be sized for. */
#define SK__MAX_SCRATCH_CTX SK_KV_MAX_CAPACITY

struct sk__layer {
  const float *attn_norm; /* (dim) */
  const float *wq;        /* (dim, dim)      out rows of in floats */
  const float *wk;        /* (kv_dim, dim) */
  const float *wv;        /* (kv_dim, dim) */
  const float *wo;        /* (dim, dim) */
  const float *ffn_norm;  /* (dim) */
  const float *w_gate;    /* (hidden_dim, dim) */
  const float *w_up;      /* (hidden_dim, dim) */
  const float *w_down;    /* (dim, hidden_dim) */
};

struct sk_model {
  struct sk_model_config cfg;
  const float *tok_embd;   /* (n_vocab, dim) */
  const float *out_norm;   /* (dim) */
  const float *output;     /* (n_vocab, dim); tok_embd when tied */
  const float *rope_freqs; /* (rope_dim / 2) divisors, or NULL (Llama 3.1) */
  struct sk__layer *layers; /* (n_layer) */
  float **owned;           /* converted (F16/BF16) tensors, freed with us */
  size_t n_owned;
  size_t cap_owned;
};

struct sk_scratch {
  const struct sk_model *m;
  uint32_t max_batch; /* B */
  uint32_t max_ctx;   /* T */
  float *x;           /* (B, dim) residual stream */
  float *xb;          /* (B, dim) normed input of a block */
  float *xb2;         /* (B, dim) output of a projection */
  float *q;           /* (B, dim) queries, rotated */
  float *k;           /* (B, kv_dim) new keys, unrotated */
  float *v;           /* (B, kv_dim) new values */
  float *att_out;     /* (B, dim) attention output, heads side by side */
  float *hb;          /* (B, hidden_dim) gate, then silu(gate) * up */
  float *hb2;         /* (B, hidden_dim) up */
  float *kr;          /* (T, kv_dim) keys of every position, rotated */
  float *vr;          /* (T, kv_dim) values in position order */
  float *att;         /* (B, T) scores / probabilities of one head */
  float *rope_cos;    /* (T, rope_dim / 2) */
  float *rope_sin;    /* (T, rope_dim / 2) */
  uint32_t rope_valid;     /* rows of the rope tables computed */
  float rope_freq_scale;   /* the scale they were computed for */
  float *sink_mass;        /* (n_layer) last forward, last token */
  float *entropy;          /* (n_layer) last forward, last token, nats */
  uint32_t attn_probe;     /* positions counted as sinks by sink_mass */
  bool attn_valid;         /* a forward has filled the two above */
};

/* ---- loading -------------------------------------------------------- */

static const char *sk__arch_key(char *buf, size_t n, const char *suffix) {
  snprintf(buf, n, "llama.%s", suffix);
  return buf;
}

/* Reads llama.<suffix> as u32: required (error if absent) or defaulted. */
static int sk__hp_u32(const struct sk_gguf *g, const char *suffix,
                      bool required, uint32_t def, uint32_t *ret,
                      struct sk_error *err) {
  char key[96];
  int rc = sk_gguf_get_u32(g, sk__arch_key(key, sizeof key, suffix), ret, err);
  if (rc < 0) return rc;
  if (rc == 0) {
    if (required)
      return sk_error_set(err, SK_ERR_BAD_MODEL, "model has no %s", key);
    *ret = def;
  }
  return 0;
}

static int sk__hp_f32(const struct sk_gguf *g, const char *suffix, float def,
                      float *ret, struct sk_error *err) {
  char key[96];
  int rc = sk_gguf_get_f32(g, sk__arch_key(key, sizeof key, suffix), ret, err);
  if (rc < 0) return rc;
  if (rc == 0) *ret = def;
  return 0;
}

static int sk__check_range(const char *what, uint32_t v, uint32_t max,
                           struct sk_error *err) {
  if (v == 0 || v > max)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "%s is %u, expected 1..%u",
                        what, v, max);
  return 0;
}

static bool sk__str_eq(struct sk_gguf_str s, const char *lit) {
  return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

static int sk__read_config(const struct sk_gguf *g, struct sk_model_config *c,
                           struct sk_error *err) {
  struct sk_gguf_str s;
  int rc = sk_gguf_get_str(g, "general.architecture", &s, err);
  if (rc < 0) return rc;
  if (rc == 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "model has no general.architecture");
  if (!sk__str_eq(s, "llama"))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "general.architecture is \"%.*s\"; only llama is "
                        "supported",
                        (int)(s.len > 32 ? 32 : s.len), s.ptr);

  memset(c, 0, sizeof *c);
  if ((rc = sk__hp_u32(g, "embedding_length", true, 0, &c->dim, err)) < 0 ||
      (rc = sk__hp_u32(g, "feed_forward_length", true, 0, &c->hidden_dim,
                       err)) < 0 ||
      (rc = sk__hp_u32(g, "block_count", true, 0, &c->n_layer, err)) < 0 ||
      (rc = sk__hp_u32(g, "attention.head_count", true, 0, &c->n_head,
                       err)) < 0 ||
      (rc = sk__hp_u32(g, "context_length", true, 0, &c->n_ctx_train,
                       err)) < 0)
    return rc;
  if ((rc = sk__check_range("llama.embedding_length", c->dim, SK__MAX_DIM,
                            err)) < 0 ||
      (rc = sk__check_range("llama.feed_forward_length", c->hidden_dim,
                            SK__MAX_HIDDEN, err)) < 0 ||
      (rc = sk__check_range("llama.block_count", c->n_layer, SK__MAX_LAYER,
                            err)) < 0 ||
      (rc = sk__check_range("llama.attention.head_count", c->n_head,
                            SK__MAX_HEAD, err)) < 0 ||
      (rc = sk__check_range("llama.context_length", c->n_ctx_train,
                            SK__MAX_CTX_TRAIN, err)) < 0)
    return rc;
  if ((rc = sk__hp_u32(g, "attention.head_count_kv", false, c->n_head,
                       &c->n_kv_head, err)) < 0)
    return rc;
  if ((rc = sk__check_range("llama.attention.head_count_kv", c->n_kv_head,
                            c->n_head, err)) < 0)
    return rc;
  if (c->dim % c->n_head != 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "llama.embedding_length %u is not a multiple of "
                        "llama.attention.head_count %u",
                        c->dim, c->n_head);
  if (c->n_head % c->n_kv_head != 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "llama.attention.head_count %u is not a multiple of "
                        "llama.attention.head_count_kv %u",
                        c->n_head, c->n_kv_head);
  c->head_dim = c->dim / c->n_head;
  c->kv_dim = c->n_kv_head * c->head_dim;

  if ((rc = sk__hp_u32(g, "rope.dimension_count", false, c->head_dim,
                       &c->rope_dim, err)) < 0)
    return rc;
  if (c->rope_dim == 0 || c->rope_dim % 2 != 0 || c->rope_dim > c->head_dim)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "llama.rope.dimension_count is %u, expected an even "
                        "number in 2..%u (the head size)",
                        c->rope_dim, c->head_dim);

  if ((rc = sk__hp_f32(g, "rope.freq_base", 10000.0f, &c->rope_base, err)) < 0)
    return rc;
  if (!isfinite(c->rope_base) || !(c->rope_base > 1.0f))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "llama.rope.freq_base is %g, expected a finite "
                        "value > 1",
                        (double)c->rope_base);
  if ((rc = sk__hp_f32(g, "attention.layer_norm_rms_epsilon", 1e-5f,
                       &c->rms_eps, err)) < 0)
    return rc;
  if (!isfinite(c->rms_eps) || !(c->rms_eps > 0.0f) || c->rms_eps > 1.0f)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "llama.attention.layer_norm_rms_epsilon is %g, "
                        "expected a value in (0, 1]",
                        (double)c->rms_eps);

  /* Position interpolation, as llama.cpp reads it: the factor (or the old
   * rope.scale_linear key) applies whatever the type says, and the type
   * defaults to linear; YaRN and friends change the angles themselves and
   * are not implemented. */
  rc = sk_gguf_get_str(g, "llama.rope.scaling.type", &s, err);
  if (rc < 0) return rc;
  if (rc > 0 && !sk__str_eq(s, "linear") && !sk__str_eq(s, "none"))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "llama.rope.scaling.type \"%.*s\" is not supported "
                        "(only linear)",
                        (int)(s.len > 32 ? 32 : s.len), s.ptr);
  float factor = 0.0f;
  rc = sk_gguf_get_f32(g, "llama.rope.scaling.factor", &factor, err);
  if (rc == 0) rc = sk_gguf_get_f32(g, "llama.rope.scale_linear", &factor, err);
  if (rc < 0) return rc;
  if (!isfinite(factor) || factor < 0.0f)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "llama.rope.scaling.factor is %g, expected a finite "
                        "value >= 0",
                        (double)factor);
  c->rope_scale = factor == 0.0f ? 1.0f : 1.0f / factor;

  rc = sk_gguf_get_str(g, "general.name", &s, err);
  if (rc < 0) return rc;
  if (rc > 0) {
    size_t n = s.len < sizeof c->name - 1 ? (size_t)s.len : sizeof c->name - 1;
    memcpy(c->name, s.ptr, n);
    c->name[n] = 0;
  }
  return 0;
}

static float sk__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    /* zero or subnormal: mant * 2^-24, exact in float */
    float f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  if (exp == 31)
    bits = sign | 0x7f800000u | (mant << 13); /* inf / nan */
  else
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static float sk__bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static bool sk__is_quantized(uint32_t type) {
  return (type >= SK_GGML_Q4_0 && type <= SK_GGML_Q8_K);
}

/* Finds tensor `name`, checks that its shape is exactly [ne0] (ne1 == 0)
 * or [ne0, ne1] and that its type is loadable, and returns F32 data: the
 * mapping itself for F32, an owned converted copy for F16/BF16. */
static int sk__tensor(struct sk_model *m, const struct sk_gguf *g,
                      const char *name, uint64_t ne0, uint64_t ne1,
                      const float **ret, struct sk_error *err) {
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
  uint64_t n = ne0 * (ne1 ? ne1 : 1); /* both bounded by the limits above */
  if (sk__is_quantized(t->type))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tensor %s has type %s; quantized weights are not "
                        "supported yet",
                        name, sk_ggml_type_name(t->type));
  if (t->type == SK_GGML_F32) {
    if (t->n_bytes != n * sizeof(float) ||
        (uintptr_t)t->data % alignof(float) != 0)
      return sk_error_set(err, SK_ERR_BAD_MODEL,
                          "tensor %s: %llu bytes of f32 data for %llu "
                          "elements, or misaligned",
                          name, (unsigned long long)t->n_bytes,
                          (unsigned long long)n);
    *ret = t->data;
    return 0;
  }
  if (t->type != SK_GGML_F16 && t->type != SK_GGML_BF16)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tensor %s has type %s, expected f32, f16 or bf16",
                        name, sk_ggml_type_name(t->type));
  if (t->n_bytes != n * sizeof(uint16_t))
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tensor %s: %llu bytes of %s data for %llu elements",
                        name, (unsigned long long)t->n_bytes,
                        sk_ggml_type_name(t->type), (unsigned long long)n);
  if (m->n_owned == m->cap_owned) {
    size_t cap = m->cap_owned ? 2 * m->cap_owned : 16;
    float **o = realloc(m->owned, cap * sizeof *o);
    if (!o)
      return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot convert tensor %s",
                          name);
    m->owned = o;
    m->cap_owned = cap;
  }
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
    f[i] = bf ? sk__bf16_to_f32(h) : sk__f16_to_f32(h);
  }
  m->owned[m->n_owned++] = f;
  *ret = f;
  return 0;
}

static int sk__load_tensors(struct sk_model *m, const struct sk_gguf *g,
                            struct sk_error *err) {
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
  if ((rc = sk__tensor(m, g, "token_embd.weight", c->dim, c->n_vocab,
                       &m->tok_embd, err)) < 0 ||
      (rc = sk__tensor(m, g, "output_norm.weight", c->dim, 0, &m->out_norm,
                       err)) < 0)
    return rc;
  if (sk_gguf_find_tensor(g, "output.weight")) {
    if ((rc = sk__tensor(m, g, "output.weight", c->dim, c->n_vocab,
                         &m->output, err)) < 0)
      return rc;
  } else {
    m->output = m->tok_embd; /* tied embeddings */
  }
  if (sk_gguf_find_tensor(g, "rope_freqs.weight")) {
    if ((rc = sk__tensor(m, g, "rope_freqs.weight", c->rope_dim / 2, 0,
                         &m->rope_freqs, err)) < 0)
      return rc;
    for (uint32_t i = 0; i < c->rope_dim / 2; i++)
      if (!isfinite(m->rope_freqs[i]) || !(m->rope_freqs[i] > 0.0f))
        return sk_error_set(err, SK_ERR_BAD_MODEL,
                            "rope_freqs.weight[%u] is %g, expected a finite "
                            "value > 0",
                            i, (double)m->rope_freqs[i]);
  }

  for (uint32_t l = 0; l < c->n_layer; l++) {
    struct sk__layer *L = &m->layers[l];
    struct {
      const char *suffix;
      uint32_t ne0, ne1;
      const float **dst;
    } spec[] = {
        {"attn_norm", c->dim, 0, &L->attn_norm},
        {"attn_q", c->dim, c->dim, &L->wq},
        {"attn_k", c->dim, c->kv_dim, &L->wk},
        {"attn_v", c->dim, c->kv_dim, &L->wv},
        {"attn_output", c->dim, c->dim, &L->wo},
        {"ffn_norm", c->dim, 0, &L->ffn_norm},
        {"ffn_gate", c->dim, c->hidden_dim, &L->w_gate},
        {"ffn_up", c->dim, c->hidden_dim, &L->w_up},
        {"ffn_down", c->hidden_dim, c->dim, &L->w_down},
    };
    for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
      char name[SK_GGUF_MAX_NAME + 16];
      snprintf(name, sizeof name, "blk.%u.%s.weight", l, spec[i].suffix);
      if ((rc = sk__tensor(m, g, name, spec[i].ne0, spec[i].ne1, spec[i].dst,
                           err)) < 0)
        return rc;
    }
  }
  return 0;
}

int sk_model_load(const struct sk_gguf *g, struct sk_model **ret,
                  struct sk_error *err) {
  struct sk_model *m = calloc(1, sizeof *m);
  if (!m) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate model");
  int rc = sk__read_config(g, &m->cfg, err);
  if (rc < 0) goto fail;
  m->layers = calloc(m->cfg.n_layer, sizeof *m->layers);
  if (!m->layers) {
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %u layers",
                      m->cfg.n_layer);
    goto fail;
  }
  rc = sk__load_tensors(m, g, err);
  if (rc < 0) goto fail;
  *ret = m;
  return 0;
fail:
  sk_model_free(m);
  return rc;
}

void sk_model_free(struct sk_model *m) {
  if (!m) return;
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

/* ---- scratch -------------------------------------------------------- */

void sk_scratch_free(struct sk_scratch *s) {
  if (!s) return;
  float **bufs[] = {&s->x,   &s->xb,      &s->xb2, &s->q,   &s->k,
                    &s->v,   &s->att_out, &s->hb,  &s->hb2, &s->kr,
                    &s->vr,  &s->att,     &s->rope_cos, &s->rope_sin};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(*bufs[i]);
  free(s->sink_mass);
  free(s->entropy);
  free(s);
}

int sk_scratch_new(const struct sk_model *m, uint32_t max_batch,
                   uint32_t max_ctx, struct sk_scratch **ret,
                   struct sk_error *err) {
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
  s->max_batch = max_batch;
  s->max_ctx = max_ctx;
  /* Every product below is < 2^20 * 2^22 floats: fits size_t on 64-bit;
   * on 32-bit hosts malloc simply fails. */
  size_t B = max_batch, T = max_ctx;
  struct {
    float **dst;
    size_t n;
  } want[] = {
      {&s->x, B * c->dim},          {&s->xb, B * c->dim},
      {&s->xb2, B * c->dim},        {&s->q, B * c->dim},
      {&s->k, B * c->kv_dim},       {&s->v, B * c->kv_dim},
      {&s->att_out, B * c->dim},    {&s->hb, B * c->hidden_dim},
      {&s->hb2, B * c->hidden_dim}, {&s->kr, T * c->kv_dim},
      {&s->vr, T * c->kv_dim},      {&s->att, B * T},
      {&s->rope_cos, T * (c->rope_dim / 2)},
      {&s->rope_sin, T * (c->rope_dim / 2)},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (want[i].n > SIZE_MAX / sizeof(float) ||
        !(*want[i].dst = malloc(want[i].n * sizeof(float)))) {
      sk_scratch_free(s);
      return sk_error_set(err, SK_ERR_NO_MEMORY,
                          "cannot allocate scratch for batch %u, context %u",
                          max_batch, max_ctx);
    }
  }
  s->sink_mass = calloc(c->n_layer, sizeof *s->sink_mass);
  s->entropy = calloc(c->n_layer, sizeof *s->entropy);
  if (!s->sink_mass || !s->entropy) {
    sk_scratch_free(s);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate scratch");
  }
  s->rope_valid = 0;
  s->rope_freq_scale = 0.0f;
  *ret = s;
  return 0;
}

/* ---- kernels -------------------------------------------------------- */

/* y (n, out) = x (n, in) W^T, W (out, in) row-major. */
static void sk__matmul(float *y, const float *x, const float *w, uint32_t n,
                       uint32_t in, uint32_t out) {
  if (n == 1)
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)out, (int)in, 1.0f, w,
                (int)in, x, 1, 0.0f, y, 1);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out,
                (int)in, 1.0f, x, (int)in, w, (int)in, 0.0f, y, (int)out);
}

/* y = (x * 1/sqrtf(mean(x^2) + eps)) * w, as ggml_rms_norm then ggml_mul. */
static void sk__rmsnorm(float *y, const float *x, const float *w, uint32_t n,
                        float eps) {
  double sum = 0.0;
  for (uint32_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
  const float mean = (float)(sum / n);
  const float scale = 1.0f / sqrtf(mean + eps);
  for (uint32_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
}

/* Extends the cos/sin tables to positions < n for freq_scale. Angles as
 * ggml_rope_cache_init: theta = pos; theta *= theta_scale per pair, all
 * in float; divided by the frequency factor, times freq_scale. */
static void sk__rope_tables(struct sk_scratch *s, uint32_t n,
                            float freq_scale) {
  const struct sk_model *m = s->m;
  uint32_t half = m->cfg.rope_dim / 2;
  if (s->rope_freq_scale != freq_scale) {
    s->rope_valid = 0;
    s->rope_freq_scale = freq_scale;
  }
  const float theta_scale =
      powf(m->cfg.rope_base, -2.0f / (float)m->cfg.rope_dim);
  for (uint32_t p = s->rope_valid; p < n; p++) {
    float theta = (float)p;
    float *cs = s->rope_cos + (size_t)p * half;
    float *sn = s->rope_sin + (size_t)p * half;
    for (uint32_t i = 0; i < half; i++) {
      float ff = m->rope_freqs ? m->rope_freqs[i] : 1.0f;
      float t = freq_scale * (theta / ff);
      cs[i] = cosf(t);
      sn[i] = sinf(t);
      theta *= theta_scale;
    }
  }
  if (n > s->rope_valid) s->rope_valid = n;
}

/* Rotates each of n_heads heads of x (head_dim floats each) at position p,
 * writing y (may equal x). */
static void sk__rope(float *y, const float *x, const struct sk_scratch *s,
                     uint32_t p, uint32_t n_heads) {
  const struct sk_model_config *c = &s->m->cfg;
  uint32_t half = c->rope_dim / 2;
  const float *cs = s->rope_cos + (size_t)p * half;
  const float *sn = s->rope_sin + (size_t)p * half;
  for (uint32_t h = 0; h < n_heads; h++) {
    const float *xh = x + (size_t)h * c->head_dim;
    float *yh = y + (size_t)h * c->head_dim;
    for (uint32_t i = 0; i < half; i++) {
      float x0 = xh[2 * i], x1 = xh[2 * i + 1];
      yh[2 * i] = x0 * cs[i] - x1 * sn[i];
      yh[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
    }
    if (yh != xh)
      memcpy(yh + c->rope_dim, xh + c->rope_dim,
             (c->head_dim - c->rope_dim) * sizeof *yh);
  }
}

/* Softmax of row[0..n_valid) scaled by scale, as ggml_soft_max_ext:
 * max-subtracted expf, sum in double, multiply by 1/sum. Entries
 * [n_valid..n_total) (future positions) become 0. If ret_entropy is not
 * NULL it receives the entropy of the distribution in nats, computed
 * without a logarithm per entry: with e_j = exp(x_j - max) and S = sum e_j,
 * H = -sum p_j log p_j = log S - sum e_j (x_j - max) / S. */
static void sk__softmax(float *row, uint32_t n_valid, uint32_t n_total,
                        float scale, double *ret_entropy) {
  float max = -INFINITY;
  for (uint32_t j = 0; j < n_valid; j++) {
    row[j] *= scale;
    if (row[j] > max) max = row[j];
  }
  double sum = 0.0, wsum = 0.0;
  for (uint32_t j = 0; j < n_valid; j++) {
    float e = expf(row[j] - max);
    if (ret_entropy) wsum += (double)e * (double)(row[j] - max);
    row[j] = e;
    sum += (double)e;
  }
  if (ret_entropy) *ret_entropy = log(sum) - wsum / sum;
  const float inv = (float)(1.0 / sum);
  for (uint32_t j = 0; j < n_valid; j++) row[j] *= inv;
  for (uint32_t j = n_valid; j < n_total; j++) row[j] = 0.0f;
}

/* What the attention of one query row leaves behind besides its output:
 * the H2O score of every position it saw (kvcache.h: summed over query
 * heads, hence per KV head over its group, then over KV heads and
 * layers), and, for the last row of the batch, the sink mass and entropy
 * averaged over heads. */
static void sk__attention_observe(struct sk_scratch *s, const struct sk_kv *kv,
                                  const float *p, uint32_t n_seen,
                                  bool last_row, double entropy,
                                  double *mass_sum, double *ent_sum) {
  if (sk_policy_scores(kv->hdr->policy))
    for (uint32_t j = 0; j < n_seen; j++) kv->score[kv->order[j]] += p[j];
  if (last_row) {
    double m = 0.0;
    uint32_t probe = s->attn_probe < n_seen ? s->attn_probe : n_seen;
    for (uint32_t j = 0; j < probe; j++) m += (double)p[j];
    *mass_sum += m;
    *ent_sum += entropy;
  }
}

/* Attention of the n new tokens (queries s->q, rotated) over the T = nr+n
 * positions of layer l. Token i sits at position nr+i and sees 0..nr+i. */
static void sk__attention(struct sk_scratch *s, const struct sk_kv *kv,
                          uint32_t l, uint32_t nr, uint32_t n) {
  const struct sk_model_config *c = &s->m->cfg;
  const uint32_t T = nr + n, hd = c->head_dim, D = c->kv_dim;
  const uint32_t group = c->n_head / c->n_kv_head;
  const float scale = 1.0f / sqrtf((float)hd);
  double mass_sum = 0.0, ent_sum = 0.0;

  for (uint32_t p = 0; p < T; p++) {
    uint32_t slot = sk_kv_slot(kv, p);
    sk__rope(s->kr + (size_t)p * D, sk_kv_k(kv, l, slot), s, p, c->n_kv_head);
    memcpy(s->vr + (size_t)p * D, sk_kv_v(kv, l, slot), D * sizeof(float));
  }
  for (uint32_t h = 0; h < c->n_head; h++) {
    const uint32_t kvh = h / group; /* ggml's broadcast: q head h -> kv h/g */
    const float *qh = s->q + (size_t)h * hd;      /* rows of stride dim */
    const float *kh = s->kr + (size_t)kvh * hd;   /* rows of stride D */
    const float *vh = s->vr + (size_t)kvh * hd;
    float *oh = s->att_out + (size_t)h * hd;
    double ent = 0.0;
    if (n == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)T, (int)hd, 1.0f, kh,
                  (int)D, qh, 1, 0.0f, s->att, 1);
      sk__softmax(s->att, T, T, scale, &ent);
      sk__attention_observe(s, kv, s->att, T, true, ent, &mass_sum, &ent_sum);
      cblas_sgemv(CblasRowMajor, CblasTrans, (int)T, (int)hd, 1.0f, vh,
                  (int)D, s->att, 1, 0.0f, oh, 1);
      continue;
    }
    /* scores (n, T) = Q_h (n, hd) K_h^T; probs (n, T); out = P V_h */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)T,
                (int)hd, 1.0f, qh, (int)c->dim, kh, (int)D, 0.0f, s->att,
                (int)T);
    for (uint32_t i = 0; i < n; i++) {
      bool last = i + 1 == n;
      float *row = s->att + (size_t)i * T;
      sk__softmax(row, nr + i + 1, T, scale, last ? &ent : NULL);
      sk__attention_observe(s, kv, row, nr + i + 1, last, ent, &mass_sum,
                            &ent_sum);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)hd,
                (int)T, 1.0f, s->att, (int)T, vh, (int)D, 0.0f, oh,
                (int)c->dim);
  }
  s->sink_mass[l] = (float)(mass_sum / c->n_head);
  s->entropy[l] = (float)(ent_sum / c->n_head);
}

/* ---- forward -------------------------------------------------------- */

int sk_model_forward(const struct sk_model *m, struct sk_scratch *s,
                     struct sk_kv *kv, const int32_t *tokens, uint32_t n,
                     float *logits, bool all_logits, struct sk_error *err) {
  const struct sk_model_config *c = &m->cfg;
  /* Every check happens before the cache is touched. */
  if (s->m != m)
    return sk_error_set(err, SK_ERR_INTERNAL,
                        "scratch was made for another model");
  if (kv->hdr->n_layer != c->n_layer || kv->hdr->kv_dim != c->kv_dim)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "cache shape n_layer %u x kv_dim %u does not match "
                        "the model's %u x %u",
                        kv->hdr->n_layer, kv->hdr->kv_dim, c->n_layer,
                        c->kv_dim);
  if (n == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "no tokens to process");
  if (n > s->max_batch)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "batch of %u tokens exceeds the maximum batch %u", n,
                        s->max_batch);
  for (uint32_t i = 0; i < n; i++)
    if (tokens[i] < 0 || (uint32_t)tokens[i] >= c->n_vocab)
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "token %u of the batch is id %d, outside the "
                          "vocabulary 0..%u",
                          i, tokens[i], c->n_vocab - 1);
  const uint32_t nr = kv->hdr->n_resident;
  if (n > sk_kv_free_slots(kv))
    return sk_error_set(err, SK_ERR_CONTEXT_FULL,
                        "context full: needs %u, %u of %u free", n,
                        sk_kv_free_slots(kv), kv->hdr->capacity);
  if ((uint64_t)nr + n > s->max_ctx)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "%u resident + %u new tokens exceed the scratch "
                        "context %u",
                        nr, n, s->max_ctx);

  const uint32_t dim = c->dim, D = c->kv_dim, H = c->hidden_dim;
  sk__rope_tables(s, nr + n, c->rope_scale / kv->hdr->rope_scale);
  /* The new tokens' slots start with no attention score. */
  if (sk_policy_scores(kv->hdr->policy))
    for (uint32_t i = 0; i < n; i++) kv->score[sk_kv_slot(kv, nr + i)] = 0.0f;
  s->attn_probe = kv->hdr->n_sink ? kv->hdr->n_sink : SK_ATTN_PROBE_DEFAULT;

  for (uint32_t i = 0; i < n; i++)
    memcpy(s->x + (size_t)i * dim, m->tok_embd + (size_t)tokens[i] * dim,
           dim * sizeof(float));

  for (uint32_t l = 0; l < c->n_layer; l++) {
    const struct sk__layer *L = &m->layers[l];
    for (uint32_t i = 0; i < n; i++)
      sk__rmsnorm(s->xb + (size_t)i * dim, s->x + (size_t)i * dim,
                  L->attn_norm, dim, c->rms_eps);
    sk__matmul(s->q, s->xb, L->wq, n, dim, dim);
    sk__matmul(s->k, s->xb, L->wk, n, dim, D);
    sk__matmul(s->v, s->xb, L->wv, n, dim, D);
    for (uint32_t i = 0; i < n; i++) {
      uint32_t slot = sk_kv_slot(kv, nr + i); /* a free slot until commit */
      memcpy(sk_kv_k(kv, l, slot), s->k + (size_t)i * D, D * sizeof(float));
      memcpy(sk_kv_v(kv, l, slot), s->v + (size_t)i * D, D * sizeof(float));
      float *qi = s->q + (size_t)i * dim;
      sk__rope(qi, qi, s, nr + i, c->n_head);
    }
    sk__attention(s, kv, l, nr, n);
    sk__matmul(s->xb2, s->att_out, L->wo, n, dim, dim);
    for (size_t j = 0; j < (size_t)n * dim; j++) s->x[j] += s->xb2[j];

    for (uint32_t i = 0; i < n; i++)
      sk__rmsnorm(s->xb + (size_t)i * dim, s->x + (size_t)i * dim,
                  L->ffn_norm, dim, c->rms_eps);
    sk__matmul(s->hb, s->xb, L->w_gate, n, dim, H);
    sk__matmul(s->hb2, s->xb, L->w_up, n, dim, H);
    for (size_t j = 0; j < (size_t)n * H; j++) {
      float g = s->hb[j];
      s->hb[j] = g / (1.0f + expf(-g)) * s->hb2[j];
    }
    sk__matmul(s->xb2, s->hb, L->w_down, n, H, dim);
    for (size_t j = 0; j < (size_t)n * dim; j++) s->x[j] += s->xb2[j];
  }

  if (logits) {
    uint32_t first = all_logits ? 0 : n - 1;
    for (uint32_t i = first; i < n; i++)
      sk__rmsnorm(s->xb + (size_t)i * dim, s->x + (size_t)i * dim,
                  m->out_norm, dim, c->rms_eps);
    sk__matmul(logits, s->xb + (size_t)first * dim, m->output, n - first, dim,
               c->n_vocab);
  }
  sk_kv_commit(kv, tokens, n);
  s->attn_valid = true;
  return 0;
}

bool sk_scratch_attn(const struct sk_scratch *s, const float **ret_sink_mass,
                     const float **ret_entropy, uint32_t *ret_probe) {
  if (!s->attn_valid) return false;
  *ret_sink_mass = s->sink_mass;
  *ret_entropy = s->entropy;
  *ret_probe = s->attn_probe;
  return true;
}
