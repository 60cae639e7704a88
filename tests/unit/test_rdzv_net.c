/* Tests of rendezvous/server.c, client.c and store_client.c over real
 * loopback sockets: the server and the agents' clients share one libuv loop
 * in this process (as when an agent hosts the rendezvous); the blocking
 * store client runs from plain threads against a store thread. Every test
 * ends with all handles closed and uv_loop_close() == 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/unit_util.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <uv.h>

#include "common/errors.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"
#include "rendezvous/state.h"
#include "rendezvous/store_client.h"

#define NCLI 4

struct agent {
    struct rdzv_client *c;
    int joins_done;
    int status;
    struct proto_round round;
    int restarts;
    bool last_counted;
    int closed;
    int errors;
    int last_error;
    bool rejoin_on_restart;
    int disconnects, reconnects, resumed;
    int64_t waiting;
    char restart_reason[32];
    int generations;                    /* GENERATION events */
    int64_t last_generation, gen_count; /* the last GENERATION's, its restart_count */
    char replaced[32], gen_node[32], refused[160];
    int blames, blame_rank; /* BLAME events, the last's rank */
    int64_t blame_gen;
    char blame_from[32];
    struct world *w;
};

struct world {
    uv_loop_t loop;
    uv_timer_t guard;
    struct rdzv_server *srv;
    struct agent a[NCLI];
    int port;
    int server_gone;
    int clients_gone;
};

static void on_guard(uv_timer_t *t)
{
    (void)t;
    fail_msg("test did not finish in time");
}

static void run_until(struct world *w, bool (*pred)(struct world *))
{
    while (!pred(w))
        uv_run(&w->loop, UV_RUN_ONCE);
}

static void world_init(struct world *w, const char *token)
{
    memset(w, 0, sizeof(*w));
    uv_loop_init(&w->loop);
    uv_timer_init(&w->loop, &w->guard);
    uv_timer_start(&w->guard, on_guard, 20000, 0);
    uv_unref((uv_handle_t *)&w->guard);
    char err[256];
    struct rdzv_server_options o = {.host = "127.0.0.1", .token = token};
    assert_int_equal(rdzv_server_start(&w->loop, &o, &w->srv, err, sizeof(err)), 0);
    w->port = rdzv_server_port(w->srv);
    assert_true(w->port > 0);
    for (int i = 0; i < NCLI; i++)
        w->a[i].w = w;
}

static void on_server_gone(void *arg)
{
    ((struct world *)arg)->server_gone++;
}

static void on_client_gone(void *arg)
{
    ((struct world *)arg)->clients_gone++;
}

static void world_close(struct world *w)
{
    for (int i = 0; i < NCLI; i++) {
        if (w->a[i].c) {
            rdzv_client_close(w->a[i].c, on_client_gone, w);
            w->a[i].c = NULL;
        }
    }
    if (w->srv)
        rdzv_server_shutdown(w->srv, "test over", on_server_gone, w);
    uv_close((uv_handle_t *)&w->guard, NULL);
    uv_run(&w->loop, UV_RUN_DEFAULT);
    assert_int_equal(w->server_gone, w->srv ? 1 : 0);
    assert_int_equal(uv_loop_close(&w->loop), 0);
}

static void on_join(struct rdzv_client *c, int status, const struct proto_round *r, void *arg)
{
    struct agent *a = arg;
    (void)c;
    a->joins_done++;
    a->status = status;
    if (status == 0)
        a->round = *r;
}

static void on_event(struct rdzv_client *c, const struct rdzv_event *ev, void *data)
{
    struct agent *a = data;
    switch (ev->kind) {
    case RDZV_EV_RESTART:
        a->restarts++;
        a->last_counted = ev->counted;
        snprintf(a->restart_reason, sizeof(a->restart_reason), "%s", ev->reason);
        if (a->rejoin_on_restart)
            assert_int_equal(rdzv_client_join(c, 0, on_join, a), 0);
        break;
    case RDZV_EV_CLOSED:
        a->closed++;
        break;
    case RDZV_EV_ERROR:
        a->errors++;
        a->last_error = ev->code;
        break;
    case RDZV_EV_JOINED:
        break;
    case RDZV_EV_DISCONNECTED:
        a->disconnects++;
        break;
    case RDZV_EV_RECONNECTED:
        a->reconnects++;
        a->resumed += ev->resumed;
        break;
    case RDZV_EV_WAITING:
        a->waiting = ev->waiting_nodes;
        break;
    case RDZV_EV_BLAME:
        a->blames++;
        a->blame_rank = ev->rank;
        a->blame_gen = ev->generation;
        snprintf(a->blame_from, sizeof(a->blame_from), "%s", ev->node_id ? ev->node_id : "");
        break;
    case RDZV_EV_GENERATION:
        a->generations++;
        a->last_generation = ev->generation;
        a->gen_count = ev->restart_count;
        snprintf(a->replaced, sizeof(a->replaced), "%s", ev->replaced ? ev->replaced : "");
        snprintf(a->gen_node, sizeof(a->gen_node), "%s", ev->node_id ? ev->node_id : "");
        snprintf(a->refused, sizeof(a->refused), "%s", ev->message ? ev->message : "");
        break;
    }
}

