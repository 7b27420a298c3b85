/* sinkctl eval: perplexity per policy through the daemon (see eval.h). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "eval.h"
#include "tokstream.h"
#include "sinkd/client.h"

enum {
  EVAL_EXIT_DAEMON = 1,
  EVAL_EXIT_FILE = 1, /* the text cannot be read, an output not written */
  EVAL_EXIT_USAGE = SK_CLI_EXIT_USAGE,
  EVAL_EXIT_CONNECT = 3,
  EVAL_EXIT_CONNECTION = 4,
  EVAL_EXIT_INTERRUPTED = 130,
};

/* Limits of the command line, each with its reason. */
#define EVAL_MAX_RUNS 32u          /* columns of one table */
#define EVAL_PIECE (256u << 10)    /* bytes of text per tokenize request:
                                      a quarter of the daemon's default
                                      frame limit (halved while it answers
                                      too_large) */
#define EVAL_DEFAULT_BUDGET 256u   /* half the test model's trained 512 */
#define EVAL_DEFAULT_SPAN 1000u    /* tokens per table row */
#define EVAL_DEFAULT_CHUNK 256u    /* tokens per append request */
#define EVAL_DEFAULT_SINKS 4u      /* StreamingLLM's choice */

enum run_kind {
  RUN_DENSE,
  RUN_STREAMING,
  RUN_WINDOW,
  RUN_H2O,
  RUN_SINK_H2O,
  RUN_RECOMPUTE,
};

static const char *const run_kind_names[] = {
    [RUN_DENSE] = "dense",         [RUN_STREAMING] = "streaming",
    [RUN_WINDOW] = "window",       [RUN_H2O] = "h2o",
    [RUN_SINK_H2O] = "sink_h2o",   [RUN_RECOMPUTE] = "recompute",
};

/* Whether a run of kind k takes the parameter key: a policy's run the
 * parts its policy has (sk_policy_parts, the table the daemon checks
 * against), recompute a window and a capacity; rope_scale goes with every
 * run, and a key that is none of these is left to the caller. */
static bool run_takes(enum run_kind k, const char *key) {
  static const struct {
    const char *key;
    unsigned part;
  } keys[] = {{"sinks", SK_PART_SINKS},
              {"window", SK_PART_WINDOW},
              {"heavy", SK_PART_HEAVY},
              {"recent", SK_PART_HEAVY},
              {"capacity", SK_PART_CAPACITY}};
  if (strcmp(key, "bos") == 0) return k == RUN_RECOMPUTE;
  const unsigned parts = k == RUN_RECOMPUTE
                             ? SK_PART_WINDOW | SK_PART_CAPACITY
                             : sk_policy_parts(run_kind_names[k], strlen(run_kind_names[k]));
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (strcmp(key, keys[i].key) == 0) return parts & keys[i].part;
  return true;
}

/* One column of the table: a policy with its parameters (0 = derived from
 * the budget or the model), and what it scored. */
struct run {
  char label[64];
  enum run_kind kind;
  uint32_t n_sink, window, heavy, recent, capacity;
  bool has_sink;
  bool no_bos;           /* recompute: the window without BOS (bos=0) */
  bool window_given;     /* window=W was in the spec */
  double rope_scale;     /* 0 = 1 */
  double sparsity;       /* MLP contextual sparsity level; 0 = off */
  size_t n_sparse_layers; /* layers of sparsity_measured (0: not measured) */
  double sparsity_measured[SK_CLIENT_MAX_LAYERS]; /* fraction of neurons
                            skipped per layer, over the run's tokens */
  double *span_sum;      /* (n_spans) sum of ln p(token | before) over the
                            scored tokens of each span */
  uint32_t *span_n;      /* (n_spans) tokens scored in each span */
  uint64_t evicted;
  uint64_t capacity_used; /* the session's capacity (dense: its limit) */
  double seconds;
};

struct eval {
  const char *socket;
  bool json, progress;
  const char *file;
  uint32_t budget, span, chunk, stride;
  uint64_t max_tokens; /* scored tokens; 0 = all */
  const char *csv, *plot;
  struct run runs[EVAL_MAX_RUNS];
  size_t n_runs;
  FILE *tokens;    /* the text's n_tokens token ids (int32, BOS first), in
                      an unnamed temporary file: memory stays bounded
                      whatever the text's size */
  int32_t bos;     /* the BOS a fresh session starts with, or -1 (the
                      model adds none) */
  size_t n_tokens;
  struct sk_hello hello;
  /* progress */
  double t_start;
  size_t run_index;
};

static volatile sig_atomic_t eval_interrupted;

static void eval_on_sigint(int sig) {
  eval_interrupted = 1;
  signal(sig, SIG_DFL); /* a second Ctrl-C ends at once */
}

