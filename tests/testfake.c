/* The fake sinkd of testfake.h: canned replies to every op libsinkd and
 * sinkctl send, and the failure modes a client must survive. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/msg.h"
#include "testmsg.h"
#include "proto/wire.h"
#include "sinkd/protocol.h"
#include "testutil.h"
#include "testfake.h"

static void fake_write(int fd, struct sk_msgbuf *b) {
  int64_t n = sk_msgbuf_finish(b);
  const char *p = b->sbuf.data;
  while (n > 0) {
    ssize_t w = send(fd, p, (size_t)n, MSG_NOSIGNAL);
    if (w <= 0) break;
    p += w;
    n -= w;
  }
  sk_msgbuf_free(b);
}

static void fake_error(int fd, uint64_t id, int code, const char *message) {
  struct sk_error e;
  sk_error_set(&e, code, "%s", message);
  struct sk_msgbuf b;
  sk_msgbuf_init(&b);
  sk_wire_pack_error(&b, id, &e);
  fake_write(fd, &b);
}

/* Reads the next request; returns false when the client has gone. The
 * body is recorded and parsed into *msg (caller frees). */
static bool fake_read(struct fake *f, int fd, struct sk_msg *msg) {
  for (;;) {
    const uint8_t *body;
    size_t len;
    if (sk_frame_reader_next(&f->rd, &body, &len) == 1) {
      if (f->n_req < FAKE_MAX_REQ) {
        f->req[f->n_req] = malloc(len);
        memcpy(f->req[f->n_req], body, len);
        f->req_len[f->n_req++] = len;
      }
      return sk_msg_parse(body, len, msg, NULL) == 0;
    }
    uint8_t buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    sk_frame_reader_feed(&f->rd, buf, (size_t)n);
  }
}

/* The evicted ranges of the fake's append and generate replies. */
static const struct sk_range fake_ranges[2] = {{4, 5}, {9, 9}};

static void fake_token(int fd, uint64_t id, int32_t token, const char *text,
                       bool with_top) {
  /* a float32 logit and one sent as a whole number of float32 */
  const struct sk_top_pair top[2] = {{token, 1.5}, {3, -2.25}};
  struct sk_token_event ev = {.token = token, .text = text, .text_len = strlen(text),
                              .top = top, .n_top = with_top ? 2 : 0};
  struct sk_msgbuf b;
  if (sk_wire_pack_token_event(&b, id, &ev) == 0) fake_write(fd, &b);
}

static void fake_generate_final(int fd, uint64_t id, const char *stop,
                                uint64_t n) {
  struct sk_generate_result g = {.stop_token = -1, .n_tokens = n, .prompt_tokens = 4,
                                 .completion_tokens = n, .evicted = 3, .resident = 20,
                                 .seen = 23, .n_ranges = 2};
  snprintf(g.stop, sizeof g.stop, "%s", stop);
  memcpy(g.ranges, fake_ranges, sizeof fake_ranges);
  struct sk_msgbuf b;
  if (sk_wire_pack_generate(&b, id, &g, NULL, 0, NULL, 0) == 0) fake_write(fd, &b);
}

static void fake_generate(struct fake *f, int fd, uint64_t id,
                          const msgpack_object *req) {
  uint64_t max_tokens = 0, n_top = 0;
  sk_msg_get_u64(req, "max_tokens", UINT64_MAX, &max_tokens, NULL);
  sk_msg_get_u64(req, "n_top", UINT64_MAX, &n_top, NULL);
  if (max_tokens == 4) { /* a model's text that holds terminal controls */
    fake_token(fd, id, 20, "\x1b]0;owned\x07", false); /* retitle the window */
    fake_token(fd, id, 21, "\x1b[2J", false);           /* clear the screen */
    fake_token(fd, id, 22, "ok\r\n\xc3\xbc", false);
    fake_token(fd, id, 23, "\xc2\x9b" "31m", false);      /* C1 CSI, in UTF-8 */
    fake_generate_final(fd, id, "length", 4);
    return;
  }
  if (max_tokens == 3) { /* three events, then the final reply */
    fake_token(fd, id, 10, "a", n_top > 0);
    fake_token(fd, id, 11, "", n_top > 0);
    fake_token(fd, id, 12, "\xc3\xbc", n_top > 0);
    /* as if the last token ended in one of the stop strings */
    fake_generate_final(fd, id, sk_msg_get(req, "stop") ? "stop" : "length", 3);
    return;
  }
  /* Otherwise stream until a cancel arrives. */
  fake_token(fd, id, 10, "a", false);
  fake_token(fd, id, 11, "b", false);
  struct sk_msg msg;
  if (!fake_read(f, fd, &msg)) return;
  uint64_t cancel_id = 0;
  sk_msg_get_u64(&msg.root, "id", UINT64_MAX, &cancel_id, NULL);
  sk_msg_free(&msg);
  /* One more event already on its way when the cancel arrived. */
  fake_token(fd, id, 12, "c", false);
  struct sk_msgbuf b;
  if (f->final_before_cancel_reply) fake_generate_final(fd, id, "cancelled", 3);
  if (sk_wire_pack_cancel(&b, cancel_id, true) == 0) fake_write(fd, &b);
  if (!f->final_before_cancel_reply) fake_generate_final(fd, id, "cancelled", 3);
}

