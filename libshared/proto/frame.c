/* Frame codec: 4-byte big-endian length + body.
 *
 * The reader keeps the unconsumed bytes in buf[pos..len). Its memory stays
 * bounded as long as the caller drains it (calls sk_frame_reader_next until
 * it returns 0) after every feed: at that point at most one incomplete frame
 * (<= max_frame + header) is buffered, and a feed adds its own bytes. A body
 * whose declared length exceeds max_frame is never buffered: its bytes are
 * dropped (counted down in `skip`) as they arrive.
 */
#include "sinkd/protocol.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* First allocation: enough for typical requests in one go. */
#define SK__FRAME_INITIAL_CAP 4096u
/* An empty buffer larger than this is given back before the next feed, so
 * an idle connection does not keep the memory of its largest frame. */
#define SK__FRAME_SHRINK_CAP (64u * 1024u)

void sk_frame_header_put(uint8_t out[SK_FRAME_HEADER_SIZE], uint32_t len) {
  out[0] = (uint8_t)(len >> 24);
  out[1] = (uint8_t)(len >> 16);
  out[2] = (uint8_t)(len >> 8);
  out[3] = (uint8_t)len;
}

uint32_t sk_frame_header_get(const uint8_t in[SK_FRAME_HEADER_SIZE]) {
  return (uint32_t)in[0] << 24 | (uint32_t)in[1] << 16 |
         (uint32_t)in[2] << 8 | (uint32_t)in[3];
}

void sk_frame_reader_init(struct sk_frame_reader *r, uint32_t max_frame) {
  memset(r, 0, sizeof *r);
  r->max_frame =
      max_frame > SK_FRAME_MAX_CEILING ? SK_FRAME_MAX_CEILING : max_frame;
}

void sk_frame_reader_free(struct sk_frame_reader *r) {
  if (!r) return;
  free(r->buf);
  r->buf = NULL;
  r->len = r->pos = r->cap = 0;
  r->skip = 0;
}

/* Makes room for `extra` more bytes after the buffered ones: first by
 * moving the unconsumed bytes to the front, then by growing (doubling,
 * but never past one whole frame unless this feed alone needs more). */
static int sk__frame_reserve(struct sk_frame_reader *r, size_t extra) {
  size_t used = r->len - r->pos;
  if (extra > SIZE_MAX - used) return -SK_ERR_NO_MEMORY;
  size_t need = used + extra;

  if (used == 0 && r->cap > SK__FRAME_SHRINK_CAP &&
      need <= SK__FRAME_SHRINK_CAP) {
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
  }
  if (r->pos > 0 && r->len + extra > r->cap) {
    memmove(r->buf, r->buf + r->pos, used);
    r->len = used;
    r->pos = 0;
  }
  if (r->len + extra <= r->cap) return 0;

  size_t frame_cap = (size_t)r->max_frame + SK_FRAME_HEADER_SIZE;
  size_t cap = r->cap ? r->cap : SK__FRAME_INITIAL_CAP;
  while (cap < need && cap <= SIZE_MAX / 2) cap *= 2;
  if (cap > frame_cap) cap = frame_cap;
  if (cap < need) cap = need;
  uint8_t *buf = realloc(r->buf, cap);
  if (!buf) return -SK_ERR_NO_MEMORY;
  r->buf = buf;
  r->cap = cap;
  return 0;
}

int sk_frame_reader_trim(struct sk_frame_reader *r) {
  size_t used = r->len - r->pos;
  if (r->cap <= SK__FRAME_SHRINK_CAP) return 0;
  if (used == 0) {
    free(r->buf);
    r->buf = NULL;
    r->len = r->pos = r->cap = 0;
    return 0;
  }
  if (used > SK__FRAME_SHRINK_CAP / 2) return 0; /* a large frame on its way */
  size_t cap = SK__FRAME_INITIAL_CAP;
  while (cap < used) cap *= 2;
  uint8_t *buf = malloc(cap);
  if (!buf) return -SK_ERR_NO_MEMORY;
  memcpy(buf, r->buf + r->pos, used);
  free(r->buf);
  r->buf = buf;
  r->len = used;
  r->pos = 0;
  r->cap = cap;
  return 0;
}

int sk_frame_reader_feed(struct sk_frame_reader *r, const void *data,
                         size_t n) {
  const uint8_t *p = data;
  /* Body bytes of an oversized frame: drop them (nothing is buffered while
   * skip > 0, see sk_frame_reader_next). */
  if (r->skip > 0) {
    size_t drop = r->skip < n ? (size_t)r->skip : n;
    r->skip -= drop;
    p += drop;
    n -= drop;
  }
  if (n == 0) return 0;
  int rc = sk__frame_reserve(r, n);
  if (rc < 0) return rc;
  memcpy(r->buf + r->len, p, n);
  r->len += n;
  return 0;
}

int sk_frame_reader_next(struct sk_frame_reader *r, const uint8_t **ret_body,
                         size_t *ret_len) {
  size_t avail = r->len - r->pos;
  if (r->skip > 0 || avail < SK_FRAME_HEADER_SIZE) return 0;

  uint32_t declared = sk_frame_header_get(r->buf + r->pos);
  if (declared > r->max_frame) {
    /* Consume the header and whatever of the body is already here; the
     * rest is dropped by feed as it arrives. */
    size_t have = avail - SK_FRAME_HEADER_SIZE;
    size_t drop = have < declared ? have : declared;
    r->pos += SK_FRAME_HEADER_SIZE + drop;
    r->skip = (uint64_t)declared - drop;
    if (r->pos == r->len) r->pos = r->len = 0;
    *ret_len = declared;
    return -SK_ERR_TOO_LARGE;
  }
  if (avail - SK_FRAME_HEADER_SIZE < declared) return 0;

  *ret_body = r->buf + r->pos + SK_FRAME_HEADER_SIZE;
  *ret_len = declared;
  r->pos += SK_FRAME_HEADER_SIZE + declared;
  /* The body stays where it is until the next feed; only the indices
   * restart, so the next feed needs no memmove. */
  if (r->pos == r->len) r->pos = r->len = 0;
  return 1;
}
