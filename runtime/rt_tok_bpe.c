/*
 * rt_tok_bpe.c - vocabulary and merge hash maps and the BPE merge loop.
 *
 * The merge loop follows Hugging Face's `Word::merge_all`: symbols in a
 * doubly linked list, a binary min-heap of candidate pairs ordered by
 * (merge rank, left position); a popped candidate is applied only if the
 * pair still exists and still merges into the same id.  O(n log n) per
 * word, so a whole unsplit text (Metaspace split=false) stays fast.
 */
#include <string.h>

#include "mc_alloc.h"
#include "mc_checked.h"
#include "rt_tok_internal.h"
#include "rt_tok_unicode.h"

typedef struct rt_tok_merge_ent {
    uint32_t rank;  /* merge rank: lower first */
    uint32_t pos;   /* left symbol index: lower first on ties */
    int32_t new_id; /* id the pair merged into when pushed */
} rt_tok_merge_ent;

uint64_t rt_tok_hash(const uint8_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t pair_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    return k ^ (k >> 33);
}

static size_t table_size(size_t n)
{
    size_t cap = 16;
    while (cap < n * 2 + 1)
        cap <<= 1;
    return cap;
}

int32_t rt_tok_vocab_find(const rt_tokenizer *t, const uint8_t *s, size_t n)
{
    if (!t->vhash)
        return -1;
    size_t i = (size_t)rt_tok_hash(s, n) & t->vhash_mask;
    for (;;) {
        uint32_t v = t->vhash[i];
        if (v == 0)
            return -1;
        uint32_t id = v - 1;
        if (t->model_len[id] == n &&
            memcmp(t->pool + t->model_off[id], s, n) == 0)
            return (int32_t)id;
        i = (i + 1) & t->vhash_mask;
    }
}

mc_status rt_tok_vocab_index(rt_tokenizer *t, const char *file, mc_error *err)
{
    size_t n = 0;
    for (uint32_t id = 0; id < t->vocab_size; id++)
        n += (t->flags[id] & RT_TOK_F_MODEL) != 0;
    size_t cap = table_size(n);
    t->vhash = mc_calloc(cap, sizeof *t->vhash);
    if (!t->vhash)
        return mc_fail(err, MC_ERR_NOMEM, file, "model.vocab", -1,
                       "out of memory indexing %zu tokens", n);
    t->vhash_mask = cap - 1;
    for (uint32_t id = 0; id < t->vocab_size; id++) {
        if (!(t->flags[id] & RT_TOK_F_MODEL))
            continue;
        const uint8_t *s = t->pool + t->model_off[id];
        size_t len = t->model_len[id];
        size_t i = (size_t)rt_tok_hash(s, len) & t->vhash_mask;
        while (t->vhash[i] != 0) {
            uint32_t o = t->vhash[i] - 1;
            if (t->model_len[o] == len &&
                memcmp(t->pool + t->model_off[o], s, len) == 0)
                return mc_fail(err, MC_ERR_FORMAT, file, "model.vocab", -1,
                               "ids %u and %u have the same token text", o, id);
            i = (i + 1) & t->vhash_mask;
        }
        t->vhash[i] = id + 1;
    }
    return MC_OK;
}

mc_status rt_tok_merge_alloc(rt_tokenizer *t, size_t n_merges)
{
    size_t cap = table_size(n_merges);
    t->mkey = mc_malloc_array(cap, sizeof *t->mkey);
    t->mrank = mc_malloc_array(cap, sizeof *t->mrank);
    t->mnew = mc_malloc_array(cap, sizeof *t->mnew);
    if (!t->mkey || !t->mrank || !t->mnew)
        return MC_ERR_NOMEM;
    memset(t->mkey, 0xFF, cap * sizeof *t->mkey);
    t->mhash_mask = cap - 1;
    return MC_OK;
}

