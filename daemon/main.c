/* sinkd: the command line; the run itself is startup.c's. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "config.h"
#include "sk_config.h"
#include "startup.h"

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
          "      --step-tokens N     token budget of a pass while a session generates:\n"
          "                          prefill chunks fill what its tokens leave (16)\n"
          "      --kv-type TYPE      element type of new sessions' KV caches: f16 (default:\n"
          "                          keys and values in half the bytes, rounded) or f32\n"
          "      --chat-template NAME  template family of the chat op: auto (default: the\n"
          "                          model's tokenizer.chat_template), none, or a family\n"
          "                          (chatml, llama3, mistral-v7, ...; sinkd.conf(5))\n"
          "      --http-socket PATH|none  the OpenAI-compatible HTTP socket (default\n"
          "                          sinkd-http.sock beside --socket; see sinkd-http(7))\n"
          "      --http-listen ADDR:PORT  also serve HTTP on TCP (needs --http-key-file)\n"
          "      --http-key-file FILE  API key for TCP requests (file of mode 0600)\n"
          "      --http-uid UID|auto  uid that TCP requests act as (auto: sinkd's own;\n"
          "                          nobody's when sinkd runs as root)\n"
          "      --http-listen-public yes|no  allow --http-listen on an address other\n"
          "                          machines reach (default no: loopback only)\n",
          sk_config_default_path());
  /* (two strings: C11 compilers need take no literal above 4095 bytes) */
  fputs("      --sparsity-file FILE  MLP sparsity calibration for sessions that ask\n"
          "                          for sparsity (written by --calibrate)\n"
          "      --calibrate TEXT    compute the sparsity thresholds (levels 0.1, 0.2,\n"
          "                          ..., 0.7) of the model over the text file TEXT, write\n"
          "                          them to --sparsity-file (or stdout) and exit\n"
          "      --draft-model FILE  GGUF draft model for speculative decoding (same\n"
          "                          vocabulary as the model)\n"
          "      --speculation MODE  default speculation of generates: auto (draft\n"
          "                          with a draft model, else off), off, draft, lookup\n"
          "      --draft-tokens N    most tokens a speculating step proposes (8; 1..15)\n"
          "      --lookup-history N  tokens of history each session keeps for look-up\n"
          "                          speculation (16384; 0 = none)\n"
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

/* ---- command line ---------------------------------------------------------- */

enum { OPT_CHECK_CONFIG = 256, OPT_CALIBRATE, OPT_KEY_BASE = 1000 };

/* Reads the command line into *st (whose cli holds the options that set
 * configuration keys). Returns -1 to run, else the status to exit with
 * (--help, --version: 0; a bad option: SK_EXIT_CONFIG, said on
 * stderr). */
static int parse_command_line(int argc, char **argv, struct sk_startup *st) {
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
      KEY_OPT("step-tokens", SK_CFG_STEP_TOKENS),
      KEY_OPT("log-level", SK_CFG_LOG_LEVEL),
      KEY_OPT("kv-type", SK_CFG_KV_TYPE),
      KEY_OPT("chat-template", SK_CFG_CHAT_TEMPLATE),
      KEY_OPT("http-socket", SK_CFG_HTTP_SOCKET),
      KEY_OPT("http-listen", SK_CFG_HTTP_LISTEN),
      KEY_OPT("http-key-file", SK_CFG_HTTP_KEY_FILE),
      KEY_OPT("http-uid", SK_CFG_HTTP_UID),
      KEY_OPT("http-listen-public", SK_CFG_HTTP_LISTEN_PUBLIC),
      KEY_OPT("sparsity-file", SK_CFG_SPARSITY_FILE),
      KEY_OPT("draft-model", SK_CFG_DRAFT_MODEL),
      KEY_OPT("lookup-history", SK_CFG_LOOKUP_HISTORY),
      KEY_OPT("speculation", SK_CFG_SPECULATION),
      KEY_OPT("draft-tokens", SK_CFG_DRAFT_TOKENS),
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
      st->config_path = optarg;
      st->explicit_path = true;
      break;
    case OPT_CHECK_CONFIG: st->check_only = true; break;
    case OPT_CALIBRATE:
      st->calibrate_text = optarg;
      st->check_only = true; /* no socket, no store: the model only */
      break;
    case 'm': key = SK_CFG_MODEL; break;
    case 's': key = SK_CFG_SOCKET; break;
    case 't': key = SK_CFG_THREADS; break;
    case 'v':
      key = SK_CFG_LOG_LEVEL;
      value = "debug";
      break;
    case 'h': usage(stdout); sk_config_done(&st->cli); return 0;
    case 'V': printf("sinkd %s\n", SK_VERSION); sk_config_done(&st->cli); return 0;
    case ':':
      fprintf(stderr, "sinkd: option '%s' needs a value\n", argv[optind - 1]);
      sk_config_done(&st->cli);
      return SK_EXIT_CONFIG;
    default:
      if (ch >= OPT_KEY_BASE && ch < OPT_KEY_BASE + SK_CFG__COUNT) {
        key = ch - OPT_KEY_BASE;
        break;
      }
      fprintf(stderr, "sinkd: unknown option '%s' (see sinkd --help)\n", argv[optind - 1]);
      sk_config_done(&st->cli);
      return SK_EXIT_CONFIG;
    }
    struct sk_error e;
    if (key >= 0 && sk_config_set(&st->cli, (enum sk_config_key)key, value,
                                  SK_CONFIG_FROM_COMMAND_LINE, 0, &e) < 0) {
      fprintf(stderr, "sinkd: %s: %s\n",
              ch == 'v' ? "--verbose" : sk_config_key_option((enum sk_config_key)key), e.message);
      sk_config_done(&st->cli);
      return SK_EXIT_CONFIG;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "sinkd: unexpected argument '%s' (see sinkd --help)\n", argv[optind]);
    sk_config_done(&st->cli);
    return SK_EXIT_CONFIG;
  }
  return -1;
}

int main(int argc, char **argv) {
  sk_log_init();
  struct sk_startup st;
  memset(&st, 0, sizeof st);
  st.config_path = sk_config_default_path();
  if (sk_config_init(&st.cli) < 0) {
    fprintf(stderr, "sinkd: out of memory\n");
    return SK_EXIT_START;
  }
  int status = parse_command_line(argc, argv, &st);
  if (status >= 0) return status;
  return sk_startup_run(&st);
}
