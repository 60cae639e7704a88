/* state.c: see state.h for the semantics; docs/protocol.md for the diagram.
 *
 * Each node is in exactly one of five lists of its run, by state:
 *   IDLE         connected and joined once, but in no round (late rejoin)
 *   PARTICIPANT  joined the forming round
 *   WAITING      joined while the round runs at max_nodes (or while a
 *                forming round is full): admitted when a place frees up
 *   ACTIVE       member of the running round
 *   RESTARTING   member of the last round, told to restart, expected back
 * Timers (heartbeat, join timeout, last call, store waits, GC of closed
 * runs) sit in one intrusive min-heap (common/heap.h) for the whole state,
 * first armed first fired among equal deadlines. Heartbeats only
 * record the time; the heartbeat timer re-arms itself lazily when it fires
 * early, so 100,000 nodes beating cost no heap work. */
#include "rendezvous/state.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/heap.h"
#include "common/queue.h"
#include "common/straggler.h"
#include "common/strmap.h"
#include "common/strutil.h"
#include "rendezvous/conf.h"
#include "rendezvous/ranks.h"

enum node_state { N_IDLE, N_PARTICIPANT, N_WAITING, N_ACTIVE, N_RESTARTING, N_COUNT };

static const char *const node_state_names[N_COUNT] = {"idle", "participant", "waiting", "active",
                                                      "restarting"};

enum timer_kind { T_BEAT, T_JOIN, T_LAST_CALL, T_STORE, T_GC, T_REBUILD };

struct timer {
    uint64_t due;
    uint64_t seq; /* when it was armed: orders equal deadlines */
    struct cddp_heap_node node;
    bool armed;
    enum timer_kind kind;
    void *owner;
};

struct rdzv_node {
    struct rdzv_run *run;
    struct rdzv_peer *peer;
    enum node_state state;
    struct cddp_queue link;
    int nproc;
    int master_port;
    int status_port; /* the agent's status port, 0: none (status pages) */
    int prev_rank;   /* rank in the last completed round it was part of, or -1 */
    int prev_offset; /* its rank offset in that round */
    uint64_t last_beat;
    uint64_t joined_at; /* its last join (status pages) */
    uint64_t dead_after_ms;
    uint64_t join_timeout_ms;
    uint64_t keep_alive_ms;
    int keep_alive_max;
    struct timer beat;
    struct timer join;
    bool has_perf; /* its agent's summary of its ranks' step times, this round */
    struct proto_perf perf;
    struct straggler_member judged; /* the last straggler judgement of it */
    char *local_addr;
    char *hostname;
    size_t idlen;
    char id[];
};

struct rdzv_run {
    struct cddp_queue link;
    enum rdzv_phase phase;
    bool configured;
    bool had_round;
    bool expecting;   /* the forming round follows a restart and waits for its members */
    int resume_nodes; /* before the first round: the largest last_nnodes of the joins */
    int min_nodes, max_nodes;
    uint64_t last_call_ms;
    uint64_t close_timeout_ms;
    uint64_t round;
    uint64_t round_at; /* when the current round completed (status pages) */
    uint64_t restarts, counted_restarts;
    /* The last completed round's shape, and whether the restart that
     * ended it was counted: a round of the same shape that only fills
     * lost members' places goes on in place (generation, state.h). */
    int last_nnodes, last_world, last_master_port;
    bool last_counted;
    int64_t generation;
    uint64_t generation_at; /* when a replace was last granted in this round; 0: never */
    struct cddp_queue lists[N_COUNT];
    size_t count[N_COUNT];
    struct timer last_call;
    struct timer store_timer;
    struct timer gc;
    struct kvstore *store;
    size_t npeers;
    struct cddp_strmap nodes;
    uint64_t closed_at;
    char *close_reason;
    /* A running round rebuilt from its members' resumes on a restarted
     * server: what the first member said of it, and who is back. */
    bool rebuilding;
    int rebuild_nnodes, rebuild_world, rebuild_port;
    char *rebuild_master;
    uint8_t *rebuild_back; /* by node rank: 1 once that member resumed */
    size_t rebuild_count;
    struct timer rebuild;
    struct rdzv_node **ranked; /* scratch for completing a round */
    size_t ranked_cap;
    /* The last straggler judgement of the active members. */
    uint64_t judged_at;
    double step_median_s;
    bool step_compute;
    double straggler_factor;
    size_t idlen;
    char id[];
};

/* Per-event scratch memory for the strings that actions point to: chunks
 * that live until the next call into the state machine, which resets them
 * (the shell copies what it keeps). Not an arena of fixed offsets like the
 * trainer's activations (trainer/resnet.c): it only grows and is dropped. */
struct scratch_chunk {
    struct scratch_chunk *next;
    size_t size, used;
    char data[];
};

struct rdzv_state {
    struct rdzv_state_options opt;
    struct cddp_strmap runs;
    struct cddp_queue run_list;
    size_t nruns;
    struct cddp_heap timers;
    uint64_t timer_seq;
    struct rdzv_action *acts;
    size_t nacts, acts_cap;
    struct rdzv_action sink; /* where actions go when memory runs out */
    struct scratch_chunk *scratch;
};

/* ---- small helpers: scratch, actions ---- */

static void scratch_reset(struct rdzv_state *st)
{
    /* Keep the first (oldest) chunk, free the rest. */
    struct scratch_chunk *c = st->scratch;
    while (c && c->next) {
        struct scratch_chunk *next = c->next;
        free(c);
        c = next;
    }
    st->scratch = c;
    if (c)
        c->used = 0;
}

static char *scratch_alloc(struct rdzv_state *st, size_t n)
{
    struct scratch_chunk *c = st->scratch;
    if (c == NULL || c->size - c->used < n) {
        size_t size = n > 4096 ? n : 4096;
        struct scratch_chunk *nc = malloc(sizeof(*nc) + size);
        if (nc == NULL)
            return NULL;
        nc->size = size;
        nc->used = 0;
        nc->next = st->scratch;
        st->scratch = nc;
        c = nc;
    }
    char *p = c->data + c->used;
    c->used += n;
    return p;
}

static const char *scratch_strdup(struct rdzv_state *st, const char *s)
{
    if (s == NULL)
        return NULL;
    size_t n = strlen(s) + 1;
    char *p = scratch_alloc(st, n);
    if (p == NULL)
        return "";
    memcpy(p, s, n);
    return p;
}

