/* server.c: see server.h.
 *
 * Each connection owns a uv_tcp_t and a uv_timer_t (hello / partial-frame
 * deadline, then the linger after a final error) and is freed when both are
 * closed. Reads land in one buffer shared by all connections (libuv hands
 * it back before the next read), so 10,000 idle connections cost little.
 *
 * Every callback from libuv ends with flush(): connections the state machine
 * (or a failed write) asked to drop are detached from the state, which can
 * produce more actions (restarts for the others), until nothing is left;
 * then the state's timer is re-armed. Dropping never happens in the middle
 * of carrying out a list of actions. */
#include "rendezvous/server.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>

#include "common/errors.h"
#include "common/fdlimit.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/queue.h"
#include "config.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "rendezvous/state.h"
#include "rendezvous/wire.h"

#define READ_BUF_SIZE (64 * 1024)
#define LINGER_MS 1000

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    struct rdzv_server *srv;
    struct rdzv_peer peer;
    struct proto_decoder dec;
    struct cddp_queue link;      /* srv->conns */
    struct cddp_queue drop_link; /* srv->drops while a drop is pending */
    struct cddp_queue out_link;  /* srv->dirty while out holds bytes */
    struct cddp_buf out;         /* frames for this peer, written once per loop turn */
    uv_shutdown_t shutdown_req;
    int open_handles;
    bool helloed;
    bool detached;       /* rdzv_state_disconnect done */
    bool closing;        /* no more reads or writes; on its way out */
    bool over_limit;     /* refused: past max_connections (stats) */
    bool goodput_warned; /* R0026 said for this connection */
    char name[80];       /* "addr:port" for logs */
};

struct rdzv_server {
    uv_loop_t *loop;
    uv_tcp_t *listener; /* its own allocation: failed binds free theirs on close */
    uv_timer_t tick;
    struct rdzv_state *state;
    struct rdzv_server_options opt;
    char *token;
    char name[64];
    char address[300];
    int port;
    struct cddp_queue conns;
    struct cddp_queue drops;
    struct cddp_queue dirty;
    size_t nconns;
    /* The open-file soft limit at start: near it, libuv accepts and closes
     * new connections at once without telling us (its EMFILE trick), so the
     * server says so before that happens (near_fd_limit). */
    uint64_t fd_soft;
    bool fd_warned;
    int open_handles;
    bool shutting_down;
    bool keep_runs; /* stopping for a successor: connections close, the state hears nothing */
    void (*shutdown_cb)(void *arg);
    void *shutdown_arg;
    struct rdzv_server_stats stats;
    /* rdzv_server_drain: one at a time */
    uv_timer_t drain_timer;
    char *drain_run; /* NULL: no drain pending */
    void (*drain_cb)(void *arg);
    void *drain_arg;
    char readbuf[READ_BUF_SIZE];
    bool readbuf_busy;
};

