/* Unit tests for status/view.c: the /status JSON, /metrics families
 * and /readyz checks of the agent and of the rendezvous server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "proto/progress.h"
#include "status/view.h"

static struct status_worker_view workers[2];

static void fill_agent(struct status_agent_view *v)
{
    memset(v, 0, sizeof(*v));
    memset(workers, 0, sizeof(workers));
    v->program = "cddprun";
    v->version = "0.1.0";
    v->pid = 4242;
    v->hostname = "node1";
    v->run_id = "job\"7";
    v->started_at = 1000.0;
    v->exit_code = -1;
    v->state = STATUS_AGENT_RUNNING;
    v->node_rank = 1;
    v->nnodes = 2;
    v->world_size = 4;
    v->local_world_size = 2;
    v->round = 3;
    v->last_round_at = 1010.0;
    v->last_round_duration_s = 0.25;
    v->rdzv_backend = "c10d";
    v->rdzv_endpoint = "10.0.0.1:29400";
    v->master_addr = "10.0.0.1";
    v->master_port = 29500;
    v->restart_count = 1;
    v->max_restarts = 3;
    v->restarts[STATUS_RESTART_WORKER_FAILURE] = 1;
    v->restarts[STATUS_RESTART_MEMBERSHIP_CHANGE] = 2;
    v->worker_exits[STATUS_EXIT_FAILURE] = 1;
    v->worker_exits[STATUS_EXIT_STOPPED] = 1;
    for (int i = 0; i < 2; i++) {
        workers[i].local_rank = i;
        workers[i].rank = 2 + i;
        workers[i].pid = 100 + i;
        workers[i].state = STATUS_WORKER_RUNNING;
        workers[i].exit_code = -1;
        workers[i].started_at = 1011.0;
        workers[i].restarts = 1;
    }
    workers[1].exited_at = 1010.123456; /* its last process, before this round */
    /* Worker 0 reports progress (through the real parser), worker 1 garbage. */
    struct progress_parser p;
    progress_init(&p);
    const char *good = "{\"step\":120,\"epoch\":1,\"loss\":NaN,\"samples_per_s\":612.5}\n";
    progress_feed(&p, good, strlen(good), 5000, 1020.0);
    workers[0].progress = p.report;
    progress_init(&p);
    progress_feed(&p, "garbage\n", 8, 5000, 1020.0);
    workers[1].progress = p.report;
    v->nworkers = 2;
    v->workers = workers;
}

static cJSON *status_json(struct status_snapshot *s)
{
    size_t len;
    const char *text = status_snapshot_status(s, &len);
    assert_true(len > 1 && text[len - 1] == '\n');
    cJSON *root = cJSON_ParseWithLength(text, len);
    assert_non_null(root);
    return root;
}

static double num(const cJSON *o, const char *path)
{
    /* "a.b.c": walk the objects. */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *cur = o;
    for (char *tok = buf; tok;) {
        char *dot = strchr(tok, '.');
        if (dot)
            *dot = '\0';
        cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
        tok = dot ? dot + 1 : NULL;
    }
    if (!cJSON_IsNumber(cur))
        fail_msg("%s is not a number", path);
    return cur->valuedouble;
}

static const char *str(const cJSON *o, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(it))
        fail_msg("%s is not a string", key);
    return it->valuestring;
}

static bool is_null(const cJSON *o, const char *key)
{
    return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, key));
}

