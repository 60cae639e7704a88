/*
 * agent.c: the agent's libuv loop. It only translates: kernel and rendezvous
 * notifications become policy events (agent/policy.c decides), and the
 * policy's actions become syscalls. See agent.h.
 */
#include "agent/agent.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/env.h"
#include "agent/ifname.h"
#include "agent/filetimer.h"
#include "agent/logs.h"
#include "agent/numa.h"
#include "agent/rdzv.h"
#include "agent/report.h"
#include "agent/stacks.h"
#include "agent/workers.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/hostname.h"
#include "common/log.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "common/uuid.h"
#include "rendezvous/etcd.h"
#include "store/tcpstore.h"

extern char **environ;

/* How often to look at process groups whose last members are not our
 * children (they can only be seen by asking); only while such groups exist. */
#define GROUP_CHECK_MS 100

struct agent_worker {
    struct agent_worker_info info;
    pid_t pgid;        /* the worker's process group (= its pid); 0 if never started */
    bool leader_alive; /* the worker process itself has not been reaped */
    bool group_alive;  /* processes may be left in its group */
    uint64_t exit_seq;
    char error_file[4096];
    char hang_note[512]; /* why the watchdog stopped it (this attempt); "" if it did not */
    double hung_at;      /* wall time the watchdog found it hung */
};

struct agent {
    uv_loop_t loop;
    const struct launch_config *cfg;
    const struct agent_hooks *hooks;
    struct agent_policy pol;

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

    int nworkers;
    struct agent_worker *workers;
    int attempt; /* restart count of the running attempt */
    uint64_t exit_seq;
    int membership_restarts; /* rounds joined because the rendezvous asked */

    struct agent_numa_plan *numa; /* --numa_binding: one per local rank, or NULL */

    struct agent_guardian guardian;
    struct agent_logs logs;
    struct agent_tee_set tees;

    uv_signal_t sigchld;
    uv_signal_t sigs[LAUNCH_MAX_SIGNALS];
    int nsigs;
    uv_timer_t deadline;
    uv_timer_t group_check;
    uv_timer_t watchdog_timer; /* armed for the watchdog's next deadline while RUNNING */
    struct watchdog wd;
    unsigned watchdog_kills;
    /* Stacks being captured before a hung group is stopped (agent/stacks.h):
     * the rank found hung (-1: none), gdb's pid, and its time bound. */
    int stacks_rank;
    pid_t stacks_pid;
    uv_timer_t stacks_timer;
    /* torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1), and the pipe
     * the workers get as TORCHELASTIC_TIMER_FILE. */
    struct agent_filetimer *filetimer;
    char filetimer_path[4096];
    /* Armed with every SIGKILL to the groups: processes still there when it
     * fires cannot be killed (D state); they are reported and given up. */
    uv_timer_t kill_wait;
    /* A stack capture on demand (agent_capture_stacks: cddpctl stacks):
     * one gdb per running worker (0: done), each into path.<local_rank>. */
    struct {
        bool running;
        unsigned seq;
        int pending;
        pid_t *gdb;
        char path[4096];
        uv_timer_t timer;
        void (*done)(void *arg, int rc, const char *path);
        void *arg;
    } ondemand;
    bool handles_open;

