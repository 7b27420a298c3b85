/* A session's conversation state and its file (conv.h). */
#include "session/conv.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/safefile.h"

static void msg_free(struct sk_conv_msg *m) {
  free(m->role);
  free(m->content);
  memset(m, 0, sizeof *m);
}

static int msg_set(struct sk_conv_msg *m, const char *role, size_t role_len, const char *content,
                   size_t content_len) {
  char *r = malloc(role_len + 1), *text = malloc(content_len + 1);
  if (!r || !text) {
    free(r);
    free(text);
    return -SK_ERR_NO_MEMORY;
  }
  memcpy(r, role, role_len);
  r[role_len] = 0;
  if (content_len) memcpy(text, content, content_len);
  text[content_len] = 0;
  msg_free(m);
  *m = (struct sk_conv_msg){r, role_len, text, content_len};
  return 0;
}

static struct sk_chat_msg msg_view(const struct sk_conv_msg *m) {
  return (struct sk_chat_msg){m->role, m->role_len, m->content, m->content_len};
}

void sk_conv_init(struct sk_conv *conv, int tmpl) {
  memset(conv, 0, sizeof *conv);
  conv->tmpl = tmpl;
}

static void msgs_free(struct sk_conv *conv) {
  for (size_t i = 0; i < conv->n_msgs; i++) msg_free(&conv->msgs[i]);
  free(conv->msgs);
  conv->msgs = NULL;
  conv->n_msgs = 0;
}

void sk_conv_free(struct sk_conv *conv) {
  if (!conv) return;
  msgs_free(conv);
  msg_free(&conv->system);
  free(conv->text);
  memset(conv, 0, sizeof *conv);
}

int sk_conv_set_system(struct sk_conv *conv, const char *text, size_t len, struct sk_error *err) {
  if (msg_set(&conv->system, "system", 6, text, len) < 0)
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  conv->has_system = true;
  return 0;
}

int sk_conv_check(const struct sk_chat_msg *msgs, size_t n, struct sk_error *err) {
  if (n == 0) return sk_error_set(err, SK_ERR_BAD_REQUEST, "field 'messages': no message");
  if (n > SK_LIMIT_CONV_MSGS)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "field 'messages': %zu messages, at most %u", n,
                        SK_LIMIT_CONV_MSGS);
  for (size_t i = 0; i < n; i++) {
    /* A role is template text (it is not tokenized as content): only
     * plain lower-case names, so none can carry a marker. */
    bool ok = msgs[i].role_len > 0 && msgs[i].role_len <= SK_LIMIT_CONV_ROLE;
    for (size_t k = 0; ok && k < msgs[i].role_len; k++) {
      char ch = msgs[i].role[k];
      ok = (ch >= 'a' && ch <= 'z') || ch == '_';
    }
    if (!ok)
      return sk_error_set(err, SK_ERR_BAD_REQUEST,
                          "messages[%zu]: role must be 1 to %u characters of a-z and _ "
                          "(system, user, assistant, tool, ...)",
                          i, SK_LIMIT_CONV_ROLE);
  }
  return 0;
}

/* Copies the segments of src from byte `from` on into out. */
static int slice(const struct sk_chat_text *src, size_t from, struct sk_chat_text *out,
                 struct sk_error *err) {
  struct sk_chat_text *o = out;
  for (size_t k = 0; k < src->n_segs; k++) {
    const struct sk_chat_seg *s = &src->segs[k];
    size_t a = s->off, b = s->off + s->len;
    if (b <= from) continue;
    if (a < from) a = from;
    /* sk_chat_render's appender, through a one-message rendering would
     * lose the kind; append by hand. */
    size_t n = b - a;
    if (o->len + n + 1 > o->cap) {
      size_t cap = o->cap ? o->cap : 256;
      while (cap < o->len + n + 1) cap *= 2;
      char *p = realloc(o->text, cap);
      if (!p) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
      o->text = p;
      o->cap = cap;
    }
    if (o->n_segs && o->segs[o->n_segs - 1].content == s->content) {
      o->segs[o->n_segs - 1].len += n;
    } else {
      if (o->n_segs == o->seg_cap) {
        size_t cap = o->seg_cap ? 2 * o->seg_cap : 16;
        struct sk_chat_seg *p = realloc(o->segs, cap * sizeof *p);
        if (!p) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
        o->segs = p;
        o->seg_cap = cap;
      }
      o->segs[o->n_segs++] = (struct sk_chat_seg){o->len, n, s->content};
    }
    memcpy(o->text + o->len, src->text + a, n);
    o->len += n;
    o->text[o->len] = 0;
  }
  return 0;
}

