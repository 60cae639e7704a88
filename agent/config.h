/*
 * config.h: what the launcher hands the agent (struct launch_config).
 *
 * launcher/cli.c fills it from torchrun's command line and the PET_*
 * environment; agent_run() consumes it. It is the agent's input, so it is
 * declared here, below the launcher: agent/ never includes launcher/ (a
 * second front end, or a test, fills it without the command line). Strings point into argv/environ
 * (alive for the whole process) unless a comment says the config owns them;
 * launch_config_free() releases what it owns.
 */
#ifndef CDDP_AGENT_CONFIG_H
#define CDDP_AGENT_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/watchdog.h"

/* torchrun's Std flags: which of a worker's streams go to files. */
enum launch_std {
    LAUNCH_STD_NONE = 0,
    LAUNCH_STD_OUT = 1,
    LAUNCH_STD_ERR = 2,
    LAUNCH_STD_ALL = 3,
};

/* -r/--redirects and -t/--tee: one value for every local rank ("3"), or a map
 * of single-digit local ranks ("0:1,1:2"); ranks not in a map get NONE. */
#define LAUNCH_STD_MAP_RANKS 10
struct launch_std_spec {
    bool is_map;
    uint8_t all;                        /* when !is_map */
    uint8_t rank[LAUNCH_STD_MAP_RANKS]; /* when is_map */
};

/* How the worker command is formed from the entrypoint. */
enum launch_kind {
    LAUNCH_BINARY,        /* --no_python, or an executable that is not a .py file */
    LAUNCH_PYTHON_SCRIPT, /* python3 -u script args */
    LAUNCH_PYTHON_MODULE, /* python3 -u -m module args */
    LAUNCH_RUN_PATH,      /* --run_path: runpy.run_path(script) under an error recorder */
};

struct launch_kv {
    const char *key;
    const char *value;
};

#define LAUNCH_MAX_SIGNALS 32

struct launch_config {
    /* --nnodes N or MIN:MAX */
    int nnodes_min;
    int nnodes_max;
    const char *nnodes_arg;
    /* --nproc_per_node: the resolved count, and the text as given */
    int nproc_per_node;
    const char *nproc_arg;

    /* rendezvous */
    const char *rdzv_backend; /* static, c10d, etcd, etcd-v2 */
    const char *rdzv_endpoint;
    /* What errors about the endpoint name: the option as typed, or the
     * variable it came from (PET_RDZV_ENDPOINT, a SLURM_* one). */
    char rdzv_endpoint_src[48];
    const char *rdzv_id;         /* run id; "" means generate one */
    struct launch_kv *rdzv_conf; /* owned */
    int rdzv_conf_len;
    char *rdzv_conf_buf; /* owned: the split copy rdzv_conf points into */
    bool standalone;
    /* c10d (and --standalone): the endpoint, parsed by launch_validate
     * (default port 29400; brackets removed from IPv6) */
    char rdzv_host[256];
    int rdzv_port;
    /* whether --rdzv_backend / --node_rank were given (command line or
     * PET_*): without them a multi-node run uses c10d (launch_validate) */
    bool rdzv_backend_set;
    bool node_rank_set;

    int max_restarts;
    double monitor_interval; /* accepted; exits are events here, not polled */
    const char *start_method;
    const char *event_log_handler;
    const char *role;

    bool module;
    bool no_python;
    bool run_path;

    /* logs */
    const char *log_dir; /* NULL: a temporary directory, as torchrun */
    struct launch_std_spec redirects;
    struct launch_std_spec tee;
    long *ranks_filter; /* owned; NULL: every rank is shown */
    int ranks_filter_len;

    /* static rendezvous */
    int node_rank;
    const char *master_addr;
    int master_port;
    const char *local_addr; /* NULL when unset */
    /* static backend: MASTER_ADDR/MASTER_PORT from --rdzv_endpoint, else
     * --master_addr:--master_port, parsed as torch does (launch_validate) */
    char static_addr[256];
    int static_port;

    /* flags parsed so they can be refused by name */
    const char *logs_specs;
    const char *numa_binding;

    /* --signals_to_handle, in the order given */
    int signals[LAUNCH_MAX_SIGNALS];
    int nsignals;
    const char *signals_arg;

    /* The status port (docs/status.md): --status_port (CDDP_STATUS_PORT),
     * --status_addr (CDDP_STATUS_ADDR), --status_linger (CDDP_STATUS_LINGER). */
    int status_port;         /* -1: no status port; 0: any free port */
    const char *status_addr; /* default 127.0.0.1 */
    double status_linger_s;  /* keep serving the final status this long after the run */
    /* Where --status_linger came from: the option as typed, or the variable
     * (CDDP_STATUS_LINGER, PET_STATUS_LINGER); and its text as given. */
    const char *status_linger_src;
    const char *status_linger_arg;
    char status_linger_var[48]; /* holds status_linger_src when it is a PET_ name */
    /* Set by launch_validate: a linger from the environment without a status
     * port was dropped (cddprun warns; one typed on the command line is refused). */
    bool status_linger_ignored;

