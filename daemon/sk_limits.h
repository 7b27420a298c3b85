/* The daemon's limits: every bound the daemon puts on a client, a
 * session or itself, each with the reason for its value. Ceilings of
 * the configuration come first (config.c refuses values past them),
 * then the fixed limits of the modules that use them. Caps of the wire
 * format itself (frame ceiling, ranges, top logits, tokens of a
 * generate) live in sinkd/protocol.h; the cache's and the store's
 * layout constants in kvcache.h and store.h.
 */
#ifndef SK_SK_LIMITS_H
#define SK_SK_LIMITS_H

#include "sinkd/protocol.h"

/* ---- ceilings of the configuration (config.c) ---- */

/* Connections at once: each holds a descriptor and up to 1 MiB of queued
 * output; past 65536 any usual RLIMIT_NOFILE runs out first anyway. */
#define SK_LIMIT_MAX_CLIENTS 65536u
/* Sessions at once: the session table is allocated up front and each
 * session holds a whole KV cache. */
#define SK_LIMIT_MAX_SESSIONS 65536u
/* One session's cache: positions and slots are 32-bit and one cache must
 * stay far below the machine's memory: the cache's own bound,
 * SK_KV_MAX_CAPACITY (model/kvstep.h; kvcache.c asserts they agree). */
#define SK_LIMIT_MAX_CAPACITY (1u << 20)
/* One request frame is buffered whole before it is parsed. */
#define SK_LIMIT_MAX_FRAME SK_FRAME_MAX_CEILING
/* Smallest frame limit: a request with a short prompt must still fit. */
#define SK_LIMIT_MIN_FRAME 64u
/* Compute threads: no machine sinkd targets has more cores (pool.h). */
#define SK_LIMIT_MAX_THREADS 256u
/* Prefill chunk: scratch buffers grow with chunk x model width; past 4096
 * tokens bigger chunks stop paying and only delay other sessions. */
#define SK_LIMIT_MAX_BATCH 4096u
/* History a session keeps for speculation by look-up (spec.h): 4 bytes a
 * token and as much again in look-up tables; 16M tokens (128 MiB a
 * session) is far more than any conversation. */
#define SK_LIMIT_MAX_LOOKUP_HISTORY (1u << 24)
/* Total KV memory is capped by the machine's physical memory (computed at
 * run time): more would only end with the OOM killer. Below 1 MiB not
 * even the smallest model's session fits. */
#define SK_LIMIT_MIN_MEMORY (1ull << 20)
/* Idle TTL: a year; longer is "never", which is 0. */
#define SK_LIMIT_MAX_IDLE_TTL (366u * 24u * 3600u)
/* Deadline for a request frame: an hour; a client slower than that is
 * gone (0 = no deadline). */
#define SK_LIMIT_MAX_FRAME_TIMEOUT 3600u

/* Bytes of the configuration file: a commented sinkd.conf is a few KiB;
 * it is read whole, so its size is bounded before it is. */
#define SK_LIMIT_CONFIG_BYTES (1u << 20)

/* ---- connections (listen.c, conn.c, admit.c) ---- */

/* Pending connections the kernel queues for accept: the usual SOMAXCONN
 * of Linux before 5.4, plenty for a burst of local clients. */
#define SK_LIMIT_LISTEN_BACKLOG 128
/* Bytes read per read callback: one buffer shared by all connections
 * (the loop is single-threaded and feeds it to the frame reader at once). */
#define SK_LIMIT_READ_BUF (64u * 1024u)
/* Bytes waiting to be written to one client above which its reading and
 * its generation pause (a client that never reads costs at most this). */
#define SK_LIMIT_CONN_OUT (1u << 20)
/* Connections kept for root out of max_clients (at most half of it, so
 * that a small max_clients still admits others): enough for an
 * administrator's sinkctl, a monitoring probe and a chat. */
#define SK_LIMIT_ROOT_CLIENTS 8u
/* Bounds of the frame-deadline check period (ms): a connection past
 * frame_timeout_s is closed at most this late, and checking costs nothing. */
#define SK_LIMIT_FRAME_TICK_MIN_MS 100u
#define SK_LIMIT_FRAME_TICK_MAX_MS 1000u
/* A refused connection is reported to the log once per uid in this time
 * (the others are counted into the next report): a client that retries
 * in a loop must not flood the journal. A minute keeps a persistent
 * offender visible. */
#define SK_LIMIT_REFUSAL_LOG_MS 60000u
/* uids whose last refusal time is remembered: more than the users who
 * hit a limit at once on any machine sinkd serves; past it the uid
 * reported longest ago is forgotten (and may be reported early). */
#define SK_LIMIT_REFUSAL_LOG_UIDS 64u
/* Quiet time after the last disconnect before freed memory is given back
 * to the system (malloc_trim): a burst of clients pays it once. */
#define SK_LIMIT_TRIM_DELAY_MS 1000u

/* ---- sessions and requests (session.c, server.c, ops.c, copy.c) ---- */

/* Requests queued behind a running one on a session: a client cannot
 * make the loop hold an unbounded list of jobs. */
#define SK_LIMIT_SESSION_QUEUE 64u
/* Token events of one job the compute thread may have posted before the
 * loop thread takes them: a loop thread kept off the CPU pauses the
 * generation instead of queueing its whole output in memory (an event
 * is about 300 bytes). */
#define SK_LIMIT_JOB_EVENTS 256u
/* Sessions a uid's temporary opens may take past max_user_sessions, so
 * that persistent sessions left behind do not stop one-off requests. */
