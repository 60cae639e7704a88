/*
 * bench_status_render: the cost, on the owner's event loop, of rendering a
 * status view into a snapshot and publishing it (status/view.c,
 * status/http.c), for the view sizes cddprun and cddp-rdzv see.
 * Prints figures; run by tests/bench/status_http.py.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "proto/progress.h"
#include "status/http.h"
#include "status/view.h"

static double agent(size_t nworkers, size_t *json_len, size_t *metrics_len)
{
    struct status_worker_view *w = calloc(nworkers, sizeof(*w));
    struct progress_parser *p = malloc(sizeof(*p));
    if (w == NULL || p == NULL)
        exit(1);
    progress_init(p);
    const char *line = "{\"step\":120345,\"epoch\":7,\"loss\":2.3127,\"samples_per_s\":612.53}\n";
    progress_feed(p, line, strlen(line), 1000, 1712345678.25);
    for (size_t i = 0; i < nworkers; i++) {
        w[i].local_rank = (int)i;
        w[i].rank = (int)i + 8;
        w[i].pid = 40000 + (int)i;
        w[i].state = STATUS_WORKER_RUNNING;
        w[i].exit_code = -1;
        w[i].started_at = 1712345600.125;
        w[i].restarts = 1;
        w[i].progress = p->report;
    }
    struct status_agent_view v = {0};
    v.program = "cddprun";
    v.version = "0.1.0";
    v.pid = 4242;
    v.hostname = "node1.cluster.example";
    v.run_id = "job7";
    v.started_at = 1712345500.5;
    v.state = STATUS_AGENT_RUNNING;
    v.node_rank = 1;
    v.nnodes = 4;
    v.world_size = (int)nworkers * 4;
    v.local_world_size = (int)nworkers;
    v.round = 3;
    v.last_round_at = 1712345599.75;
    v.last_round_duration_s = 0.421;
    v.rdzv_backend = "c10d";
    v.rdzv_endpoint = "10.0.0.1:29400";
    v.master_addr = "10.0.0.1";
    v.master_port = 29500;
    v.max_restarts = 3;
    v.nworkers = nworkers;
    v.workers = w;

    struct status_cell cell;
    status_cell_init(&cell);
    int n = 2000;
    uint64_t t0 = cddp_mono_ns();
    for (int i = 0; i < n; i++) {
        struct status_snapshot *s;
        if (status_agent_render(&v, 1712345678.5 + i, 2000, &s) != 0)
            exit(1);
        if (i == 0) {
            status_snapshot_status(s, json_len);
            status_snapshot_metrics(s, metrics_len);
        }
        status_cell_publish(&cell, s);
    }
    double us = (double)(cddp_mono_ns() - t0) / 1e3 / n;
    status_cell_destroy(&cell);
    free(w);
    free(p);
    return us;
}

static double rdzv(size_t nruns, size_t nodes_per_run, size_t *json_len, size_t *metrics_len)
{
    struct status_rdzv_node_view *nodes = calloc(nodes_per_run, sizeof(*nodes));
    struct status_rdzv_run_view *runs = calloc(nruns, sizeof(*runs));
    char(*names)[32] = calloc(nodes_per_run, sizeof(*names));
    char(*ids)[32] = calloc(nruns, sizeof(*ids));
    if (!nodes || !runs || !names || !ids)
        exit(1);
    for (size_t i = 0; i < nodes_per_run; i++) {
        snprintf(names[i], sizeof(names[i]), "10.0.%zu.%zu:40000", i / 250, i % 250);
        nodes[i] = (struct status_rdzv_node_view){
            names[i], (int)i, 8, 1712345600.5, 1712345678.25, "active", 0, NULL, 0, 0, 0,
            false,    0,      0};
    }
    for (size_t r = 0; r < nruns; r++) {
        snprintf(ids[r], sizeof(ids[r]), "job%zu", r);
        runs[r] = (struct status_rdzv_run_view){.run_id = ids[r],
                                                .state = "running",
                                                .round = 3,
                                                .min_nodes = 1,
                                                .max_nodes = 1024,
                                                .last_round_at = 1712345600.0,
                                                .nmembers = nodes_per_run,
                                                .members = nodes,
                                                .max_step = -1,
                                                .min_step = -1};
    }
    struct status_rdzv_view v = {0};
    v.program = "cddp-rdzv";
    v.version = "0.1.0";
    v.hostname = "head";
    v.endpoint = "0.0.0.0:29400";
    v.started_at = 1712340000.0;
    v.accepting = true;
    v.connections = (unsigned)(nruns * nodes_per_run);
    v.nruns = nruns;
    v.runs = runs;
    struct status_cell cell;
    status_cell_init(&cell);
    int n = nodes_per_run > 100 ? 200 : 2000;
    uint64_t t0 = cddp_mono_ns();
    for (int i = 0; i < n; i++) {
        struct status_snapshot *s;
        if (status_rdzv_render(&v, 1712345678.5 + i, &s) != 0)
            exit(1);
        if (i == 0) {
            status_snapshot_status(s, json_len);
            status_snapshot_metrics(s, metrics_len);
        }
        status_cell_publish(&cell, s);
    }
    double us = (double)(cddp_mono_ns() - t0) / 1e3 / n;
    status_cell_destroy(&cell);
    free(nodes);
    free(runs);
    free(names);
    free(ids);
    return us;
}

int main(void)
{
    size_t j, m;
    printf("| view | JSON bytes | metrics bytes | render + publish, us |\n");
    printf("|---|---|---|---|\n");
    size_t sizes[] = {8, 64};
    for (size_t i = 0; i < 2; i++) {
        double us = agent(sizes[i], &j, &m);
        printf("| cddprun, %zu workers with progress | %zu | %zu | %.1f |\n", sizes[i], j, m, us);
    }
    double us = rdzv(1, 16, &j, &m);
    printf("| cddp-rdzv, 1 run of 16 nodes | %zu | %zu | %.1f |\n", j, m, us);
    us = rdzv(4, 1000, &j, &m);
    printf("| cddp-rdzv, 4 runs of 1000 nodes | %zu | %zu | %.1f |\n", j, m, us);
    return 0;
}
