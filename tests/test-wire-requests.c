/* The wire schema's requests (libshared/proto/wire_request.c) and the
 * parts every frame has (wire.c): every request packed is read back into
 * the same struct with exactly the entries written, an absent field reads
 * as its default, and a bad field is an error naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "proto/wire.h"
#include "test-wire.h"

/* len bytes at got are the string want. */
static void assert_strn(const char *got, size_t len, const char *want) {
  assert_non_null(got);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(got, want, len);
}

/* id and op of a request. */
static void assert_request(const msgpack_object *map, uint64_t id, const char *op) {
  uint64_t got_id = 0;
  const char *got_op = NULL;
  size_t op_len = 0;
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_head(map, &got_id, &got_op, &op_len, &e), 0);
  assert_int_equal(got_id, id);
  assert_strn(got_op, op_len, op);
}

/* The ids of a list as unpacked, against want[0..n). */
static void assert_ids(const struct sk_wire_ids *l, const int32_t *want, size_t n) {
  assert_true(l->has);
  assert_null(l->ids);
  assert_int_equal(l->n, n);
  for (size_t i = 0; i < n; i++) {
    int64_t v = 0;
    assert_true(sk_wire_ids_at(l, i, &v));
    assert_int_equal(v, want[i]);
  }
}

/* A request map written field by field (for what the packers never
 * write), parsed into f. */
static const msgpack_object *raw_request(struct frame *f, void (*fill)(struct sk_wire_map *m)) {
  assert_int_equal(sk_msgbuf_init(&f->b), 0);
  struct sk_wire_map m;
  sk_wire_map_begin(&m, &f->b.pk);
  sk_wire_map_u64(&m, "id", 3);
  fill(&m);
  assert_int_equal(sk_wire_map_end(&m), 0);
  return parse(f);
}

