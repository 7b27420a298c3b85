/* What wire.c, wire_reply.c and wire_request.c share (internal to the
 * wire module). */
#ifndef SK_WIRE_INT_H
#define SK_WIRE_INT_H

#include "proto/wire.h"

/* Ends the frame's map m (sk_wire_map_end); frees b on failure. Returns
 * 0 or -SK_ERR_NO_MEMORY. */
int sk__wire_end(struct sk_msgbuf *b, struct sk_wire_map *m);

/* A nested map m as the value of key in parent, begun here and written
 * by sk__wire_nested_end (whose failure marks parent failed). */
void sk__wire_nested(struct sk_wire_map *parent, struct sk_wire_map *m, const char *key);
void sk__wire_nested_end(struct sk_wire_map *parent, struct sk_wire_map *m);

/* A protocol error (-SK_ERR_PROTOCOL) with the message what, which names
 * the field. */
int sk__wire_bad(struct sk_error *err, const char *what);

#endif
