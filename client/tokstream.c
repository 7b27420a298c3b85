/* Tokens of a text file, tokenized piece by piece (see tokstream.h). */
#include "tokstream.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Most bytes of an anchor (the line before a cut) and of the line after a
 * cut that the check reads: a longer line is cut at these lengths (at a
 * character boundary), which only shortens the context of the check. */
#define SK__TS_ANCHOR_MAX 1024u
#define SK__TS_LOOK_MAX 1024u
/* Smallest piece: below it a tokenizer that refuses a piece is refused. */
#define SK__TS_PIECE_MIN 64u
/* Cuts tried per piece before giving up. */
#define SK__TS_TRIES 64u

struct sk_tokstream {
  FILE *f;
  size_t piece; /* most bytes of text per piece (halved on too_large) */
  bool bos, first, eof, done;
  sk_tokstream_tokenize_fn tokenize;
  void *ctx;
  char *buf;    /* buf[0..alen): the anchor; buf[alen..len): text not yet given out */
  size_t cap, len, alen;
  int32_t *atok; /* the anchor's tokens, tokenized alone without BOS */
  size_t n_atok;
  uint64_t bytes; /* given out */
};

int sk_tokstream_open(FILE *f, size_t piece_bytes, bool bos, sk_tokstream_tokenize_fn tokenize,
                      void *ctx, struct sk_tokstream **ret, struct sk_error *err) {
  if (piece_bytes < SK__TS_PIECE_MIN)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "pieces of %zu bytes: at least %u", piece_bytes,
                        SK__TS_PIECE_MIN);
  struct sk_tokstream *ts = calloc(1, sizeof *ts);
  size_t cap = SK__TS_ANCHOR_MAX + piece_bytes + SK__TS_LOOK_MAX;
  char *buf = ts ? malloc(cap) : NULL;
  if (!buf) {
    free(ts);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for a %zu-byte piece", piece_bytes);
  }
  *ts = (struct sk_tokstream){.f = f, .piece = piece_bytes, .bos = bos, .first = true,
                              .tokenize = tokenize, .ctx = ctx, .buf = buf, .cap = cap};
  *ret = ts;
  return 0;
}

void sk_tokstream_free(struct sk_tokstream *ts) {
  if (!ts) return;
  free(ts->buf);
  free(ts->atok);
  free(ts);
}

uint64_t sk_tokstream_bytes(const struct sk_tokstream *ts) { return ts->bytes; }

/* A UTF-8 continuation byte (10xxxxxx): never the first byte after a cut. */
static bool sk__ts_cont(char c) { return ((unsigned char)c & 0xC0u) == 0x80u; }

static bool sk__ts_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

/* Start of the context left of cut c: the start of the line that ends at
 * c (after the newline before it), at most SK__TS_ANCHOR_MAX bytes back
 * (then a character boundary), never before lo. */
static size_t sk__ts_left(const struct sk_tokstream *ts, size_t c, size_t lo) {
  size_t min = c > SK__TS_ANCHOR_MAX ? c - SK__TS_ANCHOR_MAX : 0;
  if (min < lo) min = lo;
  size_t l = c - 1; /* c >= 1: the anchor holds at least the byte before c */
  while (l > min && ts->buf[l - 1] != '\n') l--;
  while (l < c - 1 && sk__ts_cont(ts->buf[l])) l++;
  return l;
}

/* End of the line after cut c (after its newline), at most
 * SK__TS_LOOK_MAX bytes on (then a character boundary), at most len. */
static size_t sk__ts_right(const struct sk_tokstream *ts, size_t c) {
  size_t max = ts->len - c > SK__TS_LOOK_MAX ? c + SK__TS_LOOK_MAX : ts->len;
  size_t r = c;
  while (r < max && ts->buf[r] != '\n') r++;
  if (r < max) return r + 1;
  while (r > c && r < ts->len && sk__ts_cont(ts->buf[r])) r--;
  return r;
}

static bool sk__ts_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
  return na <= nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

/* Whether cut c keeps the tokens: the tokens of buf[left..c) are a prefix
 * of those of buf[left..right). 1 (and the left part's tokens in *ret, its
 * start in *ret_left), 0, or a negative code. */
static int sk__ts_check(struct sk_tokstream *ts, size_t c, int32_t **ret, size_t *ret_n,
                        size_t *ret_left, struct sk_error *err) {
  size_t left = sk__ts_left(ts, c, 0), right = sk__ts_right(ts, c);
  int32_t *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  int rc = ts->tokenize(ts->ctx, ts->buf + left, c - left, false, &a, &na, err);
  if (rc < 0) return rc;
  if (right > c) {
    rc = ts->tokenize(ts->ctx, ts->buf + left, right - left, false, &b, &nb, err);
    if (rc < 0) {
      free(a);
      return rc;
    }
    bool ok = sk__ts_prefix(a, na, b, nb);
    free(b);
    if (!ok) {
      free(a);
      return 0;
    }
  }
  *ret = a;
  *ret_n = na;
  *ret_left = left;
  return 1;
}

