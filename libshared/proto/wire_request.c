/* The wire schema of requests (see wire.h and sinkd-protocol(7)). */
#include "proto/wire.h"
#include "proto/wire_int.h"

#include <stdlib.h>
#include <string.h>

/* Starts a request frame in *b: its map with "id" and "op" written. */
static int sk__wire_req_begin(struct sk_msgbuf *b, struct sk_wire_map *m, uint64_t id,
                              enum sk_op op) {
  if (sk_msgbuf_init(b) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_begin(m, &b->pk);
  sk_wire_map_u64(m, "id", id);
  sk_wire_map_str(m, "op", sk_op_name(op));
  return 0;
}

/* [id, ...] */
static void sk__wire_ids(struct sk_wire_map *m, const char *key, const int32_t *ids, size_t n) {
  msgpack_packer *pk = sk_wire_map_key(m, key);
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++) msgpack_pack_int32(pk, ids[i]);
}

/* The fields of an input; text under text_key. */
static void sk__wire_input(struct sk_wire_map *m, const char *text_key,
                           const struct sk_wire_input *in) {
  if (in->text) sk_wire_map_strn(m, text_key, in->text, in->text_len);
  if (in->tokens.has) sk__wire_ids(m, "tokens", in->tokens.ids, in->tokens.n);
  if (in->bos >= 0) sk_wire_map_bool(m, "bos", in->bos > 0);
  if (in->parse_special) sk_wire_map_bool(m, "parse_special", true);
}

/* Request fields: the getters' errors (-SK_ERR_BAD_REQUEST naming the
 * field) and their 1 (present) / 0 (absent). */

/* A string field: *ret NULL when absent, never NULL when present. */
static int sk__wire_req_str(const msgpack_object *map, const char *key, const char **ret,
                            size_t *ret_len, struct sk_error *err) {
  *ret = NULL;
  *ret_len = 0;
  int rc = sk_msg_get_str(map, key, ret, ret_len, err);
  if (rc == 1 && !*ret) *ret = "";
  return rc;
}

/* A number field that must fit 32 bits; *has set when present. */
static int sk__wire_req_u32(const msgpack_object *map, const char *key, uint32_t max, bool *has,
                            uint32_t *ret, struct sk_error *err) {
  uint64_t v = 0;
  int rc = sk_msg_get_u64(map, key, max, &v, err);
  if (rc == 1) *ret = (uint32_t)v;
  if (has) *has = rc == 1;
  return rc;
}

/* The speculation fields (wire.h, struct sk_wire_spec). */
static void sk__wire_spec(struct sk_wire_map *m, const struct sk_wire_spec *s) {
  if (s->mode) sk_wire_map_strn(m, "speculation", s->mode, s->mode_len);
  if (s->has_tokens) sk_wire_map_u64(m, "draft_tokens", s->tokens);
  if (s->has_fixed) sk_wire_map_bool(m, "draft_fixed", s->fixed);
}

static int sk__wire_req_spec(const msgpack_object *map, struct sk_wire_spec *ret,
                             struct sk_error *err) {
  memset(ret, 0, sizeof *ret);
  int rc;
  if ((rc = sk__wire_req_str(map, "speculation", &ret->mode, &ret->mode_len, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "draft_tokens", SK_SPEC_TOKENS_MAX, &ret->has_tokens,
                             &ret->tokens, err)) < 0 ||
      (rc = sk_msg_get_bool(map, "draft_fixed", &ret->fixed, err)) < 0)
    return rc;
  ret->has_fixed = rc == 1;
  if (ret->has_tokens && ret->tokens == 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "field 'draft_tokens' must be 1 to %u (got 0)",
                        SK_SPEC_TOKENS_MAX);
  return 0;
}

/* A list of token ids: has set when present (an array). */
static int sk__wire_req_ids(const msgpack_object *map, const char *key, struct sk_wire_ids *ret,
                            struct sk_error *err) {
  const msgpack_object_array *a = NULL;
  memset(ret, 0, sizeof *ret);
  int rc = sk_msg_get_array(map, key, &a, err);
  if (rc == 1) *ret = (struct sk_wire_ids){.has = true, .raw = a->ptr, .n = a->size};
  return rc;
}

