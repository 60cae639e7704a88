/* Unit tests for rendezvous/state.c: every transition
 * and timeout of the pure state machine, driven with simulated peers and a
 * simulated clock, up to 10,000 nodes in one process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "rendezvous/conf.h"
#include "rendezvous/state.h"
/* ---- a simulated server ---- */

#define MAXP 16

struct sim {
    struct rdzv_state *st;
    struct rdzv_peer peer[MAXP];
    bool connected[MAXP];
    bool frozen[MAXP]; /* sends no heartbeats (a SIGSTOPped agent) */
    bool store_only;
    uint64_t now;
    /* Copy of the last call's actions. */
    struct rdzv_action acts[256];
    size_t nacts;
};

static void collect(struct sim *s)
{
    const struct rdzv_action *a;
    size_t n = rdzv_state_actions(s->st, &a);
    assert_true(n <= 256);
    if (n)
        memcpy(s->acts, a, n * sizeof(*a));
    s->nacts = n;
    for (size_t i = 0; i < n; i++) {
        /* Never an action for a connection that is gone. */
        struct rdzv_peer *p = a[i].peer;
        assert_true(p >= s->peer && p < s->peer + MAXP);
        assert_true(s->connected[p - s->peer]);
    }
}

static struct sim *sim_new(bool store_only)
{
    struct sim *s = calloc(1, sizeof(*s));
    struct rdzv_state_options o = {.store_only = store_only, .seed = {11, 22}};
    s->st = rdzv_state_new(&o);
    s->store_only = store_only;
    s->now = 1000;
    return s;
}

static void sim_free(struct sim *s)
{
    for (int i = 0; i < MAXP; i++) {
        if (s->connected[i])
            rdzv_state_disconnect(s->st, s->now, &s->peer[i]);
        s->connected[i] = false;
    }
    /* Closed runs are forgotten close_timeout after their last connection;
     * a plain store stays. */
    s->now += 7LL * 24 * 3600 * 1000;
    rdzv_state_tick(s->st, s->now);
    assert_int_equal(rdzv_state_num_runs(s->st), s->store_only ? 1 : 0);
    assert_int_equal(rdzv_state_next_deadline(s->st), RDZV_NEVER);
    rdzv_state_free(s->st);
    free(s);
}

static void hello(struct sim *s, int i, const char *run_id)
{
    char err[256];
    char addr[32];
    snprintf(addr, sizeof(addr), "10.0.0.%d", i + 1);
    rdzv_peer_init(&s->peer[i], addr, false, NULL);
    s->connected[i] = true;
    assert_int_equal(rdzv_state_hello(s->st, s->now, &s->peer[i], run_id, err, sizeof(err)), 0);
    collect(s);
    assert_int_equal(s->nacts, 0);
}

struct joinopt {
    int nproc, min, max, port;
    const char *conf; /* "k=v,k=v" */
    const char *local_addr, *hostname;
};

/* Splits "k=v,k=v" (or NULL) into kv (at most 16), in buf; the count. */
static size_t parse_kv(const char *conf, char *buf, size_t buflen, struct proto_conf_kv kv[16])
{
    size_t n = 0;
    if (conf == NULL)
        return 0;
    snprintf(buf, buflen, "%s", conf);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && n < 16; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        *eq = '\0';
        kv[n].key = t;
        kv[n].value = eq + 1;
        n++;
    }
    return n;
}

static void join_ex(struct sim *s, int i, const char *node_id, struct joinopt o)
{
    struct proto_conf_kv kv[16];
    char buf[512];
    size_t n = parse_kv(o.conf, buf, sizeof(buf), kv);
    struct proto_msg m = {.type = PROTO_JOIN};
    m.join.node_id = node_id;
    m.join.nproc = o.nproc ? o.nproc : 1;
    m.join.min_nodes = o.min;
    m.join.max_nodes = o.max;
    m.join.master_port = o.port ? o.port : 29500 + i;
    m.join.conf = kv;
    m.join.nconf = n;
    m.join.local_addr = o.local_addr;
    m.join.hostname = o.hostname;
    rdzv_state_join(s->st, s->now, &s->peer[i], &m);
    collect(s);
}

static void join(struct sim *s, int i, const char *node_id, int min, int max, const char *conf)
{
    join_ex(s, i, node_id, (struct joinopt){.min = min, .max = max, .conf = conf});
}

static void drop(struct sim *s, int i)
{
    rdzv_state_disconnect(s->st, s->now, &s->peer[i]);
    s->connected[i] = false;
    collect(s);
}

/* Time passes; healthy (not frozen) agents keep beating meanwhile. */
static void tick(struct sim *s, uint64_t to)
{
    s->now = to;
    for (int i = 0; i < MAXP; i++) {
        if (s->connected[i] && !s->frozen[i])
            rdzv_state_heartbeat(s->st, s->now, &s->peer[i]);
    }
    rdzv_state_tick(s->st, s->now);
    collect(s);
}

static void beat(struct sim *s, int i)
{
    rdzv_state_heartbeat(s->st, s->now, &s->peer[i]);
    collect(s);
    assert_int_equal(s->nacts, 0);
}

static const struct rdzv_action *find(struct sim *s, int i, enum rdzv_action_kind kind)
{
    for (size_t k = 0; k < s->nacts; k++) {
        if (s->acts[k].peer == &s->peer[i] && s->acts[k].kind == kind)
            return &s->acts[k];
    }
    return NULL;
}

static size_t count(struct sim *s, enum rdzv_action_kind kind)
{
    size_t c = 0;
    for (size_t k = 0; k < s->nacts; k++)
        c += s->acts[k].kind == kind;
    return c;
}

static int rank_of(struct sim *s, int i)
{
    const struct rdzv_action *a = find(s, i, RDZV_ACT_ROUND);
    assert_non_null(a);
    return a->round.node_rank;
}

static struct rdzv_run_stats stats(struct sim *s, const char *run_id)
{
    struct rdzv_run_stats r;
    assert_int_equal(rdzv_state_run_stats(s->st, run_id, &r), 0);
    return r;
}

/* Every ROUND in the last call is one consistent round. */
static void check_round(struct sim *s, size_t nnodes)
{
    size_t n = 0;
    int seen[MAXP] = {0};
    int world = 0;
    const struct rdzv_action *first = NULL;
    for (size_t k = 0; k < s->nacts; k++) {
        const struct rdzv_action *a = &s->acts[k];
        if (a->kind != RDZV_ACT_ROUND)
            continue;
        if (first == NULL)
            first = a;
        n++;
        assert_int_equal(a->round.nnodes, (int)nnodes);
        assert_true(a->round.node_rank >= 0 && a->round.node_rank < (int)nnodes);
        assert_int_equal(seen[a->round.node_rank]++, 0);
        assert_int_equal(a->round.round, first->round.round);
        assert_int_equal(a->round.world_size, first->round.world_size);
        assert_string_equal(a->round.master_addr, first->round.master_addr);
        assert_int_equal(a->round.master_port, first->round.master_port);
        world += a->round.nproc;
    }
    assert_int_equal(n, nnodes);
    assert_int_equal(world, first->round.world_size);
    /* Offsets are prefix sums in rank order. */
    for (int r = 0, off = 0; r < (int)nnodes; r++) {
        for (size_t k = 0; k < s->nacts; k++) {
            const struct rdzv_action *a = &s->acts[k];
            if (a->kind == RDZV_ACT_ROUND && a->round.node_rank == r) {
                assert_int_equal(a->round.rank_offset, off);
                off += a->round.nproc;
            }
        }
    }
}

/* ---- rounds ---- */

static void test_round_min_max_equal(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    hello(s, 0, "job");
    hello(s, 1, "job");
    join(s, 0, "b_1_0", 2, 2, NULL);
    assert_int_equal(s->nacts, 1);
    const struct rdzv_action *a = find(s, 0, RDZV_ACT_JOINED);
    assert_non_null(a);
    assert_int_equal(a->joined.round, 1);
    assert_false(a->joined.waiting);
    assert_int_equal(stats(s, "job").participants, 1);
    assert_false(stats(s, "job").last_call_armed);

    join(s, 1, "a_2_0", 2, 2, NULL);
    check_round(s, 2);
    /* Ranks by node id (torch sorts its node descriptors). */
    assert_int_equal(rank_of(s, 1), 0);
    assert_int_equal(rank_of(s, 0), 1);
    a = find(s, 0, RDZV_ACT_ROUND);
    assert_string_equal(a->round.run_id, "job");
    assert_int_equal(a->round.round, 1);
    assert_string_equal(a->round.master_addr, "10.0.0.2");
    assert_int_equal(a->round.master_port, 29501);
    assert_int_equal(stats(s, "job").phase, RDZV_RUNNING);
    assert_int_equal(stats(s, "job").active, 2);
    sim_free(s);
}

static void test_round_nproc_offsets(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    int nproc[4] = {3, 1, 4, 2};
    const char *ids[4] = {"n0", "n1", "n2", "n3"};
    for (int i = 0; i < 4; i++) {
        hello(s, i, "job");
        join_ex(s, i, ids[i], (struct joinopt){.nproc = nproc[i], .min = 4, .max = 4});
    }
    check_round(s, 4);
    for (int i = 0; i < 4; i++) {
        const struct rdzv_action *a = find(s, i, RDZV_ACT_ROUND);
        assert_int_equal(a->round.nproc, nproc[i]);
        assert_int_equal(a->round.world_size, 10);
    }
    assert_int_equal(find(s, 2, RDZV_ACT_ROUND)->round.rank_offset, 4);
    assert_int_equal(find(s, 3, RDZV_ACT_ROUND)->round.rank_offset, 8);
    sim_free(s);
}

static void test_last_call(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    hello(s, 0, "job");
    hello(s, 1, "job");
    hello(s, 2, "job");
    join(s, 0, "a", 2, 4, "last_call_timeout=30");
    join(s, 1, "b", 2, 4, NULL);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    assert_true(stats(s, "job").last_call_armed);
    tick(s, 1000 + 29999);
    assert_int_equal(s->nacts, 0);
    /* A third node within last call is in the round. */
    join(s, 2, "c", 2, 4, NULL);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    tick(s, 1000 + 30000);
    check_round(s, 3);
    sim_free(s);

    /* last_call_timeout=0: the round completes as soon as min nodes are in. */
    s = sim_new(false);
    hello(s, 0, "job");
    hello(s, 1, "job");
    join(s, 0, "a", 1, 4, "last_call_timeout=0");
    check_round(s, 1);
    sim_free(s);
}

static void test_max_completes_at_once(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 3; i++)
        hello(s, i, "job");
    join(s, 0, "a", 1, 3, NULL);
    join(s, 1, "b", 1, 3, NULL);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    join(s, 2, "c", 1, 3, NULL);
    check_round(s, 3);
    /* No leftover last-call timer fires a second round. */
    tick(s, s->now + 60000);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    sim_free(s);
}

