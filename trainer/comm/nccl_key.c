/* nccl_key.c: the NCCL unique id's store key; see nccl_key.h. */
#include "trainer/comm/nccl_key.h"

#include <stdio.h>

#include "common/errors.h"

/* "<prefix>/<a>/restart_<R>/round_<N>/<b>" */
static int key(const char *prefix, const char *a, long restart_count, long rdzv_round,
               const char *b, char *out, size_t outlen)
{
    if (outlen > 0)
        out[0] = '\0';
    if (restart_count < 0 || rdzv_round < 0)
        return CDDP_ERANGE_ARG;
    if (prefix == NULL || *prefix == '\0')
        prefix = TRN_NCCL_KEY_PREFIX;
    int n = snprintf(out, outlen, "%s/%s/restart_%ld/round_%ld/%s", prefix, a, restart_count,
                     rdzv_round, b);
    if (n < 0 || (size_t)n >= outlen) {
        if (outlen > 0)
            out[0] = '\0';
        return CDDP_ETOOBIG;
    }
    return 0;
}

int trn_nccl_id_key(const char *prefix, long restart_count, long rdzv_round, const char *group,
                    char *out, size_t outlen)
{
    if (group == NULL || *group == '\0')
        group = "default";
    return key(prefix, group, restart_count, rdzv_round, "unique_id", out, outlen);
}

int trn_nccl_progress_key(const char *prefix, long restart_count, long rdzv_round, int rank,
                          char *out, size_t outlen)
{
    char r[32];
    if (rank < 0) {
        if (outlen > 0)
            out[0] = '\0';
        return CDDP_ERANGE_ARG;
    }
    snprintf(r, sizeof(r), "rank_%d", rank);
    return key(prefix, "progress", restart_count, rdzv_round, r, out, outlen);
}
