/* sinkd-kbench: times the matrix products of kernel variants against
 * each other in one process, on one thread. For each weight type (Q8_0,
 * Q4_0, F32), matrix shape (the 110M model's: 768x768, 2048x768,
 * 768x2048, 32000x768, rows x cols) and activation row count, the
 * variants take turns, sample after sample, so that other load on the
 * machine falls on all of them alike; it prints the median time of one
 * product per variant, and whether the variants' outputs are identical.
 *
 *   sinkd-kbench [--samples N] [--rows LIST] [VARIANT...]
 *   sinkd-kbench --membw MIB [--samples N]
 *   sinkd-kbench --decode [--rows N] [--threads N] [--samples N] [VARIANT...]
 *
 * Defaults: 31 samples, rows 1,16, variants avx2-vnni avx512-vnni (the
 * ones this CPU runs). --membw instead times a sequential read of a
 * buffer of MIB MiB by 1 and by 2 threads (each reads its half), then the
 * same read in 8 streams per thread (each thread's half cut in 8, read
 * side by side), and prints the median and best GB/s: the ceiling of a
 * decode step that reads every weight once, for weights that do not stay
 * in the CPU's caches (on Intel CPUs the one-row products read 4 or 8
 * streams, and several streams read faster there than one).
 * --decode times the products of one decode step of the 110M shape (12
 * layers of 768x768 x 4, 2048x768 x 2 and 768x2048, then the 32000x768
 * output; 438 MB in F32, 116 MB in Q8_0, 62 MB in Q4_0 and Q4_K) in
 * the model's order, for F32, Q8_0, Q4_0, Q4_K and Q6_K weights or the
 * types of --types (GGUF names, e.g. q2_K,q3_K,iq4_xs), each matrix in
 * its own buffer, and prints ms per step and GB/s (--cpu-time: the
 * process's CPU time instead of the wall clock, which with one thread
 * leaves out the time other processes of a busy machine take) (default
 * variant: the best this CPU runs; --threads N: on a pool of N
 * threads cut as the daemon cuts them): how close a kernel streams
 * weights from DRAM to --membw's figure, without a daemon's noise; with
 * --rows N (one number; default 1), products of N activation rows each
 * (a step of N sessions). A
 * development tool, not a test. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "model/gguf.h"
#include "model/kernels.h"
#include "model/pool.h"
#include "model/quant.h"
#include "tool.h"

#define MAX_VARIANTS 4

static uint64_t rng = 12345;
static float frand(void) { /* uniform in [-1, 1) */
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}


static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) sk_cli_die(1, "out of memory");
  return p;
}

static void select_or_die(const char *name) {
  struct sk_error err = {0};
  if (sk_kernels_select(name, &err) < 0) sk_cli_die(1, "%s", err.message);
}

/* ---- memory read bandwidth (--membw) ---- */

struct membw_part {
  const void *p;
  size_t n;       /* 64-byte lines */
  size_t streams; /* contiguous shares of the lines, read side by side */
  uint64_t sum;
};

/* Sum of the words of part's lines, V bytes per vector (GNU C vector
 * extension), four accumulators: the loop the compiler keeps in registers.
 * Wide loads matter: one thread reads ~30% faster with 64-byte vectors
 * than with 16-byte ones on the project's machine. The lines are cut into
 * part->streams contiguous shares read side by side, 4 vectors of each
 * in turn: one stream is a plain sequential read; on Intel CPUs several
 * read faster (kernels-avx512.inc, sk__v512_streams). */
#define MEMBW_READ(name, V, attr)                                            \
  attr static void *name(void *arg) {                                       \
    typedef uint64_t vec __attribute__((vector_size(V)));                   \
    struct membw_part *part = arg;                                          \
    const vec *p = part->p;                                                 \
    const size_t per = part->n / part->streams * (64 / (V));                \
    vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};                             \
    for (size_t i = 0; i + 4 <= per; i += 4) {                              \
      for (size_t k = 0; k < part->streams; k++) {                          \
        const vec *q = p + k * per + i;                                     \
        s0 += q[0];                                                         \
        s1 += q[1];                                                         \
        s2 += q[2];                                                         \
        s3 += q[3];                                                         \
      }                                                                     \
    }                                                                       \
    s0 += s1 + s2 + s3;                                                     \
    uint64_t sum = 0;                                                       \
    for (size_t k = 0; k < (V) / 8; k++) sum += s0[k];                      \
    part->sum = sum;                                                        \
    return NULL;                                                            \
  }
