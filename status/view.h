/*
 * view.h: what cddprun and cddp-rdzv show on their status port.
 *
 * A view is plain data the owner fills from its own state (agent/status.c,
 * rendezvous/main.c); a renderer turns it, at a given time, into a
 * status_snapshot: the /status JSON, the /metrics families, and the /readyz
 * checks. Renderers are pure (no clock, no I/O), so the JSON schema and the
 * metric families are unit-tested here and the owners only fill numbers.
 * docs/status.md documents both for users; cddpctl reads the JSON.
 *
 * Conventions: times are wall-clock seconds since the epoch (double), 0 when
 * unknown; durations are seconds; counts that Prometheus sees as counters
 * only grow for the life of the process.
 *
 * Enumerations are append-only (their names are part of the JSON and the
 * metric labels): add new values before the _COUNT entry, never renumber.
 */
#ifndef CDDP_STATUS_VIEW_H
#define CDDP_STATUS_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/progress.h"
#include "status/http.h"

struct status_rdzv_view;

/* The fewest steps a straggler judgement is made over (common/straggler.h's
 * STRAGGLER_MIN_STEPS, shown on /status). */
#define STATUS_STRAGGLER_MIN_STEPS 20

/* ---- the agent (cddprun) --------------------------------------------- */

/* The agent as a whole. Ready (for /readyz) only in RUNNING. */
enum status_agent_state {
    STATUS_AGENT_INIT,         /* parsing, before the first rendezvous */
    STATUS_AGENT_RENDEZVOUS,   /* waiting for a round */
    STATUS_AGENT_RUNNING,      /* the worker group runs in a complete round */
    STATUS_AGENT_RESTARTING,   /* stopping the group to restart it */
    STATUS_AGENT_STOPPING,     /* shutting down (signal, or the end) */
    STATUS_AGENT_SUCCEEDED,    /* every worker exited 0 */
    STATUS_AGENT_FAILED,       /* out of restarts, or rendezvous failed */
    STATUS_AGENT_EXIT_BARRIER, /* local workers succeeded; waiting for the other nodes */
    STATUS_AGENT_TERMINATED,   /* stopped by a signal (exits 128+N) */
    STATUS_AGENT_STATE_COUNT
};

/* One worker process (torchrun's WorkerState, as our agent sees it). */
enum status_worker_state {
    STATUS_WORKER_INIT,      /* not started in this round yet */
    STATUS_WORKER_RUNNING,   /* started, not exited */
    STATUS_WORKER_SUCCEEDED, /* exited 0 */
    STATUS_WORKER_FAILED,    /* exited non-zero or died of a signal */
    STATUS_WORKER_STOPPED,   /* stopped by the agent (restart, shutdown) */
    STATUS_WORKER_STATE_COUNT
};

/* Why the agent restarted its worker group (label of cddp_agent_restarts_total). */
enum status_restart_reason {
    STATUS_RESTART_WORKER_FAILURE,    /* counts against --max_restarts */
    STATUS_RESTART_MEMBERSHIP_CHANGE, /* nodes joined or left; does not count */
    STATUS_RESTART_REASON_COUNT
};

/* How a worker process ended (label of cddp_agent_worker_exits_total). */
enum status_exit_reason {
    STATUS_EXIT_SUCCESS,            /* exit 0 */
    STATUS_EXIT_FAILURE,            /* any other non-zero exit code */
    STATUS_EXIT_SIGNAL,             /* killed by a signal the agent did not send */
    STATUS_EXIT_COLLECTIVE_TIMEOUT, /* exit 75 (common/exitcodes.h) */
    STATUS_EXIT_WATCHDOG,           /* exit 76, or killed by the progress watchdog */
    STATUS_EXIT_STOPPED,            /* stopped by the agent (restart, shutdown) */
    STATUS_EXIT_REASON_COUNT
};

/* Where the agent's wall time went (agent/goodput.h's phases, in its
 * order; label of cddp_time_seconds_total). */
enum status_goodput_phase {
    STATUS_GOODPUT_INIT,
    STATUS_GOODPUT_PRODUCTIVE,
    STATUS_GOODPUT_LOST,
    STATUS_GOODPUT_RESTART,
    STATUS_GOODPUT_RENDEZVOUS,
    STATUS_GOODPUT_STOPPED,
    STATUS_GOODPUT_PHASE_COUNT
};

struct status_goodput_view {
    bool known; /* false: not shown */
    double s[STATUS_GOODPUT_PHASE_COUNT];
    double wall_s; /* their sum */
    double ratio;  /* productive / wall */
    uint64_t lost_steps;
    enum status_goodput_phase phase; /* now */
};

