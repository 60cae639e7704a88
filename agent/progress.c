/*
 * progress.c: what the workers' progress lines drive in the agent
 * (agent_int.h). Each line feeds the progress watchdog (agent/watchdog.c
 * decides) and --max_no_progress_restarts; the watchdog's timer follows its
 * next deadline while the group runs, and a worker found hung has its
 * stacks captured (agent/stacks.h) before the policy stops its group.
 * Under --restart_scope=worker a line may also name a hung peer ("blame":
 * a cddp-train rank whose collective timed out): the agent that runs it
 * kills it, and the policy replaces it in place as after a crash.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "agent/agent_int.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

/* The hung worker's stacks are written (or gdb ran out of time): stop the
 * group. */
static void on_hung_stacks(struct agent_stacks_job *job)
{
    struct agent *a = job->data;
    int i = a->hung_rank;
    if (job->timed_out)
        log_warn("A0904", "gdb did not finish within %d ms; its stacks are incomplete",
                 AGENT_STACKS_TIMEOUT_MS);
    a->hung_rank = -1;
    if (i >= 0 && !a->shutting_down)
        agent_post(a, POLICY_EV_WATCHDOG, i, 0, 0);
}

/* Writes what local rank i was doing next to its logs (attempt_N/i/stacks.txt)
 * and names the file in its hang note; the stop waits for the capture. */
static void capture_hung(struct agent *a, int i)
{
    struct agent_worker *w = &a->workers[i];
    struct agent_stacks_target *t = &a->hung_target;
    memset(t, 0, sizeof(*t));
    a->hung_rank = i;
    if (!a->logs.devnull &&
        agent_logs_path(&a->logs, a->attempt, i, "stacks.txt", t->path, sizeof(t->path)) == 0)
        t->pgid = w->pgid;
    agent_stacks_job_start(&a->hung_stacks, t, 1, on_hung_stacks);
    if (t->pgid <= 0)
        return;
    if (t->rc) {
        log_warn("A0905", "writing the stacks of local_rank %d to %s: %s", i, t->path,
                 cddp_strerror(t->rc));
        return;
    }
    size_t n = strlen(w->hang_note);
    snprintf(w->hang_note + n, sizeof(w->hang_note) - n, "; stacks: %s", t->path);
}

