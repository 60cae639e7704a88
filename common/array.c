/* array.c: see array.h. */
#include "common/array.h"

#include <errno.h>
#include <stdint.h>

#include "common/errors.h"

int cddp_array_reserve(void **items, size_t *cap, size_t need, size_t elem, size_t max)
{
    if (need <= *cap)
        return 0;
    if (need > max || elem == 0 || need > SIZE_MAX / elem)
        return CDDP_ETOOBIG;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n = n > SIZE_MAX / 2 ? need : n * 2;
    if (n > max)
        n = max;
    if (n > SIZE_MAX / elem)
        n = need;
    void *p = realloc(*items, n * elem);
    if (p == NULL)
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    *items = p;
    *cap = n;
    return 0;
}
