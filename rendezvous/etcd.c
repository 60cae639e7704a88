/*
 * etcd.c: see etcd.h. libcurl's multi interface on a libuv loop (curl's
 * "multi_socket" API, as in its docs/examples/multi-uv.c): curl tells us
 * which sockets to watch and when to time out; we tell it what happened.
 *
 * libcurl is not linked: its functions are called through etcd_curl, a
 * table filled when the first client is made (etcd_curl.h).
 *
 * Nothing of ours runs inside a curl callback except copying bytes: the
 * callers' callbacks run after curl_multi_socket_action returned, from
 * dispatch(), since curl refuses to be called back into from its own
 * callbacks (CURLM_RECURSIVE_API_CALL).
 */
#include "rendezvous/etcd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h> /* types and constants; the calls go through etcd_curl */

#include "common/errors.h"
#include "common/hostport.h"
#include "common/queue.h"
#include "common/strutil.h"
#include "rendezvous/etcd_curl.h"
#include "rendezvous/etcd_wire.h"

#define DEFAULT_TIMEOUT_MS 5000
#define MAX_MEMBERS 16

struct member {
    char base[300]; /* "http://host:port" */
    char name[280]; /* "host:port" */
};

struct etcd_client {
    uv_loop_t *loop;
    CURLM *multi;
    uv_timer_t timer;
    struct member members[MAX_MEMBERS];
    size_t nmembers, cur;
    unsigned failovers;
    char cacert[512], cert[512], key[512];
    char user[128], password[256], token[512];
    bool authing; /* auth/authenticate in flight; parked transfers wait for it */
    uint64_t timeout_ms;
    struct cddp_queue xfers; /* every transfer in flight */
    unsigned open_handles;   /* the timer and the poll handles, until closed */
    bool closing;
    void (*close_cb)(void *);
    void *close_arg;
    char last_error[512];
};

struct xfer {
    struct cddp_queue q;
    struct etcd_client *c;
    CURL *easy;
    char path[64];
    char *body;
    size_t member; /* where it runs now */
    size_t tries;
    struct curl_slist *headers;
    struct cddp_buf in;
    char errbuf[CURL_ERROR_SIZE];
    bool done; /* finished; its callback is pending in dispatch */
    CURLcode result;
    long http;
    /* a call */
    etcd_done_cb cb;
    void *arg;
    /* a watch */
    struct etcd_watch *watch;
    bool overflow;
    bool parked;      /* waits for a token, not started */
    bool auth_failed; /* finished because authenticating failed */
    bool reauthed;    /* was sent again with a fresh token once */
    bool is_auth;
};

struct etcd_watch {
    struct xfer *x;
    etcd_msg_cb on_msg;
    etcd_end_cb on_end;
    void *arg;
};

struct sock_ctx {
    uv_poll_t poll;
    struct etcd_client *c;
    curl_socket_t fd;
};

static void dispatch(struct etcd_client *c);

static void handle_closed(uv_handle_t *h)
{
    struct etcd_client *c;
    if (h->type == UV_POLL) {
        struct sock_ctx *s = h->data;
        c = s->c;
        free(s);
    } else {
        c = h->data;
    }
    if (--c->open_handles > 0)
        return;
    void (*cb)(void *) = c->close_cb;
    void *arg = c->close_arg;
    free(c);
    if (cb)
        cb(arg);
}

/* ---- curl -> libuv ---- */

static void on_poll(uv_poll_t *p, int status, int events)
{
    struct sock_ctx *s = p->data;
    struct etcd_client *c = s->c;
    int flags = 0;
    if (status < 0)
        flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE)
        flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE)
        flags |= CURL_CSELECT_OUT;
    int running;
    etcd_curl.multi_socket_action(c->multi, s->fd, flags, &running);
    dispatch(c);
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    (void)easy;
    struct etcd_client *c = userp;
    struct sock_ctx *s = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            uv_poll_stop(&s->poll);
            if (!c->closing)
                etcd_curl.multi_assign(c->multi, fd, NULL);
            uv_close((uv_handle_t *)&s->poll, handle_closed);
        }
        return 0;
    }
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL)
            return -1;
        s->c = c;
        s->fd = fd;
        if (uv_poll_init_socket(c->loop, &s->poll, fd) != 0) {
            free(s);
            return -1;
        }
        s->poll.data = s;
        c->open_handles++;
        etcd_curl.multi_assign(c->multi, fd, s);
    }
    int ev = 0;
    if (what & CURL_POLL_IN)
        ev |= UV_READABLE;
    if (what & CURL_POLL_OUT)
        ev |= UV_WRITABLE;
    uv_poll_start(&s->poll, ev, on_poll);
    return 0;
}