static void start_agent(struct world *w, int i, const char *token, int min, int max)
{
    char err[256];
    char id[32];
    struct rdzv_conf conf;
    rdzv_conf_init(&conf);
    conf.last_call_timeout_ms = 200;
    if (token) {
        snprintf(conf.token, sizeof(conf.token), "%s", token);
        conf.has_token = true;
    }
    snprintf(id, sizeof(id), "node%d", i);
    struct rdzv_client_options o = {.host = "127.0.0.1",
                                    .port = w->port,
                                    .run_id = "job",
                                    .node_id = id,
                                    .nproc = i + 1,
                                    .min_nodes = min,
                                    .max_nodes = max,
                                    .conf = &conf,
                                    .connect_timeout_ms = 5000};
    assert_int_equal(
        rdzv_client_start(&w->loop, &o, on_event, &w->a[i], &w->a[i].c, err, sizeof(err)), 0);
}

static int want_joins;
static bool all_joined(struct world *w)
{
    for (int i = 0; i < NCLI; i++) {
        if (w->a[i].c && w->a[i].joins_done < want_joins)
            return false;
    }
    return true;
}

static void test_round_restart_rejoin(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, NULL);
    for (int i = 0; i < 3; i++) {
        start_agent(&w, i, NULL, 2, 3);
        w.a[i].rejoin_on_restart = true;
        assert_int_equal(rdzv_client_join(w.a[i].c, 40000 + i, on_join, &w.a[i]), 0);
        /* A second join while one is outstanding is refused, no callback. */
        assert_int_equal(rdzv_client_join(w.a[i].c, 0, on_join, &w.a[i]), CDDP_ESTATE);
    }
    want_joins = 1;
    run_until(&w, all_joined);
    int seen[3] = {0};
    for (int i = 0; i < 3; i++) {
        struct agent *a = &w.a[i];
        assert_int_equal(a->status, 0);
        assert_int_equal(a->round.nnodes, 3);
        assert_int_equal(a->round.world_size, 1 + 2 + 3);
        assert_string_equal(a->round.master_addr, "127.0.0.1");
        assert_int_equal(a->round.master_port, 40000);
        assert_int_equal(a->round.node_rank, i);
        seen[a->round.node_rank]++;
        assert_non_null(rdzv_client_round(a->c));
    }
    assert_int_equal(w.a[2].round.rank_offset, 3);

    /* Node 1 goes away: the others are told at once and form round 1. */
    rdzv_client_close(w.a[1].c, on_client_gone, &w);
    w.a[1].c = NULL;
    want_joins = 2;
    run_until(&w, all_joined);
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(w.a[i].restarts, 1);
        assert_false(w.a[i].last_counted);
        assert_int_equal(w.a[i].round.round, 2);
        assert_int_equal(w.a[i].round.nnodes, 2);
    }
    assert_int_equal(w.a[0].round.node_rank, 0);
    assert_int_equal(w.a[2].round.node_rank, 1);

    /* A worker failure: counted restart for everyone, the reporter too. */
    assert_int_equal(rdzv_client_report_failure(w.a[2].c, "exit 1"), 0);
    want_joins = 3;
    run_until(&w, all_joined);
    assert_int_equal(w.a[0].restarts, 2);
    assert_true(w.a[0].last_counted);
    assert_int_equal(w.a[2].restarts, 2);
    assert_int_equal(w.a[0].round.round, 3);

    /* Close the rendezvous: every node hears it. */
    assert_int_equal(rdzv_client_close_rendezvous(w.a[0].c, "job done"), 0);
    while (w.a[0].closed == 0 || w.a[2].closed == 0)
        uv_run(&w.loop, UV_RUN_ONCE);
    assert_int_equal(w.a[0].errors, 0);
    world_close(&w);
    assert_int_equal(w.clients_gone, 3);
}

/* ---- replace: a worker restarted alone on one node of several ---- */

static int want_generations[NCLI];
static bool generations_in(struct world *w)
{
    for (int i = 0; i < NCLI; i++) {
        if (w->a[i].c && w->a[i].generations < want_generations[i])
            return false;
    }
    return true;
}

static void on_settled(uv_timer_t *t)
{
    *(bool *)t->data = true;
}

