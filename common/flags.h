/*
 * flags.h: a command line declared as a table, parsed the way Python's
 * argparse parses torchrun's.
 *
 * Each row names one flag: its spellings (a name, another long spelling,
 * an optional short letter), whether it takes a value, where a value comes
 * from when the command line has none (a variable of its own, then the
 * table's prefixed variable such as PET_NPROC_PER_NODE, then a built-in
 * default text), and how the text becomes a value: a converter and a
 * destination (an offset into the caller's struct).
 *
 * Parsing runs in three steps, so that an error names exactly what the user
 * wrote:
 *   cddp_flags_scan()     walks argv: options until the first positional or
 *                         `--`, --name=value and --name value, unique
 *                         prefixes (when the table allows them), -r3, -r=3,
 *                         -r 3 and short booleans run together (-mh); "-5"
 *                         and "-1.5" are values, not options. It records the
 *                         raw text of each flag and the spelling typed.
 *   cddp_flags_defaults() fills the rest from the environment and the
 *                         built-in defaults.
 *   cddp_flags_convert()  runs each row's converter, in table order (a
 *                         converter may read what earlier rows stored).
 * Nothing is allocated: texts point into argv and envp, which must outlive
 * the result. Every error is one line in err; the functions return 0 or a
 * negative cddp error code (common/errors.h).
 */
#ifndef CDDP_COMMON_FLAGS_H
#define CDDP_COMMON_FLAGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

enum cddp_flag_kind {
    CDDP_FLAG_BOOL,   /* takes no value; bool at offset: given or not */
    CDDP_FLAG_STRING, /* const char * at offset: the text (left alone when unset) */
    CDDP_FLAG_INT,    /* int at offset: an integer in [min, max] */
    CDDP_FLAG_DOUBLE, /* double at offset: a finite number in [min, max] */
    CDDP_FLAG_CHOICE, /* const char * at offset: one of choices */
    CDDP_FLAG_CUSTOM, /* takes a value; convert() stores it */
    CDDP_FLAG_ACTION, /* takes no value, stores nothing: the caller reads seen[] (--help) */
};

struct cddp_flag;

/* One flag's text and where it came from, as a converter sees it. */
struct cddp_flag_arg {
    const struct cddp_flag *flag;
    const char *text;   /* NULL: not given and no default */
    const char *source; /* the option as typed ("--nproc_per_node", "-r"), the
                         * variable ("PET_NNODES"), or NULL for the default */
    const char *name;   /* what an error names: source, or the flag's name */
};

/* Converts a->text (which may be NULL) into dst (the caller's struct), with
 * ctx as given to cddp_flags_convert(). 0 or a negative code with err. */
typedef int (*cddp_flag_convert_fn)(const struct cddp_flag_arg *a, void *dst, void *ctx, char *err,
                                    size_t errlen);

struct cddp_flag {
    const char *name;  /* "--nproc_per_node": the spelling errors use */
    const char *alias; /* another long spelling ("--nproc-per-node"), or NULL */
    char short_name;   /* 'r' for -r, or 0 */
    enum cddp_flag_kind kind;
    size_t offset;      /* the destination in the caller's struct */
    const char *env;    /* a variable of its own (CDDP_STATUS_PORT), read first, or NULL */
    bool prefixed_env;  /* the table's env_prefix + the name upper-cased is a default */
    const char *defval; /* the built-in default text; NULL: unset */
    double min, max;    /* INT and DOUBLE */
    const char *what;   /* INT and DOUBLE: "an integer >= 0", for "NAME: 'TEXT' is not WHAT" */
    const char *const *choices;   /* CHOICE: NULL-terminated */
    cddp_flag_convert_fn convert; /* CUSTOM */
    /* --help (cddp_flags_help): */
    const char *metavar; /* the value's name ("N"); NULL: {a,b,c} for a CHOICE, else
                          * the name upper-cased ("NPROC_PER_NODE") */
    const char *group;   /* the section it is listed under, as its heading (more lines
                          * after the first are a paragraph under it); NULL: "options:" */
    const char *help;    /* '\n' continues on the next line, indented */
};

struct cddp_flags {
    const struct cddp_flag *rows;
    size_t n;
    const char *program;    /* for "(see PROGRAM --help)" */
    bool prefixes;          /* argparse's unique-prefix abbreviations */
    bool positionals;       /* a positional ends the options; else it is unknown */
    bool name_as_typed;     /* errors name the spelling typed; else always the name */
    const char *env_prefix; /* "PET_" for rows with prefixed_env */
    const char *usage_args; /* --help: after the options in the usage line ("SCRIPT ...") */
};

