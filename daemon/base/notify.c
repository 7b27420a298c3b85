#include "base/notify.h"

#include <stdarg.h>
#include <stdio.h>
#include <systemd/sd-daemon.h>

#include "sinkd/protocol.h"

void sk_notify(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  (void)sd_notify(0, msg);
}

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  (void)sd_notify(0, "WATCHDOG=1");
}

int sk_watchdog_start(struct sk_watchdog *w, uv_loop_t *loop) {
  w->running = false;
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return 0;
  /* Half the interval, as sd_watchdog_enabled(3) advises; at least 1 ms. */
  w->interval_ms = usec / 2000u ? usec / 2000u : 1u;
  if (uv_timer_init(loop, &w->timer) < 0) return -SK_ERR_INTERNAL;
  if (uv_timer_start(&w->timer, on_watchdog, 0, w->interval_ms) < 0) {
    uv_close((uv_handle_t *)&w->timer, NULL);
    return -SK_ERR_INTERNAL;
  }
  w->running = true;
  return 1;
}

void sk_watchdog_stop(struct sk_watchdog *w) {
  if (!w->running) return;
  w->running = false;
  uv_timer_stop(&w->timer);
  uv_close((uv_handle_t *)&w->timer, NULL);
}
