/* Checking OpenAI request bodies (oaireq.h). Fields and defaults follow
 * OpenAI's API reference for /v1/completions and /v1/chat/completions;
 * "session", "policy" and the policy's sizes are sinkd's own
 * (sinkd-http(7)). */
#include "http/oaireq.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* OpenAI's default max_tokens of a completion. */
#define SK_OPENAI_DEFAULT_MAX_TOKENS 16u
/* A chat request without max_tokens: OpenAI's is "until the model
 * stops"; a bound keeps a model that never ends its turn from running
 * on forever. */
#define SK_OPENAI_CHAT_DEFAULT_MAX_TOKENS 4096u

static int bad(char *msg, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *msg, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, size, fmt, ap);
  va_end(ap);
  return 400;
}

/* An unsigned integer field (absent or null: *has false). */
static int get_uint(json_t *root, const char *key, uint64_t max, uint64_t *ret, bool *has,
                    char *msg, size_t size) {
  json_t *v = json_object_get(root, key);
  if (has) *has = false;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
    return bad(msg, size, "'%s' must be an integer from 0 to %" PRIu64, key, max);
  *ret = (uint64_t)json_integer_value(v);
  if (has) *has = true;
  return 0;
}

static int get_number(json_t *root, const char *key, double lo, double hi, double *ret,
                      char *msg, size_t size) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
    return bad(msg, size, "'%s' must be a number from %g to %g", key, lo, hi);
  *ret = json_number_value(v);
  return 0;
}

static int get_bool(json_t *root, const char *key, bool *ret, char *msg, size_t size) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return bad(msg, size, "'%s' must be true or false", key);
  *ret = json_is_true(v);
  return 0;
}

static int add_stop(struct sk_openai_params *p, json_t *s, char *msg, size_t size) {
  if (!json_is_string(s)) return bad(msg, size, "'stop' must be a string or an array of strings");
  size_t n = json_string_length(s);
  if (n == 0 || n > SK_LIMIT_OPENAI_STOP_BYTES)
    return bad(msg, size, "each 'stop' string must have 1 to %u bytes",
               SK_LIMIT_OPENAI_STOP_BYTES);
  if (p->n_stop == SK_LIMIT_OPENAI_STOPS)
    return bad(msg, size, "'stop' may have at most %u strings", SK_LIMIT_OPENAI_STOPS);
  p->stop[p->n_stop] = json_string_value(s);
  p->stop_len[p->n_stop++] = n;
  return 0;
}

void sk_openai_params_free(struct sk_openai_params *p) {
  json_decref(p->root);
  memset(p, 0, sizeof *p);
}

/* A message's content given as parts ([{"type": "text", "text": ...}],
 * as OpenAI's API allows): replaced in m by the parts' texts joined. Other
 * part types (images, audio) are refused. */
static int join_parts(json_t *m, json_t *parts, size_t i, char *msg, size_t size) {
  size_t len = 0, k;
  json_t *part;
  json_array_foreach(parts, k, part) {
    json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
    if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
        !json_is_string(text))
      return bad(msg, size, "'messages[%zu].content[%zu]' must be {\"type\": \"text\", "
                 "\"text\": STRING}: sinkd takes text only", i, k);
    len += json_string_length(text);
  }
  char *joined = malloc(len + 1);
  if (!joined) return bad(msg, size, "out of memory");
  len = 0;
  json_array_foreach(parts, k, part) {
    json_t *text = json_object_get(part, "text");
    memcpy(joined + len, json_string_value(text), json_string_length(text));
    len += json_string_length(text);
  }
  json_t *s = json_stringn_nocheck(joined, len);
  free(joined);
  if (!s || json_object_set_new(m, "content", s) < 0) return bad(msg, size, "out of memory");
  return 0;
}

/* The input: a chat's messages (text parts joined) or a completion's
 * prompt. */
