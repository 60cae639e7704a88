/*
 * hostport.h: "host[:port]" texts, in two dialects.
 *
 * cddp_hostport_parse is cddp's own (cddpctl's HOST:PORT, cddp-rdzv's
 * --endpoint, etcd members): a bare IPv6 address is a host with no port.
 * cddp_hostport_parse_torchrun copies torch's parse_rendezvous_endpoint
 * (torch/distributed/elastic/rendezvous/utils.py), which cddprun uses for
 * --rdzv_endpoint and --master_addr:--master_port so that every endpoint
 * torchrun takes means the same here: it splits at the LAST colon
 * (Python's rsplit(":", 1)) unless the whole text is in brackets.
 *
 * How they differ, with default_port D:
 *
 *     text              cddp_hostport_parse       cddp_hostport_parse_torchrun
 *     host              host, D                   host, D
 *     host:port         host, port                host, port
 *     [::1]:29400       ::1, 29400                ::1, 29400
 *     [::1]             ::1, D                    ::1, D
 *     ::1               ::1, D (two colons or     an error: a bare IPv6 address, with
 *                       more: all of it a host)   the hint "[::1]:PORT" (torch: host
 *                                                 ":" and port 1; see below)
 *     ::1:29400         "::1:29400", D            ::1, 29400
 *     a:b:1             "a:b:1", D                an error: the host 'a:b' has a colon
 *                                                 and is not an IPv6 address
 *     "" or " h:1 "     an error (empty host;     localhost, D; h, 1 (torch strips
 *                       spaces are not removed)   whitespace first)
 *     bad_host!:1       host "bad_host!", 1       an error: a host is letters,
 *                                                 digits and _ . : - only
 *     h:+1              h, 1 (strtol)             an error: 1-5 digits only
 *
 * cddprun refuses a bare IPv6 address where torch would split it at its
 * last colon: torch reads "::1" as host ":" and port 1 and fails only when
 * the connection times out; reading it as ::1 would make "fe80::1:2" mean
 * one thing here and another in torchrun. So without brackets, the host
 * torch's split leaves must be a host name, an IPv4 address or a whole
 * IPv6 address ("::1:29400" is still ::1 and port 29400, as in torch;
 * "2001:db8::1:2" is 2001:db8::1 and port 2, as in torch). Every endpoint
 * torch reads and can reach means the same here (docs/torchrun-compat.md).
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

/* torch's parse_rendezvous_endpoint (the table above): whitespace is
 * stripped; empty is "localhost" and default_port; "[v6]" or "[v6]:port"
 * in brackets; otherwise the last colon splits host and port. The port is
 * 1-5 digits in 0..65535; a missing port is default_port (has_port false).
 * On error returns CDDP_EPARSE or CDDP_ETOOBIG with one line in err that
 * names the endpoint ("the port of endpoint 'h:x' must be ..."); callers
 * prefix the flag. */
int cddp_hostport_parse_torchrun(const char *s, int default_port, struct cddp_hostport *out,
                                 char *err, size_t errlen);

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
