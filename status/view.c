/* view.c: see view.h. The JSON schema and the metric families
 * here are documented in docs/status.md: change both together. */
#include "status/view.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/jsonw.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "status/prom.h"

#define METRICS_MAX ((size_t)16 << 20)
#define JSON_MAX ((size_t)64 << 20)

static const char *const agent_state_names[] = {
    "init",      "rendezvous", "running",      "restarting", "stopping",
    "succeeded", "failed",     "exit_barrier", "terminated",
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
static const char *const goodput_phase_names[] = {
    "init", "productive", "lost", "restart", "rendezvous", "stopped",
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
_Static_assert(sizeof(goodput_phase_names) / sizeof(goodput_phase_names[0]) ==
                   STATUS_GOODPUT_PHASE_COUNT,
               "goodput phase names");
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
const char *status_goodput_phase_name(enum status_goodput_phase p)
{
    return NAME_OF(goodput_phase_names, p, STATUS_GOODPUT_PHASE_COUNT);
}
const char *status_refusal_name(enum status_refusal r)
{
    return NAME_OF(refusal_names, r, STATUS_REFUSAL_COUNT);
}

/* ---- JSON ------------------------------------------------------------ */

static void js_int_if(struct jsonw *j, const char *k, bool known, int64_t v)
{
    if (known)
        jsonw_int(j, k, v);
    else
        jsonw_null(j, k);
}

static void js_secs_if(struct jsonw *j, const char *k, bool known, double v)
{
    if (known)
        jsonw_seconds(j, k, v);
    else
        jsonw_null(j, k);
}

/* Non-finite numbers are not JSON: they become the strings Python's json
 * module would have written, so a diverged loss still shows. */
static void js_real(struct jsonw *j, const char *k, double v)
{
    if (isnan(v))
        jsonw_string(j, k, "NaN");
    else if (isinf(v))
        jsonw_string(j, k, v > 0 ? "Infinity" : "-Infinity");
    else
        jsonw_number(j, k, v);
}

static void js_header(struct jsonw *j, const char *kind, const char *program, const char *version,
                      int pid, const char *hostname, double started_at, double now)
{
    jsonw_string(j, "kind", kind);
    jsonw_string(j, "program", program);
    jsonw_string(j, "version", version);
    jsonw_int(j, "pid", pid);
    jsonw_string(j, "hostname", hostname);
    jsonw_seconds(j, "generated_at", now);
    js_secs_if(j, "started_at", started_at > 0, started_at);
    js_secs_if(j, "uptime_s", started_at > 0, now - started_at);
}

/* Finishes a snapshot from its rendered parts; takes over both buffers. */
static int finish(int rc, struct cddp_buf *json, struct cddp_buf *metrics,
                  struct status_snapshot *s, struct status_snapshot **out)
{
    /* A newline after the JSON, for curl in a terminal. */
    if (rc == 0)
        rc = cddp_buf_append(json, "\n", 1);
    if (rc == 0)
        rc = status_snapshot_set_status(s, json->data, json->len);
    if (rc == 0)
        rc = status_snapshot_set_metrics(s, metrics->data ? metrics->data : "", metrics->len);
    cddp_buf_free(json);
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

static void rdzv_json_fields(struct jsonw *j, const struct status_rdzv_view *v);
static void rdzv_metric_families(struct prom_writer *w, const struct status_rdzv_view *v);
static bool rdzv_any_goodput(const struct status_rdzv_view *v);
static void rdzv_time_samples(struct prom_writer *w, const struct status_rdzv_view *v);
static void rdzv_ratio_samples(struct prom_writer *w, const struct status_rdzv_view *v);

/* ---- the agent ------------------------------------------------------- */

static void agent_json_worker(struct jsonw *j, const struct status_worker_view *wv,
                              uint64_t now_mono_ms)
{
    jsonw_object_begin(j, NULL);
    jsonw_int(j, "local_rank", wv->local_rank);
    js_int_if(j, "rank", wv->rank >= 0, wv->rank);
    js_int_if(j, "pid", wv->pid > 0, wv->pid);
    jsonw_string(j, "state", status_worker_state_name(wv->state));
    js_int_if(j, "exit_code", wv->exit_code >= 0, wv->exit_code);
    js_int_if(j, "signal", wv->signal > 0, wv->signal);
    jsonw_string(j, "signal_name", wv->signal > 0 ? cddp_signal_name(wv->signal) : NULL);
    js_secs_if(j, "started_at", wv->started_at > 0, wv->started_at);
    js_secs_if(j, "exited_at", wv->exited_at > 0, wv->exited_at);
    jsonw_int(j, "restarts", wv->restarts);
    js_secs_if(j, "watchdog_timeout_s", wv->watchdog_timeout_s > 0, wv->watchdog_timeout_s);

    const struct progress_report *p = &wv->progress;
    if (p->lines == 0 && p->malformed == 0) {
        jsonw_null(j, "progress");
    } else {
        jsonw_object_begin(j, "progress");
        js_int_if(j, "step", p->fields & PROGRESS_STEP, p->step);
        js_int_if(j, "epoch", p->fields & PROGRESS_EPOCH, p->epoch);
        if (p->fields & PROGRESS_LOSS)
            js_real(j, "loss", p->loss);
        else
            jsonw_null(j, "loss");
        if (p->fields & PROGRESS_SAMPLES_PER_S)
            jsonw_number(j, "samples_per_s", p->samples_per_s);
        else
            jsonw_null(j, "samples_per_s");
        bool seen = p->mono_ms > 0;
        js_secs_if(j, "time", seen, p->wall);
        js_secs_if(j, "age_s", seen,
                   now_mono_ms > p->mono_ms ? (double)(now_mono_ms - p->mono_ms) / 1000.0 : 0);
        js_secs_if(j, "step_age_s", p->step_mono_ms > 0,
                   now_mono_ms > p->step_mono_ms ? (double)(now_mono_ms - p->step_mono_ms) / 1000.0
                                                 : 0);
        jsonw_int(j, "lines", (int64_t)p->lines);
        jsonw_int(j, "malformed", (int64_t)p->malformed);
        js_secs_if(j, "step_time_s", p->fields & PROGRESS_STEP_TIME, p->step_time_s);
        js_secs_if(j, "compute_s", p->fields & PROGRESS_COMPUTE, p->compute_s);
        js_secs_if(j, "wait_s", p->fields & PROGRESS_WAIT, p->wait_s);
        /* Whose values these are: cddprun's automatic progress (the
         * optimizer's steps) until the script writes lines of its own. */
        jsonw_string(j, "source", p->from_auto ? "auto" : "worker");
        jsonw_object_end(j);
    }
    js_secs_if(j, "step_time_s", wv->step_time_s > 0, wv->step_time_s);
    js_secs_if(j, "compute_s", wv->compute_s > 0, wv->compute_s);
    jsonw_bool(j, "straggler", wv->straggler);
    jsonw_object_end(j);
}

/* The ranks named stragglers, and what they were judged against. */
static void agent_json_stragglers(struct jsonw *j, const struct status_agent_view *v)
{
    if (v->straggler_factor > 0) {
        jsonw_object_begin(j, "straggler_detection");
        jsonw_number(j, "factor", v->straggler_factor);
        jsonw_int(j, "min_steps", STATUS_STRAGGLER_MIN_STEPS);
        if (v->step_median_s > 0) {
            jsonw_string(j, "basis", v->step_compute ? "compute" : "step_time");
            jsonw_seconds(j, "median_s", v->step_median_s);
        } else {
            jsonw_null(j, "basis");
            jsonw_null(j, "median_s");
        }
        jsonw_object_end(j);
    } else {
        jsonw_null(j, "straggler_detection");
    }
    jsonw_array_begin(j, "stragglers");
    for (size_t i = 0; i < v->nworkers; i++) {
        const struct status_worker_view *wv = &v->workers[i];
        if (!wv->straggler)
            continue;
        jsonw_object_begin(j, NULL);
        js_int_if(j, "rank", wv->rank >= 0, wv->rank);
        jsonw_int(j, "local_rank", wv->local_rank);
        jsonw_string(j, "node", v->hostname);
        double t = v->step_compute ? wv->compute_s : wv->step_time_s;
        js_secs_if(j, "time_s", t > 0, t);
        js_secs_if(j, "median_s", v->step_median_s > 0, v->step_median_s);
        jsonw_number(j, "factor", wv->straggler_ratio);
        js_secs_if(j, "since", wv->straggler_since > 0, wv->straggler_since);
        jsonw_object_end(j);
    }
    jsonw_array_end(j);
}

/* Where the wall time went (docs/status.md, "Goodput"). */
static void agent_json_goodput(struct jsonw *j, const struct status_agent_view *v)
{
    const struct status_goodput_view *g = &v->goodput;
    if (!g->known) {
        jsonw_null(j, "goodput");
        return;
    }
    jsonw_object_begin(j, "goodput");
    jsonw_number(j, "ratio", g->ratio);
    jsonw_seconds(j, "wall_s", g->wall_s);
    jsonw_string(j, "phase", status_goodput_phase_name(g->phase));
    jsonw_int(j, "lost_steps", (int64_t)g->lost_steps);
    jsonw_object_begin(j, "seconds");
    for (int i = 0; i < STATUS_GOODPUT_PHASE_COUNT; i++)
        jsonw_seconds(j, goodput_phase_names[i], g->s[i]);
    jsonw_object_end(j);
    jsonw_object_end(j);
}

static void goodput_metrics(struct prom_writer *w, const struct status_agent_view *v)
{
    const struct status_goodput_view *g = &v->goodput;
    /* An agent hosting the rendezvous server adds its runs' job-wide
     * figures to the same families, labelled by run_id. */
    bool jobwide = v->rdzv_server && rdzv_any_goodput(v->rdzv_server);
    if (!g->known && !jobwide)
        return;
    prom_family(w, "cddp_time_seconds_total", PROM_COUNTER,
                "The agent's wall time by phase (init, productive, lost, restart, rendezvous, "
                "stopped); the phases add up to the agent's uptime. With run_id: the job's "
                "node-seconds (the hosted rendezvous server's sums).");
    for (int i = 0; g->known && i < STATUS_GOODPUT_PHASE_COUNT; i++)
        prom_sample1(w, "phase", goodput_phase_names[i], g->s[i]);
    if (jobwide)
        rdzv_time_samples(w, v->rdzv_server);
    prom_family(w, "cddp_goodput_ratio", PROM_GAUGE,
                "Productive time over wall time (steps kept, not redone after a restart). With "
                "run_id: over all the job's node-seconds.");
    if (g->known)
        prom_sample0(w, g->ratio);
    if (jobwide)
        rdzv_ratio_samples(w, v->rdzv_server);
    if (!g->known)
        return;
    prom_family(w, "cddp_lost_steps_total", PROM_COUNTER,
                "Steps computed and then redone after a restart.");
    prom_sample0(w, (double)g->lost_steps);
}

static bool agent_ready(const struct status_agent_view *v)
{
    return v->state == STATUS_AGENT_RUNNING;
}

static void agent_json(struct jsonw *j, const struct status_agent_view *v, double now,
                       uint64_t now_mono_ms)
{
    jsonw_object_begin(j, NULL);
    js_header(j, "agent", v->program, v->version, v->pid, v->hostname, v->started_at, now);
    jsonw_string(j, "run_id", v->run_id);
    jsonw_string(j, "state", status_agent_state_name(v->state));
    jsonw_bool(j, "ready", agent_ready(v));
    js_int_if(j, "exit_code", v->exit_code >= 0, v->exit_code);
    if (v->exit_code >= 0 && v->exit_reason)
        jsonw_string(j, "exit_reason", v->exit_reason);
    else
        jsonw_null(j, "exit_reason");
    agent_json_goodput(j, v);
    js_int_if(j, "node_rank", v->node_rank >= 0, v->node_rank);
    js_int_if(j, "nnodes", v->nnodes > 0, v->nnodes);
    js_int_if(j, "world_size", v->world_size > 0, v->world_size);
    jsonw_int(j, "local_world_size", v->local_world_size);
    jsonw_int(j, "round", (int64_t)v->round);
    js_secs_if(j, "last_round_at", v->last_round_at > 0, v->last_round_at);
    js_secs_if(j, "last_round_duration_s", v->last_round_duration_s >= 0, v->last_round_duration_s);
    jsonw_int(j, "waiting_nodes", v->waiting_nodes);

    jsonw_object_begin(j, "rdzv");
    jsonw_string(j, "backend", v->rdzv_backend);
    jsonw_string(j, "endpoint", v->rdzv_endpoint);
    jsonw_string(j, "master_addr", v->master_addr);
    js_int_if(j, "master_port", v->master_port > 0, v->master_port);
    jsonw_bool(j, "connected", v->rdzv_connected);
    js_secs_if(j, "disconnected_at", v->rdzv_disconnected_at > 0, v->rdzv_disconnected_at);
    jsonw_int(j, "reconnects", v->rdzv_reconnects);
    if (v->etcd_member) {
        jsonw_object_begin(j, "etcd");
        jsonw_string(j, "member", v->etcd_member);
        jsonw_bool(j, "lease_ok", v->etcd_lease_ok);
        jsonw_bool(j, "watch_ok", v->etcd_watch_ok);
        jsonw_int(j, "failovers", v->etcd_failovers);
        jsonw_object_end(j);
    }
    jsonw_object_end(j);

    jsonw_object_begin(j, "network");
    jsonw_string(j, "ifname", v->ifname);
    jsonw_string(j, "address", v->ifname_addr);
    jsonw_string(j, "source", v->ifname_source ? v->ifname_source : "none");
    jsonw_object_end(j);

    jsonw_object_begin(j, "restarts");
    jsonw_int(j, "count", v->restart_count);
    jsonw_int(j, "max", v->max_restarts);
    jsonw_int(j, "remaining",
              v->max_restarts > v->restart_count ? v->max_restarts - v->restart_count : 0);
    jsonw_object_begin(j, "by_reason");
    for (int i = 0; i < STATUS_RESTART_REASON_COUNT; i++)
        jsonw_int(j, restart_reason_names[i], (int64_t)v->restarts[i]);
    jsonw_object_end(j);
    if (v->restart_scope) {
        jsonw_string(j, "scope", v->restart_scope);
        jsonw_object_begin(j, "by_scope");
        jsonw_int(j, "worker", (int64_t)v->restarts_worker);
        jsonw_int(j, "group", (int64_t)v->restarts_group);
        jsonw_object_end(j);
        jsonw_int(j, "scope_fallbacks", (int64_t)v->scope_fallbacks);
        jsonw_int(j, "node_replacements", (int64_t)v->node_replacements);
        jsonw_int(j, "generation", v->generation);
        jsonw_int(j, "spares", v->spares);
        if (v->last_recovery_s >= 0)
            jsonw_seconds(j, "last_recovery_s", v->last_recovery_s);
        else
            jsonw_null(j, "last_recovery_s");
    }
    jsonw_object_end(j);

    jsonw_object_begin(j, "worker_exits");
    for (int i = 0; i < STATUS_EXIT_REASON_COUNT; i++)
        jsonw_int(j, exit_reason_names[i], (int64_t)v->worker_exits[i]);
    jsonw_object_end(j);

    jsonw_object_begin(j, "logs");
    jsonw_int(j, "dropped_bytes", (int64_t)v->log_dropped_bytes);
    jsonw_int(j, "dropped_files", (int64_t)v->log_dropped_files);
    jsonw_object_end(j);

    if (v->watchdog_mode) {
        jsonw_object_begin(j, "watchdog");
        jsonw_string(j, "mode", v->watchdog_mode);
        jsonw_int(j, "kills", (int64_t)v->watchdog_kills);
        jsonw_object_end(j);
    }

    agent_json_stragglers(j, v);

    /* Where the run's history is (GET /history), and its last number, so
     * a reader asks for it only when there is news. */
    if (v->history) {
        jsonw_object_begin(j, "history");
        jsonw_string(j, "path", "/history");
        jsonw_int(j, "seq", (int64_t)v->history_seq);
        jsonw_object_end(j);
    } else {
        jsonw_null(j, "history");
    }

    jsonw_array_begin(j, "workers");
    for (size_t i = 0; i < v->nworkers; i++)
        agent_json_worker(j, &v->workers[i], now_mono_ms);
    jsonw_array_end(j);

    if (v->rdzv_server) {
        jsonw_object_begin(j, "rdzv_server");
        rdzv_json_fields(j, v->rdzv_server);
        jsonw_object_end(j);
    } else {
        jsonw_null(j, "rdzv_server");
    }
    if (v->agent_store) {
        const struct status_store_view *s = v->agent_store;
        jsonw_object_begin(j, "agent_store");
        jsonw_int(j, "port", s->port);
        jsonw_int(j, "round", (int64_t)s->round);
        jsonw_int(j, "keys", (int64_t)s->keys);
        jsonw_int(j, "bytes", (int64_t)s->bytes);
        jsonw_int(j, "connections", (int64_t)s->connections);
        jsonw_int(j, "waiting", (int64_t)s->waiting);
        jsonw_int(j, "accepted_total", (int64_t)s->accepted);
        jsonw_int(j, "queries_total", (int64_t)s->queries);
        jsonw_int(j, "refused_total", (int64_t)s->refused);
        jsonw_object_end(j);
    } else {
        jsonw_null(j, "agent_store");
    }
    jsonw_object_end(j);
}

/* The agent's TCPStore; queries per second is rate(queries_total). */
static void store_metrics(struct prom_writer *w, const struct status_store_view *s)
{
    prom_family(w, "cddp_agent_store_keys", PROM_GAUGE, "Keys in the agent's TCPStore.");
    prom_sample0(w, (double)s->keys);
    prom_family(w, "cddp_agent_store_bytes", PROM_GAUGE, "Bytes the agent's TCPStore holds.");
    prom_sample0(w, (double)s->bytes);
    prom_family(w, "cddp_agent_store_connections", PROM_GAUGE,
                "Open connections to the agent's TCPStore.");
    prom_sample0(w, (double)s->connections);
    prom_family(w, "cddp_agent_store_queries_total", PROM_COUNTER,
                "Queries the agent's TCPStore answered this round.");
    prom_sample0(w, (double)s->queries);
}

/* The agent's place in the rendezvous: its round, the nodes waiting, the
 * connection to the server (and to etcd, with the etcd-v3 backend). */
static void agent_rdzv_metrics(struct prom_writer *w, const struct status_agent_view *v)
{
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
    prom_family(w, "cddp_agent_rdzv_connected", PROM_GAUGE,
                "1 while connected to the rendezvous server; 0 while reconnecting.");
    prom_sample0(w, v->rdzv_connected);
    prom_family(w, "cddp_agent_rdzv_reconnects_total", PROM_COUNTER,
                "Connections to the rendezvous server re-established after a loss.");
    prom_sample0(w, v->rdzv_reconnects);
    if (v->etcd_member) {
        prom_family(w, "cddp_agent_rdzv_etcd_lease_ok", PROM_GAUGE,
                    "etcd-v3: 1 while this node's lease keep-alive is answered.");
        prom_sample1(w, "member", v->etcd_member, v->etcd_lease_ok);
        prom_family(w, "cddp_agent_rdzv_etcd_watch_ok", PROM_GAUGE,
                    "etcd-v3: 1 while the watch stream on the run is open.");
        prom_sample1(w, "member", v->etcd_member, v->etcd_watch_ok);
        prom_family(w, "cddp_agent_rdzv_etcd_failovers_total", PROM_COUNTER,
                    "etcd-v3: how often the member in use changed.");
        prom_sample0(w, v->etcd_failovers);
    }
}

/* Per local rank: bounded by --nproc_per_node, stable across rounds. The
 * order is worker_value's. */
static const struct {
    const char *name;
    enum prom_type type;
    const char *help;
} worker_families[] = {
    {"cddp_worker_start_time_seconds", PROM_GAUGE,
     "When the worker's current process started, in seconds since the epoch."},
    {"cddp_worker_last_exit_timestamp_seconds", PROM_GAUGE,
     "When the agent saw the worker's last process exit, in seconds since the epoch."},
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
    {"cddp_worker_watchdog_timeout_seconds", PROM_GAUGE,
     "The progress watchdog's timeout for the worker now (absent while not watched)."},
    {"cddp_worker_step_seconds", PROM_GAUGE,
     "The worker's mean step time over its last 20+ steps (absent until measured)."},
    {"cddp_worker_compute_seconds", PROM_GAUGE,
     "The worker's mean step time outside collective waits over its last 20+ steps (absent "
     "unless reported)."},
    {"cddp_worker_straggler", PROM_GAUGE,
     "1 while the worker is named a straggler (--straggler_factor times the node's median), "
     "else 0."},
};

/* Worker wv's value in family f of worker_families, into *val; *have is
 * false where the worker has none yet (its sample is left out). */
static void worker_value(size_t f, const struct status_worker_view *wv, bool *have, double *val)
{
    const struct progress_report *p = &wv->progress;
    switch (f) {
    case 0:
        *have = wv->started_at > 0, *val = wv->started_at;
        break;
    case 1:
        *have = wv->exited_at > 0, *val = wv->exited_at;
        break;
    case 2:
        *have = p->fields & PROGRESS_STEP, *val = (double)p->step;
        break;
    case 3:
        *have = p->fields & PROGRESS_EPOCH, *val = (double)p->epoch;
        break;
    case 4:
        *have = p->fields & PROGRESS_LOSS, *val = p->loss;
        break;
    case 5:
        *have = p->fields & PROGRESS_SAMPLES_PER_S, *val = p->samples_per_s;
        break;
    case 6:
        *have = p->mono_ms > 0, *val = p->wall;
        break;
    case 7:
        *have = true, *val = (double)p->lines;
        break;
    case 9:
        *have = wv->watchdog_timeout_s > 0, *val = wv->watchdog_timeout_s;
        break;
    case 10:
        *have = wv->step_time_s > 0, *val = wv->step_time_s;
        break;
    case 11:
        *have = wv->compute_s > 0, *val = wv->compute_s;
        break;
    case 12:
        *have = true, *val = wv->straggler;
        break;
    default:
        *have = true, *val = (double)p->malformed;
        break;
    }
}

static void worker_metrics(struct prom_writer *w, const struct status_agent_view *v)
{
    char lr[16];
    for (size_t f = 0; f < sizeof(worker_families) / sizeof(worker_families[0]); f++) {
        prom_family(w, worker_families[f].name, worker_families[f].type, worker_families[f].help);
        for (size_t i = 0; i < v->nworkers; i++) {
            const struct status_worker_view *wv = &v->workers[i];
            prom_format_value(wv->local_rank, lr, sizeof(lr));
            bool have;
            double val;
            worker_value(f, wv, &have, &val);
            if (have)
                prom_sample1(w, "local_rank", lr, val);
        }
    }
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
    agent_rdzv_metrics(w, v);
    prom_family(w, "cddp_agent_restarts_total", PROM_COUNTER,
                "Worker group restarts, by reason (worker_failure counts against max_restarts).");
    for (int i = 0; i < STATUS_RESTART_REASON_COUNT; i++)
        prom_sample1(w, "reason", restart_reason_names[i], (double)v->restarts[i]);
    if (v->restart_scope) {
        prom_family(w, "cddp_agent_restarts_by_scope_total", PROM_COUNTER,
                    "Failure restarts by --restart_scope: one worker, or the whole group.");
        prom_sample1(w, "scope", "worker", (double)v->restarts_worker);
        prom_sample1(w, "scope", "group", (double)v->restarts_group);
        prom_family(w, "cddp_agent_generation", PROM_GAUGE,
                    "The running group's membership generation (workers restarted alone).");
        prom_sample0(w, (double)v->generation);
        prom_family(w, "cddp_agent_spares", PROM_GAUGE,
                    "Spare worker processes started and waiting (--spare_workers).");
        prom_sample0(w, (double)v->spares);
        if (v->last_recovery_s >= 0) {
            prom_family(w, "cddp_agent_last_recovery_seconds", PROM_GAUGE,
                        "From the last worker restarted alone to its first step.");
            prom_sample0(w, v->last_recovery_s);
        }
    }
    prom_family(w, "cddp_agent_max_restarts", PROM_GAUGE, "The --max_restarts budget.");
    prom_sample0(w, v->max_restarts);
    prom_family(w, "cddp_agent_worker_exits_total", PROM_COUNTER,
                "Worker process exits, by reason.");
    for (int i = 0; i < STATUS_EXIT_REASON_COUNT; i++)
        prom_sample1(w, "reason", exit_reason_names[i], (double)v->worker_exits[i]);
    prom_family(w, "cddp_agent_watchdog_kills_total", PROM_COUNTER,
                "Worker groups the progress watchdog stopped because a worker was hung.");
    prom_sample0(w, (double)v->watchdog_kills);
    prom_family(w, "cddp_agent_log_dropped_bytes_total", PROM_COUNTER,
                "Bytes of teed worker output the log files could not take (a full disk).");
    prom_sample0(w, (double)v->log_dropped_bytes);
    prom_family(w, "cddp_agent_workers", PROM_GAUGE, "Local worker processes, by state.");
    for (int st = 0; st < STATUS_WORKER_STATE_COUNT; st++) {
        unsigned n = 0;
        for (size_t i = 0; i < v->nworkers; i++)
            n += v->workers[i].state == (enum status_worker_state)st;
        prom_sample1(w, "state", worker_state_names[st], n);
    }

    goodput_metrics(w, v);
    worker_metrics(w, v);
    if (v->rdzv_server)
        rdzv_metric_families(w, v->rdzv_server);
    if (v->agent_store)
        store_metrics(w, v->agent_store);
}

int status_agent_render(const struct status_agent_view *v, double now_wall, uint64_t now_mono_ms,
                        struct status_snapshot **out)
{
    *out = NULL;
    struct status_snapshot *s = status_snapshot_new();
    if (s == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    struct cddp_buf json, metrics;
    cddp_buf_init(&json, JSON_MAX);
    cddp_buf_init(&metrics, METRICS_MAX);
    struct jsonw j;
    jsonw_init(&j, &json);
    agent_json(&j, v, now_wall, now_mono_ms);
    struct prom_writer w;
    prom_init(&w, &metrics);
    agent_metrics(&w, v);

    /* /readyz: both must pass. */
    bool have_round =
        v->round > 0 && v->state != STATUS_AGENT_INIT && v->state != STATUS_AGENT_RENDEZVOUS;
    char reason[96];
    /* The state's name as /status spells it ("succeeded" is not an
     * adjective to put after "is"). */
    snprintf(reason, sizeof(reason), "agent state: %s%s", status_agent_state_name(v->state),
             v->round == 0 ? ", no round yet" : "");
    int rc = status_snapshot_add_check(s, "rendezvous", have_round, have_round ? NULL : reason);
    if (rc == 0) {
        snprintf(reason, sizeof(reason), "worker group is not running (agent state: %s)",
                 status_agent_state_name(v->state));
        rc =
            status_snapshot_add_check(s, "workers", agent_ready(v), agent_ready(v) ? NULL : reason);
    }
    if (rc == 0)
        rc = jsonw_finish(&j);
    if (rc == 0)
        rc = prom_finish(&w);
    return finish(rc, &json, &metrics, s, out);
}

/* ---- the rendezvous server ------------------------------------------- */

static void rdzv_json_nodes(struct jsonw *j, const char *key,
                            const struct status_rdzv_node_view *nodes, size_t n)
{
    jsonw_array_begin(j, key);
    for (size_t i = 0; i < n; i++) {
        jsonw_object_begin(j, NULL);
        jsonw_string(j, "node", nodes[i].node);
        if (nodes[i].state)
            jsonw_string(j, "state", nodes[i].state);
        js_int_if(j, "node_rank", nodes[i].node_rank >= 0, nodes[i].node_rank);
        js_int_if(j, "nproc", nodes[i].nproc > 0, nodes[i].nproc);
        js_int_if(j, "status_port", nodes[i].status_port > 0, nodes[i].status_port);
        if (nodes[i].addr)
            jsonw_string(j, "addr", nodes[i].addr);
        else
            jsonw_null(j, "addr");
        js_secs_if(j, "joined_at", nodes[i].joined_at > 0, nodes[i].joined_at);
        js_secs_if(j, "last_seen_at", nodes[i].last_seen_at > 0, nodes[i].last_seen_at);
        js_secs_if(j, "step_time_s", nodes[i].step_time_s > 0, nodes[i].step_time_s);
        js_secs_if(j, "compute_s", nodes[i].compute_s > 0, nodes[i].compute_s);
        jsonw_bool(j, "straggler", nodes[i].straggler);
        jsonw_object_end(j);
    }
    jsonw_array_end(j);
}

/* A run's slow nodes: each named against the median of the nodes' medians. */
static void rdzv_json_stragglers(struct jsonw *j, const struct status_rdzv_run_view *r)
{
    js_secs_if(j, "step_median_s", r->step_median_s > 0, r->step_median_s);
    if (r->step_median_s > 0)
        jsonw_string(j, "step_basis", r->step_compute ? "compute" : "step_time");
    else
        jsonw_null(j, "step_basis");
    jsonw_array_begin(j, "stragglers");
    for (size_t i = 0; i < r->nmembers; i++) {
        const struct status_rdzv_node_view *n = &r->members[i];
        if (!n->straggler)
            continue;
        jsonw_object_begin(j, NULL);
        jsonw_string(j, "node", n->node);
        js_int_if(j, "node_rank", n->node_rank >= 0, n->node_rank);
        js_int_if(j, "rank", n->slowest_rank >= 0, n->slowest_rank);
        double t = r->step_compute ? n->compute_s : n->step_time_s;
        js_secs_if(j, "time_s", t > 0, t);
        js_secs_if(j, "median_s", r->step_median_s > 0, r->step_median_s);
        jsonw_number(j, "factor", n->straggler_ratio);
        js_secs_if(j, "since", n->straggler_since > 0, n->straggler_since);
        jsonw_object_end(j);
    }
    jsonw_array_end(j);
}

/* The run's job-wide goodput (docs/status.md, "Job-wide goodput"). */
static void rdzv_json_goodput(struct jsonw *j, const struct status_rdzv_run_view *r)
{
    if (!r->has_goodput) {
        jsonw_null(j, "goodput");
        return;
    }
    jsonw_object_begin(j, "goodput");
    jsonw_int(j, "nodes", (int64_t)r->goodput_nodes);
    jsonw_number(j, "ratio", r->goodput_ratio);
    jsonw_seconds(j, "total_s", r->goodput_total_s);
    jsonw_int(j, "lost_steps", r->goodput_lost_steps);
    if (r->max_step >= 0) {
        jsonw_int(j, "max_step", r->max_step);
        jsonw_int(j, "min_step", r->min_step);
    } else {
        jsonw_null(j, "max_step");
        jsonw_null(j, "min_step");
    }
    jsonw_object_begin(j, "seconds");
    for (int i = 0; i < STATUS_GOODPUT_PHASE_COUNT; i++)
        jsonw_seconds(j, goodput_phase_names[i], r->goodput_s[i]);
    jsonw_object_end(j);
    jsonw_object_end(j);
}

/* What cddp-rdzv's /status holds after its header; an agent hosting the
 * server shows the same under "rdzv_server". */
static void rdzv_json_fields(struct jsonw *j, const struct status_rdzv_view *v)
{
    jsonw_string(j, "endpoint", v->endpoint);
    jsonw_bool(j, "ready", v->accepting);
    jsonw_int(j, "connections", v->connections);
    jsonw_int(j, "connections_total", (int64_t)v->connections_total);
    jsonw_object_begin(j, "refused_connections");
    for (int i = 0; i < STATUS_REFUSAL_COUNT; i++)
        jsonw_int(j, refusal_names[i], (int64_t)v->refused[i]);
    jsonw_object_end(j);
    jsonw_int(j, "joins_total", (int64_t)v->joins_total);
    jsonw_int(j, "rounds_total", (int64_t)v->rounds_total);
    jsonw_array_begin(j, "runs");
    for (size_t i = 0; i < v->nruns; i++) {
        const struct status_rdzv_run_view *r = &v->runs[i];
        jsonw_object_begin(j, NULL);
        jsonw_string(j, "run_id", r->run_id);
        jsonw_string(j, "state", r->state);
        jsonw_int(j, "round", (int64_t)r->round);
        jsonw_int(j, "min_nodes", r->min_nodes);
        jsonw_int(j, "max_nodes", r->max_nodes);
        js_secs_if(j, "last_round_at", r->last_round_at > 0, r->last_round_at);
        rdzv_json_stragglers(j, r);
        rdzv_json_goodput(j, r);
        rdzv_json_nodes(j, "members", r->members, r->nmembers);
        rdzv_json_nodes(j, "waiting", r->waiting, r->nwaiting);
        jsonw_object_end(j);
    }
    jsonw_array_end(j);
}

static void rdzv_json(struct jsonw *j, const struct status_rdzv_view *v, double now)
{
    jsonw_object_begin(j, NULL);
    js_header(j, "rdzv", v->program, v->version, v->pid, v->hostname, v->started_at, now);
    rdzv_json_fields(j, v);
    jsonw_object_end(j);
}

/* Every cddp_rdzv_* family (cddp-rdzv's, and a hosting agent's). */
static void rdzv_metric_families(struct prom_writer *w, const struct status_rdzv_view *v)
{
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
    prom_family(w, "cddp_rdzv_step_seconds", PROM_GAUGE,
                "The median of the nodes' median step times (compute when every node reports "
                "it), by run; absent until two nodes are measured.");
    for (size_t i = 0; i < v->nruns; i++)
        if (v->runs[i].step_median_s > 0)
            prom_sample1(w, "run_id", v->runs[i].run_id ? v->runs[i].run_id : "",
                         v->runs[i].step_median_s);
    prom_family(w, "cddp_rdzv_stragglers", PROM_GAUGE,
                "Nodes named stragglers (their median step --straggler_factor times the job's), "
                "by run.");
    for (size_t i = 0; i < v->nruns; i++) {
        size_t slow = 0;
        for (size_t k = 0; k < v->runs[i].nmembers; k++)
            slow += v->runs[i].members[k].straggler;
        prom_sample1(w, "run_id", v->runs[i].run_id ? v->runs[i].run_id : "", (double)slow);
    }
}

/* Job-wide goodput by run: cddp-rdzv's families, or an agent's own
 * (goodput_metrics) when it hosts the server. */
static bool rdzv_any_goodput(const struct status_rdzv_view *v)
{
    for (size_t i = 0; i < v->nruns; i++)
        if (v->runs[i].has_goodput)
            return true;
    return false;
}

static void rdzv_time_samples(struct prom_writer *w, const struct status_rdzv_view *v)
{
    for (size_t i = 0; i < v->nruns; i++) {
        const struct status_rdzv_run_view *r = &v->runs[i];
        for (int p = 0; r->has_goodput && p < STATUS_GOODPUT_PHASE_COUNT; p++) {
            struct prom_label l[2] = {{"run_id", r->run_id ? r->run_id : ""},
                                      {"phase", goodput_phase_names[p]}};
            prom_sample(w, l, 2, r->goodput_s[p]);
        }
    }
}

static void rdzv_ratio_samples(struct prom_writer *w, const struct status_rdzv_view *v)
{
    for (size_t i = 0; i < v->nruns; i++)
        if (v->runs[i].has_goodput)
            prom_sample1(w, "run_id", v->runs[i].run_id ? v->runs[i].run_id : "",
                         v->runs[i].goodput_ratio);
}

static void rdzv_goodput_metrics(struct prom_writer *w, const struct status_rdzv_view *v)
{
    if (!rdzv_any_goodput(v))
        return;
    prom_family(w, "cddp_time_seconds_total", PROM_COUNTER,
                "The job's node-seconds by phase, by run: the sum of the latest totals of every "
                "node that reported them (current and past members).");
    rdzv_time_samples(w, v);
    prom_family(w, "cddp_goodput_ratio", PROM_GAUGE,
                "Productive node-seconds over all the job's node-seconds, by run.");
    rdzv_ratio_samples(w, v);
}

static void rdzv_metrics(struct prom_writer *w, const struct status_rdzv_view *v)
{
    prom_build_info(w, v->program, v->version);
    rdzv_metric_families(w, v);
    rdzv_goodput_metrics(w, v);
}

int status_rdzv_render(const struct status_rdzv_view *v, double now_wall,
                       struct status_snapshot **out)
{
    *out = NULL;
    struct status_snapshot *s = status_snapshot_new();
    if (s == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    struct cddp_buf json, metrics;
    cddp_buf_init(&json, JSON_MAX);
    cddp_buf_init(&metrics, METRICS_MAX);
    struct jsonw j;
    jsonw_init(&j, &json);
    rdzv_json(&j, v, now_wall);
    struct prom_writer w;
    prom_init(&w, &metrics);
    rdzv_metrics(&w, v);
    int rc = status_snapshot_add_check(s, "listener", v->accepting,
                                       v->accepting ? NULL : "not accepting agents");
    if (rc == 0)
        rc = jsonw_finish(&j);
    if (rc == 0)
        rc = prom_finish(&w);
    return finish(rc, &json, &metrics, s, out);
}