static int parse_input(json_t *r, struct sk_openai_params *p, char *msg, size_t size) {
  if (!p->chat) {
    json_t *prompt = json_object_get(r, "prompt");
    if (json_is_array(prompt) && json_array_size(prompt) == 1)
      prompt = json_array_get(prompt, 0);
    if (!json_is_string(prompt))
      return bad(msg, size, "'prompt' must be a string (or an array of one string)");
    p->prompt = json_string_value(prompt);
    p->prompt_len = json_string_length(prompt);
    return 0;
  }
  p->messages = json_object_get(r, "messages");
  if (!json_is_array(p->messages) || json_array_size(p->messages) == 0)
    return bad(msg, size, "'messages' must be a non-empty array");
  size_t i;
  json_t *m;
  json_array_foreach(p->messages, i, m) {
    json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    if (!json_is_object(m) || !json_is_string(role))
      return bad(msg, size, "'messages[%zu]' must be an object with a string 'role'", i);
    int rc;
    if (json_is_array(content) && (rc = join_parts(m, content, i, msg, size))) return rc;
    content = json_object_get(m, "content");
    if (content && !json_is_string(content) && !json_is_null(content))
      return bad(msg, size, "'messages[%zu].content' must be a string or an array of text parts",
                 i);
  }
  return 0;
}

/* Log-probabilities: a chat's "logprobs" (bool) and "top_logprobs" (0 to
 * 20, with logprobs), a completion's "logprobs" (0 to 20: the most likely
 * tokens besides the one chosen). */
static int parse_logprobs(json_t *r, struct sk_openai_params *p, char *msg, size_t size) {
  int rc;
  uint64_t top = 0;
  bool has_top = false;
  if (p->chat) {
    if ((rc = get_bool(r, "logprobs", &p->logprobs, msg, size))) return rc;
    if ((rc = get_uint(r, "top_logprobs", SK_LIMIT_OPENAI_TOP_LOGPROBS, &top, &has_top, msg,
                       size)))
      return rc;
    if (has_top && !p->logprobs)
      return bad(msg, size, "'top_logprobs' needs \"logprobs\": true");
  } else {
    if ((rc = get_uint(r, "logprobs", SK_LIMIT_OPENAI_TOP_LOGPROBS, &top, &has_top, msg, size)))
      return rc;
    p->logprobs = has_top;
  }
  p->top_logprobs = (uint32_t)top;
  return 0;
}

/* How to generate: n, max_tokens, sampling, stop strings, streaming. */
static int parse_sampling(json_t *r, struct sk_openai_params *p, char *msg, size_t size) {
  json_t *n = json_object_get(r, "n");
  if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1))
    return bad(msg, size, "'n' must be 1: sinkd returns one choice per request");
  p->max_tokens = p->chat ? SK_OPENAI_CHAT_DEFAULT_MAX_TOKENS : SK_OPENAI_DEFAULT_MAX_TOKENS;
  bool has = false;
  int rc;
  if ((rc = get_uint(r, "max_tokens", SK_LIMIT_OPENAI_MAX_TOKENS, &p->max_tokens, &has, msg,
                     size)))
    return rc;
  if ((rc = get_uint(r, "max_completion_tokens", SK_LIMIT_OPENAI_MAX_TOKENS, &p->max_tokens,
                     &has, msg, size)))
    return rc;
  p->temperature = 1.0; /* OpenAI's defaults */
  p->top_p = 1.0;
  if ((rc = get_number(r, "temperature", 0, 2, &p->temperature, msg, size))) return rc;
  if ((rc = get_number(r, "top_p", 0, 1, &p->top_p, msg, size))) return rc;
  json_t *seed = json_object_get(r, "seed");
  if (seed && !json_is_null(seed)) {
    if (!json_is_integer(seed)) return bad(msg, size, "'seed' must be an integer");
    p->has_seed = true;
    p->seed = (uint64_t)json_integer_value(seed); /* negative: its two's complement */
  }
  if ((rc = get_uint(r, "top_k", UINT32_MAX, &p->top_k, &p->has_top_k, msg, size))) return rc;
  json_t *stop = json_object_get(r, "stop");
  if (json_is_array(stop)) {
    size_t i;
    json_t *s;
    json_array_foreach(stop, i, s) if ((rc = add_stop(p, s, msg, size))) return rc;
  } else if (stop && !json_is_null(stop) && (rc = add_stop(p, stop, msg, size))) {
    return rc;
  }
  if ((rc = get_bool(r, "stream", &p->stream, msg, size))) return rc;
  json_t *so = json_object_get(r, "stream_options");
  if (so && !json_is_null(so)) {
    if (!json_is_object(so)) return bad(msg, size, "'stream_options' must be an object");
    const char *key;
    json_t *v;
    json_object_foreach(so, key, v) if (strcmp(key, "include_usage") != 0) return bad(
        msg, size, "'stream_options.%.64s' is not a field sinkd takes (only include_usage)", key);
    if ((rc = get_bool(so, "include_usage", &p->include_usage, msg, size))) return rc;
    if (!p->stream && p->include_usage)
      return bad(msg, size, "'stream_options' goes with \"stream\": true");
  }
  return parse_logprobs(r, p, msg, size);
}

