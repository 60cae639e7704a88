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
 *         or several ranks without NCCL (this build has none, or --backend
 *         gloo: gloo reduces host memory, not device memory).
 *
 * And the communicator (--backend auto|gloo|nccl): auto is nccl on a CUDA
 * device, gloo on the CPU (torch's init_process_group default per device);
 * nccl on the CPU is refused (NCCL moves device memory only). With one
 * rank the communicator is "local" whatever is asked (comm.h), but the
 * name is still decided, so a refusal does not depend on the world size.
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
    /* cuda:N is TRN_DEVICE_REQ_CUDA_AT + N: that device, whatever LOCAL_RANK
     * says (several ranks sharing one GPU; pinning by hand). */
    TRN_DEVICE_REQ_CUDA_AT = 16,
};

#define TRN_DEVICE_MAX_ORDINAL 1023

/* "auto", "cpu", "cuda" or "cuda:N" (N in 0..TRN_DEVICE_MAX_ORDINAL) into
 * *req; else -1 with "WHAT: 'v' is not auto, cpu, cuda or cuda:N" in err
 * (what: "--device" or "CDDP_DEVICE"). */
int trn_device_parse(const char *what, const char *v, int *req, char *err, size_t errlen);

/* --backend: the communicator between ranks. */
enum trn_comm_req {
    TRN_COMM_REQ_AUTO = 0,
    TRN_COMM_REQ_GLOO,
    TRN_COMM_REQ_NCCL,
};
extern const char *const trn_comm_req_names[]; /* "auto", "gloo", "nccl", NULL */

/* --grad-reduce-dtype: what DDP's bucket allreduce carries. */
enum trn_grad_reduce {
    TRN_GRAD_REDUCE_FP32 = 0,
    TRN_GRAD_REDUCE_BF16, /* DDP's bf16_compress_hook; nccl only */
};
extern const char *const trn_grad_reduce_names[]; /* "fp32", "bf16", NULL */

struct trn_device_choice {
    enum trn_device device;
    const char *comm; /* "gloo" or "nccl": trn_dist_options.backend */
    int ordinal;      /* the CUDA device (LOCAL_RANK); 0 on the CPU */
    char note[256];   /* auto's reason for the CPU; "" otherwise */
    bool gpu_unused;  /* auto chose the CPU although a GPU is there (say it louder) */
};

/*
 * Decides: req (not UNSET), built (CDDP_HAVE_CUDA), count (visible CUDA
 * devices: trn_cuda_device_count, -1 when the driver failed to count them,
 * which is refused, or with auto the CPU with a warning, as a driver
 * problem and not as no GPU), world and local_rank (torchrun's). 0 with *out filled, or -1
 * with "--device cuda: why" in err.
 */
int trn_device_choose(int req, bool built, int count, int world, int local_rank,
                      struct trn_device_choice *out, char *err, size_t errlen);

/*
 * The same with the communicator: backend (enum trn_comm_req) and nccl
 * (CDDP_HAVE_NCCL: this build has the NCCL communicator). Several CUDA
 * ranks need nccl and a backend of auto or nccl; --device cuda with
 * --backend gloo and world > 1 is refused, auto falls back to the CPU
 * saying why; --backend nccl on the CPU is refused ("--backend nccl: why").
 * trn_device_choose is this with backend auto and no NCCL.
 */
int trn_device_choose_dist(int req, int backend, bool built, bool nccl, int count, int world,
                           int local_rank, struct trn_device_choice *out, char *err, size_t errlen);

/* --grad-reduce-dtype against the choice: bf16 needs the CUDA device and
 * nccl (gloo has no bf16). 0, or -1 with one line in err. */
int trn_grad_reduce_check(int dtype, const struct trn_device_choice *c, char *err, size_t errlen);

#endif
