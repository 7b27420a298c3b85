/* The store tests' model, objects and scans (teststore.h). */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "model/gguf.h"
#include "session/kvcache.h"
#include "model/model.h"
#include "session/store.h"
#include "testutil.h"
#include "teststore.h"
struct fixture fx;

int setup(void **state) {
  (void)state;
  struct sk_error err = {0};
  if (sk_gguf_open(sk_test_model_path(), &fx.g, &err) < 0 ||
      sk_model_load(fx.g, &fx.m, &err) < 0 || sk_scratch_new(fx.m, 16, 64, &fx.scr, &err) < 0) {
    fprintf(stderr, "setup: %s\n", err.message);
    return -1;
  }
  fx.n_vocab = sk_model_config(fx.m)->n_vocab;
  fx.cfg.shape = sk_model_kv_shape(fx.m);
  fx.cfg.n_vocab = fx.n_vocab;
  sk_store_fingerprint(fx.g, fx.cfg.model_fp);
  return 0;
}

int teardown(void **state) {
  (void)state;
  sk_scratch_free(fx.scr);
  sk_model_free(fx.m);
  sk_gguf_close(fx.g);
  return 0;
}

/* A fresh state directory (tmpfs when /dev/shm exists). */
char *new_dir(void) {
  char *p = strdup("/dev/shm/sinkd-store-test.XXXXXX");
  assert_non_null(p);
  if (!mkdtemp(p)) {
    free(p);
    return sk_test_tmpdir();
  }
  return p;
}

struct sk_store *open_store(const char *dir) {
  struct sk_store_config c = fx.cfg;
  c.dir = dir;
  struct sk_store *st = NULL;
  struct sk_error err = {0};
  bool tmpfs;
  if (sk_store_open(&c, &st, &tmpfs, &err) < 0) fail_msg("sk_store_open: %s", err.message);
  return st;
}

const struct sk_kv_params streaming16 = {
    .policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 12, .rope_scale = 1.0f};

struct sk_store_obj *create(struct sk_store *st, uint64_t id,
                            const struct sk_kv_params *p) {
  struct sk_sampler_params sp = {.temperature = (float)SK_GENERATE_DEFAULT_TEMPERATURE,
                                 .top_k = SK_GENERATE_DEFAULT_TOP_K,
                                 .top_p = (float)SK_GENERATE_DEFAULT_TOP_P,
                                 .seed = id};
  struct sk_sampler_state ss;
  sk_sampler_state_seed(&ss, &sp);
  struct sk_store_obj *obj = NULL;
  struct sk_error err = {0};
  if (sk_store_create(st, id, 1000, 0, p, &ss, &obj, &err) < 0)
    fail_msg("sk_store_create: %s", err.message);
  return obj;
}

/* Token of stream index i in these tests. */
int32_t tok_at(uint64_t i) { return (int32_t)(3 + (i * 37) % 400); }

/* What scheduler.c does for a chunk, on a plain cache or the store's view. */
void run_chunk(struct sk_kv *kv, float *logits, uint32_t n) {
  struct sk_error err = {0};
  if (sk_kv_free_slots(kv) == 0) {
    assert_int_equal(sk_kv_make_room(kv, 1, NULL, &err), 0);
    n = 1;
  }
  if (n > sk_kv_free_slots(kv)) n = sk_kv_free_slots(kv);
  int32_t toks[16];
  assert_true(n <= 16);
  for (uint32_t i = 0; i < n; i++) toks[i] = tok_at(kv->hdr->n_seen + i);
  if (sk_model_forward(fx.m, fx.scr, kv, toks, n, logits, false, &err) < 0)
    fail_msg("forward: %s", err.message);
}

/* One committed step on obj. */
void step(struct sk_store_obj *obj, uint32_t n) {
  sk_store_begin(obj);
  run_chunk(&obj->kv, obj->logits, n);
  obj->meta->flags |= SK_STORE_HAS_LOGITS;
  sk_store_commit(obj);
}

/* The two caches hold the same tokens at the same positions with the same
 * keys and values, and the same counters. */
