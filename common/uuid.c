/* uuid.c: see uuid.h. */
#include "common/uuid.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static void set_version_bits(unsigned char b[16])
{
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
}

/* splitmix64's output function: every input bit reaches every output bit. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cddp_uuid4_fallback(unsigned char b[16])
{
    /* The counter makes two calls in one nanosecond differ; the pid and a
     * stack address (ASLR) make two processes differ. */
    static atomic_uint_fast64_t counter;
    struct timespec wall, mono;
    clock_gettime(CLOCK_REALTIME, &wall);
    clock_gettime(CLOCK_MONOTONIC, &mono);
    uint64_t seed = (uint64_t)wall.tv_sec * 1000000000u + (uint64_t)wall.tv_nsec;
    seed ^= mix64((uint64_t)mono.tv_sec * 1000000000u + (uint64_t)mono.tv_nsec);
    seed ^= mix64(((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&wall);
    uint64_t n = atomic_fetch_add(&counter, 1);
    uint64_t hi = mix64(seed + 0x9e3779b97f4a7c15ull * (2 * n + 1));
    uint64_t lo = mix64(hi ^ seed ^ 0x9e3779b97f4a7c15ull * (2 * n + 2));
    memcpy(b, &hi, 8);
    memcpy(b + 8, &lo, 8);
    set_version_bits(b);
}

void cddp_uuid4(unsigned char b[16])
{
    ssize_t got;
    do
        got = getrandom(b, 16, 0);
    while (got < 0 && errno == EINTR);
    if (got != 16) {
        cddp_uuid4_fallback(b);
        return;
    }
    set_version_bits(b);
}

void cddp_uuid_format(const unsigned char b[16], char out[CDDP_UUID_STR_SIZE])
{
    static const char hex[] = "0123456789abcdef";
    size_t k = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[k++] = '-';
        out[k++] = hex[b[i] >> 4];
        out[k++] = hex[b[i] & 0x0f];
    }
    out[k] = '\0';
}

void cddp_uuid_format_int(const unsigned char b[16], char *out, size_t len)
{
    if (len == 0)
        return;
    /* Long division of the big-endian 128-bit number by 10, digit by digit
     * from the last. */
    unsigned char v[16];
    memcpy(v, b, sizeof(v));
    char digits[CDDP_UUID_INT_SIZE];
    size_t n = 0;
    bool zero;
    do {
        unsigned rem = 0;
        zero = true;
        for (int i = 0; i < 16; i++) {
            unsigned cur = rem * 256u + v[i];
            v[i] = (unsigned char)(cur / 10u);
            rem = cur % 10u;
            zero &= v[i] == 0;
        }
        digits[n++] = (char)('0' + rem);
    } while (!zero);
    size_t k = 0;
    while (n > 0 && k + 1 < len)
        out[k++] = digits[--n];
    out[k] = '\0';
}

void cddp_uuid4_str(char out[CDDP_UUID_STR_SIZE])
{
    unsigned char b[16];
    cddp_uuid4(b);
    cddp_uuid_format(b, out);
}

void cddp_uuid4_int(char *out, size_t len)
{
    unsigned char b[16];
    cddp_uuid4(b);
    cddp_uuid_format_int(b, out, len);
}
