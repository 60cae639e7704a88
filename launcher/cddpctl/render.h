/*
 * render.h: the status JSON as text: aligned tables, lenient field readers
 * (a missing field prints as "-"), durations, ages and progress bars, and
 * the views of an agent's and a rendezvous server's /status.
 *
 * The renderers print the document's strings as they are: the caller has
 * made them safe first (safe.h, ctl_safe_tree).
 */
#ifndef CDDP_LAUNCHER_CDDPCTL_RENDER_H
#define CDDP_LAUNCHER_CDDPCTL_RENDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "launcher/cddpctl/ctl.h"

#define CTL_MAX_COLS 13
#define CTL_CELL 64

/* Rows of cells, printed with every column as wide as its widest cell
 * (a cell is cut to CTL_CELL - 1 bytes). Zero-initialise; printing frees. */
struct ctl_table {
    size_t ncols, nrows, cap;
    char (*cells)[CTL_MAX_COLS][CTL_CELL];
};

void ctl_table_rowv(struct ctl_table *t, size_t ncols, const char *const *cells);
void ctl_table_row(struct ctl_table *t, size_t ncols, ...);
void ctl_table_print(struct ctl_table *t, FILE *out);
void ctl_table_free(struct ctl_table *t);

/* Lenient readers: a field of another type is missing. */
const cJSON *ctl_field(const cJSON *o, const char *key);
bool ctl_num(const cJSON *o, const char *key, double *v);
const char *ctl_str(const cJSON *o, const char *key, const char *dflt);
/* "%.*g" of a number field into buf, its string (NaN), or "-". */
const char *ctl_fmt_num(const cJSON *o, const char *key, const char *fmt, char *buf, size_t len);
/* "12s ago" for a wall-time field, against the server's clock now. */
const char *ctl_fmt_ago(const cJSON *o, const char *key, double now, char *buf, size_t len);

/* A worker's cells: LOCAL RANK PID STATE EXIT RESTARTS STEP EPOCH LOSS
 * SAMPLES/S STEP-TIME LAST-PROGRESS [PROGRESS bar]. */
#define CTL_WORKER_CELLS 13
struct ctl_worker_cells {
    char c[CTL_WORKER_CELLS][CTL_CELL];
    const char *p[CTL_WORKER_CELLS];
};
extern const char *const ctl_worker_titles[CTL_WORKER_CELLS];

/* Whether any worker has a total (--total-steps or its own), so a bar. */
bool ctl_workers_have_bar(const struct ctl_options *o, const cJSON *workers);
/* Fills wc for worker w; returns the number of cells (12, 13 with bar). */
size_t ctl_worker_row(const struct ctl_options *o, const cJSON *w, bool bar,
                      struct ctl_worker_cells *wc);

/* The views: an agent's /status, a rendezvous server's (cddp-rdzv's). */
void ctl_print_agent(const struct ctl_options *o, FILE *out, const cJSON *root);
void ctl_print_rdzv(FILE *out, const cJSON *root);

#endif
