/* GGUF reader: the real test model, then crafted files (good and hostile)
 * built by a small in-test writer. Every bad file must give
 * -SK_ERR_BAD_MODEL with a message naming the field. */
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "testutil.h"

/* --- the real model ------------------------------------------------------ */

static void check_u32(const struct sk_gguf *g, const char *key, uint32_t want) {
  struct sk_error err = {0};
  uint32_t v = 0;
  assert_int_equal(sk_gguf_get_u32(g, key, &v, &err), 1);
  assert_int_equal(v, want);
}

/* sk_gguf_release drops a tensor's pages from a mapped file, which reads
 * back unchanged; on a caller's buffer it does nothing (there, dropping
 * the pages of anonymous memory would zero them). */
static void test_release(void **state) {
  (void)state;
  size_t size = 0;
  uint8_t *file = sk_test_read_file(sk_test_model_path(), &size);
  uint8_t *copy = malloc(size);
  assert_non_null(file);
  assert_non_null(copy);
  memcpy(copy, file, size);
  struct sk_error err = {0};
  for (int mapped = 0; mapped < 2; mapped++) {
    struct sk_gguf *g = NULL;
    if (mapped) assert_int_equal(sk_gguf_open(sk_test_model_path(), &g, &err), 0);
    else assert_int_equal(sk_gguf_open_buffer(copy, size, &g, &err), 0);
    const struct sk_gguf_tensor *t = sk_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_true(t->n_bytes >= 8 * 4096); /* whole pages inside */
    sk_gguf_release(g, t->data, t->n_bytes);
    sk_gguf_release(g, file, 4096);              /* outside the file's bytes: no-op */
    sk_gguf_release(g, t->data, (size_t)-4096);  /* past the end: no-op */
    size_t n = 0;
    const void *bytes = sk_gguf_bytes(g, &n);
    assert_int_equal(n, size);
    assert_memory_equal(bytes, file, size);
    sk_gguf_close(g);
  }
  assert_memory_equal(copy, file, size);
  free(copy);
  free(file);
}

static void test_real_metadata(void **state) {
  (void)state;
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open(sk_test_model_path(), &g, &err), 0);
  assert_int_equal(sk_gguf_version(g), 3);
  assert_int_equal(sk_gguf_n_tensors(g), 48);
  assert_int_equal(sk_gguf_n_kv(g), 19);
  assert_int_equal(sk_gguf_alignment(g), 32);
  assert_int_equal(sk_gguf_data_offset(g) % 32, 0);

  check_u32(g, "llama.context_length", 2048);
  check_u32(g, "llama.embedding_length", 64);
  check_u32(g, "llama.feed_forward_length", 172);
  check_u32(g, "llama.attention.head_count", 8);
  check_u32(g, "llama.attention.head_count_kv", 4);
  check_u32(g, "llama.block_count", 5);
  check_u32(g, "llama.rope.dimension_count", 8);
  check_u32(g, "tokenizer.ggml.bos_token_id", 1);
  check_u32(g, "tokenizer.ggml.eos_token_id", 2);
  check_u32(g, "tokenizer.ggml.unknown_token_id", 0);

  float eps = 0;
  assert_int_equal(
      sk_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err), 1);
  assert_float_equal(eps, 1e-5, 1e-12);

  struct sk_gguf_str s;
  assert_int_equal(sk_gguf_get_str(g, "general.architecture", &s, &err), 1);
  assert_int_equal(s.len, 5);
  assert_memory_equal(s.ptr, "llama", 5);
  assert_int_equal(sk_gguf_get_str(g, "tokenizer.ggml.model", &s, &err), 1);
  assert_memory_equal(s.ptr, "llama", 5);

  const struct sk_gguf_str *toks = NULL;
  uint64_t n = 0;
  assert_int_equal(sk_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n, &err), 1);
  assert_int_equal(n, 512);
  assert_int_equal(toks[1].len, 3);
  assert_memory_equal(toks[1].ptr, "<s>", 3);
  assert_int_equal(toks[13].len, 6);
  assert_memory_equal(toks[13].ptr, "<0x0A>", 6);

  float *scores = NULL;
  assert_int_equal(sk_gguf_get_f32_array(g, "tokenizer.ggml.scores", &scores, &n, &err), 1);
  assert_int_equal(n, 512);
  free(scores);
  int32_t *types = NULL;
  assert_int_equal(sk_gguf_get_i32_array(g, "tokenizer.ggml.token_type", &types, &n, &err), 1);
  assert_int_equal(n, 512);
  assert_int_equal(types[0], 2); /* <unk>: unknown */
  assert_int_equal(types[1], 3); /* <s>: control */
  assert_int_equal(types[13], 6); /* <0x0A>: byte */
  free(types);

  /* Absent keys: 0, output untouched. */
  uint32_t u = 77;
  assert_int_equal(sk_gguf_get_u32(g, "no.such.key", &u, &err), 0);
  assert_int_equal(u, 77);
  assert_int_equal(sk_gguf_get_str(g, "general.architecturf", &s, &err), 0);

  /* Wrong types name the key. */
  assert_int_equal(sk_gguf_get_u32(g, "general.architecture", &u, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "general.architecture"));
  assert_int_equal(sk_gguf_get_str(g, "llama.block_count", &s, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "llama.block_count"));
  assert_int_equal(sk_gguf_get_f32(g, "llama.block_count", &eps, &err), -SK_ERR_BAD_MODEL);
  assert_int_equal(sk_gguf_get_str_array(g, "tokenizer.ggml.scores", &toks, &n, &err),
                   -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "tokenizer.ggml.scores"));
  assert_int_equal(sk_gguf_get_i32_array(g, "tokenizer.ggml.scores", &types, &n, &err),
                   -SK_ERR_BAD_MODEL);
  assert_int_equal(sk_gguf_get_u32(g, "tokenizer.ggml.tokens", &u, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "array"));
  sk_gguf_close(g);
}