void rt_tok_merge_put(rt_tokenizer *t, int32_t a, int32_t b, uint32_t rank,
                      int32_t result)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)pair_hash(key) & t->mhash_mask;
    while (t->mkey[i] != UINT64_MAX && t->mkey[i] != key)
        i = (i + 1) & t->mhash_mask;
    if (t->mkey[i] == UINT64_MAX)
        t->n_merges++;
    t->mkey[i] = key;
    t->mrank[i] = rank;
    t->mnew[i] = result;
}

/* Rank and result of merging (a, b); 0 if no such merge. */
static int merge_get(const rt_tokenizer *t, int32_t a, int32_t b,
                     uint32_t *rank, int32_t *result)
{
    if (!t->mkey)
        return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)pair_hash(key) & t->mhash_mask;
    for (;;) {
        uint64_t k = t->mkey[i];
        if (k == UINT64_MAX)
            return 0;
        if (k == key) {
            *rank = t->mrank[i];
            *result = t->mnew[i];
            return 1;
        }
        i = (i + 1) & t->mhash_mask;
    }
}

int rt_tok_buf_reserve(rt_tok_buf *b, size_t extra)
{
    size_t need;
    if (!mc_add_size(b->len, extra, &need))
        return 0;
    if (need <= b->cap)
        return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return 0;
        cap *= 2;
    }
    uint8_t *p = mc_realloc(b->p, cap);
    if (!p)
        return 0;
    b->p = p;
    b->cap = cap;
    return 1;
}

int rt_tok_buf_append(rt_tok_buf *b, const void *p, size_t n)
{
    if (!rt_tok_buf_reserve(b, n))
        return 0;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return 1;
}

void rt_tok_bpe_work_free(rt_tok_bpe_work *w)
{
    mc_free(w->sym_id);
    mc_free(w->sym_prev);
    mc_free(w->sym_next);
    mc_free(w->heap);
    mc_free(w->mapped.p);
    memset(w, 0, sizeof *w);
}

