/*
 * safetensors.c: the safetensors reader and writer; see safetensors.h.
 *
 * The header decoder is a small strict JSON parser written for this one
 * grammar rather than a general JSON library: it reads offsets as exact
 * 64-bit integers (not doubles), sees duplicate keys (a tree builder keeps or
 * drops them silently), checks UTF-8, and never allocates per value: every
 * decoded string goes into one arena the size of the header, which is enough
 * because a decoded string (plus its NUL) is never longer than its quoted
 * source. libFuzzer runs it (tests/fuzz/fuzz_safetensors.c).
 */
#include "trainer/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/array.h"
#include "common/errors.h"
#include "common/file.h"
#include "common/jsonw.h"
#include "common/strutil.h"
#include "common/utf8.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this code copies it as is"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
#define XX(name, size) {#name, size},
    TRN_ST_DTYPES(XX)
#undef XX
};

const char *trn_st_dtype_name(enum trn_st_dtype d)
{
    return (unsigned)d < TRN_ST_NUM_DTYPES ? dtypes[d].name : "?";
}

size_t trn_st_dtype_size(enum trn_st_dtype d)
{
    return (unsigned)d < TRN_ST_NUM_DTYPES ? dtypes[d].size : 0;
}

/* A name fit for a one-line message: control bytes become '?', long names are cut. */
static const char *printable(const char *s, char *out, size_t outlen)
{
    size_t n = 0, max = outlen - 4;
    for (; *s != '\0' && n < max; s++)
        out[n++] = ((unsigned char)*s < 0x20 || *s == 0x7f) ? '?' : *s;
    if (*s != '\0')
        memcpy(out + n, "...", 3), n += 3;
    out[n] = '\0';
    return out;
}

#define NAMEBUF 128
#define PNAME(s, buf) printable((s), (buf), sizeof(buf))

/* ---------------------------------------------------------------- decoder */

struct parser {
    const uint8_t *start, *p, *end;
    char *arena; /* decoded strings */
    size_t arena_used, arena_cap;
    char *err;
    size_t errlen;
};

static int perr(struct parser *ps, const char *what)
{
    return cddp_fail(ps->err, ps->errlen, CDDP_ECORRUPT, "header: %s at byte %zu of the JSON", what,
                     (size_t)(ps->p - ps->start));
}

static void skip_ws(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int expect(struct parser *ps, char c, const char *what)
{
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != (uint8_t)c)
        return perr(ps, what);
    ps->p++;
    return 0;
}

