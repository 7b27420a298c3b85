/* Creating session objects in the store (store.h): new ones, forks and
 * imports, written beside their final name and renamed; and export
 * images. */
#include "session/store.h"
#include "session/store_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/safefile.h"
#include "sk_limits.h"

/* ---- creating objects ------------------------------------------------ */

int sk_store_create_file(struct sk_store *st, uint64_t id, struct sk_error *err) {
  char name[64];
  sk__obj_name(name, sizeof name, id, true);
  int fd = openat(st->dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    unlinkat(st->dirfd, name, 0); /* a leftover of a failed creation */
    fd = openat(st->dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  }
  if (fd < 0)
    return sk_error_set(err, SK_ERR_IO, "cannot create %s/%s: %s", st->dir, name,
                        strerror(errno));
  return fd;
}

void sk_store_create_end(struct sk_store *st, int fd, uint64_t id) {
  if (fd >= 0) close(fd);
  char name[64];
  sk__obj_name(name, sizeof name, id, true);
  unlinkat(st->dirfd, name, 0); /* gone already once renamed into place */
}

/* Makes every page of a new object's mapping (size bytes at map, nobody
 * else's yet, on tmpfs: the writes would otherwise go to disk) ready to
 * be written. Creation runs off the event loop and
 * the compute thread, which would otherwise take a fault for every 4 KB
 * the cache grows into, stalling every session of its batch.
 * - MAP_POPULATE is not enough for a shared mapping: it maps the pages
 *   read-only, and the first write to each still faults.
 *   MADV_POPULATE_WRITE (Linux 5.14) maps them writable.
 * - Under a hypervisor that keeps its own page tables (shadow paging,
 *   as on the project's VM), the first access to a page from user space
 *   still traps to the hypervisor, ~6 us a page, whatever the kernel
 *   mapped: so every page is also written once here, rewriting its first
 *   byte (the object is not shared yet).
 * There, a step's first writes into a new cache cost about 5x as much
 * without the writes here (doc/performance.md), which cost one write per
 * page when the object is made instead. */
static void sk__populate_write(void *map, size_t size) {
#ifdef MADV_POPULATE_WRITE
  (void)madvise(map, size, MADV_POPULATE_WRITE); /* else: the writes below fault them in */
#endif
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  volatile unsigned char *p = map;
  for (size_t i = 0; i < size; i += page) p[i] = p[i];
}

/* A new object under its temporary name, in the file fd (kept open),
 * header written, meta copies and data zero (fresh tmpfs pages); its
 * cache holds kv_type elements. */
static int sk__create_tmp(struct sk_store *st, int fd, uint64_t id, uint32_t owner_uid,
                          uint32_t flags, uint32_t kv_type, uint32_t capacity, uint32_t policy,
                          struct sk_store_obj **ret, struct sk_error *err) {
  struct sk__geom g;
  if (!sk__geom(st, kv_type, capacity, &g))
    return sk__bad(err, "capacity %u gives a cache too large for this machine", capacity);
  char name[64];
  sk__obj_name(name, sizeof name, id, true);
  int e = posix_fallocate(fd, 0, (off_t)g.total);
  if (e != 0) {
    unlinkat(st->dirfd, name, 0);
    if (e == ENOSPC)
      return sk_error_set(err, SK_ERR_BUSY,
                          "state directory %s is full: no room for a %" PRIu64
                          "-byte session (file system limit)",
                          st->dir, g.total);
    return sk_error_set(err, SK_ERR_IO, "cannot reserve %" PRIu64 " bytes for %s: %s",
                        g.total, name, strerror(e));
  }
  /* On another file system the writes would put the whole cache on disk:
   * there the pages are only read in (the faults stay) */
  void *map = mmap(NULL, (size_t)g.total, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (st->tmpfs ? 0 : MAP_POPULATE), fd, 0);
  if (map != MAP_FAILED && st->tmpfs) sk__populate_write(map, (size_t)g.total);
  struct sk_store_obj *obj = map == MAP_FAILED ? NULL : calloc(1, sizeof *obj);
  if (!obj) {
    if (map != MAP_FAILED) munmap(map, (size_t)g.total);
    unlinkat(st->dirfd, name, 0);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "cannot map a %" PRIu64 "-byte session",
                        g.total);
  }
  obj->store = st;
  obj->map = map;
  obj->size = (size_t)g.total;
  obj->hdr = map;
  obj->id = id;
  obj->owner_uid = owner_uid;
  obj->flags = flags;
  pthread_mutex_lock(&st->id_lock);
  if (id >= st->next_id) {
    /* Ids are never reused, even after the session is closed and the
     * daemon restarted: the lock file remembers the next one. */
    st->next_id = id + 1;
    char idbuf[32];
    int n = snprintf(idbuf, sizeof idbuf, "%" PRIu64 "\n", st->next_id);
    if (pwrite(st->lockfd, idbuf, (size_t)n, 0) != n) {
      /* Not fatal: the ids of the objects present still count. */
    }
  }
  pthread_mutex_unlock(&st->id_lock);
  struct sk_store_header *h = map;
  memcpy(h->magic, SK__STORE_MAGIC, 8);
  h->layout_version = SK_STORE_LAYOUT_VERSION;
  h->header_size = sizeof *h;
  memcpy(h->model_fp, st->fp, SK_STORE_FP_SIZE);
  h->session_id = id;
  h->owner_uid = owner_uid;
  h->kv_layout_version = SK_KV_LAYOUT_VERSION;
  h->n_vocab = st->n_vocab;
  h->n_layer = st->shape.n_layer;
  h->kv_dim = st->shape.kv_dim;
  h->kv_type = kv_type;
  h->capacity = capacity;
  h->policy = policy;
  h->created_unix = (uint64_t)time(NULL);
  h->meta_size = g.meta_size;
  h->off_meta[0] = g.off_meta[0];
  h->off_meta[1] = g.off_meta[1];
  h->off_data = g.off_data;
  h->data_size = g.kv_data;
  h->total_size = g.total;
  h->flags = flags;
  h->header_checksum = sk__header_sum(h);
  for (int i = 0; i < 2; i++) {
    struct sk_store_meta *m = (struct sk_store_meta *)(void *)sk__copy(obj, i);
    m->magic = SK_STORE_META_MAGIC;
    m->off_kv = g.off_kv;
    m->off_logits = g.off_logits;
    m->off_sum = g.off_sum;
  }
  *ret = obj;
  return 0;
}

