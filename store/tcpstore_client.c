/* tcpstore_client.c: a blocking TCPStore client; see tcpstore_client.h. */
#include "store/tcpstore_client.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/sock.h"
#include "common/strutil.h"
#include "store/tcpstore_wire.h"

/* How long a V1 server may take to answer the probe before the client
 * takes the silence for a torch 2.x server. */
#define PROBE_MS 2000
#define OP_TIMEOUT_MS 300000 /* options.op_timeout_s <= 0: torch's default store timeout */

struct tcpstore_client {
    int fd;
    enum tcpstore_dialect dialect;
    bool broken;
    bool cancel_waits;
    uint64_t op_ms;
    struct tcpstore_limits lim;
    struct cddp_buf out, in;
    char err[512];
};

static int fail(struct tcpstore_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct tcpstore_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
    return rc;
}

/* Sends what c->out holds. */
static int flush_out(struct tcpstore_client *c, uint64_t deadline)
{
    int rc = cddp_send_all(c->fd, c->out.data, c->out.len, deadline);
    if (rc == 0)
        cddp_buf_reset(&c->out);
    return rc;
}

/* Reads until one reply of shape is whole in c->in; *used: its bytes. */
static int read_reply(struct tcpstore_client *c, enum tcpstore_reply_shape shape, uint64_t deadline,
                      struct tcpstore_reply *r, size_t *used)
{
    for (;;) {
        size_t need = 0;
        int rc = tcpstore_decode_reply(&c->lim, shape, (const uint8_t *)c->in.data, c->in.len, r,
                                       used, &need);
        if (rc != TCPSTORE_MORE)
            return rc;
        char chunk[65536];
        ssize_t n = recv(c->fd, chunk, sizeof(chunk), 0);
        if (n > 0) {
            if ((rc = cddp_buf_append(&c->in, chunk, (size_t)n)) != 0)
                return rc;
            continue;
        }
        if (n == 0)
            return CDDP_ERR_FROM_ERRNO(ECONNRESET);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return CDDP_ERR_FROM_ERRNO(errno);
        if ((rc = cddp_wait_fd(c->fd, POLLIN, deadline)) != 0)
            return rc;
    }
}

/* Sends q and reads its reply (shape < 0: none); the reply's bytes stay in
 * c->in until the next call. */
static int roundtrip(struct tcpstore_client *c, const struct tcpstore_query *q, int shape,
                     uint64_t deadline, struct tcpstore_reply *r)
{
    if (c->broken) {
        char was[sizeof(c->err)];
        cddp_strlcpy(was, c->err, sizeof(was));
        return fail(c, CDDP_ECLOSED, "the store connection was lost earlier (%.400s)", was);
    }
    cddp_buf_reset(&c->in);
    int rc = tcpstore_encode_query(c->dialect, q, &c->out);
    if (rc) {
        cddp_buf_reset(&c->out);
        return fail(c, rc, "%s: the query does not fit (%s)", tcpstore_op_name((int)q->op),
                    cddp_strerror(rc));
    }
    rc = flush_out(c, deadline);
    size_t used = 0;
    if (rc == 0 && shape >= 0)
        rc = read_reply(c, (enum tcpstore_reply_shape)shape, deadline, r, &used);
    if (rc) {
        c->broken = true;
        return fail(c, rc, "%s: %s", tcpstore_op_name((int)q->op), cddp_strerror(rc));
    }
    return 0;
}

/* ---- the numbering ---- */

static int handshake_v2(struct tcpstore_client *c, uint64_t deadline)
{
    struct tcpstore_query q = {.op = TCPSTORE_VALIDATE, .u32 = TCPSTORE_MAGIC};
    struct tcpstore_reply r;
    int rc = roundtrip(c, &q, -1, deadline, &r);
    uint32_t nonce = (uint32_t)getpid() ^ (uint32_t)cddp_mono_ns();
    struct tcpstore_query ping = {.op = TCPSTORE_PING, .u32 = nonce};
    if (rc == 0)
        rc = roundtrip(c, &ping, TCPSTORE_REPLY_U32, deadline, &r);
    if (rc == 0 && r.u32 != nonce)
        rc = fail(c, CDDP_EPROTO_VERSION, "PING answered %u, not %u", r.u32, nonce);
    return rc;
}

