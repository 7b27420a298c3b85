/* KV caches for the tests of the cache (test-kvcache*.c). Each helper
 * fails the test on error. */
#ifndef SK_TESTKV_H
#define SK_TESTKV_H

#include <stdint.h>

#include "session/kvcache.h"

/* A cache of the given shape, policy, sinks, window and capacity
 * (rope_scale 1); the caller frees it with sk_kv_free. */
struct sk_kv *new_kv(struct sk_kv_shape shape, uint32_t policy,
                     uint32_t n_sink, uint32_t window,
                     uint32_t capacity);
/* Asserts that kv's slot order is a permutation of its slots. */
void assert_permutation(const struct sk_kv *kv);
/* A cache of params p (rope_scale 0 taken as 1). */
struct sk_kv *new_kv_p(struct sk_kv_shape shape,
                       struct sk_kv_params p);

#endif
