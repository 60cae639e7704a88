/* tcpstore_thread.c: the TCPStore server on a thread of its own; see
 * tcpstore_thread.h.
 *
 * The loop and the server are set up on the caller's thread, so a bind
 * error comes back without a thread ever starting; pthread_create then
 * hands the loop over (it orders those writes before the thread's first
 * read), and from there on only the server's thread touches it, except
 * for uv_async_send, which libuv allows from any thread. */
#include "store/tcpstore_thread.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "common/errors.h"
#include "store/tcpstore.h"

struct tcpstore_thread {
    pthread_t thread;
    uv_loop_t loop;
    uv_async_t stop;
    struct tcpstore_server *srv;
};

/* On the server's thread: close everything; uv_run then returns. */
static void on_stop(uv_async_t *a)
{
    struct tcpstore_thread *t = a->data;
    tcpstore_server_close(t->srv, NULL, NULL);
    uv_close((uv_handle_t *)&t->stop, NULL);
}

static void *thread_main(void *arg)
{
    struct tcpstore_thread *t = arg;
    uv_run(&t->loop, UV_RUN_DEFAULT);
    return NULL;
}

int tcpstore_thread_start(const char *host, int port, struct tcpstore_thread **out, int *port_out,
                          char *err, size_t errlen)
{
    struct tcpstore_thread *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    int rc = uv_loop_init(&t->loop);
    if (rc) {
        snprintf(err, errlen, "cannot start the store's loop: %s", uv_strerror(rc));
        free(t);
        return rc;
    }
    struct tcpstore_server_options o = {.host = host, .port = port};
    rc = tcpstore_server_start(&t->loop, &o, &t->srv, err, errlen);
    if (rc == 0) {
        rc = uv_async_init(&t->loop, &t->stop, on_stop);
        t->stop.data = t;
        if (rc) {
            snprintf(err, errlen, "cannot start the store's thread: %s", uv_strerror(rc));
            tcpstore_server_close(t->srv, NULL, NULL);
        }
    }
    if (rc == 0) {
        int bound = tcpstore_server_port(t->srv);
        /* The thread takes no signals: they belong to the program's threads. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int prc = pthread_create(&t->thread, NULL, thread_main, t);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (prc == 0) {
            if (port_out)
                *port_out = bound;
            *out = t;
            return 0;
        }
        rc = CDDP_ERR_FROM_ERRNO(prc);
        snprintf(err, errlen, "cannot start the store's thread: %s", strerror(prc));
        tcpstore_server_close(t->srv, NULL, NULL);
        uv_close((uv_handle_t *)&t->stop, NULL);
    }
    /* Whatever was started is closing: let its close callbacks run. */
    uv_run(&t->loop, UV_RUN_DEFAULT);
    uv_loop_close(&t->loop);
    free(t);
    return rc;
}

void tcpstore_thread_stop(struct tcpstore_thread *t)
{
    if (t == NULL)
        return;
    uv_async_send(&t->stop);
    pthread_join(t->thread, NULL);
    uv_loop_close(&t->loop);
    free(t);
}