static void test_replace_grants_and_refuses(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, NULL);
    for (int i = 0; i < 3; i++) {
        start_agent(&w, i, NULL, 3, 3);
        /* No round yet: nothing to go on in place. */
        assert_int_equal(rdzv_client_replace(w.a[i].c, 0, NULL, "x"), CDDP_ESTATE);
        assert_int_equal(rdzv_client_join(w.a[i].c, 40000 + i, on_join, &w.a[i]), 0);
    }
    want_joins = 1;
    run_until(&w, all_joined);
    assert_int_equal(w.a[2].round.rank_offset, 3); /* node 2: ranks 3, 4, 5 */

    /* Node 2 restarts rank 4 alone: every node hears generation 1. */
    assert_int_equal(rdzv_client_replace(w.a[2].c, 4, NULL, "worker_failure"), 0);
    for (int i = 0; i < 3; i++)
        want_generations[i] = 1;
    run_until(&w, generations_in);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(w.a[i].last_generation, 1);
        assert_string_equal(w.a[i].replaced, "4");
        assert_string_equal(w.a[i].gen_node, "node2");
        assert_int_equal(w.a[i].gen_count, 1); /* one of the job's counted restarts */
        assert_int_equal(w.a[i].restarts, 0);  /* the round goes on */
    }

    /* Node 1 within the settle window: refused, to node 1 alone. */
    assert_int_equal(rdzv_client_replace(w.a[1].c, 1, NULL, "worker_failure"), 0);
    want_generations[1] = 2;
    run_until(&w, generations_in);
    assert_int_equal(w.a[1].last_generation, 0);
    assert_non_null(strstr(w.a[1].refused, "a second failure this soon"));
    /* A rank that is not the node's own: refused. */
    assert_int_equal(rdzv_client_replace(w.a[0].c, 3, NULL, "worker_failure"), 0);
    want_generations[0] = 2;
    run_until(&w, generations_in);
    assert_int_equal(w.a[0].last_generation, 0);
    assert_non_null(strstr(w.a[0].refused, "rank 3 is not one of this node's (0..0)"));
    assert_int_equal(w.a[2].generations, 1);

    /* Past the window, node 1's next failure is granted: generation 2. */
    bool settled = false;
    uv_timer_t t;
    uv_timer_init(&w.loop, &t);
    t.data = &settled;
    uv_timer_start(&t, on_settled, RDZV_REPLACE_SETTLE_MS + 100, 0);
    while (!settled)
        uv_run(&w.loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    assert_int_equal(rdzv_client_replace(w.a[1].c, 2, NULL, "worker_failure"), 0);
    want_generations[0] = 3;
    want_generations[1] = 3;
    want_generations[2] = 2;
    run_until(&w, generations_in);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(w.a[i].last_generation, 2);
        assert_int_equal(w.a[i].gen_count, 2);
        assert_string_equal(w.a[i].replaced, "2");
        assert_int_equal(w.a[i].restarts, 0);
    }

    /* A blame goes to the node that runs the rank, and nowhere else; one
     * about a node's own rank is dropped. */
    assert_int_equal(rdzv_client_blame(w.a[2].c, 5, 2), 0); /* (dropped) */
    assert_int_equal(rdzv_client_blame(w.a[0].c, 4, 2), 0);
    while (w.a[2].blames < 1)
        uv_run(&w.loop, UV_RUN_ONCE);
    assert_int_equal(w.a[2].blame_rank, 4);
    assert_int_equal(w.a[2].blame_gen, 2);
    assert_string_equal(w.a[2].blame_from, "node0");
    assert_int_equal(rdzv_client_blame(w.a[2].c, 0, 2), 0);
    while (w.a[0].blames < 1)
        uv_run(&w.loop, UV_RUN_ONCE);
    assert_int_equal(w.a[0].blame_rank, 0);
    assert_string_equal(w.a[0].blame_from, "node2");
    assert_int_equal(w.a[1].blames, 0);
    assert_int_equal(w.a[2].blames, 1); /* its own rank 5 was not sent back */

    /* A worker failure of the group: a new round, whose generation starts
     * again at 0; a replace about the old round is refused. */
    for (int i = 0; i < 3; i++)
        w.a[i].rejoin_on_restart = true;
    uint64_t old = w.a[0].round.round;
    assert_int_equal(rdzv_client_report_failure(w.a[0].c, "exit 1"), 0);
    want_joins = 2;
    run_until(&w, all_joined);
    assert_int_equal(w.a[0].round.generation, 0);
    assert_true(w.a[0].round.round > old);
    assert_int_equal(w.a[0].round.restart_count, 3); /* two granted, one failure */
    assert_int_equal(rdzv_client_replace(w.a[2].c, 5, NULL, "worker_failure"), 0);
    for (int i = 0; i < 3; i++)
        want_generations[i] = w.a[i].generations + 1;
    run_until(&w, generations_in);
    assert_int_equal(w.a[2].last_generation, 1); /* a new group: generation 1 again */
    world_close(&w);
    assert_int_equal(w.clients_gone, 3);
}

/* ---- drain: the hosting agent waits for the other nodes to go ---- */

static int drained;
static void on_drained(void *arg)
{
    (void)arg;
    drained++;
}

/* The drain's callback comes from a timer; once no connection is left,
 * UV_RUN_ONCE would then block until the guard: turn the loop without
 * blocking instead. */
static void run_until_drained(struct world *w)
{
    while (drained == 0)
        uv_run(&w->loop, UV_RUN_NOWAIT);
}

static void test_drain(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, NULL);
    for (int i = 0; i < 2; i++) {
        start_agent(&w, i, NULL, 2, 2);
        assert_int_equal(rdzv_client_join(w.a[i].c, 0, on_join, &w.a[i]), 0);
    }
    want_joins = 1;
    run_until(&w, all_joined);

    /* Both nodes are connected: the drain waits; a second one is refused. */
    drained = 0;
    assert_int_equal(rdzv_server_drain(w.srv, "job", 10000, on_drained, NULL), 0);
    assert_int_equal(rdzv_server_drain(w.srv, "job", 10000, on_drained, NULL), CDDP_ESTATE);
    for (int k = 0; k < 20; k++)
        uv_run(&w.loop, UV_RUN_NOWAIT);
    assert_int_equal(drained, 0);
    /* Another run's connections do not count. */
    rdzv_client_close(w.a[0].c, on_client_gone, &w);
    w.a[0].c = NULL;
    uv_run(&w.loop, UV_RUN_NOWAIT);
    assert_int_equal(drained, 0);
    rdzv_client_close(w.a[1].c, on_client_gone, &w);
    w.a[1].c = NULL;
    uint64_t t0 = uv_now(&w.loop);
    run_until_drained(&w);
    assert_int_equal(drained, 1);
    assert_true(uv_now(&w.loop) - t0 < 5000); /* the last connection, not the timeout */

    /* A run that never existed is drained at once; one that stays connected
     * is given up on at the timeout. */
    drained = 0;
    assert_int_equal(rdzv_server_drain(w.srv, "nobody", 10000, on_drained, NULL), 0);
    assert_int_equal(drained, 0); /* never inside the call */
    run_until_drained(&w);
    start_agent(&w, 2, NULL, 2, 2);
    assert_int_equal(rdzv_client_join(w.a[2].c, 0, on_join, &w.a[2]), 0);
    for (int k = 0; k < 20; k++)
        uv_run(&w.loop, UV_RUN_NOWAIT);
    drained = 0;
    assert_int_equal(rdzv_server_drain(w.srv, "job", 50, on_drained, NULL), 0);
    run_until_drained(&w);
    assert_non_null(w.a[2].c);
    /* A drain pending at shutdown is called first. */
    drained = 0;
    assert_int_equal(rdzv_server_drain(w.srv, "job", 10000, on_drained, NULL), 0);
    world_close(&w);
    assert_int_equal(drained, 1);
}

