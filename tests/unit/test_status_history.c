/* Unit tests for status/history.c: the bounded per-rank series (decimation
 * that keeps the whole run evenly, the newest sample always shown), the
 * event ring, sequence numbers and `since`, the copy, and the JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/errors.h"
#include "status/history.h"

static struct status_history_point pt(int64_t step)
{
    return (struct status_history_point){.t = 1000.0 + (double)step,
                                         .step = step,
                                         .loss = 2.0 / (double)(step + 1),
                                         .samples_per_s = 100.0,
                                         .step_time_s = NAN,
                                         .attempt = 0};
}

static cJSON *render(const struct status_history *h, uint64_t since)
{
    struct cddp_buf b;
    cddp_buf_init(&b, (size_t)64 << 20);
    assert_int_equal(status_history_render(h, since, 2000.0, 999.0, &b), 0);
    cJSON *j = cJSON_Parse(b.data);
    assert_non_null(j);
    cddp_buf_free(&b);
    return j;
}

static void test_bounds_refused(void **state)
{
    (void)state;
    struct status_history h;
    assert_int_equal(status_history_init(&h, 1, 3, 8), CDDP_ERANGE_ARG); /* odd */
    assert_int_equal(status_history_init(&h, 1, 2, 8), CDDP_ERANGE_ARG); /* < MIN */
    assert_int_equal(status_history_init(&h, 1, 8, 0), CDDP_ERANGE_ARG); /* no events */
    assert_int_equal(status_history_init(&h, -1, 8, 8), CDDP_ERANGE_ARG);
    assert_int_equal(status_history_init(&h, 2, STATUS_HISTORY_POINTS_MAX * 2, 8), CDDP_ERANGE_ARG);
    assert_int_equal(status_history_init(&h, 2, 8, 8), 0);
    status_history_free(&h);
    status_history_free(&h); /* twice: a no-op */
}

/* Under the capacity every sample is kept, in order, numbered from 1. */
static void test_keeps_everything_until_full(void **state)
{
    (void)state;
    struct status_history h;
    assert_int_equal(status_history_init(&h, 2, 8, 4), 0);
    for (int64_t s = 0; s < 8; s++)
        status_history_add_point(&h, (int)(s % 2), 5, &(struct status_history_point){.step = s});
    assert_int_equal(h.series[0].n, 4);
    assert_int_equal(h.series[1].n, 4);
    assert_int_equal(h.series[0].pts[0].seq, 1);
    assert_int_equal(h.series[1].pts[3].seq, 8);
    assert_int_equal(h.series[1].pts[3].step, 7);
    assert_false(h.series[0].has_latest);
    assert_int_equal(status_history_max_step(&h), 7);
    /* Out of range: ignored, no number used. */
    status_history_add_point(&h, 2, 0, &(struct status_history_point){.step = 99});
    status_history_add_point(&h, -1, 0, &(struct status_history_point){.step = 99});
    assert_int_equal(h.seq, 8);
    status_history_free(&h);
}

/* A long run: the series stays within [cap/2, cap], covers the run from
 * its first step at an even stride, and the newest sample is shown. */
static void test_decimation_covers_the_run(void **state)
{
    (void)state;
    enum { CAP = 16 };
    struct status_history h;
    assert_int_equal(status_history_init(&h, 1, CAP, 4), 0);
    for (int64_t s = 0; s < 1000; s++) {
        struct status_history_point p = pt(s);
        status_history_add_point(&h, 0, 0, &p);
        const struct status_history_series *x = &h.series[0];
        assert_true(x->n <= CAP);
        if (s >= CAP)
            assert_true(x->n >= CAP / 2);
        /* Kept points are the samples at multiples of the stride. */
        for (size_t k = 0; k < x->n; k++)
            assert_int_equal(x->pts[k].step, (int64_t)k * (int64_t)x->stride);
        /* The newest is either kept last or shown as the latest. */
        if (x->has_latest)
            assert_int_equal(x->latest.step, s);
        else
            assert_int_equal(x->pts[x->n - 1].step, s);
    }
    const struct status_history_series *x = &h.series[0];
    assert_int_equal(x->offered, 1000);
    assert_int_equal(x->stride, 64); /* 1000 samples in at most 16 points */
    assert_int_equal(x->n, 16);      /* 0, 64, ..., 960 */
    assert_true(x->has_latest);
    assert_int_equal(x->latest.step, 999);
    assert_int_equal(status_history_max_step(&h), 999);
    /* The JSON: the kept points and the latest, with their columns. */
    cJSON *j = render(&h, 0);
    cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "series"), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(s0, "points")), 16);
    assert_int_equal(cJSON_GetObjectItem(s0, "samples")->valuedouble, 1000);
    assert_int_equal(cJSON_GetObjectItem(s0, "stride")->valuedouble, 64);
    cJSON *latest = cJSON_GetObjectItem(s0, "latest");
    assert_true(cJSON_IsArray(latest));
    assert_int_equal(cJSON_GetArrayItem(latest, 2)->valuedouble, 999);
    cJSON_Delete(j);
    status_history_free(&h);
}

