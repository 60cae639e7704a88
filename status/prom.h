/*
 * prom.h: a writer for the Prometheus text exposition format 0.0.4.
 *
 *     struct cddp_buf out;
 *     struct prom_writer w;
 *     cddp_buf_init(&out, 1 << 20);
 *     prom_init(&w, &out);
 *     prom_family(&w, "cddp_agent_restarts_total", PROM_COUNTER, "Worker group restarts.");
 *     prom_sample1(&w, "reason", "worker_failure", 2);
 *     if (prom_finish(&w) < 0) ...   // the first error, sticky
 *
 * The writer enforces what the format and the naming conventions demand, so
 * a mistake fails in a unit test instead of in somebody's Prometheus:
 *   - metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
 *     [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__";
 *   - every family gets exactly one HELP and one TYPE line before its first
 *     sample, and a family is written once (samples are grouped by
 *     construction: a sample always belongs to the last family started);
 *   - counters end in "_total" (in 0.0.4 the TYPE line names the sample);
 *   - HELP text escapes \ and newline; label values escape \, " and newline;
 *   - values are shortest round-trip decimals, NaN, +Inf or -Inf.
 *
 * Errors are sticky: after the first one every call returns it and writes
 * nothing, so a renderer can write a whole page and check once at the end.
 * Codes: CDDP_EPARSE (a bad name or a misuse such as a sample before any
 * family), CDDP_EEXISTS (a family written twice), CDDP_ETOOBIG (the buffer's
 * maximum).
 */
#ifndef CDDP_STATUS_PROM_H
#define CDDP_STATUS_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strutil.h"

enum prom_type {
    PROM_COUNTER,
    PROM_GAUGE,
    PROM_UNTYPED,
};

struct prom_label {
    const char *name;
    const char *value;
};

#define PROM_MAX_FAMILIES 128
#define PROM_NAME_MAX 128

struct prom_writer {
    struct cddp_buf *out;
    int err;
    char family[PROM_NAME_MAX];
    /* FNV-1a hashes of the families written so far, to refuse a second one. */
    uint64_t seen[PROM_MAX_FAMILIES];
    size_t nseen;
};

/* Writes into out (appending); out keeps its own maximum. */
void prom_init(struct prom_writer *w, struct cddp_buf *out);

/* Starts a family: "# HELP name help" and "# TYPE name type". */
int prom_family(struct prom_writer *w, const char *name, enum prom_type type, const char *help);

/* One sample of the current family with n labels (n may be 0). */
int prom_sample(struct prom_writer *w, const struct prom_label *labels, size_t n, double value);

static inline int prom_sample0(struct prom_writer *w, double value)
{
    return prom_sample(w, NULL, 0, value);
}

static inline int prom_sample1(struct prom_writer *w, const char *label, const char *label_value,
                               double value)
{
    struct prom_label l = {label, label_value};
    return prom_sample(w, &l, 1, value);
}

/* The first error, or 0. */
static inline int prom_finish(const struct prom_writer *w)
{
    return w->err;
}

/* Checks a metric name / label name against the data model. */
bool prom_valid_metric_name(const char *name);
bool prom_valid_label_name(const char *name);

/* Formats a sample value as the format wants it ("NaN", "+Inf", "-Inf",
 * shortest decimal that reads back the same). Returns the length. */
size_t prom_format_value(double v, char *buf, size_t len);

#endif
