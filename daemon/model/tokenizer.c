/* Tokenizers of GGUF vocabularies, after llama.cpp's src/llama-vocab.cpp
 * (llama_vocab::impl::load, tokenize, token_to_piece, detokenize):
 * SentencePiece (llm_tokenizer_spm) for tokenizer.ggml.model = "llama"
 * and byte-level BPE (llm_tokenizer_bpe) for "gpt2"; special tokens split
 * out of the text first (tokenizer_st_partition).
 */
#include "model/tokenizer.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "model/pretok.h"

/* GGUF token types (llama_token_type). */
enum {
  SK__TOK_UNDEFINED = 0,
  SK__TOK_NORMAL = 1,
  SK__TOK_UNKNOWN = 2,
  SK__TOK_CONTROL = 3,
  SK__TOK_USER_DEFINED = 4,
  SK__TOK_UNUSED = 5,
  SK__TOK_BYTE = 6,
};

/* Token attributes (llama_token_attr): the type, plus CONTROL added to
 * tokens whose text marks them as end of turn or fill-in-the-middle even
 * when the file typed them otherwise, and RSTRIP for the Phi-3 rule. */
enum {
  SK__ATTR_UNKNOWN = 1u << 1,
  SK__ATTR_UNUSED = 1u << 2,
  SK__ATTR_NORMAL = 1u << 3,
  SK__ATTR_CONTROL = 1u << 4,
  SK__ATTR_USER_DEFINED = 1u << 5,
  SK__ATTR_BYTE = 1u << 6,
  SK__ATTR_RSTRIP = 1u << 8,
  SK__ATTR_EOG = 1u << 15, /* sinkd's: ends generation */
};

/* Ids are int32_t on the wire and in the API. */
#define SK__MAX_VOCAB ((uint64_t)INT32_MAX)

/* "▁" (U+2581): SentencePiece's visible space. */
static const char sk__space[3] = {'\xe2', '\x96', '\x81'};

enum sk__kind { SK__SPM, SK__BPE };

struct sk__token {
  size_t text;    /* offset of the vocabulary text in pool */
  size_t len;
  size_t piece;   /* offset of the piece (token_to_piece) in pool */
  size_t piece_len;
  float score;
  uint16_t attr;  /* SK__ATTR_* */
};

/* One BPE merge "left right" of rank r, in the (left id, right id)
 * table: the key is left << 32 | right, UINT64_MAX when the slot is
 * empty. */
struct sk__merge {
  uint64_t key;
  int32_t rank;
  int32_t result; /* id of the merged text */
};

/* A slot of the text -> id table: the id (-1 = empty) and the high bits
 * of its text's hash, so that most probes never touch the text. */
struct sk__slot {
  int32_t id;
  uint32_t fp;
};

struct sk_tokenizer {
  enum sk__kind kind;
  uint32_t n_vocab;
  struct sk__token *tokens; /* (n_vocab) */
  char *pool;               /* token texts and pieces, owned */
  struct sk__slot *table;   /* (table_mask + 1) open-addressing text->id */
  size_t table_mask;
  int32_t byte_to_id[256];  /* SPM: byte fallback token of each byte */
  int32_t *specials;        /* (n_specials) control, user-defined and
                               unknown ids, longest text first */
  size_t n_specials;
  int32_t bos, eos, unk, eot, eom; /* -1: none */
  bool add_space_prefix;
  bool add_bos, add_eos;

  /* BPE */
  struct sk_pretok *pretok;
  bool ignore_merges;
  struct sk__merge *merges; /* (merge_mask + 1) */
  size_t merge_mask;
  int32_t byte_char_id[256];  /* token of the GPT-2 character of each byte */
  int32_t byte_fallback[256][2]; /* ids of the single bytes of that
                                    character's UTF-8 (-1: none) */
  char byte_char[256][2];      /* that character's UTF-8 */
  uint8_t byte_char_len[256];
};

/* --- text -> id table ----------------------------------------------------- */

static uint64_t sk__hash(const char *s, size_t n) {
  return XXH3_64bits(s, n);
}

