/*
 * Unit tests for trainer/comm/watchdog_core.c with a fake clock: deadlines,
 * which collective is blamed, completion, asynchronous errors, sequence
 * numbers, the missing peers and the report text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/errors.h"
#include "trainer/comm/failure.h"
#include "trainer/comm/watchdog_core.h"

#define S(x) ((uint64_t)((x)*1e9))

static uint64_t enq(struct trn_wd_core *w, enum trn_comm_coll coll, int bucket, long step,
                    size_t bytes, uint64_t now)
{
    struct trn_wd_coll c = {.coll = coll, .bucket = bucket, .step = step, .bytes = bytes};
    uint64_t seq = 0;
    assert_int_equal(trn_wd_enqueued(w, &c, now, &seq), 0);
    return seq;
}

static void test_deadline(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 10.0, 0.0, 8), 0);
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(100), &d), TRN_WD_NONE);
    assert_false(d.have_blamed);
    assert_true(d.next_ns == UINT64_MAX);

    uint64_t s = enq(&w, TRN_COLL_ALLREDUCE, 2, 7, 4096, S(100));
    assert_int_equal(s, 1);
    assert_int_equal(trn_wd_check(&w, S(105), &d), TRN_WD_NONE);
    assert_true(d.have_blamed);
    assert_true(d.next_ns == S(110) + 1);
    /* Exactly at the bound is not past it; one nanosecond later is. */
    assert_int_equal(trn_wd_check(&w, S(110), &d), TRN_WD_NONE);
    assert_int_equal(trn_wd_check(&w, S(110) + 1, &d), TRN_WD_TIMEOUT);
    assert_int_equal(d.code, CDDP_ETIMEOUT);
    assert_int_equal(d.blamed.seq, 1);
    assert_int_equal(d.blamed.c.bucket, 2);
    assert_int_equal(d.blamed.c.step, 7);
    assert_true(d.waited_s > 9.99 && d.waited_s < 10.01);
    assert_true(d.timeout_s == 10.0);
    trn_wd_free(&w);
}

static void test_grace(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 10.0, 6.0, 4), 0);
    enq(&w, TRN_COLL_BARRIER, -1, -1, 0, S(1));
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(15), &d), TRN_WD_NONE);
    assert_true(d.next_ns == S(17) + 1);
    assert_int_equal(trn_wd_check(&w, S(17.5), &d), TRN_WD_TIMEOUT);
    /* The bound reported is the timeout, not the timeout plus grace. */
    assert_true(d.timeout_s == 10.0);
    trn_wd_free(&w);
}

static void test_blame_oldest(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 5.0, 0.0, 16), 0);
    uint64_t a = enq(&w, TRN_COLL_ALLREDUCE, 0, 3, 100, S(10));
    uint64_t b = enq(&w, TRN_COLL_ALLREDUCE, 1, 3, 200, S(11));
    uint64_t c = enq(&w, TRN_COLL_ALLREDUCE, 2, 3, 300, S(12));
    assert_int_equal(trn_wd_pending(&w), 3);
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(20), &d), TRN_WD_TIMEOUT);
    assert_int_equal(d.blamed.seq, a);
    /* Completing the oldest moves the blame (and the deadline) to the next. */
    assert_int_equal(trn_wd_completed(&w, a), 0);
    assert_int_equal(trn_wd_check(&w, S(15.5), &d), TRN_WD_NONE);
    assert_true(d.next_ns == S(16) + 1);
    assert_int_equal(trn_wd_check(&w, S(20), &d), TRN_WD_TIMEOUT);
    assert_int_equal(d.blamed.seq, b);
    assert_int_equal(d.blamed.c.bytes, 200);
    /* Out of order: c completes before b; b is still the one to blame. */
    assert_int_equal(trn_wd_completed(&w, c), 0);
    assert_int_equal(trn_wd_pending(&w), 1);
    assert_int_equal(trn_wd_oldest(&w), b);
    assert_int_equal(trn_wd_check(&w, S(20), &d), TRN_WD_TIMEOUT);
    assert_int_equal(d.blamed.seq, b);
    assert_int_equal(trn_wd_completed(&w, b), 0);
    assert_int_equal(trn_wd_check(&w, S(1000), &d), TRN_WD_NONE);
    assert_int_equal(trn_wd_oldest(&w), 0);
    assert_int_equal(trn_wd_pending(&w), 0);
    trn_wd_free(&w);
}

static void test_completion_clearing(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 5.0, 0.0, 4), 0);
    uint64_t a = enq(&w, TRN_COLL_BROADCAST, -1, -1, 8, S(1));
    assert_true(trn_wd_in_flight(&w, a));
    assert_int_equal(trn_wd_completed(&w, a), 0);
    assert_false(trn_wd_in_flight(&w, a));
    /* Twice, or a number never handed out: not found, nothing changes. */
    assert_int_equal(trn_wd_completed(&w, a), CDDP_ENOTFOUND);
    assert_int_equal(trn_wd_completed(&w, 99), CDDP_ENOTFOUND);
    assert_int_equal(trn_wd_completed(&w, 0), CDDP_ENOTFOUND);
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(100), &d), TRN_WD_NONE);
    trn_wd_free(&w);
}

