/* goodput.c: see goodput.h. Pure: no clock, no I/O, no allocation. */
#include "agent/goodput.h"

#include <stdio.h>
#include <string.h>

const char *goodput_phase_name(enum goodput_phase p)
{
    switch (p) {
    case GOODPUT_INIT:
        return "init";
    case GOODPUT_PRODUCTIVE:
        return "productive";
    case GOODPUT_LOST:
        return "lost";
    case GOODPUT_RESTART:
        return "restart";
    case GOODPUT_RENDEZVOUS:
        return "rendezvous";
    case GOODPUT_STOPPED:
        return "stopped";
    case GOODPUT_PHASE_COUNT:
        break;
    }
    return "unknown";
}

void goodput_init(struct goodput *g, uint64_t now)
{
    memset(g, 0, sizeof(*g));
    g->start_ms = now;
    g->since_ms = now;
    g->mode = GOODPUT_MODE_INIT;
    g->phase = GOODPUT_INIT;
}

/* The time since the phase began goes to it. A clock that seems to go back
 * (it cannot: monotonic) would add nothing. */
static void accrue(struct goodput *g, uint64_t now)
{
    if (now > g->since_ms)
        g->ms[g->phase] += now - g->since_ms;
    if (now > g->since_ms)
        g->since_ms = now;
}

static enum goodput_phase phase_for(const struct goodput *g)
{
    switch (g->mode) {
    case GOODPUT_MODE_INIT:
        return GOODPUT_INIT;
    case GOODPUT_MODE_RENDEZVOUS:
        return GOODPUT_RENDEZVOUS;
    case GOODPUT_MODE_RUNNING:
        if (g->attempt_has_step)
            return GOODPUT_PRODUCTIVE;
        return g->any_step || g->attempts > 1 ? GOODPUT_RESTART : GOODPUT_INIT;
    case GOODPUT_MODE_RESTARTING:
        return GOODPUT_RESTART;
    case GOODPUT_MODE_STOPPED:
        return GOODPUT_STOPPED;
    }
    return GOODPUT_STOPPED;
}

void goodput_mode(struct goodput *g, enum goodput_mode m, uint64_t now)
{
    if (m == g->mode)
        return;
    accrue(g, now);
    if (g->mode == GOODPUT_MODE_RUNNING && g->attempt_has_step)
        g->end_ms = g->since_ms;
    if (m == GOODPUT_MODE_RUNNING) {
        g->attempts++;
        g->attempt_has_step = false;
    }
    g->mode = m;
    g->phase = phase_for(g);
}

/* When the history's attempt reported step s: interpolated between its
 * points; its first point's time below them, its last one's above. */
static uint64_t time_of(const struct goodput *g, int64_t s)
{
    const struct goodput_point *h = g->hist;
    if (s <= h[0].step)
        return h[0].ms;
    for (size_t i = 1; i < g->nhist; i++) {
        if (s < h[i].step) {
            double f = (double)(s - h[i - 1].step) / (double)(h[i].step - h[i - 1].step);
            return h[i - 1].ms + (uint64_t)(f * (double)(h[i].ms - h[i - 1].ms) + 0.5);
        }
    }
    return h[g->nhist - 1].ms;
}

/* A new attempt's first step is first: the attempt in the history (it has
 * stopped) computed what came after the step this one resumed from. */
static void redo(struct goodput *g, int64_t first)
{
    int64_t stride = g->stride > 0 ? g->stride : 1;
    int64_t resumed = first - stride;
    int64_t low = g->hist[0].step - 1; /* steps up to here were counted before */
    int64_t from = resumed > low ? resumed : low;
    if (g->high_step > from)
        g->lost_steps += (uint64_t)(g->high_step - from);
    uint64_t t = time_of(g, resumed);
    uint64_t lost = g->end_ms > t ? g->end_ms - t : 0;
    if (lost > g->ms[GOODPUT_PRODUCTIVE])
        lost = g->ms[GOODPUT_PRODUCTIVE];
    g->ms[GOODPUT_PRODUCTIVE] -= lost;
    g->ms[GOODPUT_LOST] += lost;
}

/* Full: every other point goes; the first and the last stay. */
static void thin(struct goodput *g)
{
    size_t n = 0;
    for (size_t i = 0; i + 1 < g->nhist; i += 2)
        g->hist[n++] = g->hist[i];
    g->hist[n++] = g->hist[g->nhist - 1];
    g->nhist = n;
}

