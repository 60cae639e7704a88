/*
 * array.h: a growable array of any element type, with a maximum set at
 * creation (curl's dynbuf rule: every growing buffer has a bound, and an
 * append past it fails with a named error). The byte buffer for text is
 * struct cddp_buf (strutil.h); this is the same idea for elements.
 *
 *     CDDP_ARRAY(struct item) items;
 *     cddp_array_init(&items, 10000);          // at most 10,000 items
 *     struct item *it = cddp_array_push(&items, &rc);
 *     if (it == NULL) return rc;               // CDDP_ETOOBIG or -ENOMEM
 *     ...
 *     cddp_array_free(&items);
 *
 * Semantics: items[0..len) are the elements; cap is how many fit before
 * the next allocation. Growth doubles (from 16), never past max; a failed
 * growth leaves the array as it was. Pushed elements are not initialised.
 * Pointers into items are valid until the next growth.
 *
 * Ownership: the array owns items (one malloc'd block): cddp_array_free
 * releases it, or the caller takes items (and later frees it) and forgets
 * the array. Not thread-safe.
 *
 * The macros evaluate their array argument more than once: pass a plain
 * lvalue. cddp_array_reserve() is also the function under them, for code
 * whose element pointer and count live in a struct of their own
 * (trainer/safetensors.c's public trn_st_file).
 */
#ifndef CDDP_COMMON_ARRAY_H
#define CDDP_COMMON_ARRAY_H

#include <stddef.h>
#include <stdlib.h>

/* A struct type holding elements of type T. */
#define CDDP_ARRAY(T)                                                                              \
    struct {                                                                                       \
        T *items;                                                                                  \
        size_t len, cap, max;                                                                      \
    }

#define cddp_array_init(a, max_) ((a)->items = NULL, (a)->len = 0, (a)->cap = 0, (a)->max = (max_))

/*
 * Makes *cap at least need elements of elem bytes in *items (realloc'd),
 * never more than max. 0, CDDP_ETOOBIG when need > max, or -ENOMEM; on
 * failure *items and *cap are unchanged.
 */
int cddp_array_reserve(void **items, size_t *cap, size_t need, size_t elem, size_t max);

/* Room for n more elements of a: 0 or an error as cddp_array_reserve. */
#define cddp_array_grow(a, n)                                                                      \
    cddp_array_reserve((void **)&(a)->items, &(a)->cap, (a)->len + (n), sizeof(*(a)->items),       \
                       (a)->max)

/* A pointer to a new last element, or NULL with *rc set. */
#define cddp_array_push(a, rc)                                                                     \
    ((*(rc) = cddp_array_grow(a, 1)) == 0 ? &(a)->items[(a)->len++] : NULL)

#define cddp_array_free(a) (free((a)->items), (a)->items = NULL, (a)->len = 0, (a)->cap = 0)

#endif
