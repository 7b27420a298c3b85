/* The wire schema of sinkd, written once: requests, replies, events and
 * the error reply. Each sk_wire_pack_* writes one whole frame from a
 * value struct (a public one of sinkd/client.h, or an sk_wire_* one
 * below), and the matching sk_wire_unpack_* reads such a frame's map back
 * into that struct. libsinkd and the HTTP gateway pack requests and read
 * replies with it, the daemon reads requests and packs replies with it,
 * the tests' fake daemon packs with it, and tests/test-wire.c round-trips
 * every one (sinkd-protocol(7) describes the fields).
 *
 * No map size is counted by hand: a map's entries are packed into a side
 * buffer and counted as they are written, and its header is written once
 * they are all known (so optional fields cannot throw the count off).
 *
 * A new reply field: a member of the client.h struct (or, for what
 * libsinkd does not keep, of the sk_wire_*_extra struct), one line in the
 * pack function, one in the unpack function, and its value in
 * tests/test-wire.c; sinkd-protocol(7) documents it. A new request field
 * likewise, in its sk_wire_*_req struct.
 *
 * Internal header (not installed).
 */
#ifndef SK_WIRE_H
#define SK_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"
#include "sinkd/client.h"

/* A map being written: entries go to a side buffer and are counted;
 * sk_wire_map_end writes the header with the count, then the entries, to
 * the packer given to sk_wire_map_begin. */
struct sk_wire_map {
  msgpack_packer *out;  /* where the finished map goes (not owned) */
  msgpack_sbuffer body; /* the entries packed so far (owned) */
  msgpack_packer pk;    /* packs into body: write each value with it */
  uint32_t n;           /* entries written */
  bool failed;          /* an allocation failed */
};

/* Starts a map whose finished bytes go to out. No allocation yet. */
void sk_wire_map_begin(struct sk_wire_map *m, msgpack_packer *out);
/* Writes the key of one more entry and returns the packer for its value
 * (exactly one value must follow, possibly a nested array or map). */
msgpack_packer *sk_wire_map_key(struct sk_wire_map *m, const char *key);
/* Entry helpers: a key and its value. */
void sk_wire_map_u64(struct sk_wire_map *m, const char *key, uint64_t v);
void sk_wire_map_i64(struct sk_wire_map *m, const char *key, int64_t v);
void sk_wire_map_f64(struct sk_wire_map *m, const char *key, double v);
void sk_wire_map_bool(struct sk_wire_map *m, const char *key, bool v);
void sk_wire_map_str(struct sk_wire_map *m, const char *key, const char *v);
void sk_wire_map_strn(struct sk_wire_map *m, const char *key, const char *v, size_t len);
/* Writes the header (m->n entries) and the entries to out, and frees the
 * side buffer. Returns 0, or -SK_ERR_NO_MEMORY (nothing usable written). */
int sk_wire_map_end(struct sk_wire_map *m);

/* ---- replies ----------------------------------------------------------
 * Every sk_wire_pack_* below starts the frame in *b (sk_msgbuf_init) and
 * writes the whole reply {"id": id, "ok": true, fields...}; the caller
 * sends it (sk_msgbuf_finish) or frees it. Returns 0 or -SK_ERR_NO_MEMORY
 * (b is freed).
 *
 * Every sk_wire_unpack_* reads the fields of a reply's map into *ret,
 * which it fills whole: fields the reply leaves out keep the protocol's
 * value for "absent" (0, "", false; rope_scale 1). String fields are
 * copied, truncated to the struct's buffer. Returns 0, or -SK_ERR_PROTOCOL
 * with err's message naming the field ("field 'seen' must be ..."). */

/* The fields of hello's "model" that libsinkd does not keep. */
struct sk_wire_hello_extra {
  const char *model_file;        /* NULL: "" */
  uint64_t sparse_weight_bytes;  /* the sparse MLP's extra weights (0: none) */
  const float *sparsity_levels;  /* n_sparsity_levels calibrated levels */
  size_t n_sparsity_levels;
};

/* hello: *h, and *x (NULL: none of them) in "model"; "chat_template"
 * carries "error" only when h->chat_template_error is not empty.
 * Unpacking reads *h only. */
