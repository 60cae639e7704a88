/*
 * cddpctl: the status client of cddprun's and cddp-rdzv's status port.
 *
 *     cddpctl status HOST:PORT [--json] [--watch [--interval S] [--count N]]
 *                              [--total-steps N] [--timeout S]
 *     cddpctl health HOST:PORT [--live] [--verbose] [--json] [--timeout S]
 *     cddpctl job RDZV_HOST:PORT RUN_ID [--agent-port PORT] [--json]
 *                              [--watch ...] [--total-steps N] [--timeout S]
 *
 * status prints a readable table of GET /status (--json: the JSON as
 * served; --watch: again every --interval, redrawn in place on a terminal);
 * health asks GET /readyz (--live: /livez) for scripts and exec probes; job
 * lists a run's nodes as its rendezvous server knows them and, with
 * --agent-port, every node's workers from its own agent. Exit codes
 * (docs/status.md):
 *
 *     0  status printed / ready (alive with --live); a watch stopped by a
 *        signal or --count, or whose agent went away after it succeeded
 *     1  status: the reply was an HTTP error or not JSON; health: not ready;
 *        job: no such run; a watch whose agent went away before success
 *     2  unreachable (refused, timed out, no such host), or a usage error
 *
 * HOST:PORT may be "[::1]:8080" or a URL ("http://node:8080"). Every error
 * is one line on stderr that names the address and what went wrong.
 *
 * Commands are a table (commands[] below): a new one is a function and a
 * row, and says which options it takes.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/ioctl.h> /* --watch: TIOCGWINSZ, the terminal's size */
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/strutil.h"
#include "config.h"

/* health's "cannot tell": the same number as a usage error, on purpose. */
#define CTL_EXIT_UNREACHABLE 2
/* Internal to job: the run is not on the server (exit 1). */
#define CTL_NO_RUN 3
#define REPLY_MAX ((size_t)64 << 20)
#define MAX_POSITIONAL 4
/* A watch gives up after this many timeouts in a row (a refused or cut
 * connection ends it at once). */
#define WATCH_TIMEOUTS 3
/* job: agents asked at once. */
#define JOB_PARALLEL 32

static const char usage_text[] =
    "usage: cddpctl status HOST:PORT [--json] [--watch] [--timeout SECONDS]\n"
    "       cddpctl health HOST:PORT [--live] [--verbose] [--json] [--timeout SECONDS]\n"
    "       cddpctl job RDZV_HOST:PORT RUN_ID [--agent-port PORT] [--json] [--watch]\n"
    "       cddpctl stacks HOST:PORT [--timeout SECONDS]\n"
    "\n"
    "Asks the status port of cddprun (--status_port) or cddp-rdzv.\n"
    "  status   the node's or the server's status as a table (--json: raw JSON)\n"
    "  health   exit 0 when ready (/readyz), 1 when not, 2 when unreachable;\n"
    "           --live asks /livez instead, --verbose prints every check\n"
    "  job      a run's nodes through its rendezvous server's status port;\n"
    "           --agent-port PORT also asks every node's agent on that port\n"
    "  stacks   capture every running worker's stacks now (cddprun) and print them\n"
    "           (--timeout default 15)\n"
    "Options:\n"
    "  --json               machine-readable output (docs/status.md)\n"
    "  --watch, -w          status and job: again every --interval, in place on a terminal\n"
    "  --interval, -n SECONDS   between snapshots of --watch (default 2)\n"
    "  --count N            stop --watch after N snapshots\n"
    "  --total-steps N      draw a progress bar per worker against N steps\n"
    "  --agent-port PORT    job: the --status_port every node's agent serves\n"
    "  --timeout SECONDS    for the whole request (default 5)\n"
    "  --live, --verbose    health: /livez; print every check\n"
    "HOST:PORT may also be a URL: http://node:8080\n";

/* ---- options and commands ----------------------------------------------- */

enum {
    OPT_JSON = 1u << 0,
    OPT_HEALTH = 1u << 1,   /* --live, --verbose */
    OPT_WATCH = 1u << 2,    /* --watch, --interval, --count */
    OPT_STEPS = 1u << 3,    /* --total-steps */
    OPT_AGENTPORT = 1u << 4 /* --agent-port */
};

struct options {
    const struct command *cmd;
    const char *pos[MAX_POSITIONAL];
    int npos;
    unsigned given; /* OPT_* seen */
    bool json, live, verbose, watch;
    double timeout_s;
    bool timeout_given; /* stacks waits longer by default */
    double interval_s;
    long count;       /* --count; 0: no limit */
    long total_steps; /* --total-steps; 0: unknown */
    int agent_port;   /* --agent-port; 0: none */
    /* The first positional as a URL base and as shown in messages. */
    char base[2048];
    char shown[300];
};

/* One frame of output: renders into out. Returns 0, CDDP_EXIT_FAILURE (an
 * answer that is not a status), CTL_EXIT_UNREACHABLE (errmsg says why;
 * *timed_out for a timeout) or CTL_NO_RUN. quiet: errors go to errmsg, not
 * the log (a watch reports them its own way). state: the agent's or run's
 * state, for a watch's exit code. */
struct frame_ctx {
    FILE *out;
    bool quiet;
    char errmsg[512];
    bool timed_out;
    char state[32];
};

struct command {
    const char *name;
    int nargs;                                                  /* positionals after the command */
    const char *argdesc;                                        /* for "no ... given" */
    unsigned opts;                                              /* OPT_* it takes */
    int (*frame)(const struct options *o, struct frame_ctx *f); /* NULL: run instead */
    int (*run)(const struct options *o);
};

static int cmd_status(const struct options *o, struct frame_ctx *f);
static int cmd_job(const struct options *o, struct frame_ctx *f);
static int cmd_health(const struct options *o);
static int cmd_stacks(const struct options *o);

static const struct command commands[] = {
    {"status", 1, "HOST:PORT", OPT_JSON | OPT_WATCH | OPT_STEPS, cmd_status, NULL},
    {"health", 1, "HOST:PORT", OPT_JSON | OPT_HEALTH, NULL, cmd_health},
    {"job", 2, "RDZV_HOST:PORT RUN_ID", OPT_JSON | OPT_WATCH | OPT_STEPS | OPT_AGENTPORT, cmd_job,
     NULL},
    {"stacks", 1, "HOST:PORT", 0, NULL, cmd_stacks},
};

/* What to say when an option is given to a command that does not take it. */
static const struct {
    unsigned opt;
    const char *says;
} option_owner[] = {
    {OPT_JSON, "--json is an option of status, health and job"},
    {OPT_HEALTH, "--live and --verbose are options of health"},
    {OPT_WATCH, "--watch, --interval and --count are options of status and job"},
    {OPT_STEPS, "--total-steps is an option of status and job"},
    {OPT_AGENTPORT, "--agent-port is an option of job"},
};

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_error("K0001", "%s (cddpctl --help for usage)", msg);
    return CDDP_EXIT_USAGE;
}

/* "--name=value" or "--name value": the value, or NULL (and a usage error
 * logged) when it is missing. *i advances past a separate value. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, const char *what)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (a[n] == '=')
        return a + n + 1;
    if (*i + 1 < argc)
        return argv[++*i];
    usage_error("%s needs %s", name, what);
    return NULL;
}

/* a is name or name=...: the option name matches. */
static bool is_opt(const char *a, const char *name)
{
    size_t n = strlen(name);
    return strncmp(a, name, n) == 0 && (a[n] == '\0' || a[n] == '=');
}

