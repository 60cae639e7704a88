/*
 * dlopen_probe.c: a program that links the libraries cddprun and cddp-rdzv
 * open on first use (common/dl.h), referring to exactly the functions
 * their tables call (rendezvous/etcd_curl.h, status/mhd.h). It is not
 * installed (but for the wheel's build) and never needs to run; tools read
 * its ELF header:
 *
 *  - tools/mkdeb.sh hands it to dpkg-shlibdeps with the programs, which
 *    cannot see a dlopen: the package then depends on libcurl4 and
 *    libmicrohttpd12 at the versions that have those functions, as if the
 *    programs still linked them;
 *  - tools/lazylibs.sh (meson test --suite lint) checks that it links the
 *    very sonames the programs open (config.h's CDDP_*_SONAME), so the
 *    names opened and the libraries compiled against cannot drift apart;
 *  - tools/wheel_backend.py carries the libraries it loads into the Python
 *    wheel beside those the programs link (-Dwheel=true installs it for
 *    that; the wheel does not keep it).
 */
#include <stddef.h>

#include "rendezvous/etcd_curl.h"
#include "status/mhd.h"

typedef void (*any_fn)(void);

/* Kept (`used`) although nothing reads them: an optimiser that dropped
 * them would drop the references, and the linker (--as-needed) the
 * libraries with them. */
#define CURL_FN(name) ((any_fn)&curl_##name),
#define MHD_FN(name) ((any_fn)&MHD_##name),
__attribute__((used)) static const any_fn curl_used[] = {ETCD_CURL_FUNCS(CURL_FN)};
__attribute__((used)) static const any_fn mhd_used[] = {STATUS_MHD_FUNCS(MHD_FN)};

int main(void)
{
    return 0;
}
