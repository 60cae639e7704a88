/*
 * queue.h: intrusive circular doubly-linked lists.
 *
 * A struct that belongs to a list embeds a `struct cddp_queue` and is found
 * again with cddp_queue_data() (container_of). Insertion and removal never
 * allocate, so a member can move between lists (participants, wait list,
 * waiters of a key) at no cost. An empty list is a head that points to
 * itself; a removed node is re-initialised so removing it twice is harmless.
 */
#ifndef CDDP_COMMON_QUEUE_H
#define CDDP_COMMON_QUEUE_H

#include <stdbool.h>
#include <stddef.h>

struct cddp_queue {
    struct cddp_queue *next;
    struct cddp_queue *prev;
};

#define cddp_queue_data(ptr, type, field) ((type *)((char *)(ptr)-offsetof(type, field)))

#define cddp_queue_foreach(q, h) for ((q) = (h)->next; (q) != (h); (q) = (q)->next)

static inline void cddp_queue_init(struct cddp_queue *q)
{
    q->next = q;
    q->prev = q;
}

static inline bool cddp_queue_empty(const struct cddp_queue *q)
{
    return q->next == q;
}

static inline struct cddp_queue *cddp_queue_head(const struct cddp_queue *q)
{
    return q->next;
}

static inline void cddp_queue_insert_tail(struct cddp_queue *h, struct cddp_queue *q)
{
    q->next = h;
    q->prev = h->prev;
    q->prev->next = q;
    h->prev = q;
}

static inline void cddp_queue_insert_head(struct cddp_queue *h, struct cddp_queue *q)
{
    q->next = h->next;
    q->prev = h;
    q->next->prev = q;
    h->next = q;
}

static inline void cddp_queue_remove(struct cddp_queue *q)
{
    q->prev->next = q->next;
    q->next->prev = q->prev;
    cddp_queue_init(q);
}

#endif
