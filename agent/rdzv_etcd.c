/*
 * rdzv_etcd.c: the etcd-v3 rendezvous behind agent/rdzv.h (docs/etcd.md).
 *
 * There is no server: the run's round is one etcd key (<prefix>/<run>/state,
 * rendezvous/etcd_round.h), changed by applying events to the value as it
 * is and writing it back with a transaction compared on the key's
 * mod_revision; a conflict returns the value as it is now, and the events
 * are applied again. One mutation is in flight per agent at a time (a
 * small queue of ops), so the order of this agent's own events holds.
 *
 * Keys under <key_prefix>/<run_id>/ (docs/etcd.md "How it works"):
 *   state                  the round (JSON); once closed, written with a
 *                          lease of close_timeout, so the run id can be
 *                          used again
 *   nodes/<node_id>        this node is alive: on its lease, whose TTL is
 *                          the keep-alive window, renewed every interval
 *   joins/<node_id>        this node's join request (on its lease)
 *   news/round             state again, whenever its round, phase or (while
 *                          running) wait list changes: all others watch
 *   news/leader            the leader (on its lease): created by the first
 *                          agent whose txn on mod_revision 0 went through
 *   news/barrier/<round>/<id>  the exit barrier (with the node's lease)
 *
 * The leader watches the whole run and folds the pending join requests
 * into the state in batches (one txn per batch, deleting them), applies
 * lost nodes (node key deleted) and the last call. The other agents watch
 * news/ only: a new round (the join's callback; a later round ->
 * on_restart; closed -> on_closed), the barrier's keys, and the leader
 * key's deletion (take over). Their own leave, failure and close they
 * write to the state themselves. No polling: the only timers are the
 * keep-alive, the last call deadline stored in the state, join_timeout,
 * the barrier's timeout, the fold's debounce and retry backoff.
 *
 * etcd unreachable or without quorum: requests fail over across the
 * members (rendezvous/etcd.c) and are retried with backoff; a running
 * round's workers keep running meanwhile (etcd keeps leases while it has no
 * leader and renews them all on election). Past join_timeout without one
 * successful keep-alive (or, before the first round, without the join
 * going through), the rendezvous is lost with one line saying why.
 *
 * The writes (the op queue and the leader's fold) are rdzv_etcd_write.c's;
 * rdzv_etcd_int.h has the state both files share.
 */
#include "agent/rdzv_etcd_int.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/hostname.h"
#include "common/log.h"
#include "common/strutil.h"
#include "rendezvous/etcd.h"
#include "rendezvous/etcd_round.h"
#include "rendezvous/etcd_wire.h"

static void start_setup(struct ed *e);

uint64_t ed_wall_ms(void)
{
    return (uint64_t)(cddp_wall_time() * 1000.0);
}

static void ed_info_changed(struct ed *e)
{
    e->base.info.etcd_member = e->cl ? etcd_client_member(e->cl) : NULL;
    e->base.info.etcd_failovers = e->cl ? etcd_client_failovers(e->cl) : 0;
    e->base.info.etcd_watch_ok = e->watch != NULL;
    e->base.info.connected = e->watch != NULL && e->base.info.etcd_lease_ok;
    if (e->base.on_info)
        e->base.on_info(&e->base);
}

const char *ed_last_error(struct ed *e)
{
    if (e->bad[0])
        return e->bad;
    const char *s = e->cl ? etcd_client_last_error(e->cl) : "";
    return s[0] ? s : "no answer";
}

/* ---- closing ---- */

static void timer_closed(uv_handle_t *h)
{
    struct ed *e = h->data;
    if (--e->timers_open > 0)
        return;
    etcd_round_free(&e->st);
    etcd_round_free(&e->pending); /* a write cut short by the close */
    free(e->reqs);
    rdzv_calls_closed(&e->calls);
    free(e);
}

static void client_closed(void *arg)
{
    struct ed *e = arg;
    uv_timer_t *timers[] = {&e->ka_timer, &e->retry_timer,   &e->op_timer,    &e->join_timer,
                            &e->lc_timer, &e->barrier_timer, &e->close_timer, &e->fold_timer};
    e->timers_open = (int)(sizeof(timers) / sizeof(timers[0]));
    for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++)
        uv_close((uv_handle_t *)timers[i], timer_closed);
}

static void finish_close(struct ed *e)
{
    uv_timer_stop(&e->close_timer);
    e->watch = NULL; /* closed with the client */
    struct etcd_client *cl = e->cl;
    e->cl = NULL;
    if (cl)
        etcd_client_close(cl, client_closed, e);
    else
        client_closed(e);
}

static void on_revoked(struct etcd_client *cl, int status, long http, const char *body, size_t len,
                       void *arg)
{
    (void)cl, (void)status, (void)http, (void)body, (void)len;
    finish_close(arg);
}

/* The farewell op is written (or given up): revoke the lease, which
 * deletes this node's keys at once instead of after the TTL. */
void ed_farewell_done(struct ed *e)
{
    if (e->lease && e->cl &&
        etcd_call(e->cl, "lease/revoke", etcd_req_lease_id(e->lease), on_revoked, e) == 0)
        return;
    finish_close(e);
}

static void on_close_timeout(uv_timer_t *t)
{
    struct ed *e = t->data;
    log_warn("A2001", "etcd: closing this node's part of run '%s' took over %.1f s (%s); going",
             e->run_id, CLOSE_TIMEOUT_MS / 1000.0, ed_last_error(e));
    finish_close(e);
}

