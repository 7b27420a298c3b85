/* sinkctl: command-line client for sinkd, built on libsinkd.
 *
 *   sinkctl [--socket PATH] [--timeout DURATION] [--json] [--verbose] COMMAND [ARGS]
 *
 * Options may come before or after the command. Exit status: 0 success,
 * 1 the daemon answered with an error, 2 usage error, 3 cannot connect,
 * 4 connection lost or protocol error, 130 interrupted.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "eval.h"
#include "sinkd/client.h"
#include "sk_config.h"

enum {
  EXIT_DAEMON_ERROR = 1,
  EXIT_USAGE = SK_CLI_EXIT_USAGE,
  EXIT_CONNECT = 3,
  EXIT_CONNECTION = 4,
  EXIT_INTERRUPTED = 130,
};

/* A prompt read from stdin larger than any frame the daemon accepts is
 * refused here rather than read without bound. */
#define PROMPT_MAX ((size_t)SK_FRAME_MAX_CEILING)

static const char *const prog = "sinkctl";
/* --json given: errors too are JSON, on stdout (json_error). */
static bool g_json;

static void json_error(const char *code, const char *message, const char *hint, int status);

/* ---- messages --------------------------------------------------------- */

/* sk_cli's usage errors and sk_cli_die with --json: the error as JSON on
 * stdout (json_error), with the same exit status. */
static void json_cli_error(int status, const char *message) {
  json_error(status == EXIT_USAGE ? "usage" : status == EXIT_CONNECT ? "connect" : "failure",
             message, "", status);
}

/* The one wording for a dense session that holds all it can, whether a
 * generate stopped there or an append did not fit (the daemon's
 * context_full message starts the same). */
#define FULL_SESSION_WORDS "the dense session is full"
#define FULL_SESSION_HINT "open one with --policy streaming to keep going"

static void say_session_full(uint64_t resident) {
  fprintf(stderr, "%s: " FULL_SESSION_WORDS " (%" PRIu64 " tokens): " FULL_SESSION_HINT "\n",
          prog, resident);
}

/* Reports a failed library call and returns the exit status for it:
 * 4 if the connection is gone, 1 if the daemon answered with an error.
 * With --json: {"error": {"code", "message", "hint"}} on stdout instead,
 * the same status. */
static int report(const struct sk_client *c, const struct sk_error *e) {
  const char *hint = "";
  if (e->code == SK_ERR_CONTEXT_FULL)
    hint = FULL_SESSION_HINT;
  else if (e->code == SK_ERR_NO_SUCH_SESSION)
    hint = "sessions end when closed or after the idle TTL; a restart keeps them unless "
           "sinkd set them aside at start, e.g. for another model: see its log and "
           "invalid/ in its state directory; `sinkctl list` shows yours";
  else if (e->code == SK_ERR_FORBIDDEN)
    hint = "only its owner and root may use it";
  int status = sk_client_connected(c) ? EXIT_DAEMON_ERROR : EXIT_CONNECTION;
  if (g_json) {
    json_error(sk_error_name(e->code), e->message, hint, status);
    return status;
  }
  fprintf(stderr, "%s: %s: %s%s%s%s\n", prog, sk_error_name(e->code), e->message,
          *hint ? " (" : "", hint, *hint ? ")" : "");
  return status;
}

static void help(void) {
  printf(
      "Usage: %s [OPTIONS] COMMAND [ARGS]\n"
      "Talk to sinkd, the LLM session daemon.\n"
      "\n"
      "Commands:\n"
      "  generate [PROMPT...]  generate text; the prompt comes from the\n"
      "                        arguments, or from stdin if absent or '-'\n"
      "                        (with --session: none goes on where it stopped)\n"
      "  chat                  talk with the model, line by line, in one\n"
      "                        session (Ctrl-C stops a reply, Ctrl-D quits)\n"
      "  tokenize TEXT         print the token ids of TEXT ('-': stdin)\n"
      "  detokenize ID...      print the text of token ids, byte for byte\n"
      "  open                  open a session and print its id\n"
      "  close ID              close a session\n"
      "  close --idle DURATION close your sessions idle that long (30m, 2h, 7d)\n"
      "  close --all           close every session you may see\n"
      "  list                  list sessions: owner, memory, age, idle time\n",
      prog);
  printf(
      "  stats [ID]            daemon figures, or a session's\n"
      "  resume ID             pick a session up again (after a daemon restart)\n"
      "  fork ID               copy a session into a new one; print its id\n"
      "  save ID FILE          export a session to FILE\n"
      "  load FILE             import a session from FILE; print its id\n"
      "  ping                  check that the daemon answers\n"
      "  hello                 protocol version, model and defaults\n"
      "  eval [OPTIONS] FILE   perplexity of FILE per policy, through the\n"
      "                        daemon's sessions ('sinkctl eval --help')\n"
      "\n"
      "Options:\n"
      "  -s, --socket PATH     daemon socket (default: $SINKD_SOCKET, else\n"
      "                        $XDG_RUNTIME_DIR/sinkd/sinkd.sock if it exists,\n"
      "                        else %s)\n"
      "      --timeout DURATION\n"
      "                        give up when the daemon does not answer for\n"
      "                        that long (30s, 2m; default: wait)\n"
      "  -j, --json            print one JSON object instead of text (chat:\n"
      "                        one per turn)\n"
      "  -v, --verbose         generate: print a usage summary to stderr\n"
      "  -h, --help            show this help\n"
      "  -V, --version         show the version\n"
      "\n"
      "generate:\n"
      "  -n, --max-tokens N    tokens to generate, 1..%u (default %u)\n"
      "  -t, --temperature T   0..100, 0 = greedy (default %g)\n"
      "      --top-k K         0 or >= the vocabulary = off (default %u)\n"
      "      --top-p P         in (0, 1] (default %g)\n"
      "      --seed N          sampling seed (default: random)\n"
      "      --stop TEXT       stop when the output contains TEXT (repeatable)\n"
      "      --ignore-eos      keep going past end-of-sequence\n"
      "      --session ID      use an existing session (it stays open) instead\n"
      "                        of a temporary one (closed at the end)\n"
      "      --no-echo         do not print the prompt before the output\n"
      "      --progress        show a progress bar on stderr while a prompt\n"
      "                        is prefilled (default: for long prompts when\n"
      "                        stderr is a terminal); --no-progress: never\n"
      "chat: the generate options but --no-echo, and\n"
      "      --keep            keep the new session open at the end\n"
      "      --system TEXT     system prompt (models with a chat template), pinned\n"
      "generate, chat, open:\n"
      "      --policy NAME     eviction policy: streaming, window, h2o,\n"
      "                        sink_h2o or dense\n"
      "      --sinks N         attention sinks kept (streaming, sink_h2o)\n"
      "      --window N        recent tokens kept (streaming, window)\n"
      "      --heavy N         heavy hitters kept (h2o, sink_h2o)\n"
      "      --recent N        newest tokens always kept (h2o, sink_h2o)\n"
      "      --capacity N      cache size in tokens (dense)\n"
      "      --rope-scale R    position interpolation: positions / R (0 < R <= 64)\n"
      "      --sparsity S      contextual sparsity of the MLP: skip the fraction S\n"
      "                        of its neurons per token (a calibrated level, e.g.\n"
      "                        0.3, 0.5, 0.7; 0 = off, the default)\n"
      "      --pin TEXT        pinned prefix (system prompt), never evicted:\n"
      "                        the sink region of streaming and sink_h2o\n"
      "      --pin-file FILE   the same, read from FILE\n"
      "tokenize:\n"
      "      --no-bos          do not put the BOS token first\n"
      "      --special         control-token text is the token (also generate)\n"
      "stats ID:\n"
      "      --tokens          also print the resident token ids\n"
      "\n"
      "Exit status:\n"
      "  0  success\n"
      "  1  the daemon answered with an error (stderr: CODE: MESSAGE),\n"
      "     or a file could not be read or written (load, save, eval),\n"
      "     or the daemon cancelled a generation (stopping, or another client)\n"
      "  2  usage error (bad option or argument)\n"
      "  3  cannot connect (daemon not running, permission denied)\n"
      "  4  connection lost or protocol error\n"
      "  130  interrupted (Ctrl-C) during generate\n"
      "chat goes on after a daemon error and ends with 1.\n"
      "\n"
      "See sinkctl(1) and sinkd-protocol(7).\n",
      SK_CLIENT_DEFAULT_SOCKET, SK_WIRE_MAX_TOKENS, SK_GENERATE_DEFAULT_MAX_TOKENS,
      SK_GENERATE_DEFAULT_TEMPERATURE, SK_GENERATE_DEFAULT_TOP_K, SK_GENERATE_DEFAULT_TOP_P);
}

/* ---- durations ------------------------------------------------------- */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A duration in seconds: digits with an optional unit, s, m, h or d
 * ("90", "90s", "30m", "2h", "7d"). */
static uint64_t parse_duration(const char *what, const char *s) {
  if (!is_digit(s[0]))
    sk_cli_usage_error("%s: '%s' is not a duration (N, Ns, Nm, Nh or Nd)", what, s);
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t unit = 1;
  switch (*end) {
  case 0: break;
  case 's': unit = 1; end++; break;
  case 'm': unit = 60; end++; break;
  case 'h': unit = 3600; end++; break;
  case 'd': unit = 86400; end++; break;
  default: end = (char *)"?"; break;
  }
  if (*end || errno == ERANGE || v > UINT64_MAX / unit)
    sk_cli_usage_error("%s: '%s' is not a duration (N, Ns, Nm, Nh or Nd)", what, s);
  return (uint64_t)v * unit;
}

/* ---- JSON output ------------------------------------------------------ */

/* {"error": {"code": C, "message": M, "hint": H, "status": N}} and a
 * newline on stdout (hint only when there is one): what --json prints
 * instead of a message on stderr; the exit status is the same. */
static void json_error(const char *code, const char *message, const char *hint, int status) {
  fputs("{\"error\": {\"code\": ", stdout);
  sk_cli_json_cstr(stdout, code);
  fputs(", \"message\": ", stdout);
  sk_cli_json_cstr(stdout, message);
  if (hint && *hint) {
    fputs(", \"hint\": ", stdout);
    sk_cli_json_cstr(stdout, hint);
  }
  printf(", \"status\": %d}}\n", status);
  fflush(stdout);
}

/* "key": for an object member; `first` says whether a comma is needed. */
static void json_key(FILE *f, bool *first, const char *key) {
  if (!*first) fputs(", ", f);
  *first = false;
  sk_cli_json_cstr(f, key);
  fputs(": ", f);
}

static void json_kv_u64(FILE *f, bool *first, const char *key, uint64_t v) {
  json_key(f, first, key);
  fprintf(f, "%" PRIu64, v);
}

static void json_kv_str(FILE *f, bool *first, const char *key, const char *v) {
  json_key(f, first, key);
  sk_cli_json_cstr(f, v);
}

/* ---- options ---------------------------------------------------------- */

