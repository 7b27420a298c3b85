/* What the files of sinkctl share: sinkctl.c (options, the command
 * table, main), output.c (messages, errors and figures as text or
 * JSON), generate.c (prompts, streaming a reply, the prefill's progress
 * bar, the generate command), chat.c (the chat command) and commands.c
 * (the commands of one request each). */
#ifndef SK_SINKCTL_H
#define SK_SINKCTL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "sinkd/client.h"

/* Exit status (sinkctl(1), EXIT STATUS). */
enum {
  EXIT_DAEMON_ERROR = 1,
  EXIT_USAGE = SK_CLI_EXIT_USAGE,
  EXIT_CONNECT = 3,
  EXIT_CONNECTION = 4,
  EXIT_INTERRUPTED = 130,
};

/* "sinkctl": the prefix of messages (output.c). */
extern const char *const prog;

/* ---- options (sinkctl.c) ---------------------------------------------- */

/* An option's id: its short letter, or a number past them. */
enum opt_id {
  OPT_SOCKET = 's',
  OPT_JSON = 'j',
  OPT_VERBOSE = 'v',
  OPT_HELP = 'h',
  OPT_VERSION = 'V',
  OPT_MAX_TOKENS = 'n',
  OPT_TEMPERATURE = 't',
  OPT_TOP_K = 256,
  OPT_TOP_P,
  OPT_SEED,
  OPT_STOP,
  OPT_IGNORE_EOS,
  OPT_SESSION,
  OPT_NO_ECHO,
  OPT_POLICY,
  OPT_SINKS,
  OPT_WINDOW,
  OPT_CAPACITY,
  OPT_HEAVY,
  OPT_RECENT,
  OPT_ROPE_SCALE, OPT_SPARSITY,
  OPT_PIN,
  OPT_PIN_FILE,
  OPT_NO_BOS,
  OPT_SPECIAL,
  OPT_KEEP,
  OPT_PROGRESS,
  OPT_NO_PROGRESS,
  OPT_TOKENS,
  OPT_IDLE,
  OPT_ALL,
  OPT_SYSTEM,
  OPT_TIMEOUT,
  OPT_WAIT,
  OPT_SPECULATION,
  OPT_DRAFT_TOKENS,
  OPT_DRAFT_FIXED,
  OPT_RAW,
  OPT__END
};

/* The command line, parsed. */
struct opts {
  const char *socket;
  bool json, verbose;
  unsigned int timeout_ms; /* --timeout; 0: wait for the daemon forever */
  unsigned int wait_ms;    /* --wait: for a daemon that is starting; 0: no */
  bool given[OPT__END]; /* which command-specific options were used */
  struct sk_generate_params gen;
  const char **stops; /* (n_stop) pointers into argv */
  size_t n_stop;
  bool has_session;
  uint64_t session;
  bool no_echo;
  struct sk_open_params open;
  char *pin_file_text; /* --pin-file contents (owned) */
  bool no_bos;
  bool tokens;
  bool close_all;         /* close --all */
  bool close_idle;        /* close --idle */
  uint64_t idle_s;        /* close --idle DURATION, in seconds */
  const char *system; /* chat --system */
};

/* ---- output (output.c) ------------------------------------------------- */

/* --json given: errors too are JSON, on stdout (json_error). */
extern bool g_json;
/* Text of the model (and of prompts echoed with it) has its control
 * characters escaped: stdout is a terminal and --raw was not given. */
extern bool g_escape;

/* Writes text of the model (len bytes, UTF-8) to stdout: as it is, or
 * with g_escape every control character that a terminal would act on
 * (C0 but newline and tab, DEL, C1 U+0080..U+009F: escape sequences
 * that move the cursor, retitle the window, clear the screen) shown
 * instead as \xHH or \uHHHH. */
void print_model_text(const char *text, size_t len);

/* Reports a failed library call and returns the exit status for it:
 * 4 if the connection is gone, 1 if the daemon answered with an error.
 * With --json: {"error": {"code", "message", "hint"}} on stdout instead,
 * the same status. */
int report(const struct sk_client *c, const struct sk_error *e);
/* The message of a dense session that holds all it can (resident
 * tokens), on stderr. */
void say_session_full(uint64_t resident);
/* {"error": {"code": C, "message": M, "hint": H, "status": N}} and a
 * newline on stdout (hint only when there is one): what --json prints
 * instead of a message on stderr; the exit status is the same. */
void json_error(const char *code, const char *message, const char *hint, int status);
/* "key": for an object member; `first` says whether a comma is needed. */
void json_key(FILE *f, bool *first, const char *key);
void json_kv_u64(FILE *f, bool *first, const char *key, uint64_t v);
void json_kv_str(FILE *f, bool *first, const char *key, const char *v);

/* Prints "key       value" (text: columns, as stats prints them) or a
 * JSON member. */
struct kv_out {
  bool json, first;
};

void out_u64(struct kv_out *k, const char *key, uint64_t v);
void out_str(struct kv_out *k, const char *key, const char *v);
void out_bool(struct kv_out *k, const char *key, bool v);
void out_f64(struct kv_out *k, const char *key, double v);
/* The braces of a JSON object (nothing in text). */
void out_begin(struct kv_out *k);
void out_end(struct kv_out *k);

