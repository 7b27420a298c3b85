/* OpenAI-compatible routes over the msgpack ops (openai.h). The shapes
 * follow OpenAI's API reference for /v1/completions and
 * /v1/chat/completions (objects "text_completion", "chat.completion",
 * "chat.completion.chunk"; server-sent events ending with "[DONE]"). */
#include "http/openai.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/http.h"
#include "http/oaiconv.h"
#include "http/oaireq.h"
#include "base/log.h"
#include "proto/msg.h"
#include "proto/wire.h"

/* ---- one completion ---- */

struct flow {
  struct sk_openai_params p;
  char id[40];
  int64_t created;
  uint64_t open_id, gen_id, session;
  bool temporary;
  bool started;           /* stream begun */
  bool id_sent;           /* a new session's id went out in a chunk */
  char *held;             /* (held_len) text not yet given out: may begin
                             a stop string */
  size_t held_len;
  char *text;             /* (text_len) the whole output (not streamed) */
  size_t text_len;
  bool stopped;           /* a stop string was found */
  size_t first_msg;       /* chat: the first message not yet in the session */
  uint64_t last_token_us;
};

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void flow_free(struct flow *f) {
  if (!f) return;
  sk_openai_params_free(&f->p);
  free(f->held);
  free(f->text);
  free(f);
}

/* Frees f, the request's flow. Responding finishes the request (and may
 * start the connection's next one, pipelined, on the same req): the
 * request's fields are cleared only while they are still f's. */
static void flow_end(struct sk_http_req *req, struct flow *f) {
  if (req->state == f) {
    req->state = NULL;
    req->on_frame = NULL;
    req->on_gone = NULL;
  }
  flow_free(f);
}

static void on_gone(struct sk_http_req *req) { flow_end(req, req->state); }

/* HTTP status for a protocol error code. */
static int status_of(const char *code) {
  static const struct { const char *code; int status; } map[] = {
      {"bad_request", 400}, {"context_full", 400}, {"too_large", 413},
      {"no_such_session", 404}, {"forbidden", 403}, {"busy", 429},
      {"unknown_op", 501}, {"no_memory", 507}, {"cancelled", 503},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strcmp(code, map[i].code) == 0) return map[i].status;
  return 500;
}

/* A failure of the request: an error response, or in a stream an error
 * event and the end. */
static void fail(struct sk_http_req *req, int status, const char *code, const char *message) {
  struct flow *f = req->state;
  if (f && f->started) {
    json_t *o = json_pack("{s:{s:s, s:s, s:s}}", "error", "message", message, "type",
                          status >= 500 ? "server_error" : "invalid_request_error", "code", code);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) sk_http_stream_event(req, s, strlen(s));
    free(s);
    sk_http_stream_end(req);
  } else {
    sk_http_error(req, status, code, "%s", message);
  }
  flow_end(req, f);
}

/* The error of a failed reply, as an HTTP failure. */
static void fail_reply(struct sk_http_req *req, const msgpack_object *map) {
  const msgpack_object *e = sk_msg_get(map, "error");
  const char *code = "internal", *text = "the daemon failed the request";
  size_t code_len = strlen(code), text_len = strlen(text);
  struct sk_error ign;
  if (e) {
    sk_msg_get_str(e, "code", &code, &code_len, &ign);
    sk_msg_get_str(e, "message", &text, &text_len, &ign);
  }
  char c[32], m[400];
  snprintf(c, sizeof c, "%.*s", (int)code_len, code);
  snprintf(m, sizeof m, "%.*s", (int)text_len, text);
  fail(req, status_of(c), c, m);
}

static bool reply_ok(const msgpack_object *map) {
  const msgpack_object *ok = sk_msg_get(map, "ok");
  return ok && ok->type == MSGPACK_OBJECT_BOOLEAN && ok->via.boolean;
}

