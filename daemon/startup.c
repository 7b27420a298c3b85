/* The daemon's run (see startup.h): each step of the start is a
 * function that returns 0 or the exit status it failed with. */
#include "startup.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <uv.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/notify.h"
#include "base/safefile.h"
#include "http/http.h"
#include "model/chat.h"
#include "model/gguf.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/pool.h"
#include "model/sparse.h"
#include "model/tokenizer.h"
#include "modelwait.h"
#include "proto/msg.h"
#include "proto/wire.h"
#include "server/server.h"
#include "session/kvcache.h"
#include "session/spec.h"
#include "session/store.h"
#include "sk_config.h"
#include "sk_limits.h"

/* ---- configuration ------------------------------------------------------- */

/* Builds defaults + file + command line into *ret. Problems go to the log
 * (daemon) or to stderr as "sinkd: ..." (check_only). */
static int config_build(const struct sk_startup *src, bool check_only, struct sk_config *ret) {
  if (sk_config_init(ret) < 0) {
    sk_log(SK_LOG_ERR, "out of memory");
    return -SK_ERR_NO_MEMORY;
  }
  struct sk_config_errors errs;
  int rc = sk_config_load(ret, src->config_path, src->explicit_path, &errs);
  if (rc < 0) {
    for (uint32_t i = 0; i < errs.n; i++) {
      if (check_only)
        fprintf(stderr, "sinkd: %s\n", errs.e[i].message);
      else
        sk_log(SK_LOG_ERR, "%s", errs.e[i].message);
    }
    if (errs.dropped) {
      if (check_only)
        fprintf(stderr, "sinkd: %s: %u more errors\n", src->config_path, errs.dropped);
      else
        sk_log(SK_LOG_ERR, "%s: %u more errors", src->config_path, errs.dropped);
    }
    if (rc == -SK_ERR_NO_MEMORY) sk_log(SK_LOG_ERR, "out of memory reading %s", src->config_path);
    sk_config_done(ret);
    return rc;
  }
  if (sk_config_overlay(ret, &src->cli) < 0) {
    sk_log(SK_LOG_ERR, "out of memory");
    sk_config_done(ret);
    return -SK_ERR_NO_MEMORY;
  }
  return 0;
}

static void server_config_from(const struct sk_config *cfg, struct sk_server_config *s) {
  s->socket_path = cfg->socket;
  s->model_path = cfg->model;
  s->max_frame = cfg->max_frame;
  s->max_sessions = cfg->max_sessions;
  s->max_clients = cfg->max_clients;
  s->max_capacity = cfg->max_capacity;
  s->max_memory = cfg->max_memory;
  s->idle_ttl_s = cfg->idle_ttl;
  s->max_user_clients = cfg->max_user_clients;
  s->frame_timeout_s = cfg->frame_timeout;
  s->max_input_bytes = cfg->max_input_memory;
  s->max_user_input_bytes = cfg->max_user_input_memory;
  s->max_user_sessions = cfg->max_user_sessions;
  s->max_user_kv_bytes = cfg->max_user_memory;
  s->max_batch = cfg->batch;
  s->step_tokens = cfg->step_tokens;
  s->threads = cfg->threads;
  s->kv_type = cfg->kv_type;
  s->defaults.policy = cfg->policy;
  s->defaults.n_sink = cfg->n_sink;
  s->defaults.window = cfg->window;
  s->defaults.capacity = cfg->capacity;
  s->defaults.rope_scale = 1.0f;
  s->lookup_history = cfg->lookup_history;
  s->draft_tokens = cfg->draft_tokens;
  s->speculation = cfg->speculation != SK_SPEC_DEFAULT ? cfg->speculation
                   : cfg->draft_model                  ? SK_SPEC_DRAFT
                                                       : SK_SPEC_OFF;
  /* h2o and sink_h2o split the streaming budget between heavy hitters and
   * recent tokens in equal halves (as Zhang et al. 2023 do). */
  uint32_t budget = cfg->n_sink + cfg->window;
  s->defaults.heavy = budget / 2 > 0 ? budget / 2 : 1;
  s->defaults.recent = budget - budget / 2 > 0 ? budget - budget / 2 : 1;
}

/* Logs "cannot load model" when the model file's structure is wrong, for
 * a start that fails before loading it (socket or state directory in
 * use): the model's own problem must not hide behind the other. Only
 * the GGUF structure is read (sk_gguf_open maps it), not the weights. */
static void log_model_problem(const struct sk_config *cfg) {
  struct sk_gguf *g = NULL;
  struct sk_error e;
  if (sk_gguf_open(cfg->model, &g, &e) < 0) {
    char at[PATH_MAX + 64] = "";
    if (cfg->origin[SK_CFG_MODEL].from == SK_CONFIG_FROM_FILE)
      snprintf(at, sizeof at, "%s:%u: [daemon] model: ", cfg->file, cfg->origin[SK_CFG_MODEL].line);
    sk_log(SK_LOG_ERR, "%scannot load model %s: %s", at, cfg->model, e.message);
    return;
  }
  sk_gguf_close(g);
}

/* ---- the running daemon -------------------------------------------------- */

struct daemon {
  const struct sk_startup *src; /* the command line */
  struct sk_config cfg;         /* effective, resolved */
  /* what it loaded and started, released by daemon_free */
  struct sk_gguf *gguf;
  struct sk_model *model;
  const struct sk_model_config *mc;
  struct sk_tokenizer *tok;
  /* the draft model of speculation (spec.h), or NULL */
  struct sk_gguf *draft_gguf;
  struct sk_model *draft;
  struct sk_store *store;
  uint8_t model_fp[SK_STORE_FP_SIZE];
  struct sk_sparse_calib calib;
  uv_loop_t *loop;
  struct sk_server *server;
  struct sk_http *http;         /* the HTTP front end, or NULL */
  /* the sockets the service manager passed (0: none) */
  int listen_fd, http_fd;
  char passed_path[sizeof(((struct sockaddr_un *)0)->sun_path) + 16];
  /* the chat template of new sessions, and why the model's was not taken */
  int chat_template;
  char chat_error[SK_ERROR_MESSAGE_MAX];
  uv_signal_t sig_int, sig_term, sig_hup;
  struct sk_watchdog watchdog;
  uint32_t n_sessions, n_clients;
  uint32_t start_max_sessions, start_max_capacity; /* sizes fixed at start */
  bool stopping;
  char http_key[1024];          /* the HTTP API key (http_listen), zeroed
                                   once the front end has it */
  uint64_t load_start_ms;       /* the model load's progress: when it began */
  uint32_t load_reported;       /* and the last tenth reported */
  int check_status;             /* --check-config: a start failure found
                                   (SK_EXIT_START), reported once the rest
                                   is checked */
};

