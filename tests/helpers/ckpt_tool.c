/*
 * cddp-ckpt-tool: a test helper around trainer/checkpoint.c, with the model
 * table taken from a file instead of a model.
 *
 *   cddp-ckpt-tool from-weights ARCH CLASSES IN OUT
 *       loads the state_dict IN with trn_weights_load (--init's path) and
 *       writes the checkpoint OUT with trn_ckpt_save; each parameter's
 *       momentum buffer is 0.5 * the parameter, metadata fixed (step 7).
 *   cddp-ckpt-tool to-weights ARCH CLASSES IN OUT
 *       loads the checkpoint IN with trn_ckpt_load and writes its state_dict
 *       with trn_weights_save (--save's path).
 *
 * Errors: one line on stderr, exit 1; usage: exit 2.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/exitcodes.h"
#include "common/strutil.h"
#include "trainer/checkpoint.h"

static int is_param(const char *name)
{
    static const char *const bufs[] = {"running_mean", "running_var", "num_batches_tracked"};
    size_t n = strlen(name);
    for (size_t i = 0; i < 3; i++) {
        size_t k = strlen(bufs[i]);
        if (n >= k && strcmp(name + n - k, bufs[i]) == 0)
            return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    long classes;
    if (argc != 6 || cddp_parse_long(argv[3], 1, 1 << 20, &classes) != 0 ||
        (strcmp(argv[1], "from-weights") != 0 && strcmp(argv[1], "to-weights") != 0)) {
        fprintf(stderr, "usage: cddp-ckpt-tool from-weights|to-weights ARCH CLASSES IN OUT\n");
        return CDDP_EXIT_USAGE;
    }
    bool from = strcmp(argv[1], "from-weights") == 0;
    const char *arch = argv[2], *in = argv[4], *out = argv[5];
    char err[2048];
    struct trn_st_file f;
    if (trn_st_open(in, &f, err, sizeof(err)) != 0) {
        fprintf(stderr, "cddp-ckpt-tool: %s\n", err);
        return CDDP_EXIT_FAILURE;
    }
    struct trn_ckpt_tensor *model = calloc(f.n_tensors + 1, sizeof(*model));
    struct trn_ckpt_tensor *mom = calloc(f.n_tensors + 1, sizeof(*mom));
    size_t nm = 0, np = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const struct trn_st_tensor *t = &f.tensors[i];
        if (strncmp(t->name, "optimizer.", 10) == 0)
            continue;
        struct trn_ckpt_tensor c = {.name = t->name,
                                    .dtype = t->dtype == TRN_ST_I64 ? TRN_ST_I64 : TRN_ST_F32,
                                    .ndim = t->ndim};
        for (int d = 0; d < t->ndim; d++)
            c.shape[d] = (int64_t)t->shape[d];
        c.data = calloc(t->numel ? t->numel : 1, 8);
        model[nm++] = c;
        if (is_param(t->name)) {
            c.data = calloc(t->numel ? t->numel : 1, 8);
            mom[np++] = c;
        }
    }
    struct trn_ckpt_meta meta = {.num_classes = (int)classes,
                                 .epoch = 1,
                                 .step = 7,
                                 .epoch_offset = 64,
                                 .world_size = 2,
                                 .batch_size = 16,
                                 .dataset_len = 1000,
                                 .shuffle = true,
                                 .optimizer_steps = 7,
                                 .lr = 0.01,
                                 .momentum = 0.9,
                                 .weight_decay = 1e-4};
    cddp_strlcpy(meta.arch, arch, sizeof(meta.arch));
    int rc;
    if (from) {
        rc = trn_weights_load(in, model, nm, err, sizeof(err));
        for (size_t i = 0; rc == 0 && i < np; i++) {
            size_t n = 1;
            for (int d = 0; d < mom[i].ndim; d++)
                n *= (size_t)mom[i].shape[d];
            const struct trn_ckpt_tensor *p = NULL;
            for (size_t j = 0; j < nm && p == NULL; j++)
                if (strcmp(model[j].name, mom[i].name) == 0)
                    p = &model[j];
            for (size_t k = 0; k < n; k++)
                ((float *)mom[i].data)[k] = 0.5f * ((const float *)p->data)[k];
        }
        if (rc == 0)
            rc = trn_ckpt_save(out, model, nm, mom, np, &meta, err, sizeof(err));
    } else {
        struct trn_ckpt_meta got;
        rc = trn_ckpt_load(in, arch, model, nm, mom, np, &got, err, sizeof(err));
        if (rc == 0)
            rc = trn_weights_save(out, arch, (int)classes, model, nm, err, sizeof(err));
    }
    if (rc)
        fprintf(stderr, "cddp-ckpt-tool: %s\n", err);
    for (size_t i = 0; i < nm; i++)
        free(model[i].data);
    for (size_t i = 0; i < np; i++)
        free(mom[i].data);
    free(model);
    free(mom);
    trn_st_close(&f);
    return rc ? CDDP_EXIT_FAILURE : CDDP_EXIT_OK;
}
