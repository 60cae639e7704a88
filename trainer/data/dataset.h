/*
 * dataset.h: the training data, one interface for every source.
 *
 *   synthetic      seeded N(0,1) images and uniform labels, like the seed
 *                  script's RandomDataset, generated on demand: sample i depends
 *                  only on (seed, split, i), so every rank sees the same data.
 *   idx[:DIR]      MNIST / Fashion-MNIST IDX files (gzipped or not), default DIR
 *                  /usr/share/datasets/fashion-mnist: pixels / 255, normalised
 *                  with mean 0.2860 and std 0.3530, replicated to 3 channels, at
 *                  the size the file declares.
 *   folder:DIR     an ImageFolder tree of JPEGs (DIR/CLASS/.../IMAGE.jpg, classes
 *                  and files in torchvision's sorted order), decoded with
 *                  libjpeg-turbo, shorter side resized to image_size (bilinear
 *                  with antialiasing, as torchvision's Resize on PIL images),
 *                  centre-cropped to image_size x image_size, ImageNet mean/std.
 *
 * Splits: idx reads train-* or t10k-*; folder reads DIR/train and DIR/val
 * when DIR has both (else DIR itself for the train split); synthetic keys
 * the test split differently from the train split.
 *
 * trn_dataset_get is safe to call from several threads at once (each with
 * its own output buffers): the datasets are read-only after open.
 */
#ifndef CDDP_TRAINER_DATASET_H
#define CDDP_TRAINER_DATASET_H

#include <stddef.h>
#include <stdint.h>

enum trn_split {
    TRN_SPLIT_TRAIN,
    TRN_SPLIT_TEST,
};

struct trn_dataset_opts {
    enum trn_split split;
    uint64_t seed;      /* synthetic: the data's seed */
    size_t num_samples; /* synthetic: dataset length (0: 10000, RandomDataset's default) */
    int image_size;     /* synthetic: H = W; folder: crop size (0: 224) */
    int num_classes;    /* synthetic: labels in [0, num_classes) (0: 1000, as the seed) */
    size_t limit;       /* idx, folder: use the first `limit` samples (0: all) */
};

struct trn_dataset {
    const char *kind; /* "synthetic", "idx", "folder" */
    size_t len;
    int channels, height, width; /* every sample is (channels, height, width) */
    int num_classes;             /* labels are in [0, num_classes) */
    /* See trn_dataset_get. */
    int (*get)(const struct trn_dataset *d, size_t index, float *chw, int32_t *label, char *err,
               size_t errlen);
    void (*close)(struct trn_dataset *d);
};

/*
 * Opens the dataset named by spec ("synthetic", "idx", "idx:DIR",
 * "folder:DIR") for split. On success *out is owned by the caller
 * (trn_dataset_close). On failure returns CDDP_ECONFIG (bad spec or option),
 * CDDP_ENOTFOUND / -errno (missing files), CDDP_ECORRUPT / CDDP_EIO_SHORT
 * (malformed files), and err gets one line naming the file and the problem.
 */
int trn_dataset_open(const char *spec, const struct trn_dataset_opts *opts,
                     struct trn_dataset **out, char *err, size_t errlen);

/* Writes sample index (< d->len) as channels*height*width floats into chw and
 * its class into *label. 0, or a negative code with err naming the file (a
 * corrupt JPEG is found here, when it is first read). */
static inline int trn_dataset_get(const struct trn_dataset *d, size_t index, float *chw,
                                  int32_t *label, char *err, size_t errlen)
{
    return d->get(d, index, chw, label, err, errlen);
}

/* Floats per sample. */
static inline size_t trn_dataset_sample_size(const struct trn_dataset *d)
{
    return (size_t)d->channels * (size_t)d->height * (size_t)d->width;
}

/* Gathers samples indices[0..n) into x (n samples, NCHW) and y. */
int trn_dataset_get_batch(const struct trn_dataset *d, const uint32_t *indices, size_t n, float *x,
                          int32_t *y, char *err, size_t errlen);

void trn_dataset_close(struct trn_dataset *d);

/* The implementations, called by trn_dataset_open. */
int trn_synthetic_open(const struct trn_dataset_opts *o, struct trn_dataset **out, char *err,
                       size_t errlen);
int trn_idx_open(const char *dir, const struct trn_dataset_opts *o, struct trn_dataset **out,
                 char *err, size_t errlen);
int trn_folder_open(const char *dir, const struct trn_dataset_opts *o, struct trn_dataset **out,
                    char *err, size_t errlen);

#endif
