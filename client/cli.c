#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/utf8.h"

static const char *sk__cli_prog = "sinkd";
static const char *sk__cli_help;
static sk_cli_error_fn *sk__cli_error_fn;

void sk_cli_init(const char *prog, const char *help) {
  sk__cli_prog = prog;
  sk__cli_help = help;
  sk__cli_error_fn = NULL;
}

void sk_cli_set_error_fn(sk_cli_error_fn *fn) { sk__cli_error_fn = fn; }

const char *sk_cli_prog(void) { return sk__cli_prog; }

static void sk__cli_vnote(const char *fmt, va_list ap) {
  fprintf(stderr, "%s: ", sk__cli_prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

/* The error function's call, if one is set, then exit(status). */
static void sk__cli_error_hook(int status, const char *fmt, va_list ap) {
  if (!sk__cli_error_fn) return;
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  sk__cli_error_fn(status, msg);
  exit(status);
}

void sk_cli_usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sk__cli_error_hook(SK_CLI_EXIT_USAGE, fmt, ap);
  sk__cli_vnote(fmt, ap);
  va_end(ap);
  if (sk__cli_help) fprintf(stderr, "Try '%s' for more information.\n", sk__cli_help);
  exit(SK_CLI_EXIT_USAGE);
}

void sk_cli_die(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sk__cli_error_hook(status, fmt, ap);
  sk__cli_vnote(fmt, ap);
  va_end(ap);
  exit(status);
}

void sk_cli_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sk__cli_vnote(fmt, ap);
  va_end(ap);
}

/* ---- numbers ---------------------------------------------------------- */

static bool sk__cli_digit(char c) { return c >= '0' && c <= '9'; }

/* The decimal digits at *p (at least one) into *ret, *p moved past them;
 * false if there are none or the value passes UINT64_MAX (*p is then
 * past the digits all the same). */
static bool sk__cli_digits(const char **p, uint64_t *ret, bool *overflow) {
  const char *s = *p;
  if (!sk__cli_digit(*s)) return false;
  uint64_t v = 0;
  for (; sk__cli_digit(*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) *overflow = true;
    else v = v * 10 + d;
  }
  *p = s;
  *ret = v;
  return true;
}

enum sk_cli_parse sk_cli_to_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret) {
  const char *p = s;
  bool overflow = false;
  uint64_t v;
  if (!sk__cli_digits(&p, &v, &overflow)) return SK_CLI_NOT_NUMBER;
  if (*p == 'e') {
    p++;
    uint64_t exp;
    if (!sk__cli_digits(&p, &exp, &overflow)) return SK_CLI_NOT_NUMBER;
    /* v x 10^exp, overflow checked at each step; 0 stays 0. */
    for (uint64_t i = 0; i < exp && v != 0 && !overflow; i++) {
      if (v > UINT64_MAX / 10) overflow = true;
      else v *= 10;
    }
  }
  if (*p) return SK_CLI_NOT_NUMBER;
  if (overflow || v < min || v > max) return SK_CLI_OUT_OF_RANGE;
  *ret = v;
  return SK_CLI_OK;
}

enum sk_cli_parse sk_cli_to_double(const char *s, double *ret) {
  /* strtod would also skip leading spaces and take hex ("0x1p3"); "inf"
   * and "nan" fail the isfinite below. */
  if (!(sk__cli_digit(s[0]) || s[0] == '.' || s[0] == '-' || s[0] == '+') || strpbrk(s, "xX"))
    return SK_CLI_NOT_NUMBER;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !isfinite(v)) return SK_CLI_NOT_NUMBER;
  *ret = v;
  return SK_CLI_OK;
}

uint64_t sk_cli_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max) {
  uint64_t v;
  enum sk_cli_parse r = sk_cli_to_u64(s, min, max, &v);
  if (r == SK_CLI_NOT_NUMBER) sk_cli_usage_error("%s: '%s' is not a number", what, s);
  if (r != SK_CLI_OK)
    sk_cli_usage_error("%s: '%s' is not in [%" PRIu64 ", %" PRIu64 "]", what, s, min, max);
  return v;
}

double sk_cli_parse_double(const char *what, const char *s) {
  double v;
  if (sk_cli_to_double(s, &v) != SK_CLI_OK)
    sk_cli_usage_error("%s: '%s' is not a number", what, s);
  return v;
}

uint32_t sk_cli_parse_list(const char *what, const char *s, uint64_t *out, uint32_t cap,
                           uint64_t min, uint64_t max) {
  uint32_t n = 0;
  const char *p = s;
  char item[32];
  for (;;) {
    size_t len = strcspn(p, ",");
    if (len == 0 || len >= sizeof item || n == cap) break;
    memcpy(item, p, len);
    item[len] = '\0';
    if (sk_cli_to_u64(item, min, max, &out[n]) != SK_CLI_OK) break;
    n++;
    p += len;
    if (*p == '\0') return n;
    p++; /* the comma; an element must follow it */
  }
  sk_cli_usage_error("%s: '%s' is not a list of up to %" PRIu32 " numbers in [%" PRIu64
                     ", %" PRIu64 "]",
                     what, s, cap, min, max);
}

/* ---- JSON ------------------------------------------------------------- */

size_t sk_cli_utf8_len(const unsigned char *s, size_t n) {
  uint32_t cpt;
  return sk_utf8_char(s, n, &cpt);
}

void sk_cli_json_str(FILE *f, const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  fputc('"', f);
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    if (c == '"' || c == '\\') {
      fputc('\\', f);
      fputc(c, f);
      i++;
    } else if (c < 0x20) {
      switch (c) {
      case '\n': fputs("\\n", f); break;
      case '\r': fputs("\\r", f); break;
      case '\t': fputs("\\t", f); break;
      case '\b': fputs("\\b", f); break;
      case '\f': fputs("\\f", f); break;
      default: fprintf(f, "\\u%04x", c); break;
      }
      i++;
    } else {
      size_t len = sk_cli_utf8_len(s + i, n - i);
      if (len == 0) {
        fputs("\\ufffd", f);
        i++;
      } else {
        fwrite(s + i, 1, len, f);
        i += len;
      }
    }
  }
  fputc('"', f);
}

void sk_cli_json_cstr(FILE *f, const char *s) { sk_cli_json_str(f, s, strlen(s)); }

/* ---- time ------------------------------------------------------------- */

double sk_cli_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
