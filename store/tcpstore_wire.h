/*
 * tcpstore_wire.h: PyTorch's TCPStore wire protocol, both directions.
 *
 * Pure: no I/O, no allocation, no clock. The decoders read only the bytes
 * they are given; a query or reply that is not complete yet is answered
 * with TCPSTORE_MORE and the number of bytes it needs at least, so a server
 * can wait for them instead of decoding the same prefix again.
 *
 * The format (docs/tcpstore.md has the whole table): a query is one byte of
 * type, then its fields; numbers are little-endian (torch sends them in host
 * order, and every machine it runs on is little-endian); a string or value
 * is a u64 length, then the bytes; a key list is a u64 count, then strings.
 * Replies carry no type: the client knows what it asked.
 *
 * Two numberings of the query type exist. torch up to 2.0 (1.13 is the one
 * tested) sends SET = 0 ... WATCH_KEY = 7, DELETE_KEY = 8 and never says
 * which version it is (TCPSTORE_DIALECT_V1). torch 2.x from the one that
 * added VALIDATE opens every connection with VALIDATE (type 0) and the u32
 * magic 0x3C85F7CE, and numbers SET = 1 ... (TCPSTORE_DIALECT_V2). A
 * decoder starts in TCPSTORE_DIALECT_UNKNOWN and settles on the first
 * query: byte 0 followed by the magic is V2; anything else is V1. A V1 SET
 * would need a key of 0x3C85F7CE + k * 2^32 bytes to look like the
 * handshake, far past any key limit, so the choice is never ambiguous.
 * torch 2.1 and 2.2 numbered without WATCH_KEY and without the handshake;
 * they cannot be told from 1.13 and are not served (docs/tcpstore.md).
 *
 * Limits: every length is checked against struct tcpstore_limits before
 * anything is trusted; past one the decoder says CDDP_ETOOBIG.
 */
#ifndef CDDP_STORE_TCPSTORE_WIRE_H
#define CDDP_STORE_TCPSTORE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strutil.h"

#define TCPSTORE_MAGIC 0x3C85F7CEu

/* tcpstore_decode*() when the input is not complete yet (never an error). */
#define TCPSTORE_MORE 1

enum tcpstore_dialect {
    TCPSTORE_DIALECT_UNKNOWN = 0, /* nothing decoded yet */
    TCPSTORE_DIALECT_V1,          /* torch <= 2.0: no handshake */
    TCPSTORE_DIALECT_V2,          /* torch 2.x: VALIDATE first */
};

/* The shape of a query's fields after its type byte. */
enum tcpstore_shape {
    TCPSTORE_SHAPE_NONE,        /* nothing */
    TCPSTORE_SHAPE_U32,         /* u32 */
    TCPSTORE_SHAPE_KEY,         /* string */
    TCPSTORE_SHAPE_KEY_VAL,     /* string, value */
    TCPSTORE_SHAPE_KEY_VAL_VAL, /* string, value, value */
    TCPSTORE_SHAPE_KEY_I64,     /* string, i64 */
    TCPSTORE_SHAPE_KEYS,        /* u64 n, n strings */
    TCPSTORE_SHAPE_PAIRS,       /* u64 n, n (string, value) */
};

/* XX(name, V1 type byte or -1, V2 type byte or -1, shape). Our own enum
 * below is independent of both numberings; never renumber it. */
#define TCPSTORE_QUERIES(XX)                                                                       \
    XX(VALIDATE, -1, 0, U32)                                                                       \
    XX(SET, 0, 1, KEY_VAL)                                                                         \
    XX(COMPARE_SET, 1, 2, KEY_VAL_VAL)                                                             \
    XX(GET, 2, 3, KEY)                                                                             \
    XX(ADD, 3, 4, KEY_I64)                                                                         \
    XX(CHECK, 4, 5, KEYS)                                                                          \
    XX(WAIT, 5, 6, KEYS)                                                                           \
    XX(GETNUMKEYS, 6, 7, NONE)                                                                     \
    XX(WATCH_KEY, 7, -1, KEY)                                                                      \
    XX(DELETE_KEY, 8, 8, KEY)                                                                      \
    XX(APPEND, 9, 9, KEY_VAL)                                                                      \
    XX(MULTI_GET, 10, 10, KEYS)                                                                    \
    XX(MULTI_SET, 11, 11, PAIRS)                                                                   \
    XX(CANCEL_WAIT, 12, 12, NONE)                                                                  \
    XX(PING, -1, 13, U32)                                                                          \
    XX(QUEUE_PUSH, -1, 14, KEY_VAL)                                                                \
    XX(QUEUE_POP, -1, 15, KEY)                                                                     \
    XX(QUEUE_LEN, -1, 16, KEY)                                                                     \
    XX(LIST, -1, 17, NONE)

enum tcpstore_op {
#define XX(name, v1, v2, shape) TCPSTORE_##name,
    TCPSTORE_QUERIES(XX)
#undef XX
        TCPSTORE_NUM_OPS
};

/* Reply codes (one byte). */
enum {
    TCPSTORE_CHECK_READY = 0,
    TCPSTORE_CHECK_NOT_READY = 1,
    TCPSTORE_WAIT_STOP_WAITING = 0,
    TCPSTORE_WAIT_CANCELED = 1,
    TCPSTORE_WATCH_KEY_UPDATED = 0, /* V1 WATCH_KEY events */
    TCPSTORE_WATCH_KEY_CREATED = 1,
    TCPSTORE_WATCH_KEY_DELETED = 2,
    TCPSTORE_WATCH_REGISTERED = 3,
};