#define SK_LIMIT_TEMP_SESSIONS 4u
/* Idle-TTL check period bounds (ms): often enough for short TTLs, rare
 * enough to cost nothing. */
#define SK_LIMIT_TTL_TICK_MIN_MS 100u
#define SK_LIMIT_TTL_TICK_MAX_MS 60000u
/* open: the longest pin text, tokenized on the loop thread (a system
 * prompt; ~16K tokens at most, well under a millisecond to tokenize). */
#define SK_LIMIT_PIN_TEXT (64u * 1024u)
/* stats: most resident ranges one reply lists (a session's resident set
 * is a few ranges; an h2o cache's can be one per token). */
#define SK_LIMIT_STATS_RANGES 256u
/* export: bytes of image per data event; far below any frame limit a
 * client accepts (libsinkd takes up to 16 MiB). */
#define SK_LIMIT_EXPORT_CHUNK (256u * 1024u)
/* Longest stop string accepted, and how many: bounded so the tail kept
 * for matching stays small. */
#define SK_LIMIT_STOP_LEN 256u
#define SK_LIMIT_STOP_COUNT 16u
/* Steps (forward calls) over which `stats` averages the attention
 * diagnostics: recent enough to follow a stream, long enough to smooth a
 * single token. */
#define SK_LIMIT_ATTN_STEPS 64u
/* Messages of one chat request, and bytes of a role name: a conversation
 * is rendered on every chat, and roles are short words. */
#define SK_LIMIT_CONV_MSGS 64u
#define SK_LIMIT_CONV_ROLE 32u
/* Bytes of a session's conversation file (conv.c): its text and 64
 * messages are far below this; past it the file is not one sinkd wrote. */
#define SK_LIMIT_CONV_FILE_BYTES (64u << 20)

/* ---- the HTTP front end (daemon/http/) ---- */

/* Bytes read per wakeup of a connection. */
#define SK_LIMIT_HTTP_READ_BUF (64u * 1024u)
/* A whole request must arrive within this time of its first byte: a
 * client that trickles its request does not hold a connection. */
#define SK_LIMIT_HTTP_REQUEST_MS 10000u
/* A keep-alive connection with no request for this long is closed. */
#define SK_LIMIT_HTTP_IDLE_MS 60000u
/* After a client left, the time its request may take to close what it
 * opened for it on its daemon connection (a session whose id the client
 * never got): one round trip to the server, far less than this. */
#define SK_LIMIT_HTTP_LINGER_MS 10000u
/* Bytes of responses waiting for a slow reader before its generation
 * pauses and its requests stop being read (as SK_LIMIT_CONN_OUT for
 * msgpack clients). */
#define SK_LIMIT_HTTP_OUT (1u << 20)
/* Request line plus headers, in bytes: no OpenAI client sends more than
 * a few hundred; 16 KiB leaves room for long bearer tokens and cookies
 * while keeping a header flood cheap to refuse. */
#define SK_LIMIT_HTTP_HEADER_BYTES (16u * 1024u)
/* Headers per request, for the same reason. */
#define SK_LIMIT_HTTP_HEADERS 64u
/* Request target (path and query): OpenAI's routes are short. */
#define SK_LIMIT_HTTP_URL 2048u
/* Bytes kept of an Authorization value ("Bearer " and the key). */
#define SK_LIMIT_HTTP_AUTH 512u
/* Most stop strings and their longest length: the generate op's. */
#define SK_LIMIT_OPENAI_STOPS 16u
#define SK_LIMIT_OPENAI_STOP_BYTES 256u
/* Largest max_tokens: the generate op's ceiling. */
#define SK_LIMIT_OPENAI_MAX_TOKENS (1u << 20)
/* Likely tokens a response gives per token with logprobs: OpenAI's bound
 * for chat (20), which the protocol's top_logprobs matches. */
#define SK_LIMIT_OPENAI_TOP_LOGPROBS 20u
/* Conversations of persistent sessions remembered per uid (oaiconv.h):
 * many times the sessions a uid may hold (max_user_sessions, 16 by
 * default); the uid's least recently used one is dropped, so its memory
 * stays bounded however many sessions it goes through, and no uid's use
 * drops another's. */
#define SK_LIMIT_OPENAI_USER_CONVS 256u


/* ---- the state directory (store.c) ---- */

/* Names tried when setting an object aside ("name", "name.1", ...)
 * before it is left in place: more means a directory nobody cleans. */
#define SK_LIMIT_SET_ASIDE_TRIES 100

/* ---- sparsity calibration (main.c --calibrate, sparse.h, CATS sec. 3.2) ---- */

/* Bytes of a sparsity file: a few lines of 1024 numbers at most. */
#define SK_LIMIT_SPARSITY_FILE_BYTES (16u << 20)
/* Bytes of the text --calibrate reads (it uses its first tokens only). */
#define SK_LIMIT_CALIB_TEXT_BYTES (64u << 20)

/* Tokens of the text used, at most: bounds the run's time. */
#define SK_LIMIT_CALIB_TOKENS 8192u
/* Tokens per window, each on a fresh dense cache (or the model's
 * context if shorter): a calibration run stays small in memory. */
#define SK_LIMIT_CALIB_WINDOW 512u
/* Gate values kept per layer: bounds the run's memory whatever the text. */
#define SK_LIMIT_CALIB_SAMPLES (1u << 21)

/* A model file this large logs its load's progress (and says it in the
 * service's status) whatever the load takes: loads of such files take
 * seconds to minutes on a cold page cache. */
#define SK_LIMIT_LOAD_PROGRESS_BYTES (256ull << 20)

#endif
