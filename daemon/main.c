/* sinkd: command line, model loading, signals, the event loop. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>
#include <uv.h>

#include "gguf.h"
#include "kvcache.h"
#include "log.h"
#include "model.h"
#include "server.h"
#include "sk_config.h"
#include "tokenizer.h"

/* Default limits, each with its reason. */
#define DEFAULT_MAX_SESSIONS 64u   /* each holds a full KV cache */
#define DEFAULT_MAX_CLIENTS 1024u  /* well under a default fd limit */
#define DEFAULT_BATCH 64u          /* prefill chunk: keeps other sessions' tokens flowing */
#define DEFAULT_N_SINK 4u          /* StreamingLLM: 4 sinks suffice */
#define DEFAULT_WINDOW_SPAN 1024u  /* n_sink + window, unless the model is shorter */
#define DEFAULT_MAX_CAPACITY 8192u

struct options {
  const char *model;
  char *socket;
  long threads;
  const char *policy;
  long n_sink, window, capacity, max_sessions, max_clients, max_frame, max_capacity, batch;
  int verbose;
};

static void usage(FILE *f) {
  fprintf(f,
          "Usage: sinkd --model FILE [OPTIONS]\n"
          "Serve an LLM to local clients over a Unix socket, one endless session\n"
          "per client with a fixed-size KV cache (attention sinks + window).\n"
          "\n"
          "  -m, --model FILE        GGUF model (llama architecture, F32/F16)\n"
          "  -s, --socket PATH       socket to listen on (default /run/sinkd/sinkd.sock,\n"
          "                          or $XDG_RUNTIME_DIR/sinkd/sinkd.sock for non-root)\n"
          "  -t, --threads N         OpenBLAS threads (default: online CPUs)\n"
          "      --policy NAME       default policy: streaming or dense (streaming)\n"
          "      --sinks N           default attention sinks (4)\n"
          "      --window N          default window (min(context, 1024) - sinks)\n"
          "      --capacity N        default dense capacity (model context length)\n"
          "      --max-capacity N    largest KV cache a session may ask for (8192)\n"
          "      --max-sessions N    sessions open at once (64)\n"
          "      --max-clients N     connections at once (1024)\n"
          "      --max-frame BYTES   largest request frame (1048576)\n"
          "      --batch N           prefill chunk in tokens (64)\n"
          "  -v, --verbose           log debug lines (client errors)\n"
          "  -h, --help              this text\n"
          "  -V, --version           version\n"
          "\n"
          "Exit status: 0 after a clean shutdown (SIGINT/SIGTERM), 1 on a start-up\n"
          "error (bad model, socket in use), 2 on a usage error.\n");
}

/* Strict decimal parse into [min, max]; prints the error. */
static bool parse_num(const char *flag, const char *s, long min, long max, long *ret) {
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || !end || end == s || *end || v < min || v > max) {
    fprintf(stderr, "sinkd: %s: '%s' is not a number in [%ld, %ld]\n", flag, s, min, max);
    return false;
  }
  *ret = v;
  return true;
}

static char *default_socket(void) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  char buf[PATH_MAX];
  if (getuid() != 0 && xdg && *xdg)
    snprintf(buf, sizeof buf, "%s/sinkd/sinkd.sock", xdg);
  else
    snprintf(buf, sizeof buf, "/run/sinkd/sinkd.sock");
  return strdup(buf);
}

/* Creates the socket's folder if missing (one level, 0755). */
static void make_socket_dir(const char *path) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir) return;
  *slash = 0;
  if (mkdir(dir, 0755) == 0) sk_log(SK_LOG_INFO, "created %s", dir);
}

static struct sk_server *g_server;

static void on_signal(uv_signal_t *h, int signum) {
  sk_log(SK_LOG_NOTICE, "received %s, shutting down", strsignal(signum));
  sd_notify(0, "STOPPING=1");
  if (g_server) sk_server_shutdown(g_server);
  uv_close((uv_handle_t *)h, NULL);
  uv_signal_t *other = h->data;
  if (other && !uv_is_closing((uv_handle_t *)other)) uv_close((uv_handle_t *)other, NULL);
}

