/* Error codes: names, descriptions and the sk_error value type.
 * The tables are generated from SK_ERROR_LIST in sinkd/protocol.h, so a
 * new code is added in exactly one place. */
#include "sinkd/protocol.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "proto/utf8.h"

static const char *const sk__error_names[SK_ERR__COUNT] = {
  [SK_OK] = "ok",
#define SK__ERR_NAME(name, code, desc) [SK_ERR_##name] = code,
  SK_ERROR_LIST(SK__ERR_NAME)
#undef SK__ERR_NAME
};

static const char *const sk__error_descs[SK_ERR__COUNT] = {
  [SK_OK] = "success",
#define SK__ERR_DESC(name, code, desc) [SK_ERR_##name] = desc,
  SK_ERROR_LIST(SK__ERR_DESC)
#undef SK__ERR_DESC
};

/* |code| without overflow on INT_MIN; out of range maps to INTERNAL. */
static int sk__error_index(int code) {
  if (code < 0) {
    if (code < -(int)(SK_ERR__COUNT - 1)) return SK_ERR_INTERNAL;
    code = -code;
  }
  if (code >= SK_ERR__COUNT) return SK_ERR_INTERNAL;
  return code;
}

const char *sk_error_name(int code) {
  return sk__error_names[sk__error_index(code)];
}

const char *sk_strerror(int code) {
  return sk__error_descs[sk__error_index(code)];
}

int sk_error_from_name(const char *name, size_t len) {
  if (!name) return SK_ERR_INTERNAL;
  for (int i = 1; i < SK_ERR__COUNT; i++) {
    const char *n = sk__error_names[i];
    if (strlen(n) == len && memcmp(n, name, len) == 0) return i;
  }
  return SK_ERR_INTERNAL;
}

/* Cuts s (a message cut to its buffer) back to the end of its last
 * whole UTF-8 character: a message may hold a client's bytes, and half
 * a character would make it invalid text for every reader. */
static void sk__trim_cut_character(char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s), i = n, back = 0;
  while (i > 0 && back < 4 && (p[i - 1] & 0xc0) == 0x80) i--, back++;
  if (i == 0) return;
  unsigned char lead = p[i - 1];
  size_t want = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
  if (back + 1 < want) s[i - 1] = 0;
}

/* Makes s text every reader can take and print: a byte that is not part
 * of a valid UTF-8 character, and a control character other than tab and
 * newline, become '?' (a message may echo a client's bytes). */
static void sk__clean_text(char *s) {
  unsigned char *p = (unsigned char *)s;
  size_t left = strlen(s);
  while (*p) {
    uint32_t c;
    size_t n = sk_utf8_char(p, left, &c);
    if (n == 1 && ((*p < 0x20 && *p != '\t' && *p != '\n') || *p == 0x7f)) *p = '?';
    if (n == 0) *p = '?', n = 1;
    p += n;
    left -= n;
  }
}

int sk_error_setv(struct sk_error *err, int code, const char *fmt,
                  va_list ap) {
  int idx = sk__error_index(code);
  if (err) {
    err->code = idx;
    if (fmt) {
      int n = vsnprintf(err->message, sizeof err->message, fmt, ap);
      if (n >= (int)sizeof err->message) sk__trim_cut_character(err->message);
      sk__clean_text(err->message);
    } else {
      snprintf(err->message, sizeof err->message, "%s",
               sk__error_descs[idx]);
    }
  }
  return -idx;
}

int sk_error_set(struct sk_error *err, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = sk_error_setv(err, code, fmt, ap);
  va_end(ap);
  return r;
}
