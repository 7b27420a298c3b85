/* Attention over the KV cache, per sequence and KV head (model.h: GQA,
 * RoPE; forward.c makes the tasks). The positions each query sees are
 * those of one-token-at-a-time processing (StreamingLLM cache
 * positions). Number the tokens in stream order: the nb = nr + n_evicted that were resident
 * before this chunk's make_room (the sinks at order[0 .. min(S, nr)),
 * the evicted ones at the tail of the free list, order[n_slots -
 * n_evicted .. n_slots), the rest of the window at order[S .. nr)), then
 * the chunk's n tokens. Query i (index
 * A = nb + i) then sees, with cap = capacity - 1 and
 * shift = max(0, A - cap) window tokens already gone for it:
 *
 *   the sinks, indices 0 .. S-1, at positions 0 .. S-1;
 *   indices S + shift .. A (A is itself), at positions index - shift.
 *
 * Without evictions shift is 0 and every token sits at its index.
 *
 * Rotated keys (every policy but h2o / sink_h2o; kvcache.h): a key is
 * stored rotated at its stream index t. RoPE scores depend only on the
 * distance, <R(a) q, R(b) k> = <q, R(b - a) k>, so query P meets a key at
 * position p when it is rotated at P + (t - p). Within the window (and
 * the whole of a dense cache) t - p is the query's own T - P, so the
 * query is rotated once at its stream index T; the sinks, whose t - p is
 * t0 (the stream index of position 0), get a second rotation at P + t0.
 * No cached key is touched: a step costs O(1) rotations, not
 * O(context).
 *
 * Unrotated keys (h2o, sink_h2o: an eviction in the middle moves later
 * tokens down, so t - p differs from token to token): keys are rotated
 * at their position into kr, and rotated again only when the shift
 * changes. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "model/model_int.h"

/* Rotates the keys ts->kp[p] for positions p0 <= p < p1 into ts->kr. */
static void sk__rope_keys(const struct sk_scratch *s, const struct sk__seq *sq,
                          struct sk__tscratch *ts, uint32_t p0, uint32_t p1) {
  const struct sk_model_config *c = &s->m->cfg;
  const uint32_t hd = c->head_dim, rd = c->rope_dim;
  const float *const *src = (const float *const *)ts->kp;
  if (sq->f16) { /* halves to floats in kr, then rotated in place */
    for (uint32_t p = p0; p < p1; p++)
      sk_kernels_from_f16(ts->kr + (size_t)p * hd, ts->kp[p], hd);
    src = ts->kq;
  }
  if (sq->freq_scale == s->rope_freq_scale) {
    sk_kernels_rope_rows(ts->kr + (size_t)p0 * hd, src + p0, s->rope_cos + (size_t)p0 * rd,
                         s->rope_sin + (size_t)p0 * rd, p1 - p0, rd, hd);
    return;
  }
  for (uint32_t p = p0; p < p1; p++) { /* a cache with its own scale */
    sk__rope_angles(s->m, p, sq->freq_scale, ts->cs, ts->sn);
    sk_kernels_rope_rows(ts->kr + (size_t)p * hd, src + p, ts->cs, ts->sn, 1, rd, hd);
  }
}

/* Writes bytes [b0, b1) of each of sequence sq's new key and value rows
 * (this layer's, as attention read them: floats or halves) into the
 * cache slots they take. Called by the attention task that read those
 * bytes, after its last query: with evictions inside a chunk, the slots
 * held old keys the queries still read. */
static void sk__kv_write(const struct sk_scratch *s, const struct sk__seq *sq, uint32_t layer,
                         size_t b0, size_t b1) {
  const struct sk_kv_step *kv = &sq->kv;
  char *kl = sk_kv_layer_k(sq->in->kv, layer), *vl = sk_kv_layer_v(sq->in->kv, layer);
  const size_t esz = sq->f16 ? sizeof(uint16_t) : sizeof(float);
  const char *k = sq->f16 ? (const char *)s->k16 : (const char *)s->k;
  const char *v = sq->f16 ? (const char *)s->v16 : (const char *)s->v;
  for (uint32_t j = 0; j < sq->in->n; j++) {
    const size_t slot = kv->order[sq->nr + j]; /* a free slot until commit */
    const size_t r = (size_t)(sq->row0 + j) * s->m->cfg.kv_dim * esz;
    memcpy(kl + slot * kv->row_bytes + b0, k + r + b0, b1 - b0);
    memcpy(vl + slot * kv->row_bytes + b0, v + r + b0, b1 - b0);
  }
}