struct store_op {
    int done;
    int status;
    char value[64];
    size_t len;
    int64_t number;
};

static void on_store(struct rdzv_client *c, int status, const struct rdzv_store_result *r,
                     void *arg)
{
    (void)c;
    struct store_op *op = arg;
    op->done++;
    op->status = status;
    op->len = r->len;
    if (r->value && r->len < sizeof(op->value))
        memcpy(op->value, r->value, r->len + 1);
    op->number = r->number;
}

static void on_barrier(struct rdzv_client *c, int status, void *arg)
{
    (void)c;
    struct store_op *op = arg;
    op->done++;
    op->status = status;
}

static struct store_op *pending_op;
static bool op_done(struct world *w)
{
    (void)w;
    return pending_op->done > 0;
}

static void wait_op(struct world *w, struct store_op *op)
{
    pending_op = op;
    run_until(w, op_done);
}

static void test_store_ops_and_barrier(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, NULL);
    for (int i = 0; i < 3; i++)
        start_agent(&w, i, NULL, 3, 3);
    /* Requests made before the connection is up are queued behind hello. */
    struct store_op get = {0}, set = {0}, add = {0}, cas = {0}, miss = {0}, tmo = {0};
    assert_int_equal(rdzv_client_get(w.a[0].c, "port", 5000, on_store, &get), 0);
    assert_int_equal(rdzv_client_set(w.a[1].c, "port", "29500", 5, on_store, &set), 0);
    wait_op(&w, &get);
    assert_int_equal(get.status, 0);
    assert_string_equal(get.value, "29500");
    wait_op(&w, &set);
    assert_int_equal(set.status, 0);
    assert_int_equal(rdzv_client_add(w.a[2].c, "n", 41, on_store, &add), 0);
    wait_op(&w, &add);
    assert_int_equal(add.number, 41);
    assert_int_equal(rdzv_client_compare_set(w.a[2].c, "port", "29500", 5, "1", 1, on_store, &cas),
                     0);
    wait_op(&w, &cas);
    assert_string_equal(cas.value, "1");
    assert_int_equal(rdzv_client_get(w.a[0].c, "nope", -1, on_store, &miss), 0);
    wait_op(&w, &miss);
    assert_int_equal(miss.status, CDDP_ENOTFOUND);
    const char *keys[] = {"never"};
    assert_int_equal(rdzv_client_wait(w.a[0].c, keys, 1, 100, on_store, &tmo), 0);
    wait_op(&w, &tmo);
    assert_int_equal(tmo.status, CDDP_ETIMEOUT);

    /* The exit barrier: nobody passes until all three are in. */
    struct store_op b[3] = {{0}};
    assert_int_equal(rdzv_client_barrier(w.a[0].c, "exit/0", 3, 5000, on_barrier, &b[0]), 0);
    assert_int_equal(rdzv_client_barrier(w.a[1].c, "exit/0", 3, 5000, on_barrier, &b[1]), 0);
    for (int k = 0; k < 50; k++)
        uv_run(&w.loop, UV_RUN_NOWAIT);
    assert_int_equal(b[0].done + b[1].done, 0);
    assert_int_equal(rdzv_client_barrier(w.a[2].c, "exit/0", 3, 5000, on_barrier, &b[2]), 0);
    for (int i = 0; i < 3; i++) {
        wait_op(&w, &b[i]);
        assert_int_equal(b[i].status, 0);
    }
    /* A barrier short of members times out. */
    struct store_op lone = {0};
    assert_int_equal(rdzv_client_barrier(w.a[0].c, "exit/1", 3, 150, on_barrier, &lone), 0);
    wait_op(&w, &lone);
    assert_int_equal(lone.status, CDDP_ETIMEOUT);

    /* Pending callbacks get -ECANCELED when the client closes. */
    struct store_op cancelled = {0};
    assert_int_equal(rdzv_client_wait(w.a[0].c, keys, 1, -1, on_store, &cancelled), 0);
    rdzv_client_close(w.a[0].c, on_client_gone, &w);
    w.a[0].c = NULL;
    assert_int_equal(cancelled.done, 1);
    assert_int_equal(cancelled.status, -ECANCELED);
    world_close(&w);
}

static void test_token(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, "s3cret");
    start_agent(&w, 0, NULL, 1, 1);
    start_agent(&w, 1, "wrong", 1, 1);
    start_agent(&w, 2, "s3cret", 1, 2);
    for (int i = 0; i < 3; i++)
        assert_int_equal(rdzv_client_join(w.a[i].c, 0, on_join, &w.a[i]), 0);
    want_joins = 1;
    run_until(&w, all_joined);
    assert_int_equal(w.a[0].status, CDDP_ETOKEN);
    assert_non_null(strstr(rdzv_client_last_error(w.a[0].c), "requires a join token"));
    assert_int_equal(w.a[1].status, CDDP_ETOKEN);
    assert_non_null(strstr(rdzv_client_last_error(w.a[1].c), "does not match"));
    /* Refused clients get one notification (the join), not an extra event. */
    for (int k = 0; k < 20; k++)
        uv_run(&w.loop, UV_RUN_NOWAIT);
    assert_int_equal(w.a[0].errors, 0);
    assert_int_equal(rdzv_client_join(w.a[0].c, 0, on_join, &w.a[0]), CDDP_ECLOSED);
    /* With the token: last call (200 ms) completes a 1-node round. */
    assert_int_equal(w.a[2].status, 0);
    assert_int_equal(w.a[2].round.nnodes, 1);
    world_close(&w);
}

