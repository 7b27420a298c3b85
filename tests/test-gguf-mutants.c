/* Mutated GGUF files: the real test model, cut and changed every way a
 * file can lie, through the whole load the daemon does (gguf -> model ->
 * tokenizer -> vocabulary check) and, when a mutant still loads, a short
 * forward pass and a round trip through the tokenizer. Each mutant gives
 * a clear -SK_ERR_BAD_MODEL (a message naming what is wrong) or loads
 * into something that works; never a crash, never an out-of-memory (no
 * allocation follows a declared size), never an overread (every mutant
 * lives in an exactly sized buffer: ASan and valgrind see a read past it).
 *
 * The mutants:
 *  - truncations at every section boundary: each header field, each key,
 *    value, string, array and tensor-info field, the padding, and the
 *    start and end of every tensor's data;
 *  - every count, length, type, n_dims, dimension and offset field (found
 *    by a walker written here, independent of gguf.c) set to 0, 1, 2,
 *    its value +-1, 2^31-1, 2^31, 2^32-1, 2^32, 2^63-1, 2^63, 2^64-1 (u64)
 *    or the u32 edges and type numbers around the known ones;
 *  - structural cases with expected messages: counts and lengths at their
 *    maxima, alignment 0 and friends (a general.alignment key added by a
 *    rewriter), n_dims beyond the maximum, offsets past and wrapping the
 *    end, overlapping tensors, unknown tensor and value types, and a
 *    vocabulary that disagrees with the embedding;
 *  - a few of them handed to the sinkd binary, which must exit 1 with the
 *    message in its log.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "session/kvcache.h"
#include "model/model.h"
#include "testutil.h"
#include "model/tokenizer.h"

/* ---- the load the daemon does ------------------------------------------ */

struct outcome {
  int rc;                /* 0 = loaded and worked */
  struct sk_error err;
  const char *stage;     /* "gguf", "model", "tokenizer", "vocab", "run" */
};

/* A short workload on a loaded model: tokenize, forward, detokenize. */
static int exercise(const struct sk_model *m, const struct sk_tokenizer *t,
                    struct sk_error *err) {
  int32_t *toks = NULL;
  size_t n = 0;
  int rc = sk_tokenizer_encode(t, "Once upon a time", 16, true, &toks, &n, err);
  if (rc < 0) return rc;
  if (n > 8) n = 8;
  struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = 16, .rope_scale = 1.0f};
  struct sk_kv *kv = NULL;
  struct sk_scratch *s = NULL;
  float *logits = malloc(sk_model_config(m)->n_vocab * sizeof *logits);
  if (!logits) {
    free(toks);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "logits");
  }
  rc = sk_kv_new(sk_model_kv_shape(m), &p, &kv, err);
  if (rc == 0) rc = sk_scratch_new(m, 8, 16, &s, err);
  if (rc == 0) rc = sk_model_forward(m, s, kv, toks, (uint32_t)n, logits, false, err);
  if (rc == 0) {
    char *text = NULL;
    size_t len = 0;
    rc = sk_tokenizer_decode(t, toks, n, &text, &len, err);
    free(text);
  }
  sk_scratch_free(s);
  sk_kv_free(kv);
  free(logits);
  free(toks);
  return rc;
}

static struct outcome load(const uint8_t *buf, size_t len) {
  struct outcome o = {0, {0, ""}, "gguf"};
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct sk_tokenizer *t = NULL;
  o.rc = sk_gguf_open_buffer(buf, len, &g, &o.err);
  if (o.rc == 0) {
    o.stage = "model";
    o.rc = sk_model_load(g, &m, &o.err);
  }
  if (o.rc == 0) {
    o.stage = "tokenizer";
    o.rc = sk_tokenizer_load(g, &t, &o.err);
  }
  if (o.rc == 0) {
    /* As sinkd's main does: the tokenizer must cover the embedding. */
    o.stage = "vocab";
    if (sk_tokenizer_n_vocab(t) != sk_model_config(m)->n_vocab)
      o.rc = sk_error_set(&o.err, SK_ERR_BAD_MODEL,
                          "the tokenizer has %u tokens but token_embd.weight has %u rows",
                          sk_tokenizer_n_vocab(t), sk_model_config(m)->n_vocab);
  }
  if (o.rc == 0) {
    o.stage = "run";
    o.rc = exercise(m, t, &o.err);
  }
  sk_tokenizer_free(t);
  sk_model_free(m);
  sk_gguf_close(g);
  return o;
}

