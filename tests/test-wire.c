/* The wire schema (libshared/proto/wire*.c): every reply and event it
 * packs is read back into the same struct, its map holds exactly the
 * entries written, and a malformed field is a protocol error naming it
 * (the requests: test-wire-requests.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>

#include "proto/msg.h"
#include "testmsg.h"
#include "proto/wire.h"
#include "test-wire.h"

/* Finishes b, checks the header against the body and parses the body. */
const msgpack_object *parse(struct frame *f) {
  int64_t size = sk_msgbuf_finish(&f->b);
  assert_true(size > (int64_t)SK_FRAME_HEADER_SIZE);
  const uint8_t *data = (const uint8_t *)f->b.sbuf.data;
  assert_int_equal(sk_frame_header_get(data), (uint64_t)size - SK_FRAME_HEADER_SIZE);
  struct sk_error e;
  assert_int_equal(sk_msg_parse(data + SK_FRAME_HEADER_SIZE, (size_t)size - SK_FRAME_HEADER_SIZE,
                                &f->msg, &e),
                   0);
  return &f->msg.root;
}

void frame_free(struct frame *f) {
  sk_msg_free(&f->msg);
  sk_msgbuf_free(&f->b);
}

void keys(const msgpack_object *map, char *out, size_t size) {
  size_t w = 0;
  out[0] = 0;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object *k = &map->via.map.ptr[i].key;
    assert_int_equal(k->type, MSGPACK_OBJECT_STR);
    w += (size_t)snprintf(out + w, size - w, "%s%.*s", i ? " " : "", (int)k->via.str.size,
                          k->via.str.ptr);
    assert_true(w < size);
  }
}

/* id and ok of a reply. */
static void assert_reply(const msgpack_object *map, uint64_t id) {
  uint64_t got = 0;
  bool ok = false;
  assert_int_equal(sk_msg_get_u64(map, "id", UINT64_MAX, &got, NULL), 1);
  assert_int_equal(got, id);
  assert_int_equal(sk_msg_get_bool(map, "ok", &ok, NULL), 1);
  assert_true(ok);
}

/* Field by field (the structs have padding). */
static void assert_summary_equal(const struct sk_session_summary *a,
                                 const struct sk_session_summary *b) {
  assert_int_equal(a->session, b->session);
  assert_string_equal(a->policy, b->policy);
  assert_int_equal(a->capacity, b->capacity);
  assert_int_equal(a->kv_bytes, b->kv_bytes);
  assert_int_equal(a->object_bytes, b->object_bytes);
  assert_string_equal(a->kv_type, b->kv_type);
  assert_int_equal(a->resident, b->resident);
  assert_int_equal(a->seen, b->seen);
  assert_int_equal(a->evicted, b->evicted);
  assert_int_equal(a->commit, b->commit);
  assert_int_equal(a->adopted, b->adopted);
  assert_int_equal(a->from, b->from);
}

static void assert_ranges_equal(const struct sk_range *a, size_t na, const struct sk_range *b,
                                size_t nb) {
  assert_int_equal(na, nb);
  for (size_t i = 0; i < na; i++) {
    assert_int_equal(a[i].first, b[i].first);
    assert_int_equal(a[i].last, b[i].last);
  }
}

static void assert_generate_equal(const struct sk_generate_result *a,
                                  const struct sk_generate_result *b) {
  assert_string_equal(a->stop, b->stop);
  assert_int_equal(a->stop_token, b->stop_token);
  assert_string_equal(a->stop_text, b->stop_text);
  assert_int_equal(a->n_tokens, b->n_tokens);
  assert_int_equal(a->prompt_tokens, b->prompt_tokens);
  assert_int_equal(a->completion_tokens, b->completion_tokens);
  assert_int_equal(a->drafted_tokens, b->drafted_tokens);
  assert_int_equal(a->accepted_tokens, b->accepted_tokens);
  assert_int_equal(a->evicted, b->evicted);
  assert_int_equal(a->resident, b->resident);
  assert_int_equal(a->seen, b->seen);
  assert_ranges_equal(a->ranges, a->n_ranges, b->ranges, b->n_ranges);
}

/* A "speculation" map, its keys in order, and the values read back. */
static const struct sk_spec_info spec_values = {
    .mode = "draft", .draft_tokens = 7, .draft_fixed = true, .draft_model = "pycode-5M",
    .lookup_history = 16384, .drafted = 300, .accepted = 240, .rejected = 60, .acceptance = 0.8};

static void assert_spec(const msgpack_object *map, const struct sk_spec_info *got) {
  char k[256] = "";
  size_t at = 0;
  const msgpack_object *m = sk_msg_get(map, "speculation");
  assert_non_null(m);
  for (uint32_t i = 0; i < m->via.map.size; i++)
    at += (size_t)snprintf(k + at, sizeof k - at, "%s%.*s", i ? " " : "",
                           (int)m->via.map.ptr[i].key.via.str.size,
                           m->via.map.ptr[i].key.via.str.ptr);
  assert_string_equal(k, "mode draft_tokens draft_fixed draft_model lookup_history drafted "
                         "accepted rejected acceptance");
  assert_string_equal(got->mode, spec_values.mode);
  assert_int_equal(got->draft_tokens, spec_values.draft_tokens);
  assert_int_equal(got->draft_fixed, spec_values.draft_fixed);
  assert_string_equal(got->draft_model, spec_values.draft_model);
  assert_int_equal(got->lookup_history, spec_values.lookup_history);
  assert_int_equal(got->drafted, spec_values.drafted);
  assert_int_equal(got->accepted, spec_values.accepted);
  assert_int_equal(got->rejected, spec_values.rejected);
  assert_true(got->acceptance == spec_values.acceptance);
}

static void test_ok_bytes(void **state) {
  (void)state;
  struct frame f;
  assert_int_equal(sk_wire_pack_ok(&f.b, 7), 0);
  int64_t size = sk_msgbuf_finish(&f.b);
  /* {"id": 7, "ok": true}: fixmap of 2, fixstr keys, fixint, true. */
  static const uint8_t want[] = {0, 0, 0, 9, 0x82, 0xa2, 'i', 'd', 0x07, 0xa2, 'o', 'k', 0xc3};
  assert_int_equal(size, sizeof want);
  assert_memory_equal(f.b.sbuf.data, want, sizeof want);
  sk_msgbuf_free(&f.b);
}

