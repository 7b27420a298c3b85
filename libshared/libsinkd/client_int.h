/* What client.c, client_requests.c and client_streams.c share (internal
 * to libsinkd; libsinkd.map keeps these symbols out of its exports). */
#ifndef SK_CLIENT_INT_H
#define SK_CLIENT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"
#include "proto/wire.h"
#include "sinkd/client.h"

/* Bytes read from the socket per recv(). */
#define SK__CLIENT_READ_CHUNK 65536u

struct sk_client {
  int fd;                        /* -1 once a transport error closed it */
  uint64_t next_id;              /* id of the next request, from 1 */
  unsigned int timeout_ms;       /* 0 = none */
  struct sk_frame_reader reader; /* reply frames, up to the ceiling */
  uint8_t rbuf[SK__CLIENT_READ_CHUNK];
};

/* A transport failure: the stream can no longer be trusted to be in step,
 * so the connection is closed. Returns -code. */
int sk__client_fail(struct sk_client *client, struct sk_error *err, int code,
                    const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* 0 if client is connected; -SK_ERR_DISCONNECTED if not (or NULL). */
int sk__client_check(struct sk_client *client, struct sk_error *err);

/* The id of the next request: every request packs one (wire.h's
 * sk_wire_pack_*_req) into a frame that sk__client_send sends. */
uint64_t sk__client_id(struct sk_client *client);

/* The result rc of a request packer (b freed on failure). */
int sk__client_packed(int rc, struct sk_error *err);

/* Finishes and sends a request frame; frees b either way. */
int sk__client_send(struct sk_client *client, struct sk_msgbuf *b,
                    struct sk_error *err);

/* Reads the next frame from the daemon into *msg (which the caller frees
 * with sk_msg_free) and its id into *ret_id. Everything that goes wrong
 * here is a transport failure. */
int sk__client_recv(struct sk_client *client, struct sk_msg *msg,
                    uint64_t *ret_id, struct sk_error *err);

/* A reply that breaks the protocol (wrong type of a field, ...). */
int sk__client_bad_reply(struct sk_client *client, struct sk_error *err,
                         const char *what);

/* The result of a wire decoder: a malformed reply closes the connection
 * like any protocol error; other errors (no memory) are passed on. */
int sk__client_wire(struct sk_client *client, int rc, const struct sk_error *perr,
                    struct sk_error *err);

/* Looks at "ok" of a final reply: 0 if true; the daemon's error (code
 * mapped, message kept) if false. The connection stays usable after an
 * error reply. */
int sk__client_status(struct sk_client *client, const struct sk_msg *msg,
                      struct sk_error *err);

/* Sends the request in b (freed) and reads its final reply into *reply,
 * which the caller frees with sk_msg_free on success. An error reply is
 * returned as its code (reply already freed). A reply with id 0 and ok
 * false is the daemon refusing a frame it could not read (for example one
 * above its frame limit): it answers this request. */
int sk__client_call(struct sk_client *client, struct sk_msgbuf *b,
                    uint64_t id, struct sk_msg *reply,
                    struct sk_error *err);

/* A request with only id and op, reply into *reply. */
int sk__client_simple(struct sk_client *client, enum sk_op op,
                      struct sk_msg *reply, struct sk_error *err);

/* A request with id, op and session. */
int sk__client_on_session(struct sk_client *client, enum sk_op op,
                          uint64_t session, struct sk_msg *reply,
                          struct sk_error *err);

#endif
