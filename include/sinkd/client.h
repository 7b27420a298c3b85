/* libsinkd: the client library for sinkd.
 *
 * A struct sk_client is one connection to the daemon's Unix socket. Every
 * call is blocking: it sends one request (see sinkd-protocol(7)) and reads
 * frames until that request's final reply has arrived.
 *
 * Conventions for every function below:
 *   - returns 0 on success or a negative code -SK_ERR_...;
 *   - `err` may be NULL; when not NULL and the call fails it receives the
 *     code (positive) and a message. When the daemon answered with an error
 *     reply, the code is its wire code mapped with sk_error_from_name
 *     (unknown codes become SK_ERR_INTERNAL) and the message is the
 *     daemon's message, unchanged;
 *   - transport failures are -SK_ERR_IO (a system call failed, including a
 *     timeout), -SK_ERR_DISCONNECTED (the daemon closed the connection) and
 *     -SK_ERR_PROTOCOL (the daemon sent something this library cannot
 *     read). After one of those the connection is closed and every later
 *     call fails with -SK_ERR_DISCONNECTED; sk_client_connected() tells
 *     the two kinds of failure apart;
 *   - ret_* output parameters are written only on success;
 *   - counts of tokens are plain token counts; "stream indices" count every
 *     token a session has ever seen, from 0.
 *
 * A struct sk_client is not thread-safe: use it from one thread at a time
 * (a second connection may cancel a generate running on the first).
 */
#ifndef SINKD_CLIENT_H
#define SINKD_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sinkd/protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where the daemon listens unless configured otherwise. */
#define SK_CLIENT_DEFAULT_SOCKET "/run/sinkd/sinkd.sock"
/* Most evicted ranges a reply carries (the daemon sends at most these). */
#define SK_CLIENT_MAX_RANGES SK_WIRE_MAX_RANGES
/* Most layers whose attention diagnostics `stats` copies out. */
#define SK_CLIENT_MAX_LAYERS 128u
/* Most [token, logit] pairs a token event carries (n_top is 0..20). */
#define SK_CLIENT_MAX_TOP SK_WIRE_MAX_TOP
/* Fixed sizes of the short strings copied out of replies, including the
 * NUL; longer values are truncated. */
#define SK_CLIENT_NAME_MAX 64u
#define SK_CLIENT_MODEL_NAME_MAX 256u

/* One connection. Opaque. */
struct sk_client;

/* ---- connection ------------------------------------------------------- */

/* The socket path to use when the user gave none: $SINKD_SOCKET if set and
 * not empty; else $XDG_RUNTIME_DIR/sinkd/sinkd.sock if XDG_RUNTIME_DIR is
 * set and that file exists; else SK_CLIENT_DEFAULT_SOCKET.
 * Returns a pointer to the environment or to static storage, valid until
 * the environment changes or the next call; do not free. */
const char *sk_client_default_socket(void);

/* Connects to the daemon at `path` (NULL: sk_client_default_socket()).
 * On success *ret_client is a new client the caller frees with
 * sk_client_free. Errors: -SK_ERR_IO, with a message that says what to do:
 * for a missing socket or refused connection that the daemon is not
 * running and how to start it (the per-user unit for a path under
 * $XDG_RUNTIME_DIR); for EACCES which permission is missing — a folder of
 * the path, or the socket's mode and group and how to join that group (or
 * to log in again when the user was added to it since); -SK_ERR_NO_MEMORY. */
int sk_client_connect(const char *path, struct sk_client **ret_client,
                      struct sk_error *err);

/* sk_client_connect, waiting up to wait_ms milliseconds for a daemon
 * that is starting: while its socket is missing or refuses connections,
 * the connect is tried again (every 50 ms), then the daemon must answer
 * a ping within what is left of wait_ms (a socket the service manager
 * holds accepts before the daemon behind it has loaded its model). 0:
 * no waiting, as sk_client_connect. Errors: those of sk_client_connect
 * (the message says how long it waited), and -SK_ERR_IO when the daemon
 * did not answer in time. */
