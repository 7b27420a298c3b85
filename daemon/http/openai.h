/* The OpenAI-compatible routes of the HTTP front end (sinkd-http(7)):
 * GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
 * GET /health, GET /metrics. Requests are checked (oaireq.h) and then
 * run as msgpack ops on the request's own connection into the server
 * (http.h): open (a temporary session unless the request names one),
 * generate, close.
 */
#ifndef SK_OPENAI_H
#define SK_OPENAI_H

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

/* Serves one request (http.c calls it with a complete request). */
void sk_openai_handle(struct sk_http_req *req);

#endif
