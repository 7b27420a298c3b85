#include "testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static const char *env_or(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return v && *v ? v : fallback;
}

const char *sk_test_model_path(void) {
  return env_or("SK_MODEL", "../shared/models/stories260K.gguf");
}

static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  assert_non_null(p);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

char *sk_test_reference_path(const char *name) {
  return join(env_or("SK_REFERENCE", "../shared/reference/stories260K"), name);
}

char *sk_test_shared_path(const char *rel) {
  return join(env_or("SK_SHARED_DIR", "../shared"), rel);
}

json_t *sk_test_load_reference(const char *name) {
  char *path = sk_test_reference_path(name);
  json_error_t e;
  json_t *j = json_load_file(path, 0, &e);
  if (!j) fail_msg("cannot load %s: %s (line %d)", path, e.text, e.line);
  free(path);
  return j;
}

void *sk_test_read_file(const char *path, size_t *ret_len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0) { fclose(f); return NULL; }
  long n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
  char *buf = malloc((size_t)n + 1);
  if (!buf) { fclose(f); return NULL; }
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); fclose(f); return NULL; }
  buf[n] = 0;
  fclose(f);
  *ret_len = (size_t)n;
  return buf;
}

int32_t *sk_test_json_ids(const json_t *arr, size_t *ret_n) {
  assert_true(json_is_array(arr));
  size_t n = json_array_size(arr);
  int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
  assert_non_null(ids);
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(arr, i);
    assert_true(json_is_integer(v));
    ids[i] = (int32_t)json_integer_value(v);
  }
  *ret_n = n;
  return ids;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

char *sk_test_hex_decode(const char *hex, size_t *ret_len) {
  size_t n = strlen(hex);
  assert_int_equal(n % 2, 0);
  char *out = malloc(n / 2 + 1);
  assert_non_null(out);
  for (size_t i = 0; i < n / 2; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    assert_true(hi >= 0 && lo >= 0);
    out[i] = (char)(hi << 4 | lo);
  }
  out[n / 2] = 0;
  *ret_len = n / 2;
  return out;
}

char *sk_test_run_capture(const char *cmd, int *ret_status) {
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  assert_non_null(out);
  size_t r;
  while ((r = fread(out + len, 1, cap - len - 1, f)) > 0) {
    len += r;
    if (len + 1 >= cap) {
      out = realloc(out, cap *= 2);
      assert_non_null(out);
    }
  }
  out[len] = 0;
  int st = pclose(f);
  *ret_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

char *sk_test_tmpdir(void) {
  char *p = join(env_or("TMPDIR", "/tmp"), "sinkd-test.XXXXXX");
  assert_non_null(mkdtemp(p));
  return p;
}

void sk_test_child_setup(void) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) _exit(125); /* the test died before the prctl */
  FILE *f = freopen("/dev/null", "w", stdout);
  (void)f;
}