    char run_id[128];
    const char *entry_name;
    double start_time;

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

static void agent_shutdown(struct agent *a);

/* Logs an agent-level failure and keeps the first one for the error file. */
static void agent_failed(struct agent *a, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void agent_failed(struct agent *a, const char *id, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_error(id, "%s", msg);
    if (a->fail_reason[0] == '\0')
        cddp_strlcpy(a->fail_reason, msg, sizeof(a->fail_reason));
}

/* ---- events ---- */

static void notify(struct agent *a)
{
    if (a->hooks == NULL || a->hooks->state_changed == NULL)
        return;
    struct agent_worker_info infos[64];
    struct agent_worker_info *w =
        a->nworkers <= 64 ? infos : malloc(sizeof(*w) * (size_t)a->nworkers);
    if (w == NULL)
        return;
    for (int i = 0; i < a->nworkers; i++) {
        w[i] = a->workers[i].info;
        w[i].state = a->pol.workers[i].state;
        w[i].watchdog_timeout_ms = watchdog_timeout(&a->wd, i);
    }
    struct agent_snapshot s = {
        .run_id = a->run_id,
        .role = a->cfg->role,
        .rdzv_backend = a->cfg->rdzv_backend,
        .rdzv_endpoint = a->cfg->rdzv_endpoint,
        .state = a->pol.state,
        .round = a->have_round ? a->round.round : 0,
        .node_rank = a->round.node_rank,
        .nnodes = a->round.nnodes,
        .world_size = a->round.world_size,
        .master_addr = a->round.master_addr,
        .master_port = a->round.master_port,
        .restart_count = policy_restart_count(&a->pol),
        .max_restarts = a->cfg->max_restarts,
        .stop_reason = a->pol.stop_reason,
        .membership_restarts = a->membership_restarts,
        .rdzv_connected = a->rdzv ? a->rdzv->info.connected : true,
        .rdzv_disconnected_at = a->rdzv ? a->rdzv->info.disconnected_at : 0,
        .rdzv_reconnects = a->rdzv ? a->rdzv->info.reconnects : 0,
        .waiting_nodes = a->rdzv ? a->rdzv->info.waiting_nodes : -1,
        .rdzv_server = a->rdzv ? a->rdzv->info.server : NULL,
        .etcd_member = a->rdzv ? a->rdzv->info.etcd_member : NULL,
        .etcd_lease_ok = a->rdzv && a->rdzv->info.etcd_lease_ok,
        .etcd_watch_ok = a->rdzv && a->rdzv->info.etcd_watch_ok,
        .etcd_failovers = a->rdzv ? a->rdzv->info.etcd_failovers : 0,
        .agent_store = a->store,
        .agent_store_round = a->store_round,
        .start_time = a->start_time,
        .watchdog_mode = a->cfg->watchdog.mode,
        .watchdog_kills = a->watchdog_kills,
        .nworkers = a->nworkers,
        .workers = w,
        .ifname = a->ifname.ifname,
        .ifname_addr = a->ifname.addr,
        .ifname_source = agent_ifname_source_name(a->ifname.source),
    };
    a->hooks->state_changed(a->hooks->arg, &s);
    if (w != infos)
        free(w);
}

static void do_action(struct agent *a, const struct policy_action *act);
static void watchdog_arm(struct agent *a);

static void post_event(struct agent *a, const struct policy_event *in);

static void post(struct agent *a, enum policy_event_type type, int local_rank, int exitcode,
                 int sig)
{
    struct policy_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.local_rank = local_rank;
    ev.exitcode = exitcode;
    ev.sig = sig;
    post_event(a, &ev);
}

static void post_event(struct agent *a, const struct policy_event *in)
{
    if (a->qtail == a->qcap) {
        if (a->qhead > 0) {
            memmove(a->queue, a->queue + a->qhead, (a->qtail - a->qhead) * sizeof(*a->queue));
            a->qtail -= a->qhead;
            a->qhead = 0;
        } else {
            size_t cap = a->qcap ? a->qcap * 2 : 16;
            struct policy_event *q = realloc(a->queue, cap * sizeof(*q));
            if (q == NULL) {
                log_crit("A0001", "out of memory queuing an event");
                abort();
            }
            a->queue = q;
            a->qcap = cap;
        }
    }
    a->queue[a->qtail++] = *in;
    if (a->dispatching)
        return;
    a->dispatching = true;
    while (a->qhead < a->qtail) {
        struct policy_event e = a->queue[a->qhead++];
        struct policy_action acts[POLICY_MAX_ACTIONS];
        enum agent_state before = a->pol.state;
        int n = policy_step(&a->pol, &e, cddp_mono_ms(), acts);
        if (n > 0 || before != a->pol.state || e.type == POLICY_EV_WORKER_EXIT)
            a->changed = true;
        for (int i = 0; i < n; i++)
            do_action(a, &acts[i]);
    }
    a->qhead = a->qtail = 0;
    a->dispatching = false;
    watchdog_arm(a);
    if (a->changed) {
        a->changed = false;
        notify(a);
    }
}

/* ---- the agent store (--agent_store) ---- */

/* Closes the round's store, if any: its keys go with it, so the next round
 * (a restarted worker group) starts from an empty store, as torchrun 2.x. */
static void store_close(struct agent *a, const char *why)
{
    if (a->store == NULL)
        return;
    struct tcpstore_stats st;
    tcpstore_server_stats(a->store, &st);
    log_info("A0802", "[%s] closed the agent's TCPStore on port %d (%s; %zu keys, %llu queries)",
             a->cfg->role, a->store_port, why, st.keys, (unsigned long long)st.queries);
    tcpstore_server_close(a->store, NULL, NULL);
    a->store = NULL;
    a->store_port = 0;
    a->store_round = 0;
    /* The status page must not read the store any more. */
    if (a->dispatching)
        a->changed = true;
    else
        notify(a);
}

/* Serves a fresh store on every interface at port (0: a free one), as
 * torch's agent does (TCPStore(is_master=True) binds them all). */
static int store_open(struct agent *a, int port, char *err, size_t errlen)
{
    struct tcpstore_server_options o;
    memset(&o, 0, sizeof(o));
    o.port = port;
    int rc = tcpstore_server_start(&a->loop, &o, &a->store, err, errlen);
    if (rc) {
        a->store = NULL;
        return rc;
    }
    a->store_port = tcpstore_server_port(a->store);
    return 0;
}

/* The round is known: node 0 serves the store at MASTER_PORT (the one it
 * bound before joining, or the given one), the other nodes drop theirs. */
static int store_for_round(struct agent *a, struct agent_round *r)
{
    if (!a->cfg->agent_store)
        return 0;
    r->use_agent_store = 1;
    if (r->node_rank != 0) {
        store_close(a, "another node is node 0");
        return 0;
    }
    if (a->store == NULL || a->store_port != r->master_port) {
        store_close(a, "not this round's MASTER_PORT");
        char why[256] = "";
        int rc = store_open(a, r->master_port, why, sizeof(why));
        if (rc) {
            agent_failed(a, "A0803", "[%s] cannot serve the agent's TCPStore on port %d: %s",
                         a->cfg->role, r->master_port, why[0] ? why : cddp_strerror(rc));
            return rc;
        }
    }
    a->store_round = r->round;
    log_info("A0801", "[%s] the agent's TCPStore serves round %llu on %s:%d", a->cfg->role,
             (unsigned long long)r->round, r->master_addr, r->master_port);
    return 0;
}

/* ---- the progress watchdog (agent/watchdog.c decides) ---- */

/* gdb may take this long to attach and print; then it is killed, so a stuck
 * ptrace delays the restart by at most this. */
#define STACKS_TIMEOUT_MS 5000

/* The stacks are written (or gdb ran out of time): stop the group. */
static void stacks_done(struct agent *a)
{
    int i = a->stacks_rank;
    if (i < 0)
        return;
    if (a->stacks_pid > 0)
        kill(-a->stacks_pid, SIGKILL); /* reaped by on_sigchld, as any child */
    a->stacks_rank = -1;
    a->stacks_pid = 0;
    if (a->handles_open)
        uv_timer_stop(&a->stacks_timer);
    post(a, POLICY_EV_WATCHDOG, i, 0, 0);
}

static void on_stacks_timeout(uv_timer_t *t)
{
    struct agent *a = t->data;
    log_warn("A0904", "gdb did not finish within %d ms; its stacks are incomplete",
             STACKS_TIMEOUT_MS);
    stacks_done(a);
}

/* Writes what local rank i was doing next to its logs (attempt_N/i/stacks.txt)
 * and names the file in its hang note; gdb's part is asynchronous. */
static void capture_stacks(struct agent *a, int i)
{
    struct agent_worker *w = &a->workers[i];
    char path[4096];
    a->stacks_rank = i;
    if (a->logs.devnull ||
        agent_logs_path(&a->logs, a->attempt, i, "stacks.txt", path, sizeof(path)) != 0)
        return;
    int rc = agent_stacks_write_proc(w->pgid, path);
    pid_t gdb = 0;
    if (rc == 0)
        rc = agent_stacks_start_gdb(w->pgid, path, &gdb);
    if (rc) {
        log_warn("A0905", "writing the stacks of local_rank %d to %s: %s", i, path,
                 cddp_strerror(rc));
        return;
    }
    size_t n = strlen(w->hang_note);
    snprintf(w->hang_note + n, sizeof(w->hang_note) - n, "; stacks: %s", path);
    if (gdb > 0) {
        a->stacks_pid = gdb;
        uv_timer_start(&a->stacks_timer, on_stacks_timeout, STACKS_TIMEOUT_MS, 0);
    }
}

/* ---- stacks on demand (agent_capture_stacks) ---- */

/* Every gdb is done (or out of time): one file, rank by rank. */
static void ondemand_finish(struct agent *a)
{
    if (!a->ondemand.running)
        return;
    a->ondemand.running = false;
    if (a->handles_open)
        uv_timer_stop(&a->ondemand.timer);
    FILE *out = fopen(a->ondemand.path, "we");
    int rc = out ? 0 : CDDP_ERR_FROM_ERRNO(errno);
    if (out)
        fprintf(out, "# stacks of every running worker, captured on demand (capture %u)\n",
                a->ondemand.seq);
    for (int i = 0; i < a->nworkers; i++) {
        if (a->ondemand.gdb[i] > 0)
            kill(-a->ondemand.gdb[i], SIGKILL); /* out of time; reaped by on_sigchld */
        a->ondemand.gdb[i] = 0;
        char part[4200];
        snprintf(part, sizeof(part), "%s.%d", a->ondemand.path, i);
        FILE *in = fopen(part, "re");
        if (in == NULL)
            continue;
        if (out) {
            fprintf(out, "\n## local_rank %d (rank %d, pid %d)\n", i, a->workers[i].info.rank,
                    (int)a->workers[i].info.pid);
            char buf[8192];
            size_t n;
            while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
                fwrite(buf, 1, n, out);
        }
        fclose(in);
        unlink(part);
    }
    if (out && fclose(out) != 0)
        rc = CDDP_ERR_FROM_ERRNO(errno);
    a->ondemand.pending = 0;
    a->ondemand.done(a->ondemand.arg, rc, rc == 0 ? a->ondemand.path : NULL);
}

static void on_ondemand_timeout(uv_timer_t *t)
{
    struct agent *a = t->data;
    log_warn("A2411",
             "stacks on demand: gdb did not finish within %d ms; the capture is incomplete",
             STACKS_TIMEOUT_MS);
    ondemand_finish(a);
}

/* A child was reaped: one of the capture's gdbs? */
static bool ondemand_reaped(struct agent *a, pid_t pid)
{
    if (!a->ondemand.running || a->ondemand.gdb == NULL)
        return false;
    for (int i = 0; i < a->nworkers; i++) {
        if (a->ondemand.gdb[i] != pid)
            continue;
        a->ondemand.gdb[i] = 0;
        if (--a->ondemand.pending == 0)
            ondemand_finish(a);
        return true;
    }
    return false;
}

int agent_capture_stacks(struct agent *a, void (*done)(void *arg, int rc, const char *path),
                         void *arg)
{
    if (a->shutting_down || !a->handles_open)
        return CDDP_ESTATE;
    if (a->ondemand.running)
        return CDDP_EEXISTS;
    int running = 0;
    for (int i = 0; i < a->nworkers; i++)
        running += a->workers[i].leader_alive && a->workers[i].pgid > 0;
    if (running == 0)
        return CDDP_ENOTFOUND;
    if (a->ondemand.gdb == NULL &&
        (a->ondemand.gdb = calloc((size_t)a->nworkers, sizeof(pid_t))) == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    a->ondemand.seq++;
    if (!a->logs.devnull && a->logs.run_dir)
        snprintf(a->ondemand.path, sizeof(a->ondemand.path), "%s/attempt_%d/stacks-%u.txt",
                 a->logs.run_dir, a->attempt, a->ondemand.seq);
    else
        snprintf(a->ondemand.path, sizeof(a->ondemand.path), "/tmp/cddp-stacks-%d-%u.txt",
                 (int)getpid(), a->ondemand.seq);
    a->ondemand.running = true;
    a->ondemand.pending = 0;
    a->ondemand.done = done;
    a->ondemand.arg = arg;
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        a->ondemand.gdb[i] = 0;
        if (!w->leader_alive || w->pgid <= 0)
            continue;
        char part[4200];
        snprintf(part, sizeof(part), "%s.%d", a->ondemand.path, i);
        int rc = agent_stacks_write_proc(w->pgid, part);
        if (rc == 0)
            rc = agent_stacks_start_gdb(w->pgid, part, &a->ondemand.gdb[i]);
        if (rc)
            log_warn("A2412", "stacks on demand: local_rank %d to %s: %s", i, part,
                     cddp_strerror(rc));
        a->ondemand.pending += a->ondemand.gdb[i] > 0;
    }
    log_info("A2413", "[%s] capturing the stacks of %d running workers into %s", a->cfg->role,
             running, a->ondemand.path);
    if (a->ondemand.pending == 0)
        ondemand_finish(a); /* no gdb: /proc's part is all there is */
    else
        uv_timer_start(&a->ondemand.timer, on_ondemand_timeout, STACKS_TIMEOUT_MS, 0);
    return 0;
}

static void on_watchdog_timer(uv_timer_t *t);

/* The timer follows the watchdog's next deadline, only while the group runs. */
static void watchdog_arm(struct agent *a)
{
    if (!a->handles_open || a->cfg->watchdog.mode == WATCHDOG_OFF)
        return;
    uint64_t d =
        a->pol.state == AGENT_RUNNING && a->stacks_rank < 0 ? watchdog_next_deadline(&a->wd) : 0;
    if (d == 0) {
        uv_timer_stop(&a->watchdog_timer);
        return;
    }
    uv_update_time(&a->loop);
    uint64_t now = cddp_mono_ms();
    uv_timer_start(&a->watchdog_timer, on_watchdog_timer, d > now ? d - now + 1 : 0, 0);
}

static void on_watchdog_timer(uv_timer_t *t)
{
    struct agent *a = t->data;
    uint64_t now = cddp_mono_ms();
    if (a->stacks_rank >= 0)
        return; /* already stopping a hung group */
    int i = a->pol.state == AGENT_RUNNING ? watchdog_hung(&a->wd, now) : -1;
    if (i < 0) {
        watchdog_arm(a); /* early (the loop's clock lags), or nothing to do */
        return;
    }
    struct agent_worker *w = &a->workers[i];
    const struct watchdog_worker *ww = &a->wd.w[i];
    uint64_t timeout = watchdog_timeout(&a->wd, i);
    char last[64] = "before its first progress line";
    if (ww->lines > 0 && ww->has_step)
        snprintf(last, sizeof(last), "after step %lld", (long long)ww->last_step);
    else if (ww->lines > 0)
        snprintf(last, sizeof(last), "after %llu progress lines", (unsigned long long)ww->lines);
    uint64_t since = now - (ww->lines > 0 ? ww->last_ms : ww->started_ms);
    snprintf(w->hang_note, sizeof(w->hang_note),
             "watchdog: no progress for %.1f s %s (timeout %.1f s, %s%s); the worker group was "
             "stopped",
             (double)since / 1000.0, last, (double)timeout / 1000.0,
             ww->lines == 0 ? "--watchdog_initial" : watchdog_mode_name(a->cfg->watchdog.mode),
             ww->lines > 0 && a->cfg->watchdog.mode == WATCHDOG_AUTO && ww->learned_ms == 0
                 ? ", warming up"
                 : "");
    w->hung_at = cddp_wall_time();
    w->exit_seq = ++a->exit_seq; /* found before the exits the stop causes: the root cause */
    a->watchdog_kills++;
    log_error("A0901", "[%s] local_rank %d (pid %d) is hung: %s", a->cfg->role, i, (int)w->pgid,
              w->hang_note);
    capture_stacks(a, i);
    if (a->stacks_pid == 0)
        stacks_done(a);
}

void agent_progress(struct agent *a, int local_rank, const struct progress_report *r,
                    uint64_t now_ms)
{
    if (a == NULL || a->shutting_down || local_rank < 0 || local_rank >= a->nworkers)
        return;
    if ((r->fields & PROGRESS_STEP) && r->step > a->pol.best_step && a->pol.max_no_progress > 0) {
        struct policy_event ev = {.type = POLICY_EV_PROGRESS, .step = r->step};
        post_event(a, &ev);
    }
    if (a->cfg->watchdog.mode == WATCHDOG_OFF)
        return;
    uint64_t before = watchdog_timeout(&a->wd, local_rank);
    bool learned =
        watchdog_report(&a->wd, local_rank, now_ms, (r->fields & PROGRESS_STEP) != 0, r->step);
    uint64_t after = watchdog_timeout(&a->wd, local_rank);
    if (learned)
        log_info("A0902",
                 "[%s] watchdog: local_rank %d's timeout is now %.3f s (longest interval %.3f s x "
                 "%g)",
                 a->cfg->role, local_rank, (double)after / 1000.0,
                 (double)a->wd.w[local_rank].max_interval_ms / 1000.0, a->wd.cfg.safety);
    watchdog_arm(a);
    if (before != after && !a->dispatching)
        notify(a); /* /status shows the timeout that applies */
}

/* ---- rendezvous callbacks ---- */

static void on_round(struct agent_rdzv *r, int status, const struct agent_round *round,
                     const char *reason)
{
    struct agent *a = r->data;
    if (status != 0) {
        struct policy_event ev = {.type = POLICY_EV_ROUND_FAILED, .graceful = r->was_waiting};
        if (r->was_waiting)
            log_warn("A0106",
                     "[%s] the job ended while this node waited for a place (%s); nothing ran "
                     "here",
                     a->cfg->role, reason ? reason : "closed");
        else
            agent_failed(a, "A0101", "rendezvous failed: %s",
                         reason ? reason : cddp_strerror(status));
        post_event(a, &ev);
        return;
    }
    a->round = *round;
    a->have_round = true;
    if (store_for_round(a, &a->round) != 0) {
        post(a, POLICY_EV_ROUND_FAILED, 0, 0, 0);
        return;
    }
    log_info("A0102",
             "[%s] rendezvous complete: round %llu, group_rank=%d group_world_size=%d "
             "world_size=%d master=%s:%d restart_count=%lld",
             a->cfg->role, (unsigned long long)round->round, round->node_rank, round->nnodes,
             round->world_size, round->master_addr, round->master_port,
             (long long)round->restart_count);
    if (a->pol.coordinated && round->restart_count > a->cfg->max_restarts)
        agent_failed(a, "A0107",
                     "[%s] worker groups of this job failed %lld times and max_restarts is %d: no "
                     "restarts left",
                     a->cfg->role, (long long)round->restart_count, a->cfg->max_restarts);
    struct policy_event ev = {.type = POLICY_EV_ROUND, .restart_count = round->restart_count};
    post_event(a, &ev);
}

static void on_rdzv_restart(struct agent_rdzv *r, const char *reason, bool counted)
{
    struct agent *a = r->data;
    log_warn("A0103", "[%s] %s; will restart worker group in a new round%s", a->cfg->role,
             reason ? reason : "membership changed",
             counted ? " (counts against --max_restarts)" : "");
    post(a, POLICY_EV_RDZV_RESTART, 0, 0, 0);
}

static void on_rdzv_closed(struct agent_rdzv *r, int status, const char *reason)
{
    struct agent *a = r->data;
    if (status == 0 && a->pol.state == AGENT_EXIT_BARRIER)
        log_info("A0108", "the rendezvous closed: %s", reason ? reason : "closed");
    else if (status == 0)
        agent_failed(a, "A0104", "the rendezvous closed: %s", reason ? reason : "closed");
    else
        agent_failed(a, "A0109", "lost the rendezvous: %s",
                     reason ? reason : cddp_strerror(status));
    post(a, POLICY_EV_RDZV_CLOSED, 0, 0, 0);
}

/* The connection, the wait list or the hosted server changed: show it. */
static void on_rdzv_info(struct agent_rdzv *r)
{
    struct agent *a = r->data;
    if (a->dispatching)
        a->changed = true; /* shown when the events in hand are done */
    else
        notify(a);
}

static void on_barrier(struct agent_rdzv *r, int status)
{
    struct agent *a = r->data;
    if (status != 0)
        log_error("A0105", "Error waiting on exit barrier: %s", cddp_strerror(status));
    post(a, POLICY_EV_BARRIER_DONE, 0, status, 0);
}

/* ---- workers ---- */

/* --numa_binding: each local rank's CPUs and memory nodes, planned once
 * from sysfs (agent/numa.h) and logged; on a machine with one NUMA node
 * nothing is bound, and that is said once. */
static int plan_numa(struct agent *a)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        CPU_ZERO(&allowed);
    a->numa = calloc((size_t)a->nworkers, sizeof(*a->numa));
    if (a->numa == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    for (int i = 0; i < a->nworkers; i++) {
        char why[512] = "";
        int rc = agent_numa_plan("", a->cfg->numa_binding, i, cvd, &allowed, &a->numa[i], why,
                                 sizeof(why));
        if (rc) {
            agent_failed(a, "A2204", "%s", why);
            return rc;
        }
        if (!a->numa[i].bind) {
            log_warn("A2203", "%s", why);
            free(a->numa);
            a->numa = NULL;
            return 0;
        }
        log_info("A2202", "--numa_binding=%s: local_rank %d: %s", a->cfg->numa_binding, i, why);
    }
    return 0;
}

static int open_dest(struct agent *a, int local_rank, int stream, const char *path,
                     const char *prefix, int *fd)
{
    *fd = -1;
    switch (agent_stream_dest(a->cfg, a->logs.devnull, local_rank, stream)) {
    case AGENT_DEST_INHERIT:
        return 0;
    case AGENT_DEST_FILE:
        *fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        return *fd < 0 ? CDDP_ERR_FROM_ERRNO(errno) : 0;
    case AGENT_DEST_DEVNULL:
        *fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
        return *fd < 0 ? CDDP_ERR_FROM_ERRNO(errno) : 0;
    case AGENT_DEST_TEE:
        return agent_tee_open(&a->tees, path, stream, prefix, fd);
    }
    return 0;
}

/* --duplicate_std{out,err}_filters: this attempt's filtered_std{out,err}.log
 * (torchrun's DefaultLogsSpecs puts them beside the local ranks' folders). */
static void open_filtered(struct agent *a)
{
    static const char *const names[2] = {"filtered_stdout.log", "filtered_stderr.log"};
    for (int k = 0; k < 2; k++) {
        int fd = -1;
        char dir[4096], path[4200];
        if (a->cfg->ndup_filters[k] > 0 && !a->logs.devnull &&
            agent_logs_path(&a->logs, a->attempt, -1, NULL, dir, sizeof(dir)) == 0) {
            snprintf(path, sizeof(path), "%s/%s", dir, names[k]);
            fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0666);
            if (fd < 0)
                log_warn("A2201", "%s: %s (no lines are duplicated there)", path, strerror(errno));
        }
        agent_tee_set_filtered(&a->tees, k + 1, fd, a->cfg->dup_filters[k],
                               a->cfg->ndup_filters[k]);
    }
}

/* The worker has its copies of the hook's fds (or will never get them). */
static void release_extras(struct agent_worker_extras *x)
{
    for (int k = 0; x->close_fds && k < x->nfds; k++) {
        if (x->fds[k] >= 0)
            close(x->fds[k]);
        x->fds[k] = -1;
    }
}

static int start_worker(struct agent *a, int i)
{
    struct agent_worker *w = &a->workers[i];
    struct agent_env_spec spec;
    memset(&spec, 0, sizeof(spec));
    int rc = agent_worker_ranks(&a->round, a->nworkers, i, &spec.ranks);
    if (rc) {
        log_error("A0201", "round %llu cannot hold %d workers (world_size %d, rank offset %d)",
                  (unsigned long long)a->round.round, a->nworkers, a->round.world_size,
                  a->round.rank_offset);
        return rc;
    }
    w->info.local_rank = i;
    w->info.rank = spec.ranks.rank;
    char out_path[4096], err_path[4096];
    agent_logs_path(&a->logs, a->attempt, i, "error.json", w->error_file, sizeof(w->error_file));
    agent_logs_path(&a->logs, a->attempt, i, "stdout.log", out_path, sizeof(out_path));
    agent_logs_path(&a->logs, a->attempt, i, "stderr.log", err_path, sizeof(err_path));

    struct agent_worker_extras extras;
    memset(&extras, 0, sizeof(extras));
    if (a->hooks && a->hooks->prepare_worker) {
        rc = a->hooks->prepare_worker(a->hooks->arg, i, a->attempt, &extras);
        if (rc) {
            log_error("A0202", "preparing local_rank %d: %s", i, cddp_strerror(rc));
            return rc;
        }
    }
    spec.role = a->cfg->role;
    spec.master_addr = a->round.master_addr;
    spec.master_port = a->round.master_port;
    spec.restart_count = a->attempt;
    spec.max_restarts = a->cfg->max_restarts;
    spec.run_id = a->round.run_id;
    spec.use_agent_store = a->round.use_agent_store != 0;
    spec.error_file = w->error_file;
    spec.extra = extras.env;
    spec.nextra = extras.nenv;
    spec.virtual_local_rank = a->cfg->virtual_local_rank;
    spec.rdzv_round = a->round.round;
    struct launch_kv more[AGENT_EXTRA_MAX + 1];
    if (a->filetimer && extras.nenv < AGENT_EXTRA_MAX + 1) {
        memcpy(more, extras.env, sizeof(extras.env[0]) * (size_t)extras.nenv);
        more[extras.nenv] = (struct launch_kv){"TORCHELASTIC_TIMER_FILE", a->filetimer_path};
        spec.extra = more;
        spec.nextra = extras.nenv + 1;
    }
    struct agent_env env;
    if ((rc = agent_env_build(environ, &spec, &env)) != 0) {
        release_extras(&extras);
        return rc;
    }

    char prefix[128];
    agent_log_prefix(a->cfg->prefix_template, a->cfg->role, spec.ranks.rank, i, prefix,
                     sizeof(prefix));
    int out_fd = -1, err_fd = -1;
    rc = open_dest(a, i, 1, out_path, prefix, &out_fd);
    if (rc == 0)
        rc = open_dest(a, i, 2, err_path, prefix, &err_fd);
    pid_t pid = 0;
    if (rc == 0) {
        struct agent_spawn sp = {
            .path = a->cfg->program,
            .argv = a->cfg->argv,
            .envp = env.envp,
            .fd_out = out_fd,
            .fd_err = err_fd,
            .keep_fds = extras.fds,
            .nkeep = extras.nfds,
            .ignored = &a->inherited_ignored,
            .cpus = a->numa ? &a->numa[i].cpus : NULL,
            .mems = a->numa ? a->numa[i].mems : NULL,
            .mems_bits = AGENT_NUMA_MAX_NODES,
        };
        rc = agent_spawn(&sp, &pid);
    }
    if (out_fd >= 0)
        close(out_fd);
    if (err_fd >= 0)
        close(err_fd);
    release_extras(&extras);
    agent_env_free(&env);
    if (rc) {
        log_error("A0203", "starting local_rank %d (%s): %s", i, a->cfg->program,
                  cddp_strerror(rc));
        return rc;
    }
    w->pgid = pid;
    w->leader_alive = true;
    w->group_alive = true;
    w->info.pid = pid;
    w->info.exitcode = 0;
    w->info.exit_time = 0;
    if (w->info.start_time != 0)
        w->info.restarts++;
    w->info.start_time = cddp_wall_time();
    w->info.hung = false;
    w->hang_note[0] = '\0';
    watchdog_start(&a->wd, i, cddp_mono_ms());
    if (agent_guardian_add(&a->guardian, pid) != 0)
        log_warn("A0204", "the guardian is gone; it is restarted when its exit is seen");
    log_debug("A0205", "started local_rank %d rank %d pid %d", i, spec.ranks.rank, (int)pid);
    return 0;
}

static void start_workers(struct agent *a)
{
    a->attempt = policy_restart_count(&a->pol);
    agent_filetimer_reset(a->filetimer); /* the old attempt's pids are gone */
    char why[512] = "";
    int rc = agent_logs_attempt(&a->logs, a->attempt, a->nworkers, why, sizeof(why));
    if (rc)
        log_error("A0206", "%s", why[0] ? why : cddp_strerror(rc));
    if (rc == 0)
        open_filtered(a);
    log_info("A0207", "[%s] starting %d workers (attempt %d, restart count %d/%d)", a->cfg->role,
             a->nworkers, a->attempt, a->attempt, a->cfg->max_restarts);
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        if (rc == 0 && start_worker(a, i) == 0)
            continue;
        /* Could not start: counts as a failed worker (exit code 1); nothing
         * runs in its group. */
        rc = rc ? rc : -1;
        w->pgid = 0;
        w->leader_alive = false;
        w->group_alive = false;
        w->info.pid = 0;
        w->info.exitcode = 1;
        w->info.exit_time = cddp_wall_time();
        w->info.exits++;
        w->exit_seq = ++a->exit_seq;
        struct policy_event ev = {
            .type = POLICY_EV_WORKER_EXIT, .local_rank = i, .exitcode = 1, .group_empty = true};
        post_event(a, &ev);
        rc = 0; /* try the others: the policy stops them anyway */
    }
}

