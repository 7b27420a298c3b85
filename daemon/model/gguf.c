/* GGUF reader. Layout from ggml docs/gguf.md; the checks follow llama.cpp's
 * ggml/src/gguf.cpp (gguf_init_from_file_impl), which distrusts the file:
 *
 *   header   magic "GGUF", u32 version, u64 n_tensors, u64 n_kv
 *   kv       n_kv x { string key, u32 type, value }
 *   tensors  n_tensors x { string name, u32 n_dims, u64 ne[n_dims],
 *                          u32 type, u64 offset }
 *   padding  up to general.alignment
 *   data     tensor bytes, each tensor at data + offset
 *
 * A string is a u64 length then that many bytes (no NUL). All integers are
 * little-endian; they are read byte by byte so the code does not depend on
 * the host's byte order or on alignment. Every read goes through a cursor
 * that checks the remaining bytes first.
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SK__GGUF_MAGIC "GGUF"
/* Smallest encoding of one kv pair: key length (8) + type (4) + the
 * smallest value (1 byte: u8/i8/bool). Bounds n_kv by the file size. */
#define SK__GGUF_MIN_KV_BYTES (8u + 4u + 1u)
/* Smallest tensor info: name length (8) + n_dims (4) + one dim (8) +
 * type (4) + offset (8). Bounds n_tensors by the file size. */
#define SK__GGUF_MIN_TENSOR_BYTES (8u + 4u + 8u + 4u + 8u)
/* Longest name or key quoted in an error message (messages are short and
 * may end up in a log). */
#define SK__GGUF_QUOTE_MAX 64u

/* Block layout of a ggml type: blck elements take size bytes. */
struct sk__ggml_traits {
  const char *name;
  uint32_t blck;
  uint32_t size;
};

/* ggml.c type_traits (names, blck_size, type_size): the sizes are those
 * of the block structs of ggml-common.h. */
static const struct sk__ggml_traits sk__traits[] = {
  [SK_GGML_F32] = {"f32", 1, 4},
  [SK_GGML_F16] = {"f16", 1, 2},
  [SK_GGML_Q4_0] = {"q4_0", 32, 2 + 16},
  [SK_GGML_Q4_1] = {"q4_1", 32, 2 + 2 + 16},
  [SK_GGML_Q5_0] = {"q5_0", 32, 2 + 4 + 16},
  [SK_GGML_Q5_1] = {"q5_1", 32, 2 + 2 + 4 + 16},
  [SK_GGML_Q8_0] = {"q8_0", 32, 2 + 32},
  [SK_GGML_Q8_1] = {"q8_1", 32, 2 + 2 + 32},
  [SK_GGML_Q2_K] = {"q2_K", 256, 2 + 2 + 16 + 64},
  [SK_GGML_Q3_K] = {"q3_K", 256, 2 + 32 + 64 + 12},
  [SK_GGML_Q4_K] = {"q4_K", 256, 2 + 2 + 12 + 128},
  [SK_GGML_Q5_K] = {"q5_K", 256, 2 + 2 + 12 + 32 + 128},
  [SK_GGML_Q6_K] = {"q6_K", 256, 128 + 64 + 16 + 2},
  [SK_GGML_Q8_K] = {"q8_K", 256, 4 + 256 + 32},
  [SK_GGML_IQ2_XXS] = {"iq2_xxs", 256, 2 + 64},
  [SK_GGML_IQ2_XS] = {"iq2_xs", 256, 2 + 64 + 8},
  [SK_GGML_IQ3_XXS] = {"iq3_xxs", 256, 2 + 96},
  [SK_GGML_IQ1_S] = {"iq1_s", 256, 2 + 32 + 16},
  [SK_GGML_IQ4_NL] = {"iq4_nl", 32, 2 + 16},
  [SK_GGML_IQ3_S] = {"iq3_s", 256, 2 + 64 + 8 + 32 + 4},
  [SK_GGML_IQ2_S] = {"iq2_s", 256, 2 + 64 + 8 + 8},
  [SK_GGML_IQ4_XS] = {"iq4_xs", 256, 2 + 2 + 4 + 128},
  [SK_GGML_I8] = {"i8", 1, 1},
  [SK_GGML_I16] = {"i16", 1, 2},
  [SK_GGML_I32] = {"i32", 1, 4},
  [SK_GGML_I64] = {"i64", 1, 8},
  [SK_GGML_F64] = {"f64", 1, 8},
  [SK_GGML_IQ1_M] = {"iq1_m", 256, 32 + 16 + 8},
  [SK_GGML_BF16] = {"bf16", 1, 2},
  [SK_GGML_TQ1_0] = {"tq1_0", 256, 2 + 4 + 48},
  [SK_GGML_TQ2_0] = {"tq2_0", 256, 2 + 64},
  [SK_GGML_MXFP4] = {"mxfp4", 32, 1 + 16},
  [SK_GGML_NVFP4] = {"nvfp4", 64, 4 + 32},
  [SK_GGML_Q1_0] = {"q1_0", 128, 2 + 16},
  [SK_GGML_Q2_0] = {"q2_0", 64, 2 + 16},
};
#define SK__N_TRAITS (sizeof sk__traits / sizeof sk__traits[0])

