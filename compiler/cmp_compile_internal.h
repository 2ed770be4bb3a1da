/*
 * cmp_compile_internal.h - pieces shared by cmp_compile.c (planning and
 * writing the artifact) and cmp_compile_calib.c (the calibrated path:
 * --calib, --quant auto).  Not a public API.
 */
#ifndef CMP_COMPILE_INTERNAL_H
#define CMP_COMPILE_INTERNAL_H

#include "cmp_auto.h"
#include "cmp_calib.h"
#include "cmp_compile.h"
#include "fmt_artifact.h"
#include "fmt_ids.h"
#include "fmt_safetensors.h"
#include "cmp_par.h"
#include "rt_model.h"

/* What a tensor name is inside a block: a linear's weight (slot
 * CMP_LIN_*), its bias, or one of the two norms. */
enum { CMP_TK_OTHER = -1, CMP_TK_WEIGHT = 0, CMP_TK_BIAS = 1,
       CMP_TK_ATTN_NORM = 2, CMP_TK_MLP_NORM = 3 };

/* Classify "model.layers.L.<...>": returns CMP_TK_* and fills *layer and
 * *slot (CMP_LIN_* for weights and biases).  CMP_TK_OTHER for anything
 * outside the blocks (embed, final norm, lm_head) or unknown. */
int cmp_compile_tensor_kind(const char *name, uint32_t *layer, int *slot);

/* State of the calibrated path, owned by cmp_compile(). */
typedef struct cmp_calib_stage {
    rt_model *m;             /* float model calibrated (owned) */
    float **merged;          /* [n_merged] merged tensors m points into */
    size_t n_merged;
    fmt_ids *ids;            /* calibration sequences (owned) */
    int is_auto;             /* 1: autoplan holds the per-linear choice */
    cmp_auto_plan autoplan;  /* owned */
    kn_pool *pool;           /* owned, may be NULL */
    cmp_calib_result *r;     /* owned until moved into the report */
    size_t heldout;          /* last sequences kept out for the summary */
    uint64_t calib_xxh3;     /* of the id file, for the provenance */
    uint64_t calib_bytes;
    int32_t *sub_tok;        /* the sequences calibrated on when fewer than
                                all (cmp_calib_subset; owned) */
    size_t *sub_off;
    cmp_calib_effort effort; /* the effort calibrated with */
    cmp_calib_effort most;   /* with a budget or the cap: the options'
                                effort */
    double cap_s;            /* the default cap applied (--calib-passes),
                                in nominal seconds; 0: none */
    int capped;              /* 1: the cap cut effort below most */
} cmp_calib_stage;

/* Open the float model (merged through merge when it is not NULL), load
 * the id file, for --quant auto measure and choose the formats (req's
 * policy then gets quant "auto" and linear_fmt = the choice; req must
 * outlive s), and calibrate.  cfg is the config being compiled; with
 * o->rotate on a width that allows it, it becomes untied (and a tied
 * model's lm_head stays float: req->policy.lm_head_float). */
mc_status cmp_calib_stage_run(const cmp_compile_opts *o,
                              fmt_model_config *cfg, cmp_merge *merge,
                              cmp_plan_request *req, cmp_calib_stage *s,
                              mc_error *err);
void cmp_calib_stage_free(cmp_calib_stage *s); /* zeroed is fine */

/* The uncalibrated path's fast section writer (cmp_compile_rtn.c): when
 * st (a base checkpoint tensor, NULL = none) is 2-D f32/f16/bf16 of t's
 * shape and t is quantized or keeps st's type, fill sec (t's section,
 * zeroed) on `threads` threads (the caller's among them; the bytes do not
 * depend on the count), bitwise as read_f32 + convert would, and return 1.
 * Returns 0, sec partly written, when it does not apply or a value is not
 * finite: the caller then takes the plain path (which names the element).
 * rows: scratch of min(threads, CMP_RTN_MAX_THREADS) x t->cols floats. */
#define CMP_RTN_MAX_THREADS CMP_PAR_MAX_SPAWN
int cmp_compile_rtn_section(const fmt_st_tensor *st, const cmp_tensor_plan *t,
                            uint8_t *sec, int threads, float *rows);

/* The quantized tensor t's buffers inside its section sec, as the
 * quantizer writes them: a Q8 embedding (only a tied model's, the output
 * layer, has one: cmp_plan.h) takes f16-exact row scales (CMP_Q8_F16), so
 * that GGUF's Q8_0 token_embd holds it bit for bit; the linears and an
 * untied lm_head keep the plain f32 scale. */
cmp_qbuf cmp_compile_qbuf(const cmp_tensor_plan *t, uint8_t *sec);

/* Sections written by a second thread while the next one is computed
 * (cmp_sec_pipe.c): two buffers of cap bytes alternate.  _buffer returns
 * the one to fill next (waiting for its last write), or NULL once a write
 * failed; _submit queues its first n bytes for fmt_art_writer_write, in
 * order; _finish waits for the queued writes, stops the thread, frees the
 * pipe (NULL is a no-op) and returns the first write failure (err filled)
 * or MC_OK.  One caller thread; w must outlive the pipe. */
typedef struct cmp_sec_pipe cmp_sec_pipe;
mc_status cmp_sec_pipe_create(fmt_art_writer *w, size_t cap,
                              cmp_sec_pipe **out, mc_error *err);
uint8_t *cmp_sec_pipe_buffer(cmp_sec_pipe *p);
void cmp_sec_pipe_submit(cmp_sec_pipe *p, size_t n);
mc_status cmp_sec_pipe_finish(cmp_sec_pipe *p, mc_error *err);

#endif /* CMP_COMPILE_INTERNAL_H */
