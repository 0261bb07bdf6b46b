/*
 * ckpt.c — checkpoint directories: params.bin + optim.bin + manifest.json.
 *
 * Every tensor is stored as its FULL global tensor, fp32 row-major, at a
 * 64-byte aligned offset of its file. A rank writes (pwrite) and reads
 * (pread) only the box of each tensor it owns, so a checkpoint saved on one
 * mesh loads on any other: resharding on load is "read the box you own".
 *
 * Invariant: a directory named DIR is always complete. Saving writes
 * DIR.tmp (a stale one from a crash is removed first), fsyncs every file and
 * the manifest LAST, then swaps DIR.tmp into DIR (atomic exchange where the
 * kernel has renameat2(RENAME_EXCHANGE); else DIR is renamed to DIR.old
 * first) and deletes the previous one. The manifest records each file's size
 * and xxh64, and load refuses a file whose checksum differs.
 *
 * Layout of the files is the order of the global entry list given to save
 * (params, then optimizer states, for mt_ckpt_save): every rank passes the
 * same list, so every rank computes the same offsets. mt_ckpt_save_group is
 * the collective save (rank 0 creates, every rank writes its boxes, rank 0
 * commits; see HOW IT WORKS below); mt_ckpt_save is that save on a group of
 * one. Load reads whichever tensors it is given, so a rank loads exactly the
 * boxes (and optimizer states) it owns.
 *
 * Nothing read back is trusted: the manifest carries its own xxh64 and every
 * field is checked against the layout save would compute (manifest_read).
 * Nothing non-finite is written (write_boxes). A checkpoint of a run updates
 * its parent's `latest`, and mt_ckpt_resolve turns `--resume OUT` into a
 * checkpoint of that run (falling back past damaged ones). The guarantees
 * are listed in docs/checkpoint.md.
 */
#define _GNU_SOURCE
#include "mt_ckpt.h"
#include "../core/mt_fileio.h"
#include "../parallel/mt_comm.h"
#include "../model/mt_model.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define CKPT_FORMAT   "meshtrain-checkpoint"
#define CKPT_VERSION  2   /* 2: manifest checksum, run id, tokenizer.bin listed */
#define CKPT_VERSION_ADAPTER 3   /* 3: adapter-only (LoRA): version 2 + a "base" reference; a
                                    build that reads only 2 refuses it instead of failing on
                                    the missing base tensors */
#define CKPT_ALIGN    64
#define CKPT_MAX_FILES 4

/* ------------------------------------------------------------------ */
/* small file helpers                                                 */
/* ------------------------------------------------------------------ */

static int64_t align_up(int64_t x) { return (x + CKPT_ALIGN - 1) / CKPT_ALIGN * CKPT_ALIGN; }

/*
 * Box I/O. The global tensor (rows, cols) starts at byte `base` of fd; the box
 * is rows [off0, off0+len0) x cols [off1, off1+len1), `buf` (len0, len1):
 *   buf[i][j] <-> file float at base + ((off0+i)*cols + off1 + j) * 4
 * Whole rows are one contiguous run; a column range is one run per row.
 */
static int box_io(int fd, int64_t base, const int64_t shape[2], const int64_t off[2], const int64_t len[2],
                  float *buf, int write)
{
    size_t cols = (size_t)shape[1];
    if (len[1] == shape[1]) {
        size_t n = (size_t)len[0] * cols * sizeof(float);
        off_t at = (off_t)(base + (int64_t)((size_t)off[0] * cols * sizeof(float)));
        return write ? mt_file_pwrite_all(fd, buf, n, at) : mt_file_pread_all(fd, buf, n, at);
    }
    size_t rn = (size_t)len[1] * sizeof(float);
    for (int64_t i = 0; i < len[0]; i++) {
        off_t at = (off_t)(base + (int64_t)((((size_t)(off[0] + i)) * cols + (size_t)off[1]) * sizeof(float)));
        float *row = buf + (size_t)i * (size_t)len[1];
        if ((write ? mt_file_pwrite_all(fd, row, rn, at) : mt_file_pread_all(fd, row, rn, at)) != 0) return -1;
    }
    return 0;
}

static void parent_of(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    size_t l = strlen(out);
    while (l > 1 && out[l - 1] == '/') out[--l] = 0;   /* trailing slashes */
    char *s = strrchr(out, '/');
    if (!s) snprintf(out, n, ".");
    else if (s == out) out[1] = 0;
    else *s = 0;
}

/* dir/name into out; -1 (errno ENAMETOOLONG) if it does not fit. */
static int join_path(char *out, size_t n, const char *dir, const char *name)
{
    if (snprintf(out, n, "%s/%s", dir, name) >= (int)n) { errno = ENAMETOOLONG; return -1; }
    return 0;
}

static void fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

/* xxh64 (seed 0) and size of a whole file. */
static enum mt_status file_hash(struct mt_ctx *ctx, const char *path, uint64_t *hash, int64_t *size)
{
    int fd;
    MT_CHECK(mt_file_open_regular(ctx, path, NULL, &fd, NULL));   /* a FIFO would block (issue 33) */
    XXH64_state_t *st = XXH64_createState();
    size_t cap = 1 << 20;
    char *buf = mt_alloc(ctx, cap, MT_BUCKET_WORKSPACE);
    if (!st || !buf) {
        if (st) XXH64_freeState(st);
        mt_free(ctx, buf);
        close(fd);
        return mt_ctx_error(ctx, MT_ERR_OOM, "out of memory hashing %s", path);
    }
    XXH64_reset(st, 0);
    int64_t total = 0;
    enum mt_status rc = MT_OK;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { rc = mt_ctx_error(ctx, MT_ERR_IO, "cannot read %s: %s", path, strerror(errno)); break; }
        if (r == 0) break;
        XXH64_update(st, buf, (size_t)r);
        total += r;
    }
    *hash = XXH64_digest(st);
    *size = total;
    XXH64_freeState(st);
    mt_free(ctx, buf);
    close(fd);
    return rc;
}

#define CKPT_MANIFEST_MAX (16 << 20)   /* a manifest is a few KB per hundred tensors */

/* ------------------------------------------------------------------ */
/* manifest                                                           */
/* ------------------------------------------------------------------ */

struct file_entry {
    char     name[32];
    int64_t  size;
    uint64_t xxh64;
};

struct manifest {
    cJSON                 *root;
    struct mt_ckpt_tensor *t;      /* (n) */
    int                    n;
    struct file_entry      files[CKPT_MAX_FILES];
    int                    n_files;
    struct mt_ckpt_meta    meta;
    char                   hash[17];   /* its manifest_xxh64, verified */
};

static void manifest_free(struct mt_ctx *ctx, struct manifest *mf)
{
    cJSON_Delete(mf->root);
    mt_free(ctx, mf->t);
    memset(mf, 0, sizeof *mf);
}

/* An integer-valued JSON number within +-2^53 (exact in a double): 2.7,
 * 1e300, NaN-like overflow and strings are refused. */
static int json_int64(const cJSON *o, const char *key, int64_t *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x)) return -1;
    double d = x->valuedouble;
    if (!(d >= -9007199254740992.0 && d <= 9007199254740992.0) || d != floor(d)) return -1;
    *v = (int64_t)d;
    return 0;
}

/* The files a checkpoint may list; tensors live in the first two. */
#define CKPT_N_BIN 2
static const char *const bin_name[CKPT_N_BIN] = {"params.bin", "optim.bin"};
#define CKPT_TOKENIZER "tokenizer.bin"
#define CKPT_MAX_STEP  100000000   /* the CLI's --steps bound */

/*
 * The manifest's own checksum: xxh64 (seed 0) of cJSON_PrintUnformatted of
 * the manifest object WITHOUT its "manifest_xxh64" key, as 16 hex digits.
 * cJSON prints a number it parsed back to the same text (it prints the
 * shortest of %.15g/%.17g that round-trips), and keeps key order, so the
 * reader recomputes exactly the writer's canonical text.
 */
static int manifest_digest(const cJSON *root_without_sum, char hex[17])
{
    char *t = cJSON_PrintUnformatted(root_without_sum);
    if (!t) return -1;
    snprintf(hex, 17, "%016" PRIx64, XXH64(t, strlen(t), 0));
    free(t);
    return 0;
}

