/*
 * cli.c: torchrun's command line (torch/distributed/run.py get_args_parser)
 * turned into a struct launch_config.
 *
 * The flags are one table (flag_rows below): each row has torchrun's two
 * spellings, its PET_ default, its built-in default and a converter that
 * stores into the config. common/flags.c walks argv as argparse does for
 * torchrun's parser (options until the first positional, `--`, unique
 * prefixes, -r3 / -r 3 / -r=3, -m combined with other short flags) and
 * records the raw text of each flag and where it came from; then the
 * environment and the defaults fill in the rest and the converters run in
 * table order, so an error names exactly what the user wrote. --help is
 * written from the same rows (cddp_flags_help), so a flag cannot be left
 * out of it. Adding a flag is one row with its help text (and a converter
 * when it is more than an int, a double, a string or a choice).
 *
 * Beside it: validate.c (launch_validate: what this build can honour, and
 * where the rendezvous is), resolve.c (launch_resolve: the worker command)
 * and slurm.c (flag texts from a Slurm allocation).
 */
#include "launcher/cli.h"

#include <ctype.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "common/errors.h"
#include "common/flags.h"
#include "common/hostport.h" /* cddp_status_port_parse */
#include "common/signames.h"
#include "common/strutil.h"
#include "common/uuid.h"
#include "launcher/slurm.h"
#include "proto/msg.h" /* PROTO_MAX_ID */
#include "rendezvous/conf.h"

/* Row indexes of the flags table, for what launch_parse reads after the
 * conversion (whether a flag was given, where it came from). */
enum flag_id {
    F_HELP,
    F_VERSION,
    F_NNODES,
    F_NPROC_PER_NODE,
    F_RDZV_BACKEND,
    F_RDZV_ENDPOINT,
    F_RDZV_ID,
    F_RDZV_CONF,
    F_STANDALONE,
    F_MAX_RESTARTS,
    F_MONITOR_INTERVAL,
    F_START_METHOD,
    F_EVENT_LOG_HANDLER,
    F_ROLE,
    F_MODULE,
    F_NO_PYTHON,
    F_RUN_PATH,
    F_LOG_DIR,
    F_REDIRECTS,
    F_TEE,
    F_LOCAL_RANKS_FILTER,
    F_NODE_RANK,
    F_MASTER_ADDR,
    F_MASTER_PORT,
    F_LOCAL_ADDR,
    F_LOGS_SPECS,
    F_NUMA_BINDING,
    F_SIGNALS_TO_HANDLE,
    F_DUP_STDOUT_FILTERS,
    F_DUP_STDERR_FILTERS,
    F_SHUTDOWN_TIMEOUT,
    F_VIRTUAL_LOCAL_RANK,
    F_STATUS_PORT,
    F_STATUS_ADDR,
    F_STATUS_LINGER,
    F_AGENT_STORE,
    F_WATCHDOG_TIMEOUT,
    F_WATCHDOG_INITIAL,
    F_WATCHDOG_WARMUP,
    F_WATCHDOG_SAFETY,
    F_WATCHDOG_FLOOR,
    F_MAX_NO_PROGRESS_RESTARTS,
    F_RESTART_SCOPE,
    F_SPARE_WORKERS,
    F_NO_AUTO_PROGRESS,
    F_STRAGGLER_FACTOR,
    F_NO_IFNAME,
    F_NO_SLURM,
    F_COUNT,
};

/* Records a line for main.c to log once (L2001); past LAUNCH_MAX_NOTES
 * the rest are dropped, as they only repeat what the command said. */
static void note(struct launch_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(struct launch_config *cfg, const char *fmt, ...)
{
    if (cfg->nnotes >= LAUNCH_MAX_NOTES)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->notes[cfg->nnotes++], sizeof(cfg->notes[0]), fmt, ap);
    va_end(ap);
}

/* ---- converters: one per flag that is more than an int, a double, a
 * string or a choice. Each gets the flag's text (NULL when unset), stores
 * into the struct launch_config, and names a->name in its errors. */

/* --nnodes: N or MIN:MAX, then 0 < MIN <= MAX (run.py parse_min_max_nnodes). */
static int conv_nnodes(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                       size_t errlen)
{
    struct launch_config *cfg = dst;
    const char *s = a->text;
    const char *colon = strchr(s, ':');
    long lo, hi;
    char part[32];
    bool ok = false;
    if (colon == NULL) {
        ok = cddp_parse_long(s, LONG_MIN, LONG_MAX, &lo) == 0;
        hi = lo;
    } else if (strchr(colon + 1, ':') == NULL && (size_t)(colon - s) < sizeof(part)) {
        memcpy(part, s, (size_t)(colon - s));
        part[colon - s] = '\0';
        ok = cddp_parse_long(part, LONG_MIN, LONG_MAX, &lo) == 0 &&
             cddp_parse_long(colon + 1, LONG_MIN, LONG_MAX, &hi) == 0;
    }
    if (!ok)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not N or MIN:MAX", a->name, s);
    if (!(lo > 0 && lo <= hi) || hi > 1000000)
        return cddp_fail(err, errlen, CDDP_ERANGE_ARG,
                         "%s: '%s' needs 0 < MIN <= MAX (at most 1000000)", a->name, s);
    cfg->nnodes_min = (int)lo;
    cfg->nnodes_arg = s;
    cfg->nnodes_max = (int)hi;
    return 0;
}

/* --nproc_per_node: int, cpu, gpu, xpu, auto (run.py determine_local_world_size);
 * ctx is the struct launch_probe. */
static int conv_nproc(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err, size_t errlen)
{
    struct launch_config *cfg = dst;
    const struct launch_probe *probe = ctx;
    const char *s = a->text;
    const char *name = a->name;
    cfg->nproc_arg = s;
    long n;
    if (cddp_parse_long(s, LONG_MIN, LONG_MAX, &n) == 0) {
        if (n < 1 || n > 65536)
            return cddp_fail(err, errlen, CDDP_ERANGE_ARG, "%s: %ld is not between 1 and 65536",
                             name, n);
    } else if (strcmp(s, "cpu") == 0) {
        n = probe->cpu_count();
    } else if (strcmp(s, "gpu") == 0) {
        n = probe->gpu_count();
        if (n < 1)
            return cddp_fail(err, errlen, CDDP_ECONFIG, "%s=gpu: no CUDA device is visible", name);
    } else if (strcmp(s, "xpu") == 0) {
        return cddp_fail(err, errlen, CDDP_ECONFIG, "%s=xpu: no XPU device is visible", name);
    } else if (strcmp(s, "auto") == 0) {
        n = probe->gpu_count();
        if (n < 1)
            n = probe->cpu_count();
    } else {
        return cddp_fail(err, errlen, CDDP_EPARSE,
                         "%s: '%s' is not a number of workers, cpu, gpu or auto", name, s);
    }
    if (n < 1)
        n = 1;
    cfg->nproc_per_node = (int)(n > 65536 ? 65536 : n);
    return 0;
}

