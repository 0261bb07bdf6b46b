/*
 * mt_knobs.h — the declared table of runtime tunables ("knobs").
 *
 * Every value that changes how the runtime behaves without being part of
 * the model config lives in ONE table: its name, type, default, the
 * environment variable kept as an alias, the file that reads it, and
 * whether it is a test-only hook. A value comes from (highest first) the
 * command line (`meshtrain train --knob NAME=VALUE`), the config file's
 * "knobs" object (`{"knobs": {"zero_overlap": 0}}`, read by config.c),
 * its environment alias, the default: a lower source never overrides a
 * higher one, whatever the order they are applied in. Library code reads a knob through the context it is given
 * (mt_knob_str / mt_knob_int), never getenv; a context without a knob set
 * (ctx->knobs NULL: tests, tools that do not train) falls back to the alias
 * and the default, as before the table existed. Every receipt echoes every
 * knob with its value and where it came from.
 *
 * Example:
 *     struct mt_knobs k;
 *     mt_knobs_init(&k);                                   // defaults + env aliases
 *     MT_CHECK(mt_knobs_set(ctx, &k, "zero_overlap=0"));   // --knob zero_overlap=0
 *     ctx->knobs = &k;
 *     if (mt_knob_int(ctx, MT_KNOB_ZERO_OVERLAP)) ...
 */
#ifndef MT_KNOBS_H
#define MT_KNOBS_H

#include <stddef.h>

#include "mt_core.h"

enum mt_knob_id {
    MT_KNOB_ZERO_OVERLAP = 0,     /* src/parallel/zero.c                        */
    MT_KNOB_CUDA_PRECISION,       /* src/ops/cuda/ops_cuda.cu (via setup.c)  */
    MT_KNOB_NCCL_TIMEOUT,         /* src/parallel/comm_nccl.c                    */
    MT_KNOB_MOE_GROUPED,          /* src/model/model.c (moe_experts.c)       */
    MT_KNOB_CUDA_GRAPHS,          /* src/train/step.c (src/ops/cuda/graph.cu) */
    MT_KNOB_TEST_FAULT,           /* src/train/test_hooks.c (test only)      */
    MT_KNOB_TEST_LOSS_PART,       /* src/model/head.c (test only)            */
    MT_KNOB_TEST_FORCE_ROUTING,   /* src/model/model.c (test only)           */
    MT_KNOB_PEAK_CACHE,           /* src/train/trainer.c (peak_cache.c)      */
    MT_KNOB_ATTN_KERNEL,          /* src/ops/cuda/ops_cuda.cu (via ops.c)    */
    MT_KNOB_SCAN_BF16,            /* src/model/mamba.c                       */
    MT_KNOB_MOE_SIZES,            /* src/model/moe.c                         */
    MT_KNOB_HEAD_BF16_LOGITS,     /* src/model/head.c                        */
    MT_KNOB_ATTN_DS_MB,           /* src/ops/cuda/attention_tc.cu (via ops.c) */
    MT_KNOB_ATTN_GROUP_KIB,       /* src/ops/cuda/attn_sched.cuh (via ops.c) */
    MT_KNOB_GROUPED_GEMM_BN,      /* src/ops/cuda/gemm_grouped.cu (via ops.c) */
    MT_KNOB_GROUPED_GEMM_KERNEL,  /* src/ops/cuda/gemm_grouped_wg.cu (via ops.c) */
    MT_KNOB_BF16_SCRATCH_MB,      /* src/ops/cuda/gemm.cu (via ops.c)        */
    MT_KNOB_MUON_NS_BF16,         /* src/optim/muon.c                        */
    MT_KNOB_PARAM_INIT_DEVICE,    /* src/model/model.c (zero.c)              */
    MT_KNOB_COUNT
};

enum mt_knob_type {
    MT_KNOB_BOOL,      /* 0 or 1                     */
    MT_KNOB_STRING,    /* free text, or one of choices */
    MT_KNOB_SECONDS,   /* a positive finite number     */
    MT_KNOB_INT,       /* a whole number in [min, max] */
};

struct mt_knob_def {
    const char       *name;      /* "zero_overlap": the --knob name        */
    enum mt_knob_type type;
    const char       *def;       /* default, as text                       */
    const char       *env;       /* environment alias ("MT_ZERO_OVERLAP")  */
    const char       *where;     /* the file that reads it                 */
    const char       *choices;   /* STRING: "a|b" allowed values, or NULL: free text */
    int               test_only; /* 1: a test hook, never for a real run   */
    const char       *help;      /* one line                               */
    long long         min, max;  /* INT: the accepted range                */
};

/* In precedence order: a higher source wins. */
enum mt_knob_source { MT_KNOB_DEFAULT = 0, MT_KNOB_ENV, MT_KNOB_CONFIG, MT_KNOB_CLI };

#define MT_KNOB_VALUE_LEN 64
struct mt_knobs {
    char                value[MT_KNOB_COUNT][MT_KNOB_VALUE_LEN];
    enum mt_knob_source source[MT_KNOB_COUNT];
};

const struct mt_knob_def *mt_knob_def(enum mt_knob_id id);
const char *mt_knob_source_name(enum mt_knob_source s);   /* "default", "env", "config", "command line" */

/* Every knob at its environment alias or default (unchecked: see
 * mt_knobs_check_env). */
void mt_knobs_init(struct mt_knobs *k);
/* Every environment alias that is set holds a value its knob accepts, else
 * MT_ERR_INVALID_ARG naming the variable, its knob and what it accepts
 * (a bad alias is refused even where a higher source overrides it: it is a
 * mistake in the environment either way). */
enum mt_status mt_knobs_check_env(struct mt_ctx *ctx);
/* 1 if `value` is one knob `id` accepts (bool 0|1, a choice, seconds > 0, an
 * INT in range, shorter than MT_KNOB_VALUE_LEN); else 0 and what it accepts
 * in why ("expected 128|256"). The one check behind --knob, the config's
 * knobs, the aliases and the cuda backend's own reading of them. */
int mt_knob_value_ok(enum mt_knob_id id, const char *value, char *why, size_t why_len);
/* "NAME=VALUE" from the command line: MT_ERR_INVALID_ARG naming the knob and
 * what it accepts for an unknown name or a bad value (bool: 0 or 1). */
enum mt_status mt_knobs_set(struct mt_ctx *ctx, struct mt_knobs *k, const char *name_eq_value);
/* The knob `name` = value from `source` (CONFIG or CLI): checked as above;
 * stored only when no higher source set it already. */
enum mt_status mt_knobs_set_from(struct mt_ctx *ctx, struct mt_knobs *k, const char *name, size_t name_len,
                                 const char *value, enum mt_knob_source source);

/* The value in force for ctx (ctx->knobs, else the alias, else the default). */
const char *mt_knob_str(const struct mt_ctx *ctx, enum mt_knob_id id);
/* As an integer (atoi of the value; an empty value gives the default's). */
long mt_knob_int(const struct mt_ctx *ctx, enum mt_knob_id id);
enum mt_knob_source mt_knob_source(const struct mt_ctx *ctx, enum mt_knob_id id);

/* The table as help text, one knob a line, into buf (for --help). */
void mt_knobs_help(char *buf, size_t n);

#endif
