/* jsonw.c: see jsonw.h. */
#include "common/jsonw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/utf8.h"
#include "status/prom.h"

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

static void put_string(struct jsonw *w, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    put(w, "\"", 1);
    while (*p && w->err == 0) {
        const unsigned char *run = p;
        size_t n;
        while (*p >= 0x20 && *p != '"' && *p != '\\' && (n = cddp_utf8_len(p)) > 0)
            p += n;
        put(w, (const char *)run, (size_t)(p - run));
        if (*p == '\0')
            break;
        char esc[8];
        switch (*p) {
        case '"':
            put(w, "\\\"", 2);
            break;
        case '\\':
            put(w, "\\\\", 2);
            break;
        case '\n':
            put(w, "\\n", 2);
            break;
        case '\r':
            put(w, "\\r", 2);
            break;
        case '\t':
            put(w, "\\t", 2);
            break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof(esc), "\\u%04x", *p);
                put(w, esc, 6);
            } else {
                put(w, "\xEF\xBF\xBD", 3); /* not UTF-8 */
            }
            break;
        }
        p++;
    }
    put(w, "\"", 1);
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
    size_t n = prom_format_value(value, buf, sizeof(buf)); /* finite: valid JSON */
    raw_value(w, key, buf, n);
}

void jsonw_int(struct jsonw *w, const char *key, int64_t value)
{
    char buf[24];
    size_t n;
    if (value > -9007199254740992LL && value < 9007199254740992LL)
        n = prom_format_value((double)value, buf, sizeof(buf)); /* no printf */
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
    n += prom_format_value((double)(a / 1000), buf + n, sizeof(buf) - n - 4);
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
