/* Logging to stderr. When stderr is the journal's stream (systemd sets
 * JOURNAL_STREAM to its device and inode, systemd.exec(5)), each line has
 * an sd-daemon(3) priority prefix ("<3>...") so that journald keeps
 * severities; anywhere else (a terminal, a file) lines are plain,
 * "sinkd: " with "error: " or "warning: " where it applies, so that they
 * read well beside a client's output. Only the daemon's top layers log
 * (server, main); library modules return errors instead. */
#ifndef SK_LOG_H
#define SK_LOG_H

#include <stdbool.h>

enum sk_log_level {
  SK_LOG_ERR = 3,
  SK_LOG_WARNING = 4,
  SK_LOG_NOTICE = 5,
  SK_LOG_INFO = 6,
  SK_LOG_DEBUG = 7,
};

/* Lines above this level are dropped (default SK_LOG_INFO). */
void sk_log_set_level(int level);
int sk_log_get_level(void);
/* Whether stderr is the stream JOURNAL_STREAM names ("DEV:INODE"). */
bool sk_log_to_journal(void);
/* Decides the line format from where stderr goes now (call after
 * redirecting it; otherwise the first line decides). */
void sk_log_init(void);
/* One line (a trailing newline is added). Thread-safe: one write(2). */
void sk_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