static int is_hex16(const char *s)
{
    if (strlen(s) != 16) return 0;
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* A run id: "" or 16 lowercase hex digits. */
static int is_run_id(const char *s) { return !*s || is_hex16(s); }

/* manifest_read's steps, in the order docs/checkpoint.md documents the
 * fields; each checks what it reads with its own message (MT_ERR_FORMAT
 * naming the field) and leaves what it allocated in mf for manifest_free.
 * path: the manifest's path, for the messages. */

/* format, version, the manifest's own checksum, the base reference */
static enum mt_status manifest_header(struct mt_ctx *ctx, const char *path, struct manifest *mf)
{
    enum mt_status rc = MT_OK;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(mf->root, "format");
    int64_t ver = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, CKPT_FORMAT) || json_int64(mf->root, "version", &ver)) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: not a meshtrain checkpoint manifest", path);
        return rc;
    }
    if (ver != CKPT_VERSION && ver != CKPT_VERSION_ADAPTER) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: checkpoint format version %lld, this build reads %d and %d%s", path,
                          (long long)ver, CKPT_VERSION, CKPT_VERSION_ADAPTER,
                          ver == 1 ? " (version 1 has no manifest checksum)" : "");
        return rc;
    }
    {
        cJSON *sum = cJSON_DetachItemFromObjectCaseSensitive(mf->root, "manifest_xxh64");
        char hex[17];
        int ok = cJSON_IsString(sum) && manifest_digest(mf->root, hex) == 0;
        int same = ok && !strcmp(hex, sum->valuestring);
        if (!cJSON_IsString(sum)) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: no manifest checksum (manifest_xxh64)", path);
        } else if (!ok) {
            rc = mt_ctx_error(ctx, MT_ERR_OOM, "%s: out of memory checking the manifest checksum", path);
        } else if (!same) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s fails its manifest checksum (xxh64 %s, stored %.20s): edited or damaged",
                              path, hex, sum->valuestring);
        }
        if (rc == MT_OK) snprintf(mf->hash, sizeof mf->hash, "%s", hex);
        cJSON_Delete(sum);
        if (rc != MT_OK) return rc;
    }
    {
        /* version 3 <=> a base reference {manifest_hash: 16 hex, path: non-empty} */
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(mf->root, "base");
        const cJSON *bh = cJSON_GetObjectItemCaseSensitive(b, "manifest_hash");
        const cJSON *bp = cJSON_GetObjectItemCaseSensitive(b, "path");
        int has = b != NULL;
        if (has != (ver == CKPT_VERSION_ADAPTER) ||
            (has && (!cJSON_IsObject(b) || !cJSON_IsString(bh) || !is_hex16(bh->valuestring) || !cJSON_IsString(bp) ||
                     !*bp->valuestring || strlen(bp->valuestring) >= sizeof mf->meta.base_path))) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: \"base\" %s", path,
                              has != (ver == CKPT_VERSION_ADAPTER) ? "must be present iff version is 3 (adapter-only)"
                                                                   : "must be {manifest_hash: 16 hex digits, path}");
            return rc;
        }
        if (has) {
            snprintf(mf->meta.base_hash, sizeof mf->meta.base_hash, "%s", bh->valuestring);
            snprintf(mf->meta.base_path, sizeof mf->meta.base_path, "%s", bp->valuestring);
        }
    }
    return MT_OK;
}

/* meta: step, data_pos, adam_t, seed, mesh, run_id */
static enum mt_status manifest_meta(struct mt_ctx *ctx, const char *path, struct manifest *mf)
{
    enum mt_status rc;
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(mf->root, "meta");
    int64_t step, pos, t;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(meta, "seed");
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(meta, "mesh");
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(meta, "run_id");
    if (!cJSON_IsObject(meta) || !cJSON_IsString(seed) || !cJSON_IsString(mesh) || !cJSON_IsString(rid)) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: missing or malformed \"meta\"", path);
        return rc;
    }
    if (json_int64(meta, "step", &step) || step < 0 || step > CKPT_MAX_STEP) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: meta.step must be an integer in [0, %d]", path, CKPT_MAX_STEP);
        return rc;
    }
    if (json_int64(meta, "data_pos", &pos) || pos < 0) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: meta.data_pos must be a non-negative integer", path);
        return rc;
    }
    if (json_int64(meta, "adam_t", &t) || t < 0 || t > step) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: meta.adam_t must be an integer in [0, step = %lld]", path, (long long)step);
        return rc;
    }
    {
        const char *sv = seed->valuestring;
        char *end = NULL;
        errno = 0;
        unsigned long long u = strtoull(sv, &end, 10);
        if (!*sv || *sv < '0' || *sv > '9' || *end || errno) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: meta.seed must be a decimal u64 string", path);
            return rc;
        }
        mf->meta.seed = (uint64_t)u;
    }
    if (strlen(mesh->valuestring) >= sizeof mf->meta.mesh || !is_run_id(rid->valuestring)) {
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: meta.mesh or meta.run_id is malformed", path);
        return rc;
    }
    mf->meta.step = (int)step;
    mf->meta.data_pos = pos;
    mf->meta.optim_t = (long)t;
    snprintf(mf->meta.mesh, sizeof mf->meta.mesh, "%s", mesh->valuestring);
    snprintf(mf->meta.run_id, sizeof mf->meta.run_id, "%s", rid->valuestring);
    return MT_OK;
}

/* files: the bin files and the tokenizer with their size and xxh64 */
static enum mt_status manifest_files(struct mt_ctx *ctx, const char *path, struct manifest *mf)
{
    enum mt_status rc;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(mf->root, "files");
    const cJSON *f;
    if (!cJSON_IsObject(files)) { rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: missing \"files\"", path); return rc; }
    cJSON_ArrayForEach(f, files) {
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(f, "xxh64");
        struct file_entry *fe = &mf->files[mf->n_files];
        int known = !strcmp(f->string, bin_name[0]) || !strcmp(f->string, bin_name[1]) || !strcmp(f->string, CKPT_TOKENIZER);
        for (int k = 0; k < mf->n_files && known; k++) known = strcmp(mf->files[k].name, f->string) != 0;
        if (mf->n_files == CKPT_MAX_FILES || !known || !cJSON_IsString(h) || !is_hex16(h->valuestring) ||
            json_int64(f, "size", &fe->size) || fe->size < 0) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: malformed, unknown or repeated \"files\" entry %s", path, f->string);
            return rc;
        }
        snprintf(fe->name, sizeof fe->name, "%s", f->string);
        fe->xxh64 = strtoull(h->valuestring, NULL, 16);
        mf->n_files++;
    }
    return MT_OK;
}

/* tensors: name, file, dtype, shape, offset at the layout save computes;
 * then each bin file's size against its tensors' end. n_in: tensors per bin file. */
static enum mt_status manifest_tensors(struct mt_ctx *ctx, const char *path, struct manifest *mf,
                                       int n_in[CKPT_N_BIN])
{
    enum mt_status rc;
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(mf->root, "tensors");
    if (!cJSON_IsArray(tensors)) { rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: missing \"tensors\"", path); return rc; }
    int n = cJSON_GetArraySize(tensors);
    mf->t = mt_alloc(ctx, (size_t)(n > 0 ? n : 1) * sizeof *mf->t, MT_BUCKET_OTHER);
    if (!mf->t) { rc = MT_ERR_OOM; return rc; }
    int64_t end_of[CKPT_N_BIN] = {0, 0};   /* the layout save computes: running end per file */
    const cJSON *e;
    cJSON_ArrayForEach(e, tensors) {
        struct mt_ckpt_tensor *ct = &mf->t[mf->n];
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *fl = cJSON_GetObjectItemCaseSensitive(e, "file");
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        int nd = cJSON_GetArraySize(sh);
        if (!cJSON_IsString(nm) || !*nm->valuestring || !cJSON_IsString(fl) || !cJSON_IsString(dt) ||
            !cJSON_IsArray(sh) || json_int64(e, "offset", &ct->offset) || nd < 1 || nd > 2 ||
            strlen(nm->valuestring) >= sizeof ct->name || strlen(fl->valuestring) >= sizeof ct->file) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: malformed tensor entry %d", path, mf->n);
            return rc;
        }
        if (strcmp(dt->valuestring, "F32")) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: tensor %s has dtype %s (only F32 is stored)", path,
                              nm->valuestring, dt->valuestring);
            return rc;
        }
        snprintf(ct->name, sizeof ct->name, "%s", nm->valuestring);
        snprintf(ct->file, sizeof ct->file, "%s", fl->valuestring);
        int k = !strcmp(ct->file, bin_name[0]) ? 0 : !strcmp(ct->file, bin_name[1]) ? 1 : -1;
        if (k < 0) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: tensor %s is in file %s (params.bin or optim.bin)", path, ct->name, ct->file);
            return rc;
        }
        ct->ndim = nd;
        ct->shape[1] = 1;
        for (int d = 0; d < nd; d++) {
            const cJSON *x = cJSON_GetArrayItem(sh, d);
            double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
            if (!(v >= (d == 1 ? 1 : 0) && v <= 2147483647.0) || v != floor(v)) {
                rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: tensor %s has a bad shape", path, ct->name);
                return rc;
            }
            ct->shape[d] = (int64_t)v;
        }
        /* < 2^31 x 2^31 x 4 bytes: no int64 overflow */
        int64_t bytes = ct->shape[0] * ct->shape[1] * (int64_t)sizeof(float);
        int64_t want = align_up(end_of[k]);
        if (ct->offset != want) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: tensor %s has offset %lld in %s, the layout puts it at %lld", path,
                              ct->name, (long long)ct->offset, ct->file, (long long)want);
            return rc;
        }
        end_of[k] = want + bytes;
        n_in[k]++;
        mf->n++;
    }
    for (int k = 0; k < CKPT_N_BIN; k++) {
        const struct file_entry *fe = NULL;
        for (int j = 0; j < mf->n_files; j++)
            if (!strcmp(mf->files[j].name, bin_name[k])) fe = &mf->files[j];
        int need = k == 0 || n_in[k] > 0;   /* params.bin always exists; optim.bin iff it holds a tensor */
        if (need != (fe != NULL) || (fe && fe->size != end_of[k])) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: file %s %s (its tensors end at byte %lld)", path, bin_name[k],
                              !fe ? "is not listed" : need ? "has the wrong size" : "is listed but holds no tensor",
                              (long long)end_of[k]);
            return rc;
        }
    }
    return MT_OK;
}

/*
 * Read and validate DIR/manifest.json: nothing in it is trusted.
 *   - its own checksum (manifest_xxh64) matches its canonical text;
 *   - format/version; meta: step in [0, 1e8], data_pos >= 0, seed a u64 in
 *     decimal, mesh and run id well-formed, adam_t in [0, step] and >= 1 when
 *     step > 0 and an optim.bin is listed (0 when step == 0);
 *   - files: only params.bin (required), optim.bin, tokenizer.bin, each once,
 *     with an integer size >= 0 and a 16-hex-digit xxh64;
 *   - tensors: unique names, F32, ndim 1 or 2, integer dims (second dim 1
 *     for 1-D), file params.bin or optim.bin, and OFFSETS EQUAL TO THE
 *     LAYOUT save computes (in manifest order, 64-byte aligned); each bin
 *     file's size equals the end of its last tensor, and optim.bin is listed
 *     iff a tensor lives in it.
 * MT_ERR_IO if the manifest cannot be opened, else MT_ERR_FORMAT naming the
 * field.
 */
