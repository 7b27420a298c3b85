/* The server: the op table and request decoding, the jobs of sessions
 * and the scheduler's events, per-user limits, adoption at start, reload,
 * shutdown and the idle-TTL timer. Connections are conn.c's, the socket
 * listen.c's, the op handlers ops.c's, thread-pool work copy.c's. */
#include "server/server_int.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "model/kernels.h"
#include "base/log.h"
#include "sk_limits.h"
#include "proto/wire.h"

/* Tells the owner that the number of sessions or clients changed. */
void sk__counts_changed(struct sk_server *srv) {
  if (srv->cfg.on_change) srv->cfg.on_change(srv->cfg.user, srv->sessions.count, srv->conns.count);
}

/* ---- connections (conn.h hooks) ---- */

/* A slow reader's generation pauses with its reading. */
static void on_conn_pause(void *user, struct sk_conn *c, bool paused) {
  struct sk_server *srv = user;
  for (uint32_t i = 0; i < srv->sessions.cap; i++)
    if (srv->sessions.items[i]) sk_session_pause(srv->sessions.items[i], c, paused);
  if (!paused && srv->scheduler) sk_scheduler_wake(srv->scheduler);
}

static void on_conn_drain(void *user, struct sk_conn *c) {
  (void)user;
  sk_copy_export_pump(c);
}

static void on_conn_close(void *user, struct sk_conn *c) {
  struct sk_server *srv = user;
  /* Work of a client that left: generations stop, appends complete (the
   * session keeps what was sent). No job keeps a pointer to c. */
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    struct sk_session *s = srv->sessions.items[i];
    /* Sessions opened "temporary" on this connection end with it, at
     * shutdown too (a restart would adopt them with nobody to close them). */
    if (s && sk_session_detach(s, c, c->id)) sk__session_close(srv, s);
  }
  if (srv->scheduler) sk_scheduler_wake(srv->scheduler);
  sk_copy_import_drop(srv, c); /* an import in progress goes */
}

static void on_conn_release(void *user, struct sk_conn *c) {
  (void)user;
  sk_copy_peer_free(sk_conn_data(c));
}

static void on_conn_count(void *user, uint32_t n_conns) {
  (void)n_conns;
  sk__counts_changed(user);
}

static void handle_frame(void *user, struct sk_conn *c, const uint8_t *body, size_t len);

/* ---- session work ---- */


