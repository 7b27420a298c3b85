/* Tokenizer against llama.cpp's output for stories260K (reference
 * tokenize.json, greedy.json, logprobs.json and the two text files),
 * llama.cpp's vocabulary test files (reference/vocab: SentencePiece and
 * byte-level BPE vocabularies with their inputs and expected ids), plus
 * crafted vocabularies for what those do not exercise. */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "testutil.h"
#include "model/tokenizer.h"

static struct sk_tokenizer *tok; /* the test model's, loaded once */

static int setup(void **state) {
  (void)state;
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  if (sk_gguf_open(sk_test_model_path(), &g, &err) < 0) {
    fprintf(stderr, "open %s: %s\n", sk_test_model_path(), err.message);
    return -1;
  }
  int r = sk_tokenizer_load(g, &tok, &err);
  /* The tokenizer copies what it needs: close the file right away. */
  sk_gguf_close(g);
  if (r < 0) {
    fprintf(stderr, "tokenizer: %s\n", err.message);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  sk_tokenizer_free(tok);
  return 0;
}

static char *to_hex(const char *s, size_t n) {
  char *h = malloc(2 * n + 1);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) snprintf(h + 2 * i, 3, "%02x", (unsigned char)s[i]);
  h[2 * n] = 0;
  return h;
}

static void assert_ids(const int32_t *got, size_t n_got, const int32_t *want,
                       size_t n_want, const char *what) {
  size_t n = n_got < n_want ? n_got : n_want;
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i])
      fail_msg("%s: id %zu is %" PRId32 ", want %" PRId32, what, i, got[i], want[i]);
  if (n_got != n_want) fail_msg("%s: %zu ids, want %zu", what, n_got, n_want);
}

static void test_basics(void **state) {
  (void)state;
  assert_int_equal(sk_tokenizer_n_vocab(tok), 512);
  assert_int_equal(sk_tokenizer_bos(tok), 1);
  assert_int_equal(sk_tokenizer_eos(tok), 2);
}

/* One variant (with_bos / without_bos) of one tokenize.json case. */
static void check_variant(const json_t *c, const char *variant, bool add_bos) {
  struct sk_error err = {0};
  size_t len;
  const char *hex = json_string_value(json_object_get(c, "text_utf8_hex"));
  assert_non_null(hex);
  char *text = sk_test_hex_decode(hex, &len);
  const json_t *v = json_object_get(c, variant);
  assert_non_null(v);
  size_t n_want;
  int32_t *want = sk_test_json_ids(json_object_get(v, "ids"), &n_want);
  char what[128];
  snprintf(what, sizeof what, "case %" JSON_INTEGER_FORMAT " (%s) %s",
           json_integer_value(json_object_get(c, "index")),
           json_string_value(json_object_get(c, "text")), variant);

  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(sk_tokenizer_encode(tok, text, len, add_bos, &ids, &n, &err), 0);
  assert_non_null(ids);
  assert_ids(ids, n, want, n_want, what);

  /* Pieces, llama_token_to_piece(special=false). */
  const json_t *pieces = json_object_get(v, "pieces_plain_hex");
  assert_int_equal(json_array_size(pieces), n_want);
  for (size_t i = 0; i < n_want; i++) {
    const char *p;
    size_t pl;
    assert_int_equal(sk_tokenizer_piece(tok, want[i], &p, &pl, &err), 0);
    char *ph = to_hex(p, pl);
    const char *wh = json_string_value(json_array_get(pieces, i));
    if (strcmp(ph, wh) != 0) fail_msg("%s: piece %zu is %s, want %s", what, i, ph, wh);
    free(ph);
  }

  /* Detokenize the reference ids. */
  char *out = NULL;
  size_t out_len = 0;
  assert_int_equal(sk_tokenizer_decode(tok, want, n_want, &out, &out_len, &err), 0);
  assert_int_equal(out[out_len], '\0');
  char *oh = to_hex(out, out_len);
  const char *dh = json_string_value(json_object_get(v, "detokenized_hex"));
  if (strcmp(oh, dh) != 0) fail_msg("%s: detokenized %s, want %s", what, oh, dh);
  free(oh);
  free(out);
  free(ids);
  free(want);
  free(text);
}

