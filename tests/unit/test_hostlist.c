/* Unit tests for common/hostlist.c: Slurm's compressed host and count lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/hostlist.h"

static char err[512];

/* Every host of expr joined by spaces (and checks count agrees with nth). */
static const char *expand(const char *expr)
{
    static char all[8192];
    size_t count = 0;
    assert_int_equal(cddp_hostlist_count(expr, &count, err, sizeof(err)), 0);
    all[0] = '\0';
    size_t o = 0;
    for (size_t i = 0; i < count; i++) {
        char host[CDDP_HOSTLIST_NAME_MAX + 1];
        assert_int_equal(cddp_hostlist_nth(expr, i, host, sizeof(host), err, sizeof(err)), 0);
        o += (size_t)snprintf(all + o, sizeof(all) - o, "%s%s", i ? " " : "", host);
        assert_true(o < sizeof(all));
    }
    return all;
}

static void test_plain_and_ranges(void **state)
{
    (void)state;
    assert_string_equal(expand("node1"), "node1");
    assert_string_equal(expand("a,b,c"), "a b c");
    assert_string_equal(expand("n[1-3]"), "n1 n2 n3");
    assert_string_equal(expand("n[3]"), "n3");
    assert_string_equal(expand("n[1,3,5-6]"), "n1 n3 n5 n6");
    assert_string_equal(expand("a,b[8-10],c"), "a b8 b9 b10 c");
    assert_string_equal(expand("n[1-2]-ib"), "n1-ib n2-ib");
    assert_string_equal(expand("gpu-node.cluster_1"), "gpu-node.cluster_1");
    assert_string_equal(expand("[1-2]"), "1 2");
    /* Duplicates are kept, in order, as Slurm does. */
    assert_string_equal(expand("n[1-2],n1"), "n1 n2 n1");
}

static void test_zero_padding(void **state)
{
    (void)state;
    assert_string_equal(expand("gpu[01-03,07]"), "gpu01 gpu02 gpu03 gpu07");
    assert_string_equal(expand("n[08-10]"), "n08 n09 n10");
    assert_string_equal(expand("n[8-10]"), "n8 n9 n10");
    assert_string_equal(expand("n[001-002]"), "n001 n002");
    assert_string_equal(expand("n[007]"), "n007");
    /* The width is the low bound's: numbers wider than it are not cut. */
    assert_string_equal(expand("n[098-101]"), "n098 n099 n100 n101");
    assert_string_equal(expand("n[0-1]"), "n0 n1");
}

static void test_multiple_brackets(void **state)
{
    (void)state;
    /* The leftmost group varies slowest. */
    assert_string_equal(expand("r[1-2]n[1-2]"), "r1n1 r1n2 r2n1 r2n2");
    assert_string_equal(expand("r[1-2]n[01,03]-x,login"), "r1n01-x r1n03-x r2n01-x r2n03-x login");
    assert_string_equal(expand("a[1-2]b[1]c[5-6]"), "a1b1c5 a1b1c6 a2b1c5 a2b1c6");
    char host[64];
    size_t count;
    assert_int_equal(cddp_hostlist_count("x[1-100]y[1-100]", &count, err, sizeof(err)), 0);
    assert_int_equal(count, 10000);
    assert_int_equal(
        cddp_hostlist_nth("x[1-100]y[1-100]", 9999, host, sizeof(host), err, sizeof(err)), 0);
    assert_string_equal(host, "x100y100");
    assert_int_equal(
        cddp_hostlist_nth("x[1-100]y[1-100]", 101, host, sizeof(host), err, sizeof(err)), 0);
    assert_string_equal(host, "x2y2");
}

