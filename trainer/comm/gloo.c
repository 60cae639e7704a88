/*
 * gloo.c: the gloo backend's thread and queue (the C half; gloo_shim.cc
 * talks to gloo).
 *
 * gloo's collectives block the calling thread, so the backend owns one
 * communication thread that runs queued work in FIFO order. Synchronous
 * collectives are a start and a wait; async allreduces (DDP buckets) run
 * while the training thread goes on with backward. One thread and one
 * order keep every rank's sequence of collectives identical, which gloo
 * needs (all ranks must issue the same collectives in the same order).
 *
 * gloo bounds each collective by the timeout itself. As a second line of
 * defence the waiter gives up on its own when the running collective has
 * gone past the timeout plus a grace period (a backend stuck outside its
 * timeout handling); the communicator is then abandoned: the thread never
 * touches a work item again, and the worker is expected to exit.
 *
 * With a progress connection (trn_comm_options.progress_kv) the number of
 * each collective the thread starts is published (progress.h), so that
 * after a timeout trn_comm_missing can name the ranks that never started
 * it (--restart_scope=worker: a hung rank is replaced in place).
 *
 * Sends and receives (trn_comm_send, trn_comm_recv) run on the same thread
 * in the same order, but outside the guard's table: only two ranks run
 * one, so it must not take a sequence number (the collectives' numbers
 * would then differ between ranks). The guard bounds it by its own start
 * time (p2p_start_ns) instead, with the same timeout plus grace.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/ifaddr.h"
#include "common/log.h"
#include "common/strutil.h"
#include "trainer/comm/backend.h"
#include "trainer/comm/gloo_shim.h"
#include "trainer/comm/progress.h"
#include "trainer/comm/watchdog_core.h"

struct gloo_backend {
    struct trn_gloo *g;
    double timeout_s;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the comm thread waits here for work */
    pthread_cond_t done_cv; /* waiters wait here for results */
    struct trn_comm_work *head, *tail;
    /* The guard's bookkeeping: the running collective (one at a time) and
     * its deadline, timeout plus grace (watchdog_core.h). */
    struct trn_wd_core wd;
    uint64_t running_seq;  /* 0 when idle */
    uint64_t p2p_start_ns; /* a send or receive running since then; 0: none */
    uint64_t p2p_limit_ns; /* its bound: timeout plus the guard's grace */
    bool stopping;
    bool failed;    /* a collective failed: fail the rest without running them */
    bool abandoned; /* a waiter gave up on a stuck collective: touch nothing */
    struct trn_comm_progress *progress; /* NULL without o->progress_kv */
};