int main(int argc, char **argv) {
  struct options o = {.threads = -1, .n_sink = -1, .window = -1, .capacity = -1,
                      .max_sessions = DEFAULT_MAX_SESSIONS, .max_clients = DEFAULT_MAX_CLIENTS,
                      .max_frame = SK_FRAME_MAX_DEFAULT, .max_capacity = -1,
                      .batch = DEFAULT_BATCH};
  enum { OPT_POLICY = 256, OPT_SINKS, OPT_WINDOW, OPT_CAPACITY, OPT_MAX_CAP, OPT_MAX_SESS,
         OPT_MAX_CLIENTS, OPT_MAX_FRAME, OPT_BATCH };
  static const struct option longopts[] = {
      {"model", required_argument, NULL, 'm'},
      {"socket", required_argument, NULL, 's'},
      {"threads", required_argument, NULL, 't'},
      {"policy", required_argument, NULL, OPT_POLICY},
      {"sinks", required_argument, NULL, OPT_SINKS},
      {"window", required_argument, NULL, OPT_WINDOW},
      {"capacity", required_argument, NULL, OPT_CAPACITY},
      {"max-capacity", required_argument, NULL, OPT_MAX_CAP},
      {"max-sessions", required_argument, NULL, OPT_MAX_SESS},
      {"max-clients", required_argument, NULL, OPT_MAX_CLIENTS},
      {"max-frame", required_argument, NULL, OPT_MAX_FRAME},
      {"batch", required_argument, NULL, OPT_BATCH},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0},
  };
  int ch;
  opterr = 0;
  while ((ch = getopt_long(argc, argv, ":m:s:t:vhV", longopts, NULL)) != -1) {
    bool ok = true;
    switch (ch) {
    case 'm': o.model = optarg; break;
    case 's': free(o.socket); o.socket = strdup(optarg); break;
    case 't': ok = parse_num("--threads", optarg, 1, 256, &o.threads); break;
    case OPT_POLICY: o.policy = optarg; break;
    case OPT_SINKS: ok = parse_num("--sinks", optarg, 0, SK_KV_MAX_CAPACITY, &o.n_sink); break;
    case OPT_WINDOW: ok = parse_num("--window", optarg, 1, SK_KV_MAX_CAPACITY, &o.window); break;
    case OPT_CAPACITY: ok = parse_num("--capacity", optarg, 1, SK_KV_MAX_CAPACITY, &o.capacity); break;
    case OPT_MAX_CAP: ok = parse_num("--max-capacity", optarg, 1, SK_KV_MAX_CAPACITY, &o.max_capacity); break;
    case OPT_MAX_SESS: ok = parse_num("--max-sessions", optarg, 1, 1 << 16, &o.max_sessions); break;
    case OPT_MAX_CLIENTS: ok = parse_num("--max-clients", optarg, 1, 1 << 20, &o.max_clients); break;
    case OPT_MAX_FRAME: ok = parse_num("--max-frame", optarg, 64, SK_FRAME_MAX_CEILING, &o.max_frame); break;
    case OPT_BATCH: ok = parse_num("--batch", optarg, 1, 4096, &o.batch); break;
    case 'v': o.verbose = 1; break;
    case 'h': usage(stdout); return 0;
    case 'V': printf("sinkd %s\n", SK_VERSION); return 0;
    case ':':
      fprintf(stderr, "sinkd: option '%s' needs a value\n", argv[optind - 1]);
      ok = false;
      break;
    default:
      fprintf(stderr, "sinkd: unknown option '%s' (see sinkd --help)\n", argv[optind - 1]);
      ok = false;
      break;
    }
    if (!ok) return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "sinkd: unexpected argument '%s' (see sinkd --help)\n", argv[optind]);
    return 2;
  }
  if (!o.model) {
    fprintf(stderr, "sinkd: --model FILE is required (see sinkd --help)\n");
    return 2;
  }
  uint32_t policy = SK_POLICY_STREAMING;
  struct sk_error err = {0};
  if (o.policy && sk_policy_parse(o.policy, strlen(o.policy), &policy, &err) < 0) {
    fprintf(stderr, "sinkd: --policy: %s\n", err.message);
    return 2;
  }
  if (o.verbose) sk_log_set_level(SK_LOG_DEBUG);
  if (!o.socket) o.socket = default_socket();
  signal(SIGPIPE, SIG_IGN);

  long threads = o.threads > 0 ? o.threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (threads < 1) threads = 1;
  openblas_set_num_threads((int)threads);

  struct sk_gguf *gguf = NULL;
  struct sk_model *model = NULL;
  struct sk_tokenizer *tok = NULL;
  int rc = sk_gguf_open(o.model, &gguf, &err);
  if (rc == 0) rc = sk_model_load(gguf, &model, &err);
  if (rc == 0) rc = sk_tokenizer_load(gguf, &tok, &err);
  if (rc < 0) {
    sk_log(SK_LOG_ERR, "cannot load model %s: %s", o.model, err.message);
    goto fail;
  }
  const struct sk_model_config *mc = sk_model_config(model);
  sk_log(SK_LOG_INFO,
         "model loaded: %s (%s): %u layers, dim %u, %u heads, %u KV heads, vocab %u, context %u",
         o.model, mc->name, mc->n_layer, mc->dim, mc->n_head, mc->n_kv_head, mc->n_vocab,
         mc->n_ctx_train);

  struct sk_server_config cfg = {
      .socket_path = o.socket,
      .model_path = o.model,
      .max_frame = (uint32_t)o.max_frame,
      .max_sessions = (uint32_t)o.max_sessions,
      .max_clients = (uint32_t)o.max_clients,
      .max_batch = (uint32_t)o.batch,
  };
  uint32_t max_cap = o.max_capacity > 0 ? (uint32_t)o.max_capacity
                                        : (mc->n_ctx_train > DEFAULT_MAX_CAPACITY ? mc->n_ctx_train
                                                                                  : DEFAULT_MAX_CAPACITY);
  if (max_cap > SK_KV_MAX_CAPACITY) max_cap = SK_KV_MAX_CAPACITY;
  cfg.max_capacity = max_cap;
  uint32_t span = mc->n_ctx_train < DEFAULT_WINDOW_SPAN ? mc->n_ctx_train : DEFAULT_WINDOW_SPAN;
  cfg.defaults.policy = policy;
  cfg.defaults.n_sink = o.n_sink >= 0 ? (uint32_t)o.n_sink : DEFAULT_N_SINK;
  cfg.defaults.window = o.window > 0 ? (uint32_t)o.window
                                     : (span > cfg.defaults.n_sink ? span - cfg.defaults.n_sink : 1);
  cfg.defaults.capacity = o.capacity > 0 ? (uint32_t)o.capacity : (mc->n_ctx_train < max_cap ? mc->n_ctx_train : max_cap);
  cfg.defaults.rope_scale = 1.0f;
  /* The defaults must themselves open, for both policies. */
  struct sk_kv_params check = cfg.defaults;
  check.policy = SK_POLICY_STREAMING;
  if (sk_kv_params_check(&check, max_cap, &err) < 0) {
    sk_log(SK_LOG_ERR, "default streaming parameters: %s", err.message);
    rc = 2;
    goto fail_usage;
  }
  check.policy = SK_POLICY_DENSE;
  if (sk_kv_params_check(&check, max_cap, &err) < 0) {
    sk_log(SK_LOG_ERR, "default dense parameters: %s", err.message);
    rc = 2;
    goto fail_usage;
  }

  uv_loop_t *loop = uv_default_loop();
  make_socket_dir(o.socket);
  rc = sk_server_start(loop, &cfg, model, tok, &g_server, &err);
  if (rc < 0) {
    sk_log(SK_LOG_ERR, "%s", err.message);
    uv_run(loop, UV_RUN_NOWAIT);
    goto fail;
  }
  uv_signal_t sigint, sigterm;
  uv_signal_init(loop, &sigint);
  uv_signal_init(loop, &sigterm);
  sigint.data = &sigterm;
  sigterm.data = &sigint;
  uv_signal_start(&sigint, on_signal, SIGINT);
  uv_signal_start(&sigterm, on_signal, SIGTERM);

  sk_log(SK_LOG_NOTICE, "sinkd %s listening on %s (default policy %s, sinks %u, window %u, %ld threads)",
         SK_VERSION, o.socket, sk_policy_name(policy), cfg.defaults.n_sink, cfg.defaults.window,
         threads);
  sd_notifyf(0, "READY=1\nSTATUS=serving %s on %s", mc->name, o.socket);
  uv_run(loop, UV_RUN_DEFAULT);
  sk_server_free(g_server);
  uv_loop_close(loop);
  sk_tokenizer_free(tok);
  sk_model_free(model);
  sk_gguf_close(gguf);
  free(o.socket);
  sk_log(SK_LOG_INFO, "stopped");
  return 0;

fail:
  rc = 1;
fail_usage:
  sk_tokenizer_free(tok);
  sk_model_free(model);
  sk_gguf_close(gguf);
  free(o.socket);
  return rc;
}
