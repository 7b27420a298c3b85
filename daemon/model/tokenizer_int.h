/* What the two files of the tokenizer share: vocab.c loads the
 * vocabulary (tokens, types, special tokens, BPE merges), tokenizer.c
 * encodes and decodes text with it. Not for other modules: they use
 * tokenizer.h. The lookups are inline: encoding calls them per symbol. */
#ifndef SK_TOKENIZER_INT_H
#define SK_TOKENIZER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <xxhash.h>

#include "model/pretok.h"
#include "model/tokenizer.h"
#include "proto/utf8.h"

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
  int32_t type;   /* the file's token type (SK__TOK_*; NORMAL without one) */
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
  int32_t pad;                     /* tokenizer.ggml.padding_token_id, -1: none */
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

static inline uint64_t sk__hash(const char *s, size_t n) {
  return XXH3_64bits(s, n);
}

static inline const char *sk__text(const struct sk_tokenizer *t, int32_t id) {
  return t->pool + t->tokens[id].text;
}

/* Id of the token whose text is s[0..n), or -1. */
static inline int32_t sk__lookup(const struct sk_tokenizer *t, const char *s, size_t n) {
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

/* --- merge table ------------------------------------------------------------ */

/* MurmurHash3's 64-bit finalizer: every key bit reaches the low bits. */
static inline size_t sk__merge_slot(uint64_t key, size_t mask) {
  key ^= key >> 33;
  key *= UINT64_C(0xff51afd7ed558ccd);
  key ^= key >> 33;
  key *= UINT64_C(0xc4ceb9fe1a85ec53);
  key ^= key >> 33;
  return (size_t)key & mask;
}

/* The merge of tokens a and b, or NULL. */
static inline const struct sk__merge *sk__merge_find(const struct sk_tokenizer *t, int32_t a,
                                                     int32_t b) {
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (size_t i = sk__merge_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
    const struct sk__merge *m = &t->merges[i];
    if (m->key == key) return m;
    if (m->key == UINT64_MAX) return NULL;
  }
}

#endif
