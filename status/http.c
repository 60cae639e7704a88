/*
 * http.c: see http.h.
 *
 * libmicrohttpd runs in "external" epoll mode on a thread of ours: the thread
 * polls MHD's epoll fd and an eventfd (to stop), calls MHD_run, then cuts off
 * the connections whose request has outlived request_timeout_ms. MHD's own
 * timeout only catches idle connections; a client that trickles one header
 * byte a second is never idle, so we keep each connection's start time
 * (reset when a response completes) in a list ordered by that time and
 * shutdown(2) the socket of the oldest ones. shutdown() does not close the
 * fd: MHD sees the hang-up on its next turn and closes the connection itself.
 * Because the list and MHD_run live on the same thread, and MHD reports a
 * connection closed before it closes the fd, every fd in the list is open.
 *
 * Clients cannot keep a probe out either. At max_connections MHD would
 * stop accepting and a probe would wait in the listen backlog behind every
 * idle or trickling connection (kubelet gives it 1 s). So MHD's own limit
 * is set above ours, and a connection that takes us past max_connections
 * evicts the one whose request (or idle wait) began longest ago and is
 * not being answered (make_room): the same list, shut down the same way.
 * A probe sends its request at once and is answered in the turn that reads
 * it, long before it could become the oldest; slow and idle clients are
 * the old ones; and a connection reaches accept() only once it has sent
 * something (TCP_DEFER_ACCEPT), so idle ones wait outside meanwhile. A per-IP
 * limit would not do this: every client of a loopback or node-local port
 * (kubelet, a scraper, an attacker behind the same NAT) shares one address,
 * and MHD refuses the newest, which is the probe.
 *
 * libmicrohttpd is not linked: its functions are called through
 * status_mhd, a table filled when the first server starts (mhd.h), so the
 * programs that serve no status port never load it.
 */
#include "status/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h> /* types and constants; the calls go through status_mhd */

#include "common/clock.h"
#include "common/errors.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/queue.h"
#include "common/strutil.h"
#include "status/dashboard.h"
#include "status/listen.h"
#include "status/mhd.h"
#include "status/prom.h"

/* ---- snapshots ------------------------------------------------------- */

struct status_snapshot {
    atomic_uint refs;
    bool frozen;
    uint64_t published_ms;
    char *status;
    size_t status_len;
    char *metrics;
    size_t metrics_len;
    char *stacks; /* the last on-demand stack capture (GET /stacks); NULL: none */
    size_t stacks_len;
    size_t ncheck;
    struct status_check checks[STATUS_MAX_CHECKS];
};

struct status_snapshot *status_snapshot_new(void)
{
    struct status_snapshot *s = calloc(1, sizeof(*s));
    if (s)
        atomic_init(&s->refs, 1);
    return s;
}