const char *status_goodput_phase_name(enum status_goodput_phase p);

const char *status_agent_state_name(enum status_agent_state s);
const char *status_worker_state_name(enum status_worker_state s);
const char *status_restart_reason_name(enum status_restart_reason r);
const char *status_exit_reason_name(enum status_exit_reason r);

struct status_worker_view {
    int local_rank;
    int rank; /* global; -1 before the first round */
    int pid;  /* 0 when not running */
    enum status_worker_state state;
    int exit_code;                   /* of the last exit; -1 if none or killed by a signal */
    int signal;                      /* signal that killed the last process, 0 if none */
    double started_at;               /* wall time the current (or last) process started */
    double exited_at;                /* wall time the agent saw the last process exit; 0 if none */
    unsigned restarts;               /* times this local rank was started again */
    struct progress_report progress; /* progress.mono_ms == 0: never reported */
    double watchdog_timeout_s;       /* the progress watchdog's timeout now; 0: not watched */
    /* Means over its last 20+ steps (agent/stragglers.c); < 0: not known. */
    double step_time_s;
    double compute_s;
    bool straggler;         /* named a straggler */
    double straggler_since; /* wall time it was named */
    double straggler_ratio; /* its time over the node's median; 0: not known */
};

/* The agent's TCPStore (store/tcpstore.h's stats, as plain numbers). */
struct status_store_view {
    int port;
    uint64_t round; /* the round it serves */
    size_t keys, bytes, connections, waiting;
    uint64_t accepted, queries, refused;
};

struct status_agent_view {
    const char *program; /* "cddprun" */
    const char *version; /* CDDP_VERSION */
    int pid;
    const char *hostname;
    const char *run_id;
    double started_at;

    enum status_agent_state state;
    int node_rank;                /* -1 before the first round */
    int nnodes;                   /* of the current round; 0 before */
    int world_size;               /* 0 before the first round */
    int local_world_size;         /* --nproc_per_node */
    uint64_t round;               /* rendezvous round (version); 0 before the first */
    double last_round_at;         /* wall time the last round completed */
    double last_round_duration_s; /* join -> round; < 0 when none yet */
    unsigned waiting_nodes;       /* nodes waiting for the next round */

    const char *rdzv_backend;  /* "c10d", "static", "etcd", ... */
    const char *rdzv_endpoint; /* "10.0.0.1:29400" */
    const char *master_addr;   /* of the current round; NULL before */
    int master_port;
    bool rdzv_connected;         /* false while reconnecting to the rendezvous server */
    double rdzv_disconnected_at; /* wall time the connection was lost; 0 while connected */
    unsigned rdzv_reconnects;    /* connections re-established after a loss */
    /* The workers' network interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME):
     * its name and address (NULL: none chosen) and where the choice came
     * from ("auto", "user", "off", "none"; NULL: not said). */
    const char *ifname;
    const char *ifname_addr;
    const char *ifname_source;
    /* etcd-v3 only (NULL member: another backend): the member in use,
     * whether the last keep-alive was answered and the watch is open, how
     * often the member in use changed. */
    const char *etcd_member;
    bool etcd_lease_ok, etcd_watch_ok;
    unsigned etcd_failovers;
    /* The rendezvous server this agent hosts (its runs, members, wait list,
     * connections); NULL when it hosts none. */
    const struct status_rdzv_view *rdzv_server;
    /* The TCPStore this agent serves its round's workers (--agent_store,
     * node 0); NULL when it serves none. */
    const struct status_store_view *agent_store;

    unsigned restart_count; /* restarts that counted against max_restarts */
    unsigned max_restarts;
    uint64_t restarts[STATUS_RESTART_REASON_COUNT]; /* all restarts, by reason */
    /* --restart_scope (agent/policy.h): "group" or "worker" (NULL: not
     * shown); failure restarts of one worker and of the whole group;
     * worker-scope failures that fell back to a group restart; the running
     * group's membership generation; seconds from the last worker restarted
     * alone to its first step (< 0: none yet). */
    const char *restart_scope;
    uint64_t restarts_worker, restarts_group, scope_fallbacks;
    uint64_t node_replacements; /* rounds that put a node in a lost one's place in place */
    int64_t generation;
    double last_recovery_s;
    int spares; /* --spare_workers: started and waiting; not in the world size */
    uint64_t worker_exits[STATUS_EXIT_REASON_COUNT];
    const char *watchdog_mode; /* "off", "fixed", "auto"; NULL: no watchdog object */
    uint64_t watchdog_kills;   /* groups stopped because a worker was hung */
    /* Straggler detection (docs/status.md, "Stragglers"): the factor (0:
     * off), the node's median at the last judgement (0: not known), and
     * whether it judged compute times (else step times). */
    double straggler_factor;
    double step_median_s;
    bool step_compute;
    /* GET /history is served (status/history.h), and its last sequence
     * number. */
    bool history;
    uint64_t history_seq;
    /* Teed output the log files could not take (a full disk): bytes, files. */
    uint64_t log_dropped_bytes;
    unsigned log_dropped_files;

