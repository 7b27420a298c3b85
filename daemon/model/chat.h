/* Chat templates: the built-in conversation formats of llama.cpp's
 * llama_chat_apply_template (src/llama-chat.cpp), recognised from the
 * distinctive text of a GGUF's tokenizer.chat_template the way its
 * llm_chat_detect_template does, and rendered byte for byte as it renders
 * them. No Jinja is evaluated: a template whose text none of the rules
 * recognise is refused by name, and the operator names the family
 * (`chat_template`).
 *
 * A rendering is a list of segments, each either template text (role
 * markers, turn separators: special-token text the daemon inserts itself)
 * or content (a message's text, which is tokenized with special tokens
 * off, so a user cannot forge a turn by typing "<|im_end|>").
 */
#ifndef SK_CHAT_H
#define SK_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sinkd/protocol.h"

/* The families, in llama.cpp's naming (sk_chat_name). */
#define SK_CHAT_LIST(X)                                                       \
  X(CHATML, "chatml")                                                         \
  X(LLAMA2, "llama2")                                                         \
  X(LLAMA2_SYS, "llama2-sys")                                                 \
  X(LLAMA2_SYS_BOS, "llama2-sys-bos")                                         \
  X(LLAMA2_SYS_STRIP, "llama2-sys-strip")                                     \
  X(MISTRAL_V1, "mistral-v1")                                                 \
  X(MISTRAL_V3, "mistral-v3")                                                 \
  X(MISTRAL_V3_TEKKEN, "mistral-v3-tekken")                                   \
  X(MISTRAL_V7, "mistral-v7")                                                 \
  X(MISTRAL_V7_TEKKEN, "mistral-v7-tekken")                                   \
  X(PHI3, "phi3")                                                             \
  X(PHI4, "phi4")                                                             \
  X(FALCON3, "falcon3")                                                       \
  X(ZEPHYR, "zephyr")                                                         \
  X(MONARCH, "monarch")                                                       \
  X(GEMMA, "gemma")                                                           \
  X(ORION, "orion")                                                           \
  X(OPENCHAT, "openchat")                                                     \
  X(VICUNA, "vicuna")                                                         \
  X(VICUNA_ORCA, "vicuna-orca")                                               \
  X(DEEPSEEK, "deepseek")                                                     \
  X(DEEPSEEK2, "deepseek2")                                                   \
  X(DEEPSEEK3, "deepseek3")                                                   \
  X(COMMAND_R, "command-r")                                                   \
  X(LLAMA3, "llama3")                                                         \
  X(CHATGLM3, "chatglm3")                                                     \
  X(CHATGLM4, "chatglm4")                                                     \
  X(GLMEDGE, "glmedge")                                                       \
  X(MINICPM, "minicpm")                                                       \
  X(EXAONE3, "exaone3")                                                       \
  X(EXAONE4, "exaone4")                                                       \
  X(RWKV_WORLD, "rwkv-world")                                                 \
  X(GRANITE, "granite")                                                       \
  X(GRANITE_4_0, "granite-4.0")                                               \
  X(GRANITE_4_1, "granite-4.1")                                               \
  X(GIGACHAT, "gigachat")                                                     \
  X(MEGREZ, "megrez")                                                         \
  X(YANDEX, "yandex")                                                         \
  X(BAILING, "bailing")                                                       \
  X(BAILING_THINK, "bailing-think")                                           \
  X(BAILING2, "bailing2")                                                     \
  X(LLAMA4, "llama4")                                                         \
  X(SMOLVLM, "smolvlm")                                                       \
  X(SEED_OSS, "seed_oss")

enum sk_chat_template {
  SK_CHAT_NONE = 0, /* no template: plain continuation */
#define SK__CHAT_ENUM(id, name) SK_CHAT_##id,
  SK_CHAT_LIST(SK__CHAT_ENUM)
#undef SK__CHAT_ENUM
  SK_CHAT__COUNT
};

/* Longest family name, with its NUL. */
#define SK_CHAT_NAME_MAX 24u

/* One message. role and content are byte strings (no NUL needed). */
struct sk_chat_msg {
  const char *role;
  size_t role_len;
  const char *content;
  size_t content_len;
};

/* A rendering: text[0..len) and its segments, in order, covering it. */
struct sk_chat_seg {
  size_t off, len;
  bool content; /* a message's text (false: template text) */
};
struct sk_chat_text {
  char *text;               /* (cap) owned, NUL-terminated */
  size_t len, cap;
  struct sk_chat_seg *segs; /* (seg_cap) owned */
  size_t n_segs, seg_cap;
};

/* Name of a family ("chatml"), or "none" for SK_CHAT_NONE, NULL out of
 * range. Static storage. */
const char *sk_chat_name(int tmpl);
/* Family by its name (len bytes; "none" gives SK_CHAT_NONE), or -1. */
int sk_chat_from_name(const char *name, size_t len);
/* The family llama.cpp's detection picks for a template text of len bytes
 * (a family name is taken as itself), or -1 when no rule matches. The
 * rules are llm_chat_detect_template's, in its order (substring tests:
 * "<|im_start|>" is ChatML unless "<|im_sep|>" makes it Phi-4, ...). */
int sk_chat_detect(const char *text, size_t len);
/* sk_chat_detect for a daemon or session setting: a family name, or a
 * whole template text. Errors: -SK_ERR_BAD_REQUEST "unrecognised chat
 * template; set chat_template to one of chatml, llama2, ..." (what names
 * the setting's origin, e.g. "the model's tokenizer.chat_template"). */
int sk_chat_resolve(const char *text, size_t len, const char *what, int *ret,
                    struct sk_error *err);
/* Writes the comma-separated list of family names into buf (size bytes,
 * NUL-terminated, truncated to fit). */
void sk_chat_names(char *buf, size_t size);

void sk_chat_text_init(struct sk_chat_text *t);
void sk_chat_text_free(struct sk_chat_text *t);
void sk_chat_text_reset(struct sk_chat_text *t);

/* Renders msgs[0..n) with family tmpl as llama_chat_apply_template does,
 * appending to out (its segments too); add_ass: end with the assistant's
 * generation prompt. Errors: -SK_ERR_BAD_REQUEST (tmpl is SK_CHAT_NONE or
 * out of range), -SK_ERR_NO_MEMORY. */
int sk_chat_render(int tmpl, const struct sk_chat_msg *msgs, size_t n, bool add_ass,
                   struct sk_chat_text *out, struct sk_error *err);

/* The end-of-turn text of an assistant message in family tmpl: what the
 * rendering puts right after the content, without surrounding white space
 * ("<|im_end|>" for chatml, "<|eot_id|>" for llama3, "" for families that
 * close a turn with white space only). Static storage or a pointer into
 * *scratch (init'd by the caller, freed by it). Errors: -SK_ERR_NO_MEMORY. */
int sk_chat_end_of_turn(int tmpl, struct sk_chat_text *scratch, const char **ret,
                        size_t *ret_len, struct sk_error *err);

#endif