static void flush(struct rdzv_server *srv);
static void write_out(struct conn *c);
static void send_msg(struct conn *c, const struct proto_msg *m);
static void conn_close(struct conn *c);
static void conn_fail(struct conn *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static uint64_t now_ms(struct rdzv_server *srv)
{
    return uv_now(srv->loop);
}

/* ---- teardown ---- */

static void maybe_finish_shutdown(struct rdzv_server *srv)
{
    if (!srv->shutting_down || srv->open_handles > 0 || srv->nconns > 0)
        return;
    void (*cb)(void *) = srv->shutdown_cb;
    void *arg = srv->shutdown_arg;
    rdzv_state_free(srv->state);
    free(srv->token);
    free(srv);
    if (cb)
        cb(arg);
}

static void on_server_handle_closed(uv_handle_t *h)
{
    struct rdzv_server *srv = h->data;
    srv->open_handles--;
    maybe_finish_shutdown(srv);
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static void on_listener_closed(uv_handle_t *h)
{
    struct rdzv_server *srv = h->data;
    free(h);
    srv->open_handles--;
    maybe_finish_shutdown(srv);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->open_handles > 0)
        return;
    struct rdzv_server *srv = c->srv;
    proto_decoder_free(&c->dec);
    cddp_buf_free(&c->out);
    cddp_queue_remove(&c->out_link);
    cddp_queue_remove(&c->link);
    srv->nconns--;
    free(c);
    maybe_finish_shutdown(srv);
}

/* Tells the state machine the connection is gone (once). */
static void conn_detach(struct conn *c)
{
    if (c->detached)
        return;
    c->detached = true;
    if (c->srv->keep_runs)
        rdzv_state_forget(c->srv->state, &c->peer);
    else
        rdzv_state_disconnect(c->srv->state, now_ms(c->srv), &c->peer);
}

static void apply_actions(struct rdzv_server *srv);

/* Closes at once: detach, carry out what that causes, close the handles. */
static void conn_close(struct conn *c)
{
    if (c->open_handles == 0 || uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    c->closing = true;
    cddp_queue_remove(&c->drop_link);
    cddp_queue_remove(&c->out_link);
    if (!c->detached) {
        conn_detach(c);
        apply_actions(c->srv);
    }
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_linger_timeout(uv_timer_t *t)
{
    struct conn *c = t->data;
    struct rdzv_server *srv = c->srv;
    conn_close(c);
    flush(srv);
}

static void on_shutdown_done(uv_shutdown_t *req, int status)
{
    (void)status;
    struct conn *c = req->data;
    struct rdzv_server *srv = c->srv;
    conn_close(c);
    flush(srv);
}

/* Stops reading, lets queued writes (the error message) go out, then
 * closes; at most LINGER_MS. The state is told at once. */
static void conn_close_after_flush(struct conn *c)
{
    if (c->closing)
        return;
    write_out(c);
    c->closing = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (!c->detached) {
        conn_detach(c);
        apply_actions(c->srv);
    }
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown_done) != 0) {
        c->closing = false; /* let conn_close run */
        conn_close(c);
        return;
    }
    uv_timer_stop(&c->timer);
    uv_timer_start(&c->timer, on_linger_timeout, LINGER_MS, 0);
}

static void conn_fail(struct conn *c, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->closing)
        return;
    c->srv->stats.refused++;
    if (c->over_limit)
        c->srv->stats.refused_limit++;
    else if (code == CDDP_ETOKEN)
        c->srv->stats.refused_token++;
    else
        c->srv->stats.refused_protocol++;
    log_warn("R0010", "%s: %s (%s); closing the connection", c->name, msg, cddp_err_name(code));
    struct proto_msg m = {.type = PROTO_ERROR};
    m.error.code = code;
    m.error.message = msg;
    send_msg(c, &m);
    conn_close_after_flush(c);
}

/* ---- sending ---- */

static void queue_drop(struct conn *c)
{
    if (c->closing || c->drop_link.next != &c->drop_link)
        return;
    cddp_queue_insert_tail(&c->srv->drops, &c->drop_link);
}

/* Queues m for c; what a peer is sent during one turn of the loop goes out
 * in one write (flush). */
static void send_msg(struct conn *c, const struct proto_msg *m)
{
    if (c->closing)
        return;
    struct rdzv_server *srv = c->srv;
    if (c->tcp.write_queue_size + c->out.len > srv->opt.max_write_queue) {
        log_warn("R0011", "%s: does not read (%zu bytes queued); closing the connection", c->name,
                 c->tcp.write_queue_size + c->out.len);
        srv->stats.refused++;
        srv->stats.refused_protocol++;
        queue_drop(c);
        return;
    }
    int rc = proto_msg_encode(m, &c->out);
    if (rc) {
        log_warn("R0012", "%s: cannot send %s: %s; closing the connection", c->name,
                 proto_type_name(m->type), cddp_strerror(rc));
        queue_drop(c);
        return;
    }
    if (c->out_link.next == &c->out_link)
        cddp_queue_insert_tail(&srv->dirty, &c->out_link);
}

static void write_out(struct conn *c)
{
    cddp_queue_remove(&c->out_link);
    if (c->closing || c->out.len == 0)
        return;
    int rc = rdzv_wire_write_buf((uv_stream_t *)&c->tcp, &c->out);
    if (rc) {
        log_info("R0015", "%s: write: %s; closing the connection", c->name, uv_strerror(rc));
        cddp_buf_reset(&c->out);
        queue_drop(c);
    }
}

/* A node became, or stopped being, slower than the job's others
 * (rdzv_state_heartbeat_perf): said once each way. */
static void log_straggler(const struct rdzv_action *a)
{
    const char *what = a->straggler.compute ? "compute" : "step time";
    if (a->straggler.slow)
        log_warn("R0024",
                 "run '%s': node %s is a straggler: %.3f s a step (%s, median of its ranks; "
                 "slowest rank %d) against the job's median %.3f s (x%.2f)",
                 a->straggler.run_id, a->straggler.node_id, a->straggler.time_s, what,
                 a->straggler.max_rank, a->straggler.median_s, a->straggler.ratio);
    else
        log_info("R0025", "run '%s': node %s is no longer a straggler (x%.2f of the job's median)",
                 a->straggler.run_id, a->straggler.node_id, a->straggler.ratio);
}