/* Tallies of one test, for the figures. */
static unsigned long g_tried, g_refused, g_loaded;

/* The verdict every mutant must meet: loaded and working, or refused as a
 * bad model with a message. Returns the outcome for finer checks. */
static struct outcome check_mutant(const uint8_t *buf, size_t len, const char *what) {
  struct outcome o = load(buf, len);
  g_tried++;
  if (o.rc == 0) {
    g_loaded++;
    return o;
  }
  g_refused++;
  if (o.rc != -SK_ERR_BAD_MODEL || o.err.code != SK_ERR_BAD_MODEL || !o.err.message[0])
    fail_msg("%s: %s stage gave %d (%s) '%s', expected a bad_model error", what, o.stage, o.rc,
             sk_error_name(o.rc), o.err.message);
  for (const char *p = o.err.message; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
      fail_msg("%s: message has an unprintable byte: %s", what, o.err.message);
  return o;
}

/* Refused at some stage with `needle` in the message. */
static void expect_refused(const uint8_t *buf, size_t len, const char *what, const char *needle) {
  struct outcome o = check_mutant(buf, len, what);
  if (o.rc == 0) fail_msg("%s: loaded, expected '%s'", what, needle);
  if (!strstr(o.err.message, needle))
    fail_msg("%s: message '%s' lacks '%s'", what, o.err.message, needle);
}

/* ---- an independent walk of the file ------------------------------------ */

enum section { SEC_HEADER, SEC_KV, SEC_TENSOR_INFO, SEC_DATA };

struct field {
  size_t off;
  unsigned size;  /* 4 or 8 */
  char label[96];
  enum section sec;
};

struct boundary {
  size_t off;
  char label[96];
  enum section sec;
};

struct tinfo {
  char name[72];
  size_t info_off;   /* where its info starts */
  size_t offset_off; /* where its offset field is */
  size_t type_off;
  size_t ndims_off;
  uint64_t offset;
  uint64_t n_bytes;
};

struct kvinfo {
  char key[96];
  size_t start, end; /* raw bytes of the pair */
  size_t type_off;
};

struct walk {
  const uint8_t *d;
  size_t size, pos;
  struct field *fields;
  size_t n_fields, cap_fields;
  struct boundary *bounds;
  size_t n_bounds, cap_bounds;
  struct kvinfo kvs[64];
  size_t n_kv;
  struct tinfo tensors[64];
  size_t n_tensors;
  size_t data_off;
};

static void add_field(struct walk *w, size_t off, unsigned size, enum section sec, const char *fmt,
                      ...) __attribute__((format(printf, 5, 6)));
static void add_field(struct walk *w, size_t off, unsigned size, enum section sec, const char *fmt,
                      ...) {
  if (w->n_fields == w->cap_fields) {
    w->cap_fields = w->cap_fields ? 2 * w->cap_fields : 256;
    w->fields = realloc(w->fields, w->cap_fields * sizeof *w->fields);
  }
  struct field *f = &w->fields[w->n_fields++];
  f->off = off;
  f->size = size;
  f->sec = sec;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->label, sizeof f->label, fmt, ap);
  va_end(ap);
}

static void add_bound(struct walk *w, size_t off, enum section sec, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add_bound(struct walk *w, size_t off, enum section sec, const char *fmt, ...) {
  if (w->n_bounds == w->cap_bounds) {
    w->cap_bounds = w->cap_bounds ? 2 * w->cap_bounds : 256;
    w->bounds = realloc(w->bounds, w->cap_bounds * sizeof *w->bounds);
  }
  struct boundary *b = &w->bounds[w->n_bounds++];
  b->off = off;
  b->sec = sec;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->label, sizeof b->label, fmt, ap);
  va_end(ap);
}

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static size_t w_u32(struct walk *w, enum section sec, const char *label) {
  size_t off = w->pos;
  add_bound(w, off, sec, "%s", label);
  add_field(w, off, 4, sec, "%s", label);
  w->pos += 4;
  return off;
}

