/* flags.c: see flags.h. */
#include "common/flags.h"

#include <ctype.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

static int refuse(struct cddp_flags_problem *problem, enum cddp_flags_problem_kind kind,
                  const char *arg)
{
    if (problem) {
        problem->kind = kind;
        problem->arg = arg;
    }
    return CDDP_EPARSE;
}

const char *cddp_flags_getenv(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++) {
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    }
    return NULL;
}

/* argparse's long option lookup: an exact match, else (when the table
 * allows it) a unique prefix. Both spellings of one flag count as one
 * candidate (argparse would call that ambiguous; accepting it is strictly
 * more permissive). Returns the row's index or -1 with err. */
static long find_long(const struct cddp_flags *spec, const char *arg, size_t len,
                      struct cddp_flags_problem *problem, char *err, size_t errlen)
{
    for (size_t i = 0; i < spec->n; i++) {
        const char *sp[2] = {spec->rows[i].name, spec->rows[i].alias};
        for (int k = 0; k < 2; k++) {
            if (sp[k] && strlen(sp[k]) == len && strncmp(sp[k], arg, len) == 0)
                return (long)i;
        }
    }
    long hit = -1;
    int nhits = 0;
    char cands[256] = "";
    for (size_t i = 0; spec->prefixes && i < spec->n; i++) {
        /* The alias first: the candidates list the spelling --help shows. */
        const char *sp[2] = {spec->rows[i].alias, spec->rows[i].name};
        for (int k = 0; k < 2; k++) {
            if (sp[k] && strncmp(sp[k], arg, len) == 0) {
                if (hit != (long)i) {
                    nhits++;
                    size_t cl = strlen(cands);
                    snprintf(cands + cl, sizeof(cands) - cl, "%s%s", cl ? ", " : "", sp[k]);
                }
                hit = (long)i;
                break;
            }
        }
    }
    if (nhits == 1 && len > 2)
        return hit;
    if (nhits > 1) {
        cddp_fail(err, errlen, CDDP_EPARSE, "ambiguous option: %.*s could match %s", (int)len, arg,
                  cands);
        refuse(problem, CDDP_FLAGS_AMBIGUOUS, arg);
        return -1;
    }
    cddp_fail(err, errlen, CDDP_EPARSE, "unrecognized argument: %.*s (see %s --help)", (int)len,
              arg, spec->program);
    refuse(problem, CDDP_FLAGS_UNKNOWN, arg);
    return -1;
}

