/* etcd_round.c: see etcd_round.h. */
#include "rendezvous/etcd_round.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/errors.h"
#include "common/strutil.h"
#include "rendezvous/ranks.h"

#define STATE_VERSION 1
#define MAX_STATE_BYTES (8u << 20)

static const char *const phase_names[] = {"forming", "running", "closed"};

void etcd_round_init(struct etcd_round *r, int min_nodes, int max_nodes)
{
    memset(r, 0, sizeof(*r));
    r->round = 1;
    r->gen_rank = -1;
    r->phase = ETCD_FORMING;
    r->min_nodes = min_nodes;
    r->max_nodes = max_nodes;
}

void etcd_round_free(struct etcd_round *r)
{
    free(r->members);
    memset(r, 0, sizeof(*r));
}

int etcd_round_copy(struct etcd_round *dst, const struct etcd_round *src)
{
    *dst = *src;
    dst->members = NULL;
    dst->cap = 0;
    if (src->nmembers == 0)
        return 0;
    dst->members = malloc(src->nmembers * sizeof(*dst->members));
    if (dst->members == NULL) {
        memset(dst, 0, sizeof(*dst));
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    memcpy(dst->members, src->members, src->nmembers * sizeof(*dst->members));
    dst->cap = src->nmembers;
    return 0;
}

static struct etcd_member *find(struct etcd_round *r, const char *id)
{
    for (size_t i = 0; i < r->nmembers; i++) {
        if (strcmp(r->members[i].id, id) == 0)
            return &r->members[i];
    }
    return NULL;
}

const struct etcd_member *etcd_round_find(const struct etcd_round *r, const char *id)
{
    return find((struct etcd_round *)r, id);
}

static struct etcd_member *add(struct etcd_round *r)
{
    if (r->nmembers >= ETCD_ROUND_MAX_NODES)
        return NULL;
    if (r->nmembers == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        struct etcd_member *m = realloc(r->members, cap * sizeof(*m));
        if (m == NULL)
            return NULL;
        r->members = m;
        r->cap = cap;
    }
    struct etcd_member *m = &r->members[r->nmembers++];
    memset(m, 0, sizeof(*m));
    m->rank = -1;
    return m;
}

static void remove_member(struct etcd_round *r, struct etcd_member *m)
{
    size_t i = (size_t)(m - r->members);
    memmove(&r->members[i], &r->members[i + 1], (r->nmembers - i - 1) * sizeof(*m));
    r->nmembers--;
}

static size_t count(const struct etcd_round *r, enum etcd_member_state s)
{
    size_t n = 0;
    for (size_t i = 0; i < r->nmembers; i++)
        n += r->members[i].state == s;
    return n;
}

/* Survivors in their old rank order, then newcomers by node id. */
static int rank_order(const void *a, const void *b)
{
    const struct etcd_member *x = a, *y = b;
    if ((x->rank >= 0) != (y->rank >= 0))
        return x->rank >= 0 ? -1 : 1;
    if (x->rank >= 0 && x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return strcmp(x->id, y->id);
}

static void complete(struct etcd_round *r)
{
    /* Members who did not come back are out; the round is the joined. */
    size_t o = 0;
    for (size_t i = 0; i < r->nmembers; i++) {
        if (r->members[i].state != ETCD_M_EXPECTED)
            r->members[o++] = r->members[i];
    }
    r->nmembers = o;
    /* Joined first (sorted), the wait list after them. */
    size_t nj = 0;
    for (size_t i = 0; i < r->nmembers; i++) {
        if (r->members[i].state == ETCD_M_JOINED) {
            struct etcd_member t = r->members[nj];
            r->members[nj++] = r->members[i];
            r->members[i] = t;
        }
    }
    qsort(r->members, nj, sizeof(*r->members), rank_order);
    for (size_t i = 0; i < r->nmembers; i++) {
        struct etcd_member *m = &r->members[i];
        if (i < nj) {
            m->state = ETCD_M_ACTIVE;
            m->rank = (int)i;
        } else {
            m->rank = -1;
        }
    }
    r->phase = ETCD_RUNNING;
    r->last_call_at = 0;
    r->fast = false;
    r->generation = 0;
    r->generation_at = 0;
    r->gen_rank = -1;
    r->gen_ranks[0] = '\0';
    r->gen_node[0] = '\0';
}

static void maybe_complete(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now)
{
    size_t nj = count(r, ETCD_M_JOINED), ne = count(r, ETCD_M_EXPECTED);
    if (r->phase != ETCD_FORMING)
        return;
    if (nj == 0 || nj < (size_t)r->min_nodes) {
        r->last_call_at = 0;
        return;
    }
    if (nj >= (size_t)r->max_nodes || (r->fast && ne == 0)) {
        complete(r);
        return;
    }
    if (r->last_call_at == 0)
        r->last_call_at = now + c->last_call_timeout_ms;
    if (now >= r->last_call_at)
        complete(r);
}

static void restart(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                    const char *reason, const char *node, bool counted)
{
    r->round++;
    r->phase = ETCD_FORMING;
    r->fast = true;
    r->last_call_at = 0;
    if (counted)
        r->restart_count++;
    r->counted = counted;
    cddp_strlcpy(r->reason, reason, sizeof(r->reason));
    cddp_strlcpy(r->node, node ? node : "", sizeof(r->node));
    size_t taken = 0;
    for (size_t i = 0; i < r->nmembers; i++) {
        if (r->members[i].state == ETCD_M_ACTIVE) {
            r->members[i].state = ETCD_M_EXPECTED;
            taken++;
        }
    }
    /* The wait list joins, as far as there is room: their joins are
     * outstanding already. */
    for (size_t i = 0; i < r->nmembers; i++) {
        struct etcd_member *m = &r->members[i];
        if (m->state == ETCD_M_WAITING && taken < (size_t)r->max_nodes) {
            m->state = ETCD_M_JOINED;
            m->rank = -1;
            taken++;
        }
    }
    maybe_complete(r, c, now);
}

static void set_info(struct etcd_member *m, const struct etcd_join *j)
{
    cddp_strlcpy(m->id, j->id, sizeof(m->id));
    m->nproc = j->nproc;
    cddp_strlcpy(m->addr, j->addr ? j->addr : "", sizeof(m->addr));
    m->port = j->port;
    m->gens = j->gens;
    m->ranks = j->ranks;
}

bool etcd_round_join(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                     const struct etcd_join *j)
{
    if (r->phase == ETCD_CLOSED)
        return false;
    struct etcd_member *m = find(r, j->id);
    if (r->phase == ETCD_RUNNING) {
        if (m && m->state == ETCD_M_WAITING)
            return false;
        if (m) { /* an active member asks for a new round */
            set_info(m, j);
            restart(r, c, now, "node_rejoined", j->id, false);
            if (r->phase == ETCD_FORMING && m->state == ETCD_M_EXPECTED) {
                m->state = ETCD_M_JOINED;
                maybe_complete(r, c, now);
            }
            return true;
        }
        if ((m = add(r)) == NULL)
            return false;
        set_info(m, j);
        m->state = ETCD_M_WAITING;
        if (count(r, ETCD_M_ACTIVE) < (size_t)r->max_nodes)
            restart(r, c, now, "node_joined", j->id, false);
        return true;
    }
    /* forming */
    size_t taken = count(r, ETCD_M_JOINED) + count(r, ETCD_M_EXPECTED);
    if (m == NULL) {
        if ((m = add(r)) == NULL)
            return false;
        set_info(m, j);
        m->state = taken < (size_t)r->max_nodes ? ETCD_M_JOINED : ETCD_M_WAITING;
    } else {
        set_info(m, j);
        if (m->state == ETCD_M_EXPECTED ||
            (m->state == ETCD_M_WAITING && taken < (size_t)r->max_nodes))
            m->state = ETCD_M_JOINED;
    }
    maybe_complete(r, c, now);
    return true;
}

bool etcd_round_lose(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                     const char *id, const char *reason, bool finished)
{
    struct etcd_member *m = find(r, id);
    if (m == NULL || r->phase == ETCD_CLOSED)
        return false;
    enum etcd_member_state s = m->state;
    remove_member(r, m);
    if (s == ETCD_M_ACTIVE && r->phase == ETCD_RUNNING && !finished)
        restart(r, c, now, reason, id, false);
    else
        maybe_complete(r, c, now);
    return true;
}

bool etcd_round_failure(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                        const char *id, uint64_t round)
{
    struct etcd_member *m = find(r, id);
    if (r->phase != ETCD_RUNNING || round != r->round || m == NULL || m->state != ETCD_M_ACTIVE)
        return false;
    restart(r, c, now, "worker_failure", id, true);
    return true;
}

int etcd_round_replace(struct etcd_round *r, uint64_t now, const char *id, uint64_t round, int rank,
                       const char *ranks, char *why, size_t whylen)
{
    struct proto_round at;
    if (r->phase != ETCD_RUNNING || round != r->round)
        return cddp_fail(why, whylen, CDDP_ESTATE, "round %llu is not the one running",
                         (unsigned long long)round);
    if (etcd_round_place(r, "", id, &at) != 0)
        return cddp_fail(why, whylen, CDDP_ESTATE, "this node is not a member of a running round");
    if (rank < at.rank_offset || rank >= at.rank_offset + at.nproc)
        return cddp_fail(why, whylen, CDDP_ESTATE, "rank %d is not one of this node's (%d..%d)",
                         rank, at.rank_offset, at.rank_offset + at.nproc - 1);
    if (ranks && rdzv_ranks_check(ranks, rank, at.rank_offset, at.rank_offset + at.nproc - 1, why,
                                  whylen) != 0)
        return CDDP_ESTATE;
    for (size_t i = 0; i < r->nmembers; i++) {
        const struct etcd_member *m = &r->members[i];
        if (m->state == ETCD_M_ACTIVE && !m->gens)
            return cddp_fail(why, whylen, CDDP_ESTATE,
                             "node %s's agent is older and cannot number generations", m->id);
        if (m->state == ETCD_M_ACTIVE && ranks && !m->ranks)
            return cddp_fail(why, whylen, CDDP_ESTATE,
                             "not every member's agent can replace several ranks together (an "
                             "older one)");
    }
    if (r->generation_at != 0 && now < r->generation_at + ETCD_ROUND_SETTLE_MS)
        return cddp_fail(why, whylen, CDDP_ESTATE,
                         "generation %lld was granted %llu ms ago: a second failure this soon "
                         "restarts the group",
                         (long long)r->generation, (unsigned long long)(now - r->generation_at));
    r->generation++;
    r->generation_at = now ? now : 1;
    r->restart_count++; /* one of the job's restarts (--max_restarts) */
    r->gen_rank = rank;
    cddp_strlcpy(r->gen_ranks, ranks ? ranks : "", sizeof(r->gen_ranks));
    cddp_strlcpy(r->gen_node, id, sizeof(r->gen_node));
    return 0;
}

bool etcd_round_close(struct etcd_round *r, const char *reason)
{
    if (r->phase == ETCD_CLOSED)
        return false;
    r->phase = ETCD_CLOSED;
    cddp_strlcpy(r->closed_reason, reason ? reason : "closed", sizeof(r->closed_reason));
    return true;
}

bool etcd_round_tick(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now)
{
    if (r->phase != ETCD_FORMING)
        return false;
    enum etcd_phase before = r->phase;
    uint64_t lc = r->last_call_at;
    maybe_complete(r, c, now);
    return r->phase != before || r->last_call_at != lc;
}

bool etcd_round_prune(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                      bool (*alive)(void *arg, const char *id), void *arg)
{
    bool changed = false;
    for (size_t i = 0; i < r->nmembers;) {
        char id[PROTO_MAX_ID + 1];
        cddp_strlcpy(id, r->members[i].id, sizeof(id));
        if (!alive(arg, id) && etcd_round_lose(r, c, now, id, "node_lost", false)) {
            changed = true;
            i = 0; /* a restart may have reordered nothing, but removal shifted */
            continue;
        }
        i++;
    }
    return changed;
}

int etcd_round_place(const struct etcd_round *r, const char *run_id, const char *id,
                     struct proto_round *out)
{
    if (r->phase != ETCD_RUNNING)
        return CDDP_ESTATE;
    memset(out, 0, sizeof(*out));
    const struct etcd_member *me = NULL, *zero = NULL;
    int nnodes = 0, world = 0, offset = 0;
    for (size_t i = 0; i < r->nmembers; i++) {
        const struct etcd_member *m = &r->members[i];
        if (m->state != ETCD_M_ACTIVE)
            continue;
        nnodes++;
        world += m->nproc;
        if (m->rank == 0)
            zero = m;
        if (strcmp(m->id, id) == 0)
            me = m;
    }
    if (me == NULL || zero == NULL)
        return CDDP_ENOTFOUND;
    for (size_t i = 0; i < r->nmembers; i++) {
        const struct etcd_member *m = &r->members[i];
        if (m->state == ETCD_M_ACTIVE && m->rank < me->rank)
            offset += m->nproc;
    }
    out->run_id = run_id;
    out->round = r->round;
    out->node_rank = me->rank;
    out->nnodes = nnodes;
    out->world_size = world;
    out->rank_offset = offset;
    out->nproc = me->nproc;
    out->master_addr = zero->addr;
    out->master_port = zero->port;
    out->restart_count = r->restart_count;
    return 0;
}

/* ---- JSON ---- */

char *etcd_round_encode(const struct etcd_round *r)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    bool ok = cJSON_AddNumberToObject(o, "v", STATE_VERSION) &&
              cJSON_AddNumberToObject(o, "round", (double)r->round) &&
              cJSON_AddStringToObject(o, "phase", phase_names[r->phase]) &&
              cJSON_AddNumberToObject(o, "restart_count", (double)r->restart_count) &&
              cJSON_AddNumberToObject(o, "min", r->min_nodes) &&
              cJSON_AddNumberToObject(o, "max", r->max_nodes) &&
              cJSON_AddNumberToObject(o, "last_call_at", (double)r->last_call_at) &&
              cJSON_AddBoolToObject(o, "fast", r->fast) &&
              cJSON_AddStringToObject(o, "reason", r->reason) &&
              cJSON_AddStringToObject(o, "node", r->node) &&
              cJSON_AddBoolToObject(o, "counted", r->counted) &&
              cJSON_AddStringToObject(o, "closed_reason", r->closed_reason) &&
              cJSON_AddNumberToObject(o, "gen", (double)r->generation) &&
              cJSON_AddNumberToObject(o, "gen_at", (double)r->generation_at) &&
              cJSON_AddNumberToObject(o, "gen_rank", r->gen_rank) &&
              (!r->gen_ranks[0] || cJSON_AddStringToObject(o, "gen_ranks", r->gen_ranks)) &&
              cJSON_AddStringToObject(o, "gen_node", r->gen_node);
    /* every member's agent replaces several ranks together: one mark for
     * all of them, which an older agent's write drops (none then does) */
    bool rr = r->nmembers > 0;
    for (size_t i = 0; i < r->nmembers; i++)
        rr = rr && r->members[i].ranks;
    ok = ok && (!rr || cJSON_AddBoolToObject(o, "rr", true));
    cJSON *arr = ok ? cJSON_AddArrayToObject(o, "members") : NULL;
    for (size_t i = 0; arr && i < r->nmembers; i++) {
        const struct etcd_member *m = &r->members[i];
        cJSON *e = cJSON_CreateObject();
        if (e == NULL || !cJSON_AddItemToArray(arr, e)) {
            cJSON_Delete(e);
            arr = NULL;
            break;
        }
        if (!cJSON_AddStringToObject(e, "id", m->id) ||
            !cJSON_AddNumberToObject(e, "s", m->state) ||
            !cJSON_AddNumberToObject(e, "nproc", m->nproc) ||
            !cJSON_AddStringToObject(e, "addr", m->addr) ||
            !cJSON_AddNumberToObject(e, "port", m->port) ||
            !cJSON_AddNumberToObject(e, "rank", m->rank) ||
            (!m->gens && !cJSON_AddBoolToObject(e, "o", true)))
            arr = NULL;
    }
    char *s = arr ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

static int num(const cJSON *o, const char *name, double min, double max, double *out, char *err,
               size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < min || v->valuedouble > max ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state: '%s' missing or out of range",
                         name);
    *out = v->valuedouble;
    return 0;
}

static int str(const cJSON *o, const char *name, size_t max, bool nonempty, char *out, char *err,
               size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsString(v) || strlen(v->valuestring) > max || (nonempty && !v->valuestring[0]))
        return cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state: '%s' missing or too long",
                         name);
    cddp_strlcpy(out, v->valuestring, max + 1);
    return 0;
}