int sk_wire_pack_hello(struct sk_msgbuf *b, uint64_t id, const struct sk_hello *h,
                       const struct sk_wire_hello_extra *x);
int sk_wire_unpack_hello(const msgpack_object *map, struct sk_hello *ret, struct sk_error *err);

/* list: n rows ({"sessions": [{...}, ...]}). Unpacking: *ret_rows is a
 * calloc'd array of *ret_n rows the caller frees (NULL when empty; an
 * absent "sessions" is an empty list). Errors also -SK_ERR_NO_MEMORY. */
int sk_wire_pack_list(struct sk_msgbuf *b, uint64_t id, const struct sk_session_info *rows,
                      size_t n);
int sk_wire_unpack_list(const msgpack_object *map, struct sk_session_info **ret_rows,
                        size_t *ret_n, struct sk_error *err);

/* The fields of `stats` without a session that libsinkd does not keep. */
struct sk_wire_daemon_extra {
  const char *chat_template;       /* family new sessions get */
  const char *chat_template_error; /* why the model's was not taken, or "" */
  const char *state_dir;
};

/* stats without a session: *s and *x; the caller's user figures go out
 * only when s->has_user (which unpacking sets when "user_sessions" is
 * there). Unpacking reads *s only. */
int sk_wire_pack_daemon_stats(struct sk_msgbuf *b, uint64_t id, const struct sk_daemon_stats *s,
                              const struct sk_wire_daemon_extra *x);
int sk_wire_unpack_daemon_stats(const msgpack_object *map, struct sk_daemon_stats *ret,
                                struct sk_error *err);

/* The parts of `stats` of a session that outgrow struct sk_session_stats
 * or that libsinkd does not keep. NULL arrays: the struct's own. */
struct sk_wire_session_extra {
  uint64_t owner_uid;
  bool has_resident_ranges;      /* send them (the session was idle) */
  const struct sk_range *ranges; /* n_ranges resident ranges */
  size_t n_ranges;
  const float *sink_mass;        /* n_layers each */
  const float *entropy;
  size_t n_layers;
  const double *sparsity_measured; /* n_sparse_layers, or NULL */
  size_t n_sparse_layers;
  bool has_tokens;               /* send "tokens" (stats with tokens) */
  const int32_t *tokens;         /* n_tokens resident ids */
  size_t n_tokens;
};

/* stats of a session: *s with *x (x may be NULL: the struct's arrays,
 * resident ranges when !s->busy, no tokens). Attention values go out as
 * float32. Unpacking fills *s, keeping the first SK_CLIENT_MAX_RANGES
 * ranges and SK_CLIENT_MAX_LAYERS layers; it does not read "tokens"
 * (sk_wire_unpack_tokens does). Unlike the others it writes *ret in place
 * (the struct is ~3 KiB): after a failure its contents are unspecified. */
int sk_wire_pack_session_stats(struct sk_msgbuf *b, uint64_t id, const struct sk_session_stats *s,
                               const struct sk_wire_session_extra *x);
int sk_wire_unpack_session_stats(const msgpack_object *map, struct sk_session_stats *ret,
                                 struct sk_error *err);

/* An ok reply with no fields (ping, close). */
int sk_wire_pack_ok(struct sk_msgbuf *b, uint64_t id);

/* open: every field of *o; "session" is required when unpacking. */
int sk_wire_pack_open(struct sk_msgbuf *b, uint64_t id, const struct sk_open_result *o);
int sk_wire_unpack_open(const msgpack_object *map, struct sk_open_result *ret,
                        struct sk_error *err);

/* resume, fork and import: *s; "from" is written only when s->from is not
 * 0 (fork), and "received" (the bytes of the image) only when received is
 * not 0 (import; unpacking does not read it). "session" is required when
 * unpacking. */
int sk_wire_pack_summary(struct sk_msgbuf *b, uint64_t id, const struct sk_session_summary *s,
                         uint64_t received);
int sk_wire_unpack_summary(const msgpack_object *map, struct sk_session_summary *ret,
                           struct sk_error *err);

/* append: *a, and with logprobs (a->n_tokens float32 values, NaN where
 * nothing preceded the token, sent as nil) a "logprobs" array. Unpacking
 * with logprobs not NULL requires that array with exactly n entries and
 * stores them (nil -> NaN); with logprobs NULL it is not read. */
