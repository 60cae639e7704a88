/*
 * rdzv_etcd_write.c: the etcd-v3 backend's writes to the run's state
 * (rdzv_etcd_int.h, docs/etcd.md "How it works").
 *
 * One mutation is in flight per agent at a time: the head of a small queue
 * of ops is applied to the state as last seen (rendezvous/etcd_round.h) and
 * written back in a transaction compared on the key's mod_revision; a
 * conflict returns the value as it is now, and the op is applied again
 * (after a jittered wait that grows with the conflicts in a row). A join
 * is a request key of this node's own; the leader (the agent whose create
 * of the leader key went through) folds the pending requests into the
 * state in batches, and prunes members without a lease when it takes over.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/rdzv_etcd_int.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/strutil.h"

/* ---- ops: one state mutation in flight ---- */

void ed_push_op(struct ed *e, const struct op *o)
{
    for (size_t i = 0; i < e->nops; i++) { /* the same news once */
        if (e->ops[i].kind == o->kind && strcmp(e->ops[i].id, o->id) == 0 &&
            e->ops[i].round == o->round && e->ops[i].rank == o->rank)
            return;
    }
    if (e->nops == MAX_OPS) {
        log_warn("A2002", "etcd: too many pending rendezvous updates; dropping one");
        return;
    }
    e->ops[e->nops++] = *o;
    ed_run_ops(e);
}

static bool alive_in(void *arg, const char *id)
{
    const struct etcd_range *nodes = arg;
    size_t idlen = strlen(id);
    for (size_t i = 0; i < nodes->nkvs; i++) {
        const char *k = nodes->kvs[i].key;
        size_t kl = nodes->kvs[i].keylen;
        if (kl >= idlen && strcmp(k + kl - idlen, id) == 0 &&
            (kl == idlen || k[kl - idlen - 1] == '/'))
            return true;
    }
    return false;
}

/* Applies op to st; true if it must be written. */
static bool apply(struct ed *e, struct etcd_round *st, const struct op *o,
                  const struct etcd_range *alive)
{
    uint64_t now = ed_wall_ms();
    switch (o->kind) {
    case OP_JOIN: /* a request of our own (run_ops), folded by the leader */
        return false;
    case OP_FOLD: {
        bool changed =
            alive ? etcd_round_prune(st, &e->rconf, now, alive_in, (void *)alive) : false;
        struct etcd_join j[FOLD_MAX];
        e->nfolding = 0;
        for (size_t i = 0; i < e->nreqs && e->nfolding < FOLD_MAX; i++) {
            struct request *q = &e->folding[e->nfolding];
            *q = e->reqs[i];
            j[e->nfolding++] = (struct etcd_join){.id = q->id,
                                                  .nproc = q->req.nproc,
                                                  .addr = q->req.addr,
                                                  .port = q->req.port,
                                                  .gens = q->req.gens,
                                                  .ranks = q->req.ranks};
        }
        return etcd_round_fold(st, &e->rconf, now, j, e->nfolding) || changed;
    }
    case OP_LOSE:
        return etcd_round_lose(st, &e->rconf, now, o->id, "node_lost", false);
    case OP_LEAVE:
        return etcd_round_lose(st, &e->rconf, now, e->node_id, "node_left", o->finished);
    case OP_FAILURE:
        return etcd_round_failure(st, &e->rconf, now, e->node_id, o->round);
    case OP_REPLACE: /* refused: op_done tells the agent why */
        e->replace_refused =
            etcd_round_replace(st, now, e->node_id, o->round, o->rank,
                               o->ranks[0] ? o->ranks : NULL, e->refused, sizeof(e->refused)) != 0;
        return !e->replace_refused;
    case OP_CLOSE:
        return etcd_round_close(st, e->calls.close_reason);
    case OP_TICK:
        return etcd_round_tick(st, &e->rconf, now);
    }
    return false;
}

/* A state value read from etcd (a CAS conflict, a range, the watch);
 * kv NULL: the key does not exist. */
