/* cmp_merge_queue.c - the merge's writer thread: output chunks are written
 * (and summed) on a thread of their own while the row threads compute the next
 * chunk, so computing and copying into the page cache overlap; and the
 * check sum of what is written (contract in cmp_merge_internal.h).
 *
 * Two slots, used in turn: the producer fills slot k while the writer
 * drains slot k - 1, and a slot is handed back only once written, so
 * chunks reach the file in the order they were queued.  A slot points at
 * either its own buffer (computed rows) or mapped input (copied as is);
 * input pages are dropped by the writer once written. */
#include "cmp_merge_internal.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mc_alloc.h"

/* ---- check sum ----------------------------------------------------------
 * A streaming 64-bit check sum of the bytes written, independent of how
 * they are chunked: four multiply-rotate lanes over 32-byte blocks (a few
 * GB/s), so the output can be read back and compared with what was
 * written at little cost.  Not cryptographic: it catches files that were
 * replaced or truncated after we wrote them, not an adversary. */

#define WSUM_P 0x9E3779B97F4A7C15ull

void cmp_merge_wsum_init_(wsum *s)
{
    memset(s, 0, sizeof *s);
    for (int l = 0; l < 4; l++)
        s->lane[l] = 0x243F6A8885A308D3ull + (uint64_t)l;
}

static inline void wsum_block(wsum *s, const unsigned char *p)
{
    for (int l = 0; l < 4; l++) {
        uint64_t w, x;
        memcpy(&w, p + 8 * l, 8);
        x = s->lane[l] ^ w;
        s->lane[l] = ((x << 29) | (x >> 35)) * WSUM_P;
    }
}

void cmp_merge_wsum_add_(wsum *s, const void *data, size_t n)
{
    const unsigned char *p = data;
    s->len += n;
    if (s->nc) {
        size_t k = 32 - s->nc < n ? 32 - s->nc : n;
        memcpy(s->carry + s->nc, p, k);
        s->nc += k;
        p += k;
        n -= k;
        if (s->nc < 32)
            return;
        wsum_block(s, s->carry);
        s->nc = 0;
    }
    for (; n >= 32; n -= 32, p += 32)
        wsum_block(s, p);
    memcpy(s->carry, p, n);
    s->nc = n;
}

uint64_t cmp_merge_wsum_end_(wsum *s)
{
    memset(s->carry + s->nc, 0, 32 - s->nc);
    wsum_block(s, s->carry);
    uint64_t h = s->len * WSUM_P;
    for (int l = 0; l < 4; l++)
        h = (h ^ s->lane[l]) * WSUM_P + (uint64_t)l;
    return h ^ (h >> 31);
}

/* ---- the queue ------------------------------------------------------------ */

typedef struct mq_slot {
    const void *data;        /* bytes to write */
    size_t len;
    wsum *sum;               /* summed before writing, or NULL */
    const void *drop;        /* input range to drop after writing, or NULL */
    uint64_t drop_len;
    int full;                /* queued, not yet written */
} mq_slot;

struct merge_queue {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* a slot filled or emptied, or stop */
    mq_slot slot[2];
    void *buf[2];            /* each cap bytes */
    size_t next;             /* slot the producer fills next */
    fmt_st_writer *w;        /* current shard, set while the queue is empty */
    int stop;
    mc_status st;            /* first write error */
    mc_error err;
};

void cmp_merge_drop_range_(const void *p, uint64_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (pg <= 0 || n == 0)
        return;
    uintptr_t a = (uintptr_t)p, e = a + (uintptr_t)n;
    uintptr_t s = (a + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    e &= ~((uintptr_t)pg - 1);
    if (e > s)
        madvise((void *)s, e - s, MADV_DONTNEED);
}

static void *writer_main(void *arg)
{
    merge_queue *q = arg;
    size_t k = 0;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->slot[k].full && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (!q->slot[k].full)
            break;
        mq_slot s = q->slot[k];
        int failed = q->st != MC_OK;
        pthread_mutex_unlock(&q->mu);
        mc_status st = MC_OK;
        mc_error e;
        if (!failed) {
            if (s.sum)
                cmp_merge_wsum_add_(s.sum, s.data, s.len);
            st = fmt_st_writer_write(q->w, s.data, s.len, &e);
        }
        if (s.drop)
            cmp_merge_drop_range_(s.drop, s.drop_len);
        pthread_mutex_lock(&q->mu);
        if (st != MC_OK && q->st == MC_OK) {
            q->st = st;
            q->err = e;
        }
        q->slot[k].full = 0;
        pthread_cond_broadcast(&q->cv);
        k ^= 1;
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

mc_status cmp_merge_queue_create_(size_t cap, merge_queue **out, mc_error *err)
{
    *out = NULL;
    merge_queue *q = mc_calloc(1, sizeof *q);
    if (!q)
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "out of memory");
    q->buf[0] = mc_malloc(cap ? cap : 1);
    q->buf[1] = mc_malloc(cap ? cap : 1);
    if (!q->buf[0] || !q->buf[1]) {
        mc_free(q->buf[0]);
        mc_free(q->buf[1]);
        mc_free(q);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1, "out of memory");
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->th, NULL, writer_main, q) != 0) {
        pthread_cond_destroy(&q->cv);
        pthread_mutex_destroy(&q->mu);
        mc_free(q->buf[0]);
        mc_free(q->buf[1]);
        mc_free(q);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "cannot start the writer thread");
    }
    *out = q;
    return MC_OK;
}

void *cmp_merge_queue_buffer_(merge_queue *q)
{
    /* The producer's next slot must be free before it fills its buffer. */
    pthread_mutex_lock(&q->mu);
    while (q->slot[q->next].full)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    return q->buf[q->next];
}

mc_status cmp_merge_queue_push_(merge_queue *q, const void *data, size_t len,
                                wsum *sum, const void *drop,
                                uint64_t drop_len, mc_error *err)
{
    pthread_mutex_lock(&q->mu);
    while (q->slot[q->next].full)
        pthread_cond_wait(&q->cv, &q->mu);
    mc_status st = q->st;
    if (st == MC_OK) {
        q->slot[q->next] = (mq_slot){data, len, sum, drop, drop_len, 1};
        q->next ^= 1;
        pthread_cond_broadcast(&q->cv);
    } else if (err) {
        *err = q->err;
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

mc_status cmp_merge_queue_drain_(merge_queue *q, mc_error *err)
{
    pthread_mutex_lock(&q->mu);
    while (q->slot[0].full || q->slot[1].full)
        pthread_cond_wait(&q->cv, &q->mu);
    mc_status st = q->st;
    if (st != MC_OK && err)
        *err = q->err;
    pthread_mutex_unlock(&q->mu);
    return st;
}

void cmp_merge_queue_set_writer_(merge_queue *q, fmt_st_writer *w)
{
    pthread_mutex_lock(&q->mu);
    q->w = w;
    q->st = MC_OK;
    pthread_mutex_unlock(&q->mu);
}

void cmp_merge_queue_free_(merge_queue *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->th, NULL);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    mc_free(q->buf[0]);
    mc_free(q->buf[1]);
    mc_free(q);
}
