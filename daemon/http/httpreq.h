/* Reading HTTP/1.1 requests from a byte stream, with limits: the parsing
 * itself is Joyent/Node's http_parser 2.9 (Debian's libhttp-parser);
 * this module adds what a server must bound and keeps the few headers
 * sinkd uses. No I/O: http.c feeds it what a connection reads, the fuzz
 * target (tests/fuzz/fuzz-http.c) feeds it anything.
 *
 * Requests are taken one at a time (pipelined bytes after a complete
 * request stay unread until sk_http_reader_next), so a connection holds
 * at most one request and SK_LIMIT_HTTP_HEADER_BYTES + body limit bytes of it.
 */
#ifndef SK_HTTPREQ_H
#define SK_HTTPREQ_H

#include <http_parser.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sk_limits.h"


/* What sk_http_reader_feed found. */
enum sk_http_read {
  SK_HTTP_READ_MORE = 0,     /* all bytes taken, the request is not complete */
  SK_HTTP_READ_REQUEST = 1,  /* a whole request is in the reader */
  SK_HTTP_READ_CONTINUE = 2, /* headers done and the client waits for
                                "100 Continue" before sending the body */
  SK_HTTP_READ_ERROR = -1,   /* status and message say why; close after
                                answering, the stream is out of sync */
};

struct sk_http_reader {
  http_parser parser;
  http_parser_settings settings;
  uint32_t max_body;          /* bytes of a body, after chunked decoding */
  /* The request being read (valid after SK_HTTP_READ_REQUEST until
   * sk_http_reader_next). */
  enum http_method method;
  char url[SK_LIMIT_HTTP_URL + 1];   /* NUL-terminated */
  size_t url_len;
  char auth[SK_LIMIT_HTTP_AUTH + 1]; /* Authorization value, NUL-terminated */
  size_t auth_len;
  bool auth_too_long;
  char *body;                 /* (body_len) owned, NUL-terminated; NULL if none */
  size_t body_len, body_cap;
  bool keep_alive;            /* the client lets the connection stay open */
  bool expect_continue;       /* Expect: 100-continue */
  char expect[16];            /* the Expect value so far (prefix) */
  size_t expect_len;
  char encoding[24];          /* the Content-Encoding value so far (prefix) */
  size_t encoding_len;
  bool encoded;               /* a Content-Encoding other than identity */
  char te[24];                /* the Transfer-Encoding value so far (prefix) */
  size_t te_len;
  bool has_te;                /* a Transfer-Encoding header came */
  /* Reading state. */
  size_t header_bytes;        /* request line + headers so far */
  uint32_t n_headers;
  int header_field;           /* which header the value being read belongs to */
  bool field_done;            /* last callback was a value: a new field begins */
  char field[32];             /* the current header name (prefix), lower case */
  size_t field_len;
  bool complete;              /* message complete: paused until next */
  bool started;               /* a byte of the current request was read */
  /* Error (SK_HTTP_READ_ERROR). */
  int status;                 /* 400, 413, 414, 415, 431, 501 (a transfer
                                 coding other than chunked) */
  char message[160];
};

/* Initialises *r for requests whose bodies have at most max_body bytes.
 * Nothing is allocated until a body arrives. */
void sk_http_reader_init(struct sk_http_reader *r, uint32_t max_body);
/* Frees the body buffer. r may be initialised again. */
void sk_http_reader_free(struct sk_http_reader *r);

/* Parses up to len bytes of data; *ret_used tells how many it took (less
 * than len after REQUEST or CONTINUE: the rest belongs to what follows).
 * Returns an enum sk_http_read. After REQUEST the reader holds the
 * request until sk_http_reader_next; after CONTINUE call feed again with
 * the rest. After ERROR, r->status and r->message give the answer. */
int sk_http_reader_feed(struct sk_http_reader *r, const char *data, size_t len,
                        size_t *ret_used);
/* Drops the request just read and readies the reader for the next one
 * on the same connection. */
void sk_http_reader_next(struct sk_http_reader *r);

#endif
