/* Unit tests for store/tcpstore_client.c against store/tcpstore.c
 * served on a thread of its own (as node 0's agent serves it): the V1
 * probe settles, set/get/add/num_keys, a get that times out (then the
 * client is broken: CDDP_ECLOSED), values of 0 bytes and 1 MiB, a refused
 * connection within the timeout, and a silent server (a listening socket
 * that never answers: neither numbering) is an error, not a hang. Then
 * store/tcpstore_thread.c, as cddp-train's rank 0 runs it: a held port
 * refused, a known numbering (V1, V2) without the probe, a get that times
 * out with cancel_waits leaving the connection usable, and a stop that
 * ends a client's pending wait at once. torch's own servers are
 * tests/compat/test_comm_torchrun.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "common/clock.h"
#include "common/errors.h"
#include "store/tcpstore.h"
#include "store/tcpstore_thread.h"
#include "store/tcpstore_client.h"

struct served {
    uv_loop_t loop;
    uv_async_t stop;
    struct tcpstore_server *s;
    pthread_t thread;
    int port;
};

static void on_stop(uv_async_t *a)
{
    struct served *sv = a->data;
    tcpstore_server_close(sv->s, NULL, NULL);
    uv_close((uv_handle_t *)a, NULL);
}

static void *serve_main(void *arg)
{
    struct served *sv = arg;
    uv_run(&sv->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void serve(struct served *sv)
{
    memset(sv, 0, sizeof(*sv));
    assert_int_equal(uv_loop_init(&sv->loop), 0);
    struct tcpstore_server_options o = {.host = "127.0.0.1"};
    char err[256];
    assert_int_equal(tcpstore_server_start(&sv->loop, &o, &sv->s, err, sizeof(err)), 0);
    sv->port = tcpstore_server_port(sv->s);
    uv_async_init(&sv->loop, &sv->stop, on_stop);
    sv->stop.data = sv;
    assert_int_equal(pthread_create(&sv->thread, NULL, serve_main, sv), 0);
}

static void unserve(struct served *sv)
{
    uv_async_send(&sv->stop);
    pthread_join(sv->thread, NULL);
    assert_int_equal(uv_loop_close(&sv->loop), 0);
}

static void test_operations(void **state)
{
    (void)state;
    struct served sv;
    serve(&sv);
    struct tcpstore_client *c = NULL;
    char err[512];
    struct tcpstore_client_options o = {.connect_timeout_s = 5};
    assert_int_equal(tcpstore_client_connect("127.0.0.1", sv.port, &o, &c, err, sizeof(err)), 0);
    assert_string_equal(tcpstore_client_dialect(c), "V1 (torch <= 2.0)");
    assert_int_equal(tcpstore_client_set(c, "a", "xyz", 3), 0);
    assert_int_equal(tcpstore_client_set(c, "empty", "", 0), 0);
    size_t big = 1u << 20;
    char *b = malloc(big);
    for (size_t i = 0; i < big; i++)
        b[i] = (char)(i * 7);
    assert_int_equal(tcpstore_client_set(c, "big", b, big), 0);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(tcpstore_client_get(c, "a", 1, &v, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(v, "xyz", 3);
    free(v);
    assert_int_equal(tcpstore_client_get(c, "empty", 1, &v, &n), 0);
    assert_int_equal(n, 0);
    free(v);
    assert_int_equal(tcpstore_client_get(c, "big", 1, &v, &n), 0);
    assert_int_equal(n, big);
    assert_memory_equal(v, b, big);
    free(v);
    free(b);
    int64_t x = 0;
    assert_int_equal(tcpstore_client_add(c, "n", 5, &x), 0);
    assert_int_equal(x, 5);
    assert_int_equal(tcpstore_client_add(c, "n", -2, &x), 0);
    assert_int_equal(x, 3);
    assert_int_equal(tcpstore_client_num_keys(c, &x), 0);
    assert_int_equal(x, 4);
    /* A key nobody sets: a timeout, then the connection is out of step. */
    assert_int_equal(tcpstore_client_get(c, "never", 0.2, &v, &n), CDDP_ETIMEOUT);
    assert_non_null(strstr(tcpstore_client_last_error(c), "never"));
    assert_int_equal(tcpstore_client_set(c, "a", "1", 1), CDDP_ECLOSED);
    tcpstore_client_close(c);
    unserve(&sv);
}

static void test_refused_within_timeout(void **state)
{
    (void)state;
    struct tcpstore_client *c = NULL;
    char err[512];
    struct tcpstore_client_options o = {.connect_timeout_s = 0.3};
    assert_true(tcpstore_client_connect("127.0.0.1", 1, &o, &c, err, sizeof(err)) < 0);
    assert_null(c);
    assert_non_null(strstr(err, "cannot connect"));
}

static void test_silent_server(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sin);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
    struct tcpstore_client *c = NULL;
    char err[512];
    struct tcpstore_client_options o = {.connect_timeout_s = 3};
    int rc = tcpstore_client_connect("127.0.0.1", ntohs(sin.sin_port), &o, &c, err, sizeof(err));
    assert_int_equal(rc, CDDP_ETIMEOUT);
    assert_non_null(strstr(err, "answers neither"));
    close(fd);
}

/* The silent server again, with the numbering given (V1): no probe, one
 * GETNUMKEYS that is never answered, within the timeout. */
static void test_silent_server_known_v1(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sin);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(fd, 8), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
    struct tcpstore_client *c = NULL;
    char err[512];
    struct tcpstore_client_options o = {.connect_timeout_s = 0.5, .dialect = TCPSTORE_DIALECT_V1};
    uint64_t t0 = cddp_mono_ms();
    int rc = tcpstore_client_connect("127.0.0.1", ntohs(sin.sin_port), &o, &c, err, sizeof(err));
    assert_int_equal(rc, CDDP_ETIMEOUT);
    assert_true(cddp_mono_ms() - t0 < 1900); /* not the 2 s probe */
    assert_null(c);
    assert_non_null(strstr(err, "did not answer torch 1.13's TCPStore queries"));
    close(fd);
}

