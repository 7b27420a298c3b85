/* Loading of the llama, qwen2 and qwen3 architectures (see model.h): one
 * table (sk__archs) of what each architecture adds, the hyper-parameters
 * read and checked, every tensor found by name and checked for type and
 * shape, matrices repacked for the kernels (sk_kernels_pack) or used in
 * place in the GGUF mapping. The forward pass is forward.c. */
#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_int.h"
#include "model/quant.h"

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
  if (m->inspect) {
    if (t->n_bytes != ne0 * sizeof(uint16_t))
      return sk_error_set(err, SK_ERR_BAD_MODEL, "tensor %s: %llu bytes of %s data for %llu "
                          "elements", name, (unsigned long long)t->n_bytes,
                          sk_ggml_type_name(t->type), (unsigned long long)ne0);
    *ret = NULL;
    return 0;
  }
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
  if (m->inspect) {
    m->mapped_bytes += t->n_bytes; /* as it is in the file */
  } else if (m->dequantize && t->type != SK_GGML_F32) {
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
                            const struct sk__arch *arch,
                            const struct sk_model_load_options *opts, struct sk_error *err) {
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
    if (!m->inspect && m->tok_embd.data == te->data &&
        (rc = sk_kernels_pack(&m->output, &mem, err)) < 0)
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
    for (uint32_t i = 0; m->rope_freqs && i < c->rope_dim / 2; i++)
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
    if (opts && opts->progress) opts->progress(opts->progress_user, l + 1, c->n_layer);
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
  m->inspect = opts && opts->inspect;
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
  rc = sk__load_tensors(m, g, arch, opts, err);
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

