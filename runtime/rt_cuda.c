/* rt_cuda.c - the GPU session's memory: the plan arithmetic (any build),
 * and, with CUDA, create (one cudaMalloc, weight upload, views, warm-up),
 * free, the matmul dispatcher and the device queries (see rt_cuda.h).
 * The forward pass is in rt_cuda_step.c, the device queries in
 * rt_cuda_dev.c; all three form the loadable CUDA module
 * (rt_cuda_module.h), while the plan arithmetic is also linked into the
 * runtime (it compiles without CUDA). */
#include "rt_cuda.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "kn_block.h"
#include "kn_ops.h"
#include "kn_pack16.h"
#include "mc_alloc.h"

#ifdef MC_CUDA_MODULE
#include "rt_cuda_internal.h"
#include "rt_plan.h"
#endif

#define RT_CU_ALIGN 256u

static uint64_t align_up(uint64_t v)
{
    return (v + RT_CU_ALIGN - 1) & ~(uint64_t)(RT_CU_ALIGN - 1);
}

void rt_cuda_options_default(rt_cuda_options *o)
{
    memset(o, 0, sizeof *o);
    o->device = 0;
    o->prefill_gemm = 1;
    o->gemm_min_rows = 33;
    o->warm_up = 1;
}

/* ---- weight placement: one walk used for sizing and for the upload ------ */

/* Places weight parts one after another (each 256-aligned).  base NULL:
 * count only.  With a base (CUDA builds), each part is copied there from
 * the host view; the first failure is kept. */
typedef struct wput {
    uint8_t *base;
    uint64_t off;
    int failed;
    int cuda_error;            /* cudaError_t of the first failure */
} wput;

static const void *put(wput *w, const void *host, uint64_t bytes)
{
    if (!host || bytes == 0)
        return NULL;
    uint64_t at = align_up(w->off);
    w->off = at + bytes;
    if (!w->base)
        return NULL;
#ifdef MC_CUDA_MODULE
    if (!w->failed) {
        cudaError_t e = cudaMemcpy(w->base + at, host, (size_t)bytes,
                                   cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            w->failed = 1;
            w->cuda_error = (int)e;
        }
    }
#endif
    return w->base + at;
}

static void put_matrix(wput *w, const kn_matrix *h, kn_matrix *d)
{
    if (h->layout == KN_LAYOUT_P16) {
        /* the CPU runtime's panels (an artifact planned for the CPU, run
         * here on request): the device kernels read the row layout */
        uint64_t db = kn_wformat_data_bytes(h->fmt, h->rows, h->cols);
        uint64_t sb = kn_wformat_scale_bytes(h->fmt, h->rows, h->cols, h->group);
        kn_matrix r = *h;
        r.layout = KN_LAYOUT_ROWS;
        uint8_t *tmp = NULL;
        if (w->base && !w->failed) {
            tmp = mc_malloc((size_t)(db + sb));
            if (!tmp) {
                w->failed = 1;
                w->cuda_error = 2; /* cudaErrorMemoryAllocation */
            } else {
                kn_unpack16(h, tmp, tmp + db);
            }
        }
        /* counting (no base) or a failure: any non-NULL view sizes it */
        r.data = tmp ? tmp : h->data;
        r.scales = tmp ? tmp + db : h->data;
        put_matrix(w, &r, d);
        d->layout = KN_LAYOUT_ROWS;
        mc_free(tmp);
        return;
    }
    *d = *h;
    d->data = put(w, h->data, kn_wformat_data_bytes(h->fmt, h->rows, h->cols));
    d->scales = put(w, h->scales,
                    kn_wformat_scale_bytes(h->fmt, h->rows, h->cols, h->group));
    d->zeros = put(w, h->zeros,
                   kn_wformat_zero_bytes(h->fmt, h->rows, h->cols, h->group));
}

static const float *put_vec(wput *w, const float *h, uint64_t n)
{
    return put(w, h, n * sizeof(float));
}

/* Every matrix the device reads (not an untied embedding: the lookup runs
 * on the host) and every norm and bias.  dl/dlm/dfn may be NULL (sizing). */
