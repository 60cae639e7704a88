/*
 * view.h: a rendezvous server's runs, members, wait lists and counters as a
 * status view (status/view.h). The one place that walks a server for
 * a status page: cddp-rdzv's (rendezvous/status.c) and that of an agent
 * hosting the server (agent/status.c). Plain data, no HTTP: the view is
 * rendered by status/view.c.
 *
 *     struct rdzv_view_builder b = {0};
 *     struct status_rdzv_view v;
 *     if (rdzv_view_build(&b, loop, srv, cddp_wall_time(), &v) == 0) {
 *         v.program = ...;  // program, version, pid, hostname, started_at
 *         status_rdzv_render(&v, ...);
 *     }
 *     rdzv_view_builder_free(&b);
 */
#ifndef CDDP_RENDEZVOUS_VIEW_H
#define CDDP_RENDEZVOUS_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "common/array.h"
#include "rendezvous/server.h"
#include "status/view.h"

/* Most runs and nodes one view holds: well past what a server serves
 * (rdzv_state's max_runs is 10,000 by default). */
#define RDZV_VIEW_MAX_RUNS (1u << 20)
#define RDZV_VIEW_MAX_NODES (1u << 24)

/* Arrays kept between builds (zero-initialise it; the first build sets
 * their maximums). */
struct rdzv_view_builder {
    CDDP_ARRAY(struct status_rdzv_run_view) runs;
    CDDP_ARRAY(size_t) first; /* per run: index of its first node in nodes */
    CDDP_ARRAY(struct status_rdzv_node_view) nodes;
    int err; /* the first failure of this build */
    double now_wall;
    uint64_t now_mono; /* the server's clock (uv_now of its loop), which the state's times use */
};

/* Fills v from srv, running on loop, at wall time now_wall: endpoint,
 * accepting (true), counters and runs; program, version, pid, hostname and
 * started_at are left to the caller. v points into b and into the server's
 * state until either changes: render it at once. Call on the loop's thread.
 * 0, or -ENOMEM or CDDP_ETOOBIG (v is then not to be used). */
int rdzv_view_build(struct rdzv_view_builder *b, uv_loop_t *loop, const struct rdzv_server *srv,
                    double now_wall, struct status_rdzv_view *v);

void rdzv_view_builder_free(struct rdzv_view_builder *b);

#endif