static void test_below_min_falls_back(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 3; i++)
        hello(s, i, "job");
    join(s, 0, "a", 2, 3, NULL);
    join(s, 1, "b", 2, 3, NULL);
    assert_true(stats(s, "job").last_call_armed);
    /* A participant going away below min disarms last call (torch: deadline=None). */
    drop(s, 1);
    assert_false(stats(s, "job").last_call_armed);
    tick(s, s->now + 31000);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    join(s, 2, "c", 2, 3, NULL);
    assert_true(stats(s, "job").last_call_armed);
    tick(s, s->now + 30000);
    check_round(s, 2);
    sim_free(s);
}

static void test_join_timeout(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    hello(s, 0, "job");
    join(s, 0, "a", 2, 2, "join_timeout=10");
    tick(s, s->now + 9999);
    assert_int_equal(s->nacts, 0);
    tick(s, s->now + 1);
    const struct rdzv_action *a = find(s, 0, RDZV_ACT_ERROR);
    assert_non_null(a);
    assert_int_equal(a->error.code, CDDP_ETIMEOUT);
    assert_false(a->error.drop);
    assert_non_null(strstr(a->error.message, "join_timeout=10.0 s"));
    assert_non_null(strstr(a->error.message, "min_nodes=2"));
    assert_int_equal(stats(s, "job").participants, 0);
    assert_int_equal(stats(s, "job").nodes, 0);
    /* It may join again. */
    hello(s, 1, "job");
    join(s, 0, "a", 2, 2, NULL);
    join(s, 1, "b", 2, 2, NULL);
    check_round(s, 2);
    sim_free(s);
}

/* Three nodes in a round; returns with the round running. */
static struct sim *running3(const char *conf, int min, int max)
{
    struct sim *s = sim_new(false);
    const char *ids[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        hello(s, i, "job");
        join(s, i, ids[i], min, max, conf);
    }
    if (count(s, RDZV_ACT_ROUND) == 0)
        tick(s, s->now + 30000);
    check_round(s, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rank_of(s, i), i);
    return s;
}

static void test_disconnect_restarts_survivors(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 2, 3);
    drop(s, 1);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    for (int i = 0; i < 3; i += 2) {
        const struct rdzv_action *a = find(s, i, RDZV_ACT_RESTART);
        assert_non_null(a);
        assert_int_equal(a->restart.round, 2);
        assert_string_equal(a->restart.reason, "node_lost");
        assert_string_equal(a->restart.node_id, "b");
        assert_false(a->restart.counted);
    }
    assert_int_equal(stats(s, "job").restarting, 2);
    join(s, 0, "a", 2, 3, NULL);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    const struct rdzv_action *j = find(s, 0, RDZV_ACT_JOINED);
    assert_int_equal(j->joined.round, 2);
    /* The last expected survivor completes the round at once (no last call). */
    join(s, 2, "c", 2, 3, NULL);
    check_round(s, 2);
    assert_int_equal(rank_of(s, 0), 0);
    assert_int_equal(rank_of(s, 2), 1); /* rank 2 >= 2 nodes: fills the hole */
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.round, 2);
    sim_free(s);
}

static void test_rank0_lost_ranks_stable(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 1, 3);
    drop(s, 0);
    join(s, 1, "b", 1, 3, NULL);
    join(s, 2, "c", 1, 3, NULL);
    check_round(s, 2);
    assert_int_equal(rank_of(s, 1), 1); /* keeps its rank */
    assert_int_equal(rank_of(s, 2), 0); /* fills rank 0 */
    assert_string_equal(find(s, 1, RDZV_ACT_ROUND)->round.master_addr, "10.0.0.3");
    sim_free(s);
}

static void test_heartbeat_timeout(void **state)
{
    (void)state;
    struct sim *s = running3("keep_alive_interval=1,keep_alive_max_attempt=3", 2, 3);
    uint64_t t0 = s->now;
    s->frozen[1] = true;
    /* Nodes that beat live on; a frozen one is removed after 3 s. */
    for (int k = 1; k <= 10; k++) {
        s->now = t0 + (uint64_t)k * 1000 - 500;
        beat(s, 0);
        beat(s, 2);
        tick(s, t0 + (uint64_t)k * 1000);
        if (k < 3) {
            assert_int_equal(s->nacts, 0);
            continue;
        }
        if (k == 3) {
            const struct rdzv_action *e = find(s, 1, RDZV_ACT_ERROR);
            assert_non_null(e);
            assert_true(e->error.drop);
            assert_int_equal(e->error.code, CDDP_ETIMEOUT);
            assert_non_null(strstr(e->error.message, "no heartbeat"));
            assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
            assert_string_equal(find(s, 0, RDZV_ACT_RESTART)->restart.reason, "heartbeat_timeout");
            /* The shell closes the connection it was told to drop. */
            drop(s, 1);
            assert_int_equal(s->nacts, 0);
            join(s, 0, "a", 2, 3, NULL);
            join(s, 2, "c", 2, 3, NULL);
            check_round(s, 2);
            continue;
        }
        assert_int_equal(s->nacts, 0);
    }
    sim_free(s);
}

static void beat_perf(struct sim *s, int i, double step_s, double compute_s, int max_rank)
{
    struct proto_perf p = {
        .ranks = 2, .step_s = step_s, .compute_s = compute_s, .max_rank = max_rank, .factor = 1.5};
    rdzv_state_heartbeat_perf(s->st, s->now, &s->peer[i], step_s > 0 ? &p : NULL);
    collect(s);
}

struct perf_seen {
    bool slow[3];
    double median_s;
    bool compute;
};

static void perf_run(void *arg, const struct rdzv_run_info *r)
{
    struct perf_seen *p = arg;
    p->median_s = r->step_median_s;
    p->compute = r->step_compute;
}

static void perf_node(void *arg, const struct rdzv_node_info *n)
{
    struct perf_seen *p = arg;
    p->slow[n->node_id[0] - 'a'] = n->slow;
}

static struct perf_seen perf_seen(struct sim *s)
{
    struct perf_seen p = {0};
    rdzv_state_visit(s->st, 0, perf_run, perf_node, &p);
    return p;
}

/* Heartbeats carry the agents' summaries; once a second the active nodes
 * are judged: one whose median is factor times the job's is a straggler
 * (an action for the log, each way), and a new round forgets it. */
static void test_stragglers(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 2, 3);
    beat_perf(s, 0, 0.10, 0.08, 1);
    assert_int_equal(count(s, RDZV_ACT_STRAGGLER), 0);
    assert_true(perf_seen(s).median_s == 0); /* one node measured: no median */
    s->now += 500;
    beat_perf(s, 1, 0.30, 0.28, 3);
    beat_perf(s, 2, 0.30, 0.09, 5);                    /* slow in step time, not in compute */
    assert_int_equal(count(s, RDZV_ACT_STRAGGLER), 0); /* judged at most once a second */
    s->now += 500;
    beat_perf(s, 0, 0.10, 0.08, 1);
    assert_int_equal(s->nacts, 1);
    const struct rdzv_action *a = find(s, 1, RDZV_ACT_STRAGGLER);
    assert_non_null(a);
    assert_true(a->straggler.slow && a->straggler.compute);
    assert_string_equal(a->straggler.node_id, "b");
    assert_string_equal(a->straggler.run_id, "job");
    assert_true(a->straggler.time_s == 0.28 && a->straggler.median_s == 0.09);
    assert_int_equal(a->straggler.max_rank, 3);
    struct perf_seen p = perf_seen(s);
    assert_true(p.slow[1] && !p.slow[0] && !p.slow[2]);
    assert_true(p.compute && p.median_s == 0.09);
    /* A node without compute times: the job is judged by step time. */
    s->now += 1000;
    struct proto_perf no_compute = {
        .ranks = 1, .step_s = 0.1, .compute_s = -1, .max_rank = 0, .factor = 2.5};
    rdzv_state_heartbeat_perf(s->st, s->now, &s->peer[0], &no_compute);
    collect(s);
    p = perf_seen(s);
    assert_false(p.compute);
    assert_true(p.median_s == 0.30);
    /* The largest factor sent (2.5): b at x1 of the median is cleared. */
    assert_non_null(find(s, 1, RDZV_ACT_STRAGGLER));
    assert_false(find(s, 1, RDZV_ACT_STRAGGLER)->straggler.slow);
    /* A heartbeat without perf takes the node out of the judgement: b and
     * c both have compute times again, and b is named again. */
    s->now += 1000;
    beat_perf(s, 0, 0, 0, 0);
    p = perf_seen(s);
    assert_true(p.compute && p.median_s == 0.09);
    assert_true(find(s, 1, RDZV_ACT_STRAGGLER)->straggler.slow);
    /* A new round: every summary and name forgotten. */
    drop(s, 2);
    join(s, 0, "a", 2, 3, NULL);
    join(s, 1, "b", 2, 3, NULL);
    check_round(s, 2);
    p = perf_seen(s);
    assert_false(p.slow[0] || p.slow[1]);
    s->now += 1000;
    beat_perf(s, 0, 0.10, 0.08, 1);
    assert_int_equal(count(s, RDZV_ACT_STRAGGLER), 0);
    assert_true(perf_seen(s).median_s == 0);
    sim_free(s);
}

static void test_waiting_node_scale_up(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 3; i++)
        hello(s, i, "job");
    join(s, 0, "a", 2, 3, NULL);
    join(s, 1, "b", 2, 3, NULL);
    tick(s, s->now + 30000);
    check_round(s, 2);
    /* A late node below max: the members restart (not counted) to admit it. */
    join(s, 2, "0late", 2, 3, NULL);
    const struct rdzv_action *j = find(s, 2, RDZV_ACT_JOINED);
    assert_non_null(j);
    assert_false(j->joined.waiting);
    assert_int_equal(j->joined.round, 2);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    assert_string_equal(find(s, 0, RDZV_ACT_RESTART)->restart.reason, "node_joined");
    assert_false(find(s, 0, RDZV_ACT_RESTART)->restart.counted);
    join(s, 0, "a", 2, 3, NULL);
    join(s, 1, "b", 2, 3, NULL);
    check_round(s, 3);
    assert_int_equal(rank_of(s, 0), 0);
    assert_int_equal(rank_of(s, 1), 1);
    assert_int_equal(rank_of(s, 2), 2); /* newcomer after survivors, whatever its id */
    sim_free(s);
}