static void on_timeout(uv_timer_t *t)
{
    struct etcd_client *c = t->data;
    int running;
    etcd_curl.multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    dispatch(c);
}

static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    (void)multi;
    struct etcd_client *c = userp;
    if (timeout_ms < 0)
        uv_timer_stop(&c->timer);
    else /* 0: as soon as possible, from the loop (never from here) */
        uv_timer_start(&c->timer, on_timeout, (uint64_t)timeout_ms, 0);
    return 0;
}

/* ---- transfers ---- */

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    struct xfer *x = arg;
    size_t len = size * n;
    if (cddp_buf_append(&x->in, p, len) != 0) {
        x->overflow = true;
        return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
    }
    return len;
}

static void xfer_free(struct xfer *x)
{
    if (x->easy) {
        etcd_curl.multi_remove_handle(x->c->multi, x->easy);
        etcd_curl.easy_cleanup(x->easy);
    }
    etcd_curl.slist_free_all(x->headers);
    cddp_buf_free(&x->in);
    free(x->body);
    cddp_queue_remove(&x->q);
    free(x);
}

static int xfer_start(struct xfer *x)
{
    struct etcd_client *c = x->c;
    if (x->easy) {
        etcd_curl.multi_remove_handle(c->multi, x->easy);
        etcd_curl.easy_cleanup(x->easy);
    }
    cddp_buf_reset(&x->in);
    x->done = false;
    x->overflow = false;
    x->errbuf[0] = '\0';
    x->member = c->cur;
    x->tries++;
    etcd_curl.slist_free_all(x->headers);
    x->headers = etcd_curl.slist_append(NULL, "Content-Type: application/json");
    if (x->headers && c->token[0] && !x->is_auth) {
        char h[600];
        snprintf(h, sizeof(h), "Authorization: %s", c->token);
        struct curl_slist *l = etcd_curl.slist_append(x->headers, h);
        if (l == NULL)
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        x->headers = l;
    }
    if (x->headers == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    CURL *e = x->easy = etcd_curl.easy_init();
    if (e == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    char url[400];
    snprintf(url, sizeof(url), "%s/v3/%s", c->members[x->member].base, x->path);
    etcd_curl.easy_setopt(e, CURLOPT_URL, url);
    etcd_curl.easy_setopt(e, CURLOPT_PRIVATE, x);
    etcd_curl.easy_setopt(e, CURLOPT_POSTFIELDS, x->body);
    etcd_curl.easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(x->body));
    etcd_curl.easy_setopt(e, CURLOPT_HTTPHEADER, x->headers);
    etcd_curl.easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    etcd_curl.easy_setopt(e, CURLOPT_WRITEDATA, x);
    etcd_curl.easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
    etcd_curl.easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    etcd_curl.easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    etcd_curl.easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                          (long)(c->timeout_ms < 2000 ? c->timeout_ms : 2000));
    etcd_curl.easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    etcd_curl.easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 5L);
    etcd_curl.easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 2L);
    if (x->watch == NULL)
        etcd_curl.easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)c->timeout_ms);
    if (c->cacert[0])
        etcd_curl.easy_setopt(e, CURLOPT_CAINFO, c->cacert);
    if (c->cert[0])
        etcd_curl.easy_setopt(e, CURLOPT_SSLCERT, c->cert);
    if (c->key[0])
        etcd_curl.easy_setopt(e, CURLOPT_SSLKEY, c->key);
    if (etcd_curl.multi_add_handle(c->multi, e) != CURLM_OK)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    return 0;
}

