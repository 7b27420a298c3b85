/* Error codes: names, descriptions and the sk_error value type.
 * The tables are generated from SK_ERROR_LIST in sinkd/protocol.h, so a
 * new code is added in exactly one place. */
#include "sinkd/protocol.h"

#include <stdio.h>
#include <string.h>

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

int sk_error_setv(struct sk_error *err, int code, const char *fmt,
                  va_list ap) {
  int idx = sk__error_index(code);
  if (err) {
    err->code = idx;
    if (fmt) {
      vsnprintf(err->message, sizeof err->message, fmt, ap);
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