/* The attention of a cache that accumulates H2O scores (unrotated keys):
 * one task per sequence, all KV heads in order. */
static void sk__att_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__att *a = ctx;
  struct sk_scratch *s = a->s;
  const struct sk_model *m = s->m;
  const struct sk_model_config *c = &m->cfg;
  const uint32_t hd = c->head_dim, D = c->kv_dim, rd = c->rope_dim;
  const uint32_t group = c->n_head / c->n_kv_head;
  const float scale = 1.0f / sqrtf((float)hd);
  const uint32_t si = s->task_seq[task];
  const struct sk__seq *sq = &s->seqs[si];
  const struct sk_kv_step *kv = &sq->kv;
  const bool scores = kv->scores;
  const uint32_t e = sq->in->n_evicted, nr = sq->nr, nb = nr + e;
  const uint32_t sr = sq->n_sink < nr ? sq->n_sink : nr; /* resident sinks */
  const uint32_t cap = kv->capacity - 1;
  const char *kl = sk_kv_layer_k(sq->in->kv, a->layer), *vl = sk_kv_layer_v(sq->in->kv, a->layer);
  const size_t rb = kv->row_bytes;
  struct sk__tscratch *ts = &s->ts[thread];
  const bool tables = sq->freq_scale == s->rope_freq_scale;
  /* one KV head, or all of them for a cache that accumulates scores (one
   * thread adds to its score array, in head order) */
  const uint32_t kvh0 = s->task_kvh[task], kvh1 = scores ? c->n_kv_head : kvh0 + 1;
  for (uint32_t kvh = kvh0; kvh < kvh1; kvh++) {
  const size_t off = (size_t)kvh * hd * (sq->f16 ? 2 : 4); /* bytes into a row */
  double mass_sum = 0.0, ent_sum = 0.0;

/* cos/sin of position p into cs/sn */
#define SK__ANGLES(p)                                                       \
  const float *cs = s->rope_cos + (size_t)(p) * rd;                         \
  const float *sn = s->rope_sin + (size_t)(p) * rd;                         \
  if (!tables) {                                                            \
    sk__rope_angles(m, (p), sq->freq_scale, ts->cs, ts->sn);                \
    cs = ts->cs;                                                            \
    sn = ts->sn;                                                            \
  }
/* cache slot of the resident or evicted token with stream-order index
 * idx, sr <= idx < nb: make_room put the evicted slots, oldest first, at
 * the tail of the free list (kvcache.h) */
#define SK__SLOT(idx)                                                  \
  ((idx) - sr < e ? kv->order[kv->n_slots - e + ((idx) - sr)] \
                  : kv->order[(idx) - e])

  for (uint32_t p = 0; p < sr; p++) {
    const uint32_t slot = kv->order[p];
    ts->kp[p] = kl + slot * rb + off;
    ts->vp[p] = vl + slot * rb + off;
    ts->sp[p] = slot;
  }
  sk__rope_keys(s, sq, ts, 0, sr);
  uint32_t rot_shift = UINT32_MAX, rot_next = sr; /* positions < rot_next done */
  for (uint32_t i = 0; i < sq->in->n; i++) {
    const uint32_t row = sq->row0 + i;
    const uint32_t A = nb + i, shift = A > cap ? A - cap : 0, P = A - shift;
    if (shift != rot_shift) {
      rot_shift = shift;
      rot_next = sr;
    }
    for (uint32_t p = rot_next; p <= P; p++) {
      const uint32_t idx = p + shift;
      const void *k, *v;
      if (idx < nb) {
        const uint32_t slot = SK__SLOT(idx);
        k = kl + slot * rb;
        v = vl + slot * rb;
        ts->sp[p] = slot;
      } else { /* this chunk's rows, as the cache will hold them */
        const size_t r = (size_t)(sq->row0 + idx - nb) * D;
        k = sq->f16 ? (const void *)(s->k16 + r) : (const void *)(s->k + r);
        v = sq->f16 ? (const void *)(s->v16 + r) : (const void *)(s->v + r);
        ts->sp[p] = kv->order[nr + (idx - nb)]; /* the slot it is written to */
      }
      ts->kp[p] = (const char *)k + off;
      ts->vp[p] = (const char *)v + off;
    }
    sk__rope_keys(s, sq, ts, rot_next, P + 1);
    rot_next = P + 1;

    SK__ANGLES(P);
    for (uint32_t g = 0; g < group; g++) {
      const uint32_t h = kvh * group + g; /* ggml's broadcast: q head h -> kv h/g */
      float *qh = s->q + (size_t)row * c->q_dim + (size_t)h * hd;
      sk__rope(qh, qh, c, cs, sn);
      sk_kernels_scores(qh, ts->kq, P + 1, hd, ts->att);
      const bool last = i + 1 == sq->in->n;
      double ent = 0.0;
      sk_kernels_softmax(ts->att, P + 1, scale, last ? &ent : NULL);
      /* H2O (kvcache.h): every probability adds to its position's score,
       * summed over query heads and layers (or to the row's own
       * contributions, sk_seq.row_scores) */
      if (scores) {
        float *sc = sq->in->row_scores ? sq->in->row_scores + (size_t)i * kv->n_slots : kv->score;
        for (uint32_t p = 0; p <= P; p++) sc[ts->sp[p]] += ts->att[p];
      }
      if (last) { /* diagnostics of the sequence's last token */
        const uint32_t probe = sq->probe < P + 1 ? sq->probe : P + 1;
        double mass = 0.0;
        for (uint32_t p = 0; p < probe; p++) mass += (double)ts->att[p];
        mass_sum += mass;
        ent_sum += ent;
      }
      float *out = s->att_out + (size_t)row * c->q_dim + (size_t)h * hd;
      if (sq->f16)
        sk_kernels_wsum_f16(out, ts->att, (const uint16_t *const *)ts->vp, P + 1, hd);
      else
        sk_kernels_wsum(out, ts->att, (const float *const *)ts->vp, P + 1, hd);
    }
  }
  s->mass_part[(size_t)si * c->n_kv_head + kvh] = mass_sum;
  s->ent_part[(size_t)si * c->n_kv_head + kvh] = ent_sum;
  } /* kv heads */
  sk__kv_write(s, sq, a->layer, 0, rb);
