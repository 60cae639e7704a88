/*
 * client.h: the agent's rendezvous client, asynchronous, on the caller's
 * libuv loop (docs/protocol.md has the messages and the round diagram).
 *
 * One client is one agent (one node) in one run. The agent drives it:
 *
 *   rdzv_client_start()   connect (retrying with backoff until the server is
 *                         up, at most connect_timeout), say hello (token),
 *                         beat every keep_alive_interval from then on
 *   rdzv_client_join()    join the next round; join_cb(0, round) when it
 *                         completes: node_rank, nnodes, world_size,
 *                         rank_offset, MASTER_ADDR/PORT, round number
 *   ... workers run ...
 *   event RESTART         a node was lost / joined / failed: stop the
 *                         workers, then rdzv_client_join() again
 *                         (restart.counted: count it against --max_restarts)
 *   rdzv_client_replace()  one of our workers failed and is restarted
 *                         alone (--restart_scope=worker): event GENERATION
 *                         (every node) when the server grants it
 *   rdzv_client_report_failure()  our worker group failed: every node
 *                         restarts (counted), us too (event RESTART)
 *   rdzv_client_barrier() the exit barrier after success (torch's)
 *   rdzv_client_close_rendezvous()  the job is over (or failed for good):
 *                         every node gets event CLOSED
 *   rdzv_client_close()   free it
 *
 * Callbacks run on the loop thread. As in libuv: when a function that takes
 * a callback returns an error, that callback is never called; once it
 * returned 0 the callback is called exactly once (with -ECANCELED if the
 * client is closed first). Callbacks may call any function here, including
 * rdzv_client_close().
 *
 * While a join is outstanding, membership news comes through its join_cb
 * (round, or CDDP_ETIMEOUT after join_timeout, CDDP_ECLOSED, CDDP_ETOKEN,
 * CDDP_EMISMATCH, CDDP_ECONFIG, a connection error); a RESTART that crosses
 * our join is swallowed (we are rejoining anyway). Otherwise it comes as
 * events.
 *
 * A lost connection (closed or reset without a word from the server, or a
 * server silent for read_timeout: heartbeats are answered by servers that
 * say so in welcome) is reconnected, with backoff and jitter, for up to
 * reconnect_timeout (join_timeout by default): event DISCONNECTED, then
 *   - an outstanding join is sent again (its join_cb stays pending);
 *   - a node in a round asks the server to resume it there: when the server
 *     still runs that round with this node in it, event RECONNECTED
 *     (resumed: its workers go on); otherwise event RESTART (reason
 *     "resume_failed": the round ended meanwhile, or the server restarted
 *     and lost it), or CLOSED;
 *   - otherwise event RECONNECTED;
 * store requests pending at the loss fail with -ECONNRESET; calls made
 * while disconnected wait and go out, in order, after the welcome. Once
 * the server refused us (an error message) or closed the run, or the time
 * is up, the loss is final: event ERROR (or the join_cb), then every call
 * fails with CDDP_ECLOSED.
 *
 * The process must ignore SIGPIPE (libuv writes with write(2)).
 */
#ifndef CDDP_RENDEZVOUS_CLIENT_H
#define CDDP_RENDEZVOUS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "proto/msg.h"
#include "rendezvous/conf.h"

struct rdzv_client;

struct rdzv_client_options {
    const char *host; /* the rendezvous endpoint: name, IPv4 or IPv6 (no brackets) */
    int port;
    const char *run_id;  /* --rdzv_id */
    const char *node_id; /* unique in the run; NULL: "<hostname>_<pid>_0" */
    int nproc;           /* workers on this node (--nproc_per_node) */
    int min_nodes, max_nodes;
    const char *local_addr; /* --local_addr (MASTER_ADDR if we become node 0), or NULL */
    const char *hostname;   /* how others reach us if no local_addr; NULL: gethostname() */
    int status_port;        /* the agent's status port, told to the server; 0: none */
    /* rdzv_conf (timeouts, keep-alive, token); NULL: torchrun's defaults.
     * Without a token there, CDDP_RDZV_TOKEN from the environment is used.
     * The client sends the server what it needs of it, never the token
     * except in hello. */
    const struct rdzv_conf *conf;
    /* Give up connecting after this; 0: conf->read_timeout (60 s). */
    uint64_t connect_timeout_ms;
    /* After a lost connection, give up reconnecting after this; 0:
     * conf->join_timeout (600 s). */
    uint64_t reconnect_timeout_ms;
};

