/* OpenAI's log-probability shapes (oailogprobs.h). */
#include "http/oailogprobs.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/utf8.h"

/* bytes as a JSON string, each byte that does not begin a valid
 * character replaced by U+FFFD. */
static json_t *lossy_string(const char *bytes, size_t n) {
  char *out = malloc(3 * n + 1);
  if (!out) return NULL;
  size_t o = 0;
  const unsigned char *s = (const unsigned char *)bytes;
  for (size_t i = 0; i < n;) {
    uint32_t c;
    size_t k = sk_utf8_char(s + i, n - i, &c);
    if (k) {
      memcpy(out + o, s + i, k);
      o += k;
      i += k;
    } else {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
    }
  }
  json_t *j = json_stringn(out, o);
  free(out);
  return j;
}

static json_t *byte_list(const char *bytes, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++)
    json_array_append_new(a, json_integer((unsigned char)bytes[i]));
  return a;
}

json_t *sk_oailp_entry(const struct sk_token_event *ev) {
  json_t *top = json_array();
  for (size_t i = 0; top && i < ev->n_top_logprobs; i++) {
    const struct sk_top_logprob *t = &ev->top_logprobs[i];
    json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token",
                                         lossy_string(t->bytes, t->bytes_len), "logprob",
                                         t->logprob, "bytes",
                                         byte_list(t->bytes, t->bytes_len)));
  }
  const char *b = ev->bytes ? ev->bytes : "";
  return json_pack("{s:o, s:f, s:o, s:o}", "token", lossy_string(b, ev->bytes_len), "logprob",
                   ev->logprob, "bytes", byte_list(b, ev->bytes_len), "top_logprobs", top);
}

json_t *sk_oailp_chat(json_t *entries) {
  return json_pack("{s:o, s:n}", "content", entries, "refusal");
}

json_t *sk_oailp_completion(json_t *entries, json_t *offsets) {
  json_t *tokens = json_array(), *lps = json_array(), *tops = json_array();
  size_t i;
  json_t *e;
  json_array_foreach(entries, i, e) {
    json_t *token = json_object_get(e, "token"), *lp = json_object_get(e, "logprob");
    json_array_append(tokens, token);
    json_array_append(lps, lp);
    json_t *top = json_object(), *t;
    size_t k;
    json_array_foreach(json_object_get(e, "top_logprobs"), k, t)
        json_object_set(top, json_string_value(json_object_get(t, "token")),
                        json_object_get(t, "logprob"));
    json_object_set(top, json_string_value(token), lp); /* the one chosen */
    json_array_append_new(tops, top);
  }
  json_decref(entries);
  return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                   "top_logprobs", tops, "text_offset", offsets);
}

uint64_t sk_oailp_chars(const char *text, size_t len) {
  uint64_t n = 0;
  for (size_t i = 0; i < len; i++) n += ((unsigned char)text[i] & 0xc0) != 0x80;
  return n;
}
