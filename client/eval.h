/* `sinkctl eval`: perplexity of a text streamed through sinkd sessions of
 * several eviction policies, the way StreamingLLM evaluates (Xiao et al.
 * 2023, sec. 4.1): every token of the text is appended to a fresh session
 * and scored by the log-probability the model gave it from what the cache
 * held (append with logprobs); once the cache is full the daemon evicts
 * one token per new token. Also the paper's "sliding window with
 * re-computation" baseline: every scored token gets a fresh dense session
 * holding only the `budget` tokens before it.
 *
 * Prints a table of perplexity per span of tokens (one column per run),
 * and optionally writes it as CSV and draws it as a PNG with gnuplot.
 */
#ifndef SK_SINKCTL_EVAL_H
#define SK_SINKCTL_EVAL_H

#include <stdbool.h>

/* Runs the eval command. argv[0] is "eval"; the rest are its options and
 * the text file (see `sinkctl eval --help`). global_socket, global_json
 * and wait_ms (--wait) are the options given before the command
 * (NULL/false/0 if none). Returns the exit status: 0, 1 (daemon error),
 * 2 (usage), 3 (cannot connect), 4 (connection lost), 130
 * (interrupted). */
int sk_eval_main(int argc, char **argv, const char *global_socket,
                 bool global_json, unsigned int wait_ms);

#endif