static void test_events_ring(void **state)
{
    (void)state;
    struct status_history h;
    assert_int_equal(status_history_init(&h, 1, 8, 3), 0);
    for (int i = 0; i < 5; i++) {
        struct status_history_event e = {.t = 10.0 + i,
                                         .kind = STATUS_HISTORY_ROUND,
                                         .local_rank = -1,
                                         .step = i,
                                         .value = i + 1};
        snprintf(e.reason, sizeof(e.reason), "round %d", i + 1);
        status_history_add_event(&h, &e);
    }
    assert_int_equal(h.ev_n, 3);
    assert_int_equal(h.events_dropped, 2);
    cJSON *j = render(&h, 0);
    cJSON *ev = cJSON_GetObjectItem(j, "events");
    assert_int_equal(cJSON_GetArraySize(ev), 3);
    /* The oldest went: rounds 3, 4, 5 are left, in order. */
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 0), "reason")->valuestring,
                        "round 3");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 2), "reason")->valuestring,
                        "round 5");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 2), "kind")->valuestring,
                        "round");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 2), "local_rank")));
    assert_int_equal(cJSON_GetObjectItem(j, "events_dropped")->valuedouble, 2);
    cJSON_Delete(j);
    status_history_free(&h);
}

/* A reader that asks for news since the last seq it saw gets only those,
 * from the render and from a copy made for it. */
static void test_since(void **state)
{
    (void)state;
    struct status_history h;
    assert_int_equal(status_history_init(&h, 2, 8, 8), 0);
    for (int64_t s = 0; s < 3; s++) {
        struct status_history_point p = pt(s);
        status_history_add_point(&h, 0, 0, &p);
        status_history_add_point(&h, 1, 1, &p);
    }
    uint64_t seen = h.seq;
    assert_int_equal(seen, 6);
    struct status_history_point p = pt(3);
    p.attempt = 1;
    status_history_add_point(&h, 1, 1, &p);
    struct status_history_event e = {
        .t = 1003.5, .kind = STATUS_HISTORY_RESTART, .local_rank = -1, .step = 2};
    cddp_strlcpy(e.reason, "local_rank 1 (rank 1) exited with code 1", sizeof(e.reason));
    status_history_add_event(&h, &e);

    struct status_history copy;
    assert_int_equal(status_history_clone(&copy, &h, seen), 0);
    assert_int_equal(copy.series[0].n, 0);
    assert_int_equal(copy.series[1].n, 1);
    cJSON *j = render(&copy, seen);
    assert_int_equal(cJSON_GetObjectItem(j, "seq")->valuedouble, 8);
    cJSON *series = cJSON_GetObjectItem(j, "series");
    assert_int_equal(cJSON_GetArraySize(series), 2);
    assert_int_equal(
        cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(series, 0), "points")), 0);
    cJSON *pts = cJSON_GetObjectItem(cJSON_GetArrayItem(series, 1), "points");
    assert_int_equal(cJSON_GetArraySize(pts), 1);
    cJSON *row = cJSON_GetArrayItem(pts, 0);
    assert_int_equal(cJSON_GetArrayItem(row, 0)->valuedouble, 7); /* seq */
    assert_int_equal(cJSON_GetArrayItem(row, 2)->valuedouble, 3); /* step */
    assert_true(cJSON_IsNull(cJSON_GetArrayItem(row, 5)));        /* step time: not known */
    assert_int_equal(cJSON_GetArrayItem(row, 6)->valuedouble, 1); /* attempt */
    cJSON *ev = cJSON_GetObjectItem(j, "events");
    assert_int_equal(cJSON_GetArraySize(ev), 1);
    cJSON *e0 = cJSON_GetArrayItem(ev, 0);
    assert_string_equal(cJSON_GetObjectItem(e0, "kind")->valuestring, "restart");
    assert_int_equal(cJSON_GetObjectItem(e0, "step")->valuedouble, 2);
    cJSON_Delete(j);
    status_history_free(&copy);

    /* Everything (since 0): both series whole, the columns named. */
    assert_int_equal(status_history_clone(&copy, &h, 0), 0);
    j = render(&copy, 0);
    series = cJSON_GetObjectItem(j, "series");
    assert_int_equal(
        cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(series, 1), "points")), 4);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(series, 1), "rank")->valuedouble, 1);
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "columns"), 3)->valuestring,
                        "loss");
    assert_int_equal(cJSON_GetObjectItem(j, "capacity")->valuedouble, 8);
    cJSON_Delete(j);
    status_history_free(&copy);
    status_history_free(&h);
}

/* A reason at its limit is cut, NUL-terminated; a name for every kind. */
static void test_reason_and_names(void **state)
{
    (void)state;
    struct status_history h;
    assert_int_equal(status_history_init(&h, 0, 4, 1), 0);
    struct status_history_event e = {.kind = STATUS_HISTORY_STRAGGLER, .local_rank = 3};
    memset(e.reason, 'x', sizeof(e.reason));
    status_history_add_event(&h, &e);
    assert_int_equal(strlen(h.events[0].reason), STATUS_HISTORY_REASON_MAX - 1);
    assert_string_equal(status_history_event_name(STATUS_HISTORY_STRAGGLER_END), "straggler_end");
    assert_string_equal(status_history_event_name(STATUS_HISTORY_END), "end");
    assert_string_equal(status_history_event_name(STATUS_HISTORY_EVENT_KIND_COUNT), "unknown");
    cJSON *j = render(&h, 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "series")), 0);
    cJSON_Delete(j);
    status_history_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_refused),
        cmocka_unit_test(test_keeps_everything_until_full),
        cmocka_unit_test(test_decimation_covers_the_run),
        cmocka_unit_test(test_events_ring),
        cmocka_unit_test(test_since),
        cmocka_unit_test(test_reason_and_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
