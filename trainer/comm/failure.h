/*
 * failure.h: how a worker stops when a collective fails.
 *
 * torchrun's contract (shared/reference/torchrun.md 3.7): the worker writes
 * TORCHELASTIC_ERROR_FILE as
 *     {"message": {"message": "<Type>: <text>",
 *                  "extraInfo": {"py_callstack": "<text>", "timestamp": "<epoch s>"}}}
 * and exits non-zero; the agent shows py_callstack in its failure table and
 * restarts the group. We exit CDDP_EXIT_COLLECTIVE_TIMEOUT (75), which the
 * agent knows means "a collective timed out or a peer failed during it".
 */
#ifndef CDDP_TRAINER_COMM_FAILURE_H
#define CDDP_TRAINER_COMM_FAILURE_H

#include <stddef.h>

#include "trainer/comm/comm.h"

/* One line naming the collective, the step, the rank, the seconds waited
 * and the bound, and the backend's reason. step < 0: not in a step. */
void trn_comm_failure_message(const struct trn_comm_error *e, long step, int rank, char *buf,
                              size_t len);

/* Writes torchrun's error.json to path (proto/errorfile.h builds it),
 * atomically (common/file.h: temporary file, fsync, rename, fsync of the
 * directory): a reader sees the whole file or none. `type` is the error's kind
 * ("CollectiveTimeoutError"), `message` the one-line text, `callstack` what
 * torchrun shows as the traceback, `timestamp` seconds since the epoch.
 * 0 or -errno. */
int trn_error_file_write(const char *path, const char *type, const char *message,
                         const char *callstack, long timestamp);

/* The collective-timeout exit: logs the message, writes the error file
 * (error_file: TORCHELASTIC_ERROR_FILE, or NULL/"" for none), and exits 75
 * without running exit handlers (the comm thread may still be inside the
 * backend). Called by the training loop with the failing step. */
_Noreturn void trn_comm_fail(const struct trn_comm_error *e, long step, int rank,
                             const char *error_file);

#endif