/* ---- the fields a request may have ----
 * Every field of a request body is on this list, or the request is
 * refused with 400 naming it: a client that asks for something sinkd
 * does not do (tools, another response format, penalties) learns so
 * rather than getting an answer that silently ignored it. */

enum { ROUTE_COMPL = 1, ROUTE_CHAT = 2, ROUTE_BOTH = 3 };

/* Whether v is the value that asks for nothing: null, 0, false, "", an
 * empty array or object. */
static bool neutral(json_t *v) {
  return json_is_null(v) || json_is_false(v) ||
         (json_is_number(v) && json_number_value(v) == 0) ||
         (json_is_string(v) && json_string_length(v) == 0) ||
         (json_is_array(v) && json_array_size(v) == 0) ||
         (json_is_object(v) && json_object_size(v) == 0);
}

static bool is_one(json_t *v) {
  return json_is_null(v) || (json_is_integer(v) && json_integer_value(v) == 1);
}

static bool is_text_format(json_t *v) {
  json_t *t = json_object_get(v, "type");
  return json_is_null(v) ||
         (json_is_object(v) && json_object_size(v) == 1 && json_is_string(t) &&
          strcmp(json_string_value(t), "text") == 0);
}

static bool is_none_choice(json_t *v) {
  return json_is_null(v) || (json_is_string(v) && strcmp(json_string_value(v), "none") == 0);
}

static bool is_text_modalities(json_t *v) {
  json_t *m = json_array_get(v, 0);
  return json_is_null(v) || (json_is_array(v) && json_array_size(v) == 1 && json_is_string(m) &&
                             strcmp(json_string_value(m), "text") == 0);
}

