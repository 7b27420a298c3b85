/* Files the daemon reads and writes (base/safefile.h): special files and
 * oversized ones refused before a byte is read, symbolic links never
 * followed where the daemon names the file, writes that replace a
 * planted link instead of writing through it, directories others could
 * write in refused. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/safefile.h"
#include "testutil.h"

struct dir {
  char path[256];
  int fd;
};

static void dir_make(struct dir *d) {
  snprintf(d->path, sizeof d->path, "/tmp/sk-safefile-XXXXXX");
  assert_non_null(mkdtemp(d->path));
  d->fd = open(d->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  assert_true(d->fd >= 0);
}

static void dir_remove(struct dir *d) {
  char cmd[300];
  close(d->fd);
  snprintf(cmd, sizeof cmd, "rm -rf %s", d->path);
  assert_int_equal(system(cmd), 0);
}

static void put(const struct dir *d, const char *name, const char *text) {
  int fd = openat(d->fd, name, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void test_read_regular(void **state) {
  (void)state;
  struct dir d;
  dir_make(&d);
  put(&d, "a", "hello\n");
  char *buf = NULL;
  size_t len = 0;
  struct sk_error e;
  assert_int_equal(sk_safefile_read(d.fd, "a", SK_SAFEFILE_NOFOLLOW, 6, NULL, &buf, &len, &e), 0);
  assert_int_equal(len, 6);
  assert_string_equal(buf, "hello\n");
  free(buf);
  /* One byte over the bound: refused before reading, naming the sizes. */
  assert_int_equal(sk_safefile_read(d.fd, "a", 0, 5, "the file a", &buf, &len, &e),
                   -SK_ERR_TOO_LARGE);
  assert_string_equal(e.message, "the file a holds 6 bytes, more than the 5 bytes it may");
  /* A missing file: errno says so (callers treat ENOENT apart). */
  assert_int_equal(sk_safefile_read(d.fd, "none", 0, 5, NULL, &buf, &len, &e), -SK_ERR_IO);
  assert_int_equal(errno, ENOENT);
  assert_string_equal(e.message, "none: No such file or directory");
  /* An empty file reads as "". */
  put(&d, "empty", "");
  assert_int_equal(sk_safefile_read(d.fd, "empty", 0, 5, NULL, &buf, &len, &e), 0);
  assert_int_equal(len, 0);
  assert_string_equal(buf, "");
  free(buf);
  dir_remove(&d);
}

/* A FIFO with no writer and /dev/zero: refused at once, nothing read. */
static void test_special_files_refused(void **state) {
  (void)state;
  struct dir d;
  dir_make(&d);
  assert_int_equal(mkfifoat(d.fd, "fifo", 0600), 0);
  char *buf = NULL;
  size_t len = 0;
  struct sk_error e;
  double t0 = now_s();
  assert_int_equal(sk_safefile_read(d.fd, "fifo", 0, 1 << 20, "key", &buf, &len, &e), -SK_ERR_IO);
  assert_true(now_s() - t0 < 1.0);
  assert_string_equal(e.message, "key is a FIFO, not a regular file");
  assert_int_equal(sk_safefile_read(AT_FDCWD, "/dev/zero", 0, 1 << 20, NULL, &buf, &len, &e),
                   -SK_ERR_IO);
  assert_string_equal(e.message, "/dev/zero is a character device, not a regular file");
  assert_int_equal(sk_safefile_open(AT_FDCWD, "/tmp", 0, 1 << 20, NULL, NULL, &e), -SK_ERR_IO);
  assert_string_equal(e.message, "/tmp is a directory, not a regular file");
  dir_remove(&d);
}

static void test_symlinks(void **state) {
  (void)state;
  struct dir d;
  dir_make(&d);
  put(&d, "target", "secret");
  assert_int_equal(symlinkat("target", d.fd, "link"), 0);
  char *buf = NULL;
  size_t len = 0;
  struct sk_error e;
  assert_int_equal(sk_safefile_read(d.fd, "link", SK_SAFEFILE_NOFOLLOW, 100, NULL, &buf, &len, &e),
                   -SK_ERR_IO);
  assert_string_equal(e.message, "link is a symbolic link; not following it");
  /* Without the flag (a path an administrator gave), links are followed. */
  assert_int_equal(sk_safefile_read(d.fd, "link", 0, 100, NULL, &buf, &len, &e), 0);
  assert_string_equal(buf, "secret");
  free(buf);
  /* Writing to the link's name replaces the link; the target is intact. */
  assert_int_equal(sk_safefile_write(d.fd, "link", 0600, "new", 3, &e), 0);
  struct stat st;
  assert_int_equal(fstatat(d.fd, "link", &st, AT_SYMLINK_NOFOLLOW), 0);
  assert_true(S_ISREG(st.st_mode));
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(sk_safefile_read(d.fd, "target", 0, 100, NULL, &buf, &len, &e), 0);
  assert_string_equal(buf, "secret");
  free(buf);
  assert_int_equal(sk_safefile_read(d.fd, "link", SK_SAFEFILE_NOFOLLOW | SK_SAFEFILE_OWNED, 100,
                                    NULL, &buf, &len, &e), 0);
  assert_string_equal(buf, "new");
  free(buf);
  /* Only the final file is left: no temporary behind. */
  char cmd[400];
  snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 2", d.path);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(sk_safefile_write(d.fd, "a/b", 0600, "x", 1, &e), -SK_ERR_BAD_REQUEST);
  dir_remove(&d);
}

/* A file planted by another uid is refused with SK_SAFEFILE_OWNED (as
 * root, the test hands one to uid 65534). */
static void test_owner(void **state) {
  (void)state;
  if (geteuid() != 0) skip();
  struct dir d;
  dir_make(&d);
  put(&d, "planted", "x");
  assert_int_equal(fchownat(d.fd, "planted", 65534, 65534, 0), 0);
  char *buf = NULL;
  size_t len = 0;
  struct sk_error e;
  assert_int_equal(sk_safefile_read(d.fd, "planted", SK_SAFEFILE_OWNED, 100, NULL, &buf, &len, &e),
                   -SK_ERR_IO);
  assert_string_equal(e.message, "planted is owned by uid 65534, not by the daemon's uid 0");
  dir_remove(&d);
}

static void test_check_dir(void **state) {
  (void)state;
  struct dir d;
  dir_make(&d);
  struct sk_error e;
  assert_int_equal(sk_safefile_check_dir(d.fd, d.path, &e), 0);
  assert_int_equal(fchmod(d.fd, 0777), 0);
  assert_int_equal(sk_safefile_check_dir(d.fd, d.path, &e), -SK_ERR_IO);
  char want[1024];
  snprintf(want, sizeof want, "%s is writable by everyone (mode 0777): other users could replace "
           "the files the daemon writes there; chmod go-w %s (or set the sticky bit: chmod +t)",
           d.path, d.path);
  assert_string_equal(e.message, want);
  assert_int_equal(fchmod(d.fd, 0770), 0);
  assert_int_equal(sk_safefile_check_dir(d.fd, d.path, &e), -SK_ERR_IO);
  assert_non_null(strstr(e.message, "writable by its group (mode 0770)"));
  assert_int_equal(fchmod(d.fd, 01777), 0);
  assert_int_equal(sk_safefile_check_dir(d.fd, d.path, &e), 0);
  assert_int_equal(fchmod(d.fd, 0700), 0);
  dir_remove(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_read_regular),  cmocka_unit_test(test_special_files_refused),
      cmocka_unit_test(test_symlinks),      cmocka_unit_test(test_owner),
      cmocka_unit_test(test_check_dir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
