/*
 * input.cu: --prefetch's input path on the device (ops.h: host_alloc ...
 * input_done; train.c drives it).
 *
 * The loader thread fills pinned host batches (host_alloc). The upload of
 * batch b + 1 is queued on a copy stream of its own into the other of two
 * device input buffers while the compute stream runs batch b:
 *
 *     copy stream:     wait input_used[s]  memcpy -> buffer s  record input_copied[s]
 *     compute stream:  ... backward(b-1 on s) record input_used[s] ... wait input_copied[s]
 *                      forward(b+1 on s) ...
 *
 * so the copy never overwrites a buffer the compute stream may still read,
 * and the forward never reads a buffer before its copy is done. On this
 * backend only the forward's reorder to NHWC reads the buffer (the first
 * convolution's weight gradient reads the NHWC copy), so recording its
 * last use after the backward is conservative: one batch of slack given
 * up, which two slots and a copy far shorter than a step do not miss. The
 * first use of each slot waits on an event never recorded, which returns
 * at once; input_streams orders the copy stream after the compute
 * stream's work once, when it is made.
 */
#include "trainer/ops/cuda/cuda.h"

static void input_streams(struct cuda_backend *cb)
{
    if (cb->copy_stream)
        return;
    cudaCheck(cudaStreamCreateWithFlags(&cb->copy_stream, cudaStreamNonBlocking));
    for (int s = 0; s < 2; s++) {
        cudaCheck(cudaEventCreateWithFlags(&cb->input_copied[s], cudaEventDisableTiming));
        cudaCheck(cudaEventCreateWithFlags(&cb->input_used[s], cudaEventDisableTiming));
    }
    /* The first copy into a slot waits on an event never recorded, i.e. on
     * nothing: order it once after everything queued on the compute stream
     * so far, the zeroing of the input buffers by alloc included. */
    cudaCheck(cudaEventRecord(cb->input_used[0], cb->stream));
    cudaCheck(cudaStreamWaitEvent(cb->copy_stream, cb->input_used[0], 0));
}

static int slot_of(int slot)
{
    if (slot != 0 && slot != 1)
        trn_fatal("CUDA backend: input slot %d is not 0 or 1", slot);
    return slot;
}

void *cuda_host_alloc(struct trn_backend *be, size_t bytes)
{
    cuda_op_enter_n("host_alloc", "%zu bytes", bytes);
    (void)be;
    void *p = NULL;
    cudaError_t st = cudaMallocHost(&p, bytes ? bytes : 1);
    if (st == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it: the caller reports out of memory */
        return NULL;
    }
    cudaCheck(st);
    return p;
}

void cuda_host_free(struct trn_backend *be, void *p)
{
    cuda_op_enter("host_free", NULL, NULL);
    struct cuda_backend *cb = cuda_of(be);
    if (!p)
        return;
    if (cb->copy_stream)
        cudaCheck(cudaStreamSynchronize(cb->copy_stream)); /* a copy may still read it */
    cudaCheck(cudaFreeHost(p));
}

void cuda_upload(struct trn_backend *be, int slot, void *dst, const void *src, size_t bytes)
{
    cuda_op_enter_n("upload", "slot %d, %zu bytes", slot, bytes);
    struct cuda_backend *cb = cuda_of(be);
    int s = slot_of(slot);
    input_streams(cb);
    cudaCheck(cudaStreamWaitEvent(cb->copy_stream, cb->input_used[s], 0));
    if (bytes)
        cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cb->copy_stream));
    cudaCheck(cudaEventRecord(cb->input_copied[s], cb->copy_stream));
}

void cuda_input_wait(struct trn_backend *be, int slot)
{
    cuda_op_enter_n("input_wait", "slot %d", slot);
    struct cuda_backend *cb = cuda_of(be);
    int s = slot_of(slot);
    input_streams(cb);
    cudaCheck(cudaStreamWaitEvent(cb->stream, cb->input_copied[s], 0));
}

void cuda_input_done(struct trn_backend *be, int slot)
{
    cuda_op_enter_n("input_done", "slot %d", slot);
    struct cuda_backend *cb = cuda_of(be);
    int s = slot_of(slot);
    input_streams(cb);
    cudaCheck(cudaEventRecord(cb->input_used[s], cb->stream));
    cudaCheck(cudaEventSynchronize(cb->input_copied[s]));
}

void cuda_input_release(struct cuda_backend *cb)
{
    if (!cb->copy_stream)
        return;
    cudaCheck(cudaStreamSynchronize(cb->copy_stream));
    for (int s = 0; s < 2; s++) {
        cudaCheck(cudaEventDestroy(cb->input_copied[s]));
        cudaCheck(cudaEventDestroy(cb->input_used[s]));
    }
    cudaCheck(cudaStreamDestroy(cb->copy_stream));
    cb->copy_stream = NULL;
}
