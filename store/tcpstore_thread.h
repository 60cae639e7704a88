/*
 * tcpstore_thread.h: the TCPStore server (tcpstore.h) on a thread of its
 * own, with its own libuv loop, for a program that has no loop to put it
 * on: cddp-train's rank 0 serves its workers' bootstrap store with it when
 * no launcher's agent serves one (TORCHELASTIC_USE_AGENT_STORE=False).
 * Its clients speak torch's TCPStore protocol: tcpstore_client.h, or
 * torch's own.
 *
 *     struct tcpstore_thread *t;
 *     int port;
 *     char err[256];
 *     if (tcpstore_thread_start(NULL, master_port, &t, &port, err, sizeof(err)))
 *         fail("%s", err);   // e.g. "cannot listen on * port 29500: address already in use"
 *     ... train ...
 *     tcpstore_thread_stop(t);
 *
 * Semantics: the store's limits are tcpstore.h's defaults. Start and stop
 * are bounded: start binds and listens on the caller's thread (resolving
 * host, when it is a name, is the only wait) and returns once the server
 * accepts connections, or with the reason it cannot; the thread only runs
 * the loop. Stop closes the listener and every connection at once (clients
 * see their connection close; nothing waits for a peer), then joins the
 * thread.
 *
 * Threading: start and stop are called from one thread, any; the server's
 * thread blocks every signal (they stay with the program's own threads; a
 * write to a peer that left is EPIPE, not SIGPIPE). Ownership: start gives
 * the caller the thread, and stop frees it and everything it served (NULL
 * is ignored). When start returns an error, nothing is left running.
 */
#ifndef CDDP_STORE_TCPSTORE_THREAD_H
#define CDDP_STORE_TCPSTORE_THREAD_H

#include <stddef.h>

struct tcpstore_thread;

/* Serves a store on host:port (host NULL or "": every interface; port 0: a
 * free port, given back in *port_out, which may be NULL). 0 with *out, or
 * a negative code (a libuv code for the listening socket: -EADDRINUSE for
 * a port that is held) with one line in err. */
int tcpstore_thread_start(const char *host, int port, struct tcpstore_thread **out, int *port_out,
                          char *err, size_t errlen);

/* Stops serving, joins the thread and frees everything. */
void tcpstore_thread_stop(struct tcpstore_thread *t);

#endif
