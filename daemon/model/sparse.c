/* Contextual sparsity of the SwiGLU MLP (CATS rule, see sparse.h). */
#include "sparse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

/* ---- calibration file ------------------------------------------------- */

void sk_sparse_calib_free(struct sk_sparse_calib *c) {
  if (!c) return;
  free(c->thr);
  free(c->measured);
  c->thr = c->measured = NULL;
  c->n_levels = 0;
}

const float *sk_sparse_calib_find(const struct sk_sparse_calib *c, float s) {
  if (!c) return NULL;
  for (uint32_t i = 0; i < c->n_levels; i++)
    if (fabsf(c->level[i] - s) < SK_SPARSE_LEVEL_EPS) return c->thr + (size_t)i * c->n_layer;
  return NULL;
}

const char *sk_sparse_calib_levels(const struct sk_sparse_calib *c, char *buf, size_t n) {
  if (!c || c->n_levels == 0) {
    snprintf(buf, n, "none");
    return buf;
  }
  size_t at = 0;
  buf[0] = 0;
  for (uint32_t i = 0; i < c->n_levels && at < n; i++) {
    int k = snprintf(buf + at, n - at, "%s%g", i ? ", " : "", (double)c->level[i]);
    if (k < 0) break;
    at += (size_t)k;
  }
  return buf;
}

static void sk__hex(const uint8_t fp[16], char out[33]) {
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", fp[i]);
}

int sk_sparse_calib_write(FILE *f, const struct sk_sparse_calib *c, struct sk_error *err) {
  char hex[33];
  sk__hex(c->model_fp, hex);
  fprintf(f, "sinkd-sparsity %u\nfingerprint %s\nlayers %u\ntokens %llu\n",
          SK_SPARSE_CALIB_VERSION, hex, c->n_layer, (unsigned long long)c->n_tokens);
  for (uint32_t i = 0; i < c->n_levels; i++) {
    fprintf(f, "level %.9g", (double)c->level[i]);
    for (uint32_t l = 0; l < c->n_layer; l++)
      fprintf(f, " %.9g", (double)c->thr[(size_t)i * c->n_layer + l]);
    fputc('\n', f);
  }
  for (uint32_t i = 0; i < c->n_levels && c->measured; i++) {
    fprintf(f, "measured %.9g", (double)c->level[i]);
    for (uint32_t l = 0; l < c->n_layer; l++)
      fprintf(f, " %.9g", (double)c->measured[(size_t)i * c->n_layer + l]);
    fputc('\n', f);
  }
  if (fflush(f) != 0 || ferror(f))
    return sk_error_set(err, SK_ERR_IO, "cannot write the calibration: %s", strerror(errno));
  return 0;
}

/* Parses n floats from p (space-separated, nothing after them). */
static bool sk__floats(const char *p, float *out, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p || errno) return false;
    out[i] = (float)v;
    p = end;
  }
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return *p == 0;
}