static void eval_help(void) {
  printf(
      "Usage: sinkctl eval [OPTIONS] FILE\n"
      "Stream the text of FILE through fresh sinkd sessions, one per run, and\n"
      "print the perplexity of every span of tokens for each run.\n"
      "\n"
      "Every token is scored by the log-probability the model gave it from\n"
      "what the session's cache held (append with logprobs); once a cache is\n"
      "full the daemon evicts one token per new token, by the run's policy.\n"
      "\n"
      "Runs (--run, repeatable; default: all of the comparison below):\n"
      "  dense[:rope_scale=R]        no eviction; stops at its limit\n"
      "                              (the model's context x R)\n"
      "  window[:window=W]           no sinks (W = budget)\n"
      "  streaming[:sinks=S,window=W] S sinks (4) + W recent (budget - S)\n"
      "  h2o[:heavy=H,recent=R]      H2O, H = R = budget / 2 (one given:\n"
      "                              the other is the rest)\n"
      "  sink_h2o[:sinks=S,heavy=H,recent=R]  4 sinks + H2O (recent =\n"
      "                              budget / 2, heavy the rest)\n"
      "  recompute[:window=W,bos=B]  sliding window with re-computation: each\n"
      "                              scored token gets a fresh dense session\n"
      "                              of the W tokens before it (W = budget;\n"
      "                              at most the model's context - 1); with\n"
      "                              bos=1 (default) it starts as a new\n"
      "                              session does, BOS first when the model\n"
      "                              adds one, then the W - 1 tokens before\n"
      "                              it; bos=0: the W tokens, no BOS\n"
      "  Any run also takes rope_scale=R (<= 64) and sparsity=S (the\n"
      "  MLP's contextual sparsity, a level the daemon has calibrated;\n"
      "  the summary gives the fraction of neurons each layer skipped);\n"
      "  dense and recompute\n"
      "  capacity=N (recompute: above W). A parameter a run has not, or\n"
      "  given ones that leave nothing of the budget for a derived one, is\n"
      "  a usage error; a default run the budget cannot hold is left out.\n"
      "  Default set: dense, dense:rope_scale=2, dense:rope_scale=4, window,\n"
      "  streaming:sinks=1, streaming:sinks=2, streaming:sinks=4,\n"
      "  streaming:sinks=8, h2o, sink_h2o, recompute, recompute:bos=0.\n"
      "\n"
      "Options:\n"
      "  --run SPEC              add a run (see above)\n"
      "  --budget N              cache budget of the evicting runs (%u)\n"
      "  --tokens N              score at most the first N tokens (all)\n"
      "  --span N                tokens per table row (%u)\n"
      "  --chunk N               tokens per append request (%u); the daemon\n"
      "                          still evicts one token per token\n"
      "  --recompute-stride K    recompute: score every K-th token (1)\n"
      "  --csv FILE              write the table as CSV\n"
      "  --plot FILE.png         draw it with gnuplot (writes the CSV too:\n"
      "                          --csv, or FILE.csv beside the PNG)\n"
      "  --progress / --no-progress   progress bar on stderr (default: when\n"
      "                          stderr is a terminal)\n"
      "  -s, --socket PATH, -j, --json   as for every command\n",
      EVAL_DEFAULT_BUDGET, EVAL_DEFAULT_SPAN, EVAL_DEFAULT_CHUNK);
}

/* ---- parsing ---------------------------------------------------------- */

/* A number > 0 (rope_scale). */
static double eval_parse_positive(const char *what, const char *s) {
  double v = sk_cli_parse_double(what, s);
  if (!(v > 0)) sk_cli_usage_error("%s: '%s' is not a number > 0", what, s);
  return v;
}

static void eval_parse_run(const char *spec, struct run *r) {
  memset(r, 0, sizeof *r);
  if (strlen(spec) >= sizeof r->label)
    sk_cli_usage_error("--run: '%s' is too long", spec);
  snprintf(r->label, sizeof r->label, "%s", spec);
  char buf[64];
  snprintf(buf, sizeof buf, "%s", spec);
  char *colon = strchr(buf, ':');
  if (colon) *colon = 0;
  size_t k;
  for (k = 0; k < sizeof run_kind_names / sizeof run_kind_names[0]; k++)
    if (strcmp(buf, run_kind_names[k]) == 0) break;
  if (k == sizeof run_kind_names / sizeof run_kind_names[0])
    sk_cli_usage_error("--run: unknown run '%s' (dense, window, streaming, h2o, "
                     "sink_h2o or recompute)",
                     buf);
  r->kind = (enum run_kind)k;
  if (!colon) return;
  char *save = NULL;
  for (char *kv = strtok_r(colon + 1, ",", &save); kv;
       kv = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(kv, '=');
    if (!eq) sk_cli_usage_error("--run %s: '%s' is not key=value", spec, kv);
    *eq = 0;
    const char *key = kv, *val = eq + 1;
    if (!run_takes(r->kind, key))
      sk_cli_usage_error("--run %s: %s has no parameter '%s'", spec, run_kind_names[k], key);
    char what[sizeof r->label + 32];
    snprintf(what, sizeof what, "--run %s: %s", spec, key);
    if (strcmp(key, "sinks") == 0) {
      r->n_sink = (uint32_t)sk_cli_parse_u64(what, val, 0, UINT32_MAX);
      r->has_sink = true;
    } else if (strcmp(key, "window") == 0) {
      r->window = (uint32_t)sk_cli_parse_u64(what, val, 1, UINT32_MAX);
      r->window_given = true;
    } else if (strcmp(key, "heavy") == 0) {
      r->heavy = (uint32_t)sk_cli_parse_u64(what, val, 1, UINT32_MAX);
    } else if (strcmp(key, "recent") == 0) {
      r->recent = (uint32_t)sk_cli_parse_u64(what, val, 1, UINT32_MAX);
    } else if (strcmp(key, "capacity") == 0) {
      r->capacity = (uint32_t)sk_cli_parse_u64(what, val, 1, UINT32_MAX);
    } else if (strcmp(key, "bos") == 0) {
      r->no_bos = sk_cli_parse_u64(what, val, 0, 1) == 0;
    } else if (strcmp(key, "rope_scale") == 0) {
      r->rope_scale = eval_parse_positive(what, val);
      if (r->rope_scale > SK_MAX_ROPE_SCALE)
        sk_cli_usage_error("%s: '%s' is above %g", what, val, SK_MAX_ROPE_SCALE);
    } else if (strcmp(key, "sparsity") == 0) {
      r->sparsity = eval_parse_positive(what, val);
      if (!(r->sparsity < 1)) sk_cli_usage_error("%s: '%s' is not below 1", what, val);
    } else {
      sk_cli_usage_error("--run %s: unknown parameter '%s' (sinks, window, "
                         "heavy, recent, capacity, bos, rope_scale, sparsity)",
                       spec, key);
    }
  }
}