static struct xfer *xfer_new(struct etcd_client *c, const char *path, char *body, size_t max)
{
    struct xfer *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return NULL;
    x->c = c;
    cddp_strlcpy(x->path, path, sizeof(x->path));
    x->body = body;
    cddp_buf_init(&x->in, max);
    cddp_queue_insert_tail(&c->xfers, &x->q);
    return x;
}

/* Why a transfer failed, as one line, into c->last_error. */
static void note_failure(struct etcd_client *c, struct xfer *x)
{
    const char *m = c->members[x->member].name;
    if (x->overflow)
        snprintf(c->last_error, sizeof(c->last_error),
                 "etcd member %s: an answer longer than %u bytes", m, ETCD_MAX_ANSWER);
    else if (x->result == CURLE_PEER_FAILED_VERIFICATION || x->result == CURLE_SSL_CACERT_BADFILE)
        snprintf(c->last_error, sizeof(c->last_error),
                 "etcd member %s: TLS certificate not accepted (%s; check rdzv_conf cacert=)", m,
                 x->errbuf[0] ? x->errbuf : etcd_curl.easy_strerror(x->result));
    else if (x->result == CURLE_SSL_CERTPROBLEM || x->result == CURLE_SSL_CONNECT_ERROR)
        snprintf(c->last_error, sizeof(c->last_error),
                 "etcd member %s: TLS handshake failed (%s; check rdzv_conf cert=, key=, "
                 "protocol=)",
                 m, x->errbuf[0] ? x->errbuf : etcd_curl.easy_strerror(x->result));
    else if (x->result != CURLE_OK)
        snprintf(c->last_error, sizeof(c->last_error), "etcd member %s: %s", m,
                 x->errbuf[0] ? x->errbuf : etcd_curl.easy_strerror(x->result));
    else {
        char msg[256] = "";
        if (!etcd_parse_error(x->in.data ? x->in.data : "", x->in.len, msg, sizeof(msg))) {
            /* Not JSON (the gateway's own refusals are plain text): its
             * first line, printable bytes only. */
            size_t o = 0;
            for (size_t i = 0; i < x->in.len && o + 1 < sizeof(msg); i++) {
                char ch = x->in.data[i];
                if (ch == '\n' || ch == '\r')
                    break;
                msg[o++] = (ch >= 0x20 && ch < 0x7f) ? ch : '?';
            }
            msg[o] = '\0';
        }
        snprintf(c->last_error, sizeof(c->last_error), "etcd member %s: HTTP %ld%s%s", m, x->http,
                 msg[0] ? ": " : "", msg);
    }
}

static void next_member(struct etcd_client *c, size_t failed)
{
    if (c->nmembers > 1 && c->cur == failed) {
        c->cur = (c->cur + 1) % c->nmembers;
        c->failovers++;
    }
}

/* Complete lines of a watch stream, delivered one at a time: the callback
 * may cancel this watch or close the client. True if one was delivered. */
static bool deliver_one(struct etcd_client *c, struct xfer *x)
{
    struct etcd_watch *w = x->watch;
    char *nl = x->in.len ? memchr(x->in.data, '\n', x->in.len) : NULL;
    if (nl == NULL)
        return false;
    size_t n = (size_t)(nl - x->in.data);
    char *msg = malloc(n + 1);
    if (msg == NULL)
        return false;
    memcpy(msg, x->in.data, n);
    msg[n] = '\0';
    cddp_buf_consume(&x->in, n + 1);
    w->on_msg(w, msg, n, w->arg);
    free(msg);
    (void)c;
    return true;
}

static int xfer_go(struct xfer *x);

/* The token came (or could not be had): the parked transfers go, or
 * finish with the reason. Runs from dispatch. */
