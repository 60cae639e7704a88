/* kvstore.c: see kvstore.h.
 *
 * Keys live in a seeded hash map of entries. An entry exists while it has a
 * value or someone waits for it. A waiter holds one reference per key it
 * still misses, linked into that key's entry; setting the key unlinks the
 * references and fires waiters that miss nothing more. Waiters with a
 * deadline also sit in an intrusive min-heap (common/heap.h) by deadline,
 * first come first served among equal deadlines. Fired waiters move to a queue the
 * caller drains, so waking thousands of waiters allocates nothing. */
#include "store/kvstore.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/heap.h"
#include "common/strmap.h"
#include "proto/msg.h"

struct qitem {
    struct qitem *next;
    size_t vlen;
    char value[];
};

struct entry {
    struct cddp_queue refs; /* struct waitref.link of waiters missing this key */
    char *value;
    size_t vlen;
    bool has_value;
    struct qitem *qhead, *qtail; /* the queue of the same name (torch 2.x queue_push) */
    size_t qlen;
    size_t klen;
    char key[];
};

struct waiter;

struct waitref {
    struct cddp_queue link;
    struct waiter *w;
    struct entry *e;
};

struct waiter {
    struct cddp_queue link; /* owner->waiters while waiting, s->fired once fired */
    struct kvstore_owner *owner;
    uint64_t req_id;
    uint64_t deadline;
    uint64_t seq;               /* arrival: orders equal deadlines */
    struct cddp_heap_node heap; /* in s->heap while in_heap */
    bool in_heap;
    size_t missing;
    size_t nrefs;
    size_t cost; /* bytes charged to the store */
    bool is_get;
    enum kvstore_event_kind kind;
    struct entry *get_entry;
    struct waitref refs[];
};

struct kvstore {
    struct cddp_strmap map;
    struct cddp_heap heap; /* waiters with a deadline */
    uint64_t next_seq;
    struct cddp_queue fired;
    struct kvstore_limits lim;
    size_t bytes;
    size_t nvalues;
};

#define ENTRY_COST(klen, vlen) (sizeof(struct entry) + (klen) + 1 + (vlen) + 32)
#define QITEM_COST(vlen) (sizeof(struct qitem) + (vlen) + 16)

struct kvstore *kvstore_new(const struct kvstore_limits *lim, uint64_t seed0, uint64_t seed1)
{
    struct kvstore *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    cddp_strmap_init(&s->map, seed0, seed1);
    cddp_queue_init(&s->fired);
    cddp_heap_init(&s->heap);
    if (lim)
        s->lim = *lim;
    if (s->lim.max_bytes == 0)
        s->lim.max_bytes = 256u << 20;
    if (s->lim.max_keys == 0)
        s->lim.max_keys = 1000000;
    if (s->lim.max_waiters == 0)
        s->lim.max_waiters = 1024;
    return s;
}

/* ---- heap of waiters by deadline ---- */

static bool deadline_less(const struct cddp_heap_node *a, const struct cddp_heap_node *b)
{
    const struct waiter *x = cddp_heap_data(a, struct waiter, heap);
    const struct waiter *y = cddp_heap_data(b, struct waiter, heap);
    return x->deadline != y->deadline ? x->deadline < y->deadline : x->seq < y->seq;
}

static void heap_push(struct kvstore *s, struct waiter *w)
{
    w->seq = s->next_seq++;
    w->in_heap = true;
    cddp_heap_insert(&s->heap, &w->heap, deadline_less);
}

static void heap_remove(struct kvstore *s, struct waiter *w)
{
    if (!w->in_heap)
        return;
    w->in_heap = false;
    cddp_heap_remove(&s->heap, &w->heap, deadline_less);
}

static struct waiter *heap_first(const struct kvstore *s)
{
    struct cddp_heap_node *n = cddp_heap_min(&s->heap);
    return n ? cddp_heap_data(n, struct waiter, heap) : NULL;
}

/* ---- entries ---- */

static struct entry *entry_find(struct kvstore *s, const char *key)
{
    return cddp_strmap_get(&s->map, key, strlen(key));
}