/* A map of 16 entries and more takes the map16 header: the count is the
 * entries written, whatever their number. */
static void test_map_counts(void **state) {
  (void)state;
  for (uint32_t n = 0; n < 40; n += 3) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    struct sk_wire_map m;
    sk_wire_map_begin(&m, &pk);
    for (uint32_t i = 0; i < n; i++) {
      char key[16];
      snprintf(key, sizeof key, "k%u", i);
      sk_wire_map_u64(&m, key, i * 1000u);
    }
    assert_int_equal(sk_wire_map_end(&m), 0);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 1024);
    msgpack_object o;
    size_t off = 0;
    assert_int_equal(msgpack_unpack(sb.data, sb.size, &off, &zone, &o), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, sb.size);
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o.via.map.size, n);
    if (n) assert_int_equal(o.via.map.ptr[n - 1].val.via.u64, (n - 1) * 1000u);
    assert_int_equal((uint8_t)sb.data[0], n < 16 ? 0x80 | n : 0xde);
    msgpack_zone_destroy(&zone);
    msgpack_sbuffer_destroy(&sb);
  }
}

static void test_open(void **state) {
  (void)state;
  struct sk_open_result o = {.session = 41, .policy = "sink_h2o", .capacity = 300,
                             .kv_bytes = 1u << 20, .object_bytes = (1u << 20) + 12288,
                             .kv_type = "f16", .n_sink = 4, .window = 0,
                             .heavy = 128, .recent = 168, .rope_scale = 2.5, .pinned = 3};
  struct frame f;
  assert_int_equal(sk_wire_pack_open(&f.b, 9, &o), 0);
  const msgpack_object *map = parse(&f);
  char k[512];
  keys(map, k, sizeof k);
  assert_string_equal(k, "id ok session policy capacity kv_bytes object_bytes kv_type n_sink "
                         "window heavy "
                         "recent rope_scale pinned");
  assert_reply(map, 9);
  struct sk_open_result got;
  memset(&got, 0xa5, sizeof got);
  struct sk_error e;
  assert_int_equal(sk_wire_unpack_open(map, &got, &e), 0);
  assert_int_equal(got.session, o.session);
  assert_string_equal(got.policy, o.policy);
  assert_int_equal(got.capacity, o.capacity);
  assert_int_equal(got.kv_bytes, o.kv_bytes);
  assert_int_equal(got.object_bytes, o.object_bytes);
  assert_string_equal(got.kv_type, o.kv_type);
  assert_int_equal(got.n_sink, o.n_sink);
  assert_int_equal(got.window, o.window);
  assert_int_equal(got.heavy, o.heavy);
  assert_int_equal(got.recent, o.recent);
  assert_true(got.rope_scale == o.rope_scale);
  assert_int_equal(got.pinned, o.pinned);
  frame_free(&f);
}

static void test_summary(void **state) {
  (void)state;
  struct sk_session_summary s = {.session = 8, .policy = "streaming", .capacity = 260,
                                 .kv_bytes = 57344, .object_bytes = 73728, .kv_type = "f32",
                                 .resident = 260,
                                 .seen = 1000, .evicted = 740, .commit = 77, .adopted = true,
                                 .from = 5};
  /* fork: with "from"; import: with "received"; resume: neither */
  const struct {
    uint64_t from, received;
    const char *tail;
  } cases[] = {{5, 0, " from"}, {0, 4096, " received"}, {0, 0, ""}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    s.from = cases[i].from;
    struct frame f;
    assert_int_equal(sk_wire_pack_summary(&f.b, 100 + i, &s, cases[i].received), 0);
    const msgpack_object *map = parse(&f);
    char k[512], want[512];
    keys(map, k, sizeof k);
    snprintf(want, sizeof want,
             "id ok session policy capacity kv_bytes object_bytes kv_type resident seen "
             "evicted commit "
             "adopted%s",
             cases[i].tail);
    assert_string_equal(k, want);
    assert_reply(map, 100 + i);
    uint64_t received = 0;
    assert_int_equal(sk_msg_get_u64(map, "received", UINT64_MAX, &received, NULL),
                     cases[i].received ? 1 : 0);
    assert_int_equal(received, cases[i].received);
    struct sk_session_summary got;
    memset(&got, 0xa5, sizeof got);
    assert_int_equal(sk_wire_unpack_summary(map, &got, NULL), 0);
    assert_summary_equal(&got, &s);
    frame_free(&f);
  }
}

static void test_append(void **state) {
  (void)state;
  struct sk_append_result a;
  memset(&a, 0, sizeof a);
  a.n_tokens = 4;
  a.resident = 60;
  a.seen = 104;
  a.evicted = 44;
  a.n_ranges = 2;
  a.ranges[0] = (struct sk_range){4, 40};
  a.ranges[1] = (struct sk_range){UINT64_C(1) << 40, (UINT64_C(1) << 40) + 6};
  const float lp[4] = {NAN, -0.5f, -12.25f, 0.0f};
  for (int with_lp = 0; with_lp < 2; with_lp++) {
    struct frame f;
    assert_int_equal(sk_wire_pack_append(&f.b, 3, &a, with_lp ? lp : NULL), 0);
    const msgpack_object *map = parse(&f);
    char k[512];
    keys(map, k, sizeof k);
    assert_string_equal(k, with_lp ? "id ok n_tokens evicted evicted_ranges resident seen logprobs"
                                    : "id ok n_tokens evicted evicted_ranges resident seen");
    assert_reply(map, 3);
    struct sk_append_result got;
    memset(&got, 0xa5, sizeof got);
    double glp[4] = {0};
    assert_int_equal(sk_wire_unpack_append(map, &got, with_lp ? glp : NULL, 4, NULL), 0);
    assert_int_equal(got.n_tokens, a.n_tokens);
    assert_int_equal(got.resident, a.resident);
    assert_int_equal(got.seen, a.seen);
    assert_int_equal(got.evicted, a.evicted);
    assert_ranges_equal(got.ranges, got.n_ranges, a.ranges, a.n_ranges);
    if (with_lp) {
      assert_true(isnan(glp[0]));
      assert_true(glp[1] == -0.5 && glp[2] == -12.25 && glp[3] == 0.0);
      /* a count that disagrees is refused */
      struct sk_error e;
      assert_int_equal(sk_wire_unpack_append(map, &got, glp, 3, &e), -SK_ERR_PROTOCOL);
      assert_string_equal(e.message, "field 'logprobs' missing or of the wrong length");
    }
    frame_free(&f);
  }
}