/* torch's _parse_rendezvous_config: "k=v,k=v", whitespace stripped, an empty
 * key or value is an error; later keys win. After --rdzv_backend (the etcd
 * keys are the etcd-v3 backend's only). */
static int conv_rdzv_conf(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                          size_t errlen)
{
    struct launch_config *cfg = dst;
    const char *name = a->name;
    bool etcd = strncmp(cfg->rdzv_backend, "etcd", 4) == 0;
    char *buf = strdup(a->text);
    if (buf == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    cfg->rdzv_conf_buf = buf;
    char *s = cddp_strip(buf);
    /* Kubernetes args lists, YAML and PyTorch's own launcher tests write
     * --rdzv_conf='join_timeout=5' with the quotes inside the argument (no
     * shell took them off). One pair of the same quote around the whole
     * value is quoting: it goes, and is logged; a quote anywhere else stays
     * part of a key or value and is refused below as any other bad text. */
    size_t sl = strlen(s);
    if (sl >= 2 && (s[0] == '\'' || s[0] == '"') && s[sl - 1] == s[0]) {
        note(cfg, "%s: removed the quotes (%c...%c) around '%.*s'", name, s[0], s[0],
             (int)(sl - 2 > 160 ? 160 : sl - 2), s + 1);
        s[sl - 1] = '\0';
        s = cddp_strip(s + 1);
    }
    if (*s == '\0')
        return 0;
    size_t n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    cfg->rdzv_conf = calloc(n, sizeof(*cfg->rdzv_conf));
    if (cfg->rdzv_conf == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    char *item = s;
    for (;;) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        char *eq = strchr(item, '=');
        if (eq)
            *eq = '\0';
        char *key = cddp_strip(item);
        char *value = eq ? cddp_strip(eq + 1) : NULL;
        if (*key == '\0')
            return cddp_fail(err, errlen, CDDP_EPARSE,
                             "%s: must be in the form KEY1=VALUE1,...,KEYN=VALUEN", name);
        if (value == NULL || *value == '\0')
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s: option '%s' must have a value", name,
                             key);
        /* The rendezvous's own checks (rendezvous/conf.c): unknown keys and
         * bad values are refused here, before anything starts (the etcd-v3
         * keys included, and only there). */
        if (!etcd && rdzv_conf_etcd_only(key))
            return cddp_fail(err, errlen, CDDP_EPARSE,
                             "%s: '%s' is a key of the etcd-v3 backend (--rdzv_backend=%s)", name,
                             key, cfg->rdzv_backend);
        {
            struct rdzv_conf scratch;
            char why[512];
            rdzv_conf_init(&scratch);
            if (rdzv_conf_set(&scratch, key, value, why, sizeof(why)) != 0)
                return cddp_fail(err, errlen, CDDP_EPARSE, "%s: %s", name, why);
        }
        int slot = cfg->rdzv_conf_len;
        for (int j = 0; j < cfg->rdzv_conf_len; j++) {
            if (strcmp(cfg->rdzv_conf[j].key, key) == 0)
                slot = j;
        }
        cfg->rdzv_conf[slot].key = key;
        cfg->rdzv_conf[slot].value = value;
        if (slot == cfg->rdzv_conf_len)
            cfg->rdzv_conf_len++;
        if (comma == NULL)
            return 0;
        item = comma + 1;
    }
}

/* torch's events handlers: null and dynamic_rendezvous discard events;
 * console would print them, which cddprun does not do. */
static int conv_event_log_handler(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                                  size_t errlen)
{
    static const char *const handlers[] = {"null", "dynamic_rendezvous", "console", NULL};
    int rc = cddp_flag_choose(a, handlers, err, errlen);
    if (rc)
        return rc;
    if (strcmp(a->text, "console") == 0)
        return cddp_fail(err, errlen, CDDP_ECONFIG,
                         "%s=console: torchelastic event logging is not supported by cddprun "
                         "(use null)",
                         a->name);
    ((struct launch_config *)dst)->event_log_handler = a->text;
    return 0;
}

/* --log_dir: empty is unset (a temporary directory). */
static int conv_log_dir(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                        size_t errlen)
{
    ((struct launch_config *)dst)->log_dir = a->text && a->text[0] ? a->text : NULL;
    return 0;
}

/* torchrun's Std.from_str: ^[0123]$ or ^(\d:[0123],)*(\d:[0123])$. */
static int parse_std(const char *s, struct launch_std_spec *out)
{
    memset(out, 0, sizeof(*out));
    if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0') {
        out->all = (uint8_t)(s[0] - '0');
        return 0;
    }
    out->is_map = true;
    const char *p = s;
    for (;;) {
        if (!isdigit((unsigned char)p[0]) || p[1] != ':' || p[2] < '0' || p[2] > '3')
            return CDDP_EPARSE;
        out->rank[p[0] - '0'] = (uint8_t)(p[2] - '0');
        p += 3;
        if (*p == '\0')
            return 0;
        if (*p != ',' || p[1] == '\0')
            return CDDP_EPARSE;
        p++;
    }
}

/* -r/--redirects and -t/--tee: a struct launch_std_spec at the row's offset. */
static int conv_std(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err, size_t errlen)
{
    if (parse_std(a->text, (struct launch_std_spec *)((char *)dst + a->flag->offset)))
        return cddp_fail(err, errlen, CDDP_EPARSE,
                         "%s: '%s' is not 0-3 or a map of local ranks like 0:1,1:2", a->name,
                         a->text);
    return 0;
}

static int conv_ranks_filter(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                             size_t errlen)
{
    struct launch_config *cfg = dst;
    const char *s = a->text;
    if (*s == '\0')
        return 0;
    char *buf = strdup(s);
    if (buf == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    size_t n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    cfg->ranks_filter = calloc(n, sizeof(long));
    int rc = cfg->ranks_filter ? 0 : CDDP_ERR_FROM_ERRNO(ENOMEM);
    char *item = buf;
    while (rc == 0) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        long v;
        if (cddp_parse_long(cddp_strip(item), -2147483647L, 2147483647L, &v) != 0) {
            rc = cddp_fail(err, errlen, CDDP_EPARSE,
                           "%s: '%s' must be a comma-separated list of integers, e.g. "
                           "--local_ranks_filter=0,1,2",
                           a->name, s);
            break;
        }
        cfg->ranks_filter[cfg->ranks_filter_len++] = v;
        if (comma == NULL)
            break;
        item = comma + 1;
    }
    free(buf);
    return rc;
}