MEMBW_READ(membw_read16, 16, )
#if defined(__x86_64__) && defined(__GNUC__)
MEMBW_READ(membw_read64, 64, __attribute__((target("avx512f"))))
#endif

static volatile uint64_t membw_sink;

/* Median and best GB/s of `samples` reads of buf (n 64-byte lines) by `threads`
 * threads, each reading a contiguous share in `streams` streams. */
static void membw_run(const uint8_t *buf, size_t n, int threads, size_t streams, int samples) {
  void *(*read)(void *) = membw_read16;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) read = membw_read64;
#endif
  double *gbs = xmalloc((size_t)samples * sizeof *gbs);
  uint64_t check = 0;
  for (int smp = 0; smp < samples; smp++) {
    struct membw_part part[2];
    pthread_t th[2];
    double t0 = sk_cli_now_s();
    for (int k = 0; k < threads; k++) {
      part[k] = (struct membw_part){
          .p = buf + (size_t)64 * (n / threads * k), .n = n / threads, .streams = streams};
      if (pthread_create(&th[k], NULL, read, &part[k]) != 0) sk_cli_die(1, "cannot start a thread");
    }
    for (int k = 0; k < threads; k++) {
      pthread_join(th[k], NULL);
      check += part[k].sum;
    }
    const size_t lines = n / threads / streams * streams * threads; /* read (whole shares) */
    gbs[smp] = (double)lines * 64 / (sk_cli_now_s() - t0) / 1e9;
  }
  qsort(gbs, (size_t)samples, sizeof *gbs, sk_tool_cmp_double);
  membw_sink = check; /* the sums are used: the reads stay */
  char each[48] = "";
  if (streams > 1)
    snprintf(each, sizeof each, ", %zu streams%s", streams, threads > 1 ? " each" : "");
  printf("read %zu MiB, %d thread%s%s: median %.1f GB/s, best %.1f GB/s\n", n * 64 >> 20,
         threads, threads > 1 ? "s" : "", each, gbs[samples / 2], gbs[samples - 1]);
  free(gbs);
}

static int membw(size_t mib, int samples) {
  const size_t n = (mib << 20) / 64;
  uint8_t *buf = aligned_alloc(64, n * 64);
  if (!buf) sk_cli_die(1, "out of memory");
  for (size_t i = 0; i < n * 64; i++) buf[i] = (uint8_t)i; /* touch every page */
  const size_t streams[] = {1, 8};
  for (size_t k = 0; k < 2; k++)
    for (int threads = 1; threads <= 2; threads++) membw_run(buf, n, threads, streams[k], samples);
  free(buf);
  return 0;
}

/* ---- one decode token's products (--decode) ---- */

#define DECODE_LAYERS 12
#define DECODE_MATS (DECODE_LAYERS * 7 + 1)

/* The matrices of one decode token of the 110M shape, in the order a
 * forward pass multiplies them, with random weights of the given type,
 * packed for the selected variant. */
