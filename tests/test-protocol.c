/* Tests of the protocol pieces: error codes, the frame reader, the msgpack
 * check/parse/getters/builder, and (against a fake daemon on a socketpair)
 * the libsinkd client. */
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

/* ---- client, against a fake daemon ------------------------------------ */

/* A fake sinkd: a thread that accepts one connection on a Unix socket in
 * a temporary directory and answers requests with canned replies. It
 * records what it received; the test asserts on it afterwards (cmocka
 * assertions must stay on the main thread). */
enum fake_mode {
  FAKE_NORMAL,
  FAKE_WRONG_ID,     /* replies carry another id */
  FAKE_HANGUP,       /* closes the connection on the first request */
  FAKE_ID0,          /* answers with an id-0 too_large error */
  FAKE_HUGE_FRAME,   /* sends a frame header above the ceiling */
  FAKE_NOT_MAP,      /* sends a reply that is an array */
  FAKE_SILENT,       /* never answers */
};

#define FAKE_MAX_REQ 32

struct fake {
  char *dir, *path;
  int listen_fd;
  pthread_t thread;
  enum fake_mode mode;
  bool final_before_cancel_reply; /* order of the two replies on cancel */
  struct sk_frame_reader rd;
  /* Requests received, as raw bodies. */
  uint8_t *req[FAKE_MAX_REQ];
  size_t req_len[FAKE_MAX_REQ];
  size_t n_req;
};

static void fake_write(int fd, struct sk_msgbuf *b) {
  int64_t n = sk_msgbuf_finish(b);
  const char *p = b->sbuf.data;
  while (n > 0) {
    ssize_t w = send(fd, p, (size_t)n, MSG_NOSIGNAL);
    if (w <= 0) break;
    p += w;
    n -= w;
  }
  sk_msgbuf_free(b);
}

static void fake_error(int fd, uint64_t id, int code, const char *message) {
  struct sk_error e;
  sk_error_set(&e, code, "%s", message);
  struct sk_msgbuf b;
  sk_msgbuf_init(&b);
  sk_wire_pack_error(&b, id, &e);
  fake_write(fd, &b);
}

/* Reads the next request; returns false when the client has gone. The
 * body is recorded and parsed into *msg (caller frees). */
static bool fake_read(struct fake *f, int fd, struct sk_msg *msg) {
  for (;;) {
    const uint8_t *body;
    size_t len;
    if (sk_frame_reader_next(&f->rd, &body, &len) == 1) {
      if (f->n_req < FAKE_MAX_REQ) {
        f->req[f->n_req] = malloc(len);
        memcpy(f->req[f->n_req], body, len);
        f->req_len[f->n_req++] = len;
      }
      return sk_msg_parse(body, len, msg, NULL) == 0;
    }
    uint8_t buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    sk_frame_reader_feed(&f->rd, buf, (size_t)n);
  }
}

/* The evicted ranges of the fake's append and generate replies. */
static const struct sk_range fake_ranges[2] = {{4, 5}, {9, 9}};

static void fake_token(int fd, uint64_t id, int32_t token, const char *text,
                       bool with_top) {
  /* a float32 logit and one sent as a whole number of float32 */
  const struct sk_top_pair top[2] = {{token, 1.5}, {3, -2.25}};
  struct sk_token_event ev = {.token = token, .text = text, .text_len = strlen(text),
                              .top = top, .n_top = with_top ? 2 : 0};
  struct sk_msgbuf b;
  if (sk_wire_pack_token_event(&b, id, &ev) == 0) fake_write(fd, &b);
}

static void fake_generate_final(int fd, uint64_t id, const char *stop,
                                uint64_t n) {
  struct sk_generate_result g = {.stop_token = -1, .n_tokens = n, .prompt_tokens = 4,
                                 .completion_tokens = n, .evicted = 3, .resident = 20,
                                 .seen = 23, .n_ranges = 2};
  snprintf(g.stop, sizeof g.stop, "%s", stop);
  memcpy(g.ranges, fake_ranges, sizeof fake_ranges);
  struct sk_msgbuf b;
  if (sk_wire_pack_generate(&b, id, &g, NULL, 0, NULL, 0) == 0) fake_write(fd, &b);
}

static void fake_generate(struct fake *f, int fd, uint64_t id,
                          const msgpack_object *req) {
  uint64_t max_tokens = 0, n_top = 0;
  sk_msg_get_u64(req, "max_tokens", UINT64_MAX, &max_tokens, NULL);
  sk_msg_get_u64(req, "n_top", UINT64_MAX, &n_top, NULL);
  if (max_tokens == 4) { /* a model's text that holds terminal controls */
    fake_token(fd, id, 20, "\x1b]0;owned\x07", false); /* retitle the window */
    fake_token(fd, id, 21, "\x1b[2J", false);           /* clear the screen */
    fake_token(fd, id, 22, "ok\r\n\xc3\xbc", false);
    fake_token(fd, id, 23, "\xc2\x9b" "31m", false);      /* C1 CSI, in UTF-8 */
    fake_generate_final(fd, id, "length", 4);
    return;
  }
  if (max_tokens == 3) { /* three events, then the final reply */
    fake_token(fd, id, 10, "a", n_top > 0);
    fake_token(fd, id, 11, "", n_top > 0);
    fake_token(fd, id, 12, "\xc3\xbc", n_top > 0);
    /* as if the last token ended in one of the stop strings */
    fake_generate_final(fd, id, sk_msg_get(req, "stop") ? "stop" : "length", 3);
    return;
  }
  /* Otherwise stream until a cancel arrives. */
  fake_token(fd, id, 10, "a", false);
  fake_token(fd, id, 11, "b", false);
  struct sk_msg msg;
  if (!fake_read(f, fd, &msg)) return;
  uint64_t cancel_id = 0;
  sk_msg_get_u64(&msg.root, "id", UINT64_MAX, &cancel_id, NULL);
  sk_msg_free(&msg);
  /* One more event already on its way when the cancel arrived. */
  fake_token(fd, id, 12, "c", false);
  struct sk_msgbuf b;
  if (f->final_before_cancel_reply) fake_generate_final(fd, id, "cancelled", 3);
  if (sk_wire_pack_cancel(&b, cancel_id, true) == 0) fake_write(fd, &b);
  if (!f->final_before_cancel_reply) fake_generate_final(fd, id, "cancelled", 3);
}

