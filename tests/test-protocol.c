/* Tests of the protocol pieces: error codes, the frame reader, and the
 * msgpack check/parse/getters/builder. libsinkd against a fake daemon is
 * test-client.c, sinkctl against it test-sinkctl-fake.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/msg.h"
#include "testmsg.h"
#include "proto/wire.h"
#include "sinkd/client.h"
#include "sinkd/protocol.h"
#include "testutil.h"


/* ---- errors ----------------------------------------------------------- */

static void test_error_names_round_trip(void **state) {
  (void)state;
  for (int code = 1; code < SK_ERR__COUNT; code++) {
    const char *name = sk_error_name(code);
    assert_non_null(name);
    assert_true(strlen(name) > 0);
    assert_int_equal(sk_error_from_name(name, strlen(name)), code);
    assert_string_equal(sk_error_name(-code), name);
    assert_string_equal(sk_strerror(-code), sk_strerror(code));
    /* Names are distinct. */
    for (int other = 1; other < code; other++)
      assert_string_not_equal(sk_error_name(other), name);
  }
  assert_string_equal(sk_error_name(SK_ERR_BAD_REQUEST), "bad_request");
  assert_string_equal(sk_error_name(SK_ERR_NO_SUCH_SESSION),
                      "no_such_session");
  assert_string_equal(sk_strerror(SK_ERR_TOO_LARGE), "frame too large");
  /* Out of range and unknown. */
  assert_string_equal(sk_error_name(SK_ERR__COUNT), "internal");
  assert_string_equal(sk_error_name(-1000), "internal");
  assert_string_equal(sk_error_name(-2147483647 - 1), "internal");
  assert_int_equal(sk_error_from_name("nope", 4), SK_ERR_INTERNAL);
  assert_int_equal(sk_error_from_name("bad_request", 3), SK_ERR_INTERNAL);
  assert_int_equal(sk_error_from_name("bad_requestX", 11), SK_ERR_BAD_REQUEST);
  assert_int_equal(sk_error_from_name(NULL, 0), SK_ERR_INTERNAL);
}

static void test_error_set(void **state) {
  (void)state;
  struct sk_error e;
  assert_int_equal(sk_error_set(&e, SK_ERR_BUSY, "%d sessions", 7),
                   -SK_ERR_BUSY);
  assert_int_equal(e.code, SK_ERR_BUSY);
  assert_string_equal(e.message, "7 sessions");
  assert_int_equal(sk_error_set(&e, -SK_ERR_IO, "x"), -SK_ERR_IO);
  assert_int_equal(e.code, SK_ERR_IO);
  assert_int_equal(sk_error_set(NULL, SK_ERR_IO, "x"), -SK_ERR_IO);
  /* Long messages are truncated, NUL-terminated. */
  char big[600];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  sk_error_set(&e, SK_ERR_INTERNAL, "%s", big);
  assert_int_equal(strlen(e.message), SK_ERROR_MESSAGE_MAX - 1);
  /* Echoed client bytes leave valid text: invalid UTF-8 (a stray
   * continuation, an overlong form, a surrogate, a lead without its
   * continuation) and controls become '?', valid characters stay. */
  sk_error_set(&e, SK_ERR_BAD_REQUEST, "unknown policy \"%s\"",
               "\xff\x80" "a\xc0\xaf\xed\xa0\x80\xe2\x82\x1b[2Jé€😀\t\x7f");
  assert_string_equal(e.message, "unknown policy \"??a????????[2Jé€😀\t?\"");
}

/* ---- frames ----------------------------------------------------------- */

/* Appends one frame with a body of n bytes (value seed+i) to out. */
static size_t put_frame(uint8_t *out, uint32_t n, uint8_t seed) {
  sk_frame_header_put(out, n);
  for (uint32_t i = 0; i < n; i++) out[4 + i] = (uint8_t)(seed + i);
  return 4 + (size_t)n;
}

static void check_frame(const uint8_t *body, size_t len, uint32_t n,
                        uint8_t seed) {
  assert_int_equal(len, n);
  for (uint32_t i = 0; i < n; i++) assert_int_equal(body[i], (uint8_t)(seed + i));
}

static void test_frame_header(void **state) {
  (void)state;
  uint8_t h[4];
  sk_frame_header_put(h, 0x01020304u);
  assert_memory_equal(h, "\x01\x02\x03\x04", 4);
  assert_int_equal(sk_frame_header_get(h), 0x01020304u);
  sk_frame_header_put(h, UINT32_MAX);
  assert_int_equal(sk_frame_header_get(h), UINT32_MAX);
}