/* Only a regular file is opened as a model: a FIFO (which would block
 * the open until a writer came), a directory, a socket and a character
 * device are refused at once, by their kind. */
static void test_not_regular_files(void **state) {
  (void)state;
  char *dir = sk_test_tmpdir();
  char fifo[512], sock[512];
  snprintf(fifo, sizeof fifo, "%s/model.fifo", dir);
  snprintf(sock, sizeof sock, "%s/model.sock", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  assert_true(strlen(sock) < sizeof a.sun_path);
  memcpy(a.sun_path, sock, strlen(sock) + 1);
  assert_int_equal(bind(sfd, (struct sockaddr *)&a, sizeof a), 0);
  const struct {
    const char *path, *kind;
  } cases[] = {{fifo, "a FIFO"}, {dir, "a directory"}, {"/dev/null", "a character device"},
               {sock, "a socket"}};
  alarm(20); /* a blocked open fails the test instead of hanging it */
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct sk_gguf *g = NULL;
    struct sk_error err = {0};
    char want[1100];
    snprintf(want, sizeof want, "%s is %s, not a regular file", cases[i].path, cases[i].kind);
    int rc = sk_gguf_open(cases[i].path, &g, &err);
    if (rc == -SK_ERR_IO && strcmp(err.message, want) == 0) continue;
    /* A socket cannot be opened at all: open's own error names it. */
    if (i == 3 && rc == -SK_ERR_IO && strstr(err.message, "No such device or address")) continue;
    fail_msg("%s: rc %d, '%s'", cases[i].path, rc, err.message);
  }
  alarm(0);
  close(sfd);
  unlink(sock);
  unlink(fifo);
  rmdir(dir);
  free(dir);
}

