/*
 * etcd_round.h: the rendezvous round of one run, kept in one etcd key, as a
 * pure value (no I/O, no clock reads: `now` is an argument, wall-clock ms,
 * since every agent of the run compares it with the same stored deadline).
 *
 * With etcd there is no server to decide: an agent (the run's leader, for
 * joins and lost nodes, folded in batches: etcd_round_fold) reads the
 * run's state key, applies events here, and writes the result back with a
 * transaction compared on the key's mod_revision (torch's
 * DynamicRendezvousHandler over a compare_set backend). A conflict means
 * someone else moved first: read again, apply again. Since every agent
 * applies the same functions to the same value, the decisions live here
 * only, and they follow docs/protocol.md's rounds (rendezvous/state.c is
 * the server's copy of the same rules):
 *
 *  - a round forms from joining nodes and completes at once at max_nodes,
 *    at once after a restart when every member of the last round is back
 *    (and at least min_nodes are there), or last_call_timeout after the
 *    min_nodes-th node joined;
 *  - a node joining a running round goes to the wait list; below max_nodes
 *    the round restarts (not counted) so it can join; at max it waits;
 *  - a member lost (its lease expired: the agent stopped keeping it alive)
 *    or leaving restarts the round (not counted); one that finished leaves
 *    the others undisturbed; a worker failure restarts it, counted;
 *  - closing ends the run for every node; later joins are refused;
 *  - under --restart_scope=worker a member asks to restart one of its
 *    ranks alone (etcd_round_replace): granted, the running round goes on
 *    in place in its next generation, as the server's `replace` does
 *    (docs/multi-node.md, "A worker restarted alone").
 *
 * Node ranks stay where membership allows (survivors in their old rank
 * order, then newcomers by node id); rank offsets are prefix sums of nproc;
 * MASTER_ADDR/PORT are node 0's.
 *
 * etcd_round_apply_* return true when the state changed (then it must be
 * written); false means nothing to write.
 */
#ifndef CDDP_RENDEZVOUS_ETCD_ROUND_H
#define CDDP_RENDEZVOUS_ETCD_ROUND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

#define ETCD_ROUND_MAX_NODES 100000
#define ETCD_ROUND_MAX_ADDR 255
/* A second replace within this long of a grant restarts the group: the
 * server's RDZV_REPLACE_SETTLE_MS. */
#define ETCD_ROUND_SETTLE_MS 1000

enum etcd_phase { ETCD_FORMING = 0, ETCD_RUNNING, ETCD_CLOSED };

enum etcd_member_state {
    ETCD_M_EXPECTED = 0, /* in the last round, not yet back (after a restart) */
    ETCD_M_JOINED,       /* joined the forming round */
    ETCD_M_ACTIVE,       /* in the running round */
    ETCD_M_WAITING,      /* on the wait list of a running round */
};

struct etcd_member {
    char id[PROTO_MAX_ID + 1];
    enum etcd_member_state state;
    int nproc;
    char addr[ETCD_ROUND_MAX_ADDR + 1];
    int port;
    int rank; /* in the running round; in the last one while forming; -1: none */
    /* Its agent numbers generations (a replace may be granted); its join
     * request said so. Written "o": true when it does not, so that the
     * usual state costs nothing more per member; a state an older agent
     * wrote reads as every member able to (docs/etcd.md). */
    bool gens;
    /* Its agent asks to replace several of its ranks together (a replace's
     * ranks); its join request said so ("r"). Not written per member: the
     * state's "rr": true says every member's does, and a state without it
     * (an older agent wrote it) reads as none does. */
    bool ranks;
};

struct etcd_round {
    uint64_t round; /* the round forming or running (1, 2, ...) */
    enum etcd_phase phase;
    int64_t restart_count;
    int min_nodes, max_nodes;
    uint64_t last_call_at; /* forming: complete at this wall time (0: not armed) */
    bool fast;             /* forming after a restart: complete when every EXPECTED is back */
    /* Why the last restart happened (for the agents' log and policy). */
    char reason[32];
    char node[PROTO_MAX_ID + 1];
    bool counted;
    char closed_reason[256];
    /* The running round's generation: 0 when it started, raised by each
     * replace granted in it (a counted restart). The last grant's time
     * (wall ms; 0: none in this round), rank, and the member that
     * restarts that rank. */
    int64_t generation;
    uint64_t generation_at;
    int gen_rank;
    char gen_ranks[PROTO_MAX_REPLACED + 1]; /* several together ("2,3", gen_rank the first); "" */
    char gen_node[PROTO_MAX_ID + 1];
    struct etcd_member *members;
    size_t nmembers, cap;
};