int sk_wire_pack_append(struct sk_msgbuf *b, uint64_t id, const struct sk_append_result *a,
                        const float *logprobs);
int sk_wire_unpack_append(const msgpack_object *map, struct sk_append_result *ret,
                          double *logprobs, size_t n, struct sk_error *err);

/* generate and chat, the final reply: *g, with stop_token and stop_text
 * written only when g->stop_token >= 0 (an end-of-generation stop). The
 * daemon's full texts, which outgrow the struct's buffers, are given
 * apart: stop_text (stop_text_len bytes; NULL: g->stop_text) and the
 * generated text (text_len bytes; NULL: ""). Unpacking ignores "text" and
 * sets stop_token -1 when it is absent. */
int sk_wire_pack_generate(struct sk_msgbuf *b, uint64_t id, const struct sk_generate_result *g,
                          const char *stop_text, size_t stop_text_len, const char *text,
                          size_t text_len);
int sk_wire_unpack_generate(const msgpack_object *map, struct sk_generate_result *ret,
                            struct sk_error *err);

/* cancel: {"cancelled"} (absent: false). */
int sk_wire_pack_cancel(struct sk_msgbuf *b, uint64_t id, bool cancelled);
int sk_wire_unpack_cancel(const msgpack_object *map, bool *ret, struct sk_error *err);

/* tokenize (and stats with "tokens"): {"tokens": [id, ...]}, n ids.
 * Unpacking requires the field: *ret_tokens is a malloc'd array of
 * *ret_n ids the caller frees (NULL when empty). Errors also
 * -SK_ERR_NO_MEMORY. */
int sk_wire_pack_tokens(struct sk_msgbuf *b, uint64_t id, const int32_t *tokens, size_t n);
int sk_wire_unpack_tokens(const msgpack_object *map, int32_t **ret_tokens, size_t *ret_n,
                          struct sk_error *err);

/* detokenize: {"text"} of len bytes. Unpacking requires the field:
 * *ret_text is a malloc'd copy with a NUL after its *ret_len bytes, the
 * caller's to free. Errors also -SK_ERR_NO_MEMORY. */
int sk_wire_pack_text(struct sk_msgbuf *b, uint64_t id, const char *text, size_t len);
int sk_wire_unpack_text(const msgpack_object *map, char **ret_text, size_t *ret_len,
                        struct sk_error *err);

/* import, a chunk taken before the last: {"received"}, bytes so far. */
int sk_wire_pack_received(struct sk_msgbuf *b, uint64_t id, uint64_t received);
int sk_wire_unpack_received(const msgpack_object *map, uint64_t *ret, struct sk_error *err);

/* export, the final reply after the data events: the session, the
 * image's bytes and the session's resident and seen tokens. Unpacking
 * reads "bytes" (absent: 0). */
int sk_wire_pack_export(struct sk_msgbuf *b, uint64_t id, uint64_t session, uint64_t bytes,
                        uint64_t resident, uint64_t seen);
int sk_wire_unpack_export(const msgpack_object *map, uint64_t *ret_bytes, struct sk_error *err);

/* ---- events ----------------------------------------------------------- */

/* An export's data event of request id: {"id", "event": "data", "offset",
 * "data": bin of n bytes}. Unpacking requires both: *ret_data points into
 * the message. */
int sk_wire_pack_data_event(struct sk_msgbuf *b, uint64_t id, uint64_t offset, const void *data,
                            size_t n);
int sk_wire_unpack_data_event(const msgpack_object *map, uint64_t *ret_offset,
                              const char **ret_data, size_t *ret_n, struct sk_error *err);


/* A token event of request id: {"id", "event": "token", "token", "text",
 * "top" (only when ev->n_top > 0: [token, logit] pairs, logits as
 * float32), "logprob" (float32) and "bytes" (bin) when ev->bytes is not
 * NULL, "top_logprobs" (when ev->n_top_logprobs > 0: [token, logprob,
 * bytes] triples)}. ev->session is not sent. Same returns as the
 * replies. */
