/* Fuzz target: the configuration file parser (daemon/config.c, over
 * inih), with oracles.
 *
 * Input: the bytes of a sinkd.conf. Checked:
 *  - the parse succeeds, or fails with 1 to SK_CONFIG_MAX_ERRORS
 *    messages, each naming the file and a line of the input (dropped
 *    ones counted), never anything else but running out of memory;
 *  - a parse that succeeded round-trips: every key written back as
 *    "key = value" (sk_config_format) in its section parses again, to
 *    the same value of every key;
 *  - printing it (what --check-config shows) and resolving it without a
 *    model work on any value the parser took.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz.h"

#define NAME "fuzz.conf"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  return 0;
}

/* Lines of the input, as inih counts them (the last may lack a newline). */
static uint32_t count_lines(const uint8_t *data, size_t size) {
  uint32_t n = 1;
  for (size_t i = 0; i < size; i++)
    if (data[i] == '\n') n++;
  return n;
}

static void check_errors(const struct sk_config_errors *errs, uint32_t lines) {
  if (errs->n == 0 || errs->n > SK_CONFIG_MAX_ERRORS) sk_fuzz_fail("%u errors", errs->n);
  for (uint32_t i = 0; i < errs->n; i++) {
    const char *m = errs->e[i].message;
    if (strnlen(m, sizeof errs->e[i].message) == sizeof errs->e[i].message)
      sk_fuzz_fail("error %u is not terminated", i);
    if (strncmp(m, NAME ":", sizeof NAME) != 0) sk_fuzz_fail("error '%s' names no line", m);
    unsigned long line = strtoul(m + sizeof NAME, NULL, 10);
    if (line < 1 || line > lines || line != errs->line[i])
      sk_fuzz_fail("error '%s': line %lu of %u (recorded %u)", m, line, lines, errs->line[i]);
    if (i && errs->line[i - 1] > errs->line[i]) sk_fuzz_fail("errors out of line order");
  }
}

/* Every key of c as "key = value" under its section, from its formatted
 * value: the text sk_config_load_text must read back to c. */
static char *write_back(const struct sk_config *c, size_t *ret_len) {
  char *text = NULL;
  FILE *f = open_memstream(&text, ret_len);
  if (!f) sk_fuzz_fail("open_memstream");
  const char *section = "";
  for (int k = 0; k < SK_CFG__COUNT; k++) {
    const char *s = sk_config_key_section((enum sk_config_key)k);
    if (strcmp(s, section) != 0) fprintf(f, "[%s]\n", section = s);
    char value[4200];
    sk_config_format(c, (enum sk_config_key)k, value, sizeof value);
    if (!value[0]) continue; /* a path not set */
    fprintf(f, "%s = %s\n", sk_config_key_name((enum sk_config_key)k), value);
  }
  if (fclose(f) != 0) sk_fuzz_fail("fclose");
  return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct sk_config c;
  if (sk_config_init(&c) < 0) return 0;
  struct sk_config_errors errs;
  int rc = sk_config_load_text(&c, NAME, (const char *)data, size, &errs);
  if (rc == -SK_ERR_BAD_REQUEST) {
    check_errors(&errs, count_lines(data, size));
  } else if (rc == 0) {
    if (errs.n) sk_fuzz_fail("success with %u errors", errs.n);
    size_t len = 0;
    char *text = write_back(&c, &len);
    struct sk_config back;
    if (sk_config_init(&back) < 0) sk_fuzz_fail("init");
    if (sk_config_load_text(&back, NAME, text, len, &errs) != 0)
      sk_fuzz_fail("written back, it does not parse: %s\n%s", errs.e[0].message, text);
    for (int k = 0; k < SK_CFG__COUNT; k++)
      if (!sk_config_same(&back, &c, (enum sk_config_key)k))
        sk_fuzz_fail("%s differs after the round trip", sk_config_key_name((enum sk_config_key)k));
    free(text);
    sk_config_done(&back);
    FILE *devnull = fopen("/dev/null", "w");
    if (devnull) {
      sk_config_print(devnull, &c);
      fclose(devnull);
    }
    struct sk_error e;
    if (sk_config_resolve(&c, NULL, &e) < 0 && !e.message[0])
      sk_fuzz_fail("resolve failed without a message");
  } else if (rc != -SK_ERR_NO_MEMORY) {
    sk_fuzz_fail("load returned %d", rc);
  }
  sk_config_done(&c);
  return 0;
}