static const char *scratch_printf(struct rdzv_state *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static const char *scratch_printf(struct rdzv_state *st, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return scratch_strdup(st, buf);
}

static void begin(struct rdzv_state *st)
{
    st->nacts = 0;
    scratch_reset(st);
}

static struct rdzv_action *push_action(struct rdzv_state *st, enum rdzv_action_kind kind,
                                       struct rdzv_peer *peer)
{
    if (st->nacts == st->acts_cap) {
        size_t cap = st->acts_cap ? st->acts_cap * 2 : 64;
        struct rdzv_action *a = realloc(st->acts, cap * sizeof(*a));
        if (a == NULL) {
            memset(&st->sink, 0, sizeof(st->sink));
            return &st->sink;
        }
        st->acts = a;
        st->acts_cap = cap;
    }
    struct rdzv_action *a = &st->acts[st->nacts++];
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->peer = peer;
    return a;
}

static void emit_error(struct rdzv_state *st, struct rdzv_peer *peer, int code, bool drop,
                       const char *message)
{
    struct rdzv_action *a = push_action(st, RDZV_ACT_ERROR, peer);
    a->error.code = code;
    a->error.message = message;
    a->error.drop = drop;
}

static void emit_result(struct rdzv_state *st, struct rdzv_peer *peer, uint64_t id, int code,
                        const char *message)
{
    struct rdzv_action *a = push_action(st, RDZV_ACT_RESULT, peer);
    a->result.id = id;
    a->result.code = code;
    a->result.message = message;
}

size_t rdzv_state_actions(const struct rdzv_state *st, const struct rdzv_action **out)
{
    *out = st->acts;
    return st->nacts;
}

/* ---- timers ---- */

static bool due_less(const struct cddp_heap_node *a, const struct cddp_heap_node *b)
{
    const struct timer *x = cddp_heap_data(a, struct timer, node);
    const struct timer *y = cddp_heap_data(b, struct timer, node);
    return x->due != y->due ? x->due < y->due : x->seq < y->seq;
}

static struct timer *first_timer(const struct rdzv_state *st)
{
    struct cddp_heap_node *n = cddp_heap_min(&st->timers);
    return n ? cddp_heap_data(n, struct timer, node) : NULL;
}

static void timer_init(struct timer *t, enum timer_kind kind, void *owner)
{
    t->due = RDZV_NEVER;
    t->seq = 0;
    t->armed = false;
    t->kind = kind;
    t->owner = owner;
}

static bool timer_armed(const struct timer *t)
{
    return t->armed;
}

static void timer_disarm(struct rdzv_state *st, struct timer *t)
{
    if (!t->armed)
        return;
    t->armed = false;
    cddp_heap_remove(&st->timers, &t->node, due_less);
}

/* Arms (or moves) t to due. The heap is intrusive: this cannot fail. */
static void timer_arm(struct rdzv_state *st, struct timer *t, uint64_t due)
{
    timer_disarm(st, t);
    if (due == RDZV_NEVER)
        return;
    t->due = due;
    t->seq = st->timer_seq++;
    t->armed = true;
    cddp_heap_insert(&st->timers, &t->node, due_less);
}

uint64_t rdzv_state_next_deadline(const struct rdzv_state *st)
{
    const struct timer *t = first_timer(st);
    return t ? t->due : RDZV_NEVER;
}

static uint64_t add_ms(uint64_t now, uint64_t ms)
{
    return ms > RDZV_NEVER - 1 - now ? RDZV_NEVER - 1 : now + ms;
}

/* ---- state, runs, nodes ---- */

void rdzv_peer_init(struct rdzv_peer *p, const char *addr, bool loopback, void *data)
{
    memset(p, 0, sizeof(*p));
    kvstore_owner_init(&p->store_owner);
    p->data = data;
    p->loopback = loopback;
    if (addr)
        cddp_strlcpy(p->addr, addr, sizeof(p->addr));
}

const char *rdzv_peer_run_id(const struct rdzv_peer *p)
{
    return p && p->run ? p->run->id : NULL;
}

const char *rdzv_peer_node_id(const struct rdzv_peer *p)
{
    return p && p->node ? p->node->id : NULL;
}

struct rdzv_state *rdzv_state_new(const struct rdzv_state_options *o)
{
    struct rdzv_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NULL;
    if (o)
        st->opt = *o;
    if (st->opt.max_runs == 0)
        st->opt.max_runs = 10000;
    cddp_strmap_init(&st->runs, st->opt.seed[0], st->opt.seed[1]);
    cddp_queue_init(&st->run_list);
    cddp_heap_init(&st->timers);
    return st;
}

static void node_set_state(struct rdzv_node *n, enum node_state s)
{
    struct rdzv_run *run = n->run;
    cddp_queue_remove(&n->link);
    run->count[n->state]--;
    n->state = s;
    cddp_queue_insert_tail(&run->lists[s], &n->link);
    run->count[s]++;
}

/* Frees a node; its peer forgets it. The caller has dealt with its role. */
static void node_free(struct rdzv_state *st, struct rdzv_node *n)
{
    struct rdzv_run *run = n->run;
    cddp_queue_remove(&n->link);
    run->count[n->state]--;
    timer_disarm(st, &n->beat);
    timer_disarm(st, &n->join);
    cddp_strmap_del(&run->nodes, n->id, n->idlen);
    if (n->peer)
        n->peer->node = NULL;
    free(n->local_addr);
    free(n->hostname);
    free(n);
}

static struct rdzv_run *run_new(struct rdzv_state *st, const char *run_id)
{
    size_t idlen = strlen(run_id);
    struct rdzv_run *run = calloc(1, sizeof(*run) + idlen + 1);
    if (run == NULL)
        return NULL;
    memcpy(run->id, run_id, idlen + 1);
    run->idlen = idlen;
    run->phase = RDZV_FORMING;
    run->round = 1; /* 0 means "no round yet" everywhere in cddp */
    for (int i = 0; i < N_COUNT; i++)
        cddp_queue_init(&run->lists[i]);
    timer_init(&run->last_call, T_LAST_CALL, run);
    timer_init(&run->store_timer, T_STORE, run);
    timer_init(&run->gc, T_GC, run);
    timer_init(&run->rebuild, T_REBUILD, run);
    cddp_strmap_init(&run->nodes, st->opt.seed[0] ^ 0x5bd1e995u, st->opt.seed[1]);
    run->store = kvstore_new(&st->opt.store_limits, st->opt.seed[1], st->opt.seed[0]);
    if (run->store == NULL || cddp_strmap_put(&st->runs, run->id, idlen, run) != 0) {
        kvstore_free(run->store);
        free(run);
        return NULL;
    }
    cddp_queue_insert_tail(&st->run_list, &run->link);
    st->nruns++;
    return run;
}

static void rebuild_end(struct rdzv_state *st, struct rdzv_run *run)
{
    run->rebuilding = false;
    timer_disarm(st, &run->rebuild);
    free(run->rebuild_back);
    free(run->rebuild_master);
    run->rebuild_back = NULL;
    run->rebuild_master = NULL;
}

static void run_free(struct rdzv_state *st, struct rdzv_run *run)
{
    rebuild_end(st, run);
    for (int i = 0; i < N_COUNT; i++) {
        while (!cddp_queue_empty(&run->lists[i]))
            node_free(st, cddp_queue_data(cddp_queue_head(&run->lists[i]), struct rdzv_node, link));
    }
    timer_disarm(st, &run->last_call);
    timer_disarm(st, &run->store_timer);
    timer_disarm(st, &run->gc);
    kvstore_free(run->store);
    cddp_strmap_free(&run->nodes);
    cddp_strmap_del(&st->runs, run->id, run->idlen);
    cddp_queue_remove(&run->link);
    st->nruns--;
    free(run->close_reason);
    free(run->ranked);
    free(run);
}

void rdzv_state_free(struct rdzv_state *st)
{
    if (st == NULL)
        return;
    while (!cddp_queue_empty(&st->run_list))
        run_free(st, cddp_queue_data(cddp_queue_head(&st->run_list), struct rdzv_run, link));
    cddp_strmap_free(&st->runs);
    free(st->acts);
    scratch_reset(st);
    free(st->scratch);
    free(st);
}

static void touch(struct rdzv_peer *peer, uint64_t now)
{
    if (peer->node)
        peer->node->last_beat = now;
}

/* ---- rounds ---- */

static int cmp_rest(const void *a, const void *b)
{
    const struct rdzv_node *x = *(struct rdzv_node *const *)a;
    const struct rdzv_node *y = *(struct rdzv_node *const *)b;
    /* Survivors (in their old rank order) before newcomers (by node id). */
    if ((x->prev_rank >= 0) != (y->prev_rank >= 0))
        return x->prev_rank >= 0 ? -1 : 1;
    if (x->prev_rank >= 0)
        return x->prev_rank < y->prev_rank ? -1 : x->prev_rank > y->prev_rank;
    return strcmp(x->id, y->id);
}

/* MASTER_ADDR: node 0's address as the others reach it. */
static const char *master_addr(struct rdzv_run *run, struct rdzv_node *n0)
{
    struct rdzv_peer *p = n0->peer;
    if (n0->local_addr)
        return n0->local_addr;
    if (p->addr[0] && !p->loopback)
        return p->addr;
    /* Node 0 came over loopback: right if every node is on this machine. */
    bool all_local = true;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &run->lists[N_PARTICIPANT])
    {
        struct rdzv_peer *o = cddp_queue_data(q, struct rdzv_node, link)->peer;
        if (o->addr[0] && !o->loopback) {
            all_local = false;
            break;
        }
    }
    if (all_local && p->addr[0])
        return p->addr;
    if (n0->hostname)
        return n0->hostname;
    return p->addr[0] ? p->addr : "127.0.0.1";
}

static void fail_round(struct rdzv_state *st, struct rdzv_run *run, uint64_t now, const char *why);

/* Does the round ranked in slot go on with the last round's worker group
 * in place? It does when the last round ended for a lost member (not a
 * counted failure), the shape is the same (nodes, world size, node 0 and
 * its MASTER_PORT), every member that stayed keeps its node rank and rank
 * offset, and newcomers fill the rest: then the newcomers' global ranks,
 * comma-separated (NULL: no; also when they do not fit on the wire). */