static void fake_answer(struct fake *f, int fd, const msgpack_object *req) {
  uint64_t id = 0, session = 0;
  const char *op = "";
  size_t op_len = 0;
  sk_msg_get_u64(req, "id", UINT64_MAX, &id, NULL);
  sk_msg_get_str(req, "op", &op, &op_len, NULL);
  int has_session = sk_msg_get_u64(req, "session", UINT64_MAX, &session, NULL);
  struct sk_msgbuf b;
#define OP(name) (op_len == strlen(name) && memcmp(op, name, op_len) == 0)
  if (session == 99) {
    fake_error(fd, id, SK_ERR_NO_SUCH_SESSION, "no session 99");
  } else if (OP("ping")) {
    if (sk_wire_pack_ok(&b, id) == 0) fake_write(fd, &b);
  } else if (OP("hello")) {
    struct sk_hello h = {
        .protocol = 1,
        .server = "sinkd",
        .version = "0.1.0",
        .compute = {.kernel = "avx2", .threads = 2, .max_batch = 64},
        .model = {.weight_type = "q8_0", .weight_bytes = 5000000000u, .name = "stories260K",
                  .n_vocab = 512, .n_ctx_train = 512, .n_layer = 5, .dim = 64, .n_head = 8,
                  .n_kv_head = 4},
        .defaults = {.policy = "streaming", .n_sink = 4, .window = 252, .capacity = 256},
    };
    const struct sk_wire_hello_extra x = {.model_file = "/models/stories260K.gguf"};
    if (sk_wire_pack_hello(&b, id, &h, &x) == 0) fake_write(fd, &b);
  } else if (OP("open")) {
    struct sk_open_result o = {.session = 7, .policy = "streaming", .capacity = 260,
                               .kv_bytes = 1234, .object_bytes = 4096, .rope_scale = 1.0};
    if (sk_wire_pack_open(&b, id, &o) == 0) fake_write(fd, &b);
  } else if (OP("close")) {
    if (sk_wire_pack_ok(&b, id) == 0) fake_write(fd, &b);
  } else if (OP("list")) {
    /* the first row as this daemon's (wire), the second as an older
     * daemon's, with only the fields it had */
    struct sk_session_info row = {.session = 7, .policy = "streaming", .capacity = 260,
                                  .resident = 100, .seen = 5000000000u, .adopted = true,
                                  .kv_type = "f32", .owner_uid = 1000, .kv_bytes = 4u << 20,
                                  .object_bytes = 5u << 20,
                                  .age_s = 90061 /* 1d 1h 1m 1s */,
                                  .idle_s = 3700 /* 1h 1m 40s */, .temporary = true};
    struct frame_rows {
      struct sk_msgbuf b;
      struct sk_msg msg;
    } one;
    /* (no cmocka assertions on this thread: a failure shows as a missing
     * reply) */
    if (sk_wire_pack_list(&one.b, id, &row, 1) < 0) return;
    int64_t size = sk_msgbuf_finish(&one.b);
    if (size < 0 || sk_msg_parse((const uint8_t *)one.b.sbuf.data + SK_FRAME_HEADER_SIZE,
                                 (size_t)size - SK_FRAME_HEADER_SIZE, &one.msg, NULL) < 0) {
      sk_msgbuf_free(&one.b);
      return;
    }
    const msgpack_object *first = &sk_msg_get(&one.msg.root, "sessions")->via.array.ptr[0];
    sk_msgbuf_init(&b);
    struct sk_wire_map m, old;
    sk_wire_map_begin(&m, &b.pk);
    sk_wire_map_u64(&m, "id", id);
    sk_wire_map_bool(&m, "ok", true);
    msgpack_packer *pk = sk_wire_map_key(&m, "sessions");
    msgpack_pack_array(pk, 2);
    msgpack_pack_object(pk, *first);
    sk_wire_map_begin(&old, pk);
    sk_wire_map_u64(&old, "session", 8);
    sk_wire_map_str(&old, "policy", "dense");
    sk_wire_map_u64(&old, "capacity", 260);
    sk_wire_map_u64(&old, "resident", 101);
    sk_wire_map_u64(&old, "seen", 5000000000u);
    sk_wire_map_bool(&old, "adopted", false);
    sk_wire_map_end(&old);
    sk_wire_map_end(&m);
    sk_msg_free(&one.msg);
    sk_msgbuf_free(&one.b);
    fake_write(fd, &b);
  } else if (OP("stats") && has_session == 1) {
    static struct sk_session_stats st; /* ~3 KiB: off the fake's stack */
    memset(&st, 0, sizeof st);
    st.session = session;
    snprintf(st.policy, sizeof st.policy, "streaming");
    st.n_sink = 4;
    st.window = 256;
    st.capacity = 260;
    st.resident = 260;
    st.seen = 1000;
    st.evicted = 740;
    st.kv_bytes = 1234;
    st.object_bytes = 4096;
    st.rope_scale = st.model_rope_scale = 1.0;
    st.has_positions = session != 8;
    st.position_last = 259;
    if (sk_wire_pack_session_stats(&b, id, &st, NULL) < 0) return;
    fake_write(fd, &b);
  } else if (OP("stats")) {
    struct sk_daemon_stats st = {.sessions = 2, .clients = 1, .uptime_s = 60,
                                 .tokens_prefilled = 123, .tokens_generated = 456,
                                 .memory_bytes = 8192, .adopted = 1, .has_user = true,
                                 .user_sessions = 1, .user_memory_bytes = 4096,
                                 .max_user_sessions = 16, .max_user_memory = 0,
                                 .weights_mapped_bytes = 3u << 20,
                                 .weights_repacked_bytes = 512u << 10};
    struct sk_wire_daemon_extra x = {.chat_template = "none", .state_dir = "/run/sinkd"};
    if (sk_wire_pack_daemon_stats(&b, id, &st, &x) < 0) return;
    fake_write(fd, &b);
  } else if (OP("append")) {
    struct sk_append_result a = {.n_tokens = 5, .resident = 20, .seen = 25, .evicted = 3,
                                 .n_ranges = 2};
    memcpy(a.ranges, fake_ranges, sizeof fake_ranges);
    if (sk_wire_pack_append(&b, id, &a, NULL) == 0) fake_write(fd, &b);
  } else if (OP("tokenize")) {
    const int32_t ids[3] = {1, 365, 2147483647};
    if (sk_wire_pack_tokens(&b, id, ids, 3) == 0) fake_write(fd, &b);
  } else if (OP("detokenize")) {
    if (sk_wire_pack_text(&b, id, "he\0llo", 6) == 0) fake_write(fd, &b);
  } else if (OP("generate")) {
    fake_generate(f, fd, id, req);
  } else if (OP("cancel")) {
    if (sk_wire_pack_cancel(&b, id, false) == 0) fake_write(fd, &b);
  } else if (OP("resume") || OP("fork")) {
    struct sk_session_summary v = {.session = OP("fork") ? 8 : session, .policy = "streaming",
                                   .capacity = 260, .kv_bytes = 57344, .object_bytes = 73728,
                                   .resident = 260,
                                   .seen = 1000, .evicted = 740, .commit = 77, .adopted = true,
                                   .from = OP("fork") ? session : 0};
    if (sk_wire_pack_summary(&b, id, &v, 0) == 0) fake_write(fd, &b);
  } else if (OP("export")) {
    /* session 7: 3 chunks "abc" "de" "" then the reply; 8: a chunk out of
     * order; 9: a size that disagrees with the data */
    const char *parts[3] = {"abc", "de", ""};
    uint64_t off = 0;
    for (int i = 0; i < 3; i++) {
      if (sk_wire_pack_data_event(&b, id, session == 8 && i == 1 ? off + 1 : off, parts[i],
                                  strlen(parts[i])) == 0)
        fake_write(fd, &b);
      off += strlen(parts[i]);
    }
    if (sk_wire_pack_export(&b, id, session, session == 9 ? 6 : 5, 0, 0) == 0) fake_write(fd, &b);
  } else if (OP("import")) {
    uint64_t total = 0, offset = 0;
    const char *data = NULL;
    size_t len = 0;
    sk_msg_get_u64(req, "total", UINT64_MAX, &total, NULL);
    sk_msg_get_u64(req, "offset", UINT64_MAX, &offset, NULL);
    sk_msg_get_str(req, "data", &data, &len, NULL);
    if (len > 100000) { /* as a daemon with a small frame limit does */
      fake_error(fd, 0, SK_ERR_TOO_LARGE, "frame too large");
    } else if (offset + len < total) {
      if (sk_wire_pack_received(&b, id, offset + len) == 0) fake_write(fd, &b);
    } else {
      struct sk_session_summary v = {.session = 12, .policy = "dense", .capacity = 64,
                                     .kv_bytes = 8192, .resident = 5, .seen = 5, .commit = 3};
      if (sk_wire_pack_summary(&b, id, &v, total) == 0) fake_write(fd, &b);
    }
  } else {
    fake_error(fd, id, SK_ERR_UNKNOWN_OP, "unknown op");
  }
#undef OP
}