enum opt_id {
  OPT_SOCKET = 's',
  OPT_JSON = 'j',
  OPT_VERBOSE = 'v',
  OPT_HELP = 'h',
  OPT_VERSION = 'V',
  OPT_MAX_TOKENS = 'n',
  OPT_TEMPERATURE = 't',
  OPT_TOP_K = 256,
  OPT_TOP_P,
  OPT_SEED,
  OPT_STOP,
  OPT_IGNORE_EOS,
  OPT_SESSION,
  OPT_NO_ECHO,
  OPT_POLICY,
  OPT_SINKS,
  OPT_WINDOW,
  OPT_CAPACITY,
  OPT_HEAVY,
  OPT_RECENT,
  OPT_ROPE_SCALE, OPT_SPARSITY,
  OPT_PIN,
  OPT_PIN_FILE,
  OPT_NO_BOS,
  OPT_SPECIAL,
  OPT_KEEP,
  OPT_PROGRESS,
  OPT_NO_PROGRESS,
  OPT_TOKENS,
  OPT_IDLE,
  OPT_ALL,
  OPT_SYSTEM,
  OPT_TIMEOUT,
  OPT__END
};

static const struct option long_options[] = {
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"json", no_argument, NULL, OPT_JSON},
    {"verbose", no_argument, NULL, OPT_VERBOSE},
    {"help", no_argument, NULL, OPT_HELP},
    {"version", no_argument, NULL, OPT_VERSION},
    {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"seed", required_argument, NULL, OPT_SEED},
    {"stop", required_argument, NULL, OPT_STOP},
    {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
    {"session", required_argument, NULL, OPT_SESSION},
    {"no-echo", no_argument, NULL, OPT_NO_ECHO},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"sinks", required_argument, NULL, OPT_SINKS},
    {"window", required_argument, NULL, OPT_WINDOW},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"heavy", required_argument, NULL, OPT_HEAVY},
    {"recent", required_argument, NULL, OPT_RECENT},
    {"rope-scale", required_argument, NULL, OPT_ROPE_SCALE},
    {"sparsity", required_argument, NULL, OPT_SPARSITY},
    {"pin", required_argument, NULL, OPT_PIN},
    {"pin-file", required_argument, NULL, OPT_PIN_FILE},
    {"no-bos", no_argument, NULL, OPT_NO_BOS},
    {"special", no_argument, NULL, OPT_SPECIAL},
    {"keep", no_argument, NULL, OPT_KEEP},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"tokens", no_argument, NULL, OPT_TOKENS},
    {"idle", required_argument, NULL, OPT_IDLE},
    {"all", no_argument, NULL, OPT_ALL},
    {"system", required_argument, NULL, OPT_SYSTEM},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {NULL, 0, NULL, 0},
};

static const char *opt_name(int id) {
  for (const struct option *o = long_options; o->name; o++)
    if (o->val == id) return o->name;
  return "?";
}

struct opts {
  const char *socket;
  bool json, verbose;
  unsigned int timeout_ms; /* --timeout; 0: wait for the daemon forever */
  bool given[OPT__END]; /* which command-specific options were used */
  struct sk_generate_params gen;
  const char **stops; /* (n_stop) pointers into argv */
  size_t n_stop;
  bool has_session;
  uint64_t session;
  bool no_echo;
  struct sk_open_params open;
  char *pin_file_text; /* --pin-file contents (owned) */
  bool no_bos;
  bool tokens;
  bool close_all;         /* close --all */
  bool close_idle;        /* close --idle */
  uint64_t idle_s;        /* close --idle DURATION, in seconds */
  const char *system; /* chat --system */
};

/* ---- commands --------------------------------------------------------- */

/* Reads all of stdin (at most PROMPT_MAX bytes); malloc'd, NUL-terminated. */
static char *read_stdin(size_t *ret_len) {
  if (isatty(STDIN_FILENO))
    fprintf(stderr, "%s: reading the prompt from stdin (end it with Ctrl-D)\n",
            prog);
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  if (!buf) sk_cli_die(EXIT_FAILURE, "out of memory");
  for (;;) {
    if (len + 1 == cap) {
      if (cap > PROMPT_MAX)
        sk_cli_usage_error("the text on stdin is longer than %zu bytes", PROMPT_MAX);
      char *nb = realloc(buf, cap * 2);
      if (!nb) sk_cli_die(EXIT_FAILURE, "out of memory");
      buf = nb;
      cap *= 2;
    }
    size_t n = fread(buf + len, 1, cap - 1 - len, stdin);
    len += n;
    if (n == 0) {
      if (ferror(stdin)) sk_cli_die(EXIT_USAGE, "cannot read stdin: %s", strerror(errno));
      break;
    }
  }
  buf[len] = 0;
  *ret_len = len;
  return buf;
}

/* The text argument(s) of generate/tokenize: joined with spaces, or stdin
 * when there are none or the only one is "-". malloc'd. */
static char *text_from_args(int argc, char **argv, size_t *ret_len) {
  if (argc == 0 || (argc == 1 && strcmp(argv[0], "-") == 0))
    return read_stdin(ret_len);
  size_t len = 0;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  char *s = malloc(len);
  if (!s) sk_cli_die(EXIT_FAILURE, "out of memory");
  char *p = s;
  for (int i = 0; i < argc; i++) {
    size_t n = strlen(argv[i]);
    memcpy(p, argv[i], n);
    p += n;
    *p++ = i + 1 < argc ? ' ' : 0;
  }
  *ret_len = len - 1;
  return s;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static volatile sig_atomic_t interrupted;

/* The first Ctrl-C asks to stop (the reply, the prefill); the handler then
 * steps aside, so a second Ctrl-C ends sinkctl at once. */
static void on_sigint(int sig) {
  interrupted = 1;
  signal(sig, SIG_DFL);
}

/* Installs on_sigint without SA_RESTART, so that a Ctrl-C at chat's prompt
 * interrupts the read. */
static void catch_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  interrupted = 0;
  sigaction(SIGINT, &sa, NULL);
}

struct gen_state {
  bool json;
  char *text; /* (len) collected for --json */
  size_t len, cap;
  int32_t *tokens; /* (n_tokens) collected for --json */
  size_t n_tokens, cap_tokens;
  double first_token_ms;
  bool ends_with_newline; /* the last text printed ended a line */
  bool printed;           /* some text was printed */
  const char *echo;       /* (echo_len) the prompt, printed before the first
                             token's text, so that a refused request (no such
                             session, ...) prints its error alone */
  size_t echo_len;
};

/* Prints the prompt still to echo, once. */
static void gen_echo(struct gen_state *g) {
  if (g->echo_len == 0) return;
  fwrite(g->echo, 1, g->echo_len, stdout);
  g->echo_len = 0;
}

static int on_token(void *user, const struct sk_token_event *ev) {
  struct gen_state *g = user;
  if (g->first_token_ms == 0) g->first_token_ms = now_ms();
  if (!g->json) {
    gen_echo(g);
    fwrite(ev->text, 1, ev->text_len, stdout);
    fflush(stdout);
    if (ev->text_len) {
      g->printed = true;
      g->ends_with_newline = ev->text[ev->text_len - 1] == '\n';
    }
  } else {
    if (g->len + ev->text_len > g->cap) {
      size_t cap = g->cap ? g->cap : 256;
      while (cap < g->len + ev->text_len) cap *= 2;
      char *nt = realloc(g->text, cap);
      if (!nt) return 1;
      g->text = nt;
      g->cap = cap;
    }
    if (ev->text_len) memcpy(g->text + g->len, ev->text, ev->text_len);
    g->len += ev->text_len;
    if (g->n_tokens == g->cap_tokens) {
      size_t cap = g->cap_tokens ? g->cap_tokens * 2 : 64;
      int32_t *nt = realloc(g->tokens, cap * sizeof *nt);
      if (!nt) return 1;
      g->tokens = nt;
      g->cap_tokens = cap;
    }
    g->tokens[g->n_tokens++] = ev->token;
  }
  return interrupted ? 1 : 0;
}

static void gen_state_free(struct gen_state *g) {
  free(g->text);
  free(g->tokens);
  memset(g, 0, sizeof *g);
}

/* The result of a generate as one JSON object; `turn` (chat) if > 0. */
static void json_generate(uint64_t session, unsigned turn, const struct gen_state *g,
                          const struct sk_generate_result *res) {
  bool first = true;
  fputc('{', stdout);
  if (turn) json_kv_u64(stdout, &first, "turn", turn);
  json_kv_u64(stdout, &first, "session", session);
  json_key(stdout, &first, "text");
  sk_cli_json_str(stdout, g->text ? g->text : "", g->len);
  json_key(stdout, &first, "tokens");
  fputc('[', stdout);
  for (size_t i = 0; i < g->n_tokens; i++)
    printf("%s%" PRId32, i ? ", " : "", g->tokens[i]);
  fputc(']', stdout);
  json_kv_str(stdout, &first, "stop", res->stop);
  json_kv_u64(stdout, &first, "n_tokens", res->n_tokens);
  json_key(stdout, &first, "usage");
  printf("{\"prompt_tokens\": %" PRIu64 ", \"completion_tokens\": %" PRIu64 "}",
         res->prompt_tokens, res->completion_tokens);
  json_kv_u64(stdout, &first, "evicted", res->evicted);
  json_kv_u64(stdout, &first, "resident", res->resident);
  json_kv_u64(stdout, &first, "seen", res->seen);
  fputs("}\n", stdout);
}

/* ---- prefill with a progress bar ----------------------------------------- */

/* Prompts shorter than this prefill in a blink: no bar. */
#define PROGRESS_MIN_BYTES 2048u
/* Tokens per append when a bar is drawn: a smooth bar, while each round
 * trip stays small next to the model's work. */
#define PREFILL_CHUNK 256u

/* Whether to prefill in chunks with a bar on stderr: --progress always,
 * --no-progress never, else for long prompts when stderr is a terminal. */
static bool want_progress(const struct opts *o, size_t prompt_len) {
  if (o->given[OPT_NO_PROGRESS] || prompt_len == 0) return false;
  if (o->given[OPT_PROGRESS]) return true;
  return prompt_len >= PROGRESS_MIN_BYTES && isatty(STDERR_FILENO);
}