/* Frames of these body sizes, fed with the stream split at every byte
 * boundary (two pieces), then one byte at a time. */
static void test_frame_split_everywhere(void **state) {
  (void)state;
  static const uint32_t sizes[] = {13, 0, 1, 200, 9, 4};
  enum { N = sizeof sizes / sizeof sizes[0] };
  uint8_t stream[512];
  size_t total = 0;
  for (size_t i = 0; i < N; i++)
    total += put_frame(stream + total, sizes[i], (uint8_t)(i * 31));

  for (size_t split = 0; split <= total; split++) {
    struct sk_frame_reader r;
    sk_frame_reader_init(&r, 1024);
    size_t got = 0;
    const size_t cuts[3] = {0, split, total};
    for (int piece = 0; piece < 2; piece++) {
      assert_int_equal(sk_frame_reader_feed(&r, stream + cuts[piece],
                                            cuts[piece + 1] - cuts[piece]),
                       0);
      const uint8_t *body;
      size_t len;
      int rc;
      while ((rc = sk_frame_reader_next(&r, &body, &len)) == 1) {
        assert_true(got < N);
        check_frame(body, len, sizes[got], (uint8_t)(got * 31));
        got++;
      }
      assert_int_equal(rc, 0);
    }
    assert_int_equal(got, N);
    sk_frame_reader_free(&r);
  }

  /* Byte by byte. */
  struct sk_frame_reader r;
  sk_frame_reader_init(&r, 1024);
  size_t got = 0;
  for (size_t i = 0; i < total; i++) {
    assert_int_equal(sk_frame_reader_feed(&r, stream + i, 1), 0);
    const uint8_t *body;
    size_t len;
    while (sk_frame_reader_next(&r, &body, &len) == 1) {
      check_frame(body, len, sizes[got], (uint8_t)(got * 31));
      got++;
    }
  }
  assert_int_equal(got, N);
  sk_frame_reader_free(&r);
}

static void test_frame_max_and_resync(void **state) {
  (void)state;
  enum { MAX = 100 };
  static uint8_t stream[1024];
  size_t total = 0;
  total += put_frame(stream + total, MAX, 1);     /* exactly max: accepted */
  total += put_frame(stream + total, MAX + 1, 2); /* max + 1: refused */
  total += put_frame(stream + total, 5, 3);       /* then in sync again */

  /* All at once, and split at every byte. */
  for (size_t split = 0; split <= total; split++) {
    struct sk_frame_reader r;
    sk_frame_reader_init(&r, MAX);
    int seen[3] = {0, 0, 0};
    const size_t cuts[3] = {0, split, total};
    for (int piece = 0; piece < 2; piece++) {
      assert_int_equal(sk_frame_reader_feed(&r, stream + cuts[piece],
                                            cuts[piece + 1] - cuts[piece]),
                       0);
      for (;;) {
        const uint8_t *body = NULL;
        size_t len = 0;
        int rc = sk_frame_reader_next(&r, &body, &len);
        if (rc == 0) break;
        if (rc == -SK_ERR_TOO_LARGE) {
          assert_int_equal(len, MAX + 1);
          assert_int_equal(seen[0], 1);
          seen[1]++;
          continue;
        }
        assert_int_equal(rc, 1);
        if (len == MAX) {
          check_frame(body, len, MAX, 1);
          seen[0]++;
        } else {
          check_frame(body, len, 5, 3);
          assert_int_equal(seen[1], 1);
          seen[2]++;
        }
      }
    }
    assert_int_equal(seen[0], 1);
    assert_int_equal(seen[1], 1); /* reported once */
    assert_int_equal(seen[2], 1);
    assert_true(r.cap <= MAX + 4 + total);
    sk_frame_reader_free(&r);
  }
}