static void send_status(struct daemon *d) {
  sk_notify("STATUS=serving %s: %u session%s, %u client%s", d->mc->name, d->n_sessions,
            d->n_sessions == 1 ? "" : "s", d->n_clients, d->n_clients == 1 ? "" : "s");
}

static void on_counts(void *user, uint32_t n_sessions, uint32_t n_clients) {
  struct daemon *d = user;
  d->n_sessions = n_sessions;
  d->n_clients = n_clients;
  if (!d->stopping) send_status(d);
}

/* Lowers *v to cap (a size fixed at start); appends "key above cap" to msg. */
static void cap_at_start(uint32_t *v, uint32_t cap, const char *key, char *msg, size_t size) {
  if (*v <= cap) return;
  size_t w = strlen(msg);
  snprintf(msg + w, size - w, "%s%s %u above %u", w ? ", " : "", key, *v, cap);
  *v = cap;
}

/* SIGHUP: re-reads the file; applies what can change without reloading
 * the model, says which changes need a restart, keeps everything on error. */
static void reload(struct daemon *d) {
  sk_notify("RELOADING=1\nSTATUS=reloading %s", d->src->config_path);
  struct sk_config next;
  struct sk_error e;
  if (config_build(d->src, false, &next) < 0) {
    sk_log(SK_LOG_ERR, "reload: %s has errors; keeping the running configuration", d->src->config_path);
    goto done;
  }
  int rc = sk_config_resolve(&next, d->mc, &e);
  if (rc < 0) {
    sk_log(SK_LOG_ERR, "reload: %s; keeping the running configuration", e.message);
    sk_config_done(&next);
    goto done;
  }
  /* What cannot change while running keeps its running value. */
  char restart[512] = "";
  for (int k = 0; k < SK_CFG__COUNT; k++) {
    enum sk_config_key key = (enum sk_config_key)k;
    if (sk_config_key_reloadable(key) || sk_config_same(&d->cfg, &next, key)) continue;
    size_t w = strlen(restart);
    snprintf(restart + w, sizeof restart - w, "%s%s", w ? ", " : "", sk_config_key_name(key));
    char v[PATH_MAX + 32];
    sk_config_format(&d->cfg, key, v, sizeof v);
    sk_config_set(&next, key, v, d->cfg.origin[k].from, d->cfg.origin[k].line, &e);
    next.origin[k] = d->cfg.origin[k];
  }
  /* The session table and the compute buffers are sized at start. */
  char capped[256] = "";
  cap_at_start(&next.max_sessions, d->start_max_sessions, "max_sessions", capped, sizeof capped);
  cap_at_start(&next.max_capacity, d->start_max_capacity, "max_capacity", capped, sizeof capped);
  if (*capped && sk_config_resolve(&next, d->mc, &e) < 0) { /* re-checks the defaults */
    sk_log(SK_LOG_ERR, "reload: %s (after capping %s); keeping the running configuration",
           e.message, capped);
    sk_config_done(&next);
    goto done;
  }
  if (*restart)
    sk_log(SK_LOG_WARNING,
           "reload: %s changed; restart sinkd to apply (keeping the running values)", restart);
  if (*capped)
    sk_log(SK_LOG_WARNING, "reload: %s: raising a size fixed at start needs a restart; capped",
           capped);

  /* One line saying what changed. */
  char changed[1024] = "";
  for (int k = 0; k < SK_CFG__COUNT; k++) {
    enum sk_config_key key = (enum sk_config_key)k;
    if (sk_config_same(&d->cfg, &next, key)) continue;
    char a[64], b[64];
    sk_config_format(&d->cfg, key, a, sizeof a);
    sk_config_format(&next, key, b, sizeof b);
    size_t w = strlen(changed);
    snprintf(changed + w, sizeof changed - w, "%s%s %s -> %s", w ? ", " : "",
             sk_config_key_name(key), a, b);
  }
  struct sk_server_config sc = {0};
  server_config_from(&next, &sc);
  sk_server_reconfigure(d->server, &sc);
  sk_log_set_level((int)next.log_level);
  sk_log(SK_LOG_NOTICE, "reloaded %s%s: %s", d->src->config_path,
         next.file ? "" : " (missing: built-in defaults and options)",
         *changed ? changed
                  : *restart ? "nothing that applies without a restart changed" : "nothing changed");
  sk_config_done(&d->cfg);
  d->cfg = next;
done:
  sk_notify("READY=1");
  send_status(d);
}

static void on_signal(uv_signal_t *h, int signum) {
  struct daemon *d = h->data;
  if (signum == SIGHUP) {
    reload(d);
    return;
  }
  sk_log(SK_LOG_NOTICE, "received %s, shutting down", strsignal(signum));
  d->stopping = true;
  sk_notify("STOPPING=1\nSTATUS=shutting down");
  sk_watchdog_stop(&d->watchdog);
  sk_http_shutdown(d->http);
  sk_server_shutdown(d->server);
  uv_signal_t *all[3] = {&d->sig_int, &d->sig_term, &d->sig_hup};
  for (int i = 0; i < 3; i++)
    if (!uv_is_closing((uv_handle_t *)all[i])) uv_close((uv_handle_t *)all[i], NULL);
}

/* Creates the socket's folder if missing (one level, 0755). Returns -1
 * after logging why when its parent is missing too (libuv would report
 * the bind as EACCES), else 0: other failures are the bind's to report. */
static int make_socket_dir(const char *path) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return 0;
  *slash = 0;
  if (mkdir(dir, 0755) == 0) sk_log(SK_LOG_INFO, "created %s", dir);
  else if (errno == ENOENT) {
    sk_log(SK_LOG_ERR, "cannot listen on %s: directory %s does not exist", path, dir);
    return -1;
  }
  return 0;
}