/* On a terminal one line redrawn in place; elsewhere one line per step. */
static void draw_progress(size_t done, size_t total, double t0, bool tty) {
  enum { WIDTH = 30 };
  size_t fill = total ? done * WIDTH / total : WIDTH;
  char bar[WIDTH + 1];
  for (size_t i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
  bar[WIDTH] = 0;
  double s = (now_ms() - t0) / 1e3;
  fprintf(stderr, "%sprefill [%s] %3zu%% %zu/%zu tokens", tty ? "\r" : "", bar,
          total ? done * 100 / total : 100, done, total);
  if (s > 0 && done) fprintf(stderr, ", %.0f tokens/s", (double)done / s);
  fputs(tty ? "\033[K" : "\n", stderr);
  fflush(stderr);
}

/* Appends text to a session as tokenize + appends of PREFILL_CHUNK tokens,
 * drawing the bar. `empty`: the session has seen no token, so the
 * vocabulary's BOS rule applies, as the daemon does for text; `special`:
 * control-token text is those tokens (--special). Returns 0; -1 if Ctrl-C stopped it
 * (what was appended stays); or the exit status of a reported error.
 * *ret_n: tokens appended. */
static int prefill(struct sk_client *c, uint64_t session, bool empty, bool special,
                   const char *text, size_t len, uint64_t *ret_n) {
  struct sk_error e;
  int32_t *ids = NULL;
  size_t n = 0;
  *ret_n = 0;
  enum sk_bos bos = (empty ? SK_BOS_DEFAULT : SK_BOS_FALSE) | (special ? SK_TEXT_SPECIAL : 0);
  if (sk_client_tokenize(c, text, len, bos, &ids, &n, &e) < 0)
    return report(c, &e);
  bool tty = isatty(STDERR_FILENO);
  double t0 = now_ms();
  int rc = 0;
  draw_progress(0, n, t0, tty);
  for (size_t i = 0; i < n && rc == 0; i += PREFILL_CHUNK) {
    if (interrupted) {
      rc = -1;
      break;
    }
    size_t k = n - i < PREFILL_CHUNK ? n - i : PREFILL_CHUNK;
    if (sk_client_append_tokens(c, session, ids + i, k, SK_BOS_DEFAULT, NULL, &e) < 0) {
      if (tty) fputc('\n', stderr);
      rc = report(c, &e);
      break;
    }
    *ret_n += k;
    draw_progress(i + k, n, t0, tty);
  }
  if (tty) fputs("\r\033[K", stderr); /* the bar goes; the text follows */
  free(ids);
  return rc;
}

/* Whether a session has seen no token yet (BOS rule); false on error. */
static bool session_is_empty(struct sk_client *c, uint64_t session) {
  struct sk_session_stats st;
  return sk_client_session_stats(c, session, &st, NULL) == 0 && st.seen == 0;
}

/* ---- generate -------------------------------------------------------------- */

static int cmd_generate(struct sk_client *c, const struct opts *o, int argc,
                        char **argv) {
  struct sk_error e;
  size_t prompt_len = 0;
  char *prompt = NULL;
  if (argc > 0 || !o->has_session) {
    prompt = text_from_args(argc, argv, &prompt_len);
    /* `echo TEXT | sinkctl generate`: the line's end is not part of the
     * prompt (the text goes on where TEXT stops) */
    if ((argc == 0 || (argc == 1 && strcmp(argv[0], "-") == 0)) && prompt_len &&
        prompt[prompt_len - 1] == '\n') {
      prompt_len--;
      if (prompt_len && prompt[prompt_len - 1] == '\r') prompt_len--;
    }
  }

  uint64_t session = o->session;
  if (o->has_session && isatty(STDERR_FILENO)) {
    /* requests on one session run one after another: say why nothing
     * comes yet */
    struct sk_session_stats st;
    if (sk_client_session_stats(c, session, &st, NULL) == 0 && st.busy)
      fprintf(stderr, "%s: session %" PRIu64 " is busy with another request; this one waits "
              "for it (Ctrl-C gives up)\n", prog, session);
  }
  if (!o->has_session) {
    struct sk_open_result opened;
    struct sk_open_params op = o->open;
    op.temporary = true; /* closed by the daemon even if we die */
    if (sk_client_open(c, &op, &opened, &e) < 0) {
      free(prompt);
      return report(c, &e);
    }
    session = opened.session;
    if (prompt_len == 0) {
      /* No prompt: the model starts from BOS alone, as llama.cpp's does
       * (the BOS rule gives nothing to a session a pin has filled). */
      struct sk_append_result ar;
      if (sk_client_append_text(c, session, "", 0, SK_BOS_DEFAULT, &ar, &e) < 0) {
        free(prompt);
        return report(c, &e);
      }
    }
  }

  struct sk_generate_params p = o->gen;
  p.stop = o->stops;
  p.n_stop = o->n_stop;
  p.prompt = prompt_len ? prompt : NULL;
  p.prompt_len = prompt_len;

  struct gen_state g = {.json = o->json};
  struct sk_generate_result res;
  int status = 0, rc = 0;
  uint64_t prefilled = 0;
  catch_sigint();
  double t0 = now_ms();
  if (want_progress(o, prompt_len)) {
    bool empty = !o->has_session || session_is_empty(c, session);
    int pr = prefill(c, session, empty, p.parse_special, prompt, prompt_len, &prefilled);
    if (pr != 0) {
      if (pr < 0)
        fprintf(stderr, "%s: interrupted during the prefill (%" PRIu64 " tokens appended)\n",
                prog, prefilled);
      status = pr < 0 ? EXIT_INTERRUPTED : pr;
      rc = -1;
      goto close;
    }
    p.prompt = NULL;
    p.prompt_len = 0;
  }

  if (!o->json && !o->no_echo && prompt_len) {
    g.echo = prompt;
    g.echo_len = prompt_len;
  }
  rc = sk_client_generate(c, session, &p, on_token, &g, &res, &e);
  if (rc == 0 && !o->json) gen_echo(&g); /* no token came: the prompt still */
  if (rc < 0) {
    /* End the partial line of output (echo and tokens) before the error. */
    if (!o->json && g.first_token_ms != 0) fputc('\n', stdout);
    fflush(stdout);
    status = report(c, &e);
  }
close:;
  double t1 = now_ms();
  signal(SIGINT, SIG_DFL);

  if (!o->has_session && sk_client_connected(c)) {
    /* A close that loses the connection needs no report: the daemon
     * closes a temporary session when its connection ends (a daemon that
     * stops answers the generation `cancelled`, then hangs up). */
    struct sk_error ce;
    if (sk_client_close_session(c, session, &ce) < 0 && status == 0 && sk_client_connected(c))
      status = report(c, &ce);
  }

  if (rc == 0) {
    res.prompt_tokens += prefilled;
    if (o->json)
      json_generate(session, 0, &g, &res);
    else
      fputc('\n', stdout);
    fflush(stdout);
    if (o->verbose) {
      double gen_ms = g.first_token_ms ? t1 - g.first_token_ms : 0;
      fprintf(stderr,
              "%s: session %" PRIu64 ": stop %s; %" PRIu64
              " prompt + %" PRIu64 " generated tokens; %" PRIu64
              " resident, %" PRIu64 " seen, %" PRIu64
              " evicted; %.1f ms total",
              prog, session, strcmp(res.stop, "stop") == 0 ? "string" : res.stop, res.prompt_tokens,
              res.completion_tokens, res.resident, res.seen, res.evicted,
              t1 - t0);
      /* tokens come in bursts: a rate over a few ms would say nothing */
      if (res.completion_tokens > 1 && gen_ms >= 20)
        fprintf(stderr, ", %.1f tokens/s",
                (double)(res.completion_tokens - 1) * 1e3 / gen_ms);
      fputc('\n', stderr);
    }
    if (!o->json && strcmp(res.stop, "context_full") == 0) say_session_full(res.resident);
    if (strcmp(res.stop, "cancelled") == 0 && status == 0) {
      if (interrupted) {
        status = EXIT_INTERRUPTED;
      } else { /* not by us: the generation did not do what was asked */
        fprintf(stderr, "%s: the daemon cancelled the generation (it is stopping, or another "
                "client closed the session or cancelled it)\n", prog);
        status = EXIT_FAILURE;
      }
    }
  }
  gen_state_free(&g);
  free(prompt);
  return status;
}

/* ---- session figures, shared by stats and chat's /stats ------------------------ */

/* 1327232 -> "1.3 MiB". */
static void human_bytes(uint64_t v, char *buf, size_t size) {
  static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double d = (double)v;
  int u = 0;
  while (d >= 1024 && u < 4) {
    d /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, size, "%" PRIu64 " bytes", v);
  else
    snprintf(buf, size, "%.1f %s", d, units[u]);
}

static void print_session_stats(const struct sk_session_stats *s) {
  char kv[32], obj[32];
  human_bytes(s->kv_bytes, kv, sizeof kv);
  human_bytes(s->object_bytes, obj, sizeof obj);
  printf("%-10s %" PRIu64 "\n", "session", s->session);
  printf("%-10s %s\n", "policy", s->policy);
  const unsigned parts = sk_policy_parts(s->policy, strlen(s->policy));
  if (parts & SK_PART_SINKS) printf("%-10s %" PRIu64 "\n", "sinks", s->n_sink);
  if (parts & SK_PART_WINDOW) printf("%-10s %" PRIu64 "\n", "window", s->window);
  if (parts & SK_PART_HEAVY) {
    printf("%-10s %" PRIu64 "\n", "heavy", s->heavy);
    printf("%-10s %" PRIu64 "\n", "recent", s->recent);
  }
  if (s->pinned) printf("%-10s %" PRIu64 " tokens\n", "pinned", s->pinned);
  if (s->rope_scale != 1 || s->model_rope_scale != 1)
    printf("%-10s %g (model %g)\n", "rope scale", s->rope_scale, s->model_rope_scale);
  printf("%-10s %" PRIu64 " tokens\n", "capacity", s->capacity);
  printf("%-10s %" PRIu64 " tokens\n", "resident", s->resident);
  printf("%-10s %" PRIu64 " tokens\n", "seen", s->seen);
  printf("%-10s %" PRIu64 " tokens\n", "evicted", s->evicted);
  if (s->kv_type[0])
    printf("%-10s %s (%" PRIu64 " bytes, %s)\n", "kv cache", kv, s->kv_bytes, s->kv_type);
  else
    printf("%-10s %s (%" PRIu64 " bytes)\n", "kv cache", kv, s->kv_bytes);
  printf("%-10s %s (%" PRIu64 " bytes)\n", "object", obj, s->object_bytes);
  printf("%-10s %" PRIu64 "\n", "commit", s->commit);
  printf("%-10s %s\n", "adopted", s->adopted ? "yes" : "no");
  printf("%-10s %" PRIu64 " s\n", "idle", s->idle_s);
  /* Only what the daemon sent (both are optional fields of the reply);
   * positions stays the last line. */
  if (s->busy) {
    printf("%-10s (busy)\n", "indices");
  } else if (s->n_resident_ranges) {
    /* the stream indices of the resident tokens, in cache order */
    printf("%-10s", "indices");
    for (size_t i = 0; i < s->n_resident_ranges; i++) {
      if (s->resident_ranges[i].first == s->resident_ranges[i].last)
        printf(" %" PRIu64, s->resident_ranges[i].first);
      else
        printf(" %" PRIu64 "-%" PRIu64, s->resident_ranges[i].first, s->resident_ranges[i].last);
    }
    putchar('\n');
  }
  if (s->sparsity != 0) {
    printf("%-10s %g (MLP neurons skipped per token", "sparsity", s->sparsity);
    if (s->sparse_tokens && s->n_sparse_layers) {
      printf("; measured over %" PRIu64 " tokens, per layer:", s->sparse_tokens);
      for (size_t l = 0; l < s->n_sparse_layers; l++) printf(" %.3f", s->sparsity_measured[l]);
    }
    printf(")\n");
    if (s->weight_bytes_per_token > 0)
      printf("%-10s %.1f MB of weights read per token\n", "reads", s->weight_bytes_per_token / 1e6);
  }
  if (s->attn_steps)
    printf("%-10s over the last %" PRIu64 " steps; sinks = the first %" PRIu64 " positions\n",
           "attention", s->attn_steps, s->sink_tokens);
  for (size_t l = 0; l < s->n_layers; l++)
    printf("  layer %-3zu sink mass %.4f, entropy %.4f nats\n", l, s->sink_mass[l],
           s->entropy[l]);
  if (s->has_positions)
    printf("%-10s %" PRIu64 "-%" PRIu64 "\n", "positions", s->position_first, s->position_last);
  else
    printf("%-10s none\n", "positions");
}

/* ---- chat -------------------------------------------------------------------- */

static void json_session_stats(const struct sk_session_stats *s);

static void chat_help(void) {
  fputs("Type a line and press Enter: it is appended to the session and the\n"
        "reply streams back. The session keeps the conversation, within its\n"
        "policy's budget (streaming: sinks + window; dense: capacity).\n"
        "With a chat template, a line is the user's message and the reply the\n"
        "assistant's; without one, the text simply continues.\n"
        "  Ctrl-C      stop the reply (a second Ctrl-C quits)\n"
        "  Ctrl-D      quit (also /bye)\n"
        "  /system T   the system prompt, before the first message\n"
        "  /stats      the session's figures\n"
        "  /help       this text\n"
        "  //text      send a line that starts with '/'\n",
        stderr);
}

static int cmd_chat(struct sk_client *c, const struct opts *o) {
  bool tty = isatty(STDIN_FILENO);
  struct sk_error e;
  uint64_t session = o->session;
  bool opened = false;
  /* A template (the model's, or the daemon's --chat-template): the chat
   * op with roles; none: plain continuation. */
  char tmpl[SK_CLIENT_NAME_MAX] = "none";
  char tmpl_error[256] = "";
  if (!o->has_session) {
    struct sk_hello h;
    if (sk_client_hello(c, &h, &e) < 0) return report(c, &e);
    snprintf(tmpl, sizeof tmpl, "%s", h.chat_template[0] ? h.chat_template : "none");
    snprintf(tmpl_error, sizeof tmpl_error, "%s", h.chat_template_error);
    struct sk_open_result r;
    struct sk_open_params op = o->open;
    op.temporary = !o->given[OPT_KEEP]; /* closed by the daemon even if we die */
    if (o->system && strcmp(tmpl, "none") != 0) op.system = o->system; /* pinned */
    if (sk_client_open(c, &op, &r, &e) < 0) return report(c, &e);
    session = r.session;
    opened = true;
    if (tty)
      fprintf(stderr, "%s: session %" PRIu64 " (%s, %" PRIu64
              " tokens). Ctrl-C stops a reply; Ctrl-D or /bye quits; /help.\n",
              prog, session, r.policy, r.capacity);
  } else {
    struct sk_session_stats st;
    if (sk_client_session_stats(c, session, &st, &e) < 0) return report(c, &e);
    snprintf(tmpl, sizeof tmpl, "%s", st.chat_template[0] ? st.chat_template : "none");
    if (tty)
      fprintf(stderr, "%s: session %" PRIu64 " (%s, %" PRIu64 " of %" PRIu64
              " tokens in the cache). Ctrl-D or /bye quits; /help.\n",
              prog, session, st.policy, st.resident, st.capacity);
  }
  const bool roles = strcmp(tmpl, "none") != 0;
  if (!roles) {
    fprintf(stderr, "%s: no chat template%s%s: plain text continuation (sinkd --chat-template "
            "NAME gives one)\n", prog, tmpl_error[0] ? ": " : "", tmpl_error);
    if (o->system) sk_cli_die(EXIT_USAGE, "--system needs a chat template");
  } else if (tty) {
    fprintf(stderr, "%s: chat template %s\n", prog, tmpl);
  }
  /* The system prompt of a --session chat, or /system's: it goes first in
   * the first message sent. */
  char *system = o->has_session && o->system ? strdup(o->system) : NULL;

  char *line = NULL;
  size_t line_cap = 0;
  int status = 0;
  unsigned turn = 0;
  for (;;) {
    catch_sigint();
    if (tty) {
      fputs(roles ? "user: " : ">>> ", stdout);
      fflush(stdout);
    }
    errno = 0;
    ssize_t n = getline(&line, &line_cap, stdin);
    if (n < 0) {
      if (errno == EINTR && !feof(stdin)) { /* Ctrl-C at the prompt: a new prompt */
        clearerr(stdin);
        fputc('\n', stdout);
        continue;
      }
      if (tty) fputc('\n', stdout);
      break;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    if (n == 0) continue;
    const char *text = line;
    if (line[0] == '/' && line[1] != '/') {
      if (!strcmp(line, "/bye") || !strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
      if (!strncmp(line, "/system", 7) && (line[7] == ' ' || line[7] == 0)) {
        const char *t = line + 7;
        while (*t == ' ') t++;
        if (!roles)
          fprintf(stderr, "%s: /system: no chat template (plain continuation)\n", prog);
        else if (turn > 0 || (opened && o->system))
          fprintf(stderr, "%s: /system: the system prompt is set before the first message\n",
                  prog);
        else if (!*t)
          fprintf(stderr, "%s: /system TEXT\n", prog);
        else {
          free(system);
          system = strdup(t);
        }
        continue;
      }
      if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
        chat_help();
      } else if (!strcmp(line, "/stats")) {
        struct sk_session_stats st;
        if (sk_client_session_stats(c, session, &st, &e) < 0) {
          status = report(c, &e);
          if (!sk_client_connected(c)) break;
        } else if (o->json) {
          json_session_stats(&st);
        } else {
          print_session_stats(&st);
        }
      } else {
        fprintf(stderr, "%s: unknown command '%s' (/help lists them)\n", prog, line);
      }
      continue;
    }
    if (line[0] == '/') text++; /* "//x" sends "/x" */

    /* One turn: the line and a newline go into the session, the reply
     * comes out of it; both stay in the cache for the next turn. */
    turn++;
    size_t text_len = strlen(text);
    char *prompt = malloc(text_len + 2);
    if (!prompt) sk_cli_die(EXIT_FAILURE, "out of memory");
    memcpy(prompt, text, text_len);
    prompt[text_len] = '\n';
    prompt[text_len + 1] = 0;
    struct sk_generate_params p = o->gen;
    p.stop = o->stops;
    p.n_stop = o->n_stop;
    p.prompt = prompt;
    p.prompt_len = text_len + 1;
    uint64_t prefilled = 0;
    int rc = 0;
    if (roles) {
      /* The chat op: the line is the user's message, the template is
       * the daemon's; the reply is the assistant's, shown as such. */
      struct gen_state g = {.json = o->json, .ends_with_newline = true};
      struct sk_generate_result res;
      struct sk_chat_message m[2];
      size_t nm = 0;
      if (system) m[nm++] = (struct sk_chat_message){"system", system, 0};
      m[nm++] = (struct sk_chat_message){"user", text, text_len};
      p.prompt = NULL;
      p.prompt_len = 0;
      if (tty && !o->json) {
        fputs("assistant: ", stdout);
        fflush(stdout);
      }
      rc = sk_client_chat(c, session, m, nm, &p, on_token, &g, &res, &e);
      free(prompt);
      if (rc < 0) {
        if (g.printed && !g.ends_with_newline) fputc('\n', stdout);
        fflush(stdout);
        status = report(c, &e);
      } else {
        free(system);
        system = NULL;
        if (o->json) json_generate(session, turn, &g, &res);
        else if (!g.printed || !g.ends_with_newline) fputc('\n', stdout);
        fflush(stdout);
        if (strcmp(res.stop, "cancelled") == 0 && interrupted)
          fprintf(stderr, "%s: reply stopped (%" PRIu64 " tokens kept)\n", prog, res.n_tokens);
        else if (strcmp(res.stop, "context_full") == 0)
          fprintf(stderr, "%s: the session is full (%" PRIu64 " tokens, dense policy): "
                  "open one with --policy streaming to keep going\n", prog, res.resident);
      }
      gen_state_free(&g);
      if (!sk_client_connected(c)) break;
      continue;
    }
    if (want_progress(o, p.prompt_len)) {
      rc = prefill(c, session, session_is_empty(c, session), false, prompt, p.prompt_len,
                   &prefilled);
      p.prompt = NULL;
      p.prompt_len = 0;
    }
    struct gen_state g = {.json = o->json, .ends_with_newline = true};
    struct sk_generate_result res;
    if (rc == 0) {
      rc = sk_client_generate(c, session, &p, on_token, &g, &res, &e);
      if (rc < 0) {
        if (g.printed && !g.ends_with_newline) fputc('\n', stdout);
        fflush(stdout);
        status = report(c, &e);
      }
    } else if (rc < 0) {
      fprintf(stderr, "%s: prefill stopped (%" PRIu64 " tokens appended)\n", prog, prefilled);
    } else {
      status = rc;
      rc = -1;
    }
    free(prompt);
    if (rc == 0) {
      res.prompt_tokens += prefilled;
      if (o->json) {
        json_generate(session, turn, &g, &res);
      } else if (g.printed && !g.ends_with_newline) {
        fputc('\n', stdout);
      }
      fflush(stdout);
      if (strcmp(res.stop, "cancelled") == 0 && interrupted)
        fprintf(stderr, "%s: reply stopped (%" PRIu64 " tokens kept)\n", prog, res.n_tokens);
      else if (strcmp(res.stop, "context_full") == 0)
        say_session_full(res.resident);
    }
    gen_state_free(&g);
    if (!sk_client_connected(c)) break;
  }
  signal(SIGINT, SIG_DFL);
  free(line);
  free(system);
  if (opened && sk_client_connected(c)) {
    if (o->given[OPT_KEEP]) {
      fprintf(stderr, "%s: session %" PRIu64 " kept; continue with: %s chat --session %" PRIu64
                "\n", prog, session, prog, session);
    } else if (sk_client_close_session(c, session, &e) < 0 && status == 0) {
      status = report(c, &e);
    }
  }
  return status;
}

static int cmd_tokenize(struct sk_client *c, const struct opts *o, int argc,
                        char **argv) {
  size_t len;
  char *text = text_from_args(argc, argv, &len);
  struct sk_error e;
  int32_t *ids = NULL;
  size_t n = 0;
  enum sk_bos bos = o->no_bos ? SK_BOS_FALSE : SK_BOS_DEFAULT;
  if (o->gen.parse_special) bos |= SK_TEXT_SPECIAL;
  int rc = sk_client_tokenize(c, text, len, bos, &ids, &n, &e);
  free(text);
  if (rc < 0) return report(c, &e);
  if (o->json) fputs("{\"tokens\": [", stdout);
  for (size_t i = 0; i < n; i++)
    printf("%s%" PRId32, i ? (o->json ? ", " : " ") : "", ids[i]);
  fputs(o->json ? "]}\n" : "\n", stdout);
  free(ids);
  return 0;
}

static int cmd_detokenize(struct sk_client *c, const struct opts *o, int argc,
                          char **argv) {
  int32_t *ids = malloc((size_t)argc * sizeof *ids);
  if (!ids) sk_cli_die(EXIT_FAILURE, "out of memory");
  for (int i = 0; i < argc; i++)
    ids[i] = (int32_t)sk_cli_parse_u64("detokenize", argv[i], 0, INT32_MAX);
  struct sk_error e;
  char *text = NULL;
  size_t len = 0;
  int rc = sk_client_detokenize(c, ids, (size_t)argc, &text, &len, &e);
  free(ids);
  if (rc < 0) return report(c, &e);
  if (o->json) {
    fputs("{\"text\": ", stdout);
    sk_cli_json_str(stdout, text, len);
    fputs("}\n", stdout);
  } else {
    fwrite(text, 1, len, stdout);
    /* On a terminal the next prompt must not start after the text; in a
     * pipe the bytes stay exactly the text's. */
    if (isatty(STDOUT_FILENO) && len > 0 && text[len - 1] != '\n') fputc('\n', stdout);
  }
  free(text);
  return 0;
}

static int cmd_open(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_open_result r;
  if (sk_client_open(c, &o->open, &r, &e) < 0) return report(c, &e);
  if (o->json) {
    bool first = true;
    fputc('{', stdout);
    json_kv_u64(stdout, &first, "session", r.session);
    json_kv_str(stdout, &first, "policy", r.policy);
    json_kv_u64(stdout, &first, "capacity", r.capacity);
    json_kv_u64(stdout, &first, "kv_bytes", r.kv_bytes);
    json_kv_u64(stdout, &first, "object_bytes", r.object_bytes);
    if (r.kv_type[0]) json_kv_str(stdout, &first, "kv_type", r.kv_type);
    json_kv_u64(stdout, &first, "n_sink", r.n_sink);
    json_kv_u64(stdout, &first, "window", r.window);
    json_kv_u64(stdout, &first, "heavy", r.heavy);
    json_kv_u64(stdout, &first, "recent", r.recent);
    json_key(stdout, &first, "rope_scale");
    printf("%g", r.rope_scale);
    json_kv_u64(stdout, &first, "pinned", r.pinned);
    fputs("}\n", stdout);
  } else {
    printf("%" PRIu64 "\n", r.session);
  }
  return 0;
}

static int cmd_close(struct sk_client *c, const struct opts *o, uint64_t id) {
  struct sk_error e;
  if (sk_client_close_session(c, id, &e) < 0) return report(c, &e);
  if (o->json) printf("{\"session\": %" PRIu64 ", \"closed\": true}\n", id);
  return 0;
}

/* Closes every session the caller may see (--all), or those idle for at
 * least o->idle_s seconds and not busy (--idle). Prints the closed ids, a
 * line each (JSON: {"closed": [IDS]}). A session that went away in the
 * meantime is skipped. */
static int cmd_close_many(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_session_info *s = NULL;
  size_t n = 0;
  if (sk_client_list(c, &s, &n, &e) < 0) return report(c, &e);
  if (o->json) fputs("{\"closed\": [", stdout);
  size_t n_closed = 0;
  int status = 0;
  for (size_t i = 0; i < n; i++) {
    if (!o->close_all && (s[i].busy || s[i].idle_s < o->idle_s)) continue;
    if (sk_client_close_session(c, s[i].session, &e) < 0) {
      if (e.code == SK_ERR_NO_SUCH_SESSION) continue;
      status = report(c, &e);
      break;
    }
    if (o->json)
      printf("%s%" PRIu64, n_closed ? ", " : "", s[i].session);
    else
      printf("%" PRIu64 "\n", s[i].session);
    n_closed++;
  }
  if (o->json) fputs("]}\n", stdout);
  free(s);
  return status;
}

/* Seconds as "3d", "2h", "1h30m", "45m", "90s" or "30" for --idle. */
static void format_duration(uint64_t s, char *buf, size_t size) {
  if (s >= 86400)
    snprintf(buf, size, "%" PRIu64 "d%" PRIu64 "h", s / 86400, s % 86400 / 3600);
  else if (s >= 3600)
    snprintf(buf, size, "%" PRIu64 "h%" PRIu64 "m", s / 3600, s % 3600 / 60);
  else if (s >= 60)
    snprintf(buf, size, "%" PRIu64 "m%" PRIu64 "s", s / 60, s % 60);
  else
    snprintf(buf, size, "%" PRIu64 "s", s);
}

/* Bytes as "12K", "3.5M", "1.2G" (powers of 1024). */
static void format_bytes(uint64_t b, char *buf, size_t size) {
  if (b < 1024)
    snprintf(buf, size, "%" PRIu64, b);
  else if (b < (1u << 20))
    snprintf(buf, size, "%.1fK", (double)b / 1024.0);
  else if (b < (1u << 30))
    snprintf(buf, size, "%.1fM", (double)b / (1024.0 * 1024.0));
  else
    snprintf(buf, size, "%.1fG", (double)b / (1024.0 * 1024.0 * 1024.0));
}

static int cmd_list(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_session_info *s = NULL;
  size_t n = 0;
  if (sk_client_list(c, &s, &n, &e) < 0) return report(c, &e);
  if (o->json) {
    fputs("{\"sessions\": [", stdout);
    for (size_t i = 0; i < n; i++) {
      bool first = true;
      fputs(i ? ", {" : "{", stdout);
      json_kv_u64(stdout, &first, "session", s[i].session);
      json_kv_u64(stdout, &first, "owner_uid", s[i].owner_uid);
      json_kv_str(stdout, &first, "policy", s[i].policy);
      json_kv_u64(stdout, &first, "capacity", s[i].capacity);
      json_kv_u64(stdout, &first, "resident", s[i].resident);
      json_kv_u64(stdout, &first, "seen", s[i].seen);
      json_kv_u64(stdout, &first, "kv_bytes", s[i].kv_bytes);
      json_kv_u64(stdout, &first, "object_bytes", s[i].object_bytes);
      json_kv_u64(stdout, &first, "age_s", s[i].age_s);
      json_kv_u64(stdout, &first, "idle_s", s[i].idle_s);
      json_key(stdout, &first, "busy");
      fputs(s[i].busy ? "true" : "false", stdout);
      json_key(stdout, &first, "temporary");
      fputs(s[i].temporary ? "true" : "false", stdout);
      json_key(stdout, &first, "adopted");
      fputs(s[i].adopted ? "true" : "false", stdout);
      if (s[i].kv_type[0]) json_kv_str(stdout, &first, "kv_type", s[i].kv_type);
      fputc('}', stdout);
    }
    fputs("]}\n", stdout);
  } else {
    printf("%-10s %-6s %-12s %10s %10s %14s %8s %-8s %-8s %-7s %s\n", "SESSION", "OWNER",
           "POLICY", "CAPACITY", "RESIDENT", "SEEN", "MEMORY", "AGE", "IDLE", "ADOPTED", "KV");
    for (size_t i = 0; i < n; i++) {
      char mem[16], age[24], idle[24];
      format_bytes(s[i].object_bytes, mem, sizeof mem);
      format_duration(s[i].age_s, age, sizeof age);
      if (s[i].busy)
        snprintf(idle, sizeof idle, "busy");
      else
        format_duration(s[i].idle_s, idle, sizeof idle);
      printf("%-10" PRIu64 " %-6" PRIu64 " %-12s %10" PRIu64 " %10" PRIu64 " %14" PRIu64
             " %8s %-8s %-8s %-7s %s%s\n",
             s[i].session, s[i].owner_uid, s[i].policy, s[i].capacity, s[i].resident,
             s[i].seen, mem, age, idle, s[i].adopted ? "yes" : "no",
             s[i].kv_type[0] ? s[i].kv_type : "-", s[i].temporary ? " (temporary)" : "");
    }
  }
  free(s);
  return 0;
}

/* Prints "key       value" (text: columns, as stats prints them) or a
 * JSON member. */
struct kv_out {
  bool json, first;
};

static void out_u64(struct kv_out *k, const char *key, uint64_t v) {
  if (k->json)
    json_kv_u64(stdout, &k->first, key, v);
  else
    printf("%-10s %" PRIu64 "\n", key, v);
}

static void out_str(struct kv_out *k, const char *key, const char *v) {
  if (k->json)
    json_kv_str(stdout, &k->first, key, v);
  else
    printf("%-10s %s\n", key, v);
}

static void out_bool(struct kv_out *k, const char *key, bool v) {
  if (k->json) {
    json_key(stdout, &k->first, key);
    fputs(v ? "true" : "false", stdout);
  } else {
    printf("%-10s %s\n", key, v ? "yes" : "no");
  }
}

static void out_f64(struct kv_out *k, const char *key, double v) {
  if (k->json) {
    json_key(stdout, &k->first, key);
    printf("%g", v);
  } else {
    printf("%s: %g\n", key, v);
  }
}

static void out_begin(struct kv_out *k) {
  if (k->json) fputc('{', stdout);
}

static void out_end(struct kv_out *k) {
  if (k->json) fputs("}\n", stdout);
}

/* 3725 -> "1h 2m 5s". */
static void human_duration(uint64_t s, char *buf, size_t size) {
  if (s >= 86400)
    snprintf(buf, size, "%" PRIu64 "d %" PRIu64 "h %" PRIu64 "m", s / 86400, s % 86400 / 3600,
             s % 3600 / 60);
  else if (s >= 3600)
    snprintf(buf, size, "%" PRIu64 "h %" PRIu64 "m %" PRIu64 "s", s / 3600, s % 3600 / 60, s % 60);
  else if (s >= 60)
    snprintf(buf, size, "%" PRIu64 "m %" PRIu64 "s", s / 60, s % 60);
  else
    snprintf(buf, size, "%" PRIu64 "s", s);
}

/* "LABEL  USED of MAX", or "LABEL  USED, NONE" when max is 0 (no limit). */
static void print_bytes_of(const char *label, uint64_t used, uint64_t max, const char *none) {
  char u[32], m[32];
  human_bytes(used, u, sizeof u);
  human_bytes(max, m, sizeof m);
  if (max)
    printf("%-17s %s of %s\n", label, u, m);
  else
    printf("%-17s %s, %s\n", label, u, none);
}

static void json_session_stats_members(struct kv_out *k, const struct sk_session_stats *s);

static int cmd_stats(struct sk_client *c, const struct opts *o, bool has_id,
                     uint64_t id) {
  struct sk_error e;
  struct kv_out k = {.json = true, .first = true};
  if (!has_id) {
    struct sk_daemon_stats s;
    if (sk_client_stats(c, &s, &e) < 0) return report(c, &e);
    if (o->json) {
      out_begin(&k);
      out_u64(&k, "sessions", s.sessions);
      out_u64(&k, "clients", s.clients);
      out_u64(&k, "uptime_s", s.uptime_s);
      out_u64(&k, "tokens_prefilled", s.tokens_prefilled);
      out_u64(&k, "tokens_generated", s.tokens_generated);
      out_u64(&k, "max_sessions", s.max_sessions);
      out_u64(&k, "memory_bytes", s.memory_bytes);
      out_u64(&k, "max_memory", s.max_memory);
      out_u64(&k, "adopted", s.adopted);
      out_u64(&k, "set_aside", s.set_aside);
      out_u64(&k, "idle_ttl_s", s.idle_ttl_s);
      if (s.has_user) {
        out_u64(&k, "user_sessions", s.user_sessions);
        out_u64(&k, "user_memory_bytes", s.user_memory_bytes);
        out_u64(&k, "max_user_sessions", s.max_user_sessions);
        out_u64(&k, "max_user_memory", s.max_user_memory);
      }
      if (s.compute.kernel[0]) { /* daemons before 0.2 do not report these */
        out_u64(&k, "steps", s.steps);
        out_str(&k, "kernel", s.compute.kernel);
        out_u64(&k, "threads", s.compute.threads);
        out_u64(&k, "max_batch", s.compute.max_batch);
        if (s.compute.kv_type[0]) out_str(&k, "kv_type", s.compute.kv_type);
      }
      out_u64(&k, "weights_mapped_bytes", s.weights_mapped_bytes);
      out_u64(&k, "weights_repacked_bytes", s.weights_repacked_bytes);
      out_end(&k);
      return 0;
    }
    char up[64];
    human_duration(s.uptime_s, up, sizeof up);
    printf("%-17s %" PRIu64 "\n", "sessions", s.sessions);
    printf("%-17s %" PRIu64 "\n", "clients", s.clients);
    printf("%-17s %s\n", "uptime", up);
    printf("%-17s %" PRIu64 "\n", "tokens prefilled", s.tokens_prefilled);
    printf("%-17s %" PRIu64 "\n", "tokens generated", s.tokens_generated);
    if (s.compute.kernel[0]) {
      printf("%-17s %s kernels, %" PRIu32 " threads, %" PRIu32 " tokens per pass\n", "compute",
             s.compute.kernel, s.compute.threads, s.compute.max_batch);
      if (s.compute.kv_type[0]) printf("%-17s %s\n", "new sessions' KV", s.compute.kv_type);
      printf("%-17s %" PRIu64 "\n", "forward passes", s.steps);
    }
    if (s.weights_mapped_bytes || s.weights_repacked_bytes) {
      char mapped[32], repacked[32];
      human_bytes(s.weights_mapped_bytes, mapped, sizeof mapped);
      human_bytes(s.weights_repacked_bytes, repacked, sizeof repacked);
      printf("%-17s %s mapped from the file, %s repacked\n", "weights", mapped, repacked);
    }
    print_bytes_of("session memory", s.memory_bytes, s.max_memory, "no limit");
    printf("%-17s %" PRIu64 "\n", "max sessions", s.max_sessions);
    if (s.has_user) { /* the caller's uid against its limits */
      if (s.max_user_sessions)
        printf("%-17s %" PRIu64 " of %" PRIu64 "\n", "your sessions", s.user_sessions,
               s.max_user_sessions);
      else
        printf("%-17s %" PRIu64 ", no limit of your own\n", "your sessions", s.user_sessions);
      print_bytes_of("your memory", s.user_memory_bytes, s.max_user_memory,
                     "no limit of your own");
    }
    printf("%-17s %" PRIu64 " adopted, %" PRIu64 " set aside\n", "at start", s.adopted,
           s.set_aside);
    if (s.idle_ttl_s)
      printf("%-17s %" PRIu64 " s\n", "idle ttl", s.idle_ttl_s);
    else
      printf("%-17s never\n", "idle ttl");
    return 0;
  }
  struct sk_session_stats s;
  if (sk_client_session_stats(c, id, &s, &e) < 0) return report(c, &e);
  if (!o->json) {
    print_session_stats(&s);
    if (o->tokens) {
      int32_t *toks = NULL;
      size_t n = 0;
      if (sk_client_session_tokens(c, id, &toks, &n, &e) < 0) return report(c, &e);
      printf("%-10s", "tokens");
      for (size_t i = 0; i < n; i++) printf(" %" PRId32, toks[i]);
      putchar('\n');
      free(toks);
    }
    return 0;
  }
  out_begin(&k);
  json_session_stats_members(&k, &s);
  if (o->tokens) {
    int32_t *toks = NULL;
    size_t n = 0;
    if (sk_client_session_tokens(c, id, &toks, &n, &e) < 0) {
      out_end(&k);
      return report(c, &e);
    }
    json_key(stdout, &k.first, "tokens");
    fputc('[', stdout);
    for (size_t i = 0; i < n; i++) printf("%s%" PRId32, i ? ", " : "", toks[i]);
    fputc(']', stdout);
    free(toks);
  }
  out_end(&k);
  return 0;
}

/* The JSON members of a session's stats (the object's braces are the
 * caller's: out_begin / out_end). */
static void json_session_stats_members(struct kv_out *k, const struct sk_session_stats *s) {
  out_u64(k, "session", s->session);
  out_str(k, "policy", s->policy);
  out_u64(k, "n_sink", s->n_sink);
  out_u64(k, "window", s->window);
  out_u64(k, "heavy", s->heavy);
  out_u64(k, "recent", s->recent);
  out_u64(k, "pinned", s->pinned);
  out_f64(k, "rope_scale", s->rope_scale);
  out_f64(k, "model_rope_scale", s->model_rope_scale);
  out_u64(k, "capacity", s->capacity);
  out_u64(k, "resident", s->resident);
  out_u64(k, "seen", s->seen);
  out_u64(k, "evicted", s->evicted);
  out_u64(k, "kv_bytes", s->kv_bytes);
  out_u64(k, "object_bytes", s->object_bytes);
  if (s->kv_type[0]) out_str(k, "kv_type", s->kv_type);
  json_key(stdout, &k->first, "positions");
  if (s->has_positions)
    printf("[%" PRIu64 ", %" PRIu64 "]", s->position_first, s->position_last);
  else
    fputs("[]", stdout);
  out_u64(k, "commit", s->commit);
  out_bool(k, "adopted", s->adopted);
  out_u64(k, "idle_s", s->idle_s);
  out_bool(k, "busy", s->busy);
  json_key(stdout, &k->first, "resident_ranges");
  fputc('[', stdout);
  for (size_t i = 0; i < s->n_resident_ranges; i++)
    printf("%s[%" PRIu64 ", %" PRIu64 "]", i ? ", " : "", s->resident_ranges[i].first,
           s->resident_ranges[i].last);
  fputc(']', stdout);
  out_f64(k, "sparsity", s->sparsity);
  out_u64(k, "sparse_tokens", s->sparse_tokens);
  out_f64(k, "weight_bytes_per_token", s->weight_bytes_per_token);
  json_key(stdout, &k->first, "sparsity_measured");
  fputc('[', stdout);
  for (size_t l = 0; l < s->n_sparse_layers; l++)
    printf("%s%.6g", l ? ", " : "", s->sparsity_measured[l]);
  fputc(']', stdout);
  json_key(stdout, &k->first, "attention");
  printf("{\"steps\": %" PRIu64 ", \"sink_tokens\": %" PRIu64 ", \"sink_mass\": [",
         s->attn_steps, s->sink_tokens);
  for (size_t l = 0; l < s->n_layers; l++) printf("%s%.6g", l ? ", " : "", s->sink_mass[l]);
  fputs("], \"entropy\": [", stdout);
  for (size_t l = 0; l < s->n_layers; l++) printf("%s%.6g", l ? ", " : "", s->entropy[l]);
  fputs("]}", stdout);
}

static void json_session_stats(const struct sk_session_stats *s) {
  struct kv_out k = {.json = true, .first = true};
  out_begin(&k);
  json_session_stats_members(&k, s);
  out_end(&k);
}

/* resume, fork, load: a session summary; text mode prints only the id for
 * fork and load (for scripts), everything for resume. */
static void print_summary(const struct opts *o, const struct sk_session_summary *s,
                          bool id_only, const char *file, size_t bytes) {
  if (id_only && !o->json) {
    printf("%" PRIu64 "\n", s->session);
    return;
  }
  struct kv_out k = {.json = o->json, .first = true};
  out_begin(&k);
  out_u64(&k, "session", s->session);
  if (s->from) out_u64(&k, "from", s->from);
  if (file) {
    out_str(&k, "file", file);
    out_u64(&k, "bytes", bytes);
  }
  out_str(&k, "policy", s->policy);
  out_u64(&k, "capacity", s->capacity);
  out_u64(&k, "kv_bytes", s->kv_bytes);
  out_u64(&k, "object_bytes", s->object_bytes);
  if (s->kv_type[0]) out_str(&k, "kv_type", s->kv_type);
  out_u64(&k, "resident", s->resident);
  out_u64(&k, "seen", s->seen);
  out_u64(&k, "evicted", s->evicted);
  out_u64(&k, "commit", s->commit);
  out_bool(&k, "adopted", s->adopted);
  out_end(&k);
}

static int cmd_resume(struct sk_client *c, const struct opts *o, uint64_t id) {
  struct sk_error e;
  struct sk_session_summary s;
  if (sk_client_resume(c, id, &s, &e) < 0) return report(c, &e);
  print_summary(o, &s, false, NULL, 0);
  return 0;
}

static int cmd_fork(struct sk_client *c, const struct opts *o, uint64_t id) {
  struct sk_error e;
  struct sk_session_summary s;
  if (sk_client_fork(c, id, &s, &e) < 0) return report(c, &e);
  print_summary(o, &s, true, NULL, 0);
  return 0;
}

static int cmd_save(struct sk_client *c, const struct opts *o, uint64_t id,
                    const char *path) {
  struct sk_error e;
  size_t bytes = 0;
  if (sk_client_save(c, id, path, &bytes, &e) < 0) {
    if (e.code == SK_ERR_IO && sk_client_connected(c)) {
      fprintf(stderr, "%s: %s\n", prog, e.message);
      return EXIT_FAILURE;
    }
    return report(c, &e);
  }
  if (o->json) {
    printf("{\"session\": %" PRIu64 ", \"file\": ", id);
    sk_cli_json_cstr(stdout, path);
    printf(", \"bytes\": %zu}\n", bytes);
  } else {
    printf("session %" PRIu64 " saved to %s (%zu bytes)\n", id, path, bytes);
  }
  return 0;
}

static int cmd_load(struct sk_client *c, const struct opts *o, const char *path) {
  struct sk_error e;
  struct sk_session_summary s;
  if (sk_client_load(c, path, &s, &e) < 0) {
    if (e.code == SK_ERR_IO && sk_client_connected(c)) {
      fprintf(stderr, "%s: %s\n", prog, e.message);
      return EXIT_FAILURE;
    }
    return report(c, &e);
  }
  print_summary(o, &s, true, NULL, 0);
  return 0;
}

static int cmd_ping(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  double t0 = now_ms();
  if (sk_client_ping(c, &e) < 0) return report(c, &e);
  double ms = now_ms() - t0;
  if (o->json)
    printf("{\"pong\": true, \"ms\": %.3f}\n", ms);
  else
    printf("pong (%.1f ms)\n", ms);
  return 0;
}

static int cmd_hello(struct sk_client *c, const struct opts *o) {
  struct sk_error e;
  struct sk_hello h;
  if (sk_client_hello(c, &h, &e) < 0) return report(c, &e);
  if (o->json) {
    bool first = true, f2 = true;
    fputc('{', stdout);
    json_kv_u64(stdout, &first, "protocol", h.protocol);
    json_kv_str(stdout, &first, "server", h.server);
    json_kv_str(stdout, &first, "version", h.version);
    json_key(stdout, &first, "model");
    fputc('{', stdout);
    json_kv_str(stdout, &f2, "name", h.model.name);
    json_kv_u64(stdout, &f2, "n_vocab", h.model.n_vocab);
    json_kv_u64(stdout, &f2, "n_ctx_train", h.model.n_ctx_train);
    json_kv_u64(stdout, &f2, "n_layer", h.model.n_layer);
    json_kv_u64(stdout, &f2, "dim", h.model.dim);
    json_kv_u64(stdout, &f2, "n_head", h.model.n_head);
    json_kv_u64(stdout, &f2, "n_kv_head", h.model.n_kv_head);
    json_key(stdout, &f2, "rope_scale");
    printf("%g", h.model.rope_scale);
    json_kv_u64(stdout, &f2, "max_capacity", h.model.max_capacity);
    if (h.model.weight_type[0]) {
      json_kv_str(stdout, &f2, "weight_type", h.model.weight_type);
      json_kv_u64(stdout, &f2, "weight_bytes", h.model.weight_bytes);
    }
    fputc('}', stdout);
    if (h.compute.kernel[0]) {
      json_key(stdout, &first, "compute");
      f2 = true;
      fputc('{', stdout);
      json_kv_str(stdout, &f2, "kernel", h.compute.kernel);
      json_kv_u64(stdout, &f2, "threads", h.compute.threads);
      json_kv_u64(stdout, &f2, "max_batch", h.compute.max_batch);
      if (h.compute.kv_type[0]) json_kv_str(stdout, &f2, "kv_type", h.compute.kv_type);
      fputc('}', stdout);
    }
    json_key(stdout, &first, "defaults");
    f2 = true;
    fputc('{', stdout);
    json_kv_str(stdout, &f2, "policy", h.defaults.policy);
    json_kv_u64(stdout, &f2, "n_sink", h.defaults.n_sink);
    json_kv_u64(stdout, &f2, "window", h.defaults.window);
    json_kv_u64(stdout, &f2, "heavy", h.defaults.heavy);
    json_kv_u64(stdout, &f2, "recent", h.defaults.recent);
    json_kv_u64(stdout, &f2, "capacity", h.defaults.capacity);
    json_key(stdout, &f2, "rope_scale");
    printf("%g", h.defaults.rope_scale);
    fputc('}', stdout);
    if (h.chat_template[0]) {
      json_key(stdout, &first, "chat_template");
      f2 = true;
      fputc('{', stdout);
      json_kv_str(stdout, &f2, "name", h.chat_template);
      if (h.chat_template_error[0]) json_kv_str(stdout, &f2, "error", h.chat_template_error);
      fputc('}', stdout);
    }
    fputs("}\n", stdout);
    return 0;
  }
  printf("protocol: %" PRIu32 "\n", h.protocol);
  printf("server: %s\n", h.server);
  printf("version: %s\n", h.version);
  printf("model: %s\n", h.model.name);
  printf("model.n_vocab: %" PRIu32 "\n", h.model.n_vocab);
  printf("model.n_ctx_train: %" PRIu32 "\n", h.model.n_ctx_train);
  printf("model.n_layer: %" PRIu32 "\n", h.model.n_layer);
  printf("model.dim: %" PRIu32 "\n", h.model.dim);
  printf("model.n_head: %" PRIu32 "\n", h.model.n_head);
  printf("model.n_kv_head: %" PRIu32 "\n", h.model.n_kv_head);
  printf("model.rope_scale: %g\n", h.model.rope_scale);
  printf("model.max_capacity: %" PRIu32 "\n", h.model.max_capacity);
  if (h.model.weight_type[0]) {
    printf("model.weight_type: %s\n", h.model.weight_type);
    printf("model.weight_bytes: %" PRIu64 "\n", h.model.weight_bytes);
  }
  if (h.compute.kernel[0]) {
    printf("compute.kernel: %s\n", h.compute.kernel);
    printf("compute.threads: %" PRIu32 "\n", h.compute.threads);
    printf("compute.max_batch: %" PRIu32 "\n", h.compute.max_batch);
    if (h.compute.kv_type[0]) printf("compute.kv_type: %s\n", h.compute.kv_type);
  }
  printf("defaults.policy: %s\n", h.defaults.policy);
  printf("defaults.n_sink: %" PRIu32 "\n", h.defaults.n_sink);
  printf("defaults.window: %" PRIu32 "\n", h.defaults.window);
  printf("defaults.heavy: %" PRIu32 "\n", h.defaults.heavy);
  printf("defaults.recent: %" PRIu32 "\n", h.defaults.recent);
  printf("defaults.capacity: %" PRIu32 "\n", h.defaults.capacity);
  printf("defaults.rope_scale: %g\n", h.defaults.rope_scale);
  if (h.chat_template[0]) printf("chat_template: %s\n", h.chat_template);
  if (h.chat_template_error[0]) printf("chat_template.error: %s\n", h.chat_template_error);
  return 0;
}

/* ---- main ------------------------------------------------------------- */

enum cmd {
  CMD_GENERATE,
  CMD_CHAT,
  CMD_TOKENIZE,
  CMD_DETOKENIZE,
  CMD_OPEN,
  CMD_CLOSE,
  CMD_LIST,
  CMD_STATS,
  CMD_PING,
  CMD_HELLO,
  CMD_RESUME,
  CMD_FORK,
  CMD_SAVE,
  CMD_LOAD,
};

/* A command named after a protocol op takes the op's wire name (the bash
 * completion lists the same names; tests/test-completion.sh checks it). */
#define OP(NAME) SK_OP_##NAME, NULL
static const struct {
  int op;                 /* the op it is named after (SK_OP_...), or -1 for
                             a command of sinkctl's own (save, load) */
  const char *name;       /* the name of a command of sinkctl's own */
  enum cmd cmd;
  int min_args, max_args; /* positional arguments; -1 = any number */
  const char *arg_name;   /* for "missing ..." */
  const int *options;     /* command-specific options allowed, 0-ended */
} commands[] = {
    {OP(GENERATE), CMD_GENERATE, 0, -1, "PROMPT",
     (const int[]){OPT_MAX_TOKENS, OPT_TEMPERATURE, OPT_TOP_K, OPT_TOP_P,
                   OPT_SEED, OPT_STOP, OPT_IGNORE_EOS, OPT_SESSION,
                   OPT_NO_ECHO, OPT_POLICY, OPT_SINKS, OPT_WINDOW,
                   OPT_CAPACITY, OPT_HEAVY, OPT_RECENT, OPT_ROPE_SCALE, OPT_SPARSITY,
                   OPT_PIN, OPT_PIN_FILE, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_SPECIAL, 0}},
    {OP(CHAT), CMD_CHAT, 0, 0, NULL,
     (const int[]){OPT_MAX_TOKENS, OPT_TEMPERATURE, OPT_TOP_K, OPT_TOP_P,
                   OPT_SEED, OPT_STOP, OPT_IGNORE_EOS, OPT_SESSION,
                   OPT_POLICY, OPT_SINKS, OPT_WINDOW, OPT_CAPACITY,
                   OPT_HEAVY, OPT_RECENT, OPT_ROPE_SCALE, OPT_SPARSITY, OPT_PIN,
                   OPT_PIN_FILE, OPT_KEEP, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_SYSTEM, 0}},
    {OP(TOKENIZE), CMD_TOKENIZE, 1, -1, "TEXT ('-' reads stdin)",
     (const int[]){OPT_NO_BOS, OPT_SPECIAL, 0}},
    {OP(DETOKENIZE), CMD_DETOKENIZE, 1, -1, "token ID", (const int[]){0}},
    {OP(OPEN), CMD_OPEN, 0, 0, NULL,
     (const int[]){OPT_POLICY, OPT_SINKS, OPT_WINDOW, OPT_CAPACITY,
                   OPT_HEAVY, OPT_RECENT, OPT_ROPE_SCALE, OPT_SPARSITY, OPT_PIN,
                   OPT_PIN_FILE, 0}},
    {OP(CLOSE), CMD_CLOSE, 0, 1, "session ID (or --idle DURATION, --all)",
     (const int[]){OPT_IDLE, OPT_ALL, 0}},
    {OP(LIST), CMD_LIST, 0, 0, NULL, (const int[]){0}},
    {OP(STATS), CMD_STATS, 0, 1, "session ID", (const int[]){OPT_TOKENS, 0}},
    {OP(RESUME), CMD_RESUME, 1, 1, "session ID", (const int[]){0}},
    {OP(FORK), CMD_FORK, 1, 1, "session ID", (const int[]){0}},
    {-1, "save", CMD_SAVE, 2, 2, "session ID and FILE", (const int[]){0}},
    {-1, "load", CMD_LOAD, 1, 1, "FILE", (const int[]){0}},
    {OP(PING), CMD_PING, 0, 0, NULL, (const int[]){0}},
    {OP(HELLO), CMD_HELLO, 0, 0, NULL, (const int[]){0}},
};
#undef OP

static void parse_options(int argc, char **argv, struct opts *o) {
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":s:jvhVn:t:", long_options, NULL)) !=
         -1) {
    if (c >= 0 && c < OPT__END) o->given[c] = true;
    switch (c) {
    case OPT_SOCKET:
      if (!optarg[0]) sk_cli_usage_error("--socket: the path is empty");
      o->socket = optarg;
      break;
    case OPT_JSON:
      o->json = true;
      g_json = true;
      sk_cli_set_error_fn(json_cli_error);
      break;
    case OPT_VERBOSE: o->verbose = true; break;
    case OPT_HELP: help(); exit(0);
    case OPT_VERSION:
      printf("sinkctl %s (protocol %d)\n", SK_VERSION, SK_PROTOCOL_VERSION);
      exit(0);
    case OPT_MAX_TOKENS:
      o->gen.max_tokens =
          (uint32_t)sk_cli_parse_u64("--max-tokens", optarg, 1, SK_WIRE_MAX_TOKENS);
      break;
    case OPT_TEMPERATURE: {
      double t = sk_cli_parse_double("--temperature", optarg);
      if (!(t >= 0 && t <= SK_MAX_TEMPERATURE))
        sk_cli_usage_error("--temperature: '%s' is not in [0, %g]", optarg, SK_MAX_TEMPERATURE);
      o->gen.temperature = t;
      break;
    }
    case OPT_TOP_K:
      o->gen.top_k = (uint32_t)sk_cli_parse_u64("--top-k", optarg, 0, UINT32_MAX);
      break;
    case OPT_TOP_P: {
      double p = sk_cli_parse_double("--top-p", optarg);
      if (!(p > 0 && p <= 1))
        sk_cli_usage_error("--top-p: '%s' is not in (0, 1]", optarg);
      o->gen.top_p = p;
      break;
    }
    case OPT_SEED:
      o->gen.seed = sk_cli_parse_u64("--seed", optarg, 0, UINT64_MAX);
      o->gen.has_seed = true;
      break;
    case OPT_STOP: {
      if (!optarg[0]) sk_cli_usage_error("--stop: the text is empty");
      const char **ns = realloc(o->stops, (o->n_stop + 1) * sizeof *ns);
      if (!ns) sk_cli_die(EXIT_FAILURE, "out of memory");
      o->stops = ns;
      o->stops[o->n_stop++] = optarg;
      break;
    }
    case OPT_IGNORE_EOS: o->gen.ignore_eos = true; break;
    case OPT_SESSION:
      o->session = sk_cli_parse_u64("--session", optarg, 0, UINT64_MAX);
      o->has_session = true;
      break;
    case OPT_NO_ECHO: o->no_echo = true; break;
    case OPT_POLICY:
      if (!optarg[0]) sk_cli_usage_error("--policy: the name is empty");
      o->open.policy = optarg;
      break;
    case OPT_SINKS:
      o->open.n_sink = (uint32_t)sk_cli_parse_u64("--sinks", optarg, 0, UINT32_MAX);
      o->open.has_n_sink = true;
      break;
    case OPT_HEAVY:
      o->open.heavy = (uint32_t)sk_cli_parse_u64("--heavy", optarg, 1, UINT32_MAX);
      break;
    case OPT_RECENT:
      o->open.recent = (uint32_t)sk_cli_parse_u64("--recent", optarg, 1, UINT32_MAX);
      break;
    case OPT_ROPE_SCALE: {
      double r = sk_cli_parse_double("--rope-scale", optarg);
      if (!(r > 0 && r <= SK_MAX_ROPE_SCALE))
        sk_cli_usage_error("--rope-scale: '%s' is not in (0, %g]", optarg, SK_MAX_ROPE_SCALE);
      o->open.rope_scale = r;
      break;
    }
    case OPT_SYSTEM:
      if (!optarg[0]) sk_cli_usage_error("--system: the text is empty");
      o->system = optarg;
      break;
    case OPT_SPARSITY: {
      double sp = sk_cli_parse_double("--sparsity", optarg);
      if (!(sp >= 0 && sp < 1)) sk_cli_usage_error("--sparsity: '%s' is not in [0, 1)", optarg);
      o->open.sparsity = sp;
      break;
    }
    case OPT_PIN:
      if (o->open.pin) sk_cli_usage_error("--pin/--pin-file: given twice");
      if (!optarg[0]) sk_cli_usage_error("--pin: the text is empty");
      o->open.pin = optarg;
      break;
    case OPT_PIN_FILE: {
      if (o->open.pin) sk_cli_usage_error("--pin/--pin-file: given twice");
      FILE *f = fopen(optarg, "rb");
      if (!f) sk_cli_usage_error("--pin-file: cannot open %s: %s", optarg, strerror(errno));
      size_t cap = 1 << 16, len = 0;
      char *t = malloc(cap + 1);
      if (!t) sk_cli_die(EXIT_FAILURE, "out of memory");
      len = fread(t, 1, cap + 1, f);
      bool bad = ferror(f) != 0;
      fclose(f);
      if (bad) sk_cli_usage_error("--pin-file: cannot read %s", optarg);
      if (len > cap) sk_cli_usage_error("--pin-file: %s is longer than %zu bytes", optarg, cap);
      if (len == 0) sk_cli_usage_error("--pin-file: %s is empty", optarg);
      t[len] = 0;
      o->pin_file_text = t;
      o->open.pin = t;
      o->open.pin_len = len;
      break;
    }
    case OPT_WINDOW:
      o->open.window = (uint32_t)sk_cli_parse_u64("--window", optarg, 1, UINT32_MAX);
      break;
    case OPT_CAPACITY:
      o->open.capacity =
          (uint32_t)sk_cli_parse_u64("--capacity", optarg, 1, UINT32_MAX);
      break;
    case OPT_NO_BOS: o->no_bos = true; break;
    case OPT_SPECIAL: o->gen.parse_special = true; break;
    case OPT_KEEP:
    case OPT_PROGRESS:
    case OPT_NO_PROGRESS: break; /* read from o->given */
    case OPT_TOKENS: o->tokens = true; break;
    case OPT_IDLE:
      o->idle_s = parse_duration("--idle", optarg);
      o->close_idle = true;
      break;
    case OPT_ALL: o->close_all = true; break;
    case OPT_TIMEOUT: {
      uint64_t t = parse_duration("--timeout", optarg);
      if (t == 0 || t > UINT_MAX / 1000)
        sk_cli_usage_error("--timeout: '%s' is not in 1s..%us", optarg, UINT_MAX / 1000);
      o->timeout_ms = (unsigned int)(t * 1000);
      break;
    }
    case ':':
      sk_cli_usage_error("option '%s' needs a value", argv[optind - 1]);
    case '?':
    default:
      if (optopt > 0 && optopt < 256 && strncmp(argv[optind - 1], "--", 2))
        sk_cli_usage_error("unknown option '-%c'", optopt);
      sk_cli_usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
}

/* The options that shape a new session (open, and generate / chat without
 * --session): a known policy, only the parameters it has (sinkd(8),
 * "Sessions and policies"); with --session none of them, since the
 * session exists already. Usage errors, before connecting. */
static void check_open_options(const struct opts *o, const char *cmd) {
  static const int shaping[] = {OPT_POLICY, OPT_SINKS,      OPT_WINDOW, OPT_CAPACITY, OPT_HEAVY,
                                OPT_RECENT, OPT_ROPE_SCALE, OPT_SPARSITY, OPT_PIN,    OPT_PIN_FILE};
  if (o->has_session)
    for (size_t i = 0; i < sizeof shaping / sizeof shaping[0]; i++)
      if (o->given[shaping[i]])
        sk_cli_usage_error("--%s: shapes a new session; %s --session %" PRIu64 " uses one that exists",
                    opt_name(shaping[i]), cmd, o->session);
  const char *pol = o->open.policy;
  if (!pol) return; /* the daemon's default policy: it checks the rest */
  const unsigned parts = sk_policy_parts(pol, strlen(pol));
  if (!parts) sk_cli_usage_error("--policy: '%s' is not one of streaming, window, h2o, sink_h2o, dense", pol);
  /* a zero is "none of it", which any policy takes (as the daemon does) */
  const struct {
    int opt;
    unsigned part;
    bool nonzero;
  } params[] = {{OPT_SINKS, SK_PART_SINKS, o->open.n_sink != 0},
                {OPT_WINDOW, SK_PART_WINDOW, o->open.window != 0},
                {OPT_HEAVY, SK_PART_HEAVY, o->open.heavy != 0},
                {OPT_RECENT, SK_PART_HEAVY, o->open.recent != 0},
                {OPT_CAPACITY, SK_PART_CAPACITY, o->open.capacity != 0},
                {OPT_PIN, SK_PART_PIN, true},
                {OPT_PIN_FILE, SK_PART_PIN, true}};
  for (size_t j = 0; j < sizeof params / sizeof params[0]; j++)
    if (o->given[params[j].opt] && params[j].nonzero && !(parts & params[j].part))
      sk_cli_usage_error(params[j].part == SK_PART_PIN
                             ? "--%s: policy %s takes no pin (streaming, sink_h2o and dense do)"
                             : "--%s: policy %s has no such part",
                         opt_name(params[j].opt), pol);
}

/* Index of the command word in argv (the first argument that is neither
 * an option nor the value of --socket), or argc. */
static int find_command(int argc, char **argv) {
  int i = 1;
  while (i < argc) {
    if (strcmp(argv[i], "-s") == 0 || strcmp(argv[i], "--socket") == 0)
      i += 2;
    else if (strcmp(argv[i], "--") == 0)
      return i + 1;
    else if (argv[i][0] == '-' && argv[i][1])
      i++;
    else
      return i;
  }
  return argc;
}

int main(int argc, char **argv) {
  sk_cli_init(prog, "sinkctl --help");
  struct opts o;
  memset(&o, 0, sizeof o);
  sk_generate_params_init(&o.gen);
  /* eval has options of its own: the ones before it are sinkctl's. */
  int cmd_at = find_command(argc, argv);
  if (cmd_at < argc && strcmp(argv[cmd_at], "eval") == 0) {
    parse_options(cmd_at, argv, &o);
    for (int id = OPT_MAX_TOKENS; id < OPT__END; id++)
      if (o.given[id] && id != OPT_SOCKET && id != OPT_JSON && id != OPT_VERBOSE)
        sk_cli_usage_error("--%s: not an option of 'eval'", opt_name(id));
    return sk_eval_main(argc - cmd_at, argv + cmd_at, o.socket, o.json);
  }
  parse_options(argc, argv, &o);

  int nargs = argc - optind;
  char **args = argv + optind;
  if (nargs == 0) sk_cli_usage_error("no command given");
  size_t ci;
  const char *name = NULL;
  for (ci = 0; ci < sizeof commands / sizeof commands[0]; ci++) {
    name = commands[ci].op >= 0 ? sk_op_name(commands[ci].op) : commands[ci].name;
    if (strcmp(name, args[0]) == 0) break;
  }
  if (ci == sizeof commands / sizeof commands[0])
    sk_cli_usage_error("unknown command '%s'", args[0]);
  nargs--;
  args++;

  /* Options that belong to another command are errors, not ignored. */
  for (int id = OPT_MAX_TOKENS; id < OPT__END; id++) {
    if (!o.given[id] || id == OPT_SOCKET || id == OPT_JSON || id == OPT_VERBOSE ||
        id == OPT_TIMEOUT)
      continue;
    bool ok = false;
    for (const int *a = commands[ci].options; *a; a++) ok |= *a == id;
    if (!ok) sk_cli_usage_error("--%s: not an option of '%s'", opt_name(id), name);
  }
  check_open_options(&o, name);
  if (commands[ci].cmd == CMD_SAVE && nargs == 1)
    sk_cli_usage_error("save: missing FILE after the session ID");
  if (nargs < commands[ci].min_args)
    sk_cli_usage_error("%s: missing %s", name, commands[ci].arg_name);
  if (commands[ci].max_args >= 0 && nargs > commands[ci].max_args)
    sk_cli_usage_error("%s: unexpected argument '%s'", name,
                       args[commands[ci].max_args]);

  /* Arguments are checked before connecting: a typo is a usage error
   * whether or not the daemon runs. */
  uint64_t id = 0;
  enum cmd cmd = commands[ci].cmd;
  if (cmd == CMD_CLOSE) {
    int ways = (nargs > 0) + o.close_idle + o.close_all;
    if (ways == 0) sk_cli_usage_error("close: missing session ID (or --idle DURATION, --all)");
    if (ways > 1) sk_cli_usage_error("close: give one of a session ID, --idle DURATION, --all");
  }
  if ((cmd == CMD_CLOSE && nargs) || (cmd == CMD_STATS && nargs) || cmd == CMD_RESUME ||
      cmd == CMD_FORK || cmd == CMD_SAVE)
    id = sk_cli_parse_u64(name, args[0], 0, UINT64_MAX);
  if (o.tokens && !(cmd == CMD_STATS && nargs))
    sk_cli_usage_error("--tokens: needs a session ID (stats ID --tokens)");
  if (commands[ci].cmd == CMD_DETOKENIZE)
    for (int i = 0; i < nargs; i++) sk_cli_parse_u64(name, args[i], 0, INT32_MAX);

  struct sk_client *c;
  struct sk_error e;
  if (sk_client_connect(o.socket, &c, &e) < 0)
    sk_cli_die(EXIT_CONNECT, "%s", e.message);
  if (o.timeout_ms && sk_client_set_timeout(c, o.timeout_ms, &e) < 0)
    sk_cli_die(EXIT_CONNECT, "%s", e.message);

  int status = 0;
  switch (commands[ci].cmd) {
  case CMD_GENERATE: status = cmd_generate(c, &o, nargs, args); break;
  case CMD_CHAT: status = cmd_chat(c, &o); break;
  case CMD_TOKENIZE: status = cmd_tokenize(c, &o, nargs, args); break;
  case CMD_DETOKENIZE: status = cmd_detokenize(c, &o, nargs, args); break;
  case CMD_OPEN: status = cmd_open(c, &o); break;
  case CMD_CLOSE:
    status = o.close_all || o.close_idle ? cmd_close_many(c, &o) : cmd_close(c, &o, id);
    break;
  case CMD_LIST: status = cmd_list(c, &o); break;
  case CMD_STATS: status = cmd_stats(c, &o, nargs > 0, id); break;
  case CMD_PING: status = cmd_ping(c, &o); break;
  case CMD_HELLO: status = cmd_hello(c, &o); break;
  case CMD_RESUME: status = cmd_resume(c, &o, id); break;
  case CMD_FORK: status = cmd_fork(c, &o, id); break;
  case CMD_SAVE: status = cmd_save(c, &o, id, args[1]); break;
  case CMD_LOAD: status = cmd_load(c, &o, args[0]); break;
  }
  sk_client_free(c);
  free(o.stops);
  free(o.pin_file_text);
  if (fflush(stdout) != 0 || ferror(stdout))
    sk_cli_die(EXIT_FAILURE, "cannot write to stdout: %s", strerror(errno));
  return status;
}
