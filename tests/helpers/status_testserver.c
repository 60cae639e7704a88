/*
 * status_testserver: the status port (status/http.c) embedded in a
 * small libuv program, for the process-level tests and the benchmark. Not
 * installed. It plays the owner's part the way cddprun and cddp-rdzv do: a
 * loop that bumps the heartbeat from a timer and renders a view into a
 * snapshot after every change; the changes come from lines on stdin (or
 * SIGUSR1), so a test can walk the status codes through a run's life.
 *
 *   status_testserver [--addr A] [--port P] [--kind agent|rdzv] [--workers N]
 *       [--max-connections N] [--idle-timeout S] [--request-timeout MS]
 *       [--live-timeout MS] [--max-header-bytes N] [--max-body-bytes N]
 *       [--heartbeat-ms MS] [--no-publish]
 *
 * Prints "ready PORT ADDRESS" once listening. Each stdin line is a command,
 * answered "ok ..." (after the new snapshot is published) or "error ...":
 *
 *   state NAME             agent state (rendezvous, running, restarting, ...)
 *   round N                rendezvous round
 *   restart REASON         worker_failure | membership_change
 *   exit LR CODE|SIGNAME   worker LR exits
 *   progress LR TEXT       TEXT and a newline into worker LR's progress channel
 *   progress-long LR N     a line of N bytes into it
 *   run_id TEXT            the run id (label escaping)
 *   hostname TEXT          the host name the views report (any bytes but a
 *                          newline: what a client must print safely)
 *   accepting 0|1          rdzv: the listener check
 *   join RUN NODE          rdzv: NODE joins RUN's current round
 *   wait RUN NODE          rdzv: NODE waits for RUN's next round
 *   wedge / unwedge        stop / restart the heartbeat timer
 *   block MS               block the loop for MS (the HTTP thread must not care)
 *   stats                  "ok stats open=N total=N requests=N slow_closed=N evicted=N"
 *   publish                render and publish again
 *   quit                   stop the server, exit 0 (so does EOF on stdin)
 *
 * SIGUSR1 toggles the agent between running and rendezvous ("ok signal STATE"
 * on stdout); SIGTERM and SIGINT stop it cleanly.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/log.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "config.h"
#include "proto/progress.h"
#include "status/http.h"
#include "status/view.h"

#define MAX_WORKERS 64
#define MAX_RUNS 8
#define MAX_NODES 32
#define LINE_MAX_BYTES (256 * 1024)

struct run {
    char id[64];
    uint64_t round;
    struct status_rdzv_node_view members[MAX_NODES];
    char member_names[MAX_NODES][64];
    size_t nmembers;
    struct status_rdzv_node_view waiting[MAX_NODES];
    char waiting_names[MAX_NODES][64];
    size_t nwaiting;
};

struct app {
    uv_loop_t *loop;
    uv_timer_t beat;
    uv_pipe_t in;
    bool in_open;
    uv_signal_t sig_usr1, sig_term, sig_int;
    struct cddp_buf line;

    struct status_server *srv;
    bool rdzv;
    char hostname[256];
    char run_id[256];
    struct status_agent_view agent;
    struct status_worker_view workers[MAX_WORKERS];
    struct progress_parser progress[MAX_WORKERS];

    struct status_rdzv_view rv;
    struct run runs[MAX_RUNS];
    struct status_rdzv_run_view run_views[MAX_RUNS];
    size_t nruns;
};

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static int publish(struct app *a)
{
    struct status_snapshot *snap;
    int rc;
    if (a->rdzv) {
        for (size_t i = 0; i < a->nruns; i++) {
            struct status_rdzv_run_view *rv = &a->run_views[i];
            struct run *r = &a->runs[i];
            rv->run_id = r->id;
            rv->state = r->nwaiting ? "joining" : "running";
            rv->round = r->round;
            rv->min_nodes = 1;
            rv->max_nodes = 4;
            rv->last_round_at = a->rv.started_at + 1;
            rv->members = r->members;
            rv->nmembers = r->nmembers;
            rv->waiting = r->waiting;
            rv->nwaiting = r->nwaiting;
        }
        a->rv.runs = a->run_views;
        a->rv.nruns = a->nruns;
        rc = status_rdzv_render(&a->rv, cddp_wall_time(), &snap);
    } else {
        for (size_t i = 0; i < a->agent.nworkers; i++)
            a->workers[i].progress = a->progress[i].report;
        rc = status_agent_render(&a->agent, cddp_wall_time(), cddp_mono_ms(), &snap);
    }
    if (rc)
        return rc;
    status_server_publish(a->srv, snap);
    return 0;
}

static int find_state(const char *name)
{
    for (int i = 0; i < STATUS_AGENT_STATE_COUNT; i++)
        if (strcmp(status_agent_state_name((enum status_agent_state)i), name) == 0)
            return i;
    return -1;
}

static void set_state(struct app *a, enum status_agent_state st)
{
    a->agent.state = st;
    double now = cddp_wall_time();
    if (st == STATUS_AGENT_RUNNING) {
        a->agent.node_rank = 0;
        a->agent.nnodes = 1;
        a->agent.world_size = (int)a->agent.nworkers;
        a->agent.last_round_at = now;
        a->agent.last_round_duration_s = 0.012;
    }
    for (size_t i = 0; i < a->agent.nworkers; i++) {
        struct status_worker_view *w = &a->workers[i];
        if (st == STATUS_AGENT_RUNNING) {
            if (a->agent.round == 0)
                a->agent.round = 1;
            if (w->state != STATUS_WORKER_RUNNING) {
                if (w->started_at > 0)
                    w->restarts++;
                w->state = STATUS_WORKER_RUNNING;
                w->pid = 10000 + (int)i;
                w->started_at = now;
                progress_restart(&a->progress[i]);
            }
            w->rank = a->agent.node_rank * (int)a->agent.nworkers + (int)i;
        } else if (st == STATUS_AGENT_RESTARTING || st == STATUS_AGENT_STOPPING) {
            if (w->state == STATUS_WORKER_RUNNING) {
                w->state = STATUS_WORKER_STOPPED;
                w->pid = 0;
                a->agent.worker_exits[STATUS_EXIT_STOPPED]++;
            }
        }
    }
}

static struct run *find_run(struct app *a, const char *id)
{
    for (size_t i = 0; i < a->nruns; i++)
        if (strcmp(a->runs[i].id, id) == 0)
            return &a->runs[i];
    if (a->nruns == MAX_RUNS)
        return NULL;
    struct run *r = &a->runs[a->nruns++];
    memset(r, 0, sizeof(*r));
    cddp_strlcpy(r->id, id, sizeof(r->id));
    return r;
}

static const char *arg2(char *rest, char **second)
{
    char *sp = strchr(rest, ' ');
    if (sp == NULL) {
        *second = NULL;
        return rest;
    }
    *sp = '\0';
    *second = sp + 1;
    return rest;
}

static int worker_of(struct app *a, const char *s)
{
    long lr;
    if (s == NULL || cddp_parse_long(s, 0, (long)a->agent.nworkers - 1, &lr) != 0)
        return -1;
    return (int)lr;
}

static void stop_all(struct app *a);

static void command(struct app *a, char *line)
{
    char *rest = strchr(line, ' ');
    if (rest)
        *rest++ = '\0';
    else
        rest = line + strlen(line);
    const char *cmd = line;
    char *second;

    if (strcmp(cmd, "quit") == 0) {
        stop_all(a);
        say("ok quit");
        return;
    } else if (strcmp(cmd, "state") == 0) {
        int st = find_state(rest);
        if (st < 0) {
            say("error unknown state '%s'", rest);
            return;
        }
        set_state(a, (enum status_agent_state)st);
    } else if (strcmp(cmd, "round") == 0) {
        long n;
        if (cddp_parse_long(rest, 0, 1000000, &n) != 0) {
            say("error bad round '%s'", rest);
            return;
        }
        a->agent.round = (uint64_t)n;
    } else if (strcmp(cmd, "restart") == 0) {
        if (strcmp(rest, "worker_failure") == 0) {
            a->agent.restarts[STATUS_RESTART_WORKER_FAILURE]++;
            a->agent.restart_count++;
        } else if (strcmp(rest, "membership_change") == 0) {
            a->agent.restarts[STATUS_RESTART_MEMBERSHIP_CHANGE]++;
        } else {
            say("error bad restart reason '%s'", rest);
            return;
        }
    } else if (strcmp(cmd, "exit") == 0) {
        int lr = worker_of(a, arg2(rest, &second));
        if (lr < 0 || second == NULL) {
            say("error usage: exit LR CODE|SIGNAME");
            return;
        }
        struct status_worker_view *w = &a->workers[lr];
        long code;
        w->pid = 0;
        w->exited_at = cddp_wall_time();
        if (cddp_parse_long(second, 0, 255, &code) == 0) {
            w->exit_code = (int)code;
            w->signal = 0;
            w->state = code == 0 ? STATUS_WORKER_SUCCEEDED : STATUS_WORKER_FAILED;
            a->agent.worker_exits[code == 0    ? STATUS_EXIT_SUCCESS
                                  : code == 75 ? STATUS_EXIT_COLLECTIVE_TIMEOUT
                                  : code == 76 ? STATUS_EXIT_WATCHDOG
                                               : STATUS_EXIT_FAILURE]++;
        } else {
            int sig = cddp_signal_from_name(second);
            if (sig <= 0) {
                say("error bad exit '%s'", second);
                return;
            }
            w->exit_code = -1;
            w->signal = sig;
            w->state = STATUS_WORKER_FAILED;
            a->agent.worker_exits[STATUS_EXIT_SIGNAL]++;
        }
    } else if (strcmp(cmd, "progress") == 0 || strcmp(cmd, "progress-long") == 0) {
        int lr = worker_of(a, arg2(rest, &second));
        if (lr < 0 || second == NULL) {
            say("error usage: %s LR TEXT", cmd);
            return;
        }
        uint64_t now = cddp_mono_ms();
        double wall = cddp_wall_time();
        if (strcmp(cmd, "progress") == 0) {
            progress_feed(&a->progress[lr], second, strlen(second), now, wall);
        } else {
            long n;
            if (cddp_parse_long(second, 1, 1 << 20, &n) != 0) {
                say("error bad length '%s'", second);
                return;
            }
            /* A valid object padded with spaces to n bytes, in 1000-byte reads. */
            char chunk[1000];
            memset(chunk, ' ', sizeof(chunk));
            memcpy(chunk, "{\"step\":999999}", 15);
            for (long off = 0; off < n; off += (long)sizeof(chunk)) {
                size_t len = (size_t)(n - off) < sizeof(chunk) ? (size_t)(n - off) : sizeof(chunk);
                progress_feed(&a->progress[lr], chunk, len, now, wall);
                memset(chunk, ' ', 15);
            }
        }
        progress_feed(&a->progress[lr], "\n", 1, now, wall);
    } else if (strcmp(cmd, "run_id") == 0) {
        cddp_strlcpy(a->run_id, rest, sizeof(a->run_id));
    } else if (strcmp(cmd, "hostname") == 0) {
        cddp_strlcpy(a->hostname, rest, sizeof(a->hostname));
    } else if (strcmp(cmd, "accepting") == 0) {
        a->rv.accepting = strcmp(rest, "1") == 0;
    } else if (strcmp(cmd, "join") == 0 || strcmp(cmd, "wait") == 0) {
        const char *run = arg2(rest, &second);
        struct run *r = second ? find_run(a, run) : NULL;
        bool join = strcmp(cmd, "join") == 0;
        if (r == NULL || (join ? r->nmembers : r->nwaiting) == MAX_NODES) {
            say("error usage: %s RUN NODE (at most %d runs, %d nodes)", cmd, MAX_RUNS, MAX_NODES);
            return;
        }
        double now = cddp_wall_time();
        size_t i = join ? r->nmembers++ : r->nwaiting++;
        struct status_rdzv_node_view *n = join ? &r->members[i] : &r->waiting[i];
        char *name = join ? r->member_names[i] : r->waiting_names[i];
        cddp_strlcpy(name, second, 64);
        n->node = name;
        n->node_rank = join ? (int)i : -1;
        n->nproc = 4;
        n->joined_at = now;
        n->last_seen_at = now;
        if (join) {
            r->round++;
            a->rv.rounds_total++;
        }
        a->rv.joins_total++;
    } else if (strcmp(cmd, "wedge") == 0) {
        uv_timer_stop(&a->beat);
    } else if (strcmp(cmd, "unwedge") == 0) {
        status_server_heartbeat(a->srv);
        uv_timer_again(&a->beat);
    } else if (strcmp(cmd, "block") == 0) {
        long ms;
        if (cddp_parse_long(rest, 0, 60000, &ms) != 0) {
            say("error bad duration '%s'", rest);
            return;
        }
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    } else if (strcmp(cmd, "stats") == 0) {
        struct status_server_stats st;
        status_server_stats(a->srv, &st);
        say("ok stats open=%llu total=%llu requests=%llu slow_closed=%llu evicted=%llu",
            (unsigned long long)st.connections_open, (unsigned long long)st.connections_total,
            (unsigned long long)st.requests_total, (unsigned long long)st.slow_closed_total,
            (unsigned long long)st.evicted_total);
        return;
    } else if (strcmp(cmd, "publish") != 0) {
        say("error unknown command '%s'", cmd);
        return;
    }
    int rc = publish(a);
    if (rc)
        say("error publish: %s", cddp_strerror(rc));
    else
        say("ok %s", cmd);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    static char chunk[65536];
    *buf = uv_buf_init(chunk, sizeof(chunk));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct app *a = stream->data;
    if (nread < 0) {
        stop_all(a); /* EOF or error on stdin: the test is gone */
        return;
    }
    if (cddp_buf_append(&a->line, buf->base, (size_t)nread) != 0) {
        say("error command line longer than %d bytes", LINE_MAX_BYTES);
        cddp_buf_reset(&a->line);
        return;
    }
    char *nl;
    while (a->srv && (nl = memchr(a->line.data, '\n', a->line.len)) != NULL) {
        size_t n = (size_t)(nl - a->line.data);
        *nl = '\0';
        if (n > 0 && a->line.data[n - 1] == '\r')
            a->line.data[n - 1] = '\0';
        command(a, a->line.data);
        cddp_buf_consume(&a->line, n + 1);
    }
}

