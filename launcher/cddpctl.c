/*
 * cddpctl: the status client of cddprun's and cddp-rdzv's status port.
 *
 *     cddpctl status HOST:PORT [--json] [--timeout SECONDS]
 *     cddpctl health HOST:PORT [--live] [--verbose] [--timeout SECONDS]
 *
 * status prints a readable table of GET /status (--json: the JSON as
 * served); health asks GET /readyz (--live: /livez) for scripts and exec
 * probes. Exit codes (docs/status.md):
 *
 *     0  status printed / ready (alive with --live)
 *     1  status: the reply was an HTTP error or not JSON; health: not ready
 *     2  unreachable (refused, timed out, no such host), or a usage error
 *
 * HOST:PORT may be "[::1]:8080" or a URL ("http://node:8080"). Every error
 * is one line on stderr that names the address and what went wrong.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/strutil.h"
#include "config.h"

/* health's "cannot tell": the same number as a usage error, on purpose. */
#define CTL_EXIT_UNREACHABLE 2
#define REPLY_MAX ((size_t)64 << 20)

static const char usage_text[] =
    "usage: cddpctl status HOST:PORT [--json] [--timeout SECONDS]\n"
    "       cddpctl health HOST:PORT [--live] [--verbose] [--timeout SECONDS]\n"
    "       cddpctl stacks HOST:PORT [--timeout SECONDS]\n"
    "\n"
    "Asks the status port of cddprun (--status_port) or cddp-rdzv.\n"
    "  status   the node's or the server's status as a table (--json: raw JSON)\n"
    "  health   exit 0 when ready (/readyz), 1 when not, 2 when unreachable;\n"
    "           --live asks /livez instead, --verbose prints every check\n"
    "  stacks   capture every running worker's stacks now (cddprun) and print them\n"
    "  --timeout SECONDS   for the whole request (default 5; stacks: 15)\n"
    "HOST:PORT may also be a URL: http://node:8080\n";

struct options {
    const char *command;
    const char *target;
    bool json;
    bool live;
    bool verbose;
    double timeout_s;
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

static int parse_args(int argc, char **argv, struct options *o)
{
    o->timeout_s = 5.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage_text, stdout);
            exit(CDDP_EXIT_OK);
        } else if (strcmp(a, "--version") == 0) {
            printf("cddpctl %s\n", CDDP_VERSION);
            exit(CDDP_EXIT_OK);
        } else if (strcmp(a, "--json") == 0) {
            o->json = true;
        } else if (strcmp(a, "--live") == 0) {
            o->live = true;
        } else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
            o->verbose = true;
        } else if (strncmp(a, "--timeout", 9) == 0 && (a[9] == '\0' || a[9] == '=')) {
            const char *v = a[9] == '=' ? a + 10 : (i + 1 < argc ? argv[++i] : NULL);
            if (v == NULL)
                return usage_error("--timeout needs a number of seconds");
            if (cddp_parse_double(v, 0.001, 3600, &o->timeout_s) != 0)
                return usage_error("--timeout '%s' is not a number of seconds in (0, 3600]", v);
        } else if (a[0] == '-' && a[1] != '\0') {
            return usage_error("unknown option '%s'", a);
        } else if (o->command == NULL) {
            o->command = a;
        } else if (o->target == NULL) {
            o->target = a;
        } else {
            return usage_error("unexpected argument '%s'", a);
        }
    }
    if (o->command == NULL)
        return usage_error("no command (status or health)");
    if (strcmp(o->command, "status") != 0 && strcmp(o->command, "health") != 0)
        return usage_error("unknown command '%s' (status or health)", o->command);
    if (o->target == NULL)
        return usage_error("no HOST:PORT given");
    if (o->json && strcmp(o->command, "status") != 0)
        return usage_error("--json is an option of status");
    if ((o->live || o->verbose) && strcmp(o->command, "health") != 0)
        return usage_error("--live and --verbose are options of health");
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

/* ---- HTTP ------------------------------------------------------------ */

struct reply {
    long code;
    char ctype[128];
    struct cddp_buf body;
};

