/*
 * rdzv_c10d.c: the multi-node rendezvous behind agent/rdzv.h, over cddp's
 * rendezvous server (rendezvous/client.c), which the agent hosts in-process
 * when it should (docs/multi-node.md):
 *
 *   --standalone          always: on 127.0.0.1, a free port;
 *   static, --nnodes > 1  node 0 (--node_rank=0): every interface, port
 *                         MASTER_PORT + 1 (MASTER_PORT is the workers');
 *   c10d                  rdzv_conf is_host=1: always (an error if it cannot
 *                         listen); is_host=0: never; unset: when the
 *                         endpoint names this machine (torchrun's guess,
 *                         cddp_host_is_local), and a port already taken
 *                         means another agent here serves it: be a client.
 *
 * Life: new -> join -> round -> (restart -> join -> round)* -> close.
 * close(END_JOB) sends "close" and waits (at most ACK_TIMEOUT_MS) for the
 * server's "closed" echo, so the reason reaches every node before this
 * connection goes; close(LEAVE, FINISHED) sends "leave" (finished: the
 * others go on without a restart) and waits the same way for the answer
 * to a store request sent after it. An agent hosting the server then drains
 * it (until the job's other connections are gone: at most close_timeout
 * after END_JOB, without limit after FINISHED, since the others still work
 * and need it) and shuts it down; a hosting agent that LEAVEs closes the
 * rendezvous for every node first (its server goes with it).
 *
 * A lost connection is the client's to mend (rendezvous/client.h): it
 * reconnects and resumes this node's round; the agent hears of it as a
 * restart when the round could not be resumed, as the rendezvous lost
 * when the server stays away past join_timeout, and through
 * base.info/on_info (connected, reconnects) for its status page, as for
 * the run's wait list and the server this agent hosts.
 *
 * A node that cannot reach its rendezvous (a partition: nothing comes back,
 * not even a refusal) is removed by the server once it has sent no
 * heartbeat for keep_alive_interval x keep_alive_max_attempt. The agent
 * does not wait to hear it: once the server's host has been silent for
 * that window while a round runs, it stops its workers (so no node
 * computes in a world the others have left) and joins again as a new
 * member with a fresh client (node id suffix _1, _2, ...), which connects
 * when the network heals (for up to join_timeout). A removal the server
 * did tell us (an agent that was frozen, then woken) is handled the same
 * way. A server that is down (its host refuses or resets connections)
 * removes nobody: that is the client's reconnect and resume, as above.
 *
 * The client calls its pending callbacks with -ECANCELED inside
 * rdzv_client_close; agent/rdzv.h promises that pending callbacks are not
 * called after close, so everything from the client is dropped once
 * closing is set.
 */
#include "agent/rdzv_backend.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/hostname.h"
#include "common/log.h"
#include "common/strutil.h"
#include "rendezvous/client.h"
#include "rendezvous/conf.h"
#include "rendezvous/jobs.h"
#include "rendezvous/server.h"

/* How long close waits for the server's echo of "close". */
#define ACK_TIMEOUT_MS 5000
/* torchrun's static rendezvous timeout when rdzv_conf has none (LaunchConfig). */
#define STATIC_TIMEOUT_MS 900000

struct c10d {
    struct agent_rdzv base;
    struct rdzv_calls calls; /* the join, the barrier, close (agent/rdzv_backend.h) */
    uv_loop_t *loop;
    struct rdzv_client *client; /* NULL once closed */
    struct rdzv_server *server; /* when hosting; NULL once shut down */
    struct rdzv_conf conf;
    uv_timer_t timer; /* a deferred join failure; the close echo's deadline */

    /* The keep-alive watch and the rejoin after a removal. */
    uv_timer_t quiet;        /* watches the server's silence while a round runs */
    bool round_active;       /* a round was given; no join or exit barrier since */
    bool replace_asked;      /* a replace was sent and not yet answered */
    bool quiet_suspect;      /* the last check found the window passed: confirm once */
    unsigned generation;     /* clients replaced after a removal (node id suffix) */
    unsigned reconnect_base; /* info.reconnects from the clients before this one */
    /* What a replacement client is started with (strings owned here). */
    struct rdzv_client_options co;
    char co_host[256], co_node_id[PROTO_MAX_ID + 1], co_local_addr[256], co_hostname[256];

