/* rt_artifact.c - an mcompile artifact as an rt_model (see rt_artifact.h). */
#include "rt_artifact.h"
#include "rt_plan.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fmt_artifact.h"
#include "fmt_mapguard.h"
#include "kn_cpus.h"
#include "kn_pack16.h"
#include "kn_qdot.h"
#include "mc_alloc.h"
#include "mc_checked.h"

typedef struct art_owner {
    fmt_art *a;
    uint8_t *zbuf;            /* decompressed zstd sections, one block */
    const uint8_t **base;     /* [nsections] raw bytes of each section */
    uint8_t *packed;          /* int4-sym and int8 matrices in 16-row panels
                                 (pack_for_cpu), one block, or NULL */
} art_owner;

static void owner_free(void *p)
{
    art_owner *o = p;
    if (!o)
        return;
    fmt_art_close(o->a);
    mc_free(o->zbuf);
    mc_free(o->packed);
    mc_free((void *)o->base);
    mc_free(o);
}

int rt_artifact_is(const char *path)
{
    return fmt_art_is_artifact(path);
}

const char *rt_artifact_tokenizer(const rt_model *m, size_t *len)
{
    if (!m || m->owner_free != owner_free)
        return NULL;
    const art_owner *o = m->owner;
    size_t i = fmt_art_find_section(o->a, "tokenizer");
    if (i == (size_t)-1)
        return NULL;
    if (len)
        *len = (size_t)fmt_art_section_at(o->a, i)->raw_bytes;
    return (const char *)o->base[i];
}

typedef struct loader {
    const char *path;
    art_owner *o;
    rt_model *m;
    float *next;              /* next free float of m->owned */
    float *owned_end;
    uint8_t *taken;           /* [tensors]: 1 once the config took it */
} loader;

/* Mark t (found by name) as taken by the config. */
static void take(loader *L, const fmt_art_tensor *t)
{
    L->taken[t - fmt_art_tensor_at(L->o->a, 0)] = 1;
}

static mc_status get_matrix(loader *L, const char *name, uint32_t rows,
                            uint32_t cols, kn_matrix *out, mc_error *err)
{
    const fmt_art_tensor *t = fmt_art_find_tensor(L->o->a, name);
    if (!t)
        return mc_fail(err, MC_ERR_NOT_FOUND, L->path, name, -1,
                       "tensor '%s' is missing from the artifact", name);
    take(L, t);
    kn_wformat f;
    if (t->ndim != 2 || t->rows != rows || t->cols != cols ||
        kn_wformat_parse(t->format, &f) != 0)
        return mc_fail(err, MC_ERR_SHAPE, L->path, name, -1,
                       "tensor '%s' is [%llu, %llu] %s; expected [%u, %u]",
                       name, (unsigned long long)t->rows,
                       (unsigned long long)t->cols, t->format, rows, cols);
    uint32_t g = t->group;
    int q4 = f == KN_W_Q4 || f == KN_W_Q4S;
    if (q4 ? (g == 0 || g > 4096) : g != 0)
        return mc_fail(err, MC_ERR_FORMAT, L->path, name, -1,
                       "tensor '%s': group %u invalid for %s", name, g,
                       t->format);
    if (t->data.bytes != kn_wformat_data_bytes(f, rows, cols) ||
        t->scales.bytes != kn_wformat_scale_bytes(f, rows, cols, g) ||
        t->zeros.bytes != kn_wformat_zero_bytes(f, rows, cols, g))
        return mc_fail(err, MC_ERR_FORMAT, L->path, name, -1,
                       "tensor '%s': part sizes disagree with the %s layout",
                       name, t->format);
    const uint8_t *b = L->o->base[t->section];
    /* A zero is a 4-bit code: the integer kernels (kn_qdot.h) hold q - zero
     * in a signed byte and rely on it. */
    for (uint64_t i = 0; i < t->zeros.bytes; i++)
        if (b[t->zeros.off + i] > 15)
            return mc_fail(err, MC_ERR_FORMAT, L->path, name,
                           -1,
                           "tensor '%s': int4 zero %u at index %llu; expected "
                           "0..15", name, b[t->zeros.off + i],
                           (unsigned long long)i);
    memset(out, 0, sizeof *out);
    out->fmt = f;
    out->rows = rows;
    out->cols = cols;
    out->group = g;
    out->data = b + t->data.off;
    out->scales = t->scales.bytes ? b + t->scales.off : NULL;
    out->zeros = t->zeros.bytes ? b + t->zeros.off : NULL;
    return MC_OK;
}

