/*
 * policy.h: the agent's decisions as a pure function.
 *
 *     policy_step(policy, event, now) -> state change + a list of actions
 *
 * No processes, sockets, clocks or logging here: the loop (agent.c) turns
 * kernel and rendezvous notifications into events and carries out the
 * actions. The rules are torchrun's SimpleElasticAgent (reference section 3):
 *
 *   - Any worker exiting non-zero fails the whole group: every worker's
 *     process group gets SIGTERM, then SIGKILL at the shutdown deadline.
 *     Once every group is empty the group restarts (a new rendezvous round)
 *     while restarts remain, TORCHELASTIC_RESTART_COUNT counting them;
 *     otherwise the agent reports the failures and exits 1 (3 when the
 *     last failure was a worker the watchdog found hung; 5 when the
 *     rendezvous was lost or closed: common/exitcodes.h).
 *   - All workers exiting 0 is success: exit barrier, then exit 0. Processes
 *     a worker left behind in its group are stopped first.
 *   - A handled signal is forwarded to every group, then the same stop
 *     sequence; the agent exits 128+signal. A second signal kills at once.
 *   - A membership change pushed by the rendezvous restarts the group
 *     without spending a restart; a closed rendezvous stops and fails.
 *
 * Multi-node (coordinated) mode, for a rendezvous shared by several nodes:
 *
 *   - The rendezvous counts restarts for the whole job: a worker group
 *     failing on any node makes every node restart in one new round, and
 *     each round says how many counted restarts the job had before it
 *     (POLICY_EV_ROUND's restart_count: TORCHELASTIC_RESTART_COUNT, the same
 *     on every node). A round past --max_restarts ends the run: the failure
 *     table if this node's workers failed, exit 1. So a failure here always
 *     goes back to the rendezvous, which decides whether it counts (it does
 *     not when a lost node had already ended the round: the failure was
 *     likely its consequence).
 *   - A restart pushed while the workers run, while processes a successful
 *     group left behind are stopped, or during the exit barrier makes this
 *     node stop and join the next round (the barrier is abandoned: the job
 *     did not end in that round).
 *   - At the end the agent closes the rendezvous for every node
 *     (POLICY_ACT_EXIT's end_job: the exit barrier completed, or worker
 *     failures used up the restarts); or, when this node's workers
 *     succeeded but the others were not seen to finish (the barrier timed
 *     out, a signal at the barrier), it leaves as finished (the others go
 *     on undisturbed, as torch's); otherwise it only leaves (a signal, a
 *     closed or unreachable rendezvous: the other nodes restart without it
 *     if they can).
 *
 * --restart_scope=worker (scope; rounds of one node only, coordinated or
 * not: a restart of one worker is this node's own, and in coordinated mode
 * the job's count from the rendezvous is taken plus these): the first
 * worker to fail is started again alone (POLICY_ACT_RESTART_WORKER: same
 * RANK and LOCAL_RANK, a new membership generation announced on the
 * agent store, docs/distributed.md "Recovering in place"); the others run
 * on and re-form their group with it. It counts against --max_restarts.
 * The group falls back to torchrun's whole-group restart when:
 *   - another worker fails while a replacement is pending: within
 *     settle_ms of the replacement's start, or before the replacement
 *     reports its first step (the group has not re-formed yet);
 *   - the replacement itself fails before it reports a step (it could not
 *     re-form: cddp-train exits 75 then);
 *   - it was a hung worker (the watchdog) or the restarts are used up
 *     (then the run ends as under group).
 * An unmodified PyTorch script, whose ranks all die when one dies, thus
 * behaves under worker as under group.
 *
 * --restart_scope=worker on several nodes (a round of more than one):
 * when the rendezvous numbers generations (rdzv_generations: cddp's
 * server, hosted or not), a worker's failure is asked of it first
 * (POLICY_ACT_REQUEST_GENERATION; the failed worker counts as failed
 * meanwhile). Granted (POLICY_EV_GENERATION with this local rank), the
 * worker restarts alone as above, in the job-wide generation; refused
 * (another node's replacement within its settle window, a round that
 * ended), the group restarts as under group scope. A generation granted
 * to another node moves this node's generation (the settle window starts).
 * Either way a grant is one of the job's counted restarts: the event's
 * restart_count, plus local_restarts, sets remaining_restarts.
 * Without rdzv_generations (etcd-v3), a worker's failure restarts the
 * group as under group scope. A lost
 * node (a restart pushed that is not counted) does not stop this node's
 * workers: the agent joins the next round with them running
 * (POLICY_ACT_JOIN with keep). A round that goes on in place with this
 * node's assignment unchanged (POLICY_EV_ROUND's kept) keeps them
 * (POLICY_ACT_NEW_GENERATION); any other round stops them and starts the
 * new group, as does a worker that fails meanwhile (not reported: the
 * round had already ended) or a lost rendezvous.
 */