static void put_weights(wput *w, const rt_model *m, rt_layer *dl,
                        kn_matrix *dlm, const float **dfn)
{
    const fmt_model_config *c = &m->cfg;
    for (uint32_t l = 0; l < c->num_layers; l++) {
        const rt_layer *h = &m->layers[l];
        rt_layer tmp;
        rt_layer *d = dl ? &dl[l] : &tmp;
        const kn_block_dims *dm = &h->dims;
        const uint64_t qd = (uint64_t)dm->heads * dm->head_dim;
        const uint64_t kvd = (uint64_t)dm->kv_heads * dm->head_dim;
        memset(d, 0, sizeof *d);
        d->dims = h->dims;
        d->w.attn_norm = put_vec(w, h->w.attn_norm, dm->hidden);
        put_matrix(w, &h->w.wq, &d->w.wq);
        put_matrix(w, &h->w.wk, &d->w.wk);
        put_matrix(w, &h->w.wv, &d->w.wv);
        put_matrix(w, &h->w.wo, &d->w.wo);
        d->w.bq = put_vec(w, h->w.bq, qd);
        d->w.bk = put_vec(w, h->w.bk, kvd);
        d->w.bv = put_vec(w, h->w.bv, kvd);
        d->w.bo = put_vec(w, h->w.bo, dm->hidden);
        d->w.mlp_norm = put_vec(w, h->w.mlp_norm, dm->hidden);
        put_matrix(w, &h->w.w_gate, &d->w.w_gate);
        put_matrix(w, &h->w.w_up, &d->w.w_up);
        put_matrix(w, &h->w.w_down, &d->w.w_down);
        d->w.b_gate = put_vec(w, h->w.b_gate, dm->ffn);
        d->w.b_up = put_vec(w, h->w.b_up, dm->ffn);
        d->w.b_down = put_vec(w, h->w.b_down, dm->hidden);
    }
    const float *fn = put_vec(w, m->final_norm, c->hidden_size);
    if (dfn)
        *dfn = fn;
    kn_matrix lm;
    put_matrix(w, &m->lm_head, &lm);
    if (dlm)
        *dlm = lm;
}

/* ---- gemm staging ------------------------------------------------------- */

/* Rows of a rows x cols matrix dequantized per cuBLAS call: all of them
 * when the f16 copy is at most RT_CUDA_GEMM_TILE_BYTES, else tiles of a
 * multiple of 64 rows. */
static uint32_t tile_rows_for(uint32_t rows, uint32_t cols)
{
    uint64_t row = (uint64_t)cols * 2;
    if (row == 0 || (uint64_t)rows * row <= RT_CUDA_GEMM_TILE_BYTES)
        return rows;
    uint64_t n = (RT_CUDA_GEMM_TILE_BYTES / row) & ~(uint64_t)63;
    if (n < 64)
        n = 64;
    if (n > rows)
        n = rows;
    return (uint32_t)n;
}

/* kn_cuda_gemm_work_bytes for `rows` rows of W and T rows of X (the same
 * formula as kernels/cuda/gemm.cu; create checks the two agree). */
static uint64_t gemm_work_for(uint32_t rows, uint32_t cols, uint64_t T)
{
    return align_up((uint64_t)rows * cols * 2) + T * cols * 2;
}

static int uses_gemm(const rt_cuda_options *o, uint64_t t_cap)
{
    uint64_t min = o->gemm_min_rows > 9 ? o->gemm_min_rows : 9;
    return o->prefill_gemm && t_cap >= min;
}

static void gemm_need(uint32_t rows, uint32_t cols, uint64_t T,
                      uint64_t *work, uint64_t *ytile)
{
    uint32_t n = tile_rows_for(rows, cols);
    uint64_t wk = gemm_work_for(n, cols, T);
    uint64_t y = n < rows ? align_up(T * n * sizeof(float)) : 0;
    if (wk > *work)
        *work = wk;
    if (y > *ytile)
        *ytile = y;
}

/* Work (f16 W tile + f16 X) and Y-tile bytes of the gemm staging: the
 * largest over the matrix shapes of cfg at chunk rows (layers) and
 * max_batch rows (lm_head).  Shapes only: the format does not matter. */
