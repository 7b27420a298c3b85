/* The command-line helpers of sinkctl and the tools (client/cli.c):
 * number parsing at its edges, usage errors (message and exit status, in
 * a child process), and JSON strings byte for byte, control characters
 * and invalid UTF-8 included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"

/* ---- numbers ---------------------------------------------------------- */

static void test_u64(void **state) {
  (void)state;
  uint64_t v = 7;
  assert_int_equal(sk_cli_to_u64("0", 0, 10, &v), SK_CLI_OK);
  assert_int_equal(v, 0);
  assert_int_equal(sk_cli_to_u64("10", 0, 10, &v), SK_CLI_OK);
  assert_int_equal(v, 10);
  assert_int_equal(sk_cli_to_u64("007", 0, 10, &v), SK_CLI_OK);
  assert_int_equal(v, 7);
  assert_int_equal(sk_cli_to_u64("18446744073709551615", 0, UINT64_MAX, &v), SK_CLI_OK);
  assert_true(v == UINT64_MAX);
  /* powers of ten */
  assert_int_equal(sk_cli_to_u64("1e6", 0, UINT64_MAX, &v), SK_CLI_OK);
  assert_int_equal(v, 1000000);
  assert_int_equal(sk_cli_to_u64("25e3", 0, UINT64_MAX, &v), SK_CLI_OK);
  assert_int_equal(v, 25000);
  assert_int_equal(sk_cli_to_u64("3e0", 0, UINT64_MAX, &v), SK_CLI_OK);
  assert_int_equal(v, 3);
  assert_int_equal(sk_cli_to_u64("0e99999", 0, UINT64_MAX, &v), SK_CLI_OK);
  assert_int_equal(v, 0);
  assert_int_equal(sk_cli_to_u64("1e19", 0, UINT64_MAX, &v), SK_CLI_OK);
  assert_true(v == 10000000000000000000u);
  /* out of range: *ret untouched */
  v = 7;
  assert_int_equal(sk_cli_to_u64("11", 0, 10, &v), SK_CLI_OUT_OF_RANGE);
  assert_int_equal(sk_cli_to_u64("1", 2, 10, &v), SK_CLI_OUT_OF_RANGE);
  assert_int_equal(sk_cli_to_u64("18446744073709551616", 0, UINT64_MAX, &v),
                   SK_CLI_OUT_OF_RANGE);
  assert_int_equal(sk_cli_to_u64("99999999999999999999999", 0, UINT64_MAX, &v),
                   SK_CLI_OUT_OF_RANGE);
  assert_int_equal(sk_cli_to_u64("1e20", 0, UINT64_MAX, &v), SK_CLI_OUT_OF_RANGE);
  assert_int_equal(sk_cli_to_u64("2e19", 0, UINT64_MAX, &v), SK_CLI_OUT_OF_RANGE);
  assert_int_equal(v, 7);
  /* not numbers */
  const char *bad[] = {"", " 1", "1 ", "+1", "-1", "1.5", "0x10", "1e", "e3", "1e-3",
                       "1e+3", "1E3", "12x", "abc", "1,2", "\t5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(sk_cli_to_u64(bad[i], 0, UINT64_MAX, &v), SK_CLI_NOT_NUMBER);
    assert_int_equal(v, 7);
  }
}

static void test_double(void **state) {
  (void)state;
  double v = 7;
  assert_int_equal(sk_cli_to_double("0.8", &v), SK_CLI_OK);
  assert_true(v == 0.8);
  assert_int_equal(sk_cli_to_double("-2", &v), SK_CLI_OK);
  assert_true(v == -2.0);
  assert_int_equal(sk_cli_to_double(".5", &v), SK_CLI_OK);
  assert_true(v == 0.5);
  assert_int_equal(sk_cli_to_double("+1e3", &v), SK_CLI_OK);
  assert_true(v == 1000.0);
  v = 7;
  const char *bad[] = {"", " 1", "1 ", "inf", "-inf", "nan", "1e999", "0x10", "0x1p3",
                       "1.5.2", "abc", "1,5"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(sk_cli_to_double(bad[i], &v), SK_CLI_NOT_NUMBER);
    assert_true(v == 7.0);
  }
}

/* ---- usage errors, in a child ----------------------------------------- */

enum { CALL_U64, CALL_DOUBLE, CALL_LIST, CALL_USAGE, CALL_DIE, CALL_FN_USAGE, CALL_FN_DIE, CALL_FN_RESET };

/* An error function as sinkctl --json sets one: its own form, on stderr
 * here so that the test reads it. */
