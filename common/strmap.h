/*
 * strmap.h: a hash map from byte-string keys to pointers.
 *
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones). Keys come from peers, so the hash is SipHash-2-4 with a key
 * (seed) the owner picks at random: a peer cannot aim its keys at one chain.
 *
 * The map does not copy keys: a key must stay valid, unchanged, while it is
 * in the map (usually it lives inside the value it maps to).
 */
#ifndef CDDP_COMMON_STRMAP_H
#define CDDP_COMMON_STRMAP_H

#include <stddef.h>
#include <stdint.h>

struct cddp_strmap_slot {
    const char *key; /* NULL: empty slot */
    size_t klen;
    uint64_t hash;
    void *value;
};

struct cddp_strmap {
    struct cddp_strmap_slot *slots;
    size_t cap; /* a power of two, or 0 */
    size_t len;
    uint64_t k0, k1;
};

/* SipHash-2-4 of (p, n) under the 128-bit key (k0, k1). */
uint64_t cddp_siphash(const void *p, size_t n, uint64_t k0, uint64_t k1);

/* An empty map; seeds should come from a random source (getrandom). */
void cddp_strmap_init(struct cddp_strmap *m, uint64_t k0, uint64_t k1);
/* Frees the slots (not the keys or values). */
void cddp_strmap_free(struct cddp_strmap *m);

void *cddp_strmap_get(const struct cddp_strmap *m, const char *key, size_t klen);
/* Adds or replaces. Returns 0, or -ENOMEM (the map is unchanged). */
int cddp_strmap_put(struct cddp_strmap *m, const char *key, size_t klen, void *value);
/* Removes key; returns its value, or NULL if it was not there. */
void *cddp_strmap_del(struct cddp_strmap *m, const char *key, size_t klen);

/* Iteration: size_t i = 0; while (cddp_strmap_next(m, &i, &k, &kl, &v)) ...
 * The map must not change during an iteration. */
int cddp_strmap_next(const struct cddp_strmap *m, size_t *iter, const char **key, size_t *klen,
                     void **value);

#endif
