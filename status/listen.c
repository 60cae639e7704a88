/*
 * listen.c: the status port's listening socket (listen.h).
 */
#include "status/listen.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/hostport.h"
#include "common/strutil.h"

/* TCP_DEFER_ACCEPT, seconds. */
#define STATUS_DEFER_ACCEPT_S 1

int status_listen(const char *addr, int port, int *fd_out, int *family, char *err, size_t errlen)
{
    char host[256];
    size_t len = strlen(addr);
    /* "[::1]" as well as "::1". */
    if (len >= 2 && addr[0] == '[' && addr[len - 1] == ']') {
        if (len - 2 >= sizeof(host)) {
            snprintf(err, errlen, "status address '%s' is too long", addr);
            return CDDP_EPARSE;
        }
        memcpy(host, addr + 1, len - 2);
        host[len - 2] = '\0';
    } else {
        cddp_strlcpy(host, addr, sizeof(host));
    }
    char service[16];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(host, service, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "status address '%s': %s", addr, gai_strerror(gai));
        return CDDP_EPARSE;
    }
    int fd = -1, rc = 0;
    char shown[300];
    cddp_hostport_format(host, port, shown, sizeof(shown));
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) {
            rc = CDDP_ERR_FROM_ERRNO(errno);
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        /* A connection reaches accept() once its first bytes are in (or,
         * without any, after about this many seconds): an idle one cannot
         * take a place before a probe that has sent its request, and a
         * probe is never accepted before its request (http.c, make_room). */
        int defer = STATUS_DEFER_ACCEPT_S;
        setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof(defer));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) {
            *family = ai->ai_family;
            rc = 0;
            break;
        }
        rc = CDDP_ERR_FROM_ERRNO(errno);
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", shown, cddp_strerror(rc));
        return rc ? rc : CDDP_EPARSE;
    }
    *fd_out = fd;
    return 0;
}