static uint64_t w_u64(struct walk *w, enum section sec, const char *label) {
  size_t off = w->pos;
  add_bound(w, off, sec, "%s", label);
  add_field(w, off, 8, sec, "%s", label);
  w->pos += 8;
  return rd64(w->d + off);
}

/* A string: its length field, then its bytes (a boundary inside too). */
static void w_str(struct walk *w, enum section sec, const char *label, char *out, size_t out_size) {
  char l[192]; /* a label (up to 159 bytes) and its suffix, whole */
  snprintf(l, sizeof l, "%s length", label);
  uint64_t n = w_u64(w, sec, l);
  snprintf(l, sizeof l, "%s bytes", label);
  add_bound(w, w->pos, sec, "%s", l);
  if (n > 1) add_bound(w, w->pos + n / 2, sec, "%s middle", label);
  if (out) snprintf(out, out_size, "%.*s", (int)(n < out_size ? n : out_size - 1), w->d + w->pos);
  w->pos += n;
}

static size_t scalar_size(uint32_t type) {
  switch (type) {
  case 0: case 1: case 7: return 1;
  case 2: case 3: return 2;
  case 4: case 5: case 6: return 4;
  case 10: case 11: case 12: return 8;
  default: return 0;
  }
}

static void walk_file(struct walk *w, const uint8_t *d, size_t size) {
  memset(w, 0, sizeof *w);
  w->d = d;
  w->size = size;
  add_bound(w, 0, SEC_HEADER, "magic");
  w->pos = 4;
  w_u32(w, SEC_HEADER, "version");
  uint64_t n_tensors = w_u64(w, SEC_HEADER, "tensor count");
  uint64_t n_kv = w_u64(w, SEC_HEADER, "kv count");
  assert_true(n_kv <= 64 && n_tensors <= 64);
  for (uint64_t i = 0; i < n_kv; i++) {
    struct kvinfo *kv = &w->kvs[w->n_kv++];
    kv->start = w->pos;
    char label[160]; /* a key (up to 95 bytes) and its words, whole */
    snprintf(label, sizeof label, "kv %" PRIu64 " key", i);
    w_str(w, SEC_KV, label, kv->key, sizeof kv->key);
    snprintf(label, sizeof label, "kv '%s' type", kv->key);
    kv->type_off = w_u32(w, SEC_KV, label);
    uint32_t type = rd32(d + kv->type_off);
    snprintf(label, sizeof label, "kv '%s' value", kv->key);
    if (type == 8) {
      w_str(w, SEC_KV, label, NULL, 0);
    } else if (type == 9) {
      snprintf(label, sizeof label, "kv '%s' element type", kv->key);
      size_t et_off = w_u32(w, SEC_KV, label);
      uint32_t et = rd32(d + et_off);
      snprintf(label, sizeof label, "kv '%s' array length", kv->key);
      uint64_t n = w_u64(w, SEC_KV, label);
      if (et == 8) {
        for (uint64_t k = 0; k < n; k++) {
          snprintf(label, sizeof label, "kv '%s' string %" PRIu64, kv->key, k);
          w_str(w, SEC_KV, label, NULL, 0);
        }
      } else {
        size_t es = scalar_size(et);
        assert_true(es > 0);
        add_bound(w, w->pos, SEC_KV, "kv '%s' elements", kv->key);
        add_bound(w, w->pos + es * n / 2, SEC_KV, "kv '%s' middle element", kv->key);
        w->pos += es * n;
      }
    } else {
      size_t es = scalar_size(type);
      assert_true(es > 0);
      add_bound(w, w->pos, SEC_KV, "%s", label);
      if (es >= 4) add_field(w, w->pos, (unsigned)es, SEC_KV, "%s", label);
      w->pos += es;
    }
    kv->end = w->pos;
  }
  for (uint64_t i = 0; i < n_tensors; i++) {
    struct tinfo *t = &w->tensors[w->n_tensors++];
    t->info_off = w->pos;
    char label[128];
    snprintf(label, sizeof label, "tensor %" PRIu64 " name", i);
    w_str(w, SEC_TENSOR_INFO, label, t->name, sizeof t->name);
    snprintf(label, sizeof label, "tensor '%s' n_dims", t->name);
    t->ndims_off = w_u32(w, SEC_TENSOR_INFO, label);
    uint32_t nd = rd32(d + t->ndims_off);
    uint64_t ne = 1;
    for (uint32_t k = 0; k < nd; k++) {
      snprintf(label, sizeof label, "tensor '%s' ne[%u]", t->name, k);
      ne *= w_u64(w, SEC_TENSOR_INFO, label);
    }
    snprintf(label, sizeof label, "tensor '%s' type", t->name);
    t->type_off = w_u32(w, SEC_TENSOR_INFO, label);
    assert_int_equal(rd32(d + t->type_off), 0); /* the test model is all F32 */
    t->n_bytes = ne * 4;
    snprintf(label, sizeof label, "tensor '%s' offset", t->name);
    t->offset_off = w->pos;
    t->offset = w_u64(w, SEC_TENSOR_INFO, label);
  }
  add_bound(w, w->pos, SEC_DATA, "padding");
  w->data_off = (w->pos + 31) / 32 * 32;
  for (size_t i = 0; i < w->n_tensors; i++) {
    const struct tinfo *t = &w->tensors[i];
    add_bound(w, w->data_off + t->offset, SEC_DATA, "tensor '%s' data", t->name);
    add_bound(w, w->data_off + t->offset + t->n_bytes / 2, SEC_DATA, "tensor '%s' middle", t->name);
  }
  /* The last tensor ends at the end of the file. */
  const struct tinfo *last = &w->tensors[w->n_tensors - 1];
  assert_int_equal(w->data_off + last->offset + last->n_bytes, size);
}