/* ---- the state, as it changes ---- */

static void describe(const struct etcd_round *st, char *out, size_t len)
{
    const char *n = st->node[0] ? st->node : "?";
    const char *r = st->reason;
    if (strcmp(r, "node_lost") == 0)
        snprintf(out, len, "node '%s' was lost (its etcd lease expired)", n);
    else if (strcmp(r, "node_left") == 0)
        snprintf(out, len, "node '%s' left", n);
    else if (strcmp(r, "node_joined") == 0)
        snprintf(out, len, "node '%s' joined (scale-up)", n);
    else if (strcmp(r, "node_rejoined") == 0)
        snprintf(out, len, "node '%s' asked for a new round", n);
    else if (strcmp(r, "worker_failure") == 0)
        snprintf(out, len, "the worker group of node '%s' failed (restart %" PRId64 " of the job)",
                 n, st->restart_count);
    else
        snprintf(out, len, "%s (node '%s')", r[0] ? r : "new round", n);
}

static void fail_join(struct ed *e, int status, const char *reason)
{
    uv_timer_stop(&e->join_timer);
    rdzv_calls_round(&e->calls, status, NULL, reason);
}

static void on_last_call(uv_timer_t *t)
{
    struct ed *e = t->data;
    struct op o = {.kind = OP_TICK};
    ed_push_op(e, &o);
}

static void check_barrier(struct ed *e);

void ed_state_changed(struct ed *e)
{
    if (e->calls.closing)
        return;
    uv_timer_stop(&e->lc_timer);
    if (!e->st_valid) {
        if (e->calls.join_cb && e->join_applied) {
            /* The run's state went (closed and expired, or deleted): join anew. */
            e->join_applied = false;
            e->join_put = false;
            struct op o = {.kind = OP_JOIN};
            ed_push_op(e, &o);
        }
        return;
    }
    const struct etcd_round *st = &e->st;
    int64_t waiting = 0;
    for (size_t i = 0; i < st->nmembers; i++)
        waiting += st->members[i].state == ETCD_M_WAITING;
    if (waiting != e->base.info.waiting_nodes) {
        e->base.info.waiting_nodes = waiting;
        ed_info_changed(e);
    }
    if (st->phase == ETCD_CLOSED) {
        if (e->calls.join_cb) {
            const struct etcd_member *m = etcd_round_find(st, e->node_id);
            e->base.was_waiting = m && m->state == ETCD_M_WAITING;
            char why[600];
            snprintf(why, sizeof(why), "the rendezvous of run '%s' is closed (%s)", e->run_id,
                     st->closed_reason);
            fail_join(e, CDDP_ECLOSED, why);
        } else if (!e->closed_told && e->round) {
            e->closed_told = true;
            if (e->base.on_closed)
                e->base.on_closed(&e->base, 0, st->closed_reason);
        }
        return;
    }
    if (st->phase == ETCD_FORMING && st->last_call_at && e->leader) {
        uint64_t now = ed_wall_ms();
        uint64_t in = st->last_call_at > now ? st->last_call_at - now : 0;
        uv_timer_start(&e->lc_timer, on_last_call, in + 10, 0);
    }
    if (e->calls.join_cb && e->join_put) {
        const struct etcd_member *m = etcd_round_find(st, e->node_id);
        if (m == NULL) {
            if (!e->join_applied)
                return; /* not folded yet */
            /* Dropped (taken for lost): join again. */
            e->join_applied = false;
            e->join_put = false;
            struct op o = {.kind = OP_JOIN};
            ed_push_op(e, &o);
            return;
        }
        if (m->state == ETCD_M_EXPECTED && st->phase == ETCD_FORMING && st->round > e->round + 1 &&
            st->round > e->rejoined_for) {
            /* EXPECTED: a member of the last round, round - 1, that is not
             * back yet. We were never told of that round (e->round is older),
             * so our request went into it and it ran and restarted before
             * this agent saw it running (the put's answer came after the
             * watch's news, or one watch message carried both states). Our
             * request is spent: join again, once for this round. */
            log_info("A2016",
                     "etcd: run '%s' restarted (round %" PRIu64 ") before this node saw the round "
                     "it was placed in; joining again",
                     e->run_id, st->round);
            e->rejoined_for = st->round;
            e->join_applied = false;
            e->join_put = false;
            struct op o = {.kind = OP_JOIN};
            ed_push_op(e, &o);
            return;
        }
        if (m->state == ETCD_M_JOINED || m->state == ETCD_M_WAITING ||
            (m->state == ETCD_M_ACTIVE && st->round > e->round))
            e->join_applied = true; /* the state has this node now */
        if (m->state == ETCD_M_WAITING && !e->warned_waiting) {
            e->warned_waiting = true;
            log_warn("A2007",
                     "run '%s' runs at its maximum number of nodes: this node waits for a place "
                     "(round %" PRIu64 ")",
                     e->run_id, st->round);
        }
        struct proto_round pr;
        if (st->round > e->round && etcd_round_place(st, e->run_id, e->node_id, &pr) == 0) {
            struct agent_round r;
            rdzv_round_from_proto(&r, &pr);
            e->round = r.round;
            e->round_nnodes = r.nnodes;
            e->rank_offset = r.rank_offset;
            e->restart_told = r.round;
            e->gen_seen = st->generation;
            uv_timer_stop(&e->join_timer);
            rdzv_calls_round(&e->calls, 0, &r, NULL);
        }
        return;
    }
    if (e->calls.join_cb == NULL && e->round && st->round > e->round &&
        e->restart_told < st->round) {
        e->restart_told = st->round;
        char why[512];
        describe(st, why, sizeof(why));
        if (e->base.on_restart)
            e->base.on_restart(&e->base, why, st->counted);
        return;
    }
    if (e->calls.join_cb == NULL && e->round && st->round == e->round &&
        st->phase == ETCD_RUNNING && st->generation != e->gen_seen) {
        /* A replace granted, this node's or another's: the round goes on
         * in place (docs/multi-node.md, "A worker restarted alone"). Any
         * change is news: an older agent that rewrote the state has set it
         * back to 0 (docs/etcd.md), and the next grant is 1 again. */
        e->gen_seen = st->generation;
        if (st->generation > 0) {
            char replaced[PROTO_MAX_REPLACED + 1];
            if (st->gen_ranks[0])
                cddp_strlcpy(replaced, st->gen_ranks, sizeof(replaced));
            else
                snprintf(replaced, sizeof(replaced), "%d", st->gen_rank);
            if (e->base.on_generation)
                e->base.on_generation(&e->base, st->generation, replaced, st->gen_node, NULL,
                                      st->restart_count);
            if (e->calls.closing || e->st.round != e->round)
                return; /* (the agent moved on meanwhile) */
        }
    }
    if (e->calls.barrier_cb)
        check_barrier(e);
}

