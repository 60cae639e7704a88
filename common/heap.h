/*
 * heap.h: an intrusive binary min-heap (libuv's heap-inl.h, in our names).
 *
 * A struct that sits in a heap embeds a `struct cddp_heap_node` and is found
 * again with cddp_heap_data() (container_of). The heap is a binary tree of
 * those nodes linked by pointers, kept complete, so insertion and removal
 * are O(log n) and never allocate: they cannot fail, and a timer armed
 * while memory runs out still fires. The rendezvous state's timers and the
 * key-value store's waiters both live in one.
 *
 * Order: the caller's less(a, b) says whether a comes before b; it must be
 * a strict weak order, and equal nodes come out in no particular order
 * (callers that want first-in first-out among equal keys add a sequence
 * number to their key, as rendezvous/state.c and store/kvstore.c do).
 * A node's key must not change while it is in the heap: remove it, change
 * the key, insert it again.
 *
 * Ownership: the heap owns nothing; nodes belong to their containing
 * structs, which must outlive their time in the heap. Removing a node that
 * is not in the heap corrupts it: callers keep their own "armed" flag. Not
 * thread-safe: one heap, one owner.
 */
#ifndef CDDP_COMMON_HEAP_H
#define CDDP_COMMON_HEAP_H

#include <stdbool.h>
#include <stddef.h>

struct cddp_heap_node {
    struct cddp_heap_node *left;
    struct cddp_heap_node *right;
    struct cddp_heap_node *parent;
};

struct cddp_heap {
    struct cddp_heap_node *min;
    size_t nelts;
};

#define cddp_heap_data(ptr, type, field) ((type *)((char *)(ptr)-offsetof(type, field)))

static inline void cddp_heap_init(struct cddp_heap *h)
{
    h->min = NULL;
    h->nelts = 0;
}

/* The first node, or NULL when the heap is empty. */
static inline struct cddp_heap_node *cddp_heap_min(const struct cddp_heap *h)
{
    return h->min;
}

/* Swaps a parent with one of its children, fixing every link around them. */
static inline void cddp_heap_swap_(struct cddp_heap *h, struct cddp_heap_node *parent,
                                   struct cddp_heap_node *child)
{
    struct cddp_heap_node *sibling, t = *parent;
    *parent = *child;
    *child = t;
    parent->parent = child;
    if (child->left == child) {
        child->left = parent;
        sibling = child->right;
    } else {
        child->right = parent;
        sibling = child->left;
    }
    if (sibling != NULL)
        sibling->parent = child;
    if (parent->left != NULL)
        parent->left->parent = parent;
    if (parent->right != NULL)
        parent->right->parent = parent;
    if (child->parent == NULL)
        h->min = child;
    else if (child->parent->left == parent)
        child->parent->left = child;
    else
        child->parent->right = child;
}

/* The link that holds the n-th node (1-based, breadth first) of the tree:
 * the bits of n below its top bit, from the top down, say left or right. */
static inline struct cddp_heap_node **cddp_heap_slot_(struct cddp_heap *h, size_t n,
                                                      struct cddp_heap_node **parent)
{
    size_t path = 0, k = 0;
    for (; n >= 2; k++, n /= 2)
        path = (path << 1) | (n & 1);
    struct cddp_heap_node **slot = &h->min;
    *parent = NULL;
    for (; k > 0; k--, path >>= 1) {
        *parent = *slot;
        slot = (path & 1) ? &(*slot)->right : &(*slot)->left;
    }
    return slot;
}

static inline void cddp_heap_insert(struct cddp_heap *h, struct cddp_heap_node *node,
                                    bool (*less)(const struct cddp_heap_node *,
                                                 const struct cddp_heap_node *))
{
    struct cddp_heap_node *parent;
    struct cddp_heap_node **slot = cddp_heap_slot_(h, h->nelts + 1, &parent);
    node->left = node->right = NULL;
    node->parent = parent;
    *slot = node;
    h->nelts++;
    while (node->parent != NULL && less(node, node->parent))
        cddp_heap_swap_(h, node->parent, node);
}

/* Removes node, which must be in h. */
static inline void cddp_heap_remove(struct cddp_heap *h, struct cddp_heap_node *node,
                                    bool (*less)(const struct cddp_heap_node *,
                                                 const struct cddp_heap_node *))
{
    if (h->nelts == 0)
        return;
    /* Unlink the last node of the bottom row; it takes node's place. */
    struct cddp_heap_node *parent;
    struct cddp_heap_node **last = cddp_heap_slot_(h, h->nelts, &parent);
    struct cddp_heap_node *child = *last;
    *last = NULL;
    h->nelts--;
    if (child == node) {
        if (child == h->min)
            h->min = NULL;
        return;
    }
    child->left = node->left;
    child->right = node->right;
    child->parent = node->parent;
    if (child->left != NULL)
        child->left->parent = child;
    if (child->right != NULL)
        child->right->parent = child;
    if (node->parent == NULL)
        h->min = child;
    else if (node->parent->left == node)
        node->parent->left = child;
    else
        node->parent->right = child;
    /* Down while a child comes first, then up: the moved node came from
     * another subtree, so it may belong on either side of node's place. */
    for (;;) {
        struct cddp_heap_node *smallest = child;
        if (child->left != NULL && less(child->left, smallest))
            smallest = child->left;
        if (child->right != NULL && less(child->right, smallest))
            smallest = child->right;
        if (smallest == child)
            break;
        cddp_heap_swap_(h, child, smallest);
    }
    while (child->parent != NULL && less(child, child->parent))
        cddp_heap_swap_(h, child->parent, child);
}

/* Removes and returns the first node, or NULL when the heap is empty. */
static inline struct cddp_heap_node *cddp_heap_pop(struct cddp_heap *h,
                                                   bool (*less)(const struct cddp_heap_node *,
                                                                const struct cddp_heap_node *))
{
    struct cddp_heap_node *min = h->min;
    if (min != NULL)
        cddp_heap_remove(h, min, less);
    return min;
}

#endif
