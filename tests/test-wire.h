/* What test-wire.c and test-wire-requests.c share (one executable). */
#ifndef SK_TEST_WIRE_H
#define SK_TEST_WIRE_H

#include <stddef.h>

#include "proto/msg.h"

/* A packed frame, parsed. */
struct frame {
  struct sk_msgbuf b;
  struct sk_msg msg;
};

/* Finishes f->b, checks the header against the body and parses the body
 * into f->msg; returns its map. */
const msgpack_object *parse(struct frame *f);
void frame_free(struct frame *f);
/* The map's keys in order, space-separated, into out. */
void keys(const msgpack_object *map, char *out, size_t size);

/* test-wire-requests.c */
void test_request_head(void **state);
void test_request_open(void **state);
void test_request_open_range(void **state);
void test_request_append(void **state);
void test_request_generate(void **state);
void test_request_generate_defaults(void **state);
void test_request_elements(void **state);
void test_request_stats_import(void **state);
void test_request_tokenize(void **state);
void test_frame_parts(void **state);

#endif
