/*
 * input.h: the training loop's input: each batch's samples in the device
 * memory the model reads, and their labels on the host.
 *
 * Without --prefetch a batch is read when the step loop asks for it (on all
 * threads, trn_batch_load) and copied to the device. With it, prefetch.h's
 * loader thread reads the batches ahead in the loop's order: on the CPU the
 * step reads the loader's buffer itself; on a device with upload (CUDA) the
 * batch after the current one is taken as soon as the current one's
 * backward is queued, and its upload queued on the copy stream into the
 * other of two input buffers, so it overlaps the rest of the step; the
 * forward waits for it on the device (ops.h: upload). Host buffers are
 * pinned there (ops.h: host_alloc).
 *
 * The step loop asks for batch after batch (trn_input_next) and says when
 * each one's last use is queued (trn_input_done), which is where its buffer
 * goes back to the loader. The time the loop waits for batches is counted,
 * for the closing line (trn_input_log, T2600).
 *
 * One thread (the step loop's) calls these; the backend is borrowed. A
 * sample that cannot be read (a corrupt JPEG) stops the worker with the
 * dataset's message (exit 1) when the loop reaches its batch; running out
 * of memory is fatal (trainer/fatal.h).
 */
#ifndef CDDP_TRAINER_INPUT_H
#define CDDP_TRAINER_INPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "trainer/data/dataset.h" /* struct trn_dataset */
#include "trainer/data/sampler.h" /* struct trn_sampler */
#include "trainer/ops/ops.h"      /* struct trn_backend */
#include "trainer/prefetch.h"     /* the loader, its batch sources */

struct trn_input {
    struct trn_backend *be; /* borrowed */
    int batch;              /* the most samples a batch has */
    long prefetch;          /* --prefetch: batches read ahead; 0: none */
    long threads;           /* --threads: the loader's decoding threads (0: default) */
    float *x_host, *x_dev;  /* (batch, 3, height, width); x_dev: the input without a loader */
    int32_t *labels;        /* (batch) the current batch's */

    /* --prefetch: the loader; the batch computing and, with a device's
     * upload, the next one (ahead, uploading into the other of the two
     * input buffers, x_in[1 - slot]); NULL pf: batches are read in the step. */
    struct trn_prefetch *pf;
    struct trn_train_batches order; /* the loader's order for training */
    struct trn_batch *cur, *ahead;
    bool have_ahead; /* ahead was fetched (NULL: the source's end) */
    int slot;        /* cur's input buffer */
    float *x_in[2];  /* x_dev, and a second with upload */

    double wait_s;  /* the step loop's wait for batches (training) */
    double first_s; /* of it, in the run's first step (the loader's start) */
    long steps;     /* steps those were waited in */
};

/* The buffers for batches of up to `batch` samples of d, on be (borrowed
 * until trn_input_free); prefetch and threads are --prefetch (resolved:
 * >= 0) and --threads. */
void trn_input_init(struct trn_input *in, struct trn_backend *be, const struct trn_dataset *d,
                    int batch, long prefetch, long threads);

/* --prefetch: starts the loader for training, from batch first_batch of
 * epoch `epoch` through the last epoch (epochs), in its own copy of s's
 * order. Without --prefetch: nothing. */
void trn_input_start_train(struct trn_input *in, const struct trn_dataset *d,
                           const struct trn_sampler *s, int epoch, long first_batch, int epochs);

/* --prefetch: starts the loader on d in next's order (arg: next's, used on
 * the loader thread until trn_input_stop). Without --prefetch: nothing. */
void trn_input_start(struct trn_input *in, const struct trn_dataset *d, trn_batch_next_fn next,
                     void *arg);

/* Samples idx[0..n) of d as the model's input (device memory, valid until
 * trn_input_done), their labels in in->labels: read now (no loader), or
 * the loader's next batch, which must be that one. */
const float *trn_input_next(struct trn_input *in, const struct trn_dataset *d, const uint32_t *idx,
                            int n);

/* The current batch's last use is queued (after its backward): its buffer
 * goes back to the loader; with upload and `more` (the step loop goes on),
 * the next batch is taken and its upload queued. */
void trn_input_done(struct trn_input *in, const struct trn_dataset *d, bool more);

/* A training step ended: the waits so far are its (for the closing line). */
void trn_input_count_step(struct trn_input *in);

/* Stops and frees the loader (its batches held included) and the
 * training order; the buffers stay. Nothing running: nothing. */
void trn_input_stop(struct trn_input *in);

/* The closing line (T2600): the step loop's waits for batches. */
void trn_input_log(const struct trn_input *in);

/* Stops the loader and frees everything init made. A zeroed struct: nothing. */
void trn_input_free(struct trn_input *in);

#endif