static void staging_parts(const fmt_model_config *c, const rt_limits *lim,
                          const rt_cuda_options *o, uint64_t *work,
                          uint64_t *ytile)
{
    *work = *ytile = 0;
    const uint64_t chunk = lim->prefill_chunk, B = lim->max_batch;
    const uint32_t H = c->hidden_size, F = c->intermediate_size;
    const uint32_t qd = (uint32_t)fmt_config_q_dim(c);
    const uint32_t kvd = (uint32_t)fmt_config_kv_dim(c);
    if (uses_gemm(o, chunk) && c->num_layers > 0) {
        const uint32_t shp[5][2] = {{qd, H}, {kvd, H}, {H, qd}, {F, H},
                                    {H, F}};
        for (int i = 0; i < 5; i++)
            gemm_need(shp[i][0], shp[i][1], chunk, work, ytile);
    }
    if (uses_gemm(o, B))
        gemm_need(c->vocab_size, H, B, work, ytile);
    *work = align_up(*work);
}

uint64_t rt_cuda_staging_for(const fmt_model_config *cfg,
                             const rt_limits *lim, const rt_cuda_options *o)
{
    rt_cuda_options def;
    if (!o) {
        rt_cuda_options_default(&def);
        o = &def;
    }
    uint64_t work, ytile;
    staging_parts(cfg, lim, o, &work, &ytile);
    return work + ytile;
}

mc_status rt_cuda_plan_for(const rt_model *m, const rt_layout *layout,
                           const rt_cuda_options *o, rt_cuda_plan *out,
                           mc_error *err)
{
    rt_cuda_options def;
    if (!o) {
        rt_cuda_options_default(&def);
        o = &def;
    }
    memset(out, 0, sizeof *out);
    if (!m || !layout)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_cuda_plan_for: NULL model or layout");
    wput w = {0};
    put_weights(&w, m, NULL, NULL, NULL);
    out->weights_bytes = align_up(w.off);
    out->arena_bytes = layout->arena_bytes;
    out->cublas_workspace_bytes = RT_CUDA_CUBLAS_WORKSPACE_BYTES;
    uint64_t work, ytile;
    staging_parts(&m->cfg, &layout->limits, o, &work, &ytile);
    out->gemm_work_bytes = work;
    out->gemm_staging_bytes = work + ytile;
    out->weights_off = 0;
    out->arena_off = out->weights_bytes;
    out->cublas_off = align_up(out->arena_off + out->arena_bytes);
    out->gemm_off = out->cublas_off + out->cublas_workspace_bytes;
    out->total_bytes = align_up(out->gemm_off + out->gemm_staging_bytes);
    return MC_OK;
}

#ifdef MC_CUDA_MODULE

/* ---- errors and device queries ------------------------------------------ */

