/*
 * watchdog_core.h: the collective watchdog's decisions, without threads,
 * clocks or CUDA (shared by gloo.c's guard and nccl.c's watchdog thread).
 *
 * A table of the collectives in flight, fed with three events: one was
 * enqueued (it gets the next sequence number), one completed, the backend
 * reported an asynchronous error. trn_wd_check(now) then says what to do:
 * nothing; a timeout (the oldest unfinished collective is blamed: every
 * later one waits behind it on the same stream or thread); or an
 * asynchronous error (at once, whatever the deadlines). The caller passes
 * `now` (CLOCK_MONOTONIC nanoseconds in the backends, a fake clock in
 * tests/unit/test_watchdog_core.c).
 *
 * Sequence numbers start at 1 and only grow (64 bits: they do not wrap in
 * any run). Every rank issues the same collectives in the same order
 * (comm.h), so sequence number N names the same collective on every rank;
 * trn_wd_missing() uses that to name the peers that never reached it.
 *
 * Deadline: a collective times out when now - start > timeout + grace
 * (strictly). `timeout` is the bound reported (--collective-timeout);
 * `grace` is extra slack before acting (gloo's guard leaves gloo's own
 * timeout handling time to answer first; NCCL's watchdog has none).
 *
 * Not thread-safe: the backend holds its own lock around every call.
 */
#ifndef CDDP_TRAINER_COMM_WATCHDOG_CORE_H
#define CDDP_TRAINER_COMM_WATCHDOG_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/comm/comm.h"

/* What the backend says about a collective when it enqueues it. */
struct trn_wd_coll {
    enum trn_comm_coll coll;
    int bucket;   /* DDP bucket index, or -1 */
    long step;    /* training step, or -1 */
    size_t bytes; /* payload per rank */
};

struct trn_wd_entry {
    uint64_t seq; /* 0: empty slot */
    struct trn_wd_coll c;
    uint64_t start_ns;
    bool done;
};

struct trn_wd_core {
    double timeout_s;
    double grace_s;
    size_t cap;                /* slots in ring */
    struct trn_wd_entry *ring; /* seq s lives at ring[s % cap] */
    uint64_t head;             /* the oldest seq still in the table (done or not) */
    uint64_t next_seq;         /* the seq the next enqueue gets */
    /* The first asynchronous error, if any. */
    bool async;
    int async_code;
    uint64_t async_ns;
    char async_detail[256];
};

enum trn_wd_verdict {
    TRN_WD_NONE = 0,    /* nothing to do */
    TRN_WD_TIMEOUT,     /* the blamed collective is past its deadline */
    TRN_WD_ASYNC_ERROR, /* the backend reported an error: give up now */
};

struct trn_wd_decision {
    enum trn_wd_verdict verdict;
    bool have_blamed;           /* false: nothing was in flight (async error only) */
    struct trn_wd_entry blamed; /* the oldest unfinished collective */
    double waited_s;            /* from blamed's start to now */
    double timeout_s;           /* the bound reported (without the grace) */
    int code;                   /* CDDP_ETIMEOUT, or the async error's code */
    const char *detail;         /* the async error's text ("" otherwise); points into the core */
    /* The earliest time the verdict can change without a new event: the
     * oldest unfinished collective's deadline plus 1 ns; UINT64_MAX when
     * nothing is in flight. Sleep until then (or a poll interval). */
    uint64_t next_ns;
};

/* Sets up an empty table of cap slots (cap >= 1). 0 or -ENOMEM. */
int trn_wd_init(struct trn_wd_core *w, double timeout_s, double grace_s, size_t cap);
void trn_wd_free(struct trn_wd_core *w);

/* Registers a collective started at now_ns; its sequence number goes to
 * *seq. CDDP_ETOOBIG when cap collectives since the oldest unfinished one
 * are still in the table (complete some first). */
int trn_wd_enqueued(struct trn_wd_core *w, const struct trn_wd_coll *c, uint64_t now_ns,
                    uint64_t *seq);
/* Marks seq complete (any order). 0, or CDDP_ENOTFOUND when seq is not in
 * flight (never enqueued, or already completed). */
int trn_wd_completed(struct trn_wd_core *w, uint64_t seq);
/* Records an asynchronous error (the first one is kept); code is a
 * negative CDDP_ code, detail one line. */
void trn_wd_async_error(struct trn_wd_core *w, int code, const char *detail, uint64_t now_ns);

/* True while seq is enqueued and not completed. */
bool trn_wd_in_flight(const struct trn_wd_core *w, uint64_t seq);
/* The oldest unfinished seq, or 0 when none. */
uint64_t trn_wd_oldest(const struct trn_wd_core *w);
/* The last seq handed out (0 before the first). */
uint64_t trn_wd_last_seq(const struct trn_wd_core *w);
/* Collectives in flight (unfinished). */
size_t trn_wd_pending(const struct trn_wd_core *w);

/* The verdict at now_ns. */
enum trn_wd_verdict trn_wd_check(const struct trn_wd_core *w, uint64_t now_ns,
                                 struct trn_wd_decision *d);

/* Which peers never reached collective seq: peer_seq[r] is the last seq
 * rank r enqueued, or < 0 when unknown (self is skipped). Writes up to max
 * ranks to out, in rank order, and returns how many there are in all. */
int trn_wd_missing(const int64_t *peer_seq, int world, int self, uint64_t seq, int *out, int max);

/* The one-line report: the collective, its sequence number, bucket, step
 * and bytes, the seconds waited and the bound, and the missing ranks when
 * nmissing >= 0 (how many; missing[] holds the first min(nmissing, 16), the
 * ones named; < 0: not known).
 * backend: "nccl", "gloo". Returns what snprintf returns. */
int trn_wd_report(const struct trn_wd_decision *d, const char *backend, const int *missing,
                  int nmissing, char *buf, size_t len);

/* The trn_comm_error for d: code, collective, bytes, waited and bound from
 * the decision; detail from trn_wd_report. op is "communicator" when
 * nothing was in flight. */
void trn_wd_error(const struct trn_wd_decision *d, const char *backend, const int *missing,
                  int nmissing, struct trn_comm_error *err);

#endif
