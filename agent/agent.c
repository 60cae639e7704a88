/*
 * agent.c: the agent's libuv loop. It only translates: kernel and rendezvous
 * notifications become policy events (agent/policy.c decides), and the
 * policy's actions become syscalls. Here: the event queue, the workers'
 * starts, signals and exits, stacks on demand, shutdown and agent_run; the
 * rendezvous glue is round.c's, the progress watchdog's progress.c's,
 * --restart_scope=worker's inplace.c's (the map is in agent_int.h). See
 * agent.h.
 */
#include "agent/agent_int.h"

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
#include "common/clock.h"
#include "common/errors.h"
#include "common/fdlimit.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "common/uuid.h"

extern char **environ;

/* How often to look at process groups whose last members are not our
 * children (they can only be seen by asking); only while such groups exist. */
#define GROUP_CHECK_MS 100

static void agent_shutdown(struct agent *a);

void agent_failed(struct agent *a, const char *id, const char *fmt, ...)
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

void agent_goodput_update(struct agent *a, uint64_t now_ms)
{
    const struct agent_policy *p = &a->pol;
    enum goodput_mode m = GOODPUT_MODE_STOPPED;
    switch (p->state) {
    case AGENT_INIT:
        m = GOODPUT_MODE_INIT;
        break;
    case AGENT_RENDEZVOUS:
        m = GOODPUT_MODE_RENDEZVOUS;
        break;
    case AGENT_RUNNING:
        m = GOODPUT_MODE_RUNNING;
        break;
    case AGENT_STOPPING:
    case AGENT_KILLING:
        /* To start again (status.c's RESTARTING), or for good. */
        if (policy_will_restart(p))
            m = GOODPUT_MODE_RESTARTING;
        break;
    default:
        break;
    }
    goodput_mode(&a->gp, m, now_ms);
}

void agent_notify(struct agent *a)
{
    if (a->hooks == NULL || a->hooks->state_changed == NULL)
        return;
    struct agent_worker_info infos[64];
    struct agent_worker_info *w =
        a->nworkers <= 64 ? infos : malloc(sizeof(*w) * (size_t)a->nworkers);
    if (w == NULL)
        return;
    uint64_t now_ms = cddp_mono_ms();
    double now_wall = cddp_wall_time();
    struct goodput_totals gp;
    goodput_totals(&a->gp, now_ms, &gp);
    for (int i = 0; i < a->nworkers; i++) {
        w[i] = a->workers[i].info;
        w[i].state = a->pol.workers[i].state;
        w[i].hung |= a->pol.workers[i].hung; /* found hung, not yet exited */
        w[i].watchdog_timeout_ms = watchdog_timeout(&a->wd, i);
        agent_stragglers_fill(a, i, &w[i], now_ms, now_wall);
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
        .will_restart = policy_will_restart(&a->pol),
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
        .exit_code = policy_finished(&a->pol) ? a->pol.exit_code : -1,
        .goodput_ms = now_ms,
        .watchdog_mode = a->cfg->watchdog.mode,
        .watchdog_kills = a->watchdog_kills,
        .straggler_factor = a->cfg->straggler_factor,
        .step_median_s = a->strag.median_s,
        .step_compute = a->strag.compute,
        .nworkers = a->nworkers,
        .workers = w,
        .ifname = a->ifname.ifname,
        .ifname_addr = a->ifname.addr,
        .ifname_source = agent_ifname_source_name(a->ifname.source),
        .log_dropped_bytes = a->tees.dropped_bytes,
        .log_dropped_files = a->tees.dropped_files,
        .goodput = &gp,
    };
    agent_inplace_snapshot(a, &s);
    a->hooks->state_changed(a->hooks->arg, &s);
    if (w != infos)
        free(w);
}

static void do_action(struct agent *a, const struct policy_action *act);

void agent_post(struct agent *a, enum policy_event_type type, int local_rank, int exitcode, int sig)
{
    struct policy_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.local_rank = local_rank;
    ev.exitcode = exitcode;
    ev.sig = sig;
    agent_post_event(a, &ev);
}

