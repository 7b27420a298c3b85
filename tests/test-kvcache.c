/* KV cache: layout, dense and streaming policies, eviction log, header
 * checks on attach, the window, H2O and pinned policies. With the real
 * model: test-kvcache-model.c. */
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

static const struct sk_kv_shape small_shape = {.n_layer = 2, .kv_dim = 3};

/* What the forward pass does, with data that identifies the token: every
 * K/V float of a token is its stream index (+ layer, and negated for V),
 * so a view of the cache shows whether rows stayed with their tokens. */
static void append(struct sk_kv *kv, uint32_t n, struct sk_evict_log *log) {
  struct sk_error err = {0};
  if (sk_kv_make_room(kv, n, log, &err) < 0)
    fail_msg("make_room(%u): %s", n, err.message);
  int32_t tok[64];
  assert_true(n <= 64);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t index = kv->hdr->n_seen + i;
    tok[i] = (int32_t)(1000 + index);
    uint32_t slot = sk_kv_slot(kv, kv->hdr->n_resident + i);
    for (uint32_t l = 0; l < kv->hdr->n_layer; l++)
      for (uint32_t d = 0; d < kv->hdr->kv_dim; d++) {
        sk_kv_k(kv, l, slot)[d] = (float)(index + l);
        sk_kv_v(kv, l, slot)[d] = -(float)(index + l);
      }
  }
  sk_kv_commit(kv, tok, n);
  assert_permutation(kv);
}

/* The resident stream indices, in cache-position order, are want[]; and
 * every row still holds its token's data. */
static void assert_resident(const struct sk_kv *kv, const uint64_t *want,
                            uint32_t n) {
  assert_int_equal(kv->hdr->n_resident, n);
  for (uint32_t p = 0; p < n; p++) {
    uint32_t slot = sk_kv_slot(kv, p);
    if (kv->index[slot] != want[p])
      fail_msg("position %u holds stream index %llu, want %llu", p,
               (unsigned long long)kv->index[slot],
               (unsigned long long)want[p]);
    assert_int_equal(kv->token[slot], 1000 + want[p]);
    for (uint32_t l = 0; l < kv->hdr->n_layer; l++)
      for (uint32_t d = 0; d < kv->hdr->kv_dim; d++) {
        assert_true(sk_kv_k(kv, l, slot)[d] == (float)(want[p] + l));
        assert_true(sk_kv_v(kv, l, slot)[d] == -(float)(want[p] + l));
      }
  }
}

static void test_streaming(void **state) {
  (void)state;
  struct sk_kv *kv = new_kv(small_shape, SK_POLICY_STREAMING, 4, 12, 0);
  assert_int_equal(kv->hdr->capacity, 16);
  assert_int_equal(sk_kv_max_room(kv), 12);
  size_t size = sk_kv_size(small_shape, 16);
  assert_int_equal(kv->hdr->size, size);
  struct sk_evict_log log;
  sk_evict_log_reset(&log);

  for (uint32_t i = 0; i < 40; i++) {
    append(kv, 1, &log);
    assert_int_equal(kv->hdr->n_resident, i + 1 < 16 ? i + 1 : 16);
  }
  uint64_t want[16] = {0, 1, 2, 3};
  for (uint32_t i = 0; i < 12; i++) want[4 + i] = 28 + i;
  assert_resident(kv, want, 16);
  assert_int_equal(kv->hdr->n_seen, 40);
  assert_int_equal(kv->hdr->n_evicted, 24);
  assert_int_equal(log.n_evicted, 24);
  assert_int_equal(log.n_ranges, 1);
  assert_false(log.truncated);
  assert_int_equal(log.first[0], 4);
  assert_int_equal(log.last[0], 27);

  /* more than one step's room is refused, nothing changes */
  void *before = malloc(size);
  assert_non_null(before);
  memcpy(before, kv->hdr, size);
  struct sk_error err = {0};
  assert_int_equal(sk_kv_make_room(kv, 13, &log, &err), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "13"));
  assert_non_null(strstr(err.message, "12"));
  assert_memory_equal(before, kv->hdr, size);
  assert_int_equal(log.n_evicted, 24);

  /* 30 more into the full cache, in pieces of at most the window */
  struct sk_evict_log log2;
  sk_evict_log_reset(&log2);
  append(kv, 12, &log2);
  append(kv, 12, &log2);
  append(kv, 6, &log2);
  for (uint32_t i = 0; i < 12; i++) want[4 + i] = 58 + i;
  assert_resident(kv, want, 16);
  assert_int_equal(kv->hdr->n_seen, 70);
  assert_int_equal(kv->hdr->n_evicted, 54);
  assert_int_equal(log2.n_evicted, 30);
  assert_int_equal(log2.n_ranges, 1);
  assert_int_equal(log2.first[0], 28);
  assert_int_equal(log2.last[0], 57);

  /* memory never grew */
  assert_int_equal(kv->hdr->size, size);
  assert_int_equal(sk_kv_size(small_shape, 16), size);

  /* clear drops residents, keeps counters */
  sk_kv_clear(kv);
  assert_int_equal(kv->hdr->n_resident, 0);
  assert_int_equal(kv->hdr->n_seen, 70);
  assert_int_equal(kv->hdr->n_evicted, 54);
  assert_permutation(kv);
  append(kv, 5, NULL);
  uint64_t after[5] = {70, 71, 72, 73, 74};
  assert_resident(kv, after, 5);
  free(before);
  sk_kv_free(kv);
}