/* sk__create_tmp in a file of its own, opened and closed here. */
static int sk__create_tmp_own(struct sk_store *st, uint64_t id, uint32_t owner_uid,
                              uint32_t kv_type, uint32_t capacity, uint32_t policy,
                              struct sk_store_obj **ret, struct sk_error *err) {
  int fd = sk_store_create_file(st, id, err);
  if (fd < 0) return fd;
  int rc = sk__create_tmp(st, fd, id, owner_uid, 0, kv_type, capacity, policy, ret, err);
  close(fd);
  return rc;
}

/* Seals copy 0 with `commit`, shows it, and renames the object into
 * place. On failure the object is deleted and freed. */
static int sk__finish_create(struct sk_store *st, struct sk_store_obj *obj, uint64_t commit,
                             struct sk_error *err) {
  sk__seal(obj, 0, commit);
  obj->live = 0;
  obj->in_step = false;
  sk__view(obj, 0);
  char tmp[64], name[64];
  sk__obj_name(tmp, sizeof tmp, obj->id, true);
  sk__obj_name(name, sizeof name, obj->id, false);
  if (renameat2(st->dirfd, tmp, st->dirfd, name, RENAME_NOREPLACE) < 0 &&
      (errno != EINVAL || renameat(st->dirfd, tmp, st->dirfd, name) < 0)) {
    int e = errno;
    unlinkat(st->dirfd, tmp, 0);
    obj->store = NULL;
    sk_store_obj_free(obj);
    return sk_error_set(err, SK_ERR_IO, "cannot rename %s to %s: %s", tmp, name, strerror(e));
  }
  return 0;
}

static void sk__discard_tmp(struct sk_store *st, struct sk_store_obj *obj) {
  char tmp[64];
  sk__obj_name(tmp, sizeof tmp, obj->id, true);
  unlinkat(st->dirfd, tmp, 0);
  obj->store = NULL;
  sk_store_obj_free(obj);
}