static int boolean(const cJSON *o, const char *name, bool *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsBool(v))
        return cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state: '%s' is not a boolean", name);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Optional fields (absent from a state an older agent wrote): `dflt`. */
static int opt_num(const cJSON *o, const char *name, double min, double max, double dflt,
                   double *out, char *err, size_t errlen)
{
    if (cJSON_GetObjectItemCaseSensitive(o, name) == NULL) {
        *out = dflt;
        return 0;
    }
    return num(o, name, min, max, out, err, errlen);
}

static int opt_bool(const cJSON *o, const char *name, bool *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    *out = cJSON_IsTrue(v);
    if (v != NULL && !cJSON_IsBool(v))
        return cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state: '%s' is not a boolean", name);
    return 0;
}

static int decode_member(const cJSON *e, struct etcd_member *m, char *err, size_t errlen)
{
    double s, nproc, port, rank;
    bool old;
    if (!cJSON_IsObject(e))
        return cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state: a member is not an object");
    int rc;
    if ((rc = str(e, "id", PROTO_MAX_ID, true, m->id, err, errlen)) ||
        (rc = num(e, "s", 0, ETCD_M_WAITING, &s, err, errlen)) ||
        (rc = num(e, "nproc", 1, 1 << 20, &nproc, err, errlen)) ||
        (rc = str(e, "addr", ETCD_ROUND_MAX_ADDR, false, m->addr, err, errlen)) ||
        (rc = num(e, "port", 0, 65535, &port, err, errlen)) ||
        (rc = num(e, "rank", -1, ETCD_ROUND_MAX_NODES, &rank, err, errlen)) ||
        (rc = opt_bool(e, "o", &old, err, errlen)))
        return rc;
    m->gens = !old;
    m->state = (enum etcd_member_state)s;
    m->nproc = (int)nproc;
    m->port = (int)port;
    m->rank = (int)rank;
    return 0;
}

