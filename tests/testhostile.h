/* The daemon of the hostile-input tests (test-hostile*.c): one sinkd for
 * the whole program, started by setup and stopped by teardown (the group
 * setup and teardown), which fails if the daemon did not exit cleanly. */
#ifndef SK_TESTHOSTILE_H
#define SK_TESTHOSTILE_H

#include "testdaemon.h"

extern struct sk_test_daemon g_d;

int setup(void **state);
int teardown(void **state);

#endif
