/*
 * listen.h: the status port's listening socket: the address ("[::1]" as
 * well as "::1", a name, "*"), bound and listening, non-blocking, with
 * accept deferred until a connection's first bytes arrive (TCP_DEFER_ACCEPT,
 * 1 s: an idle connection does not reach libmicrohttpd before a probe that
 * has sent its request; status/http.c, make_room).
 */
#ifndef CDDP_STATUS_LISTEN_H
#define CDDP_STATUS_LISTEN_H

#include <stddef.h>

/* 0 and the socket in *fd_out (its address family in *family), or an
 * error code with a one-line message in err. */
int status_listen(const char *addr, int port, int *fd_out, int *family, char *err, size_t errlen);

#endif