static void test_real_tensors(void **state) {
  (void)state;
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  const char *path = sk_test_model_path();
  assert_int_equal(sk_gguf_open(path, &g, &err), 0);

  const struct sk_gguf_tensor *t = sk_gguf_find_tensor(g, "token_embd.weight");
  assert_non_null(t);
  assert_int_equal(t->n_dims, 2);
  assert_int_equal(t->ne[0], 64);
  assert_int_equal(t->ne[1], 512);
  assert_int_equal(t->ne[2], 1);
  assert_int_equal(t->ne[3], 1);
  assert_int_equal(t->type, SK_GGML_F32);
  assert_int_equal(t->n_elements, 64 * 512);
  assert_int_equal(t->n_bytes, 64 * 512 * 4);
  assert_int_equal(t->offset, 0);
  assert_ptr_equal(t, sk_gguf_tensor(g, 0));

  t = sk_gguf_find_tensor(g, "output_norm.weight");
  assert_non_null(t);
  assert_int_equal(t->n_dims, 1);
  assert_int_equal(t->ne[0], 64);
  assert_int_equal(t->ne[1], 1);

  t = sk_gguf_find_tensor(g, "blk.4.ffn_down.weight");
  assert_non_null(t);
  assert_int_equal(t->ne[0], 172);
  assert_int_equal(t->ne[1], 64);
  t = sk_gguf_find_tensor(g, "blk.2.attn_k.weight");
  assert_non_null(t);
  assert_int_equal(t->ne[0], 64);
  assert_int_equal(t->ne[1], 32);

  assert_null(sk_gguf_find_tensor(g, "blk.5.attn_q.weight"));
  assert_null(sk_gguf_find_tensor(g, "blk.0.attn_q.weigh"));
  assert_null(sk_gguf_find_tensor(g, ""));
  assert_null(sk_gguf_tensor(g, 48));

  /* Every layer tensor is there; data is aligned and agrees with the
   * bytes read independently from the file. */
  static const char *const parts[] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                      "attn_norm", "ffn_gate", "ffn_down",
                                      "ffn_up", "ffn_norm"};
  for (int l = 0; l < 5; l++)
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
      char name[64];
      snprintf(name, sizeof name, "blk.%d.%s.weight", l, parts[p]);
      assert_non_null(sk_gguf_find_tensor(g, name));
    }
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  for (uint64_t i = 0; i < sk_gguf_n_tensors(g); i++) {
    t = sk_gguf_tensor(g, i);
    assert_int_equal((uintptr_t)t->data % 32, 0);
    assert_int_equal(t->type, SK_GGML_F32);
    float want[2], got[2];
    off_t off = (off_t)(sk_gguf_data_offset(g) + t->offset);
    assert_int_equal(pread(fd, want, sizeof want, off), (ssize_t)sizeof want);
    memcpy(got, t->data, sizeof got);
    assert_memory_equal(want, got, sizeof want);
    /* and the last float */
    off += (off_t)t->n_bytes - 4;
    assert_int_equal(pread(fd, want, 4, off), 4);
    memcpy(got, (const char *)t->data + t->n_bytes - 4, 4);
    assert_memory_equal(want, got, 4);
  }
  close(fd);
  /* The norm weights of a trained model are not all zero. */
  t = sk_gguf_find_tensor(g, "output_norm.weight");
  const float *w = t->data;
  float sum = 0;
  for (int i = 0; i < 64; i++) sum += w[i] * w[i];
  assert_true(sum > 0);
  sk_gguf_close(g);
}

static void test_real_buffer_and_truncation(void **state) {
  (void)state;
  size_t size = 0;
  uint8_t *file = sk_test_read_file(sk_test_model_path(), &size);
  assert_non_null(file);
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open_buffer(file, size, &g, &err), 0);
  uint64_t data_offset = sk_gguf_data_offset(g);
  for (uint64_t i = 0; i < sk_gguf_n_tensors(g); i++) {
    const struct sk_gguf_tensor *t = sk_gguf_tensor(g, i);
    assert_ptr_equal(t->data, file + data_offset + t->offset);
  }
  /* The last tensor ends at the end of the file. */
  const struct sk_gguf_tensor *last = sk_gguf_tensor(g, 47);
  assert_int_equal(data_offset + last->offset + last->n_bytes, size);
  sk_gguf_close(g);

  /* Every prefix through the header and a little data, then chosen points
   * of the data section: each copied into an exactly sized buffer so an
   * over-read would touch unowned memory (visible under ASan/valgrind). */
  size_t points[] = {data_offset + 100, data_offset + 131072,
                     data_offset + 131073, size / 2, size - 4, size - 1};
  size_t n_points = sizeof points / sizeof points[0];
  for (size_t k = 0; k < data_offset + 64 + n_points; k++) {
    size_t len = k < data_offset + 64 ? k : points[k - data_offset - 64];
    uint8_t *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, file, len);
    memset(&err, 0, sizeof err);
    g = (struct sk_gguf *)&err; /* must stay untouched on failure */
    int r = sk_gguf_open_buffer(copy, len, &g, &err);
    if (r != -SK_ERR_BAD_MODEL) fail_msg("prefix %zu: got %d", len, r);
    assert_ptr_equal(g, (struct sk_gguf *)&err);
    assert_int_equal(err.code, SK_ERR_BAD_MODEL);
    assert_true(err.message[0] != '\0');
    free(copy);
  }
  free(file);
}

static void test_missing_path(void **state) {
  (void)state;
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open("/nonexistent/dir/model.gguf", &g, &err), -SK_ERR_IO);
  assert_null(g);
  assert_non_null(strstr(err.message, "/nonexistent/dir/model.gguf"));
  assert_int_equal(sk_gguf_open("/", &g, &err), -SK_ERR_IO);
  sk_gguf_close(NULL);
}

static void test_type_names(void **state) {
  (void)state;
  assert_string_equal(sk_ggml_type_name(SK_GGML_F32), "f32");
  assert_string_equal(sk_ggml_type_name(SK_GGML_F16), "f16");
  assert_string_equal(sk_ggml_type_name(SK_GGML_Q8_0), "q8_0");
  assert_string_equal(sk_ggml_type_name(SK_GGML_Q4_0), "q4_0");
  assert_string_equal(sk_ggml_type_name(4), "unknown");
  assert_string_equal(sk_ggml_type_name(99), "unknown");
  assert_string_equal(sk_ggml_type_name(UINT32_MAX), "unknown");
}

