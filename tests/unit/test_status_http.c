/* Unit tests for status/http.c: snapshots, publishing across threads,
 * server start/stop. The HTTP behaviour is tested process-level in
 * tests/integration/test_status_http.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/errors.h"
#include "status/http.h"

static void test_snapshot_build(void **state)
{
    (void)state;
    struct status_snapshot *s = status_snapshot_new();
    assert_non_null(s);
    size_t len;
    assert_string_equal(status_snapshot_status(s, &len), "{}");
    assert_int_equal(len, 2);
    status_snapshot_metrics(s, &len);
    assert_int_equal(len, 0);
    assert_true(status_snapshot_ready(s)); /* no checks */

    assert_int_equal(status_snapshot_set_status(s, "{\"a\":1}", 7), 0);
    assert_int_equal(status_snapshot_set_status(s, "{\"a\":2}", 7), 0); /* replaces */
    assert_string_equal(status_snapshot_status(s, &len), "{\"a\":2}");
    assert_int_equal(status_snapshot_set_metrics(s, "m 1\n", 4), 0);
    assert_int_equal(status_snapshot_add_check(s, "rendezvous", true, NULL), 0);
    assert_int_equal(status_snapshot_add_check(s, "workers", false, "state is\nrestarting"), 0);
    assert_false(status_snapshot_ready(s));
    assert_int_equal(status_snapshot_check_count(s), 2);
    assert_string_equal(status_snapshot_check(s, 1)->reason, "state is restarting");
    assert_null(status_snapshot_check(s, 2));

    /* Check names: unique, [a-z0-9_-], and "loop" is the server's. */
    assert_int_equal(status_snapshot_add_check(s, "workers", true, NULL), CDDP_EPARSE);
    assert_int_equal(status_snapshot_add_check(s, "Bad Name", true, NULL), CDDP_EPARSE);
    assert_int_equal(status_snapshot_add_check(s, "", true, NULL), CDDP_EPARSE);
    assert_int_equal(status_snapshot_add_check(s, "loop", true, NULL), CDDP_EPARSE);
    for (int i = 2; i < STATUS_MAX_CHECKS; i++) {
        char name[16];
        snprintf(name, sizeof(name), "c%d", i);
        assert_int_equal(status_snapshot_add_check(s, name, true, NULL), 0);
    }
    assert_int_equal(status_snapshot_add_check(s, "one-too-many", true, NULL), CDDP_ETOOBIG);
    status_snapshot_unref(s);
}

static void test_publish_freezes(void **state)
{
    (void)state;
    struct status_cell cell;
    assert_int_equal(status_cell_init(&cell), 0);
    uint64_t gen = 99;
    assert_null(status_cell_acquire(&cell, &gen));
    assert_int_equal(gen, 0);

    struct status_snapshot *a = status_snapshot_new();
    status_snapshot_set_status(a, "\"a\"", 3);
    status_cell_publish(&cell, a);
    assert_int_equal(status_snapshot_set_status(a, "x", 1), CDDP_ESTATE);
    assert_int_equal(status_snapshot_add_check(a, "x", true, NULL), CDDP_ESTATE);
    assert_true(status_snapshot_published_ms(a) > 0);

    /* A reader keeps the old snapshot alive across a publish. */
    struct status_snapshot *held = status_cell_acquire(&cell, &gen);
    assert_ptr_equal(held, a);
    assert_int_equal(gen, 1);
    struct status_snapshot *b = status_snapshot_new();
    status_snapshot_set_status(b, "\"b\"", 3);
    status_cell_publish(&cell, b);
    size_t len;
    assert_string_equal(status_snapshot_status(held, &len), "\"a\"");
    status_snapshot_unref(held); /* frees a (ASan would see a leak or a double free) */
    struct status_snapshot *now = status_cell_acquire(&cell, &gen);
    assert_ptr_equal(now, b);
    assert_int_equal(gen, 2);
    status_snapshot_unref(now);
    status_cell_destroy(&cell);
}

/* Readers on other threads acquire, read every byte and release while the
 * owner publishes as fast as it can: under ASan this catches a reader
 * touching a freed snapshot; every body a reader sees must be whole. */
struct stress {
    struct status_cell cell;
    atomic_bool stop;
    atomic_ulong reads;
    atomic_ulong torn;
};

static void *reader(void *arg)
{
    struct stress *st = arg;
    while (!atomic_load(&st->stop)) {
        struct status_snapshot *s = status_cell_acquire(&st->cell, NULL);
        if (s == NULL)
            continue;
        size_t len;
        const char *body = status_snapshot_status(s, &len);
        /* Bodies are "<n>:" followed by n copies of the digit n % 10. */
        long n = strtol(body, NULL, 10);
        const char *colon = strchr(body, ':');
        bool whole = colon && (size_t)(colon - body) + 1 + (size_t)n == len;
        for (long i = 0; whole && i < n; i++)
            whole = colon[1 + i] == (char)('0' + n % 10);
        if (!whole)
            atomic_fetch_add(&st->torn, 1);
        atomic_fetch_add(&st->reads, 1);
        status_snapshot_unref(s);
    }
    return NULL;
}

