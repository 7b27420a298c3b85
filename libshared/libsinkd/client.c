/* libsinkd: blocking client for the sinkd protocol (sinkd-protocol(7)).
 *
 * One request at a time: each call builds a request frame with a fresh id,
 * sends it, then reads frames until the final reply with that id. The only
 * other frames allowed meanwhile are the token events of a running
 * generate and the reply to the cancel sent on its behalf; anything else
 * means client and daemon disagree about the conversation, so the
 * connection is closed with -SK_ERR_PROTOCOL.
 */
#include "sinkd/client.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto/msg.h"
#include "proto/wire.h"

/* Bytes read from the socket per recv(). */
#define SK__CLIENT_READ_CHUNK 65536u

struct sk_client {
  int fd;                        /* -1 once a transport error closed it */
  uint64_t next_id;              /* id of the next request, from 1 */
  unsigned int timeout_ms;       /* 0 = none */
  struct sk_frame_reader reader; /* reply frames, up to the ceiling */
  uint8_t rbuf[SK__CLIENT_READ_CHUNK];
};

/* ---- connection ------------------------------------------------------- */

const char *sk_client_default_socket(void) {
  static char path[PATH_MAX];
  const char *env = getenv("SINKD_SOCKET");
  if (env && *env) return env;
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg) {
    int n = snprintf(path, sizeof path, "%s/sinkd/sinkd.sock", xdg);
    struct stat st;
    if (n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0) return path;
  }
  return SK_CLIENT_DEFAULT_SOCKET;
}

/* The message for a socket nobody answers on: how to start the daemon
 * that owns that path (the system one at the default path, the per-user
 * one under $XDG_RUNTIME_DIR, else one of the caller's own); a path that
 * is there but no socket says what it is. */