static int parse_args(int argc, char **argv, struct options *o)
{
    o->timeout_s = 5.0;
    o->interval_s = 2.0;
    const char *cmdname = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            exit(CDDP_EXIT_OK);
        } else if (strcmp(a, "--version") == 0) {
            printf("cddpctl %s\n", CDDP_VERSION);
            exit(CDDP_EXIT_OK);
        } else if (strcmp(a, "--json") == 0) {
            o->json = true;
            o->given |= OPT_JSON;
        } else if (strcmp(a, "--live") == 0) {
            o->live = true;
            o->given |= OPT_HEALTH;
        } else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            o->verbose = true;
            o->given |= OPT_HEALTH;
        } else if (strcmp(a, "--watch") == 0 || strcmp(a, "-w") == 0) {
            o->watch = true;
            o->given |= OPT_WATCH;
        } else if (is_opt(a, "--interval") || strcmp(a, "-n") == 0) {
            if ((v = opt_value(argc, argv, &i, "--interval", "a number of seconds")) == NULL)
                return CDDP_EXIT_USAGE;
            if (cddp_parse_double(v, 0.1, 86400, &o->interval_s) != 0)
                return usage_error("--interval '%s' is not a number of seconds in [0.1, 86400]", v);
            o->given |= OPT_WATCH;
        } else if (is_opt(a, "--count")) {
            if ((v = opt_value(argc, argv, &i, "--count", "a number of snapshots")) == NULL)
                return CDDP_EXIT_USAGE;
            if (cddp_parse_long(v, 1, 1000000000L, &o->count) != 0)
                return usage_error("--count '%s' is not a number of snapshots >= 1", v);
            o->given |= OPT_WATCH;
        } else if (is_opt(a, "--total-steps")) {
            if ((v = opt_value(argc, argv, &i, "--total-steps", "a number of steps")) == NULL)
                return CDDP_EXIT_USAGE;
            if (cddp_parse_long(v, 1, 1L << 53, &o->total_steps) != 0)
                return usage_error("--total-steps '%s' is not a number of steps >= 1", v);
            o->given |= OPT_STEPS;
        } else if (is_opt(a, "--agent-port")) {
            if ((v = opt_value(argc, argv, &i, "--agent-port", "a port")) == NULL)
                return CDDP_EXIT_USAGE;
            if (cddp_parse_long(v, 1, 65535, &n) != 0)
                return usage_error("--agent-port '%s' is not a port in 1..65535", v);
            o->agent_port = (int)n;
            o->given |= OPT_AGENTPORT;
        } else if (is_opt(a, "--timeout")) {
            if ((v = opt_value(argc, argv, &i, "--timeout", "a number of seconds")) == NULL)
                return CDDP_EXIT_USAGE;
            if (cddp_parse_double(v, 0.001, 3600, &o->timeout_s) != 0)
                return usage_error("--timeout '%s' is not a number of seconds in (0, 3600]", v);
            o->timeout_given = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            return usage_error("unknown option '%s'", a);
        } else if (cmdname == NULL) {
            cmdname = a;
        } else if (o->npos < MAX_POSITIONAL) {
            o->pos[o->npos++] = a;
        } else {
            return usage_error("unexpected argument '%s'", a);
        }
    }
    if (cmdname == NULL)
        return usage_error("no command (status, health, job or stacks)");
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
        if (strcmp(commands[c].name, cmdname) == 0)
            o->cmd = &commands[c];
    if (o->cmd == NULL)
        return usage_error("unknown command '%s' (status, health, job or stacks)", cmdname);
    if (o->npos < o->cmd->nargs)
        return usage_error("no %s given", o->npos == 0 ? o->cmd->argdesc : "RUN_ID");
    if (o->npos > o->cmd->nargs)
        return usage_error("unexpected argument '%s'", o->pos[o->cmd->nargs]);
    for (size_t k = 0; k < sizeof(option_owner) / sizeof(option_owner[0]); k++)
        if ((o->given & option_owner[k].opt) && !(o->cmd->opts & option_owner[k].opt))
            return usage_error("%s", option_owner[k].says);
    if ((o->given & OPT_WATCH) && !o->watch)
        return usage_error("--interval and --count go with --watch");
    return 0;
}

/* "http://host:port" without a trailing slash, and the name for messages. */
static int base_url(const char *target, char *url, size_t len, char *shown, size_t shown_len)
{
    if (strncmp(target, "http://", 7) == 0 || strncmp(target, "https://", 8) == 0) {
        size_t n = cddp_strlcpy(url, target, len);
        if (n >= len)
            return usage_error("URL '%s' is too long", target);
        while (n > 0 && url[n - 1] == '/')
            url[--n] = '\0';
        cddp_strlcpy(shown, strchr(target, ':') + 3, shown_len);
        n = strlen(shown);
        while (n > 0 && shown[n - 1] == '/')
            shown[--n] = '\0';
        return 0;
    }
    struct cddp_hostport hp;
    char err[256];
    if (cddp_hostport_parse(target, -1, &hp, err, sizeof(err)) != 0)
        return usage_error("%s", err);
    if (!hp.has_port || hp.port <= 0)
        return usage_error("'%s' has no port: give HOST:PORT (the --status_port)", target);
    cddp_hostport_format(hp.host, hp.port, shown, shown_len);
    snprintf(url, len, "http://%s", shown);
    return 0;
}

/* ---- signals: a watch ends cleanly on SIGINT, SIGTERM, SIGHUP ---------- */

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

static void catch_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal; /* no SA_RESTART: a sleep ends at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout shows as a write error */
}

/* ---- HTTP ------------------------------------------------------------ */

struct reply {
    long code;
    char ctype[128];
    struct cddp_buf body;
    CURLcode rc;
    long oserr;
    char errbuf[CURL_ERROR_SIZE];
};

static size_t on_body(char *p, size_t size, size_t n, void *userdata)
{
    struct cddp_buf *b = userdata;
    return cddp_buf_append(b, p, size * n) == 0 ? size * n : 0;
}

/* libcurl's progress callback: a stop signal aborts the transfer. */
static int on_xfer(void *p, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    return stop_signal != 0;
}

static CURL *handle_new(const char *url, double timeout_s, struct reply *r)
{
    CURL *c = curl_easy_init();
    if (c == NULL)
        return NULL;
    long ms = (long)ceil(timeout_s * 1000.0);
    cddp_buf_init(&r->body, REPLY_MAX);
    r->errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "cddpctl/" CDDP_VERSION);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xfer);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_PRIVATE, r);
    return c;
}

/* Records a finished transfer's outcome in r. */
static void handle_done(CURL *c, CURLcode rc, struct reply *r)
{
    r->rc = rc;
    if (rc != CURLE_OK) {
        curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &r->oserr);
        return;
    }
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->code);
    char *ct = NULL;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    cddp_strlcpy(r->ctype, ct ? ct : "", sizeof(r->ctype));
    if (r->body.data == NULL)
        cddp_buf_append(&r->body, "", 0);
}

/* A failed transfer in words ("cannot connect to X: Connection refused"). */
static void transfer_error(const struct reply *r, const char *url, const char *shown,
                           double timeout_s, char *msg, size_t len)
{
    const char *detail = r->errbuf[0] ? r->errbuf : curl_easy_strerror(r->rc);
    switch (r->rc) {
    case CURLE_COULDNT_CONNECT:
        snprintf(msg, len, "cannot connect to %s: %s", shown,
                 r->oserr ? cddp_strerror(-(int)r->oserr) : detail);
        break;
    case CURLE_OPERATION_TIMEDOUT:
        snprintf(msg, len, "%s did not answer within %gs", shown, timeout_s);
        break;
    case CURLE_COULDNT_RESOLVE_HOST:
        snprintf(msg, len, "cannot resolve the host of %s", shown);
        break;
    case CURLE_GOT_NOTHING:
        snprintf(msg, len, "%s closed the connection without a reply", shown);
        break;
    case CURLE_WRITE_ERROR:
        snprintf(msg, len, "%s: the reply is larger than %zu MiB", url, REPLY_MAX >> 20);
        break;
    case CURLE_ABORTED_BY_CALLBACK:
        snprintf(msg, len, "%s: interrupted", shown);
        break;
    default:
        snprintf(msg, len, "%s: %s", url, detail);
        break;
    }
}

/* One request to url: a GET, or a POST with an empty body. On failure
 * returns CTL_EXIT_UNREACHABLE (CDDP_EXIT_FAILURE when the reply was too
 * large) and logs one line, or, with f->quiet, puts it in f->errmsg (f may
 * be NULL: then it is logged). */
