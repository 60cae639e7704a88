/*
 * ifname.h: the network interface the workers' collectives bind to.
 *
 * gloo reads GLOO_SOCKET_IFNAME, NCCL NCCL_SOCKET_IFNAME, cddp-train
 * GLOO_SOCKET_IFNAME (its gloo backend; there is no cddp-specific name).
 * Unset, gloo binds to the address its host name resolves to (loopback
 * where the name is not in DNS or resolves to 127.0.1.1) and NCCL to the
 * first interface it likes (docker0, a management network). A multi-node
 * cddprun therefore sets both, where the user has not, to the interface
 * this node reaches the rendezvous endpoint through (static: the master),
 * and node 0 publishes that interface's address as MASTER_ADDR
 * (docs/torchrun-compat.md). --no_ifname (CDDP_NO_IFNAME, PET_NO_IFNAME)
 * turns it off; a user's variable always wins.
 *
 * agent_ifname_decide() is pure (the route and the environment are its
 * arguments); agent_ifname_apply() sets the variables in this process's
 * environment, which every worker inherits.
 */
#ifndef CDDP_AGENT_IFNAME_H
#define CDDP_AGENT_IFNAME_H

#include <stdbool.h>

#include "common/ifaddr.h"

enum agent_ifname_source {
    AGENT_IFNAME_NONE, /* nothing chosen: no route, or the endpoint is reached over loopback */
    AGENT_IFNAME_AUTO, /* chosen by cddprun from the route to the endpoint */
    AGENT_IFNAME_USER, /* both variables were set by the user */
    AGENT_IFNAME_OFF,  /* --no_ifname */
};

struct agent_ifname {
    enum agent_ifname_source source;
    char ifname[64]; /* AUTO: the interface; USER: the user's GLOO_SOCKET_IFNAME (or NCCL's) */
    char addr[64];   /* AUTO: its address (node 0's MASTER_ADDR); "" otherwise */
    bool set_gloo;   /* AUTO: GLOO_SOCKET_IFNAME is cddprun's to set (the user left it unset) */
    bool set_nccl;   /* AUTO: the same for NCCL_SOCKET_IFNAME */
    char why[400];   /* one line for the log */
};

/* Decides for the rendezvous endpoint host, given the route to it
 * (route_rc: cddp_route_to's result), --no_ifname, and the user's
 * GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (NULL or "" when unset). */
void agent_ifname_decide(const char *endpoint, int route_rc, const struct cddp_route *route,
                         bool off, const char *gloo_env, const char *nccl_env,
                         struct agent_ifname *out);

/* "none", "auto", "user", "off". */
const char *agent_ifname_source_name(enum agent_ifname_source s);

/* Sets what the decision says in this process's environment (setenv): 0 or
 * a negative code. */
int agent_ifname_apply(const struct agent_ifname *c);

#endif
