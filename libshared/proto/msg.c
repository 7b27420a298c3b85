/* Message codec: a non-allocating structural check of msgpack bytes, then
 * msgpack-c's unpacker; typed field getters; the framed reply builder.
 *
 * Why the check: msgpack-c allocates for an array or map as soon as it
 * reads its declared count, so 5 bytes claiming 2^32-1 elements would make
 * it allocate ~100 GiB. sk_msg_check walks the bytes first and refuses any
 * declared size that the remaining bytes cannot possibly hold (every
 * element takes at least one byte), so what msgpack-c allocates is bounded
 * by a small multiple of the body length.
 */
#include "proto/msg.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- structural check ------------------------------------------------- */

struct sk__walk {
  const uint8_t *start; /* first byte of the body (for offsets) */
  const uint8_t *p;   /* next byte */
  const uint8_t *end; /* one past the last byte */
  struct sk_error *err;
};

static size_t sk__walk_left(const struct sk__walk *w) {
  return (size_t)(w->end - w->p);
}

/* Reads an n-byte big-endian unsigned integer (n = 1, 2 or 4) that is
 * part of the header of a `what`. */
static int sk__walk_be(struct sk__walk *w, unsigned n, const char *what,
                       uint64_t *ret) {
  if (sk__walk_left(w) < n)
    return sk_error_set(w->err, SK_ERR_BAD_REQUEST, "msgpack: truncated %s",
                        what);
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++) v = v << 8 | w->p[i];
  w->p += n;
  *ret = v;
  return 0;
}

/* Skips n payload bytes of a `what`. */
static int sk__walk_skip(struct sk__walk *w, uint64_t n, const char *what) {
  if (n > sk__walk_left(w))
    return sk_error_set(w->err, SK_ERR_BAD_REQUEST, "msgpack: truncated %s",
                        what);
  w->p += n;
  return 0;
}

static int sk__walk_object(struct sk__walk *w, unsigned depth,
                           const char *inside);

/* A container of `count` elements (a map has count entries = 2*count
 * objects), at nesting level depth (the root is level 1). */
static int sk__walk_container(struct sk__walk *w, unsigned depth, bool map,
                              uint64_t count) {
  if (depth > SK_MSG_MAX_DEPTH)
    return sk_error_set(w->err, SK_ERR_BAD_REQUEST,
                        "msgpack: nesting deeper than %u", SK_MSG_MAX_DEPTH);
  uint64_t objects = map ? count * 2 : count; /* count < 2^32: no overflow */
  size_t left = sk__walk_left(w);
  if (objects > left)
    return sk_error_set(w->err, SK_ERR_BAD_REQUEST,
                        "msgpack: %s of %" PRIu64
                        " %s declared but only %zu bytes remain",
                        map ? "map" : "array", count,
                        map ? "entries" : "elements", left);
  for (uint64_t i = 0; i < objects; i++) {
    int rc = sk__walk_object(w, depth + 1, map ? "map" : "array");
    if (rc < 0) return rc;
  }
  return 0;
}

/* One object of any type; `inside` names what holds it, for the message
 * when the bytes end where it should start. */
