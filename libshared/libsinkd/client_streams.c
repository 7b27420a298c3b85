/* libsinkd's requests that stream (sinkd-protocol(7)): generate and chat
 * with their token events, cancel, and the session transfers (resume,
 * fork, tokens, export and import in chunks, save and load). */
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

/* ---- generate --------------------------------------------------------- */

void sk_generate_params_init(struct sk_generate_params *p) {
  memset(p, 0, sizeof *p);
  p->max_tokens = SK_GENERATE_DEFAULT_MAX_TOKENS;
  p->temperature = SK_GENERATE_DEFAULT_TEMPERATURE;
  p->top_k = SK_GENERATE_DEFAULT_TOP_K;
  p->top_p = SK_GENERATE_DEFAULT_TOP_P;
}

/* Calls cb with one token event frame. Returns the callback's answer
 * (0 = go on) or a negative code for a malformed event. */
static int sk__client_token_event(struct sk_client *client,
                                  const msgpack_object *ev, uint64_t session,
                                  sk_token_cb cb, void *user,
                                  int *ret_stop, struct sk_error *err) {
  struct sk_top_pair top[SK_WIRE_MAX_TOP];
  struct sk_top_logprob toplp[SK_WIRE_MAX_TOP];
  struct sk_token_event te;
  struct sk_error perr;
  int rc = sk__client_wire(client, sk_wire_unpack_token_event(ev, &te, top, toplp, &perr), &perr,
                           err);
  if (rc < 0) return rc;
  te.session = session;
  *ret_stop = cb ? cb(user, &te) : 0;
  return 0;
}

static int sk__client_generate_result(struct sk_client *client,
                                      const msgpack_object *r,
                                      struct sk_generate_result *g,
                                      struct sk_error *err) {
  struct sk_error perr;
  return sk__client_wire(client, sk_wire_unpack_generate(r, g, &perr), &perr, err);
}

static int sk__client_generate(struct sk_client *client, uint64_t session,
                               const struct sk_generate_params *params,
                               const struct sk_chat_message *msgs, size_t n_msgs,
                               sk_token_cb cb, void *user,
                               struct sk_generate_result *ret, struct sk_error *err);

int sk_client_generate(struct sk_client *client, uint64_t session,
                       const struct sk_generate_params *params,
                       sk_token_cb cb, void *user,
                       struct sk_generate_result *ret, struct sk_error *err) {
  return sk__client_generate(client, session, params, NULL, 0, cb, user, ret, err);
}

int sk_client_chat(struct sk_client *client, uint64_t session,
                   const struct sk_chat_message *messages, size_t n,
                   const struct sk_generate_params *params, sk_token_cb cb, void *user,
                   struct sk_generate_result *ret, struct sk_error *err) {
  if (n == 0 || !messages) return sk_error_set(err, SK_ERR_BAD_REQUEST, "no message");
  if (n > UINT32_MAX) return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu messages", n);
  for (size_t i = 0; i < n; i++)
    if (!messages[i].role || !messages[i].content)
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "messages[%zu]: role or content is NULL", i);
  if (params && params->prompt)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "chat takes messages, not a prompt");
  return sk__client_generate(client, session, params, messages, n, cb, user, ret, err);
}

