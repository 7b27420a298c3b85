#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static int sk__log_level = SK_LOG_INFO;

void sk_log_set_level(int level) { sk__log_level = level; }
int sk_log_get_level(void) { return sk__log_level; }

void sk_log(int level, const char *fmt, ...) {
  if (level > sk__log_level) return;
  char line[1024];
  int n = snprintf(line, sizeof line, "<%d>", level);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  /* One write per line so lines from threads never interleave. */
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}
