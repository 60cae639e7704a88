/*
 * store_server.c: rank 0's bootstrap store; see store_server.h.
 *
 * The libuv shell around proto/store.c: connections become owners, frames
 * become store calls, store events become replies, and one timer follows
 * the store's earliest waiter deadline. The store's clock is uv_now() (ms).
 */
#include "trainer/comm/store_server.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>
#include <uv.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/queue.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "proto/store.h"

struct trn_store_server {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    uv_timer_t timer;
    pthread_t thread;
    struct proto_store *store;
    struct cddp_queue conns;
    int port;
};

struct conn {
    uv_tcp_t tcp; /* first: the handle's close callback frees the conn */
    struct trn_store_server *srv;
    struct proto_decoder dec;
    struct proto_store_owner owner;
    struct cddp_queue link;
    bool welcomed;
    bool closing;
};

struct write_req {
    uv_write_t req;
    size_t len;
    char data[];
};

static void conn_close(struct conn *c);

static void on_written(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows up as a read error and closes the conn */
    free(req->data);
}

static void send_msg(struct conn *c, const struct proto_msg *m)
{
    if (c->closing)
        return;
    struct cddp_buf b;
    cddp_buf_init(&b, PROTO_FRAME_MAX + PROTO_FRAME_HEADER);
    if (proto_msg_encode(m, &b) != 0) {
        cddp_buf_free(&b);
        conn_close(c);
        return;
    }
    struct write_req *w = malloc(sizeof(*w) + b.len);
    if (w == NULL) {
        cddp_buf_free(&b);
        conn_close(c);
        return;
    }
    memcpy(w->data, b.data, b.len);
    w->len = b.len;
    w->req.data = w;
    cddp_buf_free(&b);
    uv_buf_t buf = uv_buf_init(w->data, (unsigned)w->len);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0) {
        free(w);
        conn_close(c);
    }
}

static void reply(struct conn *c, uint64_t id, int code, const char *message)
{
    struct proto_msg m = {.type = PROTO_RESULT, .id = id};
    m.result.code = code;
    m.result.message = code ? message : NULL;
    send_msg(c, &m);
}

static void reply_value(struct conn *c, uint64_t id, const void *val, size_t len)
{
    struct proto_msg m = {.type = PROTO_RESULT, .id = id};
    m.result.has_value = true;
    m.result.value.data = val;
    m.result.value.len = len;
    send_msg(c, &m);
}

/* An error message, then the connection is closed (bad input from a peer). */
static void refuse(struct conn *c, int code, const char *why)
{
    struct proto_msg m = {.type = PROTO_ERROR};
    m.error.code = code;
    m.error.message = why;
    send_msg(c, &m);
    conn_close(c);
}

/* Answers every waiter the last store call completed or expired. */
static void drain_events(struct trn_store_server *s)
{
    struct proto_store_event ev;
    while (proto_store_next_event(s->store, &ev)) {
        struct conn *c = cddp_queue_data(ev.owner, struct conn, owner);
        if (ev.kind == PROTO_STORE_TIMEOUT) {
            reply(c, ev.req_id, CDDP_ETIMEOUT, "timed out waiting for the key");
        } else if (ev.is_get) {
            const void *val;
            size_t len;
            if (proto_store_get(s->store, ev.key, &val, &len) == 0)
                reply_value(c, ev.req_id, val, len);
            else
                reply(c, ev.req_id, CDDP_ENOTFOUND, "key vanished");
        } else {
            reply(c, ev.req_id, 0, NULL);
        }
    }
}

static void on_timer(uv_timer_t *t);

static void arm_timer(struct trn_store_server *s)
{
    uint64_t next = proto_store_next_deadline(s->store);
    if (next == PROTO_STORE_NEVER) {
        uv_timer_stop(&s->timer);
        return;
    }
    uint64_t now = uv_now(&s->loop);
    uv_timer_start(&s->timer, on_timer, next > now ? next - now : 0, 0);
}

static void on_timer(uv_timer_t *t)
{
    struct trn_store_server *s = t->data;
    proto_store_expire(s->store, uv_now(&s->loop));
    drain_events(s);
    arm_timer(s);
}

static uint64_t deadline_of(struct trn_store_server *s, int64_t timeout_ms)
{
    return timeout_ms < 0 ? PROTO_STORE_NEVER : uv_now(&s->loop) + (uint64_t)timeout_ms;
}

