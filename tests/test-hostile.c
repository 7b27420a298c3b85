/* Hostile frames against a live daemon, table-driven.
 *
 * Every case is the exact bytes a client writes (framing included) and
 * what must come back: an error reply with a given id and code (and a
 * word of the message), an ok reply, or a clean close. Cases run on fresh
 * connections while a bystander client keeps generating on its own
 * session and another keeps pinging; afterwards the daemon is still up,
 * the bystander's every request succeeded, pings stayed fast, and the
 * daemon's peak memory stayed within a bound no declared length can
 * reach.
 *
 * The table covers: length prefixes 0, 1, 2^31, 2^32-1, max_frame and
 * max_frame+1; msgpack declaring huge arrays, maps, strings, bins and
 * exts; nesting at and past the limit; bodies truncated at every byte and
 * connections closed mid-frame; every wrong type for every field of every
 * op; token ids outside the vocabulary; negative and enormous numbers.
 *
 * test-hostile-limits.c has the clients that vanish, bursts of opens and
 * the memory an input may hold.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/msg.h"
#include "session/session.h"
#include "sinkd/client.h"
#include "testdaemon.h"
#include "testutil.h"
#include "testhostile.h"
#define MAX_FRAME (1u << 20) /* the daemon's default */
#define N_VOCAB 512u         /* stories260K */

static uint64_t g_session; /* a session the cases may name */

/* ---- the table -------------------------------------------------------- */

enum want { WANT_REPLY, WANT_CLOSE };

struct hcase {
  char name[128];
  uint8_t *bytes; /* exactly what is written */
  size_t len;
  enum want want;
  uint64_t id;       /* WANT_REPLY: id of the final reply */
  char code[32];     /* "" = ok */
  char needle[64];   /* "" or a substring of the error message */
  bool usable_after; /* the same connection then answers a ping */
  bool costly;       /* an honest request that may use more memory */
  size_t junk_after; /* bytes of junk written after (swallowed) */
};

static struct hcase *g_cases;
static size_t g_n_cases, g_cap_cases;

static struct hcase *add_case(const uint8_t *bytes, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static struct hcase *add_case(const uint8_t *bytes, size_t len, const char *fmt, ...) {
  if (g_n_cases == g_cap_cases) {
    g_cap_cases = g_cap_cases ? 2 * g_cap_cases : 256;
    g_cases = realloc(g_cases, g_cap_cases * sizeof *g_cases);
    assert_non_null(g_cases);
  }
  struct hcase *c = &g_cases[g_n_cases++];
  memset(c, 0, sizeof *c);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->name, sizeof c->name, fmt, ap);
  va_end(ap);
  c->bytes = malloc(len ? len : 1);
  assert_non_null(c->bytes);
  memcpy(c->bytes, bytes, len);
  c->len = len;
  c->want = WANT_REPLY;
  c->usable_after = true;
  return c;
}

static void expect_err(struct hcase *c, uint64_t id, const char *code, const char *needle) {
  c->id = id;
  snprintf(c->code, sizeof c->code, "%s", code);
  snprintf(c->needle, sizeof c->needle, "%s", needle ? needle : "");
}

static void expect_ok(struct hcase *c, uint64_t id) {
  c->id = id;
  c->code[0] = 0;
}

/* A framed body from raw bytes. */
static struct hcase *add_body(const void *body, size_t n, const char *name) {
  uint8_t *f = malloc(n + 4);
  assert_non_null(f);
  sk_frame_header_put(f, (uint32_t)n);
  memcpy(f + 4, body, n);
  struct hcase *c = add_case(f, n + 4, "%s", name);
  free(f);
  return c;
}

/* Request builder: msgpack body in an sbuffer; framed when added. */
struct body {
  msgpack_sbuffer sb;
  msgpack_packer pk;
};

static void b_init(struct body *b) {
  msgpack_sbuffer_init(&b->sb);
  msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}
static void b_free(struct body *b) { msgpack_sbuffer_destroy(&b->sb); }
static void b_str(struct body *b, const char *s) {
  msgpack_pack_str(&b->pk, strlen(s));
  msgpack_pack_str_body(&b->pk, s, strlen(s));
}
static void b_raw(struct body *b, const void *p, size_t n) { msgpack_sbuffer_write(&b->sb, p, n); }

