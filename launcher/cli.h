/*
 * cli.h: torchrun's command line -> struct launch_config.
 *
 * Every torchrun flag in both spellings (--nproc-per-node, --nproc_per_node),
 * the same defaults, PET_<NAME> environment defaults (command line > PET_* >
 * default), argparse's unique-prefix abbreviations, then the entrypoint and
 * its arguments. Every bad input is one line in err naming the flag (or the
 * PET_ variable) and the problem; the caller prints it and exits 2.
 */
#ifndef CDDP_LAUNCHER_CLI_H
#define CDDP_LAUNCHER_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "agent/config.h"
#include "common/flags.h"

/* launch_parse() returns these (positive) when there is nothing to run. */
enum {
    LAUNCH_PARSED_HELP = 1,
    LAUNCH_PARSED_VERSION = 2,
};

/* Host facts --nproc_per_node=cpu|gpu|auto need; tests pass their own. */
struct launch_probe {
    long (*cpu_count)(void);
    long (*gpu_count)(void); /* CUDA devices visible to this process */
};

/* The machine's own counts (sysconf; /proc/driver/nvidia and CUDA_VISIBLE_DEVICES). */
extern const struct launch_probe launch_system_probe;

/*
 * Parses argv (argv[0] is the program) with envp for PET_* defaults and
 * PYTHON_EXEC. Fills cfg (zeroed first; free with launch_config_free() even
 * on error). Returns 0, LAUNCH_PARSED_HELP, LAUNCH_PARSED_VERSION, or a
 * negative code with a one-line reason in err. Touches no file; see
 * launch_resolve().
 */
int launch_parse(int argc, char **argv, char **envp, const struct launch_probe *probe,
                 struct launch_config *cfg, char *err, size_t errlen);

/*
 * Forms the worker command (cfg->kind, program, argv) from the entrypoint:
 * a .py file runs as `python3 -u script`, -m as `python3 -u -m module`,
 * --no_python or an executable that is not a .py file runs directly. The
 * Python is PYTHON_EXEC (in envp), else the python3 of the environment
 * this cddprun is installed in (launch_python_beside of /proc/self/exe),
 * else python3 on PATH; cfg->python_from says which. Checks that what will
 * be executed exists and is executable, and that --log_dir is not a file.
 * 0 or a negative code with a one-line reason in err.
 */
int launch_resolve(struct launch_config *cfg, char **envp, char *err, size_t errlen);

/*
 * The python3 beside the program at exe (an absolute path) when that
 * program lives in a Python environment's bin/: a venv (pyvenv.cfg in the
 * directory above, PEP 405) or a conda environment (conda-meta/ there), as
 * pip installs cddprun. Returns an owned path (free it), or NULL: not in
 * an environment, or no executable python3 there.
 */
char *launch_python_beside(const char *exe);

/* Refuses, by name, what this build parses but cannot honour (the etcd
 * backends, --standalone with several nodes, a MIN:MAX static run, ...),
 * and derives the rendezvous endpoint (c10d, --standalone) or the static
 * master address and port. 0 or a negative code with err. */
int launch_validate(struct launch_config *cfg, char *err, size_t errlen);

/* cddprun --help, written from the flags table: every flag is in it. */
void launch_print_help(FILE *out);

/* The flags table (common/flags.h), for the tests. */
const struct cddp_flags *launch_flags_table(void);

#endif