static void handle(struct conn *c, const struct proto_msg *m)
{
    struct trn_store_server *s = c->srv;
    int rc;
    if (!c->welcomed) {
        if (m->type != PROTO_HELLO) {
            refuse(c, CDDP_ESTATE, "say hello first");
            return;
        }
        c->welcomed = true;
        struct proto_msg w = {.type = PROTO_WELCOME};
        w.welcome.server = "cddp-train bootstrap store";
        send_msg(c, &w);
        return;
    }
    switch (m->type) {
    case PROTO_SET:
        rc = proto_store_set(s->store, m->set.key, m->set.value.data, m->set.value.len);
        reply(c, m->id, rc, rc ? cddp_strerror(rc) : NULL);
        break;
    case PROTO_GET: {
        const void *val;
        size_t len;
        if (proto_store_get(s->store, m->get.key, &val, &len) == 0) {
            reply_value(c, m->id, val, len);
            break;
        }
        if (m->get.timeout_ms < 0) {
            reply(c, m->id, CDDP_ENOTFOUND, "no such key");
            break;
        }
        bool ready;
        const char *keys[1] = {m->get.key};
        rc = proto_store_wait(s->store, keys, 1, deadline_of(s, m->get.timeout_ms), &c->owner,
                              m->id, true, &ready);
        if (rc)
            reply(c, m->id, rc, cddp_strerror(rc));
        break;
    }
    case PROTO_WAIT: {
        bool ready;
        rc = proto_store_wait(s->store, m->wait.keys, m->wait.nkeys,
                              deadline_of(s, m->wait.timeout_ms), &c->owner, m->id, false, &ready);
        if (rc || ready)
            reply(c, m->id, rc, rc ? cddp_strerror(rc) : NULL);
        break;
    }
    case PROTO_ADD: {
        int64_t v;
        rc = proto_store_add(s->store, m->add.key, m->add.delta, &v);
        if (rc) {
            reply(c, m->id, rc, cddp_strerror(rc));
        } else {
            struct proto_msg r = {.type = PROTO_RESULT, .id = m->id};
            r.result.has_number = true;
            r.result.number = v;
            send_msg(c, &r);
        }
        break;
    }
    case PROTO_COMPARE_SET: {
        const void *cur;
        size_t len;
        rc = proto_store_compare_set(s->store, m->compare_set.key, m->compare_set.expected.data,
                                     m->compare_set.expected.len, m->compare_set.desired.data,
                                     m->compare_set.desired.len, &cur, &len);
        if (rc)
            reply(c, m->id, rc, cddp_strerror(rc));
        else
            reply_value(c, m->id, cur, len);
        break;
    }
    default:
        refuse(c, CDDP_EPROTO_TYPE, "not a store operation");
        return;
    }
    drain_events(s);
    arm_timer(s);
}

static int on_frame(void *arg, const char *payload, size_t len)
{
    struct conn *c = arg;
    if (c->closing)
        return 1;
    struct proto_msg m;
    char err[256];
    int rc = proto_msg_decode(payload, len, &m, err, sizeof(err));
    if (rc) {
        log_warn("T6020", "bootstrap store: bad message from a client: %s", err);
        refuse(c, rc, err);
        return 1;
    }
    handle(c, &m);
    proto_msg_free(&m);
    return c->closing ? 1 : 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    static _Thread_local char slab[64 * 1024];
    *buf = uv_buf_init(slab, sizeof(slab));
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    struct conn *c = (struct conn *)st;
    if (n < 0) {
        conn_close(c);
        return;
    }
    if (n == 0)
        return;
    int rc = proto_decoder_feed(&c->dec, buf->base, (size_t)n, on_frame, c);
    if (rc == CDDP_ETOOBIG)
        refuse(c, rc, "frame too large");
    else if (rc < 0)
        conn_close(c);
}

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = (struct conn *)h;
    proto_decoder_free(&c->dec);
    free(c);
}

