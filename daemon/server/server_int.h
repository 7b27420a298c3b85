/* The server's internals, shared by its files: server.c (the op table,
 * request decoding, the jobs of sessions, reload, shutdown, timers),
 * ops.c (the op handlers and their replies) and copy.c (the work done on
 * libuv's thread pool: opens, forks, exports, imports, releases). Not
 * for other modules: they use server.h.
 */
#ifndef SK_SERVER_INT_H
#define SK_SERVER_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "session/scheduler.h"
#include "net/conn.h"
#include "server/copy.h"
#include "net/listen.h"
#include "proto/msg.h"
#include "server/server.h"
#include "session/session.h"

struct sk_server {
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
  struct sk_copies copies;     /* thread-pool work in flight (copy.h) */
  uint64_t started_ms;
  bool shutting_down;
  uint32_t n_adopted;          /* sessions adopted at start */
  uint32_t n_set_aside;        /* objects set aside at start */
  uint32_t n_temp_closed;      /* temporary sessions found at start, closed */
  char chat_error[SK_ERROR_MESSAGE_MAX]; /* cfg.chat_error, copied */
  uv_timer_t ttl_timer;
  bool ttl_running;
};

/* One request being handled: its connection, id and msgpack map. */
struct request {
  struct sk_conn *conn;
  uint64_t id;
  const msgpack_object *map;
};

/* ---- server.c ---- */

/* Tells the owner that the number of sessions or clients changed. */
void sk__counts_changed(struct sk_server *srv);
/* Runs job on the idle session s now: inline ones (stats) answered
 * here, fork and export in a worker (copy.c), the others on the compute
 * thread. Takes job. */
void sk__session_dispatch(struct sk_server *srv, struct sk_session *s, struct sk_job *job);
/* Runs s's next queued jobs while it is idle; frees s once a close
 * waits for nothing more. */
void sk__session_step(struct sk_server *srv, struct sk_session *s);
/* Runs job on s now if it is idle, else queues it. Takes job unless it
 * fails. Errors: -SK_ERR_BUSY (the queue is full). */
int sk__session_enqueue(struct sk_server *srv, struct sk_session *s, struct sk_job *job,
                        struct sk_error *err);
/* Closes s: queued requests are answered `cancelled`, a running one is
 * cancelled and s is removed when it ends (else now). */
void sk__session_close(struct sk_server *srv, struct sk_session *s);
/* Whether uid may own one more session of `bytes` (besides `except`, a
 * session of its already in the table, or NULL); a temporary one may go
 * SK_LIMIT_TEMP_SESSIONS past max_user_sessions. Errors: -SK_ERR_BUSY
 * (the message names the limit and how to free some). */
int sk__check_user_limits(struct sk_server *srv, uint32_t uid, size_t bytes,
                          const struct sk_session *except, bool temporary, struct sk_error *e);
/* Sessions uid owns or is getting (opens and copies in flight), and
 * their bytes, besides except. */
void sk__user_usage(const struct sk_server *srv, uint32_t uid, const struct sk_session *except,
                    uint32_t *ret_n, uint64_t *ret_bytes);

/* ---- ops.c: one handler per op (server.c's op table) ---- */

void sk__op_ping(struct sk_server *srv, const struct request *r);
void sk__op_hello(struct sk_server *srv, const struct request *r);
void sk__op_open(struct sk_server *srv, const struct request *r);
void sk__op_close(struct sk_server *srv, const struct request *r);
void sk__op_list(struct sk_server *srv, const struct request *r);
void sk__op_stats(struct sk_server *srv, const struct request *r);
void sk__op_append(struct sk_server *srv, const struct request *r);
void sk__op_generate(struct sk_server *srv, const struct request *r);
void sk__op_chat(struct sk_server *srv, const struct request *r);
void sk__op_cancel(struct sk_server *srv, const struct request *r);
void sk__op_resume(struct sk_server *srv, const struct request *r);
void sk__op_fork(struct sk_server *srv, const struct request *r);
void sk__op_export(struct sk_server *srv, const struct request *r);
void sk__op_import(struct sk_server *srv, const struct request *r);
void sk__op_tokenize(struct sk_server *srv, const struct request *r);
void sk__op_detokenize(struct sk_server *srv, const struct request *r);

/* The open reply of session s. */
void sk__send_open_reply(struct sk_conn *c, uint64_t req_id, const struct sk_session *s);
/* The stats reply of one session; with tokens, its resident token ids
 * (the session must be idle). */
void sk__send_session_stats(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                            struct sk_session *s, bool tokens);
/* The reply of resume, fork (from: the source) and import (received:
 * the image's bytes) about session s. */
void sk__send_session_summary(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                              const struct sk_session *s, uint64_t from, uint64_t received);
/* The session of a finished open: logged, and answered, or its pinned
 * prefix goes through the model first. Takes pin and the conversation. */
void sk__open_finish(struct sk_server *srv, struct sk_conn *c, uint64_t req_id,
                     struct sk_session *s, int32_t *pin, size_t n_pin, struct sk_conv *conv);

#endif
