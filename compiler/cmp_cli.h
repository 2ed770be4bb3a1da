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

int cmp_cli_merge(int argc, char **argv);   /* mcompile merge ... */
int cmp_cli_plan(int argc, char **argv);    /* mcompile plan ... */
int cmp_cli_compile(int argc, char **argv); /* mcompile MODEL --target ... */
int cmp_cli_inspect(int argc, char **argv); /* mcompile inspect ... */
int cmp_cli_eval(int argc, char **argv);    /* mcompile eval ... */
int cmp_cli_export(int argc, char **argv);  /* mcompile export ... */

/* "DIR[:WEIGHT]" of --lora (merge and compile): the part after the last
 * ':' is the weight when it reads as a number (then strictly: finite, in
 * [-1e6, 1e6], mc_parse.h), else the whole argument is the directory.
 * Returns 0 with *dir (new, free()) and *weight (default 1), or -1 with a
 * usage message in why[n]. */
int cmp_cli_parse_lora(const char *arg, char **dir, double *weight, char *why,
                       size_t n);

#endif /* CMP_CLI_H */
