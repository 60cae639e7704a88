/*
 * fatal.h: fail fast with file:line, for the worker only.
 *
 * cddp-train is supervised: when something it cannot recover from happens
 * (an allocation fails, a oneDNN call refuses, a file it just validated
 * shrinks), it prints where and why and exits 1, and the agent restarts it
 * (llm.c's mallocCheck/cudaCheck habit). Daemons never use this.
 */
#ifndef CDDP_TRAINER_FATAL_H
#define CDDP_TRAINER_FATAL_H

#include <stddef.h>

/* C++ (the CUDA backend's .cu files) spells _Noreturn differently. */
#ifdef __cplusplus
#define TRN_NORETURN [[noreturn]]
#else
#define TRN_NORETURN _Noreturn
#endif

TRN_NORETURN void trn_fatal_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define trn_fatal(...) trn_fatal_at(__FILE__, __LINE__, __VA_ARGS__)
#define TRN_CHECK(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            trn_fatal_at(__FILE__, __LINE__, __VA_ARGS__);                                         \
    } while (0)

/* malloc/calloc/aligned (64 bytes, zeroed) that never return NULL. */
void *trn_malloc_at(const char *file, int line, size_t bytes);
void *trn_calloc_at(const char *file, int line, size_t n, size_t size);
void *trn_aligned_alloc_at(const char *file, int line, size_t bytes);
#define trn_malloc(bytes) trn_malloc_at(__FILE__, __LINE__, (bytes))
#define trn_calloc(n, size) trn_calloc_at(__FILE__, __LINE__, (n), (size))
#define trn_aligned_alloc(bytes) trn_aligned_alloc_at(__FILE__, __LINE__, (bytes))

#endif
