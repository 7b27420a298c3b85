/* The daemon of the persistence tests (test-persist*.c): one sinkd at a
 * time on a temporary socket and a state directory on tmpfs, started,
 * killed with SIGKILL and restarted; and the client calls those tests
 * make. Every helper fails the test on error. */
#ifndef SK_TESTPERSIST_H
#define SK_TESTPERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

#include "sinkd/client.h"

/* The test's folder, the daemon's socket, log and state directory, and
 * its pid (0 when none runs). */
extern char g_dir[64];
extern char g_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
extern char g_log[300];
extern char g_state[300];
extern pid_t g_pid;

/* Seconds on the monotonic clock. */
double now_s(void);
/* Prints the daemon's log to stderr. */
void dump_log(void);
/* Starts sinkd on model with g_socket, g_state, one compute thread and
 * the extra flags (NULL-ended, or NULL), its stderr appended to g_log;
 * returns 0 once its socket accepts, or its exit status if it exits
 * first (fails the test after 30 s). */
int start_daemon_model(const char *model, const char *const *extra);
/* The test model ($SK_MODEL) with an f32 KV cache and extra flags; fails
 * the test unless it starts. */
void start_daemon_args(const char *const *extra);
void start_daemon(void);
/* SIGKILL and reap (nothing if none runs). */
void kill9(void);
/* SIGTERM; asserts a clean exit. */
void stop_term(void);
/* A client of the daemon. */
struct sk_client *conn(void);
/* Group setup and teardown: the test's folder (on tmpfs if there is
 * one) and the socket and log paths in it. */
int setup(void **state);
int teardown(void **state);
/* The next daemon's state directory and log: name (and name.log) in the
 * test's folder. */
void fresh_state(const char *name);
/* Opens a session (policy "streaming", "window", "dense", ...); its id. */
uint64_t open_session(struct sk_client *c, const char *policy, uint32_t n_sink,
                      uint32_t window, uint32_t capacity);

/* Token ids of a generate, gathered by ids_cb. */
struct ids {
  int32_t v[4096];
  double lp[4096]; /* the events' log-probabilities (NaN: none asked) */
  size_t n;
  int kill_after; /* > 0: SIGKILL the daemon when this many arrived */
};
int ids_cb(void *user, const struct sk_token_event *ev);
/* Generates n tokens in session s into out (and *ret, if not NULL). */
void gen(struct sk_client *c, uint64_t s, uint32_t n, double temperature, bool seeded,
         uint64_t seed, struct ids *out, struct sk_generate_result *ret);
void append_text(struct sk_client *c, uint64_t s, const char *text);
/* The resident tokens of session s (malloc'd, *n of them). */
int32_t *tokens_of(struct sk_client *c, uint64_t s, size_t *n);
struct sk_session_stats sstats(struct sk_client *c, uint64_t s);
/* How often needle stands in the daemon's log; whether it does. */
int log_count(const char *needle);
bool log_has(const char *needle);
/* Bytes of the session objects in the state directory. */
uint64_t state_dir_bytes(void);
/* Per-test teardown: whatever happened, the daemon does not outlive the
 * test. */
int test_teardown(void **state);

#endif
