/*
 * state.h: the rendezvous state machine (pure: no sockets, no clock reads).
 *
 * One struct rdzv_state holds every job ("run", by run_id) a server serves.
 * The shell (rendezvous/server.c, or a test, or a benchmark) turns what
 * happens into calls: a connection says hello, joins, beats, leaves, fails,
 * closes, uses the store, or drops; time passes (rdzv_state_tick). `now` is
 * always an argument, in milliseconds of the caller's monotonic clock. Each
 * call replaces the list of actions (rdzv_state_actions) the shell must
 * carry out: messages to peers and connections to drop. Pointers inside
 * actions stay valid until the next call.
 *
 * Semantics are torch's dynamic rendezvous (DynamicRendezvousHandler), with
 * pushes instead of polling; docs/protocol.md has the diagram:
 *  - a round forms from joining nodes; it completes at once when max_nodes
 *    joined, when every node expected back after a restart has rejoined
 *    (and at least min_nodes are there), or last_call_timeout after the
 *    min_nodes-th node joined;
 *  - a node that joins a running round goes to the wait list; if the round
 *    is below max_nodes every member is told to restart (not counted) and
 *    the waiting node joins the next round; at max it waits (torch's
 *    redundancy list) until a place frees up;
 *  - a member that is lost (its connection drops, or it misses
 *    keep_alive_max_attempt heartbeats) or leaves makes every other member
 *    restart at once (not counted) -- torch waits for an NCCL timeout;
 *  - a member reporting a worker failure makes every member restart, counted
 *    against --max_restarts;
 *  - a node whose round does not complete within its join_timeout gets
 *    ETIMEOUT; closing a run tells every node and refuses later joins;
 *  - node ranks are stable across rounds where membership allows (a
 *    survivor keeps its rank if it is still below the new node count; holes
 *    are filled by the others in rank order, then by newcomers sorted by
 *    node id, as torch sorts); rank offsets are prefix sums of each node's
 *    nproc; MASTER_ADDR/PORT are node 0's.
 */
#ifndef CDDP_RENDEZVOUS_STATE_H
#define CDDP_RENDEZVOUS_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "proto/msg.h"
#include "store/kvstore.h"

#define RDZV_NEVER UINT64_MAX

struct rdzv_run;
struct rdzv_node;

/* One per connection, embedded in the shell's connection struct and
 * initialised with rdzv_peer_init. The fields marked private belong to the
 * state machine. */
struct rdzv_peer {
    struct rdzv_run *run;             /* private */
    struct rdzv_node *node;           /* private */
    struct kvstore_owner store_owner; /* private */
    void *data;                       /* the shell's */
    /* The peer's IP address as the server sees it ("" if none), and
     * whether it is a loopback address: MASTER_ADDR comes from these. */
    char addr[64];
    bool loopback;
    /* The shell's: the peer asked for its heartbeats to be answered (hello's
     * heartbeat_ack); each is answered with RDZV_ACT_HEARTBEAT. */
    bool heartbeat_ack;
};

/* addr may be NULL. */
void rdzv_peer_init(struct rdzv_peer *p, const char *addr, bool loopback, void *data);
/* The run and the node a peer is bound to (NULL: none yet), e.g. for the
 * shell's job-wide statistics (rendezvous/jobstats.h); valid until the next
 * call that changes the state. */
const char *rdzv_peer_run_id(const struct rdzv_peer *p);
const char *rdzv_peer_node_id(const struct rdzv_peer *p);

enum rdzv_action_kind {
    RDZV_ACT_JOINED = 1, /* a join was taken: participant of `round`, or waiting */
    RDZV_ACT_ROUND,      /* the round completed: this node's place in it */
    RDZV_ACT_RESTART,    /* stop the workers and join again (round is the new one) */
    RDZV_ACT_CLOSED,     /* the run is closed */
    RDZV_ACT_ERROR,      /* an error for the peer; drop: close its connection after it */
    RDZV_ACT_RESULT,     /* the result of a store request (or of a resume) */
    RDZV_ACT_HEARTBEAT,  /* a heartbeat answered: the run's wait list length */
    RDZV_ACT_STRAGGLER,  /* for the log: a node became, or stopped being, a slow node */
    RDZV_ACT_GENERATION, /* a replace answered: granted (to every member) or refused */
    RDZV_ACT_BLAME,      /* a blame passed on to the member that runs the rank */
};

