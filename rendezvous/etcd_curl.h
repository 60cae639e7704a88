/*
 * etcd_curl.h: the libcurl functions the etcd client calls (etcd.c), from
 * libcurl opened on first use rather than linked.
 *
 * Only the etcd backend needs libcurl, and linking it made every cddprun
 * run map and initialise it and the twenty-odd libraries behind it (TLS,
 * Kerberos, LDAP): 37 shared libraries instead of 16, twice the start-up
 * time and 4 MiB more peak RSS (docs/benchmarks.md). <curl/curl.h> is still
 * included, for types and constants; its functions are called through
 * `etcd_curl`, filled by etcd_curl_load(), and never linked.
 *
 * The soname is libcurl's ABI (CDDP_LIBCURL_SONAME in config.h, checked at
 * configure time); tools/mkdeb.sh adds the package that provides it to the
 * .deb's dependencies, which dpkg-shlibdeps cannot see through dlopen.
 */
#ifndef CDDP_RENDEZVOUS_ETCD_CURL_H
#define CDDP_RENDEZVOUS_ETCD_CURL_H

#include <stddef.h>

#include <curl/curl.h>

/* Every libcurl function etcd.c calls, without its curl_ prefix. */
#define ETCD_CURL_FUNCS(XX)                                                                        \
    XX(global_init)                                                                                \
    XX(easy_init)                                                                                  \
    XX(easy_setopt)                                                                                \
    XX(easy_getinfo)                                                                               \
    XX(easy_strerror)                                                                              \
    XX(easy_cleanup)                                                                               \
    XX(multi_init)                                                                                 \
    XX(multi_setopt)                                                                               \
    XX(multi_add_handle)                                                                           \
    XX(multi_remove_handle)                                                                        \
    XX(multi_assign)                                                                               \
    XX(multi_socket_action)                                                                        \
    XX(multi_info_read)                                                                            \
    XX(multi_cleanup)                                                                              \
    XX(slist_append)                                                                               \
    XX(slist_free_all)

struct etcd_curl_fns {
#define XX(name) __typeof__(curl_##name) *name;
    ETCD_CURL_FUNCS(XX)
#undef XX
};

/* The table: valid once etcd_curl_load() returned 0. */
extern struct etcd_curl_fns etcd_curl;

/* Opens libcurl and runs curl_global_init, once per process (thread-safe;
 * later calls return the first one's outcome). 0, or CDDP_ECONFIG with one
 * line in err naming the library and why it cannot be used. */
int etcd_curl_load(char *err, size_t errlen);

#endif