static void decode_mats(uint32_t type, struct sk_wmat *w, void **mem, uint8_t **data) {
  const uint32_t layer[7][2] = {{768, 768},  {768, 768},  {768, 768}, {768, 768},
                                {2048, 768}, {2048, 768}, {768, 2048}};
  for (int i = 0; i < DECODE_MATS; i++) {
    const uint32_t rows = i < DECODE_LAYERS * 7 ? layer[i % 7][0] : 32000;
    const uint32_t cols = i < DECODE_LAYERS * 7 ? layer[i % 7][1] : 768;
    const size_t rb = sk_quant_row_bytes(type, cols);
    data[i] = xmalloc(rb * rows);
    float *row = xmalloc(cols * sizeof *row);
    for (uint32_t r = 0; r < rows; r++) {
      for (uint32_t c = 0; c < cols; c++) row[c] = frand();
      if (type == SK_GGML_Q8_0) sk_quantize_row_q8_0(row, cols, (void *)(data[i] + r * rb));
      else if (type == SK_GGML_Q4_0) sk_quantize_row_q4_0(row, cols, (void *)(data[i] + r * rb));
      else if (type == SK_GGML_F32) memcpy(data[i] + r * rb, row, rb);
      else { /* random valid blocks: speed does not depend on the values */
        uint64_t seed = (uint64_t)i * 100003u + r + 1;
        sk_quant_random_row(type, cols, 1.0f, &seed, data[i] + r * rb);
      }
    }
    free(row);
    w[i] = (struct sk_wmat){.type = type, .rows = rows, .cols = cols, .row_bytes = rb,
                            .data = data[i]};
    struct sk_error err = {0};
    if (sk_kernels_pack(&w[i], &mem[i], &err) < 0) sk_cli_die(1, "%s", err.message);
  }
}

/* One product of a decode token, cut as the daemon's forward pass cuts
 * it: tasks of SK__MM_ALIGN-multiple output rows, about four per thread
 * (forward.c, sk__matmuls). */
struct decode_mm {
  const struct sk_wmat *w;
  const struct sk_act *a;
  float *const *y;
  uint32_t chunk;
};

static void decode_task(void *ctx, uint32_t task, uint32_t thread) {
  (void)thread;
  const struct decode_mm *mm = ctx;
  uint32_t o0 = task * mm->chunk, o1 = o0 + mm->chunk < mm->w->rows ? o0 + mm->chunk : mm->w->rows;
  sk_kernels_matmul(mm->w, mm->a, mm->y, o0, o1);
}

