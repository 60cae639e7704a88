/* algo_cache.c: see algo_cache.h. */
#include "trainer/ops/cuda/algo_cache.h"

#include <string.h>

void trn_algo_cache_init(struct trn_algo_cache *c)
{
    memset(c, 0, sizeof(*c));
}

struct trn_conv_key trn_conv_key_make(enum trn_conv_dir dir, int n, int cin, int h, int w, int cout,
                                      int k, int stride, int pad, int dtype, int x_layout,
                                      int y_layout, bool tf32, bool determ, size_t ws_limit)
{
    struct trn_conv_key key;
    memset(&key, 0, sizeof(key));
    key.dir = (int32_t)dir;
    key.n = n;
    key.cin = cin;
    key.h = h;
    key.w = w;
    key.cout = cout;
    key.k = k;
    key.stride = stride;
    key.pad = pad;
    key.dtype = dtype;
    key.x_layout = x_layout;
    key.y_layout = y_layout;
    key.tf32 = tf32;
    key.determ = determ;
    key.ws_limit = (int64_t)ws_limit;
    return key;
}

/* FNV-1a over the key's bytes (trn_conv_key_make zeroes the padding). */
static uint32_t key_hash(const struct trn_conv_key *key)
{
    const unsigned char *p = (const unsigned char *)key;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof(*key); i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

/* The slot holding key, or the first free slot of its probe run; -1 when
 * the table is full and key is not in it. */
static int find_slot(const struct trn_algo_cache *c, const struct trn_conv_key *key)
{
    uint32_t start = key_hash(key) % TRN_ALGO_CACHE_CAP;
    for (uint32_t i = 0; i < TRN_ALGO_CACHE_CAP; i++) {
        uint32_t s = (start + i) % TRN_ALGO_CACHE_CAP;
        if (!c->used[s] || memcmp(&c->keys[s], key, sizeof(*key)) == 0)
            return (int)s;
    }
    return -1;
}

bool trn_algo_cache_get(struct trn_algo_cache *c, const struct trn_conv_key *key,
                        struct trn_conv_choice *out)
{
    int s = find_slot(c, key);
    if (s < 0 || !c->used[s]) {
        c->misses++;
        return false;
    }
    c->hits++;
    *out = c->vals[s];
    return true;
}

int trn_algo_cache_put(struct trn_algo_cache *c, const struct trn_conv_key *key,
                       const struct trn_conv_choice *val)
{
    int s = find_slot(c, key);
    if (s < 0)
        return -1;
    if (!c->used[s]) {
        c->used[s] = true;
        c->keys[s] = *key;
        c->count++;
    }
    c->vals[s] = *val;
    return 0;
}
