/* Fuzz target: the frame reader and the request parser (libshared/proto/frame.c,
 * libshared/proto/msg.c), with oracles.
 *
 * Input: byte 0 chooses the frame limit and how the stream is cut into
 * reads; the rest is the byte stream a client sends. Checked:
 *  - the frames the reader yields, whatever the cuts, equal those of a
 *    plain reference splitter (same bodies, same too-large reports);
 *  - the reader never buffers more than one frame plus one read;
 *  - sk_msg_check accepting a body means msgpack-c unpacks it;
 *  - a parsed request packs back to bytes that parse again, and the
 *    second round trip is byte-identical;
 *  - every typed getter on every field the protocol uses either returns
 *    the value, "absent", or a bad_request naming the field;
 *  - an error reply built from the parse error is itself a valid frame.
 */
#include <msgpack.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "proto/msg.h"
#include "proto/wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

static const char *const k_keys[] = {
    "id", "op", "session", "policy", "n_sink", "window", "capacity", "text", "prompt",
    "tokens", "bos", "max_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos",
    "n_top", "stop", "",
};

static void check_error(int rc, const struct sk_error *e, const char *key) {
  if (rc >= 0) return;
  if (rc != -SK_ERR_BAD_REQUEST || e->code != SK_ERR_BAD_REQUEST)
    sk_fuzz_fail("getter for '%s' returned %d", key, rc);
  if (key[0] && !strstr(e->message, key))
    sk_fuzz_fail("error for '%s' does not name it: %s", key, e->message);
}

static void exercise_getters(const msgpack_object *map) {
  for (size_t k = 0; k < sizeof k_keys / sizeof k_keys[0]; k++) {
    const char *key = k_keys[k];
    struct sk_error e = {0};
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    const char *s;
    size_t len;
    const msgpack_object_array *arr;
    int rc = sk_msg_get_u64(map, key, 1000, &u, &e);
    check_error(rc, &e, key);
    if (rc == 1 && u > 1000) sk_fuzz_fail("u64 above max");
    check_error(sk_msg_get_i64(map, key, &i, &e), &e, key);
    rc = sk_msg_get_f64(map, key, &d, &e);
    check_error(rc, &e, key);
    if (rc == 1 && (d != d || d - d != 0)) sk_fuzz_fail("f64 getter let a non-finite through");
    check_error(sk_msg_get_bool(map, key, &b, &e), &e, key);
    rc = sk_msg_get_str(map, key, &s, &len, &e);
    check_error(rc, &e, key);
    if (rc == 1 && len) {
      /* Touch every byte: they must lie inside the body. */
      size_t sum = 0;
      for (size_t j = 0; j < len; j++) sum += (unsigned char)s[j];
      if (sum > 255 * len) sk_fuzz_fail("impossible sum");
    }
    rc = sk_msg_get_array(map, key, &arr, &e);
    check_error(rc, &e, key);
    if (rc == 1)
      for (uint32_t j = 0; j < arr->size; j++) {
        volatile int t = arr->ptr[j].type;
        (void)t;
      }
    check_error(sk_msg_need_u64(map, key, UINT64_MAX, &u, &e), &e, key);
    check_error(sk_msg_need_str(map, key, &s, &len, &e), &e, key);
  }
}

