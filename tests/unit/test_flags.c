/* Unit tests for common/flags.c: the table-driven command line parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/flags.h"

struct opts {
    int jobs;
    double rate;
    const char *mode;
    const char *name;
    bool verbose;
    bool dry;
    int twice; /* set by the custom converter: jobs * 2, so it runs after --jobs */
    const char *custom_src;
};

/* Reads what an earlier row stored and the context. */
static int conv_twice(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err, size_t errlen)
{
    struct opts *o = dst;
    if (a->text == NULL)
        return 0;
    if (strcmp(a->text, "bad") == 0) {
        snprintf(err, errlen, "%s: bad (%s)", a->name, (const char *)ctx);
        return CDDP_ECONFIG;
    }
    o->twice = o->jobs * 2;
    o->custom_src = a->source;
    return 0;
}

static const char *const modes[] = {"fast", "slow", NULL};

enum { O_JOBS, O_RATE, O_MODE, O_NAME, O_VERBOSE, O_DRY, O_TWICE, O_HELP, O_COUNT };

static const struct cddp_flag rows[O_COUNT] = {
    [O_JOBS] = {"--num_jobs", "--num-jobs", 'j', CDDP_FLAG_INT, offsetof(struct opts, jobs),
                .prefixed_env = true, .defval = "1", .min = 1, .max = 64,
                .what = "a number of jobs (1-64)"},
    [O_RATE] = {"--rate", NULL, 0, CDDP_FLAG_DOUBLE, offsetof(struct opts, rate), .env = "MY_RATE",
                .prefixed_env = true, .defval = "0.5", .min = 0, .max = 1, .what = "a fraction"},
    [O_MODE] = {"--mode", NULL, 0, CDDP_FLAG_CHOICE, offsetof(struct opts, mode), .defval = "fast",
                .choices = modes},
    [O_NAME] = {"--name", NULL, 0, CDDP_FLAG_STRING, offsetof(struct opts, name)},
    [O_VERBOSE] = {"--verbose", NULL, 'v', CDDP_FLAG_BOOL, offsetof(struct opts, verbose),
                   .prefixed_env = true},
    [O_DRY] = {"--dry_run", "--dry-run", 'n', CDDP_FLAG_BOOL, offsetof(struct opts, dry)},
    [O_TWICE] = {"--twice", NULL, 0, CDDP_FLAG_CUSTOM, .convert = conv_twice},
    [O_HELP] = {"--help", NULL, 'h', CDDP_FLAG_ACTION},
};

static const struct cddp_flags spec = {
    .rows = rows,
    .n = O_COUNT,
    .program = "prog",
    .prefixes = true,
    .positionals = true,
    .name_as_typed = true,
    .env_prefix = "T_",
};

static char err[256];
static struct cddp_flag_seen seen[O_COUNT];
static struct cddp_flags_problem problem;
static int first;

/* Scans argv (NULL-terminated, after the program name). */
static int scan_with(const struct cddp_flags *s, char **argv)
{
    char *all[32] = {(char *)"prog"};
    int argc = 1;
    while (argv[argc - 1])
        all[argc] = argv[argc - 1], argc++;
    memset(&problem, 0, sizeof(problem));
    err[0] = '\0';
    return cddp_flags_scan(s, argc, all, seen, &first, &problem, err, sizeof(err));
}

#define ARGS(...) ((char *[]){__VA_ARGS__, NULL})

/* Scan, defaults and conversion in one go. */
static int parse(struct opts *o, char **envp, char **argv)
{
    memset(o, 0, sizeof(*o));
    int rc = scan_with(&spec, argv);
    if (rc == 0)
        rc = cddp_flags_defaults(&spec, envp, seen, err, sizeof(err));
    if (rc == 0)
        rc = cddp_flags_convert(&spec, seen, o, (void *)"ctx", err, sizeof(err));
    return rc;
}

static void test_spellings_and_values(void **state)
{
    (void)state;
    struct opts o;
    assert_int_equal(parse(&o, NULL, ARGS("--num-jobs=4", "--rate", "0.25", "x")), 0);
    assert_int_equal(o.jobs, 4);
    assert_true(o.rate == 0.25);
    assert_string_equal(o.mode, "fast");
    assert_null(o.name);
    assert_int_equal(first, 4);
    assert_string_equal(seen[O_JOBS].source, "--num-jobs");
    assert_null(seen[O_MODE].source); /* a default */
    assert_int_equal(parse(&o, NULL, ARGS("--num_jobs", "7", "--mode=slow", "--name=")), 0);
    assert_int_equal(o.jobs, 7);
    assert_string_equal(o.mode, "slow");
    assert_string_equal(o.name, "");
    assert_string_equal(seen[O_JOBS].source, "--num_jobs");
    /* The last one wins; -5 is a value, not an option. */
    assert_int_equal(parse(&o, NULL, ARGS("--rate=1", "--rate", "0")), 0);
    assert_true(o.rate == 0);
    assert_int_equal(parse(&o, NULL, ARGS("--name", "-5")), 0);
    assert_string_equal(o.name, "-5");
}

