/* strmap.c: see strmap.h. */
#include "common/strmap.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"

static inline uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = rotl(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = rotl(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = rotl(v2, 32);                                                                         \
    } while (0)

static inline uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t cddp_siphash(const void *data, size_t n, uint64_t k0, uint64_t k1)
{
    const unsigned char *p = data;
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull;
    uint64_t v1 = k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ull;
    uint64_t v3 = k1 ^ 0x7465646279746573ull;
    size_t whole = n & ~(size_t)7;

    for (size_t i = 0; i < whole; i += 8) {
        uint64_t m = load_le64(p + i);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)n << 56;
    for (size_t i = 0; i < (n & 7); i++)
        b |= (uint64_t)p[whole + i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

void cddp_strmap_init(struct cddp_strmap *m, uint64_t k0, uint64_t k1)
{
    memset(m, 0, sizeof(*m));
    m->k0 = k0;
    m->k1 = k1;
}

void cddp_strmap_free(struct cddp_strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->len = 0;
}

static size_t find(const struct cddp_strmap *m, const char *key, size_t klen, uint64_t h)
{
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const struct cddp_strmap_slot *s = &m->slots[i];
        if (s->key == NULL || (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0))
            return i;
    }
}

void *cddp_strmap_get(const struct cddp_strmap *m, const char *key, size_t klen)
{
    if (m->len == 0)
        return NULL;
    uint64_t h = cddp_siphash(key, klen, m->k0, m->k1);
    size_t i = find(m, key, klen, h);
    return m->slots[i].key ? m->slots[i].value : NULL;
}

static int grow(struct cddp_strmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 16;
    struct cddp_strmap_slot *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    struct cddp_strmap old = *m;
    m->slots = slots;
    m->cap = cap;
    for (size_t i = 0; i < old.cap; i++) {
        if (old.slots[i].key)
            m->slots[find(m, old.slots[i].key, old.slots[i].klen, old.slots[i].hash)] =
                old.slots[i];
    }
    free(old.slots);
    return 0;
}

int cddp_strmap_put(struct cddp_strmap *m, const char *key, size_t klen, void *value)
{
    /* Keep the load factor under 3/4 so probe runs stay short. */
    if ((m->len + 1) * 4 > m->cap * 3) {
        int rc = grow(m);
        if (rc)
            return rc;
    }
    uint64_t h = cddp_siphash(key, klen, m->k0, m->k1);
    size_t i = find(m, key, klen, h);
    struct cddp_strmap_slot *s = &m->slots[i];
    if (s->key == NULL)
        m->len++;
    s->key = key;
    s->klen = klen;
    s->hash = h;
    s->value = value;
    return 0;
}

void *cddp_strmap_del(struct cddp_strmap *m, const char *key, size_t klen)
{
    if (m->len == 0)
        return NULL;
    uint64_t h = cddp_siphash(key, klen, m->k0, m->k1);
    size_t mask = m->cap - 1;
    size_t i = find(m, key, klen, h);
    if (m->slots[i].key == NULL)
        return NULL;
    void *value = m->slots[i].value;
    /* Backward-shift: pull later members of the probe run into the hole
     * when their home slot is not between the hole and where they sit. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        struct cddp_strmap_slot *s = &m->slots[j];
        if (s->key == NULL)
            break;
        size_t home = s->hash & mask;
        bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            m->slots[i] = *s;
            i = j;
        }
    }
    m->slots[i].key = NULL;
    m->len--;
    return value;
}

int cddp_strmap_next(const struct cddp_strmap *m, size_t *iter, const char **key, size_t *klen,
                     void **value)
{
    for (size_t i = *iter; i < m->cap; i++) {
        if (m->slots[i].key) {
            *key = m->slots[i].key;
            *klen = m->slots[i].klen;
            *value = m->slots[i].value;
            *iter = i + 1;
            return 1;
        }
    }
    *iter = m->cap;
    return 0;
}