/* Fills in the parts run r leaves to the budget: each part not given
 * takes what the given ones leave (streaming: window = budget - sinks;
 * h2o: half each, or the rest of the one given; sink_h2o: recent half,
 * heavy the rest, or the rest of whichever is given; window and
 * recompute: window = budget), sinks default to EVAL_DEFAULT_SINKS.
 * Returns false, with the reason in why, if the given parts leave
 * nothing for one that is not, or if a recompute capacity does not exceed
 * its window. Dense capacities wait for the model (eval_derive). */
static bool eval_fit(const struct eval *ev, struct run *r, char *why, size_t n) {
  const uint64_t B = ev->budget;
  const uint64_t S = r->has_sink ? r->n_sink : EVAL_DEFAULT_SINKS;
  const char *none = NULL; /* the part left with nothing */
  uint64_t used = 0;       /* by the others */
  switch (r->kind) {
  case RUN_STREAMING:
  case RUN_SINK_H2O:
    r->n_sink = (uint32_t)S;
    r->has_sink = true;
    if (r->kind == RUN_STREAMING) {
      if (!r->window) {
        if (S >= B) none = "window", used = S;
        else r->window = (uint32_t)(B - S);
      }
    } else if (!r->heavy) {
      const uint64_t R = r->recent ? r->recent : B - B / 2;
      if (S + R >= B) none = "heavy", used = S + R;
      else r->heavy = (uint32_t)(B - S - R), r->recent = (uint32_t)R;
    } else if (!r->recent) {
      if (S + r->heavy >= B) none = "recent", used = S + r->heavy;
      else r->recent = (uint32_t)(B - S - r->heavy);
    }
    break;
  case RUN_H2O:
    if (!r->heavy && !r->recent) {
      r->heavy = (uint32_t)(B / 2); /* B >= 2: both get one at least */
      r->recent = (uint32_t)(B - B / 2);
    } else if (!r->heavy) {
      if (r->recent >= B) none = "heavy", used = r->recent;
      else r->heavy = (uint32_t)(B - r->recent);
    } else if (!r->recent) {
      if (r->heavy >= B) none = "recent", used = r->heavy;
      else r->recent = (uint32_t)(B - r->heavy);
    }
    break;
  case RUN_WINDOW:
  case RUN_RECOMPUTE:
    if (!r->window) r->window = (uint32_t)B;
    if (r->kind == RUN_RECOMPUTE && r->capacity && r->capacity <= r->window) {
      snprintf(why, n, "capacity %u must exceed its window %u (the window and the scored token)",
               r->capacity, r->window);
      return false;
    }
    break;
  case RUN_DENSE: break;
  }
  if (none)
    snprintf(why, n, "%" PRIu64 " of --budget %" PRIu64 " go to its other parts, which leaves "
             "none for its %s (take less, or a larger --budget)", used, B, none);
  return !none;
}

static void eval_add_run(struct eval *ev, const char *spec) {
  if (ev->n_runs == EVAL_MAX_RUNS)
    sk_cli_usage_error("--run: at most %u runs", EVAL_MAX_RUNS);
  eval_parse_run(spec, &ev->runs[ev->n_runs++]);
}

static void eval_parse_args(int argc, char **argv, struct eval *ev) {
  bool defaults_used = false;
  enum {
    O_RUN = 256, O_BUDGET, O_TOKENS, O_SPAN, O_CHUNK, O_STRIDE, O_CSV,
    O_PLOT, O_PROGRESS, O_NO_PROGRESS, O_HELP
  };
  static const struct option opts[] = {
      {"run", required_argument, NULL, O_RUN},
      {"budget", required_argument, NULL, O_BUDGET},
      {"tokens", required_argument, NULL, O_TOKENS},
      {"span", required_argument, NULL, O_SPAN},
      {"chunk", required_argument, NULL, O_CHUNK},
      {"recompute-stride", required_argument, NULL, O_STRIDE},
      {"csv", required_argument, NULL, O_CSV},
      {"plot", required_argument, NULL, O_PLOT},
      {"progress", no_argument, NULL, O_PROGRESS},
      {"no-progress", no_argument, NULL, O_NO_PROGRESS},
      {"socket", required_argument, NULL, 's'},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, O_HELP},
      {NULL, 0, NULL, 0},
  };
  int progress = -1;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":s:jh", opts, NULL)) != -1) {
    switch (c) {
    case O_RUN: eval_add_run(ev, optarg); break;
    case O_BUDGET:
      ev->budget = (uint32_t)sk_cli_parse_u64("--budget", optarg, 2, 1u << 20);
      break;
    case O_TOKENS:
      ev->max_tokens = sk_cli_parse_u64("--tokens", optarg, 1, UINT32_MAX);
      break;
    case O_SPAN:
      ev->span = (uint32_t)sk_cli_parse_u64("--span", optarg, 1, UINT32_MAX);
      break;
    case O_CHUNK:
      ev->chunk = (uint32_t)sk_cli_parse_u64("--chunk", optarg, 1, 65536);
      break;
    case O_STRIDE:
      ev->stride =
          (uint32_t)sk_cli_parse_u64("--recompute-stride", optarg, 1, 1u << 20);
      break;
    case O_CSV: ev->csv = optarg; break;
    case O_PLOT: ev->plot = optarg; break;
    case O_PROGRESS: progress = 1; break;
    case O_NO_PROGRESS: progress = 0; break;
    case 's': ev->socket = optarg; break;
    case 'j': ev->json = true; break;
    case 'h':
    case O_HELP: eval_help(); exit(0);
    case ':': sk_cli_usage_error("option '%s' needs a value", argv[optind - 1]);
    default: sk_cli_usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind >= argc) sk_cli_usage_error("missing FILE");
  if (optind + 1 < argc)
    sk_cli_usage_error("unexpected argument '%s'", argv[optind + 1]);
  ev->file = argv[optind];
  ev->progress = progress < 0 ? isatty(STDERR_FILENO) : progress == 1;
  /* gnuplot reads the paths inside single quotes. */
  const char *paths[] = {ev->plot, ev->csv};
  for (size_t i = 0; i < 2; i++)
    if (paths[i] && (strchr(paths[i], '\'') || strchr(paths[i], '\n')))
      sk_cli_usage_error("the path '%s' may not contain quotes or newlines",
                       paths[i]);
  if (ev->n_runs == 0) {
    static const char *const defaults[] = {
        "dense", "dense:rope_scale=2", "dense:rope_scale=4", "window",
        "streaming:sinks=1", "streaming:sinks=2", "streaming:sinks=4",
        "streaming:sinks=8", "h2o", "sink_h2o", "recompute", "recompute:bos=0"};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
      eval_add_run(ev, defaults[i]);
    defaults_used = true;
  }
  /* The parts each run leaves to the budget, before connecting. A run
   * whose given parts leave none for another is a usage error; a default
   * run a small --budget cannot hold is left out, with a note. */
  size_t kept = 0;
  for (size_t i = 0; i < ev->n_runs; i++) {
    char why[160];
    if (eval_fit(ev, &ev->runs[i], why, sizeof why)) {
      ev->runs[kept++] = ev->runs[i];
    } else if (defaults_used) {
      sk_cli_note("run %s left out: %s", ev->runs[i].label, why);
    } else {
      sk_cli_usage_error("--run %s: %s", ev->runs[i].label, why);
    }
  }
  ev->n_runs = kept;
  if (kept == 0) sk_cli_usage_error("--budget %u holds none of the runs", ev->budget);
}

