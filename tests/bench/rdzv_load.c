/*
 * rdzv_load.c: rdzv-load, N simulated agents in one process (one libuv
 * loop, one rendezvous/client.c client per agent) against a rendezvous
 * server. Used by tests/bench/rdzv_bench.sh (figures) and by the process
 * tests (tests/integration/test_rdzv*.py: correctness, and as a single
 * agent that stays in the job).
 *
 *   rdzv-load --port P [--host H] --agents N [--nproc K] [--min M] [--max X]
 *             [--run-id ID] [--token T] [--conf k=v,...] [--kill K]
 *             [--inflight C] [--timeout S] [--server-pid PID]
 *
 * One-shot mode (default): all N agents join; when every one has its round
 * the round is checked (node ranks a permutation of 0..N-1, one world size,
 * rank offsets the prefix sums of nproc, one MASTER_ADDR/PORT). With
 * --kill K, K agents then drop their connections (as a SIGKILLed agent's
 * kernel does) and the survivors, which rejoin as soon as they are told to
 * restart, must form the next round; the time from the drop to the last
 * survivor's new round is measured. With --server-pid (a server on this
 * machine), the server's CPU time over the same spans is reported too, from
 * /proc. Prints one JSON line of figures; exit 0
 * if every check passed, 1 if not, 2 on bad usage or a low open-file limit.
 *
 * Agent mode (--stay): each agent stays in the job, rejoins on every
 * restart, and prints one JSON line per event on stdout ("round",
 * "restart", "waiting", "closed", "error") until the rendezvous closes
 * (exit 0) or fails (exit 1). SIGTERM: leave quietly, exit 0.
 *
 * Starting 10,000 connections at once would overflow the listen backlog
 * (net.core.somaxconn) and cost a 1 s SYN retransmit; --inflight (default
 * 1024) bounds the connects not yet answered, as a real fleet's spread of
 * start times does.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <uv.h>

#include "common/errors.h"
#include "common/strutil.h"
#include "rendezvous/client.h"
#include "rendezvous/conf.h"

struct agent {
    struct load *L;
    struct rdzv_client *c;
    int idx;
    bool joined; /* has the round it is waiting for */
    bool started;
    bool answered; /* its first round (or error) came: no longer "in flight" */
    bool killed;
    struct proto_round round;
};

struct load {
    uv_loop_t loop;
    uv_signal_t sigterm;
    uv_timer_t guard;
    uv_idle_t starter;
    struct agent *a;
    int n, nproc, min, max, kill, inflight_max;
    int started, inflight, rounds, errors, restarts, joined_acks;
    const char *host, *run_id;
    char prefix[32]; /* node ids: prefix + agent index; unique per process */
    int port;
    struct rdzv_conf conf;
    bool stay;
    int phase; /* 0: first round, 1: after the kill */
    uint64_t t_start, t_connected_all, t_round, t_kill, t_restarted, t_new_round;
    int restarted;
    int server_pid;
    double cpu_start, cpu_round, cpu_new_round; /* server CPU seconds at those points */
    int exit_code;
    int closed;
};

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

static double ms_since(uint64_t t0, uint64_t t1)
{
    return (double)(t1 - t0) / 1e6;
}

static void finish(struct load *L, int code);