static const struct sk__ggml_traits *sk__type_traits(uint32_t type) {
  if (type >= SK__N_TRAITS || !sk__traits[type].name) return NULL;
  return &sk__traits[type];
}

const char *sk_ggml_type_name(uint32_t type) {
  const struct sk__ggml_traits *tr = sk__type_traits(type);
  return tr ? tr->name : "unknown";
}

bool sk_ggml_type_layout(uint32_t type, uint32_t *ret_blck, uint32_t *ret_size) {
  const struct sk__ggml_traits *tr = sk__type_traits(type);
  if (!tr) return false;
  *ret_blck = tr->blck;
  *ret_size = tr->size;
  return true;
}

/* One metadata pair. Scalars: data points at the value (a string's data
 * at its length prefix). Arrays: arr_type/n and data at the first element;
 * string arrays are also indexed in strs. */
struct sk__kv {
  struct sk_gguf_str key;
  uint32_t type;            /* enum sk_gguf_type */
  uint32_t arr_type;        /* element type when type == ARRAY */
  uint64_t n;               /* elements when type == ARRAY */
  const uint8_t *data;      /* inside the buffer */
  struct sk_gguf_str str;   /* the value when type == STRING */
  struct sk_gguf_str *strs; /* (n) when an array of strings, owned */
};

struct sk_gguf {
  const uint8_t *base; /* (size) the file bytes */
  size_t size;
  void *map;           /* mmap'd region to unmap, or NULL (buffer) */
  uint32_t version;
  uint32_t alignment;
  uint64_t data_offset;            /* start of the data section */
  uint64_t n_kv;
  struct sk__kv *kv;               /* (n_kv) */
  uint64_t *kv_sorted;             /* (n_kv) kv indices sorted by key */
  uint64_t n_tensors;
  struct sk_gguf_tensor *tensors;  /* (n_tensors) */
  uint64_t *tensor_sorted;         /* (n_tensors) indices sorted by name */
};

/* --- quoting names in messages --------------------------------------- */

/* Copies at most SK__GGUF_QUOTE_MAX bytes of s into out, replacing
 * non-printable bytes by '?', and "..." if cut: file bytes go into error
 * messages that may be logged. */
static const char *sk__quote(char out[SK__GGUF_QUOTE_MAX + 4],
                             const char *s, uint64_t len) {
  uint64_t n = len < SK__GGUF_QUOTE_MAX ? len : SK__GGUF_QUOTE_MAX;
  for (uint64_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  if (n < len) {
    memcpy(out + n, "...", 4);
  } else {
    out[n] = '\0';
  }
  return out;
}

const char *sk_gguf_quote(char *out, size_t size, const char *s, uint64_t len) {
  size_t room = size - 1;
  size_t n = len <= room ? (size_t)len : room - 3;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  if (n < len) {
    memcpy(out + n, "...", 4);
  } else {
    out[n] = '\0';
  }
  return out;
}

/* --- bounds-checked cursor --------------------------------------------- */

struct sk__cur {
  const uint8_t *p; /* (size) */
  size_t size;
  size_t pos;
  struct sk_error *err;
};

static size_t sk__cur_left(const struct sk__cur *c) { return c->size - c->pos; }

/* Takes n bytes for field `what`; error if fewer remain. */
static int sk__cur_take(struct sk__cur *c, uint64_t n, const char *what,
                        const uint8_t **ret) {
  if (n > sk__cur_left(c))
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "truncated file: %s needs %" PRIu64
                        " bytes at offset %zu, file size %zu",
                        what, n, c->pos, c->size);
  *ret = c->p + c->pos;
  c->pos += (size_t)n;
  return 0;
}

static uint32_t sk__le32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
         (uint32_t)b[3] << 24;
}

static uint64_t sk__le64(const uint8_t *b) {
  return (uint64_t)sk__le32(b) | (uint64_t)sk__le32(b + 4) << 32;
}

static int sk__cur_u32(struct sk__cur *c, const char *what, uint32_t *ret) {
  const uint8_t *b = NULL;
  int r = sk__cur_take(c, 4, what, &b);
  if (r < 0) return r;
  *ret = sk__le32(b);
  return 0;
}

static int sk__cur_u64(struct sk__cur *c, const char *what, uint64_t *ret) {
  const uint8_t *b = NULL;
  int r = sk__cur_take(c, 8, what, &b);
  if (r < 0) return r;
  *ret = sk__le64(b);
  return 0;
}

/* A string: u64 length checked against the remaining bytes, then bytes. */
static int sk__cur_str(struct sk__cur *c, const char *what,
                       struct sk_gguf_str *ret) {
  uint64_t len;
  const uint8_t *b = NULL;
  int r = sk__cur_u64(c, what, &len);
  if (r < 0) return r;
  if (len > sk__cur_left(c))
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "%s: string length %" PRIu64
                        " exceeds the %zu bytes left in the file at offset %zu",
                        what, len, sk__cur_left(c), c->pos);
  r = sk__cur_take(c, len, what, &b);
  if (r < 0) return r;
  ret->ptr = (const char *)b;
  ret->len = len;
  return 0;
}