static void walk_free(struct walk *w) {
  free(w->fields);
  free(w->bounds);
}

static const struct tinfo *find_tensor(const struct walk *w, const char *name) {
  for (size_t i = 0; i < w->n_tensors; i++)
    if (!strcmp(w->tensors[i].name, name)) return &w->tensors[i];
  fail_msg("no tensor %s", name);
  return NULL;
}

static const struct kvinfo *find_kv(const struct walk *w, const char *key) {
  for (size_t i = 0; i < w->n_kv; i++)
    if (!strcmp(w->kvs[i].key, key)) return &w->kvs[i];
  fail_msg("no key %s", key);
  return NULL;
}

static uint8_t *g_file;
static size_t g_size;
static struct walk g_walk;

/* ---- tests -------------------------------------------------------------- */

static void test_unmutated_loads(void **state) {
  (void)state;
  struct outcome o = load(g_file, g_size);
  if (o.rc != 0) fail_msg("%s: %s", o.stage, o.err.message);
  print_message("walker: %zu fields, %zu section boundaries, %zu kv pairs, %zu tensors\n",
                g_walk.n_fields, g_walk.n_bounds, g_walk.n_kv, g_walk.n_tensors);
}

/* Cut at every section boundary (and one byte either side). */
static void test_truncations(void **state) {
  (void)state;
  g_tried = g_refused = g_loaded = 0;
  uint8_t *copy = malloc(g_size);
  for (size_t i = 0; i < g_walk.n_bounds; i++) {
    const struct boundary *b = &g_walk.bounds[i];
    for (int delta = -1; delta <= 1; delta++) {
      if ((delta < 0 && b->off == 0) || b->off + (size_t)(delta + 1) > g_size) continue;
      size_t len = b->off + (size_t)delta;
      uint8_t *cut = malloc(len ? len : 1); /* exactly sized: overreads show */
      memcpy(cut, g_file, len);
      char what[160];
      snprintf(what, sizeof what, "cut at %s%+d (%zu bytes)", b->label, delta, len);
      struct outcome o = check_mutant(cut, len, what);
      if (o.rc == 0) fail_msg("%s: a truncated file loaded", what);
      /* The message says what is missing. */
      const char *need = b->sec == SEC_DATA && len >= g_walk.data_off ? "exceeds"
                         : b->sec == SEC_HEADER && len < 24       ? "truncated"
                                                                  : NULL;
      if (need && !strstr(o.err.message, need))
        fail_msg("%s: message '%s' lacks '%s'", what, o.err.message, need);
      if (!need && !strstr(o.err.message, "truncated") && !strstr(o.err.message, "exceeds"))
        fail_msg("%s: message '%s' says neither truncated nor exceeds", what, o.err.message);
      free(cut);
    }
  }
  free(copy);
  print_message("figures: GGUF mutants: %lu truncations at %zu section boundaries, all refused\n",
                g_tried, g_walk.n_bounds);
  assert_int_equal(g_refused, g_tried);
}