static struct entry *entry_get_or_add(struct kvstore *s, const char *key, int *rc)
{
    size_t klen = strlen(key);
    struct entry *e = cddp_strmap_get(&s->map, key, klen);
    if (e)
        return e;
    if (s->map.len >= s->lim.max_keys || s->bytes + ENTRY_COST(klen, 0) > s->lim.max_bytes) {
        *rc = CDDP_ETOOBIG;
        return NULL;
    }
    e = malloc(sizeof(*e) + klen + 1);
    if (e == NULL) {
        *rc = CDDP_ERR_FROM_ERRNO(ENOMEM);
        return NULL;
    }
    cddp_queue_init(&e->refs);
    e->value = NULL;
    e->vlen = 0;
    e->has_value = false;
    e->qhead = e->qtail = NULL;
    e->qlen = 0;
    e->klen = klen;
    memcpy(e->key, key, klen + 1);
    if ((*rc = cddp_strmap_put(&s->map, e->key, klen, e)) != 0) {
        free(e);
        return NULL;
    }
    s->bytes += ENTRY_COST(klen, 0);
    return e;
}

/* Frees an entry nobody needs any more (no value, no waiters). */
static void entry_maybe_drop(struct kvstore *s, struct entry *e)
{
    if (e->has_value || e->qlen > 0 || !cddp_queue_empty(&e->refs))
        return;
    cddp_strmap_del(&s->map, e->key, e->klen);
    s->bytes -= ENTRY_COST(e->klen, 0);
    free(e);
}

static void wake_waiter(struct kvstore *s, struct waiter *w, enum kvstore_event_kind kind);

