/* The checking of an OpenAI completion or chat request body (JSON, read
 * with jansson) into a struct of typed, ranged values: every field's type
 * and range, with a message naming the field that is wrong. No I/O: the
 * completion flow (oaicompl.h) and the fuzz target
 * (tests/fuzz/fuzz-http.c) call it.
 */
#ifndef SK_OAIREQ_H
#define SK_OAIREQ_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sk_limits.h"

/* A checked completion or chat request. Strings point into root. */
struct sk_openai_params {
  json_t *root;                /* owned */
  bool chat;
  const char *prompt;          /* completions */
  size_t prompt_len;
  json_t *messages;            /* chat: the array (borrowed from root); each
                                  message has a string "role" and a string
                                  or null "content" (text parts joined) */
  uint64_t max_tokens;
  double temperature, top_p;
  bool has_seed;
  uint64_t seed;
  bool has_top_k;
  uint64_t top_k;
  const char *stop[SK_LIMIT_OPENAI_STOPS];
  size_t stop_len[SK_LIMIT_OPENAI_STOPS];
  uint32_t n_stop;
  bool stream, include_usage;
  bool logprobs;               /* log-probabilities in the response */
  uint32_t top_logprobs;       /* and this many likely tokens each */
  enum { SK_OPENAI_SESSION_NONE, SK_OPENAI_SESSION_NEW, SK_OPENAI_SESSION_ID } session;
  uint64_t session_id;
  /* "new" session (or the temporary one): the open op's fields. */
  const char *policy;
  uint64_t n_sink, window, heavy, recent, capacity;
  bool has_n_sink, has_window, has_heavy, has_recent, has_capacity;
  /* Speculative decoding of this request (the generate op's fields):
   * "speculation" (off, draft, lookup; NULL: the session's), its
   * "draft_tokens" (1..15) and "draft_fixed". */
  const char *speculation;
  uint64_t draft_tokens;
  bool has_draft_tokens;
  bool draft_fixed, has_draft_fixed;
};

/* Checks a request body (JSON, len bytes). chat: a chat request
 * (messages) rather than a completion (prompt). Returns 0 with *p filled
 * (free with sk_openai_params_free), or an HTTP status (400) with msg
 * (msg_size bytes, NUL-terminated) saying which field is wrong and why;
 * then *p holds nothing to free. */
int sk_openai_parse(const char *body, size_t len, bool chat, struct sk_openai_params *p,
                    char *msg, size_t msg_size);
/* Frees what p owns and zeroes it. */
void sk_openai_params_free(struct sk_openai_params *p);

#endif