static void test_waiting_at_max(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 3; i++)
        hello(s, i, "job");
    join(s, 0, "a", 1, 2, NULL);
    join(s, 1, "b", 1, 2, NULL);
    check_round(s, 2);
    join(s, 2, "c", 1, 2, NULL);
    const struct rdzv_action *j = find(s, 2, RDZV_ACT_JOINED);
    assert_true(j->joined.waiting);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 0);
    assert_int_equal(stats(s, "job").waiting, 1);
    /* It waits without a deadline (torch's redundancy list). */
    tick(s, s->now + 3600 * 1000);
    assert_int_equal(count(s, RDZV_ACT_ERROR), 0);
    beat(s, 0);
    beat(s, 1);
    beat(s, 2);
    /* Joining again just says where it stands. */
    join(s, 2, "c", 1, 2, NULL);
    assert_true(find(s, 2, RDZV_ACT_JOINED)->joined.waiting);
    /* A member leaves: the waiting node takes its place. */
    rdzv_state_leave(s->st, s->now, &s->peer[0], "done", false);
    collect(s);
    assert_non_null(find(s, 1, RDZV_ACT_RESTART));
    assert_string_equal(find(s, 1, RDZV_ACT_RESTART)->restart.reason, "node_left");
    j = find(s, 2, RDZV_ACT_JOINED);
    assert_non_null(j);
    assert_false(j->joined.waiting);
    assert_int_equal(j->joined.round, 2);
    assert_int_equal(count(s, RDZV_ACT_ERROR), 0); /* leave does not drop */
    join(s, 1, "b", 1, 2, NULL);
    check_round(s, 2);
    assert_int_equal(rank_of(s, 1), 1);
    assert_int_equal(rank_of(s, 2), 0);
    /* The node that left may join again: it waits (at max). */
    join(s, 0, "a", 1, 2, NULL);
    assert_true(find(s, 0, RDZV_ACT_JOINED)->joined.waiting);
    sim_free(s);
}

/* Two nodes of 2 workers and a spare on the wait list: a round that only
 * puts the spare in a lost member's place goes on in place (generation,
 * the spare's global ranks); any other round starts a new group. */
static void join2(struct sim *s, int i, const char *id, int min)
{
    join_ex(s, i, id, (struct joinopt){.nproc = 2, .min = min, .max = 2, .port = 29500});
}

static void test_spare_in_place(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 5; i++)
        hello(s, i, "job");
    join2(s, 0, "a", 2);
    join2(s, 1, "b", 2);
    check_round(s, 2);
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.generation, 0);
    assert_null(find(s, 0, RDZV_ACT_ROUND)->round.replaced);
    join2(s, 2, "c", 2);
    assert_true(find(s, 2, RDZV_ACT_JOINED)->joined.waiting);
    /* b is lost: c takes its place, a keeps rank 0 and its offset. */
    drop(s, 1);
    assert_false(find(s, 0, RDZV_ACT_RESTART)->restart.counted);
    join2(s, 0, "a", 2);
    check_round(s, 2);
    assert_int_equal(rank_of(s, 0), 0);
    assert_int_equal(rank_of(s, 2), 1);
    for (int i = 0; i < 3; i += 2) {
        const struct rdzv_action *a = find(s, i, RDZV_ACT_ROUND);
        assert_int_equal(a->round.generation, 1);
        assert_string_equal(a->round.replaced, "2,3");
    }
    /* Again, with another spare: generation 2. */
    join2(s, 3, "d", 2);
    drop(s, 2);
    join2(s, 0, "a", 2);
    check_round(s, 2);
    assert_int_equal(rank_of(s, 3), 1);
    assert_int_equal(find(s, 3, RDZV_ACT_ROUND)->round.generation, 2);
    assert_string_equal(find(s, 3, RDZV_ACT_ROUND)->round.replaced, "2,3");
    /* A counted failure starts a new group: generation 0. */
    rdzv_state_failure(s->st, s->now, &s->peer[3], find(s, 3, RDZV_ACT_ROUND)->round.round,
                       "exit 1");
    collect(s);
    join2(s, 0, "a", 2);
    join2(s, 3, "d", 2);
    check_round(s, 2);
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.generation, 0);
    /* Node 0 lost (the store's host): a new group, whoever fills in. */
    join2(s, 4, "e", 2);
    drop(s, 0);
    join2(s, 3, "d", 2);
    check_round(s, 2);
    assert_int_equal(rank_of(s, 3), 1);
    assert_int_equal(find(s, 3, RDZV_ACT_ROUND)->round.generation, 0);
    sim_free(s);
}

static void replace(struct sim *s, int i, uint64_t round, int rank)
{
    struct proto_msg m = {.type = PROTO_REPLACE};
    m.replace.round = round;
    m.replace.rank = rank;
    rdzv_state_replace(s->st, s->now, &s->peer[i], &m);
    collect(s);
}

/* A worker restarted alone (replace) takes the run's next generation, to
 * every member; a node replaced in place later goes on from it, so the
 * workers' generations are one sequence. Refused: to the asker alone. */
static void test_replace_then_spare_in_place(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 3; i++)
        hello(s, i, "job");
    join2(s, 0, "a", 2);
    join2(s, 1, "b", 2);
    check_round(s, 2);
    uint64_t round = find(s, 0, RDZV_ACT_ROUND)->round.round;
    join2(s, 2, "c", 2); /* the spare */
    replace(s, 1, round, 3);
    for (int i = 0; i < 2; i++) {
        const struct rdzv_action *a = find(s, i, RDZV_ACT_GENERATION);
        assert_non_null(a);
        assert_int_equal(a->generation.generation, 1);
        assert_string_equal(a->generation.replaced, "3");
        assert_string_equal(a->generation.node_id, "b");
    }
    assert_null(find(s, 2, RDZV_ACT_GENERATION)); /* the spare is not a member */
    assert_null(find(s, 0, RDZV_ACT_RESTART));
    /* within the settle window: refused, to b alone */
    tick(s, s->now + 500);
    replace(s, 0, round, 1);
    assert_int_equal(s->nacts, 1);
    assert_int_equal(find(s, 0, RDZV_ACT_GENERATION)->generation.generation, 0);
    /* past it, but a rank not its own, or a round not running: refused */
    tick(s, s->now + RDZV_REPLACE_SETTLE_MS);
    replace(s, 0, round, 2);
    assert_int_equal(find(s, 0, RDZV_ACT_GENERATION)->generation.generation, 0);
    replace(s, 0, round + 1, 1);
    assert_int_equal(find(s, 0, RDZV_ACT_GENERATION)->generation.generation, 0);
    replace(s, 2, round, 1); /* the spare */
    assert_int_equal(find(s, 2, RDZV_ACT_GENERATION)->generation.generation, 0);
    /* b is lost; the spare takes its place in place: generation 2 */
    drop(s, 1);
    join2(s, 0, "a", 2);
    check_round(s, 2);
    assert_int_equal(find(s, 2, RDZV_ACT_ROUND)->round.generation, 2);
    assert_string_equal(find(s, 2, RDZV_ACT_ROUND)->round.replaced, "2,3");
    /* a blame goes to the rank's node only */
    round = find(s, 2, RDZV_ACT_ROUND)->round.round;
    struct proto_msg m = {.type = PROTO_BLAME};
    m.blame.round = round;
    m.blame.rank = 2;
    m.blame.generation = 2;
    rdzv_state_blame(s->st, s->now, &s->peer[0], &m);
    collect(s);
    assert_int_equal(s->nacts, 1);
    assert_int_equal(find(s, 2, RDZV_ACT_BLAME)->blame.rank, 2);
    assert_string_equal(find(s, 2, RDZV_ACT_BLAME)->blame.node_id, "a");
    m.blame.rank = 1; /* its own */
    rdzv_state_blame(s->st, s->now, &s->peer[0], &m);
    collect(s);
    assert_int_equal(s->nacts, 0);
    sim_free(s);
}

static void replace_ranks(struct sim *s, int i, uint64_t round, int rank, const char *ranks)
{
    struct proto_msg m = {.type = PROTO_REPLACE};
    m.replace.round = round;
    m.replace.rank = rank;
    m.replace.ranks = ranks;
    rdzv_state_replace(s->st, s->now, &s->peer[i], &m);
    collect(s);
}

/* A node's hung ranks in one replace (ranks): one generation names them
 * all, one counted restart; ranks not the node's, out of order, not
 * beginning with rank, or not a list: refused, naming what was wrong. */
static void test_replace_several_ranks(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 2; i++)
        hello(s, i, "job");
    join2(s, 0, "a", 2);
    join2(s, 1, "b", 2); /* ranks 2 and 3 */
    check_round(s, 2);
    uint64_t round = find(s, 0, RDZV_ACT_ROUND)->round.round;
    static const struct {
        int rank;
        const char *ranks, *why;
    } bad[] = {
        {2, "2,4", "rank 4 is not one of this node's (2..3)"},
        {2, "1,2", "rank 1 is not one of this node's (2..3)"},
        {2, "2,3,3", "ranks '2,3,3' is not in ascending order"},
        {2, "3,2", "ranks '3,2' does not begin with rank 2"},
        {3, "2,3", "ranks '2,3' does not begin with rank 3"},
        {2, "2,,3", "ranks '2,,3' is not a list of decimal ranks"},
        {2, "2,x", "ranks '2,x' is not a list of decimal ranks"},
        {2, "2,99999999999999999999", "is not a list of decimal ranks"},
        {2, "", "ranks '' is not a list of decimal ranks"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        replace_ranks(s, 1, round, bad[k].rank, bad[k].ranks);
        assert_int_equal(s->nacts, 1);
        const struct rdzv_action *a = find(s, 1, RDZV_ACT_GENERATION);
        assert_int_equal(a->generation.generation, 0);
        if (strstr(a->generation.refused, bad[k].why) == NULL)
            fail_msg("%s: refused '%s', want '%s'", bad[k].ranks, a->generation.refused,
                     bad[k].why);
    }
    replace_ranks(s, 1, round, 2, "2,3");
    for (int i = 0; i < 2; i++) {
        const struct rdzv_action *a = find(s, i, RDZV_ACT_GENERATION);
        assert_int_equal(a->generation.generation, 1);
        assert_string_equal(a->generation.replaced, "2,3");
        assert_string_equal(a->generation.node_id, "b");
        assert_int_equal(a->generation.restart_count, 1);
    }
    sim_free(s);
}

/* No spare and min_nodes 1: the world shrinks, a new group. */
static void test_no_spare_not_in_place(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    for (int i = 0; i < 2; i++)
        hello(s, i, "job");
    join2(s, 0, "a", 1);
    join2(s, 1, "b", 1);
    check_round(s, 2);
    drop(s, 1);
    join2(s, 0, "a", 1);
    check_round(s, 1);
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.generation, 0);
    assert_null(find(s, 0, RDZV_ACT_ROUND)->round.replaced);
    sim_free(s);
}

