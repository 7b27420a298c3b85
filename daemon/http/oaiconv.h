/* The conversation cache of the OpenAI gateway: what it remembers of
 * the conversations of persistent sessions, so that a chat request that
 * repeats the whole conversation (as OpenAI clients do) appends only its
 * new messages. Per session and uid: how many messages the conversation
 * holds (the assistant's replies included) and a hash of them as the
 * client sent and received them.
 *
 * Each uid has a table of its own, of at most SK_LIMIT_OPENAI_USER_CONVS
 * entries, made at its first record: the least recently used entry of
 * that uid makes room, so one uid's requests never evict another's
 * conversations. Memory: one table per uid that recorded a conversation
 * (SK_LIMIT_OPENAI_USER_CONVS x 40 bytes). No I/O.
 */
#ifndef SK_OAICONV_H
#define SK_OAICONV_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "sk_limits.h"

struct sk_oaiconv_entry {
  uint64_t session;   /* 0: free */
  uint32_t n_messages;
  uint64_t hash;      /* FNV-1a of role, 0, content, 0 per message */
  uint64_t used;      /* tick of its last use */
};

/* The conversations of one uid. */
struct sk_oaiconv_user {
  uint32_t uid;
  struct sk_oaiconv_entry e[SK_LIMIT_OPENAI_USER_CONVS];
};

struct sk_oaiconv {
  struct sk_oaiconv_user **users; /* (n_users) owned, in no order */
  uint32_t n_users, cap;
  uint64_t tick;
};

/* An empty cache (nothing allocated yet). */
void sk_oaiconv_init(struct sk_oaiconv *cv);
/* Frees every table; cv may be initialised again. */
void sk_oaiconv_free(struct sk_oaiconv *cv);

/* Where a chat request's new messages begin on session (acting as uid):
 * after the conversation the cache holds for it, when messages (a
 * checked request's array, oaireq.h) start by repeating it exactly;
 * else 0, all its messages are new (a client that sends only new ones). */
size_t sk_oaiconv_first_new(struct sk_oaiconv *cv, uint64_t session, uint32_t uid,
                            json_t *messages);

/* After a chat on session: its conversation is messages followed by the
 * assistant's reply (reply_len bytes) as the client got it. Out of
 * memory for the uid's first table: nothing is remembered (the next
 * request's messages are all taken as new). */
void sk_oaiconv_record(struct sk_oaiconv *cv, uint64_t session, uint32_t uid, json_t *messages,
                       const char *reply, size_t reply_len);

#endif