static struct hcase *add_b(struct body *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static struct hcase *add_b(struct body *b, const char *fmt, ...) {
  char name[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  struct hcase *c = add_body(b->sb.data, b->sb.size, name);
  b_free(b);
  return c;
}

/* {"id": id, "op": op, ...n_more pairs follow} */
static void b_req(struct body *b, uint64_t id, const char *op, uint32_t n_more) {
  b_init(b);
  msgpack_pack_map(&b->pk, 2 + n_more);
  b_str(b, "id");
  msgpack_pack_uint64(&b->pk, id);
  b_str(b, "op");
  b_str(b, op);
}

/* ---- length prefixes --------------------------------------------------- */

static void cases_length_prefix(void) {
  static const uint8_t zero[4] = {0, 0, 0, 0};
  expect_err(add_case(zero, 4, "length 0"), 0, "bad_request", "empty frame");

  static const uint8_t one_map[5] = {0, 0, 0, 1, 0x80};
  expect_err(add_case(one_map, 5, "length 1: {}"), 0, "bad_request", "missing field 'id'");
  static const uint8_t one_nil[5] = {0, 0, 0, 1, 0xc0};
  expect_err(add_case(one_nil, 5, "length 1: nil"), 0, "bad_request", "must be a map");
  static const uint8_t one_c1[5] = {0, 0, 0, 1, 0xc1};
  expect_err(add_case(one_c1, 5, "length 1: 0xc1"), 0, "bad_request", "invalid byte");
  static const uint8_t one_arr[5] = {0, 0, 0, 1, 0x91};
  expect_err(add_case(one_arr, 5, "length 1: fixarray of 1"), 0, "bad_request", "declared");
  static const uint8_t one_map32[5] = {0, 0, 0, 1, 0xdf};
  expect_err(add_case(one_map32, 5, "length 1: map32 header cut"), 0, "bad_request", "truncated");

  /* Declared far above max_frame: refused from the header alone. The body
   * is never buffered: what follows is discarded as it arrives, so this
   * connection is spent (a client would have to send 2 GiB). */
  static const uint8_t p31[4] = {0x80, 0, 0, 0};
  struct hcase *c = add_case(p31, 4, "length 2^31");
  expect_err(c, 0, "too_large", "2147483648");
  c->usable_after = false;
  c->junk_after = 3u << 20;
  static const uint8_t pmax[4] = {0xff, 0xff, 0xff, 0xff};
  c = add_case(pmax, 4, "length 2^32-1");
  expect_err(c, 0, "too_large", "4294967295");
  c->usable_after = false;
  c->junk_after = 3u << 20;

  /* max_frame + 1 with its body: refused, body skipped, stream in sync. */
  size_t n = MAX_FRAME + 1;
  uint8_t *f = calloc(1, n + 4);
  assert_non_null(f);
  sk_frame_header_put(f, (uint32_t)n);
  f[4] = 0x80;
  expect_err(add_case(f, n + 4, "length max_frame+1 with body"), 0, "too_large",
             "bytes (the daemon's max_frame, up to 16777216)");
  free(f);

  /* Exactly max_frame: a tokenize of ~1 MiB of text is served. */
  struct body b;
  b_req(&b, 41, "tokenize", 1);
  b_str(&b, "text");
  size_t text_len = MAX_FRAME - b.sb.size - 5;
  msgpack_pack_str(&b.pk, text_len);
  char *text = malloc(text_len);
  for (size_t i = 0; i < text_len; i++) text[i] = "Once upon a time "[i % 17];
  msgpack_pack_str_body(&b.pk, text, text_len);
  free(text);
  assert_int_equal(b.sb.size, MAX_FRAME);
  struct hcase *big = add_b(&b, "length max_frame: tokenize 1 MiB");
  expect_ok(big, 41);
  big->costly = true;

  /* A header cut short, then the connection closed. */
  for (size_t k = 1; k < 4; k++) {
    static const uint8_t hdr[4] = {0, 0, 0, 13};
    add_case(hdr, k, "header cut after %zu bytes, then close", k)->want = WANT_CLOSE;
  }
}

/* ---- huge declarations and nesting ------------------------------------ */

static void cases_declared_sizes(void) {
  static const struct {
    const char *name;
    uint8_t bytes[9];
    size_t n;
    const char *needle;
  } roots[] = {
      {"array32 of 2^32-1 in 5 bytes", {0xdd, 0xff, 0xff, 0xff, 0xff}, 5, "declared"},
      {"map32 of 2^32-1 in 5 bytes", {0xdf, 0xff, 0xff, 0xff, 0xff}, 5, "declared"},
      {"array16 of 65535", {0xdc, 0xff, 0xff}, 3, "declared"},
      {"map16 of 65535", {0xde, 0xff, 0xff}, 3, "declared"},
      {"str32 of 2^32-1", {0xdb, 0xff, 0xff, 0xff, 0xff}, 5, "truncated str"},
      {"str16 of 65535", {0xda, 0xff, 0xff}, 3, "truncated str"},
      {"str8 of 255", {0xd9, 0xff}, 2, "truncated str"},
      {"bin32 of 2^32-1", {0xc6, 0xff, 0xff, 0xff, 0xff}, 5, "truncated bin"},
      {"ext32 of 2^32-1", {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}, 6, "truncated ext"},
      {"fixext16 cut", {0xd8, 0x01, 0x02}, 3, "truncated fixext16"},
      {"float64 cut", {0xcb, 0x00}, 2, "truncated float64"},
  };
  for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++)
    expect_err(add_body(roots[i].bytes, roots[i].n, roots[i].name), 0, "bad_request",
               roots[i].needle);

  /* The same inside a well-formed request: the declared element count of a
   * field's value is refused before anything is allocated for it. */
  static const struct {
    const char *op, *field;
    uint8_t bytes[6];
    size_t n;
  } fields[] = {
      {"detokenize", "tokens", {0xdd, 0xff, 0xff, 0xff, 0xff}, 5},
      {"detokenize", "tokens", {0xdc, 0xff, 0xff}, 3},
      {"tokenize", "text", {0xdb, 0xff, 0xff, 0xff, 0xff}, 5},
      {"tokenize", "text", {0xc6, 0x7f, 0xff, 0xff, 0xff}, 5},
      {"generate", "stop", {0xdd, 0xff, 0xff, 0xff, 0xfe}, 5},
      {"open", "policy", {0xdf, 0xff, 0xff, 0xff, 0xff}, 5},
  };
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    struct body b;
    b_req(&b, 50 + i, fields[i].op, 1);
    b_str(&b, fields[i].field);
    b_raw(&b, fields[i].bytes, fields[i].n);
    expect_err(add_b(&b, "%s.%s declared huge (0x%02x)", fields[i].op, fields[i].field,
                     fields[i].bytes[0]),
               0, "bad_request", fields[i].bytes[0] >= 0xdc ? "declared" : "truncated");
  }
  /* A huge declaration with enough bytes behind it to pass the "bytes
   * left" rule for a few levels, but not for all. */
  struct body b;
  b_req(&b, 60, "detokenize", 1);
  b_str(&b, "tokens");
  msgpack_pack_array(&b.pk, 100000);
  char s199[199];
  memset(s199, 's', sizeof s199);
  for (int i = 0; i < 600; i++) { /* 600 x 201 bytes > 100000 */
    msgpack_pack_str(&b.pk, sizeof s199);
    msgpack_pack_str_body(&b.pk, s199, sizeof s199);
  }
  expect_err(add_b(&b, "tokens: array of 100000 declared, 600 long strings present"), 0,
             "bad_request", "truncated array");

  /* Nesting: the root map is level 1; "tokens" holds arrays nested to
   * levels 2..depth. */
  const unsigned depths[] = {SK_MSG_MAX_DEPTH, SK_MSG_MAX_DEPTH + 1, 64, 100000};
  for (size_t k = 0; k < sizeof depths / sizeof depths[0]; k++) {
    unsigned depth = depths[k];
    b_req(&b, 70 + k, "detokenize", 1);
    b_str(&b, "tokens");
    for (unsigned d = 2; d <= depth; d++) msgpack_pack_array(&b.pk, d < depth ? 1 : 0);
    struct hcase *c = add_b(&b, "nesting depth %u", depth);
    if (depth <= SK_MSG_MAX_DEPTH)
      expect_err(c, 70 + k, "bad_request", "field 'tokens': element 0");
    else
      expect_err(c, 0, "bad_request", "nesting deeper than 16");
  }
  /* Deep nesting of maps at the root, and of a lone array. */
  uint8_t deep[200000];
  memset(deep, 0x81, sizeof deep); /* {k: {k: ...}} where every key is a map too */
  expect_err(add_body(deep, sizeof deep, "200000 nested fixmaps"), 0, "bad_request", "nesting");
  memset(deep, 0x91, sizeof deep);
  expect_err(add_body(deep, sizeof deep, "200000 nested fixarrays"), 0, "bad_request", "nesting");

  /* Trailing bytes after the map; two maps in one frame. */
  static const uint8_t two[] = {0x81, 0xa2, 'i', 'd', 0x01, 0x80};
  expect_err(add_body(two, sizeof two, "two maps in one frame"), 0, "bad_request", "trailing");
}

