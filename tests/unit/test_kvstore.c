/* Unit tests for store/kvstore.c, the key-value engine with TCPStore's
 * semantics: get/set/add, compare-and-set, waiters and their deadlines, the
 * limits, the barrier pattern at scale; and what the TCPStore server uses
 * (delete, append, check, queues, add64, key iteration). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "proto/msg.h" /* PROTO_MAX_INT: the JSON protocol's bound, which add keeps */
#include "store/kvstore.h"

static void test_store_basic(void **state)
{
    (void)state;
    struct kvstore *s = kvstore_new(NULL, 1, 2);
    const void *v;
    size_t vl;
    int64_t n;
    assert_int_equal(kvstore_get(s, "a", &v, &vl), CDDP_ENOTFOUND);
    assert_int_equal(kvstore_set(s, "a", "x\0y", 3), 0);
    assert_int_equal(kvstore_get(s, "a", &v, &vl), 0);
    assert_int_equal(vl, 3);
    assert_memory_equal(v, "x\0y", 3);
    assert_int_equal(kvstore_set(s, "a", "", 0), 0);
    assert_int_equal(kvstore_get(s, "a", &v, &vl), 0);
    assert_int_equal(vl, 0);

    assert_int_equal(kvstore_add(s, "cnt", 1, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(kvstore_add(s, "cnt", 41, &n), 0);
    assert_int_equal(n, 42);
    assert_int_equal(kvstore_add(s, "cnt", -50, &n), 0);
    assert_int_equal(n, -8);
    assert_int_equal(kvstore_get(s, "cnt", &v, &vl), 0);
    assert_memory_equal(v, "-8", 2);
    assert_int_equal(kvstore_add(s, "a", 1, &n), CDDP_EPARSE);
    assert_int_equal(kvstore_add(s, "cnt", PROTO_MAX_INT, &n), 0);
    assert_int_equal(kvstore_add(s, "cnt", 9, &n), CDDP_ERANGE_ARG);
    assert_int_equal(kvstore_add(s, "fresh", PROTO_MAX_INT + 1, &n), CDDP_ERANGE_ARG);
    assert_int_equal(kvstore_get(s, "fresh", &v, &vl), CDDP_ENOTFOUND);
    assert_int_equal(kvstore_num_keys(s), 2);
    kvstore_free(s);
}

static void test_store_compare_set(void **state)
{
    (void)state;
    struct kvstore *s = kvstore_new(NULL, 1, 2);
    const void *cur;
    size_t cl;
    /* Missing key, non-empty expected: nothing stored, expected returned. */
    assert_int_equal(kvstore_compare_set(s, "k", "e", 1, "d", 1, &cur, &cl), 0);
    assert_int_equal(cl, 1);
    assert_memory_equal(cur, "e", 1);
    assert_int_equal(kvstore_num_keys(s), 0);
    /* Missing key, empty expected: set. */
    assert_int_equal(kvstore_compare_set(s, "k", "", 0, "d1", 2, &cur, &cl), 0);
    assert_memory_equal(cur, "d1", 2);
    /* Mismatch: current value back, unchanged. */
    assert_int_equal(kvstore_compare_set(s, "k", "zz", 2, "d2", 2, &cur, &cl), 0);
    assert_memory_equal(cur, "d1", 2);
    /* Match: replaced. */
    assert_int_equal(kvstore_compare_set(s, "k", "d1", 2, "d2", 2, &cur, &cl), 0);
    assert_memory_equal(cur, "d2", 2);
    /* Torch's rendezvous sentinel dance. */
    assert_int_equal(kvstore_compare_set(s, "k", "", 0, "x", 1, &cur, &cl), 0);
    assert_memory_equal(cur, "d2", 2);
    kvstore_free(s);
}

static void test_store_wait(void **state)
{
    (void)state;
    struct kvstore *s = kvstore_new(NULL, 1, 2);
    struct kvstore_owner a, b;
    struct kvstore_event ev;
    bool ready;
    kvstore_owner_init(&a);
    kvstore_owner_init(&b);

    const char *k1[] = {"x", "y", "x"};
    assert_int_equal(kvstore_wait(s, k1, 3, 1000, &a, 1, false, &ready), 0);
    assert_false(ready);
    assert_int_equal(a.nwaiters, 1);
    const char *k2[] = {"y"};
    assert_int_equal(kvstore_wait(s, k2, 1, KVSTORE_NEVER, &b, 2, true, &ready), 0);
    assert_false(ready);
    assert_int_equal(kvstore_next_deadline(s), 1000);

    assert_int_equal(kvstore_set(s, "x", "1", 1), 0);
    assert_false(kvstore_next_event(s, &ev)); /* a still misses y */
    assert_int_equal(kvstore_set(s, "y", "2", 1), 0);
    assert_true(kvstore_next_event(s, &ev));
    assert_int_equal(ev.kind, KVSTORE_READY);
    assert_ptr_equal(ev.owner, &a);
    assert_int_equal(ev.req_id, 1);
    assert_false(ev.is_get);
    assert_true(kvstore_next_event(s, &ev));
    assert_ptr_equal(ev.owner, &b);
    assert_true(ev.is_get);
    assert_string_equal(ev.key, "y");
    assert_false(kvstore_next_event(s, &ev));
    assert_int_equal(a.nwaiters, 0);
    assert_int_equal(kvstore_next_deadline(s), KVSTORE_NEVER);

    /* Already set: ready at once, nothing registered. */
    assert_int_equal(kvstore_wait(s, k1, 2, 5, &a, 3, false, &ready), 0);
    assert_true(ready);
    assert_int_equal(a.nwaiters, 0);

    /* Timeouts fire in deadline order; entries of missing keys go away. */
    size_t bytes0 = kvstore_bytes(s);
    const char *kz[] = {"z"};
    assert_int_equal(kvstore_wait(s, kz, 1, 300, &a, 10, false, &ready), 0);
    assert_int_equal(kvstore_wait(s, kz, 1, 100, &b, 11, false, &ready), 0);
    assert_int_equal(kvstore_wait(s, kz, 1, 200, &a, 12, false, &ready), 0);
    assert_true(kvstore_bytes(s) > bytes0);
    kvstore_expire(s, 99);
    assert_false(kvstore_next_event(s, &ev));
    kvstore_expire(s, 250);
    assert_true(kvstore_next_event(s, &ev));
    assert_int_equal(ev.req_id, 11);
    assert_int_equal(ev.kind, KVSTORE_TIMEOUT);
    assert_true(kvstore_next_event(s, &ev));
    assert_int_equal(ev.req_id, 12);
    assert_false(kvstore_next_event(s, &ev));
    assert_int_equal(kvstore_next_deadline(s), 300);

    /* Cancelling an owner drops its waiters without events. */
    kvstore_cancel_owner(s, &a);
    assert_int_equal(a.nwaiters, 0);
    assert_int_equal(kvstore_next_deadline(s), KVSTORE_NEVER);
    assert_int_equal(kvstore_bytes(s), bytes0);
    kvstore_expire(s, 1000);
    assert_false(kvstore_next_event(s, &ev));

    /* Free with waiters still registered (with and without deadlines). */
    const char *kq[] = {"q", "r"};
    assert_int_equal(kvstore_wait(s, kq, 2, KVSTORE_NEVER, &a, 20, false, &ready), 0);
    assert_int_equal(kvstore_wait(s, kq, 1, 50, &b, 21, false, &ready), 0);
    kvstore_free(s);
}

static void test_store_limits(void **state)
{
    (void)state;
    struct kvstore_limits lim = {.max_bytes = 4096, .max_keys = 3, .max_waiters = 2};
    struct kvstore *s = kvstore_new(&lim, 1, 2);
    char big[5000] = {0};
    bool ready;
    int64_t n;
    assert_int_equal(kvstore_set(s, "a", big, sizeof(big)), CDDP_ETOOBIG);
    assert_int_equal(kvstore_num_keys(s), 0);
    assert_int_equal(kvstore_set(s, "a", "1", 1), 0);
    assert_int_equal(kvstore_set(s, "b", "1", 1), 0);
    assert_int_equal(kvstore_add(s, "c", 1, &n), 0);
    assert_int_equal(kvstore_set(s, "d", "1", 1), CDDP_ETOOBIG);
    assert_int_equal(kvstore_set(s, "a", "22", 2), 0); /* replacing is fine */

    struct kvstore_owner o;
    kvstore_owner_init(&o);
    const char *k[] = {"a"};
    const char *m[] = {"zz"};
    assert_int_equal(kvstore_wait(s, k, 1, 1, &o, 1, false, &ready), 0);
    assert_true(ready);
    /* A new key for a waiter counts against max_keys too. */
    assert_int_equal(kvstore_wait(s, m, 1, 1, &o, 1, false, &ready), CDDP_ETOOBIG);
    assert_int_equal(o.nwaiters, 0);
    kvstore_free(s);

    lim.max_keys = 100;
    s = kvstore_new(&lim, 1, 2);
    assert_int_equal(kvstore_wait(s, m, 1, 1, &o, 1, false, &ready), 0);
    assert_int_equal(kvstore_wait(s, m, 1, 1, &o, 2, false, &ready), 0);
    assert_int_equal(kvstore_wait(s, m, 1, 1, &o, 3, false, &ready), CDDP_ETOOBIG);
    kvstore_cancel_owner(s, &o);
    kvstore_free(s);
}

/* Many waiters on one key (an exit barrier of 10,000 nodes) all wake. */
static void test_store_barrier(void **state)
{
    (void)state;
    enum { N = 10000 };
    struct kvstore *s = kvstore_new(NULL, 3, 4);
    struct kvstore_owner *o = calloc(N, sizeof(*o));
    const char *k[] = {"last_member"};
    bool ready;
    int64_t n = 0;
    for (int i = 0; i < N; i++) {
        kvstore_owner_init(&o[i]);
        assert_int_equal(kvstore_add(s, "num_members", 1, &n), 0);
        if (n == N)
            break;
        assert_int_equal(kvstore_wait(s, k, 1, 60000, &o[i], (uint64_t)i, false, &ready), 0);
        assert_false(ready);
    }
    assert_int_equal(n, N);
    assert_int_equal(kvstore_set(s, "last_member", "1", 1), 0);
    struct kvstore_event ev;
    int woke = 0;
    while (kvstore_next_event(s, &ev)) {
        assert_int_equal(ev.kind, KVSTORE_READY);
        assert_int_equal(ev.req_id, (uint64_t)woke);
        woke++;
    }
    assert_int_equal(woke, N - 1);
    assert_int_equal(kvstore_next_deadline(s), KVSTORE_NEVER);
    kvstore_free(s);
    free(o);
}

/* ---- what the TCPStore server uses ---- */

static struct kvstore_owner owner_a, owner_b;

static void test_kv_delete_append_check(void **state)
{
    (void)state;
    struct kvstore *s = kvstore_new(NULL, 3, 4);
    const void *v;
    size_t vl;
    assert_int_equal(kvstore_delete(s, "a"), 0);
    assert_int_equal(kvstore_append(s, "a", "x", 1), 0);
    assert_int_equal(kvstore_append(s, "a", "yz", 2), 0);
    assert_int_equal(kvstore_get(s, "a", &v, &vl), 0);
    assert_int_equal(vl, 3);
    assert_memory_equal(v, "xyz", 3);
    const char *ks[] = {"a", "b"};
    assert_true(kvstore_check(s, ks, 1));
    assert_false(kvstore_check(s, ks, 2));
    assert_int_equal(kvstore_num_keys(s), 1);
    assert_int_equal(kvstore_delete(s, "a"), 1);
    assert_int_equal(kvstore_delete(s, "a"), 0);
    assert_int_equal(kvstore_num_keys(s), 0);
    assert_int_equal(kvstore_get(s, "a", &v, &vl), CDDP_ENOTFOUND);
    assert_int_equal(kvstore_bytes(s), 0);

    /* add64: TCPStore's full int64 range; kvstore_add keeps its 2^53. */
    int64_t out;
    assert_int_equal(kvstore_add64(s, "c", 9000000000000000000LL, &out), 0);
    assert_true(out == 9000000000000000000LL);
    assert_int_equal(kvstore_add64(s, "c", 9000000000000000000LL, &out), CDDP_ERANGE_ARG);
    assert_int_equal(kvstore_add(s, "d", 9000000000000000000LL, &out), CDDP_ERANGE_ARG);
    assert_int_equal(kvstore_set(s, "e", "abc", 3), 0);
    assert_int_equal(kvstore_add64(s, "e", 1, &out), CDDP_EPARSE);

    /* Deleting a key someone waits for keeps the waiter; setting it fires. */
    kvstore_owner_init(&owner_a);
    bool ready;
    const char *w[] = {"f"};
    assert_int_equal(kvstore_wait(s, w, 1, KVSTORE_NEVER, &owner_a, 1, false, &ready), 0);
    assert_false(ready);
    assert_int_equal(kvstore_delete(s, "f"), 0);
    assert_int_equal(kvstore_set(s, "f", "1", 1), 0);
    struct kvstore_event ev;
    assert_true(kvstore_next_event(s, &ev));
    assert_ptr_equal(ev.owner, &owner_a);
    assert_false(kvstore_next_event(s, &ev));

    /* Key iteration sees keys with values only. */
    size_t it = 0, n = 0, kl;
    const char *k;
    while (kvstore_next_key(s, &it, &k, &kl))
        n++;
    assert_int_equal(n, kvstore_num_keys(s));
    kvstore_free(s);
}

static void test_kv_queues(void **state)
{
    (void)state;
    struct kvstore *s = kvstore_new(NULL, 5, 6);
    kvstore_owner_init(&owner_a);
    kvstore_owner_init(&owner_b);
    void *v;
    size_t vl, before;
    assert_int_equal(kvstore_queue_pop(s, "q", &v, &vl, &before), CDDP_ENOTFOUND);
    assert_int_equal(before, 0);
    /* Two waiters on a queue: one push wakes only the oldest. */
    bool ready;
    const char *q[] = {"q"};
    assert_int_equal(kvstore_wait(s, q, 1, KVSTORE_NEVER, &owner_a, 1, false, &ready), 0);
    assert_false(ready);
    assert_int_equal(kvstore_wait(s, q, 1, KVSTORE_NEVER, &owner_b, 2, false, &ready), 0);
    assert_int_equal(kvstore_queue_push(s, "q", "one", 3), 0);
    struct kvstore_event ev;
    assert_true(kvstore_next_event(s, &ev));
    assert_ptr_equal(ev.owner, &owner_a);
    assert_false(kvstore_next_event(s, &ev));
    assert_true(kvstore_check(s, q, 1)); /* a non-empty queue counts */
    assert_int_equal(kvstore_queue_push(s, "q", "", 0), 0);
    assert_true(kvstore_next_event(s, &ev));
    assert_ptr_equal(ev.owner, &owner_b);
    assert_int_equal(kvstore_queue_len(s, "q"), 2);
    /* A wait on a non-empty queue is ready at once. */
    assert_int_equal(kvstore_wait(s, q, 1, KVSTORE_NEVER, &owner_a, 3, false, &ready), 0);
    assert_true(ready);
    assert_int_equal(kvstore_queue_pop(s, "q", &v, &vl, &before), 0);
    assert_int_equal(before, 2);
    assert_int_equal(vl, 3);
    assert_memory_equal(v, "one", 4);
    free(v);
    assert_int_equal(kvstore_queue_pop(s, "q", &v, &vl, &before), 0);
    assert_int_equal(vl, 0);
    free(v);
    assert_int_equal(kvstore_queue_len(s, "q"), 0);
    /* Queues are not keys. */
    assert_int_equal(kvstore_num_keys(s), 0);
    assert_int_equal(kvstore_bytes(s), 0);
    /* Freed with items left. */
    assert_int_equal(kvstore_queue_push(s, "r", "left", 4), 0);
    kvstore_free(s);
}

static void test_kv_queue_limit(void **state)
{
    (void)state;
    struct kvstore_limits lim = {.max_bytes = 4096};
    struct kvstore *s = kvstore_new(&lim, 7, 8);
    char big[5000] = {0};
    assert_int_equal(kvstore_queue_push(s, "q", big, sizeof(big)), CDDP_ETOOBIG);
    assert_int_equal(kvstore_queue_len(s, "q"), 0);
    assert_int_equal(kvstore_bytes(s), 0);
    assert_int_equal(kvstore_set(s, "a", "x", 1), 0);
    assert_int_equal(kvstore_append(s, "a", big, sizeof(big)), CDDP_ETOOBIG);
    kvstore_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_basic),   cmocka_unit_test(test_store_compare_set),
        cmocka_unit_test(test_store_wait),    cmocka_unit_test(test_store_limits),
        cmocka_unit_test(test_store_barrier), cmocka_unit_test(test_kv_delete_append_check),
        cmocka_unit_test(test_kv_queues),     cmocka_unit_test(test_kv_queue_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
