/* Helpers for tests that drive a live sinkd: start/stop the daemon of the
 * build on a fresh socket, raw connections, framed msgpack requests built
 * byte by byte, replies, and the daemon's resource figures from /proc. */
#ifndef SK_TESTDAEMON_H
#define SK_TESTDAEMON_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

struct sk_test_daemon {
  pid_t pid;
  char *dir;                                            /* malloc'd tmpdir */
  char socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
  char log[4096];
  char state[4200];  /* --state-dir: /dev/shm/sinkd-test.XXXXXX/state, or DIR/state */
  char state_root[64];
};

/* Starts $SK_SINKD (under $SK_SINKD_WRAPPER, split on spaces, if set) with
 * --model $SK_MODEL --socket DIR/sinkd.sock --state-dir (on tmpfs if any)
 * --threads 1 --config /dev/null and the
 * NULL-terminated extra arguments; waits until it answers a ping (fails the
 * test after a minute). stderr goes to DIR/sinkd.log. */
void sk_test_daemon_start(struct sk_test_daemon *d, const char *const *extra);
/* SIGTERM, then waits; returns the wait status (fails the test if it does
 * not exit within ms milliseconds). Removes the directory. */
int sk_test_daemon_stop(struct sk_test_daemon *d, int ms);
/* Prints the daemon's log to stderr (for failure messages). */
void sk_test_daemon_dump_log(const struct sk_test_daemon *d);
/* true if the process has not exited (reaps it if it has). */
bool sk_test_daemon_alive(struct sk_test_daemon *d);

/* Figures of a process from /proc: resident set (VmRSS) and its peak
 * (VmHWM) in KiB, and open file descriptors. -1 if unreadable. */
long sk_test_proc_rss_kib(pid_t pid);
long sk_test_proc_hwm_kib(pid_t pid);
long sk_test_proc_fds(pid_t pid);
/* Resets VmHWM to the current VmRSS (/proc/PID/clear_refs "5"); false if
 * the kernel refuses. */
bool sk_test_proc_reset_hwm(pid_t pid);

/* True when the tests run under a sanitizer or valgrind (SK_TEST_TOOL set
 * by the meson test setup): memory figures then measure the tool's
 * allocator (ASan's quarantine, valgrind's redzones), and wall-clock
 * figures its slowdown, so assertions on them are relaxed where noted. */
bool sk_test_under_tool(void);

struct sk_client;
/* A libsinkd client connected to socket_path with a reply timeout of
 * 120 s (a slow machine, a tool's slowdown); fails the test naming the
 * error if it cannot connect. Free with sk_client_free. */
struct sk_client *sk_test_connect(const char *socket_path);

struct sk_generate_params;
/* Greedy decoding of exactly max_tokens tokens: the protocol's defaults
 * (sk_generate_params_init) with temperature 0 and ignore_eos. */
void sk_test_greedy_params(struct sk_generate_params *gp, uint32_t max_tokens);

/* Seconds on the monotonic clock. */
double sk_test_now(void);

/* A connected raw socket with a receive timeout of timeout_ms. */
int sk_test_raw_connect(const char *socket_path, int timeout_ms);
/* Writes everything (fails the test on error). */
void sk_test_write_all(int fd, const void *p, size_t n);
/* Like write_all but returns false instead of failing (EPIPE etc.). */
bool sk_test_try_write_all(int fd, const void *p, size_t n);

/* A frame being built: 4 header bytes patched by sk_test_req_frame. */
struct sk_test_req {
  msgpack_sbuffer sb;
  msgpack_packer pk;
};
void sk_test_req_init(struct sk_test_req *r);
void sk_test_req_free(struct sk_test_req *r);
/* Patches the header with the body length; returns the whole frame. */
const uint8_t *sk_test_req_frame(struct sk_test_req *r, size_t *ret_len);
/* Appends raw bytes to the body. */
void sk_test_req_raw(struct sk_test_req *r, const void *p, size_t n);
/* Packs a string key. */
void sk_test_req_key(struct sk_test_req *r, const char *key);

/* Reads one frame body: 1 and a malloc'd body, 0 if the peer closed the
 * connection (cleanly, or reset), -1 on timeout. A partial frame before
 * the close counts as closed. */
int sk_test_read_frame(int fd, uint8_t **ret_body, uint32_t *ret_len);

/* A reply read from a raw connection. */
struct sk_test_reply {
  bool closed;        /* the daemon closed the connection (no frame) */
  bool timed_out;     /* nothing within the timeout */
  uint64_t id;
  bool is_event;      /* {"id", "event": ...} */
  bool ok;
  char code[64];      /* error code, "" if ok */
  char message[256];  /* error message */
  uint32_t body_len;
  uint8_t *body;      /* owned; the parsed map points into it */
  msgpack_zone zone;
  msgpack_object root; /* the reply map (type NIL if none) */
};
/* Reads one frame. Fails the test on a malformed frame from the daemon. */
void sk_test_read_reply(int fd, struct sk_test_reply *ret);
/* Reads frames until a final reply (not an event) arrives; *ret_events
 * (may be NULL) counts the token events skipped. */
void sk_test_read_final(int fd, struct sk_test_reply *ret, size_t *ret_events);
/* Unsigned field of the reply (fails the test if absent or mistyped). */
uint64_t sk_test_reply_u64(const struct sk_test_reply *r, const char *key);
void sk_test_reply_free(struct sk_test_reply *r);

#endif