/* No sinks (plain window) and larger steps keep the same invariants. */
static void test_window_random_steps(void **state) {
  (void)state;
  struct sk_kv *kv = new_kv(small_shape, SK_POLICY_STREAMING, 0, 7, 0);
  struct sk_evict_log log;
  sk_evict_log_reset(&log);
  uint64_t seen = 0;
  unsigned r = 12345;
  for (int step = 0; step < 200; step++) {
    r = r * 1103515245u + 12345u;
    uint32_t n = 1 + (r >> 16) % 7;
    append(kv, n, &log);
    seen += n;
    uint32_t nr = seen < 7 ? (uint32_t)seen : 7;
    uint64_t want[7];
    for (uint32_t p = 0; p < nr; p++) want[p] = seen - nr + p;
    assert_resident(kv, want, nr);
  }
  assert_int_equal(kv->hdr->n_evicted, seen - 7);
  assert_int_equal(log.n_ranges, 1);
  assert_int_equal(log.first[0], 0);
  assert_int_equal(log.last[0], seen - 8);
  sk_kv_free(kv);
}

static void test_dense(void **state) {
  (void)state;
  struct sk_kv *kv = new_kv(small_shape, SK_POLICY_DENSE, 0, 0, 8);
  assert_int_equal(sk_kv_max_room(kv), 8);
  size_t size = (size_t)kv->hdr->size;
  append(kv, 5, NULL);
  struct sk_error err = {0};
  void *before = malloc(size);
  assert_non_null(before);
  memcpy(before, kv->hdr, size);
  assert_int_equal(sk_kv_make_room(kv, 4, NULL, &err), -SK_ERR_CONTEXT_FULL);
  assert_int_equal(err.code, SK_ERR_CONTEXT_FULL);
  assert_non_null(strstr(err.message, "needs 4, 3 of 8 free"));
  assert_memory_equal(before, kv->hdr, size);
  append(kv, 3, NULL);
  memcpy(before, kv->hdr, size);
  assert_int_equal(sk_kv_make_room(kv, 1, NULL, &err), -SK_ERR_CONTEXT_FULL);
  assert_non_null(strstr(err.message, "needs 1, 0 of 8 free"));
  assert_int_equal(sk_kv_make_room(kv, 9, NULL, &err), -SK_ERR_BAD_REQUEST);
  assert_memory_equal(before, kv->hdr, size);
  assert_int_equal(sk_kv_make_room(kv, 0, NULL, &err), 0);
  uint64_t want[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  assert_resident(kv, want, 8);
  assert_int_equal(kv->hdr->n_evicted, 0);
  free(before);
  sk_kv_free(kv);
}

static void test_size(void **state) {
  (void)state;
  struct sk_kv_shape sh = {.n_layer = 5, .kv_dim = 32};
  size_t s = sk_kv_size(sh, 64);
  /* 64 slots + SK_KV_SPARE_SLOTS spare ones */
  size_t kv_bytes = 5u * 2 * 32 * (64 + SK_KV_SPARE_SLOTS) * sizeof(float);
  size_t meta = (64 + SK_KV_SPARE_SLOTS) * (sizeof(int32_t) + sizeof(uint64_t) + sizeof(uint32_t) +
                     sizeof(float)); /* token, index, order, score */
  assert_true(s >= kv_bytes + meta + sizeof(struct sk_kv_header));
  assert_true(s <= kv_bytes + meta + sizeof(struct sk_kv_header) + 6 * 64);
  assert_int_equal(s % 64, 0);
  /* linear in capacity */
  assert_int_equal(sk_kv_size(sh, 128) - sk_kv_size(sh, 64),
                   sk_kv_size(sh, 192) - sk_kv_size(sh, 128));
  assert_int_equal(sk_kv_size(sh, 0), 0);
  assert_int_equal(sk_kv_size((struct sk_kv_shape){0, 32, SK_KV_F32}, 64), 0);
  assert_int_equal(sk_kv_size((struct sk_kv_shape){5, 32, 2}, 64), 0); /* unknown type */
  assert_int_equal(
      sk_kv_size((struct sk_kv_shape){UINT32_MAX, UINT32_MAX, SK_KV_F32}, SK_KV_MAX_CAPACITY),
      0);

  /* offsets are 64-byte aligned and in order */
  struct sk_kv *kv = new_kv(sh, SK_POLICY_STREAMING, 4, 60, 0);
  const struct sk_kv_header *h = kv->hdr;
  uint64_t off[] = {h->off_token, h->off_index, h->off_order, h->off_k,
                    h->off_v, h->size};
  for (size_t i = 0; i < 6; i++) {
    assert_int_equal(off[i] % 64, 0);
    if (i) assert_true(off[i] > off[i - 1]);
  }
  assert_int_equal(h->off_v - h->off_k, 5u * (64 + SK_KV_SPARE_SLOTS) * 32 * sizeof(float));
  assert_int_equal(h->size, s);
  assert_true((char *)kv->k == (char *)h + h->off_k);
  assert_true(sk_kv_k(kv, 1, 2) == (float *)kv->k + (1 * (64 + SK_KV_SPARE_SLOTS) + 2) * 32);
  size_t meta_size = 0, data_size = 0;
  assert_true(sk_kv_part_sizes(sh, 64, &meta_size, &data_size));
  assert_int_equal(meta_size, h->off_k);
  assert_int_equal(data_size, h->size - h->off_k);
  assert_false(sk_kv_part_sizes(sh, 0, &meta_size, &data_size));
  sk_kv_free(kv);
}

static void expect_params_error(struct sk_kv_params p, uint32_t max,
                                const char *n1, const char *n2) {
  struct sk_error err = {0};
  assert_int_equal(sk_kv_params_check(&p, max, &err), -SK_ERR_BAD_REQUEST);
  assert_int_equal(err.code, SK_ERR_BAD_REQUEST);
  if (!strstr(err.message, n1) || (n2 && !strstr(err.message, n2)))
    fail_msg("message \"%s\" lacks \"%s\" / \"%s\"", err.message, n1,
             n2 ? n2 : "");
}

static void test_params(void **state) {
  (void)state;
  struct sk_error err = {0};
  struct sk_kv_params ok = {.policy = SK_POLICY_STREAMING, .n_sink = 4,
                            .window = 60, .rope_scale = 1.0f};
  assert_int_equal(sk_kv_params_check(&ok, 64, &err), 0);
  assert_int_equal(sk_kv_params_capacity(&ok), 64);
  struct sk_kv_params p = ok;
  p.window = 0;
  expect_params_error(p, 64, "window 0", ">= 1");
  p = ok;
  p.window = 61;
  expect_params_error(p, 64, "n_sink + window", "65 exceeds the maximum "
                                                "capacity 64");
  p = ok;
  p.n_sink = UINT32_MAX;
  expect_params_error(p, 64, "4294967355", "64");
  p = ok;
  p.rope_scale = 0.0f;
  expect_params_error(p, 64, "rope_scale 0", NULL);
  p.rope_scale = -1.0f;
  expect_params_error(p, 64, "rope_scale -1", NULL);
  p.rope_scale = NAN;
  expect_params_error(p, 64, "rope_scale", "finite");
  p.rope_scale = INFINITY;
  expect_params_error(p, 64, "rope_scale inf", NULL);
  p = ok;
  p.policy = 7;
  expect_params_error(p, 64, "policy 7", NULL);

  struct sk_kv_params d = {.policy = SK_POLICY_DENSE, .capacity = 512,
                           .rope_scale = 2.0f};
  assert_int_equal(sk_kv_params_check(&d, 512, &err), 0);
  assert_int_equal(sk_kv_params_capacity(&d), 512);
  d.capacity = 0;
  expect_params_error(d, 512, "capacity 0", ">= 1");
  d.capacity = 513;
  expect_params_error(d, 512, "capacity 513", "512");
  /* the hard ceiling holds even if the caller's limit is higher */
  d.capacity = SK_KV_MAX_CAPACITY + 1;
  expect_params_error(d, UINT32_MAX, "capacity 1048577", "1048576");

  /* init refuses a short or misaligned block */
  size_t size = sk_kv_size(small_shape, 512);
  void *mem = aligned_alloc(64, size + 64);
  assert_non_null(mem);
  struct sk_kv kv;
  d.capacity = 512;
  assert_int_equal(sk_kv_init(&kv, mem, size - 1, small_shape, &d, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "smaller"));
  assert_int_equal(
      sk_kv_init(&kv, (char *)mem + 8, size, small_shape, &d, &err),
      -SK_ERR_BAD_REQUEST);
  assert_int_equal(sk_kv_init(&kv, mem, size, small_shape, &d, &err), 0);
  assert_true(kv.hdr->rope_scale == 2.0f);
  free(mem);
}

static void test_policy_names(void **state) {
  (void)state;
  struct sk_error err = {0};
  uint32_t pol = 99;
  assert_string_equal(sk_policy_name(SK_POLICY_DENSE), "dense");
  assert_string_equal(sk_policy_name(SK_POLICY_STREAMING), "streaming");
  assert_string_equal(sk_policy_name(SK_POLICY_WINDOW), "window");
  assert_string_equal(sk_policy_name(SK_POLICY_H2O), "h2o");
  assert_string_equal(sk_policy_name(SK_POLICY_SINK_H2O), "sink_h2o");
  assert_null(sk_policy_name(5));
  assert_int_equal(sk_policy_parse("sink_h2o", 8, &pol, &err), 0);
  assert_int_equal(pol, SK_POLICY_SINK_H2O);
  assert_int_equal(sk_policy_parse("h2o", 3, &pol, &err), 0);
  assert_int_equal(pol, SK_POLICY_H2O);
  assert_int_equal(sk_policy_parse("window", 6, &pol, &err), 0);
  assert_int_equal(pol, SK_POLICY_WINDOW);
  assert_int_equal(sk_policy_parse("streaming", 9, &pol, &err), 0);
  assert_int_equal(pol, SK_POLICY_STREAMING);
  assert_int_equal(sk_policy_parse("dense", 5, &pol, &err), 0);
  assert_int_equal(pol, SK_POLICY_DENSE);
  assert_int_equal(sk_policy_parse("densely", 5, &pol, &err), 0); /* len */
  assert_int_equal(sk_policy_parse("stream", 6, &pol, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "\"stream\""));
  assert_int_equal(sk_policy_parse("", 0, &pol, &err), -SK_ERR_BAD_REQUEST);
}

static void test_evict_log(void **state) {
  (void)state;
  struct sk_evict_log log;
  sk_evict_log_reset(&log);
  uint64_t idx[] = {0, 1, 2, 5, 6, 9};
  for (size_t i = 0; i < 6; i++) sk_evict_log_add(&log, idx[i]);
  assert_int_equal(log.n_ranges, 3);
  assert_int_equal(log.first[0], 0);
  assert_int_equal(log.last[0], 2);
  assert_int_equal(log.first[1], 5);
  assert_int_equal(log.last[1], 6);
  assert_int_equal(log.first[2], 9);
  assert_int_equal(log.last[2], 9);
  sk_evict_log_reset(&log);
  for (uint64_t i = 0; i < 2 * SK_EVICT_LOG_MAX_RANGES; i++)
    sk_evict_log_add(&log, 10 * i);
  assert_int_equal(log.n_ranges, SK_EVICT_LOG_MAX_RANGES);
  assert_true(log.truncated);
  assert_int_equal(log.n_evicted, 2 * SK_EVICT_LOG_MAX_RANGES);
  assert_int_equal(log.first[SK_EVICT_LOG_MAX_RANGES - 1],
                   10 * (SK_EVICT_LOG_MAX_RANGES - 1));
}

/* The window policy is streaming without sinks: after 40 single tokens
 * into a window of 12 the newest 12 stay; a 30-token append into the full
 * cache (in steps of at most the window) evicts 30 and reports them. */
static void test_window_policy(void **state) {
  (void)state;
  struct sk_kv *kv = new_kv_p(small_shape, (struct sk_kv_params){
                                               .policy = SK_POLICY_WINDOW,
                                               .window = 12});
  assert_int_equal(kv->hdr->capacity, 12);
  assert_int_equal(kv->hdr->n_sink, 0);
  assert_int_equal(sk_kv_max_room(kv), 12);
  struct sk_evict_log log;
  sk_evict_log_reset(&log);
  for (int i = 0; i < 40; i++) append(kv, 1, &log);
  uint64_t want[12];
  for (uint32_t i = 0; i < 12; i++) want[i] = 28 + i;
  assert_resident(kv, want, 12);
  assert_int_equal(log.n_evicted, 28);
  assert_int_equal(log.n_ranges, 1);
  assert_int_equal(log.first[0], 0);
  assert_int_equal(log.last[0], 27);
  sk_evict_log_reset(&log);
  append(kv, 12, &log);
  append(kv, 12, &log);
  append(kv, 6, &log);
  for (uint32_t i = 0; i < 12; i++) want[i] = 58 + i;
  assert_resident(kv, want, 12);
  assert_int_equal(log.n_evicted, 30);
  assert_int_equal(log.first[0], 28);
  assert_int_equal(log.last[0], 57);
  sk_kv_free(kv);
}

/* One token appended with a given score (what the forward pass would
 * have accumulated for it). */
static void append_scored(struct sk_kv *kv, float score,
                          struct sk_evict_log *log) {
  append(kv, 1, log);
  kv->score[sk_kv_slot(kv, kv->hdr->n_resident - 1)] = score;
}

/* H2O by hand: heavy 2 + recent 2. Token i gets score sc[i]. Once full,
 * each new token protects the newest resident (recent - 1 = 1) and evicts
 * the smallest score among the others; equal scores evict the older. */
static void test_h2o_scripted(void **state) {
  (void)state;
  static const float sc[12] = {5, 1, 3, 1, 2, 0, 9, 3, 4, 5, 4, 1};
  /* Resident stream indices after appending token 4, 5, ..., 11. */
  static const uint64_t want[8][4] = {
      {0, 2, 3, 4},  /* 4: evicts 1 (score 1 among 5, 1, 3) */
      {0, 2, 4, 5},  /* 5: evicts 3 (1 among 5, 3, 1) */
      {0, 2, 5, 6},  /* 6: evicts 4 (2 among 5, 3, 2) */
      {0, 2, 6, 7},  /* 7: evicts 5 (0) */
      {0, 6, 7, 8},  /* 8: evicts 2 (3 among 5, 3, 9) */
      {0, 6, 8, 9},  /* 9: evicts 7 (3 among 5, 9, 3) */
      {0, 6, 9, 10}, /* 10: evicts 8 (4 among 5, 9, 4) */
      {6, 9, 10, 11} /* 11: 0 and 9 tie at 5: the older, 0, leaves */
  };
  for (int run = 0; run < 2; run++) { /* same input, same sets */
    struct sk_kv *kv = new_kv_p(small_shape, (struct sk_kv_params){
                                                 .policy = SK_POLICY_H2O,
                                                 .heavy = 2, .recent = 2});
    assert_int_equal(kv->hdr->capacity, 4);
    assert_int_equal(sk_kv_max_room(kv), 4);
    struct sk_evict_log log;
    sk_evict_log_reset(&log);
    for (int i = 0; i < 4; i++) append_scored(kv, sc[i], &log);
    for (int i = 4; i < 12; i++) {
      append_scored(kv, sc[i], &log);
      assert_resident(kv, want[i - 4], 4);
    }
    assert_int_equal(kv->hdr->n_evicted, 8);
    /* evicted 1, 3, 4, 5, 2, 7, 8, 0 */
    assert_int_equal(log.n_evicted, 8);
    assert_int_equal(log.n_ranges, 5);
    static const uint64_t first[5] = {1, 3, 2, 7, 0}, last[5] = {1, 5, 2, 8, 0};
    for (int r = 0; r < 5; r++) {
      assert_int_equal(log.first[r], first[r]);
      assert_int_equal(log.last[r], last[r]);
    }
    assert_permutation(kv);

    /* Room for 3 at once: recent (2) < 3, so no resident is protected;
     * the 3 smallest scores leave: 9 (5), 10 (4) and 11 (1) -- 6 (9)
     * stays. */
    sk_evict_log_reset(&log);
    struct sk_error err = {0};
    assert_int_equal(sk_kv_make_room(kv, 3, &log, &err), 0);
    uint64_t left[1] = {6};
    assert_resident(kv, left, 1);
    assert_int_equal(log.n_evicted, 3);
    assert_int_equal(log.n_ranges, 1);
    assert_int_equal(log.first[0], 9);
    assert_int_equal(log.last[0], 11);
    assert_permutation(kv);
    sk_kv_free(kv);
  }
}

/* sink_h2o: the sink never leaves however low its score; H2O on the
 * rest. n_sink 1, heavy 2, recent 2. */
static void test_sink_h2o_scripted(void **state) {
  (void)state;
  static const float sc[10] = {0, 1, 3, 1, 2, 0, 9, 3, 4, 5};
  struct sk_kv *kv = new_kv_p(small_shape, (struct sk_kv_params){
                                               .policy = SK_POLICY_SINK_H2O,
                                               .n_sink = 1, .heavy = 2,
                                               .recent = 2});
  assert_int_equal(kv->hdr->capacity, 5);
  assert_int_equal(sk_kv_max_room(kv), 4);
  struct sk_evict_log log;
  sk_evict_log_reset(&log);
  for (int i = 0; i < 10; i++) append_scored(kv, sc[i], &log);
  /* Each step protects the sink and the newest resident. 5: candidates
   * 1 (1), 2 (3), 3 (1): 1 and 3 tie, the older (1) goes; 6: 2 (3),
   * 3 (1), 4 (2): evicts 3; 7: 2, 4, 5 (0): evicts 5; 8: 2 (3), 4 (2),
   * 6 (9): evicts 4; 9: 2 (3), 6 (9), 7 (3): the older of the tie, 2. */
  uint64_t want[5] = {0, 6, 7, 8, 9};
  assert_resident(kv, want, 5);
  assert_int_equal(log.n_evicted, 5);
  struct sk_error err = {0};
  assert_int_equal(sk_kv_make_room(kv, 5, &log, &err), -SK_ERR_BAD_REQUEST);
  assert_int_equal(sk_kv_make_room(kv, 4, &log, &err), 0);
  uint64_t sink_only[1] = {0};
  assert_resident(kv, sink_only, 1);
  sk_kv_free(kv);
}

/* A long random run of every evicting policy against a brute-force model
 * of the rules over stream indices. */
static void test_policies_against_model(void **state) {
  (void)state;
  static const struct sk_kv_params ps[] = {
      {.policy = SK_POLICY_STREAMING, .n_sink = 3, .window = 9},
      {.policy = SK_POLICY_WINDOW, .window = 10},
      {.policy = SK_POLICY_H2O, .heavy = 5, .recent = 4},
      {.policy = SK_POLICY_SINK_H2O, .n_sink = 2, .heavy = 4, .recent = 3},
  };
  for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
    struct sk_kv *kv = new_kv_p(small_shape, ps[pi]);
    const uint32_t C = kv->hdr->capacity, S = kv->hdr->n_sink;
    uint64_t res[16];  /* resident stream indices, in order */
    float score[4096]; /* by stream index */
    uint32_t nr = 0;
    unsigned r = 777u + (unsigned)pi;
    uint64_t seen = 0;
    for (int step = 0; step < 600; step++) {
      r = r * 1103515245u + 12345u;
      uint32_t n = 1 + (r >> 16) % (C - S);
      /* model: make room */
      uint32_t need = nr + n > C ? nr + n - C : 0;
      if (need && sk_policy_scores(ps[pi].policy)) {
        uint32_t protect = kv->hdr->recent > n ? kv->hdr->recent - n : 0;
        if (protect > nr - S) protect = nr - S;
        bool gone[16] = {false};
        for (uint32_t e = 0; e < need; e++) {
          uint32_t best = UINT32_MAX;
          for (uint32_t q = S; q < nr - protect; q++)
            if (!gone[q] && (best == UINT32_MAX || score[res[q]] < score[res[best]]))
              best = q;
          assert_true(best != UINT32_MAX);
          gone[best] = true;
        }
        uint32_t w = 0;
        for (uint32_t q = 0; q < nr; q++)
          if (!gone[q]) res[w++] = res[q];
        nr = w;
      } else if (need) {
        memmove(res + S, res + S + need, (nr - S - need) * sizeof res[0]);
        nr -= need;
      }
      /* kv */
      struct sk_error err = {0};
      if (sk_kv_make_room(kv, n, NULL, &err) < 0)
        fail_msg("make_room(%u): %s", n, err.message);
      int32_t tok[16];
      for (uint32_t i = 0; i < n; i++) {
        uint64_t index = seen + i;
        tok[i] = (int32_t)(1000 + index);
        uint32_t slot = sk_kv_slot(kv, kv->hdr->n_resident + i);
        for (uint32_t l = 0; l < kv->hdr->n_layer; l++)
          for (uint32_t d = 0; d < kv->hdr->kv_dim; d++) {
            sk_kv_k(kv, l, slot)[d] = (float)(index + l);
            sk_kv_v(kv, l, slot)[d] = -(float)(index + l);
          }
        r = r * 1103515245u + 12345u;
        score[index] = (float)((r >> 16) % 7); /* many ties */
        kv->score[slot] = score[index];
        res[nr++] = index;
      }
      sk_kv_commit(kv, tok, n);
      seen += n;
      assert_permutation(kv);
      assert_resident(kv, res, nr);
      /* every resident score is still its token's */
      for (uint32_t q = 0; q < nr; q++)
        assert_true(kv->score[sk_kv_slot(kv, q)] == score[res[q]]);
      assert_true(seen < 4096 - 16);
    }
    sk_kv_free(kv);
  }
}

