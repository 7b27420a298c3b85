/* Files the daemon reads and writes, opened so that nothing it is handed
 * can hang it or redirect it.
 *
 * Reading: a file is opened with O_NONBLOCK (opening a FIFO for reading
 * would otherwise wait for a writer forever) and O_NOCTTY, checked with
 * fstat to be a regular file of at most the caller's size bound before a
 * byte is read (/dev/zero or a FIFO would never end), then read whole
 * and bounded again (a file that grows while it is read is refused).
 *
 * Writing: a file is written into a directory held open (dirfd) under a
 * temporary name of random letters, created with O_CREAT | O_EXCL |
 * O_NOFOLLOW (never an existing file, never through a symbolic link),
 * then renamed into place with renameat, which replaces the directory
 * entry (a symbolic link planted at the final name is replaced, not
 * followed).
 *
 * A directory the daemon writes in must not let others swap its entries:
 * sk_safefile_check_dir refuses one writable by group or others unless
 * the sticky bit is set (then only an entry's owner may rename or remove
 * it, as in /tmp).
 *
 * No logging; errors name the file. Any thread.
 */
#ifndef SK_SAFEFILE_H
#define SK_SAFEFILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "sinkd/protocol.h"

/* Flags of sk_safefile_open and sk_safefile_read. */
enum {
  /* The last component of the path must not be a symbolic link (for
   * files the daemon itself names in its own directories). */
  SK_SAFEFILE_NOFOLLOW = 1u << 0,
  /* The file must be owned by the daemon's effective uid (files the
   * daemon wrote itself: one planted by another user is refused). */
  SK_SAFEFILE_OWNED = 1u << 1,
};

/* What a file of mode `mode` is, for messages: "a FIFO", "a directory",
 * "a character device", ... ("a regular file" for one). Static storage. */
const char *sk_safefile_kind(mode_t mode);

/* Opens path for reading (relative to dirfd, or AT_FDCWD for a path of
 * the caller's working directory or an absolute one) without blocking:
 * a regular file of at most max_bytes (below SIZE_MAX / 2), checked
 * with fstat before anything is read; the returned descriptor blocks
 * again (O_NONBLOCK cleared) and is close-on-exec. what names the file
 * in messages ("http_key_file /etc/sinkd/key"); NULL uses path. *ret_st
 * gets the fstat (may be NULL), also when the file is then refused (its
 * st_mode stays as the caller set it when the open itself failed). Returns the descriptor (>= 0) or an
 * error: -SK_ERR_IO (cannot open: errno is left as open(2) set it, so
 * ENOENT tells a missing file; not a regular file; a symbolic link with
 * SK_SAFEFILE_NOFOLLOW; another owner with SK_SAFEFILE_OWNED),
 * -SK_ERR_TOO_LARGE (larger than max_bytes). */
int sk_safefile_open(int dirfd, const char *path, unsigned flags, uint64_t max_bytes,
                     const char *what, struct stat *ret_st, struct sk_error *err);

/* Reads a whole file opened as sk_safefile_open does: *ret (malloc'd,
 * the caller's to free) holds *ret_len bytes and a NUL after them. A
 * file that turns out larger than max_bytes while it is read is refused
 * too. Errors: those of sk_safefile_open (errno as open(2) left it),
 * -SK_ERR_IO (a read failed), -SK_ERR_NO_MEMORY. */
int sk_safefile_read(int dirfd, const char *path, unsigned flags, uint64_t max_bytes,
                     const char *what, char **ret, size_t *ret_len, struct sk_error *err);

/* Writes data[0..len) to name (a file name, no '/') in the directory
 * dirfd, atomically: a new temporary ".NAME.XXXXXXXX" (random letters)
 * created with O_CREAT | O_EXCL | O_NOFOLLOW and mode `mode`, written,
 * then renamed over name. A reader sees the old file or the new one,
 * never a part; a symbolic link or another file at any name involved is
 * never written through. Errors: -SK_ERR_IO (err names the file and the
 * reason; the temporary is removed), -SK_ERR_BAD_REQUEST (name is not a
 * plain file name). */
int sk_safefile_write(int dirfd, const char *name, mode_t mode, const void *data, size_t len,
                      struct sk_error *err);

/* Checks the directory open as dirfd (path names it in messages) before
 * the daemon creates files in it: a directory, owned by the daemon's
 * effective uid, and not writable by group or others unless its sticky
 * bit is set. Errors: -SK_ERR_IO with a message that says what to change
 * (chmod, chown). */
int sk_safefile_check_dir(int dirfd, const char *path, struct sk_error *err);

#endif