void sk__session_dispatch(struct sk_server *srv, struct sk_session *s, struct sk_job *job) {
  if (sk_job_is_inline(job)) {
    /* The session is idle: its committed state may be read here (stats),
     * or in a worker while the session is held (fork, export). */
    if (job->conn) {
      if (job->kind == SK_JOB_STATS)
        sk__send_session_stats(srv, job->conn, job->req_id, s, true);
      else if (sk_copy_start(srv, s, job))
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
  if (job->conn && job->conn->out_paused) atomic_store(&job->paused, true);
  sk_session_run(s, job);
  sk_scheduler_submit(srv->scheduler, job);
}

/* Takes the next queued job, skipping generations whose client left. */
void sk__session_step(struct sk_server *srv, struct sk_session *s) {
  struct sk_job *j;
  while ((j = sk_session_next(s)) != NULL) sk__session_dispatch(srv, s, j);
  if (sk_session_closed(s)) {
    sk_session_remove(&srv->sessions, s);
    sk__counts_changed(srv);
  }
}

int sk__session_enqueue(struct sk_server *srv, struct sk_session *s, struct sk_job *job,
                        struct sk_error *err) {
  int rc = sk_session_enqueue(s, job, err);
  if (rc == 1) sk__session_dispatch(srv, s, job);
  return rc < 0 ? rc : 0;
}

/* An evict log as a reply's ranges. */
static void evicted_ranges(const struct sk_evict_log *log, struct sk_range *ranges,
                           size_t *ret_n) {
  for (uint32_t i = 0; i < log->n_ranges; i++)
    ranges[i] = (struct sk_range){log->first[i], log->last[i]};
  *ret_n = log->n_ranges;
}

static void on_event(void *user, struct sk_event *ev) {
  struct sk_server *srv = user;
  struct sk_job *job = ev->job;
  struct sk_conn *c = job->conn;
  if (ev->kind == SK_EVENT_TOKEN) {
    if (c) {
      struct sk_top_pair top[SK_WIRE_MAX_TOP];
      for (uint32_t i = 0; i < ev->n_top; i++) top[i] = (struct sk_top_pair){ev->top_id[i], ev->top_logit[i]};
      struct sk_token_event te = {.token = ev->token, .text = ev->text, .text_len = ev->text_len,
                                  .top = top, .n_top = ev->n_top};
      struct sk_msgbuf b;
      if (sk_wire_pack_token_event(&b, job->req_id, &te) == 0) sk_conn_send_msg(c, &b);
    }
    free(ev);
    return;
  }

  /* DONE */
  struct sk_session *s = job->sess;
  if (job->is_pin) {
    /* The pinned prefix of an open: the open's reply; a session whose pin
     * did not go in is closed (never half-pinned). */
    if (job->err.code != 0) {
      if (c) sk_conn_send_error(c, job->req_id, &job->err);
      sk_session_close_after(s);
    } else if (c) {
      sk__send_open_reply(c, job->req_id, s);
    } else { /* the client left before it learned the id: nothing to keep */
      sk_session_close_after(s);
    }
  } else if (c) {
    if (job->err.code != 0) {
      sk_conn_send_error(c, job->req_id, &job->err);
    } else {
      struct sk_session_counters cnt;
      sk_session_counters_get(&srv->sessions, s, &cnt);
      struct sk_msgbuf b;
      bool gen = job->kind == SK_JOB_GENERATE;
      bool lp = !gen && job->want_logprobs && job->logprobs;
      /* A stop at an end-of-generation token says which. */
      const char *eog_text = NULL;
      size_t eog_len = 0;
      bool eog = gen && job->stop_reason && strcmp(job->stop_reason, "eos") == 0 &&
                 sk_tokenizer_text(srv->tok, job->stop_token, &eog_text, &eog_len) == 0;
      if (eog && !sk_utf8_valid(eog_text, eog_len)) eog_len = 0; /* frames are UTF-8 */
      if (gen) {
        struct sk_generate_result g = {.stop_token = eog ? job->stop_token : -1,
                                       .n_tokens = job->n_generated,
                                       .prompt_tokens = job->n_done,
                                       .completion_tokens = job->n_generated,
                                       .evicted = job->evicted.n_evicted,
                                       .resident = cnt.resident,
                                       .seen = cnt.seen};
        snprintf(g.stop, sizeof g.stop, "%s", job->stop_reason ? job->stop_reason : "length");
        evicted_ranges(&job->evicted, g.ranges, &g.n_ranges);
        if (sk_wire_pack_generate(&b, job->req_id, &g, eog_text, eog_len, job->final_text,
                                  job->final_text_len) == 0)
          sk_conn_send_msg(c, &b);
      } else {
        struct sk_append_result a = {.n_tokens = job->n_done,
                                     .evicted = job->evicted.n_evicted,
                                     .resident = cnt.resident,
                                     .seen = cnt.seen};
        evicted_ranges(&job->evicted, a.ranges, &a.n_ranges);
        if (sk_wire_pack_append(&b, job->req_id, &a, lp ? job->logprobs : NULL) == 0)
          sk_conn_send_msg(c, &b);
      }
    }
  }
  free(ev);
  sk_session_job_done(s);
  sk__session_step(srv, s);
}

/* ---- request handlers ---- */

void sk__user_usage(const struct sk_server *srv, uint32_t uid, const struct sk_session *except,
                       uint32_t *ret_n, uint64_t *ret_bytes) {
  uint32_t n = 0;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    const struct sk_session *s = srv->sessions.items[i];
    if (!s || s == except || s->owner_uid != uid) continue;
    n++;
    bytes += s->kv_bytes;
  }
  uint32_t cn;
  uint64_t cbytes;
  sk_copy_usage(&srv->copies, uid, &cn, &cbytes);
  *ret_n = n + cn;
  *ret_bytes = bytes + cbytes;
}

/* Whether uid may own one more session of `bytes` (besides `except`, a
 * session of its already in the table, or NULL). A temporary session
 * (one that ends with its connection: `sinkctl generate` without
 * --session) may go SK_LIMIT_TEMP_SESSIONS past max_user_sessions, so
 * that persistent sessions left behind do not stop one-off requests. */
int sk__check_user_limits(struct sk_server *srv, uint32_t uid, size_t bytes,
                             const struct sk_session *except, bool temporary,
                             struct sk_error *e) {
  uint32_t n;
  uint64_t used;
  sk__user_usage(srv, uid, except, &n, &used);
  /* A per-user limit at or above the daemon's is implied by it: the
   * daemon's check (sk_session_reserve) then names the limit that binds. */
  uint32_t max_n = srv->cfg.max_user_sessions;
  uint32_t allowed = max_n + (temporary ? SK_LIMIT_TEMP_SESSIONS : 0);
  if (max_n && max_n < srv->sessions.max_sessions && n >= allowed)
    return sk_error_set(e, SK_ERR_BUSY,
                        "uid %u already has %u sessions (max_user_sessions %u, %u more for "
                        "temporary sessions): `sinkctl list` shows them, `sinkctl close --idle "
                        "1h` closes those idle for an hour",
                        uid, n, max_n, SK_LIMIT_TEMP_SESSIONS);
  uint64_t max = srv->cfg.max_user_kv_bytes;
  if (max && max < srv->sessions.max_bytes && (bytes > max || used > max - bytes))
    return sk_error_set(e, SK_ERR_BUSY,
                        "a session of %zu bytes would bring uid %u to %llu bytes "
                        "(max_user_memory %llu): `sinkctl list` shows them, `sinkctl close ID` "
                        "closes one",
                        bytes, uid, (unsigned long long)(used + bytes), (unsigned long long)max);
  return 0;
}

/* Closes s: queued requests are answered `cancelled`, a running one is
 * cancelled and s is freed when it ends (else now). */
void sk__session_close(struct sk_server *srv, struct sk_session *s) {
  struct sk_job *q;
  bool idle = sk_session_close(s, &q);
  while (q) {
    struct sk_job *j = q;
    q = j->next;
    if (j->conn)
      sk_conn_send_errorf(j->conn, j->req_id, SK_ERR_CANCELLED, "session %llu was closed",
                          (unsigned long long)s->id);
    sk_job_free(j);
  }
  sk_log(SK_LOG_INFO, "session %llu closed", (unsigned long long)s->id);
  if (!idle) {
    if (srv->scheduler) sk_scheduler_wake(srv->scheduler); /* NULL once stopping */
  } else {
    sk_session_remove(&srv->sessions, s);
    if (!srv->shutting_down) sk__counts_changed(srv);
  }
}

/* ---- persistence: resume, fork, export, import ---- */

/* ---- idle TTL ---- */

static void on_ttl(uv_timer_t *t);

/* (Re)starts the idle-TTL timer for cfg.idle_ttl_s, or stops it (0). */
static void ttl_timer_set(struct sk_server *srv) {
  uv_timer_stop(&srv->ttl_timer);
  if (srv->cfg.idle_ttl_s == 0) return;
  uint64_t tick = (uint64_t)srv->cfg.idle_ttl_s * 1000u / 4;
  if (tick < SK_LIMIT_TTL_TICK_MIN_MS) tick = SK_LIMIT_TTL_TICK_MIN_MS;
  if (tick > SK_LIMIT_TTL_TICK_MAX_MS) tick = SK_LIMIT_TTL_TICK_MAX_MS;
  uv_timer_start(&srv->ttl_timer, on_ttl, tick, tick);
}

static void on_ttl(uv_timer_t *t) {
  struct sk_server *srv = t->data;
  uint64_t now = sk_clock_ms(), ttl = (uint64_t)srv->cfg.idle_ttl_s * 1000u;
  for (uint32_t i = 0; i < srv->sessions.cap; i++) {
    struct sk_session *s = srv->sessions.items[i];
    /* A temporary session ends with its connection instead. */
    if (!s || s->temp_conn || s->running || s->queue_head || s->closing ||
        now - s->last_used_ms < ttl)
      continue;
    sk_log(SK_LOG_INFO, "session %llu closed: idle for %llu s (idle_ttl %u s)",
           (unsigned long long)s->id, (unsigned long long)((now - s->last_used_ms) / 1000u),
           srv->cfg.idle_ttl_s);
    sk_session_remove(&srv->sessions, s);
    sk__counts_changed(srv);
  }
}

/* The op table: one row per op of sinkd/protocol.h's SK_OP_LIST, in its
 * order. Every op may come at any point of a connection (the protocol has
 * no handshake: hello is informative), so a row holds the handler only. */
struct op_entry {
  void (*handler)(struct sk_server *srv, const struct request *r);
};
static const struct op_entry op_table[SK_OP__COUNT] = {
    [SK_OP_PING] = {sk__op_ping},           [SK_OP_HELLO] = {sk__op_hello},
    [SK_OP_OPEN] = {sk__op_open},           [SK_OP_CLOSE] = {sk__op_close},
    [SK_OP_LIST] = {sk__op_list},           [SK_OP_STATS] = {sk__op_stats},
    [SK_OP_APPEND] = {sk__op_append},       [SK_OP_GENERATE] = {sk__op_generate},
    [SK_OP_CHAT] = {sk__op_chat},           [SK_OP_CANCEL] = {sk__op_cancel},
    [SK_OP_RESUME] = {sk__op_resume},       [SK_OP_FORK] = {sk__op_fork},
    [SK_OP_EXPORT] = {sk__op_export},       [SK_OP_IMPORT] = {sk__op_import},
    [SK_OP_TOKENIZE] = {sk__op_tokenize}, [SK_OP_DETOKENIZE] = {sk__op_detokenize},
};

/* The row of the op named by op[0..len), or NULL for an unknown name. */
static const struct op_entry *op_find(const char *op, size_t len) {
  int i = sk_op_from_name(op, len);
  return i >= 0 && op_table[i].handler ? &op_table[i] : NULL;
}

static void handle_frame(void *user, struct sk_conn *c, const uint8_t *body, size_t len) {
  struct sk_server *srv = user;
  struct sk_error e;
  if (len == 0) {
    sk_conn_send_errorf(c, 0, SK_ERR_BAD_REQUEST, "empty frame: a request is one msgpack map");
    return;
  }
  struct sk_msg msg;
  if (sk_msg_parse(body, len, &msg, &e) < 0) {
    sk_conn_send_error(c, 0, &e);
    return;
  }
  struct request r = {.conn = c, .id = 0, .map = &msg.root};
  const char *op = NULL;
  size_t op_len = 0;
  if (sk_wire_unpack_head(r.map, &r.id, &op, &op_len, &e) < 0) {
    sk_conn_send_error(c, r.id, &e); /* id 0 when the id itself is bad */
    goto out;
  }
  const struct op_entry *entry = op_find(op, op_len);
  if (entry) entry->handler(srv, &r);
  else {
    /* Show at most 32 bytes of the unknown name, escaped. */
    char shown[32 * 4 + 1];
    size_t w = 0;
    for (size_t i = 0; i < op_len && i < 32; i++) {
      unsigned char ch = (unsigned char)op[i];
      if (ch >= 0x20 && ch < 0x7f && ch != '\\') shown[w++] = (char)ch;
      else w += (size_t)snprintf(shown + w, 5, "\\x%02x", ch);
    }
    shown[w] = 0;
    sk_conn_send_errorf(c, r.id, SK_ERR_UNKNOWN_OP, "unknown op '%s%s'", shown, op_len > 32 ? "..." : "");
  }
out:
  sk_msg_free(&msg);
}

static struct sk_conn_limits conn_limits(const struct sk_server_config *cfg) {
  return (struct sk_conn_limits){
      .max_frame = cfg->max_frame,
      .admit = {.max_clients = cfg->max_clients,
                .max_user_clients = cfg->max_user_clients,
                .max_input = cfg->max_input_bytes,
                .max_user_input = cfg->max_user_input_bytes},
      .frame_timeout_s = cfg->frame_timeout_s};
}

int sk_server_attach(struct sk_server *srv, int fd, uint32_t uid, struct sk_error *err) {
  return sk_listen_attach(&srv->conns, fd, uid, err);
}

int sk_server_check_socket(const char *path, struct sk_error *err) {
  return sk_listen_check_socket(path, err);
}

static void on_adopt(void *user, struct sk_store_obj *obj) {
  struct sk_server *srv = user;
  struct sk_session *s = NULL;
  if (obj->flags & SK_STORE_TEMPORARY) {
    /* Its connection ended with the daemon that made it (which died:
     * a shutdown closes temporary sessions), so nobody can use it. */
    sk_log(SK_LOG_NOTICE, "session %llu of uid %u closed: temporary, and its connection ended "
           "with the previous daemon",
           (unsigned long long)obj->id, obj->owner_uid);
    srv->n_temp_closed++;
    sk_store_obj_remove(obj);
    return;
  }
  if (sk_session_adopt(&srv->sessions, obj, &s) < 0) {
    sk_log(SK_LOG_ERR, "out of memory adopting a session; its object stays for the next start");
    return;
  }
  sk_session_touch(s);
  srv->n_adopted++;
  /* Its conversation, if it held one; else the daemon's template. */
  struct sk_error ce;
  sk_session_set_template(s, srv->cfg.chat_template);
  if (sk_session_conv_load(s, sk_store_dir(srv->cfg.store), &ce) < 0)
    sk_log(SK_LOG_WARNING, "session %llu: conversation not restored (it starts afresh): %s",
           (unsigned long long)s->id, ce.message);
  sk_log(SK_LOG_INFO, "session %llu adopted: uid %u, %s, %s, capacity %u, %u resident, "
         "%llu seen, commit %llu%s",
         (unsigned long long)s->id, s->owner_uid, sk_policy_name(s->params.policy),
         sk_kv_type_name(s->kv_type), s->capacity,
         s->kv->hdr->n_resident, (unsigned long long)s->kv->hdr->n_seen,
         (unsigned long long)sk_store_commit_count(s->obj),
         obj->dropped_step ? " (a step in progress when the daemon stopped was dropped)" : "");
}

static void on_skip(void *user, const char *name, enum sk_store_skip what, const char *dest,
                    const char *reason) {
  struct sk_server *srv = user;
  const char *dir = sk_store_dir(srv->cfg.store);
  switch (what) {
  case SK_STORE_SET_ASIDE:
    srv->n_set_aside++;
    sk_log(SK_LOG_WARNING, "state: %s/%s set aside as %s/%s: %s", dir, name, dir, dest, reason);
    break;
  case SK_STORE_REMOVED:
    sk_log(SK_LOG_NOTICE, "state: %s/%s removed: %s", dir, name, reason);
    break;
  case SK_STORE_KEPT:
    srv->n_set_aside++;
    sk_log(SK_LOG_WARNING, "state: %s/%s not adopted (and could not be moved aside): %s", dir,
           name, reason);
    break;
  }
}

int sk_server_new(uv_loop_t *loop, const struct sk_server_config *cfg,
                    const struct sk_model *m, const struct sk_tokenizer *tok,
                    struct sk_server **ret, struct sk_error *err) {
  struct sk_server *srv = calloc(1, sizeof *srv);
  if (!srv) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  srv->loop = loop;
  srv->cfg = *cfg;
  srv->model = m;
  srv->tok = tok;
  srv->started_ms = sk_clock_ms();
  if (cfg->chat_error) snprintf(srv->chat_error, sizeof srv->chat_error, "%s", cfg->chat_error);
  srv->cfg.chat_error = NULL;
  srv->start_max_sessions = cfg->max_sessions;
  srv->start_max_capacity = cfg->max_capacity;
  int rc = 0;
  if (sk_session_table_init(&srv->sessions, cfg->store, cfg->max_sessions,
                            cfg->max_memory ? cfg->max_memory : UINT64_MAX) < 0)
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  sk_session_table_set_release(&srv->sessions, sk_copy_release_obj, srv);
  if (rc == 0) {
    struct sk_store_scan_cb cb = {.adopt = on_adopt, .skip = on_skip, .user = srv};
    uint64_t max_id = 0;
    rc = sk_store_scan(cfg->store, &cb, &max_id, err);
    if (rc == 0) sk_session_table_seen_id(&srv->sessions, max_id);
    if (rc == 0)
      sk_log(SK_LOG_NOTICE,
             "state directory %s: %u session%s adopted, %u set aside, %u temporary closed, %llu "
             "bytes",
             sk_store_dir(cfg->store), srv->n_adopted, srv->n_adopted == 1 ? "" : "s",
             srv->n_set_aside, srv->n_temp_closed, (unsigned long long)srv->sessions.bytes);
  }
  if (rc == 0)
    rc = sk_scheduler_new(loop, m, tok, &srv->sessions, cfg->max_batch, cfg->max_capacity,
                          cfg->threads ? cfg->threads : 1, on_event, srv, &srv->scheduler, err);
  if (rc == 0) sk_scheduler_set_sparse(srv->scheduler, cfg->sparse);
  if (rc == 0) {
    const struct sk_conn_hooks hooks = {.frame = handle_frame,
                                        .pause = on_conn_pause,
                                        .drain = on_conn_drain,
                                        .close = on_conn_close,
                                        .release = on_conn_release,
                                        .count = on_conn_count};
    const struct sk_conn_limits lim = conn_limits(cfg);
    sk_conns_init(&srv->conns, loop, &lim, &hooks, srv, sizeof(struct sk_copy_peer));
    rc = sk_listen_init(&srv->listen, loop, cfg->socket_path, cfg->listen_fd, &srv->conns, err);
    if (rc < 0) {
      sk_conns_stop(&srv->conns);
      sk_scheduler_free(srv->scheduler);
      srv->scheduler = NULL;
    }
  }
  if (rc < 0) {
    /* A listener that failed is closing: let the loop finish that
     * (and the compute thread's handles) before srv goes away. */
    uv_run(loop, UV_RUN_NOWAIT);
    sk_conns_free(&srv->conns); /* zeroed if never initialised */
    sk_session_table_free(&srv->sessions);
    sk_listen_free(&srv->listen);
    free(srv);
    return rc;
  }
  uv_timer_init(loop, &srv->ttl_timer);
  srv->ttl_timer.data = srv;
  srv->ttl_running = true; /* the handle: closed at shutdown */
  ttl_timer_set(srv);

  *ret = srv;
  return 0;
}

void sk_server_reconfigure(struct sk_server *srv, const struct sk_server_config *cfg) {
  srv->cfg.max_frame = cfg->max_frame;
  srv->cfg.max_clients = cfg->max_clients;
  srv->cfg.max_sessions =
      cfg->max_sessions < srv->start_max_sessions ? cfg->max_sessions : srv->start_max_sessions;
  srv->cfg.max_capacity =
      cfg->max_capacity < srv->start_max_capacity ? cfg->max_capacity : srv->start_max_capacity;
  srv->cfg.max_memory = cfg->max_memory;
  srv->cfg.max_user_sessions = cfg->max_user_sessions;
  srv->cfg.max_user_kv_bytes = cfg->max_user_kv_bytes;
  srv->cfg.max_user_clients = cfg->max_user_clients;
  srv->cfg.max_input_bytes = cfg->max_input_bytes;
  srv->cfg.max_user_input_bytes = cfg->max_user_input_bytes;
  srv->cfg.frame_timeout_s = cfg->frame_timeout_s;
  const struct sk_conn_limits lim = conn_limits(&srv->cfg);
  sk_conns_set_limits(&srv->conns, &lim);
  srv->cfg.defaults = cfg->defaults;
  /* New limits apply to new sessions; open ones stay (even above them). */
  sk_session_table_set_limits(&srv->sessions, srv->cfg.max_sessions,
                              cfg->max_memory ? cfg->max_memory : UINT64_MAX);
  if (cfg->idle_ttl_s != srv->cfg.idle_ttl_s) {
    srv->cfg.idle_ttl_s = cfg->idle_ttl_s;
    if (srv->ttl_running) ttl_timer_set(srv);
  }
}

void sk_server_shutdown(struct sk_server *srv) {
  if (srv->shutting_down) return;
  srv->shutting_down = true;
  if (srv->ttl_running) {
    uv_close((uv_handle_t *)&srv->ttl_timer, NULL);
    srv->ttl_running = false;
  }
  sk_listen_close(&srv->listen);
  /* Running jobs end cancelled; their final replies go out before the
   * connections close. */
  if (srv->scheduler) {
    sk_scheduler_free(srv->scheduler);
    srv->scheduler = NULL;
  }
  sk_conns_stop(&srv->conns);
}

void sk_server_free(struct sk_server *srv) {
  if (!srv) return;
  sk_session_table_free(&srv->sessions);
  sk_conns_free(&srv->conns);
  sk_listen_free(&srv->listen);
  free(srv);
}