void ed_take_state(struct ed *e, const struct etcd_kv *kv, int64_t deleted_at)
{
    if (kv == NULL) {
        if (deleted_at && deleted_at < e->st_rev)
            return;
        etcd_round_free(&e->st);
        e->st_valid = false;
        e->st_rev = 0;
        return;
    }
    if (kv->mod_rev <= e->st_rev)
        return; /* seen already (our own write, echoed by the watch) */
    struct etcd_round st;
    char why[256];
    e->st_rev = kv->mod_rev;
    etcd_round_free(&e->st);
    e->st_valid = false;
    if (etcd_round_decode((const char *)kv->value, kv->vlen, &st, why, sizeof(why)) != 0) {
        /* Not ours (or damaged): the next write replaces it. */
        log_warn("A2003",
                 "etcd: the state key of run '%s' is unreadable (%s); it will be rewritten",
                 e->run_id, why);
        return;
    }
    e->st = st;
    e->st_valid = true;
}

static void op_retry(uv_timer_t *t)
{
    ed_run_ops(t->data);
}

static void op_done(struct ed *e)
{
    e->op_in_flight = false;
    bool refused = e->ops[0].kind == OP_REPLACE && e->replace_refused;
    e->replace_refused = false;
    if (e->ops[0].kind == OP_JOIN && e->calls.join_cb)
        e->join_put = true; /* the leader folds it into the state */
    if (e->ops[0].kind == OP_FOLD) {
        /* Folded (or nothing to change): those requests are done. */
        for (size_t i = 0; i < e->nfolding; i++) {
            for (size_t k = 0; k < e->nreqs; k++) {
                if (strcmp(e->reqs[k].id, e->folding[i].id) == 0 &&
                    e->reqs[k].rev == e->folding[i].rev) {
                    e->reqs[k] = e->reqs[--e->nreqs];
                    break;
                }
            }
        }
        e->nfolding = 0;
        if (e->alive_listed)
            e->fold_prune = false;
    }
    e->alive_listed = false;
    memmove(&e->ops[0], &e->ops[1], (e->nops - 1) * sizeof(e->ops[0]));
    e->nops--;
    if (e->calls.closing && e->nops == 0) {
        ed_farewell_done(e);
        return;
    }
    if (!e->calls.closing)
        ed_state_changed(e); /* (a grant: on_generation) */
    if (refused && !e->calls.closing && e->base.on_generation)
        e->base.on_generation(&e->base, 0, NULL, NULL, e->refused, 0);
    ed_schedule_fold(e);
    ed_run_ops(e);
}

static void op_failed(struct ed *e, const char *what)
{
    e->op_in_flight = false;
    if (e->calls.closing) {
        /* A farewell that cannot be written: the lease's expiry tells the others. */
        log_warn("A2004", "etcd: could not %s while leaving (%s)", what, ed_last_error(e));
        e->nops = 0;
        ed_farewell_done(e);
        return;
    }
    log_debug("A2005", "etcd: %s failed (%s); retrying", what, ed_last_error(e));
    uv_timer_start(&e->op_timer, op_retry, RETRY_MS, 0);
}

static void on_cas(struct etcd_client *cl, int status, long http, const char *body, size_t len,
                   void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    bool ok = false;
    struct etcd_range r;
    char why[256] = "";
    if (status == 0 && etcd_parse_cas(body, len, &ok, &r, why, sizeof(why)) != 0)
        status = CDDP_EPARSE;
    if (status != 0) {
        etcd_round_free(&e->pending);
        if (status == CDDP_EPARSE)
            log_warn("A2006", "etcd: a bad answer to a state update: %s", why);
        op_failed(e, "update the rendezvous state");
        return;
    }
    if (ok) {
        /* What we wrote is the state now, at the answer's revision. */
        etcd_round_free(&e->st);
        e->st = e->pending;
        memset(&e->pending, 0, sizeof(e->pending));
        e->st_valid = true;
        e->st_rev = r.revision;
        etcd_range_free(&r);
        e->conflicts = 0;
        op_done(e);
        return;
    }
    /* Someone moved first: apply again to the state as it is. */
    etcd_round_free(&e->pending);
    ed_take_state(e, r.nkvs ? &r.kvs[0] : NULL, 0);
    if (r.nkvs == 0) {
        e->st_rev = 0;
        e->st_valid = false;
    }
    etcd_range_free(&r);
    e->op_in_flight = false;
    if (!e->calls.closing)
        ed_state_changed(e);
    /* Many agents writing at once (a job starting): retrying at once makes
     * every retry but one fail again; a jittered wait that grows with the
     * conflicts in a row spreads them out (as torch's backends do). */
    if (++e->conflicts > 1) {
        unsigned cap = e->conflicts < 8 ? 1u << e->conflicts : 256u;
        e->rnd = e->rnd * 6364136223846793005ULL + 1442695040888963407ULL;
        uv_timer_start(&e->op_timer, op_retry, (e->rnd >> 33) % cap, 0);
        return;
    }
    ed_run_ops(e);
}