mc_status rt_cu_fail(mc_error *err, const char *op, cudaError_t e)
{
    return mc_fail(err, MC_ERR_CUDA, NULL, op, -1, "%s failed: %s (%s)", op,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

mc_status rt_cu_fail_kn(mc_error *err, const char *op, mc_status st)
{
    /* A failed launch leaves its reason in CUDA's error slot. */
    cudaError_t e = cudaGetLastError();
    return mc_fail(err, st == MC_ERR_INVALID_ARG ? MC_ERR_INVALID_ARG
                                                 : MC_ERR_CUDA,
                   NULL, op, -1, "%s failed: %s%s%s", op, mc_status_str(st),
                   e != cudaSuccess ? "; CUDA: " : "",
                   e != cudaSuccess ? cudaGetErrorString(e) : "");
}

mc_status rt_cu_blas_fail(mc_error *err, const char *op, cublasStatus_t b)
{
    return mc_fail(err, MC_ERR_CUDA, NULL, op, -1, "%s failed: %s", op,
                   cublasGetStatusString(b));
}

static uint32_t gemm_tile_rows(const kn_matrix *W)
{
    return tile_rows_for(W->rows, W->cols);
}

/* Rows r0 .. r0+n-1 of W as a matrix of their own (every format). */
static kn_matrix sub_rows(const kn_matrix *W, uint32_t r0, uint32_t n)
{
    kn_matrix s = *W;
    s.rows = n;
    const uint8_t *d = W->data;
    switch (W->fmt) {
    case KN_W_F32:
        s.data = d + (uint64_t)r0 * W->cols * 4;
        break;
    case KN_W_F16:
    case KN_W_BF16:
        s.data = d + (uint64_t)r0 * W->cols * 2;
        break;
    case KN_W_Q8:
        s.data = d + (uint64_t)r0 * W->cols;
        s.scales = (const float *)W->scales + r0;
        break;
    default: {
        uint64_t ng = kn_q4_ngroups(W->cols, W->group);
        s.data = d + (uint64_t)r0 * kn_q4_row_bytes(W->cols);
        s.scales = (const uint16_t *)W->scales + (uint64_t)r0 * ng;
        if (W->zeros)
            s.zeros = W->zeros + (uint64_t)r0 * ng;
        break;
    }
    }
    return s;
}

static size_t gemm_bucket(size_t T, size_t t_cap)
{
    size_t p = 16;
    while (p < T)
        p *= 2;
    return p < t_cap ? p : t_cap;
}

mc_status rt_cu_matmul(rt_cu_backend *s, const kn_matrix *W,
                       const float *X, size_t T, float *Y, const float *bias,
                       size_t t_cap, mc_error *err)
{
    if (T == 0)
        return MC_OK;
    mc_status st;
    uint64_t min = s->opt.gemm_min_rows > 9 ? s->opt.gemm_min_rows : 9;
    if (!uses_gemm(&s->opt, t_cap) || T < min) {
        for (size_t t0 = 0; t0 < T; t0 += KN_CUDA_MATVEC_MAX_T) {
            size_t n = T - t0 < KN_CUDA_MATVEC_MAX_T ? T - t0
                                                     : KN_CUDA_MATVEC_MAX_T;
            st = kn_cuda_matvec(W, X + t0 * W->cols, n, Y + t0 * W->rows,
                                bias, s->stream);
            if (st)
                return rt_cu_fail_kn(err, "kn_cuda_matvec", st);
        }
        return MC_OK;
    }
    const size_t Tp = gemm_bucket(T, t_cap);
    const uint32_t tile = gemm_tile_rows(W);
    for (uint32_t r0 = 0; r0 < W->rows; r0 += tile) {
        uint32_t n = W->rows - r0 < tile ? W->rows - r0 : tile;
        kn_matrix sub = sub_rows(W, r0, n);
        float *dst = n == W->rows ? Y : s->gemm_y;
        st = kn_cuda_gemm((kn_cublas)s->blas, &sub, X, Tp, dst,
                          bias ? bias + r0 : NULL, s->gemm_work,
                          s->plan.gemm_work_bytes, (kn_cuda_stream)s->stream);
        if (st)
            return rt_cu_fail_kn(err, "kn_cuda_gemm", st);
        if (dst != Y) {
            cudaError_t e = cudaMemcpy2DAsync(
                Y + r0, (size_t)W->rows * sizeof(float), dst,
                (size_t)n * sizeof(float), (size_t)n * sizeof(float), T,
                cudaMemcpyDeviceToDevice, s->stream);
            if (e != cudaSuccess)
                return rt_cu_fail(err, "cudaMemcpy2DAsync (gemm tile)", e);
        }
    }
    return MC_OK;
}

/* ---- create / free -------------------------------------------------------- */

/* rt_session_create's layout rules (rt_session.h). */
static mc_status resolve_layout(const rt_model *model, const rt_limits *lim,
                                const rt_layout *layout, rt_layout *out,
                                mc_error *err)
{
    return rt_plan_session_layout(&model->cfg, lim, layout, model->path, out,
                                  err);
}

static mc_status check_supported(const rt_model *m, const rt_layout *L,
                                 mc_error *err)
{
    const fmt_model_config *c = &m->cfg;
    const uint64_t chunk = L->limits.prefill_chunk;
    if (L->limits.kv_type != KN_KV_F32)
        return mc_fail(err, MC_ERR_UNSUPPORTED, m->path, "kv_type", -1,
                       "the CUDA session supports an f32 KV cache only (the "
                       "CUDA kernels have no f16/int8 KV store yet); plan "
                       "with --kv f32");
    if (c->head_dim == 0 || c->head_dim % 2 ||
        c->head_dim > KN_CUDA_ATT_MAX_HEAD_DIM)
        return mc_fail(err, MC_ERR_UNSUPPORTED, m->path, "head_dim", -1,
                       "head_dim %u: the CUDA attention handles even sizes "
                       "up to %d", c->head_dim, KN_CUDA_ATT_MAX_HEAD_DIM);
    if (c->num_kv_heads == 0 || c->num_heads % c->num_kv_heads)
        return mc_fail(err, MC_ERR_UNSUPPORTED, m->path, "num_key_value_heads",
                       -1, "heads %u not a multiple of kv heads %u",
                       c->num_heads, c->num_kv_heads);
    if (chunk * c->hidden_size > INT_MAX || c->vocab_size >= 0xffffffffu)
        return mc_fail(err, MC_ERR_UNSUPPORTED, m->path, "prefill_chunk", -1,
                       "chunk %llu x hidden %u exceeds the 32-bit counts of "
                       "cuBLAS", (unsigned long long)chunk, c->hidden_size);
    return MC_OK;
}

void rt_cu_free(void *ctx)
{
    rt_cu_backend *s = ctx;
    if (!s)
        return;
    if (s->stream)
        cudaStreamSynchronize(s->stream);
    if (s->blas)
        cublasDestroy(s->blas);
    if (s->dev)
        cudaFree(s->dev);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    (void)cudaGetLastError();
    mc_free(s->layers);
    mc_free(s->kv);
    mc_free(s->tab.ids);
    mc_free(s->tab.pos);
    mc_free(s->tab.rows);
    mc_free(s->tab.segs);
    mc_free(s->tab.index);
    mc_free(s->tab.slot_rope);
    mc_free(s->x_host);
    mc_free(s->logits_host);
    mc_free(s->tok_host);
    mc_free(s->rope_host);
    mc_free(s->slot_inv);
    mc_free(s);
}

static mc_status alloc_host(rt_cu_backend *s, mc_error *err)
{
    const fmt_model_config *c = &s->m->cfg;
    const size_t B = s->layout.limits.max_batch;
    const size_t C = s->layout.limits.prefill_chunk;
    const size_t half = c->head_dim / 2;
    rt_step_tables *t = &s->tab;
    s->layers = mc_calloc(c->num_layers ? c->num_layers : 1, sizeof *s->layers);
    s->kv = mc_calloc((size_t)c->num_layers * B + 1, sizeof *s->kv);
    t->ids = mc_calloc(C, sizeof *t->ids);
    t->pos = mc_calloc(C, sizeof *t->pos);
    t->rows = mc_calloc(2 * C, sizeof *t->rows);
    t->segs = mc_calloc(B, sizeof *t->segs);
    t->index = mc_calloc(c->vocab_size, sizeof(int32_t));
    t->slot_rope = mc_calloc(B, sizeof *t->slot_rope);
    s->x_host = mc_calloc(C * c->hidden_size, sizeof(float));
    s->logits_host = mc_calloc(B * c->vocab_size, sizeof(float));
    s->tok_host = mc_calloc(B, sizeof(int32_t));
    s->rope_host = mc_calloc(half + 1, sizeof(float));
    s->slot_inv = mc_calloc(B * half + 1, sizeof(float));
    if (!s->layers || !s->kv || !t->ids || !t->pos || !t->rows || !t->segs ||
        !t->index || !t->slot_rope || !s->x_host ||
        !s->logits_host || !s->tok_host || !s->rope_host || !s->slot_inv)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "GPU session host tables");
    for (size_t b = 0; b < B; b++) {
        t->slot_rope[b].head_dim = c->head_dim;
        t->slot_rope[b].inv_freq = s->slot_inv + b * half;
        t->slot_rope[b].attn_scale = 1.0f;
    }
    return MC_OK;
}

/* Context, stream, cuBLAS handle: everything the device takes outside our
 * allocation, created before used_before is read. */
static mc_status open_device(rt_cu_backend *s, mc_error *err)
{
    int n = 0;
    kn_cuda_device_count(&n);
    if (n == 0)
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "device", -1,
                       "no CUDA device (driver or GPU absent)");
    if (s->opt.device < 0 || s->opt.device >= n)
        return mc_fail(err, MC_ERR_UNSUPPORTED, NULL, "device", -1,
                       "no CUDA device %d (%d present)", s->opt.device, n);
    cudaError_t e = cudaSetDevice(s->opt.device);
    if (e == cudaSuccess)
        e = cudaFree(0);
    if (e != cudaSuccess)
        return rt_cu_fail(err, "context creation", e);
    e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        s->stream = NULL;
        return rt_cu_fail(err, "cudaStreamCreate", e);
    }
    cublasStatus_t b = cublasCreate(&s->blas);
    if (b != CUBLAS_STATUS_SUCCESS) {
        s->blas = NULL;
        return rt_cu_blas_fail(err, "cublasCreate", b);
    }
    b = cublasSetStream(s->blas, s->stream);
    if (b != CUBLAS_STATUS_SUCCESS)
        return rt_cu_blas_fail(err, "cublasSetStream", b);
    return MC_OK;
}