static uint64_t matrix_bytes(const kn_matrix *w)
{
    return kn_wformat_data_bytes(w->fmt, w->rows, w->cols) +
           kn_wformat_scale_bytes(w->fmt, w->rows, w->cols, w->group) +
           kn_wformat_zero_bytes(w->fmt, w->rows, w->cols, w->group);
}

/* A float32 vector of n into owned; *out points at it (or NULL when
 * optional and absent). */
static mc_status get_vec(loader *L, const char *name, uint32_t n, int optional,
                         const float **out, mc_error *err)
{
    *out = NULL;
    const fmt_art_tensor *t = fmt_art_find_tensor(L->o->a, name);
    if (!t) {
        if (optional)
            return MC_OK;
        return mc_fail(err, MC_ERR_NOT_FOUND, L->path, name, -1,
                       "tensor '%s' is missing from the artifact", name);
    }
    take(L, t);
    if (t->ndim != 1 || t->cols != n || strcmp(t->format, "f32") != 0 ||
        t->data.bytes != (uint64_t)n * 4)
        return mc_fail(err, MC_ERR_SHAPE, L->path, name, -1,
                       "tensor '%s' must be f32 [%u]", name, n);
    if ((uint64_t)(L->owned_end - L->next) < n)
        return mc_fail(err, MC_ERR_FORMAT, L->path, name, -1,
                       "more norm/bias tensors than the config implies");
    memcpy(L->next, L->o->base[t->section] + t->data.off, (size_t)n * 4);
    *out = L->next;
    L->next += n;
    return MC_OK;
}

/* The stored plan (rt_plan.h reads and checks it).  The weights it must
 * name are the tensor table's bytes. */
static mc_status load_plan(loader *L, mc_error *err)
{
    const fmt_art *a = L->o->a;
    uint64_t weights = 0;
    for (size_t i = 0; i < fmt_art_tensor_count(a); i++) {
        const fmt_art_tensor *t = fmt_art_tensor_at(a, i);
        if (!mc_add_u64(weights, t->data.bytes, &weights) ||
            !mc_add_u64(weights, t->scales.bytes, &weights) ||
            !mc_add_u64(weights, t->zeros.bytes, &weights))
            return mc_fail(err, MC_ERR_FORMAT, L->path, "tensors", -1,
                           "tensor bytes overflow 64 bits");
    }
    rt_plan plan;
    mc_status st = rt_plan_from_json(
        json_object_get(fmt_art_manifest(a), "plan"), &L->m->cfg, weights,
        L->path, &plan, err);
    if (st != MC_OK)
        return st;
    L->m->has_plan = 1;
    L->m->plan = plan;
    return MC_OK;
}

