/* Unit tests for store/tcpstore_wire.c, the TCPStore codec: every query in
 * both numberings, the dialect choice, truncation at every byte, the
 * limits, replies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"
#include "store/kvstore.h"
#include "store/tcpstore_wire.h"

#define B(s) ((struct tcpstore_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* torch 1.13's first query, recorded from its client (the recording is in
 * tests/fuzz/seeds/tcpstore): ADD "init/" 1. */
static const uint8_t torch113_add_init[] = {0x03, 0x05, 0,   0, 0, 0, 0, 0, 0, 'i', 'n',
                                            'i',  't',  '/', 1, 0, 0, 0, 0, 0, 0,   0};

static struct cddp_buf encode(enum tcpstore_dialect d, const struct tcpstore_query *q)
{
    struct cddp_buf b;
    cddp_buf_init(&b, 1u << 26);
    assert_int_equal(tcpstore_encode_query(d, q, &b), 0);
    return b;
}

/* Decodes bytes (copied into a buffer of exactly that size, so ASan sees any
 * read past the end) as the first query of a connection in dialect d. */
static int decode1(enum tcpstore_dialect d, const struct tcpstore_limits *lim, const void *bytes,
                   size_t len, struct tcpstore_query *q, size_t *used, size_t *need, uint8_t **keep)
{
    struct tcpstore_decoder dec;
    tcpstore_decoder_init(&dec, lim);
    dec.dialect = d;
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, bytes, len);
    int rc = tcpstore_decode(&dec, copy, len, q, used, need);
    *keep = copy;
    return rc;
}

static void test_torch113_recorded(void **state)
{
    (void)state;
    struct tcpstore_decoder dec;
    tcpstore_decoder_init(&dec, NULL);
    struct tcpstore_query q;
    size_t used = 0, need = 0;
    assert_int_equal(
        tcpstore_decode(&dec, torch113_add_init, sizeof(torch113_add_init), &q, &used, &need), 0);
    assert_int_equal(dec.dialect, TCPSTORE_DIALECT_V1);
    assert_int_equal(q.op, TCPSTORE_ADD);
    assert_int_equal(used, sizeof(torch113_add_init));
    assert_int_equal(q.key.n, 5);
    assert_memory_equal(q.key.p, "init/", 5);
    assert_int_equal(q.delta, 1);
}

/* Every query of both numberings: encode, decode, same fields, same bytes;
 * every proper prefix says MORE with a need past the prefix and within the
 * query. */
static void roundtrip(enum tcpstore_dialect d, const struct tcpstore_query *q)
{
    struct cddp_buf b = encode(d, q);
    struct tcpstore_query r;
    size_t used = 0, need = 0;
    uint8_t *keep;
    assert_int_equal(decode1(d, NULL, b.data, b.len, &r, &used, &need, &keep), 0);
    assert_int_equal(r.op, q->op);
    assert_int_equal(used, b.len);
    assert_int_equal(r.key.n, q->key.n);
    if (q->key.n)
        assert_memory_equal(r.key.p, q->key.p, q->key.n);
    assert_int_equal(r.val.n, q->val.n);
    if (q->val.n)
        assert_memory_equal(r.val.p, q->val.p, q->val.n);
    assert_int_equal(r.val2.n, q->val2.n);
    assert_true(r.delta == q->delta);
    assert_int_equal(r.u32, q->u32);
    assert_int_equal(r.nitems, q->nitems);
    size_t pos = 0, i = 0;
    struct tcpstore_bytes k, v;
    while (tcpstore_query_next(&r, &pos, &k, &v)) {
        assert_int_equal(k.n, q->keys[i].n);
        assert_memory_equal(k.p, q->keys[i].p, k.n);
        if (q->op == TCPSTORE_MULTI_SET) {
            assert_int_equal(v.n, q->vals[i].n);
            if (v.n)
                assert_memory_equal(v.p, q->vals[i].p, v.n);
        }
        i++;
    }
    assert_int_equal(i, q->nitems);
    free(keep);
    for (size_t cut = 0; cut < b.len; cut++) {
        int rc = decode1(d, NULL, b.data, cut, &r, &used, &need, &keep);
        assert_int_equal(rc, TCPSTORE_MORE);
        assert_true(need > cut);
        assert_true(need <= b.len);
        free(keep);
    }
    cddp_buf_free(&b);
}

