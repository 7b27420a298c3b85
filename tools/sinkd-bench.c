/* sinkd-bench: measures a live sinkd through libsinkd, as its clients see
 * it (socket, protocol and scheduling included). Not a test: it prints
 * numbers, and --json for machines.
 *
 *   prefill      tokens/s of one append of --prefill random tokens into a
 *                fresh session (median of --reps)
 *   decode       tokens/s of one session generating --gen tokens (greedy,
 *                EOS ignored): (tokens - 1) / (last event - first event),
 *                median of --reps
 *   concurrency  for each C in --concurrency: C sessions, each on its own
 *                connection and thread, append a 16-token prompt, wait for
 *                each other, then all generate --gen tokens at once.
 *                aggregate = (all tokens - C) / (last event - first event);
 *                p50/p99 of every gap between two events of one session
 *                (inter-token latency as a client sees it)
 *   positions    for each P of --positions a streaming session
 *                (--sinks, --window) fed random tokens until its stream
 *                has seen P tokens, then POS_WARMUP tokens generated
 *                untimed (the first steps after a long append pay for
 *                cold caches); then POS_ROUNDS rounds generate --pos-gen
 *                / POS_ROUNDS tokens in each session in turn (a slow
 *                spell of a shared machine hits every position alike).
 *                Per-token ms at P is the median over segments of
 *                POS_SEGMENT tokens (stalls land in a few segments), and
 *                its ratio to the first P; also the
 *                daemon's CPU time per token (all its threads,
 *                /proc/PID/task/TID/schedstat), which a busy machine
 *                disturbs far less than wall time
 *   mixed        (--mixed N) one streaming session generating beside a
 *                session of the daemon's defaults that appends N random
 *                tokens: the decoding session's inter-token gaps
 *                (between two events of one generate) alone, before and
 *                after, and while the append runs; p50, p99 and the
 *                ratio of the p99s, and the append's tokens/s (the
 *                daemon's chunked prefill keeps the gap bounded)
 *   memory       the daemon's RSS (/proc/PID/status, PID from the socket's
 *                SO_PEERCRED) idle and with C sessions open, and the KV
 *                bytes of one session as `open` reports them
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "benchspec.h"
#include "cli.h"
#include "sinkd/client.h"
#include "tool.h"

#define MAX_LIST 16u        /* entries of --concurrency / --positions */
#define PROMPT_TOKENS 16u   /* prompt of each concurrent session */
#define APPEND_CHUNK 8192u  /* tokens per append while advancing a stream */
#define POS_WARMUP 32u      /* untimed tokens before each position's timing */
#define POS_SEGMENT 64u     /* tokens per segment of a position's median */
#define POS_ROUNDS 4u       /* rounds over the positions, --pos-gen split */
#define FIRST_NORMAL_ID 259 /* after <unk> <s> </s> and the 256 byte tokens */
#define MIXED_GEN 64u       /* tokens per generate of the mixed part's decoding session */
#define MIXED_ALONE 4u      /* its generates alone before the append, and after it */


struct opts {
  const char *socket;
  bool json;
  uint32_t prefill, gen, reps, pos_gen, window, sinks, mixed;
  uint32_t conc[MAX_LIST], n_conc;
  uint64_t pos[MAX_LIST];
  uint32_t n_pos;
  bool no_prefill, no_decode, no_conc, no_pos;
  struct sk_benchspec_opts spec; /* spec.text NULL: no speculation part */
  bool window_set; /* --window given: never shortened to the model */
};



/* q-quantile (0..1) of v[0..n), sorting v. */
static double quantile(double *v, size_t n, double q) {
  if (n == 0) return 0.0;
  qsort(v, n, sizeof *v, sk_tool_cmp_double);
  size_t i = (size_t)ceil(q * (double)n);
  return v[i == 0 ? 0 : i - 1];
}

static struct sk_client *connect_or_die(const char *path) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(path, &c, &e) < 0) { /* exit 3, as sinkctl's "cannot connect" */
    sk_cli_note("%s", e.message);
    exit(3);
  }
  sk_client_set_timeout(c, 3600u * 1000u, NULL);
  return c;
}

/* Random "normal" token ids (after the control and byte tokens). */
static void random_tokens(int32_t *out, size_t n, uint32_t n_vocab, uint64_t *state) {
  uint32_t span = n_vocab > FIRST_NORMAL_ID ? n_vocab - FIRST_NORMAL_ID : n_vocab;
  uint32_t base = n_vocab > FIRST_NORMAL_ID ? FIRST_NORMAL_ID : 0;
  for (size_t i = 0; i < n; i++) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    out[i] = (int32_t)(base + (uint32_t)((*state >> 33) % span));
  }
}

/* ---- daemon memory ---- */

static pid_t daemon_pid(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  struct ucred cred = {0};
  socklen_t len = sizeof cred;
  pid_t pid = 0;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
    pid = cred.pid;
  close(fd);
  return pid;
}

/* VmRSS of pid in bytes, or 0 if unreadable (another user's daemon). */
static uint64_t rss_bytes(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  uint64_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %" SCNu64 " kB", &kb) == 1) break;
  fclose(f);
  return kb * 1024;
}