/* Every numeric field of the header, kv table and tensor infos set to the
 * values that break naive loaders. */
static void test_field_values(void **state) {
  (void)state;
  g_tried = g_refused = g_loaded = 0;
  uint8_t *buf = malloc(g_size);
  memcpy(buf, g_file, g_size);
  for (size_t i = 0; i < g_walk.n_fields; i++) {
    const struct field *f = &g_walk.fields[i];
    uint64_t orig = f->size == 4 ? rd32(buf + f->off) : rd64(buf + f->off);
    uint64_t vals[24];
    size_t n = 0;
    vals[n++] = 0;
    vals[n++] = 1;
    vals[n++] = 2;
    vals[n++] = orig + 1;
    vals[n++] = orig - 1;
    vals[n++] = orig * 2;
    vals[n++] = UINT64_C(0x7fffffff);
    vals[n++] = UINT64_C(0x80000000);
    vals[n++] = UINT64_C(0xffffffff);
    if (f->size == 8) {
      vals[n++] = UINT64_C(1) << 32;
      vals[n++] = UINT64_C(0x7fffffffffffffff);
      vals[n++] = UINT64_C(1) << 63;
      vals[n++] = UINT64_MAX;
      vals[n++] = UINT64_MAX - 31; /* aligned, wraps when a size is added */
      vals[n++] = g_size;
    } else {
      /* Type numbers around the known ones (value, element, tensor). */
      const uint32_t types[] = {4, 5, 8, 9, 12, 13, 29, 30, 31, 39, 40, 1000};
      for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) vals[n++] = types[k];
    }
    for (size_t v = 0; v < n; v++) {
      if (vals[v] == orig) continue;
      if (f->size == 4) wr32(buf + f->off, (uint32_t)vals[v]);
      else wr64(buf + f->off, vals[v]);
      char what[160];
      snprintf(what, sizeof what, "%s = %" PRIu64 " (was %" PRIu64 ")", f->label, vals[v], orig);
      check_mutant(buf, g_size, what);
    }
    if (f->size == 4) wr32(buf + f->off, (uint32_t)orig);
    else wr64(buf + f->off, orig);
  }
  assert_memory_equal(buf, g_file, g_size);
  free(buf);
  print_message("figures: GGUF mutants: %lu field values in %zu fields: %lu refused with a clear "
                "error, %lu still load and run\n",
                g_tried, g_walk.n_fields, g_refused, g_loaded);
}

/* Writes v into a copy at off and expects refusal naming needle. */
static void poke_expect(size_t off, unsigned size, uint64_t v, const char *what, const char *needle) {
  uint8_t *buf = malloc(g_size);
  memcpy(buf, g_file, g_size);
  if (size == 4) wr32(buf + off, (uint32_t)v);
  else wr64(buf + off, v);
  expect_refused(buf, g_size, what, needle);
  free(buf);
}

/* A copy with a general.alignment key (of the given type and value) added
 * after the others, tensors laid out again at multiples of layout (the
 * data section starting at the tensor infos' end rounded up to it). */