/* --rdzv_endpoint: the text, parsed by launch_validate, which names in its
 * errors where the text came from (the option as typed, PET_RDZV_ENDPOINT,
 * or the Slurm variable it was derived from). */
static int conv_rdzv_endpoint(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                              size_t errlen)
{
    (void)ctx;
    (void)err;
    (void)errlen;
    struct launch_config *cfg = dst;
    cfg->rdzv_endpoint = a->text;
    cddp_strlcpy(cfg->rdzv_endpoint_src, a->source ? a->name : "--rdzv_endpoint",
                 sizeof(cfg->rdzv_endpoint_src));
    return 0;
}

/* --rdzv_id: kept whole in TORCHELASTIC_RUN_ID, the log folder and the
 * rendezvous, up to the protocol's limit on ids; a longer one is refused
 * rather than cut. */
static int conv_rdzv_id(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                        size_t errlen)
{
    (void)ctx;
    size_t n = strlen(a->text);
    if (n > PROTO_MAX_ID)
        return cddp_fail(err, errlen, CDDP_ERANGE_ARG,
                         "%s: %zu bytes long; a run id is at most %d bytes (the rendezvous "
                         "protocol's limit)",
                         a->name, n, PROTO_MAX_ID);
    ((struct launch_config *)dst)->rdzv_id = a->text;
    return 0;
}

static int conv_master_addr(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                            size_t errlen)
{
    if (a->text[0] == '\0')
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: empty address", a->name);
    ((struct launch_config *)dst)->master_addr = a->text;
    return 0;
}

/* --agent_store=true|false: whether node 0's agent hosts the TCPStore. */
static int conv_agent_store(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                            size_t errlen)
{
    (void)ctx;
    if (a->text == NULL)
        return 0;
    if (cddp_parse_bool(a->text, &((struct launch_config *)dst)->agent_store) < 0)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not true or false", a->name,
                         a->text);
    return 0;
}

static int conv_signals(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                        size_t errlen)
{
    struct launch_config *cfg = dst;
    const char *name = a->name;
    cfg->signals_arg = a->text;
    char buf[512];
    if (cddp_strlcpy(buf, a->text, sizeof(buf)) >= sizeof(buf))
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "%s: list too long", name);
    char *item = buf;
    for (;;) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        char *sig_name = cddp_strip(item);
        int sig = cddp_signal_from_name(sig_name);
        if (sig < 0)
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s: unknown signal '%s'", name, sig_name);
        if (sig == SIGKILL || sig == SIGSTOP)
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s: %s cannot be caught", name,
                             cddp_signal_name(sig));
        if (sig == SIGCHLD)
            return cddp_fail(
                err, errlen, CDDP_EPARSE,
                "%s: SIGCHLD is how the agent sees worker exits; it cannot be forwarded", name);
        bool dup = false;
        for (int j = 0; j < cfg->nsignals; j++)
            dup |= cfg->signals[j] == sig;
        if (!dup) {
            if (cfg->nsignals == LAUNCH_MAX_SIGNALS)
                return cddp_fail(err, errlen, CDDP_ETOOBIG, "%s: too many signals", name);
            cfg->signals[cfg->nsignals++] = sig;
        }
        if (comma == NULL)
            return 0;
        item = comma + 1;
    }
}

/* The status port: off unless a port is given; 0 picks a free one. */
static int conv_status_port(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                            size_t errlen)
{
    return cddp_status_port_parse(a->text, a->name, &((struct launch_config *)dst)->status_port,
                                  err, errlen);
}

static int conv_status_addr(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                            size_t errlen)
{
    if (a->text[0] == '\0')
        return cddp_fail(err, errlen, CDDP_EPARSE,
                         "%s: empty address (127.0.0.1 for this host only, 0.0.0.0 for all)",
                         a->name);
    ((struct launch_config *)dst)->status_addr = a->text;
    return 0;
}

/* A duration in seconds (> 0, at most a week) or "off" into *ms; with
 * allow_auto, "auto" too (returns 1 then). */
static int parse_watchdog_seconds(const struct cddp_flag_arg *a, bool allow_auto, uint64_t *ms,
                                  char *err, size_t errlen)
{
    double secs;
    *ms = 0;
    if (strcmp(a->text, "off") == 0)
        return 0;
    if (allow_auto && strcmp(a->text, "auto") == 0)
        return 1;
    if (cddp_parse_double(a->text, 0.001, 604800, &secs) != 0)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not %s", a->name, a->text,
                         allow_auto ? "off, auto or a number of seconds in (0, 604800]"
                                    : "off or a number of seconds in (0, 604800]");
    *ms = (uint64_t)(secs * 1000.0 + 0.5);
    return 0;
}

static int conv_watchdog_timeout(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                                 size_t errlen)
{
    struct watchdog_config *w = &((struct launch_config *)dst)->watchdog;
    int rc = parse_watchdog_seconds(a, true, &w->timeout_ms, err, errlen);
    if (rc < 0)
        return rc;
    w->mode = rc == 1 ? WATCHDOG_AUTO : w->timeout_ms ? WATCHDOG_FIXED : WATCHDOG_OFF;
    return 0;
}

static int conv_watchdog_initial(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                                 size_t errlen)
{
    struct watchdog_config *w = &((struct launch_config *)dst)->watchdog;
    return parse_watchdog_seconds(a, false, &w->initial_ms, err, errlen);
}

/* --straggler_factor: off, or a number in (1, 1000]. */
static int conv_straggler_factor(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                                 size_t errlen)
{
    (void)ctx;
    double *f = &((struct launch_config *)dst)->straggler_factor;
    if (strcmp(a->text, "off") == 0) {
        *f = 0;
        return 0;
    }
    if (cddp_parse_double(a->text, 1, 1000, f) != 0 || *f <= 1)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not off or a number in (1, 1000]",
                         a->name, a->text);
    return 0;
}

/* torchrun's comma_separated_list: split on ',', ",," is a literal comma.
 * The row's offset says which stream (0 stdout, 1 stderr). An empty value
 * is no filter: torchrun's help says an empty list duplicates nothing
 * (its parser would turn '' into [''], which matches every line). */
