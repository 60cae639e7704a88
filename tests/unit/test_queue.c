/* Unit tests for common/queue.h: the intrusive queue. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/queue.h"

struct item {
    int v;
    struct cddp_queue link;
};

static void test_queue(void **state)
{
    (void)state;
    struct cddp_queue h;
    struct item it[3] = {{.v = 0}, {.v = 1}, {.v = 2}};
    cddp_queue_init(&h);
    assert_true(cddp_queue_empty(&h));
    cddp_queue_insert_tail(&h, &it[1].link);
    cddp_queue_insert_tail(&h, &it[2].link);
    cddp_queue_insert_head(&h, &it[0].link);
    int expect = 0;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &h)
    {
        assert_int_equal(cddp_queue_data(q, struct item, link)->v, expect++);
    }
    cddp_queue_remove(&it[1].link);
    cddp_queue_remove(&it[1].link); /* twice is harmless */
    assert_ptr_equal(cddp_queue_data(cddp_queue_head(&h), struct item, link), &it[0]);
    assert_ptr_equal(h.prev, &it[2].link);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