static int hex4(struct parser *ps, uint32_t *out)
{
    uint32_t v = 0;
    if (ps->end - ps->p < 4)
        return perr(ps, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        uint8_t c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return perr(ps, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static size_t utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A JSON string, decoded into the arena; *out points at it (NUL-terminated). */
static int parse_string(struct parser *ps, const char **out)
{
    int rc = expect(ps, '"', "expected a string");
    if (rc)
        return rc;
    char *dst = ps->arena + ps->arena_used;
    size_t n = 0;
    for (;;) {
        if (ps->p >= ps->end)
            return perr(ps, "unterminated string");
        uint8_t c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20)
            return perr(ps, "control character in string");
        if (c == '\\') {
            ps->p++;
            if (ps->p >= ps->end)
                return perr(ps, "unterminated string");
            uint8_t e = *ps->p++;
            uint32_t cp;
            switch (e) {
            case '"':
                cp = '"';
                break;
            case '\\':
                cp = '\\';
                break;
            case '/':
                cp = '/';
                break;
            case 'b':
                cp = '\b';
                break;
            case 'f':
                cp = '\f';
                break;
            case 'n':
                cp = '\n';
                break;
            case 'r':
                cp = '\r';
                break;
            case 't':
                cp = '\t';
                break;
            case 'u':
                if ((rc = hex4(ps, &cp)))
                    return rc;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return perr(ps, "lone low surrogate in \\u escape");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
                        return perr(ps, "high surrogate without its low half");
                    ps->p += 2;
                    if ((rc = hex4(ps, &lo)))
                        return rc;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return perr(ps, "high surrogate without its low half");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                if (cp == 0)
                    return perr(ps, "NUL character in string");
                break;
            default:
                ps->p--;
                return perr(ps, "bad escape in string");
            }
            n += utf8_put(dst + n, cp);
            continue;
        }
        size_t k = cddp_utf8_seq(ps->p, (size_t)(ps->end - ps->p));
        if (k == 0)
            return perr(ps, "invalid UTF-8 in string");
        memcpy(dst + n, ps->p, k);
        n += k;
        ps->p += k;
    }
    dst[n] = '\0';
    ps->arena_used += n + 1; /* fits: the source held n bytes plus two quotes */
    *out = dst;
    return 0;
}

/* A non-negative JSON integer that fits in 64 bits (no sign, fraction or exponent). */
static int parse_u64(struct parser *ps, uint64_t *out)
{
    skip_ws(ps);
    if (ps->p >= ps->end)
        return perr(ps, "expected an integer");
    if (*ps->p == '-')
        return perr(ps, "negative number");
    if (*ps->p < '0' || *ps->p > '9')
        return perr(ps, "expected an integer");
    uint64_t v = 0;
    if (*ps->p == '0') {
        ps->p++;
    } else {
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
            unsigned d = (unsigned)(*ps->p - '0');
            if (v > (UINT64_MAX - d) / 10)
                return perr(ps, "integer does not fit in 64 bits");
            v = v * 10 + d;
            ps->p++;
        }
    }
    if (ps->p < ps->end &&
        (*ps->p == '.' || *ps->p == 'e' || *ps->p == 'E' || (*ps->p >= '0' && *ps->p <= '9')))
        return perr(ps, "expected an integer (no fraction, exponent or leading zero)");
    *out = v;
    return 0;
}

/* '[' u64 (',' u64)* ']' or '[' ']'; at most max values. */
static int parse_u64_array(struct parser *ps, uint64_t *vals, int max, int *n, const char *what)
{
    int rc = expect(ps, '[', "expected '['");
    if (rc)
        return rc;
    *n = 0;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        return 0;
    }
    for (;;) {
        uint64_t v = 0;
        if ((rc = parse_u64(ps, &v)))
            return rc;
        if (*n >= max)
            return perr(ps, what);
        vals[(*n)++] = v;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        return expect(ps, ']', "expected ',' or ']'");
    }
}

static bool literal(struct parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, word, n) == 0) {
        ps->p += n;
        return true;
    }
    return false;
}

static int tensor_entry(struct parser *ps, struct trn_st_tensor *t)
{
    char nb[NAMEBUF];
    bool have_dtype = false, have_shape = false, have_offsets = false;
    uint64_t offs[2];
    int rc = expect(ps, '{', "expected '{' to open a tensor entry");
    if (rc)
        return rc;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}')
        return perr(ps, "empty tensor entry");
    for (;;) {
        size_t mark = ps->arena_used; /* field names and dtype are not kept */
        const char *field, *dt;
        if ((rc = parse_string(ps, &field)) || (rc = expect(ps, ':', "expected ':'")))
            return rc;
        if (strcmp(field, "dtype") == 0) {
            if (have_dtype)
                return perr(ps, "duplicate \"dtype\"");
            if ((rc = parse_string(ps, &dt)))
                return rc;
            int d = -1;
            for (int i = 0; i < TRN_ST_NUM_DTYPES; i++)
                if (strcmp(dt, dtypes[i].name) == 0)
                    d = i;
            if (d < 0)
                return cddp_fail(ps->err, ps->errlen, CDDP_ECORRUPT,
                                 "header: tensor '%s': unknown dtype '%.32s'", PNAME(t->name, nb),
                                 dt);
            t->dtype = (enum trn_st_dtype)d;
            have_dtype = true;
        } else if (strcmp(field, "shape") == 0) {
            if (have_shape)
                return perr(ps, "duplicate \"shape\"");
            if ((rc = parse_u64_array(ps, t->shape, TRN_ST_MAX_DIMS, &t->ndim,
                                      "too many dimensions (this reader handles 8)")))
                return rc;
            have_shape = true;
        } else if (strcmp(field, "data_offsets") == 0) {
            int n;
            if (have_offsets)
                return perr(ps, "duplicate \"data_offsets\"");
            if ((rc = parse_u64_array(ps, offs, 2, &n, "data_offsets must hold two integers")))
                return rc;
            if (n != 2)
                return perr(ps, "data_offsets must hold two integers");
            have_offsets = true;
        } else {
            return cddp_fail(ps->err, ps->errlen, CDDP_ECORRUPT,
                             "header: tensor '%s': unknown field '%.32s'", PNAME(t->name, nb),
                             field);
        }
        ps->arena_used = mark;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if ((rc = expect(ps, '}', "expected ',' or '}' in a tensor entry")))
            return rc;
        break;
    }
    if (!have_dtype || !have_shape || !have_offsets)
        return cddp_fail(ps->err, ps->errlen, CDDP_ECORRUPT, "header: tensor '%s': missing \"%s\"",
                         PNAME(t->name, nb),
                         !have_dtype   ? "dtype"
                         : !have_shape ? "shape"
                                       : "data_offsets");
    t->offset = offs[0];
    if (offs[1] < offs[0])
        return cddp_fail(ps->err, ps->errlen, CDDP_ECORRUPT,
                         "header: tensor '%s': data_offsets [%llu, %llu] end before they begin",
                         PNAME(t->name, nb), (unsigned long long)offs[0],
                         (unsigned long long)offs[1]);
    t->nbytes = offs[1] - offs[0];
    return 0;
}