/* ---- running ---------------------------------------------------------- */

static int eval_report(const struct sk_client *c, const struct sk_error *e,
                       const char *what) {
  if (eval_interrupted) return EVAL_EXIT_INTERRUPTED;
  sk_cli_note("%s: %s: %s", what, sk_error_name(e->code), e->message);
  return sk_client_connected(c) ? EVAL_EXIT_DAEMON : EVAL_EXIT_CONNECTION;
}

static void eval_progress(struct eval *ev, const struct run *r, size_t done,
                          size_t total, double t0) {
  if (!ev->progress) return;
  double el = sk_cli_now_s() - t0;
  double rate = el > 0 ? (double)done / el : 0;
  double eta = rate > 0 ? (double)(total - done) / rate : 0;
  int width = 30, fill = total ? (int)((double)width * (double)done / (double)total) : width;
  char bar[64];
  for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
  bar[width] = 0;
  fprintf(stderr, "\r[%s] run %zu/%zu %-22.22s %9zu/%zu tokens %7.0f tok/s ETA %4.0fs ",
          bar, ev->run_index + 1, ev->n_runs, r->label, done, total, rate, eta);
  fflush(stderr);
}

/* The open parameters of run r, whose parts eval_fit filled in; a dense
 * or recompute capacity left to the model is worked out here. */
static void eval_derive(const struct eval *ev, struct run *r,
                        struct sk_open_params *op) {
  memset(op, 0, sizeof *op);
  op->rope_scale = r->rope_scale;
  op->sparsity = r->sparsity;
  switch (r->kind) {
  case RUN_STREAMING: /* parts from eval_fit */
    op->policy = "streaming";
    op->n_sink = r->n_sink;
    op->has_n_sink = true;
    op->window = r->window;
    break;
  case RUN_WINDOW:
    op->policy = "window";
    op->window = r->window;
    break;
  case RUN_H2O:
    op->policy = "h2o";
    op->heavy = r->heavy;
    op->recent = r->recent;
    break;
  case RUN_SINK_H2O:
    op->policy = "sink_h2o";
    op->n_sink = r->n_sink;
    op->has_n_sink = true;
    op->heavy = r->heavy;
    op->recent = r->recent;
    break;
  case RUN_DENSE:
  case RUN_RECOMPUTE:
    if (!r->capacity) {
      /* dense: as far as the model's context (stretched by rope_scale)
       * and the daemon allow; recompute: the window and the token. */
      double ctx = (double)ev->hello.model.n_ctx_train *
                   (r->rope_scale > 0 ? r->rope_scale : 1.0);
      uint64_t cap = r->kind == RUN_RECOMPUTE ? (uint64_t)r->window + 1
                                              : (uint64_t)floor(ctx);
      /* a recompute window the budget sized, whose scored token would
       * not fit the model's context: one token less */
      if (r->kind == RUN_RECOMPUTE && !r->window_given && cap > floor(ctx) && ctx >= 2) {
        cap = (uint64_t)floor(ctx);
        r->window = (uint32_t)cap - 1;
        sk_cli_note("%s: window %u (the model's context %.0f holds it and the scored token)",
                    r->label, r->window, floor(ctx));
      }
      if (ev->hello.model.max_capacity && cap > ev->hello.model.max_capacity)
        cap = ev->hello.model.max_capacity;
      r->capacity = (uint32_t)cap;
    }
    op->policy = "dense";
    op->capacity = r->capacity;
    break;
  }
}

/* Token ids [first, first + n) of the text into buf. Returns 0, or -1
 * with a note. */
