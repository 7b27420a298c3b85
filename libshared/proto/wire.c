/* The wire schema (see wire.h and sinkd-protocol(7)): counted maps, the
 * parts every frame has and the error reply. Replies and events are in
 * wire_reply.c, requests in wire_request.c. */
#include "proto/wire.h"
#include "proto/wire_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counted maps ----------------------------------------------------- */

static int sk__wire_body_write(void *data, const char *buf, size_t len) {
  struct sk_wire_map *m = data;
  if (m->failed) return -1;
  if (msgpack_sbuffer_write(&m->body, buf, len) != 0) {
    m->failed = true;
    return -1;
  }
  return 0;
}

void sk_wire_map_begin(struct sk_wire_map *m, msgpack_packer *out) {
  m->out = out;
  msgpack_sbuffer_init(&m->body);
  msgpack_packer_init(&m->pk, m, sk__wire_body_write);
  m->n = 0;
  m->failed = false;
}

msgpack_packer *sk_wire_map_key(struct sk_wire_map *m, const char *key) {
  m->n++;
  sk_pack_cstr(&m->pk, key);
  return &m->pk;
}

void sk_wire_map_u64(struct sk_wire_map *m, const char *key, uint64_t v) {
  msgpack_pack_uint64(sk_wire_map_key(m, key), v);
}

void sk_wire_map_i64(struct sk_wire_map *m, const char *key, int64_t v) {
  msgpack_pack_int64(sk_wire_map_key(m, key), v);
}

void sk_wire_map_f64(struct sk_wire_map *m, const char *key, double v) {
  msgpack_pack_double(sk_wire_map_key(m, key), v);
}

void sk_wire_map_bool(struct sk_wire_map *m, const char *key, bool v) {
  msgpack_packer *pk = sk_wire_map_key(m, key);
  if (v)
    msgpack_pack_true(pk);
  else
    msgpack_pack_false(pk);
}

void sk_wire_map_str(struct sk_wire_map *m, const char *key, const char *v) {
  sk_pack_cstr(sk_wire_map_key(m, key), v ? v : "");
}

void sk_wire_map_strn(struct sk_wire_map *m, const char *key, const char *v, size_t len) {
  sk_pack_strn(sk_wire_map_key(m, key), v ? v : "", v ? len : 0);
}

int sk_wire_map_end(struct sk_wire_map *m) {
  int rc = m->failed ? -SK_ERR_NO_MEMORY : 0;
  if (rc == 0 && msgpack_pack_map(m->out, m->n) != 0) rc = -SK_ERR_NO_MEMORY;
  if (rc == 0 && m->body.size && m->out->callback(m->out->data, m->body.data, m->body.size) != 0)
    rc = -SK_ERR_NO_MEMORY;
  msgpack_sbuffer_destroy(&m->body);
  msgpack_sbuffer_init(&m->body);
  return rc;
}

/* Ends the frame's map; frees b on failure. */
int sk__wire_end(struct sk_msgbuf *b, struct sk_wire_map *m) {
  int rc = sk_wire_map_end(m);
  if (rc < 0) sk_msgbuf_free(b);
  return rc;
}

/* A nested map under key, written by sk__wire_nested_end. */
void sk__wire_nested(struct sk_wire_map *parent, struct sk_wire_map *m, const char *key) {
  sk_wire_map_begin(m, sk_wire_map_key(parent, key));
}

void sk__wire_nested_end(struct sk_wire_map *parent, struct sk_wire_map *m) {
  if (sk_wire_map_end(m) < 0) parent->failed = true;
}

/* ---- reading ---------------------------------------------------------- */

/* A protocol error naming the problem (the getters' message, which names
 * the field). */
int sk__wire_bad(struct sk_error *err, const char *what) {
  return sk_error_set(err, SK_ERR_PROTOCOL, "%s", what);
}

/* ---- what comes back -------------------------------------------------- */

int sk_wire_unpack_id(const msgpack_object *map, uint64_t *ret, struct sk_error *err) {
  struct sk_error perr;
  return sk_msg_need_u64(map, "id", UINT64_MAX, ret, &perr) < 0 ? sk__wire_bad(err, perr.message)
                                                                : 0;
}

int sk_wire_unpack_kind(const msgpack_object *map, enum sk_wire_kind *ret, struct sk_error *err) {
  struct sk_error perr;
  const char *ev;
  size_t len;
  int rc = sk_msg_get_str(map, "event", &ev, &len, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 0)
    *ret = SK_WIRE_REPLY;
  else if (len == 5 && memcmp(ev, "token", 5) == 0)
    *ret = SK_WIRE_EVENT_TOKEN;
  else if (len == 4 && memcmp(ev, "data", 4) == 0)
    *ret = SK_WIRE_EVENT_DATA;
  else
    *ret = SK_WIRE_EVENT_OTHER;
  return 0;
}

int sk_wire_unpack_ok(const msgpack_object *map, bool *ret, struct sk_error *err) {
  struct sk_error perr;
  int rc = sk_msg_get_bool(map, "ok", ret, &perr);
  if (rc < 0) return sk__wire_bad(err, perr.message);
  if (rc == 0) return sk__wire_bad(err, "missing field 'ok'");
  return 0;
}

int sk_wire_pack_error(struct sk_msgbuf *b, uint64_t id, const struct sk_error *e) {
  int code = e && e->code ? e->code : SK_ERR_INTERNAL;
  const char *message = e && e->message[0] ? e->message : sk_strerror(code);
  struct sk_wire_map m, em;
  sk_wire_map_begin(&m, &b->pk);
  sk_wire_map_u64(&m, "id", id);
  sk_wire_map_bool(&m, "ok", false);
  sk__wire_nested(&m, &em, "error");
  sk_wire_map_str(&em, "code", sk_error_name(code));
  sk_wire_map_str(&em, "message", message);
  sk__wire_nested_end(&m, &em);
  if (sk_wire_map_end(&m) < 0) return -SK_ERR_NO_MEMORY;
  int64_t rc = sk_msgbuf_finish(b);
  return rc < 0 ? (int)rc : 0;
}

void sk_wire_unpack_error(const msgpack_object *map, struct sk_error *ret) {
  const msgpack_object *eo = sk_msg_get(map, "error");
  const char *code = NULL, *text = NULL;
  size_t code_len = 0, text_len = 0;
  struct sk_error perr;
  if (eo && eo->type == MSGPACK_OBJECT_MAP) {
    if (sk_msg_get_str(eo, "code", &code, &code_len, &perr) != 1) code = NULL;
    if (sk_msg_get_str(eo, "message", &text, &text_len, &perr) != 1) text = NULL;
  }
  int ecode = code ? sk_error_from_name(code, code_len) : SK_ERR_INTERNAL;
  if (!text) {
    sk_error_set(ret, ecode, "%s", sk_strerror(ecode));
    return;
  }
  if (text_len > SK_ERROR_MESSAGE_MAX) text_len = SK_ERROR_MESSAGE_MAX;
  sk_error_set(ret, ecode, "%.*s", (int)text_len, text);
}
