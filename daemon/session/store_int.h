/* What store.c, store_check.c and store_create.c share (internal to the
 * store module). */
#ifndef SK_STORE_INT_H
#define SK_STORE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "session/store.h"

#define SK__STORE_MAGIC "SINKDSHM"
#define SK__IMAGE_MAGIC "SINKDEXP"

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

/* Where the parts of an object lie (bytes from its start). */
struct sk__geom {
  uint32_t capacity, n_slots;
  uint64_t kv_meta, kv_data;      /* parts of the KV block */
  uint64_t off_kv, off_logits, off_sum, meta_size;
  uint64_t off_meta[2], off_data, total;
};

/* The geometry of an object of this store's model whose cache holds
 * capacity tokens of kv_type (enum sk_kv_type: the store's own for new
 * sessions, the source's for forks, imports and adopted objects). */
bool sk__geom(const struct sk_store *st, uint32_t kv_type, uint32_t capacity,
              struct sk__geom *g);

/* Checksums: the object header's (up to its checksum field); a meta copy's
 * (after its first 16 bytes, seeded with its commit); a slot's K and V rows
 * in every layer. */
uint64_t sk__header_sum(const struct sk_store_header *h);
uint64_t sk__meta_sum(const void *copy, uint64_t meta_size,
                      uint64_t commit);uint64_t sk__slot_sum(const struct sk_kv *kv, uint32_t slot);

/* The file name of object id: session-ID.skv, or session-ID.skv.tmp while
 * it is written. */
void sk__obj_name(char *buf, size_t size, uint64_t id, bool tmp);

/* Meta copy i of obj in its mapping. */
char *sk__copy(const struct sk_store_obj *obj, int i);

/* Points the view at meta copy i (whose layout was checked). */
void sk__view(struct sk_store_obj *obj, int i);

/* The slot checksums of obj's live meta copy. */
uint64_t *sk__sums(const struct sk_store_obj *obj);

/* Seals meta copy i: checksum first, then the commit counter (so a copy
 * with commit != 0 always has its checksum in place). */
void sk__seal(struct sk_store_obj *obj, int i, uint64_t commit);

/* Meta copy i: 1 valid (commit in *ret_commit), 0 not committed (commit
 * 0: it was being written), -1 corrupt (commit != 0, checksum or layout
 * wrong). */
int sk__copy_state(const struct sk_store_header *h, const struct sk__geom *g,
                   const char *copy, uint64_t *ret_commit);

/* Checks the kv meta part of copy `c` (which must be the live one) and
 * every resident slot against the data and its checksum; obj->kv shows it
 * afterwards. */
int sk__check_live(const struct sk_store *st, struct sk_store_obj *obj,
                   struct sk_error *err);

/* An -SK_ERR_BAD_REQUEST error with a printf message. */
int sk__bad(struct sk_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
