/* libsinkd's requests with one reply (sinkd-protocol(7)): sessions (open,
 * close, list, stats), append and the tokenizer. */
#include "sinkd/client.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto/msg.h"
#include "proto/wire.h"
#include "libsinkd/client_int.h"

/* ---- sessions --------------------------------------------------------- */

int sk_client_open(struct sk_client *client,
                   const struct sk_open_params *params,
                   struct sk_open_result *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_open_params none;
  memset(&none, 0, sizeof none);
  const struct sk_open_params *p = params ? params : &none;
  size_t pin_len = p->pin ? (p->pin_len ? p->pin_len : strlen(p->pin)) : 0;
  if (p->pin && p->pin_tokens)
    return sk_error_set(err, SK_ERR_BAD_REQUEST,
                        "give either a pin text or pin tokens, not both");
  if (!p->pin_tokens && p->n_pin_tokens > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "pin_tokens is NULL");
  if (pin_len > UINT32_MAX || p->n_pin_tokens > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "pin too long");
  if (p->rope_scale < 0 || p->rope_scale != p->rope_scale)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "rope_scale must be > 0");
  if (!(p->sparsity >= 0 && p->sparsity < 1))
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "sparsity must be in [0, 1)");
  bool has_pin_tokens = p->pin_tokens && p->n_pin_tokens > 0;
  size_t system_len = p->system ? (p->system_len ? p->system_len : strlen(p->system)) : 0;
  if (system_len > UINT32_MAX) return sk_error_set(err, SK_ERR_TOO_LARGE, "system too long");
  /* A 0 or NULL field is the daemon's default: left out. */
  const struct sk_wire_open_req req = {
      .policy = p->policy, .policy_len = p->policy ? strlen(p->policy) : 0,
      .has_n_sink = p->n_sink || p->has_n_sink, .n_sink = p->n_sink,
      .has_window = p->window != 0, .window = p->window,
      .has_heavy = p->heavy != 0, .heavy = p->heavy,
      .has_recent = p->recent != 0, .recent = p->recent,
      .has_capacity = p->capacity != 0, .capacity = p->capacity,
      .has_rope_scale = p->rope_scale != 0, .rope_scale = p->rope_scale,
      .pin = p->pin, .pin_len = pin_len,
      .has_temporary = p->temporary, .temporary = p->temporary,
      .chat_template = p->chat_template,
      .chat_template_len = p->chat_template ? strlen(p->chat_template) : 0,
      .system = p->system, .system_len = system_len,
      .has_sparsity = p->sparsity != 0, .sparsity = p->sparsity,
      .pin_tokens = {.has = has_pin_tokens, .ids = p->pin_tokens, .n = p->n_pin_tokens},
      .spec = {.mode = p->speculation, .mode_len = p->speculation ? strlen(p->speculation) : 0,
               .has_tokens = p->draft_tokens != 0, .tokens = p->draft_tokens,
               .has_fixed = p->draft_fixed, .fixed = p->draft_fixed},
  };
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_open_req(&b, id, &req), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;

  struct sk_open_result o;
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_open(&reply.root, &o, &perr), &perr, err);
  if (rc == 0 && ret) *ret = o;
  sk_msg_free(&reply);
  return rc;
}

int sk_client_close_session(struct sk_client *client, uint64_t session,
                            struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, SK_OP_CLOSE, session, &reply, err);
  if (rc < 0) return rc;
  sk_msg_free(&reply);
  return 0;
}

int sk_client_list(struct sk_client *client,
                   struct sk_session_info **ret_sessions, size_t *ret_n,
                   struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_simple(client, SK_OP_LIST, &reply, err);
  if (rc < 0) return rc;
  struct sk_session_info *rows = NULL;
  size_t n = 0;
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_list(&reply.root, &rows, &n, &perr), &perr, err);
  if (rc == 0) {
    *ret_sessions = rows;
    *ret_n = n;
  }
  sk_msg_free(&reply);
  return rc;
}

/* A float array field into dst[max]; *ret_n entries copied. */
int sk_client_session_stats(struct sk_client *client, uint64_t session,
                            struct sk_session_stats *ret,
                            struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, SK_OP_STATS, session, &reply, err);
  if (rc < 0) return rc;
  struct sk_session_stats *s = malloc(sizeof *s); /* ~3 KiB */
  if (!s) {
    sk_msg_free(&reply);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  struct sk_error perr;
  rc = sk__client_wire(client, sk_wire_unpack_session_stats(&reply.root, s, &perr), &perr, err);
  if (rc == 0) *ret = *s;
  free(s);
  sk_msg_free(&reply);
  return rc;
}

/* ---- append ----------------------------------------------------------- */

/* Reads an append reply; with logprobs (n entries) also its
 * log-probabilities (nil -> NaN). Frees the reply. */
