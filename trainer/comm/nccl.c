/*
 * nccl.c: the NCCL backend (CUDA device memory; comm.h says the contract).
 *
 * Set-up: rank 0 makes the unique id and publishes it through the
 * bootstrap store under nccl_key.h's key (restart count, round, group);
 * the others wait for it, bounded by --init-timeout. The communicator is
 * non-blocking (ncclConfig_t.blocking = 0): ncclCommInitRankConfig returns
 * at once and we poll ncclCommGetAsyncError until it is ready or the
 * init timeout passes (then ncclCommAbort and one line saying a rank never
 * arrived), so a missing rank is an error, never a hang.
 *
 * Order: one communication stream (non-blocking) on the device. start()
 * records an event on the compute stream and makes the communication
 * stream wait for it, registers the collective with the watchdog and
 * enqueues the NCCL call. wait() makes the compute stream wait for the
 * collective's completion event and returns: the host does not block.
 * Host memory (cudaPointerGetAttributes: unregistered or pinned host) is
 * staged through a pinned bounce buffer and a device buffer, and wait()
 * then polls until the result is back in host memory, as does a barrier.
 * Nothing here calls cudaStreamSynchronize or cudaDeviceSynchronize on the
 * communicator's behalf: a host wait is a poll that the watchdog can
 * always end.
 *
 * Settling, without a sleep per collective: on a non-blocking communicator
 * NCCL 2.28 runs every collective through a thread of its own
 * (group.cc: ncclGroupEndInternal starts groupLaunchNonBlocking and
 * returns ncclInProgress), and the next call on the communicator must wait
 * until ncclCommGetAsyncError says ncclSuccess; the kernel is on our
 * stream only then, so the completion event can be recorded only then.
 * NCCL 2.28 has no way to make a communicator blocking once its non-
 * blocking init is done (ncclConfig_t.blocking is read at creation; a
 * blocking copy would be a second communicator, ncclCommSplit's), and the
 * non-blocking one is what bounds init, finalize and abort. So a device
 * collective is left "pending": start() returns as soon as NCCL has it,
 * and the settling (a poll: a spin of SETTLE_SPIN_NS, then sched_yield
 * until SETTLE_YIELD_NS, then naps of at most 1 ms) and the event's record
 * happen at the next call that needs them (the next start(), a wait() for
 * it, destroy), while NCCL's thread launches it: the host pays the poll
 * only when it catches up with NCCL. The host time spent per collective
 * is counted and logged at destroy (T2102); tools/gpu-check's ddp stage
 * reads it (docs/gpu.md, "Enqueue cost").
 *
 * Watchdog: a thread polls the completion events of the collectives in
 * flight (in order: one stream) and ncclCommGetAsyncError every
 * TRN_NCCL_POLL_MS and feeds watchdog_core.h. On a timeout or an
 * asynchronous error it calls the exit function (trn_comm_set_watchdog_exit;
 * default trn_comm_fail: error file, exit 75), which ends the process. It
 * never returns to the training thread, which may be blocked inside the
 * CUDA runtime behind the stuck collective by then, and it does not abort
 * the communicator first: an abort makes the stuck kernels return, and the
 * training thread would wake and run on (an optimizer step over partly
 * reduced gradients, a checkpoint of it) in the time the abort and the
 * report take. The process's exit tears the context down, stuck kernels
 * included; the peers see its sockets close (docs/gpu.md, "Watchdog").
 * The training thread makes no CUDA call while holding b->mu, which the
 * watchdog needs for every poll: a launch that blocks behind a hung kernel
 * (a full queue) blocks only that thread. ncclCommGetAsyncError is not
 * only a read: when it finds the last call done it completes NCCL's group
 * job (joins its thread, drops a reference), so two threads calling it at
 * once could complete the same job twice. Every NCCL call here is made
 * under nccl_mu; the watchdog only tries it (pthread_mutex_trylock) and
 * skips NCCL's poll for that beat when the training thread holds it: it
 * must never block behind a call that may itself hang. Its own checks (the
 * completion events, the deadlines) need no NCCL call and always run.
 *
 * Exits: NCCL reads NCCL_DEBUG at its first call; unless the user set it,
 * create() sets NCCL_DEBUG=WARN first, so NCCL's own reason for a failure
 * (a peer's socket closed, a duplicate GPU) reaches the log. NCCL writes it
 * with fwrite on stdout, which is buffered in a pipe: the watchdog's exit
 * flushes stdout and stderr before _exit. While a watchdog runs, any
 * exit() of the process (trn_fatal's, a refusal's) also ends in _exit after
 * a flush (an on_exit handler): the CUDA runtime's own exit-time teardown
 * can wait forever behind a stuck NCCL kernel.
 *
 * Recovering in place (o->recoverable, --restart_scope=worker): the
 * watchdog does not end the rank. It keeps its error, takes nccl_mu
 * (trying for at most WD_ABORT_WAIT_MS; past that it ends the rank as
 * above) and aborts the communicator: the stuck kernels return, the
 * training thread wakes, and its next call (start, wait, sync) returns the
 * watchdog's error, on which the trainer goes back to its recovery point
 * (trainer/inplace.c). What the woken thread computed meanwhile (an
 * optimizer step over partly reduced gradients) is undone there from the
 * step's snapshot. The CUDA context and the device buffers stay; a new
 * communicator comes from trn_comm_create. NEVER RUN ON A GPU YET
 * (docs/distributed.md, "Recovering in place").
 *
 * Checked calls: every CUDA and NCCL call goes through cu_check/nc_check,
 * which write "nccl.c:LINE: call: library message" into the caller's
 * error buffer (set-up, start) or the log (teardown).
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/strutil.h"
#include "trainer/comm/backend.h"
#include "trainer/comm/failure.h"
#include "trainer/comm/nccl_key.h"
#include "trainer/comm/nccl_lib.h"
#include "trainer/comm/progress.h"
#include "trainer/comm/watchdog_core.h"

#define TRN_NCCL_POLL_MS 50 /* watchdog period; the contract says at most 100 */
#define TRN_NCCL_INFLIGHT 256
/* Settling a call NCCL answered ncclInProgress: poll without pause this
 * long (NCCL's thread usually launches within tens of microseconds), then
 * yield the core between polls until SETTLE_YIELD_NS, then nap. */