/* utime + stime of a process, in seconds; -1 if unknown. */
static double proc_cpu(int pid)
{
    char path[64], buf[1024];
    if (pid <= 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    /* Fields after the command: state is field 3; utime and stime are 14, 15. */
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / 100.0; /* USER_HZ */
}

static void print_round(const struct agent *a, const char *event)
{
    printf("{\"event\":\"%s\",\"agent\":%d,\"run_id\":\"%s\",\"round\":%llu,\"node_rank\":%d,"
           "\"nnodes\":%d,\"world_size\":%d,\"rank_offset\":%d,\"master_addr\":\"%s\","
           "\"master_port\":%d}\n",
           event, a->idx, a->round.run_id, (unsigned long long)a->round.round, a->round.node_rank,
           a->round.nnodes, a->round.world_size, a->round.rank_offset, a->round.master_addr,
           a->round.master_port);
    fflush(stdout);
}

/* Every agent of the round has the same round; ranks are a permutation. */
static bool check_round(struct load *L, int expect_nodes)
{
    char *seen = calloc((size_t)expect_nodes, 1);
    long long world = 0;
    bool ok = seen != NULL;
    const struct proto_round *first = NULL;
    int n = 0;
    for (int i = 0; ok && i < L->n; i++) {
        struct agent *a = &L->a[i];
        if (a->killed)
            continue;
        const struct proto_round *r = &a->round;
        if (first == NULL)
            first = r;
        n++;
        if (r->nnodes != expect_nodes || r->node_rank < 0 || r->node_rank >= expect_nodes ||
            seen[r->node_rank]++ || r->round != first->round ||
            r->world_size != first->world_size || r->master_port != first->master_port ||
            strcmp(r->master_addr, first->master_addr) != 0) {
            fprintf(stderr, "rdzv-load: agent %d: inconsistent round (rank %d of %d)\n", i,
                    r->node_rank, r->nnodes);
            ok = false;
        }
        world += r->nproc;
    }
    if (ok && (n != expect_nodes || first == NULL || world != first->world_size)) {
        fprintf(stderr, "rdzv-load: %d agents in the round, world %lld\n", n, world);
        ok = false;
    }
    /* Offsets: with equal nproc, offset = rank * nproc. */
    for (int i = 0; ok && i < L->n; i++) {
        if (!L->a[i].killed && L->a[i].round.rank_offset != L->a[i].round.node_rank * L->nproc) {
            fprintf(stderr, "rdzv-load: agent %d: rank offset %d for rank %d\n", i,
                    L->a[i].round.rank_offset, L->a[i].round.node_rank);
            ok = false;
        }
    }
    free(seen);
    return ok;
}

static void on_join(struct rdzv_client *c, int status, const struct proto_round *r, void *arg);

static void on_event(struct rdzv_client *c, const struct rdzv_event *ev, void *data)
{
    struct agent *a = data;
    struct load *L = a->L;
    switch (ev->kind) {
    case RDZV_EV_RESTART:
        L->restarts++;
        if (L->stay) {
            printf("{\"event\":\"restart\",\"agent\":%d,\"round\":%llu,\"reason\":\"%s\","
                   "\"counted\":%s}\n",
                   a->idx, (unsigned long long)ev->round, ev->reason,
                   ev->counted ? "true" : "false");
            fflush(stdout);
        }
        if (L->phase == 1 && ++L->restarted == L->n - L->kill)
            L->t_restarted = now_ns();
        a->joined = false;
        if (rdzv_client_join(c, 20000 + a->idx, on_join, a) != 0)
            L->errors++;
        break;
    case RDZV_EV_JOINED:
        /* The server has us: no longer a connect in flight. */
        if (!a->answered) {
            a->answered = true;
            L->inflight--;
            if (++L->joined_acks == L->n)
                L->t_connected_all = now_ns();
        }
        if (L->stay && ev->waiting) {
            printf("{\"event\":\"waiting\",\"agent\":%d,\"round\":%llu}\n", a->idx,
                   (unsigned long long)ev->round);
            fflush(stdout);
        }
        break;
    case RDZV_EV_CLOSED:
        if (L->stay) {
            printf("{\"event\":\"closed\",\"agent\":%d,\"reason\":\"%s\"}\n", a->idx, ev->reason);
            fflush(stdout);
        }
        if (++L->closed == L->n)
            finish(L, 0);
        break;
    case RDZV_EV_ERROR:
        L->errors++;
        fprintf(stderr, "rdzv-load: agent %d: %s\n", a->idx, ev->message);
        if (L->stay) {
            printf("{\"event\":\"error\",\"agent\":%d,\"code\":\"%s\"}\n", a->idx,
                   cddp_err_name(ev->code));
            fflush(stdout);
        }
        finish(L, 1);
        break;
    case RDZV_EV_DISCONNECTED:
    case RDZV_EV_RECONNECTED:
        if (L->stay) {
            printf("{\"event\":\"%s\",\"agent\":%d,\"resumed\":%s}\n",
                   ev->kind == RDZV_EV_DISCONNECTED ? "disconnected" : "reconnected", a->idx,
                   ev->resumed ? "true" : "false");
            fflush(stdout);
        }
        break;
    case RDZV_EV_WAITING:
    case RDZV_EV_GENERATION:
    case RDZV_EV_BLAME:
        break;
    }
}

static void kill_some(struct load *L)
{
    L->phase = 1;
    L->rounds = 0;
    L->t_kill = now_ns();
    /* Drop rank 0 (the worst case: MASTER_ADDR moves) and the highest ranks. */
    for (int i = 0, k = 0; i < L->n && k < L->kill; i++) {
        struct agent *a = &L->a[i];
        if (a->round.node_rank == 0 || a->round.node_rank > L->n - L->kill) {
            a->killed = true;
            rdzv_client_close(a->c, NULL, NULL);
            a->c = NULL;
            k++;
        }
    }
}

static void on_join(struct rdzv_client *c, int status, const struct proto_round *r, void *arg)
{
    (void)c;
    struct agent *a = arg;
    struct load *L = a->L;
    if (L->exit_code >= 0)
        return; /* finishing: the client is being closed */
    if (!a->answered) {
        a->answered = true;
        L->inflight--;
    }
    if (status) {
        fprintf(stderr, "rdzv-load: agent %d: join failed: %s (%s)\n", a->idx,
                cddp_err_name(status), rdzv_client_last_error(c));
        L->errors++;
        if (L->stay) {
            printf("{\"event\":\"error\",\"agent\":%d,\"code\":\"%s\"}\n", a->idx,
                   cddp_err_name(status));
            fflush(stdout);
        }
        finish(L, 1);
        return;
    }
    a->round = *r;
    a->joined = true;
    if (L->stay) {
        print_round(a, "round");
        return;
    }
    int want = L->phase == 0 ? L->n : L->n - L->kill;
    if (++L->rounds < want)
        return;
    if (L->phase == 0) {
        L->t_round = now_ns();
        L->cpu_round = proc_cpu(L->server_pid);
        if (!check_round(L, L->n)) {
            finish(L, 1);
            return;
        }
        if (L->kill > 0) {
            kill_some(L);
            return;
        }
    } else {
        L->t_new_round = now_ns();
        L->cpu_new_round = proc_cpu(L->server_pid);
        if (!check_round(L, L->n - L->kill)) {
            finish(L, 1);
            return;
        }
    }
    finish(L, 0);
}

static void start_agent(struct load *L, int i)
{
    struct agent *a = &L->a[i];
    char err[256], id[64];
    snprintf(id, sizeof(id), "%s%07d", L->prefix, i);
    struct rdzv_client_options o = {.host = L->host,
                                    .port = L->port,
                                    .run_id = L->run_id,
                                    .node_id = id,
                                    .nproc = L->nproc,
                                    .min_nodes = L->min,
                                    .max_nodes = L->max,
                                    .hostname = "127.0.0.1",
                                    .conf = &L->conf};
    a->L = L;
    a->idx = i;
    a->started = true;
    int rc = rdzv_client_start(&L->loop, &o, on_event, a, &a->c, err, sizeof(err));
    if (rc == 0)
        rc = rdzv_client_join(a->c, 20000 + i, on_join, a);
    if (rc) {
        fprintf(stderr, "rdzv-load: agent %d: %s\n", i, err);
        finish(L, 1);
        return;
    }
    L->inflight++;
}

/* Starts agents while fewer than --inflight are waiting for an answer. */
static void on_starter(uv_idle_t *h)
{
    struct load *L = h->data;
    while (L->started < L->n && L->inflight < L->inflight_max && L->exit_code < 0)
        start_agent(L, L->started++);
    if (L->started == L->n)
        uv_idle_stop(h);
}

static void on_guard(uv_timer_t *t)
{
    struct load *L = t->data;
    fprintf(stderr, "rdzv-load: timed out: %d of %d agents have their round (phase %d)\n",
            L->rounds, L->phase == 0 ? L->n : L->n - L->kill, L->phase);
    finish(L, 1);
}

static void on_sigterm(uv_signal_t *s, int sig)
{
    (void)sig;
    finish(s->data, 0);
}

static void finish(struct load *L, int code)
{
    if (L->exit_code >= 0)
        return;
    L->exit_code = code;
    uv_idle_stop(&L->starter);
    uv_close((uv_handle_t *)&L->starter, NULL);
    uv_close((uv_handle_t *)&L->guard, NULL);
    uv_close((uv_handle_t *)&L->sigterm, NULL);
    signal(SIGTERM, SIG_IGN); /* finishing already: a late SIGTERM changes nothing */
    for (int i = 0; i < L->n; i++) {
        if (L->a[i].c) {
            rdzv_client_close(L->a[i].c, NULL, NULL);
            L->a[i].c = NULL;
        }
    }
}

/* Raises the open-file soft limit to the hard limit; 0 if need fits. */
static int raise_nofile(rlim_t need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        fprintf(stderr,
                "rdzv-load: %llu agents need about %llu open files, but the hard limit is %llu "
                "(raise it: ulimit -Hn, or limits.conf / systemd LimitNOFILE)\n",
                (unsigned long long)(need - 64), (unsigned long long)need,
                (unsigned long long)rl.rlim_cur);
        return -1;
    }
    return 0;
}

