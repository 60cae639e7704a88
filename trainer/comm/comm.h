/*
 * comm.h: collectives for cddp-train, whatever moves the bytes.
 *
 * One communicator per process group. Backends: "local" (world size 1: no
 * peers, every collective is a copy or nothing), "gloo" (CPU tensors over
 * TCP; gloo_shim.cc is the project's only C++), "nccl" (CUDA device memory,
 * trainer/comm/nccl.c; built when CUDA and NCCL are). The training loop and
 * ddp.c see only this interface.
 *
 * NCCL. Buffers are device memory of o->cuda_device, except that the
 * synchronous calls also take host memory (staged through a device buffer,
 * for the small exchanges: config checks, SyncBN statistics copied to the
 * host). Collectives are ordered with the compute stream o->cuda_stream:
 * start makes the communicator's stream wait for everything queued on the
 * compute stream so far (an event), enqueues the NCCL call and records a
 * completion event; wait makes the compute stream wait for that event and
 * returns at once (stream-ordered: the optimizer step that follows runs after
 * the reduction, the host does not block). A synchronous call on host memory
 * returns when the result is in host memory. A watchdog thread polls every
 * completion event and ncclCommGetAsyncError at least every 100 ms; past the
 * timeout, or on an asynchronous error, it aborts the communicator, writes
 * the error file and exits 75 itself (trn_comm_set_watchdog_exit), since the
 * main thread may be blocked in the CUDA runtime by then.
 *
 * Ordering. Collectives run in the order they are issued, one at a time, on
 * the communicator's own thread (gloo). Every rank must issue the same
 * collectives in the same order, as with torch.distributed. The synchronous
 * calls are a start and a wait.
 *
 * Async. trn_comm_allreduce_start() queues an allreduce and returns at once;
 * the caller owns the struct trn_comm_work (embed it in a bucket), must not
 * touch the buffer until trn_comm_wait() returns, and waits for every work it
 * started. When start returns an error the work was not queued and must not
 * be waited for.
 *
 * Failure. Each collective is bounded by the communicator's timeout
 * (--collective-timeout, default 600 s like NCCL's). When one times out or a
 * peer fails during it, the call returns CDDP_ETIMEOUT or CDDP_EPEER and
 * trn_comm_last_error() describes it (which collective, how long it waited,
 * the backend's words). The communicator is then broken: every later call
 * fails at once with CDDP_ESTATE. The worker is expected to stop (see
 * trn_comm_fail() in failure.h: error file, exit 75), and the agent restarts
 * the group.
 */
#ifndef CDDP_TRAINER_COMM_COMM_H
#define CDDP_TRAINER_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/comm/kv.h"

#define TRN_COMM_DEFAULT_TIMEOUT_S 600.0

enum trn_comm_dtype {
    TRN_COMM_F32 = 0,
    TRN_COMM_F64,
    TRN_COMM_I32,
    TRN_COMM_I64,
    TRN_COMM_U8,
    TRN_COMM_BF16, /* nccl only (DDP's bf16 gradient compression); gloo refuses it */
};

enum trn_comm_redop {
    TRN_COMM_SUM = 0,
    TRN_COMM_AVG, /* sum / world; floating-point types only */
    TRN_COMM_MAX,
    TRN_COMM_MIN,
};

enum trn_comm_coll {
    TRN_COLL_BROADCAST = 0,
    TRN_COLL_ALLREDUCE,
    TRN_COLL_ALLGATHER,
    TRN_COLL_BARRIER,
    TRN_COLL_SEND, /* point to point (trn_comm_send, trn_comm_recv): gloo only */
    TRN_COLL_RECV,
};

/* What went wrong in a collective (or in creating the communicator). */
struct trn_comm_error {
    int code; /* 0, CDDP_ETIMEOUT, CDDP_EPEER, CDDP_ESTATE, -errno, ... */
    enum trn_comm_coll coll;
    char op[24];      /* "allreduce", "broadcast", "allgather", "barrier", "send", "recv",
                         "connect" */
    size_t bytes;     /* payload per rank */
    double waited_s;  /* from the collective's start to its failure */
    double timeout_s; /* the bound in force */
    char detail[384]; /* the backend's message, one line */
    uint64_t seq;     /* the failed collective's number (trn_comm_work.seq); 0: none */
};

/* One queued collective. Embed it; its fields are the communicator's while
 * queued (between start and wait). */
