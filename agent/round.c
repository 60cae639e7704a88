/*
 * round.c: the agent's rendezvous glue (agent_int.h). It opens the backend
 * cfg names (agent/rdzv.h) with the workers' network interface chosen
 * towards its endpoint, turns the policy's join, failure report and exit
 * barrier into the backend's calls, and its answers (a round, a pushed
 * restart, closing, news for the status page) into policy events. The
 * agent's TCPStore (--agent_store) follows the rounds here: node 0 serves a
 * fresh one each round.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent_int.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/hostname.h"
#include "common/log.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "proto/msg.h"
#include "rendezvous/etcd.h"
#include "store/tcpstore.h"

/* ---- the agent store (--agent_store) ---- */

/* Closes the round's store, if any: its keys go with it, so the next round
 * (a restarted worker group) starts from an empty store, as torchrun 2.x. */
static void store_close(struct agent *a, const char *why)
{
    a->store_renew_port = 0; /* (a renewal under way opens nothing) */
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
    agent_show(a); /* the status page must not read the store any more */
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

static void on_store_renewed(void *arg)
{
    struct agent *a = arg;
    int port = a->store_renew_port;
    a->store_renew_port = 0;
    if (a->store != NULL || port <= 0)
        return;
    char why[256] = "";
    int rc = store_open(a, port, why, sizeof(why));
    if (rc)
        agent_failed(a, "A0803", "[%s] cannot serve the agent's TCPStore on port %d: %s",
                     a->cfg->role, port, why[0] ? why : cddp_strerror(rc));
    agent_show(a);
}

/* Worker scope: the store kept through a join with the workers running
 * holds the old group's keys (its generations among them); a round that
 * does not go on in place gets a fresh one, on the port it was told. */
static void store_renew(struct agent *a, int port)
{
    struct tcpstore_stats st;
    tcpstore_server_stats(a->store, &st);
    log_info("A0802", "[%s] closed the agent's TCPStore on port %d (%s; %zu keys, %llu queries)",
             a->cfg->role, a->store_port, "a new group: a fresh one on the same port", st.keys,
             (unsigned long long)st.queries);
    a->store_renew_port = port;
    tcpstore_server_close(a->store, on_store_renewed, a);
    a->store = NULL;
    a->store_port = port;
}

/* The round is known: node 0 serves the store at MASTER_PORT (the one it
 * bound before joining, or the given one), the other nodes drop theirs.
 * renew: a store kept through the join is replaced by a fresh one. */
static int store_for_round(struct agent *a, struct agent_round *r, bool renew)
{
    if (!a->cfg->agent_store)
        return 0;
    r->use_agent_store = 1;
    if (r->node_rank != 0) {
        store_close(a, "another node is node 0");
        return 0;
    }
    if (renew && a->store != NULL && a->store_port == r->master_port) {
        store_renew(a, r->master_port);
    } else if (a->store == NULL || a->store_port != r->master_port) {
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

/* ---- the backend's answers ---- */

/* How a node whose worker groups used up the restarts closes the
 * rendezvous (agent_round_farewell), and how the others recognise it: for
 * them the job failed (exit 1), the rendezvous did not (exit 5). */
#define JOB_FAILED_REASON "worker groups failed and no restarts are left"

/* Did the rendezvous end this node's run for a reason of the job's (its
 * restarts used up on another node; a join refused for its token or its
 * configuration) rather than the infrastructure's? The policy's
 * ROUND_FAILED and RDZV_CLOSED carry it as exitcode 1 (exit 1, not 5). */
static int job_fault(int status, const char *reason)
{
    if (status == CDDP_ETOKEN || status == CDDP_ECONFIG || status == CDDP_EMISMATCH)
        return 1;
    return (status == 0 || status == CDDP_ECLOSED) && reason && strstr(reason, JOB_FAILED_REASON);
}

/* Does the comma-separated list of ranks name one in [lo, hi)? */
static bool ranks_listed(const char *list, int lo, int hi)
{
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            return false;
        if (v >= lo && v < hi)
            return true;
        p = *end == ',' ? end + 1 : end;
    }
    return false;
}

/* Worker scope: a round that goes on with the last round's workers in
 * place (docs/multi-node.md, "Replacing a node in place"). This node
 * takes a lost one's place (its workers start in the round's generation),
 * or its running workers carry on when its assignment is the same as in
 * the last round (kept); anything else starts a new group. */
static void in_place(struct agent *a, const struct agent_round *prev, bool had,
                     const struct agent_round *r, struct policy_event *ev)
{
    if (a->pol.scope != RESTART_SCOPE_WORKER || r->generation <= 0)
        return;
    if (ranks_listed(r->replaced, r->rank_offset, r->rank_offset + a->nworkers)) {
        ev->generation = r->generation;
        log_warn("A0231",
                 "[%s] this node takes a lost node's place in round %llu: ranks %s, generation "
                 "%lld; its workers take the state from their peers",
                 a->cfg->role, (unsigned long long)r->round, r->replaced, (long long)r->generation);
        return;
    }
    ev->kept = had && a->pol.rejoining && prev->node_rank == r->node_rank &&
               prev->nnodes == r->nnodes && prev->world_size == r->world_size &&
               prev->rank_offset == r->rank_offset && prev->master_port == r->master_port &&
               strcmp(prev->master_addr, r->master_addr) == 0;
    if (ev->kept)
        ev->generation = r->generation;
}

static void on_round(struct agent_rdzv *r, int status, const struct agent_round *round,
                     const char *reason)
{
    struct agent *a = r->data;
    if (status != 0) {
        struct policy_event ev = {.type = POLICY_EV_ROUND_FAILED,
                                  .graceful = r->was_waiting,
                                  .exitcode = job_fault(status, reason)};
        if (r->was_waiting)
            log_warn("A0106",
                     "[%s] the job ended while this node waited for a place (%s); nothing ran "
                     "here",
                     a->cfg->role, reason ? reason : "closed");
        else
            agent_failed(a, "A0101", "rendezvous failed: %s",
                         reason ? reason : cddp_strerror(status));
        agent_post_event(a, &ev);
        return;
    }
    struct agent_round prev = a->round;
    bool had = a->have_round;
    a->round = *round;
    a->have_round = true;
    struct policy_event ev = {
        .type = POLICY_EV_ROUND, .restart_count = round->restart_count, .nnodes = round->nnodes};
    in_place(a, &prev, had, round, &ev);
    bool renew = a->store_kept && !ev.kept;
    a->store_kept = false;
    if (store_for_round(a, &a->round, renew) != 0) {
        agent_post(a, POLICY_EV_ROUND_FAILED, 0, 0, 0);
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
    if (a->pol.rejoining && !ev.kept) {
        a->membership_restarts++;
        log_warn("A0233",
                 "[%s] round %llu does not go on with this node's workers in place (%s); will "
                 "restart worker group",
                 a->cfg->role, (unsigned long long)round->round,
                 round->generation > 0 ? "this node's place changed"
                                       : "no node took the lost one's place in the same world");
    }
    agent_post_event(a, &ev);
}

static void on_rdzv_restart(struct agent_rdzv *r, const char *reason, bool counted)
{
    struct agent *a = r->data;
    log_warn("A0103", "[%s] %s; will restart worker group in a new round%s", a->cfg->role,
             reason ? reason : "membership changed",
             counted ? " (counts against --max_restarts)" : "");
    struct policy_event ev = {.type = POLICY_EV_RDZV_RESTART, .counted = counted};
    agent_post_event(a, &ev);
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
    agent_post(a, POLICY_EV_RDZV_CLOSED, 0, job_fault(status, reason), 0);
}

/* This node's goodput totals, sent with its heartbeats: the server sums
 * them job-wide (docs/status.md, "Job-wide goodput"). */
static bool on_rdzv_goodput(struct agent_rdzv *r, struct proto_goodput *out)
{
    struct agent *a = r->data;
    struct goodput_totals t;
    goodput_totals(&a->gp, cddp_mono_ms(), &t);
    _Static_assert(GOODPUT_PHASE_COUNT == PROTO_GOODPUT_PHASES, "goodput phases");
    for (int i = 0; i < GOODPUT_PHASE_COUNT; i++)
        out->s[i] = t.s[i];
    out->lost_steps = (int64_t)t.lost_steps;
    out->step = a->gp.any_step ? a->gp.high_step : -1;
    return true;
}

/* Worker scope, several nodes: the rendezvous answered this node's
 * replace or granted another node's (docs/multi-node.md, "A worker
 * restarted alone"). Node 0 hosts the agent store and announces a granted
 * generation there before the policy hears of it, so its own replacement
 * starts after the announcement. */
static void on_rdzv_generation(struct agent_rdzv *r, int64_t generation, const char *replaced,
                               const char *node_id, const char *refused, int64_t restart_count)
{
    struct agent *a = r->data;
    struct policy_event ev = {.type = POLICY_EV_GENERATION,
                              .local_rank = -1,
                              .generation = generation,
                              .restart_count = restart_count};
    if (generation <= 0) {
        log_warn("A0235",
                 "[%s] the rendezvous refused to restart the worker alone: %s; will restart "
                 "worker group",
                 a->cfg->role, refused ? refused : "no reason given");
        agent_post_event(a, &ev);
        return;
    }
    replaced = replaced ? replaced : "";
    char *end;
    long rank = strtol(replaced, &end, 10);
    if (end != replaced && (*end == '\0' || *end == ',') && rank >= a->round.rank_offset &&
        rank < a->round.rank_offset + a->nworkers)
        ev.local_rank = (int)(rank - a->round.rank_offset);
    if (ev.local_rank < 0)
        log_warn("A0236",
                 "[%s] round %llu goes on in place: generation %lld, rank%s %s restarted alone by "
                 "node %s; this node's workers re-form with %s",
                 a->cfg->role, (unsigned long long)a->round.round, (long long)generation,
                 strchr(replaced, ',') ? "s" : "", replaced, node_id ? node_id : "?",
                 strchr(replaced, ',') ? "them" : "it");
    if (a->round.node_rank == 0)
        agent_inplace_publish(a, generation, replaced);
    agent_post_event(a, &ev);
}

static void on_rdzv_blame(struct agent_rdzv *r, int rank, int64_t generation, const char *node_id)
{
    agent_progress_remote_blame(r->data, rank, generation, node_id);
}

/* The connection, the wait list or the hosted server changed: show it. */
static void on_rdzv_info(struct agent_rdzv *r)
{
    agent_show(r->data);
}

static void on_barrier(struct agent_rdzv *r, int status)
{
    struct agent *a = r->data;
    if (status != 0)
        log_error("A0105", "Error waiting on exit barrier: %s", cddp_strerror(status));
    agent_post(a, POLICY_EV_BARRIER_DONE, 0, status, 0);
}

/* ---- the policy's calls ---- */

void agent_round_join(struct agent *a, const struct policy_action *act)
{
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
    else if (act->reason == STOP_MEMBERSHIP && act->keep)
        log_warn("A0232",
                 "[%s] membership changed; joining the next round with the workers running "
                 "(--restart_scope=worker): they carry on if a node takes the lost one's place",
                 a->cfg->role);
    else if (act->reason == STOP_MEMBERSHIP) {
        log_warn("A0402", "[%s] membership changed; will restart worker group", a->cfg->role);
        a->membership_restarts++;
    }
    struct agent_join req = {
        .local_world_size = a->nworkers,
        .role = a->cfg->role,
        .restart_count = policy_restart_count(&a->pol),
    };
    /* The workers run on (worker scope): their store stays, at the port
     * it has, for a round that goes on in place. */
    if (act->keep && a->store != NULL && a->rdzv->picks_master_port)
        req.master_port = a->store_port;
    /* A new round gets a fresh store; where our port is published at
     * join, the store listens on it before anyone can hear of it. */
    a->store_kept = act->keep && a->store != NULL;
    if (!act->keep)
        store_close(a, "a new round");
    if (!act->keep && a->cfg->agent_store && a->rdzv->picks_master_port) {
        char why[256] = "";
        int src = store_open(a, 0, why, sizeof(why));
        if (src) {
            agent_failed(a, "A0803", "[%s] cannot serve the agent's TCPStore: %s", a->cfg->role,
                         why[0] ? why : cddp_strerror(src));
            agent_post(a, POLICY_EV_ROUND_FAILED, 0, 0, 0);
            return;
        }
        req.master_port = a->store_port;
    }
    int rc = a->rdzv->ops->join(a->rdzv, &req, on_round);
    if (rc) {
        agent_failed(a, "A0403", "joining the rendezvous: %s", cddp_strerror(rc));
        agent_post(a, POLICY_EV_ROUND_FAILED, 0, 0, 0);
    }
}

/* POLICY_ACT_NEW_GENERATION: the round took a node in a lost one's place
 * and this node's workers carry on; the store's host (node 0) announces
 * the generation, naming the replaced ranks, which the workers of every
 * node wait for (docs/multi-node.md, "Replacing a node in place"). */
void agent_round_new_generation(struct agent *a, const struct policy_action *act)
{
    log_warn("A0230",
             "[%s] round %llu goes on in place: generation %lld, ranks %s taken by a node that "
             "replaces a lost one; this node's workers carry on",
             a->cfg->role, (unsigned long long)a->round.round, (long long)act->generation,
             a->round.replaced);
    if (a->round.node_rank == 0)
        agent_inplace_publish(a, act->generation, a->round.replaced);
    agent_show(a);
}

/* POLICY_ACT_REQUEST_GENERATION: ask the rendezvous to let this node
 * restart local_rank alone; on_rdzv_generation answers. */
void agent_round_request_generation(struct agent *a, const struct policy_action *act)
{
    int rank = a->round.rank_offset + act->local_rank;
    /* the ranks asked for together (a node's hung ranks), when several */
    char ranks[PROTO_MAX_REPLACED + 1];
    int n = agent_inplace_ranks(a, 0, ranks, sizeof(ranks));
    bool several = n > 1;
    int rc = !a->rdzv->ops->replace ? CDDP_EPROTO_TYPE
             : n < 0
                 ? CDDP_ERANGE_ARG
                 : a->rdzv->ops->replace(a->rdzv, rank, several ? ranks : NULL, "worker_failure");
    if (rc == 0 && several) {
        log_info("A0234",
                 "[%s] ranks %s failed together (hung); asking the rendezvous to restart them "
                 "together in one generation (--restart_scope=worker)",
                 a->cfg->role, ranks);
        return;
    }
    if (rc == 0) {
        log_info("A0234",
                 "[%s] local_rank %d (rank %d) failed; asking the rendezvous to restart it alone "
                 "(--restart_scope=worker)",
                 a->cfg->role, act->local_rank, rank);
        return;
    }
    char why[200];
    snprintf(why, sizeof(why), "%s",
             rc == CDDP_EPROTO_TYPE && several
                 ? "the rendezvous server is older and cannot restart several ranks together "
                   "in one generation"
             : rc == CDDP_EPROTO_TYPE ? "the rendezvous server is older and cannot number "
                                        "generations"
                                      : cddp_strerror(rc));
    on_rdzv_generation(a->rdzv, 0, NULL, NULL, why, 0);
}

void agent_round_report_failure(struct agent *a)
{
    int rc = a->rdzv->ops->report_failure(a->rdzv, policy_restart_count(&a->pol));
    if (rc)
        log_warn("A0404", "telling the rendezvous about the failure: %s", cddp_strerror(rc));
}

void agent_round_exit_barrier(struct agent *a)
{
    int rc = a->rdzv->ops->exit_barrier(a->rdzv, a->cfg->exit_barrier_timeout_ms, on_barrier);
    if (rc) {
        log_error("A0105", "Error waiting on exit barrier: %s", cddp_strerror(rc));
        agent_post(a, POLICY_EV_BARRIER_DONE, 0, rc, 0);
    }
}

/* How this node leaves the rendezvous, and what the others are told. */
void agent_round_farewell(struct agent *a, const struct policy_action *act)
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
                 "%s: " JOB_FAILED_REASON " (max_restarts=%d)", a->this_node, a->cfg->max_restarts);
    else if (a->pol.state == AGENT_TERMINATED)
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason), "%s received %s", a->this_node,
                 cddp_signal_name(a->pol.term_signal));
    else
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason), "%s failed: %s", a->this_node,
                 a->fail_reason[0] ? a->fail_reason : "the agent failed");
}

