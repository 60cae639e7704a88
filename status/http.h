/*
 * http.h: the status port of cddprun and cddp-rdzv.
 *
 * An HTTP server (libmicrohttpd) on its own thread that serves what the
 * owner's event loop last published, and nothing else:
 *
 *     GET /livez, /healthz     200 while the owner's loop turns, else 503
 *     GET /readyz              200 when every readiness check passes, else 503
 *     GET /livez/<check>, /readyz/<check>   one check; ?verbose, ?exclude=<check>
 *     GET /status              the published JSON (application/json)
 *     GET /metrics             the published Prometheus text, then the
 *                              server's own cddp_status_* families
 *     GET /                    a plain-text index of the above; to a browser
 *                              (Accept names text/html first) the dashboard
 *     GET /dashboard           the dashboard, an HTML page (status/dashboard.h)
 *     POST /stacks, GET /stacks  only with on_stacks: ask the owner for a
 *                              stack capture (202 {"capture":N}), read the
 *                              last one it published (text)
 *     GET /history[?since=N]   only with on_history: the run's history
 *                              (status/history.h), rendered on request;
 *                              cddp-rdzv's takes ?run=<id> (a job's)
 *
 * HEAD works wherever GET does. Anything else: 405 with Allow; unknown
 * paths 404; headers past max_header_bytes 431 (or 414 for the URL, both
 * from libmicrohttpd); a body past max_body_bytes 413.
 *
 * Threads and ownership. The owner (one event loop) builds a status_snapshot
 * (rendered JSON, rendered metrics, named readiness checks), then publishes
 * it; from then on the snapshot is immutable and shared by reference count
 * with the requests that are serving it. Publishing swaps one pointer under a
 * mutex that is only ever held for that swap or for taking a reference, so
 * the loop never waits on the network or on a client. The HTTP thread never
 * sees the owner's data structures.
 *
 * Liveness is not in the snapshot: the owner calls status_server_heartbeat()
 * from a timer (every second, say); /livez fails once the last heartbeat is
 * older than live_timeout_ms, i.e. when the loop is wedged. /readyz includes
 * that "loop" check too: a wedged owner's last snapshot is not to be trusted.
 *
 * Clients cannot pin the server: at most max_connections at a time (one
 * more evicts the connection whose request or idle wait began longest ago,
 * so a new probe is always let in and answered), connections idle for
 * idle_timeout_s are closed, and a request that has not been answered
 * within request_timeout_ms of its first byte (a slowloris trickling
 * headers, or a reader that never drains the response) is cut off.
 * Nothing a client sends makes the server exit.
 */
#ifndef CDDP_STATUS_HTTP_H
#define CDDP_STATUS_HTTP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- snapshots ------------------------------------------------------- */

#define STATUS_CHECK_NAME_MAX 32
#define STATUS_CHECK_REASON_MAX 160
#define STATUS_MAX_CHECKS 16

struct status_check {
    char name[STATUS_CHECK_NAME_MAX]; /* [a-z0-9_-]+ */
    char reason[STATUS_CHECK_REASON_MAX];
    bool ok;
};

struct status_snapshot;
struct cddp_buf;

/* A new, empty, mutable snapshot holding one reference (the caller's), or
 * NULL when out of memory. An empty snapshot serves "{}", no metrics, and is
 * ready (no checks). */
struct status_snapshot *status_snapshot_new(void);

/* Copy the rendered /status JSON or /metrics text in (replacing what was
 * there). Only before the snapshot is published. 0 or -ENOMEM. */
int status_snapshot_set_status(struct status_snapshot *s, const char *json, size_t len);
int status_snapshot_set_metrics(struct status_snapshot *s, const char *text, size_t len);
/* The last on-demand stack capture, served as GET /stacks. */
int status_snapshot_set_stacks(struct status_snapshot *s, const char *text, size_t len);

/* Adds a readiness check. reason may be NULL; it is printed after a failed
 * check by ?verbose. 0, CDDP_EPARSE (bad or duplicate name) or CDDP_ETOOBIG. */
int status_snapshot_add_check(struct status_snapshot *s, const char *name, bool ok,
                              const char *reason);

