/* Client connections of the msgpack protocol: a stream socket each,
 * read into a frame reader and written with backpressure, admitted
 * against the per-uid limits (admit.h) and closed when a frame is
 * incomplete for too long. A connection knows nothing of sessions or
 * ops: its owner (the server) gets each complete frame, each change of
 * backpressure and each close through hooks, on the loop thread.
 *
 * Lifetime: a connection lives while it has references: the handle's
 * own (dropped once uv_close completes) and one per piece of work that
 * will still use it (sk_conn_ref/sk_conn_unref). Once closing, sends are
 * dropped; the memory stays valid until the last reference goes.
 */
#ifndef SK_CONN_H
#define SK_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "net/admit.h"
#include "proto/msg.h"
#include "sk_limits.h"

struct sk_conn;

/* Called on the loop thread with the set's user pointer. Any may be NULL. */
struct sk_conn_hooks {
  /* A complete request frame of conn: body (len bytes) is valid during the
   * call only. */
  void (*frame)(void *user, struct sk_conn *conn, const uint8_t *body, size_t len);
  /* conn's queued output went over SK_LIMIT_CONN_OUT (paused, reading
   * stopped) or back under half of it (reading again). */
  void (*pause)(void *user, struct sk_conn *conn, bool paused);
  /* A write of conn completed and conn is open: there may be room to send more
   * (sk_conn_has_room). */
  void (*drain)(void *user, struct sk_conn *conn);
  /* conn closes (the client left, an error, a deadline, shutdown): work
   * that holds conn must stop sending to it. */
  void (*close)(void *user, struct sk_conn *conn);
  /* The last reference to conn went: free what the owner keeps in
   * sk_conn_data(conn) (the bytes themselves go with conn). */
  void (*release)(void *user, struct sk_conn *conn);
  /* The number of open connections changed (not called while stopping). */
  void (*count)(void *user, uint32_t n_conns);
};

/* Limits of the set (sk_conns_set_limits changes them at run time). */
struct sk_conn_limits {
  uint32_t max_frame;        /* request body limit of new connections */
  struct sk_admit_limits admit;
  uint32_t frame_timeout_s;  /* close a connection whose request stays
                                incomplete this long; 0 = never */
};

struct sk_conn {
  uv_pipe_t pipe;
  struct sk_conns *set;
  uint64_t id;               /* 1, 2, ... in order of arrival */
  uint32_t uid;              /* the peer's (SO_PEERCRED), or as attached;
                                UINT32_MAX: unknown */
  struct sk_frame_reader rd;
  size_t out_bytes;          /* queued in uv_write, not yet written */
  bool out_paused;           /* over SK_LIMIT_CONN_OUT */
  bool closing;              /* uv_close called */
  uint32_t refs;             /* the handle + work that still uses it */
  bool admitted;             /* counted in set->admit */
  bool held;                 /* as a hold (sk_conn_begin's held) */
  uint64_t input_bytes;      /* of an unfinished frame, as counted in set->admit */
  uint64_t frame_since_ms;   /* since when a frame is awaited (connect, or
                                its first bytes); 0 = none */
  struct sk_conn *prev, *next;
  /* data_size bytes of the owner (sk_conn_data), zeroed at creation */
  _Alignas(max_align_t) unsigned char data[];
};

/* All connections of the daemon. */
struct sk_conns {
  uv_loop_t *loop;
  struct sk_conn_limits lim;
  struct sk_conn_hooks hooks;
  void *user;
  size_t data_size;
  struct sk_conn *head;      /* open connections, newest first */
  uint32_t count;
  uint64_t next_id;
  bool stopping;             /* sk_conns_stop called */
  struct sk_admit admit;     /* connections and partial input per uid */
  uv_timer_t frame_timer;    /* closes connections past frame_timeout_s */
  uv_timer_t trim_timer;     /* gives freed memory back once clients stop leaving */
  bool timers;               /* the two timers are initialised */
  char readbuf[SK_LIMIT_READ_BUF];
};

/* Open connections of the set. */
static inline uint32_t sk_conns_count(const struct sk_conns *set) { return set->count; }