int sk_wire_pack_token_event(struct sk_msgbuf *b, uint64_t id, const struct sk_token_event *ev);
/* Reads a token event's map into *ret: ret->text points into the message
 * ("" when absent); ret->top points to top[], which receives the first
 * SK_WIRE_MAX_TOP pairs, ret->top_logprobs to toplp[] likewise (bytes
 * into the message); ret->logprob is NaN and ret->bytes NULL when the
 * event has none. ret->session is left 0 (the caller knows it). */
int sk_wire_unpack_token_event(const msgpack_object *map, struct sk_token_event *ret,
                               struct sk_top_pair top[SK_WIRE_MAX_TOP],
                               struct sk_top_logprob toplp[SK_WIRE_MAX_TOP],
                               struct sk_error *err);

/* ---- requests ---------------------------------------------------------
 * Every sk_wire_pack_*_req starts the frame in *b (sk_msgbuf_init) and
 * writes the whole request {"id": id, "op": name, fields...}; the caller
 * sends it (sk_msgbuf_finish) or frees it. Returns 0 or -SK_ERR_NO_MEMORY
 * (b is freed).
 *
 * Every sk_wire_unpack_*_req reads a request's map (whose "id" and "op"
 * sk_wire_unpack_head read) into *ret, which it fills whole: strings and
 * lists point into the message, absent fields get the values the structs
 * name. It checks what the protocol says of each field (its type, the
 * range of a number, fields that exclude or need each other); what the
 * values mean (a session, a policy, a token id of the model, the daemon's
 * limits) is the daemon's to check. Returns 0, or -SK_ERR_BAD_REQUEST
 * with err's message naming the field ("field 'max_tokens' must be an
 * unsigned integer (got string)", "missing field 'session'") at the first
 * bad field. */

/* The "id" (required, unsigned) and "op" (required, a string: *ret_op
 * points into the message, op_len bytes, not checked against the op
 * names) of a request. *ret_id is 0 until "id" was read, so that a
 * request whose "op" is bad is answered with its id. */
int sk_wire_unpack_head(const msgpack_object *map, uint64_t *ret_id, const char **ret_op,
                        size_t *ret_op_len, struct sk_error *err);

/* A request of op that has no fields: ping, hello, list, and stats of the
 * daemon. */
int sk_wire_pack_req(struct sk_msgbuf *b, uint64_t id, enum sk_op op);

/* A request of op on one session, {"session"} (required): close, cancel,
 * resume, fork and export; the daemon reads it first from every request
 * that names a session, to answer no_such_session before anything else. */
int sk_wire_pack_session_req(struct sk_msgbuf *b, uint64_t id, enum sk_op op, uint64_t session);
int sk_wire_unpack_session_req(const msgpack_object *map, uint64_t *ret_session,
                               struct sk_error *err);

/* A list of token ids in a request. Packing sends ids[0..n) when has is
 * set. Unpacking sets has when the field is there (an array), leaves ids
 * NULL and points raw at the message's n elements, which
 * sk_wire_ids_at reads: a request may hold anything in them, and each op
 * words its own error. */
struct sk_wire_ids {
  bool has;
  const int32_t *ids;        /* packing: n ids */
  const msgpack_object *raw; /* unpacking: n objects */
  size_t n;
};

/* Element i < l->n: true with *ret its value when it is an integer
 * (saturated to int64's range), false when it is not an integer. */
bool sk_wire_ids_at(const struct sk_wire_ids *l, size_t i, int64_t *ret);

/* Strings in a request (generate's "stop"), sent when n > 0. Packing:
 * s[i], len[i] bytes (len NULL: strlen). Unpacking: raw, read with
 * sk_wire_strs_at. */
struct sk_wire_strs {
  const char *const *s;
  const size_t *len;
  const msgpack_object *raw;
  size_t n;
};

/* Element i < l->n: true with *ret and *ret_len set (pointing into the
 * message) when it is a msgpack str (bin is refused), else false. */
bool sk_wire_strs_at(const struct sk_wire_strs *l, size_t i, const char **ret, size_t *ret_len);

/* chat's "messages": packing sends m[0..n) as {"role", "content"} maps
 * (role NUL-terminated, content content_len bytes, 0: strlen).
 * Unpacking: raw, read with sk_wire_msgs_at. */