static void on_rdzv_closed_done(struct agent_rdzv *r)
{
    struct agent *a = r->data;
    a->rdzv = NULL; /* freed after this (c10d); snapshots no longer read it */
    /* The other nodes' workers may use the store until the rendezvous is
     * done with them (a hosting agent serves as long as they run). */
    store_close(a, "the agent exits");
}

void agent_round_close(struct agent *a)
{
    if (a->rdzv == NULL) {
        store_close(a, "the agent exits");
        return;
    }
    if (a->rdzv_reason[0] == '\0')
        snprintf(a->rdzv_reason, sizeof(a->rdzv_reason), "%s failed: %s", a->this_node,
                 a->fail_reason[0] ? a->fail_reason : "the agent failed");
    a->rdzv->ops->close(a->rdzv, a->rdzv_how, a->rdzv_reason, on_rdzv_closed_done);
}

/* ---- opening ---- */

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
int agent_round_open(struct agent *a, char *why, size_t whylen)
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
            .host_jobs = a->hooks ? a->hooks->host_jobs : NULL,
            .host_jobs_arg = a->hooks ? a->hooks->arg : NULL,
        };
        if ((rc = agent_rdzv_c10d_new(&a->loop, &o, &a->rdzv, why, whylen)) != 0)
            return rc;
    }
opened:
    a->rdzv->data = a;
    a->rdzv->on_restart = on_rdzv_restart;
    a->rdzv->on_closed = on_rdzv_closed;
    a->rdzv->on_info = on_rdzv_info;
    a->rdzv->on_generation = on_rdzv_generation;
    a->rdzv->on_blame = on_rdzv_blame;
    a->rdzv->goodput = on_rdzv_goodput;
    a->pol.coordinated = a->rdzv->coordinated;
    a->pol.rdzv_generations = a->rdzv->ops->replace != NULL;
    return 0;
}
