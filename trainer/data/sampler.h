/*
 * sampler.h: which dataset indices this rank trains on, in which order.
 *
 * The semantics of torch.utils.data.DistributedSampler (num_replicas = world,
 * rank, shuffle, seed, drop_last):
 *   - num_samples = ceil((len - world) / world) when drop_last and len % world,
 *     else ceil(len / world); total_size = num_samples * world;
 *   - the epoch's order is a permutation of 0..len-1 seeded by seed + epoch
 *     (identity without shuffle);
 *   - without drop_last it is padded to total_size by repeating its head
 *     (the whole list as many times as needed); with drop_last it is cut;
 *   - this rank takes indices[rank : total_size : world] (strided).
 * The indices equal PyTorch's exactly, shuffled or not: the shuffle is
 * torch.randperm's algorithm on PyTorch's CPU generator (MT19937 seeded with
 * seed + epoch), so a C run and a PyTorch run see the same samples in the
 * same order (checked against torch 1.13 in tests/compat/test_sampler_torch.py).
 */
#ifndef CDDP_TRAINER_SAMPLER_H
#define CDDP_TRAINER_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct trn_sampler {
    size_t dataset_len;
    int world;
    int rank;
    bool shuffle;
    bool drop_last;
    uint64_t seed;
    int epoch;          /* the epoch indices[] was computed for; -1 before set_epoch */
    size_t num_samples; /* indices this rank gets per epoch */
    size_t total_size;  /* num_samples * world */
    uint32_t *indices;  /* (num_samples) this rank's indices for `epoch` */
    uint32_t *perm;     /* (dataset_len) scratch: the epoch's full order */
};

/* 0, or CDDP_ERANGE_ARG for an empty dataset, world < 1, rank outside 0..world-1,
 * or drop_last with fewer samples than ranks. */
int trn_sampler_init(struct trn_sampler *s, size_t dataset_len, int world, int rank, bool shuffle,
                     bool drop_last, uint64_t seed);
/* Computes this rank's indices for the epoch (cheap to call again for the same epoch). */
void trn_sampler_set_epoch(struct trn_sampler *s, int epoch);
void trn_sampler_free(struct trn_sampler *s);

#endif
