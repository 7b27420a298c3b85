/* Token sampler: greedy (temperature 0: argmax, lowest id on ties), or
 * temperature softmax restricted by top-k then top-p (nucleus, Holtzman et
 * al. 2019), drawn with a seeded PRNG (xoshiro256**) so that a given seed
 * repeats exactly. The PRNG state is plain data (struct sk_sampler_state)
 * so a session can store it with its cache.
 */
#ifndef SK_SAMPLER_H
#define SK_SAMPLER_H

#include <stdint.h>

#include "sinkd/protocol.h"

struct sk_sampler_params {
  float temperature; /* 0 = greedy; otherwise > 0 */
  uint32_t top_k;    /* 0 = all tokens */
  float top_p;       /* (0, 1]; 1 = no nucleus cut */
  uint64_t seed;
};

/* Serializable state: the parameters and the PRNG words. */
struct sk_sampler_state {
  struct sk_sampler_params params;
  uint64_t rng[4];
};

struct sk_sampler {
  struct sk_sampler_state st;
  uint32_t n_vocab;
  float *probs;       /* (n_vocab) scratch, owned */
  uint32_t *idx;      /* (n_vocab) scratch, owned */
};

/* Checks params: temperature finite and >= 0 (and <= 100), top_p in (0,1].
 * Returns 0 or -SK_ERR_BAD_REQUEST naming the parameter and its value. */
int sk_sampler_params_check(const struct sk_sampler_params *p,
                            struct sk_error *err);
/* Initialises s for n_vocab tokens, seeding the PRNG from p->seed.
 * Errors: -SK_ERR_BAD_REQUEST (bad params), -SK_ERR_NO_MEMORY. */
int sk_sampler_init(struct sk_sampler *s, const struct sk_sampler_params *p,
                    uint32_t n_vocab, struct sk_error *err);
void sk_sampler_free(struct sk_sampler *s);
/* Sets st to params p with the PRNG seeded from p->seed (what
 * sk_sampler_init does), without allocating: for stored states. */
void sk_sampler_state_seed(struct sk_sampler_state *st,
                           const struct sk_sampler_params *p);
/* Picks the next token from logits (n_vocab). Deterministic for a given
 * seed and sequence of logits. */
int32_t sk_sampler_sample(struct sk_sampler *s, const float *logits);

/* The distribution sk_sampler_sample draws from for these logits, as
 * n_vocab probabilities into probs (summing to 1, 0 outside the tokens
 * top-k and top-p keep; greedy: 1 at the argmax). Uses s's scratch, not
 * its PRNG. */
void sk_sampler_probs(struct sk_sampler *s, const float *logits, float *probs);
/* Draws a token from probs (n_vocab non-negative weights, any sum > 0)
 * with s's PRNG (one uniform draw). All zero: the argmax of nothing,
 * token 0. */
int32_t sk_sampler_draw(struct sk_sampler *s, const float *probs);

/* Speculative sampling (Leviathan et al. 2023, "Fast Inference from
 * Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023,
 * "Accelerating Large Language Model Decoding with Speculative
 * Sampling", Algorithm 2): a proposed token x, drawn from the draft's
 * distribution q, is kept with probability min(1, p(x) / q(x)), p the
 * target's distribution (both from sk_sampler_probs, n_vocab floats);
 * otherwise the token is drawn from norm(max(0, p - q)). The result is
 * distributed as p whatever q is. q NULL: x was proposed
 * deterministically (a look-up in the session's history: q is 1 at x),
 * so it is kept with probability p(x), else drawn from p without x.
 * Uses s's PRNG: one uniform for the test, one more on rejection.
 * Returns -1 when x is kept, else the token drawn instead. */
int32_t sk_sampler_verify(struct sk_sampler *s, const float *p, const float *q, int32_t x);

#endif