/* --- a small GGUF writer --------------------------------------------------- */

struct wbuf {
  uint8_t *p;
  size_t len, cap;
};

static void w_bytes(struct wbuf *w, const void *b, size_t n) {
  if (w->len + n > w->cap) {
    w->cap = (w->len + n) * 2 + 64;
    w->p = realloc(w->p, w->cap);
    assert_non_null(w->p);
  }
  if (n) memcpy(w->p + w->len, b, n);
  w->len += n;
}

static void w_u32(struct wbuf *w, uint32_t v) {
  uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  w_bytes(w, b, 4);
}

static void w_u64(struct wbuf *w, uint64_t v) {
  w_u32(w, (uint32_t)v);
  w_u32(w, (uint32_t)(v >> 32));
}

static void w_f32(struct wbuf *w, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  w_u32(w, u);
}

static void w_str(struct wbuf *w, const char *s) {
  w_u64(w, strlen(s));
  w_bytes(w, s, strlen(s));
}

struct tspec {
  const char *name;
  uint32_t n_dims;
  uint64_t ne[5];
  uint32_t type;
  bool set_offset;
  uint64_t offset;
};

/* What the crafted file holds; defaults from spec_default, each test
 * breaks one thing. */
struct fspec {
  char magic[4];
  uint32_t version;
  bool set_n_tensors, set_n_kv;
  uint64_t n_tensors, n_kv;
  bool has_align;
  uint32_t align_type; /* SK_GGUF_UINT32 or another (to mistype it) */
  uint64_t align;
  bool set_arch_len;   /* declared length of the architecture string */
  uint64_t arch_len;
  bool set_arr_len;    /* declared length of the tokens array */
  uint64_t arr_len;
  uint32_t arr_type;   /* element type of the tokens array */
  const char *key5;    /* name of the last key */
  uint32_t key5_type;  /* its value type (value: 4 bytes) */
  uint32_t key5_val;
  size_t n_tensor;
  struct tspec t[3];
};

static struct fspec spec_default(void) {
  struct fspec s = {
    .magic = {'G', 'G', 'U', 'F'}, .version = 3,
    .has_align = false, .align_type = SK_GGUF_UINT32, .align = 32,
    .arr_type = SK_GGUF_STRING, .key5 = "llama.block_count",
    .key5_type = SK_GGUF_UINT32, .key5_val = 5, .n_tensor = 2,
    .t = {{"a", 2, {4, 2, 1, 1, 1}, SK_GGML_F32, false, 0},
          {"b", 1, {32, 1, 1, 1, 1}, SK_GGML_Q8_0, false, 0}},
  };
  return s;
}

static uint64_t type_bytes(uint32_t type, uint64_t n) {
  switch (type) {
  case SK_GGML_F32: return n * 4;
  case SK_GGML_F16: return n * 2;
  case SK_GGML_Q8_0: return n / 32 * 34;
  default: return 0;
  }
}