static const char *in_place(struct rdzv_state *st, const struct rdzv_run *run,
                            struct rdzv_node *const *slot, size_t n, int world)
{
    if (!run->had_round || run->last_counted || (int)n != run->last_nnodes ||
        world != run->last_world || slot[0]->prev_rank != 0 ||
        slot[0]->master_port != run->last_master_port)
        return NULL;
    char *text = scratch_alloc(st, PROTO_MAX_REPLACED + 1);
    if (text == NULL)
        return NULL;
    size_t len = 0;
    int offset = 0;
    for (size_t i = 0; i < n; i++) {
        const struct rdzv_node *node = slot[i];
        if (node->prev_rank >= 0 && (node->prev_rank != (int)i || node->prev_offset != offset))
            return NULL; /* a member that stayed would move */
        for (int r = offset; node->prev_rank < 0 && r < offset + node->nproc; r++) {
            int w = snprintf(text + len, PROTO_MAX_REPLACED + 1 - len, "%s%d", len ? "," : "", r);
            if (w < 0 || (size_t)w >= PROTO_MAX_REPLACED + 1 - len)
                return NULL;
            len += (size_t)w;
        }
        offset += node->nproc;
    }
    return len > 0 ? text : NULL;
}

static void complete_round(struct rdzv_state *st, struct rdzv_run *run, uint64_t now)
{
    size_t n = run->count[N_PARTICIPANT];
    if (n > run->ranked_cap) {
        struct rdzv_node **r = realloc(run->ranked, n * sizeof(*r));
        if (r == NULL)
            return; /* tried again at the next event */
        run->ranked = r;
        run->ranked_cap = n;
    }
    struct rdzv_node **rest = malloc(n * sizeof(*rest));
    if (rest == NULL)
        return;
    struct rdzv_node **slot = run->ranked;
    memset(slot, 0, n * sizeof(*slot));
    size_t nrest = 0;
    int64_t world = 0;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &run->lists[N_PARTICIPANT])
    {
        struct rdzv_node *node = cddp_queue_data(q, struct rdzv_node, link);
        world += node->nproc;
        if (node->prev_rank >= 0 && (size_t)node->prev_rank < n && slot[node->prev_rank] == NULL)
            slot[node->prev_rank] = node;
        else
            rest[nrest++] = node;
    }
    if (world > INT32_MAX) {
        free(rest);
        fail_round(st, run, now,
                   scratch_printf(st, "world size %lld of run '%s' exceeds 2^31-1",
                                  (long long)world, run->id));
        return;
    }
    qsort(rest, nrest, sizeof(*rest), cmp_rest);
    for (size_t i = 0, j = 0; i < n; i++) {
        if (slot[i] == NULL)
            slot[i] = rest[j++];
    }
    free(rest);

    const char *maddr = scratch_strdup(st, master_addr(run, slot[0]));
    int mport = slot[0]->master_port;
    const char *replaced = in_place(st, run, slot, n, (int)world);
    run->generation = replaced ? run->generation + 1 : 0;
    run->generation_at = 0;
    run->last_nnodes = (int)n;
    run->last_world = (int)world;
    run->last_master_port = mport;
    int offset = 0;
    for (size_t i = 0; i < n; i++) {
        struct rdzv_node *node = slot[i];
        node->prev_rank = (int)i;
        node->prev_offset = offset;
        node_set_state(node, N_ACTIVE);
        timer_disarm(st, &node->join);
        struct rdzv_action *a = push_action(st, RDZV_ACT_ROUND, node->peer);
        a->round = (struct proto_round){.run_id = run->id,
                                        .round = run->round,
                                        .node_rank = (int)i,
                                        .nnodes = (int)n,
                                        .world_size = (int)world,
                                        .rank_offset = offset,
                                        .nproc = node->nproc,
                                        .master_addr = maddr,
                                        .master_port = mport,
                                        .restart_count = (int64_t)run->counted_restarts,
                                        .generation = run->generation,
                                        .replaced = replaced};
        offset += node->nproc;
    }
    /* Nodes outside this round lose their old rank; late members are no
     * longer expected. */
    while (!cddp_queue_empty(&run->lists[N_RESTARTING]))
        node_set_state(
            cddp_queue_data(cddp_queue_head(&run->lists[N_RESTARTING]), struct rdzv_node, link),
            N_IDLE);
    cddp_queue_foreach(q, &run->lists[N_IDLE])
    {
        cddp_queue_data(q, struct rdzv_node, link)->prev_rank = -1;
    }
    cddp_queue_foreach(q, &run->lists[N_WAITING])
    {
        cddp_queue_data(q, struct rdzv_node, link)->prev_rank = -1;
    }
    run->phase = RDZV_RUNNING;
    run->round_at = now;
    run->had_round = true;
    run->expecting = false;
    timer_disarm(st, &run->last_call);
}

static void join_as_participant(struct rdzv_state *st, struct rdzv_node *node, uint64_t now)
{
    /* The last round's step times say nothing of the next one's. */
    node->has_perf = false;
    memset(&node->judged, 0, sizeof(node->judged));
    node_set_state(node, N_PARTICIPANT);
    timer_arm(st, &node->join, add_ms(now, node->join_timeout_ms));
    struct rdzv_action *a = push_action(st, RDZV_ACT_JOINED, node->peer);
    a->joined.round = node->run->round;
    a->joined.waiting = false;
}

/* Decides whether the forming round completes now, or arms last call. */
static void check_complete(struct rdzv_state *st, struct rdzv_run *run, uint64_t now)
{
    if (run->phase != RDZV_FORMING)
        return;
    while (run->count[N_WAITING] > 0 &&
           run->count[N_PARTICIPANT] + run->count[N_RESTARTING] < (size_t)run->max_nodes)
        join_as_participant(
            st, cddp_queue_data(cddp_queue_head(&run->lists[N_WAITING]), struct rdzv_node, link),
            now);
    size_t p = run->count[N_PARTICIPANT];
    if (p == 0 || p < (size_t)run->min_nodes) {
        timer_disarm(st, &run->last_call);
        return;
    }
    if (p >= (size_t)run->max_nodes || (run->expecting && run->count[N_RESTARTING] == 0) ||
        (!run->had_round && run->resume_nodes > 0 && p >= (size_t)run->resume_nodes)) {
        complete_round(st, run, now);
        return;
    }
    /* After a restart the members still stopping their workers are waited
     * for (dead ones are removed by their heartbeats), even with
     * last_call_timeout=0: completing without them would make each late
     * member's join restart the round again, for ever. */
    if (run->last_call_ms == 0 && !run->expecting) {
        complete_round(st, run, now);
        return;
    }
    if (run->last_call_ms == 0)
        return;
    if (!timer_armed(&run->last_call))
        timer_arm(st, &run->last_call, add_ms(now, run->last_call_ms));
}

/* Ends the running round: every member is told to restart and is expected
 * in the next one. The caller then adds joiners and calls check_complete. */
static void restart(struct rdzv_state *st, struct rdzv_run *run, const char *reason,
                    const char *node_id, bool counted)
{
    const char *r = scratch_strdup(st, reason);
    const char *nid = scratch_strdup(st, node_id);
    rebuild_end(st, run);
    run->round++;
    run->restarts++;
    run->last_counted = counted;
    if (counted)
        run->counted_restarts++;
    run->phase = RDZV_FORMING;
    run->expecting = run->count[N_ACTIVE] > 0;
    timer_disarm(st, &run->last_call);
    while (!cddp_queue_empty(&run->lists[N_ACTIVE])) {
        struct rdzv_node *node =
            cddp_queue_data(cddp_queue_head(&run->lists[N_ACTIVE]), struct rdzv_node, link);
        node_set_state(node, N_RESTARTING);
        struct rdzv_action *a = push_action(st, RDZV_ACT_RESTART, node->peer);
        a->restart.round = run->round;
        a->restart.reason = r;
        a->restart.node_id = nid;
        a->restart.counted = counted;
        a->restart.restart_count = (int64_t)run->counted_restarts;
    }
}

/* A round that can never run (world size overflow): every participant gets
 * the error and the run closes. */
static void close_run(struct rdzv_state *st, struct rdzv_run *run, uint64_t now,
                      const char *reason);

static void fail_round(struct rdzv_state *st, struct rdzv_run *run, uint64_t now, const char *why)
{
    struct cddp_queue *q;
    cddp_queue_foreach(q, &run->lists[N_PARTICIPANT])
    {
        emit_error(st, cddp_queue_data(q, struct rdzv_node, link)->peer, CDDP_ECONFIG, false, why);
    }
    close_run(st, run, now, why);
}

/* A node is gone (connection lost, heartbeats missed, left, timed out,
 * replaced). Members left behind restart at once. */
