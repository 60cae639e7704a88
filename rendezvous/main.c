/*
 * main.c: cddp-rdzv, the standalone rendezvous daemon.
 *
 *   cddp-rdzv [--host HOST] [--port PORT] [--token-file FILE] ...
 *
 * Serves any number of jobs (by run id) until SIGTERM or SIGINT, which
 * close every run cleanly (each agent is told "closed") and exit 0; or
 * until SIGUSR2 (or SIGTERM/SIGINT with --keep-runs-on-exit), which stops
 * for a successor: no run is closed, the agents reconnect to the next
 * cddp-rdzv on the port and their rounds go on there. Prints
 * one line "cddp-rdzv: listening on HOST:PORT" on stdout once it accepts
 * connections (with --port 0 it names the port it got).
 */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <uv.h>

#include "common/errors.h"
#include "common/fdlimit.h"
#include "common/exitcodes.h"
#include "common/flags.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/strutil.h"
#include "config.h"
#include "proto/msg.h"
#include "rendezvous/server.h"
#include "rendezvous/jobs.h"
#include "rendezvous/status.h"

static const char usage[] =
    "usage: cddp-rdzv [--host HOST] [--port PORT] [--token-file FILE]\n"
    "                 [--read-timeout SECONDS] [--max-connections N] [--store-only]\n"
    "                 [--status-port PORT] [--status-addr ADDR] [--keep-runs-on-exit]\n"
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
    "  --keep-runs-on-exit    SIGTERM and SIGINT act as SIGUSR2 (for service managers\n"
    "                         that restart with SIGTERM)\n"
    "  --version, --help\n"
    "\n"
    "SIGTERM or SIGINT: every job is told the rendezvous closed; exit 0.\n"
    "SIGUSR2: stop for an upgrade: no job is told anything, connections close;\n"
    "the agents reconnect to the next cddp-rdzv started on the same port (within\n"
    "their join_timeout) and re-register their rounds, which go on there without\n"
    "restarting any worker when every node is back within rdzv_conf\n"
    "resume_timeout (default: the keep-alive window); exit 0.\n"
    "Log level from LOGLEVEL (DEBUG, INFO, WARNING, ERROR), default WARNING.\n";

struct daemon {
    uv_loop_t loop;
    uv_signal_t sigterm, sigint, sigusr2;
    bool keep_runs_on_exit;
    struct rdzv_server *srv;
    struct rdzv_status *status; /* NULL: no status port */
    struct rdzv_jobs *jobs;     /* job-wide statistics; with the status port */
    bool stopping;
};

static void on_server_gone(void *arg)
{
    struct daemon *d = arg;
    d->srv = NULL;
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->sigusr2, NULL);
}