static void test_generate(void **state) {
  (void)state;
  struct sk_generate_result g;
  memset(&g, 0, sizeof g);
  snprintf(g.stop, sizeof g.stop, "eos");
  g.stop_token = 2;
  snprintf(g.stop_text, sizeof g.stop_text, "</s>");
  g.n_tokens = 17;
  g.prompt_tokens = 5;
  g.completion_tokens = 17;
  g.drafted_tokens = 12;
  g.accepted_tokens = 9;
  g.evicted = 1;
  g.resident = 21;
  g.seen = 22;
  g.n_ranges = 1;
  g.ranges[0] = (struct sk_range){4, 4};
  struct frame f;
  assert_int_equal(sk_wire_pack_generate(&f.b, 12, &g, NULL, 0, "hello", 5), 0);
  const msgpack_object *map = parse(&f);
  char k[512];
  keys(map, k, sizeof k);
  assert_string_equal(k, "id ok stop stop_token stop_text n_tokens usage text evicted "
                         "evicted_ranges resident seen");
  assert_reply(map, 12);
  const char *text;
  size_t len;
  assert_int_equal(sk_msg_get_str(map, "text", &text, &len, NULL), 1);
  assert_int_equal(len, 5);
  assert_memory_equal(text, "hello", 5);
  keys(sk_msg_get(map, "usage"), k, sizeof k);
  assert_string_equal(k, "prompt_tokens completion_tokens drafted_tokens accepted_tokens");
  struct sk_generate_result got;
  memset(&got, 0xa5, sizeof got);
  assert_int_equal(sk_wire_unpack_generate(map, &got, NULL), 0);
  assert_generate_equal(&got, &g);
  frame_free(&f);

  /* Not an end-of-generation stop: no stop_token nor stop_text; the
   * daemon's full stop text given apart is what goes out. */
  snprintf(g.stop, sizeof g.stop, "length");
  g.stop_token = -1;
  g.stop_text[0] = 0;
  assert_int_equal(sk_wire_pack_generate(&f.b, 13, &g, NULL, 0, NULL, 0), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id ok stop n_tokens usage text evicted evicted_ranges resident seen");
  assert_int_equal(sk_wire_unpack_generate(map, &got, NULL), 0);
  assert_generate_equal(&got, &g);
  frame_free(&f);

  g.stop_token = 7;
  snprintf(g.stop, sizeof g.stop, "eos");
  assert_int_equal(sk_wire_pack_generate(&f.b, 14, &g, "<|im_end|>", 10, "x", 1), 0);
  map = parse(&f);
  assert_int_equal(sk_wire_unpack_generate(map, &got, NULL), 0);
  assert_int_equal(got.stop_token, 7);
  assert_string_equal(got.stop_text, "<|im_end|>");
  frame_free(&f);
}

static void test_token_event(void **state) {
  (void)state;
  const struct sk_top_pair top[3] = {{10, 1.5}, {3, -2.25}, {70000, 0.125}};
  const struct sk_top_logprob toplp[2] = {{10, -0.5, "\xc3", 1}, {3, -1.75, "", 0}};
  struct sk_token_event ev = {.token = 10, .text = "\xc3\xbc", .text_len = 2, .top = top,
                              .n_top = 3};
  for (int with_top = 0; with_top < 2; with_top++) {
    ev.n_top = with_top ? 3 : 0;
    ev.top = with_top ? top : NULL;
    /* with log-probabilities: the token's, its bytes and two likely ones */
    ev.logprob = with_top ? -0.5 : NAN;
    ev.bytes = with_top ? "\xc3" : NULL;
    ev.bytes_len = with_top ? 1 : 0;
    ev.top_logprobs = with_top ? toplp : NULL;
    ev.n_top_logprobs = with_top ? 2 : 0;
    struct frame f;
    assert_int_equal(sk_wire_pack_token_event(&f.b, 5, &ev), 0);
    const msgpack_object *map = parse(&f);
    char k[256];
    keys(map, k, sizeof k);
    assert_string_equal(k, with_top ? "id event token text top logprob bytes top_logprobs"
                                    : "id event token text");
    const char *name;
    size_t len;
    assert_int_equal(sk_msg_get_str(map, "event", &name, &len, NULL), 1);
    assert_int_equal(len, 5);
    assert_memory_equal(name, "token", 5);
    struct sk_top_pair gtop[SK_WIRE_MAX_TOP];
    struct sk_top_logprob glp[SK_WIRE_MAX_TOP];
    struct sk_token_event got;
    assert_int_equal(sk_wire_unpack_token_event(map, &got, gtop, glp, NULL), 0);
    assert_int_equal(got.token, 10);
    assert_int_equal(got.text_len, 2);
    assert_memory_equal(got.text, "\xc3\xbc", 2);
    assert_int_equal(got.n_top, ev.n_top);
    for (size_t i = 0; i < got.n_top; i++) {
      assert_int_equal(got.top[i].token, top[i].token);
      assert_true(got.top[i].logit == top[i].logit);
    }
    if (with_top) {
      assert_true(got.logprob == -0.5);
      assert_int_equal(got.bytes_len, 1);
      assert_memory_equal(got.bytes, "\xc3", 1);
      assert_int_equal(got.n_top_logprobs, 2);
      assert_int_equal(got.top_logprobs[0].token, 10);
      assert_true(got.top_logprobs[0].logprob == -0.5);
      assert_int_equal(got.top_logprobs[0].bytes_len, 1);
      assert_memory_equal(got.top_logprobs[0].bytes, "\xc3", 1);
      assert_int_equal(got.top_logprobs[1].token, 3);
      assert_true(got.top_logprobs[1].logprob == -1.75);
      assert_int_equal(got.top_logprobs[1].bytes_len, 0);
    } else {
      assert_true(isnan(got.logprob));
      assert_null(got.bytes);
      assert_int_equal(got.n_top_logprobs, 0);
    }
    frame_free(&f);
  }
}

static void test_cancel_received_export(void **state) {
  (void)state;
  char k[256];
  for (int v = 0; v < 2; v++) {
    struct frame f;
    assert_int_equal(sk_wire_pack_cancel(&f.b, 20, v), 0);
    const msgpack_object *map = parse(&f);
    keys(map, k, sizeof k);
    assert_string_equal(k, "id ok cancelled");
    assert_reply(map, 20);
    bool got = !v;
    assert_int_equal(sk_wire_unpack_cancel(map, &got, NULL), 0);
    assert_int_equal(got, v);
    frame_free(&f);
  }
  struct frame f;
  assert_int_equal(sk_wire_pack_received(&f.b, 21, UINT64_C(5000000000)), 0);
  const msgpack_object *map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id ok received");
  uint64_t u = 0;
  assert_int_equal(sk_wire_unpack_received(map, &u, NULL), 0);
  assert_int_equal(u, UINT64_C(5000000000));
  frame_free(&f);

  assert_int_equal(sk_wire_pack_export(&f.b, 22, 7, 123456, 260, 1000), 0);
  map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id ok session bytes resident seen");
  assert_reply(map, 22);
  assert_int_equal(sk_wire_unpack_export(map, &u, NULL), 0);
  assert_int_equal(u, 123456);
  assert_int_equal(sk_msg_get_u64(map, "session", UINT64_MAX, &u, NULL), 1);
  assert_int_equal(u, 7);
  assert_int_equal(sk_msg_get_u64(map, "resident", UINT64_MAX, &u, NULL), 1);
  assert_int_equal(u, 260);
  assert_int_equal(sk_msg_get_u64(map, "seen", UINT64_MAX, &u, NULL), 1);
  assert_int_equal(u, 1000);
  frame_free(&f);
}

static void test_tokens_text(void **state) {
  (void)state;
  const int32_t ids[4] = {1, 365, INT32_MAX, INT32_MIN};
  char k[256];
  for (size_t n = 0; n <= 4; n += 4) {
    struct frame f;
    assert_int_equal(sk_wire_pack_tokens(&f.b, 30, ids, n), 0);
    const msgpack_object *map = parse(&f);
    keys(map, k, sizeof k);
    assert_string_equal(k, "id ok tokens");
    int32_t *got = (int32_t *)1;
    size_t got_n = 99;
    assert_int_equal(sk_wire_unpack_tokens(map, &got, &got_n, NULL), 0);
    assert_int_equal(got_n, n);
    if (n) assert_memory_equal(got, ids, sizeof ids);
    else assert_null(got);
    free(got);
    frame_free(&f);
  }
  struct frame f;
  assert_int_equal(sk_wire_pack_text(&f.b, 31, "he\0llo", 6), 0);
  const msgpack_object *map = parse(&f);
  keys(map, k, sizeof k);
  assert_string_equal(k, "id ok text");
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(sk_wire_unpack_text(map, &text, &len, NULL), 0);
  assert_int_equal(len, 6);
  assert_memory_equal(text, "he\0llo", 7); /* and the NUL after */
  free(text);
  /* each requires its field */
  struct sk_error e;
  int32_t *ids_got;
  size_t n_got;
  assert_int_equal(sk_wire_unpack_tokens(map, &ids_got, &n_got, &e), -SK_ERR_PROTOCOL);
  assert_string_equal(e.message, "missing field 'tokens'");
  frame_free(&f);
}

static void test_data_event(void **state) {
  (void)state;
  const char bytes[5] = {0, 1, (char)0xff, 'a', 0};
  struct frame f;
  assert_int_equal(sk_wire_pack_data_event(&f.b, 40, 262144, bytes, sizeof bytes), 0);
  const msgpack_object *map = parse(&f);
  char k[256];
  keys(map, k, sizeof k);
  assert_string_equal(k, "id event offset data");
  assert_int_equal(sk_msg_get(map, "data")->type, MSGPACK_OBJECT_BIN);
  uint64_t off = 0;
  const char *data = NULL;
  size_t n = 0;
  assert_int_equal(sk_wire_unpack_data_event(map, &off, &data, &n, NULL), 0);
  assert_int_equal(off, 262144);
  assert_int_equal(n, sizeof bytes);
  assert_memory_equal(data, bytes, sizeof bytes);
  frame_free(&f);
}

static void test_hello(void **state) {
  (void)state;
  struct sk_hello h;
  memset(&h, 0, sizeof h);
  h.protocol = SK_PROTOCOL_VERSION;
  snprintf(h.server, sizeof h.server, "sinkd");
  snprintf(h.version, sizeof h.version, "0.1.0");
  snprintf(h.chat_template, sizeof h.chat_template, "chatml");
  h.compute = (struct sk_compute_info){.kernel = "avx2-vnni", .threads = 6, .max_batch = 64,
                                       .kv_type = "f16"};
  h.model = (struct sk_model_info){.name = "stories15M", .n_vocab = 32000, .n_ctx_train = 256,
                                   .n_layer = 6, .dim = 288, .n_head = 6, .n_kv_head = 6,
                                   .rope_scale = 0.25, .max_capacity = 4096,
                                   .weight_type = "q8_0", .weight_bytes = 16000000};
  h.defaults = (struct sk_session_defaults){.policy = "streaming", .n_sink = 4, .window = 252,
                                            .heavy = 0, .recent = 0, .capacity = 256,
                                            .rope_scale = 1.0};
  h.speculation = spec_values;
  for (int with_error = 0; with_error < 2; with_error++) {
    snprintf(h.chat_template_error, sizeof h.chat_template_error, "%s",
             with_error ? "the model's template is not one sinkd knows" : "");
    struct frame f;
    const float levels[2] = {0.5f, 0.75f};
    const struct sk_wire_hello_extra x = {.model_file = "/var/lib/sinkd/model.gguf",
                                          .sparse_weight_bytes = 123,
                                          .sparsity_levels = levels,
                                          .n_sparsity_levels = 2};
    assert_int_equal(sk_wire_pack_hello(&f.b, 1, &h, &x), 0);
    const msgpack_object *map = parse(&f);
    char k[512];
    keys(map, k, sizeof k);
    assert_string_equal(k, "id ok protocol chat_template server version compute model defaults "
                           "speculation");
    keys(sk_msg_get(map, "chat_template"), k, sizeof k);
    assert_string_equal(k, with_error ? "name error" : "name");
    keys(sk_msg_get(map, "model"), k, sizeof k);
    assert_string_equal(k, "name file n_vocab n_ctx_train n_layer dim n_head n_kv_head rope_scale "
                           "max_capacity weight_type weight_bytes sparse_weight_bytes "
                           "sparsity_levels");
    const msgpack_object *lv = sk_msg_get(sk_msg_get(map, "model"), "sparsity_levels");
    assert_int_equal(lv->via.array.size, 2);
    assert_true(lv->via.array.ptr[1].via.f64 == 0.75);
    keys(sk_msg_get(map, "compute"), k, sizeof k);
    assert_string_equal(k, "kernel threads max_batch kv_type");
    keys(sk_msg_get(map, "defaults"), k, sizeof k);
    assert_string_equal(k, "policy n_sink window heavy recent capacity rope_scale");
    struct sk_hello got;
    memset(&got, 0xa5, sizeof got);
    assert_int_equal(sk_wire_unpack_hello(map, &got, NULL), 0);
    assert_int_equal(got.protocol, h.protocol);
    assert_string_equal(got.server, h.server);
    assert_string_equal(got.version, h.version);
    assert_string_equal(got.chat_template, h.chat_template);
    assert_string_equal(got.chat_template_error, h.chat_template_error);
    assert_string_equal(got.compute.kernel, h.compute.kernel);
    assert_int_equal(got.compute.threads, h.compute.threads);
    assert_int_equal(got.compute.max_batch, h.compute.max_batch);
    assert_string_equal(got.compute.kv_type, h.compute.kv_type);
    const struct sk_model_info *gm = &got.model, *hm = &h.model;
    assert_string_equal(gm->name, hm->name);
    assert_int_equal(gm->n_vocab, hm->n_vocab);
    assert_int_equal(gm->n_ctx_train, hm->n_ctx_train);
    assert_int_equal(gm->n_layer, hm->n_layer);
    assert_int_equal(gm->dim, hm->dim);
    assert_int_equal(gm->n_head, hm->n_head);
    assert_int_equal(gm->n_kv_head, hm->n_kv_head);
    assert_true(gm->rope_scale == hm->rope_scale);
    assert_int_equal(gm->max_capacity, hm->max_capacity);
    assert_string_equal(gm->weight_type, hm->weight_type);
    assert_int_equal(gm->weight_bytes, hm->weight_bytes);
    const struct sk_session_defaults *gd = &got.defaults, *hd = &h.defaults;
    assert_string_equal(gd->policy, hd->policy);
    assert_int_equal(gd->n_sink, hd->n_sink);
    assert_int_equal(gd->window, hd->window);
    assert_int_equal(gd->heavy, hd->heavy);
    assert_int_equal(gd->recent, hd->recent);
    assert_int_equal(gd->capacity, hd->capacity);
    assert_true(gd->rope_scale == hd->rope_scale);
    assert_spec(map, &got.speculation);
    frame_free(&f);
  }
}

static void test_list(void **state) {
  (void)state;
  struct sk_session_info rows[3];
  memset(rows, 0, sizeof rows);
  for (int i = 0; i < 3; i++) {
    rows[i].session = 7 + (uint64_t)i;
    snprintf(rows[i].policy, sizeof rows[i].policy, "%s", i ? "dense" : "streaming");
    rows[i].capacity = 260;
    rows[i].resident = 100 + (uint64_t)i;
    rows[i].seen = 5000000000u;
    rows[i].adopted = i == 1;
    snprintf(rows[i].kv_type, sizeof rows[i].kv_type, "f16");
    rows[i].owner_uid = 1000 + (uint64_t)i;
    rows[i].kv_bytes = 5u << 20;
    rows[i].object_bytes = (5u << 20) + 8192;
    rows[i].age_s = 90061;
    rows[i].idle_s = 3700 * (uint64_t)i;
    rows[i].busy = i == 2;
    rows[i].temporary = i == 0;
  }
  for (size_t n = 0; n <= 3; n += 3) {
    struct frame f;
    assert_int_equal(sk_wire_pack_list(&f.b, 50, rows, n), 0);
    const msgpack_object *map = parse(&f);
    char k[512];
    keys(map, k, sizeof k);
    assert_string_equal(k, "id ok sessions");
    if (n) {
      keys(&sk_msg_get(map, "sessions")->via.array.ptr[1], k, sizeof k);
      assert_string_equal(k, "session owner_uid policy capacity kv_type resident seen busy "
                             "adopted kv_bytes object_bytes age_s idle_s temporary");
    }
    struct sk_session_info *got = (struct sk_session_info *)1;
    size_t got_n = 99;
    assert_int_equal(sk_wire_unpack_list(map, &got, &got_n, NULL), 0);
    assert_int_equal(got_n, n);
    if (!n) assert_null(got);
    for (size_t i = 0; i < n; i++) {
      assert_int_equal(got[i].session, rows[i].session);
      assert_string_equal(got[i].policy, rows[i].policy);
      assert_int_equal(got[i].capacity, rows[i].capacity);
      assert_int_equal(got[i].resident, rows[i].resident);
      assert_int_equal(got[i].seen, rows[i].seen);
      assert_int_equal(got[i].adopted, rows[i].adopted);
      assert_string_equal(got[i].kv_type, rows[i].kv_type);
      assert_int_equal(got[i].owner_uid, rows[i].owner_uid);
      assert_int_equal(got[i].kv_bytes, rows[i].kv_bytes);
      assert_int_equal(got[i].object_bytes, rows[i].object_bytes);
      assert_int_equal(got[i].age_s, rows[i].age_s);
      assert_int_equal(got[i].idle_s, rows[i].idle_s);
      assert_int_equal(got[i].busy, rows[i].busy);
      assert_int_equal(got[i].temporary, rows[i].temporary);
    }
    free(got);
    frame_free(&f);
  }
}

static void test_daemon_stats(void **state) {
  (void)state;
  struct sk_daemon_stats s = {.sessions = 2, .clients = 3, .uptime_s = 60,
                              .tokens_prefilled = 123, .tokens_generated = 456,
                              .max_sessions = 64, .memory_bytes = 8192, .max_memory = 1u << 30,
                              .adopted = 1, .set_aside = 2, .idle_ttl_s = 3600, .steps = 999,
                              .compute = {.kernel = "avx2", .threads = 2, .max_batch = 64,
                                          .kv_type = "f16"},
                              .weights_mapped_bytes = 1000, .weights_repacked_bytes = 2000,
                              .user_sessions = 1, .user_memory_bytes = 4096,
                              .max_user_sessions = 16, .max_user_memory = 1u << 20,
                              .speculation = spec_values};
  const struct sk_wire_daemon_extra x = {.chat_template = "chatml", .chat_template_error = "",
                                         .state_dir = "/dev/shm/sinkd"};
  for (int has_user = 0; has_user < 2; has_user++) {
    s.has_user = has_user;
    struct frame f;
    assert_int_equal(sk_wire_pack_daemon_stats(&f.b, 60, &s, &x), 0);
    const msgpack_object *map = parse(&f);
    char k[1024];
    keys(map, k, sizeof k);
    assert_string_equal(k, has_user
                               ? "id ok compute chat_template weights_mapped_bytes "
                                 "weights_repacked_bytes steps sessions user_sessions "
                                 "user_memory_bytes max_user_sessions max_user_memory clients "
                                 "uptime_s tokens_prefilled tokens_generated max_sessions "
                                 "memory_bytes max_memory adopted set_aside idle_ttl_s state_dir "
                                 "speculation"
                               : "id ok compute chat_template weights_mapped_bytes "
                                 "weights_repacked_bytes steps sessions clients uptime_s "
                                 "tokens_prefilled tokens_generated max_sessions memory_bytes "
                                 "max_memory adopted set_aside idle_ttl_s state_dir speculation");
    struct sk_daemon_stats got;
    assert_int_equal(sk_wire_unpack_daemon_stats(map, &got, NULL), 0);
    assert_int_equal(got.sessions, s.sessions);
    assert_int_equal(got.clients, s.clients);
    assert_int_equal(got.uptime_s, s.uptime_s);
    assert_int_equal(got.tokens_prefilled, s.tokens_prefilled);
    assert_int_equal(got.tokens_generated, s.tokens_generated);
    assert_int_equal(got.max_sessions, s.max_sessions);
    assert_int_equal(got.memory_bytes, s.memory_bytes);
    assert_int_equal(got.max_memory, s.max_memory);
    assert_int_equal(got.adopted, s.adopted);
    assert_int_equal(got.set_aside, s.set_aside);
    assert_int_equal(got.idle_ttl_s, s.idle_ttl_s);
    assert_int_equal(got.steps, s.steps);
    assert_int_equal(got.weights_mapped_bytes, 1000);
    assert_int_equal(got.weights_repacked_bytes, 2000);
    assert_string_equal(got.compute.kernel, s.compute.kernel);
    assert_int_equal(got.compute.threads, s.compute.threads);
    assert_int_equal(got.compute.max_batch, s.compute.max_batch);
    assert_string_equal(got.compute.kv_type, s.compute.kv_type);
    assert_spec(map, &got.speculation);
    assert_int_equal(got.has_user, has_user);
    assert_int_equal(got.user_sessions, has_user ? s.user_sessions : 0);
    assert_int_equal(got.user_memory_bytes, has_user ? s.user_memory_bytes : 0);
    assert_int_equal(got.max_user_sessions, has_user ? s.max_user_sessions : 0);
    assert_int_equal(got.max_user_memory, has_user ? s.max_user_memory : 0);
    const char *dir;
    size_t len;
    assert_int_equal(sk_msg_get_str(map, "state_dir", &dir, &len, NULL), 1);
    assert_int_equal(len, strlen(x.state_dir));
    assert_memory_equal(dir, x.state_dir, len);
    frame_free(&f);
  }
}

static void test_session_stats(void **state) {
  (void)state;
  static struct sk_session_stats s, got;
  memset(&s, 0, sizeof s);
  s.session = 3;
  snprintf(s.policy, sizeof s.policy, "sink_h2o");
  snprintf(s.chat_template, sizeof s.chat_template, "llama2");
  s.n_sink = 4;
  s.heavy = 60;
  s.recent = 60;
  s.pinned = 4;
  s.rope_scale = 2.0;
  s.model_rope_scale = 0.5;
  s.capacity = 128;
  s.resident = 128;
  s.seen = 4000;
  s.evicted = 3872;
  s.kv_bytes = 9000;
  s.object_bytes = 12288;
  snprintf(s.kv_type, sizeof s.kv_type, "f32");
  s.has_positions = true;
  s.position_last = 127;
  s.commit = 41;
  s.adopted = true;
  s.idle_s = 12;
  s.n_resident_ranges = 2;
  s.resident_ranges[0] = (struct sk_range){0, 3};
  s.resident_ranges[1] = (struct sk_range){3880, 3999};
  s.attn_steps = 64;
  s.sink_tokens = 4;
  s.n_layers = 3;
  const double mass[3] = {0.5, 0.25, 0.875}, ent[3] = {1.5, 2.0, 0.125};
  memcpy(s.sink_mass, mass, sizeof mass);
  memcpy(s.entropy, ent, sizeof ent);
  s.sparsity = 0.5;
  s.sparse_tokens = 77;
  s.n_sparse_layers = 3;
  const double measured[3] = {0.5, 0.625, 0.4375};
  memcpy(s.sparsity_measured, measured, sizeof measured);
  s.weight_bytes_per_token = 12345.5;
  s.speculation = spec_values;
  /* The struct's own arrays (x NULL), then the daemon's extras: more
   * ranges than the struct keeps, float layers, the owner and tokens. */
  struct sk_range many[SK_CLIENT_MAX_RANGES + 6];
  for (size_t i = 0; i < sizeof many / sizeof many[0]; i++) many[i] = (struct sk_range){2 * i, 2 * i};
  const float fmass[3] = {0.5f, 0.25f, 0.875f}, fent[3] = {1.5f, 2.0f, 0.125f};
  const int32_t ids[2] = {1, 29871};
  const struct sk_wire_session_extra x = {.owner_uid = 1000, .has_resident_ranges = true,
                                          .ranges = many, .n_ranges = sizeof many / sizeof many[0],
                                          .sink_mass = fmass, .entropy = fent, .n_layers = 3,
                                          .sparsity_measured = measured, .n_sparse_layers = 3,
                                          .has_tokens = true, .tokens = ids, .n_tokens = 2};
  for (int with_x = 0; with_x < 2; with_x++) {
    struct frame f;
    assert_int_equal(sk_wire_pack_session_stats(&f.b, 70, &s, with_x ? &x : NULL), 0);
    const msgpack_object *map = parse(&f);
    char k[1024];
    keys(map, k, sizeof k);
    assert_string_equal(k, with_x ? "id ok session chat_template policy n_sink window heavy recent "
                                    "pinned rope_scale model_rope_scale capacity resident seen "
                                    "evicted kv_bytes object_bytes kv_type sparsity sparse_tokens "
                                    "sparsity_measured weight_bytes_per_token positions "
                                    "attention busy commit "
                                    "adopted idle_s owner_uid speculation resident_ranges tokens"
                                  : "id ok session chat_template policy n_sink window heavy recent "
                                    "pinned rope_scale model_rope_scale capacity resident seen "
                                    "evicted kv_bytes object_bytes kv_type sparsity sparse_tokens "
                                    "sparsity_measured weight_bytes_per_token positions "
                                    "attention busy commit "
                                    "adopted idle_s owner_uid speculation resident_ranges");
    keys(sk_msg_get(map, "attention"), k, sizeof k);
    assert_string_equal(k, "steps sink_tokens sink_mass entropy");
    memset(&got, 0xa5, sizeof got);
    assert_int_equal(sk_wire_unpack_session_stats(map, &got, NULL), 0);
    assert_int_equal(got.session, s.session);
    assert_string_equal(got.policy, s.policy);
    assert_string_equal(got.chat_template, s.chat_template);
    assert_int_equal(got.n_sink, s.n_sink);
    assert_int_equal(got.window, s.window);
    assert_int_equal(got.heavy, s.heavy);
    assert_int_equal(got.recent, s.recent);
    assert_int_equal(got.pinned, s.pinned);
    assert_true(got.rope_scale == s.rope_scale);
    assert_true(got.model_rope_scale == s.model_rope_scale);
    assert_int_equal(got.capacity, s.capacity);
    assert_int_equal(got.resident, s.resident);
    assert_int_equal(got.seen, s.seen);
    assert_int_equal(got.evicted, s.evicted);
    assert_int_equal(got.kv_bytes, s.kv_bytes);
    assert_int_equal(got.object_bytes, s.object_bytes);
    assert_string_equal(got.kv_type, s.kv_type);
    assert_true(got.has_positions);
    assert_int_equal(got.position_first, 0);
    assert_int_equal(got.position_last, 127);
    assert_int_equal(got.commit, s.commit);
    assert_int_equal(got.adopted, s.adopted);
    assert_int_equal(got.idle_s, s.idle_s);
    assert_int_equal(got.busy, s.busy);
    assert_true(got.sparsity == 0.5);
    assert_int_equal(got.sparse_tokens, 77);
    assert_int_equal(got.n_sparse_layers, 3);
    for (int l = 0; l < 3; l++) assert_true(got.sparsity_measured[l] == measured[l]);
    assert_true(got.weight_bytes_per_token == 12345.5);
    assert_spec(map, &got.speculation);
    assert_int_equal(got.attn_steps, 64);
    assert_int_equal(got.sink_tokens, 4);
    assert_int_equal(got.n_layers, 3);
    for (int l = 0; l < 3; l++) {
      assert_true(got.sink_mass[l] == mass[l]);
      assert_true(got.entropy[l] == ent[l]);
    }
    if (with_x) {
      assert_int_equal(sk_msg_get(map, "resident_ranges")->via.array.size, x.n_ranges);
      assert_ranges_equal(got.resident_ranges, got.n_resident_ranges, many, SK_CLIENT_MAX_RANGES);
      uint64_t uid = 0;
      assert_int_equal(sk_msg_get_u64(map, "owner_uid", UINT64_MAX, &uid, NULL), 1);
      assert_int_equal(uid, 1000);
      int32_t *gids = NULL;
      size_t n = 0;
      assert_int_equal(sk_wire_unpack_tokens(map, &gids, &n, NULL), 0);
      assert_int_equal(n, 2);
      assert_memory_equal(gids, ids, sizeof ids);
      free(gids);
    } else {
      assert_ranges_equal(got.resident_ranges, got.n_resident_ranges, s.resident_ranges,
                          s.n_resident_ranges);
    }
    frame_free(&f);
  }
  /* busy and empty: no ranges, positions [] */
  s.busy = true;
  s.has_positions = false;
  s.resident = 0;
  struct frame f;
  assert_int_equal(sk_wire_pack_session_stats(&f.b, 71, &s, NULL), 0);
  const msgpack_object *map = parse(&f);
  assert_null(sk_msg_get(map, "resident_ranges"));
  assert_int_equal(sk_msg_get(map, "positions")->via.array.size, 0);
  assert_int_equal(sk_wire_unpack_session_stats(map, &got, NULL), 0);
  assert_true(got.busy);
  assert_false(got.has_positions);
  assert_int_equal(got.n_resident_ranges, 0);
  frame_free(&f);
}

/* A request built field by field: sk_test_msgbuf_finish_map counts the
 * entries and writes the header msgpack-c would have, byte for byte. */
static void test_finish_map(void **state) {
  (void)state;
  const uint32_t counts[] = {0, 1, 15, 16, 40};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    uint32_t n = counts[c];
    struct sk_msgbuf counted, literal;
    assert_int_equal(sk_msgbuf_init(&counted), 0);
    assert_int_equal(sk_msgbuf_init(&literal), 0);
    msgpack_pack_map(&literal.pk, n);
    for (uint32_t i = 0; i < n; i++) {
      char key[16];
      snprintf(key, sizeof key, "k%u", i);
      /* nested values too: an array of a map and a bin */
      sk_pack_cstr(&counted.pk, key);
      sk_pack_cstr(&literal.pk, key);
      for (int w = 0; w < 2; w++) {
        msgpack_packer *pk = w ? &literal.pk : &counted.pk;
        msgpack_pack_array(pk, 2);
        msgpack_pack_map(pk, 1);
        sk_test_pack_kv_u64(pk, "x", i);
        msgpack_pack_bin(pk, 3);
        msgpack_pack_bin_body(pk, "a\0b", 3);
      }
    }
    int64_t a = sk_test_msgbuf_finish_map(&counted), b = sk_msgbuf_finish(&literal);
    assert_true(a > 0);
    assert_int_equal(a, b);
    assert_memory_equal(counted.sbuf.data, literal.sbuf.data, (size_t)a);
    sk_msgbuf_free(&counted);
    sk_msgbuf_free(&literal);
  }
  /* a key without its value is refused */
  struct sk_msgbuf odd;
  assert_int_equal(sk_msgbuf_init(&odd), 0);
  sk_pack_cstr(&odd.pk, "alone");
  assert_int_equal(sk_test_msgbuf_finish_map(&odd), -SK_ERR_INTERNAL);
  sk_msgbuf_free(&odd);
}

