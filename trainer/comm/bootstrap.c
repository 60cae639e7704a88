/* bootstrap.c: environment -> store -> communicator; see bootstrap.h. */
#include "trainer/comm/bootstrap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "trainer/comm/store_client.h"
#include "trainer/comm/store_server.h"

static double left_s(uint64_t deadline)
{
    uint64_t now = cddp_mono_ns();
    return now >= deadline ? 0.001 : (double)(deadline - now) * 1e-9;
}

/* No RANK twice, one WORLD_SIZE: mistakes in hand-made environments that
 * would otherwise show up as a confusing hang inside the mesh set-up. */
static int check_membership(struct trn_dist *d, struct trn_kv *kv, uint64_t deadline, char *err,
                            size_t errlen)
{
    char key[64];
    long n;
    snprintf(key, sizeof(key), "cddp/rank/%d", d->env.rank);
    int rc = kv->ops->add(kv, key, 1, &n);
    if (rc) {
        snprintf(err, errlen, "bootstrap: %s", kv->err);
        return rc;
    }
    if (n > 1) {
        snprintf(err, errlen, "bootstrap: RANK=%d is claimed by %ld workers (each needs its own)",
                 d->env.rank, n);
        return CDDP_EEXISTS;
    }
    char mine[32];
    snprintf(mine, sizeof(mine), "%d", d->env.world);
    if (d->env.rank == 0) {
        rc = kv->ops->set(kv, "cddp/world_size", mine, strlen(mine));
        if (rc)
            snprintf(err, errlen, "bootstrap: %s", kv->err);
        return rc;
    }
    void *val = NULL;
    size_t len = 0;
    rc = kv->ops->get(kv, "cddp/world_size", left_s(deadline), &val, &len);
    if (rc) {
        snprintf(err, errlen, "bootstrap: %s", kv->err);
        return rc;
    }
    bool same = len == strlen(mine) && memcmp(val, mine, len) == 0;
    if (!same)
        snprintf(err, errlen, "bootstrap: WORLD_SIZE=%d here but rank 0 has WORLD_SIZE=%.*s",
                 d->env.world, (int)(len < 16 ? len : 16), (const char *)val);
    free(val);
    return same ? 0 : CDDP_EMISMATCH;
}

int trn_dist_init(struct trn_dist *d, const struct trn_dist_options *o,
                  char *(*lookup)(const char *name), char *err, size_t errlen)
{
    memset(d, 0, sizeof(*d));
    int rc = trn_dist_env_read(&d->env, lookup, err, errlen);
    if (rc)
        return rc;
    double init_s = o->init_timeout_s > 0 ? o->init_timeout_s : TRN_DEFAULT_INIT_TIMEOUT_S;
    uint64_t deadline = cddp_mono_ns() + (uint64_t)(init_s * 1e9);
    struct trn_comm_options co = {
        .rank = d->env.rank,
        .world = d->env.world,
        .timeout_s = o->collective_timeout_s,
        .init_timeout_s = init_s,
        .backend = o->backend,
        .route_to = d->env.master_addr,
    };
    struct trn_comm_error ce;
    if (d->env.world == 1) {
        rc = trn_comm_create(&co, NULL, &d->comm, &ce);
        if (rc)
            snprintf(err, errlen, "%s", ce.detail);
        return rc;
    }
    if (d->env.use_agent_store) {
        snprintf(err, errlen,
                 "TORCHELASTIC_USE_AGENT_STORE=True: the launcher's agent serves torch's TCPStore "
                 "on MASTER_PORT %d, which cddp-train does not speak; launch with cddprun, or "
                 "with torchrun's c10d rendezvous (e.g. --standalone)",
                 d->env.master_port);
        return CDDP_ECONFIG;
    }
    if (d->env.rank == 0) {
        rc = trn_store_server_start(d->env.master_addr, d->env.master_port, init_s, &d->server, err,
                                    errlen);
        if (rc)
            goto fail;
    }
    char who[64];
    snprintf(who, sizeof(who), "cddp-train rank %d", d->env.rank);
    rc = trn_store_client_connect(d->env.master_addr, d->env.master_port, left_s(deadline), who,
                                  &d->client, err, errlen);
    if (rc)
        goto fail;
    struct trn_kv *kv = trn_store_client_kv(d->client);
    rc = check_membership(d, kv, deadline, err, errlen);
    if (rc)
        goto fail;
    co.init_timeout_s = left_s(deadline);
    rc = trn_comm_create(&co, kv, &d->comm, &ce);
    if (rc) {
        snprintf(err, errlen,
                 "bootstrap: connecting %s to the other %d rank(s) failed after %.1f s: %s%s",
                 o->backend ? o->backend : "gloo", d->env.world - 1, ce.waited_s, ce.detail,
                 ce.code == CDDP_ETIMEOUT ? " (a rank never reached the store: did every rank "
                                            "start, with the same MASTER_ADDR and MASTER_PORT?)"
                                          : "");
        goto fail;
    }
    /* Everyone is connected once this returns; the store is idle from here on. */
    rc = trn_comm_barrier(d->comm);
    if (rc) {
        snprintf(err, errlen, "bootstrap: the first barrier failed: %s",
                 trn_comm_last_error(d->comm)->detail);
        goto fail;
    }
    log_info("T6040", "rank %d/%d ready (local rank %d, store %s:%d)", d->env.rank, d->env.world,
             d->env.local_rank, d->env.master_addr, d->env.master_port);
    return 0;
fail:
    trn_dist_close(d);
    return rc;
}

void trn_dist_close(struct trn_dist *d)
{
    trn_comm_destroy(d->comm);
    trn_store_client_close(d->client);
    trn_store_server_stop(d->server);
    d->comm = NULL;
    d->client = NULL;
    d->server = NULL;
}
