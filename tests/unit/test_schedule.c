/* Unit tests for trainer/schedule.c: the learning rate of each step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "trainer/schedule.h"

static void test_constant_is_lr_at_every_step(void **state)
{
    (void)state;
    struct trn_lr_schedule s = trn_lr_schedule_make(TRN_LR_CONSTANT, 0.01, 10, 3, 0);
    assert_int_equal(s.total_steps, 0);
    for (long step = 0; step < 100; step++)
        assert_true(trn_lr_at(&s, step) == 0.01);
}

static void test_cosine_length_is_the_runs_steps(void **state)
{
    (void)state;
    assert_int_equal(trn_lr_schedule_make(TRN_LR_COSINE, 0.1, 10, 3, 0).total_steps, 30);
    /* --steps cuts it, but never lengthens it */
    assert_int_equal(trn_lr_schedule_make(TRN_LR_COSINE, 0.1, 10, 3, 7).total_steps, 7);
    assert_int_equal(trn_lr_schedule_make(TRN_LR_COSINE, 0.1, 10, 3, 1000).total_steps, 30);
}

static void test_cosine_anneals_from_lr_to_zero(void **state)
{
    (void)state;
    struct trn_lr_schedule s = trn_lr_schedule_make(TRN_LR_COSINE, 0.1, 25, 4, 0);
    assert_true(trn_lr_at(&s, 0) == 0.1);
    assert_true(fabs(trn_lr_at(&s, 50) - 0.05) < 1e-15);
    assert_true(fabs(trn_lr_at(&s, 100)) < 1e-15);
    for (long step = 1; step <= 100; step++)
        assert_true(trn_lr_at(&s, step) < trn_lr_at(&s, step - 1));
}

/* CosineAnnealingLR's closed form, in the order the trainer has always
 * computed it: the losses are compared bit for bit with PyTorch's. */
static void test_cosine_is_the_closed_form_bit_for_bit(void **state)
{
    (void)state;
    struct trn_lr_schedule s = trn_lr_schedule_make(TRN_LR_COSINE, 0.005, 256, 1, 0);
    for (long step = 0; step < 256; step++) {
        double want = 0.005 * 0.5 * (1.0 + cos(M_PI * (double)step / 256.0));
        double got = trn_lr_at(&s, step);
        assert_memory_equal(&got, &want, sizeof(double));
    }
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(trn_lr_kind_name(TRN_LR_CONSTANT), "constant");
    assert_string_equal(trn_lr_kind_name(TRN_LR_COSINE), "cosine");
    assert_string_equal(trn_lr_kind_names[TRN_LR_CONSTANT], "constant");
    assert_string_equal(trn_lr_kind_names[TRN_LR_COSINE], "cosine");
    assert_null(trn_lr_kind_names[2]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_constant_is_lr_at_every_step),
        cmocka_unit_test(test_cosine_length_is_the_runs_steps),
        cmocka_unit_test(test_cosine_anneals_from_lr_to_zero),
        cmocka_unit_test(test_cosine_is_the_closed_form_bit_for_bit),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