static void apply_actions(struct rdzv_server *srv)
{
    const struct rdzv_action *acts;
    size_t n = rdzv_state_actions(srv->state, &acts);
    for (size_t i = 0; i < n; i++) {
        const struct rdzv_action *a = &acts[i];
        if (srv->opt.on_action)
            srv->opt.on_action(srv->opt.jobs_arg, a->peer ? rdzv_peer_run_id(a->peer) : NULL, a);
        if (a->kind == RDZV_ACT_STRAGGLER) {
            log_straggler(a);
            continue;
        }
        struct conn *c = a->peer->data;
        struct proto_msg m = {0};
        switch (a->kind) {
        case RDZV_ACT_JOINED:
            m.type = PROTO_JOINED;
            m.joined.round = a->joined.round;
            m.joined.waiting = a->joined.waiting;
            if (a->joined.waiting)
                log_info("R0020", "%s: on the wait list (round %llu)", c->name,
                         (unsigned long long)a->joined.round);
            break;
        case RDZV_ACT_ROUND:
            m.type = PROTO_ROUND;
            m.round = a->round;
            srv->stats.rounds++;
            srv->stats.rounds_completed += a->round.node_rank == 0;
            if (a->round.node_rank == 0)
                log_info("R0021",
                         "run '%s' round %llu complete: %d nodes, world size %d, master %s:%d",
                         a->round.run_id, (unsigned long long)a->round.round, a->round.nnodes,
                         a->round.world_size, a->round.master_addr, a->round.master_port);
            break;
        case RDZV_ACT_RESTART:
            m.type = PROTO_RESTART;
            m.restart.round = a->restart.round;
            m.restart.reason = a->restart.reason;
            m.restart.node_id = a->restart.node_id;
            m.restart.counted = a->restart.counted;
            m.restart.restart_count = a->restart.restart_count;
            srv->stats.restarts++;
            log_debug("R0022", "%s: restart for round %llu (%s of %s)", c->name,
                      (unsigned long long)a->restart.round, a->restart.reason,
                      a->restart.node_id ? a->restart.node_id : "-");
            break;
        case RDZV_ACT_GENERATION:
            m.type = PROTO_GENERATION;
            m.generation.round = a->generation.round;
            m.generation.generation = a->generation.generation;
            m.generation.replaced = a->generation.replaced;
            m.generation.node_id = a->generation.node_id;
            m.generation.refused = a->generation.refused;
            m.generation.restart_count = a->generation.restart_count;
            if (a->generation.generation == 0)
                log_warn("R0029", "%s: replace refused: %s", c->name, a->generation.refused);
            else if (rdzv_peer_node_id(a->peer) &&
                     strcmp(rdzv_peer_node_id(a->peer), a->generation.node_id) == 0)
                log_info("R0028",
                         "%s: round %llu goes on in place: generation %lld, rank %s restarted "
                         "alone",
                         c->name, (unsigned long long)a->generation.round,
                         (long long)a->generation.generation, a->generation.replaced);
            break;
        case RDZV_ACT_BLAME:
            m.type = PROTO_BLAME;
            m.blame.round = a->blame.round;
            m.blame.rank = a->blame.rank;
            m.blame.generation = a->blame.generation;
            m.blame.node_id = a->blame.node_id;
            log_info("R0031", "%s: rank %d never reached a collective of generation %lld, says %s",
                     c->name, a->blame.rank, (long long)a->blame.generation, a->blame.node_id);
            break;
        case RDZV_ACT_CLOSED:
            m.type = PROTO_CLOSED;
            m.closed.reason = a->closed.reason;
            break;
        case RDZV_ACT_ERROR:
            m.type = PROTO_ERROR;
            m.error.code = a->error.code;
            m.error.message = a->error.message;
            log_warn("R0023", "%s: %s (%s)%s", c->name, a->error.message,
                     cddp_err_name(a->error.code), a->error.drop ? "; closing the connection" : "");
            break;
        case RDZV_ACT_HEARTBEAT:
            m.type = PROTO_HEARTBEAT;
            m.heartbeat.has_waiting = true;
            m.heartbeat.waiting = (int64_t)a->heartbeat.waiting;
            break;
        case RDZV_ACT_RESULT:
            m.type = PROTO_RESULT;
            m.id = a->result.id;
            m.result.code = a->result.code;
            m.result.message = a->result.message;
            m.result.has_value = a->result.has_value;
            m.result.value = (struct proto_bytes){a->result.value, a->result.vlen};
            m.result.has_number = a->result.has_number;
            m.result.number = a->result.number;
            break;
        case RDZV_ACT_STRAGGLER: /* logged above, sends nothing */
            continue;
        }
        send_msg(c, &m);
        if (a->kind == RDZV_ACT_ERROR && a->error.drop) {
            srv->stats.refused++;
            srv->stats.refused_protocol++;
            queue_drop(c);
        }
    }
}