static void test_first_and_index(void **state)
{
    (void)state;
    char host[CDDP_HOSTLIST_NAME_MAX + 1];
    assert_int_equal(cddp_hostlist_nth("n[1-2]", 0, host, sizeof(host), err, sizeof(err)), 0);
    assert_string_equal(host, "n1");
    assert_int_equal(cddp_hostlist_nth("n[1-2]", 2, host, sizeof(host), err, sizeof(err)),
                     CDDP_ERANGE_ARG);
    assert_string_equal(err, "host list 'n[1-2]': has 2 hosts, no host 2");
    /* The whole list is checked even when the first host is all we want. */
    assert_int_equal(cddp_hostlist_nth("n1,n[2-", 0, host, sizeof(host), err, sizeof(err)),
                     CDDP_EPARSE);
    /* out too small */
    char tiny[3];
    assert_int_equal(cddp_hostlist_nth("node1", 0, tiny, sizeof(tiny), err, sizeof(err)),
                     CDDP_ETOOBIG);
    /* A million hosts are counted without expanding them. */
    size_t count;
    assert_int_equal(cddp_hostlist_count("n[1-1000]m[1-1000]", &count, err, sizeof(err)), 0);
    assert_int_equal(count, 1000000);
    assert_int_equal(
        cddp_hostlist_nth("n[1-1000]m[1-1000]", 999999, host, sizeof(host), err, sizeof(err)), 0);
    assert_string_equal(host, "n1000m1000");
}

/* Each bad input is refused with the message given. */
static void refused(const char *expr, int code, const char *message)
{
    size_t count = 12345;
    int rc = cddp_hostlist_count(expr, &count, err, sizeof(err));
    if (rc != code || strcmp(err, message) != 0)
        fail_msg("%s: got %d '%s', want %d '%s'", expr, rc, err, code, message);
    char host[CDDP_HOSTLIST_NAME_MAX + 1];
    assert_int_equal(cddp_hostlist_nth(expr, 0, host, sizeof(host), err, sizeof(err)), code);
}

static void test_bad_input(void **state)
{
    (void)state;
    refused("", CDDP_EPARSE, "host list '': empty");
    refused("a,,b", CDDP_EPARSE, "host list 'a,,b': empty name at offset 2");
    refused(",a", CDDP_EPARSE, "host list ',a': empty name at offset 0");
    refused("a,", CDDP_EPARSE, "host list 'a,': empty name at offset 2");
    refused("n[1-2", CDDP_EPARSE, "host list 'n[1-2': the '[' at offset 1 is never closed");
    refused("n[", CDDP_EPARSE, "host list 'n[': the '[' at offset 1 is never closed");
    refused("n[]", CDDP_EPARSE, "host list 'n[]': expected a number at offset 2 inside '[...]'");
    refused("n[a]", CDDP_EPARSE, "host list 'n[a]': expected a number at offset 2 inside '[...]'");
    refused("n[1,]", CDDP_EPARSE,
            "host list 'n[1,]': expected a number at offset 4 inside '[...]'");
    refused("n[1-]", CDDP_EPARSE, "host list 'n[1-]': the range at offset 2 has no upper bound");
    refused("n[5-3]", CDDP_EPARSE, "host list 'n[5-3]': the range 5-3 at offset 2 goes down");
    refused("n[1[2]]", CDDP_EPARSE, "host list 'n[1[2]]': '[' at offset 3 inside another '[...]'");
    refused("n[1-2x]", CDDP_EPARSE,
            "host list 'n[1-2x]': unexpected 'x' at offset 5 inside '[...]'");
    refused("n1]", CDDP_EPARSE, "host list 'n1]': the ']' at offset 2 closes no '['");
    refused("n 1", CDDP_EPARSE, "host list 'n 1': ' ' at offset 1 is not allowed in a host name");
    refused("n\n1", CDDP_EPARSE,
            "host list 'n?1': byte 0x0a at offset 1 is not allowed in a host name");
    refused("n[1234567890]", CDDP_ERANGE_ARG,
            "host list 'n[1234567890]': the number at offset 2 has more than 9 digits");
    refused("n[1-1234567890]", CDDP_ERANGE_ARG,
            "host list 'n[1-1234567890]': the number at offset 4 has more than 9 digits");
    refused("n[0-999999999]", CDDP_ETOOBIG, "host list 'n[0-999999999]': more than 1000000 hosts");
    refused("a[1-1000]b[1-1001]", CDDP_ETOOBIG,
            "host list 'a[1-1000]b[1-1001]': more than 1000000 hosts");
    refused("a[1-1000000],b", CDDP_ETOOBIG, "host list 'a[1-1000000],b': more than 1000000 hosts");
    char groups[128] = "";
    for (int i = 0; i < 17; i++)
        memcpy(groups + 4 * i, "a[1]", 5);
    refused(groups, CDDP_ETOOBIG,
            "host list 'a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]a[1]...': more "
            "than 16 '[...]' groups in the name at offset 0");
    char longname[300];
    memset(longname, 'x', 256);
    longname[256] = '\0';
    char want[512];
    snprintf(want, sizeof(want),
             "host list '%.64s...': the name at offset 0 is longer than 255 bytes", longname);
    refused(longname, CDDP_ETOOBIG, want);
    /* 255 bytes is fine; a group's width counts too. */
    longname[255] = '\0';
    size_t count;
    assert_int_equal(cddp_hostlist_count(longname, &count, err, sizeof(err)), 0);
    memcpy(longname + 250, "[1-100000]", 11);
    assert_int_equal(cddp_hostlist_count(longname, &count, err, sizeof(err)), CDDP_ETOOBIG);
}

