/* The completion routes of the OpenAI gateway: POST /v1/completions and
 * POST /v1/chat/completions. A request's flow: its body checked
 * (oaireq.h), then msgpack ops on the request's own connection into the
 * server (httpd.h): open (a temporary session unless the request names
 * one, or "new"), generate or chat (whose token events become the
 * response's text or event stream, cut before a stop string), and close
 * of a temporary session. A chat on a persistent session sends only the
 * messages the session does not hold yet (oaiconv.h).
 *
 * The shapes follow OpenAI's API reference (objects "text_completion",
 * "chat.completion", "chat.completion.chunk"; server-sent events ending
 * with "[DONE]"); sinkd's own figures go in a "sinkd" member.
 */
#ifndef SK_OAICOMPL_H
#define SK_OAICOMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "http/httpd.h"
#include "http/metrics.h"
#include "http/oaiconv.h"

/* What the completion routes keep between requests (the gateway,
 * openai.h, holds one). */
struct sk_oaicompl {
  const char *model_name;     /* the "model" of responses (borrowed) */
  struct sk_metrics *metrics; /* where usage and token gaps are counted
                                 (borrowed) */
  struct sk_oaiconv convs;    /* conversations of persistent sessions */
  uint64_t serial;            /* the number in the last response's id */
};

/* Readies *oc; model_name and metrics must outlive it. sk_oaicompl_free
 * frees what it remembers (the conversation cache). */
void sk_oaicompl_init(struct sk_oaicompl *oc, const char *model_name,
                      struct sk_metrics *metrics);
void sk_oaicompl_free(struct sk_oaicompl *oc);

/* Serves a completion (chat false) or chat completion request: answers
 * 400 at once if its body is wrong, else later, when the daemon has
 * generated (oc must outlive the request). */
void sk_oaicompl_start(struct sk_httpd_req *req, struct sk_oaicompl *oc, bool chat);

#endif