static void on_watchdog_timer(uv_timer_t *t)
{
    struct agent *a = t->data;
    uint64_t now = cddp_mono_ms();
    if (a->hung_rank >= 0)
        return; /* already stopping a hung group */
    int i = a->pol.state == AGENT_RUNNING ? watchdog_hung(&a->wd, now) : -1;
    if (i < 0) {
        agent_watchdog_arm(a); /* early (the loop's clock lags), or nothing to do */
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
    char what[400];
    snprintf(what, sizeof(what), "watchdog: no progress for %.1f s %s (timeout %.1f s, %s%s)",
             (double)since / 1000.0, last, (double)timeout / 1000.0,
             ww->lines == 0 ? "--watchdog_initial" : watchdog_mode_name(a->cfg->watchdog.mode),
             ww->lines > 0 && a->cfg->watchdog.mode == WATCHDOG_AUTO && ww->learned_ms == 0
                 ? ", warming up"
                 : "");
    /* The table reads it after the stop; the log line comes before the
     * stacks are taken (up to 5 s), and the stop after them. */
    snprintf(w->hang_note, sizeof(w->hang_note), "%s; the worker group was stopped", what);
    w->hung_at = cddp_wall_time();
    w->exit_seq = ++a->exit_seq; /* found before the exits the stop causes: the root cause */
    a->watchdog_kills++;
    log_error("A0901",
              "[%s] local_rank %d (pid %d) is hung: %s; taking its stacks, then stopping "
              "the worker group",
              a->cfg->role, i, (int)w->pgid, what);
    capture_hung(a, i);
}

/* The timer follows the watchdog's next deadline, only while the group runs. */
void agent_watchdog_arm(struct agent *a)
{
    if (!a->handles_open || a->cfg->watchdog.mode == WATCHDOG_OFF)
        return;
    uint64_t d =
        a->pol.state == AGENT_RUNNING && a->hung_rank < 0 ? watchdog_next_deadline(&a->wd) : 0;
    if (d == 0) {
        uv_timer_stop(&a->watchdog_timer);
        return;
    }
    uv_update_time(&a->loop);
    uint64_t now = cddp_mono_ms();
    uv_timer_start(&a->watchdog_timer, on_watchdog_timer, d > now ? d - now + 1 : 0, 0);
}

/* Global rank `rank`, which runs here as local rank i, never reached a
 * collective of generation gen, says `who` (a rank here, or another
 * node): it is killed once (no stacks: gdb would take longer than the
 * recovery); its exit is then a failure the policy replaces in place. */
static void kill_blamed(struct agent *a, int i, int64_t gen, const char *who)
{
    struct agent_worker *w = &a->workers[i];
    if (gen != a->pol.generation || w->blamed_gen == gen + 1 || !w->leader_alive || w->pgid <= 0 ||
        a->pol.workers[i].state != WORKER_RUNNING)
        return; /* an older generation's, or already done */
    w->blamed_gen = gen + 1;
    snprintf(w->blame_note, sizeof(w->blame_note),
             "killed by the agent: %s's collective timed out waiting for it", who);
    log_warn("A0224",
             "[%s] local_rank %d (rank %d, pid %d) never reached a collective that %s waited for "
             "(generation %lld): killing it, to replace it in place",
             a->cfg->role, i, w->info.rank, (int)w->info.pid, who, (long long)gen);
    /* (first: its exit, which comes later, is then the policy's to wait
     * for, with any other rank of this node named for gen) */
    struct policy_event ev = {.type = POLICY_EV_WORKER_BLAMED, .local_rank = i, .generation = gen};
    agent_post_event(a, &ev);
    agent_signal_group(w->pgid, SIGKILL);
}

static int local_rank_of(const struct agent *a, int64_t rank)
{
    for (int k = 0; k < a->nworkers; k++)
        if (a->workers[k].info.rank == rank)
            return k;
    return -1;
}

/* Local rank `from` says global rank `rank` never reached a collective of
 * generation gen (docs/distributed.md, "Recovering in place"). A rank here
 * is killed (kill_blamed); another node's is passed on, once, through the
 * rendezvous to that node's agent (agent_progress_remote_blame there). */
static void blamed(struct agent *a, int from, int64_t rank, int64_t gen)
{
    if (a->pol.scope != RESTART_SCOPE_WORKER || a->pol.state != AGENT_RUNNING)
        return;
    int i = local_rank_of(a, rank);
    if (i >= 0) {
        char who[32];
        snprintf(who, sizeof(who), "rank %d", a->workers[from].info.rank);
        kill_blamed(a, i, gen, who);
        return;
    }
    if (a->blame_sent_rank == rank && a->blame_sent_gen == gen + 1)
        return; /* (passed on already: its peers here name it too) */
    bool sent = a->rdzv && a->rdzv->ops->blame && a->pol.generation == gen && rank <= INT32_MAX &&
                a->rdzv->ops->blame(a->rdzv, (int)rank, gen) == 0;
    if (sent) {
        a->blame_sent_rank = (int)rank;
        a->blame_sent_gen = gen + 1;
    }
    log_info("A0225",
             "[%s] local_rank %d names rank %lld as never reaching a collective: not on this "
             "node%s",
             a->cfg->role, from, (long long)rank,
             sent ? "; passed on to its node's agent through the rendezvous" : "");
}

void agent_progress_remote_blame(struct agent *a, int rank, int64_t gen, const char *node_id)
{
    if (a->pol.scope != RESTART_SCOPE_WORKER || a->pol.state != AGENT_RUNNING)
        return;
    int i = local_rank_of(a, rank);
    if (i < 0)
        return;
    char who[160];
    snprintf(who, sizeof(who), "a rank on node %s", node_id ? node_id : "?");
    kill_blamed(a, i, gen, who);
}

void agent_progress(struct agent *a, int local_rank, const struct progress_report *r,
                    uint64_t now_ms)
{
    if (a == NULL || a->shutting_down || local_rank < 0 || local_rank >= a->nworkers)
        return;
    /* every blame line since the last report: one read may carry several */
    uint64_t seen = a->workers[local_rank].blames_seen;
    if (seen > r->blames)
        seen = r->blames; /* (a counter never goes back; nothing new) */
    if (r->blames - seen > PROGRESS_BLAMES_KEPT)
        seen = r->blames - PROGRESS_BLAMES_KEPT;
    for (; seen < r->blames; seen++)
        blamed(a, local_rank, r->blame_ranks[seen % PROGRESS_BLAMES_KEPT],
               r->blame_gens[seen % PROGRESS_BLAMES_KEPT]);
    a->workers[local_rank].blames_seen = r->blames;
    /* (worker scope: a replacement's first step says its group re-formed) */
    if ((r->fields & PROGRESS_STEP) &&
        ((r->step > a->pol.best_step && a->pol.max_no_progress > 0) ||
         a->pol.workers[local_rank].replacing)) {
        if (a->pol.workers[local_rank].replacing && a->recovery_started > 0) {
            a->last_recovery_s = cddp_wall_time() - a->recovery_started;
            log_info("A0223",
                     "[%s] local_rank %d re-formed the group: its first step (%lld) %.3f s "
                     "after it was restarted alone",
                     a->cfg->role, local_rank, (long long)r->step, a->last_recovery_s);
            agent_spares_fill(a); /* the spare used, replaced once the group runs again */
        }
        struct policy_event ev = {
            .type = POLICY_EV_PROGRESS, .local_rank = local_rank, .step = r->step};
        agent_post_event(a, &ev);
    }
    if (r->fields & PROGRESS_STEP) {
        enum goodput_phase was = a->gp.phase;
        goodput_step(&a->gp, r->step, now_ms);
        if (a->gp.phase != was)
            agent_show(a); /* the attempt's first step: /status shows its phase */
    }
    agent_stragglers_line(a, local_rank, r, now_ms);
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
    agent_watchdog_arm(a);
    if (before != after && !a->dispatching)
        agent_notify(a); /* /status shows the timeout that applies */
}
