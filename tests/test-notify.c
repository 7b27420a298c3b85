/* sd_notify messages and the watchdog, against a NOTIFY_SOCKET listener
 * written here: the pings come from the event loop, so a loop that does
 * not turn sends none. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/notify.h"
#include "testutil.h"

static char *g_dir;
static char g_path[108];
static int g_fd = -1;

/* A datagram socket standing in for the service manager. */
static int setup(void **state) {
  (void)state;
  g_dir = sk_test_tmpdir();
  snprintf(g_path, sizeof g_path, "%s/notify", g_dir);
  g_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", g_path);
  if (g_fd < 0 || bind(g_fd, (struct sockaddr *)&a, sizeof a) < 0) return -1;
  setenv("NOTIFY_SOCKET", g_path, 1);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  close(g_fd);
  unlink(g_path);
  rmdir(g_dir);
  free(g_dir);
  unsetenv("NOTIFY_SOCKET");
  return 0;
}

/* The next message if one is waiting (NUL-terminated into buf), else
 * false. Never blocks. */
static bool next_message(char *buf, size_t size) {
  ssize_t n = recv(g_fd, buf, size - 1, MSG_DONTWAIT);
  if (n < 0) {
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
    return false;
  }
  buf[n] = 0;
  return true;
}

static void test_notify(void **state) {
  (void)state;
  char buf[512];
  assert_false(next_message(buf, sizeof buf));
  sk_notify("READY=1\nSTATUS=serving %s: %u sessions", "m", 3u);
  assert_true(next_message(buf, sizeof buf));
  assert_string_equal(buf, "READY=1\nSTATUS=serving m: 3 sessions");
  assert_false(next_message(buf, sizeof buf));
  /* Without a service manager: nothing happens, nothing fails. */
  unsetenv("NOTIFY_SOCKET");
  sk_notify("READY=1");
  setenv("NOTIFY_SOCKET", g_path, 1);
  assert_false(next_message(buf, sizeof buf));
}

static void test_watchdog_not_asked(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  struct sk_watchdog w;
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  assert_int_equal(sk_watchdog_start(&w, &loop), 0);
  assert_false(w.running);
  /* Asked of another process (a parent's variables leaking): ignored. */
  setenv("WATCHDOG_USEC", "20000", 1);
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)getppid());
  setenv("WATCHDOG_PID", pid, 1);
  assert_int_equal(sk_watchdog_start(&w, &loop), 0);
  sk_watchdog_stop(&w); /* not running: nothing to do */
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  assert_int_equal(uv_run(&loop, UV_RUN_NOWAIT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Runs the loop until n pings have arrived. Each UV_RUN_ONCE blocks until
 * the timer fires, so this waits for the pings, not for a fixed time. */
static void run_until_pings(uv_loop_t *loop, int n) {
  char buf[64];
  int got = 0;
  while (got < n) {
    uv_run(loop, UV_RUN_ONCE);
    while (next_message(buf, sizeof buf)) {
      assert_string_equal(buf, "WATCHDOG=1");
      got++;
    }
  }
}

static void test_watchdog_from_the_loop(void **state) {
  (void)state;
  char pid[32];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  setenv("WATCHDOG_USEC", "20000", 1); /* WatchdogSec=20ms */
  setenv("WATCHDOG_PID", pid, 1);
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  struct sk_watchdog w;
  assert_int_equal(sk_watchdog_start(&w, &loop), 1);
  assert_true(w.running);
  assert_int_equal(w.interval_ms, 10); /* half the interval */
  /* The first ping goes out on the first turn of the loop. */
  run_until_pings(&loop, 1);
  run_until_pings(&loop, 3);

  /* A loop that does not turn (a wedged callback) sends nothing, however
   * long it stays stuck: here 5 whole intervals. */
  usleep(50 * 1000);
  char buf[64];
  assert_false(next_message(buf, sizeof buf));
  /* Once it turns again, the overdue ping goes out. */
  run_until_pings(&loop, 1);

  /* Stopped: the timer handle closes and the loop has nothing left. */
  sk_watchdog_stop(&w);
  assert_false(w.running);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  usleep(30 * 1000);
  assert_false(next_message(buf, sizeof buf));
  assert_int_equal(uv_loop_close(&loop), 0);
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_notify),
      cmocka_unit_test(test_watchdog_not_asked),
      cmocka_unit_test(test_watchdog_from_the_loop),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
