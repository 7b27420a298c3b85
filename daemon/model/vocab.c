/* The vocabulary of a GGUF file for the tokenizer (tokenizer.h), after
 * llama.cpp's llama_vocab::impl::load: the tokens with their types and
 * scores, the special token ids, end-of-generation tokens by text, the
 * BPE merges, and each token's piece. tokenizer.c encodes and decodes
 * with it. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_int.h"

/* --- text -> id table ----------------------------------------------------- */

/* A later token with the same text replaces the earlier one, as
 * llama.cpp's token_to_id[word] = i does. */
static void sk__insert(struct sk_tokenizer *t, int32_t id) {
  const char *s = sk__text(t, id);
  size_t n = t->tokens[id].len;
  uint64_t h = sk__hash(s, n);
  uint32_t fp = (uint32_t)(h >> 32);
  size_t i = (size_t)h & t->table_mask;
  for (;;) {
    int32_t old = t->table[i].id;
    if (old < 0 || (t->table[i].fp == fp && t->tokens[old].len == n &&
                    memcmp(sk__text(t, old), s, n) == 0)) {
      t->table[i] = (struct sk__slot){id, fp};
      return;
    }
    i = (i + 1) & t->table_mask;
  }
}

/* --- GPT-2 byte <-> character map -------------------------------------------- */

/* The printable Latin-1 bytes stand for themselves; the other 68 bytes, in
 * order, for U+0100 onwards (openai/gpt-2 encoder.py bytes_to_unicode). */
static uint32_t sk__byte_cpt(unsigned b) {
  if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))
    return b;
  unsigned n = 0;
  for (unsigned c = 0; c < b; c++)
    if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff)))
      n++;
  return 0x100 + n;
}

/* Inverse: the byte a code point stands for, or -1. */
static int sk__cpt_byte(uint32_t c) {
  if ((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff))
    return (int)c;
  if (c < 0x100 || c >= 0x100 + 68) return -1;
  unsigned n = c - 0x100;
  for (unsigned b = 0; b < 256; b++)
    if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) &&
        n-- == 0)
      return (int)b;
  return -1;
}

/* --- load ------------------------------------------------------------------ */

static int sk__hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The byte a BYTE token stands for: llama.cpp's token_to_byte parses the
 * hex after "<0x" with strtol, so do the same (digits until the first
 * non-hex character; 0 if none). */
static char sk__token_byte(const char *s, size_t n) {
  unsigned v = 0;
  for (size_t i = 3; i < n && sk__hexval(s[i]) >= 0; i++)
    v = (v << 4 | (unsigned)sk__hexval(s[i])) & 0xffu;
  return (char)v;
}

/* The piece of a token (llama_token_to_piece, special=false), written to
 * out; returns its length, never more than the text's:
 * control and unknown tokens give nothing, user-defined ones their text;
 * normal ones "▁" -> " " (SPM) or each GPT-2 character -> its byte (BPE;
 * a character outside the map is kept as it is); byte tokens their byte.
 * (llama.cpp writes "[UNK_BYTE_..]" for a character outside the map; a
 * piece here stays no longer than its text.) */
static size_t sk__make_piece(enum sk__kind kind, const struct sk__token *tok,
                             const char *text, char *out) {
  if (tok->attr & (SK__ATTR_CONTROL | SK__ATTR_UNKNOWN)) return 0;
  if (tok->attr & SK__ATTR_USER_DEFINED) {
    memcpy(out, text, tok->len);
    return tok->len;
  }
  if (tok->attr & SK__ATTR_NORMAL) {
    size_t o = 0;
    for (size_t i = 0; i < tok->len;) {
      if (kind == SK__SPM) {
        if (tok->len - i >= 3 && memcmp(text + i, sk__space, 3) == 0) {
          out[o++] = ' ';
          i += 3;
        } else {
          out[o++] = text[i++];
        }
        continue;
      }
      uint32_t c;
      size_t n = sk_utf8_char((const unsigned char *)text + i, tok->len - i, &c);
      int b = n ? sk__cpt_byte(c) : -1;
      if (b >= 0) {
        out[o++] = (char)b;
        i += n;
      } else {
        size_t k = n ? n : 1;
        memcpy(out + o, text + i, k);
        o += k;
        i += k;
      }
    }
    return o;
  }
  if (tok->attr & SK__ATTR_BYTE) {
    out[0] = sk__token_byte(text, tok->len);
    return 1;
  }
  return 0; /* unused, undefined */
}

