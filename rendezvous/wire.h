/*
 * wire.h: libuv helpers shared by the rendezvous server and the agent's
 * client (internal to rendezvous/): sending one message as one frame,
 * naming socket addresses, resolving "host" for listen and connect, and the
 * constant-time token comparison.
 */
#ifndef CDDP_RENDEZVOUS_WIRE_H
#define CDDP_RENDEZVOUS_WIRE_H

#include <stdbool.h>
#include <stddef.h>

#include <uv.h>

#include "common/strutil.h"
#include "proto/msg.h"

/* Encodes m and queues it on stream (one uv_write that owns its buffer).
 * 0, or a negative code (encode error, uv_write error); nothing is queued
 * on error. */
int rdzv_wire_send(uv_stream_t *stream, const struct proto_msg *m);

/* Queues the bytes of b as one write; the write takes b's buffer over and b
 * is left empty (reusable). 0 or a uv error (b unchanged then). */
int rdzv_wire_write_buf(uv_stream_t *stream, struct cddp_buf *b);

/* Sends an error message. */
int rdzv_wire_send_error(uv_stream_t *stream, int code, const char *message);

/* "1.2.3.4" / "::1" (IPv4-mapped IPv6 shown as IPv4), and whether it is a
 * loopback address. 0 or a uv error. */
int rdzv_wire_addr_name(const struct sockaddr *sa, char *buf, size_t len, bool *loopback);

/* The port of a bound or connected socket address (0 if unknown). */
int rdzv_wire_addr_port(const struct sockaddr *sa);

/* Resolves host (name, IPv4, IPv6 without brackets) synchronously into a
 * list the caller frees with uv_freeaddrinfo. passive: for bind (host may be
 * NULL/"" for every interface). 0 or a uv error; err names the problem. */
int rdzv_wire_resolve(uv_loop_t *loop, const char *host, int port, bool passive,
                      struct addrinfo **out, char *err, size_t errlen);

/* Compares a token without leaking through timing where they differ. */
bool rdzv_wire_token_equal(const char *expected, const char *given);

#endif
