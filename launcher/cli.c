/*
 * cli.c: torchrun's command line (torch/distributed/run.py get_args_parser)
 * turned into a struct launch_config.
 *
 * Parsing runs in two passes. The first walks argv the way argparse does for
 * torchrun's parser (options until the first positional, `--`, both long
 * spellings, unique prefixes, -r3 / -r 3 / -r=3, -m combined with other short
 * flags) and records the raw text of each flag and where it came from. The
 * second fills in PET_* and built-in defaults and converts and validates
 * each value, so an error can name exactly what the user wrote.
 */
#include "launcher/cli.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "common/errors.h"
#include "common/signames.h"
#include "common/strutil.h"
#include "rendezvous/conf.h"

enum flag_id {
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
    F_STATUS_PORT,
    F_STATUS_ADDR,
    F_STATUS_LINGER,
    F_HELP,
    F_VERSION,
    F_COUNT,
};

struct flag {
    enum flag_id id;
    const char *dashed;     /* torch 2.x's preferred spelling */
    const char *underscore; /* the spelling 1.x used; NULL when the same */
    char short_name;
    bool is_bool;
    bool has_pet;       /* PET_<NAME> is a default (torchrun's action=env/check_env) */
    const char *defval; /* NULL: unset (None) */
};

/* torchrun's flags, in its --help order. PET names come from the underscore
 * spelling upper-cased, as argparse's dest. */
static const struct flag flags[] = {
    {F_NNODES, "--nnodes", NULL, 0, false, true, "1:1"},
    {F_NPROC_PER_NODE, "--nproc-per-node", "--nproc_per_node", 0, false, true, "1"},
    {F_RDZV_BACKEND, "--rdzv-backend", "--rdzv_backend", 0, false, true, "static"},
    {F_RDZV_ENDPOINT, "--rdzv-endpoint", "--rdzv_endpoint", 0, false, true, ""},
    {F_RDZV_ID, "--rdzv-id", "--rdzv_id", 0, false, true, "none"},
    {F_RDZV_CONF, "--rdzv-conf", "--rdzv_conf", 0, false, true, ""},
    {F_STANDALONE, "--standalone", NULL, 0, true, true, NULL},
    {F_MAX_RESTARTS, "--max-restarts", "--max_restarts", 0, false, true, "0"},
    {F_MONITOR_INTERVAL, "--monitor-interval", "--monitor_interval", 0, false, true, "0.1"},
    {F_START_METHOD, "--start-method", "--start_method", 0, false, true, "spawn"},
    {F_EVENT_LOG_HANDLER, "--event-log-handler", "--event_log_handler", 0, false, true, "null"},
    {F_ROLE, "--role", NULL, 0, false, true, "default"},
    {F_MODULE, "--module", NULL, 'm', true, true, NULL},
    {F_NO_PYTHON, "--no-python", "--no_python", 0, true, true, NULL},
    {F_RUN_PATH, "--run-path", "--run_path", 0, true, true, NULL},
    {F_LOG_DIR, "--log-dir", "--log_dir", 0, false, true, NULL},
    {F_REDIRECTS, "--redirects", NULL, 'r', false, true, "0"},
    {F_TEE, "--tee", NULL, 't', false, true, "0"},
    {F_LOCAL_RANKS_FILTER, "--local-ranks-filter", "--local_ranks_filter", 0, false, true, ""},
    {F_NODE_RANK, "--node-rank", "--node_rank", 0, false, true, "0"},
    {F_MASTER_ADDR, "--master-addr", "--master_addr", 0, false, true, "127.0.0.1"},
    {F_MASTER_PORT, "--master-port", "--master_port", 0, false, true, "29500"},
    {F_LOCAL_ADDR, "--local-addr", "--local_addr", 0, false, true, NULL},
    {F_LOGS_SPECS, "--logs-specs", "--logs_specs", 0, false, false, NULL},
    {F_NUMA_BINDING, "--numa-binding", "--numa_binding", 0, false, false, NULL},
    {F_SIGNALS_TO_HANDLE, "--signals-to-handle", "--signals_to_handle", 0, false, true,
     "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
    /* cddp's own: the status port (docs/status.md). CDDP_STATUS_* come
     * before PET_* (launch_parse). */
    {F_STATUS_PORT, "--status-port", "--status_port", 0, false, true, NULL},
    {F_STATUS_ADDR, "--status-addr", "--status_addr", 0, false, true, "127.0.0.1"},
    {F_STATUS_LINGER, "--status-linger", "--status_linger", 0, false, true, "0"},
    {F_HELP, "--help", NULL, 'h', true, false, NULL},
    {F_VERSION, "--version", NULL, 0, true, false, NULL},
};
#define NFLAGS (sizeof(flags) / sizeof(flags[0]))

/* The raw text of every flag and where it came from, for error messages. */
struct raw_args {
    const char *value[F_COUNT];
    const char *source[F_COUNT]; /* the option as typed, "PET_X", or NULL (default) */
    char pet_name[F_COUNT][40];
};

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return code;
}

static const char *env_get(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    }
    return NULL;
}

static const struct flag *flag_by_id(enum flag_id id)
{
    for (size_t i = 0; i < NFLAGS; i++) {
        if (flags[i].id == id)
            return &flags[i];
    }
    return NULL;
}

/* The spelling users of cddprun most likely typed, for messages about defaults. */
static const char *flag_display(enum flag_id id)
{
    const struct flag *f = flag_by_id(id);
    return f->underscore ? f->underscore : f->dashed;
}

/* argparse's long option lookup: an exact match, else a unique prefix. Both
 * spellings of one flag count as one candidate (argparse would call that
 * ambiguous; accepting it is strictly more permissive). */