/* ---- truncated bodies ------------------------------------------------- */

static void cases_truncated(void) {
  struct body b;
  b_req(&b, 80, "generate", 5);
  b_str(&b, "session");
  msgpack_pack_uint64(&b.pk, g_session);
  b_str(&b, "prompt");
  b_str(&b, "Once upon a time");
  b_str(&b, "max_tokens");
  msgpack_pack_uint32(&b.pk, 2);
  b_str(&b, "temperature");
  msgpack_pack_double(&b.pk, 0.5);
  b_str(&b, "stop");
  msgpack_pack_array(&b.pk, 1);
  b_str(&b, "zzz");
  size_t n = b.sb.size;
  uint8_t *full = malloc(n);
  memcpy(full, b.sb.data, n);
  b_free(&b);

  /* The whole request works (control case). */
  expect_ok(add_body(full, n, "generate request, whole"), 80);
  /* The declared length matches a prefix: the msgpack is cut at every
   * byte. */
  for (size_t k = 1; k < n; k++) {
    struct hcase *c = add_body(full, k, "generate cut to a frame of ");
    snprintf(c->name, sizeof c->name, "generate body cut to %zu of %zu bytes", k, n);
    expect_err(c, 0, "bad_request", "msgpack");
  }
  /* The declared length is the whole request, the bytes stop short, and
   * the client goes away: no reply, a clean close. */
  size_t cuts[] = {0, 1, n / 2, n - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    uint8_t *f = malloc(n + 4);
    sk_frame_header_put(f, (uint32_t)n);
    memcpy(f + 4, full, n);
    add_case(f, 4 + cuts[i], "declared %zu, sent %zu, then close", n, cuts[i])->want = WANT_CLOSE;
    free(f);
  }
  free(full);
}

/* ---- wrong types -------------------------------------------------------- */

enum ftype { F_UINT, F_NUM, F_BOOL, F_STR, F_TOKENS, F_STOPS };

struct field {
  const char *op;
  const char *name;
  enum ftype type;
};

/* Every field of every op (sinkd-protocol(7)). */
static const struct field k_fields[] = {
    {"open", "policy", F_STR},        {"open", "n_sink", F_UINT},
    {"open", "window", F_UINT},       {"open", "capacity", F_UINT},
    {"close", "session", F_UINT},     {"stats", "session", F_UINT},
    {"cancel", "session", F_UINT},    {"append", "session", F_UINT},
    {"append", "text", F_STR},        {"append", "tokens", F_TOKENS},
    {"append", "bos", F_BOOL},        {"generate", "session", F_UINT},
    {"generate", "prompt", F_STR},    {"generate", "tokens", F_TOKENS},
    {"generate", "bos", F_BOOL},      {"generate", "max_tokens", F_UINT},
    {"generate", "temperature", F_NUM}, {"generate", "top_k", F_UINT},
    {"generate", "top_p", F_NUM},     {"generate", "seed", F_UINT},
    {"generate", "ignore_eos", F_BOOL}, {"generate", "n_top", F_UINT},
    {"generate", "stop", F_STOPS},    {"tokenize", "text", F_STR},
    {"tokenize", "bos", F_BOOL},      {"detokenize", "tokens", F_TOKENS},
    {"append", "parse_special", F_BOOL}, {"generate", "parse_special", F_BOOL},
    {"tokenize", "parse_special", F_BOOL},
    {"stats", "tokens", F_BOOL},      {"resume", "session", F_UINT},
    {"fork", "session", F_UINT},      {"export", "session", F_UINT},
    {"import", "total", F_UINT},      {"import", "offset", F_UINT},
    {"import", "data", F_STR},        {"open", "heavy", F_UINT},
    {"open", "recent", F_UINT},       {"open", "rope_scale", F_NUM},
    {"open", "pin", F_STR},           {"open", "pin_tokens", F_TOKENS},
    {"append", "logprobs", F_BOOL},   {"generate", "logprobs", F_BOOL},
    {"generate", "top_logprobs", F_UINT},
    {"open", "speculation", F_STR},   {"open", "draft_tokens", F_UINT},
    {"open", "draft_fixed", F_BOOL},  {"generate", "speculation", F_STR},
    {"generate", "draft_tokens", F_UINT}, {"generate", "draft_fixed", F_BOOL},
};

/* Values of every msgpack type. */
enum vkind { V_NIL, V_TRUE, V_NEG, V_FLOAT, V_STR, V_BIN, V_ARRAY, V_MAP, V_EXT, V__N };
static const char *const k_vnames[V__N] = {"nil", "true", "-1", "1.5", "\"x\"", "bin",
                                           "[\"x\"]", "{}", "ext"};

static void pack_value(struct body *b, enum vkind v) {
  switch (v) {
  case V_NIL: msgpack_pack_nil(&b->pk); break;
  case V_TRUE: msgpack_pack_true(&b->pk); break;
  case V_NEG: msgpack_pack_int64(&b->pk, -1); break;
  case V_FLOAT: msgpack_pack_double(&b->pk, 1.5); break;
  case V_STR: b_str(b, "x"); break;
  case V_BIN: msgpack_pack_bin(&b->pk, 1); msgpack_pack_bin_body(&b->pk, "x", 1); break;
  case V_ARRAY: msgpack_pack_array(&b->pk, 1); b_str(b, "x"); break;
  case V_MAP: msgpack_pack_map(&b->pk, 0); break;
  case V_EXT: msgpack_pack_ext(&b->pk, 1, 1); msgpack_pack_ext_body(&b->pk, "x", 1); break;
  default: break;
  }
}

static bool accepted(enum ftype t, enum vkind v) {
  switch (t) {
  case F_UINT: return false; /* -1 and 1.5 are refused too */
  case F_NUM: return v == V_NEG || v == V_FLOAT;
  case F_BOOL: return v == V_TRUE;
  case F_STR: return v == V_STR || v == V_BIN;
  case F_TOKENS: return false; /* ["x"]: an element of the wrong type */
  case F_STOPS: return false;  /* ["x"] is fine, but see below */
  }
  return false;
}