/* Stores a copy of val in e and wakes what waited for it. */
static int entry_set(struct kvstore *s, struct entry *e, const void *val, size_t vlen)
{
    size_t old = e->has_value ? e->vlen : 0;
    if (vlen > old && s->bytes + (vlen - old) > s->lim.max_bytes)
        return CDDP_ETOOBIG;
    char *v = malloc(vlen + 1);
    if (v == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (vlen)
        memcpy(v, val, vlen);
    v[vlen] = '\0';
    free(e->value);
    s->bytes = s->bytes - old + vlen;
    e->value = v;
    e->vlen = vlen;
    if (!e->has_value)
        s->nvalues++;
    e->has_value = true;

    while (!cddp_queue_empty(&e->refs)) {
        struct waitref *r = cddp_queue_data(cddp_queue_head(&e->refs), struct waitref, link);
        cddp_queue_remove(&r->link);
        if (--r->w->missing == 0)
            wake_waiter(s, r->w, KVSTORE_READY);
    }
    return 0;
}

/* ---- waiters ---- */

static void waiter_unlink(struct kvstore *s, struct waiter *w)
{
    heap_remove(s, w);
    for (size_t i = 0; i < w->nrefs; i++) {
        struct waitref *r = &w->refs[i];
        if (r->e == NULL)
            continue;
        if (r->link.next != &r->link) {
            cddp_queue_remove(&r->link);
            entry_maybe_drop(s, r->e);
        }
        r->e = NULL;
    }
    cddp_queue_remove(&w->link);
    if (w->owner)
        w->owner->nwaiters--;
    s->bytes -= w->cost;
    w->cost = 0;
}

static void wake_waiter(struct kvstore *s, struct waiter *w, enum kvstore_event_kind kind)
{
    struct entry *ge = w->is_get ? w->refs[0].e : NULL;
    struct kvstore_owner *owner = w->owner;
    waiter_unlink(s, w);
    w->owner = owner; /* kept for the event */
    w->kind = kind;
    w->get_entry = kind == KVSTORE_READY ? ge : NULL;
    cddp_queue_insert_tail(&s->fired, &w->link);
}

int kvstore_wait(struct kvstore *s, const char *const *keys, size_t n, uint64_t deadline,
                 struct kvstore_owner *owner, uint64_t req_id, bool is_get, bool *ready)
{
    size_t missing = 0;
    *ready = false;
    if (n == 0 || (is_get && n != 1))
        return CDDP_EPROTO_FIELD;
    for (size_t i = 0; i < n; i++) {
        struct entry *e = entry_find(s, keys[i]);
        if (e == NULL || (!e->has_value && e->qlen == 0))
            missing++;
    }
    if (missing == 0) {
        *ready = true;
        return 0;
    }
    if (owner->nwaiters >= s->lim.max_waiters)
        return CDDP_ETOOBIG;
    size_t cost = sizeof(struct waiter) + missing * sizeof(struct waitref);
    if (s->bytes + cost > s->lim.max_bytes)
        return CDDP_ETOOBIG;
    struct waiter *w = calloc(1, cost);
    if (w == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    w->owner = owner;
    w->req_id = req_id;
    w->deadline = deadline;
    w->is_get = is_get;
    w->cost = cost;
    cddp_queue_init(&w->link);
    s->bytes += cost;
    owner->nwaiters++;
    cddp_queue_insert_tail(&owner->waiters, &w->link);

    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct entry *e = entry_get_or_add(s, keys[i], &rc);
        if (e == NULL || e->has_value || e->qlen > 0)
            continue;
        /* The same key twice in one wait counts once. */
        bool dup = false;
        for (size_t j = 0; j < w->nrefs; j++)
            dup = dup || w->refs[j].e == e;
        if (dup)
            continue;
        struct waitref *r = &w->refs[w->nrefs++];
        r->w = w;
        r->e = e;
        cddp_queue_insert_tail(&e->refs, &r->link);
        w->missing++;
    }
    if (rc == 0 && deadline != KVSTORE_NEVER)
        heap_push(s, w);
    if (rc) {
        waiter_unlink(s, w);
        free(w);
    }
    return rc;
}

void kvstore_expire(struct kvstore *s, uint64_t now)
{
    struct waiter *w;
    while ((w = heap_first(s)) != NULL && w->deadline <= now)
        wake_waiter(s, w, KVSTORE_TIMEOUT);
}

uint64_t kvstore_next_deadline(const struct kvstore *s)
{
    const struct waiter *w = heap_first(s);
    return w ? w->deadline : KVSTORE_NEVER;
}

bool kvstore_next_event(struct kvstore *s, struct kvstore_event *ev)
{
    if (cddp_queue_empty(&s->fired))
        return false;
    struct waiter *w = cddp_queue_data(cddp_queue_head(&s->fired), struct waiter, link);
    cddp_queue_remove(&w->link);
    ev->kind = w->kind;
    ev->owner = w->owner;
    ev->req_id = w->req_id;
    ev->is_get = w->is_get;
    ev->key = w->get_entry ? w->get_entry->key : NULL;
    free(w);
    return true;
}

void kvstore_cancel_owner(struct kvstore *s, struct kvstore_owner *owner)
{
    while (!cddp_queue_empty(&owner->waiters)) {
        struct waiter *w = cddp_queue_data(cddp_queue_head(&owner->waiters), struct waiter, link);
        waiter_unlink(s, w);
        free(w);
    }
    struct cddp_queue *q = s->fired.next;
    while (q != &s->fired) {
        struct waiter *w = cddp_queue_data(q, struct waiter, link);
        q = q->next;
        if (w->owner == owner) {
            cddp_queue_remove(&w->link);
            free(w);
        }
    }
    owner->nwaiters = 0;
}

/* ---- operations ---- */

int kvstore_set(struct kvstore *s, const char *key, const void *val, size_t vlen)
{
    int rc = 0;
    struct entry *e = entry_get_or_add(s, key, &rc);
    if (e == NULL)
        return rc;
    rc = entry_set(s, e, val, vlen);
    if (rc)
        entry_maybe_drop(s, e);
    return rc;
}

int kvstore_get(struct kvstore *s, const char *key, const void **val, size_t *vlen)
{
    struct entry *e = entry_find(s, key);
    if (e == NULL || !e->has_value)
        return CDDP_ENOTFOUND;
    *val = e->value;
    *vlen = e->vlen;
    return 0;
}

/* A whole decimal int64 (optional '-'), as add() stores it. */
static int parse_i64(const char *p, size_t n, int64_t *out)
{
    size_t i = 0;
    bool neg = false;
    int64_t v = 0;
    if (n == 0)
        return CDDP_EPARSE;
    if (p[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == n)
        return CDDP_EPARSE;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return CDDP_EPARSE;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, p[i] - '0', &v))
            return CDDP_ERANGE_ARG;
    }
    *out = neg ? -v : v;
    return 0;
}

