/* ref_forward.c - double-precision reference forward pass (ref_forward.h).
 * Deliberately naive: one token at a time, plain loops, no kernels/. */
#include "ref_forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_model.h"

#define REF_MAX_NAME 128

typedef struct ref_named {
    char name[REF_MAX_NAME]; /* Hugging Face tensor name */
    double *data;            /* owned */
    size_t n;                /* elements */
} ref_named;

typedef struct ref_layer {
    const double *attn_norm;   /* (hidden) */
    const double *wq, *bq;     /* (q_dim, hidden), (q_dim) or NULL */
    const double *wk, *bk;     /* (kv_dim, hidden), (kv_dim) or NULL */
    const double *wv, *bv;     /* (kv_dim, hidden), (kv_dim) or NULL */
    const double *wo, *bo;     /* (hidden, q_dim), (hidden) or NULL */
    const double *ffn_norm;    /* (hidden) */
    const double *wg, *bg;     /* (ffn, hidden), (ffn) or NULL */
    const double *wu, *bu;     /* (ffn, hidden), (ffn) or NULL */
    const double *wd, *bd;     /* (hidden, ffn), (hidden) or NULL */
    size_t window;             /* sliding window in tokens, 0 = full */
} ref_layer;

struct tu_ref_model {
    fmt_model_config cfg;
    size_t vocab, hidden, ffn, layers, heads, kv_heads, head_dim;
    size_t q_dim, kv_dim;      /* heads*head_dim, kv_heads*head_dim */
    const double *embed;       /* (vocab, hidden) */
    const double *final_norm;  /* (hidden) */
    const double *lm_head;     /* (vocab, hidden); = embed when tied */
    ref_layer *layer;          /* (layers) */
    ref_named *tensors;        /* every loaded tensor, for tu_ref_tensor */
    size_t n_tensors, cap_tensors;
};

struct tu_ref_cache {
    size_t cap;                /* positions */
    size_t len;                /* positions filled */
    double *k;                 /* (layers, cap, kv_dim), RoPE applied */
    double *v;                 /* (layers, cap, kv_dim) */
};

/* ---- loading ----------------------------------------------------------- */

/* Decode one element; the formats are simple enough to do here, so a bug in
 * fmt_dtype's converters cannot hide in both sides of a comparison. */
