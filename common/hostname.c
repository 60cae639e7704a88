/* hostname.c: see hostname.h. */
#include "common/hostname.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/ifaddr.h"
#include "common/strutil.h"

void cddp_fqdn(char *out, size_t len)
{
    char host[256] = "localhost";
    if (gethostname(host, sizeof(host)) != 0)
        cddp_strlcpy(host, "localhost", sizeof(host));
    host[sizeof(host) - 1] = '\0';
    cddp_strlcpy(out, host, len);

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || ai == NULL)
        return;
    struct hostent he, *res = NULL;
    char buf[8192];
    int herr;
    const void *addr;
    socklen_t alen;
    if (ai->ai_family == AF_INET) {
        addr = &((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        alen = sizeof(struct in_addr);
    } else {
        addr = &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        alen = sizeof(struct in6_addr);
    }
    if (gethostbyaddr_r(addr, alen, ai->ai_family, &he, buf, sizeof(buf), &res, &herr) == 0 &&
        res != NULL && res->h_name) {
        const char *pick = res->h_name;
        if (strchr(pick, '.') == NULL) {
            for (char **a = res->h_aliases; a && *a; a++) {
                if (strchr(*a, '.')) {
                    pick = *a;
                    break;
                }
            }
        }
        cddp_strlcpy(out, pick, len);
    }
    freeaddrinfo(ai);
}

bool cddp_host_is_local(const char *host)
{
    if (host == NULL || host[0] == '\0')
        return false;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    char name[256] = "";
    if (gethostname(name, sizeof(name) - 1) == 0 && strcasecmp(host, name) == 0)
        return true;
    char fqdn[256];
    cddp_fqdn(fqdn, sizeof(fqdn));
    if (strcasecmp(host, fqdn) == 0)
        return true;

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || ai == NULL)
        return false;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        ifs = NULL;
    bool local = false;
    for (struct addrinfo *p = ai; p && !local; p = p->ai_next) {
        if (cddp_sockaddr_is_loopback(p->ai_addr)) {
            local = true;
            break;
        }
        for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
            local = cddp_sockaddr_same(p->ai_addr, i->ifa_addr);
    }
    if (ifs)
        freeifaddrs(ifs);
    freeaddrinfo(ai);
    return local;
}
