/*
 * synthetic.c: the seed script's RandomDataset (torch.randn images,
 * torch.randint labels), generated on demand instead of held in memory
 * (50,000 ResNet-sized images would be 30 GB).
 *
 * Sample i of a split is a pure function of (seed, split, i): its own
 * splitmix64 stream feeds Box-Muller for the pixels, and a second stream a
 * bias-free bounded draw for the label. Every rank, thread and restart sees
 * the same data, in any order. The numbers are not torch's.
 */
#include "trainer/data/dataset.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/errors.h"

struct synthetic {
    struct trn_dataset base; /* first: the dataset pointer is the struct pointer */
    uint64_t key;            /* hash of (seed, split) */
};

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t next64(uint64_t *s)
{
    return mix64(*s += 0x9E3779B97F4A7C15ull);
}

/* Uniform in (0, 1]: never 0, so log() is finite. */
static double unit(uint64_t *s)
{
    return (double)((next64(s) >> 11) + 1) * (1.0 / 9007199254740992.0);
}

static int synthetic_get(const struct trn_dataset *d, size_t index, float *chw, int32_t *label,
                         char *err, size_t errlen)
{
    (void)err, (void)errlen;
    const struct synthetic *s = (const struct synthetic *)d;
    uint64_t st = mix64(s->key ^ mix64((uint64_t)index + 1));
    uint64_t lab = mix64(st ^ 0x6C6162656C6C6162ull); /* the label's own stream */
    uint64_t n = (uint64_t)d->num_classes, threshold = -n % n, r;
    do
        r = next64(&lab);
    while (r < threshold);
    *label = (int32_t)(r % n);

    size_t total = trn_dataset_sample_size(d);
    for (size_t i = 0; i < total; i += 2) {
        double u1 = unit(&st), u2 = unit(&st);
        double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586 * u2;
        chw[i] = (float)(rad * cos(ang));
        if (i + 1 < total)
            chw[i + 1] = (float)(rad * sin(ang));
    }
    return 0;
}

static void synthetic_close(struct trn_dataset *d)
{
    free(d);
}

int trn_synthetic_open(const struct trn_dataset_opts *o, struct trn_dataset **out, char *err,
                       size_t errlen)
{
    size_t len = o->num_samples ? o->num_samples : 10000;
    int size = o->image_size ? o->image_size : 224;
    int classes = o->num_classes ? o->num_classes : 1000;
    if (size < 1 || size > 4096 || classes < 1) {
        snprintf(err, errlen, "synthetic dataset: image size %d or %d classes out of range", size,
                 classes);
        return CDDP_ECONFIG;
    }
    struct synthetic *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    s->key = mix64(mix64(o->seed) ^ (o->split == TRN_SPLIT_TEST ? 0x7465737474657374ull : 0));
    s->base = (struct trn_dataset){
        .kind = "synthetic",
        .len = len,
        .channels = 3,
        .height = size,
        .width = size,
        .num_classes = classes,
        .get = synthetic_get,
        .close = synthetic_close,
    };
    *out = &s->base;
    return 0;
}
