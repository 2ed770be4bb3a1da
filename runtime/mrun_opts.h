/*
 * mrun_opts.h - the options of the mrun program: its one option table
 * (mc_opt.h), which drives the parsing, `mrun --help`, docs/cli.md and the
 * man page mrun(1), and the checks of what the options ask together.
 *
 * Part of the mrun program (it prints usage errors on stderr), not of the
 * runtime library.
 */
#ifndef MRUN_OPTS_H
#define MRUN_OPTS_H

#include <stddef.h>
#include <stdint.h>

#include "mc_opt.h"
#include "mcrt.h"
#include "mrun_job.h"

/* Prompts of token ids: ids[i] (len[i] ids, malloc'ed), n of cap. */
typedef struct mrun_seqs {
    int32_t **ids;
    size_t *len;
    size_t n, cap;
} mrun_seqs;

/* Every option of one mrun run.  Strings are borrowed from argv unless
 * said otherwise; mrun_cli_free releases what is owned. */
typedef struct mrun_cli {
    const char *model;         /* MODEL (the positional) */
    mrun_seqs in;              /* --tokens, then --tokens-file, then the
                                  encoded text prompts */
    const char **texts;        /* --prompt values and prompts-file lines */
    size_t n_texts, cap_texts;
    char *prompts_text;        /* the prompts file, owning its lines */
    const char *prompts_file;
    const char *tokens_file;
    const char *metrics_path;
    mcrt_gen_params gp;
    int32_t *stop;             /* --stop ids (owned), n_stop of them */
    size_t n_stop;
    const char **stop_str;     /* --stop-string values (the array owned) */
    size_t *stop_str_len;      /* their bytes */
    size_t n_stop_str, cap_stop_str;
    mrun_seqs labels;          /* --score-labels (one token each) and
                                  --score-label (one label each) */
    int32_t *cont;             /* --score-continuation ids (owned) */
    size_t n_cont;
    int score_labels, score_cont;
    mcrt_options opts;
    int json, quiet, verbose, add_special;
    mrun_job_opts job;         /* --input: the JSONL job (mrun_job.h) */
} mrun_cli;

/* mrun's command: usage, table, footer (for tests and the docs). */
extern const mc_opt_cmd mrun_cmd;

/* Parse argv into c (zeroed and defaulted first), read the files of
 * --tokens-file/--prompts-file and check the options against each
 * other.  Returns -1 to go on and run, else the exit code (0 after
 * --help, 1 an input file could not be read, 2 usage; the message is
 * printed).  Call mrun_cli_free(c) in every case. */
int mrun_cli_parse(int argc, char **argv, mrun_cli *c);

void mrun_cli_free(mrun_cli *c);

/* Append a prompt (ids copied). */
void mrun_seqs_add(mrun_seqs *s, const int32_t *ids, size_t n);

/* realloc that ends the program (exit 1, message) when out of memory:
 * mrun has nothing to save at that point. */
void *mrun_xrealloc(void *p, size_t n);

#endif /* MRUN_OPTS_H */