/* Device views of the arena buffers and of the KV cache. */
static void set_views(rt_cu_backend *s)
{
    const fmt_model_config *c = &s->m->cfg;
    const rt_layout *L = &s->layout;
    const uint32_t B = L->limits.max_batch;
    uint8_t *arena = s->dev + s->plan.arena_off;
#define AT(id) ((void *)(arena + L->buf[id].offset))
    s->d_pos = AT(RT_BUF_POS);
    s->d_x = AT(RT_BUF_X);
    s->d_hx = AT(RT_BUF_HX);
    s->d_logits = AT(RT_BUF_LOGITS);
    s->d_tok = L->buf[RT_BUF_INDEX].bytes >= (uint64_t)B * sizeof(uint32_t)
                   ? AT(RT_BUF_INDEX)
                   : NULL;
    s->d_rope = AT(RT_BUF_ROPE);
    s->d_rope_slot = AT(RT_BUF_ROPE_SLOT);
    s->sc.xb = AT(RT_BUF_XB);
    s->sc.q = AT(RT_BUF_Q);
    s->sc.k = AT(RT_BUF_K);
    s->sc.v = AT(RT_BUF_V);
    s->sc.att = AT(RT_BUF_ATT);
    s->sc.hb = AT(RT_BUF_HB);
    s->sc.hb2 = AT(RT_BUF_HB2);
    s->sc.attn = NULL; /* the CUDA attention needs no scratch */
#undef AT
    const uint64_t kvd = (uint64_t)c->num_kv_heads * c->head_dim;
    for (uint32_t l = 0; l < c->num_layers; l++) {
        uint64_t cap = rt_layout_kv_cap(c, &L->limits, l);
        for (uint32_t b = 0; b < B; b++) {
            kn_kv *kv = &s->kv[(size_t)l * B + b];
            uint8_t *base = arena + rt_layout_kv_offset(L, c, l, b);
            kv->type = KN_KV_F32;
            kv->n_kv_heads = c->num_kv_heads;
            kv->head_dim = c->head_dim;
            kv->cap = cap;
            kv->k = base;
            kv->v = base + cap * kvd * sizeof(float);
            kv->k_scale = kv->v_scale = NULL;
        }
    }
    s->gemm_work = s->dev + s->plan.gemm_off;
    s->gemm_y = (float *)(s->dev + s->plan.gemm_off + s->plan.gemm_work_bytes);
}

