/* A session's conversation: what the `chat` op needs to format the next
 * messages with the session's chat template (chat.h) and append only
 * them.
 *
 * llama.cpp's templates render a whole conversation; the cache already
 * holds the earlier turns, so each chat appends the delta:
 *
 *   H    = [system] + the previous chat's messages + its reply
 *   C    = the text the cache holds for H: render([system] + previous
 *          messages, with the generation prompt) + the reply as generated
 *   full = render(H + new messages, with the generation prompt)
 *   delta = full minus its prefix C
 *
 * Every built-in format renders a message from the message alone (plus
 * the system prompt, which stays first in H), so full starts with C
 * whenever the template keeps the reply as it was generated. Formats that
 * trim the reply (llama3, gemma, command-r, mistral-v3) or open an
 * assistant turn differently from their generation prompt (openchat,
 * deepseek2) do not; then the delta is the end of the reply's turn (what
 * follows the reply in render(H)) and the new messages as render(H + new)
 * puts them after render(H). Only the system prompt, the previous chat's
 * messages and its reply are kept, so the state stays bounded however
 * long the conversation runs.
 *
 * Tokens appended between chats by other ops (append, generate), or a
 * reply cut by a daemon crash, are taken as part of the reply: the next
 * chat detokenizes the session's tokens past the state's n_seen.
 *
 * The state is kept beside the session's object in the state directory,
 * as "session-<id>.chat" (format below), written whole to a temporary
 * file and renamed, so a restart's adoption finds it.
 *
 * ---- File format, version 1 (SK_CONV_FILE_VERSION) ----------------------
 * All integers little-endian.
 *   char magic[8]          "SINKCHAT"
 *   u32 version            1
 *   u32 template           enum sk_chat_template
 *   u64 n_seen             the session's n_seen when C ended
 *   u32 flags              1: a system message; 2: the system prompt is
 *                          in the cache
 *   u32 n_msgs             messages that follow the system one
 *   str system, str C, then n_msgs x (str role, str content)
 *                          (str: u32 length, then the bytes)
 *   u64 checksum           XXH3-64 of every byte before it
 */
#ifndef SK_CONV_H
#define SK_CONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/chat.h"
#include "sk_limits.h"
#include "sinkd/protocol.h"

#define SK_CONV_FILE_VERSION 1u

/* One owned message. */
struct sk_conv_msg {
  char *role;
  size_t role_len;
  char *content;
  size_t content_len;
};

struct sk_conv {
  int tmpl;                  /* enum sk_chat_template; SK_CHAT_NONE: no chat */
  bool has_system;
  bool system_sent;          /* the system prompt is in the cache */
  struct sk_conv_msg system; /* role "system" */
  struct sk_conv_msg *msgs;  /* (n_msgs) previous chat's messages + reply */
  size_t n_msgs;
  char *text;                /* (text_len) C: the cache's text for H */
  size_t text_len;
  uint64_t n_seen;           /* the session's n_seen when text ended */
};

void sk_conv_init(struct sk_conv *conv, int tmpl);
void sk_conv_free(struct sk_conv *conv);

/* Sets the system message (copied). Errors: -SK_ERR_NO_MEMORY. */
int sk_conv_set_system(struct sk_conv *conv, const char *text, size_t len, struct sk_error *err);
/* The system message went into the cache as the session's pinned
 * prefix, n_seen tokens: its rendering t (sk_conv_system_text; taken,
 * t->text is NULL after) is the conversation's text so far. */
void sk_conv_system_pinned(struct sk_conv *conv, struct sk_chat_text *t, uint64_t n_seen);

/* The text of the pinned prefix for a system message (conv->system): the
 * part of render([system, user]) before the user's text, or
 * render([system]) when that is its prefix. Appended to out.
 * Errors: those of sk_chat_render. */
int sk_conv_system_text(const struct sk_conv *conv, struct sk_chat_text *out, struct sk_error *err);

/* Checks roles (1..SK_LIMIT_CONV_ROLE bytes of [a-z_]) and count.
 * Errors: -SK_ERR_BAD_REQUEST naming the message. */
int sk_conv_check(const struct sk_chat_msg *msgs, size_t n, struct sk_error *err);

/* Renders the delta for new messages msgs[0..n) (a leading system message
 * is the conversation's system prompt when none is set yet) into out,
 * template text and content in segments. extra: text the cache holds
 * after C that the state does not know (see above), extra_len bytes.
 * Errors: those of sk_chat_render. */
int sk_conv_delta(struct sk_conv *conv, const struct sk_chat_msg *msgs, size_t n,
                  const char *extra, size_t extra_len, struct sk_chat_text *out,
                  struct sk_error *err);
/* After the delta went into the cache: H becomes [system] + msgs, C the
 * rendering with the generation prompt; n_seen the session's. Errors:
 * -SK_ERR_NO_MEMORY (conv unchanged). */
int sk_conv_commit_prompt(struct sk_conv *conv, const struct sk_chat_msg *msgs, size_t n,
                          uint64_t n_seen, struct sk_error *err);
/* After the reply: it becomes the last message of H and the end of C.
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_conv_commit_reply(struct sk_conv *conv, const char *reply, size_t len, uint64_t n_seen,
                         struct sk_error *err);

/* The name of session id's conversation file in the state directory,
 * "session-<id>.chat", into buf (at least SK_CONV_NAME_MAX bytes). */
#define SK_CONV_NAME_MAX 40
void sk_conv_file_name(char *buf, size_t size, uint64_t id);
/* Writes the state to session-<id>.chat in the directory dirfd (the state
 * directory), atomically and without following links: through a
 * temporary of a random name created exclusively, renamed into place
 * (base/safefile.h). Errors: -SK_ERR_IO (message: file and reason),
 * -SK_ERR_NO_MEMORY. */
int sk_conv_save(const struct sk_conv *conv, int dirfd, uint64_t id, struct sk_error *err);
/* Reads session-<id>.chat of the directory dirfd into *conv (initialised,
 * replaced): a regular file of the daemon's uid, not a link, of at most
 * SK_LIMIT_CONV_FILE_BYTES, checked before it is read (a FIFO planted
 * there does not hang the start). Returns 1, 0 if there is no such file,
 * or -SK_ERR_BAD_REQUEST (corrupt: magic, version, lengths, checksum) /
 * -SK_ERR_IO (not a regular file of the daemon's, unreadable) /
 * -SK_ERR_TOO_LARGE / -SK_ERR_NO_MEMORY; the message names the file. */
int sk_conv_load(struct sk_conv *conv, int dirfd, uint64_t id, struct sk_error *err);
/* Deletes session-<id>.chat of the directory dirfd if present. */
void sk_conv_remove(int dirfd, uint64_t id);

#endif