/* Packs obj into a fresh buffer (caller destroys). */
static void pack(const msgpack_object *obj, msgpack_sbuffer *sb) {
  msgpack_sbuffer_init(sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_object(&pk, *obj);
}

static void check_body(const uint8_t *body, size_t len) {
  struct sk_error e = {0};
  int checked = sk_msg_check(body, len, &e);
  if (checked < 0 && (checked != -SK_ERR_BAD_REQUEST || !e.message[0]))
    sk_fuzz_fail("sk_msg_check returned %d", checked);
  struct sk_msg m;
  int rc = sk_msg_parse(body, len, &m, &e);
  if (checked == 0 && rc < 0 && strstr(e.message, "cannot unpack"))
    sk_fuzz_fail("check accepted what msgpack-c refuses: %s", e.message);
  if (rc == -SK_ERR_NO_MEMORY) sk_fuzz_fail("no memory parsing %zu bytes", len);
  if (rc < 0) {
    /* The reply the daemon sends for it is a valid frame. */
    struct sk_msgbuf b;
    if (sk_msgbuf_init(&b) < 0) return;
    if (sk_wire_pack_error(&b, 0, &e) == 0) {
      struct sk_msg reply;
      struct sk_error e2;
      if (sk_msg_parse((const uint8_t *)b.sbuf.data + SK_FRAME_HEADER_SIZE,
                       b.sbuf.size - SK_FRAME_HEADER_SIZE, &reply, &e2) < 0)
        sk_fuzz_fail("error reply does not parse: %s", e2.message);
      sk_msg_free(&reply);
    }
    sk_msgbuf_free(&b);
    return;
  }
  if (m.root.type != MSGPACK_OBJECT_MAP) sk_fuzz_fail("parse gave a non-map root");
  exercise_getters(&m.root);

  /* Round trips. */
  msgpack_sbuffer one, two;
  pack(&m.root, &one);
  struct sk_msg m1;
  if (sk_msg_parse((const uint8_t *)one.data, one.size, &m1, &e) < 0)
    sk_fuzz_fail("re-packed request does not parse: %s", e.message);
  pack(&m1.root, &two);
  if (one.size != two.size || memcmp(one.data, two.data, one.size) != 0)
    sk_fuzz_fail("second round trip differs (%zu vs %zu bytes)", one.size, two.size);
  msgpack_sbuffer_destroy(&one);
  msgpack_sbuffer_destroy(&two);
  sk_msg_free(&m1);
  sk_msg_free(&m);
}

/* Events of a frame stream: a body, or a too-large declaration. */
struct event {
  bool too_large;
  const uint8_t *body; /* into the input (reference) */
  size_t len;
};

/* The reference: headers and bodies in order; a declared length above the
 * limit reports too-large and skips that many bytes. */
static size_t reference(const uint8_t *s, size_t n, uint32_t max_frame, struct event *ev,
                        size_t max_ev) {
  size_t pos = 0, k = 0;
  while (n - pos >= 4 && k < max_ev) {
    uint32_t len = sk_frame_header_get(s + pos);
    pos += 4;
    if (len > max_frame) {
      ev[k++] = (struct event){true, NULL, len};
      if (len > n - pos) break;
      pos += len;
      continue;
    }
    if (len > n - pos) break;
    ev[k++] = (struct event){false, s + pos, len};
    pos += len;
  }
  return k;
}

#define MAX_EVENTS 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static const uint32_t limits[4] = {64, 1024, 65536, SK_FRAME_MAX_DEFAULT};
  uint32_t max_frame = limits[data[0] & 3];
  uint32_t cut = (uint32_t)data[0] * 2654435761u | 1;
  const uint8_t *s = data + 1;
  size_t n = size - 1;

  static struct event want[MAX_EVENTS];
  size_t n_want = reference(s, n, max_frame, want, MAX_EVENTS);

  struct sk_frame_reader rd;
  sk_frame_reader_init(&rd, max_frame);
  size_t pos = 0, k = 0;
  bool capped = n_want == MAX_EVENTS;
  while (pos < n && !(capped && k >= n_want)) {
    /* Reads of 1..64 bytes, or all at once, as the cut bits say. */
    cut = cut * 1103515245u + 12345u;
    size_t chunk = (cut >> 16) % 5 == 0 ? n - pos : 1 + (cut >> 20) % 64;
    if (chunk > n - pos) chunk = n - pos;
    if (sk_frame_reader_feed(&rd, s + pos, chunk) < 0) sk_fuzz_fail("feed failed");
    pos += chunk;
    for (;;) {
      const uint8_t *body = NULL;
      size_t len = 0;
      int rc = sk_frame_reader_next(&rd, &body, &len);
      if (rc == 0) break;
      if (k >= n_want) {
        if (capped) break;
        sk_fuzz_fail("reader yields more frames than the reference");
      }
      if (rc == -SK_ERR_TOO_LARGE) {
        if (!want[k].too_large || want[k].len != len)
          sk_fuzz_fail("event %zu: too large %zu, reference differs", k, len);
      } else if (rc == 1) {
        if (want[k].too_large || want[k].len != len ||
            (len && memcmp(want[k].body, body, len) != 0))
          sk_fuzz_fail("event %zu: body of %zu bytes differs from the reference", k, len);
        check_body(body, len);
      } else {
        sk_fuzz_fail("next returned %d", rc);
      }
      k++;
    }
    /* Drained, it holds at most one incomplete frame. */
    if (!(capped && k >= n_want) && rd.len - rd.pos >= (size_t)max_frame + 4)
      sk_fuzz_fail("reader holds %zu bytes (limit %u)", rd.len - rd.pos, max_frame);
  }
  if (!capped && k != n_want) sk_fuzz_fail("reader yielded %zu events, reference %zu", k, n_want);
  sk_frame_reader_free(&rd);
  return 0;
}