void assert_same_cache(const struct sk_kv *a, const struct sk_kv *b) {
  assert_int_equal(a->hdr->n_resident, b->hdr->n_resident);
  assert_int_equal(a->hdr->n_seen, b->hdr->n_seen);
  assert_int_equal(a->hdr->n_evicted, b->hdr->n_evicted);
  const size_t row = sk_kv_row_bytes(a);
  for (uint32_t p = 0; p < a->hdr->n_resident; p++) {
    uint32_t sa = sk_kv_slot(a, p), sb = sk_kv_slot(b, p);
    assert_int_equal(a->token[sa], b->token[sb]);
    assert_int_equal(a->index[sa], b->index[sb]);
    for (uint32_t l = 0; l < a->hdr->n_layer; l++) {
      assert_memory_equal(sk_kv_k(a, l, sa), sk_kv_k(b, l, sb), row);
      assert_memory_equal(sk_kv_v(a, l, sa), sk_kv_v(b, l, sb), row);
    }
  }
}

struct snap take_snap(const struct sk_store_obj *obj) {
  struct snap s;
  struct sk_kv_params p = {.policy = obj->kv.hdr->policy, .n_sink = obj->kv.hdr->n_sink,
                           .window = obj->kv.hdr->window, .capacity = obj->kv.hdr->capacity,
                           .rope_scale = obj->kv.hdr->rope_scale};
  struct sk_error err = {0};
  struct sk_kv_shape shape = fx.cfg.shape;
  shape.kv_type = obj->kv.hdr->kv_type;
  assert_int_equal(sk_kv_new(shape, &p, &s.kv, &err), 0);
  size_t meta = 0, data = 0;
  assert_true(sk_kv_part_sizes(shape, obj->kv.hdr->capacity, &meta, &data));
  memcpy(s.kv->hdr, obj->kv.hdr, meta);
  memcpy(s.kv->k, obj->kv.k, data);
  s.logits = malloc(fx.n_vocab * sizeof(float));
  assert_non_null(s.logits);
  memcpy(s.logits, obj->logits, fx.n_vocab * sizeof(float));
  s.commit = sk_store_commit_count(obj);
  memcpy(s.rng, obj->meta->rng, sizeof s.rng);
  return s;
}

void assert_snap(const struct snap *s, const struct sk_store_obj *obj) {
  assert_same_cache(s->kv, &obj->kv);
  assert_memory_equal(s->logits, obj->logits, fx.n_vocab * sizeof(float));
  assert_int_equal(s->commit, sk_store_commit_count(obj));
  assert_memory_equal(s->rng, obj->meta->rng, sizeof s->rng);
}

void free_snap(struct snap *s) {
  sk_kv_free(s->kv);
  free(s->logits);
}

/* ---- scan results ---- */
static void on_adopt(void *user, struct sk_store_obj *obj) {
  struct scan *s = user;
  assert_true(s->n_adopted < MAX_SEEN);
  s->adopted[s->n_adopted++] = obj;
}

static void on_skip(void *user, const char *name, enum sk_store_skip what, const char *dest,
                    const char *reason) {
  (void)dest;
  struct scan *s = user;
  assert_true(s->n_skipped < MAX_SEEN);
  snprintf(s->name[s->n_skipped], 64, "%s", name);
  snprintf(s->reason[s->n_skipped], 256, "%s", reason);
  s->what[s->n_skipped++] = what;
}

void do_scan(struct sk_store *st, struct scan *s, uint64_t *ret_max) {
  memset(s, 0, sizeof *s);
  struct sk_store_scan_cb cb = {.adopt = on_adopt, .skip = on_skip, .user = s};
  struct sk_error err = {0};
  if (sk_store_scan(st, &cb, ret_max, &err) < 0) fail_msg("scan: %s", err.message);
}

const char *skip_reason(const struct scan *s, const char *name) {
  for (int i = 0; i < s->n_skipped; i++)
    if (strcmp(s->name[i], name) == 0) return s->reason[i];
  return NULL;
}

void free_adopted(struct scan *s) {
  for (int i = 0; i < s->n_adopted; i++) sk_store_obj_free(s->adopted[i]);
}

void rm_rf(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}
struct sk_store_obj *reopen(const char *dir, struct sk_store **st, struct sk_store_obj *obj) {
  sk_store_obj_free(obj);
  sk_store_close(*st);
  *st = open_store(dir);
  struct scan s;
  do_scan(*st, &s, NULL);
  assert_int_equal(s.n_adopted, 1);
  assert_int_equal(s.n_skipped, 0);
  return s.adopted[0];
}