/* The sockets the service manager passed (socket activation), if any:
 * the msgpack socket (sinkd.socket) and, named "http" by its
 * FileDescriptorName=, the HTTP one (sinkd-http.socket). Returns the
 * msgpack socket's fd, 0 if none was passed, or -1 after logging why the
 * passed sockets cannot be used; *ret_http_fd is the HTTP socket's fd
 * or 0. sd_listen_fds checks LISTEN_PID, so variables inherited from a
 * parent that was socket-activated are ignored. */
static int passed_socket(char *ret_path, size_t size, int *ret_http_fd) {
  char **names = NULL;
  *ret_http_fd = 0;
  int n = sd_listen_fds_with_names(1, &names);
  if (n < 0) {
    sk_log(SK_LOG_ERR, "sockets from the service manager: %s", strerror(-n));
    return -1;
  }
  int fd = 0, rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    int f = SD_LISTEN_FDS_START + i;
    bool http = names && names[i] && strcmp(names[i], "http") == 0;
    if (sd_is_socket_unix(f, SOCK_STREAM, 1, NULL, 0) <= 0) {
      sk_log(SK_LOG_ERR, "the socket passed as fd %d is not a listening Unix stream socket "
                         "(sinkd.socket and sinkd-http.socket need ListenStream=/path)", f);
      rc = -1;
    } else if (http ? *ret_http_fd != 0 : fd != 0) {
      sk_log(SK_LOG_ERR, "the service manager passed %d sockets; sinkd takes one for its "
                         "protocol and one named \"http\" (sinkd-http.socket)", n);
      rc = -1;
    } else if (http) {
      *ret_http_fd = f;
    } else {
      fd = f;
    }
  }
  for (int i = 0; names && i < n; i++) free(names[i]);
  free(names);
  if (rc < 0) return -1;
  if (n > 0 && fd == 0) {
    sk_log(SK_LOG_ERR, "the service manager passed only the HTTP socket; sinkd.socket is "
                       "missing");
    return -1;
  }
  if (fd == 0) return 0;
  struct sockaddr_un a;
  socklen_t len = sizeof a;
  memset(&a, 0, sizeof a);
  if (getsockname(fd, (struct sockaddr *)&a, &len) == 0 && a.sun_path[0])
    snprintf(ret_path, size, "%.*s", (int)sizeof a.sun_path, a.sun_path);
  else
    snprintf(ret_path, size, "(fd %d)", fd);
  return fd;
}

/* ---- --calibrate ------------------------------------------------------------ */

/* Calibration (sparse.h, CATS sec. 3.2): the sizes of a run are
 * SK_LIMIT_CALIB_* (sk_limits.h). */

static void calib_probe(void *user, uint32_t layer, const float *gate, uint32_t n,
                        uint32_t hidden) {
  (void)hidden;
  sk_sparse_collect_add(user, layer, gate, n);
}

/* sinkd --calibrate TEXT: runs the model densely over TEXT and writes the
 * thresholds of SK_SPARSE_DEFAULT_LEVELS, bound to fp, to out (NULL:
 * stdout; written to a temporary file, then renamed). Returns an exit
 * status. */
