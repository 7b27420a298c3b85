#include "base/utf8.h"

#include <string.h>

#include "proto/utf8.h"

static const char sk__replacement[3] = {'\xef', '\xbf', '\xbd'};

void sk_utf8_stream_init(struct sk_utf8_stream *s) { memset(s, 0, sizeof *s); }

/* Length of the character a lead byte starts (0: not a lead byte). */
static unsigned lead_len(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xc2 && b <= 0xdf) return 2;
  if (b >= 0xe0 && b <= 0xef) return 3;
  if (b >= 0xf0 && b <= 0xf4) return 4;
  return 0;
}

/* Whether byte `b` may follow the prefix seq[0..i) (RFC 3629 table 3-7). */
static bool cont_ok(const uint8_t *seq, unsigned i, uint8_t b) {
  if ((b & 0xc0) != 0x80) return false;
  if (i != 1) return true;
  switch (seq[0]) {
  case 0xe0: return b >= 0xa0;
  case 0xed: return b <= 0x9f;
  case 0xf0: return b >= 0x90;
  case 0xf4: return b <= 0x8f;
  default: return true;
  }
}

size_t sk_utf8_stream_push(struct sk_utf8_stream *s, const char *in, size_t n,
                           char *out) {
  size_t w = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t b = (uint8_t)in[i];
    if (s->n_held > 0) {
      if (cont_ok(s->held, s->n_held, b)) {
        s->held[s->n_held++] = b;
        if (s->n_held == lead_len(s->held[0])) {
          memcpy(out + w, s->held, s->n_held);
          w += s->n_held;
          s->n_held = 0;
        }
        continue;
      }
      /* The held prefix can never complete: replace it, then handle b. */
      memcpy(out + w, sk__replacement, 3);
      w += 3;
      s->n_held = 0;
    }
    unsigned len = lead_len(b);
    if (len == 1) {
      out[w++] = (char)b;
    } else if (len == 0) {
      memcpy(out + w, sk__replacement, 3);
      w += 3;
    } else {
      s->held[0] = b;
      s->n_held = 1;
    }
  }
  return w;
}

size_t sk_utf8_stream_flush(struct sk_utf8_stream *s, char *out) {
  if (s->n_held == 0) return 0;
  s->n_held = 0;
  memcpy(out, sk__replacement, 3);
  return 3;
}

bool sk_utf8_valid(const char *str, size_t n) {
  const unsigned char *p = (const unsigned char *)str;
  for (size_t i = 0, k; i < n; i += k) {
    uint32_t c;
    if ((k = sk_utf8_char(p + i, n - i, &c)) == 0) return false;
  }
  return true;
}

bool sk_utf8_held_valid(const uint8_t held[4], unsigned n) {
  if (n > 3) return false;
  for (unsigned i = n; i < 4; i++)
    if (held[i]) return false;
  if (n == 0) return true;
  if (lead_len(held[0]) <= n) return false;
  for (unsigned i = 1; i < n; i++)
    if (!cont_ok(held, i, held[i])) return false;
  return true;
}

size_t sk_utf8_trim_cut(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  /* The start of the last character: up to 3 continuation bytes back. */
  size_t i = n, back = 0;
  while (i > 0 && back < 4 && (p[i - 1] & 0xc0) == 0x80) i--, back++;
  if (i == 0) return n; /* only continuation bytes: nothing to trim */
  unsigned char lead = p[i - 1];
  size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  size_t have = back + 1;
  return have < want ? i - 1 : n;
}