/* Entries per header are bounded by its bytes: each takes more than one. */
static size_t max_entries(const struct parser *ps)
{
    return (size_t)(ps->end - ps->start);
}

static int meta_object(struct parser *ps, struct trn_st_file *f, size_t *cap)
{
    int rc = expect(ps, '{', "__metadata__ must be an object of strings");
    if (rc)
        return rc;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return 0;
    }
    for (;;) {
        const char *k, *v;
        if ((rc = parse_string(ps, &k)) || (rc = expect(ps, ':', "expected ':'")))
            return rc;
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != '"')
            return perr(ps, "__metadata__ values must be strings");
        if ((rc = parse_string(ps, &v)))
            return rc;
        if ((rc = cddp_array_reserve((void **)&f->meta, cap, f->n_meta + 1, sizeof(*f->meta),
                                     max_entries(ps))))
            return rc;
        f->meta[f->n_meta].key = k;
        f->meta[f->n_meta].value = v;
        f->n_meta++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        return expect(ps, '}', "expected ',' or '}' in __metadata__");
    }
}

static int parse_header(struct parser *ps, struct trn_st_file *f)
{
    size_t tcap = 0, mcap = 0;
    bool have_meta = false;
    int rc;
    if (ps->p >= ps->end || *ps->p != '{')
        return cddp_fail(ps->err, ps->errlen, CDDP_ECORRUPT, "header does not start with '{'");
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
    } else {
        for (;;) {
            const char *key;
            if ((rc = parse_string(ps, &key)) || (rc = expect(ps, ':', "expected ':'")))
                return rc;
            if (strcmp(key, "__metadata__") == 0) {
                if (have_meta)
                    return perr(ps, "duplicate __metadata__");
                have_meta = true;
                skip_ws(ps);
                if (!literal(ps, "null") && (rc = meta_object(ps, f, &mcap)))
                    return rc;
            } else {
                if (key[0] == '\0')
                    return perr(ps, "empty tensor name");
                if ((rc = cddp_array_reserve((void **)&f->tensors, &tcap, f->n_tensors + 1,
                                             sizeof(*f->tensors), max_entries(ps))))
                    return rc;
                struct trn_st_tensor *t = &f->tensors[f->n_tensors++];
                memset(t, 0, sizeof(*t));
                t->name = key;
                if ((rc = tensor_entry(ps, t)))
                    return rc;
            }
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if ((rc = expect(ps, '}', "expected ',' or '}'")))
                return rc;
            break;
        }
    }
    skip_ws(ps);
    if (ps->p != ps->end)
        return perr(ps, "unexpected bytes after the JSON object");
    return 0;
}