static uint8_t *with_alignment(uint32_t type, uint64_t value, uint64_t layout, size_t *ret_len) {
  const struct tinfo *last = &g_walk.tensors[g_walk.n_tensors - 1];
  size_t info_start = g_walk.tensors[0].info_off;
  size_t info_len = last->offset_off + 8 - info_start; /* tensor infos, exactly */
  assert_int_equal(g_walk.kvs[g_walk.n_kv - 1].end, info_start);
  static const char key[] = "general.alignment";
  size_t kv_len = 8 + (sizeof key - 1) + 4 + (type == 8 ? 8 + 2 : scalar_size(type));
  uint64_t info_end = info_start + kv_len + info_len;
  uint64_t data_start = (info_end + layout - 1) / layout * layout;
  uint64_t off = 0;
  uint64_t new_off[64];
  for (size_t i = 0; i < g_walk.n_tensors; i++) {
    new_off[i] = off;
    off = (off + g_walk.tensors[i].n_bytes + layout - 1) / layout * layout;
  }
  size_t len = (size_t)(data_start + off);
  uint8_t *buf = calloc(1, len);
  assert_non_null(buf);
  memcpy(buf, g_file, info_start);
  wr64(buf + 16, g_walk.n_kv + 1);
  uint8_t *p = buf + info_start;
  wr64(p, sizeof key - 1);
  memcpy(p + 8, key, sizeof key - 1);
  p += 8 + sizeof key - 1;
  wr32(p, type);
  p += 4;
  if (type == 8) {
    wr64(p, 2);
    memcpy(p + 8, "32", 2);
    p += 10;
  } else if (scalar_size(type) == 8) {
    wr64(p, value);
    p += 8;
  } else {
    wr32(p, (uint32_t)value);
    p += 4;
  }
  assert_int_equal((size_t)(p - buf), info_start + kv_len);
  memcpy(p, g_file + info_start, info_len);
  for (size_t i = 0; i < g_walk.n_tensors; i++) {
    wr64(buf + g_walk.tensors[i].offset_off + kv_len, new_off[i]);
    memcpy(buf + data_start + new_off[i], g_file + g_walk.data_off + g_walk.tensors[i].offset,
           g_walk.tensors[i].n_bytes);
  }
  *ret_len = len;
  return buf;
}

