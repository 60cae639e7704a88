/*
 * filetimer_core.h: torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER), the
 * pure part: one request line parsed, and the table of armed timers.
 *
 * torch's FileTimerClient (torch/distributed/elastic/timer/
 * file_based_local_timer.py, 1.13 to 2.x) opens the agent's named pipe,
 * writes one JSON object and a newline in a single write of at most
 * PIPE_BUF bytes, and closes it:
 *
 *     {"version": 1, "pid": 4242, "scope_id": "train.py#12",
 *      "expiration_time": 1764592000.25, "signal": 9}
 *
 * expiration_time is wall-clock seconds (time.time() + after); a negative
 * one releases the timer (pid, scope_id). signal <= 0 arms a timer that
 * kills nothing. torch's FileTimerServer, per pass: a pid with any expired
 * timer is reaped with the signal of its earliest expired timer that has
 * one (> 0), and every timer of that pid is dropped, reaped or not.
 *
 *     filetimer_parse(line, len, &req, err, errlen)   one line (no newline)
 *     filetimer_apply(t, &req)                         arm or release
 *     filetimer_expired(t, now, kills, max)            what to kill at now
 *     filetimer_next(t)                                the earliest expiry
 *
 * No clock, no I/O, no libuv: times are arguments. The table is bounded
 * (max timers, given at init): past it a new timer is refused, never an
 * allocation without end.
 */
#ifndef CDDP_AGENT_FILETIMER_CORE_H
#define CDDP_AGENT_FILETIMER_CORE_H

#include <stddef.h>
#include <stdint.h>

/* A request is one atomic pipe write: PIPE_BUF on Linux. */
#define FILETIMER_MAX_LINE 4096
#define FILETIMER_MAX_SCOPE 1024

struct filetimer_request {
    int64_t pid;
    char scope[FILETIMER_MAX_SCOPE]; /* scope_id, as sent (JSON escapes decoded) */
    double expiration;               /* wall-clock seconds; < 0: release */
    int signal;                      /* <= 0: no kill */
};

/* 0, or CDDP_EPARSE (not a JSON object), CDDP_EPROTO_FIELD (a field missing
 * or of the wrong type), CDDP_ERANGE_ARG (pid <= 0, signal > 64, a
 * non-finite time), CDDP_ETOOBIG (the scope); err says which, in a
 * sentence. */
int filetimer_parse(const char *line, size_t len, struct filetimer_request *out, char *err,
                    size_t errlen);

struct filetimer_entry {
    int64_t pid;
    char *scope; /* owned */
    double expiration;
    int signal;
};

struct filetimer_table {
    struct filetimer_entry *e;
    size_t n, cap, max;
};

/* What one expired pid gets: signal 0 means torch would not reap it (no
 * expired timer of it had a signal); it is dropped all the same. */
struct filetimer_kill {
    int64_t pid;
    int signal;
    double expiration; /* of the timer that chose the signal (or the earliest) */
    char scope[FILETIMER_MAX_SCOPE];
};

void filetimer_table_init(struct filetimer_table *t, size_t max_timers);
void filetimer_table_free(struct filetimer_table *t);
void filetimer_clear(struct filetimer_table *t);

/* Arms (replacing the same pid and scope) or releases. 0, or CDDP_ETOOBIG
 * (the table is full; nothing changed), or -ENOMEM. Releasing a timer that
 * is not armed is not an error (torch ignores it). */
int filetimer_apply(struct filetimer_table *t, const struct filetimer_request *r);

/* The pids with a timer expired at now (expiration <= now), at most max of
 * them in kills (the rest stay for the next call); their timers are
 * removed. Returns how many were written. */
size_t filetimer_expired(struct filetimer_table *t, double now, struct filetimer_kill *kills,
                         size_t max);

/* The earliest expiration armed, or 0 when none. */
double filetimer_next(const struct filetimer_table *t);

#endif