/* qsort_r comparators over index arrays (arg: the array indexed). */
static int by_name_cmp(const void *a, const void *b, void *arg)
{
    const struct trn_st_tensor *t = arg;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int by_offset_cmp(const void *a, const void *b, void *arg)
{
    const struct trn_st_tensor *x = &((const struct trn_st_tensor *)arg)[*(const size_t *)a];
    const struct trn_st_tensor *y = &((const struct trn_st_tensor *)arg)[*(const size_t *)b];
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

static int meta_key_cmp(const void *a, const void *b, void *arg)
{
    const struct trn_st_meta *m = arg;
    return strcmp(m[*(const size_t *)a].key, m[*(const size_t *)b].key);
}

/* numel and nbytes of a shape, or false on overflow. */
static bool shape_size(enum trn_st_dtype d, int ndim, const uint64_t *shape, uint64_t *numel,
                       uint64_t *nbytes)
{
    uint64_t n = 1;
    bool zero = false;
    for (int i = 0; i < ndim; i++)
        zero |= shape[i] == 0;
    for (int i = 0; i < ndim && !zero; i++) {
        if (n > UINT64_MAX / shape[i])
            return false;
        n *= shape[i];
    }
    if (zero)
        n = 0;
    uint64_t sz = trn_st_dtype_size(d);
    if (n > UINT64_MAX / sz)
        return false;
    *numel = n;
    *nbytes = n * sz;
    return true;
}

static void fmt_shape(const struct trn_st_tensor *t, char *out, size_t len)
{
    size_t n = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%llu", i ? "," : "",
                              (unsigned long long)t->shape[i]);
    if (n < len)
        snprintf(out + n, len - n, "]");
}

static int validate(struct trn_st_file *f, char *err, size_t errlen)
{
    char nb[NAMEBUF], nb2[NAMEBUF], sh[160];
    size_t n = f->n_tensors;
    for (size_t i = 0; i < n; i++) {
        struct trn_st_tensor *t = &f->tensors[i];
        uint64_t numel, need;
        fmt_shape(t, sh, sizeof(sh));
        if (!shape_size(t->dtype, t->ndim, t->shape, &numel, &need))
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor '%s': shape %s overflows",
                             PNAME(t->name, nb), sh);
        if (need != t->nbytes)
            return cddp_fail(err, errlen, CDDP_ECORRUPT,
                             "tensor '%s': %s %s needs %llu bytes but data_offsets [%llu, %llu] "
                             "hold %llu",
                             PNAME(t->name, nb), trn_st_dtype_name(t->dtype), sh,
                             (unsigned long long)need, (unsigned long long)t->offset,
                             (unsigned long long)(t->offset + t->nbytes),
                             (unsigned long long)t->nbytes);
        if (t->offset > f->data_len || t->nbytes > f->data_len - t->offset)
            return cddp_fail(err, errlen, CDDP_EIO_SHORT,
                             "tensor '%s': data_offsets [%llu, %llu] run past the end of the data "
                             "(%llu bytes; file truncated?)",
                             PNAME(t->name, nb), (unsigned long long)t->offset,
                             (unsigned long long)(t->offset + t->nbytes),
                             (unsigned long long)f->data_len);
        t->numel = numel;
    }

    f->by_name = malloc((n ? n : 1) * sizeof(size_t));
    size_t *order = malloc((n ? n : 1) * sizeof(size_t));
    size_t *mk = malloc((f->n_meta ? f->n_meta : 1) * sizeof(size_t));
    int rc = 0;
    if (f->by_name == NULL || order == NULL || mk == NULL) {
        rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        f->by_name[i] = order[i] = i;
    qsort_r(f->by_name, n, sizeof(size_t), by_name_cmp, f->tensors);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(f->tensors[f->by_name[i - 1]].name, f->tensors[f->by_name[i]].name) == 0) {
            rc = cddp_fail(err, errlen, CDDP_ECORRUPT, "duplicate tensor name '%s'",
                           PNAME(f->tensors[f->by_name[i]].name, nb));
            goto out;
        }
    }
    qsort_r(order, n, sizeof(size_t), by_offset_cmp, f->tensors);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const struct trn_st_tensor *t = &f->tensors[order[i]];
        if (t->offset < pos) {
            rc = cddp_fail(err, errlen, CDDP_ECORRUPT,
                           "tensors '%s' and '%s' overlap at offset %llu",
                           PNAME(f->tensors[order[i - 1]].name, nb2), PNAME(t->name, nb),
                           (unsigned long long)t->offset);
            goto out;
        }
        if (t->offset > pos) {
            rc = cddp_fail(err, errlen, CDDP_ECORRUPT,
                           "hole of %llu bytes in the data before tensor '%s' (offset %llu)",
                           (unsigned long long)(t->offset - pos), PNAME(t->name, nb),
                           (unsigned long long)t->offset);
            goto out;
        }
        pos = t->offset + t->nbytes;
    }
    if (pos != f->data_len) {
        rc = cddp_fail(err, errlen, CDDP_ECORRUPT,
                       "the tensors cover %llu bytes of data but the file holds %llu after the "
                       "header",
                       (unsigned long long)pos, (unsigned long long)f->data_len);
        goto out;
    }
    for (size_t i = 0; i < f->n_meta; i++)
        mk[i] = i;
    qsort_r(mk, f->n_meta, sizeof(size_t), meta_key_cmp, f->meta);
    for (size_t i = 1; i < f->n_meta; i++) {
        if (strcmp(f->meta[mk[i - 1]].key, f->meta[mk[i]].key) == 0) {
            rc = cddp_fail(err, errlen, CDDP_ECORRUPT, "duplicate __metadata__ key '%s'",
                           PNAME(f->meta[mk[i]].key, nb));
            goto out;
        }
    }