int sk_sparse_calib_load(const char *path, const uint8_t fp[16], uint32_t n_layer,
                         struct sk_sparse_calib *c, struct sk_error *err) {
  memset(c, 0, sizeof *c);
  FILE *f = fopen(path, "r");
  if (!f)
    return sk_error_set(err, SK_ERR_IO, "sparsity calibration %s: %s", path, strerror(errno));
  int rc = 0;
  char line[65536];
  unsigned lineno = 0;
  bool have_fp = false, have_layers = false;
  float vals[1 + 1024];
  c->n_layer = 0;
#define BAD(...)                                                                          \
  do {                                                                                    \
    char m_[256];                                                                         \
    snprintf(m_, sizeof m_, __VA_ARGS__);                                                 \
    rc = sk_error_set(err, SK_ERR_BAD_REQUEST, "sparsity calibration %s:%u: %s", path, \
                      lineno, m_);                                                        \
    goto out;                                                                             \
  } while (0)
  while (fgets(line, sizeof line, f)) {
    lineno++;
    size_t len = strlen(line);
    if (len == sizeof line - 1 && line[len - 1] != '\n') BAD("line too long");
    if (lineno == 1) {
      unsigned v = 0;
      if (sscanf(line, "sinkd-sparsity %u", &v) != 1)
        BAD("not a sinkd sparsity calibration (it starts with \"sinkd-sparsity 1\")");
      if (v != SK_SPARSE_CALIB_VERSION)
        BAD("version %u; this sinkd reads version %u", v, SK_SPARSE_CALIB_VERSION);
      continue;
    }
    if (strncmp(line, "fingerprint ", 12) == 0) {
      char hex[33], want[33];
      if (sscanf(line + 12, "%32s", hex) != 1 || strlen(hex) != 32) BAD("bad fingerprint");
      sk__hex(fp, want);
      if (strcmp(hex, want) != 0) {
        lineno = 0;
        rc = sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "sparsity calibration %s was made for another model (fingerprint "
                          "%s, this model's is %s): calibrate again with sinkd --calibrate",
                          path, hex, want);
        goto out;
      }
      memcpy(c->model_fp, fp, 16);
      have_fp = true;
    } else if (strncmp(line, "layers ", 7) == 0) {
      unsigned v = 0;
      if (sscanf(line + 7, "%u", &v) != 1 || v != n_layer)
        BAD("layers is not the model's %u", n_layer);
      if (n_layer > 1024) BAD("more than 1024 layers");
      c->n_layer = n_layer;
      have_layers = true;
      free(c->thr);
      free(c->measured);
      c->thr = calloc((size_t)SK_SPARSE_MAX_LEVELS * n_layer, sizeof *c->thr);
      c->measured = malloc((size_t)SK_SPARSE_MAX_LEVELS * n_layer * sizeof *c->measured);
      if (!c->thr || !c->measured) {
        rc = sk_error_set(err, SK_ERR_NO_MEMORY, "sparsity calibration: out of memory");
        goto out;
      }
      for (size_t i = 0; i < (size_t)SK_SPARSE_MAX_LEVELS * n_layer; i++) c->measured[i] = NAN;
    } else if (strncmp(line, "tokens ", 7) == 0) {
      unsigned long long v = 0;
      if (sscanf(line + 7, "%llu", &v) != 1) BAD("bad token count");
      c->n_tokens = v;
    } else if (strncmp(line, "level ", 6) == 0 || strncmp(line, "measured ", 9) == 0) {
      bool measured = line[0] == 'm';
      if (!have_layers) BAD("a level before the layers line");
      if (!sk__floats(line + (measured ? 9 : 6), vals, n_layer + 1))
        BAD("expected the level and %u numbers", n_layer);
      float s = vals[0];
      if (!(s > 0.0f && s < 1.0f)) BAD("level %g is outside (0, 1)", (double)s);
      if (measured) {
        const float *t = sk_sparse_calib_find(c, s);
        if (!t) BAD("measured values of level %g, which has no thresholds", (double)s);
        memcpy(c->measured + (t - c->thr), vals + 1, n_layer * sizeof *vals);
        continue;
      }
      if (c->n_levels == SK_SPARSE_MAX_LEVELS) BAD("more than %u levels", SK_SPARSE_MAX_LEVELS);
      if (c->n_levels && !(s > c->level[c->n_levels - 1] + SK_SPARSE_LEVEL_EPS))
        BAD("levels must ascend");
      for (uint32_t l = 0; l < n_layer; l++)
        if (!isfinite(vals[1 + l]) || vals[1 + l] < 0.0f)
          BAD("threshold %u of level %g is %g, expected a finite value >= 0", l, (double)s,
              (double)vals[1 + l]);
      c->level[c->n_levels] = s;
      memcpy(c->thr + (size_t)c->n_levels * n_layer, vals + 1, n_layer * sizeof *vals);
      c->n_levels++;
    } else if (line[0] == '\n' || line[0] == '#') {
      continue;
    } else {
      BAD("unknown line");
    }
  }
  if (ferror(f)) {
    rc = sk_error_set(err, SK_ERR_IO, "sparsity calibration %s: %s", path, strerror(errno));
    goto out;
  }
  lineno = 0;
  if (lineno == 0 && (!have_fp || !have_layers || c->n_levels == 0)) {
    rc = sk_error_set(err, SK_ERR_BAD_REQUEST,
                      "sparsity calibration %s: needs the fingerprint, layers and at least "
                      "one level line",
                      path);
    goto out;
  }
#undef BAD
out:
  fclose(f);
  if (rc < 0) sk_sparse_calib_free(c);
  return rc;
}

/* ---- collecting ------------------------------------------------------- */

struct sk_sparse_collect {
  uint32_t n_layer, hidden, cap;
  uint64_t stride;   /* keep every stride-th value of a layer's stream */
  uint64_t *pos;     /* (n_layer) values seen */
  uint32_t *count;   /* (n_layer) values kept */
  float *v;          /* (n_layer, cap) |silu(g)| */
};

