/* bootstrap.c: environment -> store -> communicator; see bootstrap.h. */
#include "trainer/comm/bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/hostport.h"
#include "common/log.h"
#include "store/tcpstore_client.h"
#include "store/tcpstore_thread.h"

static double left_s(uint64_t deadline)
{
    uint64_t now = cddp_mono_ns();
    return now >= deadline ? 0.001 : (double)(deadline - now) * 1e-9;
}

static void nap_ms(uint64_t ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the store client as a struct trn_kv ---- */

static int prefixed(struct trn_tcpstore_kv *s, const char *key, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "%s%s", s->prefix, key);
    if (n < 0 || (size_t)n >= outlen) {
        snprintf(s->kv.err, sizeof(s->kv.err), "store key '%.200s' is too long", key);
        return CDDP_ETOOBIG;
    }
    return 0;
}

static const char *store_name(const struct trn_tcpstore_kv *s)
{
    return s->agent ? "agent store" : "store";
}

static int tkv_set(struct trn_kv *kv, const char *key, const void *val, size_t len)
{
    struct trn_tcpstore_kv *s = (struct trn_tcpstore_kv *)kv;
    char k[512];
    int rc = prefixed(s, key, k, sizeof(k));
    if (rc == 0 && (rc = tcpstore_client_set(s->client, k, val, len)) != 0)
        snprintf(kv->err, sizeof(kv->err), "%s set '%s': %s", store_name(s), k,
                 tcpstore_client_last_error(s->client));
    return rc;
}

static int tkv_get(struct trn_kv *kv, const char *key, double timeout_s, void **val, size_t *len)
{
    struct trn_tcpstore_kv *s = (struct trn_tcpstore_kv *)kv;
    char k[512];
    int rc = prefixed(s, key, k, sizeof(k));
    if (rc == 0 && (rc = tcpstore_client_get(s->client, k, timeout_s, val, len)) != 0) {
        /* In rank 0's store a key that never came is said as it is. */
        if (rc == CDDP_ETIMEOUT && !s->agent)
            snprintf(kv->err, sizeof(kv->err), "%s", tcpstore_client_last_error(s->client));
        else
            snprintf(kv->err, sizeof(kv->err), "%s get '%s': %s", store_name(s), k,
                     tcpstore_client_last_error(s->client));
    }
    return rc;
}

static int tkv_add(struct trn_kv *kv, const char *key, long delta, long *out)
{
    struct trn_tcpstore_kv *s = (struct trn_tcpstore_kv *)kv;
    char k[512];
    int64_t v = 0;
    int rc = prefixed(s, key, k, sizeof(k));
    if (rc == 0 && (rc = tcpstore_client_add(s->client, k, delta, &v)) != 0)
        snprintf(kv->err, sizeof(kv->err), "%s add '%s': %s", store_name(s), k,
                 tcpstore_client_last_error(s->client));
    else if (rc == 0)
        *out = (long)v;
    return rc;
}

static const struct trn_kv_ops tcpstore_kv_ops = {tkv_set, tkv_get, tkv_add};

/* Connects s to the store at MASTER_ADDR:MASTER_PORT. In rank 0's store
 * (ours: it numbers the queries as torch 1.13 does, and knows CANCEL_WAIT)
 * the keys are bare, as the store lives for one attempt; in the agent's
 * they go under torch's per-attempt prefix. */
static int connect_kv(struct trn_dist *d, struct trn_tcpstore_kv *s,
                      const struct tcpstore_client_options *o, char *why, size_t whylen)
{
    s->agent = d->env.use_agent_store;
    int rc =
        tcpstore_client_connect(d->env.master_addr, d->env.master_port, o, &s->client, why, whylen);
    if (rc) {
        s->client = NULL;
        return rc;
    }
    s->kv.ops = &tcpstore_kv_ops;
    s->prefix[0] = '\0';
    if (s->agent)
        snprintf(s->prefix, sizeof(s->prefix), "/worker/attempt_%ld/", d->env.restart_count);
    return 0;
}