static void test_agent_json(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    cJSON *root = status_json(s);
    assert_string_equal(str(root, "kind"), "agent");
    assert_string_equal(str(root, "run_id"), "job\"7");
    assert_string_equal(str(root, "state"), "running");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(root, "ready")));
    assert_true(num(root, "uptime_s") == 30.5);
    assert_true(num(root, "generated_at") == 1030.5);
    assert_true(num(root, "node_rank") == 1);
    assert_true(num(root, "round") == 3);
    assert_true(num(root, "last_round_duration_s") == 0.25);
    assert_true(num(root, "restarts.count") == 1);
    assert_true(num(root, "restarts.max") == 3);
    assert_true(num(root, "restarts.remaining") == 2);
    assert_true(num(root, "restarts.by_reason.membership_change") == 2);
    assert_true(num(root, "worker_exits.failure") == 1);
    assert_true(num(root, "rdzv.master_port") == 29500);
    assert_string_equal(str(cJSON_GetObjectItem(root, "rdzv"), "endpoint"), "10.0.0.1:29400");

    const cJSON *ws = cJSON_GetObjectItem(root, "workers");
    assert_int_equal(cJSON_GetArraySize(ws), 2);
    const cJSON *w0 = cJSON_GetArrayItem(ws, 0);
    assert_true(num(w0, "rank") == 2);
    assert_true(num(w0, "pid") == 100);
    assert_string_equal(str(w0, "state"), "running");
    assert_true(is_null(w0, "exit_code"));
    assert_true(is_null(w0, "exited_at"));
    assert_true(is_null(w0, "signal"));
    assert_true(num(w0, "progress.step") == 120);
    assert_true(num(w0, "progress.samples_per_s") == 612.5);
    assert_true(fabs(num(w0, "progress.age_s") - 0.4) < 1e-9);
    assert_string_equal(str(cJSON_GetObjectItem(w0, "progress"), "loss"), "NaN");
    const cJSON *p1 = cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 1), "progress");
    assert_true(is_null(p1, "step"));
    assert_true(is_null(p1, "time"));
    assert_true(num(p1, "malformed") == 1);
    assert_true(is_null(root, "history")); /* none kept */
    cJSON_Delete(root);

    /* Ready with both checks. */
    assert_true(status_snapshot_ready(s));
    assert_int_equal(status_snapshot_check_count(s), 2);
    assert_string_equal(status_snapshot_check(s, 0)->name, "rendezvous");
    assert_string_equal(status_snapshot_check(s, 1)->name, "workers");
    status_snapshot_unref(s);

    /* A history kept: where, and its last number. */
    v.history = true;
    v.history_seq = 42;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    root = status_json(s);
    assert_string_equal(str(cJSON_GetObjectItem(root, "history"), "path"), "/history");
    assert_true(num(root, "history.seq") == 42);
    cJSON_Delete(root);
    status_snapshot_unref(s);
}

static void test_agent_not_ready(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    /* Before the first round: nothing known, both checks fail. */
    v.state = STATUS_AGENT_RENDEZVOUS;
    v.round = 0;
    v.node_rank = -1;
    v.last_round_duration_s = -1;
    v.last_round_at = 0;
    workers[0].state = workers[1].state = STATUS_WORKER_INIT;
    workers[0].pid = workers[1].pid = 0;
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1001, 1, &s), 0);
    assert_false(status_snapshot_ready(s));
    assert_false(status_snapshot_check(s, 0)->ok);
    assert_string_equal(status_snapshot_check(s, 0)->reason,
                        "agent state: rendezvous, no round yet");
    assert_false(status_snapshot_check(s, 1)->ok);
    cJSON *root = status_json(s);
    assert_true(is_null(root, "node_rank"));
    assert_true(is_null(root, "last_round_duration_s"));
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(root, "ready")));
    cJSON_Delete(root);
    status_snapshot_unref(s);

    /* Restarting after a round: the round is there, the workers are not. */
    fill_agent(&v);
    v.state = STATUS_AGENT_RESTARTING;
    workers[0].state = STATUS_WORKER_FAILED;
    workers[0].exit_code = -1;
    workers[0].signal = 9;
    workers[0].exited_at = 1000.25;
    assert_int_equal(status_agent_render(&v, 1001, 1, &s), 0);
    assert_true(status_snapshot_check(s, 0)->ok);
    assert_false(status_snapshot_check(s, 1)->ok);
    root = status_json(s);
    const cJSON *w0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "workers"), 0);
    assert_true(num(w0, "signal") == 9);
    assert_string_equal(str(w0, "signal_name"), "SIGKILL");
    assert_true(num(w0, "exited_at") == 1000.25);
    cJSON_Delete(root);
    status_snapshot_unref(s);
}