/* ---- the watch ---- */

static bool has_prefix(const char *key, const char *prefix, const char **rest)
{
    size_t n = strlen(prefix);
    if (strncmp(key, prefix, n) != 0)
        return false;
    *rest = key + n;
    return true;
}

static void watch_retry(uv_timer_t *t)
{
    ed_open_watch(t->data);
}

static void on_watch_end(struct etcd_watch *w, int status, const char *why, void *arg)
{
    (void)w, (void)status;
    struct ed *e = arg;
    e->watch = NULL;
    if (e->calls.closing)
        return;
    log_warn("A2008", "etcd: the watch on run '%s' ended (%s); reopening on %s", e->run_id, why,
             etcd_client_member(e->cl));
    ed_info_changed(e);
    uv_timer_start(&e->retry_timer, watch_retry, RETRY_MS, 0);
}

/* A round is handed to the agent, no join is outstanding, and the backend
 * is not closing: what replace and blame, sent or received, are about. */
static bool in_round(const struct ed *e)
{
    return !e->calls.closing && e->round != 0 && e->calls.join_cb == NULL;
}

/* news/blame/<round>/<rank> = "<generation> <node>" (ed_blame): another
 * node's ranks name one of this node's as never reaching a collective.
 * Whatever does not parse, or is not about this node's round and ranks,
 * is ignored. */
static void took_blame(struct ed *e, const char *rest, const unsigned char *val, size_t vlen)
{
    char buf[PROTO_MAX_ID + 32], *end;
    if (!isdigit((unsigned char)rest[0]) || vlen == 0 || vlen >= sizeof(buf))
        return;
    unsigned long long round = strtoull(rest, &end, 10);
    if (*end != '/' || !isdigit((unsigned char)end[1]))
        return;
    const char *rs = end + 1;
    long rank = strtol(rs, &end, 10);
    if (*end != '\0' || rank > INT32_MAX)
        return;
    memcpy(buf, val, vlen);
    buf[vlen] = '\0';
    if (!isdigit((unsigned char)buf[0]))
        return;
    long long gen = strtoll(buf, &end, 10);
    if (*end != ' ' || end[1] == '\0')
        return;
    const char *node = end + 1;
    for (const char *c = node; *c; c++) {
        if ((unsigned char)*c < 0x21 || *c == 0x7f)
            return;
    }
    if (!in_round(e) || round != e->round || strcmp(node, e->node_id) == 0 ||
        rank < e->rank_offset || rank >= e->rank_offset + e->nproc)
        return;
    if (e->base.on_blame)
        e->base.on_blame(&e->base, (int)rank, gen, node);
}