/* The raw result of a scan, one per row (the caller's array of spec->n). */
#define CDDP_FLAG_ENV_MAX 48
struct cddp_flag_seen {
    const char *text;                 /* the value; "1" for a boolean given; NULL: none */
    const char *source;               /* as in struct cddp_flag_arg */
    char env_name[CDDP_FLAG_ENV_MAX]; /* storage for a prefixed variable's name */
    char short_src[3];                /* storage for "-r" */
};

/* What a scan refused, for programs that word their own messages. */
enum cddp_flags_problem_kind {
    CDDP_FLAGS_UNKNOWN = 1,    /* no such option (or a positional where none is allowed) */
    CDDP_FLAGS_AMBIGUOUS,      /* a prefix of several */
    CDDP_FLAGS_NEEDS_VALUE,    /* the value is missing */
    CDDP_FLAGS_TAKES_NO_VALUE, /* --bool=x */
    CDDP_FLAGS_EXTRA,          /* cddp_flags_scan_mixed: more positionals than it takes */
};
struct cddp_flags_problem {
    enum cddp_flags_problem_kind kind;
    const char *arg; /* the argv element at fault */
};

/*
 * Walks argv (argv[0] is the program) into seen (zeroed first). On success
 * *first_positional is the index of the first positional (argc when none).
 * On error: CDDP_EPARSE, a message in err ("unrecognized argument: --x
 * (see PROGRAM --help)", "ambiguous option: ...", "--x expects a value",
 * "--x takes no value (got 'v')"), and *problem (which may be NULL).
 */
int cddp_flags_scan(const struct cddp_flags *spec, int argc, char **argv,
                    struct cddp_flag_seen *seen, int *first_positional,
                    struct cddp_flags_problem *problem, char *err, size_t errlen);

/*
 * As cddp_flags_scan, for a command line whose positionals may stand
 * between the options, as argparse's default parser allows (cddpctl status
 * HOST:PORT --json): every positional, and everything after `--`, goes to
 * pos[] in order (*npos of them). One more than maxpos is CDDP_EPARSE
 * ("unexpected argument: X (see PROGRAM --help)", CDDP_FLAGS_EXTRA). The
 * table's positionals setting is not read.
 */
int cddp_flags_scan_mixed(const struct cddp_flags *spec, int argc, char **argv,
                          struct cddp_flag_seen *seen, const char **pos, int maxpos, int *npos,
                          struct cddp_flags_problem *problem, char *err, size_t errlen);

/* Fills what the command line left unset: the row's own variable, then the
 * prefixed one, then the default text. A boolean's variable must be an
 * integer (torchrun's check_env: bool(int(PET_X))). envp may be NULL. */
int cddp_flags_defaults(const struct cddp_flags *spec, char **envp, struct cddp_flag_seen *seen,
                        char *err, size_t errlen);

/* Runs each row's converter in table order, storing into dst. Stops at the
 * first error. */
int cddp_flags_convert(const struct cddp_flags *spec, const struct cddp_flag_seen *seen, void *dst,
                       void *ctx, char *err, size_t errlen);

/* The argument a converter of row i would get (for checks after conversion). */
struct cddp_flag_arg cddp_flags_arg(const struct cddp_flags *spec,
                                    const struct cddp_flag_seen *seen, size_t i);

/* a->text must be one of choices (NULL-terminated): 0, or CDDP_EPARSE with
 * "NAME: invalid choice 'TEXT' (choose from A, B, C)". */
int cddp_flag_choose(const struct cddp_flag_arg *a, const char *const *choices, char *err,
                     size_t errlen);

/*
 * Writes --help to out, every row of the table in it:
 *
 *     usage: PROGRAM [-h] [--version] [--flag METAVAR] ... USAGE_ARGS
 *     <about>
 *     options:
 *       -h, --help            help
 *       --flag METAVAR        help, at column 24 (on the next line when the
 *                             spellings are longer)
 *
 *     <group>
 *       ...
 *     <epilogue>
 *
 * The usage line is wrapped at 80 columns, as argparse does; a row shows
 * its short letter and one long spelling (of two, the one with dashes,
 * torch 2.x's: --nproc-per-node). Rows are listed in table order, and a
 * heading is written where the group changes, so a group's rows must be
 * neighbours. A blank line comes before about, before each heading and
 * before the epilogue; about and epilogue (NULL: none) are written as
 * they are and should end with a newline.
 */
void cddp_flags_help(const struct cddp_flags *spec, const char *about, const char *epilogue,
                     FILE *out);

/* The long spelling --help shows for row f (see cddp_flags_help). */
const char *cddp_flag_shown_name(const struct cddp_flag *f);

/* The value of name in envp ("NAME=value"), or NULL. */
const char *cddp_flags_getenv(char **envp, const char *name);

#endif