/* The fields every response object and chunk starts with. */
static json_t *chunk_new(struct sk_http_req *req, struct flow *f) {
  return json_pack("{s:s, s:s, s:I, s:s}", "id", f->id, "object",
                   f->p.chat ? (f->p.stream ? "chat.completion.chunk" : "chat.completion")
                             : "text_completion",
                   "created", (json_int_t)f->created, "model",
                   sk_http_config(req->http)->model_name);
}

static void send_json_event(struct sk_http_req *req, json_t *o) {
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (s) sk_http_stream_event(req, s, strlen(s));
  free(s);
}

/* The first chunk of a stream that opened a session ("session": "new")
 * gives its id, so that a client that stops reading before the end still
 * knows the session it owns. */
static void add_new_session_id(struct flow *f, json_t *o) {
  if (f->p.session != SK_OPENAI_SESSION_NEW || f->id_sent) return;
  json_object_set_new(o, "sinkd", json_pack("{s:I}", "session", (json_int_t)f->session));
  f->id_sent = true;
}

/* A streamed piece of text. */
static void stream_text(struct sk_http_req *req, struct flow *f, const char *text, size_t len) {
  if (len == 0) return;
  json_t *o = chunk_new(req, f);
  add_new_session_id(f, o);
  json_t *s = json_stringn(text, len);
  if (!s) s = json_string(""); /* not UTF-8: cannot happen, tokens are completed */
  json_t *choice;
  if (f->p.chat)
    choice = json_pack("{s:i, s:{s:o}, s:n}", "index", 0, "delta", "content", s, "finish_reason");
  else
    choice = json_pack("{s:i, s:o, s:n, s:n}", "index", 0, "text", s, "logprobs",
                       "finish_reason");
  json_object_set_new(o, "choices", json_pack("[o]", choice));
  send_json_event(req, o);
}

/* Text for the client (after stop strings were looked for). */
static void emit(struct sk_http_req *req, struct flow *f, const char *text, size_t len) {
  if (f->p.stream) {
    stream_text(req, f, text, len);
    /* A chat's reply is kept too: it becomes part of the conversation. */
    if (!f->p.chat || f->p.session == SK_OPENAI_SESSION_NONE) return;
  }
  char *t = realloc(f->text, f->text_len + len + 1);
  if (!t) return;
  f->text = t;
  memcpy(f->text + f->text_len, text, len);
  f->text_len += len;
  f->text[f->text_len] = 0;
}

/* New generated text. OpenAI's output ends before a stop string while
 * sinkd's generate includes it: text that could begin a stop string is
 * held until it is known not to. */
static void add_text(struct sk_http_req *req, struct flow *f, const char *text, size_t len,
                     bool last) {
  if (f->stopped) return;
  if (f->p.n_stop == 0) {
    emit(req, f, text, len);
    return;
  }
  char *h = realloc(f->held, f->held_len + len + 1);
  if (!h) return;
  f->held = h;
  memcpy(f->held + f->held_len, text, len);
  f->held_len += len;
  /* The earliest stop string in the held text ends the output. */
  size_t cut = f->held_len;
  for (uint32_t i = 0; i < f->p.n_stop; i++) {
    const char *hit = memmem(f->held, f->held_len, f->p.stop[i], f->p.stop_len[i]);
    if (hit && (size_t)(hit - f->held) < cut) cut = (size_t)(hit - f->held);
  }
  if (cut < f->held_len) {
    emit(req, f, f->held, cut);
    f->held_len = 0;
    f->stopped = true;
    return;
  }
  /* Keep the longest tail that begins some stop string. */
  size_t keep = 0;
  if (!last)
    for (uint32_t i = 0; i < f->p.n_stop; i++) {
      size_t max = f->p.stop_len[i] - 1 < f->held_len ? f->p.stop_len[i] - 1 : f->held_len;
      for (size_t k = max; k > keep; k--)
        if (memcmp(f->held + f->held_len - k, f->p.stop[i], k) == 0) {
          keep = k;
          break;
        }
    }
  emit(req, f, f->held, f->held_len - keep);
  memmove(f->held, f->held + f->held_len - keep, keep);
  f->held_len = keep;
}

