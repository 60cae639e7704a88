/* ifaddr.c: see ifaddr.h. */
#include "common/ifaddr.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/strutil.h"

bool cddp_sockaddr_is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a))
            return true;
        /* ::ffff:127.x.y.z */
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

bool cddp_sockaddr_same(const struct sockaddr *a, const struct sockaddr *b)
{
    if (a == NULL || b == NULL || a->sa_family != b->sa_family)
        return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

bool cddp_ifname_of(const struct ifaddrs *ifs, const struct sockaddr *sa, char *out, size_t len)
{
    for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (i->ifa_name && cddp_sockaddr_same(i->ifa_addr, sa)) {
            cddp_strlcpy(out, i->ifa_name, len);
            return true;
        }
    }
    return false;
}

/* The source address for one destination address; 0 or -1. */
static int source_for(const struct addrinfo *ai, struct sockaddr_storage *ss, socklen_t *sl)
{
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    *sl = sizeof(*ss);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                     getsockname(fd, (struct sockaddr *)ss, sl) == 0
                 ? 0
                 : -1;
    close(fd);
    return rc;
}

int cddp_route_to(const char *host, struct cddp_route *out)
{
    memset(out, 0, sizeof(*out));
    if (host == NULL || host[0] == '\0')
        return CDDP_ENOTFOUND;
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_ADDRCONFIG};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, "9", &hints, &res) != 0 || res == NULL)
        return CDDP_ENOTFOUND;
    int rc = CDDP_ENOTFOUND;
    for (struct addrinfo *ai = res; ai != NULL && rc != 0; ai = ai->ai_next) {
        struct sockaddr_storage ss;
        socklen_t sl;
        if (source_for(ai, &ss, &sl) != 0 ||
            getnameinfo((struct sockaddr *)&ss, sl, out->addr, (socklen_t)sizeof(out->addr), NULL,
                        0, NI_NUMERICHOST) != 0)
            continue;
        rc = 0;
        out->loopback = cddp_sockaddr_is_loopback((struct sockaddr *)&ss);
        struct ifaddrs *ifs = NULL;
        if (getifaddrs(&ifs) == 0) {
            cddp_ifname_of(ifs, (struct sockaddr *)&ss, out->ifname, sizeof(out->ifname));
            freeifaddrs(ifs);
        }
    }
    freeaddrinfo(res);
    return rc;
}