int sk_client_connect_wait(const char *path, unsigned int wait_ms,
                           struct sk_client **ret_client, struct sk_error *err);

/* Closes the connection and frees the client. Accepts NULL. */
void sk_client_free(struct sk_client *client);

/* Sets a timeout in milliseconds for each send and receive on the socket
 * (SO_SNDTIMEO/SO_RCVTIMEO); 0 means wait forever (the default). A call
 * that times out fails with -SK_ERR_IO and closes the connection, since
 * its reply may still arrive later. Errors: -SK_ERR_IO. */
int sk_client_set_timeout(struct sk_client *client, unsigned int ms,
                          struct sk_error *err);

/* True while the connection is usable; false after a transport error
 * (-SK_ERR_IO/-SK_ERR_DISCONNECTED/-SK_ERR_PROTOCOL) closed it. An error
 * reply from the daemon leaves the connection usable. */
bool sk_client_connected(const struct sk_client *client);

/* ---- daemon ----------------------------------------------------------- */

/* Round trip to the daemon's I/O thread; answered even while the model is
 * busy. */
int sk_client_ping(struct sk_client *client, struct sk_error *err);

struct sk_model_info {
  char name[SK_CLIENT_MODEL_NAME_MAX];
  uint32_t n_vocab;
  uint32_t n_ctx_train; /* tokens the model was trained on */
  uint32_t n_layer;
  uint32_t dim;         /* embedding width */
  uint32_t n_head;
  uint32_t n_kv_head;
  double rope_scale;     /* the model's own position interpolation: its
                            GGUF linear rope scaling factor (positions
                            are divided by it; 1 = none) */
  uint32_t max_capacity; /* largest cache a session may have, tokens */
  char weight_type[SK_CLIENT_NAME_MAX]; /* ggml type of the layer matrices,
                                           e.g. "q8_0" */
  uint64_t weight_bytes; /* bytes of weights one forward pass reads */
};

/* How the daemon runs the model (`compute` in hello and stats). */
struct sk_compute_info {
  char kernel[SK_CLIENT_NAME_MAX]; /* "avx2-vnni", "avx2" or "generic" */
  uint32_t threads;   /* compute threads */
  uint32_t max_batch; /* tokens of one forward pass, all sessions */
  char kv_type[SK_CLIENT_NAME_MAX]; /* new sessions' KV cache elements:
                                       "f16" or "f32" ("" if the
                                       reply has none) */
};

/* Session defaults the daemon applies to fields `open` leaves out. */
struct sk_session_defaults {
  char policy[SK_CLIENT_NAME_MAX];
  uint32_t n_sink;   /* tokens */
  uint32_t window;   /* tokens */
  uint32_t heavy;    /* tokens */
  uint32_t recent;   /* tokens */
  uint32_t capacity; /* tokens */
  double rope_scale;
};

/* Speculative decoding (sinkd-protocol(7), "speculation"): what is
 * speculated with and how it went. In hello and the daemon's stats: the
 * defaults of generates and the totals since start; in a session's
 * stats: its setting and its counts since it was opened or adopted. */
struct sk_spec_info {
  char mode[SK_CLIENT_NAME_MAX]; /* "off", "draft" or "lookup"; a
                                    session's is "default" unless it chose */
  uint32_t draft_tokens; /* most tokens one step proposes (0: default) */
  bool draft_fixed;      /* always that many (else it adapts) */
  char draft_model[SK_CLIENT_MODEL_NAME_MAX]; /* daemon: the draft model's
                                                 name, "" without one */
  uint32_t lookup_history; /* daemon: tokens of history a session keeps for
                              look-up (0: none) */
  uint64_t drafted;      /* tokens proposed and checked */
  uint64_t accepted;     /* of those, kept (the model agreed) */
  uint64_t rejected;     /* refused: drafted - accepted */
  double acceptance;     /* accepted / drafted (0 before any) */
};