void agent_post_event(struct agent *a, const struct policy_event *in)
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
        uint64_t now = cddp_mono_ms();
        int n = policy_step(&a->pol, &e, now, acts);
        if (n > 0 || before != a->pol.state || e.type == POLICY_EV_WORKER_EXIT)
            a->changed = true;
        agent_goodput_update(a, now);
        for (int i = 0; i < n; i++)
            do_action(a, &acts[i]);
    }
    a->qhead = a->qtail = 0;
    a->dispatching = false;
    agent_watchdog_arm(a);
    if (a->changed) {
        a->changed = false;
        agent_notify(a);
    }
}

void agent_show(struct agent *a)
{
    if (a->dispatching)
        a->changed = true;
    else
        agent_notify(a);
}

/* ---- stacks on demand (agent_capture_stacks) ---- */

/* Every gdb is done (or out of time): one file, rank by rank. */
static void on_ondemand_stacks(struct agent_stacks_job *job)
{
    struct agent *a = job->data;
    if (job->timed_out)
        log_warn("A2411",
                 "stacks on demand: gdb did not finish within %d ms; the capture is incomplete",
                 AGENT_STACKS_TIMEOUT_MS);
    char title[128];
    snprintf(title, sizeof(title),
             "# stacks of every running worker, captured on demand (capture %u)", a->ondemand_seq);
    int rc = agent_stacks_merge(a->ondemand_path, title, a->ondemand_targets, a->nworkers);
    a->ondemand_done(a->ondemand_arg, rc, rc == 0 ? a->ondemand_path : NULL);
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
    if (a->ondemand_targets == NULL &&
        (a->ondemand_targets = calloc((size_t)a->nworkers, sizeof(*a->ondemand_targets))) == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    a->ondemand_seq++;
    if (!a->logs.devnull && a->logs.run_dir)
        snprintf(a->ondemand_path, sizeof(a->ondemand_path), "%s/attempt_%d/stacks-%u.txt",
                 a->logs.run_dir, a->attempt, a->ondemand_seq);
    else
        snprintf(a->ondemand_path, sizeof(a->ondemand_path), "/tmp/cddp-stacks-%d-%u.txt",
                 (int)getpid(), a->ondemand_seq);
    a->ondemand_done = done;
    a->ondemand_arg = arg;
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        struct agent_stacks_target *t = &a->ondemand_targets[i];
        t->pgid = w->leader_alive && w->pgid > 0 ? w->pgid : 0;
        snprintf(t->path, sizeof(t->path), "%s.%d", a->ondemand_path, i);
        snprintf(t->label, sizeof(t->label), "local_rank %d (rank %d, pid %d)", i, w->info.rank,
                 (int)w->info.pid);
    }
    agent_stacks_job_start(&a->ondemand, a->ondemand_targets, a->nworkers, on_ondemand_stacks);
    for (int i = 0; i < a->nworkers; i++) {
        const struct agent_stacks_target *t = &a->ondemand_targets[i];
        if (t->pgid > 0 && t->rc)
            log_warn("A2412", "stacks on demand: local_rank %d to %s: %s", i, t->path,
                     cddp_strerror(t->rc));
    }
    log_info("A2413", "[%s] capturing the stacks of %d running workers into %s", a->cfg->role,
             running, a->ondemand_path);
    return 0;
}

/* ---- workers ---- */

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
void agent_worker_release_extras(struct agent_worker_extras *x)
{
    for (int k = 0; x->close_fds && k < x->nfds; k++) {
        if (x->fds[k] >= 0)
            close(x->fds[k]);
        x->fds[k] = -1;
    }
}

int agent_worker_env(struct agent *a, int i, const char *error_file,
                     const struct agent_worker_extras *extras, struct agent_env *env, int *rank)
{
    struct agent_env_spec spec;
    memset(&spec, 0, sizeof(spec));
    int rc = agent_worker_ranks(&a->round, a->nworkers, i, &spec.ranks);
    if (rc) {
        log_error("A0201", "round %llu cannot hold %d workers (world_size %d, rank offset %d)",
                  (unsigned long long)a->round.round, a->nworkers, a->round.world_size,
                  a->round.rank_offset);
        return rc;
    }
    *rank = spec.ranks.rank;
    spec.role = a->cfg->role;
    spec.master_addr = a->round.master_addr;
    spec.master_port = a->round.master_port;
    spec.restart_count = a->attempt;
    spec.max_restarts = a->cfg->max_restarts;
    spec.run_id = a->round.run_id;
    spec.use_agent_store = a->round.use_agent_store != 0;
    spec.error_file = error_file;
    spec.virtual_local_rank = a->cfg->virtual_local_rank;
    spec.rdzv_round = a->round.round;
    spec.pythonpath_first = a->cfg->kind != LAUNCH_BINARY ? a->cfg->auto_progress_dir : NULL;
    struct launch_kv more[AGENT_EXTRA_MAX + 3];
    char generation[24];
    int nmore = 0;
    if (extras) {
        memcpy(more, extras->env, sizeof(extras->env[0]) * (size_t)extras->nenv);
        nmore = extras->nenv;
    }
    if (a->filetimer)
        more[nmore++] = (struct launch_kv){"TORCHELASTIC_TIMER_FILE", a->filetimer_path};
    nmore = agent_inplace_env(a, more, nmore, generation, sizeof(generation));
    spec.extra = more;
    spec.nextra = nmore;
    return agent_env_build(environ, &spec, env);
}

