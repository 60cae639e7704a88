/* Unit tests for agent/ifname.c: which of GLOO_SOCKET_IFNAME and
 * NCCL_SOCKET_IFNAME cddprun sets, and to what (the decision is pure; apply
 * sets this process's environment). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "agent/ifname.h"
#include "common/errors.h"
#include "common/ifaddr.h"

static const struct cddp_route eth0 = {.ifname = "eth0", .addr = "10.77.0.2"};

static void decide_auto(void **state)
{
    (void)state;
    struct agent_ifname c;
    agent_ifname_decide("10.77.0.1", 0, &eth0, false, NULL, "", &c);
    assert_int_equal(c.source, AGENT_IFNAME_AUTO);
    assert_string_equal(c.ifname, "eth0");
    assert_string_equal(c.addr, "10.77.0.2");
    assert_true(c.set_gloo && c.set_nccl);
    assert_non_null(strstr(c.why, "eth0 (10.77.0.2)"));
    assert_string_equal(agent_ifname_source_name(c.source), "auto");
}

static void decide_user_wins(void **state)
{
    (void)state;
    struct agent_ifname c;
    /* One set by the user: only the other is ours. */
    agent_ifname_decide("10.77.0.1", 0, &eth0, false, "ib0", NULL, &c);
    assert_int_equal(c.source, AGENT_IFNAME_AUTO);
    assert_false(c.set_gloo);
    assert_true(c.set_nccl);
    agent_ifname_decide("10.77.0.1", 0, &eth0, false, NULL, "ib0", &c);
    assert_true(c.set_gloo);
    assert_false(c.set_nccl);
    /* Both: nothing is ours, and the addresses stay unpublished. */
    agent_ifname_decide("10.77.0.1", 0, &eth0, false, "ib0", "ib1", &c);
    assert_int_equal(c.source, AGENT_IFNAME_USER);
    assert_string_equal(c.ifname, "ib0");
    assert_string_equal(c.addr, "");
    assert_false(c.set_gloo || c.set_nccl);
    assert_int_equal(agent_ifname_apply(&c), 0);
}

static void decide_off_or_nothing(void **state)
{
    (void)state;
    struct agent_ifname c;
    agent_ifname_decide("10.77.0.1", 0, &eth0, true, NULL, NULL, &c);
    assert_int_equal(c.source, AGENT_IFNAME_OFF);
    assert_false(c.set_gloo || c.set_nccl);
    assert_non_null(strstr(c.why, "--no_ifname"));
    agent_ifname_decide("nowhere", CDDP_ENOTFOUND, NULL, false, NULL, NULL, &c);
    assert_int_equal(c.source, AGENT_IFNAME_NONE);
    assert_non_null(strstr(c.why, "no route"));
    /* Loopback: the others may not be on this machine, so lo is no answer. */
    struct cddp_route lo = {.ifname = "lo", .addr = "127.0.1.1", .loopback = true};
    agent_ifname_decide("head", 0, &lo, false, NULL, NULL, &c);
    assert_int_equal(c.source, AGENT_IFNAME_NONE);
    assert_non_null(strstr(c.why, "loopback"));
    struct cddp_route noif = {.addr = "10.9.9.9"};
    agent_ifname_decide("head", 0, &noif, false, NULL, NULL, &c);
    assert_int_equal(c.source, AGENT_IFNAME_NONE);
    assert_string_equal(agent_ifname_source_name(c.source), "none");
}

static void apply_sets_only_what_is_ours(void **state)
{
    (void)state;
    unsetenv("GLOO_SOCKET_IFNAME");
    setenv("NCCL_SOCKET_IFNAME", "ib9", 1);
    struct agent_ifname c;
    agent_ifname_decide("10.77.0.1", 0, &eth0, false, getenv("GLOO_SOCKET_IFNAME"),
                        getenv("NCCL_SOCKET_IFNAME"), &c);
    assert_int_equal(agent_ifname_apply(&c), 0);
    assert_string_equal(getenv("GLOO_SOCKET_IFNAME"), "eth0");
    assert_string_equal(getenv("NCCL_SOCKET_IFNAME"), "ib9");
    unsetenv("GLOO_SOCKET_IFNAME");
    unsetenv("NCCL_SOCKET_IFNAME");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decide_auto),
        cmocka_unit_test(decide_user_wins),
        cmocka_unit_test(decide_off_or_nothing),
        cmocka_unit_test(apply_sets_only_what_is_ours),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