/* Reply to `hello`. Plain value; no ownership. */
struct sk_hello {
  uint32_t protocol; /* SK_PROTOCOL_VERSION of the daemon */
  char server[SK_CLIENT_NAME_MAX];  /* "sinkd" */
  char version[SK_CLIENT_NAME_MAX]; /* e.g. "0.1.0" */
  struct sk_model_info model;
  struct sk_session_defaults defaults;
  struct sk_compute_info compute;
  char chat_template[SK_CLIENT_NAME_MAX]; /* family new sessions get
                                             ("none": the chat op is off) */
  char chat_template_error[256]; /* why the model's template was not
                                    recognised, or "" */
  struct sk_spec_info speculation; /* defaults, draft model, totals */
};

/* Asks for the daemon's protocol version, model and defaults; fills
 * *ret. Fields the daemon leaves out are 0 / "". */
int sk_client_hello(struct sk_client *client, struct sk_hello *ret,
                    struct sk_error *err);

/* Daemon-wide figures of `stats` without a session. */
struct sk_daemon_stats {
  uint64_t sessions;         /* open sessions */
  uint64_t clients;          /* connected clients */
  uint64_t uptime_s;         /* seconds */
  uint64_t tokens_prefilled; /* since start */
  uint64_t tokens_generated; /* since start */
  uint64_t max_sessions;     /* limit for new sessions */
  uint64_t memory_bytes;     /* bytes of all session objects (exact) */
  uint64_t max_memory;       /* limit for memory_bytes */
  uint64_t adopted;          /* sessions adopted from the state dir at start */
  uint64_t set_aside;        /* invalid objects set aside at start */
  uint64_t idle_ttl_s;       /* idle sessions are closed after this; 0 never */
  uint64_t steps;            /* forward passes since start (each serves
                                every session that had work) */
  struct sk_compute_info compute;
  uint64_t weights_mapped_bytes;   /* bytes of the model file mapped
                                      (read in place, shared by processes) */
  uint64_t weights_repacked_bytes; /* bytes of weights copied into another
                                      layout at load (private memory) */
  bool has_user;             /* the daemon reported the caller's use: */
  uint64_t user_sessions;    /* sessions of the caller's uid */
  uint64_t user_memory_bytes; /* their bytes */
  uint64_t max_user_sessions; /* per-uid limits; 0: none */
  uint64_t max_user_memory;
  struct sk_spec_info speculation; /* defaults, draft model, totals */
};

int sk_client_stats(struct sk_client *client, struct sk_daemon_stats *ret,
                    struct sk_error *err);

/* ---- sessions --------------------------------------------------------- */

/* Parameters of `open`. A 0 number or NULL pointer means "the daemon's
 * default" and the field is left out of the request (so n_sink 0 cannot
 * be asked for this way unless has_n_sink is set). */
struct sk_open_params {
  const char *policy; /* "streaming", "window", "h2o", "sink_h2o" or
                         "dense"; NUL-terminated */
  uint32_t n_sink;    /* attention sinks kept (streaming, sink_h2o) */
  bool has_n_sink;    /* send n_sink even when it is 0 */
  uint32_t window;    /* recent tokens kept (streaming, window) */
  uint32_t heavy;     /* heavy hitters kept (h2o, sink_h2o) */
  uint32_t recent;    /* newest tokens always kept (h2o, sink_h2o) */
  uint32_t capacity;  /* cache size (dense), tokens */
  double rope_scale;  /* position interpolation: positions are divided by
                         it (> 0; 0 = default 1) */
  const char *pin;    /* pinned prefix as text (tokenized with BOS), or
                         NULL; pin_len bytes (0: strlen) */
  size_t pin_len;
  const int32_t *pin_tokens; /* or as n_pin_tokens token ids */
  size_t n_pin_tokens;
  bool temporary;     /* the daemon closes the session when this
                         connection ends, however the client ends (a
                         session for one request: sinkctl generate
                         without --session) */
  const char *chat_template; /* the session's chat template: a family
                                name ("chatml") or a template text to
                                recognise; NULL: the daemon's */
  const char *system; /* system prompt of the chat op, or NULL: formatted
                         with the template and pinned (the sinks of a
                         streaming session); not with pin/pin_tokens;
                         system_len bytes (0: strlen) */
  size_t system_len;
  double sparsity;    /* contextual sparsity of the MLP: 0 = off (the
                         default), else one of the daemon's calibrated
                         levels (sk_hello's model.sparsity_levels) */
  /* Speculative decoding of its generates (sinkd-protocol(7)): "off",
   * "draft" (the daemon's draft model) or "lookup" (in the session's
   * history), NULL: the daemon's default; the most tokens a step
   * proposes (0: the daemon's default, 1..15), and whether always that
   * many (else the number adapts to how many are accepted). */
  const char *speculation;
  uint32_t draft_tokens;
  bool draft_fixed;
};

