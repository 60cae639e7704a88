/* watchdog.c: see watchdog.h. Pure: no I/O, no clock, no globals. */
#include "agent/watchdog.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"

int watchdog_init(struct watchdog *wd, const struct watchdog_config *cfg, int nworkers)
{
    memset(wd, 0, sizeof(*wd));
    wd->w = calloc((size_t)(nworkers > 0 ? nworkers : 1), sizeof(*wd->w));
    if (wd->w == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    wd->cfg = *cfg;
    if (wd->cfg.warmup == 0)
        wd->cfg.warmup = 1;
    if (!(wd->cfg.safety > 0))
        wd->cfg.safety = 1;
    wd->nworkers = nworkers;
    return 0;
}

void watchdog_free(struct watchdog *wd)
{
    free(wd->w);
    wd->w = NULL;
    wd->nworkers = 0;
}

static struct watchdog_worker *worker(const struct watchdog *wd, int i)
{
    return i >= 0 && i < wd->nworkers ? &wd->w[i] : NULL;
}

void watchdog_start(struct watchdog *wd, int i, uint64_t now_ms)
{
    struct watchdog_worker *w = worker(wd, i);
    if (w == NULL)
        return;
    w->running = true;
    w->started_ms = now_ms;
    w->last_ms = 0;
    w->lines = 0;
    w->has_step = false;
    w->last_step = 0;
}

void watchdog_exit(struct watchdog *wd, int i)
{
    struct watchdog_worker *w = worker(wd, i);
    if (w)
        w->running = false;
}

static uint64_t clamp_learned(const struct watchdog_config *cfg, double ms)
{
    uint64_t floor_ms = cfg->floor_ms > WATCHDOG_FLOOR_MS ? cfg->floor_ms : WATCHDOG_FLOOR_MS;
    if (floor_ms > WATCHDOG_CEILING_MS)
        floor_ms = WATCHDOG_CEILING_MS;
    if (ms < (double)floor_ms)
        return floor_ms;
    if (ms > WATCHDOG_CEILING_MS)
        return WATCHDOG_CEILING_MS;
    return (uint64_t)(ms + 0.5);
}

bool watchdog_report(struct watchdog *wd, int i, uint64_t now_ms, bool has_step, int64_t step)
{
    struct watchdog_worker *w = worker(wd, i);
    if (w == NULL || !w->running)
        return false;
    if (w->lines > 0 && now_ms > w->last_ms && now_ms - w->last_ms > w->max_interval_ms)
        w->max_interval_ms = now_ms - w->last_ms;
    w->lines++;
    w->lines_total++;
    w->last_ms = now_ms;
    if (has_step) {
        w->has_step = true;
        w->last_step = step;
    }
    if (wd->cfg.mode != WATCHDOG_AUTO || w->lines_total < wd->cfg.warmup || w->max_interval_ms == 0)
        return false;
    w->learned_ms = clamp_learned(&wd->cfg, (double)w->max_interval_ms * wd->cfg.safety);
    if (w->reported_ms == 0 ||
        (double)w->learned_ms > (double)w->reported_ms * (1.0 + WATCHDOG_CHANGE_FRACTION)) {
        w->reported_ms = w->learned_ms;
        return true;
    }
    return false;
}

uint64_t watchdog_timeout(const struct watchdog *wd, int i)
{
    const struct watchdog_worker *w = worker(wd, i);
    if (w == NULL || !w->running || wd->cfg.mode == WATCHDOG_OFF)
        return 0;
    if (w->lines == 0)
        return wd->cfg.initial_ms;
    if (wd->cfg.mode == WATCHDOG_FIXED)
        return wd->cfg.timeout_ms;
    return w->learned_ms ? w->learned_ms : WATCHDOG_CEILING_MS;
}

uint64_t watchdog_deadline(const struct watchdog *wd, int i)
{
    uint64_t t = watchdog_timeout(wd, i);
    if (t == 0)
        return 0;
    const struct watchdog_worker *w = &wd->w[i];
    uint64_t from = w->lines == 0 ? w->started_ms : w->last_ms;
    uint64_t d = from + t;
    return d ? d : 1;
}

uint64_t watchdog_next_deadline(const struct watchdog *wd)
{
    uint64_t best = 0;
    for (int i = 0; i < wd->nworkers; i++) {
        uint64_t d = watchdog_deadline(wd, i);
        if (d && (best == 0 || d < best))
            best = d;
    }
    return best;
}

int watchdog_hung(const struct watchdog *wd, uint64_t now_ms)
{
    for (int i = 0; i < wd->nworkers; i++) {
        uint64_t d = watchdog_deadline(wd, i);
        if (d && d <= now_ms)
            return i;
    }
    return -1;
}

const char *watchdog_mode_name(enum watchdog_mode m)
{
    switch (m) {
    case WATCHDOG_OFF:
        return "off";
    case WATCHDOG_FIXED:
        return "fixed";
    case WATCHDOG_AUTO:
        return "auto";
    }
    return "unknown";
}
