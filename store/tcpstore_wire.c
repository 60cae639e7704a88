/* tcpstore_wire.c: see tcpstore_wire.h.
 *
 * Decoding walks a cursor over the caller's bytes. Every read goes through
 * take(), which is the one place that compares against the end of the
 * input (and against max_query), so nothing past len is ever looked at. A
 * length read from the wire is checked against its limit before it is
 * used to move the cursor, so offsets never overflow. */
#include "store/tcpstore_wire.h"

#include <string.h>

#include "common/errors.h"

static const struct {
    const char *name;
    int v1, v2;
    enum tcpstore_shape shape;
} ops[TCPSTORE_NUM_OPS] = {
#define XX(name, v1, v2, shape) {#name, v1, v2, TCPSTORE_SHAPE_##shape},
    TCPSTORE_QUERIES(XX)
#undef XX
};

struct tcpstore_limits tcpstore_limits_resolve(const struct tcpstore_limits *lim)
{
    struct tcpstore_limits l = {0};
    if (lim)
        l = *lim;
    if (l.max_key == 0)
        l.max_key = 64u << 10;
    if (l.max_value == 0)
        l.max_value = 64u << 20;
    if (l.max_keys == 0)
        l.max_keys = 128u << 10;
    if (l.max_query == 0)
        l.max_query = 80u << 20;
    return l;
}

const char *tcpstore_op_name(int op)
{
    return op >= 0 && op < TCPSTORE_NUM_OPS ? ops[op].name : "?";
}

enum tcpstore_shape tcpstore_op_shape(enum tcpstore_op op)
{
    return ops[op].shape;
}

int tcpstore_op_code(enum tcpstore_dialect d, enum tcpstore_op op)
{
    if ((int)op < 0 || op >= TCPSTORE_NUM_OPS)
        return -1;
    return d == TCPSTORE_DIALECT_V2 ? ops[op].v2 : ops[op].v1;
}

const char *tcpstore_dialect_name(enum tcpstore_dialect d)
{
    switch (d) {
    case TCPSTORE_DIALECT_V1:
        return "torch<=2.0";
    case TCPSTORE_DIALECT_V2:
        return "torch2";
    default:
        return "unknown";
    }
}

static int op_of_code(enum tcpstore_dialect d, uint8_t code)
{
    for (int i = 0; i < TCPSTORE_NUM_OPS; i++)
        if ((d == TCPSTORE_DIALECT_V2 ? ops[i].v2 : ops[i].v1) == code)
            return i;
    return -1;
}

void tcpstore_decoder_init(struct tcpstore_decoder *d, const struct tcpstore_limits *lim)
{
    d->dialect = TCPSTORE_DIALECT_UNKNOWN;
    d->lim = tcpstore_limits_resolve(lim);
}

/* ---- the cursor ---- */

struct cur {
    const uint8_t *p;
    size_t len, off, max;
    size_t need; /* set when take() says MORE */
};

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Claims n more bytes: 0 with *at pointing at them, TCPSTORE_MORE, or
 * CDDP_ETOOBIG past max. n is always bounded by a limit (<= max). */
static int take(struct cur *c, size_t n, const uint8_t **at)
{
    if (n > c->max || c->off > c->max - n)
        return CDDP_ETOOBIG;
    if (n > c->len - c->off) {
        c->need = c->off + n;
        return TCPSTORE_MORE;
    }
    *at = c->p + c->off;
    c->off += n;
    return 0;
}

static int get_u64(struct cur *c, uint64_t *v)
{
    const uint8_t *at;
    int rc = take(c, 8, &at);
    if (rc == 0)
        *v = le64(at);
    return rc;
}

static int get_u32(struct cur *c, uint32_t *v)
{
    const uint8_t *at;
    int rc = take(c, 4, &at);
    if (rc == 0)
        *v = le32(at);
    return rc;
}

/* A u64 length (at most max), then that many bytes. */
static int get_bytes(struct cur *c, size_t max, struct tcpstore_bytes *out)
{
    uint64_t n;
    int rc = get_u64(c, &n);
    if (rc)
        return rc;
    if (n > max)
        return CDDP_ETOOBIG;
    const uint8_t *at;
    if ((rc = take(c, (size_t)n, &at)) != 0)
        return rc;
    out->p = at;
    out->n = (size_t)n;
    return 0;
}

/* A u64 count (at most max_keys), then count keys (and values if pairs). */
static int get_list(struct cur *c, const struct tcpstore_limits *lim, bool pairs, size_t *count,
                    const uint8_t **items, size_t *items_len)
{
    uint64_t n;
    int rc = get_u64(c, &n);
    if (rc)
        return rc;
    if (n > lim->max_keys)
        return CDDP_ETOOBIG;
    size_t start = c->off;
    for (uint64_t i = 0; i < n; i++) {
        struct tcpstore_bytes b;
        if ((rc = get_bytes(c, lim->max_key, &b)) != 0)
            return rc;
        if (pairs && (rc = get_bytes(c, lim->max_value, &b)) != 0)
            return rc;
    }
    *count = (size_t)n;
    *items = c->p + start;
    *items_len = c->off - start;
    return 0;
}