static enum mt_status manifest_read(struct mt_ctx *ctx, const char *dir, struct manifest *mf)
{
    memset(mf, 0, sizeof *mf);
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/manifest.json", dir) >= (int)sizeof path)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "path too long: %s", dir);
    char *text;
    enum mt_status rc = mt_file_read_text(ctx, path, CKPT_MANIFEST_MAX, &text);
    /* a manifest.json that is there but no regular file (a FIFO) keeps its own message */
    if (rc == MT_ERR_IO && !(access(path, F_OK) == 0 && !mt_file_is_regular(path)))
        return mt_ctx_error(ctx, MT_ERR_IO, "no checkpoint at %s (cannot read manifest.json)", dir);
    if (rc != MT_OK) return rc;
    mf->root = cJSON_Parse(text);
    mt_free(ctx, text);
    int n_in[CKPT_N_BIN] = {0, 0};
    if (!cJSON_IsObject(mf->root)) rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: not valid JSON", path);
    if (rc == MT_OK) rc = manifest_header(ctx, path, mf);
    if (rc == MT_OK) rc = manifest_meta(ctx, path, mf);
    if (rc == MT_OK) rc = manifest_files(ctx, path, mf);
    if (rc == MT_OK) rc = manifest_tensors(ctx, path, mf, n_in);
    /* step > 0 with optimizer state: the optimizer has stepped at least once */
    const long long step = mf->meta.step, t = mf->meta.optim_t;
    if (rc == MT_OK && ((step == 0 && t != 0) || (step > 0 && n_in[1] > 0 && t < 1)))
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s: meta.adam_t %lld does not fit step %lld", path, t, step);
    if (rc != MT_OK) manifest_free(ctx, mf);
    return rc;
}

static const struct file_entry *manifest_file(const struct manifest *mf, const char *name)
{
    for (int k = 0; k < mf->n_files; k++)
        if (!strcmp(mf->files[k].name, name)) return &mf->files[k];
    return NULL;
}

/* Recompute a file's size and xxh64 and compare with the manifest. */
static enum mt_status verify_file(struct mt_ctx *ctx, const char *dir, const struct manifest *mf, const char *name)
{
    const struct file_entry *fe = manifest_file(mf, name);
    if (!fe) return mt_ctx_error(ctx, MT_ERR_FORMAT, "checkpoint %s: manifest lists no file %s", dir, name);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint64_t h;
    int64_t size;
    enum mt_status rc = file_hash(ctx, path, &h, &size);
    if (rc != MT_OK) return rc == MT_ERR_IO ? mt_ctx_error(ctx, MT_ERR_FORMAT, "checkpoint file %s is missing or unreadable", path) : rc;
    if (size != fe->size)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "checkpoint file %s has %lld bytes, manifest says %lld", path,
                            (long long)size, (long long)fe->size);
    if (h != fe->xxh64)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "checkpoint file %s fails its checksum (xxh64 %016" PRIx64
                            ", manifest %016" PRIx64 ")", path, h, fe->xxh64);
    return MT_OK;
}

/* ------------------------------------------------------------------ */
/* save                                                               */
/* ------------------------------------------------------------------ */

/*
 * HOW IT WORKS — the collective save (mt_ckpt_save_group).
 *
 * Every rank passes the same global list of entries (name, file, global
 * shape, in the same order) and data for the boxes it holds. Offsets are a
 * pure function of that list (entry order within each file, 64-byte
 * aligned), so every rank computes the same layout without talking. The save
 * runs in four phases, and after each one every rank takes part in exactly
 * one agreement step: an allreduce (MAX) of "(failing rank + 1) * 16 +
 * status", 0 when the rank is fine. All ranks therefore run the same
 * sequence of collectives whatever happens locally, and a failure anywhere
 * stops every rank at the same point; nobody is left waiting.
 *
 *   1 check   every rank: arguments, shapes, boxes, names, staging memory;
 *             rank 0 also builds the manifest body (config, meta, tensors).
 *             The same allreduce carries a hash of (dir, layout) and its
 *             complement, so lists that differ across ranks are refused on
 *             every rank. Nothing is on disk yet: bad input loses nothing.
 *   2 create  rank 0: DIR.tmp from scratch; params.bin (and optim.bin when
 *             an entry targets it) created at full size. Bytes nobody
 *             writes read as zeros.
 *   3 write   every rank: pwrite the boxes it holds data for, fsync.
 *   4 commit  rank 0: hash the files, write manifest.json LAST, fsync, swap
 *             DIR.tmp into DIR.
 *
 * On an agreed failure from phase 2 on, rank 0 removes DIR.tmp (every rank
 * has left the phase, so nobody is still writing into it), and the ranks meet
 * once more before returning, so that a rank whose caller aborts the job on
 * error cannot kill rank 0 mid-removal. DIR is only ever replaced by the swap
 * of a complete directory.
 */

/* The agreement code packs (rank + 1) and a status into one int64. */
#define CKPT_STATUS_BITS 16
_Static_assert(MT_ERR_RUNTIME < CKPT_STATUS_BITS, "mt_status must fit the agreement code");

/* Global shape of tensor `name` is well-formed: ndim 1 or 2, shape[1] == 1 for 1-D. */
static enum mt_status check_shape(struct mt_ctx *ctx, const char *name, const struct mt_param *p)
{
    if (p->ndim < 1 || p->ndim > 2 || p->shape[0] < 0 || p->shape[1] < 1 || (p->ndim == 1 && p->shape[1] != 1))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "parameter %s has a bad shape", name);
    return MT_OK;
}

/* ... and the box (off, len) lies inside it and matches numel. */
static enum mt_status check_box(struct mt_ctx *ctx, const char *name, const struct mt_param *p)
{
    MT_CHECK(check_shape(ctx, name, p));
    for (int d = 0; d < 2; d++)
        if (p->off[d] < 0 || p->len[d] < 0 || p->off[d] + p->len[d] > p->shape[d])
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "parameter %s: box outside its global shape", name);
    if ((size_t)p->len[0] * (size_t)p->len[1] != p->numel)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "parameter %s: numel != box size", name);
    return MT_OK;
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Phase 1, every rank: the list is well-formed and names are unique (load
 * refuses a manifest that lists a name twice). */
