/* The shared-memory session store: every session's KV cache and state is
 * one file in a state directory on tmpfs (default /run/sinkd/state, or
 * $XDG_RUNTIME_DIR/sinkd/state), mapped MAP_SHARED, created 0600. The
 * mapping outlives the daemon: after a crash (SIGKILL included) or an
 * upgrade, a new daemon adopts every valid object and its sessions go on
 * where they stopped.
 *
 * ---- Object layout, version 1 (SK_STORE_LAYOUT_VERSION) ------------------
 *
 * File "session-<id>.skv" (id in decimal). All integers little-endian
 * (the host's: objects never leave the machine; export images do, and are
 * checked on import). P = 4096, every section starts on a multiple of P
 * and the file size is a multiple of P, so the file's size is exactly the
 * memory it holds on tmpfs. C = capacity, S = C + SK_KV_SPARE_SLOTS
 * physical slots, L = n_layer, D = kv_dim, V = n_vocab.
 *
 *   [0, P)                struct sk_store_header   written once at creation,
 *                                                  never changed
 *   [off_meta[0], +M)     meta copy 0              struct sk_store_meta + ...
 *   [off_meta[1], +M)     meta copy 1              ... the same layout
 *   [off_data, +data_size) data part               K then V of the KV block
 *                                                  (kvcache.h): k[L][S][D],
 *                                                  v[L][S][D] of kv_type
 *                                                  (float or binary16)
 *
 * A meta copy (M = meta_size bytes, offsets from the copy's start):
 *
 *   [0, 128)              struct sk_store_meta     commit counter, checksum,
 *                                                  flags, sampler state,
 *                                                  held UTF-8 bytes
 *   [off_kv, +kv_meta)    the KV block's meta part (kvcache.h: struct
 *                         sk_kv_header with policy, n_resident, n_seen,
 *                         n_evicted, and the per-slot arrays token[S],
 *                         index[S], order[S], ... whatever kvcache.h puts
 *                         before off_k)
 *   [off_logits, +4V)     float logits[V]: the logits after the last
 *                         resident token (valid when SK_STORE_HAS_LOGITS),
 *                         so a continuation needs no recomputation
 *   [off_sum, +8S)        uint64_t kv_sum[S]: XXH3-64 of the slot's K/V
 *                         rows (for l in 0..L: K row, then for l: V row,
 *                         D floats each) taken when the slot was filled;
 *                         checked for every resident slot on adoption
 *
 * ---- Commit protocol --------------------------------------------------
 *
 * The *live* copy is the valid copy with the larger commit counter (valid:
 * commit != 0, magic and offsets right, checksum = XXH3-64 of bytes
 * [16, M) of the copy seeded with the commit counter). A step:
 *   1. sk_store_begin: the other copy's commit is set to 0 (it stops being
 *      valid), then the live copy's bytes [16, M) are copied over it; the
 *      view (obj->kv, logits, meta) now shows that working copy
 *      (sk_store_begin_decode copies all but the logits, which the
 *      forward pass then writes whole);
 *   2. the caller evicts (at most SK_KV_SPARE_SLOTS tokens) and runs the
 *      forward pass: keys and values go only into slots that are free in
 *      the live copy (kvcache.h: spare slots, FIFO free list), bookkeeping
 *      and logits into the working copy;
 *   3. sk_store_commit: the new slots' kv_sum are computed, the checksum
 *      is written, a fence, then commit = live commit + 1. The working
 *      copy is now live.
 * A crash at any point leaves the previous live copy and every K/V row it
 * names untouched, and the working copy either invalid (commit 0) or
 * complete. A copy with commit != 0 and a wrong checksum can only come
 * from corruption, not from a crash: if it is newer than the valid copy,
 * the object is set aside.
 *
 * The process-crash guarantee needs no msync (the pages belong to tmpfs,
 * not to the process); a machine crash loses tmpfs anyway.
 *
 * ---- Model fingerprint ------------------------------------------------
 *
 * XXH3-128 over: the GGUF file's bytes before the tensor data (magic,
 * version, every metadata key/value, the tensor table: names, types,
 * shapes, offsets), the file size (8 bytes), and for every tensor the first
 * and the last min(4096, size) bytes of its data. A different model, a
 * different quantization or a fine-tune with the same header all differ.
 * The daemon also mixes in how it runs the model (sk_model_describe:
 * architecture, RoPE style and the order keys are cached in, biases, q/k
 * norms, frequency factors, tied output; after the header bytes, as its
 * length (8 bytes) and text), so that a sinkd that would read the same
 * file's cached keys differently does not adopt them.
 *
 * ---- Export image, version 1 (SK_STORE_IMAGE_VERSION) -----------------
 *
 *   struct sk_store_image   128 bytes: magic, version, fingerprint, shape,
 *                           sizes, checksum of the body, checksum of the
 *                           header
 *   meta copy               M bytes: the live meta copy, verbatim
 *   rows                    for l: for p < n_resident: K row of the slot
 *                           at cache position p (D elements of kv_type); then the same
 *                           for V: 2 * L * n_resident * D elements
 * Import checks everything (sizes, both checksums, the fingerprint, the
 * meta copy's own checksum and consistency, every row against kv_sum,
 * logits and K/V values finite) before a session exists; adoption checks
 * the same of an object.
 *
 * Threads: the store and object creation/removal belong to the loop
 * thread; begin/commit/abort to whoever owns the session's cache at the
 * time (the compute thread while a job runs). Library code: never logs.
 */
