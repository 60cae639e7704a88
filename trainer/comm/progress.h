/*
 * progress.h: which ranks never reached a collective, through the store.
 *
 * A thread of its own publishes this rank's last enqueued sequence number
 * (watchdog_core.h: the same number names the same collective on every
 * rank) under nccl_key.h's progress key, at most once a period and only
 * when it changed. When the NCCL watchdog gives up on collective N it asks
 * (trn_comm_progress_missing) and the thread reads the other ranks' numbers:
 * a rank whose number is below N never enqueued it (it hangs before it, or
 * died). The store I/O stays on this thread, so a slow store never delays
 * the watchdog's polling; the question is bounded by a budget.
 *
 * The store (kv) is the caller's and must outlive trn_comm_progress_stop;
 * only this thread uses it meanwhile (kv.h: one thread at a time), so give
 * it a connection of its own. A number published up to a period late can
 * make a rank that reached N in the last period look missing; the report
 * therefore says "never reached it" only of numbers older than that.
 */
#ifndef CDDP_TRAINER_COMM_PROGRESS_H
#define CDDP_TRAINER_COMM_PROGRESS_H

#include <stdint.h>

#include "trainer/comm/kv.h"

struct trn_comm_progress;

/* Starts the thread. period_s <= 0: 1 s. 0 or a negative code. */
int trn_comm_progress_start(struct trn_kv *kv, long restart_count, long rdzv_round, int rank,
                            int world, double period_s, struct trn_comm_progress **out);

/* This rank enqueued seq (any thread; cheap: an atomic store). */
void trn_comm_progress_note(struct trn_comm_progress *p, uint64_t seq);

/* Waits up to budget_s for the thread to read the others' numbers; writes
 * the ranks known not to have reached seq (up to max, in rank order) and
 * returns how many there are, or -1 when the answer did not come in time
 * (the store is slow or gone). */
int trn_comm_progress_missing(struct trn_comm_progress *p, uint64_t seq, double budget_s, int *out,
                              int max);

/* The same, keeping only the ranks furthest behind (the lowest number):
 * those the others wait for, without the ranks stuck in an earlier
 * collective waiting for them (gloo, --restart_scope=worker's blame). */
int trn_comm_progress_lowest(struct trn_comm_progress *p, uint64_t seq, double budget_s, int *out,
                             int max);

/* Stops and joins the thread (after its store call in flight, if any). */
void trn_comm_progress_stop(struct trn_comm_progress *p);

#endif
