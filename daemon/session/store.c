/* Shared-memory session store (see store.h for the layout and the commit
 * protocol). */
#include "session/store.h"

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

#define SK__STORE_MAGIC "SINKDSHM"
#define SK__IMAGE_MAGIC "SINKDEXP"
#define SK__TMPFS_MAGIC 0x01021994
/* The largest speculation mode a meta copy may hold: SK_SPEC_LIST's
 * values are 0, 1, 2, ... */
#define SK__SPEC_ONE(NAME, value, wire) +1
enum { SK__SPEC_MODE_MAX = 0 SK_SPEC_LIST(SK__SPEC_ONE) - 1 };
#undef SK__SPEC_ONE
/* Bytes hashed at each end of every tensor for the fingerprint. */
#define SK__FP_TENSOR_SAMPLE 4096u

_Static_assert(sizeof(struct sk_store_header) == 256, "header is 256 bytes");
_Static_assert(sizeof(struct sk_store_meta) == 128, "meta start is 128 bytes");
_Static_assert(sizeof(struct sk_store_image) == 128, "image header is 128 bytes");
_Static_assert(sizeof(float) == 4, "float is 4 bytes");

struct sk_store {
  char *dir;
  int dirfd;
  int lockfd;         /* "lock": flock'd; holds the next session id */
  uint64_t next_id;   /* larger than every id ever created here (id_lock) */
  bool tmpfs;         /* the directory is on tmpfs (sk__populate_write) */
  pthread_mutex_t id_lock; /* objects are created on the event loop and
                              on its thread pool */
  uint8_t fp[SK_STORE_FP_SIZE];
  struct sk_kv_shape shape;
  uint32_t n_vocab;
};

/* ---- geometry -------------------------------------------------------- */

struct sk__geom {
  uint32_t capacity, n_slots;
  uint64_t kv_meta, kv_data;      /* parts of the KV block */
  uint64_t off_kv, off_logits, off_sum, meta_size;
  uint64_t off_meta[2], off_data, total;
};

