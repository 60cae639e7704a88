/* jsonw.c: see jsonw.h. */
#include "common/jsonw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/numfmt.h"
#include "common/utf8.h"

void jsonw_init(struct jsonw *w, struct cddp_buf *out)
{
    memset(w, 0, sizeof(*w));
    w->out = out;
}

static void put(struct jsonw *w, const char *s, size_t n)
{
    if (w->err == 0)
        w->err = cddp_buf_append(w->out, s, n);
}

int cddp_json_put_string(struct cddp_buf *b, const char *s, enum cddp_json_escape how)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    int rc = cddp_buf_append(b, "\"", 1);
    while (rc == 0 && *p) {
        /* Copy the longest run that needs nothing. */
        const unsigned char *run = p;
        size_t n;
        if (how == CDDP_JSON_LOSSY)
            while (*p >= 0x20 && *p != '"' && *p != '\\' && (n = cddp_utf8_len(p)) > 0)
                p += n;
        else
            while (*p >= 0x20 && *p != '"' && *p != '\\')
                p++;
        if (p > run)
            rc = cddp_buf_append(b, run, (size_t)(p - run));
        if (rc || *p == '\0')
            break;
        char esc[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
        n = 2;
        switch (*p) {
        case '"':
        case '\\':
            esc[1] = (char)*p;
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            n = *p < 0x20 ? 6 : 0; /* 0: not UTF-8, and the escaping is lossy */
            break;
        }
        rc = n ? cddp_buf_append(b, esc, n) : cddp_buf_append(b, "\xEF\xBF\xBD", 3);
        p++;
    }
    if (rc == 0)
        rc = cddp_buf_append(b, "\"", 1);
    return rc;
}

static void put_string(struct jsonw *w, const char *s)
{
    if (w->err == 0)
        w->err = cddp_json_put_string(w->out, s, CDDP_JSON_LOSSY);
}

/* The separator and key before a value; false on misuse. */
static bool begin_value(struct jsonw *w, const char *key)
{
    if (w->err)
        return false;
    bool in_object = w->depth > 0 && w->in_object[w->depth - 1];
    if (w->done || (key != NULL) != in_object) {
        w->err = CDDP_EPARSE;
        return false;
    }
    if (w->depth > 0) {
        if (w->has_items[w->depth - 1])
            put(w, ",", 1);
        w->has_items[w->depth - 1] = true;
    }
    if (key) {
        put_string(w, key);
        put(w, ":", 1);
    }
    return w->err == 0;
}

static void end_value(struct jsonw *w)
{
    if (w->depth == 0)
        w->done = true;
}

static void open_container(struct jsonw *w, const char *key, bool object)
{
    if (!begin_value(w, key))
        return;
    if (w->depth == JSONW_MAX_DEPTH) {
        w->err = CDDP_EPARSE;
        return;
    }
    w->in_object[w->depth] = object;
    w->has_items[w->depth] = false;
    w->depth++;
    put(w, object ? "{" : "[", 1);
}

static void close_container(struct jsonw *w, bool object)
{
    if (w->err)
        return;
    if (w->depth == 0 || w->in_object[w->depth - 1] != object) {
        w->err = CDDP_EPARSE;
        return;
    }
    w->depth--;
    put(w, object ? "}" : "]", 1);
    end_value(w);
}

void jsonw_object_begin(struct jsonw *w, const char *key)
{
    open_container(w, key, true);
}

void jsonw_object_end(struct jsonw *w)
{
    close_container(w, true);
}

void jsonw_array_begin(struct jsonw *w, const char *key)
{
    open_container(w, key, false);
}

void jsonw_array_end(struct jsonw *w)
{
    close_container(w, false);
}

static void raw_value(struct jsonw *w, const char *key, const char *text, size_t n)
{
    if (!begin_value(w, key))
        return;
    put(w, text, n);
    end_value(w);
}

void jsonw_string(struct jsonw *w, const char *key, const char *value)
{
    if (value == NULL) {
        raw_value(w, key, "null", 4);
        return;
    }
    if (!begin_value(w, key))
        return;
    put_string(w, value);
    end_value(w);
}

void jsonw_number(struct jsonw *w, const char *key, double value)
{
    if (!isfinite(value)) {
        raw_value(w, key, "null", 4);
        return;
    }
    char buf[40];
    size_t n = cddp_format_double(value, buf, sizeof(buf)); /* finite: valid JSON */
    raw_value(w, key, buf, n);
}

static void printf_number(struct jsonw *w, const char *key, double value, int prec, bool fixed)
{
    if (!isfinite(value)) {
        raw_value(w, key, "null", 4);
        return;
    }
    char buf[352]; /* %.17f of DBL_MAX is 327 characters */
    if (prec < 0 || prec > 17)
        prec = prec < 0 ? 0 : 17;
    int n = fixed ? snprintf(buf, sizeof(buf), "%.*f", prec, value)
                  : snprintf(buf, sizeof(buf), "%.*g", prec, value);
    if (n <= 0 || (size_t)n >= sizeof(buf)) {
        if (w->err == 0)
            w->err = CDDP_ETOOBIG;
        return;
    }
    raw_value(w, key, buf, (size_t)n);
}

void jsonw_number_digits(struct jsonw *w, const char *key, double value, int digits)
{
    printf_number(w, key, value, digits, false);
}

void jsonw_number_fixed(struct jsonw *w, const char *key, double value, int decimals)
{
    printf_number(w, key, value, decimals, true);
}

void jsonw_int(struct jsonw *w, const char *key, int64_t value)
{
    char buf[24];
    size_t n;
    if (value > -9007199254740992LL && value < 9007199254740992LL)
        n = cddp_format_double((double)value, buf, sizeof(buf)); /* no printf */
    else
        n = (size_t)snprintf(buf, sizeof(buf), "%lld", (long long)value);
    raw_value(w, key, buf, n);
}

void jsonw_seconds(struct jsonw *w, const char *key, double value)
{
    if (!isfinite(value)) {
        raw_value(w, key, "null", 4);
        return;
    }
    /* Milliseconds as an integer, then the decimal point by hand: exact and
     * without printf's floating-point path. */
    double ms = round(value * 1000.0);
    if (fabs(ms) >= 9e15) {
        jsonw_number(w, key, value);
        return;
    }
    long long v = (long long)ms;
    unsigned long long a = (unsigned long long)(v < 0 ? -v : v);
    char buf[32];
    size_t n = 0;
    if (v < 0)
        buf[n++] = '-';
    n += cddp_format_double((double)(a / 1000), buf + n, sizeof(buf) - n - 4);
    buf[n++] = '.';
    buf[n++] = (char)('0' + a / 100 % 10);
    buf[n++] = (char)('0' + a / 10 % 10);
    buf[n++] = (char)('0' + a % 10);
    raw_value(w, key, buf, n);
}

void jsonw_bool(struct jsonw *w, const char *key, bool value)
{
    raw_value(w, key, value ? "true" : "false", value ? 4 : 5);
}

void jsonw_null(struct jsonw *w, const char *key)
{
    raw_value(w, key, "null", 4);
}

int jsonw_finish(const struct jsonw *w)
{
    if (w->err)
        return w->err;
    return w->done && w->depth == 0 ? 0 : CDDP_EPARSE;
}