static mc_status load_sections(loader *L, unsigned flags, mc_error *err)
{
    fmt_art *a = L->o->a;
    size_t n = fmt_art_section_count(a);
    if (!(flags & RT_ART_NO_VERIFY)) {
        size_t bad;
        mc_status st = fmt_art_verify(a, &bad, err);
        if (st != MC_OK)
            return st;
    }
    L->o->base = mc_calloc(n ? n : 1, sizeof *L->o->base);
    if (!L->o->base)
        return mc_fail(err, MC_ERR_NOMEM, L->path, NULL, -1, "out of memory");
    uint64_t ztotal = 0;
    for (size_t i = 0; i < n; i++) {
        const fmt_art_section *s = fmt_art_section_at(a, i);
        if (s->codec == FMT_ART_CODEC_ZSTD) {
            uint64_t r;
            if (!mc_align_up_u64(s->raw_bytes, 64, &r) ||
                !mc_add_u64(ztotal, r, &ztotal) || ztotal > SIZE_MAX / 2)
                return mc_fail(err, MC_ERR_OVERFLOW, L->path, s->name, -1,
                               "decompressed sections overflow");
        }
    }
    if (ztotal) {
        L->o->zbuf = mc_malloc((size_t)ztotal);
        if (!L->o->zbuf)
            return mc_fail(err, MC_ERR_NOMEM, L->path, NULL, -1,
                           "cannot allocate %llu bytes for the compressed "
                           "sections", (unsigned long long)ztotal);
    }
    uint64_t zoff = 0;
    for (size_t i = 0; i < n; i++) {
        const fmt_art_section *s = fmt_art_section_at(a, i);
        if (s->codec == FMT_ART_CODEC_RAW) {
            L->o->base[i] = s->stored;
            continue;
        }
        mc_status st = fmt_art_section_read(a, i, L->o->zbuf + zoff,
                                            s->raw_bytes, 0, err);
        if (st != MC_OK)
            return st;
        L->o->base[i] = L->o->zbuf + zoff;
        uint64_t r = 0;
        mc_align_up_u64(s->raw_bytes, 64, &r);
        zoff += r;
    }
    return MC_OK;
}

/* A tensor stored but not taken (an lm_head.weight beside
 * tie_word_embeddings true, a layer past num_hidden_layers) would be
 * dropped without a word: the config and the tensors disagree. */
static mc_status unused_tensor(const loader *L, mc_error *err)
{
    const fmt_model_config *c = &L->m->cfg;
    for (size_t i = 0; i < fmt_art_tensor_count(L->o->a); i++) {
        if (L->taken[i])
            continue;
        const char *n = fmt_art_tensor_at(L->o->a, i)->name;
        return mc_fail(err, MC_ERR_FORMAT, L->path, n, -1,
                       "tensor '%s' is stored but the manifest's config has "
                       "no place for it (num_hidden_layers %u, "
                       "tie_word_embeddings %s)", n, c->num_layers,
                       c->tie_word_embeddings ? "true" : "false");
    }
    return MC_OK;
}

