/*
 * kvstore.h: the key-value store engine behind every cddp store (the
 * rendezvous server's per-job store, the trainer's bootstrap store).
 *
 * Pure: no I/O and no clock. Operations that complete at once return their
 * result; a wait that cannot complete is registered as a waiter with an
 * owner (one per client connection, embedded by the caller) and a deadline
 * in the caller's clock. Later operations and kvstore_expire() turn
 * waiters into events, which the caller drains with kvstore_next_event()
 * after each call and answers on the wire.
 *
 * Semantics follow torch's TCPStore where it has them:
 *  - values are bytes; add() keeps a decimal integer (a missing key counts 0);
 *  - compare_set(key, expected, desired): a missing key with an empty
 *    expected value is set; a missing key with a non-empty expected value is
 *    left missing and expected is returned; a present key equal to expected
 *    is replaced; the call returns the value the key holds afterwards (or
 *    expected, as said);
 *  - wait(keys) completes when every key has a value (or, for torch 2.x's
 *    queues, a non-empty queue of that name: a push wakes one waiter).
 *
 * The TCPStore server (tcpstore.h) also uses the additions delete, append,
 * check, the queues (a queue and a value may share a name, as in torch's
 * libuv store; they are separate) and add64 (TCPStore's int64 range rather
 * than the JSON protocol's 2^53).
 */
#ifndef CDDP_KVSTORE_H
#define CDDP_KVSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/queue.h"

#define KVSTORE_NEVER UINT64_MAX

struct kvstore_limits {
    size_t max_bytes;   /* keys + values + bookkeeping; 0: 256 MiB */
    size_t max_keys;    /* 0: 1,000,000 */
    size_t max_waiters; /* per owner; 0: 1024 */
};

/* One per client (connection). Embed it, init it, and cancel it with
 * kvstore_cancel_owner() before it goes away. */
struct kvstore_owner {
    struct cddp_queue waiters;
    size_t nwaiters;
};

static inline void kvstore_owner_init(struct kvstore_owner *o)
{
    cddp_queue_init(&o->waiters);
    o->nwaiters = 0;
}

enum kvstore_event_kind {
    KVSTORE_READY = 1, /* every key of the wait is set */
    KVSTORE_TIMEOUT,   /* the deadline passed first */
};

struct kvstore_event {
    enum kvstore_event_kind kind;
    struct kvstore_owner *owner;
    uint64_t req_id;
    bool is_get;     /* the waiter was a get: answer with the value of key */
    const char *key; /* READY and is_get: valid until the next call into the store */
};

struct kvstore;

/* A new store. seed0/seed1 key the hash (pick them at random). NULL on ENOMEM. */
struct kvstore *kvstore_new(const struct kvstore_limits *lim, uint64_t seed0, uint64_t seed1);
/* Frees the store and every waiter (no events). Owners are left empty. */
void kvstore_free(struct kvstore *s);

/* 0, CDDP_ETOOBIG (the store's byte or key limit) or -ENOMEM. */
int kvstore_set(struct kvstore *s, const char *key, const void *val, size_t vlen);

/* 0 with *val (valid until the next call) or CDDP_ENOTFOUND. */
int kvstore_get(struct kvstore *s, const char *key, const void **val, size_t *vlen);

/* Adds delta to the integer in key; *out is the new value. CDDP_EPARSE if
 * the key holds something else, CDDP_ERANGE_ARG past +-2^53, CDDP_ETOOBIG, -ENOMEM. */
int kvstore_add(struct kvstore *s, const char *key, int64_t delta, int64_t *out);

/* See the top of this file. The result (cur, curlen) is valid until the next call. */
int kvstore_compare_set(struct kvstore *s, const char *key, const void *expected, size_t elen,
                        const void *desired, size_t dlen, const void **cur, size_t *curlen);

/* Waits for every key to have a value. If they all have one, returns 0 with
 * *ready = true and registers nothing. Otherwise registers a waiter for
 * owner/req_id until deadline (KVSTORE_NEVER: none) and returns 0 with
 * *ready = false. is_get (n must be 1): the event asks for the key's value.
 * CDDP_ETOOBIG when the owner has too many waiters, -ENOMEM. */
int kvstore_wait(struct kvstore *s, const char *const *keys, size_t n, uint64_t deadline,
                 struct kvstore_owner *owner, uint64_t req_id, bool is_get, bool *ready);

/* Times out every waiter whose deadline is <= now. */
void kvstore_expire(struct kvstore *s, uint64_t now);

/* The earliest waiter deadline, or KVSTORE_NEVER. */
uint64_t kvstore_next_deadline(const struct kvstore *s);

/* Pops the next event; false when there is none. */
bool kvstore_next_event(struct kvstore *s, struct kvstore_event *ev);

/* Drops every waiter (and pending event) of owner, without events. */
void kvstore_cancel_owner(struct kvstore *s, struct kvstore_owner *owner);

/* As kvstore_add, over the whole int64 range (TCPStore's ADD). */
int kvstore_add64(struct kvstore *s, const char *key, int64_t delta, int64_t *out);

/* Removes key's value: 1 if it had one, 0 if not. Waiters stay. */
int kvstore_delete(struct kvstore *s, const char *key);

/* Appends to key's value (sets it when missing) and wakes its waiters.
 * 0, CDDP_ETOOBIG, -ENOMEM. */
int kvstore_append(struct kvstore *s, const char *key, const void *val, size_t vlen);

/* Whether every key has a value or a non-empty queue; registers nothing. */
bool kvstore_check(const struct kvstore *s, const char *const *keys, size_t n);

/* Appends a copy of val to the queue named key and wakes the oldest waiter
 * on key (only that one). 0, CDDP_ETOOBIG, -ENOMEM. */
int kvstore_queue_push(struct kvstore *s, const char *key, const void *val, size_t vlen);

/* Takes the oldest item of queue key: 0 with *val (malloc'd, NUL after the
 * bytes; the caller frees it) and *vlen, or CDDP_ENOTFOUND when empty.
 * *len_before: the queue's length before the pop. */
int kvstore_queue_pop(struct kvstore *s, const char *key, void **val, size_t *vlen,
                      size_t *len_before);

size_t kvstore_queue_len(const struct kvstore *s, const char *key);

/* Iterates the keys that have a value: size_t it = 0; while (next(s, &it, &k, &kl)) ...
 * The store must not change during an iteration. */
bool kvstore_next_key(const struct kvstore *s, size_t *iter, const char **key, size_t *klen);

/* Keys with a value (queues not counted). */
size_t kvstore_num_keys(const struct kvstore *s);
size_t kvstore_bytes(const struct kvstore *s);

#endif
