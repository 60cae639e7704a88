/*
 * ifaddr.h: which of this machine's interfaces and addresses reaches a
 * destination, as the kernel's routing table says.
 *
 * A UDP socket connected to the destination (connect(2) on a datagram
 * socket sends nothing: it only asks the routing table) tells the source
 * address the kernel would use; the interface that holds that address
 * (getifaddrs) is the one gloo and NCCL should bind to. A destination on
 * this machine (its own address) is routed over lo, but the source is still
 * that address, so its interface is found all the same. Blocking (the
 * destination may be a name: getaddrinfo); call it at start-up.
 */
#ifndef CDDP_COMMON_IFADDR_H
#define CDDP_COMMON_IFADDR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

struct ifaddrs;

struct cddp_route {
    char ifname[64]; /* the interface holding addr; "" when none does */
    char addr[64];   /* the source address, numeric (IPv4 or IPv6) */
    bool loopback;   /* addr is a loopback address (127/8, ::1, ::ffff:127/104) */
};

/* The route to host (a name or a numeric address). 0, or CDDP_ENOTFOUND
 * (host does not resolve, or no address of it is routable from here). */
int cddp_route_to(const char *host, struct cddp_route *out);

/* The name of the interface in ifs (a getifaddrs list, or one a test
 * built) that holds the address sa, into out; false when none does. */
bool cddp_ifname_of(const struct ifaddrs *ifs, const struct sockaddr *sa, char *out, size_t len);

/* Whether sa is a loopback address; whether a and b are the same address
 * (family and address, ports ignored). */
bool cddp_sockaddr_is_loopback(const struct sockaddr *sa);
bool cddp_sockaddr_same(const struct sockaddr *a, const struct sockaddr *b);

#endif