/* "text" (or "prompt": text_key) and "tokens", not both (nor neither when
 * required), then "bos" and "parse_special". */
static int sk__wire_req_input(const msgpack_object *map, const char *text_key, bool tokens,
                              bool required, struct sk_wire_input *ret, struct sk_error *err) {
  memset(ret, 0, sizeof *ret);
  ret->bos = -1;
  int has_text = sk__wire_req_str(map, text_key, &ret->text, &ret->text_len, err);
  if (has_text < 0) return has_text;
  int has_tokens = tokens ? sk__wire_req_ids(map, "tokens", &ret->tokens, err) : 0;
  if (has_tokens < 0) return has_tokens;
  if (has_text && has_tokens)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "give either '%s' or 'tokens', not both",
                        text_key);
  if (!has_text && !has_tokens && required)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        tokens ? "missing field '%s' or 'tokens'" : "missing field '%s'",
                        text_key);
  bool v = false;
  int rc = sk_msg_get_bool(map, "bos", &v, err);
  if (rc < 0) return rc;
  if (rc == 1) ret->bos = v;
  v = false;
  if ((rc = sk_msg_get_bool(map, "parse_special", &v, err)) < 0) return rc;
  ret->parse_special = v;
  return 0;
}

bool sk_wire_ids_at(const struct sk_wire_ids *l, size_t i, int64_t *ret) {
  if (l->ids) {
    *ret = l->ids[i];
    return true;
  }
  const msgpack_object *o = &l->raw[i];
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    *ret = o->via.u64 > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)o->via.u64;
    return true;
  }
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *ret = o->via.i64;
    return true;
  }
  return false;
}

bool sk_wire_strs_at(const struct sk_wire_strs *l, size_t i, const char **ret, size_t *ret_len) {
  if (l->s) {
    *ret = l->s[i];
    *ret_len = l->len ? l->len[i] : strlen(l->s[i]);
    return true;
  }
  const msgpack_object *o = &l->raw[i];
  if (o->type != MSGPACK_OBJECT_STR) return false;
  *ret = o->via.str.size ? o->via.str.ptr : "";
  *ret_len = o->via.str.size;
  return true;
}

bool sk_wire_msgs_at(const struct sk_wire_msgs *l, size_t i, const char **ret_role,
                     size_t *ret_role_len, const char **ret_content, size_t *ret_content_len) {
  if (l->m) {
    const struct sk_chat_message *m = &l->m[i];
    *ret_role = m->role;
    *ret_role_len = strlen(m->role);
    *ret_content = m->content;
    *ret_content_len = m->content_len ? m->content_len : strlen(m->content);
    return true;
  }
  const msgpack_object *o = &l->raw[i];
  struct sk_error ign;
  return o->type == MSGPACK_OBJECT_MAP &&
         sk__wire_req_str(o, "role", ret_role, ret_role_len, &ign) == 1 &&
         sk__wire_req_str(o, "content", ret_content, ret_content_len, &ign) == 1;
}

int sk_wire_unpack_head(const msgpack_object *map, uint64_t *ret_id, const char **ret_op,
                        size_t *ret_op_len, struct sk_error *err) {
  *ret_id = 0;
  uint64_t id = 0;
  int rc = sk_msg_need_u64(map, "id", UINT64_MAX, &id, err);
  if (rc < 0) return rc;
  *ret_id = id;
  return sk_msg_need_str(map, "op", ret_op, ret_op_len, err);
}

int sk_wire_pack_req(struct sk_msgbuf *b, uint64_t id, enum sk_op op) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, op) < 0) return -SK_ERR_NO_MEMORY;
  return sk__wire_end(b, &m);
}

int sk_wire_pack_session_req(struct sk_msgbuf *b, uint64_t id, enum sk_op op, uint64_t session) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, op) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "session", session);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_session_req(const msgpack_object *map, uint64_t *ret_session,
                               struct sk_error *err) {
  uint64_t v = 0;
  int rc = sk_msg_need_u64(map, "session", UINT64_MAX, &v, err);
  if (rc == 0) *ret_session = v;
  return rc;
}

