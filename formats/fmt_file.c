/* fmt_file.c - whole-file reads of small inputs (see fmt_file.h). */
#include "fmt_file.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt_input.h"
#include "mc_alloc.h"

mc_status fmt_file_read(const char *path, uint64_t max_bytes,
                        const char *limit_text, char **data, size_t *len,
                        mc_error *err)
{
    *data = NULL;
    *len = 0;
    FILE *fp;
    mc_status ost = fmt_input_fopen(path, &fp, err); /* FIFOs: no hang */
    if (ost != MC_OK)
        return ost;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        int e = errno;
        fclose(fp);
        return mc_fail(err, MC_ERR_IO, path, NULL, -1, "cannot stat: %s",
                       strerror(e));
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > max_bytes ||
        (uint64_t)st.st_size >= SIZE_MAX) {
        fclose(fp);
        return mc_fail(err, MC_ERR_UNSUPPORTED, path, NULL, -1,
                       "the file is %lld bytes, larger than %s",
                       (long long)st.st_size, limit_text);
    }
    size_t n = (size_t)st.st_size;
    char *buf = mc_malloc(n + 1);
    if (!buf) {
        fclose(fp);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1,
                       "out of memory reading %zu bytes", n);
    }
    /* one byte more than the size: a file that grew meanwhile is caught */
    size_t got = fread(buf, 1, n + 1, fp);
    int bad = ferror(fp), e = errno;
    fclose(fp);
    if (bad || got != n) {
        mc_free(buf);
        return mc_fail(err, MC_ERR_IO, path, NULL, -1, "read failed: %s",
                       bad ? strerror(e) : "the file changed size while "
                                           "being read");
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return MC_OK;
}