static uint8_t *build(const struct fspec *s, size_t *ret_len) {
  struct wbuf w = {0};
  w_bytes(&w, s->magic, 4);
  w_u32(&w, s->version);
  w_u64(&w, s->set_n_tensors ? s->n_tensors : s->n_tensor);
  w_u64(&w, s->set_n_kv ? s->n_kv : 4 + (s->has_align ? 1 : 0));

  w_str(&w, "general.architecture");
  w_u32(&w, SK_GGUF_STRING);
  w_u64(&w, s->set_arch_len ? s->arch_len : 5);
  w_bytes(&w, "llama", 5);
  if (s->has_align) {
    w_str(&w, "general.alignment");
    w_u32(&w, s->align_type);
    if (s->align_type == SK_GGUF_STRING) {
      w_str(&w, "32");
    } else if (s->align_type == SK_GGUF_UINT64 || s->align_type == SK_GGUF_INT64) {
      w_u64(&w, s->align);
    } else {
      w_u32(&w, (uint32_t)s->align);
    }
  }
  w_str(&w, "tokenizer.ggml.tokens");
  w_u32(&w, SK_GGUF_ARRAY);
  w_u32(&w, s->arr_type);
  w_u64(&w, s->set_arr_len ? s->arr_len : 2);
  w_str(&w, "a");
  w_str(&w, "bc");
  w_str(&w, "tokenizer.ggml.scores");
  w_u32(&w, SK_GGUF_ARRAY);
  w_u32(&w, SK_GGUF_FLOAT32);
  w_u64(&w, 2);
  w_f32(&w, 0.5f);
  w_f32(&w, -1.0f);
  w_str(&w, s->key5);
  w_u32(&w, s->key5_type);
  w_u32(&w, s->key5_val);

  uint64_t align = s->has_align && s->align && s->align <= 4096 &&
                   !(s->align & (s->align - 1)) ? s->align : 32;
  uint64_t off = 0;
  uint64_t offsets[3];
  for (size_t i = 0; i < s->n_tensor; i++) {
    const struct tspec *t = &s->t[i];
    w_str(&w, t->name);
    w_u32(&w, t->n_dims);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims && d < 5; d++) {
      w_u64(&w, t->ne[d]);
      n *= t->ne[d];
    }
    w_u32(&w, t->type);
    offsets[i] = t->set_offset ? t->offset : off;
    w_u64(&w, offsets[i]);
    off += (type_bytes(t->type, n) + align - 1) / align * align;
  }
  while (w.len % align) w_bytes(&w, "", 1);
  /* Data: float j*0.25 for F32, a byte pattern otherwise. */
  size_t data_start = w.len;
  for (size_t i = 0; i < s->n_tensor; i++) {
    const struct tspec *t = &s->t[i];
    if (t->set_offset) continue;
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims && d < 5; d++) n *= t->ne[d];
    uint64_t nb = type_bytes(t->type, n);
    while (w.len < data_start + offsets[i]) w_bytes(&w, "", 1);
    if (t->type == SK_GGML_F32) {
      for (uint64_t j = 0; j < nb / 4; j++) w_f32(&w, (float)j * 0.25f);
    } else {
      for (uint64_t j = 0; j < nb; j++) w_bytes(&w, &(uint8_t){(uint8_t)(j + 7)}, 1);
    }
  }
  while (w.len % align) w_bytes(&w, "", 1);
  *ret_len = w.len;
  return w.p;
}

/* Opens the crafted file expecting -SK_ERR_BAD_MODEL and every needle in
 * the message. */
static void expect_bad(const struct fspec *s, const char *needle1, const char *needle2) {
  size_t len;
  uint8_t *buf = build(s, &len);
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  int r = sk_gguf_open_buffer(buf, len, &g, &err);
  if (r != -SK_ERR_BAD_MODEL) fail_msg("expected BAD_MODEL (%s), got %d", needle1, r);
  assert_null(g);
  assert_int_equal(err.code, SK_ERR_BAD_MODEL);
  if (!strstr(err.message, needle1) || (needle2 && !strstr(err.message, needle2)))
    fail_msg("message '%s' lacks '%s' / '%s'", err.message, needle1,
             needle2 ? needle2 : "");
  free(buf);
}

static struct sk_gguf *open_good(const struct fspec *s, uint8_t **ret_buf) {
  size_t len;
  uint8_t *buf = build(s, &len);
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  int r = sk_gguf_open_buffer(buf, len, &g, &err);
  if (r != 0) fail_msg("crafted file refused: %d %s", r, err.message);
  *ret_buf = buf;
  return g;
}

/* --- crafted files ----------------------------------------------------------- */

