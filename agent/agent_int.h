/*
 * agent_int.h: the agent's own state, shared by the files of its loop and
 * by no one else (the launcher and the status module see agent.h only).
 *
 *   agent.c     the loop: events to the policy, its actions, workers'
 *               starts and exits, signals, shutdown, agent_run
 *   round.c     the rendezvous glue: opening the backend (and choosing the
 *               workers' network interface), joins, rounds, the agent's
 *               TCPStore per round, the exit barrier, the farewell
 *   progress.c  progress lines in: the watchdog's timer, a hung worker's
 *               stacks, then the stop
 *   stragglers.c --straggler_factor: each rank's step time, the node's
 *               median, who is a straggler, the rendezvous' summary
 *   filetimer.c torch's file timer (its second half: which worker a pid
 *               is, the hang note of an expired timer)
 *   report.c    the failure table and error files (its second half: from
 *               the workers' exits)
 *   goodput.c   where the wall time went (pure; fed from agent.c's events
 *               and progress.c's steps)
 *   inplace.c   --restart_scope=worker: a failed worker restarted alone,
 *               the generation announced, the workers' environment
 *   spare.c     --spare_workers: warm spare processes, one handed a failed
 *               worker's place
 *
 * Everything here runs on the agent's loop thread. A flag's runtime state
 * lives in the file of its own, not in agent.c (docs/architecture.md).
 */
#ifndef CDDP_AGENT_AGENT_INT_H
#define CDDP_AGENT_AGENT_INT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "agent/agent.h"
#include "agent/env.h"
#include "agent/filetimer.h"
#include "agent/goodput.h"
#include "agent/ifname.h"
#include "agent/logs.h"
#include "agent/numa.h"
#include "agent/report.h"
#include "agent/rdzv.h"
#include "agent/stacks.h"
#include "agent/workers.h"
#include "common/straggler.h"

struct agent_worker {
    struct agent_worker_info info;
    pid_t pgid;        /* the worker's process group (= its pid); 0 if never started */
    bool leader_alive; /* the worker process itself has not been reaped */
    bool group_alive;  /* processes may be left in its group */
    uint64_t exit_seq;
    char error_file[4096];
    char hang_note[512]; /* why the watchdog stopped it (this attempt); "" if it did not */
    double hung_at;      /* wall time the watchdog found it hung */
    /* Why the agent could not start it (this attempt), for the failure
     * table; "" when it started. */
    char start_error[256];
    bool not_started; /* skipped after another ran out of fds: not in the table */
    /* --restart_scope=worker, a hung rank (progress.c): the blame lines
     * taken from this worker's progress channel, and why this worker was
     * killed for a peer's blame (generation + 1 it was blamed in; 0: not). */
    uint64_t blames_seen;
    int64_t blamed_gen;
    char blame_note[256];
};

/* A worker replaced in place (--restart_scope=worker), for the failure
 * table at exit (report.c): what its failure was, and the generation. */
struct agent_replaced {
    struct agent_failure f; /* loaded when it was replaced; its message says so */
    int64_t generation;
};

/* --spare_workers (spare.c): one started spare, waiting for its
 * assignment on sock (the agent's end of a SOCK_SEQPACKET pair). */
struct agent_spare {
    pid_t pid; /* and its process group; 0: the slot is empty */
    int sock;
    double started; /* wall time */
};

struct agent_spares {
    struct agent_spare *s; /* cfg->spare_workers slots */
    int n;
    int deaths;    /* spares that died unused since one was last used */
    bool given_up; /* too many died unused: no more are started this group */
    unsigned seq;  /* spares started, for their log files */
};

/* --straggler_factor's state (stragglers.c), one entry per local rank. */
struct agent_stragglers {
    struct straggler_window *win;
    struct straggler_member *m; /* value: the time judged (compute or step) */
    struct straggler_change *ch;
    double *scratch, *vals;
    double *step_s, *compute_s; /* each rank's means now; -1: not measured */
    bool *judged;               /* the last judgement weighed it (running, measured) */
    double median_s;            /* the node's, at the last judgement; 0: none */
    bool compute;               /* judged on compute times */
    uint64_t judged_ms;
};

struct agent {
    uv_loop_t loop;
    const struct launch_config *cfg;
    const struct agent_hooks *hooks;
    struct agent_policy pol;

