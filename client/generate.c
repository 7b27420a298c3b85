/* sinkctl's generation: the prompt (arguments or stdin), a reply
 * streamed as it comes (or collected for --json), Ctrl-C, the prefill of
 * a long prompt with a progress bar, and the generate command; chat.c
 * uses the same. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sinkctl.h"

/* A prompt read from stdin larger than any frame the daemon accepts is
 * refused here rather than read without bound. */
#define PROMPT_MAX ((size_t)SK_FRAME_MAX_CEILING)

/* ---- the prompt, Ctrl-C, the reply ------------------------------------ */

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

char *text_from_args(int argc, char **argv, size_t *ret_len) {
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

double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

volatile sig_atomic_t interrupted;

/* The first Ctrl-C asks to stop (the reply, the prefill); the handler then
 * steps aside, so a second Ctrl-C ends sinkctl at once. */
static void on_sigint(int sig) {
  interrupted = 1;
  signal(sig, SIG_DFL);
}

/* Installs on_sigint without SA_RESTART, so that a Ctrl-C at chat's prompt
 * interrupts the read. */
void catch_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  interrupted = 0;
  sigaction(SIGINT, &sa, NULL);
}

/* Prints the prompt still to echo, once. */
static void gen_echo(struct gen_state *g) {
  if (g->echo_len == 0) return;
  print_model_text(g->echo, g->echo_len);
  g->echo_len = 0;
}

int on_token(void *user, const struct sk_token_event *ev) {
  struct gen_state *g = user;
  if (g->first_token_ms == 0) g->first_token_ms = now_ms();
  if (!g->json) {
    gen_echo(g);
    print_model_text(ev->text, ev->text_len);
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

void gen_state_free(struct gen_state *g) {
  free(g->text);
  free(g->tokens);
  memset(g, 0, sizeof *g);
}

void json_generate(uint64_t session, unsigned turn, const struct gen_state *g,
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
  printf("{\"prompt_tokens\": %" PRIu64 ", \"completion_tokens\": %" PRIu64, res->prompt_tokens,
         res->completion_tokens);
  if (res->drafted_tokens) /* speculation proposed tokens */
    printf(", \"drafted_tokens\": %" PRIu64 ", \"accepted_tokens\": %" PRIu64,
           res->drafted_tokens, res->accepted_tokens);
  fputc('}', stdout);
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

bool want_progress(const struct opts *o, size_t prompt_len) {
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

/* (sinkctl.h) Appends of PREFILL_CHUNK tokens. */
int prefill(struct sk_client *c, uint64_t session, bool empty, bool special,
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

bool session_is_empty(struct sk_client *c, uint64_t session) {
  struct sk_session_stats st;
  return sk_client_session_stats(c, session, &st, NULL) == 0 && st.seen == 0;
}

/* ---- generate -------------------------------------------------------------- */

int cmd_generate(struct sk_client *c, const struct opts *o, int argc, char **argv) {
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
      if (res.drafted_tokens)
        fprintf(stderr, "; speculation: %" PRIu64 " drafted, %" PRIu64 " accepted",
                res.drafted_tokens, res.accepted_tokens);
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
