/* The gateway's counters and GET /metrics (metrics.h). */
#include "http/metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

void sk_metrics_init(struct sk_metrics *m) { memset(m, 0, sizeof *m); }

void sk_metrics_request(struct sk_metrics *m, enum sk_metrics_route route) {
  m->requests[route]++;
}

void sk_metrics_token_gap(struct sk_metrics *m, uint64_t gap_us) {
  uint32_t b = 0;
  while (b < SK_METRICS_GAP_BUCKETS - 1 && gap_us > (1000ull << b)) b++;
  m->token_gap_us[b]++;
  m->token_gap_sum_us += gap_us;
  m->token_gap_count++;
}

void sk_metrics_usage(struct sk_metrics *m, uint64_t prompt_tokens, uint64_t completion_tokens,
                      uint64_t evicted) {
  m->prompt_tokens += prompt_tokens;
  m->completion_tokens += completion_tokens;
  m->evicted += evicted;
}

/* ---- the text ---- */

/* The response body being written; a piece that does not fit in memory
 * is left out. */
struct text {
  char *buf;
  size_t len;
};

static void put(struct text *t, const char *s, int n) {
  if (n <= 0) return;
  char *b = realloc(t->buf, t->len + (size_t)n + 1);
  if (!b) return;
  memcpy(b + t->len, s, (size_t)n + 1);
  t->buf = b;
  t->len += (size_t)n;
}

/* A Prometheus sample (HELP and TYPE first). */
static void prom(struct text *t, const char *name, const char *type, const char *help,
                 double value) {
  char line[512];
  int n = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                   type, name, value);
  if (n >= 0) put(t, line, n);
}

/* The daemon's figures, from its stats reply. */
static void put_daemon(struct text *t, const struct sk_daemon_stats *d) {
  prom(t, "sinkd_sessions", "gauge", "Sessions open.", (double)d->sessions);
  prom(t, "sinkd_clients", "gauge", "Protocol connections (HTTP ones included).",
       (double)d->clients);
  prom(t, "sinkd_tokens_prefilled_total", "counter", "Tokens appended (prefill).",
       (double)d->tokens_prefilled);
  prom(t, "sinkd_tokens_generated_total", "counter", "Tokens generated.",
       (double)d->tokens_generated);
  prom(t, "sinkd_memory_bytes", "gauge", "Bytes of all session KV caches.",
       (double)d->memory_bytes);
  prom(t, "sinkd_max_memory_bytes", "gauge", "Limit of all KV caches (0: none).",
       (double)d->max_memory);
  prom(t, "sinkd_steps_total", "counter", "Forward passes run.", (double)d->steps);
  prom(t, "sinkd_uptime_seconds", "gauge", "Seconds since the daemon started.",
       (double)d->uptime_s);
  const struct sk_spec_info *sp = &d->speculation;
  prom(t, "sinkd_spec_drafted_tokens_total", "counter",
       "Tokens speculative decoding proposed and the model checked.", (double)sp->drafted);
  prom(t, "sinkd_spec_accepted_tokens_total", "counter",
       "Proposed tokens the model kept.", (double)sp->accepted);
  prom(t, "sinkd_spec_rejected_tokens_total", "counter",
       "Proposed tokens the model refused.", (double)sp->rejected);
  prom(t, "sinkd_spec_acceptance_ratio", "gauge",
       "Accepted over drafted tokens since start (0 before any).", sp->acceptance);
}

/* Requests by route, then the transport's and the gateway's counters. */
static void put_http(struct text *t, const struct sk_metrics *m, const struct sk_httpd_stats *hs) {
  static const char *const routes[SK_ROUTE__COUNT] = {"models", "completions", "chat",
                                                      "health", "metrics", "other"};
  char name[96], line[512];
  for (int r = 0; r < SK_ROUTE__COUNT; r++) {
    snprintf(name, sizeof name, "sinkd_http_requests_total{route=\"%s\"}", routes[r]);
    int n = r == 0 ? snprintf(line, sizeof line,
                              "# HELP sinkd_http_requests_total HTTP requests by route.\n"
                              "# TYPE sinkd_http_requests_total counter\n%s %" PRIu64 "\n",
                              name, m->requests[r])
                   : snprintf(line, sizeof line, "%s %" PRIu64 "\n", name, m->requests[r]);
    put(t, line, n);
  }
  prom(t, "sinkd_http_client_errors_total", "counter", "HTTP 4xx responses.",
       (double)hs->responses_4xx);
  prom(t, "sinkd_http_server_errors_total", "counter", "HTTP 5xx responses.",
       (double)hs->responses_5xx);
  prom(t, "sinkd_http_disconnects_total", "counter",
       "HTTP clients gone before their response ended (their generation cancelled).",
       (double)hs->disconnects);
  prom(t, "sinkd_http_prompt_tokens_total", "counter", "Prompt tokens of HTTP requests.",
       (double)m->prompt_tokens);
  prom(t, "sinkd_http_completion_tokens_total", "counter", "Completion tokens of HTTP requests.",
       (double)m->completion_tokens);
  prom(t, "sinkd_http_evicted_tokens_total", "counter",
       "Tokens evicted from caches during HTTP requests.", (double)m->evicted);
}

