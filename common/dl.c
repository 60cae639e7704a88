/*
 * dl.c: see dl.h.
 */
#include "common/dl.h"

#include <dlfcn.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

int cddp_dl_load(struct cddp_dl *l, char *err, size_t errlen)
{
    pthread_mutex_lock(&l->mu);
    if (!l->tried) {
        l->tried = true;
        l->rc = 0;
        /* RTLD_LOCAL: its symbols are ours to look up, not a second source
         * for every later lookup; RTLD_NOW: a missing dependency fails here,
         * with the loader's reason, not at some later call. */
        void *h = dlopen(l->soname, RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) {
            const char *why = dlerror();
            l->rc = cddp_fail(l->why, sizeof(l->why), CDDP_ECONFIG, "%s cannot be loaded (%s)",
                              l->soname, why ? why : "dlopen failed");
        }
        for (size_t i = 0; h && i < l->nsyms; i++) {
            dlerror();
            void *f = dlsym(h, l->syms[i].name);
            if (f == NULL) {
                l->rc = cddp_fail(l->why, sizeof(l->why), CDDP_ECONFIG,
                                  "%s cannot be loaded (it has no %s: too old a version?)",
                                  l->soname, l->syms[i].name);
                for (size_t j = 0; j < i; j++)
                    memset(l->syms[j].slot, 0, sizeof(f));
                dlclose(h);
                h = NULL;
                break;
            }
            /* POSIX guarantees a function's address fits a void *; copying
             * the bytes avoids ISO C's object-to-function pointer cast. */
            memcpy(l->syms[i].slot, &f, sizeof(f));
        }
    }
    int rc = l->rc;
    if (rc && err && errlen)
        cddp_strlcpy(err, l->why, errlen);
    pthread_mutex_unlock(&l->mu);
    return rc;
}