static void close_fd(struct tcpstore_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->broken = false;
    cddp_buf_reset(&c->in);
    cddp_buf_reset(&c->out);
}

/* A V1 server answers GETNUMKEYS at once: that it answers is the check. */
static int check_v1(struct tcpstore_client *c, const char *host, int port, uint64_t deadline)
{
    c->dialect = TCPSTORE_DIALECT_V1;
    struct tcpstore_query q = {.op = TCPSTORE_GETNUMKEYS};
    struct tcpstore_reply r;
    int rc = roundtrip(c, &q, TCPSTORE_REPLY_I64, deadline, &r);
    if (rc) {
        char why[256];
        cddp_strlcpy(why, c->err, sizeof(why));
        return fail(c, rc, "%s port %d did not answer torch 1.13's TCPStore queries (%s)", host,
                    port, why);
    }
    return 0;
}

/* Connected: which numbering does the server speak? (dialect: the
 * caller's word for it, or UNKNOWN.) */
static int settle(struct tcpstore_client *c, const char *host, int port,
                  enum tcpstore_dialect dialect, uint64_t deadline)
{
    if (dialect == TCPSTORE_DIALECT_V1)
        return check_v1(c, host, port, deadline);
    if (dialect == TCPSTORE_DIALECT_V2) {
        c->dialect = TCPSTORE_DIALECT_V2;
        return handshake_v2(c, deadline);
    }
    c->dialect = TCPSTORE_DIALECT_V1;
    struct tcpstore_query q = {.op = TCPSTORE_GETNUMKEYS};
    struct tcpstore_reply r;
    uint64_t probe = cddp_mono_ms() + PROBE_MS;
    int rc = roundtrip(c, &q, TCPSTORE_REPLY_I64, probe < deadline ? probe : deadline, &r);
    if (rc == 0)
        return 0;
    close_fd(c);
    char why[256];
    rc = cddp_tcp_connect_once(host, port, deadline, &c->fd, why, sizeof(why));
    if (rc)
        return fail(c, rc, "%s", why);
    c->dialect = TCPSTORE_DIALECT_V2;
    rc = handshake_v2(c, deadline);
    cddp_strlcpy(why, c->err, sizeof(why));
    if (rc)
        return fail(c, rc,
                    "%s port %d answers neither torch 1.13's TCPStore queries nor torch 2.x's "
                    "handshake (%s)",
                    host, port, why);
    return 0;
}

