/*
 * stragglers.c: --straggler_factor's runtime state (agent_int.h). Each
 * local rank's progress lines feed its step-time window; at most every
 * AGENT_STRAGGLER_JUDGE_MS, while lines come in, the running ranks are
 * judged against the node's median (common/straggler.h decides): a log
 * line for each rank that becomes, or stops being, a straggler, the
 * summary this node's rendezvous heartbeats carry (the server judges the
 * nodes the same way), and the step times the status page shows. Report
 * only: nothing here stops or restarts anyone.
 *
 * The time judged is compute (the step outside collective waits) when
 * every measured rank reports it, else the step time: in synchronous DDP
 * every rank's step lasts as long as the slowest one's, so only compute
 * can name the slow rank there; without DDP, step time can.
 */
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "proto/msg.h"

/* How often the ranks are judged, at most (lines drive it). */
#define AGENT_STRAGGLER_JUDGE_MS 500

int agent_stragglers_init(struct agent *a)
{
    struct agent_stragglers *s = &a->strag;
    size_t n = (size_t)a->nworkers;
    s->win = calloc(n, sizeof(*s->win));
    s->m = calloc(n, sizeof(*s->m));
    s->ch = calloc(n, sizeof(*s->ch));
    s->scratch = calloc(n, sizeof(*s->scratch));
    s->step_s = calloc(n, sizeof(*s->step_s));
    s->compute_s = calloc(n, sizeof(*s->compute_s));
    s->judged = calloc(n, sizeof(*s->judged));
    s->vals = calloc(n, sizeof(*s->vals));
    if (!s->win || !s->m || !s->ch || !s->scratch || !s->step_s || !s->compute_s || !s->judged ||
        !s->vals)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    for (size_t i = 0; i < n; i++)
        s->step_s[i] = s->compute_s[i] = -1;
    return 0;
}

void agent_stragglers_free(struct agent *a)
{
    struct agent_stragglers *s = &a->strag;
    free(s->win);
    free(s->m);
    free(s->ch);
    free(s->scratch);
    free(s->step_s);
    free(s->compute_s);
    free(s->judged);
    free(s->vals);
    memset(s, 0, sizeof(*s));
}

void agent_stragglers_start(struct agent *a, int i)
{
    struct agent_stragglers *s = &a->strag;
    if (s->win == NULL)
        return;
    /* A new process: its steps start again, and so does its measure (a
     * straggler named before the restart is no longer one, silently). */
    straggler_window_reset(&s->win[i]);
    memset(&s->m[i], 0, sizeof(s->m[i]));
    s->step_s[i] = s->compute_s[i] = -1;
    /* The last attempt's summary says nothing of this one: the heartbeats
     * carry none until the ranks are measured again. */
    if (a->rdzv && a->rdzv->ops->set_perf)
        a->rdzv->ops->set_perf(a->rdzv, NULL);
}

/* The node's summary for the rendezvous server's judgement of the nodes. */
static void tell_rendezvous(struct agent *a, size_t measured)
{
    struct agent_stragglers *s = &a->strag;
    if (a->rdzv == NULL || a->rdzv->ops->set_perf == NULL)
        return;
    if (measured == 0 || a->cfg->straggler_factor <= 1) {
        a->rdzv->ops->set_perf(a->rdzv, NULL);
        return;
    }
    size_t n = (size_t)a->nworkers;
    struct proto_perf p = {.factor = a->cfg->straggler_factor, .compute_s = -1};
    p.ranks = (int)measured;
    /* The medians of the ranks judged (an exited rank's last means stay on
     * the status page, not in the summary). */
    for (size_t i = 0; i < n; i++)
        s->vals[i] = s->judged[i] ? s->step_s[i] : 0;
    p.step_s = straggler_lower_median(s->vals, n, s->scratch);
    if (s->compute) {
        for (size_t i = 0; i < n; i++)
            s->vals[i] = s->judged[i] ? s->compute_s[i] : 0;
        p.compute_s = straggler_lower_median(s->vals, n, s->scratch);
    }
    double worst = -1;
    for (size_t i = 0; i < n; i++) {
        if (s->m[i].value > worst) {
            worst = s->m[i].value;
            p.max_rank = a->workers[i].info.rank;
        }
    }
    if (p.step_s <= 0 || (s->compute && p.compute_s <= 0)) {
        a->rdzv->ops->set_perf(a->rdzv, NULL);
        return;
    }
    a->rdzv->ops->set_perf(a->rdzv, &p);
}