static void start_server_later(uv_timer_t *t)
{
    struct world *w = t->data;
    char err[256];
    struct rdzv_server_options o = {.host = "127.0.0.1", .port = w->port};
    assert_int_equal(rdzv_server_start(&w->loop, &o, &w->srv, err, sizeof(err)), 0);
    uv_close((uv_handle_t *)t, NULL);
}

static void test_connect_retry_and_timeout(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, NULL);
    /* Free the port, start the agent first, then the server 300 ms later. */
    rdzv_server_shutdown(w.srv, NULL, on_server_gone, &w);
    w.srv = NULL;
    while (w.server_gone == 0)
        uv_run(&w.loop, UV_RUN_ONCE);
    w.server_gone = 0;
    start_agent(&w, 0, NULL, 1, 1);
    assert_int_equal(rdzv_client_join(w.a[0].c, 0, on_join, &w.a[0]), 0);
    uv_timer_t later;
    uv_timer_init(&w.loop, &later);
    later.data = &w;
    uv_timer_start(&later, start_server_later, 300, 0);
    want_joins = 1;
    run_until(&w, all_joined);
    assert_int_equal(w.a[0].status, 0);
    world_close(&w);

    /* Nobody serves: the join fails with ETIMEOUT after connect_timeout. */
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct agent a = {0};
    char err[256];
    struct rdzv_client_options o = {.host = "127.0.0.1",
                                    .port = w.port,
                                    .run_id = "j",
                                    .nproc = 1,
                                    .min_nodes = 1,
                                    .max_nodes = 1,
                                    .connect_timeout_ms = 250};
    uint64_t t0 = uv_hrtime();
    assert_int_equal(rdzv_client_start(&loop, &o, on_event, &a, &a.c, err, sizeof(err)), 0);
    assert_int_equal(rdzv_client_join(a.c, 0, on_join, &a), 0);
    while (a.joins_done == 0)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(a.status, CDDP_ETIMEOUT);
    assert_true(uv_hrtime() - t0 >= 200 * 1000000ull);
    assert_non_null(strstr(rdzv_client_last_error(a.c), "kept trying"));
    rdzv_client_close(a.c, NULL, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);

    /* Bad options are refused at once. */
    o.max_nodes = 0;
    assert_int_equal(rdzv_client_start(&loop, &o, on_event, &a, &a.c, err, sizeof(err)),
                     CDDP_ECONFIG);
}

/* ---- a server that dies, freezes, comes back: a child process ---- */

static bool port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                              .sin_port = htons((uint16_t)port)};
    bool ok = connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0;
    close(fd);
    return ok;
}

/* cddp's server on 127.0.0.1:port in a child process, on a loop of its own. */
static pid_t server_child(int port)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uv_loop_t loop;
        struct rdzv_server *srv;
        char err[256];
        uv_loop_init(&loop);
        struct rdzv_server_options o = {.host = "127.0.0.1", .port = port};
        if (rdzv_server_start(&loop, &o, &srv, err, sizeof(err)) != 0)
            _exit(3);
        uv_run(&loop, UV_RUN_DEFAULT);
        _exit(0);
    }
    for (int i = 0; i < 500 && !port_open(port); i++)
        usleep(10000);
    assert_true(port_open(port));
    return pid;
}

static void kill_child(pid_t pid)
{
    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
}

static void start_agent_conf(struct world *w, int i, int min, int max, const char *conf,
                             uint64_t reconnect_ms)
{
    char err[256];
    char id[32];
    struct rdzv_conf rc;
    rdzv_conf_init(&rc);
    assert_int_equal(rdzv_conf_parse(&rc, conf, err, sizeof(err)), 0);
    snprintf(id, sizeof(id), "node%d", i);
    struct rdzv_client_options o = {.host = "127.0.0.1",
                                    .port = w->port,
                                    .run_id = "job",
                                    .node_id = id,
                                    .nproc = 1,
                                    .min_nodes = min,
                                    .max_nodes = max,
                                    .conf = &rc,
                                    .connect_timeout_ms = 5000,
                                    .reconnect_timeout_ms = reconnect_ms};
    assert_int_equal(
        rdzv_client_start(&w->loop, &o, on_event, &w->a[i], &w->a[i].c, err, sizeof(err)), 0);
}

static void on_nothing(uv_timer_t *t)
{
    (void)t;
}

/* The loop runs for ms (the clients do what they do meanwhile). */
static void run_for(struct world *w, uint64_t ms)
{
    uv_timer_t t;
    uv_timer_init(&w->loop, &t);
    uint64_t end = uv_now(&w->loop) + ms;
    uv_timer_start(&t, on_nothing, ms, 0);
    while (uv_now(&w->loop) < end)
        uv_run(&w->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&w->loop, UV_RUN_NOWAIT);
}

static int want_disconnects;
static bool all_disconnected(struct world *w)
{
    for (int i = 0; i < NCLI; i++) {
        if (w->a[i].c && w->a[i].disconnects < want_disconnects)
            return false;
    }
    return true;
}

