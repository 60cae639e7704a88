/* nccl_lib.c: see nccl_lib.h. */
#define TRN_NCCL_LIB_TABLE
#include "trainer/comm/nccl_lib.h"

#include "common/dl.h"

#define STR_(x) #x
#define STR(x) STR_(x)

struct trn_nccl_fns trn_nccl;

static const struct cddp_dl_sym syms[] = {
#define XX(f) {#f, &trn_nccl.f},
    TRN_NCCL_FUNCS(XX)
#undef XX
};

/* The major version the header is of (libnccl.so.2). */
static struct cddp_dl lib = CDDP_DL_INIT("libnccl.so." STR(NCCL_MAJOR), syms);

int trn_nccl_lib_load(char *err, size_t errlen)
{
    return cddp_dl_load(&lib, err, errlen);
}