/* Reply to `open`. */
struct sk_open_result {
  uint64_t session;  /* the new session's id */
  char policy[SK_CLIENT_NAME_MAX];
  uint64_t capacity; /* tokens the cache holds */
  uint64_t kv_bytes; /* bytes of its keys and values: 2 x n_layer x
                        (capacity + 16 spare slots) x kv_dim x 2 (f16) or
                        4 (f32) */
  uint64_t object_bytes; /* bytes of its whole shared-memory object (keys
                            and values, header, bookkeeping, logits): what
                            it takes of memory_bytes */
  char kv_type[SK_CLIENT_NAME_MAX]; /* its elements: "f16" or "f32" ("" if the
                                       reply has none) */
  uint64_t n_sink;   /* tokens; 0 where the policy has no such part */
  uint64_t window;
  uint64_t heavy;
  uint64_t recent;
  double rope_scale;
  uint64_t pinned;   /* tokens of the pinned prefix, already resident */
};

/* Opens a session. params may be NULL (all defaults). With a pin, the
 * call returns once the pinned tokens are in the cache (for streaming and
 * sink_h2o they are the sink region: n_sink is their count). On success
 * *ret describes the session; close it with sk_client_close_session (sessions
 * outlive the connection, unless opened temporary). Invalid combinations of parameters give
 * -SK_ERR_BAD_REQUEST with the daemon's message naming the limit. */
int sk_client_open(struct sk_client *client,
                   const struct sk_open_params *params,
                   struct sk_open_result *ret, struct sk_error *err);

/* Closes a session (a running generate on it is cancelled). */
int sk_client_close_session(struct sk_client *client, uint64_t session,
                            struct sk_error *err);

/* An inclusive range of stream indices. */
struct sk_range {
  uint64_t first;
  uint64_t last;
};

/* One row of `list`. */
struct sk_session_info {
  uint64_t session;
  char policy[SK_CLIENT_NAME_MAX];
  uint64_t capacity; /* tokens */
  uint64_t resident; /* tokens in the cache now */
  uint64_t seen;     /* tokens the session has seen in total */
  bool adopted;      /* found in the state directory when the daemon started */
  char kv_type[SK_CLIENT_NAME_MAX]; /* "f16" or "f32" ("" if the
                                       reply has none) */
  /* 0 / false when the reply leaves them out: */
  uint64_t owner_uid;  /* uid that owns it */
  uint64_t kv_bytes;   /* bytes of its keys and values (sk_open_result) */
  uint64_t object_bytes; /* bytes of its shared-memory object */
  uint64_t age_s;      /* seconds since it was made (open, fork, import) */
  uint64_t idle_s;     /* seconds since its last request or job (0 while
                          busy) */
  bool busy;           /* a request is running or queued on it */
  bool temporary;      /* ends with the connection that opened it */
};

/* Lists the sessions the caller may see. On success *ret_sessions is a
 * malloc'd array of *ret_n entries that the caller frees with free();
 * with no sessions it is NULL and *ret_n is 0. */
int sk_client_list(struct sk_client *client,
                   struct sk_session_info **ret_sessions, size_t *ret_n,
                   struct sk_error *err);