static void on_tick(uv_timer_t *t);
static void check_drain(struct rdzv_server *srv);

/* Drops what was asked to drop (which can ask for more), then re-arms the
 * state machine's timer. */
static void flush(struct rdzv_server *srv)
{
    if (srv->opt.on_change && !srv->shutting_down)
        srv->opt.on_change(srv->opt.change_arg);
    while (!cddp_queue_empty(&srv->dirty) || !cddp_queue_empty(&srv->drops)) {
        while (!cddp_queue_empty(&srv->dirty))
            write_out(cddp_queue_data(cddp_queue_head(&srv->dirty), struct conn, out_link));
        while (!cddp_queue_empty(&srv->drops)) {
            struct conn *c = cddp_queue_data(cddp_queue_head(&srv->drops), struct conn, drop_link);
            cddp_queue_remove(&c->drop_link);
            conn_close_after_flush(c);
        }
    }
    if (srv->shutting_down)
        return;
    check_drain(srv);
    uint64_t due = rdzv_state_next_deadline(srv->state);
    if (due == RDZV_NEVER) {
        uv_timer_stop(&srv->tick);
        return;
    }
    uint64_t now = now_ms(srv);
    uv_timer_start(&srv->tick, on_tick, due > now ? due - now : 0, 0);
}

static void on_tick(uv_timer_t *t)
{
    struct rdzv_server *srv = t->data;
    rdzv_state_tick(srv->state, now_ms(srv));
    apply_actions(srv);
    flush(srv);
}

/* ---- draining ---- */

static void drain_fire(struct rdzv_server *srv)
{
    void (*cb)(void *) = srv->drain_cb;
    void *arg = srv->drain_arg;
    free(srv->drain_run);
    srv->drain_run = NULL;
    srv->drain_cb = NULL;
    uv_timer_stop(&srv->drain_timer);
    if (cb)
        cb(arg);
}

static void on_drain_timer(uv_timer_t *t)
{
    struct rdzv_server *srv = t->data;
    if (srv->drain_run)
        drain_fire(srv);
}

/* After every event: has the drained run lost its last connection? The
 * callback runs from the timer, so never inside rdzv_server_drain or in
 * the middle of a libuv callback of ours. */
static void check_drain(struct rdzv_server *srv)
{
    if (srv->drain_run == NULL)
        return;
    struct rdzv_run_stats st;
    if (rdzv_state_run_stats(srv->state, srv->drain_run, &st) == 0 && st.peers > 0)
        return;
    uv_timer_start(&srv->drain_timer, on_drain_timer, 0, 0);
}