int agent_worker_stdio(struct agent *a, int i, int *out_fd, int *err_fd)
{
    char out_path[4096], err_path[4096], prefix[128];
    agent_logs_path(&a->logs, a->attempt, i, "stdout.log", out_path, sizeof(out_path));
    agent_logs_path(&a->logs, a->attempt, i, "stderr.log", err_path, sizeof(err_path));
    agent_log_prefix(a->cfg->prefix_template, a->cfg->role, a->workers[i].info.rank, i, prefix,
                     sizeof(prefix));
    *err_fd = -1;
    int rc = open_dest(a, i, 1, out_path, prefix, out_fd);
    if (rc == 0)
        rc = open_dest(a, i, 2, err_path, prefix, err_fd);
    return rc;
}

int agent_worker_prepare(struct agent *a, int i, struct agent_worker_extras *extras,
                         struct agent_env *env)
{
    struct agent_worker *w = &a->workers[i];
    agent_logs_path(&a->logs, a->attempt, i, "error.json", w->error_file, sizeof(w->error_file));
    memset(extras, 0, sizeof(*extras));
    int rc;
    if (a->hooks && a->hooks->prepare_worker) {
        rc = a->hooks->prepare_worker(a->hooks->arg, i, a->attempt, extras);
        if (rc) {
            log_error("A0202", "preparing local_rank %d: %s", i, cddp_strerror(rc));
            return rc;
        }
    }
    int rank;
    if ((rc = agent_worker_env(a, i, w->error_file, extras, env, &rank)) != 0) {
        agent_worker_release_extras(extras);
        return rc;
    }
    w->info.local_rank = i;
    w->info.rank = rank;
    return 0;
}

int agent_start_worker(struct agent *a, int i)
{
    struct agent_worker *w = &a->workers[i];
    struct agent_worker_extras extras;
    struct agent_env env;
    int rc = agent_worker_prepare(a, i, &extras, &env);
    if (rc)
        return rc;

    int out_fd = -1, err_fd = -1;
    rc = agent_worker_stdio(a, i, &out_fd, &err_fd);
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
    agent_worker_release_extras(&extras);
    agent_env_free(&env);
    if (rc) {
        /* start_workers says it: once for a lack of file descriptors. */
        snprintf(w->start_error, sizeof(w->start_error), "could not start %s: %s", a->cfg->program,
                 cddp_strerror(rc));
        return rc;
    }
    agent_worker_started(a, i, pid);
    return 0;
}

void agent_worker_started(struct agent *a, int i, pid_t pid)
{
    struct agent_worker *w = &a->workers[i];
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
    w->blamed_gen = 0;
    w->blame_note[0] = '\0';
    watchdog_start(&a->wd, i, cddp_mono_ms());
    agent_stragglers_start(a, i);
    if (agent_guardian_add(&a->guardian, pid) != 0)
        log_warn("A0204", "the guardian is gone; it is restarted when its exit is seen");
    log_debug("A0205", "started local_rank %d rank %d pid %d", i, w->info.rank, (int)pid);
}

int agent_attempt_logs(struct agent *a)
{
    char why[512] = "";
    int rc = agent_logs_attempt(&a->logs, a->attempt, a->nworkers, why, sizeof(why));
    if (rc)
        log_error("A0206", "%s", why[0] ? why : cddp_strerror(rc));
    return rc;
}

void agent_log_start_error(const struct agent *a, int i)
{
    if (a->workers[i].start_error[0])
        log_error("A0203", "starting local_rank %d: %s", i, a->workers[i].start_error);
}

