/* The integration tests' daemon and stream collector (testinteg.h). */
#include <errno.h>
#include <inttypes.h>
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
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "testmsg.h"
#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"
#include "base/utf8.h"
#include "testinteg.h"
char *g_dir;
char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char g_log[256];
static char g_state[256];
pid_t g_pid;

void dump_log(void) {
  size_t n = 0;
  char *log = sk_test_read_file(g_log, &n);
  if (log) {
    fprintf(stderr, "---- sinkd log ----\n%s-------------------\n", log);
    free(log);
  }
}

struct sk_client *connect_or_fail(void) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(g_socket, &c, &e) < 0) {
    dump_log();
    fail_msg("connect: %s", e.message);
  }
  sk_client_set_timeout(c, 120000, NULL);
  return c;
}

/* Memcheck runs the daemon some 50x slower. The longest streams (a
 * 200,000-token prefill, 10,000 evictions under a pin, 5,000 tokens, 16 x
 * 200 batched tokens, 2 x 2048 scored tokens, the evaluator with its
 * gnuplot child) would take it most of an hour; they run in the normal and ASan+UBSan builds, and memcheck covers
 * the same code paths through the shorter cases. */
void skip_under_valgrind(void) {
  const char *t = getenv("SK_TEST_TOOL");
  if (t && strcmp(t, "valgrind") == 0) {
    print_message("skipped under valgrind (too long for memcheck; runs in the other builds)\n");
    skip();
  }
}

const char *test_threads(void) {
  const char *t = getenv("SK_TEST_THREADS");
  return t && *t ? t : "2";
}

int start_daemon(void **state) {
  (void)state;
  g_dir = sk_test_tmpdir();
  snprintf(g_socket, sizeof g_socket, "%s/sinkd.sock", g_dir);
  snprintf(g_log, sizeof g_log, "%s/sinkd.log", g_dir);
  snprintf(g_state, sizeof g_state, "%s/state", g_dir);
  const char *sinkd = getenv("SK_SINKD");
  if (!sinkd) sinkd = "./daemon/sinkd";
  g_pid = fork();
  if (g_pid == 0) {
    sk_test_child_setup();
    FILE *f = freopen(g_log, "w", stderr);
    (void)f;
    /* --config /dev/null: an installed /etc/sinkd/sinkd.conf must not
     * change what the test runs. */
    /* --kv-type f32: llama.cpp's reference values were taken with an f32
     * cache (its f16 default moves logits by ~0.016). */
    execl(sinkd, sinkd, "--config", "/dev/null", "--model", sk_test_model_path(), "--socket", g_socket, "--threads", test_threads(),
          "--state-dir", g_state, "--kv-type", "f32", "--verbose", (char *)NULL);
    _exit(127);
  }
  /* Ready when the socket accepts (valgrind takes seconds to start). */
  for (int i = 0; i < (sk_test_under_tool() ? 6000 : 500); i++) {
    struct sk_client *c = NULL;
    if (sk_client_connect(g_socket, &c, NULL) == 0) {
      sk_client_free(c);
      return 0;
    }
    usleep(20000);
  }
  dump_log();
  return -1;
}

int stop_daemon(void **state) {
  (void)state;
  if (g_pid > 0) {
    kill(g_pid, SIGKILL);
    waitpid(g_pid, NULL, 0);
  }
  return 0;
}

/* ---- hello, ping, tokenizer through the daemon ---- */

int collect_cb(void *user, const struct sk_token_event *ev) {
  struct collect *col = user;
  if (col->n < sizeof col->ids / sizeof col->ids[0]) col->ids[col->n] = ev->token;
  if (col->n < 8 && ev->n_top == 10) {
    for (int k = 0; k < 10; k++) {
      col->top_id[col->n][k] = ev->top[k].token;
      col->top_logit[col->n][k] = ev->top[k].logit;
    }
    col->n_top_steps = col->n + 1;
  }
  if (!sk_utf8_valid(ev->text, ev->text_len)) col->text_valid = false;
  if (col->text_len + ev->text_len + 1 > col->text_cap) {
    col->text_cap = (col->text_len + ev->text_len + 1) * 2;
    col->text = realloc(col->text, col->text_cap);
  }
  memcpy(col->text + col->text_len, ev->text, ev->text_len);
  col->text_len += ev->text_len;
  col->text[col->text_len] = 0;
  col->n++;
  return col->cancel_after > 0 && col->n >= (size_t)col->cancel_after;
}