static void test_short_options(void **state)
{
    (void)state;
    struct opts o;
    assert_int_equal(parse(&o, NULL, ARGS("-vn", "-j3")), 0);
    assert_true(o.verbose && o.dry);
    assert_int_equal(o.jobs, 3);
    assert_string_equal(seen[O_JOBS].source, "-j");
    assert_int_equal(parse(&o, NULL, ARGS("-vj=5")), 0);
    assert_int_equal(o.jobs, 5);
    assert_int_equal(parse(&o, NULL, ARGS("-j", "6", "script", "-v")), 0);
    assert_int_equal(o.jobs, 6);
    assert_false(o.verbose); /* after the positional: the script's */
    assert_int_equal(first, 3);
    assert_int_equal(scan_with(&spec, ARGS("-vx")), CDDP_EPARSE);
    assert_string_equal(err, "unrecognized argument: -x (see prog --help)");
    assert_int_equal(problem.kind, CDDP_FLAGS_UNKNOWN);
    assert_int_equal(scan_with(&spec, ARGS("-j")), CDDP_EPARSE);
    assert_string_equal(err, "-j expects a value");
    assert_int_equal(scan_with(&spec, ARGS("-hv")), 0);
    assert_non_null(seen[O_HELP].text);
}

static void test_prefixes(void **state)
{
    (void)state;
    struct opts o;
    assert_int_equal(parse(&o, NULL, ARGS("--num=2", "--ra", "1", "--dry")), 0);
    assert_int_equal(o.jobs, 2);
    assert_true(o.rate == 1);
    assert_true(o.dry);
    /* Both spellings of one flag are one candidate; two flags are not. */
    assert_int_equal(scan_with(&spec, ARGS("--n", "1")), CDDP_EPARSE);
    assert_string_equal(err, "ambiguous option: --n could match --num-jobs, --name");
    assert_int_equal(problem.kind, CDDP_FLAGS_AMBIGUOUS);
    assert_int_equal(scan_with(&spec, ARGS("--bogus")), CDDP_EPARSE);
    assert_string_equal(err, "unrecognized argument: --bogus (see prog --help)");
    assert_int_equal(problem.kind, CDDP_FLAGS_UNKNOWN);
    assert_string_equal(problem.arg, "--bogus");
    struct cddp_flags exact = spec;
    exact.prefixes = false;
    assert_int_equal(scan_with(&exact, ARGS("--num=2")), CDDP_EPARSE);
    assert_int_equal(scan_with(&exact, ARGS("--num-jobs=2")), 0);
}

static void test_scan_errors(void **state)
{
    (void)state;
    assert_int_equal(scan_with(&spec, ARGS("--verbose=1")), CDDP_EPARSE);
    assert_string_equal(err, "--verbose takes no value (got '1')");
    assert_int_equal(problem.kind, CDDP_FLAGS_TAKES_NO_VALUE);
    assert_int_equal(scan_with(&spec, ARGS("--rate", "--verbose")), CDDP_EPARSE);
    assert_string_equal(err, "--rate expects a value");
    assert_int_equal(problem.kind, CDDP_FLAGS_NEEDS_VALUE);
    assert_string_equal(problem.arg, "--rate");
    /* "--" ends the options. */
    assert_int_equal(scan_with(&spec, ARGS("-v", "--", "--rate")), 0);
    assert_int_equal(first, 3);
    /* Without positionals, one is refused, and so is "--". */
    struct cddp_flags strict = spec;
    strict.positionals = false;
    assert_int_equal(scan_with(&strict, ARGS("-v", "file")), CDDP_EPARSE);
    assert_int_equal(problem.kind, CDDP_FLAGS_UNKNOWN);
    assert_string_equal(problem.arg, "file");
    assert_int_equal(scan_with(&strict, ARGS("--")), CDDP_EPARSE);
}

