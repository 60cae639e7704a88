/* sampler.c: DistributedSampler semantics; see sampler.h. */
#include "trainer/data/sampler.h"

#include <stdlib.h>
#include <string.h>

#include "common/errors.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) without modulo bias (Lemire's method with rejection). */
static uint64_t bounded(uint64_t *state, uint64_t n)
{
    uint64_t threshold = -n % n;
    for (;;) {
        uint64_t r = splitmix64(state);
        if (r >= threshold)
            return r % n;
    }
}

int trn_sampler_init(struct trn_sampler *s, size_t dataset_len, int world, int rank, bool shuffle,
                     bool drop_last, uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    if (dataset_len == 0 || dataset_len > UINT32_MAX || world < 1 || rank < 0 || rank >= world)
        return CDDP_ERANGE_ARG;
    size_t w = (size_t)world;
    if (drop_last && dataset_len % w != 0) {
        if (dataset_len < w)
            return CDDP_ERANGE_ARG;
        s->num_samples = (dataset_len - w + w - 1) / w; /* ceil((len - world) / world) */
    } else {
        s->num_samples = (dataset_len + w - 1) / w;
    }
    if (s->num_samples == 0)
        return CDDP_ERANGE_ARG;
    s->dataset_len = dataset_len;
    s->world = world;
    s->rank = rank;
    s->shuffle = shuffle;
    s->drop_last = drop_last;
    s->seed = seed;
    s->epoch = -1;
    s->total_size = s->num_samples * w;
    s->indices = malloc(s->num_samples * sizeof(uint32_t));
    s->perm = malloc(dataset_len * sizeof(uint32_t));
    if (s->indices == NULL || s->perm == NULL) {
        trn_sampler_free(s);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    return 0;
}

void trn_sampler_set_epoch(struct trn_sampler *s, int epoch)
{
    if (s->epoch == epoch)
        return;
    size_t n = s->dataset_len;
    for (size_t i = 0; i < n; i++)
        s->perm[i] = (uint32_t)i;
    if (s->shuffle) {
        uint64_t state = s->seed + (uint64_t)(int64_t)epoch;
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = (size_t)bounded(&state, (uint64_t)i + 1);
            uint32_t t = s->perm[i];
            s->perm[i] = s->perm[j];
            s->perm[j] = t;
        }
    }
    /* Position k of the padded (or cut) list is perm[k % n]: padding repeats the head. */
    size_t w = (size_t)s->world;
    for (size_t i = 0; i < s->num_samples; i++)
        s->indices[i] = s->perm[((size_t)s->rank + i * w) % n];
    s->epoch = epoch;
}

void trn_sampler_free(struct trn_sampler *s)
{
    free(s->indices);
    free(s->perm);
    s->indices = NULL;
    s->perm = NULL;
}
