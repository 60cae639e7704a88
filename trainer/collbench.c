/*
 * cddp-collbench: checks and measures the collectives of trainer/comm/ over
 * real processes, started like cddp-train (torchrun's environment: RANK,
 * WORLD_SIZE, MASTER_ADDR, MASTER_PORT; none = world size 1).
 *
 *   cddp-collbench [--check]   every collective at sizes that are multiples of
 *                              nothing, results verified on every rank
 *   cddp-collbench --bench     allreduce (sum, f32) bus bandwidth, 1 MiB..256 MiB
 *
 * --backend gloo (the default) reduces host memory; --backend nccl --device
 * cuda (built when NCCL is: CDDP_HAVE_NCCL) reduces CUDA device memory of
 * GPU LOCAL_RANK, ordered with a compute stream of its own, the way
 * cddp-train's DDP does: the check copies each input to the device, runs the
 * collective there and copies the result back to verify it on the host; the
 * bench times allreduces of a device buffer until the stream has finished
 * them. Bus bandwidth is nccl-tests' for allreduce: algbw * 2 (n - 1) / n,
 * algbw = bytes / time.
 *
 * A failed collective ends the process the way cddp-train's loop does:
 * torchrun's error file and exit 75 (trn_comm_fail). --fault injects the
 * trainer's faults, with "step" meaning a round of the check (one size) or
 * one measured size of the bench. The benchmark driver is
 * tests/bench/bench_allreduce.py.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#include "common/clock.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/strutil.h"
#include "trainer/comm/bootstrap.h"
#include "trainer/comm/comm.h"
#include "trainer/comm/failure.h"
#include "trainer/fault.h"

#if defined(CDDP_HAVE_NCCL) && CDDP_HAVE_NCCL
#include <cuda_runtime_api.h>
#define HAVE_NCCL 1
#else
#define HAVE_NCCL 0
#endif

struct opts {
    bool bench;
    size_t min_bytes, max_bytes;
    long iters; /* 0: by size */
    long warmup;
    double timeout_s, init_timeout_s;
    struct trn_fault fault;
    bool json;
    const char *backend; /* "gloo" or "nccl" */
    bool cuda;           /* --device cuda: buffers in device memory */
};

static struct trn_dist dist;
static long cur_step;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: cddp-collbench [--check | --bench] [options]\n"
           "  --check                   verify every collective (default)\n"
           "  --bench                   measure allreduce bus bandwidth\n"
           "  --min-bytes N, --max-bytes N   bench sizes, doubling (default 1 MiB .. 256 MiB)\n"
           "  --iters N, --warmup N     bench iterations per size (default: by size), warm-up (2)\n"
           "  --json                    bench rows as JSON lines\n"
           "  --collective-timeout S    bound on every collective (default 600)\n"
           "  --init-timeout S          bound on connecting (default 300)\n"
           "  --fault SPEC              crash@step=N[,rank=R] | hang@step=N[,rank=R] | "
           "slow@step=N,ms=M\n"
           "  --backend B               gloo (host memory; default) or nccl (with --device "
           "cuda)\n"
           "  --device D                cpu (default) or cuda: buffers on GPU LOCAL_RANK "
           "(nccl)\n");
}

static _Noreturn void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cddp-collbench: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(CDDP_EXIT_USAGE);
}

static double parse_secs(const char *flag, const char *v)
{
    double d;
    if (cddp_parse_double(v, 0.001, 7 * 24 * 3600.0, &d) != 0)
        die_usage("%s: '%s' is not a number of seconds in 0.001..604800", flag, v);
    return d;
}

