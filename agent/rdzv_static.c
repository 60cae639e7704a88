/*
 * rdzv_static.c: the single-node rendezvous (static backend, --standalone).
 *
 * Every answer is known at once; the timer only keeps the interface's
 * promise that callbacks never run inside the call that asked for them.
 */
#include "agent/rdzv.h"

#include <string.h>

#include "common/errors.h"

static void static_fire(uv_timer_t *t)
{
    struct agent_rdzv_static *s = t->data;
    if (s->join_cb) {
        agent_round_cb cb = s->join_cb;
        s->join_cb = NULL;
        struct agent_round r = s->next;
        s->next.round++;
        s->failures_reported = false;
        cb(&s->base, 0, &r, NULL);
    }
    if (s->barrier_cb) {
        agent_rdzv_status_cb cb = s->barrier_cb;
        s->barrier_cb = NULL;
        cb(&s->base, 0);
    }
}

static int static_join(struct agent_rdzv *r, const struct agent_join *req, agent_round_cb cb)
{
    struct agent_rdzv_static *s = (struct agent_rdzv_static *)r;
    if (s->join_cb || s->close_cb)
        return CDDP_ESTATE;
    if (req->local_world_size != s->next.world_size)
        return CDDP_EMISMATCH;
    s->join_cb = cb;
    return uv_timer_start(&s->timer, static_fire, 0, 0);
}

static int static_report_failure(struct agent_rdzv *r, int restart_count)
{
    struct agent_rdzv_static *s = (struct agent_rdzv_static *)r;
    (void)restart_count;
    /* No peers to tell; the next round counts it (once per round). */
    if (!s->failures_reported) {
        s->failures_reported = true;
        s->next.restart_count++;
    }
    return 0;
}

static int static_exit_barrier(struct agent_rdzv *r, uint64_t timeout_ms, agent_rdzv_status_cb cb)
{
    struct agent_rdzv_static *s = (struct agent_rdzv_static *)r;
    (void)timeout_ms;
    if (s->barrier_cb || s->close_cb)
        return CDDP_ESTATE;
    s->barrier_cb = cb;
    return uv_timer_start(&s->timer, static_fire, 0, 0);
}

static void static_closed(uv_handle_t *h)
{
    struct agent_rdzv_static *s = h->data;
    if (s->close_cb)
        s->close_cb(&s->base);
}

static void static_close(struct agent_rdzv *r, enum agent_rdzv_farewell how, const char *reason,
                         agent_rdzv_close_cb cb)
{
    struct agent_rdzv_static *s = (struct agent_rdzv_static *)r;
    (void)how;
    (void)reason;
    s->join_cb = NULL;
    s->barrier_cb = NULL;
    s->close_cb = cb;
    uv_close((uv_handle_t *)&s->timer, static_closed);
}

static const struct agent_rdzv_ops static_ops = {
    .name = "static",
    .join = static_join,
    .report_failure = static_report_failure,
    .exit_barrier = static_exit_barrier,
    .close = static_close,
};

int agent_rdzv_static_init(struct agent_rdzv_static *s, uv_loop_t *loop,
                           const struct agent_round *proto)
{
    memset(s, 0, sizeof(*s));
    s->base.ops = &static_ops;
    s->base.loop = loop;
    s->next = *proto;
    s->next.round = 1;
    s->next.restart_count = 0;
    int rc = uv_timer_init(loop, &s->timer);
    if (rc)
        return rc;
    s->timer.data = s;
    return 0;
}
