/*
 * env.h: the distributed environment torchrun (and cddprun) gives a worker.
 *
 *   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
 *   TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT,
 *   TORCHELASTIC_ERROR_FILE
 *
 * and cddprun's own CDDP_RDZV_ROUND (the rendezvous round; torchrun does not
 * set it: 0 then), which the NCCL unique id's store key names.
 *
 * With none of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set the worker runs
 * alone (world size 1). WORLD_SIZE > 1 needs all four; a missing or malformed
 * one is an error naming the variable. LOCAL_RANK defaults to RANK (one node).
 * Reading is pure: the caller passes the lookup function (getenv, or a table
 * in tests).
 */
#ifndef CDDP_TRAINER_COMM_ENV_H
#define CDDP_TRAINER_COMM_ENV_H

#include <stdbool.h>
#include <stddef.h>

#define TRN_ENV_PATH_MAX 4096

struct trn_dist_env {
    int rank;
    int world;
    int local_rank;
    int local_world;
    char master_addr[256]; /* without IPv6 brackets; "" when world == 1 */
    int master_port;       /* 0 when world == 1 */
    /* TORCHELASTIC_USE_AGENT_STORE=True: the launcher's agent serves the
     * store on MASTER_PORT (torch's TCPStore), so rank 0 must not. */
    bool use_agent_store;
    long restart_count;                /* TORCHELASTIC_RESTART_COUNT, 0 if unset */
    long rdzv_round;                   /* CDDP_RDZV_ROUND, 0 if unset */
    char error_file[TRN_ENV_PATH_MAX]; /* TORCHELASTIC_ERROR_FILE, "" if unset */
};

/* Fills *e from lookup(name) (NULL = unset). 0, or CDDP_EPARSE / CDDP_ERANGE_ARG /
 * CDDP_ECONFIG with a one-line reason in err naming the variable. */
int trn_dist_env_read(struct trn_dist_env *e, char *(*lookup)(const char *name), char *err,
                      size_t errlen);

#endif
