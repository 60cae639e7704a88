/*
 * etcd_bench.c: etcd-bench, N simulated agents in one process (one libuv
 * loop, the real etcd-v3 backend each: agent/rdzv_etcd.c over
 * rendezvous/etcd.c) against real etcd members. Used by
 * tests/bench/etcd_bench.sh; prints figures, never passes or fails on time.
 *
 *   etcd-bench --endpoints H:P[,H:P] --agents N [--timeout S] [--run-id ID]
 *
 * All N agents join one run (--nnodes=N-1:N, so the first round completes
 * at N and the next one at N-1 without a last call). Round: from the first
 * join to the last agent holding its round (checked: node ranks a
 * permutation of 0..N-1, one world size, one master). Then the agent of
 * node rank 0 leaves (its state op, then its lease revoked: the same
 * "lose" path a lease expiry takes, minus the TTL wait, which is the TTL by
 * construction) and the survivors rejoin when told: new round is until the
 * last survivor holds its round. Then the run is closed. One JSON line;
 * exit 0 if every check passed, 1 if not (or the time ran out), 2 on bad
 * usage.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <uv.h>

#include "agent/rdzv.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strutil.h"
#include "rendezvous/conf.h"

struct sim {
    struct agent_rdzv *r;
    int idx;
    uint64_t round;
    int rank, world;
    char master[300];
    bool gone, closed;
};

static struct sim *sims;
static int nagents, have_round, phase, failures;
static uint64_t t_start, t_round, t_loss, t_new;
static int victim = -1;
static uv_loop_t *loop;
static uv_timer_t deadline;
static int open_agents;

static void on_round(struct agent_rdzv *r, int status, const struct agent_round *round,
                     const char *reason);

static void join(struct sim *s)
{
    struct agent_join j = {.local_world_size = 1, .role = "default", .master_port = 20000 + s->idx};
    if (s->r->ops->join(s->r, &j, on_round) != 0)
        failures++;
}

static void closed_cb(struct agent_rdzv *r)
{
    (void)r;
    if (--open_agents == 0)
        uv_close((uv_handle_t *)&deadline, NULL);
}

static void close_all(void)
{
    for (int i = 0; i < nagents; i++) {
        if (!sims[i].gone) {
            sims[i].gone = true;
            sims[i].r->ops->close(sims[i].r, AGENT_RDZV_END_JOB, "benchmark done", closed_cb);
        }
    }
}

static void check_round(int n, int skip)
{
    char *seen = calloc((size_t)n, 1);
    const char *master = NULL;
    for (int i = 0; i < nagents; i++) {
        if (i == skip)
            continue;
        struct sim *s = &sims[i];
        if (s->rank < 0 || s->rank >= n || seen[s->rank] || s->world != n ||
            (master && strcmp(master, s->master) != 0))
            failures++;
        else
            seen[s->rank] = 1;
        master = s->master;
    }
    free(seen);
}

static void on_round(struct agent_rdzv *r, int status, const struct agent_round *round,
                     const char *reason)
{
    struct sim *s = r->data;
    if (status != 0) {
        fprintf(stderr, "etcd-bench: agent %d: %s\n", s->idx, reason ? reason : "?");
        failures++;
        close_all();
        return;
    }
    s->round = round->round;
    s->rank = round->node_rank;
    s->world = round->world_size;
    snprintf(s->master, sizeof(s->master), "%s:%d", round->master_addr, round->master_port);
    if (++have_round < (phase == 0 ? nagents : nagents - 1))
        return;
    if (phase == 0) {
        t_round = cddp_mono_ns();
        check_round(nagents, -1);
        phase = 1;
        have_round = 0;
        for (int i = 0; i < nagents; i++) {
            if (sims[i].rank == 0)
                victim = i;
        }
        t_loss = cddp_mono_ns();
        sims[victim].gone = true;
        sims[victim].r->ops->close(sims[victim].r, AGENT_RDZV_LEAVE, "benchmark: node lost",
                                   closed_cb);
        return;
    }
    t_new = cddp_mono_ns();
    check_round(nagents - 1, victim);
    close_all();
}

static void on_restart(struct agent_rdzv *r, const char *reason, bool counted)
{
    (void)reason, (void)counted;
    struct sim *s = r->data;
    if (!s->gone)
        join(s);
}

static void on_closed(struct agent_rdzv *r, int status, const char *reason)
{
    struct sim *s = r->data;
    if (status != 0) {
        fprintf(stderr, "etcd-bench: agent %d lost the rendezvous: %s\n", s->idx, reason);
        failures++;
    }
}

static void on_deadline(uv_timer_t *t)
{
    (void)t;
    fprintf(stderr, "etcd-bench: out of time (phase %d, %d rounds)\n", phase, have_round);
    failures++;
    close_all();
}

int main(int argc, char **argv)
{
    const char *endpoints = NULL, *run_id = NULL;
    long n = 0, timeout = 300;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--endpoints") == 0)
            endpoints = argv[i + 1];
        else if (strcmp(argv[i], "--agents") == 0 &&
                 cddp_parse_long(argv[i + 1], 2, 100000, &n) == 0)
            ;
        else if (strcmp(argv[i], "--timeout") == 0 &&
                 cddp_parse_long(argv[i + 1], 1, 86400, &timeout) == 0)
            ;
        else if (strcmp(argv[i], "--run-id") == 0)
            run_id = argv[i + 1];
        else
            endpoints = NULL, n = 0;
    }
    if (endpoints == NULL || n < 2) {
        fprintf(stderr, "usage: etcd-bench --endpoints H:P[,H:P] --agents N (>= 2) "
                        "[--timeout S] [--run-id ID]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    cddp_log_init("etcd-bench");
    cddp_log_set_level(CDDP_LOG_ERROR);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    char rid[64];
    snprintf(rid, sizeof(rid), "bench-%llu", (unsigned long long)cddp_mono_ns());
    loop = uv_default_loop();
    nagents = (int)n;
    sims = calloc((size_t)n, sizeof(*sims));
    struct rdzv_conf conf;
    rdzv_conf_init(&conf);
    conf.join_timeout_ms = (uint64_t)timeout * 1000;
    uv_timer_init(loop, &deadline);
    uv_timer_start(&deadline, on_deadline, (uint64_t)timeout * 1000, 0);
    t_start = cddp_mono_ns();
    for (int i = 0; i < nagents; i++) {
        char id[32], err[512];
        snprintf(id, sizeof(id), "sim%06d", i);
        struct agent_rdzv_etcd_options o = {
            .endpoints = endpoints,
            .backend = "etcd-v3",
            .run_id = run_id ? run_id : rid,
            .min_nodes = nagents - 1,
            .max_nodes = nagents,
            .nproc = 1,
            .local_addr = "127.0.0.1",
            .conf = &conf,
            .node_id = id,
        };
        sims[i].idx = i;
        sims[i].rank = -1;
        if (agent_rdzv_etcd_new(loop, &o, &sims[i].r, err, sizeof(err)) != 0) {
            fprintf(stderr, "etcd-bench: %s\n", err);
            return 2;
        }
        open_agents++;
        sims[i].r->data = &sims[i];
        sims[i].r->on_restart = on_restart;
        sims[i].r->on_closed = on_closed;
        join(&sims[i]);
    }
    uv_run(loop, UV_RUN_DEFAULT);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"agents\":%d,\"round_s\":%.3f,\"new_round_s\":%.3f,\"agents_cpu_s\":%.2f,"
           "\"ok\":%s}\n",
           nagents, t_round ? (double)(t_round - t_start) / 1e9 : -1.0,
           t_new ? (double)(t_new - t_loss) / 1e9 : -1.0,
           (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
               (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6,
           failures == 0 && t_new ? "true" : "false");
    free(sims);
    return failures == 0 && t_new ? 0 : 1;
}