static void test_counts(void **state)
{
    (void)state;
    long v = -1;
    const char *l = "2(x3),1,4(x2)";
    long want[] = {2, 2, 2, 1, 4, 4};
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(cddp_slurm_counts_nth(l, i, &v, err, sizeof(err)), 0);
        assert_int_equal(v, want[i]);
    }
    assert_int_equal(cddp_slurm_counts_nth(l, 6, &v, err, sizeof(err)), CDDP_ERANGE_ARG);
    assert_string_equal(err, "count list '2(x3),1,4(x2)': has 6 entries, no entry 6");
    assert_int_equal(cddp_slurm_counts_nth("8", 0, &v, err, sizeof(err)), 0);
    assert_int_equal(v, 8);
    assert_int_equal(cddp_slurm_counts_nth("0(x2)", 1, &v, err, sizeof(err)), 0);
    assert_int_equal(v, 0);

    struct {
        const char *in;
        int code;
        const char *msg;
    } bad[] = {
        {"", CDDP_EPARSE, "count list '': empty"},
        {"2(x0)", CDDP_EPARSE, "count list '2(x0)': expected '(xN)' with N >= 1 at offset 1"},
        {"2(3)", CDDP_EPARSE, "count list '2(3)': expected '(xN)' at offset 1"},
        {"2(x3", CDDP_EPARSE, "count list '2(x3': expected '(xN)' with N >= 1 at offset 1"},
        {"2,", CDDP_EPARSE, "count list '2,': expected a number at offset 2"},
        {"a", CDDP_EPARSE, "count list 'a': expected a number at offset 0"},
        {"2;3", CDDP_EPARSE, "count list '2;3': unexpected ';' at offset 1"},
        {"-1", CDDP_EPARSE, "count list '-1': expected a number at offset 0"},
        {"1234567890", CDDP_ERANGE_ARG,
         "count list '1234567890': the number at offset 0 has more than 9 digits"},
        {"1(x999999999)", CDDP_ETOOBIG, "count list '1(x999999999)': more than 1000000 entries"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = cddp_slurm_counts_nth(bad[i].in, 0, &v, err, sizeof(err));
        if (rc != bad[i].code || strcmp(err, bad[i].msg) != 0)
            fail_msg("%s: got %d '%s'", bad[i].in, rc, err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_and_ranges),  cmocka_unit_test(test_zero_padding),
        cmocka_unit_test(test_multiple_brackets), cmocka_unit_test(test_first_and_index),
        cmocka_unit_test(test_bad_input),         cmocka_unit_test(test_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
