/* ranks.c: see ranks.h. */
#include "rendezvous/ranks.h"

#include <errno.h>
#include <stdlib.h>

#include "common/errors.h"

int rdzv_ranks_check(const char *ranks, int first, int lo, int hi, char *why, size_t whylen)
{
    const char *p = ranks;
    long prev = -1;
    for (int i = 0;; i++) {
        char *end = NULL;
        errno = 0;
        long r = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
        if (r < 0 || errno != 0 || (*end != ',' && *end != '\0'))
            return cddp_fail(why, whylen, CDDP_ESTATE, "ranks '%s' is not a list of decimal ranks",
                             ranks);
        if (r < lo || r > hi)
            return cddp_fail(why, whylen, CDDP_ESTATE,
                             "rank %ld is not one of this node's (%d..%d)", r, lo, hi);
        if (r <= prev)
            return cddp_fail(why, whylen, CDDP_ESTATE, "ranks '%s' is not in ascending order",
                             ranks);
        if (i == 0 && r != first)
            return cddp_fail(why, whylen, CDDP_ESTATE, "ranks '%s' does not begin with rank %d",
                             ranks, first);
        prev = r;
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}
