/*
 * store_client.h: a blocking client of the bootstrap store (store_server.h),
 * for the training thread, which has no event loop.
 *
 * Every call is bounded by a deadline (poll(2) on one socket); a dead or
 * silent server is an error, never a hang. The client is a struct trn_kv,
 * so the communicator bootstraps through it.
 */
#ifndef CDDP_TRAINER_COMM_STORE_CLIENT_H
#define CDDP_TRAINER_COMM_STORE_CLIENT_H

#include <stddef.h>

#include "trainer/comm/kv.h"

struct trn_store_client;

/* Connects to host:port, retrying with backoff (50 ms doubling to 1 s) while
 * nobody listens yet or the name does not resolve, until timeout_s; then
 * says hello. `who` names this client in the server's log ("rank 3"). 0, or
 * CDDP_ETIMEOUT / another negative code with a one-line reason in err that
 * names the address, the time waited and the last error. */
int trn_store_client_connect(const char *host, int port, double timeout_s, const char *who,
                             struct trn_store_client **out, char *err, size_t errlen);

/* The client as a key-value store (valid until close). */
struct trn_kv *trn_store_client_kv(struct trn_store_client *c);

void trn_store_client_close(struct trn_store_client *c);

#endif