static void node_remove(struct rdzv_state *st, struct rdzv_node *node, uint64_t now,
                        const char *reason)
{
    struct rdzv_run *run = node->run;
    enum node_state was = node->state;
    const char *id = scratch_strdup(st, node->id);
    node_free(st, node);
    if (run->phase == RDZV_CLOSED)
        return;
    if (was == N_ACTIVE && run->phase == RDZV_RUNNING)
        restart(st, run, reason, id, false);
    check_complete(st, run, now);
}

/* What a join or resume of a closed run is told (its reason, or "closed"
 * when the copy of the reason could not be made). */
static const char *closed_message(struct rdzv_state *st, const struct rdzv_run *run)
{
    return scratch_printf(st, "rendezvous '%s' is closed (%s)", run->id,
                          run->close_reason ? run->close_reason : "closed");
}

static void close_run(struct rdzv_state *st, struct rdzv_run *run, uint64_t now, const char *reason)
{
    if (run->phase == RDZV_CLOSED)
        return;
    rebuild_end(st, run);
    run->phase = RDZV_CLOSED;
    run->closed_at = now;
    free(run->close_reason);
    run->close_reason = strdup(reason ? reason : "closed");
    const char *r = scratch_strdup(st, reason ? reason : "closed");
    for (int i = 0; i < N_COUNT; i++) {
        while (!cddp_queue_empty(&run->lists[i])) {
            struct rdzv_node *node =
                cddp_queue_data(cddp_queue_head(&run->lists[i]), struct rdzv_node, link);
            push_action(st, RDZV_ACT_CLOSED, node->peer)->closed.reason = r;
            node_free(st, node);
        }
    }
    timer_disarm(st, &run->last_call);
}

/* Frees a run nobody uses any more; a closed one only after close_timeout. */
static void maybe_gc(struct rdzv_state *st, struct rdzv_run *run, uint64_t now)
{
    /* A plain store keeps its keys for as long as the server runs: a client
     * may set a key and go before the others come for it. */
    if (run->npeers > 0 || st->opt.store_only)
        return;
    if (run->phase != RDZV_CLOSED) {
        run_free(st, run);
        return;
    }
    uint64_t due = add_ms(run->closed_at, run->close_timeout_ms);
    if (now >= due)
        run_free(st, run);
    else
        timer_arm(st, &run->gc, due);
}

/* ---- the calls ---- */

static const char *phase_name(enum rdzv_phase p)
{
    return p == RDZV_FORMING ? "forming" : p == RDZV_RUNNING ? "running" : "closed";
}

int rdzv_state_hello(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                     const char *run_id, char *err, size_t errlen)
{
    (void)now;
    begin(st);
    if (peer->run) {
        snprintf(err, errlen, "hello sent twice on one connection");
        emit_error(st, peer, CDDP_ESTATE, true, scratch_strdup(st, err));
        return CDDP_ESTATE;
    }
    if (st->opt.store_only || run_id == NULL)
        run_id = "";
    struct rdzv_run *run = cddp_strmap_get(&st->runs, run_id, strlen(run_id));
    if (run == NULL) {
        if (st->nruns >= st->opt.max_runs) {
            snprintf(err, errlen, "this server already serves %zu runs (its limit)", st->nruns);
            emit_error(st, peer, CDDP_ETOOBIG, true, scratch_strdup(st, err));
            return CDDP_ETOOBIG;
        }
        run = run_new(st, run_id);
        if (run == NULL) {
            snprintf(err, errlen, "out of memory");
            emit_error(st, peer, CDDP_ERR_FROM_ERRNO(ENOMEM), true, "out of memory");
            return CDDP_ERR_FROM_ERRNO(ENOMEM);
        }
    }
    peer->run = run;
    run->npeers++;
    timer_disarm(st, &run->gc);
    return 0;
}

static bool need_run(struct rdzv_state *st, struct rdzv_peer *peer)
{
    if (peer->run)
        return true;
    emit_error(st, peer, CDDP_ESTATE, true, "send hello first");
    return false;
}

/* The peer's run, for the rendezvous messages (join, resume, close); NULL,
 * the peer told why, on a store-only server or before hello. */
static struct rdzv_run *need_rendezvous(struct rdzv_state *st, struct rdzv_peer *peer)
{
    if (st->opt.store_only) {
        emit_error(st, peer, CDDP_ESTATE, true,
                   "this server is a plain key-value store; it runs no rendezvous");
        return NULL;
    }
    return need_run(st, peer) ? peer->run : NULL;
}

/* Checks a join (or a rebuilding resume's join) against the run: its
 * rdzv_conf (into *conf) and its --nnodes. 0, or the code with *why. */
static int check_join(struct rdzv_state *st, const struct rdzv_run *run, const struct proto_join *j,
                      struct rdzv_conf *conf, const char **why)
{
    char err[512];
    rdzv_conf_init(conf);
    for (size_t i = 0; i < j->nconf; i++) {
        if (rdzv_conf_set(conf, j->conf[i].key, j->conf[i].value, err, sizeof(err)) != 0) {
            *why = scratch_strdup(st, err);
            return CDDP_ECONFIG;
        }
    }
    if (run->configured && (j->min_nodes != run->min_nodes || j->max_nodes != run->max_nodes)) {
        *why = scratch_printf(st,
                              "run '%s' was started with --nnodes=%d:%d; node '%s' asks "
                              "for %d:%d",
                              run->id, run->min_nodes, run->max_nodes, j->node_id, j->min_nodes,
                              j->max_nodes);
        return CDDP_EMISMATCH;
    }
    return 0;
}

/* A new node of run on peer, idle; NULL (the peer told) when out of memory. */
static struct rdzv_node *node_new(struct rdzv_state *st, struct rdzv_run *run,
                                  struct rdzv_peer *peer, const char *id)
{
    size_t idlen = strlen(id);
    struct rdzv_node *node = calloc(1, sizeof(*node) + idlen + 1);
    if (node == NULL) {
        emit_error(st, peer, CDDP_ERR_FROM_ERRNO(ENOMEM), true, "out of memory");
        return NULL;
    }
    memcpy(node->id, id, idlen + 1);
    node->idlen = idlen;
    node->run = run;
    node->peer = peer;
    node->prev_rank = -1;
    node->state = N_IDLE;
    cddp_queue_init(&node->link);
    cddp_queue_insert_tail(&run->lists[N_IDLE], &node->link);
    run->count[N_IDLE]++;
    timer_init(&node->beat, T_BEAT, node);
    timer_init(&node->join, T_JOIN, node);
    if (cddp_strmap_put(&run->nodes, node->id, idlen, node) != 0) {
        node_free(st, node);
        emit_error(st, peer, CDDP_ERR_FROM_ERRNO(ENOMEM), true, "out of memory");
        return NULL;
    }
    peer->node = node;
    return node;
}

/* Takes what a join says: the run's settings (from its first node), the
 * node's own; its heartbeats are watched from now. */
static void configure(struct rdzv_state *st, struct rdzv_run *run, struct rdzv_node *node,
                      const struct proto_join *j, const struct rdzv_conf *conf, uint64_t now)
{
    if (!run->configured) {
        run->configured = true;
        run->min_nodes = j->min_nodes;
        run->max_nodes = j->max_nodes;
        run->last_call_ms = conf->last_call_timeout_ms;
        run->close_timeout_ms = conf->close_timeout_ms;
    }
    node->nproc = j->nproc;
    node->master_port = j->master_port;
    node->status_port = j->status_port;
    free(node->local_addr);
    free(node->hostname);
    node->local_addr = j->local_addr && j->local_addr[0] ? strdup(j->local_addr) : NULL;
    node->hostname = j->hostname && j->hostname[0] ? strdup(j->hostname) : NULL;
    node->join_timeout_ms = conf->join_timeout_ms;
    node->keep_alive_ms = conf->keep_alive_interval_ms;
    node->keep_alive_max = conf->keep_alive_max_attempt;
    node->dead_after_ms = rdzv_conf_dead_after_ms(conf);
    node->last_beat = now;
    node->joined_at = now;
    if (!timer_armed(&node->beat))
        timer_arm(st, &node->beat, add_ms(now, node->dead_after_ms));
}