static void fake_serve(struct fake *f, int fd) {
  struct sk_msg msg;
  while (fake_read(f, fd, &msg)) {
    uint64_t id = 0;
    sk_msg_get_u64(&msg.root, "id", UINT64_MAX, &id, NULL);
    if (f->mode == FAKE_HANGUP) {
      sk_msg_free(&msg);
      break;
    } else if (f->mode == FAKE_WRONG_ID) {
      struct sk_msgbuf b;
      if (sk_wire_pack_ok(&b, id + 5) == 0) fake_write(fd, &b);
    } else if (f->mode == FAKE_ID0) {
      fake_error(fd, 0, SK_ERR_TOO_LARGE, "frame of 2000000 bytes (limit 1048576)");
      f->mode = FAKE_NORMAL;
    } else if (f->mode == FAKE_HUGE_FRAME) {
      send(fd, "\xff\xff\xff\xff\x80", 5, MSG_NOSIGNAL);
    } else if (f->mode == FAKE_SILENT) {
      /* nothing */
    } else if (f->mode == FAKE_NOT_MAP) {
      send(fd, "\x00\x00\x00\x02\x91\x01", 6, MSG_NOSIGNAL);
    } else {
      fake_answer(f, fd, &msg.root);
    }
    sk_msg_free(&msg);
  }
  close(fd);
}

/* Serves connections one after the other until fake_join shuts the
 * listening socket down. */
static void *fake_main(void *arg) {
  struct fake *f = arg;
  for (;;) {
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    sk_frame_reader_free(&f->rd);
    sk_frame_reader_init(&f->rd, SK_FRAME_MAX_DEFAULT);
    fake_serve(f, fd);
  }
}

static struct fake *fake_start(enum fake_mode mode) {
  struct fake *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->mode = mode;
  f->dir = sk_test_tmpdir();
  size_t n = strlen(f->dir) + 16;
  f->path = malloc(n);
  snprintf(f->path, n, "%s/s.sock", f->dir);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  assert_true(strlen(f->path) < sizeof addr.sun_path);
  strcpy(addr.sun_path, f->path);
  f->listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(f->listen_fd >= 0);
  assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(f->listen_fd, 4), 0);
  sk_frame_reader_init(&f->rd, SK_FRAME_MAX_DEFAULT);
  assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
  return f;
}

/* Joins the thread (the client must have been freed first, so the fake
 * sees the connection end). The requests stay readable until fake_free. */
static void fake_join(struct fake *f) {
  shutdown(f->listen_fd, SHUT_RDWR); /* wakes accept() */
  pthread_join(f->thread, NULL);
}

static void fake_free(struct fake *f) {
  close(f->listen_fd);
  unlink(f->path);
  rmdir(f->dir);
  for (size_t i = 0; i < f->n_req; i++) free(f->req[i]);
  sk_frame_reader_free(&f->rd);
  free(f->path);
  free(f->dir);
  free(f);
}

/* Request i as received by the fake, parsed (caller frees). */
static void fake_request(struct fake *f, size_t i, struct sk_msg *m) {
  assert_true(i < f->n_req);
  struct sk_error e = {0};
  if (sk_msg_parse(f->req[i], f->req_len[i], m, &e) != 0)
    fail_msg("request %zu: %s", i, e.message);
}

static void assert_op(const struct sk_msg *m, const char *op, uint64_t id) {
  const char *s;
  size_t len;
  uint64_t got;
  assert_int_equal(sk_msg_need_str(&m->root, "op", &s, &len, NULL), 0);
  assert_int_equal(len, strlen(op));
  assert_memory_equal(s, op, len);
  assert_int_equal(sk_msg_need_u64(&m->root, "id", UINT64_MAX, &got, NULL), 0);
  assert_int_equal(got, id);
}

static struct sk_client *connect_or_fail(const char *path) {
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(path, &c, &e) != 0) fail_msg("connect: %s", e.message);
  return c;
}

