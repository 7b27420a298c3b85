/* The daemon of the hostile-input tests (testhostile.h). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "session/session.h"
#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"
#include "testhostile.h"
struct sk_test_daemon g_d;
int setup(void **state) {
  (void)state;
  sk_test_daemon_start(&g_d, NULL);
  return 0;
}

int teardown(void **state) {
  (void)state;
  if (g_d.pid <= 0) return 0;
  int st = sk_test_daemon_stop(&g_d, 60000);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "sinkd ended with status %d\n", st);
    return -1;
  }
  return 0;
}