/* Members on the wait list (a change while running is news: they log it). */
static size_t waiting(const struct etcd_round *st)
{
    size_t n = 0;
    for (size_t i = 0; i < st->nmembers; i++)
        n += st->members[i].state == ETCD_M_WAITING;
    return n;
}

static void write_op(struct ed *e, const struct etcd_range *alive)
{
    const struct op *o = &e->ops[0];
    struct etcd_round next;
    if (e->st_valid) {
        if (etcd_round_copy(&next, &e->st) != 0) {
            op_failed(e, "copy the state");
            return;
        }
    } else if (o->kind == OP_FOLD || o->kind == OP_CLOSE) {
        etcd_round_init(&next, e->min_nodes, e->max_nodes);
    } else {
        op_done(e); /* no run: nothing to change */
        return;
    }
    if (!apply(e, &next, o, alive)) {
        etcd_round_free(&next);
        op_done(e);
        return;
    }
    char *val = etcd_round_encode(&next);
    if (val == NULL) {
        etcd_round_free(&next);
        op_failed(e, "encode the state");
        return;
    }
    int64_t lease = o->kind == OP_CLOSE ? e->close_lease : 0;
    /* A new round, phase or run goes to news/round too, which is all the
     * non-leaders watch: the forming states in between are the leader's. */
    const char *news = !e->st_valid || e->st.round != next.round || e->st.phase != next.phase ||
                               e->st.generation != next.generation ||
                               (next.phase == ETCD_RUNNING && waiting(&e->st) != waiting(&next))
                           ? e->round_key
                           : NULL;
    char *req;
    if (o->kind == OP_FOLD && e->nfolding) {
        /* The folded requests go in the same transaction, each compared on
         * its revision (a newer request of that node stays). */
        const char *keys[FOLD_MAX];
        int64_t revs[FOLD_MAX];
        char(*buf)[sizeof(e->join_key)] = malloc(e->nfolding * sizeof(*buf));
        for (size_t i = 0; buf && i < e->nfolding; i++) {
            snprintf(buf[i], sizeof(buf[i]), "%s%s", e->joins_key, e->folding[i].id);
            keys[i] = buf[i];
            revs[i] = e->folding[i].rev;
        }
        req = buf ? etcd_req_fold(e->state_key, e->st_rev, val, strlen(val), lease, news, keys,
                                  revs, e->nfolding)
                  : NULL;
        free(buf);
    } else {
        req = etcd_req_fold(e->state_key, e->st_rev, val, strlen(val), lease, news, NULL, NULL, 0);
    }
    free(val);
    e->pending = next;
    if (etcd_call(e->cl, "kv/txn", req, on_cas, e) != 0) {
        etcd_round_free(&e->pending);
        op_failed(e, "update the rendezvous state");
        return;
    }
    e->op_in_flight = true;
}

static void on_alive(struct etcd_client *cl, int status, long http, const char *body, size_t len,
                     void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    struct etcd_range r;
    char why[256];
    e->op_in_flight = false;
    if (status == 0 && etcd_parse_range(body, len, &r, why, sizeof(why)) == 0) {
        e->alive_listed = true;
        write_op(e, &r);
        etcd_range_free(&r);
        return;
    }
    op_failed(e, "list the run's live nodes");
}

static void on_join_put(struct etcd_client *cl, int status, long http, const char *body, size_t len,
                        void *arg)
{
    (void)cl, (void)http, (void)body, (void)len;
    struct ed *e = arg;
    e->op_in_flight = false;
    if (status != 0) {
        op_failed(e, "write this node's join request");
        return;
    }
    op_done(e);
}

static void on_close_lease(struct etcd_client *cl, int status, long http, const char *body,
                           size_t len, void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    int64_t ttl;
    char why[256];
    e->op_in_flight = false;
    if (status == 0 && etcd_parse_lease(body, len, &e->close_lease, &ttl, why, sizeof(why)) == 0) {
        write_op(e, NULL);
        return;
    }
    op_failed(e, "grant the closed run's lease");
}

