/* Unit tests for common/array.h: growth, the maximum, failure leaves the
 * array as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "common/array.h"
#include "common/errors.h"
#include "config.h"

struct pair {
    int a;
    double b;
};

static void test_push_to_max(void **state)
{
    (void)state;
    CDDP_ARRAY(struct pair) arr;
    cddp_array_init(&arr, 100);
    int rc = -1;
    for (int i = 0; i < 100; i++) {
        struct pair *p = cddp_array_push(&arr, &rc);
        assert_non_null(p);
        assert_int_equal(rc, 0);
        p->a = i;
        p->b = i * 0.5;
    }
    assert_int_equal(arr.len, 100);
    assert_true(arr.cap >= 100 && arr.cap <= 100); /* never past max */
    struct pair *before = arr.items;
    assert_null(cddp_array_push(&arr, &rc));
    assert_int_equal(rc, CDDP_ETOOBIG);
    assert_int_equal(arr.len, 100);
    assert_ptr_equal(arr.items, before);
    for (int i = 0; i < 100; i++)
        assert_int_equal(arr.items[i].a, i);
    assert_int_equal(cddp_array_grow(&arr, 0), 0);
    cddp_array_free(&arr);
    assert_null(arr.items);
    assert_int_equal(arr.len, 0);
    assert_int_equal(arr.cap, 0);
}

static void test_reserve(void **state)
{
    (void)state;
    int *items = NULL;
    size_t cap = 0;
    assert_int_equal(cddp_array_reserve((void **)&items, &cap, 1, sizeof(int), 1000), 0);
    assert_int_equal(cap, 16); /* the first growth */
    assert_int_equal(cddp_array_reserve((void **)&items, &cap, 17, sizeof(int), 1000), 0);
    assert_int_equal(cap, 32); /* doubles */
    assert_int_equal(cddp_array_reserve((void **)&items, &cap, 600, sizeof(int), 1000), 0);
    assert_int_equal(cap, 1000); /* clamped to the maximum */
    assert_int_equal(cddp_array_reserve((void **)&items, &cap, 1001, sizeof(int), 1000),
                     CDDP_ETOOBIG);
    assert_int_equal(cap, 1000);
    /* need * elem would overflow */
    assert_int_equal(cddp_array_reserve((void **)&items, &cap, SIZE_MAX / 2, 4, SIZE_MAX),
                     CDDP_ETOOBIG);
    /* More than memory: -ENOMEM, unchanged (AddressSanitizer aborts on such
     * a request instead of failing it). */
    if (!CDDP_SANITIZE) {
        int *was = items;
        assert_int_equal(cddp_array_reserve((void **)&items, &cap, SIZE_MAX / 8, 4, SIZE_MAX),
                         CDDP_ERR_FROM_ERRNO(ENOMEM));
        assert_ptr_equal(items, was);
        assert_int_equal(cap, 1000);
    }
    free(items);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_to_max),
        cmocka_unit_test(test_reserve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
