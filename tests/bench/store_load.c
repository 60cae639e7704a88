/*
 * store_load.c: a load generator speaking PyTorch's TCPStore wire protocol
 * (torch 1.13's numbering, V1, which cddp's server and torch 1.13's both
 * serve), for tests/bench/bench_store.py. The bytes are
 * store/tcpstore_wire.h's; this file adds N non-blocking connections on one
 * epoll loop.
 *
 *     store-load --port P [--host 127.0.0.1] --clients N --op OP --seconds S [--value-bytes B]
 *     store-load --port P [--host 127.0.0.1] --barrier N [--seconds TIMEOUT]
 *
 * OP: each client, closed loop (one query in flight), on a key of its own
 * that it set before the clock starts:
 *     set   SET k_i v, then CHECK [k_i] (SET has no reply; the CHECK's closes the loop)
 *     get   GET k_i
 *     add   ADD a_i 1
 *     wait  WAIT [k_i] (present: answered at once)
 * Prints one JSON line: ops, seconds, ops_per_s, p50_us, p99_us, max_us.
 *
 * --barrier N: N simulated ranks, one connection each, all connected
 * first; then each does torch's store barrier
 * (torch/distributed/elastic/utils/store.py): ADD count 1; the rank that
 * makes it N sets "last"; every rank WAITs for "last". Prints the time from
 * the first ADD to the last WAIT answered (and the connect time).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/strutil.h"
#include "store/tcpstore_wire.h"

enum op { OP_SET, OP_GET, OP_ADD, OP_WAIT };

struct conn {
    int fd;
    int i;
    bool connected;
    int stage; /* barrier: 0 connected, 1 ADD sent, 2 WAIT sent, 3 done; load: 0 setup, 1 running */
    enum tcpstore_reply_shape expect;
    struct cddp_buf out, in;
    long long t0;
    char key[32], akey[32];
};

static struct sockaddr_in addr;
static int ep;
static struct tcpstore_limits lim;
static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static void watch(struct conn *c, bool out, int how)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(ep, how, c->fd, &ev) != 0)
        die("epoll_ctl");
}

static void open_conn(struct conn *c)
{
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket");
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 && errno != EINPROGRESS)
        die("connect");
    c->connected = false;
    watch(c, true, EPOLL_CTL_ADD);
}

/* Queues one query (V1 numbering). */
static void query(struct conn *c, enum tcpstore_op op, const char *key, const char *val,
                  size_t vlen, int64_t delta)
{
    struct tcpstore_bytes k = {(const uint8_t *)key, strlen(key)};
    struct tcpstore_query q = {.op = op, .key = k, .delta = delta};
    if (val)
        q.val = (struct tcpstore_bytes){(const uint8_t *)val, vlen};
    if (op == TCPSTORE_CHECK || op == TCPSTORE_WAIT) {
        q.nitems = 1;
        q.keys = &k;
    }
    if (tcpstore_encode_query(TCPSTORE_DIALECT_V1, &q, &c->out) != 0) {
        fprintf(stderr, "store-load: encoding a query failed\n");
        exit(1);
    }
}

static void flush(struct conn *c)
{
    while (c->out.len > 0) {
        ssize_t n = send(c->fd, c->out.data, c->out.len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n < 0)
            die("send");
        cddp_buf_consume(&c->out, (size_t)n);
    }
    watch(c, c->out.len > 0, EPOLL_CTL_MOD);
}

/* The next reply, when it is complete. */
static bool take_reply(struct conn *c, struct tcpstore_reply *r)
{
    size_t used = 0, need = 0;
    int rc = tcpstore_decode_reply(&lim, c->expect, (const uint8_t *)c->in.data, c->in.len, r,
                                   &used, &need);
    if (rc == TCPSTORE_MORE)
        return false;
    if (rc != 0) {
        fprintf(stderr, "store-load: a reply that does not decode (%d)\n", rc);
        exit(1);
    }
    cddp_buf_consume(&c->in, used);
    return true;
}

static bool read_in(struct conn *c)
{
    char buf[65536];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return true;
        if (n <= 0) {
            fprintf(stderr, "store-load: client %d: the server closed the connection\n", c->i);
            exit(1);
        }
        if (cddp_buf_append(&c->in, buf, (size_t)n) != 0)
            die("buffer");
    }
}

/* A connect finished: true when it worked, false to retry (backlog full). */
static bool connect_done(struct conn *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) {
        c->connected = true;
        return true;
    }
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    open_conn(c);
    return false;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static struct conn *conns;
static int nconns;

/* Connects every client, at most 64 connects in flight (a slow acceptor's
 * backlog overflows otherwise). Returns seconds. */
