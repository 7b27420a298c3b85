/* A session's speculative decoding state (the scheduler's use of it is
 * in scheduler.c; the rule that keeps the output exact in kvcache.h,
 * sk_kv_commit_prefix, and sampler.h, sk_sampler_verify).
 *
 * Speculative decoding (Leviathan et al. 2023, "Fast Inference from
 * Transformers via Speculative Decoding"; Chen et al. 2023): cheap
 * guesses of the next K tokens are checked by one forward pass of the
 * model over all of them, which reads the weights once for K + 1 tokens.
 * The guesses come from one of two places:
 *
 *   draft   a small model with the same vocabulary (sinkd.conf
 *           draft_model) runs ahead of the session's model on its own KV
 *           cache, of the session's policy and budget: the draft cache
 *           here. It lives in the daemon's memory, not in the session's
 *           object: it only proposes, so nothing a client sees depends
 *           on it but the speed; after an adoption, a fork or an import
 *           it is rebuilt from the session's resident tokens.
 *   lookup  the session's own history (Saxena 2023, "prompt lookup
 *           decoding"; llama.cpp's llama-lookup): the last n tokens
 *           (n = SK_SPEC_NGRAM_MAX down to SK_SPEC_NGRAM_MIN) are looked up
 *           among every token the session has seen, evicted ones
 *           included, up to the history limit, and the tokens that
 *           followed their latest earlier occurrence are proposed. The
 *           history is a ring of token ids with one hash table per n
 *           (the latest position after each n-gram): O(1) per token and
 *           proposal. Kept in the daemon's memory like the draft cache;
 *           after an adoption it starts again from the resident tokens.
 *
 * Both count toward the session's memory (sk_spec_bytes) from the time
 * the session may use them: a session that never speculates takes
 * nothing; one that may use a mode is charged for what it needs
 * (sk_spec_needs) and allowed it (sk_spec_allow). How many tokens are
 * proposed adapts to how many are accepted (sk_spec_k).
 *
 * Threads: the compute thread's while a job of the session runs (the
 * scheduler changes it only then), the loop thread's counters through
 * sk_spec_counters (under the session table's lock, session.c).
 */
#ifndef SK_SPEC_H
#define SK_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "session/kvcache.h"
#include "sinkd/protocol.h"

/* What a session speculates with (the wire names: sinkd/protocol.h's
 * SK_SPEC_LIST). SK_SPEC_DEFAULT: the daemon's default (draft when a
 * draft model is loaded, else off). */
enum sk_spec_mode {
#define SK__SPEC_ENUM(NAME, value, wire) SK_SPEC_##NAME = value,
  SK_SPEC_LIST(SK__SPEC_ENUM)
#undef SK__SPEC_ENUM
};

/* Largest number of tokens proposed per step: the draft's rows between
 * a saved and a restored cache must evict at most SK_KV_SPARE_SLOTS
 * tokens (kvcache.h, sk_kv_meta_save), and a verified chunk of K + 1
 * tokens must fit in the spare slots of a full streaming cache. */
#define SK_SPEC_MAX_TOKENS SK_SPEC_TOKENS_MAX
/* Tokens proposed per step when a request does not say. */
#define SK_SPEC_DEFAULT_TOKENS 8u
/* n-gram lengths the look-up tries, longest first: a longer match
 * predicts better; one token alone is too weak a context to be right
 * often enough to pay for its rows. */
#define SK_SPEC_NGRAM_MAX 4u
#define SK_SPEC_NGRAM_MIN 2u

/* The wire name of a mode ("off", "draft", "lookup"; "default" for
 * SK_SPEC_DEFAULT), NULL for other values; and the mode of a name of len
 * bytes (-1: unknown). */
const char *sk_spec_mode_name(uint32_t mode);
int sk_spec_mode_parse(const char *name, size_t len);

/* What every session's speculation state is made of: the draft model
 * (NULL: none) and the element type of its caches, the tokens of
 * history the look-up keeps (0: no look-up), and the mode of sessions
 * that do not choose (enum sk_spec_mode, resolved: OFF, DRAFT or
 * LOOKUP). */
struct sk_spec_config {
  const struct sk_model *draft;
  uint32_t kv_type;   /* enum sk_kv_type of draft caches */
  uint32_t history;   /* tokens */
  uint32_t default_mode;
};

/* The parts of a session's speculation state a mode uses (bits): the
 * history (look-up, and the draft cache's catching up), the draft
 * cache. */
#define SK_SPEC_NEEDS_HISTORY 1u
#define SK_SPEC_NEEDS_DRAFT 2u
/* What mode (SK_SPEC_DEFAULT: cfg->default_mode) uses of what cfg has. */
unsigned sk_spec_needs(const struct sk_spec_config *cfg, uint32_t mode);
/* Bytes the parts `needs` of a session with cache parameters p take
 * under cfg: its draft cache and the copy of its bookkeeping it saves
 * each step, its history ring and look-up tables; what counts toward its
 * memory, allocated or not. */
