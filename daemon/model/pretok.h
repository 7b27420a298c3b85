/* Pre-tokenizer of byte-level BPE vocabularies (tokenizer.ggml.model =
 * "gpt2"): splits text into the words that BPE merges never cross, with
 * the regular expressions the vocabulary's tokenizer.ggml.pre names.
 *
 * The expressions are those of the Hugging Face tokenizer.json files, as
 * llama.cpp lists them per pre-tokenizer name (src/llama-vocab.cpp,
 * llm_tokenizer_bpe). They are applied in order, each to every piece the
 * previous one left: a piece is cut into its matches and the text between
 * them, each kept as a piece of its own (the "Isolated" split behaviour
 * of tokenizers, and llama.cpp's unicode_regex_split). PCRE2 evaluates
 * them (UTF, Unicode properties for \p{..}; \s as the White_Space
 * property; JIT-compiled when the library has JIT). Letters, numbers and
 * punctuation are those of PCRE2's Unicode tables (Unicode 14 in Debian
 * 12's 10.42): characters assigned later are unassigned here, where
 * llama.cpp's own tables may know them, and may be split differently.
 */
#ifndef SK_PRETOK_H
#define SK_PRETOK_H

#include <stdbool.h>
#include <stddef.h>

#include "sinkd/protocol.h"

struct sk_pretok;

/* Flags a pre-tokenizer name brings with it (llama_vocab::impl::load). */
struct sk_pretok_info {
  bool ignore_merges; /* a word that is a whole token is taken as is */
  bool add_bos;       /* BOS is added by default (absent add_bos_token) */
  bool no_bos;        /* the vocabulary has no BOS token (chatglm) */
};

/* Compiles the expressions of the pre-tokenizer called name[0..len)
 * (e.g. "llama-bpe", "qwen2", "gpt-2"). *ret is owned by the caller (free
 * with sk_pretok_free); *info (may be NULL) gets the name's flags.
 * Errors: -SK_ERR_BAD_MODEL for a name sinkd does not know (the message
 * names it and lists the known ones), -SK_ERR_NO_MEMORY, -SK_ERR_INTERNAL
 * if PCRE2 refuses an expression (a build without Unicode support). */
int sk_pretok_new(const char *name, size_t len, struct sk_pretok **ret,
                  struct sk_pretok_info *info, struct sk_error *err);
void sk_pretok_free(struct sk_pretok *p);

/* Writes the known names to buf (size bytes, NUL-terminated, cut at a
 * name if too small), comma-separated, one per family of aliases (e.g.
 * "llama-bpe" for llama3, llama-v3, falcon3, ...). */
void sk_pretok_names(char *buf, size_t size);

/* Splits text[0..len), which must be valid UTF-8, into words. *ret_ends
 * is a malloc'd array (caller frees) of *ret_n word end offsets in bytes,
 * increasing, the last one len (no entry for empty text): word i is
 * text[ends[i-1] .. ends[i]). Safe to call from several threads at once.
 * Errors: -SK_ERR_NO_MEMORY, -SK_ERR_INTERNAL when PCRE2 gives up on the
 * text (a resource limit; the message has PCRE2's reason). */
int sk_pretok_split(const struct sk_pretok *p, const char *text, size_t len,
                    size_t **ret_ends, size_t *ret_n, struct sk_error *err);

#endif