/* A special token id from key: absent gives def; an id outside the
 * vocabulary is refused. */
static int sk__special_id(const struct sk_gguf *g, const char *key, int32_t def,
                          uint32_t n_vocab, int32_t *ret, struct sk_error *err) {
  uint32_t v;
  int r = sk_gguf_get_u32(g, key, &v, err);
  if (r < 0) return r;
  if (r == 0) {
    /* A default outside a small vocabulary means none (llama.cpp). */
    *ret = def >= 0 && (uint32_t)def < n_vocab ? def : -1;
    return 0;
  }
  if (v >= n_vocab)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "%s: id %" PRIu32
                        " outside the vocabulary of %" PRIu32 " tokens",
                        key, v, n_vocab);
  *ret = (int32_t)v;
  return 0;
}

/* qsort has no context argument; thread-local so concurrent loads are safe. */
static _Thread_local const struct sk_tokenizer *sk__sort_t;

static int sk__cmp_special(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  size_t lx = sk__sort_t->tokens[x].len, ly = sk__sort_t->tokens[y].len;
  if (lx != ly) return lx > ly ? -1 : 1;
  return (x > y) - (x < y);
}

/* Texts that end generation, and the end-of-turn and fill-in-the-middle
 * texts, as llama.cpp recognises them (llama_vocab::impl::load, "auto-
 * detect special tokens by text" and special_eog_ids). */
static const char *const sk__eog_texts[] = {
  "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
  "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
  "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
  "<turn|>", "<|tool_response>",
  "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL,
};
static const char *const sk__eot_texts[] = {
  "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
  "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
  "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
  "<end_of_utterance>", NULL,
};
/* Fill-in-the-middle: pad, repo and file separator end generation. */
static const char *const sk__fim_eog_texts[] = {
  "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
  "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
  "<|file_sep|>", NULL,
};
static const char *const sk__fim_texts[] = {
  "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
  "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>", "\xe2\x96\x81<PRE>",
  "<|code_prefix|>", "<|prefix|>",
  "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
  "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>",
  "<|code_suffix|>", "<|suffix|>",
  "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
  "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>", "\xe2\x96\x81<MID>",
  "<|code_middle|>", "<|middle|>", NULL,
};

/* The merges of tokenizer.ggml.merges ("left right", rank = index) into
 * the (left id, right id) table. A merge whose parts or result are not
 * tokens is left out: in a byte-level vocabulary every character is a
 * token, so such a merge could only apply to a piece that is not a token
 * itself (llama.cpp keeps them, keyed by text). A repeated pair keeps its
 * first rank, as llama.cpp's bpe_ranks.emplace does. */
