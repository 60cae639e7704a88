/* Unit tests for common/signames.c: signal names both ways. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>

#include "common/signames.h"

static void test_signames(void **state)
{
    (void)state;
    assert_int_equal(cddp_signal_from_name("SIGTERM"), SIGTERM);
    assert_int_equal(cddp_signal_from_name("usr1"), SIGUSR1);
    assert_int_equal(cddp_signal_from_name("9"), 9);
    assert_int_equal(cddp_signal_from_name("SIGNOPE"), -1);
    assert_string_equal(cddp_signal_name(SIGKILL), "SIGKILL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_signames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