    /* The rendezvous and its round (round.c). */
    struct agent_rdzv_static rdzv_static;
    struct agent_rdzv *rdzv;
    struct agent_ifname ifname; /* the workers' network interface (multi-node) */
    struct agent_round round;
    bool have_round;
    /* --agent_store: the TCPStore this node serves the workers (node 0),
     * a fresh one each round; bound before the join where the rendezvous
     * publishes our port (c10d), after the round where the port is given. */
    struct tcpstore_server *store;
    int store_port;
    uint64_t store_round;
    /* Worker scope: the store was kept through the last join (the workers
     * ran on); a round that does not go on in place renews it on the same
     * port (store_renew_port while the old one closes). */
    bool store_kept;
    int store_renew_port;

    int nworkers;
    struct agent_worker *workers;
    int attempt; /* restart count of the running attempt */
    uint64_t exit_seq;
    int membership_restarts; /* rounds joined because the rendezvous asked */
    double recovery_started; /* wall time the last worker was restarted alone; 0: never */
    double last_recovery_s;  /* from then to the replacement's first step; < 0: none yet */
    /* the last blame passed on to the rendezvous (another node's rank, its
     * generation + 1; 0: none), so that each is sent once */
    int blame_sent_rank;
    int64_t blame_sent_gen;
    struct agent_spares spares;      /* --spare_workers (spare.c) */
    struct agent_replaced *replaced; /* every worker replaced in place, in order */
    int nreplaced;

    struct agent_numa_plan *numa; /* --numa_binding: one per local rank, or NULL */

    struct agent_guardian guardian;
    struct agent_logs logs;
    struct agent_tee_set tees;

    uv_signal_t sigchld;
    uv_signal_t sigs[LAUNCH_MAX_SIGNALS];
    int nsigs;
    uv_timer_t deadline;
    uv_timer_t group_check;
    /* The progress watchdog (progress.c): its timer, armed for the next
     * deadline while RUNNING, and the stacks of the local rank found hung
     * (hung_rank; -1: none), captured before its group is stopped. */
    uv_timer_t watchdog_timer;
    struct watchdog wd;
    unsigned watchdog_kills;
    struct agent_stragglers strag;
    int hung_rank;
    struct agent_stacks_target hung_target;
    struct agent_stacks_job hung_stacks;
    /* torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1), and the pipe
     * the workers get as TORCHELASTIC_TIMER_FILE. */
    struct agent_filetimer *filetimer;
    char filetimer_path[4096];
    /* Armed with every SIGKILL to the groups: processes still there when it
     * fires cannot be killed (D state); they are reported and given up. */
    uv_timer_t kill_wait;
    /* A stack capture on demand (agent_capture_stacks: cddpctl stacks):
     * every running worker into ondemand_path.<local_rank> (one target per
     * local rank), then merged into ondemand_path. */
    struct agent_stacks_job ondemand;
    struct agent_stacks_target *ondemand_targets;
    unsigned ondemand_seq;
    char ondemand_path[4096];
    void (*ondemand_done)(void *arg, int rc, const char *path);
    void *ondemand_arg;
    bool handles_open;

    char run_id[PROTO_MAX_ID + 1];
    const char *entry_name;
    double start_time;
    /* Where the wall time went (goodput.h): the mode follows the policy's
     * state after every event, the steps come from progress lines. */
    struct goodput gp;

    /* Events raised while actions run are queued, so the policy never sees
     * one event inside another. */
    struct policy_event *queue;
    size_t qhead, qtail, qcap;
    bool dispatching;
    bool changed;

    bool shutting_down;
    /* How this node leaves the rendezvous (POLICY_ACT_EXIT's end_job, finished). */
    enum agent_rdzv_farewell rdzv_how;
    char rdzv_reason[1024];
    char this_node[300]; /* "host (pid N)", how the other nodes' messages name this one */
    int exit_code;
    bool reported;              /* the failure table was printed */
    char fail_reason[512];      /* why the agent itself failed, for its error file */
    sigset_t inherited_ignored; /* passed on to the workers */
};

/* ---- agent.c ---- */

/* Logs an agent-level failure (at ERROR, id) and keeps the first one for
 * the error file. */
