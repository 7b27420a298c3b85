/* sinkd wire protocol: error codes, framing constants and the frame codec.
 *
 * Framing (see sinkd-protocol(7)): every message is a 4-byte big-endian
 * length N followed by N bytes holding exactly one msgpack map.
 *
 * Errors: one X-macro list generates the enum, the stable wire names
 * (sk_error_name) and the human strings (sk_strerror). Functions in sinkd
 * return 0 on success or a negative code (-SK_ERR_...) on failure.
 */
#ifndef SINKD_PROTOCOL_H
#define SINKD_PROTOCOL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Protocol version reported by `hello`. Bumped on incompatible changes. */
#define SK_PROTOCOL_VERSION 1

/* Bytes of the big-endian length prefix. */
#define SK_FRAME_HEADER_SIZE 4u
/* Default and hard ceiling for one frame body: a prompt of a few hundred
 * KiB of text fits; anything larger is refused before its body is read. */
#define SK_FRAME_MAX_DEFAULT (1u << 20)
#define SK_FRAME_MAX_CEILING (16u << 20)
/* Session ids are 1, 2, ... up to this, never reused in a state
 * directory and never wrapping: past it, open, fork and import answer
 * busy. 2^53 - 1, so that every id is exact in a JSON number read as a
 * double (JavaScript clients of the HTTP endpoint). */
#define SK_SESSION_ID_MAX ((UINT64_C(1) << 53) - 1)
/* Deepest msgpack nesting a request may use; requests are shallow (map of
 * scalars, arrays of ints or strings), so 16 is generous. */
#define SK_MSG_MAX_DEPTH 16u

/* Largest sampling temperature `generate` takes, and largest rope_scale
 * (position interpolation) `open` takes. */
#define SK_MAX_TEMPERATURE 100.0
#define SK_MAX_ROPE_SCALE 64.0

/* The parts of a session's cache each policy of `open` has, and so the
 * request fields it takes (sinkd-protocol(7), "open"): a field of a part
 * the policy has not is refused (bad_request). rope_scale goes with every
 * policy. */
#define SK_PART_SINKS 0x01u    /* n_sink: attention sinks */
#define SK_PART_WINDOW 0x02u   /* window: the newest tokens */
#define SK_PART_HEAVY 0x04u    /* heavy and recent: H2O's heavy hitters */
#define SK_PART_CAPACITY 0x08u /* capacity: a dense cache's limit */
#define SK_PART_PIN 0x10u      /* pin / pin_tokens: the sink region, or a
                                  dense cache's start */

/* The eviction policies `open` takes. X(NAME, value, "wire_name", parts):
 * value is the number a session's shared-memory header stores (so it never
 * changes), parts the SK_PART_* bits the policy's cache has. */
#define SK_POLICY_LIST(X)                                                     \
  X(DENSE, 0, "dense", SK_PART_CAPACITY | SK_PART_PIN)                        \
  X(STREAMING, 1, "streaming", SK_PART_SINKS | SK_PART_WINDOW | SK_PART_PIN)  \
  X(WINDOW, 2, "window", SK_PART_WINDOW)                                      \
  X(H2O, 3, "h2o", SK_PART_HEAVY)                                             \
  X(SINK_H2O, 4, "sink_h2o", SK_PART_SINKS | SK_PART_HEAVY | SK_PART_PIN)

/* The parts (SK_PART_* bits) of the policy named by the len bytes at name
 * (streaming, window, h2o, sink_h2o or dense; no NUL needed), or 0 for any
 * other name and for NULL. */
unsigned sk_policy_parts(const char *name, size_t len);

/* What a session speculates with (sinkd-protocol(7), "open" and
 * "generate": the "speculation" field). X(NAME, value, "wire_name"):
 * value is what a session's object keeps (0 there: the daemon's
 * default, draft when it has a draft model, else off). */
#define SK_SPEC_LIST(X)                                                       \
  X(DEFAULT, 0, "default")                                                    \
  X(OFF, 1, "off")                                                            \
  X(DRAFT, 2, "draft")                                                        \
  X(LOOKUP, 3, "lookup")