static void on_watch_msg(struct etcd_watch *w, const char *msg, size_t len, void *arg)
{
    (void)w;
    struct ed *e = arg;
    struct etcd_watch_msg m;
    char why[256];
    if (etcd_parse_watch(msg, len, &m, why, sizeof(why)) != 0) {
        log_warn("A2009", "etcd: a bad watch message (%s); reopening the watch", why);
        etcd_watch_cancel(e->watch);
        e->watch = NULL;
        ed_info_changed(e);
        uv_timer_start(&e->retry_timer, watch_retry, RETRY_MS, 0);
        return;
    }
    if (m.created && !e->base.info.etcd_watch_ok)
        ed_info_changed(e);
    if (m.canceled || m.compact_revision > 0) {
        /* Compacted past where we were: read the state again, watch from now. */
        log_warn("A2010", "etcd: the watch on run '%s' was cancelled (%s); reopening", e->run_id,
                 m.cancel_reason[0] ? m.cancel_reason : "compacted");
        etcd_watch_msg_free(&m);
        etcd_watch_cancel(e->watch);
        e->watch = NULL;
        e->watch_rev = 0;
        e->ready = false;
        start_setup(e);
        return;
    }
    bool state = false, barrier = false;
    /* Only the last value of the state in a message matters (a loaded
     * etcd sends many at once, and each costs a decode of every member). */
    size_t last_state = m.nevents;
    const char *sk = e->leader ? e->state_key : e->round_key;
    for (size_t i = 0; i < m.nevents; i++) {
        if (strcmp(m.events[i].kv.key, sk) == 0)
            last_state = i;
    }
    if (last_state < m.nevents) {
        const struct etcd_event *ev = &m.events[last_state];
        ed_take_state(e, ev->type == ETCD_PUT ? &ev->kv : NULL, ev->kv.mod_rev);
        state = true;
    }
    for (size_t i = 0; i < m.nevents && !e->calls.closing; i++) {
        const struct etcd_event *ev = &m.events[i];
        const char *rest;
        if (ev->kv.mod_rev > e->watch_rev)
            e->watch_rev = ev->kv.mod_rev;
        if (strcmp(ev->kv.key, e->state_key) == 0 || strcmp(ev->kv.key, e->round_key) == 0) {
            continue;
        } else if (strcmp(ev->kv.key, e->writer_key) == 0) {
            if (ev->type == ETCD_DELETE) {
                /* The leader went (left, or its lease expired): take over. */
                if (e->leader)
                    ed_step_down(e);
                e->writer_seen = false;
                ed_elect(e);
            }
        } else if (has_prefix(ev->kv.key, e->joins_key, &rest)) {
            if (!e->leader)
                continue;
            if (ev->type == ETCD_PUT)
                ed_req_put(e, rest, ev->kv.mod_rev, ev->kv.value, ev->kv.vlen);
            else
                ed_req_drop(e, rest, ev->kv.mod_rev);
        } else if (has_prefix(ev->kv.key, e->nodes_key, &rest) && ev->type == ETCD_DELETE) {
            if (strcmp(rest, e->node_id) == 0) {
                /* Our own lease expired (etcd did not hear from us in
                 * time): the others drop us; come back with a new lease. */
                log_warn("A2011", "etcd: this node's lease in run '%s' expired; renewing it",
                         e->run_id);
                e->ready = false;
                e->lease = 0;
                ed_step_down(e);
                start_setup(e);
                continue;
            }
            /* The state is this message's latest already (taken above). */
            if (e->st_valid && etcd_round_find(&e->st, rest)) {
                struct op o = {.kind = OP_LOSE};
                cddp_strlcpy(o.id, rest, sizeof(o.id));
                ed_push_op(e, &o);
            }
        } else if (has_prefix(ev->kv.key, e->barrier_key, &rest)) {
            barrier = true;
        } else if (has_prefix(ev->kv.key, e->blame_key, &rest) && ev->type == ETCD_PUT) {
            took_blame(e, rest, ev->kv.value, ev->kv.vlen);
        }
    }
    if (m.revision > e->watch_rev)
        e->watch_rev = m.revision;
    etcd_watch_msg_free(&m);
    if (state)
        ed_state_changed(e);
    if (barrier && e->calls.barrier_cb)
        check_barrier(e);
}

void ed_open_watch(struct ed *e)
{
    if (e->calls.closing || e->watch)
        return;
    /* The others watch only news/ (the round when it changes, the barrier,
     * the leader key): the forming states, join requests and node keys are
     * the leader's to read. */
    const char *from = e->leader ? e->prefix : e->news_key;
    char end[700];
    size_t n = etcd_prefix_end(from, strlen(from), end);
    end[n] = '\0';
    int rc = etcd_watch_open(e->cl, etcd_req_watch(from, end, e->watch_rev + 1), on_watch_msg,
                             on_watch_end, e, &e->watch);
    if (rc) {
        e->watch = NULL;
        uv_timer_start(&e->retry_timer, watch_retry, RETRY_MS, 0);
    }
    ed_info_changed(e);
}

/* ---- setup: lease, node key, state, watch ---- */

static void setup_failed(struct ed *e, int status, const char *what);

static void setup_retry(uv_timer_t *t)
{
    start_setup(t->data);
}

/* What an answer parsed to: why it made no sense (status 0 and why set),
 * or nothing to remember. */
static void note_answer(struct ed *e, int status, const char *why)
{
    if (status == 0 && why && why[0])
        snprintf(e->bad, sizeof(e->bad), "etcd member %s: %s",
                 e->cl ? etcd_client_member(e->cl) : "?", why);
    else
        e->bad[0] = '\0';
}

/* Setting up reads news/round, not state: the same value at each new round
 * (a forming state in between is the leader's; a write on the older value
 * conflicts once and gets the state as it is), and far smaller than the
 * state while a large round forms. */
