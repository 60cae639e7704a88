/* test_rdzv_jobstats.c: rendezvous/jobstats.c, cddp-rdzv's job-wide
 * goodput sums and history. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "common/strutil.h"
#include "rendezvous/jobstats.h"

static struct proto_goodput gp(double init, double productive, double restart, int64_t lost,
                               int64_t step)
{
    struct proto_goodput g = {
        .s = {init, productive, 0, restart, 0, 0}, .lost_steps = lost, .step = step};
    return g;
}

/* Sums are over the latest totals of every node, those that left too. */
static void test_sums(void **state)
{
    (void)state;
    struct jobstats js;
    jobstats_init(&js);
    assert_null(jobstats_find(&js, "job"));
    struct proto_goodput a = gp(1, 10, 2, 0, 100), b = gp(1, 6, 0, 3, 90);
    assert_int_equal(jobstats_heartbeat(&js, "job", "a", &a, NULL, 1000), 0);
    assert_int_equal(jobstats_heartbeat(&js, "job", "b", &b, NULL, 1000), 0);
    a = gp(1, 20, 2, 0, 200); /* a's newer totals replace its older ones */
    assert_int_equal(jobstats_heartbeat(&js, "job", "a", &a, NULL, 1001), 0);
    /* A heartbeat without goodput (an older agent) changes no sum. */
    assert_int_equal(jobstats_heartbeat(&js, "job", "c", NULL, NULL, 1001), 0);
    const struct jobstats_run *r = jobstats_find(&js, "job");
    assert_non_null(r);
    struct jobstats_sum s;
    jobstats_sum(r, 1001, &s);
    assert_int_equal(s.nodes, 2);
    assert_true(s.s[1] == 26 && s.s[0] == 2 && s.s[3] == 2);
    assert_true(s.total_s == 30);
    assert_true(fabs(s.ratio - 26.0 / 30) < 1e-12);
    assert_int_equal(s.lost_steps, 3);
    assert_int_equal(s.max_step, 200);
    assert_int_equal(s.min_step, 90);
    /* Later, b is not heard from: its totals still count, its step not. */
    jobstats_sum(r, 1000 + JOBSTATS_FRESH_S + 0.5, &s);
    assert_int_equal(s.nodes, 2);
    assert_true(s.s[1] == 26);
    assert_int_equal(s.max_step, 200);
    assert_int_equal(s.min_step, 200);
    jobstats_sum(r, 5000, &s);
    assert_int_equal(s.max_step, -1);
    jobstats_free(&js);
}

/* Past JOBSTATS_MAX_NODES, the oldest node is folded in: sums stay whole. */
static void test_node_bound(void **state)
{
    (void)state;
    struct jobstats js;
    jobstats_init(&js);
    int n = JOBSTATS_MAX_NODES + 10;
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof(id), "node%d", i);
        struct proto_goodput g = gp(0, 1, 0, 1, i);
        assert_int_equal(jobstats_heartbeat(&js, "job", id, &g, NULL, 100 + i), 0);
    }
    const struct jobstats_run *r = jobstats_find(&js, "job");
    assert_int_equal(r->nnodes, JOBSTATS_MAX_NODES);
    assert_int_equal(r->folded, 10);
    struct jobstats_sum s;
    jobstats_sum(r, 100 + n, &s);
    assert_int_equal(s.nodes, n);
    assert_true(s.s[1] == n);
    assert_int_equal(s.lost_steps, n);
    jobstats_free(&js);
}

/* At most JOBSTATS_MAX_RUNS runs: the one heard from longest ago goes. */
static void test_run_bound(void **state)
{
    (void)state;
    struct jobstats js;
    jobstats_init(&js);
    for (int i = 0; i < JOBSTATS_MAX_RUNS + 2; i++) {
        char id[32];
        snprintf(id, sizeof(id), "run%d", i);
        assert_int_equal(jobstats_heartbeat(&js, id, "a", NULL, NULL, 10 + i), 0);
    }
    assert_int_equal(js.nruns, JOBSTATS_MAX_RUNS);
    assert_int_equal(js.runs_dropped, 2);
    assert_null(jobstats_find(&js, "run0"));
    assert_null(jobstats_find(&js, "run1"));
    assert_non_null(jobstats_find(&js, "run2"));
    jobstats_free(&js);
}

static cJSON *render(const struct jobstats_run *r, uint64_t since)
{
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    assert_int_equal(status_history_render(&r->hist, since, 2000, r->first_seen, &b), 0);
    cJSON *j = cJSON_ParseWithLength(b.data, b.len);
    cddp_buf_free(&b);
    assert_non_null(j);
    return j;
}