/* Fills buf up to alen + piece + SK__TS_LOOK_MAX bytes, or to the end. */
static int sk__ts_fill(struct sk_tokstream *ts, struct sk_error *err) {
  size_t want = ts->alen + ts->piece + SK__TS_LOOK_MAX;
  while (!ts->eof && ts->len < want) {
    size_t n = fread(ts->buf + ts->len, 1, want - ts->len, ts->f);
    ts->len += n;
    if (n == 0) {
      if (ferror(ts->f))
        return sk_error_set(err, SK_ERR_IO, "cannot read the text: %s", strerror(errno));
      ts->eof = true;
    }
  }
  return 0;
}

/* The next cut candidate below c (exclusive), above lo: after a newline
 * (pass 0); where there is none, before other white space (pass 1: a
 * space goes with the word after it, in SentencePiece and in byte-level
 * BPE's pre-tokenizers), then any character boundary (pass 2). 0 if
 * none. */
static size_t sk__ts_candidate(const struct sk_tokstream *ts, size_t lo, size_t c, int pass) {
  for (size_t i = c - 1; i > lo; i--) {
    if (pass == 0 ? ts->buf[i - 1] == '\n'
        : pass == 1 ? sk__ts_space(ts->buf[i]) && !sk__ts_space(ts->buf[i - 1])
                    : !sk__ts_cont(ts->buf[i]))
      return i;
  }
  return 0;
}

int sk_tokstream_next(struct sk_tokstream *ts, int32_t **ret_tokens, size_t *ret_n,
                      struct sk_error *err) {
  if (ts->done) return 0;
  int rc = sk__ts_fill(ts, err);
  if (rc < 0) return rc;
  if (ts->len == ts->alen && !ts->first) {
    ts->done = true;
    return 0;
  }
  for (;;) {
    /* the cut: the end of the text if it is within this piece, else the
     * last candidate of the piece whose check holds */
    size_t c = ts->len, left = 0, n_next = 0;
    int32_t *next = NULL; /* the next anchor's tokens */
    const size_t lim = ts->alen + ts->piece;
    const bool last = ts->eof && ts->len <= lim;
    if (!last) {
      c = 0;
      unsigned tries = 0;
      for (int pass = 0; pass < 3 && !c && tries < SK__TS_TRIES; pass++) {
        for (size_t k = sk__ts_candidate(ts, ts->alen, lim + 1, pass); k && tries < SK__TS_TRIES;
             k = sk__ts_candidate(ts, ts->alen, k, pass)) {
          tries++;
          rc = sk__ts_check(ts, k, &next, &n_next, &left, err);
          if (rc == -SK_ERR_TOO_LARGE) break; /* halved below */
          if (rc < 0) return rc;
          if (rc == 1) {
            c = k;
            break;
          }
        }
        if (rc == -SK_ERR_TOO_LARGE) break;
      }
      if (!c && rc != -SK_ERR_TOO_LARGE)
        return sk_error_set(err, SK_ERR_INTERNAL,
                            "no cut within %zu bytes at byte %llu keeps the tokens of the "
                            "text whole",
                            ts->piece, (unsigned long long)ts->bytes);
    }
    /* the piece's tokens: the first piece alone, later ones behind their
     * anchor, whose tokens are dropped */
    int32_t *t = NULL;
    size_t nt = 0;
    if (c || last) { /* (c = 0 only for an empty text) */
      if (ts->first)
        rc = ts->tokenize(ts->ctx, ts->buf, c, ts->bos, &t, &nt, err);
      else
        rc = ts->tokenize(ts->ctx, ts->buf, c, false, &t, &nt, err);
    }
    if ((!c && !last) || rc == -SK_ERR_TOO_LARGE) {
      free(next);
      if (ts->piece / 2 < SK__TS_PIECE_MIN)
        return sk_error_set(err, SK_ERR_TOO_LARGE,
                            "the tokenizer refuses pieces of %zu bytes of text", ts->piece);
      ts->piece /= 2;
      continue;
    }
    if (rc < 0) {
      free(next);
      return rc;
    }
    size_t skip = 0;
    if (!ts->first) {
      if (!sk__ts_prefix(ts->atok, ts->n_atok, t, nt)) {
        free(t);
        free(next);
        return sk_error_set(err, SK_ERR_INTERNAL,
                            "the tokens before byte %llu change with the text after it: the "
                            "text cannot be tokenized in pieces",
                            (unsigned long long)ts->bytes);
      }
      skip = ts->n_atok;
      memmove(t, t + skip, (nt - skip) * sizeof *t);
    }
    ts->bytes += c - ts->alen;
    ts->first = false;
    free(ts->atok);
    ts->atok = next;
    ts->n_atok = n_next;
    if (c == ts->len && ts->eof) {
      ts->done = true;
    } else { /* the next anchor moves to the front */
      memmove(ts->buf, ts->buf + left, ts->len - left);
      ts->len -= left;
      ts->alen = c - left;
    }
    *ret_tokens = t;
    *ret_n = nt - skip;
    return 1;
  }
}