/* `stats` of one session. */
struct sk_session_stats {
  uint64_t session;
  char policy[SK_CLIENT_NAME_MAX];
  char chat_template[SK_CLIENT_NAME_MAX]; /* its chat template ("none") */
  uint64_t n_sink;   /* tokens */
  uint64_t window;   /* tokens */
  uint64_t heavy;    /* tokens */
  uint64_t recent;   /* tokens */
  uint64_t pinned;   /* tokens of the pinned prefix */
  double rope_scale; /* the session's position interpolation */
  double model_rope_scale; /* the model's own (its GGUF linear factor);
                              positions are divided by both */
  uint64_t capacity; /* tokens */
  uint64_t resident; /* tokens in the cache now */
  uint64_t seen;     /* tokens seen in total */
  uint64_t evicted;  /* tokens evicted in total */
  uint64_t kv_bytes; /* bytes of its keys and values (sk_open_result) */
  uint64_t object_bytes; /* bytes of its shared-memory object */
  char kv_type[SK_CLIENT_NAME_MAX]; /* its elements: "f16" or "f32", the
                                       type it was created with, which a
                                       daemon adopting it keeps ("" if the
                                       reply has none) */
  bool has_positions;      /* false when the cache is empty */
  uint64_t position_first; /* cache positions in use, inclusive */
  uint64_t position_last;
  uint64_t commit;   /* steps committed to its shared-memory object, +1 */
  bool adopted;      /* found in the state directory when the daemon started */
  uint64_t idle_s;   /* seconds since its last request or job */
  bool busy;               /* a request was running on it */
  /* Stream indices of the resident tokens in cache-position order, as
   * ranges (only when !busy; the first SK_CLIENT_MAX_RANGES). */
  size_t n_resident_ranges;
  struct sk_range resident_ranges[SK_CLIENT_MAX_RANGES];
  /* Attention diagnostics averaged over the last attn_steps forward
   * steps (0: none yet), per layer (the first SK_CLIENT_MAX_LAYERS):
   * share of attention on the first sink_tokens cache positions, and the
   * entropy of the attention distribution in nats; averaged over heads. */
  uint64_t attn_steps;
  uint64_t sink_tokens;
  size_t n_layers;
  double sink_mass[SK_CLIENT_MAX_LAYERS];
  double entropy[SK_CLIENT_MAX_LAYERS];
  /* MLP sparsity: the session's level (0 = off), the tokens that ran
   * sparse, and per layer (the first SK_CLIENT_MAX_LAYERS) the fraction
   * of neurons they skipped (0 from daemons without it). */
  double sparsity;
  uint64_t sparse_tokens;
  size_t n_sparse_layers;
  double sparsity_measured[SK_CLIENT_MAX_LAYERS];
  double weight_bytes_per_token; /* weights one of its tokens reads, on
                                    average (0 from older daemons) */
  struct sk_spec_info speculation; /* its setting and counts */
};

int sk_client_session_stats(struct sk_client *client, uint64_t session,
                            struct sk_session_stats *ret,
                            struct sk_error *err);

/* The resident tokens of a session, in cache-position order (what the
 * model attends to; `stats` with "tokens"). Waits for jobs queued on the
 * session. On success *ret_tokens is a malloc'd array of *ret_n ids the
 * caller frees (NULL when empty). */
int sk_client_session_tokens(struct sk_client *client, uint64_t session,
                             int32_t **ret_tokens, size_t *ret_n,
                             struct sk_error *err);

/* ---- persistence ------------------------------------------------------ */

/* Sessions live in shared memory and survive a daemon restart (see
 * sinkd(8)). A session as resume, fork and import describe it. */
struct sk_session_summary {
  uint64_t session;  /* its id */
  char policy[SK_CLIENT_NAME_MAX];
  uint64_t capacity; /* tokens */
  uint64_t kv_bytes; /* bytes of its keys and values (sk_open_result) */
  uint64_t object_bytes; /* bytes of its shared-memory object */
  char kv_type[SK_CLIENT_NAME_MAX]; /* "f16" or "f32" ("" if the
                                       reply has none) */
  uint64_t resident; /* tokens in the cache */
  uint64_t seen;     /* tokens seen in total */
  uint64_t evicted;  /* tokens evicted in total */
  uint64_t commit;   /* commit counter of its object */
  bool adopted;      /* found in the state directory when the daemon started */
  uint64_t from;     /* fork: the session it was copied from; else 0 */
};

