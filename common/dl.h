/*
 * dl.h: a library opened when a feature first needs it, not at exec.
 *
 * Every shared library a program links is mapped, relocated and
 * initialised before main(), whether the run uses it or not. libcurl (the
 * etcd backend) brings some twenty more with it (OpenSSL, Kerberos, LDAP,
 * ...) and libmicrohttpd (the status port) brings GnuTLS: together they
 * tripled cddprun's start-up time and nearly doubled its peak RSS
 * (docs/benchmarks.md, "Launcher start-up"). So the module that needs
 * such a library opens it here, by soname, the first time it is used.
 *
 * How a module uses it (rendezvous/etcd_curl.c, status/mhd.c): it keeps a
 * table of the functions it calls, typed from the library's own header
 * with __typeof__ (the header is still used for types and constants; the
 * functions are called through the table only, so the program does not
 * link the library), lists the table's slots in a `struct cddp_dl_sym`
 * array and declares one `struct cddp_dl` with CDDP_DL_INIT. Then
 * cddp_dl_load() before the first call.
 *
 * Nothing here is ever closed: the functions stay valid for the life of
 * the process, which is what the tables' users assume.
 */
#ifndef CDDP_COMMON_DL_H
#define CDDP_COMMON_DL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* One function: its name in the library and where its address goes (the
 * address of a function pointer in the module's table). */
struct cddp_dl_sym {
    const char *name;
    void *slot;
};

struct cddp_dl {
    const char *soname; /* "libcurl.so.4": the ABI the table was written for */
    const struct cddp_dl_sym *syms;
    size_t nsyms;
    /* The outcome of the first load, kept for every later caller. */
    pthread_mutex_t mu;
    bool tried;
    int rc;
    char why[320];
};

#define CDDP_DL_INIT(soname_, syms_)                                                               \
    {                                                                                              \
        .soname = (soname_), .syms = (syms_), .nsyms = sizeof(syms_) / sizeof((syms_)[0]),         \
        .mu = PTHREAD_MUTEX_INITIALIZER                                                            \
    }

/* Opens the library and fills every slot, the first time; later calls
 * return the first call's outcome. Thread-safe. 0, or CDDP_ECONFIG with
 * one line in err: "libcurl.so.4 cannot be loaded (<the loader's
 * reason>)". A failed load leaves no slot filled and the library closed. */
int cddp_dl_load(struct cddp_dl *l, char *err, size_t errlen);

#endif
