/* Checking a session object of the store (store.h) and scanning the state
 * directory: each copy's header, checksums and live state, and what is
 * adopted or set aside. */
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

/* The largest speculation mode a meta copy may hold: SK_SPEC_LIST's
 * values are 0, 1, 2, ... */
#define SK__SPEC_ONE(NAME, value, wire) +1
enum { SK__SPEC_MODE_MAX = 0 SK_SPEC_LIST(SK__SPEC_ONE) - 1 };
#undef SK__SPEC_ONE

/* ---- checking an object ---------------------------------------------- */

int sk__bad(struct sk_error *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = sk_error_setv(err, SK_ERR_BAD_REQUEST, fmt, ap);
  va_end(ap);
  return rc;
}

/* Meta copy i: 1 valid (commit in *ret_commit), 0 not committed (commit
 * 0: it was being written), -1 corrupt (commit != 0, checksum or layout
 * wrong). */
int sk__copy_state(const struct sk_store_header *h, const struct sk__geom *g,
                   const char *copy, uint64_t *ret_commit) {
  const struct sk_store_meta *m = (const struct sk_store_meta *)(const void *)copy;
  *ret_commit = m->commit;
  if (m->commit == 0) return 0;
  if (m->checksum != sk__meta_sum(copy, h->meta_size, m->commit)) return -1;
  if (m->magic != SK_STORE_META_MAGIC || m->off_kv != g->off_kv ||
      m->off_logits != g->off_logits || m->off_sum != g->off_sum)
    return -1;
  return 1;
}

/* Checks the fixed header against this store and the file size; fills g. */
static int sk__check_header(const struct sk_store *st, const void *map, size_t size,
                            struct sk__geom *g, struct sk_error *err) {
  if (size < SK_STORE_PAGE)
    return sk__bad(err, "truncated: %zu bytes, smaller than the %u-byte header page", size,
                   SK_STORE_PAGE);
  const struct sk_store_header *h = map;
  if (memcmp(h->magic, SK__STORE_MAGIC, 8) != 0)
    return sk__bad(err, "not a sinkd session object (bad magic)");
  if (h->header_checksum != sk__header_sum(h))
    return sk__bad(err, "header checksum mismatch (corrupted header)");
  if (h->layout_version != SK_STORE_LAYOUT_VERSION)
    return sk__bad(err, "layout version %u, this sinkd reads version %u", h->layout_version,
                   SK_STORE_LAYOUT_VERSION);
  if (h->header_size != sizeof(struct sk_store_header))
    return sk__bad(err, "header size %u, expected %zu", h->header_size,
                   sizeof(struct sk_store_header));
  if (h->kv_layout_version != SK_KV_LAYOUT_VERSION)
    return sk__bad(err, "KV layout version %u, this sinkd uses %u", h->kv_layout_version,
                   SK_KV_LAYOUT_VERSION);
  if (memcmp(h->model_fp, st->fp, SK_STORE_FP_SIZE) != 0) {
    char a[33], b[33];
    sk_store_fp_hex(h->model_fp, a);
    sk_store_fp_hex(st->fp, b);
    return sk__bad(err, "model fingerprint %s is not the loaded model's %s (other model)", a, b);
  }
  if (h->n_vocab != st->n_vocab || h->n_layer != st->shape.n_layer ||
      h->kv_dim != st->shape.kv_dim)
    return sk__bad(err, "shape n_vocab %u, n_layer %u, kv_dim %u differs from the model's "
                   "%u, %u, %u",
                   h->n_vocab, h->n_layer, h->kv_dim, st->n_vocab, st->shape.n_layer,
                   st->shape.kv_dim);
  /* Either type is adopted, whatever kv_type new sessions get. */
  if (!sk_kv_type_name(h->kv_type))
    return sk__bad(err, "its KV cache is of unknown type %u (corrupted?)", h->kv_type);
  if (h->flags & ~SK_STORE_TEMPORARY)
    return sk__bad(err, "unknown header flags 0x%x (a newer sinkd's file?)",
                   h->flags & ~SK_STORE_TEMPORARY);
  for (size_t i = 0; i < sizeof h->reserved; i++)
    if (h->reserved[i])
      return sk__bad(err, "reserved header byte %zu is not zero (a newer sinkd's file?)",
                     offsetof(struct sk_store_header, reserved) + i);
  if (!sk_policy_name(h->policy)) return sk__bad(err, "policy %u is unknown", h->policy);
  if (!sk__geom(st, h->kv_type, h->capacity, g))
    return sk__bad(err, "capacity %u is invalid", h->capacity);
  if (h->meta_size != g->meta_size || h->off_meta[0] != g->off_meta[0] ||
      h->off_meta[1] != g->off_meta[1] || h->off_data != g->off_data ||
      h->data_size != g->kv_data || h->total_size != g->total)
    return sk__bad(err, "section offsets do not match capacity %u and kv_type %s", h->capacity,
                   sk_kv_type_name(h->kv_type));
  if (h->total_size != size)
    return sk__bad(err, "%s: file is %zu bytes, header says %" PRIu64,
                   size < h->total_size ? "truncated" : "wrong size", size, h->total_size);
  return 0;
}