static int request(const char *url, bool post, const char *shown, double timeout_s, struct reply *r,
                   struct frame_ctx *f)
{
    CURL *c = handle_new(url, timeout_s, r);
    if (c == NULL) {
        log_error("K0002", "cannot start libcurl");
        return CDDP_EXIT_FAILURE;
    }
    if (post)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
    handle_done(c, curl_easy_perform(c), r);
    curl_easy_cleanup(c);
    if (r->rc == CURLE_OK)
        return 0;
    char msg[512];
    transfer_error(r, url, shown, timeout_s, msg, sizeof(msg));
    if (f && r->rc == CURLE_OPERATION_TIMEDOUT)
        f->timed_out = true;
    if (f && f->quiet) {
        cddp_strlcpy(f->errmsg, msg, sizeof(f->errmsg));
    } else {
        switch (r->rc) {
        case CURLE_COULDNT_CONNECT:
            log_error("K0003", "%s", msg);
            break;
        case CURLE_OPERATION_TIMEDOUT:
            log_error("K0004", "%s", msg);
            break;
        case CURLE_COULDNT_RESOLVE_HOST:
            log_error("K0005", "%s", msg);
            break;
        case CURLE_GOT_NOTHING:
            log_error("K0006", "%s", msg);
            break;
        case CURLE_WRITE_ERROR:
            log_error("K0007", "%s", msg);
            break;
        default:
            log_error("K0008", "%s", msg);
            break;
        }
    }
    return r->rc == CURLE_WRITE_ERROR ? CDDP_EXIT_FAILURE : CTL_EXIT_UNREACHABLE;
}

/* GET url, as request() says. */
static int fetch_for(const char *url, const char *shown, double timeout_s, struct reply *r,
                     struct frame_ctx *f)
{
    return request(url, false, shown, timeout_s, r, f);
}

static int fetch(const char *url, const char *shown, double timeout_s, struct reply *r)
{
    return request(url, false, shown, timeout_s, r, NULL);
}

/* The first line of a body, quoted and shortened, for error messages. */
static void excerpt(const struct cddp_buf *b, char *out, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < b->len && n + 5 < len && i < 80; i++) {
        unsigned char ch = (unsigned char)b->data[i];
        if (ch == '\n' || ch == '\r')
            break;
        out[n++] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    if (b->len > n && n + 4 < len) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

/* GET base/status as a JSON object (the caller deletes it), or NULL with
 * *rc set and one line logged (or in f->errmsg). */
static cJSON *fetch_status(const char *base, const char *shown, double timeout_s,
                           struct frame_ctx *f, int *rc, struct cddp_buf *raw)
{
    char url[2100];
    snprintf(url, sizeof(url), "%s/status", base);
    struct reply r = {0};
    *rc = fetch_for(url, shown, timeout_s, &r, f);
    if (*rc) {
        cddp_buf_free(&r.body);
        return NULL;
    }
    char ex[96];
    excerpt(&r.body, ex, sizeof(ex));
    cJSON *root = cJSON_ParseWithLength(r.body.data, r.body.len);
    if (r.code != 200) {
        const cJSON *e = root ? cJSON_GetObjectItemCaseSensitive(root, "error") : NULL;
        const char *msg = cJSON_IsString(e) ? e->valuestring : NULL;
        if (f && f->quiet)
            snprintf(f->errmsg, sizeof(f->errmsg), "%.300s answered HTTP %ld%s%.100s", url, r.code,
                     msg || ex[0] ? ": " : "", msg ? msg : ex);
        else
            log_error("K0010", "%s answered HTTP %ld%s%s", url, r.code, msg || ex[0] ? ": " : "",
                      msg ? msg : ex);
        *rc = CDDP_EXIT_FAILURE;
    } else if (!cJSON_IsObject(root)) {
        if (f && f->quiet)
            snprintf(f->errmsg, sizeof(f->errmsg), "%.400s did not answer JSON", url);
        else
            log_error("K0011",
                      "%s did not answer JSON (Content-Type '%s'): '%s'; is %s a cddp status "
                      "port?",
                      url, r.ctype, ex, shown);
        *rc = CDDP_EXIT_FAILURE;
    }
    if (*rc) {
        cddp_buf_free(&r.body);
        cJSON_Delete(root);
        return NULL;
    }
    if (raw)
        *raw = r.body; /* the caller's now */
    else
        cddp_buf_free(&r.body);
    return root;
}

/* ---- the table ------------------------------------------------------- */

#define MAX_COLS 12
#define CELL 64

struct table {
    size_t ncols, nrows, cap;
    char (*cells)[MAX_COLS][CELL];
};

static void table_rowv(struct table *t, size_t ncols, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        void *p = realloc(t->cells, cap * sizeof(*t->cells));
        if (p == NULL)
            return;
        t->cells = p;
        t->cap = cap;
    }
    for (size_t i = 0; i < ncols && i < MAX_COLS; i++)
        cddp_strlcpy(t->cells[t->nrows][i], cells[i], CELL);
    t->ncols = ncols;
    t->nrows++;
}

static void table_row(struct table *t, size_t ncols, ...)
{
    const char *cells[MAX_COLS];
    va_list ap;
    va_start(ap, ncols);
    for (size_t i = 0; i < ncols && i < MAX_COLS; i++)
        cells[i] = va_arg(ap, const char *);
    va_end(ap);
    table_rowv(t, ncols, cells);
}

static void table_print(struct table *t, FILE *out)
{
    size_t width[MAX_COLS] = {0};
    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < t->ncols; c++) {
            size_t w = strlen(t->cells[r][c]);
            if (w > width[c])
                width[c] = w;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            if (c + 1 == t->ncols)
                fprintf(out, "%s\n", t->cells[r][c]);
            else
                fprintf(out, "%-*s  ", (int)width[c], t->cells[r][c]);
        }
    }
    free(t->cells);
    t->cells = NULL;
    t->nrows = t->cap = 0;
}

/* ---- reading the JSON leniently: a missing field prints as "-" --------- */

static const cJSON *field(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static bool num(const cJSON *o, const char *key, double *v)
{
    const cJSON *it = field(o, key);
    if (!cJSON_IsNumber(it))
        return false;
    *v = it->valuedouble;
    return true;
}

static const char *str(const cJSON *o, const char *key, const char *dflt)
{
    const cJSON *it = field(o, key);
    return cJSON_IsString(it) ? it->valuestring : dflt;
}

/* "%.*g" of a number field, its string (NaN), or "-". */
static const char *fmt_num(const cJSON *o, const char *key, const char *fmt, char *buf, size_t len)
{
    double v;
    if (num(o, key, &v)) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(buf, len, fmt, v);
#pragma GCC diagnostic pop
        return buf;
    }
    return str(o, key, "-");
}

static void fmt_duration(double s, char *buf, size_t len)
{
    if (s < 0 || !isfinite(s))
        snprintf(buf, len, "-");
    else if (s < 1)
        snprintf(buf, len, "%.0fms", s * 1000);
    else if (s < 60)
        snprintf(buf, len, "%.1fs", s);
    else if (s < 3600)
        snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else if (s < 86400)
        snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else
        snprintf(buf, len, "%dd%02dh", (int)(s / 86400), (int)fmod(s / 3600, 24));
}

/* "12s ago" for a wall time, against the server's own clock (generated_at),
 * so a skewed local clock does not matter. */
static const char *fmt_ago(const cJSON *o, const char *key, double now, char *buf, size_t len)
{
    double t;
    if (!num(o, key, &t) || t <= 0)
        return "-";
    char d[32];
    fmt_duration(now - t < 0 ? 0 : now - t, d, sizeof(d));
    snprintf(buf, len, "%s ago", d);
    return buf;
}

/* "[#########-----------]  45%": step of total, 20 cells wide. */
static void fmt_bar(double step, double total, char *buf, size_t len)
{
    enum { W = 20 };
    double frac = total > 0 ? step / total : 0;
    if (!(frac >= 0))
        frac = 0;
    if (frac > 1)
        frac = 1;
    char cells[W + 1];
    int full = (int)floor(frac * W);
    for (int i = 0; i < W; i++)
        cells[i] = i < full ? '#' : '-';
    cells[W] = '\0';
    snprintf(buf, len, "[%s] %3.0f%%", cells, floor(frac * 100));
}

