/* hostport.c: see hostport.h. */
#include "common/hostport.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

int cddp_hostport_parse(const char *s, int default_port, struct cddp_hostport *out, char *err,
                        size_t errlen)
{
    const char *host = s;
    size_t hostlen;
    const char *port = NULL;

    memset(out, 0, sizeof(*out));
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL) {
            snprintf(err, errlen, "'%s': IPv6 address without closing ']'", s);
            return CDDP_EPARSE;
        }
        host = s + 1;
        hostlen = (size_t)(close - host);
        if (close[1] == ':')
            port = close + 2;
        else if (close[1] != '\0') {
            snprintf(err, errlen, "'%s': unexpected text after ']'", s);
            return CDDP_EPARSE;
        }
    } else {
        const char *colon = strchr(s, ':');
        if (colon && strchr(colon + 1, ':')) {
            hostlen = strlen(s); /* bare IPv6 literal */
        } else if (colon) {
            hostlen = (size_t)(colon - s);
            port = colon + 1;
        } else {
            hostlen = strlen(s);
        }
    }
    if (hostlen == 0) {
        snprintf(err, errlen, "'%s': empty host", s);
        return CDDP_EPARSE;
    }
    if (hostlen >= sizeof(out->host)) {
        snprintf(err, errlen, "'%s': host name too long", s);
        return CDDP_ERANGE_ARG;
    }
    memcpy(out->host, host, hostlen);
    out->host[hostlen] = '\0';

    if (port) {
        long p;
        int rc = cddp_parse_long(port, 0, 65535, &p);
        if (rc) {
            snprintf(err, errlen, "'%s': port '%s' is not an integer in 0..65535", s, port);
            return rc;
        }
        out->port = (int)p;
        out->has_port = true;
    } else {
        out->port = default_port;
    }
    return 0;
}

int cddp_hostport_parse_torchrun(const char *s, int default_port, struct cddp_hostport *out,
                                 char *err, size_t errlen)
{
    char buf[512];
    memset(out, 0, sizeof(*out));
    if (cddp_strlcpy(buf, s, sizeof(buf)) >= sizeof(buf))
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "endpoint '%s' is too long", s);
    char *e = cddp_strip(buf);
    if (*e == '\0') {
        cddp_strlcpy(out->host, "localhost", sizeof(out->host));
        out->port = default_port;
        return 0;
    }
    size_t n = strlen(e);
    char *h = e, *p = NULL;
    bool bracketed = e[0] == '[' && e[n - 1] == ']';
    if (!bracketed) {
        char *colon = strrchr(e, ':');
        if (colon) {
            *colon = '\0';
            p = colon + 1;
        }
    }
    /* Without brackets, torch splits an IPv6 address at its last colon:
     * "::1" becomes host ':' and port 1, which fails only when nothing
     * answers there. A host that keeps a colon must be an IPv6 address
     * itself ("::1:29400" is ::1, port 29400, as in torch). */
    struct in6_addr a6;
    if (!bracketed && p && h[0] != '[' && strchr(h, ':') && inet_pton(AF_INET6, h, &a6) != 1) {
        p[-1] = ':';
        if (inet_pton(AF_INET6, e, &a6) == 1)
            return cddp_fail(err, errlen, CDDP_EPARSE,
                             "endpoint '%s' is a bare IPv6 address: write it in brackets, "
                             "[%s]:PORT",
                             s, e);
        p[-1] = '\0';
        return cddp_fail(err, errlen, CDDP_EPARSE,
                         "the host of endpoint '%s' ('%s') has a colon but is not an IPv6 "
                         "address: write IPv6 addresses in brackets, [ADDR]:PORT",
                         s, h);
    }
    size_t hl = strlen(h);
    if (hl > 1 && h[0] == '[' && h[hl - 1] == ']') {
        h[hl - 1] = '\0';
        h++;
    }
    out->port = default_port;
    if (p) {
        long v;
        size_t pl = strlen(p);
        bool digits = pl >= 1 && pl <= 5;
        for (size_t i = 0; i < pl; i++)
            digits &= isdigit((unsigned char)p[i]) != 0;
        if (!digits || cddp_parse_long(p, 0, 65535, &v) != 0)
            return cddp_fail(err, errlen, CDDP_EPARSE,
                             "the port of endpoint '%s' must be an integer between 0 and 65536", s);
        out->port = (int)v;
        out->has_port = true;
    }
    /* torch's re.match(r"^[\w\.:-]+$", host), for ASCII. */
    bool ok = *h != '\0';
    for (const char *c = h; *c; c++)
        ok &= isalnum((unsigned char)*c) || *c == '_' || *c == '.' || *c == ':' || *c == '-';
    if (!ok)
        return cddp_fail(err, errlen, CDDP_EPARSE,
                         "the host of endpoint '%s' must be a host name, an IPv4 address or an "
                         "IPv6 address",
                         s);
    if (cddp_strlcpy(out->host, h, sizeof(out->host)) >= sizeof(out->host))
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "the host of endpoint '%s' is too long", s);
    return 0;
}

int cddp_status_port_parse(const char *text, const char *name, int *port, char *err, size_t errlen)
{
    *port = -1;
    if (text == NULL || text[0] == '\0')
        return 0;
    long v;
    int rc = cddp_parse_long(text, 0, 65535, &v);
    if (rc) {
        snprintf(err, errlen, "%s: '%s' is not a port number (0-65535; 0 picks a free one)", name,
                 text);
        return rc;
    }
    *port = (int)v;
    return 0;
}

int cddp_hostport_format(const char *host, int port, char *buf, size_t len)
{
    if (strchr(host, ':'))
        return snprintf(buf, len, "[%s]:%d", host, port);
    return snprintf(buf, len, "%s:%d", host, port);
}