#undef SK__ANGLES
#undef SK__SLOT
}

/* Cache slots a rotated-keys task walks at a time, all its heads over
 * one block before the next (sk__att_rot_task); a task of one KV head
 * with several rows, SK__ATT_BLOCK_ONE. */
#define SK__ATT_BLOCK 32u
#define SK__ATT_BLOCK_ONE 256u

/* Pointers to one head's slice (off bytes into each row) of the rows
 * rows[p0..p1): rows + p0 itself when the rows already point at the
 * slice (one: a task of one KV head), else written into bp. */
static const void *const *sk__att_slices(const void **rows, uint32_t p0, uint32_t p1, bool one,
                                        size_t off, const void **bp) {
  if (one) return rows + p0;
  for (uint32_t p = p0; p < p1; p++) bp[p - p0] = (const char *)rows[p] + off;
  return bp;
}

/* One chunk of rows of sk__att_rot_task: row r (i0 + r) sees the sinks
 * [0, sr) of ts->kp / ts->vp and the window indices [wa[r], wb[r]) at
 * positions index - shift[r] (np[r] positions); window index idx is at
 * sr + idx - lo (lo = wa[0] <= every wa[r]), total entries in all, walked
 * blk at a time; query heads [h0, h0 + nh); bp: room for one head's slice
 * of a block's rows. */
struct sk__att_chunk {
  uint32_t i0, nrow, sr, lo, total, blk, h0, nh, group;
  bool one;
  size_t esz;
  const void **bp;
  uint32_t shift[SK__ATT_ROWS], np[SK__ATT_ROWS], wa[SK__ATT_ROWS], wb[SK__ATT_ROWS];
};

/* Row r's part of the block [q0, q1) of ts->kp / ts->vp: the sinks
 * [q0, qs) at positions q, the window [qw0, qw1) at positions q - ds
 * (index lo - sr + q, minus the row's shift: ds = shift[r] - shift[0]). */
