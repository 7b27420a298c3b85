/* The store tests' fixture (test-store*.c): the test model loaded once per
 * program (setup/teardown, the group's), state directories, objects
 * driven step by step, snapshots and scans. Every helper fails the test
 * on error. */
#ifndef SK_TESTSTORE_H
#define SK_TESTSTORE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/model.h"
#include "session/kvcache.h"
#include "session/store.h"

struct fixture {
  struct sk_gguf *g;
  struct sk_model *m;
  struct sk_scratch *scr;
  uint32_t n_vocab;
  struct sk_store_config cfg;
};
extern struct fixture fx;

int setup(void **state);
int teardown(void **state);

/* A fresh state directory (tmpfs when /dev/shm exists); malloc'd. */
char *new_dir(void);
/* The store of dir with the fixture's model. */
struct sk_store *open_store(const char *dir);
/* Streaming, 4 sinks + a window of 12. */
extern const struct sk_kv_params streaming16;
/* A new session object id of policy p. */
struct sk_store_obj *create(struct sk_store *st, uint64_t id,
                            const struct sk_kv_params *p);
/* Token of stream index i in these tests. */
int32_t tok_at(uint64_t i);
/* What scheduler.c does for a chunk, on a plain cache or the store's view. */
void run_chunk(struct sk_kv *kv, float *logits, uint32_t n);
/* One committed step of n tokens on obj. */
void step(struct sk_store_obj *obj, uint32_t n);
/* The two caches hold the same tokens at the same positions with the same
 * keys and values, and the same counters. */
void assert_same_cache(const struct sk_kv *a, const struct sk_kv *b);

/* A deep copy of an object's live state, to compare later. */
struct snap {
  struct sk_kv *kv; /* malloc'd block with the same contents */
  float *logits;
  uint64_t commit;
  uint64_t rng[4];
};
struct snap take_snap(const struct sk_store_obj *obj);
/* obj's live state equals the snapshot's. */
void assert_snap(const struct snap *s, const struct sk_store_obj *obj);
void free_snap(struct snap *s);

/* What a scan of the state directory adopted and set aside. */
#define MAX_SEEN 16
struct scan {
  struct sk_store_obj *adopted[MAX_SEEN];
  int n_adopted;
  char name[MAX_SEEN][64];
  char reason[MAX_SEEN][256];
  enum sk_store_skip what[MAX_SEEN];
  int n_skipped;
};
/* Scans st into s (*ret_max, if not NULL: the largest id adopted). */
void do_scan(struct sk_store *st, struct scan *s, uint64_t *ret_max);
/* The reason name was set aside for in s (fails if it was not). */
const char *skip_reason(const struct scan *s, const char *name);
void free_adopted(struct scan *s);
/* Removes dir and everything in it. */
void rm_rf(const char *dir);
/* Closes obj and *st, opens the directory again and returns the one
 * object adopted (*st set to the new store). */
struct sk_store_obj *reopen(const char *dir, struct sk_store **st, struct sk_store_obj *obj);

#endif