static bool needs_session(const char *op) {
  return !strcmp(op, "close") || !strcmp(op, "stats") || !strcmp(op, "cancel") ||
         !strcmp(op, "append") || !strcmp(op, "generate") || !strcmp(op, "resume") ||
         !strcmp(op, "fork") || !strcmp(op, "export");
}

static void cases_wrong_types(void) {
  uint64_t id = 1000;
  for (size_t f = 0; f < sizeof k_fields / sizeof k_fields[0]; f++) {
    const struct field *fd = &k_fields[f];
    for (int v = 0; v < V__N; v++) {
      /* ["x"] is a valid stop list: covered by the element cases. */
      if (accepted(fd->type, (enum vkind)v) || (fd->type == F_STOPS && v == V_ARRAY)) continue;
      bool is_session = !strcmp(fd->name, "session");
      bool sess = needs_session(fd->op) && !is_session;
      /* append needs some input; tokenize its text; unless that is the
       * field under test (a wrong-typed "tokens" is checked before the
       * "text or tokens" rule). */
      bool text = (!strcmp(fd->op, "append") || !strcmp(fd->op, "tokenize")) &&
                  strcmp(fd->name, "text") && strcmp(fd->name, "tokens");
      /* generate with a bad field must not run: max_tokens 1 anyway. */
      bool gen = !strcmp(fd->op, "generate") && strcmp(fd->name, "max_tokens");
      /* import: the other two of total, offset, data, well typed. */
      bool imp = !strcmp(fd->op, "import");
      struct body b;
      b_req(&b, ++id, fd->op, 1 + sess + text + gen + 2 * imp);
      if (imp) {
        if (strcmp(fd->name, "total")) {
          b_str(&b, "total");
          msgpack_pack_uint32(&b.pk, 10);
        }
        if (strcmp(fd->name, "offset")) {
          b_str(&b, "offset");
          msgpack_pack_uint32(&b.pk, 0);
        }
        if (strcmp(fd->name, "data")) {
          b_str(&b, "data");
          msgpack_pack_bin(&b.pk, 1);
          msgpack_pack_bin_body(&b.pk, "x", 1);
        }
      }
      if (sess) {
        b_str(&b, "session");
        msgpack_pack_uint64(&b.pk, g_session);
      }
      if (text) {
        b_str(&b, "text");
        b_str(&b, "hello");
      }
      if (gen) {
        b_str(&b, "max_tokens");
        msgpack_pack_uint32(&b.pk, 1);
      }
      b_str(&b, fd->name);
      pack_value(&b, (enum vkind)v);
      char needle[64];
      snprintf(needle, sizeof needle, "field '%s'", fd->name);
      expect_err(add_b(&b, "%s.%s = %s", fd->op, fd->name, k_vnames[v]), id, "bad_request", needle);
    }
  }
  /* The envelope: id and op. */
  for (int v = 0; v < V__N; v++) {
    struct body b;
    b_init(&b);
    msgpack_pack_map(&b.pk, 2);
    b_str(&b, "id");
    pack_value(&b, (enum vkind)v);
    b_str(&b, "op");
    b_str(&b, "ping");
    expect_err(add_b(&b, "id = %s", k_vnames[v]), 0, "bad_request", "field 'id'");
    if (v == V_STR || v == V_BIN) continue;
    b_init(&b);
    msgpack_pack_map(&b.pk, 2);
    b_str(&b, "id");
    msgpack_pack_uint64(&b.pk, ++id);
    b_str(&b, "op");
    pack_value(&b, (enum vkind)v);
    expect_err(add_b(&b, "op = %s", k_vnames[v]), id, "bad_request", "field 'op'");
  }
  /* Keys that are not strings are ignored, not trusted. */
  struct body b;
  b_init(&b);
  msgpack_pack_map(&b.pk, 3);
  msgpack_pack_uint32(&b.pk, 7);
  b_str(&b, "id");
  b_str(&b, "id");
  msgpack_pack_uint32(&b.pk, 90);
  b_str(&b, "op");
  b_str(&b, "ping");
  expect_ok(add_b(&b, "integer key beside the real ones"), 90);
  /* Elements of the wrong type in token lists and stop lists. */
  const char *ops[] = {"append", "generate", "detokenize"};
  for (size_t o = 0; o < 3; o++) {
    for (int v = 0; v < V__N; v++) {
      if (v == V_NEG && !strcmp(ops[o], "detokenize")) continue; /* an id check, below */
      b_req(&b, ++id, ops[o], o < 2 ? 3 : 1);
      if (o < 2) {
        b_str(&b, "session");
        msgpack_pack_uint64(&b.pk, g_session);
        b_str(&b, "max_tokens");
        msgpack_pack_uint32(&b.pk, 1);
      }
      b_str(&b, "tokens");
      msgpack_pack_array(&b.pk, 2);
      msgpack_pack_uint32(&b.pk, 5);
      pack_value(&b, (enum vkind)v);
      expect_err(add_b(&b, "%s.tokens[1] = %s", ops[o], k_vnames[v]), id, "bad_request",
                 v == V_NEG ? "element 1 is negative" : "element 1");
    }
  }
  for (int v = 0; v < V__N; v++) {
    if (v == V_STR) continue;
    b_req(&b, ++id, "generate", 3);
    b_str(&b, "session");
    msgpack_pack_uint64(&b.pk, g_session);
    b_str(&b, "max_tokens");
    msgpack_pack_uint32(&b.pk, 1);
    b_str(&b, "stop");
    msgpack_pack_array(&b.pk, 2);
    b_str(&b, "ok");
    pack_value(&b, (enum vkind)v);
    expect_err(add_b(&b, "generate.stop[1] = %s", k_vnames[v]), id, "bad_request", "element 1");
  }
  /* An integer, but beyond any token id: named as such, with the range. */
  b_req(&b, ++id, "detokenize", 1);
  b_str(&b, "tokens");
  msgpack_pack_array(&b.pk, 2);
  msgpack_pack_uint32(&b.pk, 5);
  msgpack_pack_uint64(&b.pk, UINT64_C(1) << 40);
  expect_err(add_b(&b, "detokenize.tokens[1] = 2^40"), id, "bad_request",
             "element 1 is not a token id of this model (0..511)");
}

/* ---- token ids, negative and enormous numbers ------------------------- */

/* One pair of a request. */
enum pkind { P_U, P_I, P_D, P_S };
struct pair {
  const char *key;
  enum pkind kind;
  uint64_t u;
  int64_t i;
  double d;
  const char *s;
};