static int sk__load_merges(struct sk_tokenizer *t, const struct sk_gguf *g,
                           struct sk_error *err) {
  const struct sk_gguf_str *m;
  uint64_t n;
  int r = sk_gguf_get_str_array(g, "tokenizer.ggml.merges", &m, &n, err);
  if (r < 0) return r;
  if (r == 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tokenizer.ggml.merges: missing (a 'gpt2' vocabulary needs them)");
  if (n > SK__MAX_VOCAB)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tokenizer.ggml.merges: %" PRIu64
                        " merges (at most %" PRIu64 ")", n, SK__MAX_VOCAB);
  size_t cap = 16;
  while (cap < 2 * (size_t)n) cap <<= 1;
  t->merges = malloc(cap * sizeof *t->merges);
  size_t max_len = 0;
  for (uint64_t i = 0; i < n; i++)
    if (m[i].len > max_len) max_len = (size_t)m[i].len;
  char *buf = malloc(max_len + 1);
  if (!t->merges || !buf) {
    free(buf);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "tokenizer: cannot allocate %" PRIu64
                        " merges", n);
  }
  t->merge_mask = cap - 1;
  for (size_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
  for (uint64_t i = 0; i < n; i++) {
    const char *s = m[i].ptr;
    size_t len = (size_t)m[i].len;
    /* The separator is the first space after the first byte (a part may
     * not be empty). */
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (!sp) continue;
    size_t la = (size_t)(sp - s), lb = len - la - 1;
    int32_t a = sk__lookup(t, s, la), b = sk__lookup(t, sp + 1, lb);
    if (a < 0 || b < 0) continue;
    memcpy(buf, s, la);
    memcpy(buf + la, sp + 1, lb);
    int32_t ab = sk__lookup(t, buf, la + lb);
    if (ab < 0) continue;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t j = sk__merge_slot(key, t->merge_mask);
    while (t->merges[j].key != UINT64_MAX && t->merges[j].key != key)
      j = (j + 1) & t->merge_mask;
    if (t->merges[j].key == key) continue;
    t->merges[j] = (struct sk__merge){key, (int32_t)i, ab};
  }
  free(buf);

  /* Each byte's GPT-2 character, its token, and (for the fallback of a
   * piece that is not a token) the tokens of its UTF-8 bytes one by one. */
  for (unsigned b = 0; b < 256; b++) {
    uint32_t c = sk__byte_cpt(b);
    if (c < 0x80) {
      t->byte_char[b][0] = (char)c;
      t->byte_char_len[b] = 1;
    } else {
      t->byte_char[b][0] = (char)(0xc0 | c >> 6);
      t->byte_char[b][1] = (char)(0x80 | (c & 0x3f));
      t->byte_char_len[b] = 2;
    }
    t->byte_char_id[b] = sk__lookup(t, t->byte_char[b], t->byte_char_len[b]);
    for (unsigned k = 0; k < 2; k++)
      t->byte_fallback[b][k] =
          k < t->byte_char_len[b] ? sk__lookup(t, &t->byte_char[b][k], 1) : -1;
  }
  return 0;
}

/* End-of-generation and other special tokens by text, and the split list
 * (llama_vocab::impl::load after the special ids are read). */