static int sk__client_not_running(const char *path, int e, struct sk_error *err) {
  struct stat st;
  if (e == ECONNREFUSED && stat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
    return sk_error_set(err, SK_ERR_IO, "cannot connect to %s: not a socket but a %s", path,
                        S_ISDIR(st.st_mode) ? "folder" : S_ISREG(st.st_mode) ? "file"
                                                                              : "special file");
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  size_t xl = xdg ? strlen(xdg) : 0;
  bool user = xl && strncmp(path, xdg, xl) == 0 && strcmp(path + xl, "/sinkd/sinkd.sock") == 0;
  const char *why = e == ENOENT ? "no such file" : "connection refused";
  if (!user && strcmp(path, SK_CLIENT_DEFAULT_SOCKET) != 0)
    return sk_error_set(err, SK_ERR_IO,
                        "cannot connect to %s: %s (is sinkd running? start one there with "
                        "`sinkd --model FILE --socket %s`)",
                        path, why, path);
  return sk_error_set(err, SK_ERR_IO,
                      "cannot connect to %s: %s (is sinkd running? start it with %s, "
                      "or run `sinkd --model FILE`)",
                      path, why,
                      user ? "`systemctl --user start sinkd.socket`"
                           : "`sudo systemctl start sinkd.socket`");
}

/* Whether this process has gid among its groups. */
static bool sk__client_in_group_now(gid_t gid) {
  if (getegid() == gid) return true;
  gid_t groups[256];
  int n = getgroups((int)(sizeof groups / sizeof groups[0]), groups);
  for (int i = 0; i < n; i++)
    if (groups[i] == gid) return true;
  return false;
}

/* Whether the group database lists this user in group gr. */
static bool sk__client_listed_in(const struct group *gr) {
  char buf[1024];
  struct passwd pw, *pwp = NULL;
  if (getpwuid_r(getuid(), &pw, buf, sizeof buf, &pwp) != 0 || !pwp) return false;
  if (pwp->pw_gid == gr->gr_gid) return true;
  for (char **m = gr->gr_mem; m && *m; m++)
    if (strcmp(*m, pwp->pw_name) == 0) return true;
  return false;
}

/* The message for EACCES: which permission is missing and what to do.
 * Connecting needs write permission on the socket file (mode 0660, group
 * sinkd for the system daemon) and search permission on its folders. */
static int sk__client_denied(const char *path, struct sk_error *err) {
  struct stat st;
  if (stat(path, &st) < 0)
    return sk_error_set(err, SK_ERR_IO,
                        "cannot connect to %s: permission denied on a folder of "
                        "the path (%s)",
                        path, strerror(errno));
  if (!S_ISSOCK(st.st_mode)) return sk__client_not_running(path, ECONNREFUSED, err);
  char gbuf[4096];
  struct group gr, *grp = NULL;
  char gname[64];
  if (getgrgid_r(st.st_gid, &gr, gbuf, sizeof gbuf, &grp) == 0 && grp)
    snprintf(gname, sizeof gname, "%s", grp->gr_name);
  else
    snprintf(gname, sizeof gname, "%u", (unsigned)st.st_gid);
  unsigned mode = (unsigned)st.st_mode & 07777;
  if (!(st.st_mode & S_IWGRP))
    return sk_error_set(err, SK_ERR_IO,
                        "cannot connect to %s: permission denied (mode %04o: only "
                        "its owner may connect)",
                        path, mode);
  if (grp && sk__client_listed_in(grp) && !sk__client_in_group_now(st.st_gid))
    return sk_error_set(err, SK_ERR_IO,
                        "cannot connect to %s: permission denied (mode %04o, group "
                        "'%s'): you were added to group '%s' after this session "
                        "started; log in again (or run `newgrp %s`)",
                        path, mode, gname, gname, gname);
  if (st.st_gid == 0) /* no user should join root's group to connect */
    return sk_error_set(err, SK_ERR_IO,
                        "cannot connect to %s: permission denied (mode %04o, group "
                        "'%s'): only its owner and group may connect; ask them for "
                        "another group, or run your own sinkd with --socket",
                        path, mode, gname);
  return sk_error_set(err, SK_ERR_IO,
                      "cannot connect to %s: permission denied (mode %04o, group "
                      "'%s'): join the group with `sudo usermod -aG %s $USER`, "
                      "then log in again",
                      path, mode, gname, gname);
}

/* Milliseconds of the monotonic clock. */
static uint64_t sk__client_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* How often a connect that waits for a starting daemon tries again. */
#define SK__CLIENT_WAIT_STEP_MS 50

int sk_client_connect_wait(const char *path, unsigned int wait_ms,
                           struct sk_client **ret_client, struct sk_error *err) {
  if (!path) path = sk_client_default_socket();
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  size_t plen = strlen(path);
  if (plen == 0 || plen >= sizeof addr.sun_path)
    return sk_error_set(err, SK_ERR_IO,
                        "cannot connect to %s: the path must be 1 to %zu "
                        "bytes long",
                        path, sizeof addr.sun_path - 1);
  memcpy(addr.sun_path, path, plen + 1);

  struct sk_client *client = malloc(sizeof *client);
  if (!client) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  /* A daemon that is starting (wait_ms): its socket is not there yet, or
   * not listening yet; tried again every SK__CLIENT_WAIT_STEP_MS. */
  const uint64_t t0 = sk__client_now_ms();
  int e = 0;
  for (;;) {
    client->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (client->fd < 0) {
      e = errno;
      free(client);
      return sk_error_set(err, SK_ERR_IO, "cannot create a socket: %s", strerror(e));
    }
    if (connect(client->fd, (const struct sockaddr *)&addr, sizeof addr) == 0) {
      e = 0;
      break;
    }
    e = errno;
    close(client->fd);
    if (!(e == ENOENT || e == ECONNREFUSED) || sk__client_now_ms() - t0 >= wait_ms) break;
    struct timespec ts = {0, SK__CLIENT_WAIT_STEP_MS * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (e) {
    free(client);
    if (wait_ms && (e == ENOENT || e == ECONNREFUSED)) {
      sk__client_not_running(path, e, err);
      char msg[SK_ERROR_MESSAGE_MAX];
      memcpy(msg, err->message, sizeof msg);
      return sk_error_set(err, SK_ERR_IO, "%.*s; waited %u.%03u s", (int)sizeof msg - 24, msg,
                          wait_ms / 1000, wait_ms % 1000);
    }
    switch (e) {
    case ENOENT:
    case ECONNREFUSED:
      return sk__client_not_running(path, e, err);
    case EACCES:
    case EPERM:
      return sk__client_denied(path, err);
    default:
      return sk_error_set(err, SK_ERR_IO, "cannot connect to %s: %s", path,
                          strerror(e));
    }
  }
  client->next_id = 1;
  client->timeout_ms = 0;
  sk_frame_reader_init(&client->reader, SK_FRAME_MAX_CEILING);
  if (wait_ms) {
    /* Ready once it answers: a service manager's socket accepts before
     * the daemon behind it has loaded its model. */
    const uint64_t spent = sk__client_now_ms() - t0;
    const unsigned left = spent < wait_ms ? (unsigned)(wait_ms - spent) : 1;
    int rc = sk_client_set_timeout(client, left, err);
    if (rc == 0) rc = sk_client_ping(client, err);
    if (rc == 0) rc = sk_client_set_timeout(client, 0, err);
    if (rc < 0) {
      char msg[SK_ERROR_MESSAGE_MAX];
      memcpy(msg, err->message, sizeof msg);
      sk_client_free(client);
      return sk_error_set(err, SK_ERR_IO, "%s did not answer within %u.%03u s: %s", path,
                          wait_ms / 1000, wait_ms % 1000, msg);
    }
  }
  *ret_client = client;
  return 0;
}

int sk_client_connect(const char *path, struct sk_client **ret_client,
                      struct sk_error *err) {
  return sk_client_connect_wait(path, 0, ret_client, err);
}

void sk_client_free(struct sk_client *client) {
  if (!client) return;
  if (client->fd >= 0) close(client->fd);
  sk_frame_reader_free(&client->reader);
  free(client);
}

bool sk_client_connected(const struct sk_client *client) {
  return client && client->fd >= 0;
}

/* A transport failure: the stream can no longer be trusted to be in step,
 * so the connection is closed. Returns -code. */
static int sk__client_fail(struct sk_client *client, struct sk_error *err, int code,
                           const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int sk__client_fail(struct sk_client *client, struct sk_error *err, int code,
                           const char *fmt, ...) {
  if (client->fd >= 0) {
    close(client->fd);
    client->fd = -1;
  }
  va_list ap;
  va_start(ap, fmt);
  int rc = sk_error_setv(err, code, fmt, ap);
  va_end(ap);
  return rc;
}

int sk_client_set_timeout(struct sk_client *client, unsigned int ms,
                          struct sk_error *err) {
  if (client->fd < 0)
    return sk_error_set(err, SK_ERR_DISCONNECTED, "not connected");
  struct timeval tv = {.tv_sec = ms / 1000,
                       .tv_usec = (suseconds_t)(ms % 1000) * 1000};
  if (setsockopt(client->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
      setsockopt(client->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0)
    return sk_error_set(err, SK_ERR_IO, "cannot set the socket timeout: %s",
                        strerror(errno));
  client->timeout_ms = ms;
  return 0;
}

static int sk__client_check(struct sk_client *client, struct sk_error *err) {
  if (!client)
    return sk_error_set(err, SK_ERR_DISCONNECTED, "no client");
  if (client->fd < 0)
    return sk_error_set(err, SK_ERR_DISCONNECTED,
                        "not connected (an earlier error closed the "
                        "connection)");
  return 0;
}

/* ---- frames ----------------------------------------------------------- */

/* The id of the next request: every request packs one (wire.h's
 * sk_wire_pack_*_req) into a frame that sk__client_send sends. */
static uint64_t sk__client_id(struct sk_client *client) {
  return client->next_id++;
}

/* The result rc of a request packer (b freed on failure). */
static int sk__client_packed(int rc, struct sk_error *err) {
  if (rc < 0) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory building the request");
  return 0;
}

/* Finishes and sends a request frame; frees b either way. */
static int sk__client_send(struct sk_client *client, struct sk_msgbuf *b,
                           struct sk_error *err) {
  int64_t size = sk_msgbuf_finish(b);
  if (size < 0) {
    sk_msgbuf_free(b);
    return sk_error_set(err, (int)-size,
                        size == -SK_ERR_TOO_LARGE
                            ? "request too large for one frame"
                            : "out of memory building the request");
  }
  const char *p = b->sbuf.data;
  size_t left = (size_t)size;
  while (left > 0) {
    ssize_t n = send(client->fd, p, left, MSG_NOSIGNAL);
    if (n < 0) {
      int e = errno;
      if (e == EINTR) continue;
      sk_msgbuf_free(b);
      if (e == EPIPE || e == ECONNRESET)
        return sk__client_fail(client, err, SK_ERR_DISCONNECTED,
                               "the daemon closed the connection");
      if (e == EAGAIN || e == EWOULDBLOCK)
        return sk__client_fail(client, err, SK_ERR_IO,
                               "timed out sending to the daemon (%u ms)",
                               client->timeout_ms);
      return sk__client_fail(client, err, SK_ERR_IO,
                             "cannot send to the daemon: %s", strerror(e));
    }
    p += n;
    left -= (size_t)n;
  }
  sk_msgbuf_free(b);
  return 0;
}

/* Reads the next frame from the daemon into *msg (which the caller frees
 * with sk_msg_free) and its id into *ret_id. Everything that goes wrong
 * here is a transport failure. */
static int sk__client_recv(struct sk_client *client, struct sk_msg *msg,
                           uint64_t *ret_id, struct sk_error *err) {
  for (;;) {
    const uint8_t *body;
    size_t len;
    int rc = sk_frame_reader_next(&client->reader, &body, &len);
    if (rc == -SK_ERR_TOO_LARGE)
      return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                             "the daemon sent a frame of %zu bytes (limit "
                             "%u)",
                             len, (unsigned)SK_FRAME_MAX_CEILING);
    if (rc == 1) {
      struct sk_error perr;
      rc = sk_msg_parse(body, len, msg, &perr);
      if (rc == -SK_ERR_NO_MEMORY)
        return sk__client_fail(client, err, SK_ERR_NO_MEMORY,
                               "out of memory reading a reply");
      if (rc < 0)
        return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                               "invalid reply from the daemon: %s",
                               perr.message);
      rc = sk_wire_unpack_id(&msg->root, ret_id, &perr);
      if (rc < 0) {
        sk_msg_free(msg);
        return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                               "invalid reply from the daemon: %s",
                               perr.message);
      }
      return 0;
    }

    ssize_t n = recv(client->fd, client->rbuf, sizeof client->rbuf, 0);
    if (n == 0)
      return sk__client_fail(client, err, SK_ERR_DISCONNECTED,
                             "the daemon closed the connection");
    if (n < 0) {
      int e = errno;
      if (e == EINTR) continue;
      if (e == EAGAIN || e == EWOULDBLOCK)
        return sk__client_fail(client, err, SK_ERR_IO,
                               "timed out waiting for the daemon (%u ms)",
                               client->timeout_ms);
      if (e == ECONNRESET)
        return sk__client_fail(client, err, SK_ERR_DISCONNECTED,
                               "the daemon closed the connection");
      return sk__client_fail(client, err, SK_ERR_IO,
                             "cannot read from the daemon: %s", strerror(e));
    }
    if (sk_frame_reader_feed(&client->reader, client->rbuf, (size_t)n) < 0)
      return sk__client_fail(client, err, SK_ERR_NO_MEMORY,
                             "out of memory reading a reply");
  }
}

/* A reply that breaks the protocol (wrong type of a field, ...). */
static int sk__client_bad_reply(struct sk_client *client, struct sk_error *err,
                                const char *what) {
  return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                         "invalid reply from the daemon: %s", what);
}

/* The result of a wire decoder: a malformed reply closes the connection
 * like any protocol error; other errors (no memory) are passed on. */
static int sk__client_wire(struct sk_client *client, int rc, const struct sk_error *perr,
                           struct sk_error *err) {
  if (rc == -SK_ERR_PROTOCOL) return sk__client_bad_reply(client, err, perr->message);
  if (rc < 0) return sk_error_set(err, -rc, "%s", perr->message);
  return 0;
}

/* Looks at "ok" of a final reply: 0 if true; the daemon's error (code
 * mapped, message kept) if false. The connection stays usable after an
 * error reply. */
static int sk__client_status(struct sk_client *client, const struct sk_msg *msg,
                             struct sk_error *err) {
  struct sk_error perr;
  bool ok = false;
  if (sk_wire_unpack_ok(&msg->root, &ok, &perr) < 0)
    return sk__client_bad_reply(client, err, perr.message);
  if (ok) return 0;
  struct sk_error daemon;
  sk_wire_unpack_error(&msg->root, &daemon);
  return sk_error_set(err, daemon.code, "%s", daemon.message);
}

/* Sends the request in b (freed) and reads its final reply into *reply,
 * which the caller frees with sk_msg_free on success. An error reply is
 * returned as its code (reply already freed). A reply with id 0 and ok
 * false is the daemon refusing a frame it could not read (for example one
 * above its frame limit): it answers this request. */
static int sk__client_call(struct sk_client *client, struct sk_msgbuf *b,
                           uint64_t id, struct sk_msg *reply,
                           struct sk_error *err) {
  int rc = sk__client_send(client, b, err);
  if (rc < 0) return rc;
  uint64_t got;
  rc = sk__client_recv(client, reply, &got, err);
  if (rc < 0) return rc;
  if (got != id && got != 0) {
    sk_msg_free(reply);
    return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                           "reply with id %" PRIu64 " while waiting for %" PRIu64,
                           got, id);
  }
  rc = sk__client_status(client, reply, err);
  if (rc == 0 && got == 0) {
    rc = sk__client_fail(client, err, SK_ERR_PROTOCOL,
                         "reply with id 0 while waiting for %" PRIu64, id);
  }
  if (rc < 0) sk_msg_free(reply);
  return rc;
}

/* ---- simple ops ------------------------------------------------------- */

/* A request with only id and op, reply into *reply. */
static int sk__client_simple(struct sk_client *client, enum sk_op op,
                             struct sk_msg *reply, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_req(&b, id, op), err)) < 0) return rc;
  return sk__client_call(client, &b, id, reply, err);
}