static json_t *sinkd_ext(struct flow *f, const msgpack_object *map) {
  uint64_t resident = 0, seen = 0, evicted = 0;
  struct sk_error ign;
  sk_msg_get_u64(map, "resident", UINT64_MAX, &resident, &ign);
  sk_msg_get_u64(map, "seen", UINT64_MAX, &seen, &ign);
  sk_msg_get_u64(map, "evicted", UINT64_MAX, &evicted, &ign);
  json_t *ranges = json_array();
  const msgpack_object_array *arr = NULL;
  if (sk_msg_get_array(map, "evicted_ranges", &arr, &ign) == 1)
    for (uint32_t i = 0; i < arr->size; i++) {
      const msgpack_object *r = &arr->ptr[i];
      if (r->type == MSGPACK_OBJECT_ARRAY && r->via.array.size == 2 &&
          r->via.array.ptr[0].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
          r->via.array.ptr[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        json_array_append_new(ranges, json_pack("[I, I]",
                                                (json_int_t)r->via.array.ptr[0].via.u64,
                                                (json_int_t)r->via.array.ptr[1].via.u64));
    }
  return json_pack("{s:I, s:I, s:I, s:I, s:o}", "session", (json_int_t)f->session, "resident",
                   (json_int_t)resident, "seen", (json_int_t)seen, "evicted",
                   (json_int_t)evicted, "evicted_ranges", ranges);
}

/* Closes the request's session now: the connection to the daemon may
 * serve the next request of a keep-alive connection, so a session closed
 * only with it would outlive the request. */
static void close_session(struct sk_http_req *req, struct flow *f) {
  struct sk_msgbuf b;
  if (sk_msgbuf_init(&b) < 0) return;
  sk_pack_kv_u64(&b.pk, "id", sk_http_next_id(req));
  sk_pack_kv_str(&b.pk, "op", "close");
  sk_pack_kv_u64(&b.pk, "session", f->session);
  struct sk_error e;
  sk_http_call(req, &b, &e);
}

/* The generate's final reply: the end of the response. */
static void finish(struct sk_http_req *req, struct flow *f, const msgpack_object *map) {
  struct sk_error ign;
  const char *text = NULL;
  size_t text_len = 0;
  if (sk_msg_get_str(map, "text", &text, &text_len, &ign) == 1 && text_len)
    add_text(req, f, text, text_len, true);
  else
    add_text(req, f, "", 0, true);
  const char *stop = "length";
  size_t stop_len = 6;
  sk_msg_get_str(map, "stop", &stop, &stop_len, &ign);
  const char *reason = f->stopped || (stop_len == 3 && memcmp(stop, "eos", 3) == 0) ||
                               (stop_len == 4 && memcmp(stop, "stop", 4) == 0) ||
                               (stop_len == 11 && memcmp(stop, "end_of_turn", 11) == 0)
                           ? "stop"
                           : "length";
  uint64_t prompt = 0, completion = 0, evicted = 0;
  const msgpack_object *usage = sk_msg_get(map, "usage");
  if (usage) {
    sk_msg_get_u64(usage, "prompt_tokens", UINT64_MAX, &prompt, &ign);
    sk_msg_get_u64(usage, "completion_tokens", UINT64_MAX, &completion, &ign);
  }
  sk_msg_get_u64(map, "evicted", UINT64_MAX, &evicted, &ign);
  struct sk_http_stats *st = sk_http_stats(req->http);
  st->prompt_tokens += prompt;
  st->completion_tokens += completion;
  st->evicted += evicted;
  json_t *usage_j = json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)prompt,
                              "completion_tokens", (json_int_t)completion, "total_tokens",
                              (json_int_t)(prompt + completion));
  /* Before the response: it may start the next pipelined request. */
  if (f->p.chat && f->p.session != SK_OPENAI_SESSION_NONE)
    sk_oaiconv_record(sk_http_convs(req->http), f->session, req->uid, f->p.messages,
                      f->text ? f->text : "", f->text_len);
  if (f->temporary) close_session(req, f);
  bool ext = f->p.session != SK_OPENAI_SESSION_NONE;
  if (f->p.stream) {
    json_t *o = chunk_new(req, f);
    json_t *choice = f->p.chat ? json_pack("{s:i, s:{}, s:s}", "index", 0, "delta",
                                           "finish_reason", reason)
                               : json_pack("{s:i, s:s, s:n, s:s}", "index", 0, "text", "",
                                           "logprobs", "finish_reason", reason);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (ext) json_object_set_new(o, "sinkd", sinkd_ext(f, map));
    send_json_event(req, o);
    if (f->p.include_usage) {
      o = chunk_new(req, f);
      json_object_set_new(o, "choices", json_array());
      json_object_set(o, "usage", usage_j);
      send_json_event(req, o);
    }
    json_decref(usage_j);
    sk_http_stream_event(req, "[DONE]", 6);
    sk_http_stream_end(req);
  } else {
    json_t *o = chunk_new(req, f);
    json_t *t = json_stringn(f->text ? f->text : "", f->text_len);
    if (!t) t = json_string("");
    json_t *choice = f->p.chat ? json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0,
                                           "message", "role", "assistant", "content", t,
                                           "logprobs", "finish_reason", reason)
                               : json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", t,
                                           "logprobs", "finish_reason", reason);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage_j);
    if (ext) json_object_set_new(o, "sinkd", sinkd_ext(f, map));
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) sk_http_respond(req, 200, "application/json", s, strlen(s));
    else sk_http_error(req, 500, "internal", "out of memory");
    free(s);
  }
  flow_end(req, f);
}