static void test_client_ops(void **state) {
  (void)state;
  struct fake *f = fake_start(FAKE_NORMAL);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};

  assert_int_equal(sk_client_ping(c, &e), 0);

  struct sk_hello h;
  assert_int_equal(sk_client_hello(c, &h, &e), 0);
  assert_int_equal(h.protocol, 1);
  assert_string_equal(h.server, "sinkd");
  assert_string_equal(h.model.name, "stories260K");
  assert_int_equal(h.model.n_kv_head, 4);
  assert_string_equal(h.model.weight_type, "q8_0");
  assert_true(h.model.weight_bytes == 5000000000u);
  assert_string_equal(h.compute.kernel, "avx2");
  assert_int_equal(h.compute.threads, 2);
  assert_int_equal(h.compute.max_batch, 64);
  assert_string_equal(h.defaults.policy, "streaming");
  assert_int_equal(h.defaults.window, 252);

  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, NULL, &o, &e), 0);
  assert_int_equal(o.session, 7);
  assert_int_equal(o.kv_bytes, 1234);
  assert_int_equal(o.object_bytes, 4096);
  struct sk_open_params op = {.policy = "dense", .capacity = 64, .temporary = true};
  assert_int_equal(sk_client_open(c, &op, NULL, &e), 0);

  struct sk_session_info *rows = NULL;
  size_t n = 0;
  assert_int_equal(sk_client_list(c, &rows, &n, &e), 0);
  assert_int_equal(n, 2);
  assert_string_equal(rows[1].policy, "dense");
  assert_int_equal(rows[1].resident, 101);
  assert_true(rows[0].seen == 5000000000u);
  free(rows);

  struct sk_daemon_stats ds;
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.tokens_generated, 456);
  assert_string_equal(ds.compute.kernel, ""); /* an older daemon: left out */
  assert_int_equal(ds.steps, 0);
  struct sk_session_stats ss;
  assert_int_equal(sk_client_session_stats(c, 7, &ss, &e), 0);
  assert_true(ss.has_positions);
  assert_int_equal(ss.position_last, 259);
  assert_int_equal(ss.evicted, 740);
  assert_int_equal(sk_client_session_stats(c, 8, &ss, &e), 0);
  assert_false(ss.has_positions);

  struct sk_append_result ar;
  assert_int_equal(sk_client_append_text(c, 7, "hello", 5, SK_BOS_DEFAULT,
                                         &ar, &e),
                   0);
  assert_int_equal(ar.n_tokens, 5);
  assert_int_equal(ar.n_ranges, 2);
  assert_int_equal(ar.ranges[0].first, 4);
  assert_int_equal(ar.ranges[1].last, 9);
  const int32_t toks[] = {1, 2, 3};
  assert_int_equal(sk_client_append_tokens(c, 7, toks, 3, SK_BOS_FALSE, NULL,
                                           &e),
                   0);

  int32_t *ids = NULL;
  assert_int_equal(sk_client_tokenize(c, "hi", 2, SK_BOS_TRUE, &ids, &n, &e), 0);
  assert_int_equal(n, 3);
  assert_int_equal(ids[1], 365);
  assert_int_equal(ids[2], 2147483647);
  free(ids);
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(sk_client_detokenize(c, toks, 3, &text, &len, &e), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(text, "he\0llo", 7); /* NUL-terminated too */
  free(text);

  bool cancelled = true;
  assert_int_equal(sk_client_cancel(c, 7, &cancelled, &e), 0);
  assert_false(cancelled);
  assert_int_equal(sk_client_close_session(c, 7, &e), 0);

  /* A daemon error: code mapped, message kept, connection still usable. */
  assert_int_equal(sk_client_close_session(c, 99, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(e.code, SK_ERR_NO_SUCH_SESSION);
  assert_string_equal(e.message, "no session 99");
  assert_true(sk_client_connected(c));
  assert_int_equal(sk_client_ping(c, &e), 0);

  sk_client_free(c);
  fake_join(f);

  /* What the fake received: ids count up from 1; fields left at "daemon
   * default" are omitted. */
  static const char *const ops[] = {
      "ping", "hello", "open", "open", "list", "stats", "stats", "stats",
      "append", "append", "tokenize", "detokenize", "cancel", "close",
      "close", "ping"};
  assert_int_equal(f->n_req, sizeof ops / sizeof ops[0]);
  struct sk_msg m;
  for (size_t i = 0; i < f->n_req; i++) {
    fake_request(f, i, &m);
    assert_op(&m, ops[i], i + 1);
    sk_msg_free(&m);
  }
  fake_request(f, 2, &m); /* open, all defaults */
  assert_int_equal(m.root.via.map.size, 2);
  sk_msg_free(&m);
  fake_request(f, 3, &m); /* open dense, capacity 64, temporary */
  assert_int_equal(m.root.via.map.size, 5);
  assert_null(sk_msg_get(&m.root, "n_sink"));
  uint64_t u;
  assert_int_equal(sk_msg_get_u64(&m.root, "capacity", UINT64_MAX, &u, NULL), 1);
  assert_int_equal(u, 64);
  bool temporary = false;
  assert_int_equal(sk_msg_get_bool(&m.root, "temporary", &temporary, NULL), 1);
  assert_true(temporary);
  sk_msg_free(&m);
  fake_request(f, 8, &m); /* append text, bos default: no bos field */
  assert_null(sk_msg_get(&m.root, "bos"));
  const char *str;
  size_t slen;
  assert_int_equal(sk_msg_need_str(&m.root, "text", &str, &slen, NULL), 0);
  assert_int_equal(slen, 5);
  sk_msg_free(&m);
  fake_request(f, 9, &m); /* append tokens, bos false */
  bool bos = true;
  assert_int_equal(sk_msg_get_bool(&m.root, "bos", &bos, NULL), 1);
  assert_false(bos);
  const msgpack_object_array *a;
  assert_int_equal(sk_msg_get_array(&m.root, "tokens", &a, NULL), 1);
  assert_int_equal(a->size, 3);
  assert_int_equal(a->ptr[2].via.u64, 3);
  sk_msg_free(&m);
  fake_request(f, 10, &m); /* tokenize, bos true */
  assert_int_equal(sk_msg_get_bool(&m.root, "bos", &bos, NULL), 1);
  assert_true(bos);
  sk_msg_free(&m);
  fake_free(f);
}

/* Collects what the token callback sees. */
struct tok_log {
  int n;
  int32_t tokens[8];
  char text[64];
  size_t n_top[8];
  double top_logit[8];
  int stop_after; /* return nonzero from the callback after this many */
};

static int tok_cb(void *user, const struct sk_token_event *ev) {
  struct tok_log *t = user;
  if (t->n < 8) {
    t->tokens[t->n] = ev->token;
    t->n_top[t->n] = ev->n_top;
    t->top_logit[t->n] = ev->n_top ? ev->top[1].logit : 0;
    strncat(t->text, ev->text, ev->text_len);
  }
  t->n++;
  return t->stop_after && t->n >= t->stop_after;
}

/* resume, fork, export (data events in order, size checked) and import
 * (chunked; a too_large refusal halves the chunk and resends it). */
static void test_client_persistence(void **state) {
  (void)state;
  struct fake *f = fake_start(FAKE_NORMAL);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};
  struct sk_session_summary s;
  assert_int_equal(sk_client_resume(c, 7, &s, &e), 0);
  assert_int_equal(s.session, 7);
  assert_string_equal(s.policy, "streaming");
  assert_int_equal(s.kv_bytes, 57344);
  assert_int_equal(s.object_bytes, 73728);
  assert_int_equal(s.evicted, 740);
  assert_int_equal(s.commit, 77);
  assert_true(s.adopted);
  assert_int_equal(s.from, 0);
  assert_int_equal(sk_client_resume(c, 99, &s, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(sk_client_fork(c, 7, &s, &e), 0);
  assert_int_equal(s.session, 8);
  assert_int_equal(s.from, 7);

  void *data = NULL;
  size_t len = 0;
  assert_int_equal(sk_client_export(c, 7, &data, &len, &e), 0);
  assert_int_equal(len, 5);
  assert_memory_equal(data, "abcde", 5);
  free(data);

  /* 300000 bytes: 256 KiB refused, 128 KiB refused, then 64 KiB chunks */
  size_t big = 300000;
  char *img = malloc(big);
  assert_non_null(img);
  for (size_t i = 0; i < big; i++) img[i] = (char)(i * 7);
  size_t n_before = f->n_req;
  assert_int_equal(sk_client_import(c, img, big, &s, &e), 0);
  assert_int_equal(s.session, 12);
  assert_string_equal(s.policy, "dense");
  /* 2 refused + ceil(300000 / 65536) = 5 chunks */
  assert_int_equal(f->n_req - n_before, 7);
  uint64_t want_off = 0;
  for (size_t i = n_before + 2; i < f->n_req; i++) {
    struct sk_msg m;
    fake_request(f, i, &m);
    uint64_t off = 0, total = 0;
    const char *d;
    size_t dl;
    assert_int_equal(sk_msg_need_u64(&m.root, "offset", UINT64_MAX, &off, NULL), 0);
    assert_int_equal(sk_msg_need_u64(&m.root, "total", UINT64_MAX, &total, NULL), 0);
    assert_int_equal(sk_msg_need_str(&m.root, "data", &d, &dl, NULL), 0);
    assert_int_equal(off, want_off);
    assert_int_equal(total, big);
    assert_memory_equal(d, img + off, dl);
    want_off += dl;
    sk_msg_free(&m);
  }
  assert_int_equal(want_off, big);
  free(img);

  /* the daemon breaking the export stream is a protocol error */
  assert_int_equal(sk_client_export(c, 8, &data, &len, &e), -SK_ERR_PROTOCOL);
  assert_non_null(strstr(e.message, "out of order"));
  sk_client_free(c);
  c = connect_or_fail(f->path);
  assert_int_equal(sk_client_export(c, 9, &data, &len, &e), -SK_ERR_PROTOCOL);
  assert_non_null(strstr(e.message, "size"));
  sk_client_free(c);
  fake_join(f);
  fake_free(f);
}

static void test_client_generate(void **state) {
  (void)state;
  struct fake *f = fake_start(FAKE_NORMAL);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};

  struct sk_generate_params p;
  sk_generate_params_init(&p);
  assert_int_equal(p.max_tokens, 128);
  assert_true(p.temperature == 0.8);
  assert_int_equal(p.top_k, 40);
  assert_true(p.top_p == 0.95);
  p.max_tokens = 3;
  p.n_top = 2;
  const char *stops[] = {"\n\n", "The end"};
  p.stop = stops;
  p.n_stop = 2;
  p.seed = 42;
  p.has_seed = true;
  p.prompt = "Once";
  struct tok_log t = {0};
  struct sk_generate_result r;
  assert_int_equal(sk_client_generate(c, 7, &p, tok_cb, &t, &r, &e), 0);
  assert_int_equal(t.n, 3);
  assert_int_equal(t.tokens[0], 10);
  assert_int_equal(t.tokens[2], 12);
  assert_string_equal(t.text, "a\xc3\xbc");
  assert_int_equal(t.n_top[0], 2);
  assert_true(t.top_logit[0] == -2.25);
  assert_string_equal(r.stop, "stop"); /* the fake stops on a stop string if given any */
  assert_int_equal(r.n_tokens, 3);
  assert_int_equal(r.prompt_tokens, 4);
  assert_int_equal(r.completion_tokens, 3);
  assert_int_equal(r.seen, 23);
  assert_int_equal(r.n_ranges, 2);

  /* Without a callback. */
  p.n_top = 0;
  assert_int_equal(sk_client_generate(c, 7, &p, NULL, NULL, NULL, &e), 0);

  /* A callback that stops: a cancel goes out, later events are not given
   * to the callback, and the final reply says "cancelled". Both orders of
   * the final reply and the cancel's reply. */
  for (int order = 0; order < 2; order++) {
    f->final_before_cancel_reply = order == 1;
    sk_generate_params_init(&p);
    struct tok_log t2 = {.stop_after = 1};
    assert_int_equal(sk_client_generate(c, 7, &p, tok_cb, &t2, &r, &e), 0);
    assert_int_equal(t2.n, 1);
    assert_string_equal(r.stop, "cancelled");
    /* The stream is in step: the next request works. */
    assert_int_equal(sk_client_ping(c, &e), 0);
  }

  /* An error before generation. */
  assert_int_equal(sk_client_generate(c, 99, NULL, tok_cb, &t, &r, &e),
                   -SK_ERR_NO_SUCH_SESSION);
  assert_string_equal(e.message, "no session 99");

  sk_client_free(c);
  fake_join(f);

  /* Requests: generate(1), generate(2), generate(3), cancel(4), ping(5),
   * generate(6), cancel(7), ping(8), generate(9). */
  static const char *const ops[] = {"generate", "generate", "generate",
                                    "cancel",   "ping",     "generate",
                                    "cancel",   "ping",     "generate"};
  assert_int_equal(f->n_req, sizeof ops / sizeof ops[0]);
  struct sk_msg m;
  for (size_t i = 0; i < f->n_req; i++) {
    fake_request(f, i, &m);
    assert_op(&m, ops[i], i + 1);
    sk_msg_free(&m);
  }
  fake_request(f, 0, &m);
  uint64_t u;
  double d;
  const msgpack_object_array *a;
  const char *str;
  size_t slen;
  assert_int_equal(sk_msg_get_u64(&m.root, "seed", UINT64_MAX, &u, NULL), 1);
  assert_int_equal(u, 42);
  assert_int_equal(sk_msg_get_f64(&m.root, "top_p", &d, NULL), 1);
  assert_true(d == 0.95);
  assert_int_equal(sk_msg_get_array(&m.root, "stop", &a, NULL), 1);
  assert_int_equal(a->size, 2);
  assert_int_equal(sk_msg_need_str(&m.root, "prompt", &str, &slen, NULL), 0);
  assert_int_equal(slen, 4);
  assert_int_equal(sk_msg_get_u64(&m.root, "n_top", UINT64_MAX, &u, NULL), 1);
  sk_msg_free(&m);
  fake_request(f, 3, &m); /* the cancel names the session */
  assert_int_equal(sk_msg_need_u64(&m.root, "session", UINT64_MAX, &u, NULL), 0);
  assert_int_equal(u, 7);
  sk_msg_free(&m);
  fake_request(f, 2, &m); /* defaults: no seed, stop, prompt or n_top */
  assert_null(sk_msg_get(&m.root, "seed"));
  assert_null(sk_msg_get(&m.root, "stop"));
  assert_null(sk_msg_get(&m.root, "n_top"));
  sk_msg_free(&m);
  fake_free(f);
}

/* Transport failures: each closes the connection, and later calls say
 * so. */
static void test_client_failures(void **state) {
  (void)state;
  static const struct {
    enum fake_mode mode;
    int code;
    const char *message;
  } cases[] = {
      {FAKE_WRONG_ID, SK_ERR_PROTOCOL, "reply with id 6 while waiting for 1"},
      {FAKE_HANGUP, SK_ERR_DISCONNECTED, "the daemon closed the connection"},
      {FAKE_HUGE_FRAME, SK_ERR_PROTOCOL,
       "the daemon sent a frame of 4294967295 bytes (limit 16777216)"},
      {FAKE_NOT_MAP, SK_ERR_PROTOCOL,
       "invalid reply from the daemon: request must be a map, got array"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct fake *f = fake_start(cases[i].mode);
    struct sk_client *c = connect_or_fail(f->path);
    struct sk_error e = {0};
    assert_int_equal(sk_client_ping(c, &e), -cases[i].code);
    assert_string_equal(e.message, cases[i].message);
    assert_false(sk_client_connected(c));
    assert_int_equal(sk_client_ping(c, &e), -SK_ERR_DISCONNECTED);
    sk_client_free(c);
    fake_join(f);
    fake_free(f);
  }

  /* A timeout closes the connection too (the reply may still come). */
  {
    struct fake *fs = fake_start(FAKE_SILENT);
    struct sk_client *cs = connect_or_fail(fs->path);
    struct sk_error es = {0};
    assert_int_equal(sk_client_set_timeout(cs, 100, &es), 0);
    assert_int_equal(sk_client_ping(cs, &es), -SK_ERR_IO);
    assert_string_equal(es.message, "timed out waiting for the daemon (100 ms)");
    assert_false(sk_client_connected(cs));
    sk_client_free(cs);
    fake_join(fs);
    fake_free(fs);
  }

  /* An id-0 error (a frame the daemon could not read) answers the request
   * and leaves the connection usable. */
  struct fake *f = fake_start(FAKE_ID0);
  struct sk_client *c = connect_or_fail(f->path);
  struct sk_error e = {0};
  assert_int_equal(sk_client_append_text(c, 7, "x", 1, SK_BOS_DEFAULT, NULL,
                                         &e),
                   -SK_ERR_TOO_LARGE);
  assert_string_equal(e.message, "frame of 2000000 bytes (limit 1048576)");
  assert_true(sk_client_connected(c));
  assert_int_equal(sk_client_ping(c, &e), 0);
  sk_client_free(c);
  fake_join(f);
  fake_free(f);
}

/* Connects to path as another user (root only: setuid to nobody in a
 * child) or, for an ordinary user, after taking the owner's write bit away;
 * returns the error message. */
static void connect_denied(const char *path, char *msg, size_t size) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    if (getuid() == 0 && (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0))
      _exit(1);
    struct sk_client *c = NULL;
    struct sk_error e = {0};
    int rc = sk_client_connect(path, &c, &e);
    dprintf(p[1], "%d %s", rc, e.message);
    _exit(0);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while ((r = read(p[0], msg + n, size - 1 - n)) > 0) n += (size_t)r;
  msg[n] = 0;
  close(p[0]);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* EACCES: the message says which permission is missing and what to do. */
static void check_permission_denied(const char *dir) {
  char msg[1024], want[1024];
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  char *path = addr.sun_path;
  assert_true(strlen(dir) + 13 < sizeof addr.sun_path);
  snprintf(path, sizeof addr.sun_path, "%s/denied.sock", dir);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(fd, 4), 0);
  if (getuid() == 0) {
    /* A folder nobody may search (mkdtemp made it 0700). */
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%d cannot connect to %s: permission denied on a folder of the path "
             "(Permission denied)", -SK_ERR_IO, path);
    assert_string_equal(msg, want);
    assert_int_equal(chmod(dir, 0755), 0);
    /* The socket's group, named. */
    assert_int_equal(chmod(path, 0660), 0);
    assert_int_equal(chown(path, 0, 0), 0);
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%d cannot connect to %s: permission denied (mode 0660, group 'root'): only "
             "its owner and group may connect; ask them for another group, or run your own "
             "sinkd with --socket",
             -SK_ERR_IO, path);
    assert_string_equal(msg, want);
    /* Another group: join it (daemon, gid 1, as the sinkd group would be). */
    struct group *ng = getgrgid(1);
    if (ng) {
      char gname[64];
      snprintf(gname, sizeof gname, "%s", ng->gr_name);
      assert_int_equal(chown(path, 0, 1), 0);
      connect_denied(path, msg, sizeof msg);
      snprintf(want, sizeof want,
               "%d cannot connect to %s: permission denied (mode 0660, group '%s'): join "
               "the group with `sudo usermod -aG %s $USER`, then log in again",
               -SK_ERR_IO, path, gname, gname);
      assert_string_equal(msg, want);
      assert_int_equal(chown(path, 0, 0), 0);
    }
    /* No group access at all. */
    assert_int_equal(chmod(path, 0600), 0);
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want,
             "%d cannot connect to %s: permission denied (mode 0600: only its owner may "
             "connect)", -SK_ERR_IO, path);
    assert_string_equal(msg, want);
    assert_int_equal(chmod(dir, 0700), 0);
  } else {
    /* The owner without write permission on the socket. */
    assert_int_equal(chmod(path, 0060), 0);
    connect_denied(path, msg, sizeof msg);
    snprintf(want, sizeof want, "%d cannot connect to %s: permission denied (mode 0060, group '",
             -SK_ERR_IO, path);
    assert_memory_equal(msg, want, strlen(want));
  }
  close(fd);
  unlink(path);
}

