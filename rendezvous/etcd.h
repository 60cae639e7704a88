/*
 * etcd.h: an etcd v3 JSON-gateway client on the caller's libuv loop.
 *
 * libcurl's multi interface is driven by the loop itself (curl's socket
 * callback becomes one uv_poll_t per socket, its timer callback one
 * uv_timer_t): no thread, no polling; every transfer is a non-blocking
 * HTTP/1.1 POST to /v3/<path> on one member of the cluster.
 *
 *   etcd_call()        one request, one answer (kv/range, kv/txn, lease/...):
 *                      a transport failure, or a 5xx answer (no leader, a
 *                      request timed out inside etcd), moves on to the next
 *                      listed member and tries again there, each member at
 *                      most once per call; the member that answered stays
 *                      the one in use for later calls
 *   etcd_watch_open()  a long-running POST /v3/watch on the member in use:
 *                      every newline-delimited message of the stream is
 *                      handed over as it arrives; the end of the stream (the
 *                      member went away) is reported once, and moves the
 *                      member in use on, so the caller reopens elsewhere
 *
 * Answers are bounded (ETCD_MAX_ANSWER bytes each; a watch message as
 * well); what the bytes mean is rendezvous/etcd_wire.h's business.
 *
 * As in libuv: a function that takes a callback and returns an error never
 * calls it; one that returns 0 calls it exactly once, from the loop, never
 * from inside the call -- unless etcd_watch_cancel or etcd_client_close
 * comes first: cancelled callbacks are not called. Callbacks may call
 * anything here, etcd_client_close included.
 */
#ifndef CDDP_RENDEZVOUS_ETCD_H
#define CDDP_RENDEZVOUS_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct etcd_client;
struct etcd_watch;

struct etcd_client_options {
    /* "h1:2379,h2:2379,[::1]:2379" (default port 2379); an entry may carry
     * its own scheme ("https://h:2379"). */
    const char *endpoints;
    bool https;         /* the scheme of entries without one */
    const char *cacert; /* PEM CA bundle to verify members with (NULL: the system's) */
    const char *cert;   /* PEM client certificate (TLS client auth), or NULL */
    const char *key;    /* its private key, or NULL */
    /* etcd's authentication (auth/authenticate): every request then
     * carries the token, which is fetched again when etcd says it is no
     * longer valid. NULL user: none. */
    const char *user, *password;
    /* One try on one member may take this long (connect included); 0: 5 s. */
    uint64_t request_timeout_ms;
};

/* The host of the first member in an --rdzv_endpoint list (scheme, port
 * and brackets dropped), for the agent's choice of network interface. 0,
 * or CDDP_EPARSE. */
int etcd_first_host(const char *endpoints, char *host, size_t len);

/* Parses the endpoints and sets up. 0, or a negative code with one line in
 * err (a bad endpoint list; nothing is left on the loop then). */
int etcd_client_new(uv_loop_t *loop, const struct etcd_client_options *o, struct etcd_client **out,
                    char *err, size_t errlen);

/* status 0: HTTP 200 and body (NUL-terminated, valid during the call).
 * status CDDP_EPEER: the member answered http != 200 (body: its answer).
 * Other negative status: no member answered (why: etcd_client_last_error). */
typedef void (*etcd_done_cb)(struct etcd_client *c, int status, long http, const char *body,
                             size_t len, void *arg);
/* POSTs body (taken over: freed by the client, also on error) to
 * /v3/<path>. 0, or CDDP_ECLOSED / -ENOMEM. */
int etcd_call(struct etcd_client *c, const char *path, char *body, etcd_done_cb cb, void *arg);

/* A message of the stream (one JSON object, NUL-terminated). */
typedef void (*etcd_msg_cb)(struct etcd_watch *w, const char *msg, size_t len, void *arg);
/* The stream ended (status < 0; why: one line); w is freed after this. */
typedef void (*etcd_end_cb)(struct etcd_watch *w, int status, const char *why, void *arg);
/* Opens a watch stream with body (taken over; see etcd_req_watch). */
int etcd_watch_open(struct etcd_client *c, char *body, etcd_msg_cb on_msg, etcd_end_cb on_end,
                    void *arg, struct etcd_watch **out);
/* Ends it; no callback follows. w is freed. */
void etcd_watch_cancel(struct etcd_watch *w);

/* "host:port" of the member in use. */
const char *etcd_client_member(const struct etcd_client *c);
/* How many members are listed; how often the member in use changed. */
size_t etcd_client_members(const struct etcd_client *c);
unsigned etcd_client_failovers(const struct etcd_client *c);
/* One line about the last failure ("" if none). */
const char *etcd_client_last_error(const struct etcd_client *c);

/* Cancels everything (no callbacks), closes its handles, frees c, then
 * close_cb(arg) (may be NULL). */
void etcd_client_close(struct etcd_client *c, void (*close_cb)(void *arg), void *arg);

#endif