/* Initialises an empty set on loop: its timers start; hooks and user are
 * kept; each connection carries data_size bytes for its owner. Loop
 * thread. */
void sk_conns_init(struct sk_conns *set, uv_loop_t *loop, const struct sk_conn_limits *lim,
                   const struct sk_conn_hooks *hooks, void *user, size_t data_size);
/* Applies new limits: max_frame to new connections, the admission
 * limits to the next admission, frame_timeout_s at once. */
void sk_conns_set_limits(struct sk_conns *set, const struct sk_conn_limits *lim);
/* Refuses new connections from now on, closes every open one and the
 * timers (run the loop afterwards to let the handles close). */
void sk_conns_stop(struct sk_conns *set);
/* Frees the set once it is stopped and the loop has closed its handles. */
void sk_conns_free(struct sk_conns *set);

/* A new connection of set with its pipe initialised (refs 1), for the
 * caller to accept into or open, then sk_conn_begin or sk_conn_discard.
 * NULL: out of memory. */
struct sk_conn *sk_conn_new(struct sk_conns *set);
/* Registers conn (pipe connected) for uid and starts reading it, or refuses
 * it (stopping, admission limits) with an error frame and closes it.
 * held: conn serves a connection of uid already admitted with
 * sk_conns_admit (the daemon's own connection behind an HTTP client), and
 * counts as a hold (admit.h), under that one's slot. */
void sk_conn_begin(struct sk_conn *conn, uint32_t uid, bool held);
/* Admits a connection of uid that is not one of the set's (an HTTP
 * client's, from its accept) under the same limits as the set's own:
 * max_clients with root's reserve, max_user_clients. A refusal is
 * logged (once per uid a minute, admit.h). Errors: -SK_ERR_BUSY (err
 * names the limit), -SK_ERR_NO_MEMORY. sk_conns_unadmit gives the slot
 * back. */
int sk_conns_admit(struct sk_conns *set, uint32_t uid, struct sk_error *err);
void sk_conns_unadmit(struct sk_conns *set, uint32_t uid);
/* Drops a connection from sk_conn_new that never began (closes the
 * handle; conn goes with it). */
void sk_conn_discard(struct sk_conn *conn);

/* The owner's bytes of conn (data_size of the set). */
static inline void *sk_conn_data(struct sk_conn *conn) { return conn->data; }

/* Sends a whole frame, taking data (malloc'd, freed in every case);
 * dropped once conn is closing. */
void sk_conn_send(struct sk_conn *conn, char *data, size_t len);
/* Finishes b and sends it (b is consumed). */
void sk_conn_send_msg(struct sk_conn *conn, struct sk_msgbuf *b);
/* Sends an error reply to request id (0: a frame without an id). */
void sk_conn_send_error(struct sk_conn *conn, uint64_t id, const struct sk_error *e);
void sk_conn_send_errorf(struct sk_conn *conn, uint64_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* conn's id (1, 2, ... in order of arrival), its peer's uid (UINT32_MAX:
 * unknown), whether it is closing (sends are dropped), and whether its
 * output is over SK_LIMIT_CONN_OUT (paused). */
static inline uint64_t sk_conn_id(const struct sk_conn *conn) { return conn->id; }
static inline uint32_t sk_conn_uid(const struct sk_conn *conn) { return conn->uid; }
static inline bool sk_conn_closing(const struct sk_conn *conn) { return conn->closing; }
static inline bool sk_conn_paused(const struct sk_conn *conn) { return conn->out_paused; }
/* Whether conn's queued output is under SK_LIMIT_CONN_OUT (more may go). */
static inline bool sk_conn_has_room(const struct sk_conn *conn) {
  return !conn->closing && conn->out_bytes < SK_LIMIT_CONN_OUT;
}

/* Closes conn (idempotent): the close hook runs, conn leaves the set. */
void sk_conn_close(struct sk_conn *conn);
/* References that keep conn's memory while work still uses it. */
void sk_conn_ref(struct sk_conn *conn);
void sk_conn_unref(struct sk_conn *conn);

#endif
