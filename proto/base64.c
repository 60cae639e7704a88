/* base64.c: standard base64 with padding (proto/msg.h declares it: store
 * values are base64 on the wire). Split out of msg.c. */
#include <stdint.h>

#include "common/errors.h"
#include "proto/msg.h"

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void proto_base64_encode(const void *src, size_t n, char *dst)
{
    const unsigned char *s = src;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *dst++ = b64_alphabet[(v >> 18) & 63];
        *dst++ = b64_alphabet[(v >> 12) & 63];
        *dst++ = b64_alphabet[(v >> 6) & 63];
        *dst++ = b64_alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        *dst++ = b64_alphabet[(v >> 18) & 63];
        *dst++ = b64_alphabet[(v >> 12) & 63];
        *dst++ = '=';
        *dst++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        *dst++ = b64_alphabet[(v >> 18) & 63];
        *dst++ = b64_alphabet[(v >> 12) & 63];
        *dst++ = b64_alphabet[(v >> 6) & 63];
        *dst++ = '=';
    }
    *dst = '\0';
}

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

long proto_base64_decode(const char *src, size_t n, void *dst, size_t dstlen)
{
    unsigned char *d = dst;
    size_t out = 0;
    if (n % 4 != 0)
        return CDDP_EPARSE;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            unsigned char c = (unsigned char)src[i + k];
            if (c == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
            } else if (pad > 0 || (v[k] = b64_value(c)) < 0) {
                return CDDP_EPARSE;
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | v[3];
        size_t nb = 3 - (size_t)pad;
        /* Canonical form: the bits under the padding are zero. */
        if ((pad == 1 && (w & 0xff)) || (pad == 2 && (w & 0xffff)))
            return CDDP_EPARSE;
        if (out + nb > dstlen)
            return CDDP_ETOOBIG;
        d[out++] = (unsigned char)(w >> 16);
        if (nb > 1)
            d[out++] = (unsigned char)(w >> 8);
        if (nb > 2)
            d[out++] = (unsigned char)w;
    }
    return (long)out;
}