static void test_names_in_errors(void **state)
{
    (void)state;
    struct opts o;
    assert_int_equal(parse(&o, NULL, ARGS("--num-j=99")), CDDP_ERANGE_ARG);
    assert_string_equal(err, "--num-jobs: '99' is not a number of jobs (1-64)");
    assert_int_equal(parse(&o, NULL, ARGS("--num_jobs=x")), CDDP_EPARSE);
    assert_string_equal(err, "--num_jobs: 'x' is not a number of jobs (1-64)");
    assert_int_equal(parse(&o, NULL, ARGS("--rate=2")), CDDP_EPARSE);
    assert_string_equal(err, "--rate: '2' is not a fraction");
    assert_int_equal(parse(&o, NULL, ARGS("--mode=medium")), CDDP_EPARSE);
    assert_string_equal(err, "--mode: invalid choice 'medium' (choose from fast, slow)");
    /* Not as typed: always the name. */
    struct cddp_flags named = spec;
    named.name_as_typed = false;
    assert_int_equal(scan_with(&named, ARGS("--num-jobs=99")), 0);
    assert_string_equal(seen[O_JOBS].source, "--num_jobs");
    /* A default's error names the flag. */
    struct cddp_flag_arg a = cddp_flags_arg(&spec, seen, O_MODE);
    assert_null(a.source);
    assert_string_equal(a.name, "--mode");
}

static void test_environment(void **state)
{
    (void)state;
    struct opts o;
    char *env[] = {(char *)"T_NUM_JOBS=9", (char *)"T_RATE=0.1", (char *)"MY_RATE=0.2",
                   (char *)"T_VERBOSE= 1 ", NULL};
    assert_int_equal(parse(&o, env, ARGS("x")), 0);
    assert_int_equal(o.jobs, 9);
    assert_string_equal(seen[O_JOBS].source, "T_NUM_JOBS");
    assert_true(o.rate == 0.2); /* the row's own variable wins over the prefixed one */
    assert_string_equal(seen[O_RATE].source, "MY_RATE");
    assert_true(o.verbose);
    /* The command line wins over both. */
    assert_int_equal(parse(&o, env, ARGS("--rate=0.3", "-j2")), 0);
    assert_true(o.rate == 0.3);
    assert_int_equal(o.jobs, 2);
    /* A boolean's variable is an integer; 0 leaves it unset (but remembered). */
    char *off[] = {(char *)"T_VERBOSE=0", NULL};
    assert_int_equal(parse(&o, off, ARGS("x")), 0);
    assert_false(o.verbose);
    assert_string_equal(seen[O_VERBOSE].source, "T_VERBOSE");
    char *bad[] = {(char *)"T_VERBOSE=yes", NULL};
    assert_int_equal(parse(&o, bad, ARGS("x")), CDDP_EPARSE);
    assert_string_equal(err, "T_VERBOSE='yes' is not an integer (0 or 1)");
    /* Bad values name the variable. */
    char *badj[] = {(char *)"T_NUM_JOBS=0", NULL};
    assert_int_equal(parse(&o, badj, ARGS("x")), CDDP_ERANGE_ARG);
    assert_string_equal(err, "T_NUM_JOBS: '0' is not a number of jobs (1-64)");
    /* Rows without prefixed_env ignore the prefix. */
    char *dry[] = {(char *)"T_DRY_RUN=1", NULL};
    assert_int_equal(parse(&o, dry, ARGS("x")), 0);
    assert_false(o.dry);
    assert_string_equal(cddp_flags_getenv(env, "MY_RATE"), "0.2");
    assert_null(cddp_flags_getenv(env, "MY_RAT"));
    assert_null(cddp_flags_getenv(NULL, "MY_RATE"));
}

static void test_custom_converter(void **state)
{
    (void)state;
    struct opts o;
    assert_int_equal(parse(&o, NULL, ARGS("--twice=1", "-j", "21")), 0);
    assert_int_equal(o.twice, 42); /* table order: --num_jobs converted first */
    assert_string_equal(o.custom_src, "--twice");
    assert_int_equal(parse(&o, NULL, ARGS("--twice=bad")), CDDP_ECONFIG);
    assert_string_equal(err, "--twice: bad (ctx)");
    /* The first error stops the conversion: --twice is not reached. */
    assert_int_equal(parse(&o, NULL, ARGS("--rate=5", "--twice=1")), CDDP_EPARSE);
    assert_int_equal(o.twice, 0);
}

/* --help from a table: the usage line wrapped at 80 columns, metavars
 * (given, a choice's {a,b}, or the name upper-cased), the dashed spelling
 * of two, help at column 24 or on the next line, continuation lines,
 * group headings where the group changes. */