/* Figures as text into buf (size bytes): human_bytes 1327232 -> "1.3
 * MiB"; human_duration 3725 -> "1h 2m 5s"; format_duration (list's
 * columns) seconds as "3d2h", "1h30m", "45m0s" or "30s"; format_bytes
 * (list's columns) as "12K", "3.5M", "1.2G" (powers of 1024). */
void human_bytes(uint64_t v, char *buf, size_t size);
void human_duration(uint64_t s, char *buf, size_t size);
void format_duration(uint64_t s, char *buf, size_t size);
void format_bytes(uint64_t b, char *buf, size_t size);
/* "LABEL  USED of MAX", or "LABEL  USED, NONE" when max is 0 (no limit). */
void print_bytes_of(const char *label, uint64_t used, uint64_t max, const char *none);
/* A session's figures (stats ID, chat's /stats) as text, or as one JSON
 * object and a newline; json_session_stats_members writes the members
 * alone (the braces are the caller's: out_begin / out_end). */
void print_session_stats(const struct sk_session_stats *s);
/* The "speculation" of hello or the daemon's stats as one line of text
 * under label, or as a JSON member after the others (*first as
 * json_key takes it). */
void print_spec(const char *label, const struct sk_spec_info *sp);
void json_spec(bool *first, const struct sk_spec_info *sp);
void json_session_stats(const struct sk_session_stats *s);
void json_session_stats_members(struct kv_out *k, const struct sk_session_stats *s);

/* ---- prompts and replies (generate.c) ---------------------------------- */

/* The text argument(s) of generate/tokenize: joined with spaces, or stdin
 * when there are none or the only one is "-" (at most the largest frame
 * the daemon takes: a usage error beyond). malloc'd, NUL-terminated;
 * *ret_len its length. */
char *text_from_args(int argc, char **argv, size_t *ret_len);
/* Milliseconds of CLOCK_MONOTONIC. */
double now_ms(void);

/* Set by the first Ctrl-C after catch_sigint. */
extern volatile sig_atomic_t interrupted;
/* Clears `interrupted` and catches SIGINT without SA_RESTART (a Ctrl-C at
 * chat's prompt interrupts the read): the first Ctrl-C sets
 * `interrupted`, a second ends sinkctl at once. */
void catch_sigint(void);

/* A reply being streamed: printed as it comes, or collected for --json. */
struct gen_state {
  bool json;
  char *text; /* (len) collected for --json */
  size_t len, cap;
  int32_t *tokens; /* (n_tokens) collected for --json */
  size_t n_tokens, cap_tokens;
  double first_token_ms;
  bool ends_with_newline; /* the last text printed ended a line */
  bool printed;           /* some text was printed */
  const char *echo;       /* (echo_len) the prompt, printed before the first
                             token's text, so that a refused request (no such
                             session, ...) prints its error alone */
  size_t echo_len;
};

/* sk_client_generate's token callback over a struct gen_state; stops
 * the generation after a Ctrl-C. */
int on_token(void *user, const struct sk_token_event *ev);
void gen_state_free(struct gen_state *g);
/* The result of a generate as one JSON object; `turn` (chat) if > 0. */
void json_generate(uint64_t session, unsigned turn, const struct gen_state *g,
                   const struct sk_generate_result *res);

/* Whether to prefill in chunks with a bar on stderr: --progress always,
 * --no-progress never, else for long prompts when stderr is a terminal. */
bool want_progress(const struct opts *o, size_t prompt_len);
/* Appends text to a session as tokenize + appends of a few hundred tokens
 * each, drawing the bar. `empty`: the session has seen no token, so the
 * vocabulary's BOS rule applies, as the daemon does for text; `special`:
 * control-token text is those tokens (--special). Returns 0; -1 if
 * Ctrl-C stopped it (what was appended stays); or the exit status of a
 * reported error. *ret_n: tokens appended. */
int prefill(struct sk_client *c, uint64_t session, bool empty, bool special, const char *text,
            size_t len, uint64_t *ret_n);
/* Whether a session has seen no token yet (BOS rule); false on error. */
bool session_is_empty(struct sk_client *c, uint64_t session);

/* ---- the commands: each returns sinkctl's exit status ------------------ */

/* generate.c */
int cmd_generate(struct sk_client *c, const struct opts *o, int argc, char **argv);
/* chat.c */
int cmd_chat(struct sk_client *c, const struct opts *o);
/* commands.c */
int cmd_tokenize(struct sk_client *c, const struct opts *o, int argc, char **argv);
int cmd_detokenize(struct sk_client *c, const struct opts *o, int argc, char **argv);
int cmd_open(struct sk_client *c, const struct opts *o);
int cmd_close(struct sk_client *c, const struct opts *o, uint64_t id);
int cmd_close_many(struct sk_client *c, const struct opts *o);
int cmd_list(struct sk_client *c, const struct opts *o);
int cmd_stats(struct sk_client *c, const struct opts *o, bool has_id, uint64_t id);
int cmd_resume(struct sk_client *c, const struct opts *o, uint64_t id);
int cmd_fork(struct sk_client *c, const struct opts *o, uint64_t id);
int cmd_save(struct sk_client *c, const struct opts *o, uint64_t id, const char *path);
int cmd_load(struct sk_client *c, const struct opts *o, const char *path);
int cmd_ping(struct sk_client *c, const struct opts *o);
int cmd_hello(struct sk_client *c, const struct opts *o);

#endif