static int eval_tokens_read(const struct eval *ev, size_t first, size_t n, int32_t *buf) {
  if (fseeko(ev->tokens, (off_t)(first * sizeof *buf), SEEK_SET) != 0 ||
      fread(buf, sizeof *buf, n, ev->tokens) != n) {
    sk_cli_note("cannot read back the tokens: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* Adds the log-probability of token t (>= 1) to its span; NaN (not
 * scored) adds nothing. */
static void eval_score(const struct eval *ev, struct run *r, size_t t, double lp) {
  if (isnan(lp) || t == 0) return;
  size_t s = (t - 1) / ev->span;
  r->span_sum[s] += lp;
  r->span_n[s]++;
}

/* Streams the tokens through one session of the run's policy. */
static int eval_stream(struct eval *ev, struct sk_client *c, struct run *r,
                       const struct sk_open_params *op) {
  struct sk_error e;
  struct sk_open_result o;
  struct sk_open_params tmp = *op;
  tmp.temporary = true; /* closed by the daemon even if eval dies */
  if (sk_client_open(c, &tmp, &o, &e) < 0) return eval_report(c, &e, r->label);
  r->capacity_used = o.capacity;
  size_t n = ev->n_tokens, total = n;
  if (r->kind == RUN_DENSE && total > o.capacity) total = (size_t)o.capacity;
  double t0 = sk_cli_now_s();
  size_t pos = 0;
  uint64_t resident = 0;
  int status = 0;
  int32_t *ids = malloc(ev->chunk * sizeof *ids);
  double *lp = malloc(ev->chunk * sizeof *lp);
  if (!ids || !lp) {
    sk_cli_note("out of memory");
    status = EXIT_FAILURE;
    total = 0;
  }
  while (pos < total) {
    if (eval_interrupted) {
      status = EVAL_EXIT_INTERRUPTED;
      break;
    }
    size_t k = total - pos < ev->chunk ? total - pos : ev->chunk;
    if (r->kind == RUN_DENSE && k > o.capacity - resident)
      k = (size_t)(o.capacity - resident);
    if (k == 0) break;
    struct sk_append_result ar;
    if (eval_tokens_read(ev, pos, k, ids) < 0) {
      status = EVAL_EXIT_FILE;
      break;
    }
    if (sk_client_append_logprobs(c, o.session, ids, k, SK_BOS_DEFAULT, lp, &ar, &e) < 0) {
      status = eval_report(c, &e, r->label);
      break;
    }
    for (size_t j = 0; j < k; j++) eval_score(ev, r, pos + j, lp[j]);
    resident = ar.resident;
    r->evicted += ar.evicted;
    pos += k;
    eval_progress(ev, r, pos, total, t0);
  }
  r->seconds = sk_cli_now_s() - t0;
  free(ids);
  free(lp);
  if (r->sparsity != 0 && status == 0) { /* what the layers skipped */
    struct sk_session_stats st;
    if (sk_client_session_stats(c, o.session, &st, &e) == 0) {
      r->n_sparse_layers = st.n_sparse_layers;
      memcpy(r->sparsity_measured, st.sparsity_measured,
             st.n_sparse_layers * sizeof *st.sparsity_measured);
    }
  }
  if (sk_client_connected(c)) sk_client_close_session(c, o.session, NULL);
  return status;
}

/* Sliding window with re-computation: token t is scored by a fresh dense
 * session that starts as a new session does, with BOS when the model adds
 * one (ev->bos), then tokens[t - W + 1 .. t - 1]: W tokens in all, the
 * budget the evicting runs keep. A window that reaches the start of the
 * text is tokens[0 .. t - 1], which begins with BOS already. With bos=0
 * (r->no_bos) it holds tokens[max(0, t - W) .. t - 1], BOS only where the
 * window reaches the start. The tokens sit at positions from 0; the
 * session's last token is t, appended to be scored. */
static int eval_recompute(struct eval *ev, struct sk_client *c, struct run *r,
                          const struct sk_open_params *op) {
  struct sk_error e;
  size_t n = ev->n_tokens, W = r->window;
  const bool bos = !r->no_bos && ev->bos >= 0;
  size_t total = n > 1 ? (n - 2) / ev->stride + 1 : 0, done = 0;
  double *lp = malloc((W + 1) * sizeof *lp);
  int32_t *win = malloc((W + 1) * sizeof *win);
  if (!lp || !win) {
    free(lp);
    free(win);
    sk_cli_note("out of memory");
    return EXIT_FAILURE;
  }
  r->capacity_used = op->capacity;
  double t0 = sk_cli_now_s();
  int status = 0;
  for (size_t t = 1; t < n; t += ev->stride) {
    if (eval_interrupted) {
      status = EVAL_EXIT_INTERRUPTED;
      break;
    }
    /* the text tokens before t that the window holds */
    size_t keep = bos ? W - 1 : W;
    size_t start = t > keep ? t - keep : 0, m = 0;
    if (bos && start > 0) win[m++] = ev->bos;
    if (eval_tokens_read(ev, start, t - start + 1, win + m) < 0) {
      status = EVAL_EXIT_FILE;
      break;
    }
    m += t - start + 1;
    struct sk_open_result o;
    struct sk_open_params tmp = *op;
    tmp.temporary = true;
    if (sk_client_open(c, &tmp, &o, &e) < 0) {
      status = eval_report(c, &e, r->label);
      break;
    }
    int rc = sk_client_append_logprobs(c, o.session, win, m, SK_BOS_DEFAULT, lp, NULL, &e);
    if (rc < 0) status = eval_report(c, &e, r->label);
    if (sk_client_connected(c)) sk_client_close_session(c, o.session, NULL);
    if (rc < 0) break;
    eval_score(ev, r, t, lp[m - 1]);
    done++;
    if (done % 16 == 0 || done == total) eval_progress(ev, r, done, total, t0);
  }
  r->seconds = sk_cli_now_s() - t0;
  free(lp);
  free(win);
  return status;
}

/* ---- output ----------------------------------------------------------- */

/* Perplexity over the tokens of spans [s0, s1) of a run; NAN if none was
 * scored. */
static double eval_ppl(const struct run *r, size_t s0, size_t s1, size_t *ret_n) {
  double sum = 0;
  size_t cnt = 0;
  for (size_t s = s0; s < s1; s++) {
    sum += r->span_sum[s];
    cnt += r->span_n[s];
  }
  if (ret_n) *ret_n = cnt;
  return cnt ? exp(-sum / (double)cnt) : NAN;
}

static void eval_fmt(char *buf, size_t size, double v) {
  if (isnan(v))
    snprintf(buf, size, "-");
  else if (v >= 1e5)
    snprintf(buf, size, "%.3g", v);
  else if (v >= 100)
    snprintf(buf, size, "%.1f", v);
  else
    snprintf(buf, size, "%.3f", v);
}

static size_t eval_n_spans(const struct eval *ev) {
  size_t scored = ev->n_tokens > 1 ? ev->n_tokens - 1 : 0;
  return (scored + ev->span - 1) / ev->span;
}

static void eval_span(const struct eval *ev, size_t s, size_t *first,
                      size_t *last) {
  *first = 1 + s * ev->span;
  *last = (s + 1) * ev->span;
  if (*last > ev->n_tokens - 1) *last = ev->n_tokens - 1;
}

static void eval_print_table(const struct eval *ev) {
  size_t w[EVAL_MAX_RUNS];
  printf("%-15s", "tokens");
  for (size_t i = 0; i < ev->n_runs; i++) {
    w[i] = strlen(ev->runs[i].label);
    if (w[i] < 9) w[i] = 9;
    printf("  %*s", (int)w[i], ev->runs[i].label);
  }
  putchar('\n');
  char cell[32], rowname[40];
  size_t spans = eval_n_spans(ev);
  for (size_t s = 0; s <= spans; s++) {
    size_t first, last, s0 = 0, s1 = spans;
    if (s < spans) {
      eval_span(ev, s, &first, &last);
      snprintf(rowname, sizeof rowname, "%zu-%zu", first, last);
      s0 = s, s1 = s + 1;
    } else {
      snprintf(rowname, sizeof rowname, "all scored");
    }
    printf("%-15s", rowname);
    for (size_t i = 0; i < ev->n_runs; i++) {
      eval_fmt(cell, sizeof cell, eval_ppl(&ev->runs[i], s0, s1, NULL));
      printf("  %*s", (int)w[i], cell);
    }
    putchar('\n');
  }
  printf("\n%-24s %10s %10s %9s %10s %9s\n", "run", "capacity", "scored",
         "evicted", "ppl", "ms/token");
  for (size_t i = 0; i < ev->n_runs; i++) {
    const struct run *r = &ev->runs[i];
    size_t cnt;
    double p = eval_ppl(r, 0, eval_n_spans(ev), &cnt);
    eval_fmt(cell, sizeof cell, p);
    printf("%-24s %10" PRIu64 " %10zu %9" PRIu64 " %10s %9.3f\n", r->label,
           r->capacity_used, cnt, r->evicted, cell,
           cnt ? r->seconds * 1e3 / (double)cnt : 0.0);
  }
  for (size_t i = 0; i < ev->n_runs; i++) {
    const struct run *r = &ev->runs[i];
    if (!r->n_sparse_layers) continue;
    printf("%s: MLP neurons skipped per layer:", r->label);
    for (size_t l = 0; l < r->n_sparse_layers; l++) printf(" %.3f", r->sparsity_measured[l]);
    putchar('\n');
  }
}

static void eval_json_num(double v) {
  if (isnan(v))
    fputs("null", stdout);
  else
    printf("%.6g", v);
}

static void eval_print_json(const struct eval *ev) {
  printf("{\"file\": ");
  sk_cli_json_cstr(stdout, ev->file);
  printf(", \"tokens\": %zu, \"budget\": %u, \"span\": %u, \"runs\": [",
         ev->n_tokens, ev->budget, ev->span);
  for (size_t i = 0; i < ev->n_runs; i++) {
    const struct run *r = &ev->runs[i];
    size_t cnt;
    double p = eval_ppl(r, 0, eval_n_spans(ev), &cnt);
    printf("%s{\"label\": ", i ? ", " : "");
    sk_cli_json_cstr(stdout, r->label);
    printf(", \"capacity\": %" PRIu64 ", \"scored\": %zu, \"evicted\": %" PRIu64
           ", \"seconds\": %.3f, \"perplexity\": ",
           r->capacity_used, cnt, r->evicted, r->seconds);
    eval_json_num(p);
    printf(", \"sparsity\": %g, \"sparsity_measured\": [", r->sparsity);
    for (size_t l = 0; l < r->n_sparse_layers; l++)
      printf("%s%.6g", l ? ", " : "", r->sparsity_measured[l]);
    printf("]}");
  }
  printf("], \"spans\": [");
  for (size_t s = 0; s < eval_n_spans(ev); s++) {
    size_t first, last;
    eval_span(ev, s, &first, &last);
    printf("%s{\"first\": %zu, \"last\": %zu, \"perplexity\": [", s ? ", " : "",
           first, last);
    for (size_t i = 0; i < ev->n_runs; i++) {
      if (i) fputs(", ", stdout);
      eval_json_num(eval_ppl(&ev->runs[i], s, s + 1, NULL));
    }
    printf("]}");
  }
  printf("]}\n");
}

static int eval_write_csv(const struct eval *ev, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) {
    sk_cli_note("cannot write %s: %s", path, strerror(errno));
    return EXIT_FAILURE;
  }
  fputs("first,last", f);
  /* a run's parameters are separated by commas, which would split its
   * column: spaces in their place (gnuplot splits quoted fields too) */
  for (size_t i = 0; i < ev->n_runs; i++) {
    fputc(',', f);
    for (const char *l = ev->runs[i].label; *l; l++) fputc(*l == ',' ? ' ' : *l, f);
  }
  fputc('\n', f);
  for (size_t s = 0; s < eval_n_spans(ev); s++) {
    size_t first, last;
    eval_span(ev, s, &first, &last);
    fprintf(f, "%zu,%zu", first, last);
    for (size_t i = 0; i < ev->n_runs; i++) {
      double p = eval_ppl(&ev->runs[i], s, s + 1, NULL);
      if (isnan(p))
        fputc(',', f); /* empty: no token of the span was scored */
      else
        fprintf(f, ",%.6g", p);
    }
    fputc('\n', f);
  }
  if (fclose(f) != 0) {
    sk_cli_note("cannot write %s: %s", path, strerror(errno));
    return EXIT_FAILURE;
  }
  return 0;
}

static int eval_plot(const struct eval *ev, const char *csv) {
  FILE *g = popen("gnuplot", "w");
  if (!g) {
    sk_cli_note("cannot run gnuplot: %s", strerror(errno));
    return EXIT_FAILURE;
  }
  const char *base = strrchr(ev->file, '/');
  base = base ? base + 1 : ev->file;
  fprintf(g,
          "set terminal pngcairo size 1280,720 noenhanced font ',11'\n"
          "set output '%s'\n"
          "set datafile separator comma\n"
          "set key outside right top autotitle columnhead noenhanced\n"
          "set logscale y\n"
          "set grid\n"
          "set xlabel 'tokens'\n"
          "set ylabel 'perplexity per span of %u tokens (log scale)'\n"
          "set title 'sinkd eval: %s, %zu tokens, budget %u' noenhanced\n"
          /* 8 colours, then the same colours dashed */
          "plot for [i=3:%zu] '%s' using (($1+$2)/2):i with lines lw 2 "
          "lc 1+(i-3)%%8 dt 1+(i-3)/8\n",
          ev->plot, ev->span, base, ev->n_tokens - 1, ev->budget,
          ev->n_runs + 2, csv);
  int st = pclose(g);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 127)
      sk_cli_note("gnuplot is not installed (Debian: apt-get install gnuplot-nox)");
    else
      sk_cli_note("gnuplot failed drawing %s", ev->plot);
    return EXIT_FAILURE;
  }
  return 0;
}

