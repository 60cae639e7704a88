/* status_view.c: see status_view.h. The JSON schema and the metric families
 * here are documented in docs/status.md: change both together. */
#include "common/status_view.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/errors.h"
#include "common/prom.h"
#include "common/signames.h"
#include "common/strutil.h"

#define METRICS_MAX ((size_t)16 << 20)

static const char *const agent_state_names[] = {
    "init", "rendezvous", "running", "restarting", "stopping", "succeeded", "failed",
};
static const char *const worker_state_names[] = {
    "init", "running", "succeeded", "failed", "stopped",
};
static const char *const restart_reason_names[] = {
    "worker_failure",
    "membership_change",
};
static const char *const exit_reason_names[] = {
    "success", "failure", "signal", "collective_timeout", "watchdog", "stopped",
};
static const char *const refusal_names[] = {
    "limit",
    "token",
    "protocol",
};

_Static_assert(sizeof(agent_state_names) / sizeof(agent_state_names[0]) == STATUS_AGENT_STATE_COUNT,
               "agent state names");
_Static_assert(sizeof(worker_state_names) / sizeof(worker_state_names[0]) ==
                   STATUS_WORKER_STATE_COUNT,
               "worker state names");
_Static_assert(sizeof(restart_reason_names) / sizeof(restart_reason_names[0]) ==
                   STATUS_RESTART_REASON_COUNT,
               "restart reason names");
_Static_assert(sizeof(exit_reason_names) / sizeof(exit_reason_names[0]) == STATUS_EXIT_REASON_COUNT,
               "exit reason names");
_Static_assert(sizeof(refusal_names) / sizeof(refusal_names[0]) == STATUS_REFUSAL_COUNT,
               "refusal names");

#define NAME_OF(table, v, count) ((unsigned)(v) < (count) ? table[v] : "unknown")

const char *status_agent_state_name(enum status_agent_state s)
{
    return NAME_OF(agent_state_names, s, STATUS_AGENT_STATE_COUNT);
}
const char *status_worker_state_name(enum status_worker_state s)
{
    return NAME_OF(worker_state_names, s, STATUS_WORKER_STATE_COUNT);
}
const char *status_restart_reason_name(enum status_restart_reason r)
{
    return NAME_OF(restart_reason_names, r, STATUS_RESTART_REASON_COUNT);
}
const char *status_exit_reason_name(enum status_exit_reason r)
{
    return NAME_OF(exit_reason_names, r, STATUS_EXIT_REASON_COUNT);
}
const char *status_refusal_name(enum status_refusal r)
{
    return NAME_OF(refusal_names, r, STATUS_REFUSAL_COUNT);
}

/* ---- JSON helpers: remember the first allocation failure ------------- */

struct js {
    bool oom;
};

static cJSON *js_check(struct js *j, cJSON *item)
{
    if (item == NULL)
        j->oom = true;
    return item;
}

static void js_num(struct js *j, cJSON *o, const char *k, double v)
{
    js_check(j, cJSON_AddNumberToObject(o, k, v));
}

/* A number, or null when !known. */
static void js_num_if(struct js *j, cJSON *o, const char *k, bool known, double v)
{
    js_check(j, known ? cJSON_AddNumberToObject(o, k, v) : cJSON_AddNullToObject(o, k));
}

/* Non-finite numbers are not JSON: they become the strings Python's json
 * module would have written, so a diverged loss still shows. */
static void js_real(struct js *j, cJSON *o, const char *k, double v)
{
    if (isnan(v))
        js_check(j, cJSON_AddStringToObject(o, k, "NaN"));
    else if (isinf(v))
        js_check(j, cJSON_AddStringToObject(o, k, v > 0 ? "Infinity" : "-Infinity"));
    else
        js_num(j, o, k, v);
}

static void js_str(struct js *j, cJSON *o, const char *k, const char *v)
{
    js_check(j, v ? cJSON_AddStringToObject(o, k, v) : cJSON_AddNullToObject(o, k));
}

static void js_bool(struct js *j, cJSON *o, const char *k, bool v)
{
    js_check(j, cJSON_AddBoolToObject(o, k, v));
}

static cJSON *js_obj(struct js *j, cJSON *o, const char *k)
{
    return js_check(j, cJSON_AddObjectToObject(o, k));
}

