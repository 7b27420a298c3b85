/* libFuzzer entry points, also driven by standalone.c (any compiler) to
 * replay the seed corpora and the regression inputs as ordinary tests.
 * A target reports a broken invariant with sk_fuzz_fail, which aborts:
 * libFuzzer (and the replay test) then count it as a crash. */
#ifndef SK_FUZZ_H
#define SK_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Prints the message and aborts. */
void sk_fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