int sk_wire_pack_open_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_open_req *o) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, SK_OP_OPEN) < 0) return -SK_ERR_NO_MEMORY;
  if (o->policy) sk_wire_map_strn(&m, "policy", o->policy, o->policy_len);
  if (o->has_n_sink) sk_wire_map_u64(&m, "n_sink", o->n_sink);
  if (o->has_window) sk_wire_map_u64(&m, "window", o->window);
  if (o->has_heavy) sk_wire_map_u64(&m, "heavy", o->heavy);
  if (o->has_recent) sk_wire_map_u64(&m, "recent", o->recent);
  if (o->has_capacity) sk_wire_map_u64(&m, "capacity", o->capacity);
  if (o->has_rope_scale) sk_wire_map_f64(&m, "rope_scale", o->rope_scale);
  if (o->pin) sk_wire_map_strn(&m, "pin", o->pin, o->pin_len);
  if (o->has_temporary) sk_wire_map_bool(&m, "temporary", o->temporary);
  if (o->chat_template)
    sk_wire_map_strn(&m, "chat_template", o->chat_template, o->chat_template_len);
  if (o->system) sk_wire_map_strn(&m, "system", o->system, o->system_len);
  if (o->has_sparsity) sk_wire_map_f64(&m, "sparsity", o->sparsity);
  if (o->pin_tokens.has) sk__wire_ids(&m, "pin_tokens", o->pin_tokens.ids, o->pin_tokens.n);
  sk__wire_spec(&m, &o->spec);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_open_req(const msgpack_object *map, struct sk_wire_open_req *ret,
                            struct sk_error *err) {
  struct sk_wire_open_req o;
  memset(&o, 0, sizeof o);
  int rc;
  if ((rc = sk__wire_req_str(map, "policy", &o.policy, &o.policy_len, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "n_sink", UINT32_MAX, &o.has_n_sink, &o.n_sink, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "window", UINT32_MAX, &o.has_window, &o.window, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "heavy", UINT32_MAX, &o.has_heavy, &o.heavy, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "recent", UINT32_MAX, &o.has_recent, &o.recent, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "capacity", UINT32_MAX, &o.has_capacity, &o.capacity, err)) <
          0 ||
      (rc = sk_msg_get_f64(map, "rope_scale", &o.rope_scale, err)) < 0 ||
      (o.has_rope_scale = rc == 1, rc = sk_msg_get_f64(map, "sparsity", &o.sparsity, err)) < 0 ||
      (o.has_sparsity = rc == 1, rc = sk_msg_get_bool(map, "temporary", &o.temporary, err)) < 0 ||
      (o.has_temporary = rc == 1, rc = sk__wire_req_str(map, "pin", &o.pin, &o.pin_len, err)) <
          0 ||
      (rc = sk__wire_req_ids(map, "pin_tokens", &o.pin_tokens, err)) < 0)
    return rc;
  if (o.pin && o.pin_tokens.has)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "give either 'pin' or 'pin_tokens', not both");
  if ((rc = sk__wire_req_str(map, "chat_template", &o.chat_template, &o.chat_template_len,
                             err)) < 0 ||
      (rc = sk__wire_req_str(map, "system", &o.system, &o.system_len, err)) < 0 ||
      (rc = sk__wire_req_spec(map, &o.spec, err)) < 0)
    return rc;
  *ret = o;
  return 0;
}

int sk_wire_pack_append_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_append_req *a) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, SK_OP_APPEND) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "session", a->session);
  sk__wire_input(&m, "text", &a->input);
  if (a->logprobs) sk_wire_map_bool(&m, "logprobs", true);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_append_req(const msgpack_object *map, struct sk_wire_append_req *ret,
                              struct sk_error *err) {
  struct sk_wire_append_req a;
  memset(&a, 0, sizeof a);
  int rc;
  if ((rc = sk_wire_unpack_session_req(map, &a.session, err)) < 0 ||
      (rc = sk__wire_req_input(map, "text", true, true, &a.input, err)) < 0 ||
      (rc = sk_msg_get_bool(map, "logprobs", &a.logprobs, err)) < 0)
    return rc;
  *ret = a;
  return 0;
}

