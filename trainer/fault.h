/*
 * fault.h: fault injection for cddp-train (--fault), off unless asked.
 *
 *     --fault crash@step=N[,rank=R][,every]     exit 1 when step N begins
 *     --fault crash@reform[,rank=R]             exit 1 while re-forming in place
 *                                               (--restart_scope=worker), after the
 *                                               position is broadcast and before the
 *                                               weights: in any generation, any attempt
 *     --fault hang@step=N[,rank=R][,every]      block forever before step N's first collective
 *     --fault slow@step=N,ms=M[,rank=R][,for=K][,every]
 *                                               sleep M ms as each of the K steps
 *                                               from step N begins (K: 1 unless given)
 *     --fault nocma@rank=R                      rank R's reads of a peer's memory on its
 *                                               host (cma.h) fail with EPERM, as under a
 *                                               seccomp profile: the state comes over the
 *                                               network instead
 *
 * Steps are the training loop's global step counter (0-based, continued
 * across a resume). Without rank= the fault fires on every rank. A restarted
 * attempt (TORCHELASTIC_RESTART_COUNT > 0) does not fire it again unless
 * ",every" is given, so a crash at step N followed by a restart from an
 * earlier checkpoint runs through step N the second time.
 *
 * Parsing and the "is it due" decision are pure; trn_fault_fire() is the
 * shell that acts.
 */
#ifndef CDDP_TRAINER_FAULT_H
#define CDDP_TRAINER_FAULT_H

#include <stdbool.h>
#include <stddef.h>

enum trn_fault_kind {
    TRN_FAULT_NONE = 0,
    TRN_FAULT_CRASH,
    TRN_FAULT_HANG,
    TRN_FAULT_SLOW,
    TRN_FAULT_NOCMA,
};

struct trn_fault {
    enum trn_fault_kind kind;
    long step;     /* >= 0 */
    int rank;      /* -1: every rank */
    int rank_last; /* rank=R-S: S, the last of the ranks R..S it fires on; else rank */
    long ms;       /* slow only, > 0 */
    long count;    /* slow only: the steps it lasts, from step (0 and 1: one) */
    bool every;
    bool at_reform; /* crash@reform: trn_fault_reform, never at a step */
};

/* Parses one --fault value into *out. 0, or CDDP_EPARSE / CDDP_ERANGE_ARG with
 * a one-line reason in err (which names the offending part). *out is zeroed
 * (TRN_FAULT_NONE) on error. */
int trn_fault_parse(const char *spec, struct trn_fault *out, char *err, size_t errlen);

/* True when f fires on `rank` as step `step` begins in restart attempt
 * `restart_count` (TORCHELASTIC_RESTART_COUNT): at step f->step, and for a
 * lasting slowdown at each of the f->count steps from there. Pure. */
bool trn_fault_due(const struct trn_fault *f, long step, int rank, long restart_count);

/* "crash", "hang", "slow", "nocma" or "none". */
const char *trn_fault_kind_name(enum trn_fault_kind kind);

/* Carries out a due fault: crash exits 1 (after a log line), hang blocks
 * forever (until a signal ends the process), slow sleeps f->ms and returns
 * (its log line comes with the first step it slows). */
void trn_fault_fire(const struct trn_fault *f, long step, int rank);
/* crash@reform on this rank: exits 1 (log T6105) while the state of
 * generation `generation` is being taken; otherwise returns at once. */
void trn_fault_reform(const struct trn_fault *f, int rank, long generation);
/* nocma@rank=R on this rank: its reads of a peer's memory are to fail. */
bool trn_fault_nocma(const struct trn_fault *f, int rank);

#endif
