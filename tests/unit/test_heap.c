/* Unit tests for common/heap.h: the intrusive min-heap, against a sorted
 * reference under random inserts and removals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>

#include "common/heap.h"

struct item {
    uint64_t key;
    uint64_t seq;
    bool in;
    struct cddp_heap_node node;
};

static bool item_less(const struct cddp_heap_node *a, const struct cddp_heap_node *b)
{
    const struct item *x = cddp_heap_data(a, struct item, node);
    const struct item *y = cddp_heap_data(b, struct item, node);
    return x->key != y->key ? x->key < y->key : x->seq < y->seq;
}

/* Every link agrees with its reverse, every parent comes first, and the
 * tree holds n nodes. Returns the count below (and including) node. */
static size_t check_tree(const struct cddp_heap_node *node, const struct cddp_heap_node *parent)
{
    if (node == NULL)
        return 0;
    assert_ptr_equal(node->parent, parent);
    if (parent != NULL)
        assert_false(item_less(node, parent));
    return 1 + check_tree(node->left, node) + check_tree(node->right, node);
}

static void test_empty_and_one(void **state)
{
    (void)state;
    struct cddp_heap h;
    cddp_heap_init(&h);
    assert_null(cddp_heap_min(&h));
    assert_null(cddp_heap_pop(&h, item_less));
    struct item a = {.key = 5};
    cddp_heap_insert(&h, &a.node, item_less);
    assert_ptr_equal(cddp_heap_min(&h), &a.node);
    assert_int_equal(h.nelts, 1);
    cddp_heap_remove(&h, &a.node, item_less);
    assert_null(cddp_heap_min(&h));
    assert_int_equal(h.nelts, 0);
}

static void test_order_and_ties(void **state)
{
    (void)state;
    struct cddp_heap h;
    cddp_heap_init(&h);
    struct item it[8];
    const uint64_t keys[8] = {3, 1, 3, 2, 1, 3, 0, 2};
    for (int i = 0; i < 8; i++) {
        it[i] = (struct item){.key = keys[i], .seq = (uint64_t)i};
        cddp_heap_insert(&h, &it[i].node, item_less);
    }
    /* By key, then by seq (first inserted first). */
    const int want[8] = {6, 1, 4, 3, 7, 0, 2, 5};
    for (int i = 0; i < 8; i++) {
        struct cddp_heap_node *n = cddp_heap_pop(&h, item_less);
        assert_non_null(n);
        assert_ptr_equal(cddp_heap_data(n, struct item, node), &it[want[i]]);
        assert_int_equal(check_tree(h.min, NULL), h.nelts);
    }
    assert_null(cddp_heap_min(&h));
}

static int cmp_items(const void *a, const void *b)
{
    const struct item *x = *(struct item *const *)a, *y = *(struct item *const *)b;
    return item_less(&x->node, &y->node) ? -1 : item_less(&y->node, &x->node) ? 1 : 0;
}

static void test_random(void **state)
{
    (void)state;
    enum { N = 2000 };
    static struct item it[N];
    struct item *ref[N];
    struct cddp_heap h;
    cddp_heap_init(&h);
    unsigned seed = 12345;
    uint64_t seq = 0;
    for (int round = 0; round < 20000; round++) {
        struct item *x = &it[rand_r(&seed) % N];
        if (x->in) {
            cddp_heap_remove(&h, &x->node, item_less);
            x->in = false;
        } else {
            x->key = (uint64_t)(rand_r(&seed) % 50);
            x->seq = seq++;
            x->in = true;
            cddp_heap_insert(&h, &x->node, item_less);
        }
        if (round % 500 == 0)
            assert_int_equal(check_tree(h.min, NULL), h.nelts);
    }
    /* Drains in the reference's order. */
    size_t n = 0;
    for (int i = 0; i < N; i++)
        if (it[i].in)
            ref[n++] = &it[i];
    assert_int_equal(n, h.nelts);
    qsort(ref, n, sizeof(ref[0]), cmp_items);
    for (size_t i = 0; i < n; i++) {
        struct cddp_heap_node *m = cddp_heap_pop(&h, item_less);
        assert_ptr_equal(cddp_heap_data(m, struct item, node), ref[i]);
    }
    assert_int_equal(h.nelts, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_and_one),
        cmocka_unit_test(test_order_and_ties),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