int sk_sparse_collect_new(uint32_t n_layer, uint32_t hidden, uint64_t n_tokens,
                          uint32_t max_per_layer, struct sk_sparse_collect **ret,
                          struct sk_error *err) {
  struct sk_sparse_collect *c = calloc(1, sizeof *c);
  if (!c) return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate the calibration");
  c->n_layer = n_layer;
  c->hidden = hidden;
  c->cap = max_per_layer;
  const uint64_t total = n_tokens * hidden;
  c->stride = total > max_per_layer ? (total + max_per_layer - 1) / max_per_layer : 1;
  c->pos = calloc(n_layer, sizeof *c->pos);
  c->count = calloc(n_layer, sizeof *c->count);
  c->v = malloc((size_t)n_layer * max_per_layer * sizeof *c->v);
  if (!c->pos || !c->count || !c->v) {
    sk_sparse_collect_free(c);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate %u x %u calibration samples",
                        n_layer, max_per_layer);
  }
  *ret = c;
  return 0;
}

void sk_sparse_collect_free(struct sk_sparse_collect *c) {
  if (!c) return;
  free(c->pos);
  free(c->count);
  free(c->v);
  free(c);
}

void sk_sparse_collect_add(struct sk_sparse_collect *c, uint32_t l, const float *gate,
                           uint32_t n) {
  float *dst = c->v + (size_t)l * c->cap;
  const uint64_t total = (uint64_t)n * c->hidden;
  for (uint64_t i = 0; i < total; i++, c->pos[l]++) {
    if (c->pos[l] % c->stride || c->count[l] >= c->cap) continue;
    const float g = gate[i];
    dst[c->count[l]++] = fabsf(g / (1.0f + expf(-g)));
  }
}

static int sk__cmp_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

int sk_sparse_collect_thresholds(struct sk_sparse_collect *c, const float *levels,
                                 uint32_t n_levels, struct sk_sparse_calib *out,
                                 struct sk_error *err) {
  if (n_levels == 0 || n_levels > SK_SPARSE_MAX_LEVELS)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "expected 1..%u levels", SK_SPARSE_MAX_LEVELS);
  for (uint32_t i = 0; i < n_levels; i++)
    if (!(levels[i] > 0.0f && levels[i] < 1.0f) ||
        (i && !(levels[i] > levels[i - 1] + SK_SPARSE_LEVEL_EPS)))
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "levels must ascend inside (0, 1); level %u is %g", i,
                          (double)levels[i]);
  for (uint32_t l = 0; l < c->n_layer; l++)
    if (c->count[l] == 0)
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "no calibration values for layer %u", l);
  memset(out, 0, sizeof *out);
  out->n_layer = c->n_layer;
  out->n_levels = n_levels;
  out->thr = malloc((size_t)n_levels * c->n_layer * sizeof *out->thr);
  out->measured = malloc((size_t)n_levels * c->n_layer * sizeof *out->measured);
  if (!out->thr || !out->measured) {
    sk_sparse_calib_free(out);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate thresholds");
  }
  memcpy(out->level, levels, n_levels * sizeof *levels);
  for (uint32_t l = 0; l < c->n_layer; l++) {
    float *v = c->v + (size_t)l * c->cap;
    const uint32_t cnt = c->count[l];
    qsort(v, cnt, sizeof *v, sk__cmp_float);
    for (uint32_t i = 0; i < n_levels; i++) {
      /* the smallest t with at least level * cnt samples <= t */
      double want = ceil((double)levels[i] * cnt);
      uint32_t k = want < 1.0 ? 0 : (uint32_t)want - 1;
      if (k >= cnt) k = cnt - 1;
      const float t = v[k];
      uint32_t le = k + 1;
      while (le < cnt && v[le] <= t) le++;
      out->thr[(size_t)i * c->n_layer + l] = t;
      out->measured[(size_t)i * c->n_layer + l] = (float)le / (float)cnt;
    }
  }
  return 0;
}

/* ---- the transposed down projection ----------------------------------- */

/* The type down_t gets for a down projection of type t with dim outputs. */
static uint32_t sk__down_t_type(uint32_t t, uint32_t dim) {
  switch (t) {
  case SK_GGML_F32:
  case SK_GGML_F16: return t;
  case SK_GGML_Q8_0:
  case SK_GGML_Q4_0: return dim % SK_QK == 0 ? t : SK_GGML_F32;
  default: return dim % SK_QK == 0 ? SK_GGML_Q8_0 : SK_GGML_F32;
  }
}

