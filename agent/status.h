/*
 * status.h: cddprun's status port and its workers' progress channel, plugged
 * into the agent through its hooks (agent/agent.h). docs/status.md is the
 * user's side of both.
 *
 *     struct agent_status *st;
 *     if (agent_status_new(cfg, CDDP_VERSION, &st, err, sizeof(err)) != 0) ...
 *     struct agent_hooks hooks;
 *     agent_status_hooks(st, &hooks);
 *     int code = agent_run(cfg, &hooks);
 *     agent_status_linger(st, cfg);                               // --status_linger
 *     agent_status_free(st);
 *
 * The status port (cfg->status_port >= 0): status/http.c serves, on
 * its own thread, snapshots this module renders on the agent's loop:
 *   - at once after every agent state change (state_changed hook);
 *   - at most every AGENT_STATUS_COALESCE_MS while only progress lines arrive;
 *   - every second from a loop timer that also bumps the /livez heartbeat,
 *     so a wedged loop fails /livez and uptimes and progress ages stay fresh.
 * The listening socket is opened by agent_status_new(), before the agent
 * starts anything, so a port in use is an error before any worker runs; it
 * is closed by agent_status_free(), after the final state was published.
 *
 * The progress channel is always on (with or without a status port): every
 * worker gets the write end of its own pipe as an inherited fd, named by
 * CDDP_PROGRESS_FD; the agent reads the other end without blocking and feeds
 * proto/progress.c's parser. A new attempt gets a new pipe and empty values.
 *
 * Worker exits and group restarts are counted here by reason, from the
 * agent's snapshots (see agent_status_hooks).
 */
#ifndef CDDP_AGENT_STATUS_H
#define CDDP_AGENT_STATUS_H

#include <stddef.h>

#include "agent/agent.h"

/* Progress-only changes are published at most this often. */
#define AGENT_STATUS_COALESCE_MS 250
/* The heartbeat and republish period. */
#define AGENT_STATUS_TICK_MS 1000

struct agent_status;

/*
 * Allocates the status module for cfg and version (the program's, for
 * /status and cddp_build_info; both must outlive it) and, when
 * cfg->status_port >= 0, starts the status server (logging S0001 with the
 * port). 0, or a negative code with a one-line reason in err and *out NULL:
 * CDDP_EPARSE when cfg->status_addr does not resolve (a usage error), another
 * code when the port cannot be listened on.
 */
int agent_status_new(const struct launch_config *cfg, const char *version,
                     struct agent_status **out, char *err, size_t errlen);

/* Fills hooks for agent_run(); st must outlive the run. */
void agent_status_hooks(struct agent_status *st, struct agent_hooks *hooks);

/* After agent_run() returned: keeps serving the final status for up to
 * cfg->status_linger_s seconds (no-op without a status port or linger), or
 * until one of cfg->signals arrives. */
void agent_status_linger(struct agent_status *st, const struct launch_config *cfg);

/* The bound port, or -1 without a status port. */
int agent_status_port(const struct agent_status *st);

/* Stops the server and frees st. Call after agent_run() returned (the loop's
 * handles are closed by then). NULL is a no-op. */
void agent_status_free(struct agent_status *st);

#endif
