/* Talking to the service manager (sd_notify(3)): readiness, status,
 * reloading, stopping, and the watchdog. Without NOTIFY_SOCKET in the
 * environment every call does nothing, so sinkd behaves the same outside
 * systemd.
 *
 * The watchdog pings come from a timer on the daemon's event loop, never
 * from a thread of their own: a loop that stops turning (wedged in a
 * callback) stops the pings, and the service manager restarts sinkd.
 */
#ifndef SK_NOTIFY_H
#define SK_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* Sends one notification (a printf-style list of "KEY=value" lines).
 * Errors are ignored: a service manager that went away is no reason to
 * stop serving. */
void sk_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

struct sk_watchdog {
  uv_timer_t timer;
  uint64_t interval_ms; /* between pings: half of WatchdogSec= */
  bool running;
};

/* Starts sending WATCHDOG=1 every half of the watchdog interval if the
 * service manager asked for one (WATCHDOG_USEC, and WATCHDOG_PID naming
 * this process; see sd_watchdog_enabled(3)). The first ping goes out at
 * once. Returns 1 if started, 0 if no watchdog was asked for, or
 * -SK_ERR_INTERNAL if the timer cannot be set up. */
int sk_watchdog_start(struct sk_watchdog *w, uv_loop_t *loop);
/* Stops the pings and closes the timer handle (the loop must run once
 * more to finish closing it). Does nothing if not running. */
void sk_watchdog_stop(struct sk_watchdog *w);

#endif
