/* One UTF-8 character, decoded and checked: shared by the protocol's
 * error messages, the daemon's text checks and the tokenizers.
 *
 * Internal header (not installed).
 */
#ifndef SK_PROTO_UTF8_H
#define SK_PROTO_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of the valid UTF-8 character (RFC 3629: no overlong form, no
 * surrogate, nothing above U+10FFFF) that starts s[0..n), n >= 1, with
 * its code point in *cpt; 0 (and *cpt untouched) when s does not start
 * with one, or it is cut at n. */
static inline size_t sk_utf8_char(const unsigned char *s, size_t n, uint32_t *cpt) {
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

#endif
