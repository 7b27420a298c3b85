/* What the development tools (sinkd-mkmodel, sinkd-bench) share. */
#ifndef SK_TOOL_H
#define SK_TOOL_H

/* The program's name, for messages; each tool sets it first thing. */
extern const char *sk_tool_prog;

/* Prints "PROG: message" to stderr and exits with status 1. */
void sk_tool_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