static enum mt_status check_entries(struct mt_ctx *ctx, const struct mt_ckpt_entry *e, int n)
{
    for (int i = 0; i < n; i++) {
        if (!e[i].name || !*e[i].name || !e[i].p)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint entry %d: missing name or parameter", i);
        if (strlen(e[i].name) >= sizeof ((struct mt_ckpt_tensor *)0)->name)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint entry %d: name longer than %zu bytes: %.60s...",
                                i, sizeof ((struct mt_ckpt_tensor *)0)->name - 1, e[i].name);
        if (e[i].file < 0 || e[i].file >= CKPT_N_BIN)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint entry %s: file %d (0: params.bin, 1: optim.bin)",
                                e[i].name, e[i].file);
        MT_CHECK(e[i].data ? check_box(ctx, e[i].name, e[i].p) : check_shape(ctx, e[i].name, e[i].p));
    }
    const char **names = mt_alloc(ctx, (size_t)(n > 0 ? n : 1) * sizeof *names, MT_BUCKET_OTHER);
    if (!names) return MT_ERR_OOM;
    for (int i = 0; i < n; i++) names[i] = e[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    enum mt_status rc = MT_OK;
    for (int i = 1; i < n && rc == MT_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint entry %s is listed twice", names[i]);
    mt_free(ctx, names);
    return rc;
}

/* xxh64 of (dir, layout): equal on every rank iff they agree on what to save. */
static uint64_t layout_hash(const char *dir, const struct mt_ckpt_entry *e, int n)
{
    uint64_t h = XXH64(dir, strlen(dir) + 1, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        int64_t v[4] = {e[i].file, e[i].p->ndim, e[i].p->shape[0], e[i].p->shape[1]};
        h = XXH64(e[i].name, strlen(e[i].name) + 1, h);
        h = XXH64(v, sizeof v, h);
    }
    return h;
}

/*
 * Agreement step: every rank contributes its own status (`rc`), plus `extra`
 * int64 values reduced with MAX alongside (NULL / 0 for none). Returns MT_OK
 * on every rank iff every rank passed MT_OK. A failing rank returns its own
 * status and keeps its own message; the others return that rank's status
 * with a message naming it (the highest failing rank when several fail). A
 * failed allreduce is returned as is.
 */
static enum mt_status agree(struct mt_ctx *ctx, struct mt_comm *comm, enum mt_status rc, const char *dir,
                            const char *phase, int64_t *extra, int n_extra, int *comm_broken)
{
    int64_t v[3] = {0, 0, 0};
    MT_ASSERT(n_extra >= 0 && n_extra <= 2);
    if (rc != MT_OK) v[0] = ((int64_t)mt_comm_rank(comm) + 1) * CKPT_STATUS_BITS + (int64_t)rc;
    for (int i = 0; i < n_extra; i++) v[1 + i] = extra[i];
    char own[sizeof ctx->errmsg];
    snprintf(own, sizeof own, "%s", ctx->errmsg);
    enum mt_status crc = mt_comm_allreduce(ctx, comm, v, (size_t)(1 + n_extra), MT_DTYPE_I64, MT_REDOP_MAX);
    *comm_broken = crc != MT_OK;
    for (int i = 0; i < n_extra; i++) extra[i] = v[1 + i];
    if (rc != MT_OK) {
        if (crc != MT_OK) mt_ctx_error(ctx, rc, "%s", own);   /* the first failure is the one to report */
        return rc;
    }
    if (crc != MT_OK) return crc;
    if (v[0] == 0) return MT_OK;
    int who = (int)(v[0] / CKPT_STATUS_BITS) - 1;
    enum mt_status st = (enum mt_status)(v[0] % CKPT_STATUS_BITS);
    return mt_ctx_error(ctx, st, "checkpoint %s not saved: rank %d failed (%s) while %s; see that rank's error",
                        dir, who, mt_status_str(st), phase);
}

/* Phase 1, rank 0: the manifest body (format, version, config, meta,
 * tensors), so a config that does not serialise fails before any disk work.
 * The "files" object is added in phase 4. */
static enum mt_status manifest_build(struct mt_ctx *ctx, const struct mt_config *cfg, const struct mt_ckpt_meta *meta,
                                     const struct mt_ckpt_entry *e, int n, const int64_t *offset, cJSON **out)
{
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return mt_ctx_error(ctx, MT_ERR_OOM, "checkpoint: out of memory building the manifest");
    cJSON_AddStringToObject(root, "format", CKPT_FORMAT);
    cJSON_AddNumberToObject(root, "version", meta->base_hash[0] ? CKPT_VERSION_ADAPTER : CKPT_VERSION);
    char *cfg_json = mt_config_to_json(cfg);
    cJSON *cj = cfg_json ? cJSON_Parse(cfg_json) : NULL;
    free(cfg_json);
    if (!cj) {
        cJSON_Delete(root);
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "checkpoint: config does not serialise to JSON");
    }
    cJSON_AddItemToObject(root, "config", cj);
    cJSON *mj = cJSON_AddObjectToObject(root, "meta");
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, meta->seed);
    cJSON_AddNumberToObject(mj, "step", meta->step);
    cJSON_AddNumberToObject(mj, "data_pos", (double)meta->data_pos);
    cJSON_AddStringToObject(mj, "seed", seed);           /* string: a uint64 does not fit a double */
    cJSON_AddNumberToObject(mj, "adam_t", (double)meta->optim_t);
    cJSON_AddStringToObject(mj, "mesh", meta->mesh);
    cJSON_AddStringToObject(mj, "run_id", meta->run_id);
    if (meta->base_hash[0]) {
        /* adapter-only: the frozen base is another checkpoint, by hash */
        cJSON *bj = cJSON_AddObjectToObject(root, "base");
        cJSON_AddStringToObject(bj, "manifest_hash", meta->base_hash);
        cJSON_AddStringToObject(bj, "path", meta->base_path);
    }
    cJSON *arr = cJSON_AddArrayToObject(root, "tensors");
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "name", e[i].name);
        cJSON_AddStringToObject(t, "file", bin_name[e[i].file]);
        cJSON_AddNumberToObject(t, "offset", (double)offset[i]);
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < e[i].p->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[i].p->shape[d]));
        cJSON_AddStringToObject(t, "dtype", "F32");
        cJSON_AddItemToArray(arr, t);
    }
    *out = root;
    return MT_OK;
}

/* Phase 2, rank 0: DIR.tmp from scratch (a crash may have left one) and the
 * files at their full size (sparse: unwritten bytes read as zeros). */
static enum mt_status create_files(struct mt_ctx *ctx, const char *par, const char *tmp, const int64_t total[CKPT_N_BIN],
                                   const int used[CKPT_N_BIN])
{
    if (mt_file_mkdir_p(par) != 0) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot create %s: %s", par, strerror(errno));
    if (mt_file_rm_rf(tmp) != 0) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot remove stale %s: %s", tmp, strerror(errno));
    if (mkdir(tmp, 0755) != 0) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot create %s: %s", tmp, strerror(errno));
    for (int k = 0; k < CKPT_N_BIN; k++) {
        if (!used[k]) continue;
        char path[PATH_MAX];
        int fd = join_path(path, sizeof path, tmp, bin_name[k]) == 0 ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
        if (fd < 0 || ftruncate(fd, (off_t)total[k]) != 0 || fsync(fd) != 0) {
            int err = errno;
            if (fd >= 0) close(fd);
            return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot create %s: %s", path, strerror(err));
        }
        close(fd);
    }
    return MT_OK;
}

/* The first non-finite float of x[0..n), or n. */
static size_t first_non_finite(const float *x, size_t n)
{
    for (size_t k = 0; k < n; k++)
        if (!isfinite(x[k])) return k;
    return n;
}

/* Phase 3, every rank: pwrite the boxes this rank holds data for, fsync.
 * A file this rank writes nothing to is not opened. Every box is checked
 * for NaN/Inf on the host copy before it is written: a poisoned checkpoint
 * would be picked by the next resume (the step's own check only sees the
 * NEXT step's gradients). */
static enum mt_status write_boxes(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir, const char *tmp,
                                  const struct mt_ckpt_entry *e, int n, const int64_t *offset, float *stage, int rank,
                                  int step)
{
    for (int k = 0; k < CKPT_N_BIN; k++) {
        int any = 0;
        for (int i = 0; i < n && !any; i++) any = e[i].file == k && e[i].data;
        if (!any) continue;
        char path[PATH_MAX];
        int fd = join_path(path, sizeof path, tmp, bin_name[k]) == 0 ? open(path, O_WRONLY) : -1;   /* sized by rank 0 */
        if (fd < 0) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot open %s: %s", path, strerror(errno));
        int bad = 0;
        for (int i = 0; i < n && !bad; i++) {
            if (e[i].file != k || !e[i].data) continue;
            const struct mt_param *p = e[i].p;
            const float *host = e[i].data;
            if (ops) {
                ops->copy_to_host(ops->be, stage, e[i].data, p->numel * sizeof(float));
                host = stage;
            }
            size_t at = first_non_finite(host, p->numel);
            if (at < p->numel) {
                close(fd);
                return mt_ctx_error(ctx, MT_ERR_NUMERIC,
                                    "checkpoint %s not saved: tensor %s holds a non-finite value (%g at element %zu of "
                                    "this rank's box) on rank %d at step %d",
                                    dir, e[i].name, (double)host[at], at, rank, step);
            }
            bad = box_io(fd, offset[i], p->shape, p->off, p->len, (float *)host, 1) != 0;
        }
        if (bad || fsync(fd) != 0) {
            int err = errno;
            close(fd);
            return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot write %s: %s", path, strerror(err));
        }
        close(fd);
    }
    return MT_OK;
}

static enum mt_status add_file(struct mt_ctx *ctx, cJSON *files, const char *dir, const char *fname)
{
    char path[PATH_MAX], hex[32];
    if (snprintf(path, sizeof path, "%s/%s", dir, fname) >= (int)sizeof path)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "path too long: %s", dir);
    uint64_t h;
    int64_t size;
    enum mt_status rc = file_hash(ctx, path, &h, &size);
    if (rc == MT_ERR_IO) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "%s", mt_ctx_last_error(ctx));   /* we just wrote it */
    MT_CHECK(rc);
    snprintf(hex, sizeof hex, "%016" PRIx64, h);
    cJSON *f = cJSON_AddObjectToObject(files, fname);
    cJSON_AddNumberToObject(f, "size", (double)size);
    cJSON_AddStringToObject(f, "xxh64", hex);
    return MT_OK;
}

/* Copy `src` to `dst` and fsync it; every read and write checked (a short
 * copy must never be committed). MT_ERR_RUNTIME on any failure. */

/* Write `text` to dir/name atomically: dir/name.tmp, fsync, rename, fsync
 * dir. The .tmp is removed on failure. MT_ERR_RUNTIME on failure. */
static enum mt_status write_atomic(struct mt_ctx *ctx, const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX];
    if (join_path(path, sizeof path, dir, name) != 0)
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "path too long: %s/%s", dir, name);
    return mt_file_write_atomic(ctx, path, text, strlen(text), MT_FILE_SYNC | MT_FILE_SYNC_DIR, MT_ERR_RUNTIME);
}

/* Phase 4, rank 0: tokenizer copy, checksums, manifest.json LAST (with its
 * own checksum), then swap DIR.tmp into DIR: a complete DIR exists at every
 * instant where renameat2(RENAME_EXCHANGE) works; else DIR -> DIR.old,
 * DIR.tmp -> DIR (and back if the second fails). A checkpoint of a run then
 * becomes the parent's `latest`. Every failure is MT_ERR_RUNTIME (the inputs
 * were checked in phase 1; what fails now is the disk). */