/* Two nodes in round 1 of a server in a child process. */
static pid_t two_in_a_round(struct world *w, const char *conf, uint64_t reconnect_ms)
{
    memset(w, 0, sizeof(*w));
    uv_loop_init(&w->loop);
    uv_timer_init(&w->loop, &w->guard);
    uv_timer_start(&w->guard, on_guard, 20000, 0);
    uv_unref((uv_handle_t *)&w->guard);
    w->port = unit_free_port();
    pid_t pid = server_child(w->port);
    for (int i = 0; i < 2; i++) {
        w->a[i].w = w;
        w->a[i].waiting = -1;
        start_agent_conf(w, i, 2, 2, conf, reconnect_ms);
        w->a[i].rejoin_on_restart = true;
        assert_int_equal(rdzv_client_join(w->a[i].c, 0, on_join, &w->a[i]), 0);
    }
    want_joins = 1;
    run_until(w, all_joined);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(w->a[i].status, 0);
        assert_int_equal(w->a[i].round.round, 1);
        assert_true(rdzv_client_connected(w->a[i].c));
    }
    return pid;
}

/* The first connection breaks before its welcome (something accepted it and
 * hung up): the client tries again, join included, within connect_timeout. */
static void test_first_connection_breaks(void **state)
{
    (void)state;
    struct world w;
    memset(&w, 0, sizeof(w));
    uv_loop_init(&w.loop);
    uv_timer_init(&w.loop, &w.guard);
    uv_timer_start(&w.guard, on_guard, 20000, 0);
    uv_unref((uv_handle_t *)&w.guard);
    w.port = unit_free_port();
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sin = {.sin_family = AF_INET,
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                              .sin_port = htons((uint16_t)w.port)};
    assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(lfd, 8), 0);
    w.a[0].w = &w;
    start_agent_conf(&w, 0, 1, 1, "last_call_timeout=0", 0);
    assert_int_equal(rdzv_client_join(w.a[0].c, 0, on_join, &w.a[0]), 0);
    int cfd = -1;
    while ((cfd = accept(lfd, NULL, NULL)) < 0)
        uv_run(&w.loop, UV_RUN_NOWAIT);
    char buf[4096];
    while (recv(cfd, buf, sizeof(buf), MSG_DONTWAIT) <= 0) /* hello and join arrived */
        uv_run(&w.loop, UV_RUN_NOWAIT);
    close(cfd);
    close(lfd);
    char err[256];
    struct rdzv_server_options o = {.host = "127.0.0.1", .port = w.port};
    assert_int_equal(rdzv_server_start(&w.loop, &o, &w.srv, err, sizeof(err)), 0);
    want_joins = 1;
    run_until(&w, all_joined);
    assert_int_equal(w.a[0].status, 0);
    assert_int_equal(w.a[0].round.nnodes, 1);
    assert_int_equal(w.a[0].disconnects, 0); /* never connected, as far as the agent knows */
    world_close(&w);
}

static void test_reconnect_after_server_restart(void **state)
{
    (void)state;
    struct world w;
    /* resume_timeout=0: the clients do not re-register their round (as
     * older clients did not; test_server_restart_rebuilds_the_round is the
     * default). */
    pid_t pid = two_in_a_round(&w, "keep_alive_interval=0.05,read_timeout=2,resume_timeout=0", 0);
    /* A request in flight when the server dies fails; the loss is seen. */
    struct store_op lost = {0};
    const char *keys[] = {"never"};
    assert_int_equal(rdzv_client_wait(w.a[0].c, keys, 1, -1, on_store, &lost), 0);
    run_for(&w, 50);
    kill_child(pid);
    want_disconnects = 1;
    run_until(&w, all_disconnected);
    assert_int_equal(lost.done, 1);
    assert_int_equal(lost.status, -ECONNRESET);
    assert_false(rdzv_client_connected(w.a[0].c));
    /* Asked while disconnected: waits, and goes out after the reconnection. */
    struct store_op set = {0}, get = {0};
    assert_int_equal(rdzv_client_set(w.a[0].c, "k", "v", 1, on_store, &set), 0);
    run_for(&w, 100); /* a few refused attempts */
    assert_int_equal(set.done, 0);
    /* The server comes back without the run: the nodes cannot resume their
     * round, so they restart (not counted) and form the next one, numbered
     * on from where they were. */
    pid = server_child(w.port);
    want_joins = 2;
    run_until(&w, all_joined);
    for (int i = 0; i < 2; i++) {
        struct agent *a = &w.a[i];
        assert_int_equal(a->status, 0);
        assert_int_equal(a->round.round, 2);
        assert_int_equal(a->round.nnodes, 2);
        assert_int_equal(a->restarts, 1);
        assert_string_equal(a->restart_reason, "resume_failed");
        assert_false(a->last_counted);
        assert_int_equal(a->errors, 0);
        assert_int_equal(rdzv_client_reconnects(a->c), 1);
    }
    wait_op(&w, &set);
    assert_int_equal(set.status, 0);
    assert_int_equal(rdzv_client_get(w.a[1].c, "k", 1000, on_store, &get), 0);
    wait_op(&w, &get);
    assert_string_equal(get.value, "v");
    kill_child(pid);
    world_close(&w);
}

static bool all_resumed(struct world *w)
{
    for (int i = 0; i < NCLI; i++) {
        if (w->a[i].c && w->a[i].resumed < 1)
            return false;
    }
    return true;
}

/* The server dies and a new one comes up on the port: the clients
 * re-register their round, which the new server rebuilds; nothing
 * restarts, and the rebuilt round is a live one (a failure restarts it). */
