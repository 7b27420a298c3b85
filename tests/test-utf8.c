/* UTF-8 stream repair: split characters are held, invalid bytes replaced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/utf8.h"

static size_t push(struct sk_utf8_stream *s, const char *in, size_t n, char *out) {
  size_t w = sk_utf8_stream_push(s, in, n, out);
  assert_true(sk_utf8_valid(out, w));
  return w;
}

static void test_ascii_passes(void **state) {
  (void)state;
  struct sk_utf8_stream s;
  sk_utf8_stream_init(&s);
  char out[64];
  size_t w = push(&s, " Once", 5, out);
  assert_int_equal(w, 5);
  assert_memory_equal(out, " Once", 5);
  assert_int_equal(sk_utf8_stream_flush(&s, out), 0);
}

/* "😀" (f0 9f 98 80) arriving one byte-fallback token at a time. */
static void test_split_emoji(void **state) {
  (void)state;
  struct sk_utf8_stream s;
  sk_utf8_stream_init(&s);
  const char emoji[] = "\xf0\x9f\x98\x80";
  char out[64];
  assert_int_equal(push(&s, emoji, 1, out), 0);
  assert_int_equal(push(&s, emoji + 1, 1, out), 0);
  assert_int_equal(push(&s, emoji + 2, 1, out), 0);
  assert_int_equal(push(&s, emoji + 3, 1, out), 4);
  assert_memory_equal(out, emoji, 4);
}

static void test_invalid_bytes_replaced(void **state) {
  (void)state;
  struct sk_utf8_stream s;
  sk_utf8_stream_init(&s);
  char out[64];
  /* A stray continuation byte, then 'a'. */
  size_t w = push(&s, "\x80" "a", 2, out);
  assert_int_equal(w, 4);
  assert_memory_equal(out, "\xef\xbf\xbd" "a", 4);
  /* An interrupted sequence: e4 b8 then 'x'. */
  w = push(&s, "\xe4\xb8" "x", 3, out);
  assert_int_equal(w, 4);
  assert_memory_equal(out, "\xef\xbf\xbd" "x", 4);
  /* Overlong (c0 80), surrogate (ed a0 80), above U+10FFFF (f4 90 80 80). */
  assert_false(sk_utf8_valid("\xc0\x80", 2));
  assert_false(sk_utf8_valid("\xed\xa0\x80", 3));
  assert_false(sk_utf8_valid("\xf4\x90\x80\x80", 4));
  assert_true(sk_utf8_valid("caf\xc3\xa9", 5));
  w = push(&s, "\xed\xa0\x80", 3, out);
  /* a0 cannot follow ed (a surrogate): ed, a0 and 80 each become U+FFFD. */
  assert_int_equal(w, 9);
}

static void test_flush_unfinished(void **state) {
  (void)state;
  struct sk_utf8_stream s;
  sk_utf8_stream_init(&s);
  char out[64];
  assert_int_equal(push(&s, "\xe4\xbd", 2, out), 0);
  assert_int_equal(sk_utf8_stream_flush(&s, out), 3);
  assert_memory_equal(out, "\xef\xbf\xbd", 3);
  assert_int_equal(sk_utf8_stream_flush(&s, out), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ascii_passes),
      cmocka_unit_test(test_split_emoji),
      cmocka_unit_test(test_invalid_bytes_replaced),
      cmocka_unit_test(test_flush_unfinished),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
