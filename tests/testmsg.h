/* Hand-built msgpack frames for the tests that send what the wire schema
 * would never pack (hostile, odd or hand-checked requests). The daemon and
 * libsinkd pack only through libshared/proto/wire.c. */
#ifndef SK_TESTMSG_H
#define SK_TESTMSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

/* For a frame whose body holds a map's entries without its header (key,
 * value, key, value, ...): counts them, puts the map header msgpack writes
 * for that count in front and finishes like sk_msgbuf_finish. Errors:
 * -SK_ERR_NO_MEMORY, -SK_ERR_TOO_LARGE, -SK_ERR_INTERNAL (a key without
 * a value, or bytes that are not msgpack). */
int64_t sk_test_msgbuf_finish_map(struct sk_msgbuf *b);

/* "key": value pairs. */
void sk_test_pack_kv_str(msgpack_packer *pk, const char *key, const char *val);
void sk_test_pack_kv_strn(msgpack_packer *pk, const char *key, const char *val, size_t len);
void sk_test_pack_kv_u64(msgpack_packer *pk, const char *key, uint64_t val);
void sk_test_pack_kv_i64(msgpack_packer *pk, const char *key, int64_t val);
void sk_test_pack_kv_f64(msgpack_packer *pk, const char *key, double val);
void sk_test_pack_kv_bool(msgpack_packer *pk, const char *key, bool val);

#endif
