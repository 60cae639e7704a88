/*
 * jobstats.h: cddp-rdzv's job-wide view of each run (docs/status.md,
 * "Job-wide goodput" and "Job-wide history"). Pure: no clock (wall times
 * are arguments), no I/O, no locks; rendezvous/jobs.c owns one, feeds it
 * from the server's heartbeats and actions and guards it for the status
 * port's thread.
 *
 * Goodput: each node's agent sends its goodput totals with its heartbeats
 * (proto/msg.h struct proto_goodput); the latest totals of every node that
 * sent any in the run, the current members and those that left or were
 * lost alike, are kept, and the run's job-wide figures are their sums:
 * node-seconds per phase, and ratio = productive / the sum of all phases.
 * A run keeps at most JOBSTATS_MAX_NODES nodes: past that, the one heard
 * from longest ago is folded into the run's "earlier nodes" sum, so the
 * sums stay whole.
 *
 * History: a status/history.h ring per run with two series (0: the highest
 * step any node reported, 1: the lowest among the nodes heard from in the
 * last JOBSTATS_FRESH_S; step_time_s: the median of the nodes' median step
 * times, when known; attempt: the run's round), a point at most every
 * JOBSTATS_POINT_EVERY_S, and events: rounds completed, restarts (a new
 * round asked for), nodes joined, left or lost, straggler marks, the end.
 *
 * At most JOBSTATS_MAX_RUNS runs; past that the run heard from longest
 * ago is forgotten. A round of a run that ended (closed) starts it over:
 * the server forgot the closed run and a new job took its id.
 */
#ifndef CDDP_RENDEZVOUS_JOBSTATS_H
#define CDDP_RENDEZVOUS_JOBSTATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strutil.h"
#include "proto/msg.h"
#include "status/history.h"

#define JOBSTATS_MAX_RUNS 64
#define JOBSTATS_MAX_NODES 256
#define JOBSTATS_POINTS 1024
#define JOBSTATS_EVENTS 512
#define JOBSTATS_POINT_EVERY_S 1.0
#define JOBSTATS_FRESH_S 30.0

struct jobstats_node {
    char id[PROTO_MAX_ID + 1];
    bool has_goodput;
    struct proto_goodput gp;
    double step_s; /* its perf's median step time; 0: none */
    double seen;   /* its last heartbeat, wall seconds */
};

struct jobstats_run {
    char id[PROTO_MAX_ID + 1];
    double first_seen, last_seen;
    struct jobstats_node *nodes;
    size_t nnodes, cap;
    /* Nodes folded out (JOBSTATS_MAX_NODES): how many, their totals. */
    size_t folded;
    double folded_s[PROTO_GOODPUT_PHASES];
    int64_t folded_lost_steps;
    struct status_history hist;
    double last_point;
    uint64_t round;         /* the last round completed (events and points) */
    uint64_t restart_round; /* the last round a restart asked for */
    bool ended;
};

struct jobstats {
    struct jobstats_run *runs[JOBSTATS_MAX_RUNS];
    size_t nruns;
    uint64_t runs_dropped;
};

/* The job-wide sums of one run. */
struct jobstats_sum {
    size_t nodes;                   /* nodes whose totals are in the sums */
    double s[PROTO_GOODPUT_PHASES]; /* node-seconds per phase */
    double total_s;                 /* their sum */
    double ratio;                   /* productive / total_s; 0 when total_s is 0 */
    int64_t lost_steps;
    int64_t max_step, min_step; /* over the fresh nodes; -1: none */
};

void jobstats_init(struct jobstats *js);
void jobstats_free(struct jobstats *js);

/* A heartbeat of node_id in run_id at wall time now, with its goodput
 * totals and perf summary (either may be NULL). 0, or -ENOMEM. */
int jobstats_heartbeat(struct jobstats *js, const char *run_id, const char *node_id,
                       const struct proto_goodput *gp, const struct proto_perf *perf, double now);

/* Events (each also creates the run if new; -ENOMEM or 0). A round and a
 * restart are recorded once each however many members are told. */
int jobstats_round(struct jobstats *js, const char *run_id, uint64_t round, int nnodes,
                   int world_size, double now);
/* A restart into `round`: reason as the protocol's ("node_lost",
 * "node_left", "node_joined", "worker_failure", ...), node_id the node
 * that caused it (may be NULL); node_* reasons also record a node event. */
int jobstats_restart(struct jobstats *js, const char *run_id, uint64_t round, const char *reason,
                     const char *node_id, bool counted, double now);
int jobstats_straggler(struct jobstats *js, const char *run_id, const char *node_id, bool slow,
                       double ratio, double now);
int jobstats_end(struct jobstats *js, const char *run_id, const char *reason, double now);

/* The run, or NULL. */
const struct jobstats_run *jobstats_find(const struct jobstats *js, const char *run_id);

void jobstats_sum(const struct jobstats_run *r, double now, struct jobstats_sum *out);

#endif
