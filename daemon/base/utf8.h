/* Streaming UTF-8 repair for generated text: tokens may end in the middle
 * of a character (byte-fallback tokens), but every text frame sinkd sends
 * must be valid UTF-8. Bytes of an incomplete character are held until the
 * character completes; bytes that can never form a valid character
 * (RFC 3629: overlongs, surrogates, > U+10FFFF, stray continuation bytes)
 * become U+FFFD. */
#ifndef SK_UTF8_H
#define SK_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sk_utf8_stream {
  uint8_t held[4];
  uint8_t n_held;
};

void sk_utf8_stream_init(struct sk_utf8_stream *s);
/* Feeds in[0..n) and writes the text that is now complete to out, which
 * must have room for 3 * (n + 4) bytes. Returns the bytes written. */
size_t sk_utf8_stream_push(struct sk_utf8_stream *s, const char *in, size_t n,
                           char *out);
/* Ends the stream: held bytes (an unfinished character) become U+FFFD.
 * out needs 3 bytes. Returns the bytes written (0 or 3). */
size_t sk_utf8_stream_flush(struct sk_utf8_stream *s, char *out);
/* Whether held[0..n) (n <= 4) is what a stream may hold: the first n
 * bytes of a character that more bytes can still complete (n < 4,
 * unused bytes of held zero). */
bool sk_utf8_held_valid(const uint8_t held[4], unsigned n);
/* The length of s[0..n) without a character cut at its end (a lead byte
 * followed by fewer continuation bytes than it announces): where a text
 * cut to fit a buffer may end. Bytes before the last character are not
 * looked at. */
size_t sk_utf8_trim_cut(const char *s, size_t n);
/* Whether s[0..n) is valid UTF-8. */
bool sk_utf8_valid(const char *s, size_t n);

#endif
