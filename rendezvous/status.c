/*
 * status.c: see status.h. A thin shell: it walks the state machine
 * (rdzv_state_visit) into plain views that common/status_view.c renders.
 */
#include "rendezvous/status.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/hostname.h"
#include "common/log.h"
#include "common/status_http.h"
#include "common/status_view.h"
#include "common/strutil.h"
#include "rendezvous/state.h"

struct rdzv_status {
    struct status_server *server;
    const char *version;
    uv_loop_t *loop;
    const struct rdzv_server *srv; /* NULL once detached */
    uv_timer_t tick;               /* heartbeat; republish */
    uv_timer_t coalesce;           /* a pending publish */
    bool timers_open;
    bool accepting;
    uint64_t last_publish_ms;
    uint64_t min_interval_ms; /* between publishes: grows with the render's cost */
    char hostname[256];
    char endpoint[300];
    double started_at;

    /* Scratch for one publish, kept between publishes. */
    struct status_rdzv_run_view *runs;
    size_t *first; /* per run: index of its first node in nodes */
    size_t nruns, runs_cap, first_cap;
    struct status_rdzv_node_view *nodes;
    size_t nnodes, nodes_cap;
    bool oom;
    double now_wall;
    uint64_t now_mono; /* the server's clock (uv_now), which the state's times use */
};

static double wall_of(const struct rdzv_status *st, uint64_t t)
{
    if (t == 0)
        return 0;
    return t >= st->now_mono ? st->now_wall : st->now_wall - (double)(st->now_mono - t) / 1000.0;
}

static bool grow(void **p, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * size);
    if (q == NULL)
        return false;
    *p = q;
    *cap = n;
    return true;
}

static void visit_run(void *arg, const struct rdzv_run_info *ri)
{
    struct rdzv_status *st = arg;
    if (st->oom || !grow((void **)&st->runs, &st->runs_cap, st->nruns + 1, sizeof(*st->runs)) ||
        !grow((void **)&st->first, &st->first_cap, st->nruns + 1, sizeof(*st->first))) {
        st->oom = true;
        return;
    }
    struct status_rdzv_run_view *r = &st->runs[st->nruns];
    memset(r, 0, sizeof(*r));
    r->run_id = ri->run_id;
    r->state = ri->phase;
    r->round = ri->round;
    r->min_nodes = ri->min_nodes > 0 ? (unsigned)ri->min_nodes : 0;
    r->max_nodes = ri->max_nodes > 0 ? (unsigned)ri->max_nodes : 0;
    r->last_round_at = wall_of(st, ri->round_at);
    st->first[st->nruns] = st->nnodes;
    st->nruns++;
}

static void visit_node(void *arg, const struct rdzv_node_info *ni)
{
    struct rdzv_status *st = arg;
    if (st->oom || st->nruns == 0 ||
        !grow((void **)&st->nodes, &st->nodes_cap, st->nnodes + 1, sizeof(*st->nodes))) {
        st->oom = true;
        return;
    }
    struct status_rdzv_node_view *n = &st->nodes[st->nnodes++];
    n->node = ni->node_id;
    n->state = ni->state;
    n->node_rank = ni->rank;
    n->nproc = ni->nproc;
    n->joined_at = wall_of(st, ni->joined_at);
    n->last_seen_at = wall_of(st, ni->last_seen);
    /* The visit gives the wait list last: members, then waiting. */
    struct status_rdzv_run_view *r = &st->runs[st->nruns - 1];
    if (strcmp(ni->state, "waiting") == 0)
        r->nwaiting++;
    else
        r->nmembers++;
}

