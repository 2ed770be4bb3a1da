/* cmp_compile_rtn.c - the uncalibrated compile's fast path: a tensor read
 * straight from the base checkpoint is widened, checked and quantized (or
 * copied) row by row on several threads, without a float32 copy of the
 * whole matrix.  Bitwise what cmp_compile.c's read_f32 + convert write
 * (cmp_quant_rtn_rows' contract); anything else (adapters, 1-D tensors,
 * a dtype change, a NaN or infinity whose message names the element) is
 * left to that plain path. */
#include "cmp_compile_internal.h"

#include <string.h>

#include "cmp_merge_internal.h"
#include "cmp_par.h"
#include "cmp_quant.h"
#include "kn_rtn.h"

typedef struct rtn_job {
    const void *src;       /* [rows][cols] in the checkpoint's type */
    int type;              /* KN_RTN_* */
    size_t esize;          /* bytes per source element */
    const cmp_tensor_plan *t;
    uint8_t *sec;          /* the tensor's section */
    float *rows;           /* [threads][cols] scratch */
    int *ok;               /* [threads]: 0 once a slot met a non-finite */
} rtn_job;

static void rtn_range(const rtn_job *j, uint32_t r0, uint32_t r1, int slot)
{
    const cmp_tensor_plan *t = j->t;
    float *row = j->rows + (size_t)slot * t->cols;
    if (cmp_quant_is_quantized(t->fmt)) {
        cmp_qbuf b = cmp_compile_qbuf(t, j->sec);
        j->ok[slot] = cmp_quant_rtn_rows(j->src, j->type, &b, r0, r1, row);
        return;
    }
    /* same type in and out: the bytes are the values; only check them */
    size_t rowb = (size_t)t->cols * j->esize;
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *s = (const uint8_t *)j->src + (size_t)r * rowb;
        if (!kn_rtn_to_f32(s, j->type, t->cols, row)) {
            j->ok[slot] = 0;
            return;
        }
        memcpy(j->sec + (size_t)r * rowb, s, rowb);
    }
}

cmp_qbuf cmp_compile_qbuf(const cmp_tensor_plan *t, uint8_t *sec)
{
    cmp_qbuf b = {t->fmt, t->rows, t->cols, t->group, sec + t->data_off,
                  sec + t->scale_off, t->zero_bytes ? sec + t->zero_off : NULL,
                  t->role == CMP_ROLE_EMBED && t->fmt == KN_W_Q8
                      ? CMP_Q8_EMBED
                      : CMP_Q8_PLAIN};
    return b;
}

static int rtn_type(fmt_dtype dt, size_t *esize)
{
    *esize = dt == FMT_DT_F32 ? 4 : 2;
    return dt == FMT_DT_F32 ? KN_RTN_F32 : dt == FMT_DT_F16 ? KN_RTN_F16
         : dt == FMT_DT_BF16 ? KN_RTN_BF16 : -1;
}

/* Thread tid's share of the rows (contiguous; the bytes do not depend on
 * the split). */
static void rtn_thread(void *ctx, int tid, int nth)
{
    const rtn_job *j = ctx;
    uint64_t rows = j->t->rows;
    rtn_range(j, (uint32_t)(rows * (uint64_t)tid / (uint64_t)nth),
              (uint32_t)(rows * (uint64_t)(tid + 1) / (uint64_t)nth), tid);
}

int cmp_compile_rtn_section(const fmt_st_tensor *st, const cmp_tensor_plan *t,
                            uint8_t *sec, int threads, float *rows)
{
    size_t esize;
    int type = st ? rtn_type(st->dtype, &esize) : -1;
    if (type < 0 || t->ndim != 2 || st->ndim != 2 || st->shape[0] != t->rows ||
        st->shape[1] != t->cols)
        return 0;
    int same = (t->fmt == KN_W_F32 && type == KN_RTN_F32) ||
               (t->fmt == KN_W_F16 && type == KN_RTN_F16) ||
               (t->fmt == KN_W_BF16 && type == KN_RTN_BF16);
    if (!same && !cmp_quant_is_quantized(t->fmt))
        return 0;
    int nth = threads < 1 ? 1 : threads > CMP_RTN_MAX_THREADS
                                    ? CMP_RTN_MAX_THREADS : threads;
    if ((uint32_t)nth > t->rows)
        nth = (int)t->rows;
    int ok[CMP_RTN_MAX_THREADS];
    for (int i = 0; i < nth; i++)
        ok[i] = 1;
    rtn_job j = {st->data, type, esize, t, sec, rows, ok};
    /* threads started per tensor rather than a spinning pool: a tensor
     * takes milliseconds, a start tens of microseconds */
    cmp_par_spawn(nth, rtn_thread, &j);
    for (int i = 0; i < nth; i++)
        if (!ok[i])
            return 0;
    /* done with these mapped pages: they stop counting in RSS (peak ~ two
     * sections, not the checkpoint; a later read faults them back in) */
    cmp_merge_drop_range_(st->data, st->nbytes);
    return 1;
}