static int finish(struct cur *c, int rc, size_t *used, size_t *need)
{
    if (rc == 0)
        *used = c->off;
    else if (rc == TCPSTORE_MORE)
        *need = c->need;
    return rc;
}

/* ---- queries ---- */

int tcpstore_decode(struct tcpstore_decoder *d, const uint8_t *buf, size_t len,
                    struct tcpstore_query *q, size_t *used, size_t *need)
{
    struct cur c = {.p = buf, .len = len, .max = d->lim.max_query};
    memset(q, 0, sizeof(*q));
    if (len == 0) {
        *need = 1;
        return TCPSTORE_MORE;
    }
    if (d->dialect == TCPSTORE_DIALECT_UNKNOWN) {
        /* Type 0 is VALIDATE in V2 and SET in V1: the magic decides. */
        if (buf[0] == 0 && len < 5) {
            *need = 5;
            return TCPSTORE_MORE;
        }
        d->dialect = buf[0] == 0 && le32(buf + 1) == TCPSTORE_MAGIC ? TCPSTORE_DIALECT_V2
                                                                    : TCPSTORE_DIALECT_V1;
    }
    int op = op_of_code(d->dialect, buf[0]);
    if (op < 0)
        return CDDP_EPROTO_TYPE;
    q->op = (enum tcpstore_op)op;
    c.off = 1;
    const struct tcpstore_limits *lim = &d->lim;
    int rc = 0;
    switch (ops[op].shape) {
    case TCPSTORE_SHAPE_NONE:
        break;
    case TCPSTORE_SHAPE_U32:
        rc = get_u32(&c, &q->u32);
        if (rc == 0 && q->op == TCPSTORE_VALIDATE && q->u32 != TCPSTORE_MAGIC)
            rc = CDDP_EPROTO_VERSION;
        break;
    case TCPSTORE_SHAPE_KEY:
        rc = get_bytes(&c, lim->max_key, &q->key);
        break;
    case TCPSTORE_SHAPE_KEY_VAL:
        if ((rc = get_bytes(&c, lim->max_key, &q->key)) == 0)
            rc = get_bytes(&c, lim->max_value, &q->val);
        break;
    case TCPSTORE_SHAPE_KEY_VAL_VAL:
        if ((rc = get_bytes(&c, lim->max_key, &q->key)) == 0 &&
            (rc = get_bytes(&c, lim->max_value, &q->val)) == 0)
            rc = get_bytes(&c, lim->max_value, &q->val2);
        break;
    case TCPSTORE_SHAPE_KEY_I64: {
        uint64_t v = 0;
        if ((rc = get_bytes(&c, lim->max_key, &q->key)) == 0 && (rc = get_u64(&c, &v)) == 0)
            q->delta = (int64_t)v;
        break;
    }
    case TCPSTORE_SHAPE_KEYS:
    case TCPSTORE_SHAPE_PAIRS:
        rc = get_list(&c, lim, ops[op].shape == TCPSTORE_SHAPE_PAIRS, &q->nitems, &q->items,
                      &q->items_len);
        break;
    }
    return finish(&c, rc, used, need);
}

bool tcpstore_query_next(const struct tcpstore_query *q, size_t *pos, struct tcpstore_bytes *key,
                         struct tcpstore_bytes *val)
{
    /* The list was checked whole by tcpstore_decode: only the end matters here. */
    bool pairs = ops[q->op].shape == TCPSTORE_SHAPE_PAIRS;
    if (q->items == NULL || *pos + 8 > q->items_len)
        return false;
    const uint8_t *p = q->items;
    size_t n = (size_t)le64(p + *pos);
    key->p = p + *pos + 8;
    key->n = n;
    *pos += 8 + n;
    if (pairs) {
        n = (size_t)le64(p + *pos);
        if (val) {
            val->p = p + *pos + 8;
            val->n = n;
        }
        *pos += 8 + n;
    }
    return true;
}

int tcpstore_put_u8(struct cddp_buf *b, uint8_t v)
{
    return cddp_buf_append(b, &v, 1);
}

int tcpstore_put_u32(struct cddp_buf *b, uint32_t v)
{
    uint8_t o[4];
    for (int i = 0; i < 4; i++)
        o[i] = (uint8_t)(v >> (8 * i));
    return cddp_buf_append(b, o, 4);
}

static int put_u64(struct cddp_buf *b, uint64_t v)
{
    uint8_t o[8];
    for (int i = 0; i < 8; i++)
        o[i] = (uint8_t)(v >> (8 * i));
    return cddp_buf_append(b, o, 8);
}

int tcpstore_put_i64(struct cddp_buf *b, int64_t v)
{
    return put_u64(b, (uint64_t)v);
}

int tcpstore_put_bytes(struct cddp_buf *b, const void *p, size_t n)
{
    size_t was = b->len;
    int rc = put_u64(b, n);
    if (rc == 0 && n)
        rc = cddp_buf_append(b, p, n);
    if (rc)
        b->len = was; /* all or nothing */
    return rc;
}