static int sk__walk_object(struct sk__walk *w, unsigned depth,
                           const char *inside) {
  if (w->p == w->end)
    return sk_error_set(w->err, SK_ERR_BAD_REQUEST, "msgpack: truncated %s",
                        inside);
  uint8_t tag = *w->p++;
  uint64_t n = 0;
  int rc;

  if (tag <= 0x7f || tag >= 0xe0) return 0;  /* positive/negative fixint */
  if (tag >= 0x80 && tag <= 0x8f)              /* fixmap */
    return sk__walk_container(w, depth, true, tag & 0x0f);
  if (tag >= 0x90 && tag <= 0x9f)              /* fixarray */
    return sk__walk_container(w, depth, false, tag & 0x0f);
  if (tag >= 0xa0 && tag <= 0xbf)              /* fixstr */
    return sk__walk_skip(w, tag & 0x1f, "str");

  switch (tag) {
  case 0xc0: /* nil */
  case 0xc2: /* false */
  case 0xc3: /* true */
    return 0;
  case 0xc4: case 0xc5: case 0xc6: { /* bin 8/16/32 */
    unsigned nb = tag == 0xc4 ? 1 : tag == 0xc5 ? 2 : 4;
    if ((rc = sk__walk_be(w, nb, "bin", &n)) < 0) return rc;
    return sk__walk_skip(w, n, "bin");
  }
  case 0xc7: case 0xc8: case 0xc9: { /* ext 8/16/32: length, type, data */
    unsigned nb = tag == 0xc7 ? 1 : tag == 0xc8 ? 2 : 4;
    if ((rc = sk__walk_be(w, nb, "ext", &n)) < 0) return rc;
    return sk__walk_skip(w, n + 1, "ext");
  }
  case 0xca: return sk__walk_skip(w, 4, "float32");
  case 0xcb: return sk__walk_skip(w, 8, "float64");
  case 0xcc: return sk__walk_skip(w, 1, "uint8");
  case 0xcd: return sk__walk_skip(w, 2, "uint16");
  case 0xce: return sk__walk_skip(w, 4, "uint32");
  case 0xcf: return sk__walk_skip(w, 8, "uint64");
  case 0xd0: return sk__walk_skip(w, 1, "int8");
  case 0xd1: return sk__walk_skip(w, 2, "int16");
  case 0xd2: return sk__walk_skip(w, 4, "int32");
  case 0xd3: return sk__walk_skip(w, 8, "int64");
  case 0xd4: return sk__walk_skip(w, 1 + 1, "fixext1");
  case 0xd5: return sk__walk_skip(w, 1 + 2, "fixext2");
  case 0xd6: return sk__walk_skip(w, 1 + 4, "fixext4");
  case 0xd7: return sk__walk_skip(w, 1 + 8, "fixext8");
  case 0xd8: return sk__walk_skip(w, 1 + 16, "fixext16");
  case 0xd9: case 0xda: case 0xdb: { /* str 8/16/32 */
    unsigned nb = tag == 0xd9 ? 1 : tag == 0xda ? 2 : 4;
    if ((rc = sk__walk_be(w, nb, "str", &n)) < 0) return rc;
    return sk__walk_skip(w, n, "str");
  }
  case 0xdc: case 0xdd: /* array 16/32 */
    if ((rc = sk__walk_be(w, tag == 0xdc ? 2 : 4, "array", &n)) < 0)
      return rc;
    return sk__walk_container(w, depth, false, n);
  case 0xde: case 0xdf: /* map 16/32 */
    if ((rc = sk__walk_be(w, tag == 0xde ? 2 : 4, "map", &n)) < 0)
      return rc;
    return sk__walk_container(w, depth, true, n);
  default: /* 0xc1: never used */
    return sk_error_set(w->err, SK_ERR_BAD_REQUEST,
                        "msgpack: invalid byte 0x%02x at offset %zu", tag,
                        (size_t)(w->p - 1 - w->start));
  }
}

int sk_msg_check(const uint8_t *body, size_t len, struct sk_error *err) {
  if (len == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "empty message");
  struct sk__walk w = {.start = body, .p = body, .end = body + len, .err = err};
  int rc = sk__walk_object(&w, 1, "message");
  if (rc < 0) return rc;
  if (w.p != w.end)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "trailing %zu bytes after the message",
                        sk__walk_left(&w));
  return 0;
}

/* ---- parse ------------------------------------------------------------ */

/* Name of an object's type as the error messages say it. */
static const char *sk__type_name(const msgpack_object *o) {
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: return "nil";
  case MSGPACK_OBJECT_BOOLEAN: return "boolean";
  case MSGPACK_OBJECT_POSITIVE_INTEGER: return "integer";
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative integer";
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: return "float";
  case MSGPACK_OBJECT_STR: return "string";
  case MSGPACK_OBJECT_ARRAY: return "array";
  case MSGPACK_OBJECT_MAP: return "map";
  case MSGPACK_OBJECT_BIN: return "binary";
  case MSGPACK_OBJECT_EXT: return "ext";
  }
  return "unknown";
}

/* Orders string keys by length, then bytes (for qsort). */
static int sk__key_cmp(const void *a, const void *b) {
  const msgpack_object_str *x = *(const msgpack_object_str *const *)a;
  const msgpack_object_str *y = *(const msgpack_object_str *const *)b;
  if (x->size != y->size) return x->size < y->size ? -1 : 1;
  return x->size ? memcmp(x->ptr, y->ptr, x->size) : 0;
}

static int sk__duplicate_key(const msgpack_object_str *key, struct sk_error *err) {
  return sk_error_set(err, SK_ERR_BAD_REQUEST, "field '%.*s' appears twice in a map",
                      (int)(key->size > 32 ? 32 : key->size), key->ptr);
}

/* Refuses a map, at any depth under o, that holds one string key twice:
 * which of the two values counts would be a guess (JSON requests are held
 * to the same rule). Keys are sorted (scratch from the zone), so a large
 * map costs n log n. */