    /* --agent_store (CDDP_AGENT_STORE, PET_AGENT_STORE; default true): node
     * 0's agent serves the workers' TCPStore on MASTER_ADDR:MASTER_PORT, one
     * per round, and TORCHELASTIC_USE_AGENT_STORE=True (torchrun 2.x);
     * false: the workers' rank 0 serves it (False). */
    bool agent_store;
    /* The progress watchdog (docs/cli.md): --watchdog_timeout (off, auto or
     * seconds), --watchdog_initial, --watchdog_warmup, --watchdog_safety,
     * --watchdog_floor. */
    struct watchdog_config watchdog;
    double watchdog_safety; /* as parsed; copied into watchdog.safety */
    int watchdog_warmup;    /* as parsed; copied into watchdog.warmup */
    double watchdog_floor;  /* --watchdog_floor, seconds; copied into watchdog.floor_ms */
    /* --max_no_progress_restarts (agent/policy.h); 0: off */
    int max_no_progress_restarts;
    /* --restart_scope (CDDP_RESTART_SCOPE, PET_RESTART_SCOPE): "group"
     * (default, torchrun's) or "worker" (agent/policy.h; docs/distributed.md
     * "Recovering in place"). */
    const char *restart_scope;
    /* --spare_workers (CDDP_SPARE_WORKERS, PET_SPARE_WORKERS): warm spare
     * processes kept per node under --restart_scope=worker (agent/spare.c;
     * docs/distributed.md "Warm spares"); 0: none. */
    int spare_workers;
    /* --no_auto_progress (CDDP_NO_AUTO_PROGRESS, PET_NO_AUTO_PROGRESS): no
     * bootstrap folder on a Python worker's PYTHONPATH. */
    bool no_auto_progress;
    /* The bootstrap folder (launch_resolve: owned; NULL when off, for a
     * program, or not found): put first on a Python worker's PYTHONPATH,
     * its sitecustomize reports the optimizer's steps. */
    char *auto_progress_dir;
    /* --straggler_factor (CDDP_STRAGGLER_FACTOR): a rank this many times
     * slower than the node's median is named (agent/stragglers.c); 0: off. */
    double straggler_factor;
    /* --no_ifname (CDDP_NO_IFNAME, PET_NO_IFNAME): leave GLOO_SOCKET_IFNAME and
     * NCCL_SOCKET_IFNAME alone (agent/ifname.h) */
    bool no_ifname;

    /* From the environment (envp at parse time). */
    uint64_t shutdown_timeout_ms; /* TORCH_ELASTIC_SHUTDOWN_TIMEOUT, default 30 s */
    const char *prefix_template;  /* TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, or NULL */
    const char *error_file;       /* the agent's own TORCHELASTIC_ERROR_FILE, or NULL */

    /* CDDP_EXIT_BARRIER_TIMEOUT: torch's exit_barrier_timeout, default 300 s */
    uint64_t exit_barrier_timeout_ms;

    /* the entrypoint as typed, and the arguments after it */
    const char *entrypoint;
    char **entry_args;
    int nentry_args;

    /* torchrun's newest flags (torch/distributed/run.py on main). */
    bool virtual_local_rank;   /* --virtual_local_rank: LOCAL_RANK=0, one GPU each */
    bool shutdown_timeout_set; /* --shutdown_timeout given (it beats the variable) */
    /* --duplicate_stdout_filters / --duplicate_stderr_filters: teed lines
     * holding any of these substrings are copied to
     * attempt_<n>/filtered_std{out,err}.log. [0] stdout, [1] stderr. */
    const char **dup_filters[2]; /* owned; NULL when none */
    int ndup_filters[2];
    char *dup_filters_buf[2]; /* owned: the split copies dup_filters points into */

    /* What launch_parse read in a way worth saying once (quotes removed
     * around --rdzv_conf, PET_N_PROC_PER_NODE, PET_STANDALONE=""); main.c
     * logs each (L2001). */
#define LAUNCH_MAX_NOTES 4
    char notes[LAUNCH_MAX_NOTES][256];
    int nnotes;

    /* The worker command, formed by launch_resolve(). */
    enum launch_kind kind;
    char *program; /* owned: path given to execve */
    char **argv;   /* owned: NULL-terminated; strings point into argv or the config */
    int argc;
    /* Where a Python worker's interpreter came from, in words (PYTHON_EXEC,
     * cddprun's own environment, PATH); static, NULL for a program. */
    const char *python_from;
};

/* Which streams of local_rank the spec selects. */
static inline unsigned launch_std_for(const struct launch_std_spec *s, int local_rank)
{
    if (!s->is_map)
        return s->all;
    if (local_rank < 0 || local_rank >= LAUNCH_STD_MAP_RANKS)
        return LAUNCH_STD_NONE;
    return s->rank[local_rank];
}

/* True when --local_ranks_filter is unset or lists local_rank. */
bool launch_rank_shown(const struct launch_config *cfg, int local_rank);

/* Releases what the config owns; the struct itself is the caller's. */
void launch_config_free(struct launch_config *cfg);

#endif
