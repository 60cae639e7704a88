/*
 * utf8.h: UTF-8 validation, the one copy for every writer that must emit
 * valid UTF-8 (jsonw.c, status/prom.c) and every reader that must refuse
 * anything else (trainer/safetensors.c).
 *
 * Valid means RFC 3629: shortest form only (no overlong encodings), no
 * surrogates (U+D800..U+DFFF), nothing past U+10FFFF. Pure and inline: the
 * writers call it once per byte on their hot path.
 */
#ifndef CDDP_COMMON_UTF8_H
#define CDDP_COMMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* Length (1..4) of the valid sequence at s, reading at most avail bytes, or
 * 0 when the bytes there are not one (or avail is 0). */
static inline size_t cddp_utf8_seq(const unsigned char *s, size_t avail)
{
    if (avail == 0)
        return 0;
    unsigned char c = s[0];
    size_t n;
    unsigned cp, min;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) {
        n = 2;
        cp = c & 0x1Fu;
        min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        cp = c & 0x0Fu;
        min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        n = 4;
        cp = c & 0x07u;
        min = 0x10000;
    } else {
        return 0;
    }
    if (avail < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/* The same for a NUL-terminated s: the NUL ends any sequence it cuts short,
 * so nothing past it is read. */
static inline size_t cddp_utf8_len(const unsigned char *s)
{
    return cddp_utf8_seq(s, 4);
}

/* Whether all of the NUL-terminated s is valid UTF-8. */
static inline bool cddp_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    while (n > 0) {
        size_t k = cddp_utf8_seq(p, n);
        if (k == 0)
            return false;
        p += k;
        n -= k;
    }
    return true;
}

#endif