static void test_params_policies(void **state) {
  (void)state;
  struct sk_error err = {0};
  struct sk_kv_params h = {.policy = SK_POLICY_H2O, .heavy = 16, .recent = 16,
                           .rope_scale = 1.0f};
  assert_int_equal(sk_kv_params_check(&h, 64, &err), 0);
  assert_int_equal(sk_kv_params_capacity(&h), 32);
  struct sk_kv_params p = h;
  p.recent = 0;
  expect_params_error(p, 64, "recent 0", ">= 1");
  p = h;
  p.heavy = 0;
  expect_params_error(p, 64, "heavy 0", "window");
  p = h;
  p.heavy = 300;
  p.recent = 300;
  expect_params_error(p, 512, "heavy + recent = 300 + 300 = 600",
                      "maximum capacity 512");
  struct sk_kv_params sh = {.policy = SK_POLICY_SINK_H2O, .n_sink = 4,
                            .heavy = 12, .recent = 16, .rope_scale = 1.0f};
  assert_int_equal(sk_kv_params_check(&sh, 64, &err), 0);
  assert_int_equal(sk_kv_params_capacity(&sh), 32);
  p = sh;
  p.n_sink = 40;
  expect_params_error(p, 64, "n_sink + heavy + recent = 40 + 12 + 16 = 68",
                      "64");
  struct sk_kv_params w = {.policy = SK_POLICY_WINDOW, .window = 0,
                           .rope_scale = 1.0f};
  expect_params_error(w, 64, "window 0", ">= 1");
  w.window = 65;
  expect_params_error(w, 64, "window 65", "maximum capacity 64");

  /* pins */
  struct sk_kv_params s = {.policy = SK_POLICY_STREAMING, .n_sink = 300,
                           .window = 32, .n_pin = 300, .rope_scale = 1.0f};
  assert_int_equal(sk_kv_params_check(&s, 512, &err), 0);
  assert_int_equal(sk_kv_params_capacity(&s), 332);
  s.n_sink = 4;
  expect_params_error(s, 512, "n_sink 4 differs from the 300 pinned", NULL);
  s.n_sink = 300;
  expect_params_error(s, 320, "n_sink + window = 300 + 32 = 332",
                      "maximum capacity 320");
  p = h;
  p.n_pin = 3;
  expect_params_error(p, 64, "h2o has no sink region", NULL);
  struct sk_kv_params d = {.policy = SK_POLICY_DENSE, .capacity = 16,
                           .n_pin = 16, .rope_scale = 1.0f};
  expect_params_error(d, 64, "pin of 16 tokens", "capacity 16");
  d.n_pin = 15;
  assert_int_equal(sk_kv_params_check(&d, 64, &err), 0);

  /* rope_scale and the model's context */
  d.n_pin = 0;
  d.rope_scale = 65.0f;
  expect_params_error(d, 64, "rope_scale 65", "<= 64");
  d.capacity = 4096;
  d.rope_scale = 2.0f;
  assert_int_equal(sk_kv_params_check_context(&d, 2048, &err), 0);
  d.capacity = 4097;
  assert_int_equal(sk_kv_params_check_context(&d, 2048, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "capacity 4097 exceeds the model's "
                                      "context: n_ctx_train 2048 x "
                                      "rope_scale 2 = 4096 positions"));
  assert_int_equal(sk_kv_params_check_context(&h, 31, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "heavy + recent = 16 + 16 = 32"));
}

