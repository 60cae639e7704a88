/*
 * device.h: which device cddp-train computes on (--device, CDDP_DEVICE).
 *
 * Pure: what this build has, how many CUDA devices are visible and where the
 * rank stands in torchrun's world go in; the device, or the one-line reason
 * it cannot be had, come out (tests/integration/test_trainer_device.py runs
 * the real binary through every case it can reach without a GPU).
 *
 *   auto  CUDA device LOCAL_RANK (torch's cuda:LOCAL_RANK) when this build
 *         has the CUDA backend, a device is visible and the run is one
 *         process; else the CPU, with a note saying why (logged once).
 *   cpu   the CPU backend.
 *   cuda  CUDA device LOCAL_RANK, or a refusal (exit 2): no CUDA in this
 *         build, no device visible, LOCAL_RANK beyond the visible devices,
 *         or several ranks (DDP between GPUs needs the NCCL communicator,
 *         which is not built yet: gloo reduces host memory).
 */
#ifndef CDDP_TRAINER_DEVICE_H
#define CDDP_TRAINER_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "trainer/ops/ops.h" /* enum trn_device */

/* What was asked for; 0 (not given) reads CDDP_DEVICE, then means auto. */
enum trn_device_req {
    TRN_DEVICE_REQ_UNSET = 0,
    TRN_DEVICE_REQ_AUTO,
    TRN_DEVICE_REQ_CPU,
    TRN_DEVICE_REQ_CUDA,
};

/* "auto", "cpu" or "cuda" into *req; else -1 with "WHAT: 'v' is not auto, cpu
 * or cuda" in err (what: "--device" or "CDDP_DEVICE"). */
int trn_device_parse(const char *what, const char *v, int *req, char *err, size_t errlen);

struct trn_device_choice {
    enum trn_device device;
    int ordinal;     /* the CUDA device (LOCAL_RANK); 0 on the CPU */
    char note[256];  /* auto's reason for the CPU; "" otherwise */
    bool gpu_unused; /* auto chose the CPU although a GPU is there (say it louder) */
};

/*
 * Decides: req (not UNSET), built (CDDP_HAVE_CUDA), count (visible CUDA
 * devices), world and local_rank (torchrun's). 0 with *out filled, or -1
 * with "--device cuda: why" in err.
 */
int trn_device_choose(int req, bool built, int count, int world, int local_rank,
                      struct trn_device_choice *out, char *err, size_t errlen);

#endif