int sk_sparse_transpose(const struct sk_wmat *w, struct sk_wmat *ret, void **ret_mem,
                        struct sk_error *err) {
  const uint32_t dim = w->rows, hidden = w->cols;
  const uint32_t type = sk__down_t_type(w->type, dim);
  const size_t rb = sk_quant_row_bytes(type, dim);
  float *full = malloc((size_t)dim * hidden * sizeof *full);
  float *col = malloc((size_t)dim * sizeof *col);
  uint8_t *mem = malloc(rb * hidden);
  if (!full || !col || !mem || rb == 0) {
    free(full);
    free(col);
    free(mem);
    return rb == 0 ? sk_error_set(err, SK_ERR_BAD_MODEL, "down projection of %u outputs "
                                  "cannot be held as %s", dim, sk_ggml_type_name(type))
                   : sk_error_set(err, SK_ERR_NO_MEMORY,
                                  "cannot allocate the transposed down projection (%u x %u)",
                                  hidden, dim);
  }
  int rc = 0;
  for (uint32_t o = 0; o < dim; o++)
    if (sk_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)o * w->row_bytes, hidden,
                          full + (size_t)o * hidden) < 0) {
      rc = sk_error_set(err, SK_ERR_BAD_MODEL, "cannot read %s weights for the sparse MLP",
                        sk_ggml_type_name(w->type));
      goto out;
    }
  for (uint32_t j = 0; j < hidden; j++) {
    for (uint32_t o = 0; o < dim; o++) col[o] = full[(size_t)o * hidden + j];
    uint8_t *dst = mem + (size_t)j * rb;
    switch (type) {
    case SK_GGML_F32: memcpy(dst, col, rb); break;
    case SK_GGML_F16:
      for (uint32_t o = 0; o < dim; o++) {
        uint16_t h = sk_f32_to_f16(col[o]);
        memcpy(dst + 2 * (size_t)o, &h, 2);
      }
      break;
    case SK_GGML_Q8_0: sk_quantize_row_q8_0(col, dim, (struct sk_block_q8_0 *)dst); break;
    default: sk_quantize_row_q4_0(col, dim, (struct sk_block_q4_0 *)dst); break;
    }
  }
  *ret = (struct sk_wmat){.type = type, .rows = hidden, .cols = dim, .row_bytes = rb,
                          .data = mem};
  *ret_mem = mem;
  mem = NULL;
out:
  free(full);
  free(col);
  free(mem);
  return rc;
}

uint64_t sk_sparse_row_bytes(const struct sk_sparse_mlp *w, uint64_t kept) {
  return kept * ((uint64_t)w->up.row_bytes + w->down_t.row_bytes);
}

/* ---- one token ---------------------------------------------------------- */

int sk_sparse_work_init(struct sk_sparse_work *w, uint32_t hidden, uint32_t dim,
                        uint32_t n_threads, struct sk_error *err) {
  memset(w, 0, sizeof *w);
  w->hidden = hidden;
  w->dim = dim;
  w->n_threads = n_threads;
  w->idx = malloc((size_t)hidden * sizeof *w->idx);
  w->u = malloc((size_t)hidden * sizeof *w->u);
  w->g = malloc((size_t)hidden * sizeof *w->g);
  w->uk = malloc((size_t)hidden * sizeof *w->uk);
  w->tmp = malloc((size_t)n_threads * 2 * dim * sizeof *w->tmp);
  if (!w->idx || !w->u || !w->g || !w->uk || !w->tmp) {
    sk_sparse_work_free(w);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot allocate the sparse MLP's buffers");
  }
  return 0;
}

void sk_sparse_work_free(struct sk_sparse_work *w) {
  free(w->idx);
  free(w->u);
  free(w->g);
  free(w->uk);
  free(w->tmp);
  memset(w, 0, sizeof *w);
}

struct sk__row {
  const struct sk_sparse_mlp *w;
  const struct sk_act *x;
  struct sk_sparse_work *wk;
  uint32_t nk;       /* |K| */
  uint32_t per;      /* kept neurons (up) or outputs (down) per task */
  float *y;
};

/* Up products of the kept neurons [task * per, +per): one kernel call per
 * run of consecutive neurons, each output written at its neuron. */
