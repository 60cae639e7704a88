/* rdzv_backend.c: see rdzv_backend.h. */
#include "agent/rdzv_backend.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/strutil.h"

void rdzv_calls_init(struct rdzv_calls *k, struct agent_rdzv *base)
{
    memset(k, 0, sizeof(*k));
    k->base = base;
}

int rdzv_calls_join(struct rdzv_calls *k, const struct agent_join *req, int nproc,
                    agent_round_cb cb)
{
    if (k->join_cb || k->closing)
        return CDDP_ESTATE;
    if (req->local_world_size != nproc)
        return CDDP_EMISMATCH;
    k->join_cb = cb;
    return 0;
}

void rdzv_calls_round(struct rdzv_calls *k, int status, const struct agent_round *round,
                      const char *reason)
{
    agent_round_cb cb = k->join_cb;
    k->join_cb = NULL;
    k->join_deferred = false;
    if (cb)
        cb(k->base, status, round, reason);
}

void rdzv_calls_defer_join(struct rdzv_calls *k, uv_timer_t *t, uv_timer_cb cb, int status,
                           const char *reason)
{
    k->join_deferred = true;
    k->deferred_status = status;
    cddp_strlcpy(k->deferred_reason, reason, sizeof(k->deferred_reason));
    uv_timer_start(t, cb, 0, 0);
}

bool rdzv_calls_deferred(struct rdzv_calls *k)
{
    if (!k->join_deferred)
        return false;
    /* A copy: the callback may join again, and that join may defer. */
    char reason[sizeof(k->deferred_reason)];
    cddp_strlcpy(reason, k->deferred_reason, sizeof(reason));
    rdzv_calls_round(k, k->deferred_status, NULL, reason);
    return true;
}

void rdzv_calls_barrier(struct rdzv_calls *k, int status)
{
    agent_rdzv_status_cb cb = k->barrier_cb;
    k->barrier_cb = NULL;
    if (cb)
        cb(k->base, status);
}

bool rdzv_calls_close(struct rdzv_calls *k, enum agent_rdzv_farewell how, const char *reason,
                      agent_rdzv_close_cb cb)
{
    if (k->closing)
        return false;
    k->closing = true;
    k->how = how;
    k->close_cb = cb;
    cddp_strlcpy(k->close_reason, reason && reason[0] ? reason : "the job ended",
                 sizeof(k->close_reason));
    k->join_cb = NULL;
    k->join_deferred = false;
    k->barrier_cb = NULL;
    return true;
}

void rdzv_calls_closed(struct rdzv_calls *k)
{
    agent_rdzv_close_cb cb = k->close_cb;
    k->close_cb = NULL;
    if (cb)
        cb(k->base);
}

void rdzv_round_from_proto(struct agent_round *r, const struct proto_round *pr)
{
    memset(r, 0, sizeof(*r));
    r->round = pr->round;
    r->restart_count = pr->restart_count;
    r->node_rank = pr->node_rank;
    r->nnodes = pr->nnodes;
    r->world_size = pr->world_size;
    r->rank_offset = pr->rank_offset;
    r->use_agent_store = 0;
    cddp_strlcpy(r->run_id, pr->run_id ? pr->run_id : "", sizeof(r->run_id));
    cddp_strlcpy(r->master_addr, pr->master_addr ? pr->master_addr : "", sizeof(r->master_addr));
    r->master_port = pr->master_port;
    r->generation = pr->generation;
    cddp_strlcpy(r->replaced, pr->replaced ? pr->replaced : "", sizeof(r->replaced));
}

int agent_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return CDDP_ERR_FROM_ERRNO(errno);
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(sin);
    int rc = 0;
    if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) != 0)
        rc = CDDP_ERR_FROM_ERRNO(errno);
    close(fd);
    return rc ? rc : ntohs(sin.sin_port);
}
