/*
 * main.c: cddp-rdzv, the standalone rendezvous daemon.
 *
 *   cddp-rdzv [--host HOST] [--port PORT] [--token-file FILE] ...
 *
 * Serves any number of jobs (by run id) until SIGTERM or SIGINT, which
 * close every run cleanly (each agent is told "closed") and exit 0. Prints
 * one line "cddp-rdzv: listening on HOST:PORT" on stdout once it accepts
 * connections (with --port 0 it names the port it got).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <uv.h>

#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/strutil.h"
#include "config.h"
#include "proto/msg.h"
#include "rendezvous/server.h"
#include "rendezvous/status.h"

static const char usage[] =
    "usage: cddp-rdzv [--host HOST] [--port PORT] [--token-file FILE]\n"
    "                 [--read-timeout SECONDS] [--max-connections N] [--store-only]\n"
    "                 [--status-port PORT] [--status-addr ADDR]\n"
    "\n"
    "The cddp rendezvous daemon: agents (cddprun --rdzv_backend=c10d\n"
    "--rdzv_endpoint=HOST:PORT) of any number of jobs meet here.\n"
    "\n"
    "  --host HOST            address to listen on: name, IPv4 or IPv6 (default: all)\n"
    "  --port PORT            port (default 29400; 0 picks a free one)\n"
    "  --token-file FILE      require this join token (first line of FILE);\n"
    "                         CDDP_RDZV_TOKEN in the environment does the same\n"
    "  --read-timeout SECONDS a connection must say hello, and finish a frame it\n"
    "                         began, within this (default 60)\n"
    "  --max-connections N    refuse connections beyond N (default 100000)\n"
    "  --store-only           serve a plain key-value store, no rendezvous\n"
    "  --status-port PORT     serve /livez /readyz /status /metrics over HTTP\n"
    "                         (env CDDP_STATUS_PORT; 0 picks a free port; default off)\n"
    "  --status-addr ADDR     the status port's address (env CDDP_STATUS_ADDR;\n"
    "                         default 127.0.0.1; 0.0.0.0 for probes and Prometheus)\n"
    "  --version, --help\n"
    "\n"
    "SIGTERM or SIGINT: every job is told the rendezvous closed; exit 0.\n"
    "Log level from LOGLEVEL (DEBUG, INFO, WARNING, ERROR), default WARNING.\n";

struct daemon {
    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    struct rdzv_server *srv;
    struct rdzv_status *status; /* NULL: no status port */
    bool stopping;
};

static void on_server_gone(void *arg)
{
    struct daemon *d = arg;
    d->srv = NULL;
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
}

static void on_signal(uv_signal_t *h, int sig)
{
    struct daemon *d = h->data;
    if (d->stopping)
        return;
    d->stopping = true;
    char reason[64];
    snprintf(reason, sizeof(reason), "cddp-rdzv received %s",
             sig == SIGTERM ? "SIGTERM" : "SIGINT");
    log_info("R0101", "%s: closing every rendezvous", reason);
    rdzv_status_detach(d->status);
    rdzv_server_shutdown(d->srv, reason, on_server_gone, d);
}

/* The first line of path, without its newline. */
static int read_token_file(const char *path, char *out, size_t len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "--token-file %s: %s", path, strerror(errno));
        return CDDP_ERR_FROM_ERRNO(errno);
    }
    if (fgets(out, (int)len, f) == NULL)
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\r\n")] = '\0';
    if (out[0] == '\0') {
        snprintf(err, errlen, "--token-file %s: the first line is empty", path);
        return CDDP_ECONFIG;
    }
    return 0;
}

/* Raises the open-file soft limit to the hard limit: one fd per agent. */
static void raise_nofile(size_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
        log_info("R0102",
                 "open-file limit is %llu: at most about that many agents can connect "
                 "(raise it with ulimit -n)",
                 (unsigned long long)rl.rlim_cur);
}

