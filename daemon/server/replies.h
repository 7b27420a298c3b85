/* The replies built from the daemon's state: every reply of the op
 * handlers (ops.c), of the thread-pool work (copy.c) and of the jobs
 * (jobs.c) that is more than an ok, packed with the wire schema
 * (proto/wire.h) and sent to the client. Loop thread.
 */
#ifndef SK_REPLIES_H
#define SK_REPLIES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/conn.h"
#include "session/scheduler.h"
#include "session/session.h"

struct sk_server;

/* hello: the protocol, the model, the defaults of new sessions, how the
 * daemon computes. */
void sk_replies_hello(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id);

/* stats without a session: the daemon's figures, and those of conn's
 * uid. */
void sk_replies_daemon_stats(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id);

/* list: a row for each of the n sessions, in their order. */
void sk_replies_list(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                     struct sk_session *const *sessions, size_t n);

/* The open reply of session s. */
void sk_replies_open(struct sk_conn *conn, uint64_t req_id, const struct sk_session *s);

/* The reply of resume, fork (from: the source) and import (received: the
 * image's bytes) about session s. */
void sk_replies_summary(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                        const struct sk_session *s, uint64_t from, uint64_t received);

/* The stats reply of one session; with tokens, its resident token ids in
 * cache-position order (the session must be idle: a queued stats job).
 * The resident ranges are sent whenever the session is idle. */
void sk_replies_session_stats(struct sk_server *srv, struct sk_conn *conn, uint64_t req_id,
                              struct sk_session *s, bool tokens);

/* A token event of a generate (ev from the scheduler); tok gives the
 * bytes of the tokens whose log-probabilities it carries. */
void sk_replies_token(struct sk_conn *conn, const struct sk_tokenizer *tok, uint64_t req_id,
                      const struct sk_event *ev);

/* The final reply of an append or generate job that succeeded. */
void sk_replies_job(struct sk_server *srv, const struct sk_job *job);

#endif
