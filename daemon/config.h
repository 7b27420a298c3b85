/* sinkd's configuration: built-in defaults, then the INI file
 * (/etc/sinkd/sinkd.conf, see sinkd.conf(5)), then the command line.
 *
 * Every setting is one key of a table in config.c that gives its section,
 * its command-line option, its type, its range (the upper end is a hard
 * ceiling no file or option can exceed, each with its reason) and whether
 * SIGHUP may change it on a running daemon. The file and the command line
 * go through the same parser, so both accept the same values.
 *
 * This module never logs: problems come back as struct sk_error messages
 * that name the file, line and key, and the caller prints them.
 */
#ifndef SK_CONFIG_H
#define SK_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "sk_limits.h"
#include "model/model.h"
#include "sinkd/protocol.h"

/* Ceilings of every setting: limits.h. */

/* ---- defaults ------------------------------------------------------------ */

#define SK_CONFIG_DEFAULT_MAX_SESSIONS 64u  /* each holds a full KV cache */
#define SK_CONFIG_DEFAULT_MAX_CLIENTS 1024u /* well under a default fd limit */
#define SK_CONFIG_DEFAULT_BATCH 64u         /* keeps other sessions' tokens flowing */
/* a pass of 16 tokens takes about 3 times a lone token's (doc/performance.md) */
#define SK_CONFIG_DEFAULT_STEP_TOKENS 16u
#define SK_CONFIG_DEFAULT_N_SINK 4u         /* StreamingLLM: 4 sinks suffice */
#define SK_CONFIG_DEFAULT_WINDOW_SPAN 1024u /* sinks + window, unless the model is shorter */
#define SK_CONFIG_DEFAULT_MAX_CAPACITY 8192u /* or the model's context if larger */
#define SK_CONFIG_DEFAULT_MAX_USER_SESSIONS 16u /* a quarter: one user cannot take all */
#define SK_CONFIG_DEFAULT_MAX_USER_CLIENTS 128u /* an eighth of max_clients */
/* History kept for speculation by look-up: 64 KiB of token ids, and its
 * look-up tables, 256 KiB a session in all; enough for a long
 * conversation or a source file and what the model wrote about it. */
#define SK_CONFIG_DEFAULT_LOOKUP_HISTORY 16384u
/* Tokens proposed per speculating step (spec.h's default). */
#define SK_CONFIG_DEFAULT_DRAFT_TOKENS 8u
/* Persistent sessions unused for a week are closed: long enough for any
 * conversation someone comes back to, short enough that forgotten ones
 * do not fill max_user_sessions for good. */
#define SK_CONFIG_DEFAULT_IDLE_TTL (7u * 24u * 3600u)
#define SK_CONFIG_DEFAULT_FRAME_TIMEOUT 30u     /* seconds: a slow 1 MiB frame still fits */
/* http_uid when sinkd runs as root and the system has no "nobody": the
 * uid Debian and most distributions give it (65534, the overflow uid). */
#define SK_CONFIG_NOBODY_UID 65534u
/* auto input memory, in frames of max_frame: 64 in all (64 MiB by
 * default, against 1 GiB for max_clients whole frames), 16 per uid. */
#define SK_CONFIG_INPUT_FRAMES 64u
#define SK_CONFIG_USER_INPUT_FRAMES 16u

/* The keys, in the order --check-config prints them. */
enum sk_config_key {
  SK_CFG_MODEL,
  SK_CFG_SOCKET,
  SK_CFG_STATE_DIR,
  SK_CFG_THREADS,
  SK_CFG_BATCH,
  SK_CFG_STEP_TOKENS,
  SK_CFG_LOG_LEVEL,
  SK_CFG_KV_TYPE,
  SK_CFG_CHAT_TEMPLATE,
  SK_CFG_HTTP_SOCKET,
  SK_CFG_HTTP_LISTEN,
  SK_CFG_HTTP_KEY_FILE,
  SK_CFG_HTTP_UID,
  SK_CFG_HTTP_LISTEN_PUBLIC,
  SK_CFG_SPARSITY_FILE,
  SK_CFG_DRAFT_MODEL,
  SK_CFG_LOOKUP_HISTORY,
  SK_CFG_POLICY,
  SK_CFG_SINKS,
  SK_CFG_WINDOW,
  SK_CFG_CAPACITY,
  SK_CFG_SPECULATION,
  SK_CFG_DRAFT_TOKENS,
  SK_CFG_MAX_CLIENTS,
  SK_CFG_MAX_SESSIONS,
  SK_CFG_MAX_CAPACITY,
  SK_CFG_MAX_MEMORY,
  SK_CFG_MAX_USER_SESSIONS,
  SK_CFG_MAX_USER_MEMORY,
  SK_CFG_MAX_FRAME,
  SK_CFG_IDLE_TTL,
  SK_CFG_MAX_USER_CLIENTS,
  SK_CFG_FRAME_TIMEOUT,
  SK_CFG_MAX_INPUT_MEMORY,
  SK_CFG_MAX_USER_INPUT_MEMORY,
  SK_CFG__COUNT
};

