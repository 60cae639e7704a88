/*
 * hostlist.c: Slurm's compressed host and count lists (see hostlist.h).
 *
 * A list is read one name at a time. scan_name() checks a name (text and
 * bracket groups up to the next top-level comma) and measures it: how many
 * hosts each group holds and how long the longest expansion is. The
 * index-th host of a name is then a mixed-radix number over its groups
 * (the leftmost group is the most significant digit), and write_name()
 * walks the name a second time, copying text and putting each group's
 * chosen number in place. Nothing is allocated; a list of a million hosts
 * costs one pass.
 */
#include "common/hostlist.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/errors.h"

/* Numbers inside brackets and in count lists: at most 9 digits, so every
 * value and every sum of sizes fits comfortably. */
#define NUM_DIGITS_MAX 9

struct name_scan {
    size_t start, end; /* the name is expr[start, end) */
    size_t ngroups;
    size_t group_size[CDDP_HOSTLIST_MAX_GROUPS];
    size_t count; /* hosts this name expands to: the product of group sizes */
};

/* One line: "KIND 'INPUT': WHAT" with INPUT quoted printable and cut at 64
 * bytes, so a hostile value cannot make the message span lines. */
static int list_fail(char *err, size_t errlen, int code, const char *kind, const char *expr,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int list_fail(char *err, size_t errlen, int code, const char *kind, const char *expr,
                     const char *fmt, ...)
{
    char shown[80];
    size_t n = 0;
    for (; expr[n] != '\0' && n < 64; n++)
        shown[n] = expr[n] >= 0x20 && expr[n] < 0x7f ? expr[n] : '?';
    shown[n] = '\0';
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return cddp_fail(err, errlen, code, "%s '%s%s': %s", kind, shown, expr[n] ? "..." : "", what);
}

#define HL_FAIL(code, ...) list_fail(err, errlen, code, "host list", expr, __VA_ARGS__)

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool is_name_char(char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
           c == '.' || c == '_';
}

/* Reads a run of digits at *pos into *value and its length into *digits;
 * 0 digits means there was no number. */
static bool read_number(const char *s, size_t *pos, unsigned long *value, size_t *digits)
{
    size_t i = *pos;
    unsigned long v = 0;
    while (is_digit(s[i]) && i - *pos < NUM_DIGITS_MAX + 1) {
        v = v * 10 + (unsigned long)(s[i] - '0');
        i++;
    }
    *digits = i - *pos;
    *value = v;
    *pos = i;
    return *digits >= 1 && *digits <= NUM_DIGITS_MAX && !is_digit(s[i]);
}

static size_t digits_of(unsigned long v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* Checks one bracket group starting at expr[*pos] == '[' and leaves *pos
 * after its ']'; *size is how many numbers it holds, *width the widest. */
static int scan_group(const char *expr, size_t *pos, size_t *size, size_t *width, char *err,
                      size_t errlen)
{
    size_t open = *pos;
    size_t i = open + 1;
    *size = 0;
    *width = 0;
    for (;;) {
        unsigned long lo, hi;
        size_t lo_digits, hi_digits;
        size_t at = i;
        if (!read_number(expr, &i, &lo, &lo_digits)) {
            if (lo_digits > NUM_DIGITS_MAX)
                return HL_FAIL(CDDP_ERANGE_ARG, "the number at offset %zu has more than %d digits",
                               at, NUM_DIGITS_MAX);
            if (expr[at] == '\0')
                return HL_FAIL(CDDP_EPARSE, "the '[' at offset %zu is never closed", open);
            return HL_FAIL(CDDP_EPARSE, "expected a number at offset %zu inside '[...]'", at);
        }
        hi = lo;
        hi_digits = lo_digits;
        if (expr[i] == '-') {
            i++;
            size_t hat = i;
            if (!read_number(expr, &i, &hi, &hi_digits)) {
                if (hi_digits > NUM_DIGITS_MAX)
                    return HL_FAIL(CDDP_ERANGE_ARG,
                                   "the number at offset %zu has more than %d digits", hat,
                                   NUM_DIGITS_MAX);
                return HL_FAIL(CDDP_EPARSE, "the range at offset %zu has no upper bound", at);
            }
            if (hi < lo)
                return HL_FAIL(CDDP_EPARSE, "the range %lu-%lu at offset %zu goes down", lo, hi,
                               at);
        }
        /* The width is the low bound's digits: [08-10] is 08 09 10, [8-10] is 8 9 10. */
        size_t w = lo_digits > digits_of(hi) ? lo_digits : digits_of(hi);
        if (w > *width)
            *width = w;
        *size += (size_t)(hi - lo) + 1;
        if (*size > CDDP_HOSTLIST_MAX_HOSTS)
            return HL_FAIL(CDDP_ETOOBIG, "more than %d hosts", CDDP_HOSTLIST_MAX_HOSTS);
        char c = expr[i];
        if (c == ',') {
            i++;
            continue;
        }
        if (c == ']') {
            *pos = i + 1;
            return 0;
        }
        if (c == '\0')
            return HL_FAIL(CDDP_EPARSE, "the '[' at offset %zu is never closed", open);
        if (c == '[')
            return HL_FAIL(CDDP_EPARSE, "'[' at offset %zu inside another '[...]'", i);
        return HL_FAIL(CDDP_EPARSE, "unexpected '%c' at offset %zu inside '[...]'",
                       c >= 0x20 && c < 0x7f ? c : '?', i);
    }
}

/* Checks the name at expr[pos] (up to the next top-level comma or the end)
 * into *ns. */
static int scan_name(const char *expr, size_t pos, struct name_scan *ns, char *err, size_t errlen)
{
    size_t i = pos;
    size_t len = 0;
    ns->start = pos;
    ns->end = pos;
    ns->ngroups = 0;
    ns->count = 1;
    if (expr[i] == ',' || expr[i] == '\0')
        return HL_FAIL(CDDP_EPARSE, "empty name at offset %zu", i);
    while (expr[i] != '\0' && expr[i] != ',') {
        char c = expr[i];
        if (c == '[') {
            if (ns->ngroups == CDDP_HOSTLIST_MAX_GROUPS)
                return HL_FAIL(CDDP_ETOOBIG,
                               "more than %d '[...]' groups in the name at offset %zu",
                               CDDP_HOSTLIST_MAX_GROUPS, pos);
            size_t size, width;
            int rc = scan_group(expr, &i, &size, &width, err, errlen);
            if (rc)
                return rc;
            if (ns->count > CDDP_HOSTLIST_MAX_HOSTS / size)
                return HL_FAIL(CDDP_ETOOBIG, "more than %d hosts", CDDP_HOSTLIST_MAX_HOSTS);
            ns->group_size[ns->ngroups++] = size;
            ns->count *= size;
            len += width;
        } else if (c == ']') {
            return HL_FAIL(CDDP_EPARSE, "the ']' at offset %zu closes no '['", i);
        } else if (is_name_char(c)) {
            len++;
            i++;
        } else if (c >= 0x20 && c < 0x7f) {
            return HL_FAIL(CDDP_EPARSE, "'%c' at offset %zu is not allowed in a host name", c, i);
        } else {
            return HL_FAIL(CDDP_EPARSE, "byte 0x%02x at offset %zu is not allowed in a host name",
                           (unsigned)(unsigned char)c, i);
        }
        if (len > CDDP_HOSTLIST_NAME_MAX)
            return HL_FAIL(CDDP_ETOOBIG, "the name at offset %zu is longer than %d bytes", pos,
                           CDDP_HOSTLIST_NAME_MAX);
    }
    ns->end = i;
    return 0;
}

/* The n-th number (0-based, n < the group's size) of the checked group at
 * expr[*pos] == '['; leaves *pos after its ']'. */
static void pick_in_group(const char *expr, size_t *pos, size_t n, unsigned long *value,
                          size_t *width)
{
    size_t i = *pos + 1;
    bool found = false;
    for (;;) {
        unsigned long lo, hi;
        size_t lo_digits, hi_digits;
        read_number(expr, &i, &lo, &lo_digits);
        hi = lo;
        if (expr[i] == '-') {
            i++;
            read_number(expr, &i, &hi, &hi_digits);
        }
        size_t size = (size_t)(hi - lo) + 1;
        if (!found && n < size) {
            *value = lo + n;
            *width = lo_digits;
            found = true;
        } else if (!found) {
            n -= size;
        }
        if (expr[i++] == ']')
            break;
    }
    *pos = i;
}

/* Writes host `index` (< ns->count) of the checked name ns into out. */
static int write_name(const char *expr, const struct name_scan *ns, size_t index, char *out,
                      size_t outlen, char *err, size_t errlen)
{
    size_t digit[CDDP_HOSTLIST_MAX_GROUPS];
    for (size_t g = ns->ngroups; g-- > 0;) {
        digit[g] = index % ns->group_size[g];
        index /= ns->group_size[g];
    }
    size_t o = 0, g = 0;
    for (size_t i = ns->start; i < ns->end;) {
        char piece[CDDP_HOSTLIST_NAME_MAX + 1];
        size_t n;
        if (expr[i] == '[') {
            unsigned long v = 0;
            size_t w = 0;
            pick_in_group(expr, &i, digit[g++], &v, &w);
            int k = snprintf(piece, sizeof(piece), "%0*lu", (int)w, v);
            n = k > 0 ? (size_t)k : 0;
        } else {
            piece[0] = expr[i++];
            n = 1;
        }
        if (o + n >= outlen)
            return HL_FAIL(CDDP_ETOOBIG, "a name does not fit in %zu bytes", outlen);
        memcpy(out + o, piece, n);
        o += n;
    }
    out[o] = '\0';
    return 0;
}

/* Checks every name of expr, counting hosts into *count; with out, writes
 * host `index` there. */
static int walk(const char *expr, size_t index, char *out, size_t outlen, size_t *count, char *err,
                size_t errlen)
{
    if (strnlen(expr, CDDP_HOSTLIST_EXPR_MAX + 1) > CDDP_HOSTLIST_EXPR_MAX)
        return HL_FAIL(CDDP_ETOOBIG, "longer than %u bytes", CDDP_HOSTLIST_EXPR_MAX);
    if (expr[0] == '\0')
        return cddp_fail(err, errlen, CDDP_EPARSE, "host list '': empty");
    size_t total = 0;
    bool written = out == NULL;
    for (size_t pos = 0;;) {
        struct name_scan ns;
        int rc = scan_name(expr, pos, &ns, err, errlen);
        if (rc)
            return rc;
        if (ns.count > CDDP_HOSTLIST_MAX_HOSTS - total)
            return HL_FAIL(CDDP_ETOOBIG, "more than %d hosts", CDDP_HOSTLIST_MAX_HOSTS);
        if (!written && index < total + ns.count) {
            if ((rc = write_name(expr, &ns, index - total, out, outlen, err, errlen)) != 0)
                return rc;
            written = true;
        }
        total += ns.count;
        if (expr[ns.end] == '\0')
            break;
        pos = ns.end + 1;
    }
    *count = total;
    if (!written)
        return HL_FAIL(CDDP_ERANGE_ARG, "has %zu hosts, no host %zu", total, index);
    return 0;
}

int cddp_hostlist_count(const char *expr, size_t *count, char *err, size_t errlen)
{
    return walk(expr, 0, NULL, 0, count, err, errlen);
}

int cddp_hostlist_nth(const char *expr, size_t index, char *out, size_t outlen, char *err,
                      size_t errlen)
{
    size_t count;
    if (outlen == 0)
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "host list: no room for a name");
    out[0] = '\0';
    return walk(expr, index, out, outlen, &count, err, errlen);
}

#undef HL_FAIL
#define CL_FAIL(code, ...) list_fail(err, errlen, code, "count list", list, __VA_ARGS__)

int cddp_slurm_counts_nth(const char *list, size_t index, long *value, char *err, size_t errlen)
{
    if (strnlen(list, CDDP_HOSTLIST_EXPR_MAX + 1) > CDDP_HOSTLIST_EXPR_MAX)
        return CL_FAIL(CDDP_ETOOBIG, "longer than %u bytes", CDDP_HOSTLIST_EXPR_MAX);
    if (list[0] == '\0')
        return cddp_fail(err, errlen, CDDP_EPARSE, "count list '': empty");
    size_t total = 0;
    bool found = false;
    for (size_t i = 0;;) {
        unsigned long v, times = 1;
        size_t digits, at = i;
        if (!read_number(list, &i, &v, &digits)) {
            if (digits > NUM_DIGITS_MAX)
                return CL_FAIL(CDDP_ERANGE_ARG, "the number at offset %zu has more than %d digits",
                               at, NUM_DIGITS_MAX);
            return CL_FAIL(CDDP_EPARSE, "expected a number at offset %zu", at);
        }
        if (list[i] == '(') {
            size_t mat = i;
            if (list[i + 1] != 'x')
                return CL_FAIL(CDDP_EPARSE, "expected '(xN)' at offset %zu", mat);
            i += 2;
            if (!read_number(list, &i, &times, &digits) || times == 0 || list[i] != ')')
                return CL_FAIL(CDDP_EPARSE, "expected '(xN)' with N >= 1 at offset %zu", mat);
            i++;
        }
        if (times > CDDP_HOSTLIST_MAX_HOSTS - total)
            return CL_FAIL(CDDP_ETOOBIG, "more than %d entries", CDDP_HOSTLIST_MAX_HOSTS);
        if (!found && index < total + times) {
            *value = (long)v;
            found = true;
        }
        total += times;
        if (list[i] == '\0')
            break;
        if (list[i] != ',')
            return CL_FAIL(CDDP_EPARSE, "unexpected '%c' at offset %zu",
                           list[i] >= 0x20 && list[i] < 0x7f ? list[i] : '?', i);
        i++;
    }
    if (!found)
        return CL_FAIL(CDDP_ERANGE_ARG, "has %zu entries, no entry %zu", total, index);
    return 0;
}