/* ---- main ------------------------------------------------------------- */

/* A piece of the text for sk_tokstream: tokenized by the daemon (ctx, the
 * client), BOS first or none. */
static int eval_tokenize_piece(void *ctx, const char *text, size_t len, bool bos,
                               int32_t **ret_tokens, size_t *ret_n, struct sk_error *err) {
  return sk_client_tokenize(ctx, text, len, bos ? SK_BOS_TRUE : SK_BOS_FALSE, ret_tokens, ret_n,
                            err);
}

/* Tokenizes the text (BOS first: the tokens llama.cpp's perplexity tool
 * scores) into ev->tokens, a temporary file, piece by piece (tokstream.h):
 * as many tokens as --tokens asks for, else all. Returns 0 or an exit
 * status. */
static int eval_tokenize(struct eval *ev, struct sk_client *c, FILE *text) {
  struct sk_error e;
  ev->tokens = tmpfile();
  if (!ev->tokens) {
    sk_cli_note("cannot make a temporary file for the tokens: %s", strerror(errno));
    return EVAL_EXIT_FILE;
  }
  struct sk_tokstream *ts;
  if (sk_tokstream_open(text, EVAL_PIECE, true, eval_tokenize_piece, c, &ts, &e) < 0)
    return eval_report(c, &e, "tokenize");
  const size_t want = ev->max_tokens ? (size_t)ev->max_tokens + 1 : SIZE_MAX;
  int status = 0;
  double t0 = sk_cli_now_s(), shown = t0;
  while (ev->n_tokens < want) {
    int32_t *t = NULL;
    size_t n = 0;
    int rc = sk_tokstream_next(ts, &t, &n, &e);
    if (rc == 0) break;
    if (rc < 0) {
      status = eval_report(c, &e, "tokenize");
      break;
    }
    if (n > want - ev->n_tokens) n = want - ev->n_tokens;
    size_t w = fwrite(t, sizeof *t, n, ev->tokens);
    free(t);
    if (w != n) {
      sk_cli_note("cannot write the tokens to a temporary file: %s", strerror(errno));
      status = EVAL_EXIT_FILE;
      break;
    }
    ev->n_tokens += n;
    if (ev->progress && sk_cli_now_s() - shown > 0.5) {
      shown = sk_cli_now_s();
      fprintf(stderr, "\rtokenizing: %.1f MB, %zu tokens, %.0f s ",
              (double)sk_tokstream_bytes(ts) / 1e6, ev->n_tokens, shown - t0);
      fflush(stderr);
    }
    if (eval_interrupted) {
      status = EVAL_EXIT_INTERRUPTED;
      break;
    }
  }
  if (ev->progress && shown > t0) fputc('\n', stderr);
  sk_tokstream_free(ts);
  if (status == 0 && fflush(ev->tokens) != 0) {
    sk_cli_note("cannot write the tokens to a temporary file: %s", strerror(errno));
    status = EVAL_EXIT_FILE;
  }
  return status;
}

