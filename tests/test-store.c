/* The shared-memory store (store.h) with the real model: a session driven
 * through the store computes bit for bit what a plain cache computes;
 * committed steps survive, an uncommitted step leaves the previous
 * commit; every kind of bad object is set aside with its reason while
 * good ones are adopted; fork and export/import copy a session exactly;
 * a flipped byte or a truncation of an image is refused; sizes are exact;
 * a state directory has one daemon at a time. */
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

struct fixture {
  struct sk_gguf *g;
  struct sk_model *m;
  struct sk_scratch *scr;
  uint32_t n_vocab;
  struct sk_store_config cfg;
};
static struct fixture fx;

static int setup(void **state) {
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

static int teardown(void **state) {
  (void)state;
  sk_scratch_free(fx.scr);
  sk_model_free(fx.m);
  sk_gguf_close(fx.g);
  return 0;
}

/* A fresh state directory (tmpfs when /dev/shm exists). */
static char *new_dir(void) {
  char *p = strdup("/dev/shm/sinkd-store-test.XXXXXX");
  assert_non_null(p);
  if (!mkdtemp(p)) {
    free(p);
    return sk_test_tmpdir();
  }
  return p;
}

static struct sk_store *open_store(const char *dir) {
  struct sk_store_config c = fx.cfg;
  c.dir = dir;
  struct sk_store *st = NULL;
  struct sk_error err = {0};
  bool tmpfs;
  if (sk_store_open(&c, &st, &tmpfs, &err) < 0) fail_msg("sk_store_open: %s", err.message);
  return st;
}

static const struct sk_kv_params streaming16 = {
    .policy = SK_POLICY_STREAMING, .n_sink = 4, .window = 12, .rope_scale = 1.0f};

static struct sk_store_obj *create(struct sk_store *st, uint64_t id,
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
static int32_t tok_at(uint64_t i) { return (int32_t)(3 + (i * 37) % 400); }

/* What scheduler.c does for a chunk, on a plain cache or the store's view. */
static void run_chunk(struct sk_kv *kv, float *logits, uint32_t n) {
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
static void step(struct sk_store_obj *obj, uint32_t n) {
  sk_store_begin(obj);
  run_chunk(&obj->kv, obj->logits, n);
  obj->meta->flags |= SK_STORE_HAS_LOGITS;
  sk_store_commit(obj);
}

/* The two caches hold the same tokens at the same positions with the same
 * keys and values, and the same counters. */
static void assert_same_cache(const struct sk_kv *a, const struct sk_kv *b) {
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

/* A deep copy of an object's live state, to compare later. */
struct snap {
  struct sk_kv *kv; /* malloc'd block with the same contents */
  float *logits;
  uint64_t commit;
  uint64_t rng[4];
};

static struct snap take_snap(const struct sk_store_obj *obj) {
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

static void assert_snap(const struct snap *s, const struct sk_store_obj *obj) {
  assert_same_cache(s->kv, &obj->kv);
  assert_memory_equal(s->logits, obj->logits, fx.n_vocab * sizeof(float));
  assert_int_equal(s->commit, sk_store_commit_count(obj));
  assert_memory_equal(s->rng, obj->meta->rng, sizeof s->rng);
}

static void free_snap(struct snap *s) {
  sk_kv_free(s->kv);
  free(s->logits);
}

/* ---- scan results ---- */

#define MAX_SEEN 16
struct scan {
  struct sk_store_obj *adopted[MAX_SEEN];
  int n_adopted;
  char name[MAX_SEEN][64];
  char reason[MAX_SEEN][256];
  enum sk_store_skip what[MAX_SEEN];
  int n_skipped;
};

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

static void do_scan(struct sk_store *st, struct scan *s, uint64_t *ret_max) {
  memset(s, 0, sizeof *s);
  struct sk_store_scan_cb cb = {.adopt = on_adopt, .skip = on_skip, .user = s};
  struct sk_error err = {0};
  if (sk_store_scan(st, &cb, ret_max, &err) < 0) fail_msg("scan: %s", err.message);
}

static const char *skip_reason(const struct scan *s, const char *name) {
  for (int i = 0; i < s->n_skipped; i++)
    if (strcmp(s->name[i], name) == 0) return s->reason[i];
  return NULL;
}

static void free_adopted(struct scan *s) {
  for (int i = 0; i < s->n_adopted; i++) sk_store_obj_free(s->adopted[i]);
}

static void rm_rf(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* ---- tests ---- */

/* A session driven through the store computes bit for bit what a plain
 * malloc'd cache computes, before and after a restart (free, reopen,
 * scan, adopt), with evictions on both sides of it. */
static void test_same_as_plain_cache(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *obj = create(st, 1, &streaming16);
  assert_int_equal(sk_store_commit_count(obj), 1);
  struct sk_kv *ref = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_kv_new(fx.cfg.shape, &streaming16, &ref, &err), 0);
  float *ref_logits = malloc(fx.n_vocab * sizeof(float));
  assert_non_null(ref_logits);
  /* a prefill chunk of 10, then single tokens past the capacity */
  uint32_t sizes[] = {10, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    step(obj, sizes[i]);
    run_chunk(ref, ref_logits, sizes[i]);
    assert_same_cache(ref, &obj->kv);
    assert_memory_equal(ref_logits, obj->logits, fx.n_vocab * sizeof(float));
  }
  assert_int_equal(sk_store_commit_count(obj), 17);
  assert_int_equal(obj->kv.hdr->n_seen, 27);
  assert_int_equal(obj->kv.hdr->n_evicted, 11);

  sk_store_obj_free(obj);
  sk_store_close(st);
  st = open_store(dir);
  struct scan s;
  uint64_t max_id = 0;
  do_scan(st, &s, &max_id);
  assert_int_equal(s.n_adopted, 1);
  assert_int_equal(s.n_skipped, 0);
  assert_int_equal(max_id, 1);
  obj = s.adopted[0];
  assert_int_equal(obj->id, 1);
  assert_int_equal(obj->owner_uid, 1000);
  assert_int_equal(sk_store_commit_count(obj), 17);
  assert_true(obj->meta->flags & SK_STORE_HAS_LOGITS);
  assert_same_cache(ref, &obj->kv);
  assert_memory_equal(ref_logits, obj->logits, fx.n_vocab * sizeof(float));
  for (int i = 0; i < 20; i++) {
    step(obj, 1);
    run_chunk(ref, ref_logits, 1);
    assert_same_cache(ref, &obj->kv);
    assert_memory_equal(ref_logits, obj->logits, fx.n_vocab * sizeof(float));
  }
  assert_int_equal(obj->kv.hdr->n_evicted, 31);
  sk_store_obj_remove(obj);
  struct stat sb;
  char path[512];
  snprintf(path, sizeof path, "%s/session-1.skv", dir);
  assert_int_equal(stat(path, &sb), -1);
  sk_store_close(st);
  sk_kv_free(ref);
  free(ref_logits);
  rm_rf(dir);
  free(dir);
}

/* A step that never commits (the daemon died in it) leaves the previous
 * commit exactly: counters, tokens, the K/V of every resident token (the
 * evicted token's slot was not reused), logits and the PRNG. Also when the
 * dying step had already copied and changed the working copy a lot. */
static void test_uncommitted_step(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *obj = create(st, 5, &streaming16);
  step(obj, 16); /* full */
  for (int i = 0; i < 7; i++) step(obj, 1);
  struct snap before = take_snap(obj);

  for (int variant = 0; variant < 3; variant++) {
    sk_store_begin(obj);
    run_chunk(&obj->kv, obj->logits, 1); /* evicts, writes the new K/V */
    obj->meta->rng[0] ^= 0x1234;
    if (variant == 1) /* garbage over the rest of the working copy */
      memset((char *)obj->meta + 16, 0xab, 300);
    if (variant == 2) {
      /* a torn commit: checksum of the new state written, commit not */
      obj->meta->checksum ^= 0xffff;
    }
    sk_store_obj_free(obj); /* died here: no commit, no abort */
    sk_store_close(st);
    st = open_store(dir);
    struct scan s;
    do_scan(st, &s, NULL);
    assert_int_equal(s.n_adopted, 1);
    assert_int_equal(s.n_skipped, 0);
    obj = s.adopted[0];
    assert_true(obj->dropped_step);
    assert_snap(&before, obj);
  }
  /* and the adopted session goes on */
  step(obj, 1);
  assert_int_equal(sk_store_commit_count(obj), before.commit + 1);
  assert_int_equal(obj->kv.hdr->n_seen, before.kv->hdr->n_seen + 1);
  free_snap(&before);
  sk_store_obj_free(obj);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* reopen: closes obj and st, opens the directory again and returns the
 * one object adopted (st set to the new store). */
static struct sk_store_obj *reopen(const char *dir, struct sk_store **st, struct sk_store_obj *obj) {
  sk_store_obj_free(obj);
  sk_store_close(*st);
  *st = open_store(dir);
  struct scan s;
  do_scan(*st, &s, NULL);
  assert_int_equal(s.n_adopted, 1);
  assert_int_equal(s.n_skipped, 0);
  return s.adopted[0];
}

/* sk_store_begin_decode leaves the working copy's logits as they were
 * (the copy two commits back), copies everything else; sk_store_keep_logits
 * brings the live ones over. Both commit with a valid checksum: the
 * store adopts them after a restart with exactly the logits committed. */
static void test_begin_decode(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *obj = create(st, 9, &streaming16);
  const size_t lb = fx.n_vocab * sizeof(float);
  float *older = malloc(lb), *last = malloc(lb);
  assert_non_null(older);
  assert_non_null(last);
  step(obj, 4);
  memcpy(older, obj->logits, lb); /* the copy that is about to stop being live */
  step(obj, 1);
  memcpy(last, obj->logits, lb);
  assert_memory_not_equal(older, last, lb);

  /* a decode step: stale logits in the working copy, the rest copied */
  struct snap live = take_snap(obj);
  sk_store_begin_decode(obj);
  assert_memory_equal(obj->logits, older, lb);
  assert_same_cache(live.kv, &obj->kv);
  assert_memory_equal(obj->meta->rng, live.rng, sizeof live.rng);
  run_chunk(&obj->kv, obj->logits, 1); /* writes every logit */
  obj->meta->rng[1] ^= 0x55;
  sk_store_commit(obj);
  struct snap after = take_snap(obj);
  obj = reopen(dir, &st, obj);
  assert_snap(&after, obj);
  assert_int_equal(sk_store_commit_count(obj), live.commit + 1);
  free_snap(&after);

  /* a step that ends without a pass (end of stream): keep_logits, then
   * the committed logits are the live ones it started from */
  memcpy(last, obj->logits, lb);
  sk_store_begin_decode(obj);
  assert_memory_not_equal(obj->logits, last, lb);
  sk_store_keep_logits(obj);
  assert_memory_equal(obj->logits, last, lb);
  obj->meta->rng[2] ^= 0x77;
  sk_store_commit(obj);
  struct snap eos = take_snap(obj);
  obj = reopen(dir, &st, obj);
  assert_snap(&eos, obj);
  assert_memory_equal(obj->logits, last, lb);
  assert_int_equal(sk_store_commit_count(obj), live.commit + 2);
  free_snap(&eos);

  /* outside a step keep_logits changes nothing */
  sk_store_keep_logits(obj);
  assert_memory_equal(obj->logits, last, lb);
  free_snap(&live);
  free(older);
  free(last);
  sk_store_obj_free(obj);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* A window cache's chunk of SK_KV_SPARE_SLOTS tokens that evicts as many
 * (scheduler.c's plan_prefill once the cache is full), on the store's view;
 * committed or not. */
static void chunk_step(struct sk_store_obj *obj, bool commit) {
  struct sk_kv *kv = &obj->kv;
  struct sk_error err = {0};
  sk_store_begin(obj);
  const uint32_t n = SK_KV_SPARE_SLOTS;
  uint64_t before = kv->hdr->n_evicted;
  assert_int_equal(sk_kv_make_room(kv, n, NULL, &err), 0);
  int32_t toks[SK_KV_SPARE_SLOTS];
  for (uint32_t i = 0; i < n; i++) toks[i] = tok_at(kv->hdr->n_seen + i);
  struct sk_seq q = {.kv = kv, .tokens = toks, .n = n,
                     .n_evicted = (uint32_t)(kv->hdr->n_evicted - before),
                     .logits = obj->logits};
  assert_int_equal(q.n_evicted, n);
  if (sk_model_forward_batch(fx.m, fx.scr, &q, 1, &err) < 0) fail_msg("forward: %s", err.message);
  obj->meta->flags |= SK_STORE_HAS_LOGITS;
  if (commit) sk_store_commit(obj);
}

/* The same for a chunk that evicts SK_KV_SPARE_SLOTS tokens at once (a
 * full window cache), f32 and f16: the daemon dying inside it leaves the
 * last commit, every resident key and value intact. */
static void test_uncommitted_chunk(void **state) {
  (void)state;
  static const struct sk_kv_params window17 = {.policy = SK_POLICY_WINDOW, .window = 17,
                                               .rope_scale = 1.0f};
  for (uint32_t type = SK_KV_F32; type <= SK_KV_F16; type++) {
    char *dir = new_dir();
    struct sk_store_config c = fx.cfg;
    c.shape.kv_type = type;
    c.dir = dir;
    struct sk_store *st = NULL;
    struct sk_error err = {0};
    assert_int_equal(sk_store_open(&c, &st, NULL, &err), 0);
    struct sk_store_obj *obj = create(st, 7, &window17);
    step(obj, 16);
    step(obj, 1); /* full */
    chunk_step(obj, true);
    chunk_step(obj, true);
    struct snap before = take_snap(obj);
    for (int variant = 0; variant < 2; variant++) {
      chunk_step(obj, false);
      if (variant == 1) obj->meta->checksum ^= 0xffff; /* torn commit */
      sk_store_obj_free(obj); /* died here */
      sk_store_close(st);
      assert_int_equal(sk_store_open(&c, &st, NULL, &err), 0);
      struct scan s;
      do_scan(st, &s, NULL);
      assert_int_equal(s.n_adopted, 1);
      assert_int_equal(s.n_skipped, 0);
      obj = s.adopted[0];
      assert_true(obj->dropped_step);
      assert_snap(&before, obj);
    }
    chunk_step(obj, true);
    assert_int_equal(obj->kv.hdr->n_seen, before.kv->hdr->n_seen + SK_KV_SPARE_SLOTS);
    free_snap(&before);
    sk_store_obj_free(obj);
    sk_store_close(st);
    rm_rf(dir);
    free(dir);
  }
}

/* Writes `byte ^= mask` at off of a file. */
static void flip(const char *path, off_t off, unsigned char mask) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  unsigned char c;
  assert_int_equal(pread(fd, &c, 1, off), 1);
  c ^= mask;
  assert_int_equal(pwrite(fd, &c, 1, off), 1);
  close(fd);
}

/* Each kind of invalid object is set aside into invalid/ with its reason,
 * the valid ones are adopted, leftovers of an unfinished creation are
 * removed, files that are not session objects are left alone. */
static void test_set_aside(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *objs[8];
  for (uint64_t id = 1; id <= 7; id++) {
    objs[id] = create(st, id, &streaming16);
    for (int i = 0; i < 18; i++) step(objs[id], 1);
  }
  size_t size = objs[1]->size;
  const uint64_t meta0 = objs[1]->hdr->off_meta[0], meta1 = objs[1]->hdr->off_meta[1];
  const uint64_t data = objs[1]->hdr->off_data;
  int live6 = objs[6]->live;
  /* 7: the K/V row of a resident token changed behind the store's back */
  sk_kv_k(&objs[7]->kv, 0, objs[7]->kv.order[5])[0] += 1.0f;
  for (uint64_t id = 1; id <= 7; id++) sk_store_obj_free(objs[id]);
  sk_store_close(st);

  char path[512];
  /* 2: a flipped byte in the fixed header */
  snprintf(path, sizeof path, "%s/session-2.skv", dir);
  flip(path, 40, 0x10);
  /* 3: truncated */
  snprintf(path, sizeof path, "%s/session-3.skv", dir);
  assert_int_equal(truncate(path, (off_t)size - 4096), 0);
  /* 4: another model's object (same shape, other fingerprint) */
  {
    struct sk_store_config other = fx.cfg;
    other.model_fp[3] ^= 0x5a;
    char *odir = new_dir();
    other.dir = odir;
    struct sk_store *ost = NULL;
    struct sk_error err = {0};
    assert_int_equal(sk_store_open(&other, &ost, NULL, &err), 0);
    struct sk_store_obj *o = create(ost, 4, &streaming16);
    sk_store_obj_free(o);
    sk_store_close(ost);
    char src[512];
    snprintf(src, sizeof src, "%s/session-4.skv", odir);
    snprintf(path, sizeof path, "%s/session-4.skv", dir);
    assert_int_equal(rename(src, path), 0);
    rm_rf(odir);
    free(odir);
  }
  /* 5: a flipped byte in the newest meta copy (not a crash: corruption) */
  /* 6: a flipped byte in the stale meta copy: harmless, adopted */
  snprintf(path, sizeof path, "%s/session-6.skv", dir);
  flip(path, (off_t)(live6 ? meta0 : meta1) + 200, 0x01);
  snprintf(path, sizeof path, "%s/session-5.skv", dir);
  {
    /* which copy is live in 5: the one with the larger commit */
    int fd = open(path, O_RDONLY);
    uint64_t c0 = 0, c1 = 0;
    assert_int_equal(pread(fd, &c0, 8, (off_t)meta0), 8);
    assert_int_equal(pread(fd, &c1, 8, (off_t)meta1), 8);
    close(fd);
    assert_int_equal(c0 > c1 ? c0 : c1, 19);
    flip(path, (off_t)(c0 > c1 ? meta0 : meta1) + 300, 0x04);
  }
  (void)data;
  /* an unfinished creation, and a file that is none of ours */
  snprintf(path, sizeof path, "%s/session-9.skv.tmp", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("half", f);
  fclose(f);
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);

  st = open_store(dir);
  struct scan s;
  uint64_t max_id = 0;
  do_scan(st, &s, &max_id);
  assert_int_equal(max_id, 9);
  assert_int_equal(s.n_adopted, 2);
  assert_int_equal(s.adopted[0]->id, 1);
  assert_int_equal(s.adopted[1]->id, 6);
  assert_int_equal(sk_store_commit_count(s.adopted[1]), 19);
  assert_int_equal(s.n_skipped, 6);
  const char *r;
  assert_non_null(r = skip_reason(&s, "session-2.skv"));
  assert_non_null(strstr(r, "header checksum mismatch"));
  assert_non_null(r = skip_reason(&s, "session-3.skv"));
  assert_non_null(strstr(r, "truncated"));
  assert_non_null(r = skip_reason(&s, "session-4.skv"));
  assert_non_null(strstr(r, "model fingerprint"));
  assert_non_null(r = skip_reason(&s, "session-5.skv"));
  assert_non_null(strstr(r, "corrupted"));
  assert_non_null(strstr(r, "commit 19"));
  assert_non_null(r = skip_reason(&s, "session-7.skv"));
  assert_non_null(strstr(r, "do not match their checksum"));
  assert_non_null(r = skip_reason(&s, "session-9.skv.tmp"));
  for (int i = 0; i < s.n_skipped; i++)
    assert_int_equal(s.what[i], strcmp(s.name[i], "session-9.skv.tmp") == 0
                                    ? SK_STORE_REMOVED
                                    : SK_STORE_SET_ASIDE);
  struct stat sb;
  for (int id = 2; id <= 7; id++) {
    if (id == 6) continue;
    snprintf(path, sizeof path, "%s/invalid/session-%d.skv", dir, id);
    assert_int_equal(stat(path, &sb), 0);
    snprintf(path, sizeof path, "%s/session-%d.skv", dir, id);
    assert_int_equal(stat(path, &sb), -1);
  }
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  assert_int_equal(stat(path, &sb), 0);
  snprintf(path, sizeof path, "%s/session-9.skv.tmp", dir);
  assert_int_equal(stat(path, &sb), -1);
  free_adopted(&s);
  /* a second scan finds only the adopted two */
  do_scan(st, &s, NULL);
  assert_int_equal(s.n_adopted, 2);
  assert_int_equal(s.n_skipped, 0);
  free_adopted(&s);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* Sets the 32-bit header field at byte off of an object file and seals
 * the header again (its checksum), as a newer sinkd would write it. */
static void set_header_u32(const char *path, size_t off, uint32_t v) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  struct sk_store_header h;
  assert_int_equal(pread(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
  memcpy((char *)&h + off, &v, sizeof v);
  h.header_checksum = XXH3_64bits(&h, offsetof(struct sk_store_header, header_checksum));
  assert_int_equal(pwrite(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
  close(fd);
}

/* Header flags: temporary is read back; a flag or a reserved byte this
 * sinkd does not know sets the file aside (it may be a newer sinkd's),
 * never acted upon. So does a kv_type that is unknown, or that is the
 * other one while the file keeps this one's sizes (its reason says
 * which type the sizes were checked against). */
static void test_header_flags(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  for (uint64_t id = 1; id <= 5; id++) sk_store_obj_free(create(st, id, &streaming16));
  sk_store_close(st);
  char path[512];
  snprintf(path, sizeof path, "%s/session-1.skv", dir);
  set_header_u32(path, offsetof(struct sk_store_header, flags), SK_STORE_TEMPORARY);
  snprintf(path, sizeof path, "%s/session-2.skv", dir);
  set_header_u32(path, offsetof(struct sk_store_header, flags), SK_STORE_TEMPORARY | 4u);
  snprintf(path, sizeof path, "%s/session-3.skv", dir);
  set_header_u32(path, offsetof(struct sk_store_header, reserved) + 8, 1);
  snprintf(path, sizeof path, "%s/session-4.skv", dir);
  set_header_u32(path, offsetof(struct sk_store_header, kv_type), SK_KV_F16);
  snprintf(path, sizeof path, "%s/session-5.skv", dir);
  set_header_u32(path, offsetof(struct sk_store_header, kv_type), 7);
  st = open_store(dir);
  struct scan s;
  do_scan(st, &s, NULL);
  assert_int_equal(s.n_adopted, 1);
  assert_int_equal(s.adopted[0]->id, 1);
  assert_int_equal(s.adopted[0]->flags, SK_STORE_TEMPORARY);
  assert_int_equal(s.n_skipped, 4);
  char want4[96];
  snprintf(want4, sizeof want4, "section offsets do not match capacity %u and kv_type f16",
           sk_kv_params_capacity(&streaming16));
  assert_string_equal(skip_reason(&s, "session-4.skv"), want4);
  assert_string_equal(skip_reason(&s, "session-5.skv"),
                      "its KV cache is of unknown type 7 (corrupted?)");
  assert_string_equal(skip_reason(&s, "session-2.skv"),
                      "unknown header flags 0x4 (a newer sinkd's file?)");
  char want[96];
  snprintf(want, sizeof want, "reserved header byte %zu is not zero (a newer sinkd's file?)",
           offsetof(struct sk_store_header, reserved) + 8);
  assert_string_equal(skip_reason(&s, "session-3.skv"), want);
  free_adopted(&s);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* The bytes of a character a generate ended inside are committed with
 * the step and kept by fork, export/import and a restart; bytes that
 * cannot start a character are refused on import and set aside on
 * adoption, naming the field. */
static void reseal_image(char *img, size_t size);
static char *image_copy(const char *img, size_t size, struct sk_store_meta **ret_m,
                        struct sk_kv_header **ret_kh);
static void test_utf8_held(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *a = create(st, 1, &streaming16);
  step(a, 4);
  struct sk_utf8_stream in;
  sk_utf8_stream_init(&in);
  char out[32];
  assert_int_equal(sk_utf8_stream_push(&in, "\xe2\x82", 2, out), 0); /* U+20AC, 2 of 3 bytes */
  sk_store_begin(a);
  sk_store_utf8_set(a, &in);
  sk_store_commit(a);
  struct sk_utf8_stream got;
  sk_store_utf8_get(a, &got);
  assert_int_equal(got.n_held, 2);
  assert_memory_equal(got.held, "\xe2\x82", 2);
  /* A step without a change keeps them (begin copies the live meta). */
  step(a, 1);
  sk_store_utf8_get(a, &got);
  assert_int_equal(got.n_held, 2);

  struct sk_store_obj *b = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_store_fork(st, a, 2, 0, &b, &err), 0);
  sk_store_utf8_get(b, &got);
  assert_int_equal(got.n_held, 2);
  /* ... and the next byte completes the character. */
  assert_int_equal(sk_utf8_stream_push(&got, "\xac", 1, out), 3);
  assert_memory_equal(out, "\xe2\x82\xac", 3);

  size_t size = sk_store_export_size(a);
  char *img = malloc(size);
  assert_non_null(img);
  sk_store_export(a, img, size);
  struct sk_store_obj *c = NULL;
  assert_int_equal(sk_store_import(st, img, size, 3, 0, &c, &err), 0);
  sk_store_utf8_get(c, &got);
  assert_int_equal(got.n_held, 2);
  assert_memory_equal(got.held, "\xe2\x82", 2);
  /* An image holding bytes no character starts with. */
  struct sk_store_meta *m;
  struct sk_kv_header *kh;
  char *bad = image_copy(img, size, &m, &kh);
  m->utf8_held[0] = 0x41;
  m->utf8_held[1] = 0;
  m->n_utf8_held = 1;
  reseal_image(bad, size);
  struct sk_store_obj *d = NULL;
  assert_int_equal(sk_store_import(st, bad, size, 4, 0, &d, &err), -SK_ERR_BAD_REQUEST);
  assert_string_equal(err.message, "live meta copy: utf8_held (1 bytes: 41 00 00 00) is not the "
                                   "start of a UTF-8 character");
  free(bad);
  /* More held bytes no stream leaves: a count past 3, a lead byte that
   * starts nothing (C0, F5), a second byte outside the lead's range
   * (overlong E0 80, surrogate ED A0, past U+10FFFF F4 90), a complete
   * character, bytes after the count. */
  static const struct {
    uint8_t n, held[4];
  } bads[] = {
      {4, {0xf0, 0x90, 0x80, 0x80}}, {200, {0xe2, 0x82, 0, 0}}, {1, {0xc0, 0, 0, 0}},
      {1, {0xf5, 0, 0, 0}},          {2, {0xe0, 0x80, 0, 0}},  {2, {0xed, 0xa0, 0, 0}},
      {2, {0xf4, 0x90, 0, 0}},       {2, {0xc3, 0xa9, 0, 0}},  {1, {0xe2, 0, 0x82, 0}},
      {0, {0xe2, 0, 0, 0}},
  };
  for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
    bad = image_copy(img, size, &m, &kh);
    memcpy(m->utf8_held, bads[i].held, 4);
    m->n_utf8_held = bads[i].n;
    reseal_image(bad, size);
    d = NULL;
    assert_int_equal(sk_store_import(st, bad, size, 5 + i, 0, &d, &err), -SK_ERR_BAD_REQUEST);
    assert_non_null(strstr(err.message, "utf8_held"));
    assert_null(d);
    free(bad);
  }
  /* The longest prefix a character has (3 of F4 8F BF BF) is fine. */
  bad = image_copy(img, size, &m, &kh);
  memcpy(m->utf8_held, "\xf4\x8f\xbf", 4);
  m->n_utf8_held = 3;
  reseal_image(bad, size);
  assert_int_equal(sk_store_import(st, bad, size, 20, 0, &d, &err), 0);
  sk_store_utf8_get(d, &got);
  assert_int_equal(got.n_held, 3);
  assert_int_equal(sk_utf8_stream_push(&got, "\xbf", 1, out), 4);
  assert_memory_equal(out, "\xf4\x8f\xbf\xbf", 4);
  sk_store_obj_remove(d); /* not one of the three the restart adopts */
  free(bad);
  free(img);
  sk_store_obj_free(a);
  sk_store_obj_free(b);
  sk_store_obj_free(c);
  sk_store_close(st);

  /* A restart adopts them. */
  st = open_store(dir);
  struct scan s;
  do_scan(st, &s, NULL);
  assert_int_equal(s.n_adopted, 3);
  for (int i = 0; i < 3; i++) {
    sk_store_utf8_get(s.adopted[i], &got);
    assert_int_equal(got.n_held, 2);
    assert_memory_equal(got.held, "\xe2\x82", 2);
  }
  free_adopted(&s);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* Logits or cache values that are NaN or infinite are refused on import
 * and on adoption, naming the field (sampling from them would pick token
 * 0 whatever the text). */
static void test_non_finite(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *a = create(st, 1, &streaming16);
  step(a, 4);
  size_t size = sk_store_export_size(a);
  char *img = malloc(size);
  assert_non_null(img);
  sk_store_export(a, img, size);
  struct sk_store_meta *m;
  struct sk_kv_header *kh;
  struct sk_error err = {0};
  struct sk_store_obj *b = NULL;
  char *bad = image_copy(img, size, &m, &kh);
  ((float *)(void *)((char *)m + m->off_logits))[7] = NAN;
  reseal_image(bad, size);
  assert_int_equal(sk_store_import(st, bad, size, 2, 0, &b, &err), -SK_ERR_BAD_REQUEST);
  assert_string_equal(err.message, "live meta copy: logits[7] is nan (not finite)");
  free(bad);
  /* The second row of V: layer 0's rows for the 4 positions come after
   * all of K; element 3 of position 1. */
  bad = image_copy(img, size, &m, &kh);
  const size_t row = fx.cfg.shape.kv_dim * sizeof(float);
  float *v = (float *)(void *)(bad + sizeof(struct sk_store_image) + a->hdr->meta_size +
                               (size_t)fx.cfg.shape.n_layer * 4 * row + row);
  v[3] = -INFINITY;
  reseal_image(bad, size);
  assert_int_equal(sk_store_import(st, bad, size, 2, 0, &b, &err), -SK_ERR_BAD_REQUEST);
  char want[128];
  snprintf(want, sizeof want, "V of cache position 1 (slot %u, layer 0) element 3 is not finite",
           sk_kv_slot(&a->kv, 1));
  assert_string_equal(err.message, want);
  free(bad);
  free(img);
  /* In the state directory: the live copy's logits, sealed again. */
  a->logits[9] = INFINITY;
  a->meta->checksum = XXH3_64bits_withSeed((char *)a->meta + 16, (size_t)a->hdr->meta_size - 16,
                                           a->meta->commit);
  sk_store_obj_free(a);
  sk_store_close(st);
  st = open_store(dir);
  struct scan s;
  do_scan(st, &s, NULL);
  assert_int_equal(s.n_adopted, 0);
  assert_string_equal(skip_reason(&s, "session-1.skv"),
                      "live meta copy: logits[9] is inf (not finite)");
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* fork: the same state at once, then independent. */
static void test_fork(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *a = create(st, 1, &streaming16);
  step(a, 16);
  for (int i = 0; i < 5; i++) step(a, 1);
  struct snap sa = take_snap(a);
  struct sk_store_obj *b = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_store_fork(st, a, 2, 2000, &b, &err), 0);
  assert_int_equal(b->id, 2);
  assert_int_equal(b->owner_uid, 2000);
  assert_same_cache(sa.kv, &b->kv);
  assert_memory_equal(sa.logits, b->logits, fx.n_vocab * sizeof(float));
  assert_memory_equal(sa.rng, b->meta->rng, sizeof sa.rng);
  /* b moves on; a stays */
  for (int i = 0; i < 4; i++) step(b, 1);
  assert_snap(&sa, a);
  assert_int_equal(b->kv.hdr->n_seen, sa.kv->hdr->n_seen + 4);
  /* a moves on the same way: they agree again */
  for (int i = 0; i < 4; i++) step(a, 1);
  assert_same_cache(&a->kv, &b->kv);
  assert_memory_equal(a->logits, b->logits, fx.n_vocab * sizeof(float));
  free_snap(&sa);
  sk_store_obj_free(a);
  sk_store_obj_free(b);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* export -> import gives the same session; the same continuation; one
 * flipped byte anywhere, a truncation, extra bytes or another model's
 * image are refused, each with a clear reason. */
/* Seals an export image of size bytes again after a test changed its
 * meta copy: the meta copy's checksum, then the body's and the header's,
 * as sk_store_export writes them (so the change gets past them). */
static void reseal_image(char *img, size_t size) {
  struct sk_store_image *im = (struct sk_store_image *)(void *)img;
  char *copy = img + sizeof *im;
  struct sk_store_meta *m = (struct sk_store_meta *)(void *)copy;
  m->checksum = XXH3_64bits_withSeed(copy + 16, (size_t)im->meta_size - 16, m->commit);
  im->body_checksum = XXH3_64bits(copy, size - sizeof *im);
  im->header_checksum = XXH3_64bits(im, offsetof(struct sk_store_image, header_checksum));
}

/* A malloc'd copy of an export image of size bytes, for a test to
 * damage: its meta copy in *ret_m and that copy's cache header in
 * *ret_kh. */
static char *image_copy(const char *img, size_t size, struct sk_store_meta **ret_m,
                        struct sk_kv_header **ret_kh) {
  char *c = malloc(size);
  assert_non_null(c);
  memcpy(c, img, size);
  char *copy = c + sizeof(struct sk_store_image);
  *ret_m = (struct sk_store_meta *)(void *)copy;
  *ret_kh = (struct sk_kv_header *)(void *)(copy + (*ret_m)->off_kv);
  return c;
}

static void test_export_import(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_store_obj *a = create(st, 1, &streaming16);
  step(a, 16);
  for (int i = 0; i < 9; i++) step(a, 1);
  size_t size = sk_store_export_size(a);
  /* header + one meta copy + 2 x L x 16 resident rows of D floats */
  assert_int_equal(size, sizeof(struct sk_store_image) + a->hdr->meta_size +
                             2u * fx.cfg.shape.n_layer * 16 * fx.cfg.shape.kv_dim * 4);
  char *img = malloc(size + 1);
  assert_non_null(img);
  sk_store_export(a, img, size);
  struct sk_store_image_info info;
  struct sk_error err = {0};
  assert_int_equal(sk_store_image_check(st, img, size, &info, &err), 0);
  assert_int_equal(info.capacity, 16);
  assert_int_equal(info.n_resident, 16);
  assert_int_equal(info.n_seen, 25);
  assert_int_equal(info.object_size, a->size);

  struct sk_store_obj *b = NULL;
  assert_int_equal(sk_store_import(st, img, size, 2, 3000, &b, &err), 0);
  assert_int_equal(b->id, 2);
  assert_int_equal(b->owner_uid, 3000);
  assert_same_cache(&a->kv, &b->kv);
  assert_memory_equal(a->logits, b->logits, fx.n_vocab * sizeof(float));
  assert_int_equal(sk_store_commit_count(b), sk_store_commit_count(a));
  {
    /* read back before any step, as a restart adopts it: whole, and no
     * step the daemon died in (its other meta copy is no leftover) */
    char bpath[512];
    snprintf(bpath, sizeof bpath, "%s/session-2.skv", dir);
    struct sk_store_obj *chk = NULL;
    assert_int_equal(sk_store_obj_check(st, bpath, &chk, &err), 0);
    assert_false(chk->dropped_step);
    assert_int_equal(sk_store_commit_count(chk), sk_store_commit_count(a));
    sk_store_obj_free(chk);
  }
  for (int i = 0; i < 6; i++) {
    step(a, 1);
    step(b, 1);
  }
  assert_same_cache(&a->kv, &b->kv);
  assert_memory_equal(a->logits, b->logits, fx.n_vocab * sizeof(float));

  /* one flipped bit, at every byte of the header and a spread of bytes in
   * the body: always refused, as corrupted */
  int n_tried = 0;
  for (size_t off = 0; off < size; off += off < sizeof(struct sk_store_image) ? 1 : 53) {
    img[off] ^= 0x20;
    int rc = sk_store_image_check(st, img, size, NULL, &err);
    img[off] ^= 0x20;
    if (rc != -SK_ERR_BAD_REQUEST) fail_msg("flip at %zu accepted", off);
    if (!strstr(err.message, "corrupted") && !strstr(err.message, "bad magic"))
      fail_msg("flip at %zu: unexpected reason \"%s\"", off, err.message);
    n_tried++;
  }
  assert_true(n_tried > 200);
  /* truncations and extension */
  const size_t cuts[] = {0, 7, 127, 128, 129, 4000, size / 2, size - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    assert_int_equal(sk_store_image_check(st, img, cuts[i], NULL, &err), -SK_ERR_BAD_REQUEST);
    assert_non_null(strstr(err.message, "truncated"));
  }
  img[size] = 0;
  assert_int_equal(sk_store_image_check(st, img, size + 1, NULL, &err), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(err.message, "extra bytes"));
  /* refused import leaves nothing behind */
  img[size / 2] ^= 1;
  struct sk_store_obj *c = NULL;
  assert_int_equal(sk_store_import(st, img, size, 3, 3000, &c, &err), -SK_ERR_BAD_REQUEST);
  img[size / 2] ^= 1;
  char path[512];
  struct stat sb;
  snprintf(path, sizeof path, "%s/session-3.skv", dir);
  assert_int_equal(stat(path, &sb), -1);
  snprintf(path, sizeof path, "%s/session-3.skv.tmp", dir);
  assert_int_equal(stat(path, &sb), -1);

  /* another model: same image, a store with another fingerprint */
  {
    struct sk_store_config other = fx.cfg;
    other.model_fp[0] ^= 1;
    char *odir = new_dir();
    other.dir = odir;
    struct sk_store *ost = NULL;
    assert_int_equal(sk_store_open(&other, &ost, NULL, &err), 0);
    assert_int_equal(sk_store_image_check(ost, img, size, NULL, &err), -SK_ERR_BAD_REQUEST);
    assert_non_null(strstr(err.message, "another model"));
    sk_store_close(ost);
    rm_rf(odir);
    free(odir);
  }
  /* an image of an older KV layout (other slot counts: other offsets in
   * its meta copy), checksums intact: refused naming the layout version,
   * not as an invalid meta copy */
  {
    struct sk_store_meta *om;
    struct sk_kv_header *okh;
    char *old = image_copy(img, size, &om, &okh);
    okh->layout_version = SK_KV_LAYOUT_VERSION - 1;
    om->off_logits += 64;
    om->off_sum += 64;
    reseal_image(old, size);
    assert_int_equal(sk_store_image_check(st, old, size, NULL, &err), -SK_ERR_BAD_REQUEST);
    if (!strstr(err.message, "layout version"))
      fail_msg("older KV layout: \"%s\"", err.message);
    free(old);
  }
  /* n_seen out of step with the resident stream indices (checksums
   * intact): the keys are stored rotated at their stream index and the
   * forward pass derives distances from n_seen, so import refuses it */
  {
    struct sk_store_meta *bm;
    struct sk_kv_header *bkh;
    char *bad = image_copy(img, size, &bm, &bkh);
    bkh->n_seen += 1;
    reseal_image(bad, size);
    struct sk_store_obj *d = NULL;
    assert_int_equal(sk_store_import(st, bad, size, 5, 3000, &d, &err), -SK_ERR_BAD_REQUEST);
    if (!strstr(err.message, "stored rotated"))
      fail_msg("n_seen out of step: \"%s\"", err.message);
    assert_null(d);
    free(bad);
  }
  /* the other KV type, both ways: imported as it is, the type kept (a
   * store's kv_type is only that of its new sessions) */
  {
    struct sk_store_config c16 = fx.cfg;
    c16.shape.kv_type = SK_KV_F16;
    char *hdir = new_dir();
    c16.dir = hdir;
    struct sk_store *hst = NULL;
    assert_int_equal(sk_store_open(&c16, &hst, NULL, &err), 0);
    /* f32 image into the f16 store: an f32 object of a's size, rows equal
     * to another import of the same image into the f32 store */
    struct sk_store_image_info i32;
    assert_int_equal(sk_store_image_check(hst, img, size, &i32, &err), 0);
    assert_int_equal(i32.kv_type, SK_KV_F32);
    assert_int_equal(i32.object_size, a->size);
    struct sk_store_obj *x = NULL, *y = NULL;
    assert_int_equal(sk_store_import(hst, img, size, 7, 3000, &x, &err), 0);
    assert_int_equal(sk_store_import(st, img, size, 8, 3000, &y, &err), 0);
    assert_int_equal(x->hdr->kv_type, SK_KV_F32);
    assert_int_equal(x->kv.hdr->kv_type, SK_KV_F32);
    assert_int_equal(x->size, a->size);
    assert_same_cache(&x->kv, &y->kv);
    for (int i = 0; i < 3; i++) {
      step(x, 1);
      step(y, 1);
    }
    assert_same_cache(&x->kv, &y->kv);
    assert_memory_equal(x->logits, y->logits, fx.n_vocab * sizeof(float));
    /* f16 image into the f32 store: an f16 object of h's size and rows */
    struct sk_store_obj *h = create(hst, 1, &streaming16);
    step(h, 16);
    step(h, 1);
    assert_true(h->size < a->size);
    size_t hsize = sk_store_export_size(h);
    char *himg = malloc(hsize);
    assert_non_null(himg);
    sk_store_export(h, himg, hsize);
    struct sk_store_image_info i16;
    assert_int_equal(sk_store_image_check(st, himg, hsize, &i16, &err), 0);
    assert_int_equal(i16.kv_type, SK_KV_F16);
    assert_int_equal(i16.object_size, h->size);
    struct sk_store_obj *z = NULL;
    assert_int_equal(sk_store_import(st, himg, hsize, 4, 3000, &z, &err), 0);
    assert_int_equal(z->hdr->kv_type, SK_KV_F16);
    assert_int_equal(z->size, h->size);
    assert_same_cache(&h->kv, &z->kv);
    /* read back as a restart adopts it: whole, f16 */
    char zpath[512];
    snprintf(zpath, sizeof zpath, "%s/session-4.skv", dir);
    struct sk_store_obj *chk = NULL;
    assert_int_equal(sk_store_obj_check(st, zpath, &chk, &err), 0);
    assert_int_equal(chk->kv.hdr->kv_type, SK_KV_F16);
    assert_same_cache(&h->kv, &chk->kv);
    sk_store_obj_free(chk);
    /* an unknown type in the image's cache header is named */
    {
      struct sk_store_meta *bm;
      struct sk_kv_header *bkh;
      char *bad = image_copy(himg, hsize, &bm, &bkh);
      bkh->kv_type = 7;
      reseal_image(bad, hsize);
      assert_int_equal(sk_store_image_check(st, bad, hsize, NULL, &err), -SK_ERR_BAD_REQUEST);
      if (!strstr(err.message, "holds a KV cache of unknown type 7"))
        fail_msg("unknown kv_type: \"%s\"", err.message);
      free(bad);
    }
    free(himg);
    sk_store_obj_free(x);
    sk_store_obj_free(y);
    sk_store_obj_free(z);
    sk_store_obj_free(h);
    sk_store_close(hst);
    rm_rf(hdir);
    free(hdir);
  }
  /* Crafted header fields (header checksum made right): each message
   * names the field and its value. */
  {
    static const struct {
      size_t off;
      uint64_t value;
      bool wide;
      const char *want;
    } cases[] = {
        {offsetof(struct sk_store_image, header_size), 0xffffffffu, false,
         "export file header_size 4294967295, version 1's is 128"},
        {offsetof(struct sk_store_image, meta_size), 1ull << 40, true,
         "export file meta_size 1099511627776, a cache of capacity 16 has %llu"},
        {offsetof(struct sk_store_image, policy), 99, false, "export file policy 99 is unknown"},
        {offsetof(struct sk_store_image, capacity), 0, false,
         "export file capacity 0 is not a cache size this sinkd makes (1 to 1048576 tokens)"},
        {offsetof(struct sk_store_image, n_layer), 7, false,
         "export file shape (n_vocab 512, n_layer 7, kv_dim %u) does not fit the loaded model "
         "(n_vocab 512, n_layer %u, kv_dim %u)"},
        {offsetof(struct sk_store_image, n_resident), 17, false,
         "export file n_resident 17 exceeds its capacity 16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      char *bad = malloc(size);
      assert_non_null(bad);
      memcpy(bad, img, size);
      if (cases[i].wide) {
        memcpy(bad + cases[i].off, &cases[i].value, 8);
      } else {
        uint32_t v32 = (uint32_t)cases[i].value;
        memcpy(bad + cases[i].off, &v32, 4);
      }
      struct sk_store_image *im = (struct sk_store_image *)(void *)bad;
      im->header_checksum = XXH3_64bits(im, offsetof(struct sk_store_image, header_checksum));
      char want[256];
      if (i == 1)
        snprintf(want, sizeof want, cases[i].want, (unsigned long long)a->hdr->meta_size);
      else if (i == 4)
        snprintf(want, sizeof want, cases[i].want, fx.cfg.shape.kv_dim, fx.cfg.shape.n_layer,
                 fx.cfg.shape.kv_dim);
      else
        snprintf(want, sizeof want, "%s", cases[i].want);
      assert_int_equal(sk_store_image_check(st, bad, size, NULL, &err), -SK_ERR_BAD_REQUEST);
      assert_string_equal(err.message, want);
      free(bad);
    }
  }
  free(img);
  sk_store_obj_free(a);
  sk_store_obj_free(b);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* Sizes: the file is exactly sk_store_object_size bytes, all of it
 * allocated (no holes: posix_fallocate), a page multiple, and the same
 * formula as the layout in store.h. */
static void test_sizes(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct sk_kv_params dense = {.policy = SK_POLICY_DENSE, .capacity = 300, .rope_scale = 1.0f};
  struct sk_store_obj *obj = create(st, 1, &dense);
  size_t want = sk_store_object_size(st, 300);
  assert_int_equal(obj->size, want);
  assert_int_equal(want % SK_STORE_PAGE, 0);
  size_t meta = 0, data = 0;
  assert_true(sk_kv_part_sizes(fx.cfg.shape, 300, &meta, &data));
  size_t copy = sizeof(struct sk_store_meta) + meta + fx.n_vocab * 4 + 301 * 8;
  copy = (copy + 4095) / 4096 * 4096;
  assert_int_equal(obj->hdr->meta_size, copy);
  assert_int_equal(want, 4096 + 2 * copy + (data + 4095) / 4096 * 4096);
  char path[512];
  snprintf(path, sizeof path, "%s/session-1.skv", dir);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal((size_t)sb.st_size, want);
  assert_int_equal((sb.st_mode & 0777), 0600);
  assert_true((size_t)sb.st_blocks * 512 >= want);
  assert_int_equal(sk_store_object_size(st, 0), 0);
  assert_int_equal(sk_store_object_size(st, SK_KV_MAX_CAPACITY + 1), 0);
  sk_store_obj_free(obj);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}

/* One daemon per state directory; a new directory is private. */
static void test_lock(void **state) {
  (void)state;
  char *dir = new_dir();
  struct sk_store *st = open_store(dir);
  struct stat sb;
  struct sk_store_config c = fx.cfg;
  c.dir = dir;
  struct sk_store *st2 = NULL;
  struct sk_error err = {0};
  assert_int_equal(sk_store_open(&c, &st2, NULL, &err), -SK_ERR_BUSY);
  assert_non_null(strstr(err.message, "in use by another sinkd"));
  /* the check a daemon makes before loading its model says the same,
   * and leaves the lock with its holder */
  assert_int_equal(sk_store_check_busy(dir, &err), -SK_ERR_BUSY);
  char want[700];
  snprintf(want, sizeof want, "state directory %s is in use by another sinkd", dir);
  assert_string_equal(err.message, want);
  assert_int_equal(sk_store_open(&c, &st2, NULL, &err), -SK_ERR_BUSY);
  sk_store_close(st);
  assert_int_equal(sk_store_check_busy(dir, &err), 0);
  assert_int_equal(sk_store_open(&c, &st2, NULL, &err), 0);
  sk_store_close(st2);
  /* a directory not made yet: nothing to say, nothing made */
  char none[600];
  snprintf(none, sizeof none, "%s/not-yet", dir);
  assert_int_equal(sk_store_check_busy(none, &err), 0);
  assert_int_equal(stat(none, &sb), -1);
  /* nested directories are created */
  char sub[600];
  snprintf(sub, sizeof sub, "%s/a/b/state", dir);
  c.dir = sub;
  assert_int_equal(sk_store_open(&c, &st2, NULL, &err), 0);
  sk_store_close(st2);
  assert_int_equal(stat(sub, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0700);
  snprintf(sub, sizeof sub, "%s/a/b", dir);
  assert_int_equal(stat(sub, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0755);
  rm_rf(dir);
  free(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_as_plain_cache),
      cmocka_unit_test(test_uncommitted_step),
      cmocka_unit_test(test_begin_decode),
      cmocka_unit_test(test_uncommitted_chunk),
      cmocka_unit_test(test_set_aside),
      cmocka_unit_test(test_header_flags),
      cmocka_unit_test(test_utf8_held),
      cmocka_unit_test(test_non_finite),
      cmocka_unit_test(test_fork),
      cmocka_unit_test(test_export_import),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_lock),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
