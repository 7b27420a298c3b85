/* The op handlers of the protocol (sinkd-protocol(7)): each request
 * frame is parsed, its op looked up in the op table, and its handler
 * reads the request's fields through the wire schema (proto/wire.h),
 * checks them and answers (replies.h), queues a job on the session
 * (jobs.h) or hands work to the thread pool (copy.h). Loop thread.
 */
#ifndef SK_OPS_H
#define SK_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "net/conn.h"

/* The connections' frame hook (conn.h; user: the server): one complete
 * request frame of conn, body (len bytes) valid during the call only.
 * Every request is answered, a frame that is no request too (id 0). */
void sk_ops_frame(void *user, struct sk_conn *conn, const uint8_t *body, size_t len);

#endif