static struct hcase *add_req(uint64_t id, const char *op, bool with_session, const struct pair *p,
                             size_t n, const char *name) {
  struct body b;
  b_req(&b, id, op, (uint32_t)n + with_session);
  if (with_session) {
    b_str(&b, "session");
    msgpack_pack_uint64(&b.pk, g_session);
  }
  for (size_t i = 0; i < n; i++) {
    b_str(&b, p[i].key);
    switch (p[i].kind) {
    case P_U: msgpack_pack_uint64(&b.pk, p[i].u); break;
    case P_I: msgpack_pack_int64(&b.pk, p[i].i); break;
    case P_D: msgpack_pack_double(&b.pk, p[i].d); break;
    case P_S: b_str(&b, p[i].s); break;
    }
  }
  return add_b(&b, "%s", name);
}

/* {"tokens": [ids...]} for op, with a session for append/generate. */
static struct hcase *add_tokens(uint64_t id, const char *op, const int64_t *ids, size_t n,
                                bool unsigned_big, uint64_t big) {
  struct body b;
  bool sess = strcmp(op, "detokenize") != 0;
  b_req(&b, id, op, 1 + 2 * sess);
  if (sess) {
    b_str(&b, "session");
    msgpack_pack_uint64(&b.pk, g_session);
    b_str(&b, "max_tokens");
    msgpack_pack_uint32(&b.pk, 1);
  }
  b_str(&b, "tokens");
  msgpack_pack_array(&b.pk, (uint32_t)n + unsigned_big);
  for (size_t i = 0; i < n; i++) msgpack_pack_int64(&b.pk, ids[i]);
  if (unsigned_big) msgpack_pack_uint64(&b.pk, big);
  char list[96] = "";
  for (size_t i = 0; i < n && strlen(list) < 60; i++)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%lld", i ? "," : "", (long long)ids[i]);
  if (unsigned_big)
    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%llu", n ? "," : "",
             (unsigned long long)big);
  return add_b(&b, "%s tokens [%s]", op, list);
}

/* Token ids in every op that takes them, from id + 1; returns the last id. */
static uint64_t cases_token_ids(uint64_t id) {
  /* Token ids. */
  const char *ops[] = {"append", "generate", "detokenize"};
  for (size_t o = 0; o < 3; o++) {
    bool detok = o == 2;
    int64_t ok_ids[] = {1, N_VOCAB - 1};
    {
      uint64_t rid = ++id;
      expect_ok(add_tokens(rid, ops[o], ok_ids, 2, false, 0), rid);
    }
    int64_t v512[] = {5, N_VOCAB};
    {
      uint64_t rid = ++id;
      expect_err(add_tokens(rid, ops[o], v512, 2, false, 0), rid, "bad_request", "512");
    }
    int64_t vbig[] = {INT32_MAX};
    {
      uint64_t rid = ++id;
      expect_err(add_tokens(rid, ops[o], vbig, 1, false, 0), rid, "bad_request",
                 detok ? "2147483647" : "2147483647");
    }
    int64_t vneg[] = {-1};
    {
      uint64_t rid = ++id;
      expect_err(add_tokens(rid, ops[o], vneg, 1, false, 0), rid, "bad_request",
                 detok ? "-1" : "negative");
    }
    int64_t vmin[] = {INT32_MIN};
    {
      uint64_t rid = ++id;
      expect_err(add_tokens(rid, ops[o], vmin, 1, false, 0), rid, "bad_request",
                 detok ? "-2147483648" : "negative");
    }
    int64_t vmin64[] = {INT64_MIN};
    {
      uint64_t rid = ++id;
      expect_err(add_tokens(rid, ops[o], vmin64, 1, false, 0), rid, "bad_request", "element 0");
    }
    {
      uint64_t rid = ++id;
      expect_err(add_tokens(rid, ops[o], NULL, 0, true, UINT64_C(1) << 31), rid, "bad_request",
                 "element 0");
    }
    {
      uint64_t rid = ++id;
      expect_err(add_tokens(rid, ops[o], NULL, 0, true, UINT64_MAX), rid, "bad_request", "element 0");
    }
  }
  int64_t none[1];
  {
    uint64_t rid = ++id;
    expect_ok(add_tokens(rid, "detokenize", none, 0, false, 0), rid);
  }
  return id;
}

/* The sizes open takes, from id + 1; returns the last id. */
static uint64_t cases_open_sizes(uint64_t id) {
  /* open: sizes. */
  struct {
    const char *key;
    struct pair p;
    const char *code, *needle;
  } open_cases[] = {
      {"n_sink", {"n_sink", P_U, 0, 0, 0, NULL}, "", NULL},
      {"n_sink", {"n_sink", P_U, UINT32_MAX, 0, 0, NULL}, "bad_request", "exceeds"},
      {"n_sink", {"n_sink", P_U, UINT64_C(1) << 32, 0, 0, NULL}, "bad_request", "out of range"},
      {"n_sink", {"n_sink", P_U, UINT64_MAX, 0, 0, NULL}, "bad_request", "out of range"},
      {"n_sink", {"n_sink", P_I, 0, -5, 0, NULL}, "bad_request", "field 'n_sink'"},
      {"window", {"window", P_U, 0, 0, 0, NULL}, "bad_request", "window 0"},
      {"window", {"window", P_U, UINT32_MAX, 0, 0, NULL}, "bad_request", "exceeds"},
      {"window", {"window", P_U, UINT64_MAX, 0, 0, NULL}, "bad_request", "out of range"},
      {"window", {"window", P_I, 0, INT64_MIN, 0, NULL}, "bad_request", "field 'window'"},
      {"policy", {"policy", P_S, 0, 0, 0, "nope"}, "bad_request", "nope"},
      {"policy", {"policy", P_S, 0, 0, 0, ""}, "bad_request", "policy"},
      /* echoed as valid text: invalid UTF-8 and controls become '?' */
      {"policy", {"policy", P_S, 0, 0, 0, "\xff\x1b[2J\xc3"}, "bad_request",
       "unknown policy \"??[2J?\""},
      {"speculation", {"speculation", P_S, 0, 0, 0, "\xe2\x82"}, "bad_request",
       "speculation \"??\" is not"},
  };
  for (size_t i = 0; i < sizeof open_cases / sizeof open_cases[0]; i++) {
    char name[96];
    snprintf(name, sizeof name, "open %s = %llu/%lld/%s", open_cases[i].key,
             (unsigned long long)open_cases[i].p.u, (long long)open_cases[i].p.i,
             open_cases[i].p.s ? open_cases[i].p.s : "-");
    struct hcase *c = add_req(++id, "open", false, &open_cases[i].p, 1, name);
    expect_err(c, id, open_cases[i].code, open_cases[i].needle);
  }
  struct pair dense[2] = {{"policy", P_S, 0, 0, 0, "dense"}, {"capacity", P_U, 0, 0, 0, NULL}};
  const uint64_t caps[] = {0, UINT32_MAX, UINT64_C(1) << 32, UINT64_MAX};
  const char *cap_needle[] = {"capacity 0", "exceeds", "out of range", "out of range"};
  for (size_t i = 0; i < 4; i++) {
    dense[1].u = caps[i];
    char name[64];
    snprintf(name, sizeof name, "open dense capacity %llu", (unsigned long long)caps[i]);
    {
      uint64_t rid = ++id;
      expect_err(add_req(rid, "open", false, dense, 2, name), rid, "bad_request", cap_needle[i]);
    }
  }
  dense[1].kind = P_I;
  dense[1].i = -1;
  {
    uint64_t rid = ++id;
    expect_err(add_req(rid, "open", false, dense, 2, "open dense capacity -1"), rid, "bad_request",
               "field 'capacity'");
  }
  return id;
}

