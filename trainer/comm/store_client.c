/*
 * store_client.c: the blocking bootstrap-store client; see store_client.h.
 *
 * One request at a time: encode, write with a deadline, read frames until
 * the reply arrives with a deadline. The server answers a get that waits
 * when the key is set or when the wait's own timeout passes; the client
 * allows a few seconds beyond that before it gives up on a silent server.
 */
#include "trainer/comm/store_client.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/strutil.h"
#include "proto/frame.h"
#include "proto/msg.h"

/* How long past a request's own timeout a silent server is waited for. */
#define REPLY_SLACK_NS (10ull * 1000000000ull)
#define OP_TIMEOUT_NS (60ull * 1000000000ull) /* requests that do not wait */

struct trn_store_client {
    struct trn_kv kv; /* first: the kv ops get this pointer */
    int fd;
    uint64_t next_id;
    char endpoint[272]; /* host:port, IPv6 in brackets */
    struct proto_decoder dec;
    struct proto_msg reply;
    bool have_reply;
    int reply_rc;
    char reply_err[256];
};

static int remaining_ms(uint64_t deadline)
{
    uint64_t now = cddp_mono_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999u) / 1000000u;
    return ms > 60000 ? 60000 : (int)ms; /* poll again at least each minute */
}

/* One attempt at a TCP connection to any of host's addresses. */
static int connect_once(const char *host, int port, uint64_t deadline, int *fd_out, char *why,
                        size_t whylen)
{
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        snprintf(why, whylen, "cannot resolve '%s': %s", host, gai_strerror(gai));
        return CDDP_ENOTFOUND;
    }
    int rc = CDDP_ENOTFOUND;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
            rc = -errno;
            close(fd);
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int pr;
        do {
            pr = poll(&p, 1, remaining_ms(deadline));
        } while (pr < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (pr == 0)
            soerr = ETIMEDOUT;
        else if (pr < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
            soerr = errno;
        if (soerr == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            *fd_out = fd;
            freeaddrinfo(res);
            return 0;
        }
        rc = -soerr;
        close(fd);
    }
    freeaddrinfo(res);
    snprintf(why, whylen, "%s", cddp_strerror(rc));
    return rc;
}

static int write_all(struct trn_store_client *c, const char *p, size_t n, uint64_t deadline)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store at %s: send: %s", c->endpoint,
                     strerror(errno));
            return -errno;
        }
        struct pollfd p1 = {.fd = c->fd, .events = POLLOUT};
        int ms = remaining_ms(deadline);
        if (ms == 0 || (poll(&p1, 1, ms) == 0 && remaining_ms(deadline) == 0)) {
            snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store at %s: send timed out",
                     c->endpoint);
            return CDDP_ETIMEOUT;
        }
    }
    return 0;
}

static int on_frame(void *arg, const char *payload, size_t len)
{
    struct trn_store_client *c = arg;
    if (c->have_reply) {
        c->reply_rc = CDDP_ESTATE;
        snprintf(c->reply_err, sizeof(c->reply_err), "unexpected extra message");
        return 1;
    }
    c->reply_rc = proto_msg_decode(payload, len, &c->reply, c->reply_err, sizeof(c->reply_err));
    c->have_reply = c->reply_rc == 0;
    return c->reply_rc ? 1 : 0;
}

/* Sends m and reads the one reply into c->reply. 0: the caller frees the
 * reply (proto_msg_free); on error there is no reply to free. */
