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
 * A draft session proposes from its history too, when a match there
 * promises more tokens per second than the draft model (history
 * proposals cost no draft pass; on code, which repeats itself, they
 * often do).
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
 * found; *ret_ngram its length. Returns how many (0: no match). */
uint32_t sk_spec_lookup(const struct sk_spec *sp, int32_t next, uint32_t max, int32_t *out,
                        uint32_t *ret_ngram);
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
/* Saves the draft cache's bookkeeping (sk_kv_meta_save) and the index it
 * has caught up to as they are before the step's t-th proposal is fed to
 * it (1 <= t < SK_SPEC_MAX_TOKENS; t = 1: right after the drawn token). */
void sk_spec_draft_save(struct sk_spec *sp, uint32_t t);
/* After the step: the session kept its drawn token and the first c - 1
 * proposals (c >= 1), of which the first `fed` went into the draft cache
 * (saves 1..fed were made): the cache goes back to the save before
 * proposal c (it then holds the kept tokens) when c <= fed, or stays as
 * it is (caught up to the last one fed) otherwise. */
void sk_spec_draft_keep(struct sk_spec *sp, uint32_t c, uint32_t fed);

/* ---- how many tokens to propose ----
 *
 * A step that proposes K tokens gives on average E(K) = 1 + a + a^2 +
 * ... + a^K tokens, a the chance that a proposal is kept when the one
 * before it was (each kept proposal, then the token drawn after them),
 * and costs a pass of K + 1 rows and, for a draft model, K passes of it,
 * which the scheduler measures (struct sk_spec_costs). The count
 * proposed is the K that gives the most tokens per second by those
 * costs and what the session's proposals achieved (a per mode, and per
 * n-gram length for the look-up, decaying averages). A pass's cost
 * grows with its rows in steps on some kernels (they take rows in
 * groups: F16 weights 2 or 3 rows cost as much, 4 to 6 as much), which
 * only measures show; until a count of rows has SK_SPEC_COST_SAMPLES
 * measures, a row is taken to add SK_SPEC_ROW_COST of a one-row pass,
 * and every SK_SPEC_EXPLORE_STEPS steps a session proposes the count
 * whose pass is measured least. Speculation that does not pay proposes
 * nothing, but tries one proposal every SK_SPEC_PROBE_STEPS steps, so
 * that a text that becomes predictable is noticed. */

/* What a proposed row adds to a one-row pass, as a share of it, before
 * measures: a one-row pass reads every weight from memory, more rows add
 * arithmetic on weights already read (0.3 per row on average for
 * pycode-29M F16 up to 16 rows, doc/performance.md). */
#define SK_SPEC_ROW_COST 0.3
/* Measures of a count of rows before its cost is taken from them. */
#define SK_SPEC_COST_SAMPLES 4u
/* Steps between two proposals of the least measured count. */
#define SK_SPEC_EXPLORE_STEPS 8u

/* Steps between tries of a session whose proposals do not pay. */
#define SK_SPEC_PROBE_STEPS 16u

/* What passes cost, measured by the scheduler (seconds, floors of the
 * samples that drift up slowly: a busy machine delays passes at random,
 * by more than their work): pass[n] a step whose only sequence is one
 * decoding session with n rows, samples[n] its measures; draft one pass
 * of the draft model for one session; 0 before any. */
struct sk_spec_costs {
  double pass[SK_SPEC_MAX_TOKENS + 2];
  uint32_t samples[SK_SPEC_MAX_TOKENS + 2];
  double draft;
};
/* Adds a measured pass of n rows, or of the draft model. */
void sk_spec_costs_pass(struct sk_spec_costs *c, uint32_t n, double seconds);
void sk_spec_costs_draft(struct sk_spec_costs *c, double seconds);

/* The count of proposals from source (DRAFT or LOOKUP; ngram the
 * look-up's match length, 0 for the draft), at most max
 * (<= SK_SPEC_MAX_TOKENS), that gives the most tokens per second by c,
 * possibly 0; *ret_rate that rate (tokens per second, or per one-row
 * pass before any measure). */
uint32_t sk_spec_best(const struct sk_spec *sp, uint32_t source, uint32_t ngram, uint32_t max,
                      const struct sk_spec_costs *c, double *ret_rate);
/* The count a step proposes, once its best count k is chosen (<= max):
 * every SK_SPEC_EXPLORE_STEPS steps the count whose pass is measured
 * least instead, and every SK_SPEC_PROBE_STEPS steps of 0 a 1. */
uint32_t sk_spec_step(struct sk_spec *sp, uint32_t k, uint32_t max,
                      const struct sk_spec_costs *c);
/* The step proposed `proposed` tokens (from source, ngram as for
 * sk_spec_best)
 * and the model kept `accepted` (<= proposed) of them before the first
 * it refused (none refused when accepted == proposed): updates the
 * acceptance and adds to the counters (drafted += proposed, accepted,
 * rejected += proposed - accepted). */
void sk_spec_result(struct sk_spec *sp, uint32_t source, uint32_t ngram, uint32_t proposed,
                    uint32_t accepted);

/* The counters since the session was made or adopted: tokens proposed
 * (and verified), kept and refused; drafted = accepted + rejected. The
 * caller holds whatever lock guards sp against the compute thread. */
struct sk_spec_counters {
  uint64_t drafted, accepted, rejected;
};
void sk_spec_counters(const struct sk_spec *sp, struct sk_spec_counters *ret);

#endif