    char run_id[PROTO_MAX_ID + 1];
    int nproc;
    bool fixed; /* static backend: node rank and MASTER_ADDR/PORT given */
    int node_rank;
    char master_addr[256];
    int master_port;
    uint64_t round; /* the last round (0: none yet) */
    int round_nnodes;

    bool waiting;         /* the server put our join on the wait list */
    uint64_t barrier_gen; /* a join abandons the barrier of the last round */
    bool awaiting_ack;    /* closing: the server's answer is awaited */
};

struct barrier_tag {
    struct c10d *c;
    uint64_t gen;
};

/* ---- closing ---- */

static void on_timer_closed(uv_handle_t *h)
{
    struct c10d *c = h->data;
    rdzv_calls_closed(&c->calls);
    free(c);
}

static void on_quiet_closed(uv_handle_t *h)
{
    struct c10d *c = h->data;
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

/* Closes the last handles, then frees c (on_timer_closed). */
static void close_timers(struct c10d *c)
{
    uv_close((uv_handle_t *)&c->quiet, on_quiet_closed);
}

static void on_server_down(void *arg)
{
    struct c10d *c = arg;
    c->server = NULL;
    close_timers(c);
}

static void info_changed(struct c10d *c)
{
    if (c->base.on_info)
        c->base.on_info(&c->base);
}

static void shutdown_server(struct c10d *c)
{
    if (c->base.info.server) {
        c->base.info.server = NULL; /* the status page lets go of it first */
        info_changed(c);
    }
    if (c->server == NULL) {
        close_timers(c);
        return;
    }
    log_info("A0711", "shutting down the rendezvous server of run '%s'", c->run_id);
    rdzv_server_shutdown(c->server, c->calls.close_reason, on_server_down, c);
}

static void on_drained(void *arg)
{
    shutdown_server(arg);
}

/* The client is gone: a hosting agent now lets the other nodes finish. */
static void on_client_closed(void *arg)
{
    struct c10d *c = arg;
    if (c->server && c->calls.how != AGENT_RDZV_LEAVE) {
        uint64_t ms = c->calls.how == AGENT_RDZV_END_JOB ? c->conf.close_timeout_ms : UINT64_MAX;
        if (ms == UINT64_MAX)
            log_warn("A0714",
                     "this node's workers succeeded; it keeps serving the rendezvous of run '%s' "
                     "until the other nodes finish",
                     c->run_id);
        else
            log_info("A0712", "waiting up to %.1f s for the other nodes of run '%s' to go",
                     (double)ms / 1000.0, c->run_id);
        if (rdzv_server_drain(c->server, c->run_id, ms, on_drained, c) == 0)
            return;
    }
    shutdown_server(c);
}

static void close_client(struct c10d *c)
{
    c->awaiting_ack = false;
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->quiet);
    struct rdzv_client *cl = c->client;
    c->client = NULL;
    if (cl)
        rdzv_client_close(cl, on_client_closed, c); /* our callbacks ignore -ECANCELED */
    else
        on_client_closed(c);
}

static void on_leave_ack(struct rdzv_client *cl, int status, const struct rdzv_store_result *r,
                         void *arg)
{
    (void)cl;
    (void)status; /* "not found" is the expected answer; any answer will do */
    (void)r;
    struct c10d *c = arg;
    if (c->awaiting_ack)
        close_client(c);
}

static void on_ack_timeout(uv_timer_t *t)
{
    struct c10d *c = t->data;
    if (c->awaiting_ack) {
        log_warn("A0713", "the rendezvous server did not confirm closing run '%s' within %.1f s",
                 c->run_id, ACK_TIMEOUT_MS / 1000.0);
        close_client(c);
    }
}