static const char *sk__text(const struct sk_tokenizer *t, int32_t id) {
  return t->pool + t->tokens[id].text;
}

/* Id of the token whose text is s[0..n), or -1. */
static int32_t sk__lookup(const struct sk_tokenizer *t, const char *s, size_t n) {
  uint64_t h = sk__hash(s, n);
  uint32_t fp = (uint32_t)(h >> 32);
  size_t i = (size_t)h & t->table_mask;
  for (;;) {
    int32_t id = t->table[i].id;
    if (id < 0) return -1;
    if (t->table[i].fp == fp && t->tokens[id].len == n && memcmp(sk__text(t, id), s, n) == 0)
      return id;
    i = (i + 1) & t->table_mask;
  }
}

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

/* --- merge table ------------------------------------------------------------ */

/* MurmurHash3's 64-bit finalizer: every key bit reaches the low bits. */
static size_t sk__merge_slot(uint64_t key, size_t mask) {
  key ^= key >> 33;
  key *= UINT64_C(0xff51afd7ed558ccd);
  key ^= key >> 33;
  key *= UINT64_C(0xc4ceb9fe1a85ec53);
  key ^= key >> 33;
  return (size_t)key & mask;
}

/* The merge of tokens a and b, or NULL. */
static const struct sk__merge *sk__merge_find(const struct sk_tokenizer *t, int32_t a,
                                              int32_t b) {
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (size_t i = sk__merge_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
    const struct sk__merge *m = &t->merges[i];
    if (m->key == key) return m;
    if (m->key == UINT64_MAX) return NULL;
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

/* Length of the valid UTF-8 character (RFC 3629) at s[0..n), or 0. */
static size_t sk__utf8_char(const unsigned char *s, size_t n, uint32_t *cpt) {
  unsigned char c = s[0];
  if (c < 0x80) {
    *cpt = c;
    return 1;
  }
  size_t len;
  uint32_t v, min;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2, v = c & 0x1f, min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3, v = c & 0x0f, min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    v = v << 6 | (s[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cpt = v;
  return len;
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
      size_t n = sk__utf8_char((const unsigned char *)text + i, tok->len - i, &c);
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

static int sk__load(struct sk_tokenizer *t, const struct sk_gguf *g,
                    struct sk_error *err) {
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
  struct sk_pretok_info info = {0};
  if (t->kind == SK__BPE) {
    struct sk_gguf_str pre;
    r = sk_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err);
    if (r < 0) return r;
    if (r == 0) pre = (struct sk_gguf_str){"default", 7};
    r = sk_pretok_new(pre.ptr, (size_t)pre.len, &t->pretok, &info, err);
    if (r < 0) return r;
    t->ignore_merges = info.ignore_merges;
  }

  const struct sk_gguf_str *texts;
  uint64_t n;
  r = sk_gguf_get_str_array(g, "tokenizer.ggml.tokens", &texts, &n, err);
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
    tok->piece = off;
    off += tok->len; /* room for the piece, made once the attributes are final */
    sk__insert(t, (int32_t)i);
  }

  bool spm = t->kind == SK__SPM;
  r = sk__special_id(g, "tokenizer.ggml.bos_token_id", info.no_bos ? -1 : spm ? 1 : 11,
                     t->n_vocab, &t->bos, err);
  if (r < 0) goto out;
  r = sk__special_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : 11, t->n_vocab, &t->eos, err);
  if (r < 0) goto out;
  r = sk__special_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, t->n_vocab, &t->unk,
                     err);
  if (r < 0) goto out;
  r = sk__special_id(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab, &t->eot, err);
  if (r < 0) goto out;
  r = sk__special_id(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab, &t->eom, err);
  if (r < 0) goto out;
  /* SentencePiece puts a space in front and adds BOS; byte-level BPE does
   * neither unless its pre-tokenizer says so. The keys override. */
  t->add_space_prefix = spm;
  t->add_bos = spm || info.add_bos;
  t->add_eos = false;
  r = sk_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
  if (r < 0) goto out;
  r = sk_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err);
  if (r < 0) goto out;
  r = sk_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err);
  if (r < 0) goto out;

  r = sk__mark_specials(t, g, err);
  if (r < 0) goto out;
  for (uint32_t i = 0; i < t->n_vocab; i++) {
    struct sk__token *tok = &t->tokens[i];
    tok->piece_len = sk__make_piece(t->kind, tok, t->pool + tok->text, t->pool + tok->piece);
  }

  if (t->kind == SK__BPE) {
    r = sk__load_merges(t, g, err);
    if (r < 0) goto out;
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
  r = 0;
out:
  free(scores);
  free(types);
  return r;
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

/* --- encode ------------------------------------------------------------------ */

struct sk__ids {
  int32_t *v;
  size_t n, cap;
};

static int sk__ids_push(struct sk__ids *ids, int32_t id) {
  if (ids->n == ids->cap) {
    size_t cap = ids->cap ? ids->cap * 2 : 64;
    if (cap > SIZE_MAX / sizeof *ids->v) return -SK_ERR_NO_MEMORY;
    int32_t *v = realloc(ids->v, cap * sizeof *v);
    if (!v) return -SK_ERR_NO_MEMORY;
    ids->v = v;
    ids->cap = cap;
  }
  ids->v[ids->n++] = id;
  return 0;
}

/* A UTF-8 character (or a merge of them) in the doubly linked list of
 * live symbols; n == 0 once merged into its left neighbour. */
struct sk__symbol {
  size_t off; /* into the escaped text */
  size_t n;
  ptrdiff_t prev, next; /* -1: none */
};

/* A candidate merge of two adjacent symbols into one vocabulary token. */
struct sk__bigram {
  float score;
  ptrdiff_t left, right;
  size_t size; /* bytes of the merge when queued, to spot stale entries */
};

struct sk__spm {
  const struct sk_tokenizer *t;
  const char *text;            /* (len) escaped text */
  struct sk__symbol *sym;      /* (n_sym) */
  struct sk__bigram *heap;     /* (n_heap) binary max-heap */
  size_t n_heap, cap_heap;
};

/* llm_bigram_spm::comparator: higher score first; on equal scores the
 * leftmost pair first. */
static bool sk__bigram_before(const struct sk__bigram *a, const struct sk__bigram *b) {
  return a->score > b->score || (a->score == b->score && a->left < b->left);
}

/* A binary heap of entries of type T in the growable array heap[n_heap]
 * (cap_heap allocated) of a struct S, the entry BEFORE(a, b) puts first
 * on top: PUSH adds one (0 or -SK_ERR_NO_MEMORY), POP takes the top
 * (n_heap > 0). Both merge loops below queue their candidate pairs so. */
#define SK__HEAP_DEFINE(PUSH, POP, S, T, BEFORE)                              \
  static int PUSH(struct S *s, T x) {                                         \
    if (s->n_heap == s->cap_heap) {                                           \
      size_t cap = s->cap_heap ? s->cap_heap * 2 : 64;                        \
      if (cap > SIZE_MAX / sizeof *s->heap) return -SK_ERR_NO_MEMORY;         \
      T *h = realloc(s->heap, cap * sizeof *h);                               \
      if (!h) return -SK_ERR_NO_MEMORY;                                       \
      s->heap = h;                                                            \
      s->cap_heap = cap;                                                      \
    }                                                                         \
    size_t i = s->n_heap++;                                                   \
    while (i > 0) {                                                           \
      size_t parent = (i - 1) / 2;                                            \
      if (!BEFORE(&x, &s->heap[parent])) break;                               \
      s->heap[i] = s->heap[parent];                                           \
      i = parent;                                                             \
    }                                                                         \
    s->heap[i] = x;                                                           \
    return 0;                                                                 \
  }                                                                           \
  static T POP(struct S *s) {                                                 \
    T top = s->heap[0];                                                       \
    T last = s->heap[--s->n_heap];                                            \
    size_t i = 0, n = s->n_heap;                                              \
    for (;;) {                                                                \
      size_t c = 2 * i + 1;                                                   \
      if (c >= n) break;                                                      \
      if (c + 1 < n && BEFORE(&s->heap[c + 1], &s->heap[c])) c++;             \
      if (!BEFORE(&s->heap[c], &last)) break;                                 \
      s->heap[i] = s->heap[c];                                                \
      i = c;                                                                  \
    }                                                                         \
    if (n) s->heap[i] = last;                                                 \
    return top;                                                               \
  }

SK__HEAP_DEFINE(sk__heap_push, sk__heap_pop, sk__spm, struct sk__bigram, sk__bigram_before)

/* try_add_bigram: queue the merge of left and right if their
 * concatenation (contiguous in the text) is a token. llama.cpp also
 * records rev_merge here for resegment; see sk__spm_tokenize. */
static int sk__try_add_bigram(struct sk__spm *s, ptrdiff_t left, ptrdiff_t right) {
  if (left < 0 || right < 0) return 0;
  size_t size = s->sym[left].n + s->sym[right].n;
  int32_t id = sk__lookup(s->t, s->text + s->sym[left].off, size);
  if (id < 0) return 0;
  struct sk__bigram bg = {s->t->tokens[id].score, left, right, size};
  return sk__heap_push(s, bg);
}

/* llm_tokenizer_spm_session::tokenize on text[0..len) (already escaped).
 * sym has room for len symbols. */
static int sk__spm_tokenize(struct sk__spm *s, size_t len, struct sk__ids *out) {
  /* unicode_len_utf8: length from the lead byte's high nibble, clamped
   * to what is left (invalid UTF-8 still makes progress). */
  static const uint8_t utf8_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  size_t n_sym = 0;
  for (size_t off = 0; off < len;) {
    size_t n = utf8_len[(unsigned char)s->text[off] >> 4];
    if (n > len - off) n = len - off;
    struct sk__symbol *sym = &s->sym[n_sym];
    sym->off = off;
    sym->n = n;
    sym->prev = (ptrdiff_t)n_sym - 1;
    off += n;
    sym->next = off == len ? -1 : (ptrdiff_t)n_sym + 1;
    n_sym++;
  }
  int r;
  s->n_heap = 0;
  for (size_t i = 1; i < n_sym; i++) {
    r = sk__try_add_bigram(s, (ptrdiff_t)i - 1, (ptrdiff_t)i);
    if (r < 0) return r;
  }
  while (s->n_heap > 0) {
    struct sk__bigram bg = sk__heap_pop(s);
    struct sk__symbol *l = &s->sym[bg.left], *rs = &s->sym[bg.right];
    /* Skip entries made stale by an earlier merge: sizes only grow, so
     * a changed sum means one side has changed. */
    if (l->n == 0 || rs->n == 0 || l->n + rs->n != bg.size) continue;
    l->n += rs->n;
    rs->n = 0;
    l->next = rs->next;
    if (rs->next >= 0) s->sym[rs->next].prev = bg.left;
    r = sk__try_add_bigram(s, l->prev, bg.left);
    if (r < 0) return r;
    r = sk__try_add_bigram(s, bg.left, l->next);
    if (r < 0) return r;
  }
  /* resegment: llama.cpp recurses through rev_merge for a symbol that is
   * not a token, but a merged symbol always is one (a merge is only
   * queued when the concatenation is in the vocabulary), so only single
   * characters can miss, and those fall back to byte tokens. */
  for (ptrdiff_t i = n_sym ? 0 : -1; i >= 0; i = s->sym[i].next) {
    const struct sk__symbol *sym = &s->sym[i];
    int32_t id = sk__lookup(s->t, s->text + sym->off, sym->n);
    if (id >= 0) {
      r = sk__ids_push(out, id);
      if (r < 0) return r;
      continue;
    }
    for (size_t j = 0; j < sym->n; j++) {
      r = sk__ids_push(out, s->t->byte_to_id[(unsigned char)s->text[sym->off + j]]);
      if (r < 0) return r;
    }
  }
  return 0;
}

/* Byte-level BPE of one word (llm_tokenizer_bpe_session::tokenize): the
 * word's bytes, each as its GPT-2 character's token, merged pairwise by
 * lowest merge rank (ties: leftmost first) until no pair has a merge. */

struct sk__bsym {
  int32_t id;     /* token of the symbol's text, -1 if none */
  uint32_t off;   /* first byte of the word */
  uint32_t n;     /* bytes of the word; 0 once merged into its left */
  int32_t prev, next;
};

struct sk__bpair {
  int32_t rank;
  int32_t left, right;
  uint32_t size; /* bytes of the merge when queued, to spot stale entries */
};

struct sk__bpe {
  struct sk__bsym *sym;
  size_t cap_sym;
  struct sk__bpair *heap;
  size_t n_heap, cap_heap;
  char *enc;            /* the word in GPT-2 characters (ignore_merges) */
  size_t cap_enc;
};

static bool sk__bpair_before(const struct sk__bpair *a, const struct sk__bpair *b) {
  return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

SK__HEAP_DEFINE(sk__bheap_push, sk__bheap_pop, sk__bpe, struct sk__bpair, sk__bpair_before)

static int sk__bpe_try_pair(const struct sk_tokenizer *t, struct sk__bpe *s, int32_t left,
                            int32_t right) {
  if (left < 0 || right < 0) return 0;
  const struct sk__bsym *l = &s->sym[left], *r = &s->sym[right];
  if (l->id < 0 || r->id < 0) return 0;
  const struct sk__merge *m = sk__merge_find(t, l->id, r->id);
  if (!m) return 0;
  return sk__bheap_push(s, (struct sk__bpair){m->rank, left, right, l->n + r->n});
}

/* Tokens of word[0..n) (raw bytes, n >= 1) appended to out. */
static int sk__bpe_word(const struct sk_tokenizer *t, struct sk__bpe *s, const char *word,
                        size_t n, struct sk__ids *out) {
  const unsigned char *w = (const unsigned char *)word;
  int r;
  if (t->ignore_merges) {
    if (2 * n > s->cap_enc) {
      char *e = realloc(s->enc, 2 * n);
      if (!e) return -SK_ERR_NO_MEMORY;
      s->enc = e;
      s->cap_enc = 2 * n;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
      memcpy(s->enc + o, t->byte_char[w[i]], t->byte_char_len[w[i]]);
      o += t->byte_char_len[w[i]];
    }
    int32_t id = sk__lookup(t, s->enc, o);
    if (id >= 0) return sk__ids_push(out, id);
  }
  if (n == 1) { /* the common single-character word: no merge possible */
    int32_t id = t->byte_char_id[w[0]];
    if (id >= 0) return sk__ids_push(out, id);
  }
  if (n > UINT32_MAX / 2) return -SK_ERR_NO_MEMORY;
  if (n > s->cap_sym) {
    struct sk__bsym *y = realloc(s->sym, n * sizeof *y);
    if (!y) return -SK_ERR_NO_MEMORY;
    s->sym = y;
    s->cap_sym = n;
  }
  for (size_t i = 0; i < n; i++)
    s->sym[i] = (struct sk__bsym){t->byte_char_id[w[i]], (uint32_t)i, 1, (int32_t)i - 1,
                                  i + 1 == n ? -1 : (int32_t)i + 1};
  s->n_heap = 0;
  for (size_t i = 1; i < n; i++)
    if ((r = sk__bpe_try_pair(t, s, (int32_t)i - 1, (int32_t)i)) < 0) return r;
  while (s->n_heap > 0) {
    struct sk__bpair p = sk__bheap_pop(s);
    struct sk__bsym *l = &s->sym[p.left], *rs = &s->sym[p.right];
    if (l->n == 0 || rs->n == 0 || l->n + rs->n != p.size) continue;
    l->id = sk__merge_find(t, l->id, rs->id)->result;
    l->n += rs->n;
    rs->n = 0;
    l->next = rs->next;
    if (rs->next >= 0) s->sym[rs->next].prev = p.left;
    if ((r = sk__bpe_try_pair(t, s, l->prev, p.left)) < 0) return r;
    if ((r = sk__bpe_try_pair(t, s, p.left, l->next)) < 0) return r;
  }
  for (int32_t i = 0; i >= 0; i = s->sym[i].next) {
    const struct sk__bsym *y = &s->sym[i];
    if (y->id >= 0) {
      if ((r = sk__ids_push(out, y->id)) < 0) return r;
      continue;
    }
    /* Not a token: the tokens of its characters' single bytes, where
     * there are any (llama.cpp's fallback). */
    for (uint32_t j = 0; j < y->n; j++)
      for (unsigned k = 0; k < 2; k++) {
        int32_t id = t->byte_fallback[w[y->off + j]][k];
        if (id >= 0 && (r = sk__ids_push(out, id)) < 0) return r;
      }
  }
  return 0;
}

/* text[0..len) with every byte that does not start a valid UTF-8
 * character replaced by U+FFFD, as llama.cpp's unicode_cpts_from_utf8
 * does before the pre-tokenizer runs. *ret is text itself when it is
 * valid, else a malloc'd copy (*ret_owned set). */
static int sk__utf8_clean(const char *text, size_t len, const char **ret, size_t *ret_len,
                          char **ret_owned) {
  const unsigned char *s = (const unsigned char *)text;
  size_t bad = 0;
  uint32_t c;
  for (size_t i = 0; i < len;) {
    size_t k = sk__utf8_char(s + i, len - i, &c);
    if (k == 0) {
      bad++;
      k = 1;
    }
    i += k;
  }
  *ret_owned = NULL;
  if (bad == 0) {
    *ret = text;
    *ret_len = len;
    return 0;
  }
  if (bad > (SIZE_MAX - len) / 2) return -SK_ERR_NO_MEMORY;
  char *o = malloc(len + 2 * bad);
  if (!o) return -SK_ERR_NO_MEMORY;
  size_t n = 0;
  for (size_t i = 0; i < len;) {
    size_t k = sk__utf8_char(s + i, len - i, &c);
    if (k == 0) {
      memcpy(o + n, "\xef\xbf\xbd", 3);
      n += 3;
      i++;
    } else {
      memcpy(o + n, text + i, k);
      n += k;
      i += k;
    }
  }
  *ret = o;
  *ret_len = n;
  *ret_owned = o;
  return 0;
}

/* A raw fragment through the pre-tokenizer and BPE. */
static int sk__bpe_fragment(const struct sk_tokenizer *t, struct sk__bpe *s, const char *text,
                            size_t len, struct sk__ids *out, struct sk_error *err) {
  const char *clean;
  size_t clen;
  char *owned;
  int r = sk__utf8_clean(text, len, &clean, &clen, &owned);
  if (r < 0) return sk_error_set(err, -r, "tokenize: out of memory for %zu bytes", len);
  size_t *ends = NULL, n_ends = 0;
  r = sk_pretok_split(t->pretok, clean, clen, &ends, &n_ends, err);
  size_t start = 0;
  for (size_t i = 0; r == 0 && i < n_ends; i++) {
    r = sk__bpe_word(t, s, clean + start, ends[i] - start, out);
    if (r < 0) sk_error_set(err, -r, "tokenize: out of memory for %zu bytes", len);
    start = ends[i];
  }
  free(ends);
  free(owned);
  return r;
}

/* --- special tokens ------------------------------------------------------------ */

/* A piece of the input: raw text, or a special token found in it. */
struct sk__frag {
  size_t off, len;
  int32_t token; /* -1 for raw text */
};

struct sk__frags {
  struct sk__frag *v;
  size_t n, cap;
};

static int sk__frags_push(struct sk__frags *f, struct sk__frag x) {
  if (f->n == f->cap) {
    size_t cap = f->cap ? f->cap * 2 : 8;
    if (cap > SIZE_MAX / sizeof *f->v) return -SK_ERR_NO_MEMORY;
    struct sk__frag *v = realloc(f->v, cap * sizeof *v);
    if (!v) return -SK_ERR_NO_MEMORY;
    f->v = v;
    f->cap = cap;
  }
  f->v[f->n++] = x;
  return 0;
}

static bool sk__isspace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* tokenizer_st_partition: for each special token, longest first, split
 * every raw fragment at each occurrence (leftmost first). User-defined
 * tokens always; control and unknown ones only with parse_special. A
 * token with RSTRIP eats the whitespace after it. */
static int sk__partition(const struct sk_tokenizer *t, const char *text, size_t len,
                         bool parse_special, struct sk__frags *frags) {
  int r = sk__frags_push(frags, (struct sk__frag){0, len, -1});
  if (r < 0) return r;
  for (size_t u = 0; u < t->n_specials; u++) {
    int32_t id = t->specials[u];
    uint16_t attr = t->tokens[id].attr;
    if (!parse_special && (attr & (SK__ATTR_CONTROL | SK__ATTR_UNKNOWN))) continue;
    const char *needle = sk__text(t, id);
    size_t nlen = t->tokens[id].len;
    bool found = false;
    for (size_t i = 0; i < frags->n && !found; i++)
      found = frags->v[i].token < 0 && frags->v[i].len >= nlen &&
              memmem(text + frags->v[i].off, frags->v[i].len, needle, nlen);
    if (!found) continue;
    struct sk__frags next = {0};
    for (size_t i = 0; i < frags->n; i++) {
      struct sk__frag f = frags->v[i];
      if (f.token >= 0) {
        r = sk__frags_push(&next, f);
        if (r < 0) goto fail;
        continue;
      }
      size_t pos = f.off, end = f.off + f.len;
      for (;;) {
        const char *m = end - pos >= nlen ? memmem(text + pos, end - pos, needle, nlen)
                                          : NULL;
        if (!m) break;
        size_t at = (size_t)(m - text);
        if (at > pos) {
          r = sk__frags_push(&next, (struct sk__frag){pos, at - pos, -1});
          if (r < 0) goto fail;
        }
        r = sk__frags_push(&next, (struct sk__frag){at, nlen, id});
        if (r < 0) goto fail;
        pos = at + nlen;
        if (attr & SK__ATTR_RSTRIP)
          while (pos < end && sk__isspace(text[pos])) pos++;
      }
      if (pos < end) {
        r = sk__frags_push(&next, (struct sk__frag){pos, end - pos, -1});
        if (r < 0) goto fail;
      }
    }
    free(frags->v);
    *frags = next;
    continue;
  fail:
    free(next.v);
    return r;
  }
  return 0;
}

int sk_tokenizer_encode(const struct sk_tokenizer *t, const char *text,
                        size_t len, unsigned flags, int32_t **ret_tokens,
                        size_t *ret_n, struct sk_error *err) {
  struct sk__ids out = {0};
  struct sk__frags frags = {0};
  struct sk__spm s = {t, NULL, NULL, NULL, 0, 0};
  struct sk__bpe b = {0};
  char *buf = NULL;
  int r = 0;

  if ((flags & SK_TOKENIZE_BOS) && t->bos >= 0) {
    r = sk__ids_push(&out, t->bos);
    if (r < 0) goto fail;
  }
  /* Empty text gives no fragment, hence no space prefix either (the
   * SentencePiece behaviour: "" -> [] or [BOS]). */
  if (len > 0) {
    r = sk__partition(t, text, len, flags & SK_TOKENIZE_SPECIAL, &frags);
    if (r < 0) goto fail;
  }
  if (t->kind == SK__BPE) {
    for (size_t i = 0; i < frags.n; i++) {
      const struct sk__frag *f = &frags.v[i];
      if (f->token >= 0) {
        r = sk__ids_push(&out, f->token);
        if (r < 0) goto fail;
        continue;
      }
      r = sk__bpe_fragment(t, &b, text + f->off, f->len, &out, err);
      if (r < 0) goto fail_set;
    }
    goto done;
  }
  /* Worst case per raw fragment: every byte a space (3 bytes each) plus
   * the prefix; one buffer and one symbol array serve all fragments. */
  size_t max_frag = 0;
  for (size_t i = 0; i < frags.n; i++)
    if (frags.v[i].token < 0 && frags.v[i].len > max_frag) max_frag = frags.v[i].len;
  if (frags.n > 0) {
    if (max_frag > (SIZE_MAX / sizeof *s.sym - 1) / 3) {
      r = -SK_ERR_NO_MEMORY;
      goto fail;
    }
    buf = malloc(3 * max_frag + 3);
    s.sym = malloc((3 * max_frag + 3) * sizeof *s.sym);
    if (!buf || !s.sym) {
      r = -SK_ERR_NO_MEMORY;
      goto fail;
    }
  }
  s.text = buf;
  bool prev_special = true; /* the first fragment gets the space prefix */
  for (size_t i = 0; i < frags.n; i++) {
    const struct sk__frag *f = &frags.v[i];
    if (f->token >= 0) {
      r = sk__ids_push(&out, f->token);
      if (r < 0) goto fail;
      prev_special = true;
      continue;
    }
    /* llama_escape_whitespace, with the prefix " " escaped too. */
    size_t n = 0;
    if (t->add_space_prefix && prev_special) {
      memcpy(buf, sk__space, 3);
      n = 3;
    }
    for (size_t j = 0; j < f->len; j++) {
      char c = text[f->off + j];
      if (c == ' ') {
        memcpy(buf + n, sk__space, 3);
        n += 3;
      } else {
        buf[n++] = c;
      }
    }
    r = sk__spm_tokenize(&s, n, &out);
    if (r < 0) goto fail;
    prev_special = false;
  }
done:
  if ((flags & SK_TOKENIZE_EOS) && t->eos >= 0) {
    r = sk__ids_push(&out, t->eos);
    if (r < 0) goto fail;
  }
  free(frags.v);
  free(s.sym);
  free(s.heap);
  free(b.sym);
  free(b.heap);
  free(b.enc);
  free(buf);
  if (!out.v) {
    out.v = malloc(sizeof *out.v); /* a valid pointer even for 0 tokens */
    if (!out.v) return sk_error_set(err, SK_ERR_NO_MEMORY, "tokenize: out of memory");
  }
  *ret_tokens = out.v;
  *ret_n = out.n;
  return 0;
fail:
  sk_error_set(err, -r, "tokenize: out of memory for %zu bytes of text", len);
fail_set:
  free(frags.v);
  free(s.sym);
  free(s.heap);
  free(b.sym);
  free(b.heap);
  free(b.enc);
  free(buf);
  free(out.v);
  return r;
}

/* --- decode ------------------------------------------------------------------ */

static int sk__check_id(const struct sk_tokenizer *t, int32_t token, size_t index,
                        struct sk_error *err) {
  if (token < 0 || (uint32_t)token >= t->n_vocab)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "token %" PRId32 " at index %zu is outside the vocabulary"
                        " (0..%" PRIu32 ")", token, index, t->n_vocab - 1);
  return 0;
}

int sk_tokenizer_piece(const struct sk_tokenizer *t, int32_t token,
                       const char **ret, size_t *ret_len, struct sk_error *err) {
  int r = sk__check_id(t, token, 0, err);
  if (r < 0) return r;
  *ret = t->pool + t->tokens[token].piece;
  *ret_len = t->tokens[token].piece_len;
  return 0;
}

int sk_tokenizer_decode(const struct sk_tokenizer *t, const int32_t *tokens,
                        size_t n, char **ret, size_t *ret_len,
                        struct sk_error *err) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    int r = sk__check_id(t, tokens[i], i, err);
    if (r < 0) return r;
    size_t pl = t->tokens[tokens[i]].piece_len;
    if (pl > SIZE_MAX - 1 - total)
      return sk_error_set(err, SK_ERR_NO_MEMORY, "detokenize: output too large");
    total += pl;
  }
  char *out = malloc(total + 1);
  if (!out)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "detokenize: cannot allocate %zu bytes",
                        total + 1);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    const struct sk__token *tok = &t->tokens[tokens[i]];
    const char *p = t->pool + tok->piece;
    size_t pl = tok->piece_len;
    /* llama_detokenize strips one leading space from the first token's
     * piece only (lstrip = add_space_prefix, reset after token 0). A BOS
     * first has an empty piece, so the space of the next token stays. */
    if (i == 0 && t->add_space_prefix && pl > 0 && p[0] == ' ') {
      p++;
      pl--;
    }
    memcpy(out + o, p, pl);
    o += pl;
  }
  out[o] = '\0';
  *ret = out;
  *ret_len = o;
  return 0;
}
