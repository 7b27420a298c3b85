/* Tokenizer from the GGUF vocabulary: SentencePiece-style BPE as llama.cpp
 * does it for tokenizer.ggml.model = "llama" (llm_tokenizer_spm):
 * spaces become U+2581 ("▁"), one "▁" is put in front of the text, symbols
 * (UTF-8 characters) are merged pairwise by highest vocabulary score (ties:
 * leftmost first), and what is not in the vocabulary falls back to the
 * <0xXX> byte tokens. Special-token text in user input ("<s>") is ordinary
 * text, never a control token.
 */
#ifndef SK_TOKENIZER_H
#define SK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "sinkd/protocol.h"

struct sk_tokenizer;

/* Builds the tokenizer from tokenizer.ggml.{model,tokens,scores,token_type,
 * bos_token_id,eos_token_id,unknown_token_id}. Copies what it needs: g may
 * be closed afterwards. Errors: -SK_ERR_BAD_MODEL (missing/mistyped key,
 * model other than "llama", counts that disagree), -SK_ERR_NO_MEMORY. */
int sk_tokenizer_load(const struct sk_gguf *g, struct sk_tokenizer **ret,
                      struct sk_error *err);
void sk_tokenizer_free(struct sk_tokenizer *t);

uint32_t sk_tokenizer_n_vocab(const struct sk_tokenizer *t);
int32_t sk_tokenizer_bos(const struct sk_tokenizer *t);
int32_t sk_tokenizer_eos(const struct sk_tokenizer *t);

/* Encodes text[0..len) (any bytes; invalid UTF-8 goes through byte
 * fallback). With add_bos the BOS id comes first. *ret_tokens is
 * malloc'd (caller frees), *ret_n its length (may be 0 without BOS).
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_tokenizer_encode(const struct sk_tokenizer *t, const char *text,
                        size_t len, bool add_bos, int32_t **ret_tokens,
                        size_t *ret_n, struct sk_error *err);

/* The bytes one token stands for, as llama_token_to_piece(special=false):
 * "▁" becomes " ", <0xXX> becomes that byte, control tokens (BOS/EOS/UNK)
 * give nothing. *ret points into t; valid until sk_tokenizer_free.
 * Errors: -SK_ERR_BAD_REQUEST if token is outside [0, n_vocab). */
int sk_tokenizer_piece(const struct sk_tokenizer *t, int32_t token,
                       const char **ret, size_t *ret_len, struct sk_error *err);

/* Detokenizes as llama_detokenize(remove_special=false,
 * unparse_special=false): pieces joined, and the leading space of the
 * first piece dropped when the list does not start with BOS.
 * *ret is malloc'd and NUL-terminated (caller frees); *ret_len excludes
 * the NUL. Errors: -SK_ERR_BAD_REQUEST naming the first id outside the
 * vocabulary, -SK_ERR_NO_MEMORY. */
int sk_tokenizer_decode(const struct sk_tokenizer *t, const int32_t *tokens,
                        size_t n, char **ret, size_t *ret_len,
                        struct sk_error *err);

#endif