static int request(struct trn_store_client *c, const struct proto_msg *m, uint64_t deadline)
{
    struct cddp_buf out;
    cddp_buf_init(&out, PROTO_FRAME_MAX + PROTO_FRAME_HEADER);
    int rc = proto_msg_encode(m, &out);
    if (rc == 0)
        rc = write_all(c, out.data, out.len, deadline);
    else
        snprintf(c->kv.err, sizeof(c->kv.err), "cannot encode a %s request: %s",
                 proto_type_name(m->type), cddp_strerror(rc));
    cddp_buf_free(&out);
    if (rc)
        return rc;
    c->have_reply = false;
    c->reply_rc = 0;
    while (!c->have_reply) {
        char buf[16384];
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            rc = proto_decoder_feed(&c->dec, buf, (size_t)n, on_frame, c);
            if (rc != 0) {
                if (c->have_reply)
                    proto_msg_free(&c->reply);
                c->have_reply = false;
                snprintf(c->kv.err, sizeof(c->kv.err),
                         "%s did not answer as a cddp bootstrap store (%s)", c->endpoint,
                         c->reply_rc ? c->reply_err : cddp_strerror(rc));
                return c->reply_rc ? c->reply_rc : rc;
            }
            continue;
        }
        if (n == 0) {
            snprintf(c->kv.err, sizeof(c->kv.err),
                     "the bootstrap store at %s closed the connection (did rank 0 exit?)",
                     c->endpoint);
            return CDDP_EPEER;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN) {
            snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store at %s: %s", c->endpoint,
                     strerror(errno));
            return -errno;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int ms = remaining_ms(deadline);
        if (ms == 0 || (poll(&p, 1, ms) == 0 && remaining_ms(deadline) == 0)) {
            snprintf(c->kv.err, sizeof(c->kv.err),
                     "no answer from the bootstrap store at %s within the deadline", c->endpoint);
            return CDDP_ETIMEOUT;
        }
    }
    if (c->reply.type == PROTO_ERROR) {
        rc = c->reply.error.code ? c->reply.error.code : CDDP_EPEER;
        snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store at %s refused a %s: %s",
                 c->endpoint, proto_type_name(m->type),
                 c->reply.error.message ? c->reply.error.message : cddp_strerror(rc));
        proto_msg_free(&c->reply);
        c->have_reply = false;
        return rc;
    }
    return 0;
}

/* A RESULT reply to request id: its code (message into kv.err), or a protocol error. */
static int result_code(struct trn_store_client *c, uint64_t id, const char *op, const char *key)
{
    if (c->reply.type != PROTO_RESULT || c->reply.id != id) {
        snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store at %s: unexpected %s reply to %s",
                 c->endpoint, proto_type_name(c->reply.type), op);
        return CDDP_EPEER;
    }
    int rc = c->reply.result.code;
    if (rc != 0)
        snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store %s '%s': %s", op, key,
                 c->reply.result.message ? c->reply.result.message : cddp_strerror(rc));
    return rc;
}

static int kv_set(struct trn_kv *kv, const char *key, const void *val, size_t len)
{
    struct trn_store_client *c = (struct trn_store_client *)kv;
    struct proto_msg m = {.type = PROTO_SET, .id = ++c->next_id};
    m.set.key = key;
    m.set.value.data = val;
    m.set.value.len = len;
    int rc = request(c, &m, cddp_mono_ns() + OP_TIMEOUT_NS);
    if (rc)
        return rc;
    rc = result_code(c, m.id, "set", key);
    proto_msg_free(&c->reply);
    return rc;
}

static int kv_get(struct trn_kv *kv, const char *key, double timeout_s, void **val, size_t *len)
{
    struct trn_store_client *c = (struct trn_store_client *)kv;
    struct proto_msg m = {.type = PROTO_GET, .id = ++c->next_id};
    m.get.key = key;
    m.get.timeout_ms = (int64_t)(timeout_s * 1000.0);
    int rc = request(c, &m, cddp_mono_ns() + (uint64_t)(timeout_s * 1e9) + REPLY_SLACK_NS);
    if (rc)
        return rc;
    rc = result_code(c, m.id, "get", key);
    if (rc == 0 && !c->reply.result.has_value) {
        snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store get '%s': reply without a value",
                 key);
        rc = CDDP_EPEER;
    }
    if (rc == CDDP_ETIMEOUT)
        snprintf(c->kv.err, sizeof(c->kv.err),
                 "key '%s' was not set within %.1f s (bootstrap store at %s)", key, timeout_s,
                 c->endpoint);
    if (rc == 0) {
        size_t n = c->reply.result.value.len;
        *val = malloc(n ? n : 1);
        if (*val == NULL) {
            rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
        } else {
            memcpy(*val, c->reply.result.value.data, n);
            *len = n;
        }
    }
    proto_msg_free(&c->reply);
    return rc;
}

