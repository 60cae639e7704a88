/* progress.c: publishing sequence numbers, naming missing ranks; see progress.h. */
#include "trainer/comm/progress.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/strutil.h"
#include "trainer/comm/nccl_key.h"
#include "trainer/comm/watchdog_core.h"

/* How long one peer's number is waited for (absent: unknown). */
#define PEER_GET_S 0.05

struct trn_comm_progress {
    struct trn_kv *kv;
    long restart_count, rdzv_round;
    int rank, world;
    double period_s;
    _Atomic uint64_t noted;
    uint64_t published;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stopping;
    uint64_t asked;    /* a question (the blamed seq), 0: none */
    bool lowest;       /* ...of the ranks furthest behind only */
    bool answered;     /* the answer to `asked` is in missing/nmissing */
    int *missing;      /* world entries */
    int nmissing;      /* -1: unknown */
    int64_t *peer_seq; /* world entries, the thread's scratch */
};

static void deadline_in(double s, struct timespec *ts)
{
    uint64_t at = cddp_mono_ns() + (uint64_t)(s * 1e9);
    ts->tv_sec = (time_t)(at / 1000000000u);
    ts->tv_nsec = (long)(at % 1000000000u);
}

static void publish(struct trn_comm_progress *p, uint64_t seq)
{
    char key[160], val[32];
    if (trn_nccl_progress_key(NULL, p->restart_count, p->rdzv_round, p->rank, key, sizeof(key)))
        return;
    int n = snprintf(val, sizeof(val), "%llu", (unsigned long long)seq);
    if (p->kv->ops->set(p->kv, key, val, (size_t)n) == 0)
        p->published = seq;
}

/* Reads every other rank's number (absent or unreadable: -1). */
static void read_peers(struct trn_comm_progress *p)
{
    for (int r = 0; r < p->world; r++) {
        p->peer_seq[r] = -1;
        char key[160];
        void *val = NULL;
        size_t len = 0;
        if (r == p->rank ||
            trn_nccl_progress_key(NULL, p->restart_count, p->rdzv_round, r, key, sizeof(key)))
            continue;
        if (p->kv->ops->get(p->kv, key, PEER_GET_S, &val, &len) != 0)
            continue;
        char text[32];
        size_t n = len < sizeof(text) - 1 ? len : sizeof(text) - 1;
        memcpy(text, val, n);
        text[n] = '\0';
        free(val);
        long v;
        if (cddp_parse_long(text, 0, LONG_MAX, &v) == 0)
            p->peer_seq[r] = v;
    }
}

/* Of missing[0..n), the ranks whose number is the lowest: those the
 * others wait for (a rank stuck in an earlier collective than the asker's,
 * waiting for a hung one, is behind too, but not the cause). */
static int keep_lowest(const int64_t *peer_seq, int *missing, int n)
{
    int64_t low = INT64_MAX;
    for (int i = 0; i < n; i++)
        if (peer_seq[missing[i]] < low)
            low = peer_seq[missing[i]];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (peer_seq[missing[i]] == low)
            missing[k++] = missing[i];
    return k;
}

static void *progress_thread(void *arg)
{
    struct trn_comm_progress *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        if (p->asked != 0 && !p->answered) {
            uint64_t seq = p->asked;
            pthread_mutex_unlock(&p->mu);
            uint64_t now_seq = atomic_load(&p->noted);
            if (now_seq != p->published)
                publish(p, now_seq); /* the others may be asking too */
            read_peers(p);
            int n = trn_wd_missing(p->peer_seq, p->world, p->rank, seq, p->missing, p->world);
            pthread_mutex_lock(&p->mu);
            if (p->lowest)
                n = keep_lowest(p->peer_seq, p->missing, n);
            p->nmissing = n;
            p->answered = true;
            pthread_cond_broadcast(&p->cv);
            continue;
        }
        uint64_t seq = atomic_load(&p->noted);
        if (seq != 0 && seq != p->published) {
            pthread_mutex_unlock(&p->mu);
            publish(p, seq);
            pthread_mutex_lock(&p->mu);
        }
        struct timespec ts;
        deadline_in(p->period_s, &ts);
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int trn_comm_progress_start(struct trn_kv *kv, long restart_count, long rdzv_round, int rank,
                            int world, double period_s, struct trn_comm_progress **out)
{
    *out = NULL;
    if (world < 1 || rank < 0 || rank >= world || kv == NULL)
        return CDDP_ERANGE_ARG;
    struct trn_comm_progress *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    p->missing = calloc((size_t)world, sizeof(*p->missing));
    p->peer_seq = calloc((size_t)world, sizeof(*p->peer_seq));
    if (p->missing == NULL || p->peer_seq == NULL) {
        free(p->missing);
        free(p->peer_seq);
        free(p);
        return -ENOMEM;
    }
    p->kv = kv;
    p->restart_count = restart_count;
    p->rdzv_round = rdzv_round;
    p->rank = rank;
    p->world = world;
    p->period_s = period_s > 0 ? period_s : 1.0;
    atomic_init(&p->noted, 0);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&p->thread, NULL, progress_thread, p);
    if (rc != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p->missing);
        free(p->peer_seq);
        free(p);
        return -rc;
    }
    *out = p;
    return 0;
}

void trn_comm_progress_note(struct trn_comm_progress *p, uint64_t seq)
{
    atomic_store(&p->noted, seq);
}

static int ask(struct trn_comm_progress *p, uint64_t seq, bool lowest, double budget_s, int *out,
               int max)
{
    struct timespec ts;
    deadline_in(budget_s, &ts);
    pthread_mutex_lock(&p->mu);
    p->asked = seq;
    p->lowest = lowest;
    p->answered = false;
    pthread_cond_broadcast(&p->cv);
    while (!p->answered)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT)
            break;
    int n = p->answered ? p->nmissing : -1;
    for (int i = 0; i < n && i < max; i++)
        out[i] = p->missing[i];
    pthread_mutex_unlock(&p->mu);
    return n;
}

int trn_comm_progress_missing(struct trn_comm_progress *p, uint64_t seq, double budget_s, int *out,
                              int max)
{
    return ask(p, seq, false, budget_s, out, max);
}

int trn_comm_progress_lowest(struct trn_comm_progress *p, uint64_t seq, double budget_s, int *out,
                             int max)
{
    return ask(p, seq, true, budget_s, out, max);
}

void trn_comm_progress_stop(struct trn_comm_progress *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->missing);
    free(p->peer_seq);
    free(p);
}
