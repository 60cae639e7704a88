/* client_kv.c: the agent's rendezvous client's key-value calls (see
 * client.h): the run's store, one request each, and torch's exit barrier
 * made of them. Everything here goes through rdzv_client_request
 * (client_request.h); the connection, its losses and the matching of
 * results to requests are client.c's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "proto/msg.h"
#include "rendezvous/client.h"
#include "rendezvous/client_request.h"

int rdzv_client_set(struct rdzv_client *c, const char *key, const void *val, size_t len,
                    rdzv_store_cb cb, void *arg)
{
    struct proto_msg m = {.type = PROTO_SET};
    m.set.key = key;
    m.set.value = (struct proto_bytes){val, len};
    return rdzv_client_request(c, &m, cb, arg);
}

int rdzv_client_get(struct rdzv_client *c, const char *key, int64_t timeout_ms, rdzv_store_cb cb,
                    void *arg)
{
    struct proto_msg m = {.type = PROTO_GET};
    m.get.key = key;
    m.get.timeout_ms = timeout_ms;
    return rdzv_client_request(c, &m, cb, arg);
}

int rdzv_client_wait(struct rdzv_client *c, const char *const *keys, size_t n, int64_t timeout_ms,
                     rdzv_store_cb cb, void *arg)
{
    struct proto_msg m = {.type = PROTO_WAIT};
    m.wait.keys = keys;
    m.wait.nkeys = n;
    m.wait.timeout_ms = timeout_ms;
    return rdzv_client_request(c, &m, cb, arg);
}

int rdzv_client_add(struct rdzv_client *c, const char *key, int64_t delta, rdzv_store_cb cb,
                    void *arg)
{
    struct proto_msg m = {.type = PROTO_ADD};
    m.add.key = key;
    m.add.delta = delta;
    return rdzv_client_request(c, &m, cb, arg);
}

int rdzv_client_compare_set(struct rdzv_client *c, const char *key, const void *expected,
                            size_t elen, const void *desired, size_t dlen, rdzv_store_cb cb,
                            void *arg)
{
    struct proto_msg m = {.type = PROTO_COMPARE_SET};
    m.compare_set.key = key;
    m.compare_set.expected = (struct proto_bytes){expected, elen};
    m.compare_set.desired = (struct proto_bytes){desired, dlen};
    return rdzv_client_request(c, &m, cb, arg);
}

/* ---- the exit barrier: add -> (set) -> wait ---- */

struct barrier {
    int n;
    int64_t timeout_ms;
    rdzv_done_cb cb;
    void *arg;
    char members[PROTO_MAX_KEY + 1];
    char last[PROTO_MAX_KEY + 1];
};

static void barrier_done(struct rdzv_client *c, struct barrier *b, int status)
{
    rdzv_done_cb cb = b->cb;
    void *arg = b->arg;
    free(b);
    cb(c, status, arg);
}

static void barrier_waited(struct rdzv_client *c, int status, const struct rdzv_store_result *r,
                           void *arg)
{
    (void)r;
    barrier_done(c, arg, status);
}

static void barrier_wait(struct rdzv_client *c, struct barrier *b)
{
    const char *keys[1] = {b->last};
    int rc = rdzv_client_wait(c, keys, 1, b->timeout_ms, barrier_waited, b);
    if (rc)
        barrier_done(c, b, rc);
}

static void barrier_set(struct rdzv_client *c, int status, const struct rdzv_store_result *r,
                        void *arg)
{
    (void)r;
    struct barrier *b = arg;
    if (status)
        barrier_done(c, b, status);
    else
        barrier_wait(c, b);
}

static void barrier_added(struct rdzv_client *c, int status, const struct rdzv_store_result *r,
                          void *arg)
{
    struct barrier *b = arg;
    if (status) {
        barrier_done(c, b, status);
        return;
    }
    if (r->number == b->n) {
        int rc = rdzv_client_set(c, b->last, "1", 1, barrier_set, b);
        if (rc)
            barrier_done(c, b, rc);
        return;
    }
    barrier_wait(c, b);
}

int rdzv_client_barrier(struct rdzv_client *c, const char *prefix, int n, int64_t timeout_ms,
                        rdzv_done_cb cb, void *arg)
{
    if (n < 1 || strlen(prefix) + 16 > PROTO_MAX_KEY)
        return CDDP_ECONFIG;
    struct barrier *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    b->n = n;
    b->timeout_ms = timeout_ms;
    b->cb = cb;
    b->arg = arg;
    snprintf(b->members, sizeof(b->members), "%s/num_members", prefix);
    snprintf(b->last, sizeof(b->last), "%s/last_member", prefix);
    int rc = rdzv_client_add(c, b->members, 1, barrier_added, b);
    if (rc)
        free(b);
    return rc;
}