static void on_signal(uv_signal_t *h, int sig)
{
    struct daemon *d = h->data;
    if (d->stopping)
        return;
    d->stopping = true;
    const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGUSR2";
    rdzv_status_detach(d->status);
    if (sig == SIGUSR2 || d->keep_runs_on_exit) {
        log_warn("R2100",
                 "received %s: stopping for a successor; every run stays open and its agents "
                 "will reconnect to the next cddp-rdzv on this port",
                 name);
        rdzv_server_stop_keep_runs(d->srv, on_server_gone, d);
        return;
    }
    char reason[64];
    snprintf(reason, sizeof(reason), "cddp-rdzv received %s", name);
    log_info("R0101", "%s: closing every rendezvous", reason);
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

/* Raises the open-file soft limit toward the hard limit (one fd per agent),
 * and says when what it got still caps the connections. */
static void raise_nofile(size_t want)
{
    struct cddp_fdlimit l;
    cddp_fdlimit_raise(&l);
    if (l.soft != UINT64_MAX && l.soft < want)
        log_info("R0102",
                 "open-file limit is %llu: at most about that many agents can connect "
                 "(raise it with ulimit -n)",
                 (unsigned long long)l.soft);
}

/* What the command line sets; the flags table below stores into it. */
struct daemon_args {
    struct rdzv_server_options o;
    const char *token_file;
    int status_port; /* -1: off */
    const char *status_addr;
    char host[256]; /* --host without the brackets of "[v6]" */
    bool keep_runs_on_exit;
};

/* An error about a value that also points at --help. */
static int bad_value(char *err, size_t errlen, const char *what, const char *text)
{
    snprintf(err, errlen, "%s '%s'\n(see cddp-rdzv --help)", what, text);
    return CDDP_EPARSE;
}

/* --host: a name, IPv4 or IPv6; torch's bracketed IPv6 form too. */
static int conv_host(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err, size_t errlen)
{
    struct daemon_args *d = dst;
    const char *v = a->text;
    if (v == NULL)
        return 0;
    size_t len = strlen(v);
    if (len >= 2 && v[0] == '[' && v[len - 1] == ']') {
        snprintf(d->host, sizeof(d->host), "%.*s", (int)(len - 2), v + 1);
        v = d->host;
    }
    d->o.host = v;
    return 0;
}

static int conv_port(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err, size_t errlen)
{
    long n;
    if (a->text == NULL)
        return 0;
    if (cddp_parse_long(a->text, 0, 65535, &n) != 0)
        return bad_value(err, errlen, "--port: expected an integer in 0..65535, not", a->text);
    ((struct daemon_args *)dst)->o.port = (int)n;
    return 0;
}

static int conv_read_timeout(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                             size_t errlen)
{
    double secs;
    if (a->text == NULL)
        return 0;
    if (cddp_parse_double(a->text, 0.001, 7 * 86400.0, &secs) != 0)
        return bad_value(err, errlen, "--read-timeout: expected seconds > 0, not", a->text);
    ((struct daemon_args *)dst)->o.read_timeout_ms = (uint64_t)(secs * 1000.0 + 0.5);
    return 0;
}

static int conv_max_connections(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                                size_t errlen)
{
    long n;
    if (a->text == NULL)
        return 0;
    if (cddp_parse_long(a->text, 1, 10000000, &n) != 0)
        return bad_value(err, errlen, "--max-connections: expected an integer >= 1, not", a->text);
    ((struct daemon_args *)dst)->o.max_connections = (size_t)n;
    return 0;
}

/* The status port: the flag wins over CDDP_STATUS_PORT; empty is off. */
static int conv_status_port(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                            size_t errlen)
{
    return cddp_status_port_parse(a->text, a->name, &((struct daemon_args *)dst)->status_port, err,
                                  errlen);
}

static int conv_status_addr(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                            size_t errlen)
{
    ((struct daemon_args *)dst)->status_addr = a->text && a->text[0] ? a->text : NULL;
    return 0;
}

enum {
    R_HOST,
    R_PORT,
    R_TOKEN_FILE,
    R_READ_TIMEOUT,
    R_MAX_CONNECTIONS,
    R_STORE_ONLY,
    R_STATUS_PORT,
    R_STATUS_ADDR,
    R_KEEP_RUNS,
    R_HELP,
    R_VERSION,
    R_COUNT
};

#define CUSTOM(fn) .kind = CDDP_FLAG_CUSTOM, .convert = fn

/* The daemon's flags: exact names only (no prefixes, no positionals), as
 * --name=value or --name value; errors name the dashed spelling. */
static const struct cddp_flag rdzv_rows[R_COUNT] = {
    [R_HOST] = {"--host", NULL, 0, CUSTOM(conv_host)},
    [R_PORT] = {"--port", NULL, 0, CUSTOM(conv_port)},
    [R_TOKEN_FILE] = {"--token-file", NULL, 0, CDDP_FLAG_STRING,
                      offsetof(struct daemon_args, token_file)},
    [R_READ_TIMEOUT] = {"--read-timeout", NULL, 0, CUSTOM(conv_read_timeout)},
    [R_MAX_CONNECTIONS] = {"--max-connections", NULL, 0, CUSTOM(conv_max_connections)},
    [R_STORE_ONLY] = {"--store-only", NULL, 0, CDDP_FLAG_BOOL,
                      offsetof(struct daemon_args, o.store_only)},
    [R_STATUS_PORT] = {"--status-port", "--status_port", 0, CUSTOM(conv_status_port),
                       .env = "CDDP_STATUS_PORT"},
    [R_STATUS_ADDR] = {"--status-addr", "--status_addr", 0, CUSTOM(conv_status_addr),
                       .env = "CDDP_STATUS_ADDR"},
    [R_KEEP_RUNS] = {"--keep-runs-on-exit", "--keep_runs_on_exit", 0, CDDP_FLAG_BOOL,
                     offsetof(struct daemon_args, keep_runs_on_exit)},
    [R_HELP] = {"--help", NULL, 'h', CDDP_FLAG_ACTION},
    [R_VERSION] = {"--version", NULL, 0, CDDP_FLAG_ACTION},
};

static const struct cddp_flags rdzv_flags = {
    .rows = rdzv_rows,
    .n = R_COUNT,
    .program = "cddp-rdzv",
    .prefixes = false,
    .positionals = false,
    .name_as_typed = false,
};

/* Parses the command line into *d: 0, 1 when --help or --version was
 * printed, or a negative code with err. */
static int parse_args(int argc, char **argv, struct daemon_args *d, char *err, size_t errlen)
{
    struct cddp_flag_seen seen[R_COUNT];
    struct cddp_flags_problem problem;
    int first_positional;
    int rc =
        cddp_flags_scan(&rdzv_flags, argc, argv, seen, &first_positional, &problem, err, errlen);
    if (rc) {
        /* The daemon's own words for what the scan refused. */
        const char *what = problem.kind == CDDP_FLAGS_NEEDS_VALUE ? "a value is missing after"
                                                                  : "unknown argument";
        return bad_value(err, errlen, what, problem.arg);
    }
    if (seen[R_HELP].text) {
        fputs(usage, stdout);
        return 1;
    }
    if (seen[R_VERSION].text) {
        printf("cddp-rdzv %s\n", CDDP_VERSION);
        return 1;
    }
    if ((rc = cddp_flags_defaults(&rdzv_flags, environ, seen, err, errlen)))
        return rc;
    return cddp_flags_convert(&rdzv_flags, seen, d, NULL, err, errlen);
}

int main(int argc, char **argv)
{
    struct daemon_args args = {.o = {.port = 29400}, .status_port = -1};
    char token[PROTO_MAX_TOKEN + 2] = "";
    char err[512];

    cddp_log_init("cddp-rdzv");
    int prc = parse_args(argc, argv, &args, err, sizeof(err));
    if (prc > 0)
        return CDDP_EXIT_OK;
    if (prc < 0) {
        fprintf(stderr, "cddp-rdzv: %s\n", err);
        return CDDP_EXIT_USAGE;
    }
    struct rdzv_server_options o = args.o; /* its host may point into args */
    const char *token_file = args.token_file;

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
    int sport = args.status_port;
    const char *status_addr = args.status_addr;
    if (sport > 0 && sport == o.port) {
        /* The status port listens first: the rendezvous would then fail to
         * bind with "address already in use", as if another program had it. */
        fprintf(stderr,
                "cddp-rdzv: --status-port=%d is the rendezvous port (--port %d): they cannot "
                "share a port\n",
                sport, o.port);
        return CDDP_EXIT_USAGE;
    }

    signal(SIGPIPE, SIG_IGN);
    raise_nofile(o.max_connections ? o.max_connections : 100000);

    struct daemon d = {0};
    int rc;
    if (sport >= 0) {
        /* Job-wide goodput and history: read only on the status port. */
        d.jobs = rdzv_jobs_new();
        if (d.jobs == NULL) {
            fprintf(stderr, "cddp-rdzv: out of memory\n");
            return CDDP_EXIT_FAILURE;
        }
        rc = rdzv_status_new(status_addr, sport, CDDP_VERSION, d.jobs, &d.status, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "cddp-rdzv: --status-port=%d: %s\n", sport, err);
            rdzv_jobs_free(d.jobs);
            return rc == CDDP_EPARSE ? CDDP_EXIT_USAGE : CDDP_EXIT_FAILURE;
        }
        o.on_change = rdzv_status_changed;
        o.change_arg = d.status;
        o.on_heartbeat = rdzv_jobs_on_heartbeat;
        o.on_action = rdzv_jobs_on_action;
        o.jobs_arg = d.jobs;
    }
    uv_loop_init(&d.loop);
    rc = rdzv_server_start(&d.loop, &o, &d.srv, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "cddp-rdzv: %s\n", err);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        uv_loop_close(&d.loop);
        rdzv_status_free(d.status);
        rdzv_jobs_free(d.jobs);
        return CDDP_EXIT_FAILURE;
    }
    if (d.status)
        rdzv_status_attach(d.status, &d.loop, d.srv);
    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    uv_signal_init(&d.loop, &d.sigusr2);
    d.sigterm.data = d.sigint.data = d.sigusr2.data = &d;
    d.keep_runs_on_exit = args.keep_runs_on_exit;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);
    uv_signal_start(&d.sigusr2, on_signal, SIGUSR2);

    printf("cddp-rdzv: listening on %s%s%s\n", rdzv_server_address(d.srv),
           o.token ? " (join token required)" : "", o.store_only ? " (store only)" : "");
    fflush(stdout);
    log_info("R0100", "listening on %s", rdzv_server_address(d.srv));

    uv_run(&d.loop, UV_RUN_DEFAULT);
    rdzv_status_free(d.status);
    rdzv_jobs_free(d.jobs);
    rc = uv_loop_close(&d.loop);
    if (rc) {
        log_error("R0103", "event loop did not close cleanly: %s", uv_strerror(rc));
        return CDDP_EXIT_FAILURE;
    }
    return CDDP_EXIT_OK;
}
