/* http.c: see http.h. */
#include "launcher/cddpctl/http.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "common/errors.h"
#include "common/exitcodes.h"
#include "config.h"

_Static_assert(sizeof(((struct ctl_reply *)0)->errbuf) >= CURL_ERROR_SIZE,
               "libcurl writes CURL_ERROR_SIZE bytes of error");

int ctl_http_init(void)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK)
        return 0;
    ctl_error(NULL, "K0002", "cannot start libcurl");
    return CDDP_EXIT_FAILURE;
}

void ctl_http_cleanup(void)
{
    curl_global_cleanup();
}

void ctl_reply_free(struct ctl_reply *r)
{
    cddp_buf_free(&r->body);
}

static size_t on_body(char *p, size_t size, size_t n, void *userdata)
{
    struct cddp_buf *b = userdata;
    return cddp_buf_append(b, p, size * n) == 0 ? size * n : 0;
}

/* libcurl's progress callback: a stop signal aborts the transfer. */
static int on_xfer(void *p, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)p, (void)a, (void)b, (void)c, (void)d;
    return ctl_stop_signal != 0;
}

static CURL *handle_new(const char *url, double timeout_s, struct ctl_reply *r)
{
    memset(r, 0, sizeof(*r));
    cddp_buf_init(&r->body, CTL_REPLY_MAX);
    CURL *c = curl_easy_init();
    if (c == NULL)
        return NULL;
    long ms = (long)ceil(timeout_s * 1000.0);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "cddpctl/" CDDP_VERSION);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xfer);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_PRIVATE, r);
    return c;
}

/* Records a finished transfer's outcome in r. */
static void handle_done(CURL *c, CURLcode rc, struct ctl_reply *r)
{
    r->curl_rc = (int)rc;
    if (rc != CURLE_OK) {
        curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &r->oserr);
        return;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->code);
    char *ct = NULL;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    cddp_strlcpy(r->ctype, ct ? ct : "", sizeof(r->ctype));
    if (r->body.data == NULL)
        cddp_buf_append(&r->body, "", 0);
}

/* A reply that never started: libcurl could not make a handle. */
static void not_started(struct ctl_reply *r)
{
    r->curl_rc = (int)CURLE_FAILED_INIT;
    cddp_strlcpy(r->errbuf, "cannot start libcurl", sizeof(r->errbuf));
}

void ctl_transfer_error(const struct ctl_reply *r, const char *url, const char *shown,
                        double timeout_s, char *msg, size_t len)
{
    CURLcode rc = (CURLcode)r->curl_rc;
    const char *detail = r->errbuf[0] ? r->errbuf : curl_easy_strerror(rc);
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
        snprintf(msg, len, "cannot connect to %s: %s", shown,
                 r->oserr ? cddp_strerror(-(int)r->oserr) : detail);
        break;
    case CURLE_OPERATION_TIMEDOUT:
        snprintf(msg, len, "%s did not answer within %gs", shown, timeout_s);
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
        snprintf(msg, len, "cannot resolve the host of %s", shown);
        break;
    case CURLE_GOT_NOTHING:
        snprintf(msg, len, "%s closed the connection without a reply", shown);
        break;
    case CURLE_WRITE_ERROR:
        snprintf(msg, len, "%s: the reply is larger than %zu MiB", url, CTL_REPLY_MAX >> 20);
        break;
    case CURLE_ABORTED_BY_CALLBACK:
        snprintf(msg, len, "%s: interrupted", shown);
        break;
    case CURLE_UNSUPPORTED_PROTOCOL: /* "Received HTTP/0.9 when not allowed" */
    case CURLE_WEIRD_SERVER_REPLY:
        /* Bytes that are not an HTTP status line: another protocol
         * answered, most often cddp's rendezvous (cddp-rdzv's --port, or
         * the port cddprun hosts it on), whose status port is another. */
        snprintf(msg, len,
                 "%s did not answer in HTTP: it is not a status port (a rendezvous port? "
                 "cddp-rdzv serves its status on --status-port, cddprun on --status_port)",
                 shown);
        break;
    case CURLE_FAILED_INIT:
        snprintf(msg, len, "%s", detail);
        break;
    default:
        snprintf(msg, len, "%s: %s", url, detail);
        break;
    }
}

/* The log id of a failed transfer (tools/logcodes.txt). */
static const char *transfer_id(CURLcode rc)
{
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
        return "K0003";
    case CURLE_OPERATION_TIMEDOUT:
        return "K0004";
    case CURLE_COULDNT_RESOLVE_HOST:
        return "K0005";
    case CURLE_GOT_NOTHING:
        return "K0006";
    case CURLE_WRITE_ERROR:
        return "K0007";
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_WEIRD_SERVER_REPLY:
        return "K0009";
    default:
        return "K0008";
    }
}

