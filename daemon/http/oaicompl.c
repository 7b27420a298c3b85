/* A completion request's flow (oaicompl.h): the ops it sends, the
 * replies and events it reads, and the response or event stream it
 * writes. */
#include "http/oaicompl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/oailogprobs.h"
#include "http/oaireq.h"
#include "proto/wire.h"

/* A token's log-probabilities waiting for its text to go out (a stop
 * string may still cut it): its entry (oailogprobs.h), where its text
 * begins and ends in the generated text (bytes), and its text_offset. */
struct lp_pending {
  json_t *entry;
  size_t start, end;
  uint64_t offset;
};

/* One request's flow, bound to the request (sk_httpd_bind). */
struct flow {
  struct sk_openai_params p;
  struct sk_oaicompl *oc;
  char id[40];
  int64_t created;
  uint64_t open_id, gen_id, close_id, session;
  bool temporary;
  bool abandoned;         /* the client left before it got the id of the
                             session this request opened: closing it */
  bool started;           /* stream begun */
  bool id_sent;           /* a new session's id went out in a chunk */
  char *held;             /* (held_len) text not yet given out: may begin
                             a stop string */
  size_t held_len;
  char *text;             /* (text_len) the whole output (not streamed) */
  size_t text_len;
  bool stopped;           /* a stop string was found */
  uint64_t last_token_us;
  /* logprobs: the entries of tokens whose text has not all gone out */
  struct lp_pending *lp;  /* (n_lp, lp_cap) */
  size_t n_lp, lp_cap;
  size_t received;        /* bytes of generated text so far */
  uint64_t received_chars;
  size_t emitted;         /* bytes of it given to the client */
};

void sk_oaicompl_init(struct sk_oaicompl *oc, const char *model_name,
                      struct sk_metrics *metrics) {
  oc->model_name = model_name;
  oc->metrics = metrics;
  sk_oaiconv_init(&oc->convs);
  oc->serial = 0;
}

void sk_oaicompl_free(struct sk_oaicompl *oc) { sk_oaiconv_free(&oc->convs); }

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void flow_free(struct flow *f) {
  if (!f) return;
  for (size_t i = 0; i < f->n_lp; i++) json_decref(f->lp[i].entry);
  free(f->lp);
  sk_openai_params_free(&f->p);
  free(f->held);
  free(f->text);
  free(f);
}

/* Frees f, the request's flow. Responding finishes the request (and may
 * start the connection's next one, pipelined, on the same req): the
 * binding ends only while it is still f's. */
static void flow_end(struct sk_httpd_req *req, struct flow *f) {
  sk_httpd_unbind(req, f);
  flow_free(f);
}

static void close_session(struct sk_httpd_req *req, struct flow *f);

/* The client left. A session it asked for ("session": "new") whose id it
 * never got is closed: nobody else could ever use or close it (it would
 * count against the uid's sessions until the idle TTL). The request
 * stays on its daemon connection until the open's reply (if it is still
 * on its way) and the close's reply are in (abandoned_frame). */
static bool on_gone(struct sk_httpd_req *req, void *state) {
  struct flow *f = state;
  if (f->p.session == SK_OPENAI_SESSION_NEW && !f->id_sent && f->open_id) {
    f->abandoned = true;
    if (f->session) close_session(req, f);
    return true;
  }
  flow_end(req, f);
  return false;
}

/* A frame after the client left (on_gone): the open's reply gives the
 * session to close; the close's reply ends the request. */
static void abandoned_frame(struct sk_httpd_req *req, struct flow *f, uint64_t id,
                            const msgpack_object *map) {
  if (!map) { /* the transport ended it: nothing more can be sent */
    flow_free(f);
    return;
  }
  struct sk_error e;
  struct sk_open_result o;
  bool done = false;
  if (id == f->open_id && !f->session) {
    bool ok = false;
    if (sk_wire_unpack_ok(map, &ok, &e) < 0 || !ok || sk_wire_unpack_open(map, &o, &e) < 0) {
      done = true; /* no session was made */
    } else {
      f->session = o.session;
      close_session(req, f);
    }
  } else if (id == 0 || (f->close_id && id == f->close_id)) {
    done = true; /* closed (or refused as a client: nothing to close) */
  }
  if (done) {
    sk_httpd_release(req);
    flow_free(f);
  }
}

