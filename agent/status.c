/*
 * status.c: see status.h. A thin shell: it copies what the agent's hooks
 * show into plain views (status/view.h renders them) and moves
 * progress bytes from pipes into proto/progress.c's parser.
 */
#include "agent/status.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/hostname.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "proto/msg.h" /* PROTO_MAX_ID */
#include "proto/progress.h"
#include "rendezvous/jobs.h"
#include "rendezvous/view.h"
#include "store/tcpstore.h"
#include "status/history.h"
#include "status/http.h"
#include "status/view.h"

/* One attempt's progress pipe (read end). Allocated per attempt and freed in
 * its close callback, so a slot can open the next one while the last closes. */
struct progress_chan {
    uv_pipe_t pipe;
    struct agent_status *st;
    int local_rank;
};

/* One local rank, across attempts. */
struct status_slot {
    struct progress_parser parser;
    struct progress_chan *chan; /* the current attempt's reader; NULL when none */
    bool prepared;              /* a worker was prepared on this slot before */
    struct agent_worker_info info;
    unsigned exits_counted; /* info.exits already counted in worker_exits */
    int last_exitcode;      /* of the last exit counted (torchrun's: -N for signal N) */
    double last_exit_at;    /* 0: none yet */
    /* For the history (the loop's own, no lock): this slot's attempt
     * (starts before it), and the last step it added in this attempt (-1:
     * none yet). */
    uint32_t attempt;
    int64_t hist_step;
};

struct agent_status {
    const struct launch_config *cfg;
    const char *version;
    struct status_server *server; /* NULL: no status port */
    uv_loop_t *loop;              /* set by the start hook */
    struct agent *agent;          /* set by the attach hook: progress goes to its watchdog */
    uv_timer_t tick;              /* heartbeat + republish */
    uv_timer_t coalesce;          /* a pending progress-only publish */
    bool timers_open;
    bool stopped;        /* the stop hook ran: no more handles */
    bool linger_blocked; /* cfg->signals are blocked for agent_status_linger() */
    uint64_t last_publish_ms;

    /* The agent as its last snapshot showed it (strings copied). */
    char run_id[PROTO_MAX_ID + 1];
    char master_addr[256];
    char hostname[256];
    char endpoint[300];
    char ifname[64], ifname_addr[64], ifname_source[16];
    enum agent_state state;
    enum stop_reason stop_reason;
    bool will_restart; /* the snapshot's: STOPPING/KILLING to start again */
    uint64_t round;
    int node_rank, nnodes, world_size, master_port;
    int restart_count, max_restarts, membership_restarts;
    char restart_scope[8];
    int64_t generation;
    int worker_restarts, group_restarts, scope_fallbacks, node_replacements;
    double last_recovery_s;
    int spares;
    enum watchdog_mode watchdog_mode;
    unsigned watchdog_kills;
    double straggler_factor, step_median_s;
    bool step_compute;
    uint64_t log_dropped_bytes;
    unsigned log_dropped_files;
    double start_time;
    int exit_code; /* -1: running */
    /* Where the wall time went, as the last snapshot said at goodput_ms
     * (monotonic); the phase it was in runs on until the next. */
    struct goodput_totals goodput;
    uint64_t goodput_ms;
    bool have_goodput;
    bool rdzv_connected;
    double rdzv_disconnected_at;
    unsigned rdzv_reconnects;
    int64_t waiting_nodes;
    char etcd_member[280]; /* "": not etcd-v3 */
    bool etcd_lease_ok, etcd_watch_ok;
    unsigned etcd_failovers;
    /* The rendezvous server this agent hosts, as the last snapshot said
     * (the agent clears it before the server goes); NULL: none. */
    const struct rdzv_server *rdzv_server;
    /* The agent's TCPStore, as the last snapshot said; NULL: none. */
    const struct tcpstore_server *agent_store;
    uint64_t agent_store_round;
    struct status_store_view store_view;
    struct rdzv_view_builder rdzv_view_builder;
    struct status_rdzv_view rdzv_view;

    /* What this module derives from the sequence of snapshots. */
    double join_started_at;       /* wall time the agent last began to rendezvous */
    double last_round_at;         /* 0: none yet */
    double last_round_duration_s; /* < 0: none yet */
    uint64_t worker_exits[STATUS_EXIT_REASON_COUNT];

    int nslots;
    struct status_slot *slots;
    struct status_worker_view *views; /* scratch for rendering */
    char readbuf[65536];

    /* Stacks on demand (POST /stacks): the HTTP thread counts the request
     * and wakes the loop through the async handle, under stacks_mu, which
     * also guards stacks_ready (the handle is open). The loop asks the agent
     * for a capture and serves the last one's text as GET /stacks. */
    pthread_mutex_t stacks_mu;
    bool stacks_mu_init;
    uv_async_t stacks_async;
    bool stacks_ready;
    long long stacks_asked; /* requests so far (under stacks_mu) */
    long long stacks_taken; /* the highest request a capture was started for */
    char *stacks_text;      /* the last capture, as served */
    size_t stacks_len;

    /* The run's history (GET /history; status/history.h): the loop adds,
     * the HTTP thread copies, both under hist_mu, held only for that. */
    pthread_mutex_t hist_mu;
    bool hist_ready;
    struct status_history hist;
    double hist_started_at;
    char stop_words[STATUS_HISTORY_REASON_MAX]; /* why the group last stopped */
    /* The hosted server's job-wide statistics (on_host_jobs): made on the
     * loop when the agent hosts, set under hist_mu (GET /history?run= reads
     * it), freed after the status server stopped; NULL: not hosting. */
    struct rdzv_jobs *jobs;
};

/* ---- publishing ---- */

