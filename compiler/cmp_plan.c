/* cmp_plan.c - memory planner (see cmp_plan.h): the weight-format policy,
 * the per-tensor byte arithmetic, the frontier search and the plan's JSON. */
#include "cmp_plan.h"
#include "cmp_rotate.h"
#include "fmt_artifact.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mc_alloc.h"
#include "mc_checked.h"
#include "rt_plan.h"

#define GIB 1073741824.0

mc_status cmp_wpolicy_parse(const char *quant, uint32_t group,
                            cmp_wpolicy *out, mc_error *err)
{
    memset(out, 0, sizeof *out);
    if (group == 0)
        group = 128;
    if (group != 32 && group != 64 && group != 128)
        return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--group", -1,
                       "int4 group must be 32, 64 or 128 (got %u)", group);
    static const struct {
        const char *name;
        kn_wformat f;
    } q[] = {{"f32", KN_W_F32},   {"f16", KN_W_F16}, {"bf16", KN_W_BF16},
             {"int8", KN_W_Q8},   {"int4", KN_W_Q4},
             {"int4-sym", KN_W_Q4S}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        if (strcmp(quant, q[i].name) == 0) {
            snprintf(out->quant, sizeof out->quant, "%s", q[i].name);
            out->linear = q[i].f;
            out->group = group; /* also an int4 --lm-head's */
            return MC_OK;
        }
    }
    return mc_fail(err, MC_ERR_INVALID_ARG, NULL, "--quant", -1,
                   "unknown --quant '%s' (f32, f16, bf16, int8, int4, "
                   "int4-sym)", quant);
}

uint32_t cmp_wpolicy_linear_group(const cmp_wpolicy *p)
{
    return p->linear == KN_W_Q4 || p->linear == KN_W_Q4S ? p->group : 0;
}

int cmp_plan_untie_for_rotation(fmt_model_config *cfg, cmp_wpolicy *p,
                                int float32_source)
{
    if (!cfg->tie_word_embeddings || !cmp_rotation_applies(cfg->hidden_size))
        return 0;
    cfg->tie_word_embeddings = 0;
    /* Quantized linears: the untied output layer takes the untied rule's
     * int8 (role_format), not a hidden float copy of vocab x hidden (issue
     * 17: 279 MB against RTN int8's 166 MB on SmolLM2-135M); --lm-head
     * chooses otherwise. */
    if (p->linear == KN_W_Q8 || p->linear == KN_W_Q4 || p->linear == KN_W_Q4S ||
        strcmp(p->quant, "auto") == 0)
        return 1;
    /* Rounding a float32 checkpoint's output layer to f16 moves near-tied
     * logits consistently (stories260k: top-1 93.0 % -> 91.6 % at the same
     * KLD); the embeddings' format is kept otherwise. */
    p->lm_head_float = 1;
    if (float32_source && !p->lm_head_set) {
        p->lm_head_set = 1;
        p->lm_head_fmt = KN_W_F32;
    }
    return 1;
}

/* THE policy: which format each role gets (see cmp_plan.h). */
static kn_wformat role_format(const cmp_wpolicy *p, cmp_role role, int tied)
{
    kn_wformat embed = p->linear == KN_W_F32    ? KN_W_F32
                       : p->linear == KN_W_BF16 ? KN_W_BF16
                                                : KN_W_F16;
    int qlin = p->linear == KN_W_Q8 || p->linear == KN_W_Q4 ||
               p->linear == KN_W_Q4S;
    switch (role) {
    case CMP_ROLE_LINEAR: return p->linear;
    case CMP_ROLE_EMBED:
        /* Tied, the embedding is the output layer, read whole at every
         * decode step: int8 per row with quantized linears (SmolLM-135M
         * int8: 57 of 163 MB a step in f16); --lm-head chooses otherwise. */
        if (tied && p->lm_head_set)
            return p->lm_head_fmt;
        return tied && qlin ? KN_W_Q8 : embed;
    case CMP_ROLE_LM_HEAD:
        if (!tied && p->lm_head_set)
            return p->lm_head_fmt;
        if (tied || p->lm_head_float)
            return embed;
        return qlin ? KN_W_Q8 : embed;
    default: return KN_W_F32;
    }
}

kn_wformat cmp_plan_role_format(const cmp_wpolicy *p, cmp_role role,
                                int tied)
{
    return role_format(p, role, tied);
}

typedef struct tlist {
    cmp_tensor_plan *t;
    size_t n, cap;
    const cmp_wpolicy *p;
    int tied;
    int ok;
    size_t nlin;             /* linears added so far (index into linear_fmt) */
} tlist;

