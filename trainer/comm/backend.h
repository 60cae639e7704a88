/*
 * backend.h: what a comm backend implements (internal to trainer/comm/).
 *
 * comm.c validates arguments, keeps the first error and the "broken" state,
 * and handles world size 1 itself; a backend only moves bytes. start()
 * queues a validated work item; wait() blocks until it is done (or the
 * backend gives up after the timeout) and returns its rc, with a one-line
 * reason in w->detail on failure.
 */
#ifndef CDDP_TRAINER_COMM_BACKEND_H
#define CDDP_TRAINER_COMM_BACKEND_H

#include "trainer/comm/comm.h"

enum {
    TRN_WORK_IDLE = 0,
    TRN_WORK_QUEUED,
    TRN_WORK_RUNNING,
    TRN_WORK_DONE,
};

struct trn_comm_backend_ops {
    const char *name;
    int (*start)(void *impl, struct trn_comm_work *w);
    int (*wait)(void *impl, struct trn_comm_work *w);
    /* Drains the queue, stops the backend's threads and frees impl. */
    void (*destroy)(void *impl);
    /* NULL for a backend without a watchdog thread (gloo reports through
     * the failing call). */
    void (*set_exit)(void *impl, trn_comm_exit_fn fn, void *arg);
    /* NULL without progress: the ranks that never reached collective seq
     * (trn_comm_missing). */
    int (*missing)(void *impl, uint64_t seq, double budget_s, int *out, int max);
    /* NULL: every wait is synchronous (trn_comm_sync returns 0). On
     * failure it describes the collective that failed in w (coll, seq,
     * detail), as a failing wait does. */
    int (*sync)(void *impl, struct trn_comm_work *w);
    /* NULL: destroy (trn_comm_abort). */
    void (*abort)(void *impl);
    bool on_device; /* buffers are CUDA device memory */
    bool p2p;       /* runs TRN_COLL_SEND and TRN_COLL_RECV (comm.c refuses them otherwise) */
};

/* gloo.c: connects the mesh; on failure returns a negative code with a
 * one-line reason in err. */
int trn_gloo_backend_create(const struct trn_comm_options *o, struct trn_kv *kv, double timeout_s,
                            const struct trn_comm_backend_ops **ops, void **impl, char *err,
                            size_t errlen);

/* nccl.c (built when CUDA and NCCL are: CDDP_HAVE_NCCL): initialises the
 * NCCL communicator through kv (nccl_key.h) and starts its watchdog; on
 * failure returns a negative code with a one-line reason in err. */
int trn_nccl_backend_create(const struct trn_comm_options *o, struct trn_kv *kv, double timeout_s,
                            const struct trn_comm_backend_ops **ops, void **impl, char *err,
                            size_t errlen);
/* cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream): world size
 * 1's allgather on device memory. 0 or a negative code (logged). */
int trn_nccl_copy(void *dst, const void *src, size_t bytes, void *stream);

#endif
