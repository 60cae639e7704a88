/*
 * jpeg_rate: how fast cddp-train's folder dataset turns JPEGs into
 * training samples (libjpeg-turbo decode, antialiased resize of the shorter
 * side, centre crop, normalisation: trainer/data/folder.c), on 1 thread
 * and on T threads (trn_batch_load, as the --prefetch loader reads).
 *
 *     jpeg_rate folder:DIR [IMAGE_SIZE [THREADS [SECONDS]]]
 *
 * Any --data spec works (synthetic: the rate of its generated pixels).
 * Prints one JSON line: images, image side, per-core and T-thread
 * images/s. tests/bench/bench_prefetch.py runs it.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/clock.h"
#include "trainer/data/dataset.h"
#include "trainer/prefetch.h"

/* Images per second reading every sample in passes of `batch`, for at
 * least `secs` seconds. */
static double rate(const struct trn_dataset *d, int threads, double secs)
{
    size_t per = trn_dataset_sample_size(d);
    int batch = (int)(d->len < 256 ? d->len : 256);
    float *x = malloc((size_t)batch * per * sizeof(float));
    int32_t *y = malloc((size_t)batch * sizeof(int32_t));
    uint32_t *idx = malloc((size_t)batch * sizeof(uint32_t));
    char err[512];
    omp_set_num_threads(threads);
    long done = 0;
    size_t at = 0;
    uint64_t t0 = cddp_mono_ns();
    double el = 0;
    while (el < secs) {
        for (int i = 0; i < batch; i++)
            idx[i] = (uint32_t)((at + (size_t)i) % d->len);
        at += (size_t)batch;
        if (trn_batch_load(d, idx, batch, x, y, NULL, err, sizeof(err)) != 0) {
            fprintf(stderr, "jpeg_rate: %s\n", err);
            exit(1);
        }
        done += batch;
        el = (double)(cddp_mono_ns() - t0) * 1e-9;
    }
    free(x);
    free(y);
    free(idx);
    return (double)done / el;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: jpeg_rate folder:DIR [IMAGE_SIZE [THREADS [SECONDS]]]\n");
        return 2;
    }
    struct trn_dataset_opts o = {.image_size = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 224};
    int threads = argc > 3 ? (int)strtol(argv[3], NULL, 10) : omp_get_num_procs();
    double secs = argc > 4 ? strtod(argv[4], NULL) : 5.0;
    struct trn_dataset *d;
    char err[512];
    if (trn_dataset_open(argv[1], &o, &d, err, sizeof(err)) != 0) {
        fprintf(stderr, "jpeg_rate: %s\n", err);
        return 2;
    }
    rate(d, 1, 0.2); /* warm the page cache */
    double one = rate(d, 1, secs), all = rate(d, threads, secs);
    printf("{\"images\": %zu, \"image_size\": %d, \"per_core_img_per_s\": %.1f, "
           "\"threads\": %d, \"img_per_s\": %.1f}\n",
           d->len, o.image_size, one, threads, all);
    trn_dataset_close(d);
    return 0;
}