/* generate's numbers and stop lists, from id + 1; returns the last id. */
static uint64_t cases_generate_numbers(uint64_t id) {
  /* generate: every numeric parameter at and past its edges. Each case
   * also gives max_tokens 1 (unless it is the field) so that accepted
   * values run for one token. */
  struct {
    struct pair p;
    const char *code, *needle;
  } gen_cases[] = {
      {{"max_tokens", P_U, 0, 0, 0, NULL}, "", NULL},
      {{"max_tokens", P_U, (1u << 20) + 1, 0, 0, NULL}, "bad_request", "max_tokens"},
      {{"max_tokens", P_U, UINT64_MAX, 0, 0, NULL}, "bad_request", "max_tokens"},
      {{"max_tokens", P_I, 0, -1, 0, NULL}, "bad_request", "max_tokens"},
      {{"temperature", P_D, 0, 0, -1e-9, NULL}, "bad_request", "temperature"},
      {{"temperature", P_I, 0, -1, 0, NULL}, "bad_request", "temperature"},
      {{"temperature", P_D, 0, 0, 1e308, NULL}, "bad_request", "temperature"},
      {{"temperature", P_D, 0, 0, 1e-300, NULL}, "", NULL},
      {{"temperature", P_U, UINT64_MAX, 0, 0, NULL}, "bad_request", "temperature"},
      {{"temperature", P_D, 0, 0, NAN, NULL}, "bad_request", "finite"},
      {{"temperature", P_D, 0, 0, INFINITY, NULL}, "bad_request", "finite"},
      {{"temperature", P_D, 0, 0, -INFINITY, NULL}, "bad_request", "finite"},
      {{"top_p", P_D, 0, 0, 0.0, NULL}, "bad_request", "top_p"},
      {{"top_p", P_D, 0, 0, -0.5, NULL}, "bad_request", "top_p"},
      {{"top_p", P_D, 0, 0, 1.0000001, NULL}, "bad_request", "top_p"},
      {{"top_p", P_D, 0, 0, 1e308, NULL}, "bad_request", "top_p"},
      {{"top_p", P_D, 0, 0, NAN, NULL}, "bad_request", "finite"},
      {{"top_p", P_D, 0, 0, 1e-30, NULL}, "", NULL},
      {{"top_k", P_U, 0, 0, 0, NULL}, "", NULL},
      {{"top_k", P_U, N_VOCAB, 0, 0, NULL}, "", NULL},
      {{"top_k", P_U, N_VOCAB + 1, 0, 0, NULL}, "", NULL}, /* every token, as 0 */
      {{"top_k", P_U, UINT32_MAX, 0, 0, NULL}, "", NULL},
      {{"top_k", P_U, (uint64_t)UINT32_MAX + 1, 0, 0, NULL}, "bad_request", "top_k"},
      {{"top_k", P_U, UINT64_MAX, 0, 0, NULL}, "bad_request", "top_k"},
      {{"top_k", P_I, 0, -1, 0, NULL}, "bad_request", "top_k"},
      {{"seed", P_U, UINT64_MAX, 0, 0, NULL}, "", NULL},
      {{"seed", P_U, 0, 0, 0, NULL}, "", NULL},
      {{"seed", P_I, 0, INT64_MIN, 0, NULL}, "bad_request", "seed"},
      {{"n_top", P_U, SK_CLIENT_MAX_TOP, 0, 0, NULL}, "", NULL},
      {{"n_top", P_U, SK_CLIENT_MAX_TOP + 1, 0, 0, NULL}, "bad_request", "n_top"},
      {{"n_top", P_U, UINT64_MAX, 0, 0, NULL}, "bad_request", "n_top"},
      {{"n_top", P_I, 0, -1, 0, NULL}, "bad_request", "n_top"},
      {{"draft_tokens", P_U, 1, 0, 0, NULL}, "", NULL},
      {{"draft_tokens", P_U, SK_SPEC_TOKENS_MAX, 0, 0, NULL}, "", NULL},
      {{"draft_tokens", P_U, 0, 0, 0, NULL}, "bad_request", "draft_tokens"},
      {{"draft_tokens", P_U, SK_SPEC_TOKENS_MAX + 1, 0, 0, NULL}, "bad_request", "draft_tokens"},
      {{"draft_tokens", P_U, UINT64_MAX, 0, 0, NULL}, "bad_request", "draft_tokens"},
      {{"draft_tokens", P_I, 0, -1, 0, NULL}, "bad_request", "draft_tokens"},
      {{"speculation", P_S, 0, 0, 0, "lookup"}, "", NULL},
      {{"speculation", P_S, 0, 0, 0, "off"}, "", NULL},
      {{"speculation", P_S, 0, 0, 0, "draft"}, "bad_request", "no draft model"},
      {{"speculation", P_S, 0, 0, 0, "default"}, "bad_request", "speculation"},
      {{"speculation", P_S, 0, 0, 0, ""}, "bad_request", "speculation"},
  };
  for (size_t i = 0; i < sizeof gen_cases / sizeof gen_cases[0]; i++) {
    struct pair p[2] = {gen_cases[i].p, {"max_tokens", P_U, 1, 0, 0, NULL}};
    bool is_max = !strcmp(p[0].key, "max_tokens");
    char name[96];
    snprintf(name, sizeof name, "generate %s = %s%llu/%lld/%g", p[0].key,
             p[0].kind == P_U ? "u" : p[0].kind == P_I ? "i" : "d", (unsigned long long)p[0].u,
             (long long)p[0].i, p[0].d);
    struct hcase *c = add_req(++id, "generate", true, p, is_max ? 1 : 2, name);
    expect_err(c, id, gen_cases[i].code, gen_cases[i].needle);
  }
  /* Stop lists at their limits. */
  for (int k = 0; k < 4; k++) {
    struct body b;
    b_req(&b, ++id, "generate", 3);
    b_str(&b, "session");
    msgpack_pack_uint64(&b.pk, g_session);
    b_str(&b, "max_tokens");
    msgpack_pack_uint32(&b.pk, 1);
    b_str(&b, "stop");
    char s[SK_LIMIT_STOP_LEN + 2];
    memset(s, 'z', sizeof s);
    if (k == 0 || k == 1) { /* 16 strings ok, 17 refused */
      uint32_t n = SK_LIMIT_STOP_COUNT + (uint32_t)k;
      msgpack_pack_array(&b.pk, n);
      for (uint32_t i = 0; i < n; i++) b_str(&b, "zz");
    } else { /* 256 bytes ok, 257 refused */
      msgpack_pack_array(&b.pk, 1);
      size_t len = SK_LIMIT_STOP_LEN + (size_t)(k - 2);
      msgpack_pack_str(&b.pk, len);
      msgpack_pack_str_body(&b.pk, s, len);
    }
    struct hcase *c = add_b(&b, "generate stop limit case %d", k);
    if (k == 0 || k == 2) expect_ok(c, id);
    else expect_err(c, id, "bad_request", "stop");
  }
  struct body b;
  b_req(&b, ++id, "generate", 3);
  b_str(&b, "session");
  msgpack_pack_uint64(&b.pk, g_session);
  b_str(&b, "max_tokens");
  msgpack_pack_uint32(&b.pk, 1);
  b_str(&b, "stop");
  msgpack_pack_array(&b.pk, 2);
  b_str(&b, "");
  msgpack_pack_str(&b.pk, 3);
  msgpack_pack_str_body(&b.pk, "a\0b", 3);
  expect_err(add_b(&b, "generate stop [\"\", \"a\\0b\"]"), id, "bad_request", "element 0");
  return id;
}

