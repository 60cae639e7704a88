/* Unit tests for common/: checked parsing, buffers, host:port, signal names, errors,
 * UTF-8, backoff with jitter, UUIDs, libraries opened on first use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <math.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/dl.h"
#include "common/errors.h"
#include "common/hostname.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "common/utf8.h"
#include "common/uuid.h"

static void test_parse_long(void **state)
{
    (void)state;
    long v = 0;
    assert_int_equal(cddp_parse_long("42", 0, 100, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(cddp_parse_long("-3", -5, 5, &v), 0);
    assert_int_equal(v, -3);
    assert_int_equal(cddp_parse_long("", 0, 100, &v), CDDP_EPARSE);
    assert_int_equal(cddp_parse_long("4x", 0, 100, &v), CDDP_EPARSE);
    assert_int_equal(cddp_parse_long(" 4", 0, 100, &v), CDDP_EPARSE);
    assert_int_equal(cddp_parse_long("101", 0, 100, &v), CDDP_ERANGE_ARG);
    assert_int_equal(cddp_parse_long("99999999999999999999999", 0, 100, &v), CDDP_ERANGE_ARG);
}

static void test_parse_double_bool(void **state)
{
    (void)state;
    double d;
    bool b;
    assert_int_equal(cddp_parse_double("0.1", 0, 10, &d), 0);
    assert_true(d > 0.099 && d < 0.101);
    assert_int_equal(cddp_parse_double("nan", 0, 10, &d), CDDP_ERANGE_ARG);
    assert_int_equal(cddp_parse_double("1e", 0, 10, &d), CDDP_EPARSE);
    assert_int_equal(cddp_parse_bool("Yes", &b), 0);
    assert_true(b);
    assert_int_equal(cddp_parse_bool("0", &b), 0);
    assert_false(b);
    assert_int_equal(cddp_parse_bool("maybe", &b), CDDP_EPARSE);
}

static void test_buf_limit(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 8);
    assert_int_equal(cddp_buf_append(&b, "abcd", 4), 0);
    assert_int_equal(cddp_buf_printf(&b, "%d", 1234), 0);
    assert_int_equal(b.len, 8);
    assert_int_equal(cddp_buf_append(&b, "x", 1), CDDP_ETOOBIG);
    assert_string_equal(b.data, "abcd1234");
    cddp_buf_consume(&b, 3);
    assert_string_equal(b.data, "d1234");
    cddp_buf_free(&b);
}

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

static void test_signames(void **state)
{
    (void)state;
    assert_int_equal(cddp_signal_from_name("SIGTERM"), SIGTERM);
    assert_int_equal(cddp_signal_from_name("usr1"), SIGUSR1);
    assert_int_equal(cddp_signal_from_name("9"), 9);
    assert_int_equal(cddp_signal_from_name("SIGNOPE"), -1);
    assert_string_equal(cddp_signal_name(SIGKILL), "SIGKILL");
}

static void test_host_is_local(void **state)
{
    (void)state;
    assert_true(cddp_host_is_local("localhost"));
    assert_true(cddp_host_is_local("LocalHost"));
    assert_true(cddp_host_is_local("127.0.0.1"));
    assert_true(cddp_host_is_local("127.3.4.5"));
    assert_true(cddp_host_is_local("::1"));
    char name[256] = "";
    assert_int_equal(gethostname(name, sizeof(name) - 1), 0);
    assert_true(cddp_host_is_local(name));
    char fqdn[256];
    cddp_fqdn(fqdn, sizeof(fqdn));
    assert_true(cddp_host_is_local(fqdn));
    /* An interface address of this machine, found independently. */
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET)
                continue;
            char ip[64];
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof(ip));
            assert_true(cddp_host_is_local(ip));
        }
        freeifaddrs(ifs);
    }
    /* Documentation addresses (RFC 5737, 3849) are nobody's. */
    assert_false(cddp_host_is_local("192.0.2.1"));
    assert_false(cddp_host_is_local("2001:db8::1"));
    assert_false(cddp_host_is_local("no-such-host.invalid"));
    assert_false(cddp_host_is_local(""));
}

static void test_errors(void **state)
{
    (void)state;
    assert_string_equal(cddp_err_name(CDDP_ETOOBIG), "ETOOBIG");
    assert_string_equal(cddp_strerror(CDDP_EPARSE), "malformed value");
    assert_string_equal(cddp_err_name(-ECONNREFUSED), "ECONNREFUSED");
    char err[8];
    assert_int_equal(cddp_fail(err, sizeof(err), CDDP_ECONFIG, "bad %s", "value"), CDDP_ECONFIG);
    assert_string_equal(err, "bad val"); /* truncated to the buffer */
    int level;
    assert_int_equal(cddp_log_parse_level("info", &level), 0);
    assert_int_equal(level, CDDP_LOG_INFO);
    assert_int_equal(cddp_log_parse_level("loud", &level), CDDP_EPARSE);
}

