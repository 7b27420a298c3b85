/* Admission: who may hold connections and buffer partial requests.
 *
 * Counts, per uid and in total, the connections open and the bytes of
 * request frames received but not yet complete, so that one user (uid)
 * cannot take every connection slot or all the input memory: the same
 * idea as redis's per-client limits (src/networking.c), per uid because
 * SO_PEERCRED names the uid and nothing finer.
 *
 * Rules (each refusal's message names the uid and the limit):
 * - at most max_clients connections in all;
 * - uids other than root share max_clients minus a reserve
 *   (sk_admit_root_reserve), so the administrator can always connect;
 * - a uid other than root holds at most max_user_clients (0 = no limit);
 * - partial input: at most max_input bytes in all and max_user_input
 *   bytes per uid (0 = no limit), root included.
 *
 * A connection that serves another one already counted (the daemon's
 * own connection behind an HTTP client's) is a hold instead: it keeps
 * the uid's entry (its input is counted there) without taking a slot.
 *
 * Refusals are reported to the log at most once per uid every
 * SK_LIMIT_REFUSAL_LOG_MS (sk_admit_refusal_log): a client retrying in
 * a loop must not flood the journal.
 *
 * The table lives on the loop thread only; no locking.
 */
#ifndef SK_ADMIT_H
#define SK_ADMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "sk_limits.h"
#include "sinkd/protocol.h"

struct sk_admit_limits {
  uint32_t max_clients;      /* connections in all, >= 1 */
  uint32_t max_user_clients; /* connections of one uid other than root; 0 = none */
  uint64_t max_input;        /* bytes of partial frames in all; 0 = none */
  uint64_t max_user_input;   /* bytes of partial frames of one uid; 0 = none */
};

struct sk_admit_user {
  uint32_t uid;
  uint32_t conns;       /* connections open */
  uint32_t holds;       /* connections counted under another (not in conns) */
  uint64_t input_bytes; /* bytes of their partial frames */
};

/* A uid whose refusals were reported lately (sk_admit_refusal_log). */
struct sk_admit_refusal {
  uint32_t uid;
  uint32_t unreported;  /* refusals since the last report */
  uint64_t reported_ms; /* when the last was reported; 0 = free entry */
};

struct sk_admit {
  struct sk_admit_user *users; /* (cap) the first n used, in no order; owned */
  uint32_t n, cap;
  uint32_t conns;          /* all connections */
  uint32_t conns_nonroot;  /* those of uids other than 0 */
  uint64_t input_bytes;    /* all partial frames */
  struct sk_admit_refusal refusals[SK_LIMIT_REFUSAL_LOG_UIDS];
};

void sk_admit_init(struct sk_admit *a);
void sk_admit_free(struct sk_admit *a);

/* Connections of max_clients that only root may take:
 * min(SK_LIMIT_ROOT_CLIENTS, max_clients / 2). */
uint32_t sk_admit_root_reserve(uint32_t max_clients);

/* Admits one more connection of uid, counting it, or refuses it.
 * Errors: -SK_ERR_BUSY (err says which limit, with the uid and counts),
 * -SK_ERR_NO_MEMORY (the table could not grow; nothing counted). */
int sk_admit_conn_add(struct sk_admit *a, const struct sk_admit_limits *l, uint32_t uid,
                      struct sk_error *err);
/* A connection of uid counted under another of the same uid that is
 * admitted (sk_admit_conn_add): keeps the uid's entry while it lives,
 * takes no slot and checks no limit. Errors: -SK_ERR_NO_MEMORY. */
int sk_admit_hold(struct sk_admit *a, uint32_t uid, struct sk_error *err);
/* Forgets one connection of uid (admitted by sk_admit_conn_add, or a
 * hold if `held`) holding input_bytes of partial input. */
void sk_admit_conn_remove(struct sk_admit *a, uint32_t uid, uint64_t input_bytes, bool held);
/* A connection of uid that holds `from` bytes of partial input would
 * hold `to`: counts it, or refuses when it grows past a limit (a
 * decrease is always accepted). Errors: -SK_ERR_BUSY (err names the uid,
 * the bytes and the limit); nothing changes then. */
int sk_admit_input(struct sk_admit *a, const struct sk_admit_limits *l, uint32_t uid,
                   uint64_t from, uint64_t to, struct sk_error *err);
/* Connections of uid now (0 if none). */
uint32_t sk_admit_user_conns(const struct sk_admit *a, uint32_t uid);
/* A refusal of uid at now_ms: whether to report it to the log (the first
 * one, or the first after SK_LIMIT_REFUSAL_LOG_MS since the last
 * report), with *ret_unreported the refusals left out since then. The
 * table remembers the SK_LIMIT_REFUSAL_LOG_UIDS uids reported last. */
bool sk_admit_refusal_log(struct sk_admit *a, uint32_t uid, uint64_t now_ms,
                          uint32_t *ret_unreported);

#endif