static enum mt_status commit(struct mt_ctx *ctx, cJSON *root, const char *dir, const char *tmp, const char *old,
                             const char *par, const int used[CKPT_N_BIN], const struct mt_ckpt_meta *meta)
{
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    if (!files) return mt_ctx_error(ctx, MT_ERR_OOM, "checkpoint: out of memory building the manifest");
    for (int k = 0; k < CKPT_N_BIN; k++)
        if (used[k]) MT_CHECK(add_file(ctx, files, tmp, bin_name[k]));
    if (meta->tokenizer) {
        char dst[PATH_MAX];
        if (join_path(dst, sizeof dst, tmp, CKPT_TOKENIZER) != 0)
            return mt_ctx_error(ctx, MT_ERR_RUNTIME, "path too long: %s", tmp);
        MT_CHECK(mt_file_copy(ctx, meta->tokenizer, dst));
        MT_CHECK(add_file(ctx, files, tmp, CKPT_TOKENIZER));
    }
    char hex[17];
    if (manifest_digest(root, hex) != 0) return mt_ctx_error(ctx, MT_ERR_OOM, "checkpoint: cannot print manifest");
    cJSON_AddStringToObject(root, "manifest_xxh64", hex);
    char *text = cJSON_Print(root);
    if (!text) return mt_ctx_error(ctx, MT_ERR_OOM, "checkpoint: cannot print manifest");
    char path[PATH_MAX];
    int fd = join_path(path, sizeof path, tmp, "manifest.json") == 0 ? open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
    if (fd < 0 || mt_file_pwrite_all(fd, text, strlen(text), 0) != 0 || fsync(fd) != 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        free(text);
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot write %s: %s", path, strerror(err));
    }
    close(fd);
    free(text);
    fsync_path(tmp);

    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
            mt_file_rm_rf(tmp);   /* now holds the previous checkpoint */
        } else {
            mt_file_rm_rf(old);
            if (rename(dir, old) != 0)
                return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot move %s aside: %s", dir, strerror(errno));
            if (rename(tmp, dir) != 0) {
                int err = errno;
                rename(old, dir);   /* put the previous checkpoint back */
                return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot move %s into place: %s", tmp, strerror(err));
            }
            mt_file_rm_rf(old);
        }
    } else if (rename(tmp, dir) != 0) {
        return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot rename %s to %s: %s", tmp, dir, strerror(errno));
    }
    fsync_path(par);
    if (meta->run_id[0]) {
        /* latest = "NAME\nRUN_ID\n", NAME the last path component of dir */
        char name[PATH_MAX], line[PATH_MAX + 40];
        snprintf(name, sizeof name, "%s", dir);
        size_t l = strlen(name);
        while (l > 1 && name[l - 1] == '/') name[--l] = 0;
        const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
        snprintf(line, sizeof line, "%s\n%s\n", base, meta->run_id);
        enum mt_status rc = write_atomic(ctx, par, "latest", line);
        if (rc != MT_OK)
            return mt_ctx_error(ctx, rc, "checkpoint %s was committed but %s/latest was not updated: %s", dir, par,
                                mt_ctx_last_error(ctx));
    }
    return MT_OK;
}

enum mt_status mt_ckpt_save_group(struct mt_ctx *ctx, const struct mt_ops_i *ops, struct mt_comm *comm,
                                  const char *dir, const struct mt_config *cfg, const struct mt_ckpt_meta *meta,
                                  const struct mt_ckpt_entry *entries, int n_entries)
{
    /* no communicator: no way to tell the others; nothing is touched */
    if (!comm) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_ckpt_save_group: NULL communicator");
    const int rank = mt_comm_rank(comm);
    const char *where = dir && *dir ? dir : "(no dir)";
    char tmp[PATH_MAX], par[PATH_MAX], old[PATH_MAX];
    int64_t *offset = NULL;
    int64_t total[CKPT_N_BIN] = {0, 0};
    int used[CKPT_N_BIN] = {1, 0};   /* params.bin always exists (load verifies it) */
    float *stage = NULL;
    cJSON *root = NULL;
    enum mt_status rc = MT_OK;
    int broken = 0;   /* the last agreement's allreduce failed: no further collective */

    /* ---- phase 1: check (every rank), no disk ---- */
    if (!dir || !*dir || !cfg || !meta || n_entries < 0 || (n_entries > 0 && !entries)) {
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_ckpt_save_group: missing argument");
    } else if (snprintf(tmp, sizeof tmp, "%s.tmp", dir) >= (int)sizeof tmp - 32 ||
               snprintf(old, sizeof old, "%s.old", dir) >= (int)sizeof old - 32) {
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint path too long: %s", dir);
    } else {
        parent_of(dir, par, sizeof par);
        rc = check_entries(ctx, entries, n_entries);
    }
    if (rc == MT_OK) {
        offset = mt_alloc(ctx, (size_t)(n_entries > 0 ? n_entries : 1) * sizeof *offset, MT_BUCKET_OTHER);
        if (!offset) rc = MT_ERR_OOM;
    }
    if (rc == MT_OK) {
        size_t max_numel = 0;
        for (int i = 0; i < n_entries; i++) {
            const struct mt_ckpt_entry *e = &entries[i];
            offset[i] = align_up(total[e->file]);
            total[e->file] = offset[i] + (int64_t)(mt_param_global_numel(e->p) * sizeof(float));
            used[e->file] = 1;
            if (e->data && e->p->numel > max_numel) max_numel = e->p->numel;
        }
        if (ops) {
            stage = mt_alloc(ctx, max_numel * sizeof(float), MT_BUCKET_WORKSPACE);
            if (!stage) rc = MT_ERR_OOM;
        }
    }
    if (rc == MT_OK) {
        /* what load would refuse is never written (manifest_read's rules) */
        int bad_t = meta->optim_t < 0 || meta->optim_t > meta->step || (meta->step == 0 && meta->optim_t != 0) ||
                    (meta->step > 0 && used[1] && meta->optim_t < 1);
        if (meta->step < 0 || meta->step > CKPT_MAX_STEP || meta->data_pos < 0 || bad_t)
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint %s: meta out of range (step %d, data_pos %lld, adam_t %ld)",
                              where, meta->step, (long long)meta->data_pos, meta->optim_t);
        else if (memchr(meta->run_id, 0, sizeof meta->run_id) == NULL || !is_run_id(meta->run_id))
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint %s: malformed run id", where);
        else if (memchr(meta->base_hash, 0, sizeof meta->base_hash) == NULL ||
                 memchr(meta->base_path, 0, sizeof meta->base_path) == NULL ||
                 (meta->base_hash[0] && (!is_hex16(meta->base_hash) || !meta->base_path[0])))
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint %s: malformed base reference", where);
    }
    if (rc == MT_OK && rank == 0 && meta->tokenizer) {
        struct stat sb;
        if (stat(meta->tokenizer, &sb) != 0 || !S_ISREG(sb.st_mode))
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint %s: tokenizer %s is not a readable file", where,
                              meta->tokenizer);
    }
    if (rc == MT_OK && rank == 0) rc = manifest_build(ctx, cfg, meta, entries, n_entries, offset, &root);
    {
        uint64_t h = rc == MT_OK ? layout_hash(dir, entries, n_entries) : 0;
        int64_t hv[2] = {(int64_t)h, ~(int64_t)h};   /* max(h) == h and max(~h) == ~h on every rank iff all equal */
        MT_CHECK_GOTO(agree(ctx, comm, rc, where, "checking its arguments", hv, 2, &broken), rc, done);
        if (hv[0] != (int64_t)h || hv[1] != ~(int64_t)h) {
            rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                              "checkpoint %s not saved: the ranks passed different directories or entry lists "
                              "(names, files and global shapes must be the same, in the same order, on every rank)",
                              where);
            goto done;
        }
    }

    /* ---- phase 2: rank 0 creates DIR.tmp and sizes the files ---- */
    if (rank == 0) rc = create_files(ctx, par, tmp, total, used);
    MT_CHECK_GOTO(agree(ctx, comm, rc, where, "creating the temporary directory", NULL, 0, &broken), rc, fail_tmp);

    /* ---- phase 3: every rank writes its boxes ---- */
    rc = write_boxes(ctx, ops, where, tmp, entries, n_entries, offset, stage, rank, meta->step);
    MT_CHECK_GOTO(agree(ctx, comm, rc, where, "writing its tensors", NULL, 0, &broken), rc, fail_tmp);

    /* ---- phase 4: rank 0 writes the manifest last and swaps ---- */
    if (rank == 0) rc = commit(ctx, root, dir, tmp, old, par, used, meta);
    MT_CHECK_GOTO(agree(ctx, comm, rc, where, "writing the manifest", NULL, 0, &broken), rc, fail_tmp);
    goto done;

fail_tmp:
    if (rank == 0) mt_file_rm_rf(tmp);   /* never DIR: it is replaced only by a complete swap */
    if (!broken) {
        /* one more meeting, so that no rank returns (and maybe brings the job
         * down, e.g. MPI_Abort) before rank 0 has removed DIR.tmp */
        enum mt_status keep_st = ctx->last_status;
        char keep[sizeof ctx->errmsg];
        snprintf(keep, sizeof keep, "%s", ctx->errmsg);
        int64_t z = 0;
        if (mt_comm_allreduce(ctx, comm, &z, 1, MT_DTYPE_I64, MT_REDOP_MAX) != MT_OK) { /* the failure is already agreed */ }
        mt_ctx_error(ctx, keep_st, "%s", keep);
    }
done:
    cJSON_Delete(root);
    mt_free(ctx, stage);
    mt_free(ctx, offset);
    return rc;
}

enum mt_status mt_ckpt_save(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                            const struct mt_config *cfg, const struct mt_ckpt_meta *meta,
                            struct mt_param *params, int n_params, struct mt_optim *o)
{
    if (!dir || !*dir || !cfg || !meta || n_params < 0 || (n_params > 0 && !params))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_ckpt_save: missing argument");
    int n_states = o ? mt_optim_state_count(o) : 0;
    enum mt_status rc = MT_OK;
    struct mt_comm *self = NULL;
    struct mt_ckpt_entry *e = mt_alloc(ctx, (size_t)(n_params + n_states + 1) * sizeof *e, MT_BUCKET_OTHER);
    struct mt_optim_state *st = mt_alloc(ctx, (size_t)(n_states + 1) * sizeof *st, MT_BUCKET_OTHER);
    if (!e || !st) { rc = MT_ERR_OOM; goto done; }
    MT_CHECK_GOTO(mt_comm_create_self(ctx, &self), rc, done);
    /* params first, into params.bin; then the optimizer states, into optim.bin */
    for (int i = 0; i < n_params; i++) e[i] = (struct mt_ckpt_entry){params[i].name, 0, &params[i], params[i].data};
    for (int i = 0; i < n_states; i++) {
        mt_optim_state_get(o, i, &st[i]);
        e[n_params + i] = (struct mt_ckpt_entry){st[i].name, 1, st[i].param, st[i].data};
    }
    rc = mt_ckpt_save_group(ctx, ops, self, dir, cfg, meta, e, n_params + n_states);
done:
    mt_comm_destroy(self);
    mt_free(ctx, st);
    mt_free(ctx, e);
    return rc;
}