out:
    free(order);
    free(mk);
    return rc;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Checks the 8-byte prefix against the file size; *hlen gets N. */
static int check_prefix(const uint8_t *p, uint64_t file_size, uint64_t *hlen, char *err,
                        size_t errlen)
{
    if (file_size < 8)
        return cddp_fail(err, errlen, CDDP_EIO_SHORT,
                         "file is %llu bytes, too short for the 8-byte header length",
                         (unsigned long long)file_size);
    uint64_t n = le64(p);
    if (n > TRN_ST_MAX_HEADER)
        return cddp_fail(err, errlen, CDDP_ETOOBIG,
                         "header length %llu is over the 100 MB limit (not a safetensors file?)",
                         (unsigned long long)n);
    if (n > file_size - 8)
        return cddp_fail(err, errlen, CDDP_EIO_SHORT,
                         "header length %llu runs past the end of the %llu-byte file (truncated?)",
                         (unsigned long long)n, (unsigned long long)file_size);
    *hlen = n;
    return 0;
}

int trn_st_decode(const void *buf, size_t len, uint64_t file_size, struct trn_st_file *f, char *err,
                  size_t errlen)
{
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    const uint8_t *b = buf;
    uint64_t hlen;
    if (len < 8 && file_size >= 8)
        return cddp_fail(err, errlen, CDDP_EIO_SHORT, "buffer holds %zu of the 8 header bytes",
                         len);
    int rc = check_prefix(b, file_size, &hlen, err, errlen);
    if (rc)
        return rc;
    if (len - 8 < hlen)
        return cddp_fail(err, errlen, CDDP_EIO_SHORT, "buffer holds %zu of the %llu header bytes",
                         len - 8, (unsigned long long)hlen);
    f->file_size = file_size;
    f->data_start = 8 + hlen;
    f->data_len = file_size - f->data_start;
    f->strings = malloc((size_t)hlen + 1);
    if (f->strings == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    struct parser ps = {
        .start = b + 8,
        .p = b + 8,
        .end = b + 8 + hlen,
        .arena = f->strings,
        .arena_cap = (size_t)hlen + 1,
        .err = err,
        .errlen = errlen,
    };
    rc = parse_header(&ps, f);
    if (rc == 0)
        rc = validate(f, err, errlen);
    if (rc) {
        trn_st_close(f);
        return rc;
    }
    return 0;
}

static int pread_all(int fd, void *dst, size_t n, uint64_t off)
{
    uint8_t *p = dst;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return CDDP_ERR_FROM_ERRNO(errno);
        }
        if (r == 0)
            return CDDP_EIO_SHORT;
        p += r, n -= (size_t)r, off += (uint64_t)r;
    }
    return 0;
}

