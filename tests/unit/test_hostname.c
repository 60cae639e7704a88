/* Unit tests for common/hostname.c: whether a host is this machine (names, loopback, interface
 * addresses). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include "common/hostname.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_is_local),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