int tcpstore_encode_query(enum tcpstore_dialect d, const struct tcpstore_query *q,
                          struct cddp_buf *b)
{
    int code = tcpstore_op_code(d, q->op);
    if (code < 0)
        return CDDP_EPROTO_TYPE;
    size_t was = b->len;
    int rc = tcpstore_put_u8(b, (uint8_t)code);
    switch (ops[q->op].shape) {
    case TCPSTORE_SHAPE_NONE:
        break;
    case TCPSTORE_SHAPE_U32:
        if (rc == 0)
            rc = tcpstore_put_u32(b, q->u32);
        break;
    case TCPSTORE_SHAPE_KEY:
        if (rc == 0)
            rc = tcpstore_put_bytes(b, q->key.p, q->key.n);
        break;
    case TCPSTORE_SHAPE_KEY_VAL:
        if (rc == 0 && (rc = tcpstore_put_bytes(b, q->key.p, q->key.n)) == 0)
            rc = tcpstore_put_bytes(b, q->val.p, q->val.n);
        break;
    case TCPSTORE_SHAPE_KEY_VAL_VAL:
        if (rc == 0 && (rc = tcpstore_put_bytes(b, q->key.p, q->key.n)) == 0 &&
            (rc = tcpstore_put_bytes(b, q->val.p, q->val.n)) == 0)
            rc = tcpstore_put_bytes(b, q->val2.p, q->val2.n);
        break;
    case TCPSTORE_SHAPE_KEY_I64:
        if (rc == 0 && (rc = tcpstore_put_bytes(b, q->key.p, q->key.n)) == 0)
            rc = tcpstore_put_i64(b, q->delta);
        break;
    case TCPSTORE_SHAPE_KEYS:
    case TCPSTORE_SHAPE_PAIRS:
        if (rc == 0)
            rc = put_u64(b, q->nitems);
        for (size_t i = 0; rc == 0 && i < q->nitems; i++) {
            rc = tcpstore_put_bytes(b, q->keys[i].p, q->keys[i].n);
            if (rc == 0 && ops[q->op].shape == TCPSTORE_SHAPE_PAIRS)
                rc = tcpstore_put_bytes(b, q->vals[i].p, q->vals[i].n);
        }
        break;
    }
    if (rc)
        b->len = was;
    return rc;
}

/* ---- replies ---- */

int tcpstore_decode_reply(const struct tcpstore_limits *limits, enum tcpstore_reply_shape shape,
                          const uint8_t *buf, size_t len, struct tcpstore_reply *r, size_t *used,
                          size_t *need)
{
    struct tcpstore_limits lim = tcpstore_limits_resolve(limits);
    struct cur c = {.p = buf, .len = len, .max = lim.max_query};
    memset(r, 0, sizeof(*r));
    const uint8_t *at;
    uint64_t v = 0;
    int rc = 0;
    switch (shape) {
    case TCPSTORE_REPLY_U8:
        if ((rc = take(&c, 1, &at)) == 0)
            r->u8 = at[0];
        break;
    case TCPSTORE_REPLY_U32:
        rc = get_u32(&c, &r->u32);
        break;
    case TCPSTORE_REPLY_I64:
        if ((rc = get_u64(&c, &v)) == 0)
            r->i64 = (int64_t)v;
        break;
    case TCPSTORE_REPLY_BYTES:
        rc = get_bytes(&c, lim.max_value, &r->val);
        break;
    case TCPSTORE_REPLY_QPOP:
        if ((rc = get_u64(&c, &v)) == 0) {
            r->i64 = (int64_t)v;
            if (r->i64 > 0)
                rc = get_bytes(&c, lim.max_value, &r->val);
        }
        break;
    case TCPSTORE_REPLY_LIST:
        if ((rc = get_u64(&c, &v)) != 0)
            break;
        if (v > lim.max_keys) {
            rc = CDDP_ETOOBIG;
            break;
        }
        r->i64 = (int64_t)v;
        r->nitems = (size_t)v;
        r->items = buf + c.off;
        for (uint64_t i = 0; rc == 0 && i < v; i++) {
            struct tcpstore_bytes k;
            rc = get_bytes(&c, lim.max_key, &k);
        }
        r->items_len = (size_t)(buf + c.off - r->items);
        break;
    case TCPSTORE_REPLY_WATCH:
        if ((rc = take(&c, 1, &at)) == 0) {
            r->u8 = at[0];
            if ((rc = get_bytes(&c, lim.max_key, &r->key)) == 0 &&
                (rc = get_bytes(&c, lim.max_value, &r->old)) == 0)
                rc = get_bytes(&c, lim.max_value, &r->val);
        }
        break;
    default:
        rc = CDDP_EPROTO_TYPE;
    }
    return finish(&c, rc, used, need);
}

bool tcpstore_reply_next(const struct tcpstore_reply *r, size_t *pos, struct tcpstore_bytes *key)
{
    if (r->items == NULL || *pos + 8 > r->items_len)
        return false;
    size_t n = (size_t)le64(r->items + *pos);
    key->p = r->items + *pos + 8;
    key->n = n;
    *pos += 8 + n;
    return true;
}
