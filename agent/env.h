/*
 * env.h: the one place a worker's environment is built.
 *
 * torchrun 2.x (LocalElasticAgent._start_workers + DefaultLogsSpecs.reify):
 * the agent's environment, with these set per worker:
 *
 *   LOCAL_RANK RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE
 *   WORLD_SIZE GROUP_WORLD_SIZE ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT
 *   TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID
 *   TORCHELASTIC_USE_AGENT_STORE TORCH_NCCL_ASYNC_ERROR_HANDLING
 *   TORCHELASTIC_ERROR_FILE
 *
 * plus extras (CDDP_*) the agent's modules add, and cddp's own
 * CDDP_RDZV_ROUND (the rendezvous round, 1, 2, ...) after them; a Python
 * worker's PYTHONPATH gets the automatic progress' folder first. OMP_NUM_THREADS and
 * CUDA_VISIBLE_DEVICES are inherited from the agent's environment, as in
 * torchrun (the launcher sets OMP_NUM_THREADS=1 there when it is unset).
 */
#ifndef CDDP_AGENT_ENV_H
#define CDDP_AGENT_ENV_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/config.h"
#include "agent/rdzv.h"

/* A worker's ranks, computed from the round (torchrun's _assign_worker_ranks
 * with one role: ROLE_* equal the global ones). */
struct agent_worker_ranks {
    int local_rank;
    int rank;
    int group_rank;
    int role_rank;
    int local_world_size;
    int world_size;
    int group_world_size;
    int role_world_size;
};

/* 0, or CDDP_ERANGE_ARG when the round cannot hold this node's workers
 * (rank_offset + local_world_size > world_size, node_rank >= nnodes, ...). */
int agent_worker_ranks(const struct agent_round *round, int local_world_size, int local_rank,
                       struct agent_worker_ranks *out);

struct agent_env_spec {
    struct agent_worker_ranks ranks;
    const char *role;
    const char *master_addr;
    int master_port;
    int restart_count;
    int max_restarts;
    const char *run_id;
    bool use_agent_store;
    const char *error_file;        /* "" when --log_dir is /dev/null */
    const struct launch_kv *extra; /* more variables to set (CDDP_*), or NULL */
    int nextra;
    /* --virtual_local_rank (torchrun's _set_local_rank_env): LOCAL_RANK=0 and
     * CUDA_VISIBLE_DEVICES the local rank's own entry of the agent's list
     * (stripped), or the local rank itself when the agent has none. */
    bool virtual_local_rank;
    /* The rendezvous round, exported as CDDP_RDZV_ROUND (cddp's own, not
     * torchrun's: the NCCL unique id's store key names it); 0: not set. */
    uint64_t rdzv_round;
    /* A folder put first on PYTHONPATH, before the agent's own entries
     * (the automatic progress' bootstrap, which takes itself off again);
     * NULL: PYTHONPATH is inherited as it is. */
    const char *pythonpath_first;
};

/* A NULL-terminated envp and the memory behind it. */
struct agent_env {
    char **envp;
    char *strings;
};

/* base: the agent's environment (entries "K=V"; NULL-terminated). Entries
 * for keys the spec sets are dropped from the copy; the base strings are
 * referenced, not copied, so base must outlive the result. 0, -ENOMEM, or
 * CDDP_ERANGE_ARG when --virtual_local_rank finds no entry for the local
 * rank in the agent's CUDA_VISIBLE_DEVICES. */
int agent_env_build(char *const *base, const struct agent_env_spec *spec, struct agent_env *out);
void agent_env_free(struct agent_env *env);

/* The value of name in envp, or NULL. */
const char *agent_env_get(char *const *envp, const char *name);

#endif
