/* The server's state, shared by the modules of daemon/server/ (top
 * first): server.c (the server's life: start, connections' hooks,
 * adoption, reload, idle TTL, shutdown), ops.c (the op handlers), copy.c
 * (the work on libuv's thread pool), jobs.c (the jobs of sessions) and
 * replies.c (every reply built from the daemon's state). Each writes only
 * its own fields, named below. Not for other modules: they use server.h.
 */
#ifndef SK_SERVER_STATE_H
#define SK_SERVER_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "net/conn.h"
#include "net/listen.h"
#include "server/copy.h"
#include "server/server.h"
#include "session/scheduler.h"
#include "session/session.h"

struct sk_server {
  /* server.c */
  uv_loop_t *loop;
  struct sk_server_config cfg;
  const struct sk_model *model;
  const struct sk_tokenizer *tok;
  struct sk_listen listen;     /* the socket clients connect to */
  uint32_t start_max_sessions; /* sizes fixed at start */
  uint32_t start_max_capacity;
  struct sk_scheduler *scheduler; /* the compute thread */
  struct sk_session_table sessions;
  struct sk_conns conns;       /* the clients */
  uint64_t started_ms;
  bool shutting_down;
  uint32_t n_adopted;          /* sessions adopted at start */
  uint32_t n_set_aside;        /* objects set aside at start */
  uint32_t n_temp_closed;      /* temporary sessions found at start, closed */
  char chat_error[SK_ERROR_MESSAGE_MAX]; /* cfg.chat_error, copied */
  char *model_path, *socket_path; /* owned copies; cfg's point at them */
  uv_timer_t ttl_timer;
  bool ttl_running;
  /* How jobs.c starts a fork or export of the idle session s in a
   * worker (copy.c's sk_copy_start): true if started (s stays busy until
   * it is done), else the error was answered and the caller frees job. */
  bool (*start_copy)(struct sk_server *srv, struct sk_session *s, struct sk_job *job);

  /* copy.c */
  struct sk_copies copies;     /* thread-pool work in flight */
};

#endif
