/* sinkd-bench's speculation part (see benchspec.h). */
#include "benchspec.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "sinkd/client.h"
#include "tool.h"

/* One prompt's run: its session, its tokens and when they arrived. */
struct run {
  const struct sk_benchspec_opts *o;
  const char *socket;
  const char *prompt;
  size_t prompt_len;
  const char *mode;
  pthread_barrier_t *ready;  /* NULL: alone */
  int32_t *tokens;           /* (gen) */
  double *t;                 /* (gen) event times */
  size_t n;
  uint64_t drafted, accepted, prompt_tokens;
};

static int on_token(void *user, const struct sk_token_event *ev) {
  struct run *r = user;
  if (r->n < r->o->gen) {
    r->tokens[r->n] = ev->token;
    r->t[r->n++] = sk_cli_now_s();
  }
  return 0;
}

/* Opens a session of the daemon's defaults in the run's mode, appends
 * the prompt, waits for the others (if any), generates --gen greedy
 * tokens, closes it. */
static void *run_main(void *arg) {
  struct run *r = arg;
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(r->socket, &c, &e) < 0) sk_cli_die(3, "%s", e.message);
  struct sk_open_params op = {.speculation = r->mode};
  struct sk_open_result or;
  if (sk_client_open(c, &op, &or, &e) < 0) sk_cli_die(1, "open: %s", e.message);
  struct sk_append_result ar;
  if (sk_client_append_text(c, or.session, r->prompt, r->prompt_len, SK_BOS_DEFAULT, &ar, &e) < 0)
    sk_cli_die(1, "append: %s", e.message);
  r->prompt_tokens = ar.n_tokens;
  if (r->ready) pthread_barrier_wait(r->ready);
  struct sk_generate_params p;
  sk_generate_params_init(&p);
  p.max_tokens = r->o->gen;
  p.temperature = 0.0;
  p.ignore_eos = true;
  struct sk_generate_result g;
  r->n = 0;
  if (sk_client_generate(c, or.session, &p, on_token, r, &g, &e) < 0)
    sk_cli_die(1, "generate: %s", e.message);
  if (g.n_tokens != r->o->gen)
    sk_cli_die(1, "generate: %llu tokens, stop %s", (unsigned long long)g.n_tokens, g.stop);
  r->drafted = g.drafted_tokens;
  r->accepted = g.accepted_tokens;
  if (sk_client_close_session(c, or.session, &e) < 0) sk_cli_die(1, "close: %s", e.message);
  sk_client_free(c);
  return NULL;
}

/* The prompts: n pieces of text, each starting at a line start near
 * i/n of the text and ending at the end of the line that reaches bytes
 * (pointers into text). */
static void cut_prompts(const char *text, size_t len, uint32_t n, uint32_t bytes,
                        const char **ret, size_t *ret_len) {
  for (uint32_t i = 0; i < n; i++) {
    size_t at = len / n * i;
    while (at > 0 && at < len && text[at - 1] != '\n') at++;
    size_t end = at + bytes < len ? at + bytes : len;
    while (end < len && text[end - 1] != '\n') end++;
    ret[i] = text + at;
    ret_len[i] = end - at;
  }
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, sk_tool_cmp_double);
  return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : 0.0;
}

/* One round of one mode at `sessions` sessions: every prompt (in groups
 * of `sessions` generating together); tokens/s into *ret_tps. */
static void round_of(const struct sk_benchspec_opts *o, const char *mode, uint32_t sessions,
                     const char **prompts, const size_t *plen, struct run *runs,
                     double *ret_tps) {
  double tokens = 0, secs = 0;
  for (uint32_t g0 = 0; g0 < o->prompts; g0 += sessions) {
    const uint32_t k = o->prompts - g0 < sessions ? o->prompts - g0 : sessions;
    pthread_barrier_t ready;
    pthread_t th[256];
    if (k > 1) pthread_barrier_init(&ready, NULL, k);
    for (uint32_t i = 0; i < k; i++) {
      struct run *r = &runs[g0 + i];
      r->o = o;
      r->socket = o->socket;
      r->prompt = prompts[g0 + i];
      r->prompt_len = plen[g0 + i];
      r->mode = mode;
      r->ready = k > 1 ? &ready : NULL;
      if (k == 1) run_main(r);
      else if (pthread_create(&th[i], NULL, run_main, r) != 0)
        sk_cli_die(1, "cannot start a thread");
    }
    if (k > 1) {
      for (uint32_t i = 0; i < k; i++) pthread_join(th[i], NULL);
      pthread_barrier_destroy(&ready);
    }
    double first = INFINITY, last = 0;
    for (uint32_t i = 0; i < k; i++) {
      const struct run *r = &runs[g0 + i];
      first = fmin(first, r->t[0]);
      last = fmax(last, r->t[r->n - 1]);
      tokens += (double)(r->n - 1);
      if (k == 1) secs += r->t[r->n - 1] - r->t[0];
    }
    if (k > 1) secs += last - first;
  }
  *ret_tps = secs > 0 ? tokens / secs : 0;
}