static int add_within(struct kvstore *s, const char *key, int64_t delta, int64_t bound,
                      int64_t *out)
{
    int rc = 0;
    int64_t cur = 0, next;
    struct entry *e = entry_get_or_add(s, key, &rc);
    if (e == NULL)
        return rc;
    if (e->has_value && (rc = parse_i64(e->value, e->vlen, &cur)) != 0)
        return rc;
    if (__builtin_add_overflow(cur, delta, &next) || next > bound || next < -bound) {
        entry_maybe_drop(s, e);
        return CDDP_ERANGE_ARG;
    }
    char buf[24];
    int len = snprintf(buf, sizeof(buf), "%lld", (long long)next);
    if ((rc = entry_set(s, e, buf, (size_t)len)) != 0) {
        entry_maybe_drop(s, e);
        return rc;
    }
    *out = next;
    return 0;
}

int kvstore_add(struct kvstore *s, const char *key, int64_t delta, int64_t *out)
{
    return add_within(s, key, delta, PROTO_MAX_INT, out);
}

int kvstore_add64(struct kvstore *s, const char *key, int64_t delta, int64_t *out)
{
    return add_within(s, key, delta, INT64_MAX, out);
}

int kvstore_compare_set(struct kvstore *s, const char *key, const void *expected, size_t elen,
                        const void *desired, size_t dlen, const void **cur, size_t *curlen)
{
    struct entry *e = entry_find(s, key);
    if (e == NULL || !e->has_value) {
        if (elen != 0) {
            *cur = expected;
            *curlen = elen;
            return 0;
        }
    } else if (e->vlen != elen || (elen && memcmp(e->value, expected, elen) != 0)) {
        *cur = e->value;
        *curlen = e->vlen;
        return 0;
    }
    int rc = kvstore_set(s, key, desired, dlen);
    if (rc)
        return rc;
    return kvstore_get(s, key, cur, curlen);
}

int kvstore_delete(struct kvstore *s, const char *key)
{
    struct entry *e = entry_find(s, key);
    if (e == NULL || !e->has_value)
        return 0;
    free(e->value);
    s->bytes -= e->vlen;
    e->value = NULL;
    e->vlen = 0;
    e->has_value = false;
    s->nvalues--;
    entry_maybe_drop(s, e);
    return 1;
}

int kvstore_append(struct kvstore *s, const char *key, const void *val, size_t vlen)
{
    struct entry *e = entry_find(s, key);
    if (e == NULL || !e->has_value)
        return kvstore_set(s, key, val, vlen);
    if (vlen > s->lim.max_bytes - s->bytes)
        return CDDP_ETOOBIG;
    char *v = realloc(e->value, e->vlen + vlen + 1);
    if (v == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    if (vlen)
        memcpy(v + e->vlen, val, vlen);
    v[e->vlen + vlen] = '\0';
    e->value = v;
    e->vlen += vlen;
    s->bytes += vlen;
    return 0;
}

bool kvstore_check(const struct kvstore *s, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct entry *e = cddp_strmap_get(&s->map, keys[i], strlen(keys[i]));
        if (e == NULL || (!e->has_value && e->qlen == 0))
            return false;
    }
    return true;
}