/* Local rank i could not start: it counts as a worker that exited 1, and
 * nothing runs in its group. */
void agent_worker_not_started(struct agent *a, int i)
{
    struct agent_worker *w = &a->workers[i];
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
    agent_post_event(a, &ev);
}

static void start_workers(struct agent *a)
{
    a->attempt = policy_restart_count(&a->pol);
    agent_filetimer_reset(a->filetimer); /* the old attempt's pids are gone */
    int rc = agent_attempt_logs(a);
    if (rc == 0)
        open_filtered(a);
    log_info("A0207", "[%s] starting %d workers (attempt %d, restart count %d/%d)", a->cfg->role,
             a->nworkers, a->attempt, a->attempt, a->cfg->max_restarts);
    int out_of_fds = -1; /* the first local rank that found no file descriptor */
    for (int i = 0; i < a->nworkers; i++) {
        struct agent_worker *w = &a->workers[i];
        w->start_error[0] = '\0';
        w->not_started = false;
        if (rc == 0 && out_of_fds < 0) {
            int src = agent_start_worker(a, i);
            if (src == 0)
                continue;
            if (src == CDDP_ERR_FROM_ERRNO(EMFILE) || src == CDDP_ERR_FROM_ERRNO(ENFILE)) {
                /* Every later worker would fail the same way (and each
                 * try opens more): one line, and the rest are not started. */
                out_of_fds = i;
                uint64_t lim = cddp_fdlimit_soft();
                snprintf(w->start_error, sizeof(w->start_error),
                         "could not start: %s (the agent's open-file limit is %llu; raise it "
                         "with ulimit -n)",
                         cddp_strerror(src), (unsigned long long)lim);
                log_error("A0203",
                          "starting local_rank %d (%s): %s: the agent's open-file limit (%llu) "
                          "holds the pipes and log files of %d workers; local_ranks %d..%d are "
                          "not started (raise it with ulimit -n)",
                          i, a->cfg->program, cddp_strerror(src), (unsigned long long)lim, i, i,
                          a->nworkers - 1);
            } else {
                agent_log_start_error(a, i);
            }
        } else if (out_of_fds >= 0) {
            /* Failed for the policy; the table shows the one that says why. */
            w->not_started = true;
        }
        /* Could not start: counts as a failed worker (exit code 1); nothing
         * runs in its group. */
        rc = rc ? rc : -1;
        agent_worker_not_started(a, i);
        rc = 0; /* try the others: the policy stops them anyway */
    }
    agent_spares_fill(a); /* --spare_workers */
}

static const char *entry_name(const struct launch_config *cfg)
{
    /* torchrun's _get_entrypoint_name: the script or module for python, the
     * binary as given, the function's name for --run_path. */
    return cfg->kind == LAUNCH_RUN_PATH ? "run_script_path" : cfg->entrypoint;
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
    agent_post(a, POLICY_EV_DEADLINE, 0, 0, 0);
}

static void arm_deadline(struct agent *a, uint64_t deadline_ms)
{
    uv_update_time(&a->loop);
    uint64_t now = cddp_mono_ms();
    uint64_t delay = deadline_ms > now ? deadline_ms - now : 0;
    uv_timer_start(&a->deadline, on_deadline, delay + (delay ? 1 : 0), 0);
}

/* The summary line at exit (docs/status.md, "Goodput"). */
static void log_goodput(struct agent *a)
{
    struct goodput_totals t;
    char line[512];
    goodput_mode(&a->gp, GOODPUT_MODE_STOPPED, cddp_mono_ms());
    goodput_totals(&a->gp, cddp_mono_ms(), &t);
    goodput_summary(&t, line, sizeof(line));
    log_info("A0420", "[%s] %s", a->cfg->role, line);
}

