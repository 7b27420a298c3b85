/* Tokenizer from the GGUF vocabulary, as llama.cpp's src/llama-vocab.cpp
 * does it for the two kinds of tokenizer.ggml.model sinkd supports:
 *
 * - "llama": SentencePiece-style BPE (llm_tokenizer_spm): spaces become
 *   U+2581 ("▁"), one "▁" is put in front of the text, symbols (UTF-8
 *   characters) are merged pairwise by highest vocabulary score (ties:
 *   leftmost first), and what is not in the vocabulary falls back to the
 *   <0xXX> byte tokens.
 * - "gpt2": byte-level BPE (llm_tokenizer_bpe; Llama 3, Qwen, SmolLM,
 *   DeepSeek, Falcon, StarCoder, GPT-2, ...): the text is cut into words by
 *   the pre-tokenizer tokenizer.ggml.pre names (pretok.h), each word's
 *   bytes become GPT-2's printable characters (encoder.py
 *   bytes_to_unicode), and adjacent symbols are merged by the lowest rank
 *   in tokenizer.ggml.merges (ties: leftmost first). Invalid UTF-8 in the
 *   text becomes U+FFFD first, byte by byte, as in llama.cpp.
 *
 * Special tokens (tokenizer_st_partition): user-defined tokens are always
 * cut out of the text first, longest first; control tokens ("<s>",
 * "<|eot_id|>", "<|im_start|>") only when the caller asks for it
 * (SK_TOKENIZE_SPECIAL). Without it their text is ordinary text, so
 * user text cannot forge a turn or a role.
 */
#ifndef SK_TOKENIZER_H
#define SK_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "sinkd/protocol.h"

struct sk_tokenizer;

/* Builds the tokenizer from tokenizer.ggml.{model,pre,tokens,scores,
 * token_type,merges,bos_token_id,eos_token_id,eot_token_id,eom_token_id,
 * unknown_token_id,add_bos_token,add_eos_token,add_space_prefix} (and
 * general.name for Phi-3's rule). A vocabulary-only GGUF is enough. Copies
 * what it needs: g may be closed afterwards. Errors: -SK_ERR_BAD_MODEL
 * (missing/mistyped key, model other than "llama"/"gpt2", a pre-tokenizer
 * sinkd does not know (named, with the list of known ones), counts that
 * disagree, a special id outside the vocabulary), -SK_ERR_NO_MEMORY. */
int sk_tokenizer_load(const struct sk_gguf *g, struct sk_tokenizer **ret,
                      struct sk_error *err);
void sk_tokenizer_free(struct sk_tokenizer *t);

uint32_t sk_tokenizer_n_vocab(const struct sk_tokenizer *t);
/* Special ids; -1 when the vocabulary has none. eot is
 * tokenizer.ggml.eot_token_id, else the first of llama.cpp's end-of-turn
 * texts the vocabulary has ("<|eot_id|>", "<|im_end|>", "<|end|>",
 * "<end_of_turn>", "<|endoftext|>", ...). */
int32_t sk_tokenizer_bos(const struct sk_tokenizer *t);
int32_t sk_tokenizer_eos(const struct sk_tokenizer *t);
int32_t sk_tokenizer_eot(const struct sk_tokenizer *t);
/* Whether the vocabulary wants BOS in front of / EOS after a tokenized
 * text: tokenizer.ggml.add_bos_token / add_eos_token, else true/false for
 * SentencePiece, and for byte-level BPE false unless the pre-tokenizer
 * implies it (llama-bpe, tekken). False when the token does not exist. */
bool sk_tokenizer_add_bos(const struct sk_tokenizer *t);
bool sk_tokenizer_add_eos(const struct sk_tokenizer *t);
/* Whether the vocabulary is byte-level BPE ("gpt2"). */
bool sk_tokenizer_is_bpe(const struct sk_tokenizer *t);

