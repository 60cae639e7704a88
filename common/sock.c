/* sock.c: see sock.h. */
#include "common/sock.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/strutil.h"

int cddp_wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = cddp_mono_ms();
        if (now >= deadline)
            return CDDP_ETIMEOUT;
        uint64_t left = deadline - now;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return CDDP_ERR_FROM_ERRNO(errno);
    }
}

int cddp_send_all(int fd, const void *buf, size_t n, uint64_t deadline)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = cddp_wait_fd(fd, POLLOUT, deadline);
            if (rc)
                return rc;
            continue;
        }
        return CDDP_ERR_FROM_ERRNO(w < 0 ? errno : EPIPE);
    }
    return 0;
}

int cddp_recv_all(int fd, void *buf, size_t n, uint64_t deadline)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return CDDP_ERR_FROM_ERRNO(ECONNRESET);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = cddp_wait_fd(fd, POLLIN, deadline);
            if (rc)
                return rc;
            continue;
        }
        return CDDP_ERR_FROM_ERRNO(errno);
    }
    return 0;
}

int cddp_tcp_connect_once(const char *host, int port, uint64_t deadline, int *fd_out, char *err,
                          size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG};
    struct addrinfo *ai = NULL;
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    int g = getaddrinfo(host, service, &hints, &ai);
    if (g != 0) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(g));
        return g == EAI_AGAIN ? CDDP_ERR_FROM_ERRNO(EAGAIN) : CDDP_EPARSE;
    }
    int rc = CDDP_ERR_FROM_ERRNO(ECONNREFUSED);
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        int fd =
            socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, p->ai_protocol);
        if (fd < 0) {
            rc = CDDP_ERR_FROM_ERRNO(errno);
            continue;
        }
        if (connect(fd, p->ai_addr, p->ai_addrlen) != 0 && errno != EINPROGRESS) {
            rc = CDDP_ERR_FROM_ERRNO(errno);
            close(fd);
            continue;
        }
        rc = cddp_wait_fd(fd, POLLOUT, deadline);
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr != 0)
            rc = CDDP_ERR_FROM_ERRNO(soerr);
        if (rc) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        *fd_out = fd;
        freeaddrinfo(ai);
        return 0;
    }
    freeaddrinfo(ai);
    snprintf(err, errlen, "cannot connect to %s port %d: %s", host, port, cddp_strerror(rc));
    return rc;
}

int cddp_tcp_connect(const char *host, int port, uint64_t deadline, int *fd_out, char *err,
                     size_t errlen)
{
    uint64_t start = cddp_mono_ms();
    unsigned seed = (unsigned)getpid() ^ (unsigned)cddp_mono_ns();
    struct cddp_backoff backoff;
    cddp_backoff_init(&backoff, 10, 1000);
    int rc;
    for (;;) {
        uint64_t now0 = cddp_mono_ms();
        uint64_t attempt = deadline > now0 + 100 ? deadline : now0 + 100;
        rc = cddp_tcp_connect_once(host, port, attempt, fd_out, err, errlen);
        if (rc == 0 || rc == CDDP_EPARSE)
            return rc;
        uint64_t now = cddp_mono_ms();
        if (now >= deadline)
            break;
        /* With jitter, so thousands of ranks spread out. */
        uint64_t sleep_ms = cddp_backoff_next(&backoff, (uint32_t)rand_r(&seed), deadline - now);
        struct timespec ts = {.tv_sec = (time_t)(sleep_ms / 1000),
                              .tv_nsec = (long)(sleep_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    char why[256];
    cddp_strlcpy(why, err, sizeof(why));
    snprintf(err, errlen, "%s (kept trying for %.1f s)", why,
             (double)(cddp_mono_ms() - start) / 1000.0);
    return rc;
}
