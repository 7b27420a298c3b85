/* RoPE's angles (Su et al. 2021, RoFormer eq. 34; model.h says which
 * pairs rotate), as llama.cpp computes them where the bits show, and
 * the scratch's tables of them. */
#include <math.h>

#include "model/model_int.h"

/* cos/sin of position p for freq_scale, as ggml_rope_cache_init:
 * theta = pos; theta *= theta_scale per pair, all in float; divided by
 * the frequency factor, times freq_scale. Laid out for sk_kernels_rope:
 * cs[2i] = cs[2i+1] = cos, sn[2i] = -sin, sn[2i+1] = sin. */
void sk__rope_angles(const struct sk_model *m, uint32_t p, float freq_scale, float *cs,
                     float *sn) {
  const uint32_t half = m->cfg.rope_dim / 2;
  const float theta_scale = powf(m->cfg.rope_base, -2.0f / (float)m->cfg.rope_dim);
  float theta = (float)p;
  for (uint32_t i = 0; i < half; i++) {
    float ff = m->rope_freqs ? m->rope_freqs[i] : 1.0f;
    float t = freq_scale * (theta / ff);
    cs[2 * i] = cs[2 * i + 1] = cosf(t);
    sn[2 * i + 1] = sinf(t);
    sn[2 * i] = -sn[2 * i + 1];
    theta *= theta_scale;
  }
}

/* cos/sin of stream index t for freq_scale (layout of sk__rope_angles),
 * for keys stored rotated (kvcache.h). Below the trained context these
 * are sk__rope_angles' (ggml's float angles, so that a dense cache gives
 * llama.cpp's bits); from there on each angle is t * freq_i in double,
 * reduced by cos/sin in double: ggml's float products drift by ~1e-7 * t
 * radians, a whole turn by t ~ 10^7, and an endless stream's keys must
 * keep their angles exact relative to every later query. */
void sk__rope_angles_at(const struct sk_model *m, uint64_t t, float freq_scale, float *cs,
                        float *sn) {
  if (t < m->cfg.n_ctx_train) {
    sk__rope_angles(m, (uint32_t)t, freq_scale, cs, sn);
    return;
  }
  const uint32_t half = m->cfg.rope_dim / 2;
  for (uint32_t i = 0; i < half; i++) {
    double ff = m->rope_freqs ? (double)m->rope_freqs[i] : 1.0;
    double freq = pow((double)m->cfg.rope_base, -2.0 * i / (double)m->cfg.rope_dim);
    double a = (double)t * (freq / ff * (double)freq_scale);
    cs[2 * i] = cs[2 * i + 1] = (float)cos(a);
    sn[2 * i + 1] = (float)sin(a);
    sn[2 * i] = -sn[2 * i + 1];
  }
}

/* Extends the cos/sin tables to positions < n for freq_scale. */
void sk__rope_tables(struct sk_scratch *s, uint32_t n, float freq_scale) {
  const uint32_t half = s->m->cfg.rope_dim / 2;
  if (s->rope_freq_scale != freq_scale) {
    s->rope_valid = 0;
    s->rope_freq_scale = freq_scale;
  }
  for (uint32_t p = s->rope_valid; p < n; p++)
    sk__rope_angles(s->m, p, freq_scale, s->rope_cos + (size_t)p * 2 * half,
                    s->rope_sin + (size_t)p * 2 * half);
  if (n > s->rope_valid) s->rope_valid = n;
}
