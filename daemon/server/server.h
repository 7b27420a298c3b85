/* The server: a libuv loop on the main thread doing all socket I/O and
 * protocol work (framing, msgpack, request checks, replies), and the
 * compute thread (scheduler.h) doing all model work. See sinkd-protocol(7)
 * for the ops.
 *
 * Bounds (see limits in server.c): frame size, sessions, queued requests
 * per session, bytes waiting to be written per connection (a slow reader
 * pauses its own generation and reading, never the daemon).
 */
#ifndef SK_SERVER_H
#define SK_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "session/kvcache.h"
#include "model/model.h"
#include "session/store.h"
#include "model/tokenizer.h"

struct sk_server_config {
  const char *socket_path;
  const char *model_path;     /* for hello/logs */
  int listen_fd;              /* > 0: a listening socket passed by the
                                 service manager (socket activation, fd 3
                                 on): used as is, never bound nor
                                 unlinked; 0: bind socket_path */
  uint32_t max_frame;         /* request body limit, <= SK_FRAME_MAX_CEILING */
  uint32_t max_sessions;
  uint32_t max_clients;
  uint32_t max_capacity;      /* largest KV cache a session may have */
  uint64_t max_memory;        /* bytes of all sessions' KV caches; 0 = none */
  uint32_t max_user_sessions; /* sessions one uid may own at once; 0 = none */
  uint64_t max_user_kv_bytes; /* KV bytes of all sessions of one uid; 0 = none */
  uint32_t max_batch;         /* rows (tokens) of one forward pass */
  uint32_t step_tokens;       /* token budget of a pass while a session
                                 generates (sk_scheduler_new) */
  uint32_t threads;           /* compute threads (0 = 1) */
  uint32_t kv_type;           /* enum sk_kv_type of the caches (reported) */
  struct sk_kv_params defaults; /* for `open` without parameters */
  /* Called on the loop thread after the number of sessions or clients
   * changed (e.g. to update the service manager's STATUS=). May be NULL. */
  void (*on_change)(void *user, uint32_t n_sessions, uint32_t n_clients);
  void *user;
  struct sk_store *store;     /* the state directory (not owned) */
  uint32_t idle_ttl_s;        /* close sessions idle this long; 0 = never */
  uint32_t max_user_clients;  /* connections of one uid other than root
                                 (admit.h); 0 = none */
  uint32_t frame_timeout_s;   /* close a connection whose first request,
                                 or a request it began, is not complete
                                 this long after; 0 = never */
  uint64_t max_input_bytes;   /* bytes of unfinished request frames of all
                                 connections (admit.h); 0 = none */
  uint64_t max_user_input_bytes; /* the same per uid; 0 = none */
  int chat_template;          /* enum sk_chat_template of new sessions
                                 (SK_CHAT_NONE: no chat unless open names one) */
  const char *chat_error;     /* why the model's template was not taken, or
                                 NULL (copied at start) */
  /* Thresholds of the MLP sparsity levels sessions may ask for (sparse.h;
   * not owned, outlives the server; the model was sparse-prepared), or
   * NULL: sparsity unavailable. */
  const struct sk_sparse_calib *sparse;
  /* Speculation (spec.h): the draft model (not owned, outlives the
   * server; the model's vocabulary) or NULL; the history each session
   * keeps for look-up (tokens, 0: none); what generates speculate with
   * by default (enum sk_spec_mode, resolved: OFF, DRAFT or LOOKUP) and
   * the most tokens a step proposes. */
  const struct sk_model *draft;
  uint32_t lookup_history;
  uint32_t speculation;
  uint32_t draft_tokens;
};

struct sk_server;

/* Checks that a daemon could listen on path, before anything is loaded
 * (sk_listen_check_socket, listen.h): too long, not a socket or in use is
 * an error; a stale socket is fine (sk_server_new replaces it).
 * Changes nothing; sk_server_new checks again when it binds.
 * Errors: -SK_ERR_IO (too long, not a socket), -SK_ERR_BUSY (in use);
 * err's message names the path. */
int sk_server_check_socket(const char *path, struct sk_error *err);

/* Adopts the sessions of the state directory (cfg->store; logging one
 * line per adopted, set-aside or removed object), binds the socket
 * (replacing a stale socket file, refusing one a live daemon answers on;
 * mode 0660), starts the compute thread and begins accepting. model, tok
 * and the store must outlive the server.
 * Errors: -SK_ERR_IO (bind/listen, message has path and reason),
 * -SK_ERR_BUSY (socket in use), -SK_ERR_NO_MEMORY, -SK_ERR_INTERNAL. */
int sk_server_new(uv_loop_t *loop, const struct sk_server_config *cfg,
                    const struct sk_model *m, const struct sk_tokenizer *tok,
                    struct sk_server **ret, struct sk_error *err);
/* Counts a client of uid that does not speak the protocol itself (an
 * HTTP connection, from its accept) toward max_clients (with root's
 * reserve) and max_user_clients, exactly as a protocol connection is
 * counted. A refusal is logged (once per uid a minute). Errors:
 * -SK_ERR_BUSY (err names the limit), -SK_ERR_NO_MEMORY.
 * sk_server_unadmit gives the slot back. Loop thread only. */
int sk_server_admit(struct sk_server *srv, uint32_t uid, struct sk_error *err);
void sk_server_unadmit(struct sk_server *srv, uint32_t uid);
/* Serves one more client over fd, a connected stream socket (one end of
 * a socketpair: the HTTP front end, httpd.c, speaks the msgpack protocol
 * on the other end), as an accepted connection whose uid is given
 * instead of read with SO_PEERCRED. It serves a client admitted with
 * sk_server_admit (uid's slot held meanwhile) and takes no slot of its
 * own. Takes fd in every case (closed on error). Loop thread only.
 * Errors: -SK_ERR_NO_MEMORY, -SK_ERR_IO. */
int sk_server_attach(struct sk_server *srv, int fd, uint32_t uid, struct sk_error *err);

/* Applies new limits and session defaults to a running server (SIGHUP):
 * max_frame (new connections), max_sessions, max_clients, max_capacity,
 * max_memory, the per-user limits, frame_timeout_s and defaults. Sessions already open keep their caches.
 * max_sessions and max_capacity are clamped to their values at start
 * (the session table and the compute buffers are sized then); the other
 * fields of cfg are ignored. */
void sk_server_reconfigure(struct sk_server *srv, const struct sk_server_config *cfg);

/* Stops accepting, removes the socket file (unless it came from the
 * service manager), cancels running work, closes
 * every connection. The loop ends once everything is closed; then call
 * sk_server_free. */
void sk_server_shutdown(struct sk_server *srv);
void sk_server_free(struct sk_server *srv);

#endif
