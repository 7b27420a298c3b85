/* Session objects through the real daemon and its restarts
 * (testpersist.h):
 *
 *   - an f16 KV cache across kills, and sessions of both types;
 *   - fork of a 300-token session without prefill (time and token counts
 *     printed), both continuing independently;
 *   - export -> import gives the same continuation; a flipped byte and a
 *     truncation are refused; sinkctl save/load/fork/resume;
 *   - limits (max sessions, max memory: busy naming the limit), idle TTL,
 *     exact memory accounting; SIGTERM keeps the sessions.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/model.h"
#include "sinkd/client.h"
#include "session/store.h"
#include "testutil.h"
#include "model/tokenizer.h"
#include "testpersist.h"
/* The object sizes for 512 tokens of the test model from the store's own
 * geometry, f16 and f32; they differ by half the keys and values. */
static void object_sizes_512(size_t *ret_want16, size_t *ret_want32) {
  struct sk_error e = {0};
  size_t want16, want32;
  struct sk_gguf *g = NULL;
  struct sk_model *m = NULL;
  assert_int_equal(sk_gguf_open(sk_test_model_path(), &g, &e), 0);
  assert_int_equal(sk_model_load(g, &m, &e), 0);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/geom", g_dir);
  struct sk_store_config cfg = {.dir = dir, .shape = sk_model_kv_shape(m),
                                .n_vocab = sk_model_config(m)->n_vocab};
  sk_store_fingerprint(g, cfg.model_fp);
  struct sk_store *st = NULL;
  assert_int_equal(sk_store_open(&cfg, &st, NULL, &e), 0);
  want32 = sk_store_object_size(st, 512);
  sk_store_close(st);
  cfg.shape.kv_type = SK_KV_F16;
  assert_int_equal(sk_store_open(&cfg, &st, NULL, &e), 0);
  want16 = sk_store_object_size(st, 512);
  sk_store_close(st);
  const struct sk_model_config *mc = sk_model_config(m);
  /* the data parts differ by half the keys and values, to the page */
  size_t half = (size_t)mc->n_layer * 2 * mc->kv_dim * (512 + SK_KV_SPARE_SLOTS) * 2;
  assert_true(want32 - want16 >= half - 4096 && want32 - want16 <= half + 4096);
  sk_model_free(m);
  sk_gguf_close(g);
  *ret_want16 = want16;
  *ret_want32 = want32;
}

