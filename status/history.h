/*
 * history.h: the run's history as the dashboard plots it (GET /history).
 *
 * The agent keeps, for each local rank, a series of progress points (step,
 * loss, throughput, step time, at a wall time), and one list of events
 * (restarts with their reason, rendezvous rounds, straggler marks, the end).
 * Both are bounded for a run of any length:
 *
 *   - Points: each rank keeps at most `cap` points that cover the whole run
 *     evenly. A rank offers every sample; it keeps sample i when i is a
 *     multiple of its stride (1 at first). When the series is full, every
 *     other kept point is dropped and the stride doubles, so a full series
 *     holds between cap/2 and cap points spread over the run, the first step
 *     always among them. The newest sample, kept or not, is shown too (the
 *     "latest" point), so the plot always reaches the present.
 *   - Events: at most `cap_events`; past that the oldest goes (counted in
 *     events_dropped).
 *
 * Every point and event gets a sequence number (one counter for both,
 * from 1), so a reader asks only for what is newer than what it has
 * (status_history_render's `since`).
 *
 * Pure: no clock (times are arguments), no I/O, no locks. The owner
 * (agent/status.c) guards it with its own mutex and renders a clone outside
 * it (status_history_clone), so a reader holds the owner's loop only for a
 * memcpy. The JSON is documented in docs/status.md ("/history").
 */
#ifndef CDDP_STATUS_HISTORY_H
#define CDDP_STATUS_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strutil.h"

/* Defaults of the agent: points per local rank, events. */
#define STATUS_HISTORY_POINTS 2048
#define STATUS_HISTORY_EVENTS 512
/* Bounds of the capacities (status_history_init refuses others). */
#define STATUS_HISTORY_POINTS_MIN 4
#define STATUS_HISTORY_POINTS_MAX (1u << 20)
#define STATUS_HISTORY_EVENTS_MAX (1u << 16)
#define STATUS_HISTORY_REASON_MAX 160

/* One progress sample of one rank. Values not reported are NaN. */
struct status_history_point {
    uint64_t seq; /* set by status_history_add_point */
    double t;     /* wall time, seconds since the epoch */
    int64_t step; /* -1: not reported */
    double loss;  /* NaN: not reported */
    double samples_per_s;
    double step_time_s;
    uint32_t attempt; /* the worker group's attempt (restarts before it) */
};

enum status_history_event_kind {
    STATUS_HISTORY_RESTART,       /* the group stops to start again */
    STATUS_HISTORY_ROUND,         /* a rendezvous round completed */
    STATUS_HISTORY_STRAGGLER,     /* a rank was named a straggler */
    STATUS_HISTORY_STRAGGLER_END, /* ... and no longer is */
    STATUS_HISTORY_END,           /* the run ended (succeeded, failed, terminated) */
    /* cddp-rdzv's job-wide history only (rendezvous/jobstats.h): a node
     * joined, left or was lost, as the restart it caused says. */
    STATUS_HISTORY_NODE_JOINED,
    STATUS_HISTORY_NODE_LEFT,
    STATUS_HISTORY_NODE_LOST,
    STATUS_HISTORY_EVENT_KIND_COUNT
};

const char *status_history_event_name(enum status_history_event_kind k);

struct status_history_event {
    uint64_t seq; /* set by status_history_add_event */
    double t;
    enum status_history_event_kind kind;
    int local_rank;   /* -1: the whole group */
    int64_t step;     /* the highest step seen before it; -1: none */
    uint32_t attempt; /* the attempt it ended or began */
    double value;     /* ROUND: the round; STRAGGLER: the ratio; else 0 */
    char reason[STATUS_HISTORY_REASON_MAX];
};

struct status_history_series {
    struct status_history_point *pts; /* cap, in order of time */
    size_t n;
    uint64_t offered; /* samples offered so far */
    uint64_t stride;  /* keep sample i when i % stride == 0 */
    bool has_latest;  /* latest is newer than pts[n-1] */
    struct status_history_point latest;
    int rank; /* the global rank of the newest sample; -1 unknown */
};

struct status_history {
    size_t cap, cap_events;
    int nseries;
    struct status_history_series *series;
    struct status_history_event *events; /* a ring of cap_events */
    size_t ev_head, ev_n;
    uint64_t events_dropped;
    uint64_t seq; /* the last number given */
};

/* Allocates nseries series of cap points (even, within the bounds) and
 * cap_events events (1..MAX). 0, CDDP_ERANGE_ARG (bad bounds) or -ENOMEM. */
int status_history_init(struct status_history *h, int nseries, size_t cap, size_t cap_events);
void status_history_free(struct status_history *h);

/* Offers a sample of series i (ignored when i is out of range): kept, or
 * shown as the latest point until the next. rank: the worker's global rank. */
void status_history_add_point(struct status_history *h, int i, int rank,
                              const struct status_history_point *p);
void status_history_add_event(struct status_history *h, const struct status_history_event *e);

/* The highest step any series has seen (in any attempt); -1 when none. */
int64_t status_history_max_step(const struct status_history *h);

/* A copy into *dst (freed with status_history_free) of what a render with
 * the same `since` needs: only the points newer than since, so a reader
 * polling for news copies little. Not for adding to. 0 or -ENOMEM. */
int status_history_clone(struct status_history *dst, const struct status_history *src,
                         uint64_t since);

/* Appends the /history JSON of points and events with seq > since, at now
 * (wall), to out. 0, or the buffer's error. */
int status_history_render(const struct status_history *h, uint64_t since, double now,
                          double started_at, struct cddp_buf *out);

#endif
