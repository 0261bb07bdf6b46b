/*
 * fileio.c — the shared file helpers (see mt_fileio.h). Before issue 14 each
 * of ckpt.c, export.c, trainer.c and tools/cmd_prepare.c carried its own copy.
 */
#define _GNU_SOURCE
#include "mt_fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int mt_file_pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

int mt_file_pread_all(int fd, void *buf, size_t n, off_t off)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) { errno = EIO; return -1; }   /* short file */
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

int mt_file_mkdir_p(const char *path)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) { errno = ENAMETOOLONG; return -1; }
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    if (!mt_file_is_dir(tmp)) { errno = ENOTDIR; return -1; }
    return 0;
}

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

int mt_file_rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

int mt_file_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int mt_file_is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int mt_file_exists_in(const char *dir, const char *name)
{
    char p[PATH_MAX];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p) return 0;
    return stat(p, &st) == 0;
}

enum mt_status mt_file_open_regular(struct mt_ctx *ctx, const char *path, const char *what, int *fd, int64_t *size)
{
    *fd = -1;
    if (size) *size = 0;
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    const char *sp = what && *what ? " " : "";
    if (!what) what = "";
    if (f < 0) return mt_ctx_error(ctx, MT_ERR_IO, "cannot open %s%s%s: %s", what, sp, path, strerror(errno));
    struct stat sb;
    if (fstat(f, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(f);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s%s%s is not a regular file (a FIFO, device or directory cannot be read "
                            "as one)", what, sp, path);
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0) (void)fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    if (size) *size = (int64_t)sb.st_size;
    return MT_OK;
}

enum mt_status mt_file_read_text(struct mt_ctx *ctx, const char *path, size_t max_bytes, char **out)
{
    *out = NULL;
    int fd;
    int64_t size;
    MT_CHECK(mt_file_open_regular(ctx, path, NULL, &fd, &size));
    if ((unsigned long long)size > (unsigned long long)max_bytes) {
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s has %lld bytes (at most %zu expected)", path,
                            (long long)size, max_bytes);
    }
    size_t n = (size_t)size;
    char *s = mt_alloc(ctx, n + 1, MT_BUCKET_OTHER);
    if (!s) { close(fd); return MT_ERR_OOM; }
    if (mt_file_pread_all(fd, s, n, 0) != 0) {
        int err = errno;
        close(fd);
        mt_free(ctx, s);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path, strerror(err));
    }
    close(fd);
    s[n] = 0;
    if (strlen(s) != n) {
        mt_free(ctx, s);
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s holds a NUL byte", path);
    }
    *out = s;
    return MT_OK;
}

enum mt_status mt_file_copy(struct mt_ctx *ctx, const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot open %s: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) {
        int err = errno;
        close(in);
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot create %s: %s", dst, strerror(err));
    }
    char buf[1 << 16];
    off_t at = 0;
    enum mt_status rc = MT_OK;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { rc = mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot read %s: %s", src, strerror(errno)); break; }
        if (r == 0) break;
        if (mt_file_pwrite_all(out, buf, (size_t)r, at) != 0) {
            rc = mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot write %s: %s", dst, strerror(errno));
            break;
        }
        at += r;
    }
    if (rc == MT_OK && fsync(out) != 0) rc = mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot write %s: %s", dst, strerror(errno));
    if (close(out) != 0 && rc == MT_OK) rc = mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot write %s: %s", dst, strerror(errno));
    close(in);
    return rc;
}

void mt_file_dir_of(const char *path, char *dir, size_t n)
{
    snprintf(dir, n, "%s", path);
    if (mt_file_is_dir(path)) return;
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, n, ".");
}

enum mt_status mt_file_atomic_open(struct mt_ctx *ctx, struct mt_file_atomic *a, const char *path, unsigned flags,
                                   enum mt_status err)
{
    memset(a, 0, sizeof *a);
    a->flags = flags;
    a->err = err;
    if ((size_t)snprintf(a->path, sizeof a->path, "%s", path) >= sizeof a->path)
        return mt_ctx_error(ctx, err, "path too long: %s", path);
    snprintf(a->tmp, sizeof a->tmp, "%s.tmp", a->path);
    a->f = fopen(a->tmp, "wb");
    if (!a->f) return mt_ctx_error(ctx, err, "cannot write %s: %s", a->tmp, strerror(errno));
    return MT_OK;
}

void mt_file_atomic_discard(struct mt_file_atomic *a)
{
    if (a->f) fclose(a->f);
    a->f = NULL;
    unlink(a->tmp);
}

enum mt_status mt_file_atomic_commit(struct mt_ctx *ctx, struct mt_file_atomic *a, int ok)
{
    /* errno of the first failure: the writes', else flush, sync, close, rename */
    int e = ok ? 0 : (errno ? errno : EIO);
    if (ok && fflush(a->f) != 0) ok = 0, e = errno;
    if (ok && (a->flags & MT_FILE_SYNC) && fsync(fileno(a->f)) != 0) ok = 0, e = errno;
    if (fclose(a->f) != 0 && ok) ok = 0, e = errno;
    a->f = NULL;
    if (ok && rename(a->tmp, a->path) != 0) ok = 0, e = errno;
    if (!ok) {
        unlink(a->tmp);
        return mt_ctx_error(ctx, a->err, "cannot write %s: %s", a->path, strerror(e));
    }
    if (a->flags & MT_FILE_SYNC_DIR) {
        char dir[4096];
        mt_file_dir_of(a->path, dir, sizeof dir);
        int fd = open(dir, O_RDONLY | O_DIRECTORY);
        if (fd >= 0) { fsync(fd); close(fd); }
    }
    return MT_OK;
}

enum mt_status mt_file_write_atomic(struct mt_ctx *ctx, const char *path, const void *data, size_t n, unsigned flags,
                                    enum mt_status err)
{
    struct mt_file_atomic a;
    MT_CHECK(mt_file_atomic_open(ctx, &a, path, flags, err));
    return mt_file_atomic_commit(ctx, &a, n == 0 || fwrite(data, 1, n, a.f) == n);
}
