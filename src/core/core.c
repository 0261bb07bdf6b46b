/*
 * core.c — status strings, the context's error slot, accounted allocation.
 *
 * Invariant: every live block from mt_alloc carries a 64-byte header holding
 * its size and bucket, so mt_free can keep ctx->bytes_live exact and the
 * receipt's "measured" memory per bucket is the sum of what is live.
 */
#define _GNU_SOURCE
#include "mt_core.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *mt_status_str(enum mt_status st)
{
    switch (st) {
    case MT_OK:               return "ok";
    case MT_ERR_INVALID_ARG:  return "invalid argument";
    case MT_ERR_CONFIG:       return "config error";
    case MT_ERR_IO:           return "i/o error";
    case MT_ERR_FORMAT:       return "bad file format";
    case MT_ERR_OOM:          return "out of memory";
    case MT_ERR_UNSUPPORTED:  return "unsupported";
    case MT_ERR_COMM:         return "communication error";
    case MT_ERR_NUMERIC:      return "non-finite value";
    case MT_ERR_RUNTIME:      return "runtime error";
    }
    return "unknown status";
}

int mt_status_exit_code(enum mt_status st)
{
    switch (st) {
    case MT_OK:              return 0;
    case MT_ERR_INVALID_ARG:
    case MT_ERR_CONFIG:
    case MT_ERR_IO:
    case MT_ERR_FORMAT:      return 2;
    default:                 return 1;
    }
}

const char *mt_bucket_name(enum mt_bucket b)
{
    static const char *names[MT_BUCKET_COUNT] = {
        "params", "grads", "optim", "acts", "comm", "workspace", "other"};
    return (b >= 0 && b < MT_BUCKET_COUNT) ? names[b] : "other";
}

void mt_ctx_init(struct mt_ctx *ctx)
{
    memset(ctx, 0, sizeof *ctx);
    /* MT_ERROR_WHERE=1: every printed error says where it was raised. Read
     * here, not through the knob table: it is presentation, not behaviour,
     * and every context has it, including those of tools that take no knobs
     * (docs/architecture.md, the environment outside the table) */
    const char *w = getenv("MT_ERROR_WHERE");
    ctx->err_show_where = w && *w && strcmp(w, "0") != 0;
}

void mt_ctx_free(struct mt_ctx *ctx)
{
    (void)ctx; /* nothing owned today; kept for the init/free pair */
}

/* __FILE__ as the build passed it (often absolute: "/home/x/meshtrain/src/a/b.c")
 * from its last "src/" or "tools/" directory on, so messages do not depend
 * on where the tree was checked out; other paths keep their base name. */
static const char *short_file(const char *file)
{
    const char *best = NULL;
    for (const char *p = file; *p; p++)
        if ((p == file || p[-1] == '/') && (!strncmp(p, "src/", 4) || !strncmp(p, "tools/", 6))) best = p;
    if (best) return best;
    const char *slash = strrchr(file, '/');
    return slash ? slash + 1 : file;
}

