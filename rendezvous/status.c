/*
 * status.c: see status.h. A thin shell: rendezvous/view.c walks the server
 * into a plain view that status/view.c renders.
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
#include "common/strutil.h"
#include "rendezvous/view.h"
#include "status/http.h"
#include "status/view.h"

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
    struct rdzv_view_builder view; /* scratch for one publish, kept between publishes */
    struct rdzv_jobs *jobs;        /* NULL: no job-wide statistics */
};

/* ---- cddp-rdzv's status port ---- */

static void publish(struct rdzv_status *st)
{
    if (st->timers_open)
        uv_timer_stop(&st->coalesce);
    uint64_t t0 = cddp_mono_ns();
    struct status_rdzv_view v;
    double now = cddp_wall_time();
    memset(&v, 0, sizeof(v));
    if (st->srv && rdzv_view_build(&st->view, st->loop, st->srv, now, &v) != 0) {
        log_error("S0201", "status port: out of memory listing the runs; not published");
        return;
    }
    if (st->srv && st->jobs)
        rdzv_jobs_add_goodput(st->jobs, &st->view, now);
    v.program = "cddp-rdzv";
    v.version = st->version;
    v.pid = (int)getpid();
    v.hostname = st->hostname;
    v.endpoint = st->endpoint;
    v.started_at = st->started_at;
    v.accepting = st->accepting && st->srv != NULL;
    struct status_snapshot *snap = NULL;
    int rc = status_rdzv_render(&v, now, &snap);
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

int rdzv_status_new(const char *addr, int port, const char *version, struct rdzv_jobs *jobs,
                    struct rdzv_status **out, char *err, size_t errlen)
{
    *out = NULL;
    struct rdzv_status *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        snprintf(err, errlen, "status port: out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    st->version = version;
    st->jobs = jobs;
    st->started_at = cddp_wall_time();
    st->min_interval_ms = RDZV_STATUS_COALESCE_MS;
    cddp_fqdn(st->hostname, sizeof(st->hostname));
    struct status_server_options o;
    status_server_options_default(&o);
    o.addr = addr;
    o.port = port;
    o.program = "cddp-rdzv";
    if (jobs) {
        o.on_history = rdzv_jobs_history;
        o.on_history_arg = jobs;
    }
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
    rdzv_view_builder_free(&st->view);
    free(st);
}
