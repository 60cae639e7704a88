/* Unit tests for trainer/comm/nccl_key.c: the NCCL unique id's store key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/errors.h"
#include "trainer/comm/nccl_key.h"

static void test_key_text(void **state)
{
    (void)state;
    char k[128];
    assert_int_equal(trn_nccl_id_key(NULL, 0, 0, NULL, k, sizeof(k)), 0);
    assert_string_equal(k, "cddp/nccl/default/restart_0/round_0/unique_id");
    assert_int_equal(trn_nccl_id_key("job7", 3, 12, "dp", k, sizeof(k)), 0);
    assert_string_equal(k, "job7/dp/restart_3/round_12/unique_id");
    assert_int_equal(trn_nccl_id_key("", 1, 2, "", k, sizeof(k)), 0);
    assert_string_equal(k, "cddp/nccl/default/restart_1/round_2/unique_id");
}

static void test_keys_differ(void **state)
{
    (void)state;
    /* Every (restart, round, group) gets its own key: a restarted or
     * re-formed group never finds the previous group's id. */
    char keys[4 * 4 * 2][128];
    const char *groups[2] = {"default", "sync_bn"};
    int n = 0;
    for (long r = 0; r < 4; r++)
        for (long round = 0; round < 4; round++)
            for (int g = 0; g < 2; g++)
                assert_int_equal(
                    trn_nccl_id_key(NULL, r, round, groups[g], keys[n++], sizeof(keys[0])), 0);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            assert_string_not_equal(keys[i], keys[j]);
    /* Not ambiguous where one number ends: restart 1 round 12 vs 11 and 2. */
    char a[128], b[128];
    trn_nccl_id_key(NULL, 1, 12, NULL, a, sizeof(a));
    trn_nccl_id_key(NULL, 11, 2, NULL, b, sizeof(b));
    assert_string_not_equal(a, b);
    /* Deterministic: every rank computes the same key. */
    trn_nccl_id_key(NULL, 1, 12, NULL, b, sizeof(b));
    assert_string_equal(a, b);
}

static void test_key_errors(void **state)
{
    (void)state;
    char k[16];
    assert_int_equal(trn_nccl_id_key(NULL, 0, 0, NULL, k, sizeof(k)), CDDP_ETOOBIG);
    assert_string_equal(k, "");
    char big[128];
    assert_int_equal(trn_nccl_id_key(NULL, -1, 0, NULL, big, sizeof(big)), CDDP_ERANGE_ARG);
    assert_int_equal(trn_nccl_id_key(NULL, 0, -1, NULL, big, sizeof(big)), CDDP_ERANGE_ARG);
}

static void test_progress_key(void **state)
{
    (void)state;
    char k[128], id[128];
    assert_int_equal(trn_nccl_progress_key(NULL, 2, 5, 3, k, sizeof(k)), 0);
    assert_string_equal(k, "cddp/nccl/progress/restart_2/round_5/rank_3");
    /* Never the id's key, whatever the group is called. */
    assert_int_equal(trn_nccl_id_key(NULL, 2, 5, "progress", id, sizeof(id)), 0);
    assert_string_not_equal(k, id);
    char other[128];
    trn_nccl_progress_key(NULL, 3, 5, 3, other, sizeof(other));
    assert_string_not_equal(k, other);
    trn_nccl_progress_key(NULL, 2, 5, 4, other, sizeof(other));
    assert_string_not_equal(k, other);
    assert_int_equal(trn_nccl_progress_key(NULL, 0, 0, -1, k, sizeof(k)), CDDP_ERANGE_ARG);
    assert_int_equal(trn_nccl_progress_key(NULL, 0, 0, 1, k, 8), CDDP_ETOOBIG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_text),
        cmocka_unit_test(test_keys_differ),
        cmocka_unit_test(test_key_errors),
        cmocka_unit_test(test_progress_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
