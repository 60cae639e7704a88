/* watchdog_core.c: the collective watchdog's decisions; see watchdog_core.h. */
#include "trainer/comm/watchdog_core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

int trn_wd_init(struct trn_wd_core *w, double timeout_s, double grace_s, size_t cap)
{
    memset(w, 0, sizeof(*w));
    w->ring = calloc(cap ? cap : 1, sizeof(*w->ring));
    if (w->ring == NULL)
        return -ENOMEM;
    w->cap = cap ? cap : 1;
    w->timeout_s = timeout_s;
    w->grace_s = grace_s > 0 ? grace_s : 0;
    w->head = 1;
    w->next_seq = 1;
    return 0;
}

void trn_wd_free(struct trn_wd_core *w)
{
    free(w->ring);
    w->ring = NULL;
    w->cap = 0;
}

static struct trn_wd_entry *slot(const struct trn_wd_core *w, uint64_t seq)
{
    return &w->ring[seq % w->cap];
}

/* Drops completed collectives from the front, so head is the oldest
 * unfinished one (or next_seq when none is). */
static void pop_done(struct trn_wd_core *w)
{
    while (w->head < w->next_seq && slot(w, w->head)->done) {
        slot(w, w->head)->seq = 0;
        w->head++;
    }
}

int trn_wd_enqueued(struct trn_wd_core *w, const struct trn_wd_coll *c, uint64_t now_ns,
                    uint64_t *seq)
{
    if (w->next_seq - w->head >= w->cap)
        return CDDP_ETOOBIG;
    uint64_t s = w->next_seq++;
    struct trn_wd_entry *e = slot(w, s);
    e->seq = s;
    e->c = *c;
    e->start_ns = now_ns;
    e->done = false;
    *seq = s;
    return 0;
}

bool trn_wd_in_flight(const struct trn_wd_core *w, uint64_t seq)
{
    if (seq < w->head || seq >= w->next_seq)
        return false;
    const struct trn_wd_entry *e = slot(w, seq);
    return e->seq == seq && !e->done;
}

int trn_wd_completed(struct trn_wd_core *w, uint64_t seq)
{
    if (!trn_wd_in_flight(w, seq))
        return CDDP_ENOTFOUND;
    slot(w, seq)->done = true;
    pop_done(w);
    return 0;
}

void trn_wd_async_error(struct trn_wd_core *w, int code, const char *detail, uint64_t now_ns)
{
    if (w->async)
        return;
    w->async = true;
    w->async_code = code < 0 ? code : CDDP_EPEER;
    w->async_ns = now_ns;
    cddp_strlcpy(w->async_detail, detail ? detail : "", sizeof(w->async_detail));
}

uint64_t trn_wd_oldest(const struct trn_wd_core *w)
{
    return w->head < w->next_seq ? w->head : 0;
}

uint64_t trn_wd_last_seq(const struct trn_wd_core *w)
{
    return w->next_seq - 1;
}

size_t trn_wd_pending(const struct trn_wd_core *w)
{
    size_t n = 0;
    for (uint64_t s = w->head; s < w->next_seq; s++)
        n += !slot(w, s)->done;
    return n;
}

static uint64_t secs_ns(double s)
{
    return s > 0 ? (uint64_t)(s * 1e9) : 0;
}

enum trn_wd_verdict trn_wd_check(const struct trn_wd_core *w, uint64_t now_ns,
                                 struct trn_wd_decision *d)
{
    memset(d, 0, sizeof(*d));
    d->timeout_s = w->timeout_s;
    d->detail = "";
    d->next_ns = UINT64_MAX;
    uint64_t oldest = trn_wd_oldest(w);
    if (oldest != 0) {
        d->have_blamed = true;
        d->blamed = *slot(w, oldest);
        d->waited_s =
            now_ns > d->blamed.start_ns ? (double)(now_ns - d->blamed.start_ns) * 1e-9 : 0.0;
        uint64_t limit = secs_ns(w->timeout_s) + secs_ns(w->grace_s);
        d->next_ns = d->blamed.start_ns + limit + 1;
        if (now_ns > d->blamed.start_ns && now_ns - d->blamed.start_ns > limit) {
            d->verdict = TRN_WD_TIMEOUT;
            d->code = CDDP_ETIMEOUT;
        }
    }
    /* An asynchronous error wins: it says why the collective is stuck. */
    if (w->async) {
        d->verdict = TRN_WD_ASYNC_ERROR;
        d->code = w->async_code;
        d->detail = w->async_detail;
        d->next_ns = now_ns;
    }
    return d->verdict;
}