static mc_status load_weights(loader *L, mc_error *err)
{
    rt_model *m = L->m;
    const fmt_model_config *c = &m->cfg;
    const uint32_t H = c->hidden_size, V = c->vocab_size,
                   F = c->intermediate_size,
                   QD = (uint32_t)fmt_config_q_dim(c),
                   KD = (uint32_t)fmt_config_kv_dim(c);
    uint64_t per = 2ull * H + (c->qkv_bias ? QD + 2ull * KD : 0) +
                   (c->o_bias ? H : 0) + (c->mlp_bias ? 2ull * F + H : 0);
    uint64_t nf = per * c->num_layers + H;
    m->owned = mc_malloc_array((size_t)nf, sizeof(float));
    m->layers = mc_calloc(c->num_layers, sizeof *m->layers);
    if (!m->owned || !m->layers)
        return mc_fail(err, MC_ERR_NOMEM, L->path, NULL, -1, "out of memory");
    m->owned_floats = nf;
    L->next = m->owned;
    L->owned_end = m->owned + nf;
    mc_status st = get_matrix(L, "model.embed_tokens.weight", V, H, &m->embed,
                              err);
    char nm[128];
#define NAME(fmt_) (snprintf(nm, sizeof nm, "model.layers.%u." fmt_, l), nm)
    for (uint32_t l = 0; st == MC_OK && l < c->num_layers; l++) {
        rt_layer *ly = &m->layers[l];
        kn_block_weights *w = &ly->w;
        rt_model_layer_dims(c, l, &ly->dims);
        int qb = c->qkv_bias, ob = c->o_bias, mb = c->mlp_bias;
        if ((st = get_vec(L, NAME("input_layernorm.weight"), H, 0,
                          &w->attn_norm, err)) ||
            (st = get_matrix(L, NAME("self_attn.q_proj.weight"), QD, H, &w->wq,
                             err)) ||
            (st = get_matrix(L, NAME("self_attn.k_proj.weight"), KD, H, &w->wk,
                             err)) ||
            (st = get_matrix(L, NAME("self_attn.v_proj.weight"), KD, H, &w->wv,
                             err)) ||
            (st = get_matrix(L, NAME("self_attn.o_proj.weight"), H, QD, &w->wo,
                             err)) ||
            (qb && (st = get_vec(L, NAME("self_attn.q_proj.bias"), QD, 0,
                                 &w->bq, err))) ||
            (qb && (st = get_vec(L, NAME("self_attn.k_proj.bias"), KD, 0,
                                 &w->bk, err))) ||
            (qb && (st = get_vec(L, NAME("self_attn.v_proj.bias"), KD, 0,
                                 &w->bv, err))) ||
            (ob && (st = get_vec(L, NAME("self_attn.o_proj.bias"), H, 0,
                                 &w->bo, err))) ||
            (st = get_vec(L, NAME("post_attention_layernorm.weight"), H, 0,
                          &w->mlp_norm, err)) ||
            (st = get_matrix(L, NAME("mlp.gate_proj.weight"), F, H,
                             &w->w_gate, err)) ||
            (st = get_matrix(L, NAME("mlp.up_proj.weight"), F, H, &w->w_up,
                             err)) ||
            (st = get_matrix(L, NAME("mlp.down_proj.weight"), H, F,
                             &w->w_down, err)) ||
            (mb && (st = get_vec(L, NAME("mlp.gate_proj.bias"), F, 0,
                                 &w->b_gate, err))) ||
            (mb && (st = get_vec(L, NAME("mlp.up_proj.bias"), F, 0, &w->b_up,
                                 err))) ||
            (mb && (st = get_vec(L, NAME("mlp.down_proj.bias"), H, 0,
                                 &w->b_down, err))))
            break;
        m->weight_bytes += matrix_bytes(&w->wq) + matrix_bytes(&w->wk) +
                           matrix_bytes(&w->wv) + matrix_bytes(&w->wo) +
                           matrix_bytes(&w->w_gate) + matrix_bytes(&w->w_up) +
                           matrix_bytes(&w->w_down);
    }
#undef NAME
    if (st == MC_OK)
        st = get_vec(L, "model.norm.weight", H, 0, &m->final_norm, err);
    if (st == MC_OK) {
        if (c->tie_word_embeddings)
            m->lm_head = m->embed;
        else
            st = get_matrix(L, "lm_head.weight", V, H, &m->lm_head, err);
    }
    if (st == MC_OK)
        m->weight_bytes += matrix_bytes(&m->lm_head);
    return st;
}

/* The matrices pack_for_cpu may rearrange: every layer's seven, the
 * embedding, and an untied output layer.  n: filled entries. */
static size_t model_matrices(rt_model *m, kn_matrix **out)
{
    size_t n = 0;
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        kn_block_weights *w = &m->layers[l].w;
        kn_matrix *ms[] = {&w->wq, &w->wk, &w->wv, &w->wo,
                           &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            out[n++] = ms[i];
    }
    out[n++] = &m->embed;
    if (!m->cfg.tie_word_embeddings)
        out[n++] = &m->lm_head;
    return n;
}

/* 1 if pack_for_cpu copies w: packable, and its bytes are a view of the
 * mapped file (what fmt_mapguard_drop can drop).  A zstd section was
 * decompressed onto the heap, which cannot be given back piece by piece:
 * copying it would hold those weights twice, over the plan. */