/* Whether the K and V rows of a slot hold only finite values: 0, or 'K'
 * / 'V' with the first non-finite element's layer and index. f16: an
 * exponent of all ones is an infinity or a NaN (IEEE 754 binary16). */
static char sk__rows_finite(const struct sk_kv *kv, uint32_t slot, int *ret_layer,
                            uint32_t *ret_i) {
  const uint32_t d = kv->hdr->kv_dim;
  const bool f16 = kv->hdr->kv_type == SK_KV_F16;
  for (int side = 0; side < 2; side++)
    for (uint32_t l = 0; l < kv->hdr->n_layer; l++) {
      const void *row = side == 0 ? sk_kv_krow(kv, l, slot) : sk_kv_vrow(kv, l, slot);
      for (uint32_t i = 0; i < d; i++) {
        bool ok = f16 ? (((const uint16_t *)row)[i] & 0x7c00u) != 0x7c00u
                      : isfinite(((const float *)row)[i]);
        if (!ok) {
          *ret_layer = (int)l;
          *ret_i = i;
          return side == 0 ? 'K' : 'V';
        }
      }
    }
  return 0;
}

/* Checks the kv meta part of copy `c` (which must be the live one) and
 * every resident slot against the data and its checksum; obj->kv shows it
 * afterwards. */