/* Picks a session up again by id (after a daemon restart: it was adopted
 * from the state directory) and reports where it stands. ret may be
 * NULL. Errors: no_such_session, forbidden. */
int sk_client_resume(struct sk_client *client, uint64_t session,
                     struct sk_session_summary *ret, struct sk_error *err);

/* Creates a new session from a copy of another's cache and state (no
 * recomputation: a prompt prefilled once serves many conversations). Runs
 * after the jobs queued on the source. ret->session is the new id, ret->from
 * the source. Errors: busy (limits), no_such_session, forbidden. */
int sk_client_fork(struct sk_client *client, uint64_t session,
                   struct sk_session_summary *ret, struct sk_error *err);

/* Exports a session (its committed state after the jobs queued on it) as
 * an image: on success *ret_data is a malloc'd buffer of *ret_len bytes
 * the caller frees. The image is checksummed and tied to the daemon's
 * model. */
int sk_client_export(struct sk_client *client, uint64_t session,
                     void **ret_data, size_t *ret_len, struct sk_error *err);

/* Imports an image of len bytes as a new session (for the caller's uid):
 * sent in chunks; the daemon checks it whole (size, checksums, model)
 * before the session exists. ret may be NULL. Errors: bad_request naming
 * what is wrong with the image (truncated, corrupted, another model),
 * busy (limits). */
int sk_client_import(struct sk_client *client, const void *data, size_t len,
                     struct sk_session_summary *ret, struct sk_error *err);

/* sk_client_export into a file at path, written 0600 under a temporary
 * name and renamed (a partial file never has the name). *ret_bytes (may
 * be NULL) gets its size. Errors: those of export, -SK_ERR_IO. */
int sk_client_save(struct sk_client *client, uint64_t session,
                   const char *path, size_t *ret_bytes, struct sk_error *err);

/* Reads the file at path and imports it. Errors: those of import,
 * -SK_ERR_IO. */
int sk_client_load(struct sk_client *client, const char *path,
                   struct sk_session_summary *ret, struct sk_error *err);

/* ---- append ----------------------------------------------------------- */

/* Whether a BOS token is put first. SK_BOS_DEFAULT leaves the field out:
 * the daemon then follows the vocabulary's add_bos (tokenizer.ggml.
 * add_bos_token), for append only on a session that has seen no token
 * yet. For text, SK_TEXT_SPECIAL may be or-ed in (parse_special): text of
 * control tokens ("<|im_start|>") then becomes those tokens; without it,
 * it is plain text, as user input must be. */
enum sk_bos {
  SK_BOS_DEFAULT = 0,
  SK_BOS_TRUE = 1,
  SK_BOS_FALSE = 2,
  SK_TEXT_SPECIAL = 4,
};

/* Reply to `append`. Plain value (~1 KiB). */
struct sk_append_result {
  uint64_t n_tokens; /* tokens appended */
  uint64_t resident; /* tokens in the cache after it */
  uint64_t seen;     /* tokens seen in total after it */
  uint64_t evicted;  /* tokens this request evicted */
  size_t n_ranges;   /* entries used in ranges */
  struct sk_range ranges[SK_CLIENT_MAX_RANGES]; /* evicted stream indices */
};

/* Appends len bytes of text (need not be NUL-terminated) to a session,
 * running them through the model (prefill). ret may be NULL. */
int sk_client_append_text(struct sk_client *client, uint64_t session,
                          const char *text, size_t len, enum sk_bos bos,
                          struct sk_append_result *ret, struct sk_error *err);

/* Appends n token ids. ret may be NULL. */
int sk_client_append_tokens(struct sk_client *client, uint64_t session,
                            const int32_t *tokens, size_t n, enum sk_bos bos,
                            struct sk_append_result *ret,
                            struct sk_error *err);