static void c10d_close(struct agent_rdzv *r, enum agent_rdzv_farewell how, const char *reason,
                       agent_rdzv_close_cb cb)
{
    struct c10d *c = (struct c10d *)r;
    if (!rdzv_calls_close(&c->calls, how, reason, cb))
        return;
    uv_timer_stop(&c->timer);
    /* A server that never welcomed this node has nothing to hear from it
     * (and may not exist: waiting for its answer would only delay the
     * exit). A hosting agent still closes its own server's run. */
    if (c->client == NULL || (c->server == NULL && !rdzv_client_ever_welcomed(c->client))) {
        close_client(c);
        return;
    }
    /* A hosting agent that leaves takes the server with it: close the run
     * for every node then too, so they hear why instead of a dropped
     * connection. */
    const char *why = c->calls.close_reason;
    if (how == AGENT_RDZV_END_JOB || (how == AGENT_RDZV_LEAVE && c->server)) {
        if (rdzv_client_close_rendezvous(c->client, why) == 0) {
            c->awaiting_ack = true;
            uv_timer_start(&c->timer, on_ack_timeout, ACK_TIMEOUT_MS, 0);
            return;
        }
    } else if (rdzv_client_leave(c->client, why, how == AGENT_RDZV_FINISHED) == 0 &&
               rdzv_client_get(c->client, "cddp/agent/leave_ack", -1, on_leave_ack, c) == 0) {
        /* The server answers requests in order: when this answer comes,
         * the leave was seen (a connection closed at once could lose it,
         * and a lost node makes the others restart). */
        c->awaiting_ack = true;
        uv_timer_start(&c->timer, on_ack_timeout, ACK_TIMEOUT_MS, 0);
        return;
    }
    close_client(c);
}

/* ---- rounds ---- */

static void on_deferred(uv_timer_t *t)
{
    struct c10d *c = t->data;
    rdzv_calls_deferred(&c->calls);
}

static void on_joined(struct rdzv_client *cl, int status, const struct proto_round *pr, void *arg)
{
    struct c10d *c = arg;
    if (c->calls.closing) {
        /* Our own "close" crossed a join: the echo came here. */
        if (c->awaiting_ack && status != 0)
            close_client(c);
        return;
    }
    if (cl != c->client || c->calls.join_cb == NULL || c->calls.join_deferred)
        return; /* a replaced client's (-ECANCELED), or nobody waits */
    if (status != 0) {
        c->base.was_waiting = c->waiting && status == CDDP_ECLOSED;
        rdzv_calls_round(&c->calls, status, NULL, rdzv_client_last_error(cl));
        return;
    }
    struct agent_round r;
    rdzv_round_from_proto(&r, pr);
    if (c->fixed) {
        cddp_strlcpy(r.master_addr, c->master_addr, sizeof(r.master_addr));
        r.master_port = c->master_port;
        if (pr->node_rank != c->node_rank) {
            char why[256];
            snprintf(why, sizeof(why),
                     "the static rendezvous made this node rank %d, but --node_rank=%d: two "
                     "agents were started with the same --node_rank",
                     pr->node_rank, c->node_rank);
            rdzv_calls_round(&c->calls, CDDP_EMISMATCH, NULL, why);
            return;
        }
    }
    c->round = r.round;
    c->round_nnodes = r.nnodes;
    c->round_active = true;
    c->quiet_suspect = false;
    if (!c->base.info.connected && c->generation > 0) {
        /* A new member's first round: connected again. */
        c->base.info.connected = true;
        c->base.info.disconnected_at = 0;
        c->base.info.reconnects = c->reconnect_base;
        info_changed(c);
    }
    rdzv_calls_round(&c->calls, 0, &r, NULL);
}

static void defer_join_failure(struct c10d *c, int status, const char *reason)
{
    rdzv_calls_defer_join(&c->calls, &c->timer, on_deferred, status, reason);
}

