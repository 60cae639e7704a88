/*
 * mhd.c: see mhd.h.
 */
#include "status/mhd.h"

#include "config.h"
#include "common/dl.h"

struct status_mhd_fns status_mhd;

static const struct cddp_dl_sym syms[] = {
#define XX(name) {"MHD_" #name, &status_mhd.name},
    STATUS_MHD_FUNCS(XX)
#undef XX
};

static struct cddp_dl lib = CDDP_DL_INIT(CDDP_LIBMHD_SONAME, syms);

int status_mhd_load(char *err, size_t errlen)
{
    return cddp_dl_load(&lib, err, errlen);
}