static void on_state_read(struct etcd_client *cl, int status, long http, const char *body,
                          size_t len, void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    e->setting_up = false;
    struct etcd_range r;
    char why[256] = "";
    if (status != 0 || etcd_parse_range(body, len, &r, why, sizeof(why)) != 0) {
        note_answer(e, status, why);
        setup_failed(e, status, "read the run's state");
        return;
    }
    note_answer(e, status, NULL);
    if (r.nkvs)
        ed_take_state(e, &r.kvs[0], 0);
    else
        ed_take_state(e, NULL, 0);
    if (e->watch_rev == 0 || e->watch == NULL)
        e->watch_rev = r.revision;
    etcd_range_free(&r);
    bool first = !e->ready;
    e->ready = true;
    e->last_ka_ok = cddp_mono_ms();
    e->base.info.etcd_lease_ok = true;
    if (first)
        log_info("A2012", "etcd: run '%s' on %s: lease %" PRIx64 " (TTL %" PRId64 " s)", e->run_id,
                 etcd_client_member(e->cl), (uint64_t)e->lease, e->ttl_s);
    if (e->leader)
        ed_step_down(e); /* set up again (compacted): the leader lists the requests again */
    ed_open_watch(e);
    ed_elect(e);
    ed_state_changed(e);
    ed_run_ops(e);
}

static void on_node_put(struct etcd_client *cl, int status, long http, const char *body, size_t len,
                        void *arg)
{
    (void)cl, (void)http, (void)body, (void)len;
    struct ed *e = arg;
    if (status != 0) {
        e->setting_up = false;
        setup_failed(e, status, "register this node");
        return;
    }
    if (etcd_call(e->cl, "kv/range", etcd_req_range(e->round_key, NULL, false, false),
                  on_state_read, e) != 0) {
        e->setting_up = false;
        setup_failed(e, 0, "read the run's state");
    }
}

static void on_granted(struct etcd_client *cl, int status, long http, const char *body, size_t len,
                       void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    int64_t ttl;
    char why[256] = "";
    if (status != 0 || etcd_parse_lease(body, len, &e->lease, &ttl, why, sizeof(why)) != 0) {
        note_answer(e, status, why);
        e->setting_up = false;
        e->lease = 0;
        setup_failed(e, status, "grant this node's lease");
        return;
    }
    char val[64];
    snprintf(val, sizeof(val), "{\"nproc\":%d}", e->nproc);
    if (etcd_call(e->cl, "kv/put", etcd_req_put(e->node_key, val, strlen(val), e->lease),
                  on_node_put, e) != 0) {
        e->setting_up = false;
        setup_failed(e, 0, "register this node");
    }
}

static void start_setup(struct ed *e)
{
    if (e->calls.closing || e->setting_up)
        return;
    e->setting_up = true;
    int rc;
    if (e->lease == 0)
        rc = etcd_call(e->cl, "lease/grant", etcd_req_lease_grant(e->ttl_s), on_granted, e);
    else
        rc = etcd_call(e->cl, "kv/range", etcd_req_range(e->round_key, NULL, false, false),
                       on_state_read, e);
    if (rc) {
        e->setting_up = false;
        setup_failed(e, 0, "send a request");
    }
}

static void lost(struct ed *e, int status, const char *why)
{
    if (e->calls.closing) /* nothing is called back after close */
        return;
    if (e->calls.join_cb) {
        fail_join(e, status, why);
        return;
    }
    if (!e->closed_told && e->base.on_closed) {
        e->closed_told = true;
        e->base.on_closed(&e->base, status, why);
    }
}

static void setup_failed(struct ed *e, int status, const char *what)
{
    if (e->calls.closing)
        return;
    if (status == CDDP_EPEER) {
        /* A member answered, and said no (permissions, a bad request):
         * asking again will not change its mind. */
        char why[768];
        snprintf(why, sizeof(why), "etcd: could not %s: %s", what, ed_last_error(e));
        lost(e, CDDP_ECONFIG, why);
        return;
    }
    uint64_t waited = cddp_mono_ms() - e->started_at;
    if (waited >= e->conf.join_timeout_ms) {
        char why[768];
        snprintf(why, sizeof(why), "etcd: could not %s within join_timeout (%.0f s): %s", what,
                 (double)e->conf.join_timeout_ms / 1000.0, ed_last_error(e));
        lost(e, CDDP_ETIMEOUT, why);
        return;
    }
    log_warn("A2013", "etcd: could not %s (%s); retrying", what, ed_last_error(e));
    ed_info_changed(e);
    uv_timer_start(&e->retry_timer, setup_retry, 1000, 0);
}

/* ---- keep-alive ---- */

/* After keep-alives failed, the watch is as suspect as they were: a stream
 * cut off as long (a partition) sits in TCP's retransmission backoff, and
 * what its member sent meanwhile arrives seconds after the link is back
 * (6-9 s after a 20 s partition in tests/bench/chaos.py), while the other
 * nodes' round waits for this one's workers. It is closed, and the caller
 * opens a new one on the member that answered. */
static void drop_watch(struct ed *e)
{
    if (e->watch == NULL)
        return;
    etcd_watch_cancel(e->watch); /* open: no retry of it is pending */
    e->watch = NULL;
}