static void conn_close(struct conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    proto_store_cancel_owner(c->srv->store, &c->owner);
    cddp_queue_remove(&c->link);
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_connection(uv_stream_t *l, int status)
{
    struct trn_store_server *s = l->data;
    if (status < 0)
        return;
    struct conn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return;
    c->srv = s;
    uv_tcp_init(&s->loop, &c->tcp);
    proto_decoder_init(&c->dec, PROTO_FRAME_MAX);
    proto_store_owner_init(&c->owner);
    cddp_queue_insert_tail(&s->conns, &c->link);
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
}

static void on_stop(uv_async_t *a)
{
    struct trn_store_server *s = a->data;
    while (!cddp_queue_empty(&s->conns))
        conn_close(cddp_queue_data(cddp_queue_head(&s->conns), struct conn, link));
    uv_close((uv_handle_t *)&s->listener, NULL);
    uv_close((uv_handle_t *)&s->timer, NULL);
    uv_close((uv_handle_t *)&s->stop, NULL);
}

static void *server_thread(void *arg)
{
    struct trn_store_server *s = arg;
    /* A client that vanishes must not kill rank 0: writes to its closed
     * socket fail with EPIPE in this thread instead of raising SIGPIPE. */
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* The address to bind for host: itself if it is loopback, else the wildcard. */
static int bind_addr(const char *host, int port, struct sockaddr_storage *ss, char *err,
                     size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai != 0 || res == NULL) {
        snprintf(err, errlen, "cannot resolve MASTER_ADDR '%s': %s", host, gai_strerror(gai));
        return CDDP_ENOTFOUND;
    }
    bool loop_only = true;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
        loop_only = loop_only && is_loopback(ai->ai_addr);
    memset(ss, 0, sizeof(*ss));
    if (loop_only) {
        memcpy(ss, res->ai_addr, res->ai_addrlen);
    } else {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = in6addr_any;
    }
    freeaddrinfo(res);
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    return 0;
}

static int try_listen(struct trn_store_server *s, const struct sockaddr *sa)
{
    int rc = uv_tcp_bind(&s->listener, sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
    return rc;
}

int trn_store_server_start(const char *host, int port, double bind_timeout_s,
                           struct trn_store_server **out, char *err, size_t errlen)
{
    *out = NULL;
    struct sockaddr_storage ss;
    int rc = bind_addr(host, port, &ss, err, errlen);
    if (rc)
        return rc;
    struct trn_store_server *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    uint64_t seed = cddp_mono_ns() ^ ((uint64_t)getpid() << 32);
    s->store = proto_store_new(NULL, seed, seed * 0x9E3779B97F4A7C15ull);
    if (s->store == NULL || uv_loop_init(&s->loop) != 0) {
        proto_store_free(s->store);
        free(s);
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    cddp_queue_init(&s->conns);
    uint64_t deadline = cddp_mono_ns() + (uint64_t)(bind_timeout_s * 1e9);
    uint64_t backoff_ms = 50;
    for (;;) {
        uv_tcp_init(&s->loop, &s->listener);
        s->listener.data = s;
        rc = try_listen(s, (const struct sockaddr *)&ss);
        /* No IPv6 here: the IPv4 wildcard instead. */
        if ((rc == UV_EAFNOSUPPORT || rc == UV_EADDRNOTAVAIL) && ss.ss_family == AF_INET6 &&
            IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&ss)->sin6_addr)) {
            struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
            memset(&ss, 0, sizeof(ss));
            a4->sin_family = AF_INET;
            a4->sin_addr.s_addr = htonl(INADDR_ANY);
            a4->sin_port = htons((uint16_t)port);
            uv_close((uv_handle_t *)&s->listener, NULL);
            uv_run(&s->loop, UV_RUN_NOWAIT);
            continue;
        }
        if (rc != UV_EADDRINUSE || cddp_mono_ns() >= deadline)
            break;
        uv_close((uv_handle_t *)&s->listener, NULL);
        uv_run(&s->loop, UV_RUN_NOWAIT);
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)backoff_ms * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff_ms < 1000)
            backoff_ms *= 2;
    }
    if (rc != 0) {
        snprintf(err, errlen, "cannot serve the bootstrap store on %s:%d: %s%s", host, port,
                 uv_strerror(rc),
                 rc == UV_EADDRINUSE ? " (another process holds MASTER_PORT; with "
                                       "TORCHELASTIC_USE_AGENT_STORE=True the launcher does)"
                                     : "");
        uv_close((uv_handle_t *)&s->listener, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        proto_store_free(s->store);
        free(s);
        return rc == UV_EADDRINUSE ? CDDP_EEXISTS : CDDP_ERR_FROM_ERRNO(-rc);
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
    s->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                               : ((struct sockaddr_in6 *)&bound)->sin6_port);
    uv_timer_init(&s->loop, &s->timer);
    s->timer.data = s;
    uv_async_init(&s->loop, &s->stop, on_stop);
    s->stop.data = s;
    int prc = pthread_create(&s->thread, NULL, server_thread, s);
    if (prc != 0) {
        snprintf(err, errlen, "cannot start the bootstrap store thread: %s", strerror(prc));
        on_stop(&s->stop);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
        proto_store_free(s->store);
        free(s);
        return CDDP_ERR_FROM_ERRNO(prc);
    }
    log_info("T6021", "bootstrap store serving on %s:%d", host, s->port);
    *out = s;
    return 0;
}

int trn_store_server_port(const struct trn_store_server *s)
{
    return s->port;
}

void trn_store_server_stop(struct trn_store_server *s)
{
    if (s == NULL)
        return;
    uv_async_send(&s->stop);
    pthread_join(s->thread, NULL);
    uv_loop_close(&s->loop);
    proto_store_free(s->store);
    free(s);
}