static bool takes_no_value(const struct cddp_flag *f)
{
    return f->kind == CDDP_FLAG_BOOL || f->kind == CDDP_FLAG_ACTION;
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

/* One long option at argv[*i]; advances *i past it and its value. */
static int scan_long(const struct cddp_flags *spec, int argc, char **argv, int *i,
                     struct cddp_flag_seen *seen, struct cddp_flags_problem *problem, char *err,
                     size_t errlen)
{
    const char *a = argv[*i];
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    long r = find_long(spec, a, len, problem, err, errlen);
    if (r < 0)
        return CDDP_EPARSE;
    const struct cddp_flag *f = &spec->rows[r];
    /* Errors name the spelling the user typed (or abbreviated). */
    const char *spelled = f->name;
    if (spec->name_as_typed && f->alias && strncmp(a, f->name, len) != 0)
        spelled = f->alias;
    if (takes_no_value(f)) {
        if (eq) {
            cddp_fail(err, errlen, CDDP_EPARSE, "%s takes no value (got '%s')", spelled, eq + 1);
            return refuse(problem, CDDP_FLAGS_TAKES_NO_VALUE, a);
        }
        seen[r].text = "1";
        seen[r].source = spelled;
        ++*i;
        return 0;
    }
    if (eq) {
        seen[r].text = eq + 1;
        ++*i;
    } else {
        if (*i + 1 >= argc || looks_like_option(argv[*i + 1])) {
            cddp_fail(err, errlen, CDDP_EPARSE, "%s expects a value", spelled);
            return refuse(problem, CDDP_FLAGS_NEEDS_VALUE, a);
        }
        seen[r].text = argv[*i + 1];
        *i += 2;
    }
    seen[r].source = spelled;
    return 0;
}

/* Short options at argv[*i]: booleans may run together (-mh); one that takes
 * a value ends the run (-r3, -r=3, or -r 3). */
static int scan_short(const struct cddp_flags *spec, int argc, char **argv, int *i,
                      struct cddp_flag_seen *seen, struct cddp_flags_problem *problem, char *err,
                      size_t errlen)
{
    const char *a = argv[*i];
    const char *p = a + 1;
    int consumed_next = 0;
    while (*p) {
        long r = -1;
        for (size_t k = 0; k < spec->n; k++) {
            if (spec->rows[k].short_name == *p)
                r = (long)k;
        }
        if (r < 0) {
            cddp_fail(err, errlen, CDDP_EPARSE, "unrecognized argument: -%c (see %s --help)", *p,
                      spec->program);
            return refuse(problem, CDDP_FLAGS_UNKNOWN, a);
        }
        struct cddp_flag_seen *s = &seen[r];
        s->short_src[0] = '-';
        s->short_src[1] = *p;
        s->short_src[2] = '\0';
        if (takes_no_value(&spec->rows[r])) {
            s->text = "1";
            s->source = s->short_src;
            p++;
            continue;
        }
        if (p[1] == '=') {
            s->text = p + 2;
        } else if (p[1] != '\0') {
            s->text = p + 1;
        } else {
            if (*i + 1 >= argc || looks_like_option(argv[*i + 1])) {
                cddp_fail(err, errlen, CDDP_EPARSE, "%s expects a value", s->short_src);
                return refuse(problem, CDDP_FLAGS_NEEDS_VALUE, a);
            }
            s->text = argv[*i + 1];
            consumed_next = 1;
        }
        s->source = s->short_src;
        break;
    }
    *i += 1 + consumed_next;
    return 0;
}

static bool is_positional(const char *a)
{
    return a[0] != '-' || a[1] == '\0' || looks_negative_number(a);
}

/* Options from argv[*i] up to the next positional or `--` (or the end). */
static int scan_options(const struct cddp_flags *spec, int argc, char **argv, int *i,
                        struct cddp_flag_seen *seen, struct cddp_flags_problem *problem, char *err,
                        size_t errlen)
{
    while (*i < argc && !is_positional(argv[*i]) && strcmp(argv[*i], "--") != 0) {
        int rc = argv[*i][1] == '-' ? scan_long(spec, argc, argv, i, seen, problem, err, errlen)
                                    : scan_short(spec, argc, argv, i, seen, problem, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

int cddp_flags_scan(const struct cddp_flags *spec, int argc, char **argv,
                    struct cddp_flag_seen *seen, int *first_positional,
                    struct cddp_flags_problem *problem, char *err, size_t errlen)
{
    memset(seen, 0, spec->n * sizeof(*seen));
    int i = 1;
    int rc = scan_options(spec, argc, argv, &i, seen, problem, err, errlen);
    if (rc)
        return rc;
    if (i < argc && !spec->positionals) {
        cddp_fail(err, errlen, CDDP_EPARSE, "unrecognized argument: %s (see %s --help)", argv[i],
                  spec->program);
        return refuse(problem, CDDP_FLAGS_UNKNOWN, argv[i]);
    }
    /* A positional is the entrypoint: everything from there on is the
     * program's; `--` goes before it. */
    if (i < argc && strcmp(argv[i], "--") == 0)
        i++;
    *first_positional = i;
    return 0;
}

int cddp_flags_scan_mixed(const struct cddp_flags *spec, int argc, char **argv,
                          struct cddp_flag_seen *seen, const char **pos, int maxpos, int *npos,
                          struct cddp_flags_problem *problem, char *err, size_t errlen)
{
    memset(seen, 0, spec->n * sizeof(*seen));
    *npos = 0;
    bool options = true;
    for (int i = 1; i < argc;) {
        if (options) {
            int rc = scan_options(spec, argc, argv, &i, seen, problem, err, errlen);
            if (rc)
                return rc;
            if (i >= argc)
                break;
            if (strcmp(argv[i], "--") == 0) {
                options = false;
                i++;
                continue;
            }
        }
        if (*npos == maxpos) {
            cddp_fail(err, errlen, CDDP_EPARSE, "unexpected argument: %s (see %s --help)", argv[i],
                      spec->program);
            return refuse(problem, CDDP_FLAGS_EXTRA, argv[i]);
        }
        pos[(*npos)++] = argv[i++];
    }
    return 0;
}

/* "--nproc_per_node" -> PREFIX "NPROC_PER_NODE". */
static void prefixed_name(const char *prefix, const char *flag, char *out, size_t len)
{
    while (*flag == '-')
        flag++;
    snprintf(out, len, "%s%s", prefix, flag);
    for (char *p = out; *p; p++)
        *p = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
}

int cddp_flags_defaults(const struct cddp_flags *spec, char **envp, struct cddp_flag_seen *seen,
                        char *err, size_t errlen)
{
    for (size_t i = 0; i < spec->n; i++) {
        const struct cddp_flag *f = &spec->rows[i];
        struct cddp_flag_seen *s = &seen[i];
        if (s->text || s->source)
            continue;
        const char *var = NULL, *v = NULL;
        if (f->env && (v = cddp_flags_getenv(envp, f->env)) != NULL) {
            var = f->env;
        } else if (f->prefixed_env && spec->env_prefix) {
            prefixed_name(spec->env_prefix, f->name, s->env_name, sizeof(s->env_name));
            v = cddp_flags_getenv(envp, s->env_name);
            var = s->env_name;
        }
        if (v && takes_no_value(f)) {
            long b;
            char tmp[64];
            if (cddp_strlcpy(tmp, v, sizeof(tmp)) >= sizeof(tmp) ||
                cddp_parse_long(cddp_strip(tmp), LONG_MIN, LONG_MAX, &b) != 0)
                return cddp_fail(err, errlen, CDDP_EPARSE, "%s='%s' is not an integer (0 or 1)",
                                 var, v);
            s->text = b ? "1" : NULL;
            s->source = var;
        } else if (v) {
            s->text = v;
            s->source = var;
        } else if (!takes_no_value(f)) {
            s->text = f->defval;
        }
    }
    return 0;
}

struct cddp_flag_arg cddp_flags_arg(const struct cddp_flags *spec,
                                    const struct cddp_flag_seen *seen, size_t i)
{
    struct cddp_flag_arg a = {&spec->rows[i], seen[i].text, seen[i].source, seen[i].source};
    if (a.name == NULL)
        a.name = spec->rows[i].name;
    return a;
}

int cddp_flag_choose(const struct cddp_flag_arg *a, const char *const *choices, char *err,
                     size_t errlen)
{
    char list[160] = "";
    for (const char *const *c = choices; *c; c++) {
        if (strcmp(*c, a->text) == 0)
            return 0;
        size_t l = strlen(list);
        snprintf(list + l, sizeof(list) - l, "%s%s", l ? ", " : "", *c);
    }
    return cddp_fail(err, errlen, CDDP_EPARSE, "%s: invalid choice '%s' (choose from %s)", a->name,
                     a->text, list);
}

static int convert_builtin(const struct cddp_flag_arg *a, void *dst, char *err, size_t errlen)
{
    const struct cddp_flag *f = a->flag;
    char *at = (char *)dst + f->offset;
    if (f->kind == CDDP_FLAG_BOOL) {
        *(bool *)at = a->text != NULL;
        return 0;
    }
    if (a->text == NULL)
        return 0;
    int rc;
    switch (f->kind) {
    case CDDP_FLAG_STRING:
        *(const char **)at = a->text;
        return 0;
    case CDDP_FLAG_INT: {
        long v;
        rc = cddp_parse_long(a->text, (long)f->min, (long)f->max, &v);
        if (rc)
            return cddp_fail(err, errlen, rc, "%s: '%s' is not %s", a->name, a->text, f->what);
        *(int *)at = (int)v;
        return 0;
    }
    case CDDP_FLAG_DOUBLE:
        if (cddp_parse_double(a->text, f->min, f->max, (double *)at) != 0)
            return cddp_fail(err, errlen, CDDP_EPARSE, "%s: '%s' is not %s", a->name, a->text,
                             f->what);
        return 0;
    case CDDP_FLAG_CHOICE:
        if ((rc = cddp_flag_choose(a, f->choices, err, errlen)))
            return rc;
        *(const char **)at = a->text;
        return 0;
    default:
        return 0; /* CDDP_FLAG_ACTION */
    }
}

int cddp_flags_convert(const struct cddp_flags *spec, const struct cddp_flag_seen *seen, void *dst,
                       void *ctx, char *err, size_t errlen)
{
    for (size_t i = 0; i < spec->n; i++) {
        struct cddp_flag_arg a = cddp_flags_arg(spec, seen, i);
        int rc = spec->rows[i].kind == CDDP_FLAG_CUSTOM
                     ? spec->rows[i].convert(&a, dst, ctx, err, errlen)
                     : convert_builtin(&a, dst, err, errlen);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- --help ------------------------------------------------------------- */

/* argparse's HelpFormatter: help starts at this column; a row's spellings
 * longer than it leaves room for put the help on the next line. */
#define HELP_COLUMN 24
#define USAGE_WIDTH 80

const char *cddp_flag_shown_name(const struct cddp_flag *f)
{
    if (f->alias && strchr(f->name, '_') && !strchr(f->alias, '_'))
        return f->alias;
    return f->name;
}

/* " METAVAR" (with its space) of a row that takes a value, else "". */
static void metavar_of(const struct cddp_flag *f, char *out, size_t len)
{
    out[0] = '\0';
    if (takes_no_value(f))
        return;
    if (f->metavar) {
        snprintf(out, len, " %s", f->metavar);
    } else if (f->kind == CDDP_FLAG_CHOICE && f->choices) {
        size_t n = (size_t)snprintf(out, len, " {");
        for (const char *const *c = f->choices; *c && n < len; c++)
            n += (size_t)snprintf(out + n, len - n, "%s%s", c == f->choices ? "" : ",", *c);
        if (n < len)
            snprintf(out + n, len - n, "}");
    } else {
        prefixed_name(" ", f->name, out, len);
    }
}

/* The usage line: one item per row ("[-r STD]", "[--nnodes NNODES]"),
 * wrapped under the first item. */
static void print_usage(const struct cddp_flags *spec, FILE *out)
{
    char head[64];
    int indent = snprintf(head, sizeof(head), "usage: %s ", spec->program);
    fputs(head, out);
    int col = indent;
    bool first = true;
    for (size_t i = 0; i <= spec->n; i++) {
        char item[256], mv[200];
        if (i == spec->n) {
            if (spec->usage_args == NULL)
                break;
            snprintf(item, sizeof(item), "%s", spec->usage_args);
        } else {
            const struct cddp_flag *f = &spec->rows[i];
            metavar_of(f, mv, sizeof(mv));
            if (f->short_name)
                snprintf(item, sizeof(item), "[-%c%s]", f->short_name, mv);
            else
                snprintf(item, sizeof(item), "[%s%s]", cddp_flag_shown_name(f), mv);
        }
        int w = (int)strlen(item);
        if (!first && col + 1 + w > USAGE_WIDTH) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (!first) {
            fputc(' ', out);
            col++;
        }
        fputs(item, out);
        col += w;
        first = false;
    }
    fputc('\n', out);
}

/* "  -r, --redirects STD   help", continuation lines at HELP_COLUMN. */
static void print_row(const struct cddp_flag *f, FILE *out)
{
    char inv[256], mv[200];
    metavar_of(f, mv, sizeof(mv));
    if (f->short_name)
        snprintf(inv, sizeof(inv), "-%c, %s%s", f->short_name, cddp_flag_shown_name(f), mv);
    else
        snprintf(inv, sizeof(inv), "%s%s", cddp_flag_shown_name(f), mv);
    int w = 2 + (int)strlen(inv);
    fprintf(out, "  %s", inv);
    const char *h = f->help ? f->help : "";
    if (*h == '\0') {
        fputc('\n', out);
        return;
    }
    if (w > HELP_COLUMN - 2)
        fprintf(out, "\n%*s", HELP_COLUMN, "");
    else
        fprintf(out, "%*s", HELP_COLUMN - w, "");
    for (; *h; h++) {
        fputc(*h, out);
        if (*h == '\n' && h[1])
            fprintf(out, "%*s", HELP_COLUMN, "");
    }
    fputc('\n', out);
}

void cddp_flags_help(const struct cddp_flags *spec, const char *about, const char *epilogue,
                     FILE *out)
{
    print_usage(spec, out);
    if (about)
        fprintf(out, "\n%s", about);
    const char *group = NULL;
    for (size_t i = 0; i < spec->n; i++) {
        const struct cddp_flag *f = &spec->rows[i];
        const char *g = f->group ? f->group : "options:";
        if (group == NULL || strcmp(g, group) != 0) {
            fprintf(out, "\n%s\n", g);
            group = g;
        }
        print_row(f, out);
    }
    if (epilogue)
        fprintf(out, "\n%s", epilogue);
}
