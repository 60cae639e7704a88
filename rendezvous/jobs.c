/* jobs.c: see jobs.h. The loop writes under the lock; the status port's
 * thread copies under it and renders outside. */
#include "rendezvous/jobs.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "rendezvous/view.h"

struct rdzv_jobs {
    pthread_mutex_t mu;
    struct jobstats js;
    bool nomem_said;
};

struct rdzv_jobs *rdzv_jobs_new(void)
{
    struct rdzv_jobs *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    pthread_mutex_init(&j->mu, NULL);
    jobstats_init(&j->js);
    return j;
}

void rdzv_jobs_free(struct rdzv_jobs *j)
{
    if (j == NULL)
        return;
    jobstats_free(&j->js);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

const struct jobstats *rdzv_jobs_stats(const struct rdzv_jobs *j)
{
    return &j->js;
}

static void check(struct rdzv_jobs *j, int rc)
{
    if (rc && !j->nomem_said) {
        j->nomem_said = true;
        log_error("R0027", "job-wide statistics: %s; a heartbeat or event is not counted",
                  cddp_strerror(rc));
    }
}

void rdzv_jobs_on_heartbeat(void *arg, const char *run_id, const char *node_id,
                            const struct proto_msg *m)
{
    struct rdzv_jobs *j = arg;
    if (run_id == NULL || node_id == NULL || run_id[0] == '\0')
        return;
    pthread_mutex_lock(&j->mu);
    int rc = jobstats_heartbeat(
        &j->js, run_id, node_id, m->heartbeat.has_goodput ? &m->heartbeat.goodput : NULL,
        m->heartbeat.has_perf ? &m->heartbeat.perf : NULL, cddp_wall_time());
    pthread_mutex_unlock(&j->mu);
    check(j, rc);
}

void rdzv_jobs_on_action(void *arg, const char *run_id, const struct rdzv_action *a)
{
    struct rdzv_jobs *j = arg;
    double now = cddp_wall_time();
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    switch (a->kind) {
    case RDZV_ACT_ROUND:
        rc = jobstats_round(&j->js, a->round.run_id, a->round.round, a->round.nnodes,
                            a->round.world_size, now);
        break;
    case RDZV_ACT_RESTART:
        if (run_id && run_id[0])
            rc = jobstats_restart(&j->js, run_id, a->restart.round, a->restart.reason,
                                  a->restart.node_id, a->restart.counted, now);
        break;
    case RDZV_ACT_STRAGGLER:
        rc = jobstats_straggler(&j->js, a->straggler.run_id, a->straggler.node_id,
                                a->straggler.slow, a->straggler.ratio, now);
        break;
    case RDZV_ACT_CLOSED:
        if (run_id && run_id[0] && jobstats_find(&j->js, run_id))
            rc = jobstats_end(&j->js, run_id, a->closed.reason, now);
        break;
    default:
        break;
    }
    pthread_mutex_unlock(&j->mu);
    check(j, rc);
}

int rdzv_jobs_history(void *arg, const char *run, uint64_t since, struct cddp_buf *out)
{
    struct rdzv_jobs *j = arg;
    if (run == NULL || run[0] == '\0')
        return CDDP_EPARSE;
    struct status_history copy;
    double started = 0;
    int rc;
    pthread_mutex_lock(&j->mu);
    const struct jobstats_run *r = jobstats_find(&j->js, run);
    if (r == NULL) {
        rc = CDDP_ENOTFOUND;
    } else {
        started = r->first_seen;
        rc = status_history_clone(&copy, &r->hist, since);
    }
    pthread_mutex_unlock(&j->mu);
    if (rc)
        return rc;
    rc = status_history_render(&copy, since, cddp_wall_time(), started, out);
    status_history_free(&copy);
    return rc;
}

void rdzv_jobs_add_goodput(const struct rdzv_jobs *j, struct rdzv_view_builder *b, double now)
{
    const struct jobstats *js = &j->js;
    for (size_t i = 0; i < b->runs.len; i++) {
        struct status_rdzv_run_view *r = &b->runs.items[i];
        const struct jobstats_run *jr = jobstats_find(js, r->run_id);
        struct jobstats_sum sum;
        if (jr == NULL)
            continue;
        jobstats_sum(jr, now, &sum);
        if (sum.nodes == 0)
            continue;
        r->has_goodput = true;
        r->goodput_nodes = sum.nodes;
        _Static_assert(STATUS_GOODPUT_PHASE_COUNT == PROTO_GOODPUT_PHASES, "goodput phases");
        for (int p = 0; p < PROTO_GOODPUT_PHASES; p++)
            r->goodput_s[p] = sum.s[p];
        r->goodput_total_s = sum.total_s;
        r->goodput_ratio = sum.ratio;
        r->goodput_lost_steps = sum.lost_steps;
        r->max_step = sum.max_step;
        r->min_step = sum.min_step;
    }
}