struct sk_wire_msgs {
  const struct sk_chat_message *m;
  const msgpack_object *raw;
  size_t n;
};

/* Element i < l->n: true with the role and content set (pointing into
 * the message) when it is a map with strings "role" and "content", else
 * false. */
bool sk_wire_msgs_at(const struct sk_wire_msgs *l, size_t i, const char **ret_role,
                     size_t *ret_role_len, const char **ret_content, size_t *ret_content_len);

/* Text or token ids as append, generate and tokenize carry them. */
struct sk_wire_input {
  const char *text;         /* NULL: absent; text_len bytes ("text" of
                               append and tokenize, "prompt" of generate) */
  size_t text_len;
  struct sk_wire_ids tokens; /* not with text */
  int bos;                  /* "bos": -1 absent, 0 false, 1 true */
  bool parse_special;       /* "parse_special" (false: sent only if true) */
};

/* Speculation fields of open, generate and chat: "speculation" (a
 * string, sent when not NULL; its value is the daemon's to check),
 * "draft_tokens" (1..SK_SPEC_TOKENS_MAX, sent when has_tokens) and
 * "draft_fixed" (sent when has_fixed). */
struct sk_wire_spec {
  const char *mode;
  size_t mode_len;
  bool has_tokens;
  uint32_t tokens;
  bool has_fixed;
  bool fixed;
};

/* open. Numbers go out when their has_ flag is set, strings when not
 * NULL; unpacking sets the flags of the fields there (a number's value
 * is 0 when absent, rope_scale and sparsity too). */
struct sk_wire_open_req {
  const char *policy;   /* the policy's name, policy_len bytes */
  size_t policy_len;
  bool has_n_sink, has_window, has_heavy, has_recent, has_capacity;
  uint32_t n_sink, window, heavy, recent, capacity; /* tokens */
  bool has_rope_scale;
  double rope_scale;
  const char *pin;      /* pinned prefix as text, pin_len bytes */
  size_t pin_len;
  bool has_temporary;
  bool temporary;
  const char *chat_template; /* a family name or a template text */
  size_t chat_template_len;
  const char *system;   /* the chat op's system prompt, system_len bytes */
  size_t system_len;
  bool has_sparsity;
  double sparsity;
  struct sk_wire_ids pin_tokens; /* the pinned prefix as token ids */
  struct sk_wire_spec spec;
};

int sk_wire_pack_open_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_open_req *o);
int sk_wire_unpack_open_req(const msgpack_object *map, struct sk_wire_open_req *ret,
                            struct sk_error *err);

/* append: "text" or "tokens" (one of them, required), "bos",
 * "parse_special", and "logprobs" (sent only if true). */
struct sk_wire_append_req {
  uint64_t session;
  struct sk_wire_input input;
  bool logprobs;
};

int sk_wire_pack_append_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_append_req *a);
int sk_wire_unpack_append_req(const msgpack_object *map, struct sk_wire_append_req *ret,
                              struct sk_error *err);

/* generate and chat. The sampling fields always go out; unpacking gives
 * an absent one the protocol's default (SK_GENERATE_DEFAULT_*, no seed,
 * ignore_eos false, n_top 0). generate's input is "prompt" or "tokens"
 * (at most one: none generates from the session as it is), with "bos"
 * and "parse_special"; chat's is "messages" (required; neither "prompt"
 * nor "tokens" may come with it), and it reads no "bos". */
struct sk_wire_generate_req {
  struct sk_wire_msgs messages; /* chat */
  uint64_t session;
  uint32_t max_tokens;          /* <= SK_WIRE_MAX_TOKENS */
  double temperature;
  uint32_t top_k;
  bool has_top_k;               /* unpacking: the request gave top_k */
  double top_p;
  bool ignore_eos;
  bool has_seed;
  uint64_t seed;
  struct sk_wire_strs stop;
  struct sk_wire_input input;   /* generate */
  uint32_t n_top;               /* <= SK_WIRE_MAX_TOP; sent when > 0 */
  bool logprobs;                /* sent when true */
  uint32_t top_logprobs;        /* <= SK_WIRE_MAX_TOP; sent when > 0 */
  struct sk_wire_spec spec;
};

