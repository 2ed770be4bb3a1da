/* cmp_merge_internal.h - state shared by cmp_merge.c (matching, math) and
 * cmp_merge_write.c (output).  Not a public header. */
#ifndef CMP_MERGE_INTERNAL_H
#define CMP_MERGE_INTERNAL_H

#include "cmp_merge.h"
#include "kn_ops.h"

/* Rows computed together per thread (cmp_merge_math.c); the writer rounds
 * its chunks up to a multiple of CMP_MERGE_CHUNK_ROWS. */
#define CMP_MERGE_ROW_BLOCK 16
#define CMP_MERGE_CHUNK_ROWS 32

typedef enum merge_op_kind {
    OP_DELTA = 0, /* LoRA delta (optionally DoRA) on a weight */
    OP_REPLACE,   /* full replacement tensor */
    OP_BIAS_ADD,  /* bias += coef * lora_B.bias */
} merge_op_kind;

typedef struct merge_op {
    merge_op_kind kind;
    const fmt_peft_module *mod;  /* DELTA, BIAS_ADD */
    const fmt_st_tensor *rep;    /* REPLACE */
    double coef;                 /* adapter weight x module scaling */
    int transposed;              /* delta stored as (B@A)^T */
    int dora;                    /* DoRA normalisation after the delta */
} merge_op;

/* Streaming check sum of bytes written (cmp_merge_queue.c). */
typedef struct wsum {
    uint64_t lane[4];
    unsigned char carry[32];
    size_t nc;                   /* bytes in carry */
    uint64_t len;                /* bytes summed */
} wsum;
void cmp_merge_wsum_init_(wsum *s);
void cmp_merge_wsum_add_(wsum *s, const void *data, size_t n);
uint64_t cmp_merge_wsum_end_(wsum *s);

/* A tensor of the merged model. */
typedef struct merge_tensor {
    const char *name;            /* borrowed from src, or "lm_head.weight" */
    const fmt_st_tensor *src;    /* base tensor (embed_tokens for lm_head) */
    size_t shard;                /* output shard */
    int untied;                  /* lm_head written out of a tied model */
    wsum sum;                    /* of the bytes written, while writing */
    uint64_t hash;               /* its end: touched tensors, once written */
    merge_op *ops;               /* in application order; NULL if untouched */
    size_t n_ops, cap_ops;
} merge_tensor;

struct cmp_merge {
    const fmt_model *base;
    fmt_peft_adapter **adapters;
    size_t n_adapters;
    merge_tensor *tensors;       /* output order */
    size_t n_tensors;
    size_t *by_name;             /* indexes into tensors, sorted by name */
    int untie;                   /* lm_head untied */
    size_t lora_modules, replaced;
    double max_abs_delta;        /* over tensors computed so far */
    struct merge_prep *prep;     /* per-tensor prepared adapters
                                  * (cmp_merge_math.c) */
    int threads;                 /* threads computing rows (>= 1) */
    cmp_merge_progress_fn progress; /* may be NULL */
    void *progress_ctx;
    uint64_t progress_done, progress_total; /* output tensor bytes */
};

const merge_tensor *cmp_merge_find_(const cmp_merge *m, const char *name);
/* Compute rows [row0, row0 + nrows) of tensor t into out (nrows x cols
 * elements of dt: F32, F16 or BF16), each rounded once from its double
 * value, on m->pool's threads.  Prepared state for t is built on first
 * use and kept until cmp_merge_release_(). */
mc_status cmp_merge_rows_(cmp_merge *m, const merge_tensor *t, uint64_t row0,
                          uint64_t nrows, fmt_dtype dt, void *out,
                          mc_error *err);
void cmp_merge_release_(cmp_merge *m);
/* rows x cols view of a tensor (1-D: one row). */
void cmp_merge_dims_(const fmt_st_tensor *t, uint64_t *rows, uint64_t *cols);

/* The writer thread (cmp_merge_queue.c).  One producer (the merge's
 * thread) queues chunks in order; the writer thread sums (when sum is not
 * NULL), writes them to the current shard and drops the input range drop
 * (when not NULL) once written.  cmp_merge_queue_buffer_ returns the
 * buffer (cap bytes) the next push may fill, after waiting until the
 * writer is done with it.  Errors: the first write error is returned by
 * the next push and by drain, which waits until everything queued is
 * written; set_writer (queue empty) starts a new shard and clears it. */
typedef struct merge_queue merge_queue;
mc_status cmp_merge_queue_create_(size_t cap, merge_queue **out, mc_error *err);
void cmp_merge_queue_free_(merge_queue *q); /* NULL is a no-op */
void cmp_merge_queue_set_writer_(merge_queue *q, fmt_st_writer *w);
void *cmp_merge_queue_buffer_(merge_queue *q);
mc_status cmp_merge_queue_push_(merge_queue *q, const void *data, size_t len,
                                wsum *sum, const void *drop, uint64_t drop_len,
                                mc_error *err);
mc_status cmp_merge_queue_drain_(merge_queue *q, mc_error *err);
/* The read-back of cmp_merge_write (cmp_merge_write.c): the shards in
 * dir hold every tensor with its shape and output dtype, and each changed
 * tensor the bytes whose check sum was taken as they were written (its
 * hash).  MC_ERR_IO names the first tensor in output order that does
 * not.  Tests call it on a committed output they then damage. */
mc_status cmp_merge_verify_(const cmp_merge *m, const char *dir,
                            fmt_dtype out_dtype, mc_error *err);
/* madvise(MADV_DONTNEED) the whole pages inside [p, p + n) of a read-only
 * mapping: file pages we are done with stop counting in RSS. */
void cmp_merge_drop_range_(const void *p, uint64_t n);

#endif /* CMP_MERGE_INTERNAL_H */
