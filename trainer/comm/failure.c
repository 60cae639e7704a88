/* failure.c: error.json and exit 75 when a collective fails; see failure.h. */
#include "trainer/comm/failure.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/errors.h"
#include "common/exitcodes.h"
#include "common/file.h"
#include "common/log.h"
#include "common/strutil.h"
#include "proto/errorfile.h"

void trn_comm_failure_message(const struct trn_comm_error *e, long step, int rank, char *buf,
                              size_t len)
{
    char at[48] = "";
    if (step >= 0)
        snprintf(at, sizeof(at), " at step %ld", step);
    const char *why = e->detail[0] ? e->detail : cddp_strerror(e->code);
    if (e->code == CDDP_ETIMEOUT)
        snprintf(buf, len,
                 "%s%s on rank %d timed out: waited %.1f s for the other ranks "
                 "(--collective-timeout %g s, %zu bytes); %s",
                 e->op, at, rank, e->waited_s, e->timeout_s, e->bytes, why);
    else if (e->code == CDDP_EPEER)
        snprintf(buf, len,
                 "%s%s on rank %d failed after %.1f s: a peer failed or left "
                 "(--collective-timeout %g s, %zu bytes); %s",
                 e->op, at, rank, e->waited_s, e->timeout_s, e->bytes, why);
    else
        snprintf(buf, len, "%s%s on rank %d failed after %.1f s (%s): %s", e->op, at, rank,
                 e->waited_s, cddp_err_name(e->code), why);
}

int trn_error_file_write(const char *path, const char *type, const char *message,
                         const char *callstack, long timestamp)
{
    struct cddp_buf text;
    cddp_buf_init(&text, 1 << 20);
    if (cddp_buf_printf(&text, "%s: %s", type, message) < 0) {
        cddp_buf_free(&text);
        return -ENOMEM;
    }
    char *json = proto_errorfile_build(text.data, callstack, timestamp, NULL);
    cddp_buf_free(&text);
    if (json == NULL)
        return -ENOMEM;
    int rc = cddp_write_file_atomic(path, json, strlen(json), 0644, NULL, 0);
    free(json);
    return rc;
}

/* What the agent does next, from the restart budget torchrun's agents
 * give their workers (TORCHELASTIC_RESTART_COUNT, _MAX_RESTARTS): a claim
 * that the group is restarted would be wrong with --max_restarts=0. */
static void next_step(char *buf, size_t len)
{
    const char *count = getenv("TORCHELASTIC_RESTART_COUNT");
    const char *max = getenv("TORCHELASTIC_MAX_RESTARTS");
    long c, m;
    if (count == NULL || max == NULL || cddp_parse_long(count, 0, 1L << 30, &c) != 0 ||
        cddp_parse_long(max, 0, 1L << 30, &m) != 0)
        snprintf(buf, len, "a launcher that restarts failed workers restarts the group");
    else if (c < m)
        snprintf(buf, len, "the agent restarts the group (restart %ld of --max_restarts=%ld)",
                 c + 1, m);
    else
        snprintf(buf, len, "no restart is left (--max_restarts=%ld): the job fails", m);
}

void trn_comm_fail(const struct trn_comm_error *e, long step, int rank, const char *error_file)
{
    /* Once per process: the NCCL watchdog's thread and the training thread
     * (a collective's own error) may both get here for one failure; the
     * second waits for the first's _exit rather than write the same error
     * file's temporary name at the same time. */
    static atomic_flag reported = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&reported))
        for (;;)
            pause();
    char msg[1024];
    trn_comm_failure_message(e, step, rank, msg, sizeof(msg));
    log_error("T6010", "%s", msg);
    if (error_file != NULL && *error_file != '\0') {
        char next[128], stack[1600];
        next_step(next, sizeof(next));
        snprintf(stack, sizeof(stack),
                 "%s rank %d (pid %ld): %s%s\n  exit %d (collective timeout): %s\n",
                 program_invocation_short_name, rank, (long)getpid(),
                 e->code == CDDP_ETIMEOUT ? "CollectiveTimeoutError: " : "CollectiveError: ", msg,
                 CDDP_EXIT_COLLECTIVE_TIMEOUT, next);
        int rc = trn_error_file_write(
            error_file, e->code == CDDP_ETIMEOUT ? "CollectiveTimeoutError" : "CollectiveError",
            msg, stack, (long)time(NULL));
        if (rc < 0)
            log_error("T6011", "cannot write the error file %s: %s", error_file, cddp_strerror(rc));
        else
            log_info("T6012", "error file written: %s", error_file);
    }
    fflush(stdout);
    fflush(stderr);
    _exit(CDDP_EXIT_COLLECTIVE_TIMEOUT);
}