/* The reply to list: two rows, the first as this daemon packs it, the
 * second as an older daemon did. */
static void fake_list(int fd, uint64_t id) {
  struct sk_msgbuf b;
  /* the first row as this daemon's (wire), the second as an older
   * daemon's, with only the fields it had */
  struct sk_session_info row = {.session = 7, .policy = "streaming", .capacity = 260,
                                .resident = 100, .seen = 5000000000u, .adopted = true,
                                .kv_type = "f32", .owner_uid = 1000, .kv_bytes = 4u << 20,
                                .object_bytes = 5u << 20,
                                .age_s = 90061 /* 1d 1h 1m 1s */,
                                .idle_s = 3700 /* 1h 1m 40s */, .temporary = true};
  struct frame_rows {
    struct sk_msgbuf b;
    struct sk_msg msg;
  } one;
  /* (no cmocka assertions on this thread: a failure shows as a missing
   * reply) */
  if (sk_wire_pack_list(&one.b, id, &row, 1) < 0) return;
  int64_t size = sk_msgbuf_finish(&one.b);
  if (size < 0 || sk_msg_parse((const uint8_t *)one.b.sbuf.data + SK_FRAME_HEADER_SIZE,
                               (size_t)size - SK_FRAME_HEADER_SIZE, &one.msg, NULL) < 0) {
    sk_msgbuf_free(&one.b);
    return;
  }
  const msgpack_object *first = &sk_msg_get(&one.msg.root, "sessions")->via.array.ptr[0];
  sk_msgbuf_init(&b);
  struct sk_wire_map m, old;
  sk_wire_map_begin(&m, &b.pk);
  sk_wire_map_u64(&m, "id", id);
  sk_wire_map_bool(&m, "ok", true);
  msgpack_packer *pk = sk_wire_map_key(&m, "sessions");
  msgpack_pack_array(pk, 2);
  msgpack_pack_object(pk, *first);
  sk_wire_map_begin(&old, pk);
  sk_wire_map_u64(&old, "session", 8);
  sk_wire_map_str(&old, "policy", "dense");
  sk_wire_map_u64(&old, "capacity", 260);
  sk_wire_map_u64(&old, "resident", 101);
  sk_wire_map_u64(&old, "seen", 5000000000u);
  sk_wire_map_bool(&old, "adopted", false);
  sk_wire_map_end(&old);
  sk_wire_map_end(&m);
  sk_msg_free(&one.msg);
  sk_msgbuf_free(&one.b);
  fake_write(fd, &b);
}

