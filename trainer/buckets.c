/* buckets.c: DDP's bucket plan and readiness bookkeeping; see buckets.h. */
#include "trainer/buckets.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"

int trn_bucket_plan_build(struct trn_bucket_plan *p, const size_t *off, const size_t *numel,
                          size_t n, size_t elem_size, size_t first_cap, size_t cap)
{
    memset(p, 0, sizeof(*p));
    if (elem_size == 0 || first_cap == 0 || cap == 0)
        return CDDP_ERANGE_ARG;
    for (size_t i = 0; i < n; i++)
        if (numel[i] == 0 || off[i] != (i == 0 ? 0 : off[i - 1] + numel[i - 1]))
            return CDDP_ERANGE_ARG;
    p->n_tensors = n;
    p->t_off = malloc((n ? n : 1) * sizeof(size_t));
    p->t_numel = malloc((n ? n : 1) * sizeof(size_t));
    p->t_bucket = malloc((n ? n : 1) * sizeof(int));
    /* at most one bucket per tensor */
    p->buckets = calloc(n ? n : 1, sizeof(struct trn_bucket));
    if (!p->t_off || !p->t_numel || !p->t_bucket || !p->buckets) {
        trn_bucket_plan_free(p);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    if (n) {
        memcpy(p->t_off, off, n * sizeof(size_t));
        memcpy(p->t_numel, numel, n * sizeof(size_t));
    }
    /* Reverse parameter order; close a bucket once it reaches its limit
     * (the Reducer's compute_bucket_assignment_by_size: the tensor that
     * crosses the limit stays in the bucket it crossed). */
    size_t limit = first_cap, bytes = 0;
    struct trn_bucket *b = NULL;
    for (size_t k = n; k-- > 0;) {
        if (b == NULL) {
            b = &p->buckets[p->n_buckets++];
            b->first = k;
            b->count = 0;
            b->numel = 0;
            bytes = 0;
        }
        b->first = k;
        b->count++;
        b->numel += numel[k];
        b->off = off[k];
        p->t_bucket[k] = p->n_buckets - 1;
        bytes += numel[k] * elem_size;
        if (bytes >= limit) {
            b = NULL;
            limit = cap;
        }
    }
    return 0;
}

void trn_bucket_plan_free(struct trn_bucket_plan *p)
{
    free(p->t_off);
    free(p->t_numel);
    free(p->t_bucket);
    free(p->buckets);
    memset(p, 0, sizeof(*p));
}

int trn_bucket_ready_init(struct trn_bucket_ready *r, const struct trn_bucket_plan *plan)
{
    memset(r, 0, sizeof(*r));
    r->plan = plan;
    r->pending = malloc((plan->n_buckets ? (size_t)plan->n_buckets : 1) * sizeof(size_t));
    r->ready = malloc(plan->n_tensors ? plan->n_tensors : 1);
    if (!r->pending || !r->ready) {
        trn_bucket_ready_free(r);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    trn_bucket_ready_reset(r);
    return 0;
}

void trn_bucket_ready_free(struct trn_bucket_ready *r)
{
    free(r->pending);
    free(r->ready);
    memset(r, 0, sizeof(*r));
}

void trn_bucket_ready_reset(struct trn_bucket_ready *r)
{
    const struct trn_bucket_plan *p = r->plan;
    for (int b = 0; b < p->n_buckets; b++)
        r->pending[b] = p->buckets[b].count;
    if (p->n_tensors)
        memset(r->ready, 0, p->n_tensors);
    r->next = 0;
}

/* The tensor starting at off, or -1. */
static long tensor_at(const struct trn_bucket_plan *p, size_t off)
{
    size_t lo = 0, hi = p->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->t_off[mid] < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < p->n_tensors && p->t_off[lo] == off ? (long)lo : -1;
}

int trn_bucket_ready_mark(struct trn_bucket_ready *r, size_t off, size_t numel, int *launch_first,
                          int *n_launch)
{
    const struct trn_bucket_plan *p = r->plan;
    *launch_first = r->next;
    *n_launch = 0;
    long first = tensor_at(p, off);
    if (first < 0 || numel == 0)
        return CDDP_ERANGE_ARG;
    /* Check the whole range before changing anything. */
    size_t end = off + numel, last = (size_t)first, covered = 0;
    for (size_t i = (size_t)first; i < p->n_tensors && covered < numel; i++) {
        if (r->ready[i])
            return CDDP_EEXISTS;
        covered += p->t_numel[i];
        last = i;
    }
    if (p->t_off[last] + p->t_numel[last] != end)
        return CDDP_ERANGE_ARG;
    for (size_t i = (size_t)first; i <= last; i++) {
        r->ready[i] = 1;
        r->pending[p->t_bucket[i]]--;
    }
    while (r->next < p->n_buckets && r->pending[r->next] == 0)
        r->next++;
    *n_launch = r->next - *launch_first;
    return 0;
}

int trn_bucket_ready_finish(const struct trn_bucket_ready *r, size_t *missing)
{
    const struct trn_bucket_plan *p = r->plan;
    if (r->next == p->n_buckets)
        return 0;
    for (size_t i = 0; i < p->n_tensors; i++)
        if (!r->ready[i]) {
            *missing = i;
            break;
        }
    return CDDP_ESTATE;
}

double trn_bn_merge_stats(const float *all, int world, int c, float *mean, float *var)
{
    size_t per = 2 * (size_t)c + 1;
    double total = 0;
    for (int ch = 0; ch < c; ch++) {
        double n = 0, avg = 0, m2 = 0;
        for (int j = 0; j < world; j++) {
            const float *r = all + (size_t)j * per;
            double nj = r[2 * c], mj = r[ch], vj = r[c + ch];
            if (nj <= 0)
                continue;
            double tot = n + nj, delta = avg - mj;
            m2 += vj * nj + delta * delta * n * nj / tot;
            avg = (n * avg + nj * mj) / tot;
            n = tot;
        }
        mean[ch] = (float)avg;
        var[ch] = (float)(n > 0 ? m2 / n : 0.0);
        total = n;
    }
    return total;
}
