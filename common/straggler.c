/* straggler.c: see straggler.h. */
#include "common/straggler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void straggler_window_reset(struct straggler_window *w)
{
    memset(w, 0, sizeof(*w));
}

static void push(struct straggler_window *w, double steps, double time_s, double compute_s)
{
    w->s[w->head] = (struct straggler_sample){steps, time_s, compute_s};
    w->head = (w->head + 1) % STRAGGLER_WINDOW;
    if (w->n < STRAGGLER_WINDOW)
        w->n++;
}

void straggler_window_line(struct straggler_window *w, uint64_t now_ms, bool has_step, int64_t step,
                           double step_time_s, double compute_s)
{
    if (!has_step)
        return;
    if (w->has_step && step < w->last_step)
        straggler_window_reset(w); /* a new count (the script's own, after the hook's) */
    if (w->has_step && step > w->last_step) {
        double d = (double)(step - w->last_step);
        double t = step_time_s >= 0 ? d * step_time_s : (double)(now_ms - w->last_ms) / 1000.0;
        push(w, d, t, compute_s >= 0 ? d * compute_s : -1);
    }
    if (!w->has_step || step != w->last_step) {
        w->last_step = step;
        w->last_ms = now_ms;
    }
    w->has_step = true;
}

bool straggler_window_mean(const struct straggler_window *w, unsigned min_steps, double *step_s,
                           double *compute_s)
{
    double steps = 0, time = 0, compute = 0;
    bool all_compute = true;
    for (unsigned k = 0; k < w->n && steps < (double)min_steps; k++) {
        const struct straggler_sample *s =
            &w->s[(w->head + STRAGGLER_WINDOW - 1 - k) % STRAGGLER_WINDOW];
        steps += s->steps;
        time += s->time_s;
        if (s->compute_s < 0)
            all_compute = false;
        else
            compute += s->compute_s;
    }
    *step_s = -1;
    *compute_s = -1;
    if (steps < (double)min_steps || steps <= 0)
        return false;
    *step_s = time / steps;
    if (all_compute)
        *compute_s = compute / steps;
    return true;
}

static bool measured(double v)
{
    return v > 0 && isfinite(v);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double lower_median(double *scratch, size_t k)
{
    if (k == 0)
        return 0;
    qsort(scratch, k, sizeof(*scratch), cmp_double);
    return scratch[(k - 1) / 2];
}

double straggler_lower_median(const double *v, size_t n, double *scratch)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (measured(v[i]))
            scratch[k++] = v[i];
    return lower_median(scratch, k);
}

double straggler_median(const struct straggler_member *m, size_t n, double *scratch)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (measured(m[i].value))
            scratch[k++] = m[i].value;
    return k < 2 ? 0 : lower_median(scratch, k);
}

size_t straggler_mark(struct straggler_member *m, size_t n, double median, double factor,
                      uint64_t now_ms, struct straggler_change *out)
{
    size_t nout = 0;
    for (size_t i = 0; i < n; i++) {
        struct straggler_member *x = &m[i];
        bool known = median > 0 && measured(x->value);
        x->ratio = known ? x->value / median : 0;
        bool slow = x->slow;
        if (!known)
            slow = false;
        else if (!x->slow)
            slow = x->ratio > factor;
        else
            slow = x->ratio >= factor * STRAGGLER_CLEAR;
        if (slow == x->slow)
            continue;
        x->slow = slow;
        if (slow)
            x->since_ms = now_ms;
        out[nout++] = (struct straggler_change){i, slow};
    }
    return nout;
}