static void test_kv_f16(void **state) {
  (void)state;
  fresh_state("kvf16");
  start_daemon_args((const char *const[]){"--kv-type", "f16", NULL});
  struct sk_client *c = conn();
  struct sk_error e = {0};
  struct sk_daemon_stats ds;
  /* exact object sizes from the store's own geometry */
  size_t want16, want32;
  object_sizes_512(&want16, &want32);
  json_t *ref = sk_test_load_reference("greedy.json");
  json_t *prompts = json_object_get(ref, "prompts");
  uint64_t ids[8];
  size_t n_prompts = json_array_size(prompts);
  assert_true(n_prompts >= 1 && n_prompts <= 8);
  for (size_t i = 0; i < n_prompts; i++) {
    json_t *p = json_array_get(prompts, i);
    ids[i] = open_session(c, "dense", 0, 0, 512);
    assert_int_equal(sstats(c, ids[i]).object_bytes, want16);
    size_t n_p = 0, n_ref = 0;
    int32_t *prompt = sk_test_json_ids(json_object_get(p, "prompt_ids"), &n_p);
    int32_t *want = sk_test_json_ids(json_object_get(p, "generated_ids"), &n_ref);
    if (sk_client_append_tokens(c, ids[i], prompt, n_p, SK_BOS_DEFAULT, NULL, &e) < 0)
      fail_msg("append: %s", e.message);
    struct ids *got = calloc(1, sizeof *got);
    gen(c, ids[i], (uint32_t)n_ref, 0, false, 0, got, NULL);
    assert_int_equal(got->n, n_ref);
    for (size_t j = 0; j < n_ref; j++)
      if (got->v[j] != want[j])
        fail_msg("prompt %zu, token %zu: f16 cache gives %d, llama.cpp (f32 cache) %d", i, j,
                 got->v[j], want[j]);
    free(got);
    free(prompt);
    free(want);
  }
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.memory_bytes, want16 * n_prompts);
  sk_client_free(c);
  /* SIGKILL: the f16 sessions come back and go on */
  kill9();
  start_daemon_args((const char *const[]){"--kv-type", "f16", NULL});
  c = conn();
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.adopted, n_prompts);
  assert_int_equal(ds.set_aside, 0);
  /* fork and export/import copy f16 rows: all three go on alike; a
   * second fork and the export wait for the f32 daemon */
  struct sk_session_summary fk, im, fk2;
  assert_int_equal(sk_client_fork(c, ids[0], &fk, &e), 0);
  assert_int_equal(sk_client_fork(c, ids[0], &fk2, &e), 0);
  void *img = NULL;
  size_t img_len = 0;
  assert_int_equal(sk_client_export(c, ids[0], &img, &img_len, &e), 0);
  assert_int_equal(sk_client_import(c, img, img_len, &im, &e), 0);
  uint64_t three[3] = {ids[0], fk.session, im.session};
  struct ids *more[3];
  for (int i = 0; i < 3; i++) {
    more[i] = calloc(1, sizeof *more[i]);
    gen(c, three[i], 20, 0, false, 0, more[i], NULL);
    assert_int_equal(more[i]->n, 20);
  }
  for (int i = 1; i < 3; i++) assert_memory_equal(more[i]->v, more[0]->v, 20 * sizeof(int32_t));
  sk_client_free(c);
  kill9();
  /* an f32 daemon on the same store adopts them all as f16 sessions */
  start_daemon_args((const char *const[]){"--kv-type", "f32", NULL});
  c = conn();
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.adopted, n_prompts + 3); /* and the forks and the import */
  assert_int_equal(ds.set_aside, 0);
  assert_int_equal(ds.memory_bytes, want16 * (n_prompts + 3));
  assert_int_equal(sstats(c, fk2.session).object_bytes, want16);
  assert_string_equal(sstats(c, fk2.session).kv_type, "f16");
  {
    struct sk_session_summary sum;
    assert_int_equal(sk_client_resume(c, ids[0], &sum, &e), 0);
    assert_string_equal(sum.kv_type, "f16");
    assert_true(sum.adopted);
  }
  /* the untouched fork gives the f16 daemon's 20 tokens */
  struct ids *again = calloc(1, sizeof *again);
  gen(c, fk2.session, 20, 0, false, 0, again, NULL);
  assert_int_equal(again->n, 20);
  assert_memory_equal(again->v, more[0]->v, 20 * sizeof(int32_t));
  /* a fork, and an import of the f16 daemon's export, stay f16 */
  struct sk_session_summary fk3, im2;
  assert_int_equal(sk_client_fork(c, ids[1], &fk3, &e), 0);
  assert_int_equal(sstats(c, fk3.session).object_bytes, want16);
  assert_string_equal(fk3.kv_type, "f16");
  assert_int_equal(sk_client_import(c, img, img_len, &im2, &e), 0);
  assert_int_equal(sstats(c, im2.session).object_bytes, want16);
  assert_string_equal(im2.kv_type, "f16");
  memset(again, 0, sizeof *again);
  gen(c, im2.session, 20, 0, false, 0, again, NULL);
  assert_memory_equal(again->v, more[0]->v, 20 * sizeof(int32_t));
  /* new sessions get the daemon's own type */
  uint64_t s32 = open_session(c, "dense", 0, 0, 512);
  assert_int_equal(sstats(c, s32).object_bytes, want32);
  assert_string_equal(sstats(c, s32).kv_type, "f32");
  {
    struct sk_session_info *rows = NULL;
    size_t n_rows = 0;
    assert_int_equal(sk_client_list(c, &rows, &n_rows, &e), 0);
    assert_int_equal(n_rows, n_prompts + 6);
    size_t n16 = 0;
    for (size_t i = 0; i < n_rows; i++) {
      const bool is32 = rows[i].session == s32;
      assert_string_equal(rows[i].kv_type, is32 ? "f32" : "f16");
      n16 += !is32;
    }
    assert_int_equal(n16, n_prompts + 5);
    free(rows);
  }
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.memory_bytes, want16 * (n_prompts + 5) + want32);
  printf("kv_type f16: %zu-byte objects for 512 tokens (f32: %zu); greedy tokens of the %zu "
         "reference prompts equal llama.cpp's; adopted after SIGKILL; fork and "
         "export/import continue alike; an f32 daemon adopts, continues, forks and imports "
         "them as f16 and opens f32 sessions\n",
         want16, want32, n_prompts);
  for (int i = 0; i < 3; i++) free(more[i]);
  free(again);
  free(img);
  sk_client_free(c);
  json_decref(ref);
  kill9();
}