void sk_conv_system_pinned(struct sk_conv *conv, struct sk_chat_text *t, uint64_t n_seen) {
  free(conv->text);
  conv->text = t->text; /* C: the pinned text */
  conv->text_len = t->len;
  t->text = NULL;
  conv->system_sent = true;
  conv->n_seen = n_seen;
}

int sk_conv_system_text(const struct sk_conv *conv, struct sk_chat_text *out,
                        struct sk_error *err) {
  static const char mark = '\x01';
  const struct sk_chat_msg two[2] = {msg_view(&conv->system), {"user", 4, &mark, 1}};
  struct sk_chat_text a, b;
  sk_chat_text_init(&a);
  sk_chat_text_init(&b);
  int rc = sk_chat_render(conv->tmpl, two, 1, false, &a, err);
  if (rc == 0) rc = sk_chat_render(conv->tmpl, two, 2, false, &b, err);
  if (rc == 0) {
    if (a.len && a.len <= b.len && memcmp(a.text, b.text, a.len) == 0) {
      rc = slice(&a, 0, out, err);
    } else {
      /* Formats without a system role put it into the first user turn:
       * the prefix up to the user's text. */
      const char *at = memchr(b.text, mark, b.len);
      size_t cut = at ? (size_t)(at - b.text) : 0;
      struct sk_chat_text p;
      sk_chat_text_init(&p);
      rc = slice(&b, 0, &p, err);
      if (rc == 0) {
        /* keep segments up to cut */
        size_t k = 0;
        while (k < p.n_segs && p.segs[k].off < cut) k++;
        p.n_segs = k;
        if (k) p.segs[k - 1].len = cut - p.segs[k - 1].off;
        p.len = cut;
        rc = slice(&p, 0, out, err);
      }
      sk_chat_text_free(&p);
    }
  }
  sk_chat_text_free(&a);
  sk_chat_text_free(&b);
  return rc;
}

/* H (+ more): [system] + conv->msgs (the last one's content extended by
 * extra when it is the reply) + more[0..n_more), as views. *ret malloc'd. */
static int history(const struct sk_conv *conv, const char *reply_ext, size_t reply_ext_len,
                   const struct sk_chat_msg *more, size_t n_more, struct sk_chat_msg **ret,
                   size_t *ret_n) {
  size_t n = (conv->has_system ? 1 : 0) + conv->n_msgs + n_more;
  struct sk_chat_msg *h = calloc(n ? n : 1, sizeof *h);
  if (!h) return -SK_ERR_NO_MEMORY;
  size_t k = 0;
  if (conv->has_system) h[k++] = msg_view(&conv->system);
  for (size_t i = 0; i < conv->n_msgs; i++) h[k++] = msg_view(&conv->msgs[i]);
  if (reply_ext && conv->n_msgs) {
    h[k - 1].content = reply_ext;
    h[k - 1].content_len = reply_ext_len;
  }
  for (size_t i = 0; i < n_more; i++) h[k++] = more[i];
  *ret = h;
  *ret_n = n;
  return 0;
}

static bool last_is_reply(const struct sk_conv *conv) {
  return conv->n_msgs && conv->msgs[conv->n_msgs - 1].role_len == 9 &&
         memcmp(conv->msgs[conv->n_msgs - 1].role, "assistant", 9) == 0;
}

static bool is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