static void test_client_connect(void **state) {
  (void)state;
  char *dir = sk_test_tmpdir();
  char path[512];
  snprintf(path, sizeof path, "%s/none.sock", dir);
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(path, &c, &e), -SK_ERR_IO);
  assert_null(c);
  char want[1400];
  /* a path of the caller's choosing: start a daemon there */
  snprintf(want, sizeof want,
           "cannot connect to %s: no such file (is sinkd running? start one "
           "there with `sinkd --model FILE --socket %s`)",
           path, path);
  assert_string_equal(e.message, want);
  /* a path that is there but no socket */
  assert_int_equal(sk_client_connect(dir, &c, &e), -SK_ERR_IO);
  snprintf(want, sizeof want, "cannot connect to %s: not a socket but a folder", dir);
  assert_string_equal(e.message, want);

  /* A socket file nobody listens on: refused, same hint. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, path);
  assert_int_equal(bind(fd, (struct sockaddr *)&addr, sizeof addr), 0);
  close(fd);
  assert_int_equal(sk_client_connect(path, &c, &e), -SK_ERR_IO);
  assert_non_null(strstr(e.message, "connection refused (is sinkd running?"));
  unlink(path);
  /* $XDG_RUNTIME_DIR/sinkd/sinkd.sock: the per-user daemon's hint; another
   * path under $XDG_RUNTIME_DIR: start one there */
  setenv("XDG_RUNTIME_DIR", dir, 1);
  assert_int_equal(sk_client_connect(path, &c, &e), -SK_ERR_IO);
  assert_non_null(strstr(e.message, "start one there with `sinkd --model FILE --socket "));
  char upath[600];
  snprintf(upath, sizeof upath, "%s/sinkd/sinkd.sock", dir);
  assert_int_equal(sk_client_connect(upath, &c, &e), -SK_ERR_IO);
  assert_non_null(strstr(e.message, "start it with `systemctl --user start sinkd.socket`"));
  unsetenv("XDG_RUNTIME_DIR");

  check_permission_denied(dir);

  char longpath[200];
  memset(longpath, 'x', sizeof longpath - 1);
  longpath[sizeof longpath - 1] = 0;
  assert_int_equal(sk_client_connect(longpath, &c, &e), -SK_ERR_IO);

  /* Default path: $SINKD_SOCKET, else $XDG_RUNTIME_DIR/sinkd/sinkd.sock if
   * it exists, else /run/sinkd/sinkd.sock. */
  setenv("SINKD_SOCKET", "/x/y.sock", 1);
  assert_string_equal(sk_client_default_socket(), "/x/y.sock");
  unsetenv("SINKD_SOCKET");
  setenv("XDG_RUNTIME_DIR", dir, 1);
  assert_string_equal(sk_client_default_socket(), "/run/sinkd/sinkd.sock");
  char sub[512];
  snprintf(sub, sizeof sub, "%s/sinkd", dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  snprintf(path, sizeof path, "%s/sinkd/sinkd.sock", dir);
  FILE *touch = fopen(path, "w");
  assert_non_null(touch);
  fclose(touch);
  assert_string_equal(sk_client_default_socket(), path);
  unlink(path);
  rmdir(sub);
  rmdir(dir);
  unsetenv("XDG_RUNTIME_DIR");
  free(dir);
}