/* "--name=value" or "--name value"; NULL if argv[*i] is not --name. */
static const char *flag_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "cddp-rdzv: %s '%s'\n(see cddp-rdzv --help)\n", what, arg);
    return CDDP_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    struct rdzv_server_options o = {.port = 29400};
    char token[PROTO_MAX_TOKEN + 2] = "";
    const char *token_file = NULL;
    char err[512];
    /* The status port: the flag wins over the environment. */
    const char *status_port = getenv("CDDP_STATUS_PORT");
    const char *status_addr = getenv("CDDP_STATUS_ADDR");
    const char *status_port_src = "CDDP_STATUS_PORT";

    cddp_log_init("cddp-rdzv");
    for (int i = 1; i < argc; i++) {
        bool missing = false;
        const char *v;
        long n;
        double secs;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage, stdout);
            return CDDP_EXIT_OK;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("cddp-rdzv %s\n", CDDP_VERSION);
            return CDDP_EXIT_OK;
        }
        if (strcmp(argv[i], "--store-only") == 0) {
            o.store_only = true;
            continue;
        }
        if ((v = flag_value(argc, argv, &i, "--host", &missing))) {
            /* Accept torch's bracketed IPv6 form too. */
            static char host[256];
            size_t len = strlen(v);
            if (len >= 2 && v[0] == '[' && v[len - 1] == ']') {
                snprintf(host, sizeof(host), "%.*s", (int)(len - 2), v + 1);
                v = host;
            }
            o.host = v;
        } else if ((v = flag_value(argc, argv, &i, "--port", &missing))) {
            if (cddp_parse_long(v, 0, 65535, &n) != 0)
                return usage_error("--port: expected an integer in 0..65535, not", v);
            o.port = (int)n;
        } else if ((v = flag_value(argc, argv, &i, "--token-file", &missing))) {
            token_file = v;
        } else if ((v = flag_value(argc, argv, &i, "--read-timeout", &missing))) {
            if (cddp_parse_double(v, 0.001, 7 * 86400.0, &secs) != 0)
                return usage_error("--read-timeout: expected seconds > 0, not", v);
            o.read_timeout_ms = (uint64_t)(secs * 1000.0 + 0.5);
        } else if ((v = flag_value(argc, argv, &i, "--max-connections", &missing))) {
            if (cddp_parse_long(v, 1, 10000000, &n) != 0)
                return usage_error("--max-connections: expected an integer >= 1, not", v);
            o.max_connections = (size_t)n;
        } else if ((v = flag_value(argc, argv, &i, "--status-port", &missing)) ||
                   (v = flag_value(argc, argv, &i, "--status_port", &missing))) {
            status_port = v;
            status_port_src = "--status-port";
        } else if ((v = flag_value(argc, argv, &i, "--status-addr", &missing)) ||
                   (v = flag_value(argc, argv, &i, "--status_addr", &missing))) {
            status_addr = v;
        } else if (missing) {
            return usage_error("a value is missing after", argv[i]);
        } else {
            return usage_error("unknown argument", argv[i]);
        }
    }

    const char *env = getenv("CDDP_RDZV_TOKEN");
    if (token_file) {
        if (read_token_file(token_file, token, sizeof(token), err, sizeof(err)) != 0) {
            fprintf(stderr, "cddp-rdzv: %s\n", err);
            return CDDP_EXIT_USAGE;
        }
    } else if (env && env[0]) {
        cddp_strlcpy(token, env, sizeof(token));
    }
    if (strlen(token) > PROTO_MAX_TOKEN) {
        fprintf(stderr, "cddp-rdzv: the join token is longer than %d bytes\n", PROTO_MAX_TOKEN);
        return CDDP_EXIT_USAGE;
    }
    o.token = token[0] ? token : NULL;
    int sport = -1;
    if (status_port && status_port[0]) {
        long n;
        if (cddp_parse_long(status_port, 0, 65535, &n) != 0) {
            fprintf(stderr,
                    "cddp-rdzv: %s: '%s' is not a port number (0-65535; 0 picks a free one)\n",
                    status_port_src, status_port);
            return CDDP_EXIT_USAGE;
        }
        sport = (int)n;
    }
    if (status_addr && status_addr[0] == '\0')
        status_addr = NULL;

    signal(SIGPIPE, SIG_IGN);
    raise_nofile(o.max_connections ? o.max_connections : 100000);

    struct daemon d = {0};
    int rc;
    if (sport >= 0) {
        rc = rdzv_status_new(status_addr, sport, CDDP_VERSION, &d.status, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "cddp-rdzv: --status-port=%d: %s\n", sport, err);
            return rc == CDDP_EPARSE ? CDDP_EXIT_USAGE : CDDP_EXIT_FAILURE;
        }
        o.on_change = rdzv_status_changed;
        o.change_arg = d.status;
    }
    uv_loop_init(&d.loop);
    rc = rdzv_server_start(&d.loop, &o, &d.srv, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "cddp-rdzv: %s\n", err);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        uv_loop_close(&d.loop);
        rdzv_status_free(d.status);
        return CDDP_EXIT_FAILURE;
    }
    if (d.status)
        rdzv_status_attach(d.status, &d.loop, d.srv);
    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    d.sigterm.data = d.sigint.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);

    printf("cddp-rdzv: listening on %s%s%s\n", rdzv_server_address(d.srv),
           o.token ? " (join token required)" : "", o.store_only ? " (store only)" : "");
    fflush(stdout);
    log_info("R0100", "listening on %s", rdzv_server_address(d.srv));

    uv_run(&d.loop, UV_RUN_DEFAULT);
    rdzv_status_free(d.status);
    rc = uv_loop_close(&d.loop);
    if (rc) {
        log_error("R0103", "event loop did not close cleanly: %s", uv_strerror(rc));
        return CDDP_EXIT_FAILURE;
    }
    return CDDP_EXIT_OK;
}
