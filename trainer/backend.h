/*
 * backend.h: --device's shell in cddp-train: the device this rank computes
 * on, and the ops backend there (ops.h).
 *
 * device.h decides, purely, from the request (--device, else CDDP_DEVICE,
 * else auto), this build, the visible GPUs and torchrun's world. Here the
 * decision is taken and checked against what the run's flags ask of the
 * device (--grad-reduce-dtype, --cuda-graphs, --amp), then the backend is
 * set up on it: oneDNN and our kernels on --threads OpenMP threads, or
 * cuDNN, cuBLAS and our kernels on the chosen GPU with the flags' math
 * modes (--amp, --tf32, --cudnn-workspace-mb, --deterministic).
 *
 * A request that cannot be met: one line, exit 2 (trn_refuse); a backend
 * that fails to start otherwise: trn_fatal. Logs the choice when it is
 * worth a line (T2001), the CUDA set-up (T2000, T2400) and, at release,
 * the peak device memory (T2002).
 */
#ifndef CDDP_TRAINER_BACKEND_H
#define CDDP_TRAINER_BACKEND_H

#include "trainer/device.h"  /* struct trn_device_choice */
#include "trainer/flags.h"   /* struct trn_config */
#include "trainer/ops/ops.h" /* struct trn_backend */

/* Chooses the device for c on rank local_rank of world into *dev, and
 * sets up *be on it (released by trn_backend_release). */
void trn_backend_setup(struct trn_backend *be, struct trn_device_choice *dev,
                       const struct trn_config *c, int world, int local_rank);

/* Frees what trn_backend_setup made. Never set up (no ops): nothing. */
void trn_backend_release(struct trn_backend *be);

#endif