static int conv_dup_filters(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                            size_t errlen)
{
    struct launch_config *cfg = dst;
    size_t which = a->flag->offset;
    const char *t = a->text;
    if (t == NULL || *t == '\0')
        return 0;
    size_t n = strlen(t);
    char *buf = malloc(n + 1);
    const char **list = calloc(n / 2 + 2, sizeof(*list));
    if (buf == NULL || list == NULL) {
        free(buf);
        free(list);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    cfg->dup_filters_buf[which] = buf;
    cfg->dup_filters[which] = list;
    int k = 0;
    char *out = buf;
    list[k++] = out;
    for (size_t i = 0; i < n; i++) {
        if (t[i] == ',' && t[i + 1] == ',') {
            *out++ = ',';
            i++;
        } else if (t[i] == ',') {
            *out++ = '\0';
            list[k++] = out;
        } else {
            *out++ = t[i];
        }
    }
    *out = '\0';
    cfg->ndup_filters[which] = k;
    return 0;
}

/* --shutdown_timeout: whole seconds >= 0 from SIGTERM to SIGKILL (torchrun's
 * type=int); when given it beats TORCH_ELASTIC_SHUTDOWN_TIMEOUT. */
static int conv_shutdown_timeout(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                                 size_t errlen)
{
    struct launch_config *cfg = dst;
    long v;
    if (a->text == NULL)
        return 0;
    if (cddp_parse_long(a->text, 0, 86400L * 365, &v) != 0)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not a whole number of seconds >= 0",
                         a->name, a->text);
    cfg->shutdown_timeout_ms = (uint64_t)v * 1000u;
    cfg->shutdown_timeout_set = true;
    return 0;
}

static const char *const backends[] = {"static", "c10d", "etcd", "etcd-v2", "etcd-v3", NULL};
static const char *const methods[] = {"spawn", "fork", "forkserver", NULL};
static const char *const restart_scopes[] = {"group", "worker", NULL};
static const char *const numa_modes[] = {"node", "socket", "exclusive", "core-complex", NULL};

#define AT(field) offsetof(struct launch_config, field)
#define CUSTOM(fn) .kind = CDDP_FLAG_CUSTOM, .convert = fn
#define PET .prefixed_env = true
#define STATUS "status port (cddp's own; docs/status.md):"
#define STORE "the workers' store (cddp's own; docs/torchrun-compat.md):"
#define WATCHDOG "progress watchdog (cddp's own; docs/cli.md):"
#define PROGRESS "progress and stragglers (cddp's own; docs/status.md):"
#define IFNAME "network interface (cddp's own; docs/multi-node.md, \"Network interfaces\"):"
#define SLURM                                                                                      \
    "Slurm (cddp's own; docs/slurm.md): inside an srun step, flags left unset come from\n"         \
    "SLURM_*: --nnodes, --node-rank, --rdzv-backend=c10d, --rdzv-endpoint (the first\n"            \
    "host, port 29400 + (job + step) % 1000), --rdzv-id JOB.STEP, --nproc-per-node\n"              \
    "(GPUs, else tasks per node) and SIGUSR1,SIGUSR2 among the signals"

/* torchrun's flags, in its --help order, then cddp's own; --help lists
 * them in this order (cddp_flags_help), so every flag is in it. The name
 * is the underscore spelling (what errors and PET_<NAME> use), the alias
 * torch 2.x's dashed one, which --help shows. Every flag except
 * --logs_specs and --numa_binding takes PET_<NAME> as a default
 * (torchrun's action=env/check_env); cddp's own read CDDP_* before that
 * (the specific name wins over the generic one). The converters run in
 * this order. */