/* The total number of steps for a worker's bar: --total-steps, else the
 * progress object's total_steps when an agent reports one; 0: unknown. */
static double total_steps(const struct options *o, const cJSON *progress)
{
    double v;
    if (o->total_steps > 0)
        return (double)o->total_steps;
    if (num(progress, "total_steps", &v) && v > 0)
        return v;
    return 0;
}

static void print_header(FILE *out, const cJSON *root)
{
    double pid = 0, up = -1;
    num(root, "pid", &pid);
    num(root, "uptime_s", &up);
    char upbuf[32];
    fmt_duration(up, upbuf, sizeof(upbuf));
    fprintf(out, "%s %s on %s (pid %.0f), up %s\n", str(root, "program", "?"),
            str(root, "version", "?"), str(root, "hostname", "?"), pid, upbuf);
}

static void print_counts(FILE *out, int width, const char *title, const cJSON *obj)
{
    if (!cJSON_IsObject(obj))
        return;
    fprintf(out, "%-*s", width, title);
    const char *sep = "";
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        if (cJSON_IsNumber(it) && it->valuedouble != 0) {
            fprintf(out, "%s%s %.0f", sep, it->string, it->valuedouble);
            sep = ", ";
        }
    }
    fprintf(out, "%s\n", *sep ? "" : "none");
}

static void print_runs(FILE *out, const cJSON *root, double now);

/* The cells of one worker: LOCAL RANK PID STATE EXIT RESTARTS STEP EPOCH LOSS
 * SAMPLES/S LAST-PROGRESS [BAR]. Returns the number of cells. */
#define WORKER_CELLS 12
struct worker_cells {
    char c[WORKER_CELLS][CELL];
    const char *p[WORKER_CELLS];
};

static bool workers_have_bar(const struct options *o, const cJSON *workers)
{
    const cJSON *w;
    cJSON_ArrayForEach(w, workers)
    {
        if (total_steps(o, field(w, "progress")) > 0)
            return true;
    }
    return false;
}

static size_t worker_row(const struct options *o, const cJSON *w, bool bar, struct worker_cells *wc)
{
    double v;
    const cJSON *p = field(w, "progress");
    wc->p[0] = fmt_num(w, "local_rank", "%.0f", wc->c[0], CELL);
    wc->p[1] = fmt_num(w, "rank", "%.0f", wc->c[1], CELL);
    wc->p[2] = fmt_num(w, "pid", "%.0f", wc->c[2], CELL);
    wc->p[3] = str(w, "state", "-");
    wc->p[4] = "-";
    if (num(w, "exit_code", &v)) {
        snprintf(wc->c[4], CELL, "%.0f", v);
        wc->p[4] = wc->c[4];
    } else if (str(w, "signal_name", NULL)) {
        wc->p[4] = str(w, "signal_name", "-");
    }
    wc->p[5] = fmt_num(w, "restarts", "%.0f", wc->c[5], CELL);
    wc->p[6] = fmt_num(p, "step", "%.0f", wc->c[6], CELL);
    wc->p[7] = fmt_num(p, "epoch", "%.0f", wc->c[7], CELL);
    wc->p[8] = fmt_num(p, "loss", "%.4g", wc->c[8], CELL);
    wc->p[9] = fmt_num(p, "samples_per_s", "%.1f", wc->c[9], CELL);
    wc->p[10] = "never";
    double malformed = 0;
    num(p, "malformed", &malformed);
    if (cJSON_IsObject(p)) {
        double age;
        if (num(p, "age_s", &age)) {
            char dur[32];
            fmt_duration(age, dur, sizeof(dur));
            snprintf(wc->c[10], CELL, "%s ago", dur);
            wc->p[10] = wc->c[10];
        }
        if (malformed > 0) {
            char tmp[CELL + 32];
            snprintf(tmp, sizeof(tmp), "%s (%.0f malformed)", wc->p[10], malformed);
            cddp_strlcpy(wc->c[10], tmp, CELL);
            wc->p[10] = wc->c[10];
        }
    }
    if (!bar)
        return 11;
    double total = total_steps(o, p), step;
    wc->p[11] = "";
    if (total > 0 && num(p, "step", &step)) {
        fmt_bar(step, total, wc->c[11], CELL);
        wc->p[11] = wc->c[11];
    }
    return 12;
}

static const char *const worker_titles[WORKER_CELLS] = {
    "LOCAL", "RANK",  "PID",  "STATE",     "EXIT",          "RESTARTS",
    "STEP",  "EPOCH", "LOSS", "SAMPLES/S", "LAST PROGRESS", "PROGRESS"};

static void print_agent(const struct options *o, FILE *out, const cJSON *root)
{
    double now = 0, v;
    num(root, "generated_at", &now);
    print_header(out, root);
    char a[64], b[64], c[64], d[64], e[64];
    fprintf(out, "%-10s%s\n", "run", str(root, "run_id", "-"));
    fprintf(out, "%-10s%s (%s)\n", "state", str(root, "state", "-"),
            cJSON_IsTrue(field(root, "ready")) ? "ready" : "not ready");
    fprintf(out, "%-10snode %s of %s, round %s, world size %s (%s local)\n", "group",
            fmt_num(root, "node_rank", "%.0f", a, sizeof(a)),
            fmt_num(root, "nnodes", "%.0f", b, sizeof(b)),
            fmt_num(root, "round", "%.0f", c, sizeof(c)),
            fmt_num(root, "world_size", "%.0f", d, sizeof(d)),
            fmt_num(root, "local_world_size", "%.0f", e, sizeof(e)));
    const cJSON *rdzv = field(root, "rdzv");
    char took[32] = "-";
    if (num(root, "last_round_duration_s", &v))
        fmt_duration(v, took, sizeof(took));
    char master[300] = "-";
    if (num(rdzv, "master_port", &v))
        snprintf(master, sizeof(master), "%s:%.0f", str(rdzv, "master_addr", "?"), v);
    fprintf(out, "%-10s%s %s, master %s, last round took %s, %s waiting", "rdzv",
            str(rdzv, "backend", "-"), str(rdzv, "endpoint", "-"), master, took,
            fmt_num(root, "waiting_nodes", "%.0f", a, sizeof(a)));
    if (cJSON_IsFalse(field(rdzv, "connected")))
        fprintf(out, ", DISCONNECTED %s, reconnecting",
                fmt_ago(rdzv, "disconnected_at", now, b, sizeof(b)));
    if (num(rdzv, "reconnects", &v) && v > 0)
        fprintf(out, ", %.0f reconnect%s", v, v == 1 ? "" : "s");
    fprintf(out, "\n");
    const cJSON *hosted = field(root, "rdzv_server");
    if (cJSON_IsObject(hosted))
        fprintf(out, "%-10sthe rendezvous server, on %s: %s connections, %s joins, %s rounds\n",
                "hosting", str(hosted, "endpoint", "-"),
                fmt_num(hosted, "connections", "%.0f", b, sizeof(b)),
                fmt_num(hosted, "joins_total", "%.0f", c, sizeof(c)),
                fmt_num(hosted, "rounds_total", "%.0f", d, sizeof(d)));
    const cJSON *rs = field(root, "restarts");
    fprintf(out, "%-10s%s of %s", "restarts", fmt_num(rs, "count", "%.0f", a, sizeof(a)),
            fmt_num(rs, "max", "%.0f", b, sizeof(b)));
    const cJSON *by = field(rs, "by_reason");
    double mc;
    if (num(by, "membership_change", &mc) && mc > 0)
        fprintf(out, " (and %.0f for membership changes)", mc);
    fprintf(out, "\n");
    print_counts(out, 10, "exits", field(root, "worker_exits"));

    const cJSON *workers = field(root, "workers");
    if (cJSON_IsArray(workers) && cJSON_GetArraySize(workers) > 0) {
        fprintf(out, "\n");
        bool bar = workers_have_bar(o, workers);
        struct table t = {0};
        table_rowv(&t, bar ? 12 : 11, worker_titles);
        const cJSON *w;
        cJSON_ArrayForEach(w, workers)
        {
            struct worker_cells wc;
            size_t n = worker_row(o, w, bar, &wc);
            table_rowv(&t, n, wc.p);
        }
        table_print(&t, out);
    }
    if (cJSON_IsObject(hosted))
        print_runs(out, hosted, now);
}