#ifndef CDDP_AGENT_POLICY_H
#define CDDP_AGENT_POLICY_H

#include <stdbool.h>
#include <stdint.h>

enum agent_state {
    AGENT_INIT,
    AGENT_RENDEZVOUS,   /* waiting for a round */
    AGENT_RUNNING,      /* the worker group runs (torchrun: HEALTHY) */
    AGENT_STOPPING,     /* stop signal sent; waiting for every group to empty */
    AGENT_KILLING,      /* the deadline passed: SIGKILL sent */
    AGENT_EXIT_BARRIER, /* all workers succeeded; waiting for the other nodes */
    AGENT_SUCCEEDED,
    AGENT_FAILED,
    AGENT_TERMINATED, /* stopped by a signal */
};

enum worker_state {
    WORKER_INIT,
    WORKER_RUNNING,
    WORKER_SUCCEEDED, /* exited 0 */
    WORKER_FAILED,    /* exited non-zero on its own */
    WORKER_STOPPED,   /* exited non-zero after the agent began stopping the group */
};

enum stop_reason {
    STOP_NONE,
    STOP_FAILURE,     /* a worker failed */
    STOP_SUCCESS,     /* all workers exited 0; processes they left behind are stopped */
    STOP_SIGNAL,      /* the agent got a handled signal */
    STOP_MEMBERSHIP,  /* the rendezvous asked for a new round */
    STOP_RDZV_CLOSED, /* the rendezvous closed or was lost */
};

enum policy_event_type {
    POLICY_EV_START,
    POLICY_EV_ROUND,        /* the rendezvous gave a round (restart_count) */
    POLICY_EV_ROUND_FAILED, /* the rendezvous could not give one (graceful) */
    POLICY_EV_WORKER_EXIT,  /* local_rank, exitcode */
    POLICY_EV_GROUP_EMPTY,  /* local_rank: no process is left in its process group */
    POLICY_EV_DEADLINE,     /* the deadline set by POLICY_ACT_SET_DEADLINE passed */
    POLICY_EV_SIGNAL,       /* sig */
    POLICY_EV_RDZV_RESTART, /* membership changed (counted: a worker group failed) */
    POLICY_EV_RDZV_CLOSED,
    POLICY_EV_BARRIER_DONE, /* exitcode: 0, or the barrier's error (timed out, ...) */
    POLICY_EV_WATCHDOG,     /* local_rank is hung (agent/watchdog.h): a failure of the group */
    POLICY_EV_PROGRESS,     /* local_rank reported step (no-progress stop, re-formed group) */
    /* worker scope, several nodes: the rendezvous answered a replace
     * (POLICY_ACT_REQUEST_GENERATION) or granted another node's: the round
     * goes on in generation (local_rank: this node's worker it restarts,
     * -1: another node's; restart_count: the job's counted restarts, this
     * one included), or, generation 0, this node's was refused */
    POLICY_EV_GENERATION,
    /* worker scope: the agent killed local_rank (generation: the one it
     * was named in) because a peer's collective timed out waiting for it;
     * its exit is a failure, replaced in place together with every other
     * worker killed for the same generation (one node) */
    POLICY_EV_WORKER_BLAMED,
};

struct policy_event {
    enum policy_event_type type;
    int local_rank;
    /* WORKER_EXIT: torchrun's convention, the exit status or -N for death
     * by signal N. RDZV_CLOSED and ROUND_FAILED: 1 when the rendezvous
     * ended the run for a reason of the job's (another node's worker groups
     * used up the restarts; a join refused for its token or configuration):
     * the run ends as a failure, 1, not as the infrastructure's 5; else 0. */
    int exitcode;
    bool group_empty; /* WORKER_EXIT: nothing else was left in its group */
    int sig;
    /* ROUND, coordinated mode: counted restarts the job had before this
     * round (ignored otherwise: one node counts its own). */
    int64_t restart_count;
    int nnodes; /* ROUND: the nodes in it (0: not said, one) */
    /* ROUND under worker scope: the round goes on with the last round's
     * workers in place (agent_round's generation) and this node's
     * assignment is unchanged: its running workers carry on (kept);
     * generation: the membership generation this node's workers are in
     * (a node taking a lost one's place starts its workers in it); 0: a
     * new group. */
    bool kept;
    int64_t generation;
    bool counted; /* RDZV_RESTART: a worker group failed somewhere */
    /* ROUND_FAILED: the job ended while this node waited for a place (the
     * round was full): nothing ran here, exit 0 (torch's graceful exit). */
    bool graceful;
    int64_t step; /* PROGRESS */
};

