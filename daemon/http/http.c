/* The HTTP front end (http.h): the OpenAI gateway handed to the HTTP
 * transport as its route handler. */
#include "http/http.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http/httpd.h"
#include "http/openai.h"
#include "net/listen.h"

struct sk_http {
  struct sk_openai *openai; /* the routes' state: the transport's user */
  struct sk_httpd *httpd;
};

int sk_http_start(uv_loop_t *loop, struct sk_server *srv, const struct sk_http_config *cfg,
                  struct sk_http **ret, struct sk_error *err) {
  struct sk_http *h = calloc(1, sizeof *h);
  if (!h || sk_openai_new(cfg->model_name, &h->openai) < 0) {
    free(h);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  const struct sk_httpd_config hc = {
      .socket_path = cfg->socket_path,
      .listen_fd = cfg->listen_fd,
      .tcp_listen = cfg->tcp_listen,
      .api_key = cfg->api_key,
      .tcp_uid = cfg->tcp_uid,
      .max_body = cfg->max_body,
  };
  int rc = sk_httpd_start(loop, srv, &hc, sk_openai_handle, h->openai, &h->httpd, err);
  if (rc < 0) {
    sk_openai_free(h->openai);
    free(h);
    return rc;
  }
  *ret = h;
  return 0;
}

int sk_http_check(const struct sk_http_config *cfg, struct sk_error *err) {
  int rc;
  if (cfg->socket_path && (rc = sk_listen_check_socket(cfg->socket_path, err)) < 0) return rc;
  if (!cfg->tcp_listen) return 0;
  struct sockaddr_storage addr;
  if ((rc = sk_httpd_parse_address(cfg->tcp_listen, &addr, err)) < 0) return rc;
  int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return sk_error_set(err, SK_ERR_IO, "socket: %s", strerror(errno));
  const int one = 1; /* as libuv binds: a port in TIME_WAIT is free */
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = addr.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                             : sizeof(struct sockaddr_in);
  rc = bind(fd, (struct sockaddr *)&addr, len);
  int e = errno;
  close(fd);
  if (rc < 0)
    return sk_error_set(err, e == EADDRINUSE ? SK_ERR_BUSY : SK_ERR_IO,
                        "cannot listen for HTTP on %s: %s%s", cfg->tcp_listen, strerror(e),
                        e == EADDRINUSE ? " (another program listens there; set http_listen "
                                          "or --http-listen to another port)"
                                        : "");
  return 0;
}

void sk_http_shutdown(struct sk_http *h) {
  if (h) sk_httpd_shutdown(h->httpd);
}

void sk_http_free(struct sk_http *h) {
  if (!h) return;
  sk_httpd_free(h->httpd);
  sk_openai_free(h->openai);
  free(h);
}