static void add(tlist *L, cmp_role role, int ndim, uint32_t rows,
                uint32_t cols, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void add(tlist *L, cmp_role role, int ndim, uint32_t rows,
                uint32_t cols, const char *fmt, ...)
{
    if (!L->ok)
        return;
    if (L->n == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 64;
        cmp_tensor_plan *nt = mc_realloc(L->t, nc * sizeof *nt);
        if (!nt) {
            L->ok = 0;
            return;
        }
        L->t = nt;
        L->cap = nc;
    }
    cmp_tensor_plan *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->role = role;
    t->ndim = ndim;
    t->rows = rows;
    t->cols = cols;
    t->fmt = role_format(L->p, role, L->tied);
    if (role == CMP_ROLE_LINEAR && L->p->linear_fmt)
        t->fmt = L->p->linear_fmt[L->nlin]; /* listed in slot order */
    if (role == CMP_ROLE_LINEAR)
        L->nlin++;
    t->group = (t->fmt == KN_W_Q4 || t->fmt == KN_W_Q4S) ? L->p->group : 0;
    t->data_bytes = kn_wformat_data_bytes(t->fmt, rows, cols);
    t->scale_bytes = kn_wformat_scale_bytes(t->fmt, rows, cols, t->group);
    t->zero_bytes = kn_wformat_zero_bytes(t->fmt, rows, cols, t->group);
    uint64_t end = t->data_bytes;
    t->data_off = 0;
    if (t->scale_bytes) {
        mc_align_up_u64(end, 64, &t->scale_off);
        end = t->scale_off + t->scale_bytes;
    }
    if (t->zero_bytes) {
        mc_align_up_u64(end, 64, &t->zero_off);
        end = t->zero_off + t->zero_bytes;
    }
    t->section_bytes = end;
}

mc_status cmp_plan_tensors(const fmt_model_config *c, const cmp_wpolicy *p,
                           cmp_tensor_plan **out, size_t *n, mc_error *err)
{
    *out = NULL;
    *n = 0;
    tlist L = {NULL, 0, 0, p, c->tie_word_embeddings, 1, 0};
    const uint32_t H = c->hidden_size, V = c->vocab_size,
                   F = c->intermediate_size;
    const uint32_t QD = (uint32_t)fmt_config_q_dim(c),
                   KD = (uint32_t)fmt_config_kv_dim(c);
    add(&L, CMP_ROLE_EMBED, 2, V, H, "model.embed_tokens.weight");
    for (uint32_t l = 0; l < c->num_layers; l++) {
        const char *pre = "model.layers";
        add(&L, CMP_ROLE_NORM, 1, 1, H, "%s.%u.input_layernorm.weight", pre, l);
        static const char *const qkv[] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) {
            uint32_t rows = i == 0 ? QD : KD;
            add(&L, CMP_ROLE_LINEAR, 2, rows, H, "%s.%u.self_attn.%s_proj.weight",
                pre, l, qkv[i]);
            if (c->qkv_bias)
                add(&L, CMP_ROLE_BIAS, 1, 1, rows,
                    "%s.%u.self_attn.%s_proj.bias", pre, l, qkv[i]);
        }
        add(&L, CMP_ROLE_LINEAR, 2, H, QD, "%s.%u.self_attn.o_proj.weight", pre,
            l);
        if (c->o_bias)
            add(&L, CMP_ROLE_BIAS, 1, 1, H, "%s.%u.self_attn.o_proj.bias", pre,
                l);
        add(&L, CMP_ROLE_NORM, 1, 1, H,
            "%s.%u.post_attention_layernorm.weight", pre, l);
        static const char *const mlp[] = {"gate", "up", "down"};
        for (int i = 0; i < 3; i++) {
            uint32_t rows = i == 2 ? H : F, cols = i == 2 ? F : H;
            add(&L, CMP_ROLE_LINEAR, 2, rows, cols, "%s.%u.mlp.%s_proj.weight",
                pre, l, mlp[i]);
            if (c->mlp_bias)
                add(&L, CMP_ROLE_BIAS, 1, 1, rows, "%s.%u.mlp.%s_proj.bias",
                    pre, l, mlp[i]);
        }
    }
    add(&L, CMP_ROLE_NORM, 1, 1, H, "model.norm.weight");
    if (!c->tie_word_embeddings)
        add(&L, CMP_ROLE_LM_HEAD, 2, V, H, "lm_head.weight");
    if (!L.ok) {
        mc_free(L.t);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "out of memory");
    }
    *out = L.t;
    *n = L.n;
    return MC_OK;
}

