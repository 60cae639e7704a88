/*
 * Unit tests for the bootstrap store: trainer/comm/store_server.c (libuv
 * thread, proto/'s store engine) and store_client.c (blocking client), over
 * real loopback sockets in one process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "trainer/comm/store_client.h"
#include "trainer/comm/store_server.h"

static struct trn_store_server *srv;
static int port;

static int setup(void **state)
{
    (void)state;
    char err[256];
    int rc = trn_store_server_start("127.0.0.1", 0, 1.0, &srv, err, sizeof(err));
    if (rc)
        fprintf(stderr, "%s\n", err);
    port = rc ? 0 : trn_store_server_port(srv);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    trn_store_server_stop(srv);
    srv = NULL;
    return 0;
}

static struct trn_store_client *client(void)
{
    struct trn_store_client *c = NULL;
    char err[512];
    int rc = trn_store_client_connect("127.0.0.1", port, 5.0, "test", &c, err, sizeof(err));
    if (rc)
        fail_msg("connect: %s", err);
    return c;
}

static void test_set_get_add(void **state)
{
    (void)state;
    struct trn_store_client *c = client();
    struct trn_kv *kv = trn_store_client_kv(c);
    const char bin[] = {0, 1, 2, (char)0xff, 0};
    assert_int_equal(kv->ops->set(kv, "a", bin, sizeof(bin)), 0);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(kv->ops->get(kv, "a", 1.0, &v, &n), 0);
    assert_int_equal(n, sizeof(bin));
    assert_memory_equal(v, bin, n);
    free(v);
    assert_int_equal(kv->ops->set(kv, "empty", "", 0), 0);
    assert_int_equal(kv->ops->get(kv, "empty", 1.0, &v, &n), 0);
    assert_int_equal(n, 0);
    free(v);
    long x;
    assert_int_equal(kv->ops->add(kv, "n", 5, &x), 0);
    assert_int_equal(x, 5);
    assert_int_equal(kv->ops->add(kv, "n", -7, &x), 0);
    assert_int_equal(x, -2);
    /* add on a non-integer value: the server's error, the connection stays usable */
    assert_true(kv->ops->add(kv, "a", 1, &x) < 0);
    assert_non_null(strstr(kv->err, "add 'a'"));
    assert_int_equal(kv->ops->add(kv, "n", 2, &x), 0);
    assert_int_equal(x, 0);
    trn_store_client_close(c);
}

static void test_get_times_out(void **state)
{
    (void)state;
    struct trn_store_client *c = client();
    struct trn_kv *kv = trn_store_client_kv(c);
    void *v;
    size_t n;
    uint64_t t0 = cddp_mono_ns();
    assert_int_equal(kv->ops->get(kv, "never", 0.3, &v, &n), CDDP_ETIMEOUT);
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    assert_true(took >= 0.25 && took < 3.0);
    assert_non_null(strstr(kv->err, "'never' was not set within 0.3 s"));
    trn_store_client_close(c);
}

struct setter {
    int delay_ms;
};

static void *set_later(void *arg)
{
    struct setter *s = arg;
    struct timespec ts = {0, s->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
    struct trn_store_client *c = client();
    struct trn_kv *kv = trn_store_client_kv(c);
    kv->ops->set(kv, "late", "hello", 5);
    trn_store_client_close(c);
    return NULL;
}

static void test_get_waits_for_a_later_set(void **state)
{
    (void)state;
    struct trn_store_client *c = client();
    struct trn_kv *kv = trn_store_client_kv(c);
    struct setter s = {200};
    pthread_t th;
    pthread_create(&th, NULL, set_later, &s);
    void *v;
    size_t n;
    assert_int_equal(kv->ops->get(kv, "late", 10.0, &v, &n), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(v, "hello", 5);
    free(v);
    pthread_join(th, NULL);
    trn_store_client_close(c);
}

/* Raw socket to the server. */
static int raw_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static void frame(int fd, const char *json)
{
    uint32_t n = htonl((uint32_t)strlen(json));
    assert_int_equal(write(fd, &n, 4), 4);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
}

/* Reads until EOF (the server closes after an error); returns what came. */
static size_t read_until_eof(int fd, char *buf, size_t len)
{
    size_t got = 0;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (;;) {
        ssize_t r = read(fd, buf + got, len - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    buf[got] = '\0';
    return got;
}

static void test_bad_clients_do_not_hurt_the_server(void **state)
{
    (void)state;
    char buf[4096];
    /* a store op before hello */
    int fd = raw_connect();
    frame(fd, "{\"v\":1,\"type\":\"get\",\"id\":1,\"key\":\"a\",\"timeout_ms\":0}");
    size_t n = read_until_eof(fd, buf, sizeof(buf));
    assert_true(n > 4);
    assert_non_null(strstr(buf + 4, "\"error\""));
    assert_non_null(strstr(buf + 4, "say hello first"));
    close(fd);
    /* not JSON */
    fd = raw_connect();
    frame(fd, "this is not json");
    n = read_until_eof(fd, buf, sizeof(buf));
    assert_non_null(strstr(buf + 4, "\"error\""));
    close(fd);
    /* a header announcing 2 GiB */
    fd = raw_connect();
    unsigned char huge[4] = {0x80, 0, 0, 0};
    assert_int_equal(write(fd, huge, 4), 4);
    n = read_until_eof(fd, buf, sizeof(buf));
    close(fd);
    /* a client that vanishes while waiting */
    fd = raw_connect();
    frame(fd, "{\"v\":1,\"type\":\"hello\",\"run_id\":\"\"}");
    frame(fd, "{\"v\":1,\"type\":\"get\",\"id\":2,\"key\":\"zz\",\"timeout_ms\":60000}");
    close(fd);
    /* and the server still serves */
    test_set_get_add(state);
}

static void test_connect_nobody_listening(void **state)
{
    (void)state;
    trn_store_server_stop(srv); /* frees the port */
    srv = NULL;
    struct trn_store_client *c = (struct trn_store_client *)1;
    char err[512];
    uint64_t t0 = cddp_mono_ns();
    int rc = trn_store_client_connect("127.0.0.1", port, 0.5, "test", &c, err, sizeof(err));
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    assert_int_equal(rc, CDDP_ETIMEOUT);
    assert_null(c);
    assert_true(took >= 0.45 && took < 3.0);
    assert_non_null(strstr(err, "cannot reach the bootstrap store at 127.0.0.1:"));
    assert_non_null(strstr(err, "Connection refused"));
    assert_int_equal(setup(state), 0); /* for teardown */
}

static void test_port_in_use(void **state)
{
    (void)state;
    struct trn_store_server *other = (struct trn_store_server *)1;
    char err[512];
    uint64_t t0 = cddp_mono_ns();
    int rc = trn_store_server_start("127.0.0.1", port, 0.3, &other, err, sizeof(err));
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    assert_int_equal(rc, CDDP_EEXISTS);
    assert_null(other);
    assert_true(took >= 0.25 && took < 3.0); /* retried until the bind timeout */
    assert_non_null(strstr(err, "address already in use"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_set_get_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_times_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_waits_for_a_later_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_clients_do_not_hurt_the_server, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_nobody_listening, setup, teardown),
        cmocka_unit_test_setup_teardown(test_port_in_use, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