/* CPU time of every thread of pid in ns (/proc/PID/task/TID/schedstat,
 * first field), or 0 if unreadable. Unlike wall time it does not count
 * the time other processes of a busy machine take. */
static uint64_t cpu_ns(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d) return 0;
  uint64_t sum = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char f[384]; /* path (64) + a name (256) + "/schedstat" */
    snprintf(f, sizeof f, "%s/%s/schedstat", path, de->d_name);
    FILE *fp = fopen(f, "r");
    if (!fp) continue;
    unsigned long long ns = 0;
    if (fscanf(fp, "%llu", &ns) == 1) sum += ns;
    fclose(fp);
  }
  closedir(d);
  return sum;
}

/* ---- one generate, timed ---- */

struct timing {
  double *t;     /* (cap) event times */
  size_t n, cap;
};

static int on_token(void *user, const struct sk_token_event *ev) {
  (void)ev;
  struct timing *tm = user;
  if (tm->n < tm->cap) tm->t[tm->n++] = sk_cli_now_s();
  return 0;
}

static uint64_t open_session(struct sk_client *c, const struct opts *o, bool streaming,
                             uint64_t *ret_object_bytes) {
  struct sk_open_params p = {0};
  if (streaming) {
    p.policy = "streaming";
    p.n_sink = o->sinks;
    p.window = o->window;
  }
  struct sk_open_result r;
  struct sk_error e = {0};
  if (sk_client_open(c, &p, &r, &e) < 0) sk_cli_die(1, "open: %s", e.message);
  if (ret_object_bytes) *ret_object_bytes = r.object_bytes;
  return r.session;
}

static void close_session(struct sk_client *c, uint64_t id) {
  struct sk_error e = {0};
  if (sk_client_close_session(c, id, &e) < 0) sk_cli_die(1, "close: %s", e.message);
}

static void append_or_die(struct sk_client *c, uint64_t id, const int32_t *t, size_t n) {
  struct sk_error e = {0};
  if (sk_client_append_tokens(c, id, t, n, SK_BOS_FALSE, NULL, &e) < 0)
    sk_cli_die(1, "append: %s", e.message);
}

static void generate_or_die(struct sk_client *c, uint64_t id, uint32_t n, struct timing *tm) {
  struct sk_generate_params p;
  sk_generate_params_init(&p);
  p.max_tokens = n;
  p.temperature = 0.0;
  p.ignore_eos = true;
  struct sk_generate_result r;
  struct sk_error e = {0};
  if (sk_client_generate(c, id, &p, on_token, tm, &r, &e) < 0) sk_cli_die(1, "generate: %s", e.message);
  if (r.n_tokens != n) sk_cli_die(1, "generate: %" PRIu64 " tokens, stop %s", r.n_tokens, r.stop);
}

/* ---- concurrency ---- */

struct worker {
  const struct opts *o;
  uint32_t n_vocab;
  uint32_t index;
  pthread_barrier_t *ready;
  struct sk_client *c;
  uint64_t session;
  struct timing tm;
};

static void *worker_main(void *arg) {
  struct worker *w = arg;
  int32_t prompt[PROMPT_TOKENS];
  uint64_t st = 1000 + w->index;
  random_tokens(prompt, PROMPT_TOKENS, w->n_vocab, &st);
  append_or_die(w->c, w->session, prompt, PROMPT_TOKENS);
  pthread_barrier_wait(w->ready);
  generate_or_die(w->c, w->session, w->o->gen, &w->tm);
  return NULL;
}

struct conc_result {
  uint32_t c;
  double aggregate, p50_ms, p99_ms;
  uint64_t rss;
};

static struct conc_result run_concurrency(const struct opts *o, uint32_t n_vocab, uint32_t n,
                                          pid_t pid) {
  struct worker *ws = calloc(n, sizeof *ws);
  pthread_t *th = calloc(n, sizeof *th);
  pthread_barrier_t ready;
  if (!ws || !th) sk_cli_die(1, "out of memory");
  pthread_barrier_init(&ready, NULL, n);
  for (uint32_t i = 0; i < n; i++) {
    ws[i] = (struct worker){.o = o, .n_vocab = n_vocab, .index = i, .ready = &ready};
    ws[i].c = connect_or_die(o->socket);
    ws[i].session = open_session(ws[i].c, o, false, NULL);
    ws[i].tm.cap = o->gen;
    ws[i].tm.t = calloc(o->gen, sizeof(double));
    if (!ws[i].tm.t) sk_cli_die(1, "out of memory");
  }
  for (uint32_t i = 0; i < n; i++)
    if (pthread_create(&th[i], NULL, worker_main, &ws[i]) != 0) sk_cli_die(1, "cannot start a thread");
  for (uint32_t i = 0; i < n; i++) pthread_join(th[i], NULL);
  struct conc_result r = {.c = n, .rss = pid ? rss_bytes(pid) : 0};
  double first = INFINITY, last = 0.0;
  size_t n_gaps = 0, tokens = 0;
  double *gaps = malloc((size_t)n * o->gen * sizeof *gaps);
  if (!gaps) sk_cli_die(1, "out of memory");
  for (uint32_t i = 0; i < n; i++) {
    const struct timing *tm = &ws[i].tm;
    if (tm->n == 0) continue;
    first = fmin(first, tm->t[0]);
    last = fmax(last, tm->t[tm->n - 1]);
    tokens += tm->n - 1;
    for (size_t k = 1; k < tm->n; k++) gaps[n_gaps++] = (tm->t[k] - tm->t[k - 1]) * 1e3;
  }
  r.aggregate = last > first ? (double)tokens / (last - first) : 0.0;
  r.p50_ms = quantile(gaps, n_gaps, 0.50);
  r.p99_ms = quantile(gaps, n_gaps, 0.99);
  for (uint32_t i = 0; i < n; i++) {
    close_session(ws[i].c, ws[i].session);
    sk_client_free(ws[i].c);
    free(ws[i].tm.t);
  }
  pthread_barrier_destroy(&ready);
  free(gaps);
  free(ws);
  free(th);
  return r;
}