uint64_t cmp_plan_weight_bytes(const cmp_tensor_plan *t, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += t[i].data_bytes + t[i].scale_bytes + t[i].zero_bytes;
    return s;
}

uint64_t cmp_plan_map_tail_bytes(const cmp_tensor_plan *t, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += (FMT_ART_ALIGN - t[i].section_bytes % FMT_ART_ALIGN) %
             FMT_ART_ALIGN;
    return s;
}

uint64_t cmp_plan_param_count(const fmt_model_config *c)
{
    const uint64_t H = c->hidden_size, V = c->vocab_size,
                   F = c->intermediate_size, QD = fmt_config_q_dim(c),
                   KD = fmt_config_kv_dim(c);
    uint64_t per = 2 * H + QD * H + 2 * KD * H + H * QD + 3 * H * F;
    if (c->qkv_bias)
        per += QD + 2 * KD;
    if (c->o_bias)
        per += H;
    if (c->mlp_bias)
        per += 2 * F + H;
    return V * H + c->num_layers * per + H +
           (c->tie_word_embeddings ? 0 : V * H);
}

void cmp_plan_request_default(cmp_plan_request *r)
{
    memset(r, 0, sizeof *r);
    cmp_wpolicy_parse("f16", 0, &r->policy, NULL);
    r->kv_type = KN_KV_F16;
    r->device = CMP_DEV_CPU;
    r->reserve_bytes = -1;
}

static void limits_for(const cmp_plan_request *req, uint32_t batch,
                       uint64_t seq, rt_limits *lim)
{
    memset(lim, 0, sizeof *lim);
    lim->max_batch = batch;
    lim->max_seq = seq;
    uint32_t chunk = req->prefill_chunk ? req->prefill_chunk
                                        : CMP_PLAN_DEFAULT_CHUNK;
    /* A step never holds more rows than batch x max_seq tokens: a larger
     * default chunk would only plan activations nothing can fill. */
    if (!req->prefill_chunk && (uint64_t)batch * seq < chunk)
        chunk = (uint32_t)((uint64_t)batch * seq);
    lim->prefill_chunk = chunk < batch ? batch : chunk;
    lim->kv_type = req->kv_type;
    lim->threads = req->threads > 0 ? req->threads : CMP_PLAN_DEFAULT_THREADS;
}

uint64_t cmp_plan_cpu_reserve(const fmt_model_config *cfg, size_t n_tensors,
                              uint32_t threads, uint64_t tokenizer_bytes)
{
    /* float32 copies of the norms and biases (rt_artifact.c's loader) */
    const uint64_t H = cfg->hidden_size, F = cfg->intermediate_size;
    const uint64_t QD = fmt_config_q_dim(cfg), KD = fmt_config_kv_dim(cfg);
    uint64_t per = 2 * H + (cfg->qkv_bias ? QD + 2 * KD : 0) +
                   (cfg->o_bias ? H : 0) + (cfg->mlp_bias ? 2 * F + H : 0);
    uint64_t r = CMP_CPU_BASE_BYTES, t;
    if (!mc_mul_u64(per, cfg->num_layers, &t) || !mc_add_u64(t, H, &t) ||
        !mc_mul_u64(t, 4, &t) || !mc_add_u64(r, t, &r) ||
        !mc_mul_u64(n_tensors, CMP_CPU_TENSOR_BYTES, &t) ||
        !mc_add_u64(r, t, &r) ||
        !mc_add_u64(r, (uint64_t)threads * CMP_CPU_THREAD_BYTES, &r) ||
        !mc_mul_u64(tokenizer_bytes, CMP_CPU_TOKENIZER_PER_BYTE_X2, &t) ||
        !mc_add_u64(r, t / 2, &r))
        return UINT64_MAX;
    return r;
}

uint64_t cmp_plan_tokenizer_bytes(const char *dir)
{
    char path[4096];
    struct stat st;
    if (!dir || snprintf(path, sizeof path, "%s/tokenizer.json", dir) >=
                    (int)sizeof path)
        return 0;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size
                                                       : 0;
}