/* Seconds of CPU time the process has used (--cpu-time). */
static double cpu_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int decode(const char *const *variants, int nv, int samples, uint32_t threads, uint32_t n,
                  const uint32_t *types, size_t n_types, bool cpu) {
  struct sk_pool *pool = NULL;
  struct sk_error perr = {0};
  if (threads > 1 && sk_pool_new(threads, &pool, &perr) < 0) {
    sk_cli_note("%s", perr.message);
    return 1;
  }
  const uint32_t per_thread = 4;
  for (size_t ti = 0; ti < n_types; ti++) {
    static struct sk_wmat w[MAX_VARIANTS][DECODE_MATS];
    static void *mem[MAX_VARIANTS][DECODE_MATS];
    static uint8_t *data[MAX_VARIANTS][DECODE_MATS];
    double bytes = 0;
    for (int v = 0; v < nv; v++) { /* each variant its own copy: none reads warm data */
      select_or_die(variants[v]);
      decode_mats(types[ti], w[v], mem[v], data[v]);
    }
    for (int i = 0; i < DECODE_MATS; i++) bytes += (double)w[0][i].row_bytes * w[0][i].rows;
    /* n activation rows of up to 2048 columns (row stride 2048) */
    float *x = xmalloc((size_t)n * 2048 * sizeof *x), *y = xmalloc((size_t)n * 32000 * sizeof *y);
    float **yr = xmalloc(n * sizeof *yr);
    int8_t *q = xmalloc((size_t)n * 2048);
    float *d = xmalloc((size_t)n * (2048 / SK_QK) * sizeof *d);
    int32_t *qs = xmalloc((size_t)n * (2048 / SK_QK) * sizeof *qs);
    int8_t *kq = xmalloc((size_t)n * 2048);
    float *kd = xmalloc((size_t)n * (2048 / SK_QKK) * sizeof *kd);
    int16_t *ks = xmalloc((size_t)n * (2048 / 16) * sizeof *ks);
    for (uint32_t r = 0; r < n; r++) yr[r] = y + (size_t)r * 32000;
    for (size_t k = 0; k < (size_t)n * 2048; k++) x[k] = frand();
    double *t = xmalloc((size_t)nv * (size_t)samples * sizeof *t);
    for (int smp = -1; smp < samples; smp++) { /* -1: warm-up */
      for (int k = 0; k < nv; k++) {
        int v = (smp + 1 + k) % nv;
        select_or_die(variants[v]);
        double t0 = cpu ? cpu_now_s() : sk_cli_now_s();
        for (int i = 0; i < DECODE_MATS; i++) {
          const uint32_t cols = w[v][i].cols;
          if (sk_wmat_needs_q8(&w[v][i])) sk_kernels_quantize_rows(x, 2048, n, cols, q, d, qs);
          if (sk_wmat_needs_q8k(&w[v][i])) sk_kernels_quantize_rows_k(x, 2048, n, cols, kq, kd, ks);
          const struct sk_act a = {.n = n, .cols = cols, .f = x, .ldf = 2048, .q = q, .d = d,
                                   .s = qs, .kq = kq, .kd = kd, .ks = ks};
          struct decode_mm mm = {.w = &w[v][i], .a = &a, .y = yr, .chunk = w[v][i].rows};
          if (threads > 1) {
            uint32_t per = w[v][i].rows / (per_thread * threads) + 1;
            mm.chunk = (per + 15) / 16 * 16;
          }
          sk_pool_run(pool, decode_task, &mm, (w[v][i].rows + mm.chunk - 1) / mm.chunk);
        }
        if (smp >= 0) t[v * samples + smp] = (cpu ? cpu_now_s() : sk_cli_now_s()) - t0;
      }
    }
    printf("decode %s, 110M shape, %.1f MB per step, %u row%s, %u thread%s:\n",
           sk_ggml_type_name(types[ti]), bytes / 1e6, n, n > 1 ? "s" : "", threads,
           threads > 1 ? "s" : "");
    for (int v = 0; v < nv; v++) {
      qsort(t + v * samples, (size_t)samples, sizeof *t, sk_tool_cmp_double);
      double med = t[v * samples + samples / 2], best = t[v * samples];
      printf("  %-12s median %.2f ms (%.1f GB/s), best %.2f ms (%.1f GB/s)\n", variants[v],
             med * 1e3, bytes / med / 1e9, best * 1e3, bytes / best / 1e9);
      for (int i = 0; i < DECODE_MATS; i++) {
        free(mem[v][i]);
        free(data[v][i]);
      }
    }
    fflush(stdout);
    free(t);
    free(x);
    free(y);
    free(yr);
    free(q);
    free(d);
    free(qs);
    free(kq);
    free(kd);
    free(ks);
  }
  sk_pool_free(pool);
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: sinkd-kbench [--samples N] [--rows LIST] [VARIANT...]\n"
             "       sinkd-kbench --membw MIB [--samples N]\n"
             "       sinkd-kbench --decode [--rows N] [--threads N] [--samples N] [--types LIST]\n"
             "                    [--cpu-time] [VARIANT...]\n"
             "VARIANT: a kernel variant (as SINKD_KERNEL names it); this CPU runs: %s.\n"
             "Exit status: 0 done, 1 a variant this CPU does not run, 2 usage error.\n",
          sk_kernels_available());
}

/* The value of the option at argv[*i], the next argument; exits 2 when
 * there is none. */
static const char *opt_value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    sk_cli_usage_error("%s needs a value", argv[*i]);
  }
  return argv[++*i];
}

/* The weight types of a comma-separated list of GGUF type names
 * (sk_ggml_type_name's, e.g. "q4_K,q6_K"); exits 2 on an unknown or
 * unsupported name. Returns the count. */
static size_t parse_types(const char *list, uint32_t *types, size_t max) {
  size_t n = 0;
  while (*list) {
    size_t len = strcspn(list, ",");
    uint32_t t = 0;
    for (; t < 64; t++)
      if (sk_quant_supported(t) && strlen(sk_ggml_type_name(t)) == len &&
          strncmp(sk_ggml_type_name(t), list, len) == 0)
        break;
    if (t == 64 || n == max) sk_cli_usage_error("--types: bad list '%s'", list);
    types[n++] = t;
    list += len + (list[len] == ',');
  }
  if (n == 0) sk_cli_usage_error("--types: empty list");
  return n;
}