static void test_agent_metrics(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    size_t len;
    const char *m = status_snapshot_metrics(s, &len);
    assert_int_equal(strlen(m), len);
    static const char *const want[] = {
        "cddp_build_info{program=\"cddprun\",version=\"0.1.0\"} 1\n",
        "cddp_agent_info{run_id=\"job\\\"7\",hostname=\"node1\",rdzv_backend=\"c10d\","
        "rdzv_endpoint=\"10.0.0.1:29400\"} 1\n",
        "# TYPE cddp_agent_state gauge\n",
        "cddp_agent_state{state=\"running\"} 1\n",
        "cddp_agent_state{state=\"failed\"} 0\n",
        "cddp_agent_ready 1\n",
        "cddp_agent_rdzv_round 3\n",
        "cddp_agent_rdzv_last_round_duration_seconds 0.25\n",
        "# TYPE cddp_agent_restarts_total counter\n",
        "cddp_agent_restarts_total{reason=\"worker_failure\"} 1\n",
        "cddp_agent_restarts_total{reason=\"membership_change\"} 2\n",
        "cddp_agent_worker_exits_total{reason=\"stopped\"} 1\n",
        "cddp_agent_workers{state=\"running\"} 2\n",
        "cddp_agent_workers{state=\"failed\"} 0\n",
        "cddp_worker_progress_step{local_rank=\"0\"} 120\n",
        "cddp_worker_loss{local_rank=\"0\"} NaN\n",
        "cddp_worker_samples_per_second{local_rank=\"0\"} 612.5\n",
        "cddp_worker_last_progress_timestamp_seconds{local_rank=\"0\"} 1020\n",
        "cddp_worker_progress_malformed_lines_total{local_rank=\"1\"} 1\n",
        "cddp_worker_progress_lines_total{local_rank=\"1\"} 0\n",
        /* full precision: benchmarks compare it with the worker's own clock */
        "cddp_worker_last_exit_timestamp_seconds{local_rank=\"1\"} 1010.123456\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strstr(m, want[i]) == NULL)
            fail_msg("missing from /metrics: %s\n%s", want[i], m);
    /* Worker 1 reported nothing valid: no step sample for it. */
    assert_null(strstr(m, "cddp_worker_progress_step{local_rank=\"1\"}"));
    assert_null(strstr(m, "cddp_worker_last_exit_timestamp_seconds{local_rank=\"0\"}"));
    status_snapshot_unref(s);
}

static void test_rdzv(void **state)
{
    (void)state;
    struct status_rdzv_node_view members[2] = {
        {"10.0.0.2:40000", 0, 4, 1000, 1005, "active", 29501, "10.0.0.2", 0, 0, 0, false, 0, 0},
        {"10.0.0.3:40000", 1, 4, 1001, 1005, NULL, 0, NULL, 0, 0, 0, false, 0, 0},
    };
    struct status_rdzv_node_view waiting[1] = {
        {"10.0.0.4:40000", -1, 4, 1004, 1005, "waiting", 0, NULL, 0, 0, 0, false, 0, 0}};
    struct status_rdzv_run_view runs[2] = {
        {"job7", "running", 2,     1, 4,   1002, 2, members, 1,  waiting, 0,
         false,  0,         false, 0, {0}, 0,    0, 0,       -1, -1},
        {"job8", "joining", 0,     2, 2,   0, 0, NULL, 0,  NULL, 0,
         false,  0,         false, 0, {0}, 0, 0, 0,    -1, -1},
    };
    struct status_rdzv_view v = {0};
    v.program = "cddp-rdzv";
    v.version = "0.1.0";
    v.pid = 7;
    v.hostname = "head";
    v.endpoint = "0.0.0.0:29400";
    v.started_at = 900;
    v.accepting = true;
    v.connections = 3;
    v.connections_total = 9;
    v.refused[STATUS_REFUSED_TOKEN] = 2;
    v.joins_total = 5;
    v.rounds_total = 2;
    v.nruns = 2;
    v.runs = runs;
    /* job7's job-wide goodput (cddp-rdzv's sums of its nodes'); job8 has none. */
    runs[0].has_goodput = true;
    runs[0].goodput_nodes = 2;
    runs[0].goodput_s[STATUS_GOODPUT_INIT] = 4;
    runs[0].goodput_s[STATUS_GOODPUT_PRODUCTIVE] = 30;
    runs[0].goodput_s[STATUS_GOODPUT_RESTART] = 6;
    runs[0].goodput_total_s = 40;
    runs[0].goodput_ratio = 0.75;
    runs[0].goodput_lost_steps = 3;
    runs[0].max_step = 120;
    runs[0].min_step = 118;
    struct status_snapshot *s;
    assert_int_equal(status_rdzv_render(&v, 1010, &s), 0);
    assert_true(status_snapshot_ready(s));
    assert_string_equal(status_snapshot_check(s, 0)->name, "listener");
    cJSON *root = status_json(s);
    assert_string_equal(str(root, "kind"), "rdzv");
    assert_true(num(root, "connections") == 3);
    assert_true(num(root, "refused_connections.token") == 2);
    assert_true(num(root, "uptime_s") == 110);
    const cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "runs"), 0);
    assert_string_equal(str(r0, "run_id"), "job7");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r0, "members")), 2);
    const cJSON *wl = cJSON_GetObjectItem(r0, "waiting");
    assert_int_equal(cJSON_GetArraySize(wl), 1);
    assert_true(is_null(cJSON_GetArrayItem(wl, 0), "node_rank"));
    assert_string_equal(str(cJSON_GetArrayItem(wl, 0), "state"), "waiting");
    const cJSON *ms = cJSON_GetObjectItem(r0, "members");
    assert_string_equal(str(cJSON_GetArrayItem(ms, 0), "state"), "active");
    /* no state given: no key */
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(ms, 1), "state"));
    /* the agent's status port when it told one, else null */
    assert_true(num(cJSON_GetArrayItem(ms, 0), "status_port") == 29501);
    assert_true(is_null(cJSON_GetArrayItem(ms, 1), "status_port"));
    assert_string_equal(str(cJSON_GetArrayItem(ms, 0), "addr"), "10.0.0.2");
    assert_true(is_null(cJSON_GetArrayItem(ms, 1), "addr"));
    assert_true(num(r0, "goodput.nodes") == 2 && num(r0, "goodput.ratio") == 0.75);
    assert_true(num(r0, "goodput.seconds.productive") == 30);
    assert_true(num(r0, "goodput.seconds.restart") == 6 && num(r0, "goodput.total_s") == 40);
    assert_true(num(r0, "goodput.lost_steps") == 3 && num(r0, "goodput.max_step") == 120);
    assert_true(num(r0, "goodput.min_step") == 118);
    assert_true(is_null(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "runs"), 1), "goodput"));
    cJSON_Delete(root);
    size_t len;
    const char *m = status_snapshot_metrics(s, &len);
    static const char *const want[] = {
        "cddp_rdzv_runs 2\n",
        "cddp_rdzv_members{run_id=\"job7\"} 2\n",
        "cddp_rdzv_members{run_id=\"job8\"} 0\n",
        "cddp_rdzv_waiting_nodes{run_id=\"job7\"} 1\n",
        "cddp_rdzv_round{run_id=\"job7\"} 2\n",
        "cddp_rdzv_joins_total 5\n",
        "cddp_rdzv_rounds_total 2\n",
        "cddp_rdzv_connections 3\n",
        "cddp_rdzv_refused_connections_total{reason=\"token\"} 2\n",
        "cddp_time_seconds_total{run_id=\"job7\",phase=\"productive\"} 30\n",
        "cddp_time_seconds_total{run_id=\"job7\",phase=\"restart\"} 6\n",
        "cddp_goodput_ratio{run_id=\"job7\"} 0.75\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strstr(m, want[i]) == NULL)
            fail_msg("missing from /metrics: %s\n%s", want[i], m);
    assert_null(strstr(m, "cddp_goodput_ratio{run_id=\"job8\"}"));
    status_snapshot_unref(s);

    v.accepting = false;
    assert_int_equal(status_rdzv_render(&v, 1010, &s), 0);
    assert_false(status_snapshot_ready(s));
    status_snapshot_unref(s);
}