int sk_store_create_in(struct sk_store *st, int fd, uint64_t id, uint32_t owner_uid,
                       uint32_t flags, const struct sk_kv_params *params,
                       const struct sk_sampler_state *sampler, struct sk_store_obj **ret,
                       struct sk_error *err) {
  int rc = sk_kv_params_check(params, SK_KV_MAX_CAPACITY, err);
  if (rc < 0) return rc;
  struct sk_store_obj *obj = NULL;
  rc = sk__create_tmp(st, fd, id, owner_uid, flags, st->shape.kv_type,
                      sk_kv_params_capacity(params), params->policy, &obj, err);
  if (rc < 0) return rc;
  const struct sk_store_header *h = obj->hdr;
  char *c = sk__copy(obj, 0);
  struct sk_store_meta *m = (struct sk_store_meta *)(void *)c;
  rc = sk_kv_init_split(&obj->kv, c + m->off_kv, (size_t)(m->off_logits - m->off_kv),
                        (char *)obj->map + h->off_data, (size_t)h->data_size, st->shape, params,
                        err);
  if (rc < 0) {
    sk__discard_tmp(st, obj);
    return rc;
  }
  obj->meta = m;
  sk_store_sampler_set(obj, sampler);
  m->sparsity = params->sparsity;
  m->spec_mode = params->spec_mode;
  m->spec_tokens = params->spec_tokens;
  m->spec_fixed = params->spec_fixed;
  rc = sk__finish_create(st, obj, 1, err);
  if (rc < 0) return rc;
  *ret = obj;
  return 0;
}

int sk_store_create(struct sk_store *st, uint64_t id, uint32_t owner_uid, uint32_t flags,
                    const struct sk_kv_params *params,
                    const struct sk_sampler_state *sampler, struct sk_store_obj **ret,
                    struct sk_error *err) {
  int fd = sk_store_create_file(st, id, err);
  if (fd < 0) return fd;
  int rc = sk_store_create_in(st, fd, id, owner_uid, flags, params, sampler, ret, err);
  sk_store_create_end(st, fd, id);
  return rc;
}

/* Copies meta copy bytes [16, M) from src into copy 0 of a new object of
 * the same geometry and attaches its KV view (data part of obj). */
static int sk__adopt_meta(struct sk_store_obj *obj, const void *src_copy, struct sk_error *err) {
  const struct sk_store_header *h = obj->hdr;
  char *c = sk__copy(obj, 0);
  memcpy(c + 16, (const char *)src_copy + 16, (size_t)h->meta_size - 16);
  struct sk_store_meta *m = (struct sk_store_meta *)(void *)c;
  obj->meta = m;
  obj->logits = (float *)(void *)(c + m->off_logits);
  struct sk_error kerr;
  int rc = sk_kv_attach_split(&obj->kv, c + m->off_kv, (size_t)(m->off_logits - m->off_kv),
                              (char *)obj->map + h->off_data, (size_t)h->data_size, &kerr);
  if (rc < 0) return sk__bad(err, "meta copy: %s", kerr.message);
  return 0;
}

int sk_store_fork(struct sk_store *st, const struct sk_store_obj *src, uint64_t id,
                  uint32_t owner_uid, struct sk_store_obj **ret, struct sk_error *err) {
  struct sk_store_obj *obj = NULL;
  int rc = sk__create_tmp_own(st, id, owner_uid, src->hdr->kv_type, src->hdr->capacity,
                              src->hdr->policy, &obj, err);
  if (rc < 0) return rc;
  rc = sk__adopt_meta(obj, sk__copy(src, src->live), err);
  if (rc < 0) {
    sk__discard_tmp(st, obj);
    return rc;
  }
  /* The K/V rows of the resident slots (same slots: the order is kept). */
  const struct sk_kv *skv = &src->kv;
  const size_t row = sk_kv_row_bytes(skv);
  for (uint32_t l = 0; l < st->shape.n_layer; l++)
    for (uint32_t p = 0; p < skv->hdr->n_resident; p++) {
      uint32_t slot = skv->order[p];
      memcpy(sk_kv_krow(&obj->kv, l, slot), sk_kv_krow(skv, l, slot), row);
      memcpy(sk_kv_vrow(&obj->kv, l, slot), sk_kv_vrow(skv, l, slot), row);
    }
  obj->meta->steps = 0;
  rc = sk__finish_create(st, obj, 1, err);
  if (rc < 0) return rc;
  *ret = obj;
  return 0;
}