static int sk__mark_specials(struct sk_tokenizer *t, const struct sk_gguf *g,
                             struct sk_error *err) {
  /* By text: the token a text maps to (the last of equal texts), as
   * llama.cpp's walk over token_to_id finds it. */
  static const char *const *const lists[] = {sk__eog_texts, sk__fim_eog_texts, sk__fim_texts};
  for (size_t l = 0; l < 3; l++)
    for (const char *const *s = lists[l]; *s; s++) {
      int32_t id = sk__lookup(t, *s, strlen(*s));
      if (id >= 0) t->tokens[id].attr |= SK__ATTR_CONTROL | (l < 2 ? SK__ATTR_EOG : 0);
    }
  /* The end-of-turn token when the file names none: the first text of
   * the list that the vocabulary has. */
  if (t->eot < 0)
    for (const char *const *s = sk__eot_texts; *s && t->eot < 0; s++)
      t->eot = sk__lookup(t, *s, strlen(*s));
  if (t->eom < 0) t->eom = sk__lookup(t, "<|eom_id|>", 10);
  if (t->eos >= 0) t->tokens[t->eos].attr |= SK__ATTR_EOG;
  if (t->eot >= 0) t->tokens[t->eot].attr |= SK__ATTR_EOG;
  if (t->eom >= 0) t->tokens[t->eom].attr |= SK__ATTR_EOG;

  size_t n = 0;
  for (uint32_t i = 0; i < t->n_vocab; i++)
    if (t->tokens[i].attr & (SK__ATTR_CONTROL | SK__ATTR_USER_DEFINED | SK__ATTR_UNKNOWN)) n++;
  if (n) {
    t->specials = malloc(n * sizeof *t->specials);
    if (!t->specials) return sk_error_set(err, SK_ERR_NO_MEMORY, "tokenizer: cannot allocate");
    for (uint32_t i = 0; i < t->n_vocab; i++)
      if (t->tokens[i].attr & (SK__ATTR_CONTROL | SK__ATTR_USER_DEFINED | SK__ATTR_UNKNOWN))
        t->specials[t->n_specials++] = (int32_t)i;
    sk__sort_t = t;
    qsort(t->specials, t->n_specials, sizeof *t->specials, sk__cmp_special);
  }

  /* Phi-3 (by general.name, as llama.cpp): the text after a special
   * token loses its leading whitespace, except after <unk>, <s> and
   * <|endoftext|>. */
  struct sk_gguf_str name;
  int r = sk_gguf_get_str(g, "general.name", &name, err);
  if (r < 0) return r;
  char lower[128];
  size_t nl = r == 1 ? (name.len < sizeof lower - 1 ? (size_t)name.len : sizeof lower - 1) : 0;
  for (size_t i = 0; i < nl; i++) {
    char c = name.ptr[i];
    lower[i] = c >= 'A' && c <= 'Z' ? (char)(c + 32) : c;
  }
  lower[nl] = 0;
  bool phi3 = strstr(lower, "phi-3") || strstr(lower, "phi3");
  if (phi3) {
    for (size_t i = 0; i < t->n_specials; i++) t->tokens[t->specials[i]].attr |= SK__ATTR_RSTRIP;
    int32_t id = sk__lookup(t, "</s>", 4);
    if (id >= 0) t->tokens[id].attr |= SK__ATTR_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t k = 0; k < 3; k++)
      if ((id = sk__lookup(t, keep[k], strlen(keep[k]))) >= 0)
        t->tokens[id].attr &= (uint16_t)~SK__ATTR_RSTRIP;
  }
  return 0;
}

static uint16_t sk__type_attr(int32_t type) {
  switch (type) {
  case SK__TOK_NORMAL: return SK__ATTR_NORMAL;
  case SK__TOK_UNKNOWN: return SK__ATTR_UNKNOWN;
  case SK__TOK_CONTROL: return SK__ATTR_CONTROL;
  case SK__TOK_USER_DEFINED: return SK__ATTR_USER_DEFINED;
  case SK__TOK_UNUSED: return SK__ATTR_UNUSED;
  case SK__TOK_BYTE: return SK__ATTR_BYTE;
  default: return 0;
  }
}

/* tokenizer.ggml.model (SentencePiece or byte-level BPE) and, for BPE,
 * the pre-tokenizer of tokenizer.ggml.pre; *info its rules. */
static int sk__load_kind(struct sk_tokenizer *t, const struct sk_gguf *g,
                         struct sk_pretok_info *info, struct sk_error *err) {
  struct sk_gguf_str model;
  int r = sk_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
  if (r < 0) return r;
  if (r == 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tokenizer.ggml.model: missing");
  if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) {
    t->kind = SK__SPM;
  } else if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) {
    t->kind = SK__BPE;
  } else {
    char q[36];
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tokenizer.ggml.model: '%s' is not supported (only 'llama'"
                        " and 'gpt2')",
                        sk_gguf_quote(q, sizeof q, model.ptr, model.len));
  }

  /* The pre-tokenizer first: an unknown name is the likeliest refusal. */
  if (t->kind == SK__BPE) {
    struct sk_gguf_str pre;
    r = sk_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (r < 0) return r;
    if (r == 0) pre = (struct sk_gguf_str){"default", 7};
    r = sk_pretok_new(pre.ptr, (size_t)pre.len, &t->pretok, info, err);
    if (r < 0) return r;
    t->ignore_merges = info->ignore_merges;
  }
  return 0;
}

/* The tokens: texts, scores and types (optional, as in llama.cpp: 0.0
 * and NORMAL), into the pool and the text -> id table. */