/* A declared length of 2^32-1 or 2^31 allocates nothing for the body. */
static void test_frame_huge_declared(void **state) {
  (void)state;
  static const uint32_t huge[] = {UINT32_MAX, 1u << 31, SK_FRAME_MAX_CEILING + 1};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    struct sk_frame_reader r;
    sk_frame_reader_init(&r, UINT32_MAX); /* clamped to the ceiling */
    assert_int_equal(r.max_frame, SK_FRAME_MAX_CEILING);
    uint8_t hdr[12] = {0};
    sk_frame_header_put(hdr, huge[i]);
    memcpy(hdr + 4, "abcdefgh", 8);
    assert_int_equal(sk_frame_reader_feed(&r, hdr, sizeof hdr), 0);
    const uint8_t *body;
    size_t len = 0;
    assert_int_equal(sk_frame_reader_next(&r, &body, &len), -SK_ERR_TOO_LARGE);
    assert_int_equal(len, huge[i]);
    assert_int_equal(r.skip, (uint64_t)huge[i] - 8);
    assert_true(r.cap <= 4096);
    /* More body bytes are dropped, not buffered. */
    static uint8_t junk[65536];
    for (int k = 0; k < 16; k++) {
      assert_int_equal(sk_frame_reader_feed(&r, junk, sizeof junk), 0);
      assert_int_equal(sk_frame_reader_next(&r, &body, &len), 0);
    }
    assert_true(r.cap <= 4096);
    assert_int_equal(r.len - r.pos, 0);
    sk_frame_reader_free(&r);
  }
}

static void test_frame_zero_length(void **state) {
  (void)state;
  struct sk_frame_reader r;
  sk_frame_reader_init(&r, 16);
  assert_int_equal(sk_frame_reader_feed(&r, "\0\0\0\0\0\0\0\1x", 9), 0);
  const uint8_t *body = NULL;
  size_t len = 99;
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 1);
  assert_int_equal(len, 0);
  assert_non_null(body);
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 1);
  assert_int_equal(len, 1);
  assert_int_equal(body[0], 'x');
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 0);
  sk_frame_reader_free(&r);
  sk_frame_reader_free(&r); /* idempotent */
}

/* The buffer is compacted, not grown, when frames keep coming. */
static void test_frame_bounded(void **state) {
  (void)state;
  struct sk_frame_reader r;
  sk_frame_reader_init(&r, 1000);
  uint8_t frame[1004];
  size_t n = put_frame(frame, 1000, 7);
  for (int i = 0; i < 1000; i++) {
    /* Feed in pieces of 333 bytes so frames straddle feeds. */
    for (size_t off = 0; off < n; off += 333) {
      size_t k = n - off < 333 ? n - off : 333;
      assert_int_equal(sk_frame_reader_feed(&r, frame + off, k), 0);
      const uint8_t *body;
      size_t len;
      while (sk_frame_reader_next(&r, &body, &len) == 1)
        check_frame(body, len, 1000, 7);
    }
  }
  assert_true(r.cap <= 1004 + 333);
  sk_frame_reader_free(&r);
}

/* A reader that took a 1 MB frame gives its buffer back once idle, and
 * keeps only a small one for the start of the next frame. */
static void test_frame_trim(void **state) {
  (void)state;
  enum { BIG = 1u << 20 };
  struct sk_frame_reader r;
  sk_frame_reader_init(&r, BIG);
  uint8_t *frame = malloc(BIG + 4 + 4 + 10);
  assert_non_null(frame);
  size_t n = put_frame(frame, BIG, 3);
  const uint8_t *body;
  size_t len;
  assert_int_equal(sk_frame_reader_feed(&r, frame, n), 0);
  assert_true(r.cap >= n);
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 1);
  check_frame(body, len, BIG, 3);
  assert_int_equal(sk_frame_reader_trim(&r), 0);
  assert_null(r.buf);
  assert_int_equal(r.cap, 0);
  /* The frame, then 7 bytes of a 10-byte one: 4 KiB kept, the rest
   * comes in as usual. */
  size_t m = put_frame(frame + n, 10, 9);
  assert_int_equal(sk_frame_reader_feed(&r, frame, n + 7), 0);
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 1);
  check_frame(body, len, BIG, 3);
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 0);
  assert_int_equal(sk_frame_reader_trim(&r), 0);
  assert_int_equal(r.cap, 4096);
  assert_int_equal(r.len - r.pos, 7);
  assert_int_equal(sk_frame_reader_feed(&r, frame + n + 7, m - 7), 0);
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 1);
  check_frame(body, len, 10, 9);
  /* Half of a large frame stays where it is. */
  assert_int_equal(sk_frame_reader_feed(&r, frame, n / 2), 0);
  size_t cap = r.cap;
  assert_true(cap > 65536);
  assert_int_equal(sk_frame_reader_trim(&r), 0);
  assert_int_equal(r.cap, cap);
  assert_int_equal(sk_frame_reader_feed(&r, frame + n / 2, n - n / 2), 0);
  assert_int_equal(sk_frame_reader_next(&r, &body, &len), 1);
  check_frame(body, len, BIG, 3);
  sk_frame_reader_free(&r);
  free(frame);
}

