/*
 * progress.h: the worker progress channel, both ends: the worker's line
 * writer and the agent's parser (pure: no I/O, no clock).
 *
 * Each worker may write one JSON object per line to the file descriptor
 * named by CDDP_PROGRESS_FD (docs/status.md):
 *
 *     {"step":120,"epoch":1,"loss":2.31,"samples_per_s":612.5}
 *
 * The agent reads the pipe without blocking and hands whatever bytes arrived
 * to progress_feed(); lines may arrive split or several at a time. Known
 * fields, all optional:
 *
 *     step           integer >= 0
 *     epoch          integer >= 0
 *     loss           number; Python's NaN, Infinity and -Infinity are
 *                    accepted, because a diverging loss is when you want it
 *     samples_per_s  number >= 0
 *     step_time_s    number >= 0: seconds a step took (the mean over the steps
 *                    since the worker's previous line)
 *     compute_s      number >= 0: of that, the time outside collective waits
 *     wait_s         number >= 0: the time blocked in collectives
 *     blame          integer >= 0: cddp-train under --restart_scope=worker: this
 *                    global rank never reached a collective that timed
 *                    out (docs/distributed.md, "Recovering in place");
 *                    with blame_gen, integer >= 0: the generation it was in
 *     auto           true: the line comes from cddprun's automatic progress
 *                    hook (a Python worker's optimizer steps), not from the
 *                    script; false or absent: from the script
 *
 * A valid line updates the fields it carries; the others keep their last
 * value (so a script may report the loss less often than the step). Once a
 * line without "auto" arrived in an attempt, lines with "auto" are ignored
 * for the rest of it (not counted, no field taken): the hook stands aside
 * for a script that writes its own progress. Unknown
 * keys are ignored, so scripts can send more. A line that is not a JSON
 * object, has a known field of the wrong type, or is longer than
 * PROGRESS_LINE_MAX is dropped whole and counted in `malformed`; blank
 * lines are ignored. JSON nesting is bounded (PROGRESS_MAX_DEPTH).
 *
 * Times are the caller's: the monotonic ms and wall seconds at which the
 * bytes were read: mono_ms says when the last valid line arrived and
 * step_mono_ms when its step last changed, which is what tells a worker
 * that still talks from one that still makes progress.
 */
#ifndef CDDP_PROTO_PROGRESS_H
#define CDDP_PROTO_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strutil.h"

#define PROGRESS_LINE_MAX 4096 /* bytes, newline excluded; PIPE_BUF writes stay whole */
#define PROGRESS_MAX_DEPTH 16
/* The blame lines kept, newest last: a read may carry several (a rank
 * names every rank furthest behind, one line each, all in one write);
 * older ones are lost. cddp-train names at most this many at once
 * (trainer/blame.c), so one write is kept whole. */
#define PROGRESS_BLAMES_KEPT 16

/* Bits of progress_report.fields. */
enum {
    PROGRESS_STEP = 1u << 0,
    PROGRESS_EPOCH = 1u << 1,
    PROGRESS_LOSS = 1u << 2,
    PROGRESS_SAMPLES_PER_S = 1u << 3,
    PROGRESS_STEP_TIME = 1u << 4,
    PROGRESS_COMPUTE = 1u << 5,
    PROGRESS_WAIT = 1u << 6,
    PROGRESS_BLAME = 1u << 7,
    PROGRESS_BLAME_GEN = 1u << 8,
};

/* The latest values of one worker: plain data, copied into status views. */
struct progress_report {
    unsigned fields; /* PROGRESS_* bits: which values have been reported */
    int64_t step;
    int64_t epoch;
    double loss;
    double samples_per_s;
    double step_time_s;
    double compute_s;
    double wait_s;
    int64_t blame;     /* the last rank named by "blame" */
    int64_t blame_gen; /* and its "blame_gen" (0 when absent) */
    uint64_t blames;   /* lines with "blame" (per slot, like lines) */
    /* The last PROGRESS_BLAMES_KEPT of them: line k (counting from 0) is
     * at [k % PROGRESS_BLAMES_KEPT]. */
    int64_t blame_ranks[PROGRESS_BLAMES_KEPT];
    int64_t blame_gens[PROGRESS_BLAMES_KEPT];
    bool from_auto;   /* the values came from "auto" lines (the hook), none yet from the script */
    bool own;         /* this attempt sent a line without "auto": "auto" lines are ignored */
    double wall;      /* wall time of the last valid line; 0 = none yet */
    uint64_t mono_ms; /* monotonic ms of the last valid line; 0 = none yet */
    uint64_t step_mono_ms; /* monotonic ms when step last changed; 0 = never */
    uint64_t lines;        /* valid lines */
    uint64_t malformed;    /* dropped lines (bad JSON, bad field, too long) */
};

struct progress_parser {
    struct progress_report report;
    size_t len;       /* bytes of the current partial line in buf */
    bool overflowing; /* the current line passed PROGRESS_LINE_MAX: skip to newline */
    char buf[PROGRESS_LINE_MAX + 1];
};

void progress_init(struct progress_parser *p);

/* A new worker attempt on the same slot: forgets the values and any partial
 * line, keeps the line counters (they are per slot, for _total metrics). */
void progress_restart(struct progress_parser *p);

/* Feeds n bytes read at (now_mono_ms, now_wall). Returns the number of valid
 * lines they completed. */
unsigned progress_feed(struct progress_parser *p, const char *data, size_t n, uint64_t now_mono_ms,
                       double now_wall);

/* End of the stream: a last line without a newline is taken as a line.
 * Returns 1 when it was valid, else 0. */
unsigned progress_eof(struct progress_parser *p, uint64_t now_mono_ms, double now_wall);

/* Parses one line (no newline) into *out, leaving fields absent from the line
 * untouched and setting *fields to the ones present; *is_auto says whether
 * it carried "auto": true. 0, or CDDP_EPARSE. */
int progress_parse_line(const char *line, size_t len, struct progress_report *out, unsigned *fields,
                        bool *is_auto);

/* What a worker writes in one line (cddp-train's every step). */
struct progress_line {
    int64_t step;
    int64_t epoch;
    double loss;
    double samples_per_s;
    /* Seconds; a negative value leaves the field out. */
    double step_time_s;
    double compute_s;
    double wait_s;
};

/* The worker's end: appends one line (the object above and a newline) to
 * out: the step and epoch as integers, the loss to six significant digits,
 * samples_per_s to three decimals, the times (those >= 0) to six. A loss
 * that is not finite is written as 0, so the line stays JSON every reader
 * takes. 0, or out's error (CDDP_ETOOBIG past its maximum, CDDP_ENOMEM). */
int progress_format_line(struct cddp_buf *out, const struct progress_line *l);

#endif
