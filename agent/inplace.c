/*
 * inplace.c: the agent's side of --restart_scope=worker (docs/distributed.md,
 * "Recovering in place"). The policy decides (policy.c: a failed worker
 * restarted alone, a new generation, the fall back to a group restart);
 * here its POLICY_ACT_RESTART_WORKER is carried out, the generation is
 * announced on the agent store, the workers are told the scope and their
 * generation, and the status snapshot shows it all. progress.c measures
 * the recovery (a replacement's first step).
 */
#include "agent/agent_int.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "store/tcpstore.h"

void agent_inplace_init(struct agent *a)
{
    a->last_recovery_s = -1;
    if (a->cfg->restart_scope && strcmp(a->cfg->restart_scope, "worker") == 0)
        a->pol.scope = RESTART_SCOPE_WORKER;
}

int agent_inplace_env(const struct agent *a, struct launch_kv *env, int n, char *generation,
                      size_t len)
{
    if (a->pol.scope != RESTART_SCOPE_WORKER)
        return n;
    /* docs/distributed.md, "Recovering in place" */
    snprintf(generation, len, "%lld", (long long)a->pol.generation);
    env[n++] = (struct launch_kv){"CDDP_RESTART_SCOPE", "worker"};
    env[n++] = (struct launch_kv){"CDDP_GENERATION", generation};
    return n;
}

void agent_inplace_snapshot(const struct agent *a, struct agent_snapshot *s)
{
    s->restart_scope = restart_scope_name(a->pol.scope);
    s->generation = a->pol.generation;
    s->worker_restarts = a->pol.worker_restarts;
    s->group_restarts = a->pol.group_restarts;
    s->scope_fallbacks = a->pol.scope_fallbacks;
    s->node_replacements = a->pol.node_replacements;
    s->recovery_started = a->recovery_started;
    s->last_recovery_s = a->last_recovery_s;
    s->spares = agent_spares_ready(a);
}

/* The new membership generation on the store the workers use: first the
 * ranks it replaces, then the generation itself (docs/distributed.md,
 * "Recovering in place"). The survivors wait for the first key. The keys
 * are as torch's TCPStore client names them (it puts "/" before every
 * key): a script reads them with store.get("cddp/gen"). */
void agent_inplace_publish(struct agent *a, int64_t gen, const char *ranks)
{
    if (a->store == NULL) {
        log_warn("A0221",
                 "[%s] no agent store to announce generation %lld on: the survivors "
                 "cannot re-form and the group will restart",
                 a->cfg->role, (long long)gen);
        return;
    }
    char key[64], val[32];
    snprintf(key, sizeof(key), "/cddp/gen/%lld/replaced", (long long)gen);
    int rc = tcpstore_server_set(a->store, key, ranks, strlen(ranks));
    if (rc == 0) {
        int n = snprintf(val, sizeof(val), "%lld", (long long)gen);
        rc = tcpstore_server_set(a->store, "/cddp/gen", val, (size_t)n);
    }
    if (rc)
        log_warn("A0222", "[%s] announcing generation %lld on the agent store: %s", a->cfg->role,
                 (long long)gen, cddp_strerror(rc));
}

/* This node's workers that generation gen replaces (the policy marked
 * them: replaced_gen), or, gen 0, those whose replace is asked of the
 * rendezvous together (asked): their global ranks, "2,3", into buf; how
 * many, or -1 when the list does not fit in len. */
int agent_inplace_ranks(const struct agent *a, int64_t gen, char *buf, size_t len)
{
    size_t at = 0;
    int n = 0;
    buf[0] = '\0';
    for (int i = 0; i < a->nworkers; i++) {
        const struct policy_worker *pw = &a->pol.workers[i];
        if (gen > 0 ? pw->replaced_gen != gen : !pw->asked)
            continue;
        int w = snprintf(buf + at, len - at, "%s%d", at ? "," : "", a->workers[i].info.rank);
        if (w < 0 || (size_t)w >= len - at) {
            buf[at] = '\0';
            return -1;
        }
        at += (size_t)w;
        n++;
    }
    return n;
}

/* POLICY_ACT_RESTART_WORKER: every worker the generation replaces (the
 * policy marked them: one, or a node's hung ranks together) has what is
 * left of its process group killed; the generation is announced once,
 * naming them all; and each local rank starts again alone (same RANK and
 * LOCAL_RANK), its logs under the new restart count's attempt_N/. */
void agent_inplace_restart_worker(struct agent *a, const struct policy_action *act)
{
    char ranks[PROTO_MAX_REPLACED + 1];
    agent_inplace_ranks(a, act->generation, ranks, sizeof(ranks));
    for (int i = 0; i < a->nworkers; i++) {
        if (a->pol.workers[i].replaced_gen != act->generation)
            continue;
        struct agent_worker *w = &a->workers[i];
        if (w->pgid > 0) {
            agent_signal_group(w->pgid, SIGKILL);
            agent_guardian_remove(&a->guardian, w->pgid);
        }
        w->group_alive = false;
        agent_note_replaced(a, i, act->generation); /* (the failure table's) */
    }
    a->recovery_started = cddp_wall_time();
    if (a->pol.one_node) /* (several nodes: node 0 announced it, round.c) */
        agent_inplace_publish(a, act->generation, ranks);
    a->attempt = policy_restart_count(&a->pol);
    int rc = agent_attempt_logs(a);
    for (int i = 0; i < a->nworkers; i++) {
        if (a->pol.workers[i].replaced_gen != act->generation)
            continue;
        struct agent_worker *w = &a->workers[i];
        log_warn("A0220",
                 "[%s] restarting local_rank %d (rank %d) alone (--restart_scope=worker): "
                 "generation %lld (replaces rank%s %s), restart count %d/%d; the other workers "
                 "re-form with it",
                 a->cfg->role, i, w->info.rank, (long long)act->generation,
                 strchr(ranks, ',') ? "s" : "", ranks, a->attempt, a->cfg->max_restarts);
        w->start_error[0] = '\0';
        w->not_started = false;
        /* (--spare_workers: a started spare takes its place when there is one) */
        int started = rc;
        if (started == 0 && agent_spares_take(a, i) != 0)
            started = agent_start_worker(a, i);
        if (started == 0)
            continue;
        agent_log_start_error(a, i);
        /* Could not start: a failed replacement (the policy restarts the group). */
        agent_worker_not_started(a, i);
    }
}