static const struct field {
  const char *name;
  unsigned routes;
  bool (*only)(json_t *v); /* NULL: any value (checked where it is read, or
                              meaningless here); else the one value taken */
  const char *why;         /* what the refusal says of another value */
} fields[] = {
    /* implemented (read below) */
    {"model", ROUTE_BOTH, NULL, NULL},
    {"prompt", ROUTE_COMPL, NULL, NULL},
    {"messages", ROUTE_CHAT, NULL, NULL},
    {"max_tokens", ROUTE_BOTH, NULL, NULL},
    {"max_completion_tokens", ROUTE_CHAT, NULL, NULL},
    {"temperature", ROUTE_BOTH, NULL, NULL},
    {"top_p", ROUTE_BOTH, NULL, NULL},
    {"top_k", ROUTE_BOTH, NULL, NULL},
    {"seed", ROUTE_BOTH, NULL, NULL},
    {"stop", ROUTE_BOTH, NULL, NULL},
    {"stream", ROUTE_BOTH, NULL, NULL},
    {"stream_options", ROUTE_BOTH, NULL, NULL},
    {"logprobs", ROUTE_BOTH, NULL, NULL},
    {"top_logprobs", ROUTE_CHAT, NULL, NULL},
    {"n", ROUTE_BOTH, NULL, NULL},
    {"session", ROUTE_BOTH, NULL, NULL},
    {"policy", ROUTE_BOTH, NULL, NULL},
    {"n_sink", ROUTE_BOTH, NULL, NULL},
    {"window", ROUTE_BOTH, NULL, NULL},
    {"heavy", ROUTE_BOTH, NULL, NULL},
    {"recent", ROUTE_BOTH, NULL, NULL},
    {"capacity", ROUTE_BOTH, NULL, NULL},
    {"speculation", ROUTE_BOTH, NULL, NULL},
    {"draft_tokens", ROUTE_BOTH, NULL, NULL},
    {"draft_fixed", ROUTE_BOTH, NULL, NULL},
    /* meaningless for a local daemon: taken and ignored */
    {"user", ROUTE_BOTH, NULL, NULL},
    {"safety_identifier", ROUTE_CHAT, NULL, NULL},
    {"prompt_cache_key", ROUTE_CHAT, NULL, NULL},
    {"store", ROUTE_CHAT, NULL, NULL},
    {"metadata", ROUTE_CHAT, NULL, NULL},
    {"service_tier", ROUTE_CHAT, NULL, NULL},
    {"parallel_tool_calls", ROUTE_CHAT, NULL, NULL},
    /* not implemented: only the value that asks for nothing */
    {"presence_penalty", ROUTE_BOTH, neutral, "sinkd has no penalties: only 0"},
    {"frequency_penalty", ROUTE_BOTH, neutral, "sinkd has no penalties: only 0"},
    {"logit_bias", ROUTE_BOTH, neutral, "sinkd has no logit bias: only {}"},
    {"echo", ROUTE_COMPL, neutral, "the prompt is not echoed: only false"},
    {"best_of", ROUTE_COMPL, is_one, "only 1"},
    {"suffix", ROUTE_COMPL, neutral, "sinkd does not insert text: only \"\""},
    {"response_format", ROUTE_CHAT, is_text_format,
     "sinkd writes text only: {\"type\": \"text\"}"},
    {"tools", ROUTE_CHAT, neutral, "sinkd has no tool calls: only []"},
    {"tool_choice", ROUTE_CHAT, is_none_choice, "sinkd has no tool calls: only \"none\""},
    {"functions", ROUTE_CHAT, neutral, "sinkd has no function calls: only []"},
    {"function_call", ROUTE_CHAT, is_none_choice,
     "sinkd has no function calls: only \"none\""},
    {"modalities", ROUTE_CHAT, is_text_modalities, "sinkd writes text only: [\"text\"]"},
};

/* Every field of r on the route's list, with a value it takes. */
static int check_fields(json_t *r, bool chat, char *msg, size_t size) {
  const char *key;
  json_t *v;
  json_object_foreach(r, key, v) {
    const struct field *f = NULL;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0] && !f; i++)
      if ((fields[i].routes & (chat ? ROUTE_CHAT : ROUTE_COMPL)) &&
          strcmp(fields[i].name, key) == 0)
        f = &fields[i];
    if (!f)
      return bad(msg, size,
                 "'%.64s' is not a field sinkd takes on %s (sinkd-http(7) lists them)", key,
                 chat ? "/v1/chat/completions" : "/v1/completions");
    if (f->only && !f->only(v)) return bad(msg, size, "'%s': %s", key, f->why);
  }
  return 0;
}