static void error_fn(int status, const char *message) {
  fprintf(stderr, "{%d: %s}\n", status, message);
}

/* Runs one exiting helper in a child with stderr on a pipe; returns its
 * exit status and what it wrote in err[0..cap). */
static int run_child(int what, const char *help, const char *arg, char *err, size_t cap) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    sk_cli_init("prog: sub", help);
    uint64_t list[3];
    switch (what) {
    case CALL_U64: (void)sk_cli_parse_u64("--n", arg, 1, 100); break;
    case CALL_DOUBLE: (void)sk_cli_parse_double("--x", arg); break;
    case CALL_LIST: (void)sk_cli_parse_list("--list", arg, list, 3, 1, 4096); break;
    case CALL_USAGE: sk_cli_usage_error("bad %s", arg);
    case CALL_DIE: sk_cli_die(4, "gone: %s", arg);
    case CALL_FN_USAGE:
      sk_cli_set_error_fn(error_fn);
      (void)sk_cli_parse_u64("--n", arg, 1, 100);
      break;
    case CALL_FN_DIE:
      sk_cli_set_error_fn(error_fn);
      sk_cli_die(3, "cannot connect to %s", arg);
    case CALL_FN_RESET: /* a subcommand's sk_cli_init: text again */
      sk_cli_set_error_fn(error_fn);
      sk_cli_init("prog: eval", NULL);
      sk_cli_usage_error("bad %s", arg);
    }
    _exit(0); /* the value was good */
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t r;
  while ((r = read(fds[0], err + n, cap - 1 - n)) > 0) n += (size_t)r;
  err[n] = '\0';
  close(fds[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

static void test_usage_errors(void **state) {
  (void)state;
  char err[512];
  assert_int_equal(run_child(CALL_U64, "prog sub --help", "50", err, sizeof err), 0);
  assert_string_equal(err, "");
  assert_int_equal(run_child(CALL_U64, "prog sub --help", "0", err, sizeof err), 2);
  assert_string_equal(err, "prog: sub: --n: '0' is not in [1, 100]\n"
                           "Try 'prog sub --help' for more information.\n");
  assert_int_equal(run_child(CALL_U64, NULL, "x1", err, sizeof err), 2);
  assert_string_equal(err, "prog: sub: --n: 'x1' is not a number\n");
  assert_int_equal(run_child(CALL_DOUBLE, NULL, "nan", err, sizeof err), 2);
  assert_string_equal(err, "prog: sub: --x: 'nan' is not a number\n");
  assert_int_equal(run_child(CALL_DOUBLE, NULL, "-0.25", err, sizeof err), 0);
  assert_int_equal(run_child(CALL_USAGE, "h", "flag", err, sizeof err), 2);
  assert_string_equal(err, "prog: sub: bad flag\nTry 'h' for more information.\n");
  assert_int_equal(run_child(CALL_DIE, "h", "socket", err, sizeof err), 4);
  assert_string_equal(err, "prog: sub: gone: socket\n");
  /* an error function takes the message instead: no prefix, no hint */
  assert_int_equal(run_child(CALL_FN_USAGE, "h", "101", err, sizeof err), 2);
  assert_string_equal(err, "{2: --n: '101' is not in [1, 100]}\n");
  assert_int_equal(run_child(CALL_FN_USAGE, "h", "100", err, sizeof err), 0);
  assert_string_equal(err, "");
  assert_int_equal(run_child(CALL_FN_DIE, "h", "/x.sock", err, sizeof err), 3);
  assert_string_equal(err, "{3: cannot connect to /x.sock}\n");
  assert_int_equal(run_child(CALL_FN_RESET, "h", "run", err, sizeof err), 2);
  assert_string_equal(err, "prog: eval: bad run\n");
}

static void test_list(void **state) {
  (void)state;
  /* good lists parse in the parent (the helper returns) */
  uint64_t out[4] = {0};
  assert_int_equal(sk_cli_parse_list("--l", "1,4,16", out, 4, 1, 64), 3);
  assert_int_equal(out[0], 1);
  assert_int_equal(out[1], 4);
  assert_int_equal(out[2], 16);
  assert_int_equal(sk_cli_parse_list("--l", "1e3,1e6", out, 4, 1, 1u << 30), 2);
  assert_int_equal(out[0], 1000);
  assert_int_equal(out[1], 1000000);
  assert_int_equal(sk_cli_parse_list("--l", "7", out, 1, 1, 64), 1);
  assert_int_equal(out[0], 7);
  /* bad ones exit 2 naming the list */
  char err[512];
  const char *bad[] = {"", ",", "1,", ",1", "1,,2", "0", "4097", "1,2,3,4", "1;2", "1 ,2",
                       "123456789012345678901234567890123"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(run_child(CALL_LIST, NULL, bad[i], err, sizeof err), 2);
    char want[256];
    snprintf(want, sizeof want,
             "prog: sub: --list: '%s' is not a list of up to 3 numbers in [1, 4096]\n", bad[i]);
    assert_string_equal(err, want);
  }
  assert_int_equal(run_child(CALL_LIST, NULL, "1,2,4096", err, sizeof err), 0);
}

/* ---- JSON ------------------------------------------------------------- */

/* sk_cli_json_str of in[0..n), as a NUL-terminated string (freed by the
 * caller). */
static char *json(const char *in, size_t n) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  sk_cli_json_str(f, in, n);
  assert_int_equal(fclose(f), 0);
  return buf;
}

static void expect_json(const char *in, size_t n, const char *want) {
  char *got = json(in, n);
  assert_string_equal(got, want);
  free(got);
}

static void test_json_escapes(void **state) {
  (void)state;
  expect_json("", 0, "\"\"");
  expect_json("plain text", 10, "\"plain text\"");
  expect_json("say \"hi\" \\ bye", 14, "\"say \\\"hi\\\" \\\\ bye\"");
  /* the control characters with a short form */
  expect_json("a\nb\rc\td\be\ff", 11, "\"a\\nb\\rc\\td\\be\\ff\"");
  /* the others as \u00XX, NUL included (the length is given) */
  expect_json("\x00\x01\x1b[0m\x1f", 7, "\"\\u0000\\u0001\\u001b[0m\\u001f\"");
  /* every byte below 0x20 is escaped: none comes out raw */
  char all[32];
  for (int i = 0; i < 32; i++) all[i] = (char)i;
  char *out = json(all, 32);
  for (const char *p = out; *p; p++) assert_true((unsigned char)*p >= 0x20);
  assert_string_equal(out, "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007"
                           "\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f"
                           "\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017"
                           "\\u0018\\u0019\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\"");
  free(out);
  /* DEL and '/' need no escape */
  expect_json("\x7f/", 2, "\"\x7f/\"");
}

static void test_json_utf8(void **state) {
  (void)state;
  /* valid UTF-8 passes as it is: é (2 bytes), € (3), 😀 (4) */
  expect_json("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
  /* a lone continuation byte, an overlong '/', a surrogate, past
   * U+10FFFF, 0xff, and a sequence cut by the end: one U+FFFD per bad
   * byte */
  expect_json("a\x80z", 3, "\"a\\ufffdz\"");
  expect_json("\xc0\xaf", 2, "\"\\ufffd\\ufffd\"");
  expect_json("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"");
  expect_json("\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  expect_json("\xff", 1, "\"\\ufffd\"");
  expect_json("ok\xe2\x82", 4, "\"ok\\ufffd\\ufffd\"");
  /* the C-string form */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  sk_cli_json_cstr(f, "tab\there");
  assert_int_equal(fclose(f), 0);
  assert_string_equal(buf, "\"tab\\there\"");
  free(buf);
}

static void test_utf8_len(void **state) {
  (void)state;
  assert_int_equal(sk_cli_utf8_len((const unsigned char *)"A", 1), 1);
  assert_int_equal(sk_cli_utf8_len((const unsigned char *)"\xdf\xbf", 2), 2);
  assert_int_equal(sk_cli_utf8_len((const unsigned char *)"\xef\xbf\xbf", 3), 3);
  assert_int_equal(sk_cli_utf8_len((const unsigned char *)"\xf4\x8f\xbf\xbf", 4), 4);
  assert_int_equal(sk_cli_utf8_len((const unsigned char *)"\xe0\x9f\xbf", 3), 0); /* overlong */
  assert_int_equal(sk_cli_utf8_len((const unsigned char *)"\xf0\x8f\xbf\xbf", 4), 0);
  assert_int_equal(sk_cli_utf8_len((const unsigned char *)"\xc3\xa9", 1), 0); /* cut */
}

static void test_clock(void **state) {
  (void)state;
  double a = sk_cli_now_s();
  usleep(20000);
  double b = sk_cli_now_s();
  assert_true(b - a >= 0.02);
  assert_true(a > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_u64),          cmocka_unit_test(test_double),
      cmocka_unit_test(test_usage_errors), cmocka_unit_test(test_list),
      cmocka_unit_test(test_json_escapes), cmocka_unit_test(test_json_utf8),
      cmocka_unit_test(test_utf8_len),     cmocka_unit_test(test_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