static void test_structural(void **state) {
  (void)state;
  g_tried = g_refused = g_loaded = 0;
  const struct walk *w = &g_walk;

  /* Counts and lengths at their maxima. */
  poke_expect(8, 8, UINT64_MAX, "tensor count 2^64-1", "tensor count");
  poke_expect(16, 8, UINT64_MAX, "kv count 2^64-1", "kv count");
  poke_expect(w->kvs[0].start, 8, UINT64_MAX, "first key length 2^64-1", "string length");
  const struct kvinfo *tokens = find_kv(w, "tokenizer.ggml.tokens");
  poke_expect(tokens->type_off + 8, 8, UINT64_MAX, "token array length 2^64-1", "array length");
  poke_expect(tokens->type_off + 8, 8, UINT64_C(1) << 61, "token array length 2^61",
              "array length");
  const struct kvinfo *scores = find_kv(w, "tokenizer.ggml.scores");
  poke_expect(scores->type_off + 8, 8, UINT64_MAX / 4 + 1, "score array length 2^62",
              "array length");
  const struct tinfo *embd = find_tensor(w, "token_embd.weight");
  poke_expect(embd->ndims_off + 4, 8, UINT64_MAX, "token_embd ne[0] 2^64-1", "dimension");
  poke_expect(embd->ndims_off + 4, 8, INT64_MAX, "token_embd ne[0] 2^63-1", "overflows");
  poke_expect(embd->ndims_off + 12, 8, UINT64_C(1) << 40, "token_embd ne[1] 2^40", "exceeds");
  poke_expect(embd->info_off, 8, UINT64_MAX, "tensor name length 2^64-1", "string length");
  poke_expect(embd->info_off, 8, 65, "tensor name length 65", "exceeds");

  /* n_dims beyond the maximum (and zero). */
  poke_expect(embd->ndims_off, 4, 5, "n_dims 5", "n_dims 5");
  poke_expect(embd->ndims_off, 4, 0, "n_dims 0", "n_dims 0");
  poke_expect(embd->ndims_off, 4, UINT32_MAX, "n_dims 2^32-1", "n_dims 4294967295");

  /* Unknown types: tensor, value, array element. */
  const uint32_t bad_types[] = {4, 5, 31, 43, 1000, UINT32_MAX};
  for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
    char what[64], needle[64];
    snprintf(what, sizeof what, "tensor type %u", bad_types[i]);
    snprintf(needle, sizeof needle, "unknown type %u", bad_types[i]);
    poke_expect(embd->type_off, 4, bad_types[i], what, needle);
  }
  /* A known type the model cannot run: named by its ggml name. */
  poke_expect(embd->type_off, 4, SK_GGML_MXFP4, "F32 tensor declared mxfp4", "mxfp4");
  const struct kvinfo *ctx = find_kv(w, "llama.context_length");
  poke_expect(ctx->type_off, 4, 13, "value type 13", "value type 13");
  poke_expect(ctx->type_off, 4, UINT32_MAX, "value type 2^32-1", "value type");
  poke_expect(tokens->type_off + 4, 4, 13, "array element type 13", "element type 13");
  poke_expect(tokens->type_off + 4, 4, 9, "array of arrays", "nested");
  poke_expect(ctx->type_off, 4, 8, "context_length as a string", "");

  /* Offsets past the end, at the end, wrapping. */
  const struct tinfo *out = find_tensor(w, "output.weight");
  uint64_t data_size = g_size - w->data_off;
  poke_expect(out->offset_off, 8, data_size, "offset at the end", "exceeds data section size");
  poke_expect(out->offset_off, 8, data_size + 32, "offset past the end",
              "exceeds data section size");
  poke_expect(out->offset_off, 8, UINT64_MAX - 31, "offset 2^64-32 (wraps)",
              "exceeds data section size");
  poke_expect(out->offset_off, 8, UINT64_C(1) << 63, "offset 2^63", "exceeds data section size");
  poke_expect(out->offset_off, 8, 16, "offset not aligned", "alignment 32");

  /* Overlapping tensors: the same bytes, and a partial overlap. */
  const struct tinfo *norm = find_tensor(w, "output_norm.weight");
  poke_expect(out->offset_off, 8, embd->offset, "output.weight on token_embd.weight", "overlap");
  poke_expect(norm->offset_off, 8, embd->offset + 64, "output_norm inside token_embd", "overlap");
  poke_expect(out->offset_off, 8, norm->offset + 32, "output.weight over output_norm's end",
              "overlap");

  /* Alignment: a general.alignment key added. 0 and non-powers of two are
   * refused by name; a valid one lays the file out again and loads. */
  const struct {
    uint32_t type;
    uint64_t value;
    const char *needle;
  } aligns[] = {
      {4, 0, "general.alignment 0"},        {4, 3, "general.alignment 3"},
      {4, 48, "general.alignment 48"},      {4, UINT32_MAX, "general.alignment 4294967295"},
      {10, UINT64_C(1) << 32, "general.alignment"}, {5, (uint32_t)-64, "general.alignment"},
      {8, 0, "general.alignment"},          {4, UINT64_C(1) << 31, "alignment 2147483648"},
  };
  for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
    size_t len;
    uint8_t *buf = with_alignment(aligns[i].type, aligns[i].value, 32, &len);
    char what[96];
    snprintf(what, sizeof what, "general.alignment type %u value %" PRIu64, aligns[i].type,
             aligns[i].value);
    expect_refused(buf, len, what, aligns[i].needle);
    free(buf);
  }
  const uint64_t good[] = {32, 64, 4096};
  for (size_t i = 0; i < 3; i++) {
    size_t len;
    uint8_t *buf = with_alignment(4, good[i], good[i], &len);
    char what[64];
    snprintf(what, sizeof what, "general.alignment %" PRIu64 " laid out", good[i]);
    struct outcome o = check_mutant(buf, len, what);
    if (o.rc != 0) fail_msg("%s: %s", what, o.err.message);
    free(buf);
  }

  /* The vocabulary and the embedding disagree: 512 tokens, 511 rows in
   * both token_embd.weight and output.weight (each still fits its bytes). */
  uint8_t *buf = malloc(g_size);
  memcpy(buf, g_file, g_size);
  wr64(buf + embd->ndims_off + 12, 511);
  wr64(buf + out->ndims_off + 12, 511);
  expect_refused(buf, g_size, "511 embedding rows for 512 tokens", "512 tokens");
  free(buf);
  print_message("figures: GGUF mutants: %lu structural cases, each refused with the expected "
                "message or loaded as expected\n", g_tried);
}

/* Some of them handed to sinkd itself: exit status 1, the reason in its
 * log, no signal. Its socket, state directory and configuration are the
 * test's own, never the system's. With busy_state, its state directory is
 * locked as another sinkd would hold it: the model's problem is still
 * named, beside the busy directory. */
