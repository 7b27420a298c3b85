/* The OpenAI-compatible routes of the HTTP front end (sinkd-http(7)):
 * GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
 * GET /health, GET /metrics. Requests are checked (oaireq.h) and then
 * run as msgpack ops on the request's own connection into the server
 * (http.h): open (a temporary session unless the request names one),
 * generate, close.
 */
#ifndef SK_OPENAI_H
#define SK_OPENAI_H

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


/* Serves one request (http.c calls it with a complete request). */
void sk_openai_handle(struct sk_http_req *req);

#endif
