/* Unit tests for trainer/comm/tcpstore_client.c against store/tcpstore.c
 * served on a thread of its own (as node 0's agent serves it): the V1
 * probe settles, set/get/add/num_keys, a get that times out (then the
 * client is broken: CDDP_ECLOSED), values of 0 bytes and 1 MiB, a refused
 * connection within the timeout, and a silent server (a listening socket
 * that never answers: neither numbering) is an error, not a hang. torch's
 * own servers are tests/compat/test_comm_torchrun.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "common/errors.h"
#include "store/tcpstore.h"
#include "trainer/comm/tcpstore_client.h"

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
    struct trn_tcpstore *c = NULL;
    char err[512];
    assert_int_equal(trn_tcpstore_connect("127.0.0.1", sv.port, 5, &c, err, sizeof(err)), 0);
    assert_string_equal(trn_tcpstore_dialect(c), "V1 (torch <= 2.0)");
    assert_int_equal(trn_tcpstore_set(c, "a", "xyz", 3), 0);
    assert_int_equal(trn_tcpstore_set(c, "empty", "", 0), 0);
    size_t big = 1u << 20;
    char *b = malloc(big);
    for (size_t i = 0; i < big; i++)
        b[i] = (char)(i * 7);
    assert_int_equal(trn_tcpstore_set(c, "big", b, big), 0);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(trn_tcpstore_get(c, "a", 1, &v, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(v, "xyz", 3);
    free(v);
    assert_int_equal(trn_tcpstore_get(c, "empty", 1, &v, &n), 0);
    assert_int_equal(n, 0);
    free(v);
    assert_int_equal(trn_tcpstore_get(c, "big", 1, &v, &n), 0);
    assert_int_equal(n, big);
    assert_memory_equal(v, b, big);
    free(v);
    free(b);
    int64_t x = 0;
    assert_int_equal(trn_tcpstore_add(c, "n", 5, &x), 0);
    assert_int_equal(x, 5);
    assert_int_equal(trn_tcpstore_add(c, "n", -2, &x), 0);
    assert_int_equal(x, 3);
    assert_int_equal(trn_tcpstore_num_keys(c, &x), 0);
    assert_int_equal(x, 4);
    /* A key nobody sets: a timeout, then the connection is out of step. */
    assert_int_equal(trn_tcpstore_get(c, "never", 0.2, &v, &n), CDDP_ETIMEOUT);
    assert_non_null(strstr(trn_tcpstore_last_error(c), "never"));
    assert_int_equal(trn_tcpstore_set(c, "a", "1", 1), CDDP_ECLOSED);
    trn_tcpstore_close(c);
    unserve(&sv);
}

static void test_refused_within_timeout(void **state)
{
    (void)state;
    struct trn_tcpstore *c = NULL;
    char err[512];
    assert_true(trn_tcpstore_connect("127.0.0.1", 1, 0.3, &c, err, sizeof(err)) < 0);
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
    struct trn_tcpstore *c = NULL;
    char err[512];
    int rc = trn_tcpstore_connect("127.0.0.1", ntohs(sin.sin_port), 3, &c, err, sizeof(err));
    assert_int_equal(rc, CDDP_ETIMEOUT);
    assert_non_null(strstr(err, "answers neither"));
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_operations),
        cmocka_unit_test(test_refused_within_timeout),
        cmocka_unit_test(test_silent_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
