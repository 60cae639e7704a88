/* tcpstore.c: see tcpstore.h.
 *
 * Each connection owns a uv_tcp_t, a decoder, an input buffer for a query
 * that arrived in pieces and an output buffer of the replies of one loop
 * turn. Reads land in one buffer shared by all connections; a query that
 * is complete inside it is decoded in place, only an unfinished tail is
 * copied, and the decoder's "need" says when it is worth decoding again,
 * so a value of several MiB is not re-parsed per segment.
 *
 * Replies are queued with the query that caused them; the waits a query
 * completes (kvstore events) are answered on their own connections in the
 * same turn. Every callback ends with flush(): the output of every
 * connection that got some goes out, and connections that failed are
 * closed there, never under their own feet. */
#include "store/tcpstore.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/queue.h"
#include "common/strmap.h"

#define READ_BUF_SIZE (64 * 1024)

struct watch;

struct conn {
    uv_tcp_t tcp;
    struct tcpstore_server *srv;
    struct kvstore_owner owner;
    struct tcpstore_decoder dec;
    struct cddp_buf in;          /* an unfinished query */
    size_t need;                 /* decode again once in.len reaches this */
    struct cddp_buf out;         /* replies of this turn */
    struct cddp_queue link;      /* srv->conns */
    struct cddp_queue out_link;  /* srv->dirty while out has bytes */
    struct cddp_queue drop_link; /* srv->drops once it must close */
    struct cddp_queue watches;   /* struct watch.conn_link (V1 WATCH_KEY) */
    uint64_t next_wait;
    bool waiting; /* counted in stats.waiting */
    bool closing;
    char name[72];
};

/* Keys some connection watches (V1 WATCH_KEY), with their watchers. */
struct watched_key {
    struct cddp_queue watchers; /* struct watch.key_link */
    size_t klen;
    char key[];
};

struct watch {
    struct cddp_queue key_link, conn_link;
    struct conn *c;
    struct watched_key *wk;
};

struct tcpstore_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    struct kvstore *store;
    struct tcpstore_server_options opt;
    struct cddp_strmap watched; /* key -> struct watched_key */
    struct cddp_queue conns, dirty, drops;
    int port;
    char address[300];
    bool closing;
    int open_handles; /* the listener and every connection */
    void (*close_cb)(void *arg);
    void *close_arg;
    struct tcpstore_stats stats;
    size_t held;   /* unfinished queries and queued replies of every connection */
    char *scratch; /* NUL-terminated key copies for one query */
    size_t scratch_cap;
    const char **keyv;
    size_t keyv_cap;
    char readbuf[READ_BUF_SIZE];
};

static void flush(struct tcpstore_server *srv);

/* Keeps stats.waiting in step with c's pending waits. */
static void update_waiting(struct conn *c)
{
    bool w = c->owner.nwaiters > 0 && !uv_is_closing((uv_handle_t *)&c->tcp);
    if (w != c->waiting)
        c->srv->stats.waiting += w ? 1 : (size_t)-1;
    c->waiting = w;
}

/* ---- teardown ---- */

static void maybe_free(struct tcpstore_server *srv)
{
    if (!srv->closing || srv->open_handles > 0)
        return;
    void (*cb)(void *) = srv->close_cb;
    void *arg = srv->close_arg;
    size_t it = 0;
    const char *k;
    size_t kl;
    void *v;
    while (cddp_strmap_next(&srv->watched, &it, &k, &kl, &v))
        free(v);
    cddp_strmap_free(&srv->watched);
    kvstore_free(srv->store);
    free(srv->scratch);
    free(srv->keyv);
    log_info("S0707", "TCPStore on %s stopped", srv->address);
    free(srv);
    if (cb)
        cb(arg);
}

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct tcpstore_server *srv = c->srv;
    srv->held -= c->in.len;
    cddp_buf_free(&c->in);
    cddp_buf_free(&c->out);
    free(c);
    srv->open_handles--;
    maybe_free(srv);
}

static void unwatch_all(struct conn *c)
{
    struct tcpstore_server *srv = c->srv;
    while (!cddp_queue_empty(&c->watches)) {
        struct watch *w = cddp_queue_data(cddp_queue_head(&c->watches), struct watch, conn_link);
        cddp_queue_remove(&w->conn_link);
        cddp_queue_remove(&w->key_link);
        if (cddp_queue_empty(&w->wk->watchers)) {
            cddp_strmap_del(&srv->watched, w->wk->key, w->wk->klen);
            free(w->wk);
        }
        free(w);
    }
}