void test_request_head(void **state) {
  (void)state;
  struct frame f;
  assert_int_equal(sk_wire_pack_req(&f.b, 12, SK_OP_HELLO), 0);
  int64_t size = sk_msgbuf_finish(&f.b);
  /* {"id": 12, "op": "hello"} */
  static const uint8_t want[] = {0,   0,   0,   14,  0x82, 0xa2, 'i', 'd', 0x0c, 0xa2,
                                 'o', 'p', 0xa5, 'h', 'e',  'l',  'l', 'o'};
  assert_int_equal(size, sizeof want);
  assert_memory_equal(f.b.sbuf.data, want, sizeof want);
  sk_msgbuf_free(&f.b);

  assert_int_equal(sk_wire_pack_session_req(&f.b, 13, SK_OP_FORK, 77), 0);
  const msgpack_object *map = parse(&f);
  char k[256];
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op session");
  assert_request(map, 13, "fork");
  uint64_t sid = 0;
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_session_req(map, &sid, &e), 0);
  assert_int_equal(sid, 77);
  frame_free(&f);

  /* a bad op is answered with the request's id; a bad id with 0 */
  assert_int_equal(sk_msgbuf_init(&f.b), 0);
  struct sk_wire_map m;
  sk_wire_map_begin(&m, &f.b.pk);
  sk_wire_map_u64(&m, "id", 5);
  sk_wire_map_u64(&m, "op", 1);
  assert_int_equal(sk_wire_map_end(&m), 0);
  map = parse(&f);
  uint64_t id = 99;
  const char *op;
  size_t op_len;
  assert_int_equal(sk_wire_unpack_head(map, &id, &op, &op_len, &e), -SK_ERR_BAD_REQUEST);
  assert_int_equal(id, 5);
  assert_int_equal(e.code, SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'op' must be a string (got integer)");
  assert_int_equal(sk_wire_unpack_session_req(map, &sid, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'session'");
  frame_free(&f);
}

void test_request_open(void **state) {
  (void)state;
  const int32_t pin_tokens[] = {1, 22, 333};
  struct sk_wire_open_req o = {
      .policy = "streamingXX", .policy_len = 9, .has_n_sink = true, .n_sink = 0,
      .has_window = true, .window = 1000, .has_heavy = true, .heavy = 7,
      .has_recent = true, .recent = 9, .has_capacity = true, .capacity = 4096,
      .has_rope_scale = true, .rope_scale = 2.5, .pin = "pin text", .pin_len = 8,
      .has_temporary = true, .temporary = false, .chat_template = "chatml",
      .chat_template_len = 6, .system = "be\0brief", .system_len = 8,
      .has_sparsity = true, .sparsity = 0.25,
      .spec = {.mode = "lookupXX", .mode_len = 6, .has_tokens = true, .tokens = 5,
               .has_fixed = true, .fixed = true}};
  struct frame f;
  assert_int_equal(sk_wire_pack_open_req(&f.b, 31, &o), 0);
  const msgpack_object *map = parse(&f);
  char k[512];
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op policy n_sink window heavy recent capacity rope_scale pin "
                         "temporary chat_template system sparsity speculation draft_tokens "
                         "draft_fixed");
  assert_request(map, 31, "open");
  struct sk_wire_open_req got;
  memset(&got, 0xa5, sizeof got);
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_open_req(map, &got, &e), 0);
  assert_strn(got.policy, got.policy_len, "streaming");
  assert_true(got.has_n_sink && got.has_window && got.has_heavy && got.has_recent &&
              got.has_capacity && got.has_rope_scale && got.has_temporary && got.has_sparsity);
  assert_int_equal(got.n_sink, 0);
  assert_int_equal(got.window, 1000);
  assert_int_equal(got.heavy, 7);
  assert_int_equal(got.recent, 9);
  assert_int_equal(got.capacity, 4096);
  assert_true(got.rope_scale == 2.5);
  assert_strn(got.pin, got.pin_len, "pin text");
  assert_false(got.temporary);
  assert_strn(got.chat_template, got.chat_template_len, "chatml");
  assert_int_equal(got.system_len, 8);
  assert_memory_equal(got.system, "be\0brief", 8);
  assert_true(got.sparsity == 0.25);
  assert_strn(got.spec.mode, got.spec.mode_len, "lookup");
  assert_true(got.spec.has_tokens && got.spec.has_fixed && got.spec.fixed);
  assert_int_equal(got.spec.tokens, 5);
  assert_false(got.pin_tokens.has);
  frame_free(&f);

  /* pin tokens; nothing else: only they are written and read */
  struct sk_wire_open_req t = {.pin_tokens = {.has = true, .ids = pin_tokens, .n = 3}};
  assert_int_equal(sk_wire_pack_open_req(&f.b, 32, &t), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op pin_tokens");
  assert_int_equal(sk_wire_unpack_open_req(map, &got, &e), 0);
  assert_null(got.policy);
  assert_null(got.pin);
  assert_null(got.chat_template);
  assert_null(got.system);
  assert_false(got.has_n_sink || got.has_window || got.has_heavy || got.has_recent ||
               got.has_capacity || got.has_rope_scale || got.has_temporary || got.has_sparsity);
  assert_null(got.spec.mode);
  assert_false(got.spec.has_tokens || got.spec.has_fixed);
  assert_int_equal(got.window, 0);
  assert_ids(&got.pin_tokens, pin_tokens, 3);
  frame_free(&f);

  /* pin and pin_tokens exclude each other; a bad number names its field */
  t.pin = "";
  assert_int_equal(sk_wire_pack_open_req(&f.b, 33, &t), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_open_req(map, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "give either 'pin' or 'pin_tokens', not both");
  frame_free(&f);
}

static void fill_bad_window(struct sk_wire_map *m) {
  sk_wire_map_str(m, "op", "open");
  sk_wire_map_u64(m, "window", 1ull << 32);
}

void test_request_open_range(void **state) {
  (void)state;
  struct frame f;
  const msgpack_object *map = raw_request(&f, fill_bad_window);
  struct sk_wire_open_req got;
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_open_req(map, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'window' out of range (max 4294967295)");
  frame_free(&f);
}

void test_request_append(void **state) {
  (void)state;
  struct sk_wire_append_req a = {
      .session = 6, .input = {.text = "some text", .text_len = 4, .bos = 1, .parse_special = true}};
  struct frame f;
  assert_int_equal(sk_wire_pack_append_req(&f.b, 40, &a), 0);
  const msgpack_object *map = parse(&f);
  char k[256];
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op session text bos parse_special");
  assert_request(map, 40, "append");
  struct sk_wire_append_req got;
  memset(&got, 0xa5, sizeof got);
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_append_req(map, &got, &e), 0);
  assert_int_equal(got.session, 6);
  assert_strn(got.input.text, got.input.text_len, "some");
  assert_false(got.input.tokens.has);
  assert_int_equal(got.input.bos, 1);
  assert_true(got.input.parse_special);
  assert_false(got.logprobs);
  frame_free(&f);

  const int32_t toks[] = {5, 0, 2147483647};
  struct sk_wire_append_req t = {.session = 7,
                                 .input = {.tokens = {.has = true, .ids = toks, .n = 3}, .bos = 0},
                                 .logprobs = true};
  assert_int_equal(sk_wire_pack_append_req(&f.b, 41, &t), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op session tokens bos logprobs");
  assert_int_equal(sk_wire_unpack_append_req(map, &got, &e), 0);
  assert_int_equal(got.session, 7);
  assert_null(got.input.text);
  assert_ids(&got.input.tokens, toks, 3);
  assert_int_equal(got.input.bos, 0);
  assert_false(got.input.parse_special);
  assert_true(got.logprobs);
  frame_free(&f);

  /* neither text nor tokens; both */
  struct sk_wire_append_req none = {.session = 8, .input = {.bos = -1}};
  assert_int_equal(sk_wire_pack_append_req(&f.b, 42, &none), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op session");
  assert_int_equal(sk_wire_unpack_append_req(map, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'text' or 'tokens'");
  frame_free(&f);
  t.input.text = "";
  assert_int_equal(sk_wire_pack_append_req(&f.b, 43, &t), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_append_req(map, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "give either 'text' or 'tokens', not both");
  frame_free(&f);
}

void test_request_generate(void **state) {
  (void)state;
  const char *stops[] = {"\n\n", "END"};
  const size_t stop_len[] = {2, 1};
  struct sk_wire_generate_req g = {
      .session = 9, .max_tokens = 64, .temperature = 0.5, .top_k = 7, .top_p = 0.75,
      .ignore_eos = true, .has_seed = true, .seed = 1ull << 40,
      .stop = {.s = stops, .len = stop_len, .n = 2},
      .input = {.text = "Once", .text_len = 4, .bos = 0, .parse_special = true}, .n_top = 5,
      .logprobs = true, .top_logprobs = 20,
      .spec = {.mode = "draft", .mode_len = 5, .has_tokens = true, .tokens = 15,
               .has_fixed = true, .fixed = false}};
  struct frame f;
  assert_int_equal(sk_wire_pack_generate_req(&f.b, 50, false, &g), 0);
  const msgpack_object *map = parse(&f);
  char k[512];
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op session max_tokens temperature top_k top_p ignore_eos seed stop "
                         "prompt bos parse_special n_top logprobs top_logprobs speculation "
                         "draft_tokens draft_fixed");
  assert_request(map, 50, "generate");
  struct sk_wire_generate_req got;
  memset(&got, 0xa5, sizeof got);
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_generate_req(map, false, &got, &e), 0);
  assert_int_equal(got.session, 9);
  assert_int_equal(got.max_tokens, 64);
  assert_true(got.temperature == 0.5);
  assert_int_equal(got.top_k, 7);
  assert_true(got.has_top_k);
  assert_true(got.top_p == 0.75);
  assert_true(got.ignore_eos);
  assert_true(got.has_seed);
  assert_int_equal(got.seed, 1ull << 40);
  assert_int_equal(got.stop.n, 2);
  const char *st;
  size_t st_len;
  assert_true(sk_wire_strs_at(&got.stop, 0, &st, &st_len));
  assert_strn(st, st_len, "\n\n");
  assert_true(sk_wire_strs_at(&got.stop, 1, &st, &st_len));
  assert_strn(st, st_len, "E");
  assert_strn(got.input.text, got.input.text_len, "Once");
  assert_false(got.input.tokens.has);
  assert_int_equal(got.input.bos, 0);
  assert_true(got.input.parse_special);
  assert_int_equal(got.n_top, 5);
  assert_true(got.logprobs);
  assert_int_equal(got.top_logprobs, 20);
  assert_strn(got.spec.mode, got.spec.mode_len, "draft");
  assert_true(got.spec.has_tokens && got.spec.has_fixed && !got.spec.fixed);
  assert_int_equal(got.spec.tokens, 15);
  assert_int_equal(got.messages.n, 0);
  frame_free(&f);

  /* chat: messages first, no prompt */
  const struct sk_chat_message msgs[] = {{"system", "short", 0}, {"user", "hi!", 2}};
  struct sk_wire_generate_req c = {.messages = {.m = msgs, .n = 2}, .session = 10,
                                   .max_tokens = 3, .temperature = 0, .top_k = 0, .top_p = 1,
                                   .input = {.text = "ignored", .text_len = 7}};
  assert_int_equal(sk_wire_pack_generate_req(&f.b, 51, true, &c), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op messages session max_tokens temperature top_k top_p ignore_eos");
  assert_request(map, 51, "chat");
  assert_int_equal(sk_wire_unpack_generate_req(map, true, &got, &e), 0);
  assert_int_equal(got.session, 10);
  assert_int_equal(got.messages.n, 2);
  const char *role, *content;
  size_t role_len, content_len;
  assert_true(sk_wire_msgs_at(&got.messages, 0, &role, &role_len, &content, &content_len));
  assert_strn(role, role_len, "system");
  assert_strn(content, content_len, "short");
  assert_true(sk_wire_msgs_at(&got.messages, 1, &role, &role_len, &content, &content_len));
  assert_strn(role, role_len, "user");
  assert_strn(content, content_len, "hi");
  assert_null(got.input.text);
  assert_int_equal(got.max_tokens, 3);
  assert_true(got.temperature == 0);
  assert_true(got.top_p == 1);
  assert_false(got.has_seed);
  assert_int_equal(got.stop.n, 0);
  /* the same map as generate: no prompt, the messages not read */
  assert_int_equal(sk_wire_unpack_generate_req(map, false, &got, &e), 0);
  assert_int_equal(got.messages.n, 0);
  frame_free(&f);

  /* chat with a prompt is refused; generate without one is not */
  c.input = (struct sk_wire_input){.bos = -1};
  assert_int_equal(sk_wire_pack_generate_req(&f.b, 52, false, &c), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_generate_req(map, true, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'messages'");
  frame_free(&f);
}

static void fill_generate_defaults(struct sk_wire_map *m) {
  sk_wire_map_str(m, "op", "generate");
  sk_wire_map_u64(m, "session", 1);
}

static void fill_chat_prompt(struct sk_wire_map *m) {
  sk_wire_map_str(m, "op", "chat");
  sk_wire_map_u64(m, "session", 1);
  msgpack_pack_array(sk_wire_map_key(m, "messages"), 0);
  sk_wire_map_str(m, "prompt", "x");
}

static void fill_draft_tokens_0(struct sk_wire_map *m) {
  sk_wire_map_str(m, "op", "generate");
  sk_wire_map_u64(m, "session", 1);
  sk_wire_map_u64(m, "draft_tokens", 0);
}

static void fill_draft_tokens_16(struct sk_wire_map *m) {
  sk_wire_map_str(m, "op", "generate");
  sk_wire_map_u64(m, "session", 1);
  sk_wire_map_u64(m, "draft_tokens", 16);
}

static void fill_too_many_tokens(struct sk_wire_map *m) {
  sk_wire_map_str(m, "op", "generate");
  sk_wire_map_u64(m, "session", 1);
  sk_wire_map_u64(m, "max_tokens", SK_WIRE_MAX_TOKENS + 1);
}

/* What a generate leaves out is the protocol's default. */
void test_request_generate_defaults(void **state) {
  (void)state;
  struct frame f;
  const msgpack_object *map = raw_request(&f, fill_generate_defaults);
  struct sk_wire_generate_req got;
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_generate_req(map, false, &got, &e), 0);
  assert_int_equal(got.max_tokens, SK_GENERATE_DEFAULT_MAX_TOKENS);
  assert_true(got.temperature == SK_GENERATE_DEFAULT_TEMPERATURE);
  assert_int_equal(got.top_k, SK_GENERATE_DEFAULT_TOP_K);
  assert_false(got.has_top_k);
  assert_true(got.top_p == SK_GENERATE_DEFAULT_TOP_P);
  assert_false(got.has_seed);
  assert_false(got.ignore_eos);
  assert_int_equal(got.n_top, 0);
  assert_false(got.logprobs);
  assert_int_equal(got.top_logprobs, 0);
  assert_int_equal(got.input.bos, -1);
  assert_null(got.input.text);
  assert_false(got.input.tokens.has);
  frame_free(&f);

  map = raw_request(&f, fill_chat_prompt);
  assert_int_equal(sk_wire_unpack_generate_req(map, true, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "chat takes 'messages', not 'prompt' or 'tokens'");
  frame_free(&f);

  map = raw_request(&f, fill_too_many_tokens);
  assert_int_equal(sk_wire_unpack_generate_req(map, false, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'max_tokens' out of range (max 1048576)");
  frame_free(&f);

  map = raw_request(&f, fill_draft_tokens_0);
  assert_int_equal(sk_wire_unpack_generate_req(map, false, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'draft_tokens' must be 1 to 15 (got 0)");
  frame_free(&f);
  map = raw_request(&f, fill_draft_tokens_16);
  assert_int_equal(sk_wire_unpack_generate_req(map, false, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "field 'draft_tokens' out of range (max 15)");
  frame_free(&f);
}

static void fill_odd_elements(struct sk_wire_map *m) {
  sk_wire_map_str(m, "op", "chat");
  sk_wire_map_u64(m, "session", 1);
  msgpack_packer *pk = sk_wire_map_key(m, "tokens");
  msgpack_pack_array(pk, 4);
  msgpack_pack_uint64(pk, UINT64_MAX);
  msgpack_pack_int64(pk, INT64_MIN);
  sk_pack_cstr(pk, "7");
  msgpack_pack_int32(pk, -3);
  pk = sk_wire_map_key(m, "stop");
  msgpack_pack_array(pk, 2);
  msgpack_pack_bin(pk, 1);
  msgpack_pack_bin_body(pk, "x", 1);
  sk_pack_cstr(pk, "");
  pk = sk_wire_map_key(m, "messages");
  msgpack_pack_array(pk, 2);
  msgpack_pack_nil(pk);
  msgpack_pack_map(pk, 1);
  sk_pack_cstr(pk, "role");
  sk_pack_cstr(pk, "user");
}

/* The elements of a request's lists as sent: anything, each op words its
 * errors. */
void test_request_elements(void **state) {
  (void)state;
  struct frame f;
  const msgpack_object *map = raw_request(&f, fill_odd_elements);
  struct sk_error e;
  struct sk_wire_append_req a;
  assert_int_equal(sk_wire_unpack_append_req(map, &a, &e), 0);
  int64_t v = 0;
  assert_true(sk_wire_ids_at(&a.input.tokens, 0, &v));
  assert_int_equal(v, INT64_MAX);
  assert_true(sk_wire_ids_at(&a.input.tokens, 1, &v));
  assert_int_equal(v, INT64_MIN);
  assert_false(sk_wire_ids_at(&a.input.tokens, 2, &v));
  assert_true(sk_wire_ids_at(&a.input.tokens, 3, &v));
  assert_int_equal(v, -3);
  struct sk_wire_generate_req g;
  /* the map has tokens: as a chat it is refused, so read it as generate
   * for the stop strings, and its messages by hand */
  assert_int_equal(sk_wire_unpack_generate_req(map, true, &g, &e), -SK_ERR_BAD_REQUEST);
  assert_int_equal(sk_wire_unpack_generate_req(map, false, &g, &e), 0);
  const char *s;
  size_t len;
  assert_int_equal(g.stop.n, 2);
  assert_false(sk_wire_strs_at(&g.stop, 0, &s, &len));
  assert_true(sk_wire_strs_at(&g.stop, 1, &s, &len));
  assert_int_equal(len, 0);
  const msgpack_object *mo = sk_msg_get(map, "messages");
  struct sk_wire_msgs msgs = {.raw = mo->via.array.ptr, .n = mo->via.array.size};
  const char *role, *content;
  size_t rl, cl;
  assert_false(sk_wire_msgs_at(&msgs, 0, &role, &rl, &content, &cl));
  assert_false(sk_wire_msgs_at(&msgs, 1, &role, &rl, &content, &cl));
  frame_free(&f);
}

void test_request_stats_import(void **state) {
  (void)state;
  struct frame f;
  struct sk_error e;
  char k[256];
  struct sk_wire_stats_req daemon = {.tokens = true}, got;
  assert_int_equal(sk_wire_pack_stats_req(&f.b, 60, &daemon), 0);
  const msgpack_object *map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op");
  assert_request(map, 60, "stats");
  memset(&got, 0xa5, sizeof got);
  assert_int_equal(sk_wire_unpack_stats_req(map, &got, &e), 0);
  assert_false(got.has_session);
  assert_false(got.tokens);
  frame_free(&f);
  struct sk_wire_stats_req sess = {.has_session = true, .session = 61, .tokens = true};
  assert_int_equal(sk_wire_pack_stats_req(&f.b, 61, &sess), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op session tokens");
  assert_int_equal(sk_wire_unpack_stats_req(map, &got, &e), 0);
  assert_true(got.has_session);
  assert_int_equal(got.session, 61);
  assert_true(got.tokens);
  frame_free(&f);

  struct sk_wire_import_req im = {.total = 10, .offset = 4, .data = "\0\1\2", .len = 3}, gi;
  assert_int_equal(sk_wire_pack_import_req(&f.b, 62, &im), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op total offset data");
  assert_request(map, 62, "import");
  assert_int_equal(sk_msg_get(map, "data")->type, MSGPACK_OBJECT_BIN);
  assert_int_equal(sk_wire_unpack_import_req(map, &gi, &e), 0);
  assert_int_equal(gi.total, 10);
  assert_int_equal(gi.offset, 4);
  assert_int_equal(gi.len, 3);
  assert_memory_equal(gi.data, "\0\1\2", 3);
  frame_free(&f);
  assert_int_equal(sk_wire_pack_session_req(&f.b, 63, SK_OP_IMPORT, 1), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_import_req(map, &gi, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'total'");
  frame_free(&f);
}

void test_request_tokenize(void **state) {
  (void)state;
  struct frame f;
  struct sk_error e;
  char k[256];
  const int32_t toks[] = {3, -1};
  struct sk_wire_input t = {.text = "tok", .text_len = 3, .tokens = {.has = true, .ids = toks,
                                                                     .n = 2},
                            .bos = -1, .parse_special = true},
                       got;
  assert_int_equal(sk_wire_pack_tokenize_req(&f.b, 70, &t), 0);
  const msgpack_object *map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op text parse_special"); /* tokens are not tokenize's */
  assert_request(map, 70, "tokenize");
  memset(&got, 0xa5, sizeof got);
  assert_int_equal(sk_wire_unpack_tokenize_req(map, &got, &e), 0);
  assert_strn(got.text, got.text_len, "tok");
  assert_int_equal(got.bos, -1);
  assert_true(got.parse_special);
  assert_false(got.tokens.has);
  frame_free(&f);

  assert_int_equal(sk_wire_pack_detokenize_req(&f.b, 71, toks, 2), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id op tokens");
  assert_request(map, 71, "detokenize");
  struct sk_wire_ids ids;
  assert_int_equal(sk_wire_unpack_detokenize_req(map, &ids, &e), 0);
  assert_ids(&ids, toks, 2);
  assert_int_equal(sk_wire_unpack_tokenize_req(map, &got, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'text'");
  frame_free(&f);
  assert_int_equal(sk_wire_pack_req(&f.b, 72, SK_OP_DETOKENIZE), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_detokenize_req(map, &ids, &e), -SK_ERR_BAD_REQUEST);
  assert_string_equal(e.message, "missing field 'tokens'");
  frame_free(&f);
}

/* What every frame from the daemon has: id, event or not, ok, error. */
void test_frame_parts(void **state) {
  (void)state;
  struct frame f;
  struct sk_error e, got;
  sk_error_set(&e, SK_ERR_NO_SUCH_SESSION, "no session 4");
  assert_int_equal(sk_msgbuf_init(&f.b), 0);
  assert_int_equal(sk_wire_pack_error(&f.b, 8, &e), 0);
  const msgpack_object *map = parse(&f);
  uint64_t id = 0;
  bool ok = true;
  enum sk_wire_kind kind = SK_WIRE_EVENT_OTHER;
  assert_int_equal(sk_wire_unpack_id(map, &id, &got), 0);
  assert_int_equal(id, 8);
  assert_int_equal(sk_wire_unpack_kind(map, &kind, &got), 0);
  assert_int_equal(kind, SK_WIRE_REPLY);
  assert_int_equal(sk_wire_unpack_ok(map, &ok, &got), 0);
  assert_false(ok);
  sk_wire_unpack_error(map, &got);
  assert_int_equal(got.code, SK_ERR_NO_SUCH_SESSION);
  assert_string_equal(got.message, "no session 4");
  frame_free(&f);

  /* a reply without "error" is an internal error; without "ok" a
   * protocol error */
  assert_int_equal(sk_wire_pack_tokens(&f.b, 9, NULL, 0), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_ok(map, &ok, &got), 0);
  assert_true(ok);
  sk_wire_unpack_error(map, &got);
  assert_int_equal(got.code, SK_ERR_INTERNAL);
  assert_string_equal(got.message, sk_strerror(SK_ERR_INTERNAL));
  frame_free(&f);
  assert_int_equal(sk_wire_pack_req(&f.b, 10, SK_OP_PING), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_ok(map, &ok, &got), -SK_ERR_PROTOCOL);
  assert_string_equal(got.message, "missing field 'ok'");
  frame_free(&f);

  struct sk_token_event te = {.token = 5, .text = "x", .text_len = 1};
  assert_int_equal(sk_wire_pack_token_event(&f.b, 11, &te), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_kind(map, &kind, &got), 0);
  assert_int_equal(kind, SK_WIRE_EVENT_TOKEN);
  frame_free(&f);
  assert_int_equal(sk_wire_pack_data_event(&f.b, 12, 0, "ab", 2), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_kind(map, &kind, &got), 0);
  assert_int_equal(kind, SK_WIRE_EVENT_DATA);
  frame_free(&f);

  /* the generated text of a final reply */
  struct sk_generate_result g = {.stop = "length", .stop_token = -1};
  assert_int_equal(sk_wire_pack_generate(&f.b, 13, &g, NULL, 0, "it\0was", 6), 0);
  map = parse(&f);
  const char *text = NULL;
  size_t len = 0;
  assert_int_equal(sk_wire_unpack_generate_text(map, &text, &len, &got), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(text, "it\0was", 6);
  assert_int_equal(sk_wire_unpack_id(map, &id, &got), 0);
  assert_int_equal(id, 13);
  frame_free(&f);
}
