/*
 * fatal.h: how cddp-train stops, for the worker only (daemons never stop).
 *
 * Two ways, both one line on stderr:
 *   - trn_refuse: the run cannot go on with what it was given (a flag, the
 *     data, a file): "cddp-train: WHAT: why" and the documented exit code
 *     (docs/trainer.md: 2 for flags and data that cannot be opened, 1 for
 *     the rest). Every check a rank can make alone is made, and refused
 *     through this, before the rank connects to the others; after that, a
 *     failed collective ends the rank through trn_comm_fail (exit 75).
 *   - trn_fatal: something it cannot recover from happened (an allocation
 *     fails, a oneDNN call refuses, a file it just validated shrinks): it
 *     prints where (file:line) and why and exits 1, and the agent restarts
 *     it (llm.c's mallocCheck/cudaCheck habit).
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

TRN_NORETURN void trn_refuse(int exit_code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

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