void ed_run_ops(struct ed *e)
{
    if (e->op_in_flight || e->nops == 0 || !e->ready || e->cl == NULL ||
        uv_is_active((uv_handle_t *)&e->op_timer))
        return;
    const struct op *o = &e->ops[0];
    int rc = 0;
    if (o->kind == OP_JOIN) {
        /* Our join is a request of our own key; the leader folds it. */
        struct etcd_join j = {.id = e->node_id,
                              .nproc = e->nproc,
                              .addr = e->addr,
                              .port = e->join_port,
                              .gens = true,
                              .ranks = true};
        char *val = etcd_round_request_encode(&j);
        rc = val ? etcd_call(e->cl, "kv/put", etcd_req_put(e->join_key, val, strlen(val), e->lease),
                             on_join_put, e)
                 : CDDP_ERR_FROM_ERRNO(ENOMEM);
        free(val);
    } else if (o->kind == OP_FOLD && e->fold_prune) {
        /* A new leader: members whose lease is gone (lost before its watch
         * began, or with the last leader) go first: list the live node
         * keys (again after a conflict; the watch tells of later losses). */
        char end[640];
        size_t n = etcd_prefix_end(e->nodes_key, strlen(e->nodes_key), end);
        end[n] = '\0';
        rc = etcd_call(e->cl, "kv/range", etcd_req_range(e->nodes_key, end, false, true), on_alive,
                       e);
    } else if (o->kind == OP_CLOSE && e->close_lease == 0) {
        uint64_t s = (e->conf.close_timeout_ms + 999) / 1000;
        rc = etcd_call(e->cl, "lease/grant", etcd_req_lease_grant((int64_t)(s ? s : 1)),
                       on_close_lease, e);
    } else {
        write_op(e, NULL);
        return;
    }
    if (rc)
        op_failed(e, "send a request");
    else
        e->op_in_flight = true;
}

/* ---- leadership: one agent folds the join requests ---- */

static void fold_due(uv_timer_t *t)
{
    struct ed *e = t->data;
    struct op o = {.kind = OP_FOLD};
    ed_push_op(e, &o);
}

/* A batch of requests after a short debounce that grows with the round's
 * size: every state write goes to every agent's watch, so fewer, larger
 * writes are what scales (docs/etcd.md "Scale"). */
void ed_schedule_fold(struct ed *e)
{
    if (!e->leader || e->calls.closing || (e->nreqs == 0 && !e->fold_prune) ||
        uv_is_active((uv_handle_t *)&e->fold_timer))
        return;
    for (size_t i = 0; i < e->nops; i++) {
        if (e->ops[i].kind == OP_FOLD)
            return; /* op_done schedules the next */
    }
    size_t n = e->st_valid ? e->st.nmembers : 0, taken = 0;
    for (size_t i = 0; i < n; i++)
        taken +=
            e->st.members[i].state == ETCD_M_JOINED || e->st.members[i].state == ETCD_M_EXPECTED;
    /* At once when these requests may complete the round. */
    bool full =
        e->st_valid && e->st.phase == ETCD_FORMING && taken + e->nreqs >= (size_t)e->max_nodes;
    uv_timer_start(&e->fold_timer, fold_due, full ? 1 : 5 + n / 4, 0);
}

void ed_req_put(struct ed *e, const char *id, int64_t rev, const unsigned char *val, size_t vlen)
{
    struct etcd_request rq;
    char why[256];
    if (id[0] == '\0' || strlen(id) > PROTO_MAX_ID ||
        etcd_round_request_decode((const char *)val, vlen, &rq, why, sizeof(why)) != 0) {
        log_warn("A2050", "etcd: an unreadable join request in run '%s' (node '%.64s'); ignored",
                 e->run_id, id);
        return;
    }
    struct request *q = NULL;
    for (size_t i = 0; i < e->nreqs && q == NULL; i++)
        q = strcmp(e->reqs[i].id, id) == 0 ? &e->reqs[i] : NULL;
    if (q && q->rev >= rev)
        return;
    if (q == NULL) {
        if (e->nreqs == e->reqcap) {
            size_t cap = e->reqcap ? e->reqcap * 2 : 64;
            struct request *p = realloc(e->reqs, cap * sizeof(*p));
            if (p == NULL)
                return;
            e->reqs = p;
            e->reqcap = cap;
        }
        q = &e->reqs[e->nreqs++];
        cddp_strlcpy(q->id, id, sizeof(q->id));
    }
    q->rev = rev;
    q->req = rq;
    ed_schedule_fold(e);
}

