/*
 * store_client.h: serve and use a cddp key-value store from plain threads.
 *
 * A store in cddp's own protocol (docs/protocol.md) without an event loop:
 * a server on a thread of its own, and a blocking client that connects to
 * host:port and uses set/get/wait/add/compare_set, with torch TCPStore's
 * semantics (store/kvstore.h); the server is rendezvous/server.c in
 * store_only mode. cddp-train's bootstrap used it until its workers came
 * to speak torch's TCPStore only (store/tcpstore_thread.h and
 * store/tcpstore_client.h); tests/unit/test_rdzv_net.c drives the
 * rendezvous server's store through it.
 *
 * Serving (rank 0):
 *
 *     struct rdzv_store_thread *srv;
 *     int port;
 *     char err[256];
 *     if (rdzv_store_thread_start(NULL, master_port, NULL, &srv, &port, err, sizeof(err)))
 *         fail("%s", err);           // e.g. "cannot listen on * port 29500: address in use"
 *     ... train ...
 *     rdzv_store_thread_stop(srv);   // closes every connection, joins the thread
 *
 * Using (every rank, any thread):
 *
 *     struct rdzv_store_client *c;
 *     struct rdzv_store_client_options o = {.connect_timeout_ms = 60000};
 *     if (rdzv_store_connect(master_addr, master_port, &o, &c, err, sizeof(err)))
 *         fail("%s", err);           // retried with backoff until the server is up
 *     rdzv_store_set(c, "nccl/id", id, 128);
 *     void *v; size_t n;
 *     rc = rdzv_store_get(c, "nccl/id", &v, &n, 30000);   // waits up to 30 s for the key
 *     ... free(v);
 *     int64_t count;
 *     rdzv_store_add(c, "barrier/n", 1, &count);
 *     rdzv_store_close(c);
 *
 * Every call returns 0 or a negative code (common/errors.h): CDDP_ETIMEOUT,
 * CDDP_ENOTFOUND, CDDP_ETOOBIG, CDDP_EPARSE (add on a non-integer), a
 * -errno for the connection, ... rdzv_store_last_error() says more in one
 * line. A client is safe to share between threads (calls are serialised on
 * one connection); for parallel waits give each thread its own client.
 * After a connection error (or a local timeout) the client answers
 * CDDP_ECLOSED to everything: connect a new one.
 */
#ifndef CDDP_RENDEZVOUS_STORE_CLIENT_H
#define CDDP_RENDEZVOUS_STORE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

/* ---- serving, on a thread of its own ---- */

struct rdzv_store_thread;

/* Starts a thread with its own libuv loop serving a plain store on
 * host:port (host NULL or "": every interface; port 0: a free port, given
 * back in *port_out). token: NULL for none. Returns once the store accepts
 * connections, or with the reason it cannot (in err). The thread blocks
 * SIGPIPE for itself; the process's signal handling is not touched. */
int rdzv_store_thread_start(const char *host, int port, const char *token,
                            struct rdzv_store_thread **out, int *port_out, char *err,
                            size_t errlen);

/* Stops serving (clients see their connection close), joins the thread and
 * frees everything. */
void rdzv_store_thread_stop(struct rdzv_store_thread *t);

/* ---- using, blocking ---- */

struct rdzv_store_client;

struct rdzv_store_client_options {
    const char *token; /* NULL: none */
    /* Keep trying to connect this long (the server may not be up yet),
     * with exponential backoff and jitter from 10 ms to 1 s. 0: 60 s. */
    uint64_t connect_timeout_ms;
    /* How long set/add/compare_set wait for their answer. 0: 60 s. */
    uint64_t op_timeout_ms;
    /* run_id to say in hello (a rendezvous server's per-job store); NULL: "". */
    const char *run_id;
};

int rdzv_store_connect(const char *host, int port, const struct rdzv_store_client_options *o,
                       struct rdzv_store_client **out, char *err, size_t errlen);
void rdzv_store_close(struct rdzv_store_client *c);

int rdzv_store_set(struct rdzv_store_client *c, const char *key, const void *val, size_t len);

/* The value of key, in a malloc'd buffer (NUL-terminated, not counted in
 * *len) the caller frees. timeout_ms < 0: CDDP_ENOTFOUND at once if
 * missing; otherwise wait up to timeout_ms for it (CDDP_ETIMEOUT). */
int rdzv_store_get(struct rdzv_store_client *c, const char *key, void **val, size_t *len,
                   int64_t timeout_ms);

/* Waits until every key has a value. timeout_ms < 0: no limit. */
int rdzv_store_wait(struct rdzv_store_client *c, const char *const *keys, size_t n,
                    int64_t timeout_ms);

/* Adds delta to the integer in key (0 if missing); *out: the new value. */
int rdzv_store_add(struct rdzv_store_client *c, const char *key, int64_t delta, int64_t *out);

/* TCPStore's compare_set (see store/kvstore.h); *cur (malloc'd, may be NULL)
 * is what the key holds afterwards. */
int rdzv_store_compare_set(struct rdzv_store_client *c, const char *key, const void *expected,
                           size_t elen, const void *desired, size_t dlen, void **cur,
                           size_t *curlen);

/* One line about the last failure (the server's message if it sent one). */
const char *rdzv_store_last_error(struct rdzv_store_client *c);

#endif