int rdzv_server_drain(struct rdzv_server *srv, const char *run_id, uint64_t timeout_ms,
                      void (*cb)(void *arg), void *arg)
{
    if (srv->shutting_down || srv->drain_run)
        return CDDP_ESTATE;
    srv->drain_run = strdup(run_id ? run_id : "");
    if (srv->drain_run == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    srv->drain_cb = cb;
    srv->drain_arg = arg;
    if (timeout_ms != UINT64_MAX)
        uv_timer_start(&srv->drain_timer, on_drain_timer, timeout_ms, 0);
    check_drain(srv);
    return 0;
}

/* ---- receiving ---- */

static void handle_hello(struct conn *c, const struct proto_msg *m)
{
    struct rdzv_server *srv = c->srv;
    char err[256];
    if (c->helloed) {
        conn_fail(c, CDDP_ESTATE, "hello sent twice on one connection");
        return;
    }
    if (srv->token && !rdzv_wire_token_equal(srv->token, m->hello.token ? m->hello.token : "")) {
        conn_fail(c, CDDP_ETOKEN,
                  m->hello.token ? "join token refused: it does not match the server's"
                                 : "this server requires a join token (rdzv_conf token=... or "
                                   "CDDP_RDZV_TOKEN)");
        return;
    }
    if (rdzv_state_hello(srv->state, now_ms(srv), &c->peer, m->hello.run_id, err, sizeof(err)) !=
        0) {
        apply_actions(srv);
        return;
    }
    c->helloed = true;
    c->peer.heartbeat_ack = m->hello.heartbeat_ack;
    struct proto_msg w = {.type = PROTO_WELCOME};
    w.welcome.server = srv->name;
    w.welcome.heartbeat_ack = m->hello.heartbeat_ack;
    w.welcome.resume = !srv->opt.store_only;
    w.welcome.generations = !srv->opt.store_only;
    w.welcome.replace_ranks = w.welcome.generations;
    send_msg(c, &w);
    log_debug("R0030", "%s: hello for run '%s' (%s)", c->name, m->hello.run_id,
              m->hello.client ? m->hello.client : "-");
}

static void handle_status(struct conn *c, const struct proto_msg *m)
{
    struct rdzv_server *srv = c->srv;
    cJSON *st = rdzv_state_status(srv->state, now_ms(srv));
    if (st) {
        cJSON_AddNumberToObject(st, "connections", (double)srv->nconns);
        cJSON_AddNumberToObject(st, "accepted", (double)srv->stats.accepted);
        cJSON_AddNumberToObject(st, "refused", (double)srv->stats.refused);
        cJSON_AddStringToObject(st, "server", srv->name);
    }
    struct proto_msg r = {.type = PROTO_RESULT, .id = m->id};
    r.result.status = st;
    if (st == NULL) {
        r.result.code = CDDP_ERR_FROM_ERRNO(ENOMEM);
        r.result.message = "out of memory";
    }
    send_msg(c, &r);
    cJSON_Delete(st);
}

static void dispatch(struct conn *c, const struct proto_msg *m)
{
    struct rdzv_server *srv = c->srv;
    uint64_t now = now_ms(srv);
    if (m->type == PROTO_HELLO) {
        handle_hello(c, m);
        return;
    }
    if (!c->helloed) {
        conn_fail(c, CDDP_ESTATE, "the first message must be hello, not '%s'",
                  proto_type_name(m->type));
        return;
    }
    switch (m->type) {
    case PROTO_JOIN:
        srv->stats.joins++;
        rdzv_state_join(srv->state, now, &c->peer, m);
        break;
    case PROTO_HEARTBEAT:
        if (m->heartbeat.goodput_error[0] && !c->goodput_warned) {
            c->goodput_warned = true; /* once a connection: it beats every few seconds */
            log_warn("R0026", "%s: heartbeat's goodput ignored: %s", c->name,
                     m->heartbeat.goodput_error);
        }
        rdzv_state_heartbeat_perf(srv->state, now, &c->peer,
                                  m->heartbeat.has_perf ? &m->heartbeat.perf : NULL);
        if (srv->opt.on_heartbeat)
            srv->opt.on_heartbeat(srv->opt.jobs_arg, rdzv_peer_run_id(&c->peer),
                                  rdzv_peer_node_id(&c->peer), m);
        break;
    case PROTO_RESUME:
        rdzv_state_resume(srv->state, now, &c->peer, m);
        break;
    case PROTO_LEAVE:
        rdzv_state_leave(srv->state, now, &c->peer, m->leave.reason, m->leave.finished);
        break;
    case PROTO_FAILURE:
        rdzv_state_failure(srv->state, now, &c->peer, m->failure.round, m->failure.reason);
        break;
    case PROTO_CLOSE:
        rdzv_state_close(srv->state, now, &c->peer, m->close.reason);
        break;
    case PROTO_REPLACE:
        rdzv_state_replace(srv->state, now, &c->peer, m);
        break;
    case PROTO_BLAME:
        rdzv_state_blame(srv->state, now, &c->peer, m);
        break;
    case PROTO_SET:
    case PROTO_GET:
    case PROTO_WAIT:
    case PROTO_ADD:
    case PROTO_COMPARE_SET:
        rdzv_state_store(srv->state, now, &c->peer, m);
        break;
    case PROTO_STATUS:
        rdzv_state_heartbeat(srv->state, now, &c->peer);
        handle_status(c, m);
        return;
    default:
        conn_fail(c, CDDP_EPROTO_TYPE, "'%s' is sent by servers, not to them",
                  proto_type_name(m->type));
        return;
    }
    apply_actions(srv);
}

static int on_frame(void *arg, const char *payload, size_t len)
{
    struct conn *c = arg;
    struct proto_msg m;
    char err[256];
    c->srv->stats.frames_in++;
    int rc = proto_msg_decode(payload, len, &m, err, sizeof(err));
    if (rc) {
        conn_fail(c, rc, "bad message: %s", err);
        return rc;
    }
    dispatch(c, &m);
    proto_msg_free(&m);
    return c->closing ? CDDP_ECLOSED : 0;
}

static void on_read_deadline(uv_timer_t *t)
{
    struct conn *c = t->data;
    struct rdzv_server *srv = c->srv;
    if (!c->helloed)
        conn_fail(c, CDDP_ETIMEOUT, "no hello within %.1f s of connecting",
                  (double)srv->opt.read_timeout_ms / 1000.0);
    else
        conn_fail(c, CDDP_ETIMEOUT, "a frame begun was not completed within %.1f s",
                  (double)srv->opt.read_timeout_ms / 1000.0);
    flush(srv);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    struct rdzv_server *srv = c->srv;
    /* One read at a time per loop: the buffer is consumed before the next. */
    if (srv->readbuf_busy) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    srv->readbuf_busy = true;
    *buf = uv_buf_init(srv->readbuf, sizeof(srv->readbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    struct rdzv_server *srv = c->srv;
    if (buf->base == srv->readbuf)
        srv->readbuf_busy = false;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread != UV_EOF)
            log_info("R0013", "%s: %s; closing the connection", c->name, uv_strerror((int)nread));
        else if (c->peer.node)
            log_info("R0014", "%s: connection closed by the peer", c->name);
        conn_close(c);
        flush(srv);
        return;
    }
    if (c->closing)
        return;
    int rc = proto_decoder_feed(&c->dec, buf->base, (size_t)nread, on_frame, c);
    if (rc == CDDP_ETOOBIG) {
        conn_fail(c, CDDP_ETOOBIG, "frame of %u bytes exceeds the limit of %u bytes",
                  proto_decoder_announced(&c->dec), PROTO_FRAME_MAX);
    } else if (rc && !c->closing) {
        conn_fail(c, rc, "cannot read frames: %s", cddp_strerror(rc));
    }
    /* A frame begun must complete within read_timeout; a quiet connection
     * between frames is fine (heartbeats watch the agents). */
    if (!c->closing && c->helloed) {
        if (proto_decoder_pending(&c->dec) == 0)
            uv_timer_stop(&c->timer);
        else if (!uv_is_active((uv_handle_t *)&c->timer))
            uv_timer_start(&c->timer, on_read_deadline, srv->opt.read_timeout_ms, 0);
    }
    flush(srv);
}

/* ---- accepting ---- */

/* Called with each accepted socket's fd number. At the open-file limit
 * libuv takes its reserved fd, accepts every waiting connection and closes
 * it (uv__emfile_trick) and calls us for none of them: agents only read
 * "closed by the server". The fd numbers tell us the limit is near, so
 * say it once, while there is still room, and again after the count has
 * fallen well below. */
static void near_fd_limit(struct rdzv_server *srv, uv_os_fd_t fd)
{
    if (srv->fd_soft == 0 || srv->fd_soft == UINT64_MAX || fd < 0)
        return;
    uint64_t margin = srv->fd_soft / 64 > 8 ? srv->fd_soft / 64 : 8;
    uint64_t f = (uint64_t)fd;
    if (f + margin >= srv->fd_soft && !srv->fd_warned) {
        srv->fd_warned = true;
        log_warn("R0006",
                 "%zu connections open, fd %llu of the open-file limit %llu in use: connections "
                 "beyond the limit are closed as soon as they are accepted (peers read \"closed "
                 "by the server\"); raise the limit (ulimit -n, systemd's LimitNOFILE=)",
                 srv->nconns, (unsigned long long)f, (unsigned long long)srv->fd_soft);
    } else if (f + 4 * margin < srv->fd_soft) {
        srv->fd_warned = false;
    }
}

static void on_connection(uv_stream_t *listener, int status)
{
    struct rdzv_server *srv = listener->data;
    if (status < 0) {
        log_warn("R0002", "accept: %s", uv_strerror(status));
        return;
    }
    struct conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        log_error("R0003", "accept: out of memory");
        return;
    }
    c->srv = srv;
    cddp_queue_init(&c->drop_link);
    cddp_queue_init(&c->out_link);
    cddp_buf_init(&c->out, srv->opt.max_write_queue + PROTO_FRAME_MAX + PROTO_FRAME_HEADER);
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->open_handles = 2;
    proto_decoder_init(&c->dec, PROTO_FRAME_MAX);
    cddp_queue_insert_tail(&srv->conns, &c->link);
    srv->nconns++;
    c->detached = true; /* nothing to tell the state until it has a peer */
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    srv->stats.accepted++;
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        near_fd_limit(srv, fd);

    struct sockaddr_storage ss;
    int sl = sizeof(ss);
    char addr[64] = "?";
    bool loopback = false;
    int port = 0;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
        rdzv_wire_addr_name((struct sockaddr *)&ss, addr, sizeof(addr), &loopback);
        port = rdzv_wire_addr_port((struct sockaddr *)&ss);
    }
    cddp_hostport_format(addr, port, c->name, sizeof(c->name));
    rdzv_peer_init(&c->peer, addr, loopback, c);
    c->detached = false;
    /* TCP_NODELAY and keep-alive come from the listener (Linux copies them
     * into accepted sockets): no setsockopt per connection. */

    if (srv->nconns > srv->opt.max_connections) {
        c->over_limit = true;
        conn_fail(c, CDDP_ETOOBIG, "the server is at its limit of %zu connections",
                  srv->opt.max_connections);
        flush(srv);
        return;
    }
    uv_timer_start(&c->timer, on_read_deadline, srv->opt.read_timeout_ms, 0);
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc) {
        log_warn("R0004", "%s: cannot read: %s", c->name, uv_strerror(rc));
        conn_close(c);
    }
    log_debug("R0005", "%s: connected", c->name);
    flush(srv);
}