/* Appends n token ids like sk_client_append_tokens and also returns each
 * token's log-probability under the model given everything before it in
 * the session (natural log; the logits were computed from the cache as it
 * was, after any eviction). logprobs is the caller's array of n doubles;
 * an entry is NaN when nothing preceded the token (a session's first
 * token). ret may be NULL. */
int sk_client_append_logprobs(struct sk_client *client, uint64_t session,
                              const int32_t *tokens, size_t n,
                              enum sk_bos bos, double *logprobs,
                              struct sk_append_result *ret,
                              struct sk_error *err);

/* ---- generate --------------------------------------------------------- */

struct sk_generate_params {
  uint32_t max_tokens; /* at most this many tokens (<= 1048576) */
  double temperature;  /* 0 = greedy */
  uint32_t top_k;      /* 0 = off */
  double top_p;        /* in (0, 1] */
  uint64_t seed;       /* used only when has_seed */
  bool has_seed;       /* false: the session's own PRNG stream goes on
                          (seeded randomly at open, kept with the session
                          across daemon restarts) */
  const char *const *stop; /* n_stop NUL-terminated stop strings */
  size_t n_stop;
  bool ignore_eos;     /* keep going past the end-of-sequence token */
  const char *prompt;  /* NULL, or text appended first (like append) */
  size_t prompt_len;   /* bytes of prompt; 0 means strlen(prompt) */
  uint32_t n_top;      /* 0..20: top logits per token event */
  bool parse_special;  /* the prompt's control-token text becomes those
                          tokens (see SK_TEXT_SPECIAL) */
  bool logprobs;       /* each token event gives the token's
                          log-probability and bytes */
  uint32_t top_logprobs; /* 0..20: and the log-probabilities of the most
                            likely tokens at its place (implies logprobs) */
  /* Speculative decoding of this generate (as sk_open_params; NULL / 0:
   * the session's setting): "off", "draft" or "lookup", the most tokens
   * a step proposes, and whether always that many. */
  const char *speculation;
  uint32_t draft_tokens;
  bool draft_fixed;
};

/* Fills *p with the protocol's defaults: max_tokens 128, temperature 0.8,
 * top_k 40, top_p 0.95, no seed (the session's stream goes on), no stop
 * strings, ignore_eos false, no prompt, n_top 0, no log-probabilities. */
void sk_generate_params_init(struct sk_generate_params *p);

/* A [token, logit] pair of a token event (raw logit). */
struct sk_top_pair {
  int32_t token;
  double logit;
};

/* A likely token at a generated token's place (top_logprobs): its id,
 * log-probability and bytes. */
struct sk_top_logprob {
  int32_t token;
  double logprob;      /* ln p(token | what came before), the model's own
                          distribution (softmax of its logits) */
  const char *bytes;   /* bytes_len bytes of its text (a piece of a UTF-8
                          character for byte tokens), not NUL-terminated */
  size_t bytes_len;
};

/* One generated token, as given to the callback. Every pointer is valid
 * only during the callback. */
struct sk_token_event {
  uint64_t session;
  int32_t token;
  const char *text;   /* text_len bytes, whole UTF-8 characters, may be
                         empty; not NUL-terminated */
  size_t text_len;
  const struct sk_top_pair *top; /* n_top pairs, highest logit first */
  size_t n_top;
  /* With logprobs (else logprob is NaN, bytes NULL): ln p(token | what
   * came before) under the model's own distribution (softmax of its
   * logits: neither temperature nor top-k/top-p change it), and the
   * token's own bytes (bytes_len; text holds whole characters only). */
  double logprob;
  const char *bytes;
  size_t bytes_len;
  const struct sk_top_logprob *top_logprobs; /* n_top_logprobs, most likely
                                                first (top_logprobs) */
  size_t n_top_logprobs;
};

/* Called for every token event of a generate. Return 0 to continue;
 * nonzero to stop: the library then sends `cancel` for the session, calls
 * the callback no more, and still waits for the final reply (stop
 * "cancelled", unless the generate had already ended). */
typedef int (*sk_token_cb)(void *user, const struct sk_token_event *ev);