int kvstore_queue_push(struct kvstore *s, const char *key, const void *val, size_t vlen)
{
    int rc = 0;
    struct entry *e = entry_get_or_add(s, key, &rc);
    if (e == NULL)
        return rc;
    if (QITEM_COST(vlen) > s->lim.max_bytes - s->bytes) {
        entry_maybe_drop(s, e);
        return CDDP_ETOOBIG;
    }
    struct qitem *it = malloc(sizeof(*it) + vlen + 1);
    if (it == NULL) {
        entry_maybe_drop(s, e);
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    it->next = NULL;
    it->vlen = vlen;
    if (vlen)
        memcpy(it->value, val, vlen);
    it->value[vlen] = '\0';
    if (e->qtail)
        e->qtail->next = it;
    else
        e->qhead = it;
    e->qtail = it;
    e->qlen++;
    s->bytes += QITEM_COST(vlen);
    /* One item is for one reader: wake the oldest waiter on this key only. */
    if (!cddp_queue_empty(&e->refs)) {
        struct waitref *r = cddp_queue_data(cddp_queue_head(&e->refs), struct waitref, link);
        cddp_queue_remove(&r->link);
        if (--r->w->missing == 0)
            wake_waiter(s, r->w, KVSTORE_READY);
    }
    return 0;
}

int kvstore_queue_pop(struct kvstore *s, const char *key, void **val, size_t *vlen,
                      size_t *len_before)
{
    struct entry *e = entry_find(s, key);
    *len_before = e ? e->qlen : 0;
    if (e == NULL || e->qlen == 0)
        return CDDP_ENOTFOUND;
    struct qitem *it = e->qhead;
    e->qhead = it->next;
    if (e->qhead == NULL)
        e->qtail = NULL;
    e->qlen--;
    s->bytes -= QITEM_COST(it->vlen);
    size_t n = it->vlen;
    /* Hand the bytes over: move them to the front of the item's block. */
    memmove(it, it->value, n + 1);
    *val = it;
    *vlen = n;
    entry_maybe_drop(s, e);
    return 0;
}

size_t kvstore_queue_len(const struct kvstore *s, const char *key)
{
    const struct entry *e = cddp_strmap_get(&s->map, key, strlen(key));
    return e ? e->qlen : 0;
}

bool kvstore_next_key(const struct kvstore *s, size_t *iter, const char **key, size_t *klen)
{
    const char *k;
    size_t kl;
    void *v;
    while (cddp_strmap_next(&s->map, iter, &k, &kl, &v)) {
        const struct entry *e = v;
        if (e->has_value) {
            *key = e->key;
            *klen = e->klen;
            return true;
        }
    }
    return false;
}

size_t kvstore_num_keys(const struct kvstore *s)
{
    return s->nvalues;
}

size_t kvstore_bytes(const struct kvstore *s)
{
    return s->bytes;
}

void kvstore_free(struct kvstore *s)
{
    if (s == NULL)
        return;
    /* Waiters first (they unlink from entries), then entries. */
    while (!cddp_queue_empty(&s->fired)) {
        struct waiter *w = cddp_queue_data(cddp_queue_head(&s->fired), struct waiter, link);
        cddp_queue_remove(&w->link);
        free(w);
    }
    struct waiter *timed;
    while ((timed = heap_first(s)) != NULL) {
        waiter_unlink(s, timed);
        free(timed);
    }
    /* Waiters without deadline are reachable only through entries. */
    size_t it = 0;
    const char *k;
    size_t kl;
    void *v;
    while (cddp_strmap_next(&s->map, &it, &k, &kl, &v)) {
        struct entry *e = v;
        while (!cddp_queue_empty(&e->refs)) {
            struct waitref *r = cddp_queue_data(cddp_queue_head(&e->refs), struct waitref, link);
            struct waiter *w = r->w;
            /* Unlink w's refs by hand: entry_maybe_drop would change the map under us. */
            for (size_t i = 0; i < w->nrefs; i++) {
                if (w->refs[i].e && w->refs[i].link.next != &w->refs[i].link)
                    cddp_queue_remove(&w->refs[i].link);
                w->refs[i].e = NULL;
            }
            cddp_queue_remove(&w->link);
            if (w->owner)
                w->owner->nwaiters--;
            free(w);
        }
    }
    it = 0;
    while (cddp_strmap_next(&s->map, &it, &k, &kl, &v)) {
        struct entry *e = v;
        while (e->qhead) {
            struct qitem *q = e->qhead;
            e->qhead = q->next;
            free(q);
        }
        free(e->value);
        free(e);
    }
    cddp_strmap_free(&s->map);
    free(s);
}