static void test_publish_stress(void **state)
{
    (void)state;
    struct stress st;
    assert_int_equal(status_cell_init(&st.cell), 0);
    atomic_init(&st.stop, false);
    atomic_init(&st.reads, 0);
    atomic_init(&st.torn, 0);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reader, &st), 0);
    char body[600];
    for (long k = 0; k < 20000 || atomic_load(&st.reads) < 1000; k++) {
        long n = k % 500;
        int off = snprintf(body, sizeof(body), "%ld:", n);
        memset(body + off, '0' + (int)(n % 10), (size_t)n);
        struct status_snapshot *s = status_snapshot_new();
        assert_int_equal(status_snapshot_set_status(s, body, (size_t)off + (size_t)n), 0);
        status_cell_publish(&st.cell, s);
    }
    atomic_store(&st.stop, true);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&st.torn), 0);
    assert_true(atomic_load(&st.reads) >= 1000);
    status_cell_destroy(&st.cell);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* A raw HTTP/1.0 GET; returns the status code, body in buf. */
static int http_get(int port, const char *path, char *buf, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(fd, buf + got, len - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = '\0';
    close(fd);
    int code = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
        return -1;
    return code;
}

static void test_server_lifecycle(void **state)
{
    (void)state;
    int fds = count_fds();
    struct status_server_options o;
    status_server_options_default(&o);
    o.port = 0;
    o.live_timeout_ms = 200;
    struct status_server *srv;
    char err[256];
    assert_int_equal(status_server_start(&o, &srv, err, sizeof(err)), 0);
    int port = status_server_port(srv);
    assert_true(port > 0);
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    assert_string_equal(status_server_address(srv), want);

    char buf[4096];
    assert_int_equal(http_get(port, "/status", buf, sizeof(buf)), 503);
    assert_int_equal(http_get(port, "/readyz", buf, sizeof(buf)), 503);
    assert_int_equal(http_get(port, "/livez", buf, sizeof(buf)), 200);

    struct status_snapshot *s = status_snapshot_new();
    status_snapshot_set_status(s, "{\"x\":1}", 7);
    status_snapshot_add_check(s, "workers", true, NULL);
    status_server_publish(srv, s);
    assert_int_equal(http_get(port, "/status", buf, sizeof(buf)), 200);
    assert_non_null(strstr(buf, "\r\n\r\n{\"x\":1}"));
    assert_int_equal(http_get(port, "/readyz", buf, sizeof(buf)), 200);

    /* The same port again: a clear error, no leak. */
    struct status_server *second;
    o.port = port;
    assert_int_not_equal(status_server_start(&o, &second, err, sizeof(err)), 0);
    assert_null(second);
    assert_non_null(strstr(err, "Address already in use"));
    assert_non_null(strstr(err, want));

    struct status_server_stats st;
    status_server_stats(srv, &st);
    assert_int_equal(st.requests_total, 5);
    assert_int_equal(st.responses[2], 3);
    assert_int_equal(st.responses[5], 2);
    status_server_stop(srv);
    assert_int_equal(count_fds(), fds);
}

static void test_server_bad_options(void **state)
{
    (void)state;
    struct status_server_options o;
    status_server_options_default(&o);
    struct status_server *srv;
    char err[256];
    o.addr = "not an address";
    assert_int_not_equal(status_server_start(&o, &srv, err, sizeof(err)), 0);
    assert_null(srv);
    assert_non_null(strstr(err, "not an address"));
    o.addr = "127.0.0.1";
    o.port = 70000;
    assert_int_equal(status_server_start(&o, &srv, err, sizeof(err)), CDDP_ERANGE_ARG);
}

/* IPv6 loopback, in brackets or not, when the machine has it. */
static void test_server_ipv6(void **state)
{
    (void)state;
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    if (probe < 0)
        skip();
    close(probe);
    struct status_server_options o;
    status_server_options_default(&o);
    struct status_server *srv;
    char err[256];
    o.addr = "[::1]";
    if (status_server_start(&o, &srv, err, sizeof(err)) != 0)
        skip(); /* no IPv6 loopback configured */
    char want[64];
    snprintf(want, sizeof(want), "[::1]:%d", status_server_port(srv));
    assert_string_equal(status_server_address(srv), want);
    status_server_stop(srv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_build),     cmocka_unit_test(test_publish_freezes),
        cmocka_unit_test(test_publish_stress),     cmocka_unit_test(test_server_lifecycle),
        cmocka_unit_test(test_server_bad_options), cmocka_unit_test(test_server_ipv6),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
