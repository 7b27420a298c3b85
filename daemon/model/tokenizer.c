/* SentencePiece-style tokenizer, a port of llama.cpp's llm_tokenizer_spm
 * (src/llama-vocab.cpp) and of the parts of llama_vocab it relies on:
 * vocabulary load, byte_to_token, token_to_piece, detokenize, and the
 * splitting of user-defined tokens out of the text (tokenizer_st_partition
 * with parse_special off).
 */
#include "tokenizer.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Ids are int32_t on the wire and in the API. */
#define SK__MAX_VOCAB ((uint64_t)INT32_MAX)

/* "▁" (U+2581): SentencePiece's visible space. */
static const char sk__space[3] = {'\xe2', '\x96', '\x81'};

struct sk__token {
  size_t text;    /* offset of the vocabulary text in pool */
  size_t len;
  size_t piece;   /* offset of the piece (token_to_piece) in pool */
  size_t piece_len;
  float score;
  uint8_t type;
};

struct sk_tokenizer {
  uint32_t n_vocab;
  struct sk__token *tokens; /* (n_vocab) */
  char *pool;               /* token texts and pieces, owned */
  int32_t *table;           /* (table_mask + 1) open-addressing text->id,
                               -1 = empty */
  size_t table_mask;
  int32_t byte_to_id[256];  /* byte fallback token of each byte */
  int32_t *user_defined;    /* (n_user_defined) ids, longest text first */
  size_t n_user_defined;
  int32_t bos, eos, unk;
  bool add_space_prefix;
};

/* --- text -> id table ----------------------------------------------------- */

static uint64_t sk__hash(const char *s, size_t n) {
  uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a */
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

static const char *sk__text(const struct sk_tokenizer *t, int32_t id) {
  return t->pool + t->tokens[id].text;
}

/* Id of the token whose text is s[0..n), or -1. */
static int32_t sk__lookup(const struct sk_tokenizer *t, const char *s, size_t n) {
  size_t i = (size_t)sk__hash(s, n) & t->table_mask;
  for (;;) {
    int32_t id = t->table[i];
    if (id < 0) return -1;
    if (t->tokens[id].len == n && memcmp(sk__text(t, id), s, n) == 0) return id;
    i = (i + 1) & t->table_mask;
  }
}

/* A later token with the same text replaces the earlier one, as
 * llama.cpp's token_to_id[word] = i does. */
static void sk__insert(struct sk_tokenizer *t, int32_t id) {
  const char *s = sk__text(t, id);
  size_t n = t->tokens[id].len;
  size_t i = (size_t)sk__hash(s, n) & t->table_mask;
  for (;;) {
    int32_t old = t->table[i];
    if (old < 0 || (t->tokens[old].len == n && memcmp(sk__text(t, old), s, n) == 0)) {
      t->table[i] = id;
      return;
    }
    i = (i + 1) & t->table_mask;
  }
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

/* Length of the piece of a token (llama_token_to_piece, special=false):
 * "▁" becomes " " in normal tokens, so a piece is never longer than its
 * text. */
static size_t sk__make_piece(const struct sk__token *tok, const char *text, char *out) {
  switch (tok->type) {
  case SK__TOK_NORMAL: {
    size_t o = 0;
    for (size_t i = 0; i < tok->len;) {
      if (tok->len - i >= 3 && memcmp(text + i, sk__space, 3) == 0) {
        out[o++] = ' ';
        i += 3;
      } else {
        out[o++] = text[i++];
      }
    }
    return o;
  }
  case SK__TOK_USER_DEFINED:
    memcpy(out, text, tok->len);
    return tok->len;
  case SK__TOK_BYTE:
    out[0] = sk__token_byte(text, tok->len);
    return 1;
  default: /* control, unknown, unused, undefined: nothing */
    return 0;
  }
}

static int sk__special_id(const struct sk_gguf *g, const char *key, int32_t def,
                          uint32_t n_vocab, int32_t *ret, struct sk_error *err) {
  uint32_t v;
  int r = sk_gguf_get_u32(g, key, &v, err);
  if (r < 0) return r;
  if (r == 0) v = (uint32_t)def;
  if (v >= n_vocab)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "%s: id %" PRIu32
                        " outside the vocabulary of %" PRIu32 " tokens",
                        key, v, n_vocab);
  *ret = (int32_t)v;
  return 0;
}

/* qsort has no context argument; thread-local so concurrent loads are safe. */
static _Thread_local const struct sk_tokenizer *sk__sort_t;

static int sk__cmp_user_defined(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  size_t lx = sk__sort_t->tokens[x].len, ly = sk__sort_t->tokens[y].len;
  if (lx != ly) return lx > ly ? -1 : 1;
  return (x > y) - (x < y);
}

static int sk__load(struct sk_tokenizer *t, const struct sk_gguf *g,
                    struct sk_error *err) {
  struct sk_gguf_str model;
  int r = sk_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
  if (r < 0) return r;
  if (r == 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL, "tokenizer.ggml.model: missing");
  if (model.len != 5 || memcmp(model.ptr, "llama", 5) != 0)
    return sk_error_set(err, SK_ERR_BAD_MODEL,
                        "tokenizer.ggml.model: '%.*s' is not supported (only 'llama')",
                        (int)(model.len < 32 ? model.len : 32), model.ptr);

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
  for (size_t i = 0; i < cap; i++) t->table[i] = -1;

  size_t off = 0, n_user_defined = 0;
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
    int32_t ty = types ? types[i] : SK__TOK_NORMAL;
    tok->type = ty >= SK__TOK_NORMAL && ty <= SK__TOK_BYTE ? (uint8_t)ty
                                                            : SK__TOK_UNDEFINED;
    tok->piece = off;
    tok->piece_len = sk__make_piece(tok, t->pool + tok->text, t->pool + off);
    off += tok->piece_len;
    if (tok->type == SK__TOK_USER_DEFINED) n_user_defined++;
    sk__insert(t, (int32_t)i);
  }

  /* User-defined tokens are split out of the text before SentencePiece
   * runs, longest first (llama.cpp cache_special_tokens; control and
   * unknown tokens are not, since parse_special is off). */
  if (n_user_defined) {
    t->user_defined = malloc(n_user_defined * sizeof *t->user_defined);
    if (!t->user_defined) {
      r = sk_error_set(err, SK_ERR_NO_MEMORY, "tokenizer: cannot allocate");
      goto out;
    }
    for (uint64_t i = 0; i < n; i++)
      if (t->tokens[i].type == SK__TOK_USER_DEFINED)
        t->user_defined[t->n_user_defined++] = (int32_t)i;
    sk__sort_t = t;
    qsort(t->user_defined, t->n_user_defined, sizeof *t->user_defined,
          sk__cmp_user_defined);
  }

  r = sk__special_id(g, "tokenizer.ggml.bos_token_id", 1, t->n_vocab, &t->bos, err);
  if (r < 0) goto out;
  r = sk__special_id(g, "tokenizer.ggml.eos_token_id", 2, t->n_vocab, &t->eos, err);
  if (r < 0) goto out;
  r = sk__special_id(g, "tokenizer.ggml.unknown_token_id", 0, t->n_vocab, &t->unk, err);
  if (r < 0) goto out;
  t->add_space_prefix = true; /* SentencePiece default */
  r = sk_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err);
  if (r < 0) goto out;

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
  free(t->user_defined);
  free(t);
}

