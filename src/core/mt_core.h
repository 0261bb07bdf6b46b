/*
 * mt_core.h — status codes, the context handle, allocation and checks.
 *
 * Every library function that can fail returns `enum mt_status` and, on
 * failure, leaves a one-line message on the context (SQLite's
 * sqlite3_errmsg, NCCL's ncclGetLastError). Only tools/ decide how the
 * process exits. The error record also carries the file:line where the
 * error was raised (mt_ctx_error is a macro that captures it; SQLite's
 * SQLITE_CORRUPT_BKPT records where a fault was detected the same way), and
 * mt_ctx_last_error shows it as a " [src/x.c:N]" suffix when the
 * environment has MT_ERROR_WHERE=1 (off by default: a user's message stays
 * one plain line; on, the line is still one line, for a developer).
 *
 * State hangs off a `struct mt_ctx` that the caller owns, not globals. The
 * mutable process-wide state that is left, each because it belongs to the
 * process rather than to one run or handle:
 *   - the collective watchdog (src/dist/watchdog.c, one struct): one thread
 *     watches every collective of the process, marked from comm.c where no
 *     context is at hand;
 *   - the cpu ops table's per-op profile counters (src/ops/cpu/ops_cpu.c,
 *     mt_ops_profile_*): the table is a const process-wide singleton;
 *   - write-once caches of process facts: the CPU's AVX-512 support
 *     (ops_cpu.c), the MPI bf16 sum operator (comm_mpi.c), the cuda
 *     backend's default instance and each thread's bound instance
 *     (ops_cuda.cu).
 * No signal handler needs any: the watchdog is a thread, not a handler.
 *
 * Example:
 *     struct mt_ctx ctx;
 *     mt_ctx_init(&ctx);
 *     float *w = mt_alloc(&ctx, 1024 * sizeof(float), MT_BUCKET_PARAMS);
 *     if (!w) fprintf(stderr, "%s\n", mt_ctx_last_error(&ctx));
 *     mt_free(&ctx, w);
 *     mt_ctx_free(&ctx);
 *
 * Allocation: all host memory goes through mt_alloc/mt_free. Each block is
 * tagged with a memory bucket so the receipt can compare the plan per bucket
 * with what was really used; `fail_after` lets tests fail the Nth allocation.
 */
#ifndef MT_CORE_H
#define MT_CORE_H

#include <stddef.h>
#include <stdint.h>

enum mt_status {
    MT_OK = 0,
    MT_ERR_INVALID_ARG,   /* bad argument / config value (user error)        */
    MT_ERR_CONFIG,        /* config violates a shape or mesh rule            */
    MT_ERR_IO,            /* file missing, unreadable, unwritable            */
    MT_ERR_FORMAT,        /* file present but malformed (magic, checksum...) */
    MT_ERR_OOM,           /* allocation failed                               */
    MT_ERR_UNSUPPORTED,   /* op or feature not available on this backend     */
    MT_ERR_COMM,          /* collective / peer failure                       */
    MT_ERR_NUMERIC,       /* non-finite loss or gradient                     */
    MT_ERR_RUNTIME,       /* anything else that went wrong at run time       */
};

/* "ok", "invalid argument", ... Never NULL. */
const char *mt_status_str(enum mt_status st);

/* Exit code policy for tools/: 2 for bad input (INVALID_ARG, CONFIG, IO on
 * inputs, FORMAT), 1 for runtime failures. */
int mt_status_exit_code(enum mt_status st);

/* Memory buckets of SPEC.md section 4. */
enum mt_bucket {
    MT_BUCKET_PARAMS = 0,
    MT_BUCKET_GRADS,
    MT_BUCKET_OPTIM,
    MT_BUCKET_ACTS,
    MT_BUCKET_COMM,
    MT_BUCKET_WORKSPACE,
    MT_BUCKET_OTHER,
    MT_BUCKET_COUNT
};
const char *mt_bucket_name(enum mt_bucket b); /* "params", "grads", "optim", "acts", "comm", "workspace", "other" */

struct mt_knobs;
struct mt_ctx {
    enum mt_status last_status;
    char           errmsg[512];
    /* where the last error was raised: __FILE__ from src/ or tools/ on
     * ("src/core/config.c"; static storage), and its line; NULL/0 when the
     * status was set without mt_ctx_error */
    const char    *err_file;
    int            err_line;
    /* 1: mt_ctx_last_error appends " [file:line]" (mt_ctx_init: from
     * MT_ERROR_WHERE, default 0, so user messages stay one plain line) */
    int            err_show_where;
    char           errshown[512 + 80];
    /* memory accounting, bytes, per bucket (host allocations via mt_alloc) */
    size_t bytes_live[MT_BUCKET_COUNT];
    size_t bytes_peak[MT_BUCKET_COUNT];
    size_t bytes_live_total, bytes_peak_total;
    /* test hook: if > 0, the fail_after-th next allocation fails (1 = next) */
    long fail_after;
    long n_allocs;
    int  rank;        /* for messages; 0 on one rank */
    /* the tunables in force (mt_knobs.h); NULL: env aliases and defaults */
    const struct mt_knobs *knobs;
};