static void test_server_restart_rebuilds_the_round(void **state)
{
    (void)state;
    struct world w;
    pid_t pid = two_in_a_round(&w, "keep_alive_interval=0.05,read_timeout=2", 0);
    kill_child(pid);
    want_disconnects = 1;
    run_until(&w, all_disconnected);
    pid = server_child(w.port);
    run_until(&w, all_resumed);
    run_for(&w, 300); /* past resume_timeout (0.15 s): still nothing */
    for (int i = 0; i < 2; i++) {
        struct agent *a = &w.a[i];
        assert_int_equal(a->resumed, 1);
        assert_int_equal(a->restarts, 0);
        assert_int_equal(a->errors, 0);
        assert_int_equal(a->round.round, 1);
        assert_int_equal(rdzv_client_reconnects(a->c), 1);
    }
    assert_int_equal(rdzv_client_report_failure(w.a[1].c, "exit 1"), 0);
    want_joins = 2;
    run_until(&w, all_joined);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(w.a[i].round.round, 2);
        assert_int_equal(w.a[i].round.nnodes, 2);
        assert_int_equal(w.a[i].round.restart_count, 1);
        assert_true(w.a[i].last_counted);
    }
    kill_child(pid);
    world_close(&w);
}

static void test_frozen_server(void **state)
{
    (void)state;
    struct world w;
    pid_t pid = two_in_a_round(
        &w, "keep_alive_interval=0.05,keep_alive_max_attempt=40,read_timeout=0.5,resume_timeout=0",
        0);
    /* Frozen for less than read_timeout: nobody notices. */
    kill(pid, SIGSTOP);
    run_for(&w, 200);
    kill(pid, SIGCONT);
    run_for(&w, 300);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(w.a[i].disconnects, 0);
        assert_int_equal(w.a[i].restarts, 0);
    }
    /* Frozen for longer: each client gives the connection up (and the
     * attempts that follow, which get no welcome), then reconnects once the
     * server wakes; it removed them meanwhile, so a new round forms. */
    kill(pid, SIGSTOP);
    want_disconnects = 1;
    run_until(&w, all_disconnected);
    run_for(&w, 700);
    kill(pid, SIGCONT);
    want_joins = 2;
    run_until(&w, all_joined);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(w.a[i].status, 0);
        assert_true(w.a[i].round.round >= 2);
        assert_int_equal(w.a[i].round.round, w.a[0].round.round);
        assert_int_equal(w.a[i].disconnects, 1);
        assert_int_equal(w.a[i].errors, 0);
    }
    kill_child(pid);
    world_close(&w);
}

static void test_reconnect_gives_up(void **state)
{
    (void)state;
    struct world w;
    pid_t pid = two_in_a_round(&w, "keep_alive_interval=0.05", 300);
    kill_child(pid);
    while (w.a[0].errors == 0 || w.a[1].errors == 0)
        uv_run(&w.loop, UV_RUN_ONCE);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(w.a[i].disconnects, 1);
        assert_int_equal(w.a[i].last_error, CDDP_ETIMEOUT);
        const char *e = rdzv_client_last_error(w.a[i].c);
        assert_non_null(strstr(e, "closed by the server"));
        assert_non_null(strstr(e, "could not reconnect within 0.3 s"));
        assert_int_equal(rdzv_client_join(w.a[i].c, 0, on_join, &w.a[i]), CDDP_ECLOSED);
    }
    world_close(&w);
}

static void test_wait_list_in_heartbeat_answers(void **state)
{
    (void)state;
    struct world w;
    world_init(&w, NULL);
    for (int i = 0; i < 3; i++) {
        w.a[i].waiting = -1;
        start_agent_conf(&w, i, 2, 2, "keep_alive_interval=0.02", 0);
        assert_int_equal(rdzv_client_join(w.a[i].c, 0, on_join, &w.a[i]), 0);
    }
    /* Two form the round; the third waits for a place. */
    while (w.a[0].joins_done + w.a[1].joins_done + w.a[2].joins_done < 2 || w.a[0].waiting != 1 ||
           w.a[1].waiting != 1)
        uv_run(&w.loop, UV_RUN_ONCE);
    assert_int_equal(rdzv_client_waiting(w.a[0].c), 1);
    int waiter = w.a[0].joins_done == 0 ? 0 : w.a[1].joins_done == 0 ? 1 : 2;
    int member = waiter == 0 ? 1 : 0;
    /* It goes: the members hear the list is empty again. */
    rdzv_client_close(w.a[waiter].c, on_client_gone, &w);
    w.a[waiter].c = NULL;
    while (w.a[member].waiting != 0)
        uv_run(&w.loop, UV_RUN_ONCE);
    world_close(&w);
}

/* ---- the blocking store client, from threads ---- */

struct waiter_arg {
    int port;
    int rc;
    char value[32];
};

static void *waiter_thread(void *p)
{
    struct waiter_arg *wa = p;
    struct rdzv_store_client *c;
    char err[256];
    struct rdzv_store_client_options o = {.connect_timeout_ms = 5000};
    wa->rc = rdzv_store_connect("127.0.0.1", wa->port, &o, &c, err, sizeof(err));
    if (wa->rc)
        return NULL;
    void *v;
    size_t n;
    wa->rc = rdzv_store_get(c, "late", &v, &n, 5000);
    if (wa->rc == 0) {
        snprintf(wa->value, sizeof(wa->value), "%s", (char *)v);
        free(v);
    }
    rdzv_store_close(c);
    return NULL;
}

