/*
 * mhd.h: the libmicrohttpd functions the status port calls (http.c), from
 * libmicrohttpd opened when a status server first starts rather than linked.
 *
 * Most runs of cddprun have no status port, and linking libmicrohttpd made
 * every one of them map and initialise it and GnuTLS behind it (nine
 * shared libraries, about 3 MiB of peak RSS and a millisecond or two at
 * start; docs/benchmarks.md). <microhttpd.h> is still included, for types
 * and constants; its functions are called through `status_mhd`, filled by
 * status_mhd_load(), and never linked.
 *
 * The soname is libmicrohttpd's ABI (CDDP_LIBMHD_SONAME in config.h,
 * checked at configure time); tools/mkdeb.sh adds the package that
 * provides it to the .deb's dependencies, which dpkg-shlibdeps cannot see
 * through dlopen.
 */
#ifndef CDDP_STATUS_MHD_H
#define CDDP_STATUS_MHD_H

#include <stddef.h>

#include <microhttpd.h>

/* Every libmicrohttpd function http.c calls, without its MHD_ prefix. */
#define STATUS_MHD_FUNCS(XX)                                                                       \
    XX(start_daemon)                                                                               \
    XX(stop_daemon)                                                                                \
    XX(run)                                                                                        \
    XX(get_daemon_info)                                                                            \
    XX(get_timeout)                                                                                \
    XX(get_connection_info)                                                                        \
    XX(get_connection_values)                                                                      \
    XX(lookup_connection_value)                                                                    \
    XX(create_response_from_buffer)                                                                \
    XX(create_response_from_buffer_with_free_callback_cls)                                         \
    XX(add_response_header)                                                                        \
    XX(queue_response)                                                                             \
    XX(destroy_response)

struct status_mhd_fns {
#define XX(name) __typeof__(MHD_##name) *name;
    STATUS_MHD_FUNCS(XX)
#undef XX
};

/* The table: valid once status_mhd_load() returned 0. */
extern struct status_mhd_fns status_mhd;

/* Opens libmicrohttpd, once per process (thread-safe; later calls return
 * the first one's outcome). 0, or CDDP_ECONFIG with one line in err naming
 * the library and why it cannot be used. */
int status_mhd_load(char *err, size_t errlen);

#endif