static double ref_decode(fmt_dtype dt, const unsigned char *p)
{
    if (dt == FMT_DT_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    if (dt == FMT_DT_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    /* F16: sign, 5-bit exponent (bias 15), 10-bit mantissa */
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp((double)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Convert tensor name to double after checking its shape is rows x cols
 * (cols 0: 1-D of rows).  Returns NULL and prints when absent and required
 * or when the shape or dtype is wrong; *failed is set in those cases. */
static const double *ref_take(tu_ref_model *m, const fmt_model *fm,
                              const char *name, size_t rows, size_t cols,
                              int required, int *failed)
{
    const fmt_st_tensor *t = fmt_model_find(fm, name, NULL);
    if (!t) {
        if (required) {
            fprintf(stderr, "ref_forward: tensor %s is missing\n", name);
            *failed = 1;
        }
        return NULL;
    }
    int ndim = cols ? 2 : 1;
    if (t->ndim != ndim || t->shape[0] != rows ||
        (cols && t->shape[1] != cols)) {
        if (cols)
            fprintf(stderr, "ref_forward: tensor %s: expected [%zu, %zu]\n",
                    name, rows, cols);
        else
            fprintf(stderr, "ref_forward: tensor %s: expected [%zu]\n", name,
                    rows);
        *failed = 1;
        return NULL;
    }
    if (t->dtype != FMT_DT_F32 && t->dtype != FMT_DT_F16 &&
        t->dtype != FMT_DT_BF16) {
        fprintf(stderr, "ref_forward: tensor %s: dtype %s not supported\n",
                name, fmt_dtype_name(t->dtype));
        *failed = 1;
        return NULL;
    }
    size_t n = cols ? rows * cols : rows;
    size_t esz = t->dtype == FMT_DT_F32 ? 4 : 2;
    double *d = malloc((n ? n : 1) * sizeof *d);
    if (m->n_tensors == m->cap_tensors) {
        size_t cap = m->cap_tensors ? 2 * m->cap_tensors : 64;
        ref_named *nt = realloc(m->tensors, cap * sizeof *nt);
        if (nt) {
            m->tensors = nt;
            m->cap_tensors = cap;
        }
    }
    if (!d || m->n_tensors == m->cap_tensors) {
        fprintf(stderr, "ref_forward: out of memory\n");
        free(d);
        *failed = 1;
        return NULL;
    }
    const unsigned char *src = t->data;
    for (size_t i = 0; i < n; i++)
        d[i] = ref_decode(t->dtype, src + i * esz);
    ref_named *e = &m->tensors[m->n_tensors++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->data = d;
    e->n = n;
    return d;
}

/* "model.layers.<l>.<suffix>", loaded (and required) only if want. */
static const double *ref_take_layer(tu_ref_model *m, const fmt_model *fm,
                                    size_t l, const char *suffix, size_t rows,
                                    size_t cols, int want, int *failed)
{
    char name[REF_MAX_NAME];
    if (!want || *failed)
        return NULL;
    snprintf(name, sizeof name, "model.layers.%zu.%s", l, suffix);
    return ref_take(m, fm, name, rows, cols, 1, failed);
}

tu_ref_model *tu_ref_load(const char *dir)
{
    fmt_model *fm = NULL;
    mc_error err;
    char buf[2048];
    if (fmt_model_open(dir, &fm, &err) != MC_OK) {
        fprintf(stderr, "ref_forward: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        return NULL;
    }
    tu_ref_model *m = calloc(1, sizeof *m);
    if (!m) {
        fmt_model_close(fm);
        return NULL;
    }
    if (fmt_config_load(fmt_model_config_path(fm), &m->cfg, &err) != MC_OK) {
        fprintf(stderr, "ref_forward: %s\n",
                mc_error_format(&err, buf, sizeof buf));
        fmt_model_close(fm);
        tu_ref_free(m);
        return NULL;
    }
    const fmt_model_config *c = &m->cfg;
    m->vocab = c->vocab_size;
    m->hidden = c->hidden_size;
    m->ffn = c->intermediate_size;
    m->layers = c->num_layers;
    m->heads = c->num_heads;
    m->kv_heads = c->num_kv_heads;
    m->head_dim = c->head_dim;
    m->q_dim = m->heads * m->head_dim;
    m->kv_dim = m->kv_heads * m->head_dim;
    int failed = 0;
    if (m->kv_heads == 0 || m->heads % m->kv_heads || m->head_dim % 2) {
        fprintf(stderr, "ref_forward: %s: bad head layout\n", dir);
        failed = 1;
    }
    m->layer = calloc(m->layers ? m->layers : 1, sizeof *m->layer);
    if (!m->layer)
        failed = 1;
    size_t h = m->hidden, f = m->ffn, q = m->q_dim, kv = m->kv_dim;
    if (!failed)
        m->embed = ref_take(m, fm, "model.embed_tokens.weight", m->vocab, h,
                            1, &failed);
    for (size_t l = 0; l < m->layers && !failed; l++) {
        ref_layer *L = &m->layer[l];
        /* Biases are read only where the config declares them, as
         * transformers does (it ignores unexpected tensors). */
        int qb = c->qkv_bias, ob = c->o_bias, mb = c->mlp_bias;
        L->attn_norm = ref_take_layer(m, fm, l, "input_layernorm.weight", h,
                                      0, 1, &failed);
        L->wq = ref_take_layer(m, fm, l, "self_attn.q_proj.weight", q, h, 1,
                               &failed);
        L->wk = ref_take_layer(m, fm, l, "self_attn.k_proj.weight", kv, h, 1,
                               &failed);
        L->wv = ref_take_layer(m, fm, l, "self_attn.v_proj.weight", kv, h, 1,
                               &failed);
        L->wo = ref_take_layer(m, fm, l, "self_attn.o_proj.weight", h, q, 1,
                               &failed);
        L->bq = ref_take_layer(m, fm, l, "self_attn.q_proj.bias", q, 0, qb,
                               &failed);
        L->bk = ref_take_layer(m, fm, l, "self_attn.k_proj.bias", kv, 0, qb,
                               &failed);
        L->bv = ref_take_layer(m, fm, l, "self_attn.v_proj.bias", kv, 0, qb,
                               &failed);
        L->bo = ref_take_layer(m, fm, l, "self_attn.o_proj.bias", h, 0, ob,
                               &failed);
        L->ffn_norm = ref_take_layer(m, fm, l,
                                     "post_attention_layernorm.weight", h, 0,
                                     1, &failed);
        L->wg = ref_take_layer(m, fm, l, "mlp.gate_proj.weight", f, h, 1,
                               &failed);
        L->wu = ref_take_layer(m, fm, l, "mlp.up_proj.weight", f, h, 1,
                               &failed);
        L->wd = ref_take_layer(m, fm, l, "mlp.down_proj.weight", h, f, 1,
                               &failed);
        L->bg = ref_take_layer(m, fm, l, "mlp.gate_proj.bias", f, 0, mb,
                               &failed);
        L->bu = ref_take_layer(m, fm, l, "mlp.up_proj.bias", f, 0, mb,
                               &failed);
        L->bd = ref_take_layer(m, fm, l, "mlp.down_proj.bias", h, 0, mb,
                               &failed);
        L->window = fmt_config_layer_window(c, (uint32_t)l);
    }
    if (!failed)
        m->final_norm = ref_take(m, fm, "model.norm.weight", h, 0, 1, &failed);
    if (!failed)
        m->lm_head = c->tie_word_embeddings
                         ? m->embed
                         : ref_take(m, fm, "lm_head.weight", m->vocab, h, 1,
                                    &failed);
    fmt_model_close(fm); /* every weight was copied */
    if (failed) {
        fprintf(stderr, "ref_forward: cannot load %s\n", dir);
        tu_ref_free(m);
        return NULL;
    }
    return m;
}

void tu_ref_free(tu_ref_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_tensors; i++)
        free(m->tensors[i].data);
    free(m->tensors);
    free(m->layer);
    free(m);
}

size_t tu_ref_vocab(const tu_ref_model *m) { return m->vocab; }

const fmt_model_config *tu_ref_config(const tu_ref_model *m)
{
    return &m->cfg;
}

double *tu_ref_tensor(tu_ref_model *m, const char *name, size_t *nelem)
{
    for (size_t i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) {
            if (nelem)
                *nelem = m->tensors[i].n;
            return m->tensors[i].data;
        }
    return NULL;
}

/* ---- RoPE -------------------------------------------------------------- */

/* Inverse frequencies inv[0 .. head_dim/2) and the cos/sin multiplier for
 * a chunk ending at seq_len positions (transformers' modeling_rope_utils,
 * in double). */
static void ref_rope_freqs(const tu_ref_model *m, size_t seq_len, double *inv,
                           double *mult)
{
    const fmt_rope *r = &m->cfg.rope;
    const double pi = 3.14159265358979323846;
    size_t d = m->head_dim, half = d / 2;
    double base = r->theta, factor = r->factor > 0 ? r->factor : 1.0;
    double maxpos = (double)m->cfg.max_position_embeddings;
    double orig = r->original_max_pos ? (double)r->original_max_pos : maxpos;
    *mult = 1.0;
    if (r->type == FMT_ROPE_DYNAMIC) {
        /* transformers uses max_position_embeddings as the original length */
        double len = (double)seq_len > maxpos ? (double)seq_len : maxpos;
        base *= pow(factor * len / maxpos - (factor - 1.0),
                    (double)d / ((double)d - 2.0));
    }
    for (size_t i = 0; i < half; i++)
        inv[i] = 1.0 / pow(base, (double)(2 * i) / (double)d);

    switch (r->type) {
    case FMT_ROPE_LINEAR:
        for (size_t i = 0; i < half; i++)
            inv[i] /= factor;
        break;
    case FMT_ROPE_YARN: {
        double bf = r->beta_fast > 0 ? r->beta_fast : 32.0;
        double bs = r->beta_slow > 0 ? r->beta_slow : 1.0;
        *mult = r->attention_factor > 0
                    ? r->attention_factor
                    : (factor <= 1.0 ? 1.0 : 0.1 * log(factor) + 1.0);
        double lo = floor((double)d * log(orig / (bf * 2.0 * pi)) /
                          (2.0 * log(base)));
        double hi = ceil((double)d * log(orig / (bs * 2.0 * pi)) /
                         (2.0 * log(base)));
        if (lo < 0)
            lo = 0;
        if (hi > (double)(d - 1))
            hi = (double)(d - 1);
        if (lo == hi)
            hi += 0.001;
        for (size_t i = 0; i < half; i++) {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extra = 1.0 - ramp; /* weight of the unscaled frequency */
            inv[i] = inv[i] / factor * (1.0 - extra) + inv[i] * extra;
        }
        break;
    }
    case FMT_ROPE_LLAMA3: {
        double lf = r->low_freq_factor, hf = r->high_freq_factor;
        double low_wl = orig / lf, high_wl = orig / hf;
        for (size_t i = 0; i < half; i++) {
            double wl = 2.0 * pi / inv[i];
            if (wl < high_wl)
                continue;                       /* high frequency: keep */
            if (wl > low_wl) {
                inv[i] /= factor;               /* low frequency: scale */
                continue;
            }
            double s = (orig / wl - lf) / (hf - lf);
            inv[i] = (1.0 - s) * inv[i] / factor + s * inv[i];
        }
        break;
    }
    default:
        break;
    }
}

void tu_ref_rope_freqs(const tu_ref_model *m, size_t seq_len,
                       double *inv_freq, double *mult)
{
    ref_rope_freqs(m, seq_len, inv_freq, mult);
}

/* rotate_half: element i pairs with i + d/2 inside each head. */
static void ref_rope_apply(double *x, size_t nheads, size_t d, size_t pos,
                           const double *inv, double mult)
{
    size_t half = d / 2;
    for (size_t i = 0; i < half; i++) {
        double a = (double)pos * inv[i];
        double c = cos(a) * mult, s = sin(a) * mult;
        for (size_t hh = 0; hh < nheads; hh++) {
            double *v = x + hh * d;
            double x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c - x2 * s;
            v[i + half] = x2 * c + x1 * s;
        }
    }
}

/* ---- forward ----------------------------------------------------------- */

static void ref_rmsnorm(double *out, const double *x, const double *w,
                        size_t n, double eps)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / (double)n + eps);
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
}

/* y[rows] = W[rows][cols] x (+ b) */
static void ref_matvec(double *y, const double *w, const double *b,
                       const double *x, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++) {
        const double *wr = w + r * cols;
        double s = 0.0;
        for (size_t c = 0; c < cols; c++)
            s += wr[c] * x[c];
        y[r] = s + (b ? b[r] : 0.0);
    }
}

tu_ref_cache *tu_ref_cache_create(const tu_ref_model *m, size_t max_tokens)
{
    tu_ref_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    size_t n = (m->layers ? m->layers : 1) * (max_tokens ? max_tokens : 1) *
               (m->kv_dim ? m->kv_dim : 1);
    c->cap = max_tokens;
    c->k = calloc(n, sizeof *c->k);
    c->v = calloc(n, sizeof *c->v);
    if (!c->k || !c->v) {
        tu_ref_cache_free(c);
        return NULL;
    }
    return c;
}

void tu_ref_cache_free(tu_ref_cache *c)
{
    if (!c)
        return;
    free(c->k);
    free(c->v);
    free(c);
}

size_t tu_ref_cache_len(const tu_ref_cache *c) { return c->len; }

int tu_ref_feed(const tu_ref_model *m, tu_ref_cache *c, const int32_t *ids,
                size_t n, double *logits)
{
    if (n > c->cap - c->len)
        return -1;
    for (size_t t = 0; t < n; t++)
        if (ids[t] < 0 || (size_t)ids[t] >= m->vocab)
            return -1;
    size_t h = m->hidden, d = m->head_dim, qd = m->q_dim, kvd = m->kv_dim;
    size_t group = m->heads / m->kv_heads;
    size_t big = h > m->ffn ? h : m->ffn;
    if (qd > big)
        big = qd;
    /* scratch: x, xn, q, k, v, att out, gate, up, scores, inv_freq */
    double *x = malloc(h * sizeof *x), *xn = malloc(h * sizeof *xn);
    double *q = malloc(qd * sizeof *q), *kk = malloc(kvd * sizeof *kk);
    double *vv = malloc(kvd * sizeof *vv), *ao = malloc(qd * sizeof *ao);
    double *g = malloc(big * sizeof *g), *u = malloc(big * sizeof *u);
    double *sc = malloc((c->cap ? c->cap : 1) * sizeof *sc);
    double *inv = malloc((d / 2 ? d / 2 : 1) * sizeof *inv);
    int rc = 0;
    if (!x || !xn || !q || !kk || !vv || !ao || !g || !u || !sc || !inv) {
        rc = -1;
        goto done;
    }
    double mult;
    ref_rope_freqs(m, c->len + n, inv, &mult);
    const double scale = 1.0 / sqrt((double)d);
    for (size_t t = 0; t < n; t++) {
        size_t pos = c->len;
        memcpy(x, m->embed + (size_t)ids[t] * h, h * sizeof *x);
        for (size_t l = 0; l < m->layers; l++) {
            const ref_layer *L = &m->layer[l];
            double *kc = c->k + l * c->cap * kvd, *vc = c->v + l * c->cap * kvd;
            ref_rmsnorm(xn, x, L->attn_norm, h, m->cfg.rms_norm_eps);
            ref_matvec(q, L->wq, L->bq, xn, qd, h);
            ref_matvec(kk, L->wk, L->bk, xn, kvd, h);
            ref_matvec(vv, L->wv, L->bv, xn, kvd, h);
            ref_rope_apply(q, m->heads, d, pos, inv, mult);
            ref_rope_apply(kk, m->kv_heads, d, pos, inv, mult);
            memcpy(kc + pos * kvd, kk, kvd * sizeof *kk);
            memcpy(vc + pos * kvd, vv, kvd * sizeof *vv);
            size_t first = 0;
            if (L->window && pos + 1 > L->window)
                first = pos + 1 - L->window; /* keys j > pos - window */
            for (size_t hh = 0; hh < m->heads; hh++) {
                const double *qh = q + hh * d;
                size_t kvh = hh / group;
                double mx = -INFINITY;
                for (size_t j = first; j <= pos; j++) {
                    const double *kj = kc + j * kvd + kvh * d;
                    double s = 0.0;
                    for (size_t i = 0; i < d; i++)
                        s += qh[i] * kj[i];
                    sc[j] = s * scale;
                    if (sc[j] > mx)
                        mx = sc[j];
                }
                double sum = 0.0;
                for (size_t j = first; j <= pos; j++) {
                    sc[j] = exp(sc[j] - mx);
                    sum += sc[j];
                }
                double *oh = ao + hh * d;
                for (size_t i = 0; i < d; i++)
                    oh[i] = 0.0;
                for (size_t j = first; j <= pos; j++) {
                    const double *vj = vc + j * kvd + kvh * d;
                    double p = sc[j] / sum;
                    for (size_t i = 0; i < d; i++)
                        oh[i] += p * vj[i];
                }
            }
            ref_matvec(xn, L->wo, L->bo, ao, h, qd);
            for (size_t i = 0; i < h; i++)
                x[i] += xn[i];
            ref_rmsnorm(xn, x, L->ffn_norm, h, m->cfg.rms_norm_eps);
            ref_matvec(g, L->wg, L->bg, xn, m->ffn, h);
            ref_matvec(u, L->wu, L->bu, xn, m->ffn, h);
            for (size_t i = 0; i < m->ffn; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * u[i]; /* silu(g) * u */
            ref_matvec(xn, L->wd, L->bd, g, h, m->ffn);
            for (size_t i = 0; i < h; i++)
                x[i] += xn[i];
        }
        c->len++;
        if (logits) {
            ref_rmsnorm(xn, x, m->final_norm, h, m->cfg.rms_norm_eps);
            ref_matvec(logits + t * m->vocab, m->lm_head, NULL, xn, m->vocab,
                       h);
        }
    }
done:
    free(x);
    free(xn);
    free(q);
    free(kk);
    free(vv);
    free(ao);
    free(g);
    free(u);
    free(sc);
    free(inv);
    return rc;
}

void tu_ref_forward(const tu_ref_model *m, const int32_t *ids, size_t n,
                    double *logits)
{
    tu_ref_cache *c = tu_ref_cache_create(m, n);
    if (!c || tu_ref_feed(m, c, ids, n, logits) != 0) {
        fprintf(stderr, "ref_forward: forward failed (memory or bad id)\n");
        abort();
    }
    tu_ref_cache_free(c);
}

size_t tu_ref_argmax(const double *v, size_t n)
{
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

int tu_ref_greedy(const tu_ref_model *m, const int32_t *prompt,
                  size_t n_prompt, size_t n_new, int32_t *out)
{
    if (n_prompt == 0)
        return -1;
    tu_ref_cache *c = tu_ref_cache_create(m, n_prompt + n_new);
    double *lg = malloc(n_prompt * m->vocab * sizeof *lg);
    int rc = -1;
    if (!c || !lg || tu_ref_feed(m, c, prompt, n_prompt, lg) != 0)
        goto done;
    int32_t next = (int32_t)tu_ref_argmax(lg + (n_prompt - 1) * m->vocab,
                                          m->vocab);
    for (size_t s = 0; s < n_new; s++) {
        out[s] = next;
        if (s + 1 == n_new)
            break;
        if (tu_ref_feed(m, c, &next, 1, lg) != 0)
            goto done;
        next = (int32_t)tu_ref_argmax(lg, m->vocab);
    }
    rc = 0;
done:
    free(lg);
    tu_ref_cache_free(c);
    return rc;
}
