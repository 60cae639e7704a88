/* env.c: torchrun's worker environment -> struct trn_dist_env; see env.h. */
#include "trainer/comm/env.h"

#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

#define MAX_WORLD (1L << 20)

static int int_var(char *(*lookup)(const char *), const char *name, long min, long max, long *out,
                   bool *present, char *err, size_t errlen)
{
    const char *v = lookup(name);
    *present = v != NULL && *v != '\0';
    if (!*present)
        return 0;
    int rc = cddp_parse_long(v, min, max, out);
    if (rc < 0)
        snprintf(err, errlen, "%s='%s' is not an integer in %ld..%ld", name, v, min, max);
    return rc;
}

int trn_dist_env_read(struct trn_dist_env *e, char *(*lookup)(const char *name), char *err,
                      size_t errlen)
{
    memset(e, 0, sizeof(*e));
    e->world = 1;
    e->local_world = 1;

    long rank = 0, world = 1, local_rank = 0, local_world = 1, port = 0, restarts = 0, round = 0;
    bool has_rank, has_world, has_lr, has_lw, has_port, has_restarts, has_round;
    int rc;
    if ((rc = int_var(lookup, "WORLD_SIZE", 1, MAX_WORLD, &world, &has_world, err, errlen)) < 0 ||
        (rc = int_var(lookup, "RANK", 0, MAX_WORLD - 1, &rank, &has_rank, err, errlen)) < 0 ||
        (rc = int_var(lookup, "LOCAL_RANK", 0, MAX_WORLD - 1, &local_rank, &has_lr, err, errlen)) <
            0 ||
        (rc = int_var(lookup, "LOCAL_WORLD_SIZE", 1, MAX_WORLD, &local_world, &has_lw, err,
                      errlen)) < 0 ||
        (rc = int_var(lookup, "MASTER_PORT", 1, 65535, &port, &has_port, err, errlen)) < 0 ||
        (rc = int_var(lookup, "TORCHELASTIC_RESTART_COUNT", 0, 1L << 30, &restarts, &has_restarts,
                      err, errlen)) < 0 ||
        (rc = int_var(lookup, "CDDP_RDZV_ROUND", 0, 1L << 62, &round, &has_round, err, errlen)) < 0)
        return rc;

    if (has_rank && !has_world) {
        snprintf(err, errlen, "RANK=%ld is set but WORLD_SIZE is not", rank);
        return CDDP_ECONFIG;
    }
    if (rank >= world) {
        snprintf(err, errlen, "RANK=%ld is not below WORLD_SIZE=%ld", rank, world);
        return CDDP_ERANGE_ARG;
    }
    if (world > 1 && !has_rank) {
        snprintf(err, errlen, "WORLD_SIZE=%ld but RANK is not set", world);
        return CDDP_ECONFIG;
    }
    e->rank = (int)rank;
    e->world = (int)world;
    e->local_rank = has_lr ? (int)local_rank : (int)rank;
    e->local_world = has_lw ? (int)local_world : (int)world;
    if (e->local_rank >= e->local_world) {
        snprintf(err, errlen, "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d", e->local_rank,
                 e->local_world);
        return CDDP_ERANGE_ARG;
    }
    e->restart_count = restarts;
    e->rdzv_round = round;

    const char *ef = lookup("TORCHELASTIC_ERROR_FILE");
    if (ef != NULL && *ef != '\0') {
        if (strlen(ef) >= sizeof(e->error_file)) {
            snprintf(err, errlen, "TORCHELASTIC_ERROR_FILE is longer than %zu bytes",
                     sizeof(e->error_file) - 1);
            return CDDP_ERANGE_ARG;
        }
        cddp_strlcpy(e->error_file, ef, sizeof(e->error_file));
    }

    const char *uas = lookup("TORCHELASTIC_USE_AGENT_STORE");
    if (uas != NULL && *uas != '\0' && cddp_parse_bool(uas, &e->use_agent_store) < 0) {
        snprintf(err, errlen, "TORCHELASTIC_USE_AGENT_STORE='%s' is not True or False", uas);
        return CDDP_EPARSE;
    }

    if (world == 1)
        return 0; /* alone: no store, MASTER_* not needed */

    const char *addr = lookup("MASTER_ADDR");
    if (addr == NULL || *addr == '\0') {
        snprintf(err, errlen, "WORLD_SIZE=%ld but MASTER_ADDR is not set", world);
        return CDDP_ECONFIG;
    }
    if (!has_port) {
        snprintf(err, errlen, "WORLD_SIZE=%ld but MASTER_PORT is not set", world);
        return CDDP_ECONFIG;
    }
    size_t n = strlen(addr);
    if (addr[0] == '[' && n > 2 && addr[n - 1] == ']') {
        addr++;
        n -= 2;
    }
    if (n >= sizeof(e->master_addr) || memchr(addr, ' ', n) != NULL) {
        snprintf(err, errlen, "MASTER_ADDR='%s' is not a host name or address",
                 lookup("MASTER_ADDR"));
        return CDDP_EPARSE;
    }
    memcpy(e->master_addr, addr, n);
    e->master_addr[n] = '\0';
    e->master_port = (int)port;
    return 0;
}