static int pack_wanted(const kn_matrix *w)
{
    return kn_cpu_has_avx512() && !kn_float_dot() && kn_pack16_ok(w) &&
           fmt_mapguard_covers(w->data, (size_t)kn_wformat_data_bytes(w->fmt, w->rows, w->cols)) &&
           fmt_mapguard_covers(w->scales, (size_t)kn_wformat_scale_bytes(w->fmt, w->rows, w->cols,
                                                                         w->group));
}

/* 1 if pack_for_cpu copies f16 w as it is (rows) into its arena: only
 * for the pages (advise_huge), so on any CPU; mapped, as pack_wanted. */
static int copy_wanted(const kn_matrix *w)
{
    return w->fmt == KN_W_F16 && w->layout == KN_LAYOUT_ROWS &&
           fmt_mapguard_covers(w->data, (size_t)kn_wformat_data_bytes(w->fmt, w->rows, w->cols));
}

/* Bytes of w in pack_for_cpu's arena (0: w stays where it is). */
static uint64_t arena_bytes(const kn_matrix *w)
{
    return pack_wanted(w) ? kn_pack16_bytes(w)
           : copy_wanted(w) ? kn_wformat_data_bytes(w->fmt, w->rows, w->cols) : 0;
}

#define PACK_ROWS 128u /* rows a packing step copies (a multiple of 16; the
                        * test fixture's 160-row matrices take two) */

/* Drop the whole source range of w (rows, as the artifact maps it) from
 * the resident set: a page fault on the mapping maps the cached pages
 * around it too (the kernel's fault-around, 64 KiB), so reading one piece
 * or a page of scales brings back neighbours already dropped (measured:
 * 6.4 MB of SmolLM's int8 artifact still resident after the copy, its
 * run's peak 4.5 MB over the plan). */
static void drop_source(const kn_matrix *w)
{
    fmt_mapguard_drop(w->data, (size_t)kn_wformat_data_bytes(w->fmt, w->rows, w->cols));
    fmt_mapguard_drop(w->scales,
                      (size_t)kn_wformat_scale_bytes(w->fmt, w->rows, w->cols, w->group));
}

/* The packing work, shared by the threads of pack_for_cpu: matrix i goes
 * to dst[i] (NULL: stays in rows); threads take the next index. */
typedef struct pack_job {
    kn_matrix **ms;
    uint8_t **dst;
    kn_matrix *src;   /* [n] matrix i's row view before packing */
    size_t n;
    atomic_size_t next;
} pack_job;

static void *pack_worker(void *arg)
{
    pack_job *j = arg;
    size_t i;
    while ((i = atomic_fetch_add(&j->next, 1)) < j->n) {
        kn_matrix *w = j->ms[i];
        if (!j->dst[i])
            continue;
        j->src[i] = *w;
        if (w->fmt == KN_W_F16) { /* copy_wanted: rows as they are */
            const uint64_t rb = kn_wformat_data_bytes(w->fmt, 1, w->cols);
            for (uint32_t r = 0; r < w->rows; r += PACK_ROWS) {
                uint32_t n = w->rows - r < PACK_ROWS ? w->rows - r : PACK_ROWS;
                memcpy(j->dst[i] + r * rb, (const uint8_t *)w->data + r * rb, n * rb);
                fmt_mapguard_drop((const uint8_t *)w->data + r * rb, (size_t)(n * rb));
            }
            drop_source(w);
            w->data = j->dst[i];
            continue;
        }
        /* PACK_ROWS rows at a time (panels are independent), each piece's
         * source dropped once copied: the load holds at most a piece per
         * thread twice, never a whole matrix.  Whole pages, rounded out:
         * a neighbour's page dropped here is read back from the file when
         * touched, the same bytes. */
        const uint64_t rb = kn_wformat_data_bytes(w->fmt, 1, w->cols);
        const uint64_t sr = kn_wformat_scale_bytes(w->fmt, 1, w->cols, w->group);
        const uint64_t pb = kn_pack16_panel_bytes(w);
        for (uint32_t r = 0; r < w->rows; r += PACK_ROWS) {
            kn_matrix piece = *w;
            piece.rows = w->rows - r < PACK_ROWS ? w->rows - r : PACK_ROWS;
            piece.data = (const uint8_t *)w->data + r * rb;
            piece.scales = (const uint8_t *)w->scales + r * sr;
            kn_pack16(&piece, j->dst[i] + (uint64_t)(r / 16) * pb, &piece);
            fmt_mapguard_drop((const uint8_t *)w->data + r * rb, (size_t)(piece.rows * rb));
            fmt_mapguard_drop((const uint8_t *)w->scales + r * sr, (size_t)(piece.rows * sr));
        }
        drop_source(w); /* once more, whole: the fault-around */
        kn_matrix v = *w;
        v.data = j->dst[i];
        v.scales = NULL;
        v.layout = KN_LAYOUT_P16;
        *w = v;
    }
    return NULL;
}

