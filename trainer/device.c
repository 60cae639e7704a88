/* device.c: --device auto|cpu|cuda; see device.h. */
#include "trainer/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int trn_device_parse(const char *what, const char *v, int *req, char *err, size_t errlen)
{
    static const char *const names[] = {"auto", "cpu", "cuda"};
    for (int i = 0; i < 3; i++)
        if (strcmp(v, names[i]) == 0) {
            *req = TRN_DEVICE_REQ_AUTO + i;
            return 0;
        }
    if (strncmp(v, "cuda:", 5) == 0 && v[5] >= '0' && v[5] <= '9') {
        char *end;
        errno = 0;
        unsigned long n = strtoul(v + 5, &end, 10);
        if (*end == '\0' && errno == 0 && n <= TRN_DEVICE_MAX_ORDINAL) {
            *req = TRN_DEVICE_REQ_CUDA_AT + (int)n;
            return 0;
        }
    }
    snprintf(err, errlen, "%s: '%s' is not auto, cpu, cuda or cuda:N", what, v);
    return -1;
}

const char *const trn_comm_req_names[] = {"auto", "gloo", "nccl", NULL};
const char *const trn_grad_reduce_names[] = {"fp32", "bf16", NULL};

/* Why CUDA cannot be used, or NULL when it can (why has room for 200).
 * ordinal: the device asked for; pinned: by cuda:N, else LOCAL_RANK's. */
static const char *cuda_unusable(bool built, int count, int world, int ordinal, bool pinned,
                                 int backend, bool nccl, char *why, size_t len)
{
    if (!built)
        snprintf(why, len, "this cddp-train was built without CUDA (meson -Dcuda=enabled)");
    else if (count < 0)
        snprintf(why, len,
                 "the CUDA driver or runtime failed to count the devices (a driver problem, not "
                 "a missing GPU: T2008 says why)");
    else if (count == 0)
        snprintf(why, len, "no CUDA device is visible");
    else if ((ordinal < 0 || ordinal >= count) && pinned)
        snprintf(why, len, "device %d, but %d CUDA device(s) are visible", ordinal, count);
    else if (ordinal < 0 || ordinal >= count)
        snprintf(why, len, "LOCAL_RANK %d, but %d CUDA device(s) are visible", ordinal, count);
    else if (world > 1 && backend == TRN_COMM_REQ_GLOO)
        snprintf(why, len,
                 "%d ranks with --backend gloo: gloo reduces host memory, so DDP between GPUs "
                 "needs --backend nccl (or auto)",
                 world);
    else if (world > 1 && !nccl)
        snprintf(why, len,
                 "%d ranks: DDP between GPUs needs the NCCL communicator, which this build does "
                 "not have",
                 world);
    else
        return NULL;
    return why;
}

int trn_device_choose_dist(int req, int backend, bool built, bool nccl, int count, int world,
                           int local_rank, struct trn_device_choice *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->device = TRN_DEVICE_CPU;
    out->comm = "gloo";
    char why[200];
    bool pinned = req >= TRN_DEVICE_REQ_CUDA_AT;
    int ordinal = pinned ? req - TRN_DEVICE_REQ_CUDA_AT : local_rank;
    const char *no = req == TRN_DEVICE_REQ_CPU ? "--device cpu"
                                               : cuda_unusable(built, count, world, ordinal, pinned,
                                                               backend, nccl, why, sizeof(why));
    if (!no) {
        out->device = TRN_DEVICE_CUDA;
        out->ordinal = ordinal;
        out->comm = backend == TRN_COMM_REQ_GLOO ? "gloo" : "nccl";
        return 0;
    }
    if (pinned) {
        snprintf(err, errlen, "--device cuda:%d: %s", ordinal, no);
        return -1;
    }
    if (req == TRN_DEVICE_REQ_CUDA) {
        snprintf(err, errlen, "--device cuda: %s", no);
        return -1;
    }
    if (backend == TRN_COMM_REQ_NCCL) {
        snprintf(err, errlen,
                 "--backend nccl: NCCL reduces CUDA device memory, and this rank computes on the "
                 "CPU (%s); use --backend gloo or auto",
                 no);
        return -1;
    }
    if (req == TRN_DEVICE_REQ_CPU)
        return 0;
    snprintf(out->note, sizeof(out->note), "%s", no);
    /* (a driver that fails to count its GPUs: there probably is one) */
    out->gpu_unused = built && count != 0;
    return 0;
}

int trn_device_choose(int req, bool built, int count, int world, int local_rank,
                      struct trn_device_choice *out, char *err, size_t errlen)
{
    return trn_device_choose_dist(req, TRN_COMM_REQ_AUTO, built, false, count, world, local_rank,
                                  out, err, errlen);
}

int trn_grad_reduce_check(int dtype, const struct trn_device_choice *c, char *err, size_t errlen)
{
    if (dtype != TRN_GRAD_REDUCE_BF16)
        return 0;
    if (c->device != TRN_DEVICE_CUDA)
        snprintf(err, errlen,
                 "--grad-reduce-dtype bf16: gradient compression needs --device cuda and the "
                 "nccl backend (the CPU and gloo reduce fp32)");
    else if (strcmp(c->comm, "nccl") != 0)
        snprintf(err, errlen,
                 "--grad-reduce-dtype bf16: needs --backend nccl (or auto): gloo has no bf16");
    else
        return 0;
    return -1;
}
