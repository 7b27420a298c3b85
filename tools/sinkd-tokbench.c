/* sinkd-tokbench: times sinkd's tokenizer on a text, and llama.cpp's
 * llama-tokenize on the same text side by side.
 *
 *   sinkd-tokbench [--bytes N] [--rounds R] [--llama-tokenize PATH] VOCAB TEXT
 *
 * Takes the first N bytes of TEXT (default 102400, cut back to a whole
 * UTF-8 character). Each round times, in this process, loading the
 * vocabulary from VOCAB (a GGUF; a vocabulary-only one is enough) plus
 * tokenizing the text without BOS and without parse_special (the wall
 * time a command-line tokenizer spends on its work), and the tokenize
 * alone; with --llama-tokenize, the same round then runs
 *   PATH -m VOCAB -f FILE --ids --no-bos --no-parse-special --no-escape
 *        --log-disable
 * on a file holding the same bytes and times the whole process (its
 * output read from a pipe), and again on a file of one byte (its load
 * alone: the difference estimates its tokenize alone). Rounds alternate
 * them, so that other load on the machine falls on all alike; the
 * medians are printed. The ids llama-tokenize prints in the first round
 * are compared with sinkd's.
 * A development tool, not a test. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tool.h"

static void usage(void) {
  fprintf(stderr,
          "usage: %s [--bytes N] [--rounds R] [--llama-tokenize PATH] VOCAB TEXT\n",
          sk_cli_prog());
  exit(2);
}

static char *read_prefix(const char *path, size_t max, size_t *ret_len) {
  FILE *f = fopen(path, "rb");
  if (!f) sk_cli_die(1, "%s: %s", path, strerror(errno));
  char *buf = malloc(max + 1);
  if (!buf) sk_cli_die(1, "out of memory");
  size_t n = fread(buf, 1, max, f);
  fclose(f);
  /* Cut back to a character boundary. */
  if (n == max)
    while (n > 0 && ((unsigned char)buf[n] & 0xc0) == 0x80) n--;
  *ret_len = n;
  return buf;
}

/* Loads the vocabulary and tokenizes; returns the ids (caller frees). */
static int32_t *sinkd_round(const char *vocab, const char *text, size_t len, size_t *ret_n,
                            double *ret_total, double *ret_encode) {
  double t0 = sk_cli_now_s();
  struct sk_gguf *g = NULL;
  struct sk_tokenizer *tok = NULL;
  struct sk_error err = {0};
  if (sk_gguf_open(vocab, &g, &err) < 0 || sk_tokenizer_load(g, &tok, &err) < 0)
    sk_cli_die(1, "%s: %s", vocab, err.message);
  sk_gguf_close(g);
  double t1 = sk_cli_now_s();
  int32_t *ids = NULL;
  if (sk_tokenizer_encode(tok, text, len, 0, &ids, ret_n, &err) < 0)
    sk_cli_die(1, "tokenize: %s", err.message);
  double t2 = sk_cli_now_s();
  sk_tokenizer_free(tok);
  *ret_total = t2 - t0;
  *ret_encode = t2 - t1;
  return ids;
}

/* Runs llama-tokenize; returns its wall time, and its stdout in *ret_out
 * when ret_out is not NULL. */