/* ---- failures ---- */

/* HTTP status for a protocol error code. */
static int status_of(int code) {
  switch (code) {
  case SK_ERR_BAD_REQUEST: return 400;
  case SK_ERR_CONTEXT_FULL: return 400;
  case SK_ERR_TOO_LARGE: return 413;
  case SK_ERR_NO_SUCH_SESSION: return 404;
  case SK_ERR_FORBIDDEN: return 403;
  case SK_ERR_BUSY: return 429;
  case SK_ERR_UNKNOWN_OP: return 501;
  case SK_ERR_NO_MEMORY: return 507;
  case SK_ERR_CANCELLED: return 503;
  default: return 500;
  }
}

/* A failure of the request: an error response, or in a stream an error
 * event (the same error object) and the end. Ends the flow. */
static void fail(struct sk_httpd_req *req, struct flow *f, int status, const char *code,
                 const char *message) {
  if (f->started) {
    json_t *o = sk_httpd_error_json(status, code, message);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (s) sk_httpd_stream_event(req, s, strlen(s));
    free(s);
    sk_httpd_stream_end(req);
  } else {
    sk_httpd_error(req, status, code, "%s", message);
  }
  flow_end(req, f);
}

/* The error of a failed reply, as an HTTP failure: the protocol's code
 * (its name) and message. */
static void fail_reply(struct sk_httpd_req *req, struct flow *f, const msgpack_object *map) {
  struct sk_error e;
  sk_wire_unpack_error(map, &e);
  fail(req, f, status_of(e.code), sk_error_name(e.code), e.message);
}

/* A reply the daemon should not have sent. */
static void fail_protocol(struct sk_httpd_req *req, struct flow *f, const struct sk_error *e) {
  fail(req, f, 500, "internal", e->message);
}

/* Whether a reply says "ok": true. */
static bool reply_ok(const msgpack_object *map) {
  bool ok = false;
  struct sk_error ign;
  return sk_wire_unpack_ok(map, &ok, &ign) == 0 && ok;
}

/* ---- the response's text ---- */

/* The fields every response object and chunk starts with. */
static json_t *chunk_new(const struct flow *f) {
  return json_pack("{s:s, s:s, s:I, s:s}", "id", f->id, "object",
                   f->p.chat ? (f->p.stream ? "chat.completion.chunk" : "chat.completion")
                             : "text_completion",
                   "created", (json_int_t)f->created, "model", f->oc->model_name);
}

static void send_json_event(struct sk_httpd_req *req, json_t *o) {
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (s) sk_httpd_stream_event(req, s, strlen(s));
  free(s);
}

/* ---- log-probabilities ---- */

/* A token event's entry, queued until its text goes out. */
static void lp_push(struct flow *f, const struct sk_token_event *ev) {
  if (f->n_lp == f->lp_cap) {
    size_t cap = f->lp_cap ? 2 * f->lp_cap : 16;
    struct lp_pending *p = realloc(f->lp, cap * sizeof *p);
    if (!p) return;
    f->lp = p;
    f->lp_cap = cap;
  }
  json_t *e = sk_oailp_entry(ev);
  if (!e) return;
  f->lp[f->n_lp++] = (struct lp_pending){e, f->received, f->received + ev->text_len,
                                         f->received_chars};
}

/* The logprobs of the tokens whose text went out (final: and of those
 * it went into, ending a response that a stop string cut), in the
 * route's shape; taken from the queue. JSON null when the request did
 * not ask for them. */