static void on_keepalive(struct etcd_client *cl, int status, long http, const char *body,
                         size_t len, void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    e->ka_in_flight = false;
    if (e->calls.closing)
        return;
    int64_t id, ttl = -1;
    char why[256] = "";
    bool parsed = status == 0 && etcd_parse_lease(body, len, &id, &ttl, why, sizeof(why)) == 0;
    note_answer(e, parsed ? 0 : status, parsed ? NULL : why);
    if (parsed) {
        if (ttl == 0 && e->ready) {
            log_warn("A2011", "etcd: this node's lease in run '%s' expired; renewing it",
                     e->run_id);
            e->ready = false;
            e->lease = 0;
            ed_step_down(e);
            drop_watch(e); /* the setup's state read opens a new one */
            start_setup(e);
            return;
        }
        bool was = e->base.info.etcd_lease_ok;
        e->last_ka_ok = cddp_mono_ms();
        e->base.info.etcd_lease_ok = true;
        if (!was) {
            log_warn("A2014", "etcd: keep-alive of run '%s' answered again by %s", e->run_id,
                     etcd_client_member(e->cl));
            drop_watch(e);
            ed_open_watch(e); /* from the revision the old one had reached */
            ed_info_changed(e);
        }
        return;
    }
    uint64_t since = cddp_mono_ms() - e->last_ka_ok;
    if (e->base.info.etcd_lease_ok) {
        log_warn("A2015",
                 "etcd: keep-alive of run '%s' failed (%s); workers keep running, retrying for "
                 "up to %.0f s",
                 e->run_id, ed_last_error(e), (double)e->conf.join_timeout_ms / 1000.0);
        e->base.info.etcd_lease_ok = false;
        e->base.info.disconnected_at = cddp_wall_time();
        ed_info_changed(e);
    }
    if (since >= e->conf.join_timeout_ms) {
        char msg[768];
        snprintf(msg, sizeof(msg),
                 "etcd: no keep-alive answered for %.0f s (join_timeout; no quorum or no member "
                 "reachable): %s",
                 (double)since / 1000.0, ed_last_error(e));
        lost(e, CDDP_ETIMEOUT, msg);
    }
}

static void on_ka_timer(uv_timer_t *t)
{
    struct ed *e = t->data;
    if (e->calls.closing || !e->ready || e->lease == 0)
        return;
    if (!e->leader && !e->writer_seen)
        ed_elect(e); /* the last try got no answer */
    if (e->ka_in_flight)
        return;
    if (etcd_call(e->cl, "lease/keepalive", etcd_req_lease_id(e->lease), on_keepalive, e) == 0)
        e->ka_in_flight = true;
}

/* ---- the agent's calls ---- */

static void on_join_timer(uv_timer_t *t)
{
    struct ed *e = t->data;
    if (rdzv_calls_deferred(&e->calls) || e->calls.join_cb == NULL)
        return;
    char why[768];
    if (!e->ready)
        snprintf(why, sizeof(why), "etcd: no usable answer within join_timeout (%.0f s): %s",
                 (double)e->conf.join_timeout_ms / 1000.0, ed_last_error(e));
    else
        snprintf(why, sizeof(why),
                 "the round of run '%s' did not complete within join_timeout (%.0f s)%s", e->run_id,
                 (double)e->conf.join_timeout_ms / 1000.0,
                 e->conf.last_call_timeout_ms >= e->conf.join_timeout_ms
                     ? "; last_call_timeout is not shorter than join_timeout, so a round that "
                       "waits for more nodes cannot complete in time"
                     : "");
    fail_join(e, CDDP_ETIMEOUT, why);
}

static int ed_join(struct agent_rdzv *r, const struct agent_join *req, agent_round_cb cb)
{
    struct ed *e = (struct ed *)r;
    int rc = rdzv_calls_join(&e->calls, req, e->nproc, cb);
    if (rc)
        return rc;
    e->calls.barrier_cb = NULL;
    uv_timer_stop(&e->barrier_timer);
    e->base.was_waiting = false;
    e->warned_waiting = false;
    int port = req->master_port > 0 ? req->master_port : agent_free_port();
    if (port < 0) {
        char why[128];
        snprintf(why, sizeof(why), "picking a free MASTER_PORT: %s", cddp_strerror(port));
        rdzv_calls_defer_join(&e->calls, &e->join_timer, on_join_timer, port, why);
        return 0;
    }
    e->join_port = port;
    e->join_applied = false; /* until the leader folds it */
    e->join_put = false;
    uv_timer_start(&e->join_timer, on_join_timer, e->conf.join_timeout_ms, 0);
    struct op o = {.kind = OP_JOIN};
    ed_push_op(e, &o);
    return 0;
}

static int ed_report_failure(struct agent_rdzv *r, int restart_count)
{
    (void)restart_count;
    struct ed *e = (struct ed *)r;
    if (e->calls.closing)
        return CDDP_ECLOSED;
    struct op o = {.kind = OP_FAILURE, .round = e->round};
    ed_push_op(e, &o);
    return 0;
}

/* Worker scope: ask to restart `rank` alone, or `ranks` together
 * (etcd_round_replace, applied to the state like every other change); the
 * state's next generation answers through on_generation
 * (ed_state_changed), a refusal through op_done. */
static int ed_replace(struct agent_rdzv *r, int rank, const char *ranks, const char *reason)
{
    (void)reason;
    struct ed *e = (struct ed *)r;
    if (!in_round(e))
        return CDDP_ESTATE;
    struct op o = {.kind = OP_REPLACE, .round = e->round, .rank = rank};
    if (ranks && cddp_strlcpy(o.ranks, ranks, sizeof(o.ranks)) >= sizeof(o.ranks))
        return CDDP_ERANGE_ARG;
    ed_push_op(e, &o);
    return 0;
}