static long parse_num(const char *flag, const char *v, long min, long max)
{
    long n;
    if (cddp_parse_long(v, min, max, &n) != 0)
        die_usage("%s: '%s' is not an integer in range", flag, v);
    return n;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
    enum {
        O_MIN = 256,
        O_MAX,
        O_ITERS,
        O_WARMUP,
        O_TIMEOUT,
        O_INIT,
        O_FAULT,
        O_JSON,
        O_BACKEND,
        O_DEVICE
    };
    static const struct option longs[] = {
        {"check", no_argument, NULL, 'c'},
        {"bench", no_argument, NULL, 'b'},
        {"min-bytes", required_argument, NULL, O_MIN},
        {"max-bytes", required_argument, NULL, O_MAX},
        {"iters", required_argument, NULL, O_ITERS},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"collective-timeout", required_argument, NULL, O_TIMEOUT},
        {"init-timeout", required_argument, NULL, O_INIT},
        {"fault", required_argument, NULL, O_FAULT},
        {"json", no_argument, NULL, O_JSON},
        {"backend", required_argument, NULL, O_BACKEND},
        {"device", required_argument, NULL, O_DEVICE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (struct opts){.min_bytes = 1u << 20,
                       .max_bytes = 256u << 20,
                       .warmup = 2,
                       .timeout_s = TRN_COMM_DEFAULT_TIMEOUT_S,
                       .init_timeout_s = TRN_DEFAULT_INIT_TIMEOUT_S,
                       .backend = "gloo"};
    char err[512];
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        switch (c) {
        case 'c':
            o->bench = false;
            break;
        case 'b':
            o->bench = true;
            break;
        case O_MIN:
            o->min_bytes = (size_t)parse_num("--min-bytes", optarg, 4, 1L << 32);
            break;
        case O_MAX:
            o->max_bytes = (size_t)parse_num("--max-bytes", optarg, 4, 1L << 32);
            break;
        case O_ITERS:
            o->iters = parse_num("--iters", optarg, 1, 1000000);
            break;
        case O_WARMUP:
            o->warmup = parse_num("--warmup", optarg, 0, 1000000);
            break;
        case O_TIMEOUT:
            o->timeout_s = parse_secs("--collective-timeout", optarg);
            break;
        case O_INIT:
            o->init_timeout_s = parse_secs("--init-timeout", optarg);
            break;
        case O_FAULT:
            if (trn_fault_parse(optarg, &o->fault, err, sizeof(err)) != 0)
                die_usage("%s", err);
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_BACKEND:
            if (strcmp(optarg, "gloo") != 0 && strcmp(optarg, "nccl") != 0)
                die_usage("--backend: '%s' is not gloo or nccl", optarg);
            o->backend = strcmp(optarg, "nccl") == 0 ? "nccl" : "gloo";
            break;
        case O_DEVICE:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
                die_usage("--device: '%s' is not cpu or cuda", optarg);
            o->cuda = strcmp(optarg, "cuda") == 0;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            die_usage("unknown option or missing value: '%s' (see --help)", argv[optind - 1]);
        }
    }
    if (optind < argc)
        die_usage("unexpected argument '%s'", argv[optind]);
    if (o->min_bytes > o->max_bytes)
        die_usage("--min-bytes is larger than --max-bytes");
    bool nccl = strcmp(o->backend, "nccl") == 0;
    if (nccl && !HAVE_NCCL)
        die_usage("--backend nccl: this cddp-collbench was built without NCCL");
    if (nccl != o->cuda)
        die_usage(nccl ? "--backend nccl reduces CUDA device memory: add --device cuda"
                       : "--device cuda needs --backend nccl (gloo reduces host memory)");
}

/* A failed collective: the trainer's exit (error file, 75). */
static void must(int rc, const char *what)
{
    if (rc == 0)
        return;
    const struct trn_comm_error *e = trn_comm_last_error(dist.comm);
    if (e->code == 0) {
        log_error("T6050", "%s: %s", what, cddp_strerror(rc));
        exit(CDDP_EXIT_FAILURE);
    }
    trn_comm_fail(e, cur_step, dist.env.rank, dist.env.error_file);
}

static void step_begins(const struct opts *o, long step)
{
    cur_step = step;
    if (trn_fault_due(&o->fault, step, dist.env.rank, dist.env.restart_count))
        trn_fault_fire(&o->fault, step, dist.env.rank);
}

static int nbad;

static void bad(const char *what, size_t n, size_t i, double got, double want)
{
    if (nbad++ < 10)
        log_error("T6051", "rank %d: %s (count %zu): [%zu] = %.17g, expected %.17g", dist.env.rank,
                  what, n, i, got, want);
}

/* Where the collectives' buffers live: host memory (gloo), or device memory
 * of the CUDA device, filled from and read back to host memory through the
 * stream the collectives are ordered with (nccl). */
static bool on_cuda;
#if HAVE_NCCL
static cudaStream_t stream;

static void cuda_must(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return;
    log_error("T2300", "%s: %s", what, cudaGetErrorString(e));
    exit(CDDP_EXIT_FAILURE);
}
#endif

static void *buf_alloc(size_t bytes)
{
    void *p = NULL;
#if HAVE_NCCL
    if (on_cuda) {
        cuda_must(cudaMalloc(&p, bytes), "cudaMalloc");
        return p;
    }
#endif
    p = malloc(bytes);
    if (p == NULL) {
        log_error("T6052", "out of memory");
        exit(CDDP_EXIT_FAILURE);
    }
    return p;
}

