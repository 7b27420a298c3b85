/* sinkd-bench's speculation part: greedy continuations of prompts cut
 * from a text, under each speculation mode in turn, as a client sees
 * them (tokens/s from the first token event to the last), for one
 * session at a time and for several generating together. */
#ifndef SK_BENCHSPEC_H
#define SK_BENCHSPEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define SK_BENCHSPEC_MAX_MODES 4u
#define SK_BENCHSPEC_MAX_SESSIONS 4u

struct sk_benchspec_opts {
  const char *socket;
  const char *text;        /* the file prompts are cut from */
  const char *modes[SK_BENCHSPEC_MAX_MODES]; /* "off", "draft", "lookup" */
  uint32_t n_modes;
  uint32_t prompts;        /* prompts, spread evenly through the text */
  uint32_t prompt_bytes;   /* about this many bytes each, whole lines */
  uint32_t gen;            /* tokens generated per prompt */
  uint32_t rounds;         /* every mode on every prompt per round */
  uint32_t sessions[SK_BENCHSPEC_MAX_SESSIONS]; /* generating together */
  uint32_t n_sessions;
};

/* One mode at one number of sessions. */
struct sk_benchspec_cell {
  double tps;              /* median over the rounds of tokens/s (one
                              session: all prompts' tokens over their
                              decode times; more: the aggregate) */
  double ratio;            /* median over the rounds of tps / the first
                              mode's tps in the same round */
  uint64_t drafted, accepted; /* over every round */
  bool identical;          /* every prompt's tokens equal the first
                              mode's, in every round */
};

struct sk_benchspec_result {
  struct sk_benchspec_cell cell[SK_BENCHSPEC_MAX_SESSIONS][SK_BENCHSPEC_MAX_MODES];
  uint32_t prompt_tokens;  /* tokens of the prompts, on average */
};

/* Runs the part (exits through sk_cli_die on a daemon error); progress
 * notes go to stderr. */
void sk_benchspec_run(const struct sk_benchspec_opts *o, struct sk_benchspec_result *ret);
/* The results as text, or as the members of a JSON object. */
void sk_benchspec_print_text(const struct sk_benchspec_opts *o,
                             const struct sk_benchspec_result *r);
void sk_benchspec_print_json(const struct sk_benchspec_opts *o,
                             const struct sk_benchspec_result *r);

#endif
