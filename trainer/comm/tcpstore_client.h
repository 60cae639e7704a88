/*
 * tcpstore_client.h: a blocking client of PyTorch's TCPStore protocol
 * (docs/tcpstore.md), for the store a launcher's agent serves on
 * MASTER_ADDR:MASTER_PORT when TORCHELASTIC_USE_AGENT_STORE=True: cddprun's
 * (store/tcpstore.c), torchrun 1.13's static rendezvous, torchrun >= 2.4.
 *
 * The bytes are store/tcpstore_wire.h's (its query encoder and reply
 * decoder); this file only adds a socket with poll(2) deadlines. The
 * numbering of the query types is found at connect: a GETNUMKEYS in torch
 * 1.13's numbering (V1) is answered at once by a V1 server (torch <= 2.0,
 * cddp's); a torch 2.x server reads it as the start of a WAIT and says
 * nothing, so after a short probe the client reconnects and speaks V2
 * (VALIDATE, then a PING it checks). Neither server is disturbed by the
 * probe: the half-sent query dies with its connection.
 *
 * Every call returns 0 or a negative code (common/errors.h) with one line
 * in trn_tcpstore_last_error(). After a connection error or a local
 * timeout the connection is out of step with the server (a late reply may
 * still come), so every later call answers CDDP_ECLOSED. One thread at a
 * time.
 */
#ifndef CDDP_TRAINER_COMM_TCPSTORE_CLIENT_H
#define CDDP_TRAINER_COMM_TCPSTORE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

struct trn_tcpstore;

/* Connects to host:port, retrying (backoff from 10 ms to 1 s) until
 * timeout_s while the server is not up. 0 with *out, or a negative code
 * with err filled; CDDP_EPARSE: host does not resolve. */
int trn_tcpstore_connect(const char *host, int port, double timeout_s, struct trn_tcpstore **out,
                         char *err, size_t errlen);
void trn_tcpstore_close(struct trn_tcpstore *c);

/* "V1 (torch <= 2.0)" or "V2 (torch 2.x)": the numbering the server took. */
const char *trn_tcpstore_dialect(const struct trn_tcpstore *c);

int trn_tcpstore_set(struct trn_tcpstore *c, const char *key, const void *val, size_t len);
/* Waits up to timeout_s for key (CDDP_ETIMEOUT), then its value in a
 * malloc'd buffer the caller frees (NUL-terminated, not counted in *len). */
int trn_tcpstore_get(struct trn_tcpstore *c, const char *key, double timeout_s, void **val,
                     size_t *len);
/* Adds delta to the decimal integer in key (absent: 0); *out the result. */
int trn_tcpstore_add(struct trn_tcpstore *c, const char *key, int64_t delta, int64_t *out);
/* The number of keys the store holds. */
int trn_tcpstore_num_keys(struct trn_tcpstore *c, int64_t *out);

const char *trn_tcpstore_last_error(const struct trn_tcpstore *c);

#endif