/* TORCHELASTIC_USE_AGENT_STORE=True: the launcher's agent serves it. */
static int connect_agent_store(struct trn_dist *d, uint64_t deadline, char *err, size_t errlen)
{
    char ep[300];
    cddp_hostport_format(d->env.master_addr, d->env.master_port, ep, sizeof(ep));
    char why[512];
    struct tcpstore_client_options o = {.connect_timeout_s = left_s(deadline)};
    int rc = connect_kv(d, &d->store, &o, why, sizeof(why));
    if (rc) {
        snprintf(err, errlen,
                 "TORCHELASTIC_USE_AGENT_STORE=True, but the launcher's TCPStore at %s did not "
                 "answer: %s",
                 ep, why);
        return rc == CDDP_EPARSE ? CDDP_ENOTFOUND : rc;
    }
    log_debug("T6031", "connected to the agent's TCPStore at %s (%s)", ep,
              tcpstore_client_dialect(d->store.client));
    return 0;
}

/* nccl, gloo with name_missing: the progress connection (progress.h). Best effort: without it a
 * timeout just names no ranks. Short operation timeouts, so the thread
 * that uses it is never held long by a store that went away. */
static struct trn_kv *connect_progress(struct trn_dist *d, uint64_t deadline)
{
    char why[512];
    struct tcpstore_client_options o = {.connect_timeout_s = 5};
    if (d->env.use_agent_store) {
        if (left_s(deadline) < 5)
            o.connect_timeout_s = left_s(deadline);
    } else {
        o.op_timeout_s = 2;
        o.dialect = TCPSTORE_DIALECT_V1;
        o.cancel_waits = true;
    }
    if (connect_kv(d, &d->progress_store, &o, why, sizeof(why)) != 0) {
        log_debug("T2107", "no progress connection to the %s: %s",
                  d->env.use_agent_store ? "agent's store" : "bootstrap store", why);
        return NULL;
    }
    return &d->progress_store.kv;
}

/* ---- serving (rank 0) ---- */

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* MASTER_ADDR names how the others reach rank 0, not necessarily one of its
 * own addresses: bind it only when it is loopback (then nothing else could
 * reach us anyway), else every interface, as torch's TCPStore does. */
static bool loopback_only(const char *host)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || res == NULL)
        return false;
    bool only = true;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
        only = only && is_loopback(ai->ai_addr);
    freeaddrinfo(res);
    return only;
}

/* Starts the store; while the port is held (the previous attempt's rank 0
 * still exiting), retries until the deadline. */
static int serve(struct trn_dist *d, uint64_t deadline, char *err, size_t errlen)
{
    const char *host = d->env.master_addr, *bind_host = loopback_only(host) ? host : NULL;
    uint64_t backoff = 50;
    int rc;
    char why[256];
    for (;;) {
        rc = tcpstore_thread_start(bind_host, d->env.master_port, &d->server, NULL, why,
                                   sizeof(why));
        if (rc != CDDP_ERR_FROM_ERRNO(EADDRINUSE) || cddp_mono_ns() >= deadline)
            break;
        nap_ms(backoff);
        backoff = backoff < 1000 ? backoff * 2 : 1000;
    }
    if (rc == 0) {
        log_info("T6021", "bootstrap store serving on %s port %d", bind_host ? bind_host : "*",
                 d->env.master_port);
        return 0;
    }
    char ep[300];
    cddp_hostport_format(host, d->env.master_port, ep, sizeof(ep));
    snprintf(err, errlen, "cannot serve the bootstrap store on %s: %s%s", ep, why,
             rc == CDDP_ERR_FROM_ERRNO(EADDRINUSE)
                 ? " (another process holds MASTER_PORT; with TORCHELASTIC_USE_AGENT_STORE=True "
                   "the launcher does)"
                 : "");
    return rc;
}

/* ---- connecting (every rank) ---- */