static void test_crafted_good(void **state) {
  (void)state;
  struct fspec s = spec_default();
  uint8_t *buf;
  struct sk_gguf *g = open_good(&s, &buf);
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_version(g), 3);
  assert_int_equal(sk_gguf_n_kv(g), 4);
  assert_int_equal(sk_gguf_n_tensors(g), 2);
  assert_int_equal(sk_gguf_alignment(g), 32);
  const struct sk_gguf_tensor *a = sk_gguf_find_tensor(g, "a");
  const struct sk_gguf_tensor *b = sk_gguf_find_tensor(g, "b");
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(a->n_elements, 8);
  assert_int_equal(a->n_bytes, 32);
  assert_int_equal(b->n_bytes, 34);
  assert_int_equal(b->type, SK_GGML_Q8_0);
  assert_int_equal(b->offset, 32);
  float f;
  memcpy(&f, (const char *)a->data + 8, 4);
  assert_float_equal(f, 0.5, 0);

  const struct sk_gguf_str *strs;
  uint64_t n;
  assert_int_equal(sk_gguf_get_str_array(g, "tokenizer.ggml.tokens", &strs, &n, &err), 1);
  assert_int_equal(n, 2);
  assert_int_equal(strs[1].len, 2);
  assert_memory_equal(strs[1].ptr, "bc", 2);
  float *fs;
  assert_int_equal(sk_gguf_get_f32_array(g, "tokenizer.ggml.scores", &fs, &n, &err), 1);
  assert_float_equal(fs[0], 0.5, 0);
  assert_float_equal(fs[1], -1.0, 0);
  free(fs);
  uint32_t u;
  assert_int_equal(sk_gguf_get_u32(g, "llama.block_count", &u, &err), 1);
  assert_int_equal(u, 5);
  assert_int_equal(sk_gguf_get_u32(g, "general.alignment", &u, &err), 0);
  sk_gguf_close(g);
  free(buf);

  /* v2, alignment 64, a zero dimension, int32 and int8 values. */
  s = spec_default();
  s.version = 2;
  s.has_align = true;
  s.align = 64;
  s.key5_type = SK_GGUF_INT32;
  s.n_tensor = 3;
  s.t[2] = (struct tspec){"empty", 2, {0, 4, 1, 1, 1}, SK_GGML_F16, false, 0};
  g = open_good(&s, &buf);
  assert_int_equal(sk_gguf_version(g), 2);
  assert_int_equal(sk_gguf_alignment(g), 64);
  assert_int_equal(sk_gguf_data_offset(g) % 64, 0);
  assert_int_equal(sk_gguf_find_tensor(g, "b")->offset, 64);
  assert_int_equal(sk_gguf_find_tensor(g, "empty")->n_bytes, 0);
  assert_int_equal(sk_gguf_find_tensor(g, "empty")->n_elements, 0);
  assert_int_equal(sk_gguf_get_u32(g, "llama.block_count", &u, &err), 1);
  assert_int_equal(u, 5);
  assert_int_equal(sk_gguf_get_u32(g, "general.alignment", &u, &err), 1);
  assert_int_equal(u, 64);
  int32_t *is;
  assert_int_equal(sk_gguf_get_i32_array(g, "tokenizer.ggml.scores", &is, &n, &err),
                   -SK_ERR_BAD_MODEL);
  sk_gguf_close(g);
  free(buf);

  /* A 64-byte tensor name is the longest allowed. */
  s = spec_default();
  char name64[65];
  memset(name64, 'x', 64);
  name64[64] = 0;
  s.t[0].name = name64;
  g = open_good(&s, &buf);
  assert_non_null(sk_gguf_find_tensor(g, name64));
  sk_gguf_close(g);
  free(buf);

  /* Integer getters take any integer type whose value fits. */
  s = spec_default();
  s.key5_type = SK_GGUF_INT32;
  s.key5_val = UINT32_MAX; /* -1 */
  g = open_good(&s, &buf);
  assert_int_equal(sk_gguf_get_u32(g, "llama.block_count", &u, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "llama.block_count"));
  assert_non_null(strstr(err.message, "-1"));
  int32_t *ids;
  assert_int_equal(sk_gguf_get_i32_array(g, "llama.block_count", &ids, &n, &err),
                   -SK_ERR_BAD_MODEL);
  sk_gguf_close(g);
  free(buf);
  s.key5_type = SK_GGUF_FLOAT32;
  s.key5_val = 0x3f800000; /* 1.0f */
  g = open_good(&s, &buf);
  assert_int_equal(sk_gguf_get_f32(g, "llama.block_count", &f, &err), 1);
  assert_float_equal(f, 1.0, 0);
  assert_int_equal(sk_gguf_get_u32(g, "llama.block_count", &u, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "float32"));
  sk_gguf_close(g);
  free(buf);
}

/* Every prefix of a small valid file is refused cleanly. */
static void test_crafted_truncation(void **state) {
  (void)state;
  struct fspec s = spec_default();
  s.has_align = true;
  size_t len;
  uint8_t *buf = build(&s, &len);
  /* Cutting the padding after the last tensor (ends at data + 66) is
   * harmless; every shorter prefix is not. */
  size_t end = len - 96 + 66;
  for (size_t k = 0; k < end; k++) {
    uint8_t *copy = malloc(k ? k : 1);
    assert_non_null(copy);
    memcpy(copy, buf, k);
    struct sk_gguf *g = NULL;
    struct sk_error err = {0};
    int r = sk_gguf_open_buffer(copy, k, &g, &err);
    if (r != -SK_ERR_BAD_MODEL) fail_msg("prefix %zu of %zu: got %d", k, len, r);
    assert_null(g);
    assert_true(err.message[0] != '\0');
    if (k < 4) assert_non_null(strstr(err.message, "magic"));
    else if (k < 8) assert_non_null(strstr(err.message, "version"));
    else if (k < 16) assert_non_null(strstr(err.message, "tensor count"));
    else if (k < 24) assert_non_null(strstr(err.message, "kv count"));
    free(copy);
  }
  /* NULL with size 0 too. */
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_gguf_open_buffer(NULL, 0, &g, &err), -SK_ERR_BAD_MODEL);
  free(buf);
}

