/*
 * peak_cache.c — the MFU peak of a CPU machine, measured once and kept.
 *
 * Why: the peak behind MFU was measured at every start (about 5 s of sgemm),
 * under whatever load the machine had then, so the same run showed 45% one
 * time and 140% the next, and every start paid the 5 s. The first run on a
 * machine measures as before and writes the result here; later runs read it
 * and say where it came from (receipt timing.peak_flops_source, the
 * progress line). The knob peak_cache: "use" (default) reads or measures and
 * writes, "refresh" measures again and overwrites, "off" measures and keeps
 * nothing. --peak-flops F overrides all of it.
 *
 * Where: $XDG_CACHE_HOME/meshtrain/peak_flops.json, else
 * $HOME/.cache/meshtrain/peak_flops.json. One JSON object of entries keyed
 * by what the number depends on (CPU model, ops table, threads, OpenBLAS
 * core type, kernel ISA): another machine or another thread count is another
 * entry, so a copied home directory cannot lend a wrong peak.
 *
 *     {"format": "meshtrain-peak-cache-1",
 *      "entries": {"<key>": {"flops": 1.2e11, "lo": ..., "hi": ..., "size": 768,
 *                            "runs": 5, "measured_at": "2026-11-26T12:00:00Z"}}}
 *
 * Nothing here fails a run: an unreadable, malformed or unwritable cache is
 * a measurement at startup, and the source string says why it was not kept.
 */
#include "train_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/mt_build.h"
#include "../core/mt_fileio.h"

#define PEAK_CACHE_FORMAT "meshtrain-peak-cache-1"
#define PEAK_CACHE_MAX_BYTES (1 << 20)

int mt_train_peak_cache_path(char *path, size_t n)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (xdg && xdg[0] == '/') w = snprintf(path, n, "%s/meshtrain/peak_flops.json", xdg);
    else if (home && home[0] == '/') w = snprintf(path, n, "%s/.cache/meshtrain/peak_flops.json", home);
    else return 0;
    return w > 0 && (size_t)w < n;
}

void mt_train_peak_cache_key(const char *ops_name, int threads, char *key, size_t n)
{
    struct mt_machine_info mi;
    struct mt_ops_cpu_info ci;
    mt_machine_info(&mi);
    mt_ops_cpu_info(&ci);
    snprintf(key, n, "%s | %s ops | %d threads | coretype %s | %s kernels | %s", mi.cpu_model[0] ? mi.cpu_model : "?",
             ops_name, threads, ci.coretype, mt_ops_cpu_isa(), ci.blas);
}

/* The cache's root object (a new one when the file is absent or unusable). */
static cJSON *cache_read(const char *path)
{
    struct mt_ctx quiet;
    mt_ctx_init(&quiet);
    char *text = NULL;
    cJSON *root = NULL;
    if (mt_file_is_regular(path) && mt_file_read_text(&quiet, path, PEAK_CACHE_MAX_BYTES, &text) == MT_OK)
        root = cJSON_Parse(text);
    mt_free(&quiet, text);
    const cJSON *fmt = root ? cJSON_GetObjectItemCaseSensitive(root, "format") : NULL;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, PEAK_CACHE_FORMAT) ||
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "entries"))) {
        cJSON_Delete(root);
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "format", PEAK_CACHE_FORMAT);
        cJSON_AddObjectToObject(root, "entries");
    }
    return root;
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1.0;
}

int mt_train_peak_cache_get(const char *path, const char *key, struct mt_ops_roof *roof, char *when, size_t n)
{
    cJSON *root = cache_read(path);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "entries"), key);
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(e, "measured_at");
    struct mt_ops_roof r = {num(e, "flops"), num(e, "lo"), num(e, "hi"), (int)num(e, "size"), (int)num(e, "runs")};
    /* a usable entry: a finite positive peak inside its own spread */
    const int ok = cJSON_IsObject(e) && cJSON_IsString(at) && r.flops > 0 && r.flops < 1e18 && r.lo > 0 &&
                   r.lo <= r.flops && r.flops <= r.hi && r.size > 0 && r.runs > 0;
    if (ok) {
        *roof = r;
        snprintf(when, n, "%s", at->valuestring);
    }
    cJSON_Delete(root);
    return ok;
}

enum mt_status mt_train_peak_cache_put(struct mt_ctx *ctx, const char *path, const char *key,
                                       const struct mt_ops_roof *roof)
{
    char dir[4096], stamp[32];
    mt_file_dir_of(path, dir, sizeof dir);
    if (mt_file_mkdir_p(dir) != 0) return mt_ctx_error(ctx, MT_ERR_IO, "cannot create %s", dir);
    const time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    cJSON *root = cache_read(path), *entries = cJSON_GetObjectItemCaseSensitive(root, "entries");
    cJSON_DeleteItemFromObjectCaseSensitive(entries, key);
    cJSON *e = cJSON_AddObjectToObject(entries, key);
    cJSON_AddNumberToObject(e, "flops", roof->flops);
    cJSON_AddNumberToObject(e, "lo", roof->lo);
    cJSON_AddNumberToObject(e, "hi", roof->hi);
    cJSON_AddNumberToObject(e, "size", roof->size);
    cJSON_AddNumberToObject(e, "runs", roof->runs);
    cJSON_AddStringToObject(e, "measured_at", stamp);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return mt_ctx_error(ctx, MT_ERR_OOM, "peak cache: out of memory");
    /* temp file + rename: two runs starting at once leave one whole file */
    enum mt_status st = mt_file_write_atomic(ctx, path, text, strlen(text), 0, MT_ERR_IO);
    free(text);
    return st;
}
