/* mem_plan.c: see mem_plan.h. */
#include "trainer/mem_plan.h"

#include <stdint.h>
#include <stdlib.h>

static int overlap_in_time(const struct trn_mem_req *a, const struct trn_mem_req *b)
{
    return a->first <= b->last && b->first <= a->last;
}

static size_t round_up(size_t v, size_t align)
{
    return (v + align - 1) & ~(align - 1);
}

/* Largest first; equal sizes by earlier start, then by index (stable). */
static const struct trn_mem_req *sort_base;
static int by_size_desc(const void *pa, const void *pb)
{
    const struct trn_mem_req *a = sort_base + *(const int *)pa, *b = sort_base + *(const int *)pb;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    return *(const int *)pa - *(const int *)pb;
}

/* Ranges [off, end) of the placed requests that overlap one in time. */
struct range {
    size_t off, end;
};

static int by_offset(const void *pa, const void *pb)
{
    const struct range *a = pa, *b = pb;
    return a->off < b->off ? -1 : a->off > b->off;
}

size_t trn_mem_plan(struct trn_mem_req *reqs, int n, size_t align)
{
    if (align == 0 || (align & (align - 1)) != 0 || n < 0)
        return (size_t)-1;
    for (int i = 0; i < n; i++)
        if (reqs[i].first > reqs[i].last || reqs[i].bytes > SIZE_MAX / 2)
            return (size_t)-1;
    int *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
    struct range *busy = malloc(sizeof(struct range) * (size_t)(n ? n : 1));
    char *placed = calloc((size_t)(n ? n : 1), 1);
    if (!order || !busy || !placed) {
        free(order);
        free(busy);
        free(placed);
        return (size_t)-1;
    }
    for (int i = 0; i < n; i++)
        order[i] = i;
    sort_base = reqs;
    qsort(order, (size_t)n, sizeof(int), by_size_desc);
    size_t arena = 0;
    for (int k = 0; k < n; k++) {
        struct trn_mem_req *r = &reqs[order[k]];
        r->offset = 0;
        if (r->bytes == 0) {
            placed[order[k]] = 1;
            continue;
        }
        int nb = 0;
        for (int j = 0; j < n; j++)
            if (placed[j] && reqs[j].bytes && overlap_in_time(r, &reqs[j]))
                busy[nb++] = (struct range){reqs[j].offset, reqs[j].offset + reqs[j].bytes};
        qsort(busy, (size_t)nb, sizeof(*busy), by_offset);
        /* the lowest aligned gap that holds r */
        size_t off = 0;
        for (int j = 0; j < nb; j++) {
            if (busy[j].off >= off + r->bytes)
                break;
            if (busy[j].end > off)
                off = round_up(busy[j].end, align);
        }
        r->offset = off;
        placed[order[k]] = 1;
        if (off + r->bytes > arena)
            arena = off + r->bytes;
    }
    free(order);
    free(busy);
    free(placed);
    return round_up(arena, align);
}

size_t trn_mem_peak_live(const struct trn_mem_req *reqs, int n)
{
    size_t peak = 0;
    for (int i = 0; i < n; i++) {
        /* the live set only grows at a lifetime's start: check those */
        size_t live = 0;
        for (int j = 0; j < n; j++)
            if (reqs[j].first <= reqs[i].first && reqs[i].first <= reqs[j].last)
                live += reqs[j].bytes;
        if (live > peak)
            peak = live;
    }
    return peak;
}