/* ---- workers stuck at exit ---- */

/* How long SIGKILL gets before the processes it did not end are given up:
 * the shutdown timeout again, at least this (a GPU process's teardown can
 * take seconds), at most the ceiling. */
#define KILL_WAIT_MIN_MS 5000
#define KILL_WAIT_MAX_MS 60000

static uint64_t kill_wait_ms(const struct agent *a)
{
    uint64_t t = a->cfg->shutdown_timeout_ms;
    return t < KILL_WAIT_MIN_MS ? KILL_WAIT_MIN_MS : t > KILL_WAIT_MAX_MS ? KILL_WAIT_MAX_MS : t;
}

/* SIGKILL was sent and some group is still not empty: what is left cannot
 * be killed (a process in uninterruptible sleep, D: a hung mount or driver).
 * Waiting on would hang the agent (pytorch/pytorch#185414), so each one is
 * reported with its /proc state and the group is treated as gone: the
 * restart or the exit goes on. The processes stay the agent's children and
 * are reaped if they ever end. */
static void on_kill_wait(uv_timer_t *t)
{
    struct agent *a = t->data;
    if (a->pol.state != AGENT_KILLING)
        return;
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        if (!w->group_alive || w->pgid <= 0)
            continue;
        char procs[1024];
        int n = agent_stacks_describe_group(w->pgid, procs, sizeof(procs));
        if (n == 0 && !agent_group_alive(w->pgid) && !w->leader_alive)
            continue; /* emptied just now; its GROUP_EMPTY comes */
        log_error("A2414",
                  "[%s] local_rank %d: %d process%s of group %d still there %.1f s after SIGKILL, "
                  "not waited for any longer: %s",
                  a->cfg->role, i, n, n == 1 ? "" : "es", (int)w->pgid,
                  (double)kill_wait_ms(a) / 1000.0, procs[0] ? procs : "(gone from /proc)");
        bool leader = w->leader_alive;
        w->leader_alive = false; /* its exit, if it ever comes, is not this attempt's */
        w->group_alive = false;
        agent_guardian_remove(&a->guardian, w->pgid);
        if (leader) {
            watchdog_exit(&a->wd, i);
            w->info.exitcode = -SIGKILL;
            w->info.exit_time = cddp_wall_time();
            w->info.exits++;
            w->exit_seq = ++a->exit_seq;
            struct policy_event ev = {.type = POLICY_EV_WORKER_EXIT,
                                      .local_rank = i,
                                      .exitcode = -SIGKILL,
                                      .group_empty = true};
            post_event(a, &ev);
        } else {
            post(a, POLICY_EV_GROUP_EMPTY, i, 0, 0);
        }
    }
}