static void buf_free(void *p)
{
#if HAVE_NCCL
    if (on_cuda) {
        cudaFree(p);
        return;
    }
#endif
    free(p);
}

/* Everything queued so far has run (nothing to wait for on the host). */
static void buf_sync(void)
{
#if HAVE_NCCL
    if (on_cuda)
        cuda_must(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#endif
}

/* host -> buffer, queued before the collectives that follow. */
static void put(void *buf, const void *host, size_t bytes)
{
#if HAVE_NCCL
    if (on_cuda) {
        cuda_must(cudaMemcpyAsync(buf, host, bytes, cudaMemcpyHostToDevice, stream),
                  "cudaMemcpyAsync");
        return;
    }
#endif
    memcpy(buf, host, bytes);
}

/* buffer -> host, after the collectives queued before it. */
static void get(void *host, const void *buf, size_t bytes)
{
#if HAVE_NCCL
    if (on_cuda) {
        cuda_must(cudaMemcpyAsync(host, buf, bytes, cudaMemcpyDeviceToHost, stream),
                  "cudaMemcpyAsync");
        buf_sync();
        return;
    }
#endif
    memcpy(host, buf, bytes);
}

static void *host_alloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (p == NULL) {
        log_error("T6052", "out of memory");
        exit(CDDP_EXIT_FAILURE);
    }
    return p;
}

/* One round of every collective at n elements: each input is filled on the
 * host, put into the collective's buffer, reduced there, read back and
 * checked on the host. */
static long check_round(struct trn_comm *c, size_t n)
{
    int rank = trn_comm_rank(c), world = trn_comm_world(c);
    long ops = 0;
    float *f = host_alloc(n * sizeof(float));
    double *d = host_alloc(n * sizeof(double));
    int64_t *q = host_alloc(n * sizeof(int64_t));
    uint8_t *u = host_alloc(n);
    float *g = host_alloc(n * (size_t)world * sizeof(float));
    float *df = buf_alloc(n * sizeof(float));
    double *dd = buf_alloc(n * sizeof(double));
    int64_t *dq = buf_alloc(n * sizeof(int64_t));
    uint8_t *du = buf_alloc(n);
    float *dg = buf_alloc(n * (size_t)world * sizeof(float));
    /* sum (f32): small integers, exact */
    for (size_t i = 0; i < n; i++)
        f[i] = (float)((rank + 1) * (int)(i % 251));
    put(df, f, n * sizeof(float));
    must(trn_comm_allreduce(c, df, n, TRN_COMM_F32, TRN_COMM_SUM), "allreduce");
    get(f, df, n * sizeof(float));
    ops++;
    double tri = (double)world * (world + 1) / 2;
    for (size_t i = 0; i < n; i++)
        if (f[i] != (float)(tri * (double)(i % 251)))
            bad("allreduce sum f32", n, i, f[i], tri * (double)(i % 251));
    /* average (f64) */
    for (size_t i = 0; i < n; i++)
        d[i] = (double)rank + 0.25 * (double)(i % 7);
    put(dd, d, n * sizeof(double));
    must(trn_comm_allreduce(c, dd, n, TRN_COMM_F64, TRN_COMM_AVG), "allreduce");
    get(d, dd, n * sizeof(double));
    ops++;
    for (size_t i = 0; i < n; i++) {
        double want = (double)(world - 1) / 2 + 0.25 * (double)(i % 7);
        if (fabs(d[i] - want) > 1e-12)
            bad("allreduce avg f64", n, i, d[i], want);
    }
    /* max and min (i64) */
    for (size_t i = 0; i < n; i++)
        q[i] = (int64_t)((i + (size_t)rank) % (size_t)world) - 1000;
    put(dq, q, n * sizeof(int64_t));
    must(trn_comm_allreduce(c, dq, n, TRN_COMM_I64, TRN_COMM_MAX), "allreduce");
    get(q, dq, n * sizeof(int64_t));
    ops++;
    for (size_t i = 0; i < n; i++)
        if (q[i] != world - 1 - 1000)
            bad("allreduce max i64", n, i, (double)q[i], world - 1 - 1000);
    /* broadcast (u8) from each root in turn */
    for (int root = 0; root < world; root++) {
        for (size_t i = 0; i < n; i++)
            u[i] = rank == root ? (uint8_t)(i * 7 + (size_t)root) : 0xEE;
        put(du, u, n);
        must(trn_comm_broadcast(c, du, n, TRN_COMM_U8, root), "broadcast");
        get(u, du, n);
        ops++;
        for (size_t i = 0; i < n; i++)
            if (u[i] != (uint8_t)(i * 7 + (size_t)root))
                bad("broadcast u8", n, i, u[i], (uint8_t)(i * 7 + (size_t)root));
    }
    /* allgather (f32) */
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(rank * 1000003 + (int)(i % 1000));
    put(df, f, n * sizeof(float));
    must(trn_comm_allgather(c, df, dg, n, TRN_COMM_F32), "allgather");
    get(g, dg, n * (size_t)world * sizeof(float));
    ops++;
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < n; i++)
            if (g[(size_t)r * n + i] != (float)(r * 1000003 + (int)(i % 1000)))
                bad("allgather f32", n, (size_t)r * n + i, g[(size_t)r * n + i],
                    (float)(r * 1000003 + (int)(i % 1000)));
    /* async: buckets in flight together, as DDP issues them */
    enum { NB = 4 };
    struct trn_comm_work w[NB];
    size_t per = n / NB + 1;
    float *b = host_alloc(per * NB * sizeof(float));
    float *db = buf_alloc(per * NB * sizeof(float));
    for (int k = 0; k < NB; k++)
        for (size_t i = 0; i < per; i++)
            b[(size_t)k * per + i] = (float)(k + rank);
    put(db, b, per * NB * sizeof(float));
    for (int k = 0; k < NB; k++)
        must(trn_comm_allreduce_start(c, &w[k], db + (size_t)k * per, per, TRN_COMM_F32,
                                      TRN_COMM_SUM),
             "allreduce_start");
    for (int k = 0; k < NB; k++) {
        must(trn_comm_wait(c, &w[k]), "wait");
        ops++;
    }
    get(b, db, per * NB * sizeof(float));
    for (int k = 0; k < NB; k++) {
        double want = (double)k * world + tri - world;
        for (size_t i = 0; i < per; i++)
            if (b[(size_t)k * per + i] != (float)want)
                bad("async allreduce", per, i, b[(size_t)k * per + i], want);
    }
    must(trn_comm_barrier(c), "barrier");
    ops++;
    free(b);
    free(f);
    free(d);
    free(q);
    free(u);
    free(g);
    buf_free(db);
    buf_free(df);
    buf_free(dd);
    buf_free(dq);
    buf_free(du);
    buf_free(dg);
    return ops;
}