static json_t *lp_take(struct flow *f, bool final) {
  if (!f->p.logprobs) return json_null();
  json_t *entries = json_array(), *offsets = json_array();
  size_t n = 0;
  while (n < f->n_lp && (f->lp[n].end <= f->emitted || (final && f->lp[n].start < f->emitted))) {
    json_array_append_new(entries, f->lp[n].entry);
    json_array_append_new(offsets, json_integer((json_int_t)f->lp[n].offset));
    n++;
  }
  if (final)
    for (size_t i = n; i < f->n_lp; i++) json_decref(f->lp[i].entry); /* after the stop */
  f->n_lp = final ? 0 : f->n_lp - n;
  memmove(f->lp, f->lp + (final ? f->n_lp : n), f->n_lp * sizeof *f->lp);
  if (f->p.chat) {
    json_decref(offsets);
    return sk_oailp_chat(entries);
  }
  return sk_oailp_completion(entries, offsets);
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
static void stream_text(struct sk_httpd_req *req, struct flow *f, const char *text, size_t len) {
  if (len == 0) return;
  json_t *o = chunk_new(f);
  add_new_session_id(f, o);
  json_t *s = json_stringn(text, len);
  if (!s) s = json_string(""); /* not UTF-8: cannot happen, tokens are completed */
  json_t *choice;
  if (f->p.chat)
    choice = json_pack("{s:i, s:{s:o}, s:o, s:n}", "index", 0, "delta", "content", s,
                       "logprobs", lp_take(f, false), "finish_reason");
  else
    choice = json_pack("{s:i, s:o, s:o, s:n}", "index", 0, "text", s, "logprobs",
                       lp_take(f, false), "finish_reason");
  json_object_set_new(o, "choices", json_pack("[o]", choice));
  send_json_event(req, o);
}

/* Text for the client (after stop strings were looked for). */
static void emit(struct sk_httpd_req *req, struct flow *f, const char *text, size_t len) {
  f->emitted += len;
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
static void add_text(struct sk_httpd_req *req, struct flow *f, const char *text, size_t len,
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

/* sinkd's figures of the session after the generate's final reply. */
static json_t *sinkd_ext(const struct flow *f, const struct sk_generate_result *g) {
  json_t *ranges = json_array();
  for (size_t i = 0; i < g->n_ranges; i++)
    json_array_append_new(ranges, json_pack("[I, I]", (json_int_t)g->ranges[i].first,
                                            (json_int_t)g->ranges[i].last));
  return json_pack("{s:I, s:I, s:I, s:I, s:o}", "session", (json_int_t)f->session, "resident",
                   (json_int_t)g->resident, "seen", (json_int_t)g->seen, "evicted",
                   (json_int_t)g->evicted, "evicted_ranges", ranges);
}

/* ---- the ops ---- */

/* Closes the request's session now: the connection to the daemon may
 * serve the next request of a keep-alive connection, so a session closed
 * only with it would outlive the request. */
static void close_session(struct sk_httpd_req *req, struct flow *f) {
  struct sk_msgbuf b;
  f->close_id = sk_httpd_next_id(req);
  if (sk_wire_pack_session_req(&b, f->close_id, SK_OP_CLOSE, f->session) < 0) return;
  struct sk_error e;
  sk_httpd_call(req, &b, &e);
}

/* The last event of a stream: the finish reason (and sinkd's figures),
 * the usage when asked for, "[DONE]". Takes usage. */
static void end_stream(struct sk_httpd_req *req, struct flow *f, const char *reason,
                       json_t *usage, const struct sk_generate_result *g) {
  json_t *o = chunk_new(f);
  /* the logprobs of tokens a stop string cut into, if any */
  json_t *lp = f->n_lp ? lp_take(f, true) : json_null();
  json_t *choice = f->p.chat ? json_pack("{s:i, s:{}, s:o, s:s}", "index", 0, "delta",
                                         "logprobs", lp, "finish_reason", reason)
                             : json_pack("{s:i, s:s, s:o, s:s}", "index", 0, "text", "",
                                         "logprobs", lp, "finish_reason", reason);
  json_object_set_new(o, "choices", json_pack("[o]", choice));
  if (f->p.session != SK_OPENAI_SESSION_NONE) json_object_set_new(o, "sinkd", sinkd_ext(f, g));
  send_json_event(req, o);
  if (f->p.include_usage) {
    o = chunk_new(f);
    json_object_set_new(o, "choices", json_array());
    json_object_set(o, "usage", usage);
    send_json_event(req, o);
  }
  json_decref(usage);
  sk_httpd_stream_event(req, "[DONE]", 6);
  sk_httpd_stream_end(req);
}

/* The whole response object of a request that did not stream. Takes
 * usage. */
static void respond_whole(struct sk_httpd_req *req, struct flow *f, const char *reason,
                          json_t *usage, const struct sk_generate_result *g) {
  json_t *o = chunk_new(f);
  json_t *t = json_stringn(f->text ? f->text : "", f->text_len);
  if (!t) t = json_string("");
  json_t *lp = lp_take(f, true);
  json_t *choice = f->p.chat ? json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", 0,
                                         "message", "role", "assistant", "content", t,
                                         "logprobs", lp, "finish_reason", reason)
                             : json_pack("{s:i, s:o, s:o, s:s}", "index", 0, "text", t,
                                         "logprobs", lp, "finish_reason", reason);
  json_object_set_new(o, "choices", json_pack("[o]", choice));
  json_object_set_new(o, "usage", usage);
  if (f->p.session != SK_OPENAI_SESSION_NONE) json_object_set_new(o, "sinkd", sinkd_ext(f, g));
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (s) sk_httpd_respond(req, 200, "application/json", s, strlen(s));
  else sk_httpd_error(req, 500, "internal", "out of memory");
  free(s);
}

/* The generate's final reply: the end of the response. */
static void finish(struct sk_httpd_req *req, struct flow *f, const msgpack_object *map) {
  struct sk_generate_result g;
  const char *text = NULL;
  size_t text_len = 0;
  struct sk_error e;
  if (sk_wire_unpack_generate(map, &g, &e) < 0 ||
      sk_wire_unpack_generate_text(map, &text, &text_len, &e) < 0) {
    fail_protocol(req, f, &e);
    return;
  }
  add_text(req, f, text, text_len, true);
  const char *reason = f->stopped || strcmp(g.stop, "eos") == 0 || strcmp(g.stop, "stop") == 0 ||
                               strcmp(g.stop, "end_of_turn") == 0
                           ? "stop"
                           : "length";
  sk_metrics_usage(f->oc->metrics, g.prompt_tokens, g.completion_tokens, g.evicted);
  json_t *usage = json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)g.prompt_tokens,
                            "completion_tokens", (json_int_t)g.completion_tokens,
                            "total_tokens", (json_int_t)(g.prompt_tokens + g.completion_tokens));
  /* speculation's proposals, as OpenAI reports those of a prediction */
  if (usage && g.drafted_tokens)
    json_object_set_new(usage, "completion_tokens_details",
                        json_pack("{s:I, s:I}", "accepted_prediction_tokens",
                                  (json_int_t)g.accepted_tokens, "rejected_prediction_tokens",
                                  (json_int_t)(g.drafted_tokens - g.accepted_tokens)));
  /* Before the response: it may start the next pipelined request. */
  if (f->p.chat && f->p.session != SK_OPENAI_SESSION_NONE)
    sk_oaiconv_record(&f->oc->convs, f->session, req->uid, f->p.messages,
                      f->text ? f->text : "", f->text_len);
  if (f->temporary) close_session(req, f);
  if (f->p.stream) end_stream(req, f, reason, usage, &g);
  else respond_whole(req, f, reason, usage, &g);
  flow_end(req, f);
}