/* Straggler detection: each worker's step times and mark, the list of
 * stragglers with what they were judged against, the metric families;
 * the progress line's raw times and whose they are. */
static void test_agent_stragglers(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    struct progress_parser p;
    progress_init(&p);
    const char *line = "{\"step\":7,\"step_time_s\":0.5,\"compute_s\":0.4,\"wait_s\":0.1,"
                       "\"auto\":true}\n";
    progress_feed(&p, line, strlen(line), 5000, 1020.0);
    workers[1].progress = p.report;
    v.straggler_factor = 1.5;
    v.step_median_s = 0.1;
    v.step_compute = true;
    workers[0].step_time_s = 0.2;
    workers[0].compute_s = 0.1;
    workers[1].step_time_s = 0.5;
    workers[1].compute_s = 0.4;
    workers[1].straggler = true;
    workers[1].straggler_since = 1025.5;
    workers[1].straggler_ratio = 4;
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    cJSON *root = status_json(s);
    assert_true(num(root, "straggler_detection.factor") == 1.5);
    assert_true(num(root, "straggler_detection.min_steps") == 20);
    assert_true(num(root, "straggler_detection.median_s") == 0.1);
    assert_string_equal(str(cJSON_GetObjectItem(root, "straggler_detection"), "basis"), "compute");
    const cJSON *list = cJSON_GetObjectItem(root, "stragglers");
    assert_int_equal(cJSON_GetArraySize(list), 1);
    const cJSON *e = cJSON_GetArrayItem(list, 0);
    assert_true(num(e, "rank") == 3 && num(e, "local_rank") == 1);
    assert_string_equal(str(e, "node"), "node1");
    assert_true(num(e, "time_s") == 0.4 && num(e, "median_s") == 0.1);
    assert_true(num(e, "factor") == 4 && num(e, "since") == 1025.5);
    const cJSON *ws = cJSON_GetObjectItem(root, "workers");
    const cJSON *w0 = cJSON_GetArrayItem(ws, 0), *w1 = cJSON_GetArrayItem(ws, 1);
    assert_true(num(w0, "step_time_s") == 0.2 && num(w0, "compute_s") == 0.1);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(w0, "straggler")));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(w1, "straggler")));
    assert_string_equal(str(cJSON_GetObjectItem(w0, "progress"), "source"), "worker");
    assert_string_equal(str(cJSON_GetObjectItem(w1, "progress"), "source"), "auto");
    assert_true(num(w1, "progress.step_time_s") == 0.5 && num(w1, "progress.wait_s") == 0.1);
    assert_true(is_null(cJSON_GetObjectItem(w0, "progress"), "step_time_s"));
    cJSON_Delete(root);
    size_t len;
    const char *m = status_snapshot_metrics(s, &len);
    static const char *const want[] = {
        "cddp_worker_step_seconds{local_rank=\"1\"} 0.5\n",
        "cddp_worker_compute_seconds{local_rank=\"0\"} 0.1\n",
        "cddp_worker_straggler{local_rank=\"0\"} 0\n",
        "cddp_worker_straggler{local_rank=\"1\"} 1\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strstr(m, want[i]) == NULL)
            fail_msg("missing from /metrics: %s\n%s", want[i], m);
    status_snapshot_unref(s);

    /* Off: no detection object, no stragglers, no means. */
    fill_agent(&v);
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    root = status_json(s);
    assert_true(is_null(root, "straggler_detection"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(root, "stragglers")), 0);
    assert_true(
        is_null(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "workers"), 0), "step_time_s"));
    cJSON_Delete(root);
    m = status_snapshot_metrics(s, &len);
    assert_null(strstr(m, "cddp_worker_step_seconds{"));
    status_snapshot_unref(s);
}

