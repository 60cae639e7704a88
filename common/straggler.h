/*
 * straggler.h: which members are slower than the others (pure: no clock,
 * no I/O, no allocation). docs/status.md, "Stragglers", is the user's view.
 *
 * The agent judges its local ranks with it (agent/stragglers.c) and the
 * rendezvous server the nodes of a job (rendezvous/state.c), so both name
 * a straggler by the same rule:
 *
 *   struct straggler_window   one rank's recent steps: each progress line
 *                             in, the mean time a step over its newest
 *                             steps (at least STRAGGLER_MIN_STEPS) out
 *   straggler_median()        the members' reference: the lower median of
 *                             the measured values
 *   straggler_mark()          who is slower than factor x that median, with
 *                             since (when named) and the changes to log
 *
 * Times are the caller's monotonic milliseconds; values are seconds a step.
 *
 * Why the lower median (the ((k-1)/2)-th of k sorted values): with two
 * members the reference is the faster one, so the slower is named when it
 * is factor times the other (the plain median, their mean, would ask for
 * a slowdown of 2 x factor - 1); with more members it is the middle one,
 * which one slow member cannot move.
 *
 * Hysteresis: a named member stays named until its value falls below
 * STRAGGLER_CLEAR x factor x median, so a rank hovering at the threshold
 * is not named and cleared at every judgement.
 */
#ifndef CDDP_COMMON_STRAGGLER_H
#define CDDP_COMMON_STRAGGLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The fewest steps a member's value is measured over. */
#define STRAGGLER_MIN_STEPS 20
/* Samples a window keeps (a sample is one progress line that advanced the
 * step: one step or several). */
#define STRAGGLER_WINDOW 32
/* A named member is cleared below this fraction of factor x median. */
#define STRAGGLER_CLEAR 0.9

struct straggler_sample {
    double steps;     /* steps the sample covers (> 0) */
    double time_s;    /* their seconds, all together */
    double compute_s; /* of which outside collective waits; < 0: not reported */
};

struct straggler_window {
    struct straggler_sample s[STRAGGLER_WINDOW]; /* a ring: the newest at head - 1 */
    unsigned head, n;
    bool has_step;     /* a line with a step was seen */
    int64_t last_step; /* its step */
    uint64_t last_ms;  /* when it came */
};

void straggler_window_reset(struct straggler_window *w);

/* One progress line read at now_ms: its step (has_step false: none), and
 * the step time and compute time it reported (< 0: not reported). A line
 * that advances the step by d adds a sample of d steps: d x step_time_s
 * seconds when the line has it, else the time since the previous line with
 * a step (so a worker that reports only its step is still measured, by
 * when its lines arrive). A step that goes back (a new count) starts the
 * window again. */
void straggler_window_line(struct straggler_window *w, uint64_t now_ms, bool has_step, int64_t step,
                           double step_time_s, double compute_s);

/* The mean seconds a step over the newest samples that together cover at
 * least min_steps steps, in *step_s, and the mean compute in *compute_s
 * when every one of those samples had it (else -1). False (both -1) while
 * the window covers fewer steps. */
bool straggler_window_mean(const struct straggler_window *w, unsigned min_steps, double *step_s,
                           double *compute_s);

/* One member as the judge sees it. */
struct straggler_member {
    double value;      /* seconds a step; <= 0 (or NaN): not measured now */
    bool slow;         /* named a straggler */
    uint64_t since_ms; /* when it was named */
    double ratio;      /* value / median at the last mark; 0: not known */
};

/* What one straggler_mark changed. */
struct straggler_change {
    size_t index;
    bool slow; /* true: named now; false: no longer */
};

/* The lower median of the values of v[0..n) that are > 0 (scratch: room
 * for n doubles), or 0 when there is none. */
double straggler_lower_median(const double *v, size_t n, double *scratch);

/* The lower median of the measured values of m[0..n) (scratch: room for n
 * doubles), or 0 when fewer than two are measured. */
double straggler_median(const struct straggler_member *m, size_t n, double *scratch);

/* Marks m[0..n) against median: a measured member above factor x median is
 * named (since_ms = now_ms); a named one is cleared below STRAGGLER_CLEAR x
 * factor x median, or when it is no longer measured; median 0 clears every
 * one. ratio is updated for every member. Writes each change to out (room
 * for n) and returns their number. */
size_t straggler_mark(struct straggler_member *m, size_t n, double median, double factor,
                      uint64_t now_ms, struct straggler_change *out);

#endif