static void send_generate(struct sk_http_req *req, struct flow *f) {
  struct sk_msgbuf b;
  struct sk_error e;
  if (sk_msgbuf_init(&b) < 0) {
    fail(req, 507, "no_memory", "out of memory");
    return;
  }
  f->gen_id = sk_http_next_id(req);
  sk_pack_kv_u64(&b.pk, "id", f->gen_id);
  /* A chat request is the chat op: the session's chat template formats
   * the messages, as for protocol clients. */
  sk_pack_kv_str(&b.pk, "op", f->p.chat ? "chat" : "generate");
  sk_pack_kv_u64(&b.pk, "session", f->session);
  sk_pack_kv_u64(&b.pk, "max_tokens", f->p.max_tokens);
  /* top_p 0 keeps the most likely token only (OpenAI takes 0 to 1; the
   * generate op (0, 1]): greedy. */
  sk_pack_kv_f64(&b.pk, "temperature", f->p.top_p > 0 ? f->p.temperature : 0);
  sk_pack_kv_f64(&b.pk, "top_p", f->p.top_p > 0 ? f->p.top_p : 1);
  /* OpenAI has no top-k: off unless the request asks for it. */
  sk_pack_kv_u64(&b.pk, "top_k", f->p.has_top_k ? f->p.top_k : 0);
  if (f->p.has_seed) sk_pack_kv_u64(&b.pk, "seed", f->p.seed);
  if (f->p.n_stop) {
    sk_pack_cstr(&b.pk, "stop");
    msgpack_pack_array(&b.pk, f->p.n_stop);
    for (uint32_t i = 0; i < f->p.n_stop; i++) sk_pack_strn(&b.pk, f->p.stop[i], f->p.stop_len[i]);
  }
  if (f->p.chat) {
    f->first_msg = f->p.session == SK_OPENAI_SESSION_ID
                       ? sk_oaiconv_first_new(sk_http_convs(req->http), f->p.session_id,
                                              req->uid, f->p.messages)
                       : 0;
    sk_pack_cstr(&b.pk, "messages");
    msgpack_pack_array(&b.pk, (uint32_t)(json_array_size(f->p.messages) - f->first_msg));
    for (size_t i = f->first_msg; i < json_array_size(f->p.messages); i++) {
      json_t *m = json_array_get(f->p.messages, i);
      json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
      struct sk_wire_map mm;
      sk_wire_map_begin(&mm, &b.pk);
      sk_wire_map_strn(&mm, "role", json_string_value(role), json_string_length(role));
      if (json_is_string(content))
        sk_wire_map_strn(&mm, "content", json_string_value(content), json_string_length(content));
      else
        sk_wire_map_str(&mm, "content", "");
      if (sk_wire_map_end(&mm) < 0) {
        sk_msgbuf_free(&b);
        fail(req, 507, "no_memory", "out of memory");
        return;
      }
    }
  } else {
    sk_pack_kv_strn(&b.pk, "prompt", f->p.prompt ? f->p.prompt : "", f->p.prompt_len);
  }
  if (sk_http_call(req, &b, &e) < 0) fail(req, 503, "unavailable", e.message);
}