enum rdzv_event_kind {
    RDZV_EV_JOINED = 1,   /* the server took our join (waiting: the round is full, we wait
                             for a place); informational */
    RDZV_EV_RESTART,      /* stop the workers, then join again */
    RDZV_EV_CLOSED,       /* the rendezvous is closed: end the job */
    RDZV_EV_ERROR,        /* the connection is lost for good or we were refused: final */
    RDZV_EV_DISCONNECTED, /* the connection was lost: reconnecting (message: why) */
    RDZV_EV_RECONNECTED,  /* connected again (resumed: still in its round) */
    RDZV_EV_WAITING,      /* the run's wait list changed (waiting_nodes) */
    RDZV_EV_GENERATION,   /* a replace answered: the round goes on in place (generation,
                             replaced, node_id: who asked), or refused (generation 0,
                             message: why; to the asker only) */
    RDZV_EV_BLAME,        /* another node's worker named one of ours (rank) as never
                             reaching a collective of generation (node_id: that node) */
};

struct rdzv_event {
    enum rdzv_event_kind kind;
    uint64_t round;        /* RESTART: the round to join; JOINED: the round joined */
    bool waiting;          /* JOINED: on the wait list */
    const char *reason;    /* RESTART, CLOSED */
    const char *node_id;   /* RESTART: the node that caused it (may be NULL) */
    bool counted;          /* RESTART: a worker failure (counts against --max_restarts) */
    int64_t restart_count; /* RESTART, GENERATION (granted): the run's counted restarts,
                              this one included */
    int code;              /* ERROR, DISCONNECTED */
    const char *message;   /* ERROR, DISCONNECTED: one line; RESTART: the server's detail */
    bool resumed;          /* RECONNECTED: this node is still in its round */
    bool from_server;      /* ERROR: the server's own error (it refused or removed us) */
    int64_t waiting_nodes; /* WAITING */
    int64_t generation;    /* GENERATION: the round's new generation; 0: refused */
    const char *replaced;  /* GENERATION: the global ranks restarted alone */
    int rank;              /* BLAME */
};

typedef void (*rdzv_event_cb)(struct rdzv_client *c, const struct rdzv_event *ev, void *data);
typedef void (*rdzv_join_cb)(struct rdzv_client *c, int status, const struct proto_round *round,
                             void *arg);

/* What a store operation returns; pointers valid during the callback. */
struct rdzv_store_result {
    const void *value; /* get, compare_set (NUL-terminated, not counted in len) */
    size_t len;
    int64_t number;      /* add */
    const char *message; /* with status != 0 */
};
typedef void (*rdzv_store_cb)(struct rdzv_client *c, int status, const struct rdzv_store_result *r,
                              void *arg);
typedef void (*rdzv_done_cb)(struct rdzv_client *c, int status, void *arg);

/* Creates the client and starts connecting. Options are copied. on_event
 * gets unsolicited news (see above); data is handed back to it. 0, or a
 * negative code with a reason in err (bad options, out of memory). */
int rdzv_client_start(uv_loop_t *loop, const struct rdzv_client_options *o, rdzv_event_cb on_event,
                      void *data, struct rdzv_client **out, char *err, size_t errlen);

/* Joins the next round. master_port: the port this node's rank 0 worker
 * would serve on if this node becomes node 0 (published as MASTER_PORT).
 * CDDP_ESTATE if a join is outstanding, CDDP_ECLOSED if the client is done. */
int rdzv_client_join(struct rdzv_client *c, int master_port, rdzv_join_cb cb, void *arg);

/* Our worker group failed in the current round (counted restart for all). */
int rdzv_client_report_failure(struct rdzv_client *c, const char *reason);
/* --restart_scope=worker: this node restarts the worker of global rank
 * `rank` alone and asks for the group's next generation; the answer comes
 * as event GENERATION (docs/protocol.md, "replace"). CDDP_EPROTO_TYPE: the
 * server does not understand replace (an older one); CDDP_ESTATE: no round
 * running here, a join outstanding, or not connected now. */