/* RoPE tables: the default one on the device; per-slot ones (dynamic NTK)
 * are filled per step by the scheduler and uploaded by rt_cuda_step.c. */
static mc_status init_rope(rt_cu_backend *s, mc_error *err)
{
    const fmt_model_config *c = &s->m->cfg;
    const fmt_rope *r = &c->rope;
    uint64_t orig = r->original_max_pos ? r->original_max_pos
                                        : c->max_position_embeddings;
    if (r->type == FMT_ROPE_DYNAMIC)
        orig = c->max_position_embeddings; /* as rt_cpu.c */
    kn_rope_init((int)r->type, r->theta, r->factor, r->low_freq_factor,
                 r->high_freq_factor, orig, r->beta_fast, r->beta_slow,
                 r->attention_factor, c->head_dim, 0, s->rope_host,
                 &s->rope_scale);
    cudaError_t e = cudaMemcpy(s->d_rope, s->rope_host,
                               (c->head_dim / 2) * sizeof(float),
                               cudaMemcpyHostToDevice);
    return e == cudaSuccess ? MC_OK : rt_cu_fail(err, "RoPE upload", e);
}

/* Every shape a request can launch, once: matvec for 1..8 rows, the gemm
 * buckets of every distinct matrix shape, then one real greedy step (the
 * norm, RoPE, KV copy, attention, SiLU, axpy, argmax kernels). */