/* A pinned prefix of a streaming cache is its sink region: it stays, token
 * for token, however many tokens stream past. */
static void test_pin_streaming(void **state) {
  (void)state;
  struct sk_kv *kv = new_kv_p(small_shape, (struct sk_kv_params){
                                               .policy = SK_POLICY_STREAMING,
                                               .n_sink = 30, .window = 5,
                                               .n_pin = 30});
  assert_int_equal(kv->hdr->n_pin, 30);
  assert_int_equal(sk_kv_max_room(kv), 5);
  append(kv, 30, NULL);
  for (int i = 0; i < 1005; i++) append(kv, 1, NULL);
  uint64_t want[35];
  for (uint32_t i = 0; i < 30; i++) want[i] = i;
  for (uint32_t i = 0; i < 5; i++) want[30 + i] = 1030 + i;
  assert_resident(kv, want, 35);
  assert_int_equal(kv->hdr->n_evicted, 1000);
  sk_kv_free(kv);
}

/* attach: a valid block round-trips; each corruption is named. */
static void expect_attach_error(void *mem, size_t size, const char *needle) {
  struct sk_kv kv;
  struct sk_error err = {0};
  int rc = sk_kv_attach(&kv, mem, size, &err);
  if (rc != -SK_ERR_BAD_REQUEST)
    fail_msg("attach accepted a block corrupted at \"%s\" (rc %d)", needle,
             rc);
  if (!strstr(err.message, needle))
    fail_msg("message \"%s\" lacks \"%s\"", err.message, needle);
}

