/* libFuzzer target: the TCPStore wire decoder (store/tcpstore_wire.c).
 *
 * Feeds the input to a decoder as a server does: in pieces (sizes from the
 * first byte), keeping an unfinished query and decoding again once the
 * decoder's "need" is there. Every query decoded must encode back to
 * exactly the bytes it came from, its key list must walk to its count, and
 * a MORE must ask for more than it was given. Then every reply shape is
 * decoded from the same bytes. Small limits, so the fuzzer reaches them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"
#include "store/tcpstore_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct tcpstore_limits lim = {
    .max_key = 300, .max_value = 4096, .max_keys = 64, .max_query = 16384};

static void check_query(enum tcpstore_dialect d, const struct tcpstore_query *q,
                        const uint8_t *bytes, size_t used)
{
    struct tcpstore_bytes keys[64], vals[64];
    struct tcpstore_query e = *q;
    size_t pos = 0, n = 0;
    enum tcpstore_shape sh = tcpstore_op_shape(q->op);
    if (sh == TCPSTORE_SHAPE_KEYS || sh == TCPSTORE_SHAPE_PAIRS) {
        while (n < 64 && tcpstore_query_next(q, &pos, &keys[n], &vals[n]))
            n++;
        if (n != q->nitems || pos != q->items_len)
            abort();
        e.keys = keys;
        e.vals = vals;
    }
    struct cddp_buf b;
    cddp_buf_init(&b, 1u << 20);
    if (tcpstore_encode_query(d, &e, &b) != 0 || b.len != used || memcmp(b.data, bytes, used))
        abort();
    cddp_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tcpstore_decoder dec;
    tcpstore_decoder_init(&dec, &lim);
    size_t piece = size ? (size_t)data[0] % 97 + 1 : 1;
    uint8_t *in = malloc(size + 1);
    size_t have = 0, need = 0;
    bool dead = false;
    for (size_t off = 0; off < size && !dead; off += piece) {
        size_t n = size - off < piece ? size - off : piece;
        memcpy(in + have, data + off, n);
        have += n;
        if (have < need)
            continue;
        size_t at = 0;
        need = 0;
        while (at < have) {
            struct tcpstore_query q;
            size_t used = 0;
            int rc = tcpstore_decode(&dec, in + at, have - at, &q, &used, &need);
            if (rc == TCPSTORE_MORE) {
                if (need <= have - at)
                    abort();
                break; /* need counts from in + at, which moves to in below */
            }
            if (rc) {
                if (rc != CDDP_EPROTO_TYPE && rc != CDDP_ETOOBIG && rc != CDDP_EPROTO_VERSION)
                    abort();
                dead = true;
                break;
            }
            if (used == 0 || used > have - at || dec.dialect == TCPSTORE_DIALECT_UNKNOWN)
                abort();
            check_query(dec.dialect, &q, in + at, used);
            at += used;
        }
        memmove(in, in + at, have - at);
        have -= at;
    }
    free(in);

    for (int shape = TCPSTORE_REPLY_U8; shape <= TCPSTORE_REPLY_WATCH; shape++) {
        struct tcpstore_reply r;
        size_t used = 0, rneed = 0;
        int rc = tcpstore_decode_reply(&lim, (enum tcpstore_reply_shape)shape, data, size, &r,
                                       &used, &rneed);
        if (rc == TCPSTORE_MORE && rneed <= size)
            abort();
        if (rc == 0 && used > size)
            abort();
        if (rc == 0 && shape == TCPSTORE_REPLY_LIST) {
            size_t pos = 0, n = 0;
            struct tcpstore_bytes k;
            while (tcpstore_reply_next(&r, &pos, &k))
                n++;
            if (n != r.nitems)
                abort();
        }
    }
    return 0;
}