static mc_status warm_up(rt_cu_backend *s, mc_error *err)
{
    const rt_layer *l0 = &s->layers[0];
    const size_t C = s->layout.limits.prefill_chunk;
    const size_t B = s->layout.limits.max_batch;
    mc_status st;
    for (size_t t = 1; t <= KN_CUDA_MATVEC_MAX_T && t <= C; t++)
        if ((st = rt_cu_matmul(s, &l0->w.wq, s->sc.xb, t, s->sc.q, NULL, C,
                               err)))
            return st;
    uint64_t min = s->opt.gemm_min_rows > 9 ? s->opt.gemm_min_rows : 9;
    if (uses_gemm(&s->opt, C)) {
        const kn_block_weights *w = &l0->w;
        for (size_t T = min; T <= C;) {
            size_t Tp = gemm_bucket(T, C);
            if ((st = rt_cu_matmul(s, &w->wq, s->sc.xb, Tp, s->sc.q, NULL, C, err)) ||
                (st = rt_cu_matmul(s, &w->wk, s->sc.xb, Tp, s->sc.k, NULL, C, err)) ||
                (st = rt_cu_matmul(s, &w->wv, s->sc.xb, Tp, s->sc.v, NULL, C, err)) ||
                (st = rt_cu_matmul(s, &w->wo, s->sc.att, Tp, s->sc.xb, NULL, C, err)) ||
                (st = rt_cu_matmul(s, &w->w_gate, s->sc.xb, Tp, s->sc.hb, NULL, C, err)) ||
                (st = rt_cu_matmul(s, &w->w_up, s->sc.xb, Tp, s->sc.hb2, NULL, C, err)) ||
                (st = rt_cu_matmul(s, &w->w_down, s->sc.hb, Tp, s->sc.xb, NULL, C, err)))
                return st;
            T = Tp + 1;
        }
    }
    if (uses_gemm(&s->opt, B))
        for (size_t T = min; T <= B;) {
            size_t Tp = gemm_bucket(T, B);
            if ((st = rt_cu_matmul(s, &s->lm_head, s->d_hx, Tp, s->d_logits,
                                   NULL, B, err)))
                return st;
            T = Tp + 1;
        }
    cudaError_t e = cudaStreamSynchronize(s->stream);
    return e == cudaSuccess ? MC_OK : rt_cu_fail(err, "warm-up", e);
}

/* One real greedy step through the scheduler (the norm, RoPE, KV copy,
 * attention, SiLU, axpy, argmax kernels), then the memory after load. */
static mc_status warm_up_step(rt_session *ss, rt_cu_backend *s, int run,
                              mc_error *err)
{
    if (run) {
        int32_t tok0 = 0, out1[1];
        rt_prompt pr = {.ids = &tok0, .n = 1};
        rt_gen_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_new_tokens = s->layout.limits.max_seq > 1 ? 1 : 0;
        rt_gen_result res = {.ids = out1};
        mc_status st = rt_session_generate(ss, &pr, 1, &gp, &res, err);
        if (st)
            return st;
        rt_session_reset_stats(ss);
    }
    size_t f2 = 0, total = 0;
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&f2, &total);
    if (e != cudaSuccess)
        return rt_cu_fail(err, "after load", e);
    s->mem.load_growth_bytes =
        (int64_t)(s->mem.device_total_bytes - s->mem.used_before_bytes -
                  s->mem.alloc_delta_bytes) - (int64_t)f2;
    s->mem.used_after_load_bytes = total - f2;
    return MC_OK;
}

