/* hostport.c: see hostport.h. */
#include "common/hostport.h"

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
