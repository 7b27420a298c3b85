/* KV caches for the tests of the cache (testkv.h). */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "session/kvcache.h"
#include "model/model.h"
#include "testutil.h"
#include "testkv.h"
struct sk_kv *new_kv(struct sk_kv_shape shape, uint32_t policy,
                     uint32_t n_sink, uint32_t window,
                     uint32_t capacity) {
  struct sk_kv_params p = {.policy = policy, .n_sink = n_sink,
                           .window = window, .capacity = capacity,
                           .rope_scale = 1.0f};
  struct sk_kv *kv = NULL;
  struct sk_error err = {0};
  if (sk_kv_new(shape, &p, &kv, &err) < 0)
    fail_msg("sk_kv_new: %s", err.message);
  return kv;
}

void assert_permutation(const struct sk_kv *kv) {
  uint32_t c = kv->hdr->n_slots;
  assert_int_equal(c, kv->hdr->capacity + SK_KV_SPARE_SLOTS);
  char *seen = calloc(c, 1);
  assert_non_null(seen);
  for (uint32_t p = 0; p < c; p++) {
    assert_true(kv->order[p] < c);
    assert_false(seen[kv->order[p]]);
    seen[kv->order[p]] = 1;
  }
  free(seen);
}


struct sk_kv *new_kv_p(struct sk_kv_shape shape,
                       struct sk_kv_params p) {
  struct sk_kv *kv = NULL;
  struct sk_error err = {0};
  if (p.rope_scale == 0.0f) p.rope_scale = 1.0f;
  if (sk_kv_new(shape, &p, &kv, &err) < 0)
    fail_msg("sk_kv_new: %s", err.message);
  return kv;
}