/* ---- msgpack check / parse -------------------------------------------- */

/* The ping request of the man page's EXAMPLE, frame header included. */
static const uint8_t ping_frame[] = {0x00, 0x00, 0x00, 0x0d, 0x82, 0xa2, 0x69,
                                     0x64, 0x01, 0xa2, 0x6f, 0x70, 0xa4, 0x70,
                                     0x69, 0x6e, 0x67};

static void check_bad(const void *body, size_t len, const char *message) {
  struct sk_error e = {0};
  assert_int_equal(sk_msg_check(body, len, &e), -SK_ERR_BAD_REQUEST);
  assert_int_equal(e.code, SK_ERR_BAD_REQUEST);
  if (message) assert_string_equal(e.message, message);
  struct sk_msg m;
  assert_int_equal(sk_msg_parse(body, len, &m, &e), -SK_ERR_BAD_REQUEST);
  sk_msg_free(&m); /* harmless after a failed parse */
}

/* A request using every format the check knows. */
static uint8_t *build_rich_request(size_t *ret_len) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 12);
  sk_test_pack_kv_u64(&pk, "id", 77);
  sk_test_pack_kv_str(&pk, "op", "generate");
  sk_test_pack_kv_u64(&pk, "big", UINT64_MAX);
  sk_test_pack_kv_i64(&pk, "neg", INT64_MIN);
  sk_test_pack_kv_f64(&pk, "temperature", 0.5);
  sk_pack_cstr(&pk, "f32");
  msgpack_pack_float(&pk, 1.5f);
  sk_test_pack_kv_bool(&pk, "ignore_eos", true);
  sk_pack_cstr(&pk, "nil");
  msgpack_pack_nil(&pk);
  sk_pack_cstr(&pk, "bin");
  msgpack_pack_bin(&pk, 3);
  msgpack_pack_bin_body(&pk, "\x00\x01\x02", 3);
  sk_pack_cstr(&pk, "ext");
  msgpack_pack_ext(&pk, 5, 7);
  msgpack_pack_ext_body(&pk, "12345", 5);
  sk_pack_cstr(&pk, "stop");
  msgpack_pack_array(&pk, 20); /* array16 */
  for (int i = 0; i < 20; i++) sk_pack_cstr(&pk, i % 2 ? "\n\n" : "");
  sk_pack_cstr(&pk, "text"); /* str16 */
  char text[300];
  memset(text, 'x', sizeof text);
  sk_pack_strn(&pk, text, sizeof text);
  uint8_t *out = malloc(sb.size);
  assert_non_null(out);
  memcpy(out, sb.data, sb.size);
  *ret_len = sb.size;
  msgpack_sbuffer_destroy(&sb);
  return out;
}