static void signal_groups(struct agent *a, int sig)
{
    if (sig == SIGKILL && a->handles_open)
        uv_timer_start(&a->kill_wait, on_kill_wait, kill_wait_ms(a), 0);
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        if (!w->group_alive || w->pgid <= 0)
            continue;
        if (w->leader_alive) {
            if (sig == SIGKILL)
                log_warn("A0208",
                         "Unable to shutdown process %d via the stop signal, forcefully "
                         "exiting via SIGKILL",
                         (int)w->pgid);
            else
                log_warn("A0209", "Sending process %d closing signal %s", (int)w->pgid,
                         cddp_signal_name(sig));
        }
        int rc = agent_signal_group(w->pgid, sig);
        /* A worker forked a moment ago may not have made its group yet
         * (setsid runs in the child): signal the process itself. Its pid
         * cannot have been reused: it is not reaped. */
        if (rc == 0 && w->leader_alive && !agent_group_alive(w->pgid) && kill(w->pgid, sig) != 0 &&
            errno != ESRCH)
            rc = CDDP_ERR_FROM_ERRNO(errno);
        if (rc)
            log_warn("A0210", "signalling process group %d: %s", (int)w->pgid, cddp_strerror(rc));
    }
}

static const char *entry_name(const struct launch_config *cfg)
{
    /* torchrun's _get_entrypoint_name: the script or module for python, the
     * binary as given, the function's name for --run_path. */
    return cfg->kind == LAUNCH_RUN_PATH ? "run_script_path" : cfg->entrypoint;
}

