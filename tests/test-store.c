/* The shared-memory store (store.h) with the real model (teststore.h): a
 * session driven through the store computes bit for bit what a plain
 * cache computes; committed steps survive, an uncommitted step leaves the
 * previous commit; every kind of bad object is set aside with its reason
 * while good ones are adopted; fork copies a session exactly; sizes are
 * exact; a state directory has one daemon at a time. Export images:
 * test-store-images.c. */
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
      cmocka_unit_test(test_fork),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_lock),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
