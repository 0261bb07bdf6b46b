/*
 * meshtrain — one binary, subcommands (SPEC.md section 5).
 */
#include <stdio.h>
#include <string.h>
#include "cmd.h"
#include "core/mt_build.h"
#include "core/mt_core.h"
#include "ops/mt_ops.h"
#include "tok/mt_tok.h"

struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct subcommand subcommands[] = {
    {"train",     mt_cmd_train,     "train a model (single rank or under mpirun)"},
    {"export",    mt_cmd_export,    "checkpoint -> Hugging Face safetensors + config.json"},
    {"import",    mt_cmd_import,    "Hugging Face safetensors + config.json -> checkpoint"},
    {"plan",      mt_cmd_plan,      "check a mesh and print the memory plan"},
    {"sample",    mt_cmd_sample,    "generate text from a checkpoint"},
    {"logits",    mt_cmd_logits,    "one forward over token ids: logits and loss terms as safetensors"},
    {"tokenizer", mt_cmd_tokenizer, "train / encode / decode the byte-level BPE tokenizer"},
    {"prepare",   mt_cmd_prepare,   "text files -> llm.c token shards"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: meshtrain <command> [options]   (meshtrain <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "  %-10s %s\n", subcommands[i].name, subcommands[i].help);
    fprintf(f, "\n  --version  the build (git commit, build type, compiler, MPI/CUDA/NCCL)\n");
    fprintf(f, "\nexit codes: 0 ok, 2 bad input or config, 1 runtime failure\n");
}

int main(int argc, char **argv)
{
    mt_ops_cpu_pin_coretype(argc, argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        struct mt_build_info b;
        mt_build_info(&b);
        printf("meshtrain %s (%s, %s; MPI %s, CUDA %s, NCCL %s)\n", b.git, b.build_type, b.compiler,
               b.mpi ? "yes" : "no", b.cuda ? "yes" : "no", b.nccl ? "yes" : "no");
        return 0;
    }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (!strcmp(argv[1], subcommands[i].name))
            return subcommands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "meshtrain: unknown command '%s' (see meshtrain --help)\n", argv[1]);
    return 2;
}

long long mt_cmd_size_arg(const char *tool, const char *s)
{
    double v;
    char why[200];
    if (mt_size_parse(s, &v, why, sizeof why) || v > 9e18) {
        fprintf(stderr, "meshtrain %s: %s\n", tool, why[0] ? why : "size too large");
        return -1;
    }
    return (long long)v;
}

int mt_cmd_corpus_inputs(const char **inputs, int *n_inputs, long long *max_bytes)
{
    int dflt = *n_inputs == 0;
    if (dflt) {
        inputs[(*n_inputs)++] = MT_TOK_DEFAULT_CORPUS;
        if (*max_bytes < 0) *max_bytes = (long long)MT_TOK_DEFAULT_MAX_BYTES;
    }
    if (*max_bytes < 0) *max_bytes = 0;
    return dflt;
}

static int in_list(const char *const *list, const char *a)
{
    for (; list && *list; list++)
        if (!strcmp(*list, a)) return 1;
    return 0;
}

int mt_cmd_option(const char *tool, const char *const *flags, const char *const *valued, int argc, char **argv, int i)
{
    const char *a = argv[i];
    if (in_list(flags, a)) return 0;
    if (!in_list(valued, a)) {
        fprintf(stderr, "meshtrain %s: unknown option '%s' (see --help)\n", tool, a);
        return -1;
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "meshtrain %s: %s needs a value (see --help)\n", tool, a);
        return -1;
    }
    return 1;
}
