/* Unit tests for common/strmap.c: SipHash-2-4 against the paper's vectors,
 * and the string map (insert, delete with backward shift, iteration). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/strmap.h"

static void test_siphash_vectors(void **state)
{
    (void)state;
    /* The SipHash-2-4 paper's test key 00..0f. */
    uint64_t k0 = 0x0706050403020100ull, k1 = 0x0f0e0d0c0b0a0908ull;
    unsigned char msg[15];
    for (int i = 0; i < 15; i++)
        msg[i] = (unsigned char)i;
    assert_true(cddp_siphash("", 0, k0, k1) == 0x726fdb47dd0e0e31ull);
    assert_true(cddp_siphash(msg, 15, k0, k1) == 0xa129ca6149be45e5ull);
}

static void test_strmap(void **state)
{
    (void)state;
    enum { N = 5000 };
    static char keys[N][16];
    struct cddp_strmap m;
    cddp_strmap_init(&m, 1, 2);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "k%d", i);
        assert_int_equal(cddp_strmap_put(&m, keys[i], strlen(keys[i]), keys[i]), 0);
    }
    assert_int_equal(m.len, N);
    /* Delete every third key; the rest must stay reachable (backward shift). */
    for (int i = 0; i < N; i += 3)
        assert_ptr_equal(cddp_strmap_del(&m, keys[i], strlen(keys[i])), keys[i]);
    for (int i = 0; i < N; i++) {
        void *v = cddp_strmap_get(&m, keys[i], strlen(keys[i]));
        if (i % 3 == 0)
            assert_null(v);
        else
            assert_ptr_equal(v, keys[i]);
    }
    assert_null(cddp_strmap_del(&m, "absent", 6));
    size_t it = 0, count = 0, kl;
    const char *k;
    void *v;
    while (cddp_strmap_next(&m, &it, &k, &kl, &v))
        count++;
    assert_int_equal(count, m.len);
    /* Replace keeps the count. */
    assert_int_equal(cddp_strmap_put(&m, keys[1], strlen(keys[1]), keys[2]), 0);
    assert_int_equal(count, m.len);
    assert_ptr_equal(cddp_strmap_get(&m, keys[1], strlen(keys[1])), keys[2]);
    cddp_strmap_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_vectors),
        cmocka_unit_test(test_strmap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