static void on_beat(uv_timer_t *t)
{
    struct app *a = t->data;
    status_server_heartbeat(a->srv);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct app *a = h->data;
    if (signum == SIGUSR1) {
        set_state(a, a->agent.state == STATUS_AGENT_RUNNING ? STATUS_AGENT_RENDEZVOUS
                                                            : STATUS_AGENT_RUNNING);
        publish(a);
        say("ok signal %s", status_agent_state_name(a->agent.state));
        return;
    }
    stop_all(a);
}

/* Stops the server and closes every handle; the loop then ends. */
static void stop_all(struct app *a)
{
    if (a->srv == NULL)
        return;
    status_server_stop(a->srv);
    a->srv = NULL;
    uv_close((uv_handle_t *)&a->beat, NULL);
    uv_close((uv_handle_t *)&a->sig_usr1, NULL);
    uv_close((uv_handle_t *)&a->sig_term, NULL);
    uv_close((uv_handle_t *)&a->sig_int, NULL);
    if (a->in_open)
        uv_close((uv_handle_t *)&a->in, NULL);
}

static void usage(const char *msg)
{
    fprintf(stderr, "status_testserver: %s\n", msg);
    exit(CDDP_EXIT_USAGE);
}

static long num_arg(const char *flag, const char *v, long min, long max)
{
    long n;
    if (v == NULL || cddp_parse_long(v, min, max, &n) != 0) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%s wants a number in %ld..%ld", flag, min, max);
        usage(msg);
    }
    return n;
}