static void failure_report(struct agent *a)
{
    int n = 0;
    struct agent_failure *f = calloc((size_t)a->nworkers, sizeof(*f));
    if (f == NULL) {
        log_crit("A0301", "out of memory building the failure report");
        return;
    }
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        if (w->info.exitcode == 0 && w->hang_note[0] == '\0')
            continue;
        f[n].local_rank = i;
        f[n].rank = w->info.rank;
        f[n].pid = (int)w->info.pid;
        f[n].exitcode = w->info.exitcode;
        f[n].observed = w->info.exit_time;
        f[n].seq = w->exit_seq;
        if (w->hang_note[0]) {
            f[n].observed = w->hung_at;
            f[n].watchdog = w->hang_note;
        }
        agent_failure_load(&f[n], w->error_file);
        n++;
    }
    if (n == 0) {
        free(f);
        return;
    }
    char host[256];
    cddp_fqdn(host, sizeof(host));
    struct cddp_buf table;
    cddp_buf_init(&table, 256u << 20);
    int root = agent_failure_root(f, n);
    if (agent_failure_table(a->entry_name, f, n, host, &table) == 0) {
        /* torchrun prints it as the uncaught ChildFailedError's message. */
        cddp_buf_append(&table, "\n", 1);
        const char *p = table.data;
        size_t len = table.len;
        while (len > 0) {
            ssize_t wr = write(2, p, len);
            if (wr < 0 && errno == EINTR)
                continue;
            if (wr <= 0)
                break;
            p += wr;
            len -= (size_t)wr;
        }
    }
    if (a->cfg->error_file) {
        int rc = agent_write_error_file(a->cfg->error_file, &f[root], a->entry_name, table.data);
        if (rc)
            log_error("A0302", "writing the agent's error file %s: %s", a->cfg->error_file,
                      cddp_strerror(rc));
        else
            log_info("A0303", "dumped error file to parent's %s", a->cfg->error_file);
    }
    cddp_buf_free(&table);
    for (int i = 0; i < n; i++)
        agent_failure_free(&f[i]);
    free(f);
}

/* Processes a worker started outside its own process group (a daemon that
 * called setsid) are re-parented to the agent (a subreaper) once their parent
 * is gone; killpg cannot reach them. When a group of workers has been fully
 * stopped, whatever child of ours is left, other than the guardian, is one of
 * those: it does not outlive the attempt. */
static void kill_strays(struct agent *a)
{
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == NULL)
        return;
    struct dirent *t;
    while ((t = readdir(tasks)) != NULL) {
        if (t->d_name[0] == '.')
            continue;
        char path[300];
        snprintf(path, sizeof(path), "/proc/self/task/%s/children", t->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        long pid;
        while (fscanf(f, "%ld", &pid) == 1) {
            if (pid <= 0 || pid == a->guardian.pid)
                continue;
            char state = '?';
            pid_t pgrp;
            if (agent_proc_stat((pid_t)pid, &state, &pgrp) == 0 && state == 'D') {
                kill((pid_t)pid, SIGKILL); /* stuck at exit: A2414 said so; again, quietly */
                continue;
            }
            log_warn("A0506",
                     "killing process %ld, left behind by a worker outside its process group", pid);
            kill(-(pid_t)pid, SIGKILL); /* its own group, if it leads one */
            kill((pid_t)pid, SIGKILL);
        }
        fclose(f);
    }
    closedir(tasks);
}

/* ---- actions ---- */

static void arm_deadline(struct agent *a, uint64_t deadline_ms);

static void on_deadline(uv_timer_t *t)
{
    struct agent *a = t->data;
    /* libuv counts from the loop's cached time, which can lag the clock the
     * policy reads: a tick that comes early is re-armed, never dropped. */
    if (a->pol.deadline_ms && cddp_mono_ms() < a->pol.deadline_ms) {
        arm_deadline(a, a->pol.deadline_ms);
        return;
    }
    post(a, POLICY_EV_DEADLINE, 0, 0, 0);
}

static void arm_deadline(struct agent *a, uint64_t deadline_ms)
{
    uv_update_time(&a->loop);
    uint64_t now = cddp_mono_ms();
    uint64_t delay = deadline_ms > now ? deadline_ms - now : 0;
    uv_timer_start(&a->deadline, on_deadline, delay + (delay ? 1 : 0), 0);
}

/* How this node leaves the rendezvous, and what the others are told. */
static void rdzv_farewell(struct agent *a, const struct policy_action *act)
{
    a->rdzv_how = act->end_job    ? AGENT_RDZV_END_JOB
                  : act->finished ? AGENT_RDZV_FINISHED
                                  : AGENT_RDZV_LEAVE;
    if (a->pol.state == AGENT_SUCCEEDED && act->end_job)
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason), "the job finished");
    else if (act->finished && a->pol.state == AGENT_SUCCEEDED)
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason),
                 "%s: its workers succeeded; the exit barrier ended without every node",
                 a->this_node);
    else if (act->end_job)
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason),
                 "%s: worker groups failed and no restarts are left (max_restarts=%d)",
                 a->this_node, a->cfg->max_restarts);
    else if (a->pol.state == AGENT_TERMINATED)
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason), "%s received %s", a->this_node,
                 cddp_signal_name(a->pol.term_signal));
    else
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason), "%s failed: %s", a->this_node,
                 a->fail_reason[0] ? a->fail_reason : "the agent failed");
}

