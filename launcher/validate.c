/*
 * validate.c: launch_validate (cli.h), what a parsed configuration asks of
 * this build: refuses, by name, what cddprun parses but cannot honour, and
 * derives where the rendezvous is: the c10d endpoint, the etcd members or
 * the static master, with torch's parse_rendezvous_endpoint
 * (common/hostport.h, cddp_hostport_parse_torchrun).
 */
#include "launcher/cli.h"

#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/hostname.h"
#include "common/hostport.h"
#include "common/strutil.h"

_Static_assert(sizeof(((struct launch_config *)0)->rdzv_host) ==
                       sizeof(((struct cddp_hostport *)0)->host) &&
                   sizeof(((struct launch_config *)0)->static_addr) ==
                       sizeof(((struct cddp_hostport *)0)->host),
               "the config's host fields are struct cddp_hostport's size");

/* torch's parse_rendezvous_endpoint (common/hostport.h) into a config's
 * host field and port. */
static int endpoint(const char *text, int default_port, char host[256], int *port, char *err,
                    size_t errlen)
{
    struct cddp_hostport hp;
    int rc = cddp_hostport_parse_torchrun(text, default_port, &hp, err, errlen);
    if (rc == 0) {
        memcpy(host, hp.host, sizeof(hp.host));
        *port = hp.port;
    }
    return rc;
}

/* What an endpoint error names: the option as typed, or the variable. */
static const char *endpoint_name(const struct launch_config *cfg)
{
    return cfg->rdzv_endpoint_src[0] ? cfg->rdzv_endpoint_src : "--rdzv_endpoint";
}

/* etcd-v3 (etcd and etcd-v2 name it, with a notice from the agent): one
 * or more members, "h1:2379,h2:2379" (docs/etcd.md); each is checked, and
 * the last one's host and port are kept. */
static int etcd_members(struct launch_config *cfg, char *err, size_t errlen)
{
    if (cfg->rdzv_endpoint[0] == '\0')
        return cddp_fail(err, errlen, CDDP_ECONFIG,
                         "--rdzv_backend=%s needs --rdzv_endpoint=HOST:PORT[,HOST:PORT...] "
                         "(the etcd members)",
                         cfg->rdzv_backend);
    const char *name = endpoint_name(cfg);
    char copy[1024];
    if (strlen(cfg->rdzv_endpoint) >= sizeof(copy))
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: too long", name);
    cddp_strlcpy(copy, cfg->rdzv_endpoint, sizeof(copy));
    for (char *p = copy;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        char *item = cddp_strip(p);
        if (strncmp(item, "http://", 7) == 0)
            item += 7;
        else if (strncmp(item, "https://", 8) == 0)
            item += 8;
        char why[256];
        if (*item == '\0' ||
            endpoint(item, 2379, cfg->rdzv_host, &cfg->rdzv_port, why, sizeof(why)) != 0)
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s: etcd member '%s': %s", name, item,
                             *item ? why : "empty");
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return 0;
}

/* static (launcher/api.py _get_addr_and_port): the endpoint, or
 * master_addr:master_port, names the master; its port is required. */
static int static_master(struct launch_config *cfg, char *err, size_t errlen)
{
    char ep[512];
    const char *what = endpoint_name(cfg);
    if (cfg->rdzv_endpoint[0]) {
        cddp_strlcpy(ep, cfg->rdzv_endpoint, sizeof(ep));
    } else {
        snprintf(ep, sizeof(ep), "%s:%d", cfg->master_addr, cfg->master_port);
        what = "--master_addr";
    }
    char why[256];
    int port;
    if (endpoint(ep, -1, cfg->static_addr, &port, why, sizeof(why)) != 0)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: %s", what, why);
    if (port <= 0)
        return cddp_fail(err, errlen, CDDP_EPARSE,
                         "%s=%s: the static backend needs HOST:PORT (port is missing or 0)", what,
                         cfg->rdzv_endpoint);
    cfg->static_port = port;
    /* Several static nodes meet on the port after MASTER_PORT, which
     * the workers' rank 0 serves (docs/multi-node.md). */
    if (cfg->nnodes_max > 1 && port == 65535)
        return cddp_fail(err, errlen, CDDP_ERANGE_ARG,
                         "--master_port=65535: with --nnodes > 1 the static backend also needs "
                         "the next port, for the agents");
    return 0;
}

/* The status port must not be a port this node's agent serves the
 * rendezvous on: it listens first (before the agent starts), so the agent
 * would take it for a rendezvous served already and join its own HTTP
 * server. A port on another host is another machine's business. */