static void completion_frame(struct sk_http_req *req, uint64_t id, const msgpack_object *map) {
  struct flow *f = req->state;
  if (!map) {
    fail(req, 503, "unavailable", "the daemon closed the request's connection");
    return;
  }
  if (id == 0 && !reply_ok(map)) { /* refused as a client (max_clients) */
    fail_reply(req, map);
    return;
  }
  if (id == f->open_id) {
    if (!reply_ok(map)) {
      fail_reply(req, map);
      return;
    }
    struct sk_error ign;
    sk_msg_get_u64(map, "session", UINT64_MAX, &f->session, &ign);
    send_generate(req, f);
    return;
  }
  if (id != f->gen_id) return; /* e.g. the close of an earlier request */
  const char *ev = NULL;
  size_t ev_len = 0;
  struct sk_error ign;
  if (sk_msg_get_str(map, "event", &ev, &ev_len, &ign) == 1) {
    if (ev_len != 5 || memcmp(ev, "token", 5) != 0) return;
    uint64_t t = now_us();
    struct sk_http_stats *st = sk_http_stats(req->http);
    if (f->last_token_us) {
      uint64_t gap = t - f->last_token_us;
      uint32_t b = 0;
      while (b < 11 && gap > (1000ull << b)) b++;
      st->token_gap_us[b]++;
      st->token_gap_sum_us += gap;
      st->token_gap_count++;
    }
    f->last_token_us = t;
    if (f->p.stream && !f->started) {
      sk_http_stream_begin(req);
      f->started = true;
      if (f->p.chat) {
        /* OpenAI's first chunk gives the role. */
        json_t *o = chunk_new(req, f);
        json_object_set_new(o, "choices",
                            json_pack("[{s:i, s:{s:s, s:s}, s:n}]", "index", 0, "delta", "role",
                                      "assistant", "content", "", "finish_reason"));
        add_new_session_id(f, o);
        send_json_event(req, o);
      }
    }
    const char *text = NULL;
    size_t len = 0;
    if (sk_msg_get_str(map, "text", &text, &len, &ign) == 1) add_text(req, f, text, len, false);
    return;
  }
  if (!reply_ok(map)) {
    /* A failed generate ends the session this request opened: a
     * temporary one, or a new one whose id the client never got. */
    if (f->temporary || (f->p.session == SK_OPENAI_SESSION_NEW && !f->id_sent))
      close_session(req, f);
    fail_reply(req, map);
    return;
  }
  if (f->p.stream && !f->started) {
    sk_http_stream_begin(req);
    f->started = true;
  }
  finish(req, f, map);
}

