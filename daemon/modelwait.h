/* Waiting for a model under a service manager. A package installs and
 * starts sinkd before anyone has put a model on the machine; rather than
 * fail (and be restarted until systemd gives up), sinkd then tells the
 * service manager it is up, says in its status what it waits for, and
 * re-reads the configuration on each SIGHUP (`systemctl reload sinkd`)
 * until it names a model file that exists. Outside a service manager
 * (no NOTIFY_SOCKET) nothing waits: a missing model is an error at once.
 *
 * Clients that connect meanwhile wait in the listening socket's queue
 * (systemd holds it) and are served once the model is loaded.
 */
#ifndef SK_MODELWAIT_H
#define SK_MODELWAIT_H

#include <stdbool.h>
#include <stddef.h>

/* Whether model (a path, or NULL when none is configured) is missing:
 * NULL, or a file that does not exist (ENOENT, or ENOTDIR on the way).
 * Another problem (permissions, a bad file) is not missing: loading
 * the model reports it. If missing, why gets one line for the status
 * and the log, naming config_path (the file to edit). */
bool sk_modelwait_missing(const char *model, const char *config_path, char *why, size_t size);

/* Re-reads the configuration as at start: on success stores the model
 * it names now (NULL: none; owned by the caller's configuration) in
 * *ret_model and returns 0; returns -1 after logging its errors. */
typedef int (*sk_modelwait_reread_fn)(void *user, const char **ret_model);

/* Waits for a model if model is missing and a service manager listens
 * (NOTIFY_SOCKET): sends READY=1 with STATUS= saying what to do, pings
 * the watchdog if one is asked for, and on each SIGHUP sends RELOADING=1,
 * calls reread and checks the model again. A configuration with errors
 * keeps it waiting (its errors are logged). Once the model is there it
 * sends RELOADING=1 with STATUS=loading and EXTEND_TIMEOUT_USEC (10 min,
 * the unit's TimeoutStartSec=, which also holds off the watchdog while
 * the model loads) and returns 1; the caller loads it and sends READY=1
 * when serving. Returns 1 at once if model is not missing or no service
 * manager listens, 0 if SIGTERM or SIGINT came while waiting (STOPPING=1
 * sent), -1 if the event loop cannot be set up (logged). */
int sk_modelwait_run(const char *model, const char *config_path, sk_modelwait_reread_fn reread,
                     void *user);

#endif
