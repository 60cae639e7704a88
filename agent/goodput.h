/*
 * goodput.h: where the job's wall time went, as the agent sees it. Pure:
 * no clock reads (every call takes `now`, monotonic milliseconds), no
 * I/O, no allocation; agent/agent.c feeds it and status/view.c shows it
 * (docs/status.md, "Goodput").
 *
 * The agent's wall time, from goodput_init to now, is cut into phases that
 * add up to it exactly:
 *
 *   init        from the start to the job's first step (agent set-up, the
 *               first workers' start-up), rendezvous left out
 *   productive  steps that were kept: from an attempt's first step until
 *               its group stops, less what a later attempt redid
 *   lost        steps computed and then redone: when an attempt after a
 *               restart reports its first step S, it resumed from
 *               R = S - stride (stride: the step increment of the attempt
 *               before, 1 if unknown); the earlier attempt's time after it
 *               reported step R (interpolated in its step history), up to
 *               its stop, moves from productive to lost, and its steps
 *               above R count as lost steps
 *   restart     from a failure (or a new round asked by the rendezvous)
 *               until the next attempt's first step, rendezvous left out
 *   rendezvous  waiting for a round
 *   stopped     stopping for good (success, signal, the last failure), the
 *               exit barrier, and after the end
 *
 * The step numbers are the workers' own (progress lines): the accounting is
 * exact when they count from the start of training across restarts, as
 * cddp-train's do. A job that reports no steps shows its running time as
 * init (first attempt) and restart (later ones).
 *
 * An attempt's step history is at most GOODPUT_HISTORY points: when full,
 * every other point is dropped (the survivors keep the first and last), so
 * a long attempt is interpolated between points further apart.
 */
#ifndef CDDP_AGENT_GOODPUT_H
#define CDDP_AGENT_GOODPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum goodput_phase {
    GOODPUT_INIT,
    GOODPUT_PRODUCTIVE,
    GOODPUT_LOST,
    GOODPUT_RESTART,
    GOODPUT_RENDEZVOUS,
    GOODPUT_STOPPED,
    GOODPUT_PHASE_COUNT
};

/* What the agent is doing, as the caller maps its state onto it. */
enum goodput_mode {
    GOODPUT_MODE_INIT,       /* before the first rendezvous */
    GOODPUT_MODE_RENDEZVOUS, /* waiting for a round */
    GOODPUT_MODE_RUNNING,    /* the worker group runs */
    GOODPUT_MODE_RESTARTING, /* stopping the group to start it again */
    GOODPUT_MODE_STOPPED,    /* stopping for good, exit barrier, ended */
};

#define GOODPUT_HISTORY 256

struct goodput_point {
    int64_t step;
    uint64_t ms;
};

struct goodput {
    uint64_t start_ms;
    uint64_t since_ms; /* when the current phase began */
    enum goodput_mode mode;
    enum goodput_phase phase; /* the phase time accrues to now */
    uint64_t ms[GOODPUT_PHASE_COUNT];
    uint64_t lost_steps;
    bool any_step;         /* the job reported a step */
    bool attempt_has_step; /* the current attempt (RUNNING since the last start) did */
    unsigned attempts;     /* RUNNING periods started */
    /* The step history of the last attempt that reported steps: its
     * points, its highest step (also from lines seen while it stopped), its
     * stride, and when it stopped running (0: it runs). */
    struct goodput_point hist[GOODPUT_HISTORY];
    size_t nhist;
    int64_t high_step;
    int64_t stride;
    uint64_t end_ms;
};

/* Phase names as /status and /metrics spell them. */
const char *goodput_phase_name(enum goodput_phase p);

void goodput_init(struct goodput *g, uint64_t now);

/* The agent's mode changed (the same mode again is a no-op). Entering
 * RUNNING from another mode starts a new attempt. */
void goodput_mode(struct goodput *g, enum goodput_mode m, uint64_t now);

/* A worker reported step (any local rank; only a new highest step of the
 * attempt counts). Ignored unless RUNNING or RESTARTING. */
void goodput_step(struct goodput *g, int64_t step, uint64_t now);

struct goodput_totals {
    double s[GOODPUT_PHASE_COUNT]; /* seconds per phase, up to now */
    double wall_s;                 /* their sum: now - start */
    double ratio;                  /* productive / wall; 0 when wall is 0 */
    uint64_t lost_steps;
    enum goodput_phase phase; /* the phase now */
};

void goodput_totals(const struct goodput *g, uint64_t now, struct goodput_totals *out);

/* The summary line, e.g. "goodput 96.4% of 1,262 s: 1,212 s productive,
 * 19 s restarting, 26 s redoing 40 steps, 3 s rendezvous, 2 s init"
 * (phases with no time left out); the length written, as snprintf. */
int goodput_summary(const struct goodput_totals *t, char *buf, size_t len);

#endif
