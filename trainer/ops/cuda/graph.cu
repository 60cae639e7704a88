/*
 * graph.cu: CUDA graphs for --cuda-graphs: capture the backend's stream,
 * instantiate, launch, destroy. What is captured, when, and what the host
 * does around it is train.c's (its graph step) and trainer/graph_plan.h's.
 *
 * Capture runs in cudaStreamCaptureModeThreadLocal: only this thread's
 * unsafe calls (a synchronisation, a cudaMalloc) break the capture, so the
 * NCCL watchdog's cudaEventQuery on its own thread cannot, and a call of
 * ours that is not capturable fails there with file:line (cudaCheck) rather
 * than silently capturing something else.
 *
 * cuBLAS: a capture must not let cuBLAS allocate its own workspace (it would
 * allocate a new one per captured graph), so graph_setup gives the handle
 * one preallocated buffer, 32 MiB, NVIDIA's recommended size for Hopper
 * (cublasSetWorkspace). cublasSetStream resets it; the backend sets the
 * stream once, at init, before this.
 *
 * reserve_gen counts cuda_reserve's growths of the backend's scratch
 * (backend.cu): a graph captured before one points into freed memory, and
 * graph_plan.c drops it.
 */
#include "trainer/ops/cuda/cuda.h"

void cuda_graph_setup(struct trn_backend *be)
{
    cuda_op_enter("graph_setup", NULL, NULL);
    struct cuda_backend *cb = cuda_of(be);
    if (cb->cublas_ws)
        return;
    cudaCheck(cudaMalloc(&cb->cublas_ws, CUDA_GRAPH_CUBLAS_WORKSPACE));
    cublasCheck(cublasSetWorkspace(cb->cublas, cb->cublas_ws, CUDA_GRAPH_CUBLAS_WORKSPACE));
}

void cuda_graph_begin(struct trn_backend *be)
{
    cuda_op_enter("graph_begin", NULL, NULL);
    struct cuda_backend *cb = cuda_of(be);
    TRN_CHECK(cb->cublas_ws, "CUDA graphs: graph_setup was not called before a capture");
    cudaCheck(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
}

void *cuda_graph_end(struct trn_backend *be)
{
    cuda_op_enter("graph_end", NULL, NULL);
    struct cuda_backend *cb = cuda_of(be);
    cudaGraph_t graph = NULL;
    cudaCheck(cudaStreamEndCapture(cb->stream, &graph));
    cudaGraphExec_t exec = NULL;
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    /* The executable graph is a copy: the captured one is not needed. */
    cudaCheck(cudaGraphDestroy(graph));
    return (void *)exec;
}

void cuda_graph_launch(struct trn_backend *be, void *graph)
{
    cuda_op_enter("graph_launch", NULL, NULL);
    cudaCheck(cudaGraphLaunch((cudaGraphExec_t)graph, cuda_of(be)->stream));
}

void cuda_graph_destroy(struct trn_backend *be, void *graph)
{
    cuda_op_enter("graph_destroy", NULL, NULL);
    if (!graph)
        return;
    /* A launch still queued may use it. */
    cudaCheck(cudaStreamSynchronize(cuda_of(be)->stream));
    cudaCheck(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

uint64_t cuda_graph_gen(struct trn_backend *be)
{
    return cuda_of(be)->reserve_gen;
}

void cuda_graph_free(struct trn_backend *be)
{
    struct cuda_backend *cb = cuda_of(be);
    if (cb->cublas_ws)
        cudaCheck(cudaFree(cb->cublas_ws));
    cb->cublas_ws = NULL;
}
