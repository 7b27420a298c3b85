/* sinkd: configuration (file + command line), model loading, the socket
 * (its own or the service manager's), signals, sd_notify and the event
 * loop. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <uv.h>

#include "model/chat.h"
#include "config.h"
#include "model/gguf.h"
#include "model/kernels.h"
#include "session/kvcache.h"
#include "base/log.h"
#include "model/model.h"
#include "http/http.h"
#include "base/notify.h"
#include "model/pool.h"
#include "server/server.h"
#include "model/sparse.h"
#include "sk_config.h"
#include "session/store.h"
#include "model/tokenizer.h"

/* Exit statuses (sinkd(8)). */
enum {
  EXIT_START = 1,  /* model, socket or other start-up failure */
  EXIT_CONFIG = 2, /* usage or configuration error */
};

static void usage(FILE *f) {
  fprintf(f,
          "Usage: sinkd [OPTIONS]\n"
          "Serve an LLM to local clients over a Unix socket, one endless session\n"
          "per client with a fixed-size KV cache (attention sinks + window).\n"
          "Settings come from the configuration file, then these options.\n"
          "\n"
          "  -c, --config FILE       configuration file (default %s;\n"
          "                          a missing default file is fine)\n"
          "      --check-config      check the configuration and the model, print\n"
          "                          the effective configuration and exit\n"
          "  -m, --model FILE        GGUF model (weights: any type llama-quantize writes\n"
          "                          but the IQ1-IQ3 ones; see sinkd(8))\n"
          "  -s, --socket PATH       socket to listen on (default /run/sinkd/sinkd.sock,\n"
          "                          or $XDG_RUNTIME_DIR/sinkd/sinkd.sock for non-root);\n"
          "                          unused when systemd passes a socket\n"
          "      --state-dir DIR     session store folder, on tmpfs (default\n"
          "                          /run/sinkd/state, or $XDG_RUNTIME_DIR/sinkd/state\n"
          "                          for non-root)\n"
          "  -t, --threads N|auto    compute threads for the model (auto: online CPUs)\n"
          "      --policy NAME       default policy: streaming, window, h2o, sink_h2o\n"
          "                          or dense (streaming)\n"
          "      --sinks N           default attention sinks (4)\n"
          "      --window N|auto     default window (auto: min(context, 1024) - sinks)\n"
          "      --capacity N|auto   default dense capacity (auto: model context)\n"
          "      --max-capacity N|auto  largest KV cache a session may ask for\n"
          "                          (auto: 8192, or the context if larger)\n"
          "      --max-sessions N    sessions open at once (64)\n"
          "      --max-clients N     connections at once (1024; the last 8 are kept\n"
          "                          for root)\n"
          "      --max-user-clients N  connections one user (uid) other than root may\n"
          "                          hold (128; 0 = no limit but max-clients)\n"
          "      --frame-timeout SECONDS  close a connection that takes longer to send\n"
          "                          a whole request (30; 0 = never)\n"
          "      --max-input-memory SIZE|auto  bytes of unfinished requests of all\n"
          "                          clients (auto: 64 x max-frame)\n"
          "      --max-user-input-memory SIZE|auto  the same for one user (auto:\n"
          "                          16 x max-frame)\n"
          "      --max-memory SIZE|auto  bytes of all session caches (auto: half the RAM)\n"
          "      --max-user-sessions N  sessions one user (uid) may own (16)\n"
          "      --max-user-memory SIZE|auto  bytes of one user's session caches\n"
          "                          (auto: max-memory)\n"
          "      --max-frame SIZE    largest request frame (1M)\n"
          "      --idle-ttl SECONDS  close persistent sessions idle this long\n"
          "                          (604800 = 7 days; 0 = never)\n"
          "      --batch N           tokens per forward pass: one per generating session\n"
          "                          plus prefill chunks (64)\n"
          "      --kv-type TYPE      element type of new sessions' KV caches: f16 (default:\n"
          "                          keys and values in half the bytes, rounded) or f32\n"
          "      --chat-template NAME  template family of the chat op: auto (default: the\n"
          "                          model's tokenizer.chat_template), none, or a family\n"
          "                          (chatml, llama3, mistral-v7, ...; sinkd.conf(5))\n"
          "      --http-socket PATH|none  the OpenAI-compatible HTTP socket (default\n"
          "                          sinkd-http.sock beside --socket; see sinkd-http(7))\n"
          "      --http-listen ADDR:PORT  also serve HTTP on TCP (needs --http-key-file)\n"
          "      --http-key-file FILE  API key for TCP requests (file of mode 0600)\n"
          "      --http-uid UID|auto  uid that TCP requests act as (auto: sinkd's own)\n",
          sk_config_default_path());
  /* (two strings: C11 compilers need take no literal above 4095 bytes) */
  fputs("      --sparsity-file FILE  MLP sparsity calibration for sessions that ask\n"
          "                          for sparsity (written by --calibrate)\n"
          "      --calibrate TEXT    compute the sparsity thresholds (levels 0.1, 0.2,\n"
          "                          ..., 0.7) of the model over the text file TEXT, write\n"
          "                          them to --sparsity-file (or stdout) and exit\n"
          "      --log-level LEVEL   err, warning, notice, info (default) or debug\n"
          "  -v, --verbose           same as --log-level debug\n"
          "  -h, --help              this text\n"
          "  -V, --version           version\n"
          "\n"
          "Signals: SIGHUP re-reads the configuration (limits, session defaults,\n"
          "log level); SIGINT/SIGTERM shut down cleanly.\n"
          "Exit status: 0 after a clean shutdown, 1 on a start-up error (bad model,\n"
          "socket in use), 2 on a usage or configuration error.\n"
          "See sinkd(8), sinkd.conf(5) and sinkd-http(7).\n",
        f);
}