static void on_auth(struct etcd_client *c, int status, long http, const char *body, size_t len,
                    void *arg)
{
    (void)arg;
    c->authing = false;
    char why[256];
    if (status == 0 &&
        etcd_parse_token(body, len, c->token, sizeof(c->token), why, sizeof(why)) != 0) {
        status = CDDP_EPARSE;
        snprintf(c->last_error, sizeof(c->last_error), "etcd: authenticating as '%.64s': %s",
                 c->user, why);
    } else if (status != 0) {
        char was[300];
        cddp_strlcpy(was, c->last_error, sizeof(was));
        snprintf(c->last_error, sizeof(c->last_error), "etcd: authenticating as '%.64s': %s",
                 c->user, was);
    }
    (void)http;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &c->xfers)
    {
        struct xfer *x = cddp_queue_data(q, struct xfer, q);
        if (!x->parked)
            continue;
        x->parked = false;
        if (status != 0 || xfer_start(x) != 0) {
            x->done = true;
            x->auth_failed = true;
        }
    }
}

static void auth_begin(struct etcd_client *c)
{
    if (c->authing)
        return;
    struct xfer *x =
        xfer_new(c, "auth/authenticate", etcd_req_auth(c->user, c->password), ETCD_MAX_ANSWER);
    if (x == NULL || x->body == NULL) {
        if (x)
            xfer_free(x);
        return;
    }
    x->is_auth = true;
    x->cb = on_auth;
    c->authing = true;
    if (xfer_start(x) != 0) {
        c->authing = false;
        xfer_free(x);
    }
}