/* sinkd's fields: the session to use, or the policy of a new one. */
static int parse_session(json_t *r, struct sk_openai_params *p, char *msg, size_t size) {
  json_t *sess = json_object_get(r, "session");
  if (sess && !json_is_null(sess)) {
    if (json_is_string(sess) && strcmp(json_string_value(sess), "new") == 0) {
      p->session = SK_OPENAI_SESSION_NEW;
    } else if (json_is_integer(sess) && json_integer_value(sess) > 0) {
      p->session = SK_OPENAI_SESSION_ID;
      p->session_id = (uint64_t)json_integer_value(sess);
    } else {
      return bad(msg, size, "'session' must be a session id (a positive integer) or \"new\"");
    }
  }
  json_t *pol = json_object_get(r, "policy");
  if (pol && !json_is_null(pol)) {
    if (!json_is_string(pol)) return bad(msg, size, "'policy' must be a string");
    p->policy = json_string_value(pol);
  }
  int rc;
  if ((rc = get_uint(r, "n_sink", UINT32_MAX, &p->n_sink, &p->has_n_sink, msg, size))) return rc;
  if ((rc = get_uint(r, "window", UINT32_MAX, &p->window, &p->has_window, msg, size))) return rc;
  if ((rc = get_uint(r, "heavy", UINT32_MAX, &p->heavy, &p->has_heavy, msg, size))) return rc;
  if ((rc = get_uint(r, "recent", UINT32_MAX, &p->recent, &p->has_recent, msg, size))) return rc;
  if ((rc = get_uint(r, "capacity", UINT32_MAX, &p->capacity, &p->has_capacity, msg, size)))
    return rc;
  json_t *spec = json_object_get(r, "speculation");
  if (spec && !json_is_null(spec)) {
    if (!json_is_string(spec)) return bad(msg, size, "'speculation' must be a string");
    p->speculation = json_string_value(spec);
  }
  if ((rc = get_uint(r, "draft_tokens", SK_SPEC_TOKENS_MAX, &p->draft_tokens,
                     &p->has_draft_tokens, msg, size)) ||
      (p->has_draft_tokens && p->draft_tokens == 0))
    return bad(msg, size, "'draft_tokens' must be an integer from 1 to %u", SK_SPEC_TOKENS_MAX);
  json_t *fixed = json_object_get(r, "draft_fixed");
  p->has_draft_fixed = fixed && !json_is_null(fixed);
  if ((rc = get_bool(r, "draft_fixed", &p->draft_fixed, msg, size))) return rc;
  if (p->session == SK_OPENAI_SESSION_ID &&
      (p->policy || p->has_n_sink || p->has_window || p->has_heavy || p->has_recent ||
       p->has_capacity))
    return bad(msg, size, "policy fields go with \"session\": \"new\" (or none), not with an "
                          "existing session");
  return 0;
}

int sk_openai_parse(const char *body, size_t len, bool chat, struct sk_openai_params *p,
                    char *msg, size_t size) {
  memset(p, 0, sizeof *p);
  p->chat = chat;
  json_error_t je;
  /* Depth is bounded by jansson (JSON_PARSER_MAX_DEPTH, 2048). */
  p->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!p->root && json_error_code(&je) == json_error_null_character)
    return bad(msg, size, "invalid JSON at byte %d: a string holds \\u0000 (NUL), which sinkd "
               "does not take", je.position);
  if (!p->root) return bad(msg, size, "invalid JSON at byte %d: %s", je.position, je.text);
  int rc = 0;
  json_t *r = p->root;
  json_t *model = json_object_get(r, "model");
  if (!json_is_object(r))
    rc = bad(msg, size, "the request body must be a JSON object");
  else if (model && !json_is_string(model))
    rc = bad(msg, size, "'model' must be a string");
  else if (!(rc = check_fields(r, chat, msg, size)) && !(rc = parse_input(r, p, msg, size)) &&
           !(rc = parse_sampling(r, p, msg, size)))
    rc = parse_session(r, p, msg, size);
  if (rc) sk_openai_params_free(p);
  return rc;
}
