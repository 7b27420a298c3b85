/* The jobs of the server's sessions (see jobs.h). */
#include "server/jobs.h"

#include <stdlib.h>

#include "base/log.h"
#include "server/replies.h"
#include "server/state.h"

void sk_jobs_counts_changed(struct sk_server *srv) {
  if (srv->cfg.on_change)
    srv->cfg.on_change(srv->cfg.user, sk_session_table_count(&srv->sessions),
                       sk_conns_count(&srv->conns));
}

struct sk_job *sk_jobs_new(enum sk_job_kind kind, struct sk_conn *conn, uint64_t req_id,
                           struct sk_session *s) {
  struct sk_job *j = calloc(1, sizeof *j);
  if (!j) {
    sk_conn_send_errorf(conn, req_id, SK_ERR_NO_MEMORY, "out of memory");
    return NULL;
  }
  j->kind = kind;
  j->req_id = req_id;
  j->conn = conn;
  j->sess = s;
  j->bos = -1;
  atomic_init(&j->cancel, false);
  atomic_init(&j->paused, false);
  atomic_init(&j->events_queued, 0);
  return j;
}

void sk_jobs_dispatch(struct sk_server *srv, struct sk_session *s, struct sk_job *job) {
  if (sk_job_is_inline(job)) {
    /* The session is idle: its committed state may be read here (stats),
     * or in a worker while the session is held (fork, export). */
    if (job->conn) {
      if (job->kind == SK_JOB_STATS)
        sk_replies_session_stats(srv, job->conn, job->req_id, s, true);
      else if (srv->start_copy(srv, s, job))
        return; /* the job is the copy's until it is done */
    }
    sk_job_free(job);
    return;
  }
  if (srv->shutting_down) {
    /* The compute thread is gone: answer instead of running. */
    if (job->conn)
      sk_conn_send_errorf(job->conn, job->req_id, SK_ERR_CANCELLED, "the daemon is shutting down");
    sk_job_free(job);
    return;
  }
  if (job->conn && sk_conn_paused(job->conn)) atomic_store(&job->paused, true);
  sk_session_run(s, job);
  sk_scheduler_submit(srv->scheduler, job);
}

void sk_jobs_step(struct sk_server *srv, struct sk_session *s) {
  struct sk_job *j;
  while ((j = sk_session_next(s)) != NULL) sk_jobs_dispatch(srv, s, j);
  if (sk_session_closed(s)) {
    sk_session_remove(&srv->sessions, s);
    sk_jobs_counts_changed(srv);
  }
}

int sk_jobs_enqueue(struct sk_server *srv, struct sk_session *s, struct sk_job *job,
                    struct sk_error *err) {
  int rc = sk_session_enqueue(s, job, err);
  if (rc == 1) sk_jobs_dispatch(srv, s, job);
  return rc < 0 ? rc : 0;
}

void sk_jobs_close(struct sk_server *srv, struct sk_session *s) {
  struct sk_job *q;
  bool idle = sk_session_close(s, &q);
  while (q) {
    struct sk_job *j = q;
    q = j->next;
    if (j->conn)
      sk_conn_send_errorf(j->conn, j->req_id, SK_ERR_CANCELLED, "session %llu was closed",
                          (unsigned long long)sk_session_id(s));
    sk_job_free(j);
  }
  sk_log(SK_LOG_INFO, "session %llu closed", (unsigned long long)sk_session_id(s));
  if (!idle) {
    if (srv->scheduler) sk_scheduler_wake(srv->scheduler); /* NULL once stopping */
  } else {
    sk_session_remove(&srv->sessions, s);
    if (!srv->shutting_down) sk_jobs_counts_changed(srv);
  }
}

void sk_jobs_on_event(void *user, struct sk_event *ev) {
  struct sk_server *srv = user;
  struct sk_job *job = ev->job;
  struct sk_conn *conn = job->conn;
  if (ev->kind == SK_EVENT_TOKEN) {
    if (conn) sk_replies_token(conn, srv->tok, job->req_id, ev);
    free(ev);
    return;
  }
  /* DONE */
  struct sk_session *s = job->sess;
  if (job->is_pin) {
    /* The pinned prefix of an open: the open's reply; a session whose pin
     * did not go in is closed (never half-pinned). */
    if (job->err.code != 0) {
      if (conn) sk_conn_send_error(conn, job->req_id, &job->err);
      sk_session_close_after(s);
    } else if (conn) {
      sk_replies_open(conn, job->req_id, s);
    } else { /* the client left before it learned the id: nothing to keep */
      sk_session_close_after(s);
    }
  } else if (conn) {
    if (job->err.code != 0)
      sk_conn_send_error(conn, job->req_id, &job->err);
    else
      sk_replies_job(srv, job);
  }
  free(ev);
  sk_session_job_done(s);
  sk_jobs_step(srv, s);
}