static void test_no_restart_livelock_with_zero_last_call(void **state)
{
    (void)state;
    /* min 2, max 4, last_call_timeout=0, three running: a fourth joins.
     * The next round must wait for all three members stopping their
     * workers; completing at min would leave one out, and its join would
     * restart the round again, and so on. */
    const char *c0 = "last_call_timeout=0";
    struct sim *s = sim_new(false);
    for (int i = 0; i < 3; i++)
        hello(s, i, "job");
    join(s, 0, "a", 2, 4, c0);
    join(s, 1, "b", 2, 4, c0);
    check_round(s, 2); /* min is enough at once with last_call_timeout=0 */
    join(s, 2, "c", 2, 4, c0);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    join(s, 0, "a", 2, 4, c0);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0); /* b is expected back */
    join(s, 1, "b", 2, 4, c0);
    check_round(s, 3);
    hello(s, 3, "job");
    join(s, 3, "d", 2, 4, "last_call_timeout=0");
    assert_int_equal(count(s, RDZV_ACT_RESTART), 3);
    join(s, 0, "a", 2, 4, "last_call_timeout=0");
    join(s, 1, "b", 2, 4, "last_call_timeout=0");
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0); /* c is still expected */
    join(s, 2, "c", 2, 4, "last_call_timeout=0");
    check_round(s, 4);
    assert_int_equal(stats(s, "job").restarting, 0);
    /* A member that dies instead of rejoining is not waited for. */
    drop(s, 3);
    join(s, 0, "a", 2, 4, "last_call_timeout=0");
    join(s, 1, "b", 2, 4, "last_call_timeout=0");
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    drop(s, 2);
    check_round(s, 2);
    sim_free(s);
}

static void test_finished_leave_is_quiet(void **state)
{
    (void)state;
    /* A node whose workers succeeded leaves (its exit barrier timed out):
     * the others go on, nobody restarts; torch only prunes it. */
    struct sim *s = running3(NULL, 2, 3);
    rdzv_state_leave(s->st, s->now, &s->peer[2], "exit barrier timed out", true);
    collect(s);
    assert_int_equal(s->nacts, 0);
    assert_int_equal(stats(s, "job").phase, RDZV_RUNNING);
    assert_int_equal(stats(s, "job").active, 2);
    /* Its connection going later changes nothing either. */
    drop(s, 2);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 0);
    /* A failure afterwards restarts the two that are left. */
    rdzv_state_failure(s->st, s->now, &s->peer[0], stats(s, "job").round, "exit 1");
    collect(s);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    join(s, 0, "a", 2, 3, NULL);
    join(s, 1, "b", 2, 3, NULL);
    check_round(s, 2);
    sim_free(s);

    /* While a round forms after a restart, a finished member is no longer
     * expected: the others complete the round without it. */
    s = running3("last_call_timeout=600", 2, 3);
    rdzv_state_failure(s->st, s->now, &s->peer[0], stats(s, "job").round, "exit 1");
    collect(s);
    join(s, 0, "a", 2, 3, NULL);
    join(s, 1, "b", 2, 3, NULL);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0); /* c is expected */
    rdzv_state_leave(s->st, s->now, &s->peer[2], NULL, true);
    collect(s);
    check_round(s, 2);
    sim_free(s);

    /* Once every member has left finished, the job is done: the run closes
     * and a node on the wait list hears so (it was held for ever). */
    s = running3(NULL, 2, 3);
    hello(s, 3, "job");
    join(s, 3, "d", 2, 3, NULL);
    assert_int_equal(stats(s, "job").waiting, 1);
    for (int i = 0; i < 2; i++) {
        rdzv_state_leave(s->st, s->now, &s->peer[i], NULL, true);
        collect(s);
        assert_int_equal(s->nacts, 0);
    }
    rdzv_state_leave(s->st, s->now, &s->peer[2], NULL, true);
    collect(s);
    const struct rdzv_action *a = find(s, 3, RDZV_ACT_CLOSED);
    assert_non_null(a);
    assert_string_equal(a->closed.reason, "the job finished: every node of round 1 finished");
    assert_int_equal(stats(s, "job").phase, RDZV_CLOSED);
    sim_free(s);
}

/* ---- heartbeat acknowledgements, resume, a restarted server ---- */

static void resume(struct sim *s, int i, uint64_t id, const char *node_id, uint64_t round)
{
    struct proto_msg m = {.type = PROTO_RESUME, .id = id};
    m.resume.node_id = node_id;
    m.resume.round = round;
    rdzv_state_resume(s->st, s->now, &s->peer[i], &m);
    collect(s);
}

static int result_code(struct sim *s, int i, uint64_t id)
{
    const struct rdzv_action *a = find(s, i, RDZV_ACT_RESULT);
    assert_non_null(a);
    assert_int_equal(a->result.id, id);
    return a->result.code;
}

static void test_heartbeat_ack(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 2, 3);
    /* Only a peer that asked gets an answer: the run's wait list length. */
    beat(s, 1);
    s->peer[0].heartbeat_ack = true;
    rdzv_state_heartbeat(s->st, s->now, &s->peer[0]);
    collect(s);
    assert_int_equal(s->nacts, 1);
    const struct rdzv_action *a = find(s, 0, RDZV_ACT_HEARTBEAT);
    assert_non_null(a);
    assert_int_equal(a->heartbeat.waiting, 0);
    /* The round is at max: a fourth node waits, and the answer says so. */
    hello(s, 3, "job");
    join(s, 3, "d", 2, 3, NULL);
    assert_true(find(s, 3, RDZV_ACT_JOINED)->joined.waiting);
    rdzv_state_heartbeat(s->st, s->now, &s->peer[0]);
    collect(s);
    assert_int_equal(find(s, 0, RDZV_ACT_HEARTBEAT)->heartbeat.waiting, 1);
    /* A peer that said hello but never joined is answered too (its run's). */
    hello(s, 4, "job");
    s->peer[4].heartbeat_ack = true;
    rdzv_state_heartbeat(s->st, s->now, &s->peer[4]);
    collect(s);
    assert_int_equal(find(s, 4, RDZV_ACT_HEARTBEAT)->heartbeat.waiting, 1);
    /* The waiting node takes the place a lost one frees: none waits now. */
    drop(s, 2);
    join(s, 0, "a", 2, 3, NULL);
    join(s, 1, "b", 2, 3, NULL); /* d was moved into the round when c went */
    check_round(s, 3);
    rdzv_state_heartbeat(s->st, s->now, &s->peer[0]);
    collect(s);
    assert_int_equal(find(s, 0, RDZV_ACT_HEARTBEAT)->heartbeat.waiting, 0);
    sim_free(s);
}

static void test_resume(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 2, 3);
    uint64_t round = stats(s, "job").round;
    /* Node b's agent lost its connection (the server did not notice): on a
     * new connection it goes on in the same round, and nothing else happens. */
    hello(s, 5, "job");
    resume(s, 5, 7, "b", round);
    assert_int_equal(result_code(s, 5, 7), 0);
    const struct rdzv_action *old = find(s, 1, RDZV_ACT_ERROR);
    assert_non_null(old);
    assert_int_equal(old->error.code, CDDP_EEXISTS);
    assert_true(old->error.drop);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 0);
    /* The old connection closing costs nothing: b lives on the new one. */
    drop(s, 1);
    assert_int_equal(s->nacts, 0);
    assert_int_equal(stats(s, "job").phase, RDZV_RUNNING);
    assert_int_equal(stats(s, "job").active, 3);
    /* Asking again on the same connection is harmless. */
    resume(s, 5, 8, "b", round);
    assert_int_equal(result_code(s, 5, 8), 0);
    assert_int_equal(s->nacts, 1);
    /* Its heartbeats keep it alive there (the old peer's would not). */
    tick(s, s->now + 60000);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 0);
    /* A failure reported on the new connection is b's. */
    rdzv_state_failure(s->st, s->now, &s->peer[5], round, "exit 1");
    collect(s);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 3);
    assert_true(find(s, 5, RDZV_ACT_RESTART)->restart.counted);

    /* Not resumable: nothing changes, the result says why. */
    hello(s, 6, "job");
    resume(s, 6, 1, "a", round); /* the run moved on: a restarts */
    assert_int_equal(result_code(s, 6, 1), CDDP_ESTATE);
    assert_int_equal(s->nacts, 1);
    resume(s, 6, 2, "zz", round + 1); /* no such node */
    assert_int_equal(result_code(s, 6, 2), CDDP_ESTATE);
    join(s, 0, "a", 2, 3, NULL);
    join(s, 2, "c", 2, 3, NULL);
    join(s, 5, "b", 2, 3, NULL);
    check_round(s, 3);
    round = stats(s, "job").round;
    resume(s, 6, 3, "a", round - 1); /* an old round */
    assert_int_equal(result_code(s, 6, 3), CDDP_ESTATE);
    resume(s, 5, 4, "a", round); /* this connection is b's */
    assert_int_equal(result_code(s, 5, 4), CDDP_ESTATE);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 0);
    drop(s, 0); /* a is lost for real: the others restart */
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    resume(s, 6, 5, "a", round);
    assert_int_equal(result_code(s, 6, 5), CDDP_ESTATE);
    assert_non_null(strstr(find(s, 6, RDZV_ACT_RESULT)->result.message, "no node 'a'"));
    /* A closed run says so. */
    rdzv_state_close(s->st, s->now, &s->peer[2], "done");
    collect(s);
    resume(s, 6, 6, "c", round);
    assert_int_equal(result_code(s, 6, 6), CDDP_ECLOSED);
    sim_free(s);

    /* A plain store runs no rendezvous. */
    s = sim_new(true);
    hello(s, 0, "");
    resume(s, 0, 1, "a", 1);
    assert_int_equal(find(s, 0, RDZV_ACT_ERROR)->error.code, CDDP_ESTATE);
    drop(s, 0);
    sim_free(s);
}

static void join_back(struct sim *s, int i, const char *id, uint64_t round, int nnodes,
                      int64_t restarts)
{
    struct proto_msg m = {.type = PROTO_JOIN};
    m.join.node_id = id;
    m.join.nproc = 2;
    m.join.min_nodes = 1;
    m.join.max_nodes = 4;
    m.join.round = round;
    m.join.last_nnodes = nnodes;
    m.join.restart_count = restarts;
    rdzv_state_join(s->st, s->now, &s->peer[i], &m);
    collect(s);
}

static void test_restarted_server_goes_on(void **state)
{
    (void)state;
    /* A fresh run (the server restarted) hears from nodes that ran round 5
     * of 3 nodes after 2 counted restarts: the next round is 6, the count
     * stays 2, and the round completes when the 3 are back (last call is
     * 30 s), not before. */
    struct sim *s = sim_new(false);
    for (int i = 0; i < 4; i++)
        hello(s, i, "job");
    join_back(s, 0, "a", 5, 3, 2);
    assert_int_equal(find(s, 0, RDZV_ACT_JOINED)->joined.round, 6);
    join_back(s, 1, "b", 4, 3, 1); /* older news changes nothing */
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    join_back(s, 2, "c", 5, 3, 2);
    check_round(s, 3);
    const struct rdzv_action *a = find(s, 0, RDZV_ACT_ROUND);
    assert_int_equal(a->round.round, 6);
    assert_int_equal(a->round.restart_count, 2);
    /* Once the run has had a round, joins no longer move it. */
    join_back(s, 3, "d", 40, 9, 9);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 3);
    assert_int_equal(stats(s, "job").round, 7);
    for (int i = 0; i < 3; i++)
        join_back(s, i, (const char *[]){"a", "b", "c"}[i], 6, 3, 2);
    check_round(s, 4);
    assert_int_equal(find(s, 3, RDZV_ACT_ROUND)->round.round, 7);
    assert_int_equal(find(s, 3, RDZV_ACT_ROUND)->round.restart_count, 2);
    sim_free(s);

    /* Fewer come back than there were: last call completes the round. */
    s = sim_new(false);
    hello(s, 0, "job");
    join_back(s, 0, "a", 2, 2, 0);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    tick(s, s->now + 30000);
    check_round(s, 1);
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.round, 3);
    sim_free(s);
}

