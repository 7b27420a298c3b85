/* sinkctl: command-line client for sinkd, built on libsinkd.
 *
 *   sinkctl [--socket PATH] [--timeout DURATION] [--wait[=DURATION]] [--json]
 *           [--verbose] COMMAND [ARGS]
 *
 * Options may come before or after the command. Exit status: 0 success,
 * 1 the daemon answered with an error, 2 usage error, 3 cannot connect,
 * 4 connection lost or protocol error, 130 interrupted.
 *
 * This file: the options, the command table and main. The commands are
 * generate.c, chat.c and commands.c; output.c prints (sinkctl.h).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval.h"
#include "sinkctl.h"
#include "sk_config.h"

/* ---- messages --------------------------------------------------------- */

/* sk_cli's usage errors and sk_cli_die with --json: the error as JSON on
 * stdout (json_error), with the same exit status. */
static void json_cli_error(int status, const char *message) {
  json_error(status == EXIT_USAGE ? "usage" : status == EXIT_CONNECT ? "connect" : "failure",
             message, "", status);
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
      "      --wait[=DURATION] wait that long (default 60s) for a daemon that\n"
      "                        is starting: its socket, then its answer\n"
      "  -j, --json            print one JSON object instead of text (chat:\n"
      "                        one per turn)\n"
      "  -v, --verbose         generate: print a usage summary to stderr\n"
      "      --raw             the model's text as it is: on a terminal its control\n"
      "                        characters are otherwise shown as \\x1b, \\u009b\n"
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
      "      --speculation MODE  speculative decoding: off, draft (the daemon's\n"
      "                        draft model) or lookup (in the session's history);\n"
      "                        default: the session's, then the daemon's\n"
      "      --draft-tokens N  most tokens a step proposes, 1..15\n"
      "      --draft-fixed     always that many (default: adapts to how many\n"
      "                        are accepted)\n"
      "",
      SK_CLIENT_DEFAULT_SOCKET, SK_WIRE_MAX_TOKENS, SK_GENERATE_DEFAULT_MAX_TOKENS,
      SK_GENERATE_DEFAULT_TEMPERATURE, SK_GENERATE_DEFAULT_TOP_K, SK_GENERATE_DEFAULT_TOP_P);
  /* (two strings: C11 compilers need take no literal above 4095 bytes) */
  fputs(
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
      stdout);
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

/* ---- options ---------------------------------------------------------- */

/* --wait without a duration: a minute, longer than a large model takes
 * to load from a warm page cache. */
#define SINKCTL_DEFAULT_WAIT_S 60u

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
    {"raw", no_argument, NULL, OPT_RAW},
    {"wait", optional_argument, NULL, OPT_WAIT},
    {"speculation", required_argument, NULL, OPT_SPECULATION},
    {"draft-tokens", required_argument, NULL, OPT_DRAFT_TOKENS},
    {"draft-fixed", no_argument, NULL, OPT_DRAFT_FIXED},
    {NULL, 0, NULL, 0},
};

static const char *opt_name(int id) {
  for (const struct option *o = long_options; o->name; o++)
    if (o->val == id) return o->name;
  return "?";
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
                   OPT_PIN, OPT_PIN_FILE, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_SPECIAL,
                   OPT_SPECULATION, OPT_DRAFT_TOKENS, OPT_DRAFT_FIXED, 0}},
    {OP(CHAT), CMD_CHAT, 0, 0, NULL,
     (const int[]){OPT_MAX_TOKENS, OPT_TEMPERATURE, OPT_TOP_K, OPT_TOP_P,
                   OPT_SEED, OPT_STOP, OPT_IGNORE_EOS, OPT_SESSION,
                   OPT_POLICY, OPT_SINKS, OPT_WINDOW, OPT_CAPACITY,
                   OPT_HEAVY, OPT_RECENT, OPT_ROPE_SCALE, OPT_SPARSITY, OPT_PIN,
                   OPT_PIN_FILE, OPT_KEEP, OPT_PROGRESS, OPT_NO_PROGRESS, OPT_SYSTEM,
                   OPT_SPECULATION, OPT_DRAFT_TOKENS, OPT_DRAFT_FIXED, 0}},
    {OP(TOKENIZE), CMD_TOKENIZE, 1, -1, "TEXT ('-' reads stdin)",
     (const int[]){OPT_NO_BOS, OPT_SPECIAL, 0}},
    {OP(DETOKENIZE), CMD_DETOKENIZE, 1, -1, "token ID", (const int[]){0}},
    {OP(OPEN), CMD_OPEN, 0, 0, NULL,
     (const int[]){OPT_POLICY, OPT_SINKS, OPT_WINDOW, OPT_CAPACITY,
                   OPT_HEAVY, OPT_RECENT, OPT_ROPE_SCALE, OPT_SPARSITY, OPT_PIN,
                   OPT_PIN_FILE, OPT_SPECULATION, OPT_DRAFT_TOKENS, OPT_DRAFT_FIXED, 0}},
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