static int sk__load_tokens(struct sk_tokenizer *t, const struct sk_gguf *g,
                           struct sk_error *err) {
  const struct sk_gguf_str *texts;
  uint64_t n;
  int r = sk_gguf_get_str_array(g, "tokenizer.ggml.tokens", &texts, &n, err);
  if (r < 0) return r;
  if (r == 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tokenizer.ggml.tokens: missing");
  if (n == 0 || n > SK__MAX_VOCAB)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tokenizer.ggml.tokens: %" PRIu64 " tokens (expected 1..%"
                        PRIu64 ")", n, SK__MAX_VOCAB);
  t->n_vocab = (uint32_t)n;

  /* Scores and types are optional in llama.cpp (0.0 and NORMAL). */
  float *scores = NULL;
  int32_t *types = NULL;
  uint64_t n_scores = 0, n_types = 0;
  r = sk_gguf_get_f32_array(g, "tokenizer.ggml.scores", &scores, &n_scores, err);
  if (r < 0) return r;
  if (r == 1 && n_scores != n) {
    free(scores);
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tokenizer.ggml.scores: %" PRIu64
                        " entries for %" PRIu64 " tokens", n_scores, n);
  }
  r = sk_gguf_get_i32_array(g, "tokenizer.ggml.token_type", &types, &n_types, err);
  if (r < 0) {
    free(scores);
    return r;
  }
  if (r == 1 && n_types != n) {
    free(scores);
    free(types);
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tokenizer.ggml.token_type: %" PRIu64
                        " entries for %" PRIu64 " tokens", n_types, n);
  }

  /* Pool: each text (empty ones renamed "[EMPTY_i]" as llama.cpp does) and
   * its piece, which is never longer than the text. Sizes are bounded by
   * the file, but add with overflow checks anyway. */
  char empty_name[32];
  size_t pool_size = 0;
  for (uint64_t i = 0; i < n; i++) {
    size_t len = texts[i].len ? (size_t)texts[i].len
                              : (size_t)snprintf(empty_name, sizeof empty_name,
                                                 "[EMPTY_%" PRIu64 "]", i);
    if (len > (SIZE_MAX - pool_size) / 2 - 1) {
      r = sk_error_set(err, SK_ERR_NO_MEMORY, "tokenizer: vocabulary too large");
      goto out;
    }
    pool_size += 2 * len + 1;
  }
  t->tokens = calloc((size_t)n, sizeof *t->tokens);
  t->pool = malloc(pool_size ? pool_size : 1);
  size_t cap = 1;
  while (cap < 2 * (size_t)n) cap <<= 1; /* load factor <= 1/2 */
  t->table = malloc(cap * sizeof *t->table);
  if (!t->tokens || !t->pool || !t->table) {
    r = sk_error_set(err, SK_ERR_NO_MEMORY, "tokenizer: cannot allocate %" PRIu64
                     " tokens", n);
    goto out;
  }
  t->table_mask = cap - 1;
  for (size_t i = 0; i < cap; i++) t->table[i] = (struct sk__slot){-1, 0};

  size_t off = 0;
  for (uint64_t i = 0; i < n; i++) {
    struct sk__token *tok = &t->tokens[i];
    tok->text = off;
    if (texts[i].len) {
      tok->len = (size_t)texts[i].len;
      memcpy(t->pool + off, texts[i].ptr, tok->len);
    } else {
      tok->len = (size_t)snprintf(t->pool + off, pool_size - off,
                                  "[EMPTY_%" PRIu64 "]", i);
    }
    off += tok->len;
    t->pool[off++] = '\0';
    tok->score = scores ? scores[i] : 0.0f;
    tok->attr = types ? sk__type_attr(types[i]) : SK__ATTR_NORMAL;
    tok->type = types ? types[i] : SK__TOK_NORMAL;
    tok->piece = off;
    off += tok->len; /* room for the piece, made once the attributes are final */
    sk__insert(t, (int32_t)i);
  }

  r = 0;
out:
  free(scores);
  free(types);
  return r;
}

/* The special token ids (defaults by kind and pre-tokenizer) and whether
 * a space, BOS and EOS are added. */
