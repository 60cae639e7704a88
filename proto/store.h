/*
 * store.h: the key-value store engine behind every cddp store (the
 * rendezvous server's per-job store, the trainer's bootstrap store).
 *
 * Pure: no I/O and no clock. Operations that complete at once return their
 * result; a wait that cannot complete is registered as a waiter with an
 * owner (one per client connection, embedded by the caller) and a deadline
 * in the caller's clock. Later operations and proto_store_expire() turn
 * waiters into events, which the caller drains with proto_store_next_event()
 * after each call and answers on the wire.
 *
 * Semantics follow torch's TCPStore where it has them:
 *  - values are bytes; add() keeps a decimal integer (a missing key counts 0);
 *  - compare_set(key, expected, desired): a missing key with an empty
 *    expected value is set; a missing key with a non-empty expected value is
 *    left missing and expected is returned; a present key equal to expected
 *    is replaced; the call returns the value the key holds afterwards (or
 *    expected, as said);
 *  - wait(keys) completes when every key has a value.
 */
#ifndef CDDP_PROTO_STORE_H
#define CDDP_PROTO_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/queue.h"

#define PROTO_STORE_NEVER UINT64_MAX

struct proto_store_limits {
    size_t max_bytes;   /* keys + values + bookkeeping; 0: 256 MiB */
    size_t max_keys;    /* 0: 1,000,000 */
    size_t max_waiters; /* per owner; 0: 1024 */
};

/* One per client (connection). Embed it, init it, and cancel it with
 * proto_store_cancel_owner() before it goes away. */
struct proto_store_owner {
    struct cddp_queue waiters;
    size_t nwaiters;
};

static inline void proto_store_owner_init(struct proto_store_owner *o)
{
    cddp_queue_init(&o->waiters);
    o->nwaiters = 0;
}

enum proto_store_event_kind {
    PROTO_STORE_READY = 1, /* every key of the wait is set */
    PROTO_STORE_TIMEOUT,   /* the deadline passed first */
};

struct proto_store_event {
    enum proto_store_event_kind kind;
    struct proto_store_owner *owner;
    uint64_t req_id;
    bool is_get;     /* the waiter was a get: answer with the value of key */
    const char *key; /* READY and is_get: valid until the next call into the store */
};

struct proto_store;

/* A new store. seed0/seed1 key the hash (pick them at random). NULL on ENOMEM. */
struct proto_store *proto_store_new(const struct proto_store_limits *lim, uint64_t seed0,
                                    uint64_t seed1);
/* Frees the store and every waiter (no events). Owners are left empty. */
void proto_store_free(struct proto_store *s);

/* 0, CDDP_ETOOBIG (the store's byte or key limit) or -ENOMEM. */
int proto_store_set(struct proto_store *s, const char *key, const void *val, size_t vlen);

/* 0 with *val (valid until the next call) or CDDP_ENOTFOUND. */
int proto_store_get(struct proto_store *s, const char *key, const void **val, size_t *vlen);

/* Adds delta to the integer in key; *out is the new value. CDDP_EPARSE if
 * the key holds something else, CDDP_ERANGE_ARG past +-2^53, CDDP_ETOOBIG, -ENOMEM. */
int proto_store_add(struct proto_store *s, const char *key, int64_t delta, int64_t *out);

/* See the top of this file. The result (cur, curlen) is valid until the next call. */
int proto_store_compare_set(struct proto_store *s, const char *key, const void *expected,
                            size_t elen, const void *desired, size_t dlen, const void **cur,
                            size_t *curlen);

/* Waits for every key to have a value. If they all have one, returns 0 with
 * *ready = true and registers nothing. Otherwise registers a waiter for
 * owner/req_id until deadline (PROTO_STORE_NEVER: none) and returns 0 with
 * *ready = false. is_get (n must be 1): the event asks for the key's value.
 * CDDP_ETOOBIG when the owner has too many waiters, -ENOMEM. */
int proto_store_wait(struct proto_store *s, const char *const *keys, size_t n, uint64_t deadline,
                     struct proto_store_owner *owner, uint64_t req_id, bool is_get, bool *ready);

/* Times out every waiter whose deadline is <= now. */
void proto_store_expire(struct proto_store *s, uint64_t now);

/* The earliest waiter deadline, or PROTO_STORE_NEVER. */
uint64_t proto_store_next_deadline(const struct proto_store *s);

/* Pops the next event; false when there is none. */
bool proto_store_next_event(struct proto_store *s, struct proto_store_event *ev);

/* Drops every waiter (and pending event) of owner, without events. */
void proto_store_cancel_owner(struct proto_store *s, struct proto_store_owner *owner);

size_t proto_store_num_keys(const struct proto_store *s);
size_t proto_store_bytes(const struct proto_store *s);

#endif
