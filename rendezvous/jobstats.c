/* jobstats.c: see jobstats.h. Pure: no clock, no I/O, no locks. */
#include "rendezvous/jobstats.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/straggler.h"

void jobstats_init(struct jobstats *js)
{
    memset(js, 0, sizeof(*js));
}

static void run_free(struct jobstats_run *r)
{
    if (r == NULL)
        return;
    status_history_free(&r->hist);
    free(r->nodes);
    free(r);
}

void jobstats_free(struct jobstats *js)
{
    for (size_t i = 0; i < js->nruns; i++)
        run_free(js->runs[i]);
    memset(js, 0, sizeof(*js));
}

const struct jobstats_run *jobstats_find(const struct jobstats *js, const char *run_id)
{
    for (size_t i = 0; run_id && i < js->nruns; i++)
        if (strcmp(js->runs[i]->id, run_id) == 0)
            return js->runs[i];
    return NULL;
}

/* The run, created if new (the run heard from longest ago goes when
 * there are JOBSTATS_MAX_RUNS); NULL when out of memory. */
static struct jobstats_run *run_get(struct jobstats *js, const char *run_id, double now)
{
    struct jobstats_run *r = (struct jobstats_run *)jobstats_find(js, run_id);
    if (r) {
        r->last_seen = now;
        return r;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    if (status_history_init(&r->hist, 2, JOBSTATS_POINTS, JOBSTATS_EVENTS) != 0) {
        free(r);
        return NULL;
    }
    snprintf(r->id, sizeof(r->id), "%s", run_id);
    r->first_seen = r->last_seen = now;
    r->last_point = -INFINITY;
    if (js->nruns == JOBSTATS_MAX_RUNS) {
        size_t old = 0;
        for (size_t i = 1; i < js->nruns; i++)
            if (js->runs[i]->last_seen < js->runs[old]->last_seen)
                old = i;
        run_free(js->runs[old]);
        js->runs[old] = js->runs[--js->nruns];
        js->runs_dropped++;
    }
    js->runs[js->nruns++] = r;
    return r;
}

/* Folds the node heard from longest ago into the run's earlier sum. */
static void fold_oldest(struct jobstats_run *r)
{
    size_t old = 0;
    for (size_t i = 1; i < r->nnodes; i++)
        if (r->nodes[i].seen < r->nodes[old].seen)
            old = i;
    const struct jobstats_node *n = &r->nodes[old];
    if (n->has_goodput) {
        for (int p = 0; p < PROTO_GOODPUT_PHASES; p++)
            r->folded_s[p] += n->gp.s[p];
        r->folded_lost_steps += n->gp.lost_steps;
        r->folded++;
    }
    r->nodes[old] = r->nodes[--r->nnodes];
}

static struct jobstats_node *node_get(struct jobstats_run *r, const char *node_id)
{
    for (size_t i = 0; i < r->nnodes; i++)
        if (strcmp(r->nodes[i].id, node_id) == 0)
            return &r->nodes[i];
    if (r->nnodes == JOBSTATS_MAX_NODES)
        fold_oldest(r);
    if (r->nnodes == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        if (cap > JOBSTATS_MAX_NODES)
            cap = JOBSTATS_MAX_NODES;
        struct jobstats_node *nodes = realloc(r->nodes, cap * sizeof(*nodes));
        if (nodes == NULL)
            return NULL;
        r->nodes = nodes;
        r->cap = cap;
    }
    struct jobstats_node *n = &r->nodes[r->nnodes++];
    memset(n, 0, sizeof(*n));
    snprintf(n->id, sizeof(n->id), "%s", node_id);
    return n;
}

void jobstats_sum(const struct jobstats_run *r, double now, struct jobstats_sum *out)
{
    memset(out, 0, sizeof(*out));
    out->max_step = out->min_step = -1;
    out->nodes = r->folded;
    out->lost_steps = r->folded_lost_steps;
    for (int p = 0; p < PROTO_GOODPUT_PHASES; p++)
        out->s[p] = r->folded_s[p];
    for (size_t i = 0; i < r->nnodes; i++) {
        const struct jobstats_node *n = &r->nodes[i];
        if (!n->has_goodput)
            continue;
        out->nodes++;
        for (int p = 0; p < PROTO_GOODPUT_PHASES; p++)
            out->s[p] += n->gp.s[p];
        out->lost_steps += n->gp.lost_steps;
        if (n->gp.step < 0 || now - n->seen > JOBSTATS_FRESH_S)
            continue;
        if (n->gp.step > out->max_step)
            out->max_step = n->gp.step;
        if (out->min_step < 0 || n->gp.step < out->min_step)
            out->min_step = n->gp.step;
    }
    for (int p = 0; p < PROTO_GOODPUT_PHASES; p++)
        out->total_s += out->s[p];
    out->ratio = out->total_s > 0 ? out->s[1] / out->total_s : 0;
}

/* The median of the fresh nodes' median step times; NaN when none. */
static double median_step_s(const struct jobstats_run *r, double now)
{
    double vals[JOBSTATS_MAX_NODES], scratch[JOBSTATS_MAX_NODES];
    size_t n = 0;
    for (size_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].step_s > 0 && now - r->nodes[i].seen <= JOBSTATS_FRESH_S)
            vals[n++] = r->nodes[i].step_s;
    return n ? straggler_lower_median(vals, n, scratch) : NAN;
}