static int run_check(const struct opts *o)
{
    static const size_t counts[] = {1, 3, 1000, 65537, 1048573};
    long ops = 0;
    uint64_t t0 = cddp_mono_ns();
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        step_begins(o, (long)k);
        ops += check_round(dist.comm, counts[k]);
    }
    /* Every rank must have seen its own results right: agree on the count. */
    int64_t total_bad = nbad;
    must(trn_comm_allreduce(dist.comm, &total_bad, 1, TRN_COMM_I64, TRN_COMM_SUM), "allreduce");
    if (dist.env.rank == 0)
        printf("collbench: world %d, %s: %ld collectives checked on every rank in %.2f s, %s\n",
               dist.env.world, trn_comm_backend(dist.comm), ops,
               (double)(cddp_mono_ns() - t0) * 1e-9,
               total_bad ? "RESULTS WRONG" : "all results right");
    if (nbad)
        log_error("T6053", "rank %d: %d wrong results", dist.env.rank, nbad);
    return total_bad ? CDDP_EXIT_FAILURE : 0;
}

static int run_bench(const struct opts *o)
{
    int world = dist.env.world;
    float *buf;
    if (on_cuda) {
        buf = buf_alloc(o->max_bytes);
#if HAVE_NCCL
        cuda_must(cudaMemsetAsync(buf, 0, o->max_bytes, stream), "cudaMemsetAsync");
#endif
    } else {
        buf = malloc(o->max_bytes);
        if (buf == NULL) {
            log_error("T6054", "cannot allocate %zu bytes", o->max_bytes);
            return CDDP_EXIT_FAILURE;
        }
        memset(buf, 0, o->max_bytes);
    }
    if (dist.env.rank == 0 && !o->json)
        printf("%12s %8s %12s %12s %12s\n", "bytes", "iters", "time_us", "algbw_GB/s",
               "busbw_GB/s");
    long step = 0;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2, step++) {
        step_begins(o, step);
        size_t n = bytes / sizeof(float);
        long iters = o->iters;
        if (iters == 0) { /* about 512 MiB moved per size, 3..50 iterations */
            iters = (long)((512u << 20) / bytes);
            iters = iters < 3 ? 3 : iters > 50 ? 50 : iters;
        }
        for (long i = 0; i < o->warmup; i++)
            must(trn_comm_allreduce(dist.comm, buf, n, TRN_COMM_F32, TRN_COMM_SUM), "allreduce");
        buf_sync();
        must(trn_comm_barrier(dist.comm), "barrier");
        uint64_t t0 = cddp_mono_ns();
        for (long i = 0; i < iters; i++)
            must(trn_comm_allreduce(dist.comm, buf, n, TRN_COMM_F32, TRN_COMM_SUM), "allreduce");
        buf_sync(); /* on the device, the calls only queued the work */
        double el = (double)(cddp_mono_ns() - t0) * 1e-9;
        /* The slowest rank's time is the collective's time. */
        must(trn_comm_allreduce(dist.comm, &el, 1, TRN_COMM_F64, TRN_COMM_MAX), "allreduce");
        double per = el / (double)iters;
        double algbw = (double)bytes / per / 1e9;
        double busbw = algbw * 2.0 * (world - 1) / world;
        if (dist.env.rank == 0) {
            if (o->json)
                printf("{\"impl\":\"cddp\",\"world\":%d,\"bytes\":%zu,\"iters\":%ld,"
                       "\"time_us\":%.1f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
                       "\"backend\":\"%s\",\"device\":\"%s\"}\n",
                       world, bytes, iters, per * 1e6, algbw, busbw, trn_comm_backend(dist.comm),
                       on_cuda ? "cuda" : "cpu");
            else
                printf("%12zu %8ld %12.1f %12.3f %12.3f\n", bytes, iters, per * 1e6, algbw, busbw);
            fflush(stdout);
        }
    }
    buf_free(buf);
    return 0;
}