void rdzv_state_join(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                     const struct proto_msg *m)
{
    begin(st);
    struct rdzv_run *run = need_rendezvous(st, peer);
    if (run == NULL)
        return;
    if (run->phase == RDZV_CLOSED) {
        emit_error(st, peer, CDDP_ECLOSED, false, closed_message(st, run));
        return;
    }
    struct rdzv_conf conf;
    const char *why;
    int rc = check_join(st, run, &m->join, &conf, &why);
    if (rc) {
        emit_error(st, peer, rc, false, why);
        return;
    }

    struct rdzv_node *node = peer->node;
    if (node && strcmp(node->id, m->join.node_id) != 0) {
        emit_error(st, peer, CDDP_ESTATE, false,
                   scratch_printf(st, "this connection already joined as '%s'", node->id));
        return;
    }
    if (node == NULL) {
        struct rdzv_node *other =
            cddp_strmap_get(&run->nodes, m->join.node_id, strlen(m->join.node_id));
        if (other) {
            /* A reconnecting agent replaces its stale connection. */
            emit_error(
                st, other->peer, CDDP_EEXISTS, true,
                scratch_printf(st, "node '%s' joined again on another connection", other->id));
            node_remove(st, other, now, "node_replaced");
            if (run->phase == RDZV_CLOSED)
                return;
        }
        if ((node = node_new(st, run, peer, m->join.node_id)) == NULL)
            return;
    }
    if (!run->had_round && run->phase == RDZV_FORMING) {
        /* Nodes that ran before (a restarted server): the job goes on. */
        if (m->join.round >= run->round && m->join.round < (uint64_t)PROTO_MAX_INT)
            run->round = m->join.round + 1;
        if (m->join.restart_count > (int64_t)run->counted_restarts)
            run->counted_restarts = (uint64_t)m->join.restart_count;
        if (m->join.last_nnodes > run->resume_nodes)
            run->resume_nodes = m->join.last_nnodes;
    }
    configure(st, run, node, &m->join, &conf, now);

    struct rdzv_action *a;
    switch (node->state) {
    case N_PARTICIPANT: /* a repeated join: say again where it stands */
    case N_WAITING:
        a = push_action(st, RDZV_ACT_JOINED, peer);
        a->joined.round = run->round;
        a->joined.waiting = node->state == N_WAITING;
        return;
    case N_ACTIVE:
        /* A member asks for a new round (its agent restarts on its own):
         * the others restart too, not counted, as torch's rejoin does. */
        node_set_state(node, N_IDLE);
        restart(st, run, "node_rejoined", node->id, false);
        join_as_participant(st, node, now);
        check_complete(st, run, now);
        return;
    case N_RESTARTING:
        join_as_participant(st, node, now);
        check_complete(st, run, now);
        return;
    case N_IDLE:
    default:
        break;
    }
    if (run->phase == RDZV_RUNNING) {
        /* While a round is rebuilt, a node that ran in it (or in a later
         * one) and joins instead of resuming has stopped its workers: the
         * round cannot be rebuilt. Any other node waits for the outcome. */
        bool member = run->rebuilding && m->join.round >= run->round;
        if (member || (!run->rebuilding && run->count[N_ACTIVE] < (size_t)run->max_nodes)) {
            restart(st, run, member ? "node_rejoined" : "node_joined", node->id, false);
            join_as_participant(st, node, now);
            check_complete(st, run, now);
            return;
        }
    } else if (run->count[N_PARTICIPANT] + run->count[N_RESTARTING] < (size_t)run->max_nodes) {
        join_as_participant(st, node, now);
        check_complete(st, run, now);
        return;
    }
    /* Full: wait for a place (torch's redundancy list). */
    node_set_state(node, N_WAITING);
    a = push_action(st, RDZV_ACT_JOINED, peer);
    a->joined.round = run->round;
    a->joined.waiting = true;
}

void rdzv_state_heartbeat(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer)
{
    begin(st);
    touch(peer, now);
    if (peer->heartbeat_ack)
        push_action(st, RDZV_ACT_HEARTBEAT, peer)->heartbeat.waiting =
            peer->run ? peer->run->count[N_WAITING] : 0;
}

/* ---- stragglers: nodes slower than the job's others ---- */

#define STRAGGLER_JUDGE_MS 1000
#define STRAGGLER_DEFAULT_FACTOR 1.5

/* Judges the active members' summaries (common/straggler.h); every change
 * is an RDZV_ACT_STRAGGLER, for the log. */
static void judge_stragglers(struct rdzv_state *st, struct rdzv_run *run, uint64_t now)
{
    run->judged_at = now;
    size_t n = run->count[N_ACTIVE];
    struct rdzv_node **nodes = malloc(n * sizeof(*nodes) + 1);
    struct straggler_member *m = malloc(n * sizeof(*m) + 1);
    double *scratch = malloc(n * sizeof(*scratch) + 1);
    struct straggler_change *ch = malloc(n * sizeof(*ch) + 1);
    if (nodes == NULL || m == NULL || scratch == NULL || ch == NULL)
        goto out; /* judged again at the next heartbeat */
    size_t k = 0, measured = 0, with_compute = 0;
    double factor = 0;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &run->lists[N_ACTIVE])
    {
        struct rdzv_node *node = cddp_queue_data(q, struct rdzv_node, link);
        nodes[k++] = node;
        if (!node->has_perf)
            continue;
        measured++;
        with_compute += node->perf.compute_s >= 0;
        if (node->perf.factor > factor)
            factor = node->perf.factor;
    }
    bool compute = measured > 0 && with_compute == measured;
    for (size_t i = 0; i < k; i++) {
        m[i] = nodes[i]->judged;
        m[i].value = !nodes[i]->has_perf ? 0
                     : compute           ? nodes[i]->perf.compute_s
                                         : nodes[i]->perf.step_s;
    }
    run->step_median_s = straggler_median(m, k, scratch);
    run->step_compute = compute;
    run->straggler_factor = factor > 1 ? factor : STRAGGLER_DEFAULT_FACTOR;
    size_t nch = straggler_mark(m, k, run->step_median_s, run->straggler_factor, now, ch);
    for (size_t i = 0; i < k; i++)
        nodes[i]->judged = m[i];
    for (size_t i = 0; i < nch; i++) {
        const struct rdzv_node *node = nodes[ch[i].index];
        struct rdzv_action *a = push_action(st, RDZV_ACT_STRAGGLER, node->peer);
        a->straggler.run_id = run->id;
        a->straggler.node_id = node->id;
        a->straggler.slow = ch[i].slow;
        a->straggler.time_s = m[ch[i].index].value;
        a->straggler.median_s = run->step_median_s;
        a->straggler.ratio = m[ch[i].index].ratio;
        a->straggler.compute = compute;
        a->straggler.max_rank = node->has_perf ? node->perf.max_rank : -1;
    }
out:
    free(nodes);
    free(m);
    free(scratch);
    free(ch);
}

void rdzv_state_heartbeat_perf(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                               const struct proto_perf *perf)
{
    rdzv_state_heartbeat(st, now, peer);
    struct rdzv_node *node = peer->node;
    if (node == NULL)
        return;
    node->has_perf = perf != NULL;
    if (perf)
        node->perf = *perf;
    struct rdzv_run *run = node->run;
    if (run->phase == RDZV_RUNNING && node->state == N_ACTIVE &&
        now - run->judged_at >= STRAGGLER_JUDGE_MS)
        judge_stragglers(st, run, now);
}

/* The round is whole again: it runs on as if the server had never gone.
 * Nodes that joined meanwhile are taken now, as a join would have been. */
static void rebuild_done(struct rdzv_state *st, struct rdzv_run *run, uint64_t now)
{
    rebuild_end(st, run);
    if (run->count[N_WAITING] == 0 || run->count[N_ACTIVE] >= (size_t)run->max_nodes)
        return;
    struct rdzv_node *w =
        cddp_queue_data(cddp_queue_head(&run->lists[N_WAITING]), struct rdzv_node, link);
    restart(st, run, "node_joined", w->id, false);
    check_complete(st, run, now);
}

/* A member of a running round re-registers with a server that does not
 * know it (a restarted one): the first one creates the round as it says
 * (number, node count, world size, MASTER_ADDR/PORT, restart count) and
 * starts its resume_timeout; the others must say the same and take the
 * ranks still free. The result is OK at once: the workers run on. */
