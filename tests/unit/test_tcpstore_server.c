/* Unit tests for store/tcpstore.c on a caller's loop (as the agent will host
 * it): start and close with every handle gone (the loop closes cleanly), a
 * failed start that leaves nothing behind, and one client on the same loop
 * doing SET, GET and a WAIT that another connection completes. The torch
 * clients are in tests/integration/test_tcpstore.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "common/strutil.h"
#include "store/tcpstore.h"
#include "store/tcpstore_wire.h"

static int closed;

static void on_closed(void *arg)
{
    (void)arg;
    closed++;
}

static struct tcpstore_server *start(uv_loop_t *loop)
{
    struct tcpstore_server_options o = {.host = "127.0.0.1", .port = 0};
    struct tcpstore_server *s = NULL;
    char err[256];
    assert_int_equal(tcpstore_server_start(loop, &o, &s, err, sizeof(err)), 0);
    assert_true(tcpstore_server_port(s) > 0);
    return s;
}

static void test_start_close(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct tcpstore_server *s = start(&loop);
    closed = 0;
    tcpstore_server_close(s, on_closed, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(closed, 1);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_start_error(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct tcpstore_server *a = start(&loop);
    struct tcpstore_server_options o = {.host = "127.0.0.1", .port = tcpstore_server_port(a)};
    struct tcpstore_server *b = NULL;
    char err[256] = "";
    assert_true(tcpstore_server_start(&loop, &o, &b, err, sizeof(err)) < 0);
    assert_null(b);
    assert_non_null(strstr(err, "cannot listen"));
    o.host = "no-such-host.invalid";
    o.port = 0;
    assert_true(tcpstore_server_start(&loop, &o, &b, err, sizeof(err)) < 0);
    closed = 0;
    tcpstore_server_close(a, on_closed, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(closed, 1); /* only the started one calls back */
    assert_int_equal(uv_loop_close(&loop), 0);
}

/* A client on the same loop: sends its bytes, collects what comes back. */
struct client {
    uv_tcp_t tcp;
    uv_connect_t conn;
    uv_write_t wr;
    uv_buf_t out;
    struct cddp_buf in;
    size_t want; /* close once this many bytes arrived */
    struct tcpstore_server *srv;
    struct client *then; /* connect this one once we are connected */
};

static void on_alloc(uv_handle_t *h, size_t n, uv_buf_t *b)
{
    (void)h;
    static char buf[4096];
    (void)n;
    *b = uv_buf_init(buf, sizeof(buf));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    struct client *c = s->data;
    if (n > 0)
        assert_int_equal(cddp_buf_append(&c->in, b->base, (size_t)n), 0);
    if (n < 0 || c->in.len >= c->want)
        uv_close((uv_handle_t *)&c->tcp, NULL);
}

static void on_written(uv_write_t *w, int status)
{
    (void)w;
    assert_int_equal(status, 0);
}

static void connect_client(uv_loop_t *loop, struct client *c);

static void on_connect(uv_connect_t *req, int status)
{
    struct client *c = req->data;
    assert_int_equal(status, 0);
    uv_write(&c->wr, (uv_stream_t *)&c->tcp, &c->out, 1, on_written);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (c->then)
        connect_client(c->tcp.loop, c->then);
}

static void connect_client(uv_loop_t *loop, struct client *c)
{
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", tcpstore_server_port(c->srv), &a);
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    c->conn.data = c;
    cddp_buf_init(&c->in, 1 << 20);
    assert_int_equal(uv_tcp_connect(&c->conn, &c->tcp, (struct sockaddr *)&a, on_connect), 0);
}

static void q_append(struct cddp_buf *b, enum tcpstore_dialect d, struct tcpstore_query q)
{
    assert_int_equal(tcpstore_encode_query(d, &q, b), 0);
}

#define B(s) ((struct tcpstore_bytes){(const uint8_t *)(s), sizeof(s) - 1})

static void test_clients_on_the_callers_loop(void **state)
{
    (void)state;
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct tcpstore_server *s = start(&loop);

    /* Client A (torch 1.13 numbering): SET, GET, then a WAIT on "/w"
     * that B (torch 2.x numbering, connected after A) completes. */
    struct cddp_buf qa, qb;
    cddp_buf_init(&qa, 1 << 20);
    cddp_buf_init(&qb, 1 << 20);
    struct tcpstore_bytes w = B("/w");
    q_append(&qa, TCPSTORE_DIALECT_V1,
             (struct tcpstore_query){.op = TCPSTORE_SET, .key = B("/k"), .val = B("v")});
    q_append(&qa, TCPSTORE_DIALECT_V1, (struct tcpstore_query){.op = TCPSTORE_GET, .key = B("/k")});
    q_append(&qa, TCPSTORE_DIALECT_V1,
             (struct tcpstore_query){.op = TCPSTORE_WAIT, .nitems = 1, .keys = &w});
    q_append(&qb, TCPSTORE_DIALECT_V2,
             (struct tcpstore_query){.op = TCPSTORE_VALIDATE, .u32 = TCPSTORE_MAGIC});
    q_append(&qb, TCPSTORE_DIALECT_V2,
             (struct tcpstore_query){.op = TCPSTORE_SET, .key = B("/w"), .val = B("")});
    q_append(&qb, TCPSTORE_DIALECT_V2, (struct tcpstore_query){.op = TCPSTORE_GETNUMKEYS});

    struct client b = {.out = uv_buf_init(qb.data, (unsigned)qb.len), .want = 8, .srv = s};
    struct client a = {
        .out = uv_buf_init(qa.data, (unsigned)qa.len), .want = 8 + 1 + 1, .srv = s, .then = &b};
    connect_client(&loop, &a);
    /* Run until both clients have what they want, then close the server. */
    while (!uv_is_closing((uv_handle_t *)&a.tcp) || !uv_is_closing((uv_handle_t *)&b.tcp))
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(a.in.len, 10);
    assert_memory_equal(a.in.data, "\x01\0\0\0\0\0\0\0v\0", 10); /* GET "v", STOP_WAITING */
    assert_int_equal(b.in.len, 8);
    /* GETNUMKEYS: /w, and /k unless B's queries were read before A's. */
    assert_true(b.in.data[0] == 1 || b.in.data[0] == 2);

    struct tcpstore_stats st;
    tcpstore_server_stats(s, &st);
    assert_int_equal(st.queries, 6);
    assert_int_equal(st.dialect_v1, 1);
    assert_int_equal(st.dialect_v2, 1);
    assert_int_equal(st.keys, 2);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.held, 0);
    closed = 0;
    tcpstore_server_close(s, on_closed, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(closed, 1);
    assert_int_equal(uv_loop_close(&loop), 0);
    cddp_buf_free(&a.in);
    cddp_buf_free(&b.in);
    cddp_buf_free(&qa);
    cddp_buf_free(&qb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_close),
        cmocka_unit_test(test_start_error),
        cmocka_unit_test(test_clients_on_the_callers_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