int etcd_round_decode(const char *json, size_t len, struct etcd_round *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    if (len > MAX_STATE_BYTES)
        return cddp_fail(err, errlen, CDDP_ETOOBIG, "rendezvous state of %zu bytes", len);
    /* The value was written by an agent as flat JSON two levels deep; a
     * deeper one is not ours (and cJSON recurses). */
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        if (in_str) {
            if (json[i] == '\\')
                i++;
            else if (json[i] == '"')
                in_str = false;
            continue;
        }
        if (json[i] == '"')
            in_str = true;
        else if ((json[i] == '{' || json[i] == '[') && ++depth > 4)
            return cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state nested too deep");
        else if (json[i] == '}' || json[i] == ']')
            depth--;
    }
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state is not a JSON object");
    }
    double v, round, rc_, mn, mx, lc, gen, gen_at, gen_rank;
    char phase[16];
    int rc;
    if ((rc = num(o, "v", STATE_VERSION, STATE_VERSION, &v, err, errlen)) ||
        (rc = num(o, "round", 1, 9.0e15, &round, err, errlen)) ||
        (rc = str(o, "phase", sizeof(phase) - 1, true, phase, err, errlen)) ||
        (rc = num(o, "restart_count", 0, 9.0e15, &rc_, err, errlen)) ||
        (rc = num(o, "min", 1, ETCD_ROUND_MAX_NODES, &mn, err, errlen)) ||
        (rc = num(o, "max", 1, ETCD_ROUND_MAX_NODES, &mx, err, errlen)) ||
        (rc = num(o, "last_call_at", 0, 9.0e15, &lc, err, errlen)) ||
        (rc = boolean(o, "fast", &r->fast, err, errlen)) ||
        (rc = str(o, "reason", sizeof(r->reason) - 1, false, r->reason, err, errlen)) ||
        (rc = str(o, "node", PROTO_MAX_ID, false, r->node, err, errlen)) ||
        (rc = boolean(o, "counted", &r->counted, err, errlen)) ||
        (rc = str(o, "closed_reason", sizeof(r->closed_reason) - 1, false, r->closed_reason, err,
                  errlen)) ||
        (rc = opt_num(o, "gen", 0, 9.0e15, 0, &gen, err, errlen)) ||
        (rc = opt_num(o, "gen_at", 0, 9.0e15, 0, &gen_at, err, errlen)) ||
        (rc = opt_num(o, "gen_rank", -1, 2147483647.0, -1, &gen_rank, err, errlen)))
        goto fail;
    if (cJSON_GetObjectItemCaseSensitive(o, "gen_node") != NULL &&
        (rc = str(o, "gen_node", PROTO_MAX_ID, false, r->gen_node, err, errlen)))
        goto fail;
    bool rr;
    if ((cJSON_GetObjectItemCaseSensitive(o, "gen_ranks") != NULL &&
         (rc = str(o, "gen_ranks", PROTO_MAX_REPLACED, false, r->gen_ranks, err, errlen))) ||
        (rc = opt_bool(o, "rr", &rr, err, errlen)))
        goto fail;
    r->phase = ETCD_CLOSED + 1;
    for (int i = 0; i <= ETCD_CLOSED; i++) {
        if (strcmp(phase, phase_names[i]) == 0)
            r->phase = (enum etcd_phase)i;
    }
    if (r->phase > ETCD_CLOSED || mn > mx) {
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state: bad phase or min > max");
        goto fail;
    }
    r->round = (uint64_t)round;
    r->restart_count = (int64_t)rc_;
    r->min_nodes = (int)mn;
    r->max_nodes = (int)mx;
    r->last_call_at = (uint64_t)lc;
    r->generation = (int64_t)gen;
    r->generation_at = (uint64_t)gen_at;
    r->gen_rank = (int)gen_rank;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "members");
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > ETCD_ROUND_MAX_NODES) {
        rc = cddp_fail(err, errlen, CDDP_EPARSE, "rendezvous state: 'members' missing or too long");
        goto fail;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        struct etcd_member *m = add(r);
        if (m == NULL) {
            rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
            goto fail;
        }
        if ((rc = decode_member(e, m, err, errlen)))
            goto fail;
        m->ranks = rr;
    }
    cJSON_Delete(o);
    return 0;