static int c10d_join(struct agent_rdzv *r, const struct agent_join *req, agent_round_cb cb)
{
    struct c10d *c = (struct c10d *)r;
    int rc = rdzv_calls_join(&c->calls, req, c->nproc, cb);
    if (rc)
        return rc;
    if (c->client == NULL) {
        defer_join_failure(c, CDDP_ECLOSED, "the rendezvous client could not be restarted");
        return 0;
    }
    /* The barrier of the last round, if any, can no longer complete. */
    c->calls.barrier_cb = NULL;
    c->barrier_gen++;
    c->waiting = false;
    c->base.was_waiting = false;
    c->round_active = false;
    /* MASTER_PORT: a free port here, used if this node becomes node 0
     * (torch's get_free_port). The static backend's is given. */
    int port = 0;
    if (!c->fixed && req->master_port > 0)
        port = req->master_port; /* the agent's store holds it already */
    else if (!c->fixed) {
        port = agent_free_port();
        if (port < 0) {
            char why[128];
            snprintf(why, sizeof(why), "picking a free MASTER_PORT: %s", cddp_strerror(port));
            defer_join_failure(c, port, why);
            return 0;
        }
    }
    rc = rdzv_client_join(c->client, port, on_joined, c);
    if (rc == CDDP_ECLOSED) {
        /* The connection is gone: say why, from the loop. */
        defer_join_failure(c, rc, rdzv_client_last_error(c->client));
        return 0;
    }
    if (rc)
        c->calls.join_cb = NULL;
    return rc;
}

static int c10d_report_failure(struct agent_rdzv *r, int restart_count)
{
    struct c10d *c = (struct c10d *)r;
    char why[64];
    snprintf(why, sizeof(why), "worker group failed (restart count %d)", restart_count);
    return c->calls.closing || c->client == NULL ? CDDP_ECLOSED
                                                 : rdzv_client_report_failure(c->client, why);
}

static void on_barrier(struct rdzv_client *cl, int status, void *arg)
{
    (void)cl;
    struct barrier_tag *t = arg;
    struct c10d *c = t->c;
    uint64_t gen = t->gen;
    free(t);
    if (c->calls.closing || gen != c->barrier_gen)
        return;
    rdzv_calls_barrier(&c->calls, status);
}

static int c10d_exit_barrier(struct agent_rdzv *r, uint64_t timeout_ms, agent_rdzv_status_cb cb)
{
    struct c10d *c = (struct c10d *)r;
    if (c->calls.barrier_cb || c->calls.closing || c->round == 0 || c->client == NULL)
        return CDDP_ESTATE;
    c->round_active = false; /* the workers are done: nothing computes in a stale world */
    /* torch's key (store_util.barrier), one per round: a barrier abandoned
     * for a new round never mixes with the next one. */
    char prefix[96];
    snprintf(prefix, sizeof(prefix), "torchelastic/agent/terminal_state/%llu",
             (unsigned long long)c->round);
    struct barrier_tag *t = malloc(sizeof(*t));
    if (t == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    t->c = c;
    t->gen = ++c->barrier_gen;
    int64_t ms = timeout_ms > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)timeout_ms;
    int rc = rdzv_client_barrier(c->client, prefix, c->round_nnodes, ms, on_barrier, t);
    if (rc) {
        free(t);
        return rc;
    }
    c->calls.barrier_cb = cb;
    return 0;
}

/* ---- pushed news ---- */

static void on_event(struct rdzv_client *cl, const struct rdzv_event *ev, void *data);

/* The agent's goodput totals, at each heartbeat of the client. */
static bool client_goodput(void *arg, struct proto_goodput *out)
{
    struct c10d *c = arg;
    return c->base.goodput && c->base.goodput(&c->base, out);
}

/* A client for this node under its current generation's node id. */
static int start_client(struct c10d *c, char *err, size_t errlen)
{
    char node_id[PROTO_MAX_ID + 1];
    if (c->generation == 0)
        cddp_strlcpy(node_id, c->co_node_id, sizeof(node_id));
    else
        snprintf(node_id, sizeof(node_id), "%.200s_%u", c->co_node_id, c->generation);
    struct rdzv_client_options co = c->co;
    co.node_id = node_id;
    if (c->generation > 0) /* a new member has join_timeout to reach the server again */
        co.connect_timeout_ms = c->conf.join_timeout_ms;
    int rc = rdzv_client_start(c->loop, &co, on_event, c, &c->client, err, errlen);
    if (rc == 0)
        rdzv_client_set_goodput(c->client, client_goodput, c);
    return rc;
}