/* Readers, valid while the caller holds a reference. */
const char *status_snapshot_status(const struct status_snapshot *s, size_t *len);
const char *status_snapshot_metrics(const struct status_snapshot *s, size_t *len);
size_t status_snapshot_check_count(const struct status_snapshot *s);
const struct status_check *status_snapshot_check(const struct status_snapshot *s, size_t i);
/* True when every check is ok. */
bool status_snapshot_ready(const struct status_snapshot *s);
/* Monotonic ms at which it was published (0 before). */
uint64_t status_snapshot_published_ms(const struct status_snapshot *s);

/* Reference counting; safe from any thread. unref(NULL) is a no-op. */
struct status_snapshot *status_snapshot_ref(struct status_snapshot *s);
void status_snapshot_unref(struct status_snapshot *s);

/* The slot a publisher and its readers share (exposed for unit tests and
 * for owners that serve a snapshot by other means). */
struct status_cell {
    pthread_mutex_t mu;
    struct status_snapshot *current; /* NULL until the first publish */
    uint64_t generation;             /* publishes so far */
};

int status_cell_init(struct status_cell *c);
/* Publishes s, taking over the caller's reference: s is frozen from now on.
 * The previous snapshot is released (freed once its last reader is done). */
void status_cell_publish(struct status_cell *c, struct status_snapshot *s);
/* A new reference to the current snapshot (release it with unref), or NULL
 * before the first publish. */
struct status_snapshot *status_cell_acquire(struct status_cell *c, uint64_t *generation);
/* Releases the current snapshot. */
void status_cell_destroy(struct status_cell *c);

/* ---- the server ------------------------------------------------------ */

struct status_server_options {
    const char *addr;            /* listen address; default "127.0.0.1" */
    int port;                    /* 0 = any free port (see status_server_port) */
    const char *program;         /* for the index page; default "cddp" */
    unsigned max_connections;    /* default 64 */
    unsigned idle_timeout_s;     /* default 5 */
    unsigned request_timeout_ms; /* default 10000 */
    size_t max_header_bytes;     /* request line + headers; default 8192 */
    size_t max_body_bytes;       /* default 1024; our requests have no body */
    unsigned live_timeout_ms;    /* default 5000 */
    /* POST /stacks (NULL: no such endpoint). Called on the HTTP thread: it
     * must not block (signal the owner's loop and return). Returns the
     * capture's number (> 0), or <= 0 with a reason in why. */
    long long (*on_stacks)(void *arg, char *why, size_t whylen);
    void *on_stacks_arg;
    /* GET /history (NULL: no such endpoint). Called on the HTTP thread, per
     * request: appends the JSON of what is newer than `since` to out. It
     * must hold the owner's data only briefly (copy under the owner's lock,
     * render the copy). run: the ?run= argument, or NULL. 0, or an error:
     * CDDP_EPARSE answers 400 (run= is needed), CDDP_ENOTFOUND 404 (no
     * such run), others 500. */
    int (*on_history)(void *arg, const char *run, uint64_t since, struct cddp_buf *out);
    void *on_history_arg;
};

/* Counters kept by the HTTP thread (also served as cddp_status_* metrics). */
struct status_server_stats {
    uint64_t connections_total; /* accepted */
    uint64_t connections_open;
    uint64_t requests_total;    /* answered by the handler (all codes) */
    uint64_t slow_closed_total; /* cut off by request_timeout_ms */
    uint64_t evicted_total;     /* cut off to let a newer one in (max_connections) */
    uint64_t responses[6];      /* by class: index 2 = 2xx ... 5 = 5xx */
};

struct status_server;

void status_server_options_default(struct status_server_options *o);

/* Binds, listens and starts the HTTP thread. On failure returns a negative
 * code, writes a one-line reason into err ("cannot listen on
 * 127.0.0.1:8080: Address already in use") and *out is NULL. */
int status_server_start(const struct status_server_options *o, struct status_server **out,
                        char *err, size_t errlen);

/* The port actually bound (useful with port 0). */
int status_server_port(const struct status_server *s);
/* "127.0.0.1:8080" / "[::1]:8080". */
const char *status_server_address(const struct status_server *s);

/* Publishes snap, taking over the caller's reference (see status_cell_publish). */
void status_server_publish(struct status_server *s, struct status_snapshot *snap);

/* The owner's loop is alive: one atomic store. Call it from a loop timer. */
void status_server_heartbeat(struct status_server *s);

void status_server_stats(struct status_server *s, struct status_server_stats *out);

/* Stops the thread, closes every connection and the listening socket, frees
 * s and its current snapshot. NULL is a no-op. Call it from the owner. */
void status_server_stop(struct status_server *s);

#endif