static int sk__client_append_reply(struct sk_client *client, struct sk_msg *reply,
                                   struct sk_append_result *ret,
                                   double *logprobs, size_t n,
                                   struct sk_error *err) {
  struct sk_append_result a;
  struct sk_error perr;
  int rc = sk__client_wire(client, sk_wire_unpack_append(&reply->root, &a, logprobs, n, &perr),
                           &perr, err);
  if (rc == 0 && ret) *ret = a;
  sk_msg_free(reply);
  return rc;
}

/* The "bos" and "parse_special" of an input, from bos. */
static void sk__client_bos(struct sk_wire_input *in, enum sk_bos bos) {
  in->bos = (bos & 3) == SK_BOS_DEFAULT ? -1 : (bos & 3) == SK_BOS_TRUE;
  in->parse_special = (bos & SK_TEXT_SPECIAL) != 0;
}

/* text: whether SK_TEXT_SPECIAL may go with it (text input only). */
static int sk__client_check_bos(enum sk_bos bos, bool text, struct sk_error *err) {
  unsigned b = (unsigned)bos & ~(text ? (unsigned)SK_TEXT_SPECIAL : 0u);
  if (b != SK_BOS_DEFAULT && b != SK_BOS_TRUE && b != SK_BOS_FALSE)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "invalid bos value %d",
                        (int)bos);
  return 0;
}

int sk_client_append_text(struct sk_client *client, uint64_t session,
                          const char *text, size_t len, enum sk_bos bos,
                          struct sk_append_result *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if ((rc = sk__client_check_bos(bos, true, err)) < 0) return rc;
  if (!text && len > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "text is NULL");
  if (len > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "text of %zu bytes", len);
  struct sk_wire_append_req a = {.session = session,
                                .input = {.text = text ? text : "", .text_len = len}};
  sk__client_bos(&a.input, bos);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_append_req(&b, id, &a), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;
  return sk__client_append_reply(client, &reply, ret, NULL, 0, err);
}

static int sk__client_append_tokens(struct sk_client *client,
                                    uint64_t session, const int32_t *tokens,
                                    size_t n, enum sk_bos bos,
                                    double *logprobs,
                                    struct sk_append_result *ret,
                                    struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if ((rc = sk__client_check_bos(bos, false, err)) < 0) return rc;
  if (!tokens && n > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "tokens is NULL");
  if (n > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu tokens", n);
  struct sk_wire_append_req a = {
      .session = session,
      .input = {.tokens = {.has = true, .ids = tokens, .n = n}},
      .logprobs = logprobs != NULL};
  sk__client_bos(&a.input, bos);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_append_req(&b, id, &a), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;
  return sk__client_append_reply(client, &reply, ret, logprobs, n, err);
}

int sk_client_append_tokens(struct sk_client *client, uint64_t session,
                            const int32_t *tokens, size_t n, enum sk_bos bos,
                            struct sk_append_result *ret,
                            struct sk_error *err) {
  return sk__client_append_tokens(client, session, tokens, n, bos, NULL, ret,
                                  err);
}

int sk_client_append_logprobs(struct sk_client *client, uint64_t session,
                              const int32_t *tokens, size_t n,
                              enum sk_bos bos, double *logprobs,
                              struct sk_append_result *ret,
                              struct sk_error *err) {
  if (!logprobs && n > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "logprobs is NULL");
  double dummy;
  return sk__client_append_tokens(client, session, tokens, n, bos,
                                  logprobs ? logprobs : &dummy, ret, err);
}

/* ---- tokenizer -------------------------------------------------------- */

int sk_client_tokenize(struct sk_client *client, const char *text,
                       size_t len, enum sk_bos bos, int32_t **ret_tokens,
                       size_t *ret_n, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if ((rc = sk__client_check_bos(bos, true, err)) < 0) return rc;
  if (!text && len > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "text is NULL");
  if (len > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "text of %zu bytes", len);
  struct sk_wire_input in = {.text = text ? text : "", .text_len = len};
  sk__client_bos(&in, bos);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_tokenize_req(&b, id, &in), err)) < 0) return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;

  struct sk_error perr;
  int32_t *ids = NULL;
  size_t n = 0;
  rc = sk__client_wire(client, sk_wire_unpack_tokens(&reply.root, &ids, &n, &perr), &perr, err);
  if (rc == 0) {
    *ret_tokens = ids;
    *ret_n = n;
  }
  sk_msg_free(&reply);
  return rc;
}

int sk_client_detokenize(struct sk_client *client, const int32_t *tokens,
                         size_t n, char **ret_text, size_t *ret_len,
                         struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if (!tokens && n > 0)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "tokens is NULL");
  if (n > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu tokens", n);
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_detokenize_req(&b, id, tokens, n), err)) < 0)
    return rc;
  struct sk_msg reply;
  if ((rc = sk__client_call(client, &b, id, &reply, err)) < 0) return rc;

  struct sk_error perr;
  char *text = NULL;
  size_t len = 0;
  rc = sk__client_wire(client, sk_wire_unpack_text(&reply.root, &text, &len, &perr), &perr, err);
  if (rc == 0) {
    *ret_text = text;
    *ret_len = len;
  }
  sk_msg_free(&reply);
  return rc;
}