/* --- metadata values ----------------------------------------------------- */

/* Byte size of a fixed-size metadata type; 0 for string/array/unknown. */
static size_t sk__gguf_type_size(uint32_t type) {
  switch (type) {
  case SK_GGUF_UINT8: case SK_GGUF_INT8: case SK_GGUF_BOOL: return 1;
  case SK_GGUF_UINT16: case SK_GGUF_INT16: return 2;
  case SK_GGUF_UINT32: case SK_GGUF_INT32: case SK_GGUF_FLOAT32: return 4;
  case SK_GGUF_UINT64: case SK_GGUF_INT64: case SK_GGUF_FLOAT64: return 8;
  default: return 0;
  }
}

static const char *sk__gguf_type_name(uint32_t type) {
  static const char *const names[] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
  };
  return type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}

static bool sk__is_int_type(uint32_t type) {
  switch (type) {
  case SK_GGUF_UINT8: case SK_GGUF_INT8: case SK_GGUF_UINT16:
  case SK_GGUF_INT16: case SK_GGUF_UINT32: case SK_GGUF_INT32:
  case SK_GGUF_UINT64: case SK_GGUF_INT64:
    return true;
  default:
    return false;
  }
}

/* An integer value of any width: unsigned types fill u, signed types fill
 * s (is_signed). Caller checked the type. */
struct sk__int {
  bool is_signed;
  uint64_t u;
  int64_t s;
};

static struct sk__int sk__read_int(uint32_t type, const uint8_t *b) {
  struct sk__int v = {false, 0, 0};
  switch (type) {
  case SK_GGUF_UINT8: v.u = b[0]; break;
  case SK_GGUF_UINT16: v.u = (uint64_t)b[0] | (uint64_t)b[1] << 8; break;
  case SK_GGUF_UINT32: v.u = sk__le32(b); break;
  case SK_GGUF_UINT64: v.u = sk__le64(b); break;
  case SK_GGUF_INT8: v.is_signed = true; v.s = (int8_t)b[0]; break;
  case SK_GGUF_INT16:
    v.is_signed = true;
    v.s = (int16_t)(uint16_t)((unsigned)b[0] | (unsigned)b[1] << 8);
    break;
  case SK_GGUF_INT32: v.is_signed = true; v.s = (int32_t)sk__le32(b); break;
  case SK_GGUF_INT64: v.is_signed = true; v.s = (int64_t)sk__le64(b); break;
  default: break;
  }
  return v;
}

static bool sk__int_in(struct sk__int v, int64_t lo, uint64_t hi) {
  if (v.is_signed) return v.s >= lo && (v.s < 0 || (uint64_t)v.s <= hi);
  return v.u <= hi && (lo <= 0 || v.u >= (uint64_t)lo);
}

static float sk__read_f32(const uint8_t *b) {
  uint32_t bits = sk__le32(b);
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static double sk__read_f64(const uint8_t *b) {
  uint64_t bits = sk__le64(b);
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

/* Parses the value of kv (type already read) at the cursor. */
static int sk__parse_value(struct sk__cur *c, struct sk__kv *kv,
                           const char *what) {
  const uint8_t *b = NULL;
  int r;
  if (kv->type == SK_GGUF_STRING) {
    kv->data = c->p + c->pos;
    return sk__cur_str(c, what, &kv->str);
  }
  if (kv->type != SK_GGUF_ARRAY) {
    size_t sz = sk__gguf_type_size(kv->type);
    if (sz == 0)
      return sk_error_set(c->err, SK_ERR_BAD_MODEL, "%s: unknown value type %" PRIu32,
                          what, kv->type);
    r = sk__cur_take(c, sz, what, &b);
    if (r < 0) return r;
    kv->data = b;
    return 0;
  }
  r = sk__cur_u32(c, what, &kv->arr_type);
  if (r < 0) return r;
  r = sk__cur_u64(c, what, &kv->n);
  if (r < 0) return r;
  if (kv->arr_type == SK_GGUF_ARRAY)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "%s: nested arrays are not supported", what);
  kv->data = c->p + c->pos;
  if (kv->arr_type == SK_GGUF_STRING) {
    /* Each string takes at least its 8-byte length: bound n before the
     * allocation it drives. */
    if (kv->n > sk__cur_left(c) / 8 ||
        kv->n > SIZE_MAX / sizeof(struct sk_gguf_str))
      return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                          "%s: array length %" PRIu64
                          " exceeds what the %zu bytes left in the file allow",
                          what, kv->n, sk__cur_left(c));
    kv->strs = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *kv->strs);
    if (!kv->strs)
      return sk_error_set(c->err, SK_ERR_NO_MEMORY,
                          "%s: cannot allocate %" PRIu64 " strings", what, kv->n);
    for (uint64_t i = 0; i < kv->n; i++) {
      r = sk__cur_str(c, what, &kv->strs[i]);
      if (r < 0) return r;
    }
    return 0;
  }
  size_t esz = sk__gguf_type_size(kv->arr_type);
  if (esz == 0)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "%s: unknown array element type %" PRIu32, what,
                        kv->arr_type);
  if (kv->n > sk__cur_left(c) / esz)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "%s: array length %" PRIu64 " of %s exceeds the %zu"
                        " bytes left in the file",
                        what, kv->n, sk__gguf_type_name(kv->arr_type),
                        sk__cur_left(c));
  return sk__cur_take(c, kv->n * esz, what, &b);
}