/* ---- options ---- */

static void usage(FILE *f) {
  fprintf(f,
          "Usage: %s [OPTIONS]\n"
          "Benchmark a running sinkd: prefill, decode, concurrent decode with\n"
          "inter-token latency, per-token time far into a stream, memory.\n"
          "\n"
          "  -s, --socket PATH        daemon socket (default: as sinkctl)\n"
          "  -j, --json               one JSON object on stdout\n"
          "      --prefill N          tokens of the prefill test (512)\n"
          "      --gen N              tokens generated per session (128)\n"
          "      --reps N             repetitions of prefill and decode (3)\n"
          "      --concurrency LIST   concurrent sessions (1,4,16,64)\n"
          "      --positions LIST     stream positions (1e3,1e4,1e5,1e6)\n"
          "      --pos-gen N          tokens timed at each position (1024)\n"
          "      --window N           streaming window of the prefill and position tests\n"
          "                           (1024, or what the model's context leaves)\n"
          "      --sinks N            attention sinks of the position test (4)\n"
          "      --mixed N            decode beside an N-token prefill (0: skip; default)\n"
          "      --no-prefill, --no-decode, --no-concurrency, --no-positions\n"
          "                           skip a part\n"
          "      --spec-text FILE     the speculation part: greedy continuations of prompts\n"
          "                           cut from FILE under each mode of --spec-modes\n"
          "      --spec-modes LIST    off,draft,lookup (modes take turns at going first)\n"
          "      --spec-prompts N     prompts spread evenly through the text (8)\n"
          "      --spec-prompt-bytes N  bytes of each (whole lines; 1500)\n"
          "      --spec-gen N         tokens generated per prompt (256)\n"
          "      --spec-rounds N      rounds, every mode on every prompt (3)\n"
          "      --spec-sessions LIST sessions generating together (1)\n"
          "  -h, --help               this text\n"
          "\n"
          "Exit status: 0 done, 1 the daemon answered with an error, 2 usage error,\n"
          "3 cannot connect.\n",
          sk_cli_prog());
}

/* --spec-modes: up to SK_BENCHSPEC_MAX_MODES of off, draft, lookup. */
static void parse_modes(char *list, struct sk_benchspec_opts *s) {
  s->n_modes = 0;
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    if (strcmp(tok, "off") && strcmp(tok, "draft") && strcmp(tok, "lookup"))
      sk_cli_usage_error("--spec-modes: '%s' is not off, draft or lookup", tok);
    if (s->n_modes == SK_BENCHSPEC_MAX_MODES)
      sk_cli_usage_error("--spec-modes: at most %u modes", SK_BENCHSPEC_MAX_MODES);
    s->modes[s->n_modes++] = tok;
  }
  if (!s->n_modes) sk_cli_usage_error("--spec-modes: no mode");
}