static void test_reference_cases(void **state) {
  (void)state;
  json_t *ref = sk_test_load_reference("tokenize.json");
  const json_t *cases = json_object_get(ref, "cases");
  assert_int_equal(json_array_size(cases), 31);
  for (size_t i = 0; i < json_array_size(cases); i++) {
    const json_t *c = json_array_get(cases, i);
    check_variant(c, "with_bos", true);
    check_variant(c, "without_bos", false);
  }
  json_decref(ref);
}

/* A few cases spelled out, so a failure reads without the JSON. */
static void test_spelled_out(void **state) {
  (void)state;
  struct sk_error err = {0};
  static const struct {
    const char *text;
    bool bos;
    int32_t ids[8];
    size_t n;
  } cases[] = {
    {"", false, {0}, 0},
    {"", true, {1}, 1},
    {"Once upon a time", false, {403, 407, 261, 378}, 4},
    {"Once upon a time", true, {1, 403, 407, 261, 378}, 5},
    {" ", false, {410, 410}, 2},
    {"\n", false, {410, 13}, 2},
    {"<s>", false, {410, 504, 419, 505}, 4},   /* text, not BOS */
    {"\xe2\x96\x81", false, {410, 410}, 2},    /* a literal U+2581 */
    {"\xff", false, {410, 258}, 2},            /* invalid UTF-8: byte */
    {"\xe4\xbd", false, {410, 231, 192}, 3},   /* truncated character */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sk_tokenizer_encode(tok, cases[i].text, strlen(cases[i].text),
                                         cases[i].bos, &ids, &n, &err), 0);
    assert_ids(ids, n, cases[i].ids, cases[i].n, cases[i].text);
    free(ids);
  }
  /* NULL text of length 0. */
  int32_t *ids = NULL;
  size_t n = 99;
  assert_int_equal(sk_tokenizer_encode(tok, NULL, 0, false, &ids, &n, &err), 0);
  assert_int_equal(n, 0);
  free(ids);
}

static void test_out_of_range(void **state) {
  (void)state;
  struct sk_error err = {0};
  static const int32_t bad[] = {-1, 512, INT32_MAX, INT32_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int32_t ids[3] = {1, 403, bad[i]};
    char *out = (char *)ids;
    size_t len = 77;
    memset(&err, 0, sizeof err);
    assert_int_equal(sk_tokenizer_decode(tok, ids, 3, &out, &len, &err), -SK_ERR_BAD_REQUEST);
    assert_ptr_equal(out, (char *)ids); /* untouched */
    assert_int_equal(len, 77);
    assert_int_equal(err.code, SK_ERR_BAD_REQUEST);
    char num[16];
    snprintf(num, sizeof num, "%" PRId32, bad[i]);
    assert_non_null(strstr(err.message, num));
    assert_non_null(strstr(err.message, "index 2"));

    const char *p;
    size_t pl;
    assert_int_equal(sk_tokenizer_piece(tok, bad[i], &p, &pl, &err), -SK_ERR_BAD_REQUEST);
    assert_non_null(strstr(err.message, num));
  }
  /* Control tokens have empty pieces; the last valid id works. */
  const char *p;
  size_t pl;
  assert_int_equal(sk_tokenizer_piece(tok, 511, &p, &pl, &err), 0);
  assert_int_equal(sk_tokenizer_piece(tok, 2, &p, &pl, &err), 0);
  assert_int_equal(pl, 0);
  char *out;
  size_t len;
  assert_int_equal(sk_tokenizer_decode(tok, NULL, 0, &out, &len, &err), 0);
  assert_int_equal(len, 0);
  assert_string_equal(out, "");
  free(out);
}

static void test_greedy_prompts(void **state) {
  (void)state;
  struct sk_error err = {0};
  json_t *ref = sk_test_load_reference("greedy.json");
  const json_t *prompts = json_object_get(ref, "prompts");
  assert_true(json_array_size(prompts) >= 5);
  for (size_t i = 0; i < json_array_size(prompts); i++) {
    const json_t *p = json_array_get(prompts, i);
    const char *text = json_string_value(json_object_get(p, "prompt"));
    size_t n_want, n_gen;
    int32_t *want = sk_test_json_ids(json_object_get(p, "prompt_ids"), &n_want);
    int32_t *gen = sk_test_json_ids(json_object_get(p, "generated_ids"), &n_gen);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sk_tokenizer_encode(tok, text, strlen(text), true, &ids, &n, &err), 0);
    assert_ids(ids, n, want, n_want, text);

    /* Generated text alone (no BOS first: leading space dropped) and
     * prompt + generated (BOS first: kept). */
    char *out;
    size_t len;
    assert_int_equal(sk_tokenizer_decode(tok, gen, n_gen, &out, &len, &err), 0);
    assert_string_equal(out, json_string_value(json_object_get(p, "generated_text_llama_detokenize")));
    free(out);
    int32_t *all = malloc((n_want + n_gen) * sizeof *all);
    assert_non_null(all);
    memcpy(all, want, n_want * sizeof *all);
    memcpy(all + n_want, gen, n_gen * sizeof *all);
    assert_int_equal(sk_tokenizer_decode(tok, all, n_want + n_gen, &out, &len, &err), 0);
    assert_string_equal(out, json_string_value(json_object_get(p, "prompt_plus_generated_llama_detokenize")));
    free(out);
    free(all);
    free(ids);
    free(want);
    free(gen);
  }
  json_decref(ref);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whole text files: count, first 2048 ids (with BOS put in front), the
 * round trip, and the time it takes. */