/* ---- export / import ------------------------------------------------- */

static uint64_t sk__image_header_sum(const struct sk_store_image *im) {
  return XXH3_64bits(im, offsetof(struct sk_store_image, header_checksum));
}

size_t sk_store_export_size(const struct sk_store_obj *src) {
  const struct sk_kv_header *kh = src->kv.hdr;
  return sizeof(struct sk_store_image) + (size_t)src->hdr->meta_size +
         2 * (size_t)kh->n_layer * kh->n_resident * sk_kv_row_bytes(&src->kv);
}

void sk_store_export(const struct sk_store_obj *src, void *buf, size_t size) {
  const struct sk_store_header *h = src->hdr;
  const struct sk_kv *kv = &src->kv;
  const uint32_t nr = kv->hdr->n_resident;
  struct sk_store_image *im = buf;
  memset(im, 0, sizeof *im);
  memcpy(im->magic, SK__IMAGE_MAGIC, 8);
  im->version = SK_STORE_IMAGE_VERSION;
  im->header_size = sizeof *im;
  memcpy(im->model_fp, h->model_fp, SK_STORE_FP_SIZE);
  im->n_vocab = h->n_vocab;
  im->n_layer = h->n_layer;
  im->kv_dim = h->kv_dim;
  im->capacity = h->capacity;
  im->policy = h->policy;
  im->n_resident = nr;
  im->meta_size = h->meta_size;
  im->rows_size = 2 * (uint64_t)h->n_layer * nr * sk_kv_row_bytes(kv);
  im->total_size = size;
  char *p = (char *)buf + sizeof *im;
  memcpy(p, sk__copy(src, src->live), (size_t)h->meta_size);
  p += h->meta_size;
  const size_t row = sk_kv_row_bytes(kv);
  for (uint32_t l = 0; l < h->n_layer; l++)
    for (uint32_t q = 0; q < nr; q++, p += row) memcpy(p, sk_kv_krow(kv, l, kv->order[q]), row);
  for (uint32_t l = 0; l < h->n_layer; l++)
    for (uint32_t q = 0; q < nr; q++, p += row) memcpy(p, sk_kv_vrow(kv, l, kv->order[q]), row);
  im->body_checksum = XXH3_64bits((const char *)buf + sizeof *im, size - sizeof *im);
  im->header_checksum = sk__image_header_sum(im);
}

