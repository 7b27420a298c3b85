/* Token sampler (see sampler.h). The chain follows llama.cpp's common
 * sampler order: top-k, top-p (over the softmax of the untempered kept
 * logits), temperature, softmax, draw. */
#include "model/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Temperatures above this make the distribution flat to float precision;
 * a larger value is more likely a client bug than a wish. */
#define SK__MAX_TEMPERATURE ((float)SK_MAX_TEMPERATURE) /* sinkd/protocol.h */

/* ---- PRNG: xoshiro256** seeded by splitmix64 (Blackman & Vigna) ------ */

static uint64_t sk__splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t sk__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t sk__xoshiro_next(uint64_t s[4]) {
  uint64_t result = sk__rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = sk__rotl(s[3], 45);
  return result;
}

/* Uniform double in [0, 1) from the top 53 bits. */
static double sk__uniform(uint64_t s[4]) {
  return (double)(sk__xoshiro_next(s) >> 11) * 0x1.0p-53;
}

/* ---- parameters ----------------------------------------------------- */

int sk_sampler_params_check(const struct sk_sampler_params *p,
                            struct sk_error *err) {
  if (!isfinite(p->temperature) || p->temperature < 0.0f ||
      p->temperature > SK__MAX_TEMPERATURE)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "temperature %g must be finite and in [0, %g]",
                        (double)p->temperature, (double)SK__MAX_TEMPERATURE);
  if (!isfinite(p->top_p) || !(p->top_p > 0.0f) || p->top_p > 1.0f)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "top_p %g must be in (0, 1]", (double)p->top_p);
  return 0;
}

int sk_sampler_init(struct sk_sampler *s, const struct sk_sampler_params *p,
                    uint32_t n_vocab, struct sk_error *err) {
  memset(s, 0, sizeof *s);
  int rc = sk_sampler_params_check(p, err);
  if (rc < 0) return rc;
  if (n_vocab == 0 || n_vocab > INT32_MAX)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "n_vocab %u is outside 1..%d", n_vocab, INT32_MAX);
  s->probs = malloc((size_t)n_vocab * sizeof *s->probs);
  s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
  if (!s->probs || !s->idx) {
    sk_sampler_free(s);
    return sk_error_set(err, SK_ERR_NO_MEMORY,
                        "cannot allocate sampler scratch for %u tokens",
                        n_vocab);
  }
  s->n_vocab = n_vocab;
  sk_sampler_state_seed(&s->st, p);
  return 0;
}

void sk_sampler_state_seed(struct sk_sampler_state *st,
                           const struct sk_sampler_params *p) {
  st->params = *p;
  uint64_t x = p->seed;
  for (int i = 0; i < 4; i++) st->rng[i] = sk__splitmix64(&x);
}

void sk_sampler_free(struct sk_sampler *s) {
  if (!s) return;
  free(s->probs);
  free(s->idx);
  s->probs = NULL;
  s->idx = NULL;
  s->n_vocab = 0;
}

/* ---- sampling ------------------------------------------------------- */

/* The lowest id of the largest logit (NaNs never win; all NaN: 0). Two
 * passes: the maximum over 8 independent lanes, then the first block of
 * 8 holding it and the first id in it. Both walk a pointer over whole
 * blocks with no early exit inside a block, so the compiler turns them
 * into vector max and compare instructions (indexing with a 32-bit
 * counter that might wrap, and stopping at every logit, kept them
 * scalar: 32000 logits, 54 -> 15 us). */
static int32_t sk__argmax(const float *logits, uint32_t n) {
  float lane[8];
  for (int l = 0; l < 8; l++) lane[l] = -INFINITY;
  const float *p = logits, *const end8 = logits + (n & ~7u), *const end = logits + n;
  for (; p < end8; p += 8)
    for (int l = 0; l < 8; l++) lane[l] = p[l] > lane[l] ? p[l] : lane[l];
  float max = -INFINITY;
  for (int l = 0; l < 8; l++) max = lane[l] > max ? lane[l] : max;
  for (; p < end; p++) max = *p > max ? *p : max;
  for (p = logits; p < end8; p += 8) {
    int hit = 0;
    for (int l = 0; l < 8; l++) hit |= p[l] == max;
    if (hit) break;
  }
  for (; p < end; p++)
    if (*p == max) return (int32_t)(p - logits);
  return 0; /* every logit NaN */
}

/* Candidate order: logit descending, id ascending (a total order, so the
 * result does not depend on the sort algorithm). NaN logits (a broken
 * model) sort last so they are never preferred. A heap sort: qsort has no
 * context argument in C11. */
static bool sk__before(const float *l, uint32_t a, uint32_t b) {
  bool na = isnan(l[a]), nb = isnan(l[b]);
  if (na != nb) return nb;
  if (!na && l[a] != l[b]) return l[a] > l[b];
  return a < b;
}

static void sk__sift_down(uint32_t *h, uint32_t n, uint32_t i,
                          const float *l) {
  /* Max-heap under "after": the root is the element sorted last. */
  for (;;) {
    uint32_t c = 2 * i + 1;
    if (c >= n) return;
    if (c + 1 < n && sk__before(l, h[c], h[c + 1])) c++;
    if (!sk__before(l, h[i], h[c])) return;
    uint32_t t = h[i];
    h[i] = h[c];
    h[c] = t;
    i = c;
  }
}

