/* sampler.c: DistributedSampler semantics; see sampler.h. */
#include "trainer/data/sampler.h"

#include <stdlib.h>
#include <string.h>

#include "common/errors.h"

/*
 * torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the
 * CPU, bit for bit: PyTorch's CPU generator is MT19937 seeded with the low
 * 32 bits of the seed, and randperm swaps element i with i + random() % (n - i).
 * That is torch 1.13's rule for every n (checked here up to 2^32 / 20 + 1);
 * later PyTorch versions draw 64 bits from n >= 2^32 / 20 on, so past about
 * 214 million samples the order matches 1.13, not them.
 */
struct mt19937 {
    uint32_t s[624];
    int i;
};

static void mt_seed(struct mt19937 *m, uint64_t seed)
{
    m->s[0] = (uint32_t)(seed & 0xffffffffu);
    for (int j = 1; j < 624; j++)
        m->s[j] = 1812433253u * (m->s[j - 1] ^ (m->s[j - 1] >> 30)) + (uint32_t)j;
    m->i = 624;
}

static uint32_t mt_next(struct mt19937 *m)
{
    if (m->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
            m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        m->i = 0;
    }
    uint32_t y = m->s[m->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

static void torch_randperm(uint32_t *perm, size_t n, uint64_t seed)
{
    struct mt19937 m;
    mt_seed(&m, seed);
    for (size_t i = 0; i + 1 < n; i++) {
        size_t z = (size_t)(mt_next(&m) % (n - i));
        uint32_t t = perm[i];
        perm[i] = perm[i + z];
        perm[i + z] = t;
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
    if (s->shuffle)
        torch_randperm(s->perm, n, s->seed + (uint64_t)(int64_t)epoch);
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