/* The run's timing, from rdzv_conf. */
struct etcd_round_conf {
    uint64_t last_call_timeout_ms;
};

/* An empty run, as the first joiner creates it. */
void etcd_round_init(struct etcd_round *r, int min_nodes, int max_nodes);
void etcd_round_free(struct etcd_round *r);
/* A deep copy into dst (overwritten). 0 or -ENOMEM (dst left empty). */
int etcd_round_copy(struct etcd_round *dst, const struct etcd_round *src);

/* JSON <-> state. decode validates everything (CDDP_EPARSE with err); on
 * failure r is left empty. encode: a malloc'd string or NULL. */
int etcd_round_decode(const char *json, size_t len, struct etcd_round *r, char *err, size_t errlen);
char *etcd_round_encode(const struct etcd_round *r);

/* What a node offers when it joins. */
struct etcd_join {
    const char *id;
    int nproc;
    const char *addr;
    int port;
    bool gens;  /* the agent numbers generations (etcd_round_replace) */
    bool ranks; /* ... and replaces several ranks together (its ranks) */
};

/* Each returns true if r changed. */
bool etcd_round_join(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                     const struct etcd_join *j);
/* A member whose lease is gone (reason "node_lost") or who left
 * ("node_left"; finished: its workers succeeded, the others go on). */
bool etcd_round_lose(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                     const char *id, const char *reason, bool finished);
/* The worker group of member id failed in `round`: counted restart. */
bool etcd_round_failure(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                        const char *id, uint64_t round);
bool etcd_round_close(struct etcd_round *r, const char *reason);
/* Member id asks to restart `rank`, one of its own, alone in `round`:
 * 0, granted (r changed: generation + 1, a counted restart), or
 * CDDP_ESTATE with why (r unchanged): the round is not running or not
 * `round`, id is not active in it, the rank is not id's, a member's agent
 * cannot number generations, or a replace was granted within
 * ETCD_ROUND_SETTLE_MS (then the group restarts). ranks non-NULL: several
 * of id's ranks together, "2,3" (rendezvous/ranks.h), `rank` the first;
 * refused also when it is not such a list or a member's agent cannot. */
int etcd_round_replace(struct etcd_round *r, uint64_t now, const char *id, uint64_t round, int rank,
                       const char *ranks, char *why, size_t whylen);
/* Time passed (last call). */
bool etcd_round_tick(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now);
/* Drops members whose lease is gone (alive(id) false), as lose does. */
bool etcd_round_prune(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                      bool (*alive)(void *arg, const char *id), void *arg);

/* A join as a request the run's leader folds (docs/etcd.md "Scale"): each
 * agent writes its own <run>/joins/<id> key with this value; the leader
 * applies the pending ones in batches, one state write per batch, and
 * deletes them in the same transaction. */
struct etcd_request {
    int nproc;
    char addr[ETCD_ROUND_MAX_ADDR + 1];
    int port;
    bool gens;
    bool ranks;
};
/* j->id is not encoded (it is the key's last part). Malloc'd, or NULL. */
char *etcd_round_request_encode(const struct etcd_join *j);
/* Validates (CDDP_EPARSE with err; out zeroed on failure). */
int etcd_round_request_decode(const char *json, size_t len, struct etcd_request *out, char *err,
                              size_t errlen);
/* Applies n joins in order, as n etcd_round_join calls would; true if r
 * changed. */
bool etcd_round_fold(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                     const struct etcd_join *joins, size_t n);

/* The member id, or NULL. */
const struct etcd_member *etcd_round_find(const struct etcd_round *r, const char *id);

/* This node's place in a running round: 0 and out filled (run_id and
 * master_addr point into r / run_id), CDDP_ENOTFOUND when id is not
 * active in it, CDDP_ESTATE when the round is not running. */
int etcd_round_place(const struct etcd_round *r, const char *run_id, const char *id,
                     struct proto_round *out);

#endif