/* chat: the request of the chat op (else generate). */
int sk_wire_pack_generate_req(struct sk_msgbuf *b, uint64_t id, bool chat,
                              const struct sk_wire_generate_req *g);
int sk_wire_unpack_generate_req(const msgpack_object *map, bool chat,
                                struct sk_wire_generate_req *ret, struct sk_error *err);

/* stats: of the daemon without "session" (then nothing else is read),
 * of a session with it, and with "tokens" (sent only if true) its
 * resident token ids too. */
struct sk_wire_stats_req {
  bool has_session;
  uint64_t session;
  bool tokens;
};

int sk_wire_pack_stats_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_stats_req *s);
int sk_wire_unpack_stats_req(const msgpack_object *map, struct sk_wire_stats_req *ret,
                             struct sk_error *err);

/* import: one chunk {"total", "offset", "data"} (all required) of an
 * image of total bytes; data is len bytes at offset, sent as bin. */
struct sk_wire_import_req {
  uint64_t total;
  uint64_t offset;
  const void *data;
  size_t len;
};

int sk_wire_pack_import_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_import_req *i);
int sk_wire_unpack_import_req(const msgpack_object *map, struct sk_wire_import_req *ret,
                              struct sk_error *err);

/* tokenize: "text" (required; tokens is not read), "bos",
 * "parse_special". */
int sk_wire_pack_tokenize_req(struct sk_msgbuf *b, uint64_t id, const struct sk_wire_input *t);
int sk_wire_unpack_tokenize_req(const msgpack_object *map, struct sk_wire_input *ret,
                                struct sk_error *err);

/* detokenize: "tokens" (required). */
int sk_wire_pack_detokenize_req(struct sk_msgbuf *b, uint64_t id, const int32_t *tokens,
                                size_t n);
int sk_wire_unpack_detokenize_req(const msgpack_object *map, struct sk_wire_ids *ret,
                                  struct sk_error *err);

/* ---- what comes back --------------------------------------------------
 * For the client's side: the parts every reply and event has. Errors as
 * for the replies (-SK_ERR_PROTOCOL naming the field). */

/* The "id" of a reply or event (required). */
int sk_wire_unpack_id(const msgpack_object *map, uint64_t *ret, struct sk_error *err);

/* What a frame from the daemon is. */
enum sk_wire_kind {
  SK_WIRE_REPLY,       /* no "event": a final reply */
  SK_WIRE_EVENT_TOKEN, /* a generate's token */
  SK_WIRE_EVENT_DATA,  /* an export's data */
  SK_WIRE_EVENT_OTHER, /* an event of a later protocol version */
};

/* Reads "event" (absent: a reply; else a string). */
int sk_wire_unpack_kind(const msgpack_object *map, enum sk_wire_kind *ret, struct sk_error *err);

/* "ok" of a reply (required, a boolean). */
int sk_wire_unpack_ok(const msgpack_object *map, bool *ret, struct sk_error *err);

/* A whole error reply frame {"id": id, "ok": false, "error": {"code",
 * "message"}}: e's code (0 is sent as "internal") and message (empty:
 * sk_strerror of the code). b comes from sk_msgbuf_init with nothing
 * packed yet; on success it holds the finished frame,
 * b->sbuf.data[0..b->sbuf.size) (finishing again is harmless); either way
 * the caller frees b (or takes the bytes with sk_msgbuf_release).
 * Returns 0 or -SK_ERR_NO_MEMORY. */
int sk_wire_pack_error(struct sk_msgbuf *b, uint64_t id, const struct sk_error *e);

/* The "error" of a failed reply into *ret: its code mapped with
 * sk_error_from_name (SK_ERR_INTERNAL when absent or unknown) and its
 * message as sent (cut to fit; absent: sk_strerror of the code). Never
 * fails: a reply that says nothing is an internal error. */
void sk_wire_unpack_error(const msgpack_object *map, struct sk_error *ret);

/* "text" of a generate or chat final reply (the whole generated text,
 * which struct sk_generate_result does not hold): *ret points into the
 * message ("" when absent). */
int sk_wire_unpack_generate_text(const msgpack_object *map, const char **ret, size_t *ret_len,
                                 struct sk_error *err);

#endif