static void test_every_query(void **state)
{
    (void)state;
    struct tcpstore_bytes keys[3] = {B("/a"), B(""), B("/ccc")};
    struct tcpstore_bytes vals[3] = {B("1"), B(""), B("three")};
    for (int d = TCPSTORE_DIALECT_V1; d <= TCPSTORE_DIALECT_V2; d++) {
        int served = 0;
        for (int op = 0; op < TCPSTORE_NUM_OPS; op++) {
            if (tcpstore_op_code((enum tcpstore_dialect)d, (enum tcpstore_op)op) < 0)
                continue;
            struct tcpstore_query q = {.op = (enum tcpstore_op)op};
            switch (tcpstore_op_shape(q.op)) {
            case TCPSTORE_SHAPE_U32:
                q.u32 = op == TCPSTORE_VALIDATE ? TCPSTORE_MAGIC : 0xdeadbeef;
                break;
            case TCPSTORE_SHAPE_KEY_VAL_VAL:
                q.val2 = B("desired");
                /* fall through */
            case TCPSTORE_SHAPE_KEY_VAL:
                q.val = B("a value\0with a NUL");
                /* fall through */
            case TCPSTORE_SHAPE_KEY:
                q.key = B("/some/key");
                break;
            case TCPSTORE_SHAPE_KEY_I64:
                q.key = B("counter");
                q.delta = -9000000000000000000LL;
                break;
            case TCPSTORE_SHAPE_KEYS:
            case TCPSTORE_SHAPE_PAIRS:
                q.nitems = 3;
                q.keys = keys;
                q.vals = vals;
                break;
            case TCPSTORE_SHAPE_NONE:
                break;
            }
            roundtrip((enum tcpstore_dialect)d, &q);
            served++;
        }
        /* 1.13's nine plus APPEND..CANCEL_WAIT; 2.x's eighteen. */
        assert_int_equal(served, d == TCPSTORE_DIALECT_V1 ? 13 : 18);
    }
}

static void test_numbering(void **state)
{
    (void)state;
    /* torch 1.13 (TCPStore.cpp's QueryType) and torch 2.x (TCPStoreBackend.hpp). */
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V1, TCPSTORE_SET), 0);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V1, TCPSTORE_GETNUMKEYS), 6);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V1, TCPSTORE_WATCH_KEY), 7);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V1, TCPSTORE_DELETE_KEY), 8);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V1, TCPSTORE_PING), -1);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_VALIDATE), 0);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_SET), 1);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_GETNUMKEYS), 7);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_DELETE_KEY), 8);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_CANCEL_WAIT), 12);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_PING), 13);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_QUEUE_LEN), 16);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_LIST), 17);
    assert_int_equal(tcpstore_op_code(TCPSTORE_DIALECT_V2, TCPSTORE_WATCH_KEY), -1);
    assert_string_equal(tcpstore_op_name(TCPSTORE_COMPARE_SET), "COMPARE_SET");
    assert_string_equal(tcpstore_op_name(99), "?");
}

