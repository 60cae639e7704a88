/* graph_plan.c: --cuda-graphs' decisions; see graph_plan.h. */
#include "trainer/graph_plan.h"

#include <string.h>

void trn_graph_plan_init(struct trn_graph_plan *p, int warmup)
{
    memset(p, 0, sizeof(*p));
    p->warmup = warmup < 1 ? 1 : warmup;
}

static bool same_key(const struct trn_graph_key *a, const struct trn_graph_key *b)
{
    return a->kind == b->kind && a->n == b->n && a->h == b->h && a->w == b->w &&
           a->accumulate == b->accumulate && a->input == b->input;
}

bool trn_graph_env_same(const struct trn_graph_env *a, const struct trn_graph_env *b)
{
    return a->backend_gen == b->backend_gen && a->arena == b->arena &&
           a->arena_bytes == b->arena_bytes;
}

static int find(const struct trn_graph_plan *p, const struct trn_graph_key *key)
{
    for (int i = 0; i < TRN_GRAPH_MAX; i++)
        if (p->e[i].used && same_key(&p->e[i].key, key))
            return i;
    return -1;
}

unsigned trn_graph_check_env(struct trn_graph_plan *p, const struct trn_graph_env *env)
{
    unsigned stale = 0;
    for (int i = 0; i < TRN_GRAPH_MAX; i++)
        if (p->e[i].captured)
            stale |= 1u << i;
    if (!stale || trn_graph_env_same(&p->env, env))
        return 0;
    for (int i = 0; i < TRN_GRAPH_MAX; i++) {
        p->e[i].captured = false;
        p->e[i].clean_runs = 0;
    }
    p->invalidations++;
    return stale;
}

enum trn_graph_action trn_graph_decide(struct trn_graph_plan *p, const struct trn_graph_key *key,
                                       bool eligible, int *slot)
{
    *slot = -1;
    int i = eligible ? find(p, key) : -1;
    if (eligible && i < 0) {
        for (int j = 0; j < TRN_GRAPH_MAX && i < 0; j++)
            if (!p->e[j].used)
                i = j;
        if (i >= 0) {
            memset(&p->e[i], 0, sizeof(p->e[i]));
            p->e[i].used = true;
            p->e[i].key = *key;
        }
    }
    if (i < 0 || (!p->e[i].captured && p->e[i].clean_runs < p->warmup)) {
        p->uncaptured++;
        return TRN_GRAPH_RUN;
    }
    *slot = i;
    return p->e[i].captured ? TRN_GRAPH_REPLAY : TRN_GRAPH_CAPTURE;
}

void trn_graph_ran(struct trn_graph_plan *p, const struct trn_graph_key *key, bool clean)
{
    int i = find(p, key);
    if (i < 0 || p->e[i].captured)
        return;
    p->e[i].clean_runs = clean ? p->e[i].clean_runs + 1 : 0;
}

void trn_graph_captured(struct trn_graph_plan *p, int slot, const struct trn_graph_env *env)
{
    if (slot < 0 || slot >= TRN_GRAPH_MAX || !p->e[slot].used)
        return;
    /* Every held graph shares one env: a capture against another would
     * have been preceded by check_env dropping the others. */
    p->e[slot].captured = true;
    p->env = *env;
    p->captures++;
}

void trn_graph_replayed(struct trn_graph_plan *p, int slot)
{
    if (slot >= 0 && slot < TRN_GRAPH_MAX && p->e[slot].captured)
        p->replays++;
}

struct trn_graph_host_step trn_graph_host_advance(enum trn_graph_kind kind,
                                                  enum trn_graph_action action, bool step_taken)
{
    struct trn_graph_host_step s = {0, 0};
    if (kind == TRN_GRAPH_MICRO && action == TRN_GRAPH_REPLAY)
        s.bn_forwards = 1;
    if (kind == TRN_GRAPH_OPT && action != TRN_GRAPH_RUN && step_taken)
        s.optimizer_steps = 1;
    return s;
}
