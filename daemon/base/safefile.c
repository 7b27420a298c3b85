#include "base/safefile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Names tried for a temporary before giving up: each is 8 random letters
 * (52^8 names), so a second try happens only if someone plants files. */
#define SK__TMP_TRIES 16

const char *sk_safefile_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "of another type";
}

int sk_safefile_open(int dirfd, const char *path, unsigned flags, uint64_t max_bytes,
                     const char *what, struct stat *ret_st, struct sk_error *err) {
  if (!what) what = path;
  int oflags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  if (flags & SK_SAFEFILE_NOFOLLOW) oflags |= O_NOFOLLOW;
  int fd = openat(dirfd, path, oflags);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP && (flags & SK_SAFEFILE_NOFOLLOW))
      sk_error_set(err, SK_ERR_IO, "%s is a symbolic link; not following it", what);
    else
      sk_error_set(err, SK_ERR_IO, "%s: %s", what, strerror(e));
    errno = e;
    return -SK_ERR_IO;
  }
  struct stat st;
  int rc = 0;
  if (fstat(fd, &st) < 0) {
    rc = sk_error_set(err, SK_ERR_IO, "%s: %s", what, strerror(errno));
    close(fd);
    errno = 0;
    return rc;
  }
  if (ret_st) *ret_st = st; /* also for a file refused below: its kind */
  if (!S_ISREG(st.st_mode)) {
    rc = sk_error_set(err, SK_ERR_IO, "%s is %s, not a regular file", what,
                      sk_safefile_kind(st.st_mode));
  } else if ((flags & SK_SAFEFILE_OWNED) && st.st_uid != geteuid()) {
    rc = sk_error_set(err, SK_ERR_IO, "%s is owned by uid %u, not by the daemon's uid %u", what,
                      (unsigned)st.st_uid, (unsigned)geteuid());
  } else if ((uint64_t)st.st_size > max_bytes) {
    rc = sk_error_set(err, SK_ERR_TOO_LARGE, "%s holds %llu bytes, more than the %llu bytes "
                      "it may", what, (unsigned long long)st.st_size,
                      (unsigned long long)max_bytes);
  } else {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
      rc = sk_error_set(err, SK_ERR_IO, "%s: %s", what, strerror(errno));
  }
  if (rc < 0) {
    close(fd);
    errno = 0;
    return rc;
  }
  return fd;
}

int sk_safefile_read(int dirfd, const char *path, unsigned flags, uint64_t max_bytes,
                     const char *what, char **ret, size_t *ret_len, struct sk_error *err) {
  if (!what) what = path;
  struct stat st;
  int fd = sk_safefile_open(dirfd, path, flags, max_bytes, what, &st, err);
  if (fd < 0) return fd;
  /* Room for what fstat said and one byte more, to see a file that grew. */
  size_t cap = (size_t)st.st_size + 2, len = 0;
  char *buf = malloc(cap);
  int rc = 0;
  if (!buf) rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory reading %s", what);
  while (rc == 0) {
    if (len + 1 == cap) {
      if ((uint64_t)len >= max_bytes + 1) {
        rc = sk_error_set(err, SK_ERR_TOO_LARGE, "%s grew past the %llu bytes it may hold",
                          what, (unsigned long long)max_bytes);
        break;
      }
      size_t ncap = cap * 2 < (size_t)max_bytes + 2 ? cap * 2 : (size_t)max_bytes + 2;
      char *nb = realloc(buf, ncap);
      if (!nb) {
        rc = sk_error_set(err, SK_ERR_NO_MEMORY, "out of memory reading %s", what);
        break;
      }
      buf = nb;
      cap = ncap;
    }
    ssize_t n = read(fd, buf + len, cap - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      rc = sk_error_set(err, SK_ERR_IO, "cannot read %s: %s", what, strerror(errno));
      break;
    }
    if (n == 0) break;
    len += (size_t)n;
    if ((uint64_t)len > max_bytes)
      rc = sk_error_set(err, SK_ERR_TOO_LARGE, "%s grew past the %llu bytes it may hold", what,
                        (unsigned long long)max_bytes);
  }
  close(fd);
  if (rc < 0) {
    free(buf);
    errno = 0;
    return rc;
  }
  buf[len] = 0;
  *ret = buf;
  *ret_len = len;
  return 0;
}

/* ".NAME.XXXXXXXX" with 8 random letters. */
static void sk__tmp_name(char *out, size_t size, const char *name) {
  static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  unsigned char r[8];
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
    /* No entropy yet (early boot): the clock and pid still differ per try. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)getpid() << 32;
    for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)(x >> (8 * i));
  }
  char rnd[9];
  for (size_t i = 0; i < sizeof r; i++) rnd[i] = letters[r[i] % (sizeof letters - 1)];
  rnd[8] = 0;
  snprintf(out, size, ".%s.%s", name, rnd);
}

int sk_safefile_write(int dirfd, const char *name, mode_t mode, const void *data, size_t len,
                      struct sk_error *err) {
  if (!*name || strchr(name, '/') || strlen(name) > 200)
    return sk_error_set(err, SK_ERR_BAD_REQUEST, "'%.64s' is not a plain file name", name);
  char tmp[256];
  int fd = -1;
  for (int i = 0; i < SK__TMP_TRIES && fd < 0; i++) {
    sk__tmp_name(tmp, sizeof tmp, name);
    fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0 && errno != EEXIST)
      return sk_error_set(err, SK_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  }
  if (fd < 0)
    return sk_error_set(err, SK_ERR_IO, "cannot create a temporary for %s: %d names taken",
                        name, SK__TMP_TRIES);
  int rc = 0;
  const char *p = data;
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, p + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      rc = sk_error_set(err, SK_ERR_IO, "cannot write %s: %s", tmp,
                        w < 0 ? strerror(errno) : "short write");
      break;
    }
    off += (size_t)w;
  }
  if (close(fd) < 0 && rc == 0)
    rc = sk_error_set(err, SK_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
  if (rc == 0 && renameat(dirfd, tmp, dirfd, name) < 0)
    rc = sk_error_set(err, SK_ERR_IO, "cannot rename %s to %s: %s", tmp, name, strerror(errno));
  if (rc < 0) unlinkat(dirfd, tmp, 0);
  return rc;
}

int sk_safefile_check_dir(int dirfd, const char *path, struct sk_error *err) {
  struct stat st;
  if (fstat(dirfd, &st) < 0)
    return sk_error_set(err, SK_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return sk_error_set(err, SK_ERR_IO, "%s is %s, not a directory", path,
                        sk_safefile_kind(st.st_mode));
  if (st.st_uid != geteuid())
    return sk_error_set(err, SK_ERR_IO, "%s is owned by uid %u, not by the daemon's uid %u: "
                        "chown %u %s", path, (unsigned)st.st_uid, (unsigned)geteuid(),
                        (unsigned)geteuid(), path);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
    return sk_error_set(err, SK_ERR_IO, "%s is writable by %s (mode %04o): other users could "
                        "replace the files the daemon writes there; chmod go-w %s (or set the "
                        "sticky bit: chmod +t)", path,
                        (st.st_mode & S_IWOTH) ? "everyone" : "its group",
                        (unsigned)(st.st_mode & 07777), path);
  return 0;
}