/* --- sorting names for duplicate checks and lookup ------------------- */

static int sk__str_cmp(const struct sk_gguf_str *a, const struct sk_gguf_str *b) {
  uint64_t n = a->len < b->len ? a->len : b->len;
  int r = n ? memcmp(a->ptr, b->ptr, (size_t)n) : 0;
  if (r) return r;
  return (a->len > b->len) - (a->len < b->len);
}

/* qsort has no context argument: the comparators see the array through
 * this pointer. Only used during open, which is not called concurrently
 * with itself on one object, but two threads may open two files: keep it
 * thread-local. */
static _Thread_local const struct sk_gguf *sk__sort_g;

static int sk__kv_idx_cmp(const void *a, const void *b) {
  const struct sk__kv *kv = sk__sort_g->kv;
  return sk__str_cmp(&kv[*(const uint64_t *)a].key, &kv[*(const uint64_t *)b].key);
}

static int sk__tensor_idx_cmp(const void *a, const void *b) {
  const struct sk_gguf_tensor *t = sk__sort_g->tensors;
  return sk__str_cmp(&t[*(const uint64_t *)a].name, &t[*(const uint64_t *)b].name);
}

/* By offset, then by size (so of two tensors at one offset the empty one
 * comes first). */
static int sk__tensor_off_cmp(const void *a, const void *b) {
  const struct sk_gguf_tensor *ta = &sk__sort_g->tensors[*(const uint64_t *)a];
  const struct sk_gguf_tensor *tb = &sk__sort_g->tensors[*(const uint64_t *)b];
  if (ta->offset != tb->offset) return ta->offset < tb->offset ? -1 : 1;
  return (ta->n_bytes > tb->n_bytes) - (ta->n_bytes < tb->n_bytes);
}

/* --- parse --------------------------------------------------------------- */

static int sk__parse_kvs(struct sk_gguf *g, struct sk__cur *c) {
  char what[SK__GGUF_QUOTE_MAX + 40], q[SK__GGUF_QUOTE_MAX + 4];
  int r;
  for (uint64_t i = 0; i < g->n_kv; i++) {
    struct sk__kv *kv = &g->kv[i];
    snprintf(what, sizeof what, "kv %" PRIu64 " key", i);
    r = sk__cur_str(c, what, &kv->key);
    if (r < 0) return r;
    snprintf(what, sizeof what, "key '%s'", sk__quote(q, kv->key.ptr, kv->key.len));
    r = sk__cur_u32(c, what, &kv->type);
    if (r < 0) return r;
    r = sk__parse_value(c, kv, what);
    if (r < 0) return r;
  }
  g->kv_sorted = malloc((size_t)(g->n_kv ? g->n_kv : 1) * sizeof *g->kv_sorted);
  if (!g->kv_sorted)
    return sk_error_set(c->err, SK_ERR_NO_MEMORY, "cannot allocate key index");
  for (uint64_t i = 0; i < g->n_kv; i++) g->kv_sorted[i] = i;
  sk__sort_g = g;
  qsort(g->kv_sorted, (size_t)g->n_kv, sizeof *g->kv_sorted, sk__kv_idx_cmp);
  for (uint64_t i = 1; i < g->n_kv; i++) {
    const struct sk__kv *a = &g->kv[g->kv_sorted[i - 1]];
    const struct sk__kv *b = &g->kv[g->kv_sorted[i]];
    if (sk__str_cmp(&a->key, &b->key) == 0)
      return sk_error_set(c->err, SK_ERR_BAD_MODEL, "duplicate key '%s'",
                          sk__quote(q, b->key.ptr, b->key.len));
  }
  return 0;
}