static int find_long(const char *name, size_t len, const struct flag **out, char *err,
                     size_t errlen)
{
    const struct flag *hit = NULL;
    for (size_t i = 0; i < NFLAGS; i++) {
        const char *sp[2] = {flags[i].dashed, flags[i].underscore};
        for (int k = 0; k < 2; k++) {
            if (sp[k] && strlen(sp[k]) == len && strncmp(sp[k], name, len) == 0) {
                *out = &flags[i];
                return 0;
            }
        }
    }
    int nhits = 0;
    char cands[256] = "";
    for (size_t i = 0; i < NFLAGS; i++) {
        const char *sp[2] = {flags[i].dashed, flags[i].underscore};
        for (int k = 0; k < 2; k++) {
            if (sp[k] && strncmp(sp[k], name, len) == 0) {
                if (hit != &flags[i]) {
                    nhits++;
                    size_t cl = strlen(cands);
                    snprintf(cands + cl, sizeof(cands) - cl, "%s%s", cl ? ", " : "", sp[k]);
                }
                hit = &flags[i];
                break;
            }
        }
    }
    if (nhits == 1 && len > 2) {
        *out = hit;
        return 0;
    }
    if (nhits > 1)
        return fail(err, errlen, CDDP_EPARSE, "ambiguous option: %.*s could match %s", (int)len,
                    name, cands);
    return fail(err, errlen, CDDP_EPARSE, "unrecognized argument: %.*s (see cddprun --help)",
                (int)len, name);
}

/* argparse treats "-5" or "-1.5" as a value, "-x" as an option. */
static bool looks_negative_number(const char *s)
{
    if (s[0] != '-' || s[1] == '\0')
        return false;
    char *end;
    strtod(s, &end);
    return *end == '\0';
}

static bool looks_like_option(const char *s)
{
    return s[0] == '-' && s[1] != '\0' && !looks_negative_number(s);
}

/* First pass: walk argv. On success *first_positional is the entrypoint's
 * index (argc when there is none). */
static int scan_argv(int argc, char **argv, struct raw_args *raw, int *first_positional, char *err,
                     size_t errlen)
{
    int i = 1;
    while (i < argc) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0' || looks_negative_number(a))
            break; /* the entrypoint: everything from here on is the worker's */

        if (a[1] == '-') {
            const char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a) : strlen(a);
            const struct flag *f = NULL;
            int rc = find_long(a, len, &f, err, errlen);
            if (rc)
                return rc;
            /* Errors name the spelling the user typed (or abbreviated). */
            const char *spelled =
                f->underscore && strncmp(a, f->underscore, len) == 0 ? f->underscore : f->dashed;
            if (f->is_bool) {
                if (eq)
                    return fail(err, errlen, CDDP_EPARSE, "%s takes no value (got '%s')", spelled,
                                eq + 1);
                raw->value[f->id] = "1";
                raw->source[f->id] = spelled;
                i++;
                continue;
            }
            const char *v;
            if (eq) {
                v = eq + 1;
                i++;
            } else {
                if (i + 1 >= argc || looks_like_option(argv[i + 1]))
                    return fail(err, errlen, CDDP_EPARSE, "%s expects a value", spelled);
                v = argv[i + 1];
                i += 2;
            }
            raw->value[f->id] = v;
            raw->source[f->id] = spelled;
            continue;
        }

        /* Short options: -m (flag, may be followed by more short options),
         * -h, -r VALUE, -t VALUE (also -r3 and -r=3). */
        const char *p = a + 1;
        int consumed_next = 0;
        while (*p) {
            const struct flag *f = NULL;
            for (size_t k = 0; k < NFLAGS; k++) {
                if (flags[k].short_name == *p)
                    f = &flags[k];
            }
            if (f == NULL)
                return fail(err, errlen, CDDP_EPARSE,
                            "unrecognized argument: -%c (see cddprun --help)", *p);
            static const char short_src[][3] = {"-m", "-r", "-t", "-h"};
            const char *src = f->short_name == 'm'   ? short_src[0]
                              : f->short_name == 'r' ? short_src[1]
                              : f->short_name == 't' ? short_src[2]
                                                     : short_src[3];
            if (f->is_bool) {
                raw->value[f->id] = "1";
                raw->source[f->id] = src;
                p++;
                continue;
            }
            const char *v;
            if (p[1] == '=') {
                v = p + 2;
            } else if (p[1] != '\0') {
                v = p + 1;
            } else {
                if (i + 1 >= argc || looks_like_option(argv[i + 1]))
                    return fail(err, errlen, CDDP_EPARSE, "%s expects a value", src);
                v = argv[i + 1];
                consumed_next = 1;
            }
            raw->value[f->id] = v;
            raw->source[f->id] = src;
            break;
        }
        i += 1 + consumed_next;
    }
    *first_positional = i;
    return 0;
}

/* The name to put in an error about flag id: what the user typed. */
static const char *src_name(const struct raw_args *raw, enum flag_id id)
{
    return raw->source[id] ? raw->source[id] : flag_display(id);
}

