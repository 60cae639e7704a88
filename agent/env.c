/* env.c: see env.h. */
#include "agent/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

int agent_worker_ranks(const struct agent_round *round, int local_world_size, int local_rank,
                       struct agent_worker_ranks *out)
{
    if (local_world_size < 1 || local_rank < 0 || local_rank >= local_world_size ||
        round->nnodes < 1 || round->node_rank < 0 || round->node_rank >= round->nnodes ||
        round->rank_offset < 0 || round->world_size < local_world_size ||
        round->rank_offset > round->world_size - local_world_size)
        return CDDP_ERANGE_ARG;
    out->local_rank = local_rank;
    out->rank = round->rank_offset + local_rank;
    out->group_rank = round->node_rank;
    out->role_rank = out->rank;
    out->local_world_size = local_world_size;
    out->world_size = round->world_size;
    out->group_world_size = round->nnodes;
    out->role_world_size = round->world_size;
    return 0;
}

const char *agent_env_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (char *const *e = envp; e && *e; e++) {
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    }
    return NULL;
}

/* The variables the agent sets, in torchrun's order. */
enum {
    V_LOCAL_RANK,
    V_RANK,
    V_GROUP_RANK,
    V_ROLE_RANK,
    V_ROLE_NAME,
    V_LOCAL_WORLD_SIZE,
    V_WORLD_SIZE,
    V_GROUP_WORLD_SIZE,
    V_ROLE_WORLD_SIZE,
    V_MASTER_ADDR,
    V_MASTER_PORT,
    V_RESTART_COUNT,
    V_MAX_RESTARTS,
    V_RUN_ID,
    V_USE_AGENT_STORE,
    V_NCCL_ASYNC,
    V_ERROR_FILE,
    V_COUNT,
};

static const char *const var_names[V_COUNT] = {
    "LOCAL_RANK",
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCHELASTIC_ERROR_FILE",
};