/* This node is out of the run (the server removed it, or will have by
 * now): drop the client and start a fresh one that joins as a new member.
 * While a round runs, the agent is told to stop its workers and join. */
static void rejoin_as_new_member(struct c10d *c, const char *why)
{
    struct rdzv_client *old = c->client;
    c->client = NULL;
    if (old)
        rdzv_client_close(old, NULL, NULL); /* its callbacks are dropped (not c->client) */
    c->generation++;
    c->reconnect_base = c->base.info.reconnects + 1;
    c->quiet_suspect = false;
    bool was_running = c->round_active;
    c->round_active = false;
    char err[256] = "";
    int rc = start_client(c, err, sizeof(err));
    if (rc) {
        c->client = NULL; /* nothing to rejoin with: the rendezvous is lost */
        if (c->base.on_closed)
            c->base.on_closed(&c->base, rc, err[0] ? err : cddp_strerror(rc));
        return;
    }
    c->base.info.connected = false;
    c->base.info.disconnected_at = cddp_wall_time();
    info_changed(c);
    if (was_running && c->base.on_restart)
        c->base.on_restart(&c->base, why, false);
}

static uint64_t removal_window_ms(const struct c10d *c)
{
    return c->conf.keep_alive_interval_ms * (uint64_t)c->conf.keep_alive_max_attempt;
}

/* While a round runs: has the server's host been silent for the window
 * after which the server removes a node? Confirmed on the next tick, so a
 * process that was stopped reads what arrived meanwhile first. */
static void on_quiet_tick(uv_timer_t *t)
{
    struct c10d *c = t->data;
    if (c->calls.closing || c->client == NULL || !c->round_active)
        return;
    int64_t quiet = rdzv_client_quiet_ms(c->client);
    uint64_t window = removal_window_ms(c);
    if (quiet < 0 || (uint64_t)quiet < window) {
        c->quiet_suspect = false;
        return;
    }
    if (!c->quiet_suspect) {
        c->quiet_suspect = true;
        return;
    }
    char why[512];
    snprintf(why, sizeof(why),
             "heard nothing from the rendezvous server for %.1f s (keep_alive_interval=%.1f s x "
             "keep_alive_max_attempt=%d): the server has removed this node",
             (double)quiet / 1000.0, (double)c->conf.keep_alive_interval_ms / 1000.0,
             c->conf.keep_alive_max_attempt);
    log_warn("A2110",
             "%s; stopping this node's workers; it joins run '%s' again as a new member when the "
             "server is reachable (for up to %.1f s)",
             why, c->run_id, (double)c->conf.join_timeout_ms / 1000.0);
    rejoin_as_new_member(c, why);
}

static void describe_restart(const struct rdzv_event *ev, char *out, size_t len)
{
    const char *n = ev->node_id ? ev->node_id : "?";
    const char *r = ev->reason ? ev->reason : "";
    if (strcmp(r, "node_lost") == 0)
        snprintf(out, len, "node '%s' was lost (its connection dropped)", n);
    else if (strcmp(r, "heartbeat_timeout") == 0)
        snprintf(out, len, "node '%s' was lost (no heartbeat)", n);
    else if (strcmp(r, "node_left") == 0)
        snprintf(out, len, "node '%s' left", n);
    else if (strcmp(r, "node_joined") == 0)
        snprintf(out, len, "node '%s' joined (scale-up)", n);
    else if (strcmp(r, "node_rejoined") == 0)
        snprintf(out, len, "node '%s' asked for a new round", n);
    else if (strcmp(r, "node_replaced") == 0)
        snprintf(out, len, "node '%s' reconnected", n);
    else if (strcmp(r, "worker_failure") == 0)
        snprintf(out, len, "the worker group of node '%s' failed (restart %lld of the job)", n,
                 (long long)ev->restart_count);
    else if (strcmp(r, "node_missing") == 0)
        snprintf(out, len,
                 "a node of the round did not come back to the restarted rendezvous "
                 "server in time (resume_timeout)");
    else if (strcmp(r, "resume_failed") == 0)
        snprintf(out, len, "this node's round ended while it was disconnected (%s)",
                 ev->message ? ev->message : "the server did not resume it");
    else
        snprintf(out, len, "%s (node '%s')", r, n);
}