int sk_store_image_check(const struct sk_store *st, const void *buf, size_t len,
                         struct sk_store_image_info *ret, struct sk_error *err) {
  const struct sk_store_image *im = buf;
  if (len < sizeof *im)
    return sk__bad(err, "export file truncated: %zu bytes, smaller than its %zu-byte header",
                   len, sizeof *im);
  if (memcmp(im->magic, SK__IMAGE_MAGIC, 8) != 0)
    return sk__bad(err, "not a sinkd export file (bad magic)");
  if (im->header_checksum != sk__image_header_sum(im))
    return sk__bad(err, "export file corrupted: header checksum mismatch");
  if (im->version != SK_STORE_IMAGE_VERSION)
    return sk__bad(err, "export file version %u, this sinkd reads version %u", im->version,
                   SK_STORE_IMAGE_VERSION);
  if (im->header_size != sizeof *im)
    return sk__bad(err, "export file header_size %u, version %u's is %zu", im->header_size,
                   SK_STORE_IMAGE_VERSION, sizeof *im);
  if (im->total_size != len)
    return sk__bad(err, "export file %s: %zu bytes, its header says %" PRIu64,
                   len < im->total_size ? "truncated" : "has extra bytes", len,
                   im->total_size);
  if (im->body_checksum != XXH3_64bits((const char *)buf + sizeof *im, len - sizeof *im))
    return sk__bad(err, "export file corrupted: body checksum mismatch");
  if (memcmp(im->model_fp, st->fp, SK_STORE_FP_SIZE) != 0) {
    char a[33], b[33];
    sk_store_fp_hex(im->model_fp, a);
    sk_store_fp_hex(st->fp, b);
    return sk__bad(err, "export file is for another model (fingerprint %s, loaded model %s)",
                   a, b);
  }
  /* An image of another KV layout version (other slot counts, so other
   * offsets and sizes) is named as such before its
   * geometry is compared with this daemon's. The body checksum matched, so
   * the bytes are the exporter's; bounds are checked all the same. */
  {
    struct sk_store_meta m0;
    struct sk_kv_header k0;
    const uint64_t body = len - sizeof *im;
    const uint64_t room = im->meta_size < body ? im->meta_size : body;
    if (room >= sizeof m0) {
      memcpy(&m0, (const char *)buf + sizeof *im, sizeof m0);
      if (m0.magic == SK_STORE_META_MAGIC && room >= sizeof k0 &&
          m0.off_kv <= room - sizeof k0) {
        memcpy(&k0, (const char *)buf + sizeof *im + m0.off_kv, sizeof k0);
        if (k0.magic == SK_KV_MAGIC && k0.layout_version != SK_KV_LAYOUT_VERSION)
          return sk__bad(err, "export file holds a KV cache of layout version %u, this sinkd "
                         "reads version %u (export it again with the sinkd that wrote it, or "
                         "start over)",
                         k0.layout_version, SK_KV_LAYOUT_VERSION);
      }
    }
  }
  struct sk__geom g;
  if (im->n_vocab != st->n_vocab || im->n_layer != st->shape.n_layer ||
      im->kv_dim != st->shape.kv_dim)
    return sk__bad(err, "export file shape (n_vocab %u, n_layer %u, kv_dim %u) does not fit the "
                   "loaded model (n_vocab %u, n_layer %u, kv_dim %u)",
                   im->n_vocab, im->n_layer, im->kv_dim, st->n_vocab, st->shape.n_layer,
                   st->shape.kv_dim);
  if (!sk__geom(st, SK_KV_F32, im->capacity, &g))
    return sk__bad(err, "export file capacity %u is not a cache size this sinkd makes "
                   "(1 to %u tokens)",
                   im->capacity, (unsigned)SK_KV_MAX_CAPACITY);
  if (im->meta_size != g.meta_size)
    return sk__bad(err, "export file meta_size %" PRIu64 ", a cache of capacity %u has %" PRIu64,
                   im->meta_size, im->capacity, g.meta_size);
  if (!sk_policy_name(im->policy))
    return sk__bad(err, "export file policy %u is unknown", im->policy);
  /* The rows may be of either KV type (the image header does not name
   * it; the meta copy's cache header does, below), and so may the
   * session imported: the meta part's geometry is the same for both. */
  const uint64_t rows_elems = 2 * (uint64_t)im->n_layer * im->n_resident * im->kv_dim;
  if (im->n_resident > im->capacity)
    return sk__bad(err, "export file n_resident %u exceeds its capacity %u", im->n_resident,
                   im->capacity);
  if (im->rows_size != rows_elems * sk_kv_type_size(SK_KV_F32) &&
      im->rows_size != rows_elems * sk_kv_type_size(SK_KV_F16))
    return sk__bad(err, "export file rows_size %" PRIu64 ": %u resident tokens need %" PRIu64
                   " (f32) or %" PRIu64 " (f16)",
                   im->rows_size, im->n_resident, rows_elems * sk_kv_type_size(SK_KV_F32),
                   rows_elems * sk_kv_type_size(SK_KV_F16));
  if (im->total_size != sizeof *im + im->meta_size + im->rows_size)
    return sk__bad(err, "export file total_size %" PRIu64 " is not header %zu + meta_size %" PRIu64
                   " + rows_size %" PRIu64,
                   im->total_size, sizeof *im, im->meta_size, im->rows_size);
  const char *copy = (const char *)buf + sizeof *im;
  /* The meta copy must be 64-byte aligned to be read as structs: check it
   * in an aligned buffer. */
  void *meta = aligned_alloc(64, (size_t)g.meta_size);
  if (!meta) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  memcpy(meta, copy, (size_t)g.meta_size);
  uint64_t commit;
  struct sk_store_header h = {.meta_size = g.meta_size};
  int rc = 0;
  if (sk__copy_state(&h, &g, meta, &commit) != 1) {
    rc = sk__bad(err, "export file: its meta copy is not valid");
    goto out;
  }
  const struct sk_store_meta *m = meta;
  const struct sk_kv_header *kh =
      (const struct sk_kv_header *)(const void *)((const char *)meta + m->off_kv);
  if (kh->magic == SK_KV_MAGIC && !sk_kv_type_name(kh->kv_type)) {
    rc = sk__bad(err, "export file holds a KV cache of unknown type %u", kh->kv_type);
    goto out;
  }
  if (kh->magic != SK_KV_MAGIC || kh->capacity != im->capacity || kh->policy != im->policy ||
      kh->n_resident != im->n_resident || kh->n_layer != im->n_layer ||
      kh->kv_dim != im->kv_dim || !sk__geom(st, kh->kv_type, im->capacity, &g)) {
    rc = sk__bad(err, "export file: its cache header disagrees with the file header");
    goto out;
  }
  if (im->rows_size != rows_elems * sk_kv_type_size(kh->kv_type)) {
    rc = sk__bad(err, "export file sizes are inconsistent: %" PRIu64 " bytes of rows, not "
                 "those of kv_type %s (its cache header's)",
                 im->rows_size, sk_kv_type_name(kh->kv_type));
    goto out;
  }
  if (ret) {
    ret->policy = im->policy;
    ret->capacity = im->capacity;
    ret->n_resident = im->n_resident;
    ret->n_seen = kh->n_seen;
    ret->kv_type = kh->kv_type;
    ret->object_size = (size_t)g.total;
  }
out:
  free(meta);
  return rc;
}