static int sk__parse_tensor_info(struct sk_gguf *g, struct sk__cur *c,
                                 uint64_t i) {
  struct sk_gguf_tensor *t = &g->tensors[i];
  char what[SK__GGUF_QUOTE_MAX + 40], q[SK__GGUF_QUOTE_MAX + 4];
  int r;
  snprintf(what, sizeof what, "tensor %" PRIu64 " name", i);
  r = sk__cur_str(c, what, &t->name);
  if (r < 0) return r;
  sk__quote(q, t->name.ptr, t->name.len);
  if (t->name.len > SK_GGUF_MAX_NAME)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "tensor %" PRIu64 " name '%s': length %" PRIu64
                        " exceeds %u bytes", i, q, t->name.len, SK_GGUF_MAX_NAME);
  snprintf(what, sizeof what, "tensor '%s' n_dims", q);
  r = sk__cur_u32(c, what, &t->n_dims);
  if (r < 0) return r;
  if (t->n_dims < 1 || t->n_dims > SK_GGUF_MAX_DIMS)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "tensor '%s': n_dims %" PRIu32 " not in 1..%u", q,
                        t->n_dims, SK_GGUF_MAX_DIMS);
  uint64_t n = 1;
  for (uint32_t d = 0; d < SK_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
  snprintf(what, sizeof what, "tensor '%s' dimensions", q);
  for (uint32_t d = 0; d < t->n_dims; d++) {
    r = sk__cur_u64(c, what, &t->ne[d]);
    if (r < 0) return r;
    /* ggml keeps ne as int64_t: the element count must fit in it. A zero
     * dimension is legal here (ggml allows it); the model refuses empty
     * weights. */
    if (t->ne[d] > INT64_MAX)
      return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                          "tensor '%s': dimension %" PRIu32 " = %" PRIu64
                          " exceeds INT64_MAX", q, d, t->ne[d]);
    if (t->ne[d] != 0 && n > (uint64_t)INT64_MAX / t->ne[d])
      return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                          "tensor '%s': element count overflows at dimension %"
                          PRIu32 " = %" PRIu64, q, d, t->ne[d]);
    n *= t->ne[d];
  }
  t->n_elements = n;
  snprintf(what, sizeof what, "tensor '%s' type", q);
  r = sk__cur_u32(c, what, &t->type);
  if (r < 0) return r;
  const struct sk__ggml_traits *tr = sk__type_traits(t->type);
  if (!tr)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "tensor '%s': unknown type %" PRIu32, q, t->type);
  if (t->ne[0] % tr->blck != 0)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "tensor '%s': ne[0] = %" PRIu64
                        " is not a multiple of the %s block size %" PRIu32,
                        q, t->ne[0], tr->name, tr->blck);
  /* ne[0] is a multiple of blck, so n is too. */
  uint64_t blocks = n / tr->blck;
  if (blocks > SIZE_MAX / tr->size)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "tensor '%s': byte size of %" PRIu64 " %s elements"
                        " overflows", q, n, tr->name);
  t->n_bytes = blocks * tr->size;
  snprintf(what, sizeof what, "tensor '%s' offset", q);
  r = sk__cur_u64(c, what, &t->offset);
  if (r < 0) return r;
  if (t->offset % g->alignment != 0)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                        "tensor '%s': offset %" PRIu64
                        " is not a multiple of the alignment %" PRIu32,
                        q, t->offset, g->alignment);
  return 0;
}

/* No two tensors may share a byte. ggml itself does not check this, but a
 * writer lays tensors out one after another: weights that alias each other
 * are a crafted file, and a model that writes through one (none does now)
 * would corrupt the other. Empty tensors occupy nothing. */
static int sk__check_overlap(struct sk_gguf *g, struct sk__cur *c) {
  if (g->n_tensors < 2) return 0;
  uint64_t *order = malloc((size_t)g->n_tensors * sizeof *order);
  if (!order) return sk_error_set(c->err, SK_ERR_NO_MEMORY, "cannot allocate tensor order");
  for (uint64_t i = 0; i < g->n_tensors; i++) order[i] = i;
  sk__sort_g = g;
  qsort(order, (size_t)g->n_tensors, sizeof *order, sk__tensor_off_cmp);
  int r = 0;
  const struct sk_gguf_tensor *prev = NULL; /* the non-empty tensor ending last */
  for (uint64_t i = 0; i < g->n_tensors && r == 0; i++) {
    const struct sk_gguf_tensor *t = &g->tensors[order[i]];
    if (t->n_bytes == 0) continue;
    /* Offsets and sizes were checked against the file: no wrap here. */
    if (prev && t->offset < prev->offset + prev->n_bytes) {
      char qa[SK__GGUF_QUOTE_MAX + 4], qb[SK__GGUF_QUOTE_MAX + 4];
      r = sk_error_set(c->err, SK_ERR_BAD_MODEL,
                       "tensors '%s' (offset %" PRIu64 ", %" PRIu64 " bytes) and '%s' (offset %"
                       PRIu64 ", %" PRIu64 " bytes) overlap",
                       sk__quote(qa, prev->name.ptr, prev->name.len), prev->offset,
                       prev->n_bytes, sk__quote(qb, t->name.ptr, t->name.len), t->offset,
                       t->n_bytes);
    }
    if (!prev || t->offset + t->n_bytes > prev->offset + prev->n_bytes) prev = t;
  }
  free(order);
  return r;
}

