/* The daemon's run, once its command line is read: the configuration
 * (file, then command line), the kernels, the checks that the socket and
 * the state directory are free, the model, the session store, the server
 * and the HTTP front end, signals (SIGHUP reloads), sd_notify and the
 * event loop; or, instead of serving, --check-config and --calibrate.
 */
#ifndef SK_STARTUP_H
#define SK_STARTUP_H

#include <stdbool.h>

#include "config.h"

/* Exit statuses (sinkd(8)). */
enum {
  SK_EXIT_START = 1,  /* model, socket or other start-up failure */
  SK_EXIT_CONFIG = 2, /* usage or configuration error */
};

/* What the command line asked for. */
struct sk_startup {
  const char *config_path; /* file to read */
  bool explicit_path;      /* given with --config: must exist */
  struct sk_config cli;    /* the command line's values (owned) */
  bool check_only;         /* --check-config or --calibrate: no socket,
                              no store, the model only */
  const char *calibrate_text; /* --calibrate TEXT, or NULL */
};

/* Runs sinkd as st says (st->cli is freed) until it stops: a clean
 * shutdown after SIGINT/SIGTERM returns 0; a start that fails logs why
 * (stderr for check_only) and returns SK_EXIT_START or SK_EXIT_CONFIG;
 * --check-config prints the effective configuration, --calibrate writes
 * the calibration. Main thread. */
int sk_startup_run(struct sk_startup *st);

#endif