static void test_dialect_choice(void **state)
{
    (void)state;
    struct tcpstore_decoder dec;
    struct tcpstore_query q;
    size_t used = 0, need = 0;
    /* VALIDATE + magic: torch 2.x, and from then on its numbering. */
    const uint8_t v2[] = {0, 0xce, 0xf7, 0x85, 0x3c, 7};
    tcpstore_decoder_init(&dec, NULL);
    assert_int_equal(tcpstore_decode(&dec, v2, 1, &q, &used, &need), TCPSTORE_MORE);
    assert_int_equal(need, 5);
    assert_int_equal(dec.dialect, TCPSTORE_DIALECT_UNKNOWN);
    assert_int_equal(tcpstore_decode(&dec, v2, sizeof(v2), &q, &used, &need), 0);
    assert_int_equal(dec.dialect, TCPSTORE_DIALECT_V2);
    assert_int_equal(q.op, TCPSTORE_VALIDATE);
    assert_int_equal(used, 5);
    assert_int_equal(tcpstore_decode(&dec, v2 + 5, 1, &q, &used, &need), 0);
    assert_int_equal(q.op, TCPSTORE_GETNUMKEYS);
    /* A second VALIDATE with a wrong magic is refused. */
    const uint8_t badv[] = {0, 1, 2, 3, 4};
    assert_int_equal(tcpstore_decode(&dec, badv, sizeof(badv), &q, &used, &need),
                     CDDP_EPROTO_VERSION);

    /* Type 0 without the magic: a torch 1.13 SET. */
    tcpstore_decoder_init(&dec, NULL);
    struct tcpstore_query set = {.op = TCPSTORE_SET, .key = B("/k"), .val = B("v")};
    struct cddp_buf b = encode(TCPSTORE_DIALECT_V1, &set);
    assert_int_equal(tcpstore_decode(&dec, (uint8_t *)b.data, b.len, &q, &used, &need), 0);
    assert_int_equal(dec.dialect, TCPSTORE_DIALECT_V1);
    assert_int_equal(q.op, TCPSTORE_SET);
    cddp_buf_free(&b);
    /* 7 is WATCH_KEY there; 13 is nothing. */
    const uint8_t watch[] = {7, 1, 0, 0, 0, 0, 0, 0, 0, 'k', 13};
    assert_int_equal(tcpstore_decode(&dec, watch, 10, &q, &used, &need), 0);
    assert_int_equal(q.op, TCPSTORE_WATCH_KEY);
    assert_int_equal(tcpstore_decode(&dec, watch + 10, 1, &q, &used, &need), CDDP_EPROTO_TYPE);

    /* Any other first byte settles V1 at once. */
    tcpstore_decoder_init(&dec, NULL);
    const uint8_t nk[] = {6};
    assert_int_equal(tcpstore_decode(&dec, nk, 1, &q, &used, &need), 0);
    assert_int_equal(dec.dialect, TCPSTORE_DIALECT_V1);
    assert_int_equal(q.op, TCPSTORE_GETNUMKEYS);
    tcpstore_decoder_init(&dec, NULL);
    const uint8_t junk[] = {'G', 'E', 'T'};
    assert_int_equal(tcpstore_decode(&dec, junk, 3, &q, &used, &need), CDDP_EPROTO_TYPE);
    const uint8_t v2bad[] = {18};
    dec.dialect = TCPSTORE_DIALECT_V2;
    assert_int_equal(tcpstore_decode(&dec, v2bad, 1, &q, &used, &need), CDDP_EPROTO_TYPE);
}

static void test_limits(void **state)
{
    (void)state;
    struct tcpstore_limits lim = {.max_key = 8, .max_value = 16, .max_keys = 2, .max_query = 64};
    struct tcpstore_query q, r;
    size_t used, need;
    uint8_t *keep;
    /* A key one byte too long is refused from its length alone. */
    q = (struct tcpstore_query){.op = TCPSTORE_GET, .key = B("123456789")};
    struct cddp_buf b = encode(TCPSTORE_DIALECT_V1, &q);
    assert_int_equal(decode1(TCPSTORE_DIALECT_V1, &lim, b.data, 9, &r, &used, &need, &keep),
                     CDDP_ETOOBIG);
    free(keep);
    cddp_buf_free(&b);
    q.key = B("12345678");
    b = encode(TCPSTORE_DIALECT_V1, &q);
    assert_int_equal(decode1(TCPSTORE_DIALECT_V1, &lim, b.data, b.len, &r, &used, &need, &keep), 0);
    free(keep);
    cddp_buf_free(&b);
    /* A value one byte too long. */
    q = (struct tcpstore_query){.op = TCPSTORE_SET, .key = B("k"), .val = B("12345678901234567")};
    b = encode(TCPSTORE_DIALECT_V2, &q);
    assert_int_equal(decode1(TCPSTORE_DIALECT_V2, &lim, b.data, 18, &r, &used, &need, &keep),
                     CDDP_ETOOBIG);
    free(keep);
    cddp_buf_free(&b);
    /* A length of 2^64 - 1 does not wrap anything. */
    uint8_t huge[17] = {1, 1, 0, 0, 0, 0, 0, 0, 0, 'k'};
    memset(huge + 10, 0xff, 7);
    assert_int_equal(decode1(TCPSTORE_DIALECT_V2, &lim, huge, 17, &r, &used, &need, &keep),
                     TCPSTORE_MORE);
    free(keep);
    uint8_t huge2[18];
    memcpy(huge2, huge, 17);
    huge2[17] = 0xff;
    assert_int_equal(decode1(TCPSTORE_DIALECT_V2, &lim, huge2, 18, &r, &used, &need, &keep),
                     CDDP_ETOOBIG);
    free(keep);
    /* Three keys where two are allowed. */
    struct tcpstore_bytes keys[3] = {B("a"), B("b"), B("c")};
    q = (struct tcpstore_query){.op = TCPSTORE_WAIT, .nitems = 3, .keys = keys};
    b = encode(TCPSTORE_DIALECT_V1, &q);
    assert_int_equal(decode1(TCPSTORE_DIALECT_V1, &lim, b.data, 9, &r, &used, &need, &keep),
                     CDDP_ETOOBIG);
    free(keep);
    cddp_buf_free(&b);
    /* The whole query past max_query, though each field fits. */
    struct tcpstore_bytes vals[2] = {B("0123456789abcdef"), B("0123456789abcdef")};
    struct tcpstore_bytes k2[2] = {B("key1"), B("key2")};
    q = (struct tcpstore_query){.op = TCPSTORE_MULTI_SET, .nitems = 2, .keys = k2, .vals = vals};
    b = encode(TCPSTORE_DIALECT_V2, &q);
    assert_true(b.len > 64);
    assert_int_equal(decode1(TCPSTORE_DIALECT_V2, &lim, b.data, b.len, &r, &used, &need, &keep),
                     CDDP_ETOOBIG);
    free(keep);
    cddp_buf_free(&b);
    /* Defaults. */
    struct tcpstore_limits d = tcpstore_limits_resolve(NULL);
    assert_int_equal(d.max_key, 64u << 10);
    assert_int_equal(d.max_value, 64u << 20);
    assert_int_equal(d.max_keys, 128u << 10);
}