static void test_text_files(void **state) {
  (void)state;
  struct sk_error err = {0};
  json_t *ref = sk_test_load_reference("logprobs.json");
  const json_t *texts = json_object_get(ref, "texts");
  static const size_t counts[] = {150159, 201748}; /* data/README.md */
  assert_int_equal(json_array_size(texts), 2);
  for (size_t k = 0; k < 2; k++) {
    const json_t *tx = json_array_get(texts, k);
    char *path = sk_test_shared_path(json_string_value(json_object_get(tx, "file")));
    size_t len;
    char *text = sk_test_read_file(path, &len);
    if (!text) fail_msg("cannot read %s", path);
    assert_int_equal(len, json_integer_value(json_object_get(tx, "file_bytes")));

    int32_t *ids = NULL;
    size_t n = 0;
    double t0 = now();
    assert_int_equal(sk_tokenizer_encode(tok, text, len, false, &ids, &n, &err), 0);
    double dt = now() - t0;
    printf("# %s: %zu bytes -> %zu tokens in %.3f s\n", path, len, n, dt);
    assert_true(dt < 5.0); /* typically ~0.05 s; loose for sanitizer builds */
    assert_int_equal(n, counts[k]);
    assert_int_equal(n, json_integer_value(json_object_get(tx, "file_tokens_without_bos")));

    size_t n_want;
    int32_t *want = sk_test_json_ids(json_object_get(tx, "token_ids"), &n_want);
    assert_int_equal(n_want, 2048);
    assert_int_equal(want[0], 1);
    assert_ids(ids, 2047, want + 1, 2047, path);

    char *out;
    size_t out_len;
    assert_int_equal(sk_tokenizer_decode(tok, ids, n, &out, &out_len, &err), 0);
    assert_int_equal(out_len, len);
    assert_memory_equal(out, text, len);
    free(out);
    free(want);
    free(ids);
    free(text);
    free(path);
  }
  json_decref(ref);
}

/* --- llama.cpp's vocabulary test files ------------------------------------------ */

/* The vocabularies of reference/vocab whose tokenizer.ggml.model sinkd
 * supports (all of them: "llama" and "gpt2"), with what the README says
 * of each: BOS/EOS ids and whether BOS is added. */
static const struct {
  const char *name;
  bool bpe;
  int32_t bos, eos;
  bool add_bos;
} vocab_files[] = {
  {"llama-spm", false, 1, 2, true},
  {"phi-3", false, 1, 32000, true},
  {"llama-bpe", true, 128000, 128001, true},
  {"qwen2", true, 151643, 151643, false},
  {"gpt-2", true, 50256, 50256, false},
  {"deepseek-llm", true, 100000, 100001, true},
  {"deepseek-coder", true, 32013, 32014, true},
  {"falcon", true, 11, 11, false},
  {"starcoder", true, 0, 0, false},
  {"refact", true, 0, 0, false},
  {"mpt", true, 0, 0, false},
};

static struct sk_tokenizer *load_vocab_file(const char *name) {
  char rel[128];
  snprintf(rel, sizeof rel, "reference/vocab/ggml-vocab-%s.gguf", name);
  char *path = sk_test_shared_path(rel);
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  if (sk_gguf_open(path, &g, &err) < 0) fail_msg("open %s: %s", path, err.message);
  struct sk_tokenizer *t = NULL;
  int r = sk_tokenizer_load(g, &t, &err);
  sk_gguf_close(g);
  if (r < 0) fail_msg("load %s: %s", path, err.message);
  free(path);
  return t;
}