#ifndef SK_STORE_H
#define SK_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "session/kvcache.h"
#include "model/sampler.h"
#include "sinkd/protocol.h"
#include "base/utf8.h"

#define SK_STORE_LAYOUT_VERSION 1u
#define SK_STORE_IMAGE_VERSION 1u
#define SK_STORE_FP_SIZE 16u
/* Page: section alignment and size granule of an object. */
#define SK_STORE_PAGE 4096u
/* Name of the folder, inside the state directory, that invalid objects
 * are moved to. */
#define SK_STORE_INVALID_DIR "invalid"

/* Fixed header at offset 0 (256 bytes). Never written after creation. */
struct sk_store_header {
  char magic[8];             /* "SINKDSHM" */
  uint32_t layout_version;   /* SK_STORE_LAYOUT_VERSION */
  uint32_t header_size;      /* sizeof(struct sk_store_header) */
  uint8_t model_fp[SK_STORE_FP_SIZE]; /* fingerprint of the model */
  uint64_t session_id;       /* equals the id in the file name */
  uint32_t owner_uid;        /* uid that opened the session */
  uint32_t kv_layout_version;/* SK_KV_LAYOUT_VERSION of the meta part */
  uint32_t n_vocab;          /* V: logits per meta copy */
  uint32_t n_layer;          /* L */
  uint32_t kv_dim;           /* D */
  uint32_t capacity;         /* C: tokens the cache holds */
  uint32_t policy;           /* enum sk_policy, fixed for the session */
  uint32_t kv_type;          /* enum sk_kv_type of the data part (0: f32) */
  uint64_t created_unix;     /* seconds since the epoch */
  uint64_t meta_size;        /* M: bytes of one meta copy, multiple of P */
  uint64_t off_meta[2];      /* byte offsets of the meta copies */
  uint64_t off_data;         /* byte offset of the data part */
  uint64_t data_size;        /* bytes of the data part (K and V) */
  uint64_t total_size;       /* bytes of the file */
  uint32_t flags;            /* SK_STORE_TEMPORARY (0 in files of
                                versions before it: the field was
                                reserved, zero) */
  uint8_t reserved[116];     /* zero */
  uint64_t header_checksum;  /* XXH3-64 of the 248 bytes before it */
};

/* Flags of the fixed header. A temporary session ends with the
 * connection that opened it (sinkd-protocol(7), "open"), so one found at
 * a start outlived its connection: the daemon that made it died. */
#define SK_STORE_TEMPORARY 1u