static void test_full_table(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 5.0, 0.0, 3), 0);
    uint64_t a = enq(&w, TRN_COLL_ALLREDUCE, 0, 0, 1, S(1));
    enq(&w, TRN_COLL_ALLREDUCE, 1, 0, 1, S(1));
    uint64_t c = enq(&w, TRN_COLL_ALLREDUCE, 2, 0, 1, S(1));
    struct trn_wd_coll x = {.coll = TRN_COLL_ALLREDUCE, .bucket = 3};
    uint64_t seq = 0;
    assert_int_equal(trn_wd_enqueued(&w, &x, S(1), &seq), CDDP_ETOOBIG);
    /* A completion behind the oldest frees nothing: the oldest holds the window. */
    assert_int_equal(trn_wd_completed(&w, c), 0);
    assert_int_equal(trn_wd_enqueued(&w, &x, S(1), &seq), CDDP_ETOOBIG);
    assert_int_equal(trn_wd_completed(&w, a), 0);
    assert_int_equal(trn_wd_enqueued(&w, &x, S(1), &seq), 0);
    assert_int_equal(seq, 4);
    trn_wd_free(&w);
}

static void test_async_error_first(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 600.0, 0.0, 8), 0);
    enq(&w, TRN_COLL_ALLREDUCE, 4, 12, 1 << 20, S(50));
    trn_wd_async_error(&w, CDDP_EPEER, "remote process exited or there was a network error",
                       S(50.3));
    trn_wd_async_error(&w, CDDP_ESTATE, "a second one is not kept", S(51));
    struct trn_wd_decision d;
    /* At once, long before the 600 s bound. */
    assert_int_equal(trn_wd_check(&w, S(50.4), &d), TRN_WD_ASYNC_ERROR);
    assert_int_equal(d.code, CDDP_EPEER);
    assert_true(d.have_blamed);
    assert_int_equal(d.blamed.c.bucket, 4);
    assert_string_equal(d.detail, "remote process exited or there was a network error");
    struct trn_comm_error e;
    trn_wd_error(&d, "nccl", NULL, -1, &e);
    assert_int_equal(e.code, CDDP_EPEER);
    assert_string_equal(e.op, "allreduce");
    assert_int_equal(e.bytes, 1 << 20);
    assert_true(e.timeout_s == 600.0);
    assert_non_null(strstr(e.detail, "nccl reported an error during allreduce #1 (bucket 4, "
                                     "step 12, 1048576 bytes) after 0.4 s: remote process"));
    trn_wd_free(&w);
}

static void test_async_error_idle(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 10.0, 0.0, 8), 0);
    trn_wd_async_error(&w, 0, "unhandled system error", S(3));
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(3), &d), TRN_WD_ASYNC_ERROR);
    assert_false(d.have_blamed);
    assert_int_equal(d.code, CDDP_EPEER); /* a code >= 0 becomes "peer failed" */
    struct trn_comm_error e;
    trn_wd_error(&d, "nccl", NULL, -1, &e);
    assert_string_equal(e.op, "communicator");
    assert_non_null(strstr(e.detail, "no collective in flight"));
    trn_wd_free(&w);
}

static void test_sequence_numbers(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 5.0, 0.0, 4), 0);
    uint64_t prev = 0;
    /* Many times round the ring: numbers keep growing, slots are reused. */
    for (int i = 0; i < 1000; i++) {
        uint64_t a = enq(&w, TRN_COLL_ALLREDUCE, 0, i, 4, S(i));
        uint64_t b = enq(&w, TRN_COLL_ALLREDUCE, 1, i, 4, S(i));
        assert_true(a == prev + 1 && b == a + 1);
        assert_int_equal(trn_wd_completed(&w, a), 0);
        assert_int_equal(trn_wd_completed(&w, b), 0);
        prev = b;
    }
    assert_int_equal(trn_wd_last_seq(&w), 2000);
    /* Past 2^32 nothing is truncated (a 32-bit counter would wrap here). */
    w.head = w.next_seq = UINT32_MAX - 1;
    uint64_t s1 = enq(&w, TRN_COLL_ALLREDUCE, 0, 0, 4, S(5000));
    uint64_t s2 = enq(&w, TRN_COLL_ALLREDUCE, 0, 0, 4, S(5000));
    uint64_t s3 = enq(&w, TRN_COLL_ALLREDUCE, 0, 0, 4, S(5001));
    assert_true(s3 == (uint64_t)UINT32_MAX + 1 && s2 == UINT32_MAX && s1 == UINT32_MAX - 1);
    assert_int_equal(trn_wd_completed(&w, s1), 0);
    assert_int_equal(trn_wd_completed(&w, s2), 0);
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(5007), &d), TRN_WD_TIMEOUT);
    assert_true(d.blamed.seq == (uint64_t)UINT32_MAX + 1);
    trn_wd_free(&w);
}