static uint64_t sk__align(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* The geometry of an object of this store's model whose cache holds
 * capacity tokens of kv_type (enum sk_kv_type: the store's own for new
 * sessions, the source's for forks, imports and adopted objects). */
static bool sk__geom(const struct sk_store *st, uint32_t kv_type, uint32_t capacity,
                     struct sk__geom *g) {
  struct sk_kv_shape shape = st->shape;
  shape.kv_type = kv_type;
  size_t km, kd;
  if (!sk_kv_part_sizes(shape, capacity, &km, &kd)) return false;
  g->capacity = capacity;
  g->n_slots = capacity + SK_KV_SPARE_SLOTS;
  g->kv_meta = km;
  g->kv_data = kd;
  g->off_kv = sizeof(struct sk_store_meta);
  g->off_logits = sk__align(g->off_kv + km, 64);
  g->off_sum = sk__align(g->off_logits + (uint64_t)st->n_vocab * sizeof(float), 64);
  g->meta_size = sk__align(g->off_sum + (uint64_t)g->n_slots * sizeof(uint64_t),
                           SK_STORE_PAGE);
  g->off_meta[0] = SK_STORE_PAGE;
  g->off_meta[1] = SK_STORE_PAGE + g->meta_size;
  g->off_data = SK_STORE_PAGE + 2 * g->meta_size;
  if (kd > UINT64_MAX - g->off_data - SK_STORE_PAGE) return false;
  g->total = sk__align(g->off_data + kd, SK_STORE_PAGE);
  return g->total <= SIZE_MAX && g->total <= (uint64_t)INT64_MAX;
}

size_t sk_store_object_size(const struct sk_store *st, uint32_t capacity) {
  struct sk__geom g;
  return sk__geom(st, st->shape.kv_type, capacity, &g) ? (size_t)g.total : 0;
}

/* ---- checksums and fingerprint -------------------------------------- */

static uint64_t sk__header_sum(const struct sk_store_header *h) {
  return XXH3_64bits(h, offsetof(struct sk_store_header, header_checksum));
}

static uint64_t sk__meta_sum(const void *copy, uint64_t meta_size,
                             uint64_t commit) {
  return XXH3_64bits_withSeed((const char *)copy + 16, (size_t)meta_size - 16,
                              commit);
}

static uint64_t sk__slot_sum(const struct sk_kv *kv, uint32_t slot) {
  const size_t row = sk_kv_row_bytes(kv);
  uint64_t h = slot;
  for (uint32_t l = 0; l < kv->hdr->n_layer; l++)
    h = XXH3_64bits_withSeed(sk_kv_krow(kv, l, slot), row, h);
  for (uint32_t l = 0; l < kv->hdr->n_layer; l++)
    h = XXH3_64bits_withSeed(sk_kv_vrow(kv, l, slot), row, h);
  return h;
}

void sk_store_fingerprint(const struct sk_gguf *g,
                          uint8_t ret[SK_STORE_FP_SIZE]) {
  sk_store_fingerprint_runs(g, NULL, ret);
}

void sk_store_fingerprint_runs(const struct sk_gguf *g, const char *runs,
                               uint8_t ret[SK_STORE_FP_SIZE]) {
  size_t size = 0;
  const uint8_t *base = sk_gguf_bytes(g, &size);
  XXH3_state_t *s = XXH3_createState();
  if (!s) {
    /* Out of memory this early: fall back to a one-shot hash of the
     * header bytes and the size only (still a stable function of the
     * file). */
    XXH128_hash_t h = XXH3_128bits(base, (size_t)sk_gguf_data_offset(g));
    XXH128_canonicalFromHash((XXH128_canonical_t *)(void *)ret, h);
    return;
  }
  XXH3_128bits_reset(s);
  XXH3_128bits_update(s, base, (size_t)sk_gguf_data_offset(g));
  if (runs) {
    uint64_t n = strlen(runs);
    XXH3_128bits_update(s, &n, sizeof n);
    XXH3_128bits_update(s, runs, (size_t)n);
  }
  uint64_t size64 = size;
  XXH3_128bits_update(s, &size64, sizeof size64);
  for (uint64_t i = 0; i < sk_gguf_n_tensors(g); i++) {
    const struct sk_gguf_tensor *t = sk_gguf_tensor(g, i);
    size_t n = t->n_bytes < SK__FP_TENSOR_SAMPLE ? (size_t)t->n_bytes
                                                 : SK__FP_TENSOR_SAMPLE;
    XXH3_128bits_update(s, t->data, n);
    XXH3_128bits_update(s, (const char *)t->data + t->n_bytes - n, n);
  }
  XXH128_hash_t h = XXH3_128bits_digest(s);
  XXH3_freeState(s);
  XXH128_canonicalFromHash((XXH128_canonical_t *)(void *)ret, h);
}

void sk_store_fp_hex(const uint8_t fp[SK_STORE_FP_SIZE], char out[33]) {
  static const char hex[] = "0123456789abcdef";
  for (unsigned i = 0; i < SK_STORE_FP_SIZE; i++) {
    out[2 * i] = hex[fp[i] >> 4];
    out[2 * i + 1] = hex[fp[i] & 15];
  }
  out[32] = 0;
}

/* ---- the directory --------------------------------------------------- */

/* mkdir -p: missing parents 0755 (the socket may live in one of them,
 * e.g. /run/sinkd), the state directory itself 0700. */
static int sk__mkdirs(const char *path, struct sk_error *err) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf)
    return sk_error_set(err, SK_ERR_IO, "state directory path '%.64s' is empty or too long",
                        path);
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    if (mkdir(buf, c ? 0755 : 0700) < 0 && errno != EEXIST)
      return sk_error_set(err, SK_ERR_IO, "cannot create %s: %s", buf, strerror(errno));
    buf[i] = c;
  }
  return 0;
}

/* Takes the flock of dir's lock file (open as fd) without waiting.
 * Errors: -SK_ERR_BUSY (another process holds it), -SK_ERR_IO. */
static int sk__lock(int fd, const char *dir, struct sk_error *err) {
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
  if (errno == EWOULDBLOCK)
    return sk_error_set(err, SK_ERR_BUSY, "state directory %s is in use by another sinkd", dir);
  return sk_error_set(err, SK_ERR_IO, "cannot lock %s/lock: %s", dir, strerror(errno));
}

int sk_store_check_busy(const char *dir, struct sk_error *err) {
  char path[PATH_MAX];
  if ((size_t)snprintf(path, sizeof path, "%s/lock", dir) >= sizeof path)
    return 0; /* sk_store_open reports the path */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return 0; /* no lock file yet, or one sk_store_open will report */
  int rc = sk__lock(fd, dir, err);
  close(fd); /* releases the lock if it was taken */
  return rc == -SK_ERR_BUSY ? rc : 0; /* other errors: sk_store_open's to report */
}