static int ent_less(const rt_tok_merge_ent *x, const rt_tok_merge_ent *y)
{
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static int heap_push(rt_tok_bpe_work *w, rt_tok_merge_ent e)
{
    if (w->heap_len == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        rt_tok_merge_ent *h = mc_realloc(w->heap, cap * sizeof *h);
        if (!h)
            return 0;
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!ent_less(&e, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = e;
    return 1;
}

static rt_tok_merge_ent heap_pop(rt_tok_bpe_work *w)
{
    rt_tok_merge_ent top = w->heap[0];
    rt_tok_merge_ent last = w->heap[--w->heap_len];
    size_t i = 0, n = w->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && ent_less(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!ent_less(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static int sym_reserve(rt_tok_bpe_work *w, size_t n)
{
    if (n <= w->sym_cap)
        return 1;
    size_t cap = w->sym_cap ? w->sym_cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *a = mc_realloc(w->sym_id, cap * sizeof *a);
    if (!a)
        return 0;
    w->sym_id = a;
    a = mc_realloc(w->sym_prev, cap * sizeof *a);
    if (!a)
        return 0;
    w->sym_prev = a;
    a = mc_realloc(w->sym_next, cap * sizeof *a);
    if (!a)
        return 0;
    w->sym_next = a;
    w->sym_cap = cap;
    return 1;
}

static int push_pair(const rt_tokenizer *t, rt_tok_bpe_work *w, size_t pos)
{
    int32_t next = w->sym_next[pos];
    if (next < 0)
        return 1;
    uint32_t rank;
    int32_t result;
    if (!merge_get(t, w->sym_id[pos], w->sym_id[next], &rank, &result))
        return 1;
    rt_tok_merge_ent e = {rank, (uint32_t)pos, result};
    return heap_push(w, e);
}

mc_status rt_tok_bpe_word(const rt_tokenizer *t, rt_tok_bpe_work *w,
                          const uint8_t *s, size_t n, rt_tok_buf *out)
{
    if (n == 0)
        return MC_OK;
    if (n > INT32_MAX)
        return MC_ERR_INVALID_ARG; /* symbol links are int32 */
    if (t->ignore_merges) {
        int32_t id;
        if (t->byte_level) {
            w->mapped.len = 0;
            for (size_t i = 0; i < n; i++)
                if (!rt_tok_buf_append(&w->mapped, t->bl_char[s[i]],
                                       t->bl_char_len[s[i]]))
                    return MC_ERR_NOMEM;
            id = rt_tok_vocab_find(t, w->mapped.p, w->mapped.len);
        } else {
            id = rt_tok_vocab_find(t, s, n);
        }
        if (id >= 0)
            return rt_tok_buf_append(out, &id, sizeof id) ? MC_OK
                                                          : MC_ERR_NOMEM;
    }
    /* initial symbols: at most one per byte */
    if (!sym_reserve(w, n))
        return MC_ERR_NOMEM;
    size_t ns = 0;
    int last_unk = 0; /* previous symbol came from the unk path (fuse_unk) */
    for (size_t i = 0; i < n;) {
        size_t clen = 1;
        int32_t id;
        if (t->byte_level) {
            id = t->byte_id[s[i]];
        } else {
            uint32_t cp;
            clen = rt_tok_utf8_next(s + i, n - i, &cp);
            id = rt_tok_vocab_find(t, s + i, clen);
            if (id < 0 && t->byte_fallback) {
                int all = 1;
                for (size_t k = 0; k < clen; k++)
                    all &= t->fallback_id[s[i + k]] >= 0;
                if (all) {
                    for (size_t k = 0; k < clen; k++)
                        w->sym_id[ns++] = t->fallback_id[s[i + k]];
                    last_unk = 0;
                    i += clen;
                    continue;
                }
            }
        }
        i += clen;
        if (id >= 0) {
            w->sym_id[ns++] = id;
            last_unk = 0;
        } else if (t->unk_id >= 0) {
            if (!(t->fuse_unk && last_unk))
                w->sym_id[ns++] = t->unk_id;
            last_unk = 1;
        } /* no unk token: the character is dropped, as in HF */
    }
    for (size_t i = 0; i < ns; i++) {
        w->sym_prev[i] = (int32_t)i - 1;
        w->sym_next[i] = i + 1 < ns ? (int32_t)(i + 1) : -1;
    }
    w->heap_len = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        if (!push_pair(t, w, i))
            return MC_ERR_NOMEM;
    while (w->heap_len > 0) {
        rt_tok_merge_ent e = heap_pop(w);
        size_t pos = e.pos;
        if (w->sym_id[pos] < 0)
            continue; /* merged away */
        int32_t next = w->sym_next[pos];
        if (next < 0)
            continue;
        uint32_t rank;
        int32_t result;
        if (!merge_get(t, w->sym_id[pos], w->sym_id[next], &rank, &result) ||
            result != e.new_id)
            continue; /* stale */
        w->sym_id[pos] = result;
        w->sym_id[next] = -1;
        int32_t nn = w->sym_next[next];
        w->sym_next[pos] = nn;
        if (nn >= 0)
            w->sym_prev[nn] = (int32_t)pos;
        int32_t prev = w->sym_prev[pos];
        if (prev >= 0 && !push_pair(t, w, (size_t)prev))
            return MC_ERR_NOMEM;
        if (!push_pair(t, w, pos))
            return MC_ERR_NOMEM;
    }
    if (!rt_tok_buf_reserve(out, ns * sizeof(int32_t)))
        return MC_ERR_NOMEM;
    for (int32_t i = ns ? 0 : -1; i >= 0; i = w->sym_next[i]) {
        memcpy(out->p + out->len, &w->sym_id[i], sizeof(int32_t));
        out->len += sizeof(int32_t);
    }
    return MC_OK;
}