static void test_bad_header(void **state) {
  (void)state;
  struct fspec s = spec_default();
  memcpy(s.magic, "GGUG", 4);
  expect_bad(&s, "magic", NULL);
  s = spec_default();
  memcpy(s.magic, "FUGG", 4);
  expect_bad(&s, "magic", NULL);

  s = spec_default();
  s.version = 1;
  expect_bad(&s, "version 1", NULL);
  s.version = 99;
  expect_bad(&s, "version 99", NULL);
  s.version = 0x03000000; /* a big-endian v3 file */
  expect_bad(&s, "version", NULL);

  s = spec_default();
  s.set_n_tensors = true;
  s.n_tensors = UINT64_C(1) << 63;
  expect_bad(&s, "tensor count", "9223372036854775808");
  s.n_tensors = UINT64_MAX;
  expect_bad(&s, "tensor count", NULL);
  s.n_tensors = 3; /* more than present: runs off the end */
  expect_bad(&s, "tensor", NULL);

  s = spec_default();
  s.set_n_kv = true;
  s.n_kv = UINT64_C(1) << 63;
  expect_bad(&s, "kv count", "9223372036854775808");
  s.n_kv = 1000;
  expect_bad(&s, "kv count", NULL);
}

static void test_bad_kv(void **state) {
  (void)state;
  struct fspec s = spec_default();
  s.set_arch_len = true;
  s.arch_len = UINT64_C(1) << 63;
  expect_bad(&s, "string length", "general.architecture");
  s.arch_len = UINT64_MAX;
  expect_bad(&s, "string length", NULL);
  s.arch_len = 100000;
  expect_bad(&s, "string length", "100000");

  s = spec_default();
  s.set_arr_len = true;
  s.arr_len = UINT64_C(1) << 62;
  expect_bad(&s, "array length", "tokenizer.ggml.tokens");
  s.arr_len = UINT64_MAX;
  expect_bad(&s, "array length", NULL);
  s.arr_len = 1000;
  expect_bad(&s, "array length", NULL);

  s = spec_default();
  s.arr_type = SK_GGUF_ARRAY;
  expect_bad(&s, "nested", "tokenizer.ggml.tokens");
  s.arr_type = 13;
  expect_bad(&s, "element type 13", NULL);

  s = spec_default();
  s.key5_type = 13;
  expect_bad(&s, "value type 13", "llama.block_count");
  s.key5_type = UINT32_MAX;
  expect_bad(&s, "value type", NULL);

  s = spec_default();
  s.key5 = "general.architecture";
  expect_bad(&s, "duplicate key", "general.architecture");
  s.key5 = "tokenizer.ggml.scores";
  expect_bad(&s, "duplicate key", "tokenizer.ggml.scores");
}

static void test_bad_alignment(void **state) {
  (void)state;
  struct fspec s = spec_default();
  s.has_align = true;
  s.align = 0;
  expect_bad(&s, "general.alignment", "0");
  s.align = 3;
  expect_bad(&s, "general.alignment", "3");
  s.align = 48;
  expect_bad(&s, "general.alignment", "48");
  s.align_type = SK_GGUF_STRING;
  expect_bad(&s, "general.alignment", "string");
  s.align_type = SK_GGUF_UINT64;
  s.align = UINT64_C(1) << 32;
  expect_bad(&s, "general.alignment", NULL);
  s.align_type = SK_GGUF_INT32;
  s.align = (uint32_t)-32;
  expect_bad(&s, "general.alignment", "-32");
}

static void test_bad_tensor_shape(void **state) {
  (void)state;
  struct fspec s = spec_default();
  s.t[1].n_dims = 0;
  expect_bad(&s, "n_dims 0", "'b'");
  s.t[1].n_dims = 5;
  expect_bad(&s, "n_dims 5", "'b'");
  s.t[1].n_dims = UINT32_MAX;
  expect_bad(&s, "n_dims", NULL);

  /* 2^32 * 2^32 overflows; 2^31 * 2^31 * 2 too (> INT64_MAX). */
  s = spec_default();
  s.t[0] = (struct tspec){"big", 2, {UINT64_C(1) << 32, UINT64_C(1) << 32, 1, 1, 1},
                          SK_GGML_F32, true, 0};
  expect_bad(&s, "element count", "'big'");
  s.t[0] = (struct tspec){"big", 3, {UINT64_C(1) << 31, UINT64_C(1) << 31, 2, 1, 1},
                          SK_GGML_F32, true, 0};
  expect_bad(&s, "element count", "'big'");
  s.t[0] = (struct tspec){"big", 1, {UINT64_MAX, 1, 1, 1, 1}, SK_GGML_F32, true, 0};
  expect_bad(&s, "dimension", "'big'");
  /* Fits int64 elements but not bytes (x4). */
  s.t[0] = (struct tspec){"big", 2, {UINT64_C(1) << 31, UINT64_C(1) << 31, 1, 1, 1},
                          SK_GGML_F32, true, 0};
  expect_bad(&s, "'big'", NULL);
  /* Fits bytes but not the file. */
  s.t[0] = (struct tspec){"big", 2, {1024, 1024, 1, 1, 1}, SK_GGML_F32, true, 0};
  s.n_tensor = 1;
  expect_bad(&s, "exceeds data section size", "'big'");

  s = spec_default();
  s.t[1].type = 99;
  expect_bad(&s, "unknown type 99", "'b'");
  s.t[1].type = 4; /* removed Q4_2 */
  expect_bad(&s, "unknown type 4", "'b'");
  s.t[1].type = UINT32_MAX;
  expect_bad(&s, "unknown type 4294967295", NULL);

  s = spec_default();
  s.t[1].ne[0] = 20; /* Q8_0 rows must be whole blocks of 32 */
  expect_bad(&s, "block size", "'b'");

  s = spec_default();
  char name65[66];
  memset(name65, 'y', 65);
  name65[65] = 0;
  s.t[1].name = name65;
  expect_bad(&s, "name", "65");
  s.t[1].name = "a";
  expect_bad(&s, "duplicate tensor name 'a'", NULL);
}