static void test_pipelined_stream(void **state)
{
    (void)state;
    /* Queries back to back, as a client that does not wait sends them. */
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    struct tcpstore_query a = {.op = TCPSTORE_VALIDATE, .u32 = TCPSTORE_MAGIC};
    struct tcpstore_query p = {.op = TCPSTORE_PING, .u32 = 77};
    struct tcpstore_query s = {.op = TCPSTORE_SET, .key = B("/x"), .val = B("")};
    struct tcpstore_query l = {.op = TCPSTORE_LIST};
    assert_int_equal(tcpstore_encode_query(TCPSTORE_DIALECT_V2, &a, &b), 0);
    assert_int_equal(tcpstore_encode_query(TCPSTORE_DIALECT_V2, &p, &b), 0);
    assert_int_equal(tcpstore_encode_query(TCPSTORE_DIALECT_V2, &s, &b), 0);
    assert_int_equal(tcpstore_encode_query(TCPSTORE_DIALECT_V2, &l, &b), 0);
    struct tcpstore_decoder dec;
    tcpstore_decoder_init(&dec, NULL);
    enum tcpstore_op want[] = {TCPSTORE_VALIDATE, TCPSTORE_PING, TCPSTORE_SET, TCPSTORE_LIST};
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        struct tcpstore_query q;
        size_t used, need;
        assert_int_equal(
            tcpstore_decode(&dec, (uint8_t *)b.data + off, b.len - off, &q, &used, &need), 0);
        assert_int_equal(q.op, want[i]);
        if (i == 1)
            assert_int_equal(q.u32, 77);
        off += used;
    }
    assert_int_equal(off, b.len);
    /* A WATCH_KEY-less numbering refuses V1-only types. */
    struct tcpstore_query w = {.op = TCPSTORE_WATCH_KEY, .key = B("k")};
    assert_int_equal(tcpstore_encode_query(TCPSTORE_DIALECT_V2, &w, &b), CDDP_EPROTO_TYPE);
    cddp_buf_free(&b);
}

struct reply_case {
    enum tcpstore_reply_shape shape;
    size_t len;
};