static void parse_opts(int argc, char **argv, struct opts *o) {
  *o = (struct opts){.prefill = 512, .gen = 128, .reps = 3, .pos_gen = 1024, .window = 1024,
                     .sinks = 4, .conc = {1, 4, 16, 64}, .n_conc = 4,
                     .pos = {1000, 10000, 100000, 1000000}, .n_pos = 4};
  o->spec = (struct sk_benchspec_opts){.modes = {"off", "draft", "lookup"}, .n_modes = 3,
                                       .prompts = 8, .prompt_bytes = 1500, .gen = 256,
                                       .rounds = 3, .sessions = {1}, .n_sessions = 1};
  enum { O_PREFILL = 256, O_GEN, O_REPS, O_CONC, O_POS, O_POS_GEN, O_WINDOW, O_SINKS,
         O_NO_PREFILL, O_NO_DECODE, O_NO_CONC, O_NO_POS, O_MIXED, O_SPEC_TEXT, O_SPEC_MODES,
         O_SPEC_PROMPTS, O_SPEC_BYTES, O_SPEC_GEN, O_SPEC_ROUNDS, O_SPEC_SESSIONS };
  static const struct option lo[] = {
      {"socket", required_argument, NULL, 's'},  {"json", no_argument, NULL, 'j'},
      {"prefill", required_argument, NULL, O_PREFILL}, {"gen", required_argument, NULL, O_GEN},
      {"reps", required_argument, NULL, O_REPS}, {"concurrency", required_argument, NULL, O_CONC},
      {"positions", required_argument, NULL, O_POS},
      {"pos-gen", required_argument, NULL, O_POS_GEN},
      {"window", required_argument, NULL, O_WINDOW}, {"sinks", required_argument, NULL, O_SINKS},
      {"mixed", required_argument, NULL, O_MIXED},
      {"no-prefill", no_argument, NULL, O_NO_PREFILL}, {"no-decode", no_argument, NULL, O_NO_DECODE},
      {"no-concurrency", no_argument, NULL, O_NO_CONC},
      {"no-positions", no_argument, NULL, O_NO_POS}, {"help", no_argument, NULL, 'h'},
      {"spec-text", required_argument, NULL, O_SPEC_TEXT},
      {"spec-modes", required_argument, NULL, O_SPEC_MODES},
      {"spec-prompts", required_argument, NULL, O_SPEC_PROMPTS},
      {"spec-prompt-bytes", required_argument, NULL, O_SPEC_BYTES},
      {"spec-gen", required_argument, NULL, O_SPEC_GEN},
      {"spec-rounds", required_argument, NULL, O_SPEC_ROUNDS},
      {"spec-sessions", required_argument, NULL, O_SPEC_SESSIONS},
      {NULL, 0, NULL, 0},
  };
  int ch;
  uint64_t tmp[MAX_LIST];
  while ((ch = getopt_long(argc, argv, "s:jh", lo, NULL)) != -1) {
    switch (ch) {
    case 's': o->socket = optarg; break;
    case 'j': o->json = true; break;
    case O_PREFILL: o->prefill = (uint32_t)sk_cli_parse_u64("--prefill", optarg, 1, 1u << 20); break;
    case O_GEN: o->gen = (uint32_t)sk_cli_parse_u64("--gen", optarg, 2, 1u << 20); break;
    case O_REPS: o->reps = (uint32_t)sk_cli_parse_u64("--reps", optarg, 1, 100); break;
    case O_POS_GEN: o->pos_gen = (uint32_t)sk_cli_parse_u64("--pos-gen", optarg, 2, 1u << 20); break;
    case O_WINDOW:
      o->window = (uint32_t)sk_cli_parse_u64("--window", optarg, 1, 1u << 20);
      o->window_set = true;
      break;
    case O_SINKS: o->sinks = (uint32_t)sk_cli_parse_u64("--sinks", optarg, 0, 1u << 20); break;
    case O_MIXED: o->mixed = (uint32_t)sk_cli_parse_u64("--mixed", optarg, 0, 1u << 20); break;
    case O_CONC:
      o->n_conc = sk_cli_parse_list("--concurrency", optarg, tmp, MAX_LIST, 1, 4096);
      for (uint32_t i = 0; i < o->n_conc; i++) o->conc[i] = (uint32_t)tmp[i];
      break;
    case O_POS: o->n_pos = sk_cli_parse_list("--positions", optarg, o->pos, MAX_LIST, 1, 1ull << 40); break;
    case O_NO_PREFILL: o->no_prefill = true; break;
    case O_NO_DECODE: o->no_decode = true; break;
    case O_NO_CONC: o->no_conc = true; break;
    case O_NO_POS: o->no_pos = true; break;
    case O_SPEC_TEXT: o->spec.text = optarg; break;
    case O_SPEC_MODES: parse_modes(optarg, &o->spec); break;
    case O_SPEC_PROMPTS:
      o->spec.prompts = (uint32_t)sk_cli_parse_u64("--spec-prompts", optarg, 1, 256);
      break;
    case O_SPEC_BYTES:
      o->spec.prompt_bytes = (uint32_t)sk_cli_parse_u64("--spec-prompt-bytes", optarg, 1, 1u << 20);
      break;
    case O_SPEC_GEN:
      o->spec.gen = (uint32_t)sk_cli_parse_u64("--spec-gen", optarg, 2, 1u << 20);
      break;
    case O_SPEC_ROUNDS:
      o->spec.rounds = (uint32_t)sk_cli_parse_u64("--spec-rounds", optarg, 1, 100);
      break;
    case O_SPEC_SESSIONS:
      o->spec.n_sessions = sk_cli_parse_list("--spec-sessions", optarg, tmp,
                                             SK_BENCHSPEC_MAX_SESSIONS, 1, 256);
      for (uint32_t i = 0; i < o->spec.n_sessions; i++) o->spec.sessions[i] = (uint32_t)tmp[i];
      break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); exit(2);
    }
  }
  if (optind < argc) {
    usage(stderr);
    exit(2);
  }
  if (!o->socket) o->socket = sk_client_default_socket();
  o->spec.socket = o->socket;
  for (uint32_t i = 1; i < o->n_pos; i++)
    if (o->pos[i] <= o->pos[i - 1]) sk_cli_usage_error("--positions must increase");
}

/* ---- the parts ---- */

/* What the parts measured. */
struct results {
  uint64_t rss_idle;          /* the daemon's RSS before the runs */
  double prefill_tps;         /* median over --reps */
  double decode_tps;          /* one session, median over --reps */
  struct conc_result conc[MAX_LIST];
  uint32_t n_conc;
  double pos_ms[MAX_LIST];    /* median ms per token at each position */
  double pos_cpu_ms[MAX_LIST]; /* the daemon's CPU ms per token there */
  uint32_t n_pos;
  struct mixed_result {
    double alone_p50_ms, alone_p99_ms;   /* gaps of the decoding session alone */
    double beside_p50_ms, beside_p99_ms; /* while the append runs */
    size_t n_beside;                     /* gaps measured beside it */
    double prefill_tps;                  /* the append's tokens/s */
  } mixed;
  uint64_t kv_bytes_stream;   /* a streaming session's KV bytes */
  uint64_t kv_bytes_default;  /* a session of the daemon's defaults */
  struct sk_benchspec_result spec;
  struct sk_spec_info spec_totals; /* the daemon's, at the end */
};

