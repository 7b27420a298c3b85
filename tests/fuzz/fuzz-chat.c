/* Fuzz target: chat templates and conversations (daemon/model/chat.c,
 * daemon/session/conv.c), with oracles.
 *
 * Input: byte 0 picks the family, byte 1 the number of messages already
 * in the conversation; the rest, cut at NUL bytes, is a template text
 * first, then messages (a role byte, then the content). Checked:
 *  - detection of the template text returns a family or -1, never more;
 *  - every rendering's segments cover its text in order, alternate in
 *    kind, and hold no more content bytes than the messages have;
 *  - the conversation's delta for the next messages renders (its
 *    segments valid likewise), and the state it commits saves and loads
 *    back to the same text and messages;
 *  - a conversation file made of the input's bytes loads or is refused as
 *    bad_request, and one that loads saves back byte for byte.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/chat.h"
#include "session/conv.h"
#include "fuzz.h"

static char g_dir[64];
static int g_dirfd = -1; /* g_dir, as the daemon holds its state directory */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(g_dir, sizeof g_dir, "/tmp/fuzz-chat.XXXXXX");
  if (!mkdtemp(g_dir)) sk_fuzz_fail("mkdtemp");
  g_dirfd = open(g_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (g_dirfd < 0) sk_fuzz_fail("open %s", g_dir);
  return 0;
}

static void check_text(const struct sk_chat_text *t, size_t max_content) {
  size_t pos = 0, content = 0;
  for (size_t k = 0; k < t->n_segs; k++) {
    if (t->segs[k].off != pos || t->segs[k].len == 0) sk_fuzz_fail("segment %zu misplaced", k);
    if (k && t->segs[k].content == t->segs[k - 1].content) sk_fuzz_fail("segments not merged");
    pos += t->segs[k].len;
    if (t->segs[k].content) content += t->segs[k].len;
  }
  if (pos != t->len) sk_fuzz_fail("segments cover %zu of %zu bytes", pos, t->len);
  if (content > max_content) sk_fuzz_fail("%zu content bytes of %zu", content, max_content);
}

static const char *const k_roles[] = {"system", "user", "assistant", "tool", "assistant_tool_call"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const int tmpl = 1 + data[0] % (SK_CHAT__COUNT - 1);
  const size_t n_old = data[1] % 8;
  const char *p = (const char *)data + 2, *end = (const char *)data + size;
  /* the template text */
  const char *z = memchr(p, 0, (size_t)(end - p));
  size_t tl = z ? (size_t)(z - p) : (size_t)(end - p);
  int det = sk_chat_detect(p, tl);
  if (det < -1 || det >= SK_CHAT__COUNT) sk_fuzz_fail("detected %d", det);
  p += tl + (z != NULL);
  /* messages */
  struct sk_chat_msg m[16];
  size_t n = 0, total = 0;
  while (p < end && n < 16) {
    const char *role = k_roles[(unsigned char)*p % 5];
    p++;
    z = memchr(p, 0, (size_t)(end - p));
    size_t cl = z ? (size_t)(z - p) : (size_t)(end - p);
    m[n++] = (struct sk_chat_msg){role, strlen(role), p, cl};
    total += cl;
    p += cl + (z != NULL);
  }
  struct sk_error err = {0};
  struct sk_chat_text t;
  sk_chat_text_init(&t);
  for (int a = 0; a < 2; a++) {
    sk_chat_text_reset(&t);
    if (sk_chat_render(tmpl, m, n, a, &t, &err) < 0) sk_fuzz_fail("render: %s", err.message);
    check_text(&t, total);
  }
  /* text appended before any chat (no message yet), then the messages */
  struct sk_conv fresh;
  sk_conv_init(&fresh, tmpl);
  sk_chat_text_reset(&t);
  if (sk_conv_delta(&fresh, m, n, " x", 2, &t, &err) < 0) sk_fuzz_fail("delta: %s", err.message);
  check_text(&t, total + 64);
  sk_conv_free(&fresh);
  /* a conversation: the first n_old messages as the previous request,
   * "ok" as its reply, the rest as the next */
  size_t k = n_old < n ? n_old : n;
  struct sk_conv c, back;
  sk_conv_init(&c, tmpl);
  sk_conv_init(&back, SK_CHAT_NONE);
  if (sk_conv_commit_prompt(&c, m, k, 7, &err) < 0 ||
      sk_conv_commit_reply(&c, "ok", 2, 9, &err) < 0)
    sk_fuzz_fail("commit: %s", err.message);
  sk_chat_text_reset(&t);
  if (sk_conv_delta(&c, m + k, n - k, " x", 2, &t, &err) < 0) sk_fuzz_fail("delta: %s", err.message);
  check_text(&t, total + 2 + 64);
  if (sk_conv_save(&c, g_dirfd, 1, &err) < 0) sk_fuzz_fail("save: %s", err.message);
  if (sk_conv_load(&back, g_dirfd, 1, &err) != 1) sk_fuzz_fail("load: %s", err.message);
  if (back.tmpl != c.tmpl || back.text_len != c.text_len || back.n_msgs != c.n_msgs ||
      (c.text_len && memcmp(back.text, c.text, c.text_len) != 0) || back.n_seen != c.n_seen)
    sk_fuzz_fail("the state did not load back");
  sk_conv_free(&back);
  sk_conv_free(&c);
  sk_chat_text_free(&t);

  /* the input as a conversation file */
  char path[128];
  snprintf(path, sizeof path, "%s/session-2.chat", g_dir);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) sk_fuzz_fail("write %s", path);
  sk_conv_init(&c, SK_CHAT_NONE);
  int rc = sk_conv_load(&c, g_dirfd, 2, &err);
  if (rc != 1 && rc != -SK_ERR_BAD_REQUEST) sk_fuzz_fail("load of the input: %d", rc);
  if (rc == 1) {
    if (sk_conv_save(&c, g_dirfd, 3, &err) < 0) sk_fuzz_fail("save: %s", err.message);
    snprintf(path, sizeof path, "%s/session-3.chat", g_dir);
    f = fopen(path, "rb");
    uint8_t *again = malloc(size + 1);
    size_t r = f ? fread(again, 1, size + 1, f) : 0;
    if (f) fclose(f);
    if (r != size || memcmp(again, data, size) != 0) sk_fuzz_fail("a loaded file saves back differently");
    free(again);
  }
  sk_conv_free(&c);
  sk_conv_remove(g_dirfd, 1);
  sk_conv_remove(g_dirfd, 2);
  sk_conv_remove(g_dirfd, 3);
  return 0;
}
