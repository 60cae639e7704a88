/*
 * buckets.h: DDP's gradient buckets and their readiness, as pure functions.
 *
 * What torch.nn.parallel.DistributedDataParallel's Reducer decides, without
 * any communication (ddp.c is the shell that starts the allreduces):
 *
 *   - The plan. Parameters are grouped into buckets in reverse parameter
 *     order (the order backward produces their gradients: fc first, conv1
 *     last). A bucket is closed as soon as it holds at least its size limit;
 *     the first bucket's limit is small (1 MiB: PyTorch's
 *     kDefaultFirstBucketBytes), so the first allreduce starts early; the
 *     rest use --bucket-cap-mb (25 MiB). That is the layout PyTorch's
 *     Reducer rebuilds after its first iteration from the order gradients
 *     arrived in; ours is the same order from the first step, because the
 *     graph is static and known.
 *     Parameters live in one flat buffer in parameter order, so a run of
 *     consecutive parameters in reverse order is one contiguous slice of the
 *     gradient buffer: a bucket is [off, off + numel) of it, reduced in
 *     place (PyTorch's gradient_as_bucket_view, for free).
 *
 *   - Readiness. During backward each parameter tensor's gradient becomes
 *     final once; marking it ready counts its bucket down; a bucket whose
 *     count reaches zero is ready. Buckets are launched in order ("buckets
 *     are reduced in sequence" in the Reducer): a ready bucket waits until
 *     every bucket before it has launched, so every rank issues the same
 *     allreduces in the same order whatever order its gradients came in.
 *     Marking a tensor twice, or a range that is not whole tensors, is an
 *     error; so is finishing a backward with a bucket not launched.
 */
#ifndef CDDP_TRAINER_BUCKETS_H
#define CDDP_TRAINER_BUCKETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRN_FIRST_BUCKET_BYTES ((size_t)1 << 20) /* PyTorch's kDefaultFirstBucketBytes */
#define TRN_DEFAULT_BUCKET_CAP_MB 25.0           /* DDP's bucket_cap_mb */

struct trn_bucket {
    size_t off, numel; /* [off, off + numel) of the flat gradient buffer, in elements */
    size_t first;      /* its tensors: indices first .. first + count - 1 (parameter order) */
    size_t count;
};

struct trn_bucket_plan {
    size_t n_tensors;
    size_t *t_off, *t_numel;    /* (n_tensors) each tensor's place, in parameter order */
    int *t_bucket;              /* (n_tensors) the bucket each tensor belongs to */
    struct trn_bucket *buckets; /* (n_buckets) in launch order: bucket 0 holds the last tensors */
    int n_buckets;
};

/*
 * Plans the buckets for n tensors at off[i] with numel[i] elements of
 * elem_size bytes, in parameter order; the tensors must tile their buffer
 * (off[0] = 0, off[i + 1] = off[i] + numel[i], numel[i] > 0). first_cap
 * and cap are the first bucket's and the others' limits in bytes (> 0).
 * 0, or CDDP_ERANGE_ARG (bad tensors or limits; *p left empty), -ENOMEM.
 */
int trn_bucket_plan_build(struct trn_bucket_plan *p, const size_t *off, const size_t *numel,
                          size_t n, size_t elem_size, size_t first_cap, size_t cap);
void trn_bucket_plan_free(struct trn_bucket_plan *p);

/* Readiness during one backward. */
struct trn_bucket_ready {
    const struct trn_bucket_plan *plan;
    size_t *pending; /* (n_buckets) tensors not yet ready */
    uint8_t *ready;  /* (n_tensors) 1 once marked */
    int next;        /* buckets [0, next) are launched */
};

/* 0 or -ENOMEM. Borrows plan (it must outlive r). Starts reset. */
int trn_bucket_ready_init(struct trn_bucket_ready *r, const struct trn_bucket_plan *plan);
void trn_bucket_ready_free(struct trn_bucket_ready *r);

/* A new backward: nothing ready, nothing launched. */
void trn_bucket_ready_reset(struct trn_bucket_ready *r);

/*
 * Marks the tensors that exactly cover [off, off + numel) ready (one or
 * several consecutive tensors: a batch norm's weight and bias come
 * together). On return buckets [*launch_first, *launch_first + *n_launch)
 * are the ones to launch now, in that order (often none). 0, or
 * CDDP_ERANGE_ARG (the range does not start and end on tensor boundaries),
 * CDDP_EEXISTS (a tensor in it was already marked); on error nothing
 * changes and *n_launch is 0.
 */
int trn_bucket_ready_mark(struct trn_bucket_ready *r, size_t off, size_t numel, int *launch_first,
                          int *n_launch);

/* End of backward: 0 when every bucket was launched; else CDDP_ESTATE with
 * the first tensor (parameter order) never marked in *missing. */
int trn_bucket_ready_finish(const struct trn_bucket_ready *r, size_t *missing);

/*
 * SyncBatchNorm's merge (ddp.c's exchange, on both devices; pure like the
 * rest of this file): all holds world blocks of (2c + 1) floats, rank r's
 * [mean (c), biased variance (c), count] at r * (2c + 1). Per channel, in
 * rank order and in double, Chan et al.'s parallel formula (as PyTorch's
 * batch_norm_gather_stats_with_counts); a block with count <= 0 adds
 * nothing. Writes the global mean and biased variance (c each) and returns
 * the global count.
 */
double trn_bn_merge_stats(const float *all, int world, int c, float *mean, float *var);

#endif