enum policy_action_type {
    POLICY_ACT_JOIN,          /* ask the rendezvous for the next round */
    POLICY_ACT_START_WORKERS, /* start every worker; attempt = policy_restart_count() */
    POLICY_ACT_SIGNAL_GROUPS, /* sig to every worker's process group that still has processes */
    POLICY_ACT_SET_DEADLINE,  /* deliver POLICY_EV_DEADLINE at deadline_ms */
    POLICY_ACT_CLEAR_DEADLINE,
    POLICY_ACT_REPORT_FAILURE, /* tell the rendezvous this node's group failed */
    POLICY_ACT_EXIT_BARRIER,
    POLICY_ACT_FAILURE_REPORT, /* print the failure table; write the agent's error file */
    POLICY_ACT_EXIT,           /* stop the loop and exit with exit_code */
    /* --restart_scope=worker: kill what is left of local_rank's process
     * group, announce generation (replacing local_rank) on the agent
     * store, start local_rank alone again (attempt = policy_restart_count) */
    POLICY_ACT_RESTART_WORKER, /* (several: every worker whose replaced_gen is generation) */
    /* --restart_scope=worker, several nodes: the new round took another
     * node in a lost one's place and this node's workers carry on; the
     * store's host announces generation (the round's replaced ranks) */
    POLICY_ACT_NEW_GENERATION,
    /* --restart_scope=worker, several nodes: local_rank failed; ask the
     * rendezvous for the group's next generation (POLICY_EV_GENERATION
     * answers: RESTART_WORKER when granted, a group restart when not) */
    POLICY_ACT_REQUEST_GENERATION,
};

enum restart_scope {
    RESTART_SCOPE_GROUP = 0, /* torchrun's: every worker, on any failure */
    RESTART_SCOPE_WORKER,    /* only the failed worker (see above) */
};

struct policy_action {
    enum policy_action_type type;
    int sig;
    uint64_t deadline_ms;
    int exit_code;
    enum stop_reason reason; /* SIGNAL_GROUPS, JOIN, EXIT: why */
    int attempts_left;       /* JOIN after a failure: restarts left after this one
                                (coordinated: expected; < 0 when none are left) */
    bool end_job;            /* EXIT: close the rendezvous for every node (the job is
                                over) rather than only leave it */
    bool finished;           /* EXIT, !end_job: this node's workers succeeded; leave
                                without disturbing the others */
    int local_rank;          /* RESTART_WORKER */
    int64_t generation;      /* RESTART_WORKER, NEW_GENERATION: the new membership generation */
    bool keep;               /* JOIN: the workers run on meanwhile (keep the agent store) */
};

struct policy_worker {
    enum worker_state state;
    int exitcode;
    bool group_alive;
    bool hung;            /* the watchdog found it hung: it counts as failed when it exits */
    bool replacing;       /* restarted alone and has not reported a step yet (worker scope) */
    int restarts;         /* times it was restarted alone (worker scope) */
    bool blamed;          /* killed by the agent as hung in the current generation (worker scope) */
    int64_t replaced_gen; /* the generation of this group that last replaced it; 0: none */
    bool asked;           /* failed; its replace is asked of the rendezvous (several nodes) */
};