static cJSON *js_arr(struct js *j, cJSON *o, const char *k)
{
    return js_check(j, cJSON_AddArrayToObject(o, k));
}

static cJSON *js_push_obj(struct js *j, cJSON *arr)
{
    cJSON *o = js_check(j, cJSON_CreateObject());
    if (o && !cJSON_AddItemToArray(arr, o)) {
        cJSON_Delete(o);
        j->oom = true;
        return NULL;
    }
    return o;
}

static void js_header(struct js *j, cJSON *root, const char *kind, const char *program,
                      const char *version, int pid, const char *hostname, double started_at,
                      double now)
{
    js_str(j, root, "kind", kind);
    js_str(j, root, "program", program);
    js_str(j, root, "version", version);
    js_num(j, root, "pid", pid);
    js_str(j, root, "hostname", hostname);
    js_num(j, root, "generated_at", now);
    js_num_if(j, root, "started_at", started_at > 0, started_at);
    js_num_if(j, root, "uptime_s", started_at > 0, started_at > 0 ? now - started_at : 0);
}

/* Finishes a snapshot: JSON (plus a newline, for curl in a terminal),
 * metrics, and takes over root. */
static int finish(struct js *j, cJSON *root, int prom_rc, struct cddp_buf *metrics,
                  struct status_snapshot *s, struct status_snapshot **out)
{
    int rc = prom_rc;
    char *text = NULL;
    if (rc == 0 && !j->oom) {
        text = cJSON_PrintUnformatted(root);
        if (text == NULL)
            j->oom = true;
    }
    if (rc == 0 && j->oom)
        rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (rc == 0) {
        size_t len = strlen(text);
        char *nl = realloc(text, len + 2);
        if (nl == NULL) {
            rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
        } else {
            text = nl;
            text[len] = '\n';
            text[len + 1] = '\0';
            rc = status_snapshot_set_status(s, text, len + 1);
        }
    }
    if (rc == 0)
        rc = status_snapshot_set_metrics(s, metrics->data ? metrics->data : "", metrics->len);
    cJSON_free(text);
    cJSON_Delete(root);
    cddp_buf_free(metrics);
    if (rc) {
        status_snapshot_unref(s);
        return rc;
    }
    *out = s;
    return 0;
}

static void prom_build_info(struct prom_writer *w, const char *program, const char *version)
{
    struct prom_label l[] = {{"program", program ? program : ""},
                             {"version", version ? version : ""}};
    prom_family(w, "cddp_build_info", PROM_GAUGE, "Always 1; the program and its version.");
    prom_sample(w, l, 2, 1);
}

/* ---- the agent ------------------------------------------------------- */

static void agent_json_worker(struct js *j, cJSON *arr, const struct status_worker_view *wv,
                              uint64_t now_mono_ms)
{
    cJSON *o = js_push_obj(j, arr);
    if (o == NULL)
        return;
    js_num(j, o, "local_rank", wv->local_rank);
    js_num_if(j, o, "rank", wv->rank >= 0, wv->rank);
    js_num_if(j, o, "pid", wv->pid > 0, wv->pid);
    js_str(j, o, "state", status_worker_state_name(wv->state));
    js_num_if(j, o, "exit_code", wv->exit_code >= 0, wv->exit_code);
    js_num_if(j, o, "signal", wv->signal > 0, wv->signal);
    js_str(j, o, "signal_name", wv->signal > 0 ? cddp_signal_name(wv->signal) : NULL);
    js_num_if(j, o, "started_at", wv->started_at > 0, wv->started_at);
    js_num(j, o, "restarts", wv->restarts);

    const struct progress_report *p = &wv->progress;
    if (p->lines == 0 && p->malformed == 0) {
        js_check(j, cJSON_AddNullToObject(o, "progress"));
        return;
    }
    cJSON *po = js_obj(j, o, "progress");
    if (po == NULL)
        return;
    js_num_if(j, po, "step", p->fields & PROGRESS_STEP, (double)p->step);
    js_num_if(j, po, "epoch", p->fields & PROGRESS_EPOCH, (double)p->epoch);
    if (p->fields & PROGRESS_LOSS)
        js_real(j, po, "loss", p->loss);
    else
        js_check(j, cJSON_AddNullToObject(po, "loss"));
    js_num_if(j, po, "samples_per_s", p->fields & PROGRESS_SAMPLES_PER_S, p->samples_per_s);
    bool seen = p->mono_ms > 0;
    js_num_if(j, po, "time", seen, p->wall);
    js_num_if(j, po, "age_s", seen,
              seen && now_mono_ms > p->mono_ms ? (double)(now_mono_ms - p->mono_ms) / 1000.0 : 0);
    bool stepped = p->step_mono_ms > 0;
    js_num_if(j, po, "step_age_s", stepped,
              stepped && now_mono_ms > p->step_mono_ms
                  ? (double)(now_mono_ms - p->step_mono_ms) / 1000.0
                  : 0);
    js_num(j, po, "lines", (double)p->lines);
    js_num(j, po, "malformed", (double)p->malformed);
}

