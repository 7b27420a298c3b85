/* Fuzz target: the model file, through everything sinkd does with it at
 * start: the GGUF loader, the model (hyper-parameters, every tensor's
 * name, type and shape), the tokenizer, the vocabulary check; and, when
 * all of that accepts the file, a forward pass, and the tokenizer on the
 * end of the input as text and back.
 *
 * Invariants: an error is -SK_ERR_BAD_MODEL with a message, never
 * anything else (no-memory would mean a declared size drove an
 * allocation); tokens produced are inside the vocabulary. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "model/gguf.h"
#include "session/kvcache.h"
#include "model/model.h"
#include "model/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

static void expect_bad_model(int rc, const struct sk_error *e, const char *stage) {
  if (rc == 0) return;
  if (rc != -SK_ERR_BAD_MODEL || !e->message[0])
    sk_fuzz_fail("%s: returned %d (%s): %s", stage, rc, sk_error_name(rc), e->message);
}

static void run(const struct sk_model *m, const struct sk_tokenizer *t, const uint8_t *text,
                size_t len) {
  struct sk_error e = {0};
  int32_t *toks = NULL;
  size_t n = 0;
  if (sk_tokenizer_encode(t, (const char *)text, len, true, &toks, &n, &e) < 0)
    sk_fuzz_fail("encode: %s", e.message);
  uint32_t n_vocab = sk_tokenizer_n_vocab(t);
  for (size_t i = 0; i < n; i++)
    if (toks[i] < 0 || (uint32_t)toks[i] >= n_vocab) sk_fuzz_fail("token %d outside", toks[i]);
  char *out = NULL;
  size_t out_len = 0;
  if (sk_tokenizer_decode(t, toks, n, &out, &out_len, &e) < 0) sk_fuzz_fail("decode: %s", e.message);
  free(out);
  if (n > 8) n = 8;
  struct sk_kv_params p = {.policy = SK_POLICY_DENSE, .capacity = 8, .rope_scale = 1.0f};
  struct sk_kv *kv = NULL;
  struct sk_scratch *s = NULL;
  float *logits = malloc(sk_model_config(m)->n_vocab * sizeof *logits);
  if (logits && sk_kv_new(sk_model_kv_shape(m), &p, &kv, &e) == 0 &&
      sk_scratch_new(m, 8, 8, &s, &e) == 0) {
    int rc = sk_model_forward(m, s, kv, toks, (uint32_t)n, logits, false, &e);
    if (rc < 0 && rc != -SK_ERR_BAD_REQUEST) sk_fuzz_fail("forward: %d %s", rc, e.message);
  }
  sk_scratch_free(s);
  sk_kv_free(kv);
  free(logits);
  free(toks);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct sk_error e = {0};
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  struct sk_tokenizer *t = NULL;
  int rc = sk_gguf_open_buffer(data, size, &g, &e);
  expect_bad_model(rc, &e, "gguf");
  if (rc == 0) {
    /* Every accessor on what was accepted. */
    for (uint64_t i = 0; i < sk_gguf_n_tensors(g); i++) {
      const struct sk_gguf_tensor *ts = sk_gguf_tensor(g, i);
      const uint8_t *d = ts->data;
      if (ts->n_bytes && (d < data || d + ts->n_bytes > data + size))
        sk_fuzz_fail("tensor %llu outside the buffer", (unsigned long long)i);
      if (ts->n_bytes) {
        volatile uint8_t x = d[0] ^ d[ts->n_bytes - 1];
        (void)x;
      }
    }
    rc = sk_model_load(g, &m, &e);
    expect_bad_model(rc, &e, "model");
  }
  if (rc == 0) {
    rc = sk_tokenizer_load(g, &t, &e);
    expect_bad_model(rc, &e, "tokenizer");
  }
  if (rc == 0 && sk_tokenizer_n_vocab(t) == sk_model_config(m)->n_vocab) {
    size_t tail = size < 64 ? size : 64;
    run(m, t, data + size - tail, tail);
  }
  sk_tokenizer_free(t);
  sk_model_free(m);
  sk_gguf_close(g);
  return 0;
}