int trn_st_open(const char *path, struct trn_st_file *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    char msg[512];
    uint8_t prefix[8];
    uint64_t hlen;
    uint8_t *hdr = NULL;
    int rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(errno), "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(errno), "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = cddp_fail(err, errlen, CDDP_ECORRUPT, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size >= 8 && (rc = pread_all(fd, prefix, 8, 0)) != 0) {
        rc = cddp_fail(err, errlen, rc, "%s: %s", path, cddp_strerror(rc));
        goto fail;
    }
    if ((rc = check_prefix(prefix, size, &hlen, msg, sizeof(msg))) != 0) {
        rc = cddp_fail(err, errlen, rc, "%s: %s", path, msg);
        goto fail;
    }
    hdr = malloc(8 + (size_t)hlen);
    if (hdr == NULL) {
        rc = cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
        goto fail;
    }
    if ((rc = pread_all(fd, hdr, 8 + (size_t)hlen, 0)) != 0) {
        rc = cddp_fail(err, errlen, rc, "%s: reading the header: %s", path, cddp_strerror(rc));
        goto fail;
    }
    if ((rc = trn_st_decode(hdr, 8 + (size_t)hlen, size, f, msg, sizeof(msg))) != 0) {
        rc = cddp_fail(err, errlen, rc, "%s: %s", path, msg);
        goto fail;
    }
    free(hdr);
    f->path = strdup(path);
    if (f->path == NULL) {
        trn_st_close(f);
        close(fd);
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(ENOMEM), "%s: out of memory", path);
    }
    f->fd = fd;
    return 0;
fail:
    free(hdr);
    close(fd);
    return rc;
}

int trn_st_read(const struct trn_st_file *f, const struct trn_st_tensor *t, void *dst, char *err,
                size_t errlen)
{
    char nb[NAMEBUF];
    const char *path = f->path ? f->path : "safetensors";
    if (f->fd < 0)
        return cddp_fail(err, errlen, CDDP_ESTATE, "%s: no open file to read from", path);
    int rc = pread_all(f->fd, dst, (size_t)t->nbytes, f->data_start + t->offset);
    if (rc == CDDP_EIO_SHORT)
        return cddp_fail(err, errlen, rc,
                         "%s: file ends inside tensor '%s' (it shrank after it was "
                         "opened)",
                         path, PNAME(t->name, nb));
    if (rc)
        return cddp_fail(err, errlen, rc, "%s: reading tensor '%s': %s", path, PNAME(t->name, nb),
                         cddp_strerror(rc));
    return 0;
}