static void cases_numbers(void) {
  uint64_t id = 5000;
  id = cases_token_ids(id);

  id = cases_open_sizes(id);

  id = cases_generate_numbers(id);

  /* Session ids and request ids. */
  const char *sops[] = {"stats", "append", "generate", "cancel", "resume", "fork", "export",
                        "close"};
  for (size_t o = 0; o < sizeof sops / sizeof sops[0]; o++) {
    struct pair p[2] = {{"session", P_U, 0, 0, 0, NULL}, {"text", P_S, 0, 0, 0, "x"}};
    size_t n = !strcmp(sops[o], "append") ? 2 : 1;
    char name[64];
    snprintf(name, sizeof name, "%s session 0", sops[o]);
    {
      uint64_t rid = ++id;
      expect_err(add_req(rid, sops[o], false, p, n, name), rid, "no_such_session", "no session 0");
    }
    p[0].u = UINT64_MAX;
    snprintf(name, sizeof name, "%s session 2^64-1", sops[o]);
    {
      uint64_t rid = ++id;
      expect_err(add_req(rid, sops[o], false, p, n, name), rid, "no_such_session",
                 "18446744073709551615");
    }
    p[0].kind = P_I;
    p[0].i = -1;
    snprintf(name, sizeof name, "%s session -1", sops[o]);
    {
      uint64_t rid = ++id;
      expect_err(add_req(rid, sops[o], false, p, n, name), rid, "bad_request", "field 'session'");
    }
  }
  expect_ok(add_req(UINT64_MAX, "ping", false, NULL, 0, "ping id 2^64-1"), UINT64_MAX);
  expect_ok(add_req(0, "ping", false, NULL, 0, "ping id 0"), 0);
  /* Unknown ops, a long one shown cut and escaped. */
  char longop[1001];
  memset(longop, 'A', 1000);
  longop[0] = '\x01';
  longop[1000] = 0;
  {
    uint64_t rid = ++id;
    expect_err(add_req(rid, longop, false, NULL, 0, "op of 1000 bytes"), rid, "unknown_op",
               "'\\x01AAA");
  }
  {
    uint64_t rid = ++id;
    expect_err(add_req(rid, "PING", false, NULL, 0, "op PING"), rid, "unknown_op", "PING");
  }
}

/* ---- running it ------------------------------------------------------- */

/* The bystander: generates 64 tokens at a time on its own session until
 * told to stop; every round must succeed in full. */
struct bystander {
  atomic_int stop;
  atomic_int rounds;
  atomic_int failures;
  char last_error[320];
};

static void *bystander_run(void *arg) {
  struct bystander *bs = arg;
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  if (sk_client_connect(g_d.socket, &c, &e) < 0) {
    bs->failures++;
    snprintf(bs->last_error, sizeof bs->last_error, "connect: %s", e.message);
    return NULL;
  }
  sk_client_set_timeout(c, 60000, NULL);
  struct sk_open_params op = {.policy = "streaming", .n_sink = 4, .window = 60};
  struct sk_open_result o;
  if (sk_client_open(c, &op, &o, &e) < 0) {
    bs->failures++;
    snprintf(bs->last_error, sizeof bs->last_error, "open: %s", e.message);
    sk_client_free(c);
    return NULL;
  }
  while (!bs->stop) {
    struct sk_generate_params gp;
    sk_test_greedy_params(&gp, 64);
    gp.prompt = bs->rounds == 0 ? "Once upon a time" : NULL;
    struct sk_generate_result gr;
    if (sk_client_generate(c, o.session, &gp, NULL, NULL, &gr, &e) < 0 || gr.n_tokens != 64) {
      bs->failures++;
      snprintf(bs->last_error, sizeof bs->last_error, "generate: %s", e.message);
      break;
    }
    bs->rounds++;
  }
  sk_client_close_session(c, o.session, NULL);
  sk_client_free(c);
  return NULL;
}

static double ping_ms(int fd) {
  static const uint8_t ping[] = {0, 0, 0, 13, 0x82, 0xa2, 'i', 'd', 0x63, 0xa2, 'o', 'p', 0xa4,
                                 'p', 'i', 'n', 'g'};
  double t0 = sk_test_now();
  sk_test_write_all(fd, ping, sizeof ping);
  struct sk_test_reply r;
  sk_test_read_reply(fd, &r);
  double dt = (sk_test_now() - t0) * 1e3;
  if (r.closed || r.timed_out || !r.ok || r.id != 0x63) fail_msg("bystander ping failed");
  sk_test_reply_free(&r);
  return dt;
}

