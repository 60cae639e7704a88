/* safe.c: see safe.h. */
#include "launcher/cddpctl/safe.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/utf8.h"

/* A control character at s (len bytes of a valid sequence): C0, DEL, C1. */
static bool is_control(const unsigned char *s, size_t len)
{
    if (len == 1)
        return s[0] < 0x20 || s[0] == 0x7f;
    return len == 2 && s[0] == 0xc2 && s[1] >= 0x80 && s[1] <= 0x9f;
}

int ctl_safe_text(const char *s, size_t n, bool layout, struct cddp_buf *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t k = cddp_utf8_seq(p + i, n - i);
        bool keep = k > 0 && !is_control(p + i, k);
        if (k == 1 && layout && (p[i] == '\n' || p[i] == '\t'))
            keep = true;
        int rc;
        if (keep) {
            rc = cddp_buf_append(out, p + i, k);
        } else {
            /* The whole sequence of a C1 control, else the one bad byte. */
            size_t m = k ? k : 1;
            rc = 0;
            for (size_t j = 0; j < m && rc == 0; j++)
                rc = cddp_buf_printf(out, "\\x%02x", p[i + j]);
            k = m;
        }
        if (rc)
            return rc;
        i += k;
    }
    return 0;
}

const char *ctl_safe(const char *s, char *buf, size_t len)
{
    if (len == 0)
        return buf;
    struct cddp_buf b;
    cddp_buf_init(&b, len - 1);
    /* Escape up to where it fits: an append that would pass the limit fails
     * and keeps the buffer as it was, so the cut is at a character's end. */
    ctl_safe_text(s, strlen(s), false, &b);
    cddp_strlcpy(buf, b.data ? b.data : "", len);
    cddp_buf_free(&b);
    return buf;
}

void ctl_safe_inplace(char *s, size_t size)
{
    char tmp[4096];
    if (size > sizeof(tmp))
        size = sizeof(tmp);
    ctl_safe(s, tmp, size);
    cddp_strlcpy(s, tmp, size);
}

int ctl_safe_json(const char *s, size_t n, struct cddp_buf *out)
{
    const unsigned char *p = (const unsigned char *)s;
    bool in_string = false;
    size_t i = 0;
    while (i < n) {
        int rc;
        size_t k = 1;
        if (!in_string) {
            /* Between tokens cJSON takes any byte up to 32 for whitespace:
             * ESC there would reach the terminal. A space means the same. */
            in_string = p[i] == '"';
            bool ws = p[i] < 0x20 && p[i] != '\n' && p[i] != '\t';
            rc = cddp_buf_append(out, ws ? " " : (const char *)p + i, 1);
        } else if (p[i] == '\\' && i + 1 < n) {
            k = 2; /* an escape: copied whole, so \" does not end the string */
            rc = cddp_buf_append(out, p + i, 2);
        } else if (p[i] == '"') {
            in_string = false;
            rc = cddp_buf_append(out, p + i, 1);
        } else {
            k = cddp_utf8_seq(p + i, n - i);
            if (k == 0) {
                k = 1;
                rc = cddp_buf_append(out, "\\ufffd", 6);
            } else if (is_control(p + i, k)) {
                unsigned cp = k == 1 ? p[i] : p[i + 1]; /* U+0080..U+009F: C2 80..C2 9F */
                rc = cddp_buf_printf(out, "\\u%04x", cp);
            } else {
                rc = cddp_buf_append(out, p + i, k);
            }
        }
        if (rc)
            return rc;
        i += k;
    }
    return 0;
}

/* s escaped into a new string of cJSON's allocator, or s itself when it
 * needs nothing; NULL when memory ran out. */
static char *escaped_copy(char *s)
{
    bool clean = true;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t n = strlen(s); n > 0 && clean;) {
        size_t k = cddp_utf8_seq(p, n);
        clean = k > 0 && !is_control(p, k);
        p += k;
        n -= k;
    }
    if (clean)
        return s;
    struct cddp_buf b;
    cddp_buf_init(&b, (size_t)-1);
    if (ctl_safe_text(s, strlen(s), false, &b) != 0) {
        cddp_buf_free(&b);
        return NULL;
    }
    char *copy = cJSON_malloc(b.len + 1);
    if (copy)
        memcpy(copy, b.data, b.len + 1);
    cddp_buf_free(&b);
    return copy;
}

int ctl_safe_tree(cJSON *item)
{
    for (; item; item = item->next) {
        if (item->string && !(item->type & cJSON_StringIsConst)) {
            char *k = escaped_copy(item->string);
            if (k == NULL)
                return CDDP_ERR_FROM_ERRNO(ENOMEM);
            if (k != item->string) {
                cJSON_free(item->string);
                item->string = k;
            }
        }
        if (cJSON_IsString(item) && item->valuestring) {
            char *v = escaped_copy(item->valuestring);
            if (v == NULL)
                return CDDP_ERR_FROM_ERRNO(ENOMEM);
            if (v != item->valuestring) {
                cJSON_free(item->valuestring);
                item->valuestring = v;
            }
        }
        int rc = ctl_safe_tree(item->child);
        if (rc)
            return rc;
    }
    return 0;
}