int trn_st_data_crc32(const struct trn_st_file *f, uint32_t *crc, char *err, size_t errlen)
{
    const char *path = f->path ? f->path : "safetensors";
    if (f->fd < 0)
        return cddp_fail(err, errlen, CDDP_ESTATE, "%s: no open file to read from", path);
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (buf == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    uLong c = crc32_z(0L, Z_NULL, 0);
    uint64_t left = f->data_len, off = f->data_start;
    int rc = 0;
    while (left > 0) {
        size_t n = left > CHUNK ? CHUNK : (size_t)left;
        if ((rc = pread_all(f->fd, buf, n, off)) != 0) {
            rc = cddp_fail(err, errlen, rc, "%s: reading the data: %s", path, cddp_strerror(rc));
            break;
        }
        c = crc32_z(c, buf, n);
        left -= n, off += n;
    }
    free(buf);
    *crc = (uint32_t)c;
    return rc;
}

const struct trn_st_tensor *trn_st_find(const struct trn_st_file *f, const char *name)
{
    size_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct trn_st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const char *trn_st_meta_get(const struct trn_st_file *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0)
            return f->meta[i].value;
    return NULL;
}

void trn_st_close(struct trn_st_file *f)
{
    if (f->fd >= 0)
        close(f->fd);
    free(f->tensors);
    free(f->meta);
    free(f->by_name);
    free(f->strings);
    free(f->path);
    memset(f, 0, sizeof(*f));
    f->fd = -1;
}

/* ---------------------------------------------------------------- writer */

/* Names and metadata are checked as UTF-8 first (check_names), so they
 * are written as they are. */
static int json_string(struct cddp_buf *b, const char *s)
{
    return cddp_json_put_string(b, s, CDDP_JSON_STRICT);
}

static int check_names(const struct trn_st_tensor *t, size_t n, const struct trn_st_meta *meta,
                       size_t n_meta, char *err, size_t errlen)
{
    char nb[NAMEBUF];
    for (size_t i = 0; i < n; i++) {
        uint64_t numel, nbytes;
        if (t[i].name == NULL || t[i].name[0] == '\0')
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor %zu has no name", i);
        if (!cddp_utf8_valid(t[i].name))
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor %zu: name is not valid UTF-8", i);
        if (strcmp(t[i].name, "__metadata__") == 0)
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor %zu: '__metadata__' is reserved",
                             i);
        if ((unsigned)t[i].dtype >= TRN_ST_NUM_DTYPES)
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor '%s': bad dtype %d",
                             PNAME(t[i].name, nb), (int)t[i].dtype);
        if (t[i].ndim < 0 || t[i].ndim > TRN_ST_MAX_DIMS)
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor '%s': %d dimensions",
                             PNAME(t[i].name, nb), t[i].ndim);
        if (!shape_size(t[i].dtype, t[i].ndim, t[i].shape, &numel, &nbytes))
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor '%s': shape overflows",
                             PNAME(t[i].name, nb));
        if (nbytes > 0 && t[i].data == NULL)
            return cddp_fail(err, errlen, CDDP_ECORRUPT, "tensor '%s': no data",
                             PNAME(t[i].name, nb));
    }
    for (size_t i = 0; i < n_meta; i++) {
        if (meta[i].key == NULL || meta[i].value == NULL || !cddp_utf8_valid(meta[i].key) ||
            !cddp_utf8_valid(meta[i].value))
            return cddp_fail(err, errlen, CDDP_ECORRUPT,
                             "metadata entry %zu: missing or not valid UTF-8", i);
        for (size_t j = 0; j < i; j++)
            if (strcmp(meta[i].key, meta[j].key) == 0)
                return cddp_fail(err, errlen, CDDP_ECORRUPT, "duplicate metadata key '%s'",
                                 PNAME(meta[i].key, nb));
    }
    size_t *idx = malloc((n ? n : 1) * sizeof(size_t));
    if (idx == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    qsort_r(idx, n, sizeof(size_t), by_name_cmp, (void *)t);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (strcmp(t[idx[i - 1]].name, t[idx[i]].name) == 0)
            rc = cddp_fail(err, errlen, CDDP_ECORRUPT, "duplicate tensor name '%s'",
                           PNAME(t[idx[i]].name, nb));
    free(idx);
    return rc;
}

int trn_st_encode_header(const struct trn_st_tensor *t, size_t n, const struct trn_st_meta *meta,
                         size_t n_meta, uint8_t **out, size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    *out_len = 0;
    int rc = check_names(t, n, meta, n_meta, err, errlen);
    if (rc)
        return rc;
    struct cddp_buf b;
    cddp_buf_init(&b, 8 + (size_t)TRN_ST_MAX_HEADER);
    rc = cddp_buf_append(&b, "\0\0\0\0\0\0\0\0{", 9);
    bool first = true;
    if (n_meta > 0 && rc == 0) {
        rc = cddp_buf_append(&b, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < n_meta && rc == 0; i++) {
            if (i > 0)
                rc = cddp_buf_append(&b, ",", 1);
            if (rc == 0)
                rc = json_string(&b, meta[i].key);
            if (rc == 0)
                rc = cddp_buf_append(&b, ":", 1);
            if (rc == 0)
                rc = json_string(&b, meta[i].value);
        }
        if (rc == 0)
            rc = cddp_buf_append(&b, "}", 1);
        first = false;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint64_t numel, nbytes;
        shape_size(t[i].dtype, t[i].ndim, t[i].shape, &numel, &nbytes);
        if (!first)
            rc = cddp_buf_append(&b, ",", 1);
        first = false;
        if (rc == 0)
            rc = json_string(&b, t[i].name);
        if (rc == 0)
            rc = cddp_buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[",
                                 trn_st_dtype_name(t[i].dtype));
        for (int d = 0; d < t[i].ndim && rc == 0; d++)
            rc = cddp_buf_printf(&b, "%s%llu", d ? "," : "", (unsigned long long)t[i].shape[d]);
        if (rc == 0)
            rc = cddp_buf_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                 (unsigned long long)(off + nbytes));
        off += nbytes;
    }
    if (rc == 0)
        rc = cddp_buf_append(&b, "}", 1);
    while (rc == 0 && (b.len - 8) % 8 != 0)
        rc = cddp_buf_append(&b, " ", 1);
    if (rc) {
        cddp_buf_free(&b);
        if (rc == CDDP_ETOOBIG)
            return cddp_fail(err, errlen, rc, "header would be over the 100 MB limit");
        return cddp_fail(err, errlen, rc, "encoding the header: %s", cddp_strerror(rc));
    }
    uint64_t hlen = b.len - 8;
    for (int i = 0; i < 8; i++)
        b.data[i] = (char)((hlen >> (8 * i)) & 0xFF);
    *out = (uint8_t *)b.data;
    *out_len = b.len;
    return 0;
}

