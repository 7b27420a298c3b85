/* Export images of the store (teststore.h): export -> import gives the
 * same session; a flipped byte, a truncation, extra bytes or another
 * model's image are refused with a clear reason; the bytes of a character
 * a generate ended inside are kept; non-finite values are refused. */
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

/* The bytes of a character a generate ended inside are committed with
 * the step and kept by fork, export/import and a restart; bytes that
 * cannot start a character are refused on import and set aside on
 * adoption, naming the field. */
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

/* An image of another model, of an older KV layout, or whose n_seen is out
 * of step with its resident tokens: refused, naming why. */
static void refuse_other_images(struct sk_store *st, const char *img, size_t size) {
  struct sk_error err = {0};
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
}

static void import_other_kv_type(struct sk_store *st, const struct sk_store_obj *a,
                                const char *img, size_t size, const char *dir) {
  struct sk_error err = {0};
  /* the other KV type, both ways: imported as it is, the type kept (a
   * store's kv_type is only that of its new sessions) */
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

static void refuse_crafted_headers(struct sk_store *st, const struct sk_store_obj *a,
                                   const char *img, size_t size) {
  struct sk_error err = {0};
  /* Crafted header fields (header checksum made right): each message
   * names the field and its value. */
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

/* export -> import gives the same session; the same continuation; one
 * flipped byte anywhere, a truncation, extra bytes or another model's
 * image are refused, each with a clear reason. */
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

  refuse_other_images(st, img, size);
  import_other_kv_type(st, a, img, size, dir);
  refuse_crafted_headers(st, a, img, size);
  free(img);
  sk_store_obj_free(a);
  sk_store_obj_free(b);
  sk_store_close(st);
  rm_rf(dir);
  free(dir);
}
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_utf8_held),
      cmocka_unit_test(test_non_finite),
      cmocka_unit_test(test_export_import),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
