/*
 * mc_opt.h - one option table per command: it drives the parsing, the
 * --help text and, through --help, docs/cli.md and the man pages
 * (scripts/gen-cli-docs).
 *
 * A command (mcompile merge, mrun, ...) declares one mc_opt_cmd: its usage
 * text, its positional argument and a table of rows.  A row names its
 * flags ("-o, --output"), the hint of its value ("DIR"; NULL: a switch),
 * its help and where the value goes: a field at `off` bytes into the
 * command's option struct (`base`), parsed by kind (numbers strictly, by
 * mc_parse.h: whole or finite, in [lo, hi]), or a handler for what a
 * field cannot say (append to a list, a size, a value that sets two
 * fields).  So a flag cannot be parsed without being documented, nor
 * documented without being parsed.
 *
 * Rules, the same for every command:
 *   - "--flag VALUE" and "--flag=VALUE" (long flags); a switch refuses
 *     "=VALUE";
 *   - "--" ends the options; "-" alone is a positional argument;
 *   - -h/--help anywhere (not as a value) asks for help before anything
 *     is parsed;
 *   - a later occurrence of a flag replaces the earlier value (handlers
 *     may append instead: --lora, --tokens).
 * Usage errors come back as a message in why[n] naming the flag and what
 * was expected; the program prints it and exits 2.  This module neither
 * prints nor exits.
 */
#ifndef MC_OPT_H
#define MC_OPT_H

#include <stddef.h>
#include <stdint.h>

typedef enum mc_opt_kind {
    MC_OPT_END = 0,  /* ends a table */
    MC_OPT_SECTION,  /* no flag: a heading in --help (help = its text) */
    MC_OPT_HELP,     /* -h, --help: listed, handled by mc_opt_parse */
    MC_OPT_SET,      /* switch: int at off = 1 */
    MC_OPT_CLEAR,    /* switch: int at off = 0 */
    MC_OPT_STR,      /* const char * at off = the value (borrowed argv) */
    MC_OPT_U32,      /* uint32_t at off, whole number in [ulo, uhi] */
    MC_OPT_U64,      /* uint64_t at off, whole number in [ulo, uhi] */
    MC_OPT_INT,      /* int at off, whole number in [ulo, uhi] */
    MC_OPT_F32,      /* float at off, finite number in [flo, fhi] */
    MC_OPT_F64,      /* double at off, finite number in [flo, fhi] */
    MC_OPT_CHOICE,   /* int at off = the value of the matching choice */
    MC_OPT_CALL,     /* call(base, row, flag, value) (value NULL for a
                        switch, i.e. when `value` is NULL) */
    MC_OPT_TABLE,    /* the rows of `sub`, their base moved by off */
} mc_opt_kind;

/* One accepted word of an MC_OPT_CHOICE; a list ends with name NULL.
 * alias: accepted, not named in the error message. */
typedef struct mc_opt_choice {
    const char *name;
    int value;
    int alias;
} mc_opt_choice;

struct mc_opt;

/* A handler: returns 0, or -1 with a usage message in why[n] (which
 * should name `flag`). */
typedef int (*mc_opt_fn)(void *base, const struct mc_opt *row,
                         const char *flag, const char *value, char *why,
                         size_t n);

typedef struct mc_opt {
    mc_opt_kind kind;
    const char *flags;     /* "-o, --output": names, ", "-separated */
    const char *value;     /* hint of the value ("N", "cpu|cuda"); NULL:
                              the row takes no value */
    const char *help;      /* '\n' starts an indented continuation line */
    size_t off;            /* field (or sub-table base) offset in base */
    uint64_t ulo, uhi;     /* whole-number range (U32, U64, INT) */
    double flo, fhi;       /* float range (F32, F64) */
    int fflags;            /* MC_PARSE_LO_OPEN: flo itself refused */
    const mc_opt_choice *choices; /* MC_OPT_CHOICE */
    mc_opt_fn call;        /* MC_OPT_CALL */
    const struct mc_opt *sub; /* MC_OPT_TABLE */
} mc_opt;

typedef struct mc_opt_cmd {
    const char *name;      /* "mcompile merge": prefix of messages */
    const char *usage;     /* text before the options (usage lines and
                              description), ends in '\n' */
    const char *footer;    /* text after the options, or NULL */
    int help_col;          /* column of the help text (0: 19) */
    const char *positional;/* name of the one positional ("BASE"), NULL:
                              none accepted */
    size_t positional_off; /* const char * in base */
    const char *extra_hint;/* appended to "unexpected argument 'x'" */
    const mc_opt *opts;
} mc_opt_cmd;

#define MC_OPT_HELP_ASKED 1

/* Parse argv[1..argc-1] (argv[0] is the command's name) into base.
 * Returns 0, MC_OPT_HELP_ASKED (nothing parsed; print mc_opt_help), or
 * -1 with the message in why[n] (base may be partly filled).  A missing
 * positional is not an error here: the command says what it needs. */
int mc_opt_parse(const mc_opt_cmd *cmd, int argc, char **argv, void *base,
                 char *why, size_t n);

/* The --help text of cmd: usage, one line (or more) per row, footer.
 * Returns a new string (free()), or NULL when out of memory. */
char *mc_opt_help(const mc_opt_cmd *cmd);

/* Calls fn(flag, row, ctx) for every flag name of every row, sub-tables
 * included (for tests and documentation checks).  flag is one name
 * ("--output"), NUL-terminated in a scratch buffer. */
void mc_opt_each_flag(const mc_opt *opts,
                      void (*fn)(const char *flag, const mc_opt *row,
                                 void *ctx),
                      void *ctx);

#endif /* MC_OPT_H */
