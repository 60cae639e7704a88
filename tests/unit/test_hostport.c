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

/* hostport.h's table, row by row: what each dialect makes of the same text
 * (default port 29400). NULL host: an error. */
static void test_hostport_dialects(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *cddp_host;
        int cddp_port;
        const char *torch_host;
        int torch_port;
    } rows[] = {
        {"host", "host", 29400, "host", 29400},
        {"host:7", "host", 7, "host", 7},
        {"[::1]:29401", "::1", 29401, "::1", 29401},
        {"[::1]", "::1", 29400, "::1", 29400},
        {"::1", "::1", 29400, NULL, 0},
        {"fe80::1", "fe80::1", 29400, NULL, 0},
        {"::1:29401", "::1:29401", 29400, "::1", 29401},
        {"2001:db8::1:2", "2001:db8::1:2", 29400, "2001:db8::1", 2},
        {"a:b:1", "a:b:1", 29400, NULL, 0},
        {"", NULL, 0, "localhost", 29400},
        {" h:1 ", NULL, 0, "h", 1},
        {"bad_host!:1", "bad_host!", 1, NULL, 0},
        {"h:+1", "h", 1, NULL, 0},
        {"h:99999", NULL, 0, NULL, 0},
        {"h:x", NULL, 0, NULL, 0},
        {"h:", NULL, 0, NULL, 0},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        struct cddp_hostport hp;
        char err[256] = "";
        int rc = cddp_hostport_parse(rows[i].text, 29400, &hp, err, sizeof(err));
        if (rows[i].cddp_host == NULL) {
            assert_true(rc < 0);
            assert_true(err[0] != '\0');
        } else {
            assert_int_equal(rc, 0);
            assert_string_equal(hp.host, rows[i].cddp_host);
            assert_int_equal(hp.port, rows[i].cddp_port);
        }
        err[0] = '\0';
        rc = cddp_hostport_parse_torchrun(rows[i].text, 29400, &hp, err, sizeof(err));
        if (rows[i].torch_host == NULL) {
            assert_true(rc < 0);
            assert_non_null(strstr(err, "endpoint '"));
        } else {
            assert_int_equal(rc, 0);
            assert_string_equal(hp.host, rows[i].torch_host);
            assert_int_equal(hp.port, rows[i].torch_port);
            assert_int_equal(hp.has_port, rows[i].torch_port != 29400);
        }
    }
    /* torch's messages, which cddprun prefixes with the flag. */
    struct cddp_hostport hp;
    char err[1024];
    assert_int_equal(cddp_hostport_parse_torchrun("h:x", 1, &hp, err, sizeof(err)), CDDP_EPARSE);
    assert_string_equal(err, "the port of endpoint 'h:x' must be an integer between 0 and 65536");
    assert_int_equal(cddp_hostport_parse_torchrun("a b:1", 1, &hp, err, sizeof(err)), CDDP_EPARSE);
    assert_string_equal(err, "the host of endpoint 'a b:1' must be a host name, an IPv4 address or "
                             "an IPv6 address");
    assert_int_equal(cddp_hostport_parse_torchrun("::1", 1, &hp, err, sizeof(err)), CDDP_EPARSE);
    assert_string_equal(err, "endpoint '::1' is a bare IPv6 address: write it in brackets, "
                             "[::1]:PORT");
    char big[600];
    memset(big, 'h', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(cddp_hostport_parse_torchrun(big, 1, &hp, err, sizeof(err)), CDDP_ETOOBIG);
    big[300] = '\0'; /* fits the text, not the host */
    assert_int_equal(cddp_hostport_parse_torchrun(big, 1, &hp, err, sizeof(err)), CDDP_ETOOBIG);
    assert_non_null(strstr(err, "is too long"));
    /* A missing port with no default (the static backend's -1). */
    assert_int_equal(cddp_hostport_parse_torchrun("[fe80::1]", -1, &hp, err, sizeof(err)), 0);
    assert_int_equal(hp.port, -1);
    assert_false(hp.has_port);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_hostport_dialects),
        cmocka_unit_test(test_status_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