static int calibrate(const struct sk_model *m, const struct sk_tokenizer *tok,
                     const uint8_t fp[16], const char *text_path, const char *out,
                     uint32_t threads, uint32_t batch) {
  struct sk_error err = {0};
  const struct sk_model_config *mc = sk_model_config(m);
  /* A regular file (a FIFO would wait for a writer), read up to its
   * first SK_LIMIT_CALIB_TEXT_BYTES. */
  int tfd = sk_safefile_open(AT_FDCWD, text_path, 0, UINT64_MAX / 4, NULL, NULL, &err);
  FILE *f = tfd >= 0 ? fdopen(tfd, "rb") : NULL;
  if (!f) {
    if (tfd >= 0) close(tfd);
    fprintf(stderr, "sinkd: --calibrate: %s\n", tfd >= 0 ? strerror(errno) : err.message);
    return SK_EXIT_CONFIG;
  }
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? 2 * cap : 1 << 16;
      char *t = cap <= SK_LIMIT_CALIB_TEXT_BYTES ? realloc(text, cap) : NULL;
      if (!t) break;
      text = t;
    }
    size_t k = fread(text + len, 1, cap - len, f);
    if (k == 0) break;
    len += k;
  }
  fclose(f);
  int32_t *ids = NULL;
  size_t n_ids = 0;
  if (!text || sk_tokenizer_encode(tok, text, len, false, &ids, &n_ids, &err) < 0 || n_ids == 0) {
    fprintf(stderr, "sinkd: --calibrate %s: %s\n", text_path,
            err.code ? err.message : "no text (empty, too large or unreadable)");
    free(text);
    free(ids);
    return SK_EXIT_CONFIG;
  }
  free(text);
  const uint32_t win =
      mc->n_ctx_train < SK_LIMIT_CALIB_WINDOW ? mc->n_ctx_train : SK_LIMIT_CALIB_WINDOW;
  const uint32_t n_use = n_ids < SK_LIMIT_CALIB_TOKENS ? (uint32_t)n_ids : SK_LIMIT_CALIB_TOKENS;
  const uint32_t chunk = batch < win - 1 ? batch : win - 1; /* tokens per pass, BOS apart */
  int status = SK_EXIT_START;
  struct sk_pool *pool = NULL;
  struct sk_scratch *s = NULL;
  struct sk_sparse_collect *col = NULL;
  struct sk_sparse_calib cal = {0};
  struct sk_kv *kv = NULL;
  if (sk_pool_new(threads ? threads : 1, &pool, &err) < 0 ||
      sk_scratch_new_pool(m, chunk + 1, win, pool, &s, &err) < 0 ||
      sk_sparse_collect_new(mc->n_layer, mc->hidden_dim, n_use, SK_LIMIT_CALIB_SAMPLES, &col,
                            &err) < 0)
    goto fail;
  sk_scratch_set_gate_probe(s, calib_probe, col);
  struct sk_kv_params kp = {.policy = SK_POLICY_DENSE, .capacity = win, .rope_scale = 1.0f};
  const int32_t bos = sk_tokenizer_bos(tok);
  for (uint32_t at = 0; at < n_use;) {
    /* one window: BOS (if the model has one), then text */
    sk_kv_free(kv);
    kv = NULL;
    if (sk_kv_new(sk_model_kv_shape(m), &kp, &kv, &err) < 0) goto fail;
    if (bos >= 0 && sk_model_forward(m, s, kv, &bos, 1, NULL, false, &err) < 0) goto fail;
    while (at < n_use && sk_kv_resident(kv) + chunk <= win) {
      const uint32_t n = n_use - at < chunk ? n_use - at : chunk;
      if (sk_model_forward(m, s, kv, ids + at, n, NULL, false, &err) < 0) goto fail;
      at += n;
    }
    fprintf(stderr, "\rsinkd: calibrating: %u of %u tokens", at, n_use);
  }
  fputc('\n', stderr);
  const float levels[] = SK_SPARSE_DEFAULT_LEVELS;
  if (sk_sparse_collect_thresholds(col, levels, sizeof levels / sizeof levels[0], &cal, &err) < 0)
    goto fail;
  memcpy(cal.model_fp, fp, 16);
  cal.n_tokens = n_use;
  /* The file: written in memory, then into its folder through a
   * temporary created exclusively and renamed over it (base/safefile.h),
   * never through a link planted at either name. */
  char *buf = NULL;
  size_t buf_len = 0;
  FILE *o = out ? open_memstream(&buf, &buf_len) : stdout;
  if (!o) {
    fprintf(stderr, "sinkd: cannot write %s: %s\n", out, strerror(errno));
    goto done;
  }
  int rc = sk_sparse_calib_write(o, &cal, &err);
  if (out) {
    int dfd = -1;
    char dir[PATH_MAX];
    const char *slash = strrchr(out, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - out) : 1, slash ? out : ".");
    if (slash == out) snprintf(dir, sizeof dir, "/");
    if (fclose(o) != 0 && rc == 0) rc = sk_error_set(&err, SK_ERR_NO_MEMORY, "out of memory");
    if (rc == 0 && (dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
      rc = sk_error_set(&err, SK_ERR_IO, "%s: %s", dir, strerror(errno));
    if (rc == 0) rc = sk_safefile_write(dfd, slash ? slash + 1 : out, 0644, buf, buf_len, &err);
    if (dfd >= 0) close(dfd);
    free(buf);
    if (rc < 0) {
      fprintf(stderr, "sinkd: cannot write %s: %s\n", out, err.message);
      goto done;
    }
  }
  if (rc < 0) goto fail;
  for (uint32_t i = 0; i < cal.n_levels; i++) {
    fprintf(stderr, "sinkd: level %.2f thresholds:", (double)cal.level[i]);
    for (uint32_t l = 0; l < mc->n_layer; l++)
      fprintf(stderr, " %.3g", (double)cal.thr[(size_t)i * mc->n_layer + l]);
    fputc('\n', stderr);
  }
  if (out) fprintf(stderr, "sinkd: wrote %s (%u tokens of %s)\n", out, n_use, text_path);
  status = 0;
  goto done;
fail:
  fprintf(stderr, "sinkd: --calibrate: %s\n", err.message);
done:
  sk_kv_free(kv);
  sk_sparse_calib_free(&cal);
  sk_sparse_collect_free(col);
  sk_scratch_free(s);
  sk_pool_free(pool);
  free(ids);
  return status;
}


/* ---- the start, step by step ----------------------------------------------- */

/* A start-up problem: to stderr as "sinkd: ..." (check_only) or the log. */
static void say(const struct daemon *d, int level, const char *what) {
  if (d->src->check_only)
    fprintf(stderr, "sinkd: %s%s\n", level == SK_LOG_WARNING ? "warning: " : "", what);
  else
    sk_log(level, "%s", what);
}

/* sk_modelwait_run's re-read (SIGHUP while waiting for a model). */
static int reread_for_model(void *user, const char **ret_model) {
  struct daemon *d = user;
  sk_config_done(&d->cfg);
  if (config_build(d->src, false, &d->cfg) < 0) return -1;
  *ret_model = d->cfg.model;
  return 0;
}

/* start_config's status for a stop (SIGTERM) while waiting for a model:
 * nothing more to start, exit status 0. */
#define STOPPED_WAITING (-1)

/* The configuration (defaults, file, command line) and the kernels; under
 * a service manager with no model yet, the wait for one (modelwait.h). */
static int start_config(struct daemon *d) {
  struct sk_error err = {0};
  if (config_build(d->src, d->src->check_only, &d->cfg) < 0) return SK_EXIT_CONFIG;
  if (!d->src->check_only) {
    int w = sk_modelwait_run(d->cfg.model, d->src->config_path, reread_for_model, d);
    if (w <= 0) return w == 0 ? STOPPED_WAITING : SK_EXIT_START;
  }
  if (!d->cfg.model) {
    /* Say it before loading anything (resolve would say it too). */
    sk_config_resolve(&d->cfg, NULL, &err);
    say(d, SK_LOG_ERR, err.message);
    return SK_EXIT_CONFIG;
  }
  if (!d->src->check_only) {
    sk_log_set_level((int)d->cfg.log_level);
    sk_log(SK_LOG_INFO, "sinkd %s starting (configuration: %s)", SK_VERSION,
           d->cfg.file ? d->cfg.file : "none, built-in defaults");
    sk_notify("STATUS=loading %s", d->cfg.model);
  }
  signal(SIGPIPE, SIG_IGN);
  /* Signals whose default action ends a process without a word: a stray
   * kill -USR1 (or a timer of some library) must not stop the daemon
   * without its clean shutdown. SIGINT and SIGTERM stop it, SIGHUP
   * reloads (serve()). */
  static const int stray[] = {SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGIO};
  for (size_t i = 0; i < sizeof stray / sizeof stray[0]; i++) signal(stray[i], SIG_IGN);
  /* The kernels first: the model loader packs weights for them. */
  if (sk_kernels_select(getenv("SINKD_KERNEL"), &err) < 0) {
    if (d->src->check_only) fprintf(stderr, "sinkd: SINKD_KERNEL: %s\n", err.message);
    else sk_log(SK_LOG_ERR, "SINKD_KERNEL: %s", err.message);
    return SK_EXIT_CONFIG;
  }
  return 0;
}