int sk__check_live(const struct sk_store *st, struct sk_store_obj *obj,
                   struct sk_error *err) {
  const struct sk_store_header *h = obj->hdr;
  char *c = sk__copy(obj, obj->live);
  const struct sk_store_meta *m = (const struct sk_store_meta *)(const void *)c;
  struct sk_error kerr;
  int rc = sk_kv_attach_split(&obj->kv, c + m->off_kv, (size_t)(m->off_logits - m->off_kv),
                              (char *)obj->map + h->off_data, (size_t)h->data_size, &kerr);
  if (rc < 0) return sk__bad(err, "live meta copy: %s", kerr.message);
  const struct sk_kv_header *kh = obj->kv.hdr;
  if (kh->capacity != h->capacity || kh->policy != h->policy ||
      kh->n_layer != h->n_layer || kh->kv_dim != h->kv_dim || kh->kv_type != h->kv_type) {
    const char *kt = sk_kv_type_name(kh->kv_type);
    return sk__bad(err, "live meta copy: cache header (capacity %u, policy %u, n_layer %u, "
                   "kv_dim %u, kv_type %s) disagrees with the object header (capacity %u, "
                   "policy %u, n_layer %u, kv_dim %u, kv_type %s)",
                   kh->capacity, kh->policy, kh->n_layer, kh->kv_dim, kt ? kt : "unknown",
                   h->capacity, h->policy, h->n_layer, h->kv_dim, sk_kv_type_name(h->kv_type));
  }
  if (m->flags & ~SK_STORE_HAS_LOGITS)
    return sk__bad(err, "live meta copy: unknown flags 0x%x", m->flags);
  struct sk_sampler_params sp = {.temperature = m->temperature, .top_k = m->top_k,
                                 .top_p = m->top_p, .seed = m->seed};
  if (sk_sampler_params_check(&sp, &kerr) < 0)
    return sk__bad(err, "live meta copy: sampler: %s", kerr.message);
  if (!sk_utf8_held_valid(m->utf8_held, m->n_utf8_held))
    return sk__bad(err, "live meta copy: utf8_held (%u bytes: %02x %02x %02x %02x) is not the "
                   "start of a UTF-8 character",
                   m->n_utf8_held, m->utf8_held[0], m->utf8_held[1], m->utf8_held[2],
                   m->utf8_held[3]);
  if (!(m->sparsity >= 0.0f && m->sparsity < 1.0f))
    return sk__bad(err, "live meta copy: sparsity %g is outside [0, 1)", (double)m->sparsity);
  if (m->spec_mode > SK__SPEC_MODE_MAX || m->spec_tokens > SK_SPEC_TOKENS_MAX ||
      m->spec_fixed > 1)
    return sk__bad(err, "live meta copy: speculation mode %u, tokens %u, fixed %u: one is "
                   "outside its range (mode 0..%u, tokens 0..%u, fixed 0..1)",
                   m->spec_mode, m->spec_tokens, m->spec_fixed, SK__SPEC_MODE_MAX,
                   SK_SPEC_TOKENS_MAX);
  for (size_t i = 0; i < sizeof m->reserved; i++)
    if (m->reserved[i])
      return sk__bad(err, "live meta copy: reserved byte %zu is not zero (a newer sinkd's "
                     "file?)", offsetof(struct sk_store_meta, reserved) + i);
  if ((m->flags & SK_STORE_HAS_LOGITS) && kh->n_resident == 0)
    return sk__bad(err, "live meta copy: logits without a resident token");
  /* Sampling from a NaN or an infinity picks token 0 (or any): such a
   * session was not written by a working sinkd. */
  if (m->flags & SK_STORE_HAS_LOGITS) {
    const float *lg = (const float *)(const void *)(c + m->off_logits);
    for (uint32_t i = 0; i < h->n_vocab; i++)
      if (!isfinite(lg[i]))
        return sk__bad(err, "live meta copy: logits[%u] is %g (not finite)", i, (double)lg[i]);
  }
  sk__view(obj, obj->live);
  const uint64_t *sums = sk__sums(obj);
  uint64_t prev = 0;
  /* Keys stored rotated at their stream index (every policy but h2o /
   * sink_h2o, kvcache.h) are read assuming the sinks are consecutive
   * stream indices, and so is the rest, ending at n_seen - 1: the forward
   * pass derives every distance from n_seen and the first sink's index. */
  const bool rotated = sk_policy_rotated(kh->policy);
  const uint32_t nr = kh->n_resident;
  const uint32_t sr = rotated ? (kh->n_sink < nr ? kh->n_sink : nr) : 0;
  const uint64_t t0 = nr ? obj->kv.index[obj->kv.order[0]] : 0;
  for (uint32_t p = 0; p < nr; p++) {
    uint32_t slot = obj->kv.order[p];
    int32_t tok = obj->kv.token[slot];
    uint64_t idx = obj->kv.index[slot];
    if (tok < 0 || (uint32_t)tok >= st->n_vocab)
      return sk__bad(err, "cache position %u holds token %d, outside the vocabulary", p, tok);
    if (idx >= kh->n_seen || (p > 0 && idx <= prev))
      return sk__bad(err, "cache position %u holds stream index %" PRIu64
                     " (out of order or beyond n_seen %" PRIu64 ")",
                     p, idx, kh->n_seen);
    if (rotated && idx != (p < sr ? t0 + p : kh->n_seen - nr + p))
      return sk__bad(err, "cache position %u holds stream index %" PRIu64 ", but its key is "
                     "stored rotated and n_seen %" PRIu64 " puts it at %" PRIu64,
                     p, idx, kh->n_seen, p < sr ? t0 + p : kh->n_seen - nr + p);
    prev = idx;
    int bad_layer = -1;
    uint32_t bad_i = 0;
    char which = sk__rows_finite(&obj->kv, slot, &bad_layer, &bad_i);
    if (which)
      return sk__bad(err, "%c of cache position %u (slot %u, layer %d) element %u is not finite",
                     which, p, slot, bad_layer, bad_i);
    if (sums[slot] != sk__slot_sum(&obj->kv, slot))
      return sk__bad(err, "K/V of cache position %u (slot %u, stream index %" PRIu64
                     ") do not match their checksum",
                     p, slot, idx);
  }
  return 0;
}