static void rebuild_member(struct rdzv_state *st, struct rdzv_run *run, uint64_t now,
                           struct rdzv_peer *peer, const struct proto_msg *m)
{
    const struct proto_round *r = &m->resume.member;
    const struct proto_join *j = &m->resume.join;
    struct rdzv_conf conf;
    const char *why;
    int rc = check_join(st, run, j, &conf, &why);
    if (rc) {
        emit_result(st, peer, m->id, rc, why);
        return;
    }
    if (!run->rebuilding) {
        if (run->configured || run->had_round) {
            emit_result(st, peer, m->id, CDDP_ESTATE,
                        scratch_printf(st,
                                       "run '%s' is %s round %llu without node '%s': it must "
                                       "join again",
                                       run->id, phase_name(run->phase),
                                       (unsigned long long)run->round, j->node_id));
            return;
        }
        uint64_t grace = rdzv_conf_resume_timeout_ms(&conf);
        if (grace == 0 || r->nnodes < j->min_nodes || r->nnodes > j->max_nodes) {
            emit_result(st, peer, m->id, CDDP_ESTATE,
                        scratch_printf(st,
                                       "round %llu of run '%s' (%d nodes, --nnodes=%d:%d) is not "
                                       "rebuilt%s: node '%s' must join again",
                                       (unsigned long long)r->round, run->id, r->nnodes,
                                       j->min_nodes, j->max_nodes,
                                       grace == 0 ? " (resume_timeout=0)" : "", j->node_id));
            return;
        }
        run->rebuild_back = calloc((size_t)r->nnodes, 1);
        run->rebuild_master = strdup(r->master_addr);
        if (run->rebuild_back == NULL || run->rebuild_master == NULL) {
            rebuild_end(st, run);
            emit_result(st, peer, m->id, CDDP_ERR_FROM_ERRNO(ENOMEM), "out of memory");
            return;
        }
        run->rebuilding = true;
        run->rebuild_nnodes = r->nnodes;
        run->rebuild_world = r->world_size;
        run->rebuild_port = r->master_port;
        run->rebuild_count = 0;
        run->round = r->round;
        run->phase = RDZV_RUNNING;
        run->had_round = true;
        run->round_at = now;
        timer_arm(st, &run->rebuild, add_ms(now, grace));
    } else if (r->round != run->round || r->nnodes != run->rebuild_nnodes ||
               r->world_size != run->rebuild_world || r->master_port != run->rebuild_port ||
               strcmp(r->master_addr, run->rebuild_master) != 0) {
        emit_result(st, peer, m->id, CDDP_ESTATE,
                    scratch_printf(st,
                                   "run '%s' is rebuilding round %llu of %d nodes (world %d, "
                                   "master %s:%d); node '%s' ran round %llu of %d nodes (world "
                                   "%d, master %s:%d): it must join again",
                                   run->id, (unsigned long long)run->round, run->rebuild_nnodes,
                                   run->rebuild_world, run->rebuild_master, run->rebuild_port,
                                   j->node_id, (unsigned long long)r->round, r->nnodes,
                                   r->world_size, r->master_addr, r->master_port));
        return;
    } else if (run->rebuild_back[r->node_rank]) {
        emit_result(st, peer, m->id, CDDP_ESTATE,
                    scratch_printf(st,
                                   "node rank %d of round %llu of run '%s' is back already (as "
                                   "another node); node '%s' must join again",
                                   r->node_rank, (unsigned long long)run->round, run->id,
                                   j->node_id));
        return;
    }
    struct rdzv_node *node = node_new(st, run, peer, j->node_id);
    if (node == NULL)
        return;
    configure(st, run, node, j, &conf, now);
    node->prev_rank = r->node_rank;
    node_set_state(node, N_ACTIVE);
    run->rebuild_back[r->node_rank] = 1;
    run->rebuild_count++;
    if (r->restart_count > (int64_t)run->counted_restarts)
        run->counted_restarts = (uint64_t)r->restart_count;
    emit_result(st, peer, m->id, 0, NULL);
    if (run->rebuild_count == (size_t)run->rebuild_nnodes)
        rebuild_done(st, run, now);
}

void rdzv_state_resume(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                       const struct proto_msg *m)
{
    uint64_t id = m->id, round = m->resume.round;
    const char *node_id = m->resume.node_id;
    begin(st);
    struct rdzv_run *run = need_rendezvous(st, peer);
    if (run == NULL)
        return;
    struct rdzv_node *node = cddp_strmap_get(&run->nodes, node_id, strlen(node_id));
    if (node && peer->node == node) {
        touch(peer, now);
        emit_result(st, peer, id, 0, NULL); /* asked twice: it is here already */
        return;
    }
    if (peer->node) {
        emit_result(st, peer, id, CDDP_ESTATE,
                    scratch_printf(st, "this connection already joined as '%s'", peer->node->id));
        return;
    }
    if (run->phase == RDZV_CLOSED) {
        emit_result(st, peer, id, CDDP_ECLOSED, closed_message(st, run));
        return;
    }
    if (node == NULL && m->resume.rebuild) {
        rebuild_member(st, run, now, peer, m);
        return;
    }
    if (node == NULL) {
        emit_result(st, peer, id, CDDP_ESTATE,
                    scratch_printf(st,
                                   "run '%s' has no node '%s' any more (it was removed, or the "
                                   "server restarted)",
                                   run->id, node_id));
        return;
    }
    if (node->state != N_ACTIVE || run->phase != RDZV_RUNNING || run->round != round) {
        emit_result(st, peer, id, CDDP_ESTATE,
                    scratch_printf(st, "run '%s' is %s round %llu; node '%s' must join again",
                                   run->id, run->phase == RDZV_RUNNING ? "running" : "forming",
                                   (unsigned long long)run->round, node_id));
        return;
    }
    /* The same node, the same round: it only changes connection. */
    struct rdzv_peer *old = node->peer;
    old->node = NULL;
    node->peer = peer;
    peer->node = node;
    touch(peer, now);
    emit_error(st, old, CDDP_EEXISTS, true,
               scratch_printf(st, "node '%s' resumed on another connection", node->id));
    emit_result(st, peer, id, 0, NULL);
}

void rdzv_state_leave(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const char *reason, bool finished)
{
    (void)reason;
    begin(st);
    struct rdzv_node *node = peer->node;
    if (node == NULL)
        return;
    if (!finished) {
        node_remove(st, node, now, "node_left");
        return;
    }
    /* Its part of the job is done: the running round goes on without it.
     * Once every member has left so, the round's work is done, and the run
     * closes as a job that ended does: nodes still on its wait list hear it
     * (a running round without members would hold them for ever). */
    struct rdzv_run *run = node->run;
    node_free(st, node);
    if (run->phase == RDZV_RUNNING && run->count[N_ACTIVE] == 0 && !run->rebuilding) {
        close_run(st, run, now,
                  scratch_printf(st, "the job finished: every node of round %llu finished",
                                 (unsigned long long)run->round));
        return;
    }
    check_complete(st, run, now);
}

void rdzv_state_failure(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer, uint64_t round,
                        const char *reason)
{
    (void)reason;
    begin(st);
    touch(peer, now);
    struct rdzv_node *node = peer->node;
    if (node == NULL || node->state != N_ACTIVE || node->run->phase != RDZV_RUNNING ||
        round != node->run->round)
        return;
    restart(st, node->run, "worker_failure", node->id, true);
    check_complete(st, node->run, now);
}

static void refuse_replace(struct rdzv_state *st, struct rdzv_peer *peer, uint64_t round,
                           const char *why)
{
    struct rdzv_action *a = push_action(st, RDZV_ACT_GENERATION, peer);
    a->generation.round = round ? round : 1;
    a->generation.refused = why;
}

void rdzv_state_replace(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                        const struct proto_msg *m)
{
    begin(st);
    touch(peer, now);
    struct rdzv_node *node = peer->node;
    uint64_t round = m->replace.round;
    int rank = m->replace.rank;
    if (node == NULL || node->state != N_ACTIVE) {
        refuse_replace(st, peer, round, "this node is not a member of a running round");
        return;
    }
    struct rdzv_run *run = node->run;
    if (run->phase != RDZV_RUNNING || round != run->round || run->rebuilding) {
        refuse_replace(
            st, peer, round,
            scratch_printf(st, "round %llu is not the one running", (unsigned long long)round));
        return;
    }
    if (rank < node->prev_offset || rank >= node->prev_offset + node->nproc) {
        refuse_replace(st, peer, round,
                       scratch_printf(st, "rank %d is not one of this node's (%d..%d)", rank,
                                      node->prev_offset, node->prev_offset + node->nproc - 1));
        return;
    }
    char why[PROTO_MAX_REPLACED + 128];
    if (m->replace.ranks &&
        rdzv_ranks_check(m->replace.ranks, rank, node->prev_offset,
                         node->prev_offset + node->nproc - 1, why, sizeof(why)) != 0) {
        refuse_replace(st, peer, round, scratch_strdup(st, why));
        return;
    }
    if (run->generation_at != 0 && now < run->generation_at + RDZV_REPLACE_SETTLE_MS) {
        refuse_replace(st, peer, round,
                       scratch_printf(st,
                                      "generation %lld was granted %llu ms ago: a second "
                                      "failure this soon restarts the group",
                                      (long long)run->generation,
                                      (unsigned long long)(now - run->generation_at)));
        return;
    }
    run->generation++;
    run->generation_at = now ? now : 1;
    run->counted_restarts++; /* one of the job's restarts (--max_restarts) */
    /* (one restart of the job's, however many ranks it replaces) */
    const char *replaced =
        m->replace.ranks ? scratch_strdup(st, m->replace.ranks) : scratch_printf(st, "%d", rank);
    const char *nid = scratch_strdup(st, node->id);
    struct cddp_queue *q;
    cddp_queue_foreach(q, &run->lists[N_ACTIVE])
    {
        struct rdzv_node *member = cddp_queue_data(q, struct rdzv_node, link);
        struct rdzv_action *a = push_action(st, RDZV_ACT_GENERATION, member->peer);
        a->generation.round = run->round;
        a->generation.generation = run->generation;
        a->generation.replaced = replaced;
        a->generation.node_id = nid;
        a->generation.restart_count = (int64_t)run->counted_restarts;
    }
}