/* ---- start, stop ---- */

/* Options every accepted socket inherits: no Nagle delay (small frames
 * matter), and keep-alive probes after 60 s of silence so a peer that
 * vanished without a FIN (power loss, partition) is found in about two
 * minutes even if it never joined. */
static void set_listener_options(uv_tcp_t *l)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)l, &fd) != 0)
        return;
    int one = 1, idle = 60, intvl = 10, cnt = 6;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

static int listen_on(struct rdzv_server *srv, const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo *ai = NULL;
    int rc = rdzv_wire_resolve(srv->loop, host, port, true, &ai, err, errlen);
    if (rc)
        return rc;
    /* With no host, prefer IPv6 (dual stack); otherwise take resolver order. */
    struct addrinfo *pick[16];
    size_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (struct addrinfo *p = ai; p && n < 16; p = p->ai_next) {
            bool v6 = p->ai_family == AF_INET6;
            if (host == NULL || host[0] == '\0' ? (pass == 0) == v6 : pass == 0)
                pick[n++] = p;
        }
    }
    rc = UV_EADDRNOTAVAIL;
    for (size_t i = 0; i < n; i++) {
        uv_tcp_t *l = malloc(sizeof(*l));
        if (l == NULL) {
            rc = UV_ENOMEM;
            break;
        }
        uv_tcp_init(srv->loop, l);
        l->data = srv;
        rc = uv_tcp_bind(l, pick[i]->ai_addr, 0);
        if (rc == 0)
            rc = uv_listen((uv_stream_t *)l, srv->opt.backlog, on_connection);
        if (rc == 0) {
            srv->listener = l;
            set_listener_options(l);
            break;
        }
        uv_close((uv_handle_t *)l, free_handle);
    }
    if (rc == 0) {
        struct sockaddr_storage ss;
        int sl = sizeof(ss);
        char name[64] = "?";
        bool lo;
        uv_tcp_getsockname(srv->listener, (struct sockaddr *)&ss, &sl);
        rdzv_wire_addr_name((struct sockaddr *)&ss, name, sizeof(name), &lo);
        srv->port = rdzv_wire_addr_port((struct sockaddr *)&ss);
        cddp_hostport_format(name, srv->port, srv->address, sizeof(srv->address));
    } else {
        snprintf(err, errlen, "cannot listen on %s port %d: %s", host && *host ? host : "*", port,
                 uv_strerror(rc));
    }
    uv_freeaddrinfo(ai);
    return rc;
}

