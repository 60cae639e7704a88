/*
 * rdzv_etcd_int.h: the etcd-v3 backend's own state, shared by its two
 * files and by no one else (the agent sees agent/rdzv.h only):
 *
 *   rdzv_etcd.c        the backend behind rdzv.h: setup (lease, node key,
 *                      first read, watch), keep-alive, the watch, what a
 *                      change of the state means to this node, the agent's
 *                      calls, closing
 *   rdzv_etcd_write.c  changing the run's state: the op queue (one
 *                      mutation in flight, a transaction compared on the
 *                      state's mod_revision, applied again on a conflict)
 *                      and leadership (the election, the leader's fold of
 *                      the join requests)
 *
 * Everything runs on the agent's loop thread.
 */
#ifndef CDDP_AGENT_RDZV_ETCD_INT_H
#define CDDP_AGENT_RDZV_ETCD_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "agent/rdzv_backend.h"
#include "rendezvous/conf.h"
#include "rendezvous/etcd.h"
#include "rendezvous/etcd_round.h"
#include "rendezvous/etcd_wire.h"

#define RETRY_MS 500
#define CLOSE_TIMEOUT_MS 5000
#define MAX_OPS 256
#define DEFAULT_PREFIX "/cddp/rdzv"

enum op_kind { OP_JOIN = 1, OP_LOSE, OP_LEAVE, OP_FAILURE, OP_CLOSE, OP_TICK, OP_FOLD, OP_REPLACE };

/* The most join requests one fold writes (etcd's default --max-txn-ops is
 * 128: one put and a delete each). */
#define FOLD_MAX 120

/* A join request the leader has seen (<run>/joins/<id>, at mod_revision rev). */
struct request {
    char id[PROTO_MAX_ID + 1];
    int64_t rev;
    struct etcd_request req;
};

struct op {
    enum op_kind kind;
    char id[PROTO_MAX_ID + 1];          /* LOSE */
    uint64_t round;                     /* FAILURE, REPLACE */
    int rank;                           /* REPLACE */
    char ranks[PROTO_MAX_REPLACED + 1]; /* REPLACE: several together ("2,3"); "": rank alone */
    bool finished;                      /* LEAVE */
};

struct ed {
    struct agent_rdzv base;
    struct rdzv_calls calls; /* the join, the barrier, close (agent/rdzv_backend.h) */
    uv_loop_t *loop;
    struct etcd_client *cl;
    struct rdzv_conf conf;
    struct etcd_round_conf rconf;
    char run_id[PROTO_MAX_ID + 1];
    char node_id[PROTO_MAX_ID + 1];
    char addr[256];
    int nproc, min_nodes, max_nodes;
    char prefix[600]; /* <key_prefix>/<run_id>/ */
    char state_key[640], nodes_key[640], node_key[900], barrier_key[700];
    char joins_key[640], join_key[900], writer_key[700], news_key[640], round_key[700];
    char blame_key[700]; /* news/blame/: <round>/<rank> = "<generation> <node>" */

    /* leadership: the agent whose create of writer_key (on its lease)
     * went through folds the others' join requests into the state */
    bool leader;
    bool electing;
    bool fold_prune;      /* just became leader: drop members without a lease first */
    struct request *reqs; /* the pending join requests (leader only) */
    size_t nreqs, reqcap;
    struct request folding[FOLD_MAX]; /* the ones the fold in flight deletes */
    size_t nfolding;
    uv_timer_t fold_timer; /* the batch's debounce */
    bool join_put;         /* this node's join request is written */
    bool writer_seen;      /* another agent holds writer_key */

    /* setup: lease, node key, first read of the state, watch */
    bool ready;
    bool setting_up;
    uint64_t started_at; /* mono ms */
    int64_t lease;
    int64_t ttl_s;
    uv_timer_t ka_timer;
    uint64_t last_ka_ok; /* mono ms of the last keep-alive answered (or setup) */
    bool ka_in_flight;
    struct etcd_watch *watch;
    int64_t watch_rev;      /* the last revision the watch delivered */
    uv_timer_t retry_timer; /* setup and watch retries */

    /* the state as last seen */
    struct etcd_round st;
    int64_t st_rev; /* its mod_revision; 0: the key does not exist */
    bool st_valid;

    /* ops */
    struct op ops[MAX_OPS];
    size_t nops;
    bool op_in_flight;
    uv_timer_t op_timer; /* backoff of a failed op */
    int64_t close_lease;
    struct etcd_round pending; /* the value being written */
    unsigned conflicts;        /* in a row, for the jittered backoff */
    bool alive_listed;         /* the JOIN at the head has listed the live nodes */
    uint64_t rnd;

    /* the join */
    int join_port;
    bool join_applied;
    uv_timer_t join_timer; /* join_timeout; also defers a failure */
    bool warned_waiting;
    uint64_t round; /* the last round handed to the agent */
    int round_nnodes;
    int rank_offset;       /* this node's first global rank in e->round */
    uint64_t restart_told; /* the round on_restart was called for */
    uint64_t rejoined_for; /* the forming round a missed round's rejoin was sent for */
    int64_t gen_seen;      /* the generation of e->round the agent has been told of */
    bool replace_refused;  /* the REPLACE at the head was refused: why */
    char refused[256];
    bool closed_told;
    uv_timer_t lc_timer; /* the state's last call */

    /* the exit barrier */
    uint64_t barrier_round;
    bool barrier_counting;
    uv_timer_t barrier_timer;

    uv_timer_t close_timer;
    int timers_open;
    /* The last answer that made no sense (a member that misbehaves), for
     * the messages; "" once a request fails otherwise or one succeeds. */
    char bad[400];
};

/* ---- rdzv_etcd.c ---- */

/* Wall-clock milliseconds: the state's times (last call) are wall times. */
uint64_t ed_wall_ms(void);

/* Why the last request failed, for the messages (never NULL). */
const char *ed_last_error(struct ed *e);

/* The farewell op is written (or given up): this node's lease is revoked
 * and the backend closes. */
void ed_farewell_done(struct ed *e);

/* The state (e->st) changed: what it means to this node (its round, a
 * restart, closed, the barrier). Nothing once closing. */
void ed_state_changed(struct ed *e);

/* Watches the run (the leader) or its news/ (the others) from watch_rev. */
void ed_open_watch(struct ed *e);

/* ---- rdzv_etcd_write.c: the op queue ---- */

/* Queues o (the same news once) and runs the queue. */
void ed_push_op(struct ed *e, const struct op *o);

/* Sends the head op unless one is in flight, backing off or not ready. */
void ed_run_ops(struct ed *e);

/* A state value read from etcd (a CAS conflict, a range, the watch); kv
 * NULL: the key does not exist (deleted_at: the deletion's revision). */
void ed_take_state(struct ed *e, const struct etcd_kv *kv, int64_t deleted_at);

/* ---- rdzv_etcd_write.c: leadership ---- */

/* Creates writer_key on this node's lease if nobody holds it; the one
 * whose create goes through becomes the leader. */
void ed_elect(struct ed *e);

/* Not the leader any more (its lease went, or it is set up again). */
void ed_step_down(struct ed *e);

/* The leader: a join request seen (put) or gone (drop), at revision rev. */
void ed_req_put(struct ed *e, const char *id, int64_t rev, const unsigned char *val, size_t vlen);
void ed_req_drop(struct ed *e, const char *id, int64_t rev);

/* The leader: the next fold, after a debounce that grows with the round. */
void ed_schedule_fold(struct ed *e);

#endif