static size_t on_body(char *p, size_t size, size_t n, void *userdata)
{
    struct cddp_buf *b = userdata;
    return cddp_buf_append(b, p, size * n) == 0 ? size * n : 0;
}

/* GET base+path. On failure logs one line and returns CTL_EXIT_UNREACHABLE
 * (or 1 when the reply was too large). */
static int fetch(const char *url, const char *shown, double timeout_s, struct reply *r)
{
    char errbuf[CURL_ERROR_SIZE] = "";
    CURL *c = curl_easy_init();
    if (c == NULL) {
        log_error("K0002", "cannot start libcurl");
        return CDDP_EXIT_FAILURE;
    }
    long ms = (long)ceil(timeout_s * 1000.0);
    cddp_buf_init(&r->body, REPLY_MAX);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "cddpctl/" CDDP_VERSION);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r->body);
    CURLcode rc = curl_easy_perform(c);
    int ret = 0;
    if (rc != CURLE_OK) {
        long oserr = 0;
        curl_easy_getinfo(c, CURLINFO_OS_ERRNO, &oserr);
        const char *detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
        ret = CTL_EXIT_UNREACHABLE;
        switch (rc) {
        case CURLE_COULDNT_CONNECT:
            log_error("K0003", "cannot connect to %s: %s", shown,
                      oserr ? cddp_strerror(-(int)oserr) : detail);
            break;
        case CURLE_OPERATION_TIMEDOUT:
            log_error("K0004", "%s did not answer within %gs", shown, timeout_s);
            break;
        case CURLE_COULDNT_RESOLVE_HOST:
            log_error("K0005", "cannot resolve the host of %s", shown);
            break;
        case CURLE_GOT_NOTHING:
            log_error("K0006", "%s closed the connection without a reply", shown);
            break;
        case CURLE_WRITE_ERROR:
            log_error("K0007", "%s: the reply is larger than %zu MiB", url, REPLY_MAX >> 20);
            ret = CDDP_EXIT_FAILURE;
            break;
        default:
            log_error("K0008", "%s: %s", url, detail);
            break;
        }
    } else {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->code);
        char *ct = NULL;
        curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
        cddp_strlcpy(r->ctype, ct ? ct : "", sizeof(r->ctype));
        if (r->body.data == NULL)
            cddp_buf_append(&r->body, "", 0);
    }
    curl_easy_cleanup(c);
    return ret;
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

/* ---- the table ------------------------------------------------------- */

#define MAX_COLS 12
#define CELL 64

struct table {
    size_t ncols, nrows, cap;
    char (*cells)[MAX_COLS][CELL];
};

static void table_row(struct table *t, size_t ncols, ...)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        void *p = realloc(t->cells, cap * sizeof(*t->cells));
        if (p == NULL)
            return;
        t->cells = p;
        t->cap = cap;
    }
    va_list ap;
    va_start(ap, ncols);
    for (size_t i = 0; i < ncols && i < MAX_COLS; i++)
        cddp_strlcpy(t->cells[t->nrows][i], va_arg(ap, const char *), CELL);
    va_end(ap);
    t->ncols = ncols;
    t->nrows++;
}