static void do_action(struct agent *a, const struct policy_action *act)
{
    switch (act->type) {
    case POLICY_ACT_JOIN: {
        if (act->reason != STOP_NONE)
            kill_strays(a);
        if (act->reason == STOP_FAILURE && act->attempts_left < 0)
            log_warn("A0406",
                     "[%s] Worker group FAILED. 0/%d attempts left; joining the next round, "
                     "which ends the job unless the failure does not count (a node was lost "
                     "first)",
                     a->cfg->role, a->cfg->max_restarts);
        else if (act->reason == STOP_FAILURE)
            log_warn("A0401",
                     "[%s] Worker group FAILED. %d/%d attempts left; will restart worker group",
                     a->cfg->role, act->attempts_left + 1, a->cfg->max_restarts);
        else if (act->reason == STOP_MEMBERSHIP) {
            log_warn("A0402", "[%s] membership changed; will restart worker group", a->cfg->role);
            a->membership_restarts++;
        }
        struct agent_join req = {
            .local_world_size = a->nworkers,
            .role = a->cfg->role,
            .restart_count = policy_restart_count(&a->pol),
        };
        /* A new round gets a fresh store; where our port is published at
         * join, the store listens on it before anyone can hear of it. */
        store_close(a, "a new round");
        if (a->cfg->agent_store && a->rdzv->picks_master_port) {
            char why[256] = "";
            int src = store_open(a, 0, why, sizeof(why));
            if (src) {
                agent_failed(a, "A0803", "[%s] cannot serve the agent's TCPStore: %s", a->cfg->role,
                             why[0] ? why : cddp_strerror(src));
                post(a, POLICY_EV_ROUND_FAILED, 0, 0, 0);
                break;
            }
            req.master_port = a->store_port;
        }
        int rc = a->rdzv->ops->join(a->rdzv, &req, on_round);
        if (rc) {
            agent_failed(a, "A0403", "joining the rendezvous: %s", cddp_strerror(rc));
            post(a, POLICY_EV_ROUND_FAILED, 0, 0, 0);
        }
        break;
    }
    case POLICY_ACT_START_WORKERS:
        start_workers(a);
        break;
    case POLICY_ACT_SIGNAL_GROUPS:
        signal_groups(a, act->sig);
        break;
    case POLICY_ACT_SET_DEADLINE:
        arm_deadline(a, act->deadline_ms);
        break;
    case POLICY_ACT_CLEAR_DEADLINE:
        uv_timer_stop(&a->deadline);
        break;
    case POLICY_ACT_REPORT_FAILURE: {
        int rc = a->rdzv->ops->report_failure(a->rdzv, policy_restart_count(&a->pol));
        if (rc)
            log_warn("A0404", "telling the rendezvous about the failure: %s", cddp_strerror(rc));
        break;
    }
    case POLICY_ACT_EXIT_BARRIER: {
        kill_strays(a);
        int rc = a->rdzv->ops->exit_barrier(a->rdzv, a->cfg->exit_barrier_timeout_ms, on_barrier);
        if (rc) {
            log_error("A0105", "Error waiting on exit barrier: %s", cddp_strerror(rc));
            post(a, POLICY_EV_BARRIER_DONE, 0, rc, 0);
        }
        break;
    }
    case POLICY_ACT_FAILURE_REPORT:
        failure_report(a);
        a->reported = true;
        break;
    case POLICY_ACT_EXIT:
        if (a->pol.no_progress_stop)
            agent_failed(a, "A0903",
                         "[%s] stopping the job: %d restarts in a row failed before any worker "
                         "reported a step beyond %lld (--max_no_progress_restarts=%d)",
                         a->cfg->role, a->pol.no_progress_streak, (long long)a->pol.attempt_base,
                         a->cfg->max_no_progress_restarts);
        kill_strays(a);
        a->exit_code = act->exit_code;
        rdzv_farewell(a, act);
        if (act->exit_code == CDDP_EXIT_OK)
            log_info("A0405", "[%s] worker group successfully finished", a->cfg->role);
        agent_shutdown(a);
        break;
    }
}

/* ---- kernel notifications ---- */

static void check_groups(struct agent *a);

static void on_group_check(uv_timer_t *t)
{
    check_groups(t->data);
}

/* Groups whose leader is gone: empty now? (Only asked after an exit, and on
 * a slow timer while some group outlives its leader.) */
static void check_groups(struct agent *a)
{
    bool waiting = false;
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        if (w->leader_alive || !w->group_alive)
            continue;
        if (agent_group_alive(w->pgid)) {
            waiting = true;
            continue;
        }
        w->group_alive = false;
        agent_guardian_remove(&a->guardian, w->pgid);
        post(a, POLICY_EV_GROUP_EMPTY, i, 0, 0);
    }
    if (a->shutting_down)
        return;
    if (waiting && !uv_is_active((uv_handle_t *)&a->group_check))
        uv_timer_start(&a->group_check, on_group_check, GROUP_CHECK_MS, GROUP_CHECK_MS);
    else if (!waiting)
        uv_timer_stop(&a->group_check);
}

static void restart_guardian(struct agent *a)
{
    agent_guardian_stop(&a->guardian); /* closes our end; the pid is already reaped */
    if (a->shutting_down)
        return;
    int rc = agent_guardian_start(&a->guardian);
    if (rc) {
        log_error("A0501", "restarting the guardian: %s; workers may outlive a killed agent",
                  cddp_strerror(rc));
        return;
    }
    for (int i = 0; i < a->nworkers; i++) {
        if (a->workers[i].group_alive && a->workers[i].pgid > 0)
            agent_guardian_add(&a->guardian, a->workers[i].pgid);
    }
}

static void on_sigchld(uv_signal_t *h, int signum)
{
    struct agent *a = h->data;
    (void)signum;
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid <= 0)
            break;
        if (ondemand_reaped(a, pid))
            continue;
        if (pid == a->stacks_pid && pid > 0) {
            a->stacks_pid = 0; /* reaped: not killed again */
            stacks_done(a);
            continue;
        }
        if (pid == a->guardian.pid) {
            log_warn("A0502", "the guardian (pid %d) exited; starting a new one", (int)pid);
            a->guardian.pid = 0;
            restart_guardian(a);
            continue;
        }
        struct agent_worker *w = NULL;
        int i;
        for (i = 0; i < a->nworkers; i++) {
            if (a->workers[i].leader_alive && a->workers[i].pgid == pid) {
                w = &a->workers[i];
                break;
            }
        }
        if (w == NULL)
            continue; /* a worker's descendant, re-parented to us (subreaper) */
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        w->leader_alive = false;
        watchdog_exit(&a->wd, i);
        w->info.hung = w->hang_note[0] != '\0';
        w->info.exitcode = code;
        w->info.exit_time = cddp_wall_time();
        w->info.exits++;
        w->exit_seq = ++a->exit_seq;
        if (code != 0 && a->pol.state == AGENT_RUNNING)
            log_error("A0503", "failed (exitcode: %d) local_rank: %d (pid: %d) of binary: %s", code,
                      i, (int)pid, a->entry_name);
        else
            log_debug("A0504", "local_rank %d (pid %d) exited with %d", i, (int)pid, code);
        /* Usually nothing else runs in its group: say so with the exit, so
         * the policy does not stop a group that is already gone. */
        struct policy_event ev = {.type = POLICY_EV_WORKER_EXIT, .local_rank = i, .exitcode = code};
        if (!agent_group_alive(w->pgid)) {
            w->group_alive = false;
            agent_guardian_remove(&a->guardian, w->pgid);
            ev.group_empty = true;
        }
        post_event(a, &ev);
    }
    check_groups(a);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct agent *a = h->data;
    log_warn("A0505", "Received %s death signal, shutting down workers", cddp_signal_name(signum));
    post(a, POLICY_EV_SIGNAL, 0, 0, signum);
}

/* ---- start and stop ---- */

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_rdzv_closed_done(struct agent_rdzv *r)
{
    struct agent *a = r->data;
    a->rdzv = NULL; /* freed after this (c10d); snapshots no longer read it */
    /* The other nodes' workers may use the store until the rendezvous is
     * done with them (a hosting agent serves as long as they run). */
    store_close(a, "the agent exits");
}