static int set_text(char **dst, size_t *dst_len, const char *src, size_t len)
{
    char *p = malloc(len + 1);
    if (p == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (len)
        memcpy(p, src, len);
    p[len] = '\0';
    free(*dst);
    *dst = p;
    *dst_len = len;
    return 0;
}

int status_snapshot_set_status(struct status_snapshot *s, const char *json, size_t len)
{
    if (s->frozen)
        return CDDP_ESTATE;
    return set_text(&s->status, &s->status_len, json, len);
}

int status_snapshot_set_metrics(struct status_snapshot *s, const char *text, size_t len)
{
    if (s->frozen)
        return CDDP_ESTATE;
    return set_text(&s->metrics, &s->metrics_len, text, len);
}

int status_snapshot_set_stacks(struct status_snapshot *s, const char *text, size_t len)
{
    if (s->frozen)
        return CDDP_ESTATE;
    return set_text(&s->stacks, &s->stacks_len, text, len);
}

static bool valid_check_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= STATUS_CHECK_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

int status_snapshot_add_check(struct status_snapshot *s, const char *name, bool ok,
                              const char *reason)
{
    if (s->frozen)
        return CDDP_ESTATE;
    if (name == NULL || !valid_check_name(name) || strcmp(name, "loop") == 0)
        return CDDP_EPARSE;
    for (size_t i = 0; i < s->ncheck; i++)
        if (strcmp(s->checks[i].name, name) == 0)
            return CDDP_EPARSE;
    if (s->ncheck == STATUS_MAX_CHECKS)
        return CDDP_ETOOBIG;
    struct status_check *c = &s->checks[s->ncheck++];
    cddp_strlcpy(c->name, name, sizeof(c->name));
    cddp_strlcpy(c->reason, reason ? reason : "", sizeof(c->reason));
    /* A reason is one line in the ?verbose listing. */
    for (char *p = c->reason; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    c->ok = ok;
    return 0;
}

const char *status_snapshot_status(const struct status_snapshot *s, size_t *len)
{
    if (s->status == NULL) {
        *len = 2;
        return "{}";
    }
    *len = s->status_len;
    return s->status;
}

const char *status_snapshot_metrics(const struct status_snapshot *s, size_t *len)
{
    *len = s->metrics_len;
    return s->metrics ? s->metrics : "";
}

size_t status_snapshot_check_count(const struct status_snapshot *s)
{
    return s->ncheck;
}

const struct status_check *status_snapshot_check(const struct status_snapshot *s, size_t i)
{
    return i < s->ncheck ? &s->checks[i] : NULL;
}

bool status_snapshot_ready(const struct status_snapshot *s)
{
    for (size_t i = 0; i < s->ncheck; i++)
        if (!s->checks[i].ok)
            return false;
    return true;
}

uint64_t status_snapshot_published_ms(const struct status_snapshot *s)
{
    return s->published_ms;
}

struct status_snapshot *status_snapshot_ref(struct status_snapshot *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void status_snapshot_unref(struct status_snapshot *s)
{
    if (s == NULL)
        return;
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    free(s->status);
    free(s->metrics);
    free(s->stacks);
    free(s);
}

int status_cell_init(struct status_cell *c)
{
    c->current = NULL;
    c->generation = 0;
    int rc = pthread_mutex_init(&c->mu, NULL);
    return rc ? CDDP_ERR_FROM_ERRNO(rc) : 0;
}

void status_cell_publish(struct status_cell *c, struct status_snapshot *s)
{
    s->frozen = true;
    s->published_ms = cddp_mono_ms();
    pthread_mutex_lock(&c->mu);
    struct status_snapshot *old = c->current;
    c->current = s;
    c->generation++;
    pthread_mutex_unlock(&c->mu);
    /* Outside the lock: freeing a large snapshot must not delay a reader. */
    status_snapshot_unref(old);
}

struct status_snapshot *status_cell_acquire(struct status_cell *c, uint64_t *generation)
{
    pthread_mutex_lock(&c->mu);
    struct status_snapshot *s = c->current ? status_snapshot_ref(c->current) : NULL;
    if (generation)
        *generation = c->generation;
    pthread_mutex_unlock(&c->mu);
    return s;
}

void status_cell_destroy(struct status_cell *c)
{
    status_snapshot_unref(c->current);
    c->current = NULL;
    pthread_mutex_destroy(&c->mu);
}

/* ---- the server ------------------------------------------------------ */

/* One TCP connection, from MHD's STARTED notification to its CLOSED one. */
struct conn {
    struct cddp_queue node; /* in the deadline list, oldest first; or alone */
    int fd;
    uint64_t t0_ms; /* opened, or its previous response completed */
    size_t body;    /* body bytes of the current request */
    bool asked;     /* a request without a body is in: its answer is on the way */
};

struct status_server {
    struct status_server_options opt; /* its strings are not kept: see below */
    char program[32];
    char addr[300];
    int port;
    int listen_fd;
    int wake_fd;
    struct MHD_Daemon *mhd;
    pthread_t thread;
    bool thread_started;
    struct status_cell cell;
    atomic_uint_fast64_t heartbeat_ms;

    /* Owned by the HTTP thread. */
    struct cddp_queue deadlines; /* struct conn, by t0_ms */
    unsigned tracked;            /* connections in deadlines (not cut yet) */
    unsigned closed_in_run;      /* connections MHD closed during the last MHD_run */

    /* Written by the HTTP thread, read by status_server_stats(). */
    atomic_uint_fast64_t connections_total;
    atomic_uint_fast64_t connections_open;
    atomic_uint_fast64_t requests_total;
    atomic_uint_fast64_t slow_closed_total;
    atomic_uint_fast64_t evicted_total;
    atomic_uint_fast64_t responses[6];
};

void status_server_options_default(struct status_server_options *o)
{
    memset(o, 0, sizeof(*o));
    o->addr = "127.0.0.1";
    o->port = 0;
    o->program = "cddp";
    o->max_connections = 64;
    o->idle_timeout_s = 5;
    o->request_timeout_ms = 10000;
    o->max_header_bytes = 8192;
    o->max_body_bytes = 1024;
    o->live_timeout_ms = 5000;
}

static void add_stat(atomic_uint_fast64_t *v, int64_t d)
{
    atomic_fetch_add_explicit(v, (uint_fast64_t)d, memory_order_relaxed);
}

static uint64_t get_stat(atomic_uint_fast64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* Cuts c off: MHD sees the hang-up on its next turn and closes it (and
 * reports the close, which frees c). Only for a connection in the list. */
static void cut(struct status_server *s, struct conn *c)
{
    cddp_queue_remove(&c->node); /* and empty: cut once */
    s->tracked--;
    shutdown(c->fd, SHUT_RDWR);
}

/* Past our limit: the oldest goes, never the newcomer (see above), and
 * never one that has sent a request MHD has not answered yet. Clients
 * that reconnect as fast as they are cut turn the list over in a few ms
 * (3,000 idle clients on loopback: 10,000 connections a second), so the
 * oldest could be a probe accepted 2 ms ago, before its request came or
 * with its answer due in MHD's next call, when 64 others were accepted in
 * between: cut, it saw the connection close with no answer (1 probe in
 * about 700 under ASan, with the idle clients accepted at once). Now a
 * connection is accepted only once its first bytes are in (status_listen:
 * TCP_DEFER_ACCEPT), and one with bytes waiting to be read, or with a
 * request without a body in (asked: the answer comes next), is passed
 * over. An idle client has neither (and is accepted only after the defer
 * time); a trickling one's byte is read in MHD's next turn; one that sends
 * whole requests is answered and goes to the list's end. When every
 * tracked connection is passed over none is cut: MHD's limit above ours
 * holds them meanwhile. */
static void make_room(struct status_server *s)
{
    struct cddp_queue *q = cddp_queue_head(&s->deadlines);
    while (s->tracked > s->opt.max_connections && q != &s->deadlines) {
        struct conn *c = cddp_queue_data(q, struct conn, node);
        q = q->next;
        int unread = 0;
        if (c->asked || (ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0))
            continue;
        add_stat(&s->evicted_total, 1);
        cut(s, c);
    }
}

static void on_connection(void *cls, struct MHD_Connection *connection, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct status_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn *c = calloc(1, sizeof(*c));
        *socket_context = c;
        if (c == NULL)
            return; /* not tracked: MHD's idle timeout still applies */
        const union MHD_ConnectionInfo *ci =
            status_mhd.get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        c->t0_ms = cddp_mono_ms();
        cddp_queue_init(&c->node);
        if (c->fd >= 0) {
            cddp_queue_insert_tail(&s->deadlines, &c->node);
            s->tracked++;
        }
        add_stat(&s->connections_total, 1);
        add_stat(&s->connections_open, 1);
        make_room(s);
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
        struct conn *c = *socket_context;
        if (c == NULL)
            return;
        if (!cddp_queue_empty(&c->node))
            s->tracked--;
        cddp_queue_remove(&c->node);
        free(c);
        *socket_context = NULL;
        add_stat(&s->connections_open, -1);
        s->closed_in_run++;
    }
}

static struct conn *conn_of(struct MHD_Connection *connection)
{
    const union MHD_ConnectionInfo *ci =
        status_mhd.get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct status_server *s = cls;
    struct conn *c = conn_of(connection);
    *con_cls = NULL;
    if (c)
        c->asked = false;
    if (c == NULL || cddp_queue_empty(&c->node) || toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        return;
    /* Answered: its next request gets a fresh budget, at the list's end. */
    cddp_queue_remove(&c->node);
    c->t0_ms = cddp_mono_ms();
    c->body = 0;
    cddp_queue_insert_tail(&s->deadlines, &c->node);
}

/* Cuts off connections past their deadline; returns ms until the next one
 * is due, or -1 when none is tracked. */
static int reap(struct status_server *s)
{
    uint64_t now = cddp_mono_ms();
    while (!cddp_queue_empty(&s->deadlines)) {
        struct conn *c = cddp_queue_data(cddp_queue_head(&s->deadlines), struct conn, node);
        uint64_t due = c->t0_ms + s->opt.request_timeout_ms;
        if (due > now) {
            uint64_t wait = due - now;
            return wait > INT_MAX ? INT_MAX : (int)wait;
        }
        add_stat(&s->slow_closed_total, 1); /* counted before the peer can see the cut */
        cut(s, c);                          /* freed when MHD reports the close */
        log_debug("S0004", "status port: closed a connection that had no answer after %u ms",
                  s->opt.request_timeout_ms);
    }
    return -1;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    vsnprintf(msg, sizeof(msg), fmt, ap);
#pragma GCC diagnostic pop
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    log_debug("S0003", "libmicrohttpd: %s", msg);
}

/* ---- replies --------------------------------------------------------- */

static void free_cb(void *cls)
{
    free(cls);
}

static void unref_cb(void *cls)
{
    status_snapshot_unref(cls);
}

/* Adds the headers every answer carries, queues r (NULL: out of memory)
 * and counts it. Takes r over. */
static enum MHD_Result queue(struct status_server *s, struct MHD_Connection *connection,
                             unsigned code, const char *ctype, struct MHD_Response *r)
{
    if (r == NULL)
        return MHD_NO;
    status_mhd.add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    status_mhd.add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    status_mhd.add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        status_mhd.add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = status_mhd.queue_response(connection, code, r);
    status_mhd.destroy_response(r);
    add_stat(&s->requests_total, 1);
    if (code >= 100 && code < 600)
        add_stat(&s->responses[code / 100], 1);
    return ret;
}

/* Queues a reply. With snap, body points into it and the response holds the
 * caller's reference to it until sent; otherwise body is copied. */
static enum MHD_Result reply(struct status_server *s, struct MHD_Connection *connection,
                             unsigned code, const char *ctype, const char *body, size_t len,
                             struct status_snapshot *snap)
{
    struct MHD_Response *r;
    if (snap) {
        r = status_mhd.create_response_from_buffer_with_free_callback_cls(len, (void *)body,
                                                                          unref_cb, snap);
        if (r == NULL)
            status_snapshot_unref(snap);
    } else {
        r = status_mhd.create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    }
    return queue(s, connection, code, ctype, r);
}

/* Like reply(), handing over a malloc'd body (freed when sent). */
static enum MHD_Result reply_owned(struct status_server *s, struct MHD_Connection *connection,
                                   unsigned code, const char *ctype, struct cddp_buf *b)
{
    if (b->data == NULL && cddp_buf_append(b, "", 0) != 0)
        return MHD_NO;
    struct MHD_Response *r = status_mhd.create_response_from_buffer_with_free_callback_cls(
        b->len, b->data, free_cb, b->data);
    if (r == NULL) {
        cddp_buf_free(b);
        return MHD_NO;
    }
    b->data = NULL; /* the response owns it now */
    return queue(s, connection, code, ctype, r);
}

#define TEXT "text/plain; charset=utf-8"
#define JSON "application/json"
#define HTML "text/html; charset=utf-8"
#define PROM_CTYPE "text/plain; version=0.0.4; charset=utf-8"

static enum MHD_Result reply_text(struct status_server *s, struct MHD_Connection *connection,
                                  unsigned code, const char *text)
{
    return reply(s, connection, code, TEXT, text, strlen(text), NULL);
}

/* ---- health checks --------------------------------------------------- */

#define MAX_EXCLUDES 8

struct health_query {
    bool verbose;
    size_t nexclude;
    const char *exclude[MAX_EXCLUDES];
    bool exclude_overflow;
};

static enum MHD_Result query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *value)
{
    (void)kind;
    struct health_query *q = cls;
    if (strcmp(key, "verbose") == 0) {
        bool b = true;
        /* "?verbose", "?verbose=1", "?verbose=true"; "?verbose=0" turns it off. */
        if (value && *value && cddp_parse_bool(value, &b) != 0)
            b = true;
        q->verbose = b;
    } else if (strcmp(key, "exclude") == 0 && value) {
        if (q->nexclude < MAX_EXCLUDES)
            q->exclude[q->nexclude++] = value;
        else
            q->exclude_overflow = true;
    }
    return MHD_YES;
}

static bool excluded(const struct health_query *q, const char *name)
{
    for (size_t i = 0; i < q->nexclude; i++)
        if (strcmp(q->exclude[i], name) == 0)
            return true;
    return false;
}

/* The checks of one endpoint: "loop" first, then (readyz) the snapshot's. */
struct checklist {
    size_t n;
    struct status_check c[STATUS_MAX_CHECKS + 2];
};

static void loop_check(const struct status_server *s, struct status_check *c)
{
    uint64_t beat = atomic_load_explicit(&s->heartbeat_ms, memory_order_relaxed);
    uint64_t now = cddp_mono_ms();
    uint64_t age = now > beat ? now - beat : 0;
    cddp_strlcpy(c->name, "loop", sizeof(c->name));
    c->ok = age <= s->opt.live_timeout_ms;
    if (c->ok)
        c->reason[0] = '\0';
    else
        snprintf(c->reason, sizeof(c->reason), "the event loop has not turned for %.1fs",
                 (double)age / 1000.0);
}

static void build_checklist(const struct status_server *s, const struct status_snapshot *snap,
                            bool ready, struct checklist *cl)
{
    cl->n = 0;
    loop_check(s, &cl->c[cl->n++]);
    if (!ready)
        return;
    if (snap == NULL) {
        struct status_check *c = &cl->c[cl->n++];
        cddp_strlcpy(c->name, "snapshot", sizeof(c->name));
        cddp_strlcpy(c->reason, "no status published yet", sizeof(c->reason));
        c->ok = false;
        return;
    }
    for (size_t i = 0; i < snap->ncheck; i++)
        cl->c[cl->n++] = snap->checks[i];
}

static enum MHD_Result serve_health(struct status_server *s, struct MHD_Connection *connection,
                                    bool ready, const char *only)
{
    const char *what = ready ? "readyz" : "livez";
    struct health_query q = {0};
    status_mhd.get_connection_values(connection, MHD_GET_ARGUMENT_KIND, query_arg, &q);
    struct status_snapshot *snap = ready ? status_cell_acquire(&s->cell, NULL) : NULL;
    struct checklist cl;
    build_checklist(s, snap, ready, &cl);
    status_snapshot_unref(snap); /* the checks were copied */

    struct cddp_buf b;
    cddp_buf_init(&b, 64 * 1024);
    if (only) {
        for (size_t i = 0; i < cl.n; i++) {
            if (strcmp(cl.c[i].name, only) != 0)
                continue;
            if (cl.c[i].ok)
                cddp_buf_printf(&b, "ok\n");
            else
                cddp_buf_printf(&b, "[-]%s failed: %s\n", cl.c[i].name,
                                cl.c[i].reason[0] ? cl.c[i].reason : "reason withheld");
            return reply_owned(s, connection,
                               cl.c[i].ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, TEXT, &b);
        }
        cddp_buf_free(&b);
        return reply_text(s, connection, MHD_HTTP_NOT_FOUND, "no such check\n");
    }

    bool ok = true;
    for (size_t i = 0; i < cl.n; i++)
        if (!cl.c[i].ok && !excluded(&q, cl.c[i].name))
            ok = false;
    /* An exclude= naming no check is a typo worth showing: list everything. */
    bool unknown_exclude = q.exclude_overflow;
    for (size_t i = 0; i < q.nexclude; i++) {
        bool known = false;
        for (size_t j = 0; j < cl.n; j++)
            known = known || strcmp(cl.c[j].name, q.exclude[i]) == 0;
        unknown_exclude = unknown_exclude || !known;
    }
    if (ok && !q.verbose && !unknown_exclude) {
        cddp_buf_free(&b);
        return reply_text(s, connection, MHD_HTTP_OK, "ok\n");
    }
    for (size_t i = 0; i < cl.n; i++) {
        const struct status_check *c = &cl.c[i];
        if (excluded(&q, c->name))
            cddp_buf_printf(&b, "[+]%s excluded: ok\n", c->name);
        else if (c->ok)
            cddp_buf_printf(&b, "[+]%s ok\n", c->name);
        else
            cddp_buf_printf(&b, "[-]%s failed: %s\n", c->name,
                            c->reason[0] ? c->reason : "reason withheld");
    }
    for (size_t i = 0; i < q.nexclude; i++) {
        bool known = false;
        for (size_t j = 0; j < cl.n; j++)
            known = known || strcmp(cl.c[j].name, q.exclude[i]) == 0;
        if (!known)
            cddp_buf_printf(&b, "warn: cannot exclude \"%s\": no such check\n", q.exclude[i]);
    }
    if (q.exclude_overflow)
        cddp_buf_printf(&b, "warn: only %d exclude= arguments are honoured\n", MAX_EXCLUDES);
    cddp_buf_printf(&b, "%s check %s\n", what, ok ? "passed" : "failed");
    return reply_owned(s, connection, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, TEXT, &b);
}

/* ---- /status, /metrics, / -------------------------------------------- */

static enum MHD_Result serve_status(struct status_server *s, struct MHD_Connection *connection)
{
    struct status_snapshot *snap = status_cell_acquire(&s->cell, NULL);
    if (snap == NULL)
        return reply(s, connection, MHD_HTTP_SERVICE_UNAVAILABLE, JSON,
                     "{\"error\":\"no status published yet\"}\n", 36, NULL);
    size_t len;
    const char *json = status_snapshot_status(snap, &len);
    return reply(s, connection, MHD_HTTP_OK, JSON, json, len, snap);
}

/* The server's own families, after the owner's. Owners must not use the
 * cddp_status_ prefix. */
static int render_self_metrics(struct status_server *s, const struct status_snapshot *snap,
                               uint64_t generation, struct cddp_buf *b)
{
    static const char *const classes[] = {NULL, NULL, "2xx", "3xx", "4xx", "5xx"};
    struct prom_writer w;
    prom_init(&w, b);
    uint64_t now = cddp_mono_ms();
    prom_family(&w, "cddp_status_connections", PROM_GAUGE, "Open connections to the status port.");
    prom_sample0(&w, (double)get_stat(&s->connections_open));
    prom_family(&w, "cddp_status_connections_total", PROM_COUNTER,
                "Connections accepted by the status port.");
    prom_sample0(&w, (double)get_stat(&s->connections_total));
    prom_family(&w, "cddp_status_requests_total", PROM_COUNTER,
                "Requests answered by the status port, by status class.");
    for (int i = 2; i <= 5; i++)
        prom_sample1(&w, "code", classes[i], (double)get_stat(&s->responses[i]));
    prom_family(&w, "cddp_status_slow_clients_closed_total", PROM_COUNTER,
                "Connections cut off because their request took longer than the limit.");
    prom_sample0(&w, (double)get_stat(&s->slow_closed_total));
    prom_family(&w, "cddp_status_evicted_connections_total", PROM_COUNTER,
                "Connections cut off to make room for a new one at the connection limit.");
    prom_sample0(&w, (double)get_stat(&s->evicted_total));
    prom_family(&w, "cddp_status_snapshots_published_total", PROM_COUNTER,
                "Status snapshots published by the event loop.");
    prom_sample0(&w, (double)generation);
    prom_family(&w, "cddp_status_snapshot_age_seconds", PROM_GAUGE,
                "Seconds since the event loop published the status being served.");
    if (snap)
        prom_sample0(&w, (double)(now - snap->published_ms) / 1000.0);
    prom_family(&w, "cddp_status_loop_heartbeat_age_seconds", PROM_GAUGE,
                "Seconds since the event loop last turned (liveness).");
    uint64_t beat = atomic_load_explicit(&s->heartbeat_ms, memory_order_relaxed);
    prom_sample0(&w, (double)(now > beat ? now - beat : 0) / 1000.0);
    return prom_finish(&w);
}

static enum MHD_Result serve_metrics(struct status_server *s, struct MHD_Connection *connection)
{
    uint64_t generation;
    struct status_snapshot *snap = status_cell_acquire(&s->cell, &generation);
    struct cddp_buf b;
    cddp_buf_init(&b, (size_t)1 << 30);
    int rc = 0;
    if (snap && snap->metrics_len)
        rc = cddp_buf_append(&b, snap->metrics, snap->metrics_len);
    if (rc == 0)
        rc = render_self_metrics(s, snap, generation, &b);
    status_snapshot_unref(snap);
    if (rc) {
        cddp_buf_free(&b);
        log_error("S0005", "status port: cannot render /metrics: %s", cddp_strerror(rc));
        return reply_text(s, connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot render metrics\n");
    }
    return reply_owned(s, connection, MHD_HTTP_OK, PROM_CTYPE, &b);
}

/* The dashboard (status/dashboard.h), a static page: served from the
 * binary's own copy, never copied. */
static enum MHD_Result serve_dashboard(struct status_server *s, struct MHD_Connection *connection,
                                       bool negotiated)
{
    struct MHD_Response *r = status_mhd.create_response_from_buffer(
        status_dashboard_html_len, (void *)status_dashboard_html, MHD_RESPMEM_PERSISTENT);
    if (r == NULL)
        return MHD_NO;
    status_mhd.add_response_header(r, "Content-Security-Policy", STATUS_DASHBOARD_CSP);
    if (negotiated)
        status_mhd.add_response_header(r, "Vary", "Accept");
    return queue(s, connection, MHD_HTTP_OK, HTML, r);
}

/* `/`: the dashboard for browsers, the plain-text index for everyone else
 * (curl, scripts, probes), by the Accept header. */
static enum MHD_Result serve_index(struct status_server *s, struct MHD_Connection *connection)
{
    const char *accept =
        status_mhd.lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    if (status_dashboard_wants_html(accept))
        return serve_dashboard(s, connection, true);
    char text[640];
    int n = snprintf(text, sizeof(text),
                     "%s status port\n"
                     "  /livez      200 while the event loop turns (/healthz is an alias)\n"
                     "  /readyz     200 when ready; ?verbose lists the checks\n"
                     "  /status     JSON\n"
                     "  /metrics    Prometheus text format 0.0.4\n"
                     "  /dashboard  the job dashboard, for a browser (also / for browsers)\n%s",
                     s->program,
                     s->opt.on_history
                         ? "  /history    the run's history, JSON; ?since=N: what is newer "
                           "(cddp-rdzv: ?run=<id>)\n"
                         : "");
    struct MHD_Response *r =
        status_mhd.create_response_from_buffer((size_t)n, text, MHD_RESPMEM_MUST_COPY);
    if (r)
        status_mhd.add_response_header(r, "Vary", "Accept");
    return queue(s, connection, MHD_HTTP_OK, TEXT, r);
}

/* ---- /stacks: a stack capture on demand ------------------------------ */

/* POST asks the owner (on this thread: on_stacks only signals its loop) for
 * a capture and answers 202 with its number; GET serves the last capture
 * the owner published, which names its number on its first line. */
static enum MHD_Result serve_stacks(struct status_server *s, struct MHD_Connection *connection,
                                    bool post)
{
    if (post) {
        char why[160] = "";
        long long id = s->opt.on_stacks(s->opt.on_stacks_arg, why, sizeof(why));
        char body[256];
        if (id <= 0) {
            int n = snprintf(body, sizeof(body), "{\"error\":\"%s\"}\n",
                             why[0] ? why : "no capture possible now");
            return reply(s, connection, MHD_HTTP_SERVICE_UNAVAILABLE, JSON, body, (size_t)n, NULL);
        }
        int n = snprintf(body, sizeof(body), "{\"capture\":%lld,\"get\":\"/stacks\"}\n", id);
        return reply(s, connection, MHD_HTTP_ACCEPTED, JSON, body, (size_t)n, NULL);
    }
    struct status_snapshot *snap = status_cell_acquire(&s->cell, NULL);
    if (snap == NULL || snap->stacks == NULL) {
        status_snapshot_unref(snap);
        return reply_text(s, connection, MHD_HTTP_NOT_FOUND,
                          "no stack capture yet: POST /stacks asks for one\n");
    }
    return reply(s, connection, MHD_HTTP_OK, TEXT, snap->stacks, snap->stacks_len, snap);
}

/* ---- /history: the run's history ------------------------------------ */

#define HISTORY_MAX ((size_t)256 << 20)

/* Rendered by the owner on request (it grows with the run, so it is not in
 * every snapshot); ?since=N keeps only what is newer than N. */
static enum MHD_Result serve_history(struct status_server *s, struct MHD_Connection *connection)
{
    const char *v = status_mhd.lookup_connection_value(connection, MHD_GET_ARGUMENT_KIND, "since");
    long since = 0;
    if (v && cddp_parse_long(v, 0, LONG_MAX, &since) != 0)
        return reply(s, connection, MHD_HTTP_BAD_REQUEST, JSON,
                     "{\"error\":\"since= must be a sequence number (0 or more)\"}\n", 57, NULL);
    struct cddp_buf b;
    cddp_buf_init(&b, HISTORY_MAX);
    const char *run = status_mhd.lookup_connection_value(connection, MHD_GET_ARGUMENT_KIND, "run");
    int rc = s->opt.on_history(s->opt.on_history_arg, run, (uint64_t)since, &b);
    if (rc == CDDP_EPARSE || rc == CDDP_ENOTFOUND) {
        cddp_buf_free(&b);
        if (rc == CDDP_EPARSE)
            return reply(s, connection, MHD_HTTP_BAD_REQUEST, JSON,
                         "{\"error\":\"run= must name a run: /history?run=<id>\"}\n", 52, NULL);
        return reply(s, connection, MHD_HTTP_NOT_FOUND, JSON, "{\"error\":\"no such run\"}\n", 24,
                     NULL);
    }
    if (rc == 0)
        rc = cddp_buf_append(&b, "\n", 1);
    if (rc) {
        cddp_buf_free(&b);
        log_error("S0007", "status port: cannot render /history: %s", cddp_strerror(rc));
        return reply_text(s, connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot render history\n");
    }
    return reply_owned(s, connection, MHD_HTTP_OK, JSON, &b);
}

/* ---- the request handler --------------------------------------------- */

static enum MHD_Result route(struct status_server *s, struct MHD_Connection *connection,
                             const char *url)
{
    if (strcmp(url, "/status") == 0)
        return serve_status(s, connection);
    if (strcmp(url, "/metrics") == 0)
        return serve_metrics(s, connection);
    if (strcmp(url, "/livez") == 0 || strcmp(url, "/healthz") == 0)
        return serve_health(s, connection, false, NULL);
    if (strcmp(url, "/readyz") == 0)
        return serve_health(s, connection, true, NULL);
    if (strncmp(url, "/livez/", 7) == 0 && url[7])
        return serve_health(s, connection, false, url + 7);
    if (strncmp(url, "/healthz/", 9) == 0 && url[9])
        return serve_health(s, connection, false, url + 9);
    if (strncmp(url, "/readyz/", 8) == 0 && url[8])
        return serve_health(s, connection, true, url + 8);
    if (strcmp(url, "/") == 0)
        return serve_index(s, connection);
    if (strcmp(url, "/dashboard") == 0)
        return serve_dashboard(s, connection, false);
    if (strcmp(url, "/stacks") == 0 && s->opt.on_stacks)
        return serve_stacks(s, connection, false);
    if (strcmp(url, "/history") == 0 && s->opt.on_history)
        return serve_history(s, connection);
    return reply_text(s, connection, MHD_HTTP_NOT_FOUND, "not found\n");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)version;
    (void)upload_data;
    struct status_server *s = cls;
    struct conn *c = conn_of(connection);
    static int started; /* any non-NULL marker */
    bool stacks_post = s->opt.on_stacks && strcmp(method, MHD_HTTP_METHOD_POST) == 0 &&
                       strcmp(url, "/stacks") == 0;

    if (*con_cls == NULL) {
        /* First call: the request line and headers are in. */
        *con_cls = &started;
        if (c)
            c->body = 0;
        if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0 &&
            !stacks_post)
            return reply_text(s, connection, MHD_HTTP_METHOD_NOT_ALLOWED,
                              "method not allowed (GET, HEAD)\n");
        const union MHD_ConnectionInfo *ci =
            status_mhd.get_connection_info(connection, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
        if (ci && ci->header_size > s->opt.max_header_bytes)
            return reply_text(s, connection, MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE,
                              "request header fields too large\n");
        const char *te = status_mhd.lookup_connection_value(connection, MHD_HEADER_KIND,
                                                            MHD_HTTP_HEADER_TRANSFER_ENCODING);
        const char *cl = status_mhd.lookup_connection_value(connection, MHD_HEADER_KIND,
                                                            MHD_HTTP_HEADER_CONTENT_LENGTH);
        long clen;
        if (te != NULL || (cl && (cddp_parse_long(cl, 0, LONG_MAX, &clen) != 0 ||
                                  (size_t)clen > s->opt.max_body_bytes)))
            return reply_text(s, connection, MHD_HTTP_CONTENT_TOO_LARGE,
                              "request body too large\n");
        /* Answer once the whole request is in: a reply queued before that
         * makes libmicrohttpd close the connection after it (no keep-alive). */
        if (c && cl == NULL)
            c->asked = true; /* no body: it is, and the answer comes next (make_room) */
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        /* Content-Length bounded it above; drop it. */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (stacks_post)
        return serve_stacks(s, connection, true);
    return route(s, connection, url);
}

/* ---- the thread ------------------------------------------------------ */

static void *http_main(void *arg)
{
    struct status_server *s = arg;
    const union MHD_DaemonInfo *di = status_mhd.get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    struct pollfd pfd[2] = {{di->epoll_fd, POLLIN, 0}, {s->wake_fd, POLLIN, 0}};
    bool again = false; /* the last turns kept closing connections: do not sleep */
    for (;;) {
        int timeout = again ? 0 : reap(s);
        MHD_UNSIGNED_LONG_LONG mhd_to;
        if (status_mhd.get_timeout(s->mhd, &mhd_to) == MHD_YES) {
            int t = mhd_to > INT_MAX ? INT_MAX : (int)mhd_to;
            if (timeout < 0 || t < timeout)
                timeout = t;
        }
        int n = poll(pfd, 2, timeout);
        if (n < 0 && errno != EINTR) {
            log_error("S0006", "status port: poll failed: %s; the status port stops",
                      strerror(errno));
            break;
        }
        if (pfd[1].revents)
            break;
        /* At its connection limit MHD takes its listening socket out of its
         * epoll set and puts it back only at the start of its next turn:
         * after a turn that closed connections, take that turn at once, or a
         * client waiting in the backlog would wait for some unrelated event.
         * A few at most: clients that reconnect as fast as they are evicted
         * would keep this going for ever, and the stop (wake_fd) and the
         * slow-client deadlines must still be seen; the next poll then does
         * not wait. */
        int turns = 0;
        do {
            s->closed_in_run = 0;
            status_mhd.run(s->mhd);
        } while (s->closed_in_run > 0 && ++turns < 8);
        again = s->closed_in_run > 0;
        if (again)
            reap(s);
    }
    return NULL;
}

/* ---- start / stop ---------------------------------------------------- */

static void bound_address(int fd, char *buf, size_t len, int *port)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN] = "?";
    *port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
            *port = ntohs(in->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
            *port = ntohs(in6->sin6_port);
        }
    }
    cddp_hostport_format(host, *port, buf, len);
}

int status_server_start(const struct status_server_options *o, struct status_server **out,
                        char *err, size_t errlen)
{
    *out = NULL;
    struct status_server_options def;
    status_server_options_default(&def);
    if (o == NULL)
        o = &def;
    /* Opened by the first server, not at exec (mhd.h): a missing library
     * is this function's error, before anything is bound. */
    char why[320];
    int lrc = status_mhd_load(why, sizeof(why));
    if (lrc) {
        snprintf(err, errlen, "the status port needs libmicrohttpd: %s", why);
        return lrc;
    }
    struct status_server *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        snprintf(err, errlen, "status port: out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    s->opt = *o;
    if (s->opt.addr == NULL || s->opt.addr[0] == '\0')
        s->opt.addr = def.addr;
    if (s->opt.program == NULL)
        s->opt.program = def.program;
    if (s->opt.max_connections == 0)
        s->opt.max_connections = def.max_connections;
    if (s->opt.idle_timeout_s == 0)
        s->opt.idle_timeout_s = def.idle_timeout_s;
    if (s->opt.request_timeout_ms == 0)
        s->opt.request_timeout_ms = def.request_timeout_ms;
    if (s->opt.max_header_bytes == 0)
        s->opt.max_header_bytes = def.max_header_bytes;
    if (s->opt.live_timeout_ms == 0)
        s->opt.live_timeout_ms = def.live_timeout_ms;
    /* The strings are the caller's; keep copies of what we print. */
    cddp_strlcpy(s->program, s->opt.program, sizeof(s->program));
    s->opt.addr = NULL;
    s->opt.program = NULL;
    s->listen_fd = -1;
    s->wake_fd = -1;
    cddp_queue_init(&s->deadlines);
    atomic_init(&s->heartbeat_ms, cddp_mono_ms());

    int rc = status_cell_init(&s->cell);
    if (rc) {
        snprintf(err, errlen, "status port: %s", cddp_strerror(rc));
        free(s);
        return rc;
    }
    if (o->port < 0 || o->port > 65535) {
        snprintf(err, errlen, "status port %d is not a port number (0..65535)", o->port);
        rc = CDDP_ERANGE_ARG;
        goto err;
    }
    int family = AF_INET;
    rc = status_listen(o->addr && o->addr[0] ? o->addr : def.addr, o->port, &s->listen_fd, &family,
                       err, errlen);
    if (rc)
        goto err;
    bound_address(s->listen_fd, s->addr, sizeof(s->addr), &s->port);

    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        rc = CDDP_ERR_FROM_ERRNO(errno);
        snprintf(err, errlen, "status port: eventfd: %s", strerror(errno));
        goto err;
    }

    /* MHD's memory pool holds the request headers and the send buffer; our
     * own check in on_request gives the precise 431 below this backstop. */
    size_t pool = 2 * s->opt.max_header_bytes + 16384;
    if (pool < 32768)
        pool = 32768;
    /* Room above ours for the connections evicted but not closed yet (MHD
     * closes them on its next turn): MHD never stops accepting because of
     * them. */
    unsigned mhd_limit = s->opt.max_connections +
                         (s->opt.max_connections / 2 > 32 ? s->opt.max_connections / 2 : 32);
    unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
    if (family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->mhd = status_mhd.start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, (MHD_LogCallback)mhd_log,
        (void *)NULL, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)s->listen_fd,
        MHD_OPTION_CONNECTION_LIMIT, mhd_limit, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned int)s->opt.idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
        MHD_OPTION_NOTIFY_CONNECTION, (MHD_NotifyConnectionCallback)on_connection, (void *)s,
        MHD_OPTION_NOTIFY_COMPLETED, (MHD_RequestCompletedCallback)on_completed, (void *)s,
        MHD_OPTION_END);
    if (s->mhd == NULL) {
        rc = CDDP_ECONFIG;
        snprintf(err, errlen, "status port: libmicrohttpd did not start on %s", s->addr);
        goto err;
    }
    s->listen_fd = -1; /* MHD owns it and closes it when stopped */

    /* The thread takes no signals: they belong to the owner's loop. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int prc = pthread_create(&s->thread, NULL, http_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (prc != 0) {
        rc = CDDP_ERR_FROM_ERRNO(prc);
        snprintf(err, errlen, "status port: cannot start its thread: %s", strerror(prc));
        goto err;
    }
    s->thread_started = true;
    if (o->port == 0)
        log_warn("S0001", "status port: picked free port %d: http://%s/status", s->port, s->addr);
    else
        log_info("S0001", "status port: listening on http://%s (/livez /readyz /status /metrics)",
                 s->addr);
    *out = s;
    return 0;
err:
    if (s->mhd)
        status_mhd.stop_daemon(s->mhd);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    status_cell_destroy(&s->cell);
    free(s);
    return rc;
}

int status_server_port(const struct status_server *s)
{
    return s->port;
}

const char *status_server_address(const struct status_server *s)
{
    return s->addr;
}

void status_server_publish(struct status_server *s, struct status_snapshot *snap)
{
    status_cell_publish(&s->cell, snap);
}

void status_server_heartbeat(struct status_server *s)
{
    atomic_store_explicit(&s->heartbeat_ms, cddp_mono_ms(), memory_order_relaxed);
}

void status_server_stats(struct status_server *s, struct status_server_stats *out)
{
    out->connections_total = get_stat(&s->connections_total);
    out->connections_open = get_stat(&s->connections_open);
    out->requests_total = get_stat(&s->requests_total);
    out->slow_closed_total = get_stat(&s->slow_closed_total);
    out->evicted_total = get_stat(&s->evicted_total);
    for (int i = 0; i < 6; i++)
        out->responses[i] = get_stat(&s->responses[i]);
}

void status_server_stop(struct status_server *s)
{
    if (s == NULL)
        return;
    if (s->thread_started) {
        uint64_t one = 1;
        while (write(s->wake_fd, &one, sizeof(one)) < 0 && errno == EINTR)
            ;
        pthread_join(s->thread, NULL);
    }
    /* The thread is gone: MHD's close notifications now run on this thread. */
    status_mhd.stop_daemon(s->mhd);
    close(s->wake_fd);
    status_cell_destroy(&s->cell);
    log_info("S0002", "status port: stopped (%s)", s->addr);
    free(s);
}