static void do_action(struct agent *a, const struct policy_action *act)
{
    switch (act->type) {
    case POLICY_ACT_JOIN:
        if (!act->keep)
            agent_spares_stop(a); /* a join that keeps the workers keeps their spares */
        if (act->reason != STOP_NONE && !act->keep)
            agent_kill_strays(a->guardian.pid);
        agent_round_join(a, act);
        break;
    case POLICY_ACT_START_WORKERS:
        start_workers(a);
        break;
    case POLICY_ACT_RESTART_WORKER:
        agent_inplace_restart_worker(a, act);
        break;
    case POLICY_ACT_NEW_GENERATION:
        agent_round_new_generation(a, act);
        break;
    case POLICY_ACT_REQUEST_GENERATION:
        agent_round_request_generation(a, act);
        break;
    case POLICY_ACT_SIGNAL_GROUPS:
        agent_spares_stop(a); /* the group stops: its spares go with it */
        agent_signal_groups(a, act->sig);
        break;
    case POLICY_ACT_SET_DEADLINE:
        arm_deadline(a, act->deadline_ms);
        break;
    case POLICY_ACT_CLEAR_DEADLINE:
        uv_timer_stop(&a->deadline);
        break;
    case POLICY_ACT_REPORT_FAILURE:
        agent_round_report_failure(a);
        break;
    case POLICY_ACT_EXIT_BARRIER:
        agent_spares_stop(a);
        agent_kill_strays(a->guardian.pid);
        agent_round_exit_barrier(a);
        break;
    case POLICY_ACT_FAILURE_REPORT:
        agent_report_failures(a);
        a->reported = true;
        break;
    case POLICY_ACT_EXIT:
        if (a->pol.no_progress_stop)
            agent_failed(a, "A0903",
                         "[%s] stopping the job: %d restarts in a row failed before any worker "
                         "reported a step beyond %lld (--max_no_progress_restarts=%d)",
                         a->cfg->role, a->pol.no_progress_streak, (long long)a->pol.attempt_base,
                         a->cfg->max_no_progress_restarts);
        agent_spares_stop(a);
        agent_kill_strays(a->guardian.pid);
        a->exit_code = act->exit_code;
        agent_round_farewell(a, act);
        if (act->exit_code == CDDP_EXIT_OK) {
            log_info("A0405", "[%s] worker group successfully finished", a->cfg->role);
            if (!a->reported)
                agent_report_replaced(a); /* (--restart_scope=worker's) */
        }
        log_goodput(a);
        if (act->exit_code != CDDP_EXIT_OK)
            log_info("A0421", "[%s] exiting with %d (%s)", a->cfg->role, act->exit_code,
                     cddp_exit_name(act->exit_code));
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
        agent_post(a, POLICY_EV_GROUP_EMPTY, i, 0, 0);
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
    agent_spares_guard(a);
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
        if (agent_stacks_job_reaped(&a->ondemand, pid) ||
            agent_stacks_job_reaped(&a->hung_stacks, pid))
            continue;
        if (agent_spares_reaped(a, pid, st))
            continue;
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
        agent_post_event(a, &ev);
    }
    check_groups(a);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct agent *a = h->data;
    log_warn("A0505", "Received %s death signal, shutting down workers", cddp_signal_name(signum));
    agent_post(a, POLICY_EV_SIGNAL, 0, 0, signum);
}

/* ---- start and stop ---- */

/* A log file lost bytes: the status port's counter follows (paced by the
 * tee set). */
static void on_log_drop(void *arg)
{
    agent_notify(arg);
}

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

static void agent_shutdown(struct agent *a)
{
    if (a->shutting_down)
        return;
    a->shutting_down = true;
    agent_spares_stop(a);
    /* Every group is empty by now (the policy only exits then); make sure. */
    for (int i = 0; i < a->nworkers; i++) {
        if (a->workers[i].group_alive && a->workers[i].pgid > 0)
            agent_signal_group(a->workers[i].pgid, SIGKILL);
    }
    agent_tee_set_close(&a->tees);
    if (a->tees.dropped_bytes > 0)
        log_warn("A0213",
                 "the log files are incomplete: %llu bytes of the workers' output were dropped "
                 "from %u file%s (%s; A0212 named each)",
                 (unsigned long long)a->tees.dropped_bytes, a->tees.dropped_files,
                 a->tees.dropped_files == 1 ? "" : "s", strerror(a->tees.dropped_errno));
    agent_stacks_job_finish(&a->ondemand);    /* a capture under way ends with what it has */
    agent_stacks_job_finish(&a->hung_stacks); /* its gdb does not outlive the agent */
    agent_filetimer_close(a->filetimer);      /* removes the pipe */
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
        agent_stacks_job_close(&a->hung_stacks, on_closed);
        agent_stacks_job_close(&a->ondemand, on_closed);
        uv_close((uv_handle_t *)&a->kill_wait, on_closed);
        agent_round_close(a);
    }
    /* Every group is empty or SIGKILLed, and SIGCHLD is watched no more (so
     * the guardian's exit is no death to restart it for): it can go now,
     * and exit while the agent winds down; agent_run reaps it. */
    agent_guardian_close(&a->guardian);
}

