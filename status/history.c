/* history.c: see history.h. The JSON is documented in docs/status.md
 * ("/history"): change both together. */
#include "status/history.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/jsonw.h"

static const char *const event_names[] = {
    "restart", "round",       "straggler", "straggler_end",
    "end",     "node_joined", "node_left", "node_lost",
};
_Static_assert(sizeof(event_names) / sizeof(event_names[0]) == STATUS_HISTORY_EVENT_KIND_COUNT,
               "history event names");

const char *status_history_event_name(enum status_history_event_kind k)
{
    return (unsigned)k < STATUS_HISTORY_EVENT_KIND_COUNT ? event_names[k] : "unknown";
}

int status_history_init(struct status_history *h, int nseries, size_t cap, size_t cap_events)
{
    memset(h, 0, sizeof(*h));
    if (nseries < 0 || cap < STATUS_HISTORY_POINTS_MIN || cap > STATUS_HISTORY_POINTS_MAX ||
        cap % 2 != 0 || cap_events < 1 || cap_events > STATUS_HISTORY_EVENTS_MAX)
        return CDDP_ERANGE_ARG;
    h->cap = cap;
    h->cap_events = cap_events;
    h->nseries = nseries;
    h->series = calloc(nseries > 0 ? (size_t)nseries : 1, sizeof(*h->series));
    h->events = calloc(cap_events, sizeof(*h->events));
    if (h->series == NULL || h->events == NULL) {
        status_history_free(h);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    for (int i = 0; i < nseries; i++) {
        struct status_history_series *s = &h->series[i];
        s->pts = calloc(cap, sizeof(*s->pts));
        if (s->pts == NULL) {
            status_history_free(h);
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        }
        s->stride = 1;
        s->rank = -1;
    }
    return 0;
}

void status_history_free(struct status_history *h)
{
    if (h->series)
        for (int i = 0; i < h->nseries; i++)
            free(h->series[i].pts);
    free(h->series);
    free(h->events);
    memset(h, 0, sizeof(*h));
}

/* Keeps every other point (the first among them) and doubles the stride:
 * the points kept were samples k*stride, those left are k*2*stride. */
static void decimate(struct status_history_series *s)
{
    size_t j = 0;
    for (size_t i = 0; i < s->n; i += 2)
        s->pts[j++] = s->pts[i];
    s->n = j;
    s->stride *= 2;
}

void status_history_add_point(struct status_history *h, int i, int rank,
                              const struct status_history_point *p)
{
    if (i < 0 || i >= h->nseries)
        return;
    struct status_history_series *s = &h->series[i];
    struct status_history_point q = *p;
    q.seq = ++h->seq;
    s->rank = rank;
    uint64_t k = s->offered++;
    if (k % s->stride != 0) {
        s->latest = q;
        s->has_latest = true;
        return;
    }
    if (s->n == h->cap) {
        decimate(s);
        if (k % s->stride != 0) { /* not a sample of the new stride */
            s->latest = q;
            s->has_latest = true;
            return;
        }
    }
    s->pts[s->n++] = q;
    s->has_latest = false;
}

void status_history_add_event(struct status_history *h, const struct status_history_event *e)
{
    size_t at;
    if (h->ev_n == h->cap_events) {
        at = h->ev_head;
        h->ev_head = (h->ev_head + 1) % h->cap_events;
        h->events_dropped++;
    } else {
        at = (h->ev_head + h->ev_n) % h->cap_events;
        h->ev_n++;
    }
    h->events[at] = *e;
    h->events[at].seq = ++h->seq;
    h->events[at].reason[sizeof(h->events[at].reason) - 1] = '\0';
}

int64_t status_history_max_step(const struct status_history *h)
{
    int64_t m = -1;
    for (int i = 0; i < h->nseries; i++) {
        const struct status_history_series *s = &h->series[i];
        for (size_t k = 0; k < s->n; k++)
            if (s->pts[k].step > m)
                m = s->pts[k].step;
        if (s->has_latest && s->latest.step > m)
            m = s->latest.step;
    }
    return m;
}

int status_history_clone(struct status_history *dst, const struct status_history *src,
                         uint64_t since)
{
    memset(dst, 0, sizeof(*dst));
    dst->cap = src->cap;
    dst->cap_events = src->cap_events;
    dst->nseries = src->nseries;
    dst->series = calloc(src->nseries > 0 ? (size_t)src->nseries : 1, sizeof(*dst->series));
    dst->events = calloc(src->cap_events, sizeof(*dst->events));
    if (dst->series == NULL || dst->events == NULL)
        goto nomem;
    for (int i = 0; i < src->nseries; i++) {
        const struct status_history_series *s = &src->series[i];
        /* Points are in seq order: copy the tail newer than since. */
        size_t from = s->n;
        while (from > 0 && s->pts[from - 1].seq > since)
            from--;
        struct status_history_series *d = &dst->series[i];
        *d = *s;
        d->n = s->n - from;
        d->pts = calloc(d->n > 0 ? d->n : 1, sizeof(*d->pts));
        if (d->pts == NULL)
            goto nomem;
        memcpy(d->pts, s->pts + from, d->n * sizeof(*d->pts));
    }
    memcpy(dst->events, src->events, src->cap_events * sizeof(*dst->events));
    dst->ev_head = src->ev_head;
    dst->ev_n = src->ev_n;
    dst->events_dropped = src->events_dropped;
    dst->seq = src->seq;
    return 0;
nomem:
    status_history_free(dst);
    return CDDP_ERR_FROM_ERRNO(ENOMEM);
}

/* A point as a row: [seq, t, step, loss, samples_per_s, step_time_s, attempt]. */
static void put_point(struct jsonw *j, const char *key, const struct status_history_point *p)
{
    jsonw_array_begin(j, key);
    jsonw_int(j, NULL, (int64_t)p->seq);
    jsonw_seconds(j, NULL, p->t);
    if (p->step >= 0)
        jsonw_int(j, NULL, p->step);
    else
        jsonw_null(j, NULL);
    jsonw_number_digits(j, NULL, p->loss, 6);
    jsonw_number_digits(j, NULL, p->samples_per_s, 6);
    jsonw_number_digits(j, NULL, p->step_time_s, 6);
    jsonw_int(j, NULL, p->attempt);
    jsonw_array_end(j);
}

int status_history_render(const struct status_history *h, uint64_t since, double now,
                          double started_at, struct cddp_buf *out)
{
    struct jsonw j;
    jsonw_init(&j, out);
    jsonw_object_begin(&j, NULL);
    jsonw_seconds(&j, "generated_at", now);
    jsonw_seconds(&j, "started_at", started_at);
    jsonw_int(&j, "seq", (int64_t)h->seq);
    jsonw_int(&j, "since", (int64_t)since);
    jsonw_int(&j, "capacity", (int64_t)h->cap);
    jsonw_int(&j, "events_capacity", (int64_t)h->cap_events);
    jsonw_array_begin(&j, "columns");
    static const char *const cols[] = {"seq",           "t",           "step",   "loss",
                                       "samples_per_s", "step_time_s", "attempt"};
    for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++)
        jsonw_string(&j, NULL, cols[c]);
    jsonw_array_end(&j);
    jsonw_array_begin(&j, "series");
    for (int i = 0; i < h->nseries; i++) {
        const struct status_history_series *s = &h->series[i];
        jsonw_object_begin(&j, NULL);
        jsonw_int(&j, "local_rank", i);
        jsonw_int(&j, "rank", s->rank);
        jsonw_int(&j, "samples", (int64_t)s->offered);
        jsonw_int(&j, "stride", (int64_t)s->stride);
        jsonw_array_begin(&j, "points");
        for (size_t k = 0; k < s->n; k++)
            if (s->pts[k].seq > since)
                put_point(&j, NULL, &s->pts[k]);
        jsonw_array_end(&j);
        /* The newest sample when it was not kept: the plot reaches it. */
        if (s->has_latest && s->latest.seq > since) {
            put_point(&j, "latest", &s->latest);
        } else {
            jsonw_null(&j, "latest");
        }
        jsonw_object_end(&j);
    }
    jsonw_array_end(&j);
    jsonw_int(&j, "events_dropped", (int64_t)h->events_dropped);
    jsonw_array_begin(&j, "events");
    for (size_t k = 0; k < h->ev_n; k++) {
        const struct status_history_event *e = &h->events[(h->ev_head + k) % h->cap_events];
        if (e->seq <= since)
            continue;
        jsonw_object_begin(&j, NULL);
        jsonw_int(&j, "seq", (int64_t)e->seq);
        jsonw_seconds(&j, "t", e->t);
        jsonw_string(&j, "kind", status_history_event_name(e->kind));
        if (e->local_rank >= 0)
            jsonw_int(&j, "local_rank", e->local_rank);
        else
            jsonw_null(&j, "local_rank");
        if (e->step >= 0)
            jsonw_int(&j, "step", e->step);
        else
            jsonw_null(&j, "step");
        jsonw_int(&j, "attempt", e->attempt);
        jsonw_number(&j, "value", e->value);
        jsonw_string(&j, "reason", e->reason);
        jsonw_object_end(&j);
    }
    jsonw_array_end(&j);
    jsonw_object_end(&j);
    return jsonw_finish(&j);
}