static void sk__up_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct sk__row *r = ctx;
  const uint32_t *idx = r->wk->idx;
  uint32_t k = task * r->per, k1 = k + r->per < r->nk ? k + r->per : r->nk;
  float *const urow[1] = {r->wk->u};
  while (k < k1) {
    uint32_t a = idx[k], b = a + 1;
    for (k++; k < k1 && idx[k] == b; k++) b++;
    sk_kernels_matmul(&r->w->up, r->x, urow, a, b);
  }
}

/* Rows of down_t summed apart before they join the output. */
#define SK__GROUP 16u

/* acc[0..len) += h[k] * row k of down_t's outputs, for k in [k0, k1), in
 * order of k, each row at rows[k] (already offset to the first output).
 * Q8_0 is added per block as fmaf(h * d, q, acc), without dequantizing:
 * the same bits in both versions below. Other types: dequantized into tmp
 * (sk_dequantize_row) and added by sk_kernels_axpy. */
static void sk__add_rows_generic(uint32_t type, const uint8_t *const *rows, const float *h,
                                 uint32_t n, uint32_t len, float *acc, float *tmp) {
  for (uint32_t k = 0; k < n; k++) {
    if (type == SK_GGML_Q8_0) {
      const struct sk_block_q8_0 *b = (const void *)rows[k];
      for (uint32_t i = 0; i < len / SK_QK; i++) {
        const float hd = h[k] * sk_f16_to_f32(b[i].d);
        float *a = acc + (size_t)i * SK_QK;
        for (uint32_t j = 0; j < SK_QK; j++) a[j] = fmaf(hd, (float)b[i].qs[j], a[j]);
      }
    } else if (type == SK_GGML_F32) {
      sk_kernels_axpy(acc, h[k], (const float *)(const void *)rows[k], len);
    } else {
      sk_dequantize_row(type, rows[k], len, tmp);
      sk_kernels_axpy(acc, h[k], tmp, len);
    }
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SK__HAVE_X86 1
/* Q8_0 on AVX2 + FMA + F16C: four rows per pass over acc, so that each 8
 * outputs are loaded and stored once for four rows (the int8 -> float
 * conversions are the work; acc stays in L1). */
__attribute__((target("avx2,fma,f16c"))) static void sk__add_rows_q8_avx2(
    const uint8_t *const *rows, const float *h, uint32_t n, uint32_t len, float *acc) {
  const uint32_t nb = len / SK_QK;
  uint32_t k = 0;
  for (; k + 4 <= n; k += 4) {
    const struct sk_block_q8_0 *b0 = (const void *)rows[k], *b1 = (const void *)rows[k + 1];
    const struct sk_block_q8_0 *b2 = (const void *)rows[k + 2], *b3 = (const void *)rows[k + 3];
    for (uint32_t i = 0; i < nb; i++) {
      const __m256 d0 = _mm256_set1_ps(h[k] * _cvtsh_ss(b0[i].d));
      const __m256 d1 = _mm256_set1_ps(h[k + 1] * _cvtsh_ss(b1[i].d));
      const __m256 d2 = _mm256_set1_ps(h[k + 2] * _cvtsh_ss(b2[i].d));
      const __m256 d3 = _mm256_set1_ps(h[k + 3] * _cvtsh_ss(b3[i].d));
      float *a = acc + (size_t)i * SK_QK;
#define SK__Q(b, j) \
  _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)((b)[i].qs + (j)))))
      for (uint32_t j = 0; j < SK_QK; j += 8) {
        __m256 v = _mm256_loadu_ps(a + j);
        v = _mm256_fmadd_ps(d0, SK__Q(b0, j), v);
        v = _mm256_fmadd_ps(d1, SK__Q(b1, j), v);
        v = _mm256_fmadd_ps(d2, SK__Q(b2, j), v);
        v = _mm256_fmadd_ps(d3, SK__Q(b3, j), v);
        _mm256_storeu_ps(a + j, v);
      }
    }
  }
  for (; k < n; k++) {
    const struct sk_block_q8_0 *b0 = (const void *)rows[k];
    for (uint32_t i = 0; i < nb; i++) {
      const __m256 d0 = _mm256_set1_ps(h[k] * _cvtsh_ss(b0[i].d));
      float *a = acc + (size_t)i * SK_QK;
      for (uint32_t j = 0; j < SK_QK; j += 8)
        _mm256_storeu_ps(a + j, _mm256_fmadd_ps(d0, SK__Q(b0, j), _mm256_loadu_ps(a + j)));
    }
  }
#undef SK__Q
}
#endif