/* The server names slow nodes of a run: the list, each member's times. */
static void test_rdzv_stragglers(void **state)
{
    (void)state;
    struct status_rdzv_node_view members[2] = {
        {"a_1_0", 0, 4, 1000, 1005, "active", 0, NULL, 0.1, 0.08, 1, false, 0, 0.9},
        {"b_2_0", 1, 4, 1001, 1005, "active", 0, NULL, 0.5, 0.45, 6, true, 1003.5, 5},
    };
    struct status_rdzv_run_view runs[1] = {{"job7",  "running", 2,    1,    4,    1002, 2,
                                            members, 0,         NULL, 0.09, true, 1.5,  false,
                                            0,       {0},       0,    0,    0,    -1,   -1}};
    struct status_rdzv_view v = {0};
    v.program = "cddp-rdzv";
    v.version = "0.1.0";
    v.hostname = "head";
    v.endpoint = "0.0.0.0:29400";
    v.accepting = true;
    v.nruns = 1;
    v.runs = runs;
    struct status_snapshot *s;
    assert_int_equal(status_rdzv_render(&v, 1010, &s), 0);
    cJSON *root = status_json(s);
    const cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "runs"), 0);
    assert_true(num(r0, "step_median_s") == 0.09);
    assert_string_equal(str(r0, "step_basis"), "compute");
    const cJSON *list = cJSON_GetObjectItem(r0, "stragglers");
    assert_int_equal(cJSON_GetArraySize(list), 1);
    const cJSON *e = cJSON_GetArrayItem(list, 0);
    assert_string_equal(str(e, "node"), "b_2_0");
    assert_true(num(e, "rank") == 6 && num(e, "node_rank") == 1);
    assert_true(num(e, "time_s") == 0.45 && num(e, "median_s") == 0.09);
    assert_true(num(e, "factor") == 5 && num(e, "since") == 1003.5);
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(r0, "members"), 0);
    assert_true(num(m0, "step_time_s") == 0.1 && num(m0, "compute_s") == 0.08);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(m0, "straggler")));
    cJSON_Delete(root);
    size_t len;
    const char *m = status_snapshot_metrics(s, &len);
    assert_non_null(strstr(m, "cddp_rdzv_step_seconds{run_id=\"job7\"} 0.09\n"));
    assert_non_null(strstr(m, "cddp_rdzv_stragglers{run_id=\"job7\"} 1\n"));
    status_snapshot_unref(s);
}