/* ---- a restarted server rebuilds the running round from resumes ---- */

struct member {
    const char *id;
    uint64_t round;
    int rank, nnodes, nproc, min, max;
    int64_t restarts;
    const char *master; /* NULL: "10.0.0.1" */
    const char *conf;   /* "k=v,k=v" or NULL */
};

/* Node m.id on peer i re-registers its round m.round (every node has nproc
 * 2 unless told, rank offsets follow). */
static void resume_member(struct sim *s, int i, uint64_t id, struct member m)
{
    struct proto_conf_kv kv[16];
    char buf[256];
    size_t n = parse_kv(m.conf, buf, sizeof(buf), kv);
    int nproc = m.nproc ? m.nproc : 2;
    struct proto_msg msg = {.type = PROTO_RESUME, .id = id};
    msg.resume.node_id = m.id;
    msg.resume.round = m.round;
    msg.resume.rebuild = true;
    msg.resume.join = (struct proto_join){.node_id = m.id,
                                          .nproc = nproc,
                                          .min_nodes = m.min ? m.min : 1,
                                          .max_nodes = m.max ? m.max : 4,
                                          .master_port = 29500 + i,
                                          .round = m.round,
                                          .last_nnodes = m.nnodes,
                                          .restart_count = m.restarts,
                                          .conf = kv,
                                          .nconf = n};
    msg.resume.member = (struct proto_round){.run_id = "job",
                                             .round = m.round,
                                             .node_rank = m.rank,
                                             .nnodes = m.nnodes,
                                             .world_size = 2 * m.nnodes,
                                             .rank_offset = 2 * m.rank,
                                             .nproc = nproc,
                                             .master_addr = m.master ? m.master : "10.0.0.1",
                                             .master_port = 29500,
                                             .restart_count = m.restarts};
    rdzv_state_resume(s->st, s->now, &s->peer[i], &msg);
    collect(s);
}

static const char *const ids3[3] = {"a", "b", "c"};

/* The three nodes of round 5 (2 counted restarts) on a restarted server,
 * connected as peers 0..2; the first `back` of them re-registered. */
static struct sim *rebuilt(int back, const char *conf)
{
    struct sim *s = sim_new(false);
    for (int i = 0; i < 3; i++)
        hello(s, i, "job");
    for (int i = 0; i < back; i++) {
        resume_member(
            s, i, 10 + (uint64_t)i,
            (struct member){
                .id = ids3[i], .round = 5, .rank = i, .nnodes = 3, .restarts = 2, .conf = conf});
        assert_int_equal(result_code(s, i, 10 + (uint64_t)i), 0);
        assert_int_equal(s->nacts, 1); /* the OK, nothing else */
    }
    return s;
}

static void test_rebuild_every_member_back(void **state)
{
    (void)state;
    struct sim *s = rebuilt(2, NULL);
    assert_true(stats(s, "job").rebuilding);
    assert_int_equal(stats(s, "job").phase, RDZV_RUNNING);
    assert_int_equal(stats(s, "job").round, 5);
    /* The last one is back before resume_timeout (the keep-alive window,
     * 15 s): the round runs on, no worker restarts, ever. */
    tick(s, s->now + 14000);
    assert_int_equal(s->nacts, 0);
    resume_member(s, 2, 12,
                  (struct member){.id = "c", .round = 5, .rank = 2, .nnodes = 3, .restarts = 2});
    assert_int_equal(result_code(s, 2, 12), 0);
    assert_int_equal(s->nacts, 1);
    struct rdzv_run_stats r = stats(s, "job");
    assert_false(r.rebuilding);
    assert_int_equal(r.active, 3);
    assert_int_equal(r.round, 5);
    tick(s, s->now + 60000);
    assert_int_equal(s->nacts, 0);
    /* It is a round like any other: a failure restarts everyone, counted
     * on from the restart count the nodes brought back; ranks are kept. */
    rdzv_state_failure(s->st, s->now, &s->peer[1], 5, "exit 1");
    collect(s);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 3);
    assert_int_equal(find(s, 0, RDZV_ACT_RESTART)->restart.restart_count, 3);
    assert_int_equal(find(s, 0, RDZV_ACT_RESTART)->restart.round, 6);
    for (int i = 2; i >= 0; i--)
        join(s, i, ids3[i], 1, 4, NULL);
    check_round(s, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rank_of(s, i), i);
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.restart_count, 3);
    sim_free(s);

    /* A one-node round is whole with its first resume. */
    s = rebuilt(0, NULL);
    resume_member(s, 0, 1, (struct member){.id = "a", .round = 2, .rank = 0, .nnodes = 1});
    assert_int_equal(result_code(s, 0, 1), 0);
    assert_false(stats(s, "job").rebuilding);
    assert_int_equal(stats(s, "job").active, 1);
    sim_free(s);
}

static void test_rebuild_member_missing(void **state)
{
    (void)state;
    /* c never comes back: when resume_timeout (here 2 s) passes, a and b
     * restart (not counted, as after a node loss) and go on without it. */
    struct sim *s = rebuilt(2, "resume_timeout=2");
    tick(s, s->now + 1999);
    assert_int_equal(s->nacts, 0);
    tick(s, s->now + 1);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    const struct rdzv_action *a = find(s, 0, RDZV_ACT_RESTART);
    assert_string_equal(a->restart.reason, "node_missing");
    assert_false(a->restart.counted);
    assert_int_equal(a->restart.restart_count, 2);
    assert_int_equal(a->restart.round, 6);
    assert_false(stats(s, "job").rebuilding);
    join(s, 0, "a", 1, 4, NULL);
    join(s, 1, "b", 1, 4, NULL);
    check_round(s, 2);
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.round, 6);
    /* c, late: its round is gone; it joins as a new node (scale-up). */
    resume_member(s, 2, 9,
                  (struct member){.id = "c", .round = 5, .rank = 2, .nnodes = 3, .restarts = 2});
    assert_int_equal(result_code(s, 2, 9), CDDP_ESTATE);
    assert_int_equal(s->nacts, 1);
    join(s, 2, "c", 1, 4, NULL);
    assert_string_equal(find(s, 0, RDZV_ACT_RESTART)->restart.reason, "node_joined");
    sim_free(s);

    /* A member lost while the others are awaited is a node loss. */
    s = rebuilt(2, NULL);
    drop(s, 1);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 1);
    assert_string_equal(find(s, 0, RDZV_ACT_RESTART)->restart.reason, "node_lost");
    assert_false(stats(s, "job").rebuilding);
    sim_free(s);

    /* Every member that came back finished meanwhile: the job is over. */
    s = rebuilt(1, "resume_timeout=1");
    rdzv_state_leave(s->st, s->now, &s->peer[0], NULL, true);
    collect(s);
    assert_int_equal(s->nacts, 0);
    tick(s, s->now + 1000);
    assert_int_equal(stats(s, "job").phase, RDZV_CLOSED);
    sim_free(s);
}

static void test_rebuild_refused(void **state)
{
    (void)state;
    struct sim *s = rebuilt(1, NULL);
    hello(s, 3, "job");
    hello(s, 4, "job");
    /* A different round, node count or master than the one being rebuilt,
     * or a rank already back: that node joins again; nothing else changes. */
    struct member bad[4] = {
        {.id = "b", .round = 4, .rank = 1, .nnodes = 3, .restarts = 2},
        {.id = "b", .round = 5, .rank = 1, .nnodes = 2, .restarts = 2},
        {.id = "b", .round = 5, .rank = 1, .nnodes = 3, .master = "10.9.9.9"},
        {.id = "b", .round = 5, .rank = 0, .nnodes = 3, .restarts = 2},
    };
    for (int k = 0; k < 4; k++) {
        resume_member(s, 1, 20 + (uint64_t)k, bad[k]);
        assert_int_equal(result_code(s, 1, 20 + (uint64_t)k), CDDP_ESTATE);
        assert_int_equal(s->nacts, 1);
    }
    assert_non_null(strstr(find(s, 1, RDZV_ACT_RESULT)->result.message, "is back already"));
    /* Another --nnodes is refused as a join would be. */
    resume_member(s, 1, 30,
                  (struct member){.id = "b", .round = 5, .rank = 1, .nnodes = 3, .max = 3});
    assert_int_equal(result_code(s, 1, 30), CDDP_EMISMATCH);
    assert_int_equal(stats(s, "job").active, 1);
    assert_true(stats(s, "job").rebuilding);
    /* A newcomer waits for the outcome ... */
    join(s, 3, "d", 1, 4, NULL);
    assert_true(find(s, 3, RDZV_ACT_JOINED)->joined.waiting);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 0);
    /* ... and is taken once the round is whole (below max: a scale-up). */
    resume_member(s, 1, 31,
                  (struct member){.id = "b", .round = 5, .rank = 1, .nnodes = 3, .restarts = 2});
    assert_int_equal(count(s, RDZV_ACT_RESTART), 0);
    resume_member(s, 2, 32,
                  (struct member){.id = "c", .round = 5, .rank = 2, .nnodes = 3, .restarts = 2});
    assert_int_equal(result_code(s, 2, 32), 0);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 3);
    assert_string_equal(find(s, 0, RDZV_ACT_RESTART)->restart.reason, "node_joined");
    sim_free(s);

    /* A member that joins instead of resuming (its workers are stopped: an
     * older agent) ends the rebuild: everyone restarts, not counted. */
    s = rebuilt(2, NULL);
    join_back(s, 2, "c", 5, 3, 2);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    assert_string_equal(find(s, 0, RDZV_ACT_RESTART)->restart.reason, "node_rejoined");
    assert_false(find(s, 0, RDZV_ACT_RESTART)->restart.counted);
    join_back(s, 0, "a", 5, 3, 2);
    join_back(s, 1, "b", 5, 3, 2);
    check_round(s, 3);
    assert_int_equal(find(s, 0, RDZV_ACT_ROUND)->round.round, 6);
    sim_free(s);

    /* A run that formed here already (someone joined first), or
     * resume_timeout=0: no rebuild, the node joins again. */
    s = sim_new(false);
    hello(s, 0, "job");
    hello(s, 1, "job");
    join_back(s, 0, "a", 5, 3, 2);
    resume_member(s, 1, 1, (struct member){.id = "b", .round = 5, .rank = 1, .nnodes = 3});
    assert_int_equal(result_code(s, 1, 1), CDDP_ESTATE);
    sim_free(s);
    s = rebuilt(0, NULL);
    resume_member(
        s, 0, 1,
        (struct member){.id = "a", .round = 5, .rank = 0, .nnodes = 3, .conf = "resume_timeout=0"});
    assert_int_equal(result_code(s, 0, 1), CDDP_ESTATE);
    assert_non_null(strstr(find(s, 0, RDZV_ACT_RESULT)->result.message, "resume_timeout=0"));
    assert_false(stats(s, "job").rebuilding);
    /* A plain resume (an older agent) tells a restarted server nothing to
     * rebuild from: that node must join again. */
    resume(s, 0, 3, "a", 5);
    assert_int_equal(result_code(s, 0, 3), CDDP_ESTATE);
    assert_false(stats(s, "job").rebuilding);
    /* A round larger than --nnodes allows is not taken either. */
    resume_member(s, 0, 2,
                  (struct member){.id = "a", .round = 5, .rank = 0, .nnodes = 3, .max = 2});
    assert_int_equal(result_code(s, 0, 2), CDDP_ESTATE);
    sim_free(s);
}