/* Most tokens one step may propose (`draft_tokens`). */
#define SK_SPEC_TOKENS_MAX 15u

/* `generate` (and `chat`): the values of the sampling fields a request
 * leaves out (sinkd-protocol(7), "generate"). */
#define SK_GENERATE_DEFAULT_MAX_TOKENS 128u
#define SK_GENERATE_DEFAULT_TEMPERATURE 0.8
#define SK_GENERATE_DEFAULT_TOP_K 40u
#define SK_GENERATE_DEFAULT_TOP_P 0.95

/* Caps on what one request asks for and one reply carries, shared by the
 * daemon (which enforces them) and clients (which size their buffers).
 * Most tokens one generate may ask for: far past any cache, so a request
 * is never cut short by it, yet a typo cannot start an endless job. */
#define SK_WIRE_MAX_TOKENS (1u << 20)
/* Most [token, logit] pairs a token event carries (n_top 0..20): enough to
 * show the alternatives, small enough that an event stays tiny. */
#define SK_WIRE_MAX_TOP 20u
/* Most evicted ranges an append or generate reply lists (the daemon keeps
 * the first 64 of a request's; "evicted" still counts every token). */
#define SK_WIRE_MAX_RANGES 64u

/* The operations of the protocol, in the order sinkd-protocol(7) lists
 * them. X(NAME, "wire_name") generates enum sk_op and sk_op_name. */
#define SK_OP_LIST(X)                                                         \
  X(PING, "ping")                                                             \
  X(HELLO, "hello")                                                           \
  X(OPEN, "open")                                                             \
  X(CLOSE, "close")                                                           \
  X(LIST, "list")                                                             \
  X(STATS, "stats")                                                           \
  X(APPEND, "append")                                                         \
  X(GENERATE, "generate")                                                     \
  X(CHAT, "chat")                                                             \
  X(CANCEL, "cancel")                                                         \
  X(RESUME, "resume")                                                         \
  X(FORK, "fork")                                                             \
  X(EXPORT, "export")                                                         \
  X(IMPORT, "import")                                                         \
  X(TOKENIZE, "tokenize")                                                     \
  X(DETOKENIZE, "detokenize")

enum sk_op {
#define SK__OP_ENUM(name, wire) SK_OP_##name,
  SK_OP_LIST(SK__OP_ENUM)
#undef SK__OP_ENUM
  SK_OP__COUNT
};

/* Wire name of an op ("generate"); NULL for values out of range. Static
 * storage. */
const char *sk_op_name(int op);
/* The op named by the len bytes at name (no NUL needed), or -1 for any
 * other name. */
int sk_op_from_name(const char *name, size_t len);

/* X(NAME, "wire_code", "description") */
#define SK_ERROR_LIST(X)                                                      \
  X(BAD_REQUEST, "bad_request", "malformed or invalid request")               \
  X(UNKNOWN_OP, "unknown_op", "unknown operation")                            \
  X(NO_SUCH_SESSION, "no_such_session", "no such session")                    \
  X(FORBIDDEN, "forbidden", "operation not permitted")                        \
  X(CONTEXT_FULL, "context_full", "KV cache is full")                         \
  X(BUSY, "busy", "resource limit reached")                                   \
  X(TOO_LARGE, "too_large", "frame too large")                                \
  X(CANCELLED, "cancelled", "operation cancelled")                            \
  X(BAD_MODEL, "bad_model", "invalid model file")                             \
  X(IO, "io", "input/output error")                                           \
  X(NO_MEMORY, "no_memory", "out of memory")                                  \
  X(PROTOCOL, "protocol", "protocol violation")                               \
  X(DISCONNECTED, "disconnected", "connection closed")                        \
  X(INTERNAL, "internal", "internal error")