static int sk__load_special_ids(struct sk_tokenizer *t, const struct sk_gguf *g,
                                const struct sk_pretok_info *info, struct sk_error *err) {
  bool spm = t->kind == SK__SPM;
  int r = sk__special_id(g, "tokenizer.ggml.bos_token_id", info->no_bos ? -1 : spm ? 1 : 11,
                     t->n_vocab, &t->bos, err);
  if (r < 0) return r;
  r = sk__special_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : 11, t->n_vocab, &t->eos, err);
  if (r < 0) return r;
  r = sk__special_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, t->n_vocab, &t->unk,
                     err);
  if (r < 0) return r;
  r = sk__special_id(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab, &t->eot, err);
  if (r < 0) return r;
  r = sk__special_id(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab, &t->eom, err);
  if (r < 0) return r;
  /* llama.cpp's converters write -1 (as 2^32 - 1) for "no padding":
   * an id outside the vocabulary means none here, not a broken file */
  uint32_t pad;
  r = sk_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &pad, err);
  if (r < 0) return r;
  t->pad = r == 1 && pad < t->n_vocab ? (int32_t)pad : -1;
  /* SentencePiece puts a space in front and adds BOS; byte-level BPE does
   * neither unless its pre-tokenizer says so. The keys override. */
  t->add_space_prefix = spm;
  t->add_bos = spm || info->add_bos;
  t->add_eos = false;
  r = sk_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
  if (r < 0) return r;
  r = sk_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
  if (r < 0) return r;
  r = sk_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err);
  if (r < 0) return r;
  return 0;
}

static int sk__load(struct sk_tokenizer *t, const struct sk_gguf *g, struct sk_error *err) {
  struct sk_pretok_info info = {0};
  int r = sk__load_kind(t, g, &info, err);
  if (r < 0) return r;
  if ((r = sk__load_tokens(t, g, err)) < 0 || (r = sk__load_special_ids(t, g, &info, err)) < 0)
    return r;
  r = sk__mark_specials(t, g, err);
  if (r < 0) return r;
  for (uint32_t i = 0; i < t->n_vocab; i++) {
    struct sk__token *tok = &t->tokens[i];
    tok->piece_len = sk__make_piece(t->kind, tok, t->pool + tok->text, t->pool + tok->piece);
  }

  if (t->kind == SK__BPE) {
    r = sk__load_merges(t, g, err);
    if (r < 0) return r;
  } else {
    /* byte_to_token: "<0xXX>" (uppercase hex, as the vocabularies spell
     * it), else the byte itself as a one-byte token, else <unk> (where
     * llama.cpp would throw). */
    for (unsigned b = 0; b < 256; b++) {
      char name[7];
      snprintf(name, sizeof name, "<0x%02X>", b);
      int32_t id = sk__lookup(t, name, 6);
      if (id < 0) id = sk__lookup(t, &(char){(char)b}, 1);
      t->byte_to_id[b] = id >= 0 ? id : t->unk;
    }
  }
  return 0;
}

int sk_tokenizer_load(const struct sk_gguf *g, struct sk_tokenizer **ret,
                      struct sk_error *err) {
  struct sk_tokenizer *t = calloc(1, sizeof *t);
  if (!t) return sk_error_set(err, SK_ERR_NO_MEMORY, "tokenizer: cannot allocate");
  int r = sk__load(t, g, err);
  if (r < 0) {
    sk_tokenizer_free(t);
    return r;
  }
  *ret = t;
  return 0;
}

void sk_tokenizer_free(struct sk_tokenizer *t) {
  if (!t) return;
  free(t->tokens);
  free(t->pool);
  free(t->table);
  free(t->specials);
  free(t->merges);
  sk_pretok_free(t->pretok);
  free(t);
}

