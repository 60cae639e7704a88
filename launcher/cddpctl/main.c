/*
 * cddpctl: the status client of cddprun's and cddp-rdzv's status port.
 *
 *     cddpctl status HOST:PORT [--json] [--watch [--interval S] [--count N]]
 *                              [--total-steps N] [--timeout S]
 *     cddpctl health HOST:PORT [--live] [--verbose] [--json] [--timeout S]
 *     cddpctl job RDZV_HOST:PORT RUN_ID [--agent-port PORT] [--json]
 *                              [--watch ...] [--total-steps N] [--timeout S]
 *     cddpctl stacks HOST:PORT [--timeout S]
 *
 * Exit codes (docs/status.md):
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
 * This file: the command line (a flags table, common/flags.c; --help is
 * written from it), the commands (a table: a new one is a function and a
 * row, and says which options it takes), and the one way out for output:
 * a frame, escaped (safe.h) before it is written. ctl.h maps the rest.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/flags.h"
#include "common/hostport.h"
#include "common/log.h"
#include "common/strutil.h"
#include "config.h"
#include "launcher/cddpctl/ctl.h"
#include "launcher/cddpctl/http.h"
#include "launcher/cddpctl/safe.h"

static const struct ctl_command commands[] = {
    {"status", 1, "HOST:PORT", OPT_JSON | OPT_WATCH | OPT_STEPS, ctl_status},
    {"health", 1, "HOST:PORT", OPT_JSON | OPT_HEALTH, ctl_health},
    {"job", 2, "RDZV_HOST:PORT RUN_ID", OPT_JSON | OPT_WATCH | OPT_STEPS | OPT_AGENTPORT, ctl_job},
    {"stacks", 1, "HOST:PORT", 0, ctl_stacks},
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

/* ---- errors -------------------------------------------------------------- */

