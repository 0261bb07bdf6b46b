/*
 * mt_fileio.h — the file helpers every module shares (one home; issue 14).
 *
 * Plain POSIX wrappers that retry EINTR and say what went wrong through
 * errno (the int ones: 0 ok, -1 error) or through the context (the
 * mt_status ones). None allocates except mt_file_read_text (the caller frees
 * the text with mt_free).
 *
 * Example:
 *     char *text;
 *     MT_CHECK(mt_file_read_text(ctx, "dir/manifest.json", 16 << 20, &text));
 *     ... parse ...
 *     mt_free(ctx, text);
 */
#ifndef MT_FILEIO_H
#define MT_FILEIO_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "mt_core.h"

/* n bytes at offset off, all of them (EINTR retried). A short file is an
 * error on read (errno EIO). 0 ok, -1 with errno. */
int mt_file_pwrite_all(int fd, const void *buf, size_t n, off_t off);
int mt_file_pread_all(int fd, void *buf, size_t n, off_t off);

/* mkdir -p of `path` itself (mode 0755); ok if it exists as a directory.
 * 0 ok, -1 with errno (ENAMETOOLONG, ENOTDIR, ...). */
int mt_file_mkdir_p(const char *path);

/* rm -rf without following links; a missing path is fine. 0 ok, -1 with errno. */
int mt_file_rm_rf(const char *path);

int mt_file_is_dir(const char *path);      /* 1: a directory (links followed)    */
int mt_file_is_regular(const char *path);  /* 1: a regular file (links followed) */
/* 1: dir/name exists, of any kind (links followed); 0 also for a path too long. */
int mt_file_exists_in(const char *dir, const char *name);

/* Open PATH for reading, a regular file only (links followed): opened
 * O_NONBLOCK so that a FIFO cannot block in open(), checked with fstat, then
 * made blocking again. A FIFO, device (/dev/zero) or directory is refused
 * with MT_ERR_FORMAT (exit 2) "WHAT PATH is not a regular file" before a byte
 * is read (issue 33 item 3); open's failure is MT_ERR_IO "cannot open WHAT
 * PATH: strerror". *fd: the descriptor (caller closes), -1 on error;
 * *size: the file's size when not NULL. */
enum mt_status mt_file_open_regular(struct mt_ctx *ctx, const char *path, const char *what, int *fd, int64_t *size);

/* A whole regular file of at most max_bytes as a NUL-terminated string
 * (bucket OTHER, caller frees with mt_free). A directory, a device, a file
 * over max_bytes or one holding a NUL byte is MT_ERR_FORMAT (before any
 * allocation where the size tells); a missing or unreadable file MT_ERR_IO. */
enum mt_status mt_file_read_text(struct mt_ctx *ctx, const char *path, size_t max_bytes, char **out);

/* Copy src to dst (created or truncated, 0644) and fsync dst. Errors are
 * MT_ERR_RUNTIME naming the file (a writer's failure, not bad input). */
enum mt_status mt_file_copy(struct mt_ctx *ctx, const char *src, const char *dst);

/* ---- atomic replace: write a temporary, then rename it over the file ----
 * The bytes go to PATH.tmp; on commit it is flushed (fsync'ed with
 * MT_FILE_SYNC) and renamed over PATH (PATH's directory fsync'ed with
 * MT_FILE_SYNC_DIR, so the rename itself is durable). A reader sees the old
 * file or the new one, never a part. On any failure PATH.tmp is removed and
 * PATH is as it was; the error is `err` naming PATH and errno's reason:
 * MT_ERR_IO for a tool's output, MT_ERR_RUNTIME for what a run writes at its
 * end (receipt, checkpoint: exit 1). A stale PATH.tmp of a killed writer is
 * truncated by the next one.
 *
 *     struct mt_file_atomic a;
 *     MT_CHECK(mt_file_atomic_open(ctx, &a, path, MT_FILE_SYNC, MT_ERR_IO));
 *     int ok = fwrite(buf, 1, n, a.f) == n;
 *     MT_CHECK(mt_file_atomic_commit(ctx, &a, ok));   // ok == 0: discarded, error
 */
enum { MT_FILE_SYNC = 1, MT_FILE_SYNC_DIR = 2 };
struct mt_file_atomic {
    FILE          *f;          /* write here (binary mode) */
    char           path[4096];
    char           tmp[4104];
    unsigned       flags;
    enum mt_status err;
};
enum mt_status mt_file_atomic_open(struct mt_ctx *ctx, struct mt_file_atomic *a, const char *path, unsigned flags,
                                   enum mt_status err);
/* ok: the writes into a->f succeeded (0: discard the temporary and return
 * the error with errno's reason). Closes a->f either way. */
enum mt_status mt_file_atomic_commit(struct mt_ctx *ctx, struct mt_file_atomic *a, int ok);
/* Give up without an error (the caller reports its own): close, remove the temporary. */
void mt_file_atomic_discard(struct mt_file_atomic *a);
/* The whole pattern for one buffer of n bytes. */
enum mt_status mt_file_write_atomic(struct mt_ctx *ctx, const char *path, const void *data, size_t n, unsigned flags,
                                    enum mt_status err);

/* The directory holding `path`: the path itself if it is a directory, else
 * its parent ("." for a bare name). */
void mt_file_dir_of(const char *path, char *dir, size_t n);

#endif
