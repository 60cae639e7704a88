/*
 * prefetch.c: the loader thread and its ring of batches (prefetch.h).
 *
 * The ring has ahead + 2 entries: the consumer may hold two (computing,
 * uploading) while the loader keeps `ahead` more ready. Three counters,
 * under one mutex, say where everyone is: `filled` batches published by
 * the loader, `taken` by the consumer, `released` back. The loader fills
 * entry filled % size while filled - released < size; the consumer takes
 * entry taken % size while taken < filled. The loader ends after
 * publishing the end (n == 0) or a failed batch.
 */
#include "trainer/prefetch.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"   /* cddp_mono_ns */
#include "common/errors.h"  /* CDDP_ERANGE_ARG */
#include "common/strutil.h" /* cddp_strlcpy */
#include "trainer/fatal.h"  /* trn_fatal */

/* ---- batch sources (pure) ---- */

int trn_train_batches_init(struct trn_train_batches *t, const struct trn_sampler *s, int batch,
                           int epoch, long first, int epochs)
{
    memset(t, 0, sizeof(*t));
    int rc = trn_sampler_init(&t->sampler, s->dataset_len, s->world, s->rank, s->shuffle,
                              s->drop_last, s->seed);
    if (rc)
        return rc;
    t->batch = batch;
    t->batches = (long)((t->sampler.num_samples + (size_t)batch - 1) / (size_t)batch);
    t->epoch = epoch;
    t->epochs = epochs;
    t->b = first;
    return 0;
}

int trn_train_batches_next(void *arg, uint32_t *idx)
{
    struct trn_train_batches *t = arg;
    if (t->b >= t->batches) {
        t->epoch++;
        t->b = 0;
    }
    if (t->epoch >= t->epochs)
        return 0;
    trn_sampler_set_epoch(&t->sampler, t->epoch);
    size_t at = (size_t)t->b * (size_t)t->batch, left = t->sampler.num_samples - at;
    int n = left < (size_t)t->batch ? (int)left : t->batch;
    memcpy(idx, t->sampler.indices + at, (size_t)n * sizeof(uint32_t));
    t->b++;
    return n;
}

void trn_train_batches_free(struct trn_train_batches *t)
{
    trn_sampler_free(&t->sampler);
}

int trn_list_batches_next(void *arg, uint32_t *idx)
{
    struct trn_list_batches *l = arg;
    size_t left = l->len - l->at;
    int n = left < (size_t)l->batch ? (int)left : l->batch;
    memcpy(idx, l->idx + l->at, (size_t)n * sizeof(uint32_t));
    l->at += (size_t)n;
    return n;
}

/* ---- loading one batch ---- */

int trn_batch_load(const struct trn_dataset *d, const uint32_t *idx, int n, float *x,
                   int32_t *labels, const atomic_bool *stop, char *err, size_t errlen)
{
    size_t per = trn_dataset_sample_size(d);
    int failed = 0;
    if (errlen)
        err[0] = '\0';
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < n; i++) {
        if (stop && atomic_load_explicit(stop, memory_order_relaxed))
            continue; /* being freed: nobody will read this batch */
        char e[512];
        if (trn_dataset_get(d, idx[i], x + (size_t)i * per, &labels[i], e, sizeof(e)) != 0) {
#pragma omp critical
            if (!failed++)
                cddp_strlcpy(err, e, errlen);
        }
    }
    return failed ? -1 : 0;
}

/* ---- the ring ---- */

struct trn_prefetch {
    struct trn_prefetch_opts o;
    struct trn_batch *ring;
    int size;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t ready, room; /* a batch was filled; one was released */
    long filled, taken, released;
    bool over; /* the consumer saw the end or a failed batch */
    atomic_bool stop;
    double wait_s;
};

