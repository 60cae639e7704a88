/* store_client.c: the blocking store client and the store server thread
 * of store_client.h. The client uses plain sockets with deadlines
 * (common/sock.h), so it works from any thread, with or without an event
 * loop. */
#include "rendezvous/store_client.h"

#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/sock.h"
#include "common/strutil.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "rendezvous/server.h"

/* ---- the server thread ---- */

struct rdzv_store_thread {
    uv_thread_t thread;
    uv_loop_t loop;
    uv_async_t stop;
    uv_sem_t ready;
    struct rdzv_server *srv;
    char *host, *token;
    int port;
    int rc;
    char err[256];
};

static void on_store_server_gone(void *arg)
{
    struct rdzv_store_thread *t = arg;
    t->srv = NULL;
    uv_close((uv_handle_t *)&t->stop, NULL);
}

static void on_stop(uv_async_t *a)
{
    struct rdzv_store_thread *t = a->data;
    if (t->srv)
        rdzv_server_shutdown(t->srv, "store stopped", on_store_server_gone, t);
}

static void store_thread_main(void *arg)
{
    struct rdzv_store_thread *t = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* a write to a gone peer: EPIPE, no signal */

    uv_loop_init(&t->loop);
    uv_async_init(&t->loop, &t->stop, on_stop);
    t->stop.data = t;
    struct rdzv_server_options o = {
        .host = t->host, .port = t->port, .token = t->token, .store_only = true};
    t->rc = rdzv_server_start(&t->loop, &o, &t->srv, t->err, sizeof(t->err));
    if (t->rc == 0)
        t->port = rdzv_server_port(t->srv);
    else
        uv_close((uv_handle_t *)&t->stop, NULL);
    uv_sem_post(&t->ready);
    uv_run(&t->loop, UV_RUN_DEFAULT);
    uv_loop_close(&t->loop);
}

int rdzv_store_thread_start(const char *host, int port, const char *token,
                            struct rdzv_store_thread **out, int *port_out, char *err, size_t errlen)
{
    struct rdzv_store_thread *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    t->host = host ? strdup(host) : NULL;
    t->token = token ? strdup(token) : NULL;
    t->port = port;
    uv_sem_init(&t->ready, 0);
    int rc = uv_thread_create(&t->thread, store_thread_main, t);
    if (rc) {
        snprintf(err, errlen, "cannot start the store thread: %s", uv_strerror(rc));
        goto fail;
    }
    uv_sem_wait(&t->ready);
    if (t->rc) {
        rc = t->rc;
        snprintf(err, errlen, "%s", t->err);
        uv_thread_join(&t->thread);
        goto fail;
    }
    if (port_out)
        *port_out = t->port;
    *out = t;
    return 0;
fail:
    uv_sem_destroy(&t->ready);
    free(t->host);
    free(t->token);
    free(t);
    return rc;
}

void rdzv_store_thread_stop(struct rdzv_store_thread *t)
{
    if (t == NULL)
        return;
    uv_async_send(&t->stop);
    uv_thread_join(&t->thread);
    uv_sem_destroy(&t->ready);
    free(t->host);
    free(t->token);
    free(t);
}

/* ---- the blocking client ---- */

struct rdzv_store_client {
    pthread_mutex_t lock;
    int fd;
    bool broken;
    uint64_t op_timeout_ms;
    uint64_t next_id;
    char last_error[512];
};

