/*
 * mrun_resume.h - the dataset job's --resume (mrun_job.h): the ids of the
 * lines an earlier run already wrote to the output, read back from it, so
 * that the job skips them and appends the rest.
 *
 * Part of the mrun program (it prints its messages on stderr), not of the
 * runtime library.
 */
#ifndef MRUN_RESUME_H
#define MRUN_RESUME_H

#include <stddef.h>
#include <stdint.h>

typedef struct mrun_resume {
    char **ids;                /* [n] ids (JSON text) of the complete lines,
                                  sorted; owned */
    size_t n;
    size_t cap;                /* ids has room for cap */
    uint64_t failed;           /* of those lines, error lines */
} mrun_resume;

/* Read the output at path: collect the ids of its complete lines into r
 * (zeroed by the caller) and cut a partial last line off the file.  A
 * missing file is a fresh run (r stays empty).  Returns 0, or an exit code
 * after a message (a line mrun did not write: not resumed). */
int mrun_resume_load(const char *path, int quiet, mrun_resume *r);

/* 1 if id (JSON text) is among r's ids. */
int mrun_resume_has(const mrun_resume *r, const char *id);

void mrun_resume_free(mrun_resume *r);

/* The heap bytes r holds (malloc's chunks, rt_plan_heap_chunk): the job
 * counts them in its plan. */
uint64_t mrun_resume_bytes(const mrun_resume *r);

/* Lines in the file at path (a last line without '\n' counts); 0 when it
 * cannot be read.  For the progress line's total. */
uint64_t mrun_count_lines(const char *path);

#endif /* MRUN_RESUME_H */