static int usage(const char *msg, const char *arg)
{
    fprintf(stderr, "rdzv-load: %s%s%s\n", msg, arg ? " " : "", arg ? arg : "");
    fprintf(stderr, "usage: rdzv-load --port P [--host H] --agents N [--nproc K] [--min M] "
                    "[--max X] [--run-id ID] [--token T] [--conf k=v,...] [--kill K] "
                    "[--inflight C] [--timeout S] [--stay]\n");
    return 2;
}

int main(int argc, char **argv)
{
    struct load L = {.n = 1,
                     .nproc = 1,
                     .inflight_max = 1024,
                     .host = "127.0.0.1",
                     .run_id = "load",
                     .exit_code = -1};
    double timeout_s = 60;
    const char *token = NULL, *conf = NULL;
    long v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (strcmp(a, "--stay") == 0) {
            L.stay = true;
            takes = false;
        } else if (val == NULL) {
            return usage("missing value after", a);
        } else if (strcmp(a, "--host") == 0) {
            L.host = val;
        } else if (strcmp(a, "--run-id") == 0) {
            L.run_id = val;
        } else if (strcmp(a, "--token") == 0) {
            token = val;
        } else if (strcmp(a, "--conf") == 0) {
            conf = val;
        } else if (strcmp(a, "--timeout") == 0) {
            if (cddp_parse_double(val, 0.01, 86400, &timeout_s) != 0)
                return usage("bad --timeout", val);
        } else {
            if (cddp_parse_long(val, 0, 10000000, &v) != 0)
                return usage("expected a number after", a);
            if (strcmp(a, "--port") == 0)
                L.port = (int)v;
            else if (strcmp(a, "--agents") == 0)
                L.n = (int)v;
            else if (strcmp(a, "--nproc") == 0)
                L.nproc = (int)v;
            else if (strcmp(a, "--min") == 0)
                L.min = (int)v;
            else if (strcmp(a, "--max") == 0)
                L.max = (int)v;
            else if (strcmp(a, "--kill") == 0)
                L.kill = (int)v;
            else if (strcmp(a, "--inflight") == 0)
                L.inflight_max = (int)v;
            else if (strcmp(a, "--server-pid") == 0)
                L.server_pid = (int)v;
            else
                return usage("unknown option", a);
        }
        if (takes)
            i++;
    }
    if (L.port <= 0 || L.n < 1 || L.nproc < 1 || L.kill >= L.n || L.inflight_max < 1)
        return usage("need --port, --agents >= 1 and --kill < --agents", NULL);
    snprintf(L.prefix, sizeof(L.prefix), "load%d-", (int)getpid());
    if (L.min == 0)
        L.min = L.kill ? L.n - L.kill : L.n;
    if (L.max == 0)
        L.max = L.n;
    char err[512];
    rdzv_conf_init(&L.conf);
    if (conf && rdzv_conf_parse(&L.conf, conf, err, sizeof(err)) != 0)
        return usage(err, NULL);
    if (token) {
        cddp_strlcpy(L.conf.token, token, sizeof(L.conf.token));
        L.conf.has_token = true;
    }
    if (raise_nofile((rlim_t)L.n + 64) != 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);

    L.a = calloc((size_t)L.n, sizeof(*L.a));
    uv_loop_init(&L.loop);
    uv_signal_init(&L.loop, &L.sigterm);
    L.sigterm.data = &L;
    uv_signal_start(&L.sigterm, on_sigterm, SIGTERM);
    uv_timer_init(&L.loop, &L.guard);
    L.guard.data = &L;
    if (!L.stay)
        uv_timer_start(&L.guard, on_guard, (uint64_t)(timeout_s * 1000), 0);
    uv_idle_init(&L.loop, &L.starter);
    L.starter.data = &L;
    uv_idle_start(&L.starter, on_starter);
    L.t_start = now_ns();
    L.cpu_start = proc_cpu(L.server_pid);
    uv_run(&L.loop, UV_RUN_DEFAULT);
    int rc = uv_loop_close(&L.loop);
    if (rc)
        fprintf(stderr, "rdzv-load: loop did not close: %s\n", uv_strerror(rc));

    if (!L.stay && L.exit_code == 0) {
        printf("{\"agents\":%d,\"nproc\":%d,\"joined_ms\":%.2f,\"round_ms\":%.2f", L.n, L.nproc,
               L.t_connected_all ? ms_since(L.t_start, L.t_connected_all) : -1.0,
               ms_since(L.t_start, L.t_round));
        if (L.server_pid > 0 && L.cpu_start >= 0)
            printf(",\"server_cpu_ms\":%.0f", (L.cpu_round - L.cpu_start) * 1000.0);
        if (L.kill)
            printf(",\"killed\":%d,\"restart_push_ms\":%.2f,\"new_round_ms\":%.2f", L.kill,
                   ms_since(L.t_kill, L.t_restarted), ms_since(L.t_kill, L.t_new_round));
        if (L.kill && L.server_pid > 0 && L.cpu_round >= 0)
            printf(",\"server_cpu_new_round_ms\":%.0f", (L.cpu_new_round - L.cpu_round) * 1000.0);
        printf(",\"ok\":true}\n");
    }
    free(L.a);
    return L.exit_code < 0 ? 1 : L.exit_code;
}
