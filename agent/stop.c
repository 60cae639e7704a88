/*
 * stop.c: stopping the workers (agent.c's POLICY_ACT_SIGNAL): the signal
 * to each worker's process group, and what SIGKILL could not end: a
 * process in uninterruptible sleep is reported with its /proc state and
 * given up after a bounded wait, so the agent never hangs on it.
 */
#include "agent/agent_int.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>

#include "agent/stacks.h"
#include "agent/watchdog.h"
#include "agent/workers.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/signames.h"

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
            agent_post_event(a, &ev);
        } else {
            agent_post(a, POLICY_EV_GROUP_EMPTY, i, 0, 0);
        }
    }
}

void agent_signal_groups(struct agent *a, int sig)
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
