/* Unit tests for common/ifaddr.c: the route to a destination and the
 * interface holding an address (real loopback, and interface lists built
 * here). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "common/errors.h"
#include "common/ifaddr.h"

static void route_to_loopback(void **state)
{
    (void)state;
    struct cddp_route r;
    assert_int_equal(cddp_route_to("127.0.0.1", &r), 0);
    assert_string_equal(r.addr, "127.0.0.1");
    assert_string_equal(r.ifname, "lo");
    assert_true(r.loopback);
    /* Any 127/8 destination leaves from 127.0.0.1 on lo. */
    assert_int_equal(cddp_route_to("127.3.4.5", &r), 0);
    assert_string_equal(r.ifname, "lo");
    assert_true(r.loopback);
}

static void route_to_nothing(void **state)
{
    (void)state;
    struct cddp_route r;
    assert_int_equal(cddp_route_to("", &r), CDDP_ENOTFOUND);
    assert_int_equal(cddp_route_to(NULL, &r), CDDP_ENOTFOUND);
    assert_int_equal(cddp_route_to("no-such-host.invalid", &r), CDDP_ENOTFOUND);
    assert_string_equal(r.ifname, "");
}

static struct sockaddr_in v4(const char *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    assert_int_equal(inet_pton(AF_INET, s, &a.sin_addr), 1);
    return a;
}

static void ifname_of_a_list(void **state)
{
    (void)state;
    struct sockaddr_in lo = v4("127.0.0.1"), eth = v4("10.77.0.5"), other = v4("10.77.0.6");
    struct sockaddr_in6 six = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "fd00::5", &six.sin6_addr);
    /* lo, a link without an address (ifa_addr NULL), eth0 with v4 and v6. */
    struct ifaddrs l[4];
    memset(l, 0, sizeof(l));
    l[0] = (struct ifaddrs){.ifa_next = &l[1], .ifa_name = "lo", .ifa_addr = (void *)&lo};
    l[1] = (struct ifaddrs){.ifa_next = &l[2], .ifa_name = "tun0", .ifa_addr = NULL};
    l[2] = (struct ifaddrs){.ifa_next = &l[3], .ifa_name = "eth0", .ifa_addr = (void *)&eth};
    l[3] = (struct ifaddrs){.ifa_next = NULL, .ifa_name = "eth0", .ifa_addr = (void *)&six};
    char name[64] = "";
    assert_true(cddp_ifname_of(l, (struct sockaddr *)&eth, name, sizeof(name)));
    assert_string_equal(name, "eth0");
    assert_true(cddp_ifname_of(l, (struct sockaddr *)&six, name, sizeof(name)));
    assert_string_equal(name, "eth0");
    assert_true(cddp_ifname_of(l, (struct sockaddr *)&lo, name, sizeof(name)));
    assert_string_equal(name, "lo");
    assert_false(cddp_ifname_of(l, (struct sockaddr *)&other, name, sizeof(name)));
    /* The port plays no part. */
    eth.sin_port = htons(29400);
    assert_true(cddp_ifname_of(l, (struct sockaddr *)&eth, name, sizeof(name)));
    assert_true(cddp_sockaddr_is_loopback((struct sockaddr *)&lo));
    assert_false(cddp_sockaddr_is_loopback((struct sockaddr *)&eth));
    struct sockaddr_in6 mapped = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped.sin6_addr);
    assert_true(cddp_sockaddr_is_loopback((struct sockaddr *)&mapped));
    assert_false(cddp_sockaddr_same((struct sockaddr *)&lo, (struct sockaddr *)&six));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(route_to_loopback),
        cmocka_unit_test(route_to_nothing),
        cmocka_unit_test(ifname_of_a_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