size_t sk_spec_bytes(const struct sk_spec_config *cfg, const struct sk_kv_params *p,
                     unsigned needs);

struct sk_spec;

/* A new, empty state for a session with cache parameters p (copied;
 * nothing big is allocated until used). *cfg must outlive it.
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_spec_new(const struct sk_spec_config *cfg, const struct sk_kv_params *p,
                struct sk_spec **ret, struct sk_error *err);
void sk_spec_free(struct sk_spec *sp);
/* The session may use the parts `needs` from now on (they were charged);
 * allowances only grow. Any thread: the compute thread reads them. */
void sk_spec_allow(struct sk_spec *sp, unsigned needs);
/* The parts allowed. */
unsigned sk_spec_allowed(const struct sk_spec *sp);

/* ---- history and look-up ---- */

/* The session committed tokens[0..n) at stream indices first..first+n-1
 * (a step's new tokens): they join the history. Returns false, changing
 * nothing, when the history does not end at first (an adopted, forked or
 * imported session, one that did not keep its history for a while, or
 * a new one): the caller starts it again with sk_spec_history_restart.
 * True without a history (none allowed). Compute thread. */
bool sk_spec_observe(struct sk_spec *sp, const int32_t *tokens, uint32_t n, uint64_t first);
/* Starts the history again from the cache's resident tokens (n ids in
 * cache order; the last is at stream index end - 1). Allocates the
 * history on first use; on failure the look-up stays empty. */
void sk_spec_history_restart(struct sk_spec *sp, const int32_t *resident, uint32_t n,
                             uint64_t end);
/* Whether the history ends at stream index end (observe saw every
 * token up to it). */
bool sk_spec_history_at(const struct sk_spec *sp, uint64_t end);
/* Proposes up to max tokens to follow the history and then `next` (the
 * token drawn for the step, not yet in the history) into out: the
 * tokens after the latest earlier occurrence of the longest n-gram
 * (SK_SPEC_NGRAM_MAX down to SK_SPEC_NGRAM_MIN tokens, `next` last)
 * found. Returns how many (0: no match). */
uint32_t sk_spec_lookup(const struct sk_spec *sp, int32_t next, uint32_t max, int32_t *out);
/* The history's tokens with stream indices [from, end) into out (end -
 * from of them), if it holds them all; returns false otherwise. */
bool sk_spec_history_copy(const struct sk_spec *sp, uint64_t from, uint64_t end, int32_t *out);

/* ---- the draft cache ---- */

/* The draft model's cache of the session (same policy and budget),
 * made on first use; NULL when there is no draft model, it is not
 * allowed, or no memory. */
struct sk_kv *sk_spec_draft_kv(struct sk_spec *sp);
/* The target's stream index the draft cache has caught up to (its
 * tokens are the session's up to there), or UINT64_MAX when it must be
 * rebuilt (new, or after a failed pass). */
uint64_t sk_spec_draft_synced(const struct sk_spec *sp);
/* The draft cache holds the session's tokens up to stream index
 * synced; UINT64_MAX: clears it, to be rebuilt. */
void sk_spec_draft_set_synced(struct sk_spec *sp, uint64_t synced);
/* Saves the draft cache's bookkeeping before the step's proposals are
 * drafted, and restores it after (sk_kv_meta_save): the cache is then as
 * it was before the proposals, caught up to the saved synced index. */
void sk_spec_draft_save(struct sk_spec *sp);
void sk_spec_draft_restore(struct sk_spec *sp);

/* ---- how many tokens to propose ---- */

/* Tokens to propose this step, at most max (1..SK_SPEC_MAX_TOKENS):
 * max when fixed, else the adaptive count (starting at max, growing by 2
 * after a step that kept every proposal, falling to one more than
 * were kept after one that did not). */
uint32_t sk_spec_k(const struct sk_spec *sp, uint32_t max, bool fixed);
/* The step proposed `proposed` tokens and the model kept `accepted`
 * (<= proposed) of them before the first it refused (none refused when
 * accepted == proposed): adapts the count and adds to the counters
 * (drafted += proposed, accepted, rejected += proposed - accepted). */
void sk_spec_result(struct sk_spec *sp, uint32_t max, uint32_t proposed, uint32_t accepted);

/* The counters since the session was made or adopted: tokens proposed
 * (and verified), kept and refused; drafted = accepted + rejected. The
 * caller holds whatever lock guards sp against the compute thread. */
struct sk_spec_counters {
  uint64_t drafted, accepted, rejected;
};
void sk_spec_counters(const struct sk_spec *sp, struct sk_spec_counters *ret);

#endif
