/*
 * rdzv.h: the rendezvous as the agent sees it.
 *
 * The agent asks for rounds and reports on its worker group; the rendezvous
 * answers asynchronously on the agent's libuv loop and may push events of
 * its own at any time (a membership change, closing). Implementations embed
 * struct agent_rdzv first in their own struct:
 *
 *   - agent/rdzv_static.c: one node, no network (the static backend with
 *     --nnodes=1, torchrun's default);
 *   - agent/rdzv_c10d.c: several nodes through cddp's rendezvous server
 *     (rendezvous/client.c), which this agent may also host: the c10d
 *     backend, --standalone, and the static backend with --nnodes > 1;
 *   - agent/rdzv_etcd.c: several nodes through etcd's v3 API (etcd-v3).
 *
 * The network backends share their bookkeeping of the calls below (and the
 * start of close) through agent/rdzv_backend.h.
 *
 * Rules, as libuv's: a call that returns an error never calls its callback;
 * a call that returns 0 calls it exactly once, never from inside the call
 * itself (always from a later loop iteration) -- except that close cancels
 * what is pending: callbacks pending at close are not called. A join also
 * abandons an exit barrier that has not completed (its callback is not
 * called): the job did not end in that round. Callbacks run on the loop
 * thread.
 *
 * Rounds are numbered 1, 2, ... by every implementation (0: no round yet).
 */
#ifndef CDDP_AGENT_RDZV_H
#define CDDP_AGENT_RDZV_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "rendezvous/conf.h"

/* One rendezvous round: everything the agent needs to start its workers. */
struct agent_round {
    uint64_t round; /* 1, 2, ...: numbered by the rendezvous */
    /* Worker-failure restarts the job had before this round, counted by
     * the rendezvous for every node (coordinated mode: the policy's
     * TORCHELASTIC_RESTART_COUNT); rdzv_static counts report_failure calls. */
    int64_t restart_count;
    int node_rank;   /* GROUP_RANK */
    int nnodes;      /* GROUP_WORLD_SIZE */
    int world_size;  /* WORLD_SIZE: workers over all nodes */
    int rank_offset; /* RANK of this node's local rank 0 (prefix sum of nproc) */
    char master_addr[256];
    int master_port;
    char run_id[PROTO_MAX_ID + 1]; /* TORCHELASTIC_RUN_ID */
    int use_agent_store; /* TORCHELASTIC_USE_AGENT_STORE (0: workers' rank 0 serves the store) */
    /* > 0: the round goes on with the last round's worker group in place
     * and the nodes new to it replace lost ones, whose global ranks
     * replaced lists (proto_round's; c10d only; 0 from the others). */
    int64_t generation;
    char replaced[PROTO_MAX_REPLACED + 1];
};

/* What this node offers when it joins. */
struct agent_join {
    int local_world_size; /* nproc_per_node */
    const char *role;
    int restart_count;
    /* > 0: the port this node's agent already listens on with its store
     * (--agent_store), published as MASTER_PORT if this node becomes node
     * 0; 0: the rendezvous picks a free one. Used only where the rendezvous
     * picks MASTER_PORT (picks_master_port). */
    int master_port;
};

struct agent_rdzv;

/* How a node takes its leave of the rendezvous (close). */
enum agent_rdzv_farewell {
    AGENT_RDZV_LEAVE,    /* the others restart without this node (not counted) */
    AGENT_RDZV_FINISHED, /* this node's workers succeeded: the others go on undisturbed */
    AGENT_RDZV_END_JOB,  /* the job is over: the rendezvous closes for every node */
};

/* status 0: round is valid for the duration of the call (copy it).
 * status < 0: no round (timeout, closed, refused); reason says why. */
typedef void (*agent_round_cb)(struct agent_rdzv *r, int status, const struct agent_round *round,
                               const char *reason);
typedef void (*agent_rdzv_status_cb)(struct agent_rdzv *r, int status);
typedef void (*agent_rdzv_close_cb)(struct agent_rdzv *r);

struct proto_perf;    /* proto/msg.h */
struct proto_goodput; /* proto/msg.h */