int tcpstore_client_connect(const char *host, int port, const struct tcpstore_client_options *o,
                            struct tcpstore_client **out, char *err, size_t errlen)
{
    struct tcpstore_client_options none = {0};
    if (o == NULL)
        o = &none;
    double timeout_s = o->connect_timeout_s;
    struct tcpstore_client *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory");
    c->fd = -1;
    c->cancel_waits = o->cancel_waits;
    c->op_ms = o->op_timeout_s > 0 ? (uint64_t)(o->op_timeout_s * 1000.0) : OP_TIMEOUT_MS;
    c->lim = tcpstore_limits_resolve(NULL);
    cddp_buf_init(&c->out, c->lim.max_query);
    cddp_buf_init(&c->in, c->lim.max_query);
    uint64_t start = cddp_mono_ms();
    uint64_t deadline = start + (timeout_s > 0 ? (uint64_t)(timeout_s * 1000.0) : 1);
    int rc = cddp_tcp_connect(host, port, deadline, &c->fd, err, errlen);
    if (rc) {
        tcpstore_client_close(c);
        return rc;
    }
    if (o->dialect == TCPSTORE_DIALECT_UNKNOWN && deadline < start + PROBE_MS)
        deadline = start + PROBE_MS;
    if ((rc = settle(c, host, port, o->dialect, deadline))) {
        snprintf(err, errlen, "%s", c->err);
        tcpstore_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tcpstore_client_close(struct tcpstore_client *c)
{
    if (c == NULL)
        return;
    close_fd(c);
    cddp_buf_free(&c->in);
    cddp_buf_free(&c->out);
    free(c);
}

const char *tcpstore_client_dialect(const struct tcpstore_client *c)
{
    return c->dialect == TCPSTORE_DIALECT_V2 ? "V2 (torch 2.x)" : "V1 (torch <= 2.0)";
}

/* A WAIT that timed out here is still pending at the server: cancel it and
 * read up to the cancel's answer (WAIT_CANCELED), after the STOP_WAITING
 * of a wait that the key's arrival ended while the cancel was on its way.
 * 0 when the connection is in step again. */
static int cancel_wait(struct tcpstore_client *c)
{
    uint64_t deadline = cddp_mono_ms() + c->op_ms;
    struct tcpstore_query q = {.op = TCPSTORE_CANCEL_WAIT};
    cddp_buf_reset(&c->in);
    int rc = tcpstore_encode_query(c->dialect, &q, &c->out);
    if (rc == 0)
        rc = flush_out(c, deadline);
    for (int i = 0; rc == 0 && i < 2; i++) {
        struct tcpstore_reply r;
        size_t used = 0;
        if ((rc = read_reply(c, TCPSTORE_REPLY_U8, deadline, &r, &used)) != 0)
            break;
        cddp_buf_consume(&c->in, used);
        if (r.u8 == TCPSTORE_WAIT_CANCELED)
            return 0;
        if (r.u8 != TCPSTORE_WAIT_STOP_WAITING)
            break;
    }
    cddp_buf_reset(&c->out);
    return rc ? rc : CDDP_EPROTO_FIELD;
}

static struct tcpstore_bytes text(const char *s)
{
    return (struct tcpstore_bytes){(const uint8_t *)s, strlen(s)};
}

int tcpstore_client_set(struct tcpstore_client *c, const char *key, const void *val, size_t len)
{
    struct tcpstore_query q = {.op = TCPSTORE_SET, .key = text(key), .val = {val, len}};
    struct tcpstore_reply r;
    return roundtrip(c, &q, -1, cddp_mono_ms() + c->op_ms, &r);
}

int tcpstore_client_get(struct tcpstore_client *c, const char *key, double timeout_s, void **val,
                        size_t *len)
{
    struct tcpstore_bytes k = text(key);
    struct tcpstore_query w = {.op = TCPSTORE_WAIT, .nitems = 1, .keys = &k};
    struct tcpstore_reply r;
    uint64_t deadline = cddp_mono_ms() + (timeout_s > 0 ? (uint64_t)(timeout_s * 1000.0) : 1);
    int rc = roundtrip(c, &w, TCPSTORE_REPLY_U8, deadline, &r);
    if (rc == CDDP_ETIMEOUT && c->cancel_waits && cancel_wait(c) == 0)
        c->broken = false;
    if (rc == CDDP_ETIMEOUT)
        return fail(c, rc, "key '%s' was not set within %.1f s", key, timeout_s);
    if (rc)
        return rc;
    struct tcpstore_query g = {.op = TCPSTORE_GET, .key = k};
    if ((rc = roundtrip(c, &g, TCPSTORE_REPLY_BYTES, cddp_mono_ms() + c->op_ms, &r)) != 0)
        return rc;
    char *copy = malloc(r.val.n + 1);
    if (copy == NULL)
        return fail(c, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory for '%s'", key);
    if (r.val.n)
        memcpy(copy, r.val.p, r.val.n);
    copy[r.val.n] = '\0';
    *val = copy;
    *len = r.val.n;
    return 0;
}

int tcpstore_client_add(struct tcpstore_client *c, const char *key, int64_t delta, int64_t *out)
{
    struct tcpstore_query q = {.op = TCPSTORE_ADD, .key = text(key), .delta = delta};
    struct tcpstore_reply r;
    int rc = roundtrip(c, &q, TCPSTORE_REPLY_I64, cddp_mono_ms() + c->op_ms, &r);
    if (rc == 0)
        *out = r.i64;
    return rc;
}

int tcpstore_client_num_keys(struct tcpstore_client *c, int64_t *out)
{
    struct tcpstore_query q = {.op = TCPSTORE_GETNUMKEYS};
    struct tcpstore_reply r;
    int rc = roundtrip(c, &q, TCPSTORE_REPLY_I64, cddp_mono_ms() + c->op_ms, &r);
    if (rc == 0)
        *out = r.i64;
    return rc;
}

const char *tcpstore_client_last_error(const struct tcpstore_client *c)
{
    return c->err;
}