/* ---- rdzv_state_visit (status pages) ---- */

struct seen {
    struct rdzv_run_info runs[4];
    size_t nruns;
    struct rdzv_node_info nodes[8];
    char ids[8][16];
    size_t run_of[8];
    size_t nnodes;
};

static void seen_run(void *arg, const struct rdzv_run_info *r)
{
    struct seen *v = arg;
    assert_true(v->nruns < 4);
    v->runs[v->nruns++] = *r;
}

static void seen_node(void *arg, const struct rdzv_node_info *n)
{
    struct seen *v = arg;
    assert_true(v->nnodes < 8 && v->nruns > 0);
    snprintf(v->ids[v->nnodes], sizeof(v->ids[0]), "%s", n->node_id);
    v->run_of[v->nnodes] = v->nruns - 1;
    v->nodes[v->nnodes++] = *n;
}

static struct seen *visit(struct sim *s, size_t max_runs)
{
    static struct seen v;
    memset(&v, 0, sizeof(v));
    rdzv_state_visit(s->st, max_runs, seen_run, seen_node, &v);
    return &v;
}

static void test_visit(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    struct seen *v = visit(s, 0);
    assert_int_equal(v->nruns, 0);
    for (int i = 0; i < 4; i++)
        hello(s, i, i < 3 ? "job" : "other");
    s->now = 2000;
    join_ex(s, 0, "a", (struct joinopt){.min = 2, .max = 2, .nproc = 4});
    v = visit(s, 0);
    assert_int_equal(v->nruns, 2); /* "other" exists from its hello */
    assert_string_equal(v->runs[0].run_id, "job");
    assert_string_equal(v->runs[0].phase, "forming");
    assert_int_equal(v->runs[0].round_at, 0);
    assert_int_equal(v->runs[0].min_nodes, 2);
    assert_int_equal(v->runs[0].nnodes, 1);
    assert_int_equal(v->nnodes, 1);
    assert_string_equal(v->ids[0], "a");
    assert_string_equal(v->nodes[0].state, "participant");
    assert_int_equal(v->nodes[0].rank, -1);
    assert_int_equal(v->nodes[0].nproc, 4);
    assert_int_equal(v->nodes[0].joined_at, 2000);
    /* The round completes at 3000; a third node waits; time passes. */
    s->now = 3000;
    join(s, 1, "b", 2, 2, NULL);
    check_round(s, 2);
    s->now = 4000;
    join(s, 2, "c", 2, 2, NULL);
    s->now = 5000;
    beat(s, 1);
    v = visit(s, 0);
    assert_string_equal(v->runs[0].phase, "running");
    assert_int_equal(v->runs[0].round_at, 3000);
    assert_int_equal(v->runs[0].nnodes, 3);
    assert_int_equal(v->nnodes, 3);
    /* members first (ranked), the wait list last */
    assert_string_equal(v->nodes[0].state, "active");
    assert_string_equal(v->nodes[1].state, "active");
    assert_int_equal(v->nodes[0].rank + v->nodes[1].rank, 1);
    assert_string_equal(v->ids[2], "c");
    assert_string_equal(v->nodes[2].state, "waiting");
    assert_int_equal(v->nodes[2].rank, -1);
    assert_int_equal(v->nodes[2].joined_at, 4000);
    for (size_t k = 0; k < 2; k++) {
        if (strcmp(v->ids[k], "b") == 0)
            assert_int_equal(v->nodes[k].last_seen, 5000);
        else
            assert_int_equal(v->nodes[k].last_seen, 2000);
    }
    /* max_runs bounds the walk */
    v = visit(s, 1);
    assert_int_equal(v->nruns, 1);
    /* A member is lost: the survivor restarts, keeping its rank on show. */
    drop(s, 0);
    v = visit(s, 0);
    bool restarting = false;
    for (size_t k = 0; k < v->nnodes; k++) {
        if (strcmp(v->ids[k], "b") == 0) {
            restarting = strcmp(v->nodes[k].state, "restarting") == 0;
            assert_true(v->nodes[k].rank >= 0);
        }
    }
    assert_true(restarting);
    sim_free(s);
}

static void test_failure_counted(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 3, 3);
    rdzv_state_failure(s->st, s->now, &s->peer[1], 1, "exit 1");
    collect(s);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 3); /* the reporter too */
    for (int i = 0; i < 3; i++) {
        const struct rdzv_action *a = find(s, i, RDZV_ACT_RESTART);
        assert_true(a->restart.counted);
        assert_string_equal(a->restart.reason, "worker_failure");
        assert_string_equal(a->restart.node_id, "b");
        assert_int_equal(a->restart.round, 2);
        assert_int_equal(a->restart.restart_count, 1);
    }
    /* Other nodes' reports about the same failed round change nothing. */
    rdzv_state_failure(s->st, s->now, &s->peer[0], 1, "exit 1");
    collect(s);
    assert_int_equal(s->nacts, 0);
    for (int i = 0; i < 3; i++)
        join(s, i, i == 0 ? "a" : i == 1 ? "b" : "c", 3, 3, NULL);
    check_round(s, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rank_of(s, i), i);
        assert_int_equal(find(s, i, RDZV_ACT_ROUND)->round.restart_count, 1);
    }
    /* A report about an old round is stale. */
    rdzv_state_failure(s->st, s->now, &s->peer[0], 1, "late");
    collect(s);
    assert_int_equal(s->nacts, 0);
    sim_free(s);
}

static void test_member_rejoin(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 3, 3);
    join(s, 2, "c", 3, 3, NULL);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    assert_null(find(s, 2, RDZV_ACT_RESTART));
    assert_string_equal(find(s, 0, RDZV_ACT_RESTART)->restart.reason, "node_rejoined");
    assert_int_equal(find(s, 2, RDZV_ACT_JOINED)->joined.round, 2);
    join(s, 0, "a", 3, 3, NULL);
    join(s, 1, "b", 3, 3, NULL);
    check_round(s, 3);
    sim_free(s);
}

static void test_lost_below_min_waits_then_times_out(void **state)
{
    (void)state;
    struct sim *s = running3("join_timeout=20", 3, 3);
    drop(s, 2);
    join(s, 0, "a", 3, 3, "join_timeout=20");
    join(s, 1, "b", 3, 3, "join_timeout=20");
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    tick(s, s->now + 20000);
    assert_int_equal(count(s, RDZV_ACT_ERROR), 2);
    assert_int_equal(find(s, 0, RDZV_ACT_ERROR)->error.code, CDDP_ETIMEOUT);
    assert_non_null(
        strstr(find(s, 0, RDZV_ACT_ERROR)->error.message, "node(s) joined, min_nodes=3"));
    sim_free(s);

    /* A replacement arriving in time completes it. */
    s = running3(NULL, 3, 3);
    drop(s, 2);
    join(s, 0, "a", 3, 3, NULL);
    join(s, 1, "b", 3, 3, NULL);
    hello(s, 3, "job");
    join(s, 3, "d", 3, 3, NULL);
    check_round(s, 3);
    assert_int_equal(rank_of(s, 3), 2);
    sim_free(s);
}

static void test_laggard_after_last_call(void **state)
{
    (void)state;
    /* After a restart, a slow member that misses last call is left out and
     * its later join starts the next round. */
    struct sim *s = running3("last_call_timeout=5", 2, 3);
    drop(s, 1);
    hello(s, 1, "job");
    join(s, 1, "d", 2, 3, NULL); /* newcomer: a participant of round 1 */
    join(s, 0, "a", 2, 3, NULL);
    assert_true(stats(s, "job").last_call_armed);
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    tick(s, s->now + 5000);
    check_round(s, 2);
    assert_int_equal(stats(s, "job").restarting, 0);
    join(s, 2, "c", 2, 3, NULL);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 2);
    assert_int_equal(find(s, 2, RDZV_ACT_JOINED)->joined.round, 3);
    sim_free(s);
}

static void test_close(void **state)
{
    (void)state;
    struct sim *s = running3("close_timeout=10", 1, 4);
    hello(s, 3, "job");
    rdzv_state_close(s->st, s->now, &s->peer[3], "job finished");
    collect(s);
    assert_int_equal(count(s, RDZV_ACT_CLOSED), 4); /* 3 nodes + the closer */
    assert_string_equal(find(s, 0, RDZV_ACT_CLOSED)->closed.reason, "job finished");
    assert_int_equal(stats(s, "job").phase, RDZV_CLOSED);
    assert_int_equal(stats(s, "job").nodes, 0);
    /* Later joins are refused; closing again just answers. */
    join(s, 0, "a", 1, 4, NULL);
    const struct rdzv_action *e = find(s, 0, RDZV_ACT_ERROR);
    assert_int_equal(e->error.code, CDDP_ECLOSED);
    assert_non_null(strstr(e->error.message, "job finished"));
    rdzv_state_close(s->st, s->now, &s->peer[3], "again");
    collect(s);
    assert_string_equal(find(s, 3, RDZV_ACT_CLOSED)->closed.reason, "job finished");
    /* The store still works for connected peers. */
    struct proto_msg m = {.type = PROTO_SET, .id = 1};
    m.set.key = "k";
    m.set.value = (struct proto_bytes){"v", 1};
    rdzv_state_store(s->st, s->now, &s->peer[0], &m);
    collect(s);
    assert_int_equal(find(s, 0, RDZV_ACT_RESULT)->result.code, 0);

    /* Remembered for close_timeout after the last connection goes... */
    for (int i = 0; i < 4; i++)
        drop(s, i);
    assert_int_equal(rdzv_state_num_runs(s->st), 1);
    hello(s, 0, "job");
    join(s, 0, "a", 1, 4, NULL);
    assert_int_equal(find(s, 0, RDZV_ACT_ERROR)->error.code, CDDP_ECLOSED);
    drop(s, 0);
    tick(s, s->now + 10000);
    /* ...then forgotten: the run id can be used again. */
    assert_int_equal(rdzv_state_num_runs(s->st), 0);
    hello(s, 0, "job");
    join(s, 0, "a", 1, 1, NULL);
    check_round(s, 1);
    sim_free(s);
}