static void daemon_refuses_in(const uint8_t *buf, size_t len, const char *what, const char *needle,
                              bool busy_state) {
  char *dir = sk_test_tmpdir();
  char model[4200], sock[4200], log[4200], state[4200], lock[4300];
  snprintf(model, sizeof model, "%s/mutant.gguf", dir);
  snprintf(sock, sizeof sock, "%s/s.sock", dir);
  snprintf(log, sizeof log, "%s/sinkd.log", dir);
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(lock, sizeof lock, "%s/lock", state);
  int lock_fd = -1;
  if (busy_state) {
    assert_int_equal(mkdir(state, 0700), 0);
    lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    assert_true(lock_fd >= 0);
    assert_int_equal(flock(lock_fd, LOCK_EX | LOCK_NB), 0);
  }
  FILE *f = fopen(model, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  fclose(f);
  const char *sinkd = getenv("SK_SINKD");
  assert_non_null(sinkd);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(log, "w", stderr)) _exit(126);
    execl(sinkd, sinkd, "--config", "/dev/null", "--model", model, "--socket", sock,
          "--state-dir", state, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  size_t n = 0;
  char *text = sk_test_read_file(log, &n);
  assert_non_null(text);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(text, "cannot load model") ||
      !strstr(text, needle) || (busy_state && !strstr(text, "is in use by another sinkd")))
    fail_msg("sinkd on %s: status %d, log: %s", what, st, text);
  free(text);
  if (lock_fd >= 0) close(lock_fd);
  unlink(lock);
  rmdir(state);
  unlink(model);
  unlink(log);
  rmdir(dir);
  free(dir);
  g_tried++;
  g_refused++;
}

static void daemon_refuses(const uint8_t *buf, size_t len, const char *what, const char *needle) {
  daemon_refuses_in(buf, len, what, needle, false);
}

static void test_daemon_refuses(void **state) {
  (void)state;
  g_tried = g_refused = 0;
  const struct walk *w = &g_walk;
  const struct tinfo *embd = find_tensor(w, "token_embd.weight");
  const struct tinfo *out = find_tensor(w, "output.weight");
  daemon_refuses(g_file, g_size / 2, "half the file", "exceeds");
  daemon_refuses(g_file, 30, "30 bytes", "tensor count 48 exceeds what the file size 30 allows");
  daemon_refuses_in(g_file, 30, "30 bytes, state directory busy",
                    "tensor count 48 exceeds what the file size 30 allows", true);
  uint8_t *buf = malloc(g_size);
  memcpy(buf, g_file, g_size);
  wr32(buf + embd->ndims_off, 5);
  daemon_refuses(buf, g_size, "n_dims 5", "n_dims 5");
  memcpy(buf, g_file, g_size);
  wr32(buf + embd->type_off, 43);
  daemon_refuses(buf, g_size, "tensor type 43", "unknown type 43");
  memcpy(buf, g_file, g_size);
  wr64(buf + out->offset_off, embd->offset);
  daemon_refuses(buf, g_size, "overlapping tensors", "overlap");
  memcpy(buf, g_file, g_size);
  wr64(buf + out->offset_off, UINT64_MAX - 31);
  daemon_refuses(buf, g_size, "wrapping offset", "exceeds data section size");
  memcpy(buf, g_file, g_size);
  wr64(buf + 8, UINT64_MAX);
  daemon_refuses(buf, g_size, "tensor count 2^64-1", "tensor count");
  memcpy(buf, g_file, g_size);
  wr64(buf + embd->ndims_off + 12, 511);
  wr64(buf + out->ndims_off + 12, 511);
  daemon_refuses(buf, g_size, "511 embedding rows", "the tokenizer has 512 tokens");
  free(buf);
  size_t len;
  buf = with_alignment(4, 0, 32, &len);
  daemon_refuses(buf, len, "alignment 0", "general.alignment 0");
  free(buf);
  print_message("figures: GGUF mutants: %lu handed to sinkd, each refused at start (exit 1, "
                "reason logged)\n", g_tried);
}

static int setup(void **state) {
  (void)state;
  g_file = sk_test_read_file(sk_test_model_path(), &g_size);
  assert_non_null(g_file);
  walk_file(&g_walk, g_file, g_size);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  walk_free(&g_walk);
  free(g_file);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_unmutated_loads),
      cmocka_unit_test(test_truncations),
      cmocka_unit_test(test_field_values),
      cmocka_unit_test(test_structural),
      cmocka_unit_test(test_daemon_refuses),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