static void publish(struct rdzv_status *st)
{
    if (st->timers_open)
        uv_timer_stop(&st->coalesce);
    uint64_t t0 = cddp_mono_ns();
    struct rdzv_server_stats stats;
    memset(&stats, 0, sizeof(stats));
    st->nruns = st->nnodes = 0;
    st->oom = false;
    st->now_wall = cddp_wall_time();
    if (st->srv) {
        st->now_mono = uv_now(st->loop);
        rdzv_server_stats(st->srv, &stats);
        rdzv_state_visit(rdzv_server_state(st->srv), 0, visit_run, visit_node, st);
    }
    if (st->oom) {
        log_error("S0201", "status port: out of memory listing the runs; not published");
        return;
    }
    for (size_t i = 0; i < st->nruns; i++) {
        st->runs[i].members = st->nodes + st->first[i];
        st->runs[i].waiting = st->runs[i].members + st->runs[i].nmembers;
    }
    struct status_rdzv_view v;
    memset(&v, 0, sizeof(v));
    v.program = "cddp-rdzv";
    v.version = st->version;
    v.pid = (int)getpid();
    v.hostname = st->hostname;
    v.endpoint = st->endpoint;
    v.started_at = st->started_at;
    v.accepting = st->accepting && st->srv != NULL;
    v.connections = (unsigned)stats.connections;
    v.connections_total = stats.accepted;
    v.refused[STATUS_REFUSED_LIMIT] = stats.refused_limit;
    v.refused[STATUS_REFUSED_TOKEN] = stats.refused_token;
    v.refused[STATUS_REFUSED_PROTOCOL] = stats.refused_protocol;
    v.joins_total = stats.joins;
    v.rounds_total = stats.rounds_completed;
    v.nruns = st->nruns;
    v.runs = st->runs;
    struct status_snapshot *snap = NULL;
    int rc = status_rdzv_render(&v, st->now_wall, &snap);
    if (rc) {
        log_error("S0202", "status port: cannot render the server's status: %s", cddp_strerror(rc));
        return;
    }
    status_server_publish(st->server, snap);
    st->last_publish_ms = cddp_mono_ms();
    uint64_t cost_ms = (cddp_mono_ns() - t0) / 1000000u;
    st->min_interval_ms = cost_ms * RDZV_STATUS_BUDGET > RDZV_STATUS_COALESCE_MS
                              ? cost_ms * RDZV_STATUS_BUDGET
                              : RDZV_STATUS_COALESCE_MS;
}

static void on_coalesce(uv_timer_t *t)
{
    publish(t->data);
}

static void on_tick(uv_timer_t *t)
{
    struct rdzv_status *st = t->data;
    status_server_heartbeat(st->server);
    if (cddp_mono_ms() - st->last_publish_ms >= st->min_interval_ms)
        publish(st);
}

void rdzv_status_changed(void *arg)
{
    struct rdzv_status *st = arg;
    if (st == NULL || !st->timers_open || st->srv == NULL ||
        uv_is_active((uv_handle_t *)&st->coalesce))
        return;
    /* Later, from the timer: every event of this loop turn (and of the
     * interval) is in the one render. */
    uint64_t since = cddp_mono_ms() - st->last_publish_ms;
    uint64_t delay = since >= st->min_interval_ms ? 0 : st->min_interval_ms - since;
    uv_timer_start(&st->coalesce, on_coalesce, delay, 0);
}

int rdzv_status_new(const char *addr, int port, const char *version, struct rdzv_status **out,
                    char *err, size_t errlen)
{
    *out = NULL;
    struct rdzv_status *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        snprintf(err, errlen, "status port: out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    st->version = version;
    st->started_at = cddp_wall_time();
    st->min_interval_ms = RDZV_STATUS_COALESCE_MS;
    cddp_fqdn(st->hostname, sizeof(st->hostname));
    struct status_server_options o;
    status_server_options_default(&o);
    o.addr = addr;
    o.port = port;
    o.program = "cddp-rdzv";
    int rc = status_server_start(&o, &st->server, err, errlen);
    if (rc) {
        free(st);
        return rc;
    }
    *out = st;
    return 0;
}

int rdzv_status_attach(struct rdzv_status *st, uv_loop_t *loop, const struct rdzv_server *srv)
{
    st->loop = loop;
    st->srv = srv;
    st->accepting = true;
    cddp_strlcpy(st->endpoint, rdzv_server_address(srv), sizeof(st->endpoint));
    uv_timer_init(loop, &st->tick);
    uv_timer_init(loop, &st->coalesce);
    st->tick.data = st;
    st->coalesce.data = st;
    st->timers_open = true;
    status_server_heartbeat(st->server);
    publish(st);
    return uv_timer_start(&st->tick, on_tick, RDZV_STATUS_TICK_MS, RDZV_STATUS_TICK_MS);
}

void rdzv_status_detach(struct rdzv_status *st)
{
    if (st == NULL || st->srv == NULL)
        return;
    st->accepting = false;
    publish(st); /* the runs as they were, no longer accepting */
    st->srv = NULL;
    if (st->timers_open) {
        st->timers_open = false;
        uv_close((uv_handle_t *)&st->tick, NULL);
        uv_close((uv_handle_t *)&st->coalesce, NULL);
    }
}

int rdzv_status_port(const struct rdzv_status *st)
{
    return status_server_port(st->server);
}

void rdzv_status_free(struct rdzv_status *st)
{
    if (st == NULL)
        return;
    status_server_stop(st->server);
    free(st->runs);
    free(st->first);
    free(st->nodes);
    free(st);
}