mc_status rt_cum_session_create(const rt_model *model, const rt_limits *lim,
                                 const rt_layout *layout,
                                 const rt_cuda_options *o,
                                 rt_session **out, mc_error *err)
{
    *out = NULL;
    if (!model || !lim)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, NULL, -1,
                       "rt_cuda_session_create: NULL model or limits");
    rt_layout L;
    mc_status st = resolve_layout(model, lim, layout, &L, err);
    if (st || (st = check_supported(model, &L, err)))
        return st;
    rt_cu_backend *s = mc_calloc(1, sizeof *s);
    if (!s)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "GPU session");
    s->m = model;
    s->layout = L;
    if (o)
        s->opt = *o;
    else
        rt_cuda_options_default(&s->opt);
    if ((st = rt_cuda_plan_for(model, &L, &s->opt, &s->plan, err)) ||
        (st = alloc_host(s, err)) || (st = open_device(s, err)))
        goto fail;
    if (s->plan.gemm_staging_bytes &&
        kn_cuda_gemm_work_bytes(&model->lm_head, 1) !=
            gemm_work_for(model->lm_head.rows, model->lm_head.cols, 1)) {
        st = mc_fail(err, MC_ERR_CUDA, NULL, "gemm", -1,
                     "kn_cuda_gemm_work_bytes disagrees with the staging "
                     "formula of rt_cuda.c: update gemm_work_for");
        goto fail;
    }

    size_t f0 = 0, f1 = 0, total = 0;
    cudaError_t e = cudaMemGetInfo(&f0, &total);
    if (e != cudaSuccess) {
        st = rt_cu_fail(err, "cudaMemGetInfo", e);
        goto fail;
    }
    s->mem.device_total_bytes = total;
    s->mem.used_before_bytes = total - f0;
    e = cudaMalloc((void **)&s->dev, (size_t)s->plan.total_bytes);
    if (e != cudaSuccess) {
        s->dev = NULL;
        (void)cudaGetLastError();
        st = mc_fail(err, MC_ERR_NOMEM, model->path, "device", -1,
                     "needs %.2f GiB on the GPU (weights %.2f, arena %.2f "
                     "[KV %.2f], cuBLAS workspace %.2f, gemm staging %.2f); "
                     "%.2f GiB free of %.2f (%s)",
                     s->plan.total_bytes / 1073741824.0,
                     s->plan.weights_bytes / 1073741824.0,
                     s->plan.arena_bytes / 1073741824.0,
                     L.kv_bytes / 1073741824.0,
                     s->plan.cublas_workspace_bytes / 1073741824.0,
                     s->plan.gemm_staging_bytes / 1073741824.0,
                     f0 / 1073741824.0, total / 1073741824.0,
                     cudaGetErrorString(e));
        goto fail;
    }
    if ((e = cudaMemGetInfo(&f1, &total)) != cudaSuccess) {
        st = rt_cu_fail(err, "cudaMemGetInfo", e);
        goto fail;
    }
    s->mem.alloc_delta_bytes = f0 > f1 ? f0 - f1 : 0;

    cublasStatus_t b = cublasSetWorkspace(s->blas, s->dev + s->plan.cublas_off,
                                          (size_t)s->plan.cublas_workspace_bytes);
    if (b != CUBLAS_STATUS_SUCCESS) {
        st = rt_cu_blas_fail(err, "cublasSetWorkspace", b);
        goto fail;
    }
    wput w = {.base = s->dev + s->plan.weights_off};
    put_weights(&w, model, s->layers, &s->lm_head, &s->final_norm);
    if (w.failed) {
        st = rt_cu_fail(err, "weight upload", (cudaError_t)w.cuda_error);
        goto fail;
    }
    /* on the session's stream: a non-blocking stream does not wait for
     * work on the legacy default stream */
    e = cudaMemsetAsync(s->dev + s->plan.arena_off, 0,
                        (size_t)s->plan.arena_bytes, s->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s->stream);
    if (e != cudaSuccess) {
        st = rt_cu_fail(err, "arena clear", e);
        goto fail;
    }
    set_views(s);
    if ((st = init_rope(s, err)))
        goto fail;
    if (s->opt.warm_up && (st = warm_up(s, err)))
        goto fail;
    rt_backend be = {.i = &rt_cu_backend_i, .ctx = s, .layout = L,
                     .tab = s->tab, .host_arena = NULL};
    if ((st = rt_session_create_backend(model, &be, out, err)))
        return st; /* s freed with be */
    if ((st = warm_up_step(*out, s, s->opt.warm_up, err))) {
        rt_session_free(*out);
        *out = NULL;
        return st;
    }
    return MC_OK;
fail:
    rt_cu_free(s);
    return st;
}

/* The CUDA context of a session, NULL when it runs elsewhere. */
static const rt_cu_backend *cuda_of(const rt_session *ss)
{
    const rt_backend *b = ss ? rt_session_backend(ss) : NULL;
    return b && b->i == &rt_cu_backend_i ? b->ctx : NULL;
}

const rt_cuda_plan *rt_cum_session_plan(const rt_session *ss)
{
    const rt_cu_backend *s = cuda_of(ss);
    return s ? &s->plan : NULL;
}

void rt_cum_session_memory(const rt_session *ss, rt_cuda_mem *out)
{
    const rt_cu_backend *s = cuda_of(ss);
    if (s)
        *out = s->mem;
    else
        memset(out, 0, sizeof *out);
}

#endif /* MC_CUDA_MODULE */