/* The error reply, byte for byte. */
static void test_error_bytes(void **state) {
  (void)state;
  struct sk_msgbuf b;
  assert_int_equal(sk_msgbuf_init(&b), 0);
  struct sk_error e;
  sk_error_set(&e, SK_ERR_BUSY, "x");
  assert_int_equal(sk_wire_pack_error(&b, 2, &e), 0);
  static const uint8_t want[] = {0, 0, 0, 36,  0x83, 0xa2, 'i', 'd', 0x02, 0xa2, 'o', 'k', 0xc2,
                                 0xa5, 'e', 'r', 'r', 'o', 'r', 0x82, 0xa4, 'c', 'o', 'd', 'e',
                                 0xa4, 'b', 'u', 's', 'y', 0xa7, 'm', 'e', 's', 's', 'a', 'g',
                                 'e', 0xa1, 'x'};
  assert_int_equal(b.sbuf.size, sizeof want);
  assert_memory_equal(b.sbuf.data, want, sizeof want);
  sk_msgbuf_free(&b);
}

/* A field of the wrong type is a protocol error that names it. */
static void test_bad_field(void **state) {
  (void)state;
  struct sk_msgbuf b;
  assert_int_equal(sk_msgbuf_init(&b), 0);
  struct sk_wire_map m;
  sk_wire_map_begin(&m, &b.pk);
  sk_wire_map_u64(&m, "session", 4);
  sk_wire_map_str(&m, "seen", "many");
  assert_int_equal(sk_wire_map_end(&m), 0);
  struct frame f = {.b = b};
  const msgpack_object *map = parse(&f);
  struct sk_error e;
  struct sk_session_summary s;
  assert_int_equal(sk_wire_unpack_summary(map, &s, &e), -SK_ERR_PROTOCOL);
  assert_non_null(strstr(e.message, "'seen'"));
  struct sk_open_result o;
  assert_int_equal(sk_wire_unpack_open(map, &o, &e), 0); /* open has no "seen" */
  struct sk_append_result a;
  assert_int_equal(sk_wire_unpack_append(map, &a, NULL, 0, &e), -SK_ERR_PROTOCOL);
  assert_non_null(strstr(e.message, "'seen'"));
  struct sk_top_pair top[SK_WIRE_MAX_TOP];
  struct sk_top_logprob toplp[SK_WIRE_MAX_TOP];
  struct sk_token_event ev;
  assert_int_equal(sk_wire_unpack_token_event(map, &ev, top, toplp, &e), -SK_ERR_PROTOCOL);
  assert_string_equal(e.message, "token event without an integer 'token'");
  frame_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ok_bytes),   cmocka_unit_test(test_map_counts),
      cmocka_unit_test(test_open),       cmocka_unit_test(test_summary),
      cmocka_unit_test(test_append),     cmocka_unit_test(test_generate),
      cmocka_unit_test(test_token_event), cmocka_unit_test(test_bad_field),
      cmocka_unit_test(test_cancel_received_export), cmocka_unit_test(test_tokens_text),
      cmocka_unit_test(test_data_event),  cmocka_unit_test(test_hello),
      cmocka_unit_test(test_list),       cmocka_unit_test(test_daemon_stats),
      cmocka_unit_test(test_session_stats),
      cmocka_unit_test(test_finish_map), cmocka_unit_test(test_error_bytes),
      cmocka_unit_test(test_request_head), cmocka_unit_test(test_request_open),
      cmocka_unit_test(test_request_open_range), cmocka_unit_test(test_request_append),
      cmocka_unit_test(test_request_generate), cmocka_unit_test(test_request_generate_defaults),
      cmocka_unit_test(test_request_elements), cmocka_unit_test(test_request_stats_import),
      cmocka_unit_test(test_request_tokenize), cmocka_unit_test(test_frame_parts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
