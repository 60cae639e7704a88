/* render.c: see render.h. */
#include "launcher/cddpctl/render.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"

/* ---- the table ------------------------------------------------------- */

void ctl_table_rowv(struct ctl_table *t, size_t ncols, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        void *p = realloc(t->cells, cap * sizeof(*t->cells));
        if (p == NULL)
            return;
        t->cells = p;
        t->cap = cap;
    }
    for (size_t i = 0; i < ncols && i < CTL_MAX_COLS; i++)
        cddp_strlcpy(t->cells[t->nrows][i], cells[i], CTL_CELL);
    t->ncols = ncols;
    t->nrows++;
}

void ctl_table_row(struct ctl_table *t, size_t ncols, ...)
{
    const char *cells[CTL_MAX_COLS];
    va_list ap;
    va_start(ap, ncols);
    for (size_t i = 0; i < ncols && i < CTL_MAX_COLS; i++)
        cells[i] = va_arg(ap, const char *);
    va_end(ap);
    ctl_table_rowv(t, ncols, cells);
}

void ctl_table_print(struct ctl_table *t, FILE *out)
{
    size_t width[CTL_MAX_COLS] = {0};
    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < t->ncols; c++) {
            size_t w = strlen(t->cells[r][c]);
            if (w > width[c])
                width[c] = w;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            if (c + 1 == t->ncols)
                fprintf(out, "%s\n", t->cells[r][c]);
            else
                fprintf(out, "%-*s  ", (int)width[c], t->cells[r][c]);
        }
    }
    ctl_table_free(t);
}

void ctl_table_free(struct ctl_table *t)
{
    free(t->cells);
    t->cells = NULL;
    t->nrows = t->cap = 0;
}

/* ---- reading the JSON leniently: a missing field prints as "-" --------- */

const cJSON *ctl_field(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

bool ctl_num(const cJSON *o, const char *key, double *v)
{
    const cJSON *it = ctl_field(o, key);
    if (!cJSON_IsNumber(it))
        return false;
    *v = it->valuedouble;
    return true;
}

const char *ctl_str(const cJSON *o, const char *key, const char *dflt)
{
    const cJSON *it = ctl_field(o, key);
    return cJSON_IsString(it) ? it->valuestring : dflt;
}

/* "%.*g" of a number field, its string (NaN), or "-". */
const char *ctl_fmt_num(const cJSON *o, const char *key, const char *fmt, char *buf, size_t len)
{
    double v;
    if (ctl_num(o, key, &v)) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(buf, len, fmt, v);
#pragma GCC diagnostic pop
        return buf;
    }
    return ctl_str(o, key, "-");
}

static void fmt_duration(double s, char *buf, size_t len)
{
    if (s < 0 || !isfinite(s))
        snprintf(buf, len, "-");
    else if (s < 1)
        snprintf(buf, len, "%.0fms", s * 1000);
    else if (s < 60)
        snprintf(buf, len, "%.1fs", s);
    else if (s < 3600)
        snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else if (s < 86400)
        snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else
        snprintf(buf, len, "%dd%02dh", (int)(s / 86400), (int)fmod(s / 3600, 24));
}

/* "12s ago" for a wall time, against the server's own clock (generated_at),
 * so a skewed local clock does not matter. */
const char *ctl_fmt_ago(const cJSON *o, const char *key, double now, char *buf, size_t len)
{
    double t;
    if (!ctl_num(o, key, &t) || t <= 0)
        return "-";
    char d[32];
    fmt_duration(now - t < 0 ? 0 : now - t, d, sizeof(d));
    snprintf(buf, len, "%s ago", d);
    return buf;
}