struct rdzv_action {
    enum rdzv_action_kind kind;
    struct rdzv_peer *peer;
    union {
        struct {
            uint64_t round;
            bool waiting;
        } joined;
        struct proto_round round;
        struct {
            uint64_t round;
            const char *reason;
            const char *node_id;
            bool counted;
            int64_t restart_count; /* the run's counted restarts, this one included */
        } restart;
        struct {
            const char *reason;
        } closed;
        struct {
            int code;
            const char *message;
            bool drop;
        } error;
        struct {
            uint64_t id;
            int code;
            const char *message;
            bool has_value;
            const void *value;
            size_t vlen;
            bool has_number;
            int64_t number;
        } result;
        struct {
            size_t waiting;
        } heartbeat;
        struct {
            const char *run_id;
            const char *node_id;
            bool slow;       /* true: named now; false: no longer */
            double time_s;   /* its median seconds a step (compute, or step time) */
            double median_s; /* the job's median of the nodes' */
            double ratio;    /* time_s / median_s */
            bool compute;    /* the times are compute times (else step times) */
            int max_rank;    /* its slowest rank */
        } straggler;
        struct {
            uint64_t round;
            int64_t generation; /* 0: refused */
            const char *replaced;
            const char *node_id;
            const char *refused;
            int64_t restart_count; /* granted: the run's counted restarts, this one included */
        } generation;
        struct {
            uint64_t round;
            int rank;
            int64_t generation;
            const char *node_id; /* who named it */
        } blame;
    };
};

struct rdzv_state_options {
    /* A plain key-value store: hello binds every peer to one store, which
     * lives as long as the state; joins are refused. This is the trainer's
     * bootstrap store. */
    bool store_only;
    struct kvstore_limits store_limits;
    uint64_t seed[2]; /* hash keys; pick at random */
    size_t max_runs;  /* 0: 10,000 */
};

struct rdzv_state *rdzv_state_new(const struct rdzv_state_options *o);
/* Frees everything. Peers must have been disconnected (or be discarded). */
void rdzv_state_free(struct rdzv_state *st);

/* Binds peer to run_id's run (created if new). 0, CDDP_ESTATE (hello twice:
 * also an ERROR action with drop) or CDDP_ETOOBIG (too many runs), with a
 * reason in err. */
int rdzv_state_hello(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                     const char *run_id, char *err, size_t errlen);

/* The join message of the protocol (m->type == PROTO_JOIN). A run that has
 * had no round yet takes its round number and counted restarts from the
 * joins (their round + 1 and restart_count, the largest), so a restarted
 * server goes on where the job was; and completes its first round as soon
 * as as many nodes joined as the largest last_nnodes (when >= min_nodes),
 * instead of waiting out last call for nodes that were there before. */
void rdzv_state_join(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                     const struct proto_msg *m);
/* Any frame from a peer also counts as a heartbeat. A heartbeat message
 * from a peer with heartbeat_ack set is answered (RDZV_ACT_HEARTBEAT) with
 * the length of its run's wait list. */
void rdzv_state_heartbeat(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer);
/* A heartbeat message, with the agent's summary of its ranks' step times
 * (perf; NULL when it had none: an older agent, or nothing measured yet),
 * which replaces the node's last. At most once a second per run, the active
 * members' summaries are judged (common/straggler.h): a node whose median
 * step (compute when every node reports compute, else step time) is more
 * than the largest factor the agents sent times the median of the nodes'
 * medians is named slow, each change an RDZV_ACT_STRAGGLER. A node's
 * summary and name are forgotten when it joins a new round. */
void rdzv_state_heartbeat_perf(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                               const struct proto_perf *perf);
/* A node whose connection broke asks to go on, on this new connection, in
 * the round it runs in (m->type == PROTO_RESUME; m->id the request id). If
 * the run is running that round and the node is still an active member of
 * it, the node moves to this peer (its old connection gets EEXISTS and is
 * dropped) and nothing else changes: its workers keep running.
 *
 * A server that does not know the node (a restarted one) rebuilds the
 * round from such resumes when they carry the node's join and round
 * (m->resume.rebuild) and the run is new here: the first one re-creates
 * the round as it was (RUNNING, its number, node count, world size, master,
 * restart count) and arms the run's resume_timeout (its rdzv_conf; default
 * the keep-alive window); each member takes its old node rank and is
 * answered OK at once. Once every rank is back the round simply runs on;
 * if the time passes first, the members that are back restart (reason
 * "node_missing", not counted) and form a new round without the missing
 * ones. Meanwhile a node that ran in the round (or a later one) and joins
 * instead ends the rebuild with a restart ("node_rejoined"); other joiners
 * wait for the outcome (and then join as they would have).
 *
 * Otherwise (the node was removed, the run moved on, the rebuilt round
 * differs from the node's) nothing changes and the result is CDDP_ESTATE,
 * or CDDP_ECLOSED for a closed run: the node must join again. */
void rdzv_state_resume(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                       const struct proto_msg *m);
/* A graceful leave: like a lost node, but the connection stays. finished:
 * the node's workers succeeded, so the others go on without it (no restart;
 * torch's exit barrier timing out on one node). */
void rdzv_state_leave(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const char *reason, bool finished);
/* The node's worker group failed in `round`: every member restarts, counted.
 * Reports about an older round, or from a non-member, are ignored. */
void rdzv_state_failure(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer, uint64_t round,
                        const char *reason);
