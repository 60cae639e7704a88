/*
 * rdzv_backend.h: what the network backends behind agent/rdzv.h share
 * (agent/rdzv_c10d.c, agent/rdzv_etcd.c); the agent sees rdzv.h only.
 *
 * struct rdzv_calls holds the agent's calls in flight and answers each
 * once, by rdzv.h's rules: a join and an exit barrier at a time; a join
 * failure found inside the join call is told from the loop's next turn
 * (rdzv_calls_defer_join); from the first close on, nothing but close's
 * callback is called. The backend embeds it and keeps its own handles:
 * the deferred failure rides on a timer of the backend's.
 */
#ifndef CDDP_AGENT_RDZV_BACKEND_H
#define CDDP_AGENT_RDZV_BACKEND_H

#include <stdbool.h>
#include <uv.h>

#include "agent/rdzv.h"
#include "proto/msg.h"

struct rdzv_calls {
    struct agent_rdzv *base;
    agent_round_cb join_cb;          /* the join in flight; NULL: none */
    agent_rdzv_status_cb barrier_cb; /* the exit barrier in flight; NULL: none */
    /* A join failure waiting for the loop's next turn. */
    bool join_deferred;
    int deferred_status;
    char deferred_reason[512];
    /* close: how this node leaves, what the others are told, and who
     * hears when the backend's handles are closed */
    bool closing;
    enum agent_rdzv_farewell how;
    char close_reason[512];
    agent_rdzv_close_cb close_cb;
};

void rdzv_calls_init(struct rdzv_calls *k, struct agent_rdzv *base);

/* The checks every join starts with: CDDP_ESTATE (a join is in flight, or
 * the backend is closing), CDDP_EMISMATCH (req's local world size is not
 * nproc); else 0, and cb is the join in flight. */
int rdzv_calls_join(struct rdzv_calls *k, const struct agent_join *req, int nproc,
                    agent_round_cb cb);

/* Answers the join in flight, if any (status 0: round; otherwise reason):
 * it is no longer in flight when its callback runs, which may join again. */
void rdzv_calls_round(struct rdzv_calls *k, int status, const struct agent_round *round,
                      const char *reason);

/* Fails the join in flight on the loop's next turn: keeps status and
 * reason and starts t (the backend's) at 0 ms with cb, which calls
 * rdzv_calls_deferred first. */
void rdzv_calls_defer_join(struct rdzv_calls *k, uv_timer_t *t, uv_timer_cb cb, int status,
                           const char *reason);

/* In that timer's callback: true if a deferred failure was due (told to
 * the join's callback, if one still waits); false: the timer fired for
 * something else of the backend's. */
bool rdzv_calls_deferred(struct rdzv_calls *k);

/* Answers the exit barrier in flight, if any. */
void rdzv_calls_barrier(struct rdzv_calls *k, int status);

/* The start of every close: false when the backend was closing already
 * (a second close does nothing). Otherwise the join, a deferred failure
 * and the barrier are dropped uncalled, and how, reason ("the job ended"
 * when empty) and cb are kept. */
bool rdzv_calls_close(struct rdzv_calls *k, enum agent_rdzv_farewell how, const char *reason,
                      agent_rdzv_close_cb cb);

/* The backend's handles are all closed: tells close's callback. The
 * backend frees itself after this. */
void rdzv_calls_closed(struct rdzv_calls *k);

/* A TCP port free on every IPv4 address a moment ago (torch's
 * get_free_port): bind port 0, read it, close. The port or a negative code. */
int agent_free_port(void);

/* An agent round from the wire's round (use_agent_store 0). */
void rdzv_round_from_proto(struct agent_round *r, const struct proto_round *pr);

#endif