int sk_wire_pack_generate_req(struct sk_msgbuf *b, uint64_t id, bool chat,
                              const struct sk_wire_generate_req *g) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, chat ? SK_OP_CHAT : SK_OP_GENERATE) < 0)
    return -SK_ERR_NO_MEMORY;
  if (chat) {
    msgpack_packer *pk = sk_wire_map_key(&m, "messages");
    msgpack_pack_array(pk, g->messages.n);
    for (size_t i = 0; i < g->messages.n && !m.failed; i++) {
      const char *role, *content;
      size_t role_len, content_len;
      sk_wire_msgs_at(&g->messages, i, &role, &role_len, &content, &content_len);
      struct sk_wire_map mm;
      sk_wire_map_begin(&mm, pk);
      sk_wire_map_strn(&mm, "role", role, role_len);
      sk_wire_map_strn(&mm, "content", content, content_len);
      if (sk_wire_map_end(&mm) < 0) m.failed = true;
    }
  }
  sk_wire_map_u64(&m, "session", g->session);
  sk_wire_map_u64(&m, "max_tokens", g->max_tokens);
  sk_wire_map_f64(&m, "temperature", g->temperature);
  sk_wire_map_u64(&m, "top_k", g->top_k);
  sk_wire_map_f64(&m, "top_p", g->top_p);
  sk_wire_map_bool(&m, "ignore_eos", g->ignore_eos);
  if (g->has_seed) sk_wire_map_u64(&m, "seed", g->seed);
  if (g->stop.n > 0) {
    msgpack_packer *pk = sk_wire_map_key(&m, "stop");
    msgpack_pack_array(pk, g->stop.n);
    for (size_t i = 0; i < g->stop.n; i++) {
      const char *s;
      size_t len;
      sk_wire_strs_at(&g->stop, i, &s, &len);
      sk_pack_strn(pk, s, len);
    }
  }
  if (!chat) sk__wire_input(&m, "prompt", &g->input);
  if (g->n_top > 0) sk_wire_map_u64(&m, "n_top", g->n_top);
  if (g->logprobs) sk_wire_map_bool(&m, "logprobs", true);
  if (g->top_logprobs > 0) sk_wire_map_u64(&m, "top_logprobs", g->top_logprobs);
  sk__wire_spec(&m, &g->spec);
  return sk__wire_end(b, &m);
}

/* chat's "messages" (required; no "prompt" or "tokens" with it). */
static int sk__wire_req_messages(const msgpack_object *map, struct sk_wire_msgs *ret,
                                 struct sk_error *err) {
  const msgpack_object_array *a = NULL;
  int rc = sk_msg_get_array(map, "messages", &a, err);
  if (rc < 0) return rc;
  if (rc == 0) return sk_error_set(err, SK_ERR_BAD_REQUEST, "missing field 'messages'");
  if (sk_msg_get(map, "prompt") || sk_msg_get(map, "tokens"))
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "chat takes 'messages', not 'prompt' or 'tokens'");
  *ret = (struct sk_wire_msgs){.raw = a->ptr, .n = a->size};
  return 0;
}

int sk_wire_unpack_generate_req(const msgpack_object *map, bool chat,
                                struct sk_wire_generate_req *ret, struct sk_error *err) {
  struct sk_wire_generate_req g;
  memset(&g, 0, sizeof g);
  g.input.bos = -1;
  g.max_tokens = SK_GENERATE_DEFAULT_MAX_TOKENS;
  g.temperature = SK_GENERATE_DEFAULT_TEMPERATURE;
  g.top_k = SK_GENERATE_DEFAULT_TOP_K;
  g.top_p = SK_GENERATE_DEFAULT_TOP_P;
  const msgpack_object_array *stop = NULL;
  int rc;
  if ((rc = sk_wire_unpack_session_req(map, &g.session, err)) < 0 ||
      (rc = chat ? sk__wire_req_messages(map, &g.messages, err)
                 : sk__wire_req_input(map, "prompt", true, false, &g.input, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "max_tokens", SK_WIRE_MAX_TOKENS, NULL, &g.max_tokens, err)) <
          0 ||
      (rc = sk_msg_get_f64(map, "temperature", &g.temperature, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "top_k", UINT32_MAX, &g.has_top_k, &g.top_k, err)) < 0 ||
      (rc = sk_msg_get_f64(map, "top_p", &g.top_p, err)) < 0 ||
      (rc = sk_msg_get_u64(map, "seed", UINT64_MAX, &g.seed, err)) < 0 ||
      (g.has_seed = rc == 1, rc = sk_msg_get_bool(map, "ignore_eos", &g.ignore_eos, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "n_top", SK_WIRE_MAX_TOP, NULL, &g.n_top, err)) < 0 ||
      (rc = sk_msg_get_bool(map, "logprobs", &g.logprobs, err)) < 0 ||
      (rc = sk__wire_req_u32(map, "top_logprobs", SK_WIRE_MAX_TOP, NULL, &g.top_logprobs,
                             err)) < 0 ||
      (rc = sk_msg_get_array(map, "stop", &stop, err)) < 0 ||
      (rc = sk__wire_req_spec(map, &g.spec, err)) < 0)
    return rc;
  if (stop) g.stop = (struct sk_wire_strs){.raw = stop->ptr, .n = stop->size};
  *ret = g;
  return 0;
}