/* Validates a mapped object fully; on success obj shows its live copy. */
static int sk__validate(const struct sk_store *st, struct sk_store_obj *obj,
                        struct sk_error *err) {
  struct sk__geom g;
  int rc = sk__check_header(st, obj->map, obj->size, &g, err);
  if (rc < 0) return rc;
  const struct sk_store_header *h = obj->hdr;
  uint64_t commit[2];
  int state[2];
  for (int i = 0; i < 2; i++)
    state[i] = sk__copy_state(h, &g, (const char *)obj->map + h->off_meta[i], &commit[i]);
  int live = -1;
  for (int i = 0; i < 2; i++)
    if (state[i] == 1 && (live < 0 || commit[i] > commit[live])) live = i;
  if (live < 0) {
    if (state[0] == -1 || state[1] == -1)
      return sk__bad(err, "no valid meta copy (checksum mismatch: corrupted)");
    return sk__bad(err, "no committed meta copy");
  }
  for (int i = 0; i < 2; i++)
    if (state[i] == -1 && commit[i] > commit[live])
      return sk__bad(err, "meta copy %d (commit %" PRIu64 ") is corrupted (checksum "
                     "mismatch) and newer than the valid copy (commit %" PRIu64 ")",
                     i, commit[i], commit[live]);
  obj->live = live;
  obj->dropped_step = state[1 - live] == 0 && commit[live] > 1;
  obj->id = h->session_id;
  obj->owner_uid = h->owner_uid;
  obj->flags = h->flags;
  int rc2 = sk__check_live(st, obj, err);
  if (rc2 == 0 && obj->dropped_step) {
    /* Tidy the dropped step's copy: make it a sealed copy of the live
     * one (same commit), so the next start does not report it again. A
     * crash while doing so leaves it at commit 0, as it was. */
    char *dst = sk__copy(obj, 1 - live), *src = sk__copy(obj, live);
    memcpy(dst + 16, src + 16, (size_t)h->meta_size - 16);
    sk__seal(obj, 1 - live, commit[live]);
    sk__view(obj, live);
  }
  return rc2;
}

static int sk__map_file(int fd, const char *what, struct sk_store_obj **ret,
                        struct sk_error *err) {
  struct stat sb;
  if (fstat(fd, &sb) < 0)
    return sk_error_set(err, SK_ERR_IO, "cannot stat %s: %s", what, strerror(errno));
  if (!S_ISREG(sb.st_mode)) return sk__bad(err, "not a regular file");
  if (sb.st_uid != geteuid())
    return sk__bad(err, "owned by uid %u, not by the daemon's uid %u", (unsigned)sb.st_uid,
                   (unsigned)geteuid());
  if ((uint64_t)sb.st_size > SIZE_MAX)
    return sk__bad(err, "file of %lld bytes is too large", (long long)sb.st_size);
  size_t size = (size_t)sb.st_size;
  if (size < SK_STORE_PAGE)
    return sk__bad(err, "truncated: %zu bytes, smaller than the %u-byte header page", size,
                   SK_STORE_PAGE);
  void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED)
    return sk_error_set(err, SK_ERR_IO, "cannot map %s: %s", what, strerror(errno));
  struct sk_store_obj *obj = calloc(1, sizeof *obj);
  if (!obj) {
    munmap(map, size);
    return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  }
  obj->map = map;
  obj->size = size;
  obj->hdr = map;
  *ret = obj;
  return 0;
}