static void agent_shutdown(struct agent *a)
{
    if (a->shutting_down)
        return;
    a->shutting_down = true;
    /* Every group is empty by now (the policy only exits then); make sure. */
    for (int i = 0; i < a->nworkers; i++) {
        if (a->workers[i].group_alive && a->workers[i].pgid > 0)
            agent_signal_group(a->workers[i].pgid, SIGKILL);
    }
    agent_tee_set_close(&a->tees);
    ondemand_finish(a);                  /* a capture under way ends with what it has */
    agent_filetimer_close(a->filetimer); /* removes the pipe */
    a->filetimer = NULL;
    if (a->hooks && a->hooks->stop)
        a->hooks->stop(a->hooks->arg);
    if (a->handles_open) {
        a->handles_open = false;
        uv_close((uv_handle_t *)&a->sigchld, on_closed);
        for (int i = 0; i < a->nsigs; i++)
            uv_close((uv_handle_t *)&a->sigs[i], on_closed);
        uv_close((uv_handle_t *)&a->deadline, on_closed);
        uv_close((uv_handle_t *)&a->group_check, on_closed);
        uv_close((uv_handle_t *)&a->watchdog_timer, on_closed);
        uv_close((uv_handle_t *)&a->stacks_timer, on_closed);
        uv_close((uv_handle_t *)&a->ondemand.timer, on_closed);
        uv_close((uv_handle_t *)&a->kill_wait, on_closed);
        if (a->rdzv) {
            if (a->rdzv_reason[0] == '\0')
                snprintf(a->rdzv_reason, sizeof(a->rdzv_reason), "%s failed: %s", a->this_node,
                         a->fail_reason[0] ? a->fail_reason : "the agent failed");
            a->rdzv->ops->close(a->rdzv, a->rdzv_how, a->rdzv_reason, on_rdzv_closed_done);
        } else {
            store_close(a, "the agent exits");
        }
    }
}

/* str(uuid.uuid4().int): what torchrun uses for an empty --rdzv_id. */
static void random_run_id(char *out, size_t len)
{
    cddp_uuid4_int(out, len);
}

static int make_round(struct agent *a, struct agent_round *r, char *err, size_t errlen)
{
    const struct launch_config *cfg = a->cfg;
    memset(r, 0, sizeof(*r));
    r->node_rank = cfg->node_rank;
    r->nnodes = 1;
    r->world_size = cfg->nproc_per_node;
    r->rank_offset = 0;
    r->use_agent_store = 0;
    cddp_strlcpy(r->run_id, a->run_id, sizeof(r->run_id));
    /* static: resolved by the launcher (launch_validate) */
    if (cfg->static_addr[0] == '\0' || cfg->static_port <= 0) {
        snprintf(err, errlen, "no static master address (the launcher did not validate)");
        return CDDP_ECONFIG;
    }
    cddp_strlcpy(r->master_addr, cfg->static_addr, sizeof(r->master_addr));
    r->master_port = cfg->static_port;
    return 0;
}

/* The workers' network interface for a job over several hosts: the one
 * the route to the endpoint leaves through (agent/ifname.h). */
static void choose_ifname(struct agent *a, const char *endpoint)
{
    struct cddp_route route;
    int rc = a->cfg->no_ifname ? CDDP_ENOTFOUND : cddp_route_to(endpoint, &route);
    agent_ifname_decide(endpoint, rc, &route, a->cfg->no_ifname, getenv("GLOO_SOCKET_IFNAME"),
                        getenv("NCCL_SOCKET_IFNAME"), &a->ifname);
    log_info("A2101", "%s", a->ifname.why);
    if ((rc = agent_ifname_apply(&a->ifname)) != 0) {
        log_warn("A2102", "setting GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME: %s", cddp_strerror(rc));
        a->ifname.source = AGENT_IFNAME_NONE;
    }
}

/* The rendezvous for cfg: no network for one static node (torchrun's
 * default), cddp's rendezvous otherwise (agent/rdzv_c10d.c). */
static int open_rdzv(struct agent *a, char *why, size_t whylen)
{
    const struct launch_config *cfg = a->cfg;
    int rc;
    bool fixed = strcmp(cfg->rdzv_backend, "static") == 0 && !cfg->standalone;
    if (fixed && cfg->nnodes_max == 1) {
        struct agent_round proto;
        if ((rc = make_round(a, &proto, why, whylen)) != 0)
            return rc;
        if ((rc = agent_rdzv_static_init(&a->rdzv_static, &a->loop, &proto)) != 0)
            return rc;
        a->rdzv = &a->rdzv_static.base;
    } else {
        /* How the other nodes will hear of this one (a DNS lookup: only
         * when there are other nodes). */
        char host[256];
        cddp_fqdn(host, sizeof(host));
        snprintf(a->this_node, sizeof(a->this_node), "%s (pid %d)", host, (int)getpid());
        struct rdzv_conf conf;
        rdzv_conf_init(&conf);
        for (int i = 0; i < cfg->rdzv_conf_len; i++) {
            /* checked by the launcher; a bad one here is still refused */
            rc = rdzv_conf_set(&conf, cfg->rdzv_conf[i].key, cfg->rdzv_conf[i].value, why, whylen);
            if (rc)
                return rc;
        }
        if (strncmp(cfg->rdzv_backend, "etcd", 4) == 0) {
            /* The interface towards the first etcd member, as c10d's
             * towards its endpoint; node 0 offers its address. */
            char ehost[256];
            const char *eaddr = cfg->local_addr;
            if (etcd_first_host(cfg->rdzv_endpoint, ehost, sizeof(ehost)) == 0) {
                choose_ifname(a, ehost);
                if (eaddr == NULL && a->ifname.source == AGENT_IFNAME_AUTO)
                    eaddr = a->ifname.addr;
            }
            struct agent_rdzv_etcd_options eo = {
                .endpoints = cfg->rdzv_endpoint,
                .backend = cfg->rdzv_backend,
                .run_id = a->run_id,
                .min_nodes = cfg->nnodes_min,
                .max_nodes = cfg->nnodes_max,
                .nproc = cfg->nproc_per_node,
                .local_addr = eaddr,
                .conf = &conf,
            };
            if ((rc = agent_rdzv_etcd_new(&a->loop, &eo, &a->rdzv, why, whylen)) != 0)
                return rc;
            goto opened;
        }
        const char *endpoint = fixed ? cfg->static_addr : cfg->rdzv_host;
        if (!cfg->standalone)
            choose_ifname(a, endpoint);
        /* Node 0 publishes the chosen interface's address as MASTER_ADDR. */
        const char *local_addr = cfg->local_addr;
        if (local_addr == NULL && a->ifname.source == AGENT_IFNAME_AUTO)
            local_addr = a->ifname.addr;
        struct agent_rdzv_c10d_options o = {
            .host = endpoint,
            .port = fixed ? cfg->static_port + 1 : cfg->rdzv_port,
            .run_id = a->run_id,
            .min_nodes = cfg->nnodes_min,
            .max_nodes = cfg->nnodes_max,
            .nproc = cfg->nproc_per_node,
            .local_addr = local_addr,
            .conf = &conf,
            .status_port = a->hooks ? a->hooks->status_port : 0,
            .standalone = cfg->standalone,
            .fixed = fixed,
            .node_rank = cfg->node_rank,
            .master_addr = cfg->static_addr,
            .master_port = cfg->static_port,
        };
        if ((rc = agent_rdzv_c10d_new(&a->loop, &o, &a->rdzv, why, whylen)) != 0)
            return rc;
    }
opened:
    a->rdzv->data = a;
    a->rdzv->on_restart = on_rdzv_restart;
    a->rdzv->on_closed = on_rdzv_closed;
    a->rdzv->on_info = on_rdzv_info;
    a->pol.coordinated = a->rdzv->coordinated;
    return 0;
}

/* ---- torch's file timer (agent/filetimer.c serves the pipe) ---- */

/* The local rank whose live worker group holds pid, or -1. */
static int filetimer_owner(void *arg, pid_t pid)
{
    struct agent *a = arg;
    char state;
    pid_t pgrp;
    if (agent_proc_stat(pid, &state, &pgrp) != 0)
        return -1;
    for (int i = 0; i < a->nworkers; i++)
        if (a->workers[i].group_alive && a->workers[i].pgid > 0 && a->workers[i].pgid == pgrp)
            return i;
    return -1;
}

static void filetimer_killed(void *arg, int i, const struct filetimer_kill *k, int err)
{
    struct agent *a = arg;
    struct agent_worker *w = &a->workers[i];
    double late = cddp_wall_time() - k->expiration;
    if (err) {
        log_error("A2408",
                  "[%s] file timer: scope '%s' of pid %lld (local_rank %d) expired; %s: %s",
                  a->cfg->role, k->scope, (long long)k->pid, i, cddp_signal_name(k->signal),
                  strerror(err));
        return;
    }
    log_error("A2409",
              "[%s] file timer: scope '%s' of pid %lld (local_rank %d) expired %.1f s ago; killed "
              "it with %s, as torch's FileTimerServer does",
              a->cfg->role, k->scope, (long long)k->pid, i, late, cddp_signal_name(k->signal));
    if (w->hang_note[0] == '\0') {
        snprintf(
            w->hang_note, sizeof(w->hang_note),
            "file timer: scope '%.200s' expired (expires(after=...) overran by %.1f s); pid %lld "
            "was killed with %s",
            k->scope, late, (long long)k->pid, cddp_signal_name(k->signal));
        w->hung_at = cddp_wall_time();
    }
}