static void run_case(const struct hcase *c, int pinger, double *worst_ping) {
  int fd = sk_test_raw_connect(g_d.socket, 30000);
  bool wrote = sk_test_try_write_all(fd, c->bytes, c->len);
  if (c->want == WANT_CLOSE) {
    /* Nothing complete was sent: the daemon must answer nothing and
     * close once we stop writing. */
    shutdown(fd, SHUT_WR);
    uint8_t *body = NULL;
    uint32_t len = 0;
    int r = sk_test_read_frame(fd, &body, &len);
    if (r != 0) fail_msg("case '%s': expected a clean close, got %s", c->name,
                         r > 0 ? "a frame" : "a timeout");
  } else {
    if (!wrote) fail_msg("case '%s': write failed: %s", c->name, strerror(errno));
    struct sk_test_reply r;
    sk_test_read_final(fd, &r, NULL);
    if (r.closed || r.timed_out)
      fail_msg("case '%s': no reply (%s)", c->name, r.closed ? "closed" : "timed out");
    if (r.id != c->id || strcmp(r.code, c->code) != 0 ||
        (c->needle[0] && !strstr(r.message, c->needle)))
      fail_msg("case '%s': got id %llu code '%s' message '%s'; want id %llu code '%s' with '%s'",
               c->name, (unsigned long long)r.id, r.code, r.message, (unsigned long long)c->id,
               c->code, c->needle);
    sk_test_reply_free(&r);
    if (c->junk_after) {
      uint8_t *junk = malloc(c->junk_after);
      memset(junk, 0xdd, c->junk_after);
      sk_test_write_all(fd, junk, c->junk_after);
      free(junk);
    }
    if (c->usable_after) {
      double dt = ping_ms(fd);
      (void)dt;
    }
  }
  close(fd);
  double dt = ping_ms(pinger);
  if (dt > *worst_ping) *worst_ping = dt;
}

static void free_cases(void) {
  for (size_t i = 0; i < g_n_cases; i++) free(g_cases[i].bytes);
  free(g_cases);
  g_cases = NULL;
  g_n_cases = g_cap_cases = 0;
}

static void test_hostile_table(void **state) {
  (void)state;
  /* A session the cases may name (owned by this uid). */
  struct sk_client *c = NULL;
  struct sk_error e = {0};
  assert_int_equal(sk_client_connect(g_d.socket, &c, &e), 0);
  struct sk_open_params op = {.policy = "streaming", .n_sink = 4, .window = 124};
  struct sk_open_result o;
  assert_int_equal(sk_client_open(c, &op, &o, &e), 0);
  g_session = o.session;

  cases_length_prefix();
  cases_declared_sizes();
  cases_truncated();
  cases_wrong_types();
  cases_numbers();

  long rss0 = sk_test_proc_rss_kib(g_d.pid);
  long fds0 = sk_test_proc_fds(g_d.pid);
  struct bystander bs = {0};
  pthread_t th;
  pthread_create(&th, NULL, bystander_run, &bs);
  int pinger = sk_test_raw_connect(g_d.socket, 30000);
  double worst = 0;
  long worst_grew = 0, costly_grew = 0;
  const char *worst_case = "-";
  double t0 = sk_test_now();
  for (size_t i = 0; i < g_n_cases; i++) {
    /* Peak memory of each case over the resident set before it. */
    bool reset = sk_test_proc_reset_hwm(g_d.pid);
    long before = sk_test_proc_rss_kib(g_d.pid);
    run_case(&g_cases[i], pinger, &worst);
    long grew = sk_test_proc_hwm_kib(g_d.pid) - before;
    if (!reset) continue;
    if (g_cases[i].costly) {
      if (grew > costly_grew) costly_grew = grew;
    } else if (grew > worst_grew) {
      worst_grew = grew;
      worst_case = g_cases[i].name;
    }
    if (!sk_test_daemon_alive(&g_d)) {
      sk_test_daemon_dump_log(&g_d);
      fail_msg("sinkd died at case '%s'", g_cases[i].name);
    }
  }
  double took = sk_test_now() - t0;
  /* Let the bystander finish at least a few rounds alongside. */
  while (bs.rounds < 3 && !bs.failures && sk_test_now() - t0 < 60) usleep(10000);
  bs.stop = 1;
  pthread_join(th, NULL);
  close(pinger);
  long rss1 = sk_test_proc_rss_kib(g_d.pid);
  /* Closed connections leave no descriptors behind (give the loop a
   * moment to run its close callbacks). */
  long fds1 = sk_test_proc_fds(g_d.pid);
  for (int i = 0; i < 100 && fds1 != fds0; i++) {
    usleep(10000);
    fds1 = sk_test_proc_fds(g_d.pid);
  }
  size_t n_close = 0;
  for (size_t i = 0; i < g_n_cases; i++) n_close += g_cases[i].want == WANT_CLOSE;
  print_message("figures: hostile frames: %zu cases (%zu error/ok replies, %zu clean closes) in %.2f s\n",
                g_n_cases, g_n_cases - n_close, n_close, took);
  print_message("figures: hostile frames: bystander generated %d x 64 tokens, %d failures; "
                "worst ping between cases %.2f ms\n", atomic_load(&bs.rounds),
                atomic_load(&bs.failures), worst);
  print_message("figures: hostile frames: daemon RSS %ld KiB before, %ld KiB after; fds %ld "
                "before, %ld after\n", rss0, rss1, fds0, fds1);
  print_message("figures: hostile frames: largest peak over RSS for one hostile case %ld KiB (%s); "
                "for the 1 MiB tokenize %ld KiB\n", worst_grew, worst_case, costly_grew);
  if (bs.failures) fail_msg("bystander: %s", bs.last_error);
  assert_true(bs.rounds >= 3);
  assert_int_equal(fds1, fds0);
  if (!sk_test_under_tool()) {
    /* Nothing sized by a declared length: no hostile case costs more
     * than a few MiB (a 2^32-element declaration taken at its word would
     * cost gigabytes). The honest 1 MiB tokenize is bounded by the
     * tokenizer's working set (~100 bytes per byte of text). */
    assert_true(worst_grew < 8 * 1024);
    assert_true(costly_grew < 256 * 1024);
    assert_true(worst < 100.0);
  }
  assert_int_equal(sk_client_close_session(c, o.session, &e), 0);
  sk_client_free(c);
  free_cases();
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hostile_table),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
