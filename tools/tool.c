#include "tool.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

const char *sk_tool_prog = "sinkd-tool";

void sk_tool_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", sk_tool_prog);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}