static void test_attach(void **state) {
  (void)state;
  struct sk_kv *kv = new_kv(small_shape, SK_POLICY_STREAMING, 2, 6, 0);
  for (int i = 0; i < 11; i++) append(kv, 1, NULL);
  size_t size = (size_t)kv->hdr->size;
  void *mem = aligned_alloc(64, size);
  assert_non_null(mem);
  memcpy(mem, kv->hdr, size);

  struct sk_kv view;
  struct sk_error err = {0};
  assert_int_equal(sk_kv_attach(&view, mem, size, &err), 0);
  assert_true((void *)view.hdr == mem);
  uint64_t want[8] = {0, 1, 5, 6, 7, 8, 9, 10};
  assert_resident(&view, want, 8);
  /* a view continues to work like the original */
  append(&view, 2, NULL);
  uint64_t want2[8] = {0, 1, 7, 8, 9, 10, 11, 12};
  assert_resident(&view, want2, 8);
  memcpy(mem, kv->hdr, size);

  struct sk_kv_header *h = mem;
  struct sk_kv_header saved = *h;
#define CORRUPT(stmt, needle)                     \
  do {                                            \
    stmt;                                         \
    expect_attach_error(mem, size, needle);       \
    *h = saved;                                   \
  } while (0)
  CORRUPT(h->magic ^= 1, "magic");
  CORRUPT(h->layout_version = 1, "layout_version");
  CORRUPT(h->n_slots = h->capacity, "n_slots is 8, expected 24");
  CORRUPT(h->off_score = h->off_order, "off_score");
  CORRUPT(h->n_pin = 3, "pinned");
  CORRUPT(h->heavy = 2, "heavy");
  CORRUPT(h->n_resident = h->capacity + 1, "n_resident 9 exceeds capacity 8");
  CORRUPT(h->n_seen = 3, "n_seen");
  CORRUPT(h->off_k = h->size, "off_k");
  CORRUPT(h->off_token = 8, "off_token");
  CORRUPT(h->size = h->size + 64, "size");
  CORRUPT(h->capacity = 0, "capacity 0");
  CORRUPT(h->capacity = 9, "capacity 9");
  CORRUPT(h->policy = 5, "policy 5");
  CORRUPT(h->window = 0, "window");
  CORRUPT(h->rope_scale = NAN, "rope_scale");
  CORRUPT(h->kv_dim = 0, "kv_dim");
#undef CORRUPT
  expect_attach_error(mem, size - 64, "exceeds the");
  expect_attach_error(mem, 16, "smaller than its header");

  uint32_t *order = (uint32_t *)(void *)((char *)mem + h->off_order);
  uint32_t o3 = order[3];
  order[3] = order[4];
  expect_attach_error(mem, size, "order[4]");
  order[3] = 100;
  expect_attach_error(mem, size, "order[3] = 100 is out of range");
  order[3] = o3;
  assert_int_equal(sk_kv_attach(&view, mem, size, &err), 0);
  free(mem);
  sk_kv_free(kv);
}