/* The agent's TCPStore (--agent_store): an object on /status and four
 * families on /metrics; null and absent when the agent serves none. */
static void test_agent_store(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    cJSON *root = status_json(s);
    assert_true(is_null(root, "agent_store"));
    cJSON_Delete(root);
    size_t len;
    assert_null(strstr(status_snapshot_metrics(s, &len), "cddp_agent_store_"));
    status_snapshot_unref(s);

    struct status_store_view st = {.port = 29500,
                                   .round = 2,
                                   .keys = 7,
                                   .bytes = 321,
                                   .connections = 4,
                                   .waiting = 1,
                                   .accepted = 9,
                                   .queries = 55,
                                   .refused = 1};
    v.agent_store = &st;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    root = status_json(s);
    const cJSON *a = cJSON_GetObjectItem(root, "agent_store");
    assert_non_null(a);
    assert_true(num(a, "port") == 29500 && num(a, "round") == 2 && num(a, "keys") == 7);
    assert_true(num(a, "bytes") == 321 && num(a, "connections") == 4 && num(a, "waiting") == 1);
    assert_true(num(a, "accepted_total") == 9 && num(a, "queries_total") == 55 &&
                num(a, "refused_total") == 1);
    cJSON_Delete(root);
    const char *m = status_snapshot_metrics(s, &len);
    static const char *const want[] = {
        "cddp_agent_store_keys 7\n",
        "cddp_agent_store_bytes 321\n",
        "cddp_agent_store_connections 4\n",
        "# TYPE cddp_agent_store_queries_total counter\ncddp_agent_store_queries_total 55\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strstr(m, want[i]) == NULL)
            fail_msg("missing from /metrics: %s\n%s", want[i], m);
    status_snapshot_unref(s);
}

/* Goodput and the exit code: absent or null until known, then every phase
 * by name on /status and on /metrics. */
static void test_agent_goodput_and_exit(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    cJSON *root = status_json(s);
    assert_true(is_null(root, "goodput") && is_null(root, "exit_code") &&
                is_null(root, "exit_reason"));
    cJSON_Delete(root);
    size_t len;
    assert_null(strstr(status_snapshot_metrics(s, &len), "cddp_goodput_ratio"));
    status_snapshot_unref(s);

    v.exit_code = 3;
    v.exit_reason = "hung";
    v.state = STATUS_AGENT_FAILED;
    v.goodput = (struct status_goodput_view){
        .known = true,
        .s = {1.5, 20, 2.5, 1, 0.5, 0.5},
        .wall_s = 26,
        .ratio = 20.0 / 26,
        .lost_steps = 7,
        .phase = STATUS_GOODPUT_STOPPED,
    };
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    root = status_json(s);
    assert_true(num(root, "exit_code") == 3);
    assert_string_equal(cJSON_GetObjectItem(root, "exit_reason")->valuestring, "hung");
    const cJSON *g = cJSON_GetObjectItem(root, "goodput");
    assert_non_null(g);
    assert_true(num(g, "wall_s") == 26 && num(g, "lost_steps") == 7);
    assert_true(fabs(num(g, "ratio") - 20.0 / 26) < 1e-9);
    assert_string_equal(cJSON_GetObjectItem(g, "phase")->valuestring, "stopped");
    const cJSON *sec = cJSON_GetObjectItem(g, "seconds");
    assert_true(num(sec, "init") == 1.5 && num(sec, "productive") == 20 && num(sec, "lost") == 2.5);
    assert_true(num(sec, "restart") == 1 && num(sec, "rendezvous") == 0.5 &&
                num(sec, "stopped") == 0.5);
    cJSON_Delete(root);
    const char *m = status_snapshot_metrics(s, &len);
    static const char *const want[] = {
        "# TYPE cddp_time_seconds_total counter\n",
        "cddp_time_seconds_total{phase=\"productive\"} 20\n",
        "cddp_time_seconds_total{phase=\"lost\"} 2.5\n",
        "cddp_time_seconds_total{phase=\"rendezvous\"} 0.5\n",
        "# TYPE cddp_goodput_ratio gauge\n",
        "cddp_lost_steps_total 7\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strstr(m, want[i]) == NULL)
            fail_msg("missing from /metrics: %s\n%s", want[i], m);
    status_snapshot_unref(s);
    for (int p = 0; p < STATUS_GOODPUT_PHASE_COUNT; p++)
        assert_string_not_equal(status_goodput_phase_name((enum status_goodput_phase)p), "unknown");
}

/* An agent reconnecting to its rendezvous server, and one hosting it. */
static void test_agent_rdzv(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    v.rdzv_connected = false;
    v.rdzv_disconnected_at = 1025.5;
    v.rdzv_reconnects = 2;
    v.waiting_nodes = 3;
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    assert_true(status_snapshot_ready(s)); /* the workers run on meanwhile */
    cJSON *root = status_json(s);
    const cJSON *r = cJSON_GetObjectItem(root, "rdzv");
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(r, "connected")));
    assert_true(num(r, "disconnected_at") == 1025.5);
    assert_true(num(r, "reconnects") == 2);
    assert_true(num(root, "waiting_nodes") == 3);
    assert_true(is_null(root, "rdzv_server"));
    cJSON_Delete(root);
    size_t len;
    const char *m = status_snapshot_metrics(s, &len);
    assert_non_null(strstr(m, "cddp_agent_rdzv_connected 0\n"));
    assert_non_null(strstr(m, "cddp_agent_rdzv_reconnects_total 2\n"));
    assert_non_null(strstr(m, "cddp_agent_rdzv_waiting_nodes 3\n"));
    assert_null(strstr(m, "cddp_rdzv_")); /* hosts nothing */
    status_snapshot_unref(s);

    struct status_rdzv_node_view members[1] = {
        {"a_1_0", 0, 2, 1000, 1005, "active", 0, NULL, 0, 0, 0, false, 0, 0}};
    struct status_rdzv_node_view waiting[1] = {
        {"b_2_0", -1, 2, 1004, 1005, "waiting", 0, NULL, 0, 0, 0, false, 0, 0}};
    struct status_rdzv_run_view runs[1] = {{"job\"7", "running", 3,       1, 1,     1002, 1,
                                            members,  1,         waiting, 0, false, 0,    false,
                                            0,        {0},       0,       0, 0,     -1,   -1}};
    struct status_rdzv_view srv = {.program = "cddprun",
                                   .endpoint = "[::]:29400",
                                   .accepting = true,
                                   .connections = 2,
                                   .joins_total = 4,
                                   .rounds_total = 3,
                                   .nruns = 1,
                                   .runs = runs};
    fill_agent(&v);
    v.rdzv_connected = true;
    v.rdzv_server = &srv;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    assert_int_equal(status_snapshot_check_count(s), 2); /* no check of its own */
    root = status_json(s);
    r = cJSON_GetObjectItem(root, "rdzv");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r, "connected")));
    assert_true(is_null(r, "disconnected_at"));
    const cJSON *h = cJSON_GetObjectItem(root, "rdzv_server");
    assert_true(cJSON_IsObject(h));
    assert_string_equal(str(h, "endpoint"), "[::]:29400");
    assert_true(num(h, "connections") == 2);
    assert_true(num(h, "rounds_total") == 3);
    assert_null(cJSON_GetObjectItem(h, "kind")); /* the agent's header is the one */
    const cJSON *r0 = cJSON_GetArrayItem(cJSON_GetObjectItem(h, "runs"), 0);
    assert_string_equal(str(r0, "run_id"), "job\"7");
    assert_true(num(r0, "round") == 3);
    assert_string_equal(str(cJSON_GetArrayItem(cJSON_GetObjectItem(r0, "members"), 0), "node"),
                        "a_1_0");
    assert_string_equal(str(cJSON_GetArrayItem(cJSON_GetObjectItem(r0, "waiting"), 0), "node"),
                        "b_2_0");
    cJSON_Delete(root);
    m = status_snapshot_metrics(s, &len);
    assert_non_null(strstr(m, "cddp_rdzv_members{run_id=\"job\\\"7\"} 1\n"));
    assert_non_null(strstr(m, "cddp_rdzv_waiting_nodes{run_id=\"job\\\"7\"} 1\n"));
    assert_non_null(strstr(m, "cddp_rdzv_connections 2\n"));
    assert_non_null(strstr(m, "cddp_agent_rdzv_connected 1\n"));
    /* One cddp_build_info: the agent's (the server's families come without it). */
    const char *bi = strstr(m, "# TYPE cddp_build_info");
    assert_non_null(bi);
    assert_null(strstr(bi + 1, "# TYPE cddp_build_info"));
    status_snapshot_unref(s);
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(status_agent_state_name(STATUS_AGENT_SUCCEEDED), "succeeded");
    assert_string_equal(status_agent_state_name(STATUS_AGENT_EXIT_BARRIER), "exit_barrier");
    assert_string_equal(status_agent_state_name(STATUS_AGENT_TERMINATED), "terminated");
    assert_string_equal(status_agent_state_name(STATUS_AGENT_STATE_COUNT), "unknown");
    assert_string_equal(status_worker_state_name(STATUS_WORKER_STOPPED), "stopped");
    assert_string_equal(status_exit_reason_name(STATUS_EXIT_WATCHDOG), "watchdog");
    assert_string_equal(status_restart_reason_name(STATUS_RESTART_MEMBERSHIP_CHANGE),
                        "membership_change");
    assert_string_equal(status_refusal_name(STATUS_REFUSED_PROTOCOL), "protocol");
}