static void conn_close(struct conn *c)
{
    if (uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    struct tcpstore_server *srv = c->srv;
    c->closing = true;
    kvstore_cancel_owner(srv->store, &c->owner);
    update_waiting(c);
    unwatch_all(c);
    cddp_queue_remove(&c->link);
    cddp_queue_remove(&c->out_link);
    cddp_queue_remove(&c->drop_link);
    srv->stats.connections--;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

/* Marks c to be closed at the end of this turn, with one log line. */
static void conn_fail(struct conn *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_fail(struct conn *c, int code, const char *fmt, ...)
{
    if (c->closing)
        return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    c->closing = true;
    c->srv->stats.refused++;
    log_warn("S0703", "TCPStore client %s: %s (%s); closing the connection", c->name, msg,
             cddp_err_name(code));
    cddp_queue_insert_tail(&c->srv->drops, &c->drop_link);
}

/* ---- output ---- */

struct wreq {
    uv_write_t req;
    uv_buf_t buf;
    char *data;
    struct tcpstore_server *srv; /* alive: requests end before their handle's close */
};

static void on_written(uv_write_t *req, int status)
{
    (void)status; /* a failed write shows up as a read error on the same socket */
    struct wreq *w = (struct wreq *)req;
    w->srv->held -= w->buf.len;
    free(w->data);
    free(w);
}

/* Sends c->out: what the socket takes at once, the rest through uv_write,
 * which takes the buffer over. */
static void write_out(struct conn *c)
{
    cddp_queue_remove(&c->out_link);
    if (c->closing || c->out.len == 0)
        return;
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned int)c->out.len);
    int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n == (int)c->out.len) {
        cddp_buf_reset(&c->out);
        return;
    }
    if (n < 0 && n != UV_EAGAIN) {
        log_info("S0704", "TCPStore client %s: write: %s; closing the connection", c->name,
                 uv_strerror(n));
        c->closing = true;
        cddp_queue_insert_tail(&c->srv->drops, &c->drop_link);
        return;
    }
    n = n < 0 ? 0 : n;
    struct wreq *w = malloc(sizeof(*w));
    if (w == NULL) {
        conn_fail(c, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory queueing a reply");
        return;
    }
    w->data = c->out.data;
    w->srv = c->srv;
    w->buf = uv_buf_init(c->out.data + n, (unsigned int)(c->out.len - (size_t)n));
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &w->buf, 1, on_written);
    if (rc) {
        free(w);
        conn_fail(c, rc, "cannot queue a reply: %s", uv_strerror(rc));
        return;
    }
    c->srv->held += w->buf.len;
    cddp_buf_init(&c->out, c->out.max);
}

/* c has new output (call after appending to c->out). */
static void mark_dirty(struct conn *c)
{
    if (c->out_link.next == &c->out_link && !c->closing)
        cddp_queue_insert_tail(&c->srv->dirty, &c->out_link);
}

/* The result of appending a reply: past max_write_queue the client is not
 * reading, and gets closed. */
static void reply_done(struct conn *c, int rc)
{
    struct tcpstore_server *srv = c->srv;
    size_t queued = c->tcp.write_queue_size + c->out.len;
    if (rc == 0 && queued <= srv->opt.max_write_queue &&
        srv->held + c->out.len <= srv->opt.max_held) {
        mark_dirty(c);
        return;
    }
    /* The only way to fail appending to out is its maximum, which is
     * max_write_queue too: either way the client does not read. */
    if (c->closing)
        return;
    log_warn("S0705",
             "TCPStore client %s: does not read its replies (%zu bytes queued, limit %zu); "
             "closing the connection",
             c->name, queued, c->srv->opt.max_write_queue);
    c->closing = true;
    c->srv->stats.refused++;
    cddp_queue_insert_tail(&c->srv->drops, &c->drop_link);
}

static void flush(struct tcpstore_server *srv)
{
    while (!cddp_queue_empty(&srv->dirty) || !cddp_queue_empty(&srv->drops)) {
        while (!cddp_queue_empty(&srv->dirty))
            write_out(cddp_queue_data(cddp_queue_head(&srv->dirty), struct conn, out_link));
        while (!cddp_queue_empty(&srv->drops))
            conn_close(cddp_queue_data(cddp_queue_head(&srv->drops), struct conn, drop_link));
    }
}