static void on_event(struct rdzv_client *cl, const struct rdzv_event *ev, void *data)
{
    struct c10d *c = data;
    char why[512];
    if (cl != c->client)
        return; /* a client replaced after a removal */
    if (ev->kind == RDZV_EV_ERROR && ev->from_server && ev->code == CDDP_ETIMEOUT &&
        !c->calls.closing && c->calls.join_cb == NULL && c->calls.barrier_cb == NULL) {
        /* The server removed us (missed heartbeats): we are still welcome
         * as a new member. */
        log_warn("A2111", "%s; this node joins run '%s' again as a new member",
                 ev->message ? ev->message : "removed from the run", c->run_id);
        rejoin_as_new_member(c, ev->message ? ev->message : "this node was removed from the run");
        return;
    }
    switch (ev->kind) {
    case RDZV_EV_JOINED:
        c->waiting = ev->waiting;
        if (ev->waiting && !c->calls.closing)
            log_warn("A0701",
                     "run '%s' runs at its maximum number of nodes: this node waits for a place "
                     "(round %llu)",
                     c->run_id, (unsigned long long)ev->round);
        return;
    case RDZV_EV_GENERATION:
        if (ev->generation == 0 ||
            (ev->node_id && strcmp(ev->node_id, rdzv_client_node_id(cl)) == 0))
            c->replace_asked = false;
        if (c->calls.closing || c->base.on_generation == NULL)
            return;
        c->base.on_generation(&c->base, ev->generation, ev->replaced, ev->node_id, ev->message,
                              ev->restart_count);
        return;
    case RDZV_EV_BLAME:
        if (!c->calls.closing && c->base.on_blame)
            c->base.on_blame(&c->base, ev->rank, ev->generation, ev->node_id);
        return;
    case RDZV_EV_DISCONNECTED:
        if (c->calls.closing)
            return;
        if (c->replace_asked && c->base.on_generation) {
            c->replace_asked = false;
            c->base.on_generation(&c->base, 0, NULL, NULL,
                                  "the connection to the rendezvous server was lost before it "
                                  "answered",
                                  0);
        }
        log_warn("A0715", "%s; reconnecting (for up to %.1f s)%s",
                 ev->message ? ev->message : "lost the connection to the rendezvous server",
                 (double)c->conf.join_timeout_ms / 1000.0,
                 c->calls.join_cb ? " to join again"
                                  : "; this node's workers, if any, keep running meanwhile");
        c->base.info.connected = false;
        c->base.info.disconnected_at = cddp_wall_time();
        info_changed(c);
        return;
    case RDZV_EV_RECONNECTED:
        if (c->calls.closing)
            return;
        if (ev->resumed)
            log_warn("A0716",
                     "reconnected to the rendezvous server: this node is still in round %llu; "
                     "the workers keep running",
                     (unsigned long long)ev->round);
        else
            log_warn("A0717", "reconnected to the rendezvous server");
        c->base.info.connected = true;
        c->base.info.disconnected_at = 0;
        c->base.info.reconnects = c->reconnect_base + rdzv_client_reconnects(cl);
        info_changed(c);
        return;
    case RDZV_EV_WAITING:
        c->base.info.waiting_nodes = ev->waiting_nodes;
        info_changed(c);
        return;
    case RDZV_EV_RESTART:
        c->round_active = false; /* the workers stop; the agent joins again */
        c->replace_asked = false;
        if (ev->reason && strcmp(ev->reason, "resume_failed") == 0 && !c->calls.closing) {
            /* Reconnected, but not to its round: connected all the same. */
            c->base.info.connected = true;
            c->base.info.disconnected_at = 0;
            c->base.info.reconnects = c->reconnect_base + rdzv_client_reconnects(cl);
            info_changed(c);
        }
        if (c->calls.closing || c->base.on_restart == NULL)
            return;
        describe_restart(ev, why, sizeof(why));
        c->base.on_restart(&c->base, why, ev->counted);
        return;
    case RDZV_EV_CLOSED:
    case RDZV_EV_ERROR:
        if (c->calls.closing) {
            if (c->awaiting_ack)
                close_client(c);
            return;
        }
        if (c->base.on_closed == NULL)
            return;
        if (ev->kind == RDZV_EV_CLOSED)
            c->base.on_closed(&c->base, 0, ev->reason ? ev->reason : "closed");
        else
            c->base.on_closed(&c->base, ev->code ? ev->code : CDDP_ECLOSED,
                              ev->message ? ev->message : cddp_strerror(ev->code));
        return;
    }
}