/* Every case of ggml-vocab-NAME.gguf.inp tokenizes (no BOS, control
 * tokens as text) to the ids of the .out line, and those ids detokenize
 * to the case's text; returns the number of cases. */
static size_t check_vocab_file(size_t k) {
  const char *name = vocab_files[k].name;
  struct sk_tokenizer *t = load_vocab_file(name);
  assert_int_equal(sk_tokenizer_is_bpe(t), vocab_files[k].bpe);
  assert_int_equal(sk_tokenizer_bos(t), vocab_files[k].bos);
  assert_int_equal(sk_tokenizer_eos(t), vocab_files[k].eos);
  assert_int_equal(sk_tokenizer_add_bos(t), vocab_files[k].add_bos);
  assert_false(sk_tokenizer_add_eos(t));
  char rel[128];
  snprintf(rel, sizeof rel, "reference/vocab/ggml-vocab-%s.gguf.inp", name);
  char *path = sk_test_shared_path(rel);
  size_t inp_len, out_len;
  char *inp = sk_test_read_file(path, &inp_len);
  if (!inp) fail_msg("cannot read %s", path);
  free(path);
  snprintf(rel, sizeof rel, "reference/vocab/ggml-vocab-%s.gguf.out", name);
  path = sk_test_shared_path(rel);
  char *out = sk_test_read_file(path, &out_len);
  if (!out) fail_msg("cannot read %s", path);
  free(path);

  static const char sep[] = "\n__ggml_vocab_test__\n";
  size_t n_cases = 0, ip = 0, op = 0;
  while (ip < inp_len) {
    const char *e = memmem(inp + ip, inp_len - ip, sep, sizeof sep - 1);
    if (!e) fail_msg("%s: input without a final separator", name);
    size_t clen = (size_t)(e - (inp + ip));
    const char *line_end = memchr(out + op, '\n', out_len - op);
    if (!line_end) fail_msg("%s: fewer .out lines than cases", name);
    /* The line's ids. */
    int32_t want[4096];
    size_t n_want = 0;
    char *p = out + op;
    while (p < line_end) {
      char *q;
      long v = strtol(p, &q, 10);
      if (q == p) break;
      assert_true(n_want < 4096);
      want[n_want++] = (int32_t)v;
      p = q;
    }
    char what[96];
    snprintf(what, sizeof what, "%s case %zu", name, n_cases);
    struct sk_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(sk_tokenizer_encode(t, inp + ip, clen, 0, &ids, &n, &err), 0);
    assert_ids(ids, n, want, n_want, what);
    char *text = NULL;
    size_t text_len = 0;
    assert_int_equal(sk_tokenizer_decode(t, want, n_want, &text, &text_len, &err), 0);
    if (text_len != clen || memcmp(text, inp + ip, clen) != 0)
      fail_msg("%s: detokenized to '%s'", what, text);
    free(text);
    free(ids);
    n_cases++;
    ip += clen + sizeof sep - 1;
    op = (size_t)(line_end - out) + 1;
  }
  assert_int_equal(op, out_len);
  free(inp);
  free(out);
  sk_tokenizer_free(t);
  return n_cases;
}

static void test_vocab_files(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof vocab_files / sizeof vocab_files[0]; k++)
    assert_int_equal(check_vocab_file(k), 46);
}

/* --- crafted vocabularies ------------------------------------------------------ */

struct wbuf {
  uint8_t *p;
  size_t len, cap;
};

static void w_bytes(struct wbuf *w, const void *b, size_t n) {
  if (w->len + n > w->cap) {
    w->cap = (w->len + n) * 2 + 64;
    w->p = realloc(w->p, w->cap);
    assert_non_null(w->p);
  }
  memcpy(w->p + w->len, b, n);
  w->len += n;
}

static void w_u32(struct wbuf *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  w_bytes(w, b, 4);
}

static void w_u64(struct wbuf *w, uint64_t v) {
  w_u32(w, (uint32_t)v);
  w_u32(w, (uint32_t)(v >> 32));
}

static void w_str(struct wbuf *w, const char *s) {
  w_u64(w, strlen(s));
  w_bytes(w, s, strlen(s));
}

#define SP "\xe2\x96\x81"

