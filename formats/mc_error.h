/*
 * mc_error.h - the one status enum of mcompile and the error context that
 * travels with it.
 *
 * Every library function that can fail returns mc_status and, when the
 * caller passes a non-NULL mc_error*, fills it with what a user needs to act:
 * the file, the tensor or field, the byte offset where the problem was found,
 * and a sentence saying what was expected.  Only the two programs (mcompile,
 * mrun) print or exit; library code never does.
 *
 * Status values are pinned: they appear in --json reports and must never be
 * renumbered.  Add new ones at the end, with a message in mc_status_str().
 */
#ifndef MC_ERROR_H
#define MC_ERROR_H

#include <stddef.h>
#include <stdint.h>

typedef enum mc_status {
    MC_OK = 0,
    MC_ERR_IO = 1,          /* open/read/write/fsync/rename failed (errno in detail) */
    MC_ERR_NOMEM = 2,       /* an allocation failed */
    MC_ERR_FORMAT = 3,      /* a file is malformed: bad header, JSON, offsets */
    MC_ERR_UNSUPPORTED = 4, /* well-formed, but something we do not handle */
    MC_ERR_SHAPE = 5,       /* tensor shapes disagree with config or each other */
    MC_ERR_NOT_FOUND = 6,   /* a required tensor, key or file is absent */
    MC_ERR_INVALID_ARG = 7, /* caller passed something out of contract */
    MC_ERR_NONFINITE = 8,   /* NaN or Inf where finite values are required */
    MC_ERR_CHECKSUM = 9,    /* stored checksum does not match the data */
    MC_ERR_PLAN = 10,       /* request does not fit the memory plan */
    MC_ERR_OVERFLOW = 11,   /* a size computed from a file overflows */
    MC_ERR_INTERRUPTED = 12,/* stopped by a signal; outputs left untouched */
    MC_ERR_CUDA = 13,       /* a CUDA or cuBLAS call failed */
    MC_STATUS_COUNT_
} mc_status;

/* Error context filled by the function that detects a failure.  All strings
 * are copied in (fixed buffers), so the struct can be returned by value and
 * needs no freeing.  offset is -1 when no byte offset applies. */
typedef struct mc_error {
    mc_status status;
    char file[512];     /* path of the file involved, "" if none */
    char field[256];    /* tensor name, JSON field or option, "" if none */
    int64_t offset;     /* byte offset in file where detected, or -1 */
    char message[768];  /* what was wrong and what was expected */
} mc_error;

/* Short fixed description of a status ("malformed file"). Never NULL. */
const char *mc_status_str(mc_status s);

/* Clear err (status MC_OK, empty strings, offset -1). err may be NULL. */
void mc_error_clear(mc_error *err);

/* Record a failure in err (if non-NULL) and return status, so callers can
 * write `return mc_fail(err, MC_ERR_FORMAT, path, name, off, "fmt", ...)`.
 * file and field may be NULL.  The first failure recorded wins only if the
 * caller does not overwrite it: later calls overwrite. */
mc_status mc_fail(mc_error *err, mc_status status, const char *file,
                  const char *field, int64_t offset, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 6, 7)))
#endif
    ;

/* Format err as one line for a user:
 *   "model.safetensors: tensor 'x' at byte 1234: malformed file: <message>"
 * into buf (always NUL-terminated).  Returns buf. */
const char *mc_error_format(const mc_error *err, char *buf, size_t bufsize);

#endif /* MC_ERROR_H */
