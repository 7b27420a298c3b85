/* What the development tools (sinkd-mkmodel, sinkd-bench, sinkd-kbench)
 * share beyond the command-line helpers of client/cli.h. */
#ifndef SK_TOOL_H
#define SK_TOOL_H

/* qsort comparator of doubles, ascending. */
int sk_tool_cmp_double(const void *a, const void *b);

#endif
