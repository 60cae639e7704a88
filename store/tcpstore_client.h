/*
 * tcpstore_client.h: a blocking client of PyTorch's TCPStore protocol
 * (docs/tcpstore.md), the one store client of cddp-train's workers: for the
 * store a launcher's agent serves on MASTER_ADDR:MASTER_PORT when
 * TORCHELASTIC_USE_AGENT_STORE=True (cddprun's, store/tcpstore.c; torchrun
 * 1.13's static rendezvous; torchrun >= 2.4), and for the one their rank 0
 * serves otherwise (tcpstore_thread.h).
 *
 * Semantics: set, get (wait for the key, then fetch it), add and num_keys,
 * as torch's TCPStore client has them. The bytes are tcpstore_wire.h's (its
 * query encoder and reply decoder); this file only adds a socket with
 * poll(2) deadlines (common/sock.h), so it works from any thread, with or
 * without an event loop. The numbering of the query types is found at
 * connect unless the caller knows it (options.dialect): a GETNUMKEYS in
 * torch 1.13's numbering (V1) is answered at once by a V1 server (torch <=
 * 2.0, cddp's); a torch 2.x server reads it as the start of a WAIT and says
 * nothing, so after a 2 s probe the client reconnects and speaks V2
 * (VALIDATE, then a PING it checks). Neither server is disturbed by the
 * probe: the half-sent query dies with its connection.
 *
 * Errors: every call returns 0 or a negative code (common/errors.h) with
 * one line in tcpstore_client_last_error(). After a connection error or a
 * local timeout the connection is out of step with the server (a late
 * reply may still come), so every later call answers CDDP_ECLOSED; the one
 * exception is a get whose wait timed out on a connection made with
 * options.cancel_waits, which cancels the wait and stays usable.
 *
 * Threading: one thread at a time per client; give each thread its own.
 * Ownership: tcpstore_client_connect() gives the caller a client, which
 * tcpstore_client_close() frees (NULL is ignored); a value a get returns is
 * the caller's to free(). Limits: keys, values and replies are bounded by
 * tcpstore_wire.h's default limits (a reply past them is CDDP_ETOOBIG).
 */
#ifndef CDDP_STORE_TCPSTORE_CLIENT_H
#define CDDP_STORE_TCPSTORE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/tcpstore_wire.h"

struct tcpstore_client;

struct tcpstore_client_options {
    /* Keep connecting this long while nothing listens yet (backoff from
     * 10 ms to 1 s); it also bounds finding the numbering (at least 2 s
     * when it probes). <= 0: one attempt. */
    double connect_timeout_s;
    /* How long set, add, num_keys, a get's fetch after its wait, and a
     * wait's cancel wait for their reply. <= 0: 300 s, torch's default
     * store timeout. */
    double op_timeout_s;
    /* The server's numbering when the caller knows it: V1 skips the probe
     * for torch 2.x (the server must answer one GETNUMKEYS in torch 1.13's
     * numbering within connect_timeout_s), V2 goes straight to VALIDATE and
     * PING. TCPSTORE_DIALECT_UNKNOWN (0): find out. */
    enum tcpstore_dialect dialect;
    /* The server understands CANCEL_WAIT in the numbering spoken (cddp's
     * store/tcpstore.c in both; torch 1.13's does not know it, so never set
     * this for a server that may be torch's): a get whose wait times out
     * sends CANCEL_WAIT and the connection stays usable. */
    bool cancel_waits;
};

/* Connects to host:port and settles the numbering (o NULL: every option
 * 0). 0 with *out, or a
 * negative code with err filled (CDDP_EPARSE: host does not resolve;
 * "cannot connect ..." when nothing listened within connect_timeout_s). */
int tcpstore_client_connect(const char *host, int port, const struct tcpstore_client_options *o,
                            struct tcpstore_client **out, char *err, size_t errlen);
void tcpstore_client_close(struct tcpstore_client *c);

/* "V1 (torch <= 2.0)" or "V2 (torch 2.x)": the numbering the server took. */
const char *tcpstore_client_dialect(const struct tcpstore_client *c);

int tcpstore_client_set(struct tcpstore_client *c, const char *key, const void *val, size_t len);
/* Waits up to timeout_s for key (CDDP_ETIMEOUT), then its value in a
 * malloc'd buffer the caller frees (NUL-terminated, not counted in *len). */
int tcpstore_client_get(struct tcpstore_client *c, const char *key, double timeout_s, void **val,
                        size_t *len);
/* Adds delta to the decimal integer in key (absent: 0); *out the result. */
int tcpstore_client_add(struct tcpstore_client *c, const char *key, int64_t delta, int64_t *out);
/* The number of keys the store holds. */
int tcpstore_client_num_keys(struct tcpstore_client *c, int64_t *out);

const char *tcpstore_client_last_error(const struct tcpstore_client *c);

#endif