enum sk_errcode {
  SK_OK = 0,
#define SK__ERR_ENUM(name, code, desc) SK_ERR_##name,
  SK_ERROR_LIST(SK__ERR_ENUM)
#undef SK__ERR_ENUM
  SK_ERR__COUNT
};

/* Longest error message kept, including the NUL. */
#define SK_ERROR_MESSAGE_MAX 256

/* An error: a code from enum sk_errcode and a message naming the problem
 * (field, value, limit). Plain value type; no ownership. */
struct sk_error {
  int code;
  char message[SK_ERROR_MESSAGE_MAX];
};

/* Stable wire name of an error code ("bad_request"); "internal" for codes
 * out of range. Accepts the code with either sign. Static storage. */
const char *sk_error_name(int code);
/* Human description of an error code. Static storage. */
const char *sk_strerror(int code);
/* Code for a wire name of `len` bytes; SK_ERR_INTERNAL if unknown. */
int sk_error_from_name(const char *name, size_t len);
/* Fills *err (if not NULL) with code (either sign) and a printf-style
 * message (cut to SK_ERROR_MESSAGE_MAX - 1 bytes, between two UTF-8
 * characters; a byte that is not valid UTF-8 and a control character
 * other than tab and newline become '?'); returns -|code| so callers can
 * `return sk_error_set(...)`. */
int sk_error_set(struct sk_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int sk_error_setv(struct sk_error *err, int code, const char *fmt, va_list ap);

/* Incremental frame reader: feed it bytes as they arrive, take whole frame
 * bodies out. Memory is bounded by max_frame plus the bytes of one read:
 * a declared length above max_frame is reported and its body discarded as
 * it arrives (never buffered), so the stream stays in sync. */
struct sk_frame_reader {
  uint8_t *buf;       /* (cap) buffered bytes, owned */
  size_t len;         /* bytes buffered */
  size_t pos;         /* start of the first unconsumed byte */
  size_t cap;
  uint32_t max_frame; /* largest body accepted */
  uint64_t skip;      /* body bytes of an oversized frame still to discard */
};

/* Initialises *r for bodies of at most max_frame bytes (clamped to
 * SK_FRAME_MAX_CEILING). No allocation until data arrives. */
void sk_frame_reader_init(struct sk_frame_reader *r, uint32_t max_frame);
/* Frees the buffer; r may be reused after sk_frame_reader_init. */
void sk_frame_reader_free(struct sk_frame_reader *r);
/* Appends n bytes. Returns 0, or -SK_ERR_NO_MEMORY. */
int sk_frame_reader_feed(struct sk_frame_reader *r, const void *data, size_t n);
/* Takes the next frame.
 *   1: *ret_body and *ret_len hold a complete body, valid until the next call
 *      to feed/next/trim/free;
 *   0: more bytes are needed;
 *   -SK_ERR_TOO_LARGE: a frame declared *ret_len bytes (> max_frame); its
 *      body will be discarded; call again to continue with the next frame.
 * A zero-length frame is returned as a body of length 0 (the caller
 * rejects it: it holds no map). */
int sk_frame_reader_next(struct sk_frame_reader *r, const uint8_t **ret_body,
                         size_t *ret_len);
/* Gives back memory of a large buffer once its frames are taken: frees
 * it when it holds no unconsumed byte, or moves the few unconsumed bytes
 * (the start of the next frame) into a small one. A reader that once
 * took a max_frame-sized frame would otherwise hold that much for as long
 * as its connection stays idle, outside any count of partial input.
 * Bodies returned by next are invalid afterwards. Returns 0, or
 * -SK_ERR_NO_MEMORY (the buffer is then kept as it was). */
int sk_frame_reader_trim(struct sk_frame_reader *r);

/* Writes the 4-byte big-endian header for a body of len bytes. */
void sk_frame_header_put(uint8_t out[SK_FRAME_HEADER_SIZE], uint32_t len);
/* Reads a 4-byte big-endian length. */
uint32_t sk_frame_header_get(const uint8_t in[SK_FRAME_HEADER_SIZE]);

#ifdef __cplusplus
}
#endif
#endif
