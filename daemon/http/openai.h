/* The OpenAI-compatible gateway (sinkd-http(7)), the route handler of the
 * HTTP transport (httpd.h): GET /v1/models and /v1/models/ID, POST
 * /v1/completions and /v1/chat/completions (oaicompl.h), GET /health
 * and GET /metrics (metrics.h). It owns what the routes keep between
 * requests: the model's name, the counters and the conversation cache.
 */
#ifndef SK_OPENAI_H
#define SK_OPENAI_H

#include "http/httpd.h"

struct sk_openai;

/* A gateway serving the model named model_name (copied; NULL: "sinkd").
 * Returns 0, or -SK_ERR_NO_MEMORY. */
int sk_openai_new(const char *model_name, struct sk_openai **ret);
/* After the transport it served was freed. o may be NULL. */
void sk_openai_free(struct sk_openai *o);

/* The route handler (sk_httpd_route_fn): user is the gateway. Serves one
 * complete request; unknown paths get 404, a route's other methods 405. */
void sk_openai_handle(struct sk_httpd_req *req, void *user);

#endif
