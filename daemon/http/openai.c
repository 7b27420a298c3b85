/* The OpenAI gateway's routes (openai.h). Shapes follow OpenAI's API
 * reference ("The model object", "List models", "Retrieve model"). */
#include "http/openai.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "http/metrics.h"
#include "http/oaicompl.h"

struct sk_openai {
  char *model_name;
  struct sk_metrics metrics;
  /* The completion routes' state, with the conversation cache. */
  struct sk_oaicompl completions;
};

int sk_openai_new(const char *model_name, struct sk_openai **ret) {
  struct sk_openai *o = calloc(1, sizeof *o);
  if (!o) return -SK_ERR_NO_MEMORY;
  o->model_name = strdup(model_name ? model_name : "sinkd");
  if (!o->model_name) {
    free(o);
    return -SK_ERR_NO_MEMORY;
  }
  sk_metrics_init(&o->metrics);
  sk_oaicompl_init(&o->completions, o->model_name, &o->metrics);
  *ret = o;
  return 0;
}

void sk_openai_free(struct sk_openai *o) {
  if (!o) return;
  sk_oaicompl_free(&o->completions);
  free(o->model_name);
  free(o);
}

/* Sends o as the JSON body of a 200 response (taking o). */
static void respond_json(struct sk_httpd_req *req, json_t *o) {
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (s) sk_httpd_respond(req, 200, "application/json", s, strlen(s));
  else sk_httpd_error(req, 500, "internal", "out of memory");
  free(s);
}

/* OpenAI's model object of the served model. */
static json_t *model_object(const struct sk_openai *o) {
  return json_pack("{s:s, s:s, s:i, s:s}", "id", o->model_name, "object", "model", "created", 0,
                   "owned_by", "sinkd");
}

/* GET /v1/models: the list of the one model served. */
static void handle_models(struct sk_httpd_req *req, const struct sk_openai *o) {
  respond_json(req, json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(o)));
}

/* GET /v1/models/ID (OpenAI's "retrieve model"): the served model, or
 * 404 for any other id. */
static void handle_model(struct sk_httpd_req *req, const struct sk_openai *o, const char *id) {
  if (strcmp(id, o->model_name) != 0) {
    sk_httpd_error(req, 404, "model_not_found", "no model '%.200s': this daemon serves '%s'", id,
                   o->model_name);
    return;
  }
  respond_json(req, model_object(o));
}

/* GET /health. The sockets accept only once the model is loaded; a
 * daemon that is stopping says so. */
static void handle_health(struct sk_httpd_req *req) {
  if (sk_httpd_stopping(req->httpd))
    sk_httpd_respond(req, 503, "application/json", "{\"status\":\"stopping\"}", 21);
  else
    sk_httpd_respond(req, 200, "application/json", "{\"status\":\"ok\"}", 15);
}

void sk_openai_handle(struct sk_httpd_req *req, void *user) {
  struct sk_openai *o = user;
  static const struct {
    const char *path;
    enum sk_metrics_route route;
    enum sk_httpd_method method;
  } routes[] = {
      {"/v1/models", SK_ROUTE_MODELS, SK_HTTPD_GET},
      {"/v1/completions", SK_ROUTE_COMPLETIONS, SK_HTTPD_POST},
      {"/v1/chat/completions", SK_ROUTE_CHAT, SK_HTTPD_POST},
      {"/health", SK_ROUTE_HEALTH, SK_HTTPD_GET},
      {"/metrics", SK_ROUTE_METRICS, SK_HTTPD_GET},
  };
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    if (strcmp(req->path, routes[i].path) != 0) continue;
    sk_metrics_request(&o->metrics, routes[i].route);
    if (req->method != routes[i].method) {
      sk_httpd_error(req, 405, "method_not_allowed", "%s takes %s", routes[i].path,
                     routes[i].method == SK_HTTPD_GET ? "GET" : "POST");
      return;
    }
    switch (routes[i].route) {
    case SK_ROUTE_MODELS: handle_models(req, o); return;
    case SK_ROUTE_COMPLETIONS: sk_oaicompl_start(req, &o->completions, false); return;
    case SK_ROUTE_CHAT: sk_oaicompl_start(req, &o->completions, true); return;
    case SK_ROUTE_HEALTH: handle_health(req); return;
    case SK_ROUTE_METRICS: sk_metrics_handle(req, &o->metrics); return;
    default: break;
    }
  }
  static const char models[] = "/v1/models/";
  if (strncmp(req->path, models, sizeof models - 1) == 0 && req->path[sizeof models - 1]) {
    sk_metrics_request(&o->metrics, SK_ROUTE_MODELS);
    if (req->method != SK_HTTPD_GET)
      sk_httpd_error(req, 405, "method_not_allowed", "/v1/models/ID takes GET");
    else
      handle_model(req, o, req->path + sizeof models - 1);
    return;
  }
  sk_metrics_request(&o->metrics, SK_ROUTE_OTHER);
  sk_httpd_error(req, 404, "not_found", "no route %s", req->path);
}