struct agent_rdzv_ops {
    const char *name;
    /* Joins the next round. One join at a time (CDDP_ESTATE otherwise). */
    int (*join)(struct agent_rdzv *r, const struct agent_join *req, agent_round_cb cb);
    /* This node's worker group failed (restart_count so far): peers should
     * restart too. Fire and forget; 0 or an error. */
    int (*report_failure)(struct agent_rdzv *r, int restart_count);
    /* Waits (bounded) until every node's workers have finished. */
    int (*exit_barrier)(struct agent_rdzv *r, uint64_t timeout_ms, agent_rdzv_status_cb cb);
    /* Cancels what is pending (pending callbacks are not called), takes
     * this node out of the rendezvous as `how` says (reason: what the
     * other nodes are told) and releases the implementation's handles; cb
     * runs once they are closed. An agent hosting the server keeps serving
     * until the other nodes are gone (END_JOB: at most close_timeout;
     * FINISHED: as long as they run), then shuts it down; on LEAVE it
     * closes the rendezvous for every node first (the server goes). */
    void (*close)(struct agent_rdzv *r, enum agent_rdzv_farewell how, const char *reason,
                  agent_rdzv_close_cb cb);
    /* Optional (NULL: the backend has no server to tell): what this node's
     * heartbeats carry of its ranks' step times from now on (NULL:
     * nothing), for the job-wide straggler judgement (docs/status.md). */
    void (*set_perf)(struct agent_rdzv *r, const struct proto_perf *perf);
    /* Optional (NULL: the backend cannot number the group's generations;
     * a worker's failure on several nodes restarts the group):
     * --restart_scope=worker, the worker of global rank `rank` failed and
     * this node would restart it alone (ranks non-NULL: those of its
     * ranks, "5,7", `rank` the first, together in one generation); the
     * answer comes through on_generation, exactly once unless a restart or
     * close comes first. 0, or an error (no answer will come: fail the
     * group; CDDP_EPROTO_TYPE: the backend or server cannot). */
    int (*replace)(struct agent_rdzv *r, int rank, const char *ranks, const char *reason);
    /* Optional (NULL: cannot): a worker here named global rank `rank`,
     * another node's, as never reaching a collective of `generation`; the
     * rendezvous passes it on to that node's agent (its on_blame). */
    int (*blame)(struct agent_rdzv *r, int rank, int64_t generation);
};

struct rdzv_server;
struct rdzv_jobs; /* rendezvous/jobs.h */

/* What the rendezvous knows besides rounds, for the status page. The
 * implementation keeps it current and calls on_info after a change. */
struct agent_rdzv_info {
    /* false from a lost connection to the rendezvous server until the
     * client reconnected (the workers keep running meanwhile) */
    bool connected;
    double disconnected_at; /* wall time of the loss; 0 while connected */
    unsigned reconnects;    /* connections re-established after a loss */
    int64_t waiting_nodes;  /* the run's wait list as the server last said; -1: unknown */
    /* The server this agent hosts (NULL: none), for its status page: valid
     * until on_info says it is NULL; read it on the loop thread only. */
    const struct rdzv_server *server;
    /* etcd-v3 (agent/rdzv_etcd.c; NULL / false otherwise): the member in
     * use, whether this node's lease was kept alive at the last try and
     * whether the watch stream is open, and how often the member changed. */
    const char *etcd_member;
    bool etcd_lease_ok, etcd_watch_ok;
    unsigned etcd_failovers;
};

struct agent_rdzv {
    const struct agent_rdzv_ops *ops;
    uv_loop_t *loop;
    void *data; /* the agent */
    /* Pushed by the rendezvous; set by the agent before the first join.
     * on_restart: stop the workers and join the next round; counted: a
     * worker group failed somewhere (the next round's restart_count says
     * so too). on_closed: status 0, the rendezvous was closed (reason);
     * otherwise it was lost (status, reason). */
    void (*on_restart)(struct agent_rdzv *r, const char *reason, bool counted);
    void (*on_closed)(struct agent_rdzv *r, int status, const char *reason);
    /* A replace answered, or another node's granted (may be NULL):
     * generation > 0, the round goes on in place with `replaced` (global
     * ranks) restarted by node_id's agent, the job's restart_count'th
     * counted restart; generation 0, this node's replace was refused
     * (refused: why). */
    void (*on_generation)(struct agent_rdzv *r, int64_t generation, const char *replaced,
                          const char *node_id, const char *refused, int64_t restart_count);
    /* Another node's worker named one of this node's ranks as never
     * reaching a collective of `generation` (may be NULL). */
    void (*on_blame)(struct agent_rdzv *r, int rank, int64_t generation, const char *node_id);
    /* info changed (may be NULL). */
    void (*on_info)(struct agent_rdzv *r);
    /* Optional: this node's goodput totals for its heartbeats (c10d: the
     * server sums them job-wide); false: none. */
    bool (*goodput)(struct agent_rdzv *r, struct proto_goodput *out);
    struct agent_rdzv_info info;
    /* Set before a failed round callback: this node was on the wait list
     * (the job ran at max nodes) when the rendezvous closed, so nothing ran
     * here. */
    bool was_waiting;
    /* Restarts are counted by the rendezvous for the whole job (several
     * nodes): the agent's policy runs coordinated. */
    bool coordinated;
    /* MASTER_PORT is the one node 0 offered at join (c10d, --standalone),
     * not a given one (static): an agent store binds before joining. */
    bool picks_master_port;
};