/* A point of each series, at most every JOBSTATS_POINT_EVERY_S. */
static void add_points(struct jobstats_run *r, double now)
{
    if (now - r->last_point < JOBSTATS_POINT_EVERY_S)
        return;
    struct jobstats_sum s;
    jobstats_sum(r, now, &s);
    if (s.max_step < 0)
        return;
    r->last_point = now;
    struct status_history_point p = {
        .t = now,
        .loss = NAN,
        .samples_per_s = NAN,
        .step_time_s = median_step_s(r, now),
        .attempt = (uint32_t)r->round,
    };
    p.step = s.max_step;
    status_history_add_point(&r->hist, 0, -1, &p);
    p.step = s.min_step;
    status_history_add_point(&r->hist, 1, -1, &p);
}

int jobstats_heartbeat(struct jobstats *js, const char *run_id, const char *node_id,
                       const struct proto_goodput *gp, const struct proto_perf *perf, double now)
{
    if (run_id == NULL || node_id == NULL)
        return 0;
    struct jobstats_run *r = run_get(js, run_id, now);
    struct jobstats_node *n = r ? node_get(r, node_id) : NULL;
    if (n == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    n->seen = now;
    if (gp) {
        n->has_goodput = true;
        n->gp = *gp;
    }
    n->step_s = perf ? perf->step_s : 0;
    add_points(r, now);
    return 0;
}

/* An event; its reason is a then b. */
static void add_event(struct jobstats_run *r, enum status_history_event_kind kind, double value,
                      double now, const char *a, const char *b)
{
    struct jobstats_sum s;
    jobstats_sum(r, now, &s);
    struct status_history_event e = {
        .t = now,
        .kind = kind,
        .local_rank = -1,
        .step = s.max_step,
        .attempt = (uint32_t)r->round,
        .value = value,
    };
    snprintf(e.reason, sizeof(e.reason), "%s%s", a ? a : "-", b ? b : "");
    status_history_add_event(&r->hist, &e);
}

/* The run ended and its id is used again (the server forgot the closed
 * run, a new job took the id): start over. */
static int run_reset(struct jobstats_run *r, double now)
{
    struct status_history h;
    if (status_history_init(&h, 2, JOBSTATS_POINTS, JOBSTATS_EVENTS) != 0)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    status_history_free(&r->hist);
    free(r->nodes);
    char id[sizeof(r->id)];
    memcpy(id, r->id, sizeof(id));
    memset(r, 0, sizeof(*r));
    memcpy(r->id, id, sizeof(id));
    r->hist = h;
    r->first_seen = r->last_seen = now;
    r->last_point = -INFINITY;
    return 0;
}

int jobstats_round(struct jobstats *js, const char *run_id, uint64_t round, int nnodes,
                   int world_size, double now)
{
    struct jobstats_run *r = run_get(js, run_id, now);
    if (r == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (r->ended && run_reset(r, now) != 0)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (round <= r->round)
        return 0;
    r->round = round;
    char what[64];
    snprintf(what, sizeof(what), "%d node%s, world size %d", nnodes, nnodes == 1 ? "" : "s",
             world_size);
    add_event(r, STATUS_HISTORY_ROUND, (double)round, now, what, NULL);
    return 0;
}

int jobstats_restart(struct jobstats *js, const char *run_id, uint64_t round, const char *reason,
                     const char *node_id, bool counted, double now)
{
    struct jobstats_run *r = run_get(js, run_id, now);
    if (r == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (round <= r->restart_round)
        return 0;
    r->restart_round = round;
    reason = reason ? reason : "restart";
    add_event(r, STATUS_HISTORY_RESTART, (double)round, now, reason, counted ? " (counted)" : "");
    static const struct {
        const char *reason;
        enum status_history_event_kind kind;
    } node_events[] = {
        {"node_joined", STATUS_HISTORY_NODE_JOINED},
        {"node_left", STATUS_HISTORY_NODE_LEFT},
        {"node_lost", STATUS_HISTORY_NODE_LOST},
    };
    for (size_t i = 0; node_id && i < sizeof(node_events) / sizeof(node_events[0]); i++)
        if (strcmp(reason, node_events[i].reason) == 0)
            add_event(r, node_events[i].kind, (double)round, now, node_id, NULL);
    return 0;
}

int jobstats_straggler(struct jobstats *js, const char *run_id, const char *node_id, bool slow,
                       double ratio, double now)
{
    struct jobstats_run *r = run_get(js, run_id, now);
    if (r == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    add_event(r, slow ? STATUS_HISTORY_STRAGGLER : STATUS_HISTORY_STRAGGLER_END, ratio, now,
              node_id, NULL);
    return 0;
}

int jobstats_end(struct jobstats *js, const char *run_id, const char *reason, double now)
{
    struct jobstats_run *r = run_get(js, run_id, now);
    if (r == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (r->ended)
        return 0;
    r->ended = true;
    /* The last point, however soon after the one before: the job's end
     * (its last steps came in the heartbeats since). */
    r->last_point = -INFINITY;
    add_points(r, now);
    add_event(r, STATUS_HISTORY_END, 0, now, reason ? reason : "closed", NULL);
    return 0;
}