/* A request with id, op and session. */
static int sk__client_on_session(struct sk_client *client, enum sk_op op,
                                 uint64_t session, struct sk_msg *reply,
                                 struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_session_req(&b, id, op, session), err)) < 0)
    return rc;
  return sk__client_call(client, &b, id, reply, err);
}

int sk_client_ping(struct sk_client *client, struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_simple(client, SK_OP_PING, &reply, err);
  if (rc < 0) return rc;
  sk_msg_free(&reply);
  return 0;
}

int sk_client_hello(struct sk_client *client, struct sk_hello *ret,
                    struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_simple(client, SK_OP_HELLO, &reply, err);
  if (rc < 0) return rc;
  struct sk_hello h;
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_hello(&reply.root, &h, &perr), &perr, err);
  if (rc == 0) *ret = h;
  sk_msg_free(&reply);
  return rc;
}

int sk_client_stats(struct sk_client *client, struct sk_daemon_stats *ret,
                    struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_simple(client, SK_OP_STATS, &reply, err);
  if (rc < 0) return rc;
  struct sk_daemon_stats s;
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_daemon_stats(&reply.root, &s, &perr), &perr, err);
  if (rc == 0) *ret = s;
  sk_msg_free(&reply);
  return rc;
}

/* ---- sessions --------------------------------------------------------- */