/* Flags of a meta copy. */
#define SK_STORE_HAS_LOGITS 1u

/* Start of a meta copy (128 bytes). */
struct sk_store_meta {
  uint64_t commit;           /* commit counter; 0 = not valid (being written) */
  uint64_t checksum;         /* XXH3-64 of bytes [16, M), seed commit */
  uint32_t magic;            /* SK_STORE_META_MAGIC */
  uint32_t flags;            /* SK_STORE_HAS_LOGITS */
  uint64_t off_kv;           /* offsets from the copy's start */
  uint64_t off_logits;
  uint64_t off_sum;
  /* The session's sampler: parameters of the last generate and the PRNG
   * words after its last committed draw (sampler.h). */
  float temperature;
  uint32_t top_k;
  float top_p;
  float sparsity;            /* the session's MLP sparsity level (sparse.h),
                                0 = dense; 0 in files of versions before
                                it (the bytes were reserved, zero) */
  uint64_t seed;
  uint64_t rng[4];
  uint64_t steps;            /* steps committed over the session's life */
  /* Bytes of a character the session's last generate ended inside
   * (utf8.h): its next generate starts with them. 0 in files of versions
   * before them (the bytes were reserved, zero): nothing held. */
  uint8_t utf8_held[4];
  uint8_t n_utf8_held;       /* 0..3 */
  /* What the session speculates with (sk_kv_params, spec.h): enum
   * sk_spec_mode, the most tokens a step proposes, fixed (1) or adaptive
   * (0). 0 in files of versions before them (the bytes were reserved,
   * zero): the daemon's defaults. */
  uint8_t spec_mode;
  uint8_t spec_tokens;
  uint8_t spec_fixed;
  uint8_t reserved[8];
};
#define SK_STORE_META_MAGIC 0x434d4b53u /* "SKMC" little-endian */

/* Export image header (128 bytes). */
struct sk_store_image {
  char magic[8];             /* "SINKDEXP" */
  uint32_t version;          /* SK_STORE_IMAGE_VERSION */
  uint32_t header_size;      /* sizeof(struct sk_store_image) */
  uint8_t model_fp[SK_STORE_FP_SIZE];
  uint32_t n_vocab, n_layer, kv_dim, capacity;
  uint32_t policy;
  uint32_t n_resident;       /* rows per layer that follow */
  uint64_t meta_size;        /* M */
  uint64_t rows_size;        /* 2 * L * n_resident * D * E (E: 4 f32, 2 f16) */
  uint64_t total_size;       /* header + M + rows_size */
  uint64_t body_checksum;    /* XXH3-64 of bytes [header_size, total_size) */
  uint8_t reserved[32];
  uint64_t header_checksum;  /* XXH3-64 of the 120 bytes before it */
};

/* A state directory. Opaque. */
struct sk_store;

/* One session object, mapped. The caller reads the public fields; the
 * store writes them. */
struct sk_store_obj {
  struct sk_store *store;
  uint64_t id;
  uint32_t owner_uid;
  uint32_t flags;                 /* the header's (SK_STORE_TEMPORARY) */
  size_t size;                    /* bytes of the file (= of tmpfs memory) */
  /* View of the copy being shown: the live one between steps, the working
   * one between sk_store_begin and sk_store_commit/abort. */
  struct sk_kv kv;                /* the forward pass's view */
  struct sk_store_meta *meta;     /* flags, sampler state */
  float *logits;                  /* (n_vocab) */
  /* Set by adoption: the other meta copy was being written (commit 0
   * after the first step): the daemon died inside a step, which was
   * dropped. For the log. */
  bool dropped_step;
  /* Internal. */
  struct sk_store_header *hdr;
  void *map;
  int live;                       /* index of the live meta copy */
  bool in_step;
  uint64_t step_seen;             /* n_seen of the live copy at begin */
};