struct tcpstore_limits {
    size_t max_key;   /* bytes of one key; 0: 64 KiB */
    size_t max_value; /* bytes of one value; 0: 64 MiB */
    size_t max_keys;  /* keys in one CHECK/WAIT/MULTI_GET/MULTI_SET (and LIST reply); 0: 131072 */
    size_t max_query; /* bytes of one whole query or reply; 0: 80 MiB */
};

/* lim with every 0 replaced by its default. */
struct tcpstore_limits tcpstore_limits_resolve(const struct tcpstore_limits *lim);

struct tcpstore_bytes {
    const uint8_t *p;
    size_t n;
};

/* One decoded query. Pointers point into the caller's buffer. */
struct tcpstore_query {
    enum tcpstore_op op;
    struct tcpstore_bytes key;  /* KEY, KEY_VAL, KEY_VAL_VAL, KEY_I64 */
    struct tcpstore_bytes val;  /* KEY_VAL; KEY_VAL_VAL: the expected value */
    struct tcpstore_bytes val2; /* KEY_VAL_VAL: the desired value */
    int64_t delta;              /* KEY_I64 */
    uint32_t u32;               /* VALIDATE: the magic; PING: the nonce */
    size_t nitems;              /* KEYS, PAIRS */
    /* Decoding: the encoded list (walk it with tcpstore_query_next). */
    const uint8_t *items;
    size_t items_len;
    /* Encoding: nitems keys (KEYS) or nitems keys and nitems values (PAIRS). */
    const struct tcpstore_bytes *keys;
    const struct tcpstore_bytes *vals;
};

/* "SET", "WATCH_KEY", ...; "?" for anything else. */
const char *tcpstore_op_name(int op);
enum tcpstore_shape tcpstore_op_shape(enum tcpstore_op op);
/* The type byte of op in dialect d (UNKNOWN counts as V1), or -1. */
int tcpstore_op_code(enum tcpstore_dialect d, enum tcpstore_op op);
const char *tcpstore_dialect_name(enum tcpstore_dialect d);

struct tcpstore_decoder {
    enum tcpstore_dialect dialect;
    struct tcpstore_limits lim;
};

/* lim NULL: the defaults. */
void tcpstore_decoder_init(struct tcpstore_decoder *d, const struct tcpstore_limits *lim);

/*
 * Decodes the query at the start of buf[0, len).
 *  0: *q is filled, *used bytes belong to it; on the first query the
 *     decoder's dialect is settled;
 *  TCPSTORE_MORE: incomplete; *need (> len) is how many bytes it needs at
 *     least before a call can say more;
 *  CDDP_EPROTO_TYPE: a type byte that the dialect does not know;
 *  CDDP_EPROTO_VERSION: a VALIDATE whose magic is wrong;
 *  CDDP_ETOOBIG: a key, value, count or the whole query past its limit.
 * After an error the stream cannot be resynchronised: close it.
 */
int tcpstore_decode(struct tcpstore_decoder *d, const uint8_t *buf, size_t len,
                    struct tcpstore_query *q, size_t *used, size_t *need);

/* Walks a decoded KEYS or PAIRS list: *pos starts at 0. Returns true with
 * the next key (and, for PAIRS, its value) until the list is done. */
bool tcpstore_query_next(const struct tcpstore_query *q, size_t *pos, struct tcpstore_bytes *key,
                         struct tcpstore_bytes *val);

/* Appends q as dialect d sends it (UNKNOWN counts as V1). 0, CDDP_EPROTO_TYPE
 * (op not in d), CDDP_ETOOBIG (b's maximum). */
int tcpstore_encode_query(enum tcpstore_dialect d, const struct tcpstore_query *q,
                          struct cddp_buf *b);

/* ---- replies ---- */

int tcpstore_put_u8(struct cddp_buf *b, uint8_t v);
int tcpstore_put_u32(struct cddp_buf *b, uint32_t v);
int tcpstore_put_i64(struct cddp_buf *b, int64_t v);
/* A u64 length, then the n bytes at p. */
int tcpstore_put_bytes(struct cddp_buf *b, const void *p, size_t n);

/* The shape of a reply, for a client's decoder. */
enum tcpstore_reply_shape {
    TCPSTORE_REPLY_U8,    /* CHECK, WAIT, CANCEL_WAIT, WATCH_KEY (registered) */
    TCPSTORE_REPLY_U32,   /* PING */
    TCPSTORE_REPLY_I64,   /* ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN */
    TCPSTORE_REPLY_BYTES, /* GET, COMPARE_SET, each key of MULTI_GET */
    TCPSTORE_REPLY_QPOP,  /* QUEUE_POP: i64 length before the pop, then the value if it was > 0 */
    TCPSTORE_REPLY_LIST,  /* LIST: i64 n, then n strings */
    TCPSTORE_REPLY_WATCH, /* a V1 watch event: u8 kind, key, old value, new value */
};

struct tcpstore_reply {
    uint8_t u8;
    uint32_t u32;
    int64_t i64;
    struct tcpstore_bytes val; /* BYTES, QPOP (when i64 > 0), WATCH: the new value */
    struct tcpstore_bytes key; /* WATCH */
    struct tcpstore_bytes old; /* WATCH */
    const uint8_t *items;      /* LIST: walk with tcpstore_reply_next */
    size_t items_len, nitems;
};

/* Decodes one reply of the given shape; returns as tcpstore_decode (no
 * EPROTO_* errors: a reply has no type byte). */
int tcpstore_decode_reply(const struct tcpstore_limits *lim, enum tcpstore_reply_shape shape,
                          const uint8_t *buf, size_t len, struct tcpstore_reply *r, size_t *used,
                          size_t *need);

/* Walks a LIST reply's keys. */
bool tcpstore_reply_next(const struct tcpstore_reply *r, size_t *pos, struct tcpstore_bytes *key);

#endif