static int sk__parse_tensors(struct sk_gguf *g, struct sk__cur *c) {
  char q[SK__GGUF_QUOTE_MAX + 4];
  int r;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    r = sk__parse_tensor_info(g, c, i);
    if (r < 0) return r;
  }
  g->tensor_sorted =
      malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *g->tensor_sorted);
  if (!g->tensor_sorted)
    return sk_error_set(c->err, SK_ERR_NO_MEMORY, "cannot allocate tensor index");
  for (uint64_t i = 0; i < g->n_tensors; i++) g->tensor_sorted[i] = i;
  sk__sort_g = g;
  qsort(g->tensor_sorted, (size_t)g->n_tensors, sizeof *g->tensor_sorted,
        sk__tensor_idx_cmp);
  for (uint64_t i = 1; i < g->n_tensors; i++) {
    const struct sk_gguf_tensor *a = &g->tensors[g->tensor_sorted[i - 1]];
    const struct sk_gguf_tensor *b = &g->tensors[g->tensor_sorted[i]];
    if (sk__str_cmp(&a->name, &b->name) == 0)
      return sk_error_set(c->err, SK_ERR_BAD_MODEL, "duplicate tensor name '%s'",
                          sk__quote(q, b->name.ptr, b->name.len));
  }

  /* The data section starts at the end of the tensor infos rounded up to
   * the alignment (gguf.md). A file without tensors needs none. */
  uint64_t start = c->pos;
  uint64_t pad = (g->alignment - start % g->alignment) % g->alignment;
  if (pad > UINT64_MAX - start)
    return sk_error_set(c->err, SK_ERR_BAD_MODEL, "data section offset overflows");
  start += pad;
  if (start > c->size) {
    if (g->n_tensors > 0)
      return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                          "data section offset %" PRIu64
                          " exceeds the file size %zu", start, c->size);
    start = c->size;
  }
  g->data_offset = start;
  uint64_t data_size = c->size - start;
  for (uint64_t i = 0; i < g->n_tensors; i++) {
    struct sk_gguf_tensor *t = &g->tensors[i];
    /* Written so that offset + n_bytes cannot wrap. */
    if (t->offset > data_size || t->n_bytes > data_size - t->offset)
      return sk_error_set(c->err, SK_ERR_BAD_MODEL,
                          "tensor '%s': offset %" PRIu64 " + %" PRIu64
                          " bytes exceeds data section size %" PRIu64,
                          sk__quote(q, t->name.ptr, t->name.len), t->offset,
                          t->n_bytes, data_size);
    t->data = g->base + start + t->offset;
  }
  return sk__check_overlap(g, c);
}

static int sk__parse(struct sk_gguf *g, struct sk_error *err) {
  struct sk__cur c = {g->base, g->size, 0, err};
  const uint8_t *magic = NULL;
  int r;

  r = sk__cur_take(&c, 4, "magic", &magic);
  if (r < 0) return r;
  if (memcmp(magic, SK__GGUF_MAGIC, 4) != 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "bad magic %02x %02x %02x %02x (expected \"GGUF\")",
                        magic[0], magic[1], magic[2], magic[3]);
  r = sk__cur_u32(&c, "version", &g->version);
  if (r < 0) return r;
  /* v1 used 32-bit counts and lengths; v3 only added big-endian files,
   * whose version reads byte-swapped here and is refused. */
  if (g->version != 2 && g->version != 3)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "unsupported version %" PRIu32 " (expected 2 or 3)",
                        g->version);
  r = sk__cur_u64(&c, "tensor count", &g->n_tensors);
  if (r < 0) return r;
  r = sk__cur_u64(&c, "kv count", &g->n_kv);
  if (r < 0) return r;
  if (g->n_tensors > sk__cur_left(&c) / SK__GGUF_MIN_TENSOR_BYTES ||
      g->n_tensors > SIZE_MAX / sizeof *g->tensors)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tensor count %" PRIu64
                        " exceeds what the file size %zu allows",
                        g->n_tensors, g->size);
  if (g->n_kv > sk__cur_left(&c) / SK__GGUF_MIN_KV_BYTES ||
      g->n_kv > SIZE_MAX / sizeof *g->kv)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "kv count %" PRIu64 " exceeds what the file size %zu allows",
                        g->n_kv, g->size);

  g->kv = calloc((size_t)(g->n_kv ? g->n_kv : 1), sizeof *g->kv);
  g->tensors = calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *g->tensors);
  if (!g->kv || !g->tensors)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %" PRIu64
                        " kv pairs and %" PRIu64 " tensors", g->n_kv, g->n_tensors);
  r = sk__parse_kvs(g, &c);
  if (r < 0) return r;

  uint32_t align = SK_GGUF_DEFAULT_ALIGNMENT;
  r = sk_gguf_get_u32(g, "general.alignment", &align, err);
  if (r < 0) return r;
  if (align == 0 || (align & (align - 1)) != 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "general.alignment %" PRIu32
                        " is not a nonzero power of two", align);
  g->alignment = align;
  return sk__parse_tensors(g, &c);
}

static int sk__open_common(struct sk_gguf *g, struct sk_gguf **ret,
                           struct sk_error *err) {
  int r = sk__parse(g, err);
  if (r < 0) {
    sk_gguf_close(g);
    return r;
  }
  *ret = g;
  return 0;
}