#define SK__ATT_PART(ch, r)                                                \
  const uint32_t qs = q1 < (ch)->sr ? q1 : (ch)->sr;                       \
  const uint32_t wq0 = (ch)->sr + (ch)->wa[r] - (ch)->lo;                  \
  const uint32_t wq1 = (ch)->sr + (ch)->wb[r] - (ch)->lo;                  \
  const uint32_t qw0 = q0 > wq0 ? q0 : wq0, qw1 = q1 < wq1 ? q1 : wq1;     \
  const uint32_t ds = (ch)->shift[r] - (ch)->shift[0]

/* The scores of every row and query head of chunk ch, block by block of
 * its cache slots, into ts->att (row r, head g at (r nh + g) T). */
static void sk__att_rot_scores(struct sk_scratch *s, const struct sk__seq *sq,
                               struct sk__tscratch *ts, const struct sk__att_chunk *ch) {
  const uint32_t hd = s->m->cfg.head_dim, T = s->max_ctx, nh = ch->nh;
  for (uint32_t q0 = 0; q0 < ch->total; q0 += ch->blk) {
    const uint32_t q1 = ch->total - q0 < ch->blk ? ch->total : q0 + ch->blk;
    for (uint32_t g = 0; g < nh; g++) {
      const void *const *bk = sk__att_slices(
          ts->kp, q0, q1, ch->one, (size_t)((ch->h0 + g) / ch->group) * hd * ch->esz, ch->bp);
      for (uint32_t r = 0; r < ch->nrow; r++) {
        SK__ATT_PART(ch, r);
        float *att = ts->att + ((size_t)r * nh + g) * T;
        const size_t qo = ((size_t)r * nh + g) * hd;
        /* sinks meet the query rotated for them; each score depends
         * only on its query and key, not on its neighbours */
        if (qs > q0) {
          if (sq->f16)
            sk_kernels_scores_f16(ts->qs + qo, (const uint16_t *const *)bk, qs - q0, hd,
                                  att + q0);
          else
            sk_kernels_scores(ts->qs + qo, (const float *const *)bk, qs - q0, hd, att + q0);
        }
        if (qw1 > qw0) {
          if (sq->f16)
            sk_kernels_scores_f16(ts->qw + qo, (const uint16_t *const *)bk + (qw0 - q0),
                                  qw1 - qw0, hd, att + (qw0 - ds));
          else
            sk_kernels_scores(ts->qw + qo, (const float *const *)bk + (qw0 - q0), qw1 - qw0, hd,
                              att + (qw0 - ds));
        }
      }
    }
  }
}

/* The weighted sums of the values of chunk ch into s->att_out, block by
 * block, each going on from the last block's (sk_kernels_wsum_add). */
static void sk__att_rot_wsum(struct sk_scratch *s, const struct sk__seq *sq,
                             struct sk__tscratch *ts, const struct sk__att_chunk *ch) {
  const struct sk_model_config *c = &s->m->cfg;
  const uint32_t hd = c->head_dim, T = s->max_ctx, nh = ch->nh;
  for (uint32_t q0 = 0; q0 < ch->total; q0 += ch->blk) {
    const uint32_t q1 = ch->total - q0 < ch->blk ? ch->total : q0 + ch->blk;
    for (uint32_t g = 0; g < nh; g++) {
      const void *const *bv = sk__att_slices(
          ts->vp, q0, q1, ch->one, (size_t)((ch->h0 + g) / ch->group) * hd * ch->esz, ch->bp);
      for (uint32_t r = 0; r < ch->nrow; r++) {
        SK__ATT_PART(ch, r);
        const float *att = ts->att + ((size_t)r * nh + g) * T;
        float *out = s->att_out + (size_t)(sq->row0 + ch->i0 + r) * c->q_dim +
                     (size_t)(ch->h0 + g) * hd;
        /* the row's positions in order: sinks [q0, qs), then the
         * window [qw0, qw1); its first (position 0) starts the sum */
        const uint32_t parts[2][3] = {{q0, qs, 0}, {qw0, qw1, ds}};
        for (int k = 0; k < 2; k++) {
          const uint32_t u0 = parts[k][0], u1 = parts[k][1], pos = u0 - parts[k][2];
          if (u1 <= u0) continue;
          const void *const *rows = bv + (u0 - q0);
          const uint32_t m = u1 - u0;
          if (sq->f16) {
            const uint16_t *const *h = (const uint16_t *const *)rows;
            if (pos) sk_kernels_wsum_add_f16(out, att + pos, h, m, hd);
            else sk_kernels_wsum_f16(out, att + pos, h, m, hd);
          } else {
            const float *const *f = (const float *const *)rows;
            if (pos) sk_kernels_wsum_add(out, att + pos, f, m, hd);
            else sk_kernels_wsum(out, att + pos, f, m, hd);
          }
        }
      }
    }
  }
}
#undef SK__ATT_PART