/* The default mode: the products of Q8_0, Q4_0 and F32 matrices of the
 * 110M shapes with n = each of rows_list[0..n_rows) activation rows, on
 * each variant (median of `samples`, the variants taking turns at going
 * first), and whether their outputs are identical. Returns the exit
 * status. */
static int products(const char *const *variants, int nv, int samples, const uint32_t *rows_list,
                    uint32_t n_rows) {
  const uint32_t types[] = {SK_GGML_Q8_0, SK_GGML_Q4_0, SK_GGML_F32};
  const uint32_t shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}};
  printf("%-5s %-10s %4s", "type", "shape", "n");
  for (int v = 0; v < nv; v++) printf(" %14s", variants[v]);
  printf("  %-8s %s\n", "ratio", "outputs");
  double *t = xmalloc((size_t)nv * (size_t)samples * sizeof *t);
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    for (size_t si = 0; si < 4; si++) {
      const uint32_t rows = shapes[si][0], cols = shapes[si][1], nb = cols / SK_QK;
      const size_t rb = sk_quant_row_bytes(types[ti], cols);
      uint8_t *data = xmalloc(rb * rows);
      float *row = xmalloc(cols * sizeof *row);
      for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t c = 0; c < cols; c++) row[c] = frand();
        if (types[ti] == SK_GGML_Q8_0) sk_quantize_row_q8_0(row, cols, (void *)(data + r * rb));
        else if (types[ti] == SK_GGML_Q4_0) sk_quantize_row_q4_0(row, cols, (void *)(data + r * rb));
        else memcpy(data + r * rb, row, rb);
      }
      free(row);
      struct sk_wmat w[MAX_VARIANTS];
      void *mem[MAX_VARIANTS];
      for (int v = 0; v < nv; v++) {
        struct sk_error err = {0};
        select_or_die(variants[v]);
        w[v] = (struct sk_wmat){.type = types[ti], .rows = rows, .cols = cols, .row_bytes = rb,
                                .data = data};
        if (sk_kernels_pack(&w[v], &mem[v], &err) < 0) {
          sk_cli_note("%s", err.message);
          return 1;
        }
      }
      for (uint32_t ni = 0; ni < n_rows; ni++) {
        const uint32_t n = rows_list[ni];
        float *x = xmalloc((size_t)n * cols * sizeof *x);
        int8_t *q = xmalloc((size_t)n * cols);
        float *d = xmalloc((size_t)n * nb * sizeof *d);
        int32_t *s = xmalloc((size_t)n * nb * sizeof *s);
        for (size_t k = 0; k < (size_t)n * cols; k++) x[k] = frand();
        sk_kernels_quantize_rows(x, cols, n, cols, q, d, s);
        const struct sk_act a = {.n = n, .cols = cols, .f = x, .ldf = cols, .q = q, .d = d,
                                 .s = s};
        float *y = xmalloc((size_t)nv * n * rows * sizeof *y);
        float **yr = xmalloc((size_t)nv * n * sizeof *yr);
        for (int v = 0; v < nv; v++)
          for (uint32_t i = 0; i < n; i++) yr[v * n + i] = y + ((size_t)v * n + i) * rows;
        /* calls per sample: about 2 ms of work at ~20 GB/s */
        const double bytes = (double)rb * rows * (n > 4 ? 4 : 1);
        int calls = (int)(4e7 / bytes) + 1;
        for (int v = 0; v < nv; v++) { /* warm up */
          select_or_die(variants[v]);
          sk_kernels_matmul(&w[v], &a, yr + v * n, 0, rows);
        }
        for (int smp = 0; smp < samples; smp++) {
          for (int k = 0; k < nv; k++) {
            int v = (smp + k) % nv; /* alternate which variant goes first */
            select_or_die(variants[v]);
            double t0 = sk_cli_now_s();
            for (int c = 0; c < calls; c++) sk_kernels_matmul(&w[v], &a, yr + v * n, 0, rows);
            t[v * samples + smp] = (sk_cli_now_s() - t0) / calls;
          }
        }
        bool same = true;
        for (int v = 1; v < nv; v++)
          same = same && memcmp(y, y + (size_t)v * n * rows, (size_t)n * rows * sizeof *y) == 0;
        char shape[32];
        snprintf(shape, sizeof shape, "%ux%u", rows, cols);
        printf("%-5s %-10s %4u", sk_ggml_type_name(types[ti]), shape, n);
        double med[MAX_VARIANTS];
        for (int v = 0; v < nv; v++) {
          qsort(t + v * samples, (size_t)samples, sizeof *t, sk_tool_cmp_double);
          med[v] = t[v * samples + samples / 2];
          printf(" %11.1f us", med[v] * 1e6);
        }
        printf("  %-8.3f %s\n", nv > 1 ? med[0] / med[nv - 1] : 1.0,
               same ? "identical" : "DIFFER");
        fflush(stdout);
        free(yr);
        free(y);
        free(x);
        free(q);
        free(d);
        free(s);
      }
      for (int v = 0; v < nv; v++) free(mem[v]);
      free(data);
    }
  }
  free(t);
  return 0;
}

