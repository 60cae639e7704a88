/*
 * algo_cache.h: the convolution algorithms chosen for each shape, so that
 * cuDNN's search (cudnnFind*AlgorithmEx: every algorithm run and timed) is
 * done once per shape, not once per layer or per step.
 *
 * A key is everything the choice depends on: the direction (forward, data
 * gradient, weight gradient), the geometry, the layouts and data type, and
 * the constraints (math mode: TF32 allowed or not; deterministic only; the
 * workspace bound). ResNet-152 has about thirty distinct convolution shapes
 * per batch size, so layers share entries.
 *
 * Pure C, no CUDA: unit-tested on the CPU (tests/unit/test_cuda_algo.c).
 * A fixed-size open-addressing table, owned by the caller (embedded in the
 * CUDA backend's state); not thread-safe (one backend, one thread).
 */
#ifndef CDDP_TRAINER_OPS_CUDA_ALGO_CACHE_H
#define CDDP_TRAINER_OPS_CUDA_ALGO_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum trn_conv_dir {
    TRN_CONV_FWD,
    TRN_CONV_BWD_DATA,
    TRN_CONV_BWD_FILTER,
};

struct trn_conv_key {
    int32_t dir; /* enum trn_conv_dir */
    int32_t n, cin, h, w, cout, k, stride, pad;
    int32_t dtype;    /* enum trn_dtype */
    int32_t x_layout; /* enum trn_layout of the input (and its gradient) */
    int32_t y_layout; /* of the output (and its gradient) */
    int32_t tf32;     /* 1: TF32 allowed */
    int32_t determ;   /* 1: deterministic algorithms only */
    int64_t ws_limit; /* workspace bound in bytes */
};

struct trn_conv_choice {
    int32_t algo;      /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    int32_t math_type; /* cudnnMathType_t the algorithm was timed with */
    int64_t workspace; /* bytes it needs */
    float time_ms;     /* as measured by cuDNN, for the log */
    int32_t padded_c;  /* 0, or the input channels it runs on, zero-padded (conv.cu) */
};

#define TRN_ALGO_CACHE_CAP 1024

struct trn_algo_cache {
    struct trn_conv_key keys[TRN_ALGO_CACHE_CAP];
    struct trn_conv_choice vals[TRN_ALGO_CACHE_CAP];
    bool used[TRN_ALGO_CACHE_CAP];
    int count;
    long hits, misses; /* lookups, for the log */
};

/* Empties the cache. */
void trn_algo_cache_init(struct trn_algo_cache *c);
/* Fills *out and returns true when key has a choice. */
bool trn_algo_cache_get(struct trn_algo_cache *c, const struct trn_conv_key *key,
                        struct trn_conv_choice *out);
/* Stores (or replaces) key's choice. Returns 0, or -1 when the table is full
 * (the caller then searches again next time: slower, never wrong). */
int trn_algo_cache_put(struct trn_algo_cache *c, const struct trn_conv_key *key,
                       const struct trn_conv_choice *val);
/* A key with every field set (padding bytes zeroed, so keys compare by value). */
struct trn_conv_key trn_conv_key_make(enum trn_conv_dir dir, int n, int cin, int h, int w, int cout,
                                      int k, int stride, int pad, int dtype, int x_layout,
                                      int y_layout, bool tf32, bool determ, size_t ws_limit);

#endif