static void fake_answer(struct fake *f, int fd, const msgpack_object *req) {
  uint64_t id = 0, session = 0;
  const char *op = "";
  size_t op_len = 0;
  sk_msg_get_u64(req, "id", UINT64_MAX, &id, NULL);
  sk_msg_get_str(req, "op", &op, &op_len, NULL);
  int has_session = sk_msg_get_u64(req, "session", UINT64_MAX, &session, NULL);
  struct sk_msgbuf b;
#define OP(name) (op_len == strlen(name) && memcmp(op, name, op_len) == 0)
  if (session == 99) {
    fake_error(fd, id, SK_ERR_NO_SUCH_SESSION, "no session 99");
  } else if (OP("ping")) {
    if (sk_wire_pack_ok(&b, id) == 0) fake_write(fd, &b);
  } else if (OP("hello")) {
    struct sk_hello h = {
        .protocol = 1,
        .server = "sinkd",
        .version = "0.1.0",
        .compute = {.kernel = "avx2", .threads = 2, .max_batch = 64},
        .model = {.weight_type = "q8_0", .weight_bytes = 5000000000u, .name = "stories260K",
                  .n_vocab = 512, .n_ctx_train = 512, .n_layer = 5, .dim = 64, .n_head = 8,
                  .n_kv_head = 4},
        .defaults = {.policy = "streaming", .n_sink = 4, .window = 252, .capacity = 256},
        .speculation = {.mode = "draft", .draft_tokens = 8, .draft_model = "pycode-5M",
                        .lookup_history = 16384, .drafted = 40, .accepted = 30, .rejected = 10,
                        .acceptance = 0.75},
    };
    const struct sk_wire_hello_extra x = {.model_file = "/models/stories260K.gguf"};
    if (sk_wire_pack_hello(&b, id, &h, &x) == 0) fake_write(fd, &b);
  } else if (OP("open")) {
    struct sk_open_result o = {.session = 7, .policy = "streaming", .capacity = 260,
                               .kv_bytes = 1234, .object_bytes = 4096, .rope_scale = 1.0};
    if (sk_wire_pack_open(&b, id, &o) == 0) fake_write(fd, &b);
  } else if (OP("close")) {
    if (sk_wire_pack_ok(&b, id) == 0) fake_write(fd, &b);
  } else if (OP("list")) {
    fake_list(fd, id);
  } else if (OP("stats") && has_session == 1) {
    static struct sk_session_stats st; /* ~3 KiB: off the fake's stack */
    memset(&st, 0, sizeof st);
    st.session = session;
    snprintf(st.policy, sizeof st.policy, "streaming");
    st.n_sink = 4;
    st.window = 256;
    st.capacity = 260;
    st.resident = 260;
    st.seen = 1000;
    st.evicted = 740;
    st.kv_bytes = 1234;
    st.object_bytes = 4096;
    st.rope_scale = st.model_rope_scale = 1.0;
    st.has_positions = session != 8;
    st.position_last = 259;
    if (sk_wire_pack_session_stats(&b, id, &st, NULL) < 0) return;
    fake_write(fd, &b);
  } else if (OP("stats")) {
    struct sk_daemon_stats st = {.sessions = 2, .clients = 1, .uptime_s = 60,
                                 .tokens_prefilled = 123, .tokens_generated = 456,
                                 .memory_bytes = 8192, .adopted = 1, .has_user = true,
                                 .user_sessions = 1, .user_memory_bytes = 4096,
                                 .max_user_sessions = 16, .max_user_memory = 0,
                                 .weights_mapped_bytes = 3u << 20,
                                 .weights_repacked_bytes = 512u << 10};
    struct sk_wire_daemon_extra x = {.chat_template = "none", .state_dir = "/run/sinkd"};
    if (sk_wire_pack_daemon_stats(&b, id, &st, &x) < 0) return;
    fake_write(fd, &b);
  } else if (OP("append")) {
    struct sk_append_result a = {.n_tokens = 5, .resident = 20, .seen = 25, .evicted = 3,
                                 .n_ranges = 2};
    memcpy(a.ranges, fake_ranges, sizeof fake_ranges);
    if (sk_wire_pack_append(&b, id, &a, NULL) == 0) fake_write(fd, &b);
  } else if (OP("tokenize")) {
    const int32_t ids[3] = {1, 365, 2147483647};
    if (sk_wire_pack_tokens(&b, id, ids, 3) == 0) fake_write(fd, &b);
  } else if (OP("detokenize")) {
    if (sk_wire_pack_text(&b, id, "he\0llo", 6) == 0) fake_write(fd, &b);
  } else if (OP("generate")) {
    fake_generate(f, fd, id, req);
  } else if (OP("cancel")) {
    if (sk_wire_pack_cancel(&b, id, false) == 0) fake_write(fd, &b);
  } else if (OP("resume") || OP("fork")) {
    struct sk_session_summary v = {.session = OP("fork") ? 8 : session, .policy = "streaming",
                                   .capacity = 260, .kv_bytes = 57344, .object_bytes = 73728,
                                   .resident = 260,
                                   .seen = 1000, .evicted = 740, .commit = 77, .adopted = true,
                                   .from = OP("fork") ? session : 0};
    if (sk_wire_pack_summary(&b, id, &v, 0) == 0) fake_write(fd, &b);
  } else if (OP("export")) {
    /* session 7: 3 chunks "abc" "de" "" then the reply; 8: a chunk out of
     * order; 9: a size that disagrees with the data */
    const char *parts[3] = {"abc", "de", ""};
    uint64_t off = 0;
    for (int i = 0; i < 3; i++) {
      if (sk_wire_pack_data_event(&b, id, session == 8 && i == 1 ? off + 1 : off, parts[i],
                                  strlen(parts[i])) == 0)
        fake_write(fd, &b);
      off += strlen(parts[i]);
    }
    if (sk_wire_pack_export(&b, id, session, session == 9 ? 6 : 5, 0, 0) == 0) fake_write(fd, &b);
  } else if (OP("import")) {
    uint64_t total = 0, offset = 0;
    const char *data = NULL;
    size_t len = 0;
    sk_msg_get_u64(req, "total", UINT64_MAX, &total, NULL);
    sk_msg_get_u64(req, "offset", UINT64_MAX, &offset, NULL);
    sk_msg_get_str(req, "data", &data, &len, NULL);
    if (len > 100000) { /* as a daemon with a small frame limit does */
      fake_error(fd, 0, SK_ERR_TOO_LARGE, "frame too large");
    } else if (offset + len < total) {
      if (sk_wire_pack_received(&b, id, offset + len) == 0) fake_write(fd, &b);
    } else {
      struct sk_session_summary v = {.session = 12, .policy = "dense", .capacity = 64,
                                     .kv_bytes = 8192, .resident = 5, .seen = 5, .commit = 3};
      if (sk_wire_pack_summary(&b, id, &v, total) == 0) fake_write(fd, &b);
    }
  } else {
    fake_error(fd, id, SK_ERR_UNKNOWN_OP, "unknown op");
  }
#undef OP
}