static enum status_agent_state view_state(const struct agent_status *st)
{
    switch (st->state) {
    case AGENT_INIT:
        return STATUS_AGENT_INIT;
    case AGENT_RENDEZVOUS:
        return STATUS_AGENT_RENDEZVOUS;
    case AGENT_RUNNING:
        return STATUS_AGENT_RUNNING;
    case AGENT_STOPPING:
    case AGENT_KILLING:
        /* Stopping the group to start it again, or for good? As the policy
         * will decide (policy_will_restart). */
        if (st->will_restart)
            return STATUS_AGENT_RESTARTING;
        return STATUS_AGENT_STOPPING;
    case AGENT_EXIT_BARRIER:
        return STATUS_AGENT_EXIT_BARRIER;
    case AGENT_SUCCEEDED:
        return STATUS_AGENT_SUCCEEDED;
    case AGENT_FAILED:
        return STATUS_AGENT_FAILED;
    case AGENT_TERMINATED:
        return STATUS_AGENT_TERMINATED;
    }
    return STATUS_AGENT_INIT;
}

static enum status_worker_state view_worker_state(enum worker_state s)
{
    switch (s) {
    case WORKER_INIT:
        return STATUS_WORKER_INIT;
    case WORKER_RUNNING:
        return STATUS_WORKER_RUNNING;
    case WORKER_SUCCEEDED:
        return STATUS_WORKER_SUCCEEDED;
    case WORKER_FAILED:
        return STATUS_WORKER_FAILED;
    case WORKER_STOPPED:
        return STATUS_WORKER_STOPPED;
    }
    return STATUS_WORKER_INIT;
}

/* How a worker's exit counts (cddp_agent_worker_exits_total). The policy has
 * already judged it: STOPPED means it ended while the agent was stopping the
 * group, whatever its code. */
static enum status_exit_reason exit_reason(enum worker_state s, int exitcode, bool hung)
{
    if (hung)
        return STATUS_EXIT_WATCHDOG;
    if (exitcode == 0)
        return STATUS_EXIT_SUCCESS;
    if (s == WORKER_STOPPED)
        return STATUS_EXIT_STOPPED;
    if (exitcode < 0)
        return STATUS_EXIT_SIGNAL;
    if (exitcode == CDDP_EXIT_COLLECTIVE_TIMEOUT)
        return STATUS_EXIT_COLLECTIVE_TIMEOUT;
    if (exitcode == CDDP_EXIT_WATCHDOG)
        return STATUS_EXIT_WATCHDOG;
    return STATUS_EXIT_FAILURE;
}

/* The last snapshot's goodput, its current phase run on to now_ms while
 * the agent runs. */
static void fill_goodput(const struct agent_status *st, struct status_goodput_view *g,
                         uint64_t now_ms)
{
    const struct goodput_totals *t = &st->goodput;
    memset(g, 0, sizeof(*g));
    if (!st->have_goodput)
        return;
    _Static_assert((int)STATUS_GOODPUT_PHASE_COUNT == (int)GOODPUT_PHASE_COUNT, "goodput phases");
    g->known = true;
    for (int i = 0; i < GOODPUT_PHASE_COUNT; i++)
        g->s[i] = t->s[i];
    g->wall_s = t->wall_s;
    g->phase = (enum status_goodput_phase)t->phase;
    g->lost_steps = t->lost_steps;
    if (st->exit_code < 0 && now_ms > st->goodput_ms) {
        double more = (double)(now_ms - st->goodput_ms) / 1000.0;
        g->s[t->phase] += more;
        g->wall_s += more;
    }
    g->ratio = g->wall_s > 0 ? g->s[GOODPUT_PRODUCTIVE] / g->wall_s : 0;
}

