/*
 * watchdog.h: the progress watchdog's decisions, as pure functions.
 *
 * One state per local rank; the agent (agent/agent.c) feeds it events and
 * asks it questions, with the time as an argument (monotonic milliseconds):
 *
 *     watchdog_start(wd, i, now)            local rank i's worker started
 *     watchdog_exit(wd, i)                  it exited (it is no longer watched)
 *     watchdog_report(wd, i, now, step)     it wrote a valid progress line
 *     watchdog_next_deadline(wd)            when to look again (0: never)
 *     watchdog_hung(wd, now)                the first local rank hung at now, or -1
 *
 * No clock, no I/O, no libuv. The rules (docs/cli.md, "Progress watchdog"):
 *
 *   - A worker is watched from its first progress line on: silent for the
 *     timeout after a line, it is hung. Before its first line only the
 *     initial timeout (cfg.initial_ms, counted from its start; 0: off)
 *     applies, so slow start-ups (imports, data loading) are not hangs
 *     unless asked.
 *   - FIXED: the timeout is cfg.timeout_ms.
 *   - AUTO: the timeout is learned. Once the rank has sent cfg.warmup lines
 *     (all attempts together) and at least one interval between two lines
 *     was seen, it is the longest interval seen times cfg.safety, within
 *     [cfg.floor_ms (0: WATCHDOG_FLOOR_MS), WATCHDOG_CEILING_MS]. It only grows: a longer
 *     interval that stayed within the timeout raises it. Before that (the
 *     warm-up) the ceiling applies. The learned value and the longest
 *     interval survive a restart (watchdog_start), so the next attempt is
 *     watched with it from its first line.
 *   - The interval from a worker's start to its first line is never
 *     learned from (start-up is not a step).
 */
#ifndef CDDP_AGENT_WATCHDOG_H
#define CDDP_AGENT_WATCHDOG_H

#include <stdbool.h>
#include <stdint.h>

/* AUTO's bounds. The floor keeps a worker reporting every few milliseconds
 * from being killed by a hiccup (cddprun's --watchdog_floor sets it, 60 s
 * by default; WATCHDOG_FLOOR_MS is the least it may be); the ceiling bounds
 * both the warm-up and a learned value (a step longer than an hour is not a
 * step). */
#define WATCHDOG_FLOOR_MS 1000u
#define WATCHDOG_CEILING_MS 3600000u
/* A learned timeout is reported as changed (watchdog_report returns true)
 * the first time, then when it grew by more than this fraction since the
 * last report, so the log says it a handful of times, not every step. */
#define WATCHDOG_CHANGE_FRACTION 0.1

enum watchdog_mode {
    WATCHDOG_OFF,
    WATCHDOG_FIXED,
    WATCHDOG_AUTO,
};

struct watchdog_config {
    enum watchdog_mode mode;
    uint64_t timeout_ms; /* FIXED */
    uint64_t initial_ms; /* before a worker's first line; 0: not watched then */
    unsigned warmup;     /* AUTO: lines before the timeout is learned (>= 1) */
    double safety;       /* AUTO: the multiplier (> 0) */
    uint64_t floor_ms;   /* AUTO: the least learned timeout; below WATCHDOG_FLOOR_MS
                          * (0 included) is taken as WATCHDOG_FLOOR_MS */
};

struct watchdog_worker {
    bool running;
    uint64_t started_ms;
    uint64_t last_ms;  /* the last line of this attempt; 0: none yet */
    uint64_t lines;    /* lines of this attempt */
    bool has_step;     /* this attempt reported a step */
    int64_t last_step; /* the last step reported in this attempt */
    /* Learned across attempts (AUTO). */
    uint64_t lines_total;
    uint64_t max_interval_ms; /* 0: no interval seen */
    uint64_t learned_ms;      /* 0: still warming up */
    uint64_t reported_ms;     /* the learned value last reported as changed */
};

struct watchdog {
    struct watchdog_config cfg;
    int nworkers;
    struct watchdog_worker *w; /* owned */
};

/* 0 or -ENOMEM. cfg is copied; warmup 0 is taken as 1, safety <= 0 as 1. */
int watchdog_init(struct watchdog *wd, const struct watchdog_config *cfg, int nworkers);
void watchdog_free(struct watchdog *wd);

void watchdog_start(struct watchdog *wd, int i, uint64_t now_ms);
void watchdog_exit(struct watchdog *wd, int i);

/* A valid progress line from local rank i at now_ms (has_step: it carried a
 * step). Returns true when AUTO's learned timeout changed enough to be worth
 * saying (see WATCHDOG_CHANGE_FRACTION); watchdog_timeout() gives it. */
bool watchdog_report(struct watchdog *wd, int i, uint64_t now_ms, bool has_step, int64_t step);

/* The timeout that applies to local rank i now: the initial one before its
 * first line, else the fixed, learned or warm-up one; 0 when it is not
 * watched (not running, watchdog off, initial timeout off). */
uint64_t watchdog_timeout(const struct watchdog *wd, int i);

/* When local rank i is hung unless it reports first; 0: never. */
uint64_t watchdog_deadline(const struct watchdog *wd, int i);

/* The earliest deadline of all ranks; 0: none. */
uint64_t watchdog_next_deadline(const struct watchdog *wd);

/* The lowest local rank whose deadline is at or before now_ms, or -1. */
int watchdog_hung(const struct watchdog *wd, uint64_t now_ms);

/* "off", "fixed", "auto". */
const char *watchdog_mode_name(enum watchdog_mode m);

#endif