/* Where a value came from. */
enum sk_config_origin {
  SK_CONFIG_FROM_DEFAULT = 0,
  SK_CONFIG_FROM_FILE,
  SK_CONFIG_FROM_COMMAND_LINE,
};

struct sk_config {
  /* [daemon] */
  char *model;        /* GGUF file; NULL until given */
  char *socket;       /* Unix socket to bind when not socket-activated */
  char *state_dir;    /* folder of the session store */
  uint32_t threads;   /* compute threads; 0 = auto (online CPUs) */
  uint32_t batch;     /* tokens per forward pass, all sessions */
  uint32_t step_tokens; /* token budget of a pass while a session generates */
  uint32_t log_level; /* SK_LOG_ERR .. SK_LOG_DEBUG */
  uint32_t kv_type;   /* enum sk_kv_type of new sessions' caches (default f16) */
  int chat_template;  /* enum sk_chat_template of the `chat` op; -1 = auto: the
                         model's tokenizer.chat_template */
  char *sparsity_file; /* MLP sparsity calibration (sparse.h); NULL = none */
  char *draft_model;  /* GGUF of the draft model of speculation (spec.h);
                         NULL = none */
  uint32_t lookup_history; /* tokens of history each session keeps for
                              speculation by look-up; 0 = none */
  /* [session]: defaults for `open` */
  uint32_t policy;    /* enum sk_policy */
  uint32_t n_sink;    /* attention sinks */
  uint32_t window;    /* 0 = auto: min(context, 1024) - sinks */
  uint32_t capacity;  /* dense; 0 = auto: context, at most max_capacity */
  uint32_t speculation; /* enum sk_spec_mode; 0 = auto: draft with a
                           draft_model, else off */
  uint32_t draft_tokens; /* most tokens a speculating step proposes */
  /* [limits] */
  uint32_t max_clients;
  uint32_t max_sessions;
  uint32_t max_capacity; /* tokens; 0 = auto: max(8192, context) */
  uint64_t max_memory;   /* bytes of all KV caches; 0 = auto: half of RAM */
  uint32_t max_user_sessions; /* sessions one uid may own */
  uint64_t max_user_memory;   /* bytes of one uid's sessions; 0 = auto:
                                 max_memory */
  uint32_t max_frame;    /* bytes of a request body */
  uint32_t idle_ttl;     /* seconds: close sessions idle this long; 0 never */
  uint32_t max_user_clients; /* connections of one uid other than root; 0 = none */
  uint32_t frame_timeout; /* seconds a connection may take to complete a
                             request frame (its first, or one it began);
                             0 = no deadline */
  uint64_t max_input_memory;      /* bytes of unfinished request frames of
                                     all connections; 0 = auto:
                                     64 x max_frame */
  uint64_t max_user_input_memory; /* the same for one uid; 0 = auto:
                                     16 x max_frame */
  /* the OpenAI-compatible HTTP endpoint (sinkd-http(7)) */
  char *http_socket;     /* its Unix socket; NULL until resolved: beside
                            `socket`, named sinkd-http.sock; "none": off */
  char *http_listen;     /* loopback TCP "HOST:PORT"; NULL: none */
  char *http_key_file;   /* API key file (mode 0600), needed by http_listen */
  uint32_t http_uid;     /* uid TCP requests act as; 0 = auto: sinkd's own,
                            or nobody's when sinkd runs as root */
  uint32_t http_listen_public; /* 1: http_listen may be a non-loopback
                                  address (a choice made knowingly) */

  struct {
    enum sk_config_origin from;
    uint32_t line;  /* FROM_FILE: line number */
    bool automatic; /* the value was "auto" and was resolved */
  } origin[SK_CFG__COUNT];
  char *file; /* the file read, or NULL */
};

/* Most errors one load reports; later ones are counted, not kept. */
#define SK_CONFIG_MAX_ERRORS 16u

/* Problems found reading a file, in line order. */
struct sk_config_errors {
  uint32_t n;       /* entries used in e */
  uint32_t dropped; /* further errors not kept */
  struct sk_error e[SK_CONFIG_MAX_ERRORS]; /* "PATH:LINE: ..." */
  uint32_t line[SK_CONFIG_MAX_ERRORS];     /* the LINE of each (0: none) */
};

/* Fills *cfg with the built-in defaults. The socket defaults to
 * /run/sinkd/sinkd.sock and the state folder to /run/sinkd/state (root),
 * or the same under $XDG_RUNTIME_DIR/sinkd (other users, when set).
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_config_init(struct sk_config *cfg);
/* Frees what *cfg owns. Accepts a zeroed or already freed config. */
void sk_config_done(struct sk_config *cfg);
/* Deep copy of src into *dst (dst must not hold a config).
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_config_copy(struct sk_config *dst, const struct sk_config *src);

/* The file read when no --config is given:
 * SK_SYSCONFDIR/sinkd/sinkd.conf. Static storage. */
