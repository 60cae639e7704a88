/* device.c: --device auto|cpu|cuda; see device.h. */
#include "trainer/device.h"

#include <stdio.h>
#include <string.h>

int trn_device_parse(const char *what, const char *v, int *req, char *err, size_t errlen)
{
    static const char *const names[] = {"auto", "cpu", "cuda"};
    for (int i = 0; i < 3; i++)
        if (strcmp(v, names[i]) == 0) {
            *req = TRN_DEVICE_REQ_AUTO + i;
            return 0;
        }
    snprintf(err, errlen, "%s: '%s' is not auto, cpu or cuda", what, v);
    return -1;
}

/* Why CUDA cannot be used, or NULL when it can (why has room for 200). */
static const char *cuda_unusable(bool built, int count, int world, int local_rank, char *why,
                                 size_t len)
{
    if (!built)
        snprintf(why, len, "this cddp-train was built without CUDA (meson -Dcuda=enabled)");
    else if (count <= 0)
        snprintf(why, len, "no CUDA device is visible");
    else if (local_rank < 0 || local_rank >= count)
        snprintf(why, len, "LOCAL_RANK %d, but %d CUDA device(s) are visible", local_rank, count);
    else if (world > 1)
        snprintf(why, len,
                 "%d ranks: DDP between GPUs needs the NCCL communicator, which this build does "
                 "not have yet",
                 world);
    else
        return NULL;
    return why;
}

int trn_device_choose(int req, bool built, int count, int world, int local_rank,
                      struct trn_device_choice *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    out->device = TRN_DEVICE_CPU;
    if (req == TRN_DEVICE_REQ_CPU)
        return 0;
    char why[200];
    const char *no = cuda_unusable(built, count, world, local_rank, why, sizeof(why));
    if (!no) {
        out->device = TRN_DEVICE_CUDA;
        out->ordinal = local_rank;
        return 0;
    }
    if (req == TRN_DEVICE_REQ_CUDA) {
        snprintf(err, errlen, "--device cuda: %s", no);
        return -1;
    }
    snprintf(out->note, sizeof(out->note), "%s", no);
    out->gpu_unused = built && count > 0;
    return 0;
}
