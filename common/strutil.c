/* strutil.c: see strutil.h. */
#include "common/strutil.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/errors.h"

int cddp_parse_long(const char *s, long min, long max, long *out)
{
    if (s == NULL || *s == '\0' || isspace((unsigned char)*s))
        return CDDP_EPARSE;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || end == s)
        return CDDP_EPARSE;
    if (errno == ERANGE || v < min || v > max)
        return CDDP_ERANGE_ARG;
    *out = v;
    return 0;
}

int cddp_parse_double(const char *s, double min, double max, double *out)
{
    if (s == NULL || *s == '\0' || isspace((unsigned char)*s))
        return CDDP_EPARSE;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || end == s)
        return CDDP_EPARSE;
    if (errno == ERANGE || !isfinite(v) || v < min || v > max)
        return CDDP_ERANGE_ARG;
    *out = v;
    return 0;
}

int cddp_parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"1", "true", "t", "yes", "y", "on"};
    static const char *const no[] = {"0", "false", "f", "no", "n", "off"};
    if (s == NULL)
        return CDDP_EPARSE;
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return CDDP_EPARSE;
}

char *cddp_strip(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

size_t cddp_strlcpy(char *dst, const char *src, size_t n)
{
    size_t len = strlen(src);
    if (n > 0) {
        size_t c = len < n - 1 ? len : n - 1;
        memcpy(dst, src, c);
        dst[c] = '\0';
    }
    return len;
}

void cddp_buf_init(struct cddp_buf *b, size_t max)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

static int buf_reserve(struct cddp_buf *b, size_t extra)
{
    if (extra > b->max || b->len > b->max - extra)
        return CDDP_ETOOBIG;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (p == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    b->data = p;
    b->cap = cap;
    return 0;
}

int cddp_buf_append(struct cddp_buf *b, const void *p, size_t n)
{
    int rc = buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int cddp_buf_printf(struct cddp_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return CDDP_EPARSE;
    int rc = buf_reserve(b, (size_t)n);
    if (rc)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void cddp_buf_consume(struct cddp_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data)
        b->data[b->len] = '\0';
}

void cddp_buf_reset(struct cddp_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void cddp_buf_free(struct cddp_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