/* TORCHELASTIC_ENABLE_FILE_TIMER=1: serve the pipe at TORCHELASTIC_TIMER_FILE
 * (or a fresh one the workers are told of), as torchrun's agent does. */
static int filetimer_open(struct agent *a, char *why, size_t whylen)
{
    const char *on = getenv("TORCHELASTIC_ENABLE_FILE_TIMER");
    if (on == NULL || strcmp(on, "1") != 0)
        return 0;
    const char *path = getenv("TORCHELASTIC_TIMER_FILE");
    if (path && path[0])
        cddp_strlcpy(a->filetimer_path, path, sizeof(a->filetimer_path));
    else
        agent_filetimer_default_path(a->filetimer_path, sizeof(a->filetimer_path));
    struct agent_filetimer_hooks h = {
        .arg = a, .owner = filetimer_owner, .killed = filetimer_killed};
    int rc = agent_filetimer_open(&a->loop, a->filetimer_path, &h, &a->filetimer, why, whylen);
    if (rc == 0)
        log_info("A2410", "[%s] serving torch's file timer at TORCHELASTIC_TIMER_FILE=%s",
                 a->cfg->role, a->filetimer_path);
    return rc;
}

static int agent_open(struct agent *a)
{
    const struct launch_config *cfg = a->cfg;
    int rc;
    agent_tee_set_init(&a->tees, &a->loop);
    uv_signal_init(&a->loop, &a->sigchld);
    a->sigchld.data = a;
    uv_timer_init(&a->loop, &a->deadline);
    a->deadline.data = a;
    uv_timer_init(&a->loop, &a->group_check);
    a->group_check.data = a;
    uv_timer_init(&a->loop, &a->watchdog_timer);
    a->watchdog_timer.data = a;
    uv_timer_init(&a->loop, &a->stacks_timer);
    a->stacks_timer.data = a;
    uv_timer_init(&a->loop, &a->ondemand.timer);
    a->ondemand.timer.data = a;
    uv_timer_init(&a->loop, &a->kill_wait);
    a->kill_wait.data = a;
    for (int i = 0; i < cfg->nsignals; i++) {
        uv_signal_init(&a->loop, &a->sigs[i]);
        a->sigs[i].data = a;
        a->nsigs++;
    }
    a->handles_open = true;

    rc = uv_signal_start(&a->sigchld, on_sigchld, SIGCHLD);
    for (int i = 0; rc == 0 && i < a->nsigs; i++)
        rc = uv_signal_start(&a->sigs[i], on_signal, cfg->signals[i]);
    if (rc) {
        agent_failed(a, "A0601", "installing signal handlers: %s", uv_strerror(rc));
        return rc;
    }

    if (cfg->rdzv_id[0])
        cddp_strlcpy(a->run_id, cfg->rdzv_id, sizeof(a->run_id));
    else {
        random_run_id(a->run_id, sizeof(a->run_id));
        log_warn("A0602", "config has no run_id, generated a random run_id: %s", a->run_id);
    }
    char why[512] = "";
    if ((rc = open_rdzv(a, why, sizeof(why))) != 0) {
        agent_failed(a, "A0603", "%s", why[0] ? why : cddp_strerror(rc));
        return rc;
    }

    if ((rc = agent_logs_init(&a->logs, cfg->log_dir, a->run_id, why, sizeof(why))) != 0) {
        agent_failed(a, "A0604", "%s", why[0] ? why : cddp_strerror(rc));
        return rc;
    }
    if (!a->logs.devnull)
        log_info("A0605", "log directory set to: %s", a->logs.run_dir);
    if ((rc = filetimer_open(a, why, sizeof(why))) != 0) {
        agent_failed(a, "A2407", "%s", why[0] ? why : cddp_strerror(rc));
        return rc;
    }
    if (a->hooks && a->hooks->attach)
        a->hooks->attach(a->hooks->arg, a);
    if (a->hooks && a->hooks->start && (rc = a->hooks->start(a->hooks->arg, &a->loop)) != 0) {
        agent_failed(a, "A0606", "starting the agent's extensions: %s", cddp_strerror(rc));
        return rc;
    }
    return 0;
}

static void log_config(const struct agent *a)
{
    const struct launch_config *cfg = a->cfg;
    log_info("A0007",
             "Starting elastic_operator with launch configs:\n"
             "  entrypoint       : %s\n"
             "  min_nodes        : %d\n"
             "  max_nodes        : %d\n"
             "  nproc_per_node   : %d\n"
             "  run_id           : %s\n"
             "  rdzv_backend     : %s\n"
             "  rdzv_endpoint    : %s\n"
             "  max_restarts     : %d\n"
             "  log_dir          : %s\n"
             "  shutdown_timeout : %.3f s",
             a->entry_name, cfg->nnodes_min, cfg->nnodes_max, cfg->nproc_per_node, a->run_id,
             cfg->rdzv_backend, cfg->rdzv_endpoint, cfg->max_restarts,
             cfg->log_dir ? cfg->log_dir : "(temporary)",
             (double)cfg->shutdown_timeout_ms / 1000.0);
}

int agent_run(const struct launch_config *cfg, const struct agent_hooks *hooks)
{
    struct agent *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        log_crit("A0002", "out of memory");
        return CDDP_EXIT_FAILURE;
    }
    a->cfg = cfg;
    a->hooks = hooks;
    a->nworkers = cfg->nproc_per_node;
    a->entry_name = entry_name(cfg);
    a->start_time = cddp_wall_time();
    a->exit_code = CDDP_EXIT_FAILURE;
    a->guardian.fd = -1;
    a->stacks_rank = -1;
    a->workers = calloc((size_t)a->nworkers, sizeof(*a->workers));
    int rc = a->workers
                 ? policy_init(&a->pol, a->nworkers, cfg->max_restarts, cfg->shutdown_timeout_ms)
                 : CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (rc == 0)
        rc = watchdog_init(&a->wd, &cfg->watchdog, a->nworkers);
    if (rc == 0 && cfg->numa_binding)
        rc = plan_numa(a);
    a->pol.max_no_progress = cfg->max_no_progress_restarts;
    if (rc == 0) {
        /* Before any worker exists, and before the loop owns signals. */
        agent_inherited_ignored(&a->inherited_ignored);
        signal(SIGPIPE, SIG_IGN);
        if (agent_become_subreaper() != 0)
            log_warn("A0003", "PR_SET_CHILD_SUBREAPER failed: a worker's orphaned children are "
                              "only stopped through its process group");
        rc = agent_guardian_start(&a->guardian);
        if (rc)
            agent_failed(a, "A0004", "starting the guardian: %s", cddp_strerror(rc));
    }
    bool opened = false;
    if (rc == 0) {
        rc = uv_loop_init(&a->loop);
        if (rc)
            agent_failed(a, "A0006", "uv_loop_init: %s", uv_strerror(rc));
    }
    if (rc == 0) {
        opened = true;
        rc = agent_open(a);
    }
    if (rc == 0) {
        log_config(a);
        post(a, POLICY_EV_START, 0, 0, 0);
    } else if (opened) {
        agent_shutdown(a);
    }
    if (opened) {
        uv_run(&a->loop, UV_RUN_DEFAULT);
        if (a->hooks && a->hooks->loop_done) {
            a->hooks->loop_done(a->hooks->arg);
            uv_run(&a->loop, UV_RUN_DEFAULT);
        }
        if (uv_loop_close(&a->loop) != 0)
            log_error("A0005", "handles left open at exit");
    }
    agent_guardian_stop(&a->guardian);
    /* A temporary log directory nobody asked for goes away after a success;
     * after a failure it holds the error files the table points at. */
    bool asked_for_files =
        a->cfg->redirects.is_map || a->cfg->redirects.all || a->cfg->tee.is_map || a->cfg->tee.all;
    if (a->pol.state == AGENT_SUCCEEDED && !asked_for_files)
        agent_logs_remove_tmp(&a->logs);
    agent_logs_free(&a->logs);
    int code = rc ? CDDP_EXIT_FAILURE : a->exit_code;
    if (code == CDDP_EXIT_FAILURE && !a->reported && cfg->error_file) {
        int wrc = agent_write_agent_error(cfg->error_file,
                                          a->fail_reason[0] ? a->fail_reason : "the agent failed");
        if (wrc)
            log_error("A0302", "writing the agent's error file %s: %s", cfg->error_file,
                      cddp_strerror(wrc));
    }
    policy_free(&a->pol);
    watchdog_free(&a->wd);
    free(a->ondemand.gdb);
    free(a->workers);
    free(a->numa);
    free(a->queue);
    free(a);
    return code;
}
