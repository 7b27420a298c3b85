#include "net/listen.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/log.h"
#include "sk_limits.h"

/* A socket file exists at path: is a daemon answering on it? */
static bool sk__socket_is_live(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  bool live = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return live;
}

int sk_listen_check_socket(const char *path, struct sk_error *err) {
  struct sockaddr_un a;
  if (strlen(path) >= sizeof a.sun_path)
    return sk_error_set(err, SK_ERR_IO, "socket path '%s' is longer than %zu bytes", path,
                        sizeof a.sun_path - 1);
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return sk_error_set(err, SK_ERR_IO, "%s exists and is not a socket; not replacing it", path);
    if (sk__socket_is_live(path))
      return sk_error_set(err, SK_ERR_BUSY, "%s is in use by a running daemon", path);
  }
  return 0;
}

static void sk__on_connection(uv_stream_t *listener, int status) {
  struct sk_listen *l = listener->data;
  if (status < 0) {
    sk_log(SK_LOG_WARNING, "accept: %s", uv_strerror(status));
    return;
  }
  struct sk_conn *conn = sk_conn_new(l->conns);
  if (!conn) return;
  if (uv_accept(listener, (uv_stream_t *)&conn->pipe) < 0) {
    sk_conn_discard(conn);
    return;
  }
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t cl = sizeof cred;
  uint32_t uid = UINT32_MAX; /* unknown peer: owns nothing, sees nothing */
  if (uv_fileno((uv_handle_t *)&conn->pipe, &fd) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
    uid = cred.uid;
  sk_conn_begin(conn, uid, false);
}

static int sk__bind(struct sk_listen *l, uv_loop_t *loop, struct sk_error *err) {
  const char *path = l->path;
  int rc = sk_listen_check_socket(path, err);
  if (rc < 0) return rc;
  struct stat st;
  if (lstat(path, &st) == 0) { /* a stale socket, by the check above */
    if (unlink(path) < 0)
      return sk_error_set(err, SK_ERR_IO, "cannot remove stale socket %s: %s", path, strerror(errno));
    sk_log(SK_LOG_NOTICE, "removed stale socket %s", path);
  }
  uv_pipe_init(loop, &l->pipe, 0);
  l->pipe.data = l;
  rc = uv_pipe_bind(&l->pipe, path);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&l->pipe, SK_LIMIT_LISTEN_BACKLOG, sk__on_connection);
  if (rc < 0) {
    uv_close((uv_handle_t *)&l->pipe, NULL);
    return sk_error_set(err, SK_ERR_IO, "cannot listen on %s: %s", path, uv_strerror(rc));
  }
  l->open = true;
  l->owns_file = true;
  if (chmod(path, 0660) < 0)
    sk_log(SK_LOG_WARNING, "chmod 0660 %s: %s", path, strerror(errno));
  return 0;
}

/* A listening socket passed by the service manager: used as it is. */
static int sk__open_passed(struct sk_listen *l, uv_loop_t *loop, int fd, struct sk_error *err) {
  uv_pipe_init(loop, &l->pipe, 0);
  l->pipe.data = l;
  int rc = uv_pipe_open(&l->pipe, fd);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&l->pipe, SK_LIMIT_LISTEN_BACKLOG, sk__on_connection);
  if (rc < 0) {
    uv_close((uv_handle_t *)&l->pipe, NULL);
    return sk_error_set(err, SK_ERR_IO, "cannot listen on the socket passed as fd %d: %s", fd,
                        uv_strerror(rc));
  }
  l->open = true;
  return 0;
}

int sk_listen_init(struct sk_listen *l, uv_loop_t *loop, const char *path, int fd,
                   struct sk_conns *conns, struct sk_error *err) {
  memset(l, 0, sizeof *l);
  l->conns = conns;
  if (fd > 0) return sk__open_passed(l, loop, fd, err);
  l->path = strdup(path);
  if (!l->path) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  return sk__bind(l, loop, err);
}

void sk_listen_close(struct sk_listen *l) {
  if (!l->open) return;
  uv_close((uv_handle_t *)&l->pipe, NULL);
  l->open = false;
  if (l->owns_file) unlink(l->path);
}

void sk_listen_free(struct sk_listen *l) {
  free(l->path);
  l->path = NULL;
}

int sk_listen_attach(struct sk_conns *conns, int fd, uint32_t uid, bool held,
                     struct sk_error *err) {
  struct sk_conn *conn = sk_conn_new(conns);
  if (!conn) {
    close(fd);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  int rc = uv_pipe_open(&conn->pipe, fd);
  if (rc < 0) {
    close(fd);
    sk_conn_discard(conn);
    return sk_error_set(err, SK_ERR_IO, "cannot attach a connection: %s", uv_strerror(rc));
  }
  sk_conn_begin(conn, uid, held);
  return 0;
}
