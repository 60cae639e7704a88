/*
 * rdzv_state_bench.c: rdzv-state-bench, the pure rendezvous state machine
 * (rendezvous/state.c) at scale, in one process, no sockets.
 *
 *   rdzv-state-bench [--nodes N]      (default 100,000)
 *
 * Measures, with a monotonic clock:
 *   round_ms       N hellos and joins (min = max = N) until every node has
 *                  its ROUND action (the round completes at the N-th join)
 *   encode_ms      turning those N ROUND actions into wire frames (what
 *                  the server adds on top before writing)
 *   beat_ms        one heartbeat from every node plus a tick
 *   loss_ms        node rank 0 lost -> N-1 RESTART actions -> N-1 rejoins ->
 *                  the new round's N-1 ROUND actions
 * and prints them as one JSON line with the process's peak RSS. It checks
 * the rounds it measures (exit 1 if a check fails); it never fails on time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/strutil.h"
#include "proto/msg.h"
#include "rendezvous/state.h"

static double ms(uint64_t t0)
{
    return (double)(cddp_mono_ns() - t0) / 1e6;
}

static long peak_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "VmHWM:", 6) == 0)
            kb = strtol(line + 6, NULL, 10);
    }
    if (f)
        fclose(f);
    return kb;
}

static int fail(const char *what)
{
    fprintf(stderr, "rdzv-state-bench: check failed: %s\n", what);
    return 1;
}

int main(int argc, char **argv)
{
    long n = 100000;
    if (argc == 3 && strcmp(argv[1], "--nodes") == 0) {
        if (cddp_parse_long(argv[2], 2, 1000000, &n) != 0)
            return fail("--nodes expects 2..1000000");
    } else if (argc != 1) {
        fprintf(stderr, "usage: rdzv-state-bench [--nodes N]\n");
        return 2;
    }
    struct rdzv_state_options o = {.seed = {0x1234, 0x5678}};
    struct rdzv_state *st = rdzv_state_new(&o);
    struct rdzv_peer *peers = calloc((size_t)n, sizeof(*peers));
    char(*ids)[32] = calloc((size_t)n, sizeof(*ids));
    int *rank = calloc((size_t)n, sizeof(*rank));
    char err[128];
    const struct rdzv_action *a;
    size_t na = 0;
    uint64_t now = 1;

    struct proto_msg m = {.type = PROTO_JOIN};
    m.join.nproc = 8;
    m.join.min_nodes = (int)(n / 2);
    m.join.max_nodes = (int)n;
    m.join.master_port = 29500;
    for (long i = 0; i < n; i++) {
        rdzv_peer_init(&peers[i], "10.0.0.1", false, NULL);
        snprintf(ids[i], sizeof(ids[i]), "node-%07ld", (i * 7919) % n);
    }

    uint64_t t0 = cddp_mono_ns();
    for (long i = 0; i < n; i++) {
        rdzv_state_hello(st, now, &peers[i], "bench", err, sizeof(err));
        m.join.node_id = ids[i];
        rdzv_state_join(st, now, &peers[i], &m);
    }
    na = rdzv_state_actions(st, &a);
    double round_ms = ms(t0);
    size_t rounds = 0;
    for (size_t k = 0; k < na; k++) {
        if (a[k].kind != RDZV_ACT_ROUND)
            continue;
        rounds++;
        rank[a[k].peer - peers] = a[k].round.node_rank;
        if (a[k].round.nnodes != n || a[k].round.world_size != 8 * n)
            return fail("round size");
    }
    if (rounds != (size_t)n)
        return fail("every node has its round");

    /* What the server does next: one frame per node. */
    t0 = cddp_mono_ns();
    struct cddp_buf b;
    cddp_buf_init(&b, (size_t)1 << 30);
    for (size_t k = 0; k < na; k++) {
        if (a[k].kind != RDZV_ACT_ROUND)
            continue;
        struct proto_msg r = {.type = PROTO_ROUND, .round = a[k].round};
        if (proto_msg_encode(&r, &b) != 0)
            return fail("encode");
    }
    double encode_ms = ms(t0);
    size_t bytes = b.len;
    cddp_buf_free(&b);

    now += 1000;
    t0 = cddp_mono_ns();
    for (long i = 0; i < n; i++)
        rdzv_state_heartbeat(st, now, &peers[i]);
    rdzv_state_tick(st, now);
    double beat_ms = ms(t0);
    if (rdzv_state_actions(st, &a) != 0)
        return fail("nobody is dropped while beating");

    long victim = 0;
    for (long i = 0; i < n; i++)
        if (rank[i] == 0)
            victim = i;
    t0 = cddp_mono_ns();
    rdzv_state_disconnect(st, now, &peers[victim]);
    if (rdzv_state_actions(st, &a) != (size_t)n - 1)
        return fail("every survivor is told to restart");
    for (long i = 0; i < n; i++) {
        if (i == victim)
            continue;
        m.join.node_id = ids[i];
        rdzv_state_join(st, now, &peers[i], &m);
    }
    na = rdzv_state_actions(st, &a);
    double loss_ms = ms(t0);
    rounds = 0;
    for (size_t k = 0; k < na; k++)
        rounds += a[k].kind == RDZV_ACT_ROUND && a[k].round.nnodes == n - 1;
    if (rounds != (size_t)n - 1)
        return fail("the survivors form the next round");

    printf("{\"nodes\":%ld,\"round_ms\":%.1f,\"encode_ms\":%.1f,\"frames_mib\":%.1f,"
           "\"beat_ms\":%.1f,\"loss_ms\":%.1f,\"peak_rss_mib\":%.1f}\n",
           n, round_ms, encode_ms, (double)bytes / (1 << 20), beat_ms, loss_ms,
           (double)peak_rss_kb() / 1024.0);

    for (long i = 0; i < n; i++) {
        if (i != victim)
            rdzv_state_disconnect(st, now, &peers[i]);
    }
    rdzv_state_free(st);
    free(peers);
    free(ids);
    free(rank);
    return 0;
}
