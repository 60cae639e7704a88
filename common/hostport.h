/*
 * hostport.h: "host[:port]" as torchrun's --rdzv_endpoint and --master_addr
 * take them: host names, IPv4, and IPv6 in brackets ("[::1]:29400"). A bare
 * IPv6 address without brackets is taken as a host with no port.
 */
#ifndef CDDP_COMMON_HOSTPORT_H
#define CDDP_COMMON_HOSTPORT_H

#include <stdbool.h>
#include <stddef.h>

struct cddp_hostport {
    char host[256]; /* without brackets */
    int port;       /* 0..65535 */
    bool has_port;
};

/* Parses s; a missing port becomes default_port. On error returns CDDP_EPARSE
 * or CDDP_ERANGE_ARG and writes a one-line reason into err. */
int cddp_hostport_parse(const char *s, int default_port, struct cddp_hostport *out, char *err,
                        size_t errlen);

/* The status port's value (--status-port, CDDP_STATUS_PORT; cddprun and
 * cddp-rdzv): a port number, 0 for any free one. NULL or "" (an empty
 * CDDP_STATUS_PORT= in a manifest) leave the port off: *port = -1. On error
 * returns CDDP_EPARSE or CDDP_ERANGE_ARG with "NAME: 'TEXT' is not a port
 * number (0-65535; 0 picks a free one)", NAME being what the caller names
 * (the flag as typed, or the variable). */
int cddp_status_port_parse(const char *text, const char *name, int *port, char *err, size_t errlen);

/* "host:port", with brackets around IPv6 literals. Returns snprintf's count. */
int cddp_hostport_format(const char *host, int port, char *buf, size_t len);

#endif
