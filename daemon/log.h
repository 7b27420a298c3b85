/* Logging to stderr with sd-daemon(3) priority prefixes ("<3>...") so that
 * journald keeps severities when sinkd runs under systemd. Only the daemon's
 * top layers log (server, main); library modules return errors instead. */
#ifndef SK_LOG_H
#define SK_LOG_H

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
/* One line (a trailing newline is added). Thread-safe: one write(2). */
void sk_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
