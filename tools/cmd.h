/*
 * cmd.h — subcommands of the meshtrain binary. Each returns the process exit
 * code: 0 ok, 2 bad input or config (after printing one line to stderr), 1
 * runtime failure. Only tools/ decide how the process exits.
 */
#ifndef MT_TOOLS_CMD_H
#define MT_TOOLS_CMD_H

int mt_cmd_train(int argc, char **argv);      /* cmd_train.c     */
int mt_cmd_export(int argc, char **argv);     /* cmd_export.c    */
int mt_cmd_import(int argc, char **argv);     /* cmd_export.c    */
int mt_cmd_plan(int argc, char **argv);       /* cmd_plan.c      */
int mt_cmd_sample(int argc, char **argv);     /* cmd_sample.c    */
int mt_cmd_tokenizer(int argc, char **argv);  /* cmd_tokenizer.c */
int mt_cmd_prepare(int argc, char **argv);    /* cmd_prepare.c   */
int mt_cmd_logits(int argc, char **argv);     /* cmd_logits.c    */

#include <stdint.h>
/* "1,2 3" -> malloc'd ids (free()), each in [0, 65535]; -1 on a bad or empty list. */
int mt_cmd_parse_ids(const char *s, int32_t **ids, int *n);

/* A size argument through the one parser (mt_size_parse: 80GiB binary,
 * 80GB decimal, a bare 80G refused); -1 after printing why to stderr. */
long long mt_cmd_size_arg(const char *tool, const char *s);

/* The corpus rule `prepare` and `tokenizer train` share: no --input means the
 * built-in corpus (MT_TOK_DEFAULT_CORPUS, appended to inputs) capped at
 * MT_TOK_DEFAULT_MAX_BYTES unless --max-bytes was given; an unset
 * max_bytes (< 0) is then 0 (no cap). Returns 1 when the default was used. */
int mt_cmd_corpus_inputs(const char **inputs, int *n_inputs, long long *max_bytes);

/* One command-line option, argv[i], against the tool's lists (each
 * NULL-terminated; either may be NULL): `flags` take no value, `valued`
 * take argv[i + 1]. Returns 0 for a flag, 1 for a valued option (its value
 * is argv[i + 1]), -1 after printing the one line for bad input (the
 * caller exits 2): "meshtrain TOOL: unknown option 'X' (see --help)" —
 * also for an unknown last argument, never "needs a value" — or
 * "meshtrain TOOL: X needs a value (see --help)". */
int mt_cmd_option(const char *tool, const char *const *flags, const char *const *valued, int argc, char **argv, int i);

#endif
