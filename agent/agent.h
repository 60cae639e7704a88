/*
 * agent.h: the per-node elastic agent (one libuv loop).
 *
 *   agent_run(config, hooks) -> exit status
 *
 * The loop turns kernel notifications (SIGCHLD for worker and descendant
 * exits, handled signals, timers) and rendezvous callbacks into policy events
 * (agent/policy.h) and carries out the policy's actions: spawn (workers.c),
 * environment (env.c), logs and tees (logs.c), failure report (report.c).
 *
 * Its state is kept in plain structs (struct agent_snapshot below) that the
 * status port renders (agent/status.c, status/view.c); hooks let it see
 * every state change and give workers extra fds and environment variables
 * (the progress channel).
 */
#ifndef CDDP_AGENT_AGENT_H
#define CDDP_AGENT_AGENT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "agent/config.h"
#include "agent/goodput.h"
#include "agent/policy.h"
#include "agent/watchdog.h"
#include "proto/progress.h"

/* One worker (local rank) as the status page shows it. */
struct agent_worker_info {
    int local_rank;
    int rank;  /* global rank in the current round */
    pid_t pid; /* 0 before its first start */
    enum worker_state state;
    int exitcode;      /* when exited: status, or -N for signal N */
    double start_time; /* wall clock, seconds */
    double exit_time;  /* wall clock, seconds; 0 while running */
    int restarts;      /* how many times it was started again */
    unsigned exits;    /* exits seen for this local rank, failed starts included */
    /* The progress watchdog (agent/watchdog.h): the timeout that applies
     * now (0: not watched), and whether its last exit was the watchdog's
     * stop (it was found hung: from the watchdog's finding, before it exits). */
    uint64_t watchdog_timeout_ms;
    bool hung;
    /* Its step time and compute time (the step outside collective waits),
     * means over its last 20+ steps (-1: not measured, not reported), and
     * the straggler judgement (agent/stragglers.c): named or not, since
     * when (wall clock), its time over the node's median (0: not known). */
    double step_time_s;
    double compute_s;
    bool straggler;
    double straggler_since;
    double straggler_ratio;
};

/* The agent's state. Valid only during the state_changed call: copy what you
 * keep (the status server publishes an immutable copy of its own). */
struct agent_snapshot {
    const char *run_id;
    const char *role;
    const char *rdzv_backend;
    const char *rdzv_endpoint;
    enum agent_state state;
    uint64_t round; /* 0 before the first round */
    int node_rank;
    int nnodes;
    int world_size;
    const char *master_addr;
    int master_port;
    int restart_count; /* TORCHELASTIC_RESTART_COUNT */
    int max_restarts;
    /* Why the group is stopping (STOPPING, KILLING) or was last stopped. */
    enum stop_reason stop_reason;
    bool will_restart;       /* STOPPING, KILLING: to start again (policy_will_restart) */
    int membership_restarts; /* new rounds the rendezvous asked for (not in restart_count) */
    /* --restart_scope (agent/policy.h): "group" or "worker"; the membership
     * generation of the running group (0 at its start, one more for each
     * worker restarted alone); restarts of one worker and of the whole
     * group (both in restart_count); worker-scope failures that fell back
     * to a group restart; wall time of the last worker restarted alone (0:
     * none). */
    const char *restart_scope;
    int64_t generation;
    int worker_restarts;
    int group_restarts;
    int scope_fallbacks;
    int node_replacements; /* rounds that put a node in a lost one's place, workers kept */
    double recovery_started;
    double last_recovery_s; /* from it to the replacement's first step; < 0: none yet */
    int spares;             /* --spare_workers: spare processes started and waiting */
    /* The rendezvous beyond rounds (agent/rdzv.h's agent_rdzv_info): the
     * connection to its server, the run's wait list, the server this agent
     * hosts (rdzv_server: NULL when none; valid during the call only). */
    bool rdzv_connected;
    double rdzv_disconnected_at;
    unsigned rdzv_reconnects;
    int64_t waiting_nodes; /* -1: not known */
    const struct rdzv_server *rdzv_server;
    /* etcd-v3: the member in use (NULL: another backend), lease and watch
     * health, member changes. */
    const char *etcd_member;
    bool etcd_lease_ok, etcd_watch_ok;
    unsigned etcd_failovers;
    /* The TCPStore this agent serves its workers (--agent_store); NULL:
     * none. Valid until the next snapshot, on the loop thread only. */
    const struct tcpstore_server *agent_store;
    uint64_t agent_store_round;
    double start_time; /* the agent's, wall clock */
    /* cddprun's exit code once the run has ended (common/exitcodes.h); -1
     * before. */
    int exit_code;
    /* Where the wall time went (agent/goodput.h), up to goodput_ms
     * (monotonic); valid during the call only. */
    const struct goodput_totals *goodput;
    uint64_t goodput_ms;
    enum watchdog_mode watchdog_mode;
    unsigned watchdog_kills; /* worker groups stopped because a worker was hung */
    /* Straggler detection: --straggler_factor (0: off), the node's median
     * at the last judgement (0: fewer than two ranks measured), and whether
     * it judged compute times (else step times). */
    double straggler_factor;
    double step_median_s;
    bool step_compute;
    int nworkers;
    const struct agent_worker_info *workers;
    /* The workers' network interface (agent/ifname.h): ifname and its
     * address ("" when none was chosen), and where it came from ("auto",
     * "user", "off", "none"). */
    const char *ifname;
    const char *ifname_addr;
    const char *ifname_source;
    /* Bytes of the workers' output the log files could not take (a full
     * disk), and the files that lost some (agent/logs.h). */
    uint64_t log_dropped_bytes;
    unsigned log_dropped_files;
};

