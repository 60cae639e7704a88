/*
 * libs.h: cuDNN and cuBLAS opened when the CUDA backend starts, not at exec.
 *
 * libcublasLt's static initialisers alone took 0.25 s and about 200 MiB of
 * RSS in every cddp-train process, a CPU run's included (perf, 2026-12-03:
 * three quarters of `cddp-train --help`'s 0.4 s), before main() ran. So the
 * programs no longer link libcudnn and libcublas: trn_backend_cuda_init
 * opens them by soname (common/dl.h; the soname of the headers' major
 * version) before its first call, and a machine without them gets one
 * line saying which library and why, as for any other set-up error.
 *
 * The backend's files call the libraries' functions by their own names:
 * after the tables below, each name is a macro for the table's slot (a
 * name that is not listed here still links against the library, and the
 * build fails: the programs do not link it). Each slot's type is the
 * function's, from the library's header.
 */
#ifndef CDDP_TRAINER_OPS_CUDA_LIBS_H
#define CDDP_TRAINER_OPS_CUDA_LIBS_H

#include <stddef.h>

#include <cublas_v2.h>
#include <cudnn.h>

#ifdef __cplusplus
#define TRN_CUDA_FN(f) decltype(&f)
extern "C" {
#else
#define TRN_CUDA_FN(f) __typeof__(f) *
#endif

/* Every cuDNN and cuBLAS function the backend calls (cuBLAS's by their _v2
 * names, which cublas_v2.h's macros turn the plain ones into). */
#define TRN_CUDNN_FUNCS(XX)                                                                        \
    XX(cudnnConvolutionBackwardData)                                                               \
    XX(cudnnConvolutionBackwardFilter)                                                             \
    XX(cudnnConvolutionForward)                                                                    \
    XX(cudnnCreate)                                                                                \
    XX(cudnnCreateConvolutionDescriptor)                                                           \
    XX(cudnnCreateFilterDescriptor)                                                                \
    XX(cudnnCreateTensorDescriptor)                                                                \
    XX(cudnnDestroy)                                                                               \
    XX(cudnnDestroyConvolutionDescriptor)                                                          \
    XX(cudnnDestroyFilterDescriptor)                                                               \
    XX(cudnnDestroyTensorDescriptor)                                                               \
    XX(cudnnFindConvolutionBackwardDataAlgorithmEx)                                                \
    XX(cudnnFindConvolutionBackwardFilterAlgorithmEx)                                              \
    XX(cudnnFindConvolutionForwardAlgorithmEx)                                                     \
    XX(cudnnGetErrorString)                                                                        \
    XX(cudnnGetLastErrorString)                                                                    \
    XX(cudnnGetVersion)                                                                            \
    XX(cudnnSetConvolution2dDescriptor)                                                            \
    XX(cudnnSetConvolutionMathType)                                                                \
    XX(cudnnSetFilter4dDescriptor)                                                                 \
    XX(cudnnSetStream)                                                                             \
    XX(cudnnSetTensor4dDescriptor)

#define TRN_CUBLAS_FUNCS(XX)                                                                       \
    XX(cublasCreate_v2)                                                                            \
    XX(cublasDestroy_v2)                                                                           \
    XX(cublasGetProperty)                                                                          \
    XX(cublasGetStatusString)                                                                      \
    XX(cublasSetMathMode)                                                                          \
    XX(cublasSetStream_v2)                                                                         \
    XX(cublasSetWorkspace_v2)                                                                      \
    XX(cublasSgemm_v2)

struct trn_cudnn_fns {
#define XX(f) TRN_CUDA_FN(f) f;
    TRN_CUDNN_FUNCS(XX)
#undef XX
};

struct trn_cublas_fns {
#define XX(f) TRN_CUDA_FN(f) f;
    TRN_CUBLAS_FUNCS(XX)
#undef XX
};

/* The tables: valid once trn_cuda_libs_load() returned 0. */
extern struct trn_cudnn_fns trn_cudnn;
extern struct trn_cublas_fns trn_cublas;

/* Opens cuDNN and cuBLAS, once per process (thread-safe; later calls
 * return the first one's outcome). 0, or CDDP_ECONFIG with one line in
 * err naming the library and the loader's reason. */
int trn_cuda_libs_load(char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

/* (libs.c fills the tables by these names: no redirection there) */
#ifndef TRN_CUDA_LIBS_TABLES
#define cudnnConvolutionBackwardData (trn_cudnn.cudnnConvolutionBackwardData)
#define cudnnConvolutionBackwardFilter (trn_cudnn.cudnnConvolutionBackwardFilter)
#define cudnnConvolutionForward (trn_cudnn.cudnnConvolutionForward)
#define cudnnCreate (trn_cudnn.cudnnCreate)
#define cudnnCreateConvolutionDescriptor (trn_cudnn.cudnnCreateConvolutionDescriptor)
#define cudnnCreateFilterDescriptor (trn_cudnn.cudnnCreateFilterDescriptor)
#define cudnnCreateTensorDescriptor (trn_cudnn.cudnnCreateTensorDescriptor)
#define cudnnDestroy (trn_cudnn.cudnnDestroy)
#define cudnnDestroyConvolutionDescriptor (trn_cudnn.cudnnDestroyConvolutionDescriptor)
#define cudnnDestroyFilterDescriptor (trn_cudnn.cudnnDestroyFilterDescriptor)
#define cudnnDestroyTensorDescriptor (trn_cudnn.cudnnDestroyTensorDescriptor)
#define cudnnFindConvolutionBackwardDataAlgorithmEx                                                \
    (trn_cudnn.cudnnFindConvolutionBackwardDataAlgorithmEx)
#define cudnnFindConvolutionBackwardFilterAlgorithmEx                                              \
    (trn_cudnn.cudnnFindConvolutionBackwardFilterAlgorithmEx)
#define cudnnFindConvolutionForwardAlgorithmEx (trn_cudnn.cudnnFindConvolutionForwardAlgorithmEx)
#define cudnnGetErrorString (trn_cudnn.cudnnGetErrorString)
#define cudnnGetLastErrorString (trn_cudnn.cudnnGetLastErrorString)
#define cudnnGetVersion (trn_cudnn.cudnnGetVersion)
#define cudnnSetConvolution2dDescriptor (trn_cudnn.cudnnSetConvolution2dDescriptor)
#define cudnnSetConvolutionMathType (trn_cudnn.cudnnSetConvolutionMathType)
#define cudnnSetFilter4dDescriptor (trn_cudnn.cudnnSetFilter4dDescriptor)
#define cudnnSetStream (trn_cudnn.cudnnSetStream)
#define cudnnSetTensor4dDescriptor (trn_cudnn.cudnnSetTensor4dDescriptor)
#define cublasCreate_v2 (trn_cublas.cublasCreate_v2)
#define cublasDestroy_v2 (trn_cublas.cublasDestroy_v2)
#define cublasGetProperty (trn_cublas.cublasGetProperty)
#define cublasGetStatusString (trn_cublas.cublasGetStatusString)
#define cublasSetMathMode (trn_cublas.cublasSetMathMode)
#define cublasSetStream_v2 (trn_cublas.cublasSetStream_v2)
#define cublasSetWorkspace_v2 (trn_cublas.cublasSetWorkspace_v2)
#define cublasSgemm_v2 (trn_cublas.cublasSgemm_v2)
#endif

#endif
