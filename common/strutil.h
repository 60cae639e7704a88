/*
 * strutil.h: checked string parsing and bounded buffers.
 *
 * atoi, strtok, sprintf and strcpy are banned in this project (tools/lint.sh
 * greps for them); these are the replacements.
 */
#ifndef CDDP_COMMON_STRUTIL_H
#define CDDP_COMMON_STRUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whole-string base-10 integer in [min, max]. 0, CDDP_EPARSE or CDDP_ERANGE_ARG. */
int cddp_parse_long(const char *s, long min, long max, long *out);
/* Whole-string finite double in [min, max]. 0, CDDP_EPARSE or CDDP_ERANGE_ARG. */
int cddp_parse_double(const char *s, double min, double max, double *out);
/* 1/true/t/yes/y/on and 0/false/f/no/n/off, case-insensitive (torch's RendezvousParameters). */
int cddp_parse_bool(const char *s, bool *out);

/* Trims ASCII whitespace in place (Python's str.strip()); returns the start. */
char *cddp_strip(char *s);

/* strlcpy: always NUL-terminates (n > 0); returns strlen(src). */
size_t cddp_strlcpy(char *dst, const char *src, size_t n);

/* A growing buffer with a maximum set at creation: an append past it fails
 * with CDDP_ETOOBIG and leaves the buffer as it was. data is always
 * NUL-terminated (the NUL is not counted in len). */
struct cddp_buf {
    char *data;
    size_t len;
    size_t cap;
    size_t max;
};

void cddp_buf_init(struct cddp_buf *b, size_t max);
int cddp_buf_append(struct cddp_buf *b, const void *p, size_t n);
int cddp_buf_printf(struct cddp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Removes the first n bytes. */
void cddp_buf_consume(struct cddp_buf *b, size_t n);
void cddp_buf_reset(struct cddp_buf *b);
void cddp_buf_free(struct cddp_buf *b);

#endif