static int sk__client_generate(struct sk_client *client, uint64_t session,
                               const struct sk_generate_params *params,
                               const struct sk_chat_message *msgs, size_t n_msgs,
                               sk_token_cb cb, void *user,
                               struct sk_generate_result *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_generate_params defaults;
  sk_generate_params_init(&defaults);
  const struct sk_generate_params *p = params ? params : &defaults;
  if (p->n_stop > 0 && !p->stop)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "stop is NULL");
  for (size_t i = 0; i < p->n_stop; i++)
    if (!p->stop[i])
      return sk_error_set(err, SK_ERR_BAD_REQUEST, "stop[%zu] is NULL", i);
  if (p->n_stop > UINT32_MAX)
    return sk_error_set(err, SK_ERR_TOO_LARGE, "%zu stop strings", p->n_stop);
  size_t prompt_len = 0;
  if (p->prompt) prompt_len = p->prompt_len ? p->prompt_len : strlen(p->prompt);
  bool has_prompt = p->prompt && prompt_len > 0;

  /* The sampling fields are always sent (sk_generate_params_init holds
   * the protocol's defaults); the optional ones only when set. */
  const struct sk_wire_generate_req req = {
      .messages = {.m = msgs, .n = n_msgs},
      .session = session,
      .max_tokens = p->max_tokens,
      .temperature = p->temperature,
      .top_k = p->top_k,
      .top_p = p->top_p,
      .ignore_eos = p->ignore_eos,
      .has_seed = p->has_seed,
      .seed = p->seed,
      .stop = {.s = p->stop, .n = p->n_stop},
      .input = {.text = has_prompt ? p->prompt : NULL,
                .text_len = has_prompt ? prompt_len : 0,
                .bos = -1,
                .parse_special = has_prompt && p->parse_special},
      .n_top = p->n_top,
      .logprobs = p->logprobs || p->top_logprobs > 0,
      .top_logprobs = p->top_logprobs,
      .spec = {.mode = p->speculation, .mode_len = p->speculation ? strlen(p->speculation) : 0,
               .has_tokens = p->draft_tokens != 0, .tokens = p->draft_tokens,
               .has_fixed = p->draft_fixed, .fixed = p->draft_fixed},
  };
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_generate_req(&b, id, msgs != NULL, &req), err)) < 0)
    return rc;
  if ((rc = sk__client_send(client, &b, err)) < 0) return rc;

  /* Read events until the final reply, and, if the callback asked to
   * stop, also until the reply to our cancel (in whichever order the two
   * arrive), so the next request starts on a clean stream. */
  uint64_t cancel_id = 0;
  bool have_final = false, have_cancel_reply = false;
  int result = 0;
  struct sk_generate_result g;
  memset(&g, 0, sizeof g);
  while (!have_final || (cancel_id != 0 && !have_cancel_reply)) {
    struct sk_msg msg;
    uint64_t got;
    if ((rc = sk__client_recv(client, &msg, &got, err)) < 0) return rc;
    const msgpack_object *r = &msg.root;

    if (got == id && !have_final) {
      struct sk_error perr;
      enum sk_wire_kind kind;
      if (sk_wire_unpack_kind(r, &kind, &perr) < 0) {
        sk_msg_free(&msg);
        return sk__client_bad_reply(client, err, perr.message);
      }
      if (kind != SK_WIRE_REPLY) {
        /* Events other than "token" are for future versions: skipped. */
        if (kind == SK_WIRE_EVENT_TOKEN) {
          int stop = 0;
          rc = sk__client_token_event(client, r, session,
                                      cancel_id ? NULL : cb, user, &stop,
                                      err);
          if (rc < 0) {
            sk_msg_free(&msg);
            return rc;
          }
          if (stop && !cancel_id) {
            struct sk_msgbuf cb_buf;
            cancel_id = sk__client_id(client);
            if ((rc = sk__client_packed(
                     sk_wire_pack_session_req(&cb_buf, cancel_id, SK_OP_CANCEL, session), err)) <
                    0 ||
                (rc = sk__client_send(client, &cb_buf, err)) < 0) {
              sk_msg_free(&msg);
              return rc;
            }
          }
        }
        sk_msg_free(&msg);
        continue;
      }
      have_final = true;
      result = sk__client_status(client, &msg, err);
      if (result == 0) result = sk__client_generate_result(client, r, &g, err);
      sk_msg_free(&msg);
      if (!sk_client_connected(client)) return result;
      continue;
    }
    if (cancel_id != 0 && got == cancel_id && !have_cancel_reply) {
      /* Whatever it says (the generate may have ended by itself), the
       * final reply of the generate is what counts. */
      have_cancel_reply = true;
      sk_msg_free(&msg);
      continue;
    }
    if (got == 0 && !have_final) {
      /* The daemon could not read the request (e.g. too large). */
      have_final = true;
      result = sk__client_status(client, &msg, err);
      sk_msg_free(&msg);
      if (result == 0)
        return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                               "reply with id 0 while waiting for %" PRIu64,
                               id);
      if (!sk_client_connected(client)) return result;
      continue;
    }
    sk_msg_free(&msg);
    return sk__client_fail(client, err, SK_ERR_PROTOCOL,
                           "reply with id %" PRIu64 " while waiting for %" PRIu64,
                           got, id);
  }
  if (result == 0 && ret) *ret = g;
  return result;
}

int sk_client_cancel(struct sk_client *client, uint64_t session,
                     bool *ret_cancelled, struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, SK_OP_CANCEL, session, &reply, err);
  if (rc < 0) return rc;
  struct sk_error perr;
  bool cancelled = false;
  rc = sk__client_wire(client, sk_wire_unpack_cancel(&reply.root, &cancelled, &perr), &perr, err);
  if (rc == 0 && ret_cancelled) *ret_cancelled = cancelled;
  sk_msg_free(&reply);
  return rc;
}

/* ---- persistence ------------------------------------------------------ */