/* Exits with a usage error unless output file path (--csv, --plot, the
 * CSV beside a plot) looks writable: found before the evaluation runs, not
 * after it. Nothing is opened or made: an existing path must be no folder
 * and writable, a new one needs a writable folder. */
static void eval_check_output(const char *flag, const char *path) {
  if (!path) return;
  struct stat st;
  const char *why = NULL;
  if (stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) why = "it is a folder";
    else if (access(path, W_OK) != 0) why = strerror(errno);
  } else if (errno != ENOENT) {
    why = strerror(errno);
  } else {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    if (slash && n == 0) n = 1; /* "/x" */
    if (n >= sizeof dir) n = sizeof dir - 1;
    memcpy(dir, slash ? path : ".", n);
    dir[n] = 0;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) why = "its folder does not exist";
    else if (access(dir, W_OK | X_OK) != 0) why = strerror(errno);
  }
  if (why) {
    sk_cli_die(EVAL_EXIT_FILE, "%s: cannot write %s: %s", flag, path, why);
  }
}

/* The CSV written with a plot when --csv is not given: the plot's path
 * with .csv for its extension, in buf. */
static const char *eval_plot_csv(const char *plot, char *buf, size_t size) {
  size_t len = strlen(plot);
  const char *dot = strrchr(plot, '.');
  if (dot && !strchr(dot, '/')) len = (size_t)(dot - plot);
  if (len + 5 > size) {
    sk_cli_die(EVAL_EXIT_USAGE, "--plot path too long");
  }
  memcpy(buf, plot, len);
  memcpy(buf + len, ".csv", 5);
  return buf;
}