static void table_print(struct table *t, const char *indent)
{
    size_t width[MAX_COLS] = {0};
    for (size_t r = 0; r < t->nrows; r++)
        for (size_t c = 0; c < t->ncols; c++) {
            size_t w = strlen(t->cells[r][c]);
            if (w > width[c])
                width[c] = w;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        fputs(indent, stdout);
        for (size_t c = 0; c < t->ncols; c++) {
            if (c + 1 == t->ncols)
                printf("%s\n", t->cells[r][c]);
            else
                printf("%-*s  ", (int)width[c], t->cells[r][c]);
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

static void print_header(const cJSON *root)
{
    double pid = 0, up = -1;
    num(root, "pid", &pid);
    num(root, "uptime_s", &up);
    char upbuf[32];
    fmt_duration(up, upbuf, sizeof(upbuf));
    printf("%s %s on %s (pid %.0f), up %s\n", str(root, "program", "?"), str(root, "version", "?"),
           str(root, "hostname", "?"), pid, upbuf);
}

static void print_counts(int width, const char *title, const cJSON *obj)
{
    if (!cJSON_IsObject(obj))
        return;
    printf("%-*s", width, title);
    const char *sep = "";
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        if (cJSON_IsNumber(it) && it->valuedouble != 0) {
            printf("%s%s %.0f", sep, it->string, it->valuedouble);
            sep = ", ";
        }
    }
    printf("%s\n", *sep ? "" : "none");
}

static void print_runs(const cJSON *root, double now);

static void print_agent(const cJSON *root)
{
    double now = 0, v;
    num(root, "generated_at", &now);
    print_header(root);
    char a[64], b[64], c[64], d[64], e[64];
    printf("%-10s%s\n", "run", str(root, "run_id", "-"));
    printf("%-10s%s (%s)\n", "state", str(root, "state", "-"),
           cJSON_IsTrue(field(root, "ready")) ? "ready" : "not ready");
    printf("%-10snode %s of %s, round %s, world size %s (%s local)\n", "group",
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
    printf("%-10s%s %s, master %s, last round took %s, %s waiting", "rdzv",
           str(rdzv, "backend", "-"), str(rdzv, "endpoint", "-"), master, took,
           fmt_num(root, "waiting_nodes", "%.0f", a, sizeof(a)));
    if (cJSON_IsFalse(field(rdzv, "connected")))
        printf(", DISCONNECTED %s, reconnecting",
               fmt_ago(rdzv, "disconnected_at", now, b, sizeof(b)));
    if (num(rdzv, "reconnects", &v) && v > 0)
        printf(", %.0f reconnect%s", v, v == 1 ? "" : "s");
    printf("\n");
    const cJSON *hosted = field(root, "rdzv_server");
    if (cJSON_IsObject(hosted))
        printf("%-10sthe rendezvous server, on %s: %s connections, %s joins, %s rounds\n",
               "hosting", str(hosted, "endpoint", "-"),
               fmt_num(hosted, "connections", "%.0f", b, sizeof(b)),
               fmt_num(hosted, "joins_total", "%.0f", c, sizeof(c)),
               fmt_num(hosted, "rounds_total", "%.0f", d, sizeof(d)));
    const cJSON *rs = field(root, "restarts");
    printf("%-10s%s of %s", "restarts", fmt_num(rs, "count", "%.0f", a, sizeof(a)),
           fmt_num(rs, "max", "%.0f", b, sizeof(b)));
    const cJSON *by = field(rs, "by_reason");
    double mc;
    if (num(by, "membership_change", &mc) && mc > 0)
        printf(" (and %.0f for membership changes)", mc);
    printf("\n");
    print_counts(10, "exits", field(root, "worker_exits"));

    const cJSON *workers = field(root, "workers");
    if (!cJSON_IsArray(workers) || cJSON_GetArraySize(workers) == 0)
        return;
    printf("\n");
    struct table t = {0};
    table_row(&t, 11, "LOCAL", "RANK", "PID", "STATE", "EXIT", "RESTARTS", "STEP", "EPOCH", "LOSS",
              "SAMPLES/S", "LAST PROGRESS");
    const cJSON *w;
    cJSON_ArrayForEach(w, workers)
    {
        char lr[16], rank[16], pid[16], ex[32], rst[16], step[32], ep[16], loss[32], sps[32],
            last[64];
        fmt_num(w, "local_rank", "%.0f", lr, sizeof(lr));
        const char *exit_s = "-";
        if (num(w, "exit_code", &v)) {
            snprintf(ex, sizeof(ex), "%.0f", v);
            exit_s = ex;
        } else if (str(w, "signal_name", NULL)) {
            exit_s = str(w, "signal_name", "-");
        }
        const cJSON *p = field(w, "progress");
        const char *last_s = "never";
        double malformed = 0;
        num(p, "malformed", &malformed);
        if (cJSON_IsObject(p)) {
            double age;
            if (num(p, "age_s", &age)) {
                char dur[32];
                fmt_duration(age, dur, sizeof(dur));
                snprintf(last, sizeof(last), "%s ago", dur);
                last_s = last;
            }
            if (malformed > 0) {
                char tmp[CELL + 32];
                snprintf(tmp, sizeof(tmp), "%s (%.0f malformed)", last_s, malformed);
                cddp_strlcpy(last, tmp, sizeof(last));
                last_s = last;
            }
        }
        table_row(&t, 11, lr, fmt_num(w, "rank", "%.0f", rank, sizeof(rank)),
                  fmt_num(w, "pid", "%.0f", pid, sizeof(pid)), str(w, "state", "-"), exit_s,
                  fmt_num(w, "restarts", "%.0f", rst, sizeof(rst)),
                  fmt_num(p, "step", "%.0f", step, sizeof(step)),
                  fmt_num(p, "epoch", "%.0f", ep, sizeof(ep)),
                  fmt_num(p, "loss", "%.4g", loss, sizeof(loss)),
                  fmt_num(p, "samples_per_s", "%.1f", sps, sizeof(sps)), last_s);
    }
    table_print(&t, "");
    if (cJSON_IsObject(hosted))
        print_runs(hosted, now);
}

/* The runs of a rendezvous server (cddp-rdzv's, or the one an agent hosts),
 * then their nodes. */
static void print_runs(const cJSON *root, double now)
{
    const cJSON *runs = field(root, "runs");
    printf("\n");
    if (!cJSON_IsArray(runs) || cJSON_GetArraySize(runs) == 0) {
        printf("no runs\n");
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
    table_print(&t, "");

    printf("\n");
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
        table_print(&t, "");
    else
        free(t.cells);
}

static void print_rdzv(const cJSON *root)
{
    double now = 0;
    num(root, "generated_at", &now);
    print_header(root);
    char a[64], b[64];
    printf("%-12s%s (%s)\n", "endpoint", str(root, "endpoint", "-"),
           cJSON_IsTrue(field(root, "ready")) ? "accepting agents" : "not accepting agents");
    printf("%-12s%s open, %s total\n", "connections",
           fmt_num(root, "connections", "%.0f", a, sizeof(a)),
           fmt_num(root, "connections_total", "%.0f", b, sizeof(b)));
    print_counts(12, "refused", field(root, "refused_connections"));
    printf("%-12s%s joins, %s rounds\n", "totals", fmt_num(root, "joins_total", "%.0f", a, 32),
           fmt_num(root, "rounds_total", "%.0f", b, 32));
    print_runs(root, now);
}

/* ---- commands -------------------------------------------------------- */

static int cmd_status(const struct options *o, const char *base, const char *shown)
{
    char url[2100];
    snprintf(url, sizeof(url), "%s/status", base);
    struct reply r = {0};
    int rc = fetch(url, shown, o->timeout_s, &r);
    if (rc) {
        cddp_buf_free(&r.body);
        return rc;
    }
    char ex[96];
    excerpt(&r.body, ex, sizeof(ex));
    cJSON *root = cJSON_ParseWithLength(r.body.data, r.body.len);
    if (r.code != 200) {
        const char *msg = root ? str(root, "error", NULL) : NULL;
        log_error("K0010", "%s answered HTTP %ld%s%s", url, r.code, msg || ex[0] ? ": " : "",
                  msg ? msg : ex);
        rc = CDDP_EXIT_FAILURE;
    } else if (!cJSON_IsObject(root)) {
        log_error("K0011",
                  "%s did not answer JSON (Content-Type '%s'): '%s'; is %s a cddp status "
                  "port?",
                  url, r.ctype, ex, shown);
        rc = CDDP_EXIT_FAILURE;
    } else if (o->json) {
        fwrite(r.body.data, 1, r.body.len, stdout);
        if (r.body.len == 0 || r.body.data[r.body.len - 1] != '\n')
            putchar('\n');
    } else {
        const char *kind = str(root, "kind", "");
        if (strcmp(kind, "agent") == 0) {
            print_agent(root);
        } else if (strcmp(kind, "rdzv") == 0) {
            print_rdzv(root);
        } else {
            /* A newer or unknown server: show what it said. */
            char *pretty = cJSON_Print(root);
            printf("%s\n", pretty ? pretty : "");
            cJSON_free(pretty);
        }
    }
    cJSON_Delete(root);
    cddp_buf_free(&r.body);
    return rc;
}

static int cmd_health(const struct options *o, const char *base, const char *shown)
{
    char url[2100];
    snprintf(url, sizeof(url), "%s/%s?verbose", base, o->live ? "livez" : "readyz");
    struct reply r = {0};
    int rc = fetch(url, shown, o->timeout_s, &r);
    if (rc) {
        cddp_buf_free(&r.body);
        return rc;
    }
    const char *what = o->live ? "alive" : "ready";
    if (r.code == 200) {
        printf("%s %s\n", shown, what);
        if (o->verbose)
            fwrite(r.body.data, 1, r.body.len, stdout);
    } else {
        printf("%s not %s (HTTP %ld)\n", shown, what, r.code);
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
 * GET /stacks until that capture is served; prints it. Self-contained: its
 * own arguments, the shared base_url and fetch. */
static int cmd_stacks(int argc, char **argv)
{
    const char *target = NULL;
    double timeout_s = 15;
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        if (strncmp(argv[i], "--timeout=", 10) == 0)
            v = argv[i] + 10;
        else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
            v = argv[++i];
        else if (argv[i][0] != '-' && target == NULL)
            target = argv[i];
        else
            return usage_error("stacks: unexpected argument '%s'", argv[i]);
        char *end = NULL;
        if (v && ((timeout_s = strtod(v, &end)) <= 0 || timeout_s > 3600 || *end != '\0'))
            return usage_error("--timeout '%s' is not a number of seconds in (0, 3600]", v);
    }
    if (target == NULL)
        return usage_error("no HOST:PORT given");
    char base[2048], shown[300], url[2100];
    int rc = base_url(target, base, sizeof(base), shown, sizeof(shown));
    if (rc)
        return rc;
    snprintf(url, sizeof(url), "%s/stacks", base);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return CDDP_EXIT_FAILURE;
    struct reply r = {0};
    cddp_buf_init(&r.body, REPLY_MAX);
    CURL *c = curl_easy_init();
    CURLcode cc = CURLE_FAILED_INIT;
    if (c) {
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)ceil(timeout_s * 1000.0));
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
        if ((cc = curl_easy_perform(c)) == CURLE_OK)
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
        curl_easy_cleanup(c);
    }
    long long id = 0;
    if (cc != CURLE_OK) {
        log_error("K0008", "%s: %s", url, curl_easy_strerror(cc));
        rc = CTL_EXIT_UNREACHABLE;
    } else {
        cJSON *root = cJSON_ParseWithLength(r.body.data ? r.body.data : "", r.body.len);
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
        if ((rc = fetch(url, shown, timeout_s, &r)) != 0)
            break;
        long long got = 0;
        if (r.code == 200 && sscanf(r.body.data, "# capture %lld", &got) == 1 && got >= id) {
            fwrite(r.body.data, 1, r.body.len, stdout);
            break;
        }
        cddp_buf_free(&r.body);
        if (waited >= timeout_s) {
            log_error("K0004", "%s did not answer within %gs", shown, timeout_s);
            rc = CDDP_EXIT_FAILURE;
            break;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        waited += 0.2;
    }
    cddp_buf_free(&r.body);
    curl_global_cleanup();
    fflush(stdout);
    return rc;
}

int main(int argc, char **argv)
{
    cddp_log_init("cddpctl");
    if (argc >= 2 && strcmp(argv[1], "stacks") == 0)
        return cmd_stacks(argc, argv);
    struct options o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    char base[2048], shown[300];
    if ((rc = base_url(o.target, base, sizeof(base), shown, sizeof(shown))) != 0)
        return rc;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        log_error("K0002", "cannot start libcurl");
        return CDDP_EXIT_FAILURE;
    }
    if (strcmp(o.command, "status") == 0)
        rc = cmd_status(&o, base, shown);
    else
        rc = cmd_health(&o, base, shown);
    curl_global_cleanup();
    fflush(stdout);
    return rc;
}