struct vocab {
  const char *model;     /* NULL: key absent */
  const char *pre;       /* tokenizer.ggml.pre; NULL: key absent */
  size_t n;
  const char *text[16];
  float score[16];
  int32_t type[16];
  size_t n_scores;       /* entries written (normally n) */
  int64_t bos;           /* -1: key absent */
  int add_space_prefix;  /* -1: key absent, else 0/1 */
};

/* A GGUF holding only tokenizer metadata (no tensors). */
static uint8_t *build_vocab(const struct vocab *v, size_t *ret_len) {
  struct wbuf w = {0};
  uint64_t n_kv = 3 + (v->model != NULL) + (v->pre != NULL) + (v->bos >= 0) +
                  (v->add_space_prefix >= 0);
  w_bytes(&w, "GGUF", 4);
  w_u32(&w, 3);
  w_u64(&w, 0);
  w_u64(&w, n_kv);
  if (v->model) {
    w_str(&w, "tokenizer.ggml.model");
    w_u32(&w, SK_GGUF_STRING);
    w_str(&w, v->model);
  }
  if (v->pre) {
    w_str(&w, "tokenizer.ggml.pre");
    w_u32(&w, SK_GGUF_STRING);
    w_str(&w, v->pre);
  }
  w_str(&w, "tokenizer.ggml.tokens");
  w_u32(&w, SK_GGUF_ARRAY);
  w_u32(&w, SK_GGUF_STRING);
  w_u64(&w, v->n);
  for (size_t i = 0; i < v->n; i++) w_str(&w, v->text[i]);
  w_str(&w, "tokenizer.ggml.scores");
  w_u32(&w, SK_GGUF_ARRAY);
  w_u32(&w, SK_GGUF_FLOAT32);
  w_u64(&w, v->n_scores);
  for (size_t i = 0; i < v->n_scores; i++) {
    uint32_t u;
    memcpy(&u, &v->score[i], 4);
    w_u32(&w, u);
  }
  w_str(&w, "tokenizer.ggml.token_type");
  w_u32(&w, SK_GGUF_ARRAY);
  w_u32(&w, SK_GGUF_INT32);
  w_u64(&w, v->n);
  for (size_t i = 0; i < v->n; i++) w_u32(&w, (uint32_t)v->type[i]);
  if (v->bos >= 0) {
    w_str(&w, "tokenizer.ggml.bos_token_id");
    w_u32(&w, SK_GGUF_UINT32);
    w_u32(&w, (uint32_t)v->bos);
  }
  if (v->add_space_prefix >= 0) {
    w_str(&w, "tokenizer.ggml.add_space_prefix");
    w_u32(&w, SK_GGUF_BOOL);
    w_bytes(&w, &(uint8_t){(uint8_t)v->add_space_prefix}, 1);
  }
  *ret_len = w.len;
  return w.p;
}

/* Ids:        0      1     2      3    4    5    6       7     8
 *             <unk>  <s>   </s>   ▁    a    b    ▁a      ab    <0x63>
 *             9      10    11
 *             <U>    x     "" (empty: renamed [EMPTY_11]) */
static struct vocab vocab_default(void) {
  struct vocab v = {
    .model = "llama", .n = 12,
    .text = {"<unk>", "<s>", "</s>", SP, "a", "b", SP "a", "ab", "<0x63>", "<U>", "x", ""},
    .score = {0, 0, 0, -3, -4, -5, -1, -2, 0, 0, -6, -7},
    .type = {2, 3, 3, 1, 1, 1, 1, 1, 6, 4, 5, 1},
    .n_scores = 12, .bos = -1, .add_space_prefix = -1,
  };
  return v;
}

static int load_vocab(const struct vocab *v, struct sk_tokenizer **ret,
                      struct sk_error *err) {
  size_t len;
  uint8_t *buf = build_vocab(v, &len);
  struct sk_gguf *g = NULL;
  int r = sk_gguf_open_buffer(buf, len, &g, err);
  if (r < 0) fail_msg("crafted vocabulary refused by gguf: %s", err->message);
  r = sk_tokenizer_load(g, ret, err);
  sk_gguf_close(g);
  memset(buf, 0xAA, len); /* the tokenizer must not point into it */
  free(buf);
  return r;
}

static void expect_encode(const struct sk_tokenizer *t, const char *text,
                          const int32_t *want, size_t n_want) {
  struct sk_error err = {0};
  int32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(sk_tokenizer_encode(t, text, strlen(text), false, &ids, &n, &err), 0);
  assert_ids(ids, n, want, n_want, text);
  free(ids);
}