uint32_t sk_tokenizer_n_vocab(const struct sk_tokenizer *t) { return t->n_vocab; }
int32_t sk_tokenizer_bos(const struct sk_tokenizer *t) { return t->bos; }
int32_t sk_tokenizer_eos(const struct sk_tokenizer *t) { return t->eos; }

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

static int sk__heap_push(struct sk__spm *s, struct sk__bigram bg) {
  if (s->n_heap == s->cap_heap) {
    size_t cap = s->cap_heap ? s->cap_heap * 2 : 64;
    if (cap > SIZE_MAX / sizeof *s->heap) return -SK_ERR_NO_MEMORY;
    struct sk__bigram *h = realloc(s->heap, cap * sizeof *h);
    if (!h) return -SK_ERR_NO_MEMORY;
    s->heap = h;
    s->cap_heap = cap;
  }
  size_t i = s->n_heap++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!sk__bigram_before(&bg, &s->heap[parent])) break;
    s->heap[i] = s->heap[parent];
    i = parent;
  }
  s->heap[i] = bg;
  return 0;
}

static struct sk__bigram sk__heap_pop(struct sk__spm *s) {
  struct sk__bigram top = s->heap[0];
  struct sk__bigram last = s->heap[--s->n_heap];
  size_t i = 0, n = s->n_heap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && sk__bigram_before(&s->heap[c + 1], &s->heap[c])) c++;
    if (!sk__bigram_before(&s->heap[c], &last)) break;
    s->heap[i] = s->heap[c];
    i = c;
  }
  if (n) s->heap[i] = last;
  return top;
}

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

/* A piece of the input: raw text, or a user-defined token found in it. */
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

/* tokenizer_st_partition with parse_special off: for each user-defined
 * token, longest first, split every raw fragment at each occurrence
 * (leftmost first). Without user-defined tokens the text stays whole. */
static int sk__partition(const struct sk_tokenizer *t, const char *text, size_t len,
                         struct sk__frags *frags) {
  int r = sk__frags_push(frags, (struct sk__frag){0, len, -1});
  if (r < 0) return r;
  for (size_t u = 0; u < t->n_user_defined; u++) {
    int32_t id = t->user_defined[u];
    const char *needle = sk__text(t, id);
    size_t nlen = t->tokens[id].len;
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
                        size_t len, bool add_bos, int32_t **ret_tokens,
                        size_t *ret_n, struct sk_error *err) {
  struct sk__ids out = {0};
  struct sk__frags frags = {0};
  struct sk__spm s = {t, NULL, NULL, NULL, 0, 0};
  char *buf = NULL;
  int r = 0;

  if (add_bos) {
    r = sk__ids_push(&out, t->bos);
    if (r < 0) goto fail;
  }
  /* Empty text gives no fragment, hence no space prefix either (the
   * SentencePiece behaviour: "" -> [] or [BOS]). */
  if (len > 0) {
    r = sk__partition(t, text, len, &frags);
    if (r < 0) goto fail;
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
  free(frags.v);
  free(s.sym);
  free(s.heap);
  free(buf);
  if (!out.v) {
    out.v = malloc(sizeof *out.v); /* a valid pointer even for 0 tokens */
    if (!out.v) return sk_error_set(err, SK_ERR_NO_MEMORY, "tokenize: out of memory");
  }
  *ret_tokens = out.v;
  *ret_n = out.n;
  return 0;
fail:
  free(frags.v);
  free(s.sym);
  free(s.heap);
  free(buf);
  free(out.v);
  return sk_error_set(err, r, "tokenize: out of memory for %zu bytes of text", len);
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