struct sk_store_config {
  const char *dir;                /* state directory */
  uint8_t model_fp[SK_STORE_FP_SIZE];
  struct sk_kv_shape shape;       /* kv_type: that of new sessions; objects of
                                     either type are adopted, forked and
                                     imported as they are */
  uint32_t n_vocab;
};

/* Computes the model fingerprint (see above) of an opened GGUF into ret.
 * Never fails (the GGUF was checked when opened). */
void sk_store_fingerprint(const struct sk_gguf *g,
                          uint8_t ret[SK_STORE_FP_SIZE]);
/* The same with runs (NUL-terminated; sk_model_describe's line) mixed in:
 * the daemon's fingerprint. runs NULL gives sk_store_fingerprint's. */
void sk_store_fingerprint_runs(const struct sk_gguf *g, const char *runs,
                               uint8_t ret[SK_STORE_FP_SIZE]);
/* Lowercase hex of a fingerprint into out (33 bytes). */
void sk_store_fp_hex(const uint8_t fp[SK_STORE_FP_SIZE], char out[33]);

/* Whether another process holds the lock of the state directory dir (as
 * sk_store_open takes it), without creating or changing anything: for a
 * daemon to say so before it loads its model. The answer can be stale
 * by the time sk_store_open runs, which still decides. Returns 0 (free,
 * or no lock file yet; other problems are left to sk_store_open) or
 * -SK_ERR_BUSY (message: the directory). */
int sk_store_check_busy(const char *dir, struct sk_error *err);

/* Opens the state directory cfg->dir (created 0700, missing parents 0755,
 * if absent; it must be a directory owned by the effective uid, not
 * writable by group or others unless sticky (sk_safefile_check_dir); an
 * existing one keeps its mode, objects are 0600 anyway) and takes
 * its lock (flock on "lock" inside), so that two daemons never share one.
 * ret_tmpfs tells whether the directory is on tmpfs (the caller warns if
 * not). Errors: -SK_ERR_IO (message: path and reason), -SK_ERR_BUSY
 * (locked by another process), -SK_ERR_NO_MEMORY. */
int sk_store_open(const struct sk_store_config *cfg, struct sk_store **ret,
                  bool *ret_tmpfs, struct sk_error *err);
/* Releases the lock and frees the store; every object must be freed
 * first. NULL is fine. */
void sk_store_close(struct sk_store *st);
/* The state directory's path, and a descriptor of it (the store's, open
 * while it is: files of the directory are opened relative to it). */
const char *sk_store_dir(const struct sk_store *st);
int sk_store_dirfd(const struct sk_store *st);

/* Bytes of an object for a cache of this capacity (what it costs in
 * tmpfs memory); 0 if the capacity is invalid or too large. */
size_t sk_store_object_size(const struct sk_store *st, uint32_t capacity);

/* What sk_store_scan reports for a file it does not adopt. */
enum sk_store_skip {
  SK_STORE_SET_ASIDE, /* invalid or foreign: moved to invalid/ */
  SK_STORE_REMOVED,   /* an unfinished creation (*.tmp): deleted */
  SK_STORE_KEPT,      /* could not be moved: left in place */
};

struct sk_store_scan_cb {
  /* A valid object; the callee takes ownership of obj. */
  void (*adopt)(void *user, struct sk_store_obj *obj);
  /* A file not adopted: name (in the state directory), what was done
   * (and `dest`, the new name, for SET_ASIDE), and why. */
  void (*skip)(void *user, const char *name, enum sk_store_skip what,
               const char *dest, const char *reason);
  /* The object of session id was set aside (after skip): files that go
   * with the session (its conversation) may follow it with
   * sk_store_set_aside. May be NULL. */
  void (*aside)(void *user, uint64_t id);
  void *user;
};

/* Moves name, a file of the state directory, into invalid/ under a free
 * name ("name", "name.1", ... never replacing one); dest gets the new
 * path relative to the state directory. Returns false if it could not
 * (errno: ENOENT when there is no such file). */
bool sk_store_set_aside(struct sk_store *st, const char *name, char *dest, size_t dsize);

