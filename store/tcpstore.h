/*
 * tcpstore.h: a server that speaks PyTorch's TCPStore protocol
 * (tcpstore_wire.h, docs/tcpstore.md) over the store engine (kvstore.h),
 * on a caller's libuv loop.
 *
 * Clients are torch's own: torch.distributed.TCPStore(host, port,
 * is_master=False), init_process_group("env://") with
 * TORCHELASTIC_USE_AGENT_STORE=True, c10d's rendezvous. Both numberings of
 * the query types are served; each connection settles its own on its first
 * query (tcpstore_wire.h says how).
 *
 * Waits have no server-side deadline: a TCPStore client times out by
 * itself (torch 2.x then sends CANCEL_WAIT). A query the decoder refuses
 * (unknown type, a key or value past the limits, a bad handshake), a store
 * that is full, a client that stops reading its replies, or one whose bytes
 * would take the server past max_held for all clients together: that
 * connection is closed with one log line (S0703..S0706), the store and the
 * other connections go on.
 *
 * Threading: everything runs on the loop's thread. Ownership: the server is
 * the caller's until tcpstore_server_close()'s callback has run; it owns its
 * handles and frees them in their close callbacks. When start returns an
 * error, nothing was started and the close callback is never called.
 */
#ifndef CDDP_STORE_TCPSTORE_H
#define CDDP_STORE_TCPSTORE_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "store/kvstore.h"
#include "store/tcpstore_wire.h"

struct tcpstore_server_options {
    const char *host; /* NULL or "": every interface (IPv6 dual stack, else IPv4) */
    int port;         /* 0: a free port (tcpstore_server_port) */
    int backlog;      /* 0: 65535 (clamped by the kernel's somaxconn) */
    struct tcpstore_limits wire;
    struct kvstore_limits store; /* max_waiters is per connection */
    size_t max_write_queue;      /* replies queued to one client; 0: 256 MiB */
    size_t max_held;             /* unfinished queries + queued replies of all clients; 0: 1 GiB */
};

struct tcpstore_stats {
    size_t connections; /* open now */
    uint64_t accepted;
    uint64_t queries;
    uint64_t refused; /* connections closed for a protocol error, a full store, or not reading */
    uint64_t dialect_v1, dialect_v2; /* connections that settled on each numbering */
    size_t keys;                     /* keys with a value */
    size_t bytes;                    /* the store's bytes (kvstore_bytes) */
    size_t waiting;                  /* connections with a wait pending */
    size_t held;                     /* bytes of unfinished queries and queued replies */
};

struct tcpstore_server;

/* Binds and listens. 0 with *out, or a negative code with err filled. */
int tcpstore_server_start(uv_loop_t *loop, const struct tcpstore_server_options *o,
                          struct tcpstore_server **out, char *err, size_t errlen);

/* Sets key as a client's SET would, from the server's own thread: waits
 * on it are answered, watchers told. 0 or a negative code (a full store). */
int tcpstore_server_set(struct tcpstore_server *s, const char *key, const void *val, size_t len);

/* The port it listens on. */
int tcpstore_server_port(const struct tcpstore_server *s);

void tcpstore_server_stats(const struct tcpstore_server *s, struct tcpstore_stats *out);

/* Stops listening, closes every connection and frees the server (and its
 * store) once all handles are closed; then calls cb(arg) (cb may be NULL). */
void tcpstore_server_close(struct tcpstore_server *s, void (*cb)(void *arg), void *arg);

#endif
