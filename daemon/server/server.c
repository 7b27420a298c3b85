/* The server's life: start (adoption of the state directory, the
 * compute thread, the socket), the connections' hooks, reload, the idle
 * TTL and shutdown. Requests are ops.c's, thread-pool work copy.c's, the
 * jobs of sessions jobs.c's (state.h shows the whole folder). */
#include "server/server.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "server/copy.h"
#include "server/jobs.h"
#include "server/ops.h"
#include "server/state.h"
#include "session/conv.h"
#include "sk_limits.h"

/* ---- connections (conn.h hooks) ---- */

/* A slow reader's generation pauses with its reading. */
static void on_conn_pause(void *user, struct sk_conn *conn, bool paused) {
  struct sk_server *srv = user;
  struct sk_session *s;
  for (uint32_t pos = 0; (s = sk_session_table_next(&srv->sessions, &pos)) != NULL;)
    sk_session_pause(s, conn, paused);
  if (!paused && srv->scheduler) sk_scheduler_wake(srv->scheduler);
}

static void on_conn_drain(void *user, struct sk_conn *conn) {
  (void)user;
  sk_copy_export_pump(conn);
}

static void on_conn_close(void *user, struct sk_conn *conn) {
  struct sk_server *srv = user;
  /* Work of a client that left: generations stop, appends complete (the
   * session keeps what was sent). No job keeps a pointer to conn. */
  struct sk_session *s;
  for (uint32_t pos = 0; (s = sk_session_table_next(&srv->sessions, &pos)) != NULL;) {
    /* Sessions opened "temporary" on this connection end with it, at
     * shutdown too (a restart would adopt them with nobody to close them). */
    if (sk_session_detach(s, conn, sk_conn_id(conn))) sk_jobs_close(srv, s);
  }
  if (srv->scheduler) sk_scheduler_wake(srv->scheduler);
  sk_copy_import_drop(srv, conn); /* an import in progress goes */
}

static void on_conn_release(void *user, struct sk_conn *conn) {
  (void)user;
  sk_copy_peer_free(sk_conn_data(conn));
}

static void on_conn_count(void *user, uint32_t n_conns) {
  (void)n_conns;
  sk_jobs_counts_changed(user);
}

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
  struct sk_session *s;
  for (uint32_t pos = 0; (s = sk_session_table_next(&srv->sessions, &pos)) != NULL;) {
    struct sk_session_desc d;
    sk_session_describe(s, &d);
    /* A temporary session ends with its connection instead. */
    if (d.temporary || d.busy || d.queued || sk_session_closing(s) || now - d.last_used_ms < ttl)
      continue;
    sk_log(SK_LOG_INFO, "session %llu closed: idle for %llu s (idle_ttl %u s)",
           (unsigned long long)d.id, (unsigned long long)((now - d.last_used_ms) / 1000u),
           srv->cfg.idle_ttl_s);
    sk_session_remove(&srv->sessions, s);
    sk_jobs_counts_changed(srv);
  }
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

int sk_server_admit(struct sk_server *srv, uint32_t uid, struct sk_error *err) {
  return sk_conns_admit(&srv->conns, uid, err);
}

void sk_server_unadmit(struct sk_server *srv, uint32_t uid) { sk_conns_unadmit(&srv->conns, uid); }

int sk_server_attach(struct sk_server *srv, int fd, uint32_t uid, struct sk_error *err) {
  return sk_listen_attach(&srv->conns, fd, uid, true, err);
}

int sk_server_check_socket(const char *path, struct sk_error *err) {
  return sk_listen_check_socket(path, err);
}