static double llama_round(const char *exe, const char *vocab, const char *file,
                          char **ret_out) {
  int fd[2];
  if (pipe(fd) < 0) sk_cli_die(1, "pipe: %s", strerror(errno));
  double t0 = sk_cli_now_s();
  pid_t pid = fork();
  if (pid < 0) sk_cli_die(1, "fork: %s", strerror(errno));
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    execl(exe, exe, "-m", vocab, "-f", file, "--ids", "--no-bos", "--no-parse-special",
          "--no-escape", "--log-disable", (char *)NULL);
    fprintf(stderr, "%s: %s\n", exe, strerror(errno));
    _exit(127);
  }
  close(fd[1]);
  size_t cap = 1 << 20, n = 0;
  char *out = malloc(cap);
  if (!out) sk_cli_die(1, "out of memory");
  for (;;) {
    if (n + 4096 > cap && !(out = realloc(out, cap *= 2))) sk_cli_die(1, "out of memory");
    ssize_t r = read(fd[0], out + n, cap - n - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(fd[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  double dt = sk_cli_now_s() - t0;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) sk_cli_die(1, "%s failed (status %d)", exe, st);
  out[n] = 0;
  if (ret_out)
    *ret_out = out;
  else
    free(out);
  return dt;
}

/* Compares llama-tokenize's "[1, 2, 3]" with ids; prints the verdict. */
static void compare(const char *out, const int32_t *ids, size_t n) {
  const char *p = strchr(out, '[');
  size_t i = 0;
  bool same = p != NULL;
  while (p && *p && *p != ']') {
    p++;
    char *q;
    long v = strtol(p, &q, 10);
    if (q == p) break;
    if (i >= n || v != ids[i]) {
      same = false;
      printf("ids differ at index %zu: llama-tokenize %ld, sinkd %d\n", i, v,
             i < n ? ids[i] : -1);
      return;
    }
    i++;
    p = q;
  }
  if (i != n) same = false;
  printf("ids: %s (%zu from llama-tokenize, %zu from sinkd)\n",
         same ? "identical" : "DIFFERENT", i, n);
}

int main(int argc, char **argv) {
  sk_cli_init("sinkd-tokbench", NULL);
  size_t max = 102400;
  int rounds = 7;
  const char *llama = NULL;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--bytes") == 0 && i + 1 < argc) {
      max = (size_t)sk_cli_parse_u64("--bytes", argv[++i], 1, 1ull << 30);
    } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = (int)sk_cli_parse_u64("--rounds", argv[++i], 1, 1000);
    } else if (strcmp(argv[i], "--llama-tokenize") == 0 && i + 1 < argc) {
      llama = argv[++i];
    } else {
      usage();
    }
  }
  if (argc - i != 2) usage();
  const char *vocab = argv[i], *path = argv[i + 1];
  size_t len;
  char *text = read_prefix(path, max, &len);

  char file[] = "/tmp/sinkd-tokbench-XXXXXX", one[] = "/tmp/sinkd-tokbench-1-XXXXXX";
  if (llama) {
    int fd = mkstemp(file);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len || close(fd) < 0)
      sk_cli_die(1, "%s: %s", file, strerror(errno));
    fd = mkstemp(one);
    if (fd < 0 || write(fd, "a", 1) != 1 || close(fd) < 0)
      sk_cli_die(1, "%s: %s", one, strerror(errno));
  }
  double *tot = calloc((size_t)rounds, sizeof *tot), *enc = calloc((size_t)rounds, sizeof *enc),
         *lt = calloc((size_t)rounds, sizeof *lt), *l1 = calloc((size_t)rounds, sizeof *l1);
  if (!tot || !enc || !lt || !l1) sk_cli_die(1, "out of memory");
  size_t n_ids = 0;
  for (int r = 0; r < rounds; r++) {
    int32_t *ids = sinkd_round(vocab, text, len, &n_ids, &tot[r], &enc[r]);
    if (llama) {
      char *out = NULL;
      lt[r] = llama_round(llama, vocab, file, r == 0 ? &out : NULL);
      l1[r] = llama_round(llama, vocab, one, NULL);
      if (out) {
        compare(out, ids, n_ids);
        free(out);
      }
    }
    free(ids);
  }
  if (llama) {
    unlink(file);
    unlink(one);
  }
  qsort(tot, (size_t)rounds, sizeof *tot, sk_tool_cmp_double);
  qsort(enc, (size_t)rounds, sizeof *enc, sk_tool_cmp_double);
  qsort(lt, (size_t)rounds, sizeof *lt, sk_tool_cmp_double);
  qsort(l1, (size_t)rounds, sizeof *l1, sk_tool_cmp_double);
  printf("text: %zu bytes of %s -> %zu tokens; %d rounds, medians\n", len, path, n_ids,
         rounds);
  printf("sinkd: load + tokenize %.1f ms (tokenize alone %.1f ms)\n", 1e3 * tot[rounds / 2],
         1e3 * enc[rounds / 2]);
  if (llama) {
    printf("llama-tokenize: whole process %.1f ms; ratio sinkd / llama.cpp %.2f\n",
           1e3 * lt[rounds / 2], tot[rounds / 2] / lt[rounds / 2]);
    printf("llama-tokenize on 1 byte: %.1f ms (its tokenize alone about %.1f ms)\n",
           1e3 * l1[rounds / 2], 1e3 * (lt[rounds / 2] - l1[rounds / 2]));
  }
  free(tot);
  free(enc);
  free(lt);
  free(l1);
  free(text);
  return 0;
}