/* The generate (or chat) op on f->session. */
static void send_generate(struct sk_httpd_req *req, struct flow *f) {
  struct sk_wire_generate_req g = {
      .session = f->session,
      .max_tokens = (uint32_t)f->p.max_tokens,
      /* top_p 0 keeps the most likely token only (OpenAI takes 0 to 1;
       * the generate op (0, 1]): greedy. So does a top_p that rounds to
       * 0 as the sampler's 32-bit float (5e-324). */
      .temperature = (float)f->p.top_p > 0 ? f->p.temperature : 0,
      .top_p = (float)f->p.top_p > 0 ? f->p.top_p : 1,
      /* OpenAI has no top-k: off unless the request asks for it. */
      .top_k = f->p.has_top_k ? (uint32_t)f->p.top_k : 0,
      .has_seed = f->p.has_seed,
      .seed = f->p.seed,
      .stop = {.s = f->p.stop, .len = f->p.stop_len, .n = f->p.n_stop},
      .input = {.bos = -1},
      .logprobs = f->p.logprobs,
      .top_logprobs = f->p.top_logprobs,
      .spec = {.mode = f->p.speculation,
               .mode_len = f->p.speculation ? strlen(f->p.speculation) : 0,
               .has_tokens = f->p.has_draft_tokens, .tokens = (uint32_t)f->p.draft_tokens,
               .has_fixed = f->p.has_draft_fixed, .fixed = f->p.draft_fixed},
  };
  struct sk_chat_message *msgs = NULL;
  if (f->p.chat) {
    /* A chat request is the chat op: the session's chat template formats
     * the messages, as for protocol clients. A persistent session gets
     * only the messages it does not hold yet. */
    size_t first = f->p.session == SK_OPENAI_SESSION_ID
                       ? sk_oaiconv_first_new(&f->oc->convs, f->p.session_id, req->uid,
                                              f->p.messages)
                       : 0;
    size_t n = json_array_size(f->p.messages) - first;
    msgs = calloc(n, sizeof *msgs);
    if (!msgs) {
      fail(req, f, 507, "no_memory", "out of memory");
      return;
    }
    for (size_t i = 0; i < n; i++) {
      json_t *m = json_array_get(f->p.messages, first + i);
      json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
      msgs[i].role = json_string_value(role);
      /* null content: "" (content_len 0 is strlen's) */
      msgs[i].content = json_is_string(content) ? json_string_value(content) : "";
      msgs[i].content_len = json_is_string(content) ? json_string_length(content) : 0;
    }
    g.messages.m = msgs;
    g.messages.n = n;
  } else {
    g.input.text = f->p.prompt ? f->p.prompt : "";
    g.input.text_len = f->p.prompt_len;
  }
  f->gen_id = sk_httpd_next_id(req);
  struct sk_msgbuf b;
  int rc = sk_wire_pack_generate_req(&b, f->gen_id, f->p.chat, &g);
  free(msgs);
  struct sk_error e;
  if (rc < 0) fail(req, f, 507, "no_memory", "out of memory");
  else if (sk_httpd_call(req, &b, &e) < 0) fail(req, f, 503, "unavailable", e.message);
}