/* ---- start ---- */

/* The summary rides on the client's heartbeats; a replacement client (a
 * new member) gets it with the agent's next judgement. */
/* --restart_scope=worker: ask the server for the group's next generation
 * (docs/protocol.md, "replace"). A lost connection loses the answer: the
 * ask is refused then (on_event's DISCONNECTED). */
static int c10d_replace(struct agent_rdzv *r, int rank, const char *ranks, const char *reason)
{
    struct c10d *c = (struct c10d *)r;
    if (c->client == NULL || c->calls.closing || !c->round_active)
        return CDDP_ESTATE;
    int rc = rdzv_client_replace(c->client, rank, ranks, reason);
    c->replace_asked = rc == 0;
    return rc;
}

static int c10d_blame(struct agent_rdzv *r, int rank, int64_t generation)
{
    struct c10d *c = (struct c10d *)r;
    if (c->client == NULL || c->calls.closing || !c->round_active)
        return CDDP_ESTATE;
    return rdzv_client_blame(c->client, rank, generation);
}

static void c10d_set_perf(struct agent_rdzv *r, const struct proto_perf *perf)
{
    struct c10d *c = (struct c10d *)r;
    if (c->client)
        rdzv_client_set_perf(c->client, perf);
}

static const struct agent_rdzv_ops c10d_ops = {
    .name = "c10d",
    .join = c10d_join,
    .report_failure = c10d_report_failure,
    .exit_barrier = c10d_exit_barrier,
    .close = c10d_close,
    .set_perf = c10d_set_perf,
    .replace = c10d_replace,
    .blame = c10d_blame,
};

static bool is_loopback_literal(const char *h)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, h, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, h, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

enum host_mode { HOST_NO, HOST_YES, HOST_GUESS };

int agent_rdzv_c10d_new(uv_loop_t *loop, const struct agent_rdzv_c10d_options *o,
                        struct agent_rdzv **out, char *err, size_t errlen)
{
    struct c10d *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    c->base.ops = &c10d_ops;
    c->base.loop = loop;
    rdzv_calls_init(&c->calls, &c->base);
    c->base.coordinated = true;
    c->base.picks_master_port = !o->fixed;
    c->base.info.connected = true;
    c->base.info.waiting_nodes = -1;
    c->loop = loop;
    c->nproc = o->nproc;
    c->fixed = o->fixed;
    c->node_rank = o->node_rank;
    cddp_strlcpy(c->run_id, o->run_id, sizeof(c->run_id));
    if (o->fixed) {
        cddp_strlcpy(c->master_addr, o->master_addr, sizeof(c->master_addr));
        c->master_port = o->master_port;
    }
    if (o->conf)
        c->conf = *o->conf;
    else
        rdzv_conf_init(&c->conf);
    int rc;
    if (o->fixed) /* torch's static rendezvous waits `timeout` for every node */
        c->conf.join_timeout_ms = c->conf.timeout_ms ? c->conf.timeout_ms : STATIC_TIMEOUT_MS;
    const char *token = c->conf.has_token ? c->conf.token : getenv("CDDP_RDZV_TOKEN");