int rdzv_server_start(uv_loop_t *loop, const struct rdzv_server_options *o,
                      struct rdzv_server **out, char *err, size_t errlen)
{
    struct rdzv_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    srv->loop = loop;
    srv->opt = *o;
    srv->fd_soft = cddp_fdlimit_soft();
    if (srv->opt.read_timeout_ms == 0)
        srv->opt.read_timeout_ms = 60000;
    if (srv->opt.max_connections == 0)
        srv->opt.max_connections = 100000;
    if (srv->opt.max_write_queue == 0)
        srv->opt.max_write_queue = 64u << 20;
    if (srv->opt.backlog <= 0)
        srv->opt.backlog = 65535;
    snprintf(srv->name, sizeof(srv->name), "%s", o->name ? o->name : "cddp-rdzv " CDDP_VERSION);
    srv->opt.name = srv->name;
    cddp_queue_init(&srv->conns);
    cddp_queue_init(&srv->drops);
    cddp_queue_init(&srv->dirty);
    if (o->token && o->token[0]) {
        srv->token = strdup(o->token);
        if (srv->token == NULL) {
            free(srv);
            snprintf(err, errlen, "out of memory");
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        }
    }
    srv->opt.token = NULL;
    srv->opt.host = NULL;

    struct rdzv_state_options so = {.store_only = o->store_only};
    if (getrandom(so.seed, sizeof(so.seed), 0) != (ssize_t)sizeof(so.seed)) {
        so.seed[0] = (uint64_t)uv_hrtime() ^ (uint64_t)(uintptr_t)srv;
        so.seed[1] = (uint64_t)uv_os_getpid() * 0x9e3779b97f4a7c15ull;
    }
    srv->state = rdzv_state_new(&so);
    if (srv->state == NULL) {
        free(srv->token);
        free(srv);
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    int rc = listen_on(srv, o->host, o->port, err, errlen);
    if (rc) {
        /* Handles of failed attempts free themselves when their close completes. */
        rdzv_state_free(srv->state);
        free(srv->token);
        free(srv);
        return rc;
    }
    srv->open_handles = 3; /* listener, tick, drain_timer */
    uv_timer_init(loop, &srv->tick);
    srv->tick.data = srv;
    uv_timer_init(loop, &srv->drain_timer);
    srv->drain_timer.data = srv;
    *out = srv;
    return 0;
}

int rdzv_server_port(const struct rdzv_server *s)
{
    return s->port;
}

const char *rdzv_server_address(const struct rdzv_server *s)
{
    return s->address;
}

void rdzv_server_stats(const struct rdzv_server *s, struct rdzv_server_stats *out)
{
    *out = s->stats;
    out->connections = s->nconns;
    out->runs = rdzv_state_num_runs(s->state);
}

const struct rdzv_state *rdzv_server_state(const struct rdzv_server *s)
{
    return s->state;
}

static void shutdown_server(struct rdzv_server *srv, const char *reason, bool keep_runs,
                            void (*cb)(void *arg), void *arg)
{
    if (srv->shutting_down)
        return;
    if (srv->drain_run)
        drain_fire(srv);
    if (srv->shutting_down)
        return; /* the drain's callback shut the server down itself */
    if (keep_runs) {
        /* Nothing is said: to the agents this is a lost server, which
         * they reconnect to (a successor on the same port) and resume. */
        srv->keep_runs = true;
        flush(srv);
    } else {
        /* Tell every node first, while everything is still open. */
        rdzv_state_close_all(srv->state, now_ms(srv), reason ? reason : "server shutting down");
        apply_actions(srv);
        flush(srv);
    }
    srv->shutting_down = true;
    srv->shutdown_cb = cb;
    srv->shutdown_arg = arg;
    uv_close((uv_handle_t *)srv->listener, on_listener_closed);
    uv_close((uv_handle_t *)&srv->tick, on_server_handle_closed);
    uv_close((uv_handle_t *)&srv->drain_timer, on_server_handle_closed);
    struct cddp_queue *q = srv->conns.next;
    while (q != &srv->conns) {
        struct conn *c = cddp_queue_data(q, struct conn, link);
        q = q->next;
        conn_close_after_flush(c);
    }
    /* Detaching may have queued drops; they are closing anyway. */
    while (!cddp_queue_empty(&srv->drops))
        cddp_queue_remove(cddp_queue_head(&srv->drops));
}

void rdzv_server_shutdown(struct rdzv_server *srv, const char *reason, void (*cb)(void *arg),
                          void *arg)
{
    shutdown_server(srv, reason, false, cb, arg);
}

void rdzv_server_stop_keep_runs(struct rdzv_server *srv, void (*cb)(void *arg), void *arg)
{
    shutdown_server(srv, NULL, true, cb, arg);
}
