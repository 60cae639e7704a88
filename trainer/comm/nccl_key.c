/* nccl_key.c: the NCCL unique id's store key; see nccl_key.h. */
#include "trainer/comm/nccl_key.h"

#include <stdio.h>

#include "common/errors.h"

int trn_nccl_id_key(const char *prefix, long restart_count, long rdzv_round, const char *group,
                    char *out, size_t outlen)
{
    if (outlen > 0)
        out[0] = '\0';
    if (restart_count < 0 || rdzv_round < 0)
        return CDDP_ERANGE_ARG;
    if (prefix == NULL || *prefix == '\0')
        prefix = TRN_NCCL_KEY_PREFIX;
    if (group == NULL || *group == '\0')
        group = "default";
    int n = snprintf(out, outlen, "%s/%s/restart_%ld/round_%ld/unique_id", prefix, group,
                     restart_count, rdzv_round);
    if (n < 0 || (size_t)n >= outlen) {
        if (outlen > 0)
            out[0] = '\0';
        return CDDP_ETOOBIG;
    }
    return 0;
}