void sk_store_obj_free(struct sk_store_obj *obj) {
  if (!obj) return;
  if (obj->map) munmap(obj->map, obj->size);
  free(obj);
}

void sk_store_obj_unlink(struct sk_store_obj *obj) {
  if (!obj || !obj->store) return;
  char name[64];
  sk__obj_name(name, sizeof name, obj->id, false);
  unlinkat(obj->store->dirfd, name, 0);
  obj->store = NULL;
}

void sk_store_obj_remove(struct sk_store_obj *obj) {
  if (!obj) return;
  sk_store_obj_unlink(obj);
  sk_store_obj_free(obj);
}

int sk_store_obj_check(struct sk_store *st, const char *path, struct sk_store_obj **ret,
                       struct sk_error *err) {
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return sk_error_set(err, SK_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct sk_store_obj *obj = NULL;
  int rc = sk__map_file(fd, path, &obj, err);
  close(fd);
  if (rc < 0) return rc;
  rc = sk__validate(st, obj, err);
  if (rc < 0) {
    sk_store_obj_free(obj);
    return rc;
  }
  *ret = obj;
  return 0;
}

/* ---- scan ------------------------------------------------------------ */

/* "session-<id>.skv" -> id (1 ..), or "...skv.tmp" with *ret_tmp; an
 * id past SK_SESSION_ID_MAX (or past 64 bits) gives *ret_id 0. */
static bool sk__parse_name(const char *name, uint64_t *ret_id, bool *ret_tmp) {
  const char *p = name;
  if (strncmp(p, "session-", 8) != 0) return false;
  p += 8;
  if (*p < '1' || *p > '9') return false;
  uint64_t id = 0;
  bool huge = false;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (id > (SK_SESSION_ID_MAX - 9) / 10) huge = true;
    else id = id * 10 + (uint64_t)(*p - '0');
  }
  if (strcmp(p, ".skv") == 0) *ret_tmp = false;
  else if (strcmp(p, ".skv.tmp") == 0) *ret_tmp = true;
  else return false;
  *ret_id = huge || id > SK_SESSION_ID_MAX ? 0 : id;
  return true;
}

static int sk__cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

bool sk_store_set_aside(struct sk_store *st, const char *name, char *dest, size_t dsize) {
  if (mkdirat(st->dirfd, SK_STORE_INVALID_DIR, 0700) < 0 && errno != EEXIST) return false;
  for (int i = 0; i < SK_LIMIT_SET_ASIDE_TRIES; i++) {
    if (i == 0)
      snprintf(dest, dsize, "%s/%s", SK_STORE_INVALID_DIR, name);
    else
      snprintf(dest, dsize, "%s/%s.%d", SK_STORE_INVALID_DIR, name, i);
    if (renameat2(st->dirfd, name, st->dirfd, dest, RENAME_NOREPLACE) == 0) return true;
    if (errno == EINVAL) {
      /* No RENAME_NOREPLACE on this file system: check, then rename. */
      struct stat sb;
      if (fstatat(st->dirfd, dest, &sb, AT_SYMLINK_NOFOLLOW) == 0) continue;
      if (renameat(st->dirfd, name, st->dirfd, dest) == 0) return true;
      return false;
    }
    if (errno != EEXIST) return false;
  }
  return false;
}