/* ---- the replies and events ---- */

/* A token event of the generate. */
static void on_token(struct sk_httpd_req *req, struct flow *f, const msgpack_object *map) {
  struct sk_token_event ev;
  struct sk_top_pair top[SK_WIRE_MAX_TOP];
  struct sk_top_logprob toplp[SK_WIRE_MAX_TOP];
  struct sk_error e;
  if (sk_wire_unpack_token_event(map, &ev, top, toplp, &e) < 0)
    return; /* not one the daemon sends */
  uint64_t t = now_us();
  if (f->last_token_us) sk_metrics_token_gap(f->oc->metrics, t - f->last_token_us);
  f->last_token_us = t;
  if (f->p.stream && !f->started) {
    sk_httpd_stream_begin(req);
    f->started = true;
    if (f->p.chat) {
      /* OpenAI's first chunk gives the role. */
      json_t *o = chunk_new(f);
      json_object_set_new(o, "choices",
                          json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", 0, "delta",
                                    "role", "assistant", "content", "", "logprobs",
                                    "finish_reason"));
      add_new_session_id(f, o);
      send_json_event(req, o);
    }
  }
  if (f->p.logprobs) lp_push(f, &ev);
  f->received += ev.text_len;
  f->received_chars += sk_oailp_chars(ev.text, ev.text_len);
  add_text(req, f, ev.text, ev.text_len, false);
}

