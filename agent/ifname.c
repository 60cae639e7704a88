/* ifname.c: see ifname.h. */
#include "agent/ifname.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

static bool set(const char *v)
{
    return v != NULL && v[0] != '\0';
}

void agent_ifname_decide(const char *endpoint, int route_rc, const struct cddp_route *route,
                         bool off, const char *gloo_env, const char *nccl_env,
                         struct agent_ifname *out)
{
    memset(out, 0, sizeof(*out));
    const char *ep = endpoint ? endpoint : "?";
    if (off) {
        out->source = AGENT_IFNAME_OFF;
        snprintf(out->why, sizeof(out->why),
                 "network interface choice is off (--no_ifname): GLOO_SOCKET_IFNAME and "
                 "NCCL_SOCKET_IFNAME are left as they are");
        return;
    }
    if (set(gloo_env) && set(nccl_env)) {
        out->source = AGENT_IFNAME_USER;
        cddp_strlcpy(out->ifname, gloo_env, sizeof(out->ifname));
        snprintf(out->why, sizeof(out->why),
                 "network interface set by the user: GLOO_SOCKET_IFNAME=%.60s "
                 "NCCL_SOCKET_IFNAME=%.60s",
                 gloo_env, nccl_env);
        return;
    }
    if (route_rc != 0 || route == NULL) {
        snprintf(out->why, sizeof(out->why),
                 "no route to the rendezvous endpoint %.200s: GLOO_SOCKET_IFNAME and "
                 "NCCL_SOCKET_IFNAME left unset",
                 ep);
        return;
    }
    if (route->loopback || route->ifname[0] == '\0') {
        snprintf(
            out->why, sizeof(out->why),
            "the rendezvous endpoint %.120s is reached over %s (%.64s): GLOO_SOCKET_IFNAME and "
            "NCCL_SOCKET_IFNAME left unset",
            ep, route->loopback ? "loopback" : "no interface of this machine",
            route->addr[0] ? route->addr : "?");
        return;
    }
    out->source = AGENT_IFNAME_AUTO;
    cddp_strlcpy(out->ifname, route->ifname, sizeof(out->ifname));
    cddp_strlcpy(out->addr, route->addr, sizeof(out->addr));
    out->set_gloo = !set(gloo_env);
    out->set_nccl = !set(nccl_env);
    char gloo[96] = "", nccl[96] = "";
    if (out->set_gloo)
        snprintf(gloo, sizeof(gloo), " GLOO_SOCKET_IFNAME=%s", out->ifname);
    if (out->set_nccl)
        snprintf(nccl, sizeof(nccl), " NCCL_SOCKET_IFNAME=%s", out->ifname);
    const char *kept = !out->set_gloo   ? "; GLOO_SOCKET_IFNAME is the user's"
                       : !out->set_nccl ? "; NCCL_SOCKET_IFNAME is the user's"
                                        : "";
    snprintf(out->why, sizeof(out->why),
             "network interface %.64s (%.64s), the route to the rendezvous endpoint %.100s: "
             "set%s%s%s",
             out->ifname, out->addr, ep, gloo, nccl, kept);
}

const char *agent_ifname_source_name(enum agent_ifname_source s)
{
    static const char *const names[] = {
        [AGENT_IFNAME_NONE] = "none",
        [AGENT_IFNAME_AUTO] = "auto",
        [AGENT_IFNAME_USER] = "user",
        [AGENT_IFNAME_OFF] = "off",
    };
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "none";
}

int agent_ifname_apply(const struct agent_ifname *c)
{
    if (c->source != AGENT_IFNAME_AUTO)
        return 0;
    if (c->set_gloo && setenv("GLOO_SOCKET_IFNAME", c->ifname, 1) != 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    if (c->set_nccl && setenv("NCCL_SOCKET_IFNAME", c->ifname, 1) != 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    return 0;
}
