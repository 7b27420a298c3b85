/* A fake sinkd for the tests of libsinkd and sinkctl: a thread that
 * accepts one connection on a Unix socket in a temporary directory and
 * answers requests with canned replies. It records what it received; the
 * test asserts on it afterwards (cmocka assertions must stay on the main
 * thread). */
#ifndef SK_TESTFAKE_H
#define SK_TESTFAKE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

enum fake_mode {
  FAKE_NORMAL,
  FAKE_WRONG_ID,     /* replies carry another id */
  FAKE_HANGUP,       /* closes the connection on the first request */
  FAKE_ID0,          /* answers with an id-0 too_large error */
  FAKE_HUGE_FRAME,   /* sends a frame header above the ceiling */
  FAKE_NOT_MAP,      /* sends a reply that is an array */
  FAKE_SILENT,       /* never answers */
};

#define FAKE_MAX_REQ 32

struct fake {
  char *dir, *path;
  int listen_fd;
  pthread_t thread;
  enum fake_mode mode;
  bool final_before_cancel_reply; /* order of the two replies on cancel */
  struct sk_frame_reader rd;
  /* Requests received, as raw bodies. */
  uint8_t *req[FAKE_MAX_REQ];
  size_t req_len[FAKE_MAX_REQ];
  size_t n_req;
};

/* Starts the fake in mode (its socket in f->path); fails the test on error. */
struct fake *fake_start(enum fake_mode mode);
/* Joins the thread (the client must have been freed first, so the fake
 * sees the connection end). The requests stay readable until fake_free. */
void fake_join(struct fake *f);
void fake_free(struct fake *f);
/* Request i as received by the fake, parsed (caller frees). */
void fake_request(struct fake *f, size_t i, struct sk_msg *m);
/* Asserts that request m is op with id. */
void assert_op(const struct sk_msg *m, const char *op, uint64_t id);

#endif
