/* prom.c: see prom.h. */
#include "status/prom.h"

#include <math.h>
#include <string.h>

#include "common/errors.h"
#include "common/numfmt.h"
#include "common/utf8.h"

static bool name_char(char c, bool first, bool colon)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return true;
    if (colon && c == ':')
        return true;
    return !first && c >= '0' && c <= '9';
}

bool prom_valid_metric_name(const char *name)
{
    if (name == NULL || name[0] == '\0' || strlen(name) >= PROM_NAME_MAX)
        return false;
    for (size_t i = 0; name[i]; i++)
        if (!name_char(name[i], i == 0, true))
            return false;
    return true;
}

bool prom_valid_label_name(const char *name)
{
    if (name == NULL || name[0] == '\0' || (name[0] == '_' && name[1] == '_'))
        return false;
    for (size_t i = 0; name[i]; i++)
        if (!name_char(name[i], i == 0, false))
            return false;
    return true;
}

size_t prom_format_value(double v, char *buf, size_t len)
{
    if (isfinite(v))
        return cddp_format_double(v, buf, len);
    const char *word = isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf";
    size_t n = len ? cddp_strlcpy(buf, word, len) : 0;
    return n < len ? n : (len ? len - 1 : 0);
}

/* Appends s with \ and newline escaped (and " too when quote), replacing
 * bytes that are not UTF-8 with U+FFFD: the format is UTF-8 only. */
static int append_escaped(struct cddp_buf *out, const char *s, bool quote)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        /* Copy the longest run that needs nothing. */
        const unsigned char *run = p;
        size_t n;
        while (*p && *p != '\\' && *p != '\n' && !(quote && *p == '"') &&
               (n = cddp_utf8_len(p)) > 0)
            p += n;
        int rc = cddp_buf_append(out, run, (size_t)(p - run));
        if (rc)
            return rc;
        if (*p == '\0')
            break;
        const char *rep;
        if (*p == '\\')
            rep = "\\\\";
        else if (*p == '\n')
            rep = "\\n";
        else if (*p == '"')
            rep = "\\\"";
        else
            rep = "\xEF\xBF\xBD";
        if ((rc = cddp_buf_append(out, rep, strlen(rep))))
            return rc;
        p++;
    }
    return 0;
}

void prom_init(struct prom_writer *w, struct cddp_buf *out)
{
    w->out = out;
    w->err = 0;
    w->family[0] = '\0';
    w->nseen = 0;
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int fail(struct prom_writer *w, int err)
{
    if (w->err == 0)
        w->err = err;
    return w->err;
}

int prom_family(struct prom_writer *w, const char *name, enum prom_type type, const char *help)
{
    static const char *const type_names[] = {"counter", "gauge", "untyped"};
    if (w->err)
        return w->err;
    if (!prom_valid_metric_name(name) || (unsigned)type > PROM_UNTYPED || help == NULL)
        return fail(w, CDDP_EPARSE);
    size_t len = strlen(name);
    if (type == PROM_COUNTER && (len < 6 || strcmp(name + len - 6, "_total") != 0))
        return fail(w, CDDP_EPARSE);
    uint64_t h = fnv1a(name);
    for (size_t i = 0; i < w->nseen; i++)
        if (w->seen[i] == h)
            return fail(w, CDDP_EEXISTS);
    if (w->nseen == PROM_MAX_FAMILIES)
        return fail(w, CDDP_ETOOBIG);
    w->seen[w->nseen++] = h;
    cddp_strlcpy(w->family, name, sizeof(w->family));

    /* Appends rather than printf: pages are rendered on the owner's loop. */
    const char *type_name = type_names[type];
    const char *parts[] = {"# HELP ", name, " ", NULL, "\n# TYPE ", name, " ", type_name, "\n"};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < sizeof(parts) / sizeof(parts[0]); i++)
        rc = parts[i] ? cddp_buf_append(w->out, parts[i], strlen(parts[i]))
                      : append_escaped(w->out, help, false);
    return rc ? fail(w, rc) : 0;
}

int prom_sample(struct prom_writer *w, const struct prom_label *labels, size_t n, double value)
{
    if (w->err)
        return w->err;
    if (w->family[0] == '\0' || (n > 0 && labels == NULL))
        return fail(w, CDDP_EPARSE);
    for (size_t i = 0; i < n; i++) {
        if (!prom_valid_label_name(labels[i].name) || labels[i].value == NULL)
            return fail(w, CDDP_EPARSE);
        for (size_t j = 0; j < i; j++)
            if (strcmp(labels[i].name, labels[j].name) == 0)
                return fail(w, CDDP_EPARSE);
    }
    int rc = cddp_buf_append(w->out, w->family, strlen(w->family));
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = cddp_buf_append(w->out, i == 0 ? "{" : ",", 1);
        if (rc == 0)
            rc = cddp_buf_append(w->out, labels[i].name, strlen(labels[i].name));
        if (rc == 0)
            rc = cddp_buf_append(w->out, "=\"", 2);
        if (rc == 0)
            rc = append_escaped(w->out, labels[i].value, true);
        if (rc == 0)
            rc = cddp_buf_append(w->out, "\"", 1);
    }
    if (rc == 0 && n > 0)
        rc = cddp_buf_append(w->out, "}", 1);
    char num[40];
    size_t len = prom_format_value(value, num, sizeof(num));
    if (rc == 0)
        rc = cddp_buf_append(w->out, " ", 1);
    if (rc == 0)
        rc = cddp_buf_append(w->out, num, len);
    if (rc == 0)
        rc = cddp_buf_append(w->out, "\n", 1);
    return rc ? fail(w, rc) : 0;
}