void goodput_step(struct goodput *g, int64_t step, uint64_t now)
{
    if (g->mode == GOODPUT_MODE_RESTARTING) {
        /* A rank finishing a step while its group is stopped: computed,
         * so it counts if redone; its time is the stop's. */
        if (g->attempt_has_step && step > g->high_step)
            g->high_step = step;
        return;
    }
    if (g->mode != GOODPUT_MODE_RUNNING)
        return;
    if (!g->attempt_has_step) {
        accrue(g, now); /* up to here: init or restart */
        if (g->nhist > 0)
            redo(g, step);
        g->hist[0] = (struct goodput_point){step, g->since_ms};
        g->nhist = 1;
        g->high_step = step;
        g->stride = 0;
        g->end_ms = 0;
        g->attempt_has_step = true;
        g->any_step = true;
        g->phase = GOODPUT_PRODUCTIVE;
        return;
    }
    if (step <= g->high_step)
        return;
    g->stride = step - g->high_step;
    g->high_step = step;
    if (g->nhist == GOODPUT_HISTORY)
        thin(g);
    g->hist[g->nhist++] = (struct goodput_point){step, now > g->since_ms ? now : g->since_ms};
}

void goodput_totals(const struct goodput *g, uint64_t now, struct goodput_totals *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t ms[GOODPUT_PHASE_COUNT];
    memcpy(ms, g->ms, sizeof(ms));
    if (now > g->since_ms)
        ms[g->phase] += now - g->since_ms;
    uint64_t wall = 0;
    for (int i = 0; i < GOODPUT_PHASE_COUNT; i++) {
        out->s[i] = (double)ms[i] / 1000.0;
        wall += ms[i];
    }
    out->wall_s = (double)wall / 1000.0;
    out->ratio = wall > 0 ? (double)ms[GOODPUT_PRODUCTIVE] / (double)wall : 0;
    out->lost_steps = g->lost_steps;
    out->phase = g->phase;
}

/* Seconds as the summary writes them: one decimal under 10 s, whole
 * seconds with thousands separators above ("1,212 s"). */
static void secs(double s, char *buf, size_t len)
{
    if (s < 9.95) {
        snprintf(buf, len, "%.1f s", s);
        return;
    }
    unsigned long long v = (unsigned long long)(s + 0.5);
    char digits[32];
    int n = snprintf(digits, sizeof(digits), "%llu", v);
    char out[32];
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            out[k++] = ',';
        out[k++] = digits[i];
    }
    out[k] = '\0';
    snprintf(buf, len, "%s s", out);
}

int goodput_summary(const struct goodput_totals *t, char *buf, size_t len)
{
    char w[48], p[48];
    secs(t->wall_s, w, sizeof(w));
    secs(t->s[GOODPUT_PRODUCTIVE], p, sizeof(p));
    int n = snprintf(buf, len, "goodput %.1f%% of %s: %s productive", t->ratio * 100.0, w, p);
    static const struct {
        enum goodput_phase phase;
        const char *what;
    } rest[] = {
        {GOODPUT_INIT, "init"},       {GOODPUT_RESTART, "restarting"},
        {GOODPUT_LOST, "redoing"},    {GOODPUT_RENDEZVOUS, "rendezvous"},
        {GOODPUT_STOPPED, "stopped"},
    };
    for (size_t i = 0; i < sizeof(rest) / sizeof(rest[0]); i++) {
        double s = t->s[rest[i].phase];
        bool lost = rest[i].phase == GOODPUT_LOST;
        if (s < 0.05 && !(lost && t->lost_steps > 0))
            continue;
        char v[48];
        secs(s, v, sizeof(v));
        size_t at = n > 0 && (size_t)n < len ? (size_t)n : len > 0 ? len - 1 : 0;
        int k;
        if (lost)
            k = snprintf(buf + at, len - at, ", %s redoing %llu step%s", v,
                         (unsigned long long)t->lost_steps, t->lost_steps == 1 ? "" : "s");
        else
            k = snprintf(buf + at, len - at, ", %s %s", v, rest[i].what);
        if (k < 0)
            return k;
        n += k;
    }
    return n;
}