int sk_store_import(struct sk_store *st, const void *buf, size_t len, uint64_t id,
                    uint32_t owner_uid, struct sk_store_obj **ret, struct sk_error *err) {
  struct sk_store_image_info info;
  int rc = sk_store_image_check(st, buf, len, &info, err);
  if (rc < 0) return rc;
  const struct sk_store_image *im = buf;
  struct sk_store_obj *obj = NULL;
  rc = sk__create_tmp_own(st, id, owner_uid, info.kv_type, im->capacity, im->policy, &obj, err);
  if (rc < 0) return rc;
  const char *p = (const char *)buf + sizeof *im;
  rc = sk__adopt_meta(obj, p, err);
  if (rc < 0) goto fail;
  p += im->meta_size;
  struct sk_kv *kv = &obj->kv;
  const uint32_t nr = kv->hdr->n_resident;
  const size_t row = sk_kv_row_bytes(kv);
  for (uint32_t l = 0; l < im->n_layer; l++)
    for (uint32_t q = 0; q < nr; q++, p += row) memcpy(sk_kv_krow(kv, l, kv->order[q]), p, row);
  for (uint32_t l = 0; l < im->n_layer; l++)
    for (uint32_t q = 0; q < nr; q++, p += row) memcpy(sk_kv_vrow(kv, l, kv->order[q]), p, row);
  /* Check the result exactly as adoption would. */
  uint64_t commit = ((const struct sk_store_meta *)(const void *)((const char *)buf +
                                                                  sizeof *im))->commit;
  obj->live = 0;
  sk__seal(obj, 0, commit);
  rc = sk__check_live(st, obj, err);
  if (rc < 0) goto fail;
  /* Copy 1 a sealed copy of copy 0 (same commit), as adoption tidies a
   * dropped step's copy: left at commit 0 beside a commit above 1, it
   * would read as a step the daemon died in. */
  memcpy(sk__copy(obj, 1) + 16, sk__copy(obj, 0) + 16, (size_t)obj->hdr->meta_size - 16);
  sk__seal(obj, 1, commit);
  rc = sk__finish_create(st, obj, commit, err);
  if (rc < 0) return rc;
  *ret = obj;
  return 0;
fail:
  sk__discard_tmp(st, obj);
  return rc;
}

bool sk_store_has_logits(const struct sk_store_obj *obj) {
  return (obj->meta->flags & SK_STORE_HAS_LOGITS) != 0;
}

void sk_store_set_logits(struct sk_store_obj *obj, const float *logits) {
  if (logits) memcpy(obj->logits, logits, (size_t)obj->hdr->n_vocab * sizeof *obj->logits);
  obj->meta->flags |= SK_STORE_HAS_LOGITS;
}
