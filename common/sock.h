/*
 * sock.h: blocking TCP use with deadlines, for the programs' plain-thread
 * clients (rendezvous/store_client.c, store/tcpstore_client.c); the
 * daemons use libuv instead.
 *
 * Deadlines are monotonic milliseconds (common/clock.h cddp_mono_ms). The
 * fds are non-blocking (cddp_tcp_connect makes them so): every call waits
 * with poll(2) until its deadline and retries EINTR. Every function returns
 * 0 or a negative code: CDDP_ETIMEOUT at the deadline, -errno otherwise
 * (ECONNRESET for a peer that closed); no allocation but getaddrinfo's.
 */
#ifndef CDDP_COMMON_SOCK_H
#define CDDP_COMMON_SOCK_H

#include <stddef.h>
#include <stdint.h>

/* Waits until fd is ready for events (POLLIN, POLLOUT). */
int cddp_wait_fd(int fd, short events, uint64_t deadline);

/* Sends all n bytes (MSG_NOSIGNAL: a closed peer is -EPIPE, no signal). */
int cddp_send_all(int fd, const void *buf, size_t n, uint64_t deadline);

/* Reads exactly n bytes. */
int cddp_recv_all(int fd, void *buf, size_t n, uint64_t deadline);

/* One attempt to connect to every address of host:port in turn: a
 * non-blocking, close-on-exec socket with TCP_NODELAY in *fd_out. On
 * failure err says why in one line ("cannot resolve 'h': ...", "cannot
 * connect to h port p: ..."); CDDP_EPARSE means host does not resolve. */
int cddp_tcp_connect_once(const char *host, int port, uint64_t deadline, int *fd_out, char *err,
                          size_t errlen);

/* Connects, retrying while nothing listens yet (a server still starting)
 * with jittered backoff (10 ms doubling to 1 s, common/backoff.h) until
 * deadline; each attempt gets at least 100 ms, even at the very end. A
 * host that does not resolve is not retried. On failure err is the last
 * attempt's reason, then " (kept trying for S s)" when it was retried. */
int cddp_tcp_connect(const char *host, int port, uint64_t deadline, int *fd_out, char *err,
                     size_t errlen);

#endif
