/*
 * hostlist.h: Slurm's compressed lists, read without scontrol.
 *
 * A host list is what SLURM_JOB_NODELIST and SLURM_STEP_NODELIST hold:
 * comma-separated names, each of which may carry bracket groups of numbers
 * and ranges, expanded in order with the leftmost group varying slowest:
 *
 *   n[1-3]              n1 n2 n3
 *   gpu[01-03,07]       gpu01 gpu02 gpu03 gpu07   (a leading 0 pads: the
 *                                                  width is the low bound's)
 *   r[1-2]n[1-2]-ib     r1n1-ib r1n2-ib r2n1-ib r2n2-ib
 *   a,b[8-10],c         a b8 b9 b10 c
 *
 * A count list is what SLURM_TASKS_PER_NODE, SLURM_STEP_TASKS_PER_NODE and
 * SLURM_JOB_CPUS_PER_NODE hold: "2(x3),1" is 2 2 2 1.
 *
 * Pure: no allocation, no I/O, no global state. Every malformed input (an
 * empty name, an unclosed or nested bracket, a range that goes down, a
 * character no host name has, more than CDDP_HOSTLIST_MAX_HOSTS hosts, a
 * name longer than CDDP_HOSTLIST_NAME_MAX) is refused with one line in err
 * that quotes the input and says where; functions return 0 or a negative
 * cddp error code (common/errors.h).
 */
#ifndef CDDP_COMMON_HOSTLIST_H
#define CDDP_COMMON_HOSTLIST_H

#include <stddef.h>

#define CDDP_HOSTLIST_NAME_MAX 255        /* bytes in one expanded name */
#define CDDP_HOSTLIST_MAX_HOSTS 1000000   /* hosts in one list */
#define CDDP_HOSTLIST_MAX_GROUPS 16       /* bracket groups in one name */
#define CDDP_HOSTLIST_EXPR_MAX (1u << 20) /* bytes of input */

/* Checks the whole of expr and stores how many hosts it names. */
int cddp_hostlist_count(const char *expr, size_t *count, char *err, size_t errlen);

/* Checks the whole of expr and writes its index-th host (0-based) into out
 * (CDDP_HOSTLIST_NAME_MAX + 1 bytes always suffice). An index past the end
 * is CDDP_ERANGE_ARG; out too small is CDDP_ETOOBIG. */
int cddp_hostlist_nth(const char *expr, size_t index, char *out, size_t outlen, char *err,
                      size_t errlen);

/* Checks the whole of list ("N" or "N(xM)" items, comma-separated; N in
 * [0, 10^9), M in [1, 10^9)) and stores its index-th value in *value. */
int cddp_slurm_counts_nth(const char *list, size_t index, long *value, char *err, size_t errlen);

#endif