void rdzv_state_blame(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const struct proto_msg *m)
{
    begin(st);
    touch(peer, now);
    struct rdzv_node *node = peer->node;
    if (node == NULL || node->state != N_ACTIVE)
        return;
    struct rdzv_run *run = node->run;
    int rank = m->blame.rank;
    if (run->phase != RDZV_RUNNING || m->blame.round != run->round || run->rebuilding)
        return;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &run->lists[N_ACTIVE])
    {
        struct rdzv_node *owner = cddp_queue_data(q, struct rdzv_node, link);
        if (rank < owner->prev_offset || rank >= owner->prev_offset + owner->nproc)
            continue;
        if (owner == node)
            return; /* its own: its agent saw it */
        struct rdzv_action *a = push_action(st, RDZV_ACT_BLAME, owner->peer);
        a->blame.round = run->round;
        a->blame.rank = rank;
        a->blame.generation = m->blame.generation;
        a->blame.node_id = scratch_strdup(st, node->id);
        return;
    }
}

void rdzv_state_close(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const char *reason)
{
    begin(st);
    struct rdzv_run *run = need_rendezvous(st, peer);
    if (run == NULL)
        return;
    const char *r = reason && reason[0] ? reason : "closed";
    /* The closer hears back even if it never joined. */
    if (peer->node == NULL)
        push_action(st, RDZV_ACT_CLOSED, peer)->closed.reason =
            scratch_strdup(st, run->close_reason ? run->close_reason : r);
    close_run(st, run, now, r);
}

static void drain_store(struct rdzv_state *st, struct rdzv_run *run)
{
    struct kvstore_event ev;
    while (kvstore_next_event(run->store, &ev)) {
        struct rdzv_peer *peer = cddp_queue_data(ev.owner, struct rdzv_peer, store_owner);
        if (ev.kind == KVSTORE_TIMEOUT) {
            emit_result(st, peer, ev.req_id, CDDP_ETIMEOUT, "timed out waiting for the key(s)");
            continue;
        }
        struct rdzv_action *a = push_action(st, RDZV_ACT_RESULT, peer);
        a->result.id = ev.req_id;
        if (ev.is_get) {
            a->result.code = kvstore_get(run->store, ev.key, &a->result.value, &a->result.vlen);
            a->result.has_value = a->result.code == 0;
        }
    }
    timer_arm(st, &run->store_timer, kvstore_next_deadline(run->store));
}

static const char *store_error(struct rdzv_state *st, int rc, const char *key)
{
    switch (rc) {
    case CDDP_ENOTFOUND:
        return scratch_printf(st, "key '%.200s' not found", key);
    case CDDP_ETOOBIG:
        return "the store is full (its byte, key or waiter limit)";
    case CDDP_EPARSE:
        return scratch_printf(st, "key '%.200s' does not hold an integer", key);
    case CDDP_ERANGE_ARG:
        return "the result is outside +-2^53";
    default:
        return cddp_strerror(rc);
    }
}

/* The result of a store request that answers with a value (get,
 * compare_set): the value, or the error naming the key. */
static void emit_value(struct rdzv_state *st, struct rdzv_peer *peer, uint64_t id, int rc,
                       const void *val, size_t vlen, const char *key)
{
    struct rdzv_action *a = push_action(st, RDZV_ACT_RESULT, peer);
    a->result.id = id;
    a->result.code = rc;
    if (rc == 0) {
        a->result.has_value = true;
        a->result.value = val;
        a->result.vlen = vlen;
    } else {
        a->result.message = store_error(st, rc, key);
    }
}

void rdzv_state_store(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer,
                      const struct proto_msg *m)
{
    begin(st);
    if (!need_run(st, peer))
        return;
    touch(peer, now);
    struct rdzv_run *run = peer->run;
    struct kvstore *s = run->store;
    struct rdzv_action *a;
    const void *val;
    size_t vlen;
    bool ready;
    int rc;
    switch (m->type) {
    case PROTO_SET:
        rc = kvstore_set(s, m->set.key, m->set.value.data, m->set.value.len);
        emit_result(st, peer, m->id, rc, rc ? store_error(st, rc, m->set.key) : NULL);
        break;
    case PROTO_GET:
        rc = kvstore_get(s, m->get.key, &val, &vlen);
        if (rc == CDDP_ENOTFOUND && m->get.timeout_ms >= 0) {
            const char *keys[1] = {m->get.key};
            rc = kvstore_wait(s, keys, 1, add_ms(now, (uint64_t)m->get.timeout_ms),
                              &peer->store_owner, m->id, true, &ready);
            if (rc == 0)
                break; /* answered when the key is set or time is up */
        }
        emit_value(st, peer, m->id, rc, val, vlen, m->get.key);
        break;
    case PROTO_WAIT: {
        uint64_t deadline =
            m->wait.timeout_ms < 0 ? KVSTORE_NEVER : add_ms(now, (uint64_t)m->wait.timeout_ms);
        rc = kvstore_wait(s, m->wait.keys, m->wait.nkeys, deadline, &peer->store_owner, m->id,
                          false, &ready);
        if (rc || ready)
            emit_result(st, peer, m->id, rc, rc ? store_error(st, rc, m->wait.keys[0]) : NULL);
        break;
    }
    case PROTO_ADD: {
        int64_t n;
        rc = kvstore_add(s, m->add.key, m->add.delta, &n);
        a = push_action(st, RDZV_ACT_RESULT, peer);
        a->result.id = m->id;
        a->result.code = rc;
        if (rc == 0) {
            a->result.has_number = true;
            a->result.number = n;
        } else {
            a->result.message = store_error(st, rc, m->add.key);
        }
        break;
    }
    case PROTO_COMPARE_SET:
        rc = kvstore_compare_set(s, m->compare_set.key, m->compare_set.expected.data,
                                 m->compare_set.expected.len, m->compare_set.desired.data,
                                 m->compare_set.desired.len, &val, &vlen);
        emit_value(st, peer, m->id, rc, val, vlen, m->compare_set.key);
        break;
    default:
        emit_result(st, peer, m->id, CDDP_EPROTO_TYPE, "not a store request");
        return;
    }
    drain_store(st, run);
}

void rdzv_state_disconnect(struct rdzv_state *st, uint64_t now, struct rdzv_peer *peer)
{
    begin(st);
    if (peer->node)
        node_remove(st, peer->node, now, "node_lost");
    struct rdzv_run *run = peer->run;
    if (run == NULL)
        return;
    kvstore_cancel_owner(run->store, &peer->store_owner);
    timer_arm(st, &run->store_timer, kvstore_next_deadline(run->store));
    peer->run = NULL;
    run->npeers--;
    maybe_gc(st, run, now);
}

void rdzv_state_forget(struct rdzv_state *st, struct rdzv_peer *peer)
{
    begin(st);
    if (peer->node) {
        peer->node->peer = NULL;
        peer->node = NULL;
    }
    struct rdzv_run *run = peer->run;
    if (run == NULL)
        return;
    kvstore_cancel_owner(run->store, &peer->store_owner);
    peer->run = NULL;
    run->npeers--;
}