void agent_failed(struct agent *a, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Hands the policy an event (queued when one is being handled) and carries
 * out its actions. */
void agent_post_event(struct agent *a, const struct policy_event *ev);
void agent_post(struct agent *a, enum policy_event_type type, int local_rank, int exitcode,
                int sig);

/* The goodput accounting's mode for the policy's state now. */
void agent_goodput_update(struct agent *a, uint64_t now_ms);

/* Starts local rank i's worker (round, logs, environment, spawn); 0, or a
 * code with the worker's start_error filled where there is one. */
int agent_start_worker(struct agent *a, int i);
/* Local rank i's environment as a worker started now gets it (extras: the
 * prepare hook's, or NULL; error_file: its TORCHELASTIC_ERROR_FILE); its
 * global rank in *rank. 0 or a code; env freed with agent_env_free. */
int agent_worker_env(struct agent *a, int i, const char *error_file,
                     const struct agent_worker_extras *extras, struct agent_env *env, int *rank);
/* What agent_start_worker does before the spawn: the error file's path, the
 * prepare hook (extras), the environment, the rank. 0 or a code (nothing
 * left to release then). */
int agent_worker_prepare(struct agent *a, int i, struct agent_worker_extras *extras,
                         struct agent_env *env);
/* The hook's fds closed where the agent owns them. */
void agent_worker_release_extras(struct agent_worker_extras *x);
/* Local rank i's stdout and stderr for this attempt (-1: inherit). 0 or a
 * code. */
int agent_worker_stdio(struct agent *a, int i, int *out_fd, int *err_fd);
/* Local rank i's process is pid now (its own process group): the
 * worker's state, its watchdog and straggler windows, the guardian. */
void agent_worker_started(struct agent *a, int i, pid_t pid);
/* The log directories of the attempt a->attempt; a failure logged (A0206).
 * 0 or a code. */
int agent_attempt_logs(struct agent *a);
/* Local rank i could not start: told to the policy as an exit with 1. */
void agent_worker_not_started(struct agent *a, int i);
/* Local rank i's start_error, if it has one, logged (A0203). */
void agent_log_start_error(const struct agent *a, int i);

/* The hooks' state_changed with a snapshot of now. */
void agent_notify(struct agent *a);

/* Something the status page shows changed: shown now, or once the events
 * in hand are handled. */
void agent_show(struct agent *a);

/* ---- stop.c ---- */

/* Sends sig to every worker's process group still there; with SIGKILL,
 * arms a->kill_wait: what is left when it fires is reported (A2414) and
 * given up, and the policy told as if it had exited. */
void agent_signal_groups(struct agent *a, int sig);

/* ---- round.c ---- */

/* Opens the rendezvous cfg names (no network for one static node,
 * torchrun's default; agent/rdzv_c10d.c or rdzv_etcd.c otherwise) and
 * chooses the workers' network interface. 0, or a code with why filled. */
int agent_round_open(struct agent *a, char *why, size_t whylen);

/* POLICY_ACT_JOIN: a fresh store where this node's port is published at
 * join, then the join; a failure is posted as POLICY_EV_ROUND_FAILED. */
void agent_round_join(struct agent *a, const struct policy_action *act);

/* POLICY_ACT_NEW_GENERATION: the round goes on in place with this node's
 * workers; node 0 announces the generation on the agent store. */
void agent_round_new_generation(struct agent *a, const struct policy_action *act);
void agent_round_request_generation(struct agent *a, const struct policy_action *act);
/* progress.c: another node's worker named global rank `rank` as never
 * reaching a collective of generation gen (the rendezvous passed it on). */
void agent_progress_remote_blame(struct agent *a, int rank, int64_t gen, const char *node_id);
/* POLICY_ACT_REPORT_FAILURE and POLICY_ACT_EXIT_BARRIER. */
void agent_round_report_failure(struct agent *a);
void agent_round_exit_barrier(struct agent *a);

/* POLICY_ACT_EXIT: how this node will leave, and what the others are told. */
void agent_round_farewell(struct agent *a, const struct policy_action *act);

/* Shutting down: leaves the rendezvous as the farewell said (the store
 * closes once the rendezvous is done with the other nodes). */
void agent_round_close(struct agent *a);

/* ---- filetimer.c ---- */

/* TORCHELASTIC_ENABLE_FILE_TIMER=1: serves the pipe at
 * TORCHELASTIC_TIMER_FILE (or at a fresh path the workers are told of), as
 * torchrun's agent does; an expired timer kills its pid and notes it in
 * that worker's hang note. 0 (also when it is not asked for), or a code
 * with why filled. */
int agent_filetimer_start(struct agent *a, char *why, size_t whylen);

/* ---- report.c ---- */

/* POLICY_ACT_FAILURE_REPORT: the failed workers' table on stderr, as
 * torchrun's ChildFailedError prints it, and the agent's error file. */
void agent_report_failures(struct agent *a);

/* A worker replaced in place (generation gen), before its slot is reused:
 * kept for the table (agent_report_failures; at a successful exit,
 * agent_report_replaced). */
void agent_note_replaced(struct agent *a, int i, int64_t gen);
/* A run that succeeded after workers were replaced in place: the same
 * table, "RECOVERED IN PLACE", naming them (scope, rank, generation). */
void agent_report_replaced(struct agent *a);

/* The agent failed before any table was printed: its error file says why
 * (when it has one: --error_file / TORCHELASTIC_ERROR_FILE). */
void agent_report_agent_error(const struct agent *a);

/* ---- stragglers.c ---- */

/* The windows and judge for every local rank. 0 or -ENOMEM. */
int agent_stragglers_init(struct agent *a);
void agent_stragglers_free(struct agent *a);
/* Local rank i's worker started: its measure starts again. */
void agent_stragglers_start(struct agent *a, int i);
/* Local rank i wrote valid progress lines (r: its report, read at now_ms):
 * its window takes them; the ranks are judged when it is time. */
void agent_stragglers_line(struct agent *a, int i, const struct progress_report *r,
                           uint64_t now_ms);
/* Local rank i's step times and straggler state into w (the snapshot's). */
void agent_stragglers_fill(const struct agent *a, int i, struct agent_worker_info *w,
                           uint64_t now_ms, double now_wall);

/* ---- inplace.c ---- */

/* --restart_scope=worker from the flags: the policy's scope; no recovery
 * measured yet. */
void agent_inplace_init(struct agent *a);
/* Under --restart_scope=worker, a worker's CDDP_RESTART_SCOPE and
 * CDDP_GENERATION appended to env[0..n) (room for 2 more; generation: len
 * bytes the value is written in, alive until the spawn). The new count. */
int agent_inplace_env(const struct agent *a, struct launch_kv *env, int n, char *generation,
                      size_t len);
/* The scope, the generation, the restarts by scope and the last recovery
 * into the status snapshot. */
void agent_inplace_snapshot(const struct agent *a, struct agent_snapshot *s);
/* This node's workers that generation gen replaces, or (gen 0) whose
 * replace is asked of the rendezvous together: their global ranks as
 * "2,3" in buf; how many, or -1 when they do not fit in len. */
int agent_inplace_ranks(const struct agent *a, int64_t gen, char *buf, size_t len);
/* POLICY_ACT_RESTART_WORKER: the replaced workers' groups killed (the
 * ones the policy marked for the generation), the new generation
 * announced on the agent store, each local rank started alone. */
void agent_inplace_restart_worker(struct agent *a, const struct policy_action *act);
/* Announces generation gen on the agent store (when this agent hosts it):
 * first cddp/gen/<gen>/replaced = ranks (decimal, comma-separated), then
 * cddp/gen = gen. */
void agent_inplace_publish(struct agent *a, int64_t gen, const char *ranks);

/* ---- spare.c ---- */

/* --spare_workers' slots (none without the flag). 0 or -ENOMEM. */
int agent_spares_init(struct agent *a);
void agent_spares_free(struct agent *a);
/* Starts spares for the empty slots (the group runs under worker scope). */
void agent_spares_fill(struct agent *a);
/* Kills every spare (SIGKILL to its process group, reaped here). */
void agent_spares_stop(struct agent *a);
/* Local rank i failed: a spare is handed its place (its environment and
 * fds over the spare's socket) and becomes its process. 0, or a code when
 * none could take it (the caller starts a new process). */
int agent_spares_take(struct agent *a, int i);
/* pid was reaped: true if it was a spare (logged, its slot refilled). */
bool agent_spares_reaped(struct agent *a, pid_t pid, int status);
/* Spares started and waiting. */
int agent_spares_ready(const struct agent *a);
/* The spares' process groups told to a new guardian. */
void agent_spares_guard(struct agent *a);

/* ---- progress.c ---- */

/* Re-arms the watchdog's timer for its next deadline (stopped unless the
 * group runs and no hung worker is being captured). */
void agent_watchdog_arm(struct agent *a);

#endif