/* Final reply of a generate. Plain value (~1 KiB). */
struct sk_generate_result {
  char stop[SK_CLIENT_NAME_MAX]; /* "length", "eos", "stop", "cancelled",
                                    "context_full", or (chat)
                                    "end_of_turn" */
  int32_t stop_token;         /* "eos": the end-of-generation token that
                                 ended it (EOS, EOT, "<|im_end|>", ...);
                                 else -1 */
  char stop_text[SK_CLIENT_NAME_MAX]; /* "eos": that token's vocabulary
                                         text (cut to fit); else "" */
  uint64_t n_tokens;          /* tokens generated */
  uint64_t prompt_tokens;     /* usage: tokens of the prompt appended */
  uint64_t completion_tokens; /* usage: tokens generated */
  uint64_t drafted_tokens;    /* usage: tokens speculation proposed */
  uint64_t accepted_tokens;   /* usage: of those, kept (part of the
                                 completion) */
  uint64_t evicted;           /* tokens this request evicted */
  uint64_t resident;          /* tokens in the cache after it */
  uint64_t seen;              /* tokens seen in total after it */
  size_t n_ranges;            /* entries used in ranges */
  struct sk_range ranges[SK_CLIENT_MAX_RANGES]; /* evicted stream indices */
};

/* Generates on a session: streams each token to cb (may be NULL) and,
 * once the daemon's final reply arrives, fills *ret (may be NULL).
 * params may be NULL (defaults). A cancelled or context_full generate
 * still returns 0: look at ret->stop. An error before generation started
 * (e.g. no_such_session, bad_request) is returned as the daemon's code. */
int sk_client_generate(struct sk_client *client, uint64_t session,
                       const struct sk_generate_params *params,
                       sk_token_cb cb, void *user,
                       struct sk_generate_result *ret, struct sk_error *err);

/* One message of a chat. */
struct sk_chat_message {
  const char *role;    /* "system", "user", "assistant", ... (a-z, _) */
  const char *content; /* content_len bytes (0: strlen) */
  size_t content_len;
};

/* `chat`: formats messages[0..n) with the session's chat template (the
 * conversation so far is the session's: send only the new messages),
 * appends them and generates the assistant's reply like
 * sk_client_generate (params->prompt must be NULL), ending at the
 * template's end of turn (ret->stop "end_of_turn", or "eos"), which is
 * not streamed. A system message may come first in the session's first
 * chat. Errors: as sk_client_generate; -SK_ERR_BAD_REQUEST when the
 * session has no template (the message says why). */
int sk_client_chat(struct sk_client *client, uint64_t session,
                   const struct sk_chat_message *messages, size_t n,
                   const struct sk_generate_params *params, sk_token_cb cb, void *user,
                   struct sk_generate_result *ret, struct sk_error *err);

/* Cancels the generate running or queued on a session. *ret_cancelled
 * (may be NULL) tells whether there was one. */
int sk_client_cancel(struct sk_client *client, uint64_t session,
                     bool *ret_cancelled, struct sk_error *err);

/* ---- tokenizer -------------------------------------------------------- */

/* Tokenizes len bytes of text (special-token text such as "<s>" is
 * ordinary text unless bos has SK_TEXT_SPECIAL). On success *ret_tokens is a malloc'd array of *ret_n ids
 * that the caller frees with free() (NULL when *ret_n is 0). */
int sk_client_tokenize(struct sk_client *client, const char *text,
                       size_t len, enum sk_bos bos, int32_t **ret_tokens,
                       size_t *ret_n, struct sk_error *err);

/* Turns n ids into text. On success *ret_text is a malloc'd buffer of
 * *ret_len bytes plus a terminating NUL (the text itself may contain NUL
 * bytes); the caller frees it with free(). Ids outside the vocabulary give
 * -SK_ERR_BAD_REQUEST from the daemon. */
int sk_client_detokenize(struct sk_client *client, const int32_t *tokens,
                         size_t n, char **ret_text, size_t *ret_len,
                         struct sk_error *err);

#ifdef __cplusplus
}
#endif
#endif