int sk_conv_delta(struct sk_conv *conv, const struct sk_chat_msg *msgs, size_t n,
                  const char *extra, size_t extra_len, struct sk_chat_text *out,
                  struct sk_error *err) {
  int rc = 0;
  char *reply = NULL, *cached = NULL;
  size_t reply_len = 0, cached_len = conv->text_len + extra_len;
  struct sk_chat_msg *h = NULL;
  size_t n_h = 0;
  struct sk_chat_text full, closed;
  sk_chat_text_init(&full);
  sk_chat_text_init(&closed);
  /* The cache's text: C, then what arrived after it. */
  cached = malloc(cached_len + 1);
  if (!cached) goto oom;
  if (conv->text_len) memcpy(cached, conv->text, conv->text_len);
  if (extra_len) memcpy(cached + conv->text_len, extra, extra_len);
  if (extra_len && last_is_reply(conv)) {
    const struct sk_conv_msg *r = &conv->msgs[conv->n_msgs - 1];
    reply_len = r->content_len + extra_len;
    reply = malloc(reply_len + 1);
    if (!reply) goto oom;
    memcpy(reply, r->content, r->content_len);
    memcpy(reply + r->content_len, extra, extra_len);
  }
  if (history(conv, reply, reply_len, msgs, n, &h, &n_h) < 0) goto oom;
  if ((rc = sk_chat_render(conv->tmpl, h, n_h, true, &full, err)) < 0) goto out;
  /* (A length of 0 compares nothing: memcmp must not see a NULL text
   * even then.) */
  if (cached_len <= full.len && (cached_len == 0 || memcmp(full.text, cached, cached_len) == 0)) {
    rc = slice(&full, cached_len, out, err);
    goto out;
  }
  /* The template changed the reply (trimmed it) or opens the assistant's
   * turn unlike its generation prompt: close the reply's turn as render(H)
   * does, then the new messages as render(H + new) adds them. */
  const size_t n_old = n_h - n;
  if ((rc = sk_chat_render(conv->tmpl, h, n_old, false, &closed, err)) < 0) goto out;
  if (last_is_reply(conv)) {
    const char *r = h[n_old - 1].content;
    size_t rl = h[n_old - 1].content_len;
    while (rl && is_space(r[0])) r++, rl--;
    while (rl && is_space(r[rl - 1])) rl--;
    size_t after = closed.len; /* no reply text found: nothing to close */
    for (size_t i = closed.len >= rl ? closed.len - rl + 1 : 0; rl && i-- > 0;) {
      if (memcmp(closed.text + i, r, rl) == 0) {
        after = i + rl;
        break;
      }
    }
    if ((rc = slice(&closed, after, out, err)) < 0) goto out;
  }
  if (closed.len <= full.len &&
      (closed.len == 0 || memcmp(full.text, closed.text, closed.len) == 0)) {
    rc = slice(&full, closed.len, out, err);
  } else {
    sk_chat_text_reset(&full);
    if ((rc = sk_chat_render(conv->tmpl, msgs, n, true, &full, err)) == 0)
      rc = slice(&full, 0, out, err);
  }
  goto out;
oom:
  rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
out:
  free(cached);
  free(reply);
  free(h);
  sk_chat_text_free(&full);
  sk_chat_text_free(&closed);
  return rc;
}

int sk_conv_commit_prompt(struct sk_conv *conv, const struct sk_chat_msg *msgs, size_t n,
                          uint64_t n_seen, struct sk_error *err) {
  struct sk_conv_msg *m = calloc(n ? n : 1, sizeof *m);
  struct sk_chat_text t;
  sk_chat_text_init(&t);
  struct sk_chat_msg *h = NULL;
  size_t n_h = 0;
  if (!m) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  for (size_t i = 0; i < n; i++)
    if (msg_set(&m[i], msgs[i].role, msgs[i].role_len, msgs[i].content, msgs[i].content_len) < 0)
      goto oom;
  struct sk_conv tmp = *conv;
  tmp.msgs = m;
  tmp.n_msgs = n;
  if (history(&tmp, NULL, 0, NULL, 0, &h, &n_h) < 0) goto oom;
  if (sk_chat_render(conv->tmpl, h, n_h, true, &t, err) < 0) goto fail;
  free(h);
  msgs_free(conv);
  conv->msgs = m;
  conv->n_msgs = n;
  free(conv->text);
  conv->text = t.text; /* taken over */
  conv->text_len = t.len;
  t.text = NULL;
  sk_chat_text_free(&t);
  conv->n_seen = n_seen;
  if (conv->has_system) conv->system_sent = true;
  return 0;
oom:
  sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
fail:
  for (size_t i = 0; i < n; i++) msg_free(&m[i]);
  free(m);
  free(h);
  sk_chat_text_free(&t);
  return -err->code;
}