const char *sk_config_default_path(void);

/* Reads the INI file at path into *cfg, over what *cfg holds. When the file
 * does not exist: if must_exist, an error; else 0 (nothing read) — the
 * built-in default file is optional, a file named by --config is not.
 * Every unknown section or key, bad value, repeated key and syntax error
 * is reported in *errs as "PATH:LINE: [section] key: problem".
 * Returns 0 if the whole file was valid, 1 if it did not exist (and
 * must_exist is false), -SK_ERR_BAD_REQUEST if errs holds problems,
 * -SK_ERR_IO if it cannot be read, -SK_ERR_NO_MEMORY. On failure *cfg may
 * hold some values of the file: callers discard it. */
int sk_config_load(struct sk_config *cfg, const char *path, bool must_exist,
                   struct sk_config_errors *errs);
/* What sk_config_load does with the file's text once read: parses the
 * len bytes of text (any bytes; no NUL needed) as the file `path`
 * (the name errors give and cfg->file keeps). Returns 0,
 * -SK_ERR_BAD_REQUEST (errs holds the problems) or -SK_ERR_NO_MEMORY. */
int sk_config_load_text(struct sk_config *cfg, const char *path, const char *text, size_t len,
                        struct sk_config_errors *errs);

/* Whether an http_listen value ("ADDRESS:PORT") names a loopback
 * address: 127.0.0.0/8, [::1] or localhost. */
bool sk_config_listen_loopback(const char *listen);

/* Sets key from its text form, as the file and command line write it,
 * recording where it came from (line 0 when not from a file). Errors:
 * -SK_ERR_BAD_REQUEST with a message naming the accepted values or range,
 * -SK_ERR_NO_MEMORY. */
int sk_config_set(struct sk_config *cfg, enum sk_config_key key,
                  const char *value, enum sk_config_origin from,
                  uint32_t line, struct sk_error *err);

/* Copies into dst every value of src that did not come from the built-in
 * defaults (used to lay the command line over the file).
 * Errors: -SK_ERR_NO_MEMORY. */
int sk_config_overlay(struct sk_config *dst, const struct sk_config *src);

/* Replaces the "auto" values with what they mean for this model and
 * machine, and checks the whole: a model is named, the default session
 * parameters open under max_capacity, the socket path fits. mc may be NULL
 * (model not loaded): then the model-dependent values stay 0.
 * Errors: -SK_ERR_BAD_REQUEST naming the key (and file line). */
int sk_config_resolve(struct sk_config *cfg, const struct sk_model_config *mc,
                      struct sk_error *err);

/* The default HTTP socket (http_socket unset) beside `socket`, named
 * after it: DIR/NAME.sock gives DIR/NAME-http.sock (sinkd.sock:
 * sinkd-http.sock), a NAME without ".sock" NAME-http.sock; what
 * sk_config_resolve does first, and the start before it loads the model.
 * Errors: -SK_ERR_BAD_REQUEST (the path too long), -SK_ERR_NO_MEMORY. */
int sk_config_resolve_sockets(struct sk_config *cfg, struct sk_error *err);

/* Shortest API key taken from http_key_file: a key anyone can guess is
 * no key. */
#define SK_CONFIG_MIN_KEY 16u
/* Reads the HTTP API key from path into ret (size bytes): a regular file
 * (not a symbolic link, a FIFO or a device: never read then, and never
 * waited on) that only its owner may read (no group or other bits),
 * holding the key on one line of SK_CONFIG_MIN_KEY to size - 2 printable
 * characters without spaces. Errors: -SK_ERR_BAD_REQUEST, the message
 * naming the file and what is wrong (ret zeroed). */
int sk_config_read_key(const char *path, char *ret, size_t size, struct sk_error *err);

/* Writes the configuration as INI text that sk_config_load reads back,
 * each value followed by where it came from (" ; default", " ; auto",
 * " ; command line", " ; FILE:LINE"). */
void sk_config_print(FILE *f, const struct sk_config *cfg);

/* Name of a key as written in the file ("max_sessions"), its section
 * ("limits") and command-line option ("--max-sessions"). Static storage. */
const char *sk_config_key_name(enum sk_config_key key);
const char *sk_config_key_section(enum sk_config_key key);
const char *sk_config_key_option(enum sk_config_key key);
/* Whether SIGHUP applies a new value without restarting. */
bool sk_config_key_reloadable(enum sk_config_key key);
/* The value of key as text, as sk_config_print writes it. */
void sk_config_format(const struct sk_config *cfg, enum sk_config_key key,
                      char *buf, size_t size);
/* Whether a and b hold the same value for key. */
bool sk_config_same(const struct sk_config *a, const struct sk_config *b,
                    enum sk_config_key key);

/* "err", "warning", "notice", "info", "debug" for SK_LOG_* levels. */
const char *sk_config_log_level_name(uint32_t level);

#endif