static int sk__no_duplicate_keys(const msgpack_object *o, msgpack_zone *zone,
                                 struct sk_error *err) {
  if (o->type == MSGPACK_OBJECT_ARRAY) {
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      int rc = sk__no_duplicate_keys(&o->via.array.ptr[i], zone, err);
      if (rc < 0) return rc;
    }
    return 0;
  }
  if (o->type != MSGPACK_OBJECT_MAP || o->via.map.size == 0) return 0;
  const msgpack_object_map *m = &o->via.map;
  const msgpack_object_str **keys = msgpack_zone_malloc(zone, m->size * sizeof *keys);
  if (!keys) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  uint32_t n = 0;
  for (uint32_t i = 0; i < m->size; i++) {
    int rc = sk__no_duplicate_keys(&m->ptr[i].val, zone, err);
    if (rc < 0) return rc;
    if (m->ptr[i].key.type == MSGPACK_OBJECT_STR) keys[n++] = &m->ptr[i].key.via.str;
  }
  qsort(keys, n, sizeof *keys, sk__key_cmp);
  for (uint32_t i = 1; i < n; i++)
    if (sk__key_cmp(&keys[i - 1], &keys[i]) == 0) return sk__duplicate_key(keys[i], err);
  return 0;
}

/* Small: requests are mostly a handful of scalars. */
#define SK__MSG_ZONE_CHUNK 2048u

int sk_msg_parse(const uint8_t *body, size_t len, struct sk_msg *msg,
                 struct sk_error *err) {
  memset(msg, 0, sizeof *msg);
  int rc = sk_msg_check(body, len, err);
  if (rc < 0) return rc;
  if (!msgpack_zone_init(&msg->zone, SK__MSG_ZONE_CHUNK)) {
    memset(msg, 0, sizeof *msg);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  size_t off = 0;
  msgpack_unpack_return ur =
      msgpack_unpack((const char *)body, len, &off, &msg->zone, &msg->root);
  if (ur != MSGPACK_UNPACK_SUCCESS) {
    sk_msg_free(msg);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
      return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
    /* sk_msg_check accepted it, so msgpack-c disagreeing is a bug in
     * one of the two. */
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "msgpack: cannot unpack (error %d)", (int)ur);
  }
  if (msg->root.type != MSGPACK_OBJECT_MAP) {
    const char *got = sk__type_name(&msg->root);
    sk_msg_free(msg);
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "request must be a map, got %s", got);
  }
  rc = sk__no_duplicate_keys(&msg->root, &msg->zone, err);
  if (rc < 0) sk_msg_free(msg);
  return rc;
}

void sk_msg_free(struct sk_msg *msg) {
  if (!msg) return;
  /* A zeroed sk_msg (failed parse, or freed already) owns nothing. */
  if (msg->zone.chunk_list.head) msgpack_zone_destroy(&msg->zone);
  memset(msg, 0, sizeof *msg);
}

/* ---- field access ----------------------------------------------------- */

const msgpack_object *sk_msg_get(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP || !key) return NULL;
  size_t klen = strlen(key);
  const msgpack_object_map *m = &map->via.map;
  for (uint32_t i = 0; i < m->size; i++) {
    const msgpack_object *k = &m->ptr[i].key;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
        (klen == 0 || memcmp(k->via.str.ptr, key, klen) == 0))
      return &m->ptr[i].val;
  }
  return NULL;
}

static int sk__wrong_type(const char *key, const char *want,
                          const msgpack_object *o, struct sk_error *err) {
  return sk_error_set(err, SK_ERR_BAD_REQUEST,
                      "field '%s' must be %s (got %s)", key, want,
                      sk__type_name(o));
}

int sk_msg_get_u64(const msgpack_object *map, const char *key, uint64_t max,
                   uint64_t *ret, struct sk_error *err) {
  const msgpack_object *o = sk_msg_get(map, key);
  if (!o) return 0;
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return sk__wrong_type(key, "an unsigned integer", o, err);
  if (o->via.u64 > max)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "field '%s' out of range (max %" PRIu64 ")", key, max);
  *ret = o->via.u64;
  return 1;
}

int sk_msg_get_i64(const msgpack_object *map, const char *key, int64_t *ret,
                   struct sk_error *err) {
  const msgpack_object *o = sk_msg_get(map, key);
  if (!o) return 0;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *ret = o->via.i64;
    return 1;
  }
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return sk__wrong_type(key, "an integer", o, err);
  if (o->via.u64 > (uint64_t)INT64_MAX)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "field '%s' out of range (max %" PRId64 ")", key,
                        INT64_MAX);
  *ret = (int64_t)o->via.u64;
  return 1;
}

int sk_msg_get_f64(const msgpack_object *map, const char *key, double *ret,
                   struct sk_error *err) {
  const msgpack_object *o = sk_msg_get(map, key);
  if (!o) return 0;
  double v;
  switch (o->type) {
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: v = o->via.f64; break;
  case MSGPACK_OBJECT_POSITIVE_INTEGER: v = (double)o->via.u64; break;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: v = (double)o->via.i64; break;
  default: return sk__wrong_type(key, "a number", o, err);
  }
  /* No caller wants NaN or infinity; refusing them here spares every
   * range check from having to think about NaN comparisons. */
  if (!isfinite(v))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "field '%s' must be a finite number", key);
  *ret = v;
  return 1;
}