int sk_client_open(struct sk_client *client,
                   const struct sk_open_params *params,
                   struct sk_open_result *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_open_params none;
  memset(&none, 0, sizeof none);
  const struct sk_open_params *p = params ? params : &none;
  size_t pin_len = p->pin ? (p->pin_len ? p->pin_len : strlen(p->pin)) : 0;
  if (p->pin && p->pin_tokens)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "give either a pin text or pin tokens, not both");
  if (!p->pin_tokens && p->n_pin_tokens > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "pin_tokens is NULL");
  if (pin_len > UINT32_MAX || p->n_pin_tokens > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "pin too long");
  if (p->rope_scale < 0 || p->rope_scale != p->rope_scale)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "rope_scale must be > 0");
  if (!(p->sparsity >= 0 && p->sparsity < 1))
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "sparsity must be in [0, 1)");
  bool has_pin_tokens = p->pin_tokens && p->n_pin_tokens > 0;
  size_t system_len = p->system ? (p->system_len ? p->system_len : strlen(p->system)) : 0;
  if (system_len > UINT32_MAX) return sk_error_set(err, SK_ERR_TOO_LARGE, "system too long");
  /* A 0 or NULL field is the daemon's default: left out. */
  const struct sk_wire_open_req req = {
      .policy = p->policy, .policy_len = p->policy ? strlen(p->policy) : 0,
      .has_n_sink = p->n_sink || p->has_n_sink, .n_sink = p->n_sink,
      .has_window = p->window != 0, .window = p->window,
      .has_heavy = p->heavy != 0, .heavy = p->heavy,
      .has_recent = p->recent != 0, .recent = p->recent,
      .has_capacity = p->capacity != 0, .capacity = p->capacity,
      .has_rope_scale = p->rope_scale != 0, .rope_scale = p->rope_scale,
      .pin = p->pin, .pin_len = pin_len,
      .has_temporary = p->temporary, .temporary = p->temporary,
      .chat_template = p->chat_template,
      .chat_template_len = p->chat_template ? strlen(p->chat_template) : 0,
      .system = p->system, .system_len = system_len,
      .has_sparsity = p->sparsity != 0, .sparsity = p->sparsity,
      .pin_tokens = {.has = has_pin_tokens, .ids = p->pin_tokens, .n = p->n_pin_tokens},
      .spec = {.mode = p->speculation, .mode_len = p->speculation ? strlen(p->speculation) : 0,
               .has_tokens = p->draft_tokens != 0, .tokens = p->draft_tokens,
               .has_fixed = p->draft_fixed, .fixed = p->draft_fixed},
  };
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_open_req(&b, id, &req), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;

  struct sk_open_result o;
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_open(&reply.root, &o, &perr), &perr, err);
  if (rc == 0 && ret) *ret = o;
  sk_msg_free(&reply);
  return rc;
}

int sk_client_close_session(struct sk_client *client, uint64_t session,
                            struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, SK_OP_CLOSE, session, &reply, err);
  if (rc < 0) return rc;
  sk_msg_free(&reply);
  return 0;
}

int sk_client_list(struct sk_client *client,
                   struct sk_session_info **ret_sessions, size_t *ret_n,
                   struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_simple(client, SK_OP_LIST, &reply, err);
  if (rc < 0) return rc;
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_list(&reply.root, &rows, &n, &perr), &perr, err);
  if (rc == 0) {
    *ret_sessions = rows;
    *ret_n = n;
  }
  sk_msg_free(&reply);
  return rc;
}