static void test_utf8(void **state)
{
    (void)state;
    const unsigned char *euro = (const unsigned char *)"\xe2\x82\xac";
    assert_int_equal(cddp_utf8_seq(euro, 3), 3);
    assert_int_equal(cddp_utf8_seq(euro, 2), 0); /* cut short by the bound */
    assert_int_equal(cddp_utf8_seq(euro, 0), 0);
    assert_int_equal(cddp_utf8_len(euro), 3);
    assert_int_equal(cddp_utf8_len((const unsigned char *)"a"), 1);
    assert_int_equal(cddp_utf8_len((const unsigned char *)"\xe2\x82"), 0); /* cut by the NUL */
    assert_int_equal(cddp_utf8_len((const unsigned char *)"\xf0\x9f\x98\x80"), 4);
    assert_true(cddp_utf8_valid(""));
    assert_true(cddp_utf8_valid("caf\xc3\xa9 \xf4\x8f\xbf\xbf")); /* U+10FFFF */
    assert_false(cddp_utf8_valid("\xc0\x80"));                    /* overlong NUL */
    assert_false(cddp_utf8_valid("\xe0\x80\xaf"));                /* overlong '/' */
    assert_false(cddp_utf8_valid("\xed\xa0\x80"));                /* surrogate */
    assert_false(cddp_utf8_valid("\xf4\x90\x80\x80"));            /* past U+10FFFF */
    assert_false(cddp_utf8_valid("\xf8\x88\x80\x80\x80"));        /* 5 bytes */
    assert_false(cddp_utf8_valid("a\x80"));                       /* lone continuation */
    assert_false(cddp_utf8_valid("\xc3"));                        /* truncated */
}

static void test_backoff(void **state)
{
    (void)state;
    struct cddp_backoff b;
    cddp_backoff_init(&b, 10, 1000);
    /* random 0: the bottom of each step; the step doubles and stops at max. */
    const uint64_t low[] = {5, 10, 20, 40, 80, 160, 320, 500, 500};
    for (size_t i = 0; i < sizeof(low) / sizeof(low[0]); i++)
        assert_int_equal(cddp_backoff_next(&b, 0, UINT64_MAX), low[i]);
    cddp_backoff_reset(&b);
    /* The top of the step: random % (half + 1) == half. */
    assert_int_equal(cddp_backoff_next(&b, 5, UINT64_MAX), 10);
    assert_int_equal(cddp_backoff_next(&b, 10, UINT64_MAX), 20);
    assert_int_equal(cddp_backoff_next(&b, 21, UINT64_MAX), 20); /* 21 % 21 == 0 */
    /* Every draw lies in [step/2, step]. */
    cddp_backoff_reset(&b);
    for (uint32_t r = 0; r < 1000; r += 7) {
        uint64_t step = b.step_ms;
        uint64_t ms = cddp_backoff_next(&b, r * 2654435761u, UINT64_MAX);
        assert_true(ms >= step / 2 && ms <= step);
    }
    /* The time left caps the wait. */
    assert_int_equal(cddp_backoff_next(&b, 0, 3), 3);
    assert_int_equal(cddp_backoff_next(&b, 0, 0), 0);
    /* Degenerate settings are clamped: first 0 -> 1, max below first -> first. */
    cddp_backoff_init(&b, 0, 0);
    assert_int_equal(b.step_ms, 1);
    assert_int_equal(b.max_ms, 1);
    assert_int_equal(cddp_backoff_next(&b, 7, UINT64_MAX), 0); /* [1/2, 1] rounds to 0 */
    assert_int_equal(b.step_ms, 1);
}

static void assert_uuid4_shape(const char *s)
{
    assert_int_equal(strlen(s), 36);
    for (size_t i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            assert_int_equal(s[i], '-');
        else
            assert_non_null(strchr("0123456789abcdef", s[i]));
    }
    assert_int_equal(s[14], '4');           /* version 4 */
    assert_non_null(strchr("89ab", s[19])); /* RFC 4122 variant */
}