/* Starts x, or parks it until there is a token. */
static int xfer_go(struct xfer *x)
{
    struct etcd_client *c = x->c;
    if (c->user[0] && !c->token[0] && !x->is_auth) {
        x->parked = true;
        auth_begin(c);
        return c->authing ? 0 : CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    return xfer_start(x);
}

static void finish_call(struct etcd_client *c, struct xfer *x)
{
    if (x->auth_failed) {
        etcd_done_cb cb = x->cb;
        void *arg = x->arg;
        xfer_free(x);
        cb(c, CDDP_EPEER, 401, "", 0, arg);
        return;
    }
    bool transport = x->result != CURLE_OK || x->http >= 500 || x->http == 0;
    if (transport || x->http != 200)
        note_failure(c, x);
    if (!transport && x->http != 200 && c->user[0] && !x->is_auth && !x->reauthed &&
        strstr(c->last_error, "auth token")) {
        /* The token expired (or etcd restarted): a fresh one, once. */
        c->token[0] = '\0';
        x->reauthed = true;
        x->tries = 0;
        if (x->easy) {
            etcd_curl.multi_remove_handle(c->multi, x->easy);
            etcd_curl.easy_cleanup(x->easy);
            x->easy = NULL;
        }
        x->done = false;
        if (xfer_go(x) == 0)
            return;
    }
    if (transport && !x->overflow && x->tries < c->nmembers) {
        next_member(c, x->member);
        if (xfer_start(x) == 0)
            return;
    } else if (transport) {
        next_member(c, x->member);
    }
    etcd_done_cb cb = x->cb;
    void *arg = x->arg;
    int status = transport        ? (x->result == CURLE_OPERATION_TIMEDOUT ? CDDP_ETIMEOUT
                                                                           : CDDP_ERR_FROM_ERRNO(EIO))
                 : x->http == 200 ? 0
                                  : CDDP_EPEER;
    if (x->overflow)
        status = CDDP_ETOOBIG;
    long http = x->http;
    /* The callback may close the client: take x out first. */
    struct cddp_buf in = x->in;
    cddp_buf_init(&x->in, 0);
    xfer_free(x);
    cb(c, status, http, in.data ? in.data : "", in.len, arg);
    cddp_buf_free(&in);
}

static void finish_watch(struct etcd_client *c, struct xfer *x)
{
    struct etcd_watch *w = x->watch;
    if (x->result == CURLE_OK && x->http == 200)
        snprintf(c->last_error, sizeof(c->last_error), "etcd member %s ended the watch stream",
                 c->members[x->member].name);
    else
        note_failure(c, x);
    next_member(c, x->member);
    char why[512];
    cddp_strlcpy(why, c->last_error, sizeof(why));
    int status = x->overflow ? CDDP_ETOOBIG : CDDP_ERR_FROM_ERRNO(ECONNRESET);
    etcd_end_cb cb = w->on_end;
    void *arg = w->arg;
    w->x = NULL;
    xfer_free(x);
    cb(w, status, why, arg);
    free(w);
}

/* After curl did its work: deliver watch messages and finished transfers,
 * one callback at a time (each may change everything). */
static void dispatch(struct etcd_client *c)
{
    CURLMsg *m;
    int left;
    while (!c->closing && (m = etcd_curl.multi_info_read(c->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        struct xfer *x;
        etcd_curl.easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        x->done = true;
        x->result = m->data.result;
        etcd_curl.easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &x->http);
    }
    for (;;) {
        if (c->closing)
            return;
        struct cddp_queue *q;
        struct xfer *found = NULL;
        bool delivered = false;
        cddp_queue_foreach(q, &c->xfers)
        {
            struct xfer *x = cddp_queue_data(q, struct xfer, q);
            if (x->watch && x->http == 0 && x->easy)
                etcd_curl.easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->http);
            if (x->watch && x->http == 200 && deliver_one(c, x)) {
                delivered = true;
                break;
            }
            if (x->done) {
                found = x;
                break;
            }
        }
        if (delivered)
            continue;
        if (found == NULL)
            return;
        if (found->watch)
            finish_watch(c, found);
        else
            finish_call(c, found);
    }
}

/* ---- public ---- */

int etcd_first_host(const char *endpoints, char *host, size_t len)
{
    char item[512];
    const char *p = endpoints ? endpoints : "";
    size_t n = strcspn(p, ",");
    if (n >= sizeof(item))
        return CDDP_EPARSE;
    memcpy(item, p, n);
    item[n] = '\0';
    char *s = cddp_strip(item);
    if (strncmp(s, "http://", 7) == 0)
        s += 7;
    else if (strncmp(s, "https://", 8) == 0)
        s += 8;
    struct cddp_hostport hp;
    char why[256];
    if (*s == '\0' || cddp_hostport_parse(s, 2379, &hp, why, sizeof(why)) != 0)
        return CDDP_EPARSE;
    cddp_strlcpy(host, hp.host, len);
    return 0;
}

static int parse_members(struct etcd_client *c, const char *list, bool https, char *err,
                         size_t errlen)
{
    char *copy = strdup(list ? list : "");
    if (copy == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    int rc = 0;
    char *p = copy;
    while (rc == 0) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        char *item = cddp_strip(p);
        const char *scheme = https ? "https" : "http";
        if (strncmp(item, "http://", 7) == 0) {
            scheme = "http";
            item += 7;
        } else if (strncmp(item, "https://", 8) == 0) {
            scheme = "https";
            item += 8;
        }
        struct cddp_hostport hp;
        char why[256];
        if (*item == '\0' || cddp_hostport_parse(item, 2379, &hp, why, sizeof(why)) != 0) {
            rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd endpoint '%s': %s", item,
                           *item ? why : "empty");
            break;
        }
        if (hp.port == 0) {
            rc = cddp_fail(err, errlen, CDDP_EPARSE, "etcd endpoint '%s': port 0", item);
            break;
        }
        if (c->nmembers == MAX_MEMBERS) {
            rc = cddp_fail(err, errlen, CDDP_ETOOBIG, "more than %d etcd endpoints", MAX_MEMBERS);
            break;
        }
        struct member *m = &c->members[c->nmembers++];
        char name[sizeof(m->name)];
        cddp_hostport_format(hp.host, hp.port, name, sizeof(name));
        cddp_strlcpy(m->name, name, sizeof(m->name));
        snprintf(m->base, sizeof(m->base), "%s://%s", scheme, name);
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    free(copy);
    return rc;
}

int etcd_client_new(uv_loop_t *loop, const struct etcd_client_options *o, struct etcd_client **out,
                    char *err, size_t errlen)
{
    /* libcurl is opened here, by the one backend that needs it, so that
     * no other run maps it (etcd_curl.h says why). */
    char why[320];
    if (etcd_curl_load(why, sizeof(why)) != 0)
        return cddp_fail(err, errlen, CDDP_ECONFIG,
                         "the etcd backend (--rdzv_backend=etcd-v3) needs libcurl: %s", why);
    struct etcd_client *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory");
    c->loop = loop;
    cddp_queue_init(&c->xfers);
    c->timeout_ms = o->request_timeout_ms ? o->request_timeout_ms : DEFAULT_TIMEOUT_MS;
    int rc = parse_members(c, o->endpoints, o->https, err, errlen);
    const char *files[3] = {o->cacert, o->cert, o->key};
    char *dst[3] = {c->cacert, c->cert, c->key};
    for (int i = 0; rc == 0 && i < 3; i++) {
        if (files[i] && strlen(files[i]) >= sizeof(c->cacert))
            rc = cddp_fail(err, errlen, CDDP_ETOOBIG, "TLS file name too long");
        else if (files[i])
            cddp_strlcpy(dst[i], files[i], sizeof(c->cacert));
    }
    if (rc == 0 && o->user && o->user[0]) {
        if (strlen(o->user) >= sizeof(c->user) ||
            (o->password && strlen(o->password) >= sizeof(c->password)))
            rc = cddp_fail(err, errlen, CDDP_ETOOBIG, "etcd user name or password too long");
        else {
            cddp_strlcpy(c->user, o->user, sizeof(c->user));
            cddp_strlcpy(c->password, o->password ? o->password : "", sizeof(c->password));
        }
    }
    if (rc == 0 && c->nmembers == 0)
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "no etcd endpoint given");
    if (rc == 0 && (c->multi = etcd_curl.multi_init()) == NULL)
        rc = cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "libcurl: no multi handle");
    if (rc) {
        free(c);
        return rc;
    }
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    c->open_handles = 1;
    etcd_curl.multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    etcd_curl.multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    etcd_curl.multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    etcd_curl.multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    *out = c;
    return 0;
}

