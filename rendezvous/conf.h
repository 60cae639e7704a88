/*
 * conf.h: torchrun's --rdzv_conf ("key1=v1,key2=v2") for the c10d-style
 * rendezvous, checked key by key. Every key torchrun's rendezvous backends
 * read is accepted; anything else is refused with an error that names the
 * key and lists the known ones.
 *
 *   join_timeout            s   600  a round must complete within this after a node joins
 *   last_call_timeout       s    30  after min_nodes joined, wait this long for more
 *   close_timeout           s    30  a closed run is remembered this long after its last
 *                                    connection goes (late nodes get "closed")
 *   keep_alive_interval     s     5  heartbeat period
 *   keep_alive_max_attempt  n     3  a node is dead after this many missed heartbeats
 *   heartbeat_timeout       s     5  torch's deadline for one keep-alive write; accepted,
 *                                    no effect (a heartbeat is a queued message here)
 *   read_timeout            s    60  the agent's client: connect (and each welcome), and
 *                                    the silence after which a server that answers
 *                                    heartbeats counts as lost (at least two heartbeats)
 *   is_host                 bool  -  host the server in this agent (default: guessed)
 *   timeout                 s     -  static backend: how long a round may take (torch's
 *                                    store timeout; 900 s when not given, as torchrun)
 *   store_type              str tcp  torch's c10d store; only tcp (no FileStore)
 *   use_libuv               bool  -  accepted for torch 2.x compatibility; no effect
 *   token                   str   -  join token (cddp's; CDDP_RDZV_TOKEN also sets it)
 *   resume_timeout          s     -  a restarted server rebuilds a running round from the
 *                                    members that re-register within this (cddp's; default
 *                                    keep_alive_interval x keep_alive_max_attempt; 0: never)
 *   protocol                str  http etcd-v3: http or https to the etcd members
 *   cacert, cert, key       path  -  etcd-v3: CA bundle; client certificate and key (TLS)
 *   user, password          str   -  etcd-v3: etcd authentication (CDDP_ETCD_PASSWORD also
 *                                    sets the password, kept out of the command line)
 *   key_prefix              str  /cddp/rdzv  etcd-v3: where the runs' keys live (etcd_prefix,
 *                                    torch's etcd name for it, is taken too)
 *
 * Durations are seconds, decimals allowed (torch takes integers; "0.5" is a
 * cddp extension for tests).
 */
#ifndef CDDP_RENDEZVOUS_CONF_H
#define CDDP_RENDEZVOUS_CONF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

struct rdzv_conf {
    uint64_t join_timeout_ms;
    uint64_t last_call_timeout_ms;
    uint64_t close_timeout_ms;
    uint64_t keep_alive_interval_ms;
    int keep_alive_max_attempt;
    uint64_t read_timeout_ms;
    int is_host;                   /* -1: not given */
    uint64_t timeout_ms;           /* 0: not given */
    uint64_t heartbeat_timeout_ms; /* 0: not given; accepted, no effect */
    bool use_libuv;
    bool has_token;
    char token[PROTO_MAX_TOKEN + 1];
    /* resume_timeout: how long a restarted server waits for every member
     * of a round that agents re-register (docs/protocol.md, "A restarted
     * server"); 0: never rebuild. Not given: the keep-alive window. */
    bool has_resume_timeout;
    uint64_t resume_timeout_ms;
    /* etcd-v3 only (docs/etcd.md) */
    bool etcd_https;
    char etcd_cacert[512], etcd_cert[512], etcd_key[512];
    char etcd_key_prefix[256];               /* "" : /cddp/rdzv */
    char etcd_user[128], etcd_password[256]; /* "": no etcd authentication */
};

/* torchrun's defaults. */
void rdzv_conf_init(struct rdzv_conf *c);

/* Sets one key. 0, or CDDP_ECONFIG with a one-line reason in err. */
int rdzv_conf_set(struct rdzv_conf *c, const char *key, const char *value, char *err,
                  size_t errlen);

/* Parses "k1=v1,k2=v2" (torch's format; blanks around keys and values are
 * ignored, an empty string is no keys). 0 or CDDP_ECONFIG with err. */
int rdzv_conf_parse(struct rdzv_conf *c, const char *s, char *err, size_t errlen);

/* Whether key is read by the etcd-v3 backend only. */
bool rdzv_conf_etcd_only(const char *key);

/* The known keys, comma-separated, for messages. */
const char *rdzv_conf_known_keys(void);

/* How long a node may stay silent before it is dead. */
static inline uint64_t rdzv_conf_dead_after_ms(const struct rdzv_conf *c)
{
    return c->keep_alive_interval_ms * (uint64_t)c->keep_alive_max_attempt;
}

/* The grace period for rebuilding a round on a restarted server (0: none). */
static inline uint64_t rdzv_conf_resume_timeout_ms(const struct rdzv_conf *c)
{
    return c->has_resume_timeout ? c->resume_timeout_ms : rdzv_conf_dead_after_ms(c);
}

#endif