/* The runs of a rendezvous server (cddp-rdzv's, or the one an agent hosts),
 * then their nodes. */
static void print_runs(FILE *out, const cJSON *root, double now)
{
    const cJSON *runs = field(root, "runs");
    fprintf(out, "\n");
    if (!cJSON_IsArray(runs) || cJSON_GetArraySize(runs) == 0) {
        fprintf(out, "no runs\n");
        return;
    }
    struct table t = {0};
    table_row(&t, 7, "RUN", "STATE", "ROUND", "NODES", "MIN:MAX", "WAITING", "LAST ROUND");
    const cJSON *r;
    cJSON_ArrayForEach(r, runs)
    {
        char round[32], nodes[16], mm[40], waiting[16], last[64], mn[16], mx[16];
        snprintf(nodes, sizeof(nodes), "%d", cJSON_GetArraySize(field(r, "members")));
        snprintf(waiting, sizeof(waiting), "%d", cJSON_GetArraySize(field(r, "waiting")));
        snprintf(mm, sizeof(mm), "%s:%s", fmt_num(r, "min_nodes", "%.0f", mn, sizeof(mn)),
                 fmt_num(r, "max_nodes", "%.0f", mx, sizeof(mx)));
        table_row(&t, 7, str(r, "run_id", "-"), str(r, "state", "-"),
                  fmt_num(r, "round", "%.0f", round, sizeof(round)), nodes, mm, waiting,
                  fmt_ago(r, "last_round_at", now, last, sizeof(last)));
    }
    table_print(&t, out);

    fprintf(out, "\n");
    table_row(&t, 6, "RUN", "NODE", "RANK", "NPROC", "JOINED", "LAST SEEN");
    cJSON_ArrayForEach(r, runs)
    {
        static const char *const lists[] = {"members", "waiting"};
        for (int l = 0; l < 2; l++) {
            const cJSON *n;
            cJSON_ArrayForEach(n, field(r, lists[l]))
            {
                char rank[16], nproc[16], joined[64], seen[64];
                const char *rank_s =
                    l == 1 ? "waiting" : fmt_num(n, "node_rank", "%.0f", rank, sizeof(rank));
                table_row(&t, 6, str(r, "run_id", "-"), str(n, "node", "-"), rank_s,
                          fmt_num(n, "nproc", "%.0f", nproc, sizeof(nproc)),
                          fmt_ago(n, "joined_at", now, joined, sizeof(joined)),
                          fmt_ago(n, "last_seen_at", now, seen, sizeof(seen)));
            }
        }
    }
    if (t.nrows > 1)
        table_print(&t, out);
    else
        free(t.cells);
}

static void print_rdzv(FILE *out, const cJSON *root)
{
    double now = 0;
    num(root, "generated_at", &now);
    print_header(out, root);
    char a[64], b[64];
    fprintf(out, "%-12s%s (%s)\n", "endpoint", str(root, "endpoint", "-"),
            cJSON_IsTrue(field(root, "ready")) ? "accepting agents" : "not accepting agents");
    fprintf(out, "%-12s%s open, %s total\n", "connections",
            fmt_num(root, "connections", "%.0f", a, sizeof(a)),
            fmt_num(root, "connections_total", "%.0f", b, sizeof(b)));
    print_counts(out, 12, "refused", field(root, "refused_connections"));
    fprintf(out, "%-12s%s joins, %s rounds\n", "totals",
            fmt_num(root, "joins_total", "%.0f", a, 32),
            fmt_num(root, "rounds_total", "%.0f", b, 32));
    print_runs(out, root, now);
}

/* ---- status ------------------------------------------------------------ */

static int cmd_status(const struct options *o, struct frame_ctx *f)
{
    int rc;
    struct cddp_buf raw = {0};
    cJSON *root = fetch_status(o->base, o->shown, o->timeout_s, f, &rc, &raw);
    if (root == NULL)
        return rc;
    cddp_strlcpy(f->state, str(root, "state", ""), sizeof(f->state));
    if (o->json) {
        /* Exactly as served: one line (the server writes it compact). */
        fwrite(raw.data, 1, raw.len, f->out);
        if (raw.len == 0 || raw.data[raw.len - 1] != '\n')
            fputc('\n', f->out);
    } else {
        const char *kind = str(root, "kind", "");
        if (strcmp(kind, "agent") == 0) {
            print_agent(o, f->out, root);
        } else if (strcmp(kind, "rdzv") == 0) {
            print_rdzv(f->out, root);
        } else {
            /* A newer or unknown server: show what it said. */
            char *pretty = cJSON_Print(root);
            fprintf(f->out, "%s\n", pretty ? pretty : "");
            cJSON_free(pretty);
        }
    }
    cJSON_Delete(root);
    cddp_buf_free(&raw);
    return 0;
}

/* ---- job: a run through its rendezvous server --------------------------- */

/* The host a node id names. cddprun's agents join as "HOST_PID_0", or
 * "rNNNNNNN_HOST_PID" with a fixed node rank (agent/rdzv_c10d.c); other
 * clients as "HOST:PORT". False when the id has none of these shapes. */
static bool node_host(const char *node, char *host, size_t len)
{
    struct cddp_hostport hp;
    char err[64];
    if (strchr(node, '_') == NULL) {
        if (cddp_hostport_parse(node, -1, &hp, err, sizeof(err)) != 0 || !hp.has_port)
            return false;
        cddp_strlcpy(host, hp.host, len);
        return host[0] != '\0';
    }
    const char *b = node, *e = node + strlen(node);
    if (b[0] == 'r' && strspn(b + 1, "0123456789") == 7 && b[8] == '_') {
        b += 9; /* rNNNNNNN_HOST_PID */
    } else {
        /* HOST_PID_0: drop the last field. */
        const char *u = strrchr(b, '_');
        if (u == NULL || u[1] == '\0' || strspn(u + 1, "0123456789") != strlen(u + 1))
            return false;
        e = u;
    }
    const char *u = e;
    while (u > b && u[-1] != '_')
        u--;
    if (u <= b + 1 || u == e || strspn(u, "0123456789") != (size_t)(e - u))
        return false; /* no "_PID" */
    size_t n = (size_t)(u - 1 - b);
    if (n + 1 > len)
        return false;
    memcpy(host, b, n);
    host[n] = '\0';
    return true;
}

struct job_node {
    const cJSON *node; /* in the server's run */
    bool waiting;
    char agent[300]; /* HOST:PORT of its agent, "" when not asked */
    char url[400];
    struct reply reply;
    cJSON *status; /* the agent's /status, or NULL */
    char error[512];
};

/* The run in a server's /status (cddp-rdzv's, or the one a hosting agent
 * serves under rdzv_server); NULL with a message when it is not there. */
static const cJSON *find_run(const cJSON *root, const char *run_id, char *msg, size_t len)
{
    const cJSON *runs = field(root, "runs");
    if (strcmp(str(root, "kind", ""), "agent") == 0) {
        const cJSON *hosted = field(root, "rdzv_server");
        if (!cJSON_IsObject(hosted)) {
            snprintf(msg, len,
                     "this is an agent that does not host the rendezvous server: give the "
                     "status port of cddp-rdzv or of the hosting agent");
            return NULL;
        }
        runs = field(hosted, "runs");
    }
    const cJSON *r;
    size_t n = (size_t)snprintf(msg, len, "no run '%s' on it (runs:", run_id);
    int count = 0;
    cJSON_ArrayForEach(r, runs)
    {
        if (strcmp(str(r, "run_id", ""), run_id) == 0)
            return r;
        if (n < len)
            n += (size_t)snprintf(msg + n, len - n, " %s", str(r, "run_id", "?"));
        count++;
    }
    if (n < len)
        snprintf(msg + n, len - n, "%s)", count ? "" : " none");
    return NULL;
}

