/* mc_error.c - status message table and error-context helpers. */
#include "mc_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const status_messages[MC_STATUS_COUNT_] = {
    [MC_OK] = "ok",
    [MC_ERR_IO] = "I/O error",
    [MC_ERR_NOMEM] = "out of memory",
    [MC_ERR_FORMAT] = "malformed file",
    [MC_ERR_UNSUPPORTED] = "unsupported",
    [MC_ERR_SHAPE] = "shape mismatch",
    [MC_ERR_NOT_FOUND] = "not found",
    [MC_ERR_INVALID_ARG] = "invalid argument",
    [MC_ERR_NONFINITE] = "non-finite value",
    [MC_ERR_CHECKSUM] = "checksum mismatch",
    [MC_ERR_PLAN] = "does not fit the memory plan",
    [MC_ERR_OVERFLOW] = "size overflow",
    [MC_ERR_INTERRUPTED] = "interrupted",
    [MC_ERR_CUDA] = "CUDA error",
};

const char *mc_status_str(mc_status s)
{
    if ((unsigned)s >= MC_STATUS_COUNT_ || !status_messages[s])
        return "unknown status";
    return status_messages[s];
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    if (!src) {
        dst[0] = '\0';
        return;
    }
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void mc_error_clear(mc_error *err)
{
    if (!err)
        return;
    err->status = MC_OK;
    err->file[0] = err->field[0] = err->message[0] = '\0';
    err->offset = -1;
}

mc_status mc_fail(mc_error *err, mc_status status, const char *file,
                  const char *field, int64_t offset, const char *fmt, ...)
{
    if (!err)
        return status;
    err->status = status;
    copy_str(err->file, sizeof err->file, file);
    copy_str(err->field, sizeof err->field, field);
    err->offset = offset;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status;
}

const char *mc_error_format(const mc_error *err, char *buf, size_t bufsize)
{
    if (!buf || bufsize == 0)
        return buf;
    if (!err) {
        snprintf(buf, bufsize, "unknown error");
        return buf;
    }
    char where[900] = "";
    size_t w = 0;
    if (err->file[0])
        w += (size_t)snprintf(where + w, sizeof where - w, "%s: ", err->file);
    if (err->field[0] && w < sizeof where)
        w += (size_t)snprintf(where + w, sizeof where - w, "'%s' ", err->field);
    if (err->offset >= 0 && w < sizeof where)
        w += (size_t)snprintf(where + w, sizeof where - w, "at byte %lld ",
                              (long long)err->offset);
    if (w >= 2 && w < sizeof where && where[w - 1] == ' ' && where[w - 2] != ':') {
        where[w - 1] = ':';
        where[w] = ' ';
        where[w + 1] = '\0';
    }
    snprintf(buf, bufsize, "%s%s: %s", where, mc_status_str(err->status),
             err->message);
    return buf;
}
