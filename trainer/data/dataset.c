/* dataset.c: opening a dataset by its spec, batches; see dataset.h. */
#include "trainer/data/dataset.h"

#include <stdio.h>
#include <string.h>

#include "common/errors.h"

#define DEFAULT_IDX_DIR "/usr/share/datasets/fashion-mnist"

int trn_dataset_open(const char *spec, const struct trn_dataset_opts *opts,
                     struct trn_dataset **out, char *err, size_t errlen)
{
    *out = NULL;
    if (opts->limit > UINT32_MAX || opts->num_samples > UINT32_MAX) {
        snprintf(err, errlen, "--data %s: more than %u samples are not supported", spec,
                 (unsigned)UINT32_MAX);
        return CDDP_ECONFIG;
    }
    if (strcmp(spec, "synthetic") == 0)
        return trn_synthetic_open(opts, out, err, errlen);
    if (strcmp(spec, "idx") == 0)
        return trn_idx_open(DEFAULT_IDX_DIR, opts, out, err, errlen);
    if (strncmp(spec, "idx:", 4) == 0 && spec[4] != '\0')
        return trn_idx_open(spec + 4, opts, out, err, errlen);
    if (strncmp(spec, "folder:", 7) == 0 && spec[7] != '\0')
        return trn_folder_open(spec + 7, opts, out, err, errlen);
    snprintf(err, errlen, "--data '%s': unknown dataset (use synthetic, idx[:DIR] or folder:DIR)",
             spec);
    return CDDP_ECONFIG;
}

int trn_dataset_get_batch(const struct trn_dataset *d, const uint32_t *indices, size_t n, float *x,
                          int32_t *y, char *err, size_t errlen)
{
    size_t per = trn_dataset_sample_size(d);
    for (size_t i = 0; i < n; i++) {
        if (indices[i] >= d->len) {
            snprintf(err, errlen, "%s dataset: index %u out of range (%zu samples)", d->kind,
                     (unsigned)indices[i], d->len);
            return CDDP_ERANGE_ARG;
        }
        int rc = d->get(d, indices[i], x + i * per, &y[i], err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

void trn_dataset_close(struct trn_dataset *d)
{
    if (d != NULL)
        d->close(d);
}