static const struct cddp_flag flag_rows[F_COUNT] = {
    [F_HELP] = {"--help", NULL, 'h', CDDP_FLAG_ACTION, .help = "show this help and exit"},
    [F_VERSION] = {"--version", NULL, 0, CDDP_FLAG_ACTION, .help = "print the version and exit"},
    [F_NNODES] = {"--nnodes", NULL, 0, CUSTOM(conv_nnodes), PET, .defval = "1:1",
                  .help = "N or MIN:MAX nodes (default 1:1; MIN:MAX needs c10d)"},
    [F_NPROC_PER_NODE] = {"--nproc_per_node", "--nproc-per-node", 0, CUSTOM(conv_nproc), PET,
                          .defval = "1", .metavar = "N",
                          .help = "workers per node: an integer, cpu, gpu or auto (default 1)"},
    [F_RDZV_BACKEND] = {"--rdzv_backend", "--rdzv-backend", 0, CDDP_FLAG_CHOICE, AT(rdzv_backend),
                        PET, .defval = "static", .choices = backends, .metavar = "NAME",
                        .help = "static (default: fixed node ranks), c10d (elastic, cddp's\n"
                                "rendezvous) or etcd-v3 (etcd and etcd-v2 name it). Unset,\n"
                                "several nodes without --node-rank, or MIN:MAX, are c10d"},
    [F_RDZV_ENDPOINT] = {"--rdzv_endpoint", "--rdzv-endpoint", 0, CUSTOM(conv_rdzv_endpoint), PET,
                         .defval = "", .metavar = "H:P",
                         .help = "c10d: the rendezvous server (default port 29400; the agent\n"
                                 "on that host serves it unless cddp-rdzv does); static:\n"
                                 "the master address"},
    [F_RDZV_ID] = {"--rdzv_id", "--rdzv-id", 0, CUSTOM(conv_rdzv_id), PET, .defval = "none",
                   .metavar = "ID",
                   .help = "run id, TORCHELASTIC_RUN_ID (default none; at most 256 bytes)"},
    [F_RDZV_CONF] = {"--rdzv_conf", "--rdzv-conf", 0, CUSTOM(conv_rdzv_conf), PET, .defval = "",
                     .metavar = "K=V,...",
                     .help = "rendezvous options (join_timeout, last_call_timeout,\n"
                             "keep_alive_interval, is_host, timeout, token, ...)"},
    [F_STANDALONE] = {"--standalone", NULL, 0, CDDP_FLAG_BOOL, AT(standalone), PET,
                      .help = "single node: an in-process rendezvous on 127.0.0.1, a free\n"
                              "MASTER_PORT and a random run id"},
    [F_MAX_RESTARTS] = {"--max_restarts", "--max-restarts", 0, CDDP_FLAG_INT, AT(max_restarts), PET,
                        .defval = "0", .min = 0, .max = 1000000000, .what = "an integer >= 0",
                        .metavar = "N", .help = "worker group restarts after failures (default 0)"},
    [F_MONITOR_INTERVAL] = {"--monitor_interval", "--monitor-interval", 0, CDDP_FLAG_DOUBLE,
                            AT(monitor_interval), PET, .defval = "0.1", .min = 0, .max = 86400,
                            .what = "a number of seconds >= 0", .metavar = "S",
                            .help = "accepted for compatibility; exits are seen as they happen"},
    [F_START_METHOD] = {"--start_method", "--start-method", 0, CDDP_FLAG_CHOICE, AT(start_method),
                        PET, .defval = "spawn", .choices = methods,
                        .help = "accepted; torchrun uses it for --run-path only"},
    [F_EVENT_LOG_HANDLER] = {"--event_log_handler", "--event-log-handler", 0,
                             CUSTOM(conv_event_log_handler), PET, .defval = "null", .metavar = "H",
                             .help = "null (default) or dynamic_rendezvous"},
    [F_ROLE] = {"--role", NULL, 0, CDDP_FLAG_STRING, AT(role), PET, .defval = "default",
                .help = "ROLE_NAME and the log prefix (default 'default')"},
    [F_MODULE] = {"--module", NULL, 'm', CDDP_FLAG_BOOL, AT(module), PET,
                  .help = "run training_script as a module: python3 -u -m"},
    [F_NO_PYTHON] = {"--no_python", "--no-python", 0, CDDP_FLAG_BOOL, AT(no_python), PET,
                     .help = "run training_script directly, not through python3"},
    [F_RUN_PATH] = {"--run_path", "--run-path", 0, CDDP_FLAG_BOOL, AT(run_path), PET,
                    .help = "run training_script with runpy.run_path, recording errors"},
    [F_LOG_DIR] = {"--log_dir", "--log-dir", 0, CUSTOM(conv_log_dir), PET, .metavar = "DIR",
                   .help = "base log directory (default: a new torchelastic_* temp dir)"},
    [F_REDIRECTS] = {"--redirects", NULL, 'r', CUSTOM(conv_std), .offset = AT(redirects), PET,
                     .defval = "0", .metavar = "STD",
                     .help = "streams to files: 0 none, 1 out, 2 err, 3 both, or 0:1,1:2"},
    [F_TEE] = {"--tee", NULL, 't', CUSTOM(conv_std), .offset = AT(tee), PET, .defval = "0",
               .metavar = "STD", .help = "as --redirects, and also to the console with [role<n>]:"},
    [F_LOCAL_RANKS_FILTER] = {"--local_ranks_filter", "--local-ranks-filter", 0,
                              CUSTOM(conv_ranks_filter), PET, .defval = "", .metavar = "L",
                              .help = "show only these local ranks on the console (0,1,...)"},
    [F_NODE_RANK] = {"--node_rank", "--node-rank", 0, CDDP_FLAG_INT, AT(node_rank), PET,
                     .defval = "0", .min = 0, .max = 1000000, .what = "an integer >= 0",
                     .metavar = "N", .help = "this node's rank (static backend; default 0)"},
    [F_MASTER_ADDR] = {"--master_addr", "--master-addr", 0, CUSTOM(conv_master_addr), PET,
                       .defval = "127.0.0.1", .metavar = "ADDR",
                       .help = "MASTER_ADDR (static backend; default 127.0.0.1)"},
    [F_MASTER_PORT] = {"--master_port", "--master-port", 0, CDDP_FLAG_INT, AT(master_port), PET,
                       .defval = "29500", .min = 1, .max = 65535, .what = "a port (1-65535)",
                       .metavar = "PORT", .help = "MASTER_PORT (static backend; default 29500)"},
    [F_LOCAL_ADDR] = {"--local_addr", "--local-addr", 0, CDDP_FLAG_STRING, AT(local_addr), PET,
                      .metavar = "ADDR",
                      .help = "this node's address as the others reach it (MASTER_ADDR\n"
                              "when this node is node 0)"},
    [F_LOGS_SPECS] = {"--logs_specs", "--logs-specs", 0, CDDP_FLAG_STRING, AT(logs_specs),
                      .metavar = "NAME",
                      .help = "torchrun plugin; refused (cddprun has no Python plugins)"},
    [F_NUMA_BINDING] = {"--numa_binding", "--numa-binding", 0, CDDP_FLAG_CHOICE, AT(numa_binding),
                        .choices = numa_modes, .metavar = "MODE",
                        .help = "node, socket, exclusive or core-complex: bind each worker's\n"
                                "CPUs and memory near its GPU (sysfs; one NUMA node: none)"},
    [F_SIGNALS_TO_HANDLE] = {"--signals_to_handle", "--signals-to-handle", 0, CUSTOM(conv_signals),
                             PET, .defval = "SIGTERM,SIGINT,SIGHUP,SIGQUIT", .metavar = "L",
                             .help = "signals forwarded to the workers\n"
                                     "(default SIGTERM,SIGINT,SIGHUP,SIGQUIT)"},
    /* torchrun's newest flags (run.py on main). */
    [F_DUP_STDOUT_FILTERS] = {"--duplicate_stdout_filters", "--duplicate-stdout-filters", 0,
                              CUSTOM(conv_dup_filters), .offset = 0, PET, .defval = "",
                              .metavar = "L",
                              .help = "copy teed lines holding any of these (,,: a comma) to\n"
                                      "attempt_N/filtered_stdout.log"},
    [F_DUP_STDERR_FILTERS] = {"--duplicate_stderr_filters", "--duplicate-stderr-filters", 0,
                              CUSTOM(conv_dup_filters), .offset = 1, PET, .defval = "",
                              .metavar = "L",
                              .help = "the same for stderr, to attempt_N/filtered_stderr.log"},
    [F_SHUTDOWN_TIMEOUT] = {"--shutdown_timeout", "--shutdown-timeout", 0,
                            CUSTOM(conv_shutdown_timeout), PET, .metavar = "S",
                            .help = "seconds from SIGTERM to SIGKILL (beats\n"
                                    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT; default 30)"},
    [F_VIRTUAL_LOCAL_RANK] = {"--virtual_local_rank", "--virtual-local-rank", 0, CDDP_FLAG_BOOL,
                              AT(virtual_local_rank), PET,
                              .help = "LOCAL_RANK=0 and one CUDA_VISIBLE_DEVICES entry per\n"
                                      "worker"},
    [F_STATUS_PORT] = {"--status_port", "--status-port", 0, CUSTOM(conv_status_port),
                       .env = "CDDP_STATUS_PORT", PET, .metavar = "PORT", .group = STATUS,
                       .help = "serve /livez /readyz /status /metrics over HTTP on PORT\n"
                               "(env CDDP_STATUS_PORT; 0 picks a free port and logs it;\n"
                               "default off)"},
    [F_STATUS_ADDR] = {"--status_addr", "--status-addr", 0, CUSTOM(conv_status_addr),
                       .env = "CDDP_STATUS_ADDR", PET, .defval = "127.0.0.1", .metavar = "ADDR",
                       .group = STATUS,
                       .help = "listen address (env CDDP_STATUS_ADDR; default 127.0.0.1;\n"
                               "0.0.0.0 for Kubernetes probes and Prometheus)"},
    [F_STATUS_LINGER] = {"--status_linger", "--status-linger", 0, CDDP_FLAG_DOUBLE,
                         AT(status_linger_s), .env = "CDDP_STATUS_LINGER", PET, .defval = "0",
                         .min = 0, .max = 86400, .what = "a number of seconds (0-86400)",
                         .metavar = "S", .group = STATUS,
                         .help = "after the run, keep serving its final status up to S\n"
                                 "seconds (env CDDP_STATUS_LINGER; default 0)"},
    [F_AGENT_STORE] = {"--agent_store", "--agent-store", 0, CUSTOM(conv_agent_store),
                       .env = "CDDP_AGENT_STORE", PET, .defval = "true", .metavar = "B",
                       .group = STORE,
                       .help = "true (default): node 0's agent serves a TCPStore on\n"
                               "MASTER_ADDR:MASTER_PORT, a fresh one each round, and the\n"
                               "workers get TORCHELASTIC_USE_AGENT_STORE=True (torchrun 2.x);\n"
                               "false: the workers' rank 0 serves it (False)\n"
                               "(env CDDP_AGENT_STORE, PET_AGENT_STORE)"},
    [F_WATCHDOG_TIMEOUT] = {"--watchdog_timeout", "--watchdog-timeout", 0,
                            CUSTOM(conv_watchdog_timeout), .env = "CDDP_WATCHDOG_TIMEOUT", PET,
                            .defval = "off", .metavar = "T", .group = WATCHDOG,
                            .help = "off (default), SECONDS, or auto: a worker that wrote a\n"
                                    "progress line and then none for T is hung; the group\n"
                                    "restarts (counts against --max-restarts)"},
    [F_WATCHDOG_INITIAL] = {"--watchdog_initial", "--watchdog-initial", 0,
                            CUSTOM(conv_watchdog_initial), .env = "CDDP_WATCHDOG_INITIAL", PET,
                            .defval = "off", .metavar = "S", .group = WATCHDOG,
                            .help = "also before a worker's first line, from its start\n"
                                    "(default off)"},
    [F_WATCHDOG_WARMUP] = {"--watchdog_warmup", "--watchdog-warmup", 0, CDDP_FLAG_INT,
                           AT(watchdog_warmup), .env = "CDDP_WATCHDOG_WARMUP", PET, .defval = "5",
                           .min = 1, .max = 1000000, .what = "an integer >= 1", .metavar = "N",
                           .group = WATCHDOG,
                           .help = "auto: lines before the timeout is learned (default 5)"},
    [F_WATCHDOG_SAFETY] = {"--watchdog_safety", "--watchdog-safety", 0, CDDP_FLAG_DOUBLE,
                           AT(watchdog_safety), .env = "CDDP_WATCHDOG_SAFETY", PET, .defval = "5",
                           .min = 1, .max = 1000, .what = "a number in [1, 1000]", .metavar = "X",
                           .group = WATCHDOG,
                           .help = "auto: timeout = longest interval x X (default 5), within\n"
                                   "the floor .. 3600 s"},
    [F_WATCHDOG_FLOOR] = {"--watchdog_floor", "--watchdog-floor", 0, CDDP_FLAG_DOUBLE,
                          AT(watchdog_floor), .env = "CDDP_WATCHDOG_FLOOR", PET, .defval = "60",
                          .min = 1, .max = 3600, .what = "a number of seconds in [1, 3600]",
                          .metavar = "S", .group = WATCHDOG,
                          .help = "auto: the least learned timeout (default 60 s, at\n"
                                  "least 1 s), so a pause between steps (an evaluation,\n"
                                  "a checkpoint) is not taken for a hang"},
    [F_MAX_NO_PROGRESS_RESTARTS] = {"--max_no_progress_restarts", "--max-no-progress-restarts", 0,
                                    CDDP_FLAG_INT, AT(max_no_progress_restarts),
                                    .env = "CDDP_MAX_NO_PROGRESS_RESTARTS", PET, .defval = "0",
                                    .min = 0, .max = 1000000000, .what = "an integer >= 0",
                                    .metavar = "N", .group = WATCHDOG,
                                    .help = "stop the job (exit 1) when N restarts in a row\n"
                                            "fail before any worker reports a step beyond the\n"
                                            "best seen before them (default 0: off)"},
    [F_RESTART_SCOPE] = {"--restart_scope", "--restart-scope", 0, CDDP_FLAG_CHOICE,
                         AT(restart_scope), .env = "CDDP_RESTART_SCOPE", PET, .defval = "group",
                         .choices = restart_scopes, .metavar = "S", .group = WATCHDOG,
                         .help = "group (default, torchrun's): a failure restarts every\n"
                                 "worker; worker: restart only the failed one, the others\n"
                                 "re-form with it (one node; docs/distributed.md,\n"
                                 "\"Recovering in place\"; env CDDP_RESTART_SCOPE)"},
    /* agent/spare.c */
    [F_SPARE_WORKERS] = {"--spare_workers", "--spare-workers", 0, CDDP_FLAG_INT, AT(spare_workers),
                         .env = "CDDP_SPARE_WORKERS", PET, .defval = "0", .min = 0, .max = 64,
                         .what = "an integer in [0, 64]", .metavar = "N", .group = WATCHDOG,
                         .help = "with --restart_scope=worker: keep N started spare\n"
                                 "workers that take a failed rank's place (the program\n"
                                 "must speak the spare protocol: docs/distributed.md,\n"
                                 "\"Warm spares\"; default 0)"},
    /* agent/stragglers.c; the bootstrap folder (launcher/resolve.c) */
    [F_NO_AUTO_PROGRESS] = {"--no_auto_progress", "--no-auto-progress", 0, CDDP_FLAG_BOOL,
                            AT(no_auto_progress), .env = "CDDP_NO_AUTO_PROGRESS", PET,
                            .group = PROGRESS,
                            .help = "do not report a Python worker's optimizer steps as its\n"
                                    "progress (default: on, through a sitecustomize on\n"
                                    "PYTHONPATH; docs/status.md, \"Progress without code\n"
                                    "changes\")"},
    [F_STRAGGLER_FACTOR] = {"--straggler_factor", "--straggler-factor", 0,
                            CUSTOM(conv_straggler_factor), .env = "CDDP_STRAGGLER_FACTOR", PET,
                            .defval = "1.5", .metavar = "X", .group = PROGRESS,
                            .help = "name a rank whose step (compute when known) over its last\n"
                                    "20+ steps is X times the node's median a straggler, and a\n"
                                    "node X times the job's; report only (default 1.5; off)"},
    /* agent/ifname.h */
    [F_NO_IFNAME] = {"--no_ifname", "--no-ifname", 0, CDDP_FLAG_BOOL, AT(no_ifname),
                     .env = "CDDP_NO_IFNAME", PET, .group = IFNAME,
                     .help = "do not set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for the\n"
                             "workers, nor publish the chosen interface's address as\n"
                             "MASTER_ADDR (env CDDP_NO_IFNAME; torchrun's behaviour)"},
    /* launcher/slurm.h */
    [F_NO_SLURM] = {"--no_slurm", "--no-slurm", 0, CDDP_FLAG_ACTION, .env = "CDDP_NO_SLURM", PET,
                    .group = SLURM, .help = "do not read SLURM_* (env CDDP_NO_SLURM=1)"},
};