/* Whether b's vocabulary is a's: the same tokenizer model, token count,
 * every token's text, score and type, and the same BOS, EOS, UNK, PAD,
 * EOT and EOM ids (what a draft model needs to propose ids the model
 * reads as it does; speculation, spec.h). Returns 0, or -SK_ERR_BAD_MODEL
 * with a message naming the first difference, b's value first ("token 17
 * is \"def\", the model's is \"de\""). */
int sk_tokenizer_same_vocab(const struct sk_tokenizer *a, const struct sk_tokenizer *b,
                            struct sk_error *err);

/* Whether generating token ends generation (llama_vocab_is_eog): EOS,
 * EOT, EOM, and every token whose text llama.cpp lists as an end of
 * generation ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
 * "<|endoftext|>", "<|eom_id|>", "</s>", ..., and the fill-in-the-middle
 * pad/repo/file-separator tokens). False for ids outside the vocabulary. */
bool sk_tokenizer_is_eog(const struct sk_tokenizer *t, int32_t token);

/* Id of the token whose vocabulary text is exactly text[0..len) (e.g.
 * "<|im_start|>"), or -1. */
int32_t sk_tokenizer_find(const struct sk_tokenizer *t, const char *text, size_t len);

/* The vocabulary text of a token (for control tokens, their name, where
 * the piece is empty). *ret points into t, NUL-terminated. Returns 0, or
 * -SK_ERR_BAD_REQUEST (no message) if token is outside the vocabulary. */
int sk_tokenizer_text(const struct sk_tokenizer *t, int32_t token, const char **ret,
                      size_t *ret_len);

/* Flags of sk_tokenizer_encode. BOS = 1 so that a bool "add BOS" still
 * means the same. */
#define SK_TOKENIZE_BOS 1u     /* BOS first (if the vocabulary has one) */
#define SK_TOKENIZE_EOS 2u     /* EOS last (if the vocabulary has one) */
#define SK_TOKENIZE_SPECIAL 4u /* control-token text in the input becomes
                                  that token (parse_special): for text the
                                  caller wrote itself (templates), never
                                  for user input */

/* Encodes text[0..len) (any bytes). flags: SK_TOKENIZE_*. *ret_tokens is
 * malloc'd (caller frees), *ret_n its length (may be 0 without BOS).
 * Thread-safe (t is only read). Errors: -SK_ERR_NO_MEMORY,
 * -SK_ERR_INTERNAL if the regex engine gives up on the text. */
int sk_tokenizer_encode(const struct sk_tokenizer *t, const char *text,
                        size_t len, unsigned flags, int32_t **ret_tokens,
                        size_t *ret_n, struct sk_error *err);

/* The bytes one token stands for, as llama_token_to_piece(special=false):
 * "▁" becomes " " (SentencePiece), GPT-2 characters become their bytes
 * (byte-level BPE), <0xXX> becomes that byte, user-defined tokens give
 * their text, control tokens (BOS/EOS/UNK, "<|im_end|>") give nothing. *ret points into t; valid until sk_tokenizer_free.
 * Errors: -SK_ERR_BAD_REQUEST if token is outside [0, n_vocab). */
int sk_tokenizer_piece(const struct sk_tokenizer *t, int32_t token,
                       const char **ret, size_t *ret_len, struct sk_error *err);

/* Detokenizes as llama_detokenize(remove_special=false,
 * unparse_special=false): pieces joined, and with add_space_prefix
 * (SentencePiece) the leading space of the first piece dropped. Unlike
 * llama.cpp, no clean-up of spaces before punctuation for the BPE
 * vocabularies that have it (clean_spaces): the text is exactly the
 * pieces, the same bytes a generate streams.
 * *ret is malloc'd and NUL-terminated (caller frees); *ret_len excludes
 * the NUL. Errors: -SK_ERR_BAD_REQUEST naming the first id outside the
 * vocabulary, -SK_ERR_NO_MEMORY. */
int sk_tokenizer_decode(const struct sk_tokenizer *t, const int32_t *tokens,
                        size_t n, char **ret, size_t *ret_len,
                        struct sk_error *err);

#endif
