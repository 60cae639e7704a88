/*
 * rdzv.h: the rendezvous as the agent sees it.
 *
 * The agent asks for rounds and reports on its worker group; the rendezvous
 * answers asynchronously on the agent's libuv loop and may push events of
 * its own at any time (a membership change, closing). Implementations embed
 * struct agent_rdzv first in their own struct:
 *
 *   - agent/rdzv_static.c: one node (static backend, --standalone);
 *   - the c10d-style client (rendezvous/client.c) is the second one.
 *
 * Rules, as libuv's: a call that returns an error never calls its callback;
 * a call that returns 0 calls it exactly once, never from inside the call
 * itself (always from a later loop iteration). Callbacks run on the loop
 * thread.
 */
#ifndef CDDP_AGENT_RDZV_H
#define CDDP_AGENT_RDZV_H

#include <stdint.h>
#include <uv.h>

/* One rendezvous round: everything the agent needs to start its workers. */
struct agent_round {
    uint64_t round;  /* 1, 2, ...: numbered by the rendezvous */
    int node_rank;   /* GROUP_RANK */
    int nnodes;      /* GROUP_WORLD_SIZE */
    int world_size;  /* WORLD_SIZE: workers over all nodes */
    int rank_offset; /* RANK of this node's local rank 0 (prefix sum of nproc) */
    char master_addr[256];
    int master_port;
    char run_id[128];    /* TORCHELASTIC_RUN_ID */
    int use_agent_store; /* TORCHELASTIC_USE_AGENT_STORE (0: workers' rank 0 serves the store) */
};

/* What this node offers when it joins. */
struct agent_join {
    int local_world_size; /* nproc_per_node */
    const char *role;
    int restart_count;
};

struct agent_rdzv;

/* status 0: round is valid for the duration of the call (copy it).
 * status < 0: no round (timeout, closed, refused); reason says why. */
typedef void (*agent_round_cb)(struct agent_rdzv *r, int status, const struct agent_round *round,
                               const char *reason);
typedef void (*agent_rdzv_status_cb)(struct agent_rdzv *r, int status);
typedef void (*agent_rdzv_close_cb)(struct agent_rdzv *r);

struct agent_rdzv_ops {
    const char *name;
    /* Joins the next round. One join at a time (CDDP_ESTATE otherwise). */
    int (*join)(struct agent_rdzv *r, const struct agent_join *req, agent_round_cb cb);
    /* This node's worker group failed (restart_count so far): peers should
     * restart too. Fire and forget; 0 or an error. */
    int (*report_failure)(struct agent_rdzv *r, int restart_count);
    /* Waits (bounded) until every node's workers have finished. */
    int (*exit_barrier)(struct agent_rdzv *r, uint64_t timeout_ms, agent_rdzv_status_cb cb);
    /* Cancels what is pending (pending callbacks are not called) and releases
     * the implementation's handles; cb runs once they are closed. */
    void (*close)(struct agent_rdzv *r, agent_rdzv_close_cb cb);
};

struct agent_rdzv {
    const struct agent_rdzv_ops *ops;
    uv_loop_t *loop;
    void *data; /* the agent */
    /* Pushed by the rendezvous; set by the agent before the first join. */
    void (*on_restart)(struct agent_rdzv *r, const char *reason);
    void (*on_closed)(struct agent_rdzv *r, int status, const char *reason);
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
};

/* Fills s for one node; round fields other than the round number are given
 * by the caller in proto (node_rank 0, nnodes 1, world_size = nproc, ...). */
int agent_rdzv_static_init(struct agent_rdzv_static *s, uv_loop_t *loop,
                           const struct agent_round *proto);

#endif