    /* Where the server is, and whether this agent serves it. */
    const char *host = o->host;
    int port = o->port;
    const char *bind = NULL; /* every interface */
    enum host_mode mode;
    if (o->standalone) {
        mode = HOST_YES;
        host = bind = "127.0.0.1";
        port = 0;
    } else if (o->fixed) {
        mode = o->node_rank == 0 ? HOST_YES : HOST_NO;
    } else if (c->conf.is_host >= 0) {
        mode = c->conf.is_host ? HOST_YES : HOST_NO;
    } else {
        mode = cddp_host_is_local(host) ? HOST_GUESS : HOST_NO;
    }
    /* A loopback endpoint is served on loopback only, not to the network. */
    if (!o->standalone && is_loopback_literal(host))
        bind = host;
    char why[512] = "";
    if (mode != HOST_NO) {
        struct rdzv_server_options so = {
            .host = bind,
            .port = port,
            .token = token,
            .read_timeout_ms = c->conf.read_timeout_ms,
            .name = "cddprun (in-process)",
        };
        struct rdzv_jobs *jobs = o->host_jobs ? o->host_jobs(o->host_jobs_arg) : NULL;
        if (jobs) {
            so.on_heartbeat = rdzv_jobs_on_heartbeat;
            so.on_action = rdzv_jobs_on_action;
            so.jobs_arg = jobs;
        }
        rc = rdzv_server_start(loop, &so, &c->server, why, sizeof(why));
        if (rc == UV_EADDRINUSE && mode == HOST_GUESS) {
            log_info("A0702",
                     "%s:%d is served already (another agent on this machine?): joining it", host,
                     port);
            c->server = NULL;
        } else if (rc) {
            snprintf(err, errlen, "cannot host the rendezvous: %s", why);
            free(c);
            return rc;
        } else {
            port = rdzv_server_port(c->server);
            c->base.info.server = c->server;
            log_info("A0703", "hosting the rendezvous of run '%s' on %s", c->run_id,
                     rdzv_server_address(c->server));
        }
    }

    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    uv_timer_init(loop, &c->quiet);
    c->quiet.data = c;
    char fqdn[256];
    cddp_fqdn(fqdn, sizeof(fqdn));
    char node_id[PROTO_MAX_ID + 1];
    if (o->fixed) /* sorts by node rank: the server ranks newcomers by node id */
        snprintf(node_id, sizeof(node_id), "r%07d_%.180s_%d", o->node_rank, fqdn, (int)getpid());
    else
        snprintf(node_id, sizeof(node_id), "%.200s_%d_0", fqdn, (int)getpid());
    struct rdzv_client_options co = {
        .host = host,
        .port = port,
        .run_id = o->run_id,
        .node_id = node_id,
        .nproc = o->nproc,
        .min_nodes = o->min_nodes,
        .max_nodes = o->max_nodes,
        .local_addr = o->local_addr,
        .hostname = fqdn,
        .status_port = o->status_port,
        .conf = &c->conf,
    };
    /* Kept for the clients that replace this one after a removal. */
    cddp_strlcpy(c->co_host, host, sizeof(c->co_host));
    cddp_strlcpy(c->co_node_id, node_id, sizeof(c->co_node_id));
    cddp_strlcpy(c->co_local_addr, o->local_addr ? o->local_addr : "", sizeof(c->co_local_addr));
    cddp_strlcpy(c->co_hostname, fqdn, sizeof(c->co_hostname));
    c->co = co;
    c->co.host = c->co_host;
    c->co.run_id = c->run_id;
    c->co.local_addr = c->co_local_addr[0] ? c->co_local_addr : NULL;
    c->co.hostname = c->co_hostname;
    c->co.conf = &c->conf;
    rc = start_client(c, why, sizeof(why));
    if (rc) {
        snprintf(err, errlen, "rendezvous client: %s", why);
        /* What was started closes itself on the loop, then frees c. */
        cddp_strlcpy(c->calls.close_reason, "the agent could not start",
                     sizeof(c->calls.close_reason));
        c->calls.closing = true;
        c->client = NULL;
        shutdown_server(c);
        return rc;
    }
    /* Checked ten times per window: a removed node stops within about 1.2
     * windows of the last word from the server (the confirming tick). */
    uint64_t tick = removal_window_ms(c) / 10;
    tick = tick < 20 ? 20 : tick;
    uv_timer_start(&c->quiet, on_quiet_tick, tick, tick);
    *out = &c->base;
    return 0;
}
