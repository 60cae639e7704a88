/*
 * store_server.h: the bootstrap key-value store rank 0 serves on
 * MASTER_ADDR:MASTER_PORT (torchrun's TORCHELASTIC_USE_AGENT_STORE=False
 * arrangement: the workers' rank 0 hosts the store).
 *
 * proto/'s frames, messages and store engine (the same semantics as the
 * rendezvous server's per-job store: set, get with wait, wait, add,
 * compare_set), served by a libuv loop on a thread of its own so the
 * training thread never blocks it. Clients say hello first; anything else
 * gets an error reply and the connection is closed; the server goes on.
 */
#ifndef CDDP_TRAINER_COMM_STORE_SERVER_H
#define CDDP_TRAINER_COMM_STORE_SERVER_H

#include <stddef.h>

struct trn_store_server;

/* Binds host:port and starts serving. A loopback host binds loopback only;
 * any other host binds every interface (as torch's TCPStore does), since
 * MASTER_ADDR names how others reach us, not necessarily one of our own
 * addresses. port 0 picks a free one (tests). While the port is in use (a
 * previous attempt still exiting), binding is retried until bind_timeout_s.
 * 0, or a negative code with a one-line reason in err. */
int trn_store_server_start(const char *host, int port, double bind_timeout_s,
                           struct trn_store_server **out, char *err, size_t errlen);

/* The port it listens on. */
int trn_store_server_port(const struct trn_store_server *s);

/* Closes every connection, stops the thread and frees everything. NULL is fine. */
void trn_store_server_stop(struct trn_store_server *s);

#endif