int sk_conv_commit_reply(struct sk_conv *conv, const char *reply, size_t len, uint64_t n_seen,
                         struct sk_error *err) {
  struct sk_conv_msg *m = realloc(conv->msgs, (conv->n_msgs + 1) * sizeof *m);
  if (!m) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  conv->msgs = m;
  memset(&m[conv->n_msgs], 0, sizeof *m);
  char *t = realloc(conv->text, conv->text_len + len + 1);
  if (!t || msg_set(&m[conv->n_msgs], "assistant", 9, reply, len) < 0) {
    if (t) conv->text = t;
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  conv->n_msgs++;
  conv->text = t;
  if (len) memcpy(conv->text + conv->text_len, reply, len);
  conv->text_len += len;
  conv->text[conv->text_len] = 0;
  conv->n_seen = n_seen;
  return 0;
}

/* ---- the file ---- */

struct wbuf {
  uint8_t *p;
  size_t len, cap;
  bool oom;
};

static void put(struct wbuf *b, const void *src, size_t n) {
  if (b->oom || n == 0) return; /* src may be NULL then */
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
}
static void put_u32(struct wbuf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
  put(b, x, 4);
}
static void put_u64(struct wbuf *b, uint64_t v) {
  put_u32(b, (uint32_t)v);
  put_u32(b, (uint32_t)(v >> 32));
}
static void put_str(struct wbuf *b, const char *s, size_t n) {
  put_u32(b, (uint32_t)n);
  put(b, s, n);
}

void sk_conv_file_name(char *buf, size_t size, uint64_t id) {
  snprintf(buf, size, "session-%" PRIu64 ".chat", id);
}

int sk_conv_save(const struct sk_conv *conv, int dirfd, uint64_t id, struct sk_error *err) {
  struct wbuf b = {0};
  put(&b, "SINKCHAT", 8);
  put_u32(&b, SK_CONV_FILE_VERSION);
  put_u32(&b, (uint32_t)conv->tmpl);
  put_u64(&b, conv->n_seen);
  put_u32(&b, (conv->has_system ? 1u : 0u) | (conv->system_sent ? 2u : 0u));
  put_u32(&b, (uint32_t)conv->n_msgs);
  put_str(&b, conv->system.content, conv->has_system ? conv->system.content_len : 0);
  put_str(&b, conv->text, conv->text_len);
  for (size_t i = 0; i < conv->n_msgs; i++) {
    put_str(&b, conv->msgs[i].role, conv->msgs[i].role_len);
    put_str(&b, conv->msgs[i].content, conv->msgs[i].content_len);
  }
  if (!b.oom) put_u64(&b, XXH3_64bits(b.p, b.len));
  if (b.oom) {
    free(b.p);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  char name[SK_CONV_NAME_MAX];
  sk_conv_file_name(name, sizeof name, id);
  int rc = sk_safefile_write(dirfd, name, 0600, b.p, b.len, err);
  free(b.p);
  return rc;
}

struct rbuf {
  const uint8_t *p;
  size_t len, pos;
  bool bad;
};

static uint32_t get_u32(struct rbuf *b) {
  if (b->bad || b->len - b->pos < 4) {
    b->bad = true;
    return 0;
  }
  const uint8_t *x = b->p + b->pos;
  b->pos += 4;
  return (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
}
static uint64_t get_u64(struct rbuf *b) {
  uint64_t lo = get_u32(b);
  return lo | (uint64_t)get_u32(b) << 32;
}
static const char *get_str(struct rbuf *b, size_t *ret_len) {
  uint32_t n = get_u32(b);
  if (b->bad || b->len - b->pos < n) {
    b->bad = true;
    *ret_len = 0;
    return "";
  }
  const char *s = (const char *)b->p + b->pos;
  b->pos += n;
  *ret_len = n;
  return s;
}

int sk_conv_load(struct sk_conv *conv, int dirfd, uint64_t id, struct sk_error *err) {
  char path[SK_CONV_NAME_MAX];
  sk_conv_file_name(path, sizeof path, id);
  char *file = NULL;
  size_t len = 0;
  int frc = sk_safefile_read(dirfd, path, SK_SAFEFILE_NOFOLLOW | SK_SAFEFILE_OWNED,
                             SK_LIMIT_CONV_FILE_BYTES, NULL, &file, &len, err);
  if (frc < 0) return errno == ENOENT ? 0 : frc;
  uint8_t *data = (uint8_t *)file;
  int rc = 0;
  struct rbuf b = {data, len, 0, false};
  struct sk_conv n;
  sk_conv_init(&n, SK_CHAT_NONE);
  if (len < 8 + 8 || memcmp(data, "SINKCHAT", 8) != 0) {
    rc = sk_error_set(err, SK_ERR_BAD_REQUEST, "%s: not a conversation file", path);
    goto out;
  }
  uint64_t sum = 0;
  memcpy(&sum, data + len - 8, 8); /* little-endian hosts only write it */
  if (sum != XXH3_64bits(data, len - 8)) {
    rc = sk_error_set(err, SK_ERR_BAD_REQUEST, "%s: checksum mismatch", path);
    goto out;
  }
  b.len = len - 8;
  b.pos = 8;
  uint32_t version = get_u32(&b);
  if (version != SK_CONV_FILE_VERSION) {
    rc = sk_error_set(err, SK_ERR_BAD_REQUEST, "%s: version %u, this daemon reads %u", path,
                      version, SK_CONV_FILE_VERSION);
    goto out;
  }
  uint32_t tmpl = get_u32(&b);
  n.tmpl = tmpl < SK_CHAT__COUNT ? (int)tmpl : SK_CHAT_NONE;
  n.n_seen = get_u64(&b);
  uint32_t flags = get_u32(&b);
  uint32_t n_msgs = get_u32(&b);
  size_t sl = 0, tl = 0;
  const char *sys = get_str(&b, &sl);
  const char *text = get_str(&b, &tl);
  if (b.bad || tmpl >= SK_CHAT__COUNT || n_msgs > SK_LIMIT_CONV_MSGS + 1 || (flags & ~3u) ||
      (!(flags & 1u) && sl)) {
    rc = sk_error_set(err, SK_ERR_BAD_REQUEST, "%s: bad header", path);
    goto out;
  }
  if ((flags & 1u) && sk_conv_set_system(&n, sys, sl, err) < 0) {
    rc = -SK_ERR_NO_MEMORY;
    goto out;
  }
  n.system_sent = (flags & 2u) != 0;
  n.text = malloc(tl + 1);
  n.msgs = calloc(n_msgs ? n_msgs : 1, sizeof *n.msgs);
  if (!n.text || !n.msgs) {
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  memcpy(n.text, text, tl);
  n.text[tl] = 0;
  n.text_len = tl;
  for (uint32_t i = 0; i < n_msgs; i++) {
    size_t rl = 0, cl = 0;
    const char *role = get_str(&b, &rl);
    const char *content = get_str(&b, &cl);
    if (b.bad) break;
    if (msg_set(&n.msgs[i], role, rl, content, cl) < 0) {
      rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
      goto out;
    }
    n.n_msgs++;
  }
  if (b.bad || b.pos != b.len) {
    rc = sk_error_set(err, SK_ERR_BAD_REQUEST, "%s: bad lengths", path);
    goto out;
  }
  sk_conv_free(conv);
  *conv = n;
  sk_conv_init(&n, SK_CHAT_NONE);
  rc = 1;
out:
  sk_conv_free(&n);
  free(data);
  return rc;
}

void sk_conv_remove(int dirfd, uint64_t id) {
  char name[SK_CONV_NAME_MAX];
  sk_conv_file_name(name, sizeof name, id);
  unlinkat(dirfd, name, 0);
}