static void log_change(struct agent *a, const struct straggler_change *c)
{
    struct agent_stragglers *s = &a->strag;
    int i = (int)c->index;
    const char *what = s->compute ? "compute" : "step time";
    if (c->slow)
        log_warn("A0910",
                 "[%s] local_rank %d (rank %d) is a straggler: %.3f s a step (%s, over its last "
                 "%d+ steps) against the node's median %.3f s (x%.2f; --straggler_factor %g)",
                 a->cfg->role, i, a->workers[i].info.rank, s->m[i].value, what, STRAGGLER_MIN_STEPS,
                 s->median_s, s->m[i].ratio, a->cfg->straggler_factor);
    else
        log_info("A0911",
                 "[%s] local_rank %d (rank %d) is no longer a straggler (x%.2f of the "
                 "node's median)",
                 a->cfg->role, i, a->workers[i].info.rank, s->m[i].ratio);
}

/* Judges the running ranks now: their means, the median, the changes. */
static void judge(struct agent *a, uint64_t now_ms)
{
    struct agent_stragglers *s = &a->strag;
    size_t n = (size_t)a->nworkers, measured = 0, with_compute = 0;
    s->judged_ms = now_ms;
    /* Every rank's means are shown (an exited one's last); only the
     * running ones are judged. */
    bool *judged = s->judged;
    for (size_t i = 0; i < n; i++) {
        bool running = a->pol.workers[i].state == WORKER_RUNNING;
        judged[i] = running && s->step_s[i] > 0;
        measured += judged[i];
        with_compute += judged[i] && s->compute_s[i] >= 0;
    }
    s->compute = measured > 0 && with_compute == measured;
    for (size_t i = 0; i < n; i++)
        s->m[i].value = !judged[i] ? 0 : s->compute ? s->compute_s[i] : s->step_s[i];
    if (a->cfg->straggler_factor > 1) {
        s->median_s = straggler_median(s->m, n, s->scratch);
        size_t nch = straggler_mark(s->m, n, s->median_s, a->cfg->straggler_factor, now_ms, s->ch);
        for (size_t k = 0; k < nch; k++)
            log_change(a, &s->ch[k]);
    }
    tell_rendezvous(a, measured);
}

void agent_stragglers_line(struct agent *a, int i, const struct progress_report *r, uint64_t now_ms)
{
    struct agent_stragglers *s = &a->strag;
    if (s->win == NULL)
        return;
    straggler_window_line(&s->win[i], now_ms, (r->fields & PROGRESS_STEP) != 0, r->step,
                          (r->fields & PROGRESS_STEP_TIME) ? r->step_time_s : -1,
                          (r->fields & PROGRESS_COMPUTE) ? r->compute_s : -1);
    /* The means are kept current (a few dozen additions), so every
     * snapshot shows a rank's latest, its last lines before it exits
     * included; the judgement waits its turn. */
    straggler_window_mean(&s->win[i], STRAGGLER_MIN_STEPS, &s->step_s[i], &s->compute_s[i]);
    if (now_ms - s->judged_ms < AGENT_STRAGGLER_JUDGE_MS)
        return;
    judge(a, now_ms);
    agent_show(a); /* the status page shows the new means */
}

void agent_stragglers_fill(const struct agent *a, int i, struct agent_worker_info *w,
                           uint64_t now_ms, double now_wall)
{
    const struct agent_stragglers *s = &a->strag;
    w->step_time_s = -1;
    w->compute_s = -1;
    w->straggler = false;
    if (s->win == NULL)
        return;
    w->step_time_s = s->step_s[i];
    w->compute_s = s->compute_s[i];
    w->straggler = s->m[i].slow;
    w->straggler_ratio = s->m[i].ratio;
    w->straggler_since = s->m[i].slow ? now_wall - (double)(now_ms - s->m[i].since_ms) / 1000.0 : 0;
}