struct trn_comm_work {
    struct trn_comm_work *next;
    enum trn_comm_coll coll;
    void *buf;        /* in/out (allreduce, broadcast); output (allgather: world * count; recv) */
    const void *send; /* allgather input (count); may alias buf + rank * count; send's input */
    size_t count;     /* elements per rank */
    enum trn_comm_dtype dtype;
    enum trn_comm_redop redop;
    int root;  /* broadcast's root; send: the destination, recv: the source */
    int state; /* private */
    int rc;
    uint64_t start_ns, end_ns;
    char detail[384];
    /* What the watchdog reports about it (set by start): the DDP bucket
     * (trn_comm_allreduce_start_bucket; -1 otherwise), the step from
     * trn_comm_set_step, and its sequence number on the communicator
     * (1, 2, ...: the same collective has the same number on every rank). */
    int bucket;
    long step;
    uint64_t seq;
};

struct trn_comm_options {
    int rank;
    int world;
    double timeout_s;      /* per collective; <= 0: TRN_COMM_DEFAULT_TIMEOUT_S */
    double init_timeout_s; /* connecting the mesh through the store */
    const char *backend;   /* NULL or "gloo", or "nccl" (world 1 always uses "local") */
    /* nccl: the CUDA device, and the compute stream (a cudaStream_t) the
     * collectives are ordered with (NULL: the legacy default stream). */
    int cuda_device;
    void *cuda_stream;
    /* nccl: rank 0 publishes the unique id under a key naming both, so a
     * restarted or re-formed group never reads a stale id
     * (pytorch/pytorch#135712): TORCHELASTIC_RESTART_COUNT and the
     * rendezvous round (CDDP_RDZV_ROUND; 0 when the launcher does not say). */
    long restart_count;
    long rdzv_round;
    /* Local address peers reach this rank at (gloo binds there). NULL: the
     * address the route to `route_to` leaves from (so it works across nodes),
     * or 127.0.0.1. GLOO_SOCKET_IFNAME, when set, names an interface instead. */
    const char *host;
    const char *route_to;     /* usually MASTER_ADDR */
    const char *store_prefix; /* keys under this prefix; NULL: "gloo/rank" */
    /* nccl and gloo, optional: a store connection of its own, kept open
     * by the caller until trn_comm_destroy returns, on which the
     * communicator publishes its progress (trainer/comm/progress.h) so a
     * timeout can name the ranks that never reached the collective (nccl's
     * report; gloo: trn_comm_missing). NULL: not named. */
    struct trn_kv *progress_kv;
    /* nccl: the group re-formed in place (--restart_scope=worker's
     * generation; 0: none). The unique id's key names it (nccl_key.h). */
    long generation;
    /* nccl, for recovering in place: when the watchdog gives up (a
     * timeout, a peer's asynchronous error) it aborts the communicator
     * (ncclCommAbort: the stuck kernels return; the CUDA context and the
     * device buffers stay) and keeps the error, which the training
     * thread's next call returns (start, wait, trn_comm_sync), instead of
     * ending the process through trn_comm_set_watchdog_exit's function.
     * gloo reports through the failing call anyway and ignores it. */
    bool recoverable;
};

struct trn_comm;

/* Creates the communicator and connects it to every peer through kv
 * (world > 1). Borrows kv for the call only. On failure returns a negative
 * code and fills *err (op "connect"). */
int trn_comm_create(const struct trn_comm_options *o, struct trn_kv *kv, struct trn_comm **out,
                    struct trn_comm_error *err);
/* Waits for queued work, then frees everything. NULL is fine. Do not call on
 * a broken communicator whose backend may still be stuck; just exit. */
void trn_comm_destroy(struct trn_comm *c);
/* Frees the communicator without waiting on its peers: nccl aborts it
 * (ncclCommAbort, never a finalize that would wait on a dead peer); the
 * CUDA context and the caller's device buffers stay. A backend without an
 * abort (gloo: its failed calls have returned already) is destroyed.
 * NULL is fine. */
void trn_comm_abort(struct trn_comm *c);

int trn_comm_rank(const struct trn_comm *c);
int trn_comm_world(const struct trn_comm *c);
const char *trn_comm_backend(const struct trn_comm *c);
double trn_comm_timeout(const struct trn_comm *c);

size_t trn_comm_dtype_size(enum trn_comm_dtype dt);

/* Synchronous collectives. 0 or a negative code (see the header comment). */
int trn_comm_broadcast(struct trn_comm *c, void *buf, size_t count, enum trn_comm_dtype dt,
                       int root);
int trn_comm_allreduce(struct trn_comm *c, void *buf, size_t count, enum trn_comm_dtype dt,
                       enum trn_comm_redop op);
/* recv holds world * count elements, rank r's block at r * count. */
int trn_comm_allgather(struct trn_comm *c, const void *send, void *recv, size_t count,
                       enum trn_comm_dtype dt);
