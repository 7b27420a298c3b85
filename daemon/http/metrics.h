/* The counters of the OpenAI gateway and the GET /metrics route, which
 * gives them with the daemon's figures (the stats op, on the request's
 * msgpack connection) and the transport's (httpd.h) in Prometheus' text
 * format 0.0.4 (prometheus.io, "Exposition formats").
 */
#ifndef SK_METRICS_H
#define SK_METRICS_H

#include <stdint.h>

#include "http/httpd.h"

/* The routes requests are counted by. */
enum sk_metrics_route {
  SK_ROUTE_MODELS,
  SK_ROUTE_COMPLETIONS,
  SK_ROUTE_CHAT,
  SK_ROUTE_HEALTH,
  SK_ROUTE_METRICS,
  SK_ROUTE_OTHER,
  SK_ROUTE__COUNT
};

/* Buckets of the time between two streamed tokens: bucket i counts gaps
 * <= 2^i ms, the last one all others. */
#define SK_METRICS_GAP_BUCKETS 12

struct sk_metrics {
  uint64_t requests[SK_ROUTE__COUNT];
  uint64_t prompt_tokens, completion_tokens;
  uint64_t evicted;           /* tokens evicted during HTTP requests */
  uint64_t token_gap_us[SK_METRICS_GAP_BUCKETS];
  uint64_t token_gap_sum_us, token_gap_count;
};

/* All counters 0. */
void sk_metrics_init(struct sk_metrics *m);
/* A request for route. */
void sk_metrics_request(struct sk_metrics *m, enum sk_metrics_route route);
/* gap_us microseconds between two tokens of one request. */
void sk_metrics_token_gap(struct sk_metrics *m, uint64_t gap_us);
/* A finished completion: its usage and the tokens its session evicted. */
void sk_metrics_usage(struct sk_metrics *m, uint64_t prompt_tokens, uint64_t completion_tokens,
                      uint64_t evicted);

/* Serves GET /metrics: asks the daemon for its stats, then answers with
 * them, m's counters and the transport's (200, text/plain); 503 if the
 * daemon does not answer. m must outlive the request. */
void sk_metrics_handle(struct sk_httpd_req *req, const struct sk_metrics *m);

#endif