/* Points: max and min step, at most one a second; events once each. */
static void test_history(void **state)
{
    (void)state;
    struct jobstats js;
    jobstats_init(&js);
    struct proto_perf pa = {.ranks = 1, .step_s = 0.5, .compute_s = -1, .factor = 2};
    struct proto_perf pb = {.ranks = 1, .step_s = 0.25, .compute_s = -1, .factor = 2};
    for (int k = 0; k < 4; k++) {
        struct proto_goodput a = gp(0, k, 0, 0, 10 * k + 10), b = gp(0, k, 0, 0, 10 * k);
        jobstats_heartbeat(&js, "job", "a", &a, &pa, 1000 + k);
        jobstats_heartbeat(&js, "job", "b", &b, &pb, 1000.5 + k); /* < 1 s: no point */
    }
    assert_int_equal(jobstats_round(&js, "job", 1, 2, 4, 1004), 0);
    jobstats_round(&js, "job", 1, 2, 4, 1004); /* told to the other member: once */
    jobstats_restart(&js, "job", 2, "node_lost", "b", false, 1005);
    jobstats_restart(&js, "job", 2, "node_lost", "b", false, 1005);
    jobstats_restart(&js, "job", 3, "worker_failure", "a", true, 1006);
    jobstats_straggler(&js, "job", "a", true, 2.5, 1007);
    /* a's last steps, in a beat too soon after the last point for one */
    struct proto_goodput fin = gp(0, 4, 0, 0, 50);
    jobstats_heartbeat(&js, "job", "a", &fin, &pa, 1003.6);
    /* the end makes a last point all the same */
    jobstats_end(&js, "job", "done", 1008);
    jobstats_end(&js, "job", "done", 1008);
    const struct jobstats_run *r = jobstats_find(&js, "job");
    cJSON *j = render(r, 0);
    cJSON *series = cJSON_GetObjectItem(j, "series");
    assert_int_equal(cJSON_GetArraySize(series), 2);
    cJSON *maxp = cJSON_GetObjectItem(cJSON_GetArrayItem(series, 0), "points");
    cJSON *minp = cJSON_GetObjectItem(cJSON_GetArrayItem(series, 1), "points");
    assert_int_equal(cJSON_GetArraySize(maxp), 5);
    /* [seq, t, step, loss, samples_per_s, step_time_s, attempt] */
    cJSON *last = cJSON_GetArrayItem(maxp, 3);
    assert_int_equal(cJSON_GetArrayItem(last, 2)->valueint, 40);
    assert_true(cJSON_GetArrayItem(cJSON_GetArrayItem(minp, 3), 2)->valueint == 20);
    /* the end's point: a's last step, though its beat made no point */
    cJSON *end = cJSON_GetArrayItem(maxp, 4);
    assert_true(cJSON_GetArrayItem(end, 1)->valuedouble >
                cJSON_GetArrayItem(last, 1)->valuedouble + 4.5);
    assert_int_equal(cJSON_GetArrayItem(end, 2)->valueint, 50);
    /* The median of the two nodes' step times (the lower one). */
    assert_true(cJSON_GetArrayItem(last, 5)->valuedouble == 0.25);
    cJSON *ev = cJSON_GetObjectItem(j, "events");
    const char *kinds[] = {"round", "restart", "node_lost", "restart", "straggler", "end"};
    assert_int_equal(cJSON_GetArraySize(ev), 6);
    for (int i = 0; i < 6; i++)
        assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, i), "kind")->valuestring,
                            kinds[i]);
    cJSON *e0 = cJSON_GetArrayItem(ev, 0);
    assert_int_equal(cJSON_GetObjectItem(e0, "value")->valueint, 1);
    assert_string_equal(cJSON_GetObjectItem(e0, "reason")->valuestring, "2 nodes, world size 4");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 2), "reason")->valuestring, "b");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 3), "reason")->valuestring,
                        "worker_failure (counted)");
    uint64_t seq = (uint64_t)cJSON_GetObjectItem(j, "seq")->valuedouble;
    cJSON_Delete(j);
    /* since: only what is newer. */
    j = render(r, seq);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "events")), 0);
    cJSON_Delete(j);
    /* The id used again by a new job after the end: it starts over. */
    assert_int_equal(jobstats_round(&js, "job", 1, 1, 1, 1100), 0);
    r = jobstats_find(&js, "job");
    struct jobstats_sum s;
    jobstats_sum(r, 1100, &s);
    assert_int_equal(s.nodes, 0);
    assert_false(r->ended);
    j = render(r, 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "events")), 1);
    cJSON_Delete(j);
    jobstats_free(&js);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sums),
        cmocka_unit_test(test_node_bound),
        cmocka_unit_test(test_run_bound),
        cmocka_unit_test(test_history),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