void ed_req_drop(struct ed *e, const char *id, int64_t rev)
{
    for (size_t i = 0; i < e->nreqs; i++) {
        if (strcmp(e->reqs[i].id, id) == 0) {
            if (e->reqs[i].rev < rev)
                e->reqs[i] = e->reqs[--e->nreqs];
            return;
        }
    }
}

void ed_step_down(struct ed *e)
{
    if (e->lease == 0 && e->calls.join_cb && e->join_put) {
        /* Our join request went with the lease: write it again. */
        e->join_put = false;
        e->join_applied = false;
        struct op o = {.kind = OP_JOIN};
        ed_push_op(e, &o);
    }
    e->leader = false;
    e->writer_seen = false;
    e->fold_prune = false;
    e->nreqs = 0;
    uv_timer_stop(&e->fold_timer);
}

static void list_joins(struct ed *e);

static void list_retry(uv_timer_t *t)
{
    list_joins(t->data);
}

static void on_joins_listed(struct etcd_client *cl, int status, long http, const char *body,
                            size_t len, void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    struct etcd_range r;
    char why[256];
    if (!e->leader || e->calls.closing)
        return;
    if (status != 0 || etcd_parse_range(body, len, &r, why, sizeof(why)) != 0) {
        uv_timer_start(&e->fold_timer, list_retry, RETRY_MS, 0);
        return;
    }
    size_t pl = strlen(e->joins_key);
    for (size_t i = 0; i < r.nkvs; i++) {
        if (r.kvs[i].keylen > pl)
            ed_req_put(e, r.kvs[i].key + pl, r.kvs[i].mod_rev, r.kvs[i].value, r.kvs[i].vlen);
    }
    etcd_range_free(&r);
    e->fold_prune = true;
    uv_timer_stop(&e->fold_timer);
    struct op o = {.kind = OP_FOLD};
    ed_push_op(e, &o);
}

/* The pending requests as they are (the watch tells of later ones). */
static void list_joins(struct ed *e)
{
    if (!e->leader || e->calls.closing)
        return;
    char end[640];
    size_t n = etcd_prefix_end(e->joins_key, strlen(e->joins_key), end);
    end[n] = '\0';
    if (etcd_call(e->cl, "kv/range", etcd_req_range(e->joins_key, end, false, false),
                  on_joins_listed, e) != 0)
        uv_timer_start(&e->fold_timer, list_retry, RETRY_MS, 0);
}

static void become_leader(struct ed *e)
{
    e->leader = true;
    e->writer_seen = true;
    log_info("A2051", "etcd: this node is the leader of run '%s' (it folds the join requests)",
             e->run_id);
    /* The leader watches the whole run (join requests, node keys). */
    if (e->watch) {
        etcd_watch_cancel(e->watch);
        e->watch = NULL;
    }
    ed_open_watch(e);
    uv_timer_stop(&e->fold_timer);
    list_joins(e);
}

static void on_elect(struct etcd_client *cl, int status, long http, const char *body, size_t len,
                     void *arg)
{
    (void)cl, (void)http;
    struct ed *e = arg;
    bool ok = false;
    struct etcd_range r;
    char why[256];
    e->electing = false;
    if (e->calls.closing || !e->ready)
        return;
    if (status != 0 || etcd_parse_cas(body, len, &ok, &r, why, sizeof(why)) != 0)
        return; /* the keep-alive timer tries again */
    bool ours =
        ok || (r.nkvs && r.kvs[0].lease == e->lease && r.kvs[0].vlen == strlen(e->node_id) &&
               memcmp(r.kvs[0].value, e->node_id, r.kvs[0].vlen) == 0);
    bool held = r.nkvs > 0;
    etcd_range_free(&r);
    if (ours) {
        become_leader(e);
        return;
    }
    e->writer_seen = held;
    if (!held)
        ed_elect(e); /* gone in between */
}

/* Create writer_key on our lease if nobody holds it (mod_revision 0). */
void ed_elect(struct ed *e)
{
    if (e->electing || e->leader || !e->ready || e->calls.closing || e->lease == 0)
        return;
    if (etcd_call(e->cl, "kv/txn",
                  etcd_req_cas(e->writer_key, 0, e->node_id, strlen(e->node_id), e->lease),
                  on_elect, e) == 0)
        e->electing = true;
}