void sk_benchspec_run(const struct sk_benchspec_opts *o, struct sk_benchspec_result *ret) {
  memset(ret, 0, sizeof *ret);
  FILE *f = fopen(o->text, "rb");
  if (!f) sk_cli_die(1, "--spec-text: cannot open %s", o->text);
  static char text[1 << 22];
  size_t len = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  if ((uint64_t)len < (uint64_t)o->prompts * o->prompt_bytes)
    sk_cli_die(1, "--spec-text: %s is shorter than %u prompts of %u bytes", o->text, o->prompts,
               o->prompt_bytes);
  const char **prompts = calloc(o->prompts, sizeof *prompts);
  size_t *plen = calloc(o->prompts, sizeof *plen);
  const uint32_t M = o->n_modes, P = o->prompts;
  struct run *runs = calloc((size_t)M * P, sizeof *runs);
  double *tps = calloc((size_t)M * o->rounds, sizeof *tps), *ratio = calloc(o->rounds, sizeof *ratio);
  if (!prompts || !plen || !runs || !tps || !ratio) sk_cli_die(1, "out of memory");
  for (size_t i = 0; i < (size_t)M * P; i++) {
    runs[i].tokens = calloc(o->gen, sizeof *runs[i].tokens);
    runs[i].t = calloc(o->gen, sizeof *runs[i].t);
    if (!runs[i].tokens || !runs[i].t) sk_cli_die(1, "out of memory");
  }
  cut_prompts(text, len, P, o->prompt_bytes, prompts, plen);
  for (uint32_t si = 0; si < o->n_sessions; si++) {
    const uint32_t S = o->sessions[si];
    for (uint32_t m = 0; m < M; m++) ret->cell[si][m].identical = true;
    for (uint32_t r = 0; r < o->rounds; r++) {
      /* the modes take turns at going first: A B C, C B A, ... */
      for (uint32_t k = 0; k < M; k++) {
        const uint32_t m = r % 2 ? M - 1 - k : k;
        round_of(o, o->modes[m], S, prompts, plen, runs + (size_t)m * P, &tps[(size_t)m * o->rounds + r]);
        struct sk_benchspec_cell *cell = &ret->cell[si][m];
        uint64_t ptok = 0;
        for (uint32_t p = 0; p < P; p++) {
          const struct run *x = &runs[(size_t)m * P + p];
          cell->drafted += x->drafted;
          cell->accepted += x->accepted;
          ptok += x->prompt_tokens;
        }
        ret->prompt_tokens = (uint32_t)(ptok / P);
        sk_cli_note("speculation %s, %u session%s, round %u: %.1f tokens/s, %llu drafted, %llu "
                    "accepted",
                    o->modes[m], S, S == 1 ? "" : "s", r + 1, tps[(size_t)m * o->rounds + r],
                    (unsigned long long)cell->drafted, (unsigned long long)cell->accepted);
      }
      for (uint32_t m = 1; m < M; m++)
        for (uint32_t p = 0; p < P; p++)
          if (memcmp(runs[(size_t)m * P + p].tokens, runs[p].tokens,
                     o->gen * sizeof(int32_t)) != 0)
            ret->cell[si][m].identical = false;
    }
    for (uint32_t m = 0; m < M; m++) {
      for (uint32_t r = 0; r < o->rounds; r++)
        ratio[r] = tps[r] > 0 ? tps[(size_t)m * o->rounds + r] / tps[r] : 0;
      ret->cell[si][m].ratio = median(ratio, o->rounds);
      ret->cell[si][m].tps = median(tps + (size_t)m * o->rounds, o->rounds);
    }
  }
  for (size_t i = 0; i < (size_t)M * P; i++) {
    free(runs[i].tokens);
    free(runs[i].t);
  }
  free(runs);
  free(tps);
  free(ratio);
  free(prompts);
  free(plen);
}

void sk_benchspec_print_text(const struct sk_benchspec_opts *o,
                             const struct sk_benchspec_result *r) {
  printf("speculation    %u prompts of %s (%u tokens on average), %u greedy tokens each, "
         "medians of %u rounds\n",
         o->prompts, o->text, r->prompt_tokens, o->gen, o->rounds);
  printf("sessions   mode      tokens/s   vs %-6s  drafted  accepted  acceptance  identical\n",
         o->modes[0]);
  for (uint32_t s = 0; s < o->n_sessions; s++)
    for (uint32_t m = 0; m < o->n_modes; m++) {
      const struct sk_benchspec_cell *c = &r->cell[s][m];
      printf("%8u   %-7s %10.1f   %8.2f  %7llu  %8llu  %9.1f%%  %s\n", o->sessions[s],
             o->modes[m], c->tps, c->ratio, (unsigned long long)c->drafted,
             (unsigned long long)c->accepted,
             c->drafted ? 100.0 * (double)c->accepted / (double)c->drafted : 0.0,
             m == 0 ? "-" : c->identical ? "yes" : "NO");
    }
}

void sk_benchspec_print_json(const struct sk_benchspec_opts *o,
                             const struct sk_benchspec_result *r) {
  printf("\"speculation\": {\"text\": ");
  sk_cli_json_cstr(stdout, o->text);
  printf(", \"prompts\": %u, \"prompt_tokens\": %u, \"gen\": %u, \"rounds\": %u, \"runs\": [",
         o->prompts, r->prompt_tokens, o->gen, o->rounds);
  bool first = true;
  for (uint32_t s = 0; s < o->n_sessions; s++)
    for (uint32_t m = 0; m < o->n_modes; m++) {
      const struct sk_benchspec_cell *c = &r->cell[s][m];
      printf("%s{\"sessions\": %u, \"mode\": \"%s\", \"tokens_per_s\": %.2f, \"ratio\": %.4f, "
             "\"drafted\": %llu, \"accepted\": %llu, \"identical\": %s}",
             first ? "" : ", ", o->sessions[s], o->modes[m], c->tps, c->ratio,
             (unsigned long long)c->drafted, (unsigned long long)c->accepted,
             c->identical ? "true" : "false");
      first = false;
    }
  printf("]}");
}
