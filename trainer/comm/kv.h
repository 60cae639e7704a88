/*
 * kv.h: the key-value store a communicator bootstraps through.
 *
 * A small vtable so the communicator does not care who serves the store:
 * the bootstrap store (torch's TCPStore on MASTER_ADDR:MASTER_PORT, served
 * by the launcher's agent or by rank 0; see bootstrap.h), or an in-process
 * table in unit tests.
 * gloo's rendezvous::Store is adapted onto this in gloo_shim.cc.
 *
 * All operations may be called from any one thread at a time (the
 * communicator serialises them). Values are bytes.
 */
#ifndef CDDP_TRAINER_COMM_KV_H
#define CDDP_TRAINER_COMM_KV_H

#include <stddef.h>

struct trn_kv;

struct trn_kv_ops {
    /* Sets key to the len bytes at val (overwrites). 0 or a negative code. */
    int (*set)(struct trn_kv *kv, const char *key, const void *val, size_t len);
    /* Waits up to timeout_s for key to exist, then returns a malloc'd copy
     * of its value in *val (the caller frees it) and its length in *len.
     * 0, CDDP_ETIMEOUT, or another negative code (connection lost, ...). */
    int (*get)(struct trn_kv *kv, const char *key, double timeout_s, void **val, size_t *len);
    /* Adds delta to the integer stored at key (absent = 0) and returns the
     * new value in *out. 0 or a negative code. */
    int (*add)(struct trn_kv *kv, const char *key, long delta, long *out);
};

/* Embed this first in the store's own struct. */
struct trn_kv {
    const struct trn_kv_ops *ops;
    /* Filled by the store on failure: one line naming what went wrong. */
    char err[1024];
};

#endif
