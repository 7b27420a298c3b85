#include "tool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

const char *sk_tool_prog = "sinkd-tool";

static void sk__vnote(const char *fmt, va_list ap) {
  fprintf(stderr, "%s: ", sk_tool_prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

static void sk__vdie(int status, const char *fmt, va_list ap) __attribute__((noreturn));
static void sk__vdie(int status, const char *fmt, va_list ap) {
  sk__vnote(fmt, ap);
  exit(status);
}

void sk_tool_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sk__vdie(1, fmt, ap);
}

void sk_tool_usage_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sk__vdie(2, fmt, ap);
}

void sk_tool_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sk__vnote(fmt, ap);
  va_end(ap);
}

double sk_tool_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int sk_tool_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