/* "[#########-----------]  45%": step of total, 20 cells wide. */
static void fmt_bar(double step, double total, char *buf, size_t len)
{
    enum { W = 20 };
    double frac = total > 0 ? step / total : 0;
    if (!(frac >= 0))
        frac = 0;
    if (frac > 1)
        frac = 1;
    char cells[W + 1];
    int full = (int)floor(frac * W);
    for (int i = 0; i < W; i++)
        cells[i] = i < full ? '#' : '-';
    cells[W] = '\0';
    snprintf(buf, len, "[%s] %3.0f%%", cells, floor(frac * 100));
}

/* The total number of steps for a worker's bar: --total-steps, else the
 * progress object's total_steps when an agent reports one; 0: unknown. */
static double total_steps(const struct ctl_options *o, const cJSON *progress)
{
    double v;
    if (o->total_steps > 0)
        return (double)o->total_steps;
    if (ctl_num(progress, "total_steps", &v) && v > 0)
        return v;
    return 0;
}

static void print_header(FILE *out, const cJSON *root)
{
    double pid = 0, up = -1;
    ctl_num(root, "pid", &pid);
    ctl_num(root, "uptime_s", &up);
    char upbuf[32];
    fmt_duration(up, upbuf, sizeof(upbuf));
    fprintf(out, "%s %s on %s (pid %.0f), up %s\n", ctl_str(root, "program", "?"),
            ctl_str(root, "version", "?"), ctl_str(root, "hostname", "?"), pid, upbuf);
}

static void print_counts(FILE *out, int width, const char *title, const cJSON *obj)
{
    if (!cJSON_IsObject(obj))
        return;
    fprintf(out, "%-*s", width, title);
    const char *sep = "";
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        if (cJSON_IsNumber(it) && it->valuedouble != 0) {
            fprintf(out, "%s%s %.0f", sep, it->string, it->valuedouble);
            sep = ", ";
        }
    }
    fprintf(out, "%s\n", *sep ? "" : "none");
}

static void print_runs(FILE *out, const cJSON *root, double now);

/* "goodput   91.2% of 1m18s: 1m11s productive, 1.3s lost (6 steps), ..."
 * (docs/status.md, "Goodput"), and the exit code once the run has ended. */
static void print_goodput(FILE *out, const cJSON *root)
{
    const cJSON *g = ctl_field(root, "goodput");
    const cJSON *sec = ctl_field(g, "seconds");
    double ratio, wall, v;
    if (cJSON_IsObject(g) && ctl_num(g, "ratio", &ratio) && ctl_num(g, "wall_s", &wall)) {
        char d[32];
        fmt_duration(wall, d, sizeof(d));
        fprintf(out, "%-10s%.1f%% of %s:", "goodput", ratio * 100, d);
        static const char *const phases[] = {"productive", "lost",       "restart",
                                             "init",       "rendezvous", "stopped"};
        bool first = true;
        for (size_t i = 0; i < sizeof(phases) / sizeof(phases[0]); i++) {
            if (!ctl_num(sec, phases[i], &v) || (i > 0 && v < 0.05))
                continue;
            fmt_duration(v, d, sizeof(d));
            fprintf(out, "%s %s %s", first ? "" : ",", d, phases[i]);
            first = false;
            if (i == 1 && ctl_num(g, "lost_steps", &v))
                fprintf(out, " (%.0f step%s)", v, v == 1 ? "" : "s");
        }
        fprintf(out, "\n");
    }
    if (ctl_num(root, "exit_code", &v))
        fprintf(out, "%-10s%.0f (%s)\n", "exit", v, ctl_str(root, "exit_reason", "-"));
}

bool ctl_workers_have_bar(const struct ctl_options *o, const cJSON *workers)
{
    const cJSON *w;
    cJSON_ArrayForEach(w, workers)
    {
        if (total_steps(o, ctl_field(w, "progress")) > 0)
            return true;
    }
    return false;
}