static bool agent_ready(const struct status_agent_view *v)
{
    return v->state == STATUS_AGENT_RUNNING;
}

static cJSON *agent_json(struct js *j, const struct status_agent_view *v, double now,
                         uint64_t now_mono_ms)
{
    cJSON *root = js_check(j, cJSON_CreateObject());
    if (root == NULL)
        return NULL;
    js_header(j, root, "agent", v->program, v->version, v->pid, v->hostname, v->started_at, now);
    js_str(j, root, "run_id", v->run_id);
    js_str(j, root, "state", status_agent_state_name(v->state));
    js_bool(j, root, "ready", agent_ready(v));
    js_num_if(j, root, "node_rank", v->node_rank >= 0, v->node_rank);
    js_num_if(j, root, "nnodes", v->nnodes > 0, v->nnodes);
    js_num_if(j, root, "world_size", v->world_size > 0, v->world_size);
    js_num(j, root, "local_world_size", v->local_world_size);
    js_num(j, root, "round", (double)v->round);
    js_num_if(j, root, "last_round_at", v->last_round_at > 0, v->last_round_at);
    js_num_if(j, root, "last_round_duration_s", v->last_round_duration_s >= 0,
              v->last_round_duration_s);
    js_num(j, root, "waiting_nodes", v->waiting_nodes);

    cJSON *rdzv = js_obj(j, root, "rdzv");
    if (rdzv) {
        js_str(j, rdzv, "backend", v->rdzv_backend);
        js_str(j, rdzv, "endpoint", v->rdzv_endpoint);
        js_str(j, rdzv, "master_addr", v->master_addr);
        js_num_if(j, rdzv, "master_port", v->master_port > 0, v->master_port);
    }
    cJSON *rs = js_obj(j, root, "restarts");
    if (rs) {
        js_num(j, rs, "count", v->restart_count);
        js_num(j, rs, "max", v->max_restarts);
        js_num(j, rs, "remaining",
               v->max_restarts > v->restart_count ? v->max_restarts - v->restart_count : 0);
        cJSON *by = js_obj(j, rs, "by_reason");
        for (int i = 0; by && i < STATUS_RESTART_REASON_COUNT; i++)
            js_num(j, by, restart_reason_names[i], (double)v->restarts[i]);
    }
    cJSON *ex = js_obj(j, root, "worker_exits");
    for (int i = 0; ex && i < STATUS_EXIT_REASON_COUNT; i++)
        js_num(j, ex, exit_reason_names[i], (double)v->worker_exits[i]);
    cJSON *arr = js_arr(j, root, "workers");
    for (size_t i = 0; arr && i < v->nworkers; i++)
        agent_json_worker(j, arr, &v->workers[i], now_mono_ms);
    return root;
}