/* The options of generation (struct sk_generate_params and the stop
 * strings): true if c is one of them. */
static bool parse_gen_option(int c, struct opts *o) {
  switch (c) {
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
  /* speculation: the session's when it is opened here, the generate's */
  case OPT_SPECULATION:
    if (strcmp(optarg, "off") && strcmp(optarg, "draft") && strcmp(optarg, "lookup"))
      sk_cli_usage_error("--speculation: '%s' is not off, draft or lookup", optarg);
    o->gen.speculation = o->open.speculation = optarg;
    break;
  case OPT_DRAFT_TOKENS:
    o->gen.draft_tokens = o->open.draft_tokens =
        (uint32_t)sk_cli_parse_u64("--draft-tokens", optarg, 1, SK_SPEC_TOKENS_MAX);
    break;
  case OPT_DRAFT_FIXED: o->gen.draft_fixed = o->open.draft_fixed = true; break;
  default: return false;
  }
  return true;
}

/* --pin-file PATH: the pinned prefix read from PATH, at most 64 KiB, not
 * empty; a usage error otherwise. */
static void read_pin_file(const char *path, struct opts *o) {
  FILE *f = fopen(path, "rb");
  if (!f) sk_cli_usage_error("--pin-file: cannot open %s: %s", path, strerror(errno));
  size_t cap = 1 << 16, len = 0;
  char *t = malloc(cap + 1);
  if (!t) sk_cli_die(EXIT_FAILURE, "out of memory");
  len = fread(t, 1, cap + 1, f);
  bool bad = ferror(f) != 0;
  fclose(f);
  if (bad) sk_cli_usage_error("--pin-file: cannot read %s", path);
  if (len > cap) sk_cli_usage_error("--pin-file: %s is longer than %zu bytes", path, cap);
  if (len == 0) sk_cli_usage_error("--pin-file: %s is empty", path);
  t[len] = 0;
  o->pin_file_text = t;
  o->open.pin = t;
  o->open.pin_len = len;
}

/* The options that shape a new session (struct sk_open_params): true if
 * c is one of them. */
static bool parse_open_option(int c, struct opts *o) {
  switch (c) {
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
  case OPT_PIN_FILE:
    if (o->open.pin) sk_cli_usage_error("--pin/--pin-file: given twice");
    read_pin_file(optarg, o);
    break;
  case OPT_WINDOW:
    o->open.window = (uint32_t)sk_cli_parse_u64("--window", optarg, 1, UINT32_MAX);
    break;
  case OPT_CAPACITY:
    o->open.capacity =
        (uint32_t)sk_cli_parse_u64("--capacity", optarg, 1, UINT32_MAX);
    break;
  default: return false;
  }
  return true;
}

static void parse_options(int argc, char **argv, struct opts *o) {
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":s:jvhVn:t:", long_options, NULL)) !=
         -1) {
    if (c >= 0 && c < OPT__END) o->given[c] = true;
    if (parse_gen_option(c, o) || parse_open_option(c, o)) continue;
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
    case OPT_SESSION:
      o->session = sk_cli_parse_u64("--session", optarg, 0, UINT64_MAX);
      o->has_session = true;
      break;
    case OPT_NO_ECHO: o->no_echo = true; break;
    case OPT_SYSTEM:
      if (!optarg[0]) sk_cli_usage_error("--system: the text is empty");
      o->system = optarg;
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
    case OPT_RAW: break; /* o->given says it */
    case OPT_TIMEOUT: {
      uint64_t t = parse_duration("--timeout", optarg);
      if (t == 0 || t > UINT_MAX / 1000)
        sk_cli_usage_error("--timeout: '%s' is not in 1s..%us", optarg, UINT_MAX / 1000);
      o->timeout_ms = (unsigned int)(t * 1000);
      break;
    }
    case OPT_WAIT: {
      uint64_t t = optarg ? parse_duration("--wait", optarg) : SINKCTL_DEFAULT_WAIT_S;
      if (t == 0 || t > UINT_MAX / 1000)
        sk_cli_usage_error("--wait: '%s' is not in 1s..%us", optarg, UINT_MAX / 1000);
      o->wait_ms = (unsigned int)(t * 1000);
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
      if (o.given[id] && id != OPT_SOCKET && id != OPT_JSON && id != OPT_VERBOSE &&
          id != OPT_WAIT)
        sk_cli_usage_error("--%s: not an option of 'eval'", opt_name(id));
    return sk_eval_main(argc - cmd_at, argv + cmd_at, o.socket, o.json, o.wait_ms);
  }
  parse_options(argc, argv, &o);
  /* A model's output may hold escape sequences: on a terminal they are
   * shown, not obeyed (sinkctl(1), --raw). */
  g_escape = !o.given[OPT_RAW] && isatty(STDOUT_FILENO);

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
        id == OPT_TIMEOUT || id == OPT_WAIT || id == OPT_RAW)
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
  if (sk_client_connect_wait(o.socket, o.wait_ms, &c, &e) < 0)
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
