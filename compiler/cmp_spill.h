/*
 * cmp_spill.h - an unnamed temporary file that takes finished buffers out
 * of memory and gives them back as one read-only mapping.
 *
 * Why: calibration produces the quantized model one block at a time, and a
 * 70B model's int4 weights (~37 GiB) do not fit beside the calibration's
 * own working set.  Each finished buffer is written here and freed; when
 * all are written, cmp_spill_map() maps the file and points every recorded
 * pointer into the mapping.  Mapped pages are file-backed: the kernel can
 * drop and re-read them under memory pressure, which anonymous memory it
 * cannot do without swap.
 *
 * The file is created in a directory chosen by the caller (the output's,
 * so it is on the same file system and counted against the same free
 * space) and unlinked at once: nothing is left behind by a crash or a
 * kill.  Buffers are written at 64-byte aligned offsets.
 */
#ifndef CMP_SPILL_H
#define CMP_SPILL_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

typedef struct cmp_spill cmp_spill;

/* Create the file in dir.  MC_ERR_IO naming dir when it cannot be made,
 * MC_ERR_NOMEM. */
mc_status cmp_spill_create(const char *dir, cmp_spill **out, mc_error *err);

/* Write bytes from *slot to the file, mc_free(*slot) and set *slot NULL;
 * cmp_spill_map() later sets *slot to the data's address in the mapping,
 * so slot must stay valid (and untouched) until then.  *slot NULL or
 * bytes 0: nothing is written and the slot stays NULL.  MC_ERR_IO (a
 * short write, ENOSPC: naming what was being written), MC_ERR_NOMEM; on an
 * error *slot is left as it was (still owned by the caller). */
mc_status cmp_spill_put(cmp_spill *s, void **slot, size_t bytes,
                        const char *what, mc_error *err);

/* Map the file read-only and fill every slot recorded by cmp_spill_put.
 * Call once, after the last put.  MC_ERR_IO. */
mc_status cmp_spill_map(cmp_spill *s, mc_error *err);

/* 1 if p lies in the mapping (so must not be freed by its holder). */
int cmp_spill_owns(const cmp_spill *s, const void *p);

/* Bytes written so far. */
uint64_t cmp_spill_bytes(const cmp_spill *s);

/* Unmap and close (the file goes with its last descriptor).  NULL is a
 * no-op.  Every pointer cmp_spill_map filled dangles afterwards. */
void cmp_spill_free(cmp_spill *s);

#endif /* CMP_SPILL_H */
