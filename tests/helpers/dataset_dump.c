/*
 * cddp-dataset-dump: a test helper. Opens a dataset as cddp-train does and
 * writes samples to a safetensors file: "images" F32 (N, C, H, W), "labels"
 * I64 (N), metadata len/num_classes/channels/height/width.
 *
 *   cddp-dataset-dump SPEC train|test OUT [--image-size N] [--limit N]
 *                     [--num-samples N] [--num-classes N] [--seed N]
 *                     [--first N | --indices I,J,K]
 *
 * Samples 0..N-1 with --first N (default: all), or exactly those listed.
 * Errors: one line on stderr, exit 1; usage: exit 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/exitcodes.h"
#include "common/strutil.h"
#include "trainer/data/dataset.h"
#include "trainer/safetensors.h"

static int usage(const char *why)
{
    fprintf(stderr, "cddp-dataset-dump: %s\n", why);
    return CDDP_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return usage("usage: SPEC train|test OUT [options]");
    struct trn_dataset_opts o = {0};
    if (strcmp(argv[2], "test") == 0)
        o.split = TRN_SPLIT_TEST;
    else if (strcmp(argv[2], "train") != 0)
        return usage("split must be train or test");
    long first = -1, v;
    uint32_t *idx = NULL;
    size_t n_idx = 0;
    for (int i = 4; i < argc; i++) {
        if (i + 1 >= argc)
            return usage("option without a value");
        const char *a = argv[i], *val = argv[++i];
        if (strcmp(a, "--indices") == 0) {
            const char *p = val;
            idx = malloc((strlen(val) / 2 + 1) * sizeof(*idx));
            while (*p) {
                char num[32];
                size_t k = strcspn(p, ",");
                if (k == 0 || k >= sizeof(num))
                    return usage("bad --indices");
                memcpy(num, p, k);
                num[k] = '\0';
                if (cddp_parse_long(num, 0, UINT32_MAX, &v) != 0)
                    return usage("bad --indices");
                idx[n_idx++] = (uint32_t)v;
                p += k + (p[k] == ',');
            }
            continue;
        }
        if (cddp_parse_long(val, 0, 1L << 40, &v) != 0)
            return usage("bad number");
        if (strcmp(a, "--image-size") == 0)
            o.image_size = (int)v;
        else if (strcmp(a, "--limit") == 0)
            o.limit = (size_t)v;
        else if (strcmp(a, "--num-samples") == 0)
            o.num_samples = (size_t)v;
        else if (strcmp(a, "--num-classes") == 0)
            o.num_classes = (int)v;
        else if (strcmp(a, "--seed") == 0)
            o.seed = (uint64_t)v;
        else if (strcmp(a, "--first") == 0)
            first = v;
        else
            return usage("unknown option");
    }
    char err[1024];
    struct trn_dataset *d;
    if (trn_dataset_open(argv[1], &o, &d, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-dataset-dump: %s\n", err);
        return CDDP_EXIT_FAILURE;
    }
    if (idx == NULL) {
        n_idx = first >= 0 && (size_t)first < d->len ? (size_t)first : d->len;
        idx = malloc((n_idx ? n_idx : 1) * sizeof(*idx));
        for (size_t i = 0; i < n_idx; i++)
            idx[i] = (uint32_t)i;
    }
    size_t per = trn_dataset_sample_size(d);
    float *x = malloc((n_idx ? n_idx : 1) * per * sizeof(float));
    int32_t *y = malloc((n_idx ? n_idx : 1) * sizeof(int32_t));
    int64_t *y64 = malloc((n_idx ? n_idx : 1) * sizeof(int64_t));
    int status = CDDP_EXIT_OK;
    if (trn_dataset_get_batch(d, idx, n_idx, x, y, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-dataset-dump: %s\n", err);
        status = CDDP_EXIT_FAILURE;
    } else {
        for (size_t i = 0; i < n_idx; i++)
            y64[i] = y[i];
        char len[32], nc[32], c[16], h[16], w[16];
        snprintf(len, sizeof(len), "%zu", d->len);
        snprintf(nc, sizeof(nc), "%d", d->num_classes);
        snprintf(c, sizeof(c), "%d", d->channels);
        snprintf(h, sizeof(h), "%d", d->height);
        snprintf(w, sizeof(w), "%d", d->width);
        struct trn_st_meta meta[] = {
            {"len", len}, {"num_classes", nc}, {"channels", c}, {"height", h}, {"width", w}};
        struct trn_st_tensor t[] = {
            {.name = "images",
             .dtype = TRN_ST_F32,
             .ndim = 4,
             .shape = {n_idx, (uint64_t)d->channels, (uint64_t)d->height, (uint64_t)d->width},
             .data = x},
            {.name = "labels", .dtype = TRN_ST_I64, .ndim = 1, .shape = {n_idx}, .data = y64},
        };
        if (trn_st_save(argv[3], t, 2, meta, 5, err, sizeof(err)) != 0) {
            fprintf(stderr, "cddp-dataset-dump: %s\n", err);
            status = CDDP_EXIT_FAILURE;
        }
    }
    free(x);
    free(y);
    free(y64);
    free(idx);
    trn_dataset_close(d);
    return status;
}