    /* cddprun's exit code once the run ended (common/exitcodes.h) and its
     * name; exit_code < 0: still running. */
    int exit_code;
    const char *exit_reason;
    struct status_goodput_view goodput;

    size_t nworkers;
    const struct status_worker_view *workers;
};

/*
 * Renders the agent's status at (now_wall, now_mono_ms) into a new snapshot
 * (*out, one reference, ready to publish). now_mono_ms is the clock the
 * progress times were taken with. Checks: "rendezvous" (a round is complete
 * and we are not waiting for the next), "workers" (the group is running).
 * A hosted rendezvous server (v->rdzv_server) is shown as cddp-rdzv shows
 * itself (its "rdzv_server" object and cddp_rdzv_* families, without a
 * check of its own). 0, or a negative code with *out NULL.
 */
int status_agent_render(const struct status_agent_view *v, double now_wall, uint64_t now_mono_ms,
                        struct status_snapshot **out);

/* ---- the rendezvous server (cddp-rdzv) -------------------------------- */

/* Why the server refused a connection (label of
 * cddp_rdzv_refused_connections_total). */
enum status_refusal {
    STATUS_REFUSED_LIMIT,    /* connection limit reached */
    STATUS_REFUSED_TOKEN,    /* join token missing or wrong */
    STATUS_REFUSED_PROTOCOL, /* bad frame, version or message */
    STATUS_REFUSAL_COUNT
};

const char *status_refusal_name(enum status_refusal r);

struct status_rdzv_node_view {
    const char *node; /* how the server names the agent: "host:port" or an id */
    int node_rank;    /* in the current round; -1 when waiting */
    int nproc;        /* local world size it asked for; 0 unknown */
    double joined_at;
    double last_seen_at; /* last heartbeat */
    const char *state;   /* the state machine's name for it ("active", ...); NULL: not shown */
    int status_port;     /* its agent's status port; 0: none or not said */
    const char *addr;    /* where its connection comes from; NULL: not connected */
    /* Its agent's summary of its ranks' step times (heartbeats): their
     * median step and compute time (<= 0: not said), its slowest rank
     * (shown with a straggler); and the job-wide judgement: named, since
     * (wall), ratio. */
    double step_time_s;
    double compute_s;
    int slowest_rank;
    bool straggler;
    double straggler_since;
    double straggler_ratio;
};

struct status_rdzv_run_view {
    const char *run_id;
    const char *state; /* the rendezvous state machine's name for it */
    uint64_t round;
    unsigned min_nodes, max_nodes;
    double last_round_at;
    size_t nmembers;
    const struct status_rdzv_node_view *members;
    size_t nwaiting;
    const struct status_rdzv_node_view *waiting; /* the wait list */
    /* The last straggler judgement of its members: the median of their
     * medians (0: not known), compute times or step times, the factor. */
    double step_median_s;
    bool step_compute;
    double straggler_factor;
    /* Job-wide goodput (cddp-rdzv only: rendezvous/jobstats.h): the sums
     * of the latest totals of every node that reported any, current and
     * past members; has_goodput false: none reported. max_step/min_step:
     * over the nodes heard from lately (-1: none). */
    bool has_goodput;
    size_t goodput_nodes;
    double goodput_s[STATUS_GOODPUT_PHASE_COUNT];
    double goodput_total_s, goodput_ratio;
    int64_t goodput_lost_steps;
    int64_t max_step, min_step;
};

struct status_rdzv_view {
    const char *program; /* "cddp-rdzv" */
    const char *version;
    int pid;
    const char *hostname;
    const char *endpoint; /* where agents connect */
    double started_at;
    bool accepting; /* listening and not shutting down: the "listener" check */

    unsigned connections; /* open agent connections */
    uint64_t connections_total;
    uint64_t refused[STATUS_REFUSAL_COUNT];
    uint64_t joins_total;
    uint64_t rounds_total;

    size_t nruns;
    const struct status_rdzv_run_view *runs;
};

/* As status_agent_render. Check: "listener". */
int status_rdzv_render(const struct status_rdzv_view *v, double now_wall,
                       struct status_snapshot **out);

#endif