static bool key_is(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

/* cddp's own addition after torchrun's variables (docs/torchrun-compat.md):
 * the rendezvous round, which the NCCL unique id's store key names. */
#define RDZV_ROUND_VAR "CDDP_RDZV_ROUND"

static bool overridden(const char *entry, const struct agent_env_spec *spec)
{
    if (spec->virtual_local_rank && key_is(entry, "CUDA_VISIBLE_DEVICES"))
        return true;
    if (spec->rdzv_round > 0 && key_is(entry, RDZV_ROUND_VAR))
        return true;
    if (spec->pythonpath_first && key_is(entry, "PYTHONPATH"))
        return true;
    for (int i = 0; i < V_COUNT; i++) {
        if (key_is(entry, var_names[i]))
            return true;
    }
    for (int i = 0; i < spec->nextra; i++) {
        if (key_is(entry, spec->extra[i].key))
            return true;
    }
    return false;
}

int agent_env_build(char *const *base, const struct agent_env_spec *spec, struct agent_env *out)
{
    out->envp = NULL;
    out->strings = NULL;
    const struct agent_worker_ranks *r = &spec->ranks;
    /* torchrun keeps TORCH_NCCL_ASYNC_ERROR_HANDLING when the agent has it. */
    const char *nccl = agent_env_get(base, var_names[V_NCCL_ASYNC]);
    char num[V_COUNT][24];
    const char *val[V_COUNT];
    snprintf(num[V_LOCAL_RANK], sizeof(num[0]), "%d", r->local_rank);
    snprintf(num[V_RANK], sizeof(num[0]), "%d", r->rank);
    snprintf(num[V_GROUP_RANK], sizeof(num[0]), "%d", r->group_rank);
    snprintf(num[V_ROLE_RANK], sizeof(num[0]), "%d", r->role_rank);
    snprintf(num[V_LOCAL_WORLD_SIZE], sizeof(num[0]), "%d", r->local_world_size);
    snprintf(num[V_WORLD_SIZE], sizeof(num[0]), "%d", r->world_size);
    snprintf(num[V_GROUP_WORLD_SIZE], sizeof(num[0]), "%d", r->group_world_size);
    snprintf(num[V_ROLE_WORLD_SIZE], sizeof(num[0]), "%d", r->role_world_size);
    snprintf(num[V_MASTER_PORT], sizeof(num[0]), "%d", spec->master_port);
    snprintf(num[V_RESTART_COUNT], sizeof(num[0]), "%d", spec->restart_count);
    snprintf(num[V_MAX_RESTARTS], sizeof(num[0]), "%d", spec->max_restarts);
    for (int i = 0; i < V_COUNT; i++)
        val[i] = num[i];
    val[V_ROLE_NAME] = spec->role;
    val[V_MASTER_ADDR] = spec->master_addr;
    val[V_RUN_ID] = spec->run_id;
    val[V_USE_AGENT_STORE] = spec->use_agent_store ? "True" : "False"; /* Python's str(bool) */
    val[V_NCCL_ASYNC] = nccl ? nccl : "1";
    val[V_ERROR_FILE] = spec->error_file;

    /* --virtual_local_rank: one more variable, after torchrun's. */
    char visible[256] = "";
    int nvirtual = 0;
    if (spec->virtual_local_rank) {
        nvirtual = 1;
        val[V_LOCAL_RANK] = "0";
        const char *cvd = agent_env_get(base, "CUDA_VISIBLE_DEVICES");
        if (cvd == NULL) {
            snprintf(visible, sizeof(visible), "%d", r->local_rank);
        } else {
            const char *p = cvd;
            for (int k = 0; k < r->local_rank && p; k++) {
                p = strchr(p, ',');
                p = p ? p + 1 : NULL;
            }
            if (p == NULL)
                return CDDP_ERANGE_ARG;
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len >= sizeof(visible))
                return CDDP_ERANGE_ARG;
            memcpy(visible, p, len);
            visible[len] = '\0';
            char *st = cddp_strip(visible);
            memmove(visible, st, strlen(st) + 1);
        }
    }

    /* After torchrun's and the extras: the virtual local rank's device,
     * the rendezvous round (when the agent knows it) and PYTHONPATH with
     * the bootstrap folder first (the agent's own entries after it). */
    struct launch_kv tail[3];
    int ntail = 0;
    if (nvirtual)
        tail[ntail++] = (struct launch_kv){"CUDA_VISIBLE_DEVICES", visible};
    char round[24];
    if (spec->rdzv_round > 0) {
        snprintf(round, sizeof(round), "%llu", (unsigned long long)spec->rdzv_round);
        tail[ntail++] = (struct launch_kv){RDZV_ROUND_VAR, round};
    }
    struct cddp_buf pythonpath = {0};
    if (spec->pythonpath_first) {
        const char *old = agent_env_get(base, "PYTHONPATH");
        cddp_buf_init(&pythonpath, 1u << 20);
        if (cddp_buf_printf(&pythonpath, "%s%s%s", spec->pythonpath_first, old && *old ? ":" : "",
                            old && *old ? old : "") != 0) {
            cddp_buf_free(&pythonpath);
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        }
        tail[ntail++] = (struct launch_kv){"PYTHONPATH", pythonpath.data};
    }

    size_t nbase = 0;
    for (char *const *e = base; e && *e; e++)
        nbase++;
    size_t bytes = 0;
    for (int i = 0; i < V_COUNT; i++)
        bytes += strlen(var_names[i]) + strlen(val[i]) + 2;
    for (int i = 0; i < spec->nextra; i++)
        bytes += strlen(spec->extra[i].key) + strlen(spec->extra[i].value) + 2;
    for (int i = 0; i < ntail; i++)
        bytes += strlen(tail[i].key) + strlen(tail[i].value) + 2;

    out->envp =
        malloc((nbase + V_COUNT + (size_t)spec->nextra + (size_t)ntail + 1) * sizeof(char *));
    out->strings = malloc(bytes);
    if (out->envp == NULL || out->strings == NULL) {
        agent_env_free(out);
        cddp_buf_free(&pythonpath);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    size_t n = 0;
    for (char *const *e = base; e && *e; e++) {
        if (!overridden(*e, spec))
            out->envp[n++] = *e;
    }
    char *p = out->strings;
    for (int i = 0; i < V_COUNT + spec->nextra + ntail; i++) {
        int t = i - V_COUNT - spec->nextra;
        const char *k = i < V_COUNT                  ? var_names[i]
                        : i < V_COUNT + spec->nextra ? spec->extra[i - V_COUNT].key
                                                     : tail[t].key;
        const char *v = i < V_COUNT                  ? val[i]
                        : i < V_COUNT + spec->nextra ? spec->extra[i - V_COUNT].value
                                                     : tail[t].value;
        size_t kl = strlen(k), vl = strlen(v);
        memcpy(p, k, kl);
        p[kl] = '=';
        memcpy(p + kl + 1, v, vl + 1);
        out->envp[n++] = p;
        p += kl + vl + 2;
    }
    out->envp[n] = NULL;
    cddp_buf_free(&pythonpath);
    return 0;
}

void agent_env_free(struct agent_env *env)
{
    free(env->envp);
    free(env->strings);
    env->envp = NULL;
    env->strings = NULL;
}
