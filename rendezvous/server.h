/*
 * server.h: the rendezvous server, a libuv shell around rendezvous/state.c.
 *
 * It runs on the caller's loop: inside cddp-rdzv (rendezvous/main.c), inside
 * the agent that hosts the rendezvous (--standalone, is_host), or as a plain
 * key-value store (store_only: cddp-rdzv --store-only, or on a thread of its
 * own through rendezvous/store_client.h). Connections speak the protocol of
 * docs/protocol.md;
 * the server pushes rounds, restarts and closes to agents as they happen.
 *
 * Nothing a peer sends can stop the server: a bad frame, an unknown
 * message, a wrong token, a half-open connection or a peer that does not
 * read gets an error message (where it can still be sent) and its
 * connection closed; every other connection goes on.
 *
 * Threading: every call must be made on the loop's thread. The process
 * must ignore SIGPIPE (libuv writes with write(2)); cddp-rdzv and cddprun
 * do.
 */
#ifndef CDDP_RENDEZVOUS_SERVER_H
#define CDDP_RENDEZVOUS_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct rdzv_server;
struct proto_msg;   /* proto/msg.h */
struct rdzv_action; /* rendezvous/state.h */

struct rdzv_server_options {
    /* Address to listen on: a host name, an IPv4 or IPv6 address (no
     * brackets). NULL or "": every interface ("::" with IPv4 mapped, or
     * 0.0.0.0 where IPv6 is off). */
    const char *host;
    int port; /* 0: a free port (see rdzv_server_port) */
    /* Join token: when set, a hello without the same token is refused
     * (compared in constant time). NULL or "": no token. */
    const char *token;
    /* A plain key-value store: no rendezvous, one store for every client. */
    bool store_only;
    /* A new connection must say hello, and a frame once begun must
     * complete, within this. 0: 60 s. */
    uint64_t read_timeout_ms;
    size_t max_connections; /* 0: 100,000 */
    size_t max_write_queue; /* bytes queued to a peer that does not read; 0: 64 MiB */
    int backlog;            /* listen backlog; 0: 65535 (the kernel caps it at somaxconn) */
    const char *name;       /* server name sent in welcome; NULL: "cddp-rdzv <version>" */
    /* Called on the loop after every event that may have changed the
     * server's state or counters (for a status page, which should coalesce:
     * it runs often). May be NULL. */
    void (*on_change)(void *arg);
    void *change_arg;
    /* Optional, on the loop (cddp-rdzv's job-wide statistics,
     * rendezvous/jobs.h): every heartbeat message of a node in a run, and
     * every action of the state machine with its peer's run (run_id NULL:
     * none). */
    void (*on_heartbeat)(void *arg, const char *run_id, const char *node_id,
                         const struct proto_msg *m);
    void (*on_action)(void *arg, const char *run_id, const struct rdzv_action *a);
    void *jobs_arg;
};

struct rdzv_server_stats {
    size_t connections; /* open now */
    size_t runs;        /* runs held */
    uint64_t accepted;  /* connections accepted */
    uint64_t refused;   /* closed because of what they sent (or did not) */
    uint64_t frames_in; /* frames received */
    uint64_t rounds;    /* rounds completed (ROUND messages / nodes) */
    uint64_t restarts;  /* RESTART messages sent */
    /* refused, by reason (they add up to it) */
    uint64_t refused_limit;    /* past max_connections */
    uint64_t refused_token;    /* join token missing or wrong */
    uint64_t refused_protocol; /* bad frames or messages, timeouts, peers that do not read */
    uint64_t joins;            /* join requests */
    uint64_t rounds_completed; /* rounds completed (one per round, not per node) */
};

/* Binds, listens and starts serving on loop. On success *out is the server
 * and rdzv_server_port() the bound port. On error returns a negative code
 * and writes a one-line reason into err; nothing is left on the loop. */
int rdzv_server_start(uv_loop_t *loop, const struct rdzv_server_options *o,
                      struct rdzv_server **out, char *err, size_t errlen);

int rdzv_server_port(const struct rdzv_server *s);
/* "host:port" as bound, brackets around IPv6 ("[::]:29400"). */
const char *rdzv_server_address(const struct rdzv_server *s);
void rdzv_server_stats(const struct rdzv_server *s, struct rdzv_server_stats *out);

/* Waits for the end of a job: calls cb once run_id has no connection left
 * (every node of the job went away, or the run is gone), or when timeout_ms
 * has passed (UINT64_MAX: no limit), whichever comes first; never from inside this call. The
 * server keeps serving meanwhile (late nodes of a closed run are told it is
 * closed). This is how an agent hosting the rendezvous lets the other nodes
 * finish before it shuts the server down. One drain at a time: CDDP_ESTATE
 * for a second (cb is not called then). rdzv_server_shutdown calls a
 * pending drain's cb before it closes anything. */
int rdzv_server_drain(struct rdzv_server *s, const char *run_id, uint64_t timeout_ms,
                      void (*cb)(void *arg), void *arg);

/* Stops accepting, closes every run (each node gets "closed" with reason),
 * flushes what is queued (at most about a second), closes every connection
 * and handle and frees the server; then calls cb (may be NULL). The server
 * must not be used after this call. Calling it twice is harmless. */
void rdzv_server_shutdown(struct rdzv_server *s, const char *reason, void (*cb)(void *arg),
                          void *arg);

/* Like rdzv_server_shutdown, but for a successor (an upgrade): no run is
 * closed and nodes are told nothing; their connections close as if the
 * server had died, their agents reconnect to whatever serves the port next
 * (a new cddp-rdzv) and re-register their rounds there, which it rebuilds
 * without restarting workers (docs/protocol.md, "A restarted server"). */
void rdzv_server_stop_keep_runs(struct rdzv_server *s, void (*cb)(void *arg), void *arg);

/* The state machine, read only, for status pages (rdzv_state_visit). */
const struct rdzv_state *rdzv_server_state(const struct rdzv_server *s);

#endif