/* A float array field into dst[max]; *ret_n entries copied. */
int sk_client_session_stats(struct sk_client *client, uint64_t session,
                            struct sk_session_stats *ret,
                            struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, SK_OP_STATS, session, &reply, err);
  if (rc < 0) return rc;
  struct sk_session_stats *s = malloc(sizeof *s); /* ~3 KiB */
  if (!s) {
    sk_msg_free(&reply);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_session_stats(&reply.root, s, &perr), &perr, err);
  if (rc == 0) *ret = *s;
  free(s);
  sk_msg_free(&reply);
  return rc;
}

/* ---- append ----------------------------------------------------------- */

/* Reads an append reply; with logprobs (n entries) also its
 * log-probabilities (nil -> NaN). Frees the reply. */
static int sk__client_append_reply(struct sk_client *client, struct sk_msg *reply,
                                   struct sk_append_result *ret,
                                   double *logprobs, size_t n,
                                   struct sk_error *err) {
  struct sk_append_result a;
  struct sk_error perr;
  int rc = sk__client_wire(client, sk_wire_unpack_append(&reply->root, &a, logprobs, n, &perr),
                           &perr, err);
  if (rc == 0 && ret) *ret = a;
  sk_msg_free(reply);
  return rc;
}

/* The "bos" and "parse_special" of an input, from bos. */
static void sk__client_bos(struct sk_wire_input *in, enum sk_bos bos) {
  in->bos = (bos & 3) == SK_BOS_DEFAULT ? -1 : (bos & 3) == SK_BOS_TRUE;
  in->parse_special = (bos & SK_TEXT_SPECIAL) != 0;
}

/* text: whether SK_TEXT_SPECIAL may go with it (text input only). */
static int sk__client_check_bos(enum sk_bos bos, bool text, struct sk_error *err) {
  unsigned b = (unsigned)bos & ~(text ? (unsigned)SK_TEXT_SPECIAL : 0u);
  if (b != SK_BOS_DEFAULT && b != SK_BOS_TRUE && b != SK_BOS_FALSE)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "invalid bos value %d",
                        (int)bos);
  return 0;
}

int sk_client_append_text(struct sk_client *client, uint64_t session,
                          const char *text, size_t len, enum sk_bos bos,
                          struct sk_append_result *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if ((rc = sk__client_check_bos(bos, true, err)) < 0) return rc;
  if (!text && len > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "text is NULL");
  if (len > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "text of %zu bytes", len);
  struct sk_wire_append_req a = {.session = session,
                                .input = {.text = text ? text : "", .text_len = len}};
  sk__client_bos(&a.input, bos);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_append_req(&b, id, &a), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;
  return sk__client_append_reply(client, &reply, ret, NULL, 0, err);
}

static int sk__client_append_tokens(struct sk_client *client,
                                    uint64_t session, const int32_t *tokens,
                                    size_t n, enum sk_bos bos,
                                    double *logprobs,
                                    struct sk_append_result *ret,
                                    struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if ((rc = sk__client_check_bos(bos, false, err)) < 0) return rc;
  if (!tokens && n > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "tokens is NULL");
  if (n > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu tokens", n);
  struct sk_wire_append_req a = {
      .session = session,
      .input = {.tokens = {.has = true, .ids = tokens, .n = n}},
      .logprobs = logprobs != NULL};
  sk__client_bos(&a.input, bos);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_append_req(&b, id, &a), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;
  return sk__client_append_reply(client, &reply, ret, logprobs, n, err);
}

int sk_client_append_tokens(struct sk_client *client, uint64_t session,
                            const int32_t *tokens, size_t n, enum sk_bos bos,
                            struct sk_append_result *ret,
                            struct sk_error *err) {
  return sk__client_append_tokens(client, session, tokens, n, bos, NULL, ret,
                                  err);
}

int sk_client_append_logprobs(struct sk_client *client, uint64_t session,
                              const int32_t *tokens, size_t n,
                              enum sk_bos bos, double *logprobs,
                              struct sk_append_result *ret,
                              struct sk_error *err) {
  if (!logprobs && n > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "logprobs is NULL");
  double dummy;
  return sk__client_append_tokens(client, session, tokens, n, bos,
                                  logprobs ? logprobs : &dummy, ret, err);
}

/* ---- generate --------------------------------------------------------- */

void sk_generate_params_init(struct sk_generate_params *p) {
  memset(p, 0, sizeof *p);
  p->max_tokens = SK_GENERATE_DEFAULT_MAX_TOKENS;
  p->temperature = SK_GENERATE_DEFAULT_TEMPERATURE;
  p->top_k = SK_GENERATE_DEFAULT_TOP_K;
  p->top_p = SK_GENERATE_DEFAULT_TOP_P;
}

/* Calls cb with one token event frame. Returns the callback's answer
 * (0 = go on) or a negative code for a malformed event. */
static int sk__client_token_event(struct sk_client *client,
                                  const msgpack_object *ev, uint64_t session,
                                  sk_token_cb cb, void *user,
                                  int *ret_stop, struct sk_error *err) {
  struct sk_top_pair top[SK_WIRE_MAX_TOP];
  struct sk_top_logprob toplp[SK_WIRE_MAX_TOP];
  struct sk_token_event te;
  struct sk_error perr;
  int rc = sk__client_wire(client, sk_wire_unpack_token_event(ev, &te, top, toplp, &perr), &perr,
                           err);
  if (rc < 0) return rc;
  te.session = session;
  *ret_stop = cb ? cb(user, &te) : 0;
  return 0;
}

static int sk__client_generate_result(struct sk_client *client,
                                      const msgpack_object *r,
                                      struct sk_generate_result *g,
                                      struct sk_error *err) {
  struct sk_error perr;
  return sk__client_wire(client, sk_wire_unpack_generate(r, g, &perr), &perr, err);
}

static int sk__client_generate(struct sk_client *client, uint64_t session,
                               const struct sk_generate_params *params,
                               const struct sk_chat_message *msgs, size_t n_msgs,
                               sk_token_cb cb, void *user,
                               struct sk_generate_result *ret, struct sk_error *err);

int sk_client_generate(struct sk_client *client, uint64_t session,
                       const struct sk_generate_params *params,
                       sk_token_cb cb, void *user,
                       struct sk_generate_result *ret, struct sk_error *err) {
  return sk__client_generate(client, session, params, NULL, 0, cb, user, ret, err);
}

int sk_client_chat(struct sk_client *client, uint64_t session,
                   const struct sk_chat_message *messages, size_t n,
                   const struct sk_generate_params *params, sk_token_cb cb, void *user,
                   struct sk_generate_result *ret, struct sk_error *err) {
  if (n == 0 || !messages) return sk_error_set(err, SK_ERR_BAD_REQUEST, "no message");
  if (n > UINT32_MAX) return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu messages", n);
  for (size_t i = 0; i < n; i++)
    if (!messages[i].role || !messages[i].content)
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "messages[%zu]: role or content is NULL", i);
  if (params && params->prompt)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "chat takes messages, not a prompt");
  return sk__client_generate(client, session, params, messages, n, cb, user, ret, err);
}

