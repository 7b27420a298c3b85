/* Shared-memory session store (see store.h for the layout and the commit
 * protocol): an object's geometry and checksums, the model's fingerprint,
 * the state directory and its lock, and the commit protocol on an
 * object's two meta copies. Checking and scanning objects is
 * store_check.c; creating, forking, exporting and importing them
 * store_create.c. */
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

#define SK__TMPFS_MAGIC 0x01021994
/* Bytes hashed at each end of every tensor for the fingerprint. */
#define SK__FP_TENSOR_SAMPLE 4096u

_Static_assert(sizeof(struct sk_store_header) == 256, "header is 256 bytes");
_Static_assert(sizeof(struct sk_store_meta) == 128, "meta start is 128 bytes");
_Static_assert(sizeof(struct sk_store_image) == 128, "image header is 128 bytes");
_Static_assert(sizeof(float) == 4, "float is 4 bytes");

/* ---- geometry -------------------------------------------------------- */

static uint64_t sk__align(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* The geometry of an object of this store's model whose cache holds
 * capacity tokens of kv_type (enum sk_kv_type: the store's own for new
 * sessions, the source's for forks, imports and adopted objects). */
bool sk__geom(const struct sk_store *st, uint32_t kv_type, uint32_t capacity,
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

uint64_t sk__header_sum(const struct sk_store_header *h) {
  return XXH3_64bits(h, offsetof(struct sk_store_header, header_checksum));
}

uint64_t sk__meta_sum(const void *copy, uint64_t meta_size,
                      uint64_t commit) {
  return XXH3_64bits_withSeed((const char *)copy + 16, (size_t)meta_size - 16,
                              commit);
}

uint64_t sk__slot_sum(const struct sk_kv *kv, uint32_t slot) {
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

void sk__obj_name(char *buf, size_t size, uint64_t id, bool tmp) {
  snprintf(buf, size, "session-%" PRIu64 ".skv%s", id, tmp ? ".tmp" : "");
}

/* ---- views ----------------------------------------------------------- */

char *sk__copy(const struct sk_store_obj *obj, int i) {
  return (char *)obj->map + obj->hdr->off_meta[i];
}

/* Points the view at meta copy i (whose layout was checked). */
void sk__view(struct sk_store_obj *obj, int i) {
  char *c = sk__copy(obj, i);
  struct sk_store_meta *m = (struct sk_store_meta *)(void *)c;
  obj->meta = m;
  obj->logits = (float *)(void *)(c + m->off_logits);
  sk_kv_rebind_meta(&obj->kv, c + m->off_kv);
}

uint64_t *sk__sums(const struct sk_store_obj *obj) {
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
void sk__seal(struct sk_store_obj *obj, int i, uint64_t commit) {
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
