/* Replays inputs through a fuzz target without libFuzzer: each argument is
 * a file or a folder of files (sorted, dot files skipped). Exits 0 when
 * every input ran; a crash or a broken invariant aborts. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static unsigned long g_inputs;

static void run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(2);
  }
  size_t cap = 1 << 16, len = 0;
  uint8_t *buf = malloc(cap);
  size_t r;
  while ((r = fread(buf + len, 1, cap - len, f)) > 0) {
    len += r;
    if (len == cap) buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  /* An exactly sized copy, so an overread is one past the allocation. */
  uint8_t *exact = malloc(len ? len : 1);
  memcpy(exact, buf, len);
  free(buf);
  LLVMFuzzerTestOneInput(exact, len);
  free(exact);
  g_inputs++;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void run_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "no such input: %s\n", path);
    exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    run_file(path);
    return;
  }
  DIR *d = opendir(path);
  if (!d) exit(2);
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
    size_t len = strlen(path) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    snprintf(names[n], len, "%s/%s", path, e->d_name);
    n++;
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    run_file(names[i]);
    free(names[i]);
  }
  free(names);
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++) run_path(argv[i]);
  printf("replayed %lu inputs\n", g_inputs);
  return 0;
}