static void fill_view(struct agent_status *st, struct status_agent_view *v, double now_wall)
{
    const struct launch_config *cfg = st->cfg;
    bool have_round = st->round > 0;
    memset(v, 0, sizeof(*v));
    v->program = "cddprun";
    v->version = st->version;
    v->pid = (int)getpid();
    v->hostname = st->hostname;
    v->run_id = st->run_id;
    v->started_at = st->start_time;
    v->state = view_state(st);
    v->exit_code = st->exit_code;
    v->exit_reason = st->exit_code >= 0 ? cddp_exit_name(st->exit_code) : NULL;
    fill_goodput(st, &v->goodput, cddp_mono_ms());
    v->node_rank = have_round ? st->node_rank : -1;
    v->nnodes = have_round ? st->nnodes : 0;
    v->world_size = have_round ? st->world_size : 0;
    v->local_world_size = cfg->nproc_per_node;
    v->round = st->round;
    v->last_round_at = st->last_round_at;
    v->last_round_duration_s = st->last_round_duration_s;
    v->waiting_nodes = st->waiting_nodes > 0 ? (unsigned)st->waiting_nodes : 0;
    v->rdzv_backend = cfg->rdzv_backend;
    v->rdzv_endpoint = st->endpoint;
    v->master_addr = have_round && st->master_addr[0] ? st->master_addr : NULL;
    v->master_port = have_round ? st->master_port : 0;
    v->rdzv_connected = st->rdzv_connected;
    v->rdzv_disconnected_at = st->rdzv_disconnected_at;
    v->rdzv_reconnects = st->rdzv_reconnects;
    v->ifname = st->ifname[0] ? st->ifname : NULL;
    v->ifname_addr = st->ifname_addr[0] ? st->ifname_addr : NULL;
    v->ifname_source = st->ifname_source[0] ? st->ifname_source : NULL;
    v->etcd_member = st->etcd_member[0] ? st->etcd_member : NULL;
    v->etcd_lease_ok = st->etcd_lease_ok;
    v->etcd_watch_ok = st->etcd_watch_ok;
    v->etcd_failovers = st->etcd_failovers;
    v->rdzv_server = NULL;
    if (st->rdzv_server && st->loop) {
        /* The server this agent hosts, shown as cddp-rdzv shows itself. */
        struct status_rdzv_view *r = &st->rdzv_view;
        if (rdzv_view_build(&st->rdzv_view_builder, st->loop, st->rdzv_server, now_wall, r) == 0) {
            r->program = "cddprun";
            r->version = st->version;
            r->pid = v->pid;
            r->hostname = st->hostname;
            r->started_at = st->start_time;
            if (st->jobs) /* the loop feeds them: read without the lock */
                rdzv_jobs_add_goodput(st->jobs, &st->rdzv_view_builder, now_wall);
            v->rdzv_server = r;
        } else {
            log_error("S0106", "status port: out of memory listing the rendezvous runs");
        }
    }
    v->agent_store = NULL;
    if (st->agent_store && st->loop) {
        struct tcpstore_stats ts;
        tcpstore_server_stats(st->agent_store, &ts);
        st->store_view = (struct status_store_view){
            .port = tcpstore_server_port(st->agent_store),
            .round = st->agent_store_round,
            .keys = ts.keys,
            .bytes = ts.bytes,
            .connections = ts.connections,
            .waiting = ts.waiting,
            .accepted = ts.accepted,
            .queries = ts.queries,
            .refused = ts.refused,
        };
        v->agent_store = &st->store_view;
    }
    v->restart_count = (unsigned)st->restart_count;
    v->max_restarts = (unsigned)st->max_restarts;
    v->restarts[STATUS_RESTART_WORKER_FAILURE] = (uint64_t)st->restart_count;
    v->restarts[STATUS_RESTART_MEMBERSHIP_CHANGE] = (uint64_t)st->membership_restarts;
    v->restart_scope = st->restart_scope[0] ? st->restart_scope : NULL;
    v->restarts_worker = (uint64_t)st->worker_restarts;
    v->restarts_group = (uint64_t)st->group_restarts;
    v->scope_fallbacks = (uint64_t)st->scope_fallbacks;
    v->node_replacements = (uint64_t)st->node_replacements;
    v->generation = st->generation;
    v->last_recovery_s = st->last_recovery_s;
    v->spares = st->spares;
    memcpy(v->worker_exits, st->worker_exits, sizeof(v->worker_exits));
    for (int i = 0; i < st->nslots; i++) {
        const struct status_slot *s = &st->slots[i];
        struct status_worker_view *w = &st->views[i];
        memset(w, 0, sizeof(*w));
        w->local_rank = i;
        w->rank = have_round ? s->info.rank : -1;
        w->state = view_worker_state(s->info.state);
        w->pid = w->state == STATUS_WORKER_RUNNING ? (int)s->info.pid : 0;
        w->exit_code = s->last_exit_at > 0 && s->last_exitcode >= 0 ? s->last_exitcode : -1;
        w->signal = s->last_exit_at > 0 && s->last_exitcode < 0 ? -s->last_exitcode : 0;
        w->started_at = s->info.start_time;
        w->exited_at = s->last_exit_at;
        w->restarts = s->info.restarts > 0 ? (unsigned)s->info.restarts : 0;
        w->progress = s->parser.report;
        w->watchdog_timeout_s = (double)s->info.watchdog_timeout_ms / 1000.0;
        w->step_time_s = s->info.step_time_s;
        w->compute_s = s->info.compute_s;
        w->straggler = s->info.straggler;
        w->straggler_since = s->info.straggler_since;
        w->straggler_ratio = s->info.straggler_ratio;
    }
    v->straggler_factor = st->straggler_factor;
    v->step_median_s = st->step_median_s;
    v->step_compute = st->step_compute;
    v->watchdog_mode = watchdog_mode_name(st->watchdog_mode);
    v->watchdog_kills = st->watchdog_kills;
    v->log_dropped_bytes = st->log_dropped_bytes;
    v->log_dropped_files = st->log_dropped_files;
    /* The loop is the only writer of the history: it reads it unlocked. */
    v->history = st->hist_ready;
    v->history_seq = st->hist.seq;
    v->nworkers = (size_t)st->nslots;
    v->workers = st->views;
}

/* Renders what is known now and hands it to the HTTP thread. */
static void publish(struct agent_status *st)
{
    if (st->server == NULL)
        return;
    if (st->timers_open)
        uv_timer_stop(&st->coalesce);
    struct status_agent_view v;
    double wall = cddp_wall_time();
    fill_view(st, &v, wall);
    struct status_snapshot *snap = NULL;
    uint64_t now = cddp_mono_ms();
    int rc = status_agent_render(&v, wall, now, &snap);
    if (rc) {
        /* The previous snapshot stays served; only memory can make this fail. */
        log_error("S0101", "status port: cannot render the agent's status: %s", cddp_strerror(rc));
        return;
    }
    if (st->stacks_text && status_snapshot_set_stacks(snap, st->stacks_text, st->stacks_len) != 0)
        log_error("S2101", "status port: out of memory serving the last stack capture");
    status_server_publish(st->server, snap);
    st->last_publish_ms = now;
}

static void on_coalesce(uv_timer_t *t)
{
    publish(t->data);
}

/* Progress changed: publish now, or when AGENT_STATUS_COALESCE_MS have passed
 * since the last publish, so a worker reporting every millisecond costs one
 * render per interval. */
static void progress_changed(struct agent_status *st)
{
    if (st->server == NULL || !st->timers_open)
        return;
    uint64_t now = cddp_mono_ms();
    uint64_t since = now - st->last_publish_ms;
    if (since >= AGENT_STATUS_COALESCE_MS) {
        publish(st);
        return;
    }
    if (!uv_is_active((uv_handle_t *)&st->coalesce))
        uv_timer_start(&st->coalesce, on_coalesce, AGENT_STATUS_COALESCE_MS - since, 0);
}

static void on_tick(uv_timer_t *t)
{
    struct agent_status *st = t->data;
    status_server_heartbeat(st->server);
    publish(st);
}

/* ---- the history ---- */

