/*
 * prefetch.h: --prefetch, the input pipeline: a loader thread reads the
 * next batches into a small ring of host buffers while the step loop
 * computes the current one.
 *
 * The loader reads batches in exactly the order the step loop consumes
 * them: a batch source (trn_batch_next_fn) names each batch's indices, on
 * the loader thread only. For training that is trn_train_batches: its own
 * copy of the sampler (its own index arrays, so trn_sampler_set_epoch on
 * the step loop's sampler races with nothing), walking the epochs from
 * where the run starts (a resumed epoch's first batch) to the last; for
 * evaluation a fixed list. The consumer takes batches in order
 * (trn_prefetch_next) and gives them back in the same order
 * (trn_prefetch_release): it may hold two at once (the one computing and,
 * on a device, the one being uploaded).
 *
 * A sample that fails to read stops the loader: the batch it was in comes
 * out with rc and the dataset's message (the first failure within that
 * batch, as the synchronous path reports it), and no batch after it. The
 * consumer reports it when it reaches that batch, not before.
 *
 * The loader thread blocks SIGTERM, SIGINT and SIGALRM (the trainer's stop
 * handlers run on the main thread) and decodes each batch over its own
 * OpenMP threads. Host buffers come from an allocator the caller names
 * (pinned memory on CUDA) or aligned malloc.
 */
#ifndef CDDP_TRAINER_PREFETCH_H
#define CDDP_TRAINER_PREFETCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/data/dataset.h" /* trn_dataset */
#include "trainer/data/sampler.h" /* trn_sampler */

/* Fills idx (room for the source's batch size) with the next batch's
 * indices and returns how many; 0 when there are no more batches. */
typedef int (*trn_batch_next_fn)(void *arg, uint32_t *idx);

/* Training's batches: epochs [epoch, epochs), in each batches [first,
 * batches) of the sampler's order (first only in the first epoch; 0 after),
 * `batch` indices each, the epoch's last batch the rest. Pure. */
struct trn_train_batches {
    struct trn_sampler sampler; /* its own copy */
    int epoch, epochs;
    long b, batches;
    int batch;
};

/* Copies s's settings (not its arrays) into t; 0, or CDDP_ERANGE_ARG as
 * trn_sampler_init. The first batch is batch `first` of epoch `epoch`. */
int trn_train_batches_init(struct trn_train_batches *t, const struct trn_sampler *s, int batch,
                           int epoch, long first, int epochs);
int trn_train_batches_next(void *arg, uint32_t *idx); /* a trn_batch_next_fn */
void trn_train_batches_free(struct trn_train_batches *t);

/* A fixed list: idx[0..len) in batches of `batch`. Pure. */
struct trn_list_batches {
    const uint32_t *idx;
    size_t len, at;
    int batch;
};
int trn_list_batches_next(void *arg, uint32_t *idx); /* a trn_batch_next_fn */

/* Reads samples idx[0..n) of d into x (n samples, NCHW) and labels, over
 * OpenMP threads (datasets are read-only after open). 0, or -1 with err
 * the first failure's message (a corrupt JPEG). With *stop set the
 * remaining samples are skipped (the batch is then unused). */
int trn_batch_load(const struct trn_dataset *d, const uint32_t *idx, int n, float *x,
                   int32_t *labels, const atomic_bool *stop, char *err, size_t errlen);

/* One loaded batch. n == 0: the source had no more (the end). */
struct trn_batch {
    float *x;        /* (n, channels, height, width) */
    int32_t *labels; /* (n) */
    uint32_t *idx;   /* (n) the samples */
    int n;
    int rc; /* 0, or a sample failed to read: err says which */
    char err[512];
};

/* Where host buffers come from; NULL alloc: 64-byte aligned malloc. */
struct trn_host_alloc {
    void *(*alloc)(void *arg, size_t bytes); /* NULL when out of memory */
    void (*free)(void *arg, void *p);
    void *arg;
};

struct trn_prefetch_opts {
    const struct trn_dataset *data; /* read-only while the loader runs */
    int batch;                      /* the most samples a batch has */
    int ahead;                      /* batches loaded ahead of the consumer, >= 1 */
    int threads; /* OpenMP threads decoding (0: OpenMP's default; -1: all cores but one) */
    trn_batch_next_fn next;
    void *next_arg; /* used on the loader thread until trn_prefetch_free */
    struct trn_host_alloc host;
};

struct trn_prefetch;

/* Starts the loader. 0 and *out (freed by trn_prefetch_free), or a
 * negative code with err (out of memory, no thread). */
int trn_prefetch_start(struct trn_prefetch **out, const struct trn_prefetch_opts *o, char *err,
                       size_t errlen);
/* The next batch in order, waiting for the loader when it is not ready
 * yet (the time waited is added to trn_prefetch_wait_s). Owned by the
 * prefetcher; valid until it is released. After the end (n == 0) or a
 * failed batch, NULL. */
struct trn_batch *trn_prefetch_next(struct trn_prefetch *p);
/* Gives back the oldest batch held (b must be it): its buffer is reloaded. */
void trn_prefetch_release(struct trn_prefetch *p, struct trn_batch *b);
/* Seconds trn_prefetch_next has waited in all. */
double trn_prefetch_wait_s(const struct trn_prefetch *p);
/* Stops the loader (a batch in progress skips its remaining samples),
 * joins it and frees everything, batches held included. NULL: nothing. */
void trn_prefetch_free(struct trn_prefetch *p);

#endif
