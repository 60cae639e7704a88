/* cddp-tcpstore: a TCPStore-compatible server (store/tcpstore.h) on its own
 * loop, for the integration tests and the benchmark. Serves until SIGTERM
 * or SIGINT; prints "cddp-tcpstore: listening on port N" on stdout once it
 * listens (--port 0 picks a free port).
 *
 *     cddp-tcpstore --port N [--host H] [--max-value BYTES] [--max-key BYTES]
 *                   [--max-write-queue BYTES] [--max-store-bytes BYTES] [--max-held BYTES]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <uv.h>

#include "common/errors.h"
#include "common/log.h"
#include "common/strutil.h"
#include "store/tcpstore.h"

static struct tcpstore_server *server;
static uv_signal_t sigterm, sigint;

static void on_signal(uv_signal_t *h, int sig)
{
    (void)sig;
    (void)h;
    uv_close((uv_handle_t *)&sigterm, NULL);
    uv_close((uv_handle_t *)&sigint, NULL);
    tcpstore_server_close(server, NULL, NULL);
}

static int usage(void)
{
    fprintf(stderr, "usage: cddp-tcpstore --port N [--host H] [--max-value BYTES] "
                    "[--max-key BYTES] [--max-write-queue BYTES] [--max-store-bytes BYTES] "
                    "[--max-held BYTES]\n");
    return 2;
}

int main(int argc, char **argv)
{
    cddp_log_init("cddp-tcpstore");
    struct tcpstore_server_options o = {.port = -1};
    /* The byte limits, one table. */
    const struct {
        const char *flag;
        size_t *field;
    } sizes[] = {
        {"--max-value", &o.wire.max_value},        {"--max-key", &o.wire.max_key},
        {"--max-write-queue", &o.max_write_queue}, {"--max-held", &o.max_held},
        {"--max-store-bytes", &o.store.max_bytes},
    };
    for (int i = 1; i < argc; i++) {
        long v;
        if (i + 1 >= argc)
            return usage();
        if (strcmp(argv[i], "--host") == 0) {
            o.host = argv[++i];
            continue;
        }
        if (strcmp(argv[i], "--port") == 0) {
            if (cddp_parse_long(argv[++i], 0, 65535, &v) != 0)
                return usage();
            o.port = (int)v;
            continue;
        }
        size_t k = 0;
        while (k < sizeof(sizes) / sizeof(sizes[0]) && strcmp(argv[i], sizes[k].flag) != 0)
            k++;
        if (k == sizeof(sizes) / sizeof(sizes[0]) ||
            cddp_parse_long(argv[++i], 1, 1L << 40, &v) != 0)
            return usage();
        *sizes[k].field = (size_t)v;
    }
    if (o.port < 0)
        return usage();
    /* One descriptor per client: take all the kernel allows. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    uv_loop_t *loop = uv_default_loop();
    char err[256];
    int rc = tcpstore_server_start(loop, &o, &server, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "cddp-tcpstore: %s\n", err);
        return 1;
    }
    printf("cddp-tcpstore: listening on port %d\n", tcpstore_server_port(server));
    fflush(stdout);
    uv_signal_init(loop, &sigterm);
    uv_signal_init(loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_run(loop, UV_RUN_DEFAULT);
    return uv_loop_close(loop) == 0 ? 0 : 1;
}