/* A progress line changed local_rank's values: a point when its step moved. */
static void history_sample(struct agent_status *st, int local_rank)
{
    struct status_slot *s = &st->slots[local_rank];
    const struct progress_report *r = &s->parser.report;
    if (!st->hist_ready || !(r->fields & PROGRESS_STEP) || r->step == s->hist_step)
        return;
    struct status_history_point p = {
        .t = r->wall,
        .step = r->step,
        .loss = r->fields & PROGRESS_LOSS ? r->loss : NAN,
        .samples_per_s = r->fields & PROGRESS_SAMPLES_PER_S ? r->samples_per_s : NAN,
        .step_time_s = r->fields & PROGRESS_STEP_TIME ? r->step_time_s : NAN,
        .attempt = s->attempt,
    };
    s->hist_step = r->step;
    pthread_mutex_lock(&st->hist_mu);
    status_history_add_point(&st->hist, local_rank, s->info.rank, &p);
    pthread_mutex_unlock(&st->hist_mu);
}

static void history_event(struct agent_status *st, enum status_history_event_kind kind,
                          int local_rank, double value, const char *reason)
{
    if (!st->hist_ready)
        return;
    struct status_history_event e = {
        .t = cddp_wall_time(), .kind = kind, .local_rank = local_rank, .step = -1, .value = value};
    /* The highest step of the attempt now running (where a restart cuts it). */
    for (int i = 0; i < st->nslots; i++) {
        if (st->slots[i].hist_step > e.step)
            e.step = st->slots[i].hist_step;
        if (st->slots[i].attempt > e.attempt)
            e.attempt = st->slots[i].attempt;
    }
    cddp_strlcpy(e.reason, reason, sizeof(e.reason));
    pthread_mutex_lock(&st->hist_mu);
    status_history_add_event(&st->hist, &e);
    pthread_mutex_unlock(&st->hist_mu);
}

/* Why the group stops, in words: the first worker that failed, else the
 * policy's reason. */
static void stop_words(struct agent_status *st, const struct agent_snapshot *snap, char *out,
                       size_t len)
{
    if (snap->watchdog_kills > st->watchdog_kills) {
        for (int i = 0; i < snap->nworkers; i++) {
            const struct agent_worker_info *w = &snap->workers[i];
            if (w->hung) {
                snprintf(out, len,
                         "local_rank %d (rank %d) hung: no progress within the watchdog timeout",
                         w->local_rank, w->rank);
                return;
            }
        }
        snprintf(out, len, "a worker hung (no progress within the watchdog timeout)");
        return;
    }
    if (snap->stop_reason == STOP_MEMBERSHIP) {
        snprintf(out, len, "membership change: the rendezvous asked for a new round");
        return;
    }
    const struct agent_worker_info *first = NULL;
    for (int i = 0; i < snap->nworkers; i++) {
        const struct agent_worker_info *w = &snap->workers[i];
        if (w->state == WORKER_FAILED && (first == NULL || w->exit_time < first->exit_time))
            first = w;
    }
    if (first && first->hung)
        snprintf(out, len, "local_rank %d (rank %d) hung: stopped by the watchdog",
                 first->local_rank, first->rank);
    else if (first && first->exitcode < 0)
        snprintf(out, len, "local_rank %d (rank %d) killed by %s", first->local_rank, first->rank,
                 cddp_signal_name(-first->exitcode));
    else if (first)
        snprintf(out, len, "local_rank %d (rank %d) exited with code %d", first->local_rank,
                 first->rank, first->exitcode);
    else
        snprintf(out, len, "%s", stop_reason_name(snap->stop_reason));
}

static bool stopping(enum agent_state s)
{
    return s == AGENT_STOPPING || s == AGENT_KILLING;
}

static bool ended(enum agent_state s)
{
    return s == AGENT_SUCCEEDED || s == AGENT_FAILED || s == AGENT_TERMINATED;
}

/* Events from one agent state change to the next (before st takes snap). */
static void history_changes(struct agent_status *st, const struct agent_snapshot *snap)
{
    char why[STATUS_HISTORY_REASON_MAX];
    if (stopping(snap->state) && !stopping(st->state) &&
        (snap->stop_reason == STOP_FAILURE || snap->stop_reason == STOP_MEMBERSHIP)) {
        stop_words(st, snap, why, sizeof(why));
        /* A restart when the policy will start the group again (view_state). */
        if (snap->will_restart)
            history_event(st, STATUS_HISTORY_RESTART, -1, 0, why);
        cddp_strlcpy(st->stop_words, why, sizeof(st->stop_words));
    }
    if (snap->round != st->round && snap->round > 0) {
        snprintf(why, sizeof(why), "round %llu: node %d of %d, world size %d",
                 (unsigned long long)snap->round, snap->node_rank, snap->nnodes, snap->world_size);
        history_event(st, STATUS_HISTORY_ROUND, -1, (double)snap->round, why);
    }
    int n = snap->nworkers < st->nslots ? snap->nworkers : st->nslots;
    for (int i = 0; i < n; i++) {
        const struct agent_worker_info *w = &snap->workers[i];
        if (w->straggler == st->slots[i].info.straggler)
            continue;
        if (w->straggler)
            snprintf(why, sizeof(why), "local_rank %d (rank %d) a straggler: x%.2f the median", i,
                     w->rank, w->straggler_ratio);
        else
            snprintf(why, sizeof(why), "local_rank %d (rank %d) no longer a straggler", i, w->rank);
        history_event(st, w->straggler ? STATUS_HISTORY_STRAGGLER : STATUS_HISTORY_STRAGGLER_END, i,
                      w->straggler ? w->straggler_ratio : 0, why);
    }
    if (ended(snap->state) && !ended(st->state)) {
        if (snap->state == AGENT_SUCCEEDED)
            snprintf(why, sizeof(why), "succeeded");
        else if (snap->state == AGENT_TERMINATED)
            snprintf(why, sizeof(why), "terminated by a signal");
        else
            snprintf(why, sizeof(why), "failed: %.150s",
                     st->stop_words[0] ? st->stop_words : stop_reason_name(snap->stop_reason));
        history_event(st, STATUS_HISTORY_END, -1, 0, why);
    }
}