/* Asks every node's agent for its /status at once (curl multi). */
static void job_fetch_agents(const struct options *o, struct job_node *nodes, size_t n)
{
    CURLM *m = curl_multi_init();
    if (m == NULL) {
        for (size_t i = 0; i < n; i++)
            if (nodes[i].agent[0])
                snprintf(nodes[i].error, sizeof(nodes[i].error), "cannot start libcurl");
        return;
    }
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)JOB_PARALLEL);
    for (size_t i = 0; i < n; i++) {
        struct job_node *jn = &nodes[i];
        if (!jn->agent[0])
            continue;
        snprintf(jn->url, sizeof(jn->url), "http://%s/status", jn->agent);
        CURL *c = handle_new(jn->url, o->timeout_s, &jn->reply);
        if (c == NULL || curl_multi_add_handle(m, c) != CURLM_OK) {
            snprintf(jn->error, sizeof(jn->error), "cannot start libcurl");
            curl_easy_cleanup(c);
            jn->agent[0] = '\0';
        }
    }
    int running = 1;
    while (running) {
        if (curl_multi_perform(m, &running) != CURLM_OK)
            break;
        if (running)
            curl_multi_poll(m, NULL, 0, 200, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)) != NULL) {
        if (msg->msg != CURLMSG_DONE)
            continue;
        struct reply *r = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        handle_done(msg->easy_handle, msg->data.result, r);
        curl_multi_remove_handle(m, msg->easy_handle);
        curl_easy_cleanup(msg->easy_handle);
    }
    curl_multi_cleanup(m);
    for (size_t i = 0; i < n; i++) {
        struct job_node *jn = &nodes[i];
        if (!jn->agent[0])
            continue;
        struct reply *r = &jn->reply;
        if (r->rc != CURLE_OK) {
            transfer_error(r, jn->url, jn->agent, o->timeout_s, jn->error, sizeof(jn->error));
        } else if (r->code != 200) {
            snprintf(jn->error, sizeof(jn->error), "%s answered HTTP %ld", jn->url, r->code);
        } else {
            jn->status = cJSON_ParseWithLength(r->body.data, r->body.len);
            if (!cJSON_IsObject(jn->status) || strcmp(str(jn->status, "kind", ""), "agent") != 0) {
                snprintf(jn->error, sizeof(jn->error), "%s is not a cddprun status port",
                         jn->agent);
                cJSON_Delete(jn->status);
                jn->status = NULL;
            }
        }
        cddp_buf_free(&r->body);
    }
}

/* job --json: {"run_id", "rdzv", "state", "round", "min_nodes", "max_nodes",
 * "nodes": [{"node", "state", "node_rank", "nproc", "joined_at",
 * "last_seen_at", "waiting", "agent", "agent_error", "status"}]}. */
static void job_json(FILE *out, const struct options *o, const cJSON *run,
                     const struct job_node *nodes, size_t n)
{
    cJSON *j = cJSON_CreateObject();
    double v;
    cJSON_AddStringToObject(j, "run_id", o->pos[1]);
    cJSON_AddStringToObject(j, "rdzv", o->shown);
    cJSON_AddStringToObject(j, "state", str(run, "state", ""));
    static const char *const nums[] = {"round", "min_nodes", "max_nodes", "last_round_at"};
    for (size_t k = 0; k < 4; k++) {
        if (num(run, nums[k], &v))
            cJSON_AddNumberToObject(j, nums[k], v);
        else
            cJSON_AddNullToObject(j, nums[k]);
    }
    cJSON *arr = cJSON_AddArrayToObject(j, "nodes");
    for (size_t i = 0; i < n; i++) {
        const struct job_node *jn = &nodes[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "node", str(jn->node, "node", ""));
        cJSON_AddStringToObject(e, "state", str(jn->node, "state", jn->waiting ? "waiting" : ""));
        static const char *const nkeys[] = {"node_rank", "nproc", "joined_at", "last_seen_at"};
        for (size_t k = 0; k < 4; k++) {
            if (num(jn->node, nkeys[k], &v))
                cJSON_AddNumberToObject(e, nkeys[k], v);
            else
                cJSON_AddNullToObject(e, nkeys[k]);
        }
        cJSON_AddBoolToObject(e, "waiting", jn->waiting);
        if (jn->agent[0])
            cJSON_AddStringToObject(e, "agent", jn->agent);
        else
            cJSON_AddNullToObject(e, "agent");
        if (jn->error[0])
            cJSON_AddStringToObject(e, "agent_error", jn->error);
        else
            cJSON_AddNullToObject(e, "agent_error");
        if (jn->status)
            cJSON_AddItemToObject(e, "status", cJSON_Duplicate(jn->status, true));
        else
            cJSON_AddNullToObject(e, "status");
        cJSON_AddItemToArray(arr, e);
    }
    char *text = cJSON_PrintUnformatted(j);
    fprintf(out, "%s\n", text ? text : "{}");
    cJSON_free(text);
    cJSON_Delete(j);
}

static void job_table(FILE *out, const struct options *o, const cJSON *root, const cJSON *run,
                      const struct job_node *nodes, size_t n)
{
    double now = 0;
    num(root, "generated_at", &now);
    char a[64], b[64], c[64], last[64];
    fprintf(out, "run %s on %s: %s, round %s, %zu node%s (min:max %s:%s), last round %s\n",
            o->pos[1], o->shown, str(run, "state", "-"), fmt_num(run, "round", "%.0f", a, 64), n,
            n == 1 ? "" : "s", fmt_num(run, "min_nodes", "%.0f", b, 64),
            fmt_num(run, "max_nodes", "%.0f", c, 64),
            fmt_ago(run, "last_round_at", now, last, sizeof(last)));
    if (n == 0)
        return;
    fprintf(out, "\n");
    struct table t = {0};
    table_row(&t, 7, "NODE", "STATE", "RANK", "NPROC", "JOINED", "LAST SEEN", "AGENT");
    for (size_t i = 0; i < n; i++) {
        const struct job_node *jn = &nodes[i];
        char rank[16], nproc[16], joined[64], seen[64], agent[CELL];
        const char *agent_s = "-";
        if (jn->agent[0]) {
            if (jn->status)
                snprintf(agent, sizeof(agent), "%.40s %.20s", jn->agent,
                         str(jn->status, "state", "?"));
            else
                snprintf(agent, sizeof(agent), "%.50s unreachable", jn->agent);
            agent_s = agent;
        }
        table_row(&t, 7, str(jn->node, "node", "-"),
                  jn->waiting ? "waiting" : str(jn->node, "state", "-"),
                  jn->waiting ? "-" : fmt_num(jn->node, "node_rank", "%.0f", rank, sizeof(rank)),
                  fmt_num(jn->node, "nproc", "%.0f", nproc, sizeof(nproc)),
                  fmt_ago(jn->node, "joined_at", now, joined, sizeof(joined)),
                  fmt_ago(jn->node, "last_seen_at", now, seen, sizeof(seen)), agent_s);
    }
    table_print(&t, out);
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any = any || nodes[i].agent[0] || nodes[i].error[0];
    if (!any) {
        fprintf(out, "\n(no agent of this run told the rendezvous server a status port: "
                     "--agent-port PORT asks each node's agent on that port for its workers)\n");
        return;
    }
    /* Every worker of the job, node by node; NODE replaces LOCAL's place. */
    bool bar = false;
    for (size_t i = 0; i < n; i++)
        if (nodes[i].status && workers_have_bar(o, field(nodes[i].status, "workers")))
            bar = true;
    fprintf(out, "\n");
    /* NODE RANK LOCAL PID STATE EXIT RESTARTS STEP LOSS SAMPLES/S LAST [BAR]:
     * EPOCH is left out to stay within the table's 12 columns. */
    static const int pick[] = {1, 0, 2, 3, 4, 5, 6, 8, 9, 10, 11};
    const char *row[MAX_COLS];
    size_t ncols = bar ? 12 : 11;
    row[0] = "NODE";
    for (size_t k = 0; k + 1 < ncols; k++)
        row[k + 1] = worker_titles[pick[k]];
    table_rowv(&t, ncols, row);
    for (size_t i = 0; i < n; i++) {
        const struct job_node *jn = &nodes[i];
        char host[CELL];
        cddp_strlcpy(host, jn->agent[0] ? jn->agent : str(jn->node, "node", "-"), sizeof(host));
        if (jn->status == NULL) {
            /* Its error is listed under the table. */
            const char *cells[MAX_COLS];
            for (size_t k = 0; k < ncols; k++)
                cells[k] = "-";
            cells[0] = host;
            cells[4] = "unknown";
            table_rowv(&t, ncols, cells);
            continue;
        }
        const cJSON *w;
        cJSON_ArrayForEach(w, field(jn->status, "workers"))
        {
            struct worker_cells wc;
            worker_row(o, w, bar, &wc);
            row[0] = host;
            for (size_t k = 0; k + 1 < ncols; k++)
                row[k + 1] = wc.p[pick[k]];
            table_rowv(&t, ncols, row);
        }
    }
    table_print(&t, out);
    for (size_t i = 0; i < n; i++)
        if (nodes[i].status == NULL && nodes[i].error[0])
            fprintf(out, "%s: %s\n", str(nodes[i].node, "node", "-"), nodes[i].error);
}

