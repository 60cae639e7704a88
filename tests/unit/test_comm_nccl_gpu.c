/*
 * The NCCL backend on a GPU: two ranks as two processes on GPU 0 (each
 * with its own NCCL_HOSTID, so NCCL lets them share the device and talks
 * over sockets on loopback), bootstrapped as cddp-train does
 * (trainer/comm/bootstrap.h: rank 0 serves the store on MASTER_PORT).
 *
 *   - collectives: allreduce (sum, avg, max; f32, f64, i32, bf16),
 *     broadcast, allgather, host memory, async buckets, barrier;
 *   - a rank that hangs: the other's watchdog aborts within the timeout
 *     plus a margin, writes the error file (collective, bucket, step) and
 *     exits 75, although its main thread is blocked in
 *     cudaStreamSynchronize behind the stuck collective;
 *   - a rank that crashes: the other ends at once on NCCL's asynchronous
 *     error (exit 75), long before the timeout.
 *
 * Without a GPU it exits 77 (skipped). CUDA is touched only in children:
 * the parent forks before any CUDA call.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/unit_util.h"

#include <arpa/inet.h>
#include <cuda_runtime_api.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "trainer/comm/bootstrap.h"

enum scenario { SC_OK, SC_HANG, SC_CRASH };

static char dir[64];

#define EXPECT(rank, cond)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: %s\n", (rank), __FILE__, __LINE__, #cond);            \
            _exit(20);                                                                             \
        }                                                                                          \
    } while (0)

#define CUDA_OK(rank, call) EXPECT(rank, (call) == cudaSuccess)

static int gpu_present(void)
{
    pid_t p = fork();
    if (p == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void error_file(int rank, char *out, size_t len)
{
    snprintf(out, len, "%s/error%d.json", dir, rank);
}

static void setenv_int(const char *k, long v)
{
    char b[32];
    snprintf(b, sizeof(b), "%ld", v);
    setenv(k, b, 1);
}

static void device_checks(int rank, struct trn_comm *c, cudaStream_t s)
{
    enum { N = 1001 };
    static float hf[N];
    float *df;
    CUDA_OK(rank, cudaMalloc((void **)&df, N * sizeof(float)));
    for (int i = 0; i < N; i++)
        hf[i] = (float)(rank + 1 + i);
    CUDA_OK(rank, cudaMemcpy(df, hf, sizeof(hf), cudaMemcpyHostToDevice));
    EXPECT(rank, trn_comm_allreduce(c, df, N, TRN_COMM_F32, TRN_COMM_SUM) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    CUDA_OK(rank, cudaMemcpy(hf, df, sizeof(hf), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++)
        EXPECT(rank, hf[i] == (float)(3 + 2 * i));
    EXPECT(rank, trn_comm_allreduce(c, df, N, TRN_COMM_F32, TRN_COMM_AVG) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    CUDA_OK(rank, cudaMemcpy(hf, df, sizeof(hf), cudaMemcpyDeviceToHost));
    EXPECT(rank, hf[0] == 3.0f && hf[10] == 23.0f);

    int32_t hi[3] = {rank, -rank, 7}, *di;
    CUDA_OK(rank, cudaMalloc((void **)&di, sizeof(hi)));
    CUDA_OK(rank, cudaMemcpy(di, hi, sizeof(hi), cudaMemcpyHostToDevice));
    EXPECT(rank, trn_comm_allreduce(c, di, 3, TRN_COMM_I32, TRN_COMM_MAX) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    CUDA_OK(rank, cudaMemcpy(hi, di, sizeof(hi), cudaMemcpyDeviceToHost));
    EXPECT(rank, hi[0] == 1 && hi[1] == 0 && hi[2] == 7);

    /* bf16 bits: 1.0 = 0x3f80, 2.0 = 0x4000, 3.0 = 0x4040. */
    uint16_t hb[2] = {rank ? 0x4000 : 0x3f80, 0x3f80}, *db;
    CUDA_OK(rank, cudaMalloc((void **)&db, sizeof(hb)));
    CUDA_OK(rank, cudaMemcpy(db, hb, sizeof(hb), cudaMemcpyHostToDevice));
    EXPECT(rank, trn_comm_allreduce(c, db, 2, TRN_COMM_BF16, TRN_COMM_SUM) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    CUDA_OK(rank, cudaMemcpy(hb, db, sizeof(hb), cudaMemcpyDeviceToHost));
    EXPECT(rank, hb[0] == 0x4040 && hb[1] == 0x4000);

    double hd[4] = {rank * 10.0, 1, 2, 3}, *dd;
    CUDA_OK(rank, cudaMalloc((void **)&dd, sizeof(hd)));
    CUDA_OK(rank, cudaMemcpy(dd, hd, sizeof(hd), cudaMemcpyHostToDevice));
    EXPECT(rank, trn_comm_broadcast(c, dd, 4, TRN_COMM_F64, 1) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    CUDA_OK(rank, cudaMemcpy(hd, dd, sizeof(hd), cudaMemcpyDeviceToHost));
    EXPECT(rank, hd[0] == 10.0);

    float hs[5], hr[10], *ds, *dr;
    for (int i = 0; i < 5; i++)
        hs[i] = (float)(rank * 100 + i);
    CUDA_OK(rank, cudaMalloc((void **)&ds, sizeof(hs)));
    CUDA_OK(rank, cudaMalloc((void **)&dr, sizeof(hr)));
    CUDA_OK(rank, cudaMemcpy(ds, hs, sizeof(hs), cudaMemcpyHostToDevice));
    EXPECT(rank, trn_comm_allgather(c, ds, dr, 5, TRN_COMM_F32) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    CUDA_OK(rank, cudaMemcpy(hr, dr, sizeof(hr), cudaMemcpyDeviceToHost));
    EXPECT(rank, hr[0] == 0.0f && hr[4] == 4.0f && hr[5] == 100.0f && hr[9] == 104.0f);

    /* Async buckets, waited in order; stream-ordered results. */
    struct trn_comm_work w[3];
    for (int b = 0; b < 3; b++)
        EXPECT(rank, trn_comm_allreduce_start_bucket(c, &w[b], df + b * 300, 300, TRN_COMM_F32,
                                                     TRN_COMM_SUM, b) == 0);
    for (int b = 0; b < 3; b++)
        EXPECT(rank, trn_comm_wait(c, &w[b]) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    CUDA_OK(rank, cudaMemcpy(hf, df, sizeof(hf), cudaMemcpyDeviceToHost));
    EXPECT(rank, hf[0] == 6.0f && hf[899] == 2.0f * (3.0f + 899.0f));

    cudaFree(df);
    cudaFree(di);
    cudaFree(db);
    cudaFree(dd);
    cudaFree(ds);
    cudaFree(dr);
}

static void host_checks(int rank, struct trn_comm *c)
{
    /* Host memory: staged, and in place when the call returns. */
    double h[3] = {rank + 1.0, 2.0, -1.0};
    EXPECT(rank, trn_comm_allreduce(c, h, 3, TRN_COMM_F64, TRN_COMM_SUM) == 0);
    EXPECT(rank, h[0] == 3.0 && h[1] == 4.0 && h[2] == -2.0);
    int64_t g[4];
    int64_t mine[2] = {rank, rank + 10};
    EXPECT(rank, trn_comm_allgather(c, mine, g, 2, TRN_COMM_I64) == 0);
    EXPECT(rank, g[0] == 0 && g[1] == 10 && g[2] == 1 && g[3] == 11);
    EXPECT(rank, trn_comm_barrier(c) == 0);
}

static void rank_main(int rank, int port, enum scenario sc, double timeout_s)
{
    setenv_int("RANK", rank);
    setenv_int("LOCAL_RANK", rank);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv_int("MASTER_PORT", port);
    char hostid[32], ef[128];
    snprintf(hostid, sizeof(hostid), "cddp-test-rank%d", rank);
    setenv("NCCL_HOSTID", hostid, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    setenv("NCCL_IB_DISABLE", "1", 1);
    error_file(rank, ef, sizeof(ef));
    setenv("TORCHELASTIC_ERROR_FILE", ef, 1);

    CUDA_OK(rank, cudaSetDevice(0));
    cudaStream_t s;
    CUDA_OK(rank, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct trn_dist d;
    struct trn_dist_options o = {.init_timeout_s = 60,
                                 .collective_timeout_s = timeout_s,
                                 .backend = "nccl",
                                 .cuda_device = 0,
                                 .cuda_stream = s};
    char err[1024];
    if (trn_dist_init(&d, &o, getenv, err, sizeof(err)) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        _exit(10);
    }
    struct trn_comm *c = d.comm;
    EXPECT(rank, strcmp(trn_comm_backend(c), "nccl") == 0 && trn_comm_on_device(c));
    if (sc == SC_OK) {
        device_checks(rank, c, s);
        host_checks(rank, c);
        trn_dist_close(&d);
        _exit(0);
    }
    float *df;
    CUDA_OK(rank, cudaMalloc((void **)&df, 1024 * sizeof(float)));
    EXPECT(rank, trn_comm_allreduce(c, df, 1024, TRN_COMM_F32, TRN_COMM_SUM) == 0);
    CUDA_OK(rank, cudaStreamSynchronize(s));
    if (rank == 1) {
        if (sc == SC_CRASH)
            _exit(3);
        sleep(300); /* hung: the parent kills it */
        _exit(4);
    }
    trn_comm_set_step(c, 5);
    struct trn_comm_work w;
    EXPECT(rank,
           trn_comm_allreduce_start_bucket(c, &w, df, 1024, TRN_COMM_F32, TRN_COMM_SUM, 2) == 0);
    EXPECT(rank, trn_comm_wait(c, &w) == 0);
    /* Blocked here behind the stuck collective: only the watchdog can end it. */
    cudaStreamSynchronize(s);
    _exit(5);
}

/* Runs both ranks; returns rank 0's wait status and how long it took. */
static int run_pair(enum scenario sc, double timeout_s, double limit_s, double *took_s)
{
    int port = unit_free_port();
    pid_t pid[2];
    uint64_t t0 = cddp_mono_ns();
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0)
            rank_main(r, port, sc, timeout_s);
    }
    int st[2] = {-1, -1};
    bool done[2] = {false, false};
    while (!done[0] || (sc == SC_OK && !done[1])) {
        for (int r = 0; r < 2; r++)
            if (!done[r] && waitpid(pid[r], &st[r], WNOHANG) == pid[r])
                done[r] = true;
        if ((double)(cddp_mono_ns() - t0) * 1e-9 > limit_s)
            break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    *took_s = (double)(cddp_mono_ns() - t0) * 1e-9;
    for (int r = 0; r < 2; r++) {
        if (!done[r]) {
            kill(pid[r], SIGKILL);
            waitpid(pid[r], &st[r], 0);
        }
    }
    if (sc == SC_OK && !(WIFEXITED(st[1]) && WEXITSTATUS(st[1]) == 0))
        fail_msg("rank 1 ended with status 0x%x", st[1]);
    if (!done[0])
        fail_msg("rank 0 did not end within %.0f s", limit_s);
    return st[0];
}

static void test_collectives(void **state)
{
    (void)state;
    double took;
    int st = run_pair(SC_OK, 60, 120, &took);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    print_message("collectives on 2 ranks: %.1f s\n", took);
}

/* Rank 0 must end with exit 75 and an error file holding both needles. */
static void expect_exit_75(enum scenario sc, double timeout_s, double limit_s, const char *type,
                           const char *needle, const char *what)
{
    double took;
    int st = run_pair(sc, timeout_s, limit_s, &took);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 75);
    char ef[128];
    error_file(0, ef, sizeof(ef));
    const char *j = unit_slurp(ef);
    assert_non_null(j);
    assert_non_null(strstr(j, type));
    if (needle != NULL && strstr(j, needle) == NULL)
        fail_msg("error file lacks '%s': %s", needle, j);
    print_message("%s: rank 0 exited 75 after %.1f s (timeout %.0f s, start-up included)\n", what,
                  took, timeout_s);
}

static void test_hang_times_out(void **state)
{
    (void)state;
    /* Rank 1 stopped after #2 (the bootstrap barrier is #1): #3 is blamed,
     * and the progress thread names rank 1. */
    expect_exit_75(SC_HANG, 5, 60, "CollectiveTimeoutError", "bucket 2, step 5", "hang");
    char ef[128];
    error_file(0, ef, sizeof(ef));
    assert_non_null(strstr(unit_slurp(ef), "rank that never reached it: 1"));
}

static void test_crash_is_async_error(void **state)
{
    (void)state;
    /* A timeout far beyond the limit: only the asynchronous error can end it in time. */
    expect_exit_75(SC_CRASH, 600, 90, "CollectiveError", NULL, "crash");
}

int main(void)
{
    if (!gpu_present()) {
        printf("SKIP: no CUDA device (the NCCL backend needs one)\n");
        return 77;
    }
    snprintf(dir, sizeof(dir), "/tmp/cddp-test-nccl-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_hang_times_out),
        cmocka_unit_test(test_crash_is_async_error),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char p[128];
    for (int r = 0; r < 2; r++) {
        error_file(r, p, sizeof(p));
        unlink(p);
    }
    rmdir(dir);
    return rc;
}
