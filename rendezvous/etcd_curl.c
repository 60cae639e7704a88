/*
 * etcd_curl.c: see etcd_curl.h.
 */
#include "rendezvous/etcd_curl.h"

#include <pthread.h>

#include "config.h"
#include "common/dl.h"
#include "common/errors.h"

struct etcd_curl_fns etcd_curl;

static const struct cddp_dl_sym syms[] = {
#define XX(name) {"curl_" #name, &etcd_curl.name},
    ETCD_CURL_FUNCS(XX)
#undef XX
};

static struct cddp_dl lib = CDDP_DL_INIT(CDDP_LIBCURL_SONAME, syms);

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int init_rc = 1; /* 1: not run yet */

int etcd_curl_load(char *err, size_t errlen)
{
    int rc = cddp_dl_load(&lib, err, errlen);
    if (rc)
        return rc;
    /* curl_global_init is not thread-safe in every libcurl we may meet:
     * once, under our own lock. */
    pthread_mutex_lock(&init_mu);
    if (init_rc == 1)
        init_rc = etcd_curl.global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : CDDP_ECONFIG;
    rc = init_rc;
    pthread_mutex_unlock(&init_mu);
    if (rc)
        return cddp_fail(err, errlen, rc, "%s: curl_global_init failed", CDDP_LIBCURL_SONAME);
    return 0;
}