#if HAVE_NCCL
/* GPU LOCAL_RANK (torch's cuda:LOCAL_RANK) and a stream of its own. */
static void cuda_setup(struct trn_dist_options *dopts)
{
    const char *lr = getenv("LOCAL_RANK");
    long ordinal = 0;
    if (lr && *lr && cddp_parse_long(lr, 0, 1 << 20, &ordinal) != 0)
        die_usage("LOCAL_RANK: '%s' is not a device number", lr);
    cuda_must(cudaSetDevice((int)ordinal), "cudaSetDevice (GPU LOCAL_RANK)");
    cuda_must(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    dopts->cuda_device = (int)ordinal;
    dopts->cuda_stream = stream;
    char name[256] = "?";
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, (int)ordinal) == cudaSuccess)
        snprintf(name, sizeof(name), "%s", prop.name);
    log_info("T2301", "buffers on CUDA device %ld (%s)", ordinal, name);
}
#endif

int main(int argc, char **argv)
{
    cddp_log_init("cddp-collbench");
    const char *r = getenv("RANK");
    char tag[32];
    snprintf(tag, sizeof(tag), "rank%.16s", r && *r ? r : "0");
    cddp_log_set_tag(tag);
    struct opts o;
    parse_args(argc, argv, &o);
    struct trn_dist_options dopts = {.init_timeout_s = o.init_timeout_s,
                                     .collective_timeout_s = o.timeout_s,
                                     .backend = o.backend};
    on_cuda = o.cuda;
#if HAVE_NCCL
    if (on_cuda)
        cuda_setup(&dopts);
#endif
    char err[1024];
    int rc = trn_dist_init(&dist, &dopts, getenv, err, sizeof(err));
    if (rc) {
        log_error("T6055", "%s", err);
        return rc == CDDP_ECONFIG || rc == CDDP_EPARSE || rc == CDDP_ERANGE_ARG ? CDDP_EXIT_USAGE
                                                                                : CDDP_EXIT_FAILURE;
    }
    if (on_cuda && dist.env.world < 2) {
        log_error("T6055", "--device cuda needs 2 ranks or more (one rank has no NCCL "
                           "communicator to check or measure)");
        trn_dist_close(&dist);
        return CDDP_EXIT_USAGE;
    }
    int status = o.bench ? run_bench(&o) : run_check(&o);
    trn_dist_close(&dist);
    return status;
}
