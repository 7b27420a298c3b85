#include "net/admit.h"

#include <stdlib.h>
#include <string.h>

void sk_admit_init(struct sk_admit *a) { memset(a, 0, sizeof *a); }

void sk_admit_free(struct sk_admit *a) {
  free(a->users);
  memset(a, 0, sizeof *a);
}

uint32_t sk_admit_root_reserve(uint32_t max_clients) {
  uint32_t half = max_clients / 2;
  return half < SK_LIMIT_ROOT_CLIENTS ? half : SK_LIMIT_ROOT_CLIENTS;
}

/* The entry of uid, or NULL. Linear: a machine has few users connected
 * at once, and the lookup runs once per connect and per read. */
static struct sk_admit_user *sk__admit_find(const struct sk_admit *a, uint32_t uid) {
  for (uint32_t i = 0; i < a->n; i++)
    if (a->users[i].uid == uid) return &a->users[i];
  return NULL;
}

/* A new entry for uid, or NULL (out of memory). */
static struct sk_admit_user *sk__admit_new(struct sk_admit *a, uint32_t uid) {
  if (a->n == a->cap) {
    uint32_t cap = a->cap ? a->cap * 2 : 16;
    struct sk_admit_user *users = realloc(a->users, cap * sizeof *users);
    if (!users) return NULL;
    a->users = users;
    a->cap = cap;
  }
  struct sk_admit_user *u = &a->users[a->n++];
  *u = (struct sk_admit_user){.uid = uid};
  return u;
}

int sk_admit_conn_add(struct sk_admit *a, const struct sk_admit_limits *l, uint32_t uid,
                      struct sk_error *err) {
  if (a->conns >= l->max_clients)
    return sk_error_set(err, SK_ERR_BUSY, "too many clients (max_clients %u)", l->max_clients);
  struct sk_admit_user *u = sk__admit_find(a, uid);
  if (uid != 0) {
    uint32_t reserve = sk_admit_root_reserve(l->max_clients);
    if (a->conns_nonroot >= l->max_clients - reserve)
      return sk_error_set(err, SK_ERR_BUSY,
                          "too many clients: uid %u would be client %u of max_clients %u, "
                          "whose last %u are kept for root",
                          uid, a->conns_nonroot + 1, l->max_clients, reserve);
    if (l->max_user_clients && u && u->conns >= l->max_user_clients)
      return sk_error_set(err, SK_ERR_BUSY,
                          "uid %u already has %u connections (max_user_clients %u)", uid,
                          u->conns, l->max_user_clients);
  }
  if (!u && !(u = sk__admit_new(a, uid))) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  u->conns++;
  a->conns++;
  if (uid != 0) a->conns_nonroot++;
  return 0;
}

int sk_admit_hold(struct sk_admit *a, uint32_t uid, struct sk_error *err) {
  struct sk_admit_user *u = sk__admit_find(a, uid);
  if (!u && !(u = sk__admit_new(a, uid))) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  u->holds++;
  return 0;
}

void sk_admit_conn_remove(struct sk_admit *a, uint32_t uid, uint64_t input_bytes, bool held) {
  struct sk_admit_user *u = sk__admit_find(a, uid);
  if (!u) return;
  u->input_bytes -= input_bytes;
  a->input_bytes -= input_bytes;
  if (held) {
    u->holds--;
  } else {
    u->conns--;
    a->conns--;
    if (uid != 0) a->conns_nonroot--;
  }
  if (u->conns == 0 && u->holds == 0) *u = a->users[--a->n];
}

int sk_admit_input(struct sk_admit *a, const struct sk_admit_limits *l, uint32_t uid,
                   uint64_t from, uint64_t to, struct sk_error *err) {
  struct sk_admit_user *u = sk__admit_find(a, uid);
  if (!u) return sk_error_set(err, SK_ERR_INTERNAL, "uid %u has no connection", uid);
  if (to > from) {
    uint64_t grow = to - from;
    if (l->max_user_input && u->input_bytes + grow > l->max_user_input)
      return sk_error_set(err, SK_ERR_BUSY,
                          "input memory: uid %u's unfinished requests would hold %llu bytes "
                          "(max_user_input_memory %llu)",
                          uid, (unsigned long long)(u->input_bytes + grow),
                          (unsigned long long)l->max_user_input);
    if (l->max_input && a->input_bytes + grow > l->max_input)
      return sk_error_set(err, SK_ERR_BUSY,
                          "input memory: unfinished requests of all clients would hold %llu "
                          "bytes (max_input_memory %llu); uid %u's request refused",
                          (unsigned long long)(a->input_bytes + grow),
                          (unsigned long long)l->max_input, uid);
  }
  u->input_bytes = u->input_bytes - from + to;
  a->input_bytes = a->input_bytes - from + to;
  return 0;
}

uint32_t sk_admit_user_conns(const struct sk_admit *a, uint32_t uid) {
  const struct sk_admit_user *u = sk__admit_find(a, uid);
  return u ? u->conns : 0;
}

bool sk_admit_refusal_log(struct sk_admit *a, uint32_t uid, uint64_t now_ms,
                          uint32_t *ret_unreported) {
  struct sk_admit_refusal *r = NULL, *oldest = &a->refusals[0];
  for (uint32_t i = 0; i < SK_LIMIT_REFUSAL_LOG_UIDS; i++) {
    struct sk_admit_refusal *x = &a->refusals[i];
    if (x->reported_ms && x->uid == uid) r = x;
    if (x->reported_ms < oldest->reported_ms) oldest = x;
  }
  *ret_unreported = 0;
  if (r && now_ms - r->reported_ms < SK_LIMIT_REFUSAL_LOG_MS) {
    r->unreported++;
    return false;
  }
  if (r) *ret_unreported = r->unreported;
  else r = oldest; /* a free entry, or the one reported longest ago */
  *r = (struct sk_admit_refusal){.uid = uid, .unreported = 0,
                                 .reported_ms = now_ms ? now_ms : 1};
  return true;
}
