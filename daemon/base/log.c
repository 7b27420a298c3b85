#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int sk__log_level = SK_LOG_INFO;
/* -1: not decided yet; 0: plain lines; 1: "<N>" prefixes. */
static atomic_int sk__log_prefix = -1;

void sk_log_set_level(int level) { sk__log_level = level; }
int sk_log_get_level(void) { return sk__log_level; }

bool sk_log_to_journal(void) {
  const char *js = getenv("JOURNAL_STREAM");
  if (!js || !*js) return false;
  unsigned long long dev = 0, ino = 0;
  char end = 0;
  if (sscanf(js, "%llu:%llu%c", &dev, &ino, &end) != 2) return false;
  struct stat st;
  if (fstat(STDERR_FILENO, &st) < 0) return false;
  return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void sk_log_init(void) { atomic_store(&sk__log_prefix, sk_log_to_journal() ? 1 : 0); }

static const char *sk__level_word(int level) {
  switch (level) {
  case SK_LOG_ERR: return "error: ";
  case SK_LOG_WARNING: return "warning: ";
  default: return "";
  }
}

void sk_log(int level, const char *fmt, ...) {
  if (level > sk__log_level) return;
  int prefix = atomic_load(&sk__log_prefix);
  if (prefix < 0) {
    prefix = sk_log_to_journal() ? 1 : 0;
    atomic_store(&sk__log_prefix, prefix);
  }
  char line[1024];
  int n = prefix ? snprintf(line, sizeof line, "<%d>", level)
                 : snprintf(line, sizeof line, "sinkd: %s", sk__level_word(level));
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