/* Prefill: a --prefill-token append into a new session, --reps times;
 * the median tokens/s. st: the random tokens' state. */
static double bench_prefill(struct sk_client *c, const struct opts *o, uint32_t V, uint64_t *st) {
  int32_t *toks = malloc(o->prefill * sizeof *toks);
  double *v = malloc(o->reps * sizeof *v);
  if (!toks || !v) sk_cli_die(1, "out of memory");
  for (uint32_t r = 0; r < o->reps; r++) {
    random_tokens(toks, o->prefill, V, st);
    uint64_t id = open_session(c, o, true, NULL);
    double t0 = sk_cli_now_s();
    append_or_die(c, id, toks, o->prefill);
    v[r] = (double)o->prefill / (sk_cli_now_s() - t0);
    close_session(c, id);
  }
  double tps = quantile(v, o->reps, 0.5);
  sk_cli_note("prefill: %.1f tokens/s", tps);
  free(toks);
  free(v);
  return tps;
}

/* One session's decode: --gen tokens after a PROMPT_TOKENS prompt,
 * --reps times; the median tokens/s between the first and last event. */
static double bench_decode(struct sk_client *c, const struct opts *o, uint32_t V, uint64_t *st) {
  double *v = malloc(o->reps * sizeof *v);
  struct timing tm = {.t = calloc(o->gen, sizeof(double)), .cap = o->gen};
  if (!v || !tm.t) sk_cli_die(1, "out of memory");
  for (uint32_t r = 0; r < o->reps; r++) {
    int32_t prompt[PROMPT_TOKENS];
    random_tokens(prompt, PROMPT_TOKENS, V, st);
    uint64_t id = open_session(c, o, false, NULL);
    append_or_die(c, id, prompt, PROMPT_TOKENS);
    tm.n = 0;
    generate_or_die(c, id, o->gen, &tm);
    v[r] = (double)(tm.n - 1) / (tm.t[tm.n - 1] - tm.t[0]);
    close_session(c, id);
  }
  double tps = quantile(v, o->reps, 0.5);
  sk_cli_note("decode, one session: %.1f tokens/s", tps);
  free(v);
  free(tm.t);
  return tps;
}

/* Per-token time far into a stream: one session per position, each
 * advanced to its position first; then POS_ROUNDS rounds time every
 * position in turn, so that a slow spell of a shared machine hits all
 * positions alike rather than one. Fills r's positions. */
static void bench_positions(struct sk_client *c, const struct opts *o, uint32_t V, uint64_t *st,
                            pid_t pid, struct results *r) {
  const uint32_t n_pos = r->n_pos;
  uint64_t ids[MAX_LIST];
  int32_t *chunk = malloc(APPEND_CHUNK * sizeof *chunk);
  const uint32_t per_round = (o->pos_gen + POS_ROUNDS - 1) / POS_ROUNDS;
  struct timing tm = {.t = calloc(per_round, sizeof(double)), .cap = per_round};
  const size_t seg_cap = (size_t)POS_ROUNDS * (per_round / POS_SEGMENT + 1);
  double *seg = calloc((size_t)n_pos * seg_cap, sizeof *seg);
  size_t n_seg[MAX_LIST] = {0};
  uint64_t cpu[MAX_LIST] = {0};
  if (!chunk || !tm.t || !seg) sk_cli_die(1, "out of memory");
  double t_adv = sk_cli_now_s();
  for (uint32_t i = 0; i < n_pos; i++) {
    ids[i] = open_session(c, o, true, &r->kv_bytes_stream);
    uint64_t seen = 0;
    while (seen < o->pos[i]) {
      uint64_t n = o->pos[i] - seen < APPEND_CHUNK ? o->pos[i] - seen : APPEND_CHUNK;
      random_tokens(chunk, (size_t)n, V, st);
      append_or_die(c, ids[i], chunk, (size_t)n);
      seen += n;
      if (seen % (16 * APPEND_CHUNK) < n)
        sk_cli_note("positions: stream %u at %" PRIu64 " tokens (%.0f tokens/s)", i, seen,
             (double)seen / (sk_cli_now_s() - t_adv));
    }
    tm.n = 0;
    generate_or_die(c, ids[i], POS_WARMUP < tm.cap ? POS_WARMUP : (uint32_t)tm.cap, &tm);
  }
  for (uint32_t round = 0; round < POS_ROUNDS; round++) {
    for (uint32_t i = 0; i < n_pos; i++) {
      tm.n = 0;
      uint64_t cpu0 = pid ? cpu_ns(pid) : 0;
      generate_or_die(c, ids[i], per_round, &tm);
      cpu[i] += pid ? cpu_ns(pid) - cpu0 : 0;
      double *sg = seg + (size_t)i * seg_cap;
      for (size_t k = 0; k + POS_SEGMENT < tm.n; k += POS_SEGMENT)
        sg[n_seg[i]++] = (tm.t[k + POS_SEGMENT] - tm.t[k]) / POS_SEGMENT * 1e3;
      if (per_round <= POS_SEGMENT)
        sg[n_seg[i]++] = (tm.t[tm.n - 1] - tm.t[0]) / (double)(tm.n - 1) * 1e3;
    }
  }
  for (uint32_t i = 0; i < n_pos; i++) {
    r->pos_ms[i] = quantile(seg + (size_t)i * seg_cap, n_seg[i], 0.5);
    r->pos_cpu_ms[i] = (double)cpu[i] / 1e6 / ((double)per_round * POS_ROUNDS);
    sk_cli_note("position %" PRIu64 ": %.3f ms per token (daemon CPU %.3f ms per token)", o->pos[i],
         r->pos_ms[i], r->pos_cpu_ms[i]);
    close_session(c, ids[i]);
  }
  free(chunk);
  free(tm.t);
  free(seg);
}

