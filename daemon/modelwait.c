#include "modelwait.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

#include "base/log.h"
#include "base/notify.h"

/* How long loading the model may take once it is there: the unit's
 * TimeoutStartSec=, in microseconds. */
#define SK_MODELWAIT_LOAD_USEC (600ull * 1000000ull)

bool sk_modelwait_missing(const char *model, const char *config_path, char *why, size_t size) {
  if (!model) {
    snprintf(why, size, "no model: set model = in [daemon] of %s, then systemctl reload sinkd",
             config_path);
    return true;
  }
  struct stat st;
  if (stat(model, &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) return false;
  snprintf(why, size, "no model: %s does not exist; put the GGUF file there or set model = in "
           "%s, then systemctl reload sinkd", model, config_path);
  return true;
}

struct modelwait {
  const char *config_path;
  sk_modelwait_reread_fn reread;
  void *user;
  uv_signal_t sig_hup, sig_term, sig_int;
  struct sk_watchdog watchdog;
  int result; /* -1 while waiting, then 1 (model there) or 0 (stop) */
};

static void close_all(struct modelwait *w) {
  uv_close((uv_handle_t *)&w->sig_hup, NULL);
  uv_close((uv_handle_t *)&w->sig_term, NULL);
  uv_close((uv_handle_t *)&w->sig_int, NULL);
  sk_watchdog_stop(&w->watchdog);
}

static void on_hup(uv_signal_t *h, int signum) {
  (void)signum;
  struct modelwait *w = h->data;
  sk_notify("RELOADING=1\nSTATUS=reloading %s", w->config_path);
  const char *model = NULL;
  char why[1024];
  if (w->reread(w->user, &model) < 0) {
    snprintf(why, sizeof why,
             "no model: %s has errors (see the log); fix them, then systemctl reload sinkd",
             w->config_path);
  } else if (!sk_modelwait_missing(model, w->config_path, why, sizeof why)) {
    sk_log(SK_LOG_NOTICE, "model %s is there: loading it", model);
    sk_notify("STATUS=loading %s\nEXTEND_TIMEOUT_USEC=%llu", model,
              (unsigned long long)SK_MODELWAIT_LOAD_USEC);
    w->result = 1;
    close_all(w);
    return;
  }
  sk_log(SK_LOG_WARNING, "%s", why);
  sk_notify("READY=1\nSTATUS=%s", why);
}

static void on_stop(uv_signal_t *h, int signum) {
  (void)signum;
  struct modelwait *w = h->data;
  sk_notify("STOPPING=1\nSTATUS=stopping");
  sk_log(SK_LOG_INFO, "stopped while waiting for a model");
  w->result = 0;
  close_all(w);
}

int sk_modelwait_run(const char *model, const char *config_path, sk_modelwait_reread_fn reread,
                     void *user) {
  char why[1024];
  const char *ns = getenv("NOTIFY_SOCKET");
  if (!ns || !*ns || !sk_modelwait_missing(model, config_path, why, sizeof why)) return 1;

  uv_loop_t loop;
  if (uv_loop_init(&loop) < 0) {
    sk_log(SK_LOG_ERR, "cannot set up an event loop to wait for a model");
    return -1;
  }
  struct modelwait w = {.config_path = config_path, .reread = reread, .user = user, .result = -1};
  uv_signal_t *sigs[3] = {&w.sig_hup, &w.sig_term, &w.sig_int};
  const int signums[3] = {SIGHUP, SIGTERM, SIGINT};
  uv_signal_cb cbs[3] = {on_hup, on_stop, on_stop};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(&loop, sigs[i]);
    sigs[i]->data = &w;
    uv_signal_start(sigs[i], cbs[i], signums[i]);
  }
  sk_watchdog_start(&w.watchdog, &loop);
  sk_log(SK_LOG_WARNING, "%s", why);
  /* Up, so that `systemctl reload` reaches the daemon and neither a
   * package's `systemctl start` nor the boot waits for a model. */
  sk_notify("READY=1\nSTATUS=%s", why);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) < 0) sk_log(SK_LOG_WARNING, "the model wait's event loop did not close");
  return w.result < 0 ? 0 : w.result;
}