int sk_wire_pack_stats_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_stats_req *s) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, SK_OP_STATS) < 0) return -SK_ERR_NO_MEMORY;
  if (s->has_session) sk_wire_map_u64(&m, "session", s->session);
  if (s->has_session && s->tokens) sk_wire_map_bool(&m, "tokens", true);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_stats_req(const msgpack_object *map, struct sk_wire_stats_req *ret,
                             struct sk_error *err) {
  struct sk_wire_stats_req s = {.has_session = sk_msg_get(map, "session") != NULL};
  int rc;
  if (s.has_session && ((rc = sk_msg_get_bool(map, "tokens", &s.tokens, err)) < 0 ||
                        (rc = sk_wire_unpack_session_req(map, &s.session, err)) < 0))
    return rc;
  *ret = s;
  return 0;
}

int sk_wire_pack_import_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_import_req *i) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, SK_OP_IMPORT) < 0) return -SK_ERR_NO_MEMORY;
  sk_wire_map_u64(&m, "total", i->total);
  sk_wire_map_u64(&m, "offset", i->offset);
  msgpack_packer *pk = sk_wire_map_key(&m, "data");
  msgpack_pack_bin(pk, i->len);
  msgpack_pack_bin_body(pk, i->data, i->len);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_import_req(const msgpack_object *map, struct sk_wire_import_req *ret,
                              struct sk_error *err) {
  struct sk_wire_import_req i;
  const char *data = NULL;
  int rc;
  if ((rc = sk_msg_need_u64(map, "total", SIZE_MAX, &i.total, err)) < 0 ||
      (rc = sk_msg_need_u64(map, "offset", SIZE_MAX, &i.offset, err)) < 0 ||
      (rc = sk_msg_need_str(map, "data", &data, &i.len, err)) < 0)
    return rc;
  i.data = data;
  *ret = i;
  return 0;
}

int sk_wire_pack_tokenize_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_input *t) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, SK_OP_TOKENIZE) < 0) return -SK_ERR_NO_MEMORY;
  struct sk_wire_input text = *t;
  text.tokens.has = false;
  if (!text.text) text.text = "";
  sk__wire_input(&m, "text", &text);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_tokenize_req(const msgpack_object *map, struct sk_wire_input *ret,
                                struct sk_error *err) {
  return sk__wire_req_input(map, "text", false, true, ret, err);
}

int sk_wire_pack_detokenize_req(struct sk_msgbuf *b, uint64_t id, const int32_t *tokens,
                                size_t n) {
  struct sk_wire_map m;
  if (sk__wire_req_begin(b, &m, id, SK_OP_DETOKENIZE) < 0) return -SK_ERR_NO_MEMORY;
  sk__wire_ids(&m, "tokens", tokens, n);
  return sk__wire_end(b, &m);
}

int sk_wire_unpack_detokenize_req(const msgpack_object *map, struct sk_wire_ids *ret,
                                  struct sk_error *err) {
  int rc = sk__wire_req_ids(map, "tokens", ret, err);
  if (rc < 0) return rc;
  if (rc == 0) return sk_error_set(err, SK_ERR_BAD_REQUEST, "missing field 'tokens'");
  return 0;
}
