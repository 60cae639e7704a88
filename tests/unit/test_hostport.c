/* Unit tests for common/hostport.c: host:port parsing and formatting, the status port's value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/errors.h"
#include "common/hostport.h"

static void test_hostport(void **state)
{
    (void)state;
    struct cddp_hostport hp;
    char err[128];
    assert_int_equal(cddp_hostport_parse("10.0.0.1:29400", 1, &hp, err, sizeof(err)), 0);
    assert_string_equal(hp.host, "10.0.0.1");
    assert_int_equal(hp.port, 29400);
    assert_true(hp.has_port);
    assert_int_equal(cddp_hostport_parse("node7", 29400, &hp, err, sizeof(err)), 0);
    assert_string_equal(hp.host, "node7");
    assert_int_equal(hp.port, 29400);
    assert_false(hp.has_port);
    assert_int_equal(cddp_hostport_parse("[::1]:5", 1, &hp, err, sizeof(err)), 0);
    assert_string_equal(hp.host, "::1");
    assert_int_equal(hp.port, 5);
    assert_int_equal(cddp_hostport_parse("fe80::1", 7, &hp, err, sizeof(err)), 0);
    assert_string_equal(hp.host, "fe80::1");
    assert_int_equal(hp.port, 7);
    assert_int_equal(cddp_hostport_parse("h:99999", 1, &hp, err, sizeof(err)), CDDP_ERANGE_ARG);
    assert_non_null(strstr(err, "99999"));
    assert_int_equal(cddp_hostport_parse(":5", 1, &hp, err, sizeof(err)), CDDP_EPARSE);
    assert_int_equal(cddp_hostport_parse("[::1", 1, &hp, err, sizeof(err)), CDDP_EPARSE);
    char buf[64];
    cddp_hostport_format("::1", 80, buf, sizeof(buf));
    assert_string_equal(buf, "[::1]:80");
}

/* The status port's value, as cddprun and cddp-rdzv take it (moved here
 * with the parser from the status server's status_parse_port). */
static void test_status_port(void **state)
{
    (void)state;
    char err[256];
    int port;
    assert_int_equal(cddp_status_port_parse("8080", "--status_port", &port, err, sizeof(err)), 0);
    assert_int_equal(port, 8080);
    assert_int_equal(cddp_status_port_parse("0", "--status_port", &port, err, sizeof(err)), 0);
    assert_int_equal(port, 0);
    assert_int_equal(cddp_status_port_parse("80x", "--status-port", &port, err, sizeof(err)),
                     CDDP_EPARSE);
    assert_non_null(strstr(err, "'80x'"));
    assert_string_equal(err,
                        "--status-port: '80x' is not a port number (0-65535; 0 picks a free one)");
    assert_int_equal(cddp_status_port_parse("65536", "CDDP_STATUS_PORT", &port, err, sizeof(err)),
                     CDDP_ERANGE_ARG);
    assert_non_null(strstr(err, "CDDP_STATUS_PORT: '65536'"));
    assert_int_not_equal(cddp_status_port_parse("-1", "x", &port, err, sizeof(err)), 0);
    assert_int_not_equal(cddp_status_port_parse(" 80", "x", &port, err, sizeof(err)), 0);
    /* Unset or empty (CDDP_STATUS_PORT= in a manifest): off, not an error. */
    port = 7;
    assert_int_equal(cddp_status_port_parse("", "x", &port, err, sizeof(err)), 0);
    assert_int_equal(port, -1);
    port = 7;
    assert_int_equal(cddp_status_port_parse(NULL, "x", &port, err, sizeof(err)), 0);
    assert_int_equal(port, -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_status_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