/* The softmaxes of chunk ch's scores, and the diagnostics of the
 * sequence's last token (si: the sequence). */
static void sk__att_rot_softmax(struct sk_scratch *s, const struct sk__seq *sq, uint32_t si,
                                struct sk__tscratch *ts, const struct sk__att_chunk *ch) {
  const struct sk_model_config *c = &s->m->cfg;
  const float scale = 1.0f / sqrtf((float)c->head_dim);
  const uint32_t T = s->max_ctx;
  for (uint32_t r = 0; r < ch->nrow; r++) {
    const bool last = ch->i0 + r + 1 == sq->in->n;
    for (uint32_t g = 0; g < ch->nh; g++) {
      float *att = ts->att + ((size_t)r * ch->nh + g) * T;
      double ent = 0.0;
      sk_kernels_softmax(att, ch->np[r], scale, last ? &ent : NULL);
      if (last) { /* diagnostics of the sequence's last token */
        const uint32_t probe = sq->probe < ch->np[r] ? sq->probe : ch->np[r];
        double mass = 0.0;
        for (uint32_t p = 0; p < probe; p++) mass += (double)att[p];
        const size_t kh = (size_t)si * c->n_kv_head + (ch->h0 + g) / ch->group;
        s->mass_part[kh] += mass;
        s->ent_part[kh] += ent;
      }
    }
  }
}

/* The attention of a cache with rotated keys over KV heads [task_kvh,
 * + kvh_per) of one sequence, s->att_rows of its rows at a time: the
 * scores of every query head and row, block by block of cache slots,
 * then the softmaxes, then the weighted sums block by block, each going
 * on from the last block's (sk_kernels_wsum_add). Each block of keys and
 * values is read once for all the rows: a chunk of a long prefill read
 * the whole cache once per row before. The same bits as one row and one
 * head walking all its positions: a score depends only on its query and
 * key, and each sum adds in position order, which is the order of the
 * stream indices the blocks walk (row i sees the sinks, then the window
 * indices S + shift_i .. A_i, the visible part of each block). The rows
 * of a block are read whole (heads side by side) while they are in
 * cache; one head at a time read 256 of every 3 KB row, 3 KB apart, from
 * DRAM (16 sessions of the 110M model: attention took ~14% less CPU time
 * with blocks of 32, measured; prefetching the next block did not
 * help). */