/* ---- fork ---- */

static void test_fork_300(void **state) {
  (void)state;
  fresh_state("fork");
  start_daemon();
  struct sk_client *c = conn();
  /* 300 tokens of text */
  char *path = sk_test_shared_path("data/stories-sampled.txt");
  size_t len = 0;
  char *text = sk_test_read_file(path, &len);
  assert_non_null(text);
  int32_t *toks = NULL;
  size_t nt = 0;
  struct sk_error e = {0};
  assert_int_equal(sk_client_tokenize(c, text, 4000, SK_BOS_TRUE, &toks, &nt, &e), 0);
  assert_true(nt >= 300);
  uint64_t a = open_session(c, "dense", 0, 0, 1024);
  struct sk_daemon_stats d0, d1, d2;
  assert_int_equal(sk_client_stats(c, &d0, &e), 0);
  double t0 = now_s();
  struct sk_append_result ar;
  assert_int_equal(sk_client_append_tokens(c, a, toks, 300, SK_BOS_FALSE, &ar, &e), 0);
  double t_prefill = now_s() - t0;
  assert_int_equal(ar.seen, 300);
  assert_int_equal(sk_client_stats(c, &d1, &e), 0);
  t0 = now_s();
  struct sk_session_summary f;
  assert_int_equal(sk_client_fork(c, a, &f, &e), 0);
  double t_fork = now_s() - t0;
  assert_int_equal(sk_client_stats(c, &d2, &e), 0);
  assert_int_equal(f.from, a);
  assert_true(f.session != a);
  assert_int_equal(f.resident, 300);
  assert_int_equal(f.seen, 300);
  assert_int_equal(d1.tokens_prefilled - d0.tokens_prefilled, 300);
  assert_int_equal(d2.tokens_prefilled - d1.tokens_prefilled, 0); /* no re-prefill */
  assert_int_equal(d2.memory_bytes - d1.memory_bytes, f.object_bytes);
  printf("fork of a 300-token session: prefill of the 300 tokens %.2f ms (tokens_prefilled "
         "+%llu); fork %.2f ms (tokens_prefilled +%llu; a new %llu-byte object, the 300 "
         "resident tokens' K/V rows copied); fork resident %llu, seen %llu\n",
         t_prefill * 1e3, (unsigned long long)(d1.tokens_prefilled - d0.tokens_prefilled),
         t_fork * 1e3, (unsigned long long)(d2.tokens_prefilled - d1.tokens_prefilled),
         (unsigned long long)f.object_bytes, (unsigned long long)f.resident,
         (unsigned long long)f.seen);
  /* both continue the same from the same cache ... */
  struct ids *ga = calloc(1, sizeof *ga), *gf = calloc(1, sizeof *gf);
  gen(c, a, 20, 0, false, 0, ga, NULL);
  gen(c, f.session, 20, 0, false, 0, gf, NULL);
  assert_int_equal(ga->n, 20);
  assert_memory_equal(ga->v, gf->v, 20 * sizeof(int32_t));
  /* ... and independently */
  append_text(c, f.session, " The dog barked at the moon.");
  struct sk_session_stats sa = sstats(c, a), sf = sstats(c, f.session);
  assert_int_equal(sa.seen, 320);
  assert_true(sf.seen > 320);
  size_t na = 0;
  int32_t *ta = tokens_of(c, a, &na);
  assert_int_equal(na, 320);
  assert_memory_equal(ta, toks, 300 * sizeof(int32_t));
  assert_memory_equal(ta + 300, ga->v, 20 * sizeof(int32_t));
  /* a fork of the fork */
  struct sk_session_summary f2;
  assert_int_equal(sk_client_fork(c, f.session, &f2, &e), 0);
  assert_int_equal(f2.seen, sf.seen);
  free(ta);
  free(ga);
  free(gf);
  free(toks);
  free(text);
  free(path);
  sk_client_free(c);
  kill9();
}

