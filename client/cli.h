/* What sinkctl, its eval command and the development tools (sinkd-bench,
 * sinkd-kbench, sinkd-mkmodel) share on their command lines: messages
 * and usage errors in one form, strict number parsing, JSON strings and
 * a monotonic clock.
 *
 * Messages go to stderr as "PROG: text"; a usage error adds "Try 'HELP'
 * for more information." when the program has a help command, and exits
 * with status 2, as sinkd and every sinkd tool do. The state (PROG and
 * HELP) is one per process: a program sets it first thing with
 * sk_cli_init, and a subcommand (sinkctl eval) may set it again.
 */
#ifndef SK_CLI_H
#define SK_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit status of a usage error (a bad flag, value or argument). */
#define SK_CLI_EXIT_USAGE 2

/* What sk_cli_to_u64 and sk_cli_to_double return. */
enum sk_cli_parse {
  SK_CLI_OK = 0,
  SK_CLI_NOT_NUMBER = -1,   /* not of the form the function takes */
  SK_CLI_OUT_OF_RANGE = -2, /* a number, but outside [min, max] */
};

/* Sets the prefix of every message (e.g. "sinkctl", "sinkctl: eval",
 * "sinkd-bench") and the command a usage error points to (e.g.
 * "sinkctl --help"; NULL: none), and clears the error function. Both
 * strings are borrowed and must outlive their use (string literals in
 * practice). */
void sk_cli_init(const char *prog, const char *help);

/* Receives the message of sk_cli_usage_error or sk_cli_die (without the
 * PROG prefix, at most 1023 bytes) and the exit status that follows. */
typedef void sk_cli_error_fn(int status, const char *message);

/* Makes sk_cli_usage_error and sk_cli_die hand their message to fn
 * instead of writing it to stderr (sinkctl --json prints it as a JSON
 * object on stdout); they exit with the same status after it. NULL: the
 * text on stderr again. */
void sk_cli_set_error_fn(sk_cli_error_fn *fn);

/* The prefix sk_cli_init set ("sinkd" until then). */
const char *sk_cli_prog(void);

/* "PROG: text" on stderr, then "Try 'HELP' for more information." if a
 * help command is set (or the error function's call); exits with
 * SK_CLI_EXIT_USAGE. */
_Noreturn void sk_cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "PROG: text" on stderr (or the error function's call); exits with
 * `status`. */
_Noreturn void sk_cli_die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "PROG: text" on stderr; goes on. */
void sk_cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Parses all of s as a whole number in [min, max] into *ret: decimal
 * digits, optionally followed by 'e' and the digits of a power of ten
 * ("1e6" is 1000000); no sign, no spaces, nothing after. *ret is written
 * only on SK_CLI_OK. Never exits. */
enum sk_cli_parse sk_cli_to_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret);

/* Parses all of s as a finite decimal number (strtod's syntax without
 * leading spaces, "inf" or "nan") into *ret: SK_CLI_OK or
 * SK_CLI_NOT_NUMBER; the caller checks the range. Never exits. */
enum sk_cli_parse sk_cli_to_double(const char *s, double *ret);

/* sk_cli_to_u64, or a usage error "WHAT: 'S' is not a number" or, for a
 * number out of range, "WHAT: 'S' is not in [MIN, MAX]"; `what` names
 * the flag or argument ("--budget"). */
uint64_t sk_cli_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max);

/* sk_cli_to_double, or a usage error "WHAT: 'S' is not a number". */
double sk_cli_parse_double(const char *what, const char *s);

/* A comma-separated list of up to `cap` whole numbers in [min, max]
 * (each as sk_cli_to_u64 takes it) into out[0..cap); returns how many.
 * An empty list, an empty element or anything else is a usage error
 * "WHAT: 'S' is not a list of up to CAP numbers in [MIN, MAX]". */
uint32_t sk_cli_parse_list(const char *what, const char *s, uint64_t *out, uint32_t cap,
                           uint64_t min, uint64_t max);

/* Writes s[0..n) to f as a JSON string (RFC 8259 sec. 7), quotes
 * included: '"' and '\\' escaped, every control character below 0x20 as
 * \n, \r, \t, \b, \f or \u00XX; bytes that are not valid UTF-8 become
 * U+FFFD (as \ufffd), since JSON text must be UTF-8 (sec. 8.1). */
void sk_cli_json_str(FILE *f, const char *s, size_t n);

/* sk_cli_json_str of a NUL-terminated string. */
void sk_cli_json_cstr(FILE *f, const char *s);

/* Length of the valid UTF-8 sequence at s[0..n) (n > 0): 1 to 4, or 0 if
 * it is not valid UTF-8 (overlong forms, surrogates and code points above
 * U+10FFFF are not; RFC 3629 sec. 4). */
size_t sk_cli_utf8_len(const unsigned char *s, size_t n);

/* Seconds of CLOCK_MONOTONIC, for durations. */
double sk_cli_now_s(void);

#endif