int rdzv_client_replace(struct rdzv_client *c, int rank, const char *ranks, const char *reason);
/* (ranks: NULL, rank alone; or several of our ranks at once, in one
 * generation, "5,7", decimal, ascending, `rank` the first: CDDP_EPROTO_TYPE
 * also from a server whose welcome lacked replace_ranks.) */
/* --restart_scope=worker: one of our workers named global rank `rank`
 * (another node's) as never reaching a collective of `generation`; the
 * server passes it on to that node (event BLAME there). Errors as
 * rdzv_client_replace's. */
int rdzv_client_blame(struct rdzv_client *c, int rank, int64_t generation);
/* We leave the job: the others restart without us (not counted); or,
 * finished, our workers succeeded and the others go on undisturbed. */
int rdzv_client_leave(struct rdzv_client *c, const char *reason, bool finished);
/* Closes the rendezvous for every node (event CLOSED everywhere, us too). */
int rdzv_client_close_rendezvous(struct rdzv_client *c, const char *reason);

/* The run's key-value store. timeout_ms < 0: get answers ENOTFOUND at once
 * for a missing key, wait waits without limit. */
int rdzv_client_set(struct rdzv_client *c, const char *key, const void *val, size_t len,
                    rdzv_store_cb cb, void *arg);
int rdzv_client_get(struct rdzv_client *c, const char *key, int64_t timeout_ms, rdzv_store_cb cb,
                    void *arg);
int rdzv_client_wait(struct rdzv_client *c, const char *const *keys, size_t n, int64_t timeout_ms,
                     rdzv_store_cb cb, void *arg);
int rdzv_client_add(struct rdzv_client *c, const char *key, int64_t delta, rdzv_store_cb cb,
                    void *arg);
int rdzv_client_compare_set(struct rdzv_client *c, const char *key, const void *expected,
                            size_t elen, const void *desired, size_t dlen, rdzv_store_cb cb,
                            void *arg);

/* torch's exit barrier (store_util.barrier): add(prefix/num_members, 1);
 * the n-th member sets prefix/last_member; everyone waits for it, at most
 * timeout_ms. Use a prefix unique to the round, e.g.
 * "torchelastic/agent/terminal_state/<round>". cb(0) or cb(CDDP_ETIMEOUT, ...). */
int rdzv_client_barrier(struct rdzv_client *c, const char *prefix, int n, int64_t timeout_ms,
                        rdzv_done_cb cb, void *arg);

/* What this node's heartbeats tell the server of its ranks' step times
 * from now on (copied; NULL: nothing, until set again). The server names
 * a node slower than the job's others from them (docs/protocol.md). */
void rdzv_client_set_perf(struct rdzv_client *c, const struct proto_perf *perf);
/* Asked at every heartbeat for this node's goodput totals (proto/msg.h;
 * false: none to send); NULL: none are sent. */
void rdzv_client_set_goodput(struct rdzv_client *c,
                             bool (*fn)(void *arg, struct proto_goodput *out), void *arg);

/* The last completed round (NULL before the first), valid until the next. */
const struct proto_round *rdzv_client_round(const struct rdzv_client *c);
/* One line about the last failure (the server's message if it sent one). */
const char *rdzv_client_last_error(const struct rdzv_client *c);
/* The node id in use. */
const char *rdzv_client_node_id(const struct rdzv_client *c);
/* Connected and welcomed now. */
bool rdzv_client_connected(const struct rdzv_client *c);
/* Some connection was welcomed: the server has heard of this node. */
bool rdzv_client_ever_welcomed(const struct rdzv_client *c);
/* Milliseconds since the server's host last answered: bytes from the
 * server, or a reset or refusal from its host (the server is gone, so it
 * is not removing anyone; 0 while its host keeps refusing the reconnect
 * attempts). -1 while that cannot be told: no welcome yet,
 * a server that does not answer heartbeats, or the client is done. */
int64_t rdzv_client_quiet_ms(const struct rdzv_client *c);
/* The run's wait list as the server last said (heartbeat answers); -1 while
 * unknown. */
int64_t rdzv_client_waiting(const struct rdzv_client *c);
/* Connections re-established after a loss. */
unsigned rdzv_client_reconnects(const struct rdzv_client *c);

/* Closes the connection and frees the client: every pending callback gets
 * -ECANCELED first, then close_cb (may be NULL). Do not use c afterwards. */
void rdzv_client_close(struct rdzv_client *c, void (*close_cb)(void *arg), void *arg);

#endif