static void test_missing(void **state)
{
    (void)state;
    int64_t peer[5] = {7, 6, -1, 7, 2};
    int out[5];
    /* Rank 0 is blamed on #7: rank 1 and rank 4 never reached it; 2 unknown. */
    assert_int_equal(trn_wd_missing(peer, 5, 0, 7, out, 5), 2);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 4);
    assert_int_equal(trn_wd_missing(peer, 5, 0, 2, out, 5), 0);
    /* out too small: the count is still the whole. */
    assert_int_equal(trn_wd_missing(peer, 5, 3, 8, out, 1), 3);
    assert_int_equal(out[0], 0);
}

static void test_report_text(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 30.0, 0.0, 8), 0);
    enq(&w, TRN_COLL_ALLREDUCE, 3, 42, 1048576, S(0));
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(31.2), &d), TRN_WD_TIMEOUT);
    char buf[384];
    int missing[2] = {1, 3};
    trn_wd_report(&d, "nccl", missing, 2, buf, sizeof(buf));
    assert_string_equal(buf, "allreduce #1 (bucket 3, step 42, 1048576 bytes) not complete after "
                             "31.2 s (--collective-timeout 30 s; nccl); ranks that never reached "
                             "it: 1, 3");
    trn_wd_report(&d, "nccl", missing, 1, buf, sizeof(buf));
    assert_non_null(strstr(buf, "; rank that never reached it: 1"));
    trn_wd_report(&d, "nccl", missing, 0, buf, sizeof(buf));
    assert_non_null(strstr(buf, "every rank reached it"));
    trn_wd_report(&d, "nccl", NULL, -1, buf, sizeof(buf));
    assert_null(strstr(buf, "rank"));

    /* No bucket, no step: not mentioned. */
    trn_wd_free(&w);
    assert_int_equal(trn_wd_init(&w, 30.0, 0.0, 8), 0);
    enq(&w, TRN_COLL_BROADCAST, -1, -1, 64, S(0));
    trn_wd_check(&w, S(40), &d);
    struct trn_comm_error e;
    trn_wd_error(&d, "nccl", NULL, -1, &e);
    assert_int_equal(e.code, CDDP_ETIMEOUT);
    assert_int_equal(e.coll, TRN_COLL_BROADCAST);
    assert_string_equal(e.op, "broadcast");
    assert_true(e.waited_s > 39.9 && e.waited_s < 40.1);
    assert_string_equal(e.detail, "broadcast #1 (64 bytes) not complete after 40.0 s "
                                  "(--collective-timeout 30 s; nccl)");
    /* Many missing ranks: the first 16, then a count; never past the buffer. */
    int many[40];
    for (int i = 0; i < 40; i++)
        many[i] = i + 1;
    trn_wd_report(&d, "nccl", many, 40, buf, sizeof(buf));
    assert_non_null(strstr(buf, " 16 (+24 more)"));
    char tiny[20];
    trn_wd_report(&d, "nccl", many, 40, tiny, sizeof(tiny));
    assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
    trn_wd_free(&w);
}

/* What the NCCL watchdog's default exit writes: the report in torchrun's
 * error file, exit 75. */
static void test_error_file(void **state)
{
    (void)state;
    struct trn_wd_core w;
    assert_int_equal(trn_wd_init(&w, 5.0, 0.0, 8), 0);
    enq(&w, TRN_COLL_ALLREDUCE, 1, 9, 2048, S(0));
    struct trn_wd_decision d;
    assert_int_equal(trn_wd_check(&w, S(6), &d), TRN_WD_TIMEOUT);
    int missing[1] = {2};
    struct trn_comm_error e;
    trn_wd_error(&d, "nccl", missing, 1, &e);
    trn_wd_free(&w);

    char dir[] = "/tmp/cddp-test-wd-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/error.json", dir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        trn_comm_fail(&e, -1, 0, path);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 75);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    unlink(path);
    rmdir(dir);
    assert_non_null(strstr(text, "CollectiveTimeoutError: allreduce on rank 0 timed out"));
    assert_non_null(strstr(text, "allreduce #1 (bucket 1, step 9, 2048 bytes) not complete after "
                                 "6.0 s (--collective-timeout 5 s; nccl); rank that never reached "
                                 "it: 2"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline),         cmocka_unit_test(test_grace),
        cmocka_unit_test(test_blame_oldest),     cmocka_unit_test(test_completion_clearing),
        cmocka_unit_test(test_full_table),       cmocka_unit_test(test_async_error_first),
        cmocka_unit_test(test_async_error_idle), cmocka_unit_test(test_sequence_numbers),
        cmocka_unit_test(test_missing),          cmocka_unit_test(test_report_text),
        cmocka_unit_test(test_error_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
