/* view.c: see view.h. It walks the pure state machine (rdzv_state_visit)
 * and the server's counters into plain views. */
#include "rendezvous/view.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "rendezvous/state.h"

static double wall_of(const struct rdzv_view_builder *b, uint64_t t)
{
    if (t == 0)
        return 0;
    return t >= b->now_mono ? b->now_wall : b->now_wall - (double)(b->now_mono - t) / 1000.0;
}

static void visit_run(void *arg, const struct rdzv_run_info *ri)
{
    struct rdzv_view_builder *b = arg;
    if (b->err || (b->err = cddp_array_grow(&b->first, 1)) != 0)
        return;
    struct status_rdzv_run_view *r = cddp_array_push(&b->runs, &b->err);
    if (r == NULL)
        return;
    memset(r, 0, sizeof(*r));
    r->run_id = ri->run_id;
    r->state = ri->phase;
    r->round = ri->round;
    r->min_nodes = ri->min_nodes > 0 ? (unsigned)ri->min_nodes : 0;
    r->max_nodes = ri->max_nodes > 0 ? (unsigned)ri->max_nodes : 0;
    r->last_round_at = wall_of(b, ri->round_at);
    r->step_median_s = ri->step_median_s;
    r->step_compute = ri->step_compute;
    r->straggler_factor = ri->straggler_factor;
    b->first.items[b->first.len++] = b->nodes.len;
}

static void visit_node(void *arg, const struct rdzv_node_info *ni)
{
    struct rdzv_view_builder *b = arg;
    if (b->err || b->runs.len == 0)
        return;
    struct status_rdzv_node_view *n = cddp_array_push(&b->nodes, &b->err);
    if (n == NULL)
        return;
    n->node = ni->node_id;
    n->state = ni->state;
    n->node_rank = ni->rank;
    n->nproc = ni->nproc;
    n->status_port = ni->status_port;
    n->addr = ni->addr;
    n->joined_at = wall_of(b, ni->joined_at);
    n->last_seen_at = wall_of(b, ni->last_seen);
    n->step_time_s = ni->has_perf ? ni->perf.step_s : -1;
    n->compute_s = ni->has_perf ? ni->perf.compute_s : -1;
    n->slowest_rank = ni->has_perf ? ni->perf.max_rank : -1;
    n->straggler = ni->slow;
    n->straggler_since = ni->slow ? wall_of(b, ni->slow_since) : 0;
    n->straggler_ratio = ni->slow_ratio;
    /* The visit gives the wait list last: members, then waiting. */
    struct status_rdzv_run_view *r = &b->runs.items[b->runs.len - 1];
    if (strcmp(ni->state, "waiting") == 0)
        r->nwaiting++;
    else
        r->nmembers++;
}

int rdzv_view_build(struct rdzv_view_builder *b, uv_loop_t *loop, const struct rdzv_server *srv,
                    double now_wall, struct status_rdzv_view *v)
{
    struct rdzv_server_stats stats;
    if (b->runs.max == 0) {
        cddp_array_init(&b->runs, RDZV_VIEW_MAX_RUNS);
        cddp_array_init(&b->first, RDZV_VIEW_MAX_RUNS);
        cddp_array_init(&b->nodes, RDZV_VIEW_MAX_NODES);
    }
    b->runs.len = b->first.len = b->nodes.len = 0;
    b->err = 0;
    b->now_wall = now_wall;
    b->now_mono = uv_now(loop);
    rdzv_server_stats(srv, &stats);
    rdzv_state_visit(rdzv_server_state(srv), 0, visit_run, visit_node, b);
    if (b->err)
        return b->err;
    for (size_t i = 0; i < b->runs.len; i++) {
        struct status_rdzv_run_view *r = &b->runs.items[i];
        r->members = b->nodes.items + b->first.items[i];
        r->waiting = r->members + r->nmembers;
    }
    memset(v, 0, sizeof(*v));
    v->endpoint = rdzv_server_address(srv);
    v->accepting = true;
    v->connections = (unsigned)stats.connections;
    v->connections_total = stats.accepted;
    v->refused[STATUS_REFUSED_LIMIT] = stats.refused_limit;
    v->refused[STATUS_REFUSED_TOKEN] = stats.refused_token;
    v->refused[STATUS_REFUSED_PROTOCOL] = stats.refused_protocol;
    v->joins_total = stats.joins;
    v->rounds_total = stats.rounds_completed;
    v->nruns = b->runs.len;
    v->runs = b->runs.items;
    return 0;
}

void rdzv_view_builder_free(struct rdzv_view_builder *b)
{
    cddp_array_free(&b->runs);
    cddp_array_free(&b->first);
    cddp_array_free(&b->nodes);
    memset(b, 0, sizeof(*b));
}