/* Bytes per import chunk to start with; halved while the daemon answers
 * too_large (its frame limit may be set low). */
#define SK__IMPORT_CHUNK (256u * 1024u)
#define SK__IMPORT_CHUNK_MIN 1024u
/* Largest file sk_client_load reads: far above any session cache this
 * daemon can hold, and a bound on what a wrong path can make us read. */
#define SK__LOAD_MAX ((uint64_t)64 << 30)

static int sk__reply_summary(struct sk_client *client, const msgpack_object *r,
                             struct sk_session_summary *ret,
                             struct sk_error *err) {
  struct sk_session_summary s;
  struct sk_error perr;
  int rc = sk__client_wire(client, sk_wire_unpack_summary(r, &s, &perr), &perr, err);
  if (rc == 0 && ret) *ret = s;
  return rc;
}

static int sk__client_summary_op(struct sk_client *client, enum sk_op op,
                                 uint64_t session,
                                 struct sk_session_summary *ret,
                                 struct sk_error *err) {
  struct sk_msg reply;
  int rc = sk__client_on_session(client, op, session, &reply, err);
  if (rc < 0) return rc;
  rc = sk__reply_summary(client, &reply.root, ret, err);
  sk_msg_free(&reply);
  return rc;
}

int sk_client_resume(struct sk_client *client, uint64_t session,
                     struct sk_session_summary *ret, struct sk_error *err) {
  return sk__client_summary_op(client, SK_OP_RESUME, session, ret, err);
}

int sk_client_fork(struct sk_client *client, uint64_t session,
                   struct sk_session_summary *ret, struct sk_error *err) {
  return sk__client_summary_op(client, SK_OP_FORK, session, ret, err);
}

int sk_client_session_tokens(struct sk_client *client, uint64_t session,
                             int32_t **ret_tokens, size_t *ret_n,
                             struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  const struct sk_wire_stats_req st = {.has_session = true, .session = session, .tokens = true};
  if ((rc = sk__client_packed(sk_wire_pack_stats_req(&b, id, &st), err)) < 0) return rc;
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

int sk_client_export(struct sk_client *client, uint64_t session,
                     void **ret_data, size_t *ret_len, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  struct sk_msgbuf b;
  uint64_t id = sk__client_id(client);
  if ((rc = sk__client_packed(sk_wire_pack_session_req(&b, id, SK_OP_EXPORT, session), err)) < 0 ||
      (rc = sk__client_send(client, &b, err)) < 0)
    return rc;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    struct sk_msg msg;
    uint64_t got;
    if ((rc = sk__client_recv(client, &msg, &got, err)) < 0) goto fail;
    const msgpack_object *r = &msg.root;
    if (got != id && got != 0) {
      sk_msg_free(&msg);
      rc = sk__client_fail(client, err, SK_ERR_PROTOCOL,
                           "reply with id %" PRIu64 " while waiting for %" PRIu64, got, id);
      goto fail;
    }
    struct sk_error perr;
    enum sk_wire_kind kind = SK_WIRE_REPLY;
    if (got == id && sk_wire_unpack_kind(r, &kind, &perr) < 0) {
      sk_msg_free(&msg);
      rc = sk__client_bad_reply(client, err, perr.message);
      goto fail;
    }
    if (kind != SK_WIRE_REPLY) {
      uint64_t off = UINT64_MAX;
      const char *data;
      size_t n;
      if (kind == SK_WIRE_EVENT_DATA) {
        if (sk_wire_unpack_data_event(r, &off, &data, &n, &perr) < 0 || off != len) {
          sk_msg_free(&msg);
          rc = sk__client_bad_reply(client, err, "export data event out of order");
          goto fail;
        }
        if (len + n > cap) {
          size_t nc = cap ? cap : n;
          while (nc < len + n) nc *= 2;
          char *nb = realloc(buf, nc);
          if (!nb) {
            sk_msg_free(&msg);
            rc = sk__client_fail(client, err, SK_ERR_NO_MEMORY, "out of memory for an export");
            goto fail;
          }
          buf = nb;
          cap = nc;
        }
        memcpy(buf + len, data, n);
        len += n;
      }
      sk_msg_free(&msg);
      continue;
    }
    rc = sk__client_status(client, &msg, err);
    uint64_t bytes = 0;
    if (rc == 0 && got == 0)
      rc = sk__client_fail(client, err, SK_ERR_PROTOCOL,
                           "reply with id 0 while waiting for %" PRIu64, id);
    if (rc == 0 &&
        (rc = sk__client_wire(client, sk_wire_unpack_export(r, &bytes, &perr), &perr, err)) == 0 &&
        bytes != len)
      rc = sk__client_bad_reply(client, err, "export size differs from the data received");
    sk_msg_free(&msg);
    if (rc < 0) goto fail;
    *ret_data = buf;
    *ret_len = len;
    return 0;
  }
fail:
  free(buf);
  return rc;
}