static void expect_decode(const struct sk_tokenizer *t, const int32_t *ids, size_t n,
                          const char *want) {
  struct sk_error err = {0};
  char *out;
  size_t len;
  assert_int_equal(sk_tokenizer_decode(t, ids, n, &out, &len, &err), 0);
  assert_int_equal(len, strlen(want));
  assert_string_equal(out, want);
  free(out);
}

static void encode_flags(const struct sk_tokenizer *t, const char *text, unsigned flags,
                         int32_t **ids, size_t *n) {
  struct sk_error err = {0};
  assert_int_equal(sk_tokenizer_encode(t, text, strlen(text), flags, ids, n, &err), 0);
}

static bool has_id(const int32_t *ids, size_t n, int32_t id) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

/* parse_special: control-token text becomes the token only when asked;
 * otherwise it is text and comes back as text. */
static void test_parse_special(void **state) {
  (void)state;
  struct sk_tokenizer *t = load_vocab_file("qwen2");
  int32_t im_start = sk_tokenizer_find(t, "<|im_start|>", 12);
  int32_t im_end = sk_tokenizer_find(t, "<|im_end|>", 10);
  assert_int_equal(im_start, 151644);
  assert_int_equal(im_end, 151645);
  const char *chat = "<|im_start|>user\nhi<|im_end|>";
  int32_t *ids, *inner;
  size_t n, n_inner;
  encode_flags(t, chat, SK_TOKENIZE_SPECIAL, &ids, &n);
  encode_flags(t, "user\nhi", 0, &inner, &n_inner);
  assert_int_equal(n, n_inner + 2);
  assert_int_equal(ids[0], im_start);
  assert_ids(ids + 1, n - 2, inner, n_inner, "between the markers");
  assert_int_equal(ids[n - 1], im_end);
  free(ids);
  /* Off (the default for user text): no control token, the text intact. */
  encode_flags(t, chat, 0, &ids, &n);
  assert_true(n > n_inner + 2);
  for (size_t i = 0; i < n; i++) assert_true(ids[i] < 151643);
  expect_decode(t, ids, n, chat);
  free(ids);
  free(inner);
  /* A control token's piece is empty; its text is its name. */
  const char *p;
  size_t pl;
  struct sk_error err = {0};
  assert_int_equal(sk_tokenizer_piece(t, im_end, &p, &pl, &err), 0);
  assert_int_equal(pl, 0);
  assert_int_equal(sk_tokenizer_text(t, im_end, &p, &pl), 0);
  assert_string_equal(p, "<|im_end|>");
  assert_int_equal(sk_tokenizer_text(t, -1, &p, &pl), -SK_ERR_BAD_REQUEST);
  sk_tokenizer_free(t);

  /* Llama 3: BOS and EOS by flag, "<|begin_of_text|>" by parse_special. */
  t = load_vocab_file("llama-bpe");
  encode_flags(t, "Hello world", SK_TOKENIZE_BOS | SK_TOKENIZE_EOS, &ids, &n);
  assert_ids(ids, n, (int32_t[]){128000, 9906, 1917, 128001}, 4, "BOS/EOS");
  free(ids);
  encode_flags(t, "<|begin_of_text|>Hello world", SK_TOKENIZE_SPECIAL, &ids, &n);
  assert_ids(ids, n, (int32_t[]){128000, 9906, 1917}, 3, "parse_special");
  free(ids);
  encode_flags(t, "<|begin_of_text|>Hello world", 0, &ids, &n);
  assert_false(has_id(ids, n, 128000));
  expect_decode(t, ids, n, "<|begin_of_text|>Hello world");
  free(ids);
  /* U+180E (Mongolian vowel separator) is not a space (Unicode
   * White_Space, as llama.cpp's tables), though PCRE2's \s takes it:
   * llama-tokenize gives these ids. */
  encode_flags(t, "a \xe1\xa0\x8e", 0, &ids, &n);
  assert_ids(ids, n, (int32_t[]){64, 87189, 254, 236}, 4, "U+180E");
  free(ids);
  /* Invalid UTF-8 becomes U+FFFD byte by byte before the pre-tokenizer
   * (llama.cpp's unicode_cpts_from_utf8). */
  encode_flags(t, "a\xff\xfe", 0, &ids, &n);
  encode_flags(t, "a\xef\xbf\xbd\xef\xbf\xbd", 0, &inner, &n_inner);
  assert_ids(ids, n, inner, n_inner, "invalid UTF-8");
  free(ids);
  free(inner);
  sk_tokenizer_free(t);
}