static const struct cddp_flags launch_flags = {
    .rows = flag_rows,
    .n = F_COUNT,
    .program = "cddprun",
    .prefixes = true,
    .positionals = true,
    .name_as_typed = true,
    .env_prefix = "PET_",
    .usage_args = "training_script ...",
};

const struct cddp_flags *launch_flags_table(void)
{
    return &launch_flags;
}

/* --help around the table's rows (cddp_flags_help). */
static const char help_about[] =
    "cddprun: torchrun's launcher and elastic agent, in C. Starts NPROC_PER_NODE copies\n"
    "of training_script with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,\n"
    "MASTER_ADDR, MASTER_PORT, ...), restarts the whole group when a worker fails\n"
    "(up to --max-restarts), and never leaves a worker behind.\n"
    "\n"
    "Every flag takes both spellings (--nproc-per-node, --nproc_per_node) and, except\n"
    "--logs-specs and --numa-binding, a default from PET_<NAME> (PET_NPROC_PER_NODE).\n"
    "\n"
    "positional arguments:\n"
    "  training_script       a .py file (run as python3 -u: PYTHON_EXEC, else the\n"
    "                        python3 of the venv or conda environment cddprun is\n"
    "                        in, else PATH's), a module with -m, or an executable;\n"
    "                        then its arguments\n";