/* Opens, maps and validates one object of the state directory. */
static int sk__load(struct sk_store *st, const char *name, uint64_t id,
                    struct sk_store_obj **ret, struct sk_error *err) {
  int fd = openat(st->dirfd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return sk__bad(err, "cannot open: %s", strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) == 0 && sb.st_uid != geteuid()) {
    /* Planted by another user (a directory others may add to): its
     * header could name any owner. */
    close(fd);
    return sk__bad(err, "owned by uid %u, not by the daemon's uid %u", (unsigned)sb.st_uid,
                   (unsigned)geteuid());
  }
  struct sk_store_obj *obj = NULL;
  int rc = sk__map_file(fd, name, &obj, err);
  close(fd);
  if (rc < 0) return rc;
  rc = sk__validate(st, obj, err);
  if (rc == 0 && obj->id != id)
    rc = sk__bad(err, "header names session %" PRIu64 ", the file name %" PRIu64, obj->id, id);
  if (rc < 0) {
    sk_store_obj_free(obj);
    return rc;
  }
  obj->store = st;
  *ret = obj;
  return 0;
}

int sk_store_scan(struct sk_store *st, const struct sk_store_scan_cb *cb,
                  uint64_t *ret_max_id, struct sk_error *err) {
  int fd = dup(st->dirfd);
  if (fd < 0) return sk_error_set(err, SK_ERR_IO, "cannot read %s: %s", st->dir, strerror(errno));
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return sk_error_set(err, SK_ERR_IO, "cannot read %s: %s", st->dir, strerror(errno));
  }
  rewinddir(d);
  uint64_t *ids = NULL;
  size_t n = 0, cap = 0;
  uint64_t max_id = 0;
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    uint64_t id;
    bool tmp;
    if (!sk__parse_name(de->d_name, &id, &tmp)) continue;
    if (id == 0 && !tmp) {
      /* Beyond the largest id: not an object this daemon made. (Moved
       * into a subfolder while the listing goes on: it is not seen
       * again.) */
      char dest[300], why[96];
      snprintf(why, sizeof why, "the id is larger than the largest session id, %" PRIu64,
               (uint64_t)SK_SESSION_ID_MAX);
      if (sk_store_set_aside(st, de->d_name, dest, sizeof dest))
        cb->skip(cb->user, de->d_name, SK_STORE_SET_ASIDE, dest, why);
      else
        cb->skip(cb->user, de->d_name, SK_STORE_KEPT, NULL, why);
      continue;
    }
    if (id > max_id) max_id = id;
    if (tmp) {
      if (unlinkat(st->dirfd, de->d_name, 0) == 0)
        cb->skip(cb->user, de->d_name, SK_STORE_REMOVED, NULL,
                 "unfinished creation (the daemon stopped before it was complete)");
      continue;
    }
    if (n == cap) {
      size_t nc = cap ? 2 * cap : 16;
      uint64_t *ni = realloc(ids, nc * sizeof *ni);
      if (!ni) {
        rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory listing %s", st->dir);
        goto out;
      }
      ids = ni;
      cap = nc;
    }
    ids[n++] = id;
  }
  /* An empty folder leaves ids NULL: qsort must not see it (UBSan). */
  if (n) qsort(ids, n, sizeof *ids, sk__cmp_u64);
  if (st->next_id > 0 && st->next_id - 1 > max_id) max_id = st->next_id - 1;
  for (size_t i = 0; i < n; i++) {
    char name[64];
    sk__obj_name(name, sizeof name, ids[i], false);
    struct sk_store_obj *obj = NULL;
    struct sk_error why;
    if (sk__load(st, name, ids[i], &obj, &why) == 0) {
      cb->adopt(cb->user, obj);
      continue;
    }
    char dest[128];
    if (sk_store_set_aside(st, name, dest, sizeof dest)) {
      cb->skip(cb->user, name, SK_STORE_SET_ASIDE, dest, why.message);
      if (cb->aside) cb->aside(cb->user, ids[i]);
    } else {
      cb->skip(cb->user, name, SK_STORE_KEPT, NULL, why.message);
    }
  }
out:
  free(ids);
  closedir(d);
  if (rc == 0 && ret_max_id) *ret_max_id = max_id;
  return rc;
}