/* End of generation: eos, eot, eom and the texts llama.cpp lists. */
static void test_eog(void **state) {
  (void)state;
  struct sk_tokenizer *t = load_vocab_file("llama-bpe");
  int32_t eot = sk_tokenizer_find(t, "<|eot_id|>", 10);
  assert_int_equal(eot, 128009);
  /* Llama 3.0 has no <|eom_id|> (3.1 has it at 128008): a reserved
   * control token there, which does not end generation. */
  assert_int_equal(sk_tokenizer_find(t, "<|eom_id|>", 10), -1);
  assert_int_equal(sk_tokenizer_eot(t), eot);
  assert_true(sk_tokenizer_is_eog(t, 128001)); /* eos, <|end_of_text|> */
  assert_true(sk_tokenizer_is_eog(t, eot));
  assert_false(sk_tokenizer_is_eog(t, 128008));
  assert_false(sk_tokenizer_is_eog(t, 128000)); /* BOS */
  assert_false(sk_tokenizer_is_eog(t, sk_tokenizer_find(t, "<|start_header_id|>", 19)));
  assert_false(sk_tokenizer_is_eog(t, 9906));
  assert_false(sk_tokenizer_is_eog(t, -1));
  assert_false(sk_tokenizer_is_eog(t, 128256));
  sk_tokenizer_free(t);

  t = load_vocab_file("qwen2");
  assert_int_equal(sk_tokenizer_eot(t), 151645); /* <|im_end|> */
  assert_true(sk_tokenizer_is_eog(t, 151643));   /* <|endoftext|> */
  assert_true(sk_tokenizer_is_eog(t, 151645));
  assert_false(sk_tokenizer_is_eog(t, 151644));  /* <|im_start|> */
  sk_tokenizer_free(t);

  /* StarCoder: the fill-in-the-middle pad ends generation, the prefix
   * marker does not. */
  t = load_vocab_file("starcoder");
  assert_true(sk_tokenizer_is_eog(t, sk_tokenizer_find(t, "<fim_pad>", 9)));
  assert_false(sk_tokenizer_is_eog(t, sk_tokenizer_find(t, "<fim_prefix>", 12)));
  assert_true(sk_tokenizer_is_eog(t, 0));
  sk_tokenizer_free(t);

  /* SentencePiece: only EOS. */
  t = load_vocab_file("llama-spm");
  assert_int_equal(sk_tokenizer_eot(t), -1);
  assert_true(sk_tokenizer_is_eog(t, 2));
  assert_false(sk_tokenizer_is_eog(t, 1));
  sk_tokenizer_free(t);
  /* Phi-3: <|end|> ends a turn. */
  t = load_vocab_file("phi-3");
  int32_t end = sk_tokenizer_find(t, "<|end|>", 7);
  assert_true(end >= 0);
  assert_int_equal(sk_tokenizer_eot(t), end);
  assert_true(sk_tokenizer_is_eog(t, end));
  assert_true(sk_tokenizer_is_eog(t, 32000));
  sk_tokenizer_free(t);
}