static void test_msg_valid(void **state) {
  (void)state;
  struct sk_error e = {0};
  struct sk_msg m;
  assert_int_equal(sk_msg_parse(ping_frame + 4, sizeof ping_frame - 4, &m, &e),
                   0);
  uint64_t id = 0;
  const char *op;
  size_t op_len;
  assert_int_equal(sk_msg_need_u64(&m.root, "id", UINT64_MAX, &id, &e), 0);
  assert_int_equal(id, 1);
  assert_int_equal(sk_msg_need_str(&m.root, "op", &op, &op_len, &e), 0);
  assert_int_equal(op_len, 4);
  assert_memory_equal(op, "ping", 4);
  sk_msg_free(&m);
  sk_msg_free(&m);

  size_t len;
  uint8_t *rich = build_rich_request(&len);
  assert_int_equal(sk_msg_check(rich, len, &e), 0);
  assert_int_equal(sk_msg_parse(rich, len, &m, &e), 0);
  uint64_t big;
  int64_t neg;
  double t, f;
  bool b;
  const msgpack_object_array *arr;
  assert_int_equal(sk_msg_get_u64(&m.root, "big", UINT64_MAX, &big, &e), 1);
  assert_true(big == UINT64_MAX);
  assert_int_equal(sk_msg_get_i64(&m.root, "neg", &neg, &e), 1);
  assert_true(neg == INT64_MIN);
  assert_int_equal(sk_msg_get_f64(&m.root, "temperature", &t, &e), 1);
  assert_true(t == 0.5);
  assert_int_equal(sk_msg_get_f64(&m.root, "f32", &f, &e), 1);
  assert_true(f == 1.5);
  assert_int_equal(sk_msg_get_f64(&m.root, "id", &f, &e), 1); /* int ok */
  assert_true(f == 77.0);
  assert_int_equal(sk_msg_get_bool(&m.root, "ignore_eos", &b, &e), 1);
  assert_true(b);
  assert_int_equal(sk_msg_get_array(&m.root, "stop", &arr, &e), 1);
  assert_int_equal(arr->size, 20);
  assert_int_equal(sk_msg_get_str(&m.root, "bin", &op, &op_len, &e), 1);
  assert_int_equal(op_len, 3);
  assert_int_equal(sk_msg_get_str(&m.root, "text", &op, &op_len, &e), 1);
  assert_int_equal(op_len, 300);
  /* Absent fields: 0, nothing stored. */
  big = 5;
  assert_int_equal(sk_msg_get_u64(&m.root, "nope", 10, &big, &e), 0);
  assert_int_equal(big, 5);
  assert_null(sk_msg_get(&m.root, "i")); /* prefix of "id" is not "id" */
  assert_null(sk_msg_get(&m.root, "idx"));
  sk_msg_free(&m);

  /* Truncated at every byte: always refused, never crashes. */
  for (size_t cut = 0; cut < len; cut++) {
    assert_int_equal(sk_msg_check(rich, cut, &e), -SK_ERR_BAD_REQUEST);
    assert_int_equal(sk_msg_parse(rich, cut, &m, &e), -SK_ERR_BAD_REQUEST);
  }
  /* The ping body too, with exact messages for a few cuts. */
  for (size_t cut = 0; cut < sizeof ping_frame - 4; cut++)
    check_bad(ping_frame + 4, cut, NULL);
  check_bad(ping_frame + 4, 0, "empty message");
  check_bad(ping_frame + 4, 1,
            "msgpack: map of 2 entries declared but only 0 bytes remain");
  check_bad(ping_frame + 4, 4,
            "msgpack: map of 2 entries declared but only 3 bytes remain");
  check_bad(ping_frame + 4, 6, "msgpack: truncated str");
  check_bad(ping_frame + 4, 8, "msgpack: truncated map");
  free(rich);
}

static void test_msg_hostile(void **state) {
  (void)state;
  /* array32 of 2^32-1 elements in 5 bytes... */
  check_bad("\xdd\xff\xff\xff\xff", 5,
            "msgpack: array of 4294967295 elements declared but only 0 "
            "bytes remain");
  /* ...and with 3 bytes after it. */
  check_bad("\xdd\xff\xff\xff\xff\xc0\xc0\xc0", 8,
            "msgpack: array of 4294967295 elements declared but only 3 "
            "bytes remain");
  /* Inside a map, as a field value. */
  check_bad("\x81\xa1x\xdd\xff\xff\xff\xff\x01", 9,
            "msgpack: array of 4294967295 elements declared but only 1 "
            "bytes remain");
  /* map32 huge: 2 bytes per entry. */
  check_bad("\xdf\x80\x00\x00\x00\x01\x02", 7,
            "msgpack: map of 2147483648 entries declared but only 2 bytes "
            "remain");
  check_bad("\x83\x01\x02\x03\x04\x05", 6,
            "msgpack: map of 3 entries declared but only 5 bytes remain");
  check_bad("\xde\xff\xff", 3,
            "msgpack: map of 65535 entries declared but only 0 bytes remain");
  /* str32/bin32/ext32 huge. */
  check_bad("\xdb\xff\xff\xff\xff" "abc", 8, "msgpack: truncated str");
  check_bad("\xc6\x80\x00\x00\x00" "abc", 8, "msgpack: truncated bin");
  check_bad("\xc9\xff\xff\xff\xff\x01" "abc", 9, "msgpack: truncated ext");
  check_bad("\xc9\x00\x00\x00\x03\x01" "abc", 8, "msgpack: truncated ext");
  check_bad("\xdb\xff\xff", 3, "msgpack: truncated str");
  check_bad("\xcf\x00\x00", 3, "msgpack: truncated uint64");
  check_bad("\xd8\x01\x00", 3, "msgpack: truncated fixext16");
  /* 0xc1 is never valid. */
  check_bad("\xc1", 1, "msgpack: invalid byte 0xc1 at offset 0");
  check_bad("\x81\xa2id\xc1", 5, "msgpack: invalid byte 0xc1 at offset 4");
  /* Trailing bytes. */
  check_bad("\x80\x01\x02\x03", 4, "trailing 3 bytes after the message");
  uint8_t two_pings[26];
  memcpy(two_pings, ping_frame + 4, 13);
  memcpy(two_pings + 13, ping_frame + 4, 13);
  check_bad(two_pings, 26, "trailing 13 bytes after the message");

  /* Root not a map: passes the check, refused by parse. */
  static const struct {
    const char *bytes;
    size_t len;
    const char *got;
  } roots[] = {
      {"\x91\x01", 2, "array"},   {"\xa3" "abc", 4, "string"},
      {"\x05", 1, "integer"},     {"\xc0", 1, "nil"},
      {"\xc3", 1, "boolean"},     {"\xff", 1, "negative integer"},
      {"\xc4\x01x", 3, "binary"}, {"\xd4\x01\x02", 3, "ext"},
      {"\xca\x3f\x80\x00\x00", 5, "float"},
  };
  for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
    struct sk_error e = {0};
    struct sk_msg m;
    assert_int_equal(sk_msg_check((const uint8_t *)roots[i].bytes,
                                  roots[i].len, &e),
                     0);
    assert_int_equal(sk_msg_parse((const uint8_t *)roots[i].bytes,
                                  roots[i].len, &m, &e),
                     -SK_ERR_BAD_REQUEST);
    char want[64];
    snprintf(want, sizeof want, "request must be a map, got %s", roots[i].got);
    assert_string_equal(e.message, want);
    sk_msg_free(&m);
  }
}