static void on_blame_put(struct etcd_client *cl, int status, long http, const char *body,
                         size_t len, void *arg)
{
    (void)cl, (void)http, (void)body, (void)len;
    struct ed *e = arg;
    if (status != 0 && !e->calls.closing)
        log_warn("A2017",
                 "etcd: could not pass a hung rank's blame on to its node (%s); its peers wait "
                 "for --init-timeout instead",
                 ed_last_error(e));
}

/* Worker scope: one of this node's ranks names `rank`, another node's, as
 * never reaching a collective of `generation`: a key under news/blame/
 * (on this node's lease), which that node's agent sees on its watch
 * (took_blame), as the server's `blame` passes it on. */
static int ed_blame(struct agent_rdzv *r, int rank, int64_t generation)
{
    struct ed *e = (struct ed *)r;
    if (!in_round(e) || e->cl == NULL || rank < 0 || generation < 0)
        return CDDP_ESTATE;
    char key[1000], val[PROTO_MAX_ID + 32];
    snprintf(key, sizeof(key), "%s%" PRIu64 "/%d", e->blame_key, e->round, rank);
    int n = snprintf(val, sizeof(val), "%" PRId64 " %s", generation, e->node_id);
    return etcd_call(e->cl, "kv/put", etcd_req_put(key, val, (size_t)n, e->lease), on_blame_put, e);
}

static void barrier_fire(struct ed *e, int status)
{
    uv_timer_stop(&e->barrier_timer);
    rdzv_calls_barrier(&e->calls, status);
}

static void on_barrier_count(struct etcd_client *cl, int status, long http, const char *body,
                             size_t len, void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    e->barrier_counting = false;
    struct etcd_range r;
    char why[256];
    if (e->calls.barrier_cb == NULL || e->calls.closing)
        return;
    if (status != 0 || etcd_parse_range(body, len, &r, why, sizeof(why)) != 0)
        return; /* the next barrier event, or the timeout */
    if (r.count >= e->round_nnodes)
        barrier_fire(e, 0);
    etcd_range_free(&r);
}

static void check_barrier(struct ed *e)
{
    if (e->barrier_counting || e->calls.barrier_cb == NULL)
        return;
    char key[760], end[760];
    snprintf(key, sizeof(key), "%s%" PRIu64 "/", e->barrier_key, e->barrier_round);
    size_t n = etcd_prefix_end(key, strlen(key), end);
    end[n] = '\0';
    if (etcd_call(e->cl, "kv/range", etcd_req_range(key, end, true, false), on_barrier_count, e) ==
        0)
        e->barrier_counting = true;
}

static void on_barrier_put(struct etcd_client *cl, int status, long http, const char *body,
                           size_t len, void *arg)
{
    (void)cl, (void)http, (void)body, (void)len, (void)status;
    check_barrier(arg);
}

static void on_barrier_timeout(uv_timer_t *t)
{
    barrier_fire(t->data, CDDP_ETIMEOUT);
}

static int ed_exit_barrier(struct agent_rdzv *r, uint64_t timeout_ms, agent_rdzv_status_cb cb)
{
    struct ed *e = (struct ed *)r;
    if (e->calls.barrier_cb || e->calls.closing || e->round == 0)
        return CDDP_ESTATE;
    char key[1000];
    snprintf(key, sizeof(key), "%s%" PRIu64 "/%s", e->barrier_key, e->round, e->node_id);
    int rc = etcd_call(e->cl, "kv/put", etcd_req_put(key, "1", 1, e->lease), on_barrier_put, e);
    if (rc)
        return rc;
    e->calls.barrier_cb = cb;
    e->barrier_round = e->round;
    uv_timer_start(&e->barrier_timer, on_barrier_timeout, timeout_ms, 0);
    return 0;
}

static void ed_close(struct agent_rdzv *r, enum agent_rdzv_farewell how, const char *reason,
                     agent_rdzv_close_cb cb)
{
    struct ed *e = (struct ed *)r;
    if (!rdzv_calls_close(&e->calls, how, reason, cb))
        return;
    uv_timer_stop(&e->join_timer);
    uv_timer_stop(&e->barrier_timer);
    uv_timer_stop(&e->lc_timer);
    uv_timer_stop(&e->ka_timer);
    uv_timer_stop(&e->retry_timer);
    uv_timer_stop(&e->op_timer);
    uv_timer_stop(&e->fold_timer);
    if (e->watch) {
        etcd_watch_cancel(e->watch);
        e->watch = NULL;
    }
    uv_timer_start(&e->close_timer, on_close_timeout, CLOSE_TIMEOUT_MS, 0);
    if (!e->ready || e->cl == NULL) {
        ed_farewell_done(e);
        return;
    }
    /* Pending news of others is no longer ours to write; the farewell is. */
    bool busy = e->op_in_flight;
    size_t keep = busy ? 1 : 0;
    e->nops = keep;
    struct op o = {.kind = how == AGENT_RDZV_END_JOB ? OP_CLOSE : OP_LEAVE,
                   .finished = how == AGENT_RDZV_FINISHED};
    e->ops[e->nops++] = o;
    if (!busy)
        ed_run_ops(e);
}

static const struct agent_rdzv_ops etcd_ops = {
    .name = "etcd-v3",
    .join = ed_join,
    .report_failure = ed_report_failure,
    .exit_barrier = ed_exit_barrier,
    .close = ed_close,
    .replace = ed_replace,
    .blame = ed_blame,
};