size_t ctl_worker_row(const struct ctl_options *o, const cJSON *w, bool bar,
                      struct ctl_worker_cells *wc)
{
    double v;
    const cJSON *p = ctl_field(w, "progress");
    wc->p[0] = ctl_fmt_num(w, "local_rank", "%.0f", wc->c[0], CTL_CELL);
    wc->p[1] = ctl_fmt_num(w, "rank", "%.0f", wc->c[1], CTL_CELL);
    wc->p[2] = ctl_fmt_num(w, "pid", "%.0f", wc->c[2], CTL_CELL);
    wc->p[3] = ctl_str(w, "state", "-");
    wc->p[4] = "-";
    /* The JSON keeps a rank's last exit after it is started again (until
     * its next exit); the table's EXIT is the running process's: none. */
    bool running = strcmp(wc->p[3], "running") == 0;
    if (!running && ctl_num(w, "exit_code", &v)) {
        snprintf(wc->c[4], CTL_CELL, "%.0f", v);
        wc->p[4] = wc->c[4];
    } else if (!running && ctl_str(w, "signal_name", NULL)) {
        wc->p[4] = ctl_str(w, "signal_name", "-");
    }
    wc->p[5] = ctl_fmt_num(w, "restarts", "%.0f", wc->c[5], CTL_CELL);
    wc->p[6] = ctl_fmt_num(p, "step", "%.0f", wc->c[6], CTL_CELL);
    wc->p[7] = ctl_fmt_num(p, "epoch", "%.0f", wc->c[7], CTL_CELL);
    wc->p[8] = ctl_fmt_num(p, "loss", "%.4g", wc->c[8], CTL_CELL);
    wc->p[9] = ctl_fmt_num(p, "samples_per_s", "%.1f", wc->c[9], CTL_CELL);
    /* The mean step over its last 20+ steps (the straggler judgement's),
     * marked when the agent names it a straggler. */
    wc->p[10] = "-";
    if (ctl_num(w, "step_time_s", &v)) {
        fmt_duration(v, wc->c[10], CTL_CELL);
        size_t len = strlen(wc->c[10]);
        if (cJSON_IsTrue(ctl_field(w, "straggler")))
            snprintf(wc->c[10] + len, CTL_CELL - len, " STRAGGLER");
        wc->p[10] = wc->c[10];
    }
    wc->p[11] = "never";
    double malformed = 0;
    ctl_num(p, "malformed", &malformed);
    if (cJSON_IsObject(p)) {
        double age;
        if (ctl_num(p, "age_s", &age)) {
            char dur[32];
            fmt_duration(age, dur, sizeof(dur));
            snprintf(wc->c[11], CTL_CELL, "%s ago", dur);
            wc->p[11] = wc->c[11];
        }
        if (malformed > 0) {
            char tmp[CTL_CELL + 32];
            snprintf(tmp, sizeof(tmp), "%s (%.0f malformed)", wc->p[11], malformed);
            cddp_strlcpy(wc->c[11], tmp, CTL_CELL);
            wc->p[11] = wc->c[11];
        }
    }
    if (!bar)
        return 12;
    double total = total_steps(o, p), step;
    wc->p[12] = "";
    if (total > 0 && ctl_num(p, "step", &step)) {
        fmt_bar(step, total, wc->c[12], CTL_CELL);
        wc->p[12] = wc->c[12];
    }
    return 13;
}

const char *const ctl_worker_titles[CTL_WORKER_CELLS] = {
    "LOCAL", "RANK", "PID",       "STATE",     "EXIT",          "RESTARTS", "STEP",
    "EPOCH", "LOSS", "SAMPLES/S", "STEP TIME", "LAST PROGRESS", "PROGRESS"};