static void test_crafted_merges(void **state) {
  (void)state;
  struct sk_error err = {0};
  struct sk_tokenizer *t = NULL;

  /* "▁a" (-1) beats "ab" (-2): ▁a b. */
  struct vocab v = vocab_default();
  assert_int_equal(load_vocab(&v, &t, &err), 0);
  assert_int_equal(sk_tokenizer_n_vocab(t), 12);
  assert_int_equal(sk_tokenizer_bos(t), 1);
  expect_encode(t, "ab", (int32_t[]){6, 5}, 2);
  /* byte fallback: 'c' -> <0x63>; 'd' has no byte token -> <unk>. */
  expect_encode(t, "c", (int32_t[]){3, 8}, 2);
  expect_encode(t, "d", (int32_t[]){3, 0}, 2);
  /* user-defined tokens are cut out first; the text after one gets its
   * own space prefix. */
  expect_encode(t, "a<U>b", (int32_t[]){6, 9, 3, 5}, 4);
  expect_encode(t, "<U>", (int32_t[]){9}, 1);
  expect_encode(t, "<U><U>a", (int32_t[]){9, 9, 6}, 3);
  /* Control tokens are text. */
  expect_encode(t, "<s>", (int32_t[]){3, 0, 0, 0}, 4);
  /* Pieces: user-defined verbatim, unused empty, byte as byte, the
   * renamed empty token. */
  expect_decode(t, (int32_t[]){9, 10, 8, 6}, 4, "<U>c a");
  expect_decode(t, (int32_t[]){6, 6}, 2, "a a");
  expect_decode(t, (int32_t[]){1, 6}, 2, " a");
  expect_decode(t, (int32_t[]){2, 6}, 2, " a"); /* any control token first */
  expect_decode(t, (int32_t[]){11}, 1, "[EMPTY_11]");
  sk_tokenizer_free(t);

  /* "ab" scores higher: ▁ ab. */
  v = vocab_default();
  v.score[7] = 0.5f;
  assert_int_equal(load_vocab(&v, &t, &err), 0);
  expect_encode(t, "ab", (int32_t[]){3, 7}, 2);
  sk_tokenizer_free(t);

  /* Equal scores: the leftmost pair merges first. */
  v = vocab_default();
  v.score[7] = -1;
  assert_int_equal(load_vocab(&v, &t, &err), 0);
  expect_encode(t, "ab", (int32_t[]){6, 5}, 2);
  expect_encode(t, "bab", (int32_t[]){3, 5, 7}, 3); /* ▁b has no token */
  sk_tokenizer_free(t);

  /* No space prefix when the GGUF says so; decode keeps the space. */
  v = vocab_default();
  v.add_space_prefix = 0;
  assert_int_equal(load_vocab(&v, &t, &err), 0);
  expect_encode(t, "a b", (int32_t[]){4, 3, 5}, 3);
  expect_encode(t, "ab", (int32_t[]){7}, 1);
  expect_decode(t, (int32_t[]){6}, 1, " a");
  sk_tokenizer_free(t);
}

static void test_crafted_load_errors(void **state) {
  (void)state;
  struct sk_error err = {0};
  struct sk_tokenizer *t = (struct sk_tokenizer *)&err;

  struct vocab v = vocab_default();
  v.model = NULL;
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "tokenizer.ggml.model"));
  assert_ptr_equal(t, (struct sk_tokenizer *)&err);

  v = vocab_default();
  v.model = "t5";
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "'t5' is not supported"));

  /* gpt2 without merges; with a pre-tokenizer sinkd does not know (named,
   * with the known ones listed). */
  v = vocab_default();
  v.model = "gpt2";
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "tokenizer.ggml.merges: missing"));
  v.pre = "qwen9-bpe";
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "'qwen9-bpe'"));
  assert_non_null(strstr(err.message, "llama-bpe, "));
  assert_non_null(strstr(err.message, "smollm"));
  assert_ptr_equal(t, (struct sk_tokenizer *)&err);
  /* Names from the file reach logs and terminals: control bytes (a
   * newline, an escape sequence) and bytes of no character show as '?',
   * a long name is cut. */
  v.pre = "\x1b[31mqwen2\n\xff";
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "tokenizer.ggml.pre: '?[31mqwen2?" "?' is not"));
  for (const char *p = err.message; *p; p++) assert_true(*p >= 0x20 && *p < 0x7f);
  v.pre = "qwen2qwen2qwen2qwen2qwen2qwen2qwen2qwen2qwen2qwen2qwen2";
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "'qwen2qwen2qwen2qwen2qwen2qwen2qwen2qwen2...' is not"));
  v.model = "t5\r\x1b[2K";
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_string_equal(err.message,
                      "tokenizer.ggml.model: 't5?" "?[2K' is not supported (only 'llama' and 'gpt2')");
  assert_ptr_equal(t, (struct sk_tokenizer *)&err);

  v = vocab_default();
  v.n_scores = 11;
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "tokenizer.ggml.scores"));

  v = vocab_default();
  v.bos = 12;
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "bos_token_id"));

  v = vocab_default();
  v.n = 0;
  v.n_scores = 0;
  assert_int_equal(load_vocab(&v, &t, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "tokenizer.ggml.tokens"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_basics),
    cmocka_unit_test(test_reference_cases),
    cmocka_unit_test(test_spelled_out),
    cmocka_unit_test(test_out_of_range),
    cmocka_unit_test(test_greedy_prompts),
    cmocka_unit_test(test_text_files),
    cmocka_unit_test(test_vocab_files),
    cmocka_unit_test(test_parse_special),
    cmocka_unit_test(test_eog),
    cmocka_unit_test(test_crafted_merges),
    cmocka_unit_test(test_crafted_load_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
