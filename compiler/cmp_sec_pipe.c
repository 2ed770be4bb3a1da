/* cmp_sec_pipe.c - the artifact's sections written by a second thread
 * while the next one is computed (see cmp_compile_internal.h).
 *
 * Two buffers alternate: the caller fills one while the thread hands the
 * other to fmt_art_writer_write (hash, copy into the page cache, and the
 * kernel's dirty-page throttling, which blocks a writer on big outputs).
 * Sections still reach the writer one at a time, in order, so the file is
 * byte for byte what writing them inline gives. */
#include "cmp_compile_internal.h"

#include <pthread.h>
#include <string.h>

#include "mc_alloc.h"

struct cmp_sec_pipe {
    fmt_art_writer *w;        /* borrowed */
    uint8_t *buf[2];          /* [2][cap] */
    size_t len[2];            /* bytes queued in buf[i]; 0 = free */
    int next;                 /* buffer the caller fills next */
    int stop;                 /* finish: no more submissions */
    mc_status st;             /* first write failure */
    mc_error err;             /* its context */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* signalled on every change */
    pthread_t th;
};

static void *writer_main(void *arg)
{
    cmp_sec_pipe *p = arg;
    int i = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->len[i] == 0 && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->len[i] == 0)
            break; /* stopped with nothing queued */
        size_t n = p->len[i];
        mc_status st = p->st;
        pthread_mutex_unlock(&p->mu);
        /* after a failure the rest is dropped: the file is aborted anyway */
        if (st == MC_OK)
            st = fmt_art_writer_write(p->w, p->buf[i], n, &p->err);
        pthread_mutex_lock(&p->mu);
        p->st = st;
        p->len[i] = 0;
        pthread_cond_broadcast(&p->cv);
        i ^= 1;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

mc_status cmp_sec_pipe_create(fmt_art_writer *w, size_t cap,
                              cmp_sec_pipe **out, mc_error *err)
{
    *out = NULL;
    cmp_sec_pipe *p = mc_calloc(1, sizeof *p);
    if (!p || !(p->buf[0] = mc_malloc(cap ? cap : 1)) ||
        !(p->buf[1] = mc_malloc(cap ? cap : 1))) {
        if (p) {
            mc_free(p->buf[0]);
            mc_free(p);
        }
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "out of memory (two section buffers of %zu bytes)", cap);
    }
    p->w = w;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, writer_main, p) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        mc_free(p->buf[0]);
        mc_free(p->buf[1]);
        mc_free(p);
        return mc_fail(err, MC_ERR_NOMEM, NULL, NULL, -1,
                       "cannot start the writer thread");
    }
    *out = p;
    return MC_OK;
}

uint8_t *cmp_sec_pipe_buffer(cmp_sec_pipe *p)
{
    pthread_mutex_lock(&p->mu);
    while (p->len[p->next] != 0 && p->st == MC_OK)
        pthread_cond_wait(&p->cv, &p->mu);
    int failed = p->st != MC_OK;
    pthread_mutex_unlock(&p->mu);
    return failed ? NULL : p->buf[p->next];
}

void cmp_sec_pipe_submit(cmp_sec_pipe *p, size_t n)
{
    if (n == 0)
        return; /* an empty section has nothing to write */
    pthread_mutex_lock(&p->mu);
    p->len[p->next] = n;
    p->next ^= 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

mc_status cmp_sec_pipe_finish(cmp_sec_pipe *p, mc_error *err)
{
    if (!p)
        return MC_OK;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    mc_status st = p->st;
    if (st != MC_OK && err)
        *err = p->err;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    mc_free(p->buf[0]);
    mc_free(p->buf[1]);
    mc_free(p);
    return st;
}