uint64_t cmp_plan_job_bytes(const cmp_plan_request *req, uint64_t max_seq)
{
    rt_job_budget jb;
    /* CUDA: host memory, while the target bounds the device's.  With
     * --reserve the user states all the host takes beside weights and
     * arena (a target sized for the weights alone stays so). */
    if (req->device == CMP_DEV_CUDA || req->reserve_bytes >= 0)
        return 0;
    if (rt_plan_job_budget(RT_JOB_DEFAULT_LINE_BYTES, RT_JOB_DEFAULT_HOLD_BYTES,
                           max_seq, &jb, NULL) != MC_OK)
        return UINT64_MAX;
    return jb.total_bytes;
}

uint64_t cmp_plan_total_for(const fmt_model_config *cfg,
                            const cmp_plan_request *req, uint64_t weights,
                            uint64_t reserve, uint32_t batch, uint64_t max_seq)
{
    rt_limits lim;
    rt_layout lay;
    limits_for(req, batch, max_seq, &lim);
    if (rt_layout_build(cfg, &lim, &lay, NULL) != MC_OK)
        return 0;
    uint64_t t, job = cmp_plan_job_bytes(req, lay.limits.max_seq);
    if (job == UINT64_MAX || !mc_add_u64(weights, lay.arena_bytes, &t) ||
        !mc_add_u64(t, reserve, &t) || !mc_add_u64(t, job, &t))
        return 0;
    return t;
}

static int fits_at(const fmt_model_config *cfg, const cmp_plan_request *req,
                   uint64_t w, uint64_t r, uint32_t b, uint64_t s)
{
    uint64_t t = cmp_plan_total_for(cfg, req, w, r, b, s);
    return t != 0 && t <= req->target_bytes;
}

