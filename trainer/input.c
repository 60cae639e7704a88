/* input.c: the training loop's input, with or without the loader; see input.h. */
#include "trainer/input.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"     /* cddp_mono_ns */
#include "common/exitcodes.h" /* CDDP_EXIT_FAILURE */
#include "common/log.h"       /* log_info */
#include "common/strutil.h"   /* cddp_strlcpy */
#include "trainer/fatal.h"    /* trn_refuse, trn_fatal, TRN_CHECK, trn_malloc */

void trn_input_init(struct trn_input *in, struct trn_backend *be, const struct trn_dataset *d,
                    int batch, long prefetch, long threads)
{
    *in = (struct trn_input){.be = be, .batch = batch, .prefetch = prefetch, .threads = threads};
    size_t xbytes = (size_t)batch * trn_dataset_sample_size(d) * sizeof(float);
    in->x_host = trn_malloc(xbytes);
    in->x_dev = be->ops->alloc(be, xbytes);
    TRN_CHECK(in->x_dev, "out of memory for the input batch (%zu bytes)", xbytes);
    in->x_in[0] = in->x_dev;
    if (prefetch && be->ops->upload) {
        in->x_in[1] = be->ops->alloc(be, xbytes);
        TRN_CHECK(in->x_in[1], "out of memory for the second input batch (%zu bytes)", xbytes);
    }
    in->labels = trn_malloc((size_t)batch * sizeof(int32_t));
}

/* Gathers samples idx[0..n) of d into the batch (x_host, labels), on all
 * threads (datasets are read-only after open), and copies it to x_dev. A
 * sample that cannot be read (a corrupt JPEG) stops the worker with the
 * dataset's message. */
static void load_batch(struct trn_input *in, const struct trn_dataset *d, const uint32_t *idx,
                       int n)
{
    size_t per = trn_dataset_sample_size(d);
    char err[512];
    if (trn_batch_load(d, idx, n, in->x_host, in->labels, NULL, err, sizeof(err)) != 0)
        trn_refuse(CDDP_EXIT_FAILURE, "%s", err);
    in->be->ops->to_device(in->be, in->x_dev, in->x_host, (size_t)n * per * sizeof(float));
}

static void *pinned_alloc(void *arg, size_t bytes)
{
    struct trn_backend *be = arg;
    return be->ops->host_alloc(be, bytes);
}

static void pinned_free(void *arg, void *p)
{
    struct trn_backend *be = arg;
    be->ops->host_free(be, p);
}

void trn_input_start(struct trn_input *in, const struct trn_dataset *d, trn_batch_next_fn next,
                     void *arg)
{
    if (!in->prefetch)
        return;
    struct trn_backend *be = in->be;
    TRN_CHECK(be->device == TRN_DEVICE_CPU || be->ops->upload,
              "--prefetch: the %s backend has no upload", be->ops->name);
    struct trn_prefetch_opts o = {.data = d,
                                  .batch = in->batch,
                                  .ahead = (int)in->prefetch,
                                  .threads = (int)in->threads,
                                  .next = next,
                                  .next_arg = arg};
    if (!o.threads && be->device == TRN_DEVICE_CUDA)
        o.threads = -1; /* every core but the one the step loop launches from */
    if (be->ops->host_alloc)
        o.host = (struct trn_host_alloc){pinned_alloc, pinned_free, be};
    char err[512];
    if (trn_prefetch_start(&in->pf, &o, err, sizeof(err)) != 0)
        trn_fatal("%s", err);
    in->cur = in->ahead = NULL;
    in->have_ahead = false;
    in->slot = 0;
}

void trn_input_start_train(struct trn_input *in, const struct trn_dataset *d,
                           const struct trn_sampler *s, int epoch, long first_batch, int epochs)
{
    if (!in->prefetch)
        return;
    if (trn_train_batches_init(&in->order, s, in->batch, epoch, first_batch, epochs) != 0)
        trn_fatal("--prefetch: out of memory for the loader's sampler");
    trn_input_start(in, d, trn_train_batches_next, &in->order);
}

