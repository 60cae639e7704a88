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
};

/* gloo.c: connects the mesh; on failure returns a negative code with a
 * one-line reason in err. */
int trn_gloo_backend_create(const struct trn_comm_options *o, struct trn_kv *kv, double timeout_s,
                            const struct trn_comm_backend_ops **ops, void **impl, char *err,
                            size_t errlen);

#endif
