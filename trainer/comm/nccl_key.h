/*
 * nccl_key.h: the store key the NCCL unique id is published under.
 *
 * Rank 0 makes the id (ncclGetUniqueId) and sets it in the bootstrap store;
 * every other rank waits for that key. The key names the restart count
 * (TORCHELASTIC_RESTART_COUNT) and the rendezvous round (CDDP_RDZV_ROUND)
 * as well as the group, so a restarted or re-formed group never reads the
 * id of the group before it from a store that outlived it (the agent's
 * TCPStore, or an etcd-backed one): pytorch/pytorch#135712. A group
 * re-formed in place (--restart_scope=worker) is the group "gen_<G>" of
 * its generation, so it never reads the id of the generation before it
 * (nccl.c's exchange_id). Pure.
 */
#ifndef CDDP_TRAINER_COMM_NCCL_KEY_H
#define CDDP_TRAINER_COMM_NCCL_KEY_H

#include <stddef.h>

#define TRN_NCCL_KEY_PREFIX "cddp/nccl"

/* Writes "<prefix>/<group>/restart_<R>/round_<N>/unique_id" to out.
 * prefix NULL or "": TRN_NCCL_KEY_PREFIX; group NULL or "": "default".
 * 0, CDDP_ERANGE_ARG for a negative count or round, or CDDP_ETOOBIG when
 * out is too small (out then holds "" ). */
int trn_nccl_id_key(const char *prefix, long restart_count, long rdzv_round, const char *group,
                    char *out, size_t outlen);

/* Where rank r publishes the last sequence number it enqueued (the NCCL
 * watchdog names the ranks that never reached a timed-out collective):
 * "<prefix>/progress/restart_<R>/round_<N>/rank_<r>". Same rules. */
int trn_nccl_progress_key(const char *prefix, long restart_count, long rdzv_round, int rank,
                          char *out, size_t outlen);

#endif
