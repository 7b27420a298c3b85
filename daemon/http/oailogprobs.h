/* Log-probabilities in OpenAI's response shapes, from the token events
 * of a generate asked for them (sinkd-protocol(7), generate's logprobs
 * and top_logprobs):
 *
 *   chat (choices[].logprobs):
 *     {"content": [{"token": STR, "logprob": NUM, "bytes": [INT...],
 *                   "top_logprobs": [{"token", "logprob", "bytes"}...]}...],
 *      "refusal": null}
 *   completions (choices[].logprobs):
 *     {"tokens": [STR...], "token_logprobs": [NUM...],
 *      "top_logprobs": [{STR: NUM, ...}...], "text_offset": [INT...]}
 *
 * A token's "token" is its bytes as text (bytes that are not UTF-8, a
 * piece of a character, become U+FFFD); "bytes" are the bytes as they
 * are. A completion's top_logprobs map holds the likely tokens and the
 * one chosen (OpenAI: up to logprobs + 1 entries); text_offset counts
 * characters (code points) of the completion's text before the token.
 */
#ifndef SK_OAILOGPROBS_H
#define SK_OAILOGPROBS_H

#include <jansson.h>
#include <stdint.h>

#include "sinkd/client.h"

/* A token event's entry in the chat shape (its top_logprobs an empty
 * array when it has none). New reference, or NULL (out of memory). */
json_t *sk_oailp_entry(const struct sk_token_event *ev);

/* The chat shape of entries (taken). New reference or NULL. */
json_t *sk_oailp_chat(json_t *entries);

/* The completions shape of entries and their text_offset values (both
 * arrays of the same length, taken). New reference or NULL. */
json_t *sk_oailp_completion(json_t *entries, json_t *offsets);

/* Characters (code points) of len bytes of UTF-8 text. */
uint64_t sk_oailp_chars(const char *text, size_t len);

#endif