static int cmd_job(const struct options *o, struct frame_ctx *f)
{
    int rc;
    cJSON *root = fetch_status(o->base, o->shown, o->timeout_s, f, &rc, NULL);
    if (root == NULL)
        return rc;
    char msg[512];
    const cJSON *run = find_run(root, o->pos[1], msg, sizeof(msg));
    if (run == NULL) {
        if (f->quiet)
            snprintf(f->errmsg, sizeof(f->errmsg), "%.200s: %.300s", o->shown, msg);
        else
            log_error("K2003", "%s: %s", o->shown, msg);
        cJSON_Delete(root);
        return CTL_NO_RUN;
    }
    cddp_strlcpy(f->state, str(run, "state", ""), sizeof(f->state));
    size_t n = (size_t)cJSON_GetArraySize(field(run, "members")) +
               (size_t)cJSON_GetArraySize(field(run, "waiting"));
    struct job_node *nodes = calloc(n ? n : 1, sizeof(*nodes));
    if (nodes == NULL) {
        log_error("K2004", "out of memory listing %zu nodes", n);
        cJSON_Delete(root);
        return CDDP_EXIT_FAILURE;
    }
    size_t i = 0, asked = 0;
    static const char *const lists[] = {"members", "waiting"};
    for (int l = 0; l < 2; l++) {
        const cJSON *nd;
        cJSON_ArrayForEach(nd, field(run, lists[l]))
        {
            struct job_node *jn = &nodes[i++];
            jn->node = nd;
            jn->waiting = l == 1;
            char host[256];
            /* --agent-port, else the status port the agent told the
             * server when it joined (cddprun with --status_port). */
            double told = 0;
            int port = o->agent_port;
            if (port == 0 && num(nd, "status_port", &told) && told >= 1 && told <= 65535)
                port = (int)told;
            if (port == 0)
                continue;
            asked++;
            /* A told port is the agent's own: reach it where its
             * connection to the server comes from (the node id's host
             * name need not resolve); --agent-port keeps the node id's. */
            const char *addr = str(nd, "addr", "");
            if (o->agent_port == 0 && addr[0])
                cddp_hostport_format(addr, port, jn->agent, sizeof(jn->agent));
            else if (node_host(str(nd, "node", ""), host, sizeof(host)))
                cddp_hostport_format(host, port, jn->agent, sizeof(jn->agent));
            else
                snprintf(jn->error, sizeof(jn->error), "no host name in the node id");
        }
    }
    if (asked)
        job_fetch_agents(o, nodes, n);
    if (o->json)
        job_json(f->out, o, run, nodes, n);
    else
        job_table(f->out, o, root, run, nodes, n);
    for (i = 0; i < n; i++)
        cJSON_Delete(nodes[i].status);
    free(nodes);
    cJSON_Delete(root);
    return 0;
}

/* ---- --watch ------------------------------------------------------------ */

/* Terminal size of stdout; 0 when unknown. */
static void term_size(int *cols, int *rows)
{
    struct winsize ws;
    *cols = *rows = 0;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row;
    }
}

/* A frame on the terminal: from the top left, every line cut to the width
 * and cleared to its end, the rest of the screen cleared; lines past the
 * screen's height are left out (so nothing scrolls). */
static void draw_tty(const char *frame, size_t len)
{
    int cols, rows;
    term_size(&cols, &rows);
    fputs("\033[H", stdout);
    int row = 0;
    for (const char *p = frame; p < frame + len && (rows == 0 || row < rows - 1); row++) {
        const char *nl = memchr(p, '\n', (size_t)(frame + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(frame + len - p);
        size_t shown = cols > 0 && n > (size_t)cols ? (size_t)cols : n;
        fwrite(p, 1, shown, stdout);
        fputs("\033[K\n", stdout);
        p = nl ? nl + 1 : frame + len;
    }
    fputs("\033[J", stdout);
}

/* Writes one frame: on a terminal in place under a header line (the
 * frame returned has the header, for the last screen), otherwise after a
 * "--- time target" line (none with --json). Takes buf; returns the frame
 * kept as the last one. */
static char *emit_frame(const struct options *o, bool tty, long snapshots, char *buf, size_t *len)
{
    time_t now = time(NULL);
    struct tm tm;
    char when[32];
    localtime_r(&now, &tm);
    if (tty) {
        char head[512];
        strftime(when, sizeof(when), "%H:%M:%S", &tm);
        int hn = snprintf(head, sizeof(head), "every %gs: cddpctl %s %s%s%.200s   %s\n\n",
                          o->interval_s, o->cmd->name, o->shown, o->npos > 1 ? " " : "",
                          o->npos > 1 ? o->pos[1] : "", when);
        if (hn < 0 || (size_t)hn >= sizeof(head))
            hn = (int)strlen(head);
        char *framed = NULL;
        size_t flen = 0;
        FILE *fm = open_memstream(&framed, &flen);
        if (fm) {
            fwrite(head, 1, (size_t)hn, fm);
            fwrite(buf, 1, *len, fm);
            fclose(fm);
            free(buf);
            buf = framed;
            *len = flen;
        }
        draw_tty(buf, *len);
        return buf;
    }
    if (!o->json) {
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        printf("%s--- %s %s\n", snapshots > 1 ? "\n" : "", when, o->shown);
    }
    fwrite(buf, 1, *len, stdout);
    return buf;
}

static int watch(const struct options *o)
{
    bool tty = isatty(STDOUT_FILENO) && !o->json;
    catch_stop_signals();
    if (tty)
        fputs("\033[?1049h\033[?25l", stdout); /* the alternate screen, no cursor */
    char *last = NULL;
    size_t last_len = 0;
    char last_state[32] = "";
    long snapshots = 0;
    int timeouts = 0, rc = 0;
    enum { RUNNING, INTERRUPTED, GONE, COUNTED, CLOSED_OUT } why = RUNNING;
    char gone[512] = "";
    while (why == RUNNING) {
        uint64_t t0 = cddp_mono_ms();
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len);
        if (mem == NULL) {
            log_error("K2004", "out of memory for a frame");
            rc = CDDP_EXIT_FAILURE;
            break;
        }
        struct frame_ctx f = {.out = mem, .quiet = snapshots > 0};
        int frc = o->cmd->frame(o, &f);
        fclose(mem);
        if (stop_signal) {
            free(buf);
            why = INTERRUPTED;
            break;
        }
        if (frc && snapshots == 0) {
            /* Nothing to watch: the error is logged, as without --watch. */
            free(buf);
            rc = frc == CTL_NO_RUN ? CDDP_EXIT_FAILURE : frc;
            break;
        }
        if (frc == CTL_EXIT_UNREACHABLE && f.timed_out && ++timeouts < WATCH_TIMEOUTS) {
            /* Keep the last frame; say so under it. */
            free(buf);
            buf = NULL;
            if (tty) {
                fputs("\033[J", stdout);
                printf("\r(%s; trying again)", f.errmsg);
            }
        } else if (frc == CTL_EXIT_UNREACHABLE || frc == CTL_NO_RUN) {
            free(buf);
            buf = NULL;
            cddp_strlcpy(gone, f.errmsg, sizeof(gone));
            why = GONE;
            break;
        } else {
            if (frc == 0)
                timeouts = 0;
            if (frc) {
                /* An answer that is not a status (HTTP 503 while the
                 * program starts): shown as the frame (with --json, not
                 * on stdout: it would not be JSON), and watched on. */
                free(buf);
                buf = NULL;
                len = 0;
                mem = o->json ? NULL : open_memstream(&buf, &len);
                if (mem) {
                    fprintf(mem, "%s\n", f.errmsg);
                    fclose(mem);
                }
            } else {
                cddp_strlcpy(last_state, f.state, sizeof(last_state));
            }
            snapshots++;
            if (buf)
                buf = emit_frame(o, tty, snapshots, buf, &len);
            if (buf) {
                free(last);
                last = buf;
                last_len = len;
            }
        }
        if (fflush(stdout) != 0 || ferror(stdout)) {
            why = CLOSED_OUT;
            break;
        }
        if (o->count && snapshots >= o->count) {
            why = COUNTED;
            break;
        }
        /* Until the next snapshot is due; a signal ends the sleep. */
        uint64_t spent = cddp_mono_ms() - t0;
        uint64_t due = (uint64_t)(o->interval_s * 1000.0);
        if (spent < due) {
            uint64_t ms = due - spent;
            struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (stop_signal)
            why = INTERRUPTED;
    }
    if (tty) {
        /* Back to the normal screen, with the last frame left on it. */
        fputs("\033[?25h\033[?1049l", stdout);
        if (last)
            fwrite(last, 1, last_len, stdout);
    }
    fflush(stdout);
    free(last);
    if (why == INTERRUPTED) {
        log_warn("K2001", "stopped watching %s after %ld snapshot%s (%s)", o->shown, snapshots,
                 snapshots == 1 ? "" : "s", strsignal(stop_signal));
        rc = 0;
    } else if (why == GONE) {
        bool ok = strcmp(last_state, "succeeded") == 0;
        log_warn("K2002", "%s went away (%s); last state %s%s", o->shown, gone,
                 last_state[0] ? last_state : "unknown",
                 ok ? ""
                    : ": the outcome is not known (--status_linger keeps the final status "
                      "served)");
        rc = ok ? 0 : CDDP_EXIT_FAILURE;
    }
    return rc;
}

/* ---- health ------------------------------------------------------------ */

/* health --json: {"target", "endpoint", "ok", "http_status", "checks":
 * [{"name", "ok", "reason"}]} from the ?verbose list ("[+]loop ok",
 * "[-]workers failed: why"). */
static void print_health_json(const char *shown, const char *endpoint, const struct reply *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "target", shown);
    cJSON_AddStringToObject(o, "endpoint", endpoint);
    cJSON_AddBoolToObject(o, "ok", r->code == 200);
    cJSON_AddNumberToObject(o, "http_status", (double)r->code);
    cJSON *checks = cJSON_AddArrayToObject(o, "checks");
    for (const char *line = r->body.data; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if (n > 3 && line[0] == '[' && (line[1] == '+' || line[1] == '-') && line[2] == ']') {
            char text[1024];
            snprintf(text, sizeof(text), "%.*s", (int)(n - 3), line + 3);
            bool ok = line[1] == '+';
            char *sp = strchr(text, ' ');
            const char *reason = NULL;
            if (sp) {
                *sp = '\0';
                reason = sp + 1;
                if (strncmp(reason, "failed: ", 8) == 0)
                    reason += 8;
            }
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "name", text);
            cJSON_AddBoolToObject(c, "ok", ok);
            if (ok || reason == NULL)
                cJSON_AddNullToObject(c, "reason");
            else
                cJSON_AddStringToObject(c, "reason", reason);
            cJSON_AddItemToArray(checks, c);
        }
        line = nl ? nl + 1 : NULL;
    }
    char *text = cJSON_PrintUnformatted(o);
    printf("%s\n", text ? text : "{}");
    cJSON_free(text);
    cJSON_Delete(o);
}