/* ---- sinkctl, against the fake daemon ---------------------------------- */

/* Runs $SK_SINKCTL with args (NULL-ended) and stdin from `input`; its
 * stdout and stderr land in out/err (NUL-terminated, *out_len bytes of
 * stdout). Returns the exit status. */
static int run_sinkctl(const char *const *args, const char *input, char *out,
                       size_t out_size, size_t *out_len, char *err,
                       size_t err_size) {
  const char *exe = getenv("SK_SINKCTL");
  char *dir = sk_test_tmpdir();
  char o_path[512], e_path[512], i_path[512];
  snprintf(o_path, sizeof o_path, "%s/out", dir);
  snprintf(e_path, sizeof e_path, "%s/err", dir);
  snprintf(i_path, sizeof i_path, "%s/in", dir);
  FILE *in = fopen(i_path, "w");
  assert_non_null(in);
  fputs(input ? input : "", in);
  fclose(in);
  const char *argv[32] = {"sinkctl"};
  size_t n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(i_path, "r", stdin) || !freopen(o_path, "w", stdout) ||
        !freopen(e_path, "w", stderr))
      _exit(127);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  size_t len = 0;
  char *o = sk_test_read_file(o_path, &len);
  assert_non_null(o);
  assert_true(len < out_size);
  memcpy(out, o, len + 1);
  *out_len = len;
  free(o);
  char *e = sk_test_read_file(e_path, &len);
  assert_non_null(e);
  snprintf(err, err_size, "%s", e);
  free(e);
  unlink(o_path);
  unlink(e_path);
  unlink(i_path);
  rmdir(dir);
  free(dir);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* Runs sinkctl with its stdout and stderr on a pseudo-terminal (a user's
 * terminal); what it wrote in *out (the terminal's bytes: "\n" comes as
 * "\r\n"). Returns the exit status. */
