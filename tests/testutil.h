/* Helpers shared by the tests: where the shared material is, reading the
 * reference JSON (jansson), temporary files. */
#ifndef SK_TESTUTIL_H
#define SK_TESTUTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Path of the test model (env SK_MODEL). Static storage. */
const char *sk_test_model_path(void);
/* Path of a file in the reference folder (env SK_REFERENCE): returns a
 * malloc'd string the caller frees. */
char *sk_test_reference_path(const char *name);
/* Path of a file under the shared folder (env SK_SHARED_DIR), malloc'd. */
char *sk_test_shared_path(const char *rel);
/* Loads reference/<name> as JSON; fails the test (cmocka) if it cannot. */
json_t *sk_test_load_reference(const char *name);
/* Reads a whole file; malloc'd, *ret_len set; NULL on failure. */
void *sk_test_read_file(const char *path, size_t *ret_len);
/* JSON array of integers -> malloc'd int32 array; *ret_n its length. */
int32_t *sk_test_json_ids(const json_t *arr, size_t *ret_n);
/* Bytes from a hex string ("48656c6c6f"), malloc'd, NUL-terminated. */
char *sk_test_hex_decode(const char *hex, size_t *ret_len);
/* Runs cmd through the shell (popen) and returns everything it wrote to
 * stdout, NUL-terminated (malloc'd; the caller frees it); *ret_status is
 * its exit status, or -1 if it did not exit normally. */
char *sk_test_run_capture(const char *cmd, int *ret_status);
/* A fresh temporary directory (mkdtemp under $TMPDIR or /tmp); malloc'd. */
char *sk_test_tmpdir(void);
/* In a forked child that will exec a daemon: the kernel kills it with
 * SIGKILL when the test process dies (a failed assertion, a sanitizer's
 * exit), and its stdout goes to /dev/null, so that no daemon outlives
 * its test holding the test runner's pipe. */
void sk_test_child_setup(void);

#endif
