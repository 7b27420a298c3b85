/* The jobs of the server's sessions: a request's work on a session is a
 * job (session.h), queued behind the session's running one and then run:
 * appends and generations on the compute thread (scheduler.h), a stats
 * with tokens here, forks and exports in a worker (copy.c, through the
 * server's start_copy). The scheduler's events end up here: their replies
 * go out (replies.h) and the session takes its next job. Closing a
 * session answers what waited on it. Loop thread.
 */
#ifndef SK_JOBS_H
#define SK_JOBS_H

#include <stdbool.h>
#include <stdint.h>

#include "net/conn.h"
#include "session/scheduler.h"
#include "session/session.h"

struct sk_server;

/* Tells the daemon's owner that the number of sessions or clients
 * changed (the server config's on_change). */
void sk_jobs_counts_changed(struct sk_server *srv);

/* A job of kind for request req_id of conn on session s, to fill and
 * enqueue; NULL after answering "out of memory" to the request. */
struct sk_job *sk_jobs_new(enum sk_job_kind kind, struct sk_conn *conn, uint64_t req_id,
                           struct sk_session *s);

/* Runs job on s now if s is idle, else queues it. Takes job unless it
 * fails. Errors: -SK_ERR_BUSY (the queue is full). */
int sk_jobs_enqueue(struct sk_server *srv, struct sk_session *s, struct sk_job *job,
                    struct sk_error *err);

/* Runs job on the idle session s now: a stats with tokens answered
 * here, a fork or export in a worker, the others on the compute thread
 * (or answered `cancelled` while the daemon shuts down). Takes job. */
void sk_jobs_dispatch(struct sk_server *srv, struct sk_session *s, struct sk_job *job);

/* Runs s's next queued jobs while it is idle; removes s once a close
 * waits for nothing more. */
void sk_jobs_step(struct sk_server *srv, struct sk_session *s);

/* Closes s: queued requests are answered `cancelled`, a running one is
 * cancelled and s is removed when it ends (else now). */
void sk_jobs_close(struct sk_server *srv, struct sk_session *s);

/* The scheduler's event callback (user: the server): a token goes out
 * as its event; a finished job's reply goes out (an append's or a
 * generate's, or for a pinned prefix the open's) and its session takes
 * its next job. Takes ev. */
void sk_jobs_on_event(void *user, struct sk_event *ev);

#endif