static int parse_int_arg(const struct raw_args *raw, enum flag_id id, long min, long max, long *out,
                         const char *what, char *err, size_t errlen)
{
    int rc = cddp_parse_long(raw->value[id], min, max, out);
    if (rc)
        return fail(err, errlen, rc, "%s: '%s' is not %s", src_name(raw, id), raw->value[id], what);
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

/* Trims ASCII whitespace in place (Python's str.strip()). */
static char *strip(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* torch's _parse_rendezvous_config: "k=v,k=v", whitespace stripped, an empty
 * key or value is an error; later keys win. */
static int parse_rdzv_conf(struct launch_config *cfg, const struct raw_args *raw, char *err,
                           size_t errlen)
{
    const char *name = src_name(raw, F_RDZV_CONF);
    bool etcd = strncmp(cfg->rdzv_backend, "etcd", 4) == 0;
    char *buf = strdup(raw->value[F_RDZV_CONF]);
    if (buf == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    cfg->rdzv_conf_buf = buf;
    char *s = strip(buf);
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
        char *key = strip(item);
        char *value = eq ? strip(eq + 1) : NULL;
        if (*key == '\0')
            return fail(err, errlen, CDDP_EPARSE,
                        "%s: must be in the form KEY1=VALUE1,...,KEYN=VALUEN", name);
        if (value == NULL || *value == '\0')
            return fail(err, errlen, CDDP_EPARSE, "%s: option '%s' must have a value", name, key);
        /* The rendezvous's own checks (rendezvous/conf.c): unknown keys and
         * bad values are refused here, before anything starts. The etcd
         * backends are refused as a whole by launch_validate. */
        if (!etcd) {
            struct rdzv_conf scratch;
            char why[512];
            rdzv_conf_init(&scratch);
            if (rdzv_conf_set(&scratch, key, value, why, sizeof(why)) != 0)
                return fail(err, errlen, CDDP_EPARSE, "%s: %s", name, why);
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

static int parse_ranks_filter(struct launch_config *cfg, const struct raw_args *raw, char *err,
                              size_t errlen)
{
    const char *s = raw->value[F_LOCAL_RANKS_FILTER];
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
        if (cddp_parse_long(strip(item), -2147483647L, 2147483647L, &v) != 0) {
            rc = fail(err, errlen, CDDP_EPARSE,
                      "%s: '%s' must be a comma-separated list of integers, e.g. "
                      "--local_ranks_filter=0,1,2",
                      src_name(raw, F_LOCAL_RANKS_FILTER), s);
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

static int parse_signals(struct launch_config *cfg, const struct raw_args *raw, char *err,
                         size_t errlen)
{
    const char *name = src_name(raw, F_SIGNALS_TO_HANDLE);
    const char *s = raw->value[F_SIGNALS_TO_HANDLE];
    cfg->signals_arg = s;
    char buf[512];
    if (cddp_strlcpy(buf, s, sizeof(buf)) >= sizeof(buf))
        return fail(err, errlen, CDDP_ETOOBIG, "%s: list too long", name);
    char *item = buf;
    for (;;) {
        char *comma = strchr(item, ',');
        if (comma)
            *comma = '\0';
        char *sig_name = strip(item);
        int sig = cddp_signal_from_name(sig_name);
        if (sig < 0)
            return fail(err, errlen, CDDP_EPARSE, "%s: unknown signal '%s'", name, sig_name);
        if (sig == SIGKILL || sig == SIGSTOP)
            return fail(err, errlen, CDDP_EPARSE, "%s: %s cannot be caught", name,
                        cddp_signal_name(sig));
        if (sig == SIGCHLD)
            return fail(err, errlen, CDDP_EPARSE,
                        "%s: SIGCHLD is how the agent sees worker exits; it cannot be forwarded",
                        name);
        bool dup = false;
        for (int j = 0; j < cfg->nsignals; j++)
            dup |= cfg->signals[j] == sig;
        if (!dup) {
            if (cfg->nsignals == LAUNCH_MAX_SIGNALS)
                return fail(err, errlen, CDDP_ETOOBIG, "%s: too many signals", name);
            cfg->signals[cfg->nsignals++] = sig;
        }
        if (comma == NULL)
            return 0;
        item = comma + 1;
    }
}

static int choose(const struct raw_args *raw, enum flag_id id, const char *const *choices,
                  char *err, size_t errlen)
{
    char list[160] = "";
    for (const char *const *c = choices; *c; c++) {
        if (strcmp(*c, raw->value[id]) == 0)
            return 0;
        size_t l = strlen(list);
        snprintf(list + l, sizeof(list) - l, "%s%s", l ? ", " : "", *c);
    }
    return fail(err, errlen, CDDP_EPARSE, "%s: invalid choice '%s' (choose from %s)",
                src_name(raw, id), raw->value[id], list);
}

/* A version 4 UUID, as torchrun's uuid4() for --standalone run ids. */
static void make_uuid4(char out[37])
{
    unsigned char b[16];
    if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
        /* getrandom cannot fail for 16 bytes once the pool is ready; be safe anyway. */
        uint64_t t = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < sizeof(b); i++)
            b[i] = (unsigned char)(t >> ((i % 8) * 8)) ^ (unsigned char)i;
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static char standalone_run_id[37];

int launch_parse(int argc, char **argv, char **envp, const struct launch_probe *probe,
                 struct launch_config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    struct raw_args raw;
    memset(&raw, 0, sizeof(raw));
    int first_pos = argc;
    int rc = scan_argv(argc, argv, &raw, &first_pos, err, errlen);
    if (rc)
        return rc;
    if (raw.value[F_HELP])
        return LAUNCH_PARSED_HELP;
    if (raw.value[F_VERSION])
        return LAUNCH_PARSED_VERSION;

    /* cddp's own variables for its own flags: after the command line, before
     * PET_* (the specific name wins over the generic one). */
    static const struct {
        enum flag_id id;
        const char *var;
    } cddp_env[] = {
        {F_STATUS_PORT, "CDDP_STATUS_PORT"},
        {F_STATUS_ADDR, "CDDP_STATUS_ADDR"},
        {F_STATUS_LINGER, "CDDP_STATUS_LINGER"},
    };
    for (size_t i = 0; i < sizeof(cddp_env) / sizeof(cddp_env[0]); i++) {
        const char *v = env_get(envp, cddp_env[i].var);
        if (raw.value[cddp_env[i].id] == NULL && v != NULL) {
            raw.value[cddp_env[i].id] = v;
            raw.source[cddp_env[i].id] = cddp_env[i].var;
        }
    }

    /* Defaults: PET_<NAME> first, then the built-in one. */
    for (size_t i = 0; i < NFLAGS; i++) {
        const struct flag *f = &flags[i];
        if (raw.value[f->id] || !f->has_pet)
            continue;
        const char *u = f->underscore ? f->underscore : f->dashed;
        char *pet = raw.pet_name[f->id];
        snprintf(pet, sizeof(raw.pet_name[0]), "PET_%s", u + 2);
        for (char *p = pet; *p; p++)
            *p = (char)toupper((unsigned char)*p);
        const char *v = env_get(envp, pet);
        if (v && f->is_bool) {
            /* check_env: bool(int(PET_X)) */
            long b;
            char tmp[64];
            if (cddp_strlcpy(tmp, v, sizeof(tmp)) >= sizeof(tmp) ||
                cddp_parse_long(strip(tmp), LONG_MIN, LONG_MAX, &b) != 0)
                return fail(err, errlen, CDDP_EPARSE, "%s='%s' is not an integer (0 or 1)", pet, v);
            raw.value[f->id] = b ? "1" : NULL;
            raw.source[f->id] = pet;
        } else if (v && !f->is_bool) {
            raw.value[f->id] = v;
            raw.source[f->id] = pet;
        }
    }
    for (size_t i = 0; i < NFLAGS; i++) {
        if (!raw.value[flags[i].id] && !flags[i].is_bool)
            raw.value[flags[i].id] = flags[i].defval;
    }

    long v;
    /* --nnodes: N or MIN:MAX, then 0 < MIN <= MAX (run.py parse_min_max_nnodes). */
    {
        const char *s = raw.value[F_NNODES];
        const char *colon = strchr(s, ':');
        long lo, hi;
        char a[32];
        bool ok = false;
        if (colon == NULL) {
            ok = cddp_parse_long(s, LONG_MIN, LONG_MAX, &lo) == 0;
            hi = lo;
        } else if (strchr(colon + 1, ':') == NULL && (size_t)(colon - s) < sizeof(a)) {
            memcpy(a, s, (size_t)(colon - s));
            a[colon - s] = '\0';
            ok = cddp_parse_long(a, LONG_MIN, LONG_MAX, &lo) == 0 &&
                 cddp_parse_long(colon + 1, LONG_MIN, LONG_MAX, &hi) == 0;
        }
        if (!ok)
            return fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not N or MIN:MAX",
                        src_name(&raw, F_NNODES), s);
        if (!(lo > 0 && lo <= hi) || hi > 1000000)
            return fail(err, errlen, CDDP_ERANGE_ARG,
                        "%s: '%s' needs 0 < MIN <= MAX (at most 1000000)", src_name(&raw, F_NNODES),
                        s);
        cfg->nnodes_min = (int)lo;
        cfg->nnodes_arg = s;
        cfg->nnodes_max = (int)hi;
    }

    /* --nproc_per_node: int, cpu, gpu, xpu, auto (run.py determine_local_world_size). */
    {
        const char *s = raw.value[F_NPROC_PER_NODE];
        cfg->nproc_arg = s;
        long n;
        const char *name = src_name(&raw, F_NPROC_PER_NODE);
        if (cddp_parse_long(s, LONG_MIN, LONG_MAX, &n) == 0) {
            if (n < 1 || n > 65536)
                return fail(err, errlen, CDDP_ERANGE_ARG, "%s: %ld is not between 1 and 65536",
                            name, n);
        } else if (strcmp(s, "cpu") == 0) {
            n = probe->cpu_count();
        } else if (strcmp(s, "gpu") == 0) {
            n = probe->gpu_count();
            if (n < 1)
                return fail(err, errlen, CDDP_ECONFIG, "%s=gpu: no CUDA device is visible", name);
        } else if (strcmp(s, "xpu") == 0) {
            return fail(err, errlen, CDDP_ECONFIG, "%s=xpu: no XPU device is visible", name);
        } else if (strcmp(s, "auto") == 0) {
            n = probe->gpu_count();
            if (n < 1)
                n = probe->cpu_count();
        } else {
            return fail(err, errlen, CDDP_EPARSE,
                        "%s: '%s' is not a number of workers, cpu, gpu or auto", name, s);
        }
        if (n < 1)
            n = 1;
        cfg->nproc_per_node = (int)(n > 65536 ? 65536 : n);
    }

    static const char *const backends[] = {"static", "c10d", "etcd", "etcd-v2", NULL};
    if ((rc = choose(&raw, F_RDZV_BACKEND, backends, err, errlen)))
        return rc;
    cfg->rdzv_backend = raw.value[F_RDZV_BACKEND];
    cfg->rdzv_backend_set = raw.source[F_RDZV_BACKEND] != NULL;
    cfg->rdzv_endpoint = raw.value[F_RDZV_ENDPOINT];
    cfg->rdzv_id = raw.value[F_RDZV_ID];
    if ((rc = parse_rdzv_conf(cfg, &raw, err, errlen)))
        return rc;
    cfg->standalone = raw.value[F_STANDALONE] != NULL;

    if ((rc = parse_int_arg(&raw, F_MAX_RESTARTS, 0, 1000000000L, &v, "an integer >= 0", err,
                            errlen)))
        return rc;
    cfg->max_restarts = (int)v;

    if (cddp_parse_double(raw.value[F_MONITOR_INTERVAL], 0, 86400, &cfg->monitor_interval))
        return fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not a number of seconds >= 0",
                    src_name(&raw, F_MONITOR_INTERVAL), raw.value[F_MONITOR_INTERVAL]);

    static const char *const methods[] = {"spawn", "fork", "forkserver", NULL};
    if ((rc = choose(&raw, F_START_METHOD, methods, err, errlen)))
        return rc;
    cfg->start_method = raw.value[F_START_METHOD];

    /* torch's events handlers: null and dynamic_rendezvous discard events; console
     * would print them, which cddprun does not do. */
    static const char *const handlers[] = {"null", "dynamic_rendezvous", "console", NULL};
    if ((rc = choose(&raw, F_EVENT_LOG_HANDLER, handlers, err, errlen)))
        return rc;
    if (strcmp(raw.value[F_EVENT_LOG_HANDLER], "console") == 0)
        return fail(err, errlen, CDDP_ECONFIG,
                    "%s=console: torchelastic event logging is not supported by cddprun "
                    "(use null)",
                    src_name(&raw, F_EVENT_LOG_HANDLER));
    cfg->event_log_handler = raw.value[F_EVENT_LOG_HANDLER];
    cfg->role = raw.value[F_ROLE];

    cfg->module = raw.value[F_MODULE] != NULL;
    cfg->no_python = raw.value[F_NO_PYTHON] != NULL;
    cfg->run_path = raw.value[F_RUN_PATH] != NULL;

    cfg->log_dir = raw.value[F_LOG_DIR] && raw.value[F_LOG_DIR][0] ? raw.value[F_LOG_DIR] : NULL;
    if (parse_std(raw.value[F_REDIRECTS], &cfg->redirects))
        return fail(err, errlen, CDDP_EPARSE,
                    "%s: '%s' is not 0-3 or a map of local ranks like 0:1,1:2",
                    src_name(&raw, F_REDIRECTS), raw.value[F_REDIRECTS]);
    if (parse_std(raw.value[F_TEE], &cfg->tee))
        return fail(err, errlen, CDDP_EPARSE,
                    "%s: '%s' is not 0-3 or a map of local ranks like 0:1,1:2",
                    src_name(&raw, F_TEE), raw.value[F_TEE]);
    if ((rc = parse_ranks_filter(cfg, &raw, err, errlen)))
        return rc;

    if ((rc = parse_int_arg(&raw, F_NODE_RANK, 0, 1000000L, &v, "an integer >= 0", err, errlen)))
        return rc;
    cfg->node_rank = (int)v;
    cfg->node_rank_set = raw.source[F_NODE_RANK] != NULL;
    cfg->master_addr = raw.value[F_MASTER_ADDR];
    if (cfg->master_addr[0] == '\0')
        return fail(err, errlen, CDDP_EPARSE, "%s: empty address", src_name(&raw, F_MASTER_ADDR));
    if ((rc = parse_int_arg(&raw, F_MASTER_PORT, 1, 65535, &v, "a port (1-65535)", err, errlen)))
        return rc;
    cfg->master_port = (int)v;
    cfg->local_addr = raw.value[F_LOCAL_ADDR];

    cfg->logs_specs = raw.value[F_LOGS_SPECS];
    cfg->numa_binding = raw.value[F_NUMA_BINDING];
    if (cfg->numa_binding) {
        static const char *const modes[] = {"node", "socket", "exclusive", "core-complex", NULL};
        if ((rc = choose(&raw, F_NUMA_BINDING, modes, err, errlen)))
            return rc;
    }
    if ((rc = parse_signals(cfg, &raw, err, errlen)))
        return rc;

    /* The status port: off unless a port is given; 0 picks a free one. An
     * empty value (CDDP_STATUS_PORT= in a manifest) means off too. */
    cfg->status_port = -1;
    if (raw.value[F_STATUS_PORT] && raw.value[F_STATUS_PORT][0]) {
        if ((rc = parse_int_arg(&raw, F_STATUS_PORT, 0, 65535, &v,
                                "a port number (0-65535; 0 picks a free one)", err, errlen)))
            return rc;
        cfg->status_port = (int)v;
    }
    cfg->status_addr = raw.value[F_STATUS_ADDR];
    if (cfg->status_addr[0] == '\0')
        return fail(err, errlen, CDDP_EPARSE,
                    "%s: empty address (127.0.0.1 for this host only, 0.0.0.0 for all)",
                    src_name(&raw, F_STATUS_ADDR));
    if (cddp_parse_double(raw.value[F_STATUS_LINGER], 0, 86400, &cfg->status_linger_s))
        return fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not a number of seconds (0-86400)",
                    src_name(&raw, F_STATUS_LINGER), raw.value[F_STATUS_LINGER]);

    /* TORCH_ELASTIC_SHUTDOWN_TIMEOUT: seconds from the stop signal to SIGKILL. */
    cfg->shutdown_timeout_ms = 30000;
    const char *sto = env_get(envp, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    if (sto && *sto) {
        double secs;
        if (cddp_parse_double(sto, 0, 86400.0 * 365, &secs) != 0)
            return fail(err, errlen, CDDP_EPARSE,
                        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT='%s' is not a number of seconds >= 0", sto);
        cfg->shutdown_timeout_ms = (uint64_t)(secs * 1000.0 + 0.5);
    }
    /* CDDP_EXIT_BARRIER_TIMEOUT: torch's exit_barrier_timeout (300 s), which
     * torchrun hard-codes. */
    cfg->exit_barrier_timeout_ms = 300000;
    const char *ebt = env_get(envp, "CDDP_EXIT_BARRIER_TIMEOUT");
    if (ebt && *ebt) {
        double secs;
        if (cddp_parse_double(ebt, 0, 86400.0 * 7, &secs) != 0)
            return fail(err, errlen, CDDP_EPARSE,
                        "CDDP_EXIT_BARRIER_TIMEOUT='%s' is not a number of seconds in [0, 604800]",
                        ebt);
        cfg->exit_barrier_timeout_ms = (uint64_t)(secs * 1000.0 + 0.5);
    }
    cfg->prefix_template = env_get(envp, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    cfg->error_file = env_get(envp, "TORCHELASTIC_ERROR_FILE");
    if (cfg->error_file && cfg->error_file[0] == '\0')
        cfg->error_file = NULL;

    if (cfg->standalone) {
        /* run.py: --standalone overrides the backend, endpoint and id. */
        make_uuid4(standalone_run_id);
        cfg->rdzv_backend = "c10d";
        cfg->rdzv_endpoint = "localhost:0";
        cfg->rdzv_id = standalone_run_id;
    }

    if (first_pos >= argc)
        return fail(err, errlen, CDDP_EPARSE,
                    "the training script is missing (usage: cddprun [OPTIONS] SCRIPT [ARGS...])");
    cfg->entrypoint = argv[first_pos];
    cfg->entry_args = argv + first_pos + 1;
    cfg->nentry_args = argc - first_pos - 1;
    if (cfg->entrypoint[0] == '\0')
        return fail(err, errlen, CDDP_EPARSE, "the training script is an empty string");

    if (cfg->no_python && cfg->module && !cfg->run_path)
        return fail(err, errlen, CDDP_EPARSE,
                    "--no_python and -m/--module cannot be used together");
    return 0;
}

int launch_parse_endpoint(const char *endpoint, int default_port, char *host, size_t hostlen,
                          int *port, char *err, size_t errlen)
{
    char buf[512];
    if (cddp_strlcpy(buf, endpoint, sizeof(buf)) >= sizeof(buf))
        return fail(err, errlen, CDDP_ETOOBIG, "endpoint '%s' is too long", endpoint);
    char *e = strip(buf);
    if (*e == '\0') {
        cddp_strlcpy(host, "localhost", hostlen);
        *port = default_port;
        return 0;
    }
    size_t n = strlen(e);
    char *h = e, *p = NULL;
    if (!(e[0] == '[' && e[n - 1] == ']')) {
        char *colon = strrchr(e, ':');
        if (colon) {
            *colon = '\0';
            p = colon + 1;
        }
    }
    size_t hl = strlen(h);
    if (hl > 1 && h[0] == '[' && h[hl - 1] == ']') {
        h[hl - 1] = '\0';
        h++;
    }
    if (p) {
        long v;
        size_t pl = strlen(p);
        bool digits = pl >= 1 && pl <= 5;
        for (size_t i = 0; i < pl; i++)
            digits &= isdigit((unsigned char)p[i]) != 0;
        if (!digits || cddp_parse_long(p, 0, 65535, &v) != 0)
            return fail(err, errlen, CDDP_EPARSE,
                        "the port of endpoint '%s' must be an integer between 0 and 65536",
                        endpoint);
        *port = (int)v;
    } else {
        *port = default_port;
    }
    bool ok = *h != '\0';
    for (const char *c = h; *c; c++)
        ok &= isalnum((unsigned char)*c) || *c == '_' || *c == '.' || *c == ':' || *c == '-';
    if (!ok)
        return fail(err, errlen, CDDP_EPARSE,
                    "the host of endpoint '%s' must be a host name, an IPv4 address or an IPv6 "
                    "address",
                    endpoint);
    if (cddp_strlcpy(host, h, hostlen) >= hostlen)
        return fail(err, errlen, CDDP_ETOOBIG, "the host of endpoint '%s' is too long", endpoint);
    return 0;
}

int launch_validate(struct launch_config *cfg, char *err, size_t errlen)
{
    if (cfg->logs_specs)
        return fail(err, errlen, CDDP_ECONFIG,
                    "--logs_specs=%s: logs_specs plugins are Python entry points; cddprun has "
                    "none (its logs follow torchrun's default layout)",
                    cfg->logs_specs);
    if (cfg->numa_binding)
        return fail(err, errlen, CDDP_ECONFIG,
                    "--numa_binding=%s: NUMA binding is not supported by cddprun yet",
                    cfg->numa_binding);
    if (cfg->standalone) {
        if (cfg->nnodes_max > 1)
            return fail(err, errlen, CDDP_ECONFIG,
                        "--standalone runs one node, but --nnodes=%s: give the nodes a "
                        "rendezvous with --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT",
                        cfg->nnodes_arg);
        cddp_strlcpy(cfg->rdzv_host, "127.0.0.1", sizeof(cfg->rdzv_host));
        cfg->rdzv_port = 0;
        return 0;
    }
    /* torchrun's default backend is static, which makes every node rank 0
     * when no --node_rank is given and ignores MIN of MIN:MAX: nobody asks
     * for that. Without --rdzv_backend such a run is elastic: c10d. */
    if (!cfg->rdzv_backend_set &&
        (cfg->nnodes_min != cfg->nnodes_max || (cfg->nnodes_max > 1 && !cfg->node_rank_set)))
        cfg->rdzv_backend = "c10d";
    if (strncmp(cfg->rdzv_backend, "etcd", 4) == 0)
        return fail(err, errlen, CDDP_ECONFIG,
                    "--rdzv_backend=%s: not yet supported by cddprun (use c10d: cddp's "
                    "rendezvous, hosted by an agent or by cddp-rdzv)",
                    cfg->rdzv_backend);
    if (strcmp(cfg->rdzv_backend, "c10d") == 0) {
        /* torch's parse_rendezvous_endpoint with its default port 29400;
         * an empty endpoint is localhost:29400. */
        char why[256];
        if (launch_parse_endpoint(cfg->rdzv_endpoint, 29400, cfg->rdzv_host, sizeof(cfg->rdzv_host),
                                  &cfg->rdzv_port, why, sizeof(why)) != 0)
            return fail(err, errlen, CDDP_EPARSE, "--rdzv_endpoint: %s", why);
        return 0;
    }
    /* static */
    if (cfg->node_rank >= cfg->nnodes_max)
        return fail(err, errlen, CDDP_ERANGE_ARG, "--node_rank=%d: must be less than --nnodes (%d)",
                    cfg->node_rank, cfg->nnodes_max);
    if (cfg->nnodes_min != cfg->nnodes_max)
        return fail(err, errlen, CDDP_ECONFIG,
                    "--nnodes=%s: the static backend runs a fixed number of nodes (--nnodes=N); "
                    "for MIN:MAX use --rdzv_backend=c10d",
                    cfg->nnodes_arg);
    {
        /* static (launcher/api.py _get_addr_and_port): the endpoint, or
         * master_addr:master_port, names the master; its port is required. */
        char ep[512];
        const char *what = "--rdzv_endpoint";
        if (cfg->rdzv_endpoint[0]) {
            cddp_strlcpy(ep, cfg->rdzv_endpoint, sizeof(ep));
        } else {
            snprintf(ep, sizeof(ep), "%s:%d", cfg->master_addr, cfg->master_port);
            what = "--master_addr";
        }
        char why[256];
        int port;
        if (launch_parse_endpoint(ep, -1, cfg->static_addr, sizeof(cfg->static_addr), &port, why,
                                  sizeof(why)) != 0)
            return fail(err, errlen, CDDP_EPARSE, "%s: %s", what, why);
        if (port <= 0)
            return fail(err, errlen, CDDP_EPARSE,
                        "--rdzv_endpoint=%s: the static backend needs HOST:PORT (port is missing "
                        "or 0)",
                        cfg->rdzv_endpoint);
        cfg->static_port = port;
        /* Several static nodes meet on the port after MASTER_PORT, which
         * the workers' rank 0 serves (docs/multi-node.md). */
        if (cfg->nnodes_max > 1 && port == 65535)
            return fail(err, errlen, CDDP_ERANGE_ARG,
                        "--master_port=65535: with --nnodes > 1 the static backend also needs "
                        "the next port, for the agents");
    }
    return 0;
}

static bool is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* execvp's search: a name with a slash is a path; otherwise each PATH entry. */
static char *find_program(const char *name, char **envp)
{
    if (strchr(name, '/'))
        return is_exec_file(name) ? strdup(name) : NULL;
    const char *path = env_get(envp, "PATH");
    if (path == NULL)
        path = "/usr/local/bin:/usr/bin:/bin";
    const char *p = path;
    for (;;) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        struct cddp_buf b;
        cddp_buf_init(&b, 8192);
        if (cddp_buf_printf(&b, "%.*s%s%s", (int)dl, p, dl ? "/" : "", name) == 0 &&
            is_exec_file(b.data))
            return b.data;
        cddp_buf_free(&b);
        if (colon == NULL)
            return NULL;
        p = colon + 1;
    }
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* --run_path: runpy.run_path(script) as __main__, recording an uncaught
 * exception in TORCHELASTIC_ERROR_FILE in torch's error.json format, as
 * torchrun's multiprocessing wrapper (@record) does. */
static const char run_path_bootstrap[] =
    "import json, os, runpy, sys, time, traceback\n"
    "sys.argv = sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except SystemExit:\n"
    "    raise\n"
    "except BaseException as e:\n"
    "    f = os.environ.get('TORCHELASTIC_ERROR_FILE')\n"
    "    if f:\n"
    "        with open(f, 'w') as fp:\n"
    "            json.dump({'message': {'message': f'{type(e).__name__}: {e}', 'extraInfo': {\n"
    "                'py_callstack': traceback.format_exc(),\n"
    "                'timestamp': str(int(time.time()))}}}, fp)\n"
    "    raise\n";

int launch_resolve(struct launch_config *cfg, char **envp, char *err, size_t errlen)
{
    const char *ep = cfg->entrypoint;
    if (cfg->log_dir) {
        struct stat st;
        if (stat(cfg->log_dir, &st) == 0 && !S_ISDIR(st.st_mode) &&
            strcmp(cfg->log_dir, "/dev/null") != 0)
            return fail(err, errlen, CDDP_ECONFIG, "--log_dir=%s: is a file, not a directory",
                        cfg->log_dir);
    }

    if (cfg->run_path)
        cfg->kind = LAUNCH_RUN_PATH;
    else if (cfg->module)
        cfg->kind = LAUNCH_PYTHON_MODULE;
    else if (cfg->no_python)
        cfg->kind = LAUNCH_BINARY;
    else if (ends_with(ep, ".py"))
        cfg->kind = LAUNCH_PYTHON_SCRIPT;
    else
        cfg->kind = LAUNCH_BINARY;

    const char *python = NULL;
    if (cfg->kind != LAUNCH_BINARY) {
        python = env_get(envp, "PYTHON_EXEC");
        if (python == NULL || *python == '\0')
            python = "python3";
        cfg->program = find_program(python, envp);
        if (cfg->program == NULL)
            return fail(err, errlen, CDDP_ENOTFOUND,
                        "%s: Python interpreter not found or not executable (set PYTHON_EXEC)",
                        python);
    }
    if (cfg->kind == LAUNCH_PYTHON_SCRIPT || cfg->kind == LAUNCH_RUN_PATH) {
        struct stat st;
        if (stat(ep, &st) != 0)
            return fail(err, errlen, CDDP_ENOTFOUND, "training script '%s': %s", ep,
                        strerror(errno));
        if (!S_ISREG(st.st_mode) || access(ep, R_OK) != 0)
            return fail(err, errlen, CDDP_ECONFIG, "training script '%s': not a readable file", ep);
    }
    if (cfg->kind == LAUNCH_BINARY) {
        /* A bare name that is a file in the working directory means that file
         * (torchrun would open it relative to the working directory too);
         * otherwise PATH is searched, as execvp. */
        struct stat st;
        bool local = strchr(ep, '/') == NULL && stat(ep, &st) == 0;
        if (strchr(ep, '/') || local) {
            if (stat(ep, &st) != 0)
                return fail(err, errlen, CDDP_ENOTFOUND, "entrypoint '%s': %s", ep,
                            strerror(errno));
            if (!S_ISREG(st.st_mode))
                return fail(err, errlen, CDDP_ECONFIG, "entrypoint '%s': not a regular file", ep);
            if (access(ep, X_OK) != 0)
                return fail(err, errlen, CDDP_ECONFIG,
                            "entrypoint '%s': not executable (chmod +x it, or run a Python "
                            "script named *.py)",
                            ep);
            struct cddp_buf b;
            cddp_buf_init(&b, 8192);
            if (cddp_buf_printf(&b, "%s%s", local ? "./" : "", ep) != 0)
                return fail(err, errlen, CDDP_ETOOBIG, "entrypoint path too long");
            cfg->program = b.data;
        } else {
            cfg->program = find_program(ep, envp);
            if (cfg->program == NULL)
                return fail(err, errlen, CDDP_ENOTFOUND,
                            "entrypoint '%s': not found in PATH or not executable", ep);
        }
    }

    /* argv: [program-as-named, python flags..., entrypoint, args...] */
    int n = 0;
    cfg->argv = calloc((size_t)cfg->nentry_args + 8, sizeof(char *));
    if (cfg->argv == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    switch (cfg->kind) {
    case LAUNCH_BINARY:
        cfg->argv[n++] = (char *)ep;
        break;
    case LAUNCH_PYTHON_SCRIPT:
        cfg->argv[n++] = (char *)python;
        cfg->argv[n++] = (char *)"-u";
        cfg->argv[n++] = (char *)ep;
        break;
    case LAUNCH_PYTHON_MODULE:
        cfg->argv[n++] = (char *)python;
        cfg->argv[n++] = (char *)"-u";
        cfg->argv[n++] = (char *)"-m";
        cfg->argv[n++] = (char *)ep;
        break;
    case LAUNCH_RUN_PATH:
        cfg->argv[n++] = (char *)python;
        cfg->argv[n++] = (char *)"-u";
        cfg->argv[n++] = (char *)"-c";
        cfg->argv[n++] = (char *)run_path_bootstrap;
        cfg->argv[n++] = (char *)ep;
        break;
    }
    for (int i = 0; i < cfg->nentry_args; i++)
        cfg->argv[n++] = cfg->entry_args[i];
    cfg->argv[n] = NULL;
    cfg->argc = n;
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

void launch_print_help(FILE *out)
{
    /* In parts: C11 compilers need only support string literals of 4095 bytes. */
    fprintf(out,
            "usage: cddprun [-h] [--version] [--nnodes NNODES] [--nproc-per-node NPROC_PER_NODE]\n"
            "               [--rdzv-backend RDZV_BACKEND] [--rdzv-endpoint RDZV_ENDPOINT]\n"
            "               [--rdzv-id RDZV_ID] [--rdzv-conf RDZV_CONF] [--standalone]\n"
            "               [--max-restarts MAX_RESTARTS] [--monitor-interval MONITOR_INTERVAL]\n"
            "               [--start-method {spawn,fork,forkserver}]\n"
            "               [--event-log-handler EVENT_LOG_HANDLER] [--role ROLE] [-m]\n"
            "               [--no-python] [--run-path] [--log-dir LOG_DIR] [-r REDIRECTS]\n"
            "               [-t TEE] [--local-ranks-filter LOCAL_RANKS_FILTER]\n"
            "               [--node-rank NODE_RANK] [--master-addr MASTER_ADDR]\n"
            "               [--master-port MASTER_PORT] [--local-addr LOCAL_ADDR]\n"
            "               [--logs-specs LOGS_SPECS] [--numa-binding NUMA_BINDING]\n"
            "               [--signals-to-handle SIGNALS_TO_HANDLE]\n"
            "               [--status-port STATUS_PORT] [--status-addr STATUS_ADDR]\n"
            "               [--status-linger STATUS_LINGER]\n"
            "               training_script ...\n"
            "\n"
            "cddprun: torchrun's launcher and elastic agent, in C. Starts NPROC_PER_NODE copies\n"
            "of training_script with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,\n"
            "MASTER_ADDR, MASTER_PORT, ...), restarts the whole group when a worker fails\n"
            "(up to --max-restarts), and never leaves a worker behind.\n"
            "\n"
            "Every flag takes both spellings (--nproc-per-node, --nproc_per_node) and, except\n"
            "--logs-specs and --numa-binding, a default from PET_<NAME> (PET_NPROC_PER_NODE).\n"
            "\n"
            "positional arguments:\n"
            "  training_script       a .py file (run as python3 -u, PYTHON_EXEC overrides),\n"
            "                        a module with -m, or an executable; then its arguments\n"
            "\n"
            "options:\n"
            "  -h, --help            show this help and exit\n"
            "  --version             print the version and exit\n"
            "  --nnodes NNODES       N or MIN:MAX nodes (default 1:1; MIN:MAX needs c10d)\n"
            "  --nproc-per-node N    workers per node: an integer, cpu, gpu or auto (default 1)\n"
            "  --rdzv-backend NAME   static (default: fixed node ranks) or c10d (elastic, cddp's\n"
            "                        rendezvous); etcd, etcd-v2 are not supported yet. Unset,\n"
            "                        several nodes without --node-rank, or MIN:MAX, are c10d\n"
            "  --rdzv-endpoint H:P   c10d: the rendezvous server (default port 29400; the agent\n"
            "                        on that host serves it unless cddp-rdzv does); static:\n"
            "                        the master address\n"
            "  --rdzv-id ID          run id, TORCHELASTIC_RUN_ID (default none)\n"
            "  --rdzv-conf K=V,...   rendezvous options (join_timeout, last_call_timeout,\n"
            "                        keep_alive_interval, is_host, timeout, token, ...)\n"
            "  --standalone          single node: an in-process rendezvous on 127.0.0.1, a free\n"
            "                        MASTER_PORT and a random run id\n");
    fprintf(out,
            "  --max-restarts N      worker group restarts after failures (default 0)\n"
            "  --monitor-interval S  accepted for compatibility; exits are seen as they happen\n"
            "  --start-method M      spawn, fork or forkserver (accepted; used by --run-path only\n"
            "                        in torchrun)\n"
            "  --event-log-handler H null (default) or dynamic_rendezvous\n"
            "  --role ROLE           ROLE_NAME and the log prefix (default 'default')\n"
            "  -m, --module          run training_script as a module: python3 -u -m\n"
            "  --no-python           run training_script directly, not through python3\n"
            "  --run-path            run training_script with runpy.run_path, recording errors\n"
            "  --log-dir DIR         base log directory (default: a new torchelastic_* temp dir)\n"
            "  -r, --redirects STD   streams to files: 0 none, 1 out, 2 err, 3 both, or 0:1,1:2\n"
            "  -t, --tee STD         as --redirects, and also to the console with [role<n>]:\n"
            "  --local-ranks-filter L  show only these local ranks on the console (0,1,...)\n"
            "  --node-rank N         this node's rank (static backend; default 0)\n"
            "  --master-addr ADDR    MASTER_ADDR (static backend; default 127.0.0.1)\n"
            "  --master-port PORT    MASTER_PORT (static backend; default 29500)\n"
            "  --local-addr ADDR     this node's address as the others reach it (MASTER_ADDR\n"
            "                        when this node is node 0)\n"
            "  --logs-specs NAME     torchrun plugin; refused (cddprun has no Python plugins)\n"
            "  --numa-binding MODE   refused (not supported yet)\n"
            "  --signals-to-handle L signals forwarded to the workers\n"
            "                        (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)\n");
    fprintf(
        out,
        "\n"
        "status port (cddp's own; docs/status.md):\n"
        "  --status-port PORT    serve /livez /readyz /status /metrics over HTTP on PORT\n"
        "                        (env CDDP_STATUS_PORT; 0 picks a free port and logs it;\n"
        "                        default off)\n"
        "  --status-addr ADDR    listen address (env CDDP_STATUS_ADDR; default 127.0.0.1;\n"
        "                        0.0.0.0 for Kubernetes probes and Prometheus)\n"
        "  --status-linger S     after the run, keep serving its final status up to S\n"
        "                        seconds (env CDDP_STATUS_LINGER; default 0)\n"
        "\n"
        "Environment: LOGLEVEL (DEBUG, INFO, WARNING, ERROR), TORCH_ELASTIC_SHUTDOWN_TIMEOUT\n"
        "(seconds between SIGTERM and SIGKILL, default 30), PYTHON_EXEC, OMP_NUM_THREADS,\n"
        "TORCHELASTIC_ERROR_FILE, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, CDDP_RDZV_TOKEN\n"
        "(the rendezvous's join token, when --rdzv_conf has no token=),\n"
        "CDDP_EXIT_BARRIER_TIMEOUT (seconds, default 300).\n"
        "Workers also get CDDP_PROGRESS_FD, a pipe for progress lines (docs/status.md).\n"
        "Exit status: 0 success, 1 the workers failed, 2 bad usage, 128+N stopped by signal N.\n"
        "See docs/cli.md, docs/multi-node.md and docs/torchrun-compat.md.\n");
}