/* The FIFO free list: a step that evicts at most SK_KV_SPARE_SLOTS tokens
 * writes only into slots that were free before it, so the K/V of every
 * token resident before the step stay intact until its commit. Checked
 * for streaming with and without sinks, one-token steps (what scheduler.c
 * does once full) and steps that fit the free slots. */
static void test_fifo_free_slots(void **state) {
  (void)state;
  const uint32_t sinks[2] = {4, 0};
  for (int v = 0; v < 2; v++) {
    struct sk_kv *kv = new_kv(small_shape, SK_POLICY_STREAMING, sinks[v], 9, 0);
    uint32_t ns = kv->hdr->n_slots;
    unsigned r = 777u + (unsigned)v;
    for (int step = 0; step < 300; step++) {
      char was_resident[64] = {0};
      assert_true(ns <= 64);
      for (uint32_t p = 0; p < kv->hdr->n_resident; p++)
        was_resident[sk_kv_slot(kv, p)] = 1;
      r = r * 1103515245u + 12345u;
      uint32_t free_slots = sk_kv_free_slots(kv);
      if (free_slots > sk_kv_max_room(kv)) free_slots = sk_kv_max_room(kv);
      uint32_t n = free_slots ? 1 + (r >> 16) % free_slots : 1;
      struct sk_error err = {0};
      uint64_t ev0 = kv->hdr->n_evicted;
      assert_int_equal(sk_kv_make_room(kv, n, NULL, &err), 0);
      assert_true(kv->hdr->n_evicted - ev0 <= SK_KV_SPARE_SLOTS);
      for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = sk_kv_slot(kv, kv->hdr->n_resident + i);
        if (was_resident[slot])
          fail_msg("step %d writes slot %u, resident before the step", step, slot);
      }
      /* undo the room-making check's state: append for real */
      int32_t tok[16];
      for (uint32_t i = 0; i < n; i++) tok[i] = (int32_t)(1000 + kv->hdr->n_seen + i);
      for (uint32_t i = 0; i < n; i++) {
        uint32_t slot = sk_kv_slot(kv, kv->hdr->n_resident + i);
        for (uint32_t l = 0; l < kv->hdr->n_layer; l++)
          for (uint32_t d = 0; d < kv->hdr->kv_dim; d++) {
            sk_kv_k(kv, l, slot)[d] = (float)(kv->hdr->n_seen + i + l);
            sk_kv_v(kv, l, slot)[d] = -(float)(kv->hdr->n_seen + i + l);
          }
      }
      sk_kv_commit(kv, tok, n);
      assert_permutation(kv);
    }
    uint64_t seen = kv->hdr->n_seen;
    uint32_t s0 = sinks[v];
    uint64_t want[13];
    for (uint32_t p = 0; p < s0; p++) want[p] = p;
    for (uint32_t p = 0; p < 9; p++) want[s0 + p] = seen - 9 + p;
    assert_resident(kv, want, s0 + 9);
    sk_kv_free(kv);
  }
}