static void test_bad_tensor_offset(void **state) {
  (void)state;
  struct fspec s = spec_default();
  s.t[1].set_offset = true;
  s.t[1].offset = 36;
  expect_bad(&s, "offset 36", "alignment 32");
  s.t[1].offset = 1;
  expect_bad(&s, "offset 1", "'b'");

  /* Aligned, but past the end. */
  s.t[1].offset = 4096;
  expect_bad(&s, "exceeds data section size", "'b'");
  /* Starts inside the data but runs past its end. */
  s.t[1].offset = 64;
  expect_bad(&s, "offset 64 + 34 bytes exceeds data section size", "'b'");
  /* offset + n_bytes wraps around 2^64. */
  s.t[1].offset = UINT64_MAX - 31; /* multiple of 32 */
  expect_bad(&s, "exceeds data section size", "'b'");
  s.t[1].offset = UINT64_C(1) << 63;
  expect_bad(&s, "exceeds data section size", "'b'");

  /* With alignment 64, offset 32 is misaligned. */
  s = spec_default();
  s.has_align = true;
  s.align = 64;
  s.t[1].set_offset = true;
  s.t[1].offset = 32;
  expect_bad(&s, "alignment 64", "'b'");
}

/* Through the file path (mmap), including an empty file. */
static void test_crafted_files_on_disk(void **state) {
  (void)state;
  char *dir = sk_test_tmpdir();
  char path[4096];
  struct fspec s = spec_default();
  size_t len;
  uint8_t *buf = build(&s, &len);
  struct sk_gguf *g = NULL;
  struct sk_error err = {0};

  snprintf(path, sizeof path, "%s/good.gguf", dir);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len, f), len);
  fclose(f);
  assert_int_equal(sk_gguf_open(path, &g, &err), 0);
  assert_int_equal(sk_gguf_n_tensors(g), 2);
  sk_gguf_close(g);
  unlink(path);

  snprintf(path, sizeof path, "%s/empty.gguf", dir);
  f = fopen(path, "wb");
  assert_non_null(f);
  fclose(f);
  g = NULL;
  assert_int_equal(sk_gguf_open(path, &g, &err), -SK_ERR_BAD_MODEL);
  assert_null(g);
  assert_non_null(strstr(err.message, "magic"));
  unlink(path);

  snprintf(path, sizeof path, "%s/short.gguf", dir);
  f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, len - 31, f), len - 31); /* cuts 'b' */
  fclose(f);
  assert_int_equal(sk_gguf_open(path, &g, &err), -SK_ERR_BAD_MODEL);
  assert_non_null(strstr(err.message, "'b'"));
  unlink(path);

  rmdir(dir);
  free(dir);
  free(buf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_release),
    cmocka_unit_test(test_real_metadata),
    cmocka_unit_test(test_real_tensors),
    cmocka_unit_test(test_not_regular_files),
    cmocka_unit_test(test_real_buffer_and_truncation),
    cmocka_unit_test(test_missing_path),
    cmocka_unit_test(test_type_names),
    cmocka_unit_test(test_crafted_good),
    cmocka_unit_test(test_crafted_truncation),
    cmocka_unit_test(test_bad_header),
    cmocka_unit_test(test_bad_kv),
    cmocka_unit_test(test_bad_alignment),
    cmocka_unit_test(test_bad_tensor_shape),
    cmocka_unit_test(test_bad_tensor_offset),
    cmocka_unit_test(test_crafted_files_on_disk),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