static void *comm_thread(void *arg)
{
    struct gloo_backend *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (b->head == NULL && !b->stopping)
            pthread_cond_wait(&b->work_cv, &b->mu);
        if (b->head == NULL)
            break;
        struct trn_comm_work *w = b->head;
        b->head = w->next;
        if (b->head == NULL)
            b->tail = NULL;
        w->next = NULL;
        uint64_t now = cddp_mono_ns();
        w->start_ns = now;
        if (b->failed) {
            w->rc = CDDP_ESTATE;
            snprintf(w->detail, sizeof(w->detail), "not run: an earlier collective failed");
            w->end_ns = now;
            w->state = TRN_WORK_DONE;
            pthread_cond_broadcast(&b->done_cv);
            continue;
        }
        w->state = TRN_WORK_RUNNING;
        struct trn_wd_coll wc = {.coll = w->coll,
                                 .bucket = w->bucket,
                                 .step = w->step,
                                 .bytes = w->count * trn_comm_dtype_size(w->dtype)};
        if (w->coll == TRN_COLL_SEND || w->coll == TRN_COLL_RECV)
            b->p2p_start_ns = now; /* (no sequence number: see the top) */
        else if (trn_wd_enqueued(&b->wd, &wc, now, &b->running_seq) == 0)
            w->seq = b->running_seq;
        if (b->progress != NULL && w->seq != 0)
            trn_comm_progress_note(b->progress, w->seq);
        pthread_mutex_unlock(&b->mu);

        /* w is ours while RUNNING: the waiter reads it only once DONE. */
        char detail[sizeof(w->detail)];
        int rc = trn_gloo_run(b->g, w, b->timeout_s);
        if (rc < 0)
            cddp_strlcpy(detail, w->detail, sizeof(detail));

        pthread_mutex_lock(&b->mu);
        if (b->running_seq != 0)
            trn_wd_completed(&b->wd, b->running_seq);
        b->running_seq = 0;
        b->p2p_start_ns = 0;
        if (b->abandoned)
            break;
        w->rc = rc;
        w->end_ns = cddp_mono_ns();
        if (rc < 0) {
            b->failed = true;
            cddp_strlcpy(w->detail, detail, sizeof(w->detail));
        }
        w->state = TRN_WORK_DONE;
        pthread_cond_broadcast(&b->done_cv);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static int gloo_start(void *impl, struct trn_comm_work *w)
{
    struct gloo_backend *b = impl;
    pthread_mutex_lock(&b->mu);
    if (b->abandoned || b->stopping) {
        pthread_mutex_unlock(&b->mu);
        return CDDP_ESTATE;
    }
    w->next = NULL;
    if (b->tail)
        b->tail->next = w;
    else
        b->head = w;
    b->tail = w;
    pthread_cond_signal(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static void deadline_ts(uint64_t mono_ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(mono_ns / 1000000000u);
    ts->tv_nsec = (long)(mono_ns % 1000000000u);
}

/* A send or receive past its bound: the waiter gives up on it as on a
 * stuck collective (gloo_wait). */
static bool p2p_stuck(struct gloo_backend *b, struct trn_comm_work *w, uint64_t now)
{
    if (b->p2p_start_ns == 0 || now - b->p2p_start_ns <= b->p2p_limit_ns)
        return false;
    b->abandoned = true;
    b->failed = true;
    w->rc = CDDP_ETIMEOUT;
    w->seq = 0;
    w->start_ns = b->p2p_start_ns;
    w->end_ns = now;
    snprintf(w->detail, sizeof(w->detail),
             "gloo did not return from a send or receive within %.0f s (timeout %.0f s plus "
             "grace); communicator abandoned",
             (double)(now - b->p2p_start_ns) * 1e-9, b->timeout_s);
    return true;
}

static int gloo_wait(void *impl, struct trn_comm_work *w)
{
    struct gloo_backend *b = impl;
    pthread_mutex_lock(&b->mu);
    while (w->state != TRN_WORK_DONE) {
        uint64_t now = cddp_mono_ns();
        if (p2p_stuck(b, w, now))
            break;
        struct trn_wd_decision d;
        if (trn_wd_check(&b->wd, now, &d) == TRN_WD_TIMEOUT) {
            b->abandoned = true;
            b->failed = true;
            w->rc = CDDP_ETIMEOUT;
            w->seq = d.blamed.seq; /* the collective that is stuck */
            w->start_ns = d.blamed.start_ns;
            w->end_ns = now;
            snprintf(w->detail, sizeof(w->detail),
                     "gloo did not return within %.0f s (timeout %.0f s plus grace); "
                     "communicator abandoned",
                     d.waited_s, b->timeout_s);
            break;
        }
        struct timespec ts;
        /* Wake at the guard's deadline, or within a second while queued. */
        uint64_t until = d.have_blamed ? d.next_ns + 1000000u : now + 1000000000u;
        if (b->p2p_start_ns != 0 && b->p2p_start_ns + b->p2p_limit_ns + 1000000u < until)
            until = b->p2p_start_ns + b->p2p_limit_ns + 1000000u;
        deadline_ts(until, &ts);
        pthread_cond_timedwait(&b->done_cv, &b->mu, &ts);
    }
    int rc = w->rc;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int gloo_missing(void *impl, uint64_t seq, double budget_s, int *out, int max)
{
    struct gloo_backend *b = impl;
    return b->progress ? trn_comm_progress_lowest(b->progress, seq, budget_s, out, max) : -1;
}

static void gloo_destroy(void *impl)
{
    struct gloo_backend *b = impl;
    /* (its own thread and store connection: stopped even when abandoned) */
    trn_comm_progress_stop(b->progress);
    b->progress = NULL;
    pthread_mutex_lock(&b->mu);
    b->stopping = true;
    bool abandoned = b->abandoned;
    pthread_cond_signal(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    if (abandoned) {
        /* The thread may still be inside gloo: leave it and its state be. */
        pthread_detach(b->thread);
        return;
    }
    pthread_join(b->thread, NULL);
    trn_gloo_free(b->g);
    trn_wd_free(&b->wd);
    pthread_cond_destroy(&b->work_cv);
    pthread_cond_destroy(&b->done_cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static const struct trn_comm_backend_ops gloo_ops = {
    .name = "gloo",
    .start = gloo_start,
    .wait = gloo_wait,
    .destroy = gloo_destroy,
    .missing = gloo_missing,
    .p2p = true,
};

/* Unblocks SIGPIPE in this thread again, first discarding one that arrived
 * while it was blocked (it would otherwise kill us the moment it is
 * unblocked). */
static void restore_sigpipe(const sigset_t *pipe_set, const sigset_t *old_mask)
{
    if (sigismember(old_mask, SIGPIPE))
        return; /* the caller had it blocked already: leave everything as it was */
    struct timespec zero = {0, 0};
    while (sigtimedwait(pipe_set, NULL, &zero) > 0) {
    }
    pthread_sigmask(SIG_SETMASK, old_mask, NULL);
}

int trn_gloo_backend_create(const struct trn_comm_options *o, struct trn_kv *kv, double timeout_s,
                            const struct trn_comm_backend_ops **ops, void **impl, char *err,
                            size_t errlen)
{
    char host[NI_MAXHOST] = "127.0.0.1";
    const char *iface = getenv("GLOO_SOCKET_IFNAME");
    char ifbuf[64] = "";
    if (iface != NULL && *iface != '\0') {
        /* torch accepts a comma-separated list; one device is enough here. */
        cddp_strlcpy(ifbuf, iface, sizeof(ifbuf));
        char *comma = strchr(ifbuf, ',');
        if (comma != NULL)
            *comma = '\0';
    } else if (o->host != NULL && *o->host != '\0') {
        cddp_strlcpy(host, o->host, sizeof(host));
    } else if (o->route_to != NULL && *o->route_to != '\0') {
        /* The address the route to MASTER_ADDR leaves from: peers on
         * other nodes can reach it (common/ifaddr.h). */
        struct cddp_route route;
        if (cddp_route_to(o->route_to, &route) == 0)
            cddp_strlcpy(host, route.addr, sizeof(host));
    }

    struct gloo_backend *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    b->timeout_s = timeout_s;
    /* Grace past gloo's own timeout before the waiter gives up by itself. */
    double grace_s = 5.0 + 0.1 * timeout_s;
    b->p2p_limit_ns = (uint64_t)((timeout_s + grace_s) * 1e9);
    if (trn_wd_init(&b->wd, timeout_s, grace_s, 4) < 0) {
        free(b);
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    struct trn_gloo_config cfg = {
        .rank = o->rank,
        .world = o->world,
        .host = host,
        .iface = ifbuf[0] ? ifbuf : NULL,
        .prefix = o->store_prefix ? o->store_prefix : "gloo/rank",
        .init_timeout_s = o->init_timeout_s > 0 ? o->init_timeout_s : 300.0,
    };
    log_debug("T6002", "gloo: rank %d/%d binding %s", o->rank, o->world,
              cfg.iface ? cfg.iface : host);
    /* A peer that dies makes gloo write to a closed socket. Python ignores
     * SIGPIPE, so torch never meets it; we block it in every thread that
     * touches gloo's sockets: this one while connecting, and, by
     * inheritance, gloo's event-loop thread (created with the device) and
     * our communication thread. The write then fails with EPIPE and gloo
     * reports the peer's failure. */
    sigset_t pipe_set, old_mask;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
    int rc = trn_gloo_connect(&cfg, kv, &b->g, err, errlen);
    if (rc < 0) {
        restore_sigpipe(&pipe_set, &old_mask);
        trn_wd_free(&b->wd);
        free(b);
        return rc;
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->work_cv, NULL);
    pthread_cond_init(&b->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    int prc = pthread_create(&b->thread, NULL, comm_thread, b);
    restore_sigpipe(&pipe_set, &old_mask);
    if (prc != 0) {
        snprintf(err, errlen, "cannot start the communication thread: %s", strerror(prc));
        trn_gloo_free(b->g);
        pthread_cond_destroy(&b->work_cv);
        pthread_cond_destroy(&b->done_cv);
        pthread_mutex_destroy(&b->mu);
        trn_wd_free(&b->wd);
        free(b);
        return CDDP_ERR_FROM_ERRNO(prc);
    }
    /* Published at most every quarter of the timeout (and every second),
     * so a peer's number is current when a timeout asks for it. */
    double period = timeout_s / 4 < 1.0 ? timeout_s / 4 : 1.0;
    if (o->progress_kv != NULL &&
        trn_comm_progress_start(o->progress_kv, o->restart_count, o->rdzv_round, o->rank, o->world,
                                period > 0.05 ? period : 0.05, &b->progress) < 0)
        b->progress = NULL; /* a timeout then names no ranks */
    *ops = &gloo_ops;
    *impl = b;
    return 0;
}