/* A block split in two parts (meta and data apart, as the shm store keeps
 * them) works like a contiguous one; rebinding the meta to a byte copy
 * gives the same view. */
static void test_split_views(void **state) {
  (void)state;
  struct sk_kv_params p = {.policy = SK_POLICY_STREAMING, .n_sink = 2,
                           .window = 6, .rope_scale = 1.0f};
  size_t meta_size = 0, data_size = 0;
  assert_true(sk_kv_part_sizes(small_shape, 8, &meta_size, &data_size));
  void *meta = aligned_alloc(64, meta_size);
  void *meta2 = aligned_alloc(64, meta_size);
  void *data = aligned_alloc(64, data_size);
  assert_non_null(meta);
  assert_non_null(meta2);
  assert_non_null(data);
  struct sk_kv kv;
  struct sk_error err = {0};
  assert_int_equal(sk_kv_init_split(&kv, meta, meta_size - 64, data, data_size,
                                    small_shape, &p, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_int_equal(sk_kv_init_split(&kv, meta, meta_size, data, data_size,
                                    small_shape, &p, &err), 0);
  assert_true((void *)kv.hdr == meta);
  assert_true((void *)kv.k == data);
  for (int i = 0; i < 11; i++) append(&kv, 1, NULL);
  uint64_t want[8] = {0, 1, 5, 6, 7, 8, 9, 10};
  assert_resident(&kv, want, 8);

  memcpy(meta2, meta, meta_size);
  sk_kv_rebind_meta(&kv, meta2);
  assert_true((void *)kv.hdr == meta2);
  assert_resident(&kv, want, 8);
  append(&kv, 1, NULL);
  uint64_t want2[8] = {0, 1, 6, 7, 8, 9, 10, 11};
  assert_resident(&kv, want2, 8);

  struct sk_kv view;
  assert_int_equal(sk_kv_attach_split(&view, meta, meta_size, data, data_size, &err), 0);
  assert_resident(&view, want, 8); /* the first copy still shows the old step */
  assert_int_equal(sk_kv_attach_split(&view, meta2, meta_size, data, data_size - 64, &err),
                   -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "exceeds the"));
  free(meta);
  free(meta2);
  free(data);
}

/* ---- with the real model -------------------------------------------- */
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_streaming),
      cmocka_unit_test(test_window_random_steps),
      cmocka_unit_test(test_dense),
      cmocka_unit_test(test_size),
      cmocka_unit_test(test_params),
      cmocka_unit_test(test_policy_names),
      cmocka_unit_test(test_evict_log),
      cmocka_unit_test(test_attach),
      cmocka_unit_test(test_fifo_free_slots),
      cmocka_unit_test(test_split_views),
      cmocka_unit_test(test_window_policy),
      cmocka_unit_test(test_h2o_scripted),
      cmocka_unit_test(test_sink_h2o_scripted),
      cmocka_unit_test(test_policies_against_model),
      cmocka_unit_test(test_params_policies),
      cmocka_unit_test(test_pin_streaming),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