/* ---- mixed: decode beside a long prefill ---- */

struct mixed_append {
  struct sk_client *c;
  uint64_t session;
  const int32_t *tokens;
  uint32_t n;
  double t0, t1;   /* the append's start and end */
  atomic_bool done;
};

static void *mixed_append_main(void *arg) {
  struct mixed_append *a = arg;
  a->t0 = sk_cli_now_s();
  append_or_die(a->c, a->session, a->tokens, a->n);
  a->t1 = sk_cli_now_s();
  atomic_store(&a->done, true);
  return NULL;
}

/* The gaps between consecutive events of tm whose later event is at or
 * before t_end, appended to gaps (ms). */
static void mixed_gaps(const struct timing *tm, double t_end, double *gaps, size_t *n) {
  for (size_t k = 1; k < tm->n && tm->t[k] <= t_end; k++)
    gaps[(*n)++] = (tm->t[k] - tm->t[k - 1]) * 1e3;
}

/* One streaming session generates MIXED_GEN tokens at a time, MIXED_ALONE
 * times alone, then again and again while a session of the daemon's
 * defaults appends o->mixed random tokens on its own connection, then
 * MIXED_ALONE times alone again; the gaps inside each generate (those
 * of the last generate beside the append up to the append's end). */
static void bench_mixed(const struct opts *o, const struct sk_hello *h, uint64_t *st,
                        struct mixed_result *r) {
  const uint32_t V = h->model.n_vocab, n = o->mixed;
  struct sk_client *cd = connect_or_die(o->socket), *cp = connect_or_die(o->socket);
  const uint64_t dec = open_session(cd, o, true, NULL);
  const uint64_t pre = open_session(cp, o, false, NULL);
  int32_t prompt[PROMPT_TOKENS];
  random_tokens(prompt, PROMPT_TOKENS, V, st);
  append_or_die(cd, dec, prompt, PROMPT_TOKENS);
  struct mixed_append a = {.c = cp, .session = pre, .n = n};
  int32_t *toks = malloc((size_t)n * sizeof *toks);
  struct timing tm = {.t = calloc(MIXED_GEN, sizeof(double)), .cap = MIXED_GEN};
  size_t cap = 2 * MIXED_ALONE * MIXED_GEN, n_alone = 0, n_beside = 0;
  double *alone = malloc(cap * sizeof *alone), *beside = malloc(cap * sizeof *beside);
  if (!toks || !tm.t || !alone || !beside) sk_cli_die(1, "out of memory");
  random_tokens(toks, n, V, st);
  a.tokens = toks;
  for (uint32_t k = 0; k < MIXED_ALONE; k++) {
    tm.n = 0;
    generate_or_die(cd, dec, MIXED_GEN, &tm);
    mixed_gaps(&tm, INFINITY, alone, &n_alone);
  }
  pthread_t th;
  if (pthread_create(&th, NULL, mixed_append_main, &a) != 0) sk_cli_die(1, "cannot start a thread");
  for (;;) {
    tm.n = 0;
    generate_or_die(cd, dec, MIXED_GEN, &tm);
    const bool done = atomic_load(&a.done); /* a.t1 is set before done */
    if (n_beside + MIXED_GEN > cap) {
      cap *= 2;
      beside = realloc(beside, cap * sizeof *beside);
      if (!beside) sk_cli_die(1, "out of memory");
    }
    /* not done: every event of this generate came before the append's end */
    mixed_gaps(&tm, done ? a.t1 : INFINITY, beside, &n_beside);
    if (done) break;
  }
  pthread_join(th, NULL);
  for (uint32_t k = 0; k < MIXED_ALONE; k++) {
    tm.n = 0;
    generate_or_die(cd, dec, MIXED_GEN, &tm);
    mixed_gaps(&tm, INFINITY, alone, &n_alone);
  }
  r->n_beside = n_beside;
  r->alone_p50_ms = quantile(alone, n_alone, 0.50);
  r->alone_p99_ms = quantile(alone, n_alone, 0.99);
  r->beside_p50_ms = quantile(beside, n_beside, 0.50);
  r->beside_p99_ms = quantile(beside, n_beside, 0.99);
  r->prefill_tps = (double)n / (a.t1 - a.t0);
  sk_cli_note("mixed: gaps alone p50 %.2f ms, p99 %.2f ms; beside a %u-token prefill "
              "(%.1f tokens/s) p50 %.2f ms, p99 %.2f ms (%zu gaps): p99 %.2fx",
              r->alone_p50_ms, r->alone_p99_ms, n, r->prefill_tps, r->beside_p50_ms,
              r->beside_p99_ms, n_beside, r->beside_p99_ms / r->alone_p99_ms);
  close_session(cp, pre);
  close_session(cd, dec);
  sk_client_free(cp);
  sk_client_free(cd);
  free(toks);
  free(tm.t);
  free(alone);
  free(beside);
}