/* Ask the kernel for 2 MiB pages over the whole 2 MiB pages inside
 * [p, p + n): the weights are streamed whole every decode step, and with
 * 4 KiB pages every 64 cache lines cross a page (a TLB miss each).
 * Measured on TinyLlama's shape, batch-1 decode +7 % (int8) and +8 %
 * (int4-sym), the load's copy 27 % faster (fewer faults to zero); the
 * resident bytes are the same, as every page of the range is written
 * anyway (docs/benchmarks.md, session 25).  Only advice: where
 * transparent huge pages are off the call changes nothing.
 * MC_NO_THP=1 leaves the pages small (for comparisons). */
static void advise_huge(void *p, size_t n)
{
    const char *off = getenv("MC_NO_THP");
    if (off && *off && *off != '0')
        return;
    uintptr_t a = ((uintptr_t)p + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(uintptr_t)((2u << 20) - 1);
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
}

/* On a CPU with AVX-512 VNNI, copy the int4-sym and int8 matrices into
 * 16-row panels (kn_pack16.h: decode reads one stream, the prefill GEMM
 * skips its transposes), and on any CPU the f16 ones as they are, for
 * the 2 MiB pages alone (TinyLlama's shape, batch-1 decode +11 %, the
 * open 0.13 -> 0.36-0.54 s: docs/benchmarks.md, session 25), unless the
 * plan is for the GPU or MC_NO_REPACK is set.
 * Each source range is dropped from the resident set once copied (a
 * mapped section: it is read back from the file if touched), so the
 * process holds the weights once, as the plan counts them; matrices in
 * zstd sections stay in rows (pack_wanted).  Results are
 * bit for bit those of the row layout.  A failed allocation keeps the
 * row layout (slower, not wrong).  Not with the float path switched on
 * (MC_FLOAT_DOT) or asked for (RT_ART_ROWS): its SIMD kernels read the
 * row layout.  The copy runs on
 * up to 4 threads: most of its time is the kernel zeroing the new pages,
 * which each faulting thread does for itself; the pages are asked to be
 * 2 MiB (advise_huge). */
static void pack_for_cpu(loader *L, unsigned flags)
{
    rt_model *m = L->m;
    const char *off = getenv("MC_NO_REPACK");
    if ((flags & RT_ART_ROWS) || (m->has_plan && m->plan.cuda) ||
        (off && *off && *off != '0'))
        return;
    size_t cap = (size_t)m->cfg.num_layers * 7 + 2;
    kn_matrix **ms = mc_malloc_array(cap, sizeof *ms);
    uint8_t **dst = mc_calloc(cap, sizeof *dst);
    kn_matrix *src = mc_calloc(cap, sizeof *src);
    if (!ms || !dst || !src) {
        mc_free(ms);
        mc_free(dst);
        mc_free(src);
        return;
    }
    pack_job job = {ms, dst, src, model_matrices(m, ms), 0};
    uint64_t total = 0;
    for (size_t i = 0; i < job.n; i++)
        total += (arena_bytes(ms[i]) + 63) & ~(uint64_t)63;
    if (total == 0 || total > SIZE_MAX - 64 ||
        !(L->o->packed = mc_malloc((size_t)total + 64))) {
        mc_free(ms);
        mc_free(dst);
        mc_free(src);
        return;
    }
    advise_huge(L->o->packed, (size_t)total + 64);
    uint8_t *at = (uint8_t *)(((uintptr_t)L->o->packed + 63) & ~(uintptr_t)63);
    for (size_t i = 0; i < job.n; i++)
        if (arena_bytes(ms[i])) {
            dst[i] = at;
            at += (arena_bytes(ms[i]) + 63) & ~(uint64_t)63;
        }
    int ncpu = kn_cpu_count();
    int nth = ncpu > 4 ? 4 : ncpu, started = 0;
    pthread_t th[3];
    for (int t = 0; t < nth - 1; t++)
        if (pthread_create(&th[started], NULL, pack_worker, &job) == 0)
            started++;
    pack_worker(&job); /* this thread too; alone if none started */
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    /* and all of them after every thread is done: one thread's faults
     * map back pages of a matrix another thread finished */
    for (size_t i = 0; i < job.n; i++)
        if (dst[i])
            drop_source(&job.src[i]);
    if (m->cfg.tie_word_embeddings)
        m->lm_head = m->embed;
    mc_free(ms);
    mc_free(dst);
    mc_free(src);
}

mc_status rt_model_open_artifact_ex(const char *path, unsigned flags,
                                    rt_model **out, mc_error *err)
{
    *out = NULL;
    rt_model *m = mc_calloc(1, sizeof *m);
    art_owner *o = mc_calloc(1, sizeof *o);
    if (!m || !o) {
        mc_free(m);
        mc_free(o);
        return mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    }
    m->owner = o;
    m->owner_free = owner_free;
    snprintf(m->path, sizeof m->path, "%s", path);
    loader L = {path, o, m, NULL, NULL, NULL};
    mc_status st = fmt_art_open(path, &o->a, err);
    if (st == MC_OK) {
        char *cj = json_dumps(json_object_get(fmt_art_manifest(o->a), "config"),
                              JSON_COMPACT | JSON_REAL_PRECISION(17));
        if (!cj) /* the manifest validated on open: only memory can fail */
            st = mc_fail(err, MC_ERR_NOMEM, path, "config", -1,
                         "no memory to serialize the manifest config");
        else
            st = fmt_config_parse(cj, strlen(cj), path, &m->cfg, err);
        mc_free(cj);
    }
    if (st == MC_OK)
        st = load_plan(&L, err);
    if (st == MC_OK)
        st = load_sections(&L, flags, err);
    if (st == MC_OK &&
        !(L.taken = mc_calloc(fmt_art_tensor_count(o->a) + 1, 1)))
        st = mc_fail(err, MC_ERR_NOMEM, path, NULL, -1, "out of memory");
    if (st == MC_OK)
        st = load_weights(&L, err);
    if (st == MC_OK && L.next != L.owned_end)
        st = mc_fail(err, MC_ERR_FORMAT, path, NULL, -1,
                     "norm/bias tensors do not match the config");
    if (st == MC_OK)
        st = unused_tensor(&L, err);
    mc_free(L.taken);
    if (st == MC_OK)
        pack_for_cpu(&L, flags);
    if (st != MC_OK) {
        rt_model_free(m);
        return st;
    }
    *out = m;
    return MC_OK;
}

mc_status rt_model_open_artifact(const char *path, rt_model **out,
                                 mc_error *err)
{
    return rt_model_open_artifact_ex(path, 0, out, err);
}
