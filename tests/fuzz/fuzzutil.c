#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuzz.h"

void sk_fuzz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz invariant broken: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}