int sk_eval_main(int argc, char **argv, const char *global_socket,
                 bool global_json, unsigned int wait_ms) {
  sk_cli_init("sinkctl: eval", "sinkctl eval --help");
  struct eval *ev = calloc(1, sizeof *ev);
  if (!ev) return EXIT_FAILURE;
  ev->socket = global_socket;
  ev->json = global_json;
  ev->budget = EVAL_DEFAULT_BUDGET;
  ev->span = EVAL_DEFAULT_SPAN;
  ev->chunk = EVAL_DEFAULT_CHUNK;
  ev->stride = 1;
  eval_parse_args(argc, argv, ev);
  char csv_buf[4096];
  const char *csv = ev->csv;
  if (!csv && ev->plot) csv = eval_plot_csv(ev->plot, csv_buf, sizeof csv_buf);
  eval_check_output(ev->csv ? "--csv" : "--plot (its CSV)", csv);
  eval_check_output("--plot", ev->plot);

  FILE *text = fopen(ev->file, "rb");
  if (!text) sk_cli_die(EVAL_EXIT_FILE, "cannot open %s: %s", ev->file, strerror(errno));
  struct sk_client *c;
  struct sk_error e;
  if (sk_client_connect_wait(ev->socket, wait_ms, &c, &e) < 0) {
    fprintf(stderr, "sinkctl: %s\n", e.message);
    fclose(text);
    free(ev);
    return EVAL_EXIT_CONNECT;
  }
  int status = 0;
  if (sk_client_hello(c, &ev->hello, &e) < 0) {
    status = eval_report(c, &e, "hello");
    goto out;
  }
  /* The BOS a fresh session starts with: what tokenizing no text with
   * the vocabulary's own add_bos gives. */
  {
    int32_t *b = NULL;
    size_t nb = 0;
    if (sk_client_tokenize(c, "", 0, SK_BOS_DEFAULT, &b, &nb, &e) < 0) {
      status = eval_report(c, &e, "tokenize");
      goto out;
    }
    ev->bos = nb ? b[0] : -1;
    free(b);
  }
  struct sigaction sa, old_sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = eval_on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_sa);
  status = eval_tokenize(ev, c, text);
  if (status != 0) goto out_sig;
  if (ev->n_tokens < 2) {
    sk_cli_note("%s has no token to score", ev->file);
    status = EVAL_EXIT_FILE;
    goto out_sig;
  }

  ev->t_start = sk_cli_now_s();
  for (ev->run_index = 0; ev->run_index < ev->n_runs && status == 0;
       ev->run_index++) {
    struct run *r = &ev->runs[ev->run_index];
    r->span_sum = calloc(eval_n_spans(ev), sizeof *r->span_sum);
    r->span_n = calloc(eval_n_spans(ev), sizeof *r->span_n);
    if (!r->span_sum || !r->span_n) {
      sk_cli_note("out of memory");
      status = EXIT_FAILURE;
      break;
    }
    struct sk_open_params op;
    eval_derive(ev, r, &op);
    status = r->kind == RUN_RECOMPUTE ? eval_recompute(ev, c, r, &op)
                                      : eval_stream(ev, c, r, &op);
  }
out_sig:
  sigaction(SIGINT, &old_sa, NULL);
  if (ev->progress) fputc('\n', stderr);
  if (status != 0) goto out;

  if (ev->json)
    eval_print_json(ev);
  else
    eval_print_table(ev);
  if (csv && (status = eval_write_csv(ev, csv)) != 0) goto out;
  if (ev->plot && (status = eval_plot(ev, csv)) != 0) goto out;
  if (!ev->json && (csv || ev->plot))
    sk_cli_note("wrote%s%s%s%s", csv ? " " : "", csv ? csv : "", ev->plot ? " " : "",
                ev->plot ? ev->plot : "");
out:
  for (size_t i = 0; i < ev->n_runs; i++) {
    free(ev->runs[i].span_sum);
    free(ev->runs[i].span_n);
  }
  if (ev->tokens) fclose(ev->tokens);
  sk_client_free(c);
  fclose(text);
  free(ev);
  if (fflush(stdout) != 0) return EXIT_FAILURE;
  return status;
}