/* ---- the report ---- */

static void print_json(const struct opts *o, const struct sk_hello *h, const struct results *r) {
  /* The names come from the daemon (the model's from its GGUF file):
   * escaped as JSON strings. */
  printf("{\"model\": {\"name\": ");
  sk_cli_json_cstr(stdout, h->model.name);
  printf(", \"weight_type\": ");
  sk_cli_json_cstr(stdout, h->model.weight_type);
  printf(", \"weight_bytes\": %" PRIu64 ", \"n_layer\": %u, \"dim\": %u, \"n_vocab\": %u}, ",
         h->model.weight_bytes, h->model.n_layer, h->model.dim, h->model.n_vocab);
  printf("\"compute\": {\"kernel\": ");
  sk_cli_json_cstr(stdout, h->compute.kernel);
  printf(", \"threads\": %u, \"max_batch\": %u, \"kv_type\": ", h->compute.threads,
         h->compute.max_batch);
  sk_cli_json_cstr(stdout, h->compute.kv_type[0] ? h->compute.kv_type : "f32");
  printf("}, ");
  printf("\"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, ", r->prefill_tps,
         r->decode_tps);
  printf("\"concurrency\": [");
  for (uint32_t i = 0; i < r->n_conc; i++)
    printf("%s{\"sessions\": %u, \"aggregate_tokens_per_s\": %.2f, \"itl_p50_ms\": %.3f, "
           "\"itl_p99_ms\": %.3f, \"rss_bytes\": %" PRIu64 "}",
           i ? ", " : "", r->conc[i].c, r->conc[i].aggregate, r->conc[i].p50_ms,
           r->conc[i].p99_ms, r->conc[i].rss);
  printf("], \"positions\": [");
  for (uint32_t i = 0; i < r->n_pos; i++)
    printf("%s{\"position\": %" PRIu64 ", \"ms_per_token\": %.4f, \"ratio\": %.4f, "
           "\"cpu_ms_per_token\": %.4f, \"cpu_ratio\": %.4f}",
           i ? ", " : "", o->pos[i], r->pos_ms[i], r->pos_ms[i] / r->pos_ms[0], r->pos_cpu_ms[i],
           r->pos_cpu_ms[0] > 0 ? r->pos_cpu_ms[i] / r->pos_cpu_ms[0] : 0.0);
  printf("], ");
  if (o->mixed)
    printf("\"mixed\": {\"prefill_tokens\": %u, \"prefill_tokens_per_s\": %.2f, "
           "\"alone_p50_ms\": %.3f, \"alone_p99_ms\": %.3f, \"beside_p50_ms\": %.3f, "
           "\"beside_p99_ms\": %.3f, \"beside_gaps\": %zu, \"p99_ratio\": %.3f}, ",
           o->mixed, r->mixed.prefill_tps, r->mixed.alone_p50_ms, r->mixed.alone_p99_ms,
           r->mixed.beside_p50_ms, r->mixed.beside_p99_ms, r->mixed.n_beside,
           r->mixed.beside_p99_ms / r->mixed.alone_p99_ms);
  printf("\"memory\": {\"rss_idle_bytes\": %" PRIu64 ", \"kv_bytes_default_session\": %" PRIu64
         ", \"kv_bytes_streaming_session\": %" PRIu64 ", \"sinks\": %u, \"window\": %u}, ",
         r->rss_idle, r->kv_bytes_default, r->kv_bytes_stream, o->sinks, o->window);
  const struct sk_spec_info *t = &r->spec_totals;
  printf("\"spec_totals\": {\"mode\": ");
  sk_cli_json_cstr(stdout, t->mode);
  printf(", \"draft_model\": ");
  sk_cli_json_cstr(stdout, t->draft_model);
  printf(", \"drafted\": %" PRIu64 ", \"accepted\": %" PRIu64 ", \"rejected\": %" PRIu64
         ", \"acceptance\": %.4f}",
         t->drafted, t->accepted, t->rejected, t->acceptance);
  if (o->spec.text) {
    printf(", ");
    sk_benchspec_print_json(&o->spec, &r->spec);
  }
  printf("}\n");
}

