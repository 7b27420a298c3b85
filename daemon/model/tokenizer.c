/* Tokenizers of GGUF vocabularies, after llama.cpp's src/llama-vocab.cpp
 * (llama_vocab::impl::tokenize, token_to_piece, detokenize): SentencePiece
 * (llm_tokenizer_spm) for tokenizer.ggml.model = "llama" and byte-level
 * BPE (llm_tokenizer_bpe) for "gpt2"; special tokens split out of the
 * text first (tokenizer_st_partition). The vocabulary is loaded by
 * vocab.c.
 */
#include "model/tokenizer.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_int.h"

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
    size_t k = sk_utf8_char(s + i, len - i, &c);
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
    size_t k = sk_utf8_char(s + i, len - i, &c);
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