static int sk__client_generate(struct sk_client *client, uint64_t session,
                               const struct sk_generate_params *params,
                               const struct sk_chat_message *msgs, size_t n_msgs,
                               sk_token_cb cb, void *user,
                               struct sk_generate_result *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_generate_params defaults;
  sk_generate_params_init(&defaults);
  const struct sk_generate_params *p = params ? params : &defaults;
  if (p->n_stop > 0 && !p->stop)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "stop is NULL");
  for (size_t i = 0; i < p->n_stop; i++)
    if (!p->stop[i])
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "stop[%zu] is NULL", i);
  if (p->n_stop > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu stop strings", p->n_stop);
  size_t prompt_len = 0;
  if (p->prompt) prompt_len = p->prompt_len ? p->prompt_len : strlen(p->prompt);
  bool has_prompt = p->prompt && prompt_len > 0;

  /* The sampling fields are always sent (sk_generate_params_init holds
   * the protocol's defaults); the optional ones only when set. */
  const struct sk_wire_generate_req req = {
      .messages = {.m = msgs, .n = n_msgs},
      .session = session,
      .max_tokens = p->max_tokens,
      .temperature = p->temperature,
      .top_k = p->top_k,
      .top_p = p->top_p,
      .ignore_eos = p->ignore_eos,
      .has_seed = p->has_seed,
      .seed = p->seed,
      .stop = {.s = p->stop, .n = p->n_stop},
      .input = {.text = has_prompt ? p->prompt : NULL,
                .text_len = has_prompt ? prompt_len : 0,
                .bos = -1,
                .parse_special = has_prompt && p->parse_special},
      .n_top = p->n_top,
      .logprobs = p->logprobs || p->top_logprobs > 0,
      .top_logprobs = p->top_logprobs,
      .spec = {.mode = p->speculation, .mode_len = p->speculation ? strlen(p->speculation) : 0,
               .has_tokens = p->draft_tokens != 0, .tokens = p->draft_tokens,
               .has_fixed = p->draft_fixed, .fixed = p->draft_fixed},
  };
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_generate_req(&b, id, msgs != NULL, &req), err)) < 0)
    return rc;
  if ((rc = sk__client_send(client, &b, err)) < 0) return rc;

  /* Read events until the final reply, and, if the callback asked to
   * stop, also until the reply to our cancel (in whichever order the two
   * arrive), so the next request starts on a clean stream. */
  uint64_t cancel_id = 0;
  bool have_final = false, have_cancel_reply = false;
  int result = 0;
  struct sk_generate_result g;
  memset(&g, 0, sizeof g);
  while (!have_final || (cancel_id != 0 && !have_cancel_reply)) {
    struct sk_msg msg;
    uint64_t got;
    if ((rc = sk__client_recv(client, &msg, &got, err)) < 0) return rc;
    const msgpack_object *r = &msg.root;

    if (got == id && !have_final) {
      struct sk_error perr;
      enum sk_wire_kind kind;
      if (sk_wire_unpack_kind(r, &kind, &perr) < 0) {
        sk_msg_free(&msg);
        return sk__client_bad_reply(client, err, perr.message);
      }
      if (kind != SK_WIRE_REPLY) {
        /* Events other than "token" are for future versions: skipped. */
        if (kind == SK_WIRE_EVENT_TOKEN) {
          int stop = 0;
          rc = sk__client_token_event(client, r, session,
                                      cancel_id ? NULL : cb, user, &stop,
                                      err);
          if (rc < 0) {
            sk_msg_free(&msg);
            return rc;
          }
          if (stop && !cancel_id) {
            struct sk_msgbuf cb_buf;
            cancel_id = sk__client_id(client);
            if ((rc = sk__client_packed(
                     sk_wire_pack_session_req(&cb_buf, cancel_id, SK_OP_CANCEL, session), err)) <
                    0 ||
                (rc = sk__client_send(client, &cb_buf, err)) < 0) {
              sk_msg_free(&msg);
              return rc;
            }
          }
        }
        sk_msg_free(&msg);
        continue;
      }
      have_final = true;
      result = sk__client_status(client, &msg, err);
      if (result == 0) result = sk__client_generate_result(client, r, &g, err);
      sk_msg_free(&msg);
      if (!sk_client_connected(client)) return result;
      continue;
    }
    if (cancel_id != 0 && got == cancel_id && !have_cancel_reply) {
      /* Whatever it says (the generate may have ended by itself), the
       * final reply of the generate is what counts. */
      have_cancel_reply = true;
      sk_msg_free(&msg);
      continue;
    }
    if (got == 0 && !have_final) {
      /* The daemon could not read the request (e.g. too large). */
      have_final = true;
      result = sk__client_status(client, &msg, err);
      sk_msg_free(&msg);
      if (result == 0)
        return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                               "reply with id 0 while waiting for %" PRIu64,
                               id);
      if (!sk_client_connected(client)) return result;
      continue;
    }
    sk_msg_free(&msg);
    return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                           "reply with id %" PRIu64 " while waiting for %" PRIu64,
                           got, id);
  }
  if (result == 0 && ret) *ret = g;
  return result;
}

