/* utf8.h: UTF-8 validation for the writers that must emit valid UTF-8
 * (prom.c, jsonw.c). */
#ifndef CDDP_COMMON_UTF8_H
#define CDDP_COMMON_UTF8_H

#include <stddef.h>

/* Length (1..4) of the valid, shortest-form UTF-8 sequence at s, or 0 when
 * the bytes there are not one (s must be NUL-terminated). */
static inline size_t cddp_utf8_len(const unsigned char *s)
{
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
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

#endif