/* Single node: the static backend (MASTER_ADDR/PORT from --master_addr and
 * --master_port, or the static --rdzv_endpoint) and --standalone (a free
 * port picked once, kept across restarts). Rounds are numbered 1, 2, ... */
struct agent_rdzv_static {
    struct agent_rdzv base;
    uv_timer_t timer; /* defers callbacks to the next loop iteration */
    struct agent_round next;
    agent_round_cb join_cb;
    agent_rdzv_status_cb barrier_cb;
    agent_rdzv_close_cb close_cb;
    bool failures_reported; /* in the current round */
};

/* Fills s for one node; round fields other than the round number are given
 * by the caller in proto (node_rank 0, nnodes 1, world_size = nproc, ...). */
int agent_rdzv_static_init(struct agent_rdzv_static *s, uv_loop_t *loop,
                           const struct agent_round *proto);

/* The c10d-style rendezvous (agent/rdzv_c10d.c). */
struct agent_rdzv_c10d_options {
    const char *host; /* the endpoint: name, IPv4, IPv6 without brackets */
    int port;
    const char *run_id;
    int min_nodes, max_nodes;
    int nproc;
    const char *local_addr;       /* --local_addr or NULL */
    const struct rdzv_conf *conf; /* --rdzv_conf; NULL: torchrun's defaults */
    int status_port;              /* this agent's status port, told to the server; 0: none */
    /* --standalone: host on 127.0.0.1 with a free port (host/port unused). */
    bool standalone;
    /* The static backend with several nodes: node_rank is fixed, node 0
     * hosts, and MASTER_ADDR/PORT are the static ones; host:port is where
     * the agents meet (static_port + 1, see docs/multi-node.md). */
    bool fixed;
    int node_rank;
    const char *master_addr;
    int master_port;
    /* Optional: asked once, only when this node hosts the server, for the
     * job-wide statistics its status port shows (rendezvous/jobs.h; owned
     * by the caller, outliving the server); NULL from it: none kept. */
    struct rdzv_jobs *(*host_jobs)(void *arg);
    void *host_jobs_arg;
};

/* Starts it on loop: hosts the server when this node should (see
 * docs/multi-node.md), then starts connecting. 0, or a negative code with a
 * one-line reason in err (nothing is left on the loop then). */
int agent_rdzv_c10d_new(uv_loop_t *loop, const struct agent_rdzv_c10d_options *o,
                        struct agent_rdzv **out, char *err, size_t errlen);

/* The etcd-v3 rendezvous (agent/rdzv_etcd.c, docs/etcd.md): the round
 * state in one etcd key, liveness through leases, pushes through a watch. */
struct agent_rdzv_etcd_options {
    const char *endpoints; /* --rdzv_endpoint: "h1:2379,h2:2379" */
    const char *backend;   /* the name given: etcd-v3, or etcd / etcd-v2 (a notice) */
    const char *run_id;
    int min_nodes, max_nodes;
    int nproc;
    const char *local_addr;       /* --local_addr or NULL */
    const struct rdzv_conf *conf; /* timeouts, protocol, TLS files, key_prefix */
    const char *node_id;          /* NULL: "<fqdn>_<pid>" */
};
int agent_rdzv_etcd_new(uv_loop_t *loop, const struct agent_rdzv_etcd_options *o,
                        struct agent_rdzv **out, char *err, size_t errlen);

#endif