static int fail_with(struct rdzv_store_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_with(struct rdzv_store_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
    va_end(ap);
    return rc;
}

static int send_msg(struct rdzv_store_client *c, const struct proto_msg *m, uint64_t deadline)
{
    struct cddp_buf b;
    cddp_buf_init(&b, PROTO_FRAME_MAX + PROTO_FRAME_HEADER);
    int rc = proto_msg_encode(m, &b);
    if (rc == 0)
        rc = cddp_send_all(c->fd, b.data, b.len, deadline);
    cddp_buf_free(&b);
    return rc;
}

/* Reads one message. The caller frees it with proto_msg_free. */
static int recv_msg(struct rdzv_store_client *c, struct proto_msg *m, uint64_t deadline)
{
    unsigned char hdr[PROTO_FRAME_HEADER];
    char err[256];
    int rc = cddp_recv_all(c->fd, (char *)hdr, sizeof(hdr), deadline);
    if (rc)
        return rc;
    uint32_t len = proto_frame_length(hdr);
    if (len > PROTO_FRAME_MAX)
        return fail_with(c, CDDP_ETOOBIG, "the server sent a frame of %u bytes", len);
    char *payload = malloc(len ? len : 1);
    if (payload == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    rc = cddp_recv_all(c->fd, payload, len, deadline);
    if (rc == 0) {
        rc = proto_msg_decode(payload, len, m, err, sizeof(err));
        if (rc)
            fail_with(c, rc, "bad message from the server: %s", err);
    }
    free(payload);
    return rc;
}

/* Sends a request and reads until its result. On a transport problem the
 * client is marked broken: a late answer would be taken for the next one. */
static int roundtrip(struct rdzv_store_client *c, struct proto_msg *req, struct proto_msg *res,
                     uint64_t wait_ms)
{
    c->last_error[0] = '\0';
    if (c->broken)
        return fail_with(c, CDDP_ECLOSED, "the store connection was lost earlier");
    req->id = ++c->next_id;
    uint64_t deadline = cddp_mono_ms() + wait_ms;
    int rc = send_msg(c, req, deadline);
    while (rc == 0) {
        rc = recv_msg(c, res, deadline);
        if (rc)
            break;
        if (res->type == PROTO_RESULT && res->id == req->id)
            return 0;
        if (res->type == PROTO_ERROR) {
            rc = fail_with(c, res->error.code, "the store server: %s",
                           res->error.message ? res->error.message : "error");
            proto_msg_free(res);
            break;
        }
        proto_msg_free(res); /* not ours (e.g. a closed notice): keep reading */
    }
    c->broken = true;
    if (rc == CDDP_ETIMEOUT)
        fail_with(c, rc, "no answer from the store within %.1f s", (double)wait_ms / 1000.0);
    else if (c->last_error[0] == '\0')
        fail_with(c, rc, "store connection: %s", cddp_strerror(rc));
    return rc;
}

/* The result's error (if any) as the call's return value. */
static int result_code(struct rdzv_store_client *c, struct proto_msg *res)
{
    if (res->result.code)
        fail_with(c, res->result.code, "%s",
                  res->result.message ? res->result.message : cddp_strerror(res->result.code));
    return res->result.code;
}

int rdzv_store_connect(const char *host, int port, const struct rdzv_store_client_options *o,
                       struct rdzv_store_client **out, char *err, size_t errlen)
{
    struct rdzv_store_client_options opt = {0};
    if (o)
        opt = *o;
    if (opt.connect_timeout_ms == 0)
        opt.connect_timeout_ms = 60000;
    if (opt.op_timeout_ms == 0)
        opt.op_timeout_ms = 60000;
    struct rdzv_store_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    pthread_mutex_init(&c->lock, NULL);
    c->fd = -1;
    c->op_timeout_ms = opt.op_timeout_ms;

    /* Connect, retrying while the server is not up yet. */
    int rc =
        cddp_tcp_connect(host, port, cddp_mono_ms() + opt.connect_timeout_ms, &c->fd, err, errlen);
    if (rc) {
        rdzv_store_close(c);
        return rc;
    }

    /* hello -> welcome, or the server's refusal. */
    struct proto_msg m = {.type = PROTO_HELLO}, r;
    m.hello.token = opt.token;
    m.hello.run_id = opt.run_id ? opt.run_id : "";
    m.hello.client = "cddp store client";
    uint64_t hd = cddp_mono_ms() + c->op_timeout_ms;
    rc = send_msg(c, &m, hd);
    if (rc == 0)
        rc = recv_msg(c, &r, hd);
    if (rc == 0) {
        if (r.type == PROTO_ERROR) {
            rc = r.error.code;
            snprintf(err, errlen, "store server at %s port %d refused us: %s", host, port,
                     r.error.message ? r.error.message : cddp_strerror(rc));
        } else if (r.type != PROTO_WELCOME) {
            rc = CDDP_EPROTO_TYPE;
            snprintf(err, errlen, "store server at %s port %d answered hello with '%s'", host, port,
                     proto_type_name(r.type));
        }
        proto_msg_free(&r);
    } else {
        snprintf(err, errlen, "no welcome from %s port %d: %s", host, port,
                 c->last_error[0] ? c->last_error : cddp_strerror(rc));
    }
    if (rc) {
        rdzv_store_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void rdzv_store_close(struct rdzv_store_client *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* How long to wait locally for an answer the server times out itself. */
static uint64_t wait_budget(struct rdzv_store_client *c, int64_t timeout_ms)
{
    if (timeout_ms < 0)
        return UINT64_MAX / 4;
    return (uint64_t)timeout_ms + c->op_timeout_ms;
}

int rdzv_store_set(struct rdzv_store_client *c, const char *key, const void *val, size_t len)
{
    struct proto_msg m = {.type = PROTO_SET}, r;
    m.set.key = key;
    m.set.value = (struct proto_bytes){val, len};
    pthread_mutex_lock(&c->lock);
    int rc = roundtrip(c, &m, &r, c->op_timeout_ms);
    if (rc == 0) {
        rc = result_code(c, &r);
        proto_msg_free(&r);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int copy_value(const struct proto_bytes *b, void **val, size_t *len)
{
    char *p = malloc(b->len + 1);
    if (p == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (b->len)
        memcpy(p, b->data, b->len);
    p[b->len] = '\0';
    *val = p;
    *len = b->len;
    return 0;
}

int rdzv_store_get(struct rdzv_store_client *c, const char *key, void **val, size_t *len,
                   int64_t timeout_ms)
{
    struct proto_msg m = {.type = PROTO_GET}, r;
    m.get.key = key;
    m.get.timeout_ms = timeout_ms;
    *val = NULL;
    *len = 0;
    pthread_mutex_lock(&c->lock);
    int rc = roundtrip(c, &m, &r, wait_budget(c, timeout_ms));
    if (rc == 0) {
        rc = result_code(c, &r);
        if (rc == 0)
            rc = copy_value(&r.result.value, val, len);
        proto_msg_free(&r);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int rdzv_store_wait(struct rdzv_store_client *c, const char *const *keys, size_t n,
                    int64_t timeout_ms)
{
    struct proto_msg m = {.type = PROTO_WAIT}, r;
    m.wait.keys = keys;
    m.wait.nkeys = n;
    m.wait.timeout_ms = timeout_ms;
    pthread_mutex_lock(&c->lock);
    int rc = roundtrip(c, &m, &r, wait_budget(c, timeout_ms));
    if (rc == 0) {
        rc = result_code(c, &r);
        proto_msg_free(&r);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int rdzv_store_add(struct rdzv_store_client *c, const char *key, int64_t delta, int64_t *out)
{
    struct proto_msg m = {.type = PROTO_ADD}, r;
    m.add.key = key;
    m.add.delta = delta;
    pthread_mutex_lock(&c->lock);
    int rc = roundtrip(c, &m, &r, c->op_timeout_ms);
    if (rc == 0) {
        rc = result_code(c, &r);
        if (rc == 0 && out)
            *out = r.result.number;
        proto_msg_free(&r);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int rdzv_store_compare_set(struct rdzv_store_client *c, const char *key, const void *expected,
                           size_t elen, const void *desired, size_t dlen, void **cur,
                           size_t *curlen)
{
    struct proto_msg m = {.type = PROTO_COMPARE_SET}, r;
    m.compare_set.key = key;
    m.compare_set.expected = (struct proto_bytes){expected, elen};
    m.compare_set.desired = (struct proto_bytes){desired, dlen};
    if (cur)
        *cur = NULL;
    pthread_mutex_lock(&c->lock);
    int rc = roundtrip(c, &m, &r, c->op_timeout_ms);
    if (rc == 0) {
        rc = result_code(c, &r);
        if (rc == 0 && cur)
            rc = copy_value(&r.result.value, cur, curlen);
        proto_msg_free(&r);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

const char *rdzv_store_last_error(struct rdzv_store_client *c)
{
    return c->last_error;
}