void ctl_error(struct ctl_frame *f, const char *id, const char *fmt, ...)
{
    char msg[1024], safe[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctl_safe(msg, safe, sizeof(safe));
    if (f)
        cddp_strlcpy(f->errmsg, safe, sizeof(f->errmsg));
    if (f == NULL || !f->quiet)
        log_error(id, "%s", safe);
}

void ctl_out_of_memory(const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    log_error("K2004", "out of memory %s", what);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    char msg[512], safe[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_error("K0001", "%s (cddpctl --help for usage)", ctl_safe(msg, safe, sizeof(safe)));
    return CDDP_EXIT_USAGE;
}

/* ---- the command line ------------------------------------------------------ */

/* A number in [min, max] at the row's offset, a double or a long; "NAME
 * 'TEXT' is not WHAT" otherwise (the option's name, however it was typed). */
static int convert_number(const struct cddp_flag_arg *a, void *dst, bool as_long, char *err,
                          size_t errlen)
{
    const struct cddp_flag *f = a->flag;
    if (a->text == NULL)
        return 0;
    char *at = (char *)dst + f->offset;
    int rc = as_long ? cddp_parse_long(a->text, (long)f->min, (long)f->max, (long *)(void *)at)
                     : cddp_parse_double(a->text, f->min, f->max, (double *)(void *)at);
    if (rc)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s '%s' is not %s", f->name, a->text, f->what);
    return 0;
}

static int conv_double(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                       size_t errlen)
{
    (void)ctx;
    return convert_number(a, dst, false, err, errlen);
}

static int conv_long(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err, size_t errlen)
{
    (void)ctx;
    return convert_number(a, dst, true, err, errlen);
}

enum {
    F_HELP,
    F_VERSION,
    F_JSON,
    F_LIVE,
    F_VERBOSE,
    F_WATCH,
    F_INTERVAL,
    F_COUNT,
    F_TOTAL_STEPS,
    F_AGENT_PORT,
    F_TIMEOUT,
    F_NFLAGS,
};

#define AT(field) offsetof(struct ctl_options, field)
#define DOUBLE(field) .kind = CDDP_FLAG_CUSTOM, .convert = conv_double, .offset = AT(field)
#define LONG(field) .kind = CDDP_FLAG_CUSTOM, .convert = conv_long, .offset = AT(field)

/* The options, for every command; main() refuses those a command does not
 * take (option_owner). --help lists them in this order. */
static const struct cddp_flag flag_rows[F_NFLAGS] = {
    [F_HELP] = {"--help", NULL, 'h', CDDP_FLAG_ACTION, .help = "show this help and exit"},
    [F_VERSION] = {"--version", NULL, 0, CDDP_FLAG_ACTION, .help = "print the version and exit"},
    [F_JSON] = {"--json", NULL, 0, CDDP_FLAG_BOOL, AT(json),
                .help = "machine-readable output (docs/status.md)"},
    [F_LIVE] = {"--live", NULL, 0, CDDP_FLAG_BOOL, AT(live),
                .help = "health: ask /livez (alive) instead of /readyz (ready)"},
    [F_VERBOSE] = {"--verbose", NULL, 'v', CDDP_FLAG_BOOL, AT(verbose),
                   .help = "health: print every check"},
    [F_WATCH] = {"--watch", NULL, 'w', CDDP_FLAG_BOOL, AT(watch),
                 .help = "status and job: again every --interval, in place on a\nterminal"},
    [F_INTERVAL] = {"--interval", NULL, 'n', DOUBLE(interval_s), .defval = "2", .min = 0.1,
                    .max = 86400, .what = "a number of seconds in [0.1, 86400]",
                    .metavar = "SECONDS", .help = "between snapshots of --watch (default 2)"},
    [F_COUNT] = {"--count", NULL, 0, LONG(count), .min = 1, .max = 1000000000,
                 .what = "a number of snapshots >= 1", .metavar = "N",
                 .help = "stop --watch after N snapshots"},
    [F_TOTAL_STEPS] = {"--total-steps", NULL, 0, LONG(total_steps), .min = 1,
                       .max = 9007199254740992.0, .what = "a number of steps >= 1", .metavar = "N",
                       .help = "draw a progress bar per worker against N steps"},
    [F_AGENT_PORT] = {"--agent-port", NULL, 0, LONG(agent_port), .min = 1, .max = 65535,
                      .what = "a port in 1..65535", .metavar = "PORT",
                      .help = "job: the --status_port every node's agent serves"},
    [F_TIMEOUT] = {"--timeout", NULL, 0, DOUBLE(timeout_s), .defval = "5", .min = 0.001,
                   .max = 3600, .what = "a number of seconds in (0, 3600]", .metavar = "SECONDS",
                   .help = "for the whole request (default 5; stacks: 15)"},
};

/* The group of options each row belongs to, for option_owner. */
static const unsigned flag_group[F_NFLAGS] = {
    [F_JSON] = OPT_JSON,         [F_LIVE] = OPT_HEALTH,          [F_VERBOSE] = OPT_HEALTH,
    [F_WATCH] = OPT_WATCH,       [F_INTERVAL] = OPT_WATCH,       [F_COUNT] = OPT_WATCH,
    [F_TOTAL_STEPS] = OPT_STEPS, [F_AGENT_PORT] = OPT_AGENTPORT,
};

static const struct cddp_flags ctl_flags = {
    .rows = flag_rows,
    .n = F_NFLAGS,
    .program = "cddpctl",
    .usage_args = "COMMAND TARGET ...",
};

static const char help_about[] =
    "Asks the status port of cddprun (--status_port) or cddp-rdzv:\n"
    "\n"
    "  cddpctl status HOST:PORT [--json] [--watch] [--total-steps N]\n"
    "      the node's or the server's status as a table (--json: as served)\n"
    "  cddpctl health HOST:PORT [--live] [--verbose] [--json]\n"
    "      exit 0 when ready (/readyz), 1 when not, 2 when unreachable;\n"
    "      --live asks /livez instead, --verbose prints every check\n"
    "  cddpctl job RDZV_HOST:PORT RUN_ID [--agent-port PORT] [--json] [--watch]\n"
    "      a run's nodes through its rendezvous server's status port, and every\n"
    "      worker through each node's agent (the port it told, or --agent-port)\n"
    "  cddpctl stacks HOST:PORT\n"
    "      capture every running worker's stacks now (cddprun) and print them\n";

static const char help_epilogue[] =
    "HOST:PORT may also be a URL: http://node:8080. What a server sent is printed\n"
    "with its control characters escaped (\\x1b).\n"
    "Exit status: 0 printed or ready, 1 an error answer or not ready, 2 unreachable\n"
    "or bad usage (docs/status.md).\n";

/* The row an option names ("--timeout=3", "-n"), for messages. */
static const struct cddp_flag *row_of(const char *arg)
{
    size_t n = strcspn(arg, "=");
    for (size_t i = 0; i < F_NFLAGS; i++) {
        const struct cddp_flag *f = &flag_rows[i];
        if ((strlen(f->name) == n && strncmp(f->name, arg, n) == 0) ||
            (arg[0] == '-' && arg[1] == f->short_name && f->short_name))
            return f;
    }
    return NULL;
}

/* A scan's refusal in cddpctl's words. */
static int scan_error(const struct cddp_flags_problem *p, const char *err)
{
    const struct cddp_flag *f = row_of(p->arg);
    switch (p->kind) {
    case CDDP_FLAGS_UNKNOWN:
        return usage_error("unknown option '%s'", p->arg);
    case CDDP_FLAGS_EXTRA:
        return usage_error("unexpected argument '%s'", p->arg);
    case CDDP_FLAGS_NEEDS_VALUE:
        if (f)
            return usage_error("%s needs %s", f->name, f->what);
        return usage_error("%s", err);
    default:
        return usage_error("%s", err);
    }
}

/* The command and its positionals: given, known, as many as it takes. */
static int pick_command(const char *const *pos, int npos, struct ctl_options *o)
{
    if (npos == 0)
        return usage_error("no command (status, health, job or stacks)");
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
        if (strcmp(commands[c].name, pos[0]) == 0)
            o->cmd = &commands[c];
    if (o->cmd == NULL)
        return usage_error("unknown command '%s' (status, health, job or stacks)", pos[0]);
    o->npos = npos - 1;
    for (int i = 1; i < npos; i++)
        o->pos[i - 1] = pos[i];
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

/* argv into *o: 0, CDDP_EXIT_USAGE (said), or 0 with *done after --help
 * or --version. */
static int parse_args(int argc, char **argv, struct ctl_options *o, bool *done)
{
    struct cddp_flag_seen seen[F_NFLAGS];
    const char *pos[1 + CTL_MAX_POSITIONAL];
    int npos;
    struct cddp_flags_problem problem = {0};
    char err[512];
    if (cddp_flags_scan_mixed(&ctl_flags, argc, argv, seen, pos, 1 + CTL_MAX_POSITIONAL, &npos,
                              &problem, err, sizeof(err)) != 0)
        return scan_error(&problem, err);
    *done = seen[F_HELP].text || seen[F_VERSION].text;
    if (seen[F_HELP].text)
        cddp_flags_help(&ctl_flags, help_about, help_epilogue, stdout);
    else if (seen[F_VERSION].text)
        printf("cddpctl %s\n", CDDP_VERSION);
    if (*done)
        return 0;
    if (cddp_flags_defaults(&ctl_flags, NULL, seen, err, sizeof(err)) != 0 ||
        cddp_flags_convert(&ctl_flags, seen, o, NULL, err, sizeof(err)) != 0)
        return usage_error("%s", err);
    for (size_t i = 0; i < F_NFLAGS; i++)
        if (seen[i].source)
            o->given |= flag_group[i];
    o->timeout_given = seen[F_TIMEOUT].source != NULL;
    return pick_command(pos, npos, o);
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

/* ---- frames ------------------------------------------------------------- */

int ctl_render_frame(const struct ctl_options *o, struct ctl_frame *f, char **buf, size_t *len)
{
    char *raw = NULL;
    size_t rawlen = 0;
    *buf = NULL;
    *len = 0;
    f->out = open_memstream(&raw, &rawlen);
    if (f->out == NULL) {
        ctl_out_of_memory("for a frame");
        return CDDP_EXIT_FAILURE;
    }
    int rc = o->cmd->frame(o, f);
    fclose(f->out);
    f->out = NULL;
    /* Escaped as a whole: what a command printed from a server is escaped
     * already where it was read (safe.h); this is for what it missed. */
    struct cddp_buf safe;
    cddp_buf_init(&safe, (size_t)-1 / 8);
    int src = o->json ? ctl_safe_json(raw, rawlen, &safe) : ctl_safe_text(raw, rawlen, true, &safe);
    if (src == 0)
        src = cddp_buf_append(&safe, "", 0); /* an empty frame is a frame */
    free(raw);
    if (src != 0) {
        cddp_buf_free(&safe);
        ctl_out_of_memory("for a frame");
        return CDDP_EXIT_FAILURE;
    }
    *buf = safe.data;
    *len = safe.len;
    return rc;
}

int main(int argc, char **argv)
{
    cddp_log_init("cddpctl");
    struct ctl_options o = {0};
    bool done = false;
    int rc = parse_args(argc, argv, &o, &done);
    if (rc || done)
        return rc;
    if ((rc = base_url(o.pos[0], o.base, sizeof(o.base), o.shown, sizeof(o.shown))) != 0)
        return rc;
    if ((rc = ctl_http_init()) != 0)
        return rc;
    if (o.watch) {
        rc = ctl_watch(&o);
    } else {
        struct ctl_frame f = {0};
        char *buf;
        size_t len;
        rc = ctl_render_frame(&o, &f, &buf, &len);
        if (buf)
            fwrite(buf, 1, len, stdout);
        free(buf);
        if (rc == CTL_NO_RUN)
            rc = CDDP_EXIT_FAILURE;
    }
    ctl_http_cleanup();
    fflush(stdout);
    return rc;
}