/* --restart_scope: shown only when the agent says its scope; restarts by
 * scope, the generation, the last recovery in both formats. */
static void test_agent_restart_scope(void **state)
{
    (void)state;
    struct status_agent_view v;
    fill_agent(&v);
    struct status_snapshot *s;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    size_t len;
    assert_null(strstr(status_snapshot_status(s, &len), "by_scope"));
    assert_null(strstr(status_snapshot_metrics(s, &len), "cddp_agent_generation"));
    status_snapshot_unref(s);
    v.restart_scope = "worker";
    v.restarts_worker = 2;
    v.restarts_group = 1;
    v.scope_fallbacks = 1;
    v.node_replacements = 3;
    v.generation = 2;
    v.last_recovery_s = 0.25;
    v.spares = 1;
    assert_int_equal(status_agent_render(&v, 1030.5, 5400, &s), 0);
    const char *j = status_snapshot_status(s, &len);
    static const char *const wj[] = {
        "\"scope\":\"worker\"",    "\"by_scope\":{\"worker\":2,\"group\":1}",
        "\"scope_fallbacks\":1",   "\"node_replacements\":3",
        "\"generation\":2",        "\"spares\":1",
        "\"last_recovery_s\":0.25"};
    for (size_t i = 0; i < sizeof(wj) / sizeof(wj[0]); i++)
        if (strstr(j, wj[i]) == NULL)
            fail_msg("missing from /status: %s\n%s", wj[i], j);
    const char *m = status_snapshot_metrics(s, &len);
    static const char *const wm[] = {
        "cddp_agent_restarts_by_scope_total{scope=\"worker\"} 2\n",
        "cddp_agent_restarts_by_scope_total{scope=\"group\"} 1\n", "cddp_agent_generation 2\n",
        "cddp_agent_last_recovery_seconds 0.25\n", "cddp_agent_spares 1\n"};
    for (size_t i = 0; i < sizeof(wm) / sizeof(wm[0]); i++)
        if (strstr(m, wm[i]) == NULL)
            fail_msg("missing from /metrics: %s\n%s", wm[i], m);
    status_snapshot_unref(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agent_json),
        cmocka_unit_test(test_agent_not_ready),
        cmocka_unit_test(test_agent_metrics),
        cmocka_unit_test(test_agent_restart_scope),
        cmocka_unit_test(test_rdzv),
        cmocka_unit_test(test_agent_rdzv),
        cmocka_unit_test(test_agent_store),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_agent_stragglers),
        cmocka_unit_test(test_rdzv_stragglers),
        cmocka_unit_test(test_agent_goodput_and_exit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
