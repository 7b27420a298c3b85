/* A program a user of libsinkd would write, built by test-install.sh
 * against the installed headers and pkg-config file only: it greets the
 * daemon, opens a dense session, generates greedily and checks the
 * library's own helpers.
 *   install-check SOCKET */
#include <sinkd/client.h>
#include <sinkd/protocol.h>
#include <stdio.h>
#include <string.h>

static int print_token(void *user, const struct sk_token_event *ev) {
  size_t *n = user;
  fwrite(ev->text, 1, ev->text_len, stdout);
  (*n)++;
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  struct sk_client *c = NULL;
  struct sk_error err;
  if (sk_client_connect(argv[1], &c, &err) < 0) {
    fprintf(stderr, "connect: %s\n", err.message);
    return 1;
  }
  struct sk_hello h;
  if (sk_client_hello(c, &h, &err) < 0) return 1;
  printf("protocol %u, server %s, vocab %u\n", (unsigned)h.protocol, h.server,
         (unsigned)h.model.n_vocab);
  struct sk_open_params op = {.policy = "dense", .capacity = 64};
  struct sk_open_result s;
  if (sk_client_open(c, &op, &s, &err) < 0) return 1;
  printf("session %s %llu\n", s.policy, (unsigned long long)s.capacity);
  struct sk_generate_params p;
  sk_generate_params_init(&p);
  p.prompt = "Once upon a time";
  p.temperature = 0;
  p.max_tokens = 8;
  struct sk_generate_result r;
  size_t n = 0;
  if (sk_client_generate(c, s.session, &p, print_token, &n, &r, &err) < 0) return 1;
  printf("\nstop %s, %zu tokens\n", r.stop, n);
  if (sk_client_close_session(c, s.session, &err) < 0) return 1;
  if (sk_client_close_session(c, s.session, &err) != -SK_ERR_NO_SUCH_SESSION) return 1;
  printf("%s: %s\n", sk_error_name(err.code), sk_strerror(err.code));
  unsigned char hdr[SK_FRAME_HEADER_SIZE];
  sk_frame_header_put(hdr, 13);
  printf("frame header %u\n", (unsigned)sk_frame_header_get(hdr));
  sk_client_free(c);
  return 0;
}