/* ------------------------------------------------------------------ */
/* load                                                               */
/* ------------------------------------------------------------------ */

/* Every tensor of params.bin is a parameter of the manifest's own config,
 * with its global shape (issue 33 item 7): a manifest whose config says
 * n_layer=1 over 2-layer tensors (a forged or hand-edited manifest with its
 * checksum recomputed) used to resume with rc 0, silently dropping the
 * second layer, and export wrote a 1-layer model. The other direction (a
 * parameter with no tensor) is the load's "no tensor" error; an
 * adapter-only LoRA checkpoint holds a subset, which is fine. */
static enum mt_status tensors_of_config(struct mt_ctx *ctx, const char *dir, const struct manifest *mf,
                                        const struct mt_config *saved);
enum mt_status mt_ckpt_check_tensors(struct mt_ctx *ctx, const char *dir, const struct mt_config *saved)
{
    struct manifest mf;
    MT_CHECK(manifest_read(ctx, dir, &mf));
    enum mt_status rc = tensors_of_config(ctx, dir, &mf, saved);
    manifest_free(ctx, &mf);
    return rc;
}

static enum mt_status tensors_of_config(struct mt_ctx *ctx, const char *dir, const struct manifest *mf,
                                        const struct mt_config *saved)
{
    struct mt_config c = *saved;
    struct mt_ctx scratch;
    mt_ctx_init(&scratch);
    if (mt_config_resolve(&scratch, &c, c.total_steps > 0 ? c.total_steps : 1) != MT_OK)
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s/manifest.json: its config is invalid: %s", dir,
                            mt_ctx_last_error(&scratch));
    int n = mt_model_registry(&c, NULL, 0);
    struct mt_param *reg = mt_alloc(ctx, (size_t)(n > 0 ? n : 1) * sizeof *reg, MT_BUCKET_OTHER);
    if (!reg) return MT_ERR_OOM;
    mt_model_registry(&c, reg, n);
    enum mt_status rc = MT_OK;
    int extra = 0;
    const struct mt_ckpt_tensor *first = NULL;
    for (int i = 0; i < mf->n && rc == MT_OK; i++) {
        const struct mt_ckpt_tensor *t = &mf->t[i];
        if (strcmp(t->file, "params.bin")) continue;
        const struct mt_param *p = NULL;
        for (int k = 0; k < n && !p; k++)
            if (!strcmp(reg[k].name, t->name)) p = &reg[k];
        if (!p) {
            if (!extra++) first = t;
            continue;
        }
        int64_t s1 = p->ndim == 2 ? p->shape[1] : 1;
        if (t->ndim != p->ndim || t->shape[0] != p->shape[0] || (t->ndim == 2 ? t->shape[1] : 1) != s1)
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s/manifest.json: tensor %s has shape [%lld,%lld] but the manifest's "
                              "config makes it [%lld,%lld]", dir, t->name, (long long)t->shape[0],
                              (long long)(t->ndim == 2 ? t->shape[1] : 1), (long long)p->shape[0], (long long)s1);
    }
    if (rc == MT_OK && extra)
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s/manifest.json: %d tensor%s (first: %s) %s not a parameter of the "
                          "manifest's config (n_layer=%d, pattern \"%s\"): the manifest and its tensors disagree",
                          dir, extra, extra > 1 ? "s" : "", first->name, extra > 1 ? "are" : "is", c.n_layer, c.pattern);
    mt_free(ctx, reg);
    return rc;
}

enum mt_status mt_ckpt_read_meta(struct mt_ctx *ctx, const char *dir, struct mt_config *cfg,
                                 struct mt_ckpt_meta *meta)
{
    struct manifest mf;
    MT_CHECK(manifest_read(ctx, dir, &mf));
    enum mt_status rc = MT_OK;
    if (meta) *meta = mf.meta;
    if (cfg) {
        const cJSON *cj = cJSON_GetObjectItemCaseSensitive(mf.root, "config");
        char *s = cJSON_IsObject(cj) ? cJSON_PrintUnformatted(cj) : NULL;
        if (!s) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s/manifest.json: missing \"config\"", dir);
        } else {
            mt_config_defaults(cfg);
            rc = mt_config_apply_json(ctx, cfg, s);
            if (rc != MT_OK)
                rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s/manifest.json: bad config: %s", dir, mt_ctx_last_error(ctx));
            free(s);
        }
    }
    manifest_free(ctx, &mf);
    return rc;
}

enum mt_status mt_ckpt_read_tensors(struct mt_ctx *ctx, const char *dir, const char *file,
                                    struct mt_ckpt_tensor **out, int *n)
{
    *out = NULL;
    *n = 0;
    struct manifest mf;
    MT_CHECK(manifest_read(ctx, dir, &mf));
    enum mt_status rc = MT_OK;
    for (int k = 0; k < mf.n_files && rc == MT_OK; k++)
        if (!file || !strcmp(file, mf.files[k].name)) rc = verify_file(ctx, dir, &mf, mf.files[k].name);
    if (rc == MT_OK && file && !manifest_file(&mf, file))
        rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "checkpoint %s has no %s", dir, file);
    if (rc == MT_OK) {
        int m = 0;
        for (int i = 0; i < mf.n; i++)
            if (!file || !strcmp(mf.t[i].file, file)) mf.t[m++] = mf.t[i];
        *out = mf.t;
        *n = m;
        mf.t = NULL;
    }
    manifest_free(ctx, &mf);
    return rc;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct mt_ckpt_tensor *)a)->name, ((const struct mt_ckpt_tensor *)b)->name);
}

/* Read the box `p` owns of tensor `name` (file `fname`) into backend `data`. */
static enum mt_status load_one(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                               const struct manifest *mf, int fd, const char *fname, const char *name,
                               const struct mt_param *p, float *data, float *stage)
{
    struct mt_ckpt_tensor key;
    snprintf(key.name, sizeof key.name, "%s", name);
    const struct mt_ckpt_tensor *t = bsearch(&key, mf->t, (size_t)mf->n, sizeof *mf->t, cmp_tensor_name);
    if (!t || strcmp(t->file, fname))
        return mt_ctx_error(ctx, MT_ERR_FORMAT, "checkpoint %s has no tensor %s (in %s)", dir, name, fname);
    if (t->ndim != p->ndim || t->shape[0] != p->shape[0] || t->shape[1] != p->shape[1])
        return mt_ctx_error(ctx, MT_ERR_FORMAT,
                            "checkpoint %s: tensor %s has shape [%lld,%lld], the model expects [%lld,%lld]", dir,
                            name, (long long)t->shape[0], (long long)t->shape[1], (long long)p->shape[0],
                            (long long)p->shape[1]);
    float *host = ops ? stage : data;
    if (box_io(fd, t->offset, p->shape, p->off, p->len, host, 0) != 0)
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot read tensor %s from %s/%s: %s", name, dir, fname, strerror(errno));
    if (ops) ops->copy_from_host(ops->be, data, stage, p->numel * sizeof(float));
    return MT_OK;
}

/* DIR/FNAME for reading, a regular file only (a FIFO would block, issue 33). */
static enum mt_status open_in(struct mt_ctx *ctx, const char *dir, const char *fname, int *fd)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    return mt_file_open_regular(ctx, path, NULL, fd, NULL);
}

enum mt_status mt_ckpt_manifest_hash(struct mt_ctx *ctx, const char *dir, char hash[MT_CKPT_RUN_ID_LEN])
{
    struct manifest mf;
    MT_CHECK(manifest_read(ctx, dir, &mf));
    snprintf(hash, MT_CKPT_RUN_ID_LEN, "%s", mf.hash);
    manifest_free(ctx, &mf);
    return MT_OK;
}

/*
 * The base of an adapter-only checkpoint is identified by its manifest hash
 * alone: manifest_xxh64 covers the config, the meta, every tensor's name,
 * shape and offset and every file's xxh64, so an equal hash means the same
 * bytes (up to xxh64 collisions) wherever the base now lives; the recorded
 * path is only where to look first. A base that is itself adapter-only is
 * refused: the chain would need its own base (saving follows the chain, so
 * a trainer never writes one).
 */
enum mt_status mt_ckpt_base_check(struct mt_ctx *ctx, const char *dir, const struct mt_ckpt_meta *m,
                                  const char *base_dir)
{
    if (!m->base_hash[0])
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint %s is a full checkpoint: it has no base", dir);
    const char *b = base_dir ? base_dir : m->base_path;
    char mpath[PATH_MAX + 32];
    struct stat sb;
    snprintf(mpath, sizeof mpath, "%s/manifest.json", b);
    if (stat(mpath, &sb) != 0)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "adapter-only checkpoint %s: its base checkpoint %s is missing "
                            "(no manifest.json there; a train --resume names a base that moved with --init-from)",
                            dir, b);
    struct manifest mf;
    enum mt_status rc = manifest_read(ctx, b, &mf);
    if (rc != MT_OK)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "adapter-only checkpoint %s: its base %s: %s", dir, b,
                            mt_ctx_last_error(ctx));
    if (mf.meta.base_hash[0])
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "adapter-only checkpoint %s: its base %s is itself adapter-only "
                          "(pass the full checkpoint its adapters were trained on)", dir, b);
    else if (strcmp(mf.hash, m->base_hash))
        rc = mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "adapter-only checkpoint %s was trained on the base with manifest "
                          "hash %s; %s has manifest hash %s: not the same base", dir, m->base_hash, b, mf.hash);
    manifest_free(ctx, &mf);
    return rc;
}