/* Looks at every "session-<id>.skv" in the state directory in ascending
 * id order and adopts the valid ones (owned by the daemon's uid, same
 * model fingerprint and shape, valid fixed header, a valid live meta
 * copy, consistent counters, every resident slot's K/V matching its
 * checksum); sets the others aside into invalid/ (never half-loaded), as
 * those whose id is past SK_SESSION_ID_MAX; deletes "*.skv.tmp"
 * leftovers. Other files are left alone. *ret_max_id receives the largest id seen (adopted or
 * not, and every id ever created in this directory: the lock file keeps
 * the next one), so ids are never reused. Errors: -SK_ERR_IO if the directory
 * cannot be read (per-file problems are reported through cb->skip). */
int sk_store_scan(struct sk_store *st, const struct sk_store_scan_cb *cb,
                  uint64_t *ret_max_id, struct sk_error *err);

/* Checks one object file (a path anywhere) the way the scan does, without
 * adopting it: on success *ret is a read-write mapping the caller frees
 * with sk_store_obj_free. For tools and tests. Errors: -SK_ERR_BAD_REQUEST
 * with the reason, -SK_ERR_IO. */
int sk_store_obj_check(struct sk_store *st, const char *path,
                       struct sk_store_obj **ret, struct sk_error *err);

/* Creates the object of a new, empty session: file created 0600 under a
 * temporary name, its pages reserved (posix_fallocate), formatted,
 * committed (commit 1) and renamed into place, so it exists whole or not
 * at all. sampler: the session's initial sampler state; flags: the
 * header's (SK_STORE_TEMPORARY or 0).
 * Errors: -SK_ERR_BAD_REQUEST (params), -SK_ERR_BUSY (the state
 * directory's file system is full), -SK_ERR_IO, -SK_ERR_NO_MEMORY. */
int sk_store_create(struct sk_store *st, uint64_t id, uint32_t owner_uid, uint32_t flags,
                    const struct sk_kv_params *params,
                    const struct sk_sampler_state *sampler,
                    struct sk_store_obj **ret, struct sk_error *err);
/* sk_store_create in two steps, for a daemon that makes the object off its
 * event loop while file descriptors are opened and closed only on the loop
 * (libuv's loop may touch a descriptor number another thread reuses):
 * sk_store_create_file creates the empty file under the temporary name
 * and returns its descriptor (>= 0) or a negative error (-SK_ERR_IO);
 * sk_store_create_in does the rest on that descriptor from any thread,
 * without closing it; sk_store_create_end closes it and deletes the
 * temporary file if the object was not made. */
int sk_store_create_file(struct sk_store *st, uint64_t id, struct sk_error *err);
int sk_store_create_in(struct sk_store *st, int fd, uint64_t id, uint32_t owner_uid,
                       uint32_t flags, const struct sk_kv_params *params,
                       const struct sk_sampler_state *sampler,
                       struct sk_store_obj **ret, struct sk_error *err);
void sk_store_create_end(struct sk_store *st, int fd, uint64_t id);
/* Creates a new object (id, owner_uid) holding a copy of src's live state:
 * meta copy and the K/V rows of its resident slots. src must not be in a
 * step. Errors as sk_store_create. */
int sk_store_fork(struct sk_store *st, const struct sk_store_obj *src,
                  uint64_t id, uint32_t owner_uid, struct sk_store_obj **ret,
                  struct sk_error *err);

/* Size in bytes of src's export image now. */
size_t sk_store_export_size(const struct sk_store_obj *src);
/* Writes src's live state as an export image into buf[0..size), size =
 * sk_store_export_size(src). src must not be in a step. */
void sk_store_export(const struct sk_store_obj *src, void *buf, size_t size);

/* What an export image holds, from sk_store_image_check. */
struct sk_store_image_info {
  uint32_t policy;
  uint32_t capacity;
  uint32_t n_resident;
  uint64_t n_seen;
  uint32_t kv_type;    /* enum sk_kv_type of its rows (kept by the import) */
  size_t object_size;  /* bytes an imported session will take */
};
/* Checks an export image of len bytes (the whole file): magic, version,
 * header checksum, length (a truncated or extended file is named as such),
 * body checksum, model fingerprint and shape, the meta copy's checksum and
 * consistency. Errors: -SK_ERR_BAD_REQUEST with a clear reason. */