/* How long --check-config waits for the daemon on its socket to say
 * which it is. */
#define SK_CHECK_PROBE_MS 2000

/* Whether the daemon that answers on path is this configuration's own:
 * its stats name the same state directory. --check-config before a
 * reload finds its own daemon running on the sockets, which is fine; a
 * second daemon's finds another one there, which its start would not get
 * past. */
static bool own_daemon(const char *path, const char *state_dir) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  struct timeval tv = {SK_CHECK_PROBE_MS / 1000, 0};
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0 ||
      connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    if (fd >= 0) close(fd);
    return false;
  }
  struct sk_msgbuf b;
  bool own = false;
  uint8_t head[4], *body = NULL;
  if (sk_wire_pack_req(&b, 1, SK_OP_STATS) == 0) {
    const int64_t n = sk_msgbuf_finish(&b);
    uint32_t len = 0;
    if (n > 0 && write(fd, b.sbuf.data, (size_t)n) == n &&
        recv(fd, head, 4, MSG_WAITALL) == 4 &&
        (len = sk_frame_header_get(head)) > 0 && len <= SK_FRAME_MAX_DEFAULT &&
        (body = malloc(len)) && recv(fd, body, len, MSG_WAITALL) == (ssize_t)len) {
      struct sk_msg msg;
      struct sk_error e;
      const char *dir = NULL;
      size_t dir_len = 0;
      if (sk_msg_parse(body, len, &msg, &e) == 0) {
        char mine[PATH_MAX], theirs[PATH_MAX], got[PATH_MAX];
        if (sk_msg_get_str(&msg.root, "state_dir", &dir, &dir_len, &e) == 1 &&
            dir_len < sizeof got) {
          memcpy(got, dir, dir_len);
          got[dir_len] = 0;
          own = realpath(state_dir, mine) && realpath(got, theirs) && strcmp(mine, theirs) == 0;
        }
        sk_msg_free(&msg);
      }
    }
    sk_msgbuf_free(&b);
  }
  free(body);
  close(fd);
  return own;
}

/* What the start needs besides the model, checked before it loads: the
 * sockets (the protocol's and the HTTP ones: in use, not a socket, a TCP
 * address taken), the state directory (held by another daemon), the HTTP
 * API key file (missing, short, readable by others, not a regular file)
 * and the uid TCP requests act as. A daemon that cannot start says so at
 * once, not after loading the weights, and --check-config finds the same.
 * The socket's folder is made later, after the store's: the socket may
 * live in a folder the store creates. */
static int check_free(struct daemon *d) {
  struct sk_error err = {0};
  const bool check = d->src->check_only;
  if (!check) {
    d->listen_fd = passed_socket(d->passed_path, sizeof d->passed_path, &d->http_fd);
    if (d->listen_fd < 0) return SK_EXIT_START;
  }
  if (sk_config_resolve_sockets(&d->cfg, &err) < 0) {
    say(d, SK_LOG_ERR, err.message);
    return SK_EXIT_CONFIG;
  }
  const bool http_unix = d->http_fd == 0 && d->listen_fd == 0 &&
                         strcmp(d->cfg.http_socket, "none") != 0;
  const struct sk_http_config hc = {.socket_path = http_unix ? d->cfg.http_socket : NULL,
                                    .tcp_listen = d->cfg.http_listen};
  if ((d->listen_fd == 0 && sk_server_check_socket(d->cfg.socket, &err) < 0) ||
      sk_http_check(&hc, &err) < 0 || sk_store_check_busy(d->cfg.state_dir, &err) < 0) {
    if (check && err.code == SK_ERR_BUSY && own_daemon(d->cfg.socket, d->cfg.state_dir)) {
      printf("; the daemon of this configuration runs on %s: its sockets and state directory "
             "are its own\n", d->cfg.socket);
      goto key;
    }
    say(d, SK_LOG_ERR, err.message);
    if (http_unix && err.code == SK_ERR_BUSY && strstr(err.message, d->cfg.http_socket) &&
        d->cfg.origin[SK_CFG_HTTP_SOCKET].automatic)
      say(d, SK_LOG_ERR, "the HTTP socket is named after --socket: give each daemon its own "
                         "--socket, or set --http-socket (http_socket) or none");
    if (!check) {
      log_model_problem(&d->cfg);
      return SK_EXIT_START;
    }
    /* --check-config goes on: the key file and the model may be wrong
     * too, and one run should name every problem. */
    d->check_status = SK_EXIT_START;
  }
key:
  if (d->cfg.http_listen) {
    if (!d->cfg.http_key_file) {
      char at[PATH_MAX + 64] = "";
      if (d->cfg.origin[SK_CFG_HTTP_LISTEN].from == SK_CONFIG_FROM_FILE)
        snprintf(at, sizeof at, "%s:%u: ", d->cfg.file, d->cfg.origin[SK_CFG_HTTP_LISTEN].line);
      snprintf(err.message, sizeof err.message,
               "%sa TCP listener needs an API key: set http_key_file (or --http-key-file) to a "
               "file of mode 0600 holding it",
               at);
      say(d, SK_LOG_ERR, err.message);
      return SK_EXIT_CONFIG;
    }
    if (sk_config_read_key(d->cfg.http_key_file, d->http_key, sizeof d->http_key, &err) < 0) {
      say(d, SK_LOG_ERR, err.message);
      return SK_EXIT_CONFIG;
    }
  }
  return 0;
}

/* The chat template of new sessions: the configured family, or the one
 * the model's tokenizer.chat_template is recognised as. A template no
 * rule recognises leaves the chat op off (it answers why), not the
 * daemon. */
static void pick_chat_template(struct daemon *d) {
  d->chat_template = d->cfg.chat_template;
  if (d->chat_template >= 0) return;
  struct sk_gguf_str ct;
  struct sk_error ce = {0};
  d->chat_template = SK_CHAT_NONE;
  if (sk_gguf_get_str(d->gguf, "tokenizer.chat_template", &ct, &ce) == 1 &&
      sk_chat_resolve(ct.ptr, ct.len, "the model's tokenizer.chat_template", &d->chat_template,
                      &ce) < 0) {
    d->chat_template = SK_CHAT_NONE;
    snprintf(d->chat_error, sizeof d->chat_error, "%s", ce.message);
    say(d, SK_LOG_WARNING, ce.message);
  }
}

