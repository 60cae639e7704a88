/*
 * checkpoint.h: training checkpoints and torchvision weight files, both
 * safetensors (trainer/safetensors.h) with torchvision's state_dict names.
 *
 * The model is described by a table of named host tensors in state_dict
 * order (trn_resnet's `state` table, with host pointers), so this module
 * knows nothing about the model's internals.
 *
 * A checkpoint holds:
 *   - every state_dict entry under its torchvision name (F32; the
 *     num_batches_tracked counters as I64 scalars), in state_dict order, so
 *     `resnetXX().load_state_dict({k: v for k, v in tensors.items()
 *     if not k.startswith("optimizer.")}, strict=True)` loads it;
 *   - each parameter's SGD momentum buffer as "optimizer.momentum_buffer.NAME";
 *   - metadata (strings): format "pt", cddp.checkpoint (format version, 1),
 *     arch, num_classes, seed, epoch, step, sampler.* (the position in the
 *     epoch and what it was counted with: world size, batch size, dataset
 *     length, shuffle, drop_last), optimizer.*, and data_crc32:
 *     the CRC-32 of the data buffer, so a flipped bit anywhere is caught.
 *     An "rng" entry, which older files carry, is not read.
 * It is written atomically (trn_st_save: temporary file, fsync, rename,
 * fsync of the directory). Loading checks, before it trusts anything: the
 * safetensors structure, the format version, the arch, every key, dtype and
 * shape against the model's table (missing, unexpected and mis-shaped keys
 * listed), the metadata values, and the checksum. Any failure is a one-line
 * error naming the file; the file itself is never modified.
 *
 * A weights file (--init, --save) is the state_dict alone, as
 * safetensors.torch.save_file(model.state_dict()) writes it.
 */
#ifndef CDDP_TRAINER_CHECKPOINT_H
#define CDDP_TRAINER_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/safetensors.h"

#define TRN_CKPT_VERSION 1
#define TRN_CKPT_MOMENTUM_PREFIX "optimizer.momentum_buffer."

/* One entry of the model's table. data is host memory: read by the savers,
 * written by the loaders. */
struct trn_ckpt_tensor {
    const char *name;
    enum trn_st_dtype dtype; /* TRN_ST_F32, or TRN_ST_I64 for counters */
    int ndim;                /* 0 for the counters (scalars) */
    int64_t shape[4];
    void *data;
};

/* Where training stands; everything a resumed run needs besides the tensors. */
struct trn_ckpt_meta {
    char arch[32]; /* "resnet50" */
    int num_classes;
    uint64_t seed;
    long epoch;            /* the epoch in progress (or about to start) */
    long step;             /* optimizer steps taken since the start of training */
    uint64_t epoch_offset; /* samples of `epoch` consumed, summed over ranks: the sampler
                              position */
    int world_size;        /* ranks that counted epoch_offset */
    int batch_size;        /* per rank */
    uint64_t dataset_len;  /* training samples the sampler ranged over */
    bool shuffle;          /* the sampler's order: shuffled by seed + epoch, or the dataset's */
    bool drop_last;        /* the sampler cut the tail instead of padding it */
    long optimizer_steps;  /* SGD steps taken (0: momentum buffers not yet filled) */
    double lr, momentum, weight_decay;
    /* --lr-schedule: "constant" or "cosine" over lr_total_steps optimizer
     * steps (torch's T_max). Checkpoints written before it existed read as
     * constant. */
    char lr_schedule[16];
    long lr_total_steps;
    /* --amp fp16's GradScaler (scaler.h): written only when amp_scaler
     * (metadata amp.scale, amp.growth_tracker); checkpoints without them
     * read as no scaler state (a fresh scaler starts at the defaults). */
    bool amp_scaler;
    double amp_scale;
    long amp_growth_tracker;
};

/*
 * Writes a checkpoint: model[0..n_model) under their names, momentum[0..n_mom)
 * (named as their parameters) under the momentum prefix, and meta. Atomic.
 * 0, or a negative code with err naming the file.
 */
int trn_ckpt_save(const char *path, const struct trn_ckpt_tensor *model, size_t n_model,
                  const struct trn_ckpt_tensor *momentum, size_t n_mom,
                  const struct trn_ckpt_meta *meta, char *err, size_t errlen);

/*
 * Loads a checkpoint written for this model (arch, the tables' names, dtypes
 * and shapes) into the tables' memory and *meta. Returns 0; CDDP_ENOTFOUND
 * when path does not exist (the caller starts fresh); or CDDP_EMISMATCH (a
 * checkpoint of another model or run), CDDP_ECORRUPT / CDDP_EIO_SHORT (not a
 * checkpoint, damaged, truncated), -errno, each with a one-line err. After a
 * failure the tables' memory may have been partly overwritten (the caller
 * exits); the file is never touched.
 */
int trn_ckpt_load(const char *path, const char *arch, const struct trn_ckpt_tensor *model,
                  size_t n_model, const struct trn_ckpt_tensor *momentum, size_t n_mom,
                  struct trn_ckpt_meta *meta, char *err, size_t errlen);

/* What a resuming run is: the settings a checkpoint's sampler position
 * depends on. */
struct trn_ckpt_run {
    uint64_t seed;
    int world_size, batch_size; /* batch_size per rank */
    uint64_t dataset_len;
    bool shuffle, drop_last;
    uint64_t rank_samples; /* samples each rank gets per epoch (the sampler's num_samples) */
};

/* Where a resumed run starts. */
struct trn_ckpt_start {
    long epoch;
    uint64_t rank_offset; /* samples of `epoch` this rank has already trained on: a multiple of
                             the batch size, less than rank_samples */
    bool resized;         /* at an epoch boundary, with another world size, batch size, dataset
                             length or sampler setting than the checkpoint's */
};

/*
 * The resume decision, pure: where a run with settings `run` continues the
 * checkpoint described by m. The seed must be the checkpoint's (it decides
 * the data order and the synthetic data). At an epoch boundary
 * (epoch_offset 0) anything else may differ: the next epoch is laid out
 * for this run. Inside an epoch the position counts samples of an order
 * that only the same world size, batch size, dataset length, shuffle and
 * drop_last reproduce: any difference is refused, naming it. A position
 * that is not a batch boundary inside the epoch is corrupt.
 * 0; CDDP_EMISMATCH or CDDP_ECORRUPT with a one-line err (without the path).
 */
int trn_ckpt_resume_point(const struct trn_ckpt_meta *m, const struct trn_ckpt_run *run,
                          struct trn_ckpt_start *out, char *err, size_t errlen);

/* Writes the state_dict alone (--save): metadata format "pt", arch,
 * num_classes. Atomic. */
int trn_weights_save(const char *path, const char *arch, int num_classes,
                     const struct trn_ckpt_tensor *model, size_t n_model, char *err, size_t errlen);

/*
 * Loads a torchvision state_dict saved as safetensors (--init), strictly:
 * every key of the table must be there with its shape and no other key may
 * be (the error lists missing, unexpected and mis-shaped keys, as PyTorch's
 * load_state_dict does). F16, BF16 and F64 tensors are converted to F32;
 * counters may be I64 or I32. Counters that are all absent (state_dicts from
 * before PyTorch had them) are set to 0, as PyTorch does. A cddp checkpoint
 * is accepted too: its momentum buffers are ignored (fine-tuning from it).
 * 0, or a negative code with a one-line err.
 */
int trn_weights_load(const char *path, const struct trn_ckpt_tensor *model, size_t n_model,
                     char *err, size_t errlen);

#endif
