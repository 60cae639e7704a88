/*
 * gloo_shim.h: the C face of gloo_shim.cc, the project's only C++.
 *
 * A thin layer: it turns our store into gloo's rendezvous::Store, connects
 * gloo's TCP transport, runs one collective at a time with gloo's own
 * timeout, and turns gloo's exceptions into our error codes. Threads,
 * queues and policy live in gloo.c.
 */
#ifndef CDDP_TRAINER_COMM_GLOO_SHIM_H
#define CDDP_TRAINER_COMM_GLOO_SHIM_H

#include <stddef.h>

#include "trainer/comm/comm.h"
#include "trainer/comm/kv.h"

#ifdef __cplusplus
extern "C" {
#endif

struct trn_gloo;

struct trn_gloo_config {
    int rank;
    int world;
    const char *host;   /* address to bind (numeric or name); used when iface is NULL */
    const char *iface;  /* network interface name, or NULL */
    const char *prefix; /* store key prefix */
    double init_timeout_s;
};

/* Creates the TCP device and connects to every peer through kv (borrowed for
 * the call). 0, or a negative code with a one-line reason in err. */
int trn_gloo_connect(const struct trn_gloo_config *cfg, struct trn_kv *kv, struct trn_gloo **out,
                     char *err, size_t errlen);

/* Runs w (validated by comm.c) to completion or failure, bounded by
 * timeout_s. 0, CDDP_ETIMEOUT, CDDP_EPEER or -EIO, with a one-line reason
 * in w->detail on failure. Never throws. */
int trn_gloo_run(struct trn_gloo *g, struct trn_comm_work *w, double timeout_s);

void trn_gloo_free(struct trn_gloo *g);

#ifdef __cplusplus
}
#endif

#endif