void ctl_print_agent(const struct ctl_options *o, FILE *out, const cJSON *root)
{
    double now = 0, v;
    ctl_num(root, "generated_at", &now);
    print_header(out, root);
    char a[64], b[64], c[64], d[64], e[64];
    fprintf(out, "%-10s%s\n", "run", ctl_str(root, "run_id", "-"));
    fprintf(out, "%-10s%s (%s)\n", "state", ctl_str(root, "state", "-"),
            cJSON_IsTrue(ctl_field(root, "ready")) ? "ready" : "not ready");
    fprintf(out, "%-10snode %s of %s, round %s, world size %s (%s local)\n", "group",
            ctl_fmt_num(root, "node_rank", "%.0f", a, sizeof(a)),
            ctl_fmt_num(root, "nnodes", "%.0f", b, sizeof(b)),
            ctl_fmt_num(root, "round", "%.0f", c, sizeof(c)),
            ctl_fmt_num(root, "world_size", "%.0f", d, sizeof(d)),
            ctl_fmt_num(root, "local_world_size", "%.0f", e, sizeof(e)));
    const cJSON *rdzv = ctl_field(root, "rdzv");
    char took[32] = "-";
    if (ctl_num(root, "last_round_duration_s", &v))
        fmt_duration(v, took, sizeof(took));
    char master[300] = "-";
    if (ctl_num(rdzv, "master_port", &v))
        snprintf(master, sizeof(master), "%s:%.0f", ctl_str(rdzv, "master_addr", "?"), v);
    fprintf(out, "%-10s%s %s, master %s, last round took %s, %s waiting", "rdzv",
            ctl_str(rdzv, "backend", "-"), ctl_str(rdzv, "endpoint", "-"), master, took,
            ctl_fmt_num(root, "waiting_nodes", "%.0f", a, sizeof(a)));
    if (cJSON_IsFalse(ctl_field(rdzv, "connected")))
        fprintf(out, ", DISCONNECTED %s, reconnecting",
                ctl_fmt_ago(rdzv, "disconnected_at", now, b, sizeof(b)));
    if (ctl_num(rdzv, "reconnects", &v) && v > 0)
        fprintf(out, ", %.0f reconnect%s", v, v == 1 ? "" : "s");
    fprintf(out, "\n");
    const cJSON *hosted = ctl_field(root, "rdzv_server");
    if (cJSON_IsObject(hosted))
        fprintf(out, "%-10sthe rendezvous server, on %s: %s connections, %s joins, %s rounds\n",
                "hosting", ctl_str(hosted, "endpoint", "-"),
                ctl_fmt_num(hosted, "connections", "%.0f", b, sizeof(b)),
                ctl_fmt_num(hosted, "joins_total", "%.0f", c, sizeof(c)),
                ctl_fmt_num(hosted, "rounds_total", "%.0f", d, sizeof(d)));
    const cJSON *rs = ctl_field(root, "restarts");
    fprintf(out, "%-10s%s of %s", "restarts", ctl_fmt_num(rs, "count", "%.0f", a, sizeof(a)),
            ctl_fmt_num(rs, "max", "%.0f", b, sizeof(b)));
    const cJSON *by = ctl_field(rs, "by_reason");
    double mc;
    if (ctl_num(by, "membership_change", &mc) && mc > 0)
        fprintf(out, " (and %.0f for membership changes)", mc);
    fprintf(out, "\n");
    print_counts(out, 10, "exits", ctl_field(root, "worker_exits"));
    print_goodput(out, root);

    const cJSON *workers = ctl_field(root, "workers");
    if (cJSON_IsArray(workers) && cJSON_GetArraySize(workers) > 0) {
        fprintf(out, "\n");
        bool bar = ctl_workers_have_bar(o, workers);
        struct ctl_table t = {0};
        ctl_table_rowv(&t, bar ? 13 : 12, ctl_worker_titles);
        const cJSON *w;
        cJSON_ArrayForEach(w, workers)
        {
            struct ctl_worker_cells wc;
            size_t n = ctl_worker_row(o, w, bar, &wc);
            ctl_table_rowv(&t, n, wc.p);
        }
        ctl_table_print(&t, out);
    }
    if (cJSON_IsObject(hosted))
        print_runs(out, hosted, now);
}