int trn_wd_missing(const int64_t *peer_seq, int world, int self, uint64_t seq, int *out, int max)
{
    int n = 0;
    for (int r = 0; r < world; r++) {
        if (r == self || peer_seq[r] < 0 || (uint64_t)peer_seq[r] >= seq)
            continue;
        if (n < max)
            out[n] = r;
        n++;
    }
    return n;
}

/* "allreduce #17 (bucket 3, step 42, 4096 bytes)" */
static void describe(const struct trn_wd_decision *d, char *buf, size_t len)
{
    if (!d->have_blamed) {
        snprintf(buf, len, "no collective in flight");
        return;
    }
    const struct trn_wd_entry *e = &d->blamed;
    char bucket[32] = "", step[32] = "";
    if (e->c.bucket >= 0)
        snprintf(bucket, sizeof(bucket), "bucket %d, ", e->c.bucket);
    if (e->c.step >= 0)
        snprintf(step, sizeof(step), "step %ld, ", e->c.step);
    snprintf(buf, len, "%s #%llu (%s%s%zu bytes)", trn_comm_coll_name(e->c.coll),
             (unsigned long long)e->seq, bucket, step, e->c.bytes);
}

/* "; ranks that never reached it: 1, 3" (at most 16 named, then "+N more"). */
static void missing_text(const int *missing, int nmissing, char *buf, size_t len)
{
    buf[0] = '\0';
    if (nmissing < 0)
        return;
    if (nmissing == 0) {
        snprintf(buf, len, "; every rank reached it (the slow one is inside it)");
        return;
    }
    size_t at =
        (size_t)snprintf(buf, len, "; rank%s that never reached it:", nmissing == 1 ? "" : "s");
    int shown = nmissing < 16 ? nmissing : 16;
    for (int i = 0; i < shown && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s %d", i ? "," : "", missing[i]);
    if (shown < nmissing && at < len)
        snprintf(buf + at, len - at, " (+%d more)", nmissing - shown);
}

int trn_wd_report(const struct trn_wd_decision *d, const char *backend, const int *missing,
                  int nmissing, char *buf, size_t len)
{
    char what[160], who[200];
    describe(d, what, sizeof(what));
    missing_text(missing, nmissing, who, sizeof(who));
    if (d->verdict == TRN_WD_ASYNC_ERROR)
        return snprintf(buf, len, "%s reported an error during %s after %.1f s: %s%s", backend,
                        what, d->waited_s, d->detail, who);
    return snprintf(buf, len, "%s not complete after %.1f s (--collective-timeout %g s; %s)%s",
                    what, d->waited_s, d->timeout_s, backend, who);
}

void trn_wd_error(const struct trn_wd_decision *d, const char *backend, const int *missing,
                  int nmissing, struct trn_comm_error *err)
{
    memset(err, 0, sizeof(*err));
    err->code = d->code ? d->code : CDDP_ETIMEOUT;
    err->coll = d->have_blamed ? d->blamed.c.coll : TRN_COLL_BARRIER;
    cddp_strlcpy(err->op, d->have_blamed ? trn_comm_coll_name(d->blamed.c.coll) : "communicator",
                 sizeof(err->op));
    err->bytes = d->have_blamed ? d->blamed.c.bytes : 0;
    err->waited_s = d->waited_s;
    err->timeout_s = d->timeout_s;
    trn_wd_report(d, backend, missing, nmissing, err->detail, sizeof(err->detail));
}