/* HTTP thread: GET /history. Copies what is newer than since under the
 * lock, renders the copy outside it. ?run=: the hosted server's job-wide
 * history of that run; without, or when not hosting, the node's own. */
static int on_history_request(void *arg, const char *run, uint64_t since, struct cddp_buf *out)
{
    struct agent_status *st = arg;
    struct status_history copy;
    pthread_mutex_lock(&st->hist_mu);
    struct rdzv_jobs *jobs = st->jobs; /* freed only after this thread stopped */
    if (run != NULL && jobs != NULL) {
        pthread_mutex_unlock(&st->hist_mu);
        return rdzv_jobs_history(jobs, run, since, out);
    }
    int rc = status_history_clone(&copy, &st->hist, since);
    pthread_mutex_unlock(&st->hist_mu);
    if (rc)
        return rc;
    rc = status_history_render(&copy, since, cddp_wall_time(), st->hist_started_at, out);
    status_history_free(&copy);
    return rc;
}

/* ---- the progress channel ---- */

static void on_chan_closed(uv_handle_t *h)
{
    free(h->data);
}

static void chan_close(struct progress_chan *c)
{
    struct status_slot *s = &c->st->slots[c->local_rank];
    if (s->chan == c)
        s->chan = NULL;
    uv_close((uv_handle_t *)&c->pipe, on_chan_closed);
}

static void chan_feed(struct progress_chan *c, const char *data, size_t n)
{
    struct status_slot *s = &c->st->slots[c->local_rank];
    uint64_t now = cddp_mono_ms();
    if (progress_feed(&s->parser, data, n, now, cddp_wall_time()) > 0) {
        agent_progress(c->st->agent, c->local_rank, &s->parser.report, now);
        history_sample(c->st, c->local_rank);
    }
}

static void chan_eof(struct progress_chan *c)
{
    struct status_slot *s = &c->st->slots[c->local_rank];
    uint64_t now = cddp_mono_ms();
    if (progress_eof(&s->parser, now, cddp_wall_time()) > 0) {
        agent_progress(c->st->agent, c->local_rank, &s->parser.report, now);
        history_sample(c->st, c->local_rank);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct progress_chan *c = h->data;
    (void)suggested;
    /* One buffer for every pipe: each read is parsed before the next. */
    buf->base = c->st->readbuf;
    buf->len = sizeof(c->st->readbuf);
}

static void on_read(uv_stream_t *stream, ssize_t n, const uv_buf_t *buf)
{
    struct progress_chan *c = stream->data;
    struct agent_status *st = c->st;
    if (n > 0) {
        chan_feed(c, buf->base, (size_t)n);
    } else if (n == UV_EOF) {
        /* Every writer is gone (the worker and whatever inherited the fd). */
        chan_eof(c);
        chan_close(c);
    } else if (n < 0) {
        log_warn("S0102", "progress channel of local_rank %d: %s; its progress is no longer read",
                 c->local_rank, uv_strerror((int)n));
        chan_close(c);
    }
    if (n != 0)
        progress_changed(st);
}

/* Reads what is already in the pipe (it is non-blocking): lines a worker
 * wrote just before it exited may not have reached on_read yet when the agent
 * moves on to the next attempt or to its end. */
static void chan_drain(struct progress_chan *c)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0)
        return;
    for (;;) {
        ssize_t n = read(fd, c->st->readbuf, sizeof(c->st->readbuf));
        if (n > 0) {
            chan_feed(c, c->st->readbuf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0)
            chan_eof(c);
        return;
    }
}

/* A pipe for local_rank's next worker: the read end on the loop, the write
 * end returned in *wfd. 0 or a negative code (nothing left open). */
static int chan_open(struct agent_status *st, int local_rank, int *wfd)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    struct progress_chan *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fds[0]);
        close(fds[1]);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    c->st = st;
    c->local_rank = local_rank;
    int rc = uv_pipe_init(st->loop, &c->pipe, 0);
    if (rc) {
        close(fds[0]);
        close(fds[1]);
        free(c);
        return rc;
    }
    c->pipe.data = c;
    rc = uv_pipe_open(&c->pipe, fds[0]);
    if (rc == 0)
        rc = uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
    if (rc) {
        /* uv_pipe_open did not take fds[0] when it failed; the handle is
         * closed either way (and frees c). */
        uv_os_fd_t owned;
        if (uv_fileno((uv_handle_t *)&c->pipe, &owned) != 0)
            close(fds[0]);
        close(fds[1]);
        uv_close((uv_handle_t *)&c->pipe, on_chan_closed);
        return rc;
    }
    st->slots[local_rank].chan = c;
    *wfd = fds[1];
    return 0;
}

/* ---- stacks on demand ---- */

/* At most this much of a capture is served; the file has all of it. */
#define STACKS_SERVED_MAX ((size_t)1 << 20)

/* HTTP thread: POST /stacks. */
static long long on_stacks_request(void *arg, char *why, size_t whylen)
{
    struct agent_status *st = arg;
    long long id = 0;
    pthread_mutex_lock(&st->stacks_mu);
    if (st->stacks_ready) {
        id = ++st->stacks_asked;
        uv_async_send(&st->stacks_async);
    }
    pthread_mutex_unlock(&st->stacks_mu);
    if (id == 0)
        snprintf(why, whylen, "the agent is not running its loop");
    return id;
}

static void stacks_serve(struct agent_status *st, long long id, const char *text, size_t len,
                         const char *path)
{
    struct cddp_buf b;
    cddp_buf_init(&b, STACKS_SERVED_MAX + 4096);
    char head[4400];
    int n = snprintf(head, sizeof(head), "# capture %lld: %s\n", id, path ? path : "(no file)");
    cddp_buf_append(&b, head, (size_t)n);
    size_t take = len > STACKS_SERVED_MAX ? STACKS_SERVED_MAX : len;
    cddp_buf_append(&b, text, take);
    if (take < len) {
        n = snprintf(head, sizeof(head), "\n# ... truncated: the whole capture is in %s\n", path);
        cddp_buf_append(&b, head, (size_t)n);
    }
    free(st->stacks_text);
    st->stacks_text = b.data;
    st->stacks_len = b.len;
    publish(st);
}