enum mt_status mt_ckpt_load(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir,
                            struct mt_param *params, int n_params, struct mt_optim *o)
{
    return mt_ckpt_load_base(ctx, ops, dir, NULL, params, n_params, o);
}

/* Adapter-only checkpoint: the parameters it does not hold (the frozen
 * base) go to *rest (mt_alloc'ed, *n_rest of them) after its base is
 * checked; the others stay in params (compacted, *n_own). */
static enum mt_status split_base(struct mt_ctx *ctx, const char *dir, const struct manifest *mf, const char *base_dir,
                                 struct mt_param *params, int n_params, int *n_own, struct mt_param **rest, int *n_rest)
{
    *rest = NULL;
    *n_rest = 0;
    *n_own = n_params;
    if (!mf->meta.base_hash[0]) {
        if (base_dir)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "checkpoint %s is a full checkpoint: it takes no base (%s)",
                                dir, base_dir);
        return MT_OK;
    }
    MT_CHECK(mt_ckpt_base_check(ctx, dir, &mf->meta, base_dir));
    *rest = mt_alloc(ctx, (size_t)(n_params > 0 ? n_params : 1) * sizeof **rest, MT_BUCKET_OTHER);
    if (!*rest) return MT_ERR_OOM;
    int k = 0;
    for (int i = 0; i < n_params; i++) {
        struct mt_ckpt_tensor key;
        snprintf(key.name, sizeof key.name, "%s", params[i].name);
        if (bsearch(&key, mf->t, (size_t)mf->n, sizeof *mf->t, cmp_tensor_name)) params[k++] = params[i];
        else (*rest)[(*n_rest)++] = params[i];
    }
    *n_own = k;
    return MT_OK;
}

enum mt_status mt_ckpt_load_base(struct mt_ctx *ctx, const struct mt_ops_i *ops, const char *dir, const char *base_dir,
                                 struct mt_param *params_in, int n_params, struct mt_optim *o)
{
    if (!dir || n_params < 0 || (n_params > 0 && !params_in))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_ckpt_load: missing argument");
    struct manifest mf;
    MT_CHECK(manifest_read(ctx, dir, &mf));
    enum mt_status rc = MT_OK;
    float *stage = NULL;
    int fd = -1, n_rest = 0;
    struct mt_param *rest = NULL, *params = NULL;
    qsort(mf.t, (size_t)mf.n, sizeof *mf.t, cmp_tensor_name);
    for (int i = 1; i < mf.n; i++)
        if (!strcmp(mf.t[i - 1].name, mf.t[i].name)) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "checkpoint %s lists tensor %s twice", dir, mf.t[i].name);
            goto done;
        }
    /* the caller's list is not reordered: work on a copy (boxes point at the same data) */
    params = mt_alloc(ctx, (size_t)(n_params > 0 ? n_params : 1) * sizeof *params, MT_BUCKET_OTHER);
    if (!params) { rc = MT_ERR_OOM; goto done; }
    if (n_params > 0) memcpy(params, params_in, (size_t)n_params * sizeof *params);
    MT_CHECK_GOTO(split_base(ctx, dir, &mf, base_dir, params, n_params, &n_params, &rest, &n_rest), rc, done);
    /* the frozen base first, from its own (full) checkpoint: no optimizer state there */
    if (n_rest > 0)
        MT_CHECK_GOTO(mt_ckpt_load_base(ctx, ops, base_dir ? base_dir : mf.meta.base_path, NULL, rest, n_rest, NULL),
                      rc, done);

    size_t max_numel = 0;
    for (int i = 0; i < n_params; i++) {
        MT_CHECK_GOTO(check_box(ctx, params[i].name, &params[i]), rc, done);
        if (params[i].numel > max_numel) max_numel = params[i].numel;
    }
    if (ops) {
        stage = mt_alloc(ctx, max_numel * sizeof(float), MT_BUCKET_WORKSPACE);
        if (!stage) { rc = MT_ERR_OOM; goto done; }
    }

    MT_CHECK_GOTO(verify_file(ctx, dir, &mf, "params.bin"), rc, done);
    MT_CHECK_GOTO(open_in(ctx, dir, "params.bin", &fd), rc, done);
    for (int i = 0; i < n_params; i++)
        MT_CHECK_GOTO(load_one(ctx, ops, dir, &mf, fd, "params.bin", params[i].name, &params[i], params[i].data, stage),
                      rc, done);
    close(fd);
    fd = -1;

    if (o) {
        int n_opt = 0;
        for (int i = 0; i < mf.n; i++) n_opt += !strcmp(mf.t[i].file, "optim.bin");
        int ns = mt_optim_state_count(o);
        if (n_opt == 0 && mf.meta.step > 0) {
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT,
                              "checkpoint %s (step %d) has no optimizer state (optim.bin): resuming would silently "
                              "restart the optimizer (only a step-0 checkpoint, e.g. an import, starts a fresh one)",
                              dir, mf.meta.step);
            goto done;
        } else if (n_opt == 0) {
            /* an imported model (step 0): fresh optimizer state */
            for (int i = 0; i < ns; i++) {
                struct mt_optim_state s;
                mt_optim_state_get(o, i, &s);
                if (ops) ops->fill(ops->be, s.data, 0.0f, s.param->numel);
                else memset(s.data, 0, s.param->numel * sizeof(float));
            }
            mt_optim_set_t(o, 0);
        } else {
            MT_CHECK_GOTO(verify_file(ctx, dir, &mf, "optim.bin"), rc, done);
            MT_CHECK_GOTO(open_in(ctx, dir, "optim.bin", &fd), rc, done);
            for (int i = 0; i < ns; i++) {
                struct mt_optim_state s;
                mt_optim_state_get(o, i, &s);
                MT_CHECK_GOTO(load_one(ctx, ops, dir, &mf, fd, "optim.bin", s.name, s.param, s.data, stage), rc, done);
            }
            mt_optim_set_t(o, mf.meta.optim_t);
        }
    }
done:
    if (fd >= 0) close(fd);
    mt_free(ctx, stage);
    mt_free(ctx, rest);
    mt_free(ctx, params);
    manifest_free(ctx, &mf);
    return rc;
}

/* ------------------------------------------------------------------ */
/* find                                                               */
/* ------------------------------------------------------------------ */

/* "step_NNNNNN" exactly (digits only: no .tmp / .old suffix); -1 otherwise. */
static long step_of(const char *name)
{
    if (strncmp(name, "step_", 5) || !name[5]) return -1;
    long v = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9' || v > 100000000L) return -1;
        v = v * 10 + (*c - '0');
    }
    return v;
}

/* Intact: the manifest validates and every file it lists matches its size
 * and checksum. On success *meta is the manifest's meta. */
static enum mt_status ckpt_check(struct mt_ctx *ctx, const char *dir, struct mt_ckpt_meta *meta)
{
    struct manifest mf;
    MT_CHECK(manifest_read(ctx, dir, &mf));
    enum mt_status rc = MT_OK;
    for (int k = 0; k < mf.n_files && rc == MT_OK; k++) rc = verify_file(ctx, dir, &mf, mf.files[k].name);
    if (rc == MT_OK && meta) *meta = mf.meta;
    manifest_free(ctx, &mf);
    return rc;
}

static int cmp_long_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x < y) - (x > y);
}

/* The step numbers of OUT/ckpt/step_N dirs, newest first (*out mt_alloc'ed). */
static enum mt_status list_steps(struct mt_ctx *ctx, const char *ck, long **out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(ck);
    if (!d) return MT_OK;
    int cap = 16;
    long *v = mt_alloc(ctx, (size_t)cap * sizeof *v, MT_BUCKET_OTHER);
    struct dirent *e;
    while (v && (e = readdir(d))) {
        long s = step_of(e->d_name);
        if (s < 0) continue;
        if (*n == cap) {
            long *w = mt_alloc(ctx, (size_t)cap * 2 * sizeof *w, MT_BUCKET_OTHER);
            if (w) memcpy(w, v, (size_t)cap * sizeof *w);
            mt_free(ctx, v);
            v = w;
            cap *= 2;
            if (!v) break;
        }
        v[(*n)++] = s;
    }
    closedir(d);
    if (!v) { *n = 0; return MT_ERR_OOM; }
    qsort(v, (size_t)*n, sizeof *v, cmp_long_desc);
    *out = v;
    return MT_OK;
}

