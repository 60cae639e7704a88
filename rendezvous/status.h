/*
 * status.h: cddp-rdzv's status port (docs/status.md): the rendezvous
 * server's runs, their members and wait lists, and its counters, served by
 * status/http.c on its own thread.
 *
 *     struct rdzv_status *st;
 *     rdzv_status_new(addr, port, CDDP_VERSION, &st, err, sizeof(err));  // listens
 *     o.on_change = rdzv_status_changed;  o.change_arg = st;
 *     rdzv_server_start(loop, &o, &srv, ...);
 *     rdzv_status_attach(st, loop, srv);    // timers, first publish
 *     ...
 *     rdzv_status_detach(st);               // before rdzv_server_shutdown()
 *     (the loop ends)
 *     rdzv_status_free(st);
 *
 * Publishing is coalesced: the server reports every event (joins,
 * heartbeats, connections) through on_change; a snapshot is rendered at most
 * every RDZV_STATUS_COALESCE_MS, and never more often than keeps rendering
 * under 1/RDZV_STATUS_BUDGET of the loop's time (a server holding thousands
 * of nodes takes milliseconds to render). A 1 s timer bumps the /livez
 * heartbeat whatever the load.
 */
#ifndef CDDP_RENDEZVOUS_STATUS_H
#define CDDP_RENDEZVOUS_STATUS_H

#include <stddef.h>

#include <uv.h>

#include "rendezvous/jobs.h"
#include "rendezvous/server.h"

#define RDZV_STATUS_COALESCE_MS 250
#define RDZV_STATUS_TICK_MS 1000
#define RDZV_STATUS_BUDGET 20

struct rdzv_status;

/* Starts the status server on addr:port (0: a free port, logged as S0001).
 * version must outlive st. 0, or a negative code with a one-line reason in
 * err: CDDP_EPARSE when addr does not resolve (a usage error), another
 * code when the port cannot be listened on. jobs (may be NULL; must
 * outlive st): the job-wide statistics shown per run on /status and
 * /metrics and served as GET /history?run=<id>. */
int rdzv_status_new(const char *addr, int port, const char *version, struct rdzv_jobs *jobs,
                    struct rdzv_status **out, char *err, size_t errlen);

/* The rendezvous server is up on loop: start the timers and publish. */
int rdzv_status_attach(struct rdzv_status *st, uv_loop_t *loop, const struct rdzv_server *srv);

/* rdzv_server_options.on_change: something may have changed. */
void rdzv_status_changed(void *arg);

/* The server is about to shut down: publish it as no longer accepting
 * agents (/readyz 503), close the timers. Call before rdzv_server_shutdown. */
void rdzv_status_detach(struct rdzv_status *st);

/* The bound port. */
int rdzv_status_port(const struct rdzv_status *st);

/* Stops the status server and frees st (after the loop ended). NULL: no-op. */
void rdzv_status_free(struct rdzv_status *st);

#endif