static int status_port_clash(const struct launch_config *cfg, const char *host, int port,
                             const char *what, char *err, size_t errlen)
{
    if (cfg->status_port <= 0 || cfg->status_port != port || !cddp_host_is_local(host))
        return 0;
    char hp[300];
    cddp_hostport_format(host, port, hp, sizeof(hp));
    return cddp_fail(err, errlen, CDDP_ECONFIG,
                     "--status_port=%d is %s (%s, this host): the status port and the "
                     "rendezvous cannot share a port; pick another status port",
                     cfg->status_port, what, hp);
}

int launch_validate(struct launch_config *cfg, char *err, size_t errlen)
{
    /* --status_linger keeps the status port serving after the run: without a
     * port it can do nothing. Typed on the command line that is a mistake;
     * from a variable (an environment shared by runs, some with the port
     * off) it is dropped, and cddprun warns once. */
    if (cfg->status_linger_s > 0 && cfg->status_port < 0) {
        const char *src = cfg->status_linger_src ? cfg->status_linger_src : "--status_linger";
        if (src[0] == '-')
            return cddp_fail(err, errlen, CDDP_ECONFIG,
                             "%s=%s needs --status_port: without a status port there is no status "
                             "to keep serving",
                             src, cfg->status_linger_arg);
        cfg->status_linger_s = 0;
        cfg->status_linger_ignored = true;
    }
    if (cfg->restart_scope && strcmp(cfg->restart_scope, "worker") == 0 && !cfg->agent_store)
        return cddp_fail(err, errlen, CDDP_ECONFIG,
                         "--restart_scope=worker needs --agent_store=true: the agent announces "
                         "each new membership generation on the store it serves the workers");
    if (cfg->spare_workers > 0 &&
        !(cfg->restart_scope && strcmp(cfg->restart_scope, "worker") == 0))
        return cddp_fail(err, errlen, CDDP_ECONFIG,
                         "--spare_workers=%d needs --restart_scope=worker: a spare takes one "
                         "failed worker's place while the others keep running",
                         cfg->spare_workers);
    if (cfg->logs_specs)
        return cddp_fail(err, errlen, CDDP_ECONFIG,
                         "--logs_specs=%s: logs_specs plugins are Python entry points; cddprun has "
                         "none (its logs follow torchrun's default layout)",
                         cfg->logs_specs);
    if (cfg->standalone) {
        if (cfg->nnodes_max > 1)
            return cddp_fail(err, errlen, CDDP_ECONFIG,
                             "--standalone runs one node, but --nnodes=%s: give the nodes a "
                             "rendezvous with --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT",
                             cfg->nnodes_arg);
        cddp_strlcpy(cfg->rdzv_host, "127.0.0.1", sizeof(cfg->rdzv_host));
        cfg->rdzv_port = 0;
        return 0;
    }
    /* torchrun's default backend is static, which makes every node rank 0
     * when no --node_rank is given and ignores MIN of MIN:MAX: nobody asks
     * for that. Without --rdzv_backend such a run is elastic: c10d. */
    if (!cfg->rdzv_backend_set &&
        (cfg->nnodes_min != cfg->nnodes_max || (cfg->nnodes_max > 1 && !cfg->node_rank_set)))
        cfg->rdzv_backend = "c10d";
    if (strncmp(cfg->rdzv_backend, "etcd", 4) == 0)
        return etcd_members(cfg, err, errlen);
    if (strcmp(cfg->rdzv_backend, "c10d") == 0) {
        /* torch's parse_rendezvous_endpoint with its default port 29400;
         * an empty endpoint is localhost:29400. */
        char why[256];
        if (endpoint(cfg->rdzv_endpoint, 29400, cfg->rdzv_host, &cfg->rdzv_port, why,
                     sizeof(why)) != 0)
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s: %s", endpoint_name(cfg), why);
        return status_port_clash(cfg, cfg->rdzv_host, cfg->rdzv_port,
                                 "the rendezvous endpoint's port", err, errlen);
    }
    /* static */
    if (cfg->node_rank >= cfg->nnodes_max)
        return cddp_fail(err, errlen, CDDP_ERANGE_ARG,
                         "--node_rank=%d: must be less than --nnodes (%d)", cfg->node_rank,
                         cfg->nnodes_max);
    if (cfg->nnodes_min != cfg->nnodes_max)
        return cddp_fail(
            err, errlen, CDDP_ECONFIG,
            "--nnodes=%s: the static backend runs a fixed number of nodes (--nnodes=N); "
            "for MIN:MAX use --rdzv_backend=c10d",
            cfg->nnodes_arg);
    int rc = static_master(cfg, err, errlen);
    if (rc == 0 && cfg->node_rank == 0 && cfg->nnodes_max > 1)
        rc = status_port_clash(cfg, cfg->static_addr, cfg->static_port + 1,
                               "the port the static backend's agents meet on (MASTER_PORT + 1)",
                               err, errlen);
    return rc;
}