/* --restart_scope=worker: the node restarts the worker of global rank
 * `rank` alone in `round` (m->type == PROTO_REPLACE) and asks for the
 * group's next generation. Granted when the run runs that round, the node
 * is an active member, the rank is one of its own, and no other generation
 * was granted in this round within RDZV_REPLACE_SETTLE_MS (two failures
 * that close together: the group restarts, as an agent does for two of its
 * own): the run's generation (the one node replacements in place count
 * too, state.c's in_place) goes up by one and every active member gets
 * RDZV_ACT_GENERATION with it. Otherwise the asker alone gets it with
 * generation 0 and why, and fails its group (rdzv_state_failure). */
#define RDZV_REPLACE_SETTLE_MS 1000
void rdzv_state_replace(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                        const struct proto_msg *m);
/* --restart_scope=worker: a worker of the node named global rank
 * m->blame.rank as never reaching a collective (m->type == PROTO_BLAME).
 * Passed on (RDZV_ACT_BLAME) to the active member whose ranks hold it, when
 * the run runs m->blame.round, the sender is an active member and the rank
 * is another member's; otherwise dropped. */
void rdzv_state_blame(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const struct proto_msg *m);
/* Closes the peer's run: CLOSED to every node, later joins refused. */
void rdzv_state_close(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const char *reason);
/* A store request (set, get, wait, add, compare_set). */
void rdzv_state_store(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const struct proto_msg *m);
/* The connection is gone. The peer is unbound and may be freed afterwards. */
void rdzv_state_disconnect(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer);
/* The connection is gone, but the server is stopping for a successor
 * (rdzv_server_stop_keep_runs): the peer is unbound and nothing else
 * happens (no restart, no action). Only rdzv_state_free may follow. */
void rdzv_state_forget(struct rdzv_state *st, struct rdzv_peer *peer);
/* Time passed: heartbeats, last call, join timeouts, store waits, GC. */
void rdzv_state_tick(struct rdzv_state *st, uint64_t now);
/* When rdzv_state_tick next has something to do (RDZV_NEVER: nothing). */
uint64_t rdzv_state_next_deadline(const struct rdzv_state *st);
/* Closes every run (server shutdown): CLOSED to every node. */
void rdzv_state_close_all(struct rdzv_state *st, uint64_t now, const char *reason);

/* The actions of the last call. */
size_t rdzv_state_actions(const struct rdzv_state *st, const struct rdzv_action **out);

/* A snapshot for the status request: {"runs":[...],"nruns":N}. Caller frees. */
cJSON *rdzv_state_status(const struct rdzv_state *st, uint64_t now);

/* For tests and benchmarks: one run's counters. CDDP_ENOTFOUND if no such run. */
enum rdzv_phase { RDZV_FORMING = 1, RDZV_RUNNING, RDZV_CLOSED };
struct rdzv_run_stats {
    enum rdzv_phase phase;
    uint64_t round;
    size_t participants, waiting, active, restarting, nodes, peers;
    int min_nodes, max_nodes;
    bool last_call_armed;
    bool rebuilding; /* a restarted server waits for members of the round (resume) */
};
int rdzv_state_run_stats(const struct rdzv_state *st, const char *run_id,
                         struct rdzv_run_stats *out);
size_t rdzv_state_num_runs(const struct rdzv_state *st);

/* For status pages (cddp-rdzv's status port): every run and its nodes, read
 * only. Times are the caller's monotonic ms, as passed to the calls; the
 * strings are valid until the next call that changes the state. */
struct rdzv_run_info {
    const char *run_id;
    const char *phase; /* "forming", "running", "closed" */
    uint64_t round;
    int min_nodes, max_nodes;
    uint64_t round_at; /* when the current round completed; 0: none yet */
    size_t nnodes;
    /* The last straggler judgement: the median of the nodes' median steps
     * (0: fewer than two nodes measured), whether they are compute times,
     * and the factor it used. */
    double step_median_s;
    bool step_compute;
    double straggler_factor;
};
struct rdzv_node_info {
    const char *node_id;
    const char *state; /* "idle", "participant", "waiting", "active", "restarting" */
    int rank;          /* node rank in the current round (active, restarting); else -1 */
    int nproc;
    int status_port;    /* the agent's status port; 0: none or not said */
    const char *addr;   /* the address its connection comes from; NULL: not connected */
    uint64_t joined_at; /* when its last join was taken */
    uint64_t last_seen; /* its last frame */
    /* Its agent's last summary of its ranks' step times (has_perf false:
     * none this round), and whether the last judgement named it slow
     * (since when, and its value over the job's median). */
    bool has_perf;
    struct proto_perf perf;
    bool slow;
    uint64_t slow_since;
    double slow_ratio;
};
/* Calls run_cb for each run (at most max_runs; 0: all), each followed by
 * node_cb for each of its nodes: the round's (active, restarting,
 * participant), then idle ones (connected, in no round), then the wait list
 * last. */
void rdzv_state_visit(const struct rdzv_state *st, size_t max_runs,
                      void (*run_cb)(void *arg, const struct rdzv_run_info *run),
                      void (*node_cb)(void *arg, const struct rdzv_node_info *node), void *arg);

#endif
