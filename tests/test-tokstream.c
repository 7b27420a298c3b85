/* client/tokstream.c: a text tokenized in pieces gives exactly the tokens
 * of one call on the whole text, with real vocabularies (SentencePiece
 * with its dummy space prefix, byte-level BPE with pre-tokenizer rules
 * that join newlines), with pieces far smaller than the text, and with a
 * tokenizer that refuses long texts (a daemon's frame limit). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "testutil.h"
#include "tokstream.h"

struct tok_ctx {
  const struct sk_tokenizer *t;
  size_t limit;    /* longer texts get -SK_ERR_TOO_LARGE (0: none) */
  size_t longest;  /* longest text tokenized */
  size_t refused;  /* calls refused */
};

static int tok_fn(void *ctx, const char *text, size_t len, bool bos, int32_t **ret,
                  size_t *ret_n, struct sk_error *err) {
  struct tok_ctx *c = ctx;
  if (c->limit && len > c->limit) {
    c->refused++;
    return sk_error_set(err, SK_ERR_TOO_LARGE, "frame too large");
  }
  if (len > c->longest) c->longest = len;
  return sk_tokenizer_encode(c->t, text, len, bos ? SK_TOKENIZE_BOS : 0, ret, ret_n, err);
}

static struct sk_tokenizer *load(const char *rel) {
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

/* The tokens of text[0..len) in pieces of `piece` bytes through a
 * tokenizer refusing texts above limit equal those of one call; returns
 * the number of pieces. */
static size_t check_text(const struct sk_tokenizer *t, const char *text, size_t len, bool bos,
                         size_t piece, size_t limit) {
  struct sk_error err = {0};
  int32_t *whole = NULL;
  size_t n_whole = 0;
  assert_int_equal(sk_tokenizer_encode(t, text, len, bos ? SK_TOKENIZE_BOS : 0, &whole, &n_whole,
                                       &err),
                   0);
  FILE *f = fmemopen((void *)text, len ? len : 1, "rb");
  assert_non_null(f);
  if (!len) fgetc(f); /* fmemopen needs a size >= 1: an empty stream */
  struct tok_ctx ctx = {.t = t, .limit = limit};
  struct sk_tokstream *ts = NULL;
  assert_int_equal(sk_tokstream_open(f, piece, bos, tok_fn, &ctx, &ts, &err), 0);
  size_t n = 0, pieces = 0;
  for (;;) {
    int32_t *p = NULL;
    size_t np = 0;
    int rc = sk_tokstream_next(ts, &p, &np, &err);
    if (rc < 0) fail_msg("piece %zu: %s", pieces, err.message);
    if (rc == 0) break;
    pieces++;
    assert_true(n + np <= n_whole);
    for (size_t i = 0; i < np; i++)
      if (p[i] != whole[n + i])
        fail_msg("piece %zu: token %zu is %d, one call gives %d", pieces, n + i, p[i],
                 whole[n + i]);
    n += np;
    free(p);
  }
  assert_int_equal(n, n_whole);
  assert_int_equal(sk_tokstream_bytes(ts), len);
  /* no call saw more than a piece, its anchor and the line after a cut */
  size_t cap = (limit && limit < piece ? limit : piece) + 2048;
  if (ctx.longest > cap) fail_msg("a call of %zu bytes (pieces of %zu)", ctx.longest, piece);
  if (limit) assert_true(ctx.refused > 0 || len <= limit);
  sk_tokstream_free(ts);
  fclose(f);
  free(whole);
  return pieces;
}

static char *read_prefix(const char *rel, size_t max, size_t *ret_len) {
  char *path = sk_test_shared_path(rel);
  size_t len = 0;
  char *text = sk_test_read_file(path, &len);
  assert_non_null(text);
  free(path);
  *ret_len = len < max ? len : max;
  return text;
}

/* pycode's SentencePiece vocabulary (newline a byte token, runs of
 * spaces as pieces) on the whole of python-stdlib.txt, in 16 KiB pieces. */
static void test_pycode_whole_file(void **state) {
  (void)state;
  struct sk_tokenizer *t = load("models/pycode-5M-f16.gguf");
  size_t len;
  char *text = read_prefix("data/python-stdlib.txt", SIZE_MAX, &len);
  assert_int_equal(len, 631970);
  size_t pieces = check_text(t, text, len, true, 16384, 0);
  assert_true(pieces >= 631970 / 16384);
  /* pieces of a few lines; a tokenizer refusing over 5000 bytes while
   * pieces of 64 KiB are asked for: they are halved to 4 KiB */
  check_text(t, text, 100000, true, 300, 0);
  check_text(t, text, 100000, false, 65536, 5000);
  free(text);
  sk_tokenizer_free(t);
}

/* Byte-level BPE vocabularies (Llama 3, Qwen2: "\n\n" and newline runs
 * with indentation are tokens) and Llama's SentencePiece one, on code and
 * on prose, in 2 KiB pieces. */
static void test_other_vocabularies(void **state) {
  (void)state;
  const char *vocabs[] = {"reference/vocab/ggml-vocab-llama-bpe.gguf",
                          "reference/vocab/ggml-vocab-qwen2.gguf",
                          "reference/vocab/ggml-vocab-llama-spm.gguf", "models/stories260K.gguf"};
  const char *texts[] = {"data/python-stdlib.txt", "data/fortunes-en.txt"};
  for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
    struct sk_tokenizer *t = load(vocabs[v]);
    for (size_t k = 0; k < 2; k++) {
      size_t len;
      char *text = read_prefix(texts[k], 60000, &len);
      check_text(t, text, len, true, 2048, 0);
      free(text);
    }
    sk_tokenizer_free(t);
  }
}

/* Texts without newlines: cuts after other white space, and with no
 * white space at all at character boundaries (never inside a UTF-8
 * sequence); an empty text is BOS alone. */
static void test_cuts_without_newlines(void **state) {
  (void)state;
  struct sk_tokenizer *t = load("models/pycode-5M-f16.gguf");
  size_t len;
  char *text = read_prefix("data/fortunes-en.txt", 40000, &len);
  for (size_t i = 0; i < len; i++)
    if (text[i] == '\n') text[i] = ' ';
  assert_true(check_text(t, text, len, true, 1024, 0) >= 40);
  free(text);
  /* 3000 two-byte and three-byte characters, no white space */
  char *u = malloc(3 * 3000);
  size_t n = 0;
  for (int i = 0; i < 3000; i++) {
    const char *c = i % 3 ? "\xc3\xa9" : "\xe6\x97\xa5"; /* é, 日 */
    memcpy(u + n, c, strlen(c));
    n += strlen(c);
  }
  check_text(t, u, n, false, 500, 0);
  free(u);
  assert_int_equal(check_text(t, "", 0, true, 64, 0), 1);
  assert_int_equal(check_text(t, "", 0, false, 64, 0), 1);
  sk_tokenizer_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pycode_whole_file),
      cmocka_unit_test(test_other_vocabularies),
      cmocka_unit_test(test_cuts_without_newlines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