static void stacks_start(struct agent_status *st);

/* Loop: the agent wrote the capture (or could not). */
static void on_stacks_done(void *arg, int rc, const char *path)
{
    struct agent_status *st = arg;
    long long id = st->stacks_taken;
    char *text = NULL;
    size_t len = 0;
    if (rc == 0 && path) {
        int err = 0;
        FILE *f = fopen(path, "re");
        if (f) {
            struct cddp_buf b;
            cddp_buf_init(&b, STACKS_SERVED_MAX + 8192);
            char buf[8192];
            size_t n;
            while ((n = fread(buf, 1, sizeof(buf), f)) > 0 && b.len <= STACKS_SERVED_MAX)
                if (cddp_buf_append(&b, buf, n) != 0)
                    break;
            fclose(f);
            text = b.data;
            len = b.len;
        } else {
            err = errno;
        }
        if (text == NULL)
            log_warn("S2102", "status port: reading the stack capture %s: %s", path,
                     strerror(err ? err : EIO));
    }
    if (text)
        stacks_serve(st, id, text, len, path);
    else
        stacks_serve(st, id, "# the capture could not be written\n", 35, path);
    free(text);
    stacks_start(st); /* asked again while this one ran */
}

static void stacks_start(struct agent_status *st)
{
    pthread_mutex_lock(&st->stacks_mu);
    long long asked = st->stacks_asked;
    pthread_mutex_unlock(&st->stacks_mu);
    if (asked <= st->stacks_taken || st->agent == NULL)
        return;
    long long before = st->stacks_taken;
    st->stacks_taken = asked;
    int rc = agent_capture_stacks(st->agent, on_stacks_done, st);
    if (rc == CDDP_EEXISTS) {
        st->stacks_taken = before; /* the capture under way calls back */
        return;
    }
    if (rc) {
        const char *why = rc == CDDP_ENOTFOUND ? "# no worker is running now: nothing to capture\n"
                                               : "# the agent is shutting down: no capture\n";
        stacks_serve(st, asked, why, strlen(why), NULL);
    }
}

static void on_stacks_async(uv_async_t *h)
{
    stacks_start(h->data);
}

/* ---- the agent's hooks ---- */

static void on_attach(void *arg, struct agent *agent)
{
    ((struct agent_status *)arg)->agent = agent;
}

static int on_start(void *arg, uv_loop_t *loop)
{
    struct agent_status *st = arg;
    st->loop = loop;
    if (st->server == NULL)
        return 0;
    uv_timer_init(loop, &st->tick);
    uv_timer_init(loop, &st->coalesce);
    st->tick.data = st;
    st->coalesce.data = st;
    st->timers_open = true;
    if (uv_async_init(loop, &st->stacks_async, on_stacks_async) == 0) {
        st->stacks_async.data = st;
        uv_unref((uv_handle_t *)&st->stacks_async); /* never keeps the loop alive */
        pthread_mutex_lock(&st->stacks_mu);
        st->stacks_ready = true;
        pthread_mutex_unlock(&st->stacks_mu);
    }
    status_server_heartbeat(st->server);
    publish(st);
    return uv_timer_start(&st->tick, on_tick, AGENT_STATUS_TICK_MS, AGENT_STATUS_TICK_MS);
}

/* From the agent's stop until the end of the linger, a handled signal must
 * end the linger, not kill the process with its default action (libuv gives
 * the signals back to SIG_DFL as the loop closes). Blocked, it stays pending
 * until agent_status_linger() takes it. */
static void block_for_linger(struct agent_status *st, sigset_t *set)
{
    sigemptyset(set);
    for (int i = 0; i < st->cfg->nsignals; i++)
        sigaddset(set, st->cfg->signals[i]);
    if (!st->linger_blocked && st->server && st->cfg->status_linger_s > 0) {
        pthread_sigmask(SIG_BLOCK, set, NULL);
        st->linger_blocked = true;
    }
}

static void on_stop(void *arg)
{
    struct agent_status *st = arg;
    sigset_t set;
    st->stopped = true;
    block_for_linger(st, &set); /* the run has ended: nothing left to forward */
    for (int i = 0; i < st->nslots; i++) {
        struct progress_chan *c = st->slots[i].chan;
        if (c) {
            chan_drain(c);
            chan_close(c);
        }
    }
    /* The loop may run a while yet (a hosting agent serving the other nodes
     * until they are done): the tick goes on bumping /livez and showing the
     * rendezvous, without keeping the loop alive. loop_done closes it. */
    if (st->timers_open) {
        uv_unref((uv_handle_t *)&st->tick);
        uv_unref((uv_handle_t *)&st->coalesce);
    }
    /* The agent's final state comes through state_changed after this, and is
     * published then: the server lives until agent_status_free(). */
}

static void on_loop_done(void *arg)
{
    struct agent_status *st = arg;
    st->rdzv_server = NULL; /* gone with the loop in any case */
    st->agent_store = NULL;
    if (st->timers_open) {
        st->timers_open = false;
        uv_close((uv_handle_t *)&st->tick, NULL);
        uv_close((uv_handle_t *)&st->coalesce, NULL);
    }
    pthread_mutex_lock(&st->stacks_mu);
    bool async_open = st->stacks_ready;
    st->stacks_ready = false; /* POST /stacks answers 503 from now on */
    pthread_mutex_unlock(&st->stacks_mu);
    if (async_open)
        uv_close((uv_handle_t *)&st->stacks_async, NULL);
}