static int kv_add(struct trn_kv *kv, const char *key, long delta, long *out)
{
    struct trn_store_client *c = (struct trn_store_client *)kv;
    struct proto_msg m = {.type = PROTO_ADD, .id = ++c->next_id};
    m.add.key = key;
    m.add.delta = delta;
    int rc = request(c, &m, cddp_mono_ns() + OP_TIMEOUT_NS);
    if (rc)
        return rc;
    rc = result_code(c, m.id, "add", key);
    if (rc == 0 && !c->reply.result.has_number) {
        snprintf(c->kv.err, sizeof(c->kv.err), "bootstrap store add '%s': reply without a number",
                 key);
        rc = CDDP_EPEER;
    }
    if (rc == 0)
        *out = (long)c->reply.result.number;
    proto_msg_free(&c->reply);
    return rc;
}

static const struct trn_kv_ops client_ops = {kv_set, kv_get, kv_add};

struct trn_kv *trn_store_client_kv(struct trn_store_client *c)
{
    return &c->kv;
}

int trn_store_client_connect(const char *host, int port, double timeout_s, const char *who,
                             struct trn_store_client **out, char *err, size_t errlen)
{
    *out = NULL;
    struct trn_store_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    c->kv.ops = &client_ops;
    c->fd = -1;
    cddp_hostport_format(host, port, c->endpoint, sizeof(c->endpoint));
    proto_decoder_init(&c->dec, PROTO_FRAME_MAX);

    uint64_t t0 = cddp_mono_ns();
    uint64_t deadline = t0 + (uint64_t)(timeout_s * 1e9);
    uint64_t backoff_ms = 50;
    int attempts = 0;
    char why[256] = "no attempt";
    int rc;
    for (;;) {
        attempts++;
        /* Each attempt may use the whole remaining time (a SYN into the void). */
        rc = connect_once(host, port, deadline, &c->fd, why, sizeof(why));
        if (rc == 0)
            break;
        uint64_t now = cddp_mono_ns();
        if (now >= deadline)
            break;
        uint64_t left_ms = (deadline - now) / 1000000u;
        uint64_t nap = backoff_ms < left_ms ? backoff_ms : left_ms;
        struct timespec ts = {.tv_sec = (time_t)(nap / 1000),
                              .tv_nsec = (long)(nap % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff_ms < 1000)
            backoff_ms *= 2;
    }
    if (rc != 0) {
        snprintf(err, errlen,
                 "cannot reach the bootstrap store at %s within %.1f s (%d attempts, last: %s); "
                 "is rank 0 running, and are MASTER_ADDR and MASTER_PORT right?",
                 c->endpoint, (double)(cddp_mono_ns() - t0) * 1e-9, attempts, why);
        trn_store_client_close(c);
        return CDDP_ETIMEOUT;
    }

    struct proto_msg hello = {.type = PROTO_HELLO};
    hello.hello.run_id = "";
    hello.hello.client = who;
    rc = request(c, &hello,
                 deadline > cddp_mono_ns() + 1000000000u ? deadline : cddp_mono_ns() + 1000000000u);
    if (rc == 0) {
        if (c->reply.type != PROTO_WELCOME) {
            snprintf(c->kv.err, sizeof(c->kv.err), "it answered hello with %s",
                     proto_type_name(c->reply.type));
            rc = CDDP_EPEER;
        }
        proto_msg_free(&c->reply);
    }
    if (rc != 0) {
        snprintf(err, errlen, "%s is not a cddp bootstrap store, or it did not answer: %s",
                 c->endpoint, c->kv.err);
        trn_store_client_close(c);
        return rc;
    }
    log_debug("T6030", "connected to the bootstrap store at %s after %d attempt(s)", c->endpoint,
              attempts);
    *out = c;
    return 0;
}

void trn_store_client_close(struct trn_store_client *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    proto_decoder_free(&c->dec);
    free(c);
}
