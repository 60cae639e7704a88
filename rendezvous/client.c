/* client.c: see client.h. The connection, membership (join, resume, leave,
 * close) and the matching of results to requests; the store calls and the
 * exit barrier, made of requests, are client_kv.c's.
 *
 * Connection life: resolve (uv_getaddrinfo) -> try each address -> on
 * failure back off (10 ms doubling to 1 s, with jitter) and resolve again,
 * until the deadline: connect_timeout for the first connection; after a
 * connection that was welcomed is lost, reconnect_timeout from the loss.
 * Frames written before the connection is up wait in outq and follow the
 * hello (after a loss: they follow the welcome, and the resume or the
 * repeated join that goes first). Store requests are matched to results by
 * id; the join is the one outstanding membership request.
 *
 * Silence: the watch timer gives the server read_timeout to answer hello,
 * and, when it answers heartbeats (welcome's heartbeat_ack), read_timeout
 * (at least two heartbeat periods) between any two frames; past that the
 * connection counts as lost, as if it had broken. */
#include "rendezvous/client.h"
#include "rendezvous/client_request.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/queue.h"
#include "common/strutil.h"
#include "config.h"
#include "proto/frame.h"
#include "rendezvous/wire.h"

enum cstate { C_CONNECTING, C_CONNECTED, C_DEAD };

struct req {
    struct cddp_queue link;
    uint64_t id;
    rdzv_store_cb cb;
    void *arg;
};

struct rdzv_client {
    uv_loop_t *loop;
    uv_tcp_t tcp;
    uv_timer_t backoff_timer;
    uv_timer_t beat;
    uv_timer_t watch; /* silence: see the top of the file */
    uv_connect_t connect_req;
    uv_getaddrinfo_t gai;
    enum cstate state;
    bool tcp_open;  /* tcp initialised and not yet closed */
    bool resolving; /* gai in flight */
    struct addrinfo *ai, *ai_next;
    struct addrinfo numeric; /* the endpoint when it is an IP literal */
    struct sockaddr_storage numeric_addr;
    uint64_t connect_deadline;
    uint64_t connect_ms;         /* the budget the deadline was set with (messages) */
    struct cddp_backoff backoff; /* 10 ms doubling to 1 s */
    unsigned seed;

    /* The connection and its server. */
    bool hold;               /* frames go to outq: not connected, or reconnected and not welcomed */
    bool welcomed;           /* this connection got its welcome */
    bool ever_welcomed;      /* some connection did: a lost one is reconnected */
    bool final;              /* the server refused us or closed the run: no reconnecting */
    bool server_acks;        /* it answers heartbeats */
    bool server_resume;      /* it understands resume */
    bool server_generations; /* it understands replace */
    bool server_replace_ranks; /* ... and replace's ranks */
    bool suspect;              /* the watch found read_timeout of silence; one more loop turn */
    uint64_t last_rx;          /* loop time of the last bytes from the server */
    uint64_t silence_ms;
    uint64_t reconnect_ms;
    bool reconnecting; /* since a loss, until the next welcome */
    unsigned reconnects;
    char lost_why[256];
    bool in_round;      /* a round was given and no restart since: a lost connection resumes */
    uint64_t resume_id; /* the resume request in flight; 0: none */
    int64_t waiting;    /* the run's wait list as the server last said; -1: unknown */
    int64_t restart_count;
    bool has_perf; /* rdzv_client_set_perf: sent with every heartbeat */
    struct proto_perf perf;
    bool (*goodput)(void *arg, struct proto_goodput *out); /* rdzv_client_set_goodput */
    void *goodput_arg;

    /* What the agent's keep-alive watch asks (rdzv_client_quiet_ms). */
    uint64_t last_heard;    /* loop time of the host's last answer: bytes, a reset, a refusal */
    bool refused;           /* the last connect attempt was refused: host there, server not */
    bool error_from_server; /* the ERROR being reported is the server's own message */

    char *host, *run_id, *node_id, *local_addr, *hostname;
    int port, nproc, min_nodes, max_nodes;
    struct rdzv_conf conf;

    struct cddp_buf outq;
    struct proto_decoder dec;
    struct cddp_queue reqs;
    uint64_t next_id;

    bool joining;
    rdzv_join_cb join_cb;
    void *join_arg;
    int join_port;      /* its master_port */
    int status_port;    /* the agent's, told in every join */
    bool join_queued;   /* the join waits in outq */
    bool join_resend;   /* it went out on a connection since lost */
    bool error_to_join; /* the last ERROR went to a join callback */
    bool has_round;
    struct proto_round round;
    char round_run_id[PROTO_MAX_ID + 1];
    char round_master[256];
    char round_replaced[PROTO_MAX_REPLACED + 1];

    rdzv_event_cb on_event;
    void *data;
    char last_error[512];

    bool closing;
    int open_handles;
    void (*close_cb)(void *arg);
    void *close_arg;
};