static void test_run_isolation(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    hello(s, 0, "job1");
    hello(s, 1, "job2");
    hello(s, 2, "job1");
    hello(s, 3, "job2");
    join(s, 0, "a", 2, 2, NULL);
    join(s, 1, "a", 2, 2, NULL); /* same node id, other run: fine */
    assert_int_equal(count(s, RDZV_ACT_ROUND), 0);
    join(s, 2, "b", 2, 2, NULL);
    check_round(s, 2);
    assert_null(find(s, 1, RDZV_ACT_ROUND));
    assert_string_equal(find(s, 0, RDZV_ACT_ROUND)->round.run_id, "job1");
    join(s, 3, "b", 2, 2, NULL);
    check_round(s, 2);
    assert_string_equal(find(s, 1, RDZV_ACT_ROUND)->round.run_id, "job2");
    /* Trouble in one run does not touch the other. */
    drop(s, 0);
    assert_int_equal(count(s, RDZV_ACT_RESTART), 1);
    assert_non_null(find(s, 2, RDZV_ACT_RESTART));
    assert_int_equal(stats(s, "job2").phase, RDZV_RUNNING);
    /* Stores are separate too. */
    struct proto_msg m = {.type = PROTO_SET, .id = 1};
    m.set.key = "k";
    m.set.value = (struct proto_bytes){"1", 1};
    rdzv_state_store(s->st, s->now, &s->peer[2], &m);
    m = (struct proto_msg){.type = PROTO_GET, .id = 2};
    m.get.key = "k";
    m.get.timeout_ms = -1;
    rdzv_state_store(s->st, s->now, &s->peer[3], &m);
    collect(s);
    assert_int_equal(find(s, 3, RDZV_ACT_RESULT)->result.code, CDDP_ENOTFOUND);
    sim_free(s);
}

static void test_protocol_errors(void **state)
{
    (void)state;
    struct sim *s = sim_new(false);
    char err[256];
    /* join before hello */
    rdzv_peer_init(&s->peer[0], "10.0.0.1", false, NULL);
    s->connected[0] = true;
    join(s, 0, "a", 1, 1, NULL);
    assert_int_equal(find(s, 0, RDZV_ACT_ERROR)->error.code, CDDP_ESTATE);
    assert_true(find(s, 0, RDZV_ACT_ERROR)->error.drop);
    assert_int_equal(rdzv_state_hello(s->st, s->now, &s->peer[0], "job", err, sizeof(err)), 0);
    collect(s);
    /* hello twice */
    assert_int_equal(rdzv_state_hello(s->st, s->now, &s->peer[0], "job", err, sizeof(err)),
                     CDDP_ESTATE);
    collect(s);
    assert_true(find(s, 0, RDZV_ACT_ERROR)->error.drop);
    /* unknown rdzv_conf key, bad value */
    join(s, 0, "a", 1, 2, "bogus_key=1");
    const struct rdzv_action *e = find(s, 0, RDZV_ACT_ERROR);
    assert_int_equal(e->error.code, CDDP_ECONFIG);
    assert_false(e->error.drop);
    assert_non_null(strstr(e->error.message, "bogus_key"));
    join(s, 0, "a", 1, 2, "join_timeout=soon");
    assert_int_equal(find(s, 0, RDZV_ACT_ERROR)->error.code, CDDP_ECONFIG);
    assert_int_equal(stats(s, "job").nodes, 0);
    /* min/max must agree with the run */
    join(s, 0, "a", 2, 3, NULL);
    hello(s, 1, "job");
    join(s, 1, "b", 1, 3, NULL);
    e = find(s, 1, RDZV_ACT_ERROR);
    assert_int_equal(e->error.code, CDDP_EMISMATCH);
    assert_non_null(strstr(e->error.message, "--nnodes=2:3"));
    /* one connection, one node id */
    join(s, 0, "other", 2, 3, NULL);
    assert_int_equal(find(s, 0, RDZV_ACT_ERROR)->error.code, CDDP_ESTATE);
    /* the same node id on a new connection replaces the old one */
    join(s, 1, "a", 2, 3, NULL);
    e = find(s, 0, RDZV_ACT_ERROR);
    assert_int_equal(e->error.code, CDDP_EEXISTS);
    assert_true(e->error.drop);
    assert_non_null(find(s, 1, RDZV_ACT_JOINED));
    assert_int_equal(stats(s, "job").participants, 1);
    drop(s, 0);
    assert_int_equal(stats(s, "job").participants, 1);
    sim_free(s);

    /* A plain store refuses rendezvous. */
    s = sim_new(true);
    hello(s, 0, "anything");
    join(s, 0, "a", 1, 1, NULL);
    assert_true(find(s, 0, RDZV_ACT_ERROR)->error.drop);
    rdzv_state_close(s->st, s->now, &s->peer[0], NULL);
    collect(s);
    assert_true(find(s, 0, RDZV_ACT_ERROR)->error.drop);
    assert_int_equal(rdzv_state_run_stats(s->st, "", &(struct rdzv_run_stats){0}), 0);
    sim_free(s);
}

static void test_master_addr(void **state)
{
    (void)state;
    /* --local_addr wins. */
    struct sim *s = sim_new(false);
    hello(s, 0, "job");
    join_ex(s, 0, "a", (struct joinopt){.min = 1, .max = 1, .local_addr = "node-a.example"});
    assert_string_equal(find(s, 0, RDZV_ACT_ROUND)->round.master_addr, "node-a.example");
    sim_free(s);

    /* Everyone on loopback: node 0's loopback address. */
    s = sim_new(false);
    char err[64];
    for (int i = 0; i < 2; i++) {
        rdzv_peer_init(&s->peer[i], "127.0.0.1", true, NULL);
        s->connected[i] = true;
        rdzv_state_hello(s->st, s->now, &s->peer[i], "job", err, sizeof(err));
        join_ex(s, i, i ? "b" : "a", (struct joinopt){.min = 2, .max = 2, .hostname = "h"});
    }
    assert_string_equal(find(s, 0, RDZV_ACT_ROUND)->round.master_addr, "127.0.0.1");
    sim_free(s);

    /* Node 0 on the server's machine, others remote: its host name. */
    s = sim_new(false);
    rdzv_peer_init(&s->peer[0], "::1", true, NULL);
    s->connected[0] = true;
    rdzv_state_hello(s->st, s->now, &s->peer[0], "job", err, sizeof(err));
    join_ex(s, 0, "a", (struct joinopt){.min = 2, .max = 2, .hostname = "server-host"});
    hello(s, 1, "job");
    join_ex(s, 1, "b", (struct joinopt){.min = 2, .max = 2, .hostname = "other"});
    assert_string_equal(find(s, 1, RDZV_ACT_ROUND)->round.master_addr, "server-host");
    sim_free(s);
}

static void test_store_through_state(void **state)
{
    (void)state;
    struct sim *s = sim_new(true);
    hello(s, 0, "x");
    hello(s, 1, "y"); /* a plain store ignores run ids: one store */
    struct proto_msg g = {.type = PROTO_GET, .id = 7};
    g.get.key = "port";
    g.get.timeout_ms = 5000;
    rdzv_state_store(s->st, s->now, &s->peer[0], &g);
    collect(s);
    assert_int_equal(s->nacts, 0); /* waits */
    assert_int_equal(rdzv_state_next_deadline(s->st), s->now + 5000);
    struct proto_msg set = {.type = PROTO_SET, .id = 1};
    set.set.key = "port";
    set.set.value = (struct proto_bytes){"29500", 5};
    rdzv_state_store(s->st, s->now, &s->peer[1], &set);
    collect(s);
    assert_int_equal(s->nacts, 2);
    assert_int_equal(find(s, 1, RDZV_ACT_RESULT)->result.id, 1);
    const struct rdzv_action *r = find(s, 0, RDZV_ACT_RESULT);
    assert_int_equal(r->result.id, 7);
    assert_true(r->result.has_value);
    assert_memory_equal(r->result.value, "29500", 5);
    assert_int_equal(rdzv_state_next_deadline(s->st), RDZV_NEVER);

    /* wait with a timeout, answered by tick */
    const char *keys[] = {"a", "b"};
    struct proto_msg w = {.type = PROTO_WAIT, .id = 9};
    w.wait.keys = keys;
    w.wait.nkeys = 2;
    w.wait.timeout_ms = 100;
    rdzv_state_store(s->st, s->now, &s->peer[0], &w);
    collect(s);
    assert_int_equal(s->nacts, 0);
    tick(s, s->now + 100);
    r = find(s, 0, RDZV_ACT_RESULT);
    assert_int_equal(r->result.id, 9);
    assert_int_equal(r->result.code, CDDP_ETIMEOUT);

    /* add, compare_set, get of a missing key without waiting */
    struct proto_msg add = {.type = PROTO_ADD, .id = 10};
    add.add.key = "n";
    add.add.delta = 5;
    rdzv_state_store(s->st, s->now, &s->peer[0], &add);
    collect(s);
    assert_int_equal(find(s, 0, RDZV_ACT_RESULT)->result.number, 5);
    rdzv_state_store(s->st, s->now, &s->peer[0], &set);
    rdzv_state_store(s->st, s->now, &s->peer[0], &add);
    collect(s);
    struct proto_msg cas = {.type = PROTO_COMPARE_SET, .id = 11};
    cas.compare_set.key = "port";
    cas.compare_set.expected = (struct proto_bytes){"29500", 5};
    cas.compare_set.desired = (struct proto_bytes){"1", 1};
    rdzv_state_store(s->st, s->now, &s->peer[1], &cas);
    collect(s);
    assert_memory_equal(find(s, 1, RDZV_ACT_RESULT)->result.value, "1", 1);
    g.get.key = "missing";
    g.get.timeout_ms = -1;
    rdzv_state_store(s->st, s->now, &s->peer[1], &g);
    collect(s);
    assert_int_equal(find(s, 1, RDZV_ACT_RESULT)->result.code, CDDP_ENOTFOUND);
    assert_non_null(strstr(find(s, 1, RDZV_ACT_RESULT)->result.message, "missing"));
    add.add.key = "port";
    add.add.delta = 1;
    rdzv_state_store(s->st, s->now, &s->peer[1], &add);
    collect(s);
    assert_int_equal(find(s, 1, RDZV_ACT_RESULT)->result.number, 2);

    /* A disconnect cancels the peer's waiters. */
    g.get.key = "never";
    g.get.timeout_ms = 100000;
    rdzv_state_store(s->st, s->now, &s->peer[0], &g);
    drop(s, 0);
    assert_int_equal(rdzv_state_next_deadline(s->st), RDZV_NEVER);
    /* With every client gone, a plain store keeps its keys. */
    drop(s, 1);
    hello(s, 2, "");
    g.get.key = "n";
    g.get.timeout_ms = -1;
    rdzv_state_store(s->st, s->now, &s->peer[2], &g);
    collect(s);
    assert_int_equal(find(s, 2, RDZV_ACT_RESULT)->result.code, 0);
    sim_free(s);
}