/* Answers the waits that the last store call completed. */
static void drain_events(struct tcpstore_server *srv)
{
    struct kvstore_event ev;
    while (kvstore_next_event(srv->store, &ev)) {
        struct conn *w = cddp_queue_data(ev.owner, struct conn, owner);
        update_waiting(w);
        reply_done(w, tcpstore_put_u8(&w->out, TCPSTORE_WAIT_STOP_WAITING));
    }
}

/* ---- keys as C strings ---- */

/* Room in the server's scratch space for n keys of total bytes (NULs
 * included). 0 or -ENOMEM. */
static int scratch_reserve(struct tcpstore_server *srv, size_t total, size_t n)
{
    if (total > srv->scratch_cap) {
        char *p = realloc(srv->scratch, total);
        if (p == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        srv->scratch = p;
        srv->scratch_cap = total;
    }
    if (n > srv->keyv_cap) {
        const char **v = realloc(srv->keyv, n * sizeof(*v));
        if (v == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        srv->keyv = v;
        srv->keyv_cap = n;
    }
    return 0;
}

/* Copies the query's key (one key) or key list into the scratch space as C
 * strings; srv->keyv points at them. CDDP_EPARSE if a key holds a NUL byte
 * (the store's keys are C strings), -ENOMEM. */
static int keys_to_c(struct tcpstore_server *srv, const struct tcpstore_query *q, bool list)
{
    size_t total = 0, pos = 0, n = 0;
    struct tcpstore_bytes k = q->key;
    for (bool more = list ? tcpstore_query_next(q, &pos, &k, NULL) : true; more;
         more = list && tcpstore_query_next(q, &pos, &k, NULL)) {
        if (k.n && memchr(k.p, 0, k.n))
            return CDDP_EPARSE;
        total += k.n + 1;
        n++;
    }
    int rc = scratch_reserve(srv, total, n);
    if (rc)
        return rc;
    char *at = srv->scratch;
    pos = 0;
    k = q->key;
    for (size_t i = 0; i < n; i++) {
        if (list)
            tcpstore_query_next(q, &pos, &k, NULL);
        if (k.n)
            memcpy(at, k.p, k.n);
        at[k.n] = '\0';
        srv->keyv[i] = at;
        at += k.n + 1;
    }
    return 0;
}

/* ---- V1 watches ---- */

/* A copy of key's value before a change, for the watchers (NULL: none). */
struct before {
    bool watched;
    bool had;
    char *val;
    size_t vlen;
};

static void before_change(struct tcpstore_server *srv, const char *key, struct before *b)
{
    memset(b, 0, sizeof(*b));
    if (srv->watched.len == 0 || cddp_strmap_get(&srv->watched, key, strlen(key)) == NULL)
        return;
    b->watched = true;
    const void *v;
    if (kvstore_get(srv->store, key, &v, &b->vlen) == 0) {
        b->had = true;
        b->val = malloc(b->vlen + 1);
        if (b->val)
            memcpy(b->val, v, b->vlen);
        else
            b->vlen = 0;
    }
}

/* Tells key's watchers what changed, as torch 1.13's server: created or
 * updated (old, new), or deleted (old, empty). */
static void after_change(struct tcpstore_server *srv, const char *key, struct before *b)
{
    if (!b->watched)
        return;
    struct watched_key *wk = cddp_strmap_get(&srv->watched, key, strlen(key));
    const void *nv = NULL;
    size_t nlen = 0;
    bool has = kvstore_get(srv->store, key, &nv, &nlen) == 0;
    if (wk && (has || b->had)) {
        uint8_t kind = !has     ? TCPSTORE_WATCH_KEY_DELETED
                       : b->had ? TCPSTORE_WATCH_KEY_UPDATED
                                : TCPSTORE_WATCH_KEY_CREATED;
        struct cddp_queue *q;
        cddp_queue_foreach(q, &wk->watchers)
        {
            struct conn *c = cddp_queue_data(q, struct watch, key_link)->c;
            int rc = tcpstore_put_u8(&c->out, kind);
            if (rc == 0)
                rc = tcpstore_put_bytes(&c->out, key, strlen(key));
            if (rc == 0)
                rc = tcpstore_put_bytes(&c->out, b->val, b->vlen);
            if (rc == 0)
                rc = tcpstore_put_bytes(&c->out, nv, has ? nlen : 0);
            reply_done(c, rc);
        }
    }
    free(b->val);
}

static int watch_key(struct conn *c, const char *key)
{
    struct tcpstore_server *srv = c->srv;
    size_t klen = strlen(key);
    struct watched_key *wk = cddp_strmap_get(&srv->watched, key, klen);
    if (wk == NULL) {
        wk = malloc(sizeof(*wk) + klen + 1);
        if (wk == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        cddp_queue_init(&wk->watchers);
        wk->klen = klen;
        memcpy(wk->key, key, klen + 1);
        if (cddp_strmap_put(&srv->watched, wk->key, klen, wk) != 0) {
            free(wk);
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        }
    }
    struct watch *w = malloc(sizeof(*w));
    if (w == NULL) {
        if (cddp_queue_empty(&wk->watchers)) {
            cddp_strmap_del(&srv->watched, wk->key, klen);
            free(wk);
        }
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    w->c = c;
    w->wk = wk;
    cddp_queue_insert_tail(&wk->watchers, &w->key_link);
    cddp_queue_insert_tail(&c->watches, &w->conn_link);
    return 0;
}

/* ---- queries ---- */

/* A store error on a query: the protocol has no error reply, so the
 * connection is closed (the client raises); the store goes on. */
static void store_failed(struct conn *c, const struct tcpstore_query *q, int rc)
{
    if (rc == CDDP_ETOOBIG)
        log_warn("S0706",
                 "TCPStore client %s: %s refused by the store (%zu bytes, %zu keys held; full, "
                 "or too many waits on one connection)",
                 c->name, tcpstore_op_name(q->op), kvstore_bytes(c->srv->store),
                 kvstore_num_keys(c->srv->store));
    conn_fail(c, rc, "%s refused: %s", tcpstore_op_name(q->op), cddp_strerror(rc));
}

static void do_set(struct conn *c, const char *key, struct tcpstore_bytes v, bool append,
                   const struct tcpstore_query *q)
{
    struct tcpstore_server *srv = c->srv;
    struct before b;
    before_change(srv, key, &b);
    int rc =
        append ? kvstore_append(srv->store, key, v.p, v.n) : kvstore_set(srv->store, key, v.p, v.n);
    if (rc) {
        free(b.val);
        store_failed(c, q, rc);
        return;
    }
    after_change(srv, key, &b);
    drain_events(srv);
}

static void do_compare_set(struct conn *c, const char *key, const struct tcpstore_query *q)
{
    struct tcpstore_server *srv = c->srv;
    struct before b;
    before_change(srv, key, &b);
    const void *cur;
    size_t curlen;
    int rc = kvstore_compare_set(srv->store, key, q->val.p, q->val.n, q->val2.p, q->val2.n, &cur,
                                 &curlen);
    if (rc) {
        free(b.val);
        store_failed(c, q, rc);
        return;
    }
    reply_done(c, tcpstore_put_bytes(&c->out, cur, curlen));
    after_change(srv, key, &b);
    drain_events(srv);
}

static void do_get(struct conn *c, const char *key)
{
    const void *v = NULL;
    size_t vlen = 0;
    /* Clients wait before they get; a key deleted meanwhile reads as
     * empty, as torch's libuv store answers. */
    if (kvstore_get(c->srv->store, key, &v, &vlen) != 0)
        vlen = 0;
    reply_done(c, tcpstore_put_bytes(&c->out, v, vlen));
}

static void do_add(struct conn *c, const char *key, const struct tcpstore_query *q)
{
    struct tcpstore_server *srv = c->srv;
    struct before b;
    before_change(srv, key, &b);
    int64_t out;
    int rc = kvstore_add64(srv->store, key, q->delta, &out);
    if (rc) {
        free(b.val);
        store_failed(c, q, rc);
        return;
    }
    reply_done(c, tcpstore_put_i64(&c->out, out));
    after_change(srv, key, &b);
    drain_events(srv);
}

static void do_wait(struct conn *c, const struct tcpstore_query *q)
{
    struct tcpstore_server *srv = c->srv;
    bool ready = true;
    int rc = 0;
    if (q->nitems > 0)
        rc = kvstore_wait(srv->store, srv->keyv, q->nitems, KVSTORE_NEVER, &c->owner,
                          c->next_wait++, false, &ready);
    if (rc) {
        store_failed(c, q, rc);
        return;
    }
    if (ready)
        reply_done(c, tcpstore_put_u8(&c->out, TCPSTORE_WAIT_STOP_WAITING));
    update_waiting(c);
}

static void do_watch_key(struct conn *c, const char *key, const struct tcpstore_query *q)
{
    int rc = watch_key(c, key);
    if (rc) {
        store_failed(c, q, rc);
        return;
    }
    reply_done(c, tcpstore_put_u8(&c->out, TCPSTORE_WATCH_REGISTERED));
}

static void do_delete(struct conn *c, const char *key)
{
    struct tcpstore_server *srv = c->srv;
    struct before b;
    before_change(srv, key, &b);
    int n = kvstore_delete(srv->store, key);
    reply_done(c, tcpstore_put_i64(&c->out, n));
    after_change(srv, key, &b);
}

static void do_multi_get(struct conn *c, const struct tcpstore_query *q)
{
    struct tcpstore_server *srv = c->srv;
    int rc = 0;
    for (size_t i = 0; i < q->nitems && rc == 0; i++) {
        const void *v = NULL;
        size_t vlen = 0;
        if (kvstore_get(srv->store, srv->keyv[i], &v, &vlen) != 0)
            vlen = 0;
        rc = tcpstore_put_bytes(&c->out, v, vlen);
    }
    reply_done(c, rc);
}

static void do_multi_set(struct conn *c, const struct tcpstore_query *q)
{
    size_t pos = 0;
    struct tcpstore_bytes k, v;
    while (!c->closing && tcpstore_query_next(q, &pos, &k, &v)) {
        struct tcpstore_query one = {.op = TCPSTORE_SET, .key = k};
        int rc = keys_to_c(c->srv, &one, false);
        if (rc) {
            conn_fail(c, rc, "MULTI_SET with a key that holds a NUL byte");
            return;
        }
        do_set(c, c->srv->keyv[0], v, false, q);
    }
}

static void do_cancel_wait(struct conn *c)
{
    kvstore_cancel_owner(c->srv->store, &c->owner);
    update_waiting(c);
    reply_done(c, tcpstore_put_u8(&c->out, TCPSTORE_WAIT_CANCELED));
}

static void do_queue_push(struct conn *c, const char *key, const struct tcpstore_query *q)
{
    int rc = kvstore_queue_push(c->srv->store, key, q->val.p, q->val.n);
    if (rc) {
        store_failed(c, q, rc);
        return;
    }
    drain_events(c->srv);
}

static void do_queue_pop(struct conn *c, const char *key)
{
    void *v = NULL;
    size_t vlen = 0, before = 0;
    /* The length before the pop, then the item; an empty queue: 0 alone. */
    bool got = kvstore_queue_pop(c->srv->store, key, &v, &vlen, &before) == 0;
    int rc = tcpstore_put_i64(&c->out, got ? (int64_t)before : 0);
    if (rc == 0 && got)
        rc = tcpstore_put_bytes(&c->out, v, vlen);
    free(v);
    reply_done(c, rc);
}

static void do_list(struct conn *c)
{
    struct kvstore *st = c->srv->store;
    size_t it = 0, kl;
    const char *k;
    int rc = tcpstore_put_i64(&c->out, (int64_t)kvstore_num_keys(st));
    while (rc == 0 && kvstore_next_key(st, &it, &k, &kl))
        rc = tcpstore_put_bytes(&c->out, k, kl);
    reply_done(c, rc);
}

/* The query's key or keys as C strings in the server's scratch space
 * (srv->keyv); *key: the one key of a query that has one. */
static int query_keys(struct conn *c, const struct tcpstore_query *q, const char **key)
{
    struct tcpstore_server *srv = c->srv;
    int rc = 0;
    *key = NULL;
    switch (tcpstore_op_shape(q->op)) {
    case TCPSTORE_SHAPE_KEY:
    case TCPSTORE_SHAPE_KEY_VAL:
    case TCPSTORE_SHAPE_KEY_VAL_VAL:
    case TCPSTORE_SHAPE_KEY_I64:
        rc = keys_to_c(srv, q, false);
        *key = rc == 0 ? srv->keyv[0] : NULL;
        break;
    case TCPSTORE_SHAPE_KEYS:
        rc = keys_to_c(srv, q, true);
        break;
    default:
        break;
    }
    return rc;
}

static void handle(struct conn *c, const struct tcpstore_query *q)
{
    struct kvstore *st = c->srv->store;
    struct cddp_buf *o = &c->out;
    const char *key;
    c->srv->stats.queries++;
    int rc = query_keys(c, q, &key);
    if (rc) {
        conn_fail(c, rc, "%s with a key that holds a NUL byte", tcpstore_op_name(q->op));
        return;
    }

    switch (q->op) {
    case TCPSTORE_VALIDATE:
        return;
    case TCPSTORE_PING:
        reply_done(c, tcpstore_put_u32(o, q->u32));
        return;
    case TCPSTORE_SET:
    case TCPSTORE_APPEND:
        do_set(c, key, q->val, q->op == TCPSTORE_APPEND, q);
        return;
    case TCPSTORE_COMPARE_SET:
        do_compare_set(c, key, q);
        return;
    case TCPSTORE_GET:
        do_get(c, key);
        return;
    case TCPSTORE_ADD:
        do_add(c, key, q);
        return;
    case TCPSTORE_CHECK:
        reply_done(c, tcpstore_put_u8(o, kvstore_check(st, c->srv->keyv, q->nitems)
                                             ? TCPSTORE_CHECK_READY
                                             : TCPSTORE_CHECK_NOT_READY));
        return;
    case TCPSTORE_WAIT:
        do_wait(c, q);
        return;
    case TCPSTORE_GETNUMKEYS:
        reply_done(c, tcpstore_put_i64(o, (int64_t)kvstore_num_keys(st)));
        return;
    case TCPSTORE_WATCH_KEY:
        do_watch_key(c, key, q);
        return;
    case TCPSTORE_DELETE_KEY:
        do_delete(c, key);
        return;
    case TCPSTORE_MULTI_GET:
        do_multi_get(c, q);
        return;
    case TCPSTORE_MULTI_SET:
        do_multi_set(c, q);
        return;
    case TCPSTORE_CANCEL_WAIT:
        do_cancel_wait(c);
        return;
    case TCPSTORE_QUEUE_PUSH:
        do_queue_push(c, key, q);
        return;
    case TCPSTORE_QUEUE_POP:
        do_queue_pop(c, key);
        return;
    case TCPSTORE_QUEUE_LEN:
        reply_done(c, tcpstore_put_i64(o, (int64_t)kvstore_queue_len(st, key)));
        return;
    case TCPSTORE_LIST:
        do_list(c);
        return;
    case TCPSTORE_NUM_OPS:
        break;
    }
}

/* ---- input ---- */

static void fail_decode(struct conn *c, int rc, const uint8_t *p, size_t len)
{
    const struct tcpstore_limits *l = &c->dec.lim;
    if (rc == CDDP_EPROTO_TYPE)
        conn_fail(c, rc, "unknown query type %u for a %s client", len ? p[0] : 0u,
                  tcpstore_dialect_name(c->dec.dialect));
    else if (rc == CDDP_EPROTO_VERSION)
        conn_fail(c, rc, "VALIDATE with a wrong magic number");
    else if (rc == CDDP_ETOOBIG)
        conn_fail(c, rc,
                  "a query past the limits (key %zu, value %zu bytes, %zu keys, query %zu bytes)",
                  l->max_key, l->max_value, l->max_keys, l->max_query);
    else
        conn_fail(c, rc, "cannot decode a query");
}

/* Decodes and handles the complete queries at p; returns how many bytes
 * they took. Sets c->need when an unfinished query is left. */
static size_t consume(struct conn *c, const uint8_t *p, size_t len)
{
    size_t off = 0;
    while (!c->closing && off < len) {
        enum tcpstore_dialect was = c->dec.dialect;
        struct tcpstore_query q;
        size_t used = 0, need = 0;
        int rc = tcpstore_decode(&c->dec, p + off, len - off, &q, &used, &need);
        if (rc == TCPSTORE_MORE) {
            c->need = need;
            break;
        }
        if (rc) {
            fail_decode(c, rc, p + off, len - off);
            break;
        }
        if (was == TCPSTORE_DIALECT_UNKNOWN) {
            if (c->dec.dialect == TCPSTORE_DIALECT_V2)
                c->srv->stats.dialect_v2++;
            else
                c->srv->stats.dialect_v1++;
            log_debug("S0708", "TCPStore client %s speaks %s", c->name,
                      tcpstore_dialect_name(c->dec.dialect));
        }
        handle(c, &q);
        off += used;
        c->need = 0;
    }
    return off;
}

static void feed(struct conn *c, const uint8_t *p, size_t n)
{
    if (c->in.len == 0) {
        size_t took = consume(c, p, n);
        if (c->closing || took == n)
            return;
        p += took;
        n -= took;
    }
    struct tcpstore_server *srv = c->srv;
    if (srv->held + n > srv->opt.max_held) {
        conn_fail(c, CDDP_ETOOBIG, "the server holds %zu bytes for its clients, its limit",
                  srv->held);
        return;
    }
    if (cddp_buf_append(&c->in, p, n) != 0) {
        conn_fail(c, CDDP_ETOOBIG, "more than %zu bytes of unfinished queries", c->in.max);
        return;
    }
    srv->held += n;
    if (c->in.len < c->need)
        return;
    size_t took = consume(c, (const uint8_t *)c->in.data, c->in.len);
    cddp_buf_consume(&c->in, took);
    srv->held -= took;
    if (c->in.len == 0 && c->in.cap > READ_BUF_SIZE)
        cddp_buf_free(&c->in); /* give a big value's buffer back */
}

/* libuv calls on_read with this buffer before it allocates another, and
 * feed() copies what it keeps: one buffer serves every connection. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct tcpstore_server *srv = ((struct conn *)h->data)->srv;
    *buf = uv_buf_init(srv->readbuf, sizeof(srv->readbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    struct tcpstore_server *srv = c->srv;
    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread != UV_EOF)
            log_info("S0704", "TCPStore client %s: %s; closing the connection", c->name,
                     uv_strerror((int)nread));
        else
            log_debug("S0709", "TCPStore client %s closed the connection", c->name);
        conn_close(c);
        flush(srv);
        return;
    }
    if (!c->closing)
        feed(c, (const uint8_t *)buf->base, (size_t)nread);
    flush(srv);
}

static void peer_name(uv_tcp_t *t, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    int sl = sizeof(ss);
    char host[64] = "?";
    int port = 0;
    if (uv_tcp_getpeername(t, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            uv_ip4_name(in, host, sizeof(host));
            port = ntohs(in->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(in6, host, sizeof(host));
            port = ntohs(in6->sin6_port);
        }
    }
    cddp_hostport_format(host, port, buf, len);
}

static void on_connection(uv_stream_t *l, int status)
{
    struct tcpstore_server *srv = l->data;
    if (status < 0) {
        log_warn("S0702", "TCPStore: accept: %s", uv_strerror(status));
        return;
    }
    struct conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        log_warn("S0702", "TCPStore: accept: out of memory");
        return;
    }
    c->srv = srv;
    kvstore_owner_init(&c->owner);
    tcpstore_decoder_init(&c->dec, &srv->opt.wire);
    cddp_buf_init(&c->in, c->dec.lim.max_query + READ_BUF_SIZE);
    cddp_buf_init(&c->out, srv->opt.max_write_queue);
    cddp_queue_init(&c->out_link);
    cddp_queue_init(&c->drop_link);
    cddp_queue_init(&c->watches);
    uv_tcp_init(srv->loop, &c->tcp);
    c->tcp.data = c;
    srv->open_handles++;
    srv->stats.connections++;
    cddp_queue_insert_tail(&srv->conns, &c->link);
    if (uv_accept(l, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    srv->stats.accepted++;
    peer_name(&c->tcp, c->name, sizeof(c->name));
    /* A client that vanished without a FIN (a half-open connection) is found
     * by keep-alive probes after a minute of silence. */
    uv_tcp_keepalive(&c->tcp, 1, 60);
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc) {
        log_warn("S0702", "TCPStore client %s: cannot read: %s", c->name, uv_strerror(rc));
        conn_close(c);
    }
}

/* ---- start, stop ---- */

static int bind_listen(struct tcpstore_server *srv, const struct sockaddr *sa)
{
    int rc = uv_tcp_bind(&srv->listener, sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&srv->listener, srv->opt.backlog, on_connection);
    return rc;
}

/* Listens on the first address of host that works; every interface when
 * host is empty (IPv6 dual stack first, then IPv4). */
static int listen_on(struct tcpstore_server *srv, const char *host, int port, char *err,
                     size_t errlen)
{
    int rc;
    if (host == NULL || host[0] == '\0') {
        /* Probe for IPv6 first: a failed bind would leave the handle with a socket. */
        int probe = socket(AF_INET6, SOCK_STREAM, 0);
        if (probe >= 0) {
            close(probe);
            struct sockaddr_in6 a6;
            uv_ip6_addr("::", port, &a6);
            rc = bind_listen(srv, (const struct sockaddr *)&a6);
        } else {
            struct sockaddr_in a4;
            uv_ip4_addr("0.0.0.0", port, &a4);
            rc = bind_listen(srv, (const struct sockaddr *)&a4);
        }
    } else {
        struct addrinfo hints, *ai = NULL;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
        char service[16];
        snprintf(service, sizeof(service), "%d", port);
        uv_getaddrinfo_t req;
        rc = uv_getaddrinfo(srv->loop, &req, NULL, host, service, &hints);
        if (rc) {
            snprintf(err, errlen, "cannot resolve '%s': %s", host, uv_strerror(rc));
            return rc;
        }
        ai = req.addrinfo;
        rc = bind_listen(srv, ai->ai_addr);
        uv_freeaddrinfo(ai);
    }
    if (rc) {
        snprintf(err, errlen, "cannot listen on %s port %d: %s", host && *host ? host : "*", port,
                 uv_strerror(rc));
        return rc;
    }
    struct sockaddr_storage ss;
    int sl = sizeof(ss);
    uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&ss, &sl);
    srv->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    cddp_hostport_format(host && *host ? host : "*", srv->port, srv->address, sizeof(srv->address));
    /* Accepted sockets inherit these: no Nagle delay for one-byte replies. */
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&srv->listener, &fd) == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return 0;
}