/* Whether the selected kernels run AVX2 (every x86 variant but generic). */
static bool sk__use_avx2(void) {
#ifdef SK__HAVE_X86
  return strcmp(sk_kernels_name(), "generic") != 0;
#else
  return false;
#endif
}

/* Outputs [task * per, +per) of y: the kept rows of down_t, in order of
 * K, each (its blocks of that range) added times h. */
static void sk__down_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__row *r = ctx;
  const struct sk_wmat *d = &r->w->down_t;
  const uint32_t o0 = task * r->per;
  if (o0 >= d->cols) return;
  const uint32_t o1 = o0 + r->per < d->cols ? o0 + r->per : d->cols, len = o1 - o0;
  const uint32_t bs = d->type == SK_GGML_F32 || d->type == SK_GGML_F16 ? 1 : SK_QK;
  const size_t off = sk_quant_row_bytes(d->type, bs) * (o0 / bs);
  const size_t span = sk_quant_row_bytes(d->type, bs) * (len / bs);
  float *y = r->y + o0, *tmp = r->wk->tmp + (size_t)thread * 2 * r->wk->dim;
  float *acc = tmp + len;
  const float *h = r->wk->g;
  const uint32_t *idx = r->wk->idx;
  const uint8_t *base = (const uint8_t *)d->data + off;
  const bool avx2 = d->type == SK_GGML_Q8_0 && sk__use_avx2();
  (void)avx2; /* (only x86 builds have the AVX2 version) */
  memset(y, 0, len * sizeof *y);
  /* sums of SK__GROUP rows at a time in acc, each then added to y: a
   * two-level sum, whose rounding error grows with the group and the
   * number of groups rather than with |K| */
  for (uint32_t k0 = 0; k0 < r->nk; k0 += SK__GROUP) {
    const uint32_t n = r->nk - k0 < SK__GROUP ? r->nk - k0 : SK__GROUP;
    const uint8_t *rows[SK__GROUP];
    for (uint32_t k = 0; k < n; k++) rows[k] = base + (size_t)idx[k0 + k] * d->row_bytes;
    /* the rows are scattered: no stream for the prefetcher to follow */
    for (uint32_t k = k0 + SK__GROUP; k < k0 + 2 * SK__GROUP && k < r->nk; k++) {
      const uint8_t *nx = base + (size_t)idx[k] * d->row_bytes;
      for (size_t b = 0; b < span; b += 64) __builtin_prefetch(nx + b);
    }
    memset(acc, 0, len * sizeof *acc);
#ifdef SK__HAVE_X86
    if (avx2) sk__add_rows_q8_avx2(rows, h + k0, n, len, acc);
    else
#endif
      sk__add_rows_generic(d->type, rows, h + k0, n, len, acc, tmp);
    sk_kernels_axpy(y, 1.0f, acc, len);
  }
}

uint32_t sk_sparse_mlp_row(const struct sk_sparse_mlp *w, const float *gate, float thr,
                           const struct sk_act *x, float *y, struct sk_sparse_work *wk,
                           struct sk_pool *pool) {
  const uint32_t H = w->up.rows, T = sk_pool_threads(pool);
  uint32_t nk = 0;
  for (uint32_t j = 0; j < H; j++) {
    const float g = gate[j];
    if (fabsf(g / (1.0f + expf(-g))) > thr) wk->idx[nk++] = j;
  }
  struct sk__row r = {.w = w, .x = x, .wk = wk, .nk = nk, .y = y};
  if (nk) {
    const uint32_t n_tasks = T == 1 ? 1 : 4 * T;
    r.per = (nk + n_tasks - 1) / n_tasks;
    sk_pool_run(pool, sk__up_task, &r, (nk + r.per - 1) / r.per);
    for (uint32_t k = 0; k < nk; k++) {
      wk->g[k] = gate[wk->idx[k]];
      wk->uk[k] = wk->u[wk->idx[k]];
    }
    sk_kernels_swiglu(wk->g, wk->uk, nk);
  }
  /* outputs split in whole blocks of down_t's type */
  const uint32_t dim = w->down_t.cols;
  const uint32_t bs = w->down_t.type == SK_GGML_F32 || w->down_t.type == SK_GGML_F16 ? 16 : SK_QK;
  uint32_t per = (dim + T - 1) / T;
  per = (per + bs - 1) / bs * bs;
  if (per > dim) per = dim;
  r.per = per;
  sk_pool_run(pool, sk__down_task, &r, (dim + per - 1) / per);
  return nk;
}