#define SETTLE_SPIN_NS 200000ull
#define SETTLE_YIELD_NS 5000000ull
/* Recovering in place: how long the watchdog tries for nccl_mu to abort. */
#define WD_ABORT_WAIT_MS 5000

struct nccl_backend {
    int rank, world, device;
    ncclComm_t comm;
    cudaStream_t stream;  /* the communication stream */
    cudaStream_t compute; /* o->cuda_stream (NULL: the legacy default stream) */
    cudaEvent_t ready;    /* recorded on compute, waited on by stream */
    float *dscratch;      /* a barrier's one element */

    /* Host-memory staging for the synchronous calls (one at a time). */
    void *hstage, *dstage;
    size_t stage_size;
    void *staged_out; /* where wait copies the result to (host), or NULL */
    size_t staged_bytes;
    uint64_t staged_seq;

    /* The device collective NCCL accepted (ncclInProgress) whose launch is
     * not settled yet and whose completion event is not recorded (0: none).
     * The training thread's only. */
    uint64_t pending;
    /* Host time per collective (the training thread's): start() from entry
     * to return, and the settling of its launch; logged at destroy. */
    uint64_t n_started, start_ns, start_max_ns, settle_ns, settle_max_ns;

    /* Held around every NCCL call (the training thread's and the
     * watchdog's poll, which only tries it: the preamble). */
    pthread_mutex_t nccl_mu;
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;  /* the watchdog sleeps here (stopping wakes it) */
    pthread_t thread;
    bool thread_started;
    bool stopping;
    bool failed;           /* an NCCL or CUDA call failed: abort, not destroy */
    double coll_timeout_s; /* --collective-timeout: bounds the finalize at exit too */
    struct trn_wd_core wd;
    cudaEvent_t done[TRN_NCCL_INFLIGHT]; /* seq s: done[s % TRN_NCCL_INFLIGHT] */
    bool recorded[TRN_NCCL_INFLIGHT];
    trn_comm_exit_fn exit_fn;
    void *exit_arg;
    struct trn_comm_progress *progress; /* NULL without o->progress_kv */
    /* o->recoverable (the preamble, "Recovering in place"): the watchdog
     * aborted the communicator (b->comm is then NULL, under nccl_mu) and
     * wd_err is what the training thread's next call returns. */
    bool recoverable;
    bool wd_failed;
    struct trn_comm_error wd_err;
};

/* ---- checked calls ---- */

static int cu_check_at(cudaError_t st, const char *what, int line, char *err, size_t errlen)
{
    if (st == cudaSuccess)
        return 0;
    if (err != NULL)
        snprintf(err, errlen, "nccl.c:%d: %s: %s (%s)", line, what, cudaGetErrorString(st),
                 cudaGetErrorName(st));
    else
        log_error("T2106", "nccl.c:%d: %s: %s", line, what, cudaGetErrorString(st));
    return CDDP_EPEER;
}

static int nc_check_at(ncclResult_t st, ncclComm_t comm, const char *what, int line, char *err,
                       size_t errlen)
{
    if (st == ncclSuccess || st == ncclInProgress)
        return 0;
    const char *last = comm != NULL ? ncclGetLastError(comm) : NULL;
    if (err != NULL)
        snprintf(err, errlen, "nccl.c:%d: %s: %s%s%s", line, what, ncclGetErrorString(st),
                 last && *last ? ": " : "", last ? last : "");
    else
        log_error("T2106", "nccl.c:%d: %s: %s", line, what, ncclGetErrorString(st));
    return CDDP_EPEER;
}

#define CU(call, err, len) cu_check_at((call), #call, __LINE__, (err), (len))
#define NC(call, comm, err, len) nc_check_at((call), (comm), #call, __LINE__, (err), (len))

static void nap_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- mappings ---- */

