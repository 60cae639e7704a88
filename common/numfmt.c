/* numfmt.c: see numfmt.h. */
#include "common/numfmt.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Integers (most values: counts, states, rounds) without printf. */
static size_t format_integer(double v, char *buf, size_t len)
{
    char tmp[24];
    size_t n = 0;
    bool neg = v < 0;
    uint64_t u = (uint64_t)(neg ? -v : v);
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (neg)
        tmp[n++] = '-';
    if (n >= len)
        return 0;
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    buf[n] = '\0';
    return n;
}

size_t cddp_format_double(double v, char *buf, size_t len)
{
    if (len == 0)
        return 0;
    buf[0] = '\0';
    if (!isfinite(v))
        return 0;
    if (v == floor(v) && fabs(v) < 9007199254740992.0 && !(v == 0 && signbit(v)))
        return format_integer(v, buf, len);
    /* The shortest of 15, 16, 17 significant digits that reads back as v. */
    int n = 0;
    for (int prec = 15; prec <= 17; prec++) {
        n = snprintf(buf, len, "%.*g", prec, v);
        if (n < 0 || (size_t)n >= len || strtod(buf, NULL) == v)
            break;
    }
    if (n < 0)
        n = 0;
    return (size_t)n < len ? (size_t)n : len - 1;
}
