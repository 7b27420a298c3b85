/* What the development tools (sinkd-mkmodel, sinkd-bench, sinkd-kbench)
 * share. */
#ifndef SK_TOOL_H
#define SK_TOOL_H

/* The program's name, for messages; each tool sets it first thing. */
extern const char *sk_tool_prog;

/* Prints "PROG: message" to stderr and exits with status 1. */
void sk_tool_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* The same for a usage error (a bad flag value): exits with status 2, as
 * sinkctl and sinkd do. */
void sk_tool_usage_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Prints "PROG: message" to stderr and goes on. */
void sk_tool_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Seconds of CLOCK_MONOTONIC. */
double sk_tool_now_s(void);
/* qsort comparator of doubles, ascending. */
int sk_tool_cmp_double(const void *a, const void *b);

#endif