static void test_replies(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    struct tcpstore_reply r;
    size_t used, need;
    struct reply_case cases[7];
    size_t n = 0, start = 0;
    assert_int_equal(tcpstore_put_u8(&b, TCPSTORE_CHECK_NOT_READY), 0);
    cases[n++] = (struct reply_case){TCPSTORE_REPLY_U8, b.len - start};
    start = b.len;
    assert_int_equal(tcpstore_put_u32(&b, 4242), 0);
    cases[n++] = (struct reply_case){TCPSTORE_REPLY_U32, b.len - start};
    start = b.len;
    assert_int_equal(tcpstore_put_i64(&b, -5), 0);
    cases[n++] = (struct reply_case){TCPSTORE_REPLY_I64, b.len - start};
    start = b.len;
    assert_int_equal(tcpstore_put_bytes(&b, "value", 5), 0);
    cases[n++] = (struct reply_case){TCPSTORE_REPLY_BYTES, b.len - start};
    start = b.len;
    assert_int_equal(tcpstore_put_i64(&b, 2), 0);
    assert_int_equal(tcpstore_put_bytes(&b, "item", 4), 0);
    cases[n++] = (struct reply_case){TCPSTORE_REPLY_QPOP, b.len - start};
    start = b.len;
    assert_int_equal(tcpstore_put_i64(&b, 2), 0);
    assert_int_equal(tcpstore_put_bytes(&b, "/a", 2), 0);
    assert_int_equal(tcpstore_put_bytes(&b, "/bb", 3), 0);
    cases[n++] = (struct reply_case){TCPSTORE_REPLY_LIST, b.len - start};
    start = b.len;
    assert_int_equal(tcpstore_put_u8(&b, TCPSTORE_WATCH_KEY_UPDATED), 0);
    assert_int_equal(tcpstore_put_bytes(&b, "/k", 2), 0);
    assert_int_equal(tcpstore_put_bytes(&b, "old", 3), 0);
    assert_int_equal(tcpstore_put_bytes(&b, "new", 3), 0);
    cases[n++] = (struct reply_case){TCPSTORE_REPLY_WATCH, b.len - start};
    start = b.len;

    const uint8_t *p = (const uint8_t *)b.data;
    for (size_t i = 0; i < n; i++) {
        for (size_t cut = 0; cut < cases[i].len; cut++)
            assert_int_equal(tcpstore_decode_reply(NULL, cases[i].shape, p, cut, &r, &used, &need),
                             TCPSTORE_MORE);
        assert_int_equal(
            tcpstore_decode_reply(NULL, cases[i].shape, p, cases[i].len, &r, &used, &need), 0);
        assert_int_equal(used, cases[i].len);
        switch (cases[i].shape) {
        case TCPSTORE_REPLY_U8:
            assert_int_equal(r.u8, TCPSTORE_CHECK_NOT_READY);
            break;
        case TCPSTORE_REPLY_U32:
            assert_int_equal(r.u32, 4242);
            break;
        case TCPSTORE_REPLY_I64:
            assert_true(r.i64 == -5);
            break;
        case TCPSTORE_REPLY_BYTES:
            assert_int_equal(r.val.n, 5);
            break;
        case TCPSTORE_REPLY_QPOP:
            assert_true(r.i64 == 2);
            assert_memory_equal(r.val.p, "item", 4);
            break;
        case TCPSTORE_REPLY_LIST: {
            size_t pos = 0, k = 0;
            struct tcpstore_bytes key;
            while (tcpstore_reply_next(&r, &pos, &key))
                k++;
            assert_int_equal(k, 2);
            break;
        }
        case TCPSTORE_REPLY_WATCH:
            assert_int_equal(r.u8, TCPSTORE_WATCH_KEY_UPDATED);
            assert_memory_equal(r.old.p, "old", 3);
            assert_memory_equal(r.val.p, "new", 3);
            break;
        }
        p += cases[i].len;
    }
    /* An empty queue pops as a length of 0 and nothing else. */
    uint8_t zero[8] = {0};
    assert_int_equal(tcpstore_decode_reply(NULL, TCPSTORE_REPLY_QPOP, zero, 8, &r, &used, &need),
                     0);
    assert_int_equal(used, 8);
    /* The buffer's maximum: all or nothing. */
    struct cddp_buf small;
    cddp_buf_init(&small, 10);
    assert_int_equal(tcpstore_put_bytes(&small, "abc", 3), CDDP_ETOOBIG);
    assert_int_equal(small.len, 0);
    cddp_buf_free(&small);
    cddp_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch113_recorded),
        cmocka_unit_test(test_every_query),
        cmocka_unit_test(test_numbering),
        cmocka_unit_test(test_dialect_choice),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_pipelined_stream),
        cmocka_unit_test(test_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