fail:
    cJSON_Delete(o);
    etcd_round_free(r);
    return rc ? rc : CDDP_EPARSE;
}

/* ---- join requests (the leader folds them; docs/etcd.md "Scale") ---- */

char *etcd_round_request_encode(const struct etcd_join *j)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    bool ok = cJSON_AddNumberToObject(o, "nproc", j->nproc) &&
              cJSON_AddStringToObject(o, "addr", j->addr ? j->addr : "") &&
              cJSON_AddNumberToObject(o, "port", j->port) &&
              (!j->gens || cJSON_AddBoolToObject(o, "g", true)) &&
              (!j->ranks || cJSON_AddBoolToObject(o, "r", true));
    char *s = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

int etcd_round_request_decode(const char *json, size_t len, struct etcd_request *out, char *err,
                              size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (len > 4096)
        return cddp_fail(err, errlen, CDDP_EPARSE, "join request: over 4096 bytes");
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return cddp_fail(err, errlen, CDDP_EPARSE, "join request: not a JSON object");
    }
    double nproc, port;
    int rc = num(o, "nproc", 1, 1 << 20, &nproc, err, errlen);
    if (rc == 0)
        rc = num(o, "port", 1, 65535, &port, err, errlen);
    if (rc == 0)
        rc = str(o, "addr", ETCD_ROUND_MAX_ADDR, true, out->addr, err, errlen);
    if (rc == 0)
        rc = opt_bool(o, "g", &out->gens, err, errlen);
    if (rc == 0)
        rc = opt_bool(o, "r", &out->ranks, err, errlen);
    cJSON_Delete(o);
    if (rc) {
        memset(out, 0, sizeof(*out));
        return rc;
    }
    out->nproc = (int)nproc;
    out->port = (int)port;
    return 0;
}

bool etcd_round_fold(struct etcd_round *r, const struct etcd_round_conf *c, uint64_t now,
                     const struct etcd_join *joins, size_t n)
{
    bool changed = false;
    for (size_t i = 0; i < n; i++)
        changed = etcd_round_join(r, c, now, &joins[i]) || changed;
    return changed;
}