int trn_comm_barrier(struct trn_comm *c);

/* Point to point (gloo; trn_comm_has_p2p). trn_comm_send sends count
 * elements of buf to rank peer; trn_comm_recv receives them from rank
 * peer into buf. Only the two ranks call it, each its half, in the same
 * order relative to the other sends and receives between them; they queue
 * with the collectives (one order per rank), are bounded by the timeout and
 * fail like a collective (CDDP_ETIMEOUT, CDDP_EPEER; op "send" or "recv";
 * the communicator is then broken). They take no sequence number
 * (trn_comm_work.seq 0, trn_comm_missing: -1), so a collective keeps the
 * same number on every rank whoever sent what. A backend without them
 * (nccl, local) returns -ENOTSUP and stays usable; peer == self or out of
 * range: CDDP_ERANGE_ARG. */
bool trn_comm_has_p2p(const struct trn_comm *c);
int trn_comm_send(struct trn_comm *c, const void *buf, size_t count, enum trn_comm_dtype dt,
                  int peer);
int trn_comm_recv(struct trn_comm *c, void *buf, size_t count, enum trn_comm_dtype dt, int peer);

/* Async allreduce (in place on buf). 0: queued, wait for it. Negative: not
 * queued (bad argument, or the communicator is broken). */
int trn_comm_allreduce_start(struct trn_comm *c, struct trn_comm_work *w, void *buf, size_t count,
                             enum trn_comm_dtype dt, enum trn_comm_redop op);
/* The same, naming the DDP bucket it reduces (the watchdog's report says
 * "bucket N"). trn_comm_allreduce_start is this with bucket -1. */
int trn_comm_allreduce_start_bucket(struct trn_comm *c, struct trn_comm_work *w, void *buf,
                                    size_t count, enum trn_comm_dtype dt, enum trn_comm_redop op,
                                    int bucket);
/* The training step the collectives started from now on belong to (-1, the
 * default: none); the watchdog's report names it. Call it from the thread
 * that starts the collectives. */
void trn_comm_set_step(struct trn_comm *c, long step);
/* Waits for w. 0, or the collective's error (trn_comm_last_error says more). */
int trn_comm_wait(struct trn_comm *c, struct trn_comm_work *w);

/* Until every collective started so far has completed: 0, or the error
 * (recorded as trn_comm_last_error) of one that failed. nccl: a host-side
 * poll of the completion events, bounded by the watchdog (with
 * o->recoverable it returns the watchdog's error); gloo and local: every
 * wait was synchronous already, 0 (or the broken state's CDDP_ESTATE). */
int trn_comm_sync(struct trn_comm *c);

/* Nanoseconds the calling thread has spent blocked in trn_comm_wait (the
 * synchronous calls included) since the communicator was made: the time a
 * rank waited for its peers and the wire, which the progress line reports
 * as wait_s. With NCCL a wait is stream-ordered and returns at once, so
 * this counts only what the host itself waited for. */
uint64_t trn_comm_wait_ns(const struct trn_comm *c);

/* The first failure (code 0 if none). */
const struct trn_comm_error *trn_comm_last_error(const struct trn_comm *c);

/* After a collective timed out (trn_comm_last_error's code CDDP_ETIMEOUT):
 * the ranks that never reached it and are furthest behind (a rank stuck
 * in an earlier collective, waiting for them, is left out), asked of the
 * store (progress.h) within budget_s. Writes up to max of them in rank order and returns how many
 * there are; -1 when that is not known (no progress_kv, another failure,
 * the store did not answer in time). gloo, and nccl with o->recoverable
 * (the collective its watchdog gave up on); a nccl watchdog that ends the
 * rank names them in its own report. */
int trn_comm_missing(struct trn_comm *c, double budget_s, int *out, int max);

/* True when the communicator's buffers are CUDA device memory (nccl). */
bool trn_comm_on_device(const struct trn_comm *c);

/* What the NCCL watchdog does when it gives up (a collective past the
 * timeout, or an asynchronous error): it calls fn(arg, err) on its own
 * thread, which must not return (the trainer's: trn_comm_fail with the
 * step the training loop last published, error file, exit 75). Unset, the
 * watchdog calls trn_comm_fail(err, -1, rank, TORCHELASTIC_ERROR_FILE). gloo
 * reports through the failing call instead and ignores this. */
typedef void (*trn_comm_exit_fn)(void *arg, const struct trn_comm_error *err);
void trn_comm_set_watchdog_exit(struct trn_comm *c, trn_comm_exit_fn fn, void *arg);

/* "allreduce", ... */
const char *trn_comm_coll_name(enum trn_comm_coll coll);

#endif
