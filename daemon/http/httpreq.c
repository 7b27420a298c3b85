/* HTTP/1.1 request reading: http_parser does the syntax (request line,
 * headers, Content-Length and chunked bodies); the callbacks below bound
 * every size before storing anything and keep the request's method,
 * target, Authorization, Expect, Content-Encoding, Transfer-Encoding and
 * body. */
#include "http/httpreq.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { HDR_OTHER, HDR_AUTH, HDR_EXPECT, HDR_ENCODING, HDR_TE };

static struct sk_http_reader *reader_of(http_parser *p) { return p->data; }

static int fail(struct sk_http_reader *r, int status, const char *msg) {
  r->status = status;
  snprintf(r->message, sizeof r->message, "%s", msg);
  return 1; /* http_parser stops with HPE_CB_* */
}

/* Counts bytes of the request line and headers against the limit. */
static int count_header(struct sk_http_reader *r, size_t len) {
  r->header_bytes += len;
  if (r->header_bytes > SK_LIMIT_HTTP_HEADER_BYTES)
    return fail(r, 431, "request headers are larger than 16 KiB");
  return 0;
}

static int on_message_begin(http_parser *p) {
  struct sk_http_reader *r = reader_of(p);
  r->started = true;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  struct sk_http_reader *r = reader_of(p);
  if (count_header(r, len)) return 1;
  if (r->url_len + len > SK_LIMIT_HTTP_URL) return fail(r, 414, "request target is longer than 2048 bytes");
  memcpy(r->url + r->url_len, at, len);
  r->url_len += len;
  r->url[r->url_len] = 0;
  return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
  struct sk_http_reader *r = reader_of(p);
  if (count_header(r, len)) return 1;
  if (r->field_done || r->n_headers == 0) {
    /* A new header begins (a name may arrive in several pieces). */
    if (++r->n_headers > SK_LIMIT_HTTP_HEADERS) return fail(r, 431, "more than 64 request headers");
    r->field_len = 0;
    r->field_done = false;
  }
  for (size_t i = 0; i < len; i++) {
    if (r->field_len < sizeof r->field - 1) {
      char ch = at[i];
      r->field[r->field_len] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    r->field_len++; /* counts on: a longer name matches nothing below */
  }
  size_t n = r->field_len < sizeof r->field - 1 ? r->field_len : sizeof r->field - 1;
  r->field[n] = 0;
  r->header_field = HDR_OTHER;
  if (r->field_len == 13 && strcmp(r->field, "authorization") == 0) r->header_field = HDR_AUTH;
  if (r->field_len == 6 && strcmp(r->field, "expect") == 0) r->header_field = HDR_EXPECT;
  if (r->field_len == 16 && strcmp(r->field, "content-encoding") == 0)
    r->header_field = HDR_ENCODING;
  if (r->field_len == 17 && strcmp(r->field, "transfer-encoding") == 0) r->header_field = HDR_TE;
  return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  struct sk_http_reader *r = reader_of(p);
  if (count_header(r, len)) return 1;
  if (!r->field_done) {
    r->field_done = true;
    if (r->header_field == HDR_AUTH) {
      r->auth_len = 0; /* a repeated Authorization: the last one counts */
      r->auth_too_long = false;
    }
  }
  if (r->header_field == HDR_AUTH) {
    if (r->auth_too_long) return 0;
    if (r->auth_len + len > SK_LIMIT_HTTP_AUTH) {
      /* none of it is kept, however the value was cut into pieces */
      r->auth_too_long = true;
      r->auth_len = 0;
      r->auth[0] = 0;
      return 0;
    }
    memcpy(r->auth + r->auth_len, at, len);
    r->auth_len += len;
    r->auth[r->auth_len] = 0;
  } else if (r->header_field == HDR_EXPECT) {
    /* The value may come in pieces; longer values match nothing. */
    for (size_t i = 0; i < len; i++, r->expect_len++)
      if (r->expect_len < sizeof r->expect - 1) r->expect[r->expect_len] = at[i];
    if (r->expect_len < sizeof r->expect) r->expect[r->expect_len] = 0;
    else r->expect[0] = 0;
  } else if (r->header_field == HDR_ENCODING) {
    /* a prefix for the message; any coding but identity is refused (a
     * repeated header continues the value, so it is refused too) */
    for (size_t i = 0; i < len; i++, r->encoding_len++)
      if (r->encoding_len < sizeof r->encoding - 1) r->encoding[r->encoding_len] = at[i];
    size_t n = r->encoding_len < sizeof r->encoding - 1 ? r->encoding_len : sizeof r->encoding - 1;
    r->encoding[n] = 0;
    r->encoded = r->encoding_len != 8 || strcasecmp(r->encoding, "identity") != 0;
  } else if (r->header_field == HDR_TE) {
    /* a prefix for the message (a repeated header continues the value) */
    r->has_te = true;
    for (size_t i = 0; i < len; i++, r->te_len++)
      if (r->te_len < sizeof r->te - 1) r->te[r->te_len] = at[i];
    size_t n = r->te_len < sizeof r->te - 1 ? r->te_len : sizeof r->te - 1;
    r->te[n] = 0;
  }
  return 0;
}

/* Whether the Transfer-Encoding, if any, is chunked alone: the only
 * coding read. Another coding before it (gzip, chunked) would leave the
 * body encoded, and RFC 9112 sec. 6.1 says to answer 501 to a coding
 * the server does not know. */
static bool te_ok(const struct sk_http_reader *r) {
  if (!r->has_te) return true;
  if (r->te_len >= sizeof r->te) return false; /* longer than any "chunked" */
  size_t n = r->te_len;
  const char *v = r->te;
  while (n && (*v == ' ' || *v == '\t')) v++, n--;
  while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
  return n == 7 && strncasecmp(v, "chunked", 7) == 0;
}

static int fail_te(struct sk_http_reader *r) {
  char msg[96];
  snprintf(msg, sizeof msg, "Transfer-Encoding '%s%s' is not supported: send the body as is or "
           "chunked", r->te, r->te_len >= sizeof r->te ? "..." : "");
  return fail(r, 501, msg);
}

static int on_headers_complete(http_parser *p) {
  struct sk_http_reader *r = reader_of(p);
  r->method = (enum http_method)p->method;
  r->keep_alive = http_should_keep_alive(p) != 0;
  bool chunked = (p->flags & F_CHUNKED) != 0;
  if (!chunked && p->content_length != ULLONG_MAX && p->content_length > r->max_body) {
    char msg[96];
    snprintf(msg, sizeof msg, "request body of %llu bytes is larger than the limit of %u bytes",
             (unsigned long long)p->content_length, r->max_body);
    fail(r, 413, msg);
    return -1; /* 1 would mean "no body" to http_parser */
  }
  if (!te_ok(r)) {
    fail_te(r);
    return -1;
  }
  if (p->upgrade) {
    fail(r, 400, "protocol upgrades are not supported");
    return -1;
  }
  if (r->encoded) {
    char msg[96];
    snprintf(msg, sizeof msg, "Content-Encoding '%s%s' is not supported: send the body uncompressed",
             r->encoding, r->encoding_len >= sizeof r->encoding ? "..." : "");
    fail(r, 415, msg);
    return -1;
  }
  r->expect_continue = strcasecmp(r->expect, "100-continue") == 0;
  bool has_body = chunked || (p->content_length != ULLONG_MAX && p->content_length > 0);
  if (r->expect_continue && has_body) http_parser_pause(p, 1);
  else r->expect_continue = false;
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  struct sk_http_reader *r = reader_of(p);
  if (len > r->max_body - r->body_len) {
    char msg[96];
    snprintf(msg, sizeof msg, "request body is larger than the limit of %u bytes", r->max_body);
    return fail(r, 413, msg);
  }
  if (r->body_len + len + 1 > r->body_cap) {
    /* Doubling, capped at the limit: a declared size never allocates. */
    size_t cap = r->body_cap ? r->body_cap : 4096;
    while (cap < r->body_len + len + 1) cap *= 2;
    if (cap > (size_t)r->max_body + 1) cap = (size_t)r->max_body + 1;
    char *b = realloc(r->body, cap);
    if (!b) return fail(r, 503, "out of memory reading the request body");
    r->body = b;
    r->body_cap = cap;
  }
  memcpy(r->body + r->body_len, at, len);
  r->body_len += len;
  r->body[r->body_len] = 0;
  return 0;
}

static int on_message_complete(http_parser *p) {
  struct sk_http_reader *r = reader_of(p);
  r->complete = true;
  http_parser_pause(p, 1);
  return 0;
}

void sk_http_reader_init(struct sk_http_reader *r, uint32_t max_body) {
  memset(r, 0, sizeof *r);
  http_parser_init(&r->parser, HTTP_REQUEST);
  r->parser.data = r;
  http_parser_settings_init(&r->settings);
  r->settings.on_message_begin = on_message_begin;
  r->settings.on_url = on_url;
  r->settings.on_header_field = on_header_field;
  r->settings.on_header_value = on_header_value;
  r->settings.on_headers_complete = on_headers_complete;
  r->settings.on_body = on_body;
  r->settings.on_message_complete = on_message_complete;
  r->max_body = max_body;
}

void sk_http_reader_free(struct sk_http_reader *r) {
  free(r->body);
  r->body = NULL;
  r->body_len = r->body_cap = 0;
}

void sk_http_reader_next(struct sk_http_reader *r) {
  sk_http_reader_free(r);
  r->url_len = r->auth_len = 0;
  r->url[0] = r->auth[0] = 0;
  r->auth_too_long = r->expect_continue = r->keep_alive = false;
  r->expect[0] = 0;
  r->expect_len = 0;
  r->encoding[0] = 0;
  r->encoding_len = 0;
  r->encoded = false;
  r->te[0] = 0;
  r->te_len = 0;
  r->has_te = false;
  r->header_bytes = 0;
  r->n_headers = 0;
  r->field_done = false;
  r->field_len = 0;
  r->header_field = HDR_OTHER;
  r->complete = r->started = false;
  enum http_errno e = HTTP_PARSER_ERRNO(&r->parser);
  if (e == HPE_PAUSED) {
    http_parser_pause(&r->parser, 0);
  } else if (e != HPE_OK) {
    /* After an error (the connection closes): a clean state, as
     * http_parser asserts against pausing a failed parser. */
    http_parser_init(&r->parser, HTTP_REQUEST);
    r->parser.data = r;
  }
}

int sk_http_reader_feed(struct sk_http_reader *r, const char *data, size_t len,
                        size_t *ret_used) {
  *ret_used = 0;
  if (r->status) return SK_HTTP_READ_ERROR;
  if (r->complete) return SK_HTTP_READ_REQUEST;
  if (len == 0) return SK_HTTP_READ_MORE; /* 0 would tell http_parser "EOF" */
  if (HTTP_PARSER_ERRNO(&r->parser) == HPE_PAUSED) http_parser_pause(&r->parser, 0);
  size_t n = http_parser_execute(&r->parser, &r->settings, data, len);
  *ret_used = n;
  enum http_errno e = HTTP_PARSER_ERRNO(&r->parser);
  if (e == HPE_PAUSED) {
    if (r->complete) return SK_HTTP_READ_REQUEST;
    return SK_HTTP_READ_CONTINUE; /* paused in on_headers_complete */
  }
  if (e != HPE_OK || r->status) {
    /* http_parser refuses some codings itself (identity, chunked twice):
     * the same answer as for those it lets through. */
    if (!r->status && !te_ok(r)) fail_te(r);
    if (!r->status) {
      r->status = e == HPE_HEADER_OVERFLOW ? 431 : 400;
      snprintf(r->message, sizeof r->message, "malformed HTTP request: %s",
               http_errno_description(e));
    }
    return SK_HTTP_READ_ERROR;
  }
  if (r->parser.upgrade) {
    r->status = 400;
    snprintf(r->message, sizeof r->message, "protocol upgrades are not supported");
    return SK_HTTP_READ_ERROR;
  }
  return SK_HTTP_READ_MORE;
}
