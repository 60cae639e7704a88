/*
 * http.h: cddpctl's HTTP over libcurl: one request (GET, or a POST with an
 * empty body), or many GETs at once (job asks every agent), each bounded
 * by a timeout for the whole transfer and a reply of at most 64 MiB; a
 * stop signal (watch.c) aborts a transfer.
 *
 * Failures are said in words that name the address ("cannot connect to
 * node1:8080: Connection refused") through ctl_error (ctl.h): logged, or
 * kept in the frame of a watch. Nothing a server sent is in them unescaped.
 */
#ifndef CDDP_LAUNCHER_CDDPCTL_HTTP_H
#define CDDP_LAUNCHER_CDDPCTL_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/strutil.h"
#include "launcher/cddpctl/ctl.h"

#define CTL_REPLY_MAX ((size_t)64 << 20)
/* ctl_get_many: connections open at once. */
#define CTL_MAX_PARALLEL 32

/* A finished transfer. body is the caller's to free (ctl_reply_free). */
struct ctl_reply {
    int curl_rc;     /* CURLcode: 0 when an answer came */
    long code;       /* the HTTP status */
    char ctype[128]; /* Content-Type, as sent (not sanitised) */
    struct cddp_buf body;
    long oserr; /* errno of a failed connect */
    char errbuf[256];
};

/* libcurl's global set-up, once before any request: 0, or
 * CDDP_EXIT_FAILURE with the error logged. */
int ctl_http_init(void);
void ctl_http_cleanup(void);

/* One request to url (a POST with an empty body when post). On failure
 * returns CTL_EXIT_UNREACHABLE (CDDP_EXIT_FAILURE when the reply was too
 * large or libcurl could not start), says why through ctl_error(f, ...)
 * and sets f->timed_out on a timeout (f may be NULL). shown names the
 * target in messages. r is filled either way; free it. */
int ctl_request(const char *url, bool post, const char *shown, double timeout_s,
                struct ctl_reply *r, struct ctl_frame *f);

/* GETs urls[i] into *replies[i] at once (up to CTL_MAX_PARALLEL
 * connections); a NULL url is skipped. Errors are only recorded in each
 * reply (ctl_transfer_error words them). */
void ctl_get_many(const char *const *urls, struct ctl_reply *const *replies, size_t n,
                  double timeout_s);

/* GET base/status as a JSON object (the caller deletes it), or NULL with
 * *rc set (CTL_EXIT_UNREACHABLE, or CDDP_EXIT_FAILURE for an HTTP error
 * or an answer that is not a JSON object) and the error said. With raw,
 * the body as served becomes the caller's. */
cJSON *ctl_fetch_status(const char *base, const char *shown, double timeout_s, struct ctl_frame *f,
                        int *rc, struct cddp_buf *raw);

/* A failed transfer in words into msg ("cannot connect to X: ..."). */
void ctl_transfer_error(const struct ctl_reply *r, const char *url, const char *shown,
                        double timeout_s, char *msg, size_t len);

/* "URL answered HTTP CODE[: detail]" (K0010); detail may be NULL. */
void ctl_http_error(struct ctl_frame *f, const char *url, long code, const char *detail);

/* "SHOWN did not answer within Ns" (K0004), for a wait of the caller's. */
void ctl_timed_out(struct ctl_frame *f, const char *shown, double timeout_s);

/* The first line of a body, shortened to 80 bytes, non-printable bytes as '?'. */
void ctl_excerpt(const struct cddp_buf *b, char *out, size_t len);

void ctl_reply_free(struct ctl_reply *r);

#endif