int sk_gguf_open_buffer(const void *buf, size_t size, struct sk_gguf **ret,
                        struct sk_error *err) {
  struct sk_gguf *g = calloc(1, sizeof *g);
  if (!g) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate gguf");
  /* An empty buffer may come as NULL: point at a dummy so pointer
   * arithmetic stays defined; the cursor never reads it. */
  static const uint8_t empty[1];
  g->base = buf ? buf : empty;
  g->size = buf ? size : 0;
  return sk__open_common(g, ret, err);
}

/* What a file that is not a regular file is, for messages. */
static const char *sk__file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of another type";
}

int sk_gguf_open(const char *path, struct sk_gguf **ret, struct sk_error *err) {
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
   * writer forever; the type is checked right after, before any read. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    return sk_error_set(err, SK_ERR_IO, "open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    return sk_error_set(err, SK_ERR_IO, "stat %s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return sk_error_set(err, SK_ERR_IO, "%s is %s, not a regular file", path,
                        sk__file_kind(st.st_mode));
  }
  if ((uint64_t)st.st_size > SIZE_MAX) {
    close(fd);
    return sk_error_set(err, SK_ERR_BAD_MODEL, "%s: file size %jd too large",
                        path, (intmax_t)st.st_size);
  }
  size_t size = (size_t)st.st_size;
  void *map = NULL;
  if (size > 0) {
    map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      int e = errno;
      close(fd);
      return sk_error_set(err, SK_ERR_IO, "mmap %s: %s", path, strerror(e));
    }
  }
  close(fd); /* the mapping keeps the file */
  struct sk_gguf *g = calloc(1, sizeof *g);
  if (!g) {
    if (map) munmap(map, size);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate gguf");
  }
  static const uint8_t empty[1];
  g->map = map;
  g->base = map ? map : empty;
  g->size = size;
  return sk__open_common(g, ret, err);
}

void sk_gguf_release(const struct sk_gguf *g, const void *p, size_t n) {
  if (!g->map || n == 0) return;
  const uintptr_t lo = (uintptr_t)g->base, hi = lo + g->size, a = (uintptr_t)p;
  if (a < lo || a >= hi || n > hi - a) return;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t start = (a + page - 1) / page * page, end = (a + n) / page * page;
  if (start < end) (void)madvise((void *)start, end - start, MADV_DONTNEED); /* advice only */
}

void sk_gguf_close(struct sk_gguf *g) {
  if (!g) return;
  if (g->kv)
    for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].strs);
  free(g->kv);
  free(g->kv_sorted);
  free(g->tensors);
  free(g->tensor_sorted);
  if (g->map) munmap(g->map, g->size);
  free(g);
}

uint32_t sk_gguf_version(const struct sk_gguf *g) { return g->version; }
uint64_t sk_gguf_n_tensors(const struct sk_gguf *g) { return g->n_tensors; }
uint64_t sk_gguf_n_kv(const struct sk_gguf *g) { return g->n_kv; }
uint32_t sk_gguf_alignment(const struct sk_gguf *g) { return g->alignment; }
uint64_t sk_gguf_data_offset(const struct sk_gguf *g) { return g->data_offset; }

const void *sk_gguf_bytes(const struct sk_gguf *g, size_t *ret_size) {
  *ret_size = g->size;
  return g->base;
}

const struct sk_gguf_tensor *sk_gguf_tensor(const struct sk_gguf *g, uint64_t i) {
  return i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* Binary search over the name-sorted index. */
const struct sk_gguf_tensor *sk_gguf_find_tensor(const struct sk_gguf *g,
                                                 const char *name) {
  struct sk_gguf_str s = {name, strlen(name)};
  uint64_t lo = 0, hi = g->n_tensors;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    const struct sk_gguf_tensor *t = &g->tensors[g->tensor_sorted[mid]];
    int c = sk__str_cmp(&t->name, &s);
    if (c == 0) return t;
    if (c < 0) lo = mid + 1; else hi = mid;
  }
  return NULL;
}

static const struct sk__kv *sk__find_kv(const struct sk_gguf *g, const char *key) {
  struct sk_gguf_str s = {key, strlen(key)};
  uint64_t lo = 0, hi = g->n_kv;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    const struct sk__kv *kv = &g->kv[g->kv_sorted[mid]];
    int c = sk__str_cmp(&kv->key, &s);
    if (c == 0) return kv;
    if (c < 0) lo = mid + 1; else hi = mid;
  }
  return NULL;
}

static int sk__wrong_type(struct sk_error *err, const char *key,
                          const struct sk__kv *kv, const char *expected) {
  if (kv->type == SK_GGUF_ARRAY)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "key '%s': expected %s, got array of %s", key, expected,
                        sk__gguf_type_name(kv->arr_type));
  return sk_error_set(err, SK_ERR_BAD_MODEL, "key '%s': expected %s, got %s",
                      key, expected, sk__gguf_type_name(kv->type));
}

