/* The conversation cache (oaiconv.h). Hashes are 64-bit FNV-1a (Fowler,
 * Noll, Vo; offset basis 14695981039346656037, prime 1099511628211). */
#include "http/oaiconv.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(uint64_t h, const char *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
  return (h ^ 0) * 1099511628211ull; /* the terminating 0 */
}

static uint64_t hash_message(uint64_t h, const char *role, size_t role_len, const char *content,
                             size_t content_len) {
  return hash_bytes(hash_bytes(h, role, role_len), content, content_len);
}

/* The hash of the first n messages. */
static uint64_t hash_messages(json_t *messages, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(messages, i);
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    h = hash_message(h, json_string_value(role), json_string_length(role),
                     json_is_string(content) ? json_string_value(content) : "",
                     json_is_string(content) ? json_string_length(content) : 0);
  }
  return h;
}

/* The table of uid, or NULL; made if `make` (NULL when out of memory). */
static struct sk_oaiconv_user *user_of(struct sk_oaiconv *cv, uint32_t uid, bool make) {
  for (uint32_t i = 0; i < cv->n_users; i++)
    if (cv->users[i]->uid == uid) return cv->users[i];
  if (!make) return NULL;
  if (cv->n_users == cv->cap) {
    uint32_t cap = cv->cap ? cv->cap * 2 : 8;
    struct sk_oaiconv_user **u = realloc(cv->users, cap * sizeof *u);
    if (!u) return NULL;
    cv->users = u;
    cv->cap = cap;
  }
  struct sk_oaiconv_user *u = calloc(1, sizeof *u);
  if (!u) return NULL;
  u->uid = uid;
  cv->users[cv->n_users++] = u;
  return u;
}

static struct sk_oaiconv_entry *find(struct sk_oaiconv_user *u, uint64_t session) {
  for (uint32_t i = 0; u && i < SK_LIMIT_OPENAI_USER_CONVS; i++)
    if (u->e[i].session == session) return &u->e[i];
  return NULL;
}

void sk_oaiconv_init(struct sk_oaiconv *cv) { memset(cv, 0, sizeof *cv); }

void sk_oaiconv_free(struct sk_oaiconv *cv) {
  for (uint32_t i = 0; i < cv->n_users; i++) free(cv->users[i]);
  free(cv->users);
  memset(cv, 0, sizeof *cv);
}

size_t sk_oaiconv_first_new(struct sk_oaiconv *cv, uint64_t session, uint32_t uid,
                            json_t *messages) {
  struct sk_oaiconv_entry *c = find(user_of(cv, uid, false), session);
  size_t n = json_array_size(messages);
  if (!c || c->n_messages >= n || hash_messages(messages, c->n_messages) != c->hash) return 0;
  c->used = ++cv->tick;
  return c->n_messages;
}

void sk_oaiconv_record(struct sk_oaiconv *cv, uint64_t session, uint32_t uid, json_t *messages,
                       const char *reply, size_t reply_len) {
  struct sk_oaiconv_user *u = user_of(cv, uid, true);
  if (!u) return;
  struct sk_oaiconv_entry *c = find(u, session);
  if (!c) { /* a free entry of the uid's, or its least recently used one */
    c = &u->e[0];
    for (uint32_t i = 0; i < SK_LIMIT_OPENAI_USER_CONVS && c->session; i++)
      if (!u->e[i].session || u->e[i].used < c->used) c = &u->e[i];
  }
  size_t n = json_array_size(messages);
  c->session = session;
  c->n_messages = (uint32_t)n + 1;
  c->hash = hash_message(hash_messages(messages, n), "assistant", 9, reply, reply_len);
  c->used = ++cv->tick;
}