static void *host_alloc(const struct trn_host_alloc *h, size_t bytes)
{
    if (h->alloc)
        return h->alloc(h->arg, bytes);
    size_t rounded = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void host_free(const struct trn_host_alloc *h, void *p)
{
    if (!p)
        return;
    if (h->alloc)
        h->free(h->arg, p);
    else
        free(p);
}

static void *loader(void *arg)
{
    struct trn_prefetch *p = arg;
    if (p->o.threads > 0)
        omp_set_num_threads(p->o.threads);
    else if (p->o.threads < 0) /* the step loop's thread keeps a core */
        omp_set_num_threads(omp_get_num_procs() > 1 ? omp_get_num_procs() - 1 : 1);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!atomic_load(&p->stop) && p->filled - p->released >= p->size)
            pthread_cond_wait(&p->room, &p->mu);
        long k = p->filled;
        pthread_mutex_unlock(&p->mu);
        if (atomic_load(&p->stop))
            break;
        struct trn_batch *e = &p->ring[k % p->size];
        e->n = p->o.next(p->o.next_arg, e->idx);
        e->rc = e->n > 0 ? trn_batch_load(p->o.data, e->idx, e->n, e->x, e->labels, &p->stop,
                                          e->err, sizeof(e->err))
                         : 0;
        pthread_mutex_lock(&p->mu);
        p->filled++;
        pthread_cond_signal(&p->ready);
        pthread_mutex_unlock(&p->mu);
        if (e->n == 0 || e->rc)
            break;
    }
    return NULL;
}

int trn_prefetch_start(struct trn_prefetch **out, const struct trn_prefetch_opts *o, char *err,
                       size_t errlen)
{
    *out = NULL;
    if (o->ahead < 1 || o->batch < 1) {
        snprintf(err, errlen, "prefetch: %d batches ahead of %d samples", o->ahead, o->batch);
        return CDDP_ERANGE_ARG;
    }
    struct trn_prefetch *p = calloc(1, sizeof(*p));
    if (!p) {
        snprintf(err, errlen, "prefetch: out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    p->o = *o;
    p->size = o->ahead + 2;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->ready, NULL);
    pthread_cond_init(&p->room, NULL);
    atomic_init(&p->stop, false);
    size_t xbytes = (size_t)o->batch * trn_dataset_sample_size(o->data) * sizeof(float);
    p->ring = calloc((size_t)p->size, sizeof(*p->ring));
    for (int i = 0; p->ring && i < p->size; i++) {
        struct trn_batch *e = &p->ring[i];
        e->x = host_alloc(&o->host, xbytes);
        e->labels = malloc((size_t)o->batch * sizeof(int32_t));
        e->idx = malloc((size_t)o->batch * sizeof(uint32_t));
        if (!e->x || !e->labels || !e->idx)
            goto nomem;
    }
    if (!p->ring)
        goto nomem;
    /* The loader (and the OpenMP threads it starts) inherit this mask. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(&p->thread, NULL, loader, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "prefetch: cannot start the loader thread: %s", strerror(rc));
        trn_prefetch_free(p);
        return CDDP_ERR_FROM_ERRNO(rc);
    }
    p->started = true;
    *out = p;
    return 0;
nomem:
    snprintf(err, errlen, "prefetch: out of memory for %d batches of %zu bytes", p->size, xbytes);
    trn_prefetch_free(p);
    return CDDP_ERR_FROM_ERRNO(ENOMEM);
}

struct trn_batch *trn_prefetch_next(struct trn_prefetch *p)
{
    if (p->over)
        return NULL;
    uint64_t t0 = cddp_mono_ns();
    pthread_mutex_lock(&p->mu);
    while (p->taken == p->filled)
        pthread_cond_wait(&p->ready, &p->mu);
    struct trn_batch *e = &p->ring[p->taken % p->size];
    p->taken++;
    pthread_mutex_unlock(&p->mu);
    p->wait_s += (double)(cddp_mono_ns() - t0) * 1e-9;
    if (e->n == 0 || e->rc)
        p->over = true;
    return e->n == 0 ? NULL : e;
}

void trn_prefetch_release(struct trn_prefetch *p, struct trn_batch *b)
{
    pthread_mutex_lock(&p->mu);
    if (b != &p->ring[p->released % p->size] || p->released >= p->taken) {
        pthread_mutex_unlock(&p->mu);
        trn_fatal("prefetch: batches released out of order");
    }
    p->released++;
    pthread_cond_signal(&p->room);
    pthread_mutex_unlock(&p->mu);
}

double trn_prefetch_wait_s(const struct trn_prefetch *p)
{
    return p->wait_s;
}

void trn_prefetch_free(struct trn_prefetch *p)
{
    if (!p)
        return;
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, true);
        pthread_cond_signal(&p->room);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    for (int i = 0; p->ring && i < p->size; i++) {
        host_free(&p->o.host, p->ring[i].x);
        free(p->ring[i].labels);
        free(p->ring[i].idx);
    }
    free(p->ring);
    pthread_cond_destroy(&p->ready);
    pthread_cond_destroy(&p->room);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