int etcd_call(struct etcd_client *c, const char *path, char *body, etcd_done_cb cb, void *arg)
{
    if (body == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (c->closing) {
        free(body);
        return CDDP_ECLOSED;
    }
    struct xfer *x = xfer_new(c, path, body, ETCD_MAX_ANSWER);
    if (x == NULL) {
        free(body);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    x->cb = cb;
    x->arg = arg;
    int rc = xfer_go(x);
    if (rc)
        xfer_free(x);
    return rc;
}

int etcd_watch_open(struct etcd_client *c, char *body, etcd_msg_cb on_msg, etcd_end_cb on_end,
                    void *arg, struct etcd_watch **out)
{
    if (body == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (c->closing) {
        free(body);
        return CDDP_ECLOSED;
    }
    struct etcd_watch *w = calloc(1, sizeof(*w));
    struct xfer *x = w ? xfer_new(c, "watch", body, ETCD_MAX_ANSWER) : NULL;
    if (x == NULL) {
        free(w);
        free(body);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    w->x = x;
    w->on_msg = on_msg;
    w->on_end = on_end;
    w->arg = arg;
    x->watch = w;
    x->tries = c->nmembers; /* a stream is not retried here: the caller reopens it */
    int rc = xfer_go(x);
    if (rc) {
        xfer_free(x);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

void etcd_watch_cancel(struct etcd_watch *w)
{
    if (w == NULL || w->x == NULL) /* NULL x: inside its on_end, freed after it */
        return;
    xfer_free(w->x);
    free(w);
}

const char *etcd_client_member(const struct etcd_client *c)
{
    return c->members[c->cur].name;
}

size_t etcd_client_members(const struct etcd_client *c)
{
    return c->nmembers;
}

unsigned etcd_client_failovers(const struct etcd_client *c)
{
    return c->failovers;
}

const char *etcd_client_last_error(const struct etcd_client *c)
{
    return c->last_error;
}

void etcd_client_close(struct etcd_client *c, void (*close_cb)(void *arg), void *arg)
{
    if (c->closing)
        return;
    c->closing = true;
    c->close_cb = close_cb;
    c->close_arg = arg;
    while (!cddp_queue_empty(&c->xfers)) {
        struct xfer *x = cddp_queue_data(cddp_queue_head(&c->xfers), struct xfer, q);
        free(x->watch);
        xfer_free(x);
    }
    /* Removing the handles made curl drop its sockets (CURL_POLL_REMOVE,
     * closing their polls); cleanup closes what it kept for reuse. */
    etcd_curl.multi_cleanup(c->multi);
    c->multi = NULL;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, handle_closed);
}
