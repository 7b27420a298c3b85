/* Fuzz target: the tokenizer of the test model on any bytes.
 *
 * Byte 0 picks the mode: text to tokens (with or without BOS) and back, or
 * the rest read as int32 token ids to detokenize.
 * Invariants: every id is inside the vocabulary; for valid UTF-8 text
 * without U+2581 (SentencePiece's space mark, which detokenizes to a
 * space), detokenize(tokenize(text)) == text; ids outside the vocabulary
 * are refused with bad_request naming the index, others detokenize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "gguf.h"
#include "tokenizer.h"
#include "utf8.h"

static struct sk_gguf *g_gguf;
static struct sk_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *path = getenv("SK_MODEL");
  if (!path) path = "../shared/models/stories260K.gguf";
  struct sk_error err = {0};
  if (sk_gguf_open(path, &g_gguf, &err) < 0 || sk_tokenizer_load(g_gguf, &g_tok, &err) < 0)
    sk_fuzz_fail("cannot load the tokenizer of %s (set SK_MODEL): %s", path, err.message);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const char *text = (const char *)data + 1;
  size_t len = size - 1;
  uint32_t n_vocab = sk_tokenizer_n_vocab(g_tok);
  struct sk_error e = {0};
  if (mode & 0x80) {
    size_t n = len / 4;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    memcpy(ids, text, n * 4);
    /* Mostly in range, so that decoding is reached. */
    if (mode & 0x40)
      for (size_t i = 0; i < n; i++) ids[i] = (int32_t)((uint32_t)ids[i] % n_vocab);
    size_t first_bad = n;
    for (size_t i = 0; i < n && first_bad == n; i++)
      if (ids[i] < 0 || (uint32_t)ids[i] >= n_vocab) first_bad = i;
    char *out = NULL;
    size_t out_len = 0;
    int rc = sk_tokenizer_decode(g_tok, ids, n, &out, &out_len, &e);
    if (first_bad < n) {
      char idx[32];
      snprintf(idx, sizeof idx, "index %zu", first_bad);
      if (rc != -SK_ERR_BAD_REQUEST || !strstr(e.message, idx))
        sk_fuzz_fail("decode of an id outside: %d '%s'", rc, e.message);
    } else if (rc < 0 || out[out_len] != 0) {
      sk_fuzz_fail("decode failed: %s", e.message);
    }
    free(out);
    free(ids);
    return 0;
  }
  bool bos = mode & 1;
  int32_t *toks = NULL;
  size_t n = 0;
  if (sk_tokenizer_encode(g_tok, text, len, bos, &toks, &n, &e) < 0)
    sk_fuzz_fail("encode failed: %s", e.message);
  if (bos && (n == 0 || toks[0] != sk_tokenizer_bos(g_tok))) sk_fuzz_fail("no BOS first");
  for (size_t i = 0; i < n; i++)
    if (toks[i] < 0 || (uint32_t)toks[i] >= n_vocab) sk_fuzz_fail("token %d outside", toks[i]);
  char *out = NULL;
  size_t out_len = 0;
  if (sk_tokenizer_decode(g_tok, toks, n, &out, &out_len, &e) < 0)
    sk_fuzz_fail("decode of encoded text failed: %s", e.message);
  bool plain = sk_utf8_valid(text, len) && !memmem(text, len, "\xe2\x96\x81", 3);
  if (plain && !bos && (out_len != len || memcmp(out, text, len) != 0))
    sk_fuzz_fail("round trip changed %zu bytes into %zu bytes", len, out_len);
  free(out);
  free(toks);
  return 0;
}