int sk_store_image_check(const struct sk_store *st, const void *buf,
                         size_t len, struct sk_store_image_info *ret,
                         struct sk_error *err);
/* Creates a new object (id, owner_uid) from a checked image, verifying
 * every row against its checksum. Errors: those of sk_store_image_check
 * and sk_store_create. */
int sk_store_import(struct sk_store *st, const void *buf, size_t len,
                    uint64_t id, uint32_t owner_uid,
                    struct sk_store_obj **ret, struct sk_error *err);

/* Unmaps the object and frees obj; the file stays (the session lives on
 * for the next daemon). NULL is fine. */
void sk_store_obj_free(struct sk_store_obj *obj);
/* Deletes the object's file (the session is closed) and detaches obj from
 * its store; the mapping stays until sk_store_obj_free, which may run on
 * another thread (unmapping a large object returns its pages, which takes
 * a while). NULL is fine. */
void sk_store_obj_unlink(struct sk_store_obj *obj);
/* sk_store_obj_unlink, then sk_store_obj_free. NULL is fine. */
void sk_store_obj_remove(struct sk_store_obj *obj);

/* Starts a step (see the commit protocol): obj->kv, obj->meta and
 * obj->logits show a working copy equal to the live one. */
void sk_store_begin(struct sk_store_obj *obj);
/* sk_store_begin for a step whose forward pass writes every logit
 * (obj->logits, n_vocab floats) before sk_store_commit: the working copy
 * keeps its own, stale logits instead of a copy of the live ones, which
 * spares a copy of n_vocab floats a step (125 KiB for a vocabulary of
 * 32000: 16 sessions of the 110M model decoding spent 0.15-0.2 ms less
 * a step on one thread, measured). A step that commits without writing
 * them (an end of stream found by sampling) calls sk_store_keep_logits
 * first. Read the live logits (obj->logits) before this call. */
void sk_store_begin_decode(struct sk_store_obj *obj);
/* In a step begun with sk_store_begin_decode: copies the live copy's
 * logits into the working copy (the step then commits the logits it
 * started from). No-op outside a step. */
void sk_store_keep_logits(struct sk_store_obj *obj);
/* Commits the step begun: the working copy becomes live. */
void sk_store_commit(struct sk_store_obj *obj);
/* Drops the step begun: the view shows the live copy again. */
void sk_store_abort(struct sk_store_obj *obj);
/* Commit counter of the live copy. */
uint64_t sk_store_commit_count(const struct sk_store_obj *obj);

/* The bytes of an unfinished character kept in the view's meta copy
 * (struct sk_store_meta's utf8_held): get fills a stream holding them,
 * set stores what s holds (in the step begun, like the sampler). */
void sk_store_utf8_get(const struct sk_store_obj *obj, struct sk_utf8_stream *ret);
void sk_store_utf8_set(struct sk_store_obj *obj, const struct sk_utf8_stream *s);
/* The sampler state kept in the view's meta copy. */
void sk_store_sampler_get(const struct sk_store_obj *obj,
                          struct sk_sampler_state *ret);
void sk_store_sampler_set(struct sk_store_obj *obj,
                          const struct sk_sampler_state *st);
/* Whether the view's meta copy holds logits to sample from
 * (SK_STORE_HAS_LOGITS: the logits after the last resident token). */
bool sk_store_has_logits(const struct sk_store_obj *obj);
/* In the step begun: the view's logits become those after its last
 * token: logits (n_vocab floats) are copied into obj->logits, unless
 * NULL (the forward pass wrote them there), and marked valid
 * (SK_STORE_HAS_LOGITS), committed with the step. */
void sk_store_set_logits(struct sk_store_obj *obj, const float *logits);

#endif