static int connect_store(struct trn_dist *d, uint64_t deadline, char *err, size_t errlen)
{
    const char *host = d->env.master_addr;
    int port = d->env.master_port;
    char ep[300];
    cddp_hostport_format(host, port, ep, sizeof(ep));
    uint64_t t0 = cddp_mono_ns();
    char why[512];
    int rc;
    /* A name that does not resolve yet (a pod whose DNS record is still on
     * its way) is retried like a refused connection. */
    for (;;) {
        struct tcpstore_client_options o = {
            .connect_timeout_s = left_s(deadline),
            .op_timeout_s = left_s(deadline),
            .dialect = TCPSTORE_DIALECT_V1,
            .cancel_waits = true,
        };
        rc = connect_kv(d, &d->store, &o, why, sizeof(why));
        if (rc != CDDP_EPARSE || cddp_mono_ns() + 1000000000u >= deadline)
            break;
        nap_ms(1000);
    }
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    if (rc == 0) {
        log_debug("T6030", "connected to the bootstrap store at %s in %.3f s", ep, took);
        return 0;
    }
    if (rc == CDDP_EPARSE)
        rc = CDDP_ENOTFOUND; /* a name that never resolved: not a usage error */
    if (strstr(why, "cannot connect") != NULL || strstr(why, "cannot resolve") != NULL)
        snprintf(err, errlen,
                 "cannot reach the bootstrap store at %s within %.1f s (last: %s); is rank 0 "
                 "running, and are MASTER_ADDR and MASTER_PORT right?",
                 ep, took, why);
    else
        snprintf(err, errlen, "%s is not a cddp bootstrap store, or it did not answer: %s", ep,
                 why);
    return rc;
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

/* The communicator's options from the environment and the trainer's;
 * restart_count names the attempt (or generation) its keys belong to. */
static struct trn_comm_options comm_options(const struct trn_dist *d,
                                            const struct trn_dist_options *o, long restart_count)
{
    return (struct trn_comm_options){
        .rank = d->env.rank,
        .world = d->env.world,
        .timeout_s = o->collective_timeout_s,
        .init_timeout_s = o->init_timeout_s > 0 ? o->init_timeout_s : TRN_DEFAULT_INIT_TIMEOUT_S,
        .backend = o->backend,
        .route_to = d->env.master_addr,
        .cuda_device = o->cuda_device,
        .cuda_stream = o->cuda_stream,
        .restart_count = restart_count,
        .rdzv_round = d->env.rdzv_round,
        .recoverable = o->recoverable,
    };
}

int trn_dist_init(struct trn_dist *d, const struct trn_dist_options *o,
                  char *(*lookup)(const char *name), char *err, size_t errlen)
{
    memset(d, 0, sizeof(*d));
    int rc = trn_dist_env_read(&d->env, lookup, err, errlen);
    if (rc)
        return rc;
    struct trn_comm_options co = comm_options(d, o, d->env.restart_count);
    uint64_t deadline = cddp_mono_ns() + (uint64_t)(co.init_timeout_s * 1e9);
    struct trn_comm_error ce;
    if (o->generation > 0 && d->env.world > 1) {
        /* A replacement: the store now, the communicator with the others
         * in trn_dist_reform. */
        if (!d->env.use_agent_store) {
            snprintf(err, errlen,
                     "CDDP_GENERATION=%ld: re-forming in place needs the agent's "
                     "store (TORCHELASTIC_USE_AGENT_STORE=True)",
                     o->generation);
            return CDDP_ECONFIG;
        }
        rc = connect_agent_store(d, deadline, err, errlen);
        if (rc)
            trn_dist_close(d);
        return rc;
    }
    if (d->env.world == 1) {
        rc = trn_comm_create(&co, NULL, &d->comm, &ce);
        if (rc)
            snprintf(err, errlen, "%s", ce.detail);
        return rc;
    }
    struct trn_kv *kv = &d->store.kv;
    if (d->env.use_agent_store) {
        rc = connect_agent_store(d, deadline, err, errlen);
    } else {
        if (d->env.rank == 0)
            rc = serve(d, deadline, err, errlen);
        if (rc == 0)
            rc = connect_store(d, deadline, err, errlen);
    }
    if (rc)
        goto fail;
    rc = check_membership(d, kv, deadline, err, errlen);
    if (rc)
        goto fail;
    co.init_timeout_s = left_s(deadline);
    if ((o->backend != NULL && strcmp(o->backend, "nccl") == 0) || o->name_missing)
        co.progress_kv = connect_progress(d, deadline);
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
    tcpstore_client_close(d->store.client);
    tcpstore_client_close(d->progress_store.client);
    tcpstore_thread_stop(d->server);
    d->comm = NULL;
    d->store.client = NULL;
    d->progress_store.client = NULL;
    d->server = NULL;
}

/* ---- recovering in place (--restart_scope=worker) ---- */

/* Key as torch's TCPStore names it ("/" + key), not under the attempt's
 * prefix (a replacement's TORCHELASTIC_RESTART_COUNT differs from the
 * survivors'). */
static int bare_get(struct trn_dist *d, const char *key, double timeout_s, char *out, size_t len)
{
    void *val = NULL;
    size_t n = 0;
    char k[128];
    snprintf(k, sizeof(k), "/%s", key);
    int rc = tcpstore_client_get(d->store.client, k, timeout_s, &val, &n);
    if (rc)
        return rc;
    if (n >= len)
        n = len - 1;
    memcpy(out, val, n);
    out[n] = '\0';
    free(val);
    return 0;
}

int trn_dist_wait_generation(struct trn_dist *d, long after, double timeout_s, long *gen, int *root,
                             char *err, size_t errlen)
{
    if (d->store.client == NULL || !d->store.agent) {
        snprintf(err, errlen,
                 "re-forming in place needs the agent's store "
                 "(TORCHELASTIC_USE_AGENT_STORE=True)");
        return CDDP_ECONFIG;
    }
    char key[64], val[256];
    snprintf(key, sizeof(key), "cddp/gen/%ld/replaced", after + 1);
    int rc = bare_get(d, key, timeout_s, val, sizeof(val));
    if (rc == 0)
        rc = bare_get(d, "cddp/gen", timeout_s, val, sizeof(val));
    if (rc) {
        snprintf(err, errlen, "generation %ld did not come within %.1f s: %s", after + 1, timeout_s,
                 tcpstore_client_last_error(d->store.client));
        return rc;
    }
    char *end;
    long g = strtol(val, &end, 10);
    if (end == val || g <= after) {
        snprintf(err, errlen, "the agent store's cddp/gen is '%.32s', not a generation after %ld",
                 val, after);
        return CDDP_EPARSE;
    }
    snprintf(key, sizeof(key), "cddp/gen/%ld/replaced", g);
    if ((rc = bare_get(d, key, timeout_s, val, sizeof(val))) != 0) {
        snprintf(err, errlen, "%s: %s", key, tcpstore_client_last_error(d->store.client));
        return rc;
    }
    /* The lowest rank not replaced holds the state. */
    bool replaced[4096] = {false};
    for (char *p = val; *p;) {
        long r = strtol(p, &end, 10);
        if (end == p || r < 0 || r >= d->env.world || r >= 4096) {
            snprintf(err, errlen, "%s is '%.64s', not a list of ranks", key, val);
            return CDDP_EPARSE;
        }
        replaced[r] = true;
        p = *end == ',' ? end + 1 : end;
    }
    int lowest = -1;
    for (int r = 0; r < d->env.world && r < 4096 && lowest < 0; r++)
        if (!replaced[r])
            lowest = r;
    if (lowest < 0) {
        snprintf(err, errlen, "generation %ld replaced every rank: no state to take", g);
        return CDDP_ESTATE;
    }
    *gen = g;
    *root = lowest;
    return 0;
}

int trn_dist_reform(struct trn_dist *d, const struct trn_dist_options *o, long gen, char *err,
                    size_t errlen)
{
    /* (nccl: an abort, never a finalize that would wait on the dead peer;
     * gloo: a destroy, its failed calls have returned) */
    trn_comm_abort(d->comm);
    d->comm = NULL;
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "/cddp/gen/%ld/gloo", gen);
    /* (restart_count: nccl's unique id under the generation's key) */
    struct trn_comm_options co = comm_options(d, o, gen);
    co.store_prefix = prefix;
    co.generation = gen;
    bool nccl = o->backend != NULL && strcmp(o->backend, "nccl") == 0;
    if (o->name_missing || nccl) {
        /* (a replacement connects it now; the generation's own keys) */
        if (d->progress_store.client == NULL) {
            uint64_t deadline = cddp_mono_ns() + (uint64_t)(co.init_timeout_s * 1e9);
            connect_progress(d, deadline);
        }
        if (d->progress_store.client != NULL) {
            snprintf(d->progress_store.prefix, sizeof(d->progress_store.prefix), "/cddp/gen/%ld/",
                     gen);
            co.progress_kv = &d->progress_store.kv;
        }
    }
    /* The keys are bare: every rank of the generation meets under them. */
    char saved[sizeof(d->store.prefix)];
    memcpy(saved, d->store.prefix, sizeof(saved));
    d->store.prefix[0] = '\0';
    struct trn_comm_error ce;
    int rc = trn_comm_create(&co, &d->store.kv, &d->comm, &ce);
    memcpy(d->store.prefix, saved, sizeof(saved));
    if (rc) {
        snprintf(err, errlen, "re-forming generation %ld: connecting %s failed after %.1f s: %s",
                 gen, o->backend ? o->backend : "gloo", ce.waited_s, ce.detail);
        return rc;
    }
    rc = trn_comm_barrier(d->comm);
    if (rc) {
        snprintf(err, errlen, "re-forming generation %ld: the first barrier failed: %s", gen,
                 trn_comm_last_error(d->comm)->detail);
        return rc;
    }
    return 0;
}