void mt_ctx_init(struct mt_ctx *ctx);
void mt_ctx_free(struct mt_ctx *ctx);   /* no-op on NULL */

/* Record an error (printf-style one-line message) and the file:line of the
 * call, and return `st`, so that callers can write
 * `return mt_ctx_error(ctx, MT_ERR_IO, "cannot open %s", p);`. A macro so
 * that __FILE__/__LINE__ are the caller's (STYLE 7: errors carry file:line);
 * mt_ctx_error_at is the function behind it (file: a string literal). */
enum mt_status mt_ctx_error_at(const char *file, int line, struct mt_ctx *ctx, enum mt_status st,
                               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define mt_ctx_error(ctx, st, ...) mt_ctx_error_at(__FILE__, __LINE__, (ctx), (st), __VA_ARGS__)
/* The last message ("no error" when none), with " [file:line]" appended
 * when ctx->err_show_where is set. */
const char *mt_ctx_last_error(const struct mt_ctx *ctx);
/* Where the last error was raised, "src/core/config.c:88" (the path from
 * src/ or tools/ on), written into buf; "" when unknown. Returns buf. */
const char *mt_ctx_last_where(const struct mt_ctx *ctx, char *buf, size_t n);
void        mt_ctx_clear_error(struct mt_ctx *ctx);

/* 64-byte aligned, zero-filled host allocation tagged with a bucket. Returns
 * NULL and sets MT_ERR_OOM on the context on failure. bytes == 0 returns a
 * valid unique pointer. Caller frees with mt_free; mt_free(ctx, NULL) no-op. */
void *mt_alloc(struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket);
void  mt_free(struct mt_ctx *ctx, void *p);
/* The bookkeeping every accounted allocator shares (mt_alloc here, the cuda
 * backend's device buffers): mt_ctx_alloc_check counts the request in
 * n_allocs and runs the test hook fail_after — 0 with MT_ERR_OOM set ("out
 * of <what> allocating ... (injected failure)") when this request is the one
 * to fail, 1 otherwise; mt_ctx_account adds (add 1) or removes (0) a block's
 * bytes in its bucket and the total, raising the peaks. A NULL ctx counts
 * nothing. */
int  mt_ctx_alloc_check(struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket, const char *what);
void mt_ctx_account(struct mt_ctx *ctx, size_t bytes, enum mt_bucket bucket, int add);
/* Growable array: make *p (capacity *cap elements of elem bytes) hold at
 * least need, doubling from `first` (0: no elements yet) and keeping the
 * contents; the new block comes from mt_alloc in `bucket`. MT_ERR_OOM (set on
 * the context) leaves *p and *cap as they were. */
enum mt_status mt_grow(struct mt_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem, size_t first,
                       enum mt_bucket bucket);

/* Peak resident set size of this process in bytes (from /proc), 0 if unknown. */
size_t mt_peak_rss_bytes(void);
/* Monotonic wall clock in seconds. */
double mt_time_sec(void);
/* Sorts v[0..n) ascending and returns its median (mean of the middle two for
 * even n; 0 for n < 1): the timing statistic of the roof and the benches. */
double mt_sort_median(double *v, int n);

/* A byte size from the command line or a config: a plain number
 * ("85899345920", "8e10") or a number with a unit, binary (KiB MiB GiB TiB
 * PiB: powers of 2^10) or decimal (kB KB MB GB TB PB: powers of 10^3); "B"
 * is one byte. A bare K/M/G/T/P is refused, because tools disagreed on it:
 * `why` then says which unit to write ("80G is ambiguous: write 80GiB
 * (2^30 bytes) or 80GB (10^9 bytes)"). Returns 0 and the size (>= 0) in
 * *out, or -1 with the reason in why (why may be NULL). */
int mt_size_parse(const char *s, double *out, char *why, size_t why_n);

/* Propagate a failing status upward (NCCL's NCCLCHECK). The file:line the
 * record carries is the mt_ctx_error that raised the error (the origin, the
 * line worth reading), not each MT_CHECK it passed through: the macro has no
 * context to write a trail into, and NCCL's trail is a log, which library
 * code here does not write. */
#define MT_CHECK(call)                                   \
    do {                                                 \
        enum mt_status mt_rc_ = (call);                  \
        if (mt_rc_ != MT_OK) return mt_rc_;              \
    } while (0)

#define MT_CHECK_GOTO(call, rc, label)                   \
    do {                                                 \
        (rc) = (call);                                   \
        if ((rc) != MT_OK) goto label;                   \
    } while (0)

/* Internal invariants only ("cannot happen"); never for user input. */
#ifdef NDEBUG
/* sizeof keeps the operands "used" (no unused-variable warnings) without evaluating them */
#define MT_ASSERT(cond) ((void)sizeof(cond))
#else
#include <stdio.h>
#include <stdlib.h>
#define MT_ASSERT(cond)                                                        \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: internal invariant failed: %s\n", __FILE__, \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)
#endif

#endif /* MT_CORE_H */