struct agent_policy {
    enum agent_state state;
    int nworkers;
    struct policy_worker *workers; /* owned */
    int max_restarts;
    int remaining_restarts;
    uint64_t shutdown_timeout_ms;
    enum stop_reason stop_reason;
    int term_signal;      /* the agent's own signal, for STOP_SIGNAL */
    uint64_t deadline_ms; /* 0: none set */
    int exit_code;        /* valid in SUCCEEDED, FAILED, TERMINATED */
    /* Multi-node: restarts are counted by the rendezvous (see above). Set
     * after policy_init, before the first event. */
    bool coordinated;
    bool group_succeeded; /* every worker of the current round exited 0 */
    bool barrier_failed;  /* the exit barrier ended without every node */
    /* The no-progress stop (--max_no_progress_restarts; 0: off). Set after
     * policy_init. When that many restarts in a row end in a failure before
     * any worker reports a step beyond the highest one seen before they
     * started, the run ends (FAILURE_REPORT, EXIT 4, no_progress_stop set)
     * instead of restarting again. The first attempt is not a restart and
     * never counts; a job that reports no steps makes no progress. */
    int max_no_progress;
    int no_progress_streak;  /* restarts in a row that ended without progress */
    int64_t best_step;       /* the highest step reported; -1: none */
    int64_t attempt_base;    /* best_step when the current attempt started */
    bool attempt_progressed; /* the current attempt reported a step > attempt_base */
    bool attempt_is_restart; /* the current attempt followed a failure or a new round */
    unsigned attempts;       /* attempts started */
    bool no_progress_stop;   /* the run ended for it */
    bool rdzv_job_fault;     /* the last RDZV_CLOSED or ROUND_FAILED was the job's */
    /* --restart_scope (set after policy_init; worker scope is only taken
     * in a round of one node). */
    enum restart_scope scope;
    bool one_node;            /* the current round has one node */
    uint64_t settle_ms;       /* POLICY_DEFAULT_SETTLE_MS */
    uint64_t last_replace_ms; /* when the last worker was restarted alone; 0: never */
    int64_t generation;       /* membership generation of this attempt's group; 0 at start */
    int worker_restarts;      /* generations that restarted workers here alone (worker scope) */
    /* ... of them, those in rounds of one node: the rendezvous never heard
     * of these (a replace it granted is one of the job's counted restarts) */
    int local_restarts;
    int group_restarts;  /* failure restarts of the whole group */
    int scope_fallbacks; /* worker-scope failures that became group restarts */
    /* Worker scope, several nodes: a node was lost and this one joined the
     * next round with its workers running (rejoining), to keep them if
     * the round goes on in place; a round that does not came while they
     * were being stopped (round_ready, pending: its event). */
    bool rejoining;
    bool round_ready;
    struct policy_event pending;
    int node_replacements; /* rounds that took a node in a lost one's place, workers kept */
    /* Worker scope, several nodes: the rendezvous numbers the group's
     * generations (set after policy_init; false: a worker's failure
     * restarts the group), and the local rank whose replace it is asked
     * for (-1: none). */
    bool rdzv_generations;
    int asking;
};

/* A second failure this soon after a worker was replaced restarts the group. */
#define POLICY_DEFAULT_SETTLE_MS 1000

#define POLICY_MAX_ACTIONS 8

/* 0 or -ENOMEM. */
int policy_init(struct agent_policy *p, int nworkers, int max_restarts,
                uint64_t shutdown_timeout_ms);
void policy_free(struct agent_policy *p);

/* Applies ev at time now_ms (monotonic milliseconds); writes up to
 * POLICY_MAX_ACTIONS actions to out, to be carried out in order, and returns
 * how many. Events that do not apply in the current state are ignored. */
int policy_step(struct agent_policy *p, const struct policy_event *ev, uint64_t now_ms,
                struct policy_action *out);

/* TORCHELASTIC_RESTART_COUNT: failure restarts so far (coordinated: the
 * job's, from the last round; above max_restarts only when the run ends
 * for it). */
static inline int policy_restart_count(const struct agent_policy *p)
{
    return p->max_restarts - p->remaining_restarts;
}

/* While the group is stopping (STOPPING, KILLING): will the policy start
 * it again when it has stopped (a failure with restarts left, not the
 * restart too many of --max_no_progress_restarts; a new round the
 * rendezvous asked for), or end the run? False in any other state. The one
 * answer /status's "restarting" and the goodput's restart phase both use. */
bool policy_will_restart(const struct agent_policy *p);

static inline bool policy_finished(const struct agent_policy *p)
{
    return p->state == AGENT_SUCCEEDED || p->state == AGENT_FAILED || p->state == AGENT_TERMINATED;
}

const char *agent_state_name(enum agent_state s);
const char *worker_state_name(enum worker_state s);
const char *stop_reason_name(enum stop_reason r);
const char *restart_scope_name(enum restart_scope s);

#endif