void trn_input_stop(struct trn_input *in)
{
    trn_prefetch_free(in->pf);
    in->pf = NULL;
    in->cur = in->ahead = NULL;
    in->have_ahead = false;
    trn_train_batches_free(&in->order);
}

/* The loader's next batch; the step loop's wait for it is counted. */
static struct trn_batch *take(struct trn_input *in)
{
    double w = trn_prefetch_wait_s(in->pf);
    struct trn_batch *e = trn_prefetch_next(in->pf);
    in->wait_s += trn_prefetch_wait_s(in->pf) - w;
    return e;
}

static void upload(struct trn_input *in, int slot, const struct trn_batch *e,
                   const struct trn_dataset *d)
{
    size_t bytes = (size_t)e->n * trn_dataset_sample_size(d) * sizeof(float);
    in->be->ops->upload(in->be, slot, in->x_in[slot], e->x, bytes);
}

const float *trn_input_next(struct trn_input *in, const struct trn_dataset *d, const uint32_t *idx,
                            int n)
{
    if (!in->pf) {
        uint64_t t0 = cddp_mono_ns();
        load_batch(in, d, idx, n);
        in->wait_s += (double)(cddp_mono_ns() - t0) * 1e-9;
        return in->x_dev;
    }
    bool uploaded = in->have_ahead;
    struct trn_batch *e = in->have_ahead ? in->ahead : take(in);
    int slot = in->have_ahead ? 1 - in->slot : in->slot;
    in->have_ahead = false;
    in->ahead = NULL;
    TRN_CHECK(e, "--prefetch: the loader ended before the step loop");
    if (e->rc) {
        char err[sizeof(e->err)];
        cddp_strlcpy(err, e->err, sizeof(err));
        trn_input_stop(in);
        trn_refuse(CDDP_EXIT_FAILURE, "%s", err);
    }
    TRN_CHECK(e->n == n && memcmp(e->idx, idx, (size_t)n * sizeof(uint32_t)) == 0,
              "--prefetch: the loader's batch is not the step loop's");
    memcpy(in->labels, e->labels, (size_t)n * sizeof(int32_t));
    in->cur = e;
    in->slot = slot;
    if (!in->be->ops->upload)
        return e->x; /* the CPU reads the loader's buffer */
    if (!uploaded)
        upload(in, slot, e, d);
    in->be->ops->input_wait(in->be, slot);
    return in->x_in[slot];
}

void trn_input_done(struct trn_input *in, const struct trn_dataset *d, bool more)
{
    if (!in->pf)
        return;
    if (in->be->ops->upload)
        in->be->ops->input_done(in->be, in->slot);
    trn_prefetch_release(in->pf, in->cur);
    in->cur = NULL;
    if (!in->be->ops->upload || !more)
        return;
    in->ahead = take(in);
    in->have_ahead = true;
    if (in->ahead && !in->ahead->rc)
        upload(in, 1 - in->slot, in->ahead, d);
}

void trn_input_count_step(struct trn_input *in)
{
    if (in->steps++ == 0)
        in->first_s = in->wait_s;
}

void trn_input_log(const struct trn_input *in)
{
    long later = in->steps - 1;
    log_info("T2600",
             "input: %.3f s waiting for batches in %ld steps, %.3f s of it in the first, %.2f "
             "ms/step after it (--prefetch %ld)",
             in->wait_s, in->steps, in->first_s,
             later > 0 ? (in->wait_s - in->first_s) * 1e3 / (double)later : 0.0, in->prefetch);
}

void trn_input_free(struct trn_input *in)
{
    trn_input_stop(in);
    if (in->be) {
        in->be->ops->free(in->be, in->x_dev);
        in->be->ops->free(in->be, in->x_in[1]);
    }
    free(in->x_host);
    free(in->labels);
}