/* str(uuid.uuid4().int): what torchrun uses for an empty --rdzv_id. */
static void random_run_id(char *out, size_t len)
{
    cddp_uuid4_int(out, len);
}

static int agent_open(struct agent *a)
{
    const struct launch_config *cfg = a->cfg;
    int rc;
    agent_tee_set_init(&a->tees, &a->loop);
    a->tees.on_drop = on_log_drop;
    a->tees.on_drop_arg = a;
    uv_signal_init(&a->loop, &a->sigchld);
    a->sigchld.data = a;
    uv_timer_init(&a->loop, &a->deadline);
    a->deadline.data = a;
    uv_timer_init(&a->loop, &a->group_check);
    a->group_check.data = a;
    uv_timer_init(&a->loop, &a->watchdog_timer);
    a->watchdog_timer.data = a;
    agent_stacks_job_init(&a->hung_stacks, &a->loop, a);
    agent_stacks_job_init(&a->ondemand, &a->loop, a);
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
    if ((rc = agent_round_open(a, why, sizeof(why))) != 0) {
        agent_failed(a, "A0603", "%s", why[0] ? why : cddp_strerror(rc));
        return rc;
    }

    if ((rc = agent_logs_init(&a->logs, cfg->log_dir, a->run_id, why, sizeof(why))) != 0) {
        agent_failed(a, "A0604", "%s", why[0] ? why : cddp_strerror(rc));
        return rc;
    }
    if (!a->logs.devnull)
        log_info("A0605", "log directory set to: %s", a->logs.run_dir);
    if ((rc = agent_filetimer_start(a, why, sizeof(why))) != 0) {
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
    goodput_init(&a->gp, cddp_mono_ms());
    a->exit_code = CDDP_EXIT_FAILURE;
    a->guardian.fd = -1;
    a->hung_rank = -1;
    a->workers = calloc((size_t)a->nworkers, sizeof(*a->workers));
    int rc = a->workers
                 ? policy_init(&a->pol, a->nworkers, cfg->max_restarts, cfg->shutdown_timeout_ms)
                 : CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (rc == 0)
        rc = watchdog_init(&a->wd, &cfg->watchdog, a->nworkers);
    if (rc == 0)
        rc = agent_stragglers_init(a);
    if (rc == 0 && cfg->numa_binding) {
        char why[512] = "";
        if ((rc = agent_numa_plan_group(cfg->numa_binding, a->nworkers, &a->numa, why,
                                        sizeof(why))) != 0)
            agent_failed(a, "A2204", "%s", why[0] ? why : cddp_strerror(rc));
    }
    a->pol.max_no_progress = cfg->max_no_progress_restarts;
    agent_inplace_init(a);
    if (rc == 0)
        rc = agent_spares_init(a);
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
        agent_post(a, POLICY_EV_START, 0, 0, 0);
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
    /* A temporary log directory nobody asked for goes away after a success;
     * after a failure it holds the error files the table points at. */
    bool asked_for_files =
        a->cfg->redirects.is_map || a->cfg->redirects.all || a->cfg->tee.is_map || a->cfg->tee.all;
    if (a->pol.state == AGENT_SUCCEEDED && !asked_for_files)
        agent_logs_remove_tmp(&a->logs);
    agent_guardian_stop(&a->guardian); /* it has been exiting since the shutdown */
    agent_logs_free(&a->logs);
    int code = rc ? CDDP_EXIT_FAILURE : a->exit_code;
    if (code == CDDP_EXIT_FAILURE && !a->reported)
        agent_report_agent_error(a);
    policy_free(&a->pol);
    watchdog_free(&a->wd);
    agent_stragglers_free(a);
    agent_spares_free(a);
    free(a->ondemand_targets);
    free(a->workers);
    for (int i = 0; i < a->nreplaced; i++)
        agent_failure_free(&a->replaced[i].f);
    free(a->replaced);
    free(a->numa);
    free(a->queue);
    free(a);
    return code;
}
