/* Fuzz target: the HTTP request reader (daemon/http/httpreq.c, over
 * http_parser) and the OpenAI request checks (sk_openai_parse), with
 * oracles.
 *
 * Input: byte 0 chooses the body limit and how the stream is cut into
 * reads; the rest is the byte stream a client sends. Checked:
 *  - the requests read (method, target, Authorization, body, keep-alive),
 *    whatever the cuts, equal those of reading the stream in one piece,
 *    and both readings end in an error or neither does (which 4xx may
 *    differ: http_parser hands a header to the callbacks at the end of
 *    each read, so a header past the size limit can be counted before
 *    or after a syntax error further on is seen);
 *  - no request exceeds the limits: target, headers, body (its bytes
 *    NUL-terminated), Authorization;
 *  - an error is a 4xx (or 503, out of memory; or 501, a transfer coding
 *    other than chunked) with a message;
 *  - every body, checked as a completion and as a chat request, is either
 *    refused with 400 and a message, or gives values inside their ranges.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "http/httpreq.h"
#include "http/oaireq.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

/* What one reading of the stream gave: a digest of each request. */
struct outcome {
  unsigned n_requests;
  uint64_t digest;  /* FNV-1a over the requests' fields */
  int status;       /* final error, 0 if none */
};

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static void check_body(const char *body, size_t len) {
  for (int chat = 0; chat < 2; chat++) {
    struct sk_openai_params p;
    char msg[256] = "";
    int st = sk_openai_parse(body, len, chat, &p, msg, sizeof msg);
    if (st) {
      if (st != 400 || !msg[0]) sk_fuzz_fail("parse refused with %d '%s'", st, msg);
      continue;
    }
    if (p.max_tokens > SK_LIMIT_OPENAI_MAX_TOKENS) sk_fuzz_fail("max_tokens above ceiling");
    if (!(p.temperature >= 0 && p.temperature <= 2)) sk_fuzz_fail("temperature out of range");
    if (!(p.top_p >= 0 && p.top_p <= 1)) sk_fuzz_fail("top_p out of range");
    if (p.n_stop > SK_LIMIT_OPENAI_STOPS) sk_fuzz_fail("too many stops");
    for (uint32_t i = 0; i < p.n_stop; i++)
      if (p.stop_len[i] < 1 || p.stop_len[i] > SK_LIMIT_OPENAI_STOP_BYTES)
        sk_fuzz_fail("stop string of %zu bytes", p.stop_len[i]);
    if (chat ? !p.messages : !p.prompt) sk_fuzz_fail("accepted without its input");
    if (p.session == SK_OPENAI_SESSION_ID && p.session_id == 0) sk_fuzz_fail("session 0");
    sk_openai_params_free(&p);
  }
}

static void check_request(const struct sk_http_reader *r) {
  if (r->url_len > SK_LIMIT_HTTP_URL || strlen(r->url) > r->url_len)
    sk_fuzz_fail("target of %zu bytes", r->url_len);
  if (r->header_bytes > SK_LIMIT_HTTP_HEADER_BYTES) sk_fuzz_fail("headers of %zu bytes", r->header_bytes);
  if (r->auth_len > SK_LIMIT_HTTP_AUTH) sk_fuzz_fail("authorization of %zu bytes", r->auth_len);
  if (r->body_len > r->max_body) sk_fuzz_fail("body of %zu bytes > %u", r->body_len, r->max_body);
  if (r->body && r->body[r->body_len] != 0) sk_fuzz_fail("body not terminated");
}

/* Reads data in pieces of the sizes cut[] gives (cycling); 0 = whole. */
static struct outcome read_stream(const uint8_t *data, size_t size, uint32_t max_body,
                                  const uint8_t *cuts, size_t n_cuts, bool check) {
  struct outcome o = {0, 1469598103934665603ull, 0};
  struct sk_http_reader r;
  sk_http_reader_init(&r, max_body);
  size_t pos = 0, ci = 0;
  while (pos < size) {
    size_t n = size - pos;
    if (n_cuts) {
      size_t c = (size_t)cuts[ci++ % n_cuts] + 1;
      if (c < n) n = c;
    }
    /* A read: fed until taken whole (the server stops at each request). */
    size_t off = 0;
    while (off < n) {
      size_t used = 0;
      int rc = sk_http_reader_feed(&r, (const char *)data + pos + off, n - off, &used);
      if (used > n - off) sk_fuzz_fail("used %zu of %zu", used, n - off);
      off += used;
      if (rc == SK_HTTP_READ_ERROR) {
        o.status = r.status;
        if (!((r.status >= 400 && r.status < 500) || r.status == 503 ||
              (r.status == 501 && strncmp(r.message, "Transfer-Encoding '", 19) == 0)) ||
            !r.message[0])
          sk_fuzz_fail("error %d '%s'", r.status, r.message);
        goto out;
      }
      if (rc == SK_HTTP_READ_REQUEST) {
        check_request(&r);
        o.n_requests++;
        uint32_t m = (uint32_t)r.method;
        o.digest = fnv(o.digest, &m, sizeof m);
        o.digest = fnv(o.digest, r.url, r.url_len + 1);
        o.digest = fnv(o.digest, r.auth, r.auth_len + 1);
        o.digest = fnv(o.digest, &r.keep_alive, sizeof r.keep_alive);
        o.digest = fnv(o.digest, r.body ? r.body : "", r.body_len);
        if (check) check_body(r.body ? r.body : "", r.body_len);
        sk_http_reader_next(&r);
      } else if (rc == SK_HTTP_READ_MORE && used == 0) {
        break;
      }
    }
    pos += n;
  }
out:
  sk_http_reader_free(&r);
  return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  data++;
  size--;
  static const uint32_t limits[4] = {64, 1024, 65536, 1u << 20};
  uint32_t max_body = limits[mode & 3];
  /* Cuts: taken from the input's own tail bytes (up to 8). */
  size_t n_cuts = (mode >> 2) & 7;
  if (n_cuts > size) n_cuts = size;
  const uint8_t *cuts = data + size - n_cuts;
  struct outcome whole = read_stream(data, size, max_body, NULL, 0, true);
  struct outcome cut = read_stream(data, size, max_body, cuts, n_cuts, false);
  if (whole.n_requests != cut.n_requests || whole.digest != cut.digest ||
      (whole.status == 0) != (cut.status == 0))
    sk_fuzz_fail("cut reading differs: %u/%u requests, status %d/%d", whole.n_requests,
                 cut.n_requests, whole.status, cut.status);
  return 0;
}