static double connect_all(void)
{
    long long t0 = now_ns();
    int started = 0, up = 0, inflight = 0;
    struct epoll_event evs[256];
    while (up < nconns) {
        while (started < nconns && inflight < 64) {
            open_conn(&conns[started++]);
            inflight++;
        }
        int n = epoll_wait(ep, evs, 256, 1000);
        for (int k = 0; k < n; k++) {
            struct conn *c = evs[k].data.ptr;
            if (c->connected || !(evs[k].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
                continue;
            if (connect_done(c)) {
                up++;
                inflight--;
                watch(c, false, EPOLL_CTL_MOD);
            }
        }
    }
    return (double)(now_ns() - t0) / 1e9;
}

/* One turn of the loop: sends what is queued, reads what came, and hands
 * every complete reply to on_reply (while want(c) says one is expected). */
static void pump(int timeout_ms, void (*on_reply)(struct conn *c, const struct tcpstore_reply *r),
                 bool (*want)(const struct conn *c))
{
    struct epoll_event evs[512];
    int n = epoll_wait(ep, evs, 512, timeout_ms);
    for (int k = 0; k < n; k++) {
        struct conn *c = evs[k].data.ptr;
        if (evs[k].events & EPOLLOUT)
            flush(c);
        if (!(evs[k].events & EPOLLIN))
            continue;
        read_in(c);
        struct tcpstore_reply r;
        while (want(c) && take_reply(c, &r))
            on_reply(c, &r);
    }
}

/* The barrier's keys (of this run only: a server may have served an earlier one). */
static char bar_count[64], bar_last[64];
static int bar_done;

static bool bar_want(const struct conn *c)
{
    return c->stage < 3;
}

static void bar_reply(struct conn *c, const struct tcpstore_reply *r)
{
    if (c->stage == 1) {
        if (r->i64 == nconns)
            query(c, TCPSTORE_SET, bar_last, "1", 1, 0);
        query(c, TCPSTORE_WAIT, bar_last, NULL, 0, 0);
        c->expect = TCPSTORE_REPLY_U8;
        c->stage = 2;
        flush(c);
    } else {
        c->stage = 3;
        bar_done++;
    }
}

static int run_barrier(double timeout_s)
{
    double conn_s = connect_all();
    snprintf(bar_count, sizeof(bar_count), "/barrier/%d/count", (int)getpid());
    snprintf(bar_last, sizeof(bar_last), "/barrier/%d/last", (int)getpid());
    long long t0 = now_ns();
    for (int i = 0; i < nconns; i++) {
        struct conn *c = &conns[i];
        query(c, TCPSTORE_ADD, bar_count, NULL, 0, 1);
        c->expect = TCPSTORE_REPLY_I64;
        c->stage = 1;
        flush(c);
    }
    while (bar_done < nconns) {
        if ((double)(now_ns() - t0) / 1e9 > timeout_s) {
            fprintf(stderr, "store-load: the barrier did not complete in %g s (%d of %d)\n",
                    timeout_s, bar_done, nconns);
            return 1;
        }
        pump(100, bar_reply, bar_want);
    }
    double s = (double)(now_ns() - t0) / 1e9;
    printf("{\"barrier\":%d,\"connect_s\":%.4f,\"barrier_s\":%.4f}\n", nconns, conn_s, s);
    return 0;
}

static void send_op(struct conn *c, enum op op, const char *val, size_t vlen)
{
    switch (op) {
    case OP_SET:
        query(c, TCPSTORE_SET, c->key, val, vlen, 0);
        query(c, TCPSTORE_CHECK, c->key, NULL, 0, 0);
        c->expect = TCPSTORE_REPLY_U8;
        break;
    case OP_GET:
        query(c, TCPSTORE_GET, c->key, NULL, 0, 0);
        c->expect = TCPSTORE_REPLY_BYTES;
        break;
    case OP_ADD:
        query(c, TCPSTORE_ADD, c->akey, NULL, 0, 1);
        c->expect = TCPSTORE_REPLY_I64;
        break;
    case OP_WAIT:
        query(c, TCPSTORE_WAIT, c->key, NULL, 0, 0);
        c->expect = TCPSTORE_REPLY_U8;
        break;
    }
    c->t0 = now_ns();
    flush(c);
}

/* The load run's state, for its reply handler. */
static struct {
    enum op op;
    const char *val;
    size_t vbytes;
    double seconds;
    int ready;
    long long ops, t_start, t_end;
    uint32_t *lat;
    size_t nlat, cap;
} L;

static bool load_want(const struct conn *c)
{
    (void)c;
    return true;
}

static void load_reply(struct conn *c, const struct tcpstore_reply *r)
{
    (void)r;
    long long t = now_ns();
    if (c->stage == 0) {
        c->stage = 1;
        if (++L.ready == nconns) {
            L.t_start = t;
            L.t_end = t + (long long)(L.seconds * 1e9);
            for (int i = 0; i < nconns; i++)
                send_op(&conns[i], L.op, L.val, L.vbytes);
        }
        return;
    }
    if (t < L.t_end) {
        L.ops++;
        if (L.nlat < L.cap)
            L.lat[L.nlat++] = (uint32_t)((t - c->t0) / 1000);
        send_op(c, L.op, L.val, L.vbytes);
    }
}

static int run_load(enum op op, double seconds, size_t vbytes)
{
    char *val = malloc(vbytes + 1);
    L.cap = 1u << 24;
    L.lat = malloc(L.cap * sizeof(*L.lat));
    if (val == NULL || L.lat == NULL)
        die("malloc");
    memset(val, 'v', vbytes);
    L.op = op;
    L.val = val;
    L.vbytes = vbytes;
    L.seconds = seconds;
    connect_all();
    /* Setup, off the clock: every key exists (SET, then a GET proves it). */
    for (int i = 0; i < nconns; i++) {
        struct conn *c = &conns[i];
        query(c, TCPSTORE_SET, c->key, val, vbytes, 0);
        query(c, TCPSTORE_GET, c->key, NULL, 0, 0);
        c->expect = TCPSTORE_REPLY_BYTES;
        c->stage = 0;
        flush(c);
    }
    while (!L.t_start || now_ns() < L.t_end)
        pump(100, load_reply, load_want);
    double s = (double)(L.t_end - L.t_start) / 1e9;
    qsort(L.lat, L.nlat, sizeof(*L.lat), cmp_u32);
    size_t n = L.nlat;
    uint32_t p50 = n ? L.lat[n / 2] : 0, p99 = n ? L.lat[n * 99 / 100] : 0;
    uint32_t mx = n ? L.lat[n - 1] : 0;
    static const char *const names[] = {"set", "get", "add", "wait"};
    printf("{\"op\":\"%s\",\"clients\":%d,\"ops\":%lld,\"seconds\":%.3f,\"ops_per_s\":%.0f,"
           "\"p50_us\":%u,\"p99_us\":%u,\"max_us\":%u}\n",
           names[op], nconns, L.ops, s, (double)L.ops / s, p50, p99, mx);
    free(L.lat);
    free(val);
    return 0;
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    long port = 0, clients = 1, barrier = 0, vbytes = 32;
    double seconds = 3;
    int op = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        int rc = 0;
        if (strcmp(k, "--host") == 0)
            host = v;
        else if (strcmp(k, "--port") == 0)
            rc = cddp_parse_long(v, 1, 65535, &port);
        else if (strcmp(k, "--clients") == 0)
            rc = cddp_parse_long(v, 1, 1000000, &clients);
        else if (strcmp(k, "--barrier") == 0)
            rc = cddp_parse_long(v, 1, 1000000, &barrier);
        else if (strcmp(k, "--value-bytes") == 0)
            rc = cddp_parse_long(v, 0, 1 << 26, &vbytes);
        else if (strcmp(k, "--seconds") == 0)
            rc = cddp_parse_double(v, 0.01, 3600, &seconds);
        else if (strcmp(k, "--op") == 0)
            op = strcmp(v, "set") == 0    ? OP_SET
                 : strcmp(v, "get") == 0  ? OP_GET
                 : strcmp(v, "add") == 0  ? OP_ADD
                 : strcmp(v, "wait") == 0 ? OP_WAIT
                                          : -2;
        else
            rc = -1;
        if (rc != 0 || op == -2) {
            fprintf(stderr, "store-load: bad argument %s %s\n", k, v);
            return 2;
        }
    }
    if (port == 0 || (barrier == 0 && op < 0)) {
        fprintf(stderr, "usage: store-load --port P [--host H] (--clients N --op set|get|add|wait "
                        "--seconds S [--value-bytes B] | --barrier N [--seconds TIMEOUT])\n");
        return 2;
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "store-load: --host %s is not an IPv4 address\n", host);
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    lim = tcpstore_limits_resolve(NULL);
    ep = epoll_create1(EPOLL_CLOEXEC);
    nconns = (int)(barrier ? barrier : clients);
    conns = calloc((size_t)nconns, sizeof(*conns));
    if (ep < 0 || conns == NULL)
        die("setup");
    for (int i = 0; i < nconns; i++) {
        conns[i].i = i;
        cddp_buf_init(&conns[i].out, (size_t)1 << 28);
        cddp_buf_init(&conns[i].in, (size_t)1 << 28);
        snprintf(conns[i].key, sizeof(conns[i].key), "/k%d", i);
        snprintf(conns[i].akey, sizeof(conns[i].akey), "/a%d", i);
    }
    int rc = barrier ? run_barrier(seconds > 3 ? seconds : 30) : run_load(op, seconds, vbytes);
    for (int i = 0; i < nconns; i++) {
        close(conns[i].fd);
        cddp_buf_free(&conns[i].out);
        cddp_buf_free(&conns[i].in);
    }
    free(conns);
    close(ep);
    return rc;
}