static void sk__sort_desc(uint32_t *idx, uint32_t n, const float *l) {
  if (n < 2) return;
  for (uint32_t i = n / 2; i-- > 0;) sk__sift_down(idx, n, i, l);
  for (uint32_t end = n - 1; end > 0; end--) {
    uint32_t t = idx[0];
    idx[0] = idx[end];
    idx[end] = t;
    sk__sift_down(idx, end, 0, l);
  }
}

/* Partial selection: moves the k first elements (in sorted order) to
 * idx[0..k) sorted, in O(n log k) — top_k is usually small. */
static void sk__select_top(uint32_t *idx, uint32_t n, uint32_t k,
                           const float *l) {
  if (k >= n) {
    sk__sort_desc(idx, n, l);
    return;
  }
  /* Heap of the k best seen so far, root = worst of them. */
  for (uint32_t i = k / 2; i-- > 0;) sk__sift_down(idx, k, i, l);
  for (uint32_t i = k; i < n; i++) {
    if (sk__before(l, idx[i], idx[0])) {
      uint32_t t = idx[0];
      idx[0] = idx[i];
      idx[i] = t;
      sk__sift_down(idx, k, 0, l);
    }
  }
  sk__sort_desc(idx, k, l);
}

/* The tokens a draw picks from and their weights: idx[0..*ret_k) with
 * probs[0..*ret_k) (unnormalised; their sum in *ret_sum). Returns false
 * when the draw is decided without weights: greedy, or a top logit that
 * is NaN or infinite (*ret_token then). */
static bool sk__weights(struct sk_sampler *s, const float *logits, uint32_t *ret_k,
                        double *ret_sum, int32_t *ret_token) {
  const struct sk_sampler_params *p = &s->st.params;
  uint32_t n = s->n_vocab;
  if (p->temperature == 0.0f) {
    *ret_token = sk__argmax(logits, n);
    return false;
  }
  uint32_t *idx = s->idx;
  float *probs = s->probs;
  for (uint32_t i = 0; i < n; i++) idx[i] = i;
  uint32_t k = p->top_k == 0 || p->top_k > n ? n : p->top_k;
  sk__select_top(idx, n, k, logits);
  float top = logits[idx[0]];
  if (isnan(top) || isinf(top)) {
    *ret_token = (int32_t)idx[0];
    return false;
  }

  /* top-p over the softmax of the untempered kept logits. */
  if (p->top_p < 1.0f && k > 1) {
    double max = top, sum = 0.0;
    for (uint32_t i = 0; i < k; i++) {
      float l = logits[idx[i]];
      probs[i] = isnan(l) ? 0.0f : (float)exp((double)l - max);
      sum += probs[i];
    }
    double cum = 0.0;
    uint32_t keep = k;
    for (uint32_t i = 0; i < k; i++) {
      cum += probs[i] / sum;
      if (cum >= p->top_p) {
        keep = i + 1;
        break;
      }
    }
    k = keep;
  }

  /* Temperature, softmax. */
  double max = (double)top / p->temperature, sum = 0.0;
  for (uint32_t i = 0; i < k; i++) {
    float l = logits[idx[i]];
    probs[i] = isnan(l) ? 0.0f : (float)exp((double)l / p->temperature - max);
    sum += probs[i];
  }
  *ret_k = k;
  *ret_sum = sum;
  return true;
}

int32_t sk_sampler_sample(struct sk_sampler *s, const float *logits) {
  uint32_t k;
  double sum;
  int32_t token;
  if (!sk__weights(s, logits, &k, &sum, &token)) return token;
  const uint32_t *idx = s->idx;
  const float *probs = s->probs;
  double r = sk__uniform(s->st.rng) * sum, cum = 0.0;
  for (uint32_t i = 0; i < k; i++) {
    cum += probs[i];
    if (r < cum) return (int32_t)idx[i];
  }
  return (int32_t)idx[k - 1]; /* rounding left r at the very top */
}

void sk_sampler_probs(struct sk_sampler *s, const float *logits, float *out) {
  uint32_t k;
  double sum;
  int32_t token;
  memset(out, 0, (size_t)s->n_vocab * sizeof *out);
  if (!sk__weights(s, logits, &k, &sum, &token)) {
    out[token] = 1.0f;
    return;
  }
  for (uint32_t i = 0; i < k; i++) out[s->idx[i]] = (float)(s->probs[i] / sum);
}

int32_t sk_sampler_draw(struct sk_sampler *s, const float *probs) {
  const uint32_t n = s->n_vocab;
  double sum = 0.0;
  for (uint32_t i = 0; i < n; i++) sum += probs[i];
  double r = sk__uniform(s->st.rng) * sum, cum = 0.0;
  int32_t last = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!(probs[i] > 0.0f)) continue;
    cum += probs[i];
    last = (int32_t)i;
    if (r < cum) return (int32_t)i;
  }
  return last; /* rounding left r at the very top */
}

int32_t sk_sampler_verify(struct sk_sampler *s, const float *p, const float *q, int32_t x) {
  const double px = p[x], qx = q ? q[x] : 1.0;
  /* kept with probability min(1, p(x) / q(x)) */
  if (sk__uniform(s->st.rng) * qx < px) return -1;
  /* the residual norm(max(0, p - q)), into the sampler's scratch */
  const uint32_t n = s->n_vocab;
  float *r = s->probs;
  double sum = 0.0;
  for (uint32_t i = 0; i < n; i++) {
    const float qi = q ? q[i] : (int32_t)i == x ? 1.0f : 0.0f;
    r[i] = p[i] > qi ? p[i] - qi : 0.0f;
    sum += r[i];
  }
  /* p == q up to rounding (the test fails only by rounding then): p */
  return sk_sampler_draw(s, sum > 0.0 ? r : p);
}