uint32_t sk_tokenizer_n_vocab(const struct sk_tokenizer *t) { return t->n_vocab; }
int32_t sk_tokenizer_bos(const struct sk_tokenizer *t) { return t->bos; }
int32_t sk_tokenizer_eos(const struct sk_tokenizer *t) { return t->eos; }
int32_t sk_tokenizer_eot(const struct sk_tokenizer *t) { return t->eot; }
bool sk_tokenizer_add_bos(const struct sk_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool sk_tokenizer_add_eos(const struct sk_tokenizer *t) { return t->add_eos && t->eos >= 0; }
bool sk_tokenizer_is_bpe(const struct sk_tokenizer *t) { return t->kind == SK__BPE; }

bool sk_tokenizer_is_eog(const struct sk_tokenizer *t, int32_t token) {
  return token >= 0 && (uint32_t)token < t->n_vocab && (t->tokens[token].attr & SK__ATTR_EOG);
}

int32_t sk_tokenizer_find(const struct sk_tokenizer *t, const char *text, size_t len) {
  return sk__lookup(t, text, len);
}

int sk_tokenizer_text(const struct sk_tokenizer *t, int32_t token, const char **ret,
                      size_t *ret_len) {
  if (token < 0 || (uint32_t)token >= t->n_vocab) return -SK_ERR_BAD_REQUEST;
  *ret = sk__text(t, token);
  *ret_len = t->tokens[token].len;
  return 0;
}

/* ---- two vocabularies ---- */

/* A token's text for a message: at most 24 bytes, control characters as
 * '?'. */
static void sk__quote(const struct sk_tokenizer *t, int32_t id, char out[32]) {
  const char *s = sk__text(t, id);
  size_t n = t->tokens[id].len < 24 ? t->tokens[id].len : 24, k = 0;
  for (size_t i = 0; i < n; i++) out[k++] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
  if (t->tokens[id].len > 24) out[k++] = '.', out[k++] = '.', out[k++] = '.';
  out[k] = 0;
}

int sk_tokenizer_same_vocab(const struct sk_tokenizer *a, const struct sk_tokenizer *b,
                            struct sk_error *err) {
  if (a->kind != b->kind)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tokenizer %s, the model's is %s",
                        b->kind == SK__SPM ? "llama" : "gpt2", a->kind == SK__SPM ? "llama" : "gpt2");
  if (a->n_vocab != b->n_vocab)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "%u tokens, the model has %u", b->n_vocab,
                        a->n_vocab);
  for (uint32_t i = 0; i < a->n_vocab; i++) {
    const struct sk__token *x = &a->tokens[i], *y = &b->tokens[i];
    char qa[32], qb[32];
    if (x->len != y->len || memcmp(sk__text(a, (int32_t)i), sk__text(b, (int32_t)i), x->len)) {
      sk__quote(a, (int32_t)i, qa);
      sk__quote(b, (int32_t)i, qb);
      return sk_error_set(err, SK_ERR_BAD_MODEL, "token %u is \"%s\", the model's is \"%s\"", i,
                          qb, qa);
    }
    if (memcmp(&x->score, &y->score, sizeof x->score) != 0) {
      sk__quote(a, (int32_t)i, qa);
      return sk_error_set(err, SK_ERR_BAD_MODEL, "token %u (\"%s\") has score %g, the model's %g",
                          i, qa, (double)y->score, (double)x->score);
    }
    if (x->type != y->type) {
      sk__quote(a, (int32_t)i, qa);
      return sk_error_set(err, SK_ERR_BAD_MODEL, "token %u (\"%s\") has type %d, the model's %d",
                          i, qa, y->type, x->type);
    }
  }
  const struct {
    const char *name;
    int32_t x, y;
  } ids[] = {{"BOS", a->bos, b->bos}, {"EOS", a->eos, b->eos}, {"UNK", a->unk, b->unk},
             {"PAD", a->pad, b->pad}, {"EOT", a->eot, b->eot}, {"EOM", a->eom, b->eom}};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (ids[i].x != ids[i].y)
      return sk_error_set(err, SK_ERR_BAD_MODEL, "%s id %d, the model's %d (-1: none)",
                          ids[i].name, ids[i].y, ids[i].x);
  return 0;
}