/* How far the model's load is: a line in the log and the service's
 * status at each tenth of the layers, for a large model (its file at
 * least SK_LIMIT_LOAD_PROGRESS_BYTES) or a load that has taken a second;
 * a small model loads before anyone would look. */
static void load_progress(void *user, uint32_t done, uint32_t total) {
  struct daemon *d = user;
  const uint64_t ms = sk_clock_ms() - d->load_start_ms;
  const uint32_t tenth = total ? done * 10 / total : 10;
  size_t bytes = 0;
  sk_gguf_bytes(d->gguf, &bytes);
  if ((ms < 1000 && bytes < SK_LIMIT_LOAD_PROGRESS_BYTES) || tenth == d->load_reported ||
      done == total)
    return;
  d->load_reported = tenth;
  sk_log(SK_LOG_INFO, "loading %s: layer %u of %u (%u%%, %.1f s)", d->cfg.model, done, total,
         done * 100 / total, (double)ms / 1000.0);
  sk_notify("STATUS=loading %s: layer %u of %u", d->cfg.model, done, total);
}

/* The model and its tokenizer; the configuration resolved against it.
 * --check-config checks every tensor but copies none (inspect). */
/* The draft model of speculation (draft_model), if configured: loaded as
 * the model is, and refused unless its vocabulary is the model's (the
 * message names the first difference). */
static int load_draft(struct daemon *d) {
  if (!d->cfg.draft_model) return 0;
  struct sk_error err = {0};
  struct sk_tokenizer *dtok = NULL;
  int rc = sk_gguf_open(d->cfg.draft_model, &d->draft_gguf, &err);
  if (rc == 0) rc = sk_model_load(d->draft_gguf, &d->draft, &err);
  if (rc == 0) rc = sk_tokenizer_load(d->draft_gguf, &dtok, &err);
  if (rc == 0 && sk_tokenizer_n_vocab(dtok) != sk_model_config(d->draft)->n_vocab)
    rc = sk_error_set(&err, SK_ERR_BAD_MODEL,
                      "the tokenizer has %u tokens but token_embd.weight has %u rows",
                      sk_tokenizer_n_vocab(dtok), sk_model_config(d->draft)->n_vocab);
  const char *what = "";
  if (rc == 0 && (rc = sk_tokenizer_same_vocab(d->tok, dtok, &err)) < 0)
    what = "its vocabulary is not the model's: ";
  sk_tokenizer_free(dtok);
  if (rc < 0) {
    char at[PATH_MAX + 64] = "";
    if (d->cfg.origin[SK_CFG_DRAFT_MODEL].from == SK_CONFIG_FROM_FILE)
      snprintf(at, sizeof at, "%s:%u: [daemon] draft_model: ", d->cfg.file,
               d->cfg.origin[SK_CFG_DRAFT_MODEL].line);
    char line[PATH_MAX + 2 * SK_ERROR_MESSAGE_MAX];
    snprintf(line, sizeof line, "%scannot use draft model %s: %s%s", at, d->cfg.draft_model,
             what, err.message);
    say(d, SK_LOG_ERR, line);
    return SK_EXIT_START;
  }
  const struct sk_model_config *dc = sk_model_config(d->draft);
  if (!d->src->check_only)
    sk_log(SK_LOG_INFO, "draft model loaded: %s (%s): %u layers, dim %u, %s weights (%.1f MB per "
           "step)",
           d->cfg.draft_model, dc->name, dc->n_layer, dc->dim, sk_model_weight_type(d->draft),
           (double)sk_model_weight_bytes(d->draft) / 1e6);
  return 0;
}

/* The model and its tokenizer; the configuration resolved against it. */
static int load_model(struct daemon *d) {
  struct sk_error err = {0};
  const bool inspect = d->src->check_only && !d->src->calibrate_text;
  const struct sk_model_load_options lo = {.inspect = inspect,
                                           .progress = inspect ? NULL : load_progress,
                                           .progress_user = d};
  d->load_start_ms = sk_clock_ms();
  int rc = sk_gguf_open(d->cfg.model, &d->gguf, &err);
  if (rc == 0) rc = sk_model_load_opts(d->gguf, &lo, &d->model, &err);
  if (rc == 0) rc = sk_tokenizer_load(d->gguf, &d->tok, &err);
  /* Every id the model can produce must have a piece, and every id the
   * tokenizer produces a row of the embedding. */
  if (rc == 0 && sk_tokenizer_n_vocab(d->tok) != sk_model_config(d->model)->n_vocab)
    rc = sk_error_set(&err, SK_ERR_BAD_MODEL,
                      "the tokenizer has %u tokens but token_embd.weight has %u rows",
                      sk_tokenizer_n_vocab(d->tok), sk_model_config(d->model)->n_vocab);
  if (rc < 0) {
    char at[PATH_MAX + 64] = "";
    if (d->cfg.origin[SK_CFG_MODEL].from == SK_CONFIG_FROM_FILE)
      snprintf(at, sizeof at, "%s:%u: [daemon] model: ", d->cfg.file,
               d->cfg.origin[SK_CFG_MODEL].line);
    if (d->src->check_only)
      fprintf(stderr, "sinkd: %scannot load model %s: %s\n", at, d->cfg.model, err.message);
    else
      sk_log(SK_LOG_ERR, "%scannot load model %s: %s", at, d->cfg.model, err.message);
    return SK_EXIT_START;
  }
  d->mc = sk_model_config(d->model);
  if (sk_config_resolve(&d->cfg, d->mc, &err) < 0) {
    say(d, SK_LOG_ERR, err.message);
    return SK_EXIT_CONFIG;
  }
  pick_chat_template(d);
  return load_draft(d);
}

/* --check-config's summary of the model, as comment lines before the
 * configuration: what the file is, read from its header and tensor
 * table (sk_model_load_opts' inspect: every tensor checked, none
 * copied). */