static void test_thread_serves(void **state)
{
    (void)state;
    struct tcpstore_thread *t = NULL;
    int port = 0;
    char err[512];
    assert_int_equal(tcpstore_thread_start("127.0.0.1", 0, &t, &port, err, sizeof(err)), 0);
    assert_true(port > 0);
    /* The port is held: a second server says so, and nothing is left running. */
    struct tcpstore_thread *dup = NULL;
    assert_int_equal(tcpstore_thread_start("127.0.0.1", port, &dup, NULL, err, sizeof(err)),
                     CDDP_ERR_FROM_ERRNO(EADDRINUSE));
    assert_null(dup);
    assert_non_null(strstr(err, "address already in use"));

    struct tcpstore_client_options o = {.connect_timeout_s = 5,
                                        .op_timeout_s = 5,
                                        .dialect = TCPSTORE_DIALECT_V1,
                                        .cancel_waits = true};
    struct tcpstore_client *c = NULL;
    assert_int_equal(tcpstore_client_connect("127.0.0.1", port, &o, &c, err, sizeof(err)), 0);
    assert_string_equal(tcpstore_client_dialect(c), "V1 (torch <= 2.0)");
    assert_int_equal(tcpstore_client_set(c, "a", "xyz", 3), 0);
    void *v = NULL;
    size_t n = 0;
    /* A wait that times out is cancelled: the connection stays in step. */
    assert_int_equal(tcpstore_client_get(c, "never", 0.1, &v, &n), CDDP_ETIMEOUT);
    assert_non_null(strstr(tcpstore_client_last_error(c), "'never' was not set within"));
    assert_int_equal(tcpstore_client_get(c, "a", 1, &v, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(v, "xyz", 3);
    free(v);
    int64_t x = 0;
    assert_int_equal(tcpstore_client_add(c, "n", 2, &x), 0);
    assert_int_equal(x, 2);
    tcpstore_client_close(c);

    /* torch 2.x's numbering, said up front: VALIDATE and PING, no probe. */
    o.dialect = TCPSTORE_DIALECT_V2;
    assert_int_equal(tcpstore_client_connect("127.0.0.1", port, &o, &c, err, sizeof(err)), 0);
    assert_string_equal(tcpstore_client_dialect(c), "V2 (torch 2.x)");
    assert_int_equal(tcpstore_client_get(c, "never", 0.1, &v, &n), CDDP_ETIMEOUT);
    assert_int_equal(tcpstore_client_add(c, "n", 3, &x), 0);
    assert_int_equal(x, 5);
    assert_int_equal(tcpstore_client_num_keys(c, &x), 0);
    assert_int_equal(x, 2);
    tcpstore_client_close(c);
    tcpstore_thread_stop(t);
    tcpstore_thread_stop(NULL);
}

struct waiter {
    int port;
    int rc;
    uint64_t took_ms;
};

static void *wait_long(void *arg)
{
    struct waiter *w = arg;
    struct tcpstore_client_options o = {.connect_timeout_s = 5, .dialect = TCPSTORE_DIALECT_V1};
    struct tcpstore_client *c = NULL;
    char err[512];
    w->rc = tcpstore_client_connect("127.0.0.1", w->port, &o, &c, err, sizeof(err));
    if (w->rc == 0)
        w->rc = tcpstore_client_set(c, "waiting", "1", 1);
    if (w->rc != 0) {
        tcpstore_client_close(c);
        return NULL; /* the main thread's get of "waiting" then fails the test */
    }
    void *v = NULL;
    size_t n = 0;
    uint64_t t0 = cddp_mono_ms();
    w->rc = tcpstore_client_get(c, "never", 30, &v, &n);
    w->took_ms = cddp_mono_ms() - t0;
    tcpstore_client_close(c);
    return NULL;
}

/* Stop does not wait for clients: a pending wait ends with the connection. */
static void test_thread_stop_ends_waits(void **state)
{
    (void)state;
    struct tcpstore_thread *t = NULL;
    struct waiter w = {0};
    char err[512];
    assert_int_equal(tcpstore_thread_start("127.0.0.1", 0, &t, &w.port, err, sizeof(err)), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, wait_long, &w), 0);
    /* The waiter's key says it is connected; its wait follows at once. */
    struct tcpstore_client_options o = {.connect_timeout_s = 5, .dialect = TCPSTORE_DIALECT_V1};
    struct tcpstore_client *c = NULL;
    assert_int_equal(tcpstore_client_connect("127.0.0.1", w.port, &o, &c, err, sizeof(err)), 0);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(tcpstore_client_get(c, "waiting", 5, &v, &n), 0);
    free(v);
    tcpstore_client_close(c);
    usleep(100 * 1000);
    tcpstore_thread_stop(t);
    pthread_join(th, NULL);
    assert_true(w.rc < 0 && w.rc != CDDP_ETIMEOUT);
    assert_true(w.took_ms < 10000);
    /* Nothing listens any more. */
    o.connect_timeout_s = 0;
    assert_true(tcpstore_client_connect("127.0.0.1", w.port, &o, &c, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "cannot connect"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_operations),    cmocka_unit_test(test_refused_within_timeout),
        cmocka_unit_test(test_silent_server), cmocka_unit_test(test_silent_server_known_v1),
        cmocka_unit_test(test_thread_serves), cmocka_unit_test(test_thread_stop_ends_waits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
