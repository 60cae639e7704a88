/*
 * nccl_lib.h: NCCL opened when the NCCL backend starts, not at exec
 * (trainer/ops/cuda/libs.h says why: every library a program links is
 * loaded and initialised before main(), a gloo or CPU run's included).
 * trn_nccl_backend_create opens libnccl.so.<NCCL_MAJOR> (common/dl.h)
 * before its first NCCL call; nccl.c calls the functions by their own
 * names, which the macros below make the table's slots.
 */
#ifndef CDDP_TRAINER_COMM_NCCL_LIB_H
#define CDDP_TRAINER_COMM_NCCL_LIB_H

#include <stddef.h>

#include <nccl.h>

/* Every NCCL function nccl.c calls. */
#define TRN_NCCL_FUNCS(XX)                                                                         \
    XX(ncclAllGather)                                                                              \
    XX(ncclAllReduce)                                                                              \
    XX(ncclBroadcast)                                                                              \
    XX(ncclCommAbort)                                                                              \
    XX(ncclCommDestroy)                                                                            \
    XX(ncclCommFinalize)                                                                           \
    XX(ncclCommGetAsyncError)                                                                      \
    XX(ncclCommInitRankConfig)                                                                     \
    XX(ncclGetErrorString)                                                                         \
    XX(ncclGetLastError)                                                                           \
    XX(ncclGetUniqueId)                                                                            \
    XX(ncclGetVersion)

struct trn_nccl_fns {
#define XX(f) __typeof__(f) *f;
    TRN_NCCL_FUNCS(XX)
#undef XX
};

/* The table: valid once trn_nccl_lib_load() returned 0. */
extern struct trn_nccl_fns trn_nccl;

/* Opens NCCL, once per process (thread-safe; later calls return the first
 * one's outcome). 0, or CDDP_ECONFIG with one line in err naming the
 * library and the loader's reason. */
int trn_nccl_lib_load(char *err, size_t errlen);

/* (nccl_lib.c fills the table by these names: no redirection there) */
#ifndef TRN_NCCL_LIB_TABLE
#define ncclAllGather (trn_nccl.ncclAllGather)
#define ncclAllReduce (trn_nccl.ncclAllReduce)
#define ncclBroadcast (trn_nccl.ncclBroadcast)
#define ncclCommAbort (trn_nccl.ncclCommAbort)
#define ncclCommDestroy (trn_nccl.ncclCommDestroy)
#define ncclCommFinalize (trn_nccl.ncclCommFinalize)
#define ncclCommGetAsyncError (trn_nccl.ncclCommGetAsyncError)
#define ncclCommInitRankConfig (trn_nccl.ncclCommInitRankConfig)
#define ncclGetErrorString (trn_nccl.ncclGetErrorString)
#define ncclGetLastError (trn_nccl.ncclGetLastError)
#define ncclGetUniqueId (trn_nccl.ncclGetUniqueId)
#define ncclGetVersion (trn_nccl.ncclGetVersion)
#endif

#endif
