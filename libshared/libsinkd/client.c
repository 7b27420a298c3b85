/* libsinkd: blocking client for the sinkd protocol (sinkd-protocol(7)).
 *
 * One request at a time: each call builds a request frame with a fresh id,
 * sends it, then reads frames until the final reply with that id. The only
 * other frames allowed meanwhile are the token events of a running
 * generate and the reply to the cancel sent on its behalf; anything else
 * means client and daemon disagree about the conversation, so the
 * connection is closed with -SK_ERR_PROTOCOL.
 *
 * This file: connecting, the frames of a request and its reply, and the
 * simple ops; client_requests.c has sessions, append and the tokenizer,
 * client_streams.c generate, chat, cancel and the session transfers.
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
#include "libsinkd/client_int.h"

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

int sk__client_fail(struct sk_client *client, struct sk_error *err, int code,
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

int sk__client_check(struct sk_client *client, struct sk_error *err) {
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
uint64_t sk__client_id(struct sk_client *client) {
  return client->next_id++;
}

/* The result rc of a request packer (b freed on failure). */
int sk__client_packed(int rc, struct sk_error *err) {
  if (rc < 0) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory building the request");
  return 0;
}

/* Finishes and sends a request frame; frees b either way. */
int sk__client_send(struct sk_client *client, struct sk_msgbuf *b,
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
int sk__client_recv(struct sk_client *client, struct sk_msg *msg,
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
int sk__client_bad_reply(struct sk_client *client, struct sk_error *err,
                         const char *what) {
  return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                         "invalid reply from the daemon: %s", what);
}

/* The result of a wire decoder: a malformed reply closes the connection
 * like any protocol error; other errors (no memory) are passed on. */
int sk__client_wire(struct sk_client *client, int rc, const struct sk_error *perr,
                    struct sk_error *err) {
  if (rc == -SK_ERR_PROTOCOL) return sk__client_bad_reply(client, err, perr->message);
  if (rc < 0) return sk_error_set(err, -rc, "%s", perr->message);
  return 0;
}

/* Looks at "ok" of a final reply: 0 if true; the daemon's error (code
 * mapped, message kept) if false. The connection stays usable after an
 * error reply. */
int sk__client_status(struct sk_client *client, const struct sk_msg *msg,
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
int sk__client_call(struct sk_client *client, struct sk_msgbuf *b,
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
int sk__client_simple(struct sk_client *client, enum sk_op op,
                      struct sk_msg *reply, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_req(&b, id, op), err)) < 0) return rc;
  return sk__client_call(client, &b, id, reply, err);
}

/* A request with id, op and session. */
int sk__client_on_session(struct sk_client *client, enum sk_op op,
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
