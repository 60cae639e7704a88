/*
 * bootstrap.h: from torchrun's environment to a connected communicator.
 *
 *   1. read RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (env.h);
 *      none set: world size 1, nothing to connect;
 *   2. rank 0 serves the bootstrap store on MASTER_ADDR:MASTER_PORT: torch's
 *      TCPStore (store/tcpstore_thread.h: store/tcpstore.c on a thread of
 *      its own); every rank, rank 0 included, connects to it with
 *      store/tcpstore_client.h, with backoff until --init-timeout;
 *   3. sanity through the store: no RANK claimed twice, one WORLD_SIZE;
 *   4. the communicator connects its mesh through the store (comm.h), and a
 *      barrier confirms every rank is connected.
 * A wrong or unreachable address is an error after --init-timeout, never a
 * hang. TORCHELASTIC_USE_AGENT_STORE=True (cddprun by default, torchrun's
 * static rendezvous, torchrun >= 2.4) means the launcher's agent already
 * serves torch's TCPStore on MASTER_PORT: rank 0 then serves nothing and
 * every rank connects to the agent's store with the same client, its keys
 * under "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/" as torch's env://
 * does (an agent that keeps one store across restarts, as torch 1.13's,
 * still shows each attempt a clean namespace). Either way the workers
 * speak one store protocol (docs/distributed.md, "One store protocol").
 */
#ifndef CDDP_TRAINER_COMM_BOOTSTRAP_H
#define CDDP_TRAINER_COMM_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>

#include "trainer/comm/comm.h"
#include "trainer/comm/env.h"

#define TRN_DEFAULT_INIT_TIMEOUT_S 300.0

struct tcpstore_thread;
struct tcpstore_client;

struct trn_dist_options {
    double init_timeout_s;       /* <= 0: TRN_DEFAULT_INIT_TIMEOUT_S */
    double collective_timeout_s; /* <= 0: TRN_COMM_DEFAULT_TIMEOUT_S */
    const char *backend;         /* NULL: "gloo" */
    /* nccl: the CUDA device and the compute stream (trn_comm_options). */
    int cuda_device;
    void *cuda_stream;
    /* --restart_scope=worker's replacement (CDDP_GENERATION > 0): connect
     * to the agent's store only; the communicator comes from
     * trn_dist_reform (the survivors are not in trn_dist_init). */
    long generation;
    /* --restart_scope=worker: gloo publishes its progress too (a second
     * store connection), so a collective that times out can name the
     * ranks that never reached it (trn_comm_missing). */
    bool name_missing;
    /* --restart_scope=worker: nccl's watchdog aborts the communicator and
     * the next call returns its error instead of ending the rank
     * (trn_comm_options.recoverable). */
    bool recoverable;
};

/* store/tcpstore_client.h's client as the communicator's struct trn_kv. */
struct trn_tcpstore_kv {
    struct trn_kv kv; /* first */
    struct tcpstore_client *client;
    bool agent;      /* the launcher's store (its errors say so) */
    char prefix[48]; /* "/worker/attempt_N/" in the agent's store; "" in rank 0's */
};

struct trn_dist {
    struct trn_dist_env env;
    struct trn_comm *comm;
    struct tcpstore_thread *server; /* rank 0, without an agent's store */
    struct trn_tcpstore_kv store;   /* rank 0's store or the agent's */
    /* nccl, and gloo with name_missing: a second connection to the same
     * store for the communicator's progress (trn_comm_options.progress_kv),
     * or none. */
    struct trn_tcpstore_kv progress_store;
};

/* Fills *d. lookup is getenv (or a table in tests). On failure returns a
 * negative code with one line in err, and *d holds nothing to close:
 * CDDP_ECONFIG / CDDP_EPARSE / CDDP_ERANGE_ARG for a bad environment (a
 * usage error), anything else for a failure to connect. */
int trn_dist_init(struct trn_dist *d, const struct trn_dist_options *o,
                  char *(*lookup)(const char *name), char *err, size_t errlen);

/* Destroys the communicator, then the client, then (rank 0) the store. */
void trn_dist_close(struct trn_dist *d);

/*
 * Recovering in place (--restart_scope=worker; docs/distributed.md). The
 * agent announces generation N on its store as the bare keys
 * "cddp/gen/N/replaced" (the global ranks it restarted, "3" or "1,3")
 * and then "cddp/gen" (N); these calls read them and re-form the group.
 *
 * trn_dist_wait_generation: waits up to timeout_s for the generation after
 * `after`, and returns the newest one announced in *gen and the lowest
 * rank it did not replace in *root (who holds the state). 0, or a code
 * with err filled (CDDP_ETIMEOUT: none came; CDDP_ECONFIG: not the
 * agent's store).
 *
 * trn_dist_reform: drops the communicator (a broken one included; nccl:
 * ncclCommAbort, the CUDA context and device buffers stay) and
 * connects a new one through the store under "cddp/gen/N/" keys, then a
 * barrier: every rank of the world, survivors and replacements, calls it
 * with the same N. 0, or a code with err filled.
 */
int trn_dist_wait_generation(struct trn_dist *d, long after, double timeout_s, long *gen, int *root,
                             char *err, size_t errlen);
int trn_dist_reform(struct trn_dist *d, const struct trn_dist_options *o, long gen, char *err,
                    size_t errlen);

#endif