/* Longest max_seq (<= cap) that fits at batch b; 0 if none. */
static uint64_t max_seq_at(const fmt_model_config *cfg,
                           const cmp_plan_request *req, uint64_t w, uint64_t r,
                           uint32_t b, uint64_t cap)
{
    if (!fits_at(cfg, req, w, r, b, 1))
        return 0;
    uint64_t lo = 1, hi = cap; /* lo fits */
    if (fits_at(cfg, req, w, r, b, hi))
        return hi;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (fits_at(cfg, req, w, r, b, mid))
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static mc_status fill(const fmt_model_config *cfg, const cmp_plan_request *req,
                      uint32_t batch, uint64_t seq, cmp_plan *p, mc_error *err)
{
    limits_for(req, batch, seq, &p->limits);
    mc_status st = rt_layout_build(cfg, &p->limits, &p->layout, err);
    if (st != MC_OK)
        return st;
    p->limits = p->layout.limits;
    p->kv_bytes = p->layout.kv_bytes;
    p->activation_bytes = p->layout.activation_bytes;
    p->arena_bytes = p->layout.arena_bytes;
    const rt_buffer *b = p->layout.buf;
    p->logits_bytes = b[RT_BUF_LOGITS].bytes + b[RT_BUF_HX].bytes;
    p->sampler_bytes = b[RT_BUF_PROBS].bytes + b[RT_BUF_INDEX].bytes;
    p->workspace_bytes = b[RT_BUF_ATTN_SCRATCH].bytes;
    p->total_bytes = p->weights_bytes + p->arena_bytes + p->reserve_bytes;
    /* The dataset job's default buffers must fit beside the session: a
     * job on this artifact with default options is then never refused. */
    p->job_bytes = cmp_plan_job_bytes(&p->req, p->limits.max_seq);
    p->fits = p->job_bytes != UINT64_MAX &&
              p->job_bytes <= p->target_bytes &&
              p->total_bytes <= p->target_bytes - p->job_bytes;
    return MC_OK;
}

mc_status cmp_plan_build(const fmt_model_config *cfg,
                         const cmp_plan_request *req, cmp_plan *out,
                         mc_error *err)
{
    memset(out, 0, sizeof *out);
    out->req = *req;
    cmp_tensor_plan *t = NULL;
    size_t nt = 0;
    mc_status st = cmp_plan_tensors(cfg, &req->policy, &t, &nt, err);
    if (st != MC_OK)
        return st;
    out->weights_bytes = cmp_plan_weight_bytes(t, nt);
    const uint64_t tails = cmp_plan_map_tail_bytes(t, nt);
    mc_free(t); /* nt, the tensor count, stays: the reserve counts it */
    out->params = cmp_plan_param_count(cfg);
    out->kv_bytes_per_token = rt_layout_kv_bytes_per_token(cfg, req->kv_type);
    if (req->reserve_bytes >= 0) {
        out->reserve_bytes = (uint64_t)req->reserve_bytes;
        out->reserve_source = "--reserve";
    } else if (req->device == CMP_DEV_CUDA) {
        out->reserve_bytes = CMP_CUDA_CONTEXT_BYTES + CMP_CUBLAS_WORKSPACE_BYTES;
        out->reserve_source = "cuda default (context + cuBLAS workspace)";
    } else {
        rt_limits lim;
        limits_for(req, 1, 1, &lim); /* the thread count the plan stores */
        out->reserve_bytes = cmp_plan_cpu_reserve(
            cfg, nt, (uint32_t)lim.threads, req->tokenizer_bytes);
        out->reserve_source = "cpu (calibrated: code, stacks, manifest, "
                              "norms, tokenizer; exact: page tails)";
        /* The weights are read through a mapping of the artifact: each
         * section's last page is resident whole.  int8/int4 sections
         * (codes + scales) rarely end on a page: 0.58 MB on the SmolLM
         * shape's 272, which put peak RSS over the plan before. */
        if (out->reserve_bytes == UINT64_MAX ||
            !mc_add_u64(out->reserve_bytes, tails, &out->reserve_bytes))
            out->reserve_bytes = UINT64_MAX;
        if (out->reserve_bytes == UINT64_MAX)
            return mc_fail(err, MC_ERR_OVERFLOW, NULL, "reserve", -1,
                           "the CPU reserve overflows 64 bits");
    }
    out->target_bytes = req->target_bytes;
    const uint64_t W = out->weights_bytes, R = out->reserve_bytes;
    uint64_t maxpos = cfg->max_position_embeddings ? cfg->max_position_embeddings
                                                   : 4096;

    /* Frontier: batch 1, 2, 4, ... 1024 while something fits. */
    for (uint32_t b = 1; b <= 1024 && out->nfrontier < CMP_PLAN_MAX_FRONTIER;
         b *= 2) {
        uint64_t s = max_seq_at(cfg, req, W, R, b, maxpos);
        if (s == 0)
            break;
        out->frontier[out->nfrontier++] = (cmp_frontier_point){b, s};
    }

    uint32_t batch = req->max_batch;
    uint64_t seq = req->max_seq;
    out->chosen = !(batch && seq);
    if (!seq && !batch) {
        seq = maxpos < 4096 ? maxpos : 4096;
        batch = 0;
        for (uint32_t b = 64; b >= 1 && !batch; b--)
            if (fits_at(cfg, req, W, R, b, seq))
                batch = b;
        if (!batch) {
            batch = 1;
            uint64_t s = max_seq_at(cfg, req, W, R, 1, seq);
            seq = s ? s : 1;
        }
    } else if (!batch) {
        batch = 1;
        for (uint32_t b = 64; b >= 1; b--)
            if (fits_at(cfg, req, W, R, b, seq)) {
                batch = b;
                break;
            }
    } else if (!seq) {
        uint64_t s = max_seq_at(cfg, req, W, R, batch, maxpos);
        seq = s ? s : 1;
    }
    st = fill(cfg, req, batch, seq, out, err);
    if (st != MC_OK)
        return st;
    if (!out->fits) {
        char bd[256];
        cmp_plan_breakdown(out, bd, sizeof bd);
        return mc_fail(err, MC_ERR_PLAN, NULL, "--target", -1,
                       "batch %u x context %llu does not fit: %s", batch,
                       (unsigned long long)seq, bd);
    }
    return MC_OK;
}

const char *cmp_plan_breakdown(const cmp_plan *p, char *buf, size_t n)
{
    char job[48] = "";
    if (p->job_bytes && p->job_bytes != UINT64_MAX)
        snprintf(job, sizeof job, ", dataset job %.2f", p->job_bytes / GIB);
    snprintf(buf, n,
             "needs %.2f GiB: weights %.2f, KV %.2f, activations %.2f, "
             "reserve %.2f%s; target %.2f",
             (p->total_bytes + (job[0] ? p->job_bytes : 0)) / GIB,
             p->weights_bytes / GIB, p->kv_bytes / GIB,
             p->activation_bytes / GIB, p->reserve_bytes / GIB, job,
             p->target_bytes / GIB);
    return buf;
}

const char *cmp_plan_dominant(const cmp_plan *p, char *buf, size_t n)
{
    struct {
        const char *what;
        uint64_t bytes;
        const char *hint;
    } parts[] = {
        {"weights", p->weights_bytes,
         "a smaller --quant (int8, int4) shrinks them"},
        {"the KV cache", p->kv_bytes,
         "fewer --max-seq or --max-batch, or --kv int8, shrink it"},
        {"activations", p->activation_bytes,
         "a smaller --prefill-chunk or batch shrinks them"},
        {"the device reserve", p->reserve_bytes, "see --reserve"},
    };
    size_t best = 0;
    for (size_t i = 1; i < 4; i++)
        if (parts[i].bytes > parts[best].bytes)
            best = i;
    double share = p->total_bytes ? 100.0 * parts[best].bytes / p->total_bytes
                                  : 0;
    snprintf(buf, n, "%s dominate%s: %.1f%% of the total; %s",
             parts[best].what, best == 1 || best == 3 ? "s" : "", share,
             parts[best].hint);
    return buf;
}

static json_t *u64j(uint64_t v) { return json_integer((json_int_t)v); }

json_t *cmp_plan_to_json(const cmp_plan *p)
{
    json_t *o = json_object();
    json_t *fr = json_array();
    if (!o || !fr) {
        json_decref(o);
        json_decref(fr);
        return NULL;
    }
    int bad = 0;
    for (size_t i = 0; i < p->nfrontier; i++)
        bad |= json_array_append_new(fr, json_pack("{s:I, s:I}", "batch",
                                            (json_int_t)p->frontier[i].batch,
                                            "max_seq",
                                            (json_int_t)p->frontier[i].max_seq));
    /* The keys a session depends on: rt_plan.h owns them. */
    const rt_plan stored = {.layout = p->layout,
                            .weights_bytes = p->weights_bytes,
                            .reserve_bytes = p->reserve_bytes,
                            .total_bytes = p->total_bytes,
                            .cuda = p->req.device == CMP_DEV_CUDA,
                            .target_bytes = p->target_bytes};
    bad |= rt_plan_to_json(&stored, o);
    /* The planner's report. */
    bad |= json_object_set_new(o, "params", u64j(p->params));
    bad |= json_object_set_new(o, "kv_bytes_per_token", u64j(p->kv_bytes_per_token));
    bad |= json_object_set_new(o, "logits_bytes", u64j(p->logits_bytes));
    bad |= json_object_set_new(o, "sampler_bytes", u64j(p->sampler_bytes));
    bad |= json_object_set_new(o, "workspace_bytes", u64j(p->workspace_bytes));
    bad |= json_object_set_new(o, "reserve_source", json_string(p->reserve_source));
    bad |= json_object_set_new(o, "job_bytes", u64j(p->job_bytes));
    bad |= json_object_set_new(o, "quant", json_string(p->req.policy.quant));
    bad |= json_object_set_new(o, "group",
                               u64j(cmp_wpolicy_linear_group(&p->req.policy)));
    bad |= json_object_set_new(o, "fits", json_boolean(p->fits));
    bad |= json_object_set_new(o, "chosen", json_boolean(p->chosen));
    bad |= json_object_set_new(o, "frontier", fr);
    if (bad) { /* an allocation failed: no partial plan */
        json_decref(o);
        return NULL;
    }
    return o;
}

int cmp_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return -1;
    char *end = NULL;
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    /* plain decimal only: strtod would also take hex ("0x1p4") */
    if (!isdigit((unsigned char)*p) && *p != '.')
        return -1;
    size_t span = strspn(p, "0123456789.");
    double v = strtod(p, &end);
    if (end == p || end != p + span || !isfinite(v) || v < 0)
        return -1;
    int is_int = 1;
    for (const char *q = p; q < end; q++)
        if (!isdigit((unsigned char)*q))
            is_int = 0;
    while (isspace((unsigned char)*end))
        end++;
    double mult = 1;
    char u = (char)toupper((unsigned char)*end);
    if (u == 'K' || u == 'M' || u == 'G' || u == 'T') {
        mult = u == 'K' ? 1024.0 : u == 'M' ? 1048576.0
               : u == 'G' ? GIB : GIB * 1024.0;
        end++;
        if (toupper((unsigned char)end[0]) == 'I' &&
            toupper((unsigned char)end[1]) == 'B')
            end += 2;
        else if (toupper((unsigned char)end[0]) == 'B')
            end++;
    } else if (u == 'B') {
        end++;
    }
    if (*end != '\0')
        return -1;
    if (mult == 1 && is_int) { /* exact for plain byte counts */
        errno = 0;
        unsigned long long x = strtoull(p, NULL, 10);
        if (errno)
            return -1;
        *out = x;
        return 0;
    }
    double b = v * mult;
    if (b >= 18446744073709551615.0)
        return -1;
    *out = (uint64_t)llround(b);
    return 0;
}