static void handle_completion(struct sk_http_req *req, bool chat) {
  char msg[256];
  struct flow *f = calloc(1, sizeof *f);
  if (!f) {
    sk_http_error(req, 507, "no_memory", "out of memory");
    return;
  }
  int status = sk_openai_parse(req->body, req->body_len, chat, &f->p, msg, sizeof msg);
  if (status) {
    free(f);
    sk_http_error(req, status, "invalid_request", "%s", msg);
    return;
  }
  static uint64_t serial;
  snprintf(f->id, sizeof f->id, "%s-%" PRIu64, chat ? "chatcmpl" : "cmpl", ++serial);
  f->created = (int64_t)time(NULL);
  req->state = f;
  req->on_frame = completion_frame;
  req->on_gone = on_gone;
  if (f->p.session == SK_OPENAI_SESSION_ID) {
    f->session = f->p.session_id;
    send_generate(req, f);
    return;
  }
  struct sk_msgbuf b;
  struct sk_error e;
  if (sk_msgbuf_init(&b) < 0) {
    fail(req, 507, "no_memory", "out of memory");
    return;
  }
  f->temporary = f->p.session == SK_OPENAI_SESSION_NONE;
  f->open_id = sk_http_next_id(req);
  sk_pack_kv_u64(&b.pk, "id", f->open_id);
  sk_pack_kv_str(&b.pk, "op", "open");
  sk_pack_kv_bool(&b.pk, "temporary", f->temporary);
  if (f->p.policy) sk_pack_kv_str(&b.pk, "policy", f->p.policy);
  if (f->p.has_n_sink) sk_pack_kv_u64(&b.pk, "n_sink", f->p.n_sink);
  if (f->p.has_window) sk_pack_kv_u64(&b.pk, "window", f->p.window);
  if (f->p.has_heavy) sk_pack_kv_u64(&b.pk, "heavy", f->p.heavy);
  if (f->p.has_recent) sk_pack_kv_u64(&b.pk, "recent", f->p.recent);
  if (f->p.has_capacity) sk_pack_kv_u64(&b.pk, "capacity", f->p.capacity);
  if (sk_http_call(req, &b, &e) < 0) fail(req, 503, "unavailable", e.message);
}

/* ---- models, health, metrics ---- */

/* OpenAI's model object of the served model. */
static json_t *model_object(struct sk_http_req *req) {
  return json_pack("{s:s, s:s, s:i, s:s}", "id", sk_http_config(req->http)->model_name,
                   "object", "model", "created", 0, "owned_by", "sinkd");
}

static void handle_models(struct sk_http_req *req) {
  json_t *o = json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(req));
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (s) sk_http_respond(req, 200, "application/json", s, strlen(s));
  else sk_http_error(req, 500, "internal", "out of memory");
  free(s);
}

struct metrics_state {
  uint64_t id;
};

static void metrics_gone(struct sk_http_req *req) {
  free(req->state);
  req->state = NULL;
}

/* GET /v1/models/ID (OpenAI's "retrieve model"): the served model, or
 * 404 for any other id. */
static void handle_model(struct sk_http_req *req, const char *id) {
  const char *name = sk_http_config(req->http)->model_name;
  if (strcmp(id, name) != 0) {
    sk_http_error(req, 404, "model_not_found", "no model '%.200s': this daemon serves '%s'", id,
                  name);
    return;
  }
  json_t *o = model_object(req);
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (s) sk_http_respond(req, 200, "application/json", s, strlen(s));
  else sk_http_error(req, 500, "internal", "out of memory");
  free(s);
}

/* Appends a Prometheus sample (HELP and TYPE first). */
static void prom(char **buf, size_t *len, const char *name, const char *type, const char *help,
                 double value) {
  char line[512];
  int n = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                   type, name, value);
  if (n < 0) return;
  char *b = realloc(*buf, *len + (size_t)n + 1);
  if (!b) return;
  memcpy(b + *len, line, (size_t)n + 1);
  *buf = b;
  *len += (size_t)n;
}