int sk_client_cancel(struct sk_client *client, uint64_t session,
                     bool *ret_cancelled, struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, SK_OP_CANCEL, session, &reply, err);
  if (rc < 0) return rc;
  struct sk_error perr;
  bool cancelled = false;
  rc = sk__client_wire(client, sk_wire_unpack_cancel(&reply.root, &cancelled, &perr), &perr, err);
  if (rc == 0 && ret_cancelled) *ret_cancelled = cancelled;
  sk_msg_free(&reply);
  return rc;
}


/* ---- persistence ------------------------------------------------------ */

/* Bytes per import chunk to start with; halved while the daemon answers
 * too_large (its frame limit may be set low). */
#define SK__IMPORT_CHUNK (256u * 1024u)
#define SK__IMPORT_CHUNK_MIN 1024u
/* Largest file sk_client_load reads: far above any session cache this
 * daemon can hold, and a bound on what a wrong path can make us read. */
#define SK__LOAD_MAX ((uint64_t)64 << 30)

static int sk__reply_summary(struct sk_client *client, const msgpack_object *r,
                             struct sk_session_summary *ret,
                             struct sk_error *err) {
  struct sk_session_summary s;
  struct sk_error perr;
  int rc = sk__client_wire(client, sk_wire_unpack_summary(r, &s, &perr), &perr, err);
  if (rc == 0 && ret) *ret = s;
  return rc;
}

static int sk__client_summary_op(struct sk_client *client, enum sk_op op,
                                 uint64_t session,
                                 struct sk_session_summary *ret,
                                 struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, op, session, &reply, err);
  if (rc < 0) return rc;
  rc = sk__reply_summary(client, &reply.root, ret, err);
  sk_msg_free(&reply);
  return rc;
}

int sk_client_resume(struct sk_client *client, uint64_t session,
                     struct sk_session_summary *ret, struct sk_error *err) {
  return sk__client_summary_op(client, SK_OP_RESUME, session, ret, err);
}

int sk_client_fork(struct sk_client *client, uint64_t session,
                   struct sk_session_summary *ret, struct sk_error *err) {
  return sk__client_summary_op(client, SK_OP_FORK, session, ret, err);
}

int sk_client_session_tokens(struct sk_client *client, uint64_t session,
                             int32_t **ret_tokens, size_t *ret_n,
                             struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  const struct sk_wire_stats_req st = {.has_session = true, .session = session, .tokens = true};
  if ((rc = sk__client_packed(sk_wire_pack_stats_req(&b, id, &st), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;
  struct sk_error perr;
  int32_t *ids = NULL;
  size_t n = 0;
  rc = sk__client_wire(client, sk_wire_unpack_tokens(&reply.root, &ids, &n, &perr), &perr, err);
  if (rc == 0) {
    *ret_tokens = ids;
    *ret_n = n;
  }
  sk_msg_free(&reply);
  return rc;
}

int sk_client_export(struct sk_client *client, uint64_t session,
                     void **ret_data, size_t *ret_len, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_session_req(&b, id, SK_OP_EXPORT, session), err)) < 0 ||
      (rc = sk__client_send(client, &b, err)) < 0)
    return rc;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    struct sk_msg msg;
    uint64_t got;
    if ((rc = sk__client_recv(client, &msg, &got, err)) < 0) goto fail;
    const msgpack_object *r = &msg.root;
    if (got != id && got != 0) {
      sk_msg_free(&msg);
      rc = sk__client_fail(client, err, SK_ERR_PROTOCOL,
                           "reply with id %" PRIu64 " while waiting for %" PRIu64, got, id);
      goto fail;
    }
    struct sk_error perr;
    enum sk_wire_kind kind = SK_WIRE_REPLY;
    if (got == id && sk_wire_unpack_kind(r, &kind, &perr) < 0) {
      sk_msg_free(&msg);
      rc = sk__client_bad_reply(client, err, perr.message);
      goto fail;
    }
    if (kind != SK_WIRE_REPLY) {
      uint64_t off = UINT64_MAX;
      const char *data;
      size_t n;
      if (kind == SK_WIRE_EVENT_DATA) {
        if (sk_wire_unpack_data_event(r, &off, &data, &n, &perr) < 0 || off != len) {
          sk_msg_free(&msg);
          rc = sk__client_bad_reply(client, err, "export data event out of order");
          goto fail;
        }
        if (len + n > cap) {
          size_t nc = cap ? cap : n;
          while (nc < len + n) nc *= 2;
          char *nb = realloc(buf, nc);
          if (!nb) {
            sk_msg_free(&msg);
            rc = sk__client_fail(client, err, SK_ERR_NO_MEMORY, "out of memory for an export");
            goto fail;
          }
          buf = nb;
          cap = nc;
        }
        memcpy(buf + len, data, n);
        len += n;
      }
      sk_msg_free(&msg);
      continue;
    }
    rc = sk__client_status(client, &msg, err);
    uint64_t bytes = 0;
    if (rc == 0 && got == 0)
      rc = sk__client_fail(client, err, SK_ERR_PROTOCOL,
                           "reply with id 0 while waiting for %" PRIu64, id);
    if (rc == 0 &&
        (rc = sk__client_wire(client, sk_wire_unpack_export(r, &bytes, &perr), &perr, err)) == 0 &&
        bytes != len)
      rc = sk__client_bad_reply(client, err, "export size differs from the data received");
    sk_msg_free(&msg);
    if (rc < 0) goto fail;
    *ret_data = buf;
    *ret_len = len;
    return 0;
  }