/* The runs of a rendezvous server (cddp-rdzv's, or the one an agent hosts),
 * then their nodes. */
static void print_runs(FILE *out, const cJSON *root, double now)
{
    const cJSON *runs = ctl_field(root, "runs");
    fprintf(out, "\n");
    if (!cJSON_IsArray(runs) || cJSON_GetArraySize(runs) == 0) {
        fprintf(out, "no runs\n");
        return;
    }
    struct ctl_table t = {0};
    ctl_table_row(&t, 7, "RUN", "STATE", "ROUND", "NODES", "MIN:MAX", "WAITING", "LAST ROUND");
    const cJSON *r;
    cJSON_ArrayForEach(r, runs)
    {
        char round[32], nodes[16], mm[40], waiting[16], last[64], mn[16], mx[16];
        snprintf(nodes, sizeof(nodes), "%d", cJSON_GetArraySize(ctl_field(r, "members")));
        snprintf(waiting, sizeof(waiting), "%d", cJSON_GetArraySize(ctl_field(r, "waiting")));
        snprintf(mm, sizeof(mm), "%s:%s", ctl_fmt_num(r, "min_nodes", "%.0f", mn, sizeof(mn)),
                 ctl_fmt_num(r, "max_nodes", "%.0f", mx, sizeof(mx)));
        ctl_table_row(&t, 7, ctl_str(r, "run_id", "-"), ctl_str(r, "state", "-"),
                      ctl_fmt_num(r, "round", "%.0f", round, sizeof(round)), nodes, mm, waiting,
                      ctl_fmt_ago(r, "last_round_at", now, last, sizeof(last)));
    }
    ctl_table_print(&t, out);

    fprintf(out, "\n");
    ctl_table_row(&t, 6, "RUN", "NODE", "RANK", "NPROC", "JOINED", "LAST SEEN");
    cJSON_ArrayForEach(r, runs)
    {
        static const char *const lists[] = {"members", "waiting"};
        for (int l = 0; l < 2; l++) {
            const cJSON *n;
            cJSON_ArrayForEach(n, ctl_field(r, lists[l]))
            {
                char rank[16], nproc[16], joined[64], seen[64];
                const char *rank_s =
                    l == 1 ? "waiting" : ctl_fmt_num(n, "node_rank", "%.0f", rank, sizeof(rank));
                ctl_table_row(&t, 6, ctl_str(r, "run_id", "-"), ctl_str(n, "node", "-"), rank_s,
                              ctl_fmt_num(n, "nproc", "%.0f", nproc, sizeof(nproc)),
                              ctl_fmt_ago(n, "joined_at", now, joined, sizeof(joined)),
                              ctl_fmt_ago(n, "last_seen_at", now, seen, sizeof(seen)));
            }
        }
    }
    if (t.nrows > 1)
        ctl_table_print(&t, out);
    else
        ctl_table_free(&t);
}

void ctl_print_rdzv(FILE *out, const cJSON *root)
{
    double now = 0;
    ctl_num(root, "generated_at", &now);
    print_header(out, root);
    char a[64], b[64];
    fprintf(out, "%-12s%s (%s)\n", "endpoint", ctl_str(root, "endpoint", "-"),
            cJSON_IsTrue(ctl_field(root, "ready")) ? "accepting agents" : "not accepting agents");
    fprintf(out, "%-12s%s open, %s total\n", "connections",
            ctl_fmt_num(root, "connections", "%.0f", a, sizeof(a)),
            ctl_fmt_num(root, "connections_total", "%.0f", b, sizeof(b)));
    print_counts(out, 12, "refused", ctl_field(root, "refused_connections"));
    fprintf(out, "%-12s%s joins, %s rounds\n", "totals",
            ctl_fmt_num(root, "joins_total", "%.0f", a, 32),
            ctl_fmt_num(root, "rounds_total", "%.0f", b, 32));
    print_runs(out, root, now);
}