static void on_adopt(void *user, struct sk_store_obj *obj) {
  struct sk_server *srv = user;
  struct sk_session *s = NULL;
  int rc = sk_session_adopt(&srv->sessions, obj, &s);
  if (rc < 0) {
    sk_log(SK_LOG_ERR, "out of memory adopting a session; its object stays for the next start");
    return;
  }
  if (!s) { /* a temporary session of the previous daemon: closed */
    srv->n_temp_closed++;
    return;
  }
  sk_session_touch(s);
  srv->n_adopted++;
  /* Its conversation, if it held one; else the daemon's template. */
  struct sk_error ce;
  sk_session_set_template(s, srv->cfg.chat_template);
  if (sk_session_conv_load(s, sk_store_dirfd(srv->cfg.store), &ce) < 0)
    sk_log(SK_LOG_WARNING, "session %llu: conversation not restored (it starts afresh): %s",
           (unsigned long long)sk_session_id(s), ce.message);
  struct sk_session_desc d;
  sk_session_describe(s, &d);
  struct sk_session_counters cnt;
  sk_session_counters_get(&srv->sessions, s, &cnt);
  sk_log(SK_LOG_INFO, "session %llu adopted: uid %u, %s, %s, capacity %u, %u resident, "
         "%llu seen, commit %llu%s",
         (unsigned long long)d.id, d.owner_uid, sk_policy_name(d.params.policy),
         sk_kv_type_name(d.kv_type), d.capacity, cnt.resident, (unsigned long long)cnt.seen,
         (unsigned long long)cnt.commit,
         d.dropped_step ? " (a step in progress when the daemon stopped was dropped)" : "");
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

/* A set-aside session's conversation goes with it: a file left behind
 * would be taken for the conversation of nothing. */
static void on_aside(void *user, uint64_t id) {
  struct sk_server *srv = user;
  const char *dir = sk_store_dir(srv->cfg.store);
  char name[SK_CONV_NAME_MAX], dest[128];
  sk_conv_file_name(name, sizeof name, id);
  if (sk_store_set_aside(srv->cfg.store, name, dest, sizeof dest))
    sk_log(SK_LOG_WARNING, "state: %s/%s set aside as %s/%s with its session", dir, name, dir,
           dest);
  else if (errno != ENOENT)
    sk_log(SK_LOG_WARNING, "state: %s/%s stays: it could not follow its session: %s", dir, name,
           strerror(errno));
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
  /* The paths outlive the configuration they came from (a reload frees it). */
  srv->model_path = cfg->model_path ? strdup(cfg->model_path) : NULL;
  srv->socket_path = cfg->socket_path ? strdup(cfg->socket_path) : NULL;
  srv->cfg.model_path = srv->model_path;
  srv->cfg.socket_path = srv->socket_path;
  if ((cfg->model_path && !srv->model_path) || (cfg->socket_path && !srv->socket_path)) {
    free(srv->model_path);
    free(srv->socket_path);
    free(srv);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  srv->start_max_sessions = cfg->max_sessions;
  srv->start_max_capacity = cfg->max_capacity;
  int rc = 0;
  if (sk_session_table_init(&srv->sessions, cfg->store, cfg->max_sessions,
                            cfg->max_memory ? cfg->max_memory : UINT64_MAX) < 0)
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  sk_session_table_set_release(&srv->sessions, sk_copy_release_obj, srv);
  sk_session_table_set_user_limits(&srv->sessions, cfg->max_user_sessions,
                                   cfg->max_user_kv_bytes);
  srv->start_copy = sk_copy_start;
  const struct sk_spec_config spec = {.draft = cfg->draft, .kv_type = cfg->kv_type,
                                      .history = cfg->lookup_history,
                                      .default_mode = cfg->speculation};
  sk_session_table_set_spec(&srv->sessions, &spec);
  if (rc == 0) {
    struct sk_store_scan_cb cb = {.adopt = on_adopt, .skip = on_skip, .aside = on_aside,
                                  .user = srv};
    uint64_t max_id = 0;
    rc = sk_store_scan(cfg->store, &cb, &max_id, err);
    if (rc == 0) sk_session_table_seen_id(&srv->sessions, max_id);
    if (rc == 0)
      sk_log(SK_LOG_NOTICE,
             "state directory %s: %u session%s adopted, %u set aside, %u temporary closed, %llu "
             "bytes",
             sk_store_dir(cfg->store), srv->n_adopted, srv->n_adopted == 1 ? "" : "s",
             srv->n_set_aside, srv->n_temp_closed,
             (unsigned long long)sk_session_table_bytes(&srv->sessions));
  }
  if (rc == 0)
    rc = sk_scheduler_new(loop, m, tok, &srv->sessions, cfg->max_batch,
                          cfg->step_tokens ? cfg->step_tokens : cfg->max_batch, cfg->max_capacity,
                          cfg->threads ? cfg->threads : 1, sk_jobs_on_event, srv, &srv->scheduler,
                          err);
  if (rc == 0) sk_scheduler_set_sparse(srv->scheduler, cfg->sparse);
  if (rc == 0) {
    sk_scheduler_set_spec_defaults(srv->scheduler, cfg->speculation, cfg->draft_tokens);
    rc = sk_scheduler_set_draft(srv->scheduler, cfg->draft, err);
    if (rc < 0) {
      sk_scheduler_free(srv->scheduler);
      srv->scheduler = NULL;
    }
  }
  if (rc == 0) {
    const struct sk_conn_hooks hooks = {.frame = sk_ops_frame,
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
    free(srv->model_path);
    free(srv->socket_path);
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
  sk_session_table_set_user_limits(&srv->sessions, cfg->max_user_sessions,
                                   cfg->max_user_kv_bytes);
  if (cfg->idle_ttl_s != srv->cfg.idle_ttl_s) {
    srv->cfg.idle_ttl_s = cfg->idle_ttl_s;
    if (srv->ttl_running) ttl_timer_set(srv);
  }
  /* a draft mode needs the draft model loaded at start */
  srv->cfg.speculation =
      cfg->speculation == SK_SPEC_DRAFT && !srv->cfg.draft ? SK_SPEC_OFF : cfg->speculation;
  srv->cfg.draft_tokens = cfg->draft_tokens;
  if (srv->scheduler)
    sk_scheduler_set_spec_defaults(srv->scheduler, srv->cfg.speculation, srv->cfg.draft_tokens);
  sk_session_table_set_spec_default(&srv->sessions, srv->cfg.speculation);
}

void sk_server_shutdown(struct sk_server *srv) {
  if (srv->shutting_down) return;
  srv->shutting_down = true;
  if (srv->ttl_running) {
    uv_close((uv_handle_t *)&srv->ttl_timer, NULL);
    srv->ttl_running = false;
  }
  sk_copy_shutdown(srv);
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
  free(srv->model_path);
  free(srv->socket_path);
  free(srv);
}