static void on_state_changed(void *arg, const struct agent_snapshot *snap)
{
    struct agent_status *st = arg;
    double now = cddp_wall_time();

    history_changes(st, snap);
    if (snap->state == AGENT_RENDEZVOUS && st->state != AGENT_RENDEZVOUS)
        st->join_started_at = now;
    if (snap->round != st->round && snap->round > 0) {
        /* Rounds come from the rendezvous on a later loop turn than the join
         * (agent/rdzv.h), so the join was seen. */
        st->last_round_at = now;
        st->last_round_duration_s = st->join_started_at > 0 ? now - st->join_started_at : -1;
    }
    cddp_strlcpy(st->run_id, snap->run_id ? snap->run_id : "", sizeof(st->run_id));
    cddp_strlcpy(st->master_addr, snap->master_addr ? snap->master_addr : "",
                 sizeof(st->master_addr));
    st->state = snap->state;
    st->stop_reason = snap->stop_reason;
    st->will_restart = snap->will_restart;
    st->round = snap->round;
    st->node_rank = snap->node_rank;
    st->nnodes = snap->nnodes;
    st->world_size = snap->world_size;
    st->master_port = snap->master_port;
    st->restart_count = snap->restart_count;
    st->max_restarts = snap->max_restarts;
    st->membership_restarts = snap->membership_restarts;
    cddp_strlcpy(st->restart_scope, snap->restart_scope ? snap->restart_scope : "",
                 sizeof(st->restart_scope));
    st->generation = snap->generation;
    st->worker_restarts = snap->worker_restarts;
    st->group_restarts = snap->group_restarts;
    st->scope_fallbacks = snap->scope_fallbacks;
    st->node_replacements = snap->node_replacements;
    st->last_recovery_s = snap->last_recovery_s;
    st->spares = snap->spares;
    st->watchdog_mode = snap->watchdog_mode;
    st->watchdog_kills = snap->watchdog_kills;
    st->straggler_factor = snap->straggler_factor;
    st->step_median_s = snap->step_median_s;
    st->step_compute = snap->step_compute;
    st->log_dropped_bytes = snap->log_dropped_bytes;
    st->log_dropped_files = snap->log_dropped_files;
    st->start_time = snap->start_time;
    st->exit_code = snap->exit_code;
    if (snap->goodput) {
        st->goodput = *snap->goodput;
        st->goodput_ms = snap->goodput_ms;
        st->have_goodput = true;
    }
    st->rdzv_connected = snap->rdzv_connected;
    st->rdzv_disconnected_at = snap->rdzv_disconnected_at;
    st->rdzv_reconnects = snap->rdzv_reconnects;
    cddp_strlcpy(st->ifname, snap->ifname ? snap->ifname : "", sizeof(st->ifname));
    cddp_strlcpy(st->ifname_addr, snap->ifname_addr ? snap->ifname_addr : "",
                 sizeof(st->ifname_addr));
    cddp_strlcpy(st->ifname_source, snap->ifname_source ? snap->ifname_source : "",
                 sizeof(st->ifname_source));
    st->waiting_nodes = snap->waiting_nodes;
    cddp_strlcpy(st->etcd_member, snap->etcd_member ? snap->etcd_member : "",
                 sizeof(st->etcd_member));
    st->etcd_lease_ok = snap->etcd_lease_ok;
    st->etcd_watch_ok = snap->etcd_watch_ok;
    st->etcd_failovers = snap->etcd_failovers;
    st->rdzv_server = snap->rdzv_server;
    st->agent_store = snap->agent_store;
    st->agent_store_round = snap->agent_store_round;

    int n = snap->nworkers < st->nslots ? snap->nworkers : st->nslots;
    for (int i = 0; i < n; i++) {
        struct status_slot *s = &st->slots[i];
        const struct agent_worker_info *w = &snap->workers[i];
        s->info = *w;
        /* Every exit is in some snapshot: a worker is started again only
         * after a new round, which comes on a later loop turn. Count any the
         * agent reported together as the last one. */
        if (w->exits > s->exits_counted) {
            enum status_exit_reason r = exit_reason(w->state, w->exitcode, w->hung);
            st->worker_exits[r] += w->exits - s->exits_counted;
            s->exits_counted = w->exits;
            s->last_exitcode = w->exitcode;
            s->last_exit_at = w->exit_time > 0 ? w->exit_time : now;
        }
    }
    publish(st);
}

static int on_prepare_worker(void *arg, int local_rank, int restart_count,
                             struct agent_worker_extras *x)
{
    struct agent_status *st = arg;
    (void)restart_count;
    if (local_rank < 0 || local_rank >= st->nslots || st->loop == NULL || st->stopped)
        return 0;
    struct status_slot *s = &st->slots[local_rank];
    if (s->chan) {
        chan_drain(s->chan);
        chan_close(s->chan);
    }
    if (s->prepared) {
        progress_restart(&s->parser);
        s->attempt++;
    }
    s->prepared = true;
    s->hist_step = -1;
    if (x->nfds >= AGENT_EXTRA_MAX || x->nenv >= AGENT_EXTRA_MAX)
        return 0;
    int wfd = -1;
    int rc = chan_open(st, local_rank, &wfd);
    if (rc) {
        /* Progress is optional: the worker runs without CDDP_PROGRESS_FD. */
        log_warn("S0103", "local_rank %d gets no progress channel: %s", local_rank,
                 cddp_strerror(rc));
        return 0;
    }
    int fdnum = 3 + x->nfds; /* agent.h: fds[] become 3, 4, ... in the worker */
    x->fds[x->nfds++] = wfd;
    x->close_fds = true;
    snprintf(x->storage, sizeof(x->storage), "%d", fdnum);
    x->env[x->nenv].key = "CDDP_PROGRESS_FD";
    x->env[x->nenv].value = x->storage;
    x->nenv++;
    return 0;
}

/* ---- life cycle ---- */