static void notef(char *note, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void notef(char *note, size_t n, const char *fmt, ...)
{
    if (!note || !n) return;
    size_t l = strlen(note);
    if (l + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + l, n - l, fmt, ap);
    va_end(ap);
}

/*
 * HOW IT WORKS — which checkpoint a resume means (mt_ckpt_resolve).
 *
 * A training output OUT holds OUT/ckpt/step_N dirs, possibly of several runs
 * (a new run into an old OUT), and OUT/ckpt/latest = "step_N\nRUN\n", which
 * the commit of every checkpoint of a run rewrites atomically (rename) after
 * the checkpoint itself is in place. So latest always names a committed
 * checkpoint and the run that wrote it, and "the highest step" is never
 * used while latest exists. If that checkpoint is damaged (bit rot, an
 * edited manifest, a half-copied directory), the run's previous checkpoints
 * are the only safe fallback: the newest one with the same run id, a lower
 * step, and an intact manifest and files. Without latest (older builds,
 * imports) the newest intact step_N is taken, unless the intact candidates
 * carry different run ids (then nothing says which run was meant).
 */
enum mt_status mt_ckpt_resolve(struct mt_ctx *ctx, const char *dir_or_out, char *path, size_t path_len, char *note,
                               size_t note_len)
{
    char p[PATH_MAX + 80], ck[PATH_MAX], cand[PATH_MAX + 80];
    struct stat sb;
    if (note && note_len) note[0] = 0;
    if (!dir_or_out || !path) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_ckpt_resolve: missing argument");
    if (snprintf(p, sizeof p, "%s/manifest.json", dir_or_out) >= (int)sizeof p - 64)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "path too long: %s", dir_or_out);
    if (lstat(p, &sb) == 0) {
        /* a checkpoint dir itself: the same validation as a checkpoint found
         * through OUT (manifest, every listed file's size and checksum,
         * tokenizer.bin included), so naming the folder skips no check
         * (issue 33 item 5); no fallback: the user named this one */
        if (snprintf(path, path_len, "%s", dir_or_out) >= (int)path_len)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "path too long: %s", dir_or_out);
        return ckpt_check(ctx, dir_or_out, NULL);
    }
    snprintf(ck, sizeof ck, "%s/ckpt", dir_or_out);
    if (stat(ck, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return mt_ctx_error(ctx, MT_ERR_IO, "no checkpoint at %s (no manifest.json, no ckpt/ dir)", dir_or_out);

    /* latest: "NAME\nRUN\n" */
    char run[MT_CKPT_RUN_ID_LEN] = "", why[512] = "";
    long latest_step = -1;
    int have_latest = 0;
    snprintf(p, sizeof p, "%s/latest", ck);
    char *text = NULL;
    enum mt_status rc = mt_file_read_text(ctx, p, CKPT_MANIFEST_MAX, &text);
    if (rc == MT_OK) {
        char name[64] = "", rid[64] = "";
        int ok = sscanf(text, "%63s %63s", name, rid) == 2 && step_of(name) >= 0 && is_hex16(rid);
        mt_free(ctx, text);
        if (!ok) return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s is malformed (want \"step_N\\nRUN_ID\\n\")", p);
        have_latest = 1;
        latest_step = step_of(name);
        snprintf(run, sizeof run, "%s", rid);
        snprintf(cand, sizeof cand, "%s/%s", ck, name);
        struct mt_ckpt_meta m;
        rc = ckpt_check(ctx, cand, &m);
        if (rc == MT_OK && strcmp(m.run_id, run))
            rc = mt_ctx_error(ctx, MT_ERR_FORMAT, "%s belongs to run %s, latest says run %s", cand,
                              m.run_id[0] ? m.run_id : "(none)", run);
        if (rc == MT_OK) {
            if (snprintf(path, path_len, "%s", cand) >= (int)path_len)
                return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "path too long: %s", cand);
            return MT_OK;
        }
        if (rc == MT_ERR_OOM) return rc;
        snprintf(why, sizeof why, "%s", mt_ctx_last_error(ctx));
        notef(note, note_len, "latest checkpoint %s is damaged (%s)", cand, why);
    } else if (rc != MT_ERR_IO) {
        return rc;   /* latest is a directory, too big, ... */
    }
    mt_ctx_clear_error(ctx);

    long *steps = NULL;
    int ns = 0;
    MT_CHECK(list_steps(ctx, ck, &steps, &ns));
    char first_run[MT_CKPT_RUN_ID_LEN] = "";
    int found = -1, n_skipped = 0, several = 0;
    for (int i = 0; i < ns; i++) {
        if (have_latest && steps[i] >= latest_step) continue;
        snprintf(cand, sizeof cand, "%s/step_%06ld", ck, steps[i]);
        if (step_of(strrchr(cand, '/') + 1) != steps[i]) continue;   /* step_7 vs step_000007: only the canonical name */
        struct mt_ckpt_meta m;
        rc = ckpt_check(ctx, cand, &m);
        if (rc == MT_ERR_OOM) { mt_free(ctx, steps); return rc; }
        if (rc != MT_OK) {
            if (!have_latest && found < 0 && n_skipped++ == 0) {
                snprintf(why, sizeof why, "%s", mt_ctx_last_error(ctx));
                notef(note, note_len, "newest checkpoint %s is damaged (%s)", cand, why);
            }
            continue;
        }
        if (have_latest) {
            if (strcmp(m.run_id, run)) continue;   /* another run's: never */
            found = i;
            break;
        }
        if (found < 0) { found = i; snprintf(first_run, sizeof first_run, "%s", m.run_id); }
        else if (strcmp(first_run, m.run_id)) several = 1;
    }
    long fstep = found >= 0 ? steps[found] : -1;
    mt_free(ctx, steps);
    mt_ctx_clear_error(ctx);
    if (several)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                            "%s holds checkpoints of several runs and no latest pointer: pass the checkpoint directory "
                            "(e.g. %s/step_%06ld)", ck, ck, fstep);
    if (found < 0) {
        if (have_latest)
            return mt_ctx_error(ctx, MT_ERR_FORMAT, "the latest checkpoint of run %s is damaged (%s) and the run has no "
                                "intact earlier checkpoint under %s", run, why, ck);
        if (n_skipped)
            return mt_ctx_error(ctx, MT_ERR_FORMAT, "no intact checkpoint under %s (newest: %s)", ck, why);
        return mt_ctx_error(ctx, MT_ERR_IO, "no complete checkpoint under %s", ck);
    }
    snprintf(cand, sizeof cand, "%s/step_%06ld", ck, fstep);
    if (snprintf(path, path_len, "%s", cand) >= (int)path_len)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "path too long: %s", cand);
    if (note && *note)
        notef(note, note_len, "; falling back to %s, the %s intact checkpoint (step %ld)", cand,
              have_latest ? "same run's previous" : "newest", fstep);
    return MT_OK;
}

enum mt_status mt_ckpt_find(struct mt_ctx *ctx, const char *dir_or_out, char *path, size_t path_len)
{
    char note[2048];
    MT_CHECK(mt_ckpt_resolve(ctx, dir_or_out, path, path_len, note, sizeof note));
    /* a caller that cannot tell the user must not substitute a checkpoint */
    if (note[0]) return mt_ctx_error(ctx, MT_ERR_FORMAT, "%s; pass that checkpoint directory to use it", note);
    return MT_OK;
}

void mt_ckpt_run_id_new(char out[MT_CKPT_RUN_ID_LEN])
{
    struct { uint64_t rnd; struct timespec ts; pid_t pid; } seed;
    memset(&seed, 0, sizeof seed);
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &seed.rnd, sizeof seed.rnd) != (ssize_t)sizeof seed.rnd) seed.rnd = 0;
        close(fd);
    }
    clock_gettime(CLOCK_REALTIME, &seed.ts);
    seed.pid = getpid();
    snprintf(out, MT_CKPT_RUN_ID_LEN, "%016" PRIx64, XXH64(&seed, sizeof seed, 0x6d657368ull));
}

enum mt_status mt_ckpt_remove(struct mt_ctx *ctx, const char *dir, const char *run_id)
{
    if (!dir || !run_id || !*run_id) return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "mt_ckpt_remove: missing argument");
    struct mt_ckpt_meta m;
    MT_CHECK(mt_ckpt_read_meta(ctx, dir, NULL, &m));
    if (strcmp(m.run_id, run_id))
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "not removing %s: it belongs to run %s, not %s", dir,
                            m.run_id[0] ? m.run_id : "(none)", run_id);
    if (mt_file_rm_rf(dir) != 0) return mt_ctx_error(ctx, MT_ERR_RUNTIME, "cannot remove %s: %s", dir, strerror(errno));
    char par[PATH_MAX];
    parent_of(dir, par, sizeof par);
    fsync_path(par);
    return MT_OK;
}

enum mt_status mt_ckpt_lock(struct mt_ctx *ctx, const char *out_dir, int *fd)
{
    *fd = -1;
    char path[PATH_MAX];
    if (!out_dir || !*out_dir || join_path(path, sizeof path, out_dir, ".lock") != 0)
        return mt_ctx_error(ctx, MT_ERR_INVALID_ARG, "bad output directory");
    if (mt_file_mkdir_p(out_dir) != 0) {
        int err = errno;
        return mt_ctx_error(ctx, err == ENOSPC || err == EDQUOT || err == EIO ? MT_ERR_RUNTIME : MT_ERR_IO,
                            "cannot create output directory %s: %s", out_dir, strerror(err));
    }
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0) {
        int err = errno;
        return mt_ctx_error(ctx, err == ENOSPC || err == EDQUOT || err == EIO ? MT_ERR_RUNTIME : MT_ERR_IO,
                            "cannot create %s: %s", path, strerror(err));
    }
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char who[32] = "";
        ssize_t r = pread(f, who, sizeof who - 1, 0);
        who[r > 0 ? r : 0] = 0;
        who[strcspn(who, "\n")] = 0;
        close(f);
        if (err == EWOULDBLOCK)
            return mt_ctx_error(ctx, MT_ERR_INVALID_ARG,
                                "output directory %s is in use by another trainer (pid %s holds %s)", out_dir,
                                *who ? who : "?", path);
        return mt_ctx_error(ctx, MT_ERR_IO, "cannot lock %s: %s", path, strerror(err));
    }
    char pid[32];
    snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(f, 0) != 0 || mt_file_pwrite_all(f, pid, strlen(pid), 0) != 0) { /* informational only */ }
    *fd = f;
    return MT_OK;
}

void mt_ckpt_unlock(int fd)
{
    if (fd >= 0) close(fd);   /* closing the last descriptor releases the flock */
}