static void metrics_frame(struct sk_http_req *req, uint64_t id, const msgpack_object *map) {
  struct metrics_state *ms = req->state;
  if (!map || (id == 0 && !reply_ok(map))) {
    metrics_gone(req);
    sk_http_error(req, 503, "unavailable", "the daemon did not answer");
    return;
  }
  if (id != ms->id) return;
  metrics_gone(req);
  if (!reply_ok(map)) {
    sk_http_error(req, 500, "internal", "stats failed");
    return;
  }
  struct sk_error ign;
  uint64_t v[8] = {0};
  static const char *const keys[8] = {"sessions", "clients", "tokens_prefilled",
                                      "tokens_generated", "memory_bytes", "max_memory",
                                      "steps", "uptime_s"};
  for (int i = 0; i < 8; i++) sk_msg_get_u64(map, keys[i], UINT64_MAX, &v[i], &ign);
  struct sk_http_stats *st = sk_http_stats(req->http);
  char *buf = NULL;
  size_t len = 0;
  prom(&buf, &len, "sinkd_sessions", "gauge", "Sessions open.", (double)v[0]);
  prom(&buf, &len, "sinkd_clients", "gauge", "Protocol connections (HTTP ones included).",
       (double)v[1]);
  prom(&buf, &len, "sinkd_tokens_prefilled_total", "counter", "Tokens appended (prefill).",
       (double)v[2]);
  prom(&buf, &len, "sinkd_tokens_generated_total", "counter", "Tokens generated.", (double)v[3]);
  prom(&buf, &len, "sinkd_memory_bytes", "gauge", "Bytes of all session KV caches.",
       (double)v[4]);
  prom(&buf, &len, "sinkd_max_memory_bytes", "gauge", "Limit of all KV caches (0: none).",
       (double)v[5]);
  prom(&buf, &len, "sinkd_steps_total", "counter", "Forward passes run.", (double)v[6]);
  prom(&buf, &len, "sinkd_uptime_seconds", "gauge", "Seconds since the daemon started.",
       (double)v[7]);
  static const char *const routes[SK_ROUTE__COUNT] = {"models", "completions", "chat",
                                                      "health", "metrics", "other"};
  char name[96];
  for (int r = 0; r < SK_ROUTE__COUNT; r++) {
    snprintf(name, sizeof name, "sinkd_http_requests_total{route=\"%s\"}", routes[r]);
    char line[512];
    int n = r == 0 ? snprintf(line, sizeof line,
                              "# HELP sinkd_http_requests_total HTTP requests by route.\n"
                              "# TYPE sinkd_http_requests_total counter\n%s %" PRIu64 "\n",
                              name, st->requests[r])
                   : snprintf(line, sizeof line, "%s %" PRIu64 "\n", name, st->requests[r]);
    char *b = n > 0 ? realloc(buf, len + (size_t)n + 1) : NULL;
    if (b) {
      memcpy(b + len, line, (size_t)n + 1);
      buf = b;
      len += (size_t)n;
    }
  }
  prom(&buf, &len, "sinkd_http_client_errors_total", "counter", "HTTP 4xx responses.",
       (double)st->responses_4xx);
  prom(&buf, &len, "sinkd_http_server_errors_total", "counter", "HTTP 5xx responses.",
       (double)st->responses_5xx);
  prom(&buf, &len, "sinkd_http_disconnects_total", "counter",
       "HTTP clients gone before their response ended (their generation cancelled).",
       (double)st->disconnects);
  prom(&buf, &len, "sinkd_http_prompt_tokens_total", "counter", "Prompt tokens of HTTP requests.",
       (double)st->prompt_tokens);
  prom(&buf, &len, "sinkd_http_completion_tokens_total", "counter",
       "Completion tokens of HTTP requests.", (double)st->completion_tokens);
  prom(&buf, &len, "sinkd_http_evicted_tokens_total", "counter",
       "Tokens evicted from caches during HTTP requests.", (double)st->evicted);
  /* The step latency as HTTP clients see it: time between two tokens. */
  const char *h = "# HELP sinkd_http_token_interval_seconds Time between two generated tokens "
                  "of one HTTP request.\n# TYPE sinkd_http_token_interval_seconds histogram\n";
  size_t hl = strlen(h);
  char *b = realloc(buf, len + hl + 1);
  if (b) {
    memcpy(b + len, h, hl + 1);
    buf = b;
    len += hl;
  }
  uint64_t cum = 0;
  for (int i = 0; i < 12; i++) {
    cum += st->token_gap_us[i];
    char line[512];
    int n = i < 11 ? snprintf(line, sizeof line,
                              "sinkd_http_token_interval_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
                              (double)(1u << i) / 1000.0, cum)
                   : snprintf(line, sizeof line,
                              "sinkd_http_token_interval_seconds_bucket{le=\"+Inf\"} %" PRIu64
                              "\nsinkd_http_token_interval_seconds_sum %.6f\n"
                              "sinkd_http_token_interval_seconds_count %" PRIu64 "\n",
                              cum, (double)st->token_gap_sum_us / 1e6, st->token_gap_count);
    b = n > 0 ? realloc(buf, len + (size_t)n + 1) : NULL;
    if (b) {
      memcpy(b + len, line, (size_t)n + 1);
      buf = b;
      len += (size_t)n;
    }
  }
  if (buf) sk_http_respond(req, 200, "text/plain; version=0.0.4", buf, len);
  else sk_http_error(req, 500, "internal", "out of memory");
  free(buf);
}

