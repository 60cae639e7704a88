#ifndef CDDP_RENDEZVOUS_RANKS_H
#define CDDP_RENDEZVOUS_RANKS_H
/*
 * ranks.h: the ranks of one node that a replace restarts together
 * (docs/protocol.md, "replace"; docs/etcd.md): "2,3", decimal,
 * comma-separated, ascending, each one of the node's, the replace's rank
 * the first. The c10d server and the etcd-v3 state check them alike.
 */
#include <stddef.h>

/* 0 when `ranks` is such a list for a node whose ranks are lo..hi and a
 * replace of `first`; otherwise CDDP_ESTATE with one line in why naming
 * what is wrong ("rank 4 is not one of this node's (2..3)", ...). */
int rdzv_ranks_check(const char *ranks, int first, int lo, int hi, char *why, size_t whylen);

#endif