static int cmd_health(const struct options *o)
{
    char url[2100];
    const char *endpoint = o->live ? "/livez" : "/readyz";
    snprintf(url, sizeof(url), "%s%s?verbose", o->base, endpoint);
    struct reply r = {0};
    int rc = fetch(url, o->shown, o->timeout_s, &r);
    if (rc) {
        cddp_buf_free(&r.body);
        return rc;
    }
    const char *what = o->live ? "alive" : "ready";
    if (o->json) {
        print_health_json(o->shown, endpoint, &r);
        if (r.code != 200)
            rc = CDDP_EXIT_FAILURE;
    } else if (r.code == 200) {
        printf("%s %s\n", o->shown, what);
        if (o->verbose)
            fwrite(r.body.data, 1, r.body.len, stdout);
    } else {
        printf("%s not %s (HTTP %ld)\n", o->shown, what, r.code);
        /* The failed checks, or everything with --verbose. */
        for (char *line = r.body.data; line && *line;) {
            char *nl = strchr(line, '\n');
            size_t n = nl ? (size_t)(nl - line) : strlen(line);
            if (o->verbose || strncmp(line, "[-]", 3) == 0)
                printf("  %.*s\n", (int)n, line);
            line = nl ? nl + 1 : NULL;
        }
        rc = CDDP_EXIT_FAILURE;
    }
    cddp_buf_free(&r.body);
    return rc;
}

/* ---- stacks ---------------------------------------------------------- */

/* cddpctl stacks HOST:PORT [--timeout SECONDS]: POST /stacks asks cddprun
 * for a capture of every running worker's stacks (docs/status.md), then
 * GET /stacks until that capture is served; prints it. */
static int cmd_stacks(const struct options *o)
{
    double timeout_s = o->timeout_given ? o->timeout_s : 15;
    char url[2100];
    snprintf(url, sizeof(url), "%s/stacks", o->base);
    struct reply r = {0};
    int rc = request(url, true, o->shown, timeout_s, &r, NULL);
    long long id = 0;
    if (rc == 0) {
        cJSON *root = cJSON_ParseWithLength(r.body.data, r.body.len);
        const cJSON *cap = cJSON_GetObjectItemCaseSensitive(root, "capture");
        id = r.code == 202 && cJSON_IsNumber(cap) ? (long long)cap->valuedouble : 0;
        if (id <= 0) {
            char ex[96];
            excerpt(&r.body, ex, sizeof(ex));
            log_error("K0010", "%s answered HTTP %ld%s%s", url, r.code, ex[0] ? ": " : "", ex);
            rc = CDDP_EXIT_FAILURE;
        }
        cJSON_Delete(root);
    }
    cddp_buf_free(&r.body);
    /* The capture is bounded on the agent's side (a few seconds); wait for
     * the one asked for, or a later one. */
    double waited = 0;
    while (rc == 0) {
        memset(&r, 0, sizeof(r));
        if ((rc = fetch(url, o->shown, timeout_s, &r)) != 0)
            break;
        long long got = 0;
        if (r.code == 200 && sscanf(r.body.data, "# capture %lld", &got) == 1 && got >= id) {
            fwrite(r.body.data, 1, r.body.len, stdout);
            break;
        }
        cddp_buf_free(&r.body);
        if (waited >= timeout_s) {
            log_error("K0004", "%s did not answer within %gs", o->shown, timeout_s);
            rc = CDDP_EXIT_FAILURE;
            break;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 0.2;
    }
    cddp_buf_free(&r.body);
    return rc;
}

int main(int argc, char **argv)
{
    cddp_log_init("cddpctl");
    struct options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    if ((rc = base_url(o.pos[0], o.base, sizeof(o.base), o.shown, sizeof(o.shown))) != 0)
        return rc;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        log_error("K0002", "cannot start libcurl");
        return CDDP_EXIT_FAILURE;
    }
    if (o.watch) {
        rc = watch(&o);
    } else if (o.cmd->frame) {
        struct frame_ctx f = {.out = stdout};
        rc = o.cmd->frame(&o, &f);
        if (rc == CTL_NO_RUN)
            rc = CDDP_EXIT_FAILURE;
    } else {
        rc = o.cmd->run(&o);
    }
    curl_global_cleanup();
    fflush(stdout);
    return rc;
}