static void on_listener_closed(uv_handle_t *h)
{
    struct tcpstore_server *srv = h->data;
    srv->open_handles--;
    maybe_free(srv);
}

static void free_on_close(uv_handle_t *h)
{
    free(h->data);
}

int tcpstore_server_start(uv_loop_t *loop, const struct tcpstore_server_options *o,
                          struct tcpstore_server **out, char *err, size_t errlen)
{
    struct tcpstore_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    srv->loop = loop;
    srv->opt = *o;
    srv->opt.host = NULL;
    srv->opt.wire = tcpstore_limits_resolve(&o->wire);
    if (srv->opt.max_write_queue == 0)
        srv->opt.max_write_queue = 256u << 20;
    if (srv->opt.max_held == 0)
        srv->opt.max_held = (size_t)1 << 30;
    if (srv->opt.backlog <= 0)
        srv->opt.backlog = 65535;
    uint64_t seed[2];
    if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        seed[0] = uv_hrtime() ^ (uint64_t)(uintptr_t)srv;
        seed[1] = (uint64_t)uv_os_getpid() * 0x9e3779b97f4a7c15ull;
    }
    srv->store = kvstore_new(&o->store, seed[0], seed[1]);
    if (srv->store == NULL) {
        free(srv);
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    cddp_strmap_init(&srv->watched, seed[1], seed[0]);
    cddp_queue_init(&srv->conns);
    cddp_queue_init(&srv->dirty);
    cddp_queue_init(&srv->drops);
    uv_tcp_init(loop, &srv->listener);
    srv->listener.data = srv;
    int rc = listen_on(srv, o->host, o->port, err, errlen);
    if (rc) {
        /* The listener is embedded: free the server once its close is done. */
        srv->listener.data = srv;
        kvstore_free(srv->store);
        cddp_strmap_free(&srv->watched);
        uv_close((uv_handle_t *)&srv->listener, free_on_close);
        return rc;
    }
    srv->open_handles = 1;
    log_info("S0701", "TCPStore listening on %s", srv->address);
    *out = srv;
    return 0;
}

int tcpstore_server_set(struct tcpstore_server *srv, const char *key, const void *val, size_t len)
{
    struct before b;
    before_change(srv, key, &b);
    int rc = kvstore_set(srv->store, key, val, len);
    if (rc) {
        free(b.val);
        return rc;
    }
    after_change(srv, key, &b);
    drain_events(srv);
    flush(srv);
    return 0;
}

int tcpstore_server_port(const struct tcpstore_server *s)
{
    return s->port;
}

void tcpstore_server_stats(const struct tcpstore_server *s, struct tcpstore_stats *out)
{
    *out = s->stats;
    out->keys = kvstore_num_keys(s->store);
    out->held = s->held;
    out->bytes = kvstore_bytes(s->store);
}

void tcpstore_server_close(struct tcpstore_server *srv, void (*cb)(void *arg), void *arg)
{
    if (srv->closing)
        return;
    flush(srv);
    srv->closing = true;
    srv->close_cb = cb;
    srv->close_arg = arg;
    uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
    while (!cddp_queue_empty(&srv->conns))
        conn_close(cddp_queue_data(cddp_queue_head(&srv->conns), struct conn, link));
}