int ctl_request(const char *url, bool post, const char *shown, double timeout_s,
                struct ctl_reply *r, struct ctl_frame *f)
{
    CURL *c = handle_new(url, timeout_s, r);
    if (c == NULL) {
        not_started(r);
        ctl_error(f, "K0002", "cannot start libcurl");
        return CDDP_EXIT_FAILURE;
    }
    if (post)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
    handle_done(c, curl_easy_perform(c), r);
    curl_easy_cleanup(c);
    if (r->curl_rc == CURLE_OK)
        return 0;
    char msg[512];
    ctl_transfer_error(r, url, shown, timeout_s, msg, sizeof(msg));
    if (f && r->curl_rc == CURLE_OPERATION_TIMEDOUT)
        f->timed_out = true;
    ctl_error(f, transfer_id((CURLcode)r->curl_rc), "%s", msg);
    return r->curl_rc == CURLE_WRITE_ERROR ? CDDP_EXIT_FAILURE : CTL_EXIT_UNREACHABLE;
}

void ctl_get_many(const char *const *urls, struct ctl_reply *const *replies, size_t n,
                  double timeout_s)
{
    CURLM *m = curl_multi_init();
    for (size_t i = 0; i < n; i++) {
        if (urls[i] == NULL)
            continue;
        CURL *c = m ? handle_new(urls[i], timeout_s, replies[i]) : NULL;
        if (c == NULL || curl_multi_add_handle(m, c) != CURLM_OK) {
            memset(replies[i], 0, sizeof(*replies[i]));
            not_started(replies[i]);
            curl_easy_cleanup(c);
        }
    }
    if (m == NULL)
        return;
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)CTL_MAX_PARALLEL);
    int running = 1;
    while (running) {
        if (curl_multi_perform(m, &running) != CURLM_OK)
            break;
        if (running)
            curl_multi_poll(m, NULL, 0, 200, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        struct ctl_reply *r = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        handle_done(msg->easy_handle, msg->data.result, r);
        curl_multi_remove_handle(m, msg->easy_handle);
        curl_easy_cleanup(msg->easy_handle);
    }
    curl_multi_cleanup(m);
}

void ctl_excerpt(const struct cddp_buf *b, char *out, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < b->len && n + 5 < len && i < 80; i++) {
        unsigned char ch = (unsigned char)b->data[i];
        if (ch == '\n' || ch == '\r')
            break;
        out[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (b->len > n && n + 4 < len) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

void ctl_http_error(struct ctl_frame *f, const char *url, long code, const char *detail)
{
    ctl_error(f, "K0010", "%s answered HTTP %ld%s%s", url, code, detail && detail[0] ? ": " : "",
              detail ? detail : "");
}

void ctl_timed_out(struct ctl_frame *f, const char *shown, double timeout_s)
{
    ctl_error(f, "K0004", "%s did not answer within %gs", shown, timeout_s);
}

cJSON *ctl_fetch_status(const char *base, const char *shown, double timeout_s, struct ctl_frame *f,
                        int *rc, struct cddp_buf *raw)
{
    char url[2100];
    snprintf(url, sizeof(url), "%s/status", base);
    struct ctl_reply r;
    *rc = ctl_request(url, false, shown, timeout_s, &r, f);
    if (*rc) {
        ctl_reply_free(&r);
        return NULL;
    }
    char ex[96];
    ctl_excerpt(&r.body, ex, sizeof(ex));
    cJSON *root = cJSON_ParseWithLength(r.body.data, r.body.len);
    if (r.code != 200) {
        const cJSON *e = root ? cJSON_GetObjectItemCaseSensitive(root, "error") : NULL;
        ctl_http_error(f, url, r.code, cJSON_IsString(e) ? e->valuestring : ex);
        *rc = CDDP_EXIT_FAILURE;
    } else if (!cJSON_IsObject(root)) {
        if (f && f->quiet)
            ctl_error(f, "K0011", "%s did not answer JSON", url);
        else
            ctl_error(f, "K0011",
                      "%s did not answer JSON (Content-Type '%s'): '%s'; is %s a cddp status "
                      "port?",
                      url, r.ctype, ex, shown);
        *rc = CDDP_EXIT_FAILURE;
    }
    if (*rc) {
        ctl_reply_free(&r);
        cJSON_Delete(root);
        return NULL;
    }
    if (raw)
        *raw = r.body; /* the caller's now */
    else
        ctl_reply_free(&r);
    return root;
}