static ncclDataType_t nccl_dtype(enum trn_comm_dtype dt)
{
    switch (dt) {
    case TRN_COMM_F32:
        return ncclFloat32;
    case TRN_COMM_F64:
        return ncclFloat64;
    case TRN_COMM_I32:
        return ncclInt32;
    case TRN_COMM_I64:
        return ncclInt64;
    case TRN_COMM_U8:
        return ncclUint8;
    case TRN_COMM_BF16:
        return ncclBfloat16;
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_redop(enum trn_comm_redop op)
{
    switch (op) {
    case TRN_COMM_SUM:
        return ncclSum;
    case TRN_COMM_AVG:
        return ncclAvg;
    case TRN_COMM_MAX:
        return ncclMax;
    case TRN_COMM_MIN:
        return ncclMin;
    }
    return ncclSum;
}

/* 1 for host memory (pageable or pinned: staged), 0 for memory NCCL can
 * use directly (device, managed), or a negative code with the reason in
 * err. Since CUDA 11 an ordinary host pointer is cudaSuccess with
 * cudaMemoryTypeUnregistered (cuda_runtime_api.h), so an error here is a
 * real one: typically a sticky error from an earlier kernel's fault. Taking
 * it for host memory would memcpy from a device pointer (a SIGSEGV). */
static int on_host(const void *p, const char *which, char *err, size_t errlen)
{
    if (p == NULL)
        return 0;
    struct cudaPointerAttributes a;
    cudaError_t st = cudaPointerGetAttributes(&a, p);
    if (st != cudaSuccess) {
        snprintf(err, errlen,
                 "cudaPointerGetAttributes(%s): %s (%s): the CUDA context failed earlier "
                 "(a sticky error), or the pointer is bad",
                 which, cudaGetErrorString(st), cudaGetErrorName(st));
        return CDDP_EPEER;
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

/* ---- the watchdog ---- */

/* Marks the collectives whose completion event has fired complete, oldest
 * first (one stream: they finish in order). Under b->mu. */
static void retire(struct nccl_backend *b)
{
    uint64_t s;
    while ((s = trn_wd_oldest(&b->wd)) != 0) {
        size_t i = s % TRN_NCCL_INFLIGHT;
        if (!b->recorded[i])
            break;
        cudaError_t q = cudaEventQuery(b->done[i]);
        if (q == cudaErrorNotReady)
            break;
        if (q != cudaSuccess) {
            char why[256];
            snprintf(why, sizeof(why), "CUDA error on the communication stream: %s",
                     cudaGetErrorString(q));
            trn_wd_async_error(&b->wd, CDDP_EPEER, why, cddp_mono_ns());
            break;
        }
        b->recorded[i] = false;
        trn_wd_completed(&b->wd, s);
    }
}

/* Watchdogs running in this process; while there is one, exit() ends in
 * exit_fast's _exit (the preamble, "Exits"). */
static atomic_int live_watchdogs;

static void exit_fast(int status, void *arg)
{
    (void)arg;
    if (atomic_load(&live_watchdogs) == 0)
        return;
    log_debug("T2108",
              "exit %d with the NCCL communicator alive: _exit, without the CUDA "
              "runtime's teardown",
              status);
    fflush(stdout);
    fflush(stderr);
    _exit(status);
}

/* Counts a watchdog in or out; the first one in registers exit_fast. An
 * on_exit handler runs before those registered earlier (the CUDA runtime's
 * among them), and the watchdog starts after the runtime's first call. */
static void watchdog_live(int delta)
{
    static atomic_flag registered = ATOMIC_FLAG_INIT;
    if (delta > 0 && !atomic_flag_test_and_set(&registered) && on_exit(exit_fast, NULL) != 0)
        log_debug("T2108", "on_exit failed: an exit with the communicator alive runs the CUDA "
                           "runtime's teardown");
    atomic_fetch_add(&live_watchdogs, delta);
}

/* Called without b->mu; err, fn and arg were read under it. The report
 * and the exit come first, with the stuck collective left as it is (see the
 * preamble: no abort to wake the training thread). */
static _Noreturn void give_up(struct nccl_backend *b, const struct trn_comm_error *err,
                              trn_comm_exit_fn fn, void *arg)
{
    log_error("T2103", "NCCL watchdog: %s; ending the rank", err->detail);
    /* NCCL's own WARN lines (fwrite on stdout) and ours, before any _exit. */
    fflush(stdout);
    fflush(stderr);
    if (fn != NULL)
        fn(arg, err);
    /* Unset (or an fn that returned, which it must not): the contract's default. */
    trn_comm_fail(err, -1, b->rank, getenv("TORCHELASTIC_ERROR_FILE"));
}

/* Recovering in place (the preamble): keeps err for the training thread
 * and aborts the communicator. Called without b->mu; false when nccl_mu
 * never came free (the caller then ends the rank). */
static bool abort_in_place(struct nccl_backend *b, const struct trn_comm_error *err)
{
    long ms = 0;
    while (pthread_mutex_trylock(&b->nccl_mu) != 0) {
        if (ms++ >= WD_ABORT_WAIT_MS)
            return false;
        nap_ms(1);
    }
    pthread_mutex_lock(&b->mu);
    b->wd_err = *err;
    b->wd_failed = true;
    pthread_mutex_unlock(&b->mu);
    log_warn("T2109", "NCCL watchdog: %s; aborting the communicator, the rank recovers in place",
             err->detail);
    if (b->comm != NULL)
        nc_check_at(ncclCommAbort(b->comm), NULL, "ncclCommAbort", __LINE__, NULL, 0);
    b->comm = NULL;
    pthread_mutex_unlock(&b->nccl_mu);
    return true;
}

/* After a failed call (rc < 0), or to check one: the watchdog's error, when
 * it aborted the communicator, takes the place of the call's own (which
 * only says the communicator went away). Training thread. */
static int adopt_wd_error(struct nccl_backend *b, struct trn_comm_work *w, int rc)
{
    pthread_mutex_lock(&b->mu);
    if (b->wd_failed) {
        rc = b->wd_err.code < 0 ? b->wd_err.code : CDDP_EPEER;
        w->coll = b->wd_err.coll;
        w->seq = b->wd_err.seq;
        snprintf(w->detail, sizeof(w->detail), "%s", b->wd_err.detail);
    }
    pthread_mutex_unlock(&b->mu);
    if (rc < 0)
        b->failed = true;
    return rc;
}

static void *watchdog_thread(void *arg)
{
    struct nccl_backend *b = arg;
    /* The runtime's current device is per thread. */
    CU(cudaSetDevice(b->device), NULL, 0);
    pthread_mutex_lock(&b->mu);
    while (!b->stopping) {
        retire(b);
        /* NCCL's poll only when no NCCL call of the training thread runs
         * (the preamble): a skipped beat is 50 ms late, never a race. */
        if (pthread_mutex_trylock(&b->nccl_mu) == 0) {
            ncclResult_t st = ncclSuccess;
            ncclResult_t qr = ncclCommGetAsyncError(b->comm, &st);
            if (qr != ncclSuccess)
                st = qr;
            char why[256] = "";
            if (st != ncclSuccess && st != ncclInProgress) {
                const char *last = ncclGetLastError(b->comm);
                snprintf(why, sizeof(why), "%s%s%s", ncclGetErrorString(st),
                         last && *last ? ": " : "", last ? last : "");
            }
            pthread_mutex_unlock(&b->nccl_mu);
            if (why[0])
                trn_wd_async_error(&b->wd, CDDP_EPEER, why, cddp_mono_ns());
        }
        uint64_t now = cddp_mono_ns();
        struct trn_wd_decision d;
        if (trn_wd_check(&b->wd, now, &d) != TRN_WD_NONE) {
            trn_comm_exit_fn fn = b->exit_fn;
            void *exit_arg = b->exit_arg;
            pthread_mutex_unlock(&b->mu);
            /* d is a copy (its detail points at the core's first async
             * error, which never changes once set). Ask the store, briefly,
             * who never reached the blamed collective. */
            int missing[64], nmissing = -1;
            if (d.verdict == TRN_WD_TIMEOUT && b->progress != NULL)
                nmissing = trn_comm_progress_missing(b->progress, d.blamed.seq, 2.0, missing,
                                                     (int)(sizeof(missing) / sizeof(missing[0])));
            struct trn_comm_error err; /* the report names the first 16 of nmissing */
            trn_wd_error(&d, "nccl", missing, nmissing, &err);
            err.seq = d.have_blamed ? d.blamed.seq : 0;
            if (b->recoverable && abort_in_place(b, &err))
                return NULL;
            give_up(b, &err, fn, exit_arg);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += TRN_NCCL_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* ---- staging host memory ---- */

static int grow_stage(struct nccl_backend *b, size_t bytes, char *err, size_t errlen)
{
    if (bytes <= b->stage_size)
        return 0;
    size_t want = b->stage_size ? b->stage_size : (1u << 20);
    while (want < bytes)
        want *= 2;
    /* Freeing may wait for the device; only the synchronous host calls
     * grow it, rarely (the first config exchange, SyncBN's statistics). */
    if (b->dstage)
        CU(cudaFree(b->dstage), NULL, 0);
    if (b->hstage)
        CU(cudaFreeHost(b->hstage), NULL, 0);
    b->dstage = b->hstage = NULL;
    b->stage_size = 0;
    int rc = CU(cudaMalloc(&b->dstage, want), err, errlen);
    if (rc == 0)
        rc = CU(cudaMallocHost(&b->hstage, want), err, errlen);
    if (rc == 0)
        b->stage_size = want;
    return rc;
}

/* ---- start / wait ---- */

static int enqueue(struct nccl_backend *b, struct trn_comm_work *w, void *buf, const void *send,
                   char *err, size_t errlen)
{
    ncclDataType_t dt = nccl_dtype(w->dtype);
    switch (w->coll) {
    case TRN_COLL_ALLREDUCE:
        return NC(ncclAllReduce(buf, buf, w->count, dt, nccl_redop(w->redop), b->comm, b->stream),
                  b->comm, err, errlen);
    case TRN_COLL_BROADCAST:
        return NC(ncclBroadcast(buf, buf, w->count, dt, w->root, b->comm, b->stream), b->comm, err,
                  errlen);
    case TRN_COLL_ALLGATHER:
        return NC(ncclAllGather(send, buf, w->count, dt, b->comm, b->stream), b->comm, err, errlen);
    case TRN_COLL_BARRIER:
        return NC(
            ncclAllReduce(b->dscratch, b->dscratch, 1, ncclFloat32, ncclSum, b->comm, b->stream),
            b->comm, err, errlen);
    case TRN_COLL_SEND:
    case TRN_COLL_RECV:
        break; /* (no point to point on nccl: trn_comm_has_p2p is false, comm.c never asks) */
    }
    return CDDP_ERANGE_ARG;
}

static void nap_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

/* A non-blocking communicator may answer a call with ncclInProgress: the
 * next call must wait until it is ready. Bounded by deadline_ns when not 0,
 * else by the watchdog, which ends the rank when a registered collective
 * never completes. Polls without sleeping at first (the preamble,
 * "Settling"); *waited_ns (when not NULL) gets the time it took. */
static int settle_by(struct nccl_backend *b, uint64_t deadline_ns, char *err, size_t errlen,
                     uint64_t *waited_ns)
{
    ncclResult_t st = ncclInProgress;
    uint64_t t0 = cddp_mono_ns(), now = t0;
    long nap = 50;
    for (;;) {
        if (deadline_ns != 0 && now > deadline_ns) {
            snprintf(err, errlen, "still in progress at the deadline");
            return CDDP_ETIMEOUT;
        }
        pthread_mutex_lock(&b->nccl_mu);
        if (b->comm == NULL) { /* the watchdog aborted it (recovering in place) */
            pthread_mutex_unlock(&b->nccl_mu);
            snprintf(err, errlen, "the NCCL communicator was aborted by the watchdog");
            return CDDP_EPEER;
        }
        ncclResult_t qr = ncclCommGetAsyncError(b->comm, &st);
        if (qr != ncclSuccess)
            st = qr;
        const char *last =
            st != ncclSuccess && st != ncclInProgress ? ncclGetLastError(b->comm) : NULL;
        if (st != ncclInProgress && st != ncclSuccess)
            snprintf(err, errlen, "nccl.c:%d: ncclCommGetAsyncError: %s%s%s", __LINE__,
                     ncclGetErrorString(st), last && *last ? ": " : "", last ? last : "");
        pthread_mutex_unlock(&b->nccl_mu);
        now = cddp_mono_ns();
        if (st != ncclInProgress)
            break;
        if (now - t0 < SETTLE_SPIN_NS)
            continue;
        if (now - t0 < SETTLE_YIELD_NS) {
            sched_yield();
        } else {
            nap_us(nap);
            nap = nap < 1000 ? 2 * nap : 1000;
        }
        now = cddp_mono_ns();
    }
    if (waited_ns != NULL)
        *waited_ns = now - t0;
    return st == ncclSuccess ? 0 : CDDP_EPEER;
}

/* Until the communicator's last call is done (non-blocking: ncclInProgress
 * until then); its errors as nc_check reports them. */
static int settle(struct nccl_backend *b, char *err, size_t errlen)
{
    return settle_by(b, 0, err, errlen, NULL);
}

/* Settles the pending device collective's launch (if any) and records its
 * completion event: before anything else is queued on the communication
 * stream, before a wait() on it, at destroy. The training thread's. */
static int settle_pending(struct nccl_backend *b, char *err, size_t errlen)
{
    if (b->pending == 0)
        return 0;
    uint64_t waited = 0;
    int rc = settle_by(b, 0, err, errlen, &waited);
    b->settle_ns += waited;
    if (waited > b->settle_max_ns)
        b->settle_max_ns = waited;
    size_t slot = b->pending % TRN_NCCL_INFLIGHT;
    b->pending = 0;
    if (rc < 0)
        return rc;
    rc = CU(cudaEventRecord(b->done[slot], b->stream), err, errlen); /* not under b->mu */
    pthread_mutex_lock(&b->mu);
    b->recorded[slot] = rc == 0;
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static int start_collective(struct nccl_backend *b, struct trn_comm_work *w)
{
    char *err = w->detail;
    size_t errlen = sizeof(w->detail);
    size_t es = trn_comm_dtype_size(w->dtype);
    size_t out_bytes = w->count * es * (w->coll == TRN_COLL_ALLGATHER ? (size_t)b->world : 1);
    size_t in_bytes = w->count * es;
    int rc;
    if (b->failed) {
        snprintf(err, errlen, "the NCCL communicator failed earlier");
        return CDDP_ESTATE;
    }
    int buf_host = 0, send_host = 0;
    if (w->coll != TRN_COLL_BARRIER && (rc = buf_host = on_host(w->buf, "buf", err, errlen)) < 0)
        goto fail;
    if (w->coll == TRN_COLL_ALLGATHER &&
        (rc = send_host = on_host(w->send, "send", err, errlen)) < 0)
        goto fail;
    if (w->coll == TRN_COLL_ALLGATHER && buf_host != send_host) {
        snprintf(err, errlen, "allgather: one buffer in host memory, the other on the device");
        return CDDP_ERANGE_ARG;
    }
    bool host = buf_host || send_host;
    if (host && b->staged_seq != 0) {
        snprintf(err, errlen, "one collective on host memory at a time (wait for the last one)");
        return CDDP_ESTATE;
    }
    /* The last collective's launch first: nothing may be queued on the
     * communication stream before it, and NCCL takes no call before it. */
    if ((rc = settle_pending(b, err, errlen)) < 0)
        goto fail;
    if (host && (rc = grow_stage(b, in_bytes + out_bytes, err, errlen)) < 0)
        goto fail;

    /* Register first, so a call that blocks in the host is bounded too. */
    struct trn_wd_coll wc = {
        .coll = w->coll, .bucket = w->bucket, .step = w->step, .bytes = in_bytes};
    uint64_t seq = 0;
    pthread_mutex_lock(&b->mu);
    while ((rc = trn_wd_enqueued(&b->wd, &wc, cddp_mono_ns(), &seq)) == CDDP_ETOOBIG) {
        retire(b);
        if (trn_wd_enqueued(&b->wd, &wc, cddp_mono_ns(), &seq) == 0) {
            rc = 0;
            break;
        }
        pthread_mutex_unlock(&b->mu);
        nap_ms(1);
        pthread_mutex_lock(&b->mu);
    }
    size_t slot = seq % TRN_NCCL_INFLIGHT;
    b->recorded[slot] = false;
    pthread_mutex_unlock(&b->mu);
    w->seq = seq;
    if (b->progress != NULL)
        trn_comm_progress_note(b->progress, seq);

    if ((rc = CU(cudaEventRecord(b->ready, b->compute), err, errlen)) < 0 ||
        (rc = CU(cudaStreamWaitEvent(b->stream, b->ready, 0), err, errlen)) < 0)
        goto fail_registered;
    void *buf = w->buf;
    const void *send = w->send;
    if (host) {
        /* in: the input (allgather: send; the rest: buf) -> dstage[0, in);
         * the collective writes dstage[in, in + out) for allgather, in
         * place otherwise. */
        const void *src = w->coll == TRN_COLL_ALLGATHER ? w->send : w->buf;
        memcpy(b->hstage, src, in_bytes);
        if ((rc = CU(
                 cudaMemcpyAsync(b->dstage, b->hstage, in_bytes, cudaMemcpyHostToDevice, b->stream),
                 err, errlen)) < 0)
            goto fail_registered;
        send = b->dstage;
        buf = w->coll == TRN_COLL_ALLGATHER ? (char *)b->dstage + in_bytes : b->dstage;
    }
    pthread_mutex_lock(&b->nccl_mu);
    if (b->comm == NULL) { /* the watchdog aborted it (recovering in place) */
        snprintf(err, errlen, "the NCCL communicator was aborted by the watchdog");
        rc = CDDP_EPEER;
    } else {
        rc = enqueue(b, w, buf, send, err, errlen);
    }
    pthread_mutex_unlock(&b->nccl_mu);
    if (rc < 0)
        goto fail_registered;
    if (!host && w->coll != TRN_COLL_BARRIER) {
        /* A device collective: settled later (the preamble, "Settling"). */
        b->pending = seq;
        return 0;
    }
    /* Host memory and barriers are synchronous exchanges: the copy back
     * (or nothing) right behind the collective, then wait() polls. */
    if ((rc = settle(b, err, errlen)) < 0)
        goto fail_registered;
    if (host) {
        if ((rc = CU(cudaMemcpyAsync(b->hstage, buf, out_bytes, cudaMemcpyDeviceToHost, b->stream),
                     err, errlen)) < 0)
            goto fail_registered;
        b->staged_out = w->buf;
        b->staged_bytes = out_bytes;
    } else {
        b->staged_out = NULL;
        b->staged_bytes = 0;
    }
    b->staged_seq = seq;
    rc = CU(cudaEventRecord(b->done[slot], b->stream), err, errlen); /* not under b->mu */
    pthread_mutex_lock(&b->mu);
    b->recorded[slot] = rc == 0;
    pthread_mutex_unlock(&b->mu);
    if (rc < 0)
        goto fail_registered;
    return 0;

fail_registered:
    /* The watchdog keeps the collective as unfinished: a failure here is
     * reported by the call, and the watchdog ends the rank if the trainer
     * does not. */
fail:
    b->failed = true;
    return rc;
}

static int nccl_start(void *impl, struct trn_comm_work *w)
{
    struct nccl_backend *b = impl;
    uint64_t t0 = cddp_mono_ns();
    int rc = adopt_wd_error(b, w, start_collective(b, w));
    uint64_t spent = cddp_mono_ns() - t0;
    b->n_started++;
    b->start_ns += spent;
    if (spent > b->start_max_ns)
        b->start_max_ns = spent;
    return rc;
}

static int nccl_wait(void *impl, struct trn_comm_work *w)
{
    struct nccl_backend *b = impl;
    if (w->seq != 0 && w->seq == b->staged_seq) {
        /* Host memory, or a barrier: poll until done (the watchdog ends
         * the rank if it never is). */
        long ms = 0;
        for (;;) {
            pthread_mutex_lock(&b->mu);
            retire(b);
            bool busy = trn_wd_in_flight(&b->wd, w->seq);
            bool aborted = b->wd_failed;
            pthread_mutex_unlock(&b->mu);
            if (aborted) { /* (the staged result is not to be trusted) */
                b->staged_seq = 0;
                b->staged_out = NULL;
                return adopt_wd_error(b, w, CDDP_EPEER);
            }
            if (!busy)
                break;
            nap_ms(ms < 10 ? ++ms : 10);
        }
        b->staged_seq = 0;
        if (b->staged_out != NULL)
            memcpy(b->staged_out, b->hstage, b->staged_bytes);
        b->staged_out = NULL;
        return 0;
    }
    int rc = 0;
    /* Its completion event exists once its launch is settled. */
    if (w->seq != 0 && w->seq == b->pending &&
        (rc = settle_pending(b, w->detail, sizeof(w->detail))) < 0) {
        b->failed = true;
        return rc;
    }
    pthread_mutex_lock(&b->mu);
    bool busy = trn_wd_in_flight(&b->wd, w->seq);
    pthread_mutex_unlock(&b->mu);
    /* Not under b->mu. The slot is not reused before this thread starts
     * another collective, and waiting on a completed event costs nothing. */
    if (busy)
        rc = CU(cudaStreamWaitEvent(b->compute, b->done[w->seq % TRN_NCCL_INFLIGHT], 0), w->detail,
                sizeof(w->detail));
    return adopt_wd_error(b, w, rc);
}

/* Waits until every queued collective has completed, the communicator
 * has failed, or the watchdog has aborted it (returns true then);
 * polling, at most 10 ms apart. */
static bool drain(struct nccl_backend *b)
{
    long ms = 0;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        retire(b);
        size_t busy = trn_wd_pending(&b->wd);
        bool aborted = b->wd_failed;
        pthread_mutex_unlock(&b->mu);
        if (aborted)
            return true;
        if (busy == 0 || b->failed)
            return false;
        nap_ms(ms < 10 ? ++ms : 10);
    }
}

/* trn_comm_sync: until nothing is in flight (the watchdog bounds it: it
 * ends the rank, or, recovering in place, aborts and this returns its
 * error). Training thread. */
static int nccl_sync(void *impl, struct trn_comm_work *w)
{
    struct nccl_backend *b = impl;
    int rc = 0;
    if (!b->failed && (rc = settle_pending(b, w->detail, sizeof(w->detail))) < 0)
        return adopt_wd_error(b, w, rc);
    if (drain(b))
        return adopt_wd_error(b, w, CDDP_EPEER);
    if (b->failed) {
        snprintf(w->detail, sizeof(w->detail), "the NCCL communicator failed earlier");
        return CDDP_ESTATE;
    }
    return 0;
}

/* trn_comm_missing, recovering in place: the ranks that never reached the
 * collective the watchdog gave up on (seq: the error's, the same). */
static int nccl_missing(void *impl, uint64_t seq, double budget_s, int *out, int max)
{
    struct nccl_backend *b = impl;
    if (b->progress == NULL || seq == 0)
        return -1;
    return trn_comm_progress_missing(b->progress, seq, budget_s, out, max);
}

static void set_exit(void *impl, trn_comm_exit_fn fn, void *arg)
{
    struct nccl_backend *b = impl;
    pthread_mutex_lock(&b->mu);
    b->exit_fn = fn;
    b->exit_arg = arg;
    pthread_mutex_unlock(&b->mu);
}

static void free_cuda(struct nccl_backend *b)
{
    for (int i = 0; i < TRN_NCCL_INFLIGHT; i++)
        if (b->done[i])
            CU(cudaEventDestroy(b->done[i]), NULL, 0);
    if (b->ready)
        CU(cudaEventDestroy(b->ready), NULL, 0);
    if (b->dscratch)
        CU(cudaFree(b->dscratch), NULL, 0);
    if (b->dstage)
        CU(cudaFree(b->dstage), NULL, 0);
    if (b->hstage)
        CU(cudaFreeHost(b->hstage), NULL, 0);
    if (b->stream)
        CU(cudaStreamDestroy(b->stream), NULL, 0);
}

/* Everything but the communicator and the thread. */
static void free_backend(struct nccl_backend *b)
{
    free_cuda(b);
    trn_wd_free(&b->wd);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    pthread_mutex_destroy(&b->nccl_mu);
    free(b);
}

static void stop_watchdog(struct nccl_backend *b)
{
    if (!b->thread_started)
        return;
    pthread_mutex_lock(&b->mu);
    b->stopping = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
    b->thread_started = false;
    watchdog_live(-1);
}

/* The host time the collectives cost this rank (docs/gpu.md, "Enqueue
 * cost"): what tools/gpu-check's ddp stage reads. */
static void log_host_time(const struct nccl_backend *b)
{
    if (b->n_started == 0)
        return;
    double n = (double)b->n_started;
    log_info("T2102",
             "NCCL: %llu collectives; host time per collective: start %.1f us mean (max %.1f), "
             "settling NCCL's launch (in a later start or wait) %.1f us mean (max %.1f)",
             (unsigned long long)b->n_started, (double)b->start_ns / n * 1e-3,
             (double)b->start_max_ns * 1e-3, (double)b->settle_ns / n * 1e-3,
             (double)b->settle_max_ns * 1e-3);
}

static void nccl_destroy(void *impl)
{
    struct nccl_backend *b = impl;
    char why[384];
    if (!b->failed && settle_pending(b, why, sizeof(why)) < 0) {
        log_warn("T2104", "the last collective's launch: %s; aborting the communicator", why);
        b->failed = true;
    }
    log_host_time(b);
    /* Let the queued collectives finish while the watchdog still bounds
     * them (it ends the rank if they never do). */
    (void)drain(b);
    stop_watchdog(b);
    trn_comm_progress_stop(b->progress);
    b->progress = NULL;
    if (b->comm != NULL) {
        if (b->failed) {
            NC(ncclCommAbort(b->comm), NULL, NULL, 0);
        } else {
            /* Finalize completes once every rank's is quiescent: bounded
             * (the watchdog has stopped) by --collective-timeout, for a
             * peer that died after the last collective. */
            uint64_t deadline = cddp_mono_ns() + (uint64_t)(b->coll_timeout_s * 1e9);
            if (NC(ncclCommFinalize(b->comm), b->comm, why, sizeof(why)) < 0 ||
                settle_by(b, deadline, why, sizeof(why), NULL) < 0) {
                log_warn("T2104", "finalizing the NCCL communicator: %s; aborting it", why);
                NC(ncclCommAbort(b->comm), NULL, NULL, 0);
            } else {
                NC(ncclCommDestroy(b->comm), NULL, NULL, 0);
            }
        }
    }
    free_backend(b);
}

/* trn_comm_abort: no finalize (it would wait on a dead peer), no wait for
 * the queued work; ncclCommAbort unless the watchdog did it already. */
static void nccl_abort(void *impl)
{
    struct nccl_backend *b = impl;
    b->failed = true;
    nccl_destroy(b);
}

static const struct trn_comm_backend_ops nccl_ops = {
    .name = "nccl",
    .start = nccl_start,
    .wait = nccl_wait,
    .destroy = nccl_destroy,
    .set_exit = set_exit,
    .missing = nccl_missing,
    .sync = nccl_sync,
    .abort = nccl_abort,
    .on_device = true,
};

/* ---- set-up ---- */

static void log_version_once(void)
{
    static atomic_bool done;
    if (atomic_exchange(&done, true))
        return;
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess)
        return;
    /* NCCL >= 2.9: major * 10000 + minor * 100 + patch. */
    log_info("T2100", "NCCL %d.%d.%d (built against %d.%d.%d)", v / 10000, (v / 100) % 100, v % 100,
             NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

/* Rank 0 publishes the unique id; the others wait for it until the deadline. */
static int exchange_id(const struct trn_comm_options *o, struct trn_kv *kv, double timeout_s,
                       ncclUniqueId *id, char *err, size_t errlen)
{
    char key[256];
    /* (a group re-formed in place: its generation names the group) */
    char group[32] = "default";
    if (o->generation > 0)
        snprintf(group, sizeof(group), "gen_%ld", o->generation);
    int rc = trn_nccl_id_key(NULL, o->restart_count, o->rdzv_round, group, key, sizeof(key));
    if (rc < 0) {
        snprintf(err, errlen, "cannot make the NCCL unique id's key: %s", cddp_strerror(rc));
        return rc;
    }
    if (o->rank == 0) {
        if ((rc = NC(ncclGetUniqueId(id), NULL, err, errlen)) < 0)
            return rc;
        if (kv == NULL)
            return 0;
        rc = kv->ops->set(kv, key, id, sizeof(*id));
        if (rc < 0)
            snprintf(err, errlen, "publishing the NCCL unique id: %s", kv->err);
        return rc;
    }
    if (kv == NULL) {
        snprintf(err, errlen, "rank %d has no store to read the NCCL unique id from", o->rank);
        return CDDP_ESTATE;
    }
    void *val = NULL;
    size_t len = 0;
    rc = kv->ops->get(kv, key, timeout_s, &val, &len);
    if (rc < 0) {
        snprintf(err, errlen,
                 "rank 0 did not publish the NCCL unique id (%s) within %.1f s "
                 "(--init-timeout): %s",
                 key, timeout_s, kv->err);
        return rc;
    }
    if (len != sizeof(*id)) {
        snprintf(err, errlen, "the NCCL unique id at %s has %zu bytes, not %zu", key, len,
                 sizeof(*id));
        free(val);
        return CDDP_EMISMATCH;
    }
    memcpy(id, val, sizeof(*id));
    free(val);
    return 0;
}

int trn_nccl_backend_create(const struct trn_comm_options *o, struct trn_kv *kv, double timeout_s,
                            const struct trn_comm_backend_ops **ops, void **impl, char *err,
                            size_t errlen)
{
    uint64_t t0 = cddp_mono_ns();
    double init_s = o->init_timeout_s > 0 ? o->init_timeout_s : 300.0;
    uint64_t deadline = t0 + (uint64_t)(init_s * 1e9);
    /* NCCL, opened now (nccl_lib.h): before its first call */
    int lrc = trn_nccl_lib_load(err, errlen);
    if (lrc)
        return lrc;
    /* Before NCCL's first call, which reads it (the preamble, "Exits"). */
    setenv("NCCL_DEBUG", "WARN", 0);
    log_version_once();
    struct nccl_backend *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        snprintf(err, errlen, "out of memory");
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    b->rank = o->rank;
    b->world = o->world;
    b->device = o->cuda_device;
    b->compute = (cudaStream_t)o->cuda_stream;
    b->recoverable = o->recoverable;
    pthread_mutex_init(&b->mu, NULL);
    pthread_mutex_init(&b->nccl_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    b->coll_timeout_s = timeout_s > 0 ? timeout_s : 600.0;
    int rc = trn_wd_init(&b->wd, timeout_s, 0.0, TRN_NCCL_INFLIGHT);
    if (rc < 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if ((rc = CU(cudaSetDevice(b->device), err, errlen)) < 0 ||
        (rc = CU(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), err, errlen)) < 0 ||
        (rc = CU(cudaEventCreateWithFlags(&b->ready, cudaEventDisableTiming), err, errlen)) < 0 ||
        (rc = CU(cudaMalloc((void **)&b->dscratch, sizeof(float)), err, errlen)) < 0 ||
        (rc = CU(cudaMemsetAsync(b->dscratch, 0, sizeof(float), b->stream), err, errlen)) < 0)
        goto fail;
    for (int i = 0; i < TRN_NCCL_INFLIGHT; i++)
        if ((rc = CU(cudaEventCreateWithFlags(&b->done[i], cudaEventDisableTiming), err, errlen)) <
            0)
            goto fail;

    ncclUniqueId id;
    if ((rc = exchange_id(o, kv, init_s, &id, err, errlen)) < 0)
        goto fail;

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    if ((rc = NC(ncclCommInitRankConfig(&b->comm, o->world, id, o->rank, &cfg), NULL, err,
                 errlen)) < 0) {
        b->comm = NULL;
        goto fail;
    }
    ncclResult_t st = ncclInProgress;
    long ms = 0;
    while (st == ncclInProgress) {
        ncclResult_t qr = ncclCommGetAsyncError(b->comm, &st);
        if (qr != ncclSuccess)
            st = qr;
        if (st != ncclInProgress)
            break;
        if (cddp_mono_ns() >= deadline) {
            snprintf(err, errlen,
                     "the NCCL communicator (%d ranks) was not ready after %.1f s "
                     "(--init-timeout): a rank never arrived",
                     o->world, (double)(cddp_mono_ns() - t0) * 1e-9);
            rc = CDDP_ETIMEOUT;
            goto fail;
        }
        nap_ms(ms < 20 ? ++ms : 20);
    }
    if ((rc = NC(st, b->comm, err, errlen)) < 0)
        goto fail;

    if (o->progress_kv != NULL &&
        trn_comm_progress_start(o->progress_kv, o->restart_count, o->rdzv_round, o->rank, o->world,
                                1.0, &b->progress) < 0)
        b->progress = NULL; /* the report then names no ranks */
    int prc = pthread_create(&b->thread, NULL, watchdog_thread, b);
    if (prc != 0) {
        snprintf(err, errlen, "cannot start the NCCL watchdog thread: %s", strerror(prc));
        rc = CDDP_ERR_FROM_ERRNO(prc);
        trn_comm_progress_stop(b->progress);
        goto fail;
    }
    b->thread_started = true;
    watchdog_live(+1);
    log_info("T2101", "NCCL communicator ready: rank %d/%d on CUDA device %d in %.3f s", o->rank,
             o->world, b->device, (double)(cddp_mono_ns() - t0) * 1e-9);
    *ops = &nccl_ops;
    *impl = b;
    return 0;
fail:
    if (b->comm != NULL)
        NC(ncclCommAbort(b->comm), NULL, NULL, 0);
    free_backend(b);
    return rc;
}

int trn_nccl_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    char why[384];
    int rc = CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream), why,
                sizeof(why));
    if (rc < 0)
        log_error("T2105", "%s", why);
    return rc;
}
