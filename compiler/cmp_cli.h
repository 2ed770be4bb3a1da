/*
 * cmp_cli.h - the subcommands of the mcompile program.
 *
 * Each takes the arguments after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit code: 0 ok, 1 failure, 2 usage.
 * Subcommands print; the library they call does not.  Shared option
 * conventions: --help (stdout, exit 0), -q, -v, --json (one JSON object on
 * stdout, human text then goes to stderr or nowhere).
 */
#ifndef CMP_CLI_H
#define CMP_CLI_H

#include <stddef.h>

#include "cmp_merge.h"
#include "mc_opt.h"

int cmp_cli_merge(int argc, char **argv);   /* mcompile merge ... */
int cmp_cli_plan(int argc, char **argv);    /* mcompile plan ... */
int cmp_cli_compile(int argc, char **argv); /* mcompile MODEL --target ... */
int cmp_cli_inspect(int argc, char **argv); /* mcompile inspect ... */
int cmp_cli_eval(int argc, char **argv);    /* mcompile eval ... */
int cmp_cli_export(int argc, char **argv);  /* mcompile export ... */

/* The option table of each command (mc_opt.h): it drives the parsing and
 * the --help text, hence docs/cli.md and the man pages. */
extern const mc_opt_cmd cmp_cli_compile_cmd;
extern const mc_opt_cmd cmp_cli_merge_cmd;
extern const mc_opt_cmd cmp_cli_plan_cmd;
extern const mc_opt_cmd cmp_cli_inspect_cmd;
extern const mc_opt_cmd cmp_cli_eval_cmd;
extern const mc_opt_cmd cmp_cli_export_cmd;

/* Parse argv with cmd's table into base.  Returns -1 to go on, 0 after
 * printing --help (stdout), 2 after printing a usage error ("NAME: why",
 * then "(see NAME --help)", on stderr), 1 when out of memory. */
int cmp_cli_parse(const mc_opt_cmd *cmd, int argc, char **argv, void *base);

/* Print "NAME: <message>" and the --help pointer on stderr; returns 2. */
int cmp_cli_usage(const mc_opt_cmd *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The plan's options, shared by plan and compile (include them with an
 * MC_OPT_TABLE row whose off is that of a cmp_plan_request): --target
 * --group --max-batch --max-seq --prefill-chunk --threads --lm-head --kv
 * --device --reserve.  --quant is each command's own row (compile adds auto), with
 * cmp_cli_on_quant for the plain formats. */
extern const mc_opt cmp_cli_plan_opts[];

/* Handlers (mc_opt_fn).  on_quant: row->off is that of a
 * cmp_plan_request.  on_size: a uint64_t size ("24GiB") in
 * [row->ulo, row->uhi or UINT64_MAX]. */
int cmp_cli_on_quant(void *base, const mc_opt *row, const char *flag,
                     const char *v, char *why, size_t n);
int cmp_cli_on_size(void *base, const mc_opt *row, const char *flag,
                    const char *v, char *why, size_t n);

/* The adapters of --lora (merge, compile), in the order given. */
#define CMP_CLI_MAX_ADAPTERS 64
typedef struct cmp_cli_loras {
    cmp_adapter_spec spec[CMP_CLI_MAX_ADAPTERS]; /* dir = dirs[i] */
    char *dirs[CMP_CLI_MAX_ADAPTERS];            /* owned (strdup) */
    size_t n;
} cmp_cli_loras;

/* Handler of --lora: appends to the cmp_cli_loras at row->off. */
int cmp_cli_on_lora(void *base, const mc_opt *row, const char *flag,
                    const char *v, char *why, size_t n);
/* Frees the directories (free(NULL)-like: an empty list is fine). */
void cmp_cli_loras_free(cmp_cli_loras *l);

/* "DIR[:WEIGHT]" of --lora (merge and compile): the part after the last
 * ':' is the weight when it reads as a number (then strictly: finite, in
 * [-1e6, 1e6], mc_parse.h), else the whole argument is the directory.
 * Returns 0 with *dir (new, free()) and *weight (default 1), or -1 with a
 * usage message in why[n]. */
int cmp_cli_parse_lora(const char *arg, char **dir, double *weight, char *why,
                       size_t n);

#endif /* CMP_CLI_H */