static void print_model_summary(const struct daemon *d) {
  const struct sk_model_config *mc = d->mc;
  uint64_t params = 0, by_type[64] = {0};
  size_t file_bytes = 0;
  sk_gguf_bytes(d->gguf, &file_bytes);
  for (uint64_t i = 0; i < sk_gguf_n_tensors(d->gguf); i++) {
    const struct sk_gguf_tensor *t = sk_gguf_tensor(d->gguf, i);
    uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    params += n;
    if (t->type < 64) by_type[t->type] += n;
  }
  char types[512] = "";
  size_t at = 0;
  for (unsigned k = 0; k < 64 && at < sizeof types; k++)
    if (by_type[k])
      at += (size_t)snprintf(types + at, sizeof types - at, "%s%s %.1f%%", at ? ", " : "",
                             sk_ggml_type_name(k), 100.0 * (double)by_type[k] / (double)params);
  printf("; model %s\n", d->cfg.model);
  printf(";   %s (%s), GGUF v%u, %.1f MB, %.2fM parameters\n", mc->name[0] ? mc->name : "-",
         mc->arch, sk_gguf_version(d->gguf), (double)file_bytes / 1e6, (double)params / 1e6);
  printf(";   %u layers, dim %u, FFN %u, %u heads, %u KV heads, head dim %u\n", mc->n_layer,
         mc->dim, mc->hidden_dim, mc->n_head, mc->n_kv_head, mc->head_dim);
  printf(";   weights %s (of the parameters: %s)\n", sk_model_weight_type(d->model), types);
  printf(";   vocabulary %u tokens, %s, BOS %s\n", sk_tokenizer_n_vocab(d->tok),
         sk_tokenizer_is_bpe(d->tok) ? "byte-level BPE" : "SentencePiece",
         sk_tokenizer_add_bos(d->tok) ? "added" : "not added");
  printf(";   chat template %s%s%s\n",
         sk_chat_name(d->chat_template),
         d->chat_error[0] ? ": " : "", d->chat_error);
  printf(";   context %u tokens (RoPE base %g%s)\n", mc->n_ctx_train, (double)mc->rope_base,
         mc->rope_scale != 1.0f ? ", linear scaling" : "");
}

/* The daemon's model fingerprint (store.h) into d->model_fp: what binds
 * sessions and calibrations to this model. */
static void fingerprint(struct daemon *d) {
  char runs[160];
  sk_store_fingerprint_runs(d->gguf, sk_model_describe(d->model, runs, sizeof runs), d->model_fp);
}

/* The session store: every session of an earlier run is adopted by
 * sk_server_new. */
static int open_store(struct daemon *d) {
  struct sk_error err = {0};
  const struct sk_model_config *mc = d->mc;
  sk_log(SK_LOG_INFO,
         "model loaded in %.1f s: %s (%s): %s, %u layers, dim %u, %u heads, %u KV heads, "
         "vocab %u, context %u, %s weights (%.1f MB per step), %s kernels",
         (double)(sk_clock_ms() - d->load_start_ms) / 1000.0, d->cfg.model, mc->name, mc->arch,
         mc->n_layer, mc->dim, mc->n_head, mc->n_kv_head, mc->n_vocab, mc->n_ctx_train,
         sk_model_weight_type(d->model), (double)sk_model_weight_bytes(d->model) / 1e6,
         sk_kernels_name());
  d->start_max_sessions = d->cfg.max_sessions;
  d->start_max_capacity = d->cfg.max_capacity;
  struct sk_kv_shape kv_shape = sk_model_kv_shape(d->model);
  kv_shape.kv_type = d->cfg.kv_type;
  struct sk_store_config stc = {.dir = d->cfg.state_dir, .shape = kv_shape,
                                .n_vocab = mc->n_vocab};
  fingerprint(d);
  memcpy(stc.model_fp, d->model_fp, sizeof stc.model_fp);
  bool tmpfs = false;
  if (sk_store_open(&stc, &d->store, &tmpfs, &err) < 0) {
    sk_log(SK_LOG_ERR, "%s", err.message);
    if (err.code == SK_ERR_IO && getuid() != 0)
      sk_log(SK_LOG_ERR, "as a user, give a state directory and a socket you may write: "
                         "--state-dir DIR --socket PATH (the defaults are under "
                         "$XDG_RUNTIME_DIR/sinkd, or /run/sinkd when XDG_RUNTIME_DIR is unset)");
    return SK_EXIT_START;
  }
  char fp_hex[33];
  sk_store_fp_hex(d->model_fp, fp_hex);
  sk_log(SK_LOG_INFO, "session store %s (model fingerprint %s)", d->cfg.state_dir, fp_hex);
  if (!tmpfs)
    sk_log(SK_LOG_WARNING, "session store %s is not on tmpfs: session caches are written "
           "through to its file system", d->cfg.state_dir);
  return 0;
}

/* The MLP sparsity calibration (sparsity_file), which must be this
 * model's, into scfg. */
static int load_sparsity(struct daemon *d, struct sk_server_config *scfg) {
  if (!d->cfg.sparsity_file) return 0;
  struct sk_error err = {0};
  if (sk_sparse_calib_load(d->cfg.sparsity_file, d->model_fp, d->mc->n_layer, &d->calib,
                           &err) < 0 ||
      sk_model_sparse_prepare(d->model, &err) < 0) {
    sk_log(SK_LOG_ERR, "sparsity_file: %s", err.message);
    return SK_EXIT_CONFIG;
  }
  char lv[128];
  sk_log(SK_LOG_INFO, "MLP sparsity levels %s from %s (sparse copies of up and down: %.1f MB)",
         sk_sparse_calib_levels(&d->calib, lv, sizeof lv), d->cfg.sparsity_file,
         (double)sk_model_sparse_bytes(d->model) / 1e6);
  scfg->sparse = &d->calib;
  return 0;
}

/* The server on its socket (the passed one, or cfg.socket); scfg is
 * filled for the log line. */
static int start_server(struct daemon *d, struct sk_server_config *scfg) {
  struct sk_error err = {0};
  server_config_from(&d->cfg, scfg);
  scfg->store = d->store;
  scfg->draft = d->draft;
  int rc = load_sparsity(d, scfg);
  if (rc) return rc;
  scfg->on_change = on_counts;
  scfg->user = d;
  scfg->listen_fd = d->listen_fd;
  scfg->chat_template = d->chat_template;
  scfg->chat_error = d->chat_error[0] ? d->chat_error : NULL;
  if (d->listen_fd > 0) {
    sk_log(SK_LOG_INFO, "using the socket passed by the service manager: %s (fd %d)",
           d->passed_path, d->listen_fd);
    scfg->socket_path = d->passed_path;
  } else if (make_socket_dir(d->cfg.socket) < 0) {
    return SK_EXIT_START;
  }
  d->loop = uv_default_loop();
  if (sk_server_new(d->loop, scfg, d->model, d->tok, &d->server, &err) < 0) {
    sk_log(SK_LOG_ERR, "%s", err.message);
    return SK_EXIT_START;
  }
  return 0;
}

