/* fatal.c: see fatal.h. */
#include "trainer/fatal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/exitcodes.h"

_Noreturn void trn_refuse(int exit_code, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "cddp-train: %s\n", msg);
    exit(exit_code);
}

_Noreturn void trn_fatal_at(const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "cddp-train: %s:%d: %s\n", file, line, msg);
    exit(CDDP_EXIT_FAILURE);
}

void *trn_malloc_at(const char *file, int line, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        trn_fatal_at(file, line, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *trn_calloc_at(const char *file, int line, size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        trn_fatal_at(file, line, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *trn_aligned_alloc_at(const char *file, int line, size_t bytes)
{
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        trn_fatal_at(file, line, "out of memory allocating %zu bytes", bytes);
    memset(p, 0, rounded ? rounded : 64);
    return p;
}