int sk_store_open(const struct sk_store_config *cfg, struct sk_store **ret,
                  bool *ret_tmpfs, struct sk_error *err) {
  int rc = sk__mkdirs(cfg->dir, err);
  if (rc < 0) return rc;
  struct sk_store *st = calloc(1, sizeof *st);
  if (!st) return sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
  st->dirfd = st->lockfd = -1;
  pthread_mutex_init(&st->id_lock, NULL);
  st->dir = strdup(cfg->dir);
  if (!st->dir) {
    rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory");
    goto fail;
  }
  memcpy(st->fp, cfg->model_fp, SK_STORE_FP_SIZE);
  st->shape = cfg->shape;
  st->n_vocab = cfg->n_vocab;
  st->dirfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (st->dirfd < 0) {
    rc = sk_error_set(err, SK_ERR_IO, "cannot open state directory %s: %s", cfg->dir,
                      strerror(errno));
    goto fail;
  }
  struct stat sb;
  if (fstat(st->dirfd, &sb) < 0) {
    rc = sk_error_set(err, SK_ERR_IO, "cannot stat %s: %s", cfg->dir, strerror(errno));
    goto fail;
  }
  if (sb.st_uid != geteuid()) {
    rc = sk_error_set(err, SK_ERR_IO,
                      "state directory %s is owned by uid %u, not by the daemon's uid %u",
                      cfg->dir, (unsigned)sb.st_uid, (unsigned)geteuid());
    goto fail;
  }
  /* Others must not swap the files the daemon writes here (a symbolic
   * link where a file is about to be written). */
  if ((rc = sk_safefile_check_dir(st->dirfd, cfg->dir, err)) < 0) goto fail;
  st->lockfd = openat(st->dirfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (st->lockfd < 0) {
    rc = sk_error_set(err, SK_ERR_IO, "cannot open %s/lock: %s", cfg->dir, strerror(errno));
    goto fail;
  }
  rc = sk__lock(st->lockfd, cfg->dir, err);
  if (rc < 0) goto fail;
  char idbuf[32] = {0};
  ssize_t got = pread(st->lockfd, idbuf, sizeof idbuf - 1, 0);
  st->next_id = got > 0 ? strtoull(idbuf, NULL, 10) : 0;
  /* Every id up to the largest was used (or the file says more): none
   * is left, and none wraps around. */
  if (st->next_id > SK_SESSION_ID_MAX + 1) st->next_id = SK_SESSION_ID_MAX + 1;
  struct statfs fs;
  st->tmpfs = fstatfs(st->dirfd, &fs) == 0 && fs.f_type == SK__TMPFS_MAGIC;
  if (ret_tmpfs) *ret_tmpfs = st->tmpfs;
  *ret = st;
  return 0;
fail:
  sk_store_close(st);
  return rc;
}

void sk_store_close(struct sk_store *st) {
  if (!st) return;
  if (st->lockfd >= 0) close(st->lockfd); /* releases the flock */
  if (st->dirfd >= 0) close(st->dirfd);
  pthread_mutex_destroy(&st->id_lock);
  free(st->dir);
  free(st);
}

const char *sk_store_dir(const struct sk_store *st) { return st->dir; }
int sk_store_dirfd(const struct sk_store *st) { return st->dirfd; }

static void sk__obj_name(char *buf, size_t size, uint64_t id, bool tmp) {
  snprintf(buf, size, "session-%" PRIu64 ".skv%s", id, tmp ? ".tmp" : "");
}

/* ---- views ----------------------------------------------------------- */

static char *sk__copy(const struct sk_store_obj *obj, int i) {
  return (char *)obj->map + obj->hdr->off_meta[i];
}

/* Points the view at meta copy i (whose layout was checked). */
static void sk__view(struct sk_store_obj *obj, int i) {
  char *c = sk__copy(obj, i);
  struct sk_store_meta *m = (struct sk_store_meta *)(void *)c;
  obj->meta = m;
  obj->logits = (float *)(void *)(c + m->off_logits);
  sk_kv_rebind_meta(&obj->kv, c + m->off_kv);
}

static uint64_t *sk__sums(const struct sk_store_obj *obj) {
  return (uint64_t *)(void *)((char *)obj->meta + obj->meta->off_sum);
}

/* Release fence, then a store the compiler may not drop or move. */
static void sk__publish_u64(uint64_t *p, uint64_t v) {
  atomic_thread_fence(memory_order_seq_cst);
  *(volatile uint64_t *)p = v;
  atomic_thread_fence(memory_order_seq_cst);
}

/* Seals meta copy i: checksum first, then the commit counter (so a copy
 * with commit != 0 always has its checksum in place). */
static void sk__seal(struct sk_store_obj *obj, int i, uint64_t commit) {
  char *c = sk__copy(obj, i);
  struct sk_store_meta *m = (struct sk_store_meta *)(void *)c;
  sk__publish_u64(&m->checksum, sk__meta_sum(c, obj->hdr->meta_size, commit));
  sk__publish_u64(&m->commit, commit);
}

/* sk_store_begin, with or without the logits (the bytes [off_logits,
 * off_sum) of the copy, padding included). */
static void sk__begin(struct sk_store_obj *obj, bool logits) {
  int w = 1 - obj->live;
  char *dst = sk__copy(obj, w), *src = sk__copy(obj, obj->live);
  const struct sk_store_meta *m = (const struct sk_store_meta *)(const void *)src;
  sk__publish_u64(&((struct sk_store_meta *)(void *)dst)->commit, 0);
  if (logits) {
    memcpy(dst + 16, src + 16, (size_t)obj->hdr->meta_size - 16);
  } else {
    memcpy(dst + 16, src + 16, (size_t)m->off_logits - 16);
    memcpy(dst + m->off_sum, src + m->off_sum, (size_t)(obj->hdr->meta_size - m->off_sum));
  }
  obj->step_seen = obj->kv.hdr->n_seen;
  sk__view(obj, w);
  obj->in_step = true;
}

void sk_store_begin(struct sk_store_obj *obj) { sk__begin(obj, true); }

void sk_store_begin_decode(struct sk_store_obj *obj) { sk__begin(obj, false); }

void sk_store_keep_logits(struct sk_store_obj *obj) {
  if (!obj->in_step) return;
  const char *src = sk__copy(obj, obj->live);
  const struct sk_store_meta *m = (const struct sk_store_meta *)(const void *)src;
  memcpy((char *)obj->meta + m->off_logits, src + m->off_logits,
         (size_t)(m->off_sum - m->off_logits));
}

void sk_store_commit(struct sk_store_obj *obj) {
  if (!obj->in_step) return;
  int w = 1 - obj->live;
  /* The tokens this step made resident sit at the end of the cache
   * positions, with stream indices from the live copy's n_seen on. */
  uint64_t *sums = sk__sums(obj);
  const struct sk_kv *kv = &obj->kv;
  for (uint32_t p = kv->hdr->n_resident; p-- > 0;) {
    uint32_t slot = kv->order[p];
    if (kv->index[slot] < obj->step_seen) break;
    sums[slot] = sk__slot_sum(kv, slot);
  }
  obj->meta->steps++;
  uint64_t commit = sk_store_commit_count(obj) + 1;
  sk__seal(obj, w, commit);
  obj->live = w;
  obj->in_step = false;
}

void sk_store_abort(struct sk_store_obj *obj) {
  if (!obj->in_step) return;
  sk__view(obj, obj->live);
  obj->in_step = false;
}

uint64_t sk_store_commit_count(const struct sk_store_obj *obj) {
  const struct sk_store_meta *m =
      (const struct sk_store_meta *)(const void *)sk__copy(obj, obj->live);
  return m->commit;
}

void sk_store_sampler_get(const struct sk_store_obj *obj,
                          struct sk_sampler_state *ret) {
  const struct sk_store_meta *m = obj->meta;
  memset(ret, 0, sizeof *ret);
  ret->params.temperature = m->temperature;
  ret->params.top_k = m->top_k;
  ret->params.top_p = m->top_p;
  ret->params.seed = m->seed;
  memcpy(ret->rng, m->rng, sizeof ret->rng);
}

void sk_store_sampler_set(struct sk_store_obj *obj,
                          const struct sk_sampler_state *s) {
  struct sk_store_meta *m = obj->meta;
  m->temperature = s->params.temperature;
  m->top_k = s->params.top_k;
  m->top_p = s->params.top_p;
  m->seed = s->params.seed;
  memcpy(m->rng, s->rng, sizeof m->rng);
}

void sk_store_utf8_get(const struct sk_store_obj *obj, struct sk_utf8_stream *ret) {
  const struct sk_store_meta *m = obj->meta;
  sk_utf8_stream_init(ret);
  uint8_t n = m->n_utf8_held < sizeof ret->held ? m->n_utf8_held : 0;
  memcpy(ret->held, m->utf8_held, n);
  ret->n_held = n;
}

void sk_store_utf8_set(struct sk_store_obj *obj, const struct sk_utf8_stream *s) {
  struct sk_store_meta *m = obj->meta;
  memset(m->utf8_held, 0, sizeof m->utf8_held);
  memcpy(m->utf8_held, s->held, s->n_held);
  m->n_utf8_held = s->n_held;
}

/* ---- checking an object ---------------------------------------------- */

static int sk__bad(struct sk_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int sk__bad(struct sk_error *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = sk_error_setv(err, SK_ERR_BAD_REQUEST, fmt, ap);
  va_end(ap);
  return rc;
}

/* Meta copy i: 1 valid (commit in *ret_commit), 0 not committed (commit
 * 0: it was being written), -1 corrupt (commit != 0, checksum or layout
 * wrong). */
static int sk__copy_state(const struct sk_store_header *h, const struct sk__geom *g,
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
static int sk__check_live(const struct sk_store *st, struct sk_store_obj *obj,
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
