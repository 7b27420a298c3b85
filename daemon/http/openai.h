/* The OpenAI-compatible routes of the HTTP front end (sinkd-http(7)):
 * GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
 * GET /health, GET /metrics. Requests are checked here (JSON with
 * jansson; every field's type and range) and then run as msgpack ops on
 * the request's own connection into the server (http.h): open (a
 * temporary session unless the request names one), generate, close.
 */
#ifndef SK_OPENAI_H
#define SK_OPENAI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sk_limits.h"

struct sk_http_req;

enum sk_openai_route {
  SK_ROUTE_MODELS,
  SK_ROUTE_COMPLETIONS,
  SK_ROUTE_CHAT,
  SK_ROUTE_HEALTH,
  SK_ROUTE_METRICS,
  SK_ROUTE_OTHER,
  SK_ROUTE__COUNT
};


/* What the HTTP front end remembers of the conversations of persistent
 * sessions, so that a chat request that repeats the whole conversation
 * (as OpenAI clients do) appends only its new messages: per session,
 * how many messages the conversation holds (the assistant's replies
 * included) and a hash of them as the client sent and received them. */
struct sk_openai_conv {
  uint64_t session;   /* 0: free */
  uint32_t uid;
  uint32_t n_messages;
  uint64_t hash;      /* FNV-1a of role, 0, content, 0 per message */
  uint64_t used;      /* tick of its last use */
};
struct sk_openai_convs {
  struct sk_openai_conv e[SK_LIMIT_OPENAI_CONVS];
  uint64_t tick;
};

/* A checked completion or chat request. Strings point into root. */
struct sk_openai_params {
  json_t *root;                /* owned */
  bool chat;
  const char *prompt;          /* completions */
  size_t prompt_len;
  json_t *messages;            /* chat: the array (borrowed from root) */
  uint64_t max_tokens;
  double temperature, top_p;
  bool has_seed;
  uint64_t seed;
  bool has_top_k;
  uint64_t top_k;
  const char *stop[SK_LIMIT_OPENAI_STOPS];
  size_t stop_len[SK_LIMIT_OPENAI_STOPS];
  uint32_t n_stop;
  bool stream, include_usage;
  enum { SK_OPENAI_SESSION_NONE, SK_OPENAI_SESSION_NEW, SK_OPENAI_SESSION_ID } session;
  uint64_t session_id;
  /* "new" session (or the temporary one): the open op's fields. */
  const char *policy;
  uint64_t n_sink, window, heavy, recent, capacity;
  bool has_n_sink, has_window, has_heavy, has_recent, has_capacity;
};

/* Checks a request body (JSON). chat: a chat request (messages) rather
 * than a completion (prompt). Returns 0 with *p filled (free with
 * sk_openai_params_free), or an HTTP status (400) with msg saying which
 * field is wrong and why. */
int sk_openai_parse(const char *body, size_t len, bool chat, struct sk_openai_params *p,
                    char *msg, size_t msg_size);
void sk_openai_params_free(struct sk_openai_params *p);

/* Serves one request (http.c calls it with a complete request). */
void sk_openai_handle(struct sk_http_req *req);

#endif