/* Extra inheritance for one worker, filled by the prepare_worker hook. */
#define AGENT_EXTRA_MAX 8
struct agent_worker_extras {
    struct launch_kv env[AGENT_EXTRA_MAX]; /* set in the worker's environment */
    int nenv;
    int fds[AGENT_EXTRA_MAX]; /* become fds 3, 4, ... in the worker; the hook keeps ownership */
    int nfds;
    bool close_fds;    /* the agent closes fds[] once the spawn is done (or failed) */
    char storage[512]; /* room for the hook's env strings */
};

struct rdzv_server;
struct rdzv_jobs;
struct tcpstore_server;

struct agent;

struct agent_hooks {
    void *arg;
    /* The status port the hooks serve (told to a c10d rendezvous server, so
     * `cddpctl job` finds every node's agent); 0: none. */
    int status_port;
    /* Before start: the agent, for agent_progress(). May be NULL. */
    void (*attach)(void *arg, struct agent *agent);
    /* The loop exists (before any worker starts): add handles to it. */
    int (*start)(void *arg, uv_loop_t *loop);
    /* The agent is shutting down: start no new work. The loop may still run
     * a while (a hosting agent serves the other nodes until they are done):
     * handles kept for that must not keep it alive (uv_unref). */
    void (*stop)(void *arg);
    /* The loop has nothing left to do: close your handles now (the loop
     * runs once more to finish closing them). May be NULL. */
    void (*loop_done)(void *arg);
    /* Called after every event that changed something. */
    void (*state_changed)(void *arg, const struct agent_snapshot *snap);
    /* Before each worker is spawned. 0, or an error that fails this start. */
    int (*prepare_worker)(void *arg, int local_rank, int restart_count,
                          struct agent_worker_extras *extras);
    /* On the loop, only when this agent hosts the rendezvous server: the
     * job-wide statistics the server is to feed (rendezvous/jobs.h), owned
     * by the hooks and outliving the loop; NULL: none. May be NULL. */
    struct rdzv_jobs *(*host_jobs)(void *arg);
};

/* On the agent's loop, from a hook: local_rank's worker wrote valid progress
 * lines (r is its parser's report, read at now_ms, monotonic). Feeds the
 * progress watchdog; a no-op once the agent is shutting down. */
void agent_progress(struct agent *a, int local_rank, const struct progress_report *r,
                    uint64_t now_ms);

/* On the agent's loop, from a hook: captures the stacks of every running
 * worker (/proc's view of its process group, then gdb's backtraces and
 * Python stack, all bounded to a few seconds as before a watchdog kill)
 * into one file in the attempt's log directory. done(arg, rc, path) is
 * called once, on the loop, when the file is written (path NULL when it
 * could not be). Returns 0, or without calling done: CDDP_EEXISTS (one is
 * under way), CDDP_ENOTFOUND (no worker runs), CDDP_ESTATE (shutting down). */
int agent_capture_stacks(struct agent *a, void (*done)(void *arg, int rc, const char *path),
                         void *arg);

/* Runs the job described by cfg to the end. Returns the process exit status
 * (common/exitcodes.h): 0, 1 (failed), 3 (hung past the restarts), 4 (no
 * progress across restarts), 5 (the rendezvous lost), or 128+N (stopped by
 * signal N). hooks may be NULL. */
int agent_run(const struct launch_config *cfg, const struct agent_hooks *hooks);

#endif