/* The step latency as HTTP clients see it: time between two tokens, as
 * a histogram (cumulative buckets, sum and count). */
static void put_token_gaps(struct text *t, const struct sk_metrics *m) {
  const char *h = "# HELP sinkd_http_token_interval_seconds Time between two generated tokens "
                  "of one HTTP request.\n# TYPE sinkd_http_token_interval_seconds histogram\n";
  put(t, h, (int)strlen(h));
  uint64_t cum = 0;
  for (int i = 0; i < SK_METRICS_GAP_BUCKETS; i++) {
    cum += m->token_gap_us[i];
    char line[512];
    int n = i < SK_METRICS_GAP_BUCKETS - 1
                ? snprintf(line, sizeof line,
                           "sinkd_http_token_interval_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
                           (double)(1u << i) / 1000.0, cum)
                : snprintf(line, sizeof line,
                           "sinkd_http_token_interval_seconds_bucket{le=\"+Inf\"} %" PRIu64
                           "\nsinkd_http_token_interval_seconds_sum %.6f\n"
                           "sinkd_http_token_interval_seconds_count %" PRIu64 "\n",
                           cum, (double)m->token_gap_sum_us / 1e6, m->token_gap_count);
    put(t, line, n);
  }
}

/* ---- the route ---- */

/* A /metrics request waiting for the stats reply. */
struct metrics_call {
  uint64_t id;
  const struct sk_metrics *m;
};

static void metrics_end(struct sk_httpd_req *req, struct metrics_call *mc) {
  sk_httpd_unbind(req, mc);
  free(mc);
}

static bool metrics_gone(struct sk_httpd_req *req, void *state) {
  metrics_end(req, state);
  return false;
}

/* Whether a reply says "ok": true. */
static bool reply_ok(const msgpack_object *map) {
  bool ok = false;
  struct sk_error ign;
  return sk_wire_unpack_ok(map, &ok, &ign) == 0 && ok;
}

static void metrics_frame(struct sk_httpd_req *req, void *state, uint64_t id,
                          const msgpack_object *map) {
  struct metrics_call *mc = state;
  if (!map || (id == 0 && !reply_ok(map))) {
    metrics_end(req, mc);
    sk_httpd_error(req, 503, "unavailable", "the daemon did not answer");
    return;
  }
  if (id != mc->id) return;
  const struct sk_metrics *m = mc->m;
  metrics_end(req, mc);
  struct sk_daemon_stats d;
  struct sk_error e;
  if (!reply_ok(map)) {
    sk_httpd_error(req, 500, "internal", "stats failed");
    return;
  }
  if (sk_wire_unpack_daemon_stats(map, &d, &e) < 0) {
    sk_httpd_error(req, 500, "internal", "stats: %s", e.message);
    return;
  }
  struct text t = {NULL, 0};
  put_daemon(&t, &d);
  put_http(&t, m, sk_httpd_stats(req->httpd));
  put_token_gaps(&t, m);
  if (t.buf) sk_httpd_respond(req, 200, "text/plain; version=0.0.4", t.buf, t.len);
  else sk_httpd_error(req, 500, "internal", "out of memory");
  free(t.buf);
}

void sk_metrics_handle(struct sk_httpd_req *req, const struct sk_metrics *m) {
  struct metrics_call *mc = calloc(1, sizeof *mc);
  if (!mc) {
    sk_httpd_error(req, 507, "no_memory", "out of memory");
    return;
  }
  mc->id = sk_httpd_next_id(req);
  mc->m = m;
  struct sk_msgbuf b;
  if (sk_wire_pack_req(&b, mc->id, SK_OP_STATS) < 0) {
    free(mc);
    sk_httpd_error(req, 507, "no_memory", "out of memory");
    return;
  }
  sk_httpd_bind(req, metrics_frame, metrics_gone, mc);
  struct sk_error e;
  if (sk_httpd_call(req, &b, &e) < 0) {
    metrics_end(req, mc);
    sk_httpd_error(req, 503, "unavailable", "%s", e.message);
  }
}