int main(int argc, char **argv) {
  sk_cli_init("sinkd-kbench", "sinkd-kbench --help");
  int samples = 31;
  size_t membw_mib = 0;
  bool decode_mode = false;
  uint32_t threads = 1;
  uint32_t rows_list[8] = {1, 16}, n_rows = 2;
  bool rows_given = false;
  uint32_t dtypes[16] = {SK_GGML_F32, SK_GGML_Q8_0, SK_GGML_Q4_0, SK_GGML_Q4_K, SK_GGML_Q6_K};
  size_t n_dtypes = 5;
  bool cpu_time = false;
  const char *variants[MAX_VARIANTS];
  int nv = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--samples") == 0) {
      samples = (int)sk_cli_parse_u64("--samples", opt_value(argc, argv, &i), 1, 100000);
    } else if (strcmp(argv[i], "--rows") == 0) {
      rows_given = true;
      uint64_t rows[8];
      n_rows = sk_cli_parse_list("--rows", opt_value(argc, argv, &i), rows, 8, 1, 4096);
      for (uint32_t k = 0; k < n_rows; k++) rows_list[k] = (uint32_t)rows[k];
    } else if (strcmp(argv[i], "--membw") == 0) {
      membw_mib = sk_cli_parse_u64("--membw", opt_value(argc, argv, &i), 1, 65536);
    } else if (strcmp(argv[i], "--threads") == 0) {
      threads = (uint32_t)sk_cli_parse_u64("--threads", opt_value(argc, argv, &i), 1, 64);
    } else if (strcmp(argv[i], "--types") == 0) {
      n_dtypes = parse_types(opt_value(argc, argv, &i), dtypes, 16);
    } else if (strcmp(argv[i], "--cpu-time") == 0) {
      cpu_time = true;
    } else if (strcmp(argv[i], "--decode") == 0) {
      decode_mode = true;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (argv[i][0] == '-') {
      sk_cli_usage_error("unknown option %s", argv[i]);
    } else if (!sk_kernels_known(argv[i])) {
      sk_cli_usage_error("unknown kernel variant '%s'", argv[i]);
    } else if (nv < MAX_VARIANTS) {
      variants[nv++] = argv[i];
    }
  }
  if (samples < 1) samples = 1;
  if (membw_mib) return membw(membw_mib, samples);
  static char best[32]; /* --decode: the first variant this CPU runs, the fastest */
  if (decode_mode && nv == 0 && sscanf(sk_kernels_available(), "%31s", best) == 1)
    variants[nv++] = best;
  if (nv == 0) {
    variants[nv++] = "avx2-vnni";
    variants[nv++] = "avx512-vnni";
  }
  for (int v = 0; v < nv; v++)
    if (!sk_kernels_supported(variants[v])) {
      sk_cli_note("this CPU does not run %s (it runs: %s)", variants[v],
                  sk_kernels_available());
      return 1;
    }
  if (decode_mode) {
    if (rows_given && n_rows != 1) {
      sk_cli_usage_error("--decode takes one --rows number, not a list");
    }
    return decode(variants, nv, samples, threads, rows_list[0], dtypes, n_dtypes, cpu_time);
  }

  return products(variants, nv, samples, rows_list, n_rows);
}