static void print_text(const struct opts *o, const struct sk_hello *h, const struct results *r) {
  printf("model          %s: %s weights, %.1f MB read per step\n", h->model.name,
         h->model.weight_type, (double)h->model.weight_bytes / 1e6);
  printf("compute        %s kernels, %u threads, %u tokens per forward pass, %s KV cache\n",
         h->compute.kernel, h->compute.threads, h->compute.max_batch,
         h->compute.kv_type[0] ? h->compute.kv_type : "f32");
  if (!o->no_prefill)
    printf("prefill        %.1f tokens/s (%u tokens)\n", r->prefill_tps, o->prefill);
  if (!o->no_decode) printf("decode         %.1f tokens/s (one session)\n", r->decode_tps);
  if (r->n_conc) printf("sessions   aggregate tok/s   ITL p50 ms   ITL p99 ms   RSS MB\n");
  for (uint32_t i = 0; i < r->n_conc; i++)
    printf("%8u   %15.1f   %10.2f   %10.2f   %6.1f\n", r->conc[i].c, r->conc[i].aggregate,
           r->conc[i].p50_ms, r->conc[i].p99_ms, (double)r->conc[i].rss / 1e6);
  if (r->n_pos)
    printf("position   ms/token   vs first   CPU ms/token   vs first   (streaming, %u sinks + "
           "window %u)\n",
           o->sinks, o->window);
  for (uint32_t i = 0; i < r->n_pos; i++)
    printf("%8" PRIu64 "   %8.3f   %8.3f   %12.3f   %8.3f\n", o->pos[i], r->pos_ms[i],
           r->pos_ms[i] / r->pos_ms[0], r->pos_cpu_ms[i],
           r->pos_cpu_ms[0] > 0 ? r->pos_cpu_ms[i] / r->pos_cpu_ms[0] : 0.0);
  if (o->mixed)
    printf("mixed          decode gaps alone p50 %.2f ms, p99 %.2f ms; beside a %u-token "
           "prefill (%.1f tokens/s) p50 %.2f ms, p99 %.2f ms: p99 %.2fx\n",
           r->mixed.alone_p50_ms, r->mixed.alone_p99_ms, o->mixed, r->mixed.prefill_tps,
           r->mixed.beside_p50_ms, r->mixed.beside_p99_ms,
           r->mixed.beside_p99_ms / r->mixed.alone_p99_ms);
  printf("memory         RSS idle %.1f MB; KV bytes per session: %.2f MB default",
         (double)r->rss_idle / 1e6, (double)r->kv_bytes_default / 1e6);
  if (r->n_pos)
    printf(", %.2f MB streaming %u+%u", (double)r->kv_bytes_stream / 1e6, o->sinks, o->window);
  printf("\n");
  if (o->spec.text) sk_benchspec_print_text(&o->spec, &r->spec);
  const struct sk_spec_info *t = &r->spec_totals;
  printf("speculation    default %s%s%s; daemon totals: %" PRIu64 " drafted, %" PRIu64
         " accepted, %" PRIu64 " rejected (%.1f%% accepted)\n",
         t->mode, t->draft_model[0] ? ", draft model " : "", t->draft_model, t->drafted,
         t->accepted, t->rejected, 100.0 * t->acceptance);
}

/* ---- main ---- */

int main(int argc, char **argv) {
  sk_cli_init("sinkd-bench", "sinkd-bench --help");
  struct opts o;
  parse_opts(argc, argv, &o);
  struct sk_client *c = connect_or_die(o.socket);
  struct sk_hello h;
  struct sk_error e = {0};
  if (sk_client_hello(c, &h, &e) < 0) sk_cli_die(1, "hello: %s", e.message);
  const uint32_t V = h.model.n_vocab;
  /* A model trained on fewer positions than sinks + the default window
   * (stories15M: 256) gets the longest window its positions allow. */
  if (!o.window_set && h.model.n_ctx_train > o.sinks &&
      o.sinks + o.window > h.model.n_ctx_train)
    o.window = h.model.n_ctx_train - o.sinks;
  pid_t pid = daemon_pid(o.socket);
  struct results r = {.rss_idle = pid ? rss_bytes(pid) : 0};
  uint64_t st = 42;

  if (!o.no_prefill) r.prefill_tps = bench_prefill(c, &o, V, &st);
  if (!o.no_decode) r.decode_tps = bench_decode(c, &o, V, &st);
  r.n_conc = o.no_conc ? 0 : o.n_conc;
  for (uint32_t i = 0; i < r.n_conc; i++) {
    r.conc[i] = run_concurrency(&o, V, o.conc[i], pid);
    sk_cli_note("%u session%s: aggregate %.1f tokens/s, inter-token p50 %.2f ms, p99 %.2f ms",
                 r.conc[i].c, r.conc[i].c == 1 ? "" : "s", r.conc[i].aggregate,
                 r.conc[i].p50_ms, r.conc[i].p99_ms);
  }
  r.n_pos = o.no_pos ? 0 : o.n_pos;
  if (r.n_pos) bench_positions(c, &o, V, &st, pid, &r);
  if (o.mixed) bench_mixed(&o, &h, &st, &r.mixed);
  {
    uint64_t id = open_session(c, &o, false, &r.kv_bytes_default);
    close_session(c, id);
  }
  if (o.spec.text) sk_benchspec_run(&o.spec, &r.spec);
  struct sk_daemon_stats ds;
  if (sk_client_stats(c, &ds, &e) < 0) sk_cli_die(1, "stats: %s", e.message);
  r.spec_totals = ds.speculation;

  if (o.json) print_json(&o, &h, &r);
  else print_text(&o, &h, &r);
  sk_client_free(c);
  return 0;
}