static void test_blocking_store(void **state)
{
    (void)state;
    struct rdzv_store_thread *srv;
    int port;
    char err[256];
    assert_int_equal(rdzv_store_thread_start("127.0.0.1", 0, NULL, &srv, &port, err, sizeof(err)),
                     0);
    assert_true(port > 0);

    /* A second server on the same port fails with a clear reason. */
    struct rdzv_store_thread *dup;
    assert_int_not_equal(
        rdzv_store_thread_start("127.0.0.1", port, NULL, &dup, NULL, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "address already in use"));

    /* A key set by a client that then went away is still there for the next. */
    struct rdzv_store_client *early;
    assert_int_equal(rdzv_store_connect("127.0.0.1", port, NULL, &early, err, sizeof(err)), 0);
    assert_int_equal(rdzv_store_set(early, "early", "bird", 4), 0);
    rdzv_store_close(early);
    assert_int_equal(rdzv_store_connect("127.0.0.1", port, NULL, &early, err, sizeof(err)), 0);
    void *ev;
    size_t evn;
    assert_int_equal(rdzv_store_get(early, "early", &ev, &evn, 1000), 0);
    assert_string_equal(ev, "bird");
    free(ev);
    rdzv_store_close(early);

    struct waiter_arg wa = {.port = port};
    pthread_t th;
    pthread_create(&th, NULL, waiter_thread, &wa);

    struct rdzv_store_client *c;
    assert_int_equal(rdzv_store_connect("127.0.0.1", port, NULL, &c, err, sizeof(err)), 0);
    unsigned char bin[256];
    for (int i = 0; i < 256; i++)
        bin[i] = (unsigned char)i;
    assert_int_equal(rdzv_store_set(c, "nccl/id", bin, sizeof(bin)), 0);
    void *v;
    size_t n;
    assert_int_equal(rdzv_store_get(c, "nccl/id", &v, &n, -1), 0);
    assert_int_equal(n, 256);
    assert_memory_equal(v, bin, 256);
    free(v);
    assert_int_equal(rdzv_store_get(c, "missing", &v, &n, -1), CDDP_ENOTFOUND);
    assert_null(v);
    assert_int_equal(rdzv_store_get(c, "missing", &v, &n, 50), CDDP_ETIMEOUT);
    const char *keys[] = {"missing"};
    assert_int_equal(rdzv_store_wait(c, keys, 1, 50), CDDP_ETIMEOUT);
    assert_non_null(strstr(rdzv_store_last_error(c), "timed out"));
    int64_t num;
    assert_int_equal(rdzv_store_add(c, "n", 2, &num), 0);
    assert_int_equal(rdzv_store_add(c, "n", 3, &num), 0);
    assert_int_equal(num, 5);
    assert_int_equal(rdzv_store_add(c, "nccl/id", 1, &num), CDDP_EPARSE);
    void *cur;
    size_t cl;
    assert_int_equal(rdzv_store_compare_set(c, "n", "5", 1, "x", 1, &cur, &cl), 0);
    assert_int_equal(cl, 1);
    assert_memory_equal(cur, "x", 1);
    free(cur);

    /* The waiting thread gets the key when we set it. */
    assert_int_equal(rdzv_store_set(c, "late", "hello", 5), 0);
    pthread_join(th, NULL);
    assert_int_equal(wa.rc, 0);
    assert_string_equal(wa.value, "hello");

    /* Stopping the server: the client sees a closed connection, then ECLOSED. */
    rdzv_store_thread_stop(srv);
    assert_true(rdzv_store_set(c, "k", "v", 1) < 0);
    assert_int_equal(rdzv_store_set(c, "k", "v", 1), CDDP_ECLOSED);
    rdzv_store_close(c);

    /* Nobody serves: connect gives up after connect_timeout with the reason. */
    struct rdzv_store_client_options o = {.connect_timeout_ms = 200};
    assert_int_equal(rdzv_store_connect("127.0.0.1", port, &o, &c, err, sizeof(err)),
                     -ECONNREFUSED);
    assert_non_null(strstr(err, "kept trying"));
    assert_int_equal(rdzv_store_connect("no-such-host.invalid", port, &o, &c, err, sizeof(err)),
                     CDDP_EPARSE);
    assert_non_null(strstr(err, "cannot resolve"));
}

static void test_blocking_store_token(void **state)
{
    (void)state;
    struct rdzv_store_thread *srv;
    int port;
    char err[256];
    assert_int_equal(rdzv_store_thread_start("127.0.0.1", 0, "tok", &srv, &port, err, sizeof(err)),
                     0);
    struct rdzv_store_client *c;
    struct rdzv_store_client_options o = {.token = "bad"};
    assert_int_equal(rdzv_store_connect("127.0.0.1", port, &o, &c, err, sizeof(err)), CDDP_ETOKEN);
    assert_non_null(strstr(err, "refused"));
    o.token = "tok";
    assert_int_equal(rdzv_store_connect("127.0.0.1", port, &o, &c, err, sizeof(err)), 0);
    assert_int_equal(rdzv_store_set(c, "a", "b", 1), 0);
    rdzv_store_close(c);
    rdzv_store_thread_stop(srv);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_restart_rejoin),
        cmocka_unit_test(test_replace_grants_and_refuses),
        cmocka_unit_test(test_store_ops_and_barrier),
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_connect_retry_and_timeout),
        cmocka_unit_test(test_drain),
        cmocka_unit_test(test_wait_list_in_heartbeat_answers),
        cmocka_unit_test(test_first_connection_breaks),
        cmocka_unit_test(test_reconnect_after_server_restart),
        cmocka_unit_test(test_server_restart_rebuilds_the_round),
        cmocka_unit_test(test_frozen_server),
        cmocka_unit_test(test_reconnect_gives_up),
        cmocka_unit_test(test_blocking_store),
        cmocka_unit_test(test_blocking_store_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