int sk_msg_get_bool(const msgpack_object *map, const char *key, bool *ret,
                    struct sk_error *err) {
  const msgpack_object *o = sk_msg_get(map, key);
  if (!o) return 0;
  if (o->type != MSGPACK_OBJECT_BOOLEAN)
    return sk__wrong_type(key, "a boolean", o, err);
  *ret = o->via.boolean;
  return 1;
}

int sk_msg_get_str(const msgpack_object *map, const char *key,
                   const char **ret, size_t *ret_len, struct sk_error *err) {
  const msgpack_object *o = sk_msg_get(map, key);
  if (!o) return 0;
  if (o->type == MSGPACK_OBJECT_STR) {
    *ret = o->via.str.ptr;
    *ret_len = o->via.str.size;
    return 1;
  }
  if (o->type == MSGPACK_OBJECT_BIN) {
    *ret = o->via.bin.ptr;
    *ret_len = o->via.bin.size;
    return 1;
  }
  return sk__wrong_type(key, "a string", o, err);
}

int sk_msg_get_array(const msgpack_object *map, const char *key,
                     const msgpack_object_array **ret, struct sk_error *err) {
  const msgpack_object *o = sk_msg_get(map, key);
  if (!o) return 0;
  if (o->type != MSGPACK_OBJECT_ARRAY)
    return sk__wrong_type(key, "an array", o, err);
  *ret = &o->via.array;
  return 1;
}

int sk_msg_need_u64(const msgpack_object *map, const char *key, uint64_t max,
                    uint64_t *ret, struct sk_error *err) {
  int rc = sk_msg_get_u64(map, key, max, ret, err);
  if (rc < 0) return rc;
  if (rc == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "missing field '%s'", key);
  return 0;
}

int sk_msg_need_str(const msgpack_object *map, const char *key,
                    const char **ret, size_t *ret_len, struct sk_error *err) {
  int rc = sk_msg_get_str(map, key, ret, ret_len, err);
  if (rc < 0) return rc;
  if (rc == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "missing field '%s'", key);
  return 0;
}

/* ---- builder ---------------------------------------------------------- */

/* The packer writes through these. After a failed write every later write
 * fails too (the frame is incomplete), and sk_msgbuf_finish reports it:
 * the pack helpers return nothing, so this is how a failed allocation in
 * the middle of a reply is not lost. */
static int sk__msgbuf_write_failed(void *data, const char *buf, size_t len) {
  (void)data;
  (void)buf;
  (void)len;
  return -1;
}

static int sk__msgbuf_write(void *data, const char *buf, size_t len) {
  struct sk_msgbuf *b = data;
  if (msgpack_sbuffer_write(&b->sbuf, buf, len) == 0) return 0;
  b->pk.callback = sk__msgbuf_write_failed;
  return -1;
}

int sk_msgbuf_init(struct sk_msgbuf *b) {
  static const char header[SK_FRAME_HEADER_SIZE] = {0};
  msgpack_sbuffer_init(&b->sbuf);
  msgpack_packer_init(&b->pk, b, sk__msgbuf_write);
  if (msgpack_sbuffer_write(&b->sbuf, header, sizeof header) != 0) {
    msgpack_sbuffer_destroy(&b->sbuf);
    msgpack_sbuffer_init(&b->sbuf);
    return -SK_ERR_NO_MEMORY;
  }
  return 0;
}

int64_t sk_msgbuf_finish(struct sk_msgbuf *b) {
  if (b->pk.callback == sk__msgbuf_write_failed ||
      b->sbuf.size < SK_FRAME_HEADER_SIZE)
    return -SK_ERR_NO_MEMORY;
  size_t body = b->sbuf.size - SK_FRAME_HEADER_SIZE;
  if (body > UINT32_MAX) return -SK_ERR_TOO_LARGE;
  sk_frame_header_put((uint8_t *)b->sbuf.data, (uint32_t)body);
  return (int64_t)b->sbuf.size;
}

char *sk_msgbuf_release(struct sk_msgbuf *b, size_t *ret_size) {
  size_t size = b->sbuf.size;
  char *data = msgpack_sbuffer_release(&b->sbuf);
  if (ret_size) *ret_size = size;
  return data;
}

void sk_msgbuf_free(struct sk_msgbuf *b) {
  if (!b) return;
  msgpack_sbuffer_destroy(&b->sbuf);
  msgpack_sbuffer_init(&b->sbuf);
}

void sk_pack_strn(msgpack_packer *pk, const char *s, size_t len) {
  msgpack_pack_str(pk, len);
  msgpack_pack_str_body(pk, s, len);
}

void sk_pack_cstr(msgpack_packer *pk, const char *s) {
  sk_pack_strn(pk, s, strlen(s));
}