int agent_status_new(const struct launch_config *cfg, const char *version,
                     struct agent_status **out, char *err, size_t errlen)
{
    *out = NULL;
    struct agent_status *st = calloc(1, sizeof(*st));
    int n = cfg->nproc_per_node > 0 ? cfg->nproc_per_node : 1;
    if (st) {
        st->slots = calloc((size_t)n, sizeof(*st->slots));
        st->views = calloc((size_t)n, sizeof(*st->views));
    }
    if (st == NULL || st->slots == NULL || st->views == NULL) {
        snprintf(err, errlen, "status: out of memory");
        if (st) {
            free(st->slots);
            free(st->views);
        }
        free(st);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    st->cfg = cfg;
    st->exit_code = -1;
    st->version = version;
    st->nslots = n;
    for (int i = 0; i < n; i++) {
        progress_init(&st->slots[i].parser);
        st->slots[i].hist_step = -1;
    }
    st->state = AGENT_INIT;
    st->node_rank = -1;
    st->max_restarts = cfg->max_restarts;
    st->straggler_factor = cfg->straggler_factor;
    st->start_time = cddp_wall_time();
    st->rdzv_connected = true;
    st->waiting_nodes = -1;
    st->last_round_duration_s = -1;
    cddp_strlcpy(st->run_id, cfg->rdzv_id ? cfg->rdzv_id : "", sizeof(st->run_id));
    if (cfg->rdzv_endpoint && cfg->rdzv_endpoint[0])
        cddp_strlcpy(st->endpoint, cfg->rdzv_endpoint, sizeof(st->endpoint));
    else if (cfg->static_addr[0])
        cddp_hostport_format(cfg->static_addr, cfg->static_port, st->endpoint,
                             sizeof(st->endpoint));

    if (cfg->status_port >= 0) {
        cddp_fqdn(st->hostname, sizeof(st->hostname));
        struct status_server_options o;
        status_server_options_default(&o);
        o.addr = cfg->status_addr;
        o.port = cfg->status_port;
        o.program = "cddprun";
        o.on_stacks = on_stacks_request;
        o.on_stacks_arg = st;
        pthread_mutex_init(&st->stacks_mu, NULL);
        st->stacks_mu_init = true;
        /* The history is kept only where it is served. */
        int hrc = status_history_init(&st->hist, n, STATUS_HISTORY_POINTS, STATUS_HISTORY_EVENTS);
        if (hrc) {
            snprintf(err, errlen, "status: out of memory for the run's history");
            agent_status_free(st);
            return hrc;
        }
        pthread_mutex_init(&st->hist_mu, NULL);
        st->hist_ready = true;
        st->hist_started_at = st->start_time;
        o.on_history = on_history_request;
        o.on_history_arg = st;
        int rc = status_server_start(&o, &st->server, err, errlen);
        if (rc) {
            agent_status_free(st);
            return rc;
        }
    }
    *out = st;
    return 0;
}

/* agent_hooks.host_jobs: on the loop, when the agent hosts the server.
 * Kept only where they are served (a status port). */
static struct rdzv_jobs *on_host_jobs(void *arg)
{
    struct agent_status *st = arg;
    if (!st->hist_ready)
        return NULL;
    if (st->jobs == NULL) {
        struct rdzv_jobs *jobs = rdzv_jobs_new();
        if (jobs == NULL) {
            log_error("S0107", "status port: out of memory for the job-wide statistics");
            return NULL;
        }
        pthread_mutex_lock(&st->hist_mu);
        st->jobs = jobs;
        pthread_mutex_unlock(&st->hist_mu);
    }
    return st->jobs;
}

void agent_status_hooks(struct agent_status *st, struct agent_hooks *hooks)
{
    memset(hooks, 0, sizeof(*hooks));
    hooks->arg = st;
    int port = agent_status_port(st);
    hooks->status_port = port > 0 ? port : 0;
    hooks->attach = on_attach;
    hooks->start = on_start;
    hooks->stop = on_stop;
    hooks->loop_done = on_loop_done;
    hooks->state_changed = on_state_changed;
    hooks->prepare_worker = on_prepare_worker;
    hooks->host_jobs = on_host_jobs;
}

int agent_status_port(const struct agent_status *st)
{
    return st && st->server ? status_server_port(st->server) : -1;
}

void agent_status_linger(struct agent_status *st, const struct launch_config *cfg)
{
    if (st == NULL || st->server == NULL || cfg->status_linger_s <= 0)
        return;
    /* The loop is gone: its handled signals end the wait instead, taken with
     * sigtimedwait (blocked since the stop hook; the HTTP thread blocks all).
     * They stay blocked after: the process is about to exit, with the run's
     * status, which a late signal must not turn into death by signal. */
    sigset_t set;
    block_for_linger(st, &set);
    log_info("S0104", "status port: serving the final status for %.3g s", cfg->status_linger_s);
    uint64_t end = cddp_mono_ms() + (uint64_t)(cfg->status_linger_s * 1000.0);
    for (;;) {
        /* Still alive: /livez stays 200 while the final status is served. */
        status_server_heartbeat(st->server);
        publish(st);
        uint64_t now = cddp_mono_ms();
        if (now >= end)
            break;
        uint64_t wait = end - now < AGENT_STATUS_TICK_MS ? end - now : AGENT_STATUS_TICK_MS;
        struct timespec ts = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig > 0) {
            log_info("S0105", "status port: %s ends the wait", cddp_signal_name(sig));
            break;
        }
    }
}

void agent_status_free(struct agent_status *st)
{
    if (st == NULL)
        return;
    status_server_stop(st->server);
    if (st->stacks_mu_init)
        pthread_mutex_destroy(&st->stacks_mu);
    if (st->hist_ready) {
        pthread_mutex_destroy(&st->hist_mu);
        status_history_free(&st->hist);
    }
    rdzv_jobs_free(st->jobs);
    free(st->stacks_text);
    rdzv_view_builder_free(&st->rdzv_view_builder);
    free(st->slots);
    free(st->views);
    free(st);
}
