/*
 * fmt_file.h - read a whole small input file (a JSON config, a tokenizer,
 * an id or text file) into memory, with the checks every such reader
 * needs: a regular file, a size limit checked before anything is
 * allocated, short reads reported.  Files the tool maps (safetensors,
 * artifacts) do not come through here.
 */
#ifndef FMT_FILE_H
#define FMT_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "mc_error.h"

/* Read path into *data (new, mc_free; NUL-terminated one byte past *len,
 * so text parsers may treat it as a string).  Files over max_bytes are
 * refused (MC_ERR_UNSUPPORTED) with "the file is N bytes, larger than
 * LIMIT" where LIMIT is limit_text (e.g. "16 MiB").  Errors name path:
 * MC_ERR_NOT_FOUND, MC_ERR_IO (not a regular file, read failure, size
 * changed while reading), MC_ERR_NOMEM. */
mc_status fmt_file_read(const char *path, uint64_t max_bytes,
                        const char *limit_text, char **data, size_t *len,
                        mc_error *err);

#endif /* FMT_FILE_H */