int trn_st_write_fd(int fd, const struct trn_st_tensor *t, size_t n, const struct trn_st_meta *meta,
                    size_t n_meta, char *err, size_t errlen)
{
    uint8_t *hdr;
    size_t hlen;
    int rc = trn_st_encode_header(t, n, meta, n_meta, &hdr, &hlen, err, errlen);
    if (rc)
        return rc;
    rc = cddp_write_all(fd, hdr, hlen);
    free(hdr);
    for (size_t i = 0; i < n && rc == 0; i++) {
        uint64_t numel, nbytes;
        shape_size(t[i].dtype, t[i].ndim, t[i].shape, &numel, &nbytes);
        rc = cddp_write_all(fd, t[i].data, (size_t)nbytes);
    }
    if (rc)
        return cddp_fail(err, errlen, rc, "write: %s", cddp_strerror(rc));
    return 0;
}

/* Opens and locks PATH.tmp; retries when the locked inode is no longer the
 * one named PATH.tmp (a previous writer renamed it while we waited). */
static int open_tmp(const char *tmp, int *out)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return CDDP_ERR_FROM_ERRNO(errno);
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            return e == EWOULDBLOCK ? CDDP_EEXISTS : CDDP_ERR_FROM_ERRNO(e);
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(tmp, &b) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev) {
            if (ftruncate(fd, 0) != 0) {
                int e = errno;
                close(fd);
                return CDDP_ERR_FROM_ERRNO(e);
            }
            *out = fd;
            return 0;
        }
        close(fd);
    }
    return CDDP_EEXISTS;
}

int trn_st_save(const char *path, const struct trn_st_tensor *t, size_t n,
                const struct trn_st_meta *meta, size_t n_meta, char *err, size_t errlen)
{
    char tmp[4096], msg[512];
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
        return cddp_fail(err, errlen, CDDP_ERR_FROM_ERRNO(ENAMETOOLONG), "%s: path too long", path);
    int fd = -1, rc = open_tmp(tmp, &fd);
    if (rc == CDDP_EEXISTS)
        return cddp_fail(err, errlen, rc, "%s: another process is writing it (%s is locked)", path,
                         tmp);
    if (rc)
        return cddp_fail(err, errlen, rc, "%s: %s", tmp, cddp_strerror(rc));
    if ((rc = trn_st_write_fd(fd, t, n, meta, n_meta, msg, sizeof(msg))) != 0) {
        cddp_fail(err, errlen, rc, "%s: %s", tmp, msg);
        goto fail;
    }
    /* Rename while still holding the lock: see open_tmp. */
    bool renamed = false;
    if ((rc = cddp_file_commit(fd, tmp, path, &renamed, msg, sizeof(msg))) != 0) {
        cddp_fail(err, errlen, rc, "%s: %s", path, msg);
        if (renamed) { /* only the directory's fsync failed: the file is in place */
            close(fd);
            return rc;
        }
        goto fail;
    }
    close(fd); /* after fsync, close has nothing left to report */
    return 0;
fail:
    unlink(tmp);
    close(fd);
    return rc;
}

uint32_t trn_st_tensors_crc32(const struct trn_st_tensor *t, size_t n)
{
    uLong c = crc32_z(0L, Z_NULL, 0);
    for (size_t i = 0; i < n; i++) {
        uint64_t numel, nbytes;
        if (shape_size(t[i].dtype, t[i].ndim, t[i].shape, &numel, &nbytes) && nbytes > 0)
            c = crc32_z(c, t[i].data, (size_t)nbytes);
    }
    return (uint32_t)c;
}