int sk_gguf_get_u32(const struct sk_gguf *g, const char *key, uint32_t *ret,
                    struct sk_error *err) {
  const struct sk__kv *kv = sk__find_kv(g, key);
  if (!kv) return 0;
  if (!sk__is_int_type(kv->type)) return sk__wrong_type(err, key, kv, "an integer");
  struct sk__int v = sk__read_int(kv->type, kv->data);
  if (!sk__int_in(v, 0, UINT32_MAX)) {
    if (v.is_signed)
      return sk_error_set(err, SK_ERR_BAD_MODEL,
                          "key '%s': value %" PRId64 " does not fit uint32", key, v.s);
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "key '%s': value %" PRIu64 " does not fit uint32", key, v.u);
  }
  *ret = v.is_signed ? (uint32_t)v.s : (uint32_t)v.u;
  return 1;
}

int sk_gguf_get_f32(const struct sk_gguf *g, const char *key, float *ret,
                    struct sk_error *err) {
  const struct sk__kv *kv = sk__find_kv(g, key);
  if (!kv) return 0;
  if (kv->type == SK_GGUF_FLOAT32) {
    *ret = sk__read_f32(kv->data);
  } else if (kv->type == SK_GGUF_FLOAT64) {
    *ret = (float)sk__read_f64(kv->data);
  } else {
    return sk__wrong_type(err, key, kv, "float32");
  }
  return 1;
}

int sk_gguf_get_bool(const struct sk_gguf *g, const char *key, bool *ret,
                     struct sk_error *err) {
  const struct sk__kv *kv = sk__find_kv(g, key);
  if (!kv) return 0;
  if (kv->type != SK_GGUF_BOOL) return sk__wrong_type(err, key, kv, "bool");
  *ret = kv->data[0] != 0;
  return 1;
}

int sk_gguf_get_str(const struct sk_gguf *g, const char *key,
                    struct sk_gguf_str *ret, struct sk_error *err) {
  const struct sk__kv *kv = sk__find_kv(g, key);
  if (!kv) return 0;
  if (kv->type != SK_GGUF_STRING) return sk__wrong_type(err, key, kv, "string");
  *ret = kv->str;
  return 1;
}

int sk_gguf_get_str_array(const struct sk_gguf *g, const char *key,
                          const struct sk_gguf_str **ret, uint64_t *ret_n,
                          struct sk_error *err) {
  const struct sk__kv *kv = sk__find_kv(g, key);
  if (!kv) return 0;
  if (kv->type != SK_GGUF_ARRAY || kv->arr_type != SK_GGUF_STRING)
    return sk__wrong_type(err, key, kv, "array of string");
  *ret = kv->strs;
  *ret_n = kv->n;
  return 1;
}

int sk_gguf_get_f32_array(const struct sk_gguf *g, const char *key,
                          float **ret, uint64_t *ret_n, struct sk_error *err) {
  const struct sk__kv *kv = sk__find_kv(g, key);
  if (!kv) return 0;
  if (kv->type != SK_GGUF_ARRAY ||
      !(kv->arr_type == SK_GGUF_FLOAT32 || kv->arr_type == SK_GGUF_FLOAT64 ||
        sk__is_int_type(kv->arr_type)))
    return sk__wrong_type(err, key, kv, "array of numbers");
  /* n * element size <= file size was checked at open; n floats fit. */
  float *out = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *out);
  if (!out)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "key '%s': cannot allocate %" PRIu64
                        " floats", key, kv->n);
  size_t esz = sk__gguf_type_size(kv->arr_type);
  for (uint64_t i = 0; i < kv->n; i++) {
    const uint8_t *b = kv->data + i * esz;
    if (kv->arr_type == SK_GGUF_FLOAT32) {
      out[i] = sk__read_f32(b);
    } else if (kv->arr_type == SK_GGUF_FLOAT64) {
      out[i] = (float)sk__read_f64(b);
    } else {
      struct sk__int v = sk__read_int(kv->arr_type, b);
      out[i] = v.is_signed ? (float)v.s : (float)v.u;
    }
  }
  *ret = out;
  *ret_n = kv->n;
  return 1;
}

int sk_gguf_get_i32_array(const struct sk_gguf *g, const char *key,
                          int32_t **ret, uint64_t *ret_n, struct sk_error *err) {
  const struct sk__kv *kv = sk__find_kv(g, key);
  if (!kv) return 0;
  if (kv->type != SK_GGUF_ARRAY || !sk__is_int_type(kv->arr_type))
    return sk__wrong_type(err, key, kv, "array of integers");
  int32_t *out = malloc((size_t)(kv->n ? kv->n : 1) * sizeof *out);
  if (!out)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "key '%s': cannot allocate %" PRIu64
                        " integers", key, kv->n);
  size_t esz = sk__gguf_type_size(kv->arr_type);
  for (uint64_t i = 0; i < kv->n; i++) {
    struct sk__int v = sk__read_int(kv->arr_type, kv->data + i * esz);
    if (!sk__int_in(v, INT32_MIN, INT32_MAX)) {
      free(out);
      return sk_error_set(err, SK_ERR_BAD_MODEL,
                          "key '%s': element %" PRIu64 " does not fit int32",
                          key, i);
    }
    out[i] = v.is_signed ? (int32_t)v.s : (int32_t)v.u;
  }
  *ret = out;
  *ret_n = kv->n;
  return 1;
}