static void fire_timer(struct rdzv_state *st, struct timer *t, uint64_t now)
{
    switch (t->kind) {
    case T_BEAT: {
        struct rdzv_node *node = t->owner;
        uint64_t due = add_ms(node->last_beat, node->dead_after_ms);
        if (now < due) {
            timer_arm(st, t, due);
            return;
        }
        emit_error(st, node->peer, CDDP_ETIMEOUT, true,
                   scratch_printf(
                       st,
                       "node '%s' sent no heartbeat for %.1f s (keep_alive_interval=%.1f "
                       "s x keep_alive_max_attempt=%d): removed from run '%s'",
                       node->id, (double)(now - node->last_beat) / 1000.0,
                       (double)node->keep_alive_ms / 1000.0, node->keep_alive_max, node->run->id));
        node_remove(st, node, now, "heartbeat_timeout");
        return;
    }
    case T_JOIN: {
        struct rdzv_node *node = t->owner;
        struct rdzv_run *run = node->run;
        if (node->state != N_PARTICIPANT || run->phase != RDZV_FORMING)
            return;
        /* Enough nodes, but the last call (waiting for more, up to
         * max_nodes) outlasts this node's join_timeout: say that, or the
         * user reads "1 node(s) joined, min_nodes=1" and sees no cause. */
        char why[160] = "";
        if (timer_armed(&run->last_call) && run->count[N_PARTICIPANT] >= (size_t)run->min_nodes)
            snprintf(why, sizeof(why),
                     "; enough to start, but last_call_timeout=%.1f s, longer than join_timeout, "
                     "was still waiting for more nodes",
                     (double)run->last_call_ms / 1000.0);
        emit_error(st, node->peer, CDDP_ETIMEOUT, false,
                   scratch_printf(st,
                                  "rendezvous '%s' round %llu did not complete within "
                                  "join_timeout=%.1f s: %zu node(s) joined, min_nodes=%d%s",
                                  run->id, (unsigned long long)run->round,
                                  (double)node->join_timeout_ms / 1000.0, run->count[N_PARTICIPANT],
                                  run->min_nodes, why));
        node_remove(st, node, now, "join_timeout");
        return;
    }
    case T_LAST_CALL: {
        struct rdzv_run *run = t->owner;
        if (run->phase == RDZV_FORMING && run->count[N_PARTICIPANT] >= (size_t)run->min_nodes &&
            run->count[N_PARTICIPANT] > 0)
            complete_round(st, run, now);
        return;
    }
    case T_STORE: {
        struct rdzv_run *run = t->owner;
        kvstore_expire(run->store, now);
        drain_store(st, run);
        return;
    }
    case T_GC:
        maybe_gc(st, t->owner, now);
        return;
    case T_REBUILD: {
        /* Members are missing: the others go on in a new round without
         * them, as after a node loss (not counted). If every member that
         * came back has finished meanwhile, the job is done. */
        struct rdzv_run *run = t->owner;
        if (!run->rebuilding)
            return;
        if (run->count[N_ACTIVE] == 0 && run->rebuild_count > 0) {
            close_run(st, run, now,
                      scratch_printf(st, "the job finished: every node of round %llu finished",
                                     (unsigned long long)run->round));
            return;
        }
        restart(st, run, "node_missing", NULL, false);
        check_complete(st, run, now);
        return;
    }
    }
}

void rdzv_state_tick(struct rdzv_state *st, uint64_t now)
{
    begin(st);
    struct timer *t;
    while ((t = first_timer(st)) != NULL && t->due <= now) {
        timer_disarm(st, t);
        fire_timer(st, t, now);
    }
}

void rdzv_state_close_all(struct rdzv_state *st, uint64_t now, const char *reason)
{
    begin(st);
    struct cddp_queue *q;
    cddp_queue_foreach(q, &st->run_list)
    {
        close_run(st, cddp_queue_data(q, struct rdzv_run, link), now, reason);
    }
}

/* ---- introspection ---- */

cJSON *rdzv_state_status(const struct rdzv_state *st, uint64_t now)
{
    (void)now;
    cJSON *root = cJSON_CreateObject();
    cJSON *runs = cJSON_AddArrayToObject(root, "runs");
    cJSON_AddNumberToObject(root, "nruns", (double)st->nruns);
    size_t shown = 0;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &st->run_list)
    {
        if (runs == NULL || shown++ >= 1000)
            break;
        const struct rdzv_run *run = cddp_queue_data(q, struct rdzv_run, link);
        cJSON *r = cJSON_CreateObject();
        if (r == NULL)
            break;
        cJSON_AddStringToObject(r, "run_id", run->id);
        cJSON_AddStringToObject(r, "phase", phase_name(run->phase));
        cJSON_AddBoolToObject(r, "rebuilding", run->rebuilding);
        cJSON_AddNumberToObject(r, "round", (double)run->round);
        cJSON_AddNumberToObject(r, "min_nodes", run->min_nodes);
        cJSON_AddNumberToObject(r, "max_nodes", run->max_nodes);
        for (int i = 0; i < N_COUNT; i++)
            cJSON_AddNumberToObject(r, node_state_names[i], (double)run->count[i]);
        cJSON_AddNumberToObject(r, "connections", (double)run->npeers);
        cJSON_AddNumberToObject(r, "restarts", (double)run->restarts);
        cJSON_AddNumberToObject(r, "counted_restarts", (double)run->counted_restarts);
        cJSON_AddNumberToObject(r, "store_keys", (double)kvstore_num_keys(run->store));
        cJSON_AddItemToArray(runs, r);
    }
    return root;
}

int rdzv_state_run_stats(const struct rdzv_state *st, const char *run_id,
                         struct rdzv_run_stats *out)
{
    const struct rdzv_run *run = cddp_strmap_get(&st->runs, run_id, strlen(run_id));
    if (run == NULL)
        return CDDP_ENOTFOUND;
    out->phase = run->phase;
    out->round = run->round;
    out->participants = run->count[N_PARTICIPANT];
    out->waiting = run->count[N_WAITING];
    out->active = run->count[N_ACTIVE];
    out->restarting = run->count[N_RESTARTING];
    out->nodes = run->nodes.len;
    out->peers = run->npeers;
    out->min_nodes = run->min_nodes;
    out->max_nodes = run->max_nodes;
    out->last_call_armed = timer_armed(&run->last_call);
    out->rebuilding = run->rebuilding;
    return 0;
}

size_t rdzv_state_num_runs(const struct rdzv_state *st)
{
    return st->nruns;
}

void rdzv_state_visit(const struct rdzv_state *st, size_t max_runs,
                      void (*run_cb)(void *arg, const struct rdzv_run_info *run),
                      void (*node_cb)(void *arg, const struct rdzv_node_info *node), void *arg)
{
    static const enum node_state order[N_COUNT] = {N_ACTIVE, N_RESTARTING, N_PARTICIPANT, N_IDLE,
                                                   N_WAITING};
    size_t shown = 0;
    struct cddp_queue *q;
    cddp_queue_foreach(q, &st->run_list)
    {
        if (max_runs && shown++ >= max_runs)
            break;
        const struct rdzv_run *run = cddp_queue_data(q, struct rdzv_run, link);
        struct rdzv_run_info ri = {
            .run_id = run->id,
            .phase = phase_name(run->phase),
            .round = run->round,
            .min_nodes = run->min_nodes,
            .max_nodes = run->max_nodes,
            .round_at = run->had_round ? run->round_at : 0,
            .nnodes = run->nodes.len,
            .step_median_s = run->step_median_s,
            .step_compute = run->step_compute,
            .straggler_factor = run->straggler_factor,
        };
        run_cb(arg, &ri);
        for (int k = 0; k < N_COUNT; k++) {
            struct cddp_queue *nq;
            cddp_queue_foreach(nq, &run->lists[order[k]])
            {
                const struct rdzv_node *n = cddp_queue_data(nq, struct rdzv_node, link);
                bool ranked = n->state == N_ACTIVE || n->state == N_RESTARTING;
                struct rdzv_node_info ni = {
                    .node_id = n->id,
                    .state = node_state_names[n->state],
                    .rank = ranked ? n->prev_rank : -1,
                    .nproc = n->nproc,
                    .status_port = n->status_port,
                    .addr = n->peer && n->peer->addr[0] ? n->peer->addr : NULL,
                    .joined_at = n->joined_at,
                    .last_seen = n->last_beat,
                    .has_perf = n->has_perf,
                    .perf = n->perf,
                    .slow = n->state == N_ACTIVE && n->judged.slow,
                    .slow_since = n->judged.since_ms,
                    .slow_ratio = n->judged.ratio,
                };
                node_cb(arg, &ni);
            }
        }
    }
}
