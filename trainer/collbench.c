/*
 * cddp-collbench: checks and measures the collectives of trainer/comm/ over
 * real processes, started like cddp-train (torchrun's environment: RANK,
 * WORLD_SIZE, MASTER_ADDR, MASTER_PORT; none = world size 1).
 *
 *   cddp-collbench [--check]   every collective at sizes that are multiples of
 *                              nothing, results verified on every rank
 *   cddp-collbench --bench     allreduce (sum, f32) bus bandwidth, 1 MiB..256 MiB
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

#include "common/clock.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/strutil.h"
#include "trainer/comm/bootstrap.h"
#include "trainer/comm/comm.h"
#include "trainer/comm/failure.h"
#include "trainer/fault.h"

struct opts {
    bool bench;
    size_t min_bytes, max_bytes;
    long iters; /* 0: by size */
    long warmup;
    double timeout_s, init_timeout_s;
    struct trn_fault fault;
    bool json;
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
           "slow@step=N,ms=M\n");
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
    enum { O_MIN = 256, O_MAX, O_ITERS, O_WARMUP, O_TIMEOUT, O_INIT, O_FAULT, O_JSON };
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    *o = (struct opts){.min_bytes = 1u << 20,
                       .max_bytes = 256u << 20,
                       .warmup = 2,
                       .timeout_s = TRN_COMM_DEFAULT_TIMEOUT_S,
                       .init_timeout_s = TRN_DEFAULT_INIT_TIMEOUT_S};
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

/* One round of every collective at n elements. */
static long check_round(struct trn_comm *c, size_t n)
{
    int rank = trn_comm_rank(c), world = trn_comm_world(c);
    long ops = 0;
    float *f = malloc(n * sizeof(float));
    double *d = malloc(n * sizeof(double));
    int64_t *q = malloc(n * sizeof(int64_t));
    uint8_t *u = malloc(n);
    float *g = malloc(n * (size_t)world * sizeof(float));
    if (!f || !d || !q || !u || !g) {
        log_error("T6052", "out of memory");
        exit(CDDP_EXIT_FAILURE);
    }
    /* sum (f32): small integers, exact */
    for (size_t i = 0; i < n; i++)
        f[i] = (float)((rank + 1) * (int)(i % 251));
    must(trn_comm_allreduce(c, f, n, TRN_COMM_F32, TRN_COMM_SUM), "allreduce");
    ops++;
    double tri = (double)world * (world + 1) / 2;
    for (size_t i = 0; i < n; i++)
        if (f[i] != (float)(tri * (double)(i % 251)))
            bad("allreduce sum f32", n, i, f[i], tri * (double)(i % 251));
    /* average (f64) */
    for (size_t i = 0; i < n; i++)
        d[i] = (double)rank + 0.25 * (double)(i % 7);
    must(trn_comm_allreduce(c, d, n, TRN_COMM_F64, TRN_COMM_AVG), "allreduce");
    ops++;
    for (size_t i = 0; i < n; i++) {
        double want = (double)(world - 1) / 2 + 0.25 * (double)(i % 7);
        if (fabs(d[i] - want) > 1e-12)
            bad("allreduce avg f64", n, i, d[i], want);
    }
    /* max and min (i64) */
    for (size_t i = 0; i < n; i++)
        q[i] = (int64_t)((i + (size_t)rank) % (size_t)world) - 1000;
    must(trn_comm_allreduce(c, q, n, TRN_COMM_I64, TRN_COMM_MAX), "allreduce");
    ops++;
    for (size_t i = 0; i < n; i++)
        if (q[i] != world - 1 - 1000)
            bad("allreduce max i64", n, i, (double)q[i], world - 1 - 1000);
    /* broadcast (u8) from each root in turn */
    for (int root = 0; root < world; root++) {
        for (size_t i = 0; i < n; i++)
            u[i] = rank == root ? (uint8_t)(i * 7 + (size_t)root) : 0xEE;
        must(trn_comm_broadcast(c, u, n, TRN_COMM_U8, root), "broadcast");
        ops++;
        for (size_t i = 0; i < n; i++)
            if (u[i] != (uint8_t)(i * 7 + (size_t)root))
                bad("broadcast u8", n, i, u[i], (uint8_t)(i * 7 + (size_t)root));
    }
    /* allgather (f32) */
    for (size_t i = 0; i < n; i++)
        f[i] = (float)(rank * 1000003 + (int)(i % 1000));
    must(trn_comm_allgather(c, f, g, n, TRN_COMM_F32), "allgather");
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
    float *b = malloc(per * NB * sizeof(float));
    for (int k = 0; k < NB; k++) {
        for (size_t i = 0; i < per; i++)
            b[(size_t)k * per + i] = (float)(k + rank);
        must(trn_comm_allreduce_start(c, &w[k], b + (size_t)k * per, per, TRN_COMM_F32,
                                      TRN_COMM_SUM),
             "allreduce_start");
    }
    for (int k = 0; k < NB; k++) {
        must(trn_comm_wait(c, &w[k]), "wait");
        ops++;
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
    float *buf = malloc(o->max_bytes);
    if (buf == NULL) {
        log_error("T6054", "cannot allocate %zu bytes", o->max_bytes);
        return CDDP_EXIT_FAILURE;
    }
    memset(buf, 0, o->max_bytes);
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
        must(trn_comm_barrier(dist.comm), "barrier");
        uint64_t t0 = cddp_mono_ns();
        for (long i = 0; i < iters; i++)
            must(trn_comm_allreduce(dist.comm, buf, n, TRN_COMM_F32, TRN_COMM_SUM), "allreduce");
        double el = (double)(cddp_mono_ns() - t0) * 1e-9;
        /* The slowest rank's time is the collective's time. */
        must(trn_comm_allreduce(dist.comm, &el, 1, TRN_COMM_F64, TRN_COMM_MAX), "allreduce");
        double per = el / (double)iters;
        double algbw = (double)bytes / per / 1e9;
        double busbw = algbw * 2.0 * (world - 1) / world;
        if (dist.env.rank == 0) {
            if (o->json)
                printf("{\"impl\":\"cddp\",\"world\":%d,\"bytes\":%zu,\"iters\":%ld,"
                       "\"time_us\":%.1f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f}\n",
                       world, bytes, iters, per * 1e6, algbw, busbw);
            else
                printf("%12zu %8ld %12.1f %12.3f %12.3f\n", bytes, iters, per * 1e6, algbw, busbw);
            fflush(stdout);
        }
    }
    free(buf);
    return 0;
}

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
                                     .collective_timeout_s = o.timeout_s};
    char err[1024];
    int rc = trn_dist_init(&dist, &dopts, getenv, err, sizeof(err));
    if (rc) {
        log_error("T6055", "%s", err);
        return rc == CDDP_ECONFIG || rc == CDDP_EPARSE || rc == CDDP_ERANGE_ARG ? CDDP_EXIT_USAGE
                                                                                : CDDP_EXIT_FAILURE;
    }
    int status = o.bench ? run_bench(&o) : run_check(&o);
    trn_dist_close(&dist);
    return status;
}