static void sk__att_rot_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__att *a = ctx;
  struct sk_scratch *s = a->s;
  const struct sk_model_config *c = &s->m->cfg;
  const uint32_t hd = c->head_dim, D = c->kv_dim, rd = c->rope_dim;
  const uint32_t group = c->n_head / c->n_kv_head;
  const uint32_t si = s->task_seq[task];
  const struct sk__seq *sq = &s->seqs[si];
  const struct sk_kv_step *kv = &sq->kv;
  const uint32_t e = sq->in->n_evicted, nr = sq->nr, nb = nr + e, n = sq->in->n;
  const uint32_t sr = sq->n_sink < nr ? sq->n_sink : nr; /* resident sinks */
  const uint32_t cap = kv->capacity - 1;
  struct sk__tscratch *ts = &s->ts[thread];
  const uint32_t kvh0 = s->task_kvh[task];
  const uint32_t kvh1 = kvh0 + a->kvh_per < c->n_kv_head ? kvh0 + a->kvh_per : c->n_kv_head;
  const uint32_t h0 = kvh0 * group, nh = (kvh1 - kvh0) * group; /* query heads */
  const size_t esz = sq->f16 ? sizeof(uint16_t) : sizeof(float);
  const size_t b0 = (size_t)kvh0 * hd * esz, b1 = (size_t)kvh1 * hd * esz; /* of a row */
  const void *bp[SK__ATT_BLOCK]; /* one head's slice of a block's rows */
  /* A task of one KV head reads only its slice of each row: its
   * pointers point at the slice, and one row walks all the slots in one
   * go (small heads pay for every kernel call); several take blocks of
   * SK__ATT_BLOCK_ONE slots. */
  const bool one = kvh1 - kvh0 == 1;
  const size_t at = one ? b0 : 0; /* bytes into a row of ts->kp / ts->vp */
  /* the layer's rows, read once (kvstep.h) */
  const char *kl = (const char *)sk_kv_layer_k(sq->in->kv, a->layer) + at;
  const char *vl = (const char *)sk_kv_layer_v(sq->in->kv, a->layer) + at;
  const size_t rb = kv->row_bytes;
  const uint32_t *order = kv->order, n_slots = kv->n_slots;

  for (uint32_t kvh = kvh0; kvh < kvh1; kvh++) {
    s->mass_part[(size_t)si * c->n_kv_head + kvh] = 0.0;
    s->ent_part[(size_t)si * c->n_kv_head + kvh] = 0.0;
  }
  /* ts->kp / ts->vp: whole rows, as sk__att_task's at offset 0; the
   * sinks at [0, sr) */
  for (uint32_t p = 0; p < sr; p++) {
    ts->kp[p] = kl + order[p] * rb;
    ts->vp[p] = vl + order[p] * rb;
  }
  struct sk__att_chunk ch = {
      .sr = sr, .h0 = h0, .nh = nh, .group = group, .one = one, .esz = esz, .bp = bp};
  for (uint32_t i0 = 0; i0 < n; i0 += s->att_rows) {
    const uint32_t nrow = n - i0 < s->att_rows ? n - i0 : s->att_rows;
    ch.i0 = i0;
    ch.nrow = nrow;
    for (uint32_t r = 0; r < nrow; r++) {
      const uint32_t A = nb + i0 + r;
      ch.shift[r] = A > cap ? A - cap : 0;
      ch.np[r] = A - ch.shift[r] + 1;
      ch.wa[r] = sr + ch.shift[r];
      ch.wb[r] = A + 1;
    }
    const uint32_t lo = ch.wa[0], hi = ch.wb[nrow - 1];
    ch.lo = lo;
    ch.total = sr + (hi - lo);
    for (uint32_t idx = lo; idx < hi; idx++) {
      const uint32_t q = sr + idx - lo;
      if (idx < nb) {
        const uint32_t slot = idx - sr < e ? order[n_slots - e + (idx - sr)] : order[idx - e];
        ts->kp[q] = kl + slot * rb;
        ts->vp[q] = vl + slot * rb;
      } else { /* this chunk's rows, as the cache will hold them */
        const size_t r = (size_t)(sq->row0 + idx - nb) * D;
        ts->kp[q] = (sq->f16 ? (const char *)(s->k16 + r) : (const char *)(s->k + r)) + at;
        ts->vp[q] = (sq->f16 ? (const char *)(s->v16 + r) : (const char *)(s->v + r)) + at;
      }
    }
    ch.blk = !one ? SK__ATT_BLOCK : nrow == 1 ? ch.total : SK__ATT_BLOCK_ONE;

    for (uint32_t r = 0; r < nrow; r++) {
      const uint32_t row = sq->row0 + i0 + r;
      for (uint32_t g = 0; g < nh; g++) {
        const float *qh = s->q + (size_t)row * c->q_dim + (size_t)(h0 + g) * hd;
        const size_t qo = ((size_t)r * nh + g) * hd;
        sk__rope(ts->qw + qo, qh, c, s->row_cos + (size_t)row * rd, s->row_sin + (size_t)row * rd);
        if (sr)
          sk__rope(ts->qs + qo, qh, c, s->sink_cos + (size_t)row * rd,
                   s->sink_sin + (size_t)row * rd);
      }
    }
    sk__att_rot_scores(s, sq, ts, &ch);
    sk__att_rot_softmax(s, sq, si, ts, &ch);
    sk__att_rot_wsum(s, sq, ts, &ch);
  }
  /* this task's heads of the new keys and values (no other task reads
   * those bytes) */
  sk__kv_write(s, sq, a->layer, b0, b1);
}

/* One attention task: sk__att_rot_task's for a cache with rotated keys,
 * sk__att_task's for one that accumulates scores. */
void sk__att_any_task(void *ctx, uint32_t task, uint32_t thread) {
  const struct sk__att *a = ctx;
  if (a->s->seqs[a->s->task_seq[task]].rotated) sk__att_rot_task(ctx, task, thread);
  else sk__att_task(ctx, task, thread);
}