int sk_client_import(struct sk_client *client, const void *data, size_t len,
                     struct sk_session_summary *ret, struct sk_error *err) {
  int rc = sk__client_check(client, err);
  if (rc < 0) return rc;
  if (!data && len > 0) return sk_error_set(err, SK_ERR_BAD_REQUEST, "data is NULL");
  size_t chunk = SK__IMPORT_CHUNK, off = 0;
  for (;;) {
    size_t n = len - off < chunk ? len - off : chunk;
    struct sk_msgbuf b;
    uint64_t id = sk__client_id(client);
    const struct sk_wire_import_req chunk_req = {
        .total = len, .offset = off, .data = (const char *)data + off, .len = n};
    if ((rc = sk__client_packed(sk_wire_pack_import_req(&b, id, &chunk_req), err)) < 0) return rc;
    struct sk_msg reply;
    struct sk_error e2;
    rc = sk__client_call(client, &b, id, &reply, &e2);
    if (rc == -SK_ERR_TOO_LARGE && sk_client_connected(client) && chunk > SK__IMPORT_CHUNK_MIN) {
      /* The daemon's frame limit is lower: the chunk was refused unread
       * and the import stands where it was. */
      chunk /= 2;
      continue;
    }
    if (rc < 0) {
      if (err) *err = e2;
      return rc;
    }
    off += n;
    if (off >= len) {
      rc = sk__reply_summary(client, &reply.root, ret, err);
      sk_msg_free(&reply);
      return rc;
    }
    sk_msg_free(&reply);
  }
}

int sk_client_save(struct sk_client *client, uint64_t session, const char *path,
                   size_t *ret_bytes, struct sk_error *err) {
  void *data = NULL;
  size_t len = 0;
  int rc = sk_client_export(client, session, &data, &len, err);
  if (rc < 0) return rc;
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) {
    free(data);
    return sk_error_set(err, SK_ERR_IO, "path %s is too long", path);
  }
  int fd = mkstemp(tmp); /* mode 0600 */
  if (fd < 0) {
    int e = errno;
    free(data);
    return sk_error_set(err, SK_ERR_IO, "cannot create a file next to %s: %s", path,
                        strerror(e));
  }
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      close(fd);
      unlink(tmp);
      free(data);
      return sk_error_set(err, SK_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
    }
    p += w;
    left -= (size_t)w;
  }
  free(data);
  if (fsync(fd) < 0 || close(fd) < 0) {
    int e = errno;
    unlink(tmp);
    return sk_error_set(err, SK_ERR_IO, "cannot write %s: %s", tmp, strerror(e));
  }
  if (rename(tmp, path) < 0) {
    int e = errno;
    unlink(tmp);
    return sk_error_set(err, SK_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(e));
  }
  if (ret_bytes) *ret_bytes = len;
  return 0;
}

int sk_client_load(struct sk_client *client, const char *path,
                   struct sk_session_summary *ret, struct sk_error *err) {
  /* O_NONBLOCK: a FIFO with no writer is refused below, not waited on */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
  if (!f) {
    int e = errno;
    if (fd >= 0) close(fd);
    return sk_error_set(err, SK_ERR_IO, "cannot open %s: %s", path, strerror(e));
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0 ||
      (uint64_t)sb.st_size > SK__LOAD_MAX) {
    fclose(f);
    if (S_ISREG(sb.st_mode))
      return sk_error_set(err, SK_ERR_IO, "%s is larger than an exported session can be (%llu bytes)",
                          path, (unsigned long long)SK__LOAD_MAX);
    return sk_error_set(err, SK_ERR_IO, "%s is %s, not an exported session file", path,
                        S_ISDIR(sb.st_mode) ? "a folder" : "no regular file");
  }
  size_t len = (size_t)sb.st_size;
  char *data = malloc(len ? len : 1);
  if (!data) {
    fclose(f);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory for %zu bytes", len);
  }
  size_t got = len ? fread(data, 1, len, f) : 0;
  int e = ferror(f) ? errno : 0;
  fclose(f);
  if (got != len) {
    free(data);
    return sk_error_set(err, SK_ERR_IO, "cannot read %s: %s", path,
                        e ? strerror(e) : "file changed size");
  }
  int rc = sk_client_import(client, data, len, ret, err);
  free(data);
  return rc;
}