static void completion_frame(struct sk_httpd_req *req, void *state, uint64_t id,
                             const msgpack_object *map) {
  struct flow *f = state;
  if (f->abandoned) {
    abandoned_frame(req, f, id, map);
    return;
  }
  if (!map) {
    fail(req, f, 503, "unavailable", "the daemon closed the request's connection");
    return;
  }
  if (id == 0 && !reply_ok(map)) { /* refused as a client (max_clients) */
    fail_reply(req, f, map);
    return;
  }
  struct sk_error e;
  if (id == f->open_id) {
    struct sk_open_result o;
    if (!reply_ok(map)) fail_reply(req, f, map);
    else if (sk_wire_unpack_open(map, &o, &e) < 0) fail_protocol(req, f, &e);
    else {
      f->session = o.session;
      send_generate(req, f);
    }
    return;
  }
  if (id != f->gen_id) return; /* e.g. the close of an earlier request */
  enum sk_wire_kind kind;
  if (sk_wire_unpack_kind(map, &kind, &e) < 0) {
    fail_protocol(req, f, &e);
    return;
  }
  if (kind == SK_WIRE_EVENT_TOKEN) on_token(req, f, map);
  if (kind != SK_WIRE_REPLY) return;
  if (!reply_ok(map)) {
    /* A failed generate ends the session this request opened: a
     * temporary one, or a new one whose id the client never got. */
    if (f->temporary || (f->p.session == SK_OPENAI_SESSION_NEW && !f->id_sent))
      close_session(req, f);
    fail_reply(req, f, map);
    return;
  }
  if (f->p.stream && !f->started) {
    sk_httpd_stream_begin(req);
    f->started = true;
  }
  finish(req, f, map);
}

/* The open op: a temporary session, or a new one ("session": "new"),
 * with the request's policy fields. */
static void send_open(struct sk_httpd_req *req, struct flow *f) {
  f->temporary = f->p.session == SK_OPENAI_SESSION_NONE;
  f->open_id = sk_httpd_next_id(req);
  const struct sk_wire_open_req o = {
      .policy = f->p.policy,
      .policy_len = f->p.policy ? strlen(f->p.policy) : 0,
      .has_n_sink = f->p.has_n_sink,
      .n_sink = (uint32_t)f->p.n_sink,
      .has_window = f->p.has_window,
      .window = (uint32_t)f->p.window,
      .has_heavy = f->p.has_heavy,
      .heavy = (uint32_t)f->p.heavy,
      .has_recent = f->p.has_recent,
      .recent = (uint32_t)f->p.recent,
      .has_capacity = f->p.has_capacity,
      .capacity = (uint32_t)f->p.capacity,
      .has_temporary = true,
      .temporary = f->temporary,
  };
  struct sk_msgbuf b;
  struct sk_error e;
  if (sk_wire_pack_open_req(&b, f->open_id, &o) < 0)
    fail(req, f, 507, "no_memory", "out of memory");
  else if (sk_httpd_call(req, &b, &e) < 0)
    fail(req, f, 503, "unavailable", e.message);
}

void sk_oaicompl_start(struct sk_httpd_req *req, struct sk_oaicompl *oc, bool chat) {
  char msg[256];
  struct flow *f = calloc(1, sizeof *f);
  if (!f) {
    sk_httpd_error(req, 507, "no_memory", "out of memory");
    return;
  }
  int status = sk_openai_parse(req->body, req->body_len, chat, &f->p, msg, sizeof msg);
  if (status) {
    free(f);
    sk_httpd_error(req, status, "invalid_request", "%s", msg);
    return;
  }
  f->oc = oc;
  snprintf(f->id, sizeof f->id, "%s-%" PRIu64, chat ? "chatcmpl" : "cmpl", ++oc->serial);
  f->created = (int64_t)time(NULL);
  sk_httpd_bind(req, completion_frame, on_gone, f);
  if (f->p.session == SK_OPENAI_SESSION_ID) {
    f->session = f->p.session_id;
    send_generate(req, f);
  } else {
    send_open(req, f);
  }
}
