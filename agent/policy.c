/* policy.c: see policy.h. Pure: no I/O, no clock, no globals. */
#include "agent/policy.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/exitcodes.h"

int policy_init(struct agent_policy *p, int nworkers, int max_restarts,
                uint64_t shutdown_timeout_ms)
{
    memset(p, 0, sizeof(*p));
    p->workers = calloc((size_t)(nworkers > 0 ? nworkers : 1), sizeof(*p->workers));
    if (p->workers == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    p->state = AGENT_INIT;
    p->nworkers = nworkers;
    p->max_restarts = max_restarts;
    p->remaining_restarts = max_restarts;
    p->shutdown_timeout_ms = shutdown_timeout_ms;
    p->best_step = -1;
    p->attempt_base = -1;
    p->settle_ms = POLICY_DEFAULT_SETTLE_MS;
    p->asking = -1;
    return 0;
}

void policy_free(struct agent_policy *p)
{
    free(p->workers);
    p->workers = NULL;
}

struct out {
    struct policy_action *a;
    int n;
};

static struct policy_action *emit(struct out *o, enum policy_action_type type)
{
    /* POLICY_MAX_ACTIONS bounds every path below; the check keeps a future
     * mistake from writing past the caller's array. */
    if (o->n >= POLICY_MAX_ACTIONS)
        return &o->a[POLICY_MAX_ACTIONS - 1];
    struct policy_action *a = &o->a[o->n++];
    memset(a, 0, sizeof(*a));
    a->type = type;
    return a;
}

static bool any_running(const struct agent_policy *p)
{
    for (int i = 0; i < p->nworkers; i++) {
        if (p->workers[i].state == WORKER_RUNNING)
            return true;
    }
    return false;
}

static bool any_group_alive(const struct agent_policy *p)
{
    for (int i = 0; i < p->nworkers; i++) {
        if (p->workers[i].group_alive)
            return true;
    }
    return false;
}

static bool any_failed(const struct agent_policy *p)
{
    for (int i = 0; i < p->nworkers; i++) {
        if (p->workers[i].state == WORKER_FAILED)
            return true;
    }
    return false;
}

static void finish(struct agent_policy *p, struct out *o, enum agent_state state, int code)
{
    p->state = state;
    p->exit_code = code;
    struct policy_action *a = emit(o, POLICY_ACT_EXIT);
    a->exit_code = code;
    a->reason = p->stop_reason;
    /* The job is over for every node when it succeeded (the exit barrier
     * saw every node), or when worker failures used up the restarts. A
     * signal, or a rendezvous that closed or could not be reached, ends
     * this node only; when its workers had succeeded, the others are not
     * disturbed by its going. */
    a->end_job = (state == AGENT_SUCCEEDED && !p->barrier_failed) ||
                 (state == AGENT_FAILED && p->stop_reason == STOP_FAILURE);
    a->finished = !a->end_job && p->group_succeeded;
}

/* Workers failed past the restarts: 3 when the last failure was a worker
 * the watchdog found hung, else torchrun's 1. */
static int failure_code(const struct agent_policy *p)
{
    for (int i = 0; i < p->nworkers; i++) {
        if (p->workers[i].hung)
            return CDDP_EXIT_HUNG;
    }
    return CDDP_EXIT_FAILURE;
}

/* The run ends without a new round: the failure table when this node's
 * workers failed (in the attempt that just ended), then the exit: 5 when
 * the rendezvous is gone, else failure_code's. */
static void fail_run(struct agent_policy *p, struct out *o, enum stop_reason reason)
{
    p->stop_reason = reason;
    if (any_failed(p))
        emit(o, POLICY_ACT_FAILURE_REPORT);
    bool infra = reason == STOP_RDZV_CLOSED && !p->rdzv_job_fault;
    finish(p, o, AGENT_FAILED, infra ? CDDP_EXIT_INFRA : failure_code(p));
}

/* A failed attempt that would restart: with --max_no_progress_restarts, is
 * this the restart too many? Counts the attempt that just ended. */
static int next_no_progress_streak(const struct agent_policy *p)
{
    return p->attempt_progressed ? 0 : p->no_progress_streak + 1;
}

/* Would the attempt that is ending be the restart too many? (Pure: what
 * no_progress_stop decides, and policy_will_restart foresees.) */
static bool no_progress_exhausted(const struct agent_policy *p)
{
    return p->max_no_progress > 0 && p->attempt_is_restart &&
           next_no_progress_streak(p) >= p->max_no_progress;
}

static bool no_progress_stop(struct agent_policy *p, struct out *o)
{
    if (p->max_no_progress <= 0 || !p->attempt_is_restart)
        return false;
    bool exhausted = no_progress_exhausted(p);
    p->no_progress_streak = next_no_progress_streak(p);
    if (!exhausted)
        return false;
    p->no_progress_stop = true;
    emit(o, POLICY_ACT_FAILURE_REPORT);
    finish(p, o, AGENT_FAILED, CDDP_EXIT_NO_PROGRESS);
    return true;
}

static void start_round(struct agent_policy *p, const struct policy_event *ev, struct out *o);

/* Every worker has exited and every group is empty: what the stop was for. */
static void stopped(struct agent_policy *p, struct out *o)
{
    if (p->deadline_ms) {
        p->deadline_ms = 0;
        emit(o, POLICY_ACT_CLEAR_DEADLINE);
    }
    switch (p->stop_reason) {
    case STOP_FAILURE:
        if ((p->coordinated || p->remaining_restarts > 0) && no_progress_stop(p, o))
            break;
        if (p->coordinated) {
            /* The next round says whether this failure counts
             * (start_round counts the group restart then). */
            p->state = AGENT_RENDEZVOUS;
            struct policy_action *a = emit(o, POLICY_ACT_JOIN);
            a->reason = STOP_FAILURE;
            a->attempts_left = p->remaining_restarts - 1;
        } else if (p->remaining_restarts > 0) {
            p->remaining_restarts--;
            p->group_restarts++;
            p->state = AGENT_RENDEZVOUS;
            struct policy_action *a = emit(o, POLICY_ACT_JOIN);
            a->reason = STOP_FAILURE;
            a->attempts_left = p->remaining_restarts;
        } else {
            emit(o, POLICY_ACT_FAILURE_REPORT);
            finish(p, o, AGENT_FAILED, failure_code(p));
        }
        break;
    case STOP_SUCCESS:
    case STOP_NONE:
        p->state = AGENT_EXIT_BARRIER;
        p->group_succeeded = true;
        emit(o, POLICY_ACT_EXIT_BARRIER);
        break;
    case STOP_SIGNAL:
        finish(p, o, AGENT_TERMINATED, CDDP_EXIT_SIGNAL_BASE + p->term_signal);
        break;
    case STOP_MEMBERSHIP:
        p->state = AGENT_RENDEZVOUS;
        if (p->round_ready) {
            /* (worker scope: the round came while the workers stopped) */
            p->round_ready = false;
            start_round(p, &p->pending, o);
        } else if (!p->rejoining) {
            emit(o, POLICY_ACT_JOIN)->reason = STOP_MEMBERSHIP;
        } /* else the join made with the workers running answers */
        break;
    case STOP_RDZV_CLOSED:
        fail_run(p, o, STOP_RDZV_CLOSED);
        break;
    }
}

bool policy_will_restart(const struct agent_policy *p)
{
    if (p->state != AGENT_STOPPING && p->state != AGENT_KILLING)
        return false;
    switch (p->stop_reason) {
    case STOP_MEMBERSHIP:
        return true;
    case STOP_FAILURE:
        return (p->coordinated || p->remaining_restarts > 0) && !no_progress_exhausted(p);
    default:
        return false;
    }
}

static void check_stopped(struct agent_policy *p, struct out *o)
{
    if (!any_running(p) && !any_group_alive(p))
        stopped(p, o);
}

static void begin_stop(struct agent_policy *p, struct out *o, enum stop_reason reason, int sig,
                       uint64_t now_ms)
{
    /* Worker scope, several nodes: a failure while this node rejoins (a
     * survivor that gave up waiting for the lost node's place to be
     * filled) follows from the lost node; the round has ended already. */
    if ((p->rejoining || p->round_ready) && reason == STOP_FAILURE)
        reason = STOP_MEMBERSHIP;
    p->stop_reason = reason;
    p->state = AGENT_STOPPING;
    if (reason == STOP_FAILURE)
        emit(o, POLICY_ACT_REPORT_FAILURE);
    if (!any_running(p) && !any_group_alive(p)) {
        stopped(p, o);
        return;
    }
    struct policy_action *a = emit(o, POLICY_ACT_SIGNAL_GROUPS);
    a->sig = sig;
    a->reason = reason;
    /* 0 would mean "no deadline": a zero timeout still needs one, now. */
    p->deadline_ms = now_ms + p->shutdown_timeout_ms;
    if (p->deadline_ms == 0)
        p->deadline_ms = 1;
    emit(o, POLICY_ACT_SET_DEADLINE)->deadline_ms = p->deadline_ms;
}

/* Worker scope: is a replacement still settling? One is while it has not
 * reported a step (its group has not re-formed), and for settle_ms after
 * it started whatever it reported; or while one is asked of the
 * rendezvous. */
static bool replacement_pending(const struct agent_policy *p, uint64_t now_ms)
{
    if (p->asking >= 0)
        return true;
    for (int i = 0; i < p->nworkers; i++) {
        if (p->workers[i].replacing || p->workers[i].blamed)
            return true;
    }
    return p->last_replace_ms != 0 && now_ms < p->last_replace_ms + p->settle_ms;
}

/* Local rank i is one of the workers generation gen replaces. */
static void replaced_in(struct agent_policy *p, int i, int64_t gen)
{
    struct policy_worker *w = &p->workers[i];
    w->state = WORKER_RUNNING;
    w->exitcode = 0;
    w->group_alive = true; /* its new process; what the old one left is killed */
    w->replacing = true;
    w->blamed = false;
    w->replaced_gen = gen;
    w->restarts++;
}

/* Generation gen starts the workers replaced_in() marked (local rank
 * `first` the lowest): one restart, however many it replaces. */
static void restart_in_place(struct agent_policy *p, int first, int64_t gen, uint64_t now_ms,
                             struct out *o)
{
    p->remaining_restarts--;
    p->worker_restarts++;
    p->local_restarts += p->one_node;
    p->generation = gen;
    p->last_replace_ms = now_ms ? now_ms : 1;
    struct policy_action *a = emit(o, POLICY_ACT_RESTART_WORKER);
    a->local_rank = first;
    a->generation = gen;
    a->attempts_left = p->remaining_restarts;
}

/* Local rank i restarts alone in generation gen. */
static void restart_alone(struct agent_policy *p, int i, int64_t gen, uint64_t now_ms,
                          struct out *o)
{
    replaced_in(p, i, gen);
    restart_in_place(p, i, gen, now_ms, o);
}

/* Worker scope: a worker the agent killed as hung has exited (failed).
 * Once every worker killed for this generation has (a node's ranks hang
 * together, and each survivor names all of them in one write), they are
 * replaced together in one generation, on the terms a lone failure is:
 * on one node at once, on several nodes asked of the rendezvous for all
 * of them in one replace (POLICY_ACT_REQUEST_GENERATION; the workers
 * marked `asked`). false: the caller fails the group. */
static bool replace_blamed(struct agent_policy *p, uint64_t now_ms, struct out *o)
{
    int n = 0;
    for (int i = 0; i < p->nworkers; i++) {
        if (p->workers[i].blamed && p->workers[i].state == WORKER_RUNNING)
            return true; /* killed, not yet exited: wait for it */
        n += p->workers[i].blamed;
    }
    bool ok = p->scope == RESTART_SCOPE_WORKER && (p->one_node || p->rdzv_generations) &&
              (n < p->nworkers || !p->one_node) && p->remaining_restarts > 0 && p->asking < 0 &&
              !p->rejoining && !p->round_ready &&
              !(p->last_replace_ms != 0 && now_ms < p->last_replace_ms + p->settle_ms);
    for (int i = 0; i < p->nworkers && ok; i++)
        ok = !p->workers[i].hung && !p->workers[i].replacing;
    int64_t gen = p->generation + 1;
    int first = -1;
    for (int i = 0; i < p->nworkers; i++) {
        if (!p->workers[i].blamed)
            continue;
        p->workers[i].blamed = false;
        first = first < 0 ? i : first;
        if (ok && p->one_node)
            replaced_in(p, i, gen);
        else if (ok)
            p->workers[i].asked = true; /* (state FAILED until the answer) */
    }
    if (!ok) {
        p->scope_fallbacks++;
        return false;
    }
    if (p->one_node) {
        restart_in_place(p, first, gen, now_ms, o);
    } else {
        p->asking = first;
        emit(o, POLICY_ACT_REQUEST_GENERATION)->local_rank = first;
    }
    return true;
}

/* Worker scope: local rank i failed (exitcode != 0) while the group runs.
 * Restarts it alone when that is allowed (policy.h), or, on several
 * nodes, asks the rendezvous whether it may; false: the caller fails the
 * group as under group scope. */
static bool replace_worker(struct agent_policy *p, int i, uint64_t now_ms, struct out *o)
{
    if (p->scope != RESTART_SCOPE_WORKER || (!p->one_node && !p->rdzv_generations))
        return false;
    struct policy_worker *w = &p->workers[i];
    if ((p->one_node && p->nworkers < 2) || p->remaining_restarts <= 0)
        return false; /* no peer to re-form with / the run ends as under group */
    if (w->hung || replacement_pending(p, now_ms) || p->rejoining || p->round_ready) {
        p->scope_fallbacks++;
        return false;
    }
    if (!p->one_node) {
        p->asking = i;
        w->asked = true;
        w->state = WORKER_FAILED; /* until the answer */
        emit(o, POLICY_ACT_REQUEST_GENERATION)->local_rank = i;
        return true;
    }
    restart_alone(p, i, p->generation + 1, now_ms, o);
    return true;
}

/* POLICY_EV_GENERATION (several nodes, worker scope). */
static void on_generation(struct agent_policy *p, const struct policy_event *ev, uint64_t now_ms,
                          struct out *o)
{
    int i = p->asking;
    bool ours = i >= 0 && ev->local_rank == i;
    if (ours || ev->generation <= 0)
        p->asking = -1;
    if (p->state != AGENT_RUNNING)
        return; /* (stopping already: the answer changes nothing) */
    if (ev->generation <= 0) {
        for (int k = 0; k < p->nworkers; k++)
            p->workers[k].asked = false;
        if (i >= 0) {
            p->scope_fallbacks++;
            begin_stop(p, o, STOP_FAILURE, SIGTERM, now_ms);
        }
        return;
    }
    /* The grant is one of the job's counted restarts, on every node. */
    if (p->coordinated) {
        int64_t count = (ev->restart_count < 0 ? 0 : ev->restart_count) + p->local_restarts;
        if (count > INT_MAX)
            count = INT_MAX;
        int64_t left = (int64_t)p->max_restarts - count + (ours ? 1 : 0);
        p->remaining_restarts = left < INT_MIN / 2 ? INT_MIN / 2 : (int)left;
    }
    if (ours) {
        /* the worker asked for, or each of the ranks asked for together */
        for (int k = 0; k < p->nworkers; k++) {
            if (p->workers[k].asked || k == i)
                replaced_in(p, k, ev->generation);
            p->workers[k].asked = false;
        }
        restart_in_place(p, i, ev->generation, now_ms, o);
        return;
    }
    /* Another node's worker: this node's workers re-form with it. */
    if (ev->generation > p->generation)
        p->generation = ev->generation;
    p->last_replace_ms = now_ms ? now_ms : 1;
}

static void on_worker_exit(struct agent_policy *p, const struct policy_event *ev, uint64_t now_ms,
                           struct out *o)
{
    if (ev->local_rank < 0 || ev->local_rank >= p->nworkers)
        return;
    struct policy_worker *w = &p->workers[ev->local_rank];
    if (w->state != WORKER_RUNNING)
        return;
    w->exitcode = ev->exitcode;
    if (ev->group_empty)
        w->group_alive = false;
    if (p->state == AGENT_RUNNING) {
        if (w->blamed) {
            w->state = WORKER_FAILED;
            if (w->exitcode == 0)
                w->exitcode = 1; /* (it was killed as hung, whatever it said) */
            if (!replace_blamed(p, now_ms, o))
                begin_stop(p, o, STOP_FAILURE, SIGTERM, now_ms);
            return;
        }
        if (ev->exitcode != 0) {
            if (replace_worker(p, ev->local_rank, now_ms, o))
                return;
            w->state = WORKER_FAILED;
            begin_stop(p, o, STOP_FAILURE, SIGTERM, now_ms);
            return;
        }
        w->state = WORKER_SUCCEEDED;
        if (!any_running(p)) {
            if (any_group_alive(p))
                begin_stop(p, o, STOP_SUCCESS, SIGTERM, now_ms);
            else
                stopped(p, o); /* stop_reason is STOP_NONE: success */
        }
        return;
    }
    if (p->state == AGENT_STOPPING || p->state == AGENT_KILLING) {
        w->state = w->hung ? WORKER_FAILED : ev->exitcode == 0 ? WORKER_SUCCEEDED : WORKER_STOPPED;
        check_stopped(p, o);
    }
}

static void on_signal(struct agent_policy *p, int sig, struct out *o, uint64_t now_ms)
{
    switch (p->state) {
    case AGENT_INIT:
    case AGENT_RENDEZVOUS:
    case AGENT_EXIT_BARRIER:
        p->stop_reason = STOP_SIGNAL;
        p->term_signal = sig;
        finish(p, o, AGENT_TERMINATED, CDDP_EXIT_SIGNAL_BASE + sig);
        break;
    case AGENT_RUNNING:
        p->term_signal = sig;
        begin_stop(p, o, STOP_SIGNAL, sig, now_ms);
        break;
    case AGENT_STOPPING:
        if (p->stop_reason == STOP_SIGNAL) {
            /* A second signal: the user wants out now. */
            p->state = AGENT_KILLING;
            p->deadline_ms = 0;
            emit(o, POLICY_ACT_CLEAR_DEADLINE);
            struct policy_action *a = emit(o, POLICY_ACT_SIGNAL_GROUPS);
            a->sig = SIGKILL;
            a->reason = STOP_SIGNAL;
        } else {
            /* Stopping for a restart or success: no restart now; forward the
             * signal and keep the deadline already running. */
            p->stop_reason = STOP_SIGNAL;
            p->term_signal = sig;
            struct policy_action *a = emit(o, POLICY_ACT_SIGNAL_GROUPS);
            a->sig = sig;
            a->reason = STOP_SIGNAL;
        }
        break;
    case AGENT_KILLING:
        if (p->stop_reason != STOP_SIGNAL) {
            p->stop_reason = STOP_SIGNAL;
            p->term_signal = sig;
        }
        break;
    case AGENT_SUCCEEDED:
    case AGENT_FAILED:
    case AGENT_TERMINATED:
        break;
    }
}

/* Coordinated: the job's restart count from the round (plus the workers
 * this node restarted alone, which the rendezvous never heard of); false
 * when it is past max_restarts and the run ended. */
static bool take_restart_count(struct agent_policy *p, const struct policy_event *ev, struct out *o)
{
    if (!p->coordinated)
        return true;
    /* restart_count is at most 2^53; keep max - remaining (the count
     * policy_restart_count gives) within an int. */
    int64_t count = ev->restart_count < 0 ? 0 : ev->restart_count;
    count += p->local_restarts;
    if (count > INT_MAX)
        count = INT_MAX;
    int64_t left = (int64_t)p->max_restarts - count;
    if (left < (int64_t)p->max_restarts - INT_MAX)
        left = (int64_t)p->max_restarts - INT_MAX;
    p->remaining_restarts = (int)left;
    if (left < 0) {
        fail_run(p, o, STOP_FAILURE);
        return false;
    }
    return true;
}

/* A round to start the workers in (state RENDEZVOUS). */
static void start_round(struct agent_policy *p, const struct policy_event *ev, struct out *o)
{
    int before = policy_restart_count(p);
    if (!take_restart_count(p, ev, o))
        return;
    /* Several nodes: this node's workers start again as a group, and the
     * job counted a failure since they started (this node's, or another
     * node's that this one followed as a membership change): a group
     * restart, by scope, on every node. A round that does not count the
     * failure (a node was lost first) is none; a first start is none. */
    if (p->coordinated && p->attempts > 0 && policy_restart_count(p) > before)
        p->group_restarts++;
    for (int i = 0; i < p->nworkers; i++) {
        p->workers[i].state = WORKER_RUNNING;
        p->workers[i].exitcode = 0;
        p->workers[i].group_alive = true;
        p->workers[i].hung = false;
        p->workers[i].replacing = false;
        p->workers[i].blamed = false;
        p->workers[i].replaced_gen = 0;
        p->workers[i].asked = false;
    }
    /* a new group: a fresh store, generation 0; or a lost node's place
     * in a group that goes on in place (its generation) */
    p->generation = ev->generation;
    p->one_node = ev->nnodes <= 1;
    p->last_replace_ms = 0;
    p->asking = -1;
    p->stop_reason = STOP_NONE;
    p->state = AGENT_RUNNING;
    p->attempt_is_restart = p->attempts++ > 0;
    p->attempt_base = p->best_step;
    p->attempt_progressed = false;
    p->group_succeeded = false;
    p->barrier_failed = false;
    emit(o, POLICY_ACT_START_WORKERS);
}

/* Worker scope, several nodes: the round this node joined with its
 * workers running has come. Kept: they carry on in the new generation;
 * otherwise they are stopped (or already being stopped) and the round's
 * workers start once they are (stopped). */
static void rejoined(struct agent_policy *p, const struct policy_event *ev, uint64_t now_ms,
                     struct out *o)
{
    p->rejoining = false;
    if (p->state == AGENT_RUNNING && ev->kept) {
        if (!take_restart_count(p, ev, o))
            return;
        p->generation = ev->generation;
        p->node_replacements++;
        p->one_node = ev->nnodes <= 1;
        emit(o, POLICY_ACT_NEW_GENERATION)->generation = ev->generation;
        return;
    }
    if (p->state != AGENT_RUNNING && p->state != AGENT_STOPPING && p->state != AGENT_KILLING)
        return;
    p->round_ready = true;
    p->pending = *ev;
    /* workers that were to be kept start afresh (a new group); a node
     * whose ranks the round replaced starts them in its generation */
    if (p->pending.kept)
        p->pending.generation = 0;
    p->pending.kept = false;
    if (p->state == AGENT_RUNNING)
        begin_stop(p, o, STOP_MEMBERSHIP, SIGTERM, now_ms);
}

int policy_step(struct agent_policy *p, const struct policy_event *ev, uint64_t now_ms,
                struct policy_action *out)
{
    struct out o = {out, 0};
    switch (ev->type) {
    case POLICY_EV_START:
        if (p->state == AGENT_INIT) {
            p->state = AGENT_RENDEZVOUS;
            emit(&o, POLICY_ACT_JOIN)->reason = STOP_NONE;
        }
        break;
    case POLICY_EV_ROUND:
        if (p->state == AGENT_RENDEZVOUS) {
            /* (workers that were to be kept are gone: a new group here) */
            struct policy_event e = *ev;
            if (e.kept)
                e.generation = 0;
            p->rejoining = false;
            start_round(p, &e, &o);
        } else if (p->rejoining) {
            rejoined(p, ev, now_ms, &o);
        }
        break;
    case POLICY_EV_ROUND_FAILED:
        if (p->rejoining && p->state != AGENT_RENDEZVOUS) {
            /* the join made with the workers running failed: no round */
            p->rejoining = false;
            p->rdzv_job_fault = ev->exitcode != 0;
            if (p->state == AGENT_RUNNING)
                begin_stop(p, &o, STOP_RDZV_CLOSED, SIGTERM, now_ms);
            else if (p->stop_reason == STOP_MEMBERSHIP)
                p->stop_reason = STOP_RDZV_CLOSED;
        } else if (p->state == AGENT_RENDEZVOUS) {
            p->rdzv_job_fault = ev->exitcode != 0;
            if (ev->graceful) {
                p->stop_reason = STOP_NONE;
                finish(p, &o, AGENT_SUCCEEDED, CDDP_EXIT_OK);
            } else {
                fail_run(p, &o, STOP_RDZV_CLOSED);
            }
        }
        break;
    case POLICY_EV_WORKER_EXIT:
        on_worker_exit(p, ev, now_ms, &o);
        break;
    case POLICY_EV_GROUP_EMPTY:
        if (ev->local_rank < 0 || ev->local_rank >= p->nworkers)
            break;
        if (p->workers[ev->local_rank].state == WORKER_RUNNING)
            break; /* the leader is alive, so its group cannot be empty: stale */
        p->workers[ev->local_rank].group_alive = false;
        if (p->state == AGENT_STOPPING || p->state == AGENT_KILLING)
            check_stopped(p, &o);
        break;
    case POLICY_EV_DEADLINE:
        if (p->state == AGENT_STOPPING && p->deadline_ms && now_ms >= p->deadline_ms) {
            p->state = AGENT_KILLING;
            p->deadline_ms = 0;
            struct policy_action *a = emit(&o, POLICY_ACT_SIGNAL_GROUPS);
            a->sig = SIGKILL;
            a->reason = p->stop_reason;
        }
        break;
    case POLICY_EV_SIGNAL:
        on_signal(p, ev->sig, &o, now_ms);
        break;
    case POLICY_EV_GENERATION:
        on_generation(p, ev, now_ms, &o);
        break;
    case POLICY_EV_RDZV_RESTART:
        p->asking = -1; /* (an answer would be about the round that ended) */
        if (p->state == AGENT_RUNNING && p->scope == RESTART_SCOPE_WORKER && !p->one_node &&
            !ev->counted && !p->rejoining && !any_failed(p)) {
            /* A node was lost: join with the workers running (policy.h). */
            p->rejoining = true;
            struct policy_action *a = emit(&o, POLICY_ACT_JOIN);
            a->reason = STOP_MEMBERSHIP;
            a->keep = true;
        } else if (p->state == AGENT_RUNNING && p->rejoining) {
            /* (a join is pending already) */
        } else if (p->state == AGENT_RUNNING) {
            begin_stop(p, &o, STOP_MEMBERSHIP, SIGTERM, now_ms);
        } else if ((p->state == AGENT_STOPPING || p->state == AGENT_KILLING) &&
                   p->stop_reason == STOP_SUCCESS) {
            /* The group succeeded, but the job goes on in a new round. */
            p->stop_reason = STOP_MEMBERSHIP;
        } else if (p->state == AGENT_EXIT_BARRIER) {
            /* The barrier cannot complete: the other nodes start a new round. */
            p->stop_reason = STOP_MEMBERSHIP;
            p->state = AGENT_RENDEZVOUS;
            p->group_succeeded = false;
            emit(&o, POLICY_ACT_JOIN)->reason = STOP_MEMBERSHIP;
        }
        break;
    case POLICY_EV_RDZV_CLOSED:
        if (!policy_finished(p))
            p->rdzv_job_fault = ev->exitcode != 0;
        if (p->state == AGENT_RUNNING) {
            begin_stop(p, &o, STOP_RDZV_CLOSED, SIGTERM, now_ms);
        } else if (p->state == AGENT_RENDEZVOUS) {
            fail_run(p, &o, STOP_RDZV_CLOSED);
        } else if ((p->state == AGENT_STOPPING || p->state == AGENT_KILLING) &&
                   (p->stop_reason == STOP_FAILURE || p->stop_reason == STOP_MEMBERSHIP)) {
            /* No new round can come: the stop now ends the run. */
            p->stop_reason = STOP_RDZV_CLOSED;
        } else if (p->state == AGENT_EXIT_BARRIER) {
            /* torchrun only logs barrier errors: the workers succeeded. */
            finish(p, &o, AGENT_SUCCEEDED, CDDP_EXIT_OK);
        }
        break;
    case POLICY_EV_WATCHDOG:
        /* A hung worker fails the group as an exit would: the same stop,
         * the same restart budget. It is still running, so it is stopped
         * with the others and counted as failed when it exits. */
        if (p->state == AGENT_RUNNING && ev->local_rank >= 0 && ev->local_rank < p->nworkers &&
            p->workers[ev->local_rank].state == WORKER_RUNNING) {
            p->workers[ev->local_rank].hung = true;
            begin_stop(p, &o, STOP_FAILURE, SIGTERM, now_ms);
        }
        break;
    case POLICY_EV_PROGRESS:
        /* A replacement's first step: its group has re-formed. */
        if (ev->local_rank >= 0 && ev->local_rank < p->nworkers)
            p->workers[ev->local_rank].replacing = false;
        if (ev->step > p->best_step)
            p->best_step = ev->step;
        if (ev->step > p->attempt_base)
            p->attempt_progressed = true;
        break;
    case POLICY_EV_WORKER_BLAMED:
        if (p->state == AGENT_RUNNING && p->scope == RESTART_SCOPE_WORKER && ev->local_rank >= 0 &&
            ev->local_rank < p->nworkers && p->workers[ev->local_rank].state == WORKER_RUNNING &&
            ev->generation == p->generation)
            p->workers[ev->local_rank].blamed = true;
        break;
    case POLICY_EV_BARRIER_DONE:
        if (p->state == AGENT_EXIT_BARRIER) {
            /* torchrun only logs barrier errors: the workers succeeded. */
            p->barrier_failed = ev->exitcode != 0;
            finish(p, &o, AGENT_SUCCEEDED, CDDP_EXIT_OK);
        }
        break;
    }
    return o.n;
}

const char *agent_state_name(enum agent_state s)
{
    switch (s) {
    case AGENT_INIT:
        return "INIT";
    case AGENT_RENDEZVOUS:
        return "RENDEZVOUS";
    case AGENT_RUNNING:
        return "HEALTHY";
    case AGENT_STOPPING:
        return "STOPPING";
    case AGENT_KILLING:
        return "KILLING";
    case AGENT_EXIT_BARRIER:
        return "EXIT_BARRIER";
    case AGENT_SUCCEEDED:
        return "SUCCEEDED";
    case AGENT_FAILED:
        return "FAILED";
    case AGENT_TERMINATED:
        return "TERMINATED";
    }
    return "UNKNOWN";
}

const char *worker_state_name(enum worker_state s)
{
    switch (s) {
    case WORKER_INIT:
        return "INIT";
    case WORKER_RUNNING:
        return "RUNNING";
    case WORKER_SUCCEEDED:
        return "SUCCEEDED";
    case WORKER_FAILED:
        return "FAILED";
    case WORKER_STOPPED:
        return "STOPPED";
    }
    return "UNKNOWN";
}

const char *restart_scope_name(enum restart_scope s)
{
    return s == RESTART_SCOPE_WORKER ? "worker" : "group";
}

const char *stop_reason_name(enum stop_reason r)
{
    switch (r) {
    case STOP_NONE:
        return "none";
    case STOP_FAILURE:
        return "failure";
    case STOP_SUCCESS:
        return "success";
    case STOP_SIGNAL:
        return "signal";
    case STOP_MEMBERSHIP:
        return "membership";
    case STOP_RDZV_CLOSED:
        return "rendezvous closed";
    }
    return "unknown";
}
