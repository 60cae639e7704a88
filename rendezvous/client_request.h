/*
 * client_request.h: the agent's rendezvous client from the inside, for
 * client.c and client_kv.c only (its users have client.h).
 */
#ifndef CDDP_RENDEZVOUS_CLIENT_REQUEST_H
#define CDDP_RENDEZVOUS_CLIENT_REQUEST_H

#include "proto/msg.h"
#include "rendezvous/client.h"

/* Sends m (this sets its id) as a request whose result goes to cb, matched
 * by id. cb is called once: with the server's result; -ECONNRESET when the
 * connection is lost first (the client reconnects); the error that ended
 * the client when it is lost for good; -ECANCELED when the client is closed
 * first. While disconnected the frame waits and goes out after the welcome.
 * 0, or an error, and then cb is never called: CDDP_ECLOSED (the client is
 * closed or lost for good), ENOMEM, or what sending failed with. m and what
 * it points to are encoded here: they need to live only during the call. */
int rdzv_client_request(struct rdzv_client *c, struct proto_msg *m, rdzv_store_cb cb, void *arg);

#endif
