/* Fuzz target: the tokenizers on any bytes: the test model's
 * (SentencePiece) and two byte-level BPE vocabularies (Llama 3's, Qwen2's:
 * reference/vocab).
 *
 * Byte 0 picks the mode: bit 7 reads the rest as int32 token ids to
 * detokenize (bit 6: taken modulo the vocabulary), else text to tokens
 * and back (bit 0: with BOS; bit 2: parse_special); bit 1 picks a BPE
 * vocabulary, bit 3 which one (Qwen2's when set).
 * Invariants: every id is inside the vocabulary; without BOS and
 * parse_special, detokenize(tokenize(text)) == text for valid UTF-8 (for
 * SentencePiece: without U+2581, its space mark, which detokenizes to a
 * space), and for BPE valid UTF-8 whatever the text (invalid bytes become
 * U+FFFD); ids outside the vocabulary are refused with bad_request naming
 * the index, others detokenize. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "base/utf8.h"

static struct sk_gguf *g_gguf;
static struct sk_tokenizer *g_tok, *g_bpe[2];

/* The vocabulary at $env, else $SK_SHARED_DIR/rel, else ../shared/rel. */
static struct sk_tokenizer *load(const char *env, const char *rel) {
  static char buf[4096];
  const char *path = getenv(env);
  if (!path) {
    const char *shared = getenv("SK_SHARED_DIR");
    snprintf(buf, sizeof buf, "%s/%s", shared ? shared : "../shared", rel);
    path = buf;
  }
  struct sk_gguf *g = NULL;
  struct sk_tokenizer *t = NULL;
  struct sk_error err = {0};
  if (sk_gguf_open(path, &g, &err) < 0 || sk_tokenizer_load(g, &t, &err) < 0)
    sk_fuzz_fail("cannot load the tokenizer of %s (set %s): %s", path, env, err.message);
  sk_gguf_close(g);
  return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *path = getenv("SK_MODEL");
  if (!path) path = "../shared/models/stories260K.gguf";
  struct sk_error err = {0};
  if (sk_gguf_open(path, &g_gguf, &err) < 0 || sk_tokenizer_load(g_gguf, &g_tok, &err) < 0)
    sk_fuzz_fail("cannot load the tokenizer of %s (set SK_MODEL): %s", path, err.message);
  g_bpe[0] = load("SK_BPE_VOCAB", "reference/vocab/ggml-vocab-llama-bpe.gguf");
  g_bpe[1] = load("SK_BPE_VOCAB2", "reference/vocab/ggml-vocab-qwen2.gguf");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const char *text = (const char *)data + 1;
  size_t len = size - 1;
  const bool bpe = mode & 2;
  struct sk_tokenizer *tok = bpe ? g_bpe[(mode >> 3) & 1] : g_tok;
  uint32_t n_vocab = sk_tokenizer_n_vocab(tok);
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
    int rc = sk_tokenizer_decode(tok, ids, n, &out, &out_len, &e);
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
  bool bos = mode & 1, special = mode & 4;
  int32_t *toks = NULL;
  size_t n = 0;
  unsigned flags = (bos ? SK_TOKENIZE_BOS : 0) | (special ? SK_TOKENIZE_SPECIAL : 0);
  if (sk_tokenizer_encode(tok, text, len, flags, &toks, &n, &e) < 0)
    sk_fuzz_fail("encode failed: %s", e.message);
  if (bos && (n == 0 || toks[0] != sk_tokenizer_bos(tok))) sk_fuzz_fail("no BOS first");
  for (size_t i = 0; i < n; i++)
    if (toks[i] < 0 || (uint32_t)toks[i] >= n_vocab) sk_fuzz_fail("token %d outside", toks[i]);
  char *out = NULL;
  size_t out_len = 0;
  if (sk_tokenizer_decode(tok, toks, n, &out, &out_len, &e) < 0)
    sk_fuzz_fail("decode of encoded text failed: %s", e.message);
  bool valid = sk_utf8_valid(text, len);
  bool plain = valid && (bpe || !memmem(text, len, "\xe2\x96\x81", 3));
  if (plain && !bos && !special && (out_len != len || memcmp(out, text, len) != 0))
    sk_fuzz_fail("round trip changed %zu bytes into %zu bytes", len, out_len);
  if (bpe && !bos && !special && !sk_utf8_valid(out, out_len))
    sk_fuzz_fail("BPE round trip of %zu bytes is not valid UTF-8", len);
  free(out);
  free(toks);
  return 0;
}