/* ---- export / import ---- */

static void test_export_import(void **state) {
  (void)state;
  fresh_state("export");
  start_daemon();
  struct sk_client *c = conn();
  uint64_t a = open_session(c, "streaming", 4, 28, 0);
  append_text(c, a, "Once upon a time, there was a little girl named Lily. She loved");
  struct ids *g0 = calloc(1, sizeof *g0);
  gen(c, a, 30, 0.8, true, 7, g0, NULL); /* evicts; moves the PRNG */
  char file[400], bad[400], cut[400];
  snprintf(file, sizeof file, "%s/a.sinkd", g_dir);
  snprintf(bad, sizeof bad, "%s/bad.sinkd", g_dir);
  snprintf(cut, sizeof cut, "%s/cut.sinkd", g_dir);
  size_t bytes = 0;
  struct sk_error e = {0};
  assert_int_equal(sk_client_save(c, a, file, &bytes, &e), 0);
  struct stat sb;
  assert_int_equal(stat(file, &sb), 0);
  assert_int_equal((size_t)sb.st_size, bytes);
  assert_int_equal(sb.st_mode & 0777, 0600);
  struct sk_session_summary b;
  assert_int_equal(sk_client_load(c, file, &b, &e), 0);
  struct sk_session_stats sa = sstats(c, a);
  assert_int_equal(b.seen, sa.seen);
  assert_int_equal(b.resident, sa.resident);
  assert_int_equal(b.evicted, sa.evicted);
  /* the same continuation, greedy and sampled (the PRNG came along) */
  struct ids *ca = calloc(1, sizeof *ca), *cb = calloc(1, sizeof *cb);
  gen(c, a, 40, 0.8, false, 0, ca, NULL);
  gen(c, b.session, 40, 0.8, false, 0, cb, NULL);
  assert_int_equal(ca->n, 40);
  assert_memory_equal(ca->v, cb->v, 40 * sizeof(int32_t));
  /* one flipped byte: refused; truncated: refused; nothing created */
  size_t len = 0;
  char *img = sk_test_read_file(file, &len);
  assert_non_null(img);
  img[len / 3] ^= 0x01;
  FILE *f = fopen(bad, "wb");
  fwrite(img, 1, len, f);
  fclose(f);
  img[len / 3] ^= 0x01;
  f = fopen(cut, "wb");
  fwrite(img, 1, len - 100, f);
  fclose(f);
  struct sk_daemon_stats d0, d1;
  assert_int_equal(sk_client_stats(c, &d0, &e), 0);
  assert_int_equal(sk_client_load(c, bad, NULL, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "corrupted"));
  printf("one flipped byte: \"%s\"\n", e.message);
  assert_int_equal(sk_client_load(c, cut, NULL, &e), -SK_ERR_BAD_REQUEST);
  assert_non_null(strstr(e.message, "truncated"));
  printf("truncated by 100 bytes: \"%s\"\n", e.message);
  assert_int_equal(sk_client_stats(c, &d1, &e), 0);
  assert_int_equal(d1.sessions, d0.sessions);

  /* the same with sinkctl */
  const char *ctl = getenv("SK_SINKCTL");
  if (!ctl) ctl = "./client/sinkctl";
  char cmd[1200];
  int st = 0;
  snprintf(cmd, sizeof cmd, "%s --socket %s save %llu %s/ctl.sinkd", ctl, g_socket,
           (unsigned long long)a, g_dir);
  char *out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "saved to"));
  snprintf(cmd, sizeof cmd, "%s --socket %s load %s/ctl.sinkd", ctl, g_socket, g_dir);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  uint64_t loaded = strtoull(out, NULL, 10);
  assert_true(loaded > b.session);
  snprintf(cmd, sizeof cmd, "%s --socket %s --json resume %llu", ctl, g_socket,
           (unsigned long long)loaded);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  assert_non_null(strstr(out, "\"resident\": "));
  snprintf(cmd, sizeof cmd, "%s --socket %s fork %llu", ctl, g_socket, (unsigned long long)loaded);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 0);
  assert_true(strtoull(out, NULL, 10) > loaded);
  snprintf(cmd, sizeof cmd, "%s --socket %s load %s 2>&1", ctl, g_socket, bad);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 1);
  assert_non_null(strstr(out, "bad_request: export file corrupted"));
  snprintf(cmd, sizeof cmd, "%s --socket %s load %s/nonexistent 2>&1", ctl, g_socket, g_dir);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 1);
  assert_non_null(strstr(out, "cannot open"));
  snprintf(cmd, sizeof cmd, "%s --socket %s resume 99999 2>&1", ctl, g_socket);
  free(out);
  out = sk_test_run_capture(cmd, &st);
  assert_int_equal(st, 1);
  assert_non_null(strstr(out, "no_such_session"));
  free(out);
  /* a small frame limit: the client halves its chunks until they fit */
  sk_client_free(c);
  kill9();
  const char *small[] = {"--max-frame", "65536", NULL};
  start_daemon_args(small);
  c = conn();
  struct sk_session_summary b2;
  assert_int_equal(sk_client_load(c, file, &b2, &e), 0);
  assert_int_equal(b2.seen, sa.seen);
  free(img);
  free(g0);
  free(ca);
  free(cb);
  sk_client_free(c);
  kill9();
}