/* ---- configuration ------------------------------------------------------- */

struct config_source {
  const char *path;       /* file to read */
  bool explicit_path;     /* given with --config: must exist */
  struct sk_config cli;   /* the command line's values */
};

/* Builds defaults + file + command line into *ret. Problems go to the log
 * (daemon) or to stderr as "sinkd: ..." (check_only). */
static int config_build(const struct config_source *src, bool check_only, struct sk_config *ret) {
  if (sk_config_init(ret) < 0) {
    sk_log(SK_LOG_ERR, "out of memory");
    return -SK_ERR_NO_MEMORY;
  }
  struct sk_config_errors errs;
  int rc = sk_config_load(ret, src->path, src->explicit_path, &errs);
  if (rc < 0) {
    for (uint32_t i = 0; i < errs.n; i++) {
      if (check_only)
        fprintf(stderr, "sinkd: %s\n", errs.e[i].message);
      else
        sk_log(SK_LOG_ERR, "%s", errs.e[i].message);
    }
    if (errs.dropped) {
      if (check_only)
        fprintf(stderr, "sinkd: %s: %u more errors\n", src->path, errs.dropped);
      else
        sk_log(SK_LOG_ERR, "%s: %u more errors", src->path, errs.dropped);
    }
    if (rc == -SK_ERR_NO_MEMORY) sk_log(SK_LOG_ERR, "out of memory reading %s", src->path);
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

static void server_config_from(const struct sk_config *c, struct sk_server_config *s) {
  s->socket_path = c->socket;
  s->model_path = c->model;
  s->max_frame = c->max_frame;
  s->max_sessions = c->max_sessions;
  s->max_clients = c->max_clients;
  s->max_capacity = c->max_capacity;
  s->max_memory = c->max_memory;
  s->idle_ttl_s = c->idle_ttl;
  s->max_user_clients = c->max_user_clients;
  s->frame_timeout_s = c->frame_timeout;
  s->max_input_bytes = c->max_input_memory;
  s->max_user_input_bytes = c->max_user_input_memory;
  s->max_user_sessions = c->max_user_sessions;
  s->max_user_kv_bytes = c->max_user_memory;
  s->max_batch = c->batch;
  s->threads = c->threads;
  s->kv_type = c->kv_type;
  s->defaults.policy = c->policy;
  s->defaults.n_sink = c->n_sink;
  s->defaults.window = c->window;
  s->defaults.capacity = c->capacity;
  s->defaults.rope_scale = 1.0f;
  /* h2o and sink_h2o split the streaming budget between heavy hitters and
   * recent tokens in equal halves (as Zhang et al. 2023 do). */
  uint32_t budget = c->n_sink + c->window;
  s->defaults.heavy = budget / 2 > 0 ? budget / 2 : 1;
  s->defaults.recent = budget - budget / 2 > 0 ? budget - budget / 2 : 1;
}

/* Logs "cannot load model" when the model file's structure is wrong, for
 * a start that fails before loading it (socket or state directory in
 * use): the model's own problem must not hide behind the other. Only
 * the GGUF structure is read (sk_gguf_open maps it), not the weights. */
static void log_model_problem(const struct sk_config *c) {
  struct sk_gguf *g = NULL;
  struct sk_error e;
  if (sk_gguf_open(c->model, &g, &e) < 0) {
    char at[PATH_MAX + 64] = "";
    if (c->origin[SK_CFG_MODEL].from == SK_CONFIG_FROM_FILE)
      snprintf(at, sizeof at, "%s:%u: [daemon] model: ", c->file, c->origin[SK_CFG_MODEL].line);
    sk_log(SK_LOG_ERR, "%scannot load model %s: %s", at, c->model, e.message);
    return;
  }
  sk_gguf_close(g);
}

/* ---- the running daemon -------------------------------------------------- */

struct daemon {
  struct config_source src;
  struct sk_config cfg; /* effective, resolved */
  const struct sk_model_config *mc;
  struct sk_server *server;
  struct sk_http *http; /* the HTTP front end, or NULL */
  uv_signal_t sig_int, sig_term, sig_hup;
  struct sk_watchdog watchdog;
  uint32_t n_sessions, n_clients;
  uint32_t start_max_sessions, start_max_capacity; /* sizes fixed at start */
  bool stopping;
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
  sk_notify("RELOADING=1\nSTATUS=reloading %s", d->src.path);
  struct sk_config next;
  struct sk_error e;
  if (config_build(&d->src, false, &next) < 0) {
    sk_log(SK_LOG_ERR, "reload: %s has errors; keeping the running configuration", d->src.path);
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
    sk_log(SK_LOG_WARNING, "reload: %s changed; restart sinkd to apply (keeping the running values)",
           restart);
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
  sk_log(SK_LOG_NOTICE, "reloaded %s%s: %s", d->src.path,
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

/* Reads the HTTP API key from path: a file only its owner may read
 * (mode 0600 or stricter), holding the key on one line. Returns 0, or -1
 * after logging why. */
static int read_key_file(const char *path, char *ret, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    sk_log(SK_LOG_ERR, "http_key_file %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077)) {
    sk_log(SK_LOG_ERR, "http_key_file %s: must be a regular file of mode 0600 (it is %04o): "
                       "chmod 600 %s", path, (unsigned)(st.st_mode & 07777), path);
    close(fd);
    return -1;
  }
  ssize_t n = read(fd, ret, size - 1);
  close(fd);
  if (n < 0) n = 0;
  ret[n] = 0;
  while (n > 0 && (ret[n - 1] == '\n' || ret[n - 1] == '\r' || ret[n - 1] == ' ')) ret[--n] = 0;
  bool ok = n >= 16 && (size_t)n < size - 1;
  for (ssize_t i = 0; i < n; i++)
    if (ret[i] <= 0x20 || ret[i] == 0x7f) ok = false;
  if (!ok) {
    sk_log(SK_LOG_ERR, "http_key_file %s: the key must be one line of 16 to %zu printable "
                       "characters without spaces", path, size - 2);
    return -1;
  }
  return 0;
}

/* ---- command line ---------------------------------------------------------- */

enum { OPT_CHECK_CONFIG = 256, OPT_CALIBRATE, OPT_KEY_BASE = 1000 };

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
static int calibrate(const struct sk_model *m, const struct sk_tokenizer *tok, const uint8_t fp[16],
                     const char *text_path, const char *out, uint32_t threads, uint32_t batch) {
  struct sk_error err = {0};
  const struct sk_model_config *c = sk_model_config(m);
  FILE *f = fopen(text_path, "rb");
  if (!f) {
    fprintf(stderr, "sinkd: --calibrate %s: %s\n", text_path, strerror(errno));
    return EXIT_CONFIG;
  }
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? 2 * cap : 1 << 16;
      char *t = cap <= (64u << 20) ? realloc(text, cap) : NULL;
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
    return EXIT_CONFIG;
  }
  free(text);
  const uint32_t win = c->n_ctx_train < SK_LIMIT_CALIB_WINDOW ? c->n_ctx_train : SK_LIMIT_CALIB_WINDOW;
  const uint32_t n_use = n_ids < SK_LIMIT_CALIB_TOKENS ? (uint32_t)n_ids : SK_LIMIT_CALIB_TOKENS;
  const uint32_t chunk = batch < win - 1 ? batch : win - 1; /* tokens per pass, BOS apart */
  int status = EXIT_START;
  struct sk_pool *pool = NULL;
  struct sk_scratch *s = NULL;
  struct sk_sparse_collect *col = NULL;
  struct sk_sparse_calib cal = {0};
  struct sk_kv *kv = NULL;
  if (sk_pool_new(threads ? threads : 1, &pool, &err) < 0 ||
      sk_scratch_new_pool(m, chunk + 1, win, pool, &s, &err) < 0 ||
      sk_sparse_collect_new(c->n_layer, c->hidden_dim, n_use, SK_LIMIT_CALIB_SAMPLES, &col, &err) < 0)
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
    while (at < n_use && kv->hdr->n_resident + chunk <= win) {
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
  char tmp[PATH_MAX];
  FILE *o = stdout;
  if (out) {
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    if (!(o = fopen(tmp, "w"))) {
      fprintf(stderr, "sinkd: %s: %s\n", tmp, strerror(errno));
      goto done;
    }
  }
  int rc = sk_sparse_calib_write(o, &cal, &err);
  if (out && (fclose(o) != 0 || rc < 0 || rename(tmp, out) < 0)) {
    fprintf(stderr, "sinkd: cannot write %s: %s\n", out, rc < 0 ? err.message : strerror(errno));
    unlink(tmp);
    goto done;
  }
  if (rc < 0) goto fail;
  for (uint32_t i = 0; i < cal.n_levels; i++) {
    fprintf(stderr, "sinkd: level %.2f thresholds:", (double)cal.level[i]);
    for (uint32_t l = 0; l < c->n_layer; l++)
      fprintf(stderr, " %.3g", (double)cal.thr[(size_t)i * c->n_layer + l]);
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

int main(int argc, char **argv) {
  struct daemon d;
  memset(&d, 0, sizeof d);
  sk_log_init();
  d.src.path = sk_config_default_path();
  bool check_only = false;
  const char *calibrate_text = NULL;
  if (sk_config_init(&d.src.cli) < 0) {
    fprintf(stderr, "sinkd: out of memory\n");
    return EXIT_START;
  }
#define KEY_OPT(name, key) {name, required_argument, NULL, OPT_KEY_BASE + (key)}
  static const struct option longopts[] = {
      {"config", required_argument, NULL, 'c'},
      {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
      KEY_OPT("model", SK_CFG_MODEL),
      KEY_OPT("socket", SK_CFG_SOCKET),
      KEY_OPT("state-dir", SK_CFG_STATE_DIR),
      KEY_OPT("threads", SK_CFG_THREADS),
      KEY_OPT("policy", SK_CFG_POLICY),
      KEY_OPT("sinks", SK_CFG_SINKS),
      KEY_OPT("window", SK_CFG_WINDOW),
      KEY_OPT("capacity", SK_CFG_CAPACITY),
      KEY_OPT("max-capacity", SK_CFG_MAX_CAPACITY),
      KEY_OPT("max-sessions", SK_CFG_MAX_SESSIONS),
      KEY_OPT("max-clients", SK_CFG_MAX_CLIENTS),
      KEY_OPT("max-memory", SK_CFG_MAX_MEMORY),
      KEY_OPT("max-user-sessions", SK_CFG_MAX_USER_SESSIONS),
      KEY_OPT("max-user-memory", SK_CFG_MAX_USER_MEMORY),
      KEY_OPT("max-frame", SK_CFG_MAX_FRAME),
      KEY_OPT("idle-ttl", SK_CFG_IDLE_TTL),
      KEY_OPT("max-user-clients", SK_CFG_MAX_USER_CLIENTS),
      KEY_OPT("frame-timeout", SK_CFG_FRAME_TIMEOUT),
      KEY_OPT("max-input-memory", SK_CFG_MAX_INPUT_MEMORY),
      KEY_OPT("max-user-input-memory", SK_CFG_MAX_USER_INPUT_MEMORY),
      KEY_OPT("batch", SK_CFG_BATCH),
      KEY_OPT("log-level", SK_CFG_LOG_LEVEL),
      KEY_OPT("kv-type", SK_CFG_KV_TYPE),
      KEY_OPT("chat-template", SK_CFG_CHAT_TEMPLATE),
      KEY_OPT("http-socket", SK_CFG_HTTP_SOCKET),
      KEY_OPT("http-listen", SK_CFG_HTTP_LISTEN),
      KEY_OPT("http-key-file", SK_CFG_HTTP_KEY_FILE),
      KEY_OPT("http-uid", SK_CFG_HTTP_UID),
      KEY_OPT("sparsity-file", SK_CFG_SPARSITY_FILE),
      {"calibrate", required_argument, NULL, OPT_CALIBRATE},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
#undef KEY_OPT
  int ch;
  opterr = 0;
  while ((ch = getopt_long(argc, argv, ":c:m:s:t:vhV", longopts, NULL)) != -1) {
    int key = -1;
    const char *value = optarg;
    switch (ch) {
    case 'c':
      d.src.path = optarg;
      d.src.explicit_path = true;
      break;
    case OPT_CHECK_CONFIG: check_only = true; break;
    case OPT_CALIBRATE:
      calibrate_text = optarg;
      check_only = true; /* no socket, no store: the model only */
      break;
    case 'm': key = SK_CFG_MODEL; break;
    case 's': key = SK_CFG_SOCKET; break;
    case 't': key = SK_CFG_THREADS; break;
    case 'v':
      key = SK_CFG_LOG_LEVEL;
      value = "debug";
      break;
    case 'h': usage(stdout); sk_config_done(&d.src.cli); return 0;
    case 'V': printf("sinkd %s\n", SK_VERSION); sk_config_done(&d.src.cli); return 0;
    case ':':
      fprintf(stderr, "sinkd: option '%s' needs a value\n", argv[optind - 1]);
      sk_config_done(&d.src.cli);
      return EXIT_CONFIG;
    default:
      if (ch >= OPT_KEY_BASE && ch < OPT_KEY_BASE + SK_CFG__COUNT) {
        key = ch - OPT_KEY_BASE;
        break;
      }
      fprintf(stderr, "sinkd: unknown option '%s' (see sinkd --help)\n", argv[optind - 1]);
      sk_config_done(&d.src.cli);
      return EXIT_CONFIG;
    }
    struct sk_error e;
    if (key >= 0 && sk_config_set(&d.src.cli, (enum sk_config_key)key, value,
                                  SK_CONFIG_FROM_COMMAND_LINE, 0, &e) < 0) {
      fprintf(stderr, "sinkd: %s: %s\n", ch == 'v' ? "--verbose" : sk_config_key_option((enum sk_config_key)key),
              e.message);
      sk_config_done(&d.src.cli);
      return EXIT_CONFIG;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "sinkd: unexpected argument '%s' (see sinkd --help)\n", argv[optind]);
    sk_config_done(&d.src.cli);
    return EXIT_CONFIG;
  }

  int status = EXIT_CONFIG;
  struct sk_gguf *gguf = NULL;
  struct sk_model *model = NULL;
  struct sk_tokenizer *tok = NULL;
  struct sk_store *store = NULL;
  struct sk_sparse_calib calib = {0};
  struct sk_error err = {0};
  if (config_build(&d.src, check_only, &d.cfg) < 0) goto out;
  if (!d.cfg.model) {
    /* Say it before loading anything (resolve would say it too). */
    sk_config_resolve(&d.cfg, NULL, &err);
    if (check_only) fprintf(stderr, "sinkd: %s\n", err.message);
    else sk_log(SK_LOG_ERR, "%s", err.message);
    goto out;
  }
  if (!check_only) {
    sk_log_set_level((int)d.cfg.log_level);
    sk_log(SK_LOG_INFO, "sinkd %s starting (configuration: %s)", SK_VERSION,
           d.cfg.file ? d.cfg.file : "none, built-in defaults");
    sk_notify("STATUS=loading %s", d.cfg.model);
  }
  signal(SIGPIPE, SIG_IGN);

  /* The kernels first: the model loader packs weights for them. */
  if (sk_kernels_select(getenv("SINKD_KERNEL"), &err) < 0) {
    if (check_only) fprintf(stderr, "sinkd: SINKD_KERNEL: %s\n", err.message);
    else sk_log(SK_LOG_ERR, "SINKD_KERNEL: %s", err.message);
    status = EXIT_CONFIG;
    goto out;
  }
  status = EXIT_START;
  /* The socket and the state directory before the model: a daemon that
   * cannot listen on the socket (in use, not a socket) or whose state
   * directory another daemon holds says so at once, not after loading
   * the weights. The socket's folder is made later, after the store's:
   * the socket may live in a folder the store creates. */
  char passed_path[sizeof(((struct sockaddr_un *)0)->sun_path) + 16];
  int listen_fd = 0, http_fd = 0;
  if (!check_only) {
    listen_fd = passed_socket(passed_path, sizeof passed_path, &http_fd);
    if (listen_fd < 0) goto out;
    if (listen_fd == 0 && sk_server_check_socket(d.cfg.socket, &err) < 0) {
      sk_log(SK_LOG_ERR, "%s", err.message);
      log_model_problem(&d.cfg);
      goto out;
    }
    /* Likewise a state directory that another daemon holds. */
    if (sk_store_check_busy(d.cfg.state_dir, &err) < 0) {
      sk_log(SK_LOG_ERR, "%s", err.message);
      log_model_problem(&d.cfg);
      goto out;
    }
  }
  int rc = sk_gguf_open(d.cfg.model, &gguf, &err);
  if (rc == 0) rc = sk_model_load(gguf, &model, &err);
  if (rc == 0) rc = sk_tokenizer_load(gguf, &tok, &err);
  /* Every id the model can produce must have a piece, and every id the
   * tokenizer produces a row of the embedding. */
  if (rc == 0 && sk_tokenizer_n_vocab(tok) != sk_model_config(model)->n_vocab)
    rc = sk_error_set(&err, SK_ERR_BAD_MODEL,
                      "the tokenizer has %u tokens but token_embd.weight has %u rows",
                      sk_tokenizer_n_vocab(tok), sk_model_config(model)->n_vocab);
  if (rc < 0) {
    char at[PATH_MAX + 64] = "";
    if (d.cfg.origin[SK_CFG_MODEL].from == SK_CONFIG_FROM_FILE)
      snprintf(at, sizeof at, "%s:%u: [daemon] model: ", d.cfg.file, d.cfg.origin[SK_CFG_MODEL].line);
    if (check_only)
      fprintf(stderr, "sinkd: %scannot load model %s: %s\n", at, d.cfg.model, err.message);
    else
      sk_log(SK_LOG_ERR, "%scannot load model %s: %s", at, d.cfg.model, err.message);
    goto out;
  }
  d.mc = sk_model_config(model);
  if (sk_config_resolve(&d.cfg, d.mc, &err) < 0) {
    if (check_only) fprintf(stderr, "sinkd: %s\n", err.message);
    else sk_log(SK_LOG_ERR, "%s", err.message);
    status = EXIT_CONFIG;
    goto out;
  }
  /* The chat template of new sessions: the configured family, or the one
   * the model's tokenizer.chat_template is recognised as. A template no
   * rule recognises leaves the chat op off (it answers why), not the
   * daemon. */
  int chat_template = d.cfg.chat_template;
  char chat_error[SK_ERROR_MESSAGE_MAX] = "";
  if (chat_template < 0) {
    struct sk_gguf_str ct;
    struct sk_error ce = {0};
    chat_template = SK_CHAT_NONE;
    if (sk_gguf_get_str(gguf, "tokenizer.chat_template", &ct, &ce) == 1 &&
        sk_chat_resolve(ct.ptr, ct.len, "the model's tokenizer.chat_template", &chat_template,
                        &ce) < 0) {
      chat_template = SK_CHAT_NONE;
      snprintf(chat_error, sizeof chat_error, "%s", ce.message);
      if (check_only) fprintf(stderr, "sinkd: warning: %s\n", ce.message);
      else sk_log(SK_LOG_WARNING, "%s", ce.message);
    }
  }
  if (calibrate_text) {
    char runs[160];
    uint8_t fp[SK_STORE_FP_SIZE];
    sk_store_fingerprint_runs(gguf, sk_model_describe(model, runs, sizeof runs), fp);
    status = calibrate(model, tok, fp, calibrate_text, d.cfg.sparsity_file, d.cfg.threads,
                       d.cfg.batch);
    goto out;
  }
  if (check_only) {
    sk_config_print(stdout, &d.cfg);
    status = fflush(stdout) == 0 ? 0 : EXIT_START;
    goto out;
  }
  sk_log(SK_LOG_INFO,
         "model loaded: %s (%s): %s, %u layers, dim %u, %u heads, %u KV heads, vocab %u, "
         "context %u, %s weights (%.1f MB per step), %s kernels",
         d.cfg.model, d.mc->name, d.mc->arch, d.mc->n_layer, d.mc->dim, d.mc->n_head, d.mc->n_kv_head,
         d.mc->n_vocab, d.mc->n_ctx_train, sk_model_weight_type(model),
         (double)sk_model_weight_bytes(model) / 1e6, sk_kernels_name());
  d.start_max_sessions = d.cfg.max_sessions;
  d.start_max_capacity = d.cfg.max_capacity;

  /* The session store: every session of an earlier run is adopted by
   * sk_server_new. */
  struct sk_kv_shape kv_shape = sk_model_kv_shape(model);
  kv_shape.kv_type = d.cfg.kv_type;
  struct sk_store_config stc = {.dir = d.cfg.state_dir, .shape = kv_shape,
                                .n_vocab = d.mc->n_vocab};
  char runs[160];
  sk_store_fingerprint_runs(gguf, sk_model_describe(model, runs, sizeof runs), stc.model_fp);
  bool tmpfs = false;
  if (sk_store_open(&stc, &store, &tmpfs, &err) < 0) {
    sk_log(SK_LOG_ERR, "%s", err.message);
    if (err.code == SK_ERR_IO && getuid() != 0)
      sk_log(SK_LOG_ERR, "as a user, give a state directory and a socket you may write: "
                         "--state-dir DIR --socket PATH (the defaults are under "
                         "$XDG_RUNTIME_DIR/sinkd, or /run/sinkd when XDG_RUNTIME_DIR is unset)");
    goto out;
  }
  char fp_hex[33];
  sk_store_fp_hex(stc.model_fp, fp_hex);
  sk_log(SK_LOG_INFO, "session store %s (model fingerprint %s)", d.cfg.state_dir, fp_hex);
  if (!tmpfs)
    sk_log(SK_LOG_WARNING, "session store %s is not on tmpfs: session caches are written "
           "through to its file system", d.cfg.state_dir);

  struct sk_server_config scfg = {0};
  server_config_from(&d.cfg, &scfg);
  scfg.store = store;
  /* MLP sparsity: the calibration must be this model's */
  if (d.cfg.sparsity_file) {
    if (sk_sparse_calib_load(d.cfg.sparsity_file, stc.model_fp, d.mc->n_layer, &calib, &err) < 0 ||
        sk_model_sparse_prepare(model, &err) < 0) {
      sk_log(SK_LOG_ERR, "sparsity_file: %s", err.message);
      status = EXIT_CONFIG;
      goto out;
    }
    char lv[128];
    sk_log(SK_LOG_INFO, "MLP sparsity levels %s from %s (sparse copies of up and down: %.1f MB)",
           sk_sparse_calib_levels(&calib, lv, sizeof lv), d.cfg.sparsity_file,
           (double)sk_model_sparse_bytes(model) / 1e6);
    scfg.sparse = &calib;
  }
  scfg.on_change = on_counts;
  scfg.user = &d;
  scfg.listen_fd = listen_fd;
  scfg.chat_template = chat_template;
  scfg.chat_error = chat_error[0] ? chat_error : NULL;
  if (listen_fd > 0) {
    sk_log(SK_LOG_INFO, "using the socket passed by the service manager: %s (fd %d)", passed_path,
           listen_fd);
    scfg.socket_path = passed_path;
  } else if (make_socket_dir(d.cfg.socket) < 0) {
    goto out;
  }

  uv_loop_t *loop = uv_default_loop();
  rc = sk_server_new(loop, &scfg, model, tok, &d.server, &err);
  if (rc < 0) {
    sk_log(SK_LOG_ERR, "%s", err.message);
    goto out;
  }
  /* The HTTP front end (sinkd-http(7)) beside the protocol socket. Its
   * model id is the file's name without ".gguf": what a user knows it by. */
  char model_id[256];
  const char *base = strrchr(d.cfg.model, '/');
  snprintf(model_id, sizeof model_id, "%s", base ? base + 1 : d.cfg.model);
  size_t idl = strlen(model_id);
  if (idl > 5 && strcmp(model_id + idl - 5, ".gguf") == 0) model_id[idl - 5] = 0;
  bool http_unix = http_fd > 0 || (listen_fd == 0 && strcmp(d.cfg.http_socket, "none") != 0);
  if (http_unix || d.cfg.http_listen) {
    char key[1024] = "";
    struct sk_http_config hc = {
        .socket_path = http_fd > 0 || !http_unix ? NULL : d.cfg.http_socket,
        .listen_fd = http_fd,
        .tcp_listen = d.cfg.http_listen,
        .api_key = key,
        .tcp_uid = d.cfg.http_uid,
        .model_name = model_id,
        .max_body = d.cfg.max_frame,
    };
    memset(&err, 0, sizeof err);
    if (d.cfg.http_listen && read_key_file(d.cfg.http_key_file, key, sizeof key) < 0)
      rc = -1;
    if (rc == 0) rc = sk_http_start(loop, d.server, &hc, &d.http, &err);
    if (rc < 0 && err.message[0]) sk_log(SK_LOG_ERR, "%s", err.message);
    memset(key, 0, sizeof key);
    if (rc < 0) {
      sk_server_shutdown(d.server);
      uv_run(loop, UV_RUN_DEFAULT);
      sk_server_free(d.server);
      uv_loop_close(loop);
      goto out;
    }
    sk_log(SK_LOG_NOTICE, "HTTP (OpenAI-compatible) on %s%s%s", http_fd > 0 ? "the passed socket" : http_unix ? d.cfg.http_socket : "",
           http_unix && d.cfg.http_listen ? " and " : "", d.cfg.http_listen ? d.cfg.http_listen : "");
  }
  uv_signal_t *sigs[3] = {&d.sig_int, &d.sig_term, &d.sig_hup};
  const int signums[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(loop, sigs[i]);
    sigs[i]->data = &d;
    uv_signal_start(sigs[i], on_signal, signums[i]);
  }
  if (sk_watchdog_start(&d.watchdog, loop) > 0)
    sk_log(SK_LOG_INFO, "watchdog: pinging the service manager every %llu ms",
           (unsigned long long)d.watchdog.interval_ms);

  sk_log(SK_LOG_NOTICE,
         "sinkd %s listening on %s (default policy %s, sinks %u, window %u, %u thread%s)",
         SK_VERSION, scfg.socket_path, sk_policy_name(d.cfg.policy), d.cfg.n_sink, d.cfg.window,
         d.cfg.threads, d.cfg.threads == 1 ? "" : "s");
  /* Serving for real: the model is loaded and the socket accepts. */
  sk_notify("READY=1");
  send_status(&d);
  uv_run(loop, UV_RUN_DEFAULT);
  sk_http_free(d.http);
  sk_server_free(d.server);
  uv_loop_close(loop);
  sk_log(SK_LOG_INFO, "stopped (sessions kept in %s)", d.cfg.state_dir);
  status = 0;

out:
  sk_sparse_calib_free(&calib);
  sk_store_close(store);
  sk_tokenizer_free(tok);
  sk_model_free(model);
  sk_gguf_close(gguf);
  sk_config_done(&d.cfg);
  sk_config_done(&d.src.cli);
  return status;
}