/* parse's error message for body[0..len), which must be refused. */
static void check_parse_bad(const void *body, size_t len, const char *want) {
  struct sk_error e = {0};
  struct sk_msg m;
  assert_int_equal(sk_msg_parse(body, len, &m, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, want);
  sk_msg_free(&m);
}

static void test_msg_duplicate_keys(void **state) {
  (void)state;
  /* {"id":1,"op":"ping","id":2} */
  check_parse_bad("\x83\xa2id\x01\xa2op\xa4ping\xa2id\x02", 17,
                  "field 'id' appears twice in a map");
  /* in a map inside an array: {"messages":[{"role":"a","role":"b"}]} */
  check_parse_bad("\x81\xa8messages\x91\x82\xa4role\xa1" "a\xa4role\xa1" "b", 26,
                  "field 'role' appears twice in a map");
  /* keys of other types, and "a" beside "ab", are not duplicates */
  struct sk_msg m;
  struct sk_error e = {0};
  assert_int_equal(sk_msg_parse((const uint8_t *)"\x84\x01\x01\x01\x02\xa1" "a\x01\xa2" "ab\x01",
                                12, &m, &e),
                   0);
  sk_msg_free(&m);
  /* a map of 300 keys "k0".."k299" (sorted, not compared pairwise), and
   * the same with "k7" again as its last */
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  for (int dup = 0; dup < 2; dup++) {
    sb.size = 0;
    msgpack_pack_map(&pk, 300 + (size_t)dup);
    for (int i = 0; i < 300 + dup; i++) {
      char k[8];
      int n = snprintf(k, sizeof k, "k%d", i < 300 ? i : 7);
      msgpack_pack_str_with_body(&pk, k, (size_t)n);
      msgpack_pack_int(&pk, i);
    }
    if (dup) {
      check_parse_bad(sb.data, sb.size, "field 'k7' appears twice in a map");
    } else {
      assert_int_equal(sk_msg_parse((const uint8_t *)sb.data, sb.size, &m, &e), 0);
      assert_int_equal(m.root.via.map.size, 300);
      sk_msg_free(&m);
    }
  }
  msgpack_sbuffer_destroy(&sb);
}

static void test_msg_depth(void **state) {
  (void)state;
  uint8_t buf[64];
  struct sk_error e = {0};
  /* 16 nested containers: root map {"a": [[[...[nil]...]]]} */
  for (unsigned depth = 1; depth <= 20; depth++) {
    size_t n = 0;
    buf[n++] = 0x81;
    buf[n++] = 0xa1;
    buf[n++] = 'a';
    for (unsigned d = 1; d < depth; d++) buf[n++] = 0x91;
    buf[n++] = 0xc0;
    int rc = sk_msg_check(buf, n, &e);
    if (depth <= SK_MSG_MAX_DEPTH) {
      assert_int_equal(rc, 0);
      struct sk_msg m;
      assert_int_equal(sk_msg_parse(buf, n, &m, &e), 0);
      sk_msg_free(&m);
    } else {
      assert_int_equal(rc, -SK_ERR_BAD_REQUEST);
      assert_string_equal(e.message, "msgpack: nesting deeper than 16");
    }
  }
  /* Empty containers count as a level too. */
  memset(buf, 0x91, 16);
  buf[16] = 0x90;
  assert_int_equal(sk_msg_check(buf, 17, &e), -SK_ERR_BAD_REQUEST);
  assert_int_equal(sk_msg_check(buf + 1, 16, &e), 0);
}

/* Packs a map {key: <value packed by the caller>} body into *m. */
static void parse_or_fail(const msgpack_sbuffer *sb, struct sk_msg *m) {
  struct sk_error e = {0};
  if (sk_msg_parse((const uint8_t *)sb->data, sb->size, m, &e) != 0)
    fail_msg("parse failed: %s", e.message);
}

static void test_msg_getters(void **state) {
  (void)state;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 9);
  sk_test_pack_kv_str(&pk, "max_tokens", "many");
  sk_test_pack_kv_u64(&pk, "top_k", 4294967296u);
  sk_test_pack_kv_i64(&pk, "neg", -3);
  sk_test_pack_kv_u64(&pk, "huge", UINT64_MAX);
  sk_pack_cstr(&pk, "nan");
  msgpack_pack_double(&pk, 0.0 / 0.0);
  sk_test_pack_kv_str(&pk, "flag", "yes");
  sk_test_pack_kv_bool(&pk, "arr", true);
  sk_test_pack_kv_u64(&pk, "session", 12);
  sk_pack_cstr(&pk, "stop");
  msgpack_pack_map(&pk, 0);
  struct sk_msg m;
  parse_or_fail(&sb, &m);
  const msgpack_object *root = &m.root;
  struct sk_error e = {0};
  uint64_t u = 0;
  int64_t i = 0;
  double d = 0;
  bool b = false;
  const char *s;
  size_t sl;
  const msgpack_object_array *a;

  assert_int_equal(sk_msg_get_u64(root, "max_tokens", 1048576, &u, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message,
                      "field 'max_tokens' must be an unsigned integer (got "
                      "string)");
  assert_int_equal(sk_msg_get_u64(root, "top_k", UINT32_MAX, &u, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'top_k' out of range (max 4294967295)");
  assert_int_equal(sk_msg_get_u64(root, "neg", 10, &u, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message,
                      "field 'neg' must be an unsigned integer (got negative "
                      "integer)");
  assert_int_equal(sk_msg_get_i64(root, "huge", &i, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message,
                      "field 'huge' out of range (max 9223372036854775807)");
  assert_int_equal(sk_msg_get_i64(root, "neg", &i, &e), 1);
  assert_int_equal(i, -3);
  assert_int_equal(sk_msg_get_i64(root, "flag", &i, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'flag' must be an integer (got string)");
  assert_int_equal(sk_msg_get_f64(root, "nan", &d, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'nan' must be a finite number");
  assert_int_equal(sk_msg_get_f64(root, "arr", &d, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'arr' must be a number (got boolean)");
  assert_int_equal(sk_msg_get_bool(root, "flag", &b, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'flag' must be a boolean (got string)");
  assert_int_equal(sk_msg_get_str(root, "session", &s, &sl, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message,
                      "field 'session' must be a string (got integer)");
  assert_int_equal(sk_msg_get_array(root, "stop", &a, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'stop' must be an array (got map)");
  assert_int_equal(sk_msg_need_u64(root, "sesion", UINT64_MAX, &u, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'sesion'");
  assert_int_equal(sk_msg_need_str(root, "text", &s, &sl, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'text'");
  assert_int_equal(sk_msg_need_u64(root, "session", UINT64_MAX, &u, &e), 0);
  assert_int_equal(u, 12);
  assert_int_equal(sk_msg_need_u64(root, "session", 11, &u, &e),
                   -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'session' out of range (max 11)");
  /* Getters on a non-map give "absent". */
  assert_int_equal(sk_msg_get_u64(NULL, "x", 1, &u, &e), 0);
  sk_msg_free(&m);
  msgpack_sbuffer_destroy(&sb);
}

/* ---- builder ---------------------------------------------------------- */

static void test_msg_builder(void **state) {
  (void)state;
  struct sk_msgbuf b;
  assert_int_equal(sk_msgbuf_init(&b), 0);
  msgpack_pack_map(&b.pk, 2);
  sk_test_pack_kv_u64(&b.pk, "id", 1);
  sk_test_pack_kv_bool(&b.pk, "ok", true);
  assert_int_equal(sk_msgbuf_finish(&b), 13);
  static const uint8_t want[] = {0x00, 0x00, 0x00, 0x09, 0x82, 0xa2, 0x69,
                                 0x64, 0x01, 0xa2, 0x6f, 0x6b, 0xc3};
  assert_memory_equal(b.sbuf.data, want, sizeof want);
  sk_msgbuf_free(&b);
  sk_msgbuf_free(&b);

  /* The man page's ping request, exactly. */
  assert_int_equal(sk_msgbuf_init(&b), 0);
  msgpack_pack_map(&b.pk, 2);
  sk_test_pack_kv_u64(&b.pk, "id", 1);
  sk_test_pack_kv_str(&b.pk, "op", "ping");
  assert_int_equal(sk_msgbuf_finish(&b), sizeof ping_frame);
  assert_memory_equal(b.sbuf.data, ping_frame, sizeof ping_frame);
  size_t size = 0;
  char *bytes = sk_msgbuf_release(&b, &size);
  assert_int_equal(size, sizeof ping_frame);
  assert_memory_equal(bytes, ping_frame, sizeof ping_frame);
  free(bytes);
  sk_msgbuf_free(&b);
}

static void test_msg_pack_error(void **state) {
  (void)state;
  struct sk_error in;
  sk_error_set(&in, SK_ERR_NO_SUCH_SESSION, "no session %d", 42);
  struct sk_msgbuf b;
  assert_int_equal(sk_msgbuf_init(&b), 0);
  assert_int_equal(sk_wire_pack_error(&b, 9, &in), 0);
  assert_int_equal(sk_msgbuf_finish(&b), (int64_t)b.sbuf.size); /* again */
  const uint8_t *frame = (const uint8_t *)b.sbuf.data;
  assert_int_equal(sk_frame_header_get(frame), b.sbuf.size - 4);

  struct sk_msg m;
  struct sk_error e = {0};
  assert_int_equal(sk_msg_parse(frame + 4, b.sbuf.size - 4, &m, &e), 0);
  uint64_t id;
  bool ok = true;
  assert_int_equal(sk_msg_need_u64(&m.root, "id", UINT64_MAX, &id, &e), 0);
  assert_int_equal(id, 9);
  assert_int_equal(sk_msg_get_bool(&m.root, "ok", &ok, &e), 1);
  assert_false(ok);
  const msgpack_object *eo = sk_msg_get(&m.root, "error");
  assert_non_null(eo);
  const char *code, *msg;
  size_t code_len, msg_len;
  assert_int_equal(sk_msg_need_str(eo, "code", &code, &code_len, &e), 0);
  assert_int_equal(sk_msg_need_str(eo, "message", &msg, &msg_len, &e), 0);
  assert_int_equal(sk_error_from_name(code, code_len), SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(msg_len, strlen("no session 42"));
  assert_memory_equal(msg, "no session 42", msg_len);
  sk_msg_free(&m);
  sk_msgbuf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_error_names_round_trip),
      cmocka_unit_test(test_error_set),
      cmocka_unit_test(test_frame_header),
      cmocka_unit_test(test_frame_split_everywhere),
      cmocka_unit_test(test_frame_max_and_resync),
      cmocka_unit_test(test_frame_huge_declared),
      cmocka_unit_test(test_frame_zero_length),
      cmocka_unit_test(test_frame_bounded),
      cmocka_unit_test(test_frame_trim),
      cmocka_unit_test(test_msg_valid),
      cmocka_unit_test(test_msg_hostile),
      cmocka_unit_test(test_msg_duplicate_keys),
      cmocka_unit_test(test_msg_depth),
      cmocka_unit_test(test_msg_getters),
      cmocka_unit_test(test_msg_builder),
      cmocka_unit_test(test_msg_pack_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