static void test_help(void **state)
{
    (void)state;
    static const char *const colours[] = {"red", "green", NULL};
    static const struct cddp_flag help_rows[] = {
        {"--help", NULL, 'h', CDDP_FLAG_ACTION, .help = "show this help and exit"},
        {"--num_jobs", "--num-jobs", 'j', CDDP_FLAG_INT, .metavar = "N", .help = "jobs"},
        {"--colour", NULL, 0, CDDP_FLAG_CHOICE, .choices = colours,
         .help = "a colour,\nsaid twice"},
        {"--a-rather-long-option-name", NULL, 0, CDDP_FLAG_STRING, .help = "long"},
        {"--quiet", NULL, 0, CDDP_FLAG_BOOL, .group = "more:\nsome words"},
        {"--port-number", "--port_number", 0, CDDP_FLAG_INT, .group = "more:\nsome words",
         .help = "a port"},
    };
    const struct cddp_flags s = {.rows = help_rows,
                                 .n = sizeof(help_rows) / sizeof(help_rows[0]),
                                 .program = "prog",
                                 .usage_args = "script ..."};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    cddp_flags_help(&s, "about\n", "the end\n", f);
    fclose(f);
    assert_string_equal(
        text, "usage: prog [-h] [-j N] [--colour {red,green}]\n"
              "            [--a-rather-long-option-name A_RATHER_LONG_OPTION_NAME] [--quiet]\n"
              "            [--port-number PORT_NUMBER] script ...\n"
              "\n"
              "about\n"
              "\n"
              "options:\n"
              "  -h, --help            show this help and exit\n"
              "  -j, --num-jobs N      jobs\n"
              "  --colour {red,green}  a colour,\n"
              "                        said twice\n"
              "  --a-rather-long-option-name A_RATHER_LONG_OPTION_NAME\n"
              "                        long\n"
              "\n"
              "more:\n"
              "some words\n"
              "  --quiet\n"
              "  --port-number PORT_NUMBER\n"
              "                        a port\n"
              "\n"
              "the end\n");
    assert_string_equal(cddp_flag_shown_name(&help_rows[1]), "--num-jobs");
    assert_string_equal(cddp_flag_shown_name(&help_rows[5]), "--port-number");
    free(text);
}

/* Positionals between the options (cddpctl's command line). */
static void test_scan_mixed(void **state)
{
    (void)state;
    char *argv[] = {"prog", "status", "-v", "h:1", "--num-jobs", "3", "x", "--", "-j", NULL};
    const char *pos[4];
    int npos = -1;
    assert_int_equal(
        cddp_flags_scan_mixed(&spec, 9, argv, seen, pos, 4, &npos, &problem, err, sizeof(err)), 0);
    assert_int_equal(npos, 4);
    assert_string_equal(pos[0], "status");
    assert_string_equal(pos[1], "h:1");
    assert_string_equal(pos[2], "x");
    assert_string_equal(pos[3], "-j"); /* after --: a positional */
    assert_string_equal(seen[O_JOBS].text, "3");
    assert_non_null(seen[O_VERBOSE].text);
    /* One too many. */
    assert_int_equal(
        cddp_flags_scan_mixed(&spec, 9, argv, seen, pos, 3, &npos, &problem, err, sizeof(err)),
        CDDP_EPARSE);
    assert_int_equal(problem.kind, CDDP_FLAGS_EXTRA);
    assert_string_equal(problem.arg, "-j");
    assert_string_equal(err, "unexpected argument: -j (see prog --help)");
    /* Option errors as cddp_flags_scan's. */
    char *bad[] = {"prog", "a", "--bogus", NULL};
    assert_int_equal(
        cddp_flags_scan_mixed(&spec, 3, bad, seen, pos, 4, &npos, &problem, err, sizeof(err)),
        CDDP_EPARSE);
    assert_int_equal(problem.kind, CDDP_FLAGS_UNKNOWN);
    assert_string_equal(problem.arg, "--bogus");
    char *novalue[] = {"prog", "a", "--name", NULL};
    assert_int_equal(
        cddp_flags_scan_mixed(&spec, 3, novalue, seen, pos, 4, &npos, &problem, err, sizeof(err)),
        CDDP_EPARSE);
    assert_int_equal(problem.kind, CDDP_FLAGS_NEEDS_VALUE);
    /* "-" and "-5" are positionals. */
    char *dash[] = {"prog", "-", "-5", NULL};
    assert_int_equal(
        cddp_flags_scan_mixed(&spec, 3, dash, seen, pos, 4, &npos, &problem, err, sizeof(err)), 0);
    assert_int_equal(npos, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spellings_and_values), cmocka_unit_test(test_help),
        cmocka_unit_test(test_short_options),        cmocka_unit_test(test_prefixes),
        cmocka_unit_test(test_scan_errors),          cmocka_unit_test(test_names_in_errors),
        cmocka_unit_test(test_environment),          cmocka_unit_test(test_custom_converter),
        cmocka_unit_test(test_scan_mixed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
