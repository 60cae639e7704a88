/*
 * main.c: cddprun, torchrun's command line over the cddp agent.
 *
 *   cddprun --nproc_per_node=4 train.py --lr 0.1
 *
 * Parses (launcher/cli.c), prepares the agent's environment as torchrun does
 * (OMP_NUM_THREADS, TORCHELASTIC_SIGNALS_TO_HANDLE), opens the status port
 * (agent/status.c), then runs the agent (agent/agent.c) with the status
 * module's hooks and exits with its status.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "agent/agent.h"
#include "agent/status.h"
#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/fdlimit.h"
#include "common/log.h"
#include "launcher/cli.h"

extern char **environ;

/* VmHWM: this process image's own peak. (getrusage's ru_maxrss also counts
 * the image before exec, e.g. a Python parent's pages copied by fork.) */
static long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL)
        return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kib;
}

int main(int argc, char **argv)
{
    cddp_log_init("cddprun");
    struct launch_config cfg;
    char err[1024] = "";
    int rc = launch_parse(argc, argv, environ, &launch_system_probe, &cfg, err, sizeof(err));
    if (rc == LAUNCH_PARSED_HELP) {
        launch_print_help(stdout);
        launch_config_free(&cfg);
        return CDDP_EXIT_OK;
    }
    if (rc == LAUNCH_PARSED_VERSION) {
        printf("cddprun %s (torchrun-compatible)\n", CDDP_VERSION);
        launch_config_free(&cfg);
        return CDDP_EXIT_OK;
    }
    if (rc == 0)
        rc = launch_validate(&cfg, err, sizeof(err));
    if (rc == 0)
        rc = launch_resolve(&cfg, environ, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "cddprun: error: %s\n", err);
        launch_config_free(&cfg);
        return CDDP_EXIT_USAGE;
    }

    for (int i = 0; i < cfg.nnotes; i++)
        log_warn("L2001", "%s", cfg.notes[i]);
    /* Said once: which Python every worker (and every restart) runs. */
    if (cfg.kind != LAUNCH_BINARY)
        log_info("L0004", "workers' Python: %s (from %s)", cfg.program, cfg.python_from);
    if (cfg.status_linger_ignored)
        log_warn("L0003",
                 "%s=%s has no effect without a status port (--status_port or "
                 "CDDP_STATUS_PORT); ignored",
                 cfg.status_linger_src, cfg.status_linger_arg);

    /* run.py: OMP_NUM_THREADS=1 for the workers when unset and nproc > 1. */
    if (getenv("OMP_NUM_THREADS") == NULL && cfg.nproc_per_node > 1) {
        log_warn("L0001", "\n*****************************************\n"
                          "Setting OMP_NUM_THREADS environment variable for each process to be 1 "
                          "in default, to avoid your system being overloaded, please further tune "
                          "the variable for optimal performance in your application as needed. \n"
                          "*****************************************");
        setenv("OMP_NUM_THREADS", "1", 1);
    }
    /* launcher/api.py exports the list for the agent; workers inherit it. */
    setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", cfg.signals_arg, 1);

    /* Pipes and log files per worker, a socket per status client: the
     * soft limit most shells give (1024) is not enough for a big node.
     * The workers get the old limit back (common/fdlimit.h). */
    cddp_fdlimit_raise(NULL);

    /* The status port listens before anything starts, so a port in use or an
     * address that does not resolve is reported before any worker runs. */
    struct agent_status *status = NULL;
    rc = agent_status_new(&cfg, CDDP_VERSION, &status, err, sizeof(err));
    if (rc != 0) {
        if (cfg.status_port >= 0)
            fprintf(stderr, "cddprun: error: --status_port=%d: %s\n", cfg.status_port, err);
        else
            fprintf(stderr, "cddprun: error: %s\n", err);
        launch_config_free(&cfg);
        return rc == CDDP_EPARSE ? CDDP_EXIT_USAGE : CDDP_EXIT_FAILURE;
    }
    struct agent_hooks hooks;
    agent_status_hooks(status, &hooks);
    int code = agent_run(&cfg, &hooks);
    agent_status_linger(status, &cfg);
    agent_status_free(status);
    launch_config_free(&cfg);
    if (cddp_log_enabled(CDDP_LOG_DEBUG))
        log_debug("L0002", "exit status %d, peak RSS %ld KiB", code, peak_rss_kib());
    return code;
}