static const char help_epilogue[] =
    "Environment: LOGLEVEL (DEBUG, INFO, WARNING, ERROR), TORCH_ELASTIC_SHUTDOWN_TIMEOUT\n"
    "(seconds between SIGTERM and SIGKILL, default 30), PYTHON_EXEC, OMP_NUM_THREADS,\n"
    "TORCHELASTIC_ERROR_FILE, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, CDDP_RDZV_TOKEN\n"
    "(the rendezvous's join token, when --rdzv_conf has no token=),\n"
    "CDDP_EXIT_BARRIER_TIMEOUT (seconds, default 300).\n"
    "Workers also get CDDP_PROGRESS_FD, a pipe for progress lines (docs/status.md).\n"
    "Exit status: 0 success, 1 the workers failed, 2 bad usage, 128+N stopped by signal N.\n"
    "See docs/cli.md, docs/multi-node.md and docs/torchrun-compat.md.\n";

void launch_print_help(FILE *out)
{
    cddp_flags_help(&launch_flags, help_about, help_epilogue, out);
}

/* torchrun's uuid4() for --standalone run ids; cfg->rdzv_id points here. */
static char standalone_run_id[CDDP_UUID_STR_SIZE];

/* A duration in seconds from the environment variable var, into *ms (which
 * keeps its default when var is unset or empty). */
static int env_seconds(char **envp, const char *var, double max, const char *what, uint64_t *ms,
                       char *err, size_t errlen)
{
    const char *v = cddp_flags_getenv(envp, var);
    if (v == NULL || *v == '\0')
        return 0;
    double secs;
    if (cddp_parse_double(v, 0, max, &secs) != 0)
        return cddp_fail(err, errlen, CDDP_EPARSE, "%s='%s' is not %s", var, v, what);
    *ms = (uint64_t)(secs * 1000.0 + 0.5);
    return 0;
}

/* What torchrun reads from its environment besides PET_*:
 * TORCH_ELASTIC_SHUTDOWN_TIMEOUT (seconds from the stop signal to SIGKILL,
 * unless --shutdown_timeout), CDDP_EXIT_BARRIER_TIMEOUT (torch's
 * exit_barrier_timeout, 300 s, which torchrun hard-codes), the log line
 * prefix template and the error file. */