/* The HTTP front end (sinkd-http(7)) beside the protocol socket, if
 * configured. Its model id is the file's name without ".gguf": what a
 * user knows it by. A failure stops the server again. */
static int start_http(struct daemon *d) {
  char model_id[256];
  const char *base = strrchr(d->cfg.model, '/');
  snprintf(model_id, sizeof model_id, "%s", base ? base + 1 : d->cfg.model);
  size_t idl = strlen(model_id);
  if (idl > 5 && strcmp(model_id + idl - 5, ".gguf") == 0) model_id[idl - 5] = 0;
  const bool http_unix =
      d->http_fd > 0 || (d->listen_fd == 0 && strcmp(d->cfg.http_socket, "none") != 0);
  if (!http_unix && !d->cfg.http_listen) return 0;
  struct sk_http_config hc = {
      .socket_path = d->http_fd > 0 || !http_unix ? NULL : d->cfg.http_socket,
      .listen_fd = d->http_fd,
      .tcp_listen = d->cfg.http_listen,
      .api_key = d->http_key,
      .tcp_uid = d->cfg.http_uid,
      .model_name = model_id,
      .max_body = d->cfg.max_frame,
  };
  struct sk_error err;
  memset(&err, 0, sizeof err);
  int rc = sk_http_start(d->loop, d->server, &hc, &d->http, &err);
  if (rc < 0 && err.message[0]) sk_log(SK_LOG_ERR, "%s", err.message);
  memset(d->http_key, 0, sizeof d->http_key); /* the front end has its copy */
  if (rc < 0) {
    sk_server_shutdown(d->server);
    uv_run(d->loop, UV_RUN_DEFAULT);
    sk_server_free(d->server);
    d->server = NULL;
    uv_loop_close(d->loop);
    return SK_EXIT_START;
  }
  sk_log(SK_LOG_NOTICE, "HTTP (OpenAI-compatible) on %s%s%s",
         d->http_fd > 0 ? "the passed socket" : http_unix ? d->cfg.http_socket : "",
         http_unix && d->cfg.http_listen ? " and " : "",
         d->cfg.http_listen ? d->cfg.http_listen : "");
  if (d->cfg.http_listen) {
    sk_log(SK_LOG_NOTICE, "HTTP on %s (TCP, API key): requests act as uid %u%s",
           d->cfg.http_listen, d->cfg.http_uid,
           d->cfg.origin[SK_CFG_HTTP_UID].automatic ? " (http_uid auto)" : "");
    if (!sk_config_listen_loopback(d->cfg.http_listen))
      sk_log(SK_LOG_WARNING, "HTTP listens on %s, which other machines may reach: the API key "
             "and every request travel in clear text (http_listen_public = yes)",
             d->cfg.http_listen);
  }
  return 0;
}

/* Signals, the watchdog, READY=1, and the loop until shutdown. */
static void serve(struct daemon *d, const struct sk_server_config *scfg) {
  uv_signal_t *sigs[3] = {&d->sig_int, &d->sig_term, &d->sig_hup};
  const int signums[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(d->loop, sigs[i]);
    sigs[i]->data = d;
    uv_signal_start(sigs[i], on_signal, signums[i]);
  }
  if (sk_watchdog_start(&d->watchdog, d->loop) > 0)
    sk_log(SK_LOG_INFO, "watchdog: pinging the service manager every %llu ms",
           (unsigned long long)d->watchdog.interval_ms);
  sk_log(SK_LOG_NOTICE,
         "sinkd %s listening on %s (default policy %s, sinks %u, window %u, %u thread%s)",
         SK_VERSION, scfg->socket_path, sk_policy_name(d->cfg.policy), d->cfg.n_sink,
         d->cfg.window, d->cfg.threads, d->cfg.threads == 1 ? "" : "s");
  /* Serving for real: the model is loaded and the socket accepts. */
  sk_notify("READY=1");
  send_status(d);
  uv_run(d->loop, UV_RUN_DEFAULT);
  sk_http_free(d->http);
  sk_server_free(d->server);
  uv_loop_close(d->loop);
  sk_log(SK_LOG_INFO, "stopped (sessions kept in %s)", d->cfg.state_dir);
}

static void daemon_free(struct daemon *d) {
  sk_sparse_calib_free(&d->calib);
  sk_store_close(d->store);
  sk_tokenizer_free(d->tok);
  sk_model_free(d->model);
  sk_gguf_close(d->gguf);
  sk_model_free(d->draft);
  sk_gguf_close(d->draft_gguf);
  sk_config_done(&d->cfg);
}

int sk_startup_run(struct sk_startup *st) {
  struct daemon d;
  memset(&d, 0, sizeof d);
  d.src = st;
  struct sk_server_config scfg = {0};
  int status = start_config(&d);
  if (status == STOPPED_WAITING) {
    daemon_free(&d);
    sk_config_done(&st->cli);
    return 0;
  }
  if (!status && !st->calibrate_text) status = check_free(&d);
  if (!status) status = load_model(&d);
  if (!status && st->calibrate_text) {
    fingerprint(&d);
    status = calibrate(d.model, d.tok, d.model_fp, st->calibrate_text, d.cfg.sparsity_file,
                       d.cfg.threads, d.cfg.batch);
  } else if (!status && st->check_only) {
    print_model_summary(&d);
    sk_config_print(stdout, &d.cfg);
    status = fflush(stdout) == 0 ? d.check_status : SK_EXIT_START;
  } else if (!status) {
    if (!(status = open_store(&d)) && !(status = start_server(&d, &scfg)) &&
        !(status = start_http(&d)))
      serve(&d, &scfg);
  }
  daemon_free(&d);
  memset(d.http_key, 0, sizeof d.http_key);
  sk_config_done(&st->cli);
  return status;
}