static void test_close_all(void **state)
{
    (void)state;
    struct sim *s = running3(NULL, 3, 3);
    hello(s, 3, "other");
    join(s, 3, "z", 2, 2, NULL);
    rdzv_state_close_all(s->st, s->now, "server shutting down");
    collect(s);
    assert_int_equal(count(s, RDZV_ACT_CLOSED), 4);
    assert_int_equal(stats(s, "other").phase, RDZV_CLOSED);
    sim_free(s);
}

/* ---- scale: 10,000 nodes in one process ---- */

static void test_ten_thousand_nodes(void **state)
{
    (void)state;
    enum { N = 10000 };
    struct rdzv_state_options o = {.seed = {1, 2}};
    struct rdzv_state *st = rdzv_state_new(&o);
    struct rdzv_peer *peers = calloc(N, sizeof(*peers));
    char(*ids)[24] = calloc(N, sizeof(*ids));
    int *rank = calloc(N, sizeof(*rank));
    char err[128];
    uint64_t now = 5;
    const struct rdzv_action *a;
    size_t n;

    struct proto_msg m = {.type = PROTO_JOIN};
    m.join.nproc = 8;
    m.join.min_nodes = N / 2;
    m.join.max_nodes = N;
    m.join.master_port = 29500;
    for (int i = 0; i < N; i++) {
        rdzv_peer_init(&peers[i], "10.1.2.3", false, NULL);
        snprintf(ids[i], sizeof(ids[i]), "node%05d", (i * 7919) % N); /* joins out of order */
        assert_int_equal(rdzv_state_hello(st, now, &peers[i], "big", err, sizeof(err)), 0);
        m.join.node_id = ids[i];
        rdzv_state_join(st, now, &peers[i], &m);
        n = rdzv_state_actions(st, &a);
        if (i < N - 1) {
            assert_int_equal(n, 1);
            assert_int_equal(a[0].kind, RDZV_ACT_JOINED);
        }
    }
    /* The last join completes the round: its JOINED, then N rounds, ranks by node id. */
    assert_int_equal(n, N + 1);
    assert_int_equal(a[0].kind, RDZV_ACT_JOINED);
    a++;
    n--;
    for (size_t k = 0; k < n; k++) {
        assert_int_equal(a[k].kind, RDZV_ACT_ROUND);
        assert_int_equal(a[k].round.nnodes, N);
        assert_int_equal(a[k].round.world_size, 8 * N);
        int i = (int)(a[k].peer - peers);
        rank[i] = a[k].round.node_rank;
        assert_int_equal(rank[i], (i * 7919) % N);
        assert_int_equal(a[k].round.rank_offset, 8 * rank[i]);
    }

    /* Heartbeats from everybody for a minute: nobody is dropped. */
    for (int t = 1; t <= 12; t++) {
        now = 5 + (uint64_t)t * 5000;
        for (int i = 0; i < N; i++)
            rdzv_state_heartbeat(st, now, &peers[i]);
        rdzv_state_tick(st, now);
        assert_int_equal(rdzv_state_actions(st, &a), 0);
    }

    /* Lose node rank 0: 9,999 restarts, all rejoin, the new round keeps ranks. */
    int victim = 0;
    for (int i = 0; i < N; i++)
        if (rank[i] == 0)
            victim = i;
    rdzv_state_disconnect(st, now, &peers[victim]);
    n = rdzv_state_actions(st, &a);
    assert_int_equal(n, N - 1);
    for (size_t k = 0; k < n; k++)
        assert_int_equal(a[k].kind, RDZV_ACT_RESTART);
    for (int i = 0; i < N; i++) {
        if (i == victim)
            continue;
        m.join.node_id = ids[i];
        rdzv_state_join(st, now, &peers[i], &m);
    }
    n = rdzv_state_actions(st, &a);
    size_t rounds = 0;
    for (size_t k = 0; k < n; k++) {
        if (a[k].kind != RDZV_ACT_ROUND)
            continue;
        rounds++;
        int i = (int)(a[k].peer - peers);
        assert_int_equal(a[k].round.round, 2);
        assert_int_equal(a[k].round.nnodes, N - 1);
        /* Every survivor below N-1 keeps its rank; the last fills rank 0. */
        if (rank[i] < N - 1)
            assert_int_equal(a[k].round.node_rank, rank[i]);
        else
            assert_int_equal(a[k].round.node_rank, 0);
    }
    assert_int_equal(rounds, N - 1);

    for (int i = 0; i < N; i++) {
        if (i != victim)
            rdzv_state_disconnect(st, now, &peers[i]);
    }
    assert_int_equal(rdzv_state_num_runs(st), 0);
    rdzv_state_free(st);
    free(peers);
    free(ids);
    free(rank);
}

/* ---- random event sequences: invariants hold after every call ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void check_invariants(struct sim *s)
{
    struct rdzv_run_stats r;
    if (rdzv_state_run_stats(s->st, "job", &r) != 0)
        return;
    assert_int_equal(r.participants + r.waiting + r.active + r.restarting <= r.nodes, true);
    if (r.phase == RDZV_RUNNING) {
        assert_true(r.active >= (size_t)1 && r.active <= (size_t)r.max_nodes);
        assert_int_equal(r.participants, 0);
    }
    if (r.phase == RDZV_FORMING)
        assert_int_equal(r.active, 0);
    assert_true(r.participants <= (size_t)r.max_nodes);
    size_t rounds = count(s, RDZV_ACT_ROUND);
    if (rounds)
        check_round(s, rounds);
}

static void test_random_sequences(void **state)
{
    (void)state;
    size_t seen[RDZV_ACT_BLAME + 1] = {0}; /* (by kind; RDZV_ACT_BLAME is the last) */
    for (int trial = 0; trial < 40; trial++) {
        struct sim *s = sim_new(false);
        int min = 1 + (int)rnd(3), max = min + (int)rnd(4);
        char ids[MAXP][8];
        for (int i = 0; i < 10; i++)
            snprintf(ids[i], sizeof(ids[i]), "n%d", i);
        for (int step = 0; step < 400; step++) {
            int i = (int)rnd(10);
            uint32_t op = rnd(100);
            if (!s->connected[i]) {
                hello(s, i, "job");
                s->peer[i].heartbeat_ack = i % 2;
                continue;
            }
            if (op < 30) {
                join(s, i, ids[i], min, max,
                     "last_call_timeout=2,join_timeout=20,keep_alive_interval=1,"
                     "keep_alive_max_attempt=3");
            } else if (op < 35) {
                /* Another connection's node (or one long gone) resumes here. */
                struct rdzv_run_stats r;
                if (rdzv_state_run_stats(s->st, "job", &r) == 0) {
                    /* One rnd() a statement: argument order is the compiler's. */
                    const char *who = ids[rnd(10)];
                    uint64_t back = rnd(2);
                    resume(s, i, (uint64_t)step, who, r.round - back);
                }
            } else if (op < 50) {
                rdzv_state_heartbeat(s->st, s->now, &s->peer[i]);
                collect(s);
                assert_int_equal(s->nacts, s->peer[i].heartbeat_ack ? 1 : 0);
            } else if (op < 60) {
                drop(s, i);
            } else if (op < 65) {
                rdzv_state_leave(s->st, s->now, &s->peer[i], NULL, rnd(2) == 0);
                collect(s);
            } else if (op < 72) {
                struct rdzv_run_stats r;
                if (rdzv_state_run_stats(s->st, "job", &r) == 0)
                    rdzv_state_failure(s->st, s->now, &s->peer[i], r.round, "x");
                collect(s);
            } else if (op < 73) {
                rdzv_state_close(s->st, s->now, &s->peer[i], "done");
                collect(s);
            } else if (op < 77) {
                /* Every replace is answered once, to the asker. */
                struct rdzv_run_stats r;
                uint64_t back = rnd(2);
                int rank = (int)rnd(8);
                if (rdzv_state_run_stats(s->st, "job", &r) == 0 && r.round > back) {
                    replace(s, i, r.round - back, rank);
                    size_t answers = 0;
                    for (size_t k = 0; k < s->nacts; k++)
                        answers += s->acts[k].kind == RDZV_ACT_GENERATION &&
                                   s->acts[k].peer == &s->peer[i];
                    assert_int_equal(answers, 1);
                }
            } else {
                tick(s, s->now + rnd(1500));
            }
            /* The shell drops what it is told to drop. */
            for (size_t k = 0; k < s->nacts; k++) {
                seen[s->acts[k].kind]++;
                if (s->acts[k].kind == RDZV_ACT_ERROR && s->acts[k].error.drop) {
                    int p = (int)(s->acts[k].peer - s->peer);
                    rdzv_state_disconnect(s->st, s->now, &s->peer[p]);
                    s->connected[p] = false;
                }
            }
            check_invariants(s);
        }
        sim_free(s);
    }
    /* The walk went through every kind of transition, many times. */
    for (int k = RDZV_ACT_JOINED; k <= RDZV_ACT_HEARTBEAT; k++)
        assert_true(seen[k] > 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_min_max_equal),
        cmocka_unit_test(test_round_nproc_offsets),
        cmocka_unit_test(test_last_call),
        cmocka_unit_test(test_max_completes_at_once),
        cmocka_unit_test(test_below_min_falls_back),
        cmocka_unit_test(test_join_timeout),
        cmocka_unit_test(test_disconnect_restarts_survivors),
        cmocka_unit_test(test_rank0_lost_ranks_stable),
        cmocka_unit_test(test_heartbeat_timeout),
        cmocka_unit_test(test_stragglers),
        cmocka_unit_test(test_waiting_node_scale_up),
        cmocka_unit_test(test_waiting_at_max),
        cmocka_unit_test(test_spare_in_place),
        cmocka_unit_test(test_no_spare_not_in_place),
        cmocka_unit_test(test_heartbeat_ack),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_restarted_server_goes_on),
        cmocka_unit_test(test_rebuild_every_member_back),
        cmocka_unit_test(test_rebuild_member_missing),
        cmocka_unit_test(test_rebuild_refused),
        cmocka_unit_test(test_visit),
        cmocka_unit_test(test_finished_leave_is_quiet),
        cmocka_unit_test(test_no_restart_livelock_with_zero_last_call),
        cmocka_unit_test(test_failure_counted),
        cmocka_unit_test(test_member_rejoin),
        cmocka_unit_test(test_lost_below_min_waits_then_times_out),
        cmocka_unit_test(test_laggard_after_last_call),
        cmocka_unit_test(test_close),
        cmocka_unit_test(test_run_isolation),
        cmocka_unit_test(test_protocol_errors),
        cmocka_unit_test(test_master_addr),
        cmocka_unit_test(test_store_through_state),
        cmocka_unit_test(test_close_all),
        cmocka_unit_test(test_ten_thousand_nodes),
        cmocka_unit_test(test_random_sequences),
        cmocka_unit_test(test_replace_then_spare_in_place),
        cmocka_unit_test(test_replace_several_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
