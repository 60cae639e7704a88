/*
 * slurm.h: what a Slurm job step tells cddprun (docs/slurm.md).
 *
 * Inside `srun cddprun train.py` the step's environment names everything
 * torchrun needs flags for. launch_slurm_derive() reads it and proposes a
 * text for each flag it can fill, with the variable it came from:
 *
 *   --nnodes            SLURM_STEP_NUM_NODES (else SLURM_NNODES, SLURM_JOB_NUM_NODES)
 *   --node_rank         SLURM_NODEID
 *   --rdzv_backend      c10d
 *   --rdzv_endpoint     the first host of SLURM_STEP_NODELIST (else
 *                       SLURM_JOB_NODELIST, SLURM_NODELIST), expanded by
 *                       common/hostlist.c, at port 29400 + (job id + step
 *                       id) % 1000, so two steps or jobs whose first host is
 *                       the same node rarely meet on one port
 *   --rdzv_id           JOB.STEP (SLURM_JOB_ID, SLURM_STEP_ID)
 *   --nproc_per_node    SLURM_GPUS_ON_NODE when >= 1, else SLURM_NTASKS_PER_NODE
 *   --signals_to_handle torchrun's four and SIGUSR1,SIGUSR2 (scancel
 *                       --signal, sbatch --signal)
 *
 * and whether this agent hosts the rendezvous (node 0). The launcher
 * (cli.c) uses a text only where neither the command line nor the
 * environment (PET_*, CDDP_*) gave the flag. Outside a job, or in a job
 * but outside a step (a batch script, salloc's shell), nothing is
 * proposed: only srun starts one cddprun on every node.
 *
 * Pure: reads envp only. Strings in the result point into envp or into the
 * struct itself.
 */
#ifndef CDDP_LAUNCHER_SLURM_H
#define CDDP_LAUNCHER_SLURM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/hostlist.h"

#define LAUNCH_SLURM_PORT_BASE 29400
#define LAUNCH_SLURM_PORT_SPAN 1000

/* One proposed flag value: text ("" when none) and its source variable. */
struct launch_slurm_value {
    char text[CDDP_HOSTLIST_NAME_MAX + 16];
    const char *var;
};

struct launch_slurm {
    bool in_job;  /* SLURM_JOB_ID is set */
    bool in_step; /* ... and SLURM_STEP_ID: the values below are filled */
    const char *job_id;
    const char *step_id;
    int node_id; /* SLURM_NODEID */
    int nnodes_n;
    int tasks_here; /* tasks of this step on this node (0: unknown) */
    const char *tasks_var;
    const char *nodelist; /* the list the endpoint came from */
    char first_host[CDDP_HOSTLIST_NAME_MAX + 1];
    int port;
    struct launch_slurm_value nnodes, node_rank, backend, endpoint, rdzv_id, nproc, signals;
};

/* torchrun's default --signals_to_handle, and the one used inside Slurm. */
#define LAUNCH_SIGNALS_DEFAULT "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
#define LAUNCH_SIGNALS_SLURM LAUNCH_SIGNALS_DEFAULT ",SIGUSR1,SIGUSR2"

/*
 * Fills out (zeroed first) from envp. 0, or a negative code with one line
 * in err naming the variable when a SLURM_* value inside a step is
 * malformed (a node count that is not a number, SLURM_NODEID past the node
 * count, a node list that does not parse) or when the step runs several
 * tasks on this node (one cddprun per node starts the workers itself:
 * `srun --ntasks-per-node=1`).
 */
int launch_slurm_derive(char **envp, struct launch_slurm *out, char *err, size_t errlen);

/* The rows of the launcher's flag table that Slurm can fill (indexes into
 * its struct cddp_flag_seen array); -1 for none. */
struct launch_slurm_rows {
    int nnodes, node_rank, backend, endpoint, rdzv_id, rdzv_conf, nproc, signals;
    int standalone, no_slurm;
};

/*
 * Between cddp_flags_defaults() and cddp_flags_convert(): unless --no_slurm
 * (or CDDP_NO_SLURM=1) is given, derives from envp and puts each proposed
 * text into the rows still at their built-in default (source NULL), with
 * the variable as their source; with a derived c10d endpoint and no
 * --rdzv_conf, rdzv_conf becomes is_host=1 on node 0 and is_host=0
 * elsewhere. With --standalone only --nproc_per_node and the signals are
 * filled. Logs once what it filled and what the user's flags kept. The
 * texts live in a static struct until the next call (cddprun parses once).
 * 0, or a negative code with err (launch_slurm_derive's refusals).
 */
struct cddp_flag_seen;
int launch_slurm_apply(char **envp, const struct launch_slurm_rows *rows,
                       struct cddp_flag_seen *seen, char *err, size_t errlen);

#endif