int agent_rdzv_etcd_new(uv_loop_t *loop, const struct agent_rdzv_etcd_options *o,
                        struct agent_rdzv **out, char *err, size_t errlen)
{
    struct ed *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory");
    e->base.ops = &etcd_ops;
    e->base.loop = loop;
    rdzv_calls_init(&e->calls, &e->base);
    e->base.coordinated = true;
    e->base.picks_master_port = true;
    e->base.info.waiting_nodes = -1;
    e->loop = loop;
    e->nproc = o->nproc;
    e->min_nodes = o->min_nodes;
    e->max_nodes = o->max_nodes;
    if (o->conf)
        e->conf = *o->conf;
    else
        rdzv_conf_init(&e->conf);
    e->rconf.last_call_timeout_ms = e->conf.last_call_timeout_ms;
    cddp_strlcpy(e->run_id, o->run_id, sizeof(e->run_id));
    char fqdn[256];
    cddp_fqdn(fqdn, sizeof(fqdn));
    if (o->node_id)
        cddp_strlcpy(e->node_id, o->node_id, sizeof(e->node_id));
    else
        snprintf(e->node_id, sizeof(e->node_id), "%.200s_%d", fqdn, (int)getpid());
    cddp_strlcpy(e->addr, o->local_addr && o->local_addr[0] ? o->local_addr : fqdn,
                 sizeof(e->addr));
    for (const char *p = e->run_id; *p; p++) {
        if (*p == '/')
            return free(e),
                   cddp_fail(err, errlen, CDDP_ECONFIG,
                             "--rdzv_id=%s: the etcd backend takes no '/' in run ids", e->run_id);
    }
    const char *kp = e->conf.etcd_key_prefix[0] ? e->conf.etcd_key_prefix : DEFAULT_PREFIX;
    size_t kpl = strlen(kp);
    while (kpl > 1 && kp[kpl - 1] == '/')
        kpl--;
    snprintf(e->prefix, sizeof(e->prefix), "%.*s/%s/", (int)kpl, kp, e->run_id);
    snprintf(e->state_key, sizeof(e->state_key), "%sstate", e->prefix);
    snprintf(e->nodes_key, sizeof(e->nodes_key), "%snodes/", e->prefix);
    snprintf(e->node_key, sizeof(e->node_key), "%s%s", e->nodes_key, e->node_id);
    snprintf(e->joins_key, sizeof(e->joins_key), "%sjoins/", e->prefix);
    snprintf(e->join_key, sizeof(e->join_key), "%s%s", e->joins_key, e->node_id);
    snprintf(e->news_key, sizeof(e->news_key), "%snews/", e->prefix);
    snprintf(e->barrier_key, sizeof(e->barrier_key), "%sbarrier/", e->news_key);
    snprintf(e->writer_key, sizeof(e->writer_key), "%sleader", e->news_key);
    snprintf(e->round_key, sizeof(e->round_key), "%sround", e->news_key);
    snprintf(e->blame_key, sizeof(e->blame_key), "%sblame/", e->news_key);
    double window = (double)rdzv_conf_dead_after_ms(&e->conf) / 1000.0;
    e->ttl_s = (int64_t)ceil(window);
    if (e->ttl_s < 2)
        e->ttl_s = 2; /* etcd raises shorter TTLs to its minimum anyway */

    struct etcd_client_options co = {
        .endpoints = o->endpoints,
        .https = e->conf.etcd_https,
        .cacert = e->conf.etcd_cacert[0] ? e->conf.etcd_cacert : NULL,
        .cert = e->conf.etcd_cert[0] ? e->conf.etcd_cert : NULL,
        .key = e->conf.etcd_key[0] ? e->conf.etcd_key : NULL,
        .user = e->conf.etcd_user[0] ? e->conf.etcd_user : NULL,
        .password = e->conf.etcd_password[0] ? e->conf.etcd_password : getenv("CDDP_ETCD_PASSWORD"),
        /* A request must not outlive a keep-alive interval much. */
        .request_timeout_ms =
            e->conf.keep_alive_interval_ms < 5000 ? 5000 : e->conf.keep_alive_interval_ms,
    };
    char why[512];
    int rc = etcd_client_new(loop, &co, &e->cl, why, sizeof(why));
    if (rc) {
        free(e);
        return cddp_fail(err, errlen, rc, "--rdzv_endpoint: %s", why);
    }
    if (o->backend && strcmp(o->backend, "etcd-v3") != 0)
        log_warn("A2000",
                 "--rdzv_backend=%s: cddprun's etcd backend is etcd-v3 (etcd's v3 API); it "
                 "cannot join a torchrun etcd rendezvous (docs/torchrun-compat.md)",
                 o->backend);
    uv_timer_t *timers[] = {&e->ka_timer, &e->retry_timer,   &e->op_timer,    &e->join_timer,
                            &e->lc_timer, &e->barrier_timer, &e->close_timer, &e->fold_timer};
    for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++) {
        uv_timer_init(loop, timers[i]);
        timers[i]->data = e;
    }
    e->started_at = cddp_mono_ms();
    e->rnd = cddp_mono_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)e;
    e->last_ka_ok = e->started_at;
    uv_timer_start(&e->ka_timer, on_ka_timer, e->conf.keep_alive_interval_ms,
                   e->conf.keep_alive_interval_ms);
    ed_info_changed(e);
    start_setup(e);
    *out = &e->base;
    return 0;
}
