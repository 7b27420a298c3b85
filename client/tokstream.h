/* The tokens of a text file of any size, tokenized piece by piece with
 * the tokens the whole text would get in one call (the perplexity of
 * `sinkctl eval` must not depend on how the text was cut).
 *
 * A tokenizer sees at most one piece at a time (the daemon's frame limit),
 * and the memory held is one piece of text plus its tokens, whatever the
 * file's size. Pieces end after a newline (else before other white space,
 * else at a character boundary: never inside a UTF-8 sequence). Two
 * things could make pieces tokenize differently from the whole:
 *   - merges across a cut (a vocabulary piece such as "\n\n", or a
 *     pre-tokenizer rule that joins a newline to what follows);
 *   - SentencePiece's dummy space prefix, which a tokenizer puts before
 *     the start of every text it is given, but the whole text has only at
 *     its start.
 * So only the first piece is tokenized as a text of its own (with BOS
 * when asked). Every later piece is tokenized behind an anchor: the line
 * before the cut (the last bytes of the previous piece, from a line
 * start), and the anchor's own tokens are removed from the front; the
 * dummy prefix falls on the anchor. A cut is taken only where the
 * anchor's tokens are a prefix of the tokens of the anchor followed by
 * the next line, checked before the piece that ends at the cut is given
 * out (two small tokenize calls); a cut that fails it moves back to an
 * earlier line end. The piece after the cut checks the same prefix
 * again, with all of its text, and reports -SK_ERR_INTERNAL if it does
 * not hold (a tokenizer whose merges reach further than a line). */
#ifndef SK_SINKCTL_TOKSTREAM_H
#define SK_SINKCTL_TOKSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sinkd/protocol.h"

/* Tokenizes text[0..len) as a text of its own (a SentencePiece vocabulary
 * puts its dummy space prefix first), with BOS first when bos is true,
 * none when false. On success *ret_tokens is a malloc'd array of *ret_n
 * ids (the caller frees it). A tokenizer that refuses the length (a frame
 * limit) returns -SK_ERR_TOO_LARGE: the stream halves its pieces and asks
 * again. Any other negative code is passed on. */
typedef int (*sk_tokstream_tokenize_fn)(void *ctx, const char *text, size_t len, bool bos,
                                        int32_t **ret_tokens, size_t *ret_n,
                                        struct sk_error *err);

struct sk_tokstream;

/* A stream over the bytes of f (read from its current position, not
 * closed by the stream) in pieces of at most piece_bytes (>= 64) bytes;
 * bos: BOS before the first token. Errors: -SK_ERR_BAD_REQUEST (piece
 * too small), -SK_ERR_NO_MEMORY. */
int sk_tokstream_open(FILE *f, size_t piece_bytes, bool bos, sk_tokstream_tokenize_fn tokenize,
                      void *ctx, struct sk_tokstream **ret, struct sk_error *err);
void sk_tokstream_free(struct sk_tokstream *ts);

/* The tokens of the next piece: *ret_tokens (malloc'd, caller frees) of
 * *ret_n ids; returns 1, or 0 at the end of the text (nothing returned),
 * or a negative code: the tokenizer's, -SK_ERR_IO (reading f),
 * -SK_ERR_TOO_LARGE (a tokenizer that refuses even 64 bytes),
 * -SK_ERR_INTERNAL (no cut in a piece whose tokens match; see above),
 * -SK_ERR_NO_MEMORY. A piece may give 0 tokens. */
int sk_tokstream_next(struct sk_tokstream *ts, int32_t **ret_tokens, size_t *ret_n,
                      struct sk_error *err);

/* Bytes of the file given out as tokens so far. */
uint64_t sk_tokstream_bytes(const struct sk_tokstream *ts);

#endif
