/*
 * dashboard.c: see dashboard.h. The page itself is generated into
 * dashboard_html.c by the build.
 */
#include "status/dashboard.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One media range of an Accept header: "type/sub" and its q (0..1). */
struct media_range {
    const char *type;
    size_t len;
    double q;
};

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

/* Parses the parameters after a media range (";q=0.5;level=1"), returning
 * the q value (1 when absent; 0 when malformed, so a garbled range never
 * wins the negotiation). */
static double range_q(const char *p, const char *end)
{
    double q = 1.0;
    while (p < end) {
        while (p < end && (*p == ';' || is_space(*p)))
            p++;
        const char *param = p;
        while (p < end && *p != ';')
            p++;
        const char *pend = p;
        while (pend > param && is_space(pend[-1]))
            pend--;
        if (pend - param < 2 || (param[0] != 'q' && param[0] != 'Q'))
            continue;
        const char *v = param + 1;
        while (v < pend && is_space(*v))
            v++;
        if (v == pend || *v != '=')
            continue;
        v++;
        while (v < pend && is_space(*v))
            v++;
        /* qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] ) */
        char num[8];
        size_t n = (size_t)(pend - v);
        if (n == 0 || n >= sizeof(num))
            return 0.0;
        memcpy(num, v, n);
        num[n] = '\0';
        char *stop;
        q = strtod(num, &stop);
        if (*stop != '\0' || !(q >= 0.0 && q <= 1.0))
            return 0.0;
    }
    return q;
}

static bool range_is(const struct media_range *r, const char *type)
{
    return r->len == strlen(type) && strncasecmp(r->type, type, r->len) == 0;
}

bool status_dashboard_wants_html(const char *accept)
{
    if (accept == NULL || strlen(accept) > STATUS_ACCEPT_MAX)
        return false;
    double html_q = 0.0;
    /* The quality of text/plain by the most specific range that matches it:
     * 3 text/plain, 2 text/any, 1 any/any, 0 none (then it is not acceptable,
     * but a client that names only HTML still wants HTML). */
    int plain_rank = 0;
    double plain_q = 0.0;
    const char *p = accept;
    while (*p) {
        const char *item = p;
        while (*p && *p != ',')
            p++;
        const char *end = p;
        if (*p == ',')
            p++;
        while (item < end && is_space(*item))
            item++;
        struct media_range r = {item, 0, 0.0};
        while (item + r.len < end && item[r.len] != ';' && !is_space(item[r.len]))
            r.len++;
        if (r.len == 0)
            continue;
        r.q = range_q(item + r.len, end);
        if (range_is(&r, "text/html") || range_is(&r, "application/xhtml+xml")) {
            if (r.q > html_q)
                html_q = r.q;
            continue;
        }
        int rank = range_is(&r, "text/plain") ? 3
                   : range_is(&r, "text/*")   ? 2
                   : range_is(&r, "*/*")      ? 1
                                              : 0;
        if (rank > plain_rank) {
            plain_rank = rank;
            plain_q = r.q;
        }
    }
    return html_q > 0.0 && html_q >= plain_q;
}