static void agent_metrics(struct prom_writer *w, const struct status_agent_view *v)
{
    prom_build_info(w, v->program, v->version);
    struct prom_label info[] = {
        {"run_id", v->run_id ? v->run_id : ""},
        {"hostname", v->hostname ? v->hostname : ""},
        {"rdzv_backend", v->rdzv_backend ? v->rdzv_backend : ""},
        {"rdzv_endpoint", v->rdzv_endpoint ? v->rdzv_endpoint : ""},
    };
    prom_family(w, "cddp_agent_info", PROM_GAUGE, "Always 1; the run this agent belongs to.");
    prom_sample(w, info, 4, 1);
    prom_family(w, "cddp_agent_start_time_seconds", PROM_GAUGE,
                "When the agent started, in seconds since the epoch.");
    prom_sample0(w, v->started_at);
    prom_family(w, "cddp_agent_state", PROM_GAUGE, "1 for the agent's current state, else 0.");
    for (int i = 0; i < STATUS_AGENT_STATE_COUNT; i++)
        prom_sample1(w, "state", agent_state_names[i], v->state == (enum status_agent_state)i);
    prom_family(w, "cddp_agent_ready", PROM_GAUGE,
                "1 when the worker group runs in a complete round (as /readyz).");
    prom_sample0(w, agent_ready(v));
    prom_family(w, "cddp_agent_node_rank", PROM_GAUGE,
                "This node's rank in the current round; -1 before the first round.");
    prom_sample0(w, v->node_rank);
    prom_family(w, "cddp_agent_nnodes", PROM_GAUGE, "Nodes in the current round.");
    prom_sample0(w, v->nnodes);
    prom_family(w, "cddp_agent_world_size", PROM_GAUGE, "Workers in the current round, all nodes.");
    prom_sample0(w, v->world_size);
    prom_family(w, "cddp_agent_rdzv_round", PROM_GAUGE,
                "The rendezvous round the worker group was started in; 0 before the first.");
    prom_sample0(w, (double)v->round);
    prom_family(w, "cddp_agent_rdzv_last_round_duration_seconds", PROM_GAUGE,
                "How long the last rendezvous took, from join to round.");
    if (v->last_round_duration_s >= 0)
        prom_sample0(w, v->last_round_duration_s);
    prom_family(w, "cddp_agent_rdzv_last_round_timestamp_seconds", PROM_GAUGE,
                "When the last round completed, in seconds since the epoch.");
    if (v->last_round_at > 0)
        prom_sample0(w, v->last_round_at);
    prom_family(w, "cddp_agent_rdzv_waiting_nodes", PROM_GAUGE,
                "Nodes waiting to join at the next round.");
    prom_sample0(w, v->waiting_nodes);
    prom_family(w, "cddp_agent_restarts_total", PROM_COUNTER,
                "Worker group restarts, by reason (worker_failure counts against max_restarts).");
    for (int i = 0; i < STATUS_RESTART_REASON_COUNT; i++)
        prom_sample1(w, "reason", restart_reason_names[i], (double)v->restarts[i]);
    prom_family(w, "cddp_agent_max_restarts", PROM_GAUGE, "The --max_restarts budget.");
    prom_sample0(w, v->max_restarts);
    prom_family(w, "cddp_agent_worker_exits_total", PROM_COUNTER,
                "Worker process exits, by reason.");
    for (int i = 0; i < STATUS_EXIT_REASON_COUNT; i++)
        prom_sample1(w, "reason", exit_reason_names[i], (double)v->worker_exits[i]);
    prom_family(w, "cddp_agent_workers", PROM_GAUGE, "Local worker processes, by state.");
    for (int st = 0; st < STATUS_WORKER_STATE_COUNT; st++) {
        unsigned n = 0;
        for (size_t i = 0; i < v->nworkers; i++)
            n += v->workers[i].state == (enum status_worker_state)st;
        prom_sample1(w, "state", worker_state_names[st], n);
    }

    /* Per local rank: bounded by --nproc_per_node, stable across rounds. */
    static const struct {
        const char *name;
        enum prom_type type;
        const char *help;
    } fam[] = {
        {"cddp_worker_start_time_seconds", PROM_GAUGE,
         "When the worker's current process started, in seconds since the epoch."},
        {"cddp_worker_progress_step", PROM_GAUGE, "The last step the worker reported."},
        {"cddp_worker_progress_epoch", PROM_GAUGE, "The last epoch the worker reported."},
        {"cddp_worker_loss", PROM_GAUGE, "The last loss the worker reported."},
        {"cddp_worker_samples_per_second", PROM_GAUGE,
         "The last throughput the worker reported, in samples per second."},
        {"cddp_worker_last_progress_timestamp_seconds", PROM_GAUGE,
         "When the worker last reported progress, in seconds since the epoch."},
        {"cddp_worker_progress_lines_total", PROM_COUNTER,
         "Valid progress lines read from the worker."},
        {"cddp_worker_progress_malformed_lines_total", PROM_COUNTER,
         "Progress lines dropped as malformed or too long."},
    };
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        prom_family(w, fam[f].name, fam[f].type, fam[f].help);
        for (size_t i = 0; i < v->nworkers; i++) {
            const struct status_worker_view *wv = &v->workers[i];
            const struct progress_report *p = &wv->progress;
            char lr[16];
            snprintf(lr, sizeof(lr), "%d", wv->local_rank);
            bool have;
            double val;
            switch (f) {
            case 0:
                have = wv->started_at > 0, val = wv->started_at;
                break;
            case 1:
                have = p->fields & PROGRESS_STEP, val = (double)p->step;
                break;
            case 2:
                have = p->fields & PROGRESS_EPOCH, val = (double)p->epoch;
                break;
            case 3:
                have = p->fields & PROGRESS_LOSS, val = p->loss;
                break;
            case 4:
                have = p->fields & PROGRESS_SAMPLES_PER_S, val = p->samples_per_s;
                break;
            case 5:
                have = p->mono_ms > 0, val = p->wall;
                break;
            case 6:
                have = true, val = (double)p->lines;
                break;
            default:
                have = true, val = (double)p->malformed;
                break;
            }
            if (have)
                prom_sample1(w, "local_rank", lr, val);
        }
    }
}