static void test_uuid(void **state)
{
    (void)state;
    /* The two forms of known bytes, as Python's str(UUID) and UUID.int. */
    const unsigned char known[16] = {0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x46, 0x78,
                                     0x92, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78};
    char s[CDDP_UUID_STR_SIZE], n[CDDP_UUID_INT_SIZE];
    cddp_uuid_format(known, s);
    assert_string_equal(s, "12345678-1234-4678-9234-567812345678");
    cddp_uuid_format_int(known, n, sizeof(n));
    assert_string_equal(n, "24197857161011639613531485759520134776");
    unsigned char b[16];
    memset(b, 0xff, sizeof(b));
    cddp_uuid_format_int(b, n, sizeof(n));
    assert_string_equal(n, "340282366920938463463374607431768211455"); /* 39 digits fit */
    memset(b, 0, sizeof(b));
    cddp_uuid_format_int(b, n, sizeof(n));
    assert_string_equal(n, "0");
    b[15] = 10;
    cddp_uuid_format_int(b, n, 2); /* cut to the leading digit */
    assert_string_equal(n, "1");

    /* Random ones: the shape, and two calls differ. */
    char a[CDDP_UUID_STR_SIZE], c[CDDP_UUID_STR_SIZE];
    cddp_uuid4_str(a);
    cddp_uuid4_str(c);
    assert_uuid4_shape(a);
    assert_uuid4_shape(c);
    assert_string_not_equal(a, c);
    cddp_uuid4_int(n, sizeof(n));
    assert_true(strlen(n) >= 1 && strlen(n) <= 39);
    assert_int_equal(strspn(n, "0123456789"), strlen(n));

    /* The fallback (no getrandom): the same bits, and no two alike even
     * within one clock tick. */
    enum { N = 256 };
    static char seen[N][CDDP_UUID_STR_SIZE];
    for (int i = 0; i < N; i++) {
        cddp_uuid4_fallback(b);
        cddp_uuid_format(b, seen[i]);
        assert_uuid4_shape(seen[i]);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(seen[i], seen[j]);
    }
}

/* common/dl.h against a library every test machine has (libm) and one no
 * machine has: the table is filled and callable, a missing library or
 * function is one line naming it, and the first outcome is kept. */
static struct {
    __typeof__(cos) *cos;
    __typeof__(sqrt) *sqrt;
} m_fns;
static const struct cddp_dl_sym m_syms[] = {{"cos", &m_fns.cos}, {"sqrt", &m_fns.sqrt}};
static struct cddp_dl m_lib = CDDP_DL_INIT("libm.so.6", m_syms);

static void *load_m(void *arg)
{
    (void)arg;
    char err[64];
    return (void *)(intptr_t)cddp_dl_load(&m_lib, err, sizeof(err));
}

static void test_dl(void **state)
{
    (void)state;
    /* Many threads at once: one load, the same outcome for all. */
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        assert_int_equal(pthread_create(&t[i], NULL, load_m, NULL), 0);
    for (int i = 0; i < 8; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        assert_int_equal((intptr_t)rc, 0);
    }
    assert_non_null(m_fns.cos);
    volatile double x = 4.0; /* not folded at compile time */
    assert_true(m_fns.sqrt(x) == 2.0);
    assert_true(m_fns.cos(0.0 * x) == 1.0);

    char err[320] = "";
    struct {
        __typeof__(cos) *f;
    } none_fns = {NULL}, bad_fns = {NULL};
    const struct cddp_dl_sym none_syms[] = {{"cos", &none_fns.f}};
    struct cddp_dl none = CDDP_DL_INIT("libcddp-no-such-library.so.9", none_syms);
    assert_int_equal(cddp_dl_load(&none, err, sizeof(err)), CDDP_ECONFIG);
    assert_non_null(strstr(err, "libcddp-no-such-library.so.9 cannot be loaded ("));
    assert_null(strchr(err, '\n'));
    assert_null(none_fns.f);
    err[0] = '\0';
    assert_int_equal(cddp_dl_load(&none, err, sizeof(err)), CDDP_ECONFIG); /* kept */
    assert_non_null(strstr(err, "libcddp-no-such-library.so.9"));

    /* A library without one of the functions: nothing is filled. */
    const struct cddp_dl_sym bad_syms[] = {{"cos", &bad_fns.f},
                                           {"cddp_no_such_function", &bad_fns.f}};
    struct cddp_dl bad = CDDP_DL_INIT("libm.so.6", bad_syms);
    assert_int_equal(cddp_dl_load(&bad, err, sizeof(err)), CDDP_ECONFIG);
    assert_string_equal(err, "libm.so.6 cannot be loaded (it has no cddp_no_such_function: too "
                             "old a version?)");
    assert_null(bad_fns.f);
    pthread_mutex_destroy(&none.mu);
    pthread_mutex_destroy(&bad.mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_long),
        cmocka_unit_test(test_parse_double_bool),
        cmocka_unit_test(test_buf_limit),
        cmocka_unit_test(test_hostport),
        cmocka_unit_test(test_hostport_dialects),
        cmocka_unit_test(test_status_port),
        cmocka_unit_test(test_signames),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_host_is_local),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_uuid),
        cmocka_unit_test(test_dl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