fail:
  free(buf);
  return rc;
}

int sk_client_import(struct sk_client *client, const void *data, size_t len,
                     struct sk_session_summary *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if (!data && len > 0) return sk_error_set(err, SK_ERR_BAD_REQUEST, "data is NULL");
  size_t chunk = SK__IMPORT_CHUNK, off = 0;
  for (;;) {
    size_t n = len - off < chunk ? len - off : chunk;
    struct sk_msgbuf b;
    uint64_t id = sk__client_id(client);
    const struct sk_wire_import_req chunk_req = {
        .total = len, .offset = off, .data = (const char *)data + off, .len = n};
    if ((rc = sk__client_packed(sk_wire_pack_import_req(&b, id, &chunk_req), err)) < 0) return rc;
    struct sk_msg reply;
    struct sk_error e2;
    rc = sk__client_call(client, &b, id, &reply, &e2);
    if (rc == -SK_ERR_TOO_LARGE && sk_client_connected(client) && chunk > SK__IMPORT_CHUNK_MIN) {
      /* The daemon's frame limit is lower: the chunk was refused unread
       * and the import stands where it was. */
      chunk /= 2;
      continue;
    }
    if (rc < 0) {
      if (err) *err = e2;
      return rc;
    }
    off += n;
    if (off >= len) {
      rc = sk__reply_summary(client, &reply.root, ret, err);
      sk_msg_free(&reply);
      return rc;
    }
    sk_msg_free(&reply);
  }
}

int sk_client_save(struct sk_client *client, uint64_t session, const char *path,
                   size_t *ret_bytes, struct sk_error *err) {
  void *data = NULL;
  size_t len = 0;
  int rc = sk_client_export(client, session, &data, &len, err);
  if (rc < 0) return rc;
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) {
    free(data);
    return sk_error_set(err, SK_ERR_IO, "path %s is too long", path);
  }
  int fd = mkstemp(tmp); /* mode 0600 */
  if (fd < 0) {
    int e = errno;
    free(data);
    return sk_error_set(err, SK_ERR_IO, "cannot create a file next to %s: %s", path,
                        strerror(e));
  }
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      close(fd);
      unlink(tmp);
      free(data);
      return sk_error_set(err, SK_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
    }
    p += w;
    left -= (size_t)w;
  }
  free(data);
  if (fsync(fd) < 0 || close(fd) < 0) {
    int e = errno;
    unlink(tmp);
    return sk_error_set(err, SK_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
  }
  if (rename(tmp, path) < 0) {
    int e = errno;
    unlink(tmp);
    return sk_error_set(err, SK_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
  }
  if (ret_bytes) *ret_bytes = len;
  return 0;
}

int sk_client_load(struct sk_client *client, const char *path,
                   struct sk_session_summary *ret, struct sk_error *err) {
  /* O_NONBLOCK: a FIFO with no writer is refused below, not waited on */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
  if (!f) {
    int e = errno;
    if (fd >= 0) close(fd);
    return sk_error_set(err, SK_ERR_IO, "cannot open %s: %s", path, strerror(e));
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0 ||
      (uint64_t)sb.st_size > SK__LOAD_MAX) {
    fclose(f);
    if (S_ISREG(sb.st_mode))
      return sk_error_set(err, SK_ERR_IO, "%s is larger than an exported session can be (%llu bytes)",
                          path, (unsigned long long)SK__LOAD_MAX);
    return sk_error_set(err, SK_ERR_IO, "%s is %s, not an exported session file", path,
                        S_ISDIR(sb.st_mode) ? "a folder" : "no regular file");
  }
  size_t len = (size_t)sb.st_size;
  char *data = malloc(len ? len : 1);
  if (!data) {
    fclose(f);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for %zu bytes", len);
  }
  size_t got = len ? fread(data, 1, len, f) : 0;
  int e = ferror(f) ? errno : 0;
  fclose(f);
  if (got != len) {
    free(data);
    return sk_error_set(err, SK_ERR_IO, "cannot read %s: %s", path,
                        e ? strerror(e) : "file changed size");
  }
  int rc = sk_client_import(client, data, len, ret, err);
  free(data);
  return rc;
}

/* ---- tokenizer -------------------------------------------------------- */

int sk_client_tokenize(struct sk_client *client, const char *text,
                       size_t len, enum sk_bos bos, int32_t **ret_tokens,
                       size_t *ret_n, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if ((rc = sk__client_check_bos(bos, true, err)) < 0) return rc;
  if (!text && len > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "text is NULL");
  if (len > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "text of %zu bytes", len);
  struct sk_wire_input in = {.text = text ? text : "", .text_len = len};
  sk__client_bos(&in, bos);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_tokenize_req(&b, id, &in), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;

  struct sk_error perr;
  int32_t *ids = NULL;
  size_t n = 0;
  rc = sk__client_wire(client, sk_wire_unpack_tokens(&reply.root, &ids, &n, &perr), &perr, err);
  if (rc == 0) {
    *ret_tokens = ids;
    *ret_n = n;
  }
  sk_msg_free(&reply);
  return rc;
}

int sk_client_detokenize(struct sk_client *client, const int32_t *tokens,
                         size_t n, char **ret_text, size_t *ret_len,
                         struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if (!tokens && n > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "tokens is NULL");
  if (n > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu tokens", n);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_detokenize_req(&b, id, tokens, n), err)) < 0)
    return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;

  struct sk_error perr;
  char *text = NULL;
  size_t len = 0;
  rc = sk__client_wire(client, sk_wire_unpack_text(&reply.root, &text, &len, &perr), &perr, err);
  if (rc == 0) {
    *ret_text = text;
    *ret_len = len;
  }
  sk_msg_free(&reply);
  return rc;
}