static void test_limits(void **state) {
  (void)state;
  fresh_state("limits");
  const char *args[] = {"--max-sessions", "3", "--max-memory", "1M", NULL};
  start_daemon_args(args);
  struct sk_client *c = conn();
  /* 204800 bytes each: three fit in 1 MiB, four would too */
  struct sk_open_params op = {.policy = "dense", .capacity = 128};
  struct sk_open_result o[4];
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(c, &op, &o[0], &e), 0);
  assert_int_equal(sk_client_open(c, &op, &o[1], &e), 0);
  assert_int_equal(sk_client_open(c, &op, &o[2], &e), 0);
  assert_int_equal(sk_client_open(c, &op, &o[3], &e), -SK_ERR_BUSY);
  assert_non_null(strstr(e.message, "max_sessions 3"));
  struct sk_daemon_stats ds;
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(o[0].object_bytes, 204800);
  assert_int_equal(ds.memory_bytes, o[0].object_bytes * 3);
  assert_int_equal(ds.memory_bytes, state_dir_bytes());
  assert_int_equal(ds.max_memory, 1u << 20);
  /* memory: a cache that does not fit */
  assert_int_equal(sk_client_close_session(c, o[2].session, &e), 0);
  struct sk_open_params big = {.policy = "dense", .capacity = 2048};
  assert_int_equal(sk_client_open(c, &big, &o[3], &e), -SK_ERR_BUSY);
  assert_non_null(strstr(e.message, "max_memory 1048576"));
  /* a fork counts too */
  assert_int_equal(sk_client_fork(c, o[0].session, NULL, &e), 0);
  assert_int_equal(sk_client_fork(c, o[0].session, NULL, &e), -SK_ERR_BUSY);
  assert_int_equal(sk_client_stats(c, &ds, &e), 0);
  assert_int_equal(ds.sessions, 3);
  assert_int_equal(ds.memory_bytes, state_dir_bytes());
  printf("limits: 4th open busy (\"max_sessions 3\"), a 2048-token cache busy (\"max_memory\"); "
         "memory_bytes %llu = the state directory's files\n",
         (unsigned long long)ds.memory_bytes);
  sk_client_free(c);
  kill9();

  /* idle TTL: a session nobody touches for 1 s is closed (and its object
   * deleted); one in use is not */
  fresh_state("ttl");
  const char *ttl[] = {"--idle-ttl", "1", NULL};
  start_daemon_args(ttl);
  c = conn();
  uint64_t s1 = open_session(c, "dense", 0, 0, 64);
  uint64_t s2 = open_session(c, "dense", 0, 0, 64);
  /* A temporary session ends with its connection, not by the TTL. */
  struct sk_open_params top = {.policy = "dense", .capacity = 64, .temporary = true};
  struct sk_open_result tmp;
  assert_int_equal(sk_client_open(c, &top, &tmp, &e), 0);
  assert_int_equal(sk_client_resume(c, s1, NULL, &e), 0);
  /* poll with list (which touches nothing), keeping s1 in use */
  bool gone = false;
  for (int i = 0; i < 100 && !gone; i++) { /* at most 10 s */
    usleep(100000);
    assert_int_equal(sk_client_resume(c, s1, NULL, &e), 0);
    struct sk_session_info *l = NULL;
    size_t n = 0;
    assert_int_equal(sk_client_list(c, &l, &n, &e), 0);
    gone = true;
    for (size_t k = 0; k < n; k++) gone &= l[k].session != s2;
    free(l);
  }
  assert_true(gone);
  assert_int_equal(sk_client_resume(c, s1, NULL, &e), 0);
  {
    struct sk_session_info *l = NULL;
    size_t n = 0;
    assert_int_equal(sk_client_list(c, &l, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(l[1].session, tmp.session);
    assert_true(l[1].temporary);
    assert_true(l[1].idle_s >= 1);
    free(l);
  }
  assert_int_equal(sk_client_close_session(c, tmp.session, &e), 0);
  assert_int_equal(state_dir_bytes(), sstats(c, s1).object_bytes);
  assert_true(log_has("closed: idle for"));
  sk_client_free(c);
  kill9();
}

/* A clean stop keeps the sessions too (an upgrade is a stop and a
 * start). */
static void test_sigterm_keeps(void **state) {
  (void)state;
  fresh_state("term");
  start_daemon();
  struct sk_client *c = conn();
  uint64_t a = open_session(c, "streaming", 4, 28, 0);
  append_text(c, a, "Once upon a time");
  struct sk_session_stats s0 = sstats(c, a);
  /* a temporary session whose connection is open when the daemon stops:
   * it ends with the connection, it is not kept for the restart */
  struct sk_client *tc = conn();
  struct sk_open_params tp = {.temporary = true};
  struct sk_open_result to;
  struct sk_error e = {0};
  assert_int_equal(sk_client_open(tc, &tp, &to, &e), 0);
  append_text(tc, to.session, "One day");
  sk_client_free(c);
  stop_term();
  sk_client_free(tc);
  start_daemon();
  c = conn();
  struct sk_session_summary sum;
  assert_int_equal(sk_client_resume(c, to.session, NULL, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(sk_client_resume(c, a, &sum, &e), 0);
  assert_true(sum.adopted);
  assert_int_equal(sum.seen, s0.seen);
  assert_int_equal(sum.commit, s0.commit);
  /* close deletes it for good */
  assert_int_equal(sk_client_close_session(c, a, &e), 0);
  assert_int_equal(state_dir_bytes(), 0);
  sk_client_free(c);
  /* and its id is not given again, even after a restart */
  kill9();
  start_daemon();
  c = conn();
  assert_int_equal(sk_client_resume(c, a, NULL, &e), -SK_ERR_NO_SUCH_SESSION);
  assert_int_equal(open_session(c, "dense", 0, 0, 64), to.session + 1);
  sk_client_free(c);
  kill9();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_kv_f16, test_teardown),
      cmocka_unit_test_teardown(test_fork_300, test_teardown),
      cmocka_unit_test_teardown(test_export_import, test_teardown),
      cmocka_unit_test_teardown(test_limits, test_teardown),
      cmocka_unit_test_teardown(test_sigterm_keeps, test_teardown),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
