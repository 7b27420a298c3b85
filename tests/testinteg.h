/* The daemon of the integration tests (test-integration*.c): one sinkd per
 * test program on a temporary socket with the test model, started by
 * start_daemon and killed by stop_daemon (the group setup and teardown),
 * and what every part of those tests reads its replies with. */
#ifndef SK_TESTINTEG_H
#define SK_TESTINTEG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "sinkd/client.h"

/* The daemon's temporary folder, socket and pid (0 once it has exited). */
extern char *g_dir;
extern char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
extern pid_t g_pid;

/* Prints the daemon's log to stderr. */
void dump_log(void);
/* A client of the daemon with a 120 s reply timeout; fails the test if
 * it cannot connect. */
struct sk_client *connect_or_fail(void);
/* Skips the calling test under valgrind (SK_TEST_TOOL=valgrind). */
void skip_under_valgrind(void);
/* Compute threads of the daemon under test: 2 (the machine's cores), or
 * SK_TEST_THREADS. */
const char *test_threads(void);
/* Group setup: starts the daemon; -1 if its socket never accepts. */
int start_daemon(void **state);
/* Group teardown: SIGKILL and reap. */
int stop_daemon(void **state);

/* The tokens, top-10 logits of the first 8 steps and text of a stream,
 * gathered by collect_cb. */
struct collect {
  int32_t ids[8192];
  size_t n;
  double top_logit[8][10];
  int32_t top_id[8][10];
  size_t n_top_steps;
  bool text_valid;
  char *text;
  size_t text_len, text_cap;
  int cancel_after; /* > 0: return nonzero after this many tokens */
};
int collect_cb(void *user, const struct sk_token_event *ev);

#endif
