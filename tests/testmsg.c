#include "testmsg.h"

#include <string.h>

#include "sinkd/protocol.h"

int64_t sk_test_msgbuf_finish_map(struct sk_msgbuf *b) {
  if (b->sbuf.size < SK_FRAME_HEADER_SIZE) return -SK_ERR_NO_MEMORY;
  const char *body = b->sbuf.data + SK_FRAME_HEADER_SIZE;
  size_t len = b->sbuf.size - SK_FRAME_HEADER_SIZE, off = 0;
  uint64_t n = 0;
  msgpack_zone zone;
  if (!msgpack_zone_init(&zone, 4096)) return -SK_ERR_NO_MEMORY;
  while (off < len) {
    msgpack_object obj;
    msgpack_unpack_return r = msgpack_unpack(body, len, &off, &zone, &obj);
    if (r != MSGPACK_UNPACK_SUCCESS && r != MSGPACK_UNPACK_EXTRA_BYTES) {
      msgpack_zone_destroy(&zone);
      return -SK_ERR_INTERNAL;
    }
    n++;
  }
  msgpack_zone_destroy(&zone);
  if (n % 2) return -SK_ERR_INTERNAL;
  /* The map header as msgpack-c writes it for n / 2 entries. */
  msgpack_sbuffer head;
  msgpack_sbuffer_init(&head);
  msgpack_packer hp;
  msgpack_packer_init(&hp, &head, msgpack_sbuffer_write);
  msgpack_pack_map(&hp, (size_t)(n / 2));
  size_t hlen = head.size;
  int rc = msgpack_sbuffer_write(&b->sbuf, head.data, hlen);
  if (rc == 0) {
    char *start = b->sbuf.data + SK_FRAME_HEADER_SIZE;
    memmove(start + hlen, start, len);
    memcpy(start, head.data, hlen);
  }
  msgpack_sbuffer_destroy(&head);
  if (rc != 0) return -SK_ERR_NO_MEMORY;
  return sk_msgbuf_finish(b);
}

void sk_test_pack_kv_str(msgpack_packer *pk, const char *key, const char *val) {
  sk_pack_cstr(pk, key);
  sk_pack_cstr(pk, val);
}

void sk_test_pack_kv_strn(msgpack_packer *pk, const char *key, const char *val, size_t len) {
  sk_pack_cstr(pk, key);
  sk_pack_strn(pk, val, len);
}

void sk_test_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t val) {
  sk_pack_cstr(pk, key);
  msgpack_pack_uint64(pk, val);
}

void sk_test_pack_kv_i64(msgpack_packer *pk, const char *key, int64_t val) {
  sk_pack_cstr(pk, key);
  msgpack_pack_int64(pk, val);
}

void sk_test_pack_kv_f64(msgpack_packer *pk, const char *key, double val) {
  sk_pack_cstr(pk, key);
  msgpack_pack_double(pk, val);
}

void sk_test_pack_kv_bool(msgpack_packer *pk, const char *key, bool val) {
  sk_pack_cstr(pk, key);
  if (val)
    msgpack_pack_true(pk);
  else
    msgpack_pack_false(pk);
}