static void handle_metrics(struct sk_http_req *req) {
  struct metrics_state *ms = calloc(1, sizeof *ms);
  struct sk_msgbuf b;
  if (!ms || sk_msgbuf_init(&b) < 0) {
    free(ms);
    sk_http_error(req, 507, "no_memory", "out of memory");
    return;
  }
  ms->id = sk_http_next_id(req);
  req->state = ms;
  req->on_frame = metrics_frame;
  req->on_gone = metrics_gone;
  sk_pack_kv_u64(&b.pk, "id", ms->id);
  sk_pack_kv_str(&b.pk, "op", "stats");
  struct sk_error e;
  if (sk_http_call(req, &b, &e) < 0) {
    metrics_gone(req);
    sk_http_error(req, 503, "unavailable", "%s", e.message);
  }
}

void sk_openai_handle(struct sk_http_req *req) {
  static const struct {
    const char *path;
    enum sk_openai_route route;
    enum http_method_id method;
  } routes[] = {
      {"/v1/models", SK_ROUTE_MODELS, SK_HTTP_GET},
      {"/v1/completions", SK_ROUTE_COMPLETIONS, SK_HTTP_POST},
      {"/v1/chat/completions", SK_ROUTE_CHAT, SK_HTTP_POST},
      {"/health", SK_ROUTE_HEALTH, SK_HTTP_GET},
      {"/metrics", SK_ROUTE_METRICS, SK_HTTP_GET},
  };
  struct sk_http_stats *st = sk_http_stats(req->http);
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    if (strcmp(req->path, routes[i].path) != 0) continue;
    st->requests[routes[i].route]++;
    if (req->method != routes[i].method) {
      sk_http_error(req, 405, "method_not_allowed", "%s takes %s", routes[i].path,
                    routes[i].method == SK_HTTP_GET ? "GET" : "POST");
      return;
    }
    switch (routes[i].route) {
    case SK_ROUTE_MODELS: handle_models(req); return;
    case SK_ROUTE_COMPLETIONS: handle_completion(req, false); return;
    case SK_ROUTE_CHAT: handle_completion(req, true); return;
    case SK_ROUTE_HEALTH:
      /* The sockets accept only once the model is loaded; a daemon that
       * is stopping says so. */
      if (sk_http_stopping(req->http))
        sk_http_respond(req, 503, "application/json", "{\"status\":\"stopping\"}", 21);
      else
        sk_http_respond(req, 200, "application/json", "{\"status\":\"ok\"}", 15);
      return;
    case SK_ROUTE_METRICS: handle_metrics(req); return;
    default: break;
    }
  }
  static const char models[] = "/v1/models/";
  if (strncmp(req->path, models, sizeof models - 1) == 0 && req->path[sizeof models - 1]) {
    st->requests[SK_ROUTE_MODELS]++;
    if (req->method != SK_HTTP_GET)
      sk_http_error(req, 405, "method_not_allowed", "/v1/models/ID takes GET");
    else
      handle_model(req, req->path + sizeof models - 1);
    return;
  }
  st->requests[SK_ROUTE_OTHER]++;
  sk_http_error(req, 404, "not_found", "no route %s", req->path);
}