static int read_environment(struct launch_config *cfg, char **envp, char *err, size_t errlen)
{
    int rc;
    if (!cfg->shutdown_timeout_set)
        cfg->shutdown_timeout_ms = 30000;
    cfg->exit_barrier_timeout_ms = 300000;
    if ((!cfg->shutdown_timeout_set &&
         (rc = env_seconds(envp, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", 86400.0 * 365,
                           "a number of seconds >= 0", &cfg->shutdown_timeout_ms, err, errlen))) ||
        (rc = env_seconds(envp, "CDDP_EXIT_BARRIER_TIMEOUT", 86400.0 * 7,
                          "a number of seconds in [0, 604800]", &cfg->exit_barrier_timeout_ms, err,
                          errlen)))
        return rc;
    cfg->prefix_template = cddp_flags_getenv(envp, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    cfg->error_file = cddp_flags_getenv(envp, "TORCHELASTIC_ERROR_FILE");
    if (cfg->error_file && cfg->error_file[0] == '\0')
        cfg->error_file = NULL;
    return 0;
}

int launch_parse(int argc, char **argv, char **envp, const struct launch_probe *probe,
                 struct launch_config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    struct cddp_flag_seen seen[F_COUNT];
    int first_pos = argc;
    int rc = cddp_flags_scan(&launch_flags, argc, argv, seen, &first_pos, NULL, err, errlen);
    if (rc)
        return rc;
    if (seen[F_HELP].text)
        return LAUNCH_PARSED_HELP;
    if (seen[F_VERSION].text)
        return LAUNCH_PARSED_VERSION;
    /* Inside a Slurm step, what the command line and PET_* left unset
     * comes from the allocation (launcher/slurm.h). */
    static const struct launch_slurm_rows slurm_rows = {
        .nnodes = F_NNODES,
        .node_rank = F_NODE_RANK,
        .backend = F_RDZV_BACKEND,
        .endpoint = F_RDZV_ENDPOINT,
        .rdzv_id = F_RDZV_ID,
        .rdzv_conf = F_RDZV_CONF,
        .nproc = F_NPROC_PER_NODE,
        .signals = F_SIGNALS_TO_HANDLE,
        .standalone = F_STANDALONE,
        .no_slurm = F_NO_SLURM,
    };
    /* The Kubeflow training operator's ways of saying things torchrun reads
     * otherwise (pkg/controller.v1/pytorch/elastic.go, envvar.go): its older
     * versions write PET_N_PROC_PER_NODE, which torchrun never reads; and
     * it says "standalone on" with PET_STANDALONE set to the empty string,
     * on which torchrun's bool(int(...)) dies. Both are taken as meant. */
    const char *old_nproc = cddp_flags_getenv(envp, "PET_N_PROC_PER_NODE");
    if (seen[F_NPROC_PER_NODE].text == NULL && old_nproc &&
        cddp_flags_getenv(envp, "PET_NPROC_PER_NODE") == NULL) {
        seen[F_NPROC_PER_NODE].text = old_nproc;
        seen[F_NPROC_PER_NODE].source = "PET_N_PROC_PER_NODE";
    }
    const char *pet_standalone = cddp_flags_getenv(envp, "PET_STANDALONE");
    bool standalone_empty = false;
    if (seen[F_STANDALONE].text == NULL && pet_standalone) {
        char tmp[64];
        standalone_empty = cddp_strlcpy(tmp, pet_standalone, sizeof(tmp)) < sizeof(tmp) &&
                           *cddp_strip(tmp) == '\0';
        if (standalone_empty) {
            seen[F_STANDALONE].text = "1";
            seen[F_STANDALONE].source = "PET_STANDALONE";
        }
    }
    if ((rc = cddp_flags_defaults(&launch_flags, envp, seen, err, errlen)) ||
        (rc = launch_slurm_apply(envp, &slurm_rows, seen, err, errlen)) ||
        (rc = cddp_flags_convert(&launch_flags, seen, cfg, (void *)probe, err, errlen)))
        return rc;
    if (seen[F_NPROC_PER_NODE].source &&
        strcmp(seen[F_NPROC_PER_NODE].source, "PET_N_PROC_PER_NODE") == 0)
        note(cfg,
             "PET_N_PROC_PER_NODE=%s read as PET_NPROC_PER_NODE (the training operator's old "
             "spelling)",
             old_nproc);
    if (standalone_empty)
        note(cfg, "PET_STANDALONE is set and empty: standalone on (the training operator's way of "
                  "saying so)");
    cfg->rdzv_backend_set = seen[F_RDZV_BACKEND].source != NULL;
    cfg->node_rank_set = seen[F_NODE_RANK].source != NULL;
    /* A PET_ name lives in seen[], which ends with this call: copy it. */
    cfg->status_linger_src = seen[F_STATUS_LINGER].source;
    if (cfg->status_linger_src == seen[F_STATUS_LINGER].env_name) {
        cddp_strlcpy(cfg->status_linger_var, cfg->status_linger_src,
                     sizeof(cfg->status_linger_var));
        cfg->status_linger_src = cfg->status_linger_var;
    }
    cfg->status_linger_arg = seen[F_STATUS_LINGER].text;
    cfg->watchdog.warmup = (unsigned)cfg->watchdog_warmup;
    cfg->watchdog.safety = cfg->watchdog_safety;
    cfg->watchdog.floor_ms = (uint64_t)(cfg->watchdog_floor * 1000.0 + 0.5);

    if ((rc = read_environment(cfg, envp, err, errlen)) != 0)
        return rc;

    if (cfg->standalone) {
        /* run.py: --standalone overrides the backend, endpoint and id. */
        cddp_uuid4_str(standalone_run_id);
        cfg->rdzv_backend = "c10d";
        cfg->rdzv_endpoint = "localhost:0";
        cfg->rdzv_id = standalone_run_id;
    }

    if (first_pos >= argc)
        return cddp_fail(
            err, errlen, CDDP_EPARSE,
            "the training script is missing (usage: cddprun [OPTIONS] SCRIPT [ARGS...])");
    cfg->entrypoint = argv[first_pos];
    cfg->entry_args = argv + first_pos + 1;
    cfg->nentry_args = argc - first_pos - 1;
    if (cfg->entrypoint[0] == '\0')
        return cddp_fail(err, errlen, CDDP_EPARSE, "the training script is an empty string");

    if (cfg->no_python && cfg->module && !cfg->run_path)
        return cddp_fail(err, errlen, CDDP_EPARSE,
                         "--no_python and -m/--module cannot be used together");
    /* --virtual_local_rank gives local rank i the i-th entry of the agent's
     * CUDA_VISIBLE_DEVICES (local_elastic_agent.py _set_local_rank_env):
     * torchrun raises when there are fewer entries than workers; here that
     * is one line before anything starts. */
    const char *cvd = cddp_flags_getenv(envp, "CUDA_VISIBLE_DEVICES");
    if (cfg->virtual_local_rank && cvd) {
        int entries = 1;
        for (const char *p = cvd; *p; p++)
            entries += *p == ',';
        if (entries < cfg->nproc_per_node)
            return cddp_fail(
                err, errlen, CDDP_ECONFIG,
                "--virtual_local_rank: %d workers per node, but CUDA_VISIBLE_DEVICES=%s "
                "lists %d device%s (each worker needs its own)",
                cfg->nproc_per_node, cvd, entries, entries == 1 ? "" : "s");
    }
    return 0;
}

static long system_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

/* torch.cuda.device_count() without CUDA: the driver's GPU list, narrowed by
 * CUDA_VISIBLE_DEVICES (a comma-separated list; an empty value hides all). */
static long system_gpu_count(void)
{
    long present = 0;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            present += e->d_name[0] != '.';
        closedir(d);
    }
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (cvd == NULL || present == 0)
        return present;
    long listed = 0;
    for (const char *p = cvd; *p;) {
        while (*p == ' ')
            p++;
        if (*p == '\0' || *p == ',')
            break;
        /* CUDA stops at the first entry that names no device (e.g. -1). */
        if (*p == '-')
            break;
        listed++;
        const char *c = strchr(p, ',');
        if (c == NULL)
            break;
        p = c + 1;
    }
    return listed < present ? listed : present;
}

const struct launch_probe launch_system_probe = {system_cpu_count, system_gpu_count};
