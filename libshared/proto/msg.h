/* Message codec shared by the daemon and libsinkd: parsing one frame body
 * into a msgpack map (with the declared sizes checked first), typed field
 * access whose errors name the field, and building framed replies.
 *
 * Internal header (not installed). msgpack-c does the msgpack work; this
 * module adds the checks a server needs before trusting it.
 */
#ifndef SK_MSG_H
#define SK_MSG_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sinkd/protocol.h"

/* A parsed message. The objects point into `zone` and into the body bytes
 * given to sk_msg_parse, which must outlive the message. */
struct sk_msg {
  msgpack_zone zone;
  msgpack_object root; /* always a MAP after a successful parse */
};

/* Checks body[0..len) without allocating: a single complete msgpack object,
 * nesting at most SK_MSG_MAX_DEPTH, and every declared array/map/str/bin/ext
 * size no larger than the bytes that remain (so a 5-byte "array of 2^32-1
 * elements" is refused before msgpack-c would allocate for it).
 * Returns 0 or -SK_ERR_BAD_REQUEST with err naming the problem. */
int sk_msg_check(const uint8_t *body, size_t len, struct sk_error *err);

/* sk_msg_check, then unpacks into *msg; the root must be a map, and no
 * map in it may hold a string key twice.
 * On success the caller owns *msg and frees it with sk_msg_free.
 * Errors: -SK_ERR_BAD_REQUEST (message says why), -SK_ERR_NO_MEMORY. */
int sk_msg_parse(const uint8_t *body, size_t len, struct sk_msg *msg,
                 struct sk_error *err);
void sk_msg_free(struct sk_msg *msg);

/* Value of `key` in a map object, or NULL if absent (or map not a map). */
const msgpack_object *sk_msg_get(const msgpack_object *map, const char *key);

/* Typed getters. Each returns 1 if the field is present and well typed
 * (value stored), 0 if absent (nothing stored), or -SK_ERR_BAD_REQUEST if
 * present with the wrong type or out of range, with err saying
 * "field 'NAME' must be ...". */
int sk_msg_get_u64(const msgpack_object *map, const char *key, uint64_t max,
                   uint64_t *ret, struct sk_error *err);
int sk_msg_get_i64(const msgpack_object *map, const char *key, int64_t *ret,
                   struct sk_error *err);
/* Accepts float or integer values. */
int sk_msg_get_f64(const msgpack_object *map, const char *key, double *ret,
                   struct sk_error *err);
int sk_msg_get_bool(const msgpack_object *map, const char *key, bool *ret,
                    struct sk_error *err);
/* str or bin; *ret points into the message (not NUL-terminated). */
int sk_msg_get_str(const msgpack_object *map, const char *key,
                   const char **ret, size_t *ret_len, struct sk_error *err);
/* An array object of any length (elements checked by the caller). */
int sk_msg_get_array(const msgpack_object *map, const char *key,
                     const msgpack_object_array **ret, struct sk_error *err);
/* Like sk_msg_get_u64 etc. but an absent field is an error too
 * ("missing field 'NAME'"): returns 0 on success or -SK_ERR_BAD_REQUEST. */
int sk_msg_need_u64(const msgpack_object *map, const char *key, uint64_t max,
                    uint64_t *ret, struct sk_error *err);
int sk_msg_need_str(const msgpack_object *map, const char *key,
                    const char **ret, size_t *ret_len, struct sk_error *err);

/* Reply/request builder: a msgpack_sbuffer whose first 4 bytes are the
 * frame header, patched by sk_msgbuf_finish. */
struct sk_msgbuf {
  msgpack_sbuffer sbuf;
  msgpack_packer pk;
};

/* Starts a frame. Returns 0 or -SK_ERR_NO_MEMORY. */
int sk_msgbuf_init(struct sk_msgbuf *b);
/* Patches the length header; returns the frame (header + body) size, or
 * -SK_ERR_TOO_LARGE if the body exceeds 4 GiB - 1. The bytes are
 * b->sbuf.data[0..size). */
int64_t sk_msgbuf_finish(struct sk_msgbuf *b);
/* Takes ownership of the frame bytes (free with free()); b is reset. */
char *sk_msgbuf_release(struct sk_msgbuf *b, size_t *ret_size);
void sk_msgbuf_free(struct sk_msgbuf *b);

/* Packing helpers for the common shapes. */
void sk_pack_cstr(msgpack_packer *pk, const char *s);
void sk_pack_strn(msgpack_packer *pk, const char *s, size_t len);

#endif