enum mt_status mt_ctx_error_at(const char *file, int line, struct mt_ctx *ctx, enum mt_status st,
                               const char *fmt, ...)
{
    if (!ctx) return st;
    /* format into a temporary: the arguments may quote the previous message
     * (`"%s: bad config: %s", dir, mt_ctx_last_error(ctx)`), and vsnprintf
     * into the buffer it reads from garbles it (overlapping copy) */
    char msg[sizeof ctx->errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(ctx->errmsg, msg, sizeof msg);
    ctx->last_status = st;
    ctx->err_file = file ? short_file(file) : NULL;
    ctx->err_line = line;
    /* the shown form, made here so that mt_ctx_last_error stays a read */
    if (ctx->err_file)
        snprintf(ctx->errshown, sizeof ctx->errshown, "%s [%s:%d]", ctx->errmsg[0] ? ctx->errmsg : mt_status_str(st),
                 ctx->err_file, line);
    else
        ctx->errshown[0] = 0;
    return st;
}

const char *mt_ctx_last_error(const struct mt_ctx *ctx)
{
    if (!ctx || ctx->last_status == MT_OK) return "no error";
    if (ctx->err_show_where && ctx->err_file) return ctx->errshown;
    return ctx->errmsg[0] ? ctx->errmsg : mt_status_str(ctx->last_status);
}

const char *mt_ctx_last_where(const struct mt_ctx *ctx, char *buf, size_t n)
{
    if (!n) return buf;
    buf[0] = 0;
    if (ctx && ctx->last_status != MT_OK && ctx->err_file) snprintf(buf, n, "%s:%d", ctx->err_file, ctx->err_line);
    return buf;
}

void mt_ctx_clear_error(struct mt_ctx *ctx)
{
    ctx->last_status = MT_OK;
    ctx->errmsg[0] = 0;
    ctx->errshown[0] = 0;
    ctx->err_file = NULL;
    ctx->err_line = 0;
}

/* Header placed before each block: 64 bytes keep the user pointer aligned;
 * raw is what calloc returned (the block is freed through it). */
struct block_header {
    size_t bytes;
    void  *raw;
    int    bucket;
    char   pad[64 - sizeof(size_t) - sizeof(void *) - sizeof(int)];
};
_Static_assert(sizeof(struct block_header) == 64, "the header keeps 64-byte alignment");

int mt_ctx_alloc_check(struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket, const char *what)
{
    if (!ctx) return 1;
    ctx->n_allocs++;
    if (ctx->fail_after > 0 && --ctx->fail_after == 0) {
        mt_ctx_error(ctx, MT_ERR_OOM, "out of %s allocating %zu bytes for %s (injected failure)", what, bytes,
                     mt_bucket_name(bucket));
        return 0;
    }
    return 1;
}

void mt_ctx_account(struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket, int add)
{
    if (!ctx) return;
    if (add) {
        ctx->bytes_live[bucket] += bytes;
        if (ctx->bytes_live[bucket] > ctx->bytes_peak[bucket]) ctx->bytes_peak[bucket] = ctx->bytes_live[bucket];
        ctx->bytes_live_total += bytes;
        if (ctx->bytes_live_total > ctx->bytes_peak_total) ctx->bytes_peak_total = ctx->bytes_live_total;
    } else {
        ctx->bytes_live[bucket] -= bytes;
        ctx->bytes_live_total -= bytes;
    }
}

void *mt_alloc(struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket)
{
    if (bucket < 0 || bucket >= MT_BUCKET_COUNT) bucket = MT_BUCKET_OTHER;
    if (!mt_ctx_alloc_check(ctx, bytes, bucket, "memory")) return NULL;
    /* calloc, not posix_memalign + memset: pages fresh from the kernel are
     * not cleared twice, nor touched here (a 1B-parameter run's arenas are
     * ~16 GB: a serial memset of them was seconds of startup); 64 bytes of
     * slack align the header (and so the user pointer) to 64 */
    const size_t hb = sizeof(struct block_header), total = bytes + 2 * hb;
    char *raw = total < bytes ? NULL : calloc(1, total);
    if (!raw) {
        if (ctx) mt_ctx_error(ctx, MT_ERR_OOM, "out of memory allocating %zu bytes for %s", bytes,
                              mt_bucket_name(bucket));
        return NULL;
    }
    struct block_header *h = (struct block_header *)(raw + (hb - (uintptr_t)raw % hb));
    h->raw = raw;
    h->bytes = bytes;
    h->bucket = (int)bucket;
    mt_ctx_account(ctx, bytes, bucket, 1);
    return h + 1;
}

void mt_free(struct mt_ctx *ctx, void *p)
{
    if (!p) return;
    struct block_header *h = (struct block_header *)p - 1;
    mt_ctx_account(ctx, h->bytes, (enum mt_bucket)h->bucket, 0);
    free(h->raw);
}

enum mt_status mt_grow(struct mt_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem, size_t first,
                       enum mt_bucket bucket)
{
    if (need <= *cap) return MT_OK;
    size_t nc = *cap ? *cap : first;
    while (nc < need) nc *= 2;
    void *q = mt_alloc(ctx, nc * elem, bucket);
    if (!q) return MT_ERR_OOM;
    if (*p) memcpy(q, *p, *cap * elem);
    mt_free(ctx, *p);
    *p = q;
    *cap = nc;
    return MT_OK;
}

size_t mt_peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

double mt_time_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double mt_sort_median(double *v, int n)
{
    if (n < 1) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int mt_size_parse(const char *s, double *out, char *why, size_t why_n)
{
    static const struct { const char *u; double m; } units[] = {
        {"", 1}, {"B", 1},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"PiB", 1125899906842624.0},
        {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15}};
    char tmp[2];
    if (!why) { why = tmp; why_n = sizeof tmp; }
    why[0] = 0;
    char *end = NULL;
    if (!s || !*s || *s == '-' || *s == '+') {
        snprintf(why, why_n, "expected a size such as 85899345920, 8e10, 80GiB or 80GB");
        return -1;
    }
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0) {
        snprintf(why, why_n, "expected a size such as 85899345920, 8e10, 80GiB or 80GB");
        return -1;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].u)) {
            *out = v * units[i].m;
            return 0;
        }
    if (strlen(end) == 1 && strchr("kKmMgGtTpP", end[0])) {
        char up = (char)(end[0] == 'k' ? 'K' : end[0] >= 'a' ? end[0] - 32 : end[0]);
        snprintf(why, why_n, "'%s' is ambiguous: write %.*s%ciB (2^%d bytes) or %.*s%cB (10^%d bytes)", s,
                 (int)(end - s), s, up, 10 * (int)(strchr("KMGTP", up) - "KMGTP" + 1), (int)(end - s), s, up,
                 3 * (int)(strchr("KMGTP", up) - "KMGTP" + 1));
        return -1;
    }
    snprintf(why, why_n, "unknown unit '%s': expected B, KiB, MiB, GiB, TiB (binary) or kB, MB, GB, TB (decimal)",
             end);
    return -1;
}
