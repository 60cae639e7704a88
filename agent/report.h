/*
 * report.h: worker failures as torchrun reports them.
 *
 * A failure is one worker's non-zero exit. If the worker wrote error.json
 * (torch's @record, or --run_path), its message and timestamp come from
 * there; otherwise the timestamp is when the exit was seen and the message
 * names the signal or points at torch's docs. The root cause is the earliest
 * failure (torchrun compares whole seconds; cddprun breaks ties by the order
 * the exits were seen, where torchrun would take the lowest rank).
 *
 * Table (torch.distributed.elastic.multiprocessing.errors.ChildFailedError):
 *
 *   ============================================================
 *   <name> FAILED
 *   ------------------------------------------------------------
 *   Failures:
 *   [1]:
 *     time      : 2023-09-04_10:10:23
 *     ...
 *   ------------------------------------------------------------
 *   Root Cause (first observed failure):
 *   [0]:
 *     time      : ...
 *     host      : <fqdn>
 *     rank      : <rank> (local_rank: <local_rank>)
 *     exitcode  : <code> (pid: <pid>)
 *     error_file: <path or <N/A>>
 *     traceback : <message>
 *   ============================================================
 */
#ifndef CDDP_AGENT_REPORT_H
#define CDDP_AGENT_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strutil.h"

#define AGENT_NOT_AVAILABLE "<N/A>"

struct agent_failure {
    int local_rank;
    int rank;
    int pid;
    int exitcode;    /* exit status, or -N for death by signal N */
    double observed; /* wall-clock time the exit was seen */
    uint64_t seq;    /* order in which exits were seen */
    long timestamp;  /* seconds: error.json's, else observed */
    bool has_error_file;
    char error_file[4096]; /* the path, or "<N/A>" */
    char *message;         /* the table's traceback field; owned */
    char *error_json;      /* error.json as read, when it parsed; owned */
    /* Set by the caller before agent_failure_load: why the progress
     * watchdog stopped it (the table's traceback and the agent's error
     * file say so instead of the signal); NULL otherwise. Not owned. */
    const char *watchdog;
    /* Set by the caller: why the agent could not start it (the traceback
     * field says so); NULL otherwise. Not owned. */
    const char *note;
    /* Set by the caller before agent_failure_load: the worker's Python
     * (launch_config's program) for a script, -m or --run_path; NULL for
     * a program. Not owned. */
    const char *python;
    /* Set by agent_failure_load: that Python could not import torch. The
     * worker's tail says so (the end of its stderr.log, beside its error
     * file, or its error file's message: "ModuleNotFoundError: No module
     * named 'torch'"); or, where the agent holds neither (stderr inherited,
     * as by default), a worker that exited with 1 ran a Python that
     * importlib cannot find torch in (asked once per interpreter). The
     * table then adds a line naming the interpreter and PYTHON_EXEC. */
    bool no_torch;
    /* Set by the caller: a worker replaced in place (--restart_scope=worker)
     * whose run went on. Listed, but the root cause only when every failure
     * is one: the failure that ended the run is another. */
    bool recovered;
};

/*
 * Fills f (local_rank, rank, pid, exitcode, observed, seq set by the caller)
 * from error_file_path when that file exists. A file that does not parse is
 * reported in the message rather than fatal (torchrun would crash). Returns 0
 * or -ENOMEM.
 */
int agent_failure_load(struct agent_failure *f, const char *error_file_path);
void agent_failure_free(struct agent_failure *f);

/* Index of the root cause among n > 0 failures: the first observed
 * (error.json's timestamp, then the order seen), of those not recovered
 * when there is one. */
int agent_failure_root(const struct agent_failure *f, int n);

/* Appends the table for failures f[0..n) (in local-rank order) to out;
 * when a failure has no_torch, a last line before the closing rule names
 * its Python and PYTHON_EXEC; exit_note (NULL: none), cddprun's exit code
 * when it is not torchrun's 1, is the line after it. */
int agent_failure_table(const char *name, const struct agent_failure *f, int n, const char *host,
                        const char *exit_note, struct cddp_buf *out);
/* The same with "<name> <verdict>" as its title (agent_failure_table's is
 * "FAILED"; a run that recovered in place: "RECOVERED IN PLACE"). */
int agent_failure_table_as(const char *name, const char *verdict, const struct agent_failure *f,
                           int n, const char *host, const char *exit_note, struct cddp_buf *out);

/*
 * The agent's own error file (its TORCHELASTIC_ERROR_FILE): the root cause's
 * error.json with message.errorCode set to its exit code, as torchrun's
 * @record; when the worker wrote none, a record of the same shape that
 * describes the failure (torchrun writes nothing then). The record is
 * proto/errorfile.h's; it is written with cddp_write_file_atomic (temporary
 * file, fsync, rename, fsync of the directory). 0 or a negative code.
 */
int agent_write_error_file(const char *path, const struct agent_failure *root, const char *name,
                           const char *table);

/* The agent's error file when the agent itself failed (a log directory it
 * cannot create, a rendezvous that failed): torch's record format with
 * message = "AgentError: <message>" and the current time. */
int agent_write_agent_error(const char *path, const char *message);

#endif
