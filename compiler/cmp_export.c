/* cmp_export.c - `mcompile export` (cmp_export.h): open the input, refuse
 * an output that would overwrite it, hand over to the format's writer. */
#include "cmp_export.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_input.h"

/* 1 if out names input, or (a directory output replaces the whole
 * directory) a directory that holds input. */
static int overwrites_input(const char *input, const char *out)
{
    char a[PATH_MAX], b[PATH_MAX];
    if (!realpath(input, a) || !realpath(out, b))
        return 0; /* out does not exist yet: nothing to overwrite */
    size_t n = strlen(b);
    return strcmp(a, b) == 0 ||
           (strncmp(a, b, n) == 0 && (a[n] == '/' || n == 1));
}

mc_status cmp_export(const char *input, const char *out,
                     const cmp_export_opts *o, cmp_export_report *rep,
                     mc_error *err)
{
    cmp_export_report local;
    if (!rep)
        rep = &local;
    memset(rep, 0, sizeof *rep);
    if (!input || !out || !o)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "export needs an input, an output and options");
    if (overwrites_input(input, out))
        return mc_fail(err, MC_ERR_INVALID_ARG, out, "-o", -1,
                       "the output would overwrite the input %s", input);
    /* a GGUF file replaces only an earlier export (its general.quantized_by
     * sits among the first keys); compressed-tensors' directory has the
     * output marker (fmt_output_check_dir) */
    if (o->format == CMP_EXPORT_GGUF) {
        mc_status g = fmt_output_check_ours(
            out, "a GGUF file mcompile exported (its general.quantized_by "
                 "says mcompile; exports from before 2026-12-05 lack it)",
            "GGUF", CMP_EXPORT_GGUF_BY, 4096, err);
        if (g != MC_OK)
            return g;
    }
    cmp_xsrc *s;
    mc_status st = cmp_xsrc_open(input, &s, err);
    if (st != MC_OK)
        return st;
    st = o->format == CMP_EXPORT_GGUF ? cmp_export_gguf(s, out, o, rep, err)
                                      : cmp_export_ct(s, out, o, rep, err);
    cmp_xsrc_close(s);
    struct stat sb;
    if (st == MC_OK && o->format == CMP_EXPORT_GGUF && stat(out, &sb) == 0)
        rep->bytes = (uint64_t)sb.st_size;
    return st;
}