int status_agent_render(const struct status_agent_view *v, double now_wall, uint64_t now_mono_ms,
                        struct status_snapshot **out)
{
    *out = NULL;
    struct status_snapshot *s = status_snapshot_new();
    if (s == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    struct js j = {false};
    cJSON *root = agent_json(&j, v, now_wall, now_mono_ms);
    struct cddp_buf metrics;
    cddp_buf_init(&metrics, METRICS_MAX);
    struct prom_writer w;
    prom_init(&w, &metrics);
    agent_metrics(&w, v);

    /* /readyz: both must pass. */
    bool have_round =
        v->round > 0 && v->state != STATUS_AGENT_INIT && v->state != STATUS_AGENT_RENDEZVOUS;
    char reason[96];
    snprintf(reason, sizeof(reason), "agent is %s%s", status_agent_state_name(v->state),
             v->round == 0 ? ", no round yet" : "");
    int rc = status_snapshot_add_check(s, "rendezvous", have_round, have_round ? NULL : reason);
    if (rc == 0) {
        snprintf(reason, sizeof(reason), "worker group is not running: agent is %s",
                 status_agent_state_name(v->state));
        rc =
            status_snapshot_add_check(s, "workers", agent_ready(v), agent_ready(v) ? NULL : reason);
    }
    return finish(&j, root, rc ? rc : prom_finish(&w), &metrics, s, out);
}

/* ---- the rendezvous server ------------------------------------------- */

static void rdzv_json_nodes(struct js *j, cJSON *run, const char *key,
                            const struct status_rdzv_node_view *nodes, size_t n)
{
    cJSON *arr = js_arr(j, run, key);
    for (size_t i = 0; arr && i < n; i++) {
        cJSON *o = js_push_obj(j, arr);
        if (o == NULL)
            return;
        js_str(j, o, "node", nodes[i].node);
        js_num_if(j, o, "node_rank", nodes[i].node_rank >= 0, nodes[i].node_rank);
        js_num_if(j, o, "nproc", nodes[i].nproc > 0, nodes[i].nproc);
        js_num_if(j, o, "joined_at", nodes[i].joined_at > 0, nodes[i].joined_at);
        js_num_if(j, o, "last_seen_at", nodes[i].last_seen_at > 0, nodes[i].last_seen_at);
    }
}

static cJSON *rdzv_json(struct js *j, const struct status_rdzv_view *v, double now)
{
    cJSON *root = js_check(j, cJSON_CreateObject());
    if (root == NULL)
        return NULL;
    js_header(j, root, "rdzv", v->program, v->version, v->pid, v->hostname, v->started_at, now);
    js_str(j, root, "endpoint", v->endpoint);
    js_bool(j, root, "ready", v->accepting);
    js_num(j, root, "connections", v->connections);
    js_num(j, root, "connections_total", (double)v->connections_total);
    cJSON *ref = js_obj(j, root, "refused_connections");
    for (int i = 0; ref && i < STATUS_REFUSAL_COUNT; i++)
        js_num(j, ref, refusal_names[i], (double)v->refused[i]);
    js_num(j, root, "joins_total", (double)v->joins_total);
    js_num(j, root, "rounds_total", (double)v->rounds_total);
    cJSON *runs = js_arr(j, root, "runs");
    for (size_t i = 0; runs && i < v->nruns; i++) {
        const struct status_rdzv_run_view *r = &v->runs[i];
        cJSON *o = js_push_obj(j, runs);
        if (o == NULL)
            break;
        js_str(j, o, "run_id", r->run_id);
        js_str(j, o, "state", r->state);
        js_num(j, o, "round", (double)r->round);
        js_num(j, o, "min_nodes", r->min_nodes);
        js_num(j, o, "max_nodes", r->max_nodes);
        js_num_if(j, o, "last_round_at", r->last_round_at > 0, r->last_round_at);
        rdzv_json_nodes(j, o, "members", r->members, r->nmembers);
        rdzv_json_nodes(j, o, "waiting", r->waiting, r->nwaiting);
    }
    return root;
}

static void rdzv_metrics(struct prom_writer *w, const struct status_rdzv_view *v)
{
    prom_build_info(w, v->program, v->version);
    prom_family(w, "cddp_rdzv_start_time_seconds", PROM_GAUGE,
                "When the server started, in seconds since the epoch.");
    prom_sample0(w, v->started_at);
    prom_family(w, "cddp_rdzv_ready", PROM_GAUGE, "1 while the server accepts agents.");
    prom_sample0(w, v->accepting);
    prom_family(w, "cddp_rdzv_connections", PROM_GAUGE, "Open agent connections.");
    prom_sample0(w, v->connections);
    prom_family(w, "cddp_rdzv_connections_total", PROM_COUNTER, "Agent connections accepted.");
    prom_sample0(w, (double)v->connections_total);
    prom_family(w, "cddp_rdzv_refused_connections_total", PROM_COUNTER,
                "Agent connections refused, by reason.");
    for (int i = 0; i < STATUS_REFUSAL_COUNT; i++)
        prom_sample1(w, "reason", refusal_names[i], (double)v->refused[i]);
    prom_family(w, "cddp_rdzv_joins_total", PROM_COUNTER, "Join requests, all runs.");
    prom_sample0(w, (double)v->joins_total);
    prom_family(w, "cddp_rdzv_rounds_total", PROM_COUNTER, "Rounds completed, all runs.");
    prom_sample0(w, (double)v->rounds_total);
    prom_family(w, "cddp_rdzv_runs", PROM_GAUGE, "Runs (rendezvous ids) the server holds.");
    prom_sample0(w, (double)v->nruns);
    prom_family(w, "cddp_rdzv_members", PROM_GAUGE, "Nodes in the current round, by run.");
    for (size_t i = 0; i < v->nruns; i++)
        prom_sample1(w, "run_id", v->runs[i].run_id ? v->runs[i].run_id : "",
                     (double)v->runs[i].nmembers);
    prom_family(w, "cddp_rdzv_waiting_nodes", PROM_GAUGE,
                "Nodes on the wait list for the next round, by run.");
    for (size_t i = 0; i < v->nruns; i++)
        prom_sample1(w, "run_id", v->runs[i].run_id ? v->runs[i].run_id : "",
                     (double)v->runs[i].nwaiting);
    prom_family(w, "cddp_rdzv_round", PROM_GAUGE, "The current round, by run.");
    for (size_t i = 0; i < v->nruns; i++)
        prom_sample1(w, "run_id", v->runs[i].run_id ? v->runs[i].run_id : "",
                     (double)v->runs[i].round);
}

int status_rdzv_render(const struct status_rdzv_view *v, double now_wall,
                       struct status_snapshot **out)
{
    *out = NULL;
    struct status_snapshot *s = status_snapshot_new();
    if (s == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    struct js j = {false};
    cJSON *root = rdzv_json(&j, v, now_wall);
    struct cddp_buf metrics;
    cddp_buf_init(&metrics, METRICS_MAX);
    struct prom_writer w;
    prom_init(&w, &metrics);
    rdzv_metrics(&w, v);
    int rc = status_snapshot_add_check(s, "listener", v->accepting,
                                       v->accepting ? NULL : "not accepting agents");
    return finish(&j, root, rc ? rc : prom_finish(&w), &metrics, s, out);
}