static void client_fail(struct rdzv_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void connection_lost(struct rdzv_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void start_resolve(struct rdzv_client *c);
static void backoff(struct rdzv_client *c);
static void try_next_address(struct rdzv_client *c);

/* ---- small helpers ---- */

/* Formats through a copy: callers may pass last_error itself as an argument. */
static void set_error(struct rdzv_client *c, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void set_error(struct rdzv_client *c, const char *fmt, va_list ap)
{
    char msg[sizeof(c->last_error)];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    memcpy(c->last_error, msg, sizeof(msg));
}

static void maybe_free(struct rdzv_client *c)
{
    if (!c->closing || c->open_handles > 0 || c->resolving)
        return;
    void (*cb)(void *) = c->close_cb;
    void *arg = c->close_arg;
    if (c->ai)
        uv_freeaddrinfo(c->ai);
    cddp_buf_free(&c->outq);
    proto_decoder_free(&c->dec);
    free(c->host);
    free(c->run_id);
    free(c->node_id);
    free(c->local_addr);
    free(c->hostname);
    free(c);
    if (cb)
        cb(arg);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct rdzv_client *c = h->data;
    if (h == (uv_handle_t *)&c->tcp)
        c->tcp_open = false;
    c->open_handles--;
    if (c->closing) {
        maybe_free(c);
        return;
    }
    /* A failed attempt's handle is closed: try the next address. */
    if (h == (uv_handle_t *)&c->tcp && c->state == C_CONNECTING)
        try_next_address(c);
}

static void close_tcp(struct rdzv_client *c)
{
    if (c->tcp_open && !uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

/* Pending requests fail with code (message: why). */
static void fail_requests(struct rdzv_client *c, int code, const char *why)
{
    struct rdzv_store_result r = {.message = why};
    while (!cddp_queue_empty(&c->reqs)) {
        struct req *q = cddp_queue_data(cddp_queue_head(&c->reqs), struct req, link);
        cddp_queue_remove(&q->link);
        q->cb(c, code, &r, q->arg);
        free(q);
    }
}

/* Pending store requests and the join fail with code (no events). */
static void fail_pending(struct rdzv_client *c, int code)
{
    fail_requests(c, code, c->last_error);
    if (c->joining) {
        c->joining = false;
        c->join_cb(c, code, NULL, c->join_arg);
    }
}

/* The connection is gone for good. One notification: the join callback if
 * a join is outstanding, else event ERROR (unless the server's error was
 * just given to a join). */
static void client_fail(struct rdzv_client *c, int code, const char *fmt, ...)
{
    if (c->state == C_DEAD)
        return;
    /* Keep the server's reason when it was already given to a join. */
    if (!c->error_to_join) {
        va_list ap;
        va_start(ap, fmt);
        set_error(c, fmt, ap);
        va_end(ap);
    }
    c->state = C_DEAD;
    uv_timer_stop(&c->beat);
    uv_timer_stop(&c->watch);
    uv_timer_stop(&c->backoff_timer);
    close_tcp(c);
    bool notify = !c->joining && !c->error_to_join;
    fail_pending(c, code);
    if (notify && !c->closing && c->on_event) {
        struct rdzv_event ev = {.kind = RDZV_EV_ERROR, .code = code, .message = c->last_error};
        ev.from_server = c->error_from_server;
        c->on_event(c, &ev, c->data);
    }
}

static void emit(struct rdzv_client *c, const struct rdzv_event *ev)
{
    if (c->on_event && !c->closing)
        c->on_event(c, ev, c->data);
}

/* The connection broke (closed or reset by the server, or silent for too
 * long) without the server having said why: reconnect, unless the server
 * had refused us or closed the run, or the time for it has run out. */
static void connection_lost(struct rdzv_client *c, int code, const char *fmt, ...)
{
    if (c->state == C_DEAD || c->closing)
        return;
    char why[sizeof(c->lost_why)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (c->final) {
        client_fail(c, code, "%s", why);
        return;
    }
    uv_timer_stop(&c->beat);
    uv_timer_stop(&c->watch);
    close_tcp(c); /* on_handle_closed tries the next address, then backs off */
    c->state = C_CONNECTING;
    c->hold = true;
    c->welcomed = false;
    c->suspect = false;
    c->resume_id = 0;
    if (c->joining && !c->join_queued)
        c->join_resend = true;
    snprintf(c->last_error, sizeof(c->last_error), "%s", why);
    bool first = c->ever_welcomed && !c->reconnecting;
    if (first) {
        /* A connection that worked: try again for reconnect_timeout. */
        c->reconnecting = true;
        c->connect_ms = c->reconnect_ms;
        c->connect_deadline = uv_now(c->loop) + c->reconnect_ms;
        cddp_backoff_reset(&c->backoff);
        cddp_strlcpy(c->lost_why, why, sizeof(c->lost_why));
    }
    /* What was asked on the lost connection is not coming back. */
    fail_requests(c, CDDP_ERR_FROM_ERRNO(ECONNRESET), why);
    if (first && c->state == C_CONNECTING) {
        struct rdzv_event ev = {.kind = RDZV_EV_DISCONNECTED, .code = code, .message = why};
        emit(c, &ev);
    }
}

static int client_send(struct rdzv_client *c, const struct proto_msg *m)
{
    if (c->closing || c->state == C_DEAD)
        return CDDP_ECLOSED;
    if (c->hold)
        return proto_msg_encode(m, &c->outq);
    int rc = rdzv_wire_send((uv_stream_t *)&c->tcp, m);
    if (rc)
        snprintf(c->last_error, sizeof(c->last_error), "cannot send %s: %s",
                 proto_type_name(m->type), cddp_strerror(rc));
    return rc;
}

/* ---- receiving ---- */

static void copy_round(struct rdzv_client *c, const struct proto_round *r)
{
    c->round = *r;
    cddp_strlcpy(c->round_run_id, r->run_id, sizeof(c->round_run_id));
    cddp_strlcpy(c->round_master, r->master_addr, sizeof(c->round_master));
    c->round.run_id = c->round_run_id;
    c->round.master_addr = c->round_master;
    cddp_strlcpy(c->round_replaced, r->replaced ? r->replaced : "", sizeof(c->round_replaced));
    c->round.replaced = c->round_replaced;
    c->has_round = true;
}

static void send_join(struct rdzv_client *c);
static int encode_join(struct rdzv_client *c, struct cddp_buf *into);
static void after_reconnect(struct rdzv_client *c);

static void on_server_message(struct rdzv_client *c, const struct proto_msg *m)
{
    struct rdzv_event ev = {0};
    if (m->type != PROTO_ERROR)
        c->error_to_join = false;
    switch (m->type) {
    case PROTO_WELCOME:
        log_debug("R0201", "connected to %s (%s)", c->host,
                  m->welcome.server ? m->welcome.server : "?");
        c->welcomed = true;
        c->ever_welcomed = true;
        c->server_acks = m->welcome.heartbeat_ack;
        c->server_resume = m->welcome.resume;
        c->server_generations = m->welcome.generations;
        c->server_replace_ranks = m->welcome.generations && m->welcome.replace_ranks;
        if (c->reconnecting)
            after_reconnect(c);
        return;
    case PROTO_HEARTBEAT:
        if (m->heartbeat.has_waiting && m->heartbeat.waiting != c->waiting) {
            c->waiting = m->heartbeat.waiting;
            ev.kind = RDZV_EV_WAITING;
            ev.waiting_nodes = c->waiting;
            break;
        }
        return;
    case PROTO_JOINED:
        ev.kind = RDZV_EV_JOINED;
        ev.round = m->joined.round;
        ev.waiting = m->joined.waiting;
        break;
    case PROTO_ROUND:
        copy_round(c, &m->round);
        if (m->round.restart_count > c->restart_count)
            c->restart_count = m->round.restart_count;
        c->in_round = true;
        if (c->joining) {
            c->joining = false;
            c->join_resend = false;
            c->join_cb(c, 0, &c->round, c->join_arg);
        }
        return;
    case PROTO_RESTART:
        if (m->restart.restart_count > c->restart_count)
            c->restart_count = m->restart.restart_count;
        if (c->joining)
            return; /* we are joining the next round already */
        c->in_round = false;
        ev.kind = RDZV_EV_RESTART;
        ev.round = m->restart.round;
        ev.reason = m->restart.reason;
        ev.node_id = m->restart.node_id;
        ev.counted = m->restart.counted;
        ev.restart_count = m->restart.restart_count;
        break;
    case PROTO_GENERATION:
        if (c->joining || !c->in_round || m->generation.round != c->round.round)
            return; /* about a round this node has left */
        ev.kind = RDZV_EV_GENERATION;
        ev.round = m->generation.round;
        ev.generation = m->generation.generation;
        ev.replaced = m->generation.replaced;
        ev.node_id = m->generation.node_id;
        ev.message = m->generation.refused;
        ev.restart_count = m->generation.restart_count;
        if (m->generation.restart_count > c->restart_count)
            c->restart_count = m->generation.restart_count;
        break;
    case PROTO_BLAME:
        if (c->joining || !c->in_round || m->blame.round != c->round.round)
            return;
        ev.kind = RDZV_EV_BLAME;
        ev.round = m->blame.round;
        ev.rank = m->blame.rank;
        ev.generation = m->blame.generation;
        ev.node_id = m->blame.node_id;
        break;
    case PROTO_CLOSED:
        snprintf(c->last_error, sizeof(c->last_error), "rendezvous closed: %s",
                 m->closed.reason ? m->closed.reason : "closed");
        c->final = true;
        c->in_round = false;
        if (c->joining) {
            c->joining = false;
            c->join_cb(c, CDDP_ECLOSED, NULL, c->join_arg);
            return;
        }
        ev.kind = RDZV_EV_CLOSED;
        ev.reason = m->closed.reason;
        break;
    case PROTO_ERROR: {
        const char *msg = m->error.message ? m->error.message : cddp_strerror(m->error.code);
        c->final = true; /* the server decided: nothing to reconnect for */
        if (c->joining) {
            snprintf(c->last_error, sizeof(c->last_error), "%s", msg);
            c->joining = false;
            c->error_to_join = true;
            c->join_cb(c, m->error.code, NULL, c->join_arg);
            return;
        }
        c->error_from_server = true;
        client_fail(c, m->error.code, "%s", msg);
        return;
    }
    case PROTO_RESULT: {
        struct cddp_queue *q;
        cddp_queue_foreach(q, &c->reqs)
        {
            struct req *r = cddp_queue_data(q, struct req, link);
            if (r->id != m->id)
                continue;
            cddp_queue_remove(&r->link);
            struct rdzv_store_result res = {.message = m->result.message};
            if (m->result.has_value) {
                res.value = m->result.value.data;
                res.len = m->result.value.len;
            }
            res.number = m->result.number;
            r->cb(c, m->result.code, &res, r->arg);
            free(r);
            return;
        }
        return; /* an answer nobody waits for any more */
    }
    default:
        client_fail(c, CDDP_EPROTO_TYPE, "the server sent '%s', which servers do not send",
                    proto_type_name(m->type));
        return;
    }
    emit(c, &ev);
}

static int on_frame(void *arg, const char *payload, size_t len)
{
    struct rdzv_client *c = arg;
    struct proto_msg m;
    char err[256];
    int rc = proto_msg_decode(payload, len, &m, err, sizeof(err));
    if (rc) {
        client_fail(c, rc, "bad message from the rendezvous server: %s", err);
        return rc;
    }
    on_server_message(c, &m);
    proto_msg_free(&m);
    /* Stop at a connection that ended meanwhile: what follows was its. */
    return c->state != C_CONNECTED || c->closing ? CDDP_ECLOSED : 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    static _Thread_local char readbuf[64 * 1024];
    *buf = uv_buf_init(readbuf, sizeof(readbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct rdzv_client *c = s->data;
    if (nread == 0 || c->state != C_CONNECTED)
        return;
    c->last_heard = uv_now(c->loop);
    if (nread < 0) {
        connection_lost(c, nread == UV_EOF ? CDDP_ERR_FROM_ERRNO(ECONNRESET) : (int)nread,
                        "connection to the rendezvous server %s:%d lost: %s", c->host, c->port,
                        nread == UV_EOF ? "closed by the server" : uv_strerror((int)nread));
        return;
    }
    c->last_rx = uv_now(c->loop);
    c->suspect = false;
    if (!c->welcomed && proto_decoder_pending(&c->dec) == 0 && nread >= 5 &&
        memcmp(buf->base, "HTTP/", 5) == 0) {
        /* An HTTP server answered our hello (a status port, a proxy, a web
         * server given as the endpoint): as a frame it would read as a
         * gigabyte. Say what it is, with its status line, and stop: asking
         * it again will not make it a rendezvous server. */
        size_t n = 0;
        char line[80];
        while (n < (size_t)nread && n < sizeof(line) - 1 && buf->base[n] != '\r' &&
               buf->base[n] != '\n') {
            char ch = buf->base[n];
            line[n++] = ch >= 0x20 && ch < 0x7f ? ch : '?';
        }
        line[n] = '\0';
        client_fail(c, CDDP_EPROTO_TYPE,
                    "%s:%d answered in HTTP (\"%s\"): it is a web server (a status port?), not a "
                    "cddp rendezvous server",
                    c->host, c->port, line);
        return;
    }
    int rc = proto_decoder_feed(&c->dec, buf->base, (size_t)nread, on_frame, c);
    if (rc == CDDP_ETOOBIG)
        client_fail(c, rc, "the server sent a frame over %u bytes", PROTO_FRAME_MAX);
}

/* ---- connecting ---- */

static void send_beat(struct rdzv_client *c)
{
    struct proto_msg m = {.type = PROTO_HEARTBEAT};
    m.heartbeat.has_perf = c->has_perf;
    m.heartbeat.perf = c->perf;
    if (c->state == C_CONNECTED && !c->hold) {
        if (c->goodput)
            m.heartbeat.has_goodput = c->goodput(c->goodput_arg, &m.heartbeat.goodput);
        client_send(c, &m);
    }
}

static void on_beat(uv_timer_t *t)
{
    send_beat(t->data);
}

void rdzv_client_set_goodput(struct rdzv_client *c,
                             bool (*fn)(void *arg, struct proto_goodput *out), void *arg)
{
    c->goodput = fn;
    c->goodput_arg = arg;
}

void rdzv_client_set_perf(struct rdzv_client *c, const struct proto_perf *perf)
{
    c->has_perf = perf != NULL;
    if (perf)
        c->perf = *perf;
}

static void on_watch(uv_timer_t *t)
{
    struct rdzv_client *c = t->data;
    if (c->state == C_CONNECTING && c->tcp_open && !uv_is_closing((uv_handle_t *)&c->tcp) &&
        !c->closing) {
        /* A connect attempt nobody answers (a partition eats the SYNs)
         * would wait for the kernel's retries, minutes; give it up and try
         * again, so a healed network is seen within a second or so. */
        snprintf(c->last_error, sizeof(c->last_error), "cannot connect to %s:%d: no answer",
                 c->host, c->port);
        c->refused = false;
        close_tcp(c); /* on_handle_closed tries the next address, then backs off */
        return;
    }
    if (c->state != C_CONNECTED || c->closing)
        return;
    /* Before welcome every server must answer; after it, only one that
     * answers heartbeats is expected to speak (an older one stays quiet
     * while nothing happens, and only its connection breaking is seen). */
    uint64_t limit = !c->welcomed ? c->conf.read_timeout_ms : c->server_acks ? c->silence_ms : 0;
    if (limit == 0)
        return;
    uint64_t now = uv_now(c->loop);
    uint64_t quiet = now - c->last_rx;
    if (quiet < limit) {
        c->suspect = false;
        uv_timer_start(&c->watch, on_watch, limit - quiet, 0);
        return;
    }
    if (!c->suspect) {
        /* A process that was stopped runs its timers before it reads what
         * arrived meanwhile: one more turn of the loop reads it first. */
        c->suspect = true;
        uv_timer_start(&c->watch, on_watch, 1, 0);
        return;
    }
    if (c->welcomed)
        connection_lost(c, CDDP_ETIMEOUT,
                        "the rendezvous server %s:%d sent nothing for %.1f s (read_timeout=%.1f s)",
                        c->host, c->port, (double)quiet / 1000.0,
                        (double)c->conf.read_timeout_ms / 1000.0);
    else
        connection_lost(c, CDDP_ETIMEOUT,
                        "the rendezvous server %s:%d did not answer within %.1f s (read_timeout)",
                        c->host, c->port, (double)c->conf.read_timeout_ms / 1000.0);
}

/* Writes what waited in outq; 0 or an error (the connection is then lost). */
static int write_outq(struct rdzv_client *c)
{
    int rc = 0;
    if (c->outq.len)
        rc = rdzv_wire_write_buf((uv_stream_t *)&c->tcp, &c->outq);
    cddp_buf_free(&c->outq);
    c->join_queued = false;
    return rc;
}

static void on_connected(uv_connect_t *req, int status)
{
    struct rdzv_client *c = req->data;
    if (c->closing || c->state != C_CONNECTING || status == UV_ECANCELED)
        return;
    c->refused = status == UV_ECONNREFUSED;
    if (c->refused || status >= 0)
        c->last_heard = uv_now(c->loop); /* the host answered */
    if (status < 0) {
        snprintf(c->last_error, sizeof(c->last_error), "cannot connect to %s:%d: %s", c->host,
                 c->port, uv_strerror(status));
        close_tcp(c); /* on_handle_closed tries the next address */
        return;
    }
    c->state = C_CONNECTED;
    c->welcomed = false;
    c->suspect = false;
    c->last_rx = uv_now(c->loop);
    /* Nothing of a lost connection's stream carries over. */
    proto_decoder_free(&c->dec);
    proto_decoder_init(&c->dec, PROTO_FRAME_MAX);
    uv_tcp_nodelay(&c->tcp, 1);
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    /* hello, then what was asked for while connecting, in one write; after
     * a loss, what waits goes out after the welcome (after_reconnect). */
    struct proto_msg m = {.type = PROTO_HELLO};
    m.hello.token = c->conf.has_token ? c->conf.token : NULL;
    m.hello.run_id = c->run_id;
    m.hello.client = "cddprun " CDDP_VERSION;
    m.hello.heartbeat_ack = true;
    struct cddp_buf first;
    cddp_buf_init(&first, c->outq.max + PROTO_FRAME_HEADER + PROTO_FRAME_MAX);
    if (rc == 0)
        rc = proto_msg_encode(&m, &first);
    if (rc == 0 && !c->reconnecting && c->joining && c->join_resend) {
        /* The first connection broke before its welcome: the join again. */
        rc = encode_join(c, &first);
        c->join_resend = false;
    }
    if (rc == 0 && c->outq.len && !c->reconnecting)
        rc = cddp_buf_append(&first, c->outq.data, c->outq.len);
    if (rc == 0)
        rc = rdzv_wire_write_buf((uv_stream_t *)&c->tcp, &first);
    cddp_buf_free(&first);
    if (!c->reconnecting) {
        cddp_buf_free(&c->outq);
        c->join_queued = false;
        c->hold = false;
    }
    if (rc) {
        connection_lost(c, rc, "cannot talk to %s:%d: %s", c->host, c->port, cddp_strerror(rc));
        return;
    }
    uv_timer_start(&c->watch, on_watch, c->conf.read_timeout_ms, 0);
    uv_timer_start(&c->beat, on_beat, c->conf.keep_alive_interval_ms,
                   c->conf.keep_alive_interval_ms);
}

static void on_backoff(uv_timer_t *t)
{
    struct rdzv_client *c = t->data;
    start_resolve(c);
}

/* Out of addresses for this round: wait, then resolve again (or give up). */
static void backoff(struct rdzv_client *c)
{
    uint64_t now = uv_now(c->loop);
    if (now >= c->connect_deadline) {
        const char *last = c->last_error[0] ? c->last_error : "cannot reach the rendezvous server";
        if (c->reconnecting)
            client_fail(c, CDDP_ETIMEOUT, "%s; could not reconnect within %.1f s: %s", c->lost_why,
                        (double)c->connect_ms / 1000.0, last);
        else
            client_fail(c, CDDP_ETIMEOUT, "%s (kept trying for %.1f s)", last,
                        (double)c->connect_ms / 1000.0);
        return;
    }
    uint64_t ms =
        cddp_backoff_next(&c->backoff, (uint32_t)rand_r(&c->seed), c->connect_deadline - now);
    uv_timer_start(&c->backoff_timer, on_backoff, ms, 0);
}

static void try_next_address(struct rdzv_client *c)
{
    if (c->closing || c->state != C_CONNECTING)
        return;
    while (c->ai_next) {
        struct addrinfo *a = c->ai_next;
        c->ai_next = a->ai_next;
        uv_tcp_init(c->loop, &c->tcp);
        c->tcp.data = c;
        c->tcp_open = true;
        c->open_handles++;
        c->connect_req.data = c;
        int rc = uv_tcp_connect(&c->connect_req, &c->tcp, a->ai_addr, on_connected);
        if (rc == 0) {
            uint64_t attempt = c->conf.keep_alive_interval_ms;
            attempt = attempt < 1000 ? 1000 : attempt;
            uv_timer_start(&c->watch, on_watch, attempt, 0);
            return;
        }
        snprintf(c->last_error, sizeof(c->last_error), "cannot connect to %s:%d: %s", c->host,
                 c->port, uv_strerror(rc));
        close_tcp(c); /* on_handle_closed comes back here */
        return;
    }
    backoff(c);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct rdzv_client *c = req->data;
    c->resolving = false;
    if (c->closing) {
        if (res)
            uv_freeaddrinfo(res);
        maybe_free(c);
        return;
    }
    if (status < 0) {
        snprintf(c->last_error, sizeof(c->last_error), "cannot resolve '%s': %s", c->host,
                 uv_strerror(status));
        backoff(c);
        return;
    }
    if (c->ai)
        uv_freeaddrinfo(c->ai);
    c->ai = res;
    c->ai_next = res;
    try_next_address(c);
}

/* Resolves the endpoint afresh (names may move between attempts). */
static void start_resolve(struct rdzv_client *c)
{
    if (c->closing || c->state != C_CONNECTING)
        return;
    /* A numeric address needs no resolver (and no thread-pool trip: a
     * load generator starts thousands of clients at once). */
    if (c->numeric.ai_addr) {
        c->ai_next = &c->numeric;
        try_next_address(c);
        return;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG};
    char service[16];
    snprintf(service, sizeof(service), "%d", c->port);
    c->gai.data = c;
    int rc = uv_getaddrinfo(c->loop, &c->gai, on_resolved, c->host, service, &hints);
    if (rc) {
        snprintf(c->last_error, sizeof(c->last_error), "cannot resolve '%s': %s", c->host,
                 uv_strerror(rc));
        backoff(c);
        return;
    }
    c->resolving = true;
}

/* ---- the API ---- */

static char *dup_or_null(const char *s)
{
    return s && s[0] ? strdup(s) : NULL;
}

int rdzv_client_start(uv_loop_t *loop, const struct rdzv_client_options *o, rdzv_event_cb on_event,
                      void *data, struct rdzv_client **out, char *err, size_t errlen)
{
    if (o->host == NULL || o->host[0] == '\0' || o->port <= 0 || o->port > 65535) {
        snprintf(err, errlen, "rendezvous endpoint needs a host and a port in 1..65535");
        return CDDP_ECONFIG;
    }
    if (o->run_id == NULL || strlen(o->run_id) > PROTO_MAX_ID) {
        snprintf(err, errlen, "run id missing or longer than %d bytes", PROTO_MAX_ID);
        return CDDP_ECONFIG;
    }
    if (o->min_nodes < 1 || o->max_nodes < o->min_nodes || o->max_nodes > PROTO_MAX_NODES ||
        o->nproc < 1 || o->nproc > PROTO_MAX_NPROC) {
        snprintf(err, errlen, "bad node counts: nnodes %d:%d, nproc %d", o->min_nodes, o->max_nodes,
                 o->nproc);
        return CDDP_ECONFIG;
    }
    struct rdzv_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    c->loop = loop;
    c->port = o->port;
    c->nproc = o->nproc;
    c->status_port = o->status_port;
    c->min_nodes = o->min_nodes;
    c->max_nodes = o->max_nodes;
    if (o->conf)
        c->conf = *o->conf;
    else
        rdzv_conf_init(&c->conf);
    const char *env_token = getenv("CDDP_RDZV_TOKEN");
    if (!c->conf.has_token && env_token && env_token[0]) {
        cddp_strlcpy(c->conf.token, env_token, sizeof(c->conf.token));
        c->conf.has_token = true;
    }
    char hostname[256] = "localhost";
    if (o->hostname && o->hostname[0])
        cddp_strlcpy(hostname, o->hostname, sizeof(hostname));
    else
        gethostname(hostname, sizeof(hostname) - 1);
    char node_id[PROTO_MAX_ID + 1];
    if (o->node_id && o->node_id[0])
        cddp_strlcpy(node_id, o->node_id, sizeof(node_id));
    else
        snprintf(node_id, sizeof(node_id), "%.200s_%d_0", hostname, (int)getpid());
    c->host = strdup(o->host);
    c->run_id = strdup(o->run_id);
    c->node_id = strdup(node_id);
    c->local_addr = dup_or_null(o->local_addr);
    c->hostname = strdup(hostname);
    if (!c->host || !c->run_id || !c->node_id || !c->hostname ||
        (o->local_addr && o->local_addr[0] && !c->local_addr)) {
        c->closing = true;
        maybe_free(c);
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    cddp_buf_init(&c->outq, 4u << 20);
    proto_decoder_init(&c->dec, PROTO_FRAME_MAX);
    cddp_queue_init(&c->reqs);
    c->on_event = on_event;
    c->data = data;
    c->seed = (unsigned)uv_hrtime() ^ (unsigned)(uintptr_t)c;
    cddp_backoff_init(&c->backoff, 10, 1000);
    c->connect_ms = o->connect_timeout_ms ? o->connect_timeout_ms : c->conf.read_timeout_ms;
    c->connect_deadline = uv_now(loop) + c->connect_ms;
    c->reconnect_ms = o->reconnect_timeout_ms ? o->reconnect_timeout_ms : c->conf.join_timeout_ms;
    c->silence_ms = c->conf.read_timeout_ms;
    if (c->silence_ms < 2 * c->conf.keep_alive_interval_ms)
        c->silence_ms = 2 * c->conf.keep_alive_interval_ms;
    c->waiting = -1;
    c->hold = true;
    uv_timer_init(loop, &c->backoff_timer);
    uv_timer_init(loop, &c->beat);
    uv_timer_init(loop, &c->watch);
    c->backoff_timer.data = c;
    c->beat.data = c;
    c->watch.data = c;
    c->open_handles = 3;
    struct sockaddr_in *in4 = (struct sockaddr_in *)&c->numeric_addr;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&c->numeric_addr;
    if (uv_ip4_addr(c->host, c->port, in4) == 0) {
        c->numeric.ai_addr = (struct sockaddr *)in4;
        c->numeric.ai_addrlen = sizeof(*in4);
    } else if (uv_ip6_addr(c->host, c->port, in6) == 0) {
        c->numeric.ai_addr = (struct sockaddr *)in6;
        c->numeric.ai_addrlen = sizeof(*in6);
    }
    c->state = C_CONNECTING;
    start_resolve(c);
    *out = c;
    return 0;
}

static void fmt_seconds(char *buf, size_t len, uint64_t ms)
{
    snprintf(buf, len, "%.3f", (double)ms / 1000.0);
}

/* The rdzv_conf a join carries, as strings (the server keeps what it needs
 * of it per node; the token only ever travels in hello). */
struct join_conf {
    char v[6][32];
    struct proto_conf_kv kv[6];
};

/* This node's join as it stands (master_port: the last join's).
 * with_resume_timeout: add resume_timeout when it was given, which only a
 * resume carries (an older server refuses the key in a join). */
static void fill_join(struct rdzv_client *c, struct proto_join *j, struct join_conf *jc,
                      bool with_resume_timeout)
{
    static const char *const keys[6] = {"join_timeout",           "last_call_timeout",
                                        "close_timeout",          "keep_alive_interval",
                                        "keep_alive_max_attempt", "resume_timeout"};
    fmt_seconds(jc->v[0], sizeof(jc->v[0]), c->conf.join_timeout_ms);
    fmt_seconds(jc->v[1], sizeof(jc->v[1]), c->conf.last_call_timeout_ms);
    fmt_seconds(jc->v[2], sizeof(jc->v[2]), c->conf.close_timeout_ms);
    fmt_seconds(jc->v[3], sizeof(jc->v[3]), c->conf.keep_alive_interval_ms);
    snprintf(jc->v[4], sizeof(jc->v[4]), "%d", c->conf.keep_alive_max_attempt);
    fmt_seconds(jc->v[5], sizeof(jc->v[5]), c->conf.resume_timeout_ms);
    for (int i = 0; i < 6; i++)
        jc->kv[i] = (struct proto_conf_kv){keys[i], jc->v[i]};
    *j = (struct proto_join){.node_id = c->node_id,
                             .nproc = c->nproc,
                             .min_nodes = c->min_nodes,
                             .max_nodes = c->max_nodes,
                             .local_addr = c->local_addr,
                             .hostname = c->hostname,
                             .master_port = c->join_port,
                             .status_port = c->status_port,
                             /* Where the job was, for a server that restarted since. */
                             .round = c->has_round ? c->round.round : 0,
                             .last_nnodes = c->has_round ? c->round.nnodes : 0,
                             .restart_count = c->restart_count,
                             .conf = jc->kv,
                             .nconf = with_resume_timeout && c->conf.has_resume_timeout ? 6 : 5};
}

/* The join of the outstanding join request: sent (or queued) when into is
 * NULL, else appended to into. */
static int encode_join(struct rdzv_client *c, struct cddp_buf *into)
{
    struct join_conf jc;
    struct proto_msg m = {.type = PROTO_JOIN};
    fill_join(c, &m.join, &jc, false);
    if (into)
        return proto_msg_encode(&m, into);
    bool queued = c->hold;
    int rc = client_send(c, &m);
    if (rc == 0)
        c->join_queued = queued;
    return rc;
}

static void send_join(struct rdzv_client *c)
{
    c->join_resend = false;
    int rc = encode_join(c, NULL);
    if (rc)
        connection_lost(c, rc, "cannot send join to %s:%d: %s", c->host, c->port,
                        cddp_strerror(rc));
}

int rdzv_client_join(struct rdzv_client *c, int master_port, rdzv_join_cb cb, void *arg)
{
    if (c->closing || c->state == C_DEAD)
        return CDDP_ECLOSED;
    if (c->joining)
        return CDDP_ESTATE;
    c->join_port = master_port;
    c->join_resend = false;
    int rc = encode_join(c, NULL);
    if (rc)
        return rc;
    c->joining = true;
    c->in_round = false;
    c->join_cb = cb;
    c->join_arg = arg;
    return 0;
}

/* ---- after a lost connection: resume, or join again ---- */

static void on_resumed(struct rdzv_client *c, int status, const struct rdzv_store_result *r,
                       void *arg)
{
    (void)arg;
    if (status == CDDP_ERR_FROM_ERRNO(ECONNRESET) || status == CDDP_ERR_FROM_ERRNO(ECANCELED))
        return; /* lost again (the next welcome asks again), or closed */
    c->resume_id = 0;
    struct rdzv_event ev = {0};
    if (status == 0) {
        ev.kind = RDZV_EV_RECONNECTED;
        ev.resumed = true;
        ev.round = c->round.round;
        emit(c, &ev);
        return;
    }
    const char *why = r && r->message ? r->message : cddp_strerror(status);
    c->in_round = false;
    if (status == CDDP_ECLOSED) {
        c->final = true;
        snprintf(c->last_error, sizeof(c->last_error), "rendezvous closed: %s", why);
        ev.kind = RDZV_EV_CLOSED;
        ev.reason = why;
        emit(c, &ev);
        return;
    }
    /* Its round ended while it was away (or the server restarted): this
     * node stops its workers and joins again, like any restart. */
    ev.kind = RDZV_EV_RESTART;
    ev.round = c->round.round;
    ev.reason = "resume_failed";
    ev.node_id = c->node_id;
    ev.message = why;
    ev.restart_count = c->restart_count;
    emit(c, &ev);
}

/* A welcome after a lost connection. What goes first: the join again (the
 * one outstanding went out on the lost connection), or a resume of the
 * round this node runs in; then what waited meanwhile, in order. */
static void after_reconnect(struct rdzv_client *c)
{
    c->reconnecting = false;
    c->reconnects++;
    cddp_backoff_reset(&c->backoff);
    c->hold = false;
    log_debug("R0202", "reconnected to the rendezvous server %s:%d (%u reconnection%s)", c->host,
              c->port, c->reconnects, c->reconnects == 1 ? "" : "s");
    bool resume = false;
    if (c->joining && c->join_resend) {
        send_join(c);
    } else if (!c->joining && c->in_round && c->server_resume) {
        struct proto_msg m = {.type = PROTO_RESUME};
        struct join_conf jc;
        m.resume.node_id = c->node_id;
        m.resume.round = c->round.round;
        /* What a restarted server needs to rebuild the round (one that
         * still knows it ignores it; so does an older server). */
        if (rdzv_conf_resume_timeout_ms(&c->conf) > 0) {
            m.resume.rebuild = true;
            fill_join(c, &m.resume.join, &jc, true);
            m.resume.member = c->round;
        }
        resume = rdzv_client_request(c, &m, on_resumed, NULL) == 0;
        if (resume)
            c->resume_id = m.id;
    }
    if (c->state != C_CONNECTED)
        return;
    int rc = write_outq(c);
    if (rc) {
        connection_lost(c, rc, "cannot talk to %s:%d: %s", c->host, c->port, cddp_strerror(rc));
        return;
    }
    if (resume || c->closing)
        return;
    struct rdzv_event ev = {.kind = RDZV_EV_RECONNECTED};
    if (!c->joining && c->in_round) {
        /* A server that cannot resume: the round is lost to this node. */
        c->in_round = false;
        ev.kind = RDZV_EV_RESTART;
        ev.round = c->round.round;
        ev.reason = "resume_failed";
        ev.node_id = c->node_id;
        ev.message = "the rendezvous server cannot resume a round (an older server)";
        ev.restart_count = c->restart_count;
    }
    emit(c, &ev);
}

static int send_simple(struct rdzv_client *c, enum proto_type type, uint64_t round,
                       const char *reason, bool finished)
{
    struct proto_msg m = {.type = type};
    /* A node that leaves or ends the job beats once more first: the
     * server's sums and history get its last totals (its last steps may
     * have come after the last beat). */
    if (type == PROTO_LEAVE || type == PROTO_CLOSE)
        send_beat(c);
    if (type == PROTO_FAILURE) {
        m.failure.round = round;
        m.failure.reason = reason;
    } else {
        m.leave.reason = reason; /* leave and close share the layout */
        m.leave.finished = finished;
    }
    return client_send(c, &m);
}

int rdzv_client_report_failure(struct rdzv_client *c, const char *reason)
{
    if (!c->has_round)
        return CDDP_ESTATE;
    return send_simple(c, PROTO_FAILURE, c->round.round, reason, false);
}

/* May replace and blame go out now? 0, CDDP_ESTATE (no round running
 * here, a join outstanding, not connected) or CDDP_EPROTO_TYPE (an older
 * server). */
static int inplace_ready(const struct rdzv_client *c)
{
    if (!c->has_round || !c->in_round || c->joining || !c->welcomed || c->hold)
        return CDDP_ESTATE;
    return c->server_generations ? 0 : CDDP_EPROTO_TYPE;
}

int rdzv_client_replace(struct rdzv_client *c, int rank, const char *ranks, const char *reason)
{
    int rc = inplace_ready(c);
    if (rc == 0 && ranks && !c->server_replace_ranks)
        rc = CDDP_EPROTO_TYPE;
    struct proto_msg m = {
        .type = PROTO_REPLACE,
        .replace = {.round = c->round.round, .rank = rank, .ranks = ranks, .reason = reason}};
    return rc ? rc : client_send(c, &m);
}

int rdzv_client_blame(struct rdzv_client *c, int rank, int64_t generation)
{
    int rc = inplace_ready(c);
    if (rc)
        return rc;
    struct proto_msg m = {.type = PROTO_BLAME};
    m.blame.round = c->round.round;
    m.blame.rank = rank;
    m.blame.generation = generation;
    return client_send(c, &m);
}

int rdzv_client_leave(struct rdzv_client *c, const char *reason, bool finished)
{
    return send_simple(c, PROTO_LEAVE, 0, reason, finished);
}

int rdzv_client_close_rendezvous(struct rdzv_client *c, const char *reason)
{
    return send_simple(c, PROTO_CLOSE, 0, reason, false);
}

int rdzv_client_request(struct rdzv_client *c, struct proto_msg *m, rdzv_store_cb cb, void *arg)
{
    if (c->closing || c->state == C_DEAD)
        return CDDP_ECLOSED;
    struct req *r = malloc(sizeof(*r));
    if (r == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    m->id = ++c->next_id;
    int rc = client_send(c, m);
    if (rc) {
        free(r);
        return rc;
    }
    r->id = m->id;
    r->cb = cb;
    r->arg = arg;
    cddp_queue_insert_tail(&c->reqs, &r->link);
    return 0;
}

const struct proto_round *rdzv_client_round(const struct rdzv_client *c)
{
    return c->has_round ? &c->round : NULL;
}

const char *rdzv_client_last_error(const struct rdzv_client *c)
{
    return c->last_error;
}

const char *rdzv_client_node_id(const struct rdzv_client *c)
{
    return c->node_id;
}

void rdzv_client_close(struct rdzv_client *c, void (*close_cb)(void *arg), void *arg)
{
    if (c->closing)
        return;
    c->closing = true;
    c->close_cb = close_cb;
    c->close_arg = arg;
    snprintf(c->last_error, sizeof(c->last_error), "the client was closed");
    fail_pending(c, CDDP_ERR_FROM_ERRNO(ECANCELED));
    c->state = C_DEAD;
    if (c->resolving)
        uv_cancel((uv_req_t *)&c->gai);
    close_tcp(c);
    uv_close((uv_handle_t *)&c->backoff_timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->beat, on_handle_closed);
    uv_close((uv_handle_t *)&c->watch, on_handle_closed);
}

bool rdzv_client_connected(const struct rdzv_client *c)
{
    return c->state == C_CONNECTED && c->welcomed;
}

bool rdzv_client_ever_welcomed(const struct rdzv_client *c)
{
    return c->ever_welcomed;
}

int64_t rdzv_client_quiet_ms(const struct rdzv_client *c)
{
    if (!c->ever_welcomed || !c->server_acks || c->state == C_DEAD)
        return -1;
    if (c->state == C_CONNECTING && c->refused)
        return 0; /* its host keeps answering: the server is down, not cut off */
    return (int64_t)(uv_now(c->loop) - c->last_heard);
}

int64_t rdzv_client_waiting(const struct rdzv_client *c)
{
    return c->waiting;
}

unsigned rdzv_client_reconnects(const struct rdzv_client *c)
{
    return c->reconnects;
}