int main(int argc, char **argv)
{
    cddp_log_init("status_testserver");
    static struct app a;
    struct status_server_options o;
    status_server_options_default(&o);
    o.program = "status_testserver";
    long nworkers = 2, heartbeat_ms = 100;
    bool publish_first = true;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(f, "--no-publish") == 0) {
            publish_first = false;
            continue;
        }
        i++;
        if (strcmp(f, "--addr") == 0 && v)
            o.addr = v;
        else if (strcmp(f, "--port") == 0)
            o.port = (int)num_arg(f, v, 0, 65535);
        else if (strcmp(f, "--kind") == 0 && v)
            a.rdzv = strcmp(v, "rdzv") == 0;
        else if (strcmp(f, "--workers") == 0)
            nworkers = num_arg(f, v, 0, MAX_WORKERS);
        else if (strcmp(f, "--max-connections") == 0)
            o.max_connections = (unsigned)num_arg(f, v, 1, 100000);
        else if (strcmp(f, "--idle-timeout") == 0)
            o.idle_timeout_s = (unsigned)num_arg(f, v, 1, 3600);
        else if (strcmp(f, "--request-timeout") == 0)
            o.request_timeout_ms = (unsigned)num_arg(f, v, 1, 3600000);
        else if (strcmp(f, "--live-timeout") == 0)
            o.live_timeout_ms = (unsigned)num_arg(f, v, 1, 3600000);
        else if (strcmp(f, "--max-header-bytes") == 0)
            o.max_header_bytes = (size_t)num_arg(f, v, 64, 1 << 20);
        else if (strcmp(f, "--max-body-bytes") == 0)
            o.max_body_bytes = (size_t)num_arg(f, v, 0, 1 << 20);
        else if (strcmp(f, "--heartbeat-ms") == 0)
            heartbeat_ms = num_arg(f, v, 1, 60000);
        else {
            char msg[300];
            snprintf(msg, sizeof(msg), "unknown or incomplete option '%s'", f);
            usage(msg);
        }
    }

    char err[256];
    int rc = status_server_start(&o, &a.srv, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "status_testserver: %s\n", err);
        return CDDP_EXIT_FAILURE;
    }

    gethostname(a.hostname, sizeof(a.hostname) - 1);
    cddp_strlcpy(a.run_id, "testrun", sizeof(a.run_id));
    double now = cddp_wall_time();
    struct status_agent_view *v = &a.agent;
    v->program = "cddprun";
    v->version = CDDP_VERSION;
    v->pid = (int)getpid();
    v->hostname = a.hostname;
    v->run_id = a.run_id;
    v->started_at = now;
    v->state = STATUS_AGENT_RENDEZVOUS;
    v->node_rank = -1;
    v->local_world_size = (int)nworkers;
    v->last_round_duration_s = -1;
    v->rdzv_backend = "c10d";
    v->rdzv_endpoint = "127.0.0.1:29400";
    v->max_restarts = 3;
    v->nworkers = (size_t)nworkers;
    v->workers = a.workers;
    for (long i = 0; i < nworkers; i++) {
        a.workers[i].local_rank = (int)i;
        a.workers[i].rank = -1;
        a.workers[i].exit_code = -1;
        progress_init(&a.progress[i]);
    }
    a.rv.program = "cddp-rdzv";
    a.rv.version = CDDP_VERSION;
    a.rv.pid = (int)getpid();
    a.rv.hostname = a.hostname;
    a.rv.endpoint = "0.0.0.0:29400";
    a.rv.started_at = now;
    a.rv.accepting = true;
    a.rv.connections = 2;
    a.rv.connections_total = 2;

    cddp_buf_init(&a.line, LINE_MAX_BYTES);
    a.loop = uv_default_loop();
    uv_timer_init(a.loop, &a.beat);
    a.beat.data = &a;
    uv_timer_start(&a.beat, on_beat, (uint64_t)heartbeat_ms, (uint64_t)heartbeat_ms);
    uv_signal_t *sigs[] = {&a.sig_usr1, &a.sig_term, &a.sig_int};
    int signums[] = {SIGUSR1, SIGTERM, SIGINT};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(a.loop, sigs[i]);
        sigs[i]->data = &a;
        uv_signal_start(sigs[i], on_signal, signums[i]);
    }
    /* Commands come from a pipe; with stdin from a file (the benchmark's
     * </dev/null) the server just runs until signalled. */
    if (uv_guess_handle(0) == UV_NAMED_PIPE && uv_pipe_init(a.loop, &a.in, 0) == 0) {
        a.in_open = true;
        a.in.data = &a;
        if (uv_pipe_open(&a.in, 0) != 0 ||
            uv_read_start((uv_stream_t *)&a.in, on_alloc, on_read) != 0) {
            fprintf(stderr, "status_testserver: cannot read commands from stdin\n");
            stop_all(&a);
        }
    }
    if (a.srv && publish_first && publish(&a) != 0) {
        fprintf(stderr, "status_testserver: cannot render the first snapshot\n");
        stop_all(&a);
    }
    if (a.srv)
        say("ready %d %s", status_server_port(a.srv), status_server_address(a.srv));
    uv_run(a.loop, UV_RUN_DEFAULT);
    rc = uv_loop_close(a.loop);
    cddp_buf_free(&a.line);
    if (rc != 0) {
        fprintf(stderr, "status_testserver: handles left open at exit\n");
        return CDDP_EXIT_FAILURE;
    }
    return CDDP_EXIT_OK;
}