static int run_sinkctl_tty(const char *const *args, char *out, size_t out_size, size_t *out_len) {
  const char *exe = getenv("SK_SINKCTL");
  const char *argv[32] = {"sinkctl"};
  size_t n = 1;
  for (; args[n - 1]; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  fflush(NULL);
  int master = -1;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  assert_true(pid >= 0);
  if (pid == 0) {
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  size_t len = 0;
  for (;;) {
    struct pollfd p = {.fd = master, .events = POLLIN};
    if (poll(&p, 1, 10000) <= 0) break;
    ssize_t r = read(master, out + len, out_size - 1 - len);
    if (r <= 0) break; /* EIO once the child's side is closed */
    len += (size_t)r;
  }
  out[len] = 0;
  *out_len = len;
  close(master);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

static void test_sinkctl(void **state) {
  (void)state;
  const char *exe = getenv("SK_SINKCTL");
  if (!exe || access(exe, X_OK) != 0) {
    print_message("SK_SINKCTL not set or not executable: skipped\n");
    skip();
  }
  struct fake *f = fake_start(FAKE_NORMAL);
  char out[4096], err[4096];
  size_t len;
  const char *P = f->path;
#define RUN(input, ...)                                                    \
  run_sinkctl((const char *const[]){__VA_ARGS__, NULL}, input, out,        \
              sizeof out, &len, err, sizeof err)

  /* A temporary session: open, generate (prompt echoed), close. */
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "--max-tokens", "3",
                       "Once", "upon"),
                   0);
  assert_string_equal(out, "Once upona\xc3\xbc\n");
  assert_string_equal(err, "");
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "-n", "3", "--no-echo",
                       "--seed", "42", "--stop", "x", "--stop", "y", "-v", "Once"),
                   0);
  assert_string_equal(out, "a\xc3\xbc\n");
  assert_non_null(strstr(err, ": stop string; 4 prompt + 3 generated tokens"));
  /* Prompt from stdin; options after the command; --verbose summary. */
  assert_int_equal(RUN("Once\n", "generate", "-", "--socket", P, "-n", "3",
                       "--verbose"),
                   0);
  assert_string_equal(out, "Oncea\xc3\xbc\n"); /* stdin's final newline dropped */
  assert_non_null(strstr(err, "stop length; 4 prompt + 3 generated tokens"));
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "generate", "-n", "3",
                       "--session", "7"),
                   0);
  assert_string_equal(out,
                      "{\"session\": 7, \"text\": \"a\xc3\xbc\", \"tokens\": "
                      "[10, 11, 12], \"stop\": \"length\", \"n_tokens\": 3, "
                      "\"usage\": {\"prompt_tokens\": 4, "
                      "\"completion_tokens\": 3}, \"evicted\": 3, "
                      "\"resident\": 20, \"seen\": 23}\n");

  /* On a terminal, detokenize ends with a newline (in a pipe, the
   * text's bytes alone, as above). */
  {
    char tty[256];
    size_t tty_len = 0;
    assert_int_equal(run_sinkctl_tty((const char *const[]){"--socket", P, "detokenize", "1", NULL},
                                     tty, sizeof tty, &tty_len),
                     0);
    assert_int_equal(tty_len, 11);
    assert_memory_equal(tty, "he\\x00llo\r\n", 11);
  }
  /* The model's text on a terminal: its control characters are shown,
   * not obeyed; with --raw, and into a pipe, the bytes as they came. */
  {
    char tty[512];
    size_t tty_len = 0;
    assert_int_equal(run_sinkctl_tty((const char *const[]){"--socket", P, "generate", "-n", "4",
                                                           "--no-echo", "x", NULL},
                                     tty, sizeof tty, &tty_len),
                     0);
    const char want[] = "\\x1b]0;owned\\x07\\x1b[2Jok\\x0d\r\n\xc3\xbc\\u009b31m\r\n";
    assert_int_equal(tty_len, sizeof want - 1);
    assert_memory_equal(tty, want, sizeof want - 1);
    assert_int_equal(run_sinkctl_tty((const char *const[]){"--socket", P, "--raw", "generate",
                                                           "-n", "4", "--no-echo", "x", NULL},
                                     tty, sizeof tty, &tty_len),
                     0);
    const char want_raw[] = "\x1b]0;owned\x07\x1b[2Jok\r\r\n\xc3\xbc\xc2\x9b" "31m\r\n";
    assert_int_equal(tty_len, sizeof want_raw - 1);
    assert_memory_equal(tty, want_raw, sizeof want_raw - 1);
  }
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "-n", "4", "--no-echo", "x"), 0);
  assert_string_equal(out, "\x1b]0;owned\x07\x1b[2Jok\r\n\xc3\xbc\xc2\x9b" "31m\n");
  /* resume: columns, as stats prints them. */
  assert_int_equal(RUN(NULL, "--socket", P, "resume", "7"), 0);
  assert_string_equal(out,
                      "session    7\n"
                      "policy     streaming\n"
                      "capacity   260\n"
                      "kv_bytes   57344\n"
                      "object_bytes 73728\n"
                      "resident   260\n"
                      "seen       1000\n"
                      "evicted    740\n"
                      "commit     77\n"
                      "adopted    yes\n");
  /* chat --json: /stats is a JSON object too. */
  assert_int_equal(RUN("/stats\n", "--socket", P, "--json", "chat"), 0);
  assert_memory_equal(out, "{\"session\": ", 12);
  assert_non_null(strstr(out, "\"policy\": \"streaming\""));
  assert_null(strstr(out, "policy     "));
  /* --json: errors are a JSON object on stdout, with the same status. */
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "close", "99"), 1);
  assert_string_equal(err, "");
  assert_string_equal(out, "{\"error\": {\"code\": \"no_such_session\", \"message\": \"no "
                           "session 99\", \"hint\": \"sessions end when closed or after the idle "
                           "TTL; a restart keeps them unless sinkd set them aside at start, e.g. "
                           "for another model: see its log and invalid/ in its state directory; "
                           "`sinkctl list` shows yours\", \"status\": 1}}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "close", "abc"), 2);
  assert_string_equal(err, "");
  assert_string_equal(out, "{\"error\": {\"code\": \"usage\", \"message\": \"close: 'abc' is "
                           "not a number\", \"status\": 2}}\n");
  assert_int_equal(RUN(NULL, "--json", "--socket", "/nonexistent/s.sock", "ping"), 3);
  assert_string_equal(err, "");
  {
    const char *want = "{\"error\": {\"code\": \"connect\", \"message\": ";
    assert_memory_equal(out, want, strlen(want));
    assert_non_null(strstr(out, "\"status\": 3}}\n"));
  }

  /* The daemon's error: exit 1, CODE: MESSAGE. */
  assert_int_equal(RUN(NULL, "--socket", P, "close", "99"), 1);
  assert_string_equal(err, "sinkctl: no_such_session: no session 99 (sessions end when closed "
                           "or after the idle TTL; a restart keeps them unless sinkd set them "
                           "aside at start, e.g. for another model: see its log and invalid/ "
                           "in its state directory; `sinkctl list` shows yours)\n");
  assert_int_equal(RUN(NULL, "--socket", P, "generate", "--session", "99",
                       "hi"),
                   1);
  assert_string_equal(out, ""); /* the error alone: no echoed prompt */
  assert_true(strncmp(err, "sinkctl: no_such_session: no session 99 ", 40) == 0);

  assert_int_equal(RUN(NULL, "--socket", P, "tokenize", "hi"), 0);
  assert_string_equal(out, "1 365 2147483647\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "tokenize", "hi",
                       "--no-bos"),
                   0);
  assert_string_equal(out, "{\"tokens\": [1, 365, 2147483647]}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "detokenize", "1", "2"), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(out, "he\0llo", 6);
  assert_int_equal(RUN(NULL, "--socket", P, "-j", "detokenize", "1"), 0);
  assert_string_equal(out, "{\"text\": \"he\\u0000llo\"}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "open", "--policy", "dense",
                       "--capacity", "64"),
                   0);
  assert_string_equal(out, "7\n");
  assert_int_equal(RUN(NULL, "--socket", P, "list"), 0);
  assert_string_equal(out,
                      "SESSION    OWNER  POLICY         CAPACITY   RESIDENT           SEEN   "
                      "MEMORY AGE      IDLE     ADOPTED KV\n"
                      "7          1000   streaming           260        100     5000000000     "
                      "5.0M 1d1h     1h1m     yes     f32 (temporary)\n"
                      "8          0      dense               260        101     5000000000     "
                      "   0 0s       0s       no      -\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "list"), 0);
  assert_string_equal(out,
                      "{\"sessions\": [{\"session\": 7, \"owner_uid\": 1000, \"policy\": "
                      "\"streaming\", \"capacity\": 260, \"resident\": 100, \"seen\": "
                      "5000000000, \"kv_bytes\": 4194304, \"object_bytes\": 5242880, \"age_s\": 90061, \"idle_s\": 3700, "
                      "\"busy\": false, \"temporary\": true, \"adopted\": true, \"kv_type\": "
                      "\"f32\"}, {\"session\": 8, \"owner_uid\": 0, \"policy\": \"dense\", "
                      "\"capacity\": 260, \"resident\": 101, \"seen\": 5000000000, "
                      "\"kv_bytes\": 0, \"object_bytes\": 0, \"age_s\": 0, \"idle_s\": 0, \"busy\": false, "
                      "\"temporary\": false, \"adopted\": false}]}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "stats", "7"), 0);
  assert_string_equal(out,
                      "session    7\n"
                      "policy     streaming\n"
                      "sinks      4\n"
                      "window     256\n"
                      "capacity   260 tokens\n"
                      "resident   260 tokens\n"
                      "seen       1000 tokens\n"
                      "evicted    740 tokens\n"
                      "kv cache   1.2 KiB (1234 bytes)\n"
                      "object     4.0 KiB (4096 bytes)\n"
                      "commit     0\n"
                      "adopted    no\n"
                      "idle       0 s\n"
                      "positions  0-259\n");
  assert_int_equal(RUN(NULL, "--socket", P, "stats"), 0);
  assert_string_equal(out,
                      "sessions          2\n"
                      "clients           1\n"
                      "uptime            1m 0s\n"
                      "tokens prefilled  123\n"
                      "tokens generated  456\n"
                      "weights           3.0 MiB mapped from the file, 512.0 KiB repacked\n"
                      "session memory    8.0 KiB, no limit\n"
                      "max sessions      0\n"
                      "your sessions     1 of 16\n"
                      "your memory       4.0 KiB, no limit of your own\n"
                      "at start          1 adopted, 0 set aside\n"
                      "idle ttl          never\n");
  assert_int_equal(RUN(NULL, "--socket", P, "--json", "stats"), 0);
  assert_string_equal(out,
                      "{\"sessions\": 2, \"clients\": 1, \"uptime_s\": 60, "
                      "\"tokens_prefilled\": 123, \"tokens_generated\": "
                      "456, \"max_sessions\": 0, \"memory_bytes\": 8192, "
                      "\"max_memory\": 0, \"adopted\": 1, \"set_aside\": 0, "
                      "\"idle_ttl_s\": 0, \"user_sessions\": 1, \"user_memory_bytes\": 4096, "
                      "\"max_user_sessions\": 16, \"max_user_memory\": 0, "
                      "\"weights_mapped_bytes\": 3145728, \"weights_repacked_bytes\": 524288}\n");
  assert_int_equal(RUN(NULL, "--socket", P, "ping"), 0);
  assert_memory_equal(out, "pong (", 6);
  assert_int_equal(RUN(NULL, "--socket", P, "hello"), 0);
  assert_non_null(strstr(out, "protocol: 1\nserver: sinkd\n"));
  assert_non_null(strstr(out, "model.weight_type: q8_0\nmodel.weight_bytes: 5000000000\n"
                              "compute.kernel: avx2\ncompute.threads: 2\n"
                              "compute.max_batch: 64\n"));

  /* Usage errors (2) are found before connecting. */
  assert_int_equal(RUN(NULL, "--socket", "/nonexistent", "generate",
                       "--top-p", "1.5", "x"),
                   2);
  assert_memory_equal(err, "sinkctl: --top-p: '1.5' is not in (0, 1]\n", 41);
  assert_int_equal(RUN(NULL, "--socket", P, "close", "-3"), 2);
  assert_int_equal(RUN(NULL, "--socket", P, "list", "--stop", "x"), 2);
  assert_int_equal(RUN(NULL, "--socket", P, "--max-tokens=0", "generate", "x"),
                   2);
  assert_int_equal(RUN(NULL, "--socket", P, "detokenize", "2147483648"), 2);
  assert_int_equal(RUN(NULL, "--socket", P), 2);
  /* Cannot connect (3). */
  assert_int_equal(RUN(NULL, "--socket", "/nonexistent/s.sock", "ping"), 3);
  assert_non_null(strstr(err, "is sinkd running?"));
  /* Connection lost (4). */
  f->mode = FAKE_HANGUP;
  assert_int_equal(RUN(NULL, "--socket", P, "ping"), 4);
  assert_string_equal(err,
                      "sinkctl: disconnected: the daemon closed the "
                      "connection\n");
#undef RUN
  fake_join(f);
  /* The temporary session of the first generate was opened and closed. */
  struct sk_msg m;
  fake_request(f, 0, &m);
  assert_op(&m, "open", 1);
  sk_msg_free(&m);
  fake_request(f, 1, &m);
  assert_op(&m, "generate", 2);
  sk_msg_free(&m);
  fake_request(f, 2, &m);
  assert_op(&m, "close", 3);
  sk_msg_free(&m);
  fake_free(f);
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
      cmocka_unit_test(test_msg_depth),
      cmocka_unit_test(test_msg_getters),
      cmocka_unit_test(test_msg_builder),
      cmocka_unit_test(test_msg_pack_error),
      cmocka_unit_test(test_client_ops),
      cmocka_unit_test(test_client_persistence),
      cmocka_unit_test(test_client_generate),
      cmocka_unit_test(test_client_failures),
      cmocka_unit_test(test_client_connect),
      cmocka_unit_test(test_sinkctl),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