static void fake_serve(struct fake *f, int fd) {
  struct sk_msg msg;
  while (fake_read(f, fd, &msg)) {
    uint64_t id = 0;
    sk_msg_get_u64(&msg.root, "id", UINT64_MAX, &id, NULL);
    if (f->mode == FAKE_HANGUP) {
      sk_msg_free(&msg);
      break;
    } else if (f->mode == FAKE_WRONG_ID) {
      struct sk_msgbuf b;
      if (sk_wire_pack_ok(&b, id + 5) == 0) fake_write(fd, &b);
    } else if (f->mode == FAKE_ID0) {
      fake_error(fd, 0, SK_ERR_TOO_LARGE, "frame of 2000000 bytes (limit 1048576)");
      f->mode = FAKE_NORMAL;
    } else if (f->mode == FAKE_HUGE_FRAME) {
      send(fd, "\xff\xff\xff\xff\x80", 5, MSG_NOSIGNAL);
    } else if (f->mode == FAKE_SILENT) {
      /* nothing */
    } else if (f->mode == FAKE_NOT_MAP) {
      send(fd, "\x00\x00\x00\x02\x91\x01", 6, MSG_NOSIGNAL);
    } else {
      fake_answer(f, fd, &msg.root);
    }
    sk_msg_free(&msg);
  }
  close(fd);
}

/* Serves connections one after the other until fake_join shuts the
 * listening socket down. */
static void *fake_main(void *arg) {
  struct fake *f = arg;
  for (;;) {
    int fd = accept(f->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    sk_frame_reader_free(&f->rd);
    sk_frame_reader_init(&f->rd, SK_FRAME_MAX_DEFAULT);
    fake_serve(f, fd);
  }
}

struct fake *fake_start(enum fake_mode mode) {
  struct fake *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->mode = mode;
  f->dir = sk_test_tmpdir();
  size_t n = strlen(f->dir) + 16;
  f->path = malloc(n);
  snprintf(f->path, n, "%s/s.sock", f->dir);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  assert_true(strlen(f->path) < sizeof addr.sun_path);
  strcpy(addr.sun_path, f->path);
  f->listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(f->listen_fd >= 0);
  assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(f->listen_fd, 4), 0);
  sk_frame_reader_init(&f->rd, SK_FRAME_MAX_DEFAULT);
  assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
  return f;
}

/* Joins the thread (the client must have been freed first, so the fake
 * sees the connection end). The requests stay readable until fake_free. */
void fake_join(struct fake *f) {
  shutdown(f->listen_fd, SHUT_RDWR); /* wakes accept() */
  pthread_join(f->thread, NULL);
}

void fake_free(struct fake *f) {
  close(f->listen_fd);
  unlink(f->path);
  rmdir(f->dir);
  for (size_t i = 0; i < f->n_req; i++) free(f->req[i]);
  sk_frame_reader_free(&f->rd);
  free(f->path);
  free(f->dir);
  free(f);
}

/* Request i as received by the fake, parsed (caller frees). */
void fake_request(struct fake *f, size_t i, struct sk_msg *m) {
  assert_true(i < f->n_req);
  struct sk_error e = {0};
  if (sk_msg_parse(f->req[i], f->req_len[i], m, &e) != 0)
    fail_msg("request %zu: %s", i, e.message);
}

void assert_op(const struct sk_msg *m, const char *op, uint64_t id) {
  const char *s;
  size_t len;
  uint64_t got;
  assert_int_equal(sk_msg_need_str(&m->root, "op", &s, &len, NULL), 0);
  assert_int_equal(len, strlen(op));
  assert_memory_equal(s, op, len);
  assert_int_equal(sk_msg_need_u64(&m->root, "id", UINT64_MAX, &got, NULL), 0);
  assert_int_equal(got, id);
}

