/* The sparse MLP's calibration (sparse.h): the per-layer thresholds
 * collected from a calibration run's gate values (CATS, Lee et al. 2024,
 * sec. 3.2: quantiles of |silu(gate x)|), and the text file that keeps
 * them for a model. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/sparse.h"

#include "base/safefile.h"
#include "sk_limits.h"

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
  /* Read whole as a regular file of bounded size first: a FIFO or a
   * device named here must not hang the daemon's start. */
  char *text = NULL;
  size_t text_len = 0;
  struct sk_error fe;
  if (sk_safefile_read(AT_FDCWD, path, 0, SK_LIMIT_SPARSITY_FILE_BYTES, NULL, &text, &text_len,
                       &fe) < 0)
    return sk_error_set(err, fe.code == SK_ERR_NO_MEMORY ? SK_ERR_NO_MEMORY : SK_ERR_IO,
                        "sparsity calibration: %s", fe.message);
  FILE *f = text_len ? fmemopen(text, text_len, "r") : NULL;
  if (!f) {
    free(text);
    return text_len ? sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory")
                    : sk_error_set(err, SK_ERR_BAD_REQUEST, "sparsity calibration %s: empty",
                                   path);
  }
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
  free(text);
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
